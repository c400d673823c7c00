#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention timed on bench_attention's sdpa/... cases.

The results are written in Google Benchmark's JSON format, so that bench/plot.py reads them
beside bench_attention's. A developer tool, not a build dependency: it needs Python 3.11+ and
PyTorch (a CPU build will do).

    PYTHONUNBUFFERED=1 python3 bench/torch_sdpa.py --out torch.json
    /usr/bin/python3 bench/plot.py ours.json torch.json --out docs/img

Each case is causal attention, B = 1, H heads of N rows, head dim 64: q, k, v of shape
(B, H, N, d) from torch.randn (seeded, --seed), in fp32 or bf16, on torch.set_num_threads(t).

- fwd: out = scaled_dot_product_attention(q, k, v, is_causal=True) under torch.no_grad(), on
  tensors that do not require gradients.
- fwd_bwd: the same forward on q, k, v that require gradients, then out.backward(d_o) with d_o
  from torch.randn; q.grad, k.grad and v.grad are set to None before each call, so no call adds
  into the gradients of the one before.

Default cases (those bench_attention registers as sdpa/tilegrad/...): 1 thread on H = 4,
N = 1024 and 4096; 16 threads on H = 16, N = 1024, 4096 and 16384; and H = 16, N = 4096 on
1, 2, 4 and 8 threads for the thread scaling. Every case runs in both dtypes and both passes.
--threads and --n replace the default cases by every thread count times every size (the sizes
of a thread count default to those above, 4096 for a count not above), with H from
--heads-per-threads (default "1:4,16": 1 thread H = 4, any other count H = 16) unless --heads
gives it. --quick keeps N = 1024 only, for a smoke test.

Timing: wall clock (time.perf_counter). One call to warm up, then calls until --min-time
seconds have passed and at least two calls (one when the warm-up call alone took longer than
--min-time); that measurement is repeated --repetitions times. Each repetition is written as an
"iteration" entry and their median as a "_median" aggregate entry, in milliseconds per call, as
Google Benchmark writes them; cpu_time is the calling thread's CPU time. Counters: GFLOP/s (in
flop/s, as Google Benchmark writes a rate counter, with bench_attention's flop convention:
forward 4 N^2 d / 2 per head, backward 2.5 times that, forward + backward 3.5 times), threads,
N and H.

Names: sdpa/torch/<dtype>/<pass>/H:<h>/N:<n>/threads:<t>, dtype fp32 or bf16, pass fwd or
fwd_bwd; bench_attention's are the same with tilegrad in place of torch (and /real_time at the
end, which bench/plot.py ignores). A case that raises is reported on stderr, written as an
entry with error_occurred, and skipped. A table of the results goes to stderr as they come; with
--out, the JSON file is rewritten after every case, so an interrupted run keeps what it timed.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

D = 64
BATCH = 1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PASSES = ("fwd", "fwd_bwd")
PASS_FACTOR = {"fwd": 1.0, "fwd_bwd": 3.5}  # flops relative to the forward's
# (threads, H, N), as bench_attention registers its sdpa/tilegrad/... benchmarks.
DEFAULT_CASES = [(1, 4, 1024), (1, 4, 4096),
                 (16, 16, 1024), (16, 16, 4096), (16, 16, 16384),
                 (1, 16, 4096), (2, 16, 4096), (4, 16, 4096), (8, 16, 4096)]
DEFAULT_THREADS = (1, 2, 4, 8, 16)


def forward_flops(h, n, d=D, batch=BATCH):
    """Useful flops of a causal forward: two N x N x d products per head, half masked out."""
    return h * batch * 4 * n * n * d / 2


def parse_heads_rule(text):
    """'1:4,16' -> ({1: 4}, 16): heads for given thread counts, then for any other count."""
    given, other = {}, None
    for part in text.split(","):
        part = part.strip()
        if ":" in part:
            t, h = part.split(":")
            given[int(t)] = int(h)
        elif part:
            other = int(part)
    if other is None:
        raise argparse.ArgumentTypeError(f"{text!r}: no heads for other thread counts (say '1:4,16')")
    return given, other


def default_sizes(threads):
    return sorted({n for t, _, n in DEFAULT_CASES if t == threads}) or [4096]


def build_cases(args):
    """[(threads, H, N)] in the order they run."""
    if args.threads is None and args.n is None:
        cases = [c for c in DEFAULT_CASES if not args.quick or c[2] == 1024]
    else:
        given, other = args.heads_per_threads
        cases = []
        for t in args.threads or DEFAULT_THREADS:
            sizes = args.n or ([1024] if args.quick else default_sizes(t))
            cases += [(t, given.get(t, other), n) for n in sizes]
    if args.heads is not None:
        cases = [(t, args.heads, n) for t, _, n in cases]
    return list(dict.fromkeys(cases))  # without repeats, in order


# ----- one case ---------------------------------------------------------------------------------

def make_call(pass_, h, n, dtype, seed):
    """A function that runs the pass once on fresh seeded inputs."""
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, h, n, D)
    q, k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(3))
    if pass_ == "fwd":
        def call():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return call
    d_o = torch.randn(shape, generator=g).to(dtype)
    for x in (q, k, v):
        x.requires_grad_(True)

    def call():
        q.grad = k.grad = v.grad = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(d_o)
    return call


def measure(call, min_time, repetitions):
    """[(calls, wall seconds, thread CPU seconds)] per repetition, after one warm-up call."""
    t0 = time.perf_counter()
    call()
    warm_up = time.perf_counter() - t0
    min_calls = 1 if warm_up > min_time else 2
    reps = []
    for _ in range(repetitions):
        calls = 0
        c0, w0 = time.thread_time(), time.perf_counter()
        while True:
            call()
            calls += 1
            w = time.perf_counter()
            if calls >= min_calls and w - w0 >= min_time:
                break
        reps.append((calls, w - w0, time.thread_time() - c0))
    return reps


def entries(name, index, threads, h, n, pass_, reps):
    """Google Benchmark entries: one per repetition and the _median aggregate."""
    flops = PASS_FACTOR[pass_] * forward_flops(h, n)
    common = {"name": name, "family_index": index[0], "per_family_instance_index": index[1],
              "run_name": name, "run_type": "iteration", "repetitions": len(reps)}
    out = []
    for i, (calls, wall, cpu) in enumerate(reps):
        out.append(common | {"repetition_index": i, "threads": float(threads), "iterations": calls,
                             "real_time": 1e3 * wall / calls, "cpu_time": 1e3 * cpu / calls,
                             "time_unit": "ms", "GFLOP/s": flops * calls / wall,
                             "H": float(h), "N": float(n)})
    median = common | {"name": name + "_median", "run_type": "aggregate", "threads": float(threads),
                       "aggregate_name": "median", "aggregate_unit": "time", "iterations": len(reps)}
    for key in ("real_time", "cpu_time"):
        median[key] = statistics.median(e[key] for e in out)
    median["time_unit"] = "ms"
    median["GFLOP/s"] = statistics.median(e["GFLOP/s"] for e in out)
    median |= {"H": float(h), "N": float(n)}
    return out + [median]


def error_entry(name, index, threads, message):
    return {"name": name, "family_index": index[0], "per_family_instance_index": index[1],
            "run_name": name, "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
            "threads": float(threads), "iterations": 0, "real_time": 0.0, "cpu_time": 0.0,
            "time_unit": "ms", "error_occurred": True, "error_message": message}


# ----- context and output -----------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def context(args):
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "host_name": socket.gethostname(),
        "executable": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "num_cpus": os.cpu_count(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
        "library": "torch",
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "cpu_model": cpu_model(),
        "torch_num_threads_default": torch.get_num_threads(),
        "attention": f"causal, B={BATCH}, d={D}, torch.nn.functional.scaled_dot_product_attention",
        "timing": f"wall clock, warm-up call, >= {args.min_time} s per repetition, "
                  f"{args.repetitions} repetitions",
    }
    try:
        lines = [l.strip() for l in torch.__config__.parallel_info().splitlines() if l.strip()]
        info["torch_parallel_info"] = "; ".join(lines[:6])
    except Exception as e:  # noqa: BLE001 (context only)
        info["torch_parallel_info"] = f"unavailable: {e}"
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if capability:
        info["torch_cpu_capability"] = capability()
    return info


def write_json(path, ctx, benchmarks):
    text = json.dumps({"context": ctx, "benchmarks": benchmarks}, indent=2) + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def log(text):
    print(text, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--out", type=Path, help="JSON file to write (default: standard output)")
    ap.add_argument("--threads", type=int, nargs="+", help="thread counts (default: the default cases)")
    ap.add_argument("--n", type=int, nargs="+", help="sequence lengths (default: the default cases)")
    ap.add_argument("--heads", type=int, help="heads H of every case (default: --heads-per-threads)")
    ap.add_argument("--heads-per-threads", type=parse_heads_rule, default=parse_heads_rule("1:4,16"),
                    metavar="T:H,...,H", help="H per thread count, then for any other count, for "
                    "cases built from --threads/--n (default: 1:4,16)")
    ap.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                    help="storage types (default: fp32 bf16)")
    ap.add_argument("--pass", dest="passes", nargs="+", choices=PASSES, default=list(PASSES),
                    help="passes (default: fwd fwd_bwd)")
    ap.add_argument("--min-time", type=float, default=0.5,
                    help="seconds per repetition, at least (default: 0.5)")
    ap.add_argument("--repetitions", type=int, default=3, help="repetitions per case (default: 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of q, k, v and d_o (default: 0)")
    ap.add_argument("--quick", action="store_true", help="N = 1024 only: a smoke test")
    args = ap.parse_args()
    if args.repetitions < 1:
        ap.error("--repetitions must be at least 1")

    cases = build_cases(args)
    ctx = context(args)
    benchmarks = []
    log(f"torch {torch.__version__}, {ctx['cpu_model']}, {os.cpu_count()} CPUs, "
        f"{len(cases) * len(args.dtype) * len(args.passes)} runs")
    log(f"{'name':<48} {'ms':>10} {'GFLOP/s':>9}")
    families = [(dt, p) for dt in args.dtype for p in args.passes]
    instance = dict.fromkeys(families, 0)
    cpus = os.cpu_count() or 1
    try:
        for threads, h, n in cases:
            if threads > cpus:
                log(f"note: {threads} threads on {cpus} CPUs")
            torch.set_num_threads(threads)
            for dt, p in families:
                name = f"sdpa/torch/{dt}/{p}/H:{h}/N:{n}/threads:{threads}"
                index = (families.index((dt, p)), instance[(dt, p)])
                instance[(dt, p)] += 1
                try:
                    call = make_call(p, h, n, DTYPES[dt], args.seed)
                    reps = measure(call, args.min_time, args.repetitions)
                    del call
                except Exception as e:  # noqa: BLE001 (reported, then skipped)
                    message = f"{type(e).__name__}: {e}".splitlines()[0]
                    log(f"{name:<48} skipped: {message}")
                    benchmarks.append(error_entry(name, index, threads, message))
                    continue
                es = entries(name, index, threads, h, n, p, reps)
                benchmarks += es
                log(f"{name:<48} {es[-1]['real_time']:10.3f} {es[-1]['GFLOP/s'] / 1e9:9.1f}")
            if args.out is not None:
                write_json(args.out, ctx, benchmarks)
    except KeyboardInterrupt:
        log("interrupted: writing the runs so far")
        write_json(args.out, ctx, benchmarks)
        sys.exit(130)
    write_json(args.out, ctx, benchmarks)
    if args.out is not None:
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
