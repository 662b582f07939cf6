"""PyTorch side of the GPU benchmark: the work of PERFORMANCE.md, as `cuda_bench` runs it on
the Genesis CUDA plugin, in PyTorch eager on the same GPU.

    python3 torch_bench.py [--json torch.json] [--genesis genesis.json] [--out bench.md] [--filter SUBSTR]

Timing: CUDA events around N back-to-back calls (N chosen so a round lasts about 20 ms), median
of 7 rounds after a warm-up, rotating between copies of working sets under 100 MiB exactly as
cuda_bench does, so the L2 cache serves neither side. The host-side rows (allocator, small-op
overhead) use the host clock on both sides, and so do the all-reduce rows (only with two or more
GPUs: single-process NCCL over all of them, like the plugin's collective).

With --genesis, prints the combined markdown table (and writes it to --out): work, Genesis,
PyTorch, speed-up (PyTorch ms / Genesis ms), the PERFORMANCE.md goal, whether it is met, and
the fraction of the floor (floor ms / Genesis ms). Bandwidth floors are bytes moved at the
device-to-device copy bandwidth measured in this run (the better of the two sides); compute
floors are FLOPs at the best GEMM rate of this run (or the PERFORMANCE.md H200 ceiling, on an
H200, when that is higher). The work names are the join key with cuda_bench.rs: keep them in step.
"""
import argparse
import datetime
import json
import math
import statistics
import sys
import time

ROUNDS = 7
ROUND_MS = 20.0
ROTATE_BELOW = 100 << 20
ROTATE_TOTAL = 256 << 20
S = 4096
MiB = 1 << 20

# PERFORMANCE.md: measured H200 GEMM ceilings, FLOP/s.
H200_GEMM = {"bf16": 870e12, "f32": 67e12, "tf32": 2 * S**3 / 0.28e-3}

ATT = (8, 16, 1024, 64)
# Causal attention: QK^T and PV over half the score matrix; the backward is 2.5 times that
# (five products, one of them the recomputed scores).
ATT_FWD_FLOPS = 4 * ATT[0] * ATT[1] * ATT[2] ** 2 * ATT[3] / 2
ATT_BWD_FLOPS = 2.5 * ATT_FWD_FLOPS
CE = (8192, 32000)
ADAMW_SIZES = [4096 * 6144 if i % 2 == 0 else 4096 * 4096 for i in range(24)]
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
ALLOC_SIZES = [4 << 20, 123, 64 << 20, 3000, 1 << 20, 17 << 20, 512, 40_000, 9 << 20, 1]

SIZE = {"f32": 4, "bf16": 2}
ALL_REDUCE_ELEMS = 64 << 20


def works():
    """Every row: name, working-set bytes for the rotation, floor (bytes at copy bandwidth or
    flops at a GEMM rate), goal (min speed-up, min fraction of copy bandwidth, or max us)."""
    n = S * S
    rows = [
        dict(work="copy 4096x4096 f32", bytes=2 * n * 4, floor_bytes=2 * n * 4),
        dict(work="transpose copy 4096x4096 f32", bytes=2 * n * 4, floor_bytes=2 * n * 4),
    ]
    for d in ("f32", "bf16"):
        rows.append(dict(work=f"add 4096x4096 {d}", bytes=3 * n * SIZE[d], floor_bytes=3 * n * SIZE[d],
                         goal=1.0 if d == "f32" else 1.3, goal_floor=0.9 if d == "f32" else None))
    rows.append(dict(work="broadcast add 4096x4096 + 4096 f32", bytes=2 * n * 4, floor_bytes=2 * n * 4, goal=1.5))
    for d in ("f32", "bf16"):
        for over in ("rows", "columns"):
            rows.append(dict(work=f"sum over {over} 4096x4096 {d}", bytes=n * SIZE[d], floor_bytes=n * SIZE[d]))
    rows += [
        dict(work="matmul 4096^3 bf16", bytes=3 * n * 2, flops=2 * S**3, gemm="bf16", goal=0.97),
        dict(work="matmul 4096^3 f32 (IEEE)", bytes=3 * n * 4, flops=2 * S**3, gemm="f32", goal=0.97),
        dict(work="matmul 4096^3 f32 (TF32)", bytes=3 * n * 4, flops=2 * S**3, gemm="tf32", goal=0.97),
    ]
    for d in ("f32", "bf16"):
        m = 8192 * 8192
        rows.append(dict(work=f"softmax 8192x8192 {d}", bytes=2 * m * SIZE[d], floor_bytes=2 * m * SIZE[d],
                         goal=2.0 if d == "f32" else 3.0))
    for d in ("f32", "bf16"):
        m = 8192 * 8192
        # Reads y and dy, writes dx; no PERFORMANCE.md goal.
        rows.append(dict(work=f"softmax backward 8192x8192 {d}", bytes=3 * m * SIZE[d], floor_bytes=3 * m * SIZE[d]))
    for name in ("layer norm", "rms norm"):
        for d in ("f32", "bf16"):
            rows.append(dict(work=f"{name} 4096x4096 {d} forward", bytes=2 * n * SIZE[d],
                             floor_bytes=2 * n * SIZE[d], goal=1.5))
            rows.append(dict(work=f"{name} 4096x4096 {d} backward", bytes=3 * n * SIZE[d],
                             floor_bytes=3 * n * SIZE[d], goal=1.3))
    att = "causal attention B8 H16 S1024 D64 bf16"
    qkv = math.prod(ATT) * 2
    rows += [
        dict(work=f"{att} forward", bytes=4 * qkv, flops=ATT_FWD_FLOPS, gemm="bf16", goal=1.0),
        dict(work=f"{att} forward+backward", bytes=8 * qkv, flops=ATT_FWD_FLOPS + ATT_BWD_FLOPS, gemm="bf16",
             goal=1.0),
    ]
    for d in ("f32", "bf16"):
        m = CE[0] * CE[1] * SIZE[d]
        rows.append(dict(work=f"cross-entropy 8192x32000 {d} forward", bytes=m, floor_bytes=m, goal=2.5))
        # Fused ideal: read the logits once, write their gradient once.
        rows.append(dict(work=f"cross-entropy 8192x32000 {d} forward+backward", bytes=2 * m, floor_bytes=2 * m,
                         goal=2.5))
    total = sum(ADAMW_SIZES)
    # Reads grad, param, exp_avg, exp_avg_sq; writes the last three.
    rows.append(dict(work="adamw step 24 tensors 503M params f32", bytes=7 * 4 * total, floor_bytes=7 * 4 * total,
                     goal=1.0, goal_floor=0.85))
    rows.append(dict(work="caching allocator 1000 mixed alloc/free", goal=1.0))
    rows.append(dict(work="small-op overhead (tiny add, host per op)", unit="us", goal_us=3.0))
    return rows


def n_sets(nbytes):
    if not nbytes or nbytes >= ROTATE_BELOW:
        return 1
    return min(8, max(2, -(-ROTATE_TOTAL // nbytes)))


def timed(fns):
    """Median ms per call, cycling over `fns` (one per working set)."""
    import torch
    for f in fns:
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for f in fns:
        f()
    end.record()
    end.synchronize()
    estimate = start.elapsed_time(end) / len(fns)
    reps = min(5000, max(len(fns), 3, math.ceil(ROUND_MS / max(estimate, 1e-4))))
    samples = []
    for _ in range(ROUNDS):
        start.record()
        for r in range(reps):
            fns[r % len(fns)]()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


def build(w, sets):
    """One callable per working set doing the row's work."""
    import torch
    import torch.nn.functional as F
    name = w["work"]
    dt = torch.bfloat16 if " bf16" in name else torch.float32
    dev = "cuda"

    def rnd(*shape, lo=-2.0, hi=2.0, dtype=dt):
        return torch.empty(*shape, device=dev, dtype=dtype).uniform_(lo, hi)

    fns = []
    for _ in range(sets):
        if name.startswith("copy") or name.startswith("transpose copy"):
            a, y = rnd(S, S), torch.empty(S, S, device=dev, dtype=dt)
            src = a.t() if name.startswith("transpose") else a
            fns.append(lambda y=y, src=src: y.copy_(src))
        elif name.startswith("add"):
            a, b, y = rnd(S, S), rnd(S, S), torch.empty(S, S, device=dev, dtype=dt)
            fns.append(lambda a=a, b=b, y=y: torch.add(a, b, out=y))
        elif name.startswith("broadcast add"):
            a, row, y = rnd(S, S), rnd(S), torch.empty(S, S, device=dev, dtype=dt)
            fns.append(lambda a=a, row=row, y=y: torch.add(a, row, out=y))
        elif name.startswith("sum over"):
            a = rnd(S, S)
            dim = 1 if "rows" in name else 0
            y = torch.empty((S, 1) if dim == 1 else (1, S), device=dev, dtype=dt)
            fns.append(lambda a=a, y=y, dim=dim: torch.sum(a, dim=dim, keepdim=True, out=y))
        elif name.startswith("matmul"):
            a, b, y = rnd(S, S, lo=-1, hi=1), rnd(S, S, lo=-1, hi=1), torch.empty(S, S, device=dev, dtype=dt)
            fns.append(lambda a=a, b=b, y=y: torch.matmul(a, b, out=y))
        elif name.startswith("softmax backward"):
            # The kernel autograd runs for softmax (aten's _softmax_backward_data), called alone.
            y = torch.softmax(rnd(8192, 8192, lo=-4, hi=4).float(), dim=-1).to(dt)
            dy = rnd(8192, 8192, lo=-1, hi=1)
            fns.append(lambda y=y, dy=dy: torch.ops.aten._softmax_backward_data(dy, y, -1, dt))
        elif name.startswith("softmax"):
            x = rnd(8192, 8192, lo=-4, hi=4)
            fns.append(lambda x=x: F.softmax(x, dim=-1))
        elif name.startswith("layer norm") or name.startswith("rms norm"):
            rms = name.startswith("rms")
            x, w_ = rnd(S, S), rnd(S, lo=0.5, hi=1.5)
            b = None if rms else rnd(S, lo=-0.5, hi=0.5)

            def fwd(x=x, w_=w_, b=b, rms=rms):
                if rms:
                    return F.rms_norm(x, (S,), w_, eps=1e-5)
                return F.layer_norm(x, (S,), w_, b, eps=1e-5)

            if name.endswith("forward"):
                fns.append(fwd)
            else:
                leaves = [t.requires_grad_() for t in (x, w_, b) if t is not None]
                y = fwd()
                dy = rnd(S, S, lo=-1, hi=1)
                fns.append(lambda y=y, leaves=leaves, dy=dy: torch.autograd.grad(y, leaves, dy, retain_graph=True))
        elif name.startswith("causal attention"):
            q, k, v = (rnd(*ATT) for _ in range(3))
            if name.endswith("forward"):
                fns.append(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            else:
                for t in (q, k, v):
                    t.requires_grad_()
                do = rnd(*ATT, lo=-1, hi=1)

                def fb(q=q, k=k, v=v, do=do):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    return torch.autograd.grad(o, (q, k, v), do)

                fns.append(fb)
        elif name.startswith("cross-entropy"):
            logits = rnd(*CE, lo=-4, hi=4)
            target = torch.randint(0, CE[1], (CE[0],), device=dev)
            if name.endswith("forward"):
                fns.append(lambda logits=logits, target=target: F.cross_entropy(logits, target))
            else:
                logits.requires_grad_()

                def fb(logits=logits, target=target):
                    loss = F.cross_entropy(logits, target)
                    return torch.autograd.grad(loss, logits)

                fns.append(fb)
        elif name.startswith("adamw"):
            params = [torch.nn.Parameter(rnd(n, lo=-1, hi=1)) for n in ADAMW_SIZES]
            for p in params:
                p.grad = rnd(p.numel(), lo=-1, hi=1)
            opt = torch.optim.AdamW(params, fused=True, **ADAMW)
            fns.append(opt.step)
        else:
            raise ValueError(f"no PyTorch version of {name}")
    return fns


def host_allocator():
    import torch

    def round_():
        ts = [torch.empty(sz, dtype=torch.uint8, device="cuda") for sz in ALLOC_SIZES]
        del ts

    round_()
    samples = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(100):
            round_()
        samples.append((time.perf_counter() - t) * 1e3 / (100 * len(ALLOC_SIZES) / 1000))
    return statistics.median(samples)


def host_small_op():
    import torch
    a = torch.arange(16, device="cuda", dtype=torch.float32) + 0.5
    y = torch.empty_like(a)
    for _ in range(100):
        torch.add(a, a, out=y)
    torch.cuda.synchronize()
    samples = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(5000):
            torch.add(a, a, out=y)
        samples.append((time.perf_counter() - t) * 1e6 / 5000)
        torch.cuda.synchronize()
    return statistics.median(samples)


def run_torch(filt):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for w in works():
        name = w["work"]
        if filt and filt.lower() not in name.lower():
            continue
        t = time.perf_counter()
        try:
            if name.startswith("caching allocator"):
                ms = host_allocator()
            elif name.startswith("small-op"):
                ms = host_small_op()
            else:
                torch.backends.cuda.matmul.allow_tf32 = "TF32" in name
                sets = n_sets(w.get("bytes"))
                ms = timed(build(w, sets))
            row = dict(work=name, ms=ms, unit=w.get("unit", "ms"), status="ok", detail="")
        except Exception as e:  # one row failing (e.g. out of memory) must not lose the rest
            row = dict(work=name, ms=None, unit=w.get("unit", "ms"), status="error", detail=f"{type(e).__name__}: {e}")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        row["detail"] = (row["detail"] + f"; row took {time.perf_counter() - t:.1f} s").lstrip("; ")
        ms = "-" if row["ms"] is None else f"{row['ms']:.4f}"
        print(f"| {name} | {ms} {row['unit']} | {row['status']} | {row['detail']} |", flush=True)
        rows.append(row)
    count = torch.cuda.device_count()
    for d in ("f32", "bf16") if count >= 2 else ():
        name = f"all-reduce sum 64M {d} over {count} GPUs"
        if filt and filt.lower() not in name.lower():
            continue
        t = time.perf_counter()
        try:
            row = dict(work=name, ms=all_reduce(d, count), unit="ms", status="ok", detail="")
        except Exception as e:
            row = dict(work=name, ms=None, unit="ms", status="error", detail=f"{type(e).__name__}: {e}")
        row["detail"] = (row["detail"] + f"; row took {time.perf_counter() - t:.1f} s").lstrip("; ")
        ms = "-" if row["ms"] is None else f"{row['ms']:.4f}"
        print(f"| {name} | {ms} ms | {row['status']} | {row['detail']} |", flush=True)
        rows.append(row)
    return dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, rows=rows)


def all_reduce(d, count):
    """Single-process NCCL all-reduce over every GPU, out of place, as cuda_bench's row: host
    clock around 10 calls and a synchronize of every device, median of 7 rounds."""
    import torch
    import torch.cuda.nccl as nccl
    dt = torch.bfloat16 if d == "bf16" else torch.float32
    n = ALL_REDUCE_ELEMS
    ins = [torch.empty(n, device=f"cuda:{i}", dtype=dt).uniform_(-4, 4) for i in range(count)]
    outs = [torch.empty_like(x) for x in ins]

    def sync_all():
        for i in range(count):
            torch.cuda.synchronize(i)

    nccl.all_reduce(ins, outs)
    sync_all()
    want = sum(x.to("cuda:0", torch.float64) for x in ins)
    for o in outs:
        if not torch.allclose(o.to("cuda:0", torch.float64), want, rtol=1e-2 if d == "bf16" else 1e-6, atol=1e-2 if d == "bf16" else 1e-5):
            raise ValueError("all-reduce result differs from the sum")
    del want
    samples = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(10):
            nccl.all_reduce(ins, outs)
        sync_all()
        samples.append((time.perf_counter() - t) * 1e3 / 10)
    return statistics.median(samples)


def fmt(x, digits=4):
    return "—" if x is None else f"{x:.{digits}f}"


def table(genesis, torch_res):
    spec = {w["work"]: w for w in works()}
    g = {r["work"]: r for r in genesis["rows"]}
    t = {r["work"]: r for r in torch_res["rows"]}
    names = list(g) + [n for n in t if n not in g]

    def ok_ms(rows, name):
        r = rows.get(name)
        return r["ms"] if r and r["status"] in ("ok", "wrong") and r["ms"] else None

    def good_ms(rows, name):
        r = rows.get(name)
        return r["ms"] if r and r["status"] == "ok" and r["ms"] else None

    # Copy bandwidth of this run, bytes/ms: the ceiling for every bandwidth-bound row.
    copy = "copy 4096x4096 f32"
    copy_ms = [m for m in (good_ms(g, copy), good_ms(t, copy)) if m]
    copy_bw = spec[copy]["floor_bytes"] / min(copy_ms) if copy_ms else None
    gemm = {}
    for w in works():
        if "gemm" in w and w["work"].startswith("matmul"):
            ms = [m for m in (good_ms(g, w["work"]), good_ms(t, w["work"])) if m]
            best = w["flops"] / min(ms) * 1e3 if ms else 0.0
            if "H200" in torch_res.get("device", ""):
                best = max(best, H200_GEMM[w["gemm"]])
            gemm[w["gemm"]] = best or None

    lines = [
        f"GPU: {torch_res.get('device')} (Genesis saw {genesis.get('device')}); PyTorch {torch_res.get('torch')}; "
        f"{datetime.date.today()}",
        "",
        "| work | Genesis ms | PyTorch ms | speed-up | goal | met? | fraction of the floor |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name in names:
        w = spec.get(name, {})
        gr, tr = g.get(name), t.get(name)
        gms, tms = ok_ms(g, name), ok_ms(t, name)
        unit = w.get("unit", "ms")
        if gr is None:
            gcell = "not run"
        elif gr["status"] == "ok":
            gcell = fmt(gms)
        elif gr["status"] == "wrong":
            gcell = f"{fmt(gms)} WRONG"
            notes.append(f"{name}: {gr['detail']}")
        else:
            gcell = gr["status"]
            notes.append(f"{name}: {gr['status']}: {gr['detail']}")
        if tr is None:
            tcell = "not run"
        else:
            tcell = fmt(tms) if tr["status"] == "ok" else tr["status"]
            if tr["status"] != "ok":
                notes.append(f"{name} (PyTorch): {tr['detail']}")
        if unit != "ms":
            gcell, tcell = f"{gcell} {unit}", f"{tcell} {unit}"
        speedup = tms / gms if gms and tms else None
        floor_ms = None
        if "floor_bytes" in w and copy_bw:
            floor_ms = w["floor_bytes"] / copy_bw
        elif "flops" in w and gemm.get(w.get("gemm")):
            floor_ms = w["flops"] / gemm[w["gemm"]] * 1e3
        frac = floor_ms / gms if floor_ms and gms else None
        goal, met = "—", None
        if "goal_us" in w:
            goal = f"≤ {w['goal_us']:g} us"
            met = gms <= w["goal_us"] if gms else None
        elif "goal" in w:
            goal = f"≥ {w['goal']:g}×"
            met = speedup >= w["goal"] if speedup else None
            if w.get("goal_floor"):
                goal += f", ≥ {w['goal_floor']:g} of copy bw"
                met = met and frac is not None and frac >= w["goal_floor"]
        if gr is not None and gr["status"] == "wrong":
            met = False
        met_cell = "—" if met is None else ("yes" if met else "no")
        frac_cell = "—" if frac is None else f"{frac:.2f} (floor {floor_ms:.3f} ms)"
        sp_cell = "—" if speedup is None else f"{speedup:.2f}×"
        lines.append(f"| {name} | {gcell} | {tcell} | {sp_cell} | {goal} | {met_cell} | {frac_cell} |")
    lines.append("")
    lines.append("speed-up = PyTorch ms / Genesis ms (above 1: Genesis is faster); fraction of the floor = floor ms / "
                 "Genesis ms.")
    if copy_bw:
        lines.append(f"Bandwidth floors: minimal bytes moved at {copy_bw / 1e9:.2f} TB/s, the device-to-device copy "
                     "(read + write) measured in this run.")
    lines.append("Compute floors: FLOPs at the best GEMM rate of this run (the PERFORMANCE.md H200 ceiling where "
                 "higher): " + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in gemm.items() if v) +
                 "; attention counts causal FLOPs, the backward as 2.5× the forward.")
    lines.append("Genesis: host clock around back-to-back launches + one synchronize; PyTorch: CUDA events; both "
                 "median of 7 rounds after warm-up, inputs rotated below 100 MiB. Host-side rows use the host clock.")
    if notes:
        lines.append("")
        lines.append("Notes:")
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the PyTorch results here")
    ap.add_argument("--genesis", help="cuda_bench --json output: print the combined table")
    ap.add_argument("--out", help="also write the combined table here")
    ap.add_argument("--filter", help="only rows whose work contains this")
    ap.add_argument("--torch-json", help="reuse PyTorch results from this file instead of measuring")
    args = ap.parse_args()
    if args.torch_json:
        with open(args.torch_json) as f:
            res = json.load(f)
    else:
        res = run_torch(args.filter)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.genesis:
        with open(args.genesis) as f:
            genesis = json.load(f)
        text = table(genesis, res)
        print()
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
