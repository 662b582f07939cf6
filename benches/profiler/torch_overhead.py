"""Host time per tiny op under torch.profiler, for comparison with Genesis's
`profile_training` (which measures the same loop: 20,000 one-element additions).

    python benches/profiler/torch_overhead.py

Prints the best of five rounds for: no profiler; CPU activity with shapes and memory;
CPU + CUDA activity with shapes and memory (torch.profiler's usual setting on a GPU).
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

N = 20_000


def timed(x):
    start = time.perf_counter()
    for _ in range(N):
        x.add(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / N


def main():
    x = torch.ones(1, device="cuda")
    timed(x)
    configs = {
        "off": None,
        "shapes+memory": [ProfilerActivity.CPU],
        "+device time": [ProfilerActivity.CPU, ProfilerActivity.CUDA],
    }
    best = {name: float("inf") for name in configs}
    for _ in range(5):
        for name, activities in configs.items():
            if activities is None:
                best[name] = min(best[name], timed(x))
            else:
                with profile(activities=activities, record_shapes=True, profile_memory=True):
                    best[name] = min(best[name], timed(x))
    off = best["off"]
    print(
        f"torch {torch.__version__} on {torch.cuda.get_device_name()}: host time per tiny op: "
        f"{off:.2f} us without a profiler, {best['shapes+memory']:.2f} us recording shapes and memory "
        f"(+{best['shapes+memory'] - off:.2f} us), {best['+device time']:.2f} us with device time too "
        f"(+{best['+device time'] - off:.2f} us)"
    )


if __name__ == "__main__":
    main()
