"""PyTorch's ResNet training step, measured as examples/resnet_bench.rs measures Genesis: a
fixed batch of random images on the GPU, forward under bf16 autocast, cross-entropy, backward,
SGD (momentum 0.9, weight decay 1e-4); eager mode, channels-last, cuDNN autotuning on (the
usual recipe for speed). Prints one JSON line like the Genesis example.

    python3 bench_torch.py [--arch resnet50] [--batch 256] [--image-size 224] [--steps 20]
        [--warmup 5] [--autocast bf16|off] [--memory-format channels_last|contiguous]
"""

import argparse
import json
import time

import torch
import torchvision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--autocast", default="bf16")
    ap.add_argument("--memory-format", default="channels_last")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    fmt = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format
    model = getattr(torchvision.models, args.arch)().to(dev, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    s = args.image_size
    images = torch.randn(args.batch, 3, s, s, device=dev).to(memory_format=fmt)
    labels = torch.randint(0, 1000, (args.batch,), device=dev)
    use_amp = args.autocast == "bf16"

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "framework": "pytorch " + torch.__version__,
        "device": torch.cuda.get_device_name(),
        "arch": args.arch,
        "batch": args.batch,
        "image_size": s,
        "autocast": use_amp,
        "memory_format": args.memory_format,
        "steps": args.steps,
        "images_per_s": round(args.batch * args.steps / seconds, 1),
        "ms_per_step": round(seconds * 1e3 / args.steps, 2),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "last_loss": round(last, 4),
    }))


if __name__ == "__main__":
    main()
