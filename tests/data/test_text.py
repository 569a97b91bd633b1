"""The ``text`` dataset: char vocabulary from the training part, seq_len+1 windows, tail validation split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inttrain.data import DataError, load_dataset
from inttrain.data.text import UNKNOWN


def test_windows_vocab_and_tail_split(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    text = "abcdefghij" * 9 + "zzzzzzzzzz"  # 100 chars; the last 10 (validation) hold an unseen 'z'
    path.write_text(text, encoding="utf-8")
    s = load_dataset("text", path, seq_len=4)
    assert s.task == "lm" and s.vocab == "abcdefghij" + UNKNOWN
    assert (s.num_classes, s.in_channels, s.image_size) == (11, 1, 4)
    x, y = s.train.tensors
    # 90 training chars in windows of 5 that overlap by one: starts 0, 4, ..., 84 -> 22 windows.
    assert x.shape == y.shape == (22, 4) and x.dtype == torch.int64
    decode = lambda ids: "".join(s.vocab[i] for i in ids.tolist())  # noqa: E731
    assert decode(x[0]) == "abcd" and decode(y[0]) == "bcde"
    assert decode(x[1]) == "efgh"  # the next window starts at the previous target's last char
    assert torch.equal(x[1:, 0], y[:-1, -1])
    vx, vy = s.val.tensors
    assert vx.shape == (2, 4) and set(vx.flatten().tolist()) == {10}  # 'z' -> the unknown id
    assert "last 0.1 of the file (10 characters)" in s.val_source


def test_utf8_characters(tmp_path: Path) -> None:
    path = tmp_path / "u.txt"
    path.write_text("héllo wörld ✓ " * 20, encoding="utf-8")
    s = load_dataset("text", path, seq_len=8, val_fraction=0.2)
    assert {"é", "ö", "✓"} <= set(s.vocab)


@pytest.mark.parametrize(
    ("content", "seq_len", "expected"),
    [
        (b"", 8, "{p}: text: file is empty"),
        (b"abc" * 10, 8, "{p}: text: 30 characters is too short; with seq_len=8 and val_fraction=0.1 the training part "
                         "(27) and the validation part at the end (3) must each hold at least seq_len+1=9 characters, "
                         "so the file needs at least 86"),
        (b"ab\xffcd", 2, "{p}: byte 2: not valid UTF-8"),
    ],
)
def test_bad_files_name_file_and_rule(tmp_path: Path, content: bytes, seq_len: int, expected: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError) as exc:
        load_dataset("text", path, seq_len=seq_len)
    assert str(exc.value).startswith(expected.format(p=path))


def test_minimum_length_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("x" * 86)
    s = load_dataset("text", path, seq_len=8)
    assert len(s.val) == 1
    path.write_text("x" * 85)
    with pytest.raises(DataError, match="needs at least 86"):
        load_dataset("text", path, seq_len=8)


def test_missing_path_and_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="^text: data_dir: required"):
        load_dataset("text", None)
    with pytest.raises(DataError, match="is a folder"):
        load_dataset("text", tmp_path)
