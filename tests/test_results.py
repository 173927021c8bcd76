"""Result-file parsing: unit cases from the documented line formats, then real emulator files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.emulator import EXPIRE_AFTER_METADATA_KEY
from batchgrader.pipeline.results import (
    ResultsFormatError,
    RowOutcome,
    iter_outcomes,
    parse_line,
)
from batchgrader.provider.openai_api import OpenAIProvider
from emulator_fixtures import (  # noqa: F401 - fixtures
    CHAT,
    chat_line,
    clock,
    emu,
    emu_factory,
    jsonl,
    make_provider,
    provider,
    simple_input,
    sleeper,
    write_input,
)
from harness import merged

# The guide's success example, verbatim.
GUIDE_SUCCESS = (
    '{"id": "batch_req_123", "custom_id": "request-2", "response": {"status_code": 200, "request_id": "req_123", '
    '"body": {"id": "chatcmpl-123", "object": "chat.completion", "created": 1711652795, "model": "gpt-3.5-turbo-0125", '
    '"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "logprobs": null, "finish_reason": "stop"}], '
    '"usage": {"prompt_tokens": 22, "completion_tokens": 2, "total_tokens": 24}, "system_fingerprint": "fp_123"}}, "error": null}'
)
GUIDE_EXPIRED = (
    '{"id": "batch_req_123", "custom_id": "request-3", "response": null, "error": {"code": "batch_expired", '
    '"message": "This request could not be executed before the completion window expired."}}'
)
HTTP_400 = json.dumps(
    {
        "id": "batch_req_9",
        "custom_id": "bad",
        "response": {
            "status_code": 400,
            "request_id": "req_9",
            "body": {
                "error": {
                    "message": "max_tokens is too large",
                    "type": "invalid_request_error",
                    "param": "max_tokens",
                    "code": None,
                }
            },
        },
        "error": None,
    }
)
HTTP_500 = json.dumps(
    {
        "custom_id": "boom",
        "response": {
            "status_code": 500,
            "request_id": "req_5",
            "body": {"error": {"message": "The server had an error", "type": "server_error", "param": None, "code": None}},
        },
        "error": None,
    }
)


def one(line: str) -> RowOutcome:
    (o,) = list(iter_outcomes([line]))
    return o


def test_success_line_from_the_guide():
    o = one(GUIDE_SUCCESS)
    assert o.ok and o.custom_id == "request-2" and o.content == "Hello." and o.status_code == 200
    assert (o.prompt_tokens, o.completion_tokens, o.cached_tokens, o.reasoning_tokens) == (22, 2, 0, 0)
    assert o.finish_reason == "stop" and o.request_id == "req_123" and o.line_id == "batch_req_123"
    assert o.error_code is None and o.error_message is None


def test_expired_line_from_the_guide():
    o = one(GUIDE_EXPIRED)
    assert not o.ok and o.status_code is None and o.error_code == "batch_expired"
    assert o.error_message == "This request could not be executed before the completion window expired."


def test_http_level_failures_are_errors_even_though_error_is_null():
    bad = one(HTTP_400)
    assert (
        not bad.ok
        and bad.status_code == 400
        and bad.error_code == "invalid_request_error"
        and bad.error_message == "max_tokens is too large"
    )
    boom = one(HTTP_500)
    assert not boom.ok and boom.status_code == 500 and boom.error_code == "server_error"


def test_success_is_decided_by_status_code_only():
    weird_ok = json.loads(GUIDE_SUCCESS)
    weird_ok["error"] = {"code": "something", "message": "ignored"}
    assert parse_line(weird_ok).ok
    no_body = {"custom_id": "x", "response": {"status_code": 503, "body": "upstream connect error"}, "error": None}
    o = parse_line(no_body)
    assert not o.ok and o.error_code == "http_503" and o.error_message == "HTTP 503"
    neither = parse_line({"custom_id": "y", "response": None, "error": None})
    assert not neither.ok and neither.error_code == "malformed_result"


def test_reasoning_cached_and_length_fields():
    line = {
        "custom_id": "r",
        "response": {
            "status_code": 200,
            "body": {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "partial", "refusal": None},
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": 2000,
                    "completion_tokens": 60,
                    "total_tokens": 2060,
                    "prompt_tokens_details": {"cached_tokens": 1920},
                    "completion_tokens_details": {"reasoning_tokens": 50},
                },
            },
        },
        "error": None,
    }
    o = parse_line(line)
    assert (o.cached_tokens, o.reasoning_tokens, o.finish_reason) == (1920, 50, "length")


def test_responses_api_bodies():
    line = {
        "custom_id": "resp",
        "response": {
            "status_code": 200,
            "body": {
                "object": "response",
                "status": "completed",
                "output": [
                    {"type": "reasoning", "content": []},
                    {"type": "message", "content": [{"type": "output_text", "text": "Hi"}, {"type": "output_text", "text": "!"}]},
                ],
                "usage": {
                    "input_tokens": 10,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 5,
                    "output_tokens_details": {"reasoning_tokens": 3},
                    "total_tokens": 15,
                },
            },
        },
        "error": None,
    }
    o = parse_line(line)
    assert (
        o.ok
        and o.content == "Hi!"
        and (o.prompt_tokens, o.completion_tokens, o.reasoning_tokens) == (10, 5, 3)
        and o.finish_reason == "completed"
    )


def test_malformed_lines_name_their_line_number(tmp_path: Path):
    p = tmp_path / "out.jsonl"
    p.write_bytes(GUIDE_SUCCESS.encode() + b"\n\n" + b'{"id": "x", "response": null}\n' + b'{"custom_id": "tr')
    with pytest.raises(ResultsFormatError) as ei:
        list(iter_outcomes(p))
    assert ei.value.line == 3 and "custom_id" in ei.value.reason and str(p) in str(ei.value)
    problems: list[ResultsFormatError] = []
    rows = list(iter_outcomes(p, on_malformed="skip", malformed=problems))
    assert [r.custom_id for r in rows] == ["request-2"]
    assert [e.line for e in problems] == [3, 4]
    with pytest.raises(ResultsFormatError, match="UTF-8"):
        list(iter_outcomes([b"\xff\xfe\n"]))


def test_parsing_is_streamed_line_by_line():
    def lines():
        yield GUIDE_SUCCESS.encode()
        raise RuntimeError("the parser read ahead")

    it = iter_outcomes(lines())
    assert next(it).custom_id == "request-2"  # the first row arrives before the second is read


def test_merge_chunk_fails_rows_without_an_answer_and_sums_the_answered_rows_usage():
    outcomes = list(iter_outcomes([GUIDE_SUCCESS, GUIDE_EXPIRED, HTTP_400, HTTP_500]))
    records, m = merged(["request-1", "request-2", "request-3", "bad", "boom"], outcomes, "expired")
    assert [r["custom_id"] for r in records] == ["request-1", "request-2", "request-3", "bad", "boom"]
    assert m.succeeded == 1 and records[1]["content"] == "Hello."
    failed = {r["custom_id"]: r["code"] for r in m.failed_rows}
    assert failed["request-1"] == "batch_expired"  # in neither file: the batch expired before it
    assert failed["request-3"] == "batch_expired"
    assert set(failed) == {"request-1", "request-3", "bad", "boom"}
    assert m.usage["prompt_tokens"] == 22 and m.usage["completion_tokens"] == 2  # answered rows only


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["ok", "expired", "400", "500", "missing"]), min_size=0, max_size=30),
    st.sampled_from(["completed", "expired", "cancelled"]),
)
def test_merge_chunk_matches_a_simple_model(kinds, status):
    submitted = [f"id-{i}" for i in range(len(kinds))]
    lines = []
    for cid, k in zip(submitted, kinds):
        if k == "ok":
            lines.append(json.dumps({"custom_id": cid, "response": {"status_code": 200, "body": {}}, "error": None}))
        elif k == "expired":
            lines.append(json.dumps({"custom_id": cid, "response": None, "error": {"code": "batch_expired", "message": "m"}}))
        elif k in ("400", "500"):
            lines.append(
                json.dumps(
                    {
                        "custom_id": cid,
                        "response": {"status_code": int(k), "body": {"error": {"message": "x", "type": "t"}}},
                        "error": None,
                    }
                )
            )
    lines.reverse()  # output order never matters
    records, m = merged(submitted, iter_outcomes(lines), status)
    assert [r["custom_id"] for r in records] == submitted
    missing_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status, "missing_result")
    model = {"ok": None, "expired": "batch_expired", "400": "t", "500": "t", "missing": missing_code}
    assert [(r["custom_id"], r["code"]) for r in m.failed_rows] == [
        (c, model[k]) for c, k in zip(submitted, kinds) if model[k] is not None
    ]
    assert m.succeeded == kinds.count("ok")


# --- against real emulator output -------------------------------------------------------------


def run(provider: OpenAIProvider, clock, path: Path, **meta: str):
    f = provider.upload(path, path.name)
    b = provider.create_batch(f.id, CHAT, "24h", meta or None)
    for _ in range(200):
        b = provider.retrieve(b.id)
        if b.is_terminal:
            return b
        clock.advance(0.05)
    raise AssertionError("not terminal")


def custom_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines() if line.strip()]


def download_and_merge(provider, b, tmp_path: Path, expected: list[str]):
    """What the engine does with an ended batch: download both files, merge them into the rows."""
    outcomes = []
    for fid, name in ((b.output_file_id, "out.jsonl"), (b.error_file_id, "err.jsonl")):
        if fid:
            provider.download(fid, tmp_path / name)
            outcomes += iter_outcomes(tmp_path / name)
    return merged(expected, outcomes, b.status)


def test_expired_batch_partial_output_and_remaining(provider, clock, tmp_path):
    path = write_input(tmp_path, simple_input(8), "in.jsonl")
    b = run(provider, clock, path, **{EXPIRE_AFTER_METADATA_KEY: "5"})
    assert b.status == "expired"
    records, m = download_and_merge(provider, b, tmp_path, custom_ids(path))
    assert [(r["custom_id"], r["code"]) for r in m.failed_rows] == [(f"row-{i}", "batch_expired") for i in range(5, 8)]
    assert m.succeeded == 5 == b.request_counts.completed
    assert m.usage["prompt_tokens"] == b.usage.input_tokens and m.usage["completion_tokens"] == b.usage.output_tokens
    assert m.usage["prompt_tokens"] + m.usage["completion_tokens"] == b.usage.total_tokens


def test_cancelled_batch_rows_missing_from_both_files_are_remaining(emu_factory, sleeper, clock, tmp_path):
    e = emu_factory(in_progress_s=1.0)
    p = make_provider(e)
    path = write_input(tmp_path, simple_input(10), "in.jsonl")
    f = p.upload(path, path.name)
    b = p.create_batch(f.id)
    clock.advance(0.05 + 0.35)  # 3 of 10 done
    p.cancel(b.id)
    clock.advance(1)
    b = p.retrieve(b.id)
    assert b.status == "cancelled"
    records, m = download_and_merge(p, b, tmp_path, custom_ids(path))
    assert [r["custom_id"] for r in records if r["ok"]] == ["row-0", "row-1", "row-2"]
    assert [(r["custom_id"], r["code"]) for r in m.failed_rows] == [(f"row-{i}", "batch_cancelled") for i in range(3, 10)]


def test_mixed_results_match_by_custom_id_despite_shuffled_order(provider, clock, tmp_path):
    rows = [
        chat_line(f"q{i}", f"question {i}" + (" __FAIL_400__" if i % 4 == 1 else "") + (" __FAIL_500__" if i % 4 == 2 else ""))
        for i in range(12)
    ]
    path = write_input(tmp_path, jsonl(rows), "in.jsonl")
    b = run(provider, clock, path)
    records, m = download_and_merge(provider, b, tmp_path, custom_ids(path))
    raw_order = [json.loads(l)["custom_id"] for l in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert raw_order != sorted(raw_order, key=lambda c: int(c[1:]))
    assert [r["custom_id"] for r in records] == [f"q{i}" for i in range(12)]  # the input's order
    assert {r["custom_id"] for r in records if r["ok"]} == {f"q{i}" for i in range(12) if i % 4 in (0, 3)}
    assert {r["custom_id"] for r in records if r["status_code"] == 400} == {f"q{i}" for i in range(12) if i % 4 == 1}
    assert {r["custom_id"] for r in records if r["status_code"] == 500} == {f"q{i}" for i in range(12) if i % 4 == 2}
    assert m.usage["prompt_tokens"] == b.usage.input_tokens


# --- merging a chunk (linear) ---------------------------------------------------------------------


class CountingId(str):
    """A custom id that counts how often it is compared for equality."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountingId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def _answer_line(cid: str, tokens: int = 7) -> str:
    body = {"choices": [{"message": {"content": f"ok {cid}"}}], "usage": {"prompt_tokens": tokens, "completion_tokens": 2}}
    return json.dumps({"id": "l", "custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None})


def test_merge_chunk_is_linear_in_the_rows(tmp_path):
    import random

    n = 3000
    ids = [CountingId(f"row-{i}") for i in range(n)]
    lines = [_answer_line(f"row-{i}") for i in range(0, n, 2)]  # the odd rows have no answer
    random.Random(1).shuffle(lines)
    out_file = tmp_path / "out.jsonl"
    out_file.write_text("\n".join(lines) + "\n")
    CountingId.compared = 0
    records, m = merged(ids, iter_outcomes(out_file), "completed")
    # a hash join compares each id about once; a list membership test would compare ~n*n/2 times
    assert CountingId.compared <= 4 * n
    assert m.succeeded == n // 2 and len(m.failed_rows) == n // 2
    assert m.usage["prompt_tokens"] == 7 * (n // 2)
    assert [r["custom_id"] for r in records] == [f"row-{i}" for i in range(n)]  # the chunk's order
    assert all(r["ok"] == (i % 2 == 0) for i, r in enumerate(records))
    assert records[1]["error_code"] == "missing_result"


def test_merge_chunk_ignores_lines_of_other_rows(tmp_path):
    out_file = tmp_path / "out.jsonl"
    out_file.write_text(_answer_line("a") + "\n" + _answer_line("stranger") + "\n")
    records, m = merged(["a", "b"], iter_outcomes(out_file), "expired")
    assert m.succeeded == 1 and m.failed_rows[0]["custom_id"] == "b" and m.failed_rows[0]["code"] == "batch_expired"
    assert [r["custom_id"] for r in records] == ["a", "b"]  # no line for the stranger


def test_results_join_takes_rows_in_input_order_with_the_latest_chunk_winning(tmp_path):
    from batchgrader.pipeline.results import ResultsJoin

    def chunk(name: str, recs: list[tuple[str, bool]]) -> Path:
        p = tmp_path / name
        p.write_text("".join(json.dumps({"custom_id": c, "ok": ok}) + "\n" for c, ok in recs))
        return p

    first = chunk("c0", [("r0", True), ("r1", False), ("r2", True)])
    second = chunk("c1", [("r4", True), ("r5", False)])  # r3 is in no chunk (a row error)
    retry = chunk("c2", [("r1", True), ("r5", False)])
    with ResultsJoin([first, second, retry]) as join:
        got = [join.take(f"r{i}") for i in range(6)]
    assert [g and g["ok"] for g in got] == [True, True, True, None, True, False]
    assert got[1] == {"custom_id": "r1", "ok": True}  # the retry's answer, not the first failure


def test_merge_writes_every_row_in_order_then_the_duplicates(tmp_path):
    import random

    rng = random.Random(7)
    n = 400
    ids = [f"row-{i}" for i in range(n)]
    lines = [_answer_line(f"row-{i}", tokens=i) for i in range(n) if i % 3]  # every third row unanswered
    lines.append(_answer_line("row-1", tokens=1000))  # a later outcome of the same row wins
    lines.append(_answer_line("stranger"))
    rng.shuffle(lines[:-2])
    out_file = tmp_path / "out.jsonl"
    out_file.write_text("\n".join(lines) + "\n")
    followers = {"row-1": ["dup-a", "row-2"], "row-3": ["dup-b"]}  # row-2 is the chunk's own: not repeated
    recs, m = merged(ids, iter_outcomes(out_file), "completed", followers=followers)
    assert [r["custom_id"] for r in recs[:n]] == ids  # every row once, in the chunk's order
    tokens = {i: (1000 if i == 1 else i) for i in range(n) if i % 3}
    assert [(r["ok"], r.get("content"), r.get("prompt_tokens")) for r in recs[:n]] == [
        (True, f"ok row-{i}", tokens[i]) if i % 3 else (False, None, None) for i in range(n)
    ]
    unanswered = [f"row-{i}" for i in range(0, n, 3)]
    assert all(r["error_code"] == "missing_result" for r in recs[:n] if not r["ok"])
    assert m.rows == n and [f["custom_id"] for f in m.failed_rows] == unanswered
    assert {f["code"] for f in m.failed_rows} == {"missing_result"} and m.succeeded == n - len(unanswered)
    assert m.usage["prompt_tokens"] == sum(i for i in range(n) if i % 3) - 1 + 1000
    assert m.usage["completion_tokens"] == 2 * m.succeeded
    dups = recs[n:]
    assert [(d["custom_id"], d["leader"], d["ok"]) for d in dups] == [("dup-a", "row-1", True), ("dup-b", "row-3", False)]
    assert dups[0]["content"] == "ok row-1" and dups[0]["prompt_tokens"] == 1000 and dups[0]["reused"] == "duplicate"
    assert m.duplicates == 2 and [f["custom_id"] for f in m.duplicates_failed] == ["dup-b"]
    assert m.duplicates_usage["prompt_tokens"] == 1000 and not m.all_ok


@pytest.mark.slow  # measures memory over a large chunk (over 5 s)
def test_merge_holds_no_parsed_records(tmp_path):
    """Streaming merge of 50,000 rows: the peak of Python allocations stays far below what the
    parsed outcomes and records of the chunk take (measured by tracemalloc, not by time)."""
    import random
    import tracemalloc

    from batchgrader.pipeline.merge import ChunkSpool, outcome_record

    n = 50_000
    ids = [f"row-{i}" for i in range(n)]
    lines = [_answer_line(f"row-{i}") for i in range(n)]
    random.Random(3).shuffle(lines)
    out_file = tmp_path / "out.jsonl"
    out_file.write_text("\n".join(lines) + "\n")
    with open(tmp_path / "merged.jsonl", "wb") as f:
        tracemalloc.start()
        with ChunkSpool(ids) as spool:  # as daemon/steps/collect.py merges a chunk
            spool.read(iter_outcomes(out_file))
            m = spool.write(f.write, "completed")
        _, streamed = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert m.succeeded == n
    tracemalloc.start()
    found = {o.custom_id: outcome_record(o) for o in iter_outcomes(out_file)}  # a merge that holds what it read
    held_records = [found[c] for c in ids]
    _, held = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(held_records) == n
    assert streamed < held / 2, (streamed, held)
