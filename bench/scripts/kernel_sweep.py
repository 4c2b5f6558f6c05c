# Sweep of the page-copy kernel's variants (unroll 1/4/8, chunk size, threads, grid, pull/push) on the lent GPUs,
# with CuPy, to choose the defaults that vfabric's SM mover uses. Loads transport/kernels/page_copy.cu as is.
# Usage (on the GPU machine): python3 bench/scripts/kernel_sweep.py
import os, sys, cupy as cp, numpy as np
here = os.path.dirname(os.path.abspath(__file__))
src_text = open(os.path.join(here, "..", "..", "transport", "kernels", "page_copy.cu")).read()
total = 1 << 30
ndev = cp.cuda.runtime.getDeviceCount()
mods = {}
def mod(dev):
    if dev not in mods:
        with cp.cuda.Device(dev):
            mods[dev] = cp.RawModule(code=src_text, options=("-std=c++17",))
    return mods[dev]
for d in range(ndev):
    with cp.cuda.Device(d):
        for o in range(ndev):
            if o != d:
                try: cp.cuda.runtime.deviceEnablePeerAccess(o)
                except Exception as e: pass
bufs = {}
def buf(dev):
    if dev not in bufs:
        if dev == "host":
            rt = cp.cuda.runtime
            with cp.cuda.Device(0):
                p = rt.hostAlloc(2 * total, 0x02 | 0x01)
                m = cp.cuda.UnownedMemory(p, 2 * total, None, device_id=0)
                bufs[dev] = cp.ndarray(2 * total // 4, dtype=cp.uint32, memptr=cp.cuda.MemoryPointer(m, 0))
                bufs[dev][:] = 0x5a5a5a5a
        else:
            with cp.cuda.Device(dev):
                bufs[dev] = cp.full(2 * total // 4, 0x3c3c3c3c, dtype=cp.uint32)
    return bufs[dev]
def run(src, dst, where, page, grid, threads, name, chunk):
    n = total // page
    rng = np.random.default_rng(7)
    sp = rng.choice(2 * total // page, n, replace=False).astype(np.uint32)
    dp = rng.choice(2 * total // page, n, replace=False).astype(np.uint32)
    chunk = min(chunk, page)
    with cp.cuda.Device(where):
        k = mod(where).get_function(name)
        s_, d_ = cp.asarray(sp), cp.asarray(dp)
        args = (buf(src), buf(dst), s_, d_, np.uint64(n * (page // chunk)), np.uint32(page // chunk), np.uint32(chunk // 16))
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        ts = []
        for it in range(11):
            e0.record(); k((grid,), (threads,), args); e1.record(); e1.synchronize()
            if it >= 3: ts.append(cp.cuda.get_elapsed_time(e0, e1))
        ts.sort()
        ms = ts[len(ts) // 2]
        return total / ms / 1e6
print("devices", ndev, flush=True)
rows = []
if ndev >= 2:
    for page in (2 << 20, 64 << 10):
        for where, tag in ((0, "pull"), (1, "push")):
            for name in ("vf_page_copy_u1", "vf_page_copy", "vf_page_copy_u8"):
                for chunk in ((64 << 10, 2 << 20) if page > (64 << 10) and name == "vf_page_copy" else (64 << 10,)):
                    line = []
                    for grid in (4, 8, 16, 24, 32, 48, 64, 132):
                        g = run(1, 0, where, page, grid, 1024, name, chunk)
                        line.append(f"{g:6.1f}")
                    print(f"1->0 {tag} page={page>>10:5}K {name:16} chunk={chunk>>10:5}K thr=1024 grids 4,8,16,24,32,48,64,132: " + " ".join(line), flush=True)
    for page in (2 << 20, 64 << 10):
        line = [f"{run(0, 1, 1, page, g, 1024, 'vf_page_copy', 64 << 10):6.1f}" for g in (16, 32, 64, 132)]
        print(f"0->1 pull page={page>>10:5}K vf_page_copy thr=1024 grids 16,32,64,132: " + " ".join(line), flush=True)
for page in (2 << 20, 64 << 10):
    for (src, dst, tag) in ((0, "host", "gpu0->host"), ("host", 0, "host->gpu0")):
        for name in ("vf_page_copy_u1", "vf_page_copy"):
            line = [f"{run(src, dst, 0, page, g, 1024, name, 64 << 10):6.1f}" for g in (2, 4, 8, 16, 32, 132)]
            print(f"{tag} page={page>>10:5}K {name:16} thr=1024 grids 2,4,8,16,32,132: " + " ".join(line), flush=True)
# correctness spot check of the default kernel: copy pattern, compare
with cp.cuda.Device(0):
    a = buf(0); a[:] = cp.arange(a.size, dtype=cp.uint32)
if ndev >= 2:
    b = buf(1)
    run(0, 1, 1, 64 << 10, 32, 1024, "vf_page_copy", 64 << 10)
    n = total // (64 << 10); rng = np.random.default_rng(7)
    sp = rng.choice(2 * total // (64 << 10), n, replace=False); dp = rng.choice(2 * total // (64 << 10), n, replace=False)
    w = (64 << 10) // 4
    ok = all(bool((cp.asnumpy(b[int(dp[i]) * w:(int(dp[i]) + 1) * w]) == cp.asnumpy(a[int(sp[i]) * w:(int(sp[i]) + 1) * w])).all()) for i in (0, n // 2, n - 1))
    print("check pages equal:", ok)
