#!/usr/bin/env python3
"""Compare the CPU backend's criterion benchmarks (benches/cpu.rs) with the same work in numpy.

Usage (from anywhere in the repository; needs `pip install numpy`):

    python3 backend-cpu/benches/compare_numpy.py              # build the bench, run both sides
    python3 backend-cpu/benches/compare_numpy.py --repeat 3   # three rounds, medians reported
    python3 backend-cpu/benches/compare_numpy.py --no-bench   # reuse target/criterion results
    python3 backend-cpu/benches/compare_numpy.py --filter matmul

The script builds the criterion bench with `cargo bench -p genesis-backend-cpu --bench cpu
--no-run` and runs its executable once per row (criterion's own output goes to
target/criterion/compare_numpy.log). The Genesis time of a row is criterion's median
(target/criterion/<group>/<name>/new/estimates.json, `median.point_estimate`); the numpy time
is the median of repeated calls timed here with `time.perf_counter` after a warm-up, taken
right after the Genesis run of the same row, so that drifts of a shared machine hit both sides
alike. Both sides use the same number of threads: OPENBLAS_NUM_THREADS (numpy's BLAS) and
RAYON_NUM_THREADS (the backend's pool) are set to --threads (default: every CPU) before numpy
is imported and before the bench runs. numpy's own elementwise loops and reductions are
single-threaded whatever the setting: that is numpy, not a setup error.

ratio = numpy ms / Genesis ms: above 1, Genesis is faster.
GB/s counts the bytes an op must read plus write (write-allocate traffic not counted); GFLOP/s
counts 2*m*n*k for products and convolutions.
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS, COLS = 4096, 1024


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-bench", action="store_true", help="do not run cargo bench; read existing results")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both sides (default: all CPUs)")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds of numpy timing per row (default 1)")
    p.add_argument("--filter", default="", help="regex on group/name: run only the rows it matches")
    p.add_argument("--repeat", type=int, default=1, help="run everything this many times; report medians")
    return p.parse_args()


ARGS = parse_args()
os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
os.environ["RAYON_NUM_THREADS"] = str(ARGS.threads)

import numpy as np  # noqa: E402  (after the thread variables are set)
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402


def target_dir():
    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def genesis_ms(group, name):
    path = target_dir() / "criterion" / group / name / "new" / "estimates.json"
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)["median"]["point_estimate"] / 1e6


def time_ms(fn):
    """Median wall time of `fn()` in ms, over at least 5 calls and `--min-time` seconds."""
    for _ in range(2):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < ARGS.min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def values(shape, seed, lo, hi, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


# ------------------------------------------------------------------------------------------
# The numpy side of every row: (group, name, label, numpy callable or None, metric, amount).
# metric is "GB/s" (amount in bytes) or "GFLOP/s" (amount in flops).
# ------------------------------------------------------------------------------------------


def elementwise_rows():
    n = ROWS * COLS
    a, b = values((ROWS, COLS), 1, -4, 4), values((ROWS, COLS), 2, -4, 4)
    row = values((COLS,), 3, -4, 4)
    y = np.empty_like(a)
    return [
        ("elementwise", "copy_f32", "copy f32 4096x1024", lambda: np.copyto(y, a), "GB/s", 8 * n),
        ("elementwise", "add_f32", "add f32 4096x1024", lambda: np.add(a, b, out=y), "GB/s", 12 * n),
        ("elementwise", "add_f32_bcast", "add f32 4096x1024 + 1024", lambda: np.add(a, row, out=y), "GB/s", 8 * n),
        ("elementwise", "exp_f32", "exp f32 4096x1024", lambda: np.exp(a, out=y), "GB/s", 8 * n),
    ]


def reduce_rows():
    x = values((ROWS, COLS), 4, -1, 1)
    n = ROWS * COLS
    return [
        ("reduce", "sum_rows_f32", "sum f32 4096x1024 -> 4096x1", lambda: x.sum(axis=1, keepdims=True), "GB/s", 4 * n),
        ("reduce", "sum_cols_f32", "sum f32 4096x1024 -> 1x1024", lambda: x.sum(axis=0, keepdims=True), "GB/s", 4 * n),
    ]


def matmul_rows():
    rows = []
    for n in (64, 256, 1024):
        a, b = values((n, n), 5, -1, 1), values((n, n), 6, -1, 1)
        y = np.empty((n, n), np.float32)
        flops = 2 * n**3
        rows.append(("matmul", f"f32_{n}", f"matmul f32 {n}", lambda a=a, b=b, y=y: np.matmul(a, b, out=y),
                     "GFLOP/s", flops))
        # numpy has no bfloat16 (and ml_dtypes' bfloat16 matmul is a plain loop, not BLAS).
        rows.append(("matmul", f"bf16_{n}", f"matmul bf16 {n}", None, "GFLOP/s", flops))
    return rows


def rowwise_rows():
    x = values((ROWS, COLS), 7, -4, 4)
    w, b = values((COLS,), 8, 0.5, 1.5), values((COLS,), 9, -0.5, 0.5)
    y, t = np.empty_like(x), np.empty_like(x)

    def softmax():
        m = x.max(axis=1, keepdims=True)
        np.subtract(x, m, out=y)
        np.exp(y, out=y)
        np.divide(y, y.sum(axis=1, keepdims=True), out=y)

    def layer_norm():
        mu = x.mean(axis=1, keepdims=True)
        np.subtract(x, mu, out=y)
        np.multiply(y, y, out=t)
        rstd = 1.0 / np.sqrt(t.mean(axis=1, keepdims=True) + np.float32(1e-5))
        np.multiply(y, rstd, out=y)
        np.multiply(y, w, out=y)
        np.add(y, b, out=y)

    n = ROWS * COLS
    return [
        ("rowwise", "softmax_f32", "softmax f32 4096x1024", softmax, "GB/s", 8 * n),
        ("rowwise", "layer_norm_f32", "layer norm f32 4096x1024", layer_norm, "GB/s", 8 * n),
    ]


def conv_rows():
    n, c, h, w, o, k = 8, 64, 56, 56, 64, 3
    x = values((n, c, h, w), 10, -1, 1)
    weight = values((o, c, k, k), 11, -0.1, 0.1)

    def conv():
        # im2col by a strided view, then one BLAS product (tensordot copies the windows).
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        win = sliding_window_view(xp, (k, k), axis=(2, 3))  # (n, c, h, w, k, k)
        out = np.tensordot(win, weight, axes=([1, 4, 5], [1, 2, 3]))  # (n, h, w, o)
        return np.ascontiguousarray(out.transpose(0, 3, 1, 2))

    flops = 2 * n * o * h * w * c * k * k
    return [("conv2d", "f32_8x64x56x56_k3", "conv2d f32 8x64x56x56, 64x3x3, pad 1", conv, "GFLOP/s", flops)]


def adamw_rows():
    sizes = (4_000_000, 3_000_000, 2_000_000, 1_000_000)
    groups = []
    for i, size in enumerate(sizes):
        s = 20 + 4 * i
        groups.append((values(size, s, -1e-2, 1e-2), values(size, s + 1, -1, 1), values(size, s + 2, -1e-3, 1e-3),
                       values(size, s + 3, 0, 1e-5), np.empty(size, np.float32)))
    lr, b1, b2, eps, wd, step = 1e-3, 0.9, 0.999, 1e-8, 0.01, 10
    f = np.float32
    decay, step_size = f(1 - lr * wd), f(lr / (1 - b1**step))
    bc2_sqrt = f((1 - b2**step) ** 0.5)

    def adamw():
        # PyTorch's update rule (as the op documents it), in place, with one scratch buffer.
        for g, p, m, v, t in groups:
            np.multiply(g, f(1 - b1), out=t)
            m *= f(b1)
            m += t
            np.multiply(g, g, out=t)
            t *= f(1 - b2)
            v *= f(b2)
            v += t
            np.sqrt(v, out=t)
            t /= bc2_sqrt
            t += f(eps)
            np.divide(m, t, out=t)
            t *= step_size
            p *= decay
            p -= t

    total = sum(sizes)
    return [("adamw", "f32_10m", "adamw f32, 10M params in 4 tensors", adamw, "GB/s", 28 * total)]


def reference_rows():
    """The memory-bandwidth reference: a copy of 256 MiB, far beyond the last-level cache."""
    a = np.ones(64 * 2**20, np.float32)
    y = np.empty_like(a)
    return [("elementwise", "copy_f32_256mib", "copy f32 256 MiB (bandwidth reference)", lambda: np.copyto(y, a),
             "GB/s", 2 * a.nbytes)]


def fmt(v, digits=3):
    if v is None:
        return "—"
    return f"{v:.{digits}g}" if v < 100 else f"{v:.0f}"


def bench_executable():
    """Build the criterion bench (if needed) and return the path of its executable."""
    cmd = ["cargo", "bench", "-p", "genesis-backend-cpu", "--bench", "cpu", "--no-run", "--message-format=json"]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "cpu" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo did not report the bench executable")


def run_genesis(exe, group, name, log):
    """Run one criterion benchmark and return its median in ms."""
    subprocess.run([exe, "--bench", f"^{group}/{name}$"], cwd=ROOT, check=True, stdout=log, stderr=log)
    return genesis_ms(group, name)


def blas_info():
    try:
        import ctypes

        libs = glob.glob(str(Path(np.__file__).parent.parent / "numpy.libs" / "libscipy_openblas*"))
        lib = ctypes.CDLL(libs[0])
        lib.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
        return (f"OpenBLAS kernel {lib.scipy_openblas_get_corename64_().decode()}, "
                f"{lib.scipy_openblas_get_num_threads64_()} threads")
    except Exception:  # a numpy built against another BLAS: say nothing rather than guess
        return "BLAS unknown"


def main():
    rows = elementwise_rows() + reduce_rows() + matmul_rows() + rowwise_rows() + conv_rows() + adamw_rows()
    rows += reference_rows()
    rows = [r for r in rows if re.search(ARGS.filter, f"{r[0]}/{r[1]}" if r[0] else r[2])]
    exe = None if ARGS.no_bench else bench_executable()
    # Each row runs its criterion benchmark and then its numpy twin, so that slow drifts of a
    # shared machine hit both sides alike; --repeat runs the whole list again.
    results = {i: ([], []) for i in range(len(rows))}
    log_path = target_dir() / "criterion" / "compare_numpy.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        for rep in range(ARGS.repeat):
            print(f"run {rep + 1}/{ARGS.repeat}", file=sys.stderr, flush=True)
            for i, (group, name, label, fn, _, _) in enumerate(rows):
                if group:
                    g = run_genesis(exe, group, name, log) if exe else genesis_ms(group, name)
                    if g is not None:
                        results[i][0].append(g)
                if fn:
                    results[i][1].append(time_ms(fn))
                print(f"  {label}", file=sys.stderr, flush=True)

    print(f"numpy {np.__version__} ({blas_info()}); RAYON_NUM_THREADS={ARGS.threads}; {os.cpu_count()} CPUs; "
          f"medians of {ARGS.repeat} run(s)\n")
    ranged = ARGS.repeat > 1
    print("| work | Genesis ms | numpy ms | ratio (numpy/Genesis) |" + (" ratio range |" if ranged else "")
          + " Genesis rate | numpy rate |")
    print("|---|---:|---:|---:|" + ("---:|" if ranged else "") + "---:|---:|")
    for i, (group, name, label, fn, metric, amount) in enumerate(rows):
        gs, ns = results[i]
        g = statistics.median(gs) if gs else None
        npm = statistics.median(ns) if ns else None
        ratio = npm / g if (g and npm) else None
        per_run = [b / a for a, b in zip(gs, ns)]
        spread = f"{fmt(min(per_run))}–{fmt(max(per_run))}" if per_run else "—"
        rate = lambda ms: amount / (ms * 1e-3) / 1e9 if ms else None  # noqa: E731
        print(f"| {label} | {fmt(g)} | {fmt(npm)} | {fmt(ratio)} |" + (f" {spread} |" if ranged else "")
              + f" {fmt(rate(g))} {metric if g else ''} | {fmt(rate(npm))} {metric if npm else ''} |", flush=True)


if __name__ == "__main__":
    main()
