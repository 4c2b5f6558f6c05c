"""PyTorch on the fabric.

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
import re
from typing import Any, Dict, Optional, Union

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
