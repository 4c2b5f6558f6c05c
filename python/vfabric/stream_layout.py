"""Where a streamed layer's state sits in its fabric regions (see `vfabric.streaming`).

Three regions per layer, each leased in parts that start on page boundaries, so that each part needs only a
run of frames of its own on the device (a layer's optimizer states are gigabytes: one run of that length is
often not there on a device busy with other layers, and making one costs copies):

- the **compute copy**: each matrix parameter in a part of its own, the vectors packed together in the last one
  (512-byte aligned), in the dtype the layer computes in;
- the **optimizer states**: the layer's trainable parameters as one flat fp32 array cut into pieces of at
  most `piece_bytes` of state; piece k holds its master weights, first moments and second moments back to back;
- the **gradient sums** (fp32, for accumulation, for steps on the CPU and for steps the optimizer takes after
  the backward pass), cut into the same pieces.

A frozen parameter (`ParamSpec.trainable` false) has only its compute copy, in its own dtype: it is read,
never stepped, and takes no optimizer state.
"""

import math
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Protocol, Sequence, Tuple

Array = Any
"""An array of the library `Ops` works with."""

ALIGN = 512
"""Byte alignment of the vector parameters packed in a compute copy's last part."""

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Element types of compute copies, and their sizes."""

PIECE_BYTES = 96 << 20
"""Default most bytes of optimizer state in one piece."""


class ParamSpec(NamedTuple):
    """One parameter of a layer: its name in the layer (`"attn.qkv.weight"`), shape, compute dtype, and whether
    an optimizer steps it (a frozen one is only read)."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    trainable: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Part(NamedTuple):
    """A byte range of a region, leased on its own."""

    offset: int
    nbytes: int


class Piece(NamedTuple):
    """A piece of the flat parameter array: its first element and its length."""

    start: int
    numel: int


class LayerLayout:
    """A layer's parameters in its three regions (see the module's docs). `page_size` is the fabric's."""

    def __init__(self, specs: Sequence[ParamSpec], page_size: int, piece_bytes: int = PIECE_BYTES):
        if not specs:
            raise ValueError("a streamed layer needs at least one parameter")
        if page_size <= 0 or page_size % 4:
            raise ValueError(f"page size {page_size} is not a positive multiple of 4 bytes")
        self.specs = list(specs)
        for s in self.specs:
            if s.dtype not in ITEMSIZE:
                raise ValueError(f"{s.name}: compute dtype {s.dtype!r} is not one of {sorted(ITEMSIZE)}")
        self.page_size = page_size
        self.trainable = [j for j, s in enumerate(self.specs) if s.trainable]
        """The parameters an optimizer steps, in order."""
        self.numel = sum(self.specs[j].numel for j in self.trainable)
        """Elements of the trainable parameters: the flat array's length."""
        self.flat: List[int] = []
        """Each parameter's first element in the flat array (-1: frozen, not in it)."""
        n = 0
        for s in self.specs:
            self.flat.append(n if s.trainable else -1)
            n += s.numel if s.trainable else 0
        # The compute copy: matrices a part each, then the vectors in one.
        self.compute: List[Tuple[int, int]] = [(0, 0)] * len(self.specs)
        """Each parameter's part in the compute copy and its byte offset in that part."""
        self.parts: List[Part] = []
        at = 0
        for i, s in enumerate(self.specs):
            if len(s.shape) >= 2:
                size = s.numel * ITEMSIZE[s.dtype]
                self.compute[i] = (len(self.parts), 0)
                self.parts.append(Part(at, size))
                at += _round_up(size, page_size)
        vectors = [i for i, s in enumerate(self.specs) if len(s.shape) < 2]
        if vectors:
            inside = 0
            for i in vectors:
                self.compute[i] = (len(self.parts), inside)
                inside = _round_up(inside + self.specs[i].numel * ITEMSIZE[self.specs[i].dtype], ALIGN)
            self.parts.append(Part(at, inside))
            at += _round_up(inside, page_size)
        self.compute_bytes = at
        # The optimizer states and gradient sums: pieces of a whole number of quarter pages of elements, so that
        # every piece starts on a page in both regions.
        unit = page_size // 4
        per_piece = max(unit, piece_bytes // 12 // unit * unit)
        self.pieces = [Piece(s, min(per_piece, self.numel - s)) for s in range(0, self.numel, per_piece)]
        self.piece_numel = per_piece
        self.state_bytes = 12 * self.numel
        self.grad_bytes = 4 * self.numel

    def state_part(self, k: int) -> Part:
        """Piece `k`'s master weights, first and second moments (fp32, back to back) in the states region."""
        return Part(12 * self.pieces[k].start, 12 * self.pieces[k].numel)

    def grad_part(self, k: int) -> Part:
        """Piece `k`'s gradient sums (fp32) in the gradients region."""
        return Part(4 * self.pieces[k].start, 4 * self.pieces[k].numel)

    def overlaps(self, k: int) -> List[Tuple[int, int, int]]:
        """The parameters piece `k` covers: (parameter, first element in it, elements), in order."""
        return self.covering(*self.pieces[k])

    def covering(self, start: int, n: int) -> List[Tuple[int, int, int]]:
        """The parameters that elements `start .. start + n` of the flat array cover: (parameter, first element
        in it, elements), in order."""
        out = []
        for i, (s, first) in enumerate(zip(self.specs, self.flat)):
            if first < 0:
                continue
            lo, hi = max(start, first), min(start + n, first + s.numel)
            if lo < hi:
                out.append((i, lo - first, hi - lo))
        return out


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class AdamW:
    """The optimizer the stream runs on each parameter: AdamW with decoupled weight decay, as `torch.optim.AdamW`
    (`decoupled` false: Adam with L2 weight decay, as `torch.optim.Adam`; `maximize`: ascend, as theirs)."""

    lr: float = 1e-3
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    decoupled: bool = True
    maximize: bool = False


class Event(Protocol):
    """A point in the device's queue of work."""

    def wait(self) -> None:
        """Blocks until the work queued before the event is done."""


class Ops(Protocol):
    """What the stream needs from an array library."""

    def flat(self, lease: Any) -> Array:
        """The lease's bytes as a 1-D uint8 array (zero copy)."""

    def view(self, flat: Array, offset: int, dtype: str, shape: Tuple[int, ...]) -> Array:
        """Elements of `dtype` in `shape` at byte `offset` of a uint8 array (zero copy)."""

    def buffer(self, nbytes: int) -> Array:
        """A work array of `nbytes` bytes (uint8, 1-D) on the device."""

    def copy(self, dst: Array, src: Array) -> None:
        """`dst[...] = src`, converting the element type."""

    def add(self, dst: Array, src: Array) -> None:
        """`dst += src`."""

    def adamw(self, p: Sequence[Array], g: Sequence[Array], m: Sequence[Array], v: Sequence[Array],
              steps: Sequence[int], opt: AdamW) -> None:
        """One AdamW step in place on lists of fp32 arrays (parameters, gradients, moments), each array at its own
        step (counting from 1), all with the same hyperparameters."""

    def scale(self, dst: Array, factor: Any) -> None:
        """`dst *= factor`, where `factor` is a number or a one-element array (of any device)."""

    def zero(self, dst: Array) -> None:
        """`dst[...] = 0`."""

    def norms(self, arrays: Sequence[Array]) -> Tuple[List[Array], List[Array]]:
        """The 2-norm and the largest absolute value of each array, as one-element arrays (no wait for the
        device)."""

    def event(self) -> Optional[Event]:
        """An event recorded now on the device's queue."""
