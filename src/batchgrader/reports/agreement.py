"""Agreement of the answers with human labels (the ``reference_column`` of a profile).

:func:`agreement` takes the label and the answer of each labelled row and returns the figures
of ``bgctl report``'s ``agreement`` object:

* categories (words, or whole numbers with at most :data:`MAX_ORDERED` distinct values): rows
  compared ``n``, ``accuracy``, Cohen's κ (``cohen_kappa``), quadratic-weighted κ
  (``weighted_kappa``, only when the labels are whole numbers: the weights are the squared
  distance of the numbers, not of their ranks), the ``confusion`` matrix (label -> predicted ->
  count), ``per_class`` precision and recall, and the majority-class ``baseline_accuracy`` (the
  accuracy of always answering the most frequent label);
* numbers: ``mae``, ``rmse``, ``pearson`` and ``spearman`` correlation;
* ``ci``: for each figure, its bootstrap 95 % interval ``[low, high]`` (percentile method, rows
  resampled with replacement; ``bootstrap_resamples`` times, fewer for large numeric tables,
  seeded so the same table gives the same interval).

For a panel of judges (issue 25 item 3; the panel's jobs are not built yet) the library has
:func:`panel_alpha` (Krippendorff's α among the judges' answer columns), :func:`pairwise_kappa`
(Cohen's κ of every pair) and :func:`per_judge` (each judge's figures against the labels).

A figure that does not apply (or is undefined, e.g. κ when every label is the same) is null.
Labels and answers are compared as text with case and surrounding space ignored; numbers are
compared as numbers (``4`` and ``4.0`` agree).  The statistics are scikit-learn's and SciPy's,
imported only when a report computes them.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

from batchgrader.pipeline.samples import as_number as number  # noqa: F401 - read by the other reports
from batchgrader.pipeline.samples import category_text as normal

MAX_ORDERED = 20  # whole-number labels with more distinct values are not treated as categories
RESAMPLES = 1000
NUMERIC_WORK = 5_000_000  # rows x resamples for the numeric intervals (fewer resamples past it)
MIN_RESAMPLES = 50
SEED = 20261125

CATEGORICAL = ("accuracy", "cohen_kappa", "weighted_kappa", "baseline_accuracy")
NUMERIC = ("mae", "rmse", "pearson", "spearman")


class NotComparable(ValueError):
    """Labels and answers of different kinds (numbers against words)."""


def _empty_figures() -> dict[str, Any]:
    out: dict[str, Any] = {k: None for k in ("n", *CATEGORICAL, "confusion", *NUMERIC)}
    out.update(kind=None, per_class=None, ci={k: None for k in (*CATEGORICAL, *NUMERIC)}, bootstrap_resamples=0)
    out["not_comparable"] = 0
    return out


def agreement(labels: Sequence[Any], answers: Sequence[Any]) -> dict[str, Any]:
    """The figures for the pairs (label, answer); pairs with an empty label are left out, and so
    are answers of another kind than the labels (counted as ``not_comparable``).  Raises
    :class:`NotComparable` when no answer is of the labels' kind (numbers against words)."""
    num, norm = _memo(number), _memo(normal)  # a column holds few distinct values: each is read once
    pairs = [(lab, ans) for lab, ans in zip(labels, answers) if _present(lab) and _present(ans)]
    out = _empty_figures()
    if not pairs:
        out["n"] = 0
        return out
    numeric = all(num(lab) is not None for lab, _a in pairs)
    kept = _comparable(pairs, numeric, num)
    out["not_comparable"] = len(pairs) - len(kept)
    out["n"] = len(kept)
    y_true = [norm(lab) for lab, _a in kept]
    y_pred = [norm(ans) for _l, ans in kept]
    if not numeric:
        _merge(out, [_categorical(y_true, y_pred, ordered=False)])
        out["kind"] = "categorical"
        return out
    xs = [num(lab) for lab, _a in kept]
    ys = [num(ans) for _l, ans in kept]
    ordered = _ordered(xs, ys, y_true, y_pred)
    parts = [_categorical(y_true, y_pred, ordered=True)] if ordered else []
    parts.append(_numeric([float(x) for x in xs if x is not None], [float(y) for y in ys if y is not None], ordered))
    _merge(out, parts)
    out["kind"] = "ordered" if ordered else "numeric"
    return out


def _comparable(pairs: list[tuple[Any, Any]], numeric: bool, num: Any) -> list[tuple[Any, Any]]:
    """The pairs whose answer is of the labels' kind (numbers against numbers); raises
    :class:`NotComparable` when none is."""
    if numeric:
        kept = [(lab, ans) for lab, ans in pairs if num(ans) is not None]
        if not kept:
            raise NotComparable(f"the labels are numbers (e.g. {pairs[0][0]!r}) but no answer is (e.g. {pairs[0][1]!r})")
        return kept
    if all(num(ans) is not None for _l, ans in pairs) and not any(num(lab) is not None for lab, _a in pairs):
        raise NotComparable(f"the answers are numbers (e.g. {pairs[0][1]!r}) but the labels are words (e.g. {pairs[0][0]!r})")
    return pairs


def _ordered(xs: list[Any], ys: list[Any], y_true: list[str], y_pred: list[str]) -> bool:
    """Whether numeric labels and answers are also categories: whole numbers, at most
    :data:`MAX_ORDERED` distinct values."""
    whole = all(x is not None and x.is_integer() for x in {*xs, *ys})
    return whole and len(set(y_true) | set(y_pred)) <= MAX_ORDERED


def _merge(out: dict[str, Any], parts: list[dict[str, Any]]) -> None:
    """Each part's figures into ``out``; the intervals of the figures ``out`` has, and the fewest
    resamples of any part."""
    for part in parts:
        ci, resamples = part.pop("ci"), part.pop("bootstrap_resamples")
        out.update(part)
        out["ci"].update({k: v for k, v in ci.items() if k in out["ci"]})
        out["bootstrap_resamples"] = min(resamples, out["bootstrap_resamples"] or resamples)


def _memo(f: Any) -> Any:
    cache: dict[Any, Any] = {}

    def memo(v: Any) -> Any:
        try:
            return cache[v]
        except KeyError:
            cache[v] = f(v)
            return cache[v]
        except TypeError:  # not hashable (a JSON list or object)
            return f(v)

    return memo


def _present(v: Any) -> bool:
    return v is not None and str(v).strip() != ""


def _classes(y_true: list[str], y_pred: list[str], ordered: bool) -> list[str]:
    found = set(y_true) | set(y_pred)
    if ordered:
        return [str(i) for i in sorted(int(c) for c in found)]
    by_count = Counter(y_true)
    return sorted(found, key=lambda c: (-by_count[c], c))


def _categorical(y_true: list[str], y_pred: list[str], ordered: bool) -> dict[str, Any]:
    import numpy as np
    from sklearn.metrics import accuracy_score, cohen_kappa_score, confusion_matrix, precision_recall_fscore_support

    classes = _classes(y_true, y_pred, ordered)
    # integer codes: the library's checks of 100,000 strings cost more than the figures.  Ordered
    # classes are their own numbers, so the quadratic weights are the numbers' distances.
    code = {c: int(c) for c in classes} if ordered else {c: i for i, c in enumerate(classes)}
    codes = [code[c] for c in classes]
    t = np.fromiter((code[c] for c in y_true), dtype=np.int64, count=len(y_true))
    p = np.fromiter((code[c] for c in y_pred), dtype=np.int64, count=len(y_pred))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "a single label was found": all the labels are given
        table = confusion_matrix(t, p, labels=codes)
        precision, recall, _f, support = precision_recall_fscore_support(t, p, labels=codes, zero_division=0)
        accuracy = float(accuracy_score(t, p))
        kappa = _finite(cohen_kappa_score(t, p, labels=codes))
        # every whole number between the extremes is a class of the weights
        span = list(range(codes[0], codes[-1] + 1)) if ordered else codes
        weighted = _finite(cohen_kappa_score(t, p, labels=span, weights="quadratic")) if ordered else None
    counts = Counter(y_true)
    out: dict[str, Any] = {
        "accuracy": accuracy,
        "cohen_kappa": kappa,
        "weighted_kappa": weighted,
        "baseline_accuracy": counts.most_common(1)[0][1] / len(y_true),
        "confusion": {a: {b: int(table[i][j]) for j, b in enumerate(classes)} for i, a in enumerate(classes)},
        "per_class": {
            c: {"precision": float(precision[i]), "recall": float(recall[i]), "support": int(support[i])}
            for i, c in enumerate(classes)
        },
        "bootstrap_resamples": RESAMPLES,
    }
    values = [float(c) for c in classes] if ordered else None
    out["ci"] = _table_intervals(table, values)
    return out


def table_figures(tables: Any, values: Any = None) -> dict[str, Any]:
    """The figures of confusion tables (shape ``(..., k, k)``, labels by row, answers by column)
    in closed form, vectorised over the leading axes: how the bootstrap resamples are measured
    (checked against the library figures of the observed table in tests/test_agreement.py).
    ``values``: the numbers of the k classes, for the weighted κ and the numeric figures."""
    import numpy as np

    d = np.asarray(tables, dtype=float)
    with np.errstate(all="ignore"):
        n = d.sum(axis=(-2, -1))
        rows, cols = d.sum(axis=-1), d.sum(axis=-2)
        expected = rows[..., :, None] * cols[..., None, :] / n[..., None, None]
        accuracy = np.trace(d, axis1=-2, axis2=-1) / n
        chance = np.trace(expected, axis1=-2, axis2=-1) / n
        out = {
            "accuracy": accuracy,
            "cohen_kappa": (accuracy - chance) / (1 - chance),
            "baseline_accuracy": rows.max(axis=-1) / n,
        }
        if values is None:
            return out
        v = np.asarray(values, dtype=float)
        diff = v[:, None] - v[None, :]
        out["weighted_kappa"] = 1 - (d * diff**2).sum(axis=(-2, -1)) / (expected * diff**2).sum(axis=(-2, -1))
        out["mae"] = (d * np.abs(diff)).sum(axis=(-2, -1)) / n
        out["rmse"] = np.sqrt((d * diff**2).sum(axis=(-2, -1)) / n)
        out["pearson"] = _weighted_corr(d, rows, cols, n, v, v)
        # Spearman: Pearson of the mid-ranks each class takes among the labels and among the answers
        rank_x = np.cumsum(rows, axis=-1) - (rows - 1) / 2
        rank_y = np.cumsum(cols, axis=-1) - (cols - 1) / 2
        out["spearman"] = _weighted_corr(d, rows, cols, n, rank_x, rank_y)
    return out


def _weighted_corr(d: Any, rows: Any, cols: Any, n: Any, x: Any, y: Any) -> Any:
    import numpy as np

    mx = (rows * x).sum(axis=-1) / n
    my = (cols * y).sum(axis=-1) / n
    dx = x - mx[..., None]
    dy = y - my[..., None]
    cov = (d * dx[..., :, None] * dy[..., None, :]).sum(axis=(-2, -1))
    return cov / np.sqrt((rows * dx**2).sum(axis=-1) * (cols * dy**2).sum(axis=-1))


def _table_intervals(table: Any, values: Any) -> dict[str, list[float] | None]:
    """Bootstrap intervals of the figures of a confusion table: resampling the rows is drawing
    the table's cells from a multinomial with the observed shares."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    n = int(table.sum())
    draws = rng.multinomial(n, (table / n).ravel(), size=RESAMPLES).reshape(RESAMPLES, *table.shape)
    figures = table_figures(draws, values)
    return {name: _percentiles([float(x) for x in figures[name] if math.isfinite(x)], RESAMPLES) for name in figures}


def _numeric(xs: list[float], ys: list[float], ordered: bool) -> dict[str, Any]:
    import numpy as np
    from scipy import stats

    x, y = np.asarray(xs), np.asarray(ys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = {
            "mae": float(np.mean(np.abs(x - y))),
            "rmse": float(np.sqrt(np.mean((x - y) ** 2))),
            "pearson": _finite(stats.pearsonr(x, y).statistic) if len(x) > 1 else None,
            "spearman": _finite(stats.spearmanr(x, y).statistic) if len(x) > 1 else None,
        }
    if ordered:  # the intervals came with the confusion table's
        return {**point, "ci": {}, "bootstrap_resamples": RESAMPLES}
    resamples = max(MIN_RESAMPLES, min(RESAMPLES, NUMERIC_WORK // max(1, len(x))))
    rng = np.random.default_rng(SEED)
    samples: dict[str, list[float]] = {k: [] for k in NUMERIC}
    batch = max(1, min(resamples, 2_000_000 // max(1, len(x))))
    done = 0
    while done < resamples:
        idx = rng.integers(0, len(x), size=(min(batch, resamples - done), len(x)))
        for name, values in _row_statistics(x[idx], y[idx]).items():
            samples[name].extend(float(v) for v in np.atleast_1d(values) if math.isfinite(v))
        done += len(idx)
    ci = {k: _percentiles(samples[k], resamples) if point[k] is not None else None for k in NUMERIC}
    return {**point, "ci": ci, "bootstrap_resamples": resamples}


def _row_statistics(a: Any, b: Any) -> dict[str, Any]:
    """The numeric figures of each row of ``a`` against the same row of ``b`` (resamples)."""
    import numpy as np
    from scipy import stats

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {
            "mae": np.mean(np.abs(a - b), axis=-1),
            "rmse": np.sqrt(np.mean((a - b) ** 2, axis=-1)),
            "pearson": stats.pearsonr(a, b, axis=-1).statistic,
            "spearman": stats.pearsonr(stats.rankdata(a, axis=-1), stats.rankdata(b, axis=-1), axis=-1).statistic,
        }


def _percentiles(values: list[float], resamples: int) -> list[float] | None:
    """The 2.5th and 97.5th percentiles, or None when most resamples left the figure undefined."""
    import numpy as np

    if len(values) < resamples / 2:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def _finite(v: Any) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


# --- a panel of judges: agreement among several answer columns (issue 25 item 3) ----------------


def panel_alpha(judges: dict[str, Sequence[Any]], level: str | None = None) -> float | None:
    """Krippendorff's α among the judges of a panel (``judges``: judge -> its answer per row, all
    of one length; an empty answer is a missing rating).  ``level``: ``nominal`` or
    ``interval``; None: interval when every answer is a number."""
    from batchgrader.reports.reliability import krippendorff_alpha

    columns = list(judges.values())
    if len(columns) < 2:
        return None
    units = [[v if _present(v) else None for v in row] for row in zip(*columns, strict=True)]
    return krippendorff_alpha(units, level)


def pairwise_kappa(judges: dict[str, Sequence[Any]]) -> dict[str, dict[str, float | None]]:
    """Cohen's κ of every pair of judges over the rows both answered (``judges``: judge -> its
    answer per row): judge -> other judge -> κ (symmetric; None when undefined, e.g. both
    judges gave one answer throughout)."""
    names = list(judges)
    out: dict[str, dict[str, float | None]] = {n: {} for n in names}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            k = _kappa_of(judges[a], judges[b])
            out[a][b] = out[b][a] = k
    return out


def _kappa_of(xs: Sequence[Any], ys: Sequence[Any]) -> float | None:
    pairs = [(normal(x), normal(y)) for x, y in zip(xs, ys, strict=True) if _present(x) and _present(y)]
    if not pairs:
        return None
    from sklearn.metrics import cohen_kappa_score

    classes = sorted({c for p in pairs for c in p})
    code = {c: i for i, c in enumerate(classes)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one class throughout: κ is 0/0 (nan), reported as None
        k = cohen_kappa_score([code[x] for x, _ in pairs], [code[y] for _, y in pairs], labels=list(code.values()))
    return _finite(k)


def per_judge(labels: Sequence[Any], judges: dict[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
    """Each judge's agreement with the human ``labels`` (the figures of :func:`agreement`); a
    judge whose answers cannot be compared with the labels gets ``{"error": ...}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, answers in judges.items():
        try:
            out[name] = agreement(labels, answers)
        except NotComparable as exc:
            out[name] = {"error": f"labels cannot be compared with the answers: {exc}"}
    return out
