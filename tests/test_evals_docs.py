"""docs/howto-openai-evals.md's worked example, run as written: each ``console`` block's command
in a folder holding the fixture files (an eval shaped as the API returns it), its output
compared with the block's (the home's path written ``$BATCHGRADER_HOME``)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "howto-openai-evals.md"
FIX = ROOT / "tests" / "fixtures" / "evals"


def console_blocks() -> list[tuple[str, str]]:
    out = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), re.S):
        first, _nl, rest = block.partition("\n")
        assert first.startswith("$ bgctl "), first
        out.append((first[2:], rest))
    return out


def test_the_worked_example_has_its_commands():
    cmds = [c for c, _ in console_blocks()]
    assert [c.split()[:3] for c in cmds] == [["bgctl", "evals", "import"], ["bgctl", "evals", "results"]] * 2


@pytest.mark.slow
def test_worked_example_prints_what_the_doc_shows(home, tmp_path):
    work = tmp_path / "example"
    shutil.copytree(FIX, work)
    for cmd, expected in console_blocks():
        argv = [sys.executable, "-m", "batchgrader.cli", *shlex.split(cmd)[1:]]
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr
        assert done.stdout.replace(str(home.root), "$BATCHGRADER_HOME") == expected, cmd
