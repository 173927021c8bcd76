"""`bgctl init` and `bgctl grade`: a new home's starter files, and one file graded from start
to result (the sandbox's emulator, a daemon run in the foreground or one already running)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.core.host.lock import daemon_pid
from harness import FAST_CONFIG, bgctl, event_types, start_daemon, wait_for

EXAMPLE = Path(__file__).parents[1] / "examples" / "reviews.csv"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def result_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


# --- bgctl init ---------------------------------------------------------------------------------------


def test_init_writes_a_loadable_starter_config_and_the_example(home):
    res = run("init")
    assert res.exit_code == 0, res.output
    assert f"wrote {home.config_file}" in res.output
    example = home.root / "examples" / "reviews.csv"
    assert example.read_bytes() == EXAMPLE.read_bytes()
    assert "# " in home.config_file.read_text()  # commented
    cfg = load_config(home)
    assert cfg.default.values["user_prompt"].startswith("Review: {response}")
    lines = res.output.splitlines()
    nxt = lines[lines.index("next:") + 1 :]
    assert len(nxt) == 2 and f"bgctl grade {example} --sandbox" in nxt[0] and "bgctl grade" in nxt[1]


def test_init_overwrites_nothing_and_says_what_it_kept(home):
    home.config_file.write_text("model: gpt-4.1-nano\n")
    res = run("init")
    assert res.exit_code == 0
    assert f"kept {home.config_file} (already there, left alone)" in res.output
    assert home.config_file.read_text() == "model: gpt-4.1-nano\n"
    again = run("init", "--json")
    data = json.loads(again.output)
    assert data["written"] == [] and len(data["kept"]) == 2


def test_init_dir_is_the_home_and_the_commands_name_it(tmp_path, home):
    target = tmp_path / "newhome"
    res = run("init", str(target))
    assert res.exit_code == 0
    assert (target / "config.yaml").is_file() and (target / "inbox").is_dir()
    assert not home.config_file.exists()
    assert f"bgctl --home {target} grade {target / 'examples' / 'reviews.csv'} --sandbox" in res.output


# --- bgctl grade ---------------------------------------------------------------------------------------


def test_grade_refuses_what_submit_refuses(home, tmp_path):
    bad = tmp_path / "notes.docx"
    bad.write_text("x")
    res = CliRunner().invoke(cli, ["grade", str(bad)])
    assert res.exit_code == 2 and "unsupported file type" in res.output
    assert not any(home.inbox.iterdir())


@pytest.mark.slow  # a daemon and the emulator in child processes (about 5 s)
def test_grade_sandbox_runs_the_daemon_until_the_job_ends(home):
    home.config_file.write_text(FAST_CONFIG)
    res = bgctl(home.root, "grade", str(EXAMPLE), "--sandbox", key=None, timeout=120)
    assert res.returncode == 0, res.stderr
    summary, result = res.stdout.splitlines()
    assert summary.startswith("job ") and "completed, 12 rows: 12 answered, 0 failed" in summary and "SIMULATED" in summary
    path = Path(result.removeprefix("result: "))
    assert path == home.outbox / "reviews_results.csv"
    assert len(result_rows(path)) == 12 and all(r["grade"] for r in result_rows(path))
    (job,) = json.loads(bgctl(home.root, "status", "--json", key=None).stdout)
    assert job["state"] == "completed" and job["sandbox"] is True and summary.startswith(f"job {job['job_id']} ")
    assert daemon_pid(home) is None  # the foreground daemon stopped with the job


@pytest.mark.slow
def test_grade_exits_4_when_the_job_fails(home):
    home.config_file.write_text(FAST_CONFIG.replace("max_completion_tokens: 50", "max_completion_tokens: 1"))
    res = bgctl(home.root, "grade", str(EXAMPLE), "--sandbox", "--json", key=None, timeout=120)
    row = json.loads(res.stdout)  # every answer cut off at 1 token: every row failed (truncated)
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert row["state"] == "failed" and row["succeeded"] == 0 and row["error_path"]
    assert Path(row["error_path"]).is_file()


@pytest.mark.slow
def test_grade_waits_on_a_running_daemon_without_starting_one(home):
    home.config_file.write_text(FAST_CONFIG)
    proc = start_daemon(home.root, None, "--sandbox", key=None)
    try:
        pid = wait_for(lambda: daemon_pid(Home(home.root)), timeout=30, what="the daemon's lock")
        res = bgctl(home.root, "grade", str(EXAMPLE), key=None, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "the running daemon takes it" in res.stderr
        assert "completed, 12 rows: 12 answered" in res.stdout and "SIMULATED" in res.stdout
        assert daemon_pid(Home(home.root)) == pid and proc.poll() is None  # the same daemon, still serving
        assert event_types(home.db).count("JobAccepted") == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


HELD_CONFIG = FAST_CONFIG + "max_cost_per_job_usd: 0.0000001\n"  # every job held: its estimate is over the limit


def test_grade_says_why_when_the_foreground_daemon_stops_before_the_end(home):
    home.config_file.write_text(HELD_CONFIG)
    res = bgctl(home.root, "grade", str(EXAMPLE), "--sandbox", key=None, timeout=120)
    assert res.returncode == 1
    (job,) = json.loads(bgctl(home.root, "status", "--json", key=None).stdout)
    assert job["state"] == "held"
    assert f"job {job['job_id']} is held (" in res.stderr and "max_cost_per_job_usd" in res.stderr


@pytest.mark.slow
def test_grade_timeout_leaves_the_job_to_the_running_daemon(home):
    home.config_file.write_text(HELD_CONFIG)
    proc = start_daemon(home.root, None, "--sandbox", key=None)
    try:
        wait_for(lambda: daemon_pid(Home(home.root)), timeout=30, what="the daemon's lock")
        res = bgctl(home.root, "grade", str(EXAMPLE), "--timeout", "1", key=None, timeout=120)
        assert res.returncode == 1 and "has not ended after 1 s; it goes on" in res.stderr
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # a real daemon process
def test_grade_sandbox_is_refused_when_a_real_daemon_would_take_it(home):
    from batchgrader.ops.grade import running_daemon_mode

    home.config_file.write_text(FAST_CONFIG)
    proc = start_daemon(home.root, None)  # real: a (test) key, nothing to send
    try:
        pid = wait_for(lambda: (running_daemon_mode(Home(home.root)) or (0, None))[1] is not None, what="the daemon's start")
        assert running_daemon_mode(Home(home.root)) == (proc.pid, False) and pid
        res = bgctl(home.root, "grade", str(EXAMPLE), "--sandbox", key=None, timeout=60)
        assert res.returncode == 2 and f"a real daemon (pid {proc.pid}) runs for" in res.stderr
        assert list(home.inbox.iterdir()) == []  # nothing queued
    finally:
        proc.terminate()
        proc.wait(timeout=30)
