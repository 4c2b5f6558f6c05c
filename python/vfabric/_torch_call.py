"""One call of a streamed layer in autograd (`vfabric.torch.stream`): the layer runs as its model calls it (any
positional and keyword arguments, several tensor inputs, tuple or dataclass outputs), without a graph in the
forward pass, and again in the backward pass with its weights leased once more, from the same random number
generator and autocast state, as `torch.utils.checkpoint` replays a segment.

Its arguments are flattened (`torch.utils._pytree`): the tensors among them are the autograd function's inputs,
so each that requires a gradient gets one; the rest (None, flags, a cache object) are kept as they are. An
anchor tensor that requires a gradient goes in too, so that the backward pass reaches a layer whose inputs
need none (frozen embeddings under LoRA adapters) but whose parameters do.
"""

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_unflatten

CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past")
"""Keyword arguments Hugging Face layers take their key/value cache by: dropped while gradients are recorded, as
their own gradient checkpointing drops them (the recompute would update the cache a second time)."""


@contextlib.contextmanager
def _swapped(module: nn.Module, tensors: Dict[str, torch.Tensor], aliases: Optional[Dict[str, List[str]]] = None
             ) -> Iterator[None]:
    """The module computes with `tensors` in place of its parameters (by name, and under each of the names in
    `aliases[name]` a parameter shared within the module has) inside the block."""
    saved = []
    try:
        for name, t in tensors.items():
            for each in [name, *(aliases or {}).get(name, ())]:
                owner, _, leaf = each.rpartition(".")
                m = module.get_submodule(owner) if owner else module
                saved.append((m, leaf, m._parameters[leaf]))
                m._parameters[leaf] = t
        yield
    finally:
        for m, leaf, p in reversed(saved):
            m._parameters[leaf] = p


class Call:
    """A layer's arguments, flattened: the tensors (autograd's inputs) and the rest (kept)."""

    def __init__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
        leaves, self.spec = tree_flatten((args, kwargs))
        self.at = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.tensors = [leaves[k] for k in self.at]
        for k in self.at:
            leaves[k] = None  # the tensors travel through autograd, not here
        self.leaves = leaves
        self.out_spec: Any = None
        self.out_leaves: List[Any] = []
        self.out_at: List[int] = []
        self.out_shapes: List[Tuple[torch.Size, torch.dtype]] = []

    def arguments(self, tensors: Sequence[torch.Tensor]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        leaves = list(self.leaves)
        for k, t in zip(self.at, tensors):
            leaves[k] = t
        return tree_unflatten(leaves, self.spec)

    def keep_output(self, out: Any) -> List[torch.Tensor]:
        """Flattens the forward pass's output: its tensors go to autograd, its structure stays here."""
        leaves, self.out_spec = tree_flatten(out)
        self.out_at = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        tensors = [leaves[k] for k in self.out_at]
        for k in self.out_at:
            leaves[k] = None
        self.out_leaves = leaves
        self.out_shapes = [(t.shape, t.dtype) for t in tensors]
        return tensors

    def output(self, tensors: Sequence[torch.Tensor]) -> Any:
        leaves = list(self.out_leaves)
        for k, t in zip(self.out_at, tensors):
            leaves[k] = t
        return tree_unflatten(leaves, self.out_spec)


class _Replay:
    """What the recompute needs to run as the forward pass ran: the random number generators' states (the CPU's
    and each CUDA device's among the inputs') and the autocast state."""

    def __init__(self, device: torch.device, tensors: Sequence[torch.Tensor]):
        self.kind = device.type
        self.cpu_rng = torch.get_rng_state()
        self.devices = sorted({t.device.index for t in tensors if t.device.type == "cuda"}
                              | ({device.index or 0} if device.type == "cuda" else set()))
        self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.devices]
        self.autocast = {
            kind: (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in {"cpu", self.kind}
        }
        self.cache = torch.is_autocast_cache_enabled()

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=self.devices, enabled=True, device_type="cuda"):
            torch.set_rng_state(self.cpu_rng)
            for d, state in zip(self.devices, self.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            with contextlib.ExitStack() as stack:
                for kind, (enabled, dtype) in self.autocast.items():
                    stack.enter_context(torch.autocast(kind, enabled=enabled, dtype=dtype, cache_enabled=self.cache))
                yield


class StreamedCall(torch.autograd.Function):
    """One streamed layer in autograd: forward without a graph (its tensor inputs kept), backward recomputing the
    layer's forward with its parameters leased again, handing their gradients to the stream and returning
    each input's."""

    @staticmethod
    def forward(ctx, owner, i, call, anchor, *tensors):  # type: ignore[override]
        ctx.replay = _Replay(owner.device, tensors)
        args, kwargs = call.arguments(tensors)
        out = owner.run_forward(i, args, kwargs, recomputed=True)
        outs = call.keep_output(out)
        ctx.save_for_backward(*tensors)
        ctx.owner, ctx.i, ctx.call = owner, i, call
        ctx.mark_non_differentiable(*[t for t in outs if not t.is_floating_point()])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        owner, i, call = ctx.owner, ctx.i, ctx.call
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        args, kwargs = call.arguments(inputs)
        with torch.enable_grad(), ctx.replay.replaying():
            out = owner.run_backward(i, args, kwargs, lambda o: _backward_through(owner, i, call, o, grads))
        del out
        return (None, None, None, None, *[t.grad if t.requires_grad else None for t in inputs])


def _backward_through(owner: Any, i: int, call: Call, out: Any, grads: Sequence[Optional[torch.Tensor]]) -> None:
    """The recompute's output `out` against the forward pass's: the same tensors, or the layer is not one the
    stream can run (it computed something else from the same inputs); then the gradients through it."""
    leaves, _ = tree_flatten(out)
    outs = [x for x in leaves if isinstance(x, torch.Tensor)]
    shapes = [(t.shape, t.dtype) for t in outs]
    if shapes != call.out_shapes:
        raise RuntimeError(
            f"streamed layer {i} ({type(owner.modules[i]).__name__}) computed other outputs when recomputed in the "
            f"backward pass ({shapes}) than in its forward pass ({call.out_shapes}): a streamed layer must compute "
            "the same from the same inputs (no state kept across calls)")
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
