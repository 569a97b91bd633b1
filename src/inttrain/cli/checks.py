"""Checks shared by the commands: recipe names and positive numbers (one ``error:`` line each)."""

from __future__ import annotations

from .errors import UsageProblem

__all__ = ["allowed_recipes", "check_recipe", "check_positive"]


def allowed_recipes() -> tuple[str, ...]:
    """Every recipe ``inttrain.prepare_`` knows: the float ones (no converted layers) first."""
    import inttrain

    names = inttrain.recipe_names()
    converts = {n: inttrain.get_config(n).converts_layers() for n in names}
    return tuple(sorted(names, key=lambda n: converts[n]))  # stable: registration order within each group


def check_recipe(recipe: str, field: str) -> None:
    from inttrain.recipes import OTHER_ENGINES

    allowed = allowed_recipes()
    if recipe in OTHER_ENGINES:  # no float master weights or autograd: not a prepare_ recipe (docs/cli.md)
        raise UsageProblem(field, f"{recipe!r} {OTHER_ENGINES[recipe]}")
    if recipe not in allowed:
        raise UsageProblem(field, f"{recipe!r} is not one of: {', '.join(allowed)}")


def check_positive(**values: float | None) -> None:
    """UsageProblem naming the first value (as its ``--flag``) that is given and not > 0."""
    for name, value in values.items():
        if value is not None and not value > 0:
            raise UsageProblem("--" + name.replace("_", "-"), f"{value} must be > 0")
