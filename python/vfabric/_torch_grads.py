"""The gradients of streamed parameters as the training loop sees them (`vfabric.torch`, `step="optimizer"`).

A streamed parameter's gradient lives in the fabric, summed over the backward passes since its last step. Its
placeholder's `.grad` is a `StreamedGrad`: a tensor of the parameter's shape that holds no elements here and
answers what training code asks of gradients from the sums' norms, which the stream takes as they are made:

- `torch.nn.utils.clip_grad_norm_` (and so `transformers.Trainer`, `accelerate`) takes its 2-norm or
  infinity norm, and multiplies it by the clipping factor, which the step applies to the sums;
- `torch.amp.GradScaler.unscale_` multiplies it by the inverse scale and learns whether it is finite;
- `zero_grad()` sets it to None (the next backward pass starts the sums afresh) or zeroes it.

Any other operation on it raises, naming the parameter, rather than computing with elements it does not hold.
At the optimizer's step (`vfabric._torch_optim`) the layer steps with the group's hyperparameters of that
moment and the gradient's factor, and the optimizer itself skips the parameter.
"""

import math
from typing import Any, List, Optional

import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten


class StreamedGrad(torch.Tensor):
    """The gradient of parameter `j` of streamed layer `i` of `owner` (a `StreamedLayers`)."""

    @staticmethod
    def __new__(cls, owner: Any, i: int, j: int, like: torch.Tensor):  # type: ignore[override]
        return torch.Tensor._make_wrapper_subclass(cls, like.shape, dtype=like.dtype, device=like.device,
                                                   requires_grad=False)

    def __init__(self, owner: Any, i: int, j: int, like: torch.Tensor):
        self.owner, self.i, self.j = owner, i, j
        self.factor: Optional[torch.Tensor] = None
        """What the loop multiplied the gradient by (clipping, unscaling); None: nothing."""

    def __repr__(self) -> str:  # type: ignore[override]
        return f"StreamedGrad({self.name}, shape={tuple(self.shape)}, in the fabric)"

    @property
    def name(self) -> str:
        return self.owner.param_name(self.i, self.j)

    def _norms(self) -> Any:
        norms = self.owner.stream.norms(self.i)[self.j]
        if norms is None:
            raise RuntimeError(f"vfabric: {self.name} has no gradient in the fabric (zeroed or stepped)")
        return norms

    def norm_of(self, ord: Any) -> torch.Tensor:
        l2, linf = self._norms()
        ord = float(ord) if ord is not None else 2.0
        if ord == 2.0:
            n = l2
        elif math.isinf(ord) and ord > 0:
            n = linf
        else:
            raise RuntimeError(f"vfabric: a streamed gradient's norm is its 2-norm or infinity norm, not the {ord}-norm "
                               f"({self.name})")
        n = n.reshape(())
        return n * self.factor.abs() if self.factor is not None else n.clone()

    def multiply(self, by: Any) -> None:
        by = torch.as_tensor(by, dtype=torch.float32, device=self.device).reshape(()).clone()
        self.factor = by if self.factor is None else self.factor * by

    def finite(self) -> torch.Tensor:
        """1.0 where the gradient (times its factor) holds only finite values, else 0.0 (on the device)."""
        _, linf = self._norms()
        x = linf.reshape(()) * (self.factor if self.factor is not None else 1.0)
        return torch.isfinite(x).float()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: C901
        kwargs = kwargs or {}
        if func is aten.linalg_vector_norm.default:
            x, ord = args[0], (args[1] if len(args) > 1 else kwargs.get("ord", 2))
            out = x.norm_of(ord)
            dtype = kwargs.get("dtype")
            return out.to(dtype) if dtype is not None else out
        if func in (aten.mul_.Tensor, aten.mul_.Scalar):
            args[0].multiply(args[1])
            return args[0]
        if func is aten._foreach_norm.Scalar:
            return [t.norm_of(args[1] if len(args) > 1 else 2) if isinstance(t, StreamedGrad)
                    else torch.linalg.vector_norm(t, args[1] if len(args) > 1 else 2) for t in args[0]]
        if func in (aten._foreach_mul_.Tensor, aten._foreach_mul_.Scalar):
            for t in args[0]:
                t.multiply(args[1]) if isinstance(t, StreamedGrad) else t.mul_(args[1])
            return None
        if func is aten._amp_foreach_non_finite_check_and_unscale_.default:
            grads, found_inf, inv_scale = args
            plain = [g for g in grads if not isinstance(g, StreamedGrad)]
            if plain:
                func(plain, found_inf, inv_scale)
            for g in grads:
                if isinstance(g, StreamedGrad):
                    g.multiply(inv_scale)
                    found_inf.copy_(torch.maximum(found_inf, 1.0 - g.finite().to(found_inf.device)))
            return None
        if func in (aten.zero_.default, aten._foreach_zero_.default):
            for t in (args[0] if func is aten._foreach_zero_.default else [args[0]]):
                if isinstance(t, StreamedGrad):
                    t.owner.zeroed(t.i)
                else:
                    t.zero_()
            return args[0] if func is aten.zero_.default else None
        if func in (aten.detach.default, aten.alias.default, aten.detach_.default):
            return args[0]
        names = [t.name for t in tree_leaves(args) if isinstance(t, StreamedGrad)]
        raise RuntimeError(
            f"vfabric: the gradient of {', '.join(names[:3])} lives in the fabric, which steps it at the optimizer's "
            f"step: {func} cannot read it here (what works: clip_grad_norm_, GradScaler's unscale_, zero_grad)")


def tree_leaves(x: Any) -> List[Any]:
    out: List[Any] = []
    tree_map(lambda t: out.append(t), x)
    return out
