# The NCCL baseline: send/recv GPU0 -> GPU1 through torch.
# Its output lines are what vfabric-bench --nccl-log reads.
# NCCL send/recv bandwidth between two local GPUs through torch.distributed: the peer baseline.
import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    for sz in [2 << 20, 64 << 20, 1 << 30]:
        t = torch.empty(sz, dtype=torch.uint8, device=f"cuda:{rank}").random_(0, 255)
        for _ in range(3):
            (dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
        torch.cuda.synchronize(); dist.barrier()
        ts = []
        for _ in range(10):
            torch.cuda.synchronize(); s = time.perf_counter()
            (dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
            torch.cuda.synchronize(); ts.append(time.perf_counter() - s)
        ts.sort()
        if rank == 1: print(f"nccl send/recv {sz:>11} B {sz/ts[5]/1e9:8.2f} GB/s {ts[5]*1e6:9.1f} us", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    if torch.cuda.device_count() > 1: mp.spawn(run, args=(2,), nprocs=2)
    else: print("one GPU: no NCCL pair")
