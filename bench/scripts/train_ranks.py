"""The ranks of a data-parallel run of the training benchmark (train_offload.py), started by torchrun or mpirun:
who this process is, its GPU, the process group, and the check that every rank ends with the same weights.

One rank a GPU (local rank modulo the GPUs). When a host has more ranks than GPUs (a test of the code on a
one-GPU machine), the ranks share a GPU, which NCCL refuses within one host: each rank then takes its own
NCCL_HOSTID, so that NCCL joins them as ranks of different hosts, over its socket transport on loopback. Such a
run measures no NVLink: its all-reduces cross host memory and sockets.
"""
import hashlib
import os
import socket

import torch


def _first(*names):
    for n in names:
        if os.environ.get(n, "") != "":
            return int(os.environ[n])
    return None


class Ranks:
    """This process's place in the job: `rank` of `world`, `local_rank` of the `local_world` ranks of its host
    (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, or Open MPI's OMPI_COMM_WORLD_*); one rank of one
    when no launcher started it."""

    def __init__(self):
        self.rank = _first("RANK", "OMPI_COMM_WORLD_RANK") or 0
        self.world = _first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE") or 1
        self.local_rank = _first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK") or 0
        self.local_world = _first("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE") or 1
        self.gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        self.shared_gpu = self.gpus > 0 and self.local_world > self.gpus
        self.started = False

    @property
    def many(self):
        return self.world > 1

    @property
    def ranks_per_gpu(self):
        return -(-self.local_world // self.gpus) if self.gpus else self.local_world

    def start(self, port):
        """Takes this rank's GPU and joins the process group (NCCL for CUDA tensors, gloo for CPU ones) at
        MASTER_ADDR:MASTER_PORT (torchrun sets them; under mpirun, 127.0.0.1 and `port`: one host)."""
        import torch.distributed as dist

        if self.gpus:
            torch.cuda.set_device(self.local_rank % self.gpus)
        if self.shared_gpu:
            os.environ["NCCL_HOSTID"] = f"{socket.gethostname()}-rank{self.rank}"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        backend = "cpu:gloo,cuda:nccl" if self.gpus else "gloo"
        dist.init_process_group(backend=backend, rank=self.rank, world_size=self.world)
        self.started = True

    def describe(self):
        return {"world": self.world, "local_world": self.local_world, "gpus": self.gpus,
                "ranks_per_gpu": self.ranks_per_gpu,
                "collectives": ("NCCL, each rank its own NCCL_HOSTID (socket transport: ranks share a GPU)"
                                if self.shared_gpu else "NCCL" if self.gpus else "gloo")}

    def mean(self, value):
        """`value` (a float) averaged over the ranks."""
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device="cuda" if self.gpus else "cpu")
        dist.all_reduce(t)
        return t.item() / self.world

    def same_everywhere(self, tensors):
        """Whether every rank holds the same bytes in `tensors` (an iterable of tensors, the same order on every
        rank): a digest of each rank's, gathered and compared."""
        import torch.distributed as dist

        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        digests = [None] * self.world
        dist.all_gather_object(digests, h.hexdigest())
        return len(set(digests)) == 1

    def stop(self):
        if self.started:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
            self.started = False
