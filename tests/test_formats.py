"""Excel and Parquet inputs: end to end over the emulator, value by value and type by type; bad input."""

from __future__ import annotations

import datetime
import io
import json
import zipfile

import openpyxl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.pipeline.outbox import result_name
from batchgrader.pipeline.tables import InputError, open_table, text_of
from harness import FAST_CONFIG, TEST_KEY, bgctl

pytestmark = pytest.mark.timeout(300)

SCHEMA_CONFIG = """\
response_format:
  type: object
  properties:
    score: {type: integer}
    label: {type: string, enum: [good, bad]}
  required: [score, label]
  additionalProperties: false
"""


def _workbook(path):
    wb = openpyxl.Workbook()
    notes = wb.active
    notes.title = "Notes"
    notes.append(["about", "total"])
    notes.append(["kept as is", "=1+2"])
    data = wb.create_sheet("Data")
    data.append(["id", "response", "when", "amount", "note"])
    data.append([1, "first answer", datetime.datetime(2024, 1, 2, 3, 4, 5), 1.5, None])
    data.append([2, "second answer", datetime.datetime(2023, 12, 31), None, "n"])
    data.append([None, None, None, None, None])  # an empty row: skipped, kept in the result
    data.append([3, "=HYPERLINK(1)", datetime.datetime(2022, 6, 1), 7, ""])
    wb.save(path)


@pytest.mark.slow
def test_xlsx_second_sheet_end_to_end_keeps_values_and_types(home):
    home.config_file.write_text(FAST_CONFIG + "sheet: Data\n" + SCHEMA_CONFIG)
    _workbook(home.inbox / "grades.xlsx")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    out = home.outbox / "grades_results.xlsx"
    wb = openpyxl.load_workbook(out)
    assert wb.sheetnames == ["Notes", "Data"]
    assert [[c.value for c in r] for r in wb["Notes"].iter_rows()] == [["about", "total"], ["kept as is", "=1+2"]]
    rows = [[c.value for c in r] for r in wb["Data"].iter_rows()]
    assert rows[0][:7] == ["id", "response", "when", "amount", "note", "answered_by", "grade"]
    assert sorted(rows[0][7:9]) == ["label", "score"] and rows[0][9:] == ["input_tokens", "output_tokens", "error"]
    at = {name: i for i, name in enumerate(rows[0])}
    original = [
        [1, "first answer", datetime.datetime(2024, 1, 2, 3, 4, 5), 1.5, None],
        [2, "second answer", datetime.datetime(2023, 12, 31), None, "n"],
        [None, None, None, None, None],
        [3, "=HYPERLINK(1)", datetime.datetime(2022, 6, 1), 7, None],
    ]
    assert [r[:5] for r in rows[1:]] == original
    assert rows[3][5:] == [None] * 7  # the empty row gets no result
    for r in (rows[1], rows[2], rows[4]):
        grade, score, label = r[at["grade"]], r[at["score"]], r[at["label"]]
        tin, tout, err = r[at["input_tokens"]], r[at["output_tokens"]], r[at["error"]]
        assert err is None and r[at["answered_by"]] == "batch"
        assert isinstance(score, int) and not isinstance(score, bool)
        assert label in ("good", "bad")
        assert isinstance(tin, int) and tin > 0 and isinstance(tout, int) and tout > 0
        assert isinstance(grade, str) and grade.startswith("{")
    # added text cells are text, never formulas; input cells stay as they were
    assert wb["Data"].cell(row=2, column=7).data_type == "s"
    assert wb["Data"].cell(row=2, column=3).is_date and wb["Data"].cell(row=3, column=4).value is None


def _parquet_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([10, 20, 30, 40], pa.int32()),
            "response": pa.array(["alpha", "beta", None, "delta"], pa.string()),
            "weight": pa.array([0.5, None, 2.25, -1.0], pa.float64()),
            "seen": pa.array(
                [datetime.datetime(2024, 1, 1, 12), None, datetime.datetime(2020, 2, 29), datetime.datetime(1999, 12, 31)],
                pa.timestamp("ms"),
            ),
            "nothing": pa.array([None] * 4, pa.null()),
        }
    )


@pytest.mark.slow
def test_parquet_end_to_end_keeps_types_and_order_and_types_added_columns(home):
    home.config_file.write_text(FAST_CONFIG + SCHEMA_CONFIG)
    table = _parquet_table()
    pq.write_table(table, home.inbox / "data.parquet", row_group_size=3)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=2)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    out = pq.read_table(home.outbox / "data_results.parquet")
    for name in table.column_names:
        assert out.schema.field(name).type == table.schema.field(name).type
        assert out.column(name).to_pylist() == table.column(name).to_pylist()
    assert out.schema.field("input_tokens").type == pa.int64()
    assert out.schema.field("output_tokens").type == pa.int64()
    assert out.schema.field("score").type == pa.int64()
    assert out.schema.field("label").type == pa.string()
    assert out.schema.field("grade").type == pa.string()
    assert all(t > 0 for t in out.column("input_tokens").to_pylist())
    assert set(out.column("label").to_pylist()) <= {"good", "bad"}
    assert out.column("error").to_pylist() == [None] * 4


@pytest.mark.slow  # runs bgctl count as a process on both formats (over 5 s)
def test_count_reads_excel_and_parquet(home, tmp_path):
    _workbook(tmp_path / "w.xlsx")
    pq.write_table(_parquet_table(), tmp_path / "p.parquet")
    home.config_file.write_text("sheet: Data\n")
    for name, rows in (("w.xlsx", 3), ("p.parquet", 4)):
        r = bgctl(home.root, "count", str(tmp_path / name), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["rows"] == rows


def test_result_name_for_excel_and_parquet():
    assert result_name("a.xlsm") == "a_results.xlsx"
    assert result_name("a.XLSX") == "a_results.xlsx"
    assert result_name("a.parquet") == "a_results.parquet"


def test_encoding_cp1252_csv_is_read(tmp_path):
    p = tmp_path / "w.csv"
    p.write_bytes("id,response\n1,Jos\u00e9 \u20ac\n".encode("cp1252"))
    with pytest.raises(InputError, match="not valid UTF-8"):
        list(open_table(p))
    with open_table(p, encoding="cp1252") as r:
        assert [row.values for row in r] == [{"id": "1", "response": "Jos\u00e9 \u20ac"}]
        assert r.layout.bom  # the UTF-8 result carries a BOM for spreadsheets


@pytest.mark.parametrize("name", ["w.jsonl", "w.json"])
def test_encoding_latin1_json_is_read(tmp_path, name):
    p = tmp_path / name
    rec = '{"id": 1, "response": "Se\u00f1or caf\u00e9"}'
    text = rec + "\n" if name.endswith("l") else "[" + rec + "]\n"
    p.write_bytes(json.loads(json.dumps(text)).encode("latin-1"))
    with open_table(p, encoding="latin-1") as r:
        assert [row.values["response"] for row in r] == ["Se\u00f1or caf\u00e9"]


# --- bad input ---------------------------------------------------------------------------------


def test_excel_missing_sheet_names_the_sheets(tmp_path):
    _workbook(tmp_path / "w.xlsx")
    with pytest.raises(InputError) as ei:
        open_table(tmp_path / "w.xlsx", sheet="Grades")
    assert "no sheet named 'Grades'" in str(ei.value) and "'Notes', 'Data'" in str(ei.value)


def test_excel_empty_sheet_and_duplicate_header(tmp_path):
    wb = openpyxl.Workbook()
    wb.active.title = "Empty"
    dup = wb.create_sheet("Dup")
    dup.append(["a", "b", "a"])
    dup.append([1, 2, 3])
    wb.save(tmp_path / "w.xlsx")
    with pytest.raises(InputError, match="sheet 'Empty' is empty"):
        open_table(tmp_path / "w.xlsx")
    with pytest.raises(InputError) as ei:
        open_table(tmp_path / "w.xlsx", sheet="Dup")
    assert ei.value.column == "a" and "sheet 'Dup'" in str(ei.value) and "columns A, C" in str(ei.value)


def test_excel_encrypted_and_corrupt(tmp_path):
    enc = tmp_path / "enc.xlsx"
    enc.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 600)
    with pytest.raises(InputError, match="password-protected"):
        open_table(enc)
    bad = tmp_path / "bad.xlsx"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("hello.txt", "not a workbook")
    bad.write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="not a readable .xlsx workbook"):
        open_table(bad)


def _padded_workbook(path, part_bytes: int) -> None:
    """A readable workbook with one more part of ``part_bytes`` zeros: a few KB on disk that
    inflate to ``part_bytes`` (a zip bomb's shape; openpyxl itself never reads the part)."""
    _workbook(path)
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as z, z.open("xl/media/pad.bin", "w") as part:
        block = bytes(1024 * 1024)
        for _ in range(part_bytes // len(block)):
            part.write(block)


def test_excel_inflating_past_the_limit_is_refused_before_it_is_read(tmp_path):
    from batchgrader.pipeline.formats.common import MAX_WORKBOOK_INFLATED_BYTES

    path = tmp_path / "big.xlsx"
    _padded_workbook(path, MAX_WORKBOOK_INFLATED_BYTES + 1024 * 1024)
    assert path.stat().st_size < 1024 * 1024
    with pytest.raises(InputError) as ei:
        open_table(path)
    msg = str(ei.value)
    assert msg.startswith("big.xlsx: the workbook inflates to 129.0 MiB") and "over the limit of 128.0 MiB" in msg
    assert "save the sheet as CSV or Parquet" in msg


def test_excel_part_compressed_like_a_zip_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.xlsx"
    _padded_workbook(path, 8 * 1024 * 1024)  # about 1000 times
    with pytest.raises(InputError) as ei:
        open_table(path)
    assert "part 'xl/media/pad.bin' inflates" in str(ei.value) and "over the limit of 100 times" in str(ei.value)
    with open(path, "rb") as f:  # a stream too
        with pytest.raises(InputError, match="zip bomb"):
            open_table(f, fmt="xlsx")
    _workbook(path)  # an ordinary workbook is read as before
    with open_table(path, sheet="Data") as t:
        assert len(list(t)) == 3


def test_parquet_nested_and_duplicate_columns(tmp_path):
    pq.write_table(pa.table({"id": [1], "tags": pa.array([["a", "b"]])}), tmp_path / "n.parquet")
    with pytest.raises(InputError) as ei:
        open_table(tmp_path / "n.parquet")
    assert ei.value.column == "tags" and "nested type" in str(ei.value)
    t = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    pq.write_table(t, tmp_path / "d.parquet")
    with pytest.raises(InputError) as ei:
        open_table(tmp_path / "d.parquet")
    assert ei.value.column == "x" and "duplicate" in str(ei.value)


@pytest.mark.slow
def test_bad_workbook_in_inbox_fails_with_a_report_and_the_daemon_goes_on(home):
    home.config_file.write_text(FAST_CONFIG + "sheet: Missing\n")
    _workbook(home.inbox / "w.xlsx")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 4  # a job ended failed
    report = (home.outbox / "w_error.txt").read_text()
    assert "no sheet named 'Missing'" in report
    assert [p.name for p in home.failed.iterdir() if p.suffix == ".xlsx"]


def test_shipped_examples_match_the_repository_and_bgctl_examples_copies_them(home, tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    shipped = repo / "src" / "batchgrader" / "data" / "examples"
    assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in (repo / "examples").iterdir())
    for p in shipped.iterdir():
        assert p.read_bytes() == (repo / "examples" / p.name).read_bytes()
    r = bgctl(home.root, "examples", str(tmp_path / "ex"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ex" / "reviews.csv").read_bytes() == (repo / "examples" / "reviews.csv").read_bytes()


def test_excel_added_cells_are_text_and_guarded(tmp_path):
    from batchgrader.pipeline.tables import TableWriter

    _workbook(tmp_path / "w.xlsx")
    with open_table(tmp_path / "w.xlsx", sheet="Data") as r, open(tmp_path / "o.xlsx", "wb") as f:
        with TableWriter(f, r, ["grade", "raw"], formula_guard=True) as w:
            for _row in r:
                w.write({"grade": '=HYPERLINK("http://x")', "raw": -5})
    ws = openpyxl.load_workbook(tmp_path / "o.xlsx")["Data"]
    assert ws.cell(row=1, column=6).value == "grade" and ws.cell(row=1, column=7).value == "raw"
    for line in (2, 3, 5):
        cell = ws.cell(row=line, column=6)
        assert cell.value == '\'=HYPERLINK("http://x")' and cell.data_type == "s"
        assert ws.cell(row=line, column=7).value == -5
    assert ws.cell(row=4, column=6).value is None  # the empty row stays empty


# --- reading Excel through pandas ------------------------------------------------------------


def _typed_workbook(path):
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "T"
    ws.append([None])  # a blank first row: the header is the first non-empty row
    ws.append(["id", "text", "when", "at", "flag", "whole", "ratio", "err"])
    ws.append([1, "NA", datetime.datetime(2024, 2, 29, 23, 59, 1), datetime.time(7, 30), True, 2.0, 0.25, "#N/A"])
    ws.append([2, "nan", datetime.datetime(1999, 1, 1), None, False, -3, None, "#DIV/0!"])
    ws.append([None] * 8)  # an empty row: skipped
    ws.append([None, None, None, None, None, None, None, "#REF!"])  # only an error cell: still a data row
    ws.append([3, "  spaced  ", None, None, None, None, 1e-9, None])
    for row in (3, 4, 6):  # error cells, as Excel stores them (cell type "e")
        ws.cell(row=row, column=8).data_type = "e"
    wb.save(path)


def test_excel_values_keep_their_types_empty_cells_are_none_and_errors_read_as_empty(tmp_path):
    _typed_workbook(tmp_path / "t.xlsx")
    with open_table(tmp_path / "t.xlsx") as r:
        assert r.columns == ["id", "text", "when", "at", "flag", "whole", "ratio", "err"]
        rows = list(r)
    assert [row.line for row in rows] == [3, 4, 6, 7]
    assert [row.number for row in rows] == [1, 2, 3, 4]
    got = [list(row.values.values()) for row in rows]
    assert got == [
        [1, "NA", datetime.datetime(2024, 2, 29, 23, 59, 1), datetime.time(7, 30), True, 2, 0.25, None],
        [2, "nan", datetime.datetime(1999, 1, 1), None, False, -3, None, None],
        [None, None, None, None, None, None, None, None],
        [3, "  spaced  ", None, None, None, None, 1e-9, None],
    ]
    types = [[type(v) for v in row] for row in got]
    assert types[0] == [int, str, datetime.datetime, datetime.time, bool, int, float, type(None)]
    assert types[1][4] is bool and types[1][5] is int
    # what a prompt gets for each (text_of): an error cell and an empty cell are both empty text
    assert [text_of(v) for v in got[0]] == ["1", "NA", "2024-02-29 23:59:01", "07:30:00", "true", "2", "0.25", ""]


def test_excel_duplicate_header_is_reported_raw_not_renamed(tmp_path):
    wb = openpyxl.Workbook()
    wb.active.append(["score", "text", "score", "score"])
    wb.active.append([1, "a", 2, 3])
    wb.save(tmp_path / "d.xlsx")
    with pytest.raises(InputError) as ei:
        open_table(tmp_path / "d.xlsx")
    assert ei.value.column == "score" and "columns A, C, D" in str(ei.value) and "score.1" not in str(ei.value)


def test_excel_error_in_header_and_value_right_of_header(tmp_path):
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["id", "#N/A"])
    ws.cell(row=1, column=2).data_type = "e"
    ws.append([1, 2])
    other = wb.create_sheet("Wide")
    other.append(["id", "text"])
    other.append([1, "a"])
    other.append([2, "b", None, "stray"])
    wb.save(tmp_path / "h.xlsx")
    with pytest.raises(InputError, match="header column B is an error value"):
        open_table(tmp_path / "h.xlsx")
    with open_table(tmp_path / "h.xlsx", sheet="Wide") as r:
        with pytest.raises(InputError) as ei:
            list(r)
    assert ei.value.line == 3 and "column D, right of the header" in str(ei.value)


def test_excel_writer_puts_cells_beside_the_rows_pandas_read(tmp_path):
    from batchgrader.pipeline.tables import TableWriter

    _typed_workbook(tmp_path / "t.xlsx")
    with open_table(tmp_path / "t.xlsx") as r, open(tmp_path / "o.xlsx", "wb") as f:
        assert r.layout.data_lines == (3, 4, 6, 7)
        with TableWriter(f, r, ["grade"]) as w:
            for row in r:
                w.write({"grade": f"row {row.number}"})
    ws = openpyxl.load_workbook(tmp_path / "o.xlsx")["T"]
    assert [ws.cell(row=n, column=9).value for n in range(1, 8)] == [None, "grade", "row 1", "row 2", None, "row 3", "row 4"]
    assert ws.cell(row=3, column=8).value == "#N/A" and ws.cell(row=3, column=8).data_type == "e"  # kept as it was
    assert ws.cell(row=3, column=6).value == 2 and ws.cell(row=4, column=5).value is False


def test_pandas_is_not_imported_at_bgctl_start_up():
    import subprocess
    import sys

    code = "import sys, batchgrader.cli, batchgrader.pipeline.tables; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- charts and images: the result workbook may lose them --------------------------------------


def _workbook_with_chart(path):
    from openpyxl.chart import BarChart, Reference

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["id", "response"])
    for i in range(1, 4):
        ws.append([i, f"answer {i}"])
    chart = BarChart()
    chart.add_data(Reference(ws, min_col=1, min_row=1, max_row=4), titles_from_data=True)
    ws.add_chart(chart, "E2")
    wb.save(path)


def test_excel_with_a_chart_warns_in_count_and_in_the_jobs_events_and_status(home, tmp_path):
    from ticks import Rig

    _workbook_with_chart(tmp_path / "c.xlsx")
    with open_table(tmp_path / "c.xlsx") as r:
        assert len(r.warnings) == 1 and "1 chart(s) and 0 image(s)" in r.warnings[0]
    _workbook(tmp_path / "plain.xlsx")
    with open_table(tmp_path / "plain.xlsx", sheet="Data") as r:
        assert r.warnings == []
    out = CliRunner().invoke(cli, ["count", str(tmp_path / "c.xlsx"), "--json"])  # in process: tests/test_prepare.py
    assert out.exit_code == 0, out.output
    assert any("chart" in w for w in json.loads(out.stdout)["warnings"])

    rig = Rig(home)
    try:
        _workbook_with_chart(home.inbox / "c.xlsx")
        rig.tick()
        assert rig.tick()[:2] == ["JobAccepted", "JobPrepared"]
        (prepared,) = rig.events("JobPrepared")
        assert any("openpyxl, which may drop or change them" in w for w in prepared["warnings"])
        assert any("chart" in w for w in rig.job().warnings)  # what bgctl status shows
    finally:
        rig.close()
