"""The preflight end to end: `bgctl daemon --once` against the emulator over real HTTP, through the
official SDK's synchronous call (issue 22, deliverable 5)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from harness import BGCTL, FAST_CONFIG, TEST_KEY, bgctl, daemon_env

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # each test runs a daemon process (tick tests: test_preflight.py)
BASE = FAST_CONFIG.replace("preflight_rows: 0\n", "")  # the product's default: preflight_rows 3


def only_job(home):
    with EventStore(home.db, readonly=True) as s:
        (job,) = fold(s.read()).jobs.values()
    return job


def events(home, type_: str) -> list[dict]:
    with EventStore(home.db, readonly=True) as s:
        return [e.payload for e in s.read() if e.type == type_]


def test_a_passed_preflight_answers_its_rows_through_the_sync_api(home):
    home.config_file.write_text(BASE + "preflight_rows: 2\n")
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(6)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        assert emu.request_count("POST", "/v1/chat/completions") == 2
        assert emu.batches_created() == 1
    job = only_job(home)
    assert job.ended == "completed" and job.preflight == "passed"
    (chunk,) = job.chunks.values()
    assert chunk.requests == 4  # the two preflight rows were not sent again
    rows = list(csv.DictReader(io.StringIO((home.outbox / "a_results.csv").read_text(encoding="utf-8"))))
    assert len(rows) == 6 and all(r["error"] == "" and r["grade"] for r in rows)
    preflight_cost = [u for u in events(home, "TokensUsed") if u["chunk"] == -1]
    assert len(preflight_cost) == 2 and all(u["cost_usd"] > 0 for u in preflight_cost)  # one per row, as it was answered


def test_a_truncating_bound_fails_the_job_in_seconds_without_a_batch(home):
    home.config_file.write_text(BASE.replace("max_completion_tokens: 50", "max_completion_tokens: 1"))  # preflight_rows: 3
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(10)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        started = time.monotonic()
        bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
        took = time.monotonic() - started
        assert emu.batches_created() == 0 and emu.request_count("POST", "/v1/files") == 0
    job = only_job(home)
    assert job.ended == "failed" and took < 60
    (failed,) = events(home, "JobFailed")
    assert failed["code"] == "preflight_failed" and "truncated" in failed["error"]
    assert "max_completion_tokens" in failed["hint"]
    status = json.loads(bgctl(home.root, "status", job.job_id, "--json").stdout)
    assert "preflight_failed" in json.dumps(status)
    (report,) = home.outbox.glob("*error*")
    assert "truncated" in report.read_text()


def _env(home, emu: Emulator, provider: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in daemon_env(home, emu.base_url).items()
        if not k.startswith(("ANTHROPIC_", "GEMINI_", "GOOGLE_", "AZURE_"))
    }
    if provider == "anthropic":
        env.update(ANTHROPIC_BASE_URL=emu.root_url, ANTHROPIC_API_KEY=TEST_KEY)
    elif provider == "gemini":
        env.update(GOOGLE_GEMINI_BASE_URL=emu.root_url, GEMINI_API_KEY=TEST_KEY)
    elif provider == "azure":
        env.update(AZURE_OPENAI_ENDPOINT=emu.root_url, AZURE_OPENAI_API_KEY=TEST_KEY)
    return env


PROVIDERS = {
    "anthropic": ("provider: anthropic\nmodel: claude-haiku-4-5\n", "POST", "/v1/messages"),
    "gemini": ("provider: gemini\nmodel: gemini-2.5-flash-lite\n", "POST", "/v1beta/models/{model}:generateContent"),
    "azure": (
        "provider: azure\nmodel: grader-mini\nazure_model: gpt-5.4-mini\n",
        "POST",
        "/openai/deployments/{id}/chat/completions",
    ),
}


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_the_preflight_goes_through_each_providers_sync_endpoint(home, provider):
    config, method, route = PROVIDERS[provider]
    home.config_file.write_text(BASE + config)
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(5)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, extra_models=("grader-mini",))) as emu:  # the Azure deployment
        res = subprocess.run(
            [BGCTL, "daemon", "--once"],
            env=_env(home.root, emu, provider),
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert emu.request_count(method, route) == 3, res.stdout[-3000:] + res.stderr[-3000:]
    job = only_job(home)
    assert job.preflight == "passed" and job.ended == "completed", job.last_error
    assert sum(c.requests for c in job.chunks.values()) == 2  # the preflight's 3 rows were not sent again


def test_the_preflight_runs_in_the_sandbox(home):
    home.config_file.write_text(BASE)  # preflight_rows: 3, the default
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(5)))
    res = bgctl(home.root, "daemon", "--once", "--sandbox", key=None, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    job = only_job(home)
    assert job.sandbox and job.preflight == "passed" and job.ended == "completed"
    assert len(events(home, "PreflightRowAnswered")) == 3 and sum(c.requests for c in job.chunks.values()) == 2


def test_a_daemon_killed_while_the_preflights_requests_are_in_flight_sends_them_again_once(home):
    """kill -9 as the emulator receives the preflight's first request: every row's intent is in
    the log already (stamped before any request left), and the restarted daemon sends each row
    once more, then the batch carries the rest."""
    home.config_file.write_text(BASE)  # preflight_rows: 3, the default
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(5)))
    target: dict[str, int] = {}
    killed, reaped = threading.Event(), threading.Event()

    def hook(method: str, route: str, phase: str) -> None:
        if (method, route, phase) == ("POST", "/v1/chat/completions", "received") and not killed.is_set() and "pid" in target:
            os.kill(target["pid"], signal.SIGKILL)
            killed.set()
            reaped.wait(timeout=30)  # no answer reaches a daemon not yet gone

    with Emulator(EmulatorConfig(api_key=TEST_KEY, on_request=hook)) as emu:
        proc = subprocess.Popen(
            [BGCTL, "daemon", "--once"],
            env=daemon_env(home.root, emu.base_url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        target["pid"] = proc.pid
        try:
            proc.wait(timeout=120)
        finally:
            reaped.set()
        assert killed.is_set() and proc.returncode == -signal.SIGKILL
        requested = events(home, "PreflightRequested")
        assert len(requested) == 3 and {e["attempt"] for e in requested} == {1} and not events(home, "PreflightRowAnswered")
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        assert emu.batches_created() == 1
    attempts = [(e["rows"][0], e["attempt"]) for e in events(home, "PreflightRequested")]
    assert sorted(a for _row, a in attempts) == [1, 1, 1, 2, 2, 2]  # each row sent once more, not more
    job = only_job(home)
    assert job.preflight == "passed" and job.ended == "completed" and len(job.preflight_answers) == 3
    assert job.preflight_resent == {row for row, _a in attempts}
    assert sum(c.requests for c in job.chunks.values()) == 2
