# The NCCL baseline: send/recv GPU0 -> GPU1 through torch.distributed (the peer baseline); its lines say
# `nccl send/recv N B X GB/s`, which vfabric-bench --nccl-log reads.
# On a machine of one GPU, both ranks run on GPU 0 as two hosts (NCCL_HOSTID differs, so NCCL accepts two ranks
# on one device and joins them by its network transport, on loopback): the baseline of the NCCL route between
# two agents sharing that GPU. Those lines say `nccl one-gpu send/recv N B X GB/s`.
import os, sys, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, world, one_gpu, sizes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    if one_gpu:
        os.environ.update(NCCL_HOSTID=f"vfabric-baseline-{rank}", NCCL_SOCKET_IFNAME="lo")
    gpu = 0 if one_gpu else rank
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", gpu))
    label = "nccl one-gpu send/recv" if one_gpu else "nccl send/recv"
    for sz in sizes:
        t = torch.empty(sz, dtype=torch.uint8, device=f"cuda:{gpu}").random_(0, 255)
        for _ in range(3):
            (dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
        torch.cuda.synchronize(); dist.barrier()
        ts = []
        for _ in range(10):
            torch.cuda.synchronize(); s = time.perf_counter()
            (dist.send(t, 1) if rank == 0 else dist.recv(t, 0))
            torch.cuda.synchronize(); ts.append(time.perf_counter() - s)
        ts.sort()
        if rank == 1: print(f"{label} {sz:>11} B {sz/ts[5]/1e9:8.2f} GB/s {ts[5]*1e6:9.1f} us", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    one_gpu = torch.cuda.device_count() < 2
    sizes = [int(s) for s in sys.argv[1:]] or [2 << 20, 64 << 20, 1 << 30]
    mp.spawn(run, args=(2, one_gpu, sizes), nprocs=2)
