"""Agreement figures (reports/agreement.py) against hand-computed values on known tables.

Every expected value below is worked out by hand (or by the plain formulas in this file), not by
the library calls the module makes."""

from __future__ import annotations

import math

import pytest

from batchgrader.reports.agreement import NotComparable, agreement, table_figures


def _expand(table: dict[tuple[str, str], int]) -> tuple[list[str], list[str]]:
    labels, answers = [], []
    for (a, b), n in table.items():
        labels += [a] * n
        answers += [b] * n
    return labels, answers


def _pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def _midranks(x: list[float]) -> list[float]:
    order = sorted(x)
    return [(order.index(v) + 1 + len(order) - order[::-1].index(v)) / 2 for v in x]


def test_cohen_kappa_of_the_textbook_two_by_two_table():
    # 50 items: yes/yes 20, yes/no 5, no/yes 10, no/no 15.  p_o = 35/50 = 0.7;
    # p_e = (25*30 + 25*20) / 50^2 = 0.5;  kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    labels, answers = _expand({("Yes", "yes"): 20, ("yes", "No"): 5, ("no", "yes"): 10, ("no", "no"): 15})
    a = agreement(labels, answers)
    assert a["kind"] == "categorical" and a["n"] == 50
    assert a["accuracy"] == pytest.approx(0.7)
    assert a["cohen_kappa"] == pytest.approx(0.4)
    assert a["baseline_accuracy"] == pytest.approx(0.5)  # 25 of 50 labels are the most frequent
    assert a["weighted_kappa"] is None and a["mae"] is None and a["pearson"] is None
    assert a["confusion"] == {"yes": {"yes": 20, "no": 5}, "no": {"yes": 10, "no": 15}}
    # precision of "yes": 20 of the 30 "yes" answers; recall: 20 of the 25 "yes" labels
    assert a["per_class"]["yes"] == {"precision": pytest.approx(20 / 30), "recall": pytest.approx(0.8), "support": 25}
    for key in ("accuracy", "cohen_kappa", "baseline_accuracy"):
        lo, hi = a["ci"][key]
        assert lo <= a[key] <= hi
    assert a["ci"]["mae"] is None and a["ci"]["weighted_kappa"] is None


ORDERED = {("1", "1"): 2, ("1", "2"): 1, ("2", "2"): 2, ("2", "3"): 1, ("3", "3"): 2}


def test_ordered_scores_by_hand():
    # rows (labels) 3, 3, 2; columns (answers) 2, 3, 3; n = 8.
    # kappa: p_o = 6/8, p_e = (3*2 + 3*3 + 2*3) / 64 = 21/64 -> (48 - 21) / (64 - 21) = 27/43
    # quadratic: observed sum w*d = 1 + 1 = 2; expected sum w*E = 82/8 -> 1 - 2 / 10.25 = 33/41
    # MAE 2/8, RMSE sqrt(2/8); Pearson 4.125 / 4.875 = 11/13
    labels, answers = _expand(ORDERED)
    a = agreement(labels, answers)
    assert a["kind"] == "ordered" and a["n"] == 8
    assert a["accuracy"] == pytest.approx(0.75)
    assert a["cohen_kappa"] == pytest.approx(27 / 43)
    assert a["weighted_kappa"] == pytest.approx(33 / 41)
    assert a["baseline_accuracy"] == pytest.approx(3 / 8)
    assert a["mae"] == pytest.approx(0.25) and a["rmse"] == pytest.approx(0.5)
    assert a["pearson"] == pytest.approx(11 / 13)
    x, y = [float(v) for v in labels], [float(v) for v in answers]
    assert a["spearman"] == pytest.approx(_pearson(_midranks(x), _midranks(y)))
    assert set(a["ci"]) == {
        "accuracy",
        "cohen_kappa",
        "weighted_kappa",
        "baseline_accuracy",
        "mae",
        "rmse",
        "pearson",
        "spearman",
    }
    for key, ci in a["ci"].items():
        assert ci is not None and ci[0] <= a[key] + 1e-9 and a[key] - 1e-9 <= ci[1], key


def test_the_closed_form_table_figures_match_the_library_figures():
    """The bootstrap measures each resampled table in closed form: on the observed table those
    formulas give the library's figures."""
    labels, answers = _expand(ORDERED)
    a = agreement(labels, answers)
    table = [[a["confusion"][r][c] for c in a["confusion"]] for r in a["confusion"]]
    f = table_figures(table, [1.0, 2.0, 3.0])
    for key in ("accuracy", "cohen_kappa", "weighted_kappa", "baseline_accuracy", "mae", "rmse", "pearson", "spearman"):
        assert float(f[key]) == pytest.approx(a[key]), key


def test_weighted_kappa_counts_the_distance_of_the_numbers_not_of_their_ranks():
    # labels 1 and 5, answers 1 and 4: observed, one miss (5 answered 4) of weight (5-4)^2 = 1.
    # Expected E = row x column / n = 1/2 in each of (1,1), (1,4), (5,1), (5,4), of weights
    # 0, 9, 16, 1: sum 13, so kappa_w = 1 - 1/13 (weights by rank, 0 1 4 1, would give 1 - 1/3).
    a = agreement(["1", "5"], ["1", "4"])
    assert a["weighted_kappa"] == pytest.approx(1 - 1 / 13)


def test_numbers_with_many_values_get_the_numeric_figures_only():
    labels = [i / 10 for i in range(40)]
    answers = [x + 0.05 * (i % 3) for i, x in enumerate(labels)]  # off by 0 (14 rows), 0.05 (13), 0.1 (13)
    a = agreement(labels, answers)
    assert a["kind"] == "numeric" and a["accuracy"] is None and a["confusion"] is None
    assert a["mae"] == pytest.approx((13 * 0.05 + 13 * 0.1) / 40)
    assert a["rmse"] == pytest.approx(math.sqrt((13 * 0.05**2 + 13 * 0.1**2) / 40))
    assert a["pearson"] == pytest.approx(_pearson(labels, answers))
    assert a["spearman"] == pytest.approx(_pearson(_midranks(labels), _midranks(answers)))
    lo, hi = a["ci"]["mae"]
    assert lo < a["mae"] < hi


def test_empty_labels_are_left_out_and_failed_answers_too():
    a = agreement(["pass", "", None, "fail", "pass"], ["pass", "fail", "fail", None, "PASS "])
    assert a["n"] == 2 and a["accuracy"] == 1.0


def test_numbers_against_words_are_not_comparable():
    with pytest.raises(NotComparable, match="labels are numbers"):
        agreement(["1", "2"], ["good", "bad"])
    with pytest.raises(NotComparable, match="answers are numbers"):
        agreement(["good", "bad"], ["1", "2"])


def test_an_interval_narrows_as_the_table_grows():
    small = agreement(*_expand({("a", "a"): 8, ("a", "b"): 2, ("b", "b"): 8, ("b", "a"): 2}))
    large = agreement(*_expand({("a", "a"): 800, ("a", "b"): 200, ("b", "b"): 800, ("b", "a"): 200}))
    width = lambda a: a["ci"]["cohen_kappa"][1] - a["ci"]["cohen_kappa"][0]
    assert small["cohen_kappa"] == pytest.approx(large["cohen_kappa"]) == pytest.approx(0.6)
    assert width(large) < width(small) / 5


# --- a judge panel's statistics ------------------------------------------------------------------


def test_panel_alpha_of_the_textbook_example():
    from batchgrader.reports.agreement import panel_alpha

    n = None  # Krippendorff (2011): 4 observers, 12 units; alpha 0.743 nominal, 0.849 interval
    judges = {
        "a": [1, 2, 3, 3, 2, 1, 4, 1, 2, n, n, n],
        "b": [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, n, 3],
        "c": [n, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, n],
        "d": [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, ""],
    }
    assert panel_alpha(judges, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert panel_alpha(judges) == pytest.approx(0.849, abs=5e-4)
    assert panel_alpha({"a": judges["a"]}) is None


def test_pairwise_kappa_of_the_textbook_table_and_per_judge_agreement():
    from batchgrader.reports.agreement import pairwise_kappa, per_judge

    first, second = _expand({("Yes", "yes"): 20, ("yes", "No"): 5, ("no", "yes"): 10, ("no", "no"): 15})
    judges = {"first": first, "second": second, "copy": list(first)}
    k = pairwise_kappa(judges)
    assert k["first"]["second"] == k["second"]["first"] == pytest.approx(0.4)
    assert k["first"]["copy"] == pytest.approx(1.0) and "first" not in k["first"]
    assert pairwise_kappa({"a": ["x", "x"], "b": ["x", "x"]})["a"]["b"] is None  # one class: undefined
    each = per_judge(first, {"second": second, "copy": first, "numbers": [1] * len(first)})
    assert each["second"]["cohen_kappa"] == pytest.approx(0.4) and each["copy"]["accuracy"] == 1.0
    assert "cannot be compared" in each["numbers"]["error"]
