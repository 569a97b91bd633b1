"""docs/integer-training.md §11-§12 describe inttrain.integer_only and its recipe; keep the names it cites real."""

from pathlib import Path

from inttrain import integer_only
from inttrain.integer_only import loss, ops, optim

DOC = (Path(__file__).resolve().parents[2] / "docs" / "integer-training.md").read_text()


def test_section_exists_and_names_exist():
    assert "## 11. PyTorch implementation (`inttrain.integer_only`)" in DOC
    assert "**Not covered yet**" in DOC and "batch normalization" in DOC and "residual" in DOC
    for name in ("Sequential", "train_step", "train_epoch", "Linear", "Conv2d", "ReLU", "MaxPool2d", "Flatten",
                 "IntTensor", "Param", "SGD", "BatchNorm", "Residual", "add_aligned"):
        assert hasattr(integer_only, name) and name in DOC, name
    for mod, name in ((ops, "shift_round"), (ops, "shift_left_saturate"), (ops, "requantize"),
                      (loss, "softmax_cross_entropy_grad"), (loss, "EXP2_LUT"), (optim, "SGD")):
        assert hasattr(mod, name), name
    assert hasattr(integer_only.Sequential, "save") and hasattr(integer_only.Sequential, "load")


def test_recipe_section_names_exist():
    from inttrain.recipes import integer_only as recipe

    assert "## 12. Recipe entry point (`inttrain.recipes.integer_only`)" in DOC
    for name in ("IntegerOnlyConfig", "convert", "optimizer", "float_to_codes"):
        assert hasattr(recipe, name) and name in DOC, name
