"""`samples: 3` end to end over the emulator (real HTTP, the official SDK): `bgctl count`, the
requests the provider sees, the exact bill, and the vote, the report's agreement among the
samples and the disagreements file."""

from __future__ import annotations

import csv
import io
import json

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.reports.reliability import krippendorff_alpha
from batchgrader.store.eventstore import EventStore
from harness import FAST_CONFIG, TEST_KEY, bgctl

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CONFIG = """\
samples: 3
temperature: 1
max_row_retries: 0
reference_column: human
reference_field: score
response_format:
  type: object
  properties:
    score: {type: integer, minimum: 1, maximum: 3}
  required: [score]
  additionalProperties: false
"""
ROWS = 20


def _run(home):
    home.config_file.write_text(FAST_CONFIG + CONFIG)
    lines = "".join(f"{i},essay {i},{1 + i % 3}\n" for i in range(ROWS))
    (home.inbox / "essays.csv").write_text("id,response,human\n" + lines)
    counted = json.loads(bgctl(home.root, "count", str(home.inbox / "essays.csv"), "--json", check=True).stdout)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=5)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    with EventStore(home.db, readonly=True) as s:
        (job,) = fold(s.read()).jobs.values()
    return counted, job


def test_three_samples_per_row_are_sent_and_billed(home):
    counted, job = _run(home)
    assert (counted["rows"], counted["requests"]) == (ROWS, 3 * ROWS)
    assert job.ended == "completed" and job.rows == ROWS and job.requests == 3 * ROWS
    assert job.succeeded_rows == 3 * ROWS and not job.failed_rows
    # every sample is billed: at least the exact local count of the 60 prompts (the schema adds to it)
    assert job.prompt_tokens >= counted["input_tokens"] > 0 and job.cost_usd > 0


def test_the_vote_the_agreement_among_samples_and_the_disagreements(home, tmp_path):
    _counted, job = _run(home)
    rows = list(csv.DictReader(io.StringIO((home.outbox / "essays_results.csv").read_text(encoding="utf-8"))))
    assert len(rows) == ROWS
    samples = [json.loads(r["samples"]) for r in rows]
    assert all(len(s) == 3 and all(v in (1, 2, 3) for v in s) for s in samples)
    for r, s in zip(rows, samples, strict=True):
        median = sorted(s)[1]
        assert r["score"] == str(median) and r["error"] == ""  # three valid numbers: the median, never a tie
        assert float(r["sample_agreement"]) == pytest.approx(round(s.count(median) / 3, 4))
    assert sum(int(r["input_tokens"]) for r in rows) == job.prompt_tokens  # every sample's tokens
    rep = json.loads(bgctl(home.root, "report", job.job_id, "--json", check=True).stdout)
    a = rep["agreement"]
    assert a["krippendorff_alpha"] == pytest.approx(krippendorff_alpha(samples, "interval"))
    assert a["samples"]["unanimous"] == sum(1 for s in samples if len(set(s)) == 1)
    assert a["n"] == ROWS  # the labels are compared with the vote
    out = tmp_path / "review.csv"
    r = bgctl(home.root, "report", job.job_id, "--disagreements", str(out))
    assert r.returncode == 0, r.stderr
    written = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    expected = [x["id"] for x, s in zip(rows, samples, strict=True) if len(set(s)) > 1 or x["human"] != x["score"]]
    assert [w["id"] for w in written] == expected and written
    assert list(written[0]) == ["id", "response", "human", "model_answer", "samples"]
    assert "Krippendorff alpha (interval)" in bgctl(home.root, "report", job.job_id).stdout
