#!/usr/bin/env python3
"""Where a device waits: the idle gaps between kernels in a Genesis Chrome trace.

    python3 benches/profiler/trace_gaps.py TRACE.json [--min-us 5] [--top 20]

Reads a trace written by `Profile::export_chrome_trace` (for example `sft_bench --trace`),
merges each device's kernels into busy spans and prints the idle time between them: the
total, the longest gaps with the ops on either side, the idle time grouped by the op whose
kernel ended the gap (the host was still issuing it), and the host events that overlap idle
time, weighted by the overlap. A device that idles while the host runs ops is host-bound
there; one that idles inside a host read (`item`, `to_vec`) is waiting on a synchronization.
"""
import argparse
import bisect
import collections
import json


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--min-us", type=float, default=5.0, help="shortest gap counted")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") != "kernel"]
    if not kernels:
        raise SystemExit("no kernels in the trace")
    gaps = []
    end, last = kernels[0]["ts"] + kernels[0]["dur"], kernels[0]
    busy = kernels[0]["dur"]
    for k in kernels[1:]:
        start, stop = k["ts"], k["ts"] + k["dur"]
        if start - end >= args.min_us:
            gaps.append((start - end, end, start, last, k))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, last = stop, k
    span = end - kernels[0]["ts"]
    idle = sum(g[0] for g in gaps)
    print(f"span {span / 1e3:.2f} ms, kernels busy {busy / 1e3:.2f} ms, "
          f"idle in gaps >= {args.min_us} us: {idle / 1e3:.2f} ms in {len(gaps)} gaps")
    op = lambda k: k.get("args", {}).get("op", "?")
    print("\nlongest gaps (us, before -> after):")
    for g, _, _, before, after in sorted(gaps, key=lambda g: -g[0])[: args.top]:
        print(f"  {g:9.1f}  {op(before)} ({before['name'][:40]}) -> {op(after)} ({after['name'][:40]})")
    by_next = collections.Counter()
    for g, _, _, _, after in gaps:
        by_next[op(after)] += g
    print("\nidle by the op that ended it (ms):")
    for name, t in by_next.most_common(args.top):
        print(f"  {t / 1e3:8.3f}  {name}")
    overlap = collections.Counter()
    ends = [g[2] for g in gaps]  # gaps are in time order and do not overlap
    for h in host:
        hs, he = h["ts"], h["ts"] + h.get("dur", 0)
        i = bisect.bisect_right(ends, hs)
        while i < len(gaps) and gaps[i][1] < he:
            overlap[h["name"]] += min(he, gaps[i][2]) - max(hs, gaps[i][1])
            i += 1
    print("\nhost events overlapping idle time (ms; nested events count in each):")
    for name, t in overlap.most_common(args.top):
        print(f"  {t / 1e3:8.3f}  {name}")


if __name__ == "__main__":
    main()
