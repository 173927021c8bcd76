"""A judge panel (``judges: [profile, ...]``), tick by tick with the in-memory provider: the panel
job starts one job per judge on its input, their batches run side by side, and when both have
ended the panel writes one result (a column per judge, the consensus, the share that agrees)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from batchgrader.cli.render_status import rows_cell
from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.panel import judge_job_id
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.store.eventstore import NewEvent
from batchgrader.store.readmodels import job_row
from ticks import Rig, config_text

SCHEMA = (
    "response_format:\n  type: object\n  properties:\n    reason: {type: string}\n"
    "    score: {type: integer}\n  required: [reason, score]\n  additionalProperties: false\n"
)
PANEL = SCHEMA + (
    "max_row_retries: 0\n"
    "profiles:\n"
    "  panel:\n    judges: [mini, big]\n"
    "  mini:\n    model: gpt-5.4-mini\n"
    "  big:\n    model: gpt-4.1-nano\n"
)
# the scores each judge gives the 5 rows (a string: the answer as it is, not JSON)
SCORES: dict[str, list[object]] = {"gpt-5.4-mini": [4, 2, 5, 1, 3], "gpt-4.1-nano": [4, 3, 5, 1, "not json"]}


def _answers(rig: Rig, scores: dict[str, list[object]]) -> None:
    def answer(cid: str, body) -> str:
        row = int(re.sub(r"-s[0-9]+$", "", cid).rsplit("-", 1)[1]) - 1  # a sample answers as its row
        s = scores[body["model"]][row]
        return s if isinstance(s, str) else json.dumps({"reason": f"{body['model']} on {cid}", "score": s})

    rig.provider.answer = answer


def _drop(rig: Rig, rows: int = 5, labels: list[int] | None = None) -> None:
    folder = rig.home.inbox / "panel"
    folder.mkdir(exist_ok=True)
    if labels is None:
        (folder / "a.csv").write_text("id,response\n" + "".join(f"{i},essay {i}\n" for i in range(rows)))
    else:
        (folder / "a.csv").write_text("id,response,label\n" + "".join(f"{i},essay {i},{x}\n" for i, x in enumerate(labels)))


def _panel(rig: Rig) -> JobState:
    (job,) = [j for j in rig.engine.ctx.state.jobs.values() if j.profile == "panel"]
    return job


def _run(rig: Rig, before_finish=None) -> JobState:
    for _ in range(40):
        rig.tick()
        if before_finish is not None:
            before_finish(rig)
        rig.provider.finish_all()
        jobs = [j for j in rig.engine.ctx.state.jobs.values() if j.profile == "panel"]
        if jobs and jobs[0].ended:
            return jobs[0]
    raise AssertionError("the panel did not end")


def _result(rig: Rig) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO((rig.home.outbox / "a_results.csv").read_text(encoding="utf-8"))))


def test_two_judges_answer_every_row_and_the_panel_writes_their_consensus(home):
    rig = Rig(home, PANEL)
    _answers(rig, SCORES)
    _drop(rig)
    rig.tick()
    types = rig.tick()
    assert types[:4] == ["JobAccepted", "PanelStarted", "JobAccepted", "JobAccepted"]
    panel = _panel(rig)
    (started,) = rig.events("PanelStarted")
    assert started["settings"]["output_column"] == "grade"
    assert started["judges"] == [
        {"profile": "mini", "job_id": judge_job_id(panel.job_id, 1)},
        {"profile": "big", "job_id": judge_job_id(panel.job_id, 2)},
    ]
    judges = [rig.engine.ctx.state.jobs[j["job_id"]] for j in started["judges"]]
    assert [(j.profile, j.panel_of, j.input_path) for j in judges] == [
        ("mini", panel.job_id, panel.input_path),
        ("big", panel.job_id, panel.input_path),
    ]
    assert panel.state == "running"
    job = _run(rig)
    judges = [rig.engine.ctx.state.jobs[j["job_id"]] for j in started["judges"]]
    assert [j.ended for j in judges] == ["completed", "completed_with_errors"]  # big's last answer is no JSON
    assert {b.metadata["bg_job"] for b in rig.provider.batches.values()} == {j.job_id for j in judges}  # side by side
    assert all(j.result_path and f"/work/{panel.job_id}/judges/" in j.result_path for j in judges)  # not the outbox
    assert all(not j.archived_path for j in judges)
    assert sorted(p.name for p in rig.home.outbox.iterdir()) == ["a_results.csv"]  # the panel's alone
    out = _result(rig)
    kept = ["reason", "score", "input_tokens", "output_tokens", "error", "answered_by"]
    assert list(out[0]) == [
        *["id", "response", "grade_mini", "grade_big", "grade", "grade_agreement", "error"],
        *[f"{c}_mini" for c in kept],
        *[f"{c}_big" for c in kept],
    ]
    # every field of each judge's schema, its tokens and its error, per judge (issue 32)
    assert [r["reason_mini"] for r in out][0].startswith("gpt-5.4-mini on ") and out[4]["reason_big"] == ""
    assert [r["score_big"] for r in out] == ["4", "3", "5", "1", ""] and out[4]["error_big"] != ""
    judges_rows = {
        j: list(
            csv.DictReader(
                io.StringIO(Path(rig.engine.ctx.state.jobs[judge_job_id(panel.job_id, i)].result_path or "").read_text())
            )
        )
        for i, j in ((1, "mini"), (2, "big"))
    }
    for j, rows in judges_rows.items():
        assert [r[f"input_tokens_{j}"] for r in out] == [r["input_tokens"] for r in rows]
        assert [r[f"output_tokens_{j}"] for r in out] == [r["output_tokens"] for r in rows]
    assert [r["grade_mini"] for r in out] == ["4", "2", "5", "1", "3"]
    assert [r["grade_big"] for r in out] == ["4", "3", "5", "1", ""]
    assert [r["grade"] for r in out] == ["4", "", "5", "1", "3"]  # 2 against 3: a tie, no pick
    assert [r["grade_agreement"] for r in out] == ["1", "", "1", "1", "0.5"]
    assert out[1]["error"] == "no_majority: the judges tie (mini=2, big=3); no answer is picked"
    # a tie leaves the row without an answer: failed, as a tie among samples fails closed
    assert job.ended == "completed_with_errors" and job.result_counts == (4, 1)
    assert rows_cell(job_row(job)) == "4 ok/5\n1 failed" and job_row(job)["failed"] == 1  # bgctl status
    assert job.archived_path and "archive" in job.archived_path  # the panel archives the input, once
    assert job.cost_usd == 0 and sum(j.cost_usd for j in judges) > 0  # the judges carry the cost, once
    rig.close()


def test_a_failed_judge_is_shown_and_the_other_judge_still_answers(home):
    rig = Rig(home, PANEL)
    _answers(rig, {"gpt-5.4-mini": [4, 2, 5, 1, 3], "gpt-4.1-nano": [4, 3, 5, 1, 3]})
    _drop(rig)

    def fail_big(rig: Rig) -> None:
        for b in rig.provider.open_batches():
            if b.metadata.get("bg_job", "").endswith("-j2"):
                rig.provider.finish(b.id, "failed")

    job = _run(rig, fail_big)
    big = rig.engine.ctx.state.jobs[judge_job_id(job.job_id, 2)]
    assert big.ended == "failed" and big.error and big.error["code"] == "all_rows_failed"
    assert big.error_path and f"/work/{job.job_id}/judges/" in big.error_path  # its report stays with the panel
    out = _result(rig)
    assert [r["grade_big"] for r in out] == [""] * 5
    assert [r["grade"] for r in out] == ["4", "2", "5", "1", "3"]  # one judge left: its answers, half the panel
    assert {r["grade_agreement"] for r in out} == {"0.5"}
    assert job.ended == "completed_with_errors"
    rig.close()


def test_every_judge_failed_fails_the_panel(home):
    rig = Rig(home, PANEL)
    _answers(rig, SCORES)
    _drop(rig)
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all("failed")
        panel = _panel(rig) if any(j.profile == "panel" for j in rig.engine.ctx.state.jobs.values()) else None
        if panel is not None and panel.ended:
            break
    panel = _panel(rig)
    assert panel.ended == "failed" and panel.error and panel.error["code"] == "all_judges_failed"
    assert panel.error_path and (rig.home.outbox / "a_error.txt").exists()
    assert panel.archived_path and "failed" in panel.archived_path
    rig.close()


@pytest.mark.parametrize("recorded", [0, 1, 2], ids=["accepted", "panel-started", "one-judge-accepted"])
def test_a_crash_between_the_panel_and_its_judges_accepts_each_judge_once(home, recorded):
    rig = Rig(home, PANEL)
    _answers(rig, SCORES)
    _drop(rig)
    rig.tick()  # the first look
    rig.now += 1
    rig.engine.steps.intake.intake(rig.now)  # the panel job accepted; the daemon dies before its next step ...
    (panel_id,) = rig.engine.ctx.state.jobs
    judges = [{"profile": "mini", "job_id": judge_job_id(panel_id, 1)}, {"profile": "big", "job_id": judge_job_id(panel_id, 2)}]
    if recorded >= 1:  # ... or after recording the panel (the events as the step writes them)
        settings = {"output_column": "grade", "csv_formula_guard": True, "encoding": "utf-8"}
        rig.engine.ctx.emit(panel_id, NewEvent("PanelStarted", {"judges": judges, "settings": settings}))
    if recorded >= 2:  # ... or after accepting its first judge's job too
        panel = rig.engine.ctx.state.jobs[panel_id]
        rig.home.job_dir(judge_job_id(panel_id, 1)).mkdir()
        accepted = {
            "file": panel.file,
            "source": panel.source,
            "profile": "mini",
            "sha256": panel.sha256,
            "bytes": panel.bytes,
            "input_path": panel.input_path,
            "result_name": panel.result_name,
            "sandbox": False,
            "panel_of": panel_id,
        }
        rig.engine.ctx.emit(judge_job_id(panel_id, 1), NewEvent("JobAccepted", accepted))
    # a new engine over the same event store: it carries on, accepting the missing judges only
    rig.engine = Engine(rig.home, load_config(rig.home, environ={}), rig.store, rig.provider, load_pricing())
    job = _run(rig)
    accepted_ids = [e.job_id for e in rig.store.read() if e.type == "JobAccepted"]
    assert sorted(accepted_ids) == sorted([panel_id, judge_job_id(panel_id, 1), judge_job_id(panel_id, 2)])
    assert [e["judges"] for e in rig.events("PanelStarted")] == [judges]
    assert job.ended == "completed_with_errors" and [r["grade"] for r in _result(rig)] == ["4", "", "5", "1", "3"]
    rig.close()


def test_a_cancelled_panel_cancels_its_judges(home):
    rig = Rig(home, PANEL)
    _answers(rig, SCORES)
    _drop(rig)
    for _ in range(3):
        rig.tick()
    panel = _panel(rig)
    rig.engine.ctx.emit(panel.job_id, NewEvent("CancelRequested", {"reason": "test"}))
    job = _run(rig)
    assert job.ended == "cancelled"
    assert all(rig.engine.ctx.state.jobs[j["job_id"]].cancel_requested for j in job.panel or ())
    rig.close()


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        ("  panel:\n    judges: [mini, nobody]\n  mini: {}\n", "key 'judges' names 'nobody', which is not a profile"),
        (
            "  panel:\n    judges: [mini, inner]\n  mini: {}\n  inner:\n    judges: [mini, mini2]\n  mini2: {}\n",
            "names 'inner', which is itself a panel",
        ),
        ("  panel:\n    judges: [mini]\n  mini: {}\n", "a list of at least two profile names"),
    ],
)
def test_a_judge_that_is_no_single_profile_is_a_config_error_naming_it(home, profiles, message):
    home.config_file.write_text(config_text("profiles:\n" + profiles))
    with pytest.raises(ConfigError, match="profiles.panel") as err:
        load_config(home, environ={})
    assert message in str(err.value)


def test_judges_in_the_default_settings_are_refused(home):
    home.config_file.write_text(config_text("judges: [a, b]\nprofiles:\n  a: {}\n  b: {}\n"))
    with pytest.raises(ConfigError, match="'judges' cannot be set in the default settings"):
        load_config(home, environ={})


def _alpha(units: list[list[float | None]], metric) -> float:
    """Krippendorff's alpha from its definition (pairable values, observed and expected disagreement)."""
    units = [[v for v in u if v is not None] for u in units]
    units = [u for u in units if len(u) >= 2]
    values = [v for u in units for v in u]
    n = len(values)
    observed = (
        sum(sum(metric(a, b) for i, a in enumerate(u) for j, b in enumerate(u) if i != j) / (len(u) - 1) for u in units) / n
    )
    expected = sum(metric(a, b) for i, a in enumerate(values) for j, b in enumerate(values) if i != j) / (n * (n - 1))
    return 1 - observed / expected


def test_the_report_holds_the_agreement_among_the_judges_and_each_judges_with_the_labels(home, tmp_path):
    from batchgrader.reports.disagreements import write_disagreements
    from batchgrader.reports.report import build_report
    from batchgrader.reports.report_text import render_text

    rig = Rig(
        home,
        PANEL.replace(
            "    judges: [mini, big]\n", "    judges: [mini, big]\n    reference_column: label\n    reference_field: score\n"
        ),
    )
    _answers(rig, SCORES)
    labels = [4, 2, 5, 2, 3]
    _drop(rig, labels=labels)
    job = _run(rig)
    report = build_report(list(rig.store.read(job_id=job.job_id)))
    a = report["agreement"]
    mini, big = [4, 2, 5, 1, 3], [4, 3, 5, 1, None]
    expected = _alpha([[x, y] for x, y in zip(mini, big, strict=True)], lambda p, q: (p - q) ** 2)
    assert a["krippendorff_alpha"] == pytest.approx(expected) and a["panel"]["krippendorff_alpha"] == a["krippendorff_alpha"]
    # Cohen's kappa of mini and big over the 4 rows both answered: p_o = 3/4, p_e = 3 x (1/4 x 1/4)
    p_o, p_e = 3 / 4, 3 / 16
    assert a["panel"]["pairwise_kappa"]["mini"]["big"] == pytest.approx((p_o - p_e) / (1 - p_e))
    assert a["per_judge"] == a["panel"]["per_judge"]
    assert a["per_judge"]["mini"]["n"] == 5 and a["per_judge"]["mini"]["accuracy"] == pytest.approx(4 / 5)
    assert a["per_judge"]["big"]["n"] == 4 and a["per_judge"]["big"]["accuracy"] == pytest.approx(2 / 4)
    assert a["per_judge"]["big"]["mae"] == pytest.approx((0 + 1 + 0 + 1) / 4)
    # the consensus against the labels: 4, -, 5, 1, 3 against 4, 2, 5, 2, 3
    assert a["n"] == 4 and a["accuracy"] == pytest.approx(3 / 4) and a["labelled"] == 5 and a["unanswered"] == 1
    assert report["rows"]["answered"] == 4 and report["rows"]["failed"] == 1
    assert report["rows"]["failed_by_code"] == {"no_majority": 1}  # the tie: no answer is picked
    assert (report["rows"]["consensus"], report["rows"]["no_consensus"]) == (4, 1)
    text = render_text(report)
    assert "agreement among the 2 judges (5 rows)" in text and "Cohen kappa mini / big" in text
    assert "mini against the labels (5 rows): accuracy 0.800" in text
    from batchgrader.reports.report_html import render_html

    page = render_html(report)
    assert "Agreement among the 2 judges" in page and "<th>mini / big</th>" in page and "Each judge against the labels" in page
    # the rows the judges disagree on (row 1: a tie) or whose consensus is not the label (row 3)
    got = write_disagreements(rig.home, job.job_id, tmp_path / "review.csv")
    assert (got["rows"], got["compared"], got["judges_disagree"]) == (2, 4, 1)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "review.csv").read_text(encoding="utf-8"))))
    assert [(r["id"], r["model_answer"], r["grade_mini"], r["grade_big"]) for r in rows] == [
        ("1", "", "2", "3"),
        ("3", "1", "1", "1"),
    ]
    rig.close()


def test_a_retried_panel_retries_the_judges_that_did_not_complete_and_writes_its_result_again(home):
    rig = Rig(home, PANEL)
    _answers(rig, SCORES)
    _drop(rig)
    job = _run(rig)
    mini, big = judge_job_id(job.job_id, 1), judge_job_id(job.job_id, 2)
    first = rig.engine.ctx.state.jobs[big].result_path
    _answers(rig, {**SCORES, "gpt-4.1-nano": [4, 3, 5, 1, 3]})  # big answers its last row as JSON now
    rig.engine.ctx.emit(job.job_id, NewEvent("RetryRequested", {"reason": "test"}))
    job = _run(rig)
    judge = rig.engine.ctx.state.jobs[big]
    assert judge.ended == "completed" and judge.result_path != first and not judge.archived_path
    assert [e.job_id for e in rig.store.read() if e.type == "RetryRequested"] == [job.job_id, big]  # mini completed
    assert rig.engine.ctx.state.jobs[mini].retry_seq is None
    assert job.ended == "completed_with_errors" and job.archived_path and job.result_counts == (4, 1)  # row 1 still ties
    rows = list(csv.DictReader(io.StringIO(Path(job.result_path or "").read_text(encoding="utf-8"))))
    assert [(r["grade_big"], r["grade"], r["grade_agreement"]) for r in rows][4] == ("3", "3", "1")
    assert sum(1 for e in rig.store.read(job_id=job.job_id) if e.type == "InputRestored") == 1
    rig.close()


def test_a_judge_with_samples_and_an_input_with_the_added_columns_names(home):
    rig = Rig(home, PANEL.replace("    model: gpt-5.4-mini\n", "    model: gpt-5.4-mini\n    samples: 2\n"))
    _answers(rig, SCORES)
    folder = rig.home.inbox / "panel"
    folder.mkdir()
    (folder / "a.csv").write_text("id,response,grade,error\n" + "".join(f"{i},essay {i},x,y\n" for i in range(5)))
    job = _run(rig)
    out = _result(rig)
    kept = ["reason", "score", "input_tokens", "output_tokens", "error", "answered_by"]
    assert list(out[0]) == [
        *["id", "response", "grade", "error", "grade_mini", "grade_big", "bg_grade", "grade_agreement", "bg_error"],
        *[f"{c}_mini" for c in kept],
        *["samples_mini", "sample_agreement_mini", "samples_valid_mini"],  # its samples too
        *[f"{c}_big" for c in kept],
    ]
    assert [json.loads(r["samples_mini"]) for r in out][:2] == [[4, 4], [2, 2]]
    assert [r["grade_mini"] for r in out] == ["4", "2", "5", "1", "3"]  # the vote of its 2 samples
    assert [r["bg_grade"] for r in out] == ["4", "", "5", "1", "3"] and out[1]["bg_error"].startswith("no_majority")
    assert [(r["grade"], r["error"]) for r in out] == [("x", "y")] * 5  # the input's cells as they were
    assert job.ended == "completed_with_errors"
    rig.close()


def test_samples_on_a_panel_apply_to_every_judge_unless_the_judges_own_profile_sets_them(home):
    """Issue 32: `samples: 3` beside `judges:` was recorded and priced, then dropped (1 request a row)."""
    config = PANEL.replace("    judges: [mini, big]\n", "    judges: [mini, big]\n    samples: 3\n")
    rig = Rig(home, config.replace("    model: gpt-4.1-nano\n", "    model: gpt-4.1-nano\n    samples: 2\n"))
    _answers(rig, SCORES)
    _drop(rig)
    job = _run(rig)
    mini, big = (rig.engine.ctx.state.jobs[judge_job_id(job.job_id, i)] for i in (1, 2))
    assert (mini.requests, mini.settings.get("samples")) == (15, 3)  # the panel's samples
    assert (big.requests, big.settings.get("samples")) == (10, 2)  # its own profile's
    batches = rig.provider.batches.values()
    sent = {j: sum(b.request_counts.total for b in batches if b.metadata["bg_job"] == j) for j in (mini.job_id, big.job_id)}
    assert sent == {mini.job_id: 15, big.job_id: 10}
    rig.close()


def test_count_of_a_panel_prices_each_judges_model_samples_and_output_bound_and_sums_them(home):
    """Issue 32: `count --profile PANEL` priced the default gpt-5.4-mini, which the panel never runs."""
    from batchgrader.core.configuration.config import load_config
    from batchgrader.ops.count import count_file, count_panel
    from batchgrader.pipeline.pricing import load_pricing
    from cli_fixtures import run

    config = PANEL.replace("    judges: [mini, big]\n", "    judges: [mini, big]\n    samples: 3\n")
    config = config.replace("    model: gpt-4.1-nano\n", "    model: gpt-4.1-nano\n    max_completion_tokens: 200\n")
    home.config_file.write_text(config_text(config))
    f = home.root / "rows.csv"
    f.write_text("id,response\n" + "".join(f"{i},essay {i}\n" for i in range(10)))
    cfg, prices = load_config(home, environ={}), load_pricing()
    got = count_panel(home, f, cfg, cfg.profile("panel"), prices, sandbox=False)
    assert got["models"] == ["gpt-5.4-mini", "gpt-4.1-nano"]
    assert [(j["judge"], j["model"], j["samples"], j["requests"]) for j in got["judges"]] == [
        ("mini", "gpt-5.4-mini", 3, 30),
        ("big", "gpt-4.1-nano", 3, 30),
    ]
    assert got["judges"][1]["estimated_cost_usd"]["output_bound"] == 200
    # each judge priced as a job of that profile with 3 samples would be
    from batchgrader.core.rules.panel import judge_profile

    alone = count_file(home, f, judge_profile(cfg.profile("big"), 3), prices, sandbox=False)
    assert got["judges"][1]["estimated_cost_usd"] == alone["estimated_cost_usd"]
    total = sum(j["estimated_cost_usd"]["max_total"] for j in got["judges"])
    assert got["estimated_cost_usd"]["max_total"] == pytest.approx(total) and got["requests"] == 60
    res = run("count", "--profile", "panel", str(f))
    assert res.exit_code == 0, res.output
    assert "gpt-5.4-mini" in res.output and "gpt-4.1-nano," in res.output and "panel (sum)" in res.output
    as_json = json.loads(run("count", "--profile", "panel", "--json", str(f)).output)
    assert as_json["estimated_cost_usd"]["max_total"] == pytest.approx(total)


def _ticks_until(rig: Rig, ready, limit: int = 40) -> None:
    for _ in range(limit):
        if ready(rig):
            return
        rig.tick()
    raise AssertionError("the moment to cancel at never came")


def _judges_of(rig: Rig) -> list[JobState]:
    return [j for j in rig.engine.ctx.state.jobs.values() if j.panel_of is not None]


_MOMENTS = {
    # the panel accepted, its judges not started yet
    "accepted": lambda rig: any(j.profile == "panel" for j in rig.engine.ctx.state.jobs.values()),
    # its judges accepted, not prepared (each has a preflight to send)
    "judges-accepted": lambda rig: len(_judges_of(rig)) == 2,
    # every judge's batch sent
    "running": lambda rig: len(_judges_of(rig)) == 2 and len(rig.provider.open_batches()) == 2,
    # one judge ended (completed), the other's batch still running
    "one-judge-ended": lambda rig: any(j.ended for j in _judges_of(rig)),
}


@pytest.mark.parametrize("moment", list(_MOMENTS))
def test_cancel_of_a_panel_takes_effect_on_the_panel_and_every_judge_and_nothing_is_sent_after_it(home, moment):
    """Issue 32 item 5: `bgctl cancel PANEL` at any moment ends the panel and every judge, and
    nothing is sent (no preflight, upload, batch or synchronous request) once it is recorded."""
    rig = Rig(home, PANEL.replace("max_row_retries: 0\n", "max_row_retries: 0\npreflight_rows: 1\n"))
    _answers(rig, SCORES)
    _drop(rig)

    def finish_mini(rig: Rig) -> None:
        for b in rig.provider.open_batches():
            if b.metadata.get("bg_job", "").endswith("-j1"):
                rig.provider.finish(b.id)

    if moment == "one-judge-ended":
        for _ in range(40):
            if _MOMENTS[moment](rig):
                break
            rig.tick()
            finish_mini(rig)
    else:
        _ticks_until(rig, _MOMENTS[moment])
    panel = _panel(rig)
    assert not panel.ended
    rig.engine.ctx.emit(panel.job_id, NewEvent("CancelRequested", {"reason": "bgctl cancel"}))
    before = len(rig.provider.calls)
    for _ in range(40):
        rig.tick()
        for b in rig.provider.open_batches():  # a batch asked to cancel ends cancelled
            if b.status == "cancelling":
                rig.provider.finish(b.id, "cancelled")
        if _panel(rig).ended:
            break
    job = _panel(rig)
    assert job.ended == "cancelled"
    judges = _judges_of(rig)
    ended_before = {"one-judge-ended": {judge_job_id(job.job_id, 1)}}.get(moment, set())
    assert all(j.ended == "cancelled" for j in judges if j.job_id not in ended_before), [(j.job_id, j.ended) for j in judges]
    assert all(j.ended for j in judges)
    sent = [op for op, _arg in rig.provider.calls[before:] if op in ("upload", "create_batch", "complete")]
    assert sent == [], sent
    rig.tick(3600)  # and nothing afterwards either
    assert [op for op, _arg in rig.provider.calls[before:] if op in ("upload", "create_batch", "complete")] == []
    rig.close()


def test_the_panels_status_report_costs_and_result_agree_on_rows_failures_tokens_and_cost(home, tmp_path):
    """Issue 32 item 3: status said 0 failed, report 1,431 failed (no_majority), cost $0 and model
    None, disagreements "1,842 of 534".  A row fails when it has no answer (no judge answered it,
    or they tie), as the result's error column says; the panel's tokens and cost are its judges'
    sums, wherever they are shown."""
    from batchgrader.store import queries
    from batchgrader.store.costs import costs
    from cli_fixtures import run

    config = PANEL.replace(
        "    judges: [mini, big]\n",
        "    judges: [mini, big]\n    samples: 3\n    reference_column: label\n    reference_field: score\n",
    )
    rig = Rig(home, config)
    # row 1: a tie (2 against 3); row 4: no judge answers (neither answer is JSON)
    _answers(rig, {"gpt-5.4-mini": [4, 2, 5, 1, "nope"], "gpt-4.1-nano": [4, 3, 5, 1, "not json"]})
    _drop(rig, labels=[4, 2, 5, 2, 3])
    job = _run(rig)
    rig.close()
    judges = [rig.engine.ctx.state.jobs[judge_job_id(job.job_id, i)] for i in (1, 2)]
    cost = sum(j.cost_usd for j in judges)
    prompt, completion = sum(j.prompt_tokens for j in judges), sum(j.completion_tokens for j in judges)
    assert cost > 0 and prompt > 0
    out = _result(rig)  # the result file
    assert [r["error"].split(":")[0] for r in out] == ["", "no_majority", "", "", "no_answer"]
    assert job.result_counts == (3, 2) and job.ended == "completed_with_errors"
    assert sum(1 for r in out if r["error"]) == 2  # the result file's failed rows
    for j in ("mini", "big"):  # its tokens per row add up to what its job was billed
        (judge,) = [x for x in judges if x.profile == j]
        assert sum(int(r[f"input_tokens_{j}"] or 0) for r in out) == judge.prompt_tokens
        assert sum(int(r[f"output_tokens_{j}"] or 0) for r in out) == judge.completion_tokens
        assert all(len(json.loads(r[f"samples_{j}"])) == 3 for r in out)
    # bgctl status (the list and the job) and its --json
    (listed,) = [r for r in queries.status(rig.home) if r["job_id"] == job.job_id]
    detail = queries.job_detail(rig.home, job.job_id)
    for shown in (listed, detail):
        assert (shown["succeeded"], shown["failed"]) == (3, 2)
        assert shown["cost_usd"] == pytest.approx(cost) and shown["prompt_tokens"] == prompt
        assert shown["output_tokens"] == completion and shown["model"] == "gpt-5.4-mini, gpt-4.1-nano"
    text = run("status", job.job_id).output
    assert "5 (3 answered, 2 failed)" in text and "gpt-5.4-mini, gpt-4.1-nano" in text
    from batchgrader.store.readmodels import rebuild

    rebuild(rig.home.db)  # and from the read model (`bgctl status`'s fast path), the list and the overview
    (listed,) = [r for r in queries.status(rig.home) if r["job_id"] == job.job_id]
    (overview,) = [r for r in queries.status_overview(rig.home)["jobs"] if r["job_id"] == job.job_id]
    for shown in (listed, overview):
        assert shown["source"] == "read_model" and (shown["succeeded"], shown["failed"]) == (3, 2)
        assert shown["cost_usd"] == pytest.approx(cost) and shown["prompt_tokens"] == prompt
    # bgctl report --json and its text
    rep = json.loads(run("report", job.job_id, "--json").output)
    assert (rep["rows"]["answered"], rep["rows"]["failed"], rep["rows"]["failed_by_code"]) == (
        3,
        2,
        {"no_majority": 1, "no_answer": 1},
    )
    assert (rep["rows"]["consensus"], rep["rows"]["no_consensus"]) == (3, 1)
    assert rep["cost_usd"]["billed"] == pytest.approx(cost, abs=1e-6) and rep["tokens"]["prompt"] == prompt
    assert rep["tokens"]["completion"] == completion and rep["job"]["model"] == "gpt-5.4-mini, gpt-4.1-nano"
    assert [j["job_id"] for j in rep["judges"]] == [j.job_id for j in judges]
    assert "3 answered with a consensus, 2 failed" in run("report", job.job_id).output
    # bgctl costs: the judges' jobs, whose sum is the panel's cost
    assert costs(rig.home, by="job")["totals"]["cost_usd"] == pytest.approx(cost)
    # the disagreements: X of N with X <= N
    res = run("report", job.job_id, "--disagreements", str(tmp_path / "review.csv"))
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert "the judges disagree on 1 of 5 rows; 1 of 3 labelled consensus answers differ from their label" in line
    for x, n in re.findall(r"([0-9,]+) of ([0-9,]+)", line):
        assert int(x.replace(",", "")) <= int(n.replace(",", ""))


def test_at_80_columns_the_judges_ids_keep_their_suffix(home):
    """Issue 32: at 80 columns both judges' ids were cut to the same `…-2-…`; a panel with big
    figures (6,000 requests, completed_with_errors) still shows `-j1` and `-j2`."""
    from rich.console import Console

    from batchgrader.cli.render_status import render_status

    def row(job_id: str, requests: int, failed: int, cost: float) -> dict:
        return {
            **{"job_id": job_id, "file": "essays_2000_rows.csv", "profile": "panel", "state": "completed_with_errors"},
            **{"sandbox": False, "rows": 2000, "requests": requests, "succeeded": requests - failed, "failed": failed},
            **{"chunks_done": 10, "chunks_total": 10, "cost_usd": cost, "input_tokens": 1_234_567, "output_tokens": 345_678},
            **{"age_seconds": 3600.0, "batches": [], "cached_rows": 0, "saved_usd": 0.0, "input_tokens_exact": True},
            **{"created_ts": "2026-01-01T00:00:00+00:00", "updated_ts": "2026-01-01T00:00:00+00:00"},
        }

    rows = [row("x-52fbb30faf37-2", 2000, 0, 10.63), row("x-52fbb30faf37-2-j1", 6000, 1431, 0.41)]
    rows.append(row("x-52fbb30faf37-2-j2", 6000, 1431, 1234.5))
    console = Console(width=80, record=True, no_color=True, force_terminal=False)
    render_status(rows, console, max_finished=None)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    firsts = [line.split()[0] for line in lines if "completed_with" in line]
    assert len(firsts) == 3 and firsts[1].endswith("-j1") and firsts[2].endswith("-j2"), text


def test_a_panel_whose_judges_cannot_read_the_input_fails_with_its_report_and_ends(home):
    """Issue 32 ("nothing loops without a bound"): every judge failed reading a malformed CSV;
    the panel read the input again to combine their results, raised, and retried every tick
    without end (`daemon --once` never exited).  It now fails with its error report alone."""
    rig = Rig(home, PANEL)
    folder = rig.home.inbox / "panel"
    folder.mkdir()
    (folder / "a.csv").write_text("id,response\n1,ok\n2,bad,extra\n")
    for _ in range(6):
        rig.tick()
    (panel,) = [j for j in rig.engine.ctx.state.jobs.values() if j.profile == "panel"]
    assert panel.ended == "failed" and panel.error and panel.error["code"] == "all_judges_failed"
    assert "expected 2 fields" in panel.error["error"]
    assert panel.error_path and "expected 2 fields" in Path(panel.error_path).read_text(encoding="utf-8")
    assert not panel.result_path and sorted(p.name for p in rig.home.outbox.iterdir()) == ["a_error.txt"]
    assert panel.archived_path and "failed" in panel.archived_path
    rig.close()
