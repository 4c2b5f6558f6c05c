"""The training loop's optimizer steps the streamed layers (`vfabric.torch`, `step="optimizer"`).

The loop's own optimizer holds the streamed parameters' placeholders beside the other parameters, in its
param groups. A hook before every optimizer's step (`torch.optim.optimizer.register_optimizer_step_pre_hook`)
finds the placeholders it holds whose gradient is in the fabric (`StreamedGrad`), asks their layers to step
with the group's hyperparameters of that moment (so schedulers, which set `lr` between steps, apply) and the
gradient's factor (clipping, unscaling), and takes the gradient away, so that the optimizer itself skips the
parameter. `GradScaler.step` calls the optimizer's step only when every gradient is finite, so a skipped step
skips the streamed layers too.

The stream's fast path is AdamW (and Adam, with L2 or decoupled weight decay): other optimizer classes holding
streamed parameters are refused at their first step, naming the class.
"""

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from vfabric._torch_grads import StreamedGrad
from vfabric.stream_layout import AdamW

_OWNERS: Dict[int, Tuple["weakref.ref[Any]", int, int]] = {}
"""id(placeholder) -> (its StreamedLayers, layer, parameter index)."""

_HOOKS: List[Any] = []
STEPS = [0]
"""Optimizer steps taken in this process, by any optimizer."""


def register(placeholder: torch.Tensor, owner: Any, i: int, j: int) -> None:
    """Makes `placeholder` stand for parameter `j` of layer `i` of `owner` at optimizer steps."""
    if not _HOOKS:
        _HOOKS.append(register_optimizer_step_pre_hook(_before_step))
        _HOOKS.append(register_optimizer_step_post_hook(_after_step))
    _OWNERS[id(placeholder)] = (weakref.ref(owner), i, j)


def unregister(placeholder: torch.Tensor) -> None:
    _OWNERS.pop(id(placeholder), None)


def owner_of(placeholder: torch.Tensor) -> Optional[Tuple[Any, int, int]]:
    """(StreamedLayers, layer, parameter) that `placeholder` stands for, or None."""
    entry = _OWNERS.get(id(placeholder))
    if entry is None:
        return None
    owner = entry[0]()
    return None if owner is None else (owner, entry[1], entry[2])


def hyperparameters(optimizer: torch.optim.Optimizer, group: Dict[str, Any]) -> AdamW:
    """The stream's AdamW for `group` of `optimizer` now; raises for an optimizer the stream cannot run."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise TypeError(f"vfabric steps streamed parameters with AdamW or Adam: {type(optimizer).__name__} holds some; "
                        "give it the other parameters only, or use torch.optim.AdamW")
    for flag in ("amsgrad", "capturable", "differentiable"):
        if group.get(flag):
            raise TypeError(f"vfabric's AdamW for streamed parameters has no {flag}=True: "
                            f"{type(optimizer).__name__} sets it")
    decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
    b1, b2 = group["betas"]
    return AdamW(lr=float(group["lr"]), betas=(float(b1), float(b2)), eps=float(group["eps"]),
                 weight_decay=float(group["weight_decay"]), decoupled=decoupled, maximize=bool(group.get("maximize")))


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    asked: Dict[Any, Dict[int, Tuple[List[Any], List[Any]]]] = {}
    for group in optimizer.param_groups:
        hyper = None
        for p in group["params"]:
            found = owner_of(p)
            if found is None or not isinstance(p.grad, StreamedGrad):
                continue
            owner, i, j = found
            if hyper is None:
                hyper = hyperparameters(optimizer, group)
            n = len(owner.stream.layout(i).specs)
            hypers, factors = asked.setdefault(owner, {}).setdefault(i, ([None] * n, [None] * n))
            hypers[j], factors[j] = hyper, p.grad.factor
            p.grad = None  # the optimizer skips it: the fabric steps it
    for owner, layers in asked.items():
        owner.step_layers(layers)


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    STEPS[0] += 1


def _streamed_entries(optimizer: torch.optim.Optimizer) -> List[Tuple[int, Any, int, str]]:
    """(index in the optimizer's state_dict, StreamedLayers, layer, parameter name) of each streamed parameter
    `optimizer` holds: the indices `Optimizer.state_dict` numbers its parameters by."""
    out, at, seen = [], 0, set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) in seen:
                continue
            seen.add(id(p))
            found = owner_of(p)
            if found is not None:
                owner, i, j = found
                out.append((at, owner, i, owner.stream.layout(i).specs[j].name))
            at += 1
    return out


def optimizer_state_dict(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """`optimizer.state_dict()` with the streamed parameters' AdamW state read from the fabric, in
    `torch.optim.AdamW`'s format (so an unstreamed model's AdamW loads it too)."""
    sd = optimizer.state_dict()
    cache: Dict[Tuple[int, int], Any] = {}
    for at, owner, i, name in _streamed_entries(optimizer):
        if (id(owner), i) not in cache:
            cache[(id(owner), i)] = owner.optimizer_state(i)
        st = cache[(id(owner), i)]
        if name in st:
            sd["state"][at] = st[name]
    return sd


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> None:
    """`optimizer.load_state_dict(state_dict)`, the streamed parameters' AdamW state written into the fabric."""
    state = dict(state_dict["state"])
    per: Dict[Tuple[int, int], Tuple[Any, Dict[str, Any]]] = {}
    for at, owner, i, name in _streamed_entries(optimizer):
        entry = per.setdefault((id(owner), i), (owner, {}))
        st = state.pop(at, None)
        if st is not None:
            entry[1][name] = st
    for (_, i), (owner, st) in per.items():
        owner.load_optimizer_state(i, st)
    optimizer.load_state_dict({**state_dict, "state": state})
