"""Per-tensor against per-sample scales for a convolution's output gradient in its input-gradient GEMM.

Loads a trained ResNet-20 (a run folder's ``checkpoints/last.safetensors``), runs one float32 training batch
forward and backward, and for every convolution takes its real output gradient dy and input x and computes
dx = conv_transpose(dy, W) with the int8 kernels twice: dy on one scale per tensor (the int8 recipe's default)
and on one scale per sample (``Int8MixedConfig(per_sample_grad=True)``), each against float32.  Late in
training a sample's gradient is a small fraction of the batch's largest, and the first layout rounds most of
its codes to zero.

    python benchmarks/probe_per_sample.py RUN/checkpoints/last.safetensors --data ../shared/data/cifar10_train20k.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from inttrain.autograd.conv import ConvGeometry, int_conv2d
from inttrain.models.resnet import CifarResNet
from inttrain.numerics import sqnr_db
from inttrain.recipes import Int8MixedConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, help="a ResNet-20 state dict (.safetensors)")
    p.add_argument("--data", type=Path, required=True, help="an .npz with uint8 images x [N, 32, 32, 3] and labels y")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the table here as markdown")
    return p.parse_args(argv)


def captured_gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """{conv name: (module, its input, its output gradient)} of one float32 training step."""
    seen: dict = {}

    def keep_input(name: str, mod: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        seen[name] = [mod, inputs[0].detach(), None]

    def keep_grad(name: str, mod: torch.nn.Module, grad_in: tuple, grad_out: tuple) -> None:
        seen[name][2] = grad_out[0].detach()

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_hook(lambda m, i, o, n=name: keep_input(n, m, i, o))
            mod.register_full_backward_hook(lambda m, gi, go, n=name: keep_grad(n, m, gi, go))
    F.cross_entropy(model(x), y).backward()
    return seen


def int8_input_grad(mod: torch.nn.Conv2d, x: torch.Tensor, dy: torch.Tensor, per_sample: bool) -> torch.Tensor:
    geom = ConvGeometry(mod.stride, mod.padding, mod.dilation, mod.groups)
    prec = Int8MixedConfig(per_sample_grad=per_sample).precision_for(mod, "conv")
    xi = x.clone().requires_grad_()
    int_conv2d(xi, mod.weight.detach(), None, geom, prec).backward(dy)
    return xi.grad


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = CifarResNet(20)
    model.load_state_dict(load_file(str(args.checkpoint)), strict=False)
    model.train()
    data = np.load(args.data)
    idx = np.random.default_rng(args.seed).permutation(len(data["y"]))[:args.batch]
    x = torch.tensor(data["x"][idx]).permute(0, 3, 1, 2).float() / 255
    x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)
    x.requires_grad_()  # so that the first convolution's backward hook sees a gradient too
    rows = ["| conv | sample amax / batch amax, median (p10) | dy codes zero, per tensor / per sample | "
            "dx SQNR per tensor | dx SQNR per sample |", "|---|---|---|---|---|"]
    for name, (mod, xin, dy) in captured_gradients(model, x, torch.tensor(data["y"][idx])).items():
        if name == "conv1":  # the image's gradient is not used
            continue
        ref = torch.nn.grad.conv2d_input(xin.shape, mod.weight.detach(), dy, mod.stride, mod.padding)
        ratio = dy.abs().amax((1, 2, 3)) / dy.abs().max()
        zero_t = float((torch.round(dy / dy.abs().max() * 127) == 0).float().mean())
        zero_s = float((torch.round(dy / dy.abs().amax((1, 2, 3), keepdim=True) * 127) == 0).float().mean())
        db = [sqnr_db(ref, int8_input_grad(mod, xin, dy, ps)) for ps in (False, True)]
        rows.append(f"| {name} | {float(ratio.median()):.3f} ({float(ratio.quantile(0.1)):.3f}) | "
                    f"{zero_t:.2f} / {zero_s:.2f} | {db[0]:.1f} dB | {db[1]:.1f} dB |")
    text = "\n".join(rows) + (f"\n\nCheckpoint {args.checkpoint}, one training batch of {args.batch} "
                              f"(seed {args.seed}), torch {torch.__version__}.\n")
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
