"""Generate-then-grade and the results written without `bgctl evals results`: a ``completions``
run imported as it was exported, taken through the engine (in-memory provider, fake clock) with
the daemon's eval step run after each tick as the engine will run it; restarts between the two
jobs (a new engine over the same log) queue the grading once; and the pure decision on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.evals.run_retrieve_response import RunRetrieveResponse
from openai.types.evals.runs.output_item_retrieve_response import OutputItemRetrieveResponse

from batchgrader.core.configuration.config import load_config
from batchgrader.core.log.jobstate import JobState
from batchgrader.core.log.state import State
from batchgrader.core.rules import evalchain as ec
from batchgrader.daemon.steps.evals import EvalStep
from batchgrader.evals import importer
from batchgrader.evals import results as cli_results
from batchgrader.pipeline.evals import folder as evfolder
from batchgrader.pipeline.evals.spec import EvalInputError
from batchgrader.pipeline.pricing import load_pricing
from ticks import Rig

FIX = Path(__file__).parent / "fixtures" / "evals"
RUN = FIX / "ticket_gen_run.json"
# what the sampled model answers per item: (category, reply)
SAMPLED = [
    ("Hardware", "Sorry about the flicker. Please bring the laptop to the service desk so we can replace the display cable."),
    ("Hardware", "Please check the cable."),
    ("Hardware", "Yes. Request a second monitor in the hardware portal and it will arrive within a week."),
    ("Other", "Not my problem."),
]
POLITE = ["polite", "neutral", "polite", "rude"]
HELPFUL = [6, 2, 6, 4]


def answer(cid: str, body) -> str:
    if "-c" not in cid:  # the generation: i<item>
        category, reply = SAMPLED[int(cid[1:])]
        return json.dumps({"category": category, "reply": reply})
    item, crit = cid.split("-s")[0][1:].split("-c")
    return json.dumps({"result": POLITE[int(item)] if crit == "3" else HELPFUL[int(item)]})


def start(home, name: str = "sampled") -> tuple[Rig, EvalStep]:
    rig = Rig(home)
    prepared = importer.prepare_import(home, FIX / "ticket_eval.json", run_path=RUN, name=name)
    importer.install(home, prepared, lambda: load_config(home, environ={}))
    rig.engine.reload(load_config(home, environ={}), load_pricing())
    rig.provider.answer = answer
    return rig, rig.engine.steps.evals


def tick(rig: Rig, step: EvalStep) -> None:
    """One engine tick (the engine runs the eval step after the jobs' pass)."""
    rig.tick()
    rig.provider.finish_all()


def accepted(rig: Rig) -> list[str]:
    return [p["file"] for p in rig.events("JobAccepted")]


def folder(home, name: str = "sampled") -> Path:
    return evfolder.evals_root(home) / name


def run_to_results(rig: Rig, step: EvalStep, home, name: str = "sampled", ticks: int = 80) -> dict:
    for _ in range(ticks):
        tick(rig, step)
        if (folder(home, name) / evfolder.RESULTS_FILE).is_file():
            return json.loads((folder(home, name) / evfolder.RESULTS_FILE).read_text())
    raise AssertionError(f"no results after {ticks} ticks; accepted: {accepted(rig)}")


def test_a_completions_run_is_sampled_then_graded_and_its_results_written_by_the_step(home):
    rig, step = start(home)
    try:
        plan = json.loads((folder(home) / "plan.json").read_text())
        assert plan["generation"]["model"] == "gpt-5.4-mini" and plan["generation"]["rows"] == 4
        # before the generation ends, only its file is queued
        assert [p.name for p in home.inbox.rglob("*.jsonl")] == ["sampled-gen.jsonl"]
        written = run_to_results(rig, step, home)
        assert accepted(rig) == ["sampled-gen.jsonl", "sampled-j1.jsonl"]
        gen_body = next(b for _j, cid, b in rig.provider.billed if cid == "i0")
        assert gen_body["temperature"] == 0.2 and gen_body["response_format"]["type"] == "json_schema"
        assert "Ticket: My laptop screen flickers" in json.dumps(gen_body["messages"])
        run = json.loads(Path(written["paths"]["run"]).read_text())
        RunRetrieveResponse.model_validate(run)
        assert run["data_source"]["type"] == "completions" and run["model"] == "gpt-5.4-mini"
        assert run["result_counts"] == {"total": 4, "errored": 0, "failed": 2, "passed": 2}
        (usage,) = run["per_model_usage"]
        assert usage["invocation_count"] == 4 + 8  # 4 samples, 2 model criteria x 4 items
        items = [json.loads(line) for line in Path(written["paths"]["output_items"]).read_text().splitlines()]
        for it in items:
            OutputItemRetrieveResponse.model_validate(it)
        assert [it["status"] for it in items] == ["pass", "fail", "pass", "fail"]
        assert items[1]["sample"]["output"][0]["content"] == json.dumps({"category": "Hardware", "reply": SAMPLED[1][1]})
        assert items[0]["sample"]["usage"]["completion_tokens"] > 0
        # the step has nothing more to do: the results are not written again
        mtime = Path(written["paths"]["run"]).stat().st_mtime_ns
        for _ in range(3):
            tick(rig, step)
        assert Path(written["paths"]["run"]).stat().st_mtime_ns == mtime
        # `bgctl evals results` reads them (and `list` shows the run as one)
        assert cli_results.finish(home, "sampled")["result_counts"]["passed"] == 2
        (listed,) = cli_results.list_runs(home)
        assert listed["state"] == "done" and [j["stage"] for j in listed["run_jobs"]] == ["generation", "grading"]
    finally:
        rig.close()


def _until_generation_ended(rig: Rig, home) -> None:
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all()
        gen = [j for j in rig.engine.ctx.state.jobs.values() if j.file == "sampled-gen.jsonl"]
        if gen and gen[0].outbox == "done":
            return
    raise AssertionError("the generation did not end")


def restart(rig: Rig, home) -> tuple[Rig, EvalStep]:
    """The daemon killed and started again: a new engine over the same log and home."""
    rig.close()
    again = Rig.__new__(Rig)
    again.home = home
    from batchgrader.provider.memory import MemoryProvider
    from batchgrader.store.eventstore import EventStore

    again.store = EventStore(home.db)
    again.provider = MemoryProvider()
    again.provider.answer = answer
    again.now = rig.now
    again.provider.now = again.now
    from batchgrader.daemon.engine import Engine

    again.engine = Engine(home, load_config(home, environ={}), again.store, again.provider, load_pricing())
    again.engine.startup(again.now)
    return again, again.engine.steps.evals


def test_killed_between_the_two_jobs_the_grading_is_queued_once(home):
    rig, step = start(home)
    # the daemon dies in the tick the generation ends, after its result and before the eval step
    step.run = lambda now: False  # type: ignore[method-assign]
    _until_generation_ended(rig, home)
    assert not (folder(home) / evfolder.GRADING_FILE).exists()
    rig, step = restart(rig, home)
    try:
        run_to_results(rig, step, home)
        assert sorted(accepted(rig)) == ["sampled-gen.jsonl", "sampled-j1.jsonl"]
    finally:
        rig.close()


def test_killed_after_the_grading_was_recorded_its_files_are_copied_once(home):
    rig, step = start(home)
    run = step.run
    step.run = lambda now: False  # type: ignore[method-assign]  # the eval step's own tick comes below
    _until_generation_ended(rig, home)
    step.run = run  # type: ignore[method-assign]
    due = step.decide("sampled")
    assert isinstance(due, ec.QueueGrading)
    step.act(due, rig.now)
    record = json.loads((folder(home) / evfolder.GRADING_FILE).read_text())
    # the crash came after the record, before the copy into the inbox
    (only,) = record["jobs"]  # the eval's model criteria: one job
    Path(only["path"]).unlink()
    rig, step = restart(rig, home)
    try:
        due = step.decide("sampled")
        assert isinstance(due, ec.Requeue) and due.key == only["key"]
        run_to_results(rig, step, home)
        assert sorted(accepted(rig)) == ["sampled-gen.jsonl", "sampled-j1.jsonl"]
        assert json.loads((folder(home) / evfolder.GRADING_FILE).read_text()) == record  # never planned again
    finally:
        rig.close()


def test_a_generation_that_failed_gives_errored_items_and_no_grading(home):
    rig, step = start(home)
    try:
        rig.provider.answer = lambda cid, body: "not JSON"  # every sampled answer breaks the schema
        for _ in range(60):
            rig.tick()
            rig.provider.finish_all(status="failed")
            step.run(rig.now)
            if (folder(home) / evfolder.RESULTS_FILE).is_file():
                break
        written = json.loads((folder(home) / evfolder.RESULTS_FILE).read_text())
        assert accepted(rig) == ["sampled-gen.jsonl"]
        run = json.loads(Path(written["paths"]["run"]).read_text())
        assert run["status"] == "failed" and run["result_counts"]["errored"] == 4
        item = json.loads(Path(written["paths"]["output_items"]).read_text().splitlines()[0])
        assert item["status"] == "error" and item["results"][0]["sample"]["error"] == "sample_error"
    finally:
        rig.close()


def test_a_jsonl_eval_gets_its_results_when_its_jobs_end(home):
    rig = Rig(home)
    try:
        prepared = importer.prepare_import(home, FIX / "ticket_eval.json", data_path=FIX / "ticket_items.jsonl", name="t")
        importer.install(home, prepared, lambda: load_config(home, environ={}))
        rig.engine.reload(load_config(home, environ={}), load_pricing())
        rig.provider.answer = answer
        step = rig.engine.steps.evals
        written = run_to_results(rig, step, home, "t")
        assert json.loads(Path(written["paths"]["run"]).read_text())["result_counts"]["passed"] == 2
    finally:
        rig.close()


def test_generation_problems_are_named_before_anything_is_written(home, tmp_path):
    run = json.loads(RUN.read_text())
    run["data_source"]["input_messages"]["template"][1]["content"] = (
        "Ticket: {{item.ticket}} by {{item.user}} {{sample.output_text}}"
    )
    run["data_source"]["sampling_params"]["tools"] = [{"type": "function", "function": {"name": "lookup"}}]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(EvalInputError) as err:
        importer.prepare_import(home, FIX / "ticket_eval.json", run_path=path, name="bad")
    text = str(err.value)
    assert "sampling_params.tools" in text and "{{sample.output_text}}" in text
    run["data_source"]["input_messages"]["template"][1]["content"] = "Ticket: {{item.ticket}} by {{item.user}}"
    del run["data_source"]["sampling_params"]["tools"]
    path.write_text(json.dumps(run))
    with pytest.raises(EvalInputError, match=r"4 of 4 items cannot fill the messages.*item has no 'user'"):
        importer.prepare_import(home, FIX / "ticket_eval.json", run_path=path, name="bad")
    assert not evfolder.evals_root(home).exists() or not any(evfolder.evals_root(home).iterdir())


# --- the pure decision -----------------------------------------------------------------------------


def _job(job_id: str, source: str, **kw) -> JobState:
    j = JobState(job_id=job_id, source=source, profile="p")
    for k, v in kw.items():
        setattr(j, k, v)
    return j


GEN = ec.Stage("generation", 10, (ec.QueuedFile("gen", "/h/inbox/p/e-gen.jsonl"),))
GRADING = ec.Stage("grading", 20, (ec.QueuedFile("j1", "/h/inbox/q/e-j1.jsonl"),))


def test_decision_waits_then_queues_the_grading_once_then_results():
    rec = ec.EvalRecord("e", GEN, None, None)
    old = _job("old", "/h/inbox/p/e-gen.jsonl", ended="completed", outbox="done", result_path="/o/old.jsonl")
    running = _job("g", "/h/inbox/p/e-gen.jsonl")
    state = State(jobs={"old": old, "g": running})
    seqs = {"old": 3, "g": 11}  # "old" was taken from the same path before this import: never this run's
    assert ec.decide_eval(rec, state, seqs) is None
    running.ended, running.outbox, running.result_path = "completed", "done", "/o/g.jsonl"
    assert ec.decide_eval(rec, state, seqs) == ec.QueueGrading("e", "g")
    rec = ec.EvalRecord("e", GEN, GRADING, None)  # recorded: never queued again
    assert ec.decide_eval(rec, state, seqs, frozenset({"/h/inbox/q/e-j1.jsonl"})) is None  # in the inbox: waits
    assert ec.decide_eval(rec, state, seqs) == ec.Requeue("e", "j1", "/h/inbox/q/e-j1.jsonl")  # lost to a crash
    state.jobs["k"] = _job("k", "/h/inbox/q/e-j1.jsonl", ended="completed", outbox="done", result_path="/o/k.jsonl")
    due = ec.decide_eval(rec, state, {**seqs, "k": 21})
    assert isinstance(due, ec.WriteResults) and due.jobs == (("gen", "g"), ("j1", "k"))
    done = ec.EvalRecord("e", GEN, GRADING, due.fingerprint)
    assert ec.decide_eval(done, state, {**seqs, "k": 21}) is None
    assert ec.run_state(done, state, {**seqs, "k": 21}) == "done"
    state.jobs["k"].result_path = "/o/k_20261129.jsonl"  # `bgctl retry` rewrote the grading's result
    assert isinstance(ec.decide_eval(done, state, {**seqs, "k": 21}), ec.WriteResults)


def test_decision_a_failed_generation_goes_straight_to_results():
    rec = ec.EvalRecord("e", GEN, None, None)
    state = State(jobs={"g": _job("g", "/h/inbox/p/e-gen.jsonl", ended="failed", outbox="done")})
    due = ec.decide_eval(rec, state, {"g": 11})
    assert isinstance(due, ec.WriteResults) and due.jobs == (("gen", "g"),)
