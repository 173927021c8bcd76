"""The format registry is the one list of table formats: the inbox, format detection, result
names and the result writer's choices all follow it."""

from __future__ import annotations

import json

import pytest

from batchgrader.pipeline.formats.registry import FORMATS, SUPPORTED_SUFFIXES, detect_format, format_spec, result_suffix
from batchgrader.pipeline.inbox import SUPPORTED_SUFFIXES as INBOX_SUFFIXES
from batchgrader.pipeline.outbox import result_name
from batchgrader.pipeline.tables import InputError
from ticks import Rig


def test_the_inbox_takes_exactly_the_registered_suffixes():
    assert INBOX_SUFFIXES == SUPPORTED_SUFFIXES
    assert set(SUPPORTED_SUFFIXES) == {".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".xlsx", ".xlsm", ".parquet"}


@pytest.mark.parametrize("suffix", SUPPORTED_SUFFIXES)
def test_every_registered_suffix_is_detected_as_its_format(suffix):
    fmt = detect_format(f"data{suffix.upper()}")
    assert suffix in FORMATS[fmt].suffixes


def test_an_unknown_suffix_names_every_registered_one():
    with pytest.raises(InputError) as ei:
        detect_format("data.xls")
    assert all(s in str(ei.value) for s in SUPPORTED_SUFFIXES)


@pytest.mark.parametrize(
    "name, result",
    [("a.csv", "a_results.csv"), ("a.TSV", "a_results.tsv"), ("a.ndjson", "a_results.jsonl"), ("a.xlsm", "a_results.xlsx")],
)
def test_the_result_file_takes_the_suffix_its_format_writes(name, result):
    assert result_name(name) == result
    assert result_suffix(".txt") == ".txt"  # not a table format: left as it is


def test_capabilities_follow_what_each_format_holds():
    assert [f for f in FORMATS if not format_spec(f).typed_cells] == ["csv"]  # text cells: empty added cells are ""
    assert sorted(f for f in FORMATS if format_spec(f).formula_guard) == ["csv", "xlsx"]  # opened by spreadsheets


def _finish(rig: Rig, name: str, text: str) -> str:
    """Grade ``text`` (one input file ``name``) with the answer "=1+1" and return the result file's text."""
    rig.provider.answer = lambda cid, body: "=1+1"
    (rig.home.inbox / name).write_text(text)
    while "JobCompleted" not in rig.tick():
        rig.provider.finish_all()
    (result,) = rig.home.outbox.glob("*_results*")
    return result.read_text(encoding="utf-8")


def test_a_csv_result_has_formulas_in_the_added_cells_defused(home):
    rig = Rig(home)
    try:
        assert "'=1+1" in _finish(rig, "a.csv", "id,response\n0,fine\n")  # a spreadsheet format: defused
    finally:
        rig.close()


def test_a_jsonl_result_keeps_the_answer_as_written_and_its_token_counts_as_numbers(home):
    rig = Rig(home)
    try:
        (record,) = [json.loads(line) for line in _finish(rig, "a.jsonl", '{"id": "0", "response": "fine"}\n').splitlines()]
    finally:
        rig.close()
    assert record["grade"] == "=1+1" and record["error"] is None  # not a spreadsheet format: no guard; typed: null
    assert isinstance(record["input_tokens"], int)
