"""This run's verdicts against OpenAI's own exported output items, criterion by criterion.

For each criterion: the items both graded, raw agreement of ``passed`` and Cohen's kappa, the
flips (passed here and failed there, and the reverse), the pass-rate difference, and the score
differences.  For a ``text_similarity`` criterion every variant of its metric is scored on those
items and the one closest to OpenAI's scores (smallest mean absolute difference) is chosen, with
its largest difference, its flips at the threshold and the rows within ``EPSILON`` of it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from batchgrader.pipeline.evals import graders, templates
from batchgrader.pipeline.evals.data import Row
from batchgrader.pipeline.evals.spec import Criterion

EPSILON = 0.02  # a score this close to the threshold may flip between implementations


def reference_results(output_items: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Mapping[str, Any]]]:
    """``{datasource_item_id: {criterion name: result}}`` of OpenAI's output items."""
    out: dict[int, dict[str, Mapping[str, Any]]] = {}
    for oi in output_items:
        out[int(oi["datasource_item_id"])] = {str(r.get("name")): r for r in oi.get("results") or [] if isinstance(r, Mapping)}
    return out


def _reference_for(c: Criterion, by_name: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """OpenAI names a result by the criterion's name, or by its id (``<name>-<uuid>``)."""
    return by_name.get(c.name) or by_name.get(c.ident)


def choose_variants(
    criteria: Sequence[Criterion], rows: Sequence[Row], reference: Mapping[int, Mapping[str, Mapping[str, Any]]]
) -> dict[int, dict[str, Any]]:
    """For each text_similarity criterion with reference scores: every variant's closeness and the chosen one."""
    out: dict[int, dict[str, Any]] = {}
    for c in criteria:
        if c.type != "text_similarity" or c.embedded:  # cosine: its vectors are paid for, one model only
            continue
        pairs: list[tuple[str, str, float]] = []
        for r in rows:
            ref = _reference_for(c, reference.get(r.index, {}))
            if ref is None or not isinstance(ref.get("score"), int | float):
                continue
            sample = templates.sample_namespace(r.sample)
            try:
                value = templates.render(str(c.raw["input"]), r.item, sample)
                target = templates.render(str(c.raw["reference"]), r.item, sample)
            except templates.MissingVariable:
                continue
            pairs.append((value, target, float(ref["score"])))
        if not pairs:
            continue
        metric = c.raw["evaluation_metric"]
        assert c.threshold is not None
        tried = []
        for variant in graders.VARIANTS[metric]:
            fn = graders.scorer(metric, variant)
            diffs = [fn(a, b) - s for a, b, s in pairs]
            ours = [fn(a, b) for a, b, _s in pairs]
            flips = sum((o >= c.threshold) != (s >= c.threshold) for o, (_a, _b, s) in zip(ours, pairs))
            tried.append(
                {
                    "variant": variant,
                    "description": graders.describe(metric, variant),
                    "mean_abs_diff": statistics.fmean(abs(d) for d in diffs),
                    "max_abs_diff": max(abs(d) for d in diffs),
                    "flips": flips,
                }
            )
        tried.sort(key=lambda t: (t["mean_abs_diff"], t["flips"]))
        out[c.index] = {
            "metric": metric,
            "chosen": tried[0]["variant"],
            "compared_rows": len(pairs),
            "near_threshold_rows": sum(abs(s - c.threshold) <= EPSILON for _a, _b, s in pairs),
            "variants": tried,
        }
    return out


def compare(
    criteria: Sequence[Criterion],
    ours: Mapping[int, Mapping[int, graders.Verdict]],
    reference: Mapping[int, Mapping[str, Mapping[str, Any]]],
    kappa: Callable[[list[bool], list[bool]], float | None] | None = None,
) -> list[dict[str, Any]]:
    """Per criterion: agreement with OpenAI's verdicts on the items both have (``ours``: item
    index -> criterion index -> verdict)."""
    kappa = kappa or cohen_kappa
    out = []
    for c in criteria:
        a: list[bool] = []
        b: list[bool] = []
        diffs: list[float] = []
        for index, verdicts in ours.items():
            v = verdicts.get(c.index)
            ref = _reference_for(c, reference.get(index, {}))
            if v is None or v.error or ref is None or not isinstance(ref.get("passed"), bool):
                continue
            a.append(v.passed)
            b.append(bool(ref["passed"]))
            if v.score is not None and isinstance(ref.get("score"), int | float):
                diffs.append(v.score - float(ref["score"]))
        if not a:
            out.append({"criterion": c.name, "compared": 0})
            continue
        out.append(
            {
                "criterion": c.name,
                "compared": len(a),
                "agreement": sum(x == y for x, y in zip(a, b)) / len(a),
                "kappa": kappa(a, b),
                "pass_rate": sum(a) / len(a),
                "openai_pass_rate": sum(b) / len(b),
                "pass_rate_delta": (sum(a) - sum(b)) / len(a),
                "flips_to_pass": sum(x and not y for x, y in zip(a, b)),
                "flips_to_fail": sum(y and not x for x, y in zip(a, b)),
                "score_mean_abs_diff": statistics.fmean(abs(d) for d in diffs) if diffs else None,
                "score_max_abs_diff": max(abs(d) for d in diffs) if diffs else None,
            }
        )
    return out


def cohen_kappa(a: list[bool], b: list[bool]) -> float | None:
    """Cohen's kappa of two pass/fail lists (scikit-learn's); None when it is undefined (one
    verdict everywhere on both sides)."""
    if len(set(a) | set(b)) < 2:
        return None
    from sklearn.metrics import cohen_kappa_score

    k = float(cohen_kappa_score(a, b))
    return k if k == k else None  # NaN: undefined
