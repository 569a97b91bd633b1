"""micro's --augment crop-flip: the crop and flip are what they say, draws depend on (seed, step) only, a resumed
run sees the same images, and the option is refused where it cannot apply."""

import json

import numpy as np
import pytest

from inttrain.micro.__main__ import main
from inttrain.micro.augment import augment_batch, crop_flip
from inttrain.micro.checkpoint import load_run
from micro_utils import CNN, MLP
from test_micro_run import _same_run, files  # noqa: F401  (the digits fixture)


class _Fixed:
    """A generator stand-in returning given draws, to pin crop offsets and flips."""

    def __init__(self, *draws):
        self.draws = list(draws)

    def integers(self, lo, hi, n):
        return np.asarray(self.draws.pop(0))


def test_centre_crop_without_flip_is_the_image_and_offsets_shift_in_zeros():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.int8).reshape(2, 3, 4, 5)
    assert np.array_equal(crop_flip(x, _Fixed([4, 4], [4, 4], [0, 0])), x)
    shifted = crop_flip(x, _Fixed([5, 3], [4, 4], [0, 0]))       # image 0 one row down, image 1 one row up
    assert np.array_equal(shifted[0, :, :-1], x[0, :, 1:]) and not shifted[0, :, -1].any()
    assert np.array_equal(shifted[1, :, 1:], x[1, :, :-1]) and not shifted[1, :, 0].any()
    mirrored = crop_flip(x, _Fixed([4, 4], [4, 4], [1, 0]))
    assert np.array_equal(mirrored[0], x[0, :, :, ::-1]) and np.array_equal(mirrored[1], x[1])


def test_draws_are_a_function_of_seed_and_step():
    x = np.random.default_rng(0).integers(-127, 128, (16, 3, 8, 8)).astype(np.int8)
    a = augment_batch(x, "crop-flip", 7, 3)
    assert a.dtype == np.int8 and a.shape == x.shape
    assert np.array_equal(a, augment_batch(x, "crop-flip", 7, 3))
    assert not np.array_equal(a, augment_batch(x, "crop-flip", 7, 4))
    assert not np.array_equal(a, augment_batch(x, "crop-flip", 8, 3))
    assert augment_batch(x, "none", 7, 3) is x and augment_batch(x, None, 7, 3) is x


def test_augmented_training_differs_and_resumes_bit_identically(files, tmp_path, capsys):  # noqa: F811
    (tmp_path / "cnn.json").write_text(json.dumps(CNN))
    common = [str(tmp_path / "cnn.json"), str(files / "tr_img.npz"), "--epochs", "2", "--log-every", "0",
              "--momentum-shift", "2"]
    assert main(["train", *common, "--out", str(tmp_path / "plain")]) == 0
    assert main(["train", *common, "--augment", "crop-flip", "--out", str(tmp_path / "whole")]) == 0
    assert "augment crop-flip" in capsys.readouterr().out
    plain, _ = load_run(tmp_path / "plain")
    whole, state = load_run(tmp_path / "whole")
    assert state["settings"]["augment"] == "crop-flip"
    assert any(not np.array_equal(a.acc, b.acc) for a, b in zip(plain.params(), whole.params()))
    assert main(["train", *common, "--augment", "crop-flip", "--out", str(tmp_path / "parts"), "--max-seconds", "0"]) == 0
    for _ in range(200):
        if json.loads((tmp_path / "parts" / "checkpoint.json").read_text())["epoch"] == 2:
            break
        assert main(["train", "--resume", str(tmp_path / "parts"), "--max-seconds", "0"]) == 0
    _same_run(tmp_path / "whole", tmp_path / "parts")


def test_crop_flip_on_a_vector_model_is_refused_before_training(files, tmp_path, capsys):  # noqa: F811
    (tmp_path / "mlp.json").write_text(json.dumps(MLP))
    code = main(["train", str(tmp_path / "mlp.json"), str(files / "tr.npz"), "--augment", "crop-flip",
                 "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: --augment crop-flip: needs image inputs (C, H, W), the model takes [64]"]
    assert not (tmp_path / "o").exists()


def test_unknown_augment_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "m.json", "d.npz", "--augment", "mixup", "--out", "o"])
    assert e.value.code == 2 and "invalid choice: 'mixup'" in capsys.readouterr().err
