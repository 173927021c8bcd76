"""Issue 23 (8, 10): what the command line says while the daemon creates its database, and about
a file waiting in an inbox folder that names no profile."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from cli_fixtures import run


def _no_traceback(res) -> None:  # noqa: ANN001
    assert "Traceback" not in res.output and "no such table" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def _empty_file(db: Path) -> None:
    db.write_bytes(b"")  # the daemon's first step: the file, created 0600, with nothing in it yet


def _database_without_tables(db: Path) -> None:
    conn = sqlite3.connect(db)  # the next steps: WAL mode and the schema version, before the tables
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA user_version=1")
    conn.close()


@pytest.mark.parametrize("make", [_empty_file, _database_without_tables], ids=["empty file", "no tables yet"])
def test_commands_while_the_daemon_creates_its_database_say_no_jobs_yet(home: Home, make) -> None:  # noqa: ANN001
    make(home.db)
    res = run("status")
    _no_traceback(res)
    assert res.exit_code == 0 and "No daemon is running" in res.output
    res = run("status", "--json")
    _no_traceback(res)
    assert res.exit_code == 0 and json.loads(res.output) == []
    for args in (("costs",), ("costs", "--json"), ("events",), ("report", "0123abcd"), ("status", "0123abcd")):
        res = run(*args)
        _no_traceback(res)
        assert res.exit_code == 1 and "no jobs yet" in res.output, (args, res.output)


def test_a_file_in_a_folder_that_names_no_profile_says_why_it_waits(home: Home) -> None:
    home.config_file.write_text("profiles:\n  essays: {model: gpt-5.4-mini}\n")
    (home.inbox / "typo").mkdir()
    (home.inbox / "typo" / "a.csv").write_text("id,response\n1,x\n")
    (home.inbox / "essays").mkdir()
    (home.inbox / "essays" / "b.csv").write_text("id,response\n1,x\n")
    res = run("status", columns=100)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the note column wraps
    assert "'typo' is not a profile in config.yaml (profiles: essays)" in text and "Fix: add profile 'typo'" in text
    entries = {e["file"]: e for e in json.loads(run("status", "--json").output)}
    note = entries["a.csv"]["note"]
    assert "not a profile" in note and f"mv {home.inbox / 'typo' / 'a.csv'} {home.inbox / 'essays'}/" in note
    assert entries["b.csv"]["note"] is None  # a profile's folder: nothing to say
