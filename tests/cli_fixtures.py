"""Helpers for the command-line tests: a home built from the golden event logs (fixed times,
ids and paths, so tables are reproducible), a CliRunner at a fixed width without colours, and
snapshot files under tests/snapshots/ (regenerate them with ``BGCTL_UPDATE_SNAPSHOTS=1``)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import rebuild

GOLDEN = Path(__file__).parent / "golden"
SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("BGCTL_UPDATE_SNAPSHOTS") == "1"
NOW = "2026-11-21T16:00:00+00:00"  # "now" for ages in the golden home (BGCTL_NOW)

# (golden log, job id in the home): the same content dropped four times gets -2, -3, -4, as the daemon names them
GOLDEN_JOBS = [
    ("v1_happy_multichunk", "194352796bbb"),
    ("v1_happy_multichunk", "194352796bbb-2"),
    ("v1_failed_rows_retry", "32c86eafae56"),
    ("v1_rejected_file", "x-52fbb30faf37"),
    ("v1_held", "194352796bbb-3"),
    ("v1_cancelled", "194352796bbb-4"),
]


def golden_home(home: Home) -> Home:
    """Fill ``home``'s event log with the golden logs (their own timestamps), then build the read models."""
    EventStore(home.db).close()
    rows = []
    for name, job_id in GOLDEN_JOBS:
        for line in (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            if line.strip():
                d = json.loads(line)
                rows.append((d["ts"], job_id, d["job_seq"], d["type"], d["version"], json.dumps(d["payload"], sort_keys=True)))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    conn = sqlite3.connect(home.db)
    with conn:
        conn.executemany("INSERT INTO events (ts, job_id, job_seq, type, version, payload) VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.close()
    rebuild(home.db)
    return home


def busy_home(home: Home) -> Home:
    """The golden home as a heavy user's: a long profile name and token counts and costs in the
    millions and dollars (to check that tables keep ids, states, counts and amounts whole)."""
    EventStore(home.db).close()
    rows = []
    for name, job_id in GOLDEN_JOBS:
        for line in (GOLDEN / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            d = json.loads(line)
            p = d["payload"]
            if d["type"] == "JobAccepted":
                p["profile"] = "essays-claude-long"
            if d["type"] == "TokensUsed":
                for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                    p[k] *= 123457
                p["cost_usd"] *= 1234567
            rows.append((d["ts"], job_id, d["job_seq"], d["type"], d["version"], json.dumps(p, sort_keys=True)))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    conn = sqlite3.connect(home.db)
    with conn:
        conn.executemany("INSERT INTO events (ts, job_id, job_seq, type, version, payload) VALUES (?, ?, ?, ?, ?, ?)", rows)
    conn.close()
    rebuild(home.db)
    return home


def run(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> Result:
    """``bgctl ARGS`` through click's runner: fixed width, no colours, fixed "now"."""
    base = {"COLUMNS": str(columns), "LINES": "50", "NO_COLOR": "1", "TERM": "dumb", "BGCTL_NOW": NOW}
    return CliRunner().invoke(cli, list(args), env={**base, **(env or {})}, terminal_width=columns, prog_name="bgctl")


def check_snapshot(name: str, text: str) -> None:
    """Compare ``text`` with tests/snapshots/NAME (written instead when BGCTL_UPDATE_SNAPSHOTS=1)."""
    path = SNAPSHOTS / name
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            raise AssertionError(f"new snapshot {path} written: review it and commit it")
        return
    expected = path.read_text(encoding="utf-8")
    assert text == expected, f"{name} changed; if intended, regenerate with BGCTL_UPDATE_SNAPSHOTS=1 and review the diff"
