"""Shared fixtures. The one state-root fixture relocates every test to a fresh home."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from batchgrader.core.home import Home

# The suite starts hundreds of Python processes (daemons, `bgctl`, merge workers, the sandbox's
# emulator, pytest's own workers): they share the compiled modules instead of each compiling the
# package again, also where the environment asks Python not to write them
# (PYTHONDONTWRITEBYTECODE). The caches are git-ignored.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    """A fresh BATCHGRADER_HOME for every test; no OPENAI_* or BATCHGRADER_* leaks in."""
    for name in list(os.environ):
        if name.startswith(("BATCHGRADER_", "OPENAI_")):
            monkeypatch.delenv(name, raising=False)
    root = tmp_path / "bghome"
    monkeypatch.setenv("BATCHGRADER_HOME", str(root))
    return Home.resolve(root).ensure()
