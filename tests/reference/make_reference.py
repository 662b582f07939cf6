"""Write PyTorch's results for a broad set of Genesis ops to ops.safetensors.

For every case: the f64 inputs, a weight tensor w, the output f(inputs) and the gradients of
sum(f(inputs) * w) with respect to each input. The Rust test `genesis-core/tests/reference.rs`
runs the same functions (same names) on the stored inputs and compares.

Run where PyTorch is installed:  python3 tests/reference/make_reference.py [out_dir]
The safetensors file is written by hand (safetensors_file.py), so the script needs nothing
but torch.
"""

import sys

import torch
import torch.nn.functional as F
from safetensors_file import write_safetensors

torch.manual_seed(1234)
I = lambda values: torch.tensor(values, dtype=torch.int64)

# name: (input shapes, positive inputs?, function)
CASES = {
    "add_broadcast": (["3x4", "4"], False, lambda x: x[0] + x[1]),
    "sub_broadcast": (["3x1", "1x4"], False, lambda x: x[0] - x[1]),
    "mul_broadcast": (["2x3x4", "3x1"], False, lambda x: x[0] * x[1]),
    "div": (["3x4", "3x4"], True, lambda x: x[0] / x[1]),
    "pow": (["5", "5"], True, lambda x: x[0] ** x[1]),
    "scalar_chain": (["5"], True, lambda x: 2.0 / (x[0] * 3.0 + 1.0)),
    "maximum": (["6", "6"], False, lambda x: torch.maximum(x[0], x[1])),
    "minimum": (["6", "6"], False, lambda x: torch.minimum(x[0], x[1])),
    "exp_transposed": (["3x4"], False, lambda x: x[0].t().exp()),
    "log": (["6"], True, lambda x: x[0].log()),
    "sqrt": (["6"], True, lambda x: x[0].sqrt()),
    "rsqrt": (["6"], True, lambda x: x[0].rsqrt()),
    "sin": (["6"], False, lambda x: x[0].sin()),
    "cos": (["6"], False, lambda x: x[0].cos()),
    "tanh": (["6"], False, lambda x: x[0].tanh()),
    "sigmoid": (["6"], False, lambda x: x[0].sigmoid()),
    "relu": (["8"], False, lambda x: x[0].relu()),
    "gelu": (["8"], False, lambda x: F.gelu(x[0])),
    "gelu_tanh": (["8"], False, lambda x: F.gelu(x[0], approximate="tanh")),
    "silu": (["8"], False, lambda x: F.silu(x[0])),
    "erf": (["6"], False, lambda x: torch.erf(x[0])),
    "log1p": (["6"], True, lambda x: torch.log1p(x[0])),
    "expm1": (["6"], False, lambda x: torch.expm1(x[0])),
    "abs": (["6"], False, lambda x: x[0].abs()),
    "clamp": (["8"], False, lambda x: x[0].clamp(-0.5, 0.5)),
    "where": (["6", "6"], False, lambda x: torch.where(x[0] > 0, x[0], x[1])),
    "sum_dims": (["2x3x4"], False, lambda x: x[0].sum(dim=(0, 2))),
    "mean": (["3x4"], False, lambda x: x[0].mean(1)),
    "var": (["3x5"], False, lambda x: x[0].var(1)),
    "std_keepdim": (["3x5"], True, lambda x: x[0].std(0, keepdim=True)),
    "amax": (["3x4"], False, lambda x: x[0].amax(1)),
    "amin": (["3x4"], False, lambda x: x[0].amin(0, keepdim=True)),
    "prod": (["3x4"], True, lambda x: x[0].prod(1)),
    "logsumexp": (["3x4"], False, lambda x: torch.logsumexp(x[0], 1)),
    "matmul": (["3x4", "4x2"], False, lambda x: x[0] @ x[1]),
    "matmul_batched_broadcast": (["2x3x4", "4x5"], False, lambda x: x[0] @ x[1]),
    "matmul_transposed": (["4x3", "2x4"], False, lambda x: x[0].t() @ x[1].t()),
    "matvec": (["3x4", "4"], False, lambda x: x[0] @ x[1]),
    "dot": (["4", "4"], False, lambda x: x[0] @ x[1]),
    "softmax": (["3x5"], False, lambda x: x[0].softmax(-1)),
    "softmax_dim0": (["3x5"], False, lambda x: x[0].softmax(0)),
    "log_softmax": (["3x5"], False, lambda x: x[0].log_softmax(-1)),
    "gather": (["3x4"], False, lambda x: x[0].gather(1, I([[0, 3], [1, 1], [2, 0]]))),
    "index_select": (["4x3"], False, lambda x: x[0].index_select(0, I([3, 0, 3]))),
    "embedding": (["5x3"], False, lambda x: F.embedding(I([[4, 0], [4, 2]]), x[0])),
    "scatter_add": (["3x4", "3x2"], False, lambda x: x[0].scatter_add(1, I([[0, 3], [1, 1], [2, 0]]), x[1])),
    "cumsum": (["3x4"], False, lambda x: x[0].cumsum(1)),
    "cat": (["2x3", "1x3"], False, lambda x: torch.cat([x[0], x[1]], 0)),
    "stack": (["2x3", "2x3"], False, lambda x: torch.stack([x[0], x[1]], 1)),
    "slice_step": (["6x4"], False, lambda x: x[0][1::2].square()),
    "permute_sin": (["2x3x4"], False, lambda x: x[0].permute(2, 0, 1).sin()),
    "expand": (["3x1"], False, lambda x: x[0].expand(3, 4) * 2.0),
    "reshape_transposed": (["2x6"], False, lambda x: x[0].t().reshape(4, 3).tanh()),
    "topk_values": (["3x5"], False, lambda x: x[0].topk(2, -1).values),
}


def shape(text):
    return [int(n) for n in text.split("x")]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/reference"
    tensors = {}
    for name, (shapes, positive, fn) in CASES.items():
        xs = []
        for s in shapes:
            t = torch.rand(shape(s), dtype=torch.float64)
            t = t + 0.5 if positive else t * 2 - 1
            xs.append(t.requires_grad_(True))
        y = fn(xs)
        w = torch.rand_like(y)
        grads = torch.autograd.grad((y * w).sum(), xs)
        for i, (x, g) in enumerate(zip(xs, grads)):
            tensors[f"{name}.in{i}"] = x
            tensors[f"{name}.grad{i}"] = g
        tensors[f"{name}.w"] = w
        tensors[f"{name}.out"] = y
    write_safetensors(f"{out_dir}/ops.safetensors", tensors)
    print(f"wrote {len(CASES)} cases ({len(tensors)} tensors) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
