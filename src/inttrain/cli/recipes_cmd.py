"""``inttrain recipes`` (names) and ``inttrain recipes show NAME`` (paper, bits per GEMM, integer vs float, defaults)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys

__all__ = ["recipe_list", "describe_recipe", "SHOW_ONLY"]

# The recipe objects state their own facts (RecipeConfig.facts); recipes with their own engine
# (inttrain.recipes.OTHER_ENGINES) are shown, not trained, and state theirs here.
_ENGINE_FACTS: dict[str, tuple[str, str, str]] = {
    "integer-only": ("Wang et al., NITI: Training Integer Neural Networks Using Integer-only Arithmetic, "
                     "IEEE TPDS 2022",
                     "everything in a training step: int8 codes with power-of-two exponents, int32 accumulators, "
                     "rounding shifts, integer softmax cross-entropy gradient, integer SGD with int16 master "
                     "weights",
                     "nothing (float only to convert the initial weights); train it with the Python API or "
                     "python -m inttrain.micro, not inttrain train"),
}
SHOW_ONLY = tuple(_ENGINE_FACTS)

_GEMMS = {"Linear": (("forward", "y  = x W^T"), ("grad_input", "dx = dy W"), ("grad_weight", "dW = dy^T x")),
          "Conv2d": (("forward", "y  = x * W"), ("grad_input", "dx = dy *T W"), ("grad_weight", "dW = dy * x"))}


def recipe_list() -> list[str]:
    from .checks import allowed_recipes

    return list(allowed_recipes())


def _first_paragraph(doc: str | None) -> str:
    text = inspect.cleandoc(doc or "")
    return " ".join(text.split("\n\n")[0].split())


def _value(v: object) -> str:
    return v.value if isinstance(v, enum.Enum) else repr(v)


def _config(name: str):
    if name == "integer-only":
        from inttrain.recipes.integer_only import IntegerOnlyConfig

        return IntegerOnlyConfig()
    import inttrain

    return inttrain.get_config(name)


def _gemm_lines(cfg) -> list[str]:
    """Bits and scale granularity of each GEMM, for a sample Linear and Conv2d layer."""
    from torch import nn

    lines = []
    for kind, layer in (("Linear", nn.Linear(16, 16)), ("Conv2d", nn.Conv2d(4, 4, 3))):
        try:
            prec = cfg.precision_for(layer, kind.lower())
        except ValueError as e:  # e.g. dorefa's default bits on a Conv2d
            lines.append(f"  {kind}: not at the default bits ({e})")
            continue
        if prec is None:
            lines.append(f"  {kind}: float")
            continue
        lines.append(f"  {kind} (codes/scale granularity/rounding, lhs x rhs):")
        lines += [f"    {g:<12} {eq:<12} {getattr(prec, g)}" for g, eq in _GEMMS[kind]]
    return lines


def describe_recipe(name: str) -> str:
    """The recipe's paper, bits per GEMM, what is integer and what float, and its config defaults."""
    from .errors import check_choice

    check_choice("NAME", name, [*recipe_list(), *SHOW_ONLY])
    cfg = _config(name)
    module = sys.modules[type(cfg).__module__]
    summary = re.sub(r":\w+:`([^`]*)`", r"\1", _first_paragraph(module.__doc__)).replace("``", "")
    facts = getattr(cfg, "facts", ("", "", ""))
    paper, integer, floating = facts if any(facts) else _ENGINE_FACTS.get(name, facts)
    lines = [f"{name} ({type(cfg).__name__})", f"  {summary}", f"  paper:   {paper}", f"  integer: {integer}",
             f"  float:   {floating}"]
    if hasattr(cfg, "converts_layers") and cfg.converts_layers():
        lines += ["bits per GEMM:", *_gemm_lines(cfg)]
    elif name == "integer-only":
        lines += ["bits per GEMM:", "  every GEMM: int8 codes x int8 codes -> int32, power-of-two exponents"
                  f" (master weights int{cfg.weight_bits})"]
    fields = [f for f in dataclasses.fields(cfg)] if dataclasses.is_dataclass(cfg) else []
    if fields:
        width = max(len(f.name) for f in fields)
        lines.append("defaults:")
        lines += [f"  {f.name.ljust(width)}  {_value(getattr(cfg, f.name))}" for f in fields]
    return "\n".join(lines)
