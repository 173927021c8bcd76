"""One place computes a job's figures (``store/figures.py``) and every reader shows them: a judge
panel whose judges tie on a row, fail a row together, and fail a row one of them still answers;
a job with samples one of whose samples the provider refuses.  `status` (the read model's row,
its panel row combined at query time, and the log's fold when the read model is gone),
`status JOB`, `report --json`, `costs --by job`, the result file, `--disagreements` and the
figures the daemon's summary reads all say the same rows, failures, tokens, cost and models."""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from typing import Any

import pytest

from batchgrader.core.host.home import Home
from batchgrader.core.log.state import JobState
from batchgrader.store.figures import Billed, JobFigures, add_estimates, figures_of, job_figures, total
from batchgrader.store.readmodels import rebuild
from cli_fixtures import run
from combos import costs_of, result_tokens
from ticks import Rig

PANEL = (
    "max_row_retries: 0\n"
    "profiles:\n"
    "  panel:\n    judges: [mini, big]\n"
    "  mini:\n    model: gpt-5.4-mini\n"
    "  big:\n    model: gpt-4.1-nano\n"
)
# each judge's score of the 5 rows: row 2 ties (2 against 3)
SCORES = {"gpt-5.4-mini": [4, 2, 5, 1, 3], "gpt-4.1-nano": [4, 3, 5, 1, 3]}
# the rows (1-based) the provider refuses, per judge: row 4 by both (no judge answered it), row 5
# by big alone (mini's answer stands)
REFUSED = {"mini": {4}, "big": {4, 5}}


class Refused(dict):
    """The memory provider's ``row_errors``: the requests of ``rows`` (a row's first sample) fail."""

    def __init__(self, rows: set[int]) -> None:
        super().__init__()
        self.rows = rows

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, str) and any(cid.endswith(f"-{r}") for r in self.rows)

    def __getitem__(self, cid: str) -> tuple[str, str]:
        if cid not in self:
            raise KeyError(cid)
        return ("invalid_request", "the provider refused this row")


def _row(cid: str) -> int:
    return int(re.sub(r"-s[0-9]+$", "", cid).rsplit("-", 1)[1]) - 1


def _run_panel(rig: Rig) -> JobState:
    """Tick until the panel has ended, each judge's batch finished with that judge's refusals."""
    rig.provider.answer = lambda cid, body: f"{SCORES[body['model']][_row(cid)]}"
    folder = rig.home.inbox / "panel"
    folder.mkdir(exist_ok=True)
    (folder / "a.csv").write_text("id,response\n" + "".join(f"{i},essay {i}\n" for i in range(5)))
    state = rig.engine.ctx.state
    for _ in range(40):
        rig.tick()
        for b in rig.provider.open_batches():
            judge = state.jobs[b.metadata["bg_job"]]
            rig.provider.row_errors = Refused(REFUSED.get(judge.profile, set()))
            rig.provider.finish(b.id)
        rig.provider.row_errors = {}
        panels = [j for j in state.jobs.values() if j.profile == "panel"]
        if panels and panels[0].ended:
            return panels[0]
    raise AssertionError("the panel did not end")


def _readers(home: Home, job: JobState) -> dict[str, Any]:
    """What each command says of ``job`` (`status` from the read model, as a daemon keeps it)."""
    rebuild(home.db)
    listed = {r["job_id"]: r for r in json.loads(run("status", "--json").output)}
    assert listed[job.job_id]["source"] == "read_model"
    return {
        "status": listed[job.job_id],
        "detail": json.loads(run("status", job.job_id, "--json").output),
        "report": json.loads(run("report", job.job_id, "--json").output),
        "costs": costs_of(json.loads(run("costs", "--by", "job", "--json").output), job.job_id),
        "result": list(csv.DictReader(io.StringIO((home.outbox / "a_results.csv").read_text(encoding="utf-8")))),
    }


def _figures_by_reader(seen: dict[str, Any], f: JobFigures) -> dict[str, tuple[Any, ...]]:
    """Each figure as (status, status JOB, report, costs or the result file, figures)."""
    status, detail, report, costs, rows = seen["status"], seen["detail"], seen["report"], seen["costs"], seen["result"]
    failed = sum(1 for r in rows if r.get("error"))
    tin, tout = result_tokens(rows)
    return {
        "rows": (status["rows"], detail["rows"], report["rows"]["total"], len(rows), f.rows),
        "failed": (status["failed"], detail["failed"], report["rows"]["failed"], failed, f.failed),
        "answered": (status["succeeded"], detail["succeeded"], report["rows"]["answered"], len(rows) - failed, f.answered),
        "tokens in": (status["prompt_tokens"], detail["prompt_tokens"], report["tokens"]["prompt"], costs["prompt_tokens"], tin),
        "tokens out": (
            status["output_tokens"],
            detail["output_tokens"],
            report["tokens"]["completion"],
            costs["completion_tokens"],
            tout,
        ),
        "cost": (status["cost_usd"], detail["cost_usd"], report["cost_usd"]["billed"], costs["cost_usd"], f.cost_usd),
        "models": (status["model"], detail["model"], report["job"]["model"], ", ".join(f.models)),
    }


def test_a_panel_with_a_tie_and_failed_judge_rows_shows_the_same_figures_in_every_reader(home: Home) -> None:
    rig = Rig(home, PANEL)
    panel = _run_panel(rig)
    state = rig.engine.ctx.state
    f = figures_of(state, panel)
    seen = _readers(home, panel)
    errors = [r["error"] for r in seen["result"]]
    assert errors[1].startswith("no_majority: the judges tie") and errors[3].startswith("no_answer")
    assert [e == "" for e in errors] == [True, False, True, False, True]  # row 5: big refused it, mini's answer stands
    figures = _figures_by_reader(seen, f)
    assert {k: len(set(v)) for k, v in figures.items()} == {k: 1 for k in figures}, figures
    assert (f.rows, f.answered, f.failed) == (5, 3, 2)  # the tie and the row no judge answered are failed
    assert (f.requests, f.requests_answered, f.requests_failed) == (10, 7, 3)  # the judges' requests
    assert f.models == ("gpt-5.4-mini", "gpt-4.1-nano") and f.cost_usd > 0
    judges = [state.jobs[j["job_id"]] for j in panel.panel or ()]
    assert f.cost_usd == sum(j.cost_usd for j in judges) and panel.cost_usd == 0  # each cost once: in its judge
    # report --json's judges: each judge's own figures, which the panel's add up to
    lines = seen["report"]["judges"]
    assert [(j["profile"], j["requests"], j["answered"], j["failed"]) for j in lines] == [("mini", 5, 4, 1), ("big", 5, 3, 2)]
    assert sum(j["cost_usd"] for j in lines) == f.cost_usd
    # --disagreements counts the rows the status shows, the tie among those the judges disagree on
    dest = home.root / "disagree.csv"
    d = json.loads(run("report", panel.job_id, "--disagreements", str(dest), "--json").output)["disagreements"]
    assert d["panel_rows"] == seen["status"]["rows"] and d["judges_disagree"] >= 1
    rig.close()
    # the read model gone: status folds the log and shows the same figures
    conn = sqlite3.connect(home.db)
    with conn:
        conn.execute("DROP TABLE job_status")
    conn.close()
    again = json.loads(run("status", "--json").output)
    row = next(r for r in again if r["job_id"] == panel.job_id)
    assert row["source"] == "log"
    assert {k: row[k] for k in ("rows", "succeeded", "failed", "prompt_tokens", "output_tokens", "cost_usd", "model")} == {
        k: seen["status"][k] for k in ("rows", "succeeded", "failed", "prompt_tokens", "output_tokens", "cost_usd", "model")
    }


def _run_solo(rig: Rig, texts: list[str], refused: set[int]) -> JobState:
    rig.provider.row_errors = Refused(refused)
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all()
        jobs = list(rig.engine.ctx.state.jobs.values())
        if jobs and jobs[0].ended:
            return jobs[0]
    raise AssertionError("the job did not end")


def test_a_refused_sample_leaves_its_row_answered_by_the_others_in_every_reader(home: Home) -> None:
    rig = Rig(home, "samples: 3\nmax_row_retries: 0\n")
    rig.provider.answer = lambda cid, body: "yes"
    job = _run_solo(rig, ["essay a", "essay b", "essay c"], refused={2})  # row 2's first sample
    f = figures_of(rig.engine.ctx.state, job)
    seen = _readers(home, job)
    figures = _figures_by_reader(seen, f)
    assert {k: len(set(v)) for k, v in figures.items()} == {k: 1 for k in figures}, figures
    assert (f.rows, f.answered, f.failed) == (3, 3, 0)  # the row's vote has its two other samples
    assert (f.requests, f.requests_answered, f.requests_failed) == (9, 8, 1)
    rig.close()


def test_samples_that_tie_fail_their_row_in_status_as_in_the_result(home: Home) -> None:
    rig = Rig(home, "samples: 2\nmax_row_retries: 0\n")
    rig.provider.answer = lambda cid, body: "yes" if cid.endswith("-s2") else "no"  # every row: 1 against 1
    job = _run_solo(rig, ["essay a", "essay b"], refused=set())
    seen = _readers(home, job)
    assert sum(1 for r in seen["result"] if r["error"].startswith("no_majority")) == 2
    assert (seen["status"]["failed"], seen["report"]["rows"]["failed"], figures_of(rig.engine.ctx.state, job).failed) == (2, 2, 2)
    rig.close()


def test_a_panel_before_its_judges_are_prepared_has_no_estimate_and_sums_what_they_billed() -> None:
    a = Billed(
        sent=3,
        prompt_tokens=30,
        completion_tokens=6,
        cost_usd=0.25,
        estimate={"input": 1, "max_output": 2, "max_total": 3},
        models=("m1",),
    )
    b = Billed(sent=2, prompt_tokens=20, completion_tokens=4, cost_usd=0.5, models=("m2", "m1"))
    both = total([a, b])
    assert (both.sent, both.prompt_tokens, both.completion_tokens, both.cost_usd) == (5, 50, 10, 0.75)
    assert both.models == ("m1", "m2") and both.estimate is None  # one judge unpriced: no panel estimate
    assert add_estimates([a.estimate, {"input": 1, "max_output": 1, "max_total": 2}]) == {
        "input": 2,
        "max_output": 3,
        "max_total": 5,
    }
    assert total([]) == Billed()


def test_a_panel_not_started_shows_its_own_rows_and_nothing_billed() -> None:
    panel = JobState(job_id="p", panel=[{"profile": "mini", "job_id": "p-j1"}], rows=0)
    f = job_figures(panel, [None])
    assert (f.rows, f.answered, f.failed, f.cost_usd, f.models, f.judges) == (0, 0, 0, 0.0, (), ())
