"""``inttrain train`` run folders, exact resume, config layering and checkpoint errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from inttrain.cli.app import main

# digits, batch 64: 1438 train images -> 22 steps per epoch.
BASE = ["--dataset", "digits", "--batch-size", "64", "--threads", "1", "--log-every", "1"]


def _train(out: Path, *extra: str) -> int:
    return main(["train", *BASE, "--out", str(out), *extra])


def _rows(run: Path) -> list[tuple]:
    # Everything but the wall-clock column.
    return [(r["kind"], r["step"], r["epoch"], r["loss"], r["val_accuracy"], r["lr"])
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_run_folder_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _train(run, "--epochs", "1", "--log-every", "5") == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"] == "small-cnn" and cfg["dataset"] == "digits" and cfg["batch_size"] == 64
    assert {"recipe", "bits", "epochs", "lr", "optimizer", "seed", "data_dir"} <= set(cfg)
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["kind", "step", "epoch", "loss", "val_accuracy", "lr", "time_per_step", "val_loss", "val_perplexity",
                             "forward_bits", "grad_bits", "gbitops"]
    assert [r["step"] for r in rows if r["kind"] == "step"] == ["5", "10", "15", "20"]
    epoch_rows = [r for r in rows if r["kind"] == "epoch"]
    assert len(epoch_rows) == 1 and float(epoch_rows[0]["val_accuracy"]) > 0.5
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(rows)
    assert "epoch 1/1" in (run / "train.log").read_text()
    for name in ("last", "best"):
        weights = load_file(run / "checkpoints" / f"{name}.safetensors")
        state = torch.load(run / "checkpoints" / f"{name}.state.pt", weights_only=True)
        assert state["train_state"]["step"] == 22 and state["config"] == cfg
        from inttrain.models import build_model

        assert sorted(weights) == sorted(build_model("small-cnn", 10, 1, 8).state_dict())
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("recipe", ["fp32", "int8"])
def test_resume_is_bit_identical(tmp_path: Path, recipe: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    # Stop mid-epoch 2 (step 30 of 44): the data position within the epoch must be restored.
    assert _train(a, "--recipe", recipe, "--epochs", "2", "--max-steps", "30") == 0
    assert torch.load(a / "checkpoints/last.state.pt", weights_only=True)["train_state"]["position"] == 8
    assert main(["resume", str(a)]) == 0
    assert _train(b, "--recipe", recipe, "--epochs", "2") == 0
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r[1] for r in rows_a if r[0] == "step"] == list(range(1, 45))
    assert rows_a == rows_b  # same losses, step by step, and same val accuracies
    wa, wb = load_file(a / "checkpoints/last.safetensors"), load_file(b / "checkpoints/last.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wb)


def test_config_file_set_and_flags(tmp_path: Path) -> None:
    conf = tmp_path / "run.yaml"
    conf.write_text("epochs: 3\nlr: 0.1\nseed: 4\nmax_steps: 2\n")
    run = tmp_path / "run"
    # file < --set < flags
    assert _train(run, "--config", str(conf), "--set", "lr=0.02", "--set", "seed=5", "--seed", "6") == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert (cfg["epochs"], cfg["lr"], cfg["seed"], cfg["max_steps"]) == (3, 0.02, 6, 2)


@pytest.mark.parametrize(
    ("yaml_text", "sets", "expected"),
    [
        ("epoch: 3\n", [], "error: --config {conf}: unknown key 'epoch'; allowed: model, dataset, data_dir, recipe, bits,"),
        ("", ["lrate=1"], "error: --set: unknown key 'lrate'; allowed: model,"),
        ("", ["epochs=three"], "error: --set: epochs='three': must be an integer"),
        ("", ["epochs"], "error: --set: 'epochs': expected key=value"),
        ("- 1\n", [], "error: --config {conf}: top level is a list; expected a mapping"),
        ("lr: [1]\n", [], "error: --config {conf}: lr=[1]: must be a number"),
    ],
)
def test_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, sets: list[str], expected: str) -> None:
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml_text)
    args = ["--config", str(conf)] + [a for s in sets for a in ("--set", s)]
    assert _train(tmp_path / "run", *args) == 2
    assert _err(capsys).startswith(expected.format(conf=conf))
    assert not (tmp_path / "run").exists()


def test_bits_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path / "r", "--recipe", "int8", "--bits", "40") == 2
    assert _err(capsys) == "error: --bits: unsupported bit width 40: inttrain supports 2 to 16 bits"
    assert _train(tmp_path / "r", "--bits", "6") == 2
    assert _err(capsys).startswith("error: --bits: 6: recipe 'fp32' has no bit width")
    assert not (tmp_path / "r").exists()
    run = tmp_path / "r6"
    assert _train(run, "--recipe", "int8", "--bits", "6", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["bits"] == 6


def test_out_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _train(blocker / "run") == 2
    assert _err(capsys) == f"error: --out: '{blocker / 'run'}': cannot create a folder under '{blocker}' (not writable)"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    assert _train(busy) == 2
    assert _err(capsys).startswith(f"error: --out: '{busy}' already exists and is not empty")


def test_bad_data_leaves_no_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert main(["train", "--dataset", "npz", "--data-dir", str(bad), "--out", str(tmp_path / "run")]) == 2
    assert _err(capsys).startswith("error: --dataset npz: bad.npz: file: not a readable .npz archive")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ckpt") / "run"
    assert _train(run, "--epochs", "1", "--max-steps", "3") == 0
    return run


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda c: (c / "last.safetensors").unlink(), "checkpoint file not found"),
        (lambda c: (c / "last.state.pt").write_bytes((c / "last.state.pt").read_bytes()[:100]),
         "last.state.pt: not a readable checkpoint state file"),
        (lambda c: (c / "last.safetensors").write_bytes((c / "last.safetensors").read_bytes()[:-10]),
         "does not match the last.state.pt record"),
    ],
)
def test_damaged_checkpoint_exits_2(stopped_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    damage, expected: str) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    damage(run / "checkpoints")
    assert main(["resume", str(run)]) == 2
    err = _err(capsys)
    assert err.startswith("error: RUN_DIR: ") and expected in err


def test_resume_of_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resume", str(tmp_path / "nope")]) == 2
    assert _err(capsys).startswith(f"error: RUN_DIR: '{tmp_path / 'nope'}' is not a folder")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_last_and_exits(tmp_path: Path, signum: int) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "inttrain", "train", *BASE, "--epochs", "1000", "--out", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 300  # a loaded machine is slow to its third step, never wrong
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 3):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()  # before reading: a live child blocked on a full stdout pipe would never close stderr
                pytest.fail(f"no third step (exit code {proc.poll()}): {proc.communicate()[1]}")
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum], err
    assert f"interrupted by signal {int(signum)}" in out and "Traceback" not in err
    state = torch.load(run / "checkpoints/last.state.pt", weights_only=True)
    steps = [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert state["train_state"]["step"] == max(steps) >= 3


def test_grad_rounding_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path / "r", "--recipe", "int8", "--grad-rounding", "up") == 2
    assert _err(capsys) == "error: --grad-rounding: 'up': expected nearest or stochastic"
    assert _train(tmp_path / "r", "--recipe", "dorefa", "--grad-rounding", "stochastic") == 2
    assert _err(capsys) == ("error: --grad-rounding: stochastic: recipe 'dorefa' has no gradient rounding choice; "
                            "use int8, sbm, unified-int8 or wageubn")
    assert not (tmp_path / "r").exists()
    run = tmp_path / "gsr"
    assert _train(run, "--recipe", "int8", "--grad-rounding", "stochastic", "--max-steps", "2") == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["grad_rounding"], saved["weight_grad_rounding"]) == ("stochastic", None)


def test_grad_rounding_reaches_the_input_gradient_gemm() -> None:
    from inttrain.cli.run import recipe_config_for
    from inttrain.spec import Rounding

    cfg = recipe_config_for("int8", None, None, "stochastic")
    prec = cfg.precision_for(torch.nn.Linear(4, 4), "fc")
    assert prec.grad_input.lhs.rounding is Rounding.STOCHASTIC
    assert prec.grad_weight.lhs.rounding is Rounding.STOCHASTIC  # the int8 default for dW, unchanged
    nearest = recipe_config_for("int8", None, "nearest", "stochastic").precision_for(torch.nn.Linear(4, 4), "fc")
    assert (nearest.grad_input.lhs.rounding, nearest.grad_weight.lhs.rounding) == (Rounding.STOCHASTIC,
                                                                                   Rounding.NEAREST_EVEN)


def test_weight_grad_rounding_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path / "r", "--recipe", "int8", "--weight-grad-rounding", "sr") == 2
    assert _err(capsys) == "error: --weight-grad-rounding: 'sr': expected nearest or stochastic"
    assert _train(tmp_path / "r", "--weight-grad-rounding", "stochastic") == 2
    assert _err(capsys) == ("error: --weight-grad-rounding: stochastic: recipe 'fp32' has no weight-gradient "
                            "rounding choice; use int8")
    assert not (tmp_path / "r").exists()
    run = tmp_path / "wsr"
    assert _train(run, "--recipe", "int8", "--weight-grad-rounding", "stochastic", "--bits", "6",
                  "--max-steps", "2") == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["weight_grad_rounding"], saved["bits"]) == ("stochastic", 6)


def test_first_last_float_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path / "r", "--first-last-float") == 2
    assert _err(capsys) == ("error: --first-last-float: recipe 'fp32' has no first/last-layer choice; "
                            "use int8 or dorefa")
    assert not (tmp_path / "r").exists()
    run = tmp_path / "fl"
    assert _train(run, "--recipe", "int8", "--first-last-float", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["first_last_float"] is True
    from inttrain.cli.run import recipe_config_for

    assert recipe_config_for("dorefa", None, first_last_float=False).first_last_float is False
    assert recipe_config_for("int8", None, first_last_float=True).first_last_float is True


def test_bf16_activations_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path / "r", "--bf16-activations") == 2
    assert _err(capsys) == ("error: --bf16-activations: recipe 'fp32' has no bfloat16-activation choice; use int8")
    assert not (tmp_path / "r").exists()
    run = tmp_path / "bf"
    assert _train(run, "--recipe", "int8", "--bf16-activations", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["bf16_activations"] is True


@pytest.mark.parametrize("args,message", [
    (["--recipe", "int8", "--activation-range", "max"],
     "error: --activation-range: recipe 'int8' has no activation-range choice; use dorefa"),
    (["--recipe", "dorefa", "--activation-range", "wide"],
     "error: --activation-range: dorefa activation_range='wide': allowed clip, max"),
    (["--recipe", "int8", "--norm-bits", "16"], "error: --norm-bits: recipe 'int8' has no quantized batch norm; use wageubn"),
    (["--recipe", "wageubn", "--weight-grad-bits", "30"], "error: --weight-grad-bits: wageubn g_bits=30: allowed 2 to 24"),
    (["--recipe", "fp32", "--weight-grad-bits", "16"],
     "error: --weight-grad-bits: recipe 'fp32' has no quantized weight gradient; use wageubn"),
    (["--recipe", "int8", "--no-range-bn"], "error: --no-range-bn: recipe 'int8' has no Range BN choice; use sbm"),
    (["--recipe", "sbm", "--per-sample-grad"],
     "error: --per-sample-grad: recipe 'sbm' has no per-sample gradient scale choice; use int8 or wageubn")])
def test_recipe_option_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert _train(tmp_path / "r", *args) == 2
    assert _err(capsys) == message
    assert not (tmp_path / "r").exists()


def test_activation_range_option(tmp_path: Path) -> None:
    run = tmp_path / "max"
    assert _train(run, "--recipe", "dorefa", "--activation-range", "max", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["activation_range"] == "max"


def test_sbm_without_range_bn_option(tmp_path: Path) -> None:
    run = tmp_path / "sbm"
    assert _train(run, "--recipe", "sbm", "--no-range-bn", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["range_bn"] is False


def test_per_sample_grad_option(tmp_path: Path) -> None:
    run = tmp_path / "pt"
    assert _train(run, "--recipe", "int8", "--no-per-sample-grad", "--max-steps", "2") == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["per_sample_grad"] is False
    wide = tmp_path / "wide"  # the default per-sample scales at 12-bit codes: the two-half GEMM takes them too
    assert _train(wide, "--recipe", "int8", "--bits", "12", "--per-sample-grad", "--max-steps", "2") == 0
    wage = tmp_path / "wageubn"  # inttrain's option there (the paper: one scale per tensor)
    assert _train(wage, "--recipe", "wageubn", "--per-sample-grad", "--max-steps", "2") == 0
    assert yaml.safe_load((wage / "config.yaml").read_text())["per_sample_grad"] is True


def test_wageubn_width_options(tmp_path: Path) -> None:
    run = tmp_path / "w"
    assert _train(run, "--recipe", "wageubn", "--norm-bits", "16", "--weight-grad-bits", "12", "--max-steps", "2") == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["norm_bits"], saved["weight_grad_bits"]) == (16, 12)
