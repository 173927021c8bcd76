"""`bgctl report`, write_report and on_job_end, end to end over the emulator."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from html.parser import HTMLParser

import pytest

from batchgrader.core.state import fold
from batchgrader.provider.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from batchgrader.store.report import distribution
from harness import FAST_CONFIG, TEST_KEY, bgctl, event_types

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SCHEMA = """\
response_format:
  type: object
  properties:
    score: {type: integer, minimum: 1, maximum: 5}
    label: {type: string, enum: [pass, fail]}
  required: [score, label]
  additionalProperties: false
"""


def only_job(home):
    with EventStore(home.db, readonly=True) as s:
        (job,) = fold(s.read()).jobs.values()
    return job


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts: list[str] = []
        self.tags: Counter[str] = Counter()
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] += 1
        if tag == "svg" and a.get("class") == "chart":
            self.charts.append(a["data-column"])
        for k in ("src", "href"):
            if a.get(k):
                self.external.append(a[k])


def test_report_figures_match_the_result_file_and_html_has_one_chart_per_column(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG + SCHEMA + "max_row_retries: 1\nwrite_report: true\n")
    (home.inbox / "essays.csv").write_text("id,response\n" + "".join(f"{i},essay number {i}\n" for i in range(40)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, request_failure_rate=0.3, seed=5)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    job = only_job(home)
    rows = list(csv.DictReader(io.StringIO((home.outbox / "essays_results.csv").read_text(encoding="utf-8"))))
    r = bgctl(home.root, "report", job.job_id, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    answered = [x for x in rows if not x["error"]]
    failed = [x for x in rows if x["error"]]
    assert rep["rows"]["total"] == 40 and rep["rows"]["in_result"] == len(rows) == 40
    assert rep["rows"]["answered"] == len(answered) and rep["rows"]["failed"] == len(failed)
    assert sum(rep["rows"]["failed_by_code"].values()) == len(failed)
    assert rep["rows"]["answered_on_retry"] is not None and rep["rows"]["answered_on_retry"] > 0
    assert rep["tokens"]["prompt"] == job.prompt_tokens == sum(int(x["input_tokens"]) for x in answered)
    assert rep["tokens"]["completion"] == sum(int(x["output_tokens"]) for x in answered)
    assert rep["tokens"]["estimated_input"] > 0
    assert rep["cost_usd"]["billed"] == pytest.approx(job.cost_usd, abs=1e-6)
    assert rep["cost_usd"]["estimate"]["max_total"] > 0
    assert {p["phase"] for p in rep["phases"]} >= {"prepare", "total"}
    assert all(p["seconds"] is not None and p["seconds"] >= 0 for p in rep["phases"])
    cols = {c["name"]: c for c in rep["columns"]}
    assert set(cols) == {"grade", "score", "label"}
    scores = Counter(float(x["score"]) for x in answered)
    assert cols["score"]["kind"] == "numeric"
    assert {b["low"]: b["count"] for b in cols["score"]["bins"]} == dict(scores)
    labels = Counter(x["label"] for x in answered)
    assert cols["label"]["kind"] == "categorical"
    assert {c["value"]: c["count"] for c in cols["label"]["counts"]} == dict(labels)
    # the terminal summary and the HTML page
    html_path = tmp_path / "r.html"
    r = bgctl(home.root, "report", job.job_id[:8], "--html", str(html_path))
    assert r.returncode == 0, r.stderr
    assert f"{len(answered)} answered" in r.stdout and "score" in r.stdout
    for page_path in (html_path, home.outbox / "essays_report.html"):
        page = _Page()
        page.feed(page_path.read_text(encoding="utf-8"))
        assert page.charts == [c["name"] for c in rep["columns"]] and sorted(page.charts) == ["grade", "label", "score"]
        assert page.external == []  # self-contained: nothing is fetched
        assert page.tags["script"] == 0
        if failed:
            assert page.tags["tr"] >= len(failed[:50])


def test_on_job_end_runs_once_with_the_job_figures_and_never_affects_the_job(home):
    out = home.root / "hook.txt"
    home.config_file.write_text(
        FAST_CONFIG
        + f"on_job_end: 'echo \"$BG_JOB_ID $BG_JOB_STATE $BG_RESULT_PATH $BG_COST_USD key=$OPENAI_API_KEY\" >> {out}; echo hook-says-hi; exit 3'\n"
    )
    (home.inbox / "a.csv").write_text("id,response\n1,x\n2,y\n")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        job = only_job(home)
        assert job.state == "completed"  # exit 3 changed nothing
        (line,) = out.read_text().splitlines()
        jid, state, result, cost, key = line.split(" ")
        assert (jid, state, result) == (job.job_id, "completed", str(home.outbox / "a_results.csv"))
        assert float(cost) == pytest.approx(job.cost_usd, abs=1e-6)
        assert key == "key="  # the API key is not passed on
        log = (home.root / "logs" / "daemon.log").read_text()
        assert "hook-says-hi" in log and "exited with status 3" in log
        # a restart does not run it again
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    assert len(out.read_text().splitlines()) == 1
    assert event_types(home.db).count("JobEndHookStarted") == 1


def test_on_job_end_environment_holds_no_key_of_any_provider(home):
    """Issue 23 (7): the hook dumps its whole environment; no key variable the config knows is in
    it (set in the environment or read from secrets.env), nor a copy of a key under another name."""
    import subprocess

    from batchgrader.secrets import write_env_file
    from harness import BGCTL, daemon_env

    out = home.root / "hook-env.txt"
    home.config_file.write_text(FAST_CONFIG + f"on_job_end: 'env > {out}'\n")
    file_keys = {
        "ANTHROPIC_API_KEY": "sk-ant-from-file-0123456789",
        "GEMINI_API_KEY": "gemini-from-file-0123456789",
        "GOOGLE_API_KEY": "google-from-file-0123456789",
        "AZURE_OPENAI_API_KEY": "azure-from-file-0123456789",
    }
    write_env_file(home.root / "secrets.env", file_keys)
    env_keys = {
        "BATCHGRADER_ANTHROPIC_API_KEY": "bg-anthropic-env-0123456789",
        "BATCHGRADER_GEMINI_API_KEY": "bg-gemini-env-0123456789",
        "BATCHGRADER_AZURE_API_KEY": "bg-azure-env-0123456789",
        "COPY_OF_THE_KEY": TEST_KEY,  # a key's value under a name the config does not know
    }
    (home.inbox / "a.csv").write_text("id,response\n1,x\n")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        env = {
            k: v
            for k, v in daemon_env(home.root, emu.base_url).items()
            if not k.startswith(("ANTHROPIC_", "GEMINI_", "GOOGLE_", "AZURE_"))
        }
        env.update(env_keys)
        res = subprocess.run([BGCTL, "daemon", "--once"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    dumped = out.read_text()
    assert "BG_JOB_ID=" in dumped and f"BATCHGRADER_HOME={home.root}" in dumped  # the hook ran, with the rest of the environment
    for secret in (TEST_KEY, *file_keys.values(), *env_keys.values()):
        assert secret not in dumped
    names = {line.split("=", 1)[0] for line in dumped.splitlines() if "=" in line}
    assert not names & {"OPENAI_API_KEY", "BATCHGRADER_API_KEY", *file_keys, *env_keys}


def test_on_job_end_is_killed_after_its_timeout(home):
    home.config_file.write_text(FAST_CONFIG + "on_job_end: 'sleep 30'\non_job_end_timeout_seconds: 0.5\n")
    (home.inbox / "a.csv").write_text("id,response\n1,x\n")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        r = bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
    assert r.returncode == 0
    assert only_job(home).state == "completed"
    assert "was killed after 0.5 s" in (home.root / "logs" / "daemon.log").read_text()


def test_distribution_numbers_and_categories():
    d = distribution("x", [1.5, 2.5, None, "", 10.0])
    assert d["kind"] == "numeric" and d["values"] == 3 and d["missing"] == 2
    assert sum(b["count"] for b in d["bins"]) == 3 and len(d["bins"]) == 10
    c = distribution("y", ["Score: 1", "Score: 2", "Score: 1", None])
    assert c["kind"] == "categorical" and c["counts"] == [{"value": "Score: 1", "count": 2}, {"value": "Score: 2", "count": 1}]
