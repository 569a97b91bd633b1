"""benchmarks/accuracy_full.py: job list and pairing, report numbers, and one tiny end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

SCRIPT = "accuracy_full"  # conftest.py's `bench` fixture loads benchmarks/accuracy_full.py


def test_jobs_seed_major_with_three_seeds_for_the_tight_variants(bench) -> None:
    args = bench.parse_args(["--data", "x.npz"])
    jobs = bench.all_jobs(args)
    # fp32, int8, int8-dataflow, int8-pt, int8-dataflow-pt, int8-gsr, int8-dataflow-gsr, int8-fl, int8-bf16act,
    # int8-dataflow-fl: 3 seeds; int8-dataflow-nearest 1; the rest 2
    assert len(jobs) == 10 * 3 + 26 * 2 + 1
    assert jobs[:37] == [(v, 0) for v in bench.VARIANTS]
    assert jobs[-10:] == [("fp32", 2), ("int8", 2), ("int8-dataflow", 2), ("int8-pt", 2), ("int8-dataflow-pt", 2),
                          ("int8-gsr", 2), ("int8-dataflow-gsr", 2), ("int8-fl", 2), ("int8-bf16act", 2),
                          ("int8-dataflow-fl", 2)]


def test_int8_ablations_name_the_per_tensor_gradient_scale_they_ran_on(bench) -> None:
    """The recipe's default changed to per-sample scales: rows recorded before must keep meaning what they ran."""
    for variant, (options, _) in bench.VARIANTS.items():
        if options.get("recipe") == "int8" and variant not in ("int8", "int8-dataflow"):
            assert options.get("per_sample_grad") is False, variant
    assert "per_sample_grad" not in bench.VARIANTS["int8"][0]  # the default, as `inttrain train --recipe int8`


def test_micro_flags_are_flags_the_device_cli_accepts(bench) -> None:
    from inttrain.micro.__main__ import build_parser

    assert bench.micro_flags("integer-only-bngain-e16-sgd") == [
        "--lr-mode", "shift", "--lr-shift", "10", "--momentum-shift", "3", "--nesterov", "--l2-shift", "4",
        "--frac-bits", "8"]
    assert bench.micro_flags("integer-only-bngain-lr9") == ["--lr-bits", "9"] and bench.micro_flags("int8") == []
    for variant in bench.VARIANTS:
        args = build_parser().parse_args(["train", "m.json", "d.npz", *bench.micro_flags(variant)])
        for k, v in bench.VARIANTS[variant][0].get(bench.MICRO_TRAIN, {}).items():
            assert getattr(args, k) == v, (variant, k)


def test_integer_only_bngain_converts_with_its_batch_norm_gain(bench, tmp_path: Path) -> None:
    """The variant's options reach IntegerOnlyConfig: its initial model is integer-only's with every batch norm's
    gain_shift 3, the same weight codes."""
    out, common = _tiny_run(tmp_path, "integer-only,integer-only-bngain")
    assert bench.main(common) == 0
    inits = [json.loads((out / "runs" / f"{v}-s0" / "init" / "model.json").read_text())
             for v in ("integer-only", "integer-only-bngain")]
    norms = [[spec for spec in d["layers"] if spec["type"] == "batchnorm"] for d in inits]
    assert norms[0] and all("gain_shift" not in spec for spec in norms[0])
    assert norms[1] == [{**spec, "gain_shift": 3} for spec in norms[0]]
    assert inits[0]["params"] == inits[1]["params"]


def test_integer_only_variant_micro_flags_reach_the_micro_run(bench, tmp_path: Path) -> None:
    """integer-only-bngain-lr9: gain_shift 3 in its model and --lr-bits 9 in its micro run's settings (and in its
    result row's config); plain integer-only keeps micro's default step (10)."""
    out, common = _tiny_run(tmp_path, "integer-only,integer-only-bngain-lr9")
    assert bench.main(common) == 0
    rows = {r["variant"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert rows["integer-only-bngain-lr9"]["config"]["lr_bits"] == 9 and rows["integer-only"]["config"]["lr_bits"] == 10
    init = json.loads((out / "runs" / "integer-only-bngain-lr9-s0" / "init" / "model.json").read_text())
    assert {spec.get("gain_shift") for spec in init["layers"] if spec["type"] == "batchnorm"} == {3}


@pytest.mark.parametrize("flag", ["--epochs", "--batch-size", "--train-size", "--val-size", "--seeds"])
def test_sizes_below_one_get_one_error_line_and_exit_2(bench, flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--data", "x.npz", flag, "0"])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(f"error: {flag} 0: allowed: 1 or more")


def _row(variant: str, seed: int, acc: float, gbitops: float | None = None) -> dict:
    return {"variant": variant, "seed": seed, "status": "done", "final_val_accuracy": acc, "best_val_accuracy": acc,
            "final_train_loss": 0.5, "gbitops": gbitops, "seconds_per_epoch": 10.0, "val_accuracies": [acc / 2, acc]}


def test_summary_pairs_gaps_by_seed(bench) -> None:
    rows = [_row("fp32", 0, 0.80), _row("fp32", 1, 0.82), _row("int8-pt", 0, 0.79, 100.0), _row("int8-pt", 1, 0.80, 100.0),
            _row("int8", 0, 0.81, 100.0),  # the BitOPs column's base (the recipe's default)
            _row("cpt-3-8", 1, 0.78, 40.0),
            {"variant": "integer-only", "seed": 0, "status": "skipped", "reason": "no converter"}]
    s = {r["variant"]: r for r in bench.summarize(rows, ["fp32", "int8-pt", "cpt-3-8", "integer-only"])}
    assert s["int8-pt"]["gaps"] == {0: pytest.approx(-1.0), 1: pytest.approx(-2.0)}
    assert s["int8-pt"]["gap_mean"] == pytest.approx(-1.5)
    assert s["int8-pt"]["mean"] == pytest.approx(0.795) and s["int8-pt"]["std"] == pytest.approx(math.sqrt(0.5) * 0.01)
    assert s["cpt-3-8"]["gaps"] == {1: pytest.approx(-4.0)}  # paired with fp32 seed 1 only
    assert s["cpt-3-8"]["bitops_vs_int8"] == pytest.approx(0.4)
    assert s["fp32"]["gaps"] == {} and math.isnan(s["fp32"]["gap_mean"])
    assert s["integer-only"]["seeds"] == [] and s["integer-only"]["skipped"] == "no converter"
    # Issue targets: int8 -1.5 points from fp32 (allowed 0.2); CPT -2 points from int8-pt at seed 1 (allowed 0.3).
    assert s["int8-pt"]["target_met"] is False and s["int8-pt"]["target"] == "gap to fp32 >= -0.2 (paired mean -1.50)"
    assert s["cpt-3-8"]["target"] == "gap to int8-pt >= -0.3, BitOPs <= 0.6 x int8 (paired mean -2.00)"
    assert s["cpt-3-8"]["target_met"] is False and s["integer-only"]["target_met"] is None and s["fp32"]["target"] == ""
    close = {r["variant"]: r for r in bench.summarize([*rows, _row("cpt-3-8", 0, 0.788, 50.0)], ["int8-pt", "cpt-3-8"])}
    assert close["cpt-3-8"]["target_met"] is False  # paired mean (-0.2 - 2.0) / 2 = -1.1: still missed
    near = {r["variant"]: r for r in bench.summarize(
        [*rows[:5], _row("cpt-3-8", 0, 0.788, 50.0), _row("cpt-3-8", 1, 0.798, 50.0)], ["int8-pt", "cpt-3-8"])}
    assert near["cpt-3-8"]["target_met"] is True  # -0.2 / -0.2 points at 0.5 x int8's BitOPs


def test_wageubn_is_also_paired_with_fp32_trained_by_its_own_update_rule(bench) -> None:
    rows = [_row("fp32", 0, 0.85), _row("fp32", 1, 0.84), _row("fp32-no-nesterov", 0, 0.835),
            _row("wageubn-gsr", 0, 0.8315), _row("wageubn-gsr", 1, 0.8328)]
    summary = bench.summarize(rows, ["fp32", "fp32-no-nesterov", "wageubn", "wageubn-gsr"])
    s = {r["variant"]: r for r in summary}
    assert s["wageubn-gsr"]["target"] == "gap to fp32 >= -0.5 (paired mean -1.28)"  # the target: fp32
    # the same-optimizer line pairs seed 0 only (fp32-no-nesterov has no seed 1); wageubn has no rows: no line
    assert bench.same_optimizer_lines(summary) == [
        "wageubn-gsr against fp32-no-nesterov (the same update rule), paired over seeds [0]: -0.35 (-0.35)."]


def _tiny_run(tmp_path: Path, variants: str) -> tuple[Path, list[str]]:
    """(out folder, command line) of a one-epoch, one-seed run of ``variants`` on 96 random 32x32 images."""
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(data, x=rng.integers(0, 256, (96, 32, 32, 3), dtype=np.uint8), y=rng.integers(0, 10, 96))
    out = tmp_path / "out"
    return out, ["--data", str(data), "--out", str(out), "--model", "small-cnn", "--train-size", "64", "--val-size",
                 "32", "--batch-size", "32", "--epochs", "1", "--seeds", "1", "--compile", "off", "--variants", variants]


def test_end_to_end_rows_list_and_report(bench, tmp_path: Path, capsys) -> None:
    out, common = _tiny_run(tmp_path, "fp32,int8,integer-only")
    assert bench.main(common) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["seed"], r["status"]) for r in rows] == [
        ("fp32", 0, "done"), ("int8", 0, "done"), ("integer-only", 0, "done")]
    # integer-only trains on the device engine (from the seeded float initial weights), crop-flip included
    io = rows[2]
    assert io["engine"] == "inttrain.micro" and io["config"]["augment"] == "crop-flip" and io["steps"] == 2
    assert len(io["val_accuracies"]) == 1 and 0.0 <= io["final_val_accuracy"] <= 1.0 and io["saturated"] == 0
    assert all(len(r["val_accuracies"]) == 1 and r["steps"] == 2 for r in rows[:2])
    assert rows[1]["gbitops"] > 0 and rows[0]["gbitops"] is None  # BitOPs are counted for integer layers only
    assert (out / "runs" / "int8-s0" / "checkpoints" / "last.state.pt").is_file()
    # Finished jobs are not run again; --list says so.
    assert bench.main(common) == 0
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    bench.main([*common, "--list"])
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:2] == ["fp32-s0", "done:"] and listed[2].split()[:2] == ["integer-only-s0", "done:"]
    bench.main(["--out", str(out), "--report"])
    md = (out / "accuracy_full.md").read_text()
    gap = 100 * (rows[1]["final_val_accuracy"] - rows[0]["final_val_accuracy"])
    assert f"| int8 | 1 | {100 * rows[1]['final_val_accuracy']:.2f} ± - |" in md and f"| {gap:+.2f} |" in md
    assert (out / "accuracy_full.png").stat().st_size > 0


def test_resume_takes_a_setting_added_later_at_its_default(bench, tmp_path: Path) -> None:
    """A checkpoint written before a RunConfig field existed resumes (the field's default is no change); a
    changed setting is refused, naming it."""
    import torch

    out, common = _tiny_run(tmp_path, "fp32")
    assert bench.main(common) == 0
    state_path = out / "runs" / "fp32-s0" / "checkpoints" / "last.state.pt"
    state = torch.load(state_path, weights_only=False)
    assert state["config"]["optimizer"] == "sgd"  # the field's default, which is not None
    del state["config"]["optimizer"]
    torch.save(state, state_path)
    (out / "results.jsonl").write_text("")  # the job is pending again: it resumes from `last`
    assert bench.main(common) == 0
    row = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert row["status"] == "done" and row["resumed"] is True
    state["config"]["lr"] = 123.0
    torch.save(state, state_path)
    (out / "results.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"trained with other settings \(lr\)"):
        bench.main(common)


def test_carry_packs_an_unfinished_job_and_a_fresh_machine_resumes_it(bench, tmp_path: Path, capsys) -> None:
    """--carry: an unfinished run folder (without best-epoch checkpoints) goes into OUT/carry/JOB.tar.gz; with the
    run folders gone (a new machine), claiming the job unpacks it and resumes; the archive goes when it finishes."""
    import shutil

    out, common = _tiny_run(tmp_path, "fp32")
    assert bench.main(common) == 0
    (out / "results.jsonl").write_text("")  # as if the job had stopped before its row
    folder = out / "runs" / "fp32-s0"
    (folder / "checkpoints" / "best.safetensors").write_bytes(b"x")
    capsys.readouterr()
    assert bench.main([*common, "--carry"]) == 0
    archive = out / "carry" / "fp32-s0.tar.gz"
    assert capsys.readouterr().out.strip() == f"packed {archive}"
    shutil.rmtree(out / "runs")
    bench.main([*common, "--list"])
    assert capsys.readouterr().out.split(None, 1)[1].strip() == f"pending, carried in {archive}"
    assert bench.main(common) == 0
    assert f"fp32-s0: resuming from {archive}" in capsys.readouterr().out
    row = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert row["status"] == "done" and row["resumed"] is True
    assert not archive.exists() and not (folder / "checkpoints" / "best.safetensors").exists()
    assert bench.main([*common, "--carry"]) == 0 and not archive.exists()  # a finished job is not packed


def test_carry_leaves_out_best_checkpoints_and_the_integer_only_data_files(bench) -> None:
    import tarfile

    kept = lambda name: bench._carried(tarfile.TarInfo(name)) is not None  # noqa: E731
    assert kept("int8-s0/checkpoints/last.state.pt") and kept("integer-only-s0/micro/checkpoint.json")
    assert kept("integer-only-s0/micro/checkpoint.safetensors") and kept("integer-only-s0/micro/train.npz")
    assert not kept("integer-only-s0/init/weights.safetensors") and not kept("integer-only-s0/init")
    assert not kept("int8-s0/checkpoints/best.safetensors") and not kept("integer-only-s0/train.npz")
    assert not kept("integer-only-s0/val.npz")


def test_integer_only_on_a_model_convert_refuses_is_a_skipped_row(bench, tmp_path: Path) -> None:
    """mobilenetv2 (grouped convolutions, no as_sequential()): one skipped row with the converter's reason, no
    run folder, and nothing trained."""
    out, common = _tiny_run(tmp_path, "integer-only")
    common[common.index("small-cnn")] = "mobilenetv2"
    assert bench.main(common) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["status"]) for r in rows] == [("integer-only", "skipped")]
    assert rows[0]["reason"].startswith("inttrain.recipes.integer_only.convert cannot take mobilenetv2: ")
    assert not (out / "runs" / "integer-only-s0").exists()


def test_unreadable_data_or_sizes_that_do_not_fit_get_one_error_line_and_exit_2(bench, tmp_path: Path,
                                                                                  capsys) -> None:
    """Judged by the library's .npz loader before any training: one ``error:`` line, exit 2, no result row."""
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not an archive")
    out, common = _tiny_run(tmp_path, "fp32")
    cases = [(["--data", str(junk)], "error: --data " + str(junk) + ": junk.npz: file: not a readable .npz archive"),
             (["--train-size", "90"], "error: --train-size 90 + --val-size 32 must be >= 1 each and fit the 96 images")]
    for change, expected in cases:
        argv = list(common)
        argv[argv.index(change[0]) + 1] = change[1]
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith(expected)
    assert not (out / "results.jsonl").exists()
