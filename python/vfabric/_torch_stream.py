"""`vfabric.torch.StreamedLayers`: a model's layers streamed through the GPU by the fabric (PyTorch side of
`vfabric.streaming`). Imported by `vfabric.torch` on first use, so that `vfabric.torch` imports without torch."""

import contextlib
import functools
import math
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from vfabric.streaming import AdamW, LayerStream, ParamSpec, Reduction

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "uint8": torch.uint8}
_NAMES = {v: k for k, v in _DTYPES.items()}


class _CudaEvent:
    def __init__(self) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> None:
        self.event.synchronize()


class _Done:
    def wait(self) -> None:
        pass


class TorchOps:
    """The stream's array operations on PyTorch tensors: CUDA tensors over the fabric's GPU pages (CPU tensors on
    the emulated device), the step by PyTorch's fused AdamW kernel (the one `torch.optim.AdamW(fused=True)`
    runs)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def flat(self, lease: Any) -> torch.Tensor:
        return torch.from_dlpack(lease.view())

    def view(self, flat: torch.Tensor, offset: int, dtype: str, shape: Tuple[int, ...]) -> torch.Tensor:
        dt = _DTYPES[dtype]
        n = math.prod(shape) * dt.itemsize
        return flat[offset : offset + n].view(dt).view(shape)

    def buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def add(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.add_(src)

    def adamw(self, p, g, m, v, step: int, opt: AdamW) -> None:
        steps = torch.full((), float(step), dtype=torch.float32, device=p.device)
        torch._fused_adamw_(
            [p], [g], [m], [v], [], [steps], lr=opt.lr, beta1=opt.betas[0], beta2=opt.betas[1],
            weight_decay=opt.weight_decay, eps=opt.eps, amsgrad=False, maximize=False,
        )

    def event(self):
        return _CudaEvent() if self.cuda else _Done()


@contextlib.contextmanager
def _swapped(module: nn.Module, tensors: Dict[str, torch.Tensor]) -> Iterator[None]:
    """The module computes with `tensors` in place of its parameters (by name) inside the block."""
    saved = []
    try:
        for name, t in tensors.items():
            owner, _, leaf = name.rpartition(".")
            m = module.get_submodule(owner) if owner else module
            saved.append((m, leaf, m._parameters[leaf]))
            m._parameters[leaf] = t
        yield
    finally:
        for m, leaf, p in reversed(saved):
            m._parameters[leaf] = p


class _StreamedLayer(torch.autograd.Function):
    """One streamed layer in autograd: forward without a graph (its input is kept), backward recomputes the
    layer's forward with its parameters leased again, and hands the gradients to the stream."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, owner, i, rest):  # type: ignore[override]
        s = owner.stream
        w = s.forward_weights(i)
        with torch.no_grad(), _swapped(owner.modules[i], w):
            out = owner.forwards[i](x, *rest)
        del w
        s.forward_done(i)
        ctx.save_for_backward(x)
        ctx.owner, ctx.i, ctx.rest = owner, i, rest
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        owner, i = ctx.owner, ctx.i
        s = owner.stream
        w = s.backward_weights(i)
        leaves = {n: t.detach().requires_grad_() for n, t in w.items()}
        del w
        xd = x.detach().requires_grad_()
        with torch.enable_grad(), _swapped(owner.modules[i], leaves):
            out = owner.forwards[i](xd, *ctx.rest)
        torch.autograd.backward(out, grad)
        del out
        grads = {n: t.grad for n, t in leaves.items()}
        del leaves
        s.backward_done(i, grads)
        del grads
        return xd.grad, None, None, None


class StreamedLayers:
    """Layers of a model whose parameters, gradients and AdamW states live in the fabric and stream through the
    GPU (see `vfabric.torch.stream`)."""

    def __init__(
        self,
        fabric: Any,
        device: Optional[str] = None,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        compute_dtype: torch.dtype = torch.bfloat16,
        lookahead: int = 2,
        host_chunk: int = 0,
        grad_reduce: Optional[Callable[[torch.Tensor], Optional[Reduction]]] = None,
    ):
        if compute_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"compute_dtype must be torch.bfloat16, torch.float16 or torch.float32, not {compute_dtype}")
        device = device or next((d for d in fabric.devices if d.startswith("gpu")), "host")
        if fabric.device_kind == "cuda":
            if not device.startswith("gpu"):
                raise ValueError(f"layers stream through a GPU, not {device!r}")
            self.device = torch.device("cuda", int(device[3:]))
        else:
            self.device = torch.device("cpu")  # the emulated device: its GPUs are host memory
        self.fabric = fabric
        self.compute_dtype = compute_dtype
        self.stream = LayerStream(
            fabric, device, TorchOps(self.device), AdamW(lr, betas, eps, weight_decay), lookahead,
            host_ops=TorchOps(torch.device("cpu")), host_chunk=host_chunk, grad_reduce=grad_reduce,
        )
        self.modules: List[nn.Module] = []
        self.forwards: List[Callable[..., Any]] = []
        self._adopted: set = set()

    @property
    def accumulating(self) -> bool:
        """Whether backward passes only add the layers' gradients up (set it for every micro-batch of a step
        but the last; the last one's backward runs the layers' optimizer step)."""
        return self.stream.accumulating

    @accumulating.setter
    def accumulating(self, value: bool) -> None:
        self.stream.accumulating = bool(value)

    def adopt(self, module: nn.Module, on_host: bool = False) -> nn.Module:
        """Moves a layer's parameters into the fabric (fp32 master weights, zero moments, and a compute copy in
        `compute_dtype` for matrices, fp32 for vectors) and makes its forward a streamed one. With `on_host`, its
        AdamW step runs on the CPU, beside the GPU, and its states stay in host memory. The module's own
        parameters become placeholders on the meta device (their memory is freed). Returns the module."""
        params = [(n, p) for n, p in module.named_parameters()]
        if not params:
            raise ValueError("a streamed layer needs parameters")
        if any(id(p) in self._adopted for _, p in params):
            raise ValueError("this layer is already streamed")
        specs = [
            ParamSpec(n, tuple(p.shape), _NAMES[self.compute_dtype] if p.dim() >= 2 else "float32") for n, p in params
        ]
        values = {n: p.detach() for n, p in params}
        i = self.stream.add_layer(specs, lambda name: values[name].reshape(-1), on_host=on_host)
        del values
        for name, p in params:
            owner, _, leaf = name.rpartition(".")
            m = module.get_submodule(owner) if owner else module
            placeholder = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
            m._parameters[leaf] = placeholder
            self._adopted.add(id(placeholder))
        self.modules.append(module)
        self.forwards.append(module.forward)
        module.forward = functools.partial(self._forward, i)  # type: ignore[method-assign]
        return module

    def _forward(self, i: int, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"a streamed layer's first argument must be its input tensor, not {type(x).__name__}")
        return _StreamedLayer.apply(x, self, i, rest)

    def step_by_blocks(
        self,
        micro_batches: Sequence[Any],
        first: Callable[[Any], torch.Tensor],
        last: Callable[[torch.Tensor, Any], torch.Tensor],
        group: int = 0,
    ) -> torch.Tensor:
        """One optimizer step of the streamed layers over `micro_batches`, run block by block: each group of
        `group` micro-batches (0: all of them) goes through one layer before the next layer starts, so a layer's
        weights are leased, and its gradient sums moved, once per group instead of once per micro-batch. Each
        layer's input per micro-batch waits in pinned host memory for the backward pass. `first(mb)` runs what
        precedes the streamed layers (an embedding) and returns their input; `last(x, mb)` runs what follows them
        and returns the micro-batch's loss (divide it by the number of micro-batches for a mean). Call it under
        the same autocast as a forward pass; the parameters outside the streamed layers get their gradients as
        from `loss.backward()`, for your optimizer's step after. Returns the summed loss."""
        from vfabric._torch_blocks import step_by_blocks

        return step_by_blocks(self, micro_batches, first, last, group)

    def other_parameters(self, model: nn.Module) -> Iterable[nn.Parameter]:
        """The parameters of `model` that are not streamed (embeddings, heads, ...): for the training loop's
        own optimizer."""
        return [p for p in model.parameters() if id(p) not in self._adopted]

    def master_weights(self, i: int) -> Dict[str, torch.Tensor]:
        """Layer `i`'s fp32 master weights, as CPU tensors of their parameters' shapes (copies)."""
        raw = self.stream.master_weights(i)
        shapes = {s.name: s.shape for s in self.stream.layout(i).specs}
        return {n: torch.frombuffer(bytearray(b), dtype=torch.float32).view(shapes[n]) for n, b in raw.items()}

    @property
    def waited(self) -> Dict[str, float]:
        """Seconds the training loop waited on the fabric so far, by why: leases ("acquire": copies not done in
        time), the GPU ("retire": a layer's kernels before its pages are let go), hints ("hints": evictions a
        prefetch had to make first), and the CPU's optimizer steps ("host_steps")."""
        return dict(self.stream.waited)

    @property
    def host_busy(self) -> Dict[str, float]:
        """Seconds the CPU spent on the optimizer steps it takes so far, by part ("leases", "adamw",
        "compute_copy", "release"): with `waited["host_steps"]`, whether the CPU bounds a step."""
        return dict(self.stream.host_busy)

    def flush(self) -> None:
        """Waits for the layers' queued work and releases every lease (call before reading the fabric)."""
        self.stream.flush()

    def close(self) -> None:
        """Frees the layers' regions; the modules cannot run afterwards."""
        self.stream.close()
