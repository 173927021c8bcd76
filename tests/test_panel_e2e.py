"""A judge panel end to end over the emulator (real HTTP, the official SDKs): two judges on two
providers (an OpenAI model and claude-haiku-4-5) answer the same rows in one `bgctl daemon
--once`; the panel's result, its report and its disagreements."""

from __future__ import annotations

import csv
import io
import json
import subprocess

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from harness import BGCTL, FAST_CONFIG, TEST_KEY, bgctl, daemon_env

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CONFIG = """\
max_row_retries: 0
response_format:
  type: object
  properties:
    score: {type: integer, minimum: 1, maximum: 3}
  required: [score]
  additionalProperties: false
profiles:
  panel:
    judges: [gpt, claude]
    reference_column: human
    reference_field: score
  gpt:
    model: gpt-5.4-mini
  claude:
    provider: anthropic
    model: claude-haiku-4-5
"""
ROWS = 12


def test_two_judges_on_two_providers_answer_the_same_rows_in_one_job(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG + CONFIG)
    (home.inbox / "panel").mkdir(exist_ok=True)
    lines = "".join(f"{i},essay {i},{1 + i % 3}\n" for i in range(ROWS))
    (home.inbox / "panel" / "essays.csv").write_text("id,response,human\n" + lines)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=7)) as emu:
        env = {**daemon_env(home.root, emu.base_url), "ANTHROPIC_BASE_URL": emu.root_url, "ANTHROPIC_API_KEY": TEST_KEY}
        res = subprocess.run([BGCTL, "daemon", "--once"], env=env, capture_output=True, text=True, timeout=240, check=False)
        assert res.returncode == 0, res.stderr[-3000:]
        assert emu.request_count("POST", "/v1/messages/batches") == 1  # claude's batch went to the Anthropic API
    with EventStore(home.db, readonly=True) as s:
        jobs = fold(s.read()).jobs
    (panel,) = [j for j in jobs.values() if j.panel is not None]
    judges = [jobs[j["job_id"]] for j in panel.panel or ()]
    assert [(j.profile, j.provider, j.ended) for j in judges] == [
        ("gpt", "openai", "completed"),
        ("claude", "anthropic", "completed"),
    ]
    assert panel.ended in ("completed", "completed_with_errors") and panel.cost_usd == 0
    assert all(j.cost_usd > 0 for j in judges)
    rows = list(csv.DictReader(io.StringIO((home.outbox / "essays_results.csv").read_text(encoding="utf-8"))))
    assert len(rows) == ROWS
    out = "grade"  # the panel's output_column
    kept = ["score", "input_tokens", "output_tokens", "error", "answered_by"]
    assert list(rows[0]) == [
        *["id", "response", "human", f"{out}_gpt", f"{out}_claude", out, f"{out}_agreement", "error"],
        *[f"{c}_gpt" for c in kept],
        *[f"{c}_claude" for c in kept],
    ]
    for r in rows:
        a, b = r[f"{out}_gpt"], r[f"{out}_claude"]
        assert a in ("1", "2", "3") and b in ("1", "2", "3")
        if a == b:
            assert (r[out], r[f"{out}_agreement"], r["error"]) == (a, "1", "")
        else:  # two judges that differ: a tie, no pick
            assert r[out] == "" and r["error"].startswith("no_majority: the judges tie")
    rep = json.loads(bgctl(home.root, "report", panel.job_id, "--json", check=True).stdout)
    a = rep["agreement"]
    assert set(a["per_judge"]) == {"gpt", "claude"} and a["panel"]["judges"] == ["gpt", "claude"]
    assert a["per_judge"]["gpt"]["n"] == ROWS
    assert a["per_judge"]["gpt"]["accuracy"] == pytest.approx(sum(r[f"{out}_gpt"] == r["human"] for r in rows) / ROWS)
    review = tmp_path / "review.csv"
    r = bgctl(home.root, "report", panel.job_id, "--disagreements", str(review))
    assert r.returncode == 0, r.stderr
    written = list(csv.DictReader(io.StringIO(review.read_text(encoding="utf-8"))))
    expected = [x["id"] for x in rows if x[f"{out}_gpt"] != x[f"{out}_claude"] or (x[out] and x[out] != x["human"])]
    assert [w["id"] for w in written] == expected
