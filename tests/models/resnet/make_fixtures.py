"""Generate the ResNet test fixtures with torchvision's own ResNet classes.

Each fixture is one safetensors file holding a model's state dict before and after one
training step, fixed inputs and labels, and the reference outputs of this sequence:

  1. eval mode:  logits_eval = model(x)
  2. train mode: logits_train = model(x) (batch statistics; the running statistics update),
                 loss = cross_entropy(logits_train, y), loss.backward(),
                 SGD(lr, momentum, weight_decay).step()
  3. eval mode:  logits_eval_after = model(x) with the stepped weights and new statistics

Keys: `init.<name>` (state dict before), `step.<name>` (after the step), `x`, `y`,
`logits_eval`, `logits_train`, `loss`, `logits_eval_after`. The metadata entry `config` is a
JSON object with the model's shape (block, layers, widths, stem_width, num_classes) and the
optimizer's settings (lr, momentum, weight_decay); `f32_error` maps each of those outputs to
the largest difference between PyTorch's float32 result and the same sequence in float64.
That is how far float32 itself is from the exact answer: a randomly initialized ResNet-50 in
training mode is badly conditioned (PyTorch's own float32 gradient of `conv1.weight` is about
2% off its float64 one), so a faithful implementation is judged against that, not against a
fixed bound.

What it writes:
  default:            basic.safetensors and bottleneck.safetensors in --out (default: this
                      script's directory), narrow models a few hundred kB each, committed.
  --resnet50 FILE:    the full-size torchvision resnet50 (1000 classes, batch 4 at 224x224),
                      about 200 MB: made on the GPU machine for the check there, not committed.

The small models are torchvision's `ResNet` with its stages rebuilt at reduced widths by
torchvision's own `_make_layer` (torchvision fixes the widths at 64..512). Their batch-norm
scales, shifts and running statistics are randomized so that every one of them matters.
Everything runs on the CPU in float32, so the references do not depend on a GPU's TF32.

Run:  python3 make_fixtures.py [--out DIR] [--resnet50 FILE]
Running it twice gives the same tensors.
"""

import argparse
import copy
import json
import os

import torch
import torchvision
from safetensors.torch import save_file
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

SMALL = {
    "basic": dict(block="basic", layers=[1, 1, 1, 1], widths=[8, 16, 32, 64], stem_width=8, num_classes=10),
    "bottleneck": dict(block="bottleneck", layers=[2, 1, 1, 1], widths=[4, 8, 16, 32], stem_width=8, num_classes=7),
}
OPTIMIZER = dict(lr=0.1, momentum=0.9, weight_decay=1e-4)


def narrow_resnet(cfg):
    block = BasicBlock if cfg["block"] == "basic" else Bottleneck
    model = ResNet(block, [1, 1, 1, 1], num_classes=cfg["num_classes"])
    # Rebuild the stem and the stages at the fixture's widths with torchvision's own code.
    stem = cfg["stem_width"]
    model.inplanes = stem
    model.conv1 = nn.Conv2d(3, stem, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(stem)
    for i, (blocks, width) in enumerate(zip(cfg["layers"], cfg["widths"])):
        setattr(model, f"layer{i + 1}", model._make_layer(block, width, blocks, stride=1 if i == 0 else 2))
    model.fc = nn.Linear(cfg["widths"][-1] * block.expansion, cfg["num_classes"])
    return model


def randomize_batch_norms(model, gen):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.2, 0.2, generator=gen)
                m.running_mean.uniform_(-0.3, 0.3, generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.num_batches_tracked.fill_(3)


def reference(model, x, y, optimizer):
    """The outputs of the fixture's sequence (see the module's docstring) for `model` as is."""
    state = lambda: {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out = {f"init.{k}": v for k, v in state().items()}
    model.eval()
    with torch.no_grad():
        out["logits_eval"] = model(x)
    model.train()
    opt = torch.optim.SGD(model.parameters(), **optimizer)
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    opt.step()
    out["logits_train"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    out.update({f"step.{k}": v for k, v in state().items()})
    model.eval()
    with torch.no_grad():
        out["logits_eval_after"] = model(x)
    out["x"], out["y"] = x, y
    return out


def f32_error(model, x, y, ref32, optimizer):
    """Per output, the largest |float32 - float64| of the same sequence from the same start."""
    model64 = copy.deepcopy(model).double()
    model64.load_state_dict({k[len("init."):]: v for k, v in ref32.items() if k.startswith("init.")})
    ref64 = reference(model64, x.double(), y, optimizer)
    keys = [k for k in ref32 if not k.startswith("init.") and k not in ("x", "y")]
    return {k: (ref32[k].double() - ref64[k].double()).abs().max().item() for k in keys}


def write(path, tensors, cfg, error):
    meta = {"config": json.dumps(cfg), "f32_error": json.dumps(error), "torch": torch.__version__, "torchvision": torchvision.__version__}
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=here)
    ap.add_argument("--resnet50", help="also write the full-size resnet50 fixture to this file")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name, cfg in SMALL.items():
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        model = narrow_resnet(cfg)
        randomize_batch_norms(model, gen)
        x = torch.randn(4, 3, 64, 64, generator=gen)
        y = torch.randint(0, cfg["num_classes"], (4,), generator=gen)
        start = copy.deepcopy(model)
        ref = reference(model, x, y, OPTIMIZER)
        error = f32_error(start, x, y, ref, OPTIMIZER)
        write(os.path.join(args.out, f"{name}.safetensors"), ref, {**cfg, **OPTIMIZER}, error)
    if args.resnet50:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(1)
        model = torchvision.models.resnet50()
        cfg = dict(block="bottleneck", layers=[3, 4, 6, 3], widths=[64, 128, 256, 512], stem_width=64, num_classes=1000)
        x = torch.randn(4, 3, 224, 224, generator=gen)
        y = torch.randint(0, 1000, (4,), generator=gen)
        # At random initialization ResNet-50's first layers get gradients 20x their weights at
        # this batch size: a step at lr 0.1 would throw the model far enough that float32
        # rounding alone moves the next logits by tens. lr 1e-3 keeps the check meaningful.
        optimizer = {**OPTIMIZER, "lr": 1e-3}
        start = copy.deepcopy(model)
        ref = reference(model, x, y, optimizer)
        write(args.resnet50, ref, {**cfg, **optimizer}, f32_error(start, x, y, ref, optimizer))


if __name__ == "__main__":
    main()
