"""How many of a stream's layers take their optimizer step on the CPU, chosen from what each step measured.

The CPU's AdamW over a layer costs the CPU's memory bandwidth and spares the GPU's link the layer's optimizer
states (12 bytes a parameter each way); which share is best depends on the machine, and on the same machine
kind differs from one host to the next (its memory's speed under the copy engines' traffic). `HostShare`
watches every optimizer step: a loop that waited for the CPU's steps gives layers back to the GPU, in
proportion to the wait; a CPU with time to spare, and no wait, takes one more. A share that made the loop
wait becomes a ceiling it does not climb to again, and what was measured overrules both rules: it never moves
to a share whose fastest step was slower than this one's, and goes back to the fastest share seen when the
current one is slower. It decides on two steps judged with a share (the least wait and the fastest step of
them), so one slowed by something else moves nothing; the step right after a change is not judged (it pays for
the change: every pending step is waited for).
"""

from typing import Dict, List, Optional, Tuple

__all__ = ["HostShare"]

WAIT_SHARE = 0.05
"""A loop that waited for the CPU longer than this share of a step gives layers back."""

BUSY_SHARE = 0.7
"""A CPU busy for less than this share of a step, with no wait, takes one more layer."""

SAMPLES = 2
"""Steps judged with a share before it decides anything: the least wait and the fastest step of them count, so
that one step slowed by something else (a checkpoint, a stall in the data) moves nothing."""

SLOWER = 1.03
"""A share whose fastest step is this much slower than another's is the worse one."""


class HostShare:
    """Chooses the number of layers (of `layers`) whose steps run on the CPU, from `start`."""

    def __init__(self, layers: int, start: int):
        if not 0 <= start <= layers:
            raise ValueError(f"start must be between 0 and the {layers} layers")
        self.layers = layers
        self.k = start
        self.ceiling = layers + 1
        """The least share known to be too much for the CPU."""
        self.best: Dict[int, float] = {}
        """The fastest step seen with each share."""
        self._settling = True
        self._samples: List[Tuple[float, float, float]] = []
        self.history = []
        """(share, step seconds, seconds waited for the CPU, seconds the CPU was busy) per judged step."""

    def observe(self, step_s: float, waited_s: float, busy_s: float) -> int:
        """One optimizer step took `step_s`, of which the loop waited `waited_s` for the CPU's steps, which kept
        it busy for `busy_s`; returns the share for the next step."""
        if self._settling:
            self._settling = False
            return self.k
        k = self.k
        self.history.append((k, round(step_s, 4), round(waited_s, 4), round(busy_s, 4)))
        self.best[k] = min(self.best.get(k, step_s), step_s)
        self._samples = (self._samples + [(step_s, waited_s, busy_s)])[-SAMPLES:]
        if len(self._samples) < SAMPLES:
            return k
        step_s = min(x[0] for x in self._samples)
        waited_s = min(x[1] for x in self._samples)
        busy_s = sum(x[2] for x in self._samples) / len(self._samples)
        new = k
        if k > 0 and waited_s > WAIT_SHARE * step_s:
            # The CPU bounds the step: give back about as many layers as the wait is worth.
            self.ceiling = min(self.ceiling, k)
            per_layer = busy_s / k if busy_s > 0 else step_s / k
            new = k - max(1, min(k // 2, round(waited_s / per_layer)))
        elif busy_s < BUSY_SHARE * step_s and k + 1 < self.ceiling and k < self.layers:
            new = k + 1
        # What was measured overrules the guess: never a share known to be slower than this one, and back to
        # the fastest seen when this one is slower than that.
        fastest = min(self.best, key=self.best.__getitem__)
        if new in self.best and self.best[new] > SLOWER * self.best[k]:
            new = k
        if self.best[k] > SLOWER * self.best[fastest]:
            new = fastest
            self.ceiling = min(self.ceiling, max(k, fastest + 1)) if k > fastest else self.ceiling
        if new != k:
            self.k = new
            self._settling = True
            self._samples = []
        return self.k

    @property
    def settling(self) -> bool:
        """Whether the next step observed is one right after a change (or the first), which is not judged."""
        return self._settling

    def describe(self) -> Optional[str]:
        """What it settled on, and the steps it judged."""
        return f"{self.k} of {self.layers} layers on the CPU (ceiling {self.ceiling}); judged steps: {self.history}"
