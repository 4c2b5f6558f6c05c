"""Layers streamed through one device: each layer's state lives in fabric regions, and comes to the device
just before the layer runs and leaves after, while the next layers' pages are already on their way.

This module is the schedule, written once for any array library: `vfabric.torch` runs it on PyTorch tensors
(CUDA), and the tests run it on NumPy arrays (the emulated device, where a GPU's memory is host memory). What
an array library must provide is `Ops` (`vfabric.stream_layout`, which also says where each byte sits).

Per layer, regions leased in page-aligned parts, each needing a run of frames of its own on the device:

- the **compute copy** (`weights`): every parameter in the dtype the layer computes in (bf16 for matrices,
  fp32 for vectors by default). High priority: the fabric evicts it last, so as many layers as the device's
  budget allows stay there between steps.
- the **optimizer states** (`states`): fp32 master weights, Adam's first and second moments, in pieces of at
  most 96 MiB. Low priority: they come for the layer's optimizer step and go.
- the **gradient sums** (`grads`, fp32, same pieces), only while gradients add up over micro-batches or wait
  for a step on the CPU.

A forward pass leases each layer's compute copy for reading and prefetches the next `lookahead` layers'. A
backward pass (which recomputes the layer's forward from its input: only layer inputs are kept) leases the
compute copy for writing and prefetches the previous layers'. Once the layer's gradients exist, the stream
leases its states (prefetched meanwhile), queues its AdamW step on the device (gradients never leave it) and
the new compute copy, and once the previous layer's work is done asks the fabric to write that layer's regions
back to host memory while the next layers compute: evicting them later is then a drop, not a copy.

With gradient accumulation (`accumulating = True` for every micro-batch of a step but the last), each layer's
gradients add up in its gradient sums instead, and the step runs in the last micro-batch's backward.

That is the schedule `step_at="backward"`. It cannot clip by the global norm of all gradients, skip a step
whose loss scale overflowed, or take hyperparameters set after the backward pass: each layer has moved before
the last gradient exists. With `step_at="optimizer"` every backward pass adds each layer's gradients to its
gradient sums (which go to host memory), with each parameter's norms beside them, and nothing steps until
the caller asks (`request_step`, from the training loop's optimizer step, with each parameter's
hyperparameters and gradient factor of that moment). A layer stepped on the device then takes its step just
before its next forward pass, its states prefetched with its weights; one stepped on the CPU takes it at once,
on the worker, while the forward pass runs the layers before it.

A layer may take its optimizer step on the CPU instead (`add_layer(..., on_host=True)`): its states never leave
host memory; its backward writes its gradient sums, which go to host memory, and a worker thread runs AdamW
there over host leases and writes the new compute copy there (the fabric's coherence drops the device's old
copy). The device's link then carries 6 bytes a parameter for such a layer instead of 28, and the CPU works
beside the device: giving it the layers the backward pass reaches first (the last ones) leaves it the rest of
the step to finish before the next forward pass needs them.

Leases are released one layer late: after the next layer's work is queued, the stream waits for an event
recorded after the layer's last kernel, then releases without a device-wide synchronisation (the device keeps
computing).

With data parallelism (`grad_reduce`), a reduction may finish later than it starts (`Reduction`): the layer's
step then waits for it while the next layer's backward runs, as DDP overlaps its all-reduces with the backward
pass. The layer's work is queued once the next layer's reduction is launched (or sooner, when the stream needs
the layer: a flush, a forward pass, its master weights), and its leases are released one layer after that.
Two work buffers alternate, so that the next layer's gradients never overwrite those being reduced.
"""

import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from vfabric import _stream_states
from vfabric._host_steps import HostSteps, StepJob, adamw_range, copy_compute
from vfabric._stream_parts import STEP_AT, Reduction, _Grads, _Layer, _Pending, combine_norms
from vfabric.balance import HostShare
from vfabric.stream_layout import PIECE_BYTES, AdamW, Array, LayerLayout, Ops, ParamSpec

__all__ = ["AdamW", "LayerLayout", "LayerStream", "Ops", "ParamSpec", "Reduction", "StepJob"]

class LayerStream(HostSteps):
    """Streams layers' state through `device` of `fabric` (see the module's docs).

    `lookahead` is how many layers ahead the stream prefetches compute copies in each pass. `host_ops` are the
    operations on host arrays, for layers whose optimizer step runs on the CPU. `piece_bytes` bounds the pieces
    optimizer states are leased in. The caller runs the layers; the stream gives each its parameters
    (`forward_weights`, `backward_weights`) and takes its gradients (`backward_done`). `waited` adds up the
    seconds the caller spent waiting on the stream, by why.
    """

    def __init__(
        self,
        fabric: Any,
        device: str,
        ops: Ops,
        optimizer: AdamW,
        lookahead: int = 2,
        host_ops: Optional[Ops] = None,
        piece_bytes: int = PIECE_BYTES,
        host_chunk: int = 0,
        grad_reduce: Optional[Callable[[Array], Optional[Reduction]]] = None,
        step_at: str = "backward",
        hyper: Optional[Callable[[int, int], Optional[AdamW]]] = None,
    ):
        if step_at not in STEP_AT:
            raise ValueError(f"step_at must be one of {STEP_AT}, not {step_at!r}")
        if step_at == "optimizer" and grad_reduce is not None:
            raise ValueError("data parallelism's reductions run in the backward pass: it needs step_at=\"backward\"")
        self.step_at = step_at
        """When layers step: "backward" (inside the backward pass) or "optimizer" (`request_step`)."""
        self.hyper = hyper
        """`step_at="backward"`: parameter j of layer i's hyperparameters at its step (`hyper(i, j)`; None: not
        stepped); unset, `optimizer` for every trainable parameter."""
        self.fabric = fabric
        self.device = device
        self.ops = ops
        self.host_ops = host_ops
        self.optimizer = optimizer
        self.lookahead = max(0, lookahead)
        self.piece_bytes = piece_bytes
        self.host_chunk = max(0, host_chunk)
        """Elements of a layer the CPU's step takes at once, AdamW then the compute copy of the same elements,
        while they are still in the CPU's caches (0: AdamW over the whole layer, then its compute copy, which
        reads the master weights from memory again)."""
        self.grad_reduce = grad_reduce
        """Called, in place, on each layer's gradients of a whole step (one flat float32 array, the micro-batches'
        sums added in) before its optimizer step: data parallelism's all-reduce, which leaves every rank the same
        gradients and so the same step. It returns None when the gradients are final on return, or a
        `Reduction` under way, final once its `wait()` returns: the stream calls that later, after the next
        layer's reduction is launched (or when it needs the layer sooner), and until then keeps the array and
        the layer's leases as they are. An error `wait()` raises comes out of the stream's call that waited;
        the layer's step is then lost. Every rank must launch the reductions in the same order (the stream
        does: a layer's at its `backward_done`)."""
        self.accumulating = False
        """Whether backward passes only add gradients up (every micro-batch of a step but the last)."""
        self.waited = {"acquire": 0.0, "retire": 0.0, "hints": 0.0, "host_steps": 0.0}
        self.host_busy = {"leases": 0.0, "adamw": 0.0, "compute_copy": 0.0, "release": 0.0}
        """Seconds the CPU's worker spent on the layers it steps, by part: leasing their gradient sums, states and
        compute copies in host memory (waiting for write-backs to land), AdamW, writing the compute copy, and
        letting the leases go. Beside `waited["host_steps"]`, it says whether the CPU bounds a step."""
        self.balance: Optional[HostShare] = None
        """When set (`balance_host_layers`), it chooses how many layers step on the CPU, step by step."""
        self._mark: Optional[Tuple[float, float, float]] = None
        self._loop_waits = 0.0
        """Seconds the forward and backward passes waited for the CPU's steps."""
        self._stepped = False
        self.flushed_for_runs = 0
        """Times a part found no run of frames until the pending layers let theirs go."""
        self._layers: List[_Layer] = []
        self._pending: Deque[_Pending] = deque()
        self._deferred: Optional[_Grads] = None
        """The layer whose reduction is under way, its work not queued yet (at most one)."""
        self._work: List[Optional[Array]] = [None, None]
        self._work_bytes = [0, 0]
        self._host_queue: "Optional[queue.Queue[Optional[Tuple[int, Any]]]]" = None
        self._host_thread: Optional[threading.Thread] = None

    def __len__(self) -> int:
        return len(self._layers)

    def layout(self, i: int) -> LayerLayout:
        """Layer `i`'s layout."""
        return self._layers[i].layout

    def steps(self, i: int) -> int:
        """Optimizer steps layer `i` has taken."""
        self._retire_layer(i)  # a step still deferred, or to hand to the CPU
        self._wait_host_step(self._layers[i])
        return self._layers[i].steps

    # ------------------------------------------------------------------------------------------------ setup
    def add_layer(self, specs: Sequence[ParamSpec], values: Callable[[str], Array], on_host: bool = False) -> int:
        """Adds a layer: its regions, its master weights (`values(name)` is a parameter's values as a 1-D array
        the ops can copy from), zero moments, and the compute copy made from the master weights. With
        `on_host`, its optimizer step runs on the CPU and its states live in host memory. Returns its index."""
        if on_host and self.host_ops is None:
            raise ValueError("a layer stepped on the host needs the stream's host_ops")
        layout = LayerLayout(specs, self.fabric.page_size, self.piece_bytes)
        weights = self.fabric.alloc(layout.compute_bytes, device=self.device, priority="high")
        states = None
        try:
            if layout.state_bytes:  # none for a layer of frozen parameters
                states = self.fabric.alloc(layout.state_bytes, device="host" if on_host else self.device, priority="low")
        except BaseException:
            self.fabric.free(weights)
            raise
        layer = _Layer(layout, weights, states, on_host)
        self._layers.append(layer)
        i = len(self._layers) - 1
        where, ops = ("host", self.host_ops) if on_host else (self.device, self.ops)
        assert ops is not None
        # Pages never written read as zeros: the moments start at zero without a byte written.
        self._lease(layer, "states", "w", where, ops)
        self._lease(layer, "weights", "w", where, ops)
        for k in range(len(layout.pieces)):
            for j, first, n in layout.overlaps(k):
                ops.copy(self._master(layer, ops, k, j, first, n), values(layout.specs[j].name)[first : first + n])
        self._write_compute_copy(layer, ops)
        for j, spec in enumerate(layout.specs):
            if not spec.trainable:  # a frozen parameter: its compute copy, in its own dtype, is all it has
                part, at = layout.compute[j]
                ops.copy(ops.view(layer.flats[("weights", part)], at, spec.dtype, (spec.numel,)), values(spec.name))
        self._pend(i, write_back=[] if on_host else ["weights", "states"])
        self.flush()
        return i

    def host_layers(self) -> int:
        """How many layers take their optimizer step on the CPU."""
        return sum(layer.on_host for layer in self._layers)

    def set_host_layers(self, k: int) -> None:
        """The last `k` layers take their optimizer steps on the CPU from the next step on, the others on the
        device. Between optimizer steps only (no gradient sums held); what is pending is waited for first. A
        layer's states stay where they are and go where its next step needs them."""
        if not 0 <= k <= len(self._layers):
            raise ValueError(f"host layers must be between 0 and the {len(self._layers)} layers, not {k}")
        if k and self.host_ops is None:
            raise ValueError("layers stepped on the host need the stream's host_ops")
        self.flush()
        if any(layer.accumulated for layer in self._layers):
            raise ValueError("the CPU's share of the steps changes between optimizer steps, not while gradients add up")
        for i, layer in enumerate(self._layers):
            layer.on_host = i >= len(self._layers) - k

    def balance_host_layers(self) -> None:
        """Has the stream choose how many layers step on the CPU from what each optimizer step measures
        (`vfabric.balance.HostShare`), starting from how many do now."""
        if self.host_ops is None:
            raise ValueError("balancing the CPU's share needs the stream's host_ops")
        if self.grad_reduce is not None:
            # Each rank would choose from its own timings, and the CPU's AdamW and the GPU's do not round alike:
            # the ranks' weights would drift apart.
            raise ValueError("the CPU's share cannot be balanced with data parallelism: give host_layers a number")
        self.balance = HostShare(len(self._layers), self.host_layers())

    def master_weights(self, i: int) -> Dict[str, bytes]:
        """Layer `i`'s fp32 master weights, read from the fabric: per trainable parameter, its bytes
        (little-endian). A step asked for runs first."""
        return {name: st["master"] for name, st in self.read_states(i).items()}

    def read_states(self, i: int) -> Dict[str, Dict[str, Any]]:
        """Layer `i`'s optimizer state, read from the fabric, a step asked for run first: per trainable
        parameter its fp32 `master` weights, `exp_avg` and `exp_avg_sq` (bytes, little-endian) and `step`."""
        return _stream_states.read_states(self, i)

    def write_states(self, i: int, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Replaces layer `i`'s optimizer state with `states` (as `read_states` gives it; every trainable
        parameter's), and its compute copy with the new master weights. Between optimizer steps only."""
        _stream_states.write_states(self, i, states)

    def read_frozen(self, i: int) -> Dict[str, bytes]:
        """Layer `i`'s frozen parameters: per parameter, its bytes in its own dtype."""
        return _stream_states.read_frozen(self, i)

    def write_frozen(self, i: int, values: Mapping[str, Any]) -> None:
        """Replaces layer `i`'s frozen parameters named in `values` (bytes in their own dtype)."""
        _stream_states.write_frozen(self, i, values)

    def flush(self) -> None:
        """Waits for the queued work of every layer (the CPU's steps included) and releases its leases."""
        self._finish_deferred()
        while self._pending:
            self._retire()
        for layer in self._layers:
            self._wait_host_step(layer)

    def close(self) -> None:
        """Releases every lease, stops the CPU's worker and frees every region of the stream."""
        self.flush()
        self._stop_worker()
        for layer in self._layers:
            for r in (layer.weights, layer.states, layer.grads):
                if r is not None:
                    self.fabric.free(r)
        self._layers.clear()
        self._work = [None, None]

    # ------------------------------------------------------------------------------------------------ steps
    def request_step(self, i: int, hypers: Sequence[Optional[AdamW]], scales: Sequence[Any]) -> bool:
        """`step_at="optimizer"`: layer `i` takes an optimizer step with the gradients summed since its last:
        parameter j with `hypers[j]` (None: not stepped), its gradient times `scales[j]` first (None: as it
        is). A parameter without a gradient is not stepped. On the CPU the step starts now; on the device it
        runs before the layer's next forward pass (or `apply_steps`). Returns whether any parameter steps."""
        if self.step_at != "optimizer":
            raise ValueError("layers step in the backward pass (step_at=\"backward\"): there is no step to ask for")
        layer = self._layers[i]
        lay = layer.layout
        if len(hypers) != len(lay.specs) or len(scales) != len(lay.specs):
            raise ValueError(f"layer {i} has {len(lay.specs)} parameters: a hyperparameter set and a factor each")
        if layer.pending is not None:
            raise ValueError(f"layer {i} has a step asked for already: it runs before the next forward pass")
        self._retire_layer(i)  # its gradient sums' lease ends first
        self._wait_host_step(layer)
        hyper = [h if lay.specs[j].trainable and layer.has_grad[j] else None for j, h in enumerate(hypers)]
        if layer.grads is None or not any(h is not None for h in hyper):
            return False
        for j, h in enumerate(hyper):
            if h is not None:
                layer.param_steps[j] += 1
        job = StepJob(hyper, list(layer.param_steps), list(scales))
        layer.steps += 1
        layer.has_grad = [False] * len(lay.specs)
        layer.norms = [None] * len(lay.specs)
        if layer.on_host:
            layer.host_step.clear()
            self._queue_host_step(i, job)
        else:
            layer.pending = job
        return True

    def apply_steps(self, i: Optional[int] = None) -> None:
        """Runs the device steps asked for and not yet run, of layer `i` (None: every layer), and waits for
        them and for the CPU's."""
        for j in range(len(self._layers)) if i is None else [i]:
            layer = self._layers[j]
            if layer.pending is not None:
                self._retire_layer(j)
                self._run_pending(j)
                self._pend(j, *layer.after_forward)
                layer.after_forward = ([], [])
            self._retire_layer(j)
            self._wait_host_step(layer)

    def discard_grads(self, i: int) -> None:
        """Forgets layer `i`'s gradient sums (the loop zeroed its gradients without a step)."""
        layer = self._layers[i]
        self._retire_layer(i)
        self._wait_host_step(layer)
        if layer.grads is not None:
            self.fabric.free(layer.grads)
        layer.grads, layer.accumulated = None, 0
        layer.has_grad = [False] * len(layer.layout.specs)
        layer.norms = [None] * len(layer.layout.specs)

    def norms(self, i: int) -> List[Optional[Tuple[Array, Array]]]:
        """`step_at="optimizer"`: per parameter of layer `i`, its gradient sums' 2-norm and largest absolute
        value (one-element arrays on the device), or None without a gradient."""
        return list(self._layers[i].norms)

    def _run_pending(self, i: int) -> None:
        """Layer `i`'s step asked for, on the device: its gradient sums, states and compute copy leased for
        writing, AdamW, the new compute copy. Its regions go back, and the sums are freed, with the work queued
        after (the forward pass's)."""
        layer = self._layers[i]
        job, layer.pending = layer.pending, None
        assert job is not None
        ops, lay = self.ops, layer.layout
        self._lease(layer, "grads", "w")
        self._lease(layer, "states", "w")
        self._lease(layer, "weights", "w")
        for k, piece in enumerate(lay.pieces):
            adamw_range(ops, lay, layer.flats[("states", k)], layer.flats[("grads", k)], piece.start, k, piece.start,
                        piece.numel, job)
        self._write_compute_copy(layer, ops)
        sums, layer.grads, layer.accumulated = layer.grads, None, 0
        layer.after_forward = (["weights", "states"], [sums])

    # ------------------------------------------------------------------------------------------------ passes
    def forward_weights(self, i: int) -> Dict[str, Array]:
        """Layer `i`'s parameters for its forward pass (its compute copy, leased for reading, or written by
        the step asked for first), prefetching the next layers'. Valid until `forward_done(i)`: the caller
        drops them by then."""
        self._finish_deferred()  # the backward pass is over
        if i == 0 and self.balance is not None:
            self._judge_step()
        layer = self._layers[i]
        self._retire_layer(i)
        self._wait_host_step(layer, loop=True)
        if layer.pending is not None:
            self._run_pending(i)
        else:
            self._lease(layer, "weights", "r")
        for j in range(i + 1, min(i + 1 + self.lookahead, len(self._layers))):
            nxt = self._layers[j]
            if nxt.host_step.is_set():  # else its new weights are still being made
                self._prefetch(nxt, "weights")
                if nxt.pending is not None:
                    self._prefetch(nxt, "states")
                    self._prefetch(nxt, "grads")
        if i == len(self._layers) - 1 and self._steps_here(layer):
            self._prefetch(layer, "states")  # the backward pass starts with this layer's step
        return self._compute_views(layer)

    def forward_done(self, i: int) -> None:
        """Layer `i`'s forward work is queued: its lease ends once the device is past it."""
        layer = self._layers[i]
        after, layer.after_forward = layer.after_forward, ([], [])
        self._pend(i, *after)

    def backward_weights(self, i: int) -> Dict[str, Array]:
        """Layer `i`'s parameters for its backward pass, prefetching the previous layers'. Valid until
        `backward_done(i)`."""
        layer = self._layers[i]
        self._retire_layer(i)
        self._wait_host_step(layer, loop=True)
        self._lease(layer, "weights", "w" if self._steps_here(layer) else "r")
        for j in range(i - 1, max(i - 1 - self.lookahead, -1), -1):
            self._prefetch(self._layers[j], "weights")
        return self._compute_views(layer)

    def backward_done(self, i: int, grads: Mapping[str, Optional[Array]], fresh: Optional[Sequence[bool]] = None) -> None:
        """Layer `i`'s gradients (one array per trainable parameter, any float dtype; a missing one or None:
        the parameter has none this pass). With `step_at="backward"`: added to the layer's gradient sums, or,
        when this pass steps, the layer's AdamW step (queued on the device now, or handed to the CPU once the
        sums are in host memory); when `grad_reduce` returns a `Reduction`, what follows it waits for the
        stream's next call that needs it (the next layer's `backward_done` at the latest). With
        `step_at="optimizer"`: added to the gradient sums, parameter j's replacing them instead where
        `fresh[j]` (default: where the sums hold none), and the sums' norms taken."""
        layer = self._layers[i]
        lay = layer.layout
        if not lay.trainable:
            self._pend(i)
            return
        ops = self.ops
        slot, g = self._work_buffer(lay.numel)
        for j in lay.trainable:
            spec, off = lay.specs[j], lay.flat[j]
            grad = grads.get(spec.name)
            if grad is None:
                ops.zero(ops.view(g, 4 * off, "float32", (spec.numel,)))
            else:
                ops.copy(ops.view(g, 4 * off, "float32", spec.shape), grad)
        if self.step_at == "optimizer":
            self._collect(layer, g, [grads.get(lay.specs[j].name) is not None for j in range(len(lay.specs))], fresh)
            self._pend(i, write_back=["grads"])
            self._prefetch_previous(i)
            return
        if self.accumulating or layer.accumulated == 0:
            layer.has_grad = [False] * len(lay.specs)
        for j in lay.trainable:
            layer.has_grad[j] = layer.has_grad[j] or grads.get(lay.specs[j].name) is not None
        step = not self.accumulating
        to_sums = not step or layer.on_host
        reduce = self.grad_reduce if step else None
        if to_sums:
            # Add up in the gradient sums (zero-filled pages at a step's first micro-batch: copy instead).
            if layer.grads is None:
                layer.grads = self.fabric.alloc(lay.grad_bytes, device=self.device, priority="low")
            self._lease(layer, "grads", "w")
            if reduce is not None:
                # The step's last micro-batch: the whole step's gradients reduced at once, then kept for the CPU.
                self._add_sums(layer, g)
                layer.accumulated = 0
        elif layer.grads is not None and layer.accumulated > 0:
            self._lease(layer, "grads", "r")
            self._add_sums(layer, g)
        reduction = reduce(ops.view(g, 0, "float32", (lay.numel,))) if reduce is not None else None
        if i == 0 and step:
            self._stepped = True
        done = _Grads(i, slot, g, reduction, step, to_sums)
        if reduction is None:
            self._finish(done)
        else:
            self._defer(done)
        self._prefetch_previous(i)

    def _prefetch_previous(self, i: int) -> None:
        """The previous layer's states (or sums) come while this layer's step (or sums) are under way."""
        if i > 0:
            prev = self._layers[i - 1]
            if self._steps_here(prev):
                self._prefetch(prev, "states")
            if prev.grads is not None:
                self._prefetch(prev, "grads")

    def _collect(self, layer: _Layer, g: Array, got: List[bool], fresh: Optional[Sequence[bool]]) -> None:
        """`step_at="optimizer"`: adds this pass's gradients `g` (flat) to the layer's gradient sums, or puts
        them there for the parameters whose sums start afresh, and takes each parameter's norms."""
        ops, lay = self.ops, layer.layout
        if layer.grads is None:
            layer.grads = self.fabric.alloc(lay.grad_bytes, device=self.device, priority="low")
            layer.has_grad = [False] * len(lay.specs)
        self._lease(layer, "grads", "w")
        restart = [not layer.has_grad[j] for j in range(len(lay.specs))] if fresh is None else list(fresh)
        per_param: Dict[int, List[Array]] = {}
        for k, piece in enumerate(lay.pieces):
            acc = layer.flats[("grads", k)]
            for j, first, n in lay.overlaps(k):
                e = lay.flat[j] + first
                dst = ops.view(acc, 4 * (e - piece.start), "float32", (n,))
                src = ops.view(g, 4 * e, "float32", (n,))
                if restart[j] or not layer.has_grad[j]:
                    ops.copy(dst, src)
                else:
                    ops.add(dst, src)
                per_param.setdefault(j, []).append(dst)
        for j in lay.trainable:
            if restart[j]:
                layer.has_grad[j] = got[j]
            else:
                layer.has_grad[j] = layer.has_grad[j] or got[j]
        layer.accumulated += 1
        order = sorted(per_param)
        slices = [t for j in order for t in per_param[j]]
        l2, linf = ops.norms(slices)
        at = 0
        for j in order:
            n = len(per_param[j])
            layer.norms[j] = combine_norms(l2[at : at + n], linf[at : at + n]) if layer.has_grad[j] else None
            at += n

    def _finish(self, done: _Grads) -> None:
        """Queues what follows a layer's final gradients: adding them to its gradient sums (and handing its step
        to the CPU), or its AdamW step on the device. Waits for their reduction first, if one is under way."""
        i, layer = done.layer, self._layers[done.layer]
        if done.reduction is not None:
            try:
                done.reduction.wait()
            except BaseException:
                self._pend(i)  # its leases go, one layer late as any layer's; its step is lost
                raise
        if not done.to_sums:
            free = self._step_on_device(layer, done.flat, self._eager_job(i))
            self._pend(i, write_back=["weights", "states"], free=free)
            return
        ops = self.ops
        for k, piece in enumerate(layer.layout.pieces):
            acc = ops.view(layer.flats[("grads", k)], 0, "float32", (piece.numel,))
            part = ops.view(done.flat, 4 * piece.start, "float32", (piece.numel,))
            ops.copy(acc, part) if layer.accumulated == 0 else ops.add(acc, part)
        layer.accumulated += 1
        job = None
        if done.step:
            layer.host_step.clear()
            job = self._eager_job(i)
        self._pend(i, write_back=["grads"], host_step=job)

    def _eager_job(self, i: int) -> StepJob:
        """`step_at="backward"`: layer `i`'s step now, its parameters' steps counted."""
        layer = self._layers[i]
        lay = layer.layout
        hypers: List[Optional[AdamW]] = []
        for j, spec in enumerate(lay.specs):
            h = (self.hyper(i, j) if self.hyper is not None else self.optimizer) if spec.trainable else None
            hypers.append(h if layer.has_grad[j] else None)
            if hypers[-1] is not None:
                layer.param_steps[j] += 1
        layer.steps += 1
        return StepJob(hypers, list(layer.param_steps), [None] * len(lay.specs))

    def _step_on_device(self, layer: _Layer, g: Array, job: StepJob) -> List[Any]:
        """Queues the layer's AdamW step on the device, with its gradients `g` (fp32, flat), and its new compute
        copy. Returns the regions to free once they are done (the gradient sums it consumed)."""
        ops = self.ops
        self._lease(layer, "states", "w")
        for k, piece in enumerate(layer.layout.pieces):
            adamw_range(ops, layer.layout, layer.flats[("states", k)], g, 0, k, piece.start, piece.numel, job)
        self._write_compute_copy(layer, ops)
        if layer.grads is None:
            return []
        # Consumed: the next step's first micro-batch starts from fresh (zero-filled) pages.
        sums, layer.grads, layer.accumulated = layer.grads, None, 0
        return [sums]

    def _defer(self, done: _Grads) -> None:
        """Layer `done.layer`'s reduction is under way: the layer deferred before (its reduction launched
        earlier) is finished now, and this one takes its place. The pending layer goes first, so that two
        layers' leases are held, not three (the device has this layer's backward to run meanwhile)."""
        try:
            while self._pending:
                self._retire()
            self._finish_deferred()
        finally:
            self._deferred = done  # even when the other's reduction failed: this one is under way

    def _finish_deferred(self, i: Optional[int] = None) -> None:
        """Finishes the deferred layer (waiting for its reduction), if it is layer `i` (any layer: None)."""
        done = self._deferred
        if done is not None and (i is None or done.layer == i):
            # Taken first: a flush inside (a lease short of a run of frames) finds nothing deferred, and a
            # failed reduction is not waited for twice.
            self._deferred = None
            self._finish(done)

    def _add_sums(self, layer: _Layer, g: Array) -> None:
        """Adds the layer's gradient sums (leased) into `g`, its gradients laid out flat."""
        if layer.accumulated == 0:
            return
        ops = self.ops
        for k, piece in enumerate(layer.layout.pieces):
            part = ops.view(g, 4 * piece.start, "float32", (piece.numel,))
            ops.add(part, ops.view(layer.flats[("grads", k)], 0, "float32", (piece.numel,)))

    def _judge_step(self) -> None:
        """At the first layer's forward: once an optimizer step lies between this one and the last mark, the
        balance judges it (and may change the CPU's share); the mark moves here."""
        assert self.balance is not None
        now, waited, busy = time.perf_counter(), self._loop_waits, sum(self.host_busy.values())
        if self._mark is not None and self._stepped:
            t, w, b = self._mark
            k = self.balance.observe(now - t, waited - w, busy - b)
            if k != self.host_layers():
                self.set_host_layers(k)
        if self._mark is None or self._stepped:
            self._mark, self._stepped = (now, waited, busy), False

    # ------------------------------------------------------------------------------------------------ inside
    def _steps_here(self, layer: _Layer) -> bool:
        """Whether this backward pass runs the layer's step on the device."""
        return self.step_at == "backward" and not self.accumulating and not layer.on_host and bool(layer.layout.numel)

    def _lease(self, layer: _Layer, role: str, mode: str, device: Optional[str] = None, ops: Optional[Ops] = None) -> None:
        """Leases every part of one of the layer's regions."""
        region = layer.region(role)
        t = time.perf_counter()
        for k, part in enumerate(layer.parts(role)):
            at = device or self.device
            lease = self.fabric.acquire(region, part.offset, part.nbytes, device=at, mode=mode)
            if not lease.contiguous:
                # The device had no run of free frames for the part and could not make one: the frames the
                # pending layers hold are in the way. Let them go (waiting for their work) and try once more;
                # a second failure is the caller's NotContiguous (a budget too small for a layer's parts).
                lease.release(wait=False)
                self.flush()
                self.flushed_for_runs += 1
                lease = self.fabric.acquire(region, part.offset, part.nbytes, device=at, mode=mode)
            layer.leases[(role, k)] = lease
            layer.flats[(role, k)] = (ops or self.ops).flat(lease)
        self.waited["acquire"] += time.perf_counter() - t

    def _prefetch(self, layer: _Layer, role: str) -> None:
        region = layer.region(role)
        if region is None or (role, 0) in layer.leases:
            return
        t = time.perf_counter()
        for part in layer.parts(role):
            self.fabric.prefetch(region, part.offset, part.nbytes, self.device)
        self.waited["hints"] += time.perf_counter() - t

    def _compute_views(self, layer: _Layer) -> Dict[str, Array]:
        lay = layer.layout
        return {
            s.name: self.ops.view(layer.flats[("weights", part)], at, s.dtype, s.shape)
            for s, (part, at) in zip(lay.specs, lay.compute)
        }

    def _state(self, layer: _Layer, ops: Ops, k: int, which: int) -> Array:
        """Piece `k`'s master weights (0), first moments (1) or second moments (2)."""
        n = layer.layout.pieces[k].numel
        return ops.view(layer.flats[("states", k)], 4 * n * which, "float32", (n,))

    def _master(self, layer: _Layer, ops: Ops, k: int, j: int, first: int, n: int) -> Array:
        """The master weights of elements `first .. first + n` of parameter `j`, inside piece `k`."""
        lay = layer.layout
        at = lay.flat[j] + first - lay.pieces[k].start
        return ops.view(layer.flats[("states", k)], 4 * at, "float32", (n,))

    def _write_compute_copy(self, layer: _Layer, ops: Ops) -> None:
        """The compute copy from the master weights (both leased for writing)."""
        copy_compute(ops, layer.layout, layer.flats)

    def _work_buffer(self, numel: int) -> Tuple[int, Array]:
        """The gradients' fp32 work space on the device, as bytes (grown to the largest layer), and its slot:
        one of two, the one the deferred layer's gradients are not in (the second is made only for that)."""
        k = 1 - self._deferred.slot if self._deferred is not None else 0
        if self._work[k] is None or self._work_bytes[k] < 4 * numel:
            self._work[k] = None
            self._work[k] = self.ops.buffer(4 * numel)
            self._work_bytes[k] = 4 * numel
        return k, self._work[k]

    def _pend(self, i: int, write_back: Optional[List[str]] = None, free: Optional[List[Any]] = None,
              host_step: Optional[StepJob] = None) -> None:
        """Layer `i`'s work is queued: its leases end once the device is past the event recorded now, after
        the next layer's work is queued too (see `_retire`)."""
        self._pending.append(_Pending(i, self.ops.event(), write_back or [], free or [], host_step))
        while len(self._pending) > 1:
            self._retire()

    def _retire_layer(self, i: int) -> None:
        """Retires pending work up to and including layer `i`'s (its leases must end before new ones), its
        deferred work queued first."""
        self._finish_deferred(i)
        while any(p.layer == i for p in self._pending):
            self._retire()

    def _retire(self) -> None:
        """The oldest pending layer: waits for its event, releases its leases without a device-wide wait,
        starts its write-backs, frees what it consumed, and hands its step to the CPU if it has one."""
        p = self._pending[0]
        t = time.perf_counter()
        if p.event is not None:
            p.event.wait()
        self.waited["retire"] += time.perf_counter() - t
        layer = self._layers[p.layer]
        layer.flats.clear()
        for key, lease in list(layer.leases.items()):
            # A view of it still alive raises LeaseInUse here: the lease and this pending work stay, for a
            # later retire once the caller has dropped the view.
            lease.release(wait=False)
            del layer.leases[key]
        self._pending.popleft()
        t = time.perf_counter()
        for role in p.write_back:
            region = layer.region(role)
            for part in layer.parts(role):
                self.fabric.write_back(region, part.offset, part.nbytes, self.device)
        self.waited["hints"] += time.perf_counter() - t
        for region in p.free:
            self.fabric.free(region)
        if p.host_step is not None:
            self._queue_host_step(p.layer, p.host_step)

