"""DDP with int8 gradient communication: 2 gloo ranks over loopback.

Spawning a rank costs seconds (importing torch), so the scenarios share one 2-rank group
(module fixture ``runs``); the dead-rank test needs its own group.
"""

import numpy as np
import pytest
import torch

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
