"""``inttrain recipes`` (names) and ``inttrain recipes show NAME`` (defaults + description)."""

from __future__ import annotations

import dataclasses
import enum
import inspect

__all__ = ["recipe_list", "describe_recipe"]

_FLOAT_DOCS = {
    "fp32": "Plain float32 training (the baseline every integer recipe is compared with).",
    "bf16": "Float training under torch.autocast with bfloat16 (done by the trainer, not prepare_).",
}


def recipe_list() -> list[str]:
    from .app import _allowed_recipes

    return list(_allowed_recipes())


def _first_paragraph(doc: str | None) -> str:
    text = inspect.cleandoc(doc or "")
    return " ".join(text.split("\n\n")[0].split())


def _value(v: object) -> str:
    return v.value if isinstance(v, enum.Enum) else repr(v)


def describe_recipe(name: str) -> str:
    """Default fields of the recipe's config dataclass and the first paragraph of its docstring."""
    from .errors import check_choice

    check_choice("NAME", name, recipe_list())
    import inttrain

    try:
        cfg = inttrain.get_config(name)
    except (ValueError, AttributeError, ImportError):
        cfg = None  # trainer-only recipe (bf16) or no library recipes in this build
    if cfg is None or not dataclasses.is_dataclass(cfg):
        return f"{name}\n  {_FLOAT_DOCS.get(name, '')}".rstrip()
    lines = [f"{name} ({type(cfg).__name__})", f"  {_first_paragraph(type(cfg).__doc__) or _FLOAT_DOCS.get(name, '')}"]
    fields = dataclasses.fields(cfg)
    if fields:
        width = max(len(f.name) for f in fields)
        lines.append("  defaults:")
        lines += [f"    {f.name.ljust(width)}  {_value(getattr(cfg, f.name))}" for f in fields]
    return "\n".join(lines)
