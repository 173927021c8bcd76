"""The figures of a result's answer columns for :mod:`batchgrader.reports.report`.

Each column is a *score* (numbers: a histogram; a few categories: bars) or *text* (free text:
summarised by length with a few example answers per score level, never counted as
categories).  A column's kind comes from the schema where there is one: a field of type
integer, number or boolean, or with an ``enum``, is a score; a string field without an enum is
text.  Without a schema the answer column is a score when every value is a number or when it
has at most :data:`MAX_CATEGORIES` distinct values, else text.  With a schema the answer column
holds the whole JSON answer, whose fields are charted one by one, so it is not charted itself.

:func:`groups` breaks the scores down by the values of a grouping column (``group_column``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

MAX_CATEGORIES = 12
HISTOGRAM_BINS = 10
MAX_GROUPS = 20
EXAMPLES_PER_LEVEL = 2
MAX_LEVELS = 8
EXAMPLE_CHARS = 200


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


def numbers(values: Sequence[Any]) -> list[float | None]:
    """Each value as a number (None where it is not one); each distinct value is read once."""
    cache: dict[Any, float | None] = {}
    out = []
    for v in values:
        try:
            n = cache[v]
        except KeyError:
            n = cache[v] = _number(v)
        except TypeError:  # not hashable
            n = _number(v)
        out.append(n)
    return out


def field_kinds(schema: Mapping[str, Any] | None) -> dict[str, str]:
    """Schema field -> ``score`` or ``text`` (fields of other shapes are text: JSON)."""
    out: dict[str, str] = {}
    for name, spec in ((schema or {}).get("properties") or {}).items():
        spec = spec if isinstance(spec, Mapping) else {}
        types = spec.get("type")
        types = set(types) if isinstance(types, list) else {types}
        scored = "enum" in spec or bool(types & {"integer", "number", "boolean"})
        out[name] = "score" if scored else "text"
    return out


def _present(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None and v != ""]


def guess_kind(values: Sequence[Any]) -> str:
    """``score`` or ``text`` for a column without a schema."""
    from batchgrader.pipeline.tables import text_of

    present = _present(values)
    if present and all(n is not None for n in numbers(present)):
        return "score"
    return "score" if len({text_of(v) for v in present}) <= MAX_CATEGORIES else "text"


def distribution(name: str, values: Sequence[Any]) -> dict[str, Any]:
    """The distribution of one score column: a histogram of numbers, or counts of categories."""
    from batchgrader.pipeline.tables import text_of

    present = _present(values)
    out: dict[str, Any] = {"name": name, "values": len(present), "missing": len(values) - len(present)}
    nums = numbers(present)
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


def text_summary(name: str, values: Sequence[Any], levels: Sequence[Any] | None, level_name: str | None) -> dict[str, Any]:
    """A free-text column: lengths in characters and a few examples per level of ``levels``
    (the first score column, row by row with ``values``), or a few examples overall."""
    from batchgrader.pipeline.tables import text_of

    texts = [text_of(v) for v in values]
    lengths = sorted(len(t) for t in texts if t)
    out: dict[str, Any] = {"name": name, "kind": "text", "values": len(lengths), "missing": len(texts) - len(lengths)}
    if lengths:
        out["length"] = {
            "min": lengths[0],
            "median": lengths[len(lengths) // 2],
            "mean": round(sum(lengths) / len(lengths), 1),
            "max": lengths[-1],
        }
    examples: dict[str, list[str]] = {}
    keys = [text_of(v) for v in levels] if levels is not None else [""] * len(texts)
    for key, text in zip(keys, texts):
        if not text or not key and levels is not None:
            continue
        shown = examples.setdefault(key, []) if key in examples or len(examples) < MAX_LEVELS else None
        if shown is not None and len(shown) < EXAMPLES_PER_LEVEL:
            shown.append(text[:EXAMPLE_CHARS] + ("…" if len(text) > EXAMPLE_CHARS else ""))
    out["examples_by"] = level_name
    out["examples"] = [{"level": k, "texts": v} for k, v in sorted(examples.items(), key=lambda kv: _level_key(kv[0]))]
    return out


def _level_key(level: str) -> tuple[int, float, str]:
    n = _number(level)
    return (0, n, "") if n is not None else (1, 0.0, level)


def groups(name: str, keys: Sequence[str], scores: Mapping[str, Sequence[Any]], failed: Counter[str]) -> dict[str, Any]:
    """The scores broken down by ``keys`` (the grouping column's value of each answered row):
    per group the rows, the failed rows, and per score column the mean (numbers) or the most
    frequent value and its share (categories).  The :data:`MAX_GROUPS` largest groups are shown."""
    from batchgrader.pipeline.tables import text_of

    rows_of: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        rows_of.setdefault(k, []).append(i)
    sizes = Counter({k: len(v) for k, v in rows_of.items()})
    sizes.update(failed)
    shown = [k for k, _n in sizes.most_common(MAX_GROUPS)]
    out_groups = []
    for k in shown:
        idx = rows_of.get(k, [])
        figures: dict[str, Any] = {}
        for col, values in scores.items():
            vals = [values[i] for i in idx if values[i] is not None and values[i] != ""]
            nums = numbers(vals)
            if vals and all(n is not None for n in nums):
                figures[col] = {"mean": sum(n for n in nums if n is not None) / len(nums)}
            elif vals:
                top, count = Counter(text_of(v) for v in vals).most_common(1)[0]
                figures[col] = {"top": top, "share": count / len(vals)}
        out_groups.append({"value": k, "answered": len(idx), "failed": failed.get(k, 0), "scores": figures})
    return {"column": name, "groups": out_groups, "other_groups": max(0, len(sizes) - len(shown))}
