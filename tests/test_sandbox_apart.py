"""Issue 23 (3) and issue 27 (1): sandbox and real never mix.

Tick-level (in-memory providers, a fake clock): a job's mode, provider and endpoint are fixed when
it is accepted; a daemon of the other mode (or another endpoint) leaves it alone with the reason
in `bgctl status` and does not count it as work; an edit of the profile's provider does not
re-route a job in flight; answers and learned figures are kept apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.core.log.state import JobState
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.pool import Providers
from batchgrader.store import log_queries, queries
from batchgrader.store.eventstore import EventStore

# preflight off: these rules are about the batch path (a 3-row job would be answered by its preflight alone)
CONFIG = "stable_seconds: 0\npoll_interval_seconds: 2\nmax_completion_tokens: 50\ncache_days: 30\npreflight_rows: 0\n"


class Daemon:
    """One daemon's engine on the home's log, with its own in-memory provider and mode."""

    def __init__(self, home: Home, sandbox: bool, now: float, provider: object | None = None) -> None:
        self.home = home
        self.store = EventStore(home.db)
        self.provider = provider if provider is not None else MemoryProvider()
        self.now = now
        self.engine = Engine(home, load_config(home, environ={}), self.store, self.provider, load_pricing(), sandbox=sandbox)

    def tick(self, seconds: float = 1.0) -> list[str]:
        before = self.store.last_seq()
        self.now += seconds
        for p in self._memories():
            p.now = self.now
        self.engine.tick(self.now)
        return [e.type for e in self.store.read(after=before)]

    def _memories(self) -> list[MemoryProvider]:
        if isinstance(self.provider, Providers):
            return [p for p in self.provider.built().values() if isinstance(p, MemoryProvider)]
        return [self.provider] if isinstance(self.provider, MemoryProvider) else []

    def job(self, file: str = "a.csv") -> JobState:
        (job,) = [j for j in self.engine.ctx.state.jobs.values() if j.file == file]
        return job

    def events(self, type_: str) -> list[dict]:
        return [e.payload for e in self.store.read() if e.type == type_]

    def close(self) -> float:
        self.store.close()
        return self.now


def _drop(home: Home, name: str = "a.csv", rows: int = 3) -> None:
    (home.inbox / name).write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(rows)))


def _running(d: Daemon, name: str = "a.csv") -> JobState:
    for _ in range(6):
        d.tick()
        job = d.job(name) if any(j.file == name for j in d.engine.ctx.state.jobs.values()) else None
        if job is not None and job.state == "running":
            return job
    raise AssertionError("the job did not reach running")


def _finish(d: Daemon, name: str = "a.csv") -> JobState:
    for p in d._memories():
        p.finish_all()
    for _ in range(10):
        d.tick()
        if d.job(name).ended:
            return d.job(name)
    raise AssertionError(f"the job did not end: {d.job(name).state}")


def test_a_normal_daemon_leaves_a_sandbox_job_alone_and_a_sandbox_daemon_finishes_it(home: Home) -> None:
    home.config_file.write_text(CONFIG)
    sandbox = Daemon(home, sandbox=True, now=1_000_000.0)
    _drop(home)
    job = _running(sandbox)
    assert (job.sandbox, job.provider, job.provider_id) == (True, "openai", "sandbox")
    now = sandbox.close()

    real = Daemon(home, sandbox=False, now=now)
    for _ in range(5):
        real.tick(30)
    assert real.provider.calls == []  # never polled (nor paid) at the real provider
    (left,) = real.events("JobLeftAlone")  # once, not once a tick
    assert left["code"] == "sandbox_job" and "bgctl daemon --sandbox" in left["reason"]
    assert real.engine.idle  # `daemon --once` ends: nothing here is this daemon's work
    (row,) = queries.status(home)
    assert row["state"] == "running" and "sandbox" in row["last_error"]
    now = real.close()

    sandbox = Daemon(home, sandbox=True, now=now, provider=sandbox.provider)
    job = _finish(sandbox)
    assert job.ended == "completed" and job.left_alone is None and job.last_error is None
    assert "JobTakenUp" in [e.type for e in sandbox.store.read()]
    providers = {r[0] for r in sandbox.store.conn.execute("SELECT provider FROM answers")}
    assert providers == {"sandbox"}  # simulated answers are never stored under a real provider's key
    now = sandbox.close()

    # the same rows in a real job: nothing of the sandbox's is reused, every row is sent
    real = Daemon(home, sandbox=False, now=now)
    _drop(home, "b.csv")
    _running(real, "b.csv")
    job = _finish(real, "b.csv")
    assert job.ended == "completed" and job.cached_rows == 0 and real.provider.calls
    real.close()


def test_a_sandbox_daemon_leaves_a_real_job_alone(home: Home) -> None:
    home.config_file.write_text(CONFIG)
    real = Daemon(home, sandbox=False, now=1_000_000.0)
    _drop(home)
    job = _running(real)
    assert (job.sandbox, job.provider, job.provider_id) == (False, "openai", "https://api.openai.com/v1")
    now = real.close()

    sandbox = Daemon(home, sandbox=True, now=now)
    for _ in range(4):
        sandbox.tick(30)
    assert sandbox.provider.calls == []  # no emulator text in a real result
    (left,) = sandbox.events("JobLeftAlone")
    assert left["code"] == "real_job" and sandbox.engine.idle
    now = sandbox.close()

    real = Daemon(home, sandbox=False, now=now, provider=real.provider)
    assert _finish(real).ended == "completed"
    real.close()


def test_a_job_keeps_its_endpoint_and_is_left_alone_when_the_daemon_has_another(home: Home) -> None:
    home.config_file.write_text(CONFIG + "base_url: https://proxy.example/v1\n")
    d = Daemon(home, sandbox=False, now=1_000_000.0)
    _drop(home)
    assert _running(d).provider_id == "https://proxy.example/v1"
    now = d.close()
    home.config_file.write_text(CONFIG)  # the endpoint changed under the job
    other = Daemon(home, sandbox=False, now=now)
    other.tick(30)
    other.tick(30)
    assert other.provider.calls == []
    (left,) = other.events("JobLeftAlone")
    assert left["code"] == "endpoint_changed" and "https://proxy.example/v1" in left["reason"]
    other.close()


def test_an_edit_of_the_profile_provider_does_not_reroute_a_job_in_flight(home: Home) -> None:
    home.config_file.write_text(CONFIG)
    openai, azure = MemoryProvider(), MemoryProvider()
    providers = Providers({"openai": lambda: openai, "azure": lambda: azure})
    d = Daemon(home, sandbox=False, now=1_000_000.0, provider=providers)
    _drop(home)
    d.tick()
    d.tick()  # accepted and prepared with provider openai; nothing sent yet
    assert d.job().provider == "openai" and d.job().state == "queued"
    home.config_file.write_text(CONFIG + "provider: azure\nazure_endpoint: https://res.openai.azure.com\n")
    d.engine.reload(load_config(home, environ={}), load_pricing())
    assert _finish_after_sending(d).ended == "completed"
    assert azure.calls == [] and any(op == "upload" for op, _ in openai.calls)
    assert d.engine.ctx.provider_key_for(d.job()) == "https://api.openai.com/v1"
    d.close()


def _finish_after_sending(d: Daemon) -> JobState:
    for _ in range(4):
        d.tick()
    return _finish(d)


def test_a_claim_recovered_by_a_daemon_of_the_other_mode_keeps_its_own(home: Home, tmp_path: Path) -> None:
    """A sandbox daemon that died between its claim and JobAccepted: a normal daemon that recovers
    the claim accepts it as the sandbox job it is, and leaves it alone."""
    import json

    from batchgrader.pipeline import inbox as inbox_mod

    home.config_file.write_text(CONFIG)
    job_dir = home.job_dir("abc123")
    src = home.inbox / "a.csv"
    _drop(home)
    record = {"file": "a.csv", "source": str(src), "profile": "default", "sandbox": True}
    inbox_mod.write_claim(job_dir, record)
    (job_dir / "input.csv").write_bytes(src.read_bytes())
    src.unlink()
    d = Daemon(home, sandbox=False, now=1_000_000.0)
    d.engine.startup(d.now)
    d.tick()
    job = d.engine.ctx.state.jobs["abc123"]
    assert job.sandbox and job.provider_id == "sandbox" and job.left_alone
    assert d.provider.calls == [] and json.loads((job_dir / inbox_mod.CLAIM_FILE).read_text())["sandbox"] is True
    d.close()


# --- what a sandbox job teaches (issue 27, 1) --------------------------------------------------------

SCHEMA = """\
model: gpt-5.4-mini
response_format:
  type: object
  properties:
    score: {type: integer}
    reason: {type: string}
  required: [score, reason]
  additionalProperties: false
"""


@pytest.mark.slow  # a sandbox daemon process and its emulator process
def test_a_sandbox_job_bills_the_schema_and_its_lesson_never_calibrates_a_real_estimate(home: Home, tmp_path: Path) -> None:
    import json

    from batchgrader.pipeline.requests import schema_allowance
    from cli_fixtures import run
    from harness import FAST_CONFIG, bgctl

    home.config_file.write_text(FAST_CONFIG + SCHEMA)
    _drop(home, rows=4)
    res = bgctl(home.root, "daemon", "--sandbox", "--once", key=None, timeout=180)
    assert res.returncode == 0, res.stderr
    (learned,) = [
        json.loads(line)["payload"]
        for line in bgctl(home.root, "events", "--json", key=None).stdout.splitlines()
        if json.loads(line)["type"] == "SchemaOverheadLearned"
    ]
    allowance = schema_allowance(load_config(home, environ={}).default.response_format, "o200k_base")
    # the emulator bills the schema as prompt tokens, as the real API does: the lesson is true
    assert learned["provider"] == "sandbox" and learned["per_request"] == allowance > 0
    data = tmp_path / "later.csv"
    data.write_text("id,response\n1,x\n2,y\n")
    real = json.loads(run("count", str(data), "--json").output)
    assert real["schema"]["source"] == "allowance"  # a sandbox lesson never calibrates a real estimate
    simulated = json.loads(run("count", str(data), "--json", "--sandbox").output)
    assert simulated["schema"]["source"] == "calibrated" and simulated["schema"]["per_request"] == allowance


def test_learned_figures_of_an_older_log_stay_with_their_mode(home: Home) -> None:
    """A SchemaOverheadLearned written before it named its provider counts for the sandbox when its
    job was a sandbox job, and for real providers when it was not."""
    from batchgrader.core.log.state import fold
    from batchgrader.pipeline.calibration import learned_overhead
    from batchgrader.store.eventstore import NewEvent

    rf = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {"type": "object"}}}
    from batchgrader.pipeline.requests import schema_sha256

    lesson = {"model": "m", "schema_sha256": schema_sha256(rf), "chunk": 0, "requests": 4, "counted_tokens": 40}
    with EventStore(home.db) as store:
        for job, sandbox, per in (("s1", True, 0.0), ("r1", False, 21.0)):
            accepted = {"file": "a.csv", "source": "x", "profile": "default", "sha256": job, "bytes": 1}
            accepted |= {"input_path": "x", "result_name": "a_results.csv", "sandbox": sandbox}
            store.append(job, [NewEvent("JobAccepted", accepted)], expected_version=0)
            payload = {**lesson, "billed_prompt_tokens": 40 + int(per * 4), "per_request": per}
            store.append(job, [NewEvent("SchemaOverheadLearned", payload)], expected_version=1)
        state = fold(store.read())
    assert learned_overhead(state, "m", rf, "https://api.openai.com/v1") == 21.0
    assert learned_overhead(state, "m", rf, "sandbox") == 0.0
    assert log_queries.learned_schema_overhead(home, "m", schema_sha256(rf), "https://api.openai.com/v1")["per_request"] == 21.0
    assert log_queries.learned_schema_overhead(home, "m", schema_sha256(rf), "sandbox")["per_request"] == 0.0


def test_simulated_answers_an_older_version_stored_under_a_real_key_are_removed(home: Home) -> None:
    from batchgrader.store import answers
    from batchgrader.store.eventstore import NewEvent

    home.config_file.write_text(CONFIG)
    with EventStore(home.db) as store:
        for job, sandbox in (("sim", True), ("real", False)):
            accepted = {"file": "a.csv", "source": "x", "profile": "default", "sha256": job, "bytes": 1}
            accepted |= {"input_path": "x", "result_name": "a_results.csv", "sandbox": sandbox}
            store.append(
                job,
                [NewEvent("JobAccepted", accepted), NewEvent("JobCancelled", {"succeeded": 0, "failed": 0})],
                expected_version=0,
            )
        with store.write() as conn:
            row = {"model": "m", "content": "x", "finish_reason": "stop", "prompt_tokens": 1, "cached_tokens": 0}
            row |= {"completion_tokens": 1, "reasoning_tokens": 0, "custom_id": "c", "batch_id": "b"}
            answers.put(
                conn,
                [
                    {**row, "key": "k1", "provider": "https://api.openai.com/v1", "job_id": "sim"},  # the old bug
                    {**row, "key": "k2", "provider": "sandbox", "job_id": "sim"},
                    {**row, "key": "k3", "provider": "https://api.openai.com/v1", "job_id": "real"},
                ],
                now=1_000_000.0,
            )
    d = Daemon(home, sandbox=False, now=1_000_000.0)
    assert {r[0] for r in d.store.conn.execute("SELECT key FROM answers")} == {"k2", "k3"}
    d.close()
