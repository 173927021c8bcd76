"""Agreement among the samples of each row (reports/reliability.py): Krippendorff's α against the
textbook, and the report's figures read from a result file with samples."""

from __future__ import annotations

import csv
import json

import pytest

from batchgrader.pipeline.outbox import added_columns
from batchgrader.reports.disagreements import samples_disagree
from batchgrader.reports.reliability import krippendorff_alpha, sample_agreement, unanimous
from batchgrader.reports.report import _read_result, result_layout
from batchgrader.reports.report_html import _agreement as html_agreement
from batchgrader.reports.report_text import agreement_lines

N = None
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", the worked example with
# missing values: 4 observers, 12 units; alpha = 0.743 (nominal) and 0.849 (interval)
OBSERVERS = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, N, N, N],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, N, 3],
    [N, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, N],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, N],
]
UNITS = [list(u) for u in zip(*OBSERVERS, strict=True)]


def _nominal_alpha_by_hand(units):
    """α from the coincidence matrix, as the textbook computes it."""
    from collections import Counter
    from itertools import permutations

    o: Counter = Counter()
    for u in units:
        vals = [v for v in u if v is not None]
        if len(vals) < 2:
            continue
        for a, b in permutations(range(len(vals)), 2):
            o[(vals[a], vals[b])] += 1 / (len(vals) - 1)
    n_c: Counter = Counter()
    for (a, _b), w in o.items():
        n_c[a] += w
    n = sum(n_c.values())
    d_o = sum(w for (a, b), w in o.items() if a != b) / n
    d_e = sum(n_c[a] * n_c[b] for a in n_c for b in n_c if a != b) / (n * (n - 1))
    return 1 - d_o / d_e


def test_alpha_of_the_textbook_example():
    assert krippendorff_alpha(UNITS, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert krippendorff_alpha(UNITS, "interval") == pytest.approx(0.849, abs=5e-4)
    assert krippendorff_alpha(UNITS) == krippendorff_alpha(UNITS, "interval")  # numbers: interval
    assert krippendorff_alpha(UNITS, "nominal") == pytest.approx(_nominal_alpha_by_hand(UNITS))


def test_alpha_of_words_is_nominal_and_undefined_without_variation():
    words = [["pass", "Pass"], ["pass", "fail"], ["fail", "fail"]]
    assert krippendorff_alpha(words) == pytest.approx(
        _nominal_alpha_by_hand([["pass", "pass"], ["pass", "fail"], ["fail", "fail"]])
    )
    assert krippendorff_alpha(words) == pytest.approx(1 - (2 / 6) / (18 / 30))  # 0.444 by hand
    assert krippendorff_alpha([[3, 3], [3, 3]]) is None  # one value throughout
    assert krippendorff_alpha([[3, None], [None, 4]]) is None  # no unit rated twice


def test_sample_agreement_and_unanimous_rows():
    cells = ["[4, 4, 5]", "[3, 3, 3]", "[null, 2, 3]", "", "[2, 2, 2]"]
    got = sample_agreement(cells)
    assert got is not None
    assert (got["k"], got["rows"], got["level"], got["unanimous"]) == (3, 4, "interval", 2)
    assert got["unanimous_share"] == 0.5
    assert got["krippendorff_alpha"] == pytest.approx(krippendorff_alpha([[4, 4, 5], [3, 3, 3], [N, 2, 3], [2, 2, 2]]))
    assert not unanimous([None, 5, 5]) and unanimous(["a", "A "])
    assert sample_agreement(["", None]) is None


def test_samples_disagree_when_two_answers_differ_or_the_vote_failed():
    assert samples_disagree("[4, 5, 4]", "")
    assert samples_disagree("[4, null, 5]", "no_majority: the samples tie")
    assert not samples_disagree("[null, 5, 5]", "")  # a failed sample is no disagreement
    assert not samples_disagree("[null, null, null]", "batch_expired: too late")


def test_the_report_reads_the_samples_of_a_result_file(tmp_path):
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "g", "schema": {"type": "object", "properties": {"score": {"type": "integer"}}}},
    }
    settings = {"output_column": "grade", "response_format": schema}
    cols = added_columns(["id", "response"], "grade", schema, samples=3)
    header = ["id", "response", *cols.written()]
    samples = [[4, 4, 5], [3, 3, 3], [2, 5, None], [1, 1, 1]]
    path = tmp_path / "r.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i, s in enumerate(samples):
            tie = i == 2
            score = "" if tie else str(sorted(x for x in s if x is not None)[1])
            err = "no_majority: the samples tie" if tie else ""
            grade = "" if tie else json.dumps({"score": int(score)})
            w.writerow([i, f"essay {i}", "batch", grade, score, "30", "15", err, json.dumps(s), "0.6667", "3"])
    assert result_layout(header, settings).samples == "samples"
    got = _read_result(str(path), settings)
    a = got["agreement"]
    assert a["reference_column"] is None and a["samples"]["rows"] == 4 and a["samples"]["unanimous"] == 2
    assert a["krippendorff_alpha"] == pytest.approx(krippendorff_alpha(samples, "interval"))
    assert got["failed_by_code"] == {"no_majority": 1}
    text = "\n".join(agreement_lines(a))
    assert "agreement among the 3 samples of each row (4 rows)" in text and "unanimous rows" in text
    assert "Krippendorff" in "".join(html_agreement(a))
