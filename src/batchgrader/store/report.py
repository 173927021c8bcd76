"""`bgctl report JOB`: how a job went, computed from its events and its result file.

Figures (all in :func:`build_report`'s dict, which ``--json`` prints as is):

* ``rows``: rows in the result file, answered (empty error cell), failed by error code (the
  text before the first ``:`` of the error cell), and answered on retry (rows answered in a
  chunk planned by ``RetryPlanned``, from that chunk's stored per-row results);
* ``tokens`` and ``cost_usd``: billed figures (the ``TokensUsed`` events) next to the
  estimate made before sending (``JobPrepared``);
* ``phases``: seconds between the events that bound each phase;
* ``columns``: for each result column (the answer column and every structured-output field),
  the distribution of its values: a histogram when every value is a number, else the counts of
  the most frequent values;
* ``failed_rows``: the first 50 failed rows and their errors.

Nothing here writes; the HTML page is :mod:`batchgrader.store.report_html`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from batchgrader.store.eventstore import Event

MAX_FAILED_ROWS = 50
MAX_CATEGORIES = 12
HISTOGRAM_BINS = 10


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return round((datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds(), 3)


def _phases(events: Sequence[Event]) -> list[dict[str, Any]]:
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for e in events:
        first.setdefault(e.type, e.ts)
        last[e.type] = e.ts
    end = next((e.ts for e in reversed(events) if e.type in ("JobCompleted", "JobFailed", "JobCancelled")), None)
    start = events[0].ts if events else None
    spans = [
        ("prepare", first.get("JobAccepted"), first.get("JobPrepared")),
        ("submit", first.get("JobPrepared"), first.get("BatchCreated")),
        ("batches (incl. retries)", first.get("BatchCreated"), last.get("ChunkCompleted")),
        ("write result", last.get("ChunkCompleted") or first.get("JobPrepared"), first.get("ResultWritten")),
        ("total", start, end),
    ]
    return [{"phase": name, "seconds": _seconds(a, b)} for name, a, b in spans]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def distribution(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The distribution of one column: a histogram of numbers, or counts of categories."""
    from batchgrader.pipeline.tables import text_of

    present = [v for v in values if v is not None and v != ""]
    out: dict[str, Any] = {"name": name, "values": len(present), "missing": len(values) - len(present)}
    nums = [_number(v) for v in present]
    if present and all(n is not None for n in nums):
        xs = [n for n in nums if n is not None]
        out["kind"] = "numeric"
        out["min"], out["max"] = min(xs), max(xs)
        out["mean"] = sum(xs) / len(xs)
        distinct = sorted(set(xs))
        if all(x.is_integer() for x in distinct) and len(distinct) <= 2 * HISTOGRAM_BINS:
            int_counts = Counter(xs)
            out["bins"] = [{"low": x, "high": x, "count": int_counts[x]} for x in distinct]
        else:
            lo, hi = out["min"], out["max"]
            width = (hi - lo) / HISTOGRAM_BINS or 1.0
            bins = [0] * HISTOGRAM_BINS
            for x in xs:
                bins[min(int((x - lo) / width), HISTOGRAM_BINS - 1)] += 1
            out["bins"] = [{"low": lo + i * width, "high": lo + (i + 1) * width, "count": c} for i, c in enumerate(bins)]
        return out
    counts: Counter[str] = Counter(text_of(v) for v in present)
    top = counts.most_common(MAX_CATEGORIES)
    out["kind"] = "categorical"
    out["distinct"] = len(counts)
    out["counts"] = [{"value": v, "count": c} for v, c in top]
    out["other"] = sum(counts.values()) - sum(c for _v, c in top)
    return out


def _answered_on_retry(events: Sequence[Event], chunk_results: dict[int, str]) -> int | None:
    retry_chunks = [e.payload["chunk"] for e in events if e.type == "RetryPlanned"]
    answered: set[str] = set()
    for c in retry_chunks:
        path = chunk_results.get(c)
        if path is None:
            continue
        if not Path(path).exists():
            return None
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("ok"):
                    answered.add(rec["custom_id"])
    return len(answered)


def _result_columns(header: list[str], settings: dict[str, Any]) -> tuple[list[str], str | None, list[str]]:
    """(result columns to chart, the error column, the input columns) of a result file."""
    from batchgrader.pipeline.outbox import added_columns

    rf = settings.get("response_format")
    schema = (rf or {}).get("json_schema", {}).get("schema") if rf else None
    n_fields = len((schema or {}).get("properties") or {}) if isinstance(schema, dict) else 0
    n_added = 4 + n_fields
    if len(header) < n_added:
        return [], None, header
    inputs = header[:-n_added]
    cols = added_columns(inputs, settings.get("output_column") or "grade", rf)
    if cols.names() != header[-n_added:]:
        return [], None, header
    return [cols.output, *(c for _f, c in cols.fields)], cols.error, inputs


def _read_result(path: str, settings: dict[str, Any]) -> dict[str, Any]:
    from batchgrader.pipeline.tables import open_table, text_of

    with open_table(Path(path), sheet=settings.get("sheet")) as reader:
        charted, error_col, inputs = _result_columns(list(reader.columns), settings)
        values: dict[str, list[Any]] = {c: [] for c in charted}
        rows = answered = 0
        by_code: Counter[str] = Counter()
        failed: list[dict[str, Any]] = []
        for row in reader:
            rows += 1
            err = text_of(row.values.get(error_col)) if error_col else ""
            if err:
                code = err.split(":", 1)[0].strip() if ":" in err else err
                by_code[code] += 1
                if len(failed) < MAX_FAILED_ROWS:
                    first = {k: text_of(row.values[k])[:80] for k in inputs[:2]}
                    failed.append({"row": row.number, "input": first, "error": err})
                continue
            answered += 1
            for c in charted:
                values[c].append(row.values.get(c))
    return {
        "rows": rows,
        "answered": answered,
        "failed": sum(by_code.values()),
        "failed_by_code": dict(by_code.most_common()),
        "columns": [distribution(c, values[c]) for c in charted],
        "failed_rows": failed,
    }


def build_report(events: Sequence[Event]) -> dict[str, Any]:
    """The report of one job from its events (in order) and the files they name."""
    from batchgrader.core.state import fold

    if not events:
        raise ValueError("no events")
    job = fold(events).jobs[events[0].job_id]
    prepared = next((e.payload for e in events if e.type == "JobPrepared"), {})
    chunk_results = {c.index: c.results_path for c in job.chunks.values() if c.results_path}
    report: dict[str, Any] = {
        "job": {
            "id": job.job_id,
            "file": job.file,
            "state": job.state,
            "profile": job.profile,
            "model": job.model,
            "sandbox": job.sandbox,
            "result_path": job.result_path,
            "error_path": job.error_path,
            "error": (job.error or {}).get("error"),
        },
        "tokens": {
            "estimated_input": prepared.get("input_tokens"),
            "prompt": job.prompt_tokens,
            "cached": job.cached_tokens,
            "completion": job.completion_tokens,
            "reasoning": job.reasoning_tokens,
        },
        "cost_usd": {"billed": round(job.cost_usd, 6), "estimate": job.estimate},
        "phases": _phases(events),
    }
    rows: dict[str, Any] = {"total": job.rows, "answered_on_retry": _answered_on_retry(events, chunk_results)}
    columns: list[dict[str, Any]] = []
    failed_rows: list[dict[str, Any]] = []
    if job.result_path and Path(job.result_path).exists():
        figures = _read_result(job.result_path, job.settings)
        rows.update(answered=figures["answered"], failed=figures["failed"], failed_by_code=figures["failed_by_code"])
        rows["in_result"] = figures["rows"]
        columns, failed_rows = figures["columns"], figures["failed_rows"]
    else:
        rows.update(answered=job.succeeded_rows, failed=len(job.failed_rows) + len(job.row_errors))
        codes: Counter[str] = Counter(str(i.get("code")) for i in [*job.failed_rows.values(), *job.row_errors.values()])
        rows["failed_by_code"] = dict(codes.most_common())
    report["rows"] = rows
    report["columns"] = columns
    report["failed_rows"] = failed_rows
    return report


def load_report(home: Any, job_id: str) -> dict[str, Any]:
    """The report of the job ``job_id`` (or a unique prefix of it) in ``home``."""
    from batchgrader.store.eventstore import read_events
    from batchgrader.store.queries import reading, resolve_job

    with reading(home) as conn:
        jid = resolve_job(conn, job_id)
        events = list(read_events(conn, job_id=jid))
    return build_report(events)


def _fmt_num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"


def render_text(report: dict[str, Any], width: int = 40) -> str:
    """The compact terminal summary."""
    j, r, t, c = report["job"], report["rows"], report["tokens"], report["cost_usd"]
    lines = [f"job {j['id']}  {j['file']}  {j['state']}" + ("  (SIMULATED)" if j["sandbox"] else "")]
    if j.get("error"):
        lines.append(f"  error: {j['error']}")
    retry = r.get("answered_on_retry")
    lines.append(
        f"rows      {r['total']} total, {r['answered']} answered"
        + (f" ({retry} on retry)" if retry else "")
        + f", {r['failed']} failed"
    )
    for code, n in (r.get("failed_by_code") or {}).items():
        lines.append(f"            {n:>6}  {code}")
    est = c.get("estimate") or {}
    lines.append(
        f"tokens    {t['prompt']} input (estimated {t['estimated_input']}), {t['completion']} output"
        + (f", {t['cached']} cached" if t["cached"] else "")
    )
    lines.append(
        f"cost      ${c['billed']:.4f}"
        + (
            f" (estimated before sending: ${est.get('input', 0):.4f} input, at most ${est.get('max_total', 0):.4f})"
            if est
            else ""
        )
    )
    lines.append(
        "time      " + ", ".join(f"{p['phase']} {p['seconds']:.1f}s" for p in report["phases"] if p["seconds"] is not None)
    )
    for col in report["columns"]:
        lines.append("")
        lines.append(f"{col['name']}  ({col['values']} values, {col['missing']} empty)")
        if col["kind"] == "numeric":
            items = [
                (_fmt_num(b["low"]) if b["low"] == b["high"] else f"{_fmt_num(b['low'])}–{_fmt_num(b['high'])}", b["count"])
                for b in col["bins"]
            ]
        else:
            items = [(v["value"].replace("\n", " ")[:30], v["count"]) for v in col["counts"]]
            if col["other"]:
                items.append((f"({col['distinct'] - len(col['counts'])} others)", col["other"]))
        top = max((n for _l, n in items), default=0) or 1
        label_w = max((len(label) for label, _n in items), default=0)
        for label, n in items:
            bar = "█" * max(1 if n else 0, round(n * width / top))
            lines.append(f"  {label:<{label_w}}  {bar} {n}")
    return "\n".join(lines) + "\n"
