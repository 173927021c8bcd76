"""`bgctl report JOB`: how a job went, computed from its events and its result file.

Figures (all in :func:`build_report`'s dict, which ``--json`` prints as is):

* ``rows``: rows in the result file, answered (empty error cell), failed by error code (the
  text before the first ``:`` of the error cell), and answered on retry (rows answered in a
  chunk planned by ``RetryPlanned``, from that chunk's stored per-row results);
* ``tokens`` and ``cost_usd``: billed figures (the ``TokensUsed`` events) next to the
  estimate made before sending (``JobPrepared``);
* ``phases``: seconds of each phase of each attempt (the first run, then one per
  ``bgctl retry``), the idle time before each retry, and the total;
* ``columns``: for each answer column, the distribution of a score or the summary of a free
  text (:mod:`batchgrader.reports.report_columns`);
* ``groups``: the scores broken down by the job's ``group_column``, or null;
* ``agreement``: agreement with the human labels of the job's ``reference_column``
  (:mod:`batchgrader.reports.agreement`), or null;
* ``failed_rows``: the first 50 failed rows, their errors and their partial answers.

Nothing here writes; the terminal summary is :mod:`batchgrader.reports.report_text`, the HTML
page :mod:`batchgrader.reports.report_html`, the disagreements file
:mod:`batchgrader.reports.disagreements`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from batchgrader.core.log.route_state import route_summary
from batchgrader.reports.report_columns import distribution
from batchgrader.store.eventstore import Event

__all__ = ["MAX_FAILED_ROWS", "ResultLayout", "build_report", "distribution", "load_report", "read_events_of", "result_layout"]

MAX_FAILED_ROWS = 50
ANSWER_CHARS = 200
_FINAL = ("JobCompleted", "JobFailed", "JobCancelled")
_ENDS = ("ResultWritten", *_FINAL)


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return round((datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds(), 3)


def _attempts(events: Sequence[Event]) -> list[list[Event]]:
    """The events of each attempt: the first run, then one per ``RetryRequested``."""
    out: list[list[Event]] = [[]]
    for e in events:
        if e.type == "RetryRequested" and out[-1]:
            out.append([])
        out[-1].append(e)
    return out


def _attempt_phases(n: int, events: list[Event]) -> list[dict[str, Any]]:
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for e in events:
        first.setdefault(e.type, e.ts)
        last[e.type] = e.ts
    start = events[0].ts
    batches_end = last.get("ChunkCompleted")
    written = next((e.ts for e in events if e.type == "ResultWritten" and (not batches_end or e.ts >= batches_end)), None)
    spans = []
    if n == 1:
        spans.append(("prepare", first.get("JobAccepted"), first.get("JobPrepared")))
    spans += [
        ("submit", first.get("JobPrepared") if n == 1 else start, first.get("BatchCreated")),
        ("batches", first.get("BatchCreated"), batches_end),
        ("write result", batches_end or first.get("JobPrepared"), written),
    ]
    ended = next((e.ts for e in reversed(events) if e.type in _FINAL), None)
    if written and ended and ended > written:  # answers stored, input archived, provider files deleted
        spans.append(("finish", written, ended))  # so that the phases add up to the total
    return [{"attempt": n, "phase": name, "seconds": _seconds(a, b)} for name, a, b in spans]


def _phases(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The phases of each attempt, the idle time before each retry, and the total (from the
    first event to the last end): all measured between events in order, so never negative."""
    out: list[dict[str, Any]] = []
    previous_end: str | None = None
    for n, attempt in enumerate(_attempts(events), 1):
        if n > 1:
            out.append({"attempt": n, "phase": "idle before retry", "seconds": _seconds(previous_end, attempt[0].ts)})
        out += _attempt_phases(n, attempt)
        previous_end = next((e.ts for e in reversed(attempt) if e.type in _ENDS), attempt[-1].ts)
    end = next((e.ts for e in reversed(events) if e.type in _FINAL), None)
    out.append({"attempt": None, "phase": "total", "seconds": _seconds(events[0].ts if events else None, end)})
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


@dataclass(frozen=True)
class ResultLayout:
    """Where a result file keeps what the report reads."""

    inputs: list[str]  # the input's columns
    output: str | None = None  # the answer column
    fields: dict[str, str] = field(default_factory=dict)  # schema field -> its column
    error: str | None = None
    kinds: dict[str, str] = field(default_factory=dict)  # answer column -> score/text (schema fields only)
    reference: str | None = None  # the labels' input column
    compared: str | None = None  # the answer column compared with the labels
    group: str | None = None  # the grouping input column
    samples: str | None = None  # the samples of each row (JSON lists), with samples: k > 1

    def answer_columns(self) -> list[str]:
        """The columns charted or summarised: the schema's fields, else the answer column."""
        if self.fields:
            return list(self.fields.values())
        return [self.output] if self.output else []


def result_layout(header: list[str], settings: dict[str, Any]) -> ResultLayout:
    """The layout of a result file with ``header``, written under ``settings`` (the job's)."""
    from batchgrader.pipeline.outbox import added_columns
    from batchgrader.reports.report_columns import field_kinds

    rf = settings.get("response_format")
    schema = (rf or {}).get("json_schema", {}).get("schema") if rf else None
    schema = schema if isinstance(schema, dict) else None
    n_fields = len((schema or {}).get("properties") or {})
    # the added columns: answered_by, the answer, its fields, the token counts and the error (a
    # result written before answered_by existed has the others only)
    # (and, with samples: k > 1, the samples, their agreement and the valid ones)
    for n_added, written, k in ((8 + n_fields, True, 2), (5 + n_fields, True, 1), (4 + n_fields, False, 1)):
        if len(header) < n_added:
            continue
        inputs = header[:-n_added]
        cols = added_columns(inputs, settings.get("output_column") or "grade", rf, samples=k)
        if (cols.written() if written else cols.names()) == header[-n_added:]:
            break
    else:
        return ResultLayout(inputs=header)
    fields = dict(cols.fields)
    kinds = {fields[f]: k for f, k in field_kinds(schema).items() if f in fields}
    ref = settings.get("reference_column")
    ref_field = settings.get("reference_field")
    compared = fields.get(ref_field) if ref_field else cols.output
    group = settings.get("group_column")
    return ResultLayout(
        inputs=inputs,
        output=cols.output,
        fields=fields,
        error=cols.error,
        kinds=kinds,
        reference=ref if ref in inputs else None,
        compared=compared if ref in inputs else None,
        group=group if group in inputs else None,
        samples=cols.samples[0] if cols.samples else None,
    )


@dataclass
class _Collected:
    rows: int = 0
    answered: int = 0
    by_code: Counter[str] = field(default_factory=Counter)
    failed: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, list[Any]] = field(default_factory=dict)
    labels: list[Any] = field(default_factory=list)
    compared: list[Any] = field(default_factory=list)
    unanswered_labelled: int = 0
    group_keys: list[str] = field(default_factory=list)
    failed_groups: Counter[str] = field(default_factory=Counter)
    samples: list[Any] = field(default_factory=list)  # each row's samples cell (failed rows too)


def _collect(reader: Any, lay: ResultLayout) -> _Collected:
    from batchgrader.pipeline.tables import text_of

    got = _Collected(values={c: [] for c in lay.answer_columns()})
    charted = list(got.values.items())
    for row in reader:
        got.rows += 1
        vals = row.values
        err = text_of(vals.get(lay.error)) if lay.error else ""
        group = text_of(vals.get(lay.group)) if lay.group else ""
        if lay.samples:
            got.samples.append(vals.get(lay.samples))
        if err:
            code = err.split(":", 1)[0].strip() if ":" in err else err
            got.by_code[code] += 1
            got.failed_groups[group] += 1
            if lay.reference and text_of(vals.get(lay.reference)).strip():
                got.unanswered_labelled += 1
            if len(got.failed) < MAX_FAILED_ROWS:
                first = {k: text_of(vals[k])[:80] for k in lay.inputs[:2]}
                answer = text_of(vals.get(lay.output))[:ANSWER_CHARS] if lay.output else ""
                got.failed.append({"row": row.number, "input": first, "error": err, "answer": answer})
            continue
        got.answered += 1
        for c, values in charted:
            values.append(vals.get(c))
        if lay.reference and lay.compared:
            got.labels.append(vals.get(lay.reference))
            got.compared.append(vals.get(lay.compared))
        if lay.group:
            got.group_keys.append(group)
    return got


def _columns(got: _Collected, lay: ResultLayout) -> list[dict[str, Any]]:
    from batchgrader.reports.report_columns import guess_kind, numbers, text_summary

    kinds = {c: lay.kinds.get(c) or guess_kind(v) for c, v in got.values.items()}
    scores = [c for c in got.values if kinds[c] == "score"]
    # examples of free text by the compared score, else by the first numeric score, else the first score
    numeric = [c for c in scores if all(n is not None for n in numbers([v for v in got.values[c] if v not in (None, "")]))]
    preferred = [lay.compared] if lay.compared in scores else []
    level = next(iter([*preferred, *numeric, *scores]), None)
    out = []
    for c, values in sorted(got.values.items(), key=lambda cv: kinds[cv[0]] != "score"):  # scores first
        if kinds[c] == "score":
            out.append(distribution(c, values))
        else:
            out.append(text_summary(c, values, got.values[level] if level else None, level))
    return out


def _agreement(got: _Collected, lay: ResultLayout, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The agreement with the labels and, with samples, among the samples of each row
    (``krippendorff_alpha`` and ``samples``: reports/reliability.py)."""
    figures = _label_agreement(got, lay, settings)
    if lay.samples:
        from batchgrader.reports.reliability import sample_agreement

        among = sample_agreement(got.samples)
        if among is not None:
            figures = figures or {"reference_column": None}
            figures.update(krippendorff_alpha=among["krippendorff_alpha"], samples=among)
    return figures


def _label_agreement(got: _Collected, lay: ResultLayout, settings: dict[str, Any]) -> dict[str, Any] | None:
    from batchgrader.reports.agreement import NotComparable, agreement

    if not settings.get("reference_column"):
        return None
    where = {"reference_column": settings.get("reference_column"), "reference_field": settings.get("reference_field")}
    if not lay.reference or not lay.compared:
        return {**where, "error": "the reference column or the compared answer column is not in the result file"}
    labelled = sum(1 for v in got.labels if v is not None and str(v).strip() != "")
    try:
        figures = agreement(got.labels, got.compared)
    except NotComparable as exc:
        return {**where, "error": f"labels cannot be compared with the answers: {exc}"}
    return {**where, "labelled": labelled + got.unanswered_labelled, "unanswered": got.unanswered_labelled, **figures}


def _read_result(path: str, settings: dict[str, Any]) -> dict[str, Any]:
    from batchgrader.pipeline.tables import open_table
    from batchgrader.reports.report_columns import groups

    # our own output, written from a fully checked input: read by the csv module alone
    with open_table(Path(path), sheet=settings.get("sheet"), validated=True) as reader:
        lay = result_layout(list(reader.columns), settings)
        got = _collect(reader, lay)
    columns = _columns(got, lay)
    scores = {c["name"]: got.values[c["name"]] for c in columns if c["kind"] != "text"}
    return {
        "rows": got.rows,
        "answered": got.answered,
        "failed": sum(got.by_code.values()),
        "failed_by_code": dict(got.by_code.most_common()),
        "columns": columns,
        "groups": groups(lay.group, got.group_keys, scores, got.failed_groups) if lay.group else None,
        "agreement": _agreement(got, lay, settings),
        "failed_rows": got.failed,
    }


def read_events_of(home: Any, job_id: str) -> list[Event]:
    """The events of the job ``job_id`` (or a unique prefix of it) in ``home``."""
    from batchgrader.store.eventstore import read_events
    from batchgrader.store.queries import reading, resolve_job

    with reading(home) as conn:
        jid = resolve_job(conn, job_id)
        return list(read_events(conn, job_id=jid))


def build_report(events: Sequence[Event], judges: Sequence[Sequence[Event]] = ()) -> dict[str, Any]:
    """The report of one job from its events (in order) and the files they name; for a judge
    panel, ``judges``: each judge's job's events.  Its rows answered and failed, tokens, cost and
    models are the job's :class:`~batchgrader.store.figures.JobFigures` (a panel's: its judges'
    billed figures summed), as `bgctl status` shows them; the result file gives the rest."""
    from batchgrader.core.log.state import fold
    from batchgrader.store.figures import job_figures

    if not events:
        raise ValueError("no events")
    job = fold(events).jobs[events[0].job_id]
    judge_jobs = [fold(ev).jobs[ev[0].job_id] for ev in judges if ev] if job.panel is not None else []
    f = job_figures(job, judge_jobs)
    b = f.billed
    chunk_results = {c.index: c.results_path for c in job.chunks.values() if c.results_path}
    report: dict[str, Any] = {
        "job": {
            "id": job.job_id,
            "file": job.file,
            "state": job.state,
            "profile": job.profile,
            "model": ", ".join(f.models) or None,
            "sandbox": job.sandbox,
            "result_path": job.result_path,
            "error_path": job.error_path,
            "error": (job.error or {}).get("error"),
        },
        "tokens": {
            "estimated_input": b.estimated_input,
            "prompt": b.prompt_tokens,
            "cached": b.cached_tokens,
            "completion": b.completion_tokens,
            "reasoning": b.reasoning_tokens,
        },
        "cost_usd": {
            "billed": b.cost_usd,
            "estimate": b.estimate,
            "cache_saved": b.cache_saved_usd,
            "cache_write_tokens": b.cache_write_tokens,
        },
        "phases": _phases(events),
        "route": route_summary(job),
    }
    rows: dict[str, Any] = {
        "total": f.rows,
        "answered": f.answered,
        "failed": f.failed,
        "answered_on_retry": _answered_on_retry(events, chunk_results),
    }
    figures: dict[str, Any] = {"columns": [], "groups": None, "agreement": None, "failed_rows": []}
    panel = None
    if job.panel is not None and job.result_path and Path(job.result_path).exists():  # a judge panel's result
        from batchgrader.reports.report_panel import read_panel_result

        panel = read_panel_result(job.result_path, [j["profile"] for j in job.panel], job.settings)
        report["job"]["judges"] = job.panel
    if panel is not None:
        figures = panel
        rows.update(failed_by_code=figures["failed_by_code"], in_result=figures["rows"])
        rows.update(consensus=figures["consensus"], no_consensus=figures["no_consensus"])
    elif job.result_path and Path(job.result_path).exists():
        figures = _read_result(job.result_path, job.settings)
        rows.update(failed_by_code=figures["failed_by_code"], in_result=figures["rows"])
    else:
        codes: Counter[str] = Counter(str(i.get("code")) for i in [*job.failed_rows.values(), *job.row_errors.values()])
        rows["failed_by_code"] = dict(codes.most_common())
    report["rows"] = rows
    for key in ("columns", "groups", "agreement", "failed_rows"):
        report[key] = figures[key]
    if job.panel is not None and judge_jobs:  # each judge's job, and its own figures
        from batchgrader.reports.report_panel import judge_lines

        report["judges"] = judge_lines(judge_jobs, f.judges)
    return report


def load_report(home: Any, job_id: str) -> dict[str, Any]:
    """The report of the job ``job_id`` (or a unique prefix of it) in ``home`` (a panel's with
    its judges' jobs)."""
    events = read_events_of(home, job_id)
    started = next((e for e in events if e.type == "PanelStarted"), None)
    judges = [read_events_of(home, j["job_id"]) for j in started.payload["judges"]] if started else []
    return build_report(events, [ev for ev in judges if ev])
