"""What pinning a large shared host tier costs, and what makes it cheaper (GPU machine).

The fabric's host tier is a memory file (memfd) mapped shared and registered with the driver
(`cuMemHostRegister`, portable and device-mapped). Registering 72 GiB took 64 s on the H200 machine. This probe
times, on fresh files of --gib GiB each:

  register         registration alone (the driver faults every page in, then pins it);
  populate+reg     the pages faulted in first by --threads threads (madvise MADV_POPULATE_WRITE), then one
                   registration;
  populate+chunks  faulted in as above, then registered in --threads pieces at once, one per thread, and a copy
                   across two pieces' boundary tried (the driver refuses it: cudaErrorInvalidValue on the H200
                   machine) and checked byte for byte;
  huge+populate    as populate+reg with MADV_HUGEPAGE asked first (honoured only where shmem THP allows it).

  python3 bench/scripts/pin_probe.py --gib 16 --threads 16
"""

import argparse
import ctypes
import glob
import mmap
import os
import threading
import time

import torch

MADV_POPULATE_WRITE = 23
MADV_HUGEPAGE = 14
REG_FLAGS = 0x01 | 0x02  # cudaHostRegisterPortable | cudaHostRegisterMapped

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def cudart() -> ctypes.CDLL:
    torch.cuda.init()
    base = os.path.dirname(os.path.dirname(torch.__file__))
    for pat in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu*/lib/libcudart.so*", "torch/lib/libcudart*.so*"):
        for path in sorted(glob.glob(os.path.join(base, pat))):
            return ctypes.CDLL(path)
    return ctypes.CDLL("libcudart.so")


rt = cudart()
rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]


class Tier:
    def __init__(self, nbytes: int):
        self.fd = os.memfd_create("pin-probe")
        os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.buf = (ctypes.c_char * nbytes).from_buffer(self.map)
        self.addr = ctypes.addressof(self.buf)
        self.len = nbytes
        self.registered = []

    def pieces(self, n: int):
        step = -(-self.len // n // (2 << 20)) * (2 << 20)
        return [(a, min(step, self.len - a)) for a in range(0, self.len, step)]

    def madvise(self, advice: int, threads: int) -> None:
        errs = []

        def one(at: int, n: int) -> None:
            if libc.madvise(self.addr + at, n, advice) != 0:
                errs.append(os.strerror(ctypes.get_errno()))

        ts = [threading.Thread(target=one, args=p) for p in self.pieces(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        if errs:
            raise OSError(f"madvise({advice}): {errs[0]}")

    def register(self, threads: int = 1) -> None:
        errs = []

        def one(at: int, n: int) -> None:
            rc = rt.cudaHostRegister(self.addr + at, n, REG_FLAGS)
            if rc != 0:
                errs.append(rc)
            else:
                self.registered.append(self.addr + at)

        ts = [threading.Thread(target=one, args=p) for p in self.pieces(threads)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        if errs:
            raise RuntimeError(f"cudaHostRegister failed: {errs[0]}")

    def close(self) -> None:
        for a in self.registered:
            rt.cudaHostUnregister(a)
        del self.buf
        self.map.close()
        os.close(self.fd)


def timed(label: str, gib: float, fn) -> float:
    t = time.perf_counter()
    fn()
    s = time.perf_counter() - t
    print(f"  {label:<28} {s:8.2f} s  {gib / s:7.2f} GiB/s", flush=True)
    return s


def boundary_copy(tier: Tier, threads: int) -> None:
    """A copy to the GPU and back across the first two pieces' boundary, checked byte for byte."""
    pieces = tier.pieces(threads)
    if len(pieces) < 2:
        print("  copy across the pieces' boundary: one piece, no boundary", flush=True)
        return
    (_, first), _ = pieces[:2]
    host = torch.frombuffer(tier.map, dtype=torch.uint8, count=tier.len)
    n = 8 << 20
    at = first - n // 2
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    host[at : at + n].copy_(src)
    try:
        gpu = host[at : at + n].to("cuda", non_blocking=True)
        torch.cuda.synchronize()
    except Exception as e:  # torch.AcceleratorError (a RuntimeError in recent releases)
        # The driver refuses a copy whose source spans two registrations: a tier registered in pieces would
        # need every copy split at their boundaries.
        print(f"  copy across the pieces' boundary: REFUSED ({str(e).splitlines()[0]})", flush=True)
        return
    host[at : at + n].zero_()
    host[at : at + n].copy_(gpu, non_blocking=True)
    torch.cuda.synchronize()
    ok = torch.equal(host[at : at + n], src)
    print(f"  copy across the pieces' boundary: {'bytes match' if ok else 'BYTES DIFFER'}", flush=True)
    del host


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=16)
    p.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    a = p.parse_args()
    n = int(a.gib * (1 << 30)) // (2 << 20) * (2 << 20)
    print(f"pin probe: {n / (1 << 30):.1f} GiB files, {a.threads} threads", flush=True)
    for f in ("enabled", "shmem_enabled"):
        try:
            print(f"  transparent_hugepage/{f}: {open(f'/sys/kernel/mm/transparent_hugepage/{f}').read().strip()}")
        except OSError:
            pass
    gib = n / (1 << 30)

    print("register:", flush=True)
    t = Tier(n)
    timed("register", gib, t.register)
    t.close()

    print("populate+reg:", flush=True)
    t = Tier(n)
    s1 = timed(f"populate ({a.threads} threads)", gib, lambda: t.madvise(MADV_POPULATE_WRITE, a.threads))
    s2 = timed("register", gib, t.register)
    print(f"  {'total':<28} {s1 + s2:8.2f} s  {gib / (s1 + s2):7.2f} GiB/s")
    t.close()

    print("populate+chunks:", flush=True)
    t = Tier(n)
    s1 = timed(f"populate ({a.threads} threads)", gib, lambda: t.madvise(MADV_POPULATE_WRITE, a.threads))
    s2 = timed(f"register ({a.threads} pieces at once)", gib, lambda: t.register(a.threads))
    print(f"  {'total':<28} {s1 + s2:8.2f} s  {gib / (s1 + s2):7.2f} GiB/s")
    boundary_copy(t, a.threads)
    t.close()

    print("huge+populate:", flush=True)
    t = Tier(n)
    try:
        t.madvise(MADV_HUGEPAGE, 1)
        s1 = timed(f"populate ({a.threads} threads)", gib, lambda: t.madvise(MADV_POPULATE_WRITE, a.threads))
        s2 = timed("register", gib, t.register)
        print(f"  {'total':<28} {s1 + s2:8.2f} s  {gib / (s1 + s2):7.2f} GiB/s")
        with open("/proc/meminfo") as f:
            print("  " + "  ".join(l.strip() for l in f if l.startswith(("ShmemHugePages", "ShmemPmdMapped"))))
    except OSError as e:
        print(f"  not available: {e}")
    t.close()


if __name__ == "__main__":
    main()
