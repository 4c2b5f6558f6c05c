"""Plots of vfabric-bench results: one SVG beside each result's JSON (`NAME.json` -> `NAME.svg`), every figure
drawn beside its baseline from the same run.

  python3 bench/scripts/plot_results.py bench/results/pager/h200x1.json     # one result
  python3 bench/scripts/plot_results.py bench/results                       # every result under a folder
  python3 bench/scripts/plot_results.py --out /tmp/plots bench/results      # the SVGs elsewhere

The scenario comes from the JSON's `benchmark` (or `scenario`) field: migrate (bandwidth against size per
engine and layout, the plain copy dashed), pager (walks: GB/s per setup, order and chunk), remote (throughput
per operation and size beside iperf3; latencies), local (acquire/release latency in the agent's process and
through the socket; pages handed between processes beside a plain copy), storage (GB/s against depth per
operation, beside fio), trace (peak reserved / peak allocated beside PyTorch's), status (status and scrape
latencies beside a ping). Files of other shapes are skipped with a word. Needs matplotlib.
"""

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

Doc = Dict[str, Any]


def _bars(ax, labels: List[str], series: Dict[str, List[float]], ylabel: str) -> None:
    """Grouped bars: one group per label, one bar per series."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _cdf(ax, series: Dict[str, List[float]], xlabel: str, title: str) -> None:
    """Latency distributions: each series is 101 values, at every hundredth of the mass (the benches' `cdf`).
    Results from before the benches wrote them have none: the panel stays empty then."""
    drawn = False
    for name, values in series.items():
        if values:
            ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=name)
            drawn = True
    if not drawn:
        ax.set_axis_off()
        return
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of calls at most")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)


def _size(b: float) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:g}{unit}"
    return f"{b:g}B"


def migrate(d: Doc):
    rows = d.get("rows", [])
    dirs = sorted({r["direction"] for r in rows})
    fig, axes = plt.subplots(1, len(dirs), figsize=(6 * len(dirs), 4.5), squeeze=False)
    for ax, direction in zip(axes[0], dirs):
        lines: Dict[str, List] = defaultdict(list)
        base: Dict[int, List[float]] = defaultdict(list)
        for r in rows:
            if r["direction"] != direction:
                continue
            # The short batches run again with their index lists uploaded first: a line of their own.
            uploaded = " (lists uploaded)" if r.get("suite") == "size-sweep-uploaded" else ""
            lines[f"{r['engine']} {r['layout']} {_size(r['page'])}{uploaded}"].append((r["bytes"], r["gb_s"]))
            if r.get("baseline_gb_s"):
                base[r["bytes"]].append(r["baseline_gb_s"])
        for name, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
        if base:
            xs = sorted(base)
            ax.plot(xs, [max(base[x]) for x in xs], "k--", label=rows[0].get("baseline", "baseline"))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes moved")
        ax.set_ylabel("GB/s")
        ax.set_title(direction)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    return fig


def pager(d: Doc):
    walks = d.get("walks", [])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{w['setup']} {w['order']} x{w['chunk']}" for w in walks]
    _bars(ax, labels, {"walk GB/s": [w.get("walk_gb_s", 0) for w in walks]}, "GB/s")
    ax.set_title("pager walks (resident: the same walk kept on the GPU)")
    return fig


def remote(d: Doc):
    rows = d.get("rows", [])
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(18, 4.5))
    labels = [f"{r.get('op', '?')} {_size(r.get('size', 0))} x{r.get('streams', 1)}" for r in rows]
    _bars(a, labels, {"vfabric": [r.get("gbit_s", 0) for r in rows]}, "Gbit/s")
    for i, base in enumerate(d.get("iperf3_gbit_s") or []):
        a.axhline(base.get("gbit_s", 0), ls="--", color=f"C{i + 1}", label=f"iperf3 x{base.get('streams', 1)}")
    a.legend(fontsize=8)
    a.set_title("between two agents over QUIC")
    lat = d.get("latency", [])
    labels = [f"{_size(l.get('page') or l.get('size') or 0)}" for l in lat]
    series = {k: [l.get(k, 0) for l in lat] for k in ("ping_p50_us", "p50_us", "acquire_p50_us", "acquire_p99_us")}
    _bars(b, labels, series, "us")
    b.set_title("remote latency")
    curves = {}
    for l in lat:
        size = _size(l.get("size", 0))
        curves[f"read {size}"] = l.get("read_cdf_us", [])
        curves[f"acquire {size}, new copy"] = l.get("acquire_cdf_us", [])
    _cdf(c, curves, "us", "remote latency, distribution")
    return fig


def local(d: Doc):
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(18, 4.5))
    kinds = ("acquire_us", "release_us", "pair_us")
    where = {"in the agent's process": d.get("in_process", {}), "local client (socket)": d.get("local_client", {})}
    _bars(a, list(kinds), {w: [v.get(k, {}).get("p50", 0) for k in kinds] for w, v in where.items()}, "us (p50)")
    a.set_yscale("log")
    a.set_title("lease latency")
    two = d.get("two_processes", [])
    labels = [_size(t["bytes"]) for t in two]
    _bars(b, labels, {"fabric": [t["fabric_gb_s"] for t in two], "plain copy": [t["plain_gb_s"] for t in two]}, "GB/s")
    b.set_title("pages handed between two processes")
    curves = {"in the agent's process": d.get("in_process", {}).get("acquire_us", {}).get("cdf", []),
              "local client": d.get("local_client", {}).get("acquire_us", {}).get("cdf", []),
              "local client, metrics served":
                  d.get("local_client", {}).get("with_metrics", {}).get("acquire_us", {}).get("cdf", [])}
    _cdf(c, curves, "acquire of a resident page, us", "acquire latency, distribution")
    return fig


def storage(d: Doc):
    io = [r for r in d.get("io", []) if r.get("data", "random") == "random" and r.get("compression", "none") == "none"]
    ops = sorted({r["op"] for r in io})
    fig, axes = plt.subplots(1, max(len(ops), 1), figsize=(5 * max(len(ops), 1), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for engine in sorted({r["engine"] for r in io}):
            pts = sorted((r["depth"], r["gb_s"]) for r in io if r["op"] == op and r["engine"] == engine)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ls="--" if engine == "fio" else "-",
                    label=engine)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight")
        ax.set_ylabel("GB/s")
        ax.set_title(op)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def trace(d: Doc):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    pool, torch = d.get("pool", {}), d.get("torch", {})
    _bars(ax, ["peak reserved / peak allocated"],
          {"vfabric tensor pool": [pool.get("ratio", 0)], "PyTorch caching allocator": [torch.get("ratio", 0)]}, "ratio")
    ax.set_ylim(1.0, max(1.2, pool.get("ratio", 1), torch.get("ratio", 1)) * 1.02)
    ax.set_title(os.path.basename(d.get("file", "trace")))
    return fig


def status(d: Doc):
    fig, (ax, c) = plt.subplots(1, 2, figsize=(13, 4.5))
    calls = ("status", "scrape", "ping")
    _bars(ax, list(calls), {q: [d.get(k, {}).get(f"{q}_us", 0) for k in calls] for q in ("p50", "p99")}, "us")
    ax.set_title(f"an agent serving {d.get('regions', '?')} regions")
    _cdf(c, {k: d.get(k, {}).get("cdf_us", []) for k in calls}, "us", "latency, distribution")
    return fig


def sweep(d: Doc):
    """GB/s against block size, one panel per pair and op, a line per batch x in flight (dashed: the baseline)."""
    rows = d.get("rows", [])
    panels = sorted({(r["pair"], r["op"]) for r in rows})
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 4.2), squeeze=False)
    for ax, (pair, op) in zip(axes[0], panels):
        mine = [r for r in rows if (r["pair"], r["op"]) == (pair, op)]
        for shape in sorted({(r["batch"], r["in_flight"]) for r in mine}):
            pts = sorted((r["block"], r["gb_s"], r.get("baseline_gb_s")) for r in mine
                         if (r["batch"], r["in_flight"]) == shape)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=f"batch {shape[0]}, {shape[1]} in flight")
            if all(p[2] for p in pts):
                ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle="--", color=line.get_color(), alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["block"] for r in mine}), [_size(b) for b in sorted({r["block"] for r in mine})])
        ax.set_xlabel("block")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{pair} {op} (dashed: baseline)", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def lease_routes(d: Doc):
    """GB/s of leases by route against their size, beside NCCL's own send/recv of the same bytes."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = d.get("rows", [])
    sizes = sorted({r["bytes"] for r in rows})
    labels = [f"{s >> 20} MiB" if s < 1 << 30 else f"{s >> 30} GiB" for s in sizes]
    series = {}
    for route in sorted({r["route"] for r in rows}):
        by = {r["bytes"]: r["gb_s"] for r in rows if r["route"] == route}
        series[route] = [by.get(s, 0) for s in sizes]
    base = {b["bytes"]: b["gb_s"] for b in d.get("nccl_baseline", [])}
    if base:
        series["NCCL send/recv"] = [base.get(s, 0) for s in sizes]
    _bars(ax, labels, series, "GB/s")
    ax.set_title("a lease of a peer's pages onto this GPU, by route")
    return fig


PLOTS: Dict[str, Callable[[Doc], Any]] = {
    "migrate": migrate, "pager": pager, "remote": remote, "local": local, "storage": storage, "trace": trace,
    "status": status, "sweep": sweep, "lease-routes": lease_routes,
}


def scenario(d: Any) -> Optional[str]:
    if not isinstance(d, dict):
        return None
    name = str(d.get("benchmark") or d.get("scenario") or "")
    for key in PLOTS:
        if name.startswith(key):
            return key
    # Older results without a name, by their shape.
    if "iperf3_gbit_s" in d:
        return "remote"
    if "nccl_baseline" in d and "rows" in d:
        return "lease-routes"
    return None


def plot(path: str, out: Optional[str]) -> Optional[str]:
    with open(path) as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            print(f"plot_results: {path}: not JSON ({e})", file=sys.stderr)
            return None
    kind = scenario(d)
    if kind is None:
        print(f"plot_results: {path}: not a result this script draws; skipped")
        return None
    fig = PLOTS[kind](d)
    fig.suptitle(f"{kind}: {d.get('device', '')[:90]}  ({d.get('date', '')}, {d.get('git_rev', 'rev unknown')})",
                 fontsize=9)
    fig.tight_layout()
    dest = os.path.splitext(path)[0] + ".svg"
    if out:
        # Results of different scenarios share names (h200x1.json): the folder's name goes first.
        os.makedirs(out, exist_ok=True)
        folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
        dest = os.path.join(out, f"{folder}-{os.path.basename(dest)}")
    fig.savefig(dest)
    plt.close(fig)
    print(f"plot_results: {dest}")
    return dest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="result JSON files, or folders to search for them")
    p.add_argument("--out", help="folder for the SVGs (default: beside each JSON)")
    a = p.parse_args()
    files = []
    for path in a.paths:
        if os.path.isdir(path):
            for root, _, names in sorted(os.walk(path)):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".json")]
        else:
            files.append(path)
    drawn = [f for f in files if plot(f, a.out)]
    print(f"plot_results: {len(drawn)} plot(s) from {len(files)} file(s)")
    return 0 if drawn or not files else 1


if __name__ == "__main__":
    sys.exit(main())
