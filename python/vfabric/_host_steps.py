"""The CPU's share of a layer stream (`vfabric.streaming.LayerStream`): a worker thread that takes a layer's
AdamW step over host leases of its gradient sums, optimizer states and compute copy, while the device runs the
backward pass, and the element-wise work it shares with the device's steps (AdamW on a piece of a layer, the
compute copy written from the master weights).

`HostSteps` is the part of `LayerStream` that runs the worker; the stream's own attributes (`_layers`,
`fabric`, `host_ops`, `optimizer`, `host_chunk`, `host_busy`, `waited`, `_loop_waits`, `_host_queue`,
`_host_thread`) are what it works on.
"""

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from vfabric.stream_layout import ITEMSIZE, AdamW, Array, LayerLayout, Ops

Key = Tuple[str, int]
"""One lease of a layer: its region's role ("weights", "states", "grads") and the part of it."""


class StepJob(NamedTuple):
    """One optimizer step of a layer, per parameter (by its index in the layer's specs)."""

    hypers: List[Optional[AdamW]]
    """Its hyperparameters; None: not stepped (frozen, or no gradient this step)."""
    steps: List[int]
    """The step it takes, counting from 1."""
    scales: List[Any]
    """A factor on its gradient first (gradient clipping's, a loss scale's inverse), or None."""


class HostSteps:
    """The CPU's worker of a `LayerStream`: a layer's step queued (`_queue_host_step`), run on the worker's
    thread (`_step_on_host`), waited for (`_wait_host_step`) and the worker stopped (`_stop_worker`)."""

    _layers: List[Any]
    fabric: Any
    host_ops: Any
    optimizer: AdamW
    host_chunk: int
    host_busy: Dict[str, float]
    waited: Dict[str, float]
    _loop_waits: float
    _host_queue: Any
    _host_thread: Any

    def _step_on_host(self, i: int, grads: Any, job: StepJob) -> None:
        """The CPU's worker: layer `i`'s AdamW step over host leases of its gradient sums (region `grads`, freed
        after), its states and its compute copy (whose write lease there drops the device's old copy)."""
        layer = self._layers[i]
        ops = self.host_ops
        assert ops is not None
        lay = layer.layout
        held: List[Any] = []
        busy = self.host_busy
        try:
            flats: Dict[Key, Array] = {}
            t = time.perf_counter()
            for role, region, mode in (("grads", grads, "r"), ("states", layer.states, "w"), ("weights", layer.weights, "w")):
                for k, part in enumerate(layer.parts(role)):
                    held.append(self.fabric.acquire(region, part.offset, part.nbytes, device="host", mode=mode))
                    flats[(role, k)] = ops.flat(held[-1])
            t = _lap(busy, "leases", t)
            if self.host_chunk:
                # Chunk by chunk, the compute copy right after AdamW (its time counted in "adamw").
                for k, piece in enumerate(lay.pieces):
                    for at in range(0, piece.numel, self.host_chunk):
                        n = min(self.host_chunk, piece.numel - at)
                        adamw_range(ops, lay, flats[("states", k)], flats[("grads", k)], piece.start, k,
                                    piece.start + at, n, job)
                        copy_compute_part(ops, lay, flats, k, piece.start + at, n)
                t = _lap(busy, "adamw", t)
            else:
                for k, piece in enumerate(lay.pieces):
                    adamw_range(ops, lay, flats[("states", k)], flats[("grads", k)], piece.start, k, piece.start,
                                piece.numel, job)
                t = _lap(busy, "adamw", t)
                copy_compute(ops, lay, flats)
                t = _lap(busy, "compute_copy", t)
            flats.clear()
            for lease in held:
                lease.release(wait=False)  # the CPU's work is done when its calls return
            held.clear()
            self.fabric.free(grads)
            _lap(busy, "release", t)
        except BaseException as e:  # handed to the caller when it next needs the layer
            layer.host_error = e
            for lease in held:
                try:
                    lease.release(wait=False)
                except BaseException:
                    pass
        finally:
            layer.host_step.set()

    def _host_worker(self) -> None:
        q = self._host_queue
        assert q is not None
        while True:
            job = q.get()
            if job is None:
                return
            self._step_on_host(*job)

    def _queue_host_step(self, i: int, job: StepJob) -> None:
        layer = self._layers[i]
        layer.accumulated = 0
        grads, layer.grads = layer.grads, None  # the step frees them
        if self._host_thread is None:
            self._host_queue = queue.Queue()
            self._host_thread = threading.Thread(target=self._host_worker, name="vfabric-host-steps", daemon=True)
            self._host_thread.start()
            # A worker still running when the interpreter exits would die inside the array library's threads:
            # stop it first (the stream itself may be collected before: the hook then does nothing).
            atexit.register(_stop_at_exit, weakref.ref(self))
        assert self._host_queue is not None
        self._host_queue.put((i, grads, job))

    def _stop_worker(self) -> None:
        if self._host_thread is not None and self._host_queue is not None:
            self._host_queue.put(None)
            self._host_thread.join()
            self._host_thread = self._host_queue = None

    def _wait_host_step(self, layer: Any, loop: bool = False) -> None:
        """Waits for the CPU's step of `layer`, if one is pending; `loop`: the forward or backward pass waits
        (what the balance judges; a caller's own calls, reading master weights, flushing, are not)."""
        if not layer.host_step.is_set():
            t = time.perf_counter()
            layer.host_step.wait()
            took = time.perf_counter() - t
            self.waited["host_steps"] += took
            if loop:
                self._loop_waits += took
        if layer.host_error is not None:
            e, layer.host_error = layer.host_error, None
            raise e


def _lap(busy: Dict[str, float], what: str, since: float) -> float:
    """Adds the seconds since `since` to `busy[what]`; returns now."""
    now = time.perf_counter()
    busy[what] += now - since
    return now


def copy_compute(ops: Ops, lay: LayerLayout, flats: Mapping[Key, Array]) -> None:
    """Writes the compute copy (`("weights", part)` arrays) from the master weights (`("states", piece)`)."""
    for k, piece in enumerate(lay.pieces):
        copy_compute_part(ops, lay, flats, k, piece.start, piece.numel)


def copy_compute_part(ops: Ops, lay: LayerLayout, flats: Mapping[Key, Array], k: int, start: int, n: int) -> None:
    """Writes elements `start .. start + n` of the compute copy, which lie in piece `k`, from their master
    weights."""
    piece = lay.pieces[k]
    for j, first, count in lay.covering(start, n):
        spec = lay.specs[j]
        part, at = lay.compute[j]
        dst = ops.view(flats[("weights", part)], at + first * ITEMSIZE[spec.dtype], spec.dtype, (count,))
        src = ops.view(flats[("states", k)], 4 * (lay.flat[j] + first - piece.start), "float32", (count,))
        ops.copy(dst, src)


def adamw_range(ops: Ops, lay: LayerLayout, states: Array, grads: Array, grad_base: int, k: int, start: int, n: int,
                job: StepJob) -> None:
    """AdamW on elements `start .. start + n` of the flat array, which lie in piece `k`: its master weights and
    moments in `states` (the piece's states, as bytes), the gradients in `grads` (bytes; element e at byte
    4 * (e - grad_base)). Each parameter at its own step and with its own hyperparameters (`job`): one call of
    the ops per set of hyperparameters."""
    piece = lay.pieces[k]
    calls: Dict[int, Tuple[AdamW, List[Array], List[Array], List[Array], List[Array], List[int]]] = {}
    for j, first, count in lay.covering(start, n):
        hyper = job.hypers[j]
        if hyper is None:
            continue
        e = lay.flat[j] + first
        at = e - piece.start
        g = ops.view(grads, 4 * (e - grad_base), "float32", (count,))
        if job.scales[j] is not None:
            ops.scale(g, job.scales[j])
        call = calls.setdefault(id(hyper), (hyper, [], [], [], [], []))
        for lst, w in ((call[1], 0), (call[3], 1), (call[4], 2)):
            lst.append(ops.view(states, 4 * (piece.numel * w + at), "float32", (count,)))
        call[2].append(g)
        call[5].append(job.steps[j])
    for hyper, ps, gs, ms, vs, steps in calls.values():
        ops.adamw(ps, gs, ms, vs, steps, hyper)


def _stop_at_exit(ref: "weakref.ref[HostSteps]") -> None:
    stream = ref()
    if stream is not None:
        stream._stop_worker()
