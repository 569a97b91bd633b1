"""benchmarks/integer_only_float_rule.py: micro's norm rule in float, both rules learn, resume continues exactly."""

from __future__ import annotations

import json

import numpy as np
import torch

from inttrain.micro import Sequential
from inttrain.micro.model import save_model
from micro_model_utils import RESIDUAL_BN

SCRIPT = "integer_only_float_rule"


def test_norm_rule_step_moves_the_largest_element_2_to_the_bits_codes_at_exp0(bench) -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.exp0 = -10
    p.grad = torch.tensor([3.0, -1.5, 0.0])           # 2**1 <= max|g| < 2**2: e = 2
    bench.norm_rule_step([(p, 10)], 128)              # g * 2**(10 - 10 - 2) * 128 / 256 = g / 8
    assert p.detach().tolist() == [-0.375, 0.1875, 0.0]
    q = torch.nn.Parameter(torch.ones(2))
    q.exp0, q.grad = 0, torch.zeros(2)
    bench.norm_rule_step([(q, 10)], 256)              # an all-zero gradient takes no step
    assert q.detach().tolist() == [1.0, 1.0]


def test_momentum_and_l2_follow_micros_rule(bench) -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.exp0, moms = 0, {}
    p.grad = torch.tensor([0.5, 0.0])
    bench.norm_rule_step([(p, 0)], 256, l2=0.25, momentum_shift=1, momenta=moms)
    # g = [0.5 + 0.25, -0.5]: max 0.75, e = 0 -> u = g * 2**0 = g; v = u; p = [1 - 0.75, -2 + 0.5]
    assert p.detach().tolist() == [0.25, -1.5] and moms[id(p)].tolist() == [0.75, -0.5]
    p.grad = torch.zeros(2)                           # g = 0.25 * p = [0.0625, -0.375]: e = -1 -> u = 2 * g
    bench.norm_rule_step([(p, 0)], 256, l2=0.25, momentum_shift=1, momenta=moms)
    assert moms[id(p)].tolist() == [0.375 + 0.125, -0.25 - 0.75]


def test_frozen_rule_keeps_the_first_steps_normalizer(bench) -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    p.exp0, frozen = 0, {}
    p.grad = torch.tensor([3.0, 1.0])                 # e = 2: u = g * 2**(0 + 0 - 2)
    bench.norm_rule_step([(p, 0)], 256, frozen=frozen)
    assert frozen == {id(p): 2} and p.detach().tolist() == [-0.75, -0.25]
    p.grad = torch.tensor([0.5, 0.25])                # the norm rule would use e = 0; the frozen one keeps 2
    bench.norm_rule_step([(p, 0)], 256, frozen=frozen)
    assert p.detach().tolist() == [-0.875, -0.3125]


def test_relative_rule_steps_a_power_of_two_fraction_of_the_largest_weight(bench) -> None:
    w = torch.nn.Parameter(torch.tensor([[3.0, -1.0]]))     # max|w| 3: 2**2; max|g| 1.5: e = 1
    b = torch.nn.Parameter(torch.zeros(2))                    # one dimension: the norm rule
    w.exp0 = b.exp0 = 0
    w.grad, b.grad = torch.tensor([[1.5, 0.5]]), torch.tensor([1.0, 0.5])
    bench.norm_rule_step([(w, 0), (b, 0)], 128, rel_bits=3)  # u = g * 2**(2 - 3 - 1) * 1/2
    assert w.detach().tolist() == [[3.0 - 0.1875, -1.0 - 0.0625]] and b.detach().tolist() == [-0.25, -0.125]


def test_batch_statistics_accuracy_leaves_the_running_statistics_alone(bench) -> None:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
    x, y = np.arange(16, dtype=np.int8).reshape(4, 4), np.array([0, 1, 0, 1])
    before = net[2].running_mean.clone()
    bench.accuracy(net, x, 0, y, batch_statistics=True)
    assert torch.equal(net[2].running_mean, before) and net[2].num_batches_tracked == 0


def test_range_value_batch_norm_is_micros_value_with_a_standard_backward(bench) -> None:
    torch.manual_seed(0)
    x = (torch.randn(4, 3, 5, 5) * torch.tensor([1.0, 3.0, 0.5]).view(1, 3, 1, 1)).requires_grad_()
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    std_bn = torch.nn.BatchNorm2d(3).train()
    std_bn.load_state_dict(bn.state_dict())
    bench.use_range_value_bn_(torch.nn.Sequential(bn), [3])
    y = bn(x)
    mean = x.mean((0, 2, 3), keepdim=True)
    rng = x.amax((0, 2, 3), keepdim=True) - x.amin((0, 2, 3), keepdim=True)
    w, b = bn.weight.view(1, 3, 1, 1), bn.bias.view(1, 3, 1, 1)
    torch.testing.assert_close(y, (x - mean) / (rng / 8) * w + b)              # the value: range / 2**3
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g)
    xs = x.detach().clone().requires_grad_()
    ys = std_bn(xs)
    std = torch.sqrt(x.detach().var((0, 2, 3), unbiased=False, keepdim=True) + bn.eps)
    (gs,) = torch.autograd.grad(ys, xs, g * (std / (rng.detach() / 8)))        # the gradient: std batch norm's
    torch.testing.assert_close(gx, gs)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * (rng.detach().flatten() / 8) ** 2)
    try:
        bench.use_range_value_bn_(torch.nn.Sequential(torch.nn.BatchNorm2d(2)), [3, 3])
    except ValueError as e:
        assert str(e) == "1 batch norms in the twin, 2 in the micro model"
    else:
        raise AssertionError("a count mismatch must be refused")


def _files(tmp_path):
    save_model(Sequential.from_description(RESIDUAL_BN), tmp_path / "init")
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, size=(192, 3, 8, 8)).astype(np.int8)
    y = (x[:, 0].mean((1, 2)) > 0).astype(np.int64) + 2 * (x[:, 1].mean((1, 2)) > 0)   # learnable by pooling
    np.savez(tmp_path / "tr.npz", x=x[:128], x_exp=np.int64(-5), y=y[:128])
    np.savez(tmp_path / "va.npz", x=x[128:], x_exp=np.int64(-5), y=y[128:])
    return [str(tmp_path / "init"), str(tmp_path / "tr.npz"), str(tmp_path / "va.npz"), "--batch-size", "32"]


def _history(path):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads((path / "history.json").read_text())]


def test_both_rules_learn_and_a_resumed_run_continues_exactly(bench, tmp_path, capsys) -> None:
    files = _files(tmp_path)
    for rule in ("norm", "sgd", "sgd --bn range"):
        assert bench.main([*files, "--rule", *rule.split(), "--epochs", "8", "--lr", "0.4", "--out",
                           str(tmp_path / rule.replace(" ", ""))]) == 0
        h = _history(tmp_path / rule.replace(" ", ""))
        assert [r["epoch"] for r in h] == list(range(1, 9))
        assert h[-1]["loss"] < 0.8 * h[0]["loss"] and h[-1]["train_acc"] > 0.5, (rule, h)
        assert all(0 <= r["val_acc"] <= 1 and 0 <= r["val_acc_batch"] <= 1 for r in h)
    assert "epoch 8/8 loss" in capsys.readouterr().out
    # the momentum buffers and the frozen normalizers must resume too
    for i, opts in enumerate((["--momentum-shift", "2", "--l2-shift", "4", "--lr-bits", "8"], ["--rule", "frozen"])):
        whole, parts = tmp_path / f"whole{i}", tmp_path / f"parts{i}"
        assert bench.main([*files, *opts, "--epochs", "3", "--out", str(whole)]) == 0
        assert bench.main([*files, *opts, "--epochs", "3", "--stop-after", "2", "--out", str(parts)]) == 0
        assert len(_history(parts)) == 2
        rows = json.loads((parts / "history.json").read_text())     # killed after writing epoch 3's row only
        (parts / "history.json").write_text(json.dumps(rows + [{**rows[-1], "epoch": 3}]))
        assert bench.main([*files, *opts, "--epochs", "3", "--out", str(parts)]) == 0   # picks up at epoch 3
        assert _history(parts) == _history(whole)
