"""`vfabric.torch.StreamedLayers`: a model's layers streamed through the GPU by the fabric (PyTorch side of
`vfabric.streaming`). Imported by `vfabric.torch` on first use, so that `vfabric.torch` imports without torch."""

import contextlib
import functools
import math
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from vfabric import _torch_optim
from vfabric._torch_call import CACHE_KWARGS, Call, StreamedCall, _swapped
from vfabric._torch_grads import StreamedGrad
from vfabric.streaming import AdamW, LayerStream, ParamSpec, Reduction

__all__ = ["StreamedLayers", "TorchOps", "_swapped", "fabric_device"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "uint8": torch.uint8}
_NAMES = {v: k for k, v in _DTYPES.items()}


def fabric_device(device: Any) -> Optional[str]:
    """The fabric's name of a device: "gpu0" for "gpu0", "cuda:0", "cuda" or torch.device("cuda", 0); None
    for None."""
    if device is None:
        return None
    if isinstance(device, str) and (device.startswith("gpu") or device == "host"):
        return device
    d = torch.device(device)
    if d.type == "cuda":
        return f"gpu{d.index or 0}"
    if d.type == "cpu":
        return "host"
    raise ValueError(f"{device!r} is not a device the fabric streams through (a GPU: \"cuda:0\" or \"gpu0\")")


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

    def adamw(self, ps, gs, ms, vs, steps, opt: AdamW) -> None:
        dev = ps[0].device
        st = [torch.full((), float(k), dtype=torch.float32, device=dev) for k in steps]
        fused = torch._fused_adamw_ if opt.decoupled else torch._fused_adam_
        fused(list(ps), list(gs), list(ms), list(vs), [], st, lr=float(opt.lr), beta1=opt.betas[0], beta2=opt.betas[1],
              weight_decay=opt.weight_decay, eps=opt.eps, amsgrad=False, maximize=opt.maximize)

    def scale(self, dst: torch.Tensor, factor: Any) -> None:
        if isinstance(factor, torch.Tensor):
            factor = factor.to(dst.device) if factor.device != dst.device else factor
        dst.mul_(factor)

    def zero(self, dst: torch.Tensor) -> None:
        dst.zero_()

    def norms(self, arrays):
        arrays = list(arrays)
        return list(torch._foreach_norm(arrays, 2)), list(torch._foreach_norm(arrays, float("inf")))

    def event(self):
        return _CudaEvent() if self.cuda else _Done()


def layer_specs(module: nn.Module, compute_dtype: torch.dtype, keep: Sequence[nn.Parameter] = ()
                ) -> Tuple[List[ParamSpec], Dict[int, List[str]], Dict[int, nn.Parameter]]:
    """How `module`'s parameters (those not in `keep`) are streamed: their specs, each one's names in the module
    (a parameter shared inside it has several) and the parameters, by id. Raises for a module without one."""
    kept = {id(p) for p in keep}
    names: Dict[int, List[str]] = {}
    params: Dict[int, nn.Parameter] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in kept:
            names.setdefault(id(p), []).append(n)
            params[id(p)] = p
    if not params:
        raise ValueError(f"a streamed layer needs parameters: {type(module).__name__} has none to stream")
    specs = []
    for key, p in params.items():
        name = names[key][0]
        if p.requires_grad:
            dtype = _NAMES[compute_dtype] if p.dim() >= 2 else "float32"
        elif p.dtype in (torch.float32, torch.bfloat16, torch.float16):
            dtype = _NAMES[p.dtype]
        else:
            raise ValueError(f"{type(module).__name__}.{name}: a frozen parameter of {p.dtype} cannot be streamed")
        specs.append(ParamSpec(name, tuple(p.shape), dtype, trainable=p.requires_grad))
    return specs, names, params


class StreamedLayers:
    """Layers of a model whose parameters, gradients and AdamW states live in the fabric and stream through the
    GPU (see `vfabric.torch.stream`)."""

    def __init__(
        self,
        fabric: Any,
        device: Any = None,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        compute_dtype: torch.dtype = torch.bfloat16,
        lookahead: int = 2,
        host_chunk: int = 0,
        grad_reduce: Optional[Callable[[torch.Tensor], Optional[Reduction]]] = None,
        step: str = "backward",
    ):
        if compute_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"compute_dtype must be torch.bfloat16, torch.float16 or torch.float32, not {compute_dtype}")
        device = fabric_device(device) or next((d for d in fabric.devices if d.startswith("gpu")), "host")
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
            host_ops=TorchOps(torch.device("cpu")), host_chunk=host_chunk, grad_reduce=grad_reduce, step_at=step,
        )
        self.modules: List[nn.Module] = []
        self.forwards: List[Callable[..., Any]] = []
        self.placeholders: List[List[nn.Parameter]] = []
        """Per layer, per parameter (in the stream's order): what the module holds in its place."""
        self.aliases: List[Dict[str, List[str]]] = []
        self._adopted: set = set()
        self._anchor = torch.zeros((), requires_grad=True)
        self._warned_cache = False

    @property
    def accumulating(self) -> bool:
        """`step="backward"`: whether backward passes only add the layers' gradients up (set it for every
        micro-batch of a step but the last; the last one's backward runs the layers' optimizer step)."""
        return self.stream.accumulating

    @accumulating.setter
    def accumulating(self, value: bool) -> None:
        self.stream.accumulating = bool(value)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only add the gradients up, as DDP's `no_sync()`: with `step="backward"`, for
        every micro-batch of a step but the last. (With `step="optimizer"` gradients add up until the
        optimizer's step anyway: the block changes nothing.)"""
        before = self.stream.accumulating
        self.stream.accumulating = self.stream.step_at == "backward"
        try:
            yield
        finally:
            self.stream.accumulating = before

    def adopt(self, module: nn.Module, on_host: bool = False, keep: Sequence[nn.Parameter] = ()) -> nn.Module:
        """Moves a layer's parameters into the fabric (for a trainable one fp32 master weights, zero moments, and a
        compute copy in `compute_dtype` for matrices, fp32 for vectors; a frozen one, `requires_grad=False`, only
        its values, in its own dtype) and makes its forward a streamed one. With `on_host`, its AdamW step runs on
        the CPU, beside the GPU, and its states stay in host memory. Parameters in `keep` (shared with modules
        outside the streamed layers) stay where they are, and get their gradients as any other. Each streamed
        parameter leaves a placeholder of its shape in the module that holds no elements (for optimizers, which
        step it through the fabric). Returns the module."""
        specs, names, params = layer_specs(module, self.compute_dtype, keep)
        if any(id(p) in self._adopted or _torch_optim.owner_of(p) is not None for p in params.values()):
            raise ValueError(f"{type(module).__name__}: a parameter of it is streamed already (in another layer: "
                             "layers that share parameters cannot be streamed apart)")
        values = {names[k][0]: p.detach() for k, p in params.items()}
        i = self.stream.add_layer(specs, lambda name: values[name].reshape(-1), on_host=on_host)
        del values
        holders = []
        for j, (key, p) in enumerate(params.items()):
            placeholder = nn.Parameter(torch.empty(1, dtype=p.dtype, device=self.device).expand(p.shape),
                                       requires_grad=p.requires_grad)
            for name in names[key]:
                owner, _, leaf = name.rpartition(".")
                m = module.get_submodule(owner) if owner else module
                m._parameters[leaf] = placeholder
            self._adopted.add(id(placeholder))
            _torch_optim.register(placeholder, self, i, j)
            holders.append(placeholder)
        self.placeholders.append(holders)
        self.aliases.append({names[k][0]: names[k][1:] for k in params if len(names[k]) > 1})
        self.modules.append(module)
        self.forwards.append(module.forward)
        if getattr(module, "gradient_checkpointing", False):
            module.gradient_checkpointing = False  # the stream recomputes each layer already
        module.forward = functools.partial(self._forward, i)  # type: ignore[method-assign]
        return module

    def param_name(self, i: int, j: int) -> str:
        """Parameter `j` of layer `i`, for messages."""
        return f"layer {i} ({type(self.modules[i]).__name__}) {self.stream.layout(i).specs[j].name}"

    def _forward(self, i: int, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.run_forward(i, args, kwargs)  # no backward pass: the layer runs once, as it is
        dropped = [name for name in CACHE_KWARGS if kwargs.get(name) is not None]
        dropped += [f"argument {k}" for k, a in enumerate(args) if _is_cache(a)]
        if dropped:
            kwargs = {k: (None if k in CACHE_KWARGS else v) for k, v in kwargs.items()}
            args = tuple(None if _is_cache(a) else a for a in args)
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            if not self._warned_cache:
                self._warned_cache = True
                warnings.warn(f"vfabric: a streamed layer is recomputed in the backward pass: its cache is off while "
                              f"gradients are recorded ({dropped[0]} = None, as gradient checkpointing does)")
        if self.stream.step_at == "optimizer" and i == 0:
            self._check_stepped()
        call = Call(args, kwargs)
        outs = StreamedCall.apply(self, i, call, self._anchor, *call.tensors)
        return call.output(outs)

    def _check_stepped(self) -> None:
        """An optimizer stepped while streamed gradients were in the fabric, but none took them: the loop's
        optimizer holds only some of the parameters (silently, the others would never train)."""
        late = [(i, j) for i, holders in enumerate(self.placeholders) for j, p in enumerate(holders)
                if isinstance(p.grad, StreamedGrad) and p.grad.born < _torch_optim.STEPS[0]]
        if late:
            raise RuntimeError(f"vfabric: an optimizer stepped, but none holds the streamed parameter "
                               f"{self.param_name(*late[0])} (and {len(late) - 1} more): give the optimizer "
                               "model.parameters() (the streamed ones are stepped through the fabric)")

    def run_forward(self, i: int, args: Tuple[Any, ...], kwargs: Dict[str, Any], recomputed: bool = False) -> Any:
        """Layer `i`'s forward with its weights leased, no graph; `recomputed`: the backward pass runs it again,
        so it may not change its buffers."""
        s, module = self.stream, self.modules[i]
        w = s.forward_weights(i)
        versions = [(n, b._version) for n, b in module.named_buffers()] if recomputed else []
        try:
            with torch.no_grad(), _swapped(module, w, self.aliases[i]):
                out = self.forwards[i](*args, **kwargs)
        finally:
            del w
            s.forward_done(i)
        changed = [n for (n, v), (_, b) in zip(versions, module.named_buffers()) if b._version != v]
        if changed and module.training:
            raise RuntimeError(f"streamed layer {i} ({type(module).__name__}) changes its buffer {changed[0]!r} in "
                               "its forward pass: the backward pass's recompute would change it again (a layer with "
                               "running statistics cannot be streamed while training)")
        return out

    def run_backward(self, i: int, args: Tuple[Any, ...], kwargs: Dict[str, Any], through: Callable[[Any], None]) -> Any:
        """Layer `i`'s recompute with its weights leased again, `through(output)` (the gradients through it),
        and its parameters' gradients handed to the stream."""
        s = self.stream
        specs = s.layout(i).specs
        w = s.backward_weights(i)
        leaves = {spec.name: w[spec.name].detach().requires_grad_(spec.trainable) for spec in specs}
        del w
        with _swapped(self.modules[i], leaves, self.aliases[i]):
            out = self.forwards[i](*args, **kwargs)
            through(out)
        grads = {spec.name: leaves[spec.name].grad for spec in specs if spec.trainable}
        del leaves
        holders = self.placeholders[i]
        if s.step_at == "optimizer":
            s.backward_done(i, grads, fresh=[h.grad is None for h in holders])
            for j, spec in enumerate(specs):
                if spec.trainable and grads.get(spec.name) is not None and holders[j].grad is None:
                    g = StreamedGrad(self, i, j, holders[j])
                    g.born = _torch_optim.STEPS[0]
                    holders[j].grad = g
        else:
            s.backward_done(i, grads)
        return out

    def step_layers(self, layers: Dict[int, Tuple[List[Any], List[Any]]]) -> None:
        """The optimizer's step of the streamed parameters it holds (`vfabric._torch_optim`): per layer, each
        parameter's hyperparameters (None: not its optimizer's) and gradient factor."""
        for i in sorted(layers):
            hypers, factors = layers[i]
            self.stream.request_step(i, hypers, factors)

    def zeroed(self, i: int) -> None:
        """The loop zeroed layer `i`'s gradients in place (`zero_grad(set_to_none=False)`)."""
        self.stream.discard_grads(i)
        for h in self.placeholders[i]:
            h.grad = None

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
        return {n: _tensor(b, torch.float32, shapes[n]) for n, b in raw.items()}

    def values(self, i: int) -> Dict[str, torch.Tensor]:
        """Layer `i`'s parameters' values, as CPU tensors of their shapes: fp32 master weights for trainable
        ones, their own dtype for frozen ones (copies; a step asked for runs first)."""
        out = {}
        lay = self.stream.layout(i)
        states = self.stream.read_states(i)
        frozen = self.stream.read_frozen(i)
        for spec in lay.specs:
            if spec.trainable:
                out[spec.name] = _tensor(states[spec.name]["master"], torch.float32, spec.shape)
            else:
                out[spec.name] = _tensor(frozen[spec.name], _DTYPES[spec.dtype], spec.shape)
        return out

    def load_values(self, i: int, values: Dict[str, torch.Tensor]) -> None:
        """Sets layer `i`'s parameters named in `values` (tensors of their shapes, any float dtype): a trainable
        one's master weights and compute copy (its moments stay), a frozen one's values."""
        lay = self.stream.layout(i)
        shapes = {spec.name: spec for spec in lay.specs}
        for name, t in values.items():
            if name not in shapes or tuple(t.shape) != shapes[name].shape:
                want = shapes[name].shape if name in shapes else "no such parameter"
                raise ValueError(f"layer {i}: {name} of shape {tuple(t.shape)} ({want} expected)")
        trainable = {n: t for n, t in values.items() if shapes[n].trainable}
        if trainable:
            states = self.stream.read_states(i)
            for n, t in trainable.items():
                states[n]["master"] = _raw(t, torch.float32)
            self.stream.write_states(i, states)
        frozen = {n: _raw(t, _DTYPES[shapes[n].dtype]) for n, t in values.items() if not shapes[n].trainable}
        if frozen:
            self.stream.write_frozen(i, frozen)

    def optimizer_state(self, i: int) -> Dict[str, Dict[str, torch.Tensor]]:
        """Layer `i`'s AdamW state per trainable parameter, as `torch.optim.AdamW` keeps it (`step`, `exp_avg`,
        `exp_avg_sq`; CPU tensors), for parameters that have stepped."""
        lay = self.stream.layout(i)
        states = self.stream.read_states(i)
        out = {}
        for spec in lay.specs:
            st = states.get(spec.name)
            if st is not None and st["step"] > 0:
                out[spec.name] = {
                    "step": torch.tensor(float(st["step"])),
                    "exp_avg": _tensor(st["exp_avg"], torch.float32, spec.shape),
                    "exp_avg_sq": _tensor(st["exp_avg_sq"], torch.float32, spec.shape),
                }
        return out

    def load_optimizer_state(self, i: int, state: Dict[str, Dict[str, torch.Tensor]]) -> None:
        """Sets layer `i`'s AdamW state (as `optimizer_state` gives it; a trainable parameter not in it starts
        afresh: zero moments, step 0)."""
        lay = self.stream.layout(i)
        states = self.stream.read_states(i)
        for spec in lay.specs:
            if not spec.trainable:
                continue
            st = state.get(spec.name)
            zeros = bytes(4 * spec.numel)
            states[spec.name]["exp_avg"] = _raw(st["exp_avg"], torch.float32) if st else zeros
            states[spec.name]["exp_avg_sq"] = _raw(st["exp_avg_sq"], torch.float32) if st else zeros
            states[spec.name]["step"] = int(float(st["step"])) if st else 0
        self.stream.write_states(i, states)

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
        for holders in self.placeholders:
            for h in holders:
                _torch_optim.unregister(h)


def _tensor(raw: bytes, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor of `raw` bytes (a copy)."""
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).view(shape)


def _raw(t: torch.Tensor, dtype: torch.dtype) -> bytes:
    """A tensor's values in `dtype`, as bytes."""
    return t.detach().to("cpu", dtype).contiguous().view(torch.uint8).numpy().tobytes()


def _is_cache(x: Any) -> bool:
    """Whether `x` is a key/value cache (a Hugging Face `Cache`: updated by every call, so not replayable)."""
    return any(c.__name__ == "Cache" for c in type(x).__mro__) and hasattr(x, "update")
