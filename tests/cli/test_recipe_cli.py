"""Recipes from the command line: unified-int8's DCLR and DSGC state survive `inttrain resume` bit for bit, and
configs a recipe cannot run fail before anything is written, in one line that says what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from inttrain.cli.app import main
from inttrain.trainer import load_checkpoint

COMMON = ["--dataset", "digits", "--model", "small-cnn", "--epochs", "1", "--batch-size", "128", "--threads", "1"]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _last(run: Path) -> tuple[dict, dict]:
    return load_checkpoint(run / "checkpoints" / "last.safetensors")


def test_unified_int8_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    assert main(["train", *COMMON, "--recipe", "unified-int8", "--out", str(tmp_path / "whole")]) == 0
    assert main(["train", *COMMON, "--recipe", "unified-int8", "--max-steps", "5", "--out", str(tmp_path / "cut")]) == 0
    _, cut = _last(tmp_path / "cut")
    hooks = cut["layer_hooks"]
    assert set(hooks) == {"features.0", "features.3", "classifier.1"} and hooks["features.0"]["steps"] == 5
    groups = cut["optimizer"]["param_groups"]  # DCLR: one group per converted layer, scaled below the base lr
    assert len(groups) == 4 and groups[0]["lr"] == 0.05 and all(g["lr"] < 0.05 for g in groups[1:])
    assert main(["resume", str(tmp_path / "cut")]) == 0
    (w_whole, s_whole), (w_res, s_res) = _last(tmp_path / "whole"), _last(tmp_path / "cut")
    assert w_whole.keys() == w_res.keys() and all(torch.equal(w_whole[k], w_res[k]) for k in w_whole)
    timeless = lambda hooks: {n: {k: v for k, v in h.items() if k != "search_seconds"} for n, h in hooks.items()}  # noqa: E731
    assert timeless(s_whole["layer_hooks"]) == timeless(s_res["layer_hooks"])


def test_no_dclr_flag_is_saved_and_trains_one_lr(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", *COMMON, "--recipe", "unified-int8", "--no-dclr", "--max-steps", "3", "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["dclr"] is False
    assert [g["lr"] for g in _last(out)[1]["optimizer"]["param_groups"]] == [0.05]


def test_checkpoint_from_before_dclr_resumes_without_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", *COMMON, "--recipe", "unified-int8", "--no-dclr", "--max-steps", "3", "--out", str(out)]) == 0
    state_path = out / "checkpoints" / "last.state.pt"
    state = torch.load(state_path, weights_only=True)
    state.pop("layer_hooks")  # what a checkpoint written before the recipe wiring holds
    state["config"].pop("dclr")
    torch.save(state, state_path)
    assert main(["resume", str(out), "--max-steps", "5"]) == 0
    assert [g["lr"] for g in _last(out)[1]["optimizer"]["param_groups"]] == [0.05]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--recipe", "int3"], "--recipe: 'int3' is not one of: fp32, bf16, int8, int8-mixed, dorefa, unified-int8, sbm, wageubn"),
        (["--recipe", "unified-int8", "--bits", "9"], "--bits: unified-int8 bits=9: allowed 2 to 8"),
        (["--recipe", "sbm", "--bits", "1"], "--bits: sbm bits=1: allowed 2 to 8"),
        (["--recipe", "wageubn", "--bits", "12"], "--bits: wageubn bits=12: allowed 2 to 8"),
        (["--recipe", "int8", "--bits", "17"], "--bits: unsupported bit width 17: inttrain supports 2 to 16 bits"),
        (["--recipe", "fp32", "--bits", "8"], "--bits: 8: recipe 'fp32' has no bit width; use an integer recipe such as int8"),
        (["--recipe", "dorefa", "--bits", "16"], "--bits: dorefa w_bits=16: allowed 2 to 15 bits for Linear and Conv2d layers"),
        (["--recipe", "wageubn", "--optimizer", "adam"], "--optimizer: 'adam': recipe 'wageubn' trains with its own quantized SGD; allowed: sgd"),
    ],
)
def test_configs_a_recipe_cannot_run_fail_in_one_line(args: list[str], expected: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", *COMMON, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + expected) and err.count("\n") == 1, err
    assert not out.exists()  # rejected before the run folder is created


def test_dorefa_bits_sets_all_three_widths(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", *COMMON, "--recipe", "dorefa", "--bits", "4", "--max-steps", "2", "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["bits"] == 4


def test_compare_names_its_own_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--recipes", "fp32,int3"]) == 2
    assert capsys.readouterr().err.startswith("error: --recipes: 'int3' is not one of: fp32, bf16, int8")
