"""PyTorch side of the CUDA benchmark: the same work as `cuda_check --bench`, timed with CUDA
events (median of 7 rounds of back-to-back launches after a warm-up). Run on the GPU machine
next to the Genesis binary; the two tables are printed in the same run on the same GPU."""
import statistics
import time

import torch


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    s = 4096
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print("| work | pytorch ms | GB/s or TFLOP/s |")
    for dtype, name, size in [(torch.float32, "f32", 4), (torch.bfloat16, "bf16", 2)]:
        a, b = torch.randn(s, s, device="cuda", dtype=dtype), torch.randn(s, s, device="cuda", dtype=dtype)
        y = torch.empty_like(a)
        ms = timed(lambda: torch.add(a, b, out=y), 20)
        print(f"| add {s}x{s} {name} | {ms:.4f} | {3 * s * s * size / ms / 1e6:.0f} GB/s |")
        if dtype == torch.float32:
            row = torch.randn(s, device="cuda", dtype=dtype)
            ms = timed(lambda: torch.add(a, row, out=y), 20)
            print(f"| broadcast add {s}x{s} + {s} f32 | {ms:.4f} | {2 * s * s * 4 / ms / 1e6:.0f} GB/s |")
            ms = timed(lambda: y.copy_(a), 20)
            print(f"| copy {s}x{s} f32 (dtod) | {ms:.4f} | {2 * s * s * 4 / ms / 1e6:.0f} GB/s |")
            ms = timed(lambda: y.copy_(a.t()), 20)
            print(f"| transpose copy {s}x{s} f32 | {ms:.4f} | {2 * s * s * 4 / ms / 1e6:.0f} GB/s |")
            ms = timed(lambda: torch.nn.functional.gelu(a), 20)
            print(f"| gelu {s}x{s} f32 | {ms:.4f} | {2 * s * s * 4 / ms / 1e6:.0f} GB/s |")
            ms = timed(lambda: y.normal_(), 20)
            print(f"| rand_normal {s}x{s} f32 | {ms:.4f} | {s * s * 4 / ms / 1e6:.0f} GB/s |")
        ms = timed(lambda: a.sum(dim=1, keepdim=True), 20)
        print(f"| sum over rows {s}x{s} -> {s} {name} | {ms:.4f} | {s * s * size / ms / 1e6:.0f} GB/s |")
        ms = timed(lambda: a.sum(dim=0, keepdim=True), 20)
        print(f"| sum over columns {s}x{s} -> {s} {name} | {ms:.4f} | {s * s * size / ms / 1e6:.0f} GB/s |")
        ms = timed(lambda: torch.matmul(a, b, out=y), 5)
        print(f"| matmul {s}^3 {name} | {ms:.4f} | {2 * s**3 / ms / 1e9:.1f} TFLOP/s |")
    a = torch.randn(16, device="cuda")
    y = torch.empty_like(a)
    for _ in range(100):
        torch.add(a, a, out=y)
    torch.cuda.synchronize()
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        torch.add(a, a, out=y)
    host_us = (time.perf_counter() - t) * 1e6 / n
    torch.cuda.synchronize()
    print(f"| small-op overhead (tiny add, host time per op) | {host_us:.2f} us | |")
    sizes = [4 << 20, 123, 64 << 20, 3000, 1 << 20, 17 << 20, 512, 40_000, 9 << 20, 1]
    def round_():
        ts = [torch.empty(sz, dtype=torch.uint8, device="cuda") for sz in sizes]
        del ts
    round_()
    t = time.perf_counter()
    for _ in range(100):
        round_()
    print(f"allocator: 1000 mixed-size alloc/free pairs take {(time.perf_counter() - t) * 1e3 / (100 * len(sizes) / 1000):.3f} ms (torch.empty + free)")


if __name__ == "__main__":
    main()
