"""Tests for batchgrader.tables: exact, streaming CSV / JSON / JSONL reading and writing."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchgrader.pipeline import tables
from batchgrader.pipeline.formats import jsontext as text_reader
from batchgrader.pipeline.formats.common import NOT_UTF8_FIX
from batchgrader.pipeline.tables import (
    ExactFloat,
    InputError,
    Layout,
    Row,
    TableWriter,
    defuse_formula,
    detect_format,
    open_table,
    text_of,
)


def put(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return p


def read_all(path: Path, **kw) -> list[Row]:
    with open_table(path, **kw) as r:
        return list(r)


def error_of(path: Path, **kw) -> InputError:
    with pytest.raises(InputError) as ei:
        read_all(path, **kw)
    return ei.value


def write_bytes(like, records, added=(), **kw) -> bytes:
    buf = io.BytesIO()
    with TableWriter(buf, like, added, **kw) as w:
        for rec in records:
            w.write(rec)
    return buf.getvalue()


# --- InputError and detect_format ------------------------------------------------------------


def test_input_error_str_and_attributes():
    e = InputError("/in/data.csv", "expected 3 fields (as in the header), found 4", line=7)
    assert str(e) == "data.csv: line 7: expected 3 fields (as in the header), found 4"
    assert (e.path, e.line, e.column) == ("/in/data.csv", 7, None)
    e2 = InputError(Path("d/x.json"), "bad", line=None, column="text")
    assert str(e2) == "x.json: column 'text': bad"
    assert isinstance(e, ValueError)
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.line == 7


def test_input_error_shows_hostile_file_name_escaped():
    assert str(InputError("in/evil\nname.csv", "x")) == "'evil\\nname.csv': x"


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("a.csv", "csv"),
        ("A.CSV", "csv"),
        ("a.tsv", "csv"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.json", "json"),
        ("dir.v2/a.Json", "json"),
    ],
)
def test_detect_format(name, fmt):
    assert detect_format(name) == fmt


def test_detect_format_unknown_extension_names_supported_ones():
    with pytest.raises(InputError) as ei:
        detect_format("/x/report.xls")
    msg = str(ei.value)
    assert msg.startswith("report.xls: ")
    assert "'.xls'" in msg
    for ext in (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".xlsx", ".xlsm", ".parquet"):
        assert ext in msg
    with pytest.raises(InputError, match="no extension"):
        detect_format("README")


# --- CSV: exact cells and structure ----------------------------------------------------------


def test_csv_cells_are_exact_strings(tmp_path):
    p = put(tmp_path, "data.csv", 'id,a,b,c,d,e\n007,NA,null,None,,3\n2,N/A,nan, spaced ,"",12345678901234567890123\n')
    rows = read_all(p)
    assert rows[0].values == {"id": "007", "a": "NA", "b": "null", "c": "None", "d": "", "e": "3"}
    assert rows[1].values == {"id": "2", "a": "N/A", "b": "nan", "c": " spaced ", "d": "", "e": "12345678901234567890123"}
    assert all(type(v) is str for r in rows for v in r.values.values())
    assert [(r.number, r.line) for r in rows] == [(1, 2), (2, 3)]


def test_csv_header_whitespace_kept(tmp_path):
    p = put(tmp_path, "data.csv", " a ,b\n1,2\n")
    with open_table(p) as r:
        assert r.columns == [" a ", "b"]


def test_csv_bom_is_stripped_and_recorded(tmp_path):
    p = put(tmp_path, "data.csv", b"\xef\xbb\xbfid,text\r\n1,x\r\n")
    with open_table(p) as r:
        assert r.columns == ["id", "text"]
        assert r.bom is True and r.lineterminator == "\r\n"
        rows = list(r)
    assert rows[0].values == {"id": "1", "text": "x"}
    assert write_bytes(r, [rows[0].values]) == p.read_bytes()


def test_csv_multiline_field_row_line_is_where_it_starts(tmp_path):
    p = put(tmp_path, "data.csv", 'id,text\n1,"first\nsecond\nthird"\n2,x\n\n3,"a\r\nb"\n')
    rows = read_all(p)
    assert [(r.number, r.line) for r in rows] == [(1, 2), (2, 5), (3, 7)]
    assert rows[0].values["text"] == "first\nsecond\nthird"
    assert rows[2].values["text"] == "a\r\nb"


def test_csv_blank_lines_are_skipped(tmp_path):
    p = put(tmp_path, "data.csv", "\n\nid,t\n\n1,a\n\n\n2,b\n\n")
    rows = read_all(p)
    assert [(r.number, r.line, r.values["t"]) for r in rows] == [(1, 5, "a"), (2, 8, "b")]


def test_csv_lone_cr_line_endings(tmp_path):
    p = put(tmp_path, "data.csv", 'id,t\r1,"x\ry"\r2,z\r')
    with open_table(p) as r:
        rows = list(r)
        assert r.lineterminator == "\r"
    assert [(r.line, r.values["t"]) for r in rows] == [(2, "x\ry"), (4, "z")]
    assert write_bytes(r, [x.values for x in rows]) == p.read_bytes()


def test_csv_too_many_fields(tmp_path):
    p = put(tmp_path, "data.csv", "a,b,c\n1,2,3\n4,5,6,7\n")
    e = error_of(p)
    assert str(e) == "data.csv: line 3: expected 3 fields (as in the header), found 4"
    assert e.line == 3


def test_csv_too_few_fields_line_counts_multiline_rows(tmp_path):
    p = put(tmp_path, "data.csv", 'a,b,c\n1,"x\ny",3\n4,5\n')
    e = error_of(p)
    assert str(e) == "data.csv: line 4: expected 3 fields (as in the header), found 2"


def test_csv_trailing_delimiter_on_rows_does_not_shift_columns(tmp_path):
    p = put(tmp_path, "data.csv", "a,b\n1,2,\n")
    e = error_of(p)
    assert str(e) == "data.csv: line 2: expected 2 fields (as in the header), found 3"


def test_csv_trailing_delimiter_in_header_is_an_empty_column_name(tmp_path):
    p = put(tmp_path, "data.csv", "a,b,\n1,2,\n")
    e = error_of(p)
    assert str(e) == "data.csv: line 1: header column 3 has an empty name (is there a trailing delimiter?)"


def test_csv_empty_header_name_in_the_middle(tmp_path):
    p = put(tmp_path, "data.csv", "\nid,,text\n1,2,3\n")
    e = error_of(p)
    assert str(e) == "data.csv: line 2: header column 2 has an empty name"


def test_csv_single_empty_header_name(tmp_path):
    p = put(tmp_path, "data.csv", '""\nx\n')
    assert str(error_of(p)) == "data.csv: line 1: header column 1 has an empty name"


def test_csv_line_terminator_is_taken_from_the_end_of_the_header_record(tmp_path):
    p = put(tmp_path, "data.csv", '"multi\nline",b\r\n1,2\r\n')
    with open_table(p) as r:
        assert r.columns == ["multi\nline", "b"] and r.lineterminator == "\r\n"
        rows = list(r)
    assert rows[0].line == 3
    assert write_bytes(r, [rows[0].values]) == p.read_bytes()


def test_csv_duplicate_header_names(tmp_path):
    p = put(tmp_path, "data.csv", "a,b,a,c,b\n1,2,3,4,5\n")
    e = error_of(p)
    assert e.line == 1 and e.column == "a"
    assert "duplicate column names in the header: 'a' (columns 1, 3); 'b' (columns 2, 5)" in str(e)
    assert str(e).startswith("data.csv: line 1: ")


def test_csv_unbalanced_quote_reports_the_line_the_field_starts(tmp_path):
    p = put(tmp_path, "data.csv", 'id,text\n1,"ok\nfine"\n2,"never closed\n3,x\n4,y\n')
    e = error_of(p)
    assert e.line == 4
    assert str(e).startswith("data.csv: line 4: unbalanced quote")
    assert "never closed" in str(e)


def test_csv_unbalanced_quote_in_a_later_field_of_a_multiline_row(tmp_path):
    p = put(tmp_path, "data.csv", 'id,a,b\n1,"x\ny","oops\n2,z,w\n')
    e = error_of(p)
    assert e.line == 3  # the row starts on line 2, the unclosed field on line 3
    assert str(e).startswith("data.csv: line 3: unbalanced quote")


def test_csv_text_after_closing_quote_is_rejected(tmp_path):
    p = put(tmp_path, "data.csv", 'id,text\n1,"a"b\n')
    e = error_of(p)
    assert str(e).startswith("data.csv: line 2: malformed quoting")


def test_csv_nul_byte(tmp_path):
    p = put(tmp_path, "data.csv", b"id,text\n1,ok\n2,a\x00b\n")
    e = error_of(p)
    assert e.line == 3
    assert str(e).startswith("data.csv: line 3: contains a NUL byte (at column 4)")


def test_csv_latin1_bytes(tmp_path):
    p = put(tmp_path, "data.csv", "id,name\n1,Jos\u00e9\n2,Ren\u00e9e\n".encode("latin-1"))
    e = error_of(p)
    assert str(e) == ("data.csv: line 2: not valid UTF-8 (byte 0xe9 at column 6) — " + NOT_UTF8_FIX)


def test_csv_bad_byte_column_counts_characters(tmp_path):
    p = put(tmp_path, "data.csv", "id,name\n1,\u00e9\u00e9".encode() + b"\xff\n")
    e = error_of(p)
    assert "byte 0xff at column 5" in str(e) and e.line == 2


def test_csv_utf16_file(tmp_path):
    p = put(tmp_path, "data.csv", "id,text\n1,x\n".encode("utf-16"))
    e = error_of(p)
    assert str(e) == "data.csv: line 1: the file is UTF-16 encoded — save it as UTF-8"


@pytest.mark.parametrize("data", [b"", b"\n\n", b"  \r\n\t\n", b"\xef\xbb\xbf"])
def test_csv_empty_file(tmp_path, data):
    p = put(tmp_path, "data.csv", data)
    assert str(error_of(p)) == "data.csv: file is empty"


@pytest.mark.parametrize("data", ["id,text\n", "id,text", "\nid,text\n\n\n"])
def test_csv_header_only(tmp_path, data):
    p = put(tmp_path, "data.csv", data)
    e = error_of(p)
    assert e.reason == "has a header but no data rows"
    assert str(e).startswith("data.csv: line ")


def test_csv_field_larger_than_limit_names_line_and_column(tmp_path):
    p = put(tmp_path, "data.csv", "id,text\n1,short\n2," + "x" * 101 + "\n")
    e = error_of(p, max_field_size=100)
    assert (e.line, e.column) == (3, "text")
    assert str(e) == ("data.csv: line 3: column 'text': field is larger than the limit of 100 characters (101 characters)")


def test_csv_default_limit_allows_fields_beyond_csv_module_default(tmp_path):
    big = "y" * 300_000  # csv's own default limit is 131072
    p = put(tmp_path, "data.csv", f'id,text\n1,{big}\n2,"{big}"\n')
    rows = read_all(p)
    assert rows[0].values["text"] == big and rows[1].values["text"] == big


def test_csv_runaway_row_is_cut_off_at_the_record_limit(tmp_path):
    body = "".join(f"{i},x\n" for i in range(2000))
    p = put(tmp_path, "data.csv", 'id,text\n1,"unclosed\n' + body)
    e = error_of(p, max_record_size=1000)
    assert e.line == 2
    assert "larger than the limit of 1000 bytes" in str(e) and "quote unbalanced" in str(e)


def test_csv_semicolon_delimiter_is_sniffed(tmp_path):
    p = put(tmp_path, "data.csv", 'id;text\n1;hello, world\n2;"a;b"\n')
    with open_table(p) as r:
        assert r.delimiter == ";" and r.columns == ["id", "text"]
        rows = list(r)
    assert rows[0].values == {"id": "1", "text": "hello, world"}
    assert rows[1].values == {"id": "2", "text": "a;b"}
    assert write_bytes(r, [x.values for x in rows]) == p.read_bytes()


def test_csv_tab_delimiter_is_sniffed_in_a_csv_file(tmp_path):
    p = put(tmp_path, "data.csv", "id\ttext\n1\ta;b\n")
    with open_table(p) as r:
        assert r.delimiter == "\t"
        assert list(r)[0].values == {"id": "1", "text": "a;b"}


def test_tsv_extension_means_tab(tmp_path):
    p = put(tmp_path, "data.tsv", "id\ttext\n1\thello, world\n")
    with open_table(p) as r:
        assert r.delimiter == "\t" and r.fmt == "csv"
        assert list(r)[0].values == {"id": "1", "text": "hello, world"}


def test_csv_comma_wins_when_header_has_a_comma(tmp_path):
    p = put(tmp_path, "data.csv", "id,note;x\n1,a;b\n")
    with open_table(p) as r:
        assert r.delimiter == "," and r.columns == ["id", "note;x"]


def test_csv_single_column_stays_single_column(tmp_path):
    p = put(tmp_path, "data.csv", 'text\nhello world\n""\n')
    with open_table(p) as r:
        assert r.delimiter == "," and r.columns == ["text"]
        assert [x.values["text"] for x in r] == ["hello world", ""]


def test_csv_explicit_delimiter_overrides_sniffing(tmp_path):
    p = put(tmp_path, "data.csv", "a;b\nx;y\n")
    with open_table(p, delimiter=",") as r:
        assert r.columns == ["a;b"]
        assert list(r)[0].values == {"a;b": "x;y"}


def test_csv_sniffed_delimiter_still_checks_field_counts(tmp_path):
    p = put(tmp_path, "data.csv", "a;b\n1;2;3\n")
    assert str(error_of(p)) == "data.csv: line 2: expected 2 fields (as in the header), found 3"


def test_csv_required_column_missing(tmp_path):
    p = put(tmp_path, "data.csv", "id,answer\n1,x\n")
    e = error_of(p, required_columns=["id", "text"])
    assert e.column == "text"
    assert str(e) == "data.csv: line 1: column 'text': required column not found; the header has: 'id', 'answer'"


def test_csv_required_column_present(tmp_path):
    p = put(tmp_path, "data.csv", "id,text\n1,x\n")
    assert read_all(p, required_columns=["text"])[0].values["text"] == "x"


def test_csv_open_from_a_binary_file_object(tmp_path):
    p = put(tmp_path, "data.csv", "id,text\n1,x\n")
    with open(p, "rb") as f:
        with open_table(f) as r:
            assert [x.values for x in r] == [{"id": "1", "text": "x"}]
        assert not f.closed  # the caller owns it
    with pytest.raises(ValueError, match="fmt is required"):
        open_table(io.BytesIO(b"a\n1\n"))
    with open_table(io.BytesIO(b"a\n1\n"), "csv") as r:
        assert list(r)[0].values == {"a": "1"}


def test_file_is_closed_when_open_fails(tmp_path, monkeypatch):
    p = put(tmp_path, "data.csv", "a,a\n1,2\n")
    opened = []
    real_open = open

    def spy(*a, **k):
        f = real_open(*a, **k)
        opened.append(f)
        return f

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(InputError):
        open_table(p)
    assert opened and all(f.closed for f in opened)


# --- CSV: writing -----------------------------------------------------------------------------

TYPICAL_CSV = (
    "id,question,answer,notes\r\n"
    "1,What is 2+2?,4,\r\n"
    '007,"Say ""hi"", then leave","Line one\r\nline two",NA\r\n'
    "3,Ünïcödé ✓ 日本語,  padded  ,null\r\n"
    '4,"comma, inside",,""""\r\n'
)


def test_csv_read_then_write_reproduces_a_typical_file_byte_for_byte(tmp_path):
    p = put(tmp_path, "data.csv", TYPICAL_CSV)
    with open_table(p) as r:
        rows = list(r)
    out = tmp_path / "out.csv"
    with TableWriter(out, r) as w:
        for row in rows:
            w.write(row.values)
    assert out.read_bytes() == p.read_bytes()


def test_csv_write_adds_columns_with_same_dialect(tmp_path):
    p = put(tmp_path, "data.csv", b"\xef\xbb\xbfid;text\r\n1;a\r\n2;b\r\n")
    with open_table(p) as r:
        rows = list(r)
    out = write_bytes(
        r, [{**x.values, "grade": 5 if x.number == 1 else None, "why": "ok; fine"} for x in rows], added=["grade", "why"]
    )
    assert out == b'\xef\xbb\xbfid;text;grade;why\r\n1;a;5;"ok; fine"\r\n2;b;;"ok; fine"\r\n'


def test_csv_writer_quotes_cr_and_lf_whatever_the_terminator(tmp_path):
    layout = Layout("csv", ("a", "b"), ",", "\n")
    out = write_bytes(layout, [{"a": "x\ry", "b": "p\nq"}, {"a": "\r", "b": "plain"}])
    assert out == b'a,b\n"x\ry","p\nq"\n"\r",plain\n'
    p = put(tmp_path, "back.csv", out)
    assert [r.values for r in read_all(p)] == [{"a": "x\ry", "b": "p\nq"}, {"a": "\r", "b": "plain"}]


def test_csv_writer_rejects_unknown_and_clashing_columns():
    layout = Layout("csv", ("id", "text"))
    buf = io.BytesIO()
    with TableWriter(buf, layout, ["grade"]) as w:
        with pytest.raises(ValueError, match="not an output column: 'oops'"):
            w.write({"id": "1", "oops": "x"})
        w.write({"id": "1"})  # missing columns are written empty
    assert buf.getvalue() == b"id,text,grade\n1,,\n"
    with pytest.raises(ValueError, match="'text' appears twice"):
        TableWriter(io.BytesIO(), layout, ["text"])


def test_csv_writer_non_string_values_use_text_of():
    out = write_bytes(
        Layout("csv", ("a",)), [{"a": 3}, {"a": True}, {"a": None}, {"a": {"k": [1, "é"]}}, {"a": ExactFloat("1.50")}]
    )
    assert out.decode() == 'a\n3\ntrue\n""\n"{""k"":[1,""é""]}"\n1.50\n'


def test_formula_guard_on_applies_to_every_cell_including_header():
    layout = Layout("csv", ("id", "=title"))
    rows = [
        {"id": "-5", "=title": '=HYPERLINK("http://x")', "grade": "+1.5e3"},
        {"id": "-1+2", "=title": "@SUM(A1)", "grade": "\tx"},
        {"id": "\rcr", "=title": "plain - text", "grade": ""},
    ]
    out = write_bytes(layout, rows, added=["grade"], formula_guard=True).decode()
    assert out == ('id,\'=title,grade\n-5,"\'=HYPERLINK(""http://x"")",+1.5e3\n\'-1+2,\'@SUM(A1),\'\tx\n"\'\rcr",plain - text,\n')


def test_formula_guard_off_writes_cells_verbatim():
    layout = Layout("csv", ("a",))
    out = write_bytes(layout, [{"a": "=1+1"}, {"a": "@x"}, {"a": "-2"}, {"a": "+SUM(A1)"}])
    assert out == b"a\n=1+1\n@x\n-2\n+SUM(A1)\n"


@pytest.mark.parametrize(
    "cell, guarded",
    [
        ("=1", "'=1"),
        ("+x", "'+x"),
        ("-x", "'-x"),
        ("@x", "'@x"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("-5", "-5"),
        ("+3.25", "+3.25"),
        ("-1e-3", "-1e-3"),
        ("-.5", "-.5"),
        ("-", "'-"),
        ("-5 ", "'-5 "),
        ("", ""),
        ("a=b", "a=b"),
        (" =x", " =x"),
    ],
)
def test_defuse_formula(cell, guarded):
    assert defuse_formula(cell) == guarded


def test_formula_guard_is_ignored_for_json():
    out = write_bytes(Layout("jsonl"), [{"a": "=1+1"}], formula_guard=True)
    assert out == b'{"a": "=1+1"}\n'


_cell = st.one_of(
    st.sampled_from(
        [
            "",
            "NA",
            "null",
            "None",
            "007",
            "3",
            '"',
            '""',
            ",",
            ";",
            "\n",
            "\r\n",
            "\r",
            " ",
            "\t",
            "a,b",
            '"q"',
            "é",
            "日本",
            "\ufeff",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
)
_name = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\ufeff"),
    min_size=1,
    max_size=8,
).filter(lambda s: s.strip() != "")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    columns=st.lists(_name, min_size=1, max_size=5, unique=True),
    data=st.data(),
    delimiter=st.sampled_from([",", ";", "\t"]),
    terminator=st.sampled_from(["\n", "\r\n", "\r"]),
    bom=st.booleans(),
)
def test_csv_roundtrip_property(tmp_path, columns, data, delimiter, terminator, bom):
    rows = data.draw(st.lists(st.lists(_cell, min_size=len(columns), max_size=len(columns)), min_size=1, max_size=6))
    records = [dict(zip(columns, r)) for r in rows]
    layout = Layout("csv", tuple(columns), delimiter, terminator, bom)
    p = put(tmp_path, "rt.csv", write_bytes(layout, records))
    with open_table(p, delimiter=delimiter) as r:
        back = list(r)
        assert r.columns == columns
        assert (r.lineterminator, r.bom) == (terminator, bom)
    assert [x.values for x in back] == records
    assert [x.number for x in back] == list(range(1, len(records) + 1))
    # writing what was read reproduces the file exactly
    assert write_bytes(r, [x.values for x in back]) == p.read_bytes()


# --- JSONL ------------------------------------------------------------------------------------


def test_jsonl_values_keep_their_json_types(tmp_path):
    p = put(
        tmp_path,
        "data.jsonl",
        '{"id": 7, "code": "007", "n": null, "ok": true, "x": 19.90, "nest": {"a": [1, {"b": 2}]}}\n'
        '{"id": 12345678901234567890, "big": 1e400}\n',
    )
    rows = read_all(p)
    v = rows[0].values
    assert v["id"] == 7 and type(v["id"]) is int
    assert v["code"] == "007" and v["n"] is None and v["ok"] is True
    assert isinstance(v["x"], ExactFloat) and v["x"] == 19.9 and v["x"].text == "19.90"
    assert v["nest"] == {"a": [1, {"b": 2}]}
    assert rows[1].values["id"] == 12345678901234567890
    assert rows[1].values["big"].text == "1e400"


def test_jsonl_blank_lines_bom_and_line_numbers(tmp_path):
    p = put(tmp_path, "data.jsonl", b'\xef\xbb\xbf{"a": 1}\r\n\r\n  \r\n{"a": 2}\r\n')
    with open_table(p) as r:
        rows = list(r)
        assert r.bom is True and r.lineterminator == "\r\n"
    assert [(x.number, x.line, x.values) for x in rows] == [(1, 1, {"a": 1}), (2, 4, {"a": 2})]


def test_jsonl_columns_are_first_keys_then_extended(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"b": 1, "a": 2}\n{"c": 3}\n{"a": 1, "d": 4}\n')
    with open_table(p) as r:
        assert r.columns == ["b", "a"]
        list(r)
        assert r.columns == ["b", "a", "c", "d"]


def test_jsonl_invalid_json(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n\n{"a": 2,, "b": 3}\n')
    e = error_of(p)
    assert e.line == 3
    assert str(e) == "data.jsonl: line 3: invalid JSON: Expecting property name enclosed in double quotes (column 9)"


def test_jsonl_truncated_last_line(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n{"a": "cut off')
    e = error_of(p)
    assert str(e).startswith("data.jsonl: line 2: invalid JSON: Unterminated string")


@pytest.mark.parametrize("line, kind", [("[1, 2]", "an array"), ("42", "a number"), ('"text"', "a string"), ("null", "null")])
def test_jsonl_line_that_is_not_an_object(tmp_path, line, kind):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n' + line + "\n")
    assert str(error_of(p)) == f"data.jsonl: line 2: record 2 is {kind}, not a JSON object"


def test_jsonl_duplicate_keys(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n{"a": 1, "b": {"x": 1, "x": 2}}\n')
    e = error_of(p)
    assert (e.line, e.column) == (2, "x")
    assert str(e) == "data.jsonl: line 2: column 'x': record 2 has the key 'x' more than once"


@pytest.mark.parametrize("lit", ["NaN", "Infinity", "-Infinity"])
def test_jsonl_nan_and_infinity_are_rejected(tmp_path, lit):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n{"a": ' + lit + "}\n")
    assert str(error_of(p)) == f"data.jsonl: line 2: record 2 contains {lit}, which is not valid JSON"


def test_jsonl_invalid_utf8(tmp_path):
    p = put(tmp_path, "data.jsonl", b'{"a": "ok"}\n{"a": "Jos\xe9"}\n')
    assert str(error_of(p)) == ("data.jsonl: line 2: not valid UTF-8 (byte 0xe9 at column 11) — " + NOT_UTF8_FIX)


@pytest.mark.parametrize("data", [b"", b"\n \n\t\n", b"\xef\xbb\xbf\n"])
def test_jsonl_empty_file(tmp_path, data):
    assert str(error_of(put(tmp_path, "data.jsonl", data))) == "data.jsonl: file is empty"


def test_jsonl_required_column_reports_first_record_missing_it(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"id": 1, "text": "a"}\n\n{"id": 2, "txt": "b"}\n{"id": 3}\n')
    with open_table(p, required_columns=["text"]) as r:
        it = iter(r)
        assert next(it).values["text"] == "a"
        with pytest.raises(InputError) as ei:
            next(it)
    e = ei.value
    assert (e.line, e.column) == (3, "text")
    assert str(e) == "data.jsonl: line 3: column 'text': record 2 has no key 'text' (its keys: 'id', 'txt')"


def test_jsonl_nesting_limit(tmp_path):
    deep = '{"a": ' + "[" * 150 + "]" * 150 + "}"
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n' + deep + "\n")
    assert str(error_of(p)) == "data.jsonl: line 2: record 2 is nested deeper than 100 levels"
    very_deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    p2 = put(tmp_path, "deep.jsonl", very_deep + "\n")
    e = error_of(p2)
    assert e.line == 1 and "nested" in str(e)


def test_jsonl_line_longer_than_record_limit(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"a": 1}\n{"a": "' + "x" * 5000 + '"}\n')
    e = error_of(p, max_record_size=1000)
    assert str(e) == "data.jsonl: line 2: the line is longer than the limit of 1000 bytes"


# --- JSON array -------------------------------------------------------------------------------


def test_json_array_records_lines_and_columns(tmp_path):
    p = put(tmp_path, "data.json", '[\n  {"id": 1, "t": "a"},\n  {"id": 2,\n   "t": "b\\nc", "extra": [1]},\n\n  {"id": 3}\n]\n')
    with open_table(p) as r:
        assert r.columns == ["id", "t"]
        rows = list(r)
        assert r.columns == ["id", "t", "extra"]
    assert [(x.number, x.line) for x in rows] == [(1, 2), (2, 3), (3, 6)]
    assert rows[1].values == {"id": 2, "t": "b\nc", "extra": [1]}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(
        st.dictionaries(
            st.text(max_size=5),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False),
                lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                max_leaves=6,
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=8,
    ),
    indent=st.sampled_from([None, 0, 2]),
    chunk=st.integers(min_value=1, max_value=40),
)
def test_json_streaming_parse_matches_json_loads_across_chunk_boundaries(tmp_path, monkeypatch, records, indent, chunk):
    monkeypatch.setattr(text_reader, "_CHUNK", chunk)
    text = json.dumps(records, indent=indent, ensure_ascii=False)
    p = put(tmp_path, "data.json", text)
    rows = read_all(p)
    assert [x.values for x in rows] == json.loads(text)
    # each record starts on the line where json.dumps put it
    starts = []
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    for _ in records:
        while text[pos] in " \n\r\t,":
            pos += 1
        starts.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
    assert [x.line for x in rows] == starts


def test_json_multibyte_characters_split_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(text_reader, "_CHUNK", 1)
    p = put(tmp_path, "data.json", b'\xef\xbb\xbf[{"t": "\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80"}]')
    with open_table(p) as r:
        assert list(r)[0].values == {"t": "é日😀"}
        assert r.bom is True


@pytest.mark.parametrize(
    "data, found",
    [('{"rows": [{"a": 1}]}', "an object"), ('"text"', "a string"), ("42", "a number"), ("true", "a boolean"), ("null", "null")],
)
def test_json_top_level_must_be_an_array(tmp_path, data, found):
    e = error_of(put(tmp_path, "data.json", "\n" + data))
    assert e.line == 2
    msg = str(e)
    assert msg.startswith("data.json: line 2: JSON must be an array of objects")
    assert f"found {found}" in msg and "JSON Lines" in msg and ".jsonl" in msg


def test_json_element_not_an_object(tmp_path):
    p = put(tmp_path, "data.json", '[\n{"a": 1},\n{"a": 2},\n"oops"\n]')
    assert str(error_of(p)) == "data.json: line 4: record 3 (array element 3) is a string, not a JSON object"


def test_json_truncated_file(tmp_path):
    p = put(tmp_path, "data.json", '[\n{"a": 1},\n{"a": 2,\n "b": ')
    e = error_of(p)
    assert str(e) == "data.json: line 3: unexpected end of file inside record 2 (array element 2) (is the file truncated?)"
    p2 = put(tmp_path, "data2.json", '[\n{"a": 1},\n{"a": 2}\n')
    assert str(error_of(p2)) == (
        "data2.json: line 4: unexpected end of file: the top-level array is not closed with ']' (is the file truncated?)"
    )


def test_json_invalid_json_reports_its_line(tmp_path):
    p = put(tmp_path, "data.json", '[\n{"a": 1},\n{"a": 2,\n "b" 3}\n]')
    assert str(error_of(p)) == (
        "data.json: line 4: invalid JSON in record 2 (array element 2): Expecting ':' delimiter (column 6)"
    )


def test_json_invalid_element_fails_fast_without_reading_on(tmp_path, monkeypatch):
    # The bad element is small; if the reader kept reading to find its end it would hit the
    # record size limit (and, on a big file, hold it all in memory) instead of this message.
    monkeypatch.setattr(text_reader, "_CHUNK", 256)
    tail = ",\n".join('{"id": %d, "text": "%s"}' % (i, "x" * 50) for i in range(5000))
    p = put(tmp_path, "data.json", '[\n{"a": 1},\n{"a": 2 "b": 3},\n' + tail + "\n]")
    e = error_of(p, max_record_size=2000)
    assert str(e) == "data.json: line 3: invalid JSON in record 2 (array element 2): Expecting ',' delimiter (column 9)"


def test_json_missing_comma_trailing_comma_and_trailing_data(tmp_path):
    assert str(error_of(put(tmp_path, "a.json", '[{"a": 1}\n{"a": 2}]'))) == (
        "a.json: line 2: invalid JSON: expected ',' or ']' after record 1 (array element 1), found '{' (column 1)"
    )
    assert str(error_of(put(tmp_path, "b.json", '[{"a": 1},\n]'))) == ("b.json: line 2: trailing comma before ']' (column 1)")
    assert str(error_of(put(tmp_path, "c.json", '[{"a": 1}]\n\n[{"a": 2}]'))) == (
        "c.json: line 3: unexpected data after the end of the top-level array (column 1)"
    )


def test_json_empty_array_and_empty_file(tmp_path):
    assert str(error_of(put(tmp_path, "a.json", " [ \n ] \n"))) == "a.json: line 1: file has no records (the array is empty)"
    assert str(error_of(put(tmp_path, "b.json", ""))) == "b.json: file is empty"
    assert str(error_of(put(tmp_path, "c.json", "\n  \n"))) == "c.json: file is empty"


def test_json_duplicate_keys_and_nan(tmp_path):
    e = error_of(put(tmp_path, "a.json", '[{"a": 1},\n {"a": 1, "a": 2}]'))
    assert str(e) == "a.json: line 2: column 'a': record 2 (array element 2) has the key 'a' more than once"
    e = error_of(put(tmp_path, "b.json", '[{"a": 1},\n\n {"a": NaN}]'))
    assert str(e) == "b.json: line 3: record 2 (array element 2) contains NaN, which is not valid JSON"


def test_json_invalid_utf8_reports_line_and_column(tmp_path, monkeypatch):
    monkeypatch.setattr(text_reader, "_CHUNK", 5)
    p = put(tmp_path, "data.json", b'[{"a": "x"},\n {"a": "Ren\xe9e"}]')
    assert str(error_of(p)) == "data.json: line 2: not valid UTF-8 (byte 0xe9 at column 12) — " + NOT_UTF8_FIX


def test_json_required_column(tmp_path):
    p = put(tmp_path, "data.json", '[{"text": "a"},\n{"text": "b"},\n{"txt": "c"}]')
    e = error_of(p, required_columns=["text"])
    assert (e.line, e.column) == (3, "text")
    assert str(e).startswith("data.json: line 3: column 'text': record 3 (array element 3) has no key 'text'")


def test_json_element_larger_than_record_limit(tmp_path):
    p = put(tmp_path, "data.json", '[{"a": 1},\n{"a": "' + "x" * 300_000 + '"}]')
    e = error_of(p, max_record_size=100_000)
    assert str(e) == "data.json: line 2: record 2 (array element 2) is larger than the limit of 100000 bytes"


def test_json_minified_single_line_columns_in_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(text_reader, "_CHUNK", 64)
    body = ",".join('{"id":%d}' % i for i in range(500))
    p = put(tmp_path, "data.json", "[" + body + ',{"id":1,}]')
    e = error_of(p)
    col = len("[" + body + ',{"id":1,') + 1
    assert str(e) == (
        f"data.json: line 1: invalid JSON in record 501 (array element 501): "
        f"Expecting property name enclosed in double quotes (column {col})"
    )


# --- text_of ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        ("as is", "as is"),
        ("", ""),
        (None, ""),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (12345678901234567890, "12345678901234567890"),
        (ExactFloat("19.90"), "19.90"),
        (ExactFloat("1E5"), "1E5"),
        (2.5, "2.5"),
        ({"a": 1, "b": [2, "é", None]}, '{"a":1,"b":[2,"é",null]}'),
        ([], "[]"),
    ],
)
def test_text_of(value, text):
    assert text_of(value) == text


def test_text_of_rejects_nan():
    with pytest.raises(ValueError):
        text_of(float("nan"))


def test_exact_float_behaves_like_a_float():
    x = ExactFloat("1.50")
    assert x == 1.5 and isinstance(x, float) and str(x) == "1.50" and f"{x}" == "1.50"
    assert f"{x:.1f}" == "1.5" and x + 1 == 2.5 and type(x + 1) is float
    assert pickle.loads(pickle.dumps(x)).text == "1.50"


# --- JSON / JSONL writing ---------------------------------------------------------------------


def test_json_write_roundtrip_keeps_order_types_and_spelling(tmp_path):
    src = (
        '[{"z": 1, "a": "007", "f": 19.90, "e": 1E5, "big": 1e400, "nest": {"k": [1.0, null]}, '
        '"u": "日本"},\n {"a": 12345678901234567890}]'
    )
    p = put(tmp_path, "data.json", src)
    with open_table(p) as r:
        rows = list(r)
    out = write_bytes(r, [{**x.values, "grade": 4, "why": "ok"} for x in rows], added=["grade", "why"])
    text = out.decode("utf-8")
    assert text == (
        "[\n"
        '{"z": 1, "a": "007", "f": 19.90, "e": 1E5, "big": 1e400, "nest": {"k": [1.0, null]}, '
        '"u": "日本", "grade": 4, "why": "ok"},\n'
        '{"a": 12345678901234567890, "grade": 4, "why": "ok"}\n'
        "]\n"
    )
    p2 = put(tmp_path, "out.json", out)
    back = read_all(p2)
    assert [list(x.values) for x in back] == [list(rows[0].values) + ["grade", "why"], ["a", "grade", "why"]]
    assert back[1].values["a"] == 12345678901234567890 and type(back[1].values["a"]) is int


def test_jsonl_write_one_object_per_line_same_terminator(tmp_path):
    p = put(tmp_path, "data.jsonl", '{"id": 1, "t": "é"}\r\n{"id": 2, "t": "x"}\r\n')
    with open_table(p) as r:
        rows = list(r)
    out = write_bytes(r, [{**x.values, "g": [1, 2]} for x in rows], added=["g"])
    assert out == '{"id": 1, "t": "é", "g": [1, 2]}\r\n{"id": 2, "t": "x", "g": [1, 2]}\r\n'.encode()
    assert b"\xef\xbb\xbf" not in write_bytes(Layout("jsonl", bom=True), [{"a": 1}])


def test_json_writer_empty_output_and_nan_refused():
    assert write_bytes(Layout("json"), []) == b"[]\n"
    buf = io.BytesIO()
    with TableWriter(buf, Layout("json")) as w:
        with pytest.raises(ValueError, match="not valid JSON"):
            w.write({"a": float("nan")})
        with pytest.raises(TypeError):
            w.write({"a": object()})


def test_writer_leaves_output_unfinished_when_the_block_fails():
    buf = io.BytesIO()
    with pytest.raises(RuntimeError):
        with TableWriter(buf, Layout("json")) as w:
            w.write({"a": 1})
            raise RuntimeError("boom")
    assert buf.getvalue() == b'[\n{"a": 1}'
    assert not buf.closed


def test_writer_targets_path_text_and_binary(tmp_path):
    layout = Layout("csv", ("a",))
    path = tmp_path / "o.csv"
    with TableWriter(path, layout) as w:
        w.write({"a": "x\ny"})
    assert path.read_bytes() == b'a\n"x\ny"\n'
    with open(tmp_path / "t.csv", "w", encoding="utf-8", newline="") as f:
        with TableWriter(f, layout) as w:
            w.write({"a": "é"})
        assert not f.closed
    assert (tmp_path / "t.csv").read_bytes() == "a\né\n".encode()
    with open(tmp_path / "b.csv", "wb") as fb:
        with TableWriter(fb, layout) as w:
            w.write({"a": "1"})
        fb.write(b"after\n")  # still usable by its owner
    assert (tmp_path / "b.csv").read_bytes() == b"a\n1\nafter\n"


def test_layout_is_plain_data_and_can_drive_a_writer_later(tmp_path):
    p = put(tmp_path, "data.csv", "id;t\r\n1;a\r\n")
    with open_table(p) as r:
        rows = list(r)
        stored = dataclasses.asdict(r.layout)
    assert stored == {"fmt": "csv", "columns": ("id", "t"), "delimiter": ";", "lineterminator": "\r\n", "bom": False}
    out = write_bytes(Layout(**stored), [rows[0].values])
    assert out == p.read_bytes()
    with pytest.raises(ValueError):
        Layout("xlsx")
    with pytest.raises(ValueError):
        Layout("csv", ("a",), delimiter='"')
    with pytest.raises(ValueError):
        Layout("csv", ("a",), lineterminator="\n\n")


# --- streaming: memory does not grow with file size -------------------------------------------


_FILLER = "some text to grade, " * 20  # long rows: a file of megabytes from few rows (rows cost time)


def _make_big(path: Path, fmt: str, n_rows: int) -> int:
    with open(path, "w", encoding="utf-8", newline="") as f:
        if fmt == "csv":
            f.write("id,text,score\n")
            for i in range(n_rows):
                f.write(f'{i},"row {i}: {_FILLER}, with ""quotes""",{i % 10}\n')
            f.flush()
            return path.stat().st_size
        recs = ('{"id": %d, "text": "record %d: %s", "score": %d.5}' % (i, i, _FILLER, i % 10) for i in range(n_rows))
        if fmt == "jsonl":
            for rec in recs:
                f.write(rec + "\n")
        else:
            sep = "," if fmt == "json-minified" else ",\n  "
            f.write("[" + next(recs))
            for rec in recs:
                f.write(sep + rec)
            f.write("]")
    return path.stat().st_size


def _traced_peak(path: Path, out: Path) -> tuple[int, int]:
    """(rows, peak traced bytes) for reading ``path`` and writing every row plus a column."""
    tracemalloc.start()
    try:
        n = 0
        with open_table(path) as r, TableWriter(out, r, ["grade"]) as w:
            for row in r:
                w.write({**row.values, "grade": "A"})
                n += 1
        return n, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json", "json-minified"])
def test_read_and_write_stream_with_flat_memory(tmp_path, fmt):
    ext = {"csv": "csv", "jsonl": "jsonl"}.get(fmt, "json")
    small, big = tmp_path / f"small.{ext}", tmp_path / f"big.{ext}"
    _make_big(small, fmt, 1_000)
    big_size = _make_big(big, fmt, 10_000)
    n_small, peak_small = _traced_peak(small, tmp_path / f"o1.{ext}")
    n_big, peak_big = _traced_peak(big, tmp_path / f"o2.{ext}")
    assert (n_small, n_big) == (1_000, 10_000)
    assert big_size > 2_500_000
    # ten times the rows, (nearly) the same peak -- and far below the file size
    assert peak_big < peak_small + 64 * 1024, (peak_small, peak_big)
    assert peak_big < 1_000_000 and peak_big < big_size / 4, (peak_big, big_size)


def test_import_has_no_side_effects():
    code = (
        "import csv; before = csv.field_size_limit(); import batchgrader.pipeline.tables; "
        "assert csv.field_size_limit() == before, 'field_size_limit changed at import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert csv.field_size_limit() >= 0  # reading raises the limit; never lowers it
