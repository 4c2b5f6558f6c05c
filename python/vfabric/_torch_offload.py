"""`vfabric.torch.offload`: a whole model on the fabric, its repeated blocks streamed, the rest and the training
loop left as they are. Finds the blocks, sizes a fabric for them (or checks the one given), streams them, moves
the rest of the model to the GPU, and makes the model's `state_dict()` and `load_state_dict()` read and write
the streamed parameters' values in the fabric."""

import os
import tempfile
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from vfabric._torch_stream import StreamedLayers, fabric_device, layer_specs
from vfabric.stream_layout import LayerLayout

_STREAMED: "weakref.WeakKeyDictionary[nn.Module, StreamedLayers]" = weakref.WeakKeyDictionary()

PAGE = 2 << 20
"""The page size of the fabric `offload` makes."""

Policy = Union[None, nn.ModuleList, Sequence[nn.Module], type, Tuple[type, ...], Callable[[nn.Module], bool]]


def streamed(model: nn.Module) -> StreamedLayers:
    """The `StreamedLayers` that `offload(model)` made."""
    try:
        return _STREAMED[model]
    except KeyError:
        raise ValueError(f"{type(model).__name__} was not given to vfabric.torch.offload") from None


def find_blocks(model: nn.Module, blocks: Policy = None) -> List[nn.Module]:
    """The modules of `model` to stream, in the order they run: `blocks` itself (a `ModuleList` or a list of
    modules), the outermost modules of a class or classes, or those a policy (`module -> bool`, as FSDP's
    `auto_wrap_policy`) picks; by default the `nn.ModuleList` of a Hugging Face model's `_no_split_modules`
    class (its decoder layers), else the `nn.ModuleList` of modules of one class holding the most parameters."""
    if isinstance(blocks, (nn.ModuleList, list, tuple)) and all(isinstance(b, nn.Module) for b in blocks):
        found = list(blocks)
    elif isinstance(blocks, type) or (isinstance(blocks, tuple) and all(isinstance(b, type) for b in blocks)):
        found = _outermost(model, lambda m: isinstance(m, blocks))
    elif callable(blocks):
        found = _outermost(model, blocks)
    elif blocks is None:
        found = _repeated(model)
    else:
        raise TypeError(f"blocks must be modules, a class, or a policy (module -> bool), not {type(blocks).__name__}")
    if not found:
        raise ValueError(f"found no blocks to stream in {type(model).__name__}: name them (offload(model, blocks=...))")
    return found


def _outermost(model: nn.Module, pick: Callable[[nn.Module], bool]) -> List[nn.Module]:
    out: List[nn.Module] = []

    def walk(m: nn.Module) -> None:
        for child in m.children():
            if pick(child):
                out.append(child)
            else:
                walk(child)

    walk(model)
    return out


def _repeated(model: nn.Module) -> List[nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    best: List[nn.Module] = []
    best_size = -1
    for m in model.modules():
        if not isinstance(m, nn.ModuleList) or len(m) < 2:
            continue
        kinds = {type(c) for c in m}
        if len(kinds) != 1 or (names and next(iter(kinds)).__name__ not in names):
            continue
        size = sum(p.numel() for p in m.parameters())
        if size > best_size:
            best, best_size = list(m), size
    return best


def host_bytes(blocks: Sequence[nn.Module], compute_dtype: torch.dtype, page: int, sums: bool,
               keep: Sequence[nn.Parameter] = ()) -> int:
    """Bytes of fabric memory the blocks take (compute copies, optimizer states, gradient sums with `sums`)."""
    total = 0
    for b in blocks:
        specs, _, _ = layer_specs(b, compute_dtype, keep)
        lay = LayerLayout(specs, page)
        total += lay.compute_bytes + lay.state_bytes + (lay.grad_bytes if sums else 0)
    return total


def _available() -> int:
    """Host memory this machine can give (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _make_fabric(need: int, budget: Optional[int], device: Optional[str], storage: Optional[str]) -> Any:
    """An embedded fabric whose host memory (and storage tier, with `storage`) holds `need` bytes."""
    import vfabric

    cuda = torch.cuda.is_available()
    if budget is None:
        budget = (torch.cuda.get_device_properties(int((device or "gpu0")[3:])).total_memory // 4 if cuda
                  else 256 << 20)
    budget = max(PAGE * 8, budget // PAGE * PAGE)
    host = -(-(need + need // 32 + (256 << 20)) // PAGE) * PAGE
    available = _available() - (0 if cuda else budget)
    lines = []
    if storage is None:
        if host > available:
            raise vfabric.OutOfMemory(
                f"the streamed layers need {_gib(host)} of host memory and this machine has {_gib(available)} "
                "available: give offload() a storage tier (storage=\"/nvme/vfabric.tier\"), stream fewer blocks, or "
                "freeze more parameters")
    else:
        tier = host
        host = max(PAGE * 64, min(host, available // 2) // PAGE * PAGE)
        lines = ["[storage]", f'path = "{storage}"', f'size = "{-(-tier // (1 << 20))}MiB"']
    path = os.path.join(tempfile.mkdtemp(prefix="vfabric-offload-"), "offload.toml")
    with open(path, "w") as f:
        f.write("\n".join([
            "[cluster]", 'name = "offload"', "[device]", 'backend = "auto"', "emulated_gpus = 1",
            f'emulated_gpu_memory = "{budget >> 20}MiB"', "[memory]", f'page_size = "{PAGE >> 20}MiB"',
            f'gpu_budget = "{budget >> 20}MiB"', f'host_arena = "{host >> 20}MiB"', "headroom_percent = 2",
            'readahead = "0"', "high_watermark_percent = 100", "low_watermark_percent = 100", *lines,
            "[[node]]", 'name = "local"', ""]))
    return vfabric.Fabric(path)


def _check_capacity(fabric: Any, need: int) -> None:
    """Refuses, before anything moves, a fabric whose host memory and storage tier cannot hold `need` bytes."""
    import vfabric

    stats = fabric.stats()
    free = 0
    for d in stats["directory"]["devices"]:
        if d["location"] == "Host":
            free += (d["frames"] - d["used"]) * fabric.page_size
    tier = stats.get("storage") or {}
    if isinstance(tier, dict) and "frames" in tier and "used" in tier:
        free += (tier["frames"] - tier["used"]) * fabric.page_size
    if need > free:
        raise vfabric.OutOfMemory(f"the streamed layers need {_gib(need)} of the fabric's host memory and storage, "
                                  f"and it has {_gib(free)} free: give it a larger host_arena or a [storage] tier")


def _shared_outside(model: nn.Module, blocks: Sequence[nn.Module]) -> List[nn.Parameter]:
    """Parameters of the blocks that modules outside them hold too (tied weights): they are not streamed."""
    inside = {id(m) for b in blocks for m in b.modules()}
    outside = {id(p) for m in model.modules() if id(m) not in inside for p in m.parameters(recurse=False)}
    return [p for b in blocks for p in b.parameters() if id(p) in outside]


def offload(model: nn.Module, budget: Union[int, str, None] = None, *, fabric: Any = None, blocks: Policy = None,
            device: Any = None, step: str = "optimizer", host_layers: int = 0, lookahead: int = 2,
            compute_dtype: Optional[torch.dtype] = None, storage: Optional[str] = None) -> nn.Module:
    """See `vfabric.torch.offload`."""
    from vfabric.torch import _bytes

    compute_dtype = compute_dtype if compute_dtype is not None else torch.bfloat16
    if model in _STREAMED:
        raise ValueError(f"{type(model).__name__} is offloaded already")
    found = find_blocks(model, blocks)
    keep = _shared_outside(model, found)
    dev = fabric_device(device)
    if not 0 <= host_layers <= len(found):
        raise ValueError(f"host_layers must be between 0 and the {len(found)} blocks, not {host_layers}")
    need = host_bytes(found, compute_dtype, fabric.page_size if fabric is not None else PAGE,
                      sums=step == "optimizer" or host_layers > 0, keep=keep)
    if fabric is None:
        fabric = _make_fabric(need, _bytes(budget), dev, storage)
    else:
        _check_capacity(fabric, need)
    layers = StreamedLayers(fabric, dev, compute_dtype=compute_dtype, lookahead=lookahead, step=step)
    for i, b in enumerate(found):
        layers.adopt(b, on_host=i >= len(found) - host_layers, keep=keep)
        _state_dict_hooks(layers, i, b)
        if layers.device.type == "cuda":
            torch.cuda.empty_cache()
    model.to(layers.device)  # the placeholders are there already: the rest of the model follows
    _STREAMED[model] = layers
    return model


def _state_dict_hooks(layers: StreamedLayers, i: int, block: nn.Module) -> None:
    """The block's `state_dict()` gives its streamed parameters' values (read from the fabric, as CPU tensors of
    the parameters' dtypes) and `load_state_dict()` writes them there."""
    specs = layers.stream.layout(i).specs
    holders = layers.placeholders[i]

    def save(module: nn.Module, state: Dict[str, Any], prefix: str, meta: Any) -> None:
        values = layers.values(i)
        for j, spec in enumerate(specs):
            t = values[spec.name].to(holders[j].dtype)
            for name in [spec.name, *layers.aliases[i].get(spec.name, ())]:
                if prefix + name in state:
                    state[prefix + name] = t

    def load(module: nn.Module, state: Dict[str, Any], prefix: str, *rest: Any) -> None:
        given = {spec.name: state[prefix + spec.name] for spec in specs if prefix + spec.name in state}
        if given:
            layers.load_values(i, given)
        for j, spec in enumerate(specs):
            for name in [spec.name, *layers.aliases[i].get(spec.name, ())]:
                if prefix + name in state:
                    state[prefix + name] = holders[j]  # copied onto itself: nothing to do

    block._register_state_dict_hook(save)
    block._register_load_state_dict_pre_hook(load, with_module=True)
