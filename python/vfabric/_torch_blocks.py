"""`StreamedLayers.step_by_blocks`: one optimizer step over many micro-batches, run block by block instead of
micro-batch by micro-batch (the PyTorch side of `vfabric.streaming`; imported on first use).

Accumulating gradients micro-batch by micro-batch streams every layer's weights in and its fp32 gradient sums in
and out once per micro-batch: with 16 micro-batches, a 200 M-parameter block's sums cross PCIe 32 times a step,
which bounds the step. Here each group of micro-batches runs through one layer before the next layer starts: a
layer's weights are leased once per group, its gradients add up on the GPU over the group's micro-batches, and
its sums move once per group. What crosses PCIe instead is each layer's input per micro-batch, kept in pinned
host memory between the forward pass and the backward pass (the backward recomputes each layer from it, as the
micro-batch schedule does).
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from vfabric._torch_stream import _swapped


class _Saved:
    """Layer inputs parked in pinned host memory, one buffer per (layer, slot in the group), reused step after
    step; copies run on a stream of their own beside the computation."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.buffers: Dict[Tuple[int, int], torch.Tensor] = {}

    def _buffer(self, key: Tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        b = self.buffers.get(key)
        if b is None or b.shape != like.shape or b.dtype != like.dtype:
            b = torch.empty(like.shape, dtype=like.dtype, pin_memory=self.cuda)
            self.buffers[key] = b
        return b

    def put(self, key: Tuple[int, int], x: torch.Tensor) -> None:
        """Copies `x` out (it may be freed once this returns: its memory is held until the copy is done)."""
        b = self._buffer(key, x)
        if self.stream is None:
            b.copy_(x)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            b.copy_(x, non_blocking=True)
        x.record_stream(self.stream)

    def get(self, key: Tuple[int, int]) -> torch.Tensor:
        """The input parked under `key`, back on the device (queued on the side stream; the computation waits
        for it)."""
        b = self.buffers[key]
        if self.stream is None:
            return b.clone()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            x = b.to(self.device, non_blocking=True)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        x.record_stream(torch.cuda.current_stream(self.device))
        return x


def step_by_blocks(
    layers: Any,
    micro_batches: Sequence[Any],
    first: Callable[[Any], torch.Tensor],
    last: Callable[[torch.Tensor, Any], torch.Tensor],
    group: int = 0,
) -> torch.Tensor:
    """See `StreamedLayers.step_by_blocks`."""
    m = len(micro_batches)
    if m == 0:
        raise ValueError("step_by_blocks needs at least one micro-batch")
    group = m if group <= 0 else min(group, m)
    saved: Optional[_Saved] = getattr(layers, "_saved", None)
    if saved is None:
        saved = layers._saved = _Saved(layers.device)
    total = torch.zeros((), device=layers.device)
    for start in range(0, m, group):
        batch = list(micro_batches[start : start + group])
        # Every group but the last adds its gradients to the layers' sums; the last one's steps the layers.
        layers.accumulating = start + group < m
        total += _group(layers, saved, batch, first, last)
    layers.accumulating = False
    return total


def _group(layers: Any, saved: _Saved, batch: List[Any], first: Callable, last: Callable) -> torch.Tensor:
    s, n = layers.stream, len(layers.modules)
    # Forward, layer by layer, without a graph: each layer's input per micro-batch goes to host memory.
    with torch.no_grad():
        xs = [first(mb) for mb in batch]
        for i in range(n):
            w = s.forward_weights(i)
            with _swapped(layers.modules[i], w):
                for k in range(len(batch)):
                    saved.put((i, k), xs[k])
                    xs[k] = layers.forwards[i](xs[k])
            del w
            s.forward_done(i)
    # What follows the streamed layers, with a graph: the loss, and the gradient of the last layer's output.
    total = torch.zeros((), device=layers.device)
    grads: List[Optional[torch.Tensor]] = []
    for k, mb in enumerate(batch):
        x = xs[k].detach().requires_grad_()
        xs[k] = None  # type: ignore[call-overload]
        with torch.enable_grad():
            loss = last(x, mb)
        loss.backward()
        total += loss.detach()
        grads.append(x.grad)
    # Backward, layer by layer: its weights leased once, its gradients summed in fp32 over the group.
    for i in reversed(range(n)):
        w = s.backward_weights(i)
        leaves = {name: t.detach().requires_grad_() for name, t in w.items()}
        del w
        sums: Dict[str, torch.Tensor] = {}
        for k in range(len(batch)):
            xin = saved.get((i, k)).requires_grad_()
            with torch.enable_grad(), _swapped(layers.modules[i], leaves):
                out = layers.forwards[i](xin)
            torch.autograd.backward(out, grads[k])
            del out
            grads[k] = xin.grad
            for name, t in leaves.items():
                g = t.grad.float()
                if name in sums:
                    sums[name] += g
                else:
                    sums[name] = g.clone() if g.dtype == t.grad.dtype else g
                t.grad = None
        del leaves
        s.backward_done(i, sums)
        del sums
    # What precedes the streamed layers, with the inputs' gradients.
    for k, mb in enumerate(batch):
        with torch.enable_grad():
            x0 = first(mb)
        torch.autograd.backward(x0, grads[k])
        grads[k] = None
    return total
