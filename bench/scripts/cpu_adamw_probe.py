"""What the CPU's AdamW step and compute copy cost on host memory of each kind the fabric could use: the same
fused kernel (`torch._fused_adamw_`) and fp32 -> bf16 copy over one block's worth of parameters, in memory from
PyTorch's allocator, pinned by CUDA, a shared memory file (the host tier's kind), that file registered with CUDA,
and private anonymous memory with transparent huge pages asked for (madvise), registered or not; on the main
thread and on a worker thread; and once more with the GPU's copy engines moving pinned host memory both ways
meanwhile (what the CPU's steps share the host's memory with during a streamed training step). Prints one
line per case and a JSON summary.

    python3 bench/scripts/cpu_adamw_probe.py --params 200000000 --reps 3
"""

import argparse
import json
import mmap
import os
import threading
import time

import torch


def backing(kind: str, nbytes: int):
    """A uint8 tensor of `nbytes` in memory of `kind`, and what keeps it alive."""
    if kind == "torch":
        t = torch.empty(nbytes, dtype=torch.uint8)
        return t, None
    if kind == "torch_pinned":
        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return t, None
    if kind.startswith("memfd"):
        fd = os.memfd_create("probe")
        os.ftruncate(fd, nbytes)
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        os.close(fd)
    else:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if "thp" in kind:
            m.madvise(mmap.MADV_HUGEPAGE)
    t = torch.frombuffer(m, dtype=torch.uint8)
    t.fill_(0)  # faulted in, as the host tier is before registration
    if kind.endswith("_registered"):
        rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
        assert int(rc) == 0, f"cudaHostRegister: {rc}"
    return t, m


def thp_kib() -> int:
    """Memory of this process mapped in huge pages now."""
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:")):
                total += int(line.split()[1])
    return total


class Contention:
    """The GPU's copy engines moving 1 GiB of pinned host memory to the GPU and another back, over and over, on
    two streams, until `set`; how many GB they moved a second."""

    def __init__(self):
        n = 1 << 30
        self.host = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.dev = [torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2)]
        self.streams = [torch.cuda.Stream() for _ in range(2)]
        self.stop = threading.Event()
        self.moved = 0
        self.thread = threading.Thread(target=self._run)
        self.t0 = time.perf_counter()
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            with torch.cuda.stream(self.streams[0]):
                self.dev[0].copy_(self.host[0], non_blocking=True)
            with torch.cuda.stream(self.streams[1]):
                self.host[1].copy_(self.dev[1], non_blocking=True)
            for st in self.streams:
                st.synchronize()
            self.moved += 2 << 30

    def set(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.moved / (time.perf_counter() - self.t0) / 1e9


def case(kind: str, n: int, reps: int, worker: bool, contend=None) -> dict:
    buf, keep = backing(kind, 4 * n * 4 + 2 * n)
    f32 = buf[: 16 * n].view(torch.float32)
    p, g, m, v = (f32[i * n : (i + 1) * n] for i in range(4))
    bf = buf[16 * n : 16 * n + 2 * n].view(torch.bfloat16)
    g.normal_()
    steps = torch.full((), 1.0)
    out = {}

    def run():
        for name, fn in (
            ("adamw", lambda: torch._fused_adamw_([p], [g], [m], [v], [], [steps], lr=1e-4, beta1=0.9, beta2=0.95,
                                                  weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)),
            ("copy_bf16", lambda: bf.copy_(p)),
        ):
            fn()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            out[name + "_ms"] = round((time.perf_counter() - t) / reps * 1e3, 1)

    if worker:
        th = threading.Thread(target=run)
        th.start()
        th.join()
    else:
        run()

    out["thp_MiB"] = thp_kib() // 1024
    if contend is not None:
        out["pcie_GBps"] = round(contend.set(), 1)
    del p, g, m, v, bf, f32
    if kind.endswith("_registered"):
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
    del buf
    if keep is not None:
        try:
            keep.close()
        except BufferError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=200_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {a.params} parameters a case", flush=True)
    rows = []
    kinds = ["torch", "torch_pinned", "memfd", "memfd_registered", "anon", "anon_thp", "anon_thp_registered"]
    if not cuda:
        kinds = [k for k in kinds if "pinned" not in k and "registered" not in k]
    for kind in kinds:
        for worker in (False, True):
            r = case(kind, a.params, a.reps, worker)
            r.update(kind=kind, thread="worker" if worker else "main")
            gbs = 28 * a.params / (r["adamw_ms"] / 1e3) / 1e9
            print(f"{kind:22s} {r['thread']:6s} adamw {r['adamw_ms']:8.1f} ms ({gbs:5.1f} GB/s)  "
                  f"copy_bf16 {r['copy_bf16_ms']:7.1f} ms  thp {r['thp_MiB']} MiB", flush=True)
            rows.append(r)
    if cuda:
        for kind in ("memfd_registered", "anon_thp_registered"):
            r = case(kind, a.params, a.reps, True, Contention())
            r.update(kind=kind, thread="worker", contended=True)
            print(f"{kind:22s} worker, copy engines busy: adamw {r['adamw_ms']:8.1f} ms  copy_bf16 "
                  f"{r['copy_bf16_ms']:7.1f} ms  (PCIe meanwhile {r['pcie_GBps']} GB/s both ways)", flush=True)
            rows.append(r)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"params": a.params, "threads": torch.get_num_threads(), "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
