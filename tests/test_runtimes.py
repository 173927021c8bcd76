"""Issue 27, item 10: each running job's progress (rows answered of rows sent, from the
provider's request counts) and an expected finish from the learned run times of its model,
labelled an estimate with its basis; none where nothing has been learned yet."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from batchgrader.store import queries
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors
from batchgrader.store.runtimes import eta, progress
from cli_fixtures import run
from ticks import Rig

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC).timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_eta_is_the_latest_start_plus_the_median_run_time():
    job = {
        "model": "gpt-5.4-mini",
        "sandbox": False,
        "batches": [
            {"status": "in_progress", "requested_ts": _iso(T0), "request_counts": {"completed": 30, "failed": 2, "total": 50}},
            {"status": "validating", "requested_ts": _iso(T0 + 60), "request_counts": {"total": 50}},
            {"status": "done", "requested_ts": _iso(T0 - 900), "request_counts": {"completed": 50, "total": 50}},
            {"status": "pending", "request_counts": {}},
        ],
    }
    learned = {("gpt-5.4-mini", False): [600.0, 900.0, 1200.0]}
    seconds, basis = eta(job, learned, now=T0 + 300)
    assert seconds == pytest.approx(60 + 900 - 300)
    assert basis == (
        "median run time of the last 3 gpt-5.4-mini batches here (15m), from the start of the latest of the 2 in flight; "
        "1 chunk not sent yet is not counted"
    )
    assert progress(job["batches"]) == {"answered": 82, "sent": 150}
    assert eta(job, {("gpt-5.4-mini", True): [60.0]}, T0) == (None, None)  # only the sandbox's figures: none
    assert eta(job, {}, T0) == (None, None)
    late, basis = eta(job, learned, now=T0 + 5000)
    assert late == 0 and basis.endswith("it is past its usual run time")


def test_status_shows_progress_and_an_eta_once_a_batch_of_the_model_has_completed(home, monkeypatch):
    rig = Rig(home)
    rig.store.close()
    rig.store = rig.engine.ctx.store = EventStore(home.db, projectors=projectors())
    try:
        rig.drop(3, name="first.csv")
        rig.tick()
        rig.tick()  # the request counts are recorded
        (first,) = queries.status(home)
        assert first["progress"] == {"answered": 0, "sent": 3}
        assert first["eta_seconds"] is None and first["eta_basis"] is None  # nothing learned yet
        monkeypatch.setenv("BATCHGRADER_HOME", str(home.root))
        out = " ".join(run("status", columns=200, env={"BGCTL_NOW": ""}).output.split())
        assert "0/3 rows answered; no finish estimate yet: no gpt-5.4-mini batch has completed here" in out
        rig.provider.finish_all()
        rig.tick()
        assert rig.engine.ctx.state.jobs[first["job_id"]].ended == "completed"
        rig.engine.scan_requested = True  # as the inbox watcher does
        (home.inbox / "second.csv").write_text("id,response\n0,another answer\n1,and one more\n")  # nothing reused
        rig.tick()
        assert rig.tick()[:2] == ["JobAccepted", "JobPrepared"]
        rig.tick()
        rig.tick()
        second = next(r for r in queries.status(home) if r["file"] == "second.csv")
        assert second["progress"]["sent"] == 2 and second["eta_seconds"] is not None
        assert second["eta_basis"].startswith("median run time of the last 1 gpt-5.4-mini batch here")
        detail = queries.job_detail(home, second["job_id"])
        assert detail["eta_basis"] == second["eta_basis"]
        js = json.loads(run("status", "--json", env={"BGCTL_NOW": ""}).output)
        assert {"progress", "eta_seconds", "eta_basis"} <= set(next(j for j in js if j["file"] == "second.csv"))
        out = " ".join(run("status", columns=250, env={"BGCTL_NOW": ""}).output.split())
        assert "0/2 rows answered; expected to finish" in out and "(estimate: median run time" in out
    finally:
        rig.close()
