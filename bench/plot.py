#!/usr/bin/env python3
"""Bar charts of Google Benchmark JSON files, for the performance page (docs/performance.md).

A developer tool, not a build dependency: it needs Python 3 and matplotlib (on Debian, the
package python3-matplotlib: `apt-get install python3-matplotlib`, then run it with
/usr/bin/python3).

    /usr/bin/python3 bench/plot.py docs/data/bench_attention.json \
        docs/data/bench_attention_2threads.json --out docs/img

Files are read together, so one benchmark program's runs (say, one thread and two threads)
can come from several files. Every figure takes, per benchmark, the median over its
repetitions: the `_median` aggregate when the file has aggregates only, else the median of
its iteration entries.

- bench_attention's benchmarks (fwd/..., bwd/..., fwd_bwd/..., sgemm/...) give
  bench_attention.png: GFLOP/s of each variant per pass, one panel per sequence length and
  thread count, with OpenBLAS sgemm's GFLOP/s (1024 x 1024 x 1024, same threads) and the
  targets (forward 60 %, backward 40 % of it) drawn across.
- Any other benchmarks give <stem>.png, a bar per benchmark of its first rate counter
  (GFLOP/s, FLOPS, bytes_per_second, items_per_second) or else its time.
"""

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_runs(paths):
    """{run_name: {"entry": a representative entry, "values": {key: median}}} over all files."""
    samples = defaultdict(list)  # run_name -> iteration entries
    medians = {}  # run_name -> the _median aggregate
    sources = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data["benchmarks"]:
            name = b.get("run_name", b["name"])
            sources[name] = Path(path).stem
            if b.get("error_occurred"):
                print(f"{path}: {name}: {b.get('error_message')}", file=sys.stderr)
                continue
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[name] = b
            else:
                samples[name].append(b)
    runs = {}
    for name in set(samples) | set(medians):
        if name in medians:
            entry = medians[name]
            values = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        else:
            entries = samples[name]
            entry = entries[0]
            keys = [k for k, v in entry.items() if isinstance(v, (int, float))]
            values = {k: statistics.median(e[k] for e in entries if k in e) for k in keys}
        runs[name] = {"entry": entry, "values": values, "source": sources[name]}
    return runs


def fields(run_name):
    """'fwd/tilegrad/N:1024/threads:2/real_time' -> (['fwd', 'tilegrad'], {'N': 1024, ...})."""
    words, params = [], {}
    for part in run_name.split("/"):
        m = re.fullmatch(r"(\w+):(\d+)", part)
        if m:
            params[m.group(1)] = int(m.group(2))
        elif part not in ("real_time", "process_time", "manual_time"):
            words.append(part)
    return words, params


# ----- attention -------------------------------------------------------------------------------

PASSES = [("fwd", "forward"), ("bwd", "backward"), ("fwd_bwd", "forward + backward")]
VARIANTS = {  # implementation -> (label, colour)
    "tilegrad": ("tilegrad (backward: atomic dQ)", "#1f77b4"),
    "tilegrad_atomic_dq": ("tilegrad (backward: atomic dQ)", "#1f77b4"),
    "tilegrad_two_pass": ("tilegrad, two-pass backward", "#6baed6"),
    "vjp": ("vjp (reference gradients)", "#9467bd"),
    "naive": ("naive (N x N scores, sgemm)", "#969696"),
}
TARGETS = {"fwd": 0.6, "bwd": 0.4}


def is_attention(name):
    return name.split("/")[0] in ("fwd", "bwd", "fwd_bwd", "sgemm", "vjp_memory")


def plot_attention(runs, out):
    wall = set()  # (threads, N) of panels timed on the wall clock
    by_panel = defaultdict(dict)  # (threads, N) -> {(pass, impl): GFLOP/s}
    ratio = {}  # (threads, N, pass, impl) -> vs_sgemm
    sgemm = {}  # threads -> GFLOP/s of the square sgemm benchmark
    sgemm_inline = defaultdict(list)  # (threads, N) -> sgemm_GFLOP/s counters
    for name, r in runs.items():
        words, params = fields(name)
        gflops = r["values"].get("GFLOP/s")
        if gflops is None:
            continue
        t = params.get("threads", 1)
        if words[0] == "sgemm":
            if words[1] == "1024x1024x1024":
                sgemm[t] = gflops / 1e9
            continue
        n = params["N"]
        by_panel[(t, n)][(words[0], words[1])] = gflops / 1e9
        if name.endswith("/real_time"):
            wall.add((t, n))
        if "vs_sgemm" in r["values"]:
            ratio[(t, n, words[0], words[1])] = r["values"]["vs_sgemm"]
        if "sgemm_GFLOP/s" in r["values"]:
            sgemm_inline[(t, n)].append(r["values"]["sgemm_GFLOP/s"])
    if not by_panel:
        return None
    panels = sorted(by_panel)
    threads = sorted({t for t, _ in panels})
    sizes = sorted({n for _, n in panels})
    fig, axes = plt.subplots(len(threads), len(sizes), figsize=(max(9.0, 5.2 * len(sizes)), 4.2 * len(threads)),
                             squeeze=False, sharey=True)
    ymax = max(max(v.values()) for v in by_panel.values())
    ymax = max([ymax] + list(sgemm.values())) * 1.12
    for i, t in enumerate(threads):
        for j, n in enumerate(sizes):
            ax = axes[i][j]
            bars = by_panel.get((t, n), {})
            base = sgemm.get(t)
            if base is None and sgemm_inline.get((t, n)):
                base = statistics.median(sgemm_inline[(t, n)])
            x = 0.0
            ticks, ticklabels = [], []
            for p, plabel in PASSES:
                impls = [k for k in VARIANTS if (p, k) in bars]
                if not impls:
                    continue
                x0 = x
                for k in impls:
                    label, colour = VARIANTS[k]
                    v = bars[(p, k)]
                    hatch = "//" if k == "tilegrad_two_pass" else None
                    ax.bar(x, v, width=0.8, color=colour, hatch=hatch, edgecolor="white", label=label, zorder=2)
                    text = f"{v:.0f}"
                    if (t, n, p, k) in ratio:  # vs_sgemm, sgemm timed beside this variant
                        text += f"\n{ratio[(t, n, p, k)]:.2f}×"
                    ax.text(x, v, text, ha="center", va="bottom", fontsize=7, linespacing=1.1, zorder=4,
                            bbox=dict(facecolor="white", edgecolor="none", pad=0.5, alpha=0.8))
                    x += 1
                ticks.append((x0 + x - 1) / 2)
                ticklabels.append(plabel)
                if base and p in TARGETS:
                    ax.hlines(TARGETS[p] * base, x0 - 0.45, x - 0.55, colors="#d62728", linestyles="dashed",
                              label="target (share of sgemm)", zorder=3)
                x += 0.6
            if base:
                ax.axhline(base, color="black", linewidth=1, label="OpenBLAS sgemm 1024³")
                ax.text(x - 0.6, base, f"sgemm {base:.0f}", ha="right", va="bottom", fontsize=8)
            ax.set_xticks(ticks)
            ax.set_xticklabels(ticklabels)
            ax.set_ylim(0, ymax)
            clock = "wall-clock time" if (t, n) in wall else "thread CPU time"
            ax.set_title(f"N = {n}, {t} thread{'s' if t > 1 else ''} ({clock})")
            if j == 0:
                ax.set_ylabel("GFLOP/s (useful causal flops)")
    # One legend for the figure, each label once.
    handles, labels = {}, []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in handles:
                handles[l] = h
                labels.append(l)
    fig.legend([handles[l] for l in labels], labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Causal attention, B = 1, H = 4, d = 64 (bench_attention)\n"
                 "above the bars: GFLOP/s and its ratio to sgemm's, timed beside it", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = out / "bench_attention.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----- anything else ---------------------------------------------------------------------------

RATE_KEYS = [("GFLOP/s", 1e9, "GFLOP/s"), ("FLOPS", 1e9, "GFLOP/s"), ("bytes_per_second", 1e9, "GB/s"),
             ("items_per_second", 1e9, "G items/s")]


def plot_generic(runs, out, stem):
    names = sorted(runs, key=lambda n: (runs[n]["entry"].get("family_index", 0),
                                        runs[n]["entry"].get("per_family_instance_index", 0)))
    key = next((k for k in RATE_KEYS if all(k[0] in runs[n]["values"] for n in names)), None)
    if key:
        values = [runs[n]["values"][key[0]] / key[1] for n in names]
        ylabel = key[2]
    else:
        unit = runs[names[0]]["entry"].get("time_unit", "ns")
        values = [runs[n]["values"]["real_time"] for n in names]
        ylabel = f"time ({unit})"
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(names) + 2), 4.5))
    ax.bar(range(len(names)), values, color="#1f77b4")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=75, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(stem)
    fig.tight_layout()
    path = out / f"{stem}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+", help="Google Benchmark JSON files (--benchmark_out_format=json)")
    ap.add_argument("--out", default="docs/img", help="folder for the PNG files (default: docs/img)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(args.json)
    attention = {n: r for n, r in runs.items() if is_attention(n)}
    others = defaultdict(dict)
    for n, r in runs.items():
        if n not in attention:
            others[r["source"]][n] = r
    written = []
    if attention:
        written.append(plot_attention(attention, out))
    for stem, rs in sorted(others.items()):
        written.append(plot_generic(rs, out, stem))
    for p in written:
        if p:
            print(p)


if __name__ == "__main__":
    main()
