"""PyTorch on the fabric.

`offload()` takes a model as it is (a Hugging Face `transformers` model, or any `nn.Module` with repeated
blocks), streams its blocks through the GPU, and leaves the rest of the model and the training loop unchanged:
the loop's own optimizer, LR scheduler, gradient clipping and `zero_grad()` act on the streamed parameters too.

    model = AutoModelForCausalLM.from_config(config)
    model = vfabric.torch.offload(model, budget="20GiB")   # the one added line
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = transformers.get_scheduler("cosine", opt, num_warmup_steps=100, num_training_steps=10_000)
    for batch in data:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()                                          # the streamed blocks step here, through the fabric
        sched.step()
        opt.zero_grad()

`stream()` is the layer below: it puts the parameters, gradients and AdamW states of a model's layers in fabric regions and streams them
through the GPU: each layer's weights come to the GPU just before it runs (the next layers' already on their way),
its optimizer step runs on the GPU right after its backward, and its states go back to host memory while the next
layers compute. The model stays as it is; the training loop changes in a few lines:

    fabric = vfabric.Fabric("cluster.toml")              # its GPU budget bounds what the layers take
    layers = vfabric.torch.stream(model.blocks, fabric, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    opt = torch.optim.AdamW(layers.other_parameters(model), lr=3e-4, fused=True)  # embeddings, head
    for batch in data:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch)
        loss.backward()                                   # the streamed layers step here
        opt.step()
        opt.zero_grad()

With data parallelism (ranks started by `torchrun` or `mpirun`, `torch.distributed` initialised), each rank
streams its own copy of the layers, through the fabric its node's agent runs (`vfabric.connect()`), and the
gradients are averaged across ranks before every step, one all-reduce a layer, each under way while the next
layer's backward runs (as DDP overlaps its buckets' all-reduces with the backward pass):

    layers = vfabric.torch.stream(model.blocks, vfabric.connect(), data_parallel=True, lr=3e-4)
    ...
        loss.backward()                                   # the streamed layers' all-reduce and step run here
        vfabric.torch.average_gradients(layers.other_parameters(model))
        opt.step()

`use_as_allocator()` makes the fabric PyTorch's CUDA allocator for this process: an unchanged training loop then
allocates every CUDA tensor from the fabric's tensor pools (small tensors packed inside pages, large ones in
regions of their own), and `memory_stats()` reports them beside `torch.cuda.memory_stats()`. Call it before
anything allocates CUDA memory:

    import vfabric.torch
    vfabric.torch.use_as_allocator(budget="20GiB")
    ...                                  # the training loop, unchanged
    print(vfabric.torch.memory_stats())
"""

import json
import operator
import re
from typing import Any, Dict, Optional, Tuple, Union

from vfabric import _native

_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def _bytes(size: Union[int, str, None]) -> Optional[int]:
    if size is None or isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?i?B)?\s*", size, re.IGNORECASE)
    if not m or (m.group(2) or "").upper() not in _UNITS:
        raise ValueError(f"{size!r} is not a size: use bytes, or a number with KiB, MiB, GiB or TiB")
    return int(m.group(1)) * _UNITS[(m.group(2) or "").upper()]


def use_as_allocator(
    config: Optional[str] = None, budget: Union[int, str, None] = None, client: Optional[Any] = None
) -> None:
    """Makes the fabric PyTorch's CUDA allocator in this process (before any CUDA tensor exists).

    With `client` (from `vfabric.connect()`), the memory is the node's agent's: the ranks of a node then share
    the fabric its agent runs. Otherwise an embedded fabric starts in this process: `config` is a cluster
    configuration file (default: the built-in one), `budget` the memory of each GPU it takes (bytes, or "20GiB";
    default the configuration's). Raises `vfabric.ConfigError` when the fabric is not on CUDA or already serves
    as the allocator, and PyTorch's error when its allocator is already in use.
    """
    import torch

    if client is not None:
        kind = _native._torch_allocator_attach(client)
    else:
        kind = _native._torch_allocator_start(config, _bytes(budget))
    if kind != "cuda":
        raise _native.ConfigError(f"the fabric runs on the {kind} device: PyTorch's CUDA allocator needs CUDA")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_native.__file__, "vfabric_torch_malloc", "vfabric_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)


def memory_stats() -> Optional[Dict[str, Any]]:
    """The allocator's figures: per GPU its pool's (bytes allocated and reserved, their peaks, slabs, large
    regions, allocations), the blocks freed by PyTorch still waiting for their streams, failed allocations.
    None before `use_as_allocator()`."""
    return json.loads(_native._torch_allocator_stats())


def stream(
    layers: Any,
    fabric: Any = None,
    device: Optional[str] = None,
    lr: float = 1e-3,
    betas: Tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    compute_dtype: Any = None,
    lookahead: int = 2,
    host_layers: Union[int, str] = 0,
    host_chunk: int = 0,
    data_parallel: Any = None,
    step: str = "backward",
) -> Any:
    """Streams `layers` (an iterable of modules, e.g. a model's `nn.ModuleList` of blocks, run in order) through
    the GPU `device` of `fabric` (default: a new embedded fabric, and its first GPU), with AdamW (`lr`, `betas`,
    `eps`, `weight_decay`, as `torch.optim.AdamW`) run on each layer right after its backward. Each layer's
    parameters move into the fabric (their modules keep placeholders); its matrices compute in `compute_dtype`
    (default bfloat16), its vectors in float32. A layer's first argument is its input; only layer inputs are
    kept for the backward pass, which recomputes each layer. The last `host_layers` layers (those the backward
    pass reaches first) take their AdamW step on the CPU beside the GPU, their states kept in host memory: the
    GPU's link then carries a fifth of their bytes; `"auto"` starts with half of them and lets the stream choose
    from what each optimizer step measures (`vfabric.balance.HostShare`: fewer when the loop waits for the CPU,
    more while the CPU has time to spare); `host_chunk` (parameters) has the CPU write their compute
    copy a chunk at a time right after AdamW, while the chunk is in its caches (0: after the whole layer).
    `data_parallel`, a `torch.distributed` process group (or `True` for the default one), averages each layer's
    gradients of a step across the group's ranks (one all-reduce of the layer's float32 gradients, after its
    micro-batches are summed, under way while the next layer's backward runs) before its AdamW step, so that
    every rank takes the same step; the parameters that are not streamed are the caller's to average
    (`average_gradients`). Every rank must give the same `host_layers`, a number (`"auto"` would let each rank
    choose its own share). Returns the `StreamedLayers`: set `accumulating` for the micro-batches of a step but
    the last, and give `other_parameters(model)` to your own optimizer.

    `step="optimizer"` moves the layers' steps to the training loop's optimizer instead, as `offload()` does
    (`lr` and the rest then come from its param groups, clipping and loss scaling apply): give the optimizer
    the model's parameters, streamed ones included."""
    import torch

    import vfabric
    from vfabric._torch_stream import StreamedLayers

    if host_layers == "auto" and data_parallel not in (None, False):
        # Each rank would choose from its own timings, and the CPU's AdamW and the GPU's do not round alike.
        raise ValueError("host_layers=\"auto\" cannot go with data_parallel: give host_layers a number")
    streamed = StreamedLayers(
        fabric if fabric is not None else vfabric.Fabric(),
        device,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        compute_dtype=compute_dtype if compute_dtype is not None else torch.bfloat16,
        lookahead=lookahead,
        host_chunk=host_chunk,
        grad_reduce=None if data_parallel is None or data_parallel is False else _mean_over(data_parallel),
        step=step,
    )
    layers = list(layers)
    auto = host_layers == "auto"
    try:
        share = len(layers) // 2 if auto else operator.index(host_layers)  # ints, NumPy's among them
    except TypeError:
        share = -1
    if isinstance(host_layers, bool) or not 0 <= share <= len(layers):
        raise ValueError(f"host_layers must be \"auto\" or between 0 and the {len(layers)} layers, not {host_layers!r}")
    for i, layer in enumerate(layers):
        streamed.adopt(layer, on_host=i >= len(layers) - share)
    if auto:
        streamed.stream.balance_host_layers()
    return streamed


def offload(
    model: Any,
    budget: Union[int, str, None] = None,
    *,
    fabric: Any = None,
    blocks: Any = None,
    device: Any = None,
    step: str = "optimizer",
    host_layers: int = 0,
    lookahead: int = 2,
    compute_dtype: Any = None,
    storage: Optional[str] = None,
) -> Any:
    """Streams `model`'s repeated blocks through the GPU and moves the rest of it there; returns the model, whose
    forward, `parameters()`, `state_dict()` and `load_state_dict()` work as before.

    The blocks: by default a Hugging Face model's decoder layers (the `nn.ModuleList` of its `_no_split_modules`
    class), else the `nn.ModuleList` of modules of one class holding the most parameters; or `blocks`: the
    modules, a class, or a policy `module -> bool` (as FSDP's `auto_wrap_policy`). They must run in order, each
    computing the same from the same inputs (each is recomputed in the backward pass, as under gradient
    checkpointing; a layer that changes its buffers while training is refused). Each takes its arguments as the
    model passes them; parameters it shares with the rest of the model (tied weights) stay with the rest.

    The fabric: `budget` is the GPU memory (bytes or "20GiB") the blocks' weights and optimizer states take at
    once (default: a quarter of the GPU); host memory holds them all, sized from the model (and, with `storage`
    naming a file on a fast drive, a storage tier below it). When the machine cannot hold them, `vfabric.OutOfMemory`
    says what they need and what there is, before anything moves. Or give a `fabric` of your own: it is checked.

    The optimizer: give the training loop's optimizer `model.parameters()` (param groups as you like: AdamW, or
    Adam). At its `step()` the streamed parameters step through the fabric with their group's hyperparameters of
    that moment (LR schedules apply), after `clip_grad_norm_` and `GradScaler` have seen their gradients;
    frozen parameters (`requires_grad=False`) are streamed read-only. `step="backward"` steps each block inside
    the backward pass instead (faster, but no clipping, scaler or accumulation without `no_sync()`; the
    optimizer's hyperparameters are then `stream()`'s defaults). `host_layers`: the last blocks take their
    AdamW step on the CPU. `vfabric.torch.streamed(model)` is the `StreamedLayers` underneath."""
    from vfabric._torch_offload import offload as _offload

    return _offload(model, budget, fabric=fabric, blocks=blocks, device=device, step=step, host_layers=host_layers,
                    lookahead=lookahead, compute_dtype=compute_dtype, storage=storage)


def streamed(model: Any) -> Any:
    """The `StreamedLayers` that `offload(model)` streams the model's blocks with."""
    from vfabric._torch_offload import streamed as _streamed

    return _streamed(model)


def optimizer_state_dict(optimizer: Any) -> Dict[str, Any]:
    """`optimizer.state_dict()` with the streamed parameters' AdamW state read from the fabric, in
    `torch.optim.AdamW`'s format: save it beside `model.state_dict()` to resume."""
    from vfabric._torch_optim import optimizer_state_dict as _sd

    return _sd(optimizer)


def load_optimizer_state_dict(optimizer: Any, state_dict: Dict[str, Any]) -> None:
    """`optimizer.load_state_dict(state_dict)`, the streamed parameters' AdamW state written into the fabric."""
    from vfabric._torch_optim import load_optimizer_state_dict as _load

    _load(optimizer, state_dict)


def _group(group: Any) -> Any:
    """The process group `group` names: `None` or `True` is the default one, which must be initialised."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("data parallelism needs torch.distributed initialised (init_process_group) first")
    return None if group is None or group is True else group


class _Mean:
    """An average across ranks under way (a `vfabric.streaming.Reduction`): the all-reduce's sum, then the
    division by the ranks once it is done."""

    def __init__(self, work: Any, t: Any, ranks: int):
        self.work, self.t, self.ranks = work, t, ranks

    def wait(self) -> None:
        # NCCL: the current CUDA stream waits for the collective, the host does not; gloo: the host waits.
        self.work.wait()
        self.t.div_(self.ranks)


def _mean_over(group: Any) -> Any:
    """The all-reduce that averages a tensor in place across `group`'s ranks, launched now and finished by the
    `wait()` of what it returns (the stream calls it after launching the next layer's)."""
    import torch.distributed as dist

    group = _group(group)
    ranks = dist.get_world_size(group)

    def mean(t: Any) -> _Mean:
        # A sum, then a division: ReduceOp.AVG is NCCL's only, and the ranks of the emulated device use gloo.
        return _Mean(dist.all_reduce(t, group=group, async_op=True), t, ranks)

    return mean


def average_gradients(parameters: Any, group: Any = None) -> None:
    """Averages the gradients of `parameters` across the ranks of `group` (default: the default process group),
    in place: one all-reduce per device and dtype, over the gradients laid end to end. A parameter with no
    gradient on a rank counts as zeros there (and gets the average), one with none on any rank keeps none (the
    ranks first agree on which have one). For the parameters a data-parallel loop does not stream
    (`StreamedLayers.other_parameters`), before its own optimizer's step. Every rank must call it with the same
    parameters, in the same order."""
    import torch
    import torch.distributed as dist

    group = _group(group)
    ranks = dist.get_world_size(group)
    parameters = list(parameters)
    if not parameters:
        return
    # Which parameters have a gradient on some rank: without the same list everywhere the all-reduces would not
    # match (a hang, or sums of unrelated bytes).
    device = parameters[0].device
    has = torch.tensor([p.grad is not None for p in parameters], dtype=torch.int32, device=device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX, group=group)
    buckets: Dict[Tuple[Any, Any], list] = {}
    for p, some in zip(parameters, has.tolist()):
        if not some:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        buckets.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
    for grads in buckets.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat.div_(ranks)
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()
