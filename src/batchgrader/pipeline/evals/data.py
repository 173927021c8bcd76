"""The rows an eval grades: its items (and their samples), from a JSONL file, a run's inline
``file_content``, or exported output items; and the checks made before anything is sent
(``item_schema``, every template variable present in every row)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.pipeline.evals import templates
from batchgrader.pipeline.evals.spec import EvalInputError, EvalSpec, Problem

MAX_PROBLEMS_PER_CHECK = 5  # rows named per problem kind; the count says how many more


@dataclass(frozen=True)
class Row:
    """One item to grade: its ``index`` (OpenAI's ``datasource_item_id``), the item, its sample
    (None when the data has none) and where it came from (for messages)."""

    index: int
    item: dict[str, Any]
    sample: dict[str, Any] | None
    where: str

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "item": self.item}
        if self.sample is not None:
            out["sample"] = self.sample
        return out


def _json_lines(path: Path, what: str) -> Iterable[tuple[int, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalInputError([Problem(str(path), f"cannot be read ({exc})", f"give a UTF-8 JSONL file of {what}")]) from None
    stripped = text.lstrip()
    if stripped.startswith("{") and '"object"' in stripped[:200] and '"data"' in stripped:
        try:
            page = json.loads(text)
        except ValueError:
            page = None
        if isinstance(page, Mapping) and page.get("object") == "list" and isinstance(page.get("data"), list):
            yield from enumerate(page["data"], start=1)  # a list page, as the API returns it
            return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalInputError(
                [Problem(f"{path.name} line {n}", f"is not JSON ({exc.msg})", f"write one JSON object of {what} per line")]
            ) from None


def rows_from_records(records: Iterable[tuple[int, Any]], where: str) -> tuple[list[Row], list[str]]:
    """Rows from ``{"item": {...}, "sample": {...}?}`` records (a line that has no ``item`` key
    is taken as the item itself, and said so)."""
    rows: list[Row] = []
    notes: list[str] = []
    bare = 0
    problems: list[Problem] = []
    for n, rec in records:
        at = f"{where} line {n}"
        if not isinstance(rec, Mapping):
            problems.append(Problem(at, f"is a JSON {type(rec).__name__}", 'write {"item": {...}} objects, one per line'))
            continue
        if isinstance(rec.get("item"), Mapping):
            item = dict(rec["item"])
            sample = rec.get("sample")
            if sample is not None and not isinstance(sample, Mapping):
                problems.append(Problem(f"{at}.sample", "is not an object", 'write the sample as {"output_text": "..."}'))
                continue
            rows.append(Row(len(rows), item, dict(sample) if sample is not None else None, at))
        else:
            bare += 1
            rows.append(Row(len(rows), dict(rec), None, at))
    if problems:
        raise EvalInputError(problems)
    if bare:
        notes.append(f"{where}: {bare} line(s) have no 'item' key: each whole line is taken as the item")
    return rows, notes


def read_items(path: Path) -> tuple[list[Row], list[str]]:
    return rows_from_records(_json_lines(path, "items"), path.name)


def read_output_items(path: Path) -> list[dict[str, Any]]:
    """Exported output items (JSONL, or a list page), checked for the fields the comparison reads."""
    out: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for n, rec in _json_lines(path, "output items"):
        at = f"{path.name} line {n}"
        if not isinstance(rec, Mapping) or not isinstance(rec.get("results"), list):
            problems.append(
                Problem(at, "is not an output item (no results list)", "export them with GET /evals/{id}/runs/{run}/output_items")
            )
            continue
        if not isinstance(rec.get("datasource_item_id"), int):
            problems.append(Problem(f"{at}.datasource_item_id", "is missing", "export the output items as the API returns them"))
            continue
        for k, r in enumerate(rec["results"]):
            if not isinstance(r, Mapping) or "name" not in r or "passed" not in r:
                problems.append(
                    Problem(f"{at}.results[{k}]", "has no name or passed", "export the output items as the API returns them")
                )
        out.append(dict(rec))
    if problems:
        raise EvalInputError(problems[:MAX_PROBLEMS_PER_CHECK])
    return sorted(out, key=lambda r: r["datasource_item_id"])


def rows_from_output_items(items: Sequence[Mapping[str, Any]], where: str) -> list[Row]:
    """Rows from output items: each one's ``datasource_item`` and, as its sample, what the run sampled."""
    rows = []
    for oi in items:
        sample = oi.get("sample") if isinstance(oi.get("sample"), Mapping) else None
        rows.append(
            Row(int(oi["datasource_item_id"]), dict(oi.get("datasource_item") or {}), dict(sample) if sample else None, where)
        )
    return rows


def with_samples_from(rows: list[Row], items: Sequence[Mapping[str, Any]]) -> tuple[list[Row], int]:
    """Rows without a sample take the sample of the output item of the same index; how many did."""
    by_index = {int(oi["datasource_item_id"]): oi.get("sample") for oi in items}
    out, filled = [], 0
    for r in rows:
        s = by_index.get(r.index)
        if r.sample is None and isinstance(s, Mapping):
            out.append(Row(r.index, r.item, dict(s), r.where))
            filled += 1
        else:
            out.append(r)
    return out, filled


def check_rows(spec: EvalSpec, rows: Sequence[Row], *, samples_later: bool = False) -> list[Problem]:
    """What would make a row ungradable: an item outside ``item_schema``, a template variable a
    row lacks (a missing sample included, unless ``samples_later``: a generate-then-grade run
    samples them first).  Each kind names its first rows and the count."""
    problems: list[Problem] = []
    if not rows:
        return [Problem("items", "there are none", "give the items with --data ITEMS.jsonl (or a run with file_content)")]
    if spec.item_schema:
        problems += _schema_problems(spec.item_schema, rows)
    for c in spec.criteria:
        for fld, tmpl in c.template_fields().items():
            for var in templates.variables(tmpl):
                if samples_later and var.startswith("sample"):
                    continue
                missing = []
                for r in rows:
                    try:
                        templates.lookup(var, r.item, templates.sample_namespace(r.sample))
                    except templates.MissingVariable as exc:
                        missing.append((r, exc.reason))
                if missing:
                    first = "; ".join(f"{r.where} ({why})" for r, why in missing[:MAX_PROBLEMS_PER_CHECK])
                    more = f" and {len(missing) - MAX_PROBLEMS_PER_CHECK} more" if len(missing) > MAX_PROBLEMS_PER_CHECK else ""
                    fix = (
                        'give every item a sample ({"item": ..., "sample": {"output_text": ...}}), or pass the run\'s --output-items'
                        if var.startswith("sample")
                        else f"add {var.split('.', 1)[-1]!r} to every item, or change the criterion's template"
                    )
                    problems.append(
                        Problem(
                            f"testing_criteria[{c.index - 1}] ({c.name!r}).{fld}",
                            f"uses {{{{{var}}}}}, which {len(missing)} of {len(rows)} rows lack: {first}{more}",
                            fix,
                        )
                    )
    return problems


def _schema_problems(schema: Mapping[str, Any], rows: Sequence[Row]) -> list[Problem]:
    try:
        import jsonschema
    except ImportError:
        return [
            Problem("items", "checking them against the eval's item_schema needs jsonschema", "pip install 'batchgrader[evals]'")
        ]

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [
            Problem(
                "eval.data_source_config.schema.properties.item",
                f"is not a valid JSON Schema ({exc.message})",
                "fix the item schema",
            )
        ]
    validator = cls(schema)
    bad: list[str] = []
    count = 0
    for r in rows:
        errors = sorted(validator.iter_errors(r.item), key=lambda e: list(e.absolute_path))
        if errors:
            count += 1
            if len(bad) < MAX_PROBLEMS_PER_CHECK:
                e = errors[0]
                path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
                bad.append(f"{r.where}: item{path} {e.message}")
    if not count:
        return []
    more = f"; and {count - len(bad)} more rows" if count > len(bad) else ""
    return [
        Problem(
            "items",
            f"{count} of {len(rows)} items do not match the eval's item_schema: " + "; ".join(bad) + more,
            "correct those items (or the eval's data_source_config.schema, if it is the schema that is wrong)",
        )
    ]
