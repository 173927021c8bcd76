"""Report figures computed without a daemon: time per phase and attempt, result layouts,
score and text columns, report names, terminal numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from batchgrader.pipeline.outbox import report_name
from batchgrader.reports.report import _phases
from batchgrader.reports.report_columns import field_kinds, groups, guess_kind, text_summary
from batchgrader.reports.report_text import num, phase_lines
from batchgrader.store.eventstore import Event

T0 = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def _events(*spec: tuple[str, float]) -> list[Event]:
    return [
        Event(seq=i, job_id="j", job_seq=i, type=t, version=1, ts=(T0 + timedelta(seconds=s)).isoformat(), payload={})
        for i, (t, s) in enumerate(spec, 1)
    ]


def test_phases_after_a_retry_are_per_attempt_never_negative_and_idle_time_is_its_own():
    events = _events(
        ("JobAccepted", 0),
        ("JobPrepared", 1),
        ("BatchCreated", 2),
        ("ChunkCompleted", 10),
        ("ResultWritten", 11),
        ("JobCompleted", 11),
        ("RetryRequested", 100),  # 89 s later the user ran `bgctl retry`
        ("RetryPlanned", 100.5),
        ("BatchCreated", 101),
        ("ChunkCompleted", 105),
        ("OutboxWriteStarted", 105.2),
        ("ResultWritten", 105.5),
        ("JobCompleted", 105.5),
    )
    got = {(p["attempt"], p["phase"]): p["seconds"] for p in _phases(events)}
    assert got == {
        (1, "prepare"): 1.0,
        (1, "submit"): 1.0,
        (1, "batches"): 8.0,
        (1, "write result"): 1.0,
        (2, "idle before retry"): 89.0,
        (2, "submit"): 1.0,
        (2, "batches"): 4.0,
        (2, "write result"): 0.5,
        (None, "total"): 105.5,
    }
    lines = phase_lines(_phases(events))
    assert lines[0].startswith("first run: prepare 1.0s") and lines[1].startswith("retry 1: idle before retry 89.0s")
    assert lines[-1] == "total 105.5s"


def test_phases_of_a_single_run_read_as_before():
    events = _events(
        ("JobAccepted", 0),
        ("JobPrepared", 2),
        ("BatchCreated", 3),
        ("ChunkCompleted", 63),
        ("ResultWritten", 64),
        ("JobCompleted", 64),
    )
    assert phase_lines(_phases(events)) == ["prepare 2.0s, submit 1.0s, batches 60.0s, write result 1.0s", "total 64.0s"]


def test_the_end_after_the_result_is_its_own_phase_so_the_phases_add_up_to_the_total():
    events = _events(
        ("JobAccepted", 0),
        ("JobPrepared", 2),
        ("BatchCreated", 3),
        ("ChunkCompleted", 63),
        ("ResultWritten", 64),
        ("JobCompleted", 66.5),  # answers stored, input archived, provider files deleted
    )
    phases = _phases(events)
    assert phase_lines(phases) == ["prepare 2.0s, submit 1.0s, batches 60.0s, write result 1.0s, finish 2.5s", "total 66.5s"]
    assert sum(p["seconds"] for p in phases if p["attempt"] is not None) == 66.5


def test_report_names_follow_result_names():
    assert report_name("/o/answers_results.csv") == "answers_report.html"
    assert report_name("/o/answers_results_20261125T101500Z.csv") == "answers_report_20261125T101500Z.html"
    assert report_name("/o/answers_results_20261125T101500Z-2.jsonl") == "answers_report_20261125T101500Z-2.html"
    assert report_name("/o/my_results_results.xlsx") == "my_results_report.html"


def test_thousands_separators():
    assert num(1234567) == "1,234,567" and num(12.5) == "12.5" and num(0) == "0"


def test_columns_are_scores_or_text_by_schema_else_by_their_values():
    schema = {
        "properties": {
            "score": {"type": "integer"},
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "reason": {"type": "string"},
            "ok": {"type": ["boolean", "null"]},
        }
    }
    assert field_kinds(schema) == {"score": "score", "verdict": "score", "reason": "text", "ok": "score"}
    assert guess_kind(["1", "2", "5"]) == "score" and guess_kind(["good", "bad", "good"]) == "score"
    assert guess_kind([f"a different sentence {i}" for i in range(30)]) == "text"


def test_text_is_summarised_by_length_with_examples_per_score_level():
    reasons = ["short", "a longer reason", "x" * 300, "mid one", "", "other"]
    scores = ["1", "2", "2", "1", "1", "2"]
    s = text_summary("reason", reasons, scores, "score")
    assert s["kind"] == "text" and s["values"] == 5 and s["missing"] == 1
    assert s["length"] == {"min": 5, "median": 7, "mean": 66.4, "max": 300}  # (5 + 15 + 300 + 7 + 5) / 5
    assert [e["level"] for e in s["examples"]] == ["1", "2"]
    assert s["examples"][0]["texts"] == ["short", "mid one"]
    assert s["examples"][1]["texts"][1].endswith("…") and len(s["examples"][1]["texts"][1]) == 201
    assert "counts" not in s  # never counted as categories


def test_groups_break_the_scores_down():
    from collections import Counter

    g = groups(
        "question",
        ["q1", "q1", "q2"],
        {"score": ["4", "2", "5"], "verdict": ["pass", "pass", "fail"]},
        Counter({"q2": 1, "q3": 2}),
    )
    by = {x["value"]: x for x in g["groups"]}
    assert by["q1"] == {
        "value": "q1",
        "answered": 2,
        "failed": 0,
        "scores": {"score": {"mean": 3.0}, "verdict": {"top": "pass", "share": 1.0}},
    }
    assert by["q2"]["failed"] == 1 and by["q3"] == {"value": "q3", "answered": 0, "failed": 2, "scores": {}}


def test_the_terminal_confusion_matrix_fits_80_columns():
    from batchgrader.reports.report_text import _confusion

    classes = [f"category_number_{i}" for i in range(8)]
    m = {a: {b: (1234 if a == b else 5) for b in classes} for a in classes}
    lines = _confusion(m)
    assert max(len(line) for line in lines) <= 80
    assert "1,234" in lines[2]  # counts stay whole
    small = _confusion({"1": {"1": 3, "2": 1}, "2": {"1": 0, "2": 4}})
    assert small[1].split() == ["1", "2"] and small[2].split() == ["1", "3", "1"]


SCORED = """\
response_format:
  type: object
  properties:
    score: {type: integer}
    reason: {type: string}
  required: [score, reason]
  additionalProperties: false
"""


def test_reference_keys_are_checked_when_the_config_is_loaded(home):
    import pytest

    from batchgrader.core.configuration.config import ConfigError, load_config

    home.config_file.write_text(SCORED + "profiles:\n  p1:\n    reference_column: human\n    reference_field: scor\n")
    with pytest.raises(ConfigError) as e:
        load_config(home, environ={})
    assert (
        "profiles.p1: key 'reference_field' is 'scor', which is not a field of the schema (the schema's fields are 'score', 'reason')"
        in str(e.value)
    )
    home.config_file.write_text(SCORED + "reference_column: human\n")
    with pytest.raises(
        ConfigError, match="the default profile: key 'reference_column' is 'human' but 'reference_field' is not set"
    ):
        load_config(home, environ={})
    home.config_file.write_text("reference_field: score\n")
    with pytest.raises(ConfigError, match="the profile has no response_format schema"):
        load_config(home, environ={})
    home.config_file.write_text(SCORED + "reference_column: human\nreference_field: score\ngroup_column: q\n")
    assert load_config(home, environ={}).default.reference_field == "score"
    home.config_file.write_text("reference_column: human\n")  # no schema: the output column is compared
    assert load_config(home, environ={}).default.reference_column == "human"
