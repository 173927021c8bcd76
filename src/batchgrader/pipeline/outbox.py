"""The outbox: result files and error reports, written crash-safely (through
:mod:`batchgrader.fsio`); originals archived.

Only after a file is durable is the outcome event recorded.  A result never
overwrites an existing file (a timestamp suffix is added when the name is taken), and nothing
is ever deleted except our own temporary files.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.core.log.answer_sources import ANSWERED_BY, BILLED_ELSEWHERE
from batchgrader.fsio import DERIVED_NAME_MAX, fit_name, shown_name
from batchgrader.pipeline.formats.registry import result_suffix


def result_name(input_name: str) -> str:
    """``a.csv`` -> ``a_results.csv``; a stem too long for the file system is cut (:func:`fit_name`)."""
    p = Path(input_name)
    return fit_name(p.stem, f"_results{result_suffix(p.suffix)}", DERIVED_NAME_MAX)


def error_name(input_name: str) -> str:
    """``a.csv`` -> ``a_error.txt``; a stem too long for the file system is cut (:func:`fit_name`)."""
    return fit_name(Path(input_name).stem, "_error.txt", DERIVED_NAME_MAX)


def report_name(result_path: str) -> str:
    """The HTML report's name, following the result's: ``answers_results.csv`` gives
    ``answers_report.html``, a result renamed with a timestamp (``answers_results_20261125T101500Z.csv``)
    gives the report the same suffix (``answers_report_20261125T101500Z.html``)."""
    stem = Path(result_path).stem
    head, found, tail = stem.rpartition("_results")
    return f"{head}_report{tail}.html" if found else f"{stem}_report.html"


def result_settings(profile: Profile) -> dict[str, Any]:
    """The settings that shape the result file, fixed when the job is prepared."""
    return {
        "output_column": profile.output_column,
        "response_format": profile.response_format,
        "id_column": profile.id_column,
        "csv_formula_guard": profile.csv_formula_guard,
        "sheet": profile.get("sheet"),
        "encoding": profile.get("encoding", "utf-8"),
        **({"skip_empty": True} if profile.get("skip_empty") else {}),  # empty rows were left out (empty_input)
        # read by `bgctl report` only; kept when set, so the settings of other jobs stay as they were
        **{k: profile.get(k) for k in ("reference_column", "reference_field", "group_column") if profile.get(k) is not None},
        **({"samples": profile.samples} if profile.get("samples", 1) != 1 else {}),  # requests per row: the vote
        **({"schema_column": profile.schema_column} if profile.get("schema_column") else {}),  # each row's own schema
    }


_OUTBOX_CAUSES = {
    errno.EACCES: ("permission_denied", "permission denied"),
    errno.EPERM: ("permission_denied", "permission denied"),
    errno.ENOSPC: ("no_space", "no space left on the device"),
    errno.EDQUOT: ("no_space", "disk quota exceeded"),
    errno.EROFS: ("read_only", "read-only file system"),
    errno.ENOENT: ("not_found", "no such folder"),
}


def outbox_error(exc: OSError, path: str) -> tuple[str, str]:
    """(code, message) for a result that could not be written, e.g. ``("permission_denied",
    "cannot write the outbox: permission denied: /home/u/outbox/a_results.csv")``."""
    code, cause = _OUTBOX_CAUSES.get(exc.errno or 0, ("os_error", exc.strerror or str(exc)))
    return code, f"cannot write the outbox: {cause}: {path}"


# --- result rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddedColumns:
    output: str
    fields: tuple[tuple[str, str], ...]  # (schema field, column name)
    input_tokens: str
    output_tokens: str
    error: str
    answered_by: str = "answered_by"
    samples: tuple[str, ...] = ()  # with samples: k > 1, the samples, their agreement, the valid ones (pipeline/samples.py)

    def names(self) -> list[str]:
        """The added columns after the input's columns, in order (``answered_by`` is
        written before them: :meth:`written`)."""
        return [self.output, *(c for _f, c in self.fields), self.input_tokens, self.output_tokens, self.error, *self.samples]

    def written(self) -> list[str]:
        """Every added column as the result file has them: ``answered_by`` then :meth:`names`."""
        return [self.answered_by, *self.names()]


#: the columns a row with several samples gains (``samples: k``, k > 1), before renaming
SAMPLE_COLUMNS = ("samples", "sample_agreement", "samples_valid")


def added_columns(
    input_columns: Iterable[str], output_column: str, response_format: Mapping[str, Any] | None, samples: int = 1
) -> AddedColumns:
    taken = set(input_columns)

    def name(n: str) -> str:
        out = n
        while out in taken:
            out = "bg_" + out
        taken.add(out)
        return out

    out_col = name(output_column)
    fields: list[tuple[str, str]] = []
    schema = (response_format or {}).get("json_schema", {}).get("schema") if response_format else None
    if isinstance(schema, Mapping):
        for f in schema.get("properties") or {}:
            fields.append((f, name(f)))
    base = (name("input_tokens"), name("output_tokens"), name("error"), name("answered_by"))
    extra = tuple(name(c) for c in SAMPLE_COLUMNS) if samples > 1 else ()
    return AddedColumns(out_col, tuple(fields), *base, samples=extra)


_SCHEMA_TYPES = {"integer": "int64", "number": "double", "boolean": "bool", "string": "string"}


def added_column_types(cols: AddedColumns, response_format: Mapping[str, Any] | None) -> dict[str, str]:
    """The type of each added column, for formats with typed columns (Parquet).

    Token counts are ``int64``; a structured-output field has its JSON-schema type
    (``integer``, ``number``, ``boolean``, ``string``/enum; a ``[type, "null"]`` list counts as
    its non-null type); anything else (objects, arrays, unions) is its JSON text.
    """
    types = {cols.output: "string", cols.input_tokens: "int64", cols.output_tokens: "int64", cols.error: "string"}
    types[cols.answered_by] = "string"
    types.update(zip(cols.samples, ("string", "double", "int64"), strict=False))
    schema = (response_format or {}).get("json_schema", {}).get("schema") if response_format else None
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    for f, c in cols.fields:
        spec = props.get(f) if isinstance(props, Mapping) else None
        t = spec.get("type") if isinstance(spec, Mapping) else None
        if isinstance(t, list):
            non_null = [x for x in t if x != "null"]
            t = non_null[0] if len(non_null) == 1 else None
        types[c] = _SCHEMA_TYPES.get(t, "string") if isinstance(t, str) else "string"
    return types


def result_values(
    cols: AddedColumns, outcome: Mapping[str, Any] | None, row_error: str | None, json_values: bool
) -> dict[str, Any]:
    """The added cells of one row. ``outcome`` is a stored per-row result (or None).  The token
    cells are what was billed for the row in this job: 0 for a row answered by an identical row
    (``duplicate``) or a stored answer (``reused``), whose tokens were billed once, elsewhere."""
    blank: Any = None if json_values else ""
    if outcome and outcome.get("ok"):
        content = outcome.get("content")
        billed = _billed_cells(cols, outcome, json_values)
        fields = _field_cells(cols, content, json_values)
        error: Any = blank
    else:
        content = outcome.get("content") if outcome else None  # a truncated/refused/invalid answer's text is kept
        content = content if isinstance(content, str) and content else None
        fields = {c: blank for _f, c in cols.fields}
        if outcome is not None and outcome.get("status_code") == 200:  # answered, not an answer (truncated, ...): billed
            billed = _billed_cells(cols, outcome, json_values)
        else:
            billed = {cols.answered_by: blank, cols.input_tokens: blank, cols.output_tokens: blank}
        if row_error is None and outcome is not None:
            row_error = f"{outcome.get('error_code') or 'error'}: {outcome.get('error_message') or ''}".strip()
        error = row_error or "no result (row was not processed)"
    # every row's cells in the order the result file has its columns (AddedColumns.written): a
    # JSON or JSONL row keeps its keys in this order
    out = {cols.answered_by: billed[cols.answered_by], cols.output: content if content is not None else blank}
    out.update(fields)
    out[cols.input_tokens] = billed[cols.input_tokens]
    out[cols.output_tokens] = billed[cols.output_tokens]
    out[cols.error] = error
    return out


def _field_cells(cols: AddedColumns, content: Any, json_values: bool) -> dict[str, Any]:
    """The structured answer's fields, one cell each (JSON text for a non-string in a text format)."""
    parsed: Any = None
    if cols.fields and isinstance(content, str):
        try:
            parsed = json.loads(content)
        except json.JSONDecodeError:
            parsed = None
    out: dict[str, Any] = {}
    for f, c in cols.fields:
        v = parsed.get(f) if isinstance(parsed, dict) else None
        if json_values:
            out[c] = v
        else:
            out[c] = "" if v is None else v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return out


def _billed_cells(cols: AddedColumns, outcome: Mapping[str, Any], json_values: bool) -> dict[str, Any]:
    """Who answered the row and the tokens billed for it in this job (0 for an answer billed
    elsewhere: an identical row's, or a stored answer)."""
    pt, ct = outcome.get("prompt_tokens"), outcome.get("completion_tokens")
    if outcome.get("reused") in BILLED_ELSEWHERE:
        pt = ct = 0  # billed once, for the row (or the earlier job) that answered it
    return {
        cols.answered_by: ANSWERED_BY.get(outcome.get("reused"), "batch"),
        cols.input_tokens: pt if json_values else ("" if pt is None else str(pt)),
        cols.output_tokens: ct if json_values else ("" if ct is None else str(ct)),
    }


def error_report(file: str, job_id: str, reason: str, hint: str, extra: str = "") -> str:
    lines = [
        f"BatchGrader could not process {shown_name(file)}",
        f"job: {job_id}",
        "",
        f"What went wrong: {reason}",
        "",
        f"What to do: {hint}",
    ]
    if extra:
        lines += ["", extra]
    return "\n".join(lines) + "\n"
