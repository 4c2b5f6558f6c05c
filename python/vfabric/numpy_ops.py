"""The layer stream's array operations on NumPy (`vfabric.streaming.LayerStream` over host memory: the emulated
device's, or a host lease's), with AdamW as `torch.optim.AdamW` computes it. For running the schedule without
PyTorch: the tests, and `bench/scripts/stream_proxy.py`. Needs NumPy (imported here, not by the package)."""

import numpy as np

from vfabric.stream_layout import AdamW


def adamw(p, g, m, v, step: int, opt: AdamW) -> None:
    """AdamW as torch.optim.AdamW computes it, in place, in fp32."""
    b1, b2 = opt.betas
    p *= np.float32(1 - opt.lr * opt.weight_decay)
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

    def adamw(self, p, g, m, v, step: int, opt: AdamW) -> None:
        adamw(p, g, m, v, step, opt)

    def event(self) -> Done:
        return Done()
