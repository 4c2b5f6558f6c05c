# The ceilings every GPU benchmark runs beside (torch on the GPU machine).
# Writes $OUT/probe.json, which vfabric-bench --torch-json reads.
# Measures the physical ceilings a GPU memory fabric is judged against, on the lent machine.
import os, time, json, subprocess, sys
import torch
out = os.environ.get("OUT", "/tmp")
res = {}
def sh(c):
    try: return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=60).stdout[-4000:]
    except Exception as e: return str(e)
for c in ["nvidia-smi -L", "nvidia-smi topo -m", "nvidia-smi nvlink -s | head -40", "which cargo rustc nvcc mpirun ibv_devices; nvcc --version | tail -2",
          "ls /dev/infiniband 2>&1", "ldconfig -p | grep -E 'nccl|libcuda.so|ibverbs|rdmacm'", "python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))'; find / -name 'libnccl.so*' 2>/dev/null | head",
          "ulimit -l; nproc; free -g | head -2; cat /etc/os-release | head -3; ldd --version | head -1"]:
    print("$", c); print(sh(c))
n = torch.cuda.device_count(); print("devices", n)
def bw(src, dst, nbytes, iters=20):
    a = torch.empty(nbytes, dtype=torch.uint8, device=src) if src != "cpu" else torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst) if dst != "cpu" else torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    a.random_(0, 255) if src != "cpu" else a.copy_(torch.randint(0, 255, (nbytes,), dtype=torch.uint8))
    for _ in range(3): b.copy_(a, non_blocking=True)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t = time.perf_counter(); b.copy_(a, non_blocking=True); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    ts.sort(); med = ts[len(ts)//2]
    return nbytes / med / 1e9, med * 1e6
rows = []
pairs = [("cuda:0", "cuda:0"), ("cpu", "cuda:0"), ("cuda:0", "cpu")]
if n > 1:
    print("peer access 0->1", torch.cuda.can_device_access_peer(0, 1))
    pairs += [("cuda:0", "cuda:1"), ("cuda:1", "cuda:0")]
for s, d in pairs:
    for sz in [4096, 65536, 2 << 20, 64 << 20, 1 << 30]:
        g, us = bw(s, d, sz)
        rows.append((s, d, sz, round(g, 2), round(us, 1)))
        print(f"{s:>7} -> {d:<7} {sz:>11} B  {g:8.2f} GB/s  {us:9.1f} us")
res["copies"] = rows
# matrix rate for compute-overlap planning
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): a @ b
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print("bf16 TFLOP/s", 2 * 8192**3 / dt / 1e12)
json.dump(res, open(os.path.join(out, "probe.json"), "w"))
