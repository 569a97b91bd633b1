"""Step time of per-sample DFQ against batch-level DFQ and static 8-bit, in one process (issue 19).

Every policy trains the same prepared model (int8 recipe) on the same random CIFAR-sized batches; the steps
of the policies are interleaved (one step of each in turn), so load from other processes hits all of them
alike, and the table gives the median step time and its ratio to static 8-bit.  Per-sample DFQ splits every
gated layer's batch by the chosen width and runs one forward GEMM / convolution per width present (the
backward once for the batch: the widths share its precision, see inttrain.nn.per_sample): its overhead is
the extra forward calls, the gather/scatter of rows and the gates.  Fewer bits do not run faster on this CPU (2..8-bit codes use the int8
kernels), so the best any DFQ policy can do here is to match static 8-bit.

    python benchmarks/dfq_overhead.py --model resnet20 --batch-size 128 --steps 20 --threads 1 \\
        --out benchmarks/results/dfq_overhead

``dfq-uniform``: per-sample gates whose three options are equally likely (``init_logit=0``: on average
three widths per layer and batch, the most groups); ``dfq``: the default start (``init_logit=2``, mostly 8
bits).  Writes ``OUT/results.md`` and ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import inttrain
from inttrain.models import build_model
from inttrain.recipes.fractrain_dfq import DFQConfig, attach_dfq

POLICIES = ("static8", "dfq-batch", "dfq", "dfq-uniform")


def make_policy(name: str, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, optimizer, DFQ controller or None), all from the same initialisation."""
    torch.manual_seed(args.seed)
    model = build_model(args.model, 10, 3, args.image_size)
    inttrain.prepare_(model, "int8")
    dfq = None
    if name != "static8":
        cfg = DFQConfig(per_sample=name != "dfq-batch", init_logit=0.0 if name == "dfq-uniform" else 2.0,
                        seed=args.seed)
        dfq = attach_dfq(model, cfg)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), dfq


def step(model: Any, opt: Any, dfq: Any, x: torch.Tensor, y: torch.Tensor) -> float:
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if dfq is not None:
        dfq.step(float(loss.detach()))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per policy (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/dfq_overhead"))
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names or any(p not in POLICIES for p in names):
        ap.error(f"--policies: {names!r}: allowed {', '.join(POLICIES)}")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    n = args.batch_size
    batches = [(torch.randn(n, 3, args.image_size, args.image_size, generator=g), torch.randint(0, 10, (n,), generator=g))
               for _ in range(args.warmup + args.steps)]
    runs = {name: make_policy(name, args) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    widths: dict[str, list[float]] = {name: [] for name in names}
    for i, (x, y) in enumerate(batches):
        for name in names:
            model, opt, dfq = runs[name]
            t = step(model, opt, dfq, x, y)
            if i >= args.warmup:
                times[name].append(t)
                if dfq is not None:  # widths present per gated layer in this step
                    widths[name].append(statistics.mean(len(c) for c in dfq.last_counts.values()))
    ref = statistics.median(times[names[0]]) if names[0] == "static8" else float("nan")
    rows = [{"policy": name, "median_ms": 1e3 * statistics.median(times[name]),
             "ratio_to_static8": statistics.median(times[name]) / ref,
             "widths_per_layer": statistics.mean(widths[name]) if widths[name] else 1.0,
             "times_ms": [round(1e3 * t, 2) for t in times[name]]} for name in names]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    table = ["| policy | median ms/step | / static 8-bit | widths per layer and step |", "|---|---|---|---|"]
    table += [f"| {r['policy']} | {r['median_ms']:.1f} | {r['ratio_to_static8']:.2f}x | {r['widths_per_layer']:.2f} |"
              for r in rows]
    md = ["# DFQ overhead: per-sample vs batch-level vs static 8-bit", "",
          f"`python benchmarks/dfq_overhead.py {' '.join(sys.argv[1:] if argv is None else argv)}`", "",
          f"{args.model}, batch {n}, {args.image_size}x{args.image_size} inputs, int8 recipe, eager, "
          f"{args.threads} thread(s), torch {torch.__version__}; {args.steps} timed steps per policy after "
          f"{args.warmup} warm-up steps, policies interleaved step by step.", "", *table, "",
          "Fewer bits do not run faster on this CPU (every width runs on the int8 kernels): the ratios are the "
          "overhead of the gates and of splitting the batch (one forward call per width present, the backward "
          "once per layer). One run on a shared CPU: ratios are meaningful, absolute times vary.", ""]
    (args.out / "results.md").write_text("\n".join(md))
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
