"""Safetensors interop with PyTorch, both directions.

1. Loads tests/reference/genesis_written.safetensors (written by Genesis, see
   genesis-core/tests/interop.rs) with safetensors.torch and checks every tensor against the
   expected state dict below: names, dtypes, shapes and values.
2. Writes the same state dict with safetensors.torch.save_file to --out, which the Rust test
   loads and checks the same way.

Run where PyTorch and the safetensors package are installed:
    python3 tests/reference/make_interop_reference.py --genesis FILE --out FILE
"""

import argparse
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def expected():
    """The state dict both sides build (keep in step with interop.rs)."""
    return {
        "embed.weight": (torch.arange(15, dtype=torch.float32) * 0.25 - 1).reshape(5, 3),
        "norm.weight": torch.tensor([1.0, 0.5, -2.0], dtype=torch.bfloat16),
        "layers.0.linear.weight": (torch.arange(6, dtype=torch.float16) * 0.5).reshape(2, 3),
        "bn.running_mean": torch.tensor([0.1, -0.2], dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(7, dtype=torch.int64),
        "tokens": torch.tensor([[-3, 0], [2, 2**30]], dtype=torch.int32),
        "pixels": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "mask": torch.tensor([True, False, False, True]),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--genesis", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    want = expected()
    got = load_file(args.genesis)
    with safe_open(args.genesis, framework="pt") as f:
        meta = f.metadata()
    problems = []
    if sorted(got) != sorted(want):
        problems.append(f"names differ: {sorted(got)} vs {sorted(want)}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            problems.append(f"{name}: got {g.dtype} {tuple(g.shape)} {g}, want {w.dtype} {tuple(w.shape)} {w}")
    if meta != {"format": "pt"}:
        problems.append(f"metadata {meta}")
    for p in problems:
        print("MISMATCH", p)
    print(f"genesis-written file: {len(got)} tensors, {len(problems)} problems (torch {torch.__version__})")
    save_file(want, args.out, metadata={"format": "pt"})
    print("wrote", args.out)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
