"""The trainer's compiled forward: the default rule, and the eager fallback with one message."""

from __future__ import annotations

import torch
from torch import nn

from inttrain.trainer import compiled
from inttrain.trainer.compiled import CompiledForward, auto_compile


def test_auto_compile_rule(monkeypatch) -> None:
    monkeypatch.setenv("INTTRAIN_COMPILE", "1")
    assert auto_compile(True, False) == (True, "integer layers")  # int8 dataflow included
    assert auto_compile(False, False)[0] is False  # float recipes
    assert auto_compile(True, True)[0] is False  # data parallel
    assert auto_compile(True, False, graph_friendly=False) == (False, "the recipe's per-layer hooks break the graph")
    monkeypatch.setenv("INTTRAIN_COMPILE", "0")
    assert auto_compile(True, False) == (False, "INTTRAIN_COMPILE=0")


def test_compile_failure_falls_back_to_eager_with_one_message(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler here\nsecond line")

    monkeypatch.setattr(compiled.torch, "compile", lambda model: broken)
    model = nn.Linear(3, 2)
    lines: list[str] = []
    fwd = CompiledForward(model, lines.append)
    x = torch.randn(4, 3)
    for _ in range(3):
        assert torch.equal(fwd(x), model(x))
    assert lines == ["torch.compile failed (RuntimeError: no C++ compiler here); training eagerly (--no-compile to skip)"]


def test_recipes_whose_hooks_break_the_graph_do_not_compile_by_default() -> None:
    """unified-int8 branches on each gradient's amax in every layer: compiled, every layer is its own graph and
    the recompile limit is hit, so it trains eagerly unless asked.  dorefa compiles (its gradient transform is a
    frozen dataclass, its 9-bit convolutions are kernels.ops nodes)."""
    import inttrain

    assert [n for n in ("int8", "sbm", "wageubn", "dorefa", "unified-int8", "fp32")
            if inttrain.get_config(n).compiles()] == ["int8", "sbm", "wageubn", "dorefa"]
