"""``inttrain train --recipe integer-only`` is refused with one message that points to the engines that train it."""

from __future__ import annotations

from inttrain.cli.app import main


def test_train_integer_only_refused_with_pointer(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--recipe", "integer-only", "--epochs", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    assert "inttrain.integer_only.train_epoch" in err and "python -m inttrain.micro train" in err
    assert not out.exists()                    # refused before the run folder is created
