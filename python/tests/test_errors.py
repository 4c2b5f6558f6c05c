"""Errors: every failure is a typed exception (a vfabric.FabricError subclass, or ValueError for bad
arguments), never a crash."""

import os

import pytest

import vfabric

ALL = [
    "OutOfMemory",
    "QuotaExceeded",
    "InvalidSize",
    "OutOfBounds",
    "InvalidAddress",
    "UseAfterFree",
    "PermissionDenied",
    "DoubleFree",
    "LeasedElsewhere",
    "DeviceUnavailable",
    "ReadOnlyLease",
    "UnknownLease",
    "PeerDead",
    "Unavailable",
    "NetworkError",
    "ProtocolError",
    "ChecksumError",
    "ConfigError",
    "DeviceError",
    "LaunchError",
    "RegionMoved",
    "InternalError",
    "LeaseInUse",
    "NotContiguous",
]


def test_the_hierarchy():
    assert issubclass(vfabric.FabricError, RuntimeError)
    for name in ALL:
        cls = getattr(vfabric, name)
        assert issubclass(cls, vfabric.FabricError), name
        assert cls.__module__ == "vfabric" and cls.__name__ == name
        assert cls.__doc__


def test_out_of_bounds(fabric):
    r = fabric.alloc(2 << 20)
    with pytest.raises(vfabric.OutOfBounds, match="outside the region"):
        fabric.read(r, (2 << 20) - 1, 2)
    with pytest.raises(vfabric.OutOfBounds):
        fabric.write(r, 2 << 20, b"x")
    with pytest.raises(vfabric.OutOfBounds):
        fabric.acquire(r, 4096, 2 << 20)
    with pytest.raises(vfabric.OutOfBounds):
        fabric.read_into(r, 1 << 21, bytearray(1))


def test_use_after_free_and_double_free(fabric):
    r = fabric.alloc(2 << 20)
    fabric.free(r)
    with pytest.raises(vfabric.UseAfterFree):
        fabric.read(r, 0, 1)
    with pytest.raises(vfabric.UseAfterFree):
        fabric.acquire(r)
    with pytest.raises(vfabric.DoubleFree):
        fabric.free(r)


def test_bad_arguments_are_value_errors(fabric):
    r = fabric.alloc(2 << 20)
    with pytest.raises(ValueError, match="unknown device"):
        fabric.acquire(r, device="tpu0")
    with pytest.raises(ValueError, match="unknown device"):
        fabric.alloc(1024, device="gpu")
    with pytest.raises(ValueError, match="unknown mode"):
        fabric.acquire(r, mode="rw")
    with pytest.raises(ValueError, match="unknown priority"):
        fabric.alloc(1024, priority="urgent")
    with pytest.raises(ValueError, match="must not be negative"):
        fabric.alloc(-1)
    with pytest.raises(ValueError, match="must not be negative"):
        fabric.read(r, -1, 1)
    with pytest.raises(ValueError, match="must not be negative"):
        fabric.read(r, 0, -5)
    with pytest.raises(ValueError, match="must not be negative"):
        fabric.acquire(r, 0, -1)
    with pytest.raises(ValueError):
        fabric.migrate(r, "nowhere")
    with pytest.raises(TypeError):
        fabric.free("not a region")
    with pytest.raises(TypeError):
        fabric.write(r, 0, 12345)  # no buffer protocol
    with pytest.raises(ValueError, match="replicas must be in"):
        fabric.alloc(1024, replicas=9)
    with pytest.raises(ValueError, match="replica_lag must be seconds"):
        fabric.alloc(1024, replica_lag=-1.0)


def test_fabric_failures_have_their_classes(fabric):
    with pytest.raises(vfabric.InvalidSize):
        fabric.alloc(0)
    r = fabric.alloc(2 << 20)
    with pytest.raises(vfabric.DeviceUnavailable):
        fabric.acquire(r, device="gpu7")
    with fabric.acquire(r, device="gpu0", mode="w"):
        with pytest.raises(vfabric.LeasedElsewhere):
            fabric.acquire(r, device="gpu1", mode="r")
        with pytest.raises(vfabric.LeasedElsewhere):
            fabric.free(r)
    with pytest.raises(vfabric.OutOfMemory):
        fabric.acquire(fabric.alloc(1 << 30), device="gpu0")  # more than the GPU's budget at once
    # An embedded fabric is one node: a region kept on two needs agents (connect()).
    with pytest.raises(vfabric.Unavailable, match="embedded fabric is one node"):
        fabric.alloc(1024, replicas=2)
    fabric.free(fabric.alloc(1024, replicas=1, replica_lag=0.5))


def test_config_errors(tmp_path):
    with pytest.raises(vfabric.ConfigError, match="nowhere.toml"):
        vfabric.Fabric(str(tmp_path / "nowhere.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[memory]\npage_size = '3KiB'\n")
    with pytest.raises(vfabric.ConfigError):
        vfabric.Fabric(bad)


def test_connect_names_the_variable_and_reports_a_missing_agent(tmp_path, monkeypatch):
    # Outside a job, with no agent running: a clear error naming the socket and how to name another. The job's
    # socket lives in the temporary folder, here the test's own.
    for k in ("VFABRIC_SOCKET", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(vfabric.LaunchError, match="VFABRIC_SOCKET") as e:
        vfabric.connect()
    assert str(tmp_path) in str(e.value)
    monkeypatch.setenv("VFABRIC_SOCKET", str(tmp_path / "no-agent.sock"))
    with pytest.raises(vfabric.LaunchError, match="no-agent.sock"):
        vfabric.connect()
    assert not os.path.exists(tmp_path / "no-agent.sock")
