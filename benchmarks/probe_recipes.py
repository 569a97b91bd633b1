"""Where integer training loses precision: the numerics probe over recipe variants on one real batch (issue 16).

    python benchmarks/probe_recipes.py --data ../shared/data/cifar10_train20k.npz            # ResNet-20 at init
    python benchmarks/probe_recipes.py --data D.npz --weights RUN/checkpoints/last.safetensors --out OUT  # trained

For every variant the same model (seed 0 initial weights, or ``--weights`` of a run folder: a prepared model's
state dict has the float model's keys) is prepared with the variant's config and probed with
:func:`inttrain.nn.probe.probe_gemms` on the first ``--batch-size`` training images of the accuracy benchmarks'
split: per GEMM (forward, grad_input, grad_weight), the median and the minimum SQNR over the converted layers,
and the layer of the minimum.  Writes ``OUT/probe_recipes.md`` and ``.json`` (every layer's row).
Variants: the int8 recipe as it is, with int8 dataflow, with stochastic rounding of the gradient operands, with
per-tensor scales, unified-int8 (DSGC-clipped output gradients), sbm (Range BN over 16 chunks of the batch, as
the authors' code; and over one chunk, its form until the eighteenth session) and wageubn (errors rounded to
nearest, its default, and stochastically) and dorefa at k = 8 (its first and last layers float).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import accuracy_full  # noqa: E402 - puts src/ on the path when needed; one split rule

import torch  # noqa: E402


Variant = tuple[Any, dict[str, Any], Callable[[torch.nn.Module], None] | None]


def _one_chunk_range_bn(model: torch.nn.Module) -> None:
    from inttrain.nn.range_bn import RangeBatchNorm2d

    for m in model.modules():
        if isinstance(m, RangeBatchNorm2d):
            m.num_chunks = 1


def variants() -> dict[str, Variant]:
    """name -> (recipe config, prepare_ keywords, a change made to the prepared model or None)."""
    import inttrain
    from inttrain.spec import Rounding

    int8 = inttrain.get_config("int8")
    return {
        "int8": (int8, {}, None),
        "int8-dataflow": (int8, {"dataflow": True}, None),
        "int8, stochastic-rounded gradients": (dataclasses.replace(int8, grad_rounding=Rounding.STOCHASTIC), {}, None),
        "int8, per-tensor scales": (dataclasses.replace(int8, per_channel=False), {}, None),
        "unified-int8": (inttrain.get_config("unified-int8"), {}, None),
        "sbm": (inttrain.get_config("sbm"), {}, None),
        "sbm, Range BN over one chunk": (inttrain.get_config("sbm"), {}, _one_chunk_range_bn),
        "wageubn": (inttrain.get_config("wageubn"), {}, None),
        # the errors E rounded stochastically (G, the 8-bit weight gradient, is the optimizer's, not a GEMM's)
        "wageubn, stochastic-rounded errors": (dataclasses.replace(inttrain.get_config("wageubn"),
                                                                   e_rounding=Rounding.STOCHASTIC), {}, None),
        "dorefa-8": (inttrain.get_config("dorefa").with_bits(8), {}, None),
    }


def probe_variant(model_name: str, weights: dict | None, splits: Any, variant: Variant, batch: int) -> list[Any]:
    import inttrain
    from inttrain.models import build_model
    from inttrain.nn.probe import probe_gemms

    cfg, kw, after = variant
    torch.manual_seed(0)
    model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
    if weights is not None:
        model.load_state_dict(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dorefa-style conv-bit notes are not this tool's business
        inttrain.prepare_(model, cfg, **kw)
    if after is not None:
        after(model)
    x, y = splits.train.tensors[0][:batch], splits.train.tensors[1][:batch]
    return probe_gemms(model, x, y)


def table(results: dict[str, list[Any]], title: str) -> str:
    head = ["variant"] + [f"{g}: median / min dB (layer)" for g in ("forward", "grad_input", "grad_weight")]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in results.items():
        cells = []
        for g in ("forward", "grad_input", "grad_weight"):
            v = sorted((r.sqnr_db, r.layer) for r in rows if r.gemm == g)
            cells.append(f"{statistics.median(a for a, _ in v):.1f} / {v[0][0]:.1f} ({v[0][1]})" if v else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--weights", help="A run's checkpoints/NAME.safetensors (default: seed-0 initial weights).")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--train-size", type=int, default=16000, help="The accuracy benchmark's split. [16000]")
    p.add_argument("--val-size", type=int, default=4000, help="[4000]")
    p.add_argument("--out", default="benchmarks/results/probe_recipes")
    args = p.parse_args(argv)
    for flag in ("batch_size", "train_size", "val_size"):
        if getattr(args, flag) < 1:                     # judged before any model is built
            p.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: allowed: 1 or more")
    torch.set_num_threads(1)
    splits = accuracy_full.load_splits(argparse.Namespace(data=args.data, train_size=args.train_size,
                                                          val_size=args.val_size, split_seed=0))
    weights = None
    if args.weights:
        from safetensors.torch import load_file

        weights = load_file(args.weights)
    results = {}
    for name, variant in variants().items():
        results[name] = probe_variant(args.model, weights, splits, variant, args.batch_size)
        print(f"probed {name}", flush=True)
    where = Path(args.weights).name if args.weights else "seed-0 initial weights"
    text = table(results, f"SQNR of the integer GEMMs against float64: {args.model}, {where}, one batch of "
                          f"{args.batch_size} training images")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe_recipes.md").write_text(text)
    rows = {name: [dataclasses.asdict(r) for r in rows] for name, rows in results.items()}
    (out / "probe_recipes.json").write_text(json.dumps(accuracy_full._clean(rows), indent=1) + "\n")  # inf -> null
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
