"""The layer stream's traffic pattern at the training benchmark's proportions, on the emulated device (no GPU, no
torch): what the fabric moves and where its callers wait, per step, for a schedule change made on a machine
without a GPU. With the emulated GPU's host link paced (`--host-link`, a hundredth of the H200's PCIe by
default), its step times are a PCIe-bound step's in miniature; unpaced, only the bytes and waits mean anything.

    python3 bench/scripts/stream_proxy.py [--layers 20] [--host-layers 10] [--steps 6]   # vfabric importable

Proportions of the large run (`train_bench.sh` large_vfabric): a block's optimizer states in about 26 parts of
48 pages (2 MiB pages there, 64 KiB here), its compute copy in parts of four sizes, a fabric arena about four
blocks' states, the run's memory settings (headroom 2%, watermarks 100/100), half the blocks stepping on the
CPU. Here: a GPT block of d 512 (3.1 M parameters, 36 MiB of states in 13 parts of 48 pages; compute parts of 8
to 32 pages), an arena of four blocks' states; `--block mlp` two matrices instead.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import vfabric
from vfabric.numpy_ops import NumpyOps
from vfabric.streaming import AdamW, LayerStream, ParamSpec

PAGE = 64 << 10
OPT = AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


class TouchOps(NumpyOps):
    """NumPy's operations, with the optimizer's arithmetic left out: a subtraction touches the bytes AdamW would
    (the schedule is what is measured, and this machine's cores are the emulated GPU's too)."""

    def adamw(self, p, g, m, v, step, opt):
        p -= np.float32(opt.lr) * g


def config(budget_mib, host_mib, host_link, headroom, high, low):
    return f"""
[cluster]
name = "stream-proxy"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "{budget_mib * 2}MiB"
emulated_host_link = "{host_link}"
[memory]
page_size = "64KiB"
gpu_budget = "{budget_mib}MiB"
host_arena = "{host_mib}MiB"
readahead = "0"
headroom_percent = {headroom}
high_watermark_percent = {high}
low_watermark_percent = {low}
[[node]]
name = "local"
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--host-layers", type=int, default=10)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--hidden", type=int, default=2048, help="the MLP block's hidden size (--block mlp)")
    p.add_argument("--block", choices=["mlp", "gpt"], default="gpt",
                   help="gpt: a GPT block's six parameters (parts of the compute copy of four sizes, as in the "
                        "training benchmark); mlp: two matrices")
    p.add_argument("--part-pages", type=int, default=48, help="pages of optimizer states a part")
    p.add_argument("--arena-blocks", type=float, default=4.0, help="the fabric's GPU arena, in blocks' states")
    p.add_argument("--lookahead", type=int, default=2, help="layers prefetched ahead (the training run's: 2)")
    p.add_argument("--accum", type=int, default=1, help="micro-batches a step (gradient accumulation)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--host-link", default="550MiB",
                   help="the emulated GPU's PCIe link, bytes a second each way (a hundredth of the H200's 55 GB/s; "
                        "\"0\": unpaced)")
    p.add_argument("--headroom", type=int, default=2, help="headroom_percent (the training benchmark's: 2)")
    p.add_argument("--watermarks", type=int, nargs=2, default=[100, 100], metavar=("HIGH", "LOW"),
                   help="high and low watermark percent (the training benchmark's: 100 100)")
    p.add_argument("--json", help="append the result line here")
    a = p.parse_args()

    if a.block == "gpt":
        # A GPT block's parameters, as the training benchmark's: attention in, attention out, the MLP's two
        # matrices (hidden = 4 d), two norms' weights.
        d, h = a.d, 4 * a.d
        specs = [ParamSpec("qkv", (d, 3 * d), "float16"), ParamSpec("proj", (d, d), "float16"),
                 ParamSpec("fc1", (d, h), "float16"), ParamSpec("fc2", (h, d), "float16"),
                 ParamSpec("ln1", (d,), "float32"), ParamSpec("ln2", (d,), "float32")]
    else:
        specs = [ParamSpec("a", (a.d, a.hidden), "float16"), ParamSpec("b", (a.hidden, a.d), "float16")]
    numel = sum(int(np.prod(sp.shape)) for sp in specs)
    state_bytes = 12 * numel
    budget_mib = max(8, int(a.arena_blocks * state_bytes / (1 << 20)))
    host_mib = int(a.layers * (state_bytes + 10 * numel) / (1 << 20)) + 256
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "proxy.toml")
        with open(path, "w") as f:
            f.write(config(budget_mib, host_mib, a.host_link, a.headroom, *a.watermarks))
        fabric = vfabric.Fabric(path)
    stream = LayerStream(fabric, "gpu0", TouchOps(), OPT, lookahead=a.lookahead, host_ops=TouchOps(),
                         piece_bytes=a.part_pages * PAGE)
    rng = np.random.default_rng(1)
    for i in range(a.layers):
        vals = {s.name: (rng.standard_normal(s.shape) * 0.02).astype(np.float32).reshape(-1) for s in specs}
        stream.add_layer(specs, lambda name, v=vals: v[name], on_host=i >= a.layers - a.host_layers)
    grads = {sp.name: np.full(sp.shape, 1e-3, dtype=np.float32) for sp in specs}
    x = np.zeros((4, a.d), dtype=np.float32)

    def step():
        for k in range(a.accum):
            # Gradients add up over the micro-batches; the last one steps.
            stream.accumulating = k < a.accum - 1
            for i in range(a.layers):
                w = stream.forward_weights(i)
                x[0, 0] += float(w[specs[0].name][0, 0])  # touches the lease
                del w
                stream.forward_done(i)
            for i in reversed(range(a.layers)):
                w = stream.backward_weights(i)
                del w
                stream.backward_done(i, grads)

    def figures():
        st = fabric.stats()
        return st["traffic"], st["stalls"], dict(stream.waited)

    times = []
    for k in range(a.steps):
        if k == a.warmup:
            t0, s0, w0 = figures()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    stream.flush()
    t1, s1, w1 = figures()
    n = a.steps - a.warmup
    per = lambda new, old, scale: {k: round((new[k] - old[k]) / n / scale, 3) for k in new}
    res = {
        "layers": a.layers,
        "host_layers": a.host_layers,
        "accum": a.accum,
        "part_pages": a.part_pages,
        "arena_MiB": budget_mib,
        "host_link": a.host_link,
        "headroom_percent": a.headroom,
        "watermarks": a.watermarks,
        "block": a.block,
        "block_state_MiB": round(state_bytes / (1 << 20), 1),
        "traffic_MiB_per_step": per(t1, t0, 1 << 20),
        "stalls_per_step": {k.replace("_ns", "_ms"): round(v / 1e6, 1) if k.endswith("_ns") else v
                            for k, v in per(s1, s0, 1).items()},
        "waited_s_per_step": per(w1, w0, 1),
        "step_s": [round(t, 3) for t in times],
    }
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
