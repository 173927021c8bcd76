"""The fast paths of writing a result: the CSV writer's own quoting (the same bytes as
``csv.writer``) and the second read of an input the daemon has read in full before (the same
rows as the checked reader)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchgrader.pipeline.formats.common import Layout
from batchgrader.pipeline.tables import TableWriter, open_table

CELL = st.text(alphabet=st.sampled_from(list('ab ,;\t"\r\n\u00e9\u2028\x0b=')), max_size=6)


def csv_module_bytes(rows: list[list[str]], delimiter: str, lineterminator: str, bom: bool) -> bytes:
    """What the result writer wrote before: ``csv.writer`` rows ending in CRLF, the terminator
    then put in place of the CRLF (so fields holding CR or LF are always quoted)."""
    out = []
    for row in rows:
        b = io.StringIO()
        csv.writer(b, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL, lineterminator="\r\n").writerow(row)
        out.append(b.getvalue()[:-2] + lineterminator)
    text = "".join(out)
    return (("\ufeff" if bom else "") + text).encode("utf-8")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ncols=st.integers(min_value=1, max_value=4),
    data=st.data(),
    delimiter=st.sampled_from([",", ";", "\t"]),
    lineterminator=st.sampled_from(["\n", "\r\n", "\r"]),
    bom=st.booleans(),
)
def test_the_csv_writer_writes_what_the_csv_module_writes(ncols, data, delimiter, lineterminator, bom):
    names = [f"c{i}" for i in range(ncols)]
    rows = data.draw(st.lists(st.lists(CELL, min_size=ncols, max_size=ncols), max_size=8))
    layout = Layout("csv", tuple(names), delimiter, lineterminator, bom)
    out = io.BytesIO()
    with TableWriter(out, layout) as w:
        for r in rows:
            w.write(dict(zip(names, r)))
    assert out.getvalue() == csv_module_bytes([names, *rows], delimiter, lineterminator, bom)


def test_a_long_result_is_written_in_blocks_with_every_row_in_order(tmp_path):
    layout = Layout("csv", ("id", "text"), ",", "\n", False)
    rows = [[str(i), f"essay {i}, with a comma" if i % 3 else f'a "quote" {i}'] for i in range(2000)]
    path = tmp_path / "out.csv"
    with TableWriter(path, layout, ["answer"]) as w:
        for r in rows:
            w.write({"id": r[0], "text": r[1], "answer": "" if int(r[0]) % 5 else "ok\r\nfine"})
    expected = [["id", "text", "answer"], *([*r, "" if int(r[0]) % 5 else "ok\r\nfine"] for r in rows)]
    assert path.read_bytes() == csv_module_bytes(expected, ",", "\n", False)


# --- the second read of a validated input --------------------------------------------------------------

FIELD = st.text(alphabet=st.sampled_from(list('ab ,"\r\n\u00e9')), max_size=5)


def encode_csv(rows: list[list[str]], lineterminator: str) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=lineterminator, quoting=csv.QUOTE_MINIMAL).writerows(rows)
    return buf.getvalue()


def rows_of(path: Path, **kw) -> list[tuple[int, int, dict[str, str]]]:
    with open_table(path, **kw) as r:
        return [(row.number, row.line, row.values) for row in r]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.lists(FIELD, min_size=2, max_size=2), min_size=1, max_size=8),
    lineterminator=st.sampled_from(["\n", "\r\n", "\r"]),
    blank_lines=st.lists(st.integers(min_value=0, max_value=8), max_size=3),
    bom=st.booleans(),
    quoted_header=st.booleans(),
)
def test_a_validated_csv_is_read_again_as_the_checked_reader_reads_it(
    tmp_path, rows, lineterminator, blank_lines, bom, quoted_header
):
    header = ["id", "te\nxt" if quoted_header else "text"]
    body = encode_csv([header], lineterminator) + "".join(  # empty lines after some records
        encode_csv([r], lineterminator) + (lineterminator if i in blank_lines else "") for i, r in enumerate(rows)
    )
    path = tmp_path / "in.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode("utf-8"))
    try:
        checked = rows_of(path)
    except ValueError:  # e.g. a file whose every row is empty: both readers refuse it
        return
    assert rows_of(path, validated=True) == checked
    with open_table(path, validated=True) as a, open_table(path) as b:
        assert a.layout == b.layout and a.columns == b.columns


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.lists(FIELD, min_size=2, max_size=2), st.booleans()), min_size=1, max_size=8),
    answers=st.lists(FIELD, min_size=4, max_size=4),
    lineterminator=st.sampled_from(["\n", "\r\n"]),
    delimiter=st.sampled_from([",", "\t"]),
)
def test_a_result_that_copies_the_validated_lines_is_the_one_written_from_the_values(
    tmp_path, rows, answers, lineterminator, delimiter
):
    """The second read of a validated CSV keeps a quote-free line's text (``Row.text``), and a
    writer of its layout copies it instead of joining the cells again: the result is byte for
    byte the one written from the values, whatever the quoting of the input (minimal, or every
    cell quoted) and of the added cell."""
    body = "".join(
        encode_csv_dialect([r], lineterminator, delimiter, csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
        for r, quote_all in rows
    )
    path = tmp_path / ("in.tsv" if delimiter == "\t" else "in.csv")
    path.write_bytes((encode_csv_dialect([["id", "text"]], lineterminator, delimiter, csv.QUOTE_MINIMAL) + body).encode())
    try:
        rows_of(path)
    except ValueError:  # e.g. every row empty: refused
        return
    outputs = []
    for copy in (True, False):
        out = tmp_path / f"out-{copy}.csv"
        texts = 0
        with open_table(path, validated=True) as reader, TableWriter(out, reader, ["answer"]) as w:
            for i, row in enumerate(reader):
                values = {**row.values, "answer": answers[i % len(answers)]}
                if copy and row.text is not None:
                    texts += 1
                    w.write(values, row.text)
                else:
                    w.write(values)
        outputs.append(out.read_bytes())
        if copy:  # at least every line of plain cells was copied
            plain = [r for r, quote_all in rows if not quote_all and not any(c in f for f in r for c in '"\r\n' + delimiter)]
            assert texts >= len(plain)
    assert outputs[0] == outputs[1]


def encode_csv_dialect(rows: list[list[str]], lineterminator: str, delimiter: str, quoting: int) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=lineterminator, delimiter=delimiter, quoting=quoting).writerows(rows)
    return buf.getvalue()


def test_a_validated_read_of_another_encoding_gives_the_same_rows(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes('id,text\n1,caf\u00e9\n2,na\u00efve, "quoted"\n'.replace(', "quoted"', "").encode("cp1252"))
    assert rows_of(path, encoding="cp1252", validated=True) == rows_of(path, encoding="cp1252")
    assert rows_of(path, encoding="cp1252", validated=True)[1][2] == {"id": "2", "text": "na\u00efve"}
