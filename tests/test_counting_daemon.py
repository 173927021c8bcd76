"""The daemon plans an Anthropic job on the exact counts of ``messages.count_tokens`` (the
counting hook), records whether they are exact (``InputTokensCounted``), and ``bgctl status`` /
``status --json`` say so; when the endpoint fails the counts stay estimates, labelled."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from batchgrader.emulator import Emulator, EmulatorConfig
from harness import BGCTL, events_of
from test_anthropic_daemon import ANTHROPIC_KEY, SUITE, env_for, run, state_of

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_anthropic_jobs_are_planned_on_exact_counts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    with Emulator(EmulatorConfig(api_key=ANTHROPIC_KEY, seed=4)) as emu:
        assert run(home, emu, "daemon", "--once").returncode == 0
        assert emu.request_count("POST", "/v1/messages/count_tokens") == 9  # a.csv 7 + b.jsonl 2, each once
        status = json.loads(run(home, emu, "status", "--json").stdout)
        table = run(home, emu, "status").stdout
        # the prompt tokens the batches billed are exactly the counts the plan was made on
        st = state_of(home)
    counted = events_of(home, "InputTokensCounted")
    assert len(counted) == 2 and all(c["exact"] and c["source"] == "anthropic counting endpoint" for c in counted)
    assert all(s["input_tokens_exact"] is True for s in status) and "(est.)" not in table
    for job in st.jobs.values():
        planned = sum(c.input_tokens for c in job.chunks.values())
        assert planned == job.prompt_tokens > 0
    assert (home / "token_counts.sqlite").exists()
    assert ANTHROPIC_KEY.encode() not in b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())


def test_a_failing_counting_endpoint_leaves_labelled_estimates(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    (home / "inbox" / "b.jsonl").unlink()
    with Emulator(EmulatorConfig(api_key=ANTHROPIC_KEY, seed=4)) as emu:
        emu.script_fault("POST", "/v1/messages/count_tokens", "status", status=400, message="counting is off", times=1000)
        assert run(home, emu, "daemon", "--once").returncode == 0
        status = json.loads(run(home, emu, "status", "--json").stdout)
        wide = {**env_for(home, emu), "COLUMNS": "200"}
        table = subprocess.run([BGCTL, "status"], env=wide, capture_output=True, text=True, timeout=60).stdout
        (job,) = status
        detail = run(home, emu, "status", job["job_id"]).stdout
    (counted,) = events_of(home, "InputTokensCounted")
    assert counted["exact"] is False and counted["source"] == "estimate" and "counting is off" in counted["reason"]
    assert job["input_tokens_exact"] is False and job["state"] == "completed"
    assert "ESTIMATE" in detail
    # the list's token columns show what was billed once the job is billed (one scope per figure,
    # issue 32): the provider's own usage, no estimate left to mark there
    assert "in (est.)" not in table and f"{job['prompt_tokens']:,} in" in " ".join(table.split())
