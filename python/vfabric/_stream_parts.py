"""The records a `vfabric.streaming.LayerStream` keeps: a layer's regions and bookkeeping (`_Layer`), a layer's
gradients on their way (`_Grads`), work queued on the device whose leases end later (`_Pending`), and a
reduction under way (`Reduction`)."""

import threading
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Tuple

from vfabric._host_steps import Key, StepJob
from vfabric.stream_layout import Array, Event, LayerLayout, Part

STEP_AT = ("backward", "optimizer")
"""When layers take their optimizer steps: inside the backward pass, or when the caller asks."""


class _Layer:
    def __init__(self, layout: LayerLayout, weights: Any, states: Any, on_host: bool):
        self.layout = layout
        self.weights = weights
        self.states = states
        self.on_host = on_host
        """Whether its optimizer step runs on the CPU (its states stay in host memory)."""
        self.grads: Optional[Any] = None
        self.steps = 0
        """Optimizer steps taken (by any of its parameters)."""
        n = len(layout.specs)
        self.param_steps = [0] * n
        """Each parameter's optimizer steps (one without a gradient at a step does not take it)."""
        self.has_grad = [False] * n
        """Whether the gradient sums hold a gradient of each parameter."""
        self.norms: List[Optional[Tuple[Array, Array]]] = [None] * n
        """`step_at="optimizer"`: each parameter's gradient sums' 2-norm and largest absolute value."""
        self.pending: Optional[StepJob] = None
        """A step asked for, to run on the device before the layer's next forward pass."""
        self.after_forward: Tuple[List[str], List[Any]] = ([], [])
        """What the forward pass's pending work writes back and frees (a step it ran)."""
        self.accumulated = 0
        """Micro-batches whose gradients the gradient sums hold."""
        self.leases: Dict[Key, Any] = {}
        self.flats: Dict[Key, Array] = {}
        """The uint8 arrays over the held leases (dropped before the leases are released)."""
        self.host_step = threading.Event()
        """Set while no step of it is pending on the CPU."""
        self.host_step.set()
        self.host_error: Optional[BaseException] = None

    def region(self, role: str) -> Any:
        return {"weights": self.weights, "states": self.states, "grads": self.grads}[role]

    def parts(self, role: str) -> List[Part]:
        lay = self.layout
        if role == "weights":
            return lay.parts
        part = lay.state_part if role == "states" else lay.grad_part
        return [part(k) for k in range(len(lay.pieces))]


class Reduction(Protocol):
    """A reduction of a layer's gradients under way, as `grad_reduce` may return it (`torch.distributed`'s
    all-reduce with `async_op=True`, then the division by the ranks)."""

    def wait(self) -> None:
        """Returns once the gradients are final: work queued on the device after this call sees them."""


class _Grads(NamedTuple):
    """A layer's gradients of one backward pass, in a work buffer (`slot`), and what is left to do with them."""

    layer: int
    slot: int
    flat: Array
    reduction: Optional[Reduction]
    """None: final now; else final once it is waited for."""
    step: bool
    """Whether this pass takes the layer's optimizer step."""
    to_sums: bool
    """Whether they go to the gradient sums (added up for a later step, or for the CPU's step)."""


class _Pending(NamedTuple):
    layer: int
    event: Optional[Event]
    write_back: List[str]
    free: List[Any]
    host_step: Optional[StepJob]




def combine_norms(l2: List[Array], linf: List[Array]) -> Tuple[Array, Array]:
    """One parameter's norms from those of its slices (a parameter may lie in several pieces), element-wise, so
    that no array library waits for its device: max(a, b) = (a + b + |a - b|) / 2."""
    sq, top = l2[0] * l2[0], linf[0]
    for a, b in zip(l2[1:], linf[1:]):
        sq = sq + a * a
        top = (top + b + abs(top - b)) / 2
    return (sq ** 0.5 if len(l2) > 1 else l2[0]), top
