"""Shared fixtures. The one state-root fixture relocates every test to a fresh home."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home

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


# --- a real PostgreSQL server (tests/pg_server.py) ---------------------------------------------


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server per test process, started on first use and stopped at the end;
    skipped (failed under CI, which installs the package) when no server binary is found."""
    from pg_server import PostgresServer, find_bindir

    bindir = find_bindir()
    if bindir is None:
        reason = "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH: install Debian's postgresql package"
        if os.environ.get("CI"):
            pytest.fail(reason + " (.ci/run installs it)")
        pytest.skip(reason)
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[postgres]'")
    server = PostgresServer(bindir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server):
    """The URL of a new, empty database on the test server (dropped afterwards)."""
    url = pg_server.create_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url)
