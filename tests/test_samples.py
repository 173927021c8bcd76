"""Samples per row (pipeline/samples.py): ids, request keys, the vote and the result row."""

from __future__ import annotations

import json

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.pipeline.answerkey import line_key, line_keys
from batchgrader.pipeline.outbox import added_columns
from batchgrader.pipeline.prepare import prepare
from batchgrader.pipeline.samples import (
    NO_MAJORITY,
    VoteSpec,
    id_problem,
    sample_id,
    sample_ids,
    sample_key,
    sample_number,
    vote,
    voted_values,
)
from batchgrader.pipeline.tables import InputError

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "g",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"reason": {"type": "string"}, "score": {"type": "integer"}},
            "required": ["reason", "score"],
            "additionalProperties": False,
        },
    },
}


def test_ids_follow_from_the_row_id():
    assert sample_ids("bg-abc-7", 3) == ["bg-abc-7", "bg-abc-7-s2", "bg-abc-7-s3"]
    assert [sample_number(c) for c in sample_ids("x", 4)] == [1, 2, 3, 4]
    assert sample_number("x-s02") == sample_number("x-s21") == sample_number("x-s1") == 1
    assert id_problem("answer-s2", 3) and id_problem("answer-s2", 1) is None and id_problem("answer", 3) is None


def test_each_sample_has_a_key_of_its_own_and_sample_one_keeps_the_bodys():
    line = json.dumps({"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}})
    cid, key = line_key("openai", line)
    keys = [line_key("openai", line.replace('"r1"', json.dumps(s)))[1] for s in sample_ids("r1", 3)]
    assert keys[0] == key and len(set(keys)) == 3
    assert keys[1] == sample_key("r1-s2", key)
    lines = [line.replace('"r1"', json.dumps(s)).encode() + b"\n" for s in sample_ids("r1", 3)]
    assert [k for _c, k in line_keys("openai", lines)] == keys  # the fast path agrees


@pytest.mark.parametrize(
    ("values", "expected", "agree", "valid"),
    [
        ([4, 4, 5], 4, 2, 3),  # median of numbers
        ([1, 5, 2], 2, 1, 3),
        ([1, 3, 3, 4], 3, 2, 4),  # even count: the two middle values agree
        (["Pass", "fail", "pass "], "Pass", 2, 3),  # categories: case and space ignored, the first such sample
        ([None, 5, 5], 5, 2, 2),  # a sample without an answer is left out
        ([True, False, True], True, 2, 3),
    ],
)
def test_the_vote(values, expected, agree, valid):
    v = vote(values)
    assert (v.value, v.agree, v.valid, v.code) == (expected, agree, valid, None)
    assert v.share == round(agree / len(values), 4)


@pytest.mark.parametrize("values", [[4, 5], [1, 2, 3, 4], ["a", "b", "c"], [None, 2, 3], [None, None, None], ["a", "b"]])
def test_a_tie_or_no_answer_fails_closed(values):
    v = vote(values)
    assert v.code == NO_MAJORITY and v.value is None and v.winner is None and v.share is None


def test_vote_spec_takes_the_reference_field_else_the_first_score_field():
    assert VoteSpec.of(SCHEMA) == VoteSpec("score", True)
    assert VoteSpec.of(SCHEMA, "reason") == VoteSpec("reason", False)
    assert VoteSpec.of(None) == VoteSpec(None, None)
    assert VoteSpec("score", True).value({"ok": True, "content": "not json"}) is None
    assert VoteSpec(None).value({"ok": True, "content": " 4 \n"}) == "4"
    assert VoteSpec(None).value({"ok": False, "content": "4"}) is None


def _rec(cid, score, ok=True, reused=None, pt=10, ct=5):
    content = json.dumps({"reason": f"r {cid}", "score": score}) if score is not None else "cut off"
    rec = {"custom_id": cid, "ok": ok, "content": content, "status_code": 200, "prompt_tokens": pt, "completion_tokens": ct}
    if not ok:
        rec.update(error_code="truncated", error_message="the answer was cut off")
    if reused:
        rec["reused"] = reused
    return rec


def test_the_row_takes_the_vote_the_samples_and_every_samples_tokens():
    cols = added_columns(["id"], "grade", SCHEMA, samples=3)
    assert cols.samples == ("samples", "sample_agreement", "samples_valid")
    recs = [_rec("a", 4), _rec("a-s2", 5, reused="cache"), _rec("a-s3", 4)]
    out = voted_values(cols, recs, [None] * 3, VoteSpec.of(SCHEMA), json_values=False)
    assert json.loads(out["grade"])["reason"] == "r a" and out["score"] == "4" and out["error"] == ""
    assert (out["input_tokens"], out["output_tokens"]) == ("20", "10")  # the reused sample was billed elsewhere
    assert out["answered_by"] == "batch+reused"
    assert (out["samples"], out["sample_agreement"], out["samples_valid"]) == ("[4, 5, 4]", "0.6667", "3")


def test_a_tie_is_no_majority_and_no_answer_at_all_keeps_the_samples_own_error():
    cols = added_columns(["id"], "grade", SCHEMA, samples=2)
    spec = VoteSpec.of(SCHEMA)
    tie = voted_values(cols, [_rec("a", 4), _rec("a-s2", 5)], [None, None], spec, json_values=True)
    assert tie["grade"] is None and tie["score"] is None and tie["error"].startswith(f"{NO_MAJORITY}: the samples tie")
    assert tie["input_tokens"] == 20 and tie["samples"] == "[4, 5]" and tie["sample_agreement"] is None
    failed = voted_values(cols, [_rec("b", None, ok=False), None], [None, "batch_expired: too late"], spec, True)
    assert failed["error"] == "truncated: the answer was cut off" and failed["samples_valid"] == 0
    assert failed["input_tokens"] == 10  # the truncated sample was billed


def _profile(home, extra=""):
    home.config_file.write_text(f"max_completion_tokens: 20\n{extra}")
    return load_config(home, environ={}).default


def test_prepare_plans_k_requests_per_row(home, tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("id,response\n1,good\n2,bad\n")
    one = prepare(src, _profile(home), home)
    three = prepare(src, _profile(home, "samples: 3\n"), home)
    assert (one.rows, one.requests) == (2, 2) and (three.rows, three.requests, three.samples) == (2, 6, 3)
    assert three.input_tokens == 3 * one.input_tokens
    assert three.summary(None)["requests"] == 6 and three.summary(None)["rows"] == 2


def test_an_id_that_looks_like_a_sample_id_is_refused(home, tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("key,response\nq1,good\nq1-s2,bad\n")
    with pytest.raises(InputError, match="'q1-s2' ends like the id of a row's sample"):
        prepare(src, _profile(home, "samples: 2\nid_column: key\n"), home)
    assert prepare(src, _profile(home, "id_column: key\n"), home).requests == 2
    assert sample_id("q1", 2) == "q1-s2"


def test_an_oversized_row_is_reported_per_sample_with_its_row_number(home, tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("id,response\n1,good\n2," + "long " * 400 + "\n3,bad\n")
    prep = prepare(src, _profile(home, "samples: 2\nmax_batch_bytes: 1024\n"), home)
    sha = prep.sha256
    got = [(p.row, p.custom_id, p.code) for p in prep.problems]
    assert got == [(2, f"bg-{sha[:16]}-2", "request_too_large"), (2, f"bg-{sha[:16]}-2-s2", "request_too_large")]
    assert prep.requests == 4
