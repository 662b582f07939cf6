"""Write PyTorch's optimizer and learning-rate scheduler results to optim.safetensors.

Optimizer cases: two f32 parameters (init.p0, init.p1) minimise
loss = sum(coef.p0 * p0^2) + sum(sin(p0)) + sum(coef.p1 * p1^2) + sum(sin(p1)) for a few
steps; the parameters after every step are stored as {case}.step{k}.p{i}. Scheduler cases
record the learning rate of each of two parameter groups at epoch 0 and after every
scheduler step as {case}.lrs (f64, shape [epochs + 1, 2]). The Rust test
genesis-core/tests/optim_reference.rs runs the same configurations (same names).

Run where PyTorch is installed:  python3 tests/reference/make_optim_reference.py --out FILE
The safetensors file is written by hand (safetensors_file.py): only torch is needed.
"""

import argparse
import math

import torch
from safetensors_file import write_safetensors

STEPS = 5


def initial():
    i0 = torch.arange(12, dtype=torch.float64)
    i1 = torch.arange(5, dtype=torch.float64)
    p0 = (torch.sin(0.37 * i0 + 0.1) * 1.5).reshape(3, 4).float()
    p1 = (torch.cos(0.53 * i1) * 0.8).float()
    c0 = (0.5 + (i0 % 3) * 0.3).reshape(3, 4).float()
    c1 = (0.5 + (i1 % 3) * 0.3).float()
    return [p0, p1], [c0, c1]


def loss_fn(ps, cs):
    return sum((c * p * p).sum() + torch.sin(p).sum() for p, c in zip(ps, cs))


def groups(ps, options):
    """One dict per parameter: a parameter group each (options may differ)."""
    return [dict(params=[p], **o) for p, o in zip(ps, options)]


O = torch.optim
OPTIMIZERS = {
    "sgd_plain": lambda ps: O.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "sgd_nesterov": lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001),
    "sgd_maximize": lambda ps: O.SGD(ps, lr=0.01, momentum=0.5, maximize=True),
    "sgd_groups": lambda ps: O.SGD(groups(ps, [dict(lr=0.1, momentum=0.5), dict(lr=0.01, momentum=0.9)])),
    "adam": lambda ps: O.Adam(ps, lr=0.01),
    "adam_wd": lambda ps: O.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw": lambda ps: O.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw_maximize": lambda ps: O.AdamW(ps, lr=0.01, weight_decay=0.1, maximize=True),
    "adamw_groups": lambda ps: O.AdamW(
        groups(ps, [dict(lr=0.02, weight_decay=0.05), dict(lr=0.005, weight_decay=0.0, betas=(0.5, 0.9))])
    ),
}


def warmup_cosine(warmup, total, min_factor):
    def f(e):
        if e < warmup:
            return e / warmup
        progress = min(1.0, (e - warmup) / max(1, total - warmup))
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


S = O.lr_scheduler
SCHEDULERS = {
    "step": (10, lambda o: S.StepLR(o, step_size=3, gamma=0.5)),
    "multistep": (10, lambda o: S.MultiStepLR(o, milestones=[2, 5, 5, 8], gamma=0.3)),
    "exponential": (8, lambda o: S.ExponentialLR(o, gamma=0.9)),
    "cosine": (14, lambda o: S.CosineAnnealingLR(o, T_max=6, eta_min=0.001)),
    "linear": (8, lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4)),
    "lambda": (8, lambda o: S.LambdaLR(o, lambda e: 0.95**e / (1 + 0.1 * e))),
    "warmup_cosine": (12, lambda o: S.LambdaLR(o, warmup_cosine(3, 10, 0.1))),
    "onecycle": (
        9,
        lambda o: S.OneCycleLR(
            o, max_lr=[0.5, 0.1], total_steps=10, pct_start=0.3, div_factor=25.0, final_div_factor=1e4,
            cycle_momentum=False,
        ),
    ),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/reference/optim.safetensors")
    args = parser.parse_args()
    init, coefs = initial()
    tensors = {"init.p0": init[0], "init.p1": init[1], "coef.p0": coefs[0], "coef.p1": coefs[1]}
    for name, make in OPTIMIZERS.items():
        ps = [p.clone().requires_grad_(True) for p in init]
        opt = make(ps)
        for k in range(STEPS):
            opt.zero_grad()
            loss_fn(ps, coefs).backward()
            opt.step()
            for i, p in enumerate(ps):
                tensors[f"{name}.step{k}.p{i}"] = p.detach().clone()
    for name, (epochs, make) in SCHEDULERS.items():
        ps = [p.clone().requires_grad_(True) for p in init]
        opt = O.SGD([dict(params=[ps[0]], lr=0.1), dict(params=[ps[1]], lr=0.02)])
        sched = make(opt)
        lrs = [[g["lr"] for g in opt.param_groups]]
        for _ in range(epochs):
            opt.step()
            sched.step()
            lrs.append([g["lr"] for g in opt.param_groups])
        tensors[f"{name}.lrs"] = torch.tensor(lrs, dtype=torch.float64)
    write_safetensors(args.out, tensors, sort_names=True, separators=(",", ":"))
    print(f"wrote {len(OPTIMIZERS)} optimizer and {len(SCHEDULERS)} scheduler cases with torch {torch.__version__}")


if __name__ == "__main__":
    main()
