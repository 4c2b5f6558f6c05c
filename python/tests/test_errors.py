"""Errors: every failure is a typed exception (a vfabric.FabricError subclass, or ValueError for bad
arguments), never a crash."""

import os
import time

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
    "Stalled",
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


def test_a_copy_past_its_deadline_is_stalled_then_goes_on(tmp_path):
    # A host link paced to 1 MiB a second: fetching 4 MiB to the GPU takes 4 s, against a deadline of 100 ms.
    config = tmp_path / "slow.toml"
    config.write_text(
        """
[cluster]
name = "slow"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "64MiB"
emulated_host_link = "1MiB"
copy_deadline_ms = 100
[memory]
page_size = "64KiB"
gpu_budget = "8MiB"
host_arena = "16MiB"
readahead = "0"
[[node]]
name = "local"
"""
    )
    fabric = vfabric.Fabric(str(config))
    r = fabric.alloc(4 << 20, device="host")
    data = bytes(range(256)) * (4 << 12)
    fabric.write(r, 0, data)
    with pytest.raises(vfabric.Stalled, match="fetch stage .* host -> gpu0"):
        fabric.acquire(r, device="gpu0")
    with pytest.raises(vfabric.Stalled):
        fabric.free(r)
    assert fabric.read(r, 0, len(data)) == data  # reads go on
    deadline = time.monotonic() + 60
    while True:
        try:
            with fabric.acquire(r, device="gpu0"):
                break
        except vfabric.Stalled:
            assert time.monotonic() < deadline, "the copies landed long ago"
            time.sleep(0.05)
    fabric.free(r)
