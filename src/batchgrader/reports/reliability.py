"""Agreement among several answers to the same row: the samples of a row (``samples: k``), and
later the judges of a panel.

:func:`krippendorff_alpha` is Krippendorff's α over units (rows) each rated by several raters
(samples), missing ratings allowed: the nominal level for categories, the interval level for
numbers.  :func:`sample_agreement` gives the figures ``bgctl report`` shows for a job with
samples (the ``samples`` object under ``agreement``, with α also as ``krippendorff_alpha``).
The statistic is the ``krippendorff`` package's, imported only when a report computes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from batchgrader.reports.agreement import normal, number


def krippendorff_alpha(units: Sequence[Sequence[Any]], level: str | None = None) -> float | None:
    """Krippendorff's α of ``units`` (one sequence of ratings per unit, None for a missing
    rating; units may have different numbers of raters).  ``level``: ``nominal`` or
    ``interval``; None: interval when every rating is a number, else nominal.  None when α is
    undefined (fewer than two values in all, or no unit with two ratings)."""
    ratings = [[v for v in u if _present(v)] for u in units]
    values = [v for u in ratings for v in u]
    if not values or not any(len(u) >= 2 for u in ratings):
        return None
    if level is None:
        level = "interval" if all(number(v) is not None for v in values) else "nominal"
    width = max(len(u) for u in units)
    code = _codes(values, level)
    if len(set(code.values())) < 2:
        return None  # one value throughout: agreement is perfect but α is 0/0
    import krippendorff
    import numpy as np

    data = np.full((width, len(units)), np.nan)
    for j, u in enumerate(units):
        for i, v in enumerate(u):
            if _present(v):
                data[i, j] = code[v]
    try:
        a = float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))  # type: ignore[arg-type]
    except ValueError:
        return None
    return a if math.isfinite(a) else None


def _codes(values: list[Any], level: str) -> dict[Any, float | None]:
    """The number each rating stands for: its value (interval), else its category's index."""
    if level == "interval":
        return {v: number(v) for v in values}
    names = sorted({normal(v) for v in values})
    index = {n: float(i) for i, n in enumerate(names)}
    return {v: index[normal(v)] for v in values}


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v).strip() != ""


def samples_of(cell: Any) -> list[Any] | None:
    """The samples of a result row: its ``samples`` cell (a JSON list, or the list itself)."""
    if isinstance(cell, list):
        return cell
    if not isinstance(cell, str) or not cell.strip():
        return None
    try:
        got = json.loads(cell)
    except json.JSONDecodeError:
        return None
    return got if isinstance(got, list) else None


def unanimous(samples: Sequence[Any]) -> bool:
    """Every sample answered, and all alike (numbers as numbers, words case-folded)."""
    return bool(samples) and all(_present(v) for v in samples) and len({normal(v) for v in samples}) == 1


def sample_agreement(cells: Sequence[Any]) -> dict[str, Any] | None:
    """The agreement among the samples of each row (``cells``: the result file's ``samples``
    column): ``k``, ``rows`` (rows with samples), ``level`` (nominal or interval),
    ``krippendorff_alpha``, ``unanimous`` (rows whose k samples all answered alike) and
    ``unanimous_share``.  None when no row has samples."""
    lists = [s for s in (samples_of(c) for c in cells) if s is not None]
    if not lists:
        return None
    values = [v for s in lists for v in s if _present(v)]
    level = "interval" if values and all(number(v) is not None for v in values) else "nominal"
    same = sum(1 for s in lists if unanimous(s))
    return {
        "k": max(len(s) for s in lists),
        "rows": len(lists),
        "level": level,
        "krippendorff_alpha": krippendorff_alpha(lists, level),
        "unanimous": same,
        "unanimous_share": round(same / len(lists), 4),
    }
