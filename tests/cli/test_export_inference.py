"""``inttrain.load(RUN)`` and ``inttrain export RUN --format onnx|torch``: int8 inference models, checked on the run's data."""

from __future__ import annotations

import json
import re

import pytest
import torch

import inttrain
from inttrain.cli.app import main
from inttrain.nn import QConv2d, QLinear

pytestmark = pytest.mark.usefixtures("one_thread")

# The exported graph quantizes exactly as the training forward pass does (same codes and scales); what is left
# is float summation order, which may flip a near-tie.
MIN_AGREEMENT = 0.99


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small-cnn int8 run on digits: one epoch, its folder."""
    out = tmp_path_factory.mktemp("export_inference") / "run"
    before = torch.get_num_threads()
    assert main(["train", "--recipe", "int8", "--epochs", "1", "--dataset", "digits", "--threads", "1",
                 "--out", str(out)]) == 0
    torch.set_num_threads(before)
    return out


def _val_accuracy(model, run) -> float:
    from torch.utils.data import DataLoader

    from inttrain.cli.load import load_run

    splits = load_run(run)[0].splits
    right = total = 0
    with torch.no_grad():
        for x, y in DataLoader(splits.val, batch_size=256):
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return right / total


def test_load_gives_the_trained_model_with_its_recipe(run):
    model = inttrain.load(run)
    assert not model.training
    assert inttrain.conversion_report(model).num_converted == 3
    assert all(isinstance(m, (QLinear, QConv2d)) for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
    summary = json.loads((run / "summary.json").read_text())
    assert _val_accuracy(model, run) == summary["best_val_accuracy"]  # the very model the run validated


def test_load_refuses_a_missing_run(tmp_path):
    with pytest.raises(ValueError, match="not found; expected a run folder or a .safetensors checkpoint"):
        inttrain.load(tmp_path / "nope")


def _agreement(out: str, runner: str) -> tuple[int, int]:
    m = re.search(rf"check: {runner} and the trained model agree on the top-1 prediction for (\d+) of (\d+) "
                  r"validation samples", out)
    assert m, out
    return int(m[1]), int(m[2])


def test_export_onnx_writes_an_int8_qdq_model_onnxruntime_runs(run, capsys):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    assert main(["export", str(run), "--format", "onnx"]) == 0
    out = capsys.readouterr().out
    agree, total = _agreement(out, "ONNX Runtime")
    assert total == 359 and agree >= MIN_AGREEMENT * total
    graph = onnx.load(run / "export" / "model.onnx").graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") == 3 and ops.count("DequantizeLinear") == 6  # per layer: input Q+DQ, weight DQ
    codes = [t for t in graph.initializer if t.name.endswith("weight_codes")]
    assert len(codes) == 3 and {t.data_type for t in codes} == {onnx.TensorProto.INT8}  # trained weights as int8 codes


def test_export_torch_writes_a_pt2_program(run, capsys, tmp_path):
    from inttrain.inference import register_qdq_ops

    target = tmp_path / "m.pt2"
    assert main(["export", str(run), "--format", "torch", "--out", str(target)]) == 0
    agree, total = _agreement(capsys.readouterr().out, "torch.export")
    assert total == 359 and agree >= MIN_AGREEMENT * total
    register_qdq_ops()
    program = torch.export.load(str(target))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "quantized_decomposed.dequantize_per_channel.default" in targets
    x = torch.randn(5, 1, 8, 8)  # another batch size than the example: the batch dimension is dynamic
    assert program.module()(x).shape == (5, 10)


@pytest.mark.parametrize("args, message", [
    (["--format", "tflite"], "error: --format: 'tflite' is not one of: micro, onnx, torch"),
    (["--format", "torch", "--out", "x.onnx"], "error: --out: 'x.onnx': a torch export is written to a .pt2 file"),
    (["--format", "onnx", "--data", "d.npz"], "error: --data: 'd.npz': only --format micro takes a DATA.npz"),
])
def test_bad_export_options_exit_2_and_write_nothing(run, tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(run), *args]) == 2
    assert capsys.readouterr().err.startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_onnx_export_of_8bit_batch_norm_and_power_of_two_scales(tmp_path):
    """wageubn: its 8-bit BN takes a whole-tensor amax, which the ONNX exporter gets a translation for."""
    pytest.importorskip("onnxruntime")
    from inttrain.inference import export_onnx
    from inttrain.inference import to_inference
    from inttrain.trainer import apply_recipe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 36, 3))
    apply_recipe(model, "wageubn")
    model.eval()
    run = export_onnx(to_inference(model), torch.randn(2, 1, 8, 8), tmp_path / "w.onnx")
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        assert (run(x) - model(x)).abs().max() < 1e-5


def test_load_gives_an_integer_only_run_back_as_trained(tmp_path):
    from inttrain import integer_only as T
    from inttrain.cli.export import save_checkpoint

    desc = {"input_shape": [4], "layers": [{"type": "linear", "in_features": 4, "out_features": 3}]}
    model = T.Sequential.from_description(desc)
    save_checkpoint(model, tmp_path / "run", "last")
    back = inttrain.load(tmp_path / "run")
    assert isinstance(back, T.Sequential)
    for (n, a), (m, b) in zip(model.named_params(), back.named_params()):
        assert n == m and a.exp == b.exp and torch.equal(a.acc, b.acc)
