"""`bgctl report JOB --disagreements FILE`: the labelled rows whose answer differs from the
human label, with ``samples: k`` the rows whose samples disagree, and for a judge panel the rows
whose judges disagree (reports/report_panel.py), written in the input's format, ready to be
labelled again and fed back.

A row's samples disagree when two of them answered differently, or their vote failed
(``no_majority``); such a row also keeps the ``samples`` column (its k answers).

A row is written when its ``reference_column`` label is not empty, it was answered, and the
answer compared with the label (``reference_field``, or the output column) differs from it the
way :mod:`batchgrader.reports.agreement` compares (case and surrounding space ignored, numbers
as numbers).  Each row keeps the input's columns as they are in the result file (the label
column with them, to be corrected) and gains one column, :data:`ANSWER_COLUMN`, holding the
answer (renamed ``bg_model_answer`` and so on if the input has such a column).  The file is
written atomically; an existing file is never replaced.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

from batchgrader.reports.report import read_events_of, result_layout

ANSWER_COLUMN = "model_answer"


class DisagreementsError(ValueError):
    """The job has nothing to compare (no reference column, no result file)."""


def write_disagreements(home: Any, job_id: str, dest: Path) -> dict[str, Any]:
    """Write the disagreements of the job ``job_id`` to ``dest``; returns ``{"path", "rows",
    "compared", "format"}``."""
    from batchgrader.core.log.state import fold
    from batchgrader.pipeline.tables import open_table

    events = read_events_of(home, job_id)
    job = fold(events).jobs[events[0].job_id]
    settings = job.settings
    if job.panel is not None:  # a judge panel: the rows its judges disagree on (reports/report_panel.py)
        from batchgrader.reports.report_panel import write_panel_disagreements

        return write_panel_disagreements(job, dest)
    if not settings.get("reference_column") and not _has_samples(job):
        raise DisagreementsError(
            f"job {job.job_id} has no reference_column: set 'reference_column' (the column of human labels) "
            f"in profile {job.profile or 'default'!r} and run the labelled rows again (or 'samples' above 1, "
            "to find the rows whose samples disagree)"
        )
    if not job.result_path or not Path(job.result_path).exists():
        raise DisagreementsError(f"job {job.job_id} has no result file to compare (state {job.state})")
    with open_table(Path(job.result_path), sheet=settings.get("sheet"), validated=True) as reader:
        lay = result_layout(list(reader.columns), settings)
        if (not lay.reference or not lay.compared) and not lay.samples:
            raise DisagreementsError(
                f"the result file {job.result_path} has no column {settings['reference_column']!r} "
                "or no answer column to compare it with"
            )
        answer_column = ANSWER_COLUMN
        while answer_column in lay.inputs:
            answer_column = "bg_" + answer_column
        rows, compared, split = _disagreeing(reader, lay, answer_column)
        fmt, layout = reader.fmt, getattr(reader, "layout", None)
    data = _encode(fmt, layout, [*lay.inputs, answer_column, *([lay.samples] if lay.samples else [])], rows)
    from batchgrader.fsio import atomic_write_bytes

    atomic_write_bytes(dest, data, overwrite=False)
    out = {"path": str(dest), "rows": len(rows), "compared": compared, "format": fmt}
    if lay.samples:
        out["samples_disagree"] = split
    return out


def _has_samples(job: Any) -> bool:
    """Whether the job asked for several samples per row (its result then has their column)."""
    if int(job.settings.get("samples") or 1) > 1:
        return True
    if not job.result_path or not Path(job.result_path).exists():
        return False
    from batchgrader.pipeline.tables import open_table

    with open_table(Path(job.result_path), sheet=job.settings.get("sheet"), validated=True) as reader:
        return result_layout(list(reader.columns), job.settings).samples is not None


def _disagreeing(reader: Any, lay: Any, answer_column: str) -> tuple[list[dict[str, Any]], int, int]:
    """The rows to write, the labelled rows compared, and the rows whose samples disagree."""
    from batchgrader.pipeline.tables import text_of
    from batchgrader.reports.agreement import normal

    out: list[dict[str, Any]] = []
    compared = split = 0
    for row in reader:
        vals = row.values
        split_row = bool(lay.samples) and samples_disagree(vals.get(lay.samples), text_of(vals.get(lay.error)))
        split += split_row
        label, answer = (vals.get(lay.reference), vals.get(lay.compared)) if lay.reference and lay.compared else (None, None)
        differs = False
        if text_of(label).strip() and not (lay.error and text_of(vals.get(lay.error))) and text_of(answer).strip():
            compared += 1
            differs = normal(text_of(label)) != normal(text_of(answer))
        if differs or split_row:
            kept = {**{c: vals.get(c) for c in lay.inputs}, answer_column: vals.get(lay.compared or lay.output)}
            if lay.samples:
                kept[lay.samples] = vals.get(lay.samples)
            out.append(kept)
    return out, compared, split


def samples_disagree(cell: Any, error: str) -> bool:
    """Whether a row's samples disagree: two different answers among them, or a vote that failed
    (``no_majority``).  A sample that failed is not a disagreement."""
    from batchgrader.pipeline.samples import NO_MAJORITY
    from batchgrader.reports.agreement import normal
    from batchgrader.reports.reliability import samples_of

    if error.startswith(NO_MAJORITY):
        return True
    samples = samples_of(cell) or []
    return len({normal(v) for v in samples if v is not None and str(v).strip()}) > 1


def _encode(fmt: str, layout: Any, columns: list[str], rows: list[dict[str, Any]]) -> bytes:
    """``rows`` as a file of format ``fmt`` (CSV/TSV and JSON/JSONL laid out as the input)."""
    if fmt == "xlsx":
        import openpyxl

        wb = openpyxl.Workbook()
        ws = wb.active
        ws.append(columns)
        for r in rows:
            ws.append([_cell(r.get(c)) for c in columns])
        buf = io.BytesIO()
        wb.save(buf)
        return buf.getvalue()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{c: _cell(r.get(c)) for c in columns} for r in rows]) if rows else None
        if table is None:
            table = pa.table({c: pa.array([], type=pa.string()) for c in columns})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()
    from batchgrader.pipeline.tables import TableWriter

    buf = io.BytesIO()
    with TableWriter(buf, dataclasses.replace(layout, columns=tuple(columns)), ()) as w:
        for r in rows:
            w.write(r)
    return buf.getvalue()


def _cell(v: Any) -> Any:
    from batchgrader.pipeline.tables import text_of

    return v if v is None or isinstance(v, (str, int, float, bool)) else text_of(v)


def disagreements_line(d: dict[str, Any]) -> str:
    """The line `bgctl report --disagreements` prints for :func:`write_disagreements`'s result:
    each count "X of N" is out of the rows it was counted among (X <= N)."""
    if "judges_disagree" in d:  # a judge panel
        labels = (
            f"; {d['label_differs']:,} of {d['compared']:,} labelled consensus answers differ from their label"
            if d.get("compared")
            else ""
        )
        return (
            f"Disagreements: {d['rows']:,} rows written: the judges disagree on {d['judges_disagree']:,} of "
            f"{d['panel_rows']:,} rows{labels}: {d['path']}"
        )
    if "samples_disagree" in d:
        split = f"; {d['samples_disagree']:,} rows whose samples disagree"
        return f"Disagreements: {d['rows']:,} rows: {d['compared']:,} labelled answers compared{split}: {d['path']}"
    return f"Disagreements: {d['rows']:,} of {d['compared']:,} labelled answers differ from their label: {d['path']}"
