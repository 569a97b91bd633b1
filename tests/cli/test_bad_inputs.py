"""Issue 15: every class of bad input gets one ``error:`` line and exit 2 from ``inttrain`` (or works, where
legitimate), judged before the large allocation it implies, and leaves nothing half-written.

The hostile files are generated here; ``test_refusals_stay_small`` runs them in a fresh interpreter and
bounds its peak memory.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from inttrain.cli.app import main

FAST = ["--threads", "1", "--max-steps", "1", "--model", "mlp"]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _refused(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> str:
    assert main(args) == 2
    err = _err(capsys)
    assert err.startswith("error: ") and expected in err, err
    return err


# ----------------------------------------------------------------------------- hostile files


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npz_with_huge_header(path: Path) -> Path:
    """x declares 10^12 float32 elements but stores 64 bytes."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", npy_header((10**6, 10**6)) + b"\0" * 64)
        z.writestr("y.npy", npy_header((10,), "<i8") + b"\0" * 80)
    return path


def npz_bomb(path: Path, mib: int = 64) -> Path:
    """A legitimate-looking npz whose x expands from ~64 KiB to ``mib`` MiB."""
    n = mib << 20
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            f.write(npy_header((n // 64, 8, 8), "|u1"))
            chunk = bytes(1 << 20)
            for _ in range(mib):
                f.write(chunk)
        z.writestr("y.npy", npy_header((n // 64,), "<i8"))
    return path


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose IHDR declares ``width`` x ``height`` (8-bit gray) and whose pixel data is a few bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))
    return path


def idx_gz(path: Path, dims: tuple[int, ...], payload: int) -> Path:
    header = struct.pack(">HBB", 0, 8, len(dims)) + struct.pack(f">{len(dims)}I", *dims)
    with gzip.open(path, "wb") as f:
        f.write(header)
        f.write(bytes(payload))
    return path


# ----------------------------------------------------------------------------- data


def test_npz_header_beyond_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = npz_with_huge_header(tmp_path / "h.npz")
    _refused(capsys, ["train", "--dataset", "npz", "--data-dir", str(p), "--out", str(tmp_path / "r")],
             "h.npz: x: header declares shape (1000000, 1000000) float32 (4000000000000 bytes) but the member "
             "holds 192 bytes; allowed: a header that matches its data")
    assert not (tmp_path / "r").exists()


def test_npz_member_expanding_past_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = npz_bomb(tmp_path / "bomb.npz", mib=16)
    assert p.stat().st_size < 1 << 20
    _refused(capsys, ["train", "--dataset", "npz", "--data-dir", str(p), "--set", "max_memory_gb=0.01",
                      "--out", str(tmp_path / "r")],
             "bomb.npz: its 2 arrays (uncompressed) would need 0.0156 GiB, more than the memory limit of 0.01 GiB; "
             "allowed: up to max_memory_gb")


def test_idx_gz_declaring_or_expanding_too_much(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "mnist"
    d.mkdir()
    idx_gz(d / "train-images-idx3-ubyte.gz", (2**32 - 1, 28, 28), 0)
    idx_gz(d / "train-labels-idx1-ubyte.gz", (10,), 10)
    _refused(capsys, ["train", "--dataset", "mnist", "--data-dir", str(d)],
             "train-images-idx3-ubyte.gz: dims [4294967295, 28, 28] would need 2.82e+04 GiB")
    # The header says 10 images; the gzip stream goes on for 8 MiB: reading stops one byte past the 10.
    idx_gz(d / "train-images-idx3-ubyte.gz", (10, 28, 28), 8 << 20)
    _refused(capsys, ["train", "--dataset", "mnist", "--data-dir", str(d)],
             "train-images-idx3-ubyte.gz: length: more than 7856 bytes; dims [10, 28, 28] need 7856 (trailing bytes)")


def test_png_declaring_a_huge_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, size, expected in (
        ("big", 9000, "image of 9000x9000 pixels; allowed: at most 8192x8192 (--set max_image_side=N)"),
        ("bomb", 100_000, "image: cannot read (DecompressionBombError"),
    ):
        root = tmp_path / name
        for cls in ("a", "b"):
            (root / cls).mkdir(parents=True)
            png_header(root / cls / "0.png", size, size)
        _refused(capsys, ["train", "--dataset", "folder", "--data-dir", str(root)], expected)


def test_text_file_endless_or_too_large(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["train", "--model", "gpt-small", "--dataset", "text"]
    _refused(capsys, [*base, "--data-dir", "/dev/zero"], "/dev/zero: data_dir: not a regular file")
    sparse = tmp_path / "huge.txt"
    with open(sparse, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, sparse: nothing is written, and nothing may be read
    _refused(capsys, [*base, "--data-dir", str(sparse)], "huge.txt: a text dataset of 1099511627776 bytes would need")
    # seq_len far past a real context: refused at once (it used to loop for minutes computing a minimum length).
    _refused(capsys, [*base, "--data-dir", str(sparse), "--seq-len", "1000000000"],
             "--seq-len: seq_len=1000000000: too large; allowed: at most 1,048,576")


@pytest.mark.parametrize(("y", "expected"), [
    (np.full(10, 2**40, dtype=np.uint64), "1099511627777 classes (num_classes=1099511627777 inferred from "
                                          "max(y_train)+1) exceed the limit of 10000"),
    (np.full(10, 10**5), "100001 classes (num_classes=100001 inferred from max(y_train)+1) exceed the limit of 10000"),
    (np.arange(10, dtype=np.float32), "dtype float32: labels must be integers"),
    (np.array([0, 1, -1, 2, 3, 4, 5, 6, 7, 8]), "y_train[2]: label -1 out of range [0, 9)"),
])
def test_labels_of_the_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str], y: np.ndarray, expected: str) -> None:
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((10, 8, 8), np.uint8), y=y)
    _refused(capsys, ["train", "--dataset", "npz", "--data-dir", str(p), "--out", str(tmp_path / "r")], expected)
    assert not (tmp_path / "r").exists()


def test_uint64_labels_in_range_train(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(p, x=rng.integers(0, 255, (20, 8, 8), dtype=np.uint8), y=np.arange(20, dtype=np.uint64) % 3)
    assert main(["train", *FAST, "--dataset", "npz", "--data-dir", str(p), "--out", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "checkpoints" / "last.safetensors").is_file()


@pytest.mark.parametrize("dataset", ["npz", "mnist", "text"])
def test_empty_file_is_an_error_not_an_abort(tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str) -> None:
    if dataset == "mnist":
        (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")
        (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"")
        data, model, expected = tmp_path, [], "train-images-idx3-ubyte: header: 0 bytes"
    else:
        data = tmp_path / "empty"
        data.write_bytes(b"")
        model = ["--model", "gpt-small"] if dataset == "text" else []
        expected = {"npz": "empty: file: not a readable .npz archive",
                    "text": "text: file is empty"}[dataset]
    _refused(capsys, ["train", "--dataset", dataset, "--data-dir", str(data), *model], expected)


# ----------------------------------------------------------------------------- config and sizes


@pytest.mark.parametrize(("text", "expected"), [
    ("- 1\n- 2\n", "top level is a list; expected a mapping of key: value"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 8 levels deep"),
    ("a: &a [1, 1]\nb: [*a, *a]\n", "uses a YAML anchor/alias (&name / *name); allowed: plain key: value pairs"),
    ("batch_size: 1.0e+23\n", "batch_size=1e+23: too large; allowed: at most 16,777,216"),
    ("seed: -5\n", "--seed: -5 must be >= 0"),  # NumPy's generators (data split, order) take no negative seed
    ("lr: .nan\n", "lr=nan: must be a finite number"),
    ("epochs: [1, 2]\n", "epochs=[1, 2]: must be an integer"),
    ("model: {a: 1}\n", "model={'a': 1}: must be a string"),
    ("batch_size: 32\n" + "#" * (1 << 20), "larger than 1048576 bytes"),
    ("\udcff", "not UTF-8 text"),
])
def test_config_files_refused_before_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                    expected: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(text.encode("utf-8", "surrogateescape"))
    _refused(capsys, ["train", "--config", str(cfg), "--out", str(tmp_path / "r")], expected)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["train", "--model", "gpt-small", "--set", "d_model=60000"],
     "--model gpt-small --batch-size 32: 172,808,280,000 parameters"),
    (["cost", "--batch-size", "50000000"], "--model small-cnn --batch-size 50000000: 9,978 parameters"),
    (["train", "--batch-size", "100000000"], "batch_size=100000000: too large; allowed: at most 16,777,216"),
])
def test_sizes_that_do_not_fit_are_refused_from_an_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            args: list[str], expected: str) -> None:
    if "gpt-small" in args:
        (tmp_path / "t.txt").write_text("hello world, " * 200)
        args = [*args, "--dataset", "text", "--data-dir", str(tmp_path / "t.txt")]
    err = _refused(capsys, args, expected)
    assert "more than the memory limit" in err or "too large" in err


# ----------------------------------------------------------------------------- run folders and paths


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bad") / "run"
    assert main(["train", *FAST, "--dataset", "digits", "--out", str(out)]) == 0
    return out


def _copy(run: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(run, dest)
    return dest


def test_metrics_with_garbage_lines(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _copy(run, tmp_path / "r")
    row = {"kind": "step", "step": 1, "epoch": 1, "loss": 2.3, "val_accuracy": None, "lr": 0.05}
    good = [json.dumps(row) + "\n", json.dumps({**row, "step": 2}) + "\n"]
    for garbage, expected in (("{not json\n", "line 3: not JSON"), ("[1, 2]\n", "line 3: not a metrics row"),
                              ('{"kind": "step", "step": "x", "epoch": 1}\n', "line 3: not a metrics row"),
                              ('{"kind": "epoch", "step": 2, "epoch": 1, "loss": "NaN"}\n', "line 3: not a metrics row")):
        (r / "metrics.jsonl").write_text("".join(good) + garbage)
        _refused(capsys, ["plot", str(r)], expected)
        assert not list((r / "plots").glob("*.png")) if (r / "plots").exists() else True
    (r / "metrics.jsonl").write_text("".join(good))
    assert main(["plot", str(r)]) == 0
    assert sorted(p.name for p in (r / "plots").iterdir()) == ["accuracy.png", "loss.png", "lr.png"]  # no temp files


def test_killed_run_metrics_partial_last_line(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kill mid-write leaves a last line without its newline: plot skips it, resume drops it."""
    r = _copy(run, tmp_path / "r")
    row = {"kind": "step", "step": 1, "epoch": 1, "loss": 2.3, "val_accuracy": None, "lr": 0.05}
    (r / "metrics.jsonl").write_text(json.dumps(row) + "\n" + '{"kind": "st')
    assert main(["plot", str(r)]) == 0
    assert main(["resume", str(r), "--max-steps", "2"]) == 0
    lines = (r / "metrics.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines) and json.loads(lines[0])["step"] == 1


def test_cifar_batch_that_never_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "cifar-10-batches-bin"
    d.mkdir()
    (d / "data_batch_1.bin").symlink_to("/dev/zero")
    _refused(capsys, ["train", "--dataset", "cifar10", "--data-dir", str(tmp_path)],
             "data_batch_1.bin: file: not a regular file; allowed: a CIFAR-10 binary batch file")


def test_state_file_missing_a_key(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _copy(run, tmp_path / "r")
    s_path = r / "checkpoints" / "last.state.pt"
    state = torch.load(s_path, weights_only=True)
    del state["train_state"]["position"]
    torch.save(state, s_path)
    _refused(capsys, ["resume", str(r)], "last.state.pt: missing or malformed train_state.position; allowed: a state "
                                         "file written by `inttrain train`")


def test_checkpoint_config_describing_a_huge_model(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The config inside a checkpoint is judged like a command line: sizes are estimated before building."""
    r = _copy(run, tmp_path / "r")
    for name in ("best", "last"):
        s_path = r / "checkpoints" / f"{name}.state.pt"
        if s_path.is_file():
            state = torch.load(s_path, weights_only=True)
            state["config"].update(model="resnet56", batch_size=16_777_216)
            torch.save(state, s_path)
    for cmd in (["eval", str(r)], ["resume", str(r)]):
        _refused(capsys, cmd, "--model resnet56 --batch-size 16777216: ")
    state = torch.load(r / "checkpoints" / "last.state.pt", weights_only=True)
    state["config"]["batch_size"] = 1e23
    torch.save(state, r / "checkpoints" / "last.state.pt")
    _refused(capsys, ["resume", str(r)], "config: batch_size=1e+23: too large; allowed: at most 16,777,216")


def test_refused_pickle_is_one_line(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = _copy(run, tmp_path / "r")
    state = torch.load(r / "checkpoints" / "last.state.pt", weights_only=True)
    state["evil"] = os.system  # a global weights_only refuses: no code runs from a checkpoint
    torch.save(state, r / "checkpoints" / "last.state.pt")
    _refused(capsys, ["resume", str(r)], "last.state.pt: not a readable checkpoint state file (UnpicklingError")


def test_eval_and_export_given_a_state_file(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pt = run / "checkpoints" / "last.state.pt"
    _refused(capsys, ["eval", str(pt)], "not a checkpoint this command reads (.pt); allowed: a run folder or the "
                                        "NAME.safetensors of a checkpoint pair (not its .state.pt)")
    _refused(capsys, ["export", str(pt), "--out", str(tmp_path / "m")], "not a checkpoint this command reads (.pt)")
    assert not (tmp_path / "m").exists()


def test_export_out_onto_an_existing_path_needs_force(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "model"
    existing.mkdir()
    (existing / "model.json").write_text("{}")
    _refused(capsys, ["export", str(run), "--out", str(existing)],
             "already exists; allowed: a new path, or --force to replace it")
    assert (existing / "model.json").read_text() == "{}"
    f = tmp_path / "file"
    f.write_text("keep")
    _refused(capsys, ["export", str(run), "--out", str(f), "--force"], "is a file; allowed: a folder path")
    assert f.read_text() == "keep"
    _refused(capsys, ["export", str(run / "checkpoints" / "last.safetensors"), "--out", str(run), "--force"],
             f"is (or holds) the source '{run / 'checkpoints' / 'last.safetensors'}'; allowed: another folder")
    assert (run / "checkpoints" / "last.safetensors").is_file()


def test_stale_checkpoint_temp_files_ignored_then_cleaned(run: Path, tmp_path: Path) -> None:
    from inttrain.trainer import load_checkpoint, save_checkpoint

    r = _copy(run, tmp_path / "r")
    ck = r / "checkpoints"
    stale = [ck / ".last.safetensors.abc.tmp", ck / ".last.state.pt.abc.tmp"]
    for p in stale:
        p.write_bytes(b"half-written by a killed save")
    weights, state = load_checkpoint(ck / "last.safetensors")  # the temp files are never read
    save_checkpoint(ck, "last", weights, {k: v for k, v in state.items() if k not in ("format_version", "weights_sha256")})
    assert not any(p.exists() for p in stale)
    reloaded = load_checkpoint(ck / "last.safetensors")[0]
    assert all(torch.equal(reloaded[k], weights[k]) for k in weights)


def test_failed_run_leaves_no_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import inttrain.trainer

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("failure in the first step")

    monkeypatch.setattr(inttrain.trainer, "train", boom)
    assert main(["train", *FAST, "--out", str(tmp_path / "r")]) == 1
    assert "unexpected RuntimeError: failure in the first step" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = npz_with_huge_header(tmp_path / "h.npz")
    assert main(["--debug", "train", "--dataset", "npz", "--data-dir", str(p)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: --dataset npz: h.npz: x: header")


# ----------------------------------------------------------------------------- peak memory


def test_refusals_stay_small(tmp_path: Path) -> None:
    """Each hostile input refused in a fresh interpreter: peak RSS < 300 MB over the interpreter's after imports."""
    npz_with_huge_header(tmp_path / "h.npz")
    npz_bomb(tmp_path / "bomb.npz", mib=512)
    (tmp_path / "mnist").mkdir()
    idx_gz(tmp_path / "mnist" / "train-images-idx3-ubyte.gz", (10, 28, 28), 512 << 20)
    idx_gz(tmp_path / "mnist" / "train-labels-idx1-ubyte.gz", (10,), 10)
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(1 << 40)
    np.savez(tmp_path / "many.npz", x=np.zeros((10, 8, 8), np.uint8), y=np.full(10, 10**5))
    commands = [
        ["train", "--dataset", "npz", "--data-dir", str(tmp_path / "h.npz")],
        ["train", "--dataset", "npz", "--data-dir", str(tmp_path / "bomb.npz"), "--set", "max_memory_gb=0.25"],
        ["train", "--dataset", "mnist", "--data-dir", str(tmp_path / "mnist")],
        ["train", "--model", "gpt-small", "--dataset", "text", "--data-dir", str(tmp_path / "huge.txt")],
        ["train", "--dataset", "npz", "--data-dir", str(tmp_path / "many.npz")],
        ["cost", "--batch-size", "50000000"],
    ]
    huge = {"input_shape": [60_000], "layers": [{"type": "linear", "in_features": 60_000, "out_features": 130_000}]}
    (tmp_path / "huge.json").write_text(json.dumps(huge))
    micro = [[str(tmp_path / "huge.json"), str(tmp_path / "h.npz"), "--out", str(tmp_path / "o")]]
    script = f"""
import json, resource, sys
import numpy, torch, PIL.Image, yaml
import inttrain.cli.app, inttrain.cli.run, inttrain.data, inttrain.models
from inttrain.cli.app import main
import inttrain.micro.__main__ as micro
main(["train", "--dataset", "npz", "--data-dir", "/nonexistent.npz"])  # warm: imports of the refusal path
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
codes = [main(c) for c in {json.dumps(commands)}] + [micro.main(["train", *c]) for c in {json.dumps(micro)}]
print(json.dumps({{"codes": codes, "grew_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}}))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["codes"] == [2] * (len(commands) + len(micro)), out.stderr
    assert result["grew_kb"] < 300 * 1024, result
    assert out.stderr.count("\n") == len(commands) + len(micro) + 1  # one line per refusal (+ the warm-up's)


@pytest.mark.parametrize("command", [["train", "--dataset", "digits"], ["demo"], ["compare", "--dataset", "digits"]])
def test_a_negative_seed_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   command: list[str]) -> None:
    """NumPy's generators (the data split and order) take no negative seed: refused up front, by name."""
    out = ["--out", str(tmp_path / "r")] if command[0] != "demo" else []
    _refused(capsys, [*command, "--epochs", "1", "--seed", "-5", *out], "--seed: -5 must be >= 0")
    assert not (tmp_path / "r").exists()
