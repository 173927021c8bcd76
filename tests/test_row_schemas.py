"""Each request with its own response schema (``schema_column``): an imported eval's label and
score criteria in one batch job, each request carrying its criterion's schema, so structured
output rules out the other kind; every answer checked against its own request's schema; each
schema's tokens counted per request as the provider bills them.  Through the emulator (the
official SDK over HTTP) and through ``tick(now)`` with the in-memory provider."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.configuration.config_values import _response_format
from batchgrader.daemon.engine import Engine
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.evals import importer, results
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.pipeline.requests import schema_allowance
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors
from ticks import Rig

pytestmark = pytest.mark.timeout(180)

FIX = Path(__file__).parent / "fixtures" / "evals"
KEY = "sk-row-schema-test-0123456789abcdef"
LABEL = {"type": "string", "enum": ["polite", "neutral", "rude"]}
SCORE = {"type": "number", "minimum": 1.0, "maximum": 7.0}


def result_schema(body) -> dict:
    return body["response_format"]["json_schema"]["schema"]["properties"]["result"]


@pytest.fixture
def emu():
    clock = ManualClock()
    e = Emulator(EmulatorConfig(api_key=KEY, clock=clock, validating_s=0.2, in_progress_s=1.0, finalizing_s=0.2)).start()
    yield e, clock
    e.stop()


def test_an_eval_job_through_the_emulator_sends_each_criterion_its_schema_and_counts_them(home, emu):
    e, clock = emu
    home.config_file.write_text(
        "poll_interval_seconds: 0.05\nstable_seconds: 0.05\nrescan_interval_seconds: 0.2\ndelete_provider_files: false\n"
        "preflight_rows: 0\n"
    )
    prepared = importer.prepare_import(home, FIX / "ticket_eval.json", data_path=FIX / "ticket_items.jsonl", name="t")
    (job,) = prepared.jobs
    importer.install(home, prepared, lambda: load_config(home, environ={}))
    config, table = load_checked(load_config(home, environ={}))
    store = EventStore(home.db, projectors=projectors())
    engine = Engine(home, config, store, OpenAIProvider(api_key=KEY, base_url=e.base_url, timeout=10), table)
    try:
        for _ in range(3000):
            engine.tick(clock.advance(0.05))
            if (home.outbox / "t_run.json").exists():
                break
        rep = results.finish(home, "t", now=1_762_400_000)
        (prepared_event,) = [ev.payload for ev in store.read() if ev.type == "JobPrepared"]
    finally:
        store.close()
    (batch,) = e.batches()
    sent = [json.loads(x) for x in e.file_bytes(batch["input_file_id"]).splitlines() if x.strip()]
    # one job, one request per item and criterion, each with its criterion's schema
    assert sorted(x["custom_id"] for x in sent) == sorted(f"i{i}-c{c}" for i in range(4) for c in (3, 4))
    assert {x["custom_id"]: result_schema(x["body"]) for x in sent} == {
        f"i{i}-c{c}": LABEL if c == 3 else SCORE for i in range(4) for c in (3, 4)
    }
    # the emulator answers each line by its own schema: no kind mismatch, every model criterion judged
    by_name = {c["name"]: c for c in rep["criteria"]}
    for name in ("Polite", "Helpful"):
        assert by_name[name]["errors"] == {} and by_name[name]["passed"] + by_name[name]["failed"] == 4
    out = [json.loads(x) for x in e.file_bytes(batch["output_file_id"]).splitlines() if x.strip()]
    billed = sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in out)
    # the estimate counts each request's own schema as the provider bills it: exactly the bill
    own = {r["criterion"]: _response_format(r["schema"]) for r in job.rows}
    allowance = {name: schema_allowance(rf, "o200k_base") for name, rf in own.items()}
    assert allowance["Polite"] != allowance["Helpful"]
    assert prepared_event["input_tokens"] + 4 * (allowance["Polite"] + allowance["Helpful"]) == billed
    price = load_pricing().get(job.model)
    assert prepared_event["estimate_usd"]["input"] == pytest.approx(billed * price.input_per_1m / 1e6, rel=1e-9)
    (usage,) = json.loads((home.outbox / "t_run.json").read_text())["per_model_usage"]
    assert usage["prompt_tokens"] == billed and usage["invocation_count"] == 8


# --- through tick(now), the in-memory provider ---------------------------------------------------------

ROW_SCHEMA_CONFIG = """\
id_column: id
schema_column: schema
response_format:
  type: object
  properties:
    result: {anyOf: [{type: string, enum: [yes, no]}, {type: number, minimum: 0, maximum: 10}]}
  required: [result]
  additionalProperties: false
"""
YES_NO = json.dumps(
    {
        "type": "object",
        "properties": {"result": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["result"],
        "additionalProperties": False,
    }
)
NUMBER = json.dumps(
    {
        "type": "object",
        "properties": {"result": {"type": "number", "minimum": 0, "maximum": 10}},
        "required": ["result"],
        "additionalProperties": False,
    }
)


def drop_rows(rig: Rig, rows: list[tuple[str, str, str]], name: str = "a.csv") -> None:
    with open(rig.home.inbox / name, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "response", "schema"])
        w.writerows(rows)


def run(rig: Rig, name: str = "a.csv"):
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all()
        jobs = [j for j in rig.engine.ctx.state.jobs.values() if j.file == name]
        if jobs and jobs[-1].ended:
            return jobs[-1]
    raise AssertionError(f"{name} did not end")


def test_each_answer_is_checked_against_its_own_request_schema(home):
    rig = Rig(home, ROW_SCHEMA_CONFIG)
    try:
        # a label where a number is asked, and a number where a label is: each outside its own schema,
        # though both fit the job's response_format
        rig.provider.answer = lambda cid, body: json.dumps({"result": {"a": "yes", "b": "yes", "c": 3, "d": 7}[cid]})
        drop_rows(rig, [("a", "same text", YES_NO), ("b", "same text", NUMBER), ("c", "other", YES_NO), ("d", "more", "")])
        job = run(rig)
        bodies = {cid: b for _j, cid, b in rig.provider.billed}
        # the same text under two schemas is two requests (never one answer reused for the other)
        assert sorted(bodies) == ["a", "b", "c", "d"]
        assert result_schema(bodies["a"]) == {"type": "string", "enum": ["yes", "no"]}
        assert result_schema(bodies["b"]) == {"type": "number", "minimum": 0, "maximum": 10}
        assert "anyOf" in result_schema(bodies["d"])  # an empty cell: the profile's response_format
        failed = [r for e in rig.events("RowsFailed") for r in e["rows"]]
        assert {r["custom_id"] for r in failed} == {"b", "c"} and {r["code"] for r in failed} == {"invalid_output"}
        assert all("under its request's JSON schema" in r["message"] for r in failed)
        assert job.ended == "completed_with_errors"
        errors = {r["id"]: r["error"] for r in rig.result_rows()}
        assert (
            errors["a"] == errors["d"] == ""
            and errors["b"].startswith("invalid_output")
            and errors["c"].startswith("invalid_output")
        )
        # a mix of schemas teaches no one schema's overhead
        assert rig.events("SchemaOverheadLearned") == []
    finally:
        rig.close()


@pytest.mark.parametrize(
    ("cell", "says"),
    [
        ("{not json", "schema column 'schema' in row 1: expected a JSON schema object"),
        (json.dumps({"type": "object", "properties": {"x": {"type": "string"}}}), "strict mode"),
        (
            json.dumps(
                {
                    "type": "object",
                    "properties": {"other": {"type": "string"}},
                    "required": ["other"],
                    "additionalProperties": False,
                }
            ),
            "are not the response_format's ['result']",
        ),
    ],
)
def test_a_bad_schema_cell_fails_the_job_before_anything_is_sent(home, cell, says):
    rig = Rig(home, ROW_SCHEMA_CONFIG)
    try:
        drop_rows(rig, [("a", "text", cell)])
        job = run(rig)
        assert job.ended == "failed" and rig.provider.billed == [] and rig.calls("upload") == 0
        (failed,) = rig.events("JobFailed")
        assert failed["code"] == "bad_input" and says in str(failed), failed
    finally:
        rig.close()


def test_schema_column_without_a_response_format_is_refused(home):
    home.config_file.write_text("schema_column: schema\n")
    with pytest.raises(ConfigError) as exc:
        load_config(home, environ={})
    assert "key 'schema_column' needs a 'response_format' JSON schema" in str(exc.value)


def test_count_adds_each_request_schema_tokens_with_samples(home, tmp_path):
    from batchgrader.core.configuration.config_values import _response_format as rf_of
    from batchgrader.pipeline.prepare import prepare

    home.config_file.write_text(ROW_SCHEMA_CONFIG + "samples: 3\n")
    profile = load_config(home, environ={}).default
    data = tmp_path / "a.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([("id", "response", "schema"), ("a", "x", YES_NO), ("b", "y", NUMBER), ("c", "z", NUMBER)])
    prep = prepare(data, profile, home)
    summary = prep.summary(load_pricing(), schema_overhead=99.0)  # a lesson of one schema: not used here
    yes_no, number = (schema_allowance(rf_of(s), "o200k_base") for s in (YES_NO, NUMBER))
    rows = {r["allowance_tokens"]: r["requests"] for r in summary["schema"]["row_schemas"]}
    assert rows == {yes_no: 3, number: 6} and summary["requests"] == 9
    assert summary["input_tokens_estimate"] == summary["input_tokens"] + 3 * yes_no + 6 * number
    assert summary["schema"]["source"] == "allowance"


@pytest.mark.parametrize("provider", ["anthropic", "gemini"])
def test_each_line_keeps_its_own_schema_on_the_providers_that_take_one(home, tmp_path, provider):
    """Anthropic's and Gemini's batch lines are independent requests: each converted line
    carries the schema of its own row (``output_config.format``, ``responseJsonSchema``)."""
    from batchgrader.pipeline.prepare import prepare
    from batchgrader.provider.anthropic_api import to_anthropic_request
    from batchgrader.provider.gemini_api import to_gemini_line

    model = {"anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}[provider]
    home.config_file.write_text(f"provider: {provider}\nmodel: {model}\n" + ROW_SCHEMA_CONFIG)
    profile = load_config(home, environ={}).default
    data = tmp_path / "a.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows([("id", "response", "schema"), ("a", "x", YES_NO), ("b", "y", NUMBER)])
    out = tmp_path / "requests.jsonl"
    with open(out, "wb") as f:
        prepare(data, profile, home, requests_out=f)
    lines = [json.loads(x) for x in out.read_bytes().splitlines()]
    if provider == "anthropic":
        got = [to_anthropic_request(x)["params"]["output_config"]["format"]["schema"] for x in lines]
    else:
        got = [to_gemini_line(x)["request"]["generationConfig"]["responseJsonSchema"] for x in lines]
    assert [g["properties"]["result"] for g in got] == [
        json.loads(YES_NO)["properties"]["result"],
        json.loads(NUMBER)["properties"]["result"],
    ]
