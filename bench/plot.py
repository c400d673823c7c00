#!/usr/bin/env python3
"""Charts of Google Benchmark JSON files, for the performance page (docs/performance.md).

A developer tool, not a build dependency: it needs Python 3 and matplotlib (on Debian, the
package python3-matplotlib: `apt-get install python3-matplotlib`, then run it with
/usr/bin/python3).

    /usr/bin/python3 bench/plot.py docs/data/bench_attention.json \
        docs/data/bench_attention_2threads.json --out docs/img
    /usr/bin/python3 bench/plot.py ours.json torch.json --out docs/img

Files are read together, so one benchmark program's runs (say, one thread and two threads)
can come from several files. Every figure takes, per benchmark, the median over its
repetitions: the `_median` aggregate when the file has aggregates only, else the median of
its iteration entries.

- bench_attention's benchmarks (fwd/..., bwd/..., fwd_bwd/..., sgemm/...) give
  bench_attention.png: GFLOP/s of each variant per pass, one panel per sequence length and
  thread count, with OpenBLAS sgemm's GFLOP/s (1024 x 1024 x 1024, same threads) and the
  targets (forward 60 %, backward 40 % of it) drawn across.
- bench_attention's sdpa/<library>/<dtype>/<pass>/H:h/N:n/threads:t benchmarks, read together
  with bench/torch_sdpa.py's output (the same names with the library torch; ours.json and
  torch.json above), give sdpa.png: GFLOP/s against N (log2 axis) of tilegrad fp32 and bf16
  (and the atomic-dQ backward where timed) beside PyTorch fp32 and bf16, one panel per pass,
  thread count and H that has more than one N. Two markdown tables go to standard output: the
  times of tilegrad and PyTorch on every case both have, with tilegrad's speed over PyTorch's
  (PyTorch's time over tilegrad's), and the thread scaling at H = 16, N = 4096 (GFLOP/s on t
  threads over GFLOP/s on the fewest threads present, per library, dtype and pass).
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
    """'fwd/tilegrad/N:1024/threads:2/real_time' -> (['fwd', 'tilegrad'], {'N': 1024, ...}).

    Google Benchmark's own parts (min_time:0.500, repetitions:3, ...) land among the params."""
    words, params = [], {}
    for part in run_name.split("/"):
        m = re.fullmatch(r"(\w+):(\d+)(\.\d+)?", part)
        if m:
            params[m.group(1)] = float(m.group(2) + m.group(3)) if m.group(3) else int(m.group(2))
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


# ----- beside PyTorch's scaled_dot_product_attention ------------------------------------------

SDPA_LINES = {  # (library, dtype) -> (label, colour, line style)
    ("tilegrad", "fp32"): ("tilegrad fp32", "#08519c", "-"),
    ("tilegrad", "bf16"): ("tilegrad bf16", "#6baed6", "-"),
    ("tilegrad_atomic_dq", "fp32"): ("tilegrad fp32, atomic-dQ backward", "#08519c", ":"),
    ("tilegrad_atomic_dq", "bf16"): ("tilegrad bf16, atomic-dQ backward", "#6baed6", ":"),
    ("torch", "fp32"): ("PyTorch fp32", "#d94801", "--"),
    ("torch", "bf16"): ("PyTorch bf16", "#fd8d3c", "--"),
}
SDPA_PASSES = {"fwd": "forward", "fwd_bwd": "forward + backward"}
TIME_UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def is_sdpa(name):
    return name.startswith("sdpa/")


def sdpa_points(runs):
    """{(library, dtype, pass, H, N, threads): (ms per call, GFLOP/s)} of the sdpa/... runs."""
    points = {}
    for name, r in runs.items():
        words, params = fields(name)
        if len(words) != 4 or not {"H", "N"} <= params.keys():
            print(f"{name}: not sdpa/<library>/<dtype>/<pass>/H:h/N:n/threads:t", file=sys.stderr)
            continue
        _, lib, dtype, pass_ = words
        ms = r["values"]["real_time"] * TIME_UNITS[r["entry"].get("time_unit", "ns")]
        gflops = r["values"].get("GFLOP/s", float("nan")) / 1e9
        points[(lib, dtype, pass_, params["H"], params["N"], params.get("threads", 1))] = (ms, gflops)
    return points


def plot_sdpa(points, out, torch_version=None):
    """sdpa.png: GFLOP/s against N, one panel per pass, thread count and H with more than one N."""
    series = defaultdict(dict)  # (pass, threads, H) -> {(library, dtype): {N: GFLOP/s}}
    for (lib, dtype, p, h, n, t), (_, g) in points.items():
        series[(p, t, h)].setdefault((lib, dtype), {})[n] = g
    panels = [k for k, lines in series.items() if len({n for l in lines.values() for n in l}) > 1]
    if not panels:
        return None
    rows = sorted({(t, h) for _, t, h in panels}, key=lambda th: (-th[0], th[1]))
    cols = sorted({p for p, _, _ in panels}, key=pass_order)
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(5.6 * len(cols), 4.2 * len(rows)), squeeze=False)
    order_of_label = {}
    for i, (t, h) in enumerate(rows):
        for j, p in enumerate(cols):
            ax = axes[i][j]
            lines = series.get((p, t, h)) if (p, t, h) in panels else None
            if not lines:
                ax.set_visible(False)
                continue
            sizes = sorted({n for l in lines.values() for n in l})
            for key in sorted(lines, key=lambda k: list(SDPA_LINES).index(k) if k in SDPA_LINES else 99):
                label, colour, style = SDPA_LINES.get(key, (" ".join(key), "#969696", "-."))
                if key[0] == "torch" and torch_version:
                    label = label.replace("PyTorch", f"PyTorch {torch_version}")
                order_of_label[label] = list(SDPA_LINES).index(key) if key in SDPA_LINES else 99
                ns = sorted(lines[key])
                ax.plot(ns, [lines[key][n] for n in ns], style, color=colour, marker="o", markersize=4,
                        label=label)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes)
            ax.set_xticklabels([str(n) for n in sizes])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_xlabel("N (sequence length)")
            ax.set_title(f"{SDPA_PASSES.get(p, p)}, H = {h}, {t} thread{'s' if t > 1 else ''}")
            if j == 0:
                ax.set_ylabel("GFLOP/s (useful causal flops)")
    # One legend for the figure, each label once, in SDPA_LINES' order: two rows, a column per line kind.
    handles = {}
    for ax in axes.flat:
        for hd, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, hd)
    labels = sorted(handles, key=lambda l: order_of_label.get(l, 99))
    fig.legend([handles[l] for l in labels], labels, loc="lower center", ncol=(len(labels) + 1) // 2,
               fontsize=8, frameon=False)
    fig.suptitle("Causal attention, B = 1, d = 64: tilegrad's FlashAttention-2 and PyTorch's CPU\n"
                 "scaled_dot_product_attention (wall-clock time, median of repetitions)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07 / len(rows) ** 0.5, 1, 1))
    path = out / "sdpa.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pass_order(p):
    return (list(SDPA_PASSES).index(p) if p in SDPA_PASSES else len(SDPA_PASSES), p)


def dtype_order(dtype):
    return (["fp32", "bf16"].index(dtype) if dtype in ("fp32", "bf16") else 2, dtype)


def sdpa_tables(points):
    """Markdown: tilegrad against PyTorch per case, then the thread scaling at H = 16, N = 4096."""
    text = []
    cases = sorted({k[1:] for k in points if k[0] == "tilegrad" and ("torch",) + k[1:] in points},
                   key=lambda c: (pass_order(c[1]), dtype_order(c[0]), -c[4], c[2], c[3]))
    # Another variant of ours (sdpa/tilegrad_<variant>/...), in two more columns where present.
    alt = next((k[0] for k in points if k[0].startswith("tilegrad_")), None)
    has_alt = alt is not None and any((alt,) + c in points for c in cases)
    if cases:
        head = ["case", "tilegrad ms", "torch ms", "tilegrad ÷ torch speed"]
        if has_alt:
            variant = alt[len("tilegrad_"):].replace("_", " ")
            head += [f"{variant} ms", f"{variant} ÷ torch speed"]
        text += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in cases:
            dtype, p, h, n, t = c
            ours, theirs = points[("tilegrad",) + c][0], points[("torch",) + c][0]
            row = [f"{dtype} {p} H={h} N={n} threads={t}", f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.2f}×"]
            if has_alt:
                tp = points.get((alt,) + c)
                row += [f"{tp[0]:.2f}", f"{theirs / tp[0]:.2f}×"] if tp else ["—", "—"]
            text.append("| " + " | ".join(row) + " |")
    # Thread scaling: GFLOP/s on t threads over GFLOP/s on the fewest threads present.
    scaling = defaultdict(dict)  # (library, dtype, pass) -> {threads: GFLOP/s}
    for (lib, dtype, p, h, n, t), (_, g) in points.items():
        if h == 16 and n == 4096:
            scaling[(lib, dtype, p)][t] = g
    scaling = {k: v for k, v in scaling.items() if len(v) > 1}
    if scaling:
        threads = sorted({t for v in scaling.values() for t in v})
        head = ["library", "dtype", "pass"] + [f"{t} thr" for t in threads]
        if text:
            text.append("")
        text += ["Thread scaling, H = 16, N = 4096: GFLOP/s and, in brackets, its ratio to the GFLOP/s "
                 "on the fewest threads present for that row.", ""]
        text += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        libs = list(dict.fromkeys(l for l, _ in SDPA_LINES))
        for k in sorted(scaling, key=lambda k: (libs.index(k[0]) if k[0] in libs else 99, k[0], dtype_order(k[1]),
                                                pass_order(k[2]))):
            v = scaling[k]
            base = v[min(v)]
            cells = [f"{v[t]:.0f} ({v[t] / base:.2f}×)" if t in v else "—" for t in threads]
            text.append("| " + " | ".join(list(k) + cells) + " |")
    return "\n".join(text)


def torch_version_of(paths):
    """The torch_version a torch_sdpa.py file records in its context, if any."""
    for path in paths:
        with open(path) as f:
            version = json.load(f).get("context", {}).get("torch_version")
        if version:
            return version
    return None


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
    sdpa = {n: r for n, r in runs.items() if is_sdpa(n)}
    others = defaultdict(dict)
    for n, r in runs.items():
        if n not in attention and n not in sdpa:
            others[r["source"]][n] = r
    written = []
    if attention:
        written.append(plot_attention(attention, out))
    if sdpa:
        points = sdpa_points(sdpa)
        tables = sdpa_tables(points)
        if tables:
            print(tables + "\n")
        written.append(plot_sdpa(points, out, torch_version_of(args.json)))
    for stem, rs in sorted(others.items()):
        written.append(plot_generic(rs, out, stem))
    for p in written:
        if p:
            print(p)


if __name__ == "__main__":
    main()
