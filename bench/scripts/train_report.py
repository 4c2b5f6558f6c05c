#!/usr/bin/env python3
"""The training benchmark's table and plot, from the JSON lines train_offload.py writes (train_bench.sh collects
them in train.jsonl).

    python3 bench/scripts/train_report.py bench/results/train-h200x1/train.jsonl --out bench/results/train-h200x1

Writes train.md (one row per run: tokens/s, its ratio to the resident run of the same model and accumulation,
peak GPU memory, the largest loss difference from the resident run step by step, PCIe and fabric traffic) and
train.svg (tokens/s per run, grouped by model, bars coloured by whether the run fits the GPU budget), the plot
through matplotlib when it is installed (the table is written either way).
"""

import argparse
import json
import os
import sys

MODES = {
    "resident": "(a) resident, whole GPU",
    "fsdp": "(b) FSDP2 CPUOffloadPolicy",
    "stream": "(c) hand-written streaming",
    "vfabric": "(d) vfabric.torch.stream",
    "allocator": "(e) vfabric allocator",
}


def size(r):
    """The model's size class, and the ranks of a data-parallel run (compared with the resident run of its own
    class and ranks: DDP)."""
    base = "large" if r["params"] > 2e9 else "small" if r["params"] > 0.8e9 else "mid"
    return base if r.get("world", 1) == 1 else f"{base}, {r['world']} ranks"


def label(r):
    extra = []
    info = r.get("info", {})
    if r["mode"] == "stream":
        extra.append("act " + info.get("act", "?"))
    if r["mode"] == "vfabric":
        share = r.get("host_share")
        if share:  # chosen step by step: where it settled
            extra.append(f"{share.split(' layers', 1)[0]} blocks' AdamW on CPU, chosen by the stream")
        else:
            extra.append(f"{info.get('host_layers', 0)} blocks' AdamW on CPU")
        # Threads of the CPU's steps, when not PyTorch's default (one a core: 16 on the H200 machine).
        threads = info.get("host_threads")
        if threads and threads != info.get("torch_threads", 16):
            extra.append(f"{threads} CPU threads")
        extra.append(f"fabric {info.get('fabric_budget', '?')}")
    if r.get("accum", 1) > 1:
        extra.append(f"accum {r['accum']}")
    if r.get("world", 1) > 1:
        extra.append(f"{r['world']} ranks{', DDP' if r['mode'] == 'resident' else ''}")
        if "replicas_equal" in r:
            extra.append("same weights on every rank" if r["replicas_equal"] else "WEIGHTS DIFFER between ranks")
    if str(info.get("schedule", "")).startswith("blocks"):
        extra.append(f"block by block, {info['schedule'].split(', ', 1)[-1]}")
    return MODES.get(r["mode"], r["mode"]) + (f" ({', '.join(extra)})" if extra else "")


def loss_gap(r, resident):
    """Largest |loss - resident loss| over the steps both ran."""
    if resident is None or resident is r:
        return None
    pairs = list(zip(r["losses"], resident["losses"]))
    return max(abs(a - b) for a, b in pairs) if pairs else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("jsonl", nargs="+")
    p.add_argument("--out", default=".")
    p.add_argument("--budget-gib", type=float, default=20.0, help="the GPU budget of the large model's runs")
    a = p.parse_args()
    runs = []
    for path in a.jsonl:
        with open(path) as f:
            runs += [json.loads(line) for line in f if line.strip()]
    resident = {(size(r), r.get("accum", 1)): r for r in runs if r["mode"] == "resident"}
    rows = ["| run | model | method | tokens/s | x resident | peak GPU GiB | max loss gap vs (a) | step s (median) |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        base = resident.get((size(r), r.get("accum", 1)))
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else "-"
        gap = loss_gap(r, base)
        rows.append(
            f"| {r['tag']} | {size(r)} ({r['params'] / 1e9:.2f} B, {r['tokens_per_step']} tok/step) | {label(r)} | "
            f"{r['tokens_per_s']:,.0f} | {ratio} | {r.get('peak_gpu_GiB', r.get('peak_reserved_GiB', '-'))} | "
            f"{'-' if gap is None else f'{gap:.4f}'} | {r['step_s_median']} |"
        )
    extra = ["", "| run | fabric traffic over the run, GB | waited per step, ms |", "|---|---|---|"]
    for r in runs:
        if "fabric_traffic_GB" in r:
            extra.append(f"| {r['tag']} | {r['fabric_traffic_GB']} | {r.get('waited_ms_per_step', '-')} |")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "train.md"), "w") as f:
        f.write("\n".join(rows + extra) + "\n")
    print("\n".join(rows + extra))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("train_report: matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    classes = list(dict.fromkeys(size(r) for r in runs))  # small, large, data-parallel ones: as they come
    fig, axes = plt.subplots(1, len(classes), figsize=(7 * len(classes), 5.5), squeeze=False)
    for ax, which in zip(axes[0], classes):
        sel = [r for r in runs if size(r) == which]
        if not sel:
            ax.set_visible(False)
            continue
        budget = a.budget_gib if which == "large" else None
        colours = []
        for r in sel:
            peak = r.get("peak_gpu_GiB") or 0
            fits = budget is None or peak <= budget
            colours.append({"vfabric": "#1f77b4", "allocator": "#17becf"}.get(r["mode"], "#7f7f7f" if fits else "#c7c7c7"))
        ax.barh([r["tag"] for r in sel], [r["tokens_per_s"] for r in sel], color=colours)
        for y, r in enumerate(sel):
            ax.text(r["tokens_per_s"], y, f" {r['tokens_per_s']:,.0f}  ({r.get('peak_gpu_GiB', '?')} GiB)", va="center",
                    fontsize=8)
        ax.set_title(f"{which}: model of {sel[0]['params'] / 1e9:.2f} B parameters")
        ax.set_xlabel("tokens/s (peak GPU memory in brackets)")
        ax.invert_yaxis()
        ax.set_xlim(0, max(r["tokens_per_s"] for r in sel) * 1.35)
    fig.suptitle("GPT-style decoder, bf16, AdamW, one H200: vfabric (blue) beside PyTorch's ways")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "train.svg"))
    print(f"train_report: wrote {os.path.join(a.out, 'train.svg')}")


if __name__ == "__main__":
    main()
