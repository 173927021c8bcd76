"""`bgctl report`, write_report and on_job_end, end to end over the emulator."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from html.parser import HTMLParser

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.reports.report_columns import distribution
from batchgrader.store.eventstore import EventStore
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
    assert set(cols) == {"score", "label"}  # the answer column holds the whole JSON: its fields are charted
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
        assert page.charts == [c["name"] for c in rep["columns"]] and sorted(page.charts) == ["label", "score"]
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

    from batchgrader.core.host.secrets import write_env_file
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


LABELLED = """\
reference_column: human
reference_field: score
group_column: topic
"""


def _kappa(pairs):
    """Cohen's kappa by its definition: (p_o - p_e) / (1 - p_e)."""
    n = len(pairs)
    p_o = sum(a == b for a, b in pairs) / n
    labels, answers = Counter(a for a, _b in pairs), Counter(b for _a, b in pairs)
    p_e = sum(labels[c] * answers[c] for c in set(labels) | set(answers)) / n**2
    return (p_o - p_e) / (1 - p_e)


def test_agreement_with_human_labels_and_the_disagreements_file(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG + SCHEMA + LABELLED + "max_row_retries: 0\n")
    lines = "".join(f"{i},essay {i},{'' if i % 7 == 0 else 1 + i % 5},{'t' + str(i % 3)}\n" for i in range(60))
    (home.inbox / "essays.csv").write_text("id,response,human,topic\n" + lines)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, request_failure_rate=0.1, seed=11)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    job = only_job(home)
    rows = list(csv.DictReader(io.StringIO((home.outbox / "essays_results.csv").read_text(encoding="utf-8"))))
    pairs = [(int(x["human"]), int(x["score"])) for x in rows if x["human"] and not x["error"]]
    rep = json.loads(bgctl(home.root, "report", job.job_id, "--json").stdout)
    a = rep["agreement"]
    for key in (
        "n",
        "accuracy",
        "cohen_kappa",
        "weighted_kappa",
        "confusion",
        "baseline_accuracy",
        "mae",
        "rmse",
        "pearson",
        "spearman",
        "ci",
    ):
        assert key in a, key
    assert a["n"] == len(pairs) > 20
    assert a["labelled"] == sum(1 for x in rows if x["human"]) and a["unanswered"] == sum(
        1 for x in rows if x["human"] and x["error"]
    )
    assert a["accuracy"] == pytest.approx(sum(h == s for h, s in pairs) / len(pairs))
    assert a["cohen_kappa"] == pytest.approx(_kappa(pairs))
    assert a["mae"] == pytest.approx(sum(abs(h - s) for h, s in pairs) / len(pairs))
    assert a["baseline_accuracy"] == pytest.approx(Counter(h for h, _s in pairs).most_common(1)[0][1] / len(pairs))
    assert {(int(h), int(s)): n for h, row in a["confusion"].items() for s, n in row.items() if n} == Counter(pairs)
    assert a["ci"]["cohen_kappa"][0] <= a["cohen_kappa"] <= a["ci"]["cohen_kappa"][1]
    assert {g["value"] for g in rep["groups"]["groups"]} == {"t0", "t1", "t2"}
    assert sum(g["answered"] + g["failed"] for g in rep["groups"]["groups"]) == 60
    # terminal and HTML show the figures, the HTML the confusion matrix as a heat map
    page_path = tmp_path / "r.html"
    out = tmp_path / "to_label.csv"
    r = bgctl(home.root, "report", job.job_id, "--html", str(page_path), "--disagreements", str(out))
    assert r.returncode == 0, r.stderr
    assert "Cohen's kappa" in r.stdout and "95% CI" in r.stdout and "by topic" in r.stdout
    assert "class  precision  recall  labelled" in r.stdout
    page = page_path.read_text(encoding="utf-8")
    assert '<table class="heat">' in page and "Cohen&#x27;s kappa" in page
    written = list(csv.DictReader(io.StringIO(out.read_text(encoding="utf-8"))))
    expected = [x for x in rows if x["human"] and not x["error"] and int(x["human"]) != int(x["score"])]
    assert [w["id"] for w in written] == [x["id"] for x in expected] and written
    assert list(written[0]) == ["id", "response", "human", "topic", "model_answer"]
    assert all(w["model_answer"] == x["score"] for w, x in zip(written, expected))
    assert f"{len(expected)} of {len(pairs)} labelled answers differ" in r.stdout
    # never replaces a file (it may hold labels already)
    r = bgctl(home.root, "report", job.job_id, "--disagreements", str(out))
    assert r.returncode != 0 and "exists already" in r.stderr


@pytest.mark.parametrize(
    ("extra", "header", "row", "message"),
    [
        (
            LABELLED,
            "id,response,humn,topic",
            "1,x,3,a",
            "key 'reference_column' is 'human', which is not a column of the file (did you mean 'humn'?)",
        ),
        (LABELLED, "id,response,human,subject", "1,x,3,a", "key 'group_column' is 'topic', which is not a column"),
        (
            LABELLED,
            "id,response,human,topic",
            "1,x,good,a",
            "key 'reference_column' is 'human': its label 'good' in row 1 is not a whole number",
        ),
        (
            LABELLED.replace("score", "label"),
            "id,response,human,topic",
            "1,x,maybe,a",
            "is not one of the schema's values ('pass', 'fail')",
        ),
    ],
)
def test_labels_that_cannot_be_compared_fail_the_job_before_anything_is_sent(home, extra, header, row, message):
    home.config_file.write_text(FAST_CONFIG + SCHEMA + extra)
    (home.inbox / "a.csv").write_text(f"{header}\n{row}\n")
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1)) as emu:
        bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
        assert emu.batches_created() == 0
    job = only_job(home)
    assert job.state == "failed" and message in job.error["error"], job.error
    assert "BatchCreated" not in event_types(home.db)


def _write_input(path, rows):
    """``rows`` (dicts) as a file of the format ``path``'s suffix names."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".xlsx":
        import openpyxl

        wb = openpyxl.Workbook()
        wb.active.append(list(rows[0]))
        for r in rows:
            wb.active.append(list(r.values()))
        wb.save(path)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.parametrize("suffix", [".jsonl", ".xlsx", ".parquet"])
def test_disagreements_are_written_in_the_input_format(home, tmp_path, suffix):
    from batchgrader.pipeline.tables import open_table

    home.config_file.write_text(FAST_CONFIG + SCHEMA + LABELLED)
    rows = [{"id": i, "response": f"essay {i}", "human": 1 + i % 5, "topic": f"t{i % 2}"} for i in range(30)]
    _write_input(home.inbox / f"essays{suffix}", rows)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, seed=3)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    job = only_job(home)
    with open_table(job.result_path) as reader:
        results = [r.values for r in reader]
    expected = [str(r["id"]) for r in results if int(float(str(r["human"]))) != int(float(str(r["score"])))]
    out = tmp_path / f"review{suffix}"
    r = bgctl(home.root, "report", job.job_id, "--disagreements", str(out))
    assert r.returncode == 0, r.stderr
    with open_table(out) as reader:
        assert reader.fmt == {".jsonl": "jsonl", ".xlsx": "xlsx", ".parquet": "parquet"}[suffix]
        assert list(reader.columns) == ["id", "response", "human", "topic", "model_answer"]
        written = [r.values for r in reader]
    assert [str(w["id"]) for w in written] == expected and expected


def test_after_bgctl_retry_the_report_times_each_attempt_and_names_follow_the_results(home):
    home.config_file.write_text(FAST_CONFIG + "max_row_retries: 0\nwrite_report: true\n")
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},review {i}\n" for i in range(20)))
    with Emulator(EmulatorConfig(api_key=TEST_KEY, request_failure_rate=0.5, seed=5)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        job = only_job(home)
        assert job.ended == "completed_with_errors"
        assert bgctl(home.root, "retry", job.job_id).returncode == 0
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    rep = json.loads(bgctl(home.root, "report", job.job_id, "--json").stdout)
    phases = rep["phases"]
    assert all(p["seconds"] is not None and p["seconds"] >= 0 for p in phases), phases
    assert {(p["attempt"], p["phase"]) for p in phases} >= {(1, "batches"), (2, "idle before retry"), (2, "write result")}
    total = next(p["seconds"] for p in phases if p["phase"] == "total")
    assert sum(p["seconds"] for p in phases if p["attempt"] is not None) == pytest.approx(total, abs=0.5)
    text = bgctl(home.root, "report", job.job_id).stdout
    assert "retry 1: idle before retry" in text and "-" not in text.split("time", 1)[1].split("\n", 1)[0]
    # each result has its report beside it, with the same suffix
    results = sorted(p.name for p in home.outbox.glob("a_results*.csv"))
    reports = sorted(p.name for p in home.outbox.glob("a_report*.html"))
    assert len(results) == 2 and reports == [r.replace("_results", "_report").replace(".csv", ".html") for r in results]
