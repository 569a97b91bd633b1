"""The CLI explains itself: -h and --help everywhere, defaults and an example in every command's help,
--version, and ``recipes show`` for every recipe including integer-only."""

from __future__ import annotations

import re

import pytest
import typer

import inttrain
from inttrain.cli.app import app, main


def _commands() -> list[list[str]]:
    """Every command path, e.g. ["train"], ["recipes", "show"]."""
    paths = []

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                paths.append([*prefix, name])
                walk(cmd, [*prefix, name])
            else:
                paths.append([*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


COMMANDS = _commands()


def test_every_command_is_covered():
    assert {p[0] for p in COMMANDS} >= {"train", "resume", "eval", "cost", "export", "plot", "compare", "recipes",
                                         "demo", "env"}


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_help_has_an_example_and_minus_h(path, capsys):
    assert main([*path, "-h"]) == 0
    short = capsys.readouterr().out
    assert main([*path, "--help"]) == 0
    assert capsys.readouterr().out == short
    examples = re.findall(r"Example: (inttrain [^\n]*(?:\n  [^\n ][^\n]*)*)", short)
    assert examples and examples[0].split()[1] == path[0], short


@pytest.mark.parametrize("option, default", [("--recipe", "fp32"), ("--model", "small-cnn"), ("--epochs", "5"),
                                             ("--lr", "0.05"), ("--dataset", "digits")])
def test_train_help_shows_the_config_defaults(option, default, capsys):
    assert main(["train", "-h"]) == 0
    # help text is wrapped at the terminal width inside a box: join the words, drop the box's sides
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    block = text.split(" Options ", 1)[1].split(f" {option} <", 1)[1]
    block = re.split(r" --[\w,-]+ <", block, maxsplit=1)[0]  # up to the next option's "--name <type>"
    assert f"[default: {default}]" in block


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"inttrain {inttrain.__version__}\n"


@pytest.mark.parametrize("name", ["fp32", "bf16", "int8", "int8-mixed", "dorefa", "unified-int8", "sbm", "wageubn",
                                  "integer-only"])
def test_recipes_show_says_paper_bits_integer_and_float(name, capsys):
    assert main(["recipes", "show", name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].strip() for ln in lines[2:5]] == ["paper", "integer", "float"]
    assert all(len(ln.split(":", 1)[1].strip()) > 3 for ln in lines[2:5])
    assert "defaults:" in lines
    if name not in ("fp32", "bf16"):
        assert "bits per GEMM:" in lines


def test_recipes_show_gemm_table_reads_the_config(capsys):
    assert main(["recipes", "show", "sbm"]) == 0
    out = capsys.readouterr().out
    # gradient bifurcation: 8-bit dx, 16-bit dW output gradient, stochastic rounding
    assert "grad_input   dx = dy W    int8/channel(axis=0)/sr x int8/channel(axis=0)/rne" in out
    assert "grad_weight  dW = dy^T x  int16/channel(axis=0)/sr x int8/channel(axis=0)/rne" in out
