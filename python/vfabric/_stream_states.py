"""Reading and replacing a streamed layer's state in the fabric: its optimizer states (fp32 master weights and
Adam's moments, per trainable parameter, and each one's step) and its frozen parameters (`LayerStream`'s
`read_states`, `write_states`, `read_frozen`, `write_frozen`: checkpoints and their resumption)."""

from typing import Any, Dict, Mapping

from vfabric.stream_layout import ITEMSIZE

STATES = ("master", "exp_avg", "exp_avg_sq")
"""A piece's optimizer states, in the order they lie in it."""


def read_states(stream: Any, i: int) -> Dict[str, Dict[str, Any]]:
    """Layer `i`'s optimizer state, read from the fabric, a step asked for run first: per trainable
    parameter its fp32 `master` weights, `exp_avg` and `exp_avg_sq` (bytes, little-endian) and `step`."""
    stream.apply_steps(i)
    layer = stream._layers[i]
    lay = layer.layout
    out = {lay.specs[j].name: {w: bytearray(4 * lay.specs[j].numel) for w in STATES} for j in lay.trainable}
    for k, piece in enumerate(lay.pieces):
        raw = stream.fabric.read(layer.states, 12 * piece.start, 12 * piece.numel)
        for j, first, n in lay.overlaps(k):
            at = 4 * (lay.flat[j] + first - piece.start)
            for w, which in enumerate(STATES):
                lo = at + 4 * piece.numel * w
                out[lay.specs[j].name][which][4 * first : 4 * (first + n)] = raw[lo : lo + 4 * n]
    return {
        lay.specs[j].name: {**{w: bytes(b) for w, b in out[lay.specs[j].name].items()}, "step": layer.param_steps[j]}
        for j in lay.trainable
    }

def write_states(stream: Any, i: int, states: Mapping[str, Mapping[str, Any]]) -> None:
    """Replaces layer `i`'s optimizer state with `states` (as `read_states` gives it; every trainable
    parameter's), and its compute copy with the new master weights. Between optimizer steps only."""
    stream.apply_steps(i)
    layer = stream._layers[i]
    lay = layer.layout
    missing = [lay.specs[j].name for j in lay.trainable if lay.specs[j].name not in states]
    if missing:
        raise ValueError(f"layer {i}: no state for {', '.join(missing)}")
    if layer.accumulated:
        raise ValueError(f"layer {i} holds gradients: its state is replaced between optimizer steps only")
    for j in lay.trainable:
        st = states[lay.specs[j].name]
        for which in STATES:
            if len(st[which]) != 4 * lay.specs[j].numel:
                raise ValueError(f"layer {i}: {which} of {lay.specs[j].name} is {len(st[which])} bytes, "
                                 f"not {4 * lay.specs[j].numel}")
    for k, piece in enumerate(lay.pieces):
        raw = bytearray(12 * piece.numel)
        for j, first, n in lay.overlaps(k):
            at = 4 * (lay.flat[j] + first - piece.start)
            st = states[lay.specs[j].name]
            for w, which in enumerate(STATES):
                lo = at + 4 * piece.numel * w
                raw[lo : lo + 4 * n] = memoryview(st[which])[4 * first : 4 * (first + n)]
        stream.fabric.write(layer.states, 12 * piece.start, bytes(raw))
    for j in lay.trainable:
        layer.param_steps[j] = int(states[lay.specs[j].name]["step"])
    layer.steps = max([layer.param_steps[j] for j in lay.trainable], default=0)
    where, ops = ("host", stream.host_ops) if layer.on_host else (stream.device, stream.ops)
    stream._lease(layer, "states", "r", where, ops)
    stream._lease(layer, "weights", "w", where, ops)
    stream._write_compute_copy(layer, ops)
    stream._pend(i, write_back=[] if layer.on_host else ["weights"])
    stream.flush()

def read_frozen(stream: Any, i: int) -> Dict[str, bytes]:
    """Layer `i`'s frozen parameters: per parameter, its bytes in its own dtype."""
    stream._retire_layer(i)
    lay = stream._layers[i].layout
    out = {}
    for j, spec in enumerate(lay.specs):
        if not spec.trainable:
            part, at = lay.compute[j]
            out[spec.name] = stream.fabric.read(stream._layers[i].weights, lay.parts[part].offset + at,
                                              spec.numel * ITEMSIZE[spec.dtype])
    return out

def write_frozen(stream: Any, i: int, values: Mapping[str, Any]) -> None:
    """Replaces layer `i`'s frozen parameters named in `values` (bytes in their own dtype)."""
    stream._retire_layer(i)
    lay = stream._layers[i].layout
    for j, spec in enumerate(lay.specs):
        if not spec.trainable and spec.name in values:
            part, at = lay.compute[j]
            raw = bytes(values[spec.name])
            if len(raw) != spec.numel * ITEMSIZE[spec.dtype]:
                raise ValueError(f"layer {i}: {spec.name} takes {spec.numel * ITEMSIZE[spec.dtype]} bytes, "
                                 f"not {len(raw)}")
            stream.fabric.write(stream._layers[i].weights, lay.parts[part].offset + at, raw)
