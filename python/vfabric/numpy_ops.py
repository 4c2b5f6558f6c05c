"""The layer stream's array operations on NumPy (`vfabric.streaming.LayerStream` over host memory: the emulated
device's, or a host lease's), with AdamW as `torch.optim.AdamW` computes it. For running the schedule without
PyTorch: the tests, and `bench/scripts/stream_proxy.py`. Needs NumPy (imported here, not by the package)."""

import numpy as np

from vfabric.stream_layout import AdamW


def adamw(p, g, m, v, step: int, opt: AdamW) -> None:
    """AdamW as torch.optim.AdamW computes it (Adam with L2 decay when `opt.decoupled` is false, as
    torch.optim.Adam), in place, in fp32."""
    b1, b2 = opt.betas
    if opt.maximize:
        g = -g
    if opt.decoupled:
        p *= np.float32(1 - opt.lr * opt.weight_decay)
    elif opt.weight_decay:
        g = g + np.float32(opt.weight_decay) * p
    m *= np.float32(b1)
    m += np.float32(1 - b1) * g
    v *= np.float32(b2)
    v += np.float32(1 - b2) * g * g
    denom = np.sqrt(v) / np.float32(np.sqrt(1 - b2**step)) + np.float32(opt.eps)
    p -= np.float32(opt.lr / (1 - b1**step)) * m / denom


class Done:
    """The event of work that is done when its call returns (NumPy's)."""

    def wait(self) -> None:
        pass


class NumpyOps:
    """`vfabric.stream_layout.Ops` on NumPy arrays over leased host memory."""

    def flat(self, lease):
        return lease.numpy()

    def view(self, flat, offset: int, dtype: str, shape):
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        return flat[offset : offset + n].view(dt).reshape(shape)

    def buffer(self, nbytes: int):
        return np.empty(nbytes, dtype=np.uint8)

    def copy(self, dst, src) -> None:
        np.copyto(dst, src, casting="unsafe")

    def add(self, dst, src) -> None:
        dst += src

    def adamw(self, ps, gs, ms, vs, steps, opt: AdamW) -> None:
        for p, g, m, v, step in zip(ps, gs, ms, vs, steps):
            adamw(p, g, m, v, step, opt)

    def scale(self, dst, factor) -> None:
        dst *= np.float32(factor)

    def zero(self, dst) -> None:
        dst[...] = 0

    def norms(self, arrays):
        l2 = [np.sqrt(np.sum(np.square(a, dtype=np.float64))).astype(np.float32).reshape(1) for a in arrays]
        linf = [np.max(np.abs(a)).reshape(1) if a.size else np.zeros(1, np.float32) for a in arrays]
        return l2, linf

    def event(self) -> Done:
        return Done()
