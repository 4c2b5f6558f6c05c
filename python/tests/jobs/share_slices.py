"""One rank of a job whose ranks share a region through their host's agent (run by test_ranks.py).

Every rank attaches with `vfabric.connect()`: local rank 0 starts the host's agent (a process of its own, or
with VFABRIC_HOST_AGENT=thread in rank 0's), the others wait for it.
Rank 0 allocates a region and leaves its handle in the notes folder (argv[1]); every rank writes its slice on
its own GPU through its own mapping (a torch kernel on CUDA, numpy on the emulated device), then says so; rank 0
waits for all of them and checks every slice through its own mapping and through the socket, then leaves last
(its process holds the agent).
"""

import os
import pathlib
import pickle
import sys
import time

from agent_pid import agent_pid

import vfabric

SLICE = 4 << 20  # two pages of the default configuration: no two ranks lease the same page


def var(*names: str) -> int:
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    raise SystemExit(f"none of {names} is set: run this under mpirun or as torchrun would")


def wait_for(path: pathlib.Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} ({path}) in time")
        time.sleep(0.01)


def main() -> None:
    notes = pathlib.Path(sys.argv[1])
    rank = var("OMPI_COMM_WORLD_RANK", "RANK")
    size = var("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE")
    local_rank = var("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")
    client = vfabric.connect()
    assert client.hosts_agent == (local_rank == 0), (rank, client.hosts_agent)
    if local_rank == 0:
        # A process of its own unless VFABRIC_HOST_AGENT=thread asks for this one.
        pid = agent_pid(os.environ["VFABRIC_SOCKET"])
        in_process = os.environ.get("VFABRIC_HOST_AGENT", "process") == "thread"
        assert (pid == os.getpid()) == in_process, (pid, os.getpid(), os.environ.get("VFABRIC_HOST_AGENT"))
        print(f"agent {pid}", flush=True)
    if rank == 0:
        region = client.alloc(size * SLICE)
        (notes / "region.part").write_bytes(pickle.dumps(region))
        (notes / "region.part").rename(notes / "region")
    else:
        wait_for(notes / "region", "region from rank 0")
        region = pickle.loads((notes / "region").read_bytes())

    with client.acquire(region, rank * SLICE, SLICE, mode="w") as lease:  # on this rank's GPU
        assert lease.device == client.default_device, (lease.device, client.default_device)
        if client.device_kind == "cuda":
            import torch

            t = torch.from_dlpack(lease.view("uint8"))
            assert t.is_cuda and t.numel() == SLICE
            t.fill_(rank + 1)  # a kernel of this process, writing through its mapping
            del t
        else:
            a = lease.numpy("uint8")
            a[:] = rank + 1
            del a
    (notes / f"done-{rank}").touch()

    if rank == 0:
        for r in range(size):
            wait_for(notes / f"done-{r}", f"rank {r}'s slice")
        # Through this process's own mapping (a torch kernel reading the GPU on CUDA)...
        with client.acquire(region, 0, size * SLICE, mode="r") as lease:
            for r in range(size):
                part = lease.view("uint8", (size, SLICE))
                if client.device_kind == "cuda":
                    import torch

                    t = torch.from_dlpack(part)[r]
                    ok = bool((t == r + 1).all().item())
                    del t
                else:
                    ok = bool((lease.numpy("uint8", (size, SLICE))[r] == r + 1).all())
                del part
                assert ok, f"rank {r}'s slice, read through rank 0's mapping"
        # ...and through the socket.
        data = client.read(region, 0, size * SLICE)
        for r in range(size):
            got = set(data[r * SLICE : (r + 1) * SLICE])
            assert got == {r + 1}, f"rank {r}'s slice holds {sorted(got)[:4]}"
        client.free(region)
    print(f"rank {rank} of {size} ok on {client.default_device} ({client.device_kind})", flush=True)


if __name__ == "__main__":
    main()
