"""Honest row outcomes (issue 22, deliverable 4): an answer cut off by the output bound, a
refusal or filter, structured output outside the schema and an unknown finish reason are failed
rows with their own codes, whatever the provider; never stored for reuse; not retried
automatically when a retry would fail the same way; `bgctl retry --max-completion-tokens`
raises the bound of the rows sent again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.decide import retry_ids
from batchgrader.pipeline.merge import MergeInputs, merge_chunk
from batchgrader.pipeline.outbox import AddedColumns, result_values
from batchgrader.pipeline.results import parse_line
from batchgrader.provider import anthropic_api, gemini_api
from ticks import Rig


def _openai(finish: str | None, content: str = "partial", refusal: str | None = None) -> dict[str, Any]:
    body = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content, "refusal": refusal}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 50, "completion_tokens_details": {"reasoning_tokens": 40}},
    }
    return {"custom_id": "r1", "response": {"status_code": 200, "body": body}, "error": None}


def _anthropic(stop: str) -> dict[str, Any]:
    msg = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5",
        "content": [{"type": "text", "text": "partial"}],
        "stop_reason": stop,
        "usage": {"input_tokens": 7, "output_tokens": 50},
    }
    return anthropic_api.to_openai_result_line({"custom_id": "r1", "result": {"type": "succeeded", "message": msg}})


def _gemini(finish: str) -> dict[str, Any]:
    resp = {
        "candidates": [{"content": {"parts": [{"text": "partial"}], "role": "model"}, "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 50},
    }
    return gemini_api.to_openai_result_line({"key": "r1", "response": resp})


CASES = [
    ("openai stop", _openai("stop"), None),
    ("openai length", _openai("length"), "truncated"),
    ("openai content_filter", _openai("content_filter"), "refused"),
    ("openai refusal field", _openai("stop", "", refusal="I can't help with that."), "refused"),
    ("openai tool_calls", _openai("tool_calls"), "unexpected_finish"),
    ("anthropic end_turn", _anthropic("end_turn"), None),
    ("anthropic max_tokens", _anthropic("max_tokens"), "truncated"),
    ("anthropic refusal", _anthropic("refusal"), "refused"),
    ("anthropic pause_turn", _anthropic("pause_turn"), "unexpected_finish"),
    ("gemini STOP", _gemini("STOP"), None),
    ("gemini MAX_TOKENS", _gemini("MAX_TOKENS"), "truncated"),
    *[(f"gemini {r}", _gemini(r), "refused") for r in ("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII")],
    *[(f"gemini {r}", _gemini(r), "unexpected_finish") for r in ("OTHER", "LANGUAGE", "MALFORMED_FUNCTION_CALL", "NEW_REASON")],
    (
        "gemini prompt blocked",
        gemini_api.to_openai_result_line({"key": "r1", "response": {"promptFeedback": {"blockReason": "SAFETY"}}}),
        "refused",
    ),
]


@pytest.mark.parametrize(("name", "line", "code"), CASES, ids=[c[0] for c in CASES])
def test_finish_reasons_become_row_outcomes(name, line, code):
    o = parse_line(line)
    if code is None:
        assert o.ok and o.error_code is None
        return
    assert not o.ok and o.error_code == code and o.error_message
    if code == "truncated":
        assert o.content == "partial"  # the partial text is kept
        assert "max_completion_tokens" in o.error_message and "--max-completion-tokens" in o.error_message
    if name.startswith("gemini") and code == "unexpected_finish":
        assert name.split()[1] in o.error_message  # the provider's own reason is named


SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "grade",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}, "reason": {"type": "string"}},
            "required": ["score", "reason"],
            "additionalProperties": False,
        },
    },
}


def _merge(tmp_path, lines: list[dict[str, Any]], schema: Any = None):
    out = tmp_path / "out.jsonl"
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    results = tmp_path / "results.jsonl"
    ids = tuple(x["custom_id"] for x in lines)
    outcome = merge_chunk(MergeInputs((("output", str(out)),), "completed", str(results), custom_ids=ids, schema=schema))
    return outcome.merged, [json.loads(x) for x in results.read_text().splitlines()]


def _answer(cid: str, content: str, finish: str = "stop") -> dict[str, Any]:
    line = _openai(finish, content)
    line["custom_id"] = cid
    return line


def test_structured_output_outside_the_schema_is_invalid_output(tmp_path):
    from batchgrader.pipeline.outputschema import schema_of

    lines = [
        _answer("good", '{"score": 4, "reason": "clear"}'),
        _answer("not_json", "Score: 4"),
        _answer("out_of_range", '{"score": 9, "reason": "x"}'),
        _answer("extra", '{"score": 3, "reason": "x", "note": 1}'),
        _answer("missing", '{"score": 3}'),
    ]
    merged, recs = _merge(tmp_path, lines, schema_of(SCHEMA))
    assert [r["ok"] for r in recs] == [True, False, False, False, False]
    assert {r["code"] for r in merged.failed_rows} == {"invalid_output"}
    assert recs[1]["content"] == "Score: 4"  # kept, shown in the answer column
    _, recs = _merge(tmp_path, lines)  # no schema in the profile: nothing to check
    assert all(r["ok"] for r in recs)


def test_a_failed_answer_is_billed_and_keeps_its_text_in_the_result(tmp_path):
    merged, recs = _merge(tmp_path, [_answer("a", "full answer"), _answer("b", "cut of", "length")])
    assert merged.failed_rows == [{"custom_id": "b", "code": "truncated", "message": recs[1]["error_message"]}]
    assert merged.usage["completion_tokens"] == 100  # both rows were billed
    cols = AddedColumns("grade", (), "input_tokens", "output_tokens", "error")
    cells = result_values(cols, recs[1], None, False)
    assert cells["grade"] == "cut of" and cells["error"].startswith("truncated: the answer was cut off")


def test_truncated_and_refused_rows_are_not_retried_automatically(home):
    profile = load_config(home, environ={}).profile("default")
    job = JobState("j")
    for cid, code in (("t", "truncated"), ("r", "refused"), ("i", "invalid_output"), ("u", "unexpected_finish")):
        job.failed_rows[cid] = {"code": code, "message": "m", "chunk": 0}
    assert sorted(retry_ids(job, profile)) == ["i", "u"]  # a retry may answer these; the others fail the same way
    job.retry_requested = True
    assert sorted(retry_ids(job, profile)) == ["i", "r", "t", "u"]  # `bgctl retry` sends them all


def test_bgctl_retry_leaves_rows_too_large_to_send_failed_unless_it_sets_a_new_bound(home):
    profile = load_config(home, environ={}).profile("default")
    job = JobState("j", retry_requested=True)
    job.failed_rows["big"] = {"code": "request_too_large", "message": "m", "chunk": 0}
    job.failed_rows["x"] = {"code": "batch_expired", "message": "m", "chunk": 0}
    assert retry_ids(job, profile) == ["x"]  # docs/guide.md: rows that can never be sent stay failed
    job.retry_bound = 200  # `bgctl retry --max-completion-tokens 200`: prompt + bound may now fit
    assert sorted(retry_ids(job, profile)) == ["big", "x"]


@pytest.fixture
def rig(home):
    r = Rig(home, "max_row_retries: 2\n")
    r.provider.finish_reason = lambda cid, body: "length" if body.get("max_completion_tokens", 0) < 500 else "stop"
    yield r
    r.close()


def test_truncated_rows_fail_are_not_stored_and_retry_raises_the_bound(rig):
    bounds: list[int] = []
    rig.provider.answer = lambda cid, body: bounds.append(body["max_completion_tokens"]) or f"SIMULATED answer for {cid}"
    job = rig.drop(2)
    rig.tick()
    rig.provider.finish_all()
    rig.tick()
    assert rig.job().ended == "failed" and rig.events("RowsFailed")[0]["rows"][0]["code"] == "truncated"
    assert not rig.events("RetryPlanned")  # not retried automatically: the same bound fails the same way
    assert not rig.events("AnswersToStore")  # nothing stored for reuse
    rows = rig.result_rows()
    assert all(r["error"].startswith("truncated:") and "SIMULATED" in r["grade"] for r in rows)
    from batchgrader.core.host.control_files import request_control
    from batchgrader.daemon.control import apply_control

    bad = {"action": "retry", "job_id": job.job_id, "reason": "r", "max_completion_tokens": 0}
    assert "not a positive integer" in (apply_control(rig.engine, bad) or "")
    path = request_control(rig.home, "retry", job.job_id, "raise the bound", max_completion_tokens=800)  # bgctl retry
    assert apply_control(rig.engine, json.loads(path.read_text())) is None
    assert rig.events("RetryRequested")[-1]["max_completion_tokens"] == 800  # a restarted daemon reads it here
    assert rig.engine.ctx.state.jobs[job.job_id].retry_bound == 800
    for _ in range(3):
        rig.tick()
    rig.provider.finish_all()
    for _ in range(3):
        rig.tick()
    assert bounds == [50, 50, 800, 800]  # the retry carried the raised bound
    assert rig.job().ended == "completed"
    newest = next(p for p in rig.home.outbox.glob("a_results*.csv") if p.name != "a_results.csv")
    assert all(r["error"] == "" for r in rig.result_rows(newest.name))


def test_a_rows_added_cells_come_in_the_order_the_result_file_writes_them():
    """A JSON or JSONL result keeps each row's keys in this order (answered_by first, as
    ``AddedColumns.written`` says): readers of the result, the report among them, rely on it."""
    cols = AddedColumns("grade", (("score", "score"),), "input_tokens", "output_tokens", "error")
    ok = {"ok": True, "content": '{"score": 3}', "status_code": 200, "prompt_tokens": 5, "completion_tokens": 2}
    failed = {"ok": False, "content": "cut", "status_code": 200, "error_code": "truncated", "error_message": "m"}
    assert list(result_values(cols, ok, None, True)) == cols.written()
    assert list(result_values(cols, failed, None, True)) == cols.written()
    assert list(result_values(cols, None, "no result", False)) == cols.written()
