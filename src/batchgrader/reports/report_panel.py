"""The report of a judge panel's result (``judges``): the consensus as any result's answers, and
the agreement among the judges.

A panel's result (pipeline/panel.py) is the input's columns, a column per judge, the consensus,
the share that agrees and the error, then each judge's own columns.  ``rows``: ``answered`` (the
rows with a consensus), ``failed`` (the rows without an answer: no judge answered, ``no_answer``,
or the judges tie, ``no_majority``), ``consensus`` (= ``answered``) and ``no_consensus`` (the ties).  ``tokens`` and ``cost_usd`` are the sums of the
judges' jobs' (store/figures.py ``panel_figures``) and ``judges`` lists each (:func:`judge_lines`).  Under ``agreement`` (``bgctl report --json``):
``krippendorff_alpha`` is Krippendorff's α among the judges (the rows are the units, the judges
the raters; an empty cell is a missing rating; interval level when every answer is a number,
else nominal); ``per_judge`` maps each judge to the figures of
:func:`~batchgrader.reports.agreement.agreement` against the ``reference_column`` labels (null
without labels); and ``panel`` holds ``judges``, ``krippendorff_alpha``, ``pairwise_kappa``
(judge -> judge -> Cohen's κ over the rows both answered), ``per_judge`` and ``rows``.  With a
reference column the consensus's own agreement with the labels is in the same object, as for
any job.  (A job with ``samples`` keeps its samples' α under ``krippendorff_alpha``; a panel
job has no samples of its own: a judge's samples are in that judge's job's report.)

``bgctl report PANEL --disagreements FILE`` (:func:`write_panel_disagreements`) writes the rows
whose judges disagree (two different values among the judges that answered, or no consensus),
and the labelled rows whose consensus differs from the label: the input's columns, the consensus
as ``model_answer`` and each judge's column; it counts ``judges_disagree`` of ``panel_rows`` and
``label_differs`` of ``compared``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PanelLayout:
    inputs: list[str]
    judges: dict[str, str]  # judge -> its column
    consensus: str
    agreement: str
    error: str
    reference: str | None
    group: str | None


def panel_layout(header: list[str], judges: list[str], settings: dict[str, Any]) -> PanelLayout | None:
    """Where a panel's result with ``header`` keeps what the report reads (None: not a panel's)."""
    from batchgrader.pipeline.panel import find_panel_columns

    found = find_panel_columns(header, settings.get("output_column") or "grade", judges)
    if found is None:
        return None
    n_inputs, cols = found
    inputs = header[:n_inputs]
    ref, group = settings.get("reference_column"), settings.get("group_column")
    return PanelLayout(
        inputs,
        dict(zip(judges, cols.judges, strict=True)),
        cols.consensus,
        cols.agreement,
        cols.error,
        ref if ref in inputs else None,
        group if group in inputs else None,
    )


def read_panel_result(path: str, judges: list[str], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The figures of a panel's result file (as ``reports/report.py``'s ``_read_result``), None
    when the file is not laid out as a panel's."""
    from batchgrader.pipeline.panel import is_tie
    from batchgrader.pipeline.tables import open_table, text_of
    from batchgrader.reports.report import distribution

    with open_table(Path(path), sheet=settings.get("sheet"), validated=True) as reader:
        lay = panel_layout(list(reader.columns), judges, settings)
        if lay is None:
            return None
        per_judge: dict[str, list[Any]] = {j: [] for j in judges}
        labels: list[Any] = []
        consensus: list[Any] = []
        by_code: Counter[str] = Counter()
        failed_rows: list[dict[str, Any]] = []
        rows = no_consensus = 0
        for row in reader:
            rows += 1
            vals = row.values
            for j, c in lay.judges.items():
                per_judge[j].append(vals.get(c))
            labels.append(vals.get(lay.reference) if lay.reference else None)
            err = text_of(vals.get(lay.error))
            consensus.append(None if err else vals.get(lay.consensus))
            if err and is_tie(err):  # the judges answered and tie: no answer is picked
                no_consensus += 1
            if err:
                by_code[err.split(":", 1)[0].strip()] += 1
                if len(failed_rows) < 20:
                    first = {k: text_of(vals[k])[:80] for k in lay.inputs[:2]}
                    failed_rows.append({"row": row.number, "input": first, "error": err, "answer": ""})
    answered = [v for v in consensus if v is not None]
    figures = panel_agreement(dict(per_judge.items()), labels if lay.reference else None, consensus, settings)
    if lay.reference:
        labelled = [i for i, v in enumerate(labels) if text_of(v).strip()]
        figures.update(labelled=len(labelled), unanswered=sum(1 for i in labelled if consensus[i] is None))
    failed = sum(by_code.values())
    return {
        "rows": rows,
        "answered": rows - failed,  # the rows with a consensus
        "consensus": len(answered),
        "no_consensus": no_consensus,
        "failed": failed,
        "failed_by_code": dict(by_code.most_common()),
        "columns": [distribution(lay.consensus, answered)],
        "groups": None,
        "agreement": figures,
        "failed_rows": failed_rows,
    }


def panel_agreement(
    per_judge: dict[str, Sequence[Any]], labels: list[Any] | None, consensus: list[Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """The agreement among the judges and, with labels, of the consensus and of each judge with them."""
    from batchgrader.reports.agreement import NotComparable, agreement, pairwise_kappa, panel_alpha
    from batchgrader.reports.agreement import per_judge as judges_against

    alpha = panel_alpha(per_judge)
    judged = judges_against(labels, per_judge) if labels is not None else None
    out: dict[str, Any] = {
        "reference_column": settings.get("reference_column") if labels is not None else None,
        "reference_field": settings.get("reference_field") if labels is not None else None,
    }
    if labels is not None:
        try:
            out.update(agreement(labels, consensus))
        except NotComparable as exc:
            out["error"] = f"labels cannot be compared with the consensus: {exc}"
    out.update(
        krippendorff_alpha=alpha,
        per_judge=judged,
        panel={
            "judges": list(per_judge),
            "rows": len(consensus),
            "krippendorff_alpha": alpha,
            "pairwise_kappa": pairwise_kappa(per_judge),
            "per_judge": judged,
        },
    )
    return out


def write_panel_disagreements(job: Any, dest: Path) -> dict[str, Any]:
    """Write the rows a panel's judges disagree on (or whose consensus differs from the label) to
    ``dest``; returns ``{"path", "rows", "compared", "format", "judges_disagree"}``."""
    from batchgrader.fsio import atomic_write_bytes
    from batchgrader.pipeline.tables import open_table
    from batchgrader.reports.disagreements import ANSWER_COLUMN, DisagreementsError, _encode

    if not job.result_path or not Path(job.result_path).exists():
        raise DisagreementsError(f"job {job.job_id} has no result file to compare (state {job.state})")
    judges = [j["profile"] for j in job.panel]
    with open_table(Path(job.result_path), sheet=job.settings.get("sheet"), validated=True) as reader:
        lay = panel_layout(list(reader.columns), judges, job.settings)
        if lay is None:
            raise DisagreementsError(f"the result file {job.result_path} is not laid out as the panel's result")
        answer_column = ANSWER_COLUMN
        while answer_column in lay.inputs:
            answer_column = "bg_" + answer_column
        rows, compared, split, seen, differ = _panel_disagreeing(reader, lay, answer_column)
        fmt, layout = reader.fmt, getattr(reader, "layout", None)
    data = _encode(fmt, layout, [*lay.inputs, answer_column, *lay.judges.values()], rows)
    atomic_write_bytes(dest, data, overwrite=False)
    return {
        "path": str(dest),
        "rows": len(rows),  # written: the judges disagree, or the consensus differs from the label
        "compared": compared,  # labelled rows with a consensus
        "format": fmt,
        "judges_disagree": split,  # of panel_rows
        "panel_rows": seen,
        "label_differs": differ,  # of compared
    }


def _panel_disagreeing(reader: Any, lay: PanelLayout, answer_column: str) -> tuple[list[dict[str, Any]], int, int, int, int]:
    """The rows to write, the labelled rows compared, the rows the judges disagree on, the rows
    read, and the compared rows whose consensus differs from the label."""
    from batchgrader.pipeline.tables import text_of
    from batchgrader.reports.agreement import normal

    out: list[dict[str, Any]] = []
    compared = split = seen = differ = 0
    for row in reader:
        seen += 1
        vals = row.values
        err = text_of(vals.get(lay.error))
        given = {normal(text_of(vals.get(c))) for c in lay.judges.values() if text_of(vals.get(c)).strip()}
        split_row = len(given) > 1 or err.startswith("no_majority: the judges tie")
        split += split_row
        differs = False
        label, answer = text_of(vals.get(lay.reference)) if lay.reference else "", text_of(vals.get(lay.consensus))
        if label.strip() and not err and answer.strip():
            compared += 1
            differs = normal(label) != normal(answer)
            differ += differs
        if differs or split_row:
            kept = {**{c: vals.get(c) for c in lay.inputs}, answer_column: vals.get(lay.consensus)}
            kept.update({c: vals.get(c) for c in lay.judges.values()})
            out.append(kept)
    return out, compared, split, seen, differ


def judge_lines(jobs: Sequence[Any], figures: Sequence[Any]) -> list[dict[str, Any]]:
    """A panel report's ``judges``: each judge's job (id, profile, model, state) and its own
    figures (:func:`~batchgrader.store.figures.own_figures`, as the panel's are summed from):
    requests, requests answered and failed, tokens and cost, so each figure can be traced to
    the job that was billed."""
    return [
        {
            "job_id": j.job_id,
            "profile": j.profile,
            "model": j.model,
            "state": j.state,
            "requests": f.requests,
            "answered": f.requests_answered,  # of its requests (rows x its samples)
            "failed": f.requests_failed,
            "prompt_tokens": f.billed.prompt_tokens,
            "completion_tokens": f.billed.completion_tokens,
            "cost_usd": f.billed.cost_usd,
        }
        for j, f in zip(jobs, figures, strict=True)
    ]
