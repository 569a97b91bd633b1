"""DDP with int8 gradient communication: 2 gloo ranks over loopback.

Spawning a rank costs seconds (importing torch), so the scenarios share one 2-rank group
(module fixture ``runs``); the dead-rank test needs its own group.
"""

import numpy as np
import pytest

from ddp_utils import run_ranks

LR = 0.1
LONG = 200

SCENARIOS = [
    ("fp32_vs_single", "worker_fp32_matches_single", (5,)),
    ("int8_few", "worker_int8_vs_fp32", (5, LR, True)),
    ("int8_few_allreduce", "worker_int8_vs_fp32", (5, LR, True, 2048, "allreduce")),
    ("int8_ef_long", "worker_int8_vs_fp32", (LONG, LR, True, 64)),
    ("int8_noef_long", "worker_int8_vs_fp32", (LONG, LR, False, 64)),
    ("bytes_allgather", "worker_bytes", (2, "allgather")),
    ("bytes_allreduce", "worker_bytes", (2, "allreduce")),
    ("prepared", "worker_prepared_int8", (30,)),
    ("finite_plain", "worker_all_ranks_finite_plain", ()),
    ("skip_allgather", "worker_skip_nonfinite", (6, 2, "allgather")),
    ("skip_allreduce", "worker_skip_nonfinite", (6, 2, "allreduce")),
    ("sync_bn", "worker_sync_bn", (4, "fp32")),
    ("sync_bn_int8", "worker_sync_bn", (4, "int8")),
    ("hook_resume", "worker_hook_state_resume", (12, 5)),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = run_ranks("worker_many", tmp_path_factory.mktemp("ddp"), SCENARIOS, timeout=50, pg_timeout=15)
    return out


def results(runs, name):
    recs = [r[name] for r in runs]
    for rank, rec in enumerate(recs):
        assert rec["ok"], f"rank {rank}:\n{rec['error']}"
    return [rec["result"] for rec in recs]


def test_fp32_ddp_matches_single_process(runs):
    for res in results(runs, "fp32_vs_single"):
        assert res["diff"] < 1e-5  # same math, only the summation order differs
        assert res["agree"] == 0.0


@pytest.mark.parametrize("name", ["int8_few", "int8_few_allreduce"])
def test_int8_close_to_fp32_after_few_steps(runs, name):
    # Bound: each averaged gradient element differs from the fp32 average by less than
    # 2 * scale_t (this step's stochastic-rounding error < scale, plus last step's residual
    # < scale, both averaged over ranks); plain SGD moves a parameter by lr * gradient, so after
    # k steps |theta_int8 - theta_fp32| <= lr * sum_t 2 * scale_t, up to the second-order effect of
    # evaluating gradients at slightly different points (lr * L * gap, negligible for 5 steps).
    for res in results(runs, name):
        diffs, scales = np.array(res["diffs"]), np.array(res["scales"])
        bound = LR * 2 * np.cumsum(scales)
        assert np.all(diffs <= bound), (diffs, bound)
        assert abs(res["final8"] - res["final32"]) <= 1e-3 * res["final32"]
        assert res["agree"] == 0.0  # every rank applies the same dequantized average


def test_error_feedback_keeps_gap_bounded(runs):
    # With error feedback the sent values telescope: sum_t sent_t = sum_t grad_t - residual_T, so
    # the gap to fp32 stays of order lr * scale however many steps are taken; we allow
    # 4 * lr * max scale.  Without it the rounding errors random-walk and the gap keeps growing.
    ef = results(runs, "int8_ef_long")[0]
    noef = results(runs, "int8_noef_long")[0]
    ef_gap, noef_gap = np.array(ef["diffs"]), np.array(noef["diffs"])
    assert ef_gap.max() <= 4 * LR * max(ef["scales"])
    assert ef_gap[LONG // 2:].max() <= 2 * ef_gap[: LONG // 2].max()
    assert noef_gap.max() > ef_gap.max()
    assert abs(ef["final8"] - ef["final32"]) <= 1e-3 * ef["final32"]
    assert ef["loss8"][-1] < 0.5 * ef["loss8"][0]


@pytest.mark.parametrize("name,ratio", [("bytes_allgather", 3.9), ("bytes_allreduce", 0.99)])
def test_bytes_per_step(runs, name, ratio):
    # allgather: 1 byte per element + 4 bytes per 2048-element chunk (the agreed scale) -> ~3.99x
    # fewer than fp32; allreduce of widened int32 codes saves nothing (kept for comparison only).
    for res in results(runs, name):
        assert len(res["bytes8"]) == 2 and res["bytes8"][0] == res["bytes8"][1]
        assert res["bytes32"][0] == res["fp32_equiv"][0] == 4 * res["numel"]
        assert res["bytes32"][0] / res["bytes8"][0] >= ratio


def test_prepared_int8_model_trains_under_ddp(runs):
    for res in results(runs, "prepared"):
        assert "QLinear" in res["kinds"]
        assert res["losses"][-1] < 0.5 * res["losses"][0]
        assert res["agree"] == 0.0
        assert res["bytes"][0] < 4 * 32 * 64


def test_all_ranks_finite_helper(runs):
    for res in results(runs, "finite_plain"):
        assert res == {"first": True, "second": False}


@pytest.mark.parametrize("name", ["skip_allgather", "skip_allreduce"])
def test_nonfinite_on_one_rank_skips_step_everywhere(runs, name):
    for res in results(runs, name):
        assert res["skipped"] == [2] and res["hook_skipped"] == [2]
        assert res["params_finite"] and res["residuals_finite"]
        assert res["agree"] == 0.0


def test_dead_rank_fails_peer_within_timeout(tmp_path):
    pg_timeout = 3.0
    recs = run_ranks("worker_dead_peer", tmp_path, 0.5, timeout=20, pg_timeout=pg_timeout, allow_failure=True)
    assert recs[1]["exitcode"] == 3
    assert recs[0]["ok"], recs[0].get("error")
    res = recs[0]["result"]
    assert res["error"] is not None, "the surviving rank completed collectives with a dead peer"
    assert res["elapsed"] < pg_timeout + 2.0


@pytest.mark.parametrize("name", ["sync_bn", "sync_bn_int8"])
def test_sync_batchnorm_matches_single_process_on_global_batch(runs, name):
    # CPUSyncBatchNorm: statistics over both ranks' shards = one process with plain BN on the global
    # batch; also under inttrain's int8 layers (QConv2d/QLinear feed the synced BN).
    for res in results(runs, name):
        assert res["converted"] == 2 and res["is_sync"] and res["same_keys"]
        assert "CPUSyncBatchNorm" in res["kinds"]
        assert res["stats_vs_rank0"] == 0.0  # identical on every rank
        # int8 layers quantize per tensor: a shard's amax differs from the global batch's, so the int8
        # case is close (measured: stats 6e-3, weights ~1e-2), not float-rounding equal
        tol = 1e-5 if name == "sync_bn" else 0.05
        assert res["stats_vs_single"] <= tol * max(1.0, res["stats_scale"])
        assert res["param_diff"] <= 10 * tol and res["eval_diff"] <= 100 * tol


def test_int8_hook_state_resumes_bit_exact(runs):
    for res in results(runs, "hook_resume"):
        assert res["keys"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert res["residual_norm"] > 0
        assert res["exact"] == 0.0  # weights, optimizer and per-rank residuals restored: identical
        assert res["without_residuals"] > 0.0


def test_sync_bn_refuses_range_and_quant_batchnorm():
    from torch import nn

    from inttrain.distributed.sync_bn import convert_sync_batchnorm_
    from inttrain.nn.quant_bn import QuantBatchNorm2d
    from inttrain.nn.range_bn import RangeBatchNorm2d

    for bn in (RangeBatchNorm2d(4), QuantBatchNorm2d(4)):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), bn, nn.ReLU())
        with pytest.raises(ValueError, match=r"1 \((RangeBatchNorm2d|QuantBatchNorm2d)\) cannot be synchronized"):
            convert_sync_batchnorm_(model)
        assert type(model[1]) is type(bn)  # nothing converted
