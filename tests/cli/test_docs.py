"""Every ``$ command`` in docs/cli.md runs, in order, in a fresh folder, and exits 0."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from inttrain.cli.app import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def doc_commands() -> list[str]:
    """The ``$ ...`` lines of the ```console blocks, in document order."""
    blocks = re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def test_doc_lists_commands() -> None:
    cmds = doc_commands()
    for name in ("train", "resume", "eval", "recipes", "plot", "compare", "demo", "env"):
        assert any(c.startswith(f"inttrain {name}") for c in cmds), name


def test_every_doc_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for cmd in doc_commands():
        if cmd.startswith("inttrain "):
            # In-process: same code path as the console script, without a torch import per command.
            code = main(shlex.split(cmd)[1:])
            out = capsys.readouterr()
            assert code == 0, f"{cmd}\n{out.err}"
        else:  # shell helpers (writing a config or a text file)
            python = str(Path(__import__("sys").executable))
            proc = subprocess.run(re.sub(r"^python ", shlex.quote(python) + " ", cmd), shell=True,
                                  capture_output=True, text=True)
            assert proc.returncode == 0, f"{cmd}\n{proc.stderr}"
    assert (tmp_path / "runs/digits-int8/plots/loss.png").is_file()
    assert (tmp_path / "runs/compare-demo/compare.md").is_file()
