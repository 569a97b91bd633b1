"""The device CLI's runs: checkpoints, bit-identical --resume (after --max-seconds stops and after a kill),
--keep-best, limits refused before training, the epoch line and --help."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inttrain.micro import evaluate, load_model
from inttrain.micro.__main__ import main
from inttrain.micro.checkpoint import load_run
from inttrain.micro.io import read_safetensors
from micro_utils import CNN, MLP

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.minimum(d.data * 8, 127).astype(np.int8)
    perm = np.random.default_rng(0).permutation(len(x))
    root = tmp_path_factory.mktemp("run")
    np.savez(root / "tr.npz", x=x[perm[:300]], x_exp=np.int64(-7), y=d.target[perm[:300]])
    np.savez(root / "va.npz", x=x[perm[1437:]], x_exp=np.int64(-7), y=d.target[perm[1437:]])
    np.savez(root / "tr_img.npz", x=x[perm[:1400]].reshape(-1, 1, 8, 8), x_exp=np.int64(-7), y=d.target[perm[:1400]])
    np.savez(root / "tr_nochan.npz", x=x[perm[:64]].reshape(-1, 8, 8), x_exp=np.int64(-7), y=d.target[perm[:64]])
    (root / "mlp.json").write_text(json.dumps(MLP))
    (root / "cnn.json").write_text(json.dumps(CNN))
    return root


def _state(run: Path):
    tensors, _ = read_safetensors(run / "checkpoint.safetensors")
    ck = json.loads((run / "checkpoint.json").read_text())
    return tensors, ck


def _same_run(a: Path, b: Path) -> None:
    ta, ca = _state(a)
    tb, cb = _state(b)
    assert sorted(ta) == sorted(tb) and all(np.array_equal(ta[k], tb[k]) for k in ta)
    assert ca["model"]["params"] == cb["model"]["params"]                     # exponents included
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(ca["history"]) == strip(cb["history"])                       # losses and accuracies bit for bit
    assert (a / "weights.safetensors").read_bytes() == (b / "weights.safetensors").read_bytes()


def test_resume_after_max_seconds_stops_is_bit_identical(files, tmp_path, capsys):
    common = [str(files / "mlp.json"), str(files / "tr.npz"), "--val", str(files / "va.npz"), "--epochs", "3",
              "--momentum-shift", "2", "--nesterov", "--frac-bits", "12", "--log-every", "0"]
    assert main(["train", *common, "--out", str(tmp_path / "whole")]) == 0
    assert main(["train", *common, "--out", str(tmp_path / "parts"), "--max-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "Nesterov momentum 1 - 2^-2, 12 fraction bits" in out
    assert "stopped after" in out and "at epoch 1 step 1/10" in out and f"--resume {tmp_path / 'parts'}" in out
    _, ck = _state(tmp_path / "parts")
    assert ck["epoch"] == 0 and ck["position"]["step"] == 1 and ck["global_step"] == 1
    for _ in range(40):                       # one step per call (a 0-second budget stops after every step)
        if json.loads((tmp_path / "parts" / "checkpoint.json").read_text())["epoch"] == 3:
            break
        assert main(["train", "--resume", str(tmp_path / "parts"), "--max-seconds", "0"]) == 0
    _, ck = _state(tmp_path / "parts")
    assert ck["epoch"] == 3 and ck["global_step"] == 30
    _same_run(tmp_path / "whole", tmp_path / "parts")
    model, _ = load_run(tmp_path / "parts")
    assert all(p.mom is not None and p.mom.any() for p in model.params())   # momentum buffers carried over
    assert all(p.frac is not None and p.frac.dtype == np.int16 and p.frac.any() for p in model.params())  # remainders


def test_checkpoint_remainder_that_matches_no_parameter_is_one_error(files, tmp_path, capsys):
    from inttrain.micro.io import write_safetensors

    run = tmp_path / "run"
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--epochs", "1", "--frac-bits", "8",
                 "--log-every", "0", "--out", str(run)]) == 0
    tensors, meta = read_safetensors(run / "checkpoint.safetensors")
    name = next(k for k in tensors if k.startswith("remainder/"))
    tensors[name] = tensors[name].astype(np.int32)
    write_safetensors(run / "checkpoint.safetensors", tensors, meta)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    assert _one_error(capsys) == (f"error: {run / 'checkpoint.safetensors'}: remainder {name[len('remainder/'):]!r} "
                                  "does not match a parameter (int16, the parameter's shape)")


def test_kill_mid_run_then_resume_is_bit_identical(files, tmp_path):
    args = [str(files / "cnn.json"), str(files / "tr_img.npz"), "--epochs", "6", "--log-every", "0",
            "--momentum-shift", "3"]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "inttrain.micro", "train", *args, "--out", str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        ck = run / "checkpoint.json"
        if ck.exists() and json.loads(ck.read_text())["epoch"] >= 1:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads((run / "checkpoint.json").read_text())["epoch"]
    assert 1 <= done < 6
    assert main(["train", "--resume", str(run)]) == 0
    assert main(["train", *args, "--out", str(tmp_path / "whole")]) == 0
    _same_run(tmp_path / "whole", run)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_mid_epoch_saves_a_checkpoint_and_resume_is_bit_identical(files, tmp_path, sig):
    """A stop signal ends the run at the next step with a mid-epoch checkpoint (exit 128 + signal, no traceback),
    so nothing of the epoch so far is lost; --resume then finishes it bit for bit."""
    args = [str(files / "cnn.json"), str(files / "tr_img.npz"), "--epochs", "3", "--log-every", "1",
            "--momentum-shift", "3"]
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    run = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "inttrain.micro", "train", *args, "--out", str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("train: ")
    assert proc.stdout.readline().startswith("  step 1 ")                   # inside the first epoch
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig and err == ""
    stopped = [line for line in out.splitlines() if line.startswith("stopped after")]
    assert len(stopped) == 1 and f"({signal.Signals(sig).name}) at epoch 1 step " in stopped[0]
    ck = json.loads((run / "checkpoint.json").read_text())
    assert ck["epoch"] == 0 and 1 <= ck["position"]["step"] < 44            # 1400 images: 44 steps an epoch
    assert main(["train", "--resume", str(run), "--log-every", "0"]) == 0
    assert main(["train", *args, "--log-every", "0", "--out", str(tmp_path / "whole")]) == 0
    _same_run(tmp_path / "whole", run)


def test_keep_best_saves_the_best_epoch(files, tmp_path, capsys):
    # the shift rule with too large a rate and errors rounded to nearest swings and collapses (measured: 0.175,
    # 0.353, 0.131, 0.181; with the default hashed error rounding it climbs, 0.128 -> 0.300)
    args = ["train", str(files / "mlp.json"), str(files / "tr.npz"), "--val", str(files / "va.npz"), "--epochs", "4",
            "--schedule", "const", "--lr-mode", "shift", "--lr-shift", "4", "--log-every", "0",
            "--backward-rounding", "rne"]
    assert main([*args, "--keep-best", "--out", str(tmp_path / "best")]) == 0
    assert main([*args, "--out", str(tmp_path / "last")]) == 0
    out = capsys.readouterr().out
    info = json.loads((tmp_path / "best" / "model.json").read_text())["info"]
    accs = [r["val_acc"] for r in info["history"]]
    assert info["best_epoch"] == 1 + int(np.argmax(accs)) == 2 and info["best_val_acc"] == max(accs) > accs[-1]
    assert f"(best epoch {info['best_epoch']}, val_acc {max(accs):.4f})" in out
    va = np.load(files / "va.npz")
    assert evaluate(load_model(tmp_path / "best"), va["x"], -7, va["y"]) == max(accs)
    assert evaluate(load_model(tmp_path / "last"), va["x"], -7, va["y"]) == accs[-1]
    assert info["train"]["lr_shift"] == 4 and info["train"]["schedule"] == "const" and info["train"]["keep_best"]


def test_epoch_line_reports_saturation_schedule_time_and_eta(files, tmp_path, capsys):
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--epochs", "2", "--out",
                 str(tmp_path / "r"), "--log-every", "0", "--update-rounding", "rne"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("train: 300 samples, 9472 weights, 16-bit weight accumulators, norm rule (largest "
                               "step 2^10 codes), cosine schedule, 10 steps/epoch, rounding rne/hstoch/rne")
    ep = [ln for ln in lines if ln.startswith("epoch ")]
    assert len(ep) == 2 and all(" sat 0/9472 " in ln and " eta " in ln and " time " in ln for ln in ep)
    # the batch-norm step's default is recorded as a number (lr_bits - 1), so the run resumes with it
    assert json.loads((tmp_path / "r" / "checkpoint.json").read_text())["settings"]["bn_lr_bits"] == 9
    assert " lr x256/256 " not in ep[1] and " lr x2/256 " in ep[1]          # the cosine near its end: COS_Q8[243]
    doc = json.loads((tmp_path / "r" / "model.json").read_text())
    assert doc["rounding"] == {"forward": "rne", "backward": "hstoch", "update": "rne"}  # recorded in the model
    assert doc["info"]["history"][1]["saturated"] == 0 and doc["info"]["train"]["lr_mode"] == "norm"


def _one_error(capsys) -> str:
    cap = capsys.readouterr()
    assert cap.out == ""                                   # refused before the training banner
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_limits_are_refused_before_training(files, tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["train", str(files / "cnn.json"), str(files / "tr_img.npz"), "--batch-size", "5000", "--out", out]) == 2
    assert _one_error(capsys) == ("error: batch size 5000 makes a weight-gradient reduction of 320000 > 133144 "
                                  "(conv2d); the largest batch this model allows is 2080")
    assert main(["train", str(files / "cnn.json"), str(files / "tr_nochan.npz"), "--out", out]) == 2
    assert _one_error(capsys) == (f"error: {files / 'tr_nochan.npz'}: x has sample shape (8, 8), model wants "
                                  "(1, 8, 8); add the channel axis (x[:, None]) or write the data with "
                                  "`python -m inttrain.micro convert`")
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--keep-best", "--out", out]) == 2
    assert _one_error(capsys) == ("error: --keep-best: needs --val VAL.npz (the best epoch is judged on validation "
                                  "accuracy)")
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--lr-bits", "15", "--out", out]) == 2
    assert _one_error(capsys) == "error: --lr-bits 15: allowed: 0..14"
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--bn-lr-bits", "-1", "--out", out]) == 2
    assert _one_error(capsys) == "error: --bn-lr-bits -1: allowed: 0..14"
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--l2-shift", "31", "--out", out]) == 2
    assert _one_error(capsys) == "error: --l2-shift 31: allowed: 0..30"
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--nesterov", "--out", out]) == 2
    assert _one_error(capsys) == ("error: --nesterov: needs --momentum-shift M (Nesterov momentum is a form of "
                                  "momentum)")
    for bad in ("0", "16"):
        assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--frac-bits", bad, "--out", out]) == 2
        assert _one_error(capsys) == f"error: --frac-bits {bad}: allowed: 1..15"
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "no checkpoint.json there" in _one_error(capsys)
    assert main(["train", str(files / "mlp.json"), str(files / "tr.npz"), "--epochs", "1", "--out", out]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", out, "--epochs", "3", "--lr-bits", "4"]) == 2
    assert _one_error(capsys) == (f"error: --resume {out}: continues with the run's recorded settings, so --epochs, "
                                  "--lr-bits cannot be given; allowed with --resume: --max-seconds, --log-every")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("cmd", [[], ["train"], ["eval"], ["convert"], ["codegen"], ["codegen-check"]])
def test_every_help_shows_defaults_and_an_example(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())        # help wraps lines
    assert "example" in text and "python -m inttrain.micro " in text.split("example")[1]
    if cmd and cmd[0] in ("train", "eval", "codegen", "codegen-check"):
        assert "(default: " in text
    if cmd == ["train"]:
        assert "(default: 10)" in text and "(default: norm)" in text and "(default: cosine)" in text


# ---------------------------------------------------------------------------------------------------
# convert: the three input kinds round-trip to the documented rule


def _images(n=12, h=6, w=5, c=None, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, h, w) if c is None else (n, h, w, c)
    return rng.integers(0, 256, size=shape, dtype=np.uint8), rng.integers(0, 4, size=n).astype(np.int64)


def _converted(path: Path):
    d = np.load(path)
    assert d["x"].dtype == np.int8 and int(d["x_exp"]) == -7 and d["y"].dtype == np.int64
    return d


def test_convert_npz_round_trips(tmp_path, capsys):
    x, y = _images()
    np.savez(tmp_path / "a.npz", images=x, labels=y)
    assert main(["convert", str(tmp_path / "a.npz"), "--out", str(tmp_path / "d.npz")]) == 0
    d = _converted(tmp_path / "d.npz")
    assert d["x"].shape == (12, 1, 6, 5) and np.array_equal(d["x"][:, 0], (x >> 1).astype(np.int8))
    assert np.array_equal(d["y"], y)
    assert np.array_equal(d["x"].astype(np.int64) * 2 + (x[:, None] & 1), x[:, None])   # the rule, inverted
    xc, yc = _images(c=3)                                                   # channels-last colour images
    np.savez(tmp_path / "c.npz", x=xc, y=yc)
    assert main(["convert", str(tmp_path / "c.npz"), "--out", str(tmp_path / "dc.npz"), "--flatten"]) == 0
    dc = _converted(tmp_path / "dc.npz")
    assert np.array_equal(dc["x"], (xc.transpose(0, 3, 1, 2) >> 1).reshape(12, -1).astype(np.int8))
    assert "x int8 (12, 90) at x_exp -7" in capsys.readouterr().out
    np.savez(tmp_path / "bad.npz", x=x.astype(np.int8), y=y)
    assert main(["convert", str(tmp_path / "bad.npz"), "--out", str(tmp_path / "e.npz")]) == 2
    assert "'x' must be uint8 pixels (0..255), got int8" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "a.npz"), "--out", str(tmp_path / "d.npz")]) == 2
    assert "already exists" in capsys.readouterr().err


def _idx(path: Path, a: np.ndarray, gz: bool = False) -> None:
    raw = bytes([0, 0, 8, a.ndim]) + np.array(a.shape, dtype=">u4").tobytes() + a.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


@pytest.mark.parametrize("gz", [False, True])
def test_convert_mnist_idx_round_trips(tmp_path, gz, capsys):
    x, y = _images(n=7, h=28, w=28, seed=1)
    sfx = ".gz" if gz else ""
    _idx(tmp_path / f"img-idx3-ubyte{sfx}", x, gz)
    _idx(tmp_path / f"lab-idx1-ubyte{sfx}", y, gz)
    assert main(["convert", str(tmp_path / f"img-idx3-ubyte{sfx}"), str(tmp_path / f"lab-idx1-ubyte{sfx}"),
                 "--out", str(tmp_path / "d.npz")]) == 0
    d = _converted(tmp_path / "d.npz")
    assert np.array_equal(d["x"], (x[:, None] >> 1).astype(np.int8)) and np.array_equal(d["y"], y)
    (tmp_path / "trunc").write_bytes((tmp_path / f"img-idx3-ubyte{sfx}").read_bytes()[:100] if not gz else b"\0\0\x08\x03")
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "trunc"), str(tmp_path / f"lab-idx1-ubyte{sfx}"), "--out",
                 str(tmp_path / "t.npz")]) == 2
    assert "error: " in capsys.readouterr().err
    assert main(["convert", str(tmp_path / f"img-idx3-ubyte{sfx}"), "--out", str(tmp_path / "u.npz")]) == 2
    assert "needs its idx1-ubyte label file as LABELS" in capsys.readouterr().err


def test_convert_png_folder_round_trips(tmp_path, capsys):
    Image = pytest.importorskip("PIL.Image")
    x, y = _images(n=9, h=7, w=9, seed=2)
    names = ["cat", "dog", "eel", "fox"]
    for i, (img, lab) in enumerate(zip(x, y)):
        (tmp_path / "pngs" / names[lab]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(tmp_path / "pngs" / names[lab] / f"{i:03d}.png")
    assert main(["convert", str(tmp_path / "pngs"), "--out", str(tmp_path / "d.npz")]) == 0
    d = _converted(tmp_path / "d.npz")
    order = sorted(range(9), key=lambda i: (y[i], i))                      # class folders, then file names
    assert np.array_equal(d["x"], (x[order][:, None] >> 1).astype(np.int8)) and np.array_equal(d["y"], y[order])
    assert d["classes"].tolist() == [names[k] for k in sorted(set(y.tolist()))]
