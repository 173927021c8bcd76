"""Report benchmark (issue 25): `bgctl report` on a 100,000-row job with human labels on every
row, a schema of a free-text reason, a 1-5 score and a pass/fail label, and a grouping column;
next to reading the same result file alone (the least any report must do).  Not a test.

    .venv/bin/python bench/bench_report.py               # 100,000 rows
    .venv/bin/python bench/bench_report.py --rows 10000

The job is run once in the sandbox (`bgctl daemon --once --sandbox`, the emulator's answers)
in a temporary home; then, best of three runs each: ``build_report`` of the job's events (what
``bgctl report --json`` computes: the result file read, the columns, groups and agreement with
their bootstrap intervals), the HTML page rendered from it, and bare ``open_table`` over the
result file (as the report reads it).  Last, the whole command `bgctl report JOB --json` as a
user runs it (start-up and the lazy imports of scikit-learn and SciPy included), best of three.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from batchgrader.pipeline.tables import open_table  # noqa: E402
from batchgrader.reports.report import build_report, read_events_of  # noqa: E402
from batchgrader.reports.report_html import render_html  # noqa: E402

CONFIG = """\
poll_interval_seconds: 0.2
stable_seconds: 0.05
rescan_interval_seconds: 0.5
max_completion_tokens: 200
max_row_retries: 0
response_format:
  type: object
  properties:
    reason: {type: string}
    score: {type: integer, minimum: 1, maximum: 5}
    label: {type: string, enum: [pass, fail]}
  required: [reason, score, label]
  additionalProperties: false
reference_column: human
reference_field: score
group_column: topic
"""


def best(f, runs: int = 3) -> float:
    out = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    args = ap.parse_args()
    bgctl = str(ROOT / ".venv" / "bin" / "bgctl")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "BATCHGRADER_HOME": str(home)}
        from batchgrader.core.host.home import Home

        h = Home.resolve(home).ensure()
        h.config_file.write_text(CONFIG)
        r = random.Random(1)
        lines = [f"{i},essay number {i} on a topic,{r.randint(1, 5)},question {i % 20}" for i in range(args.rows)]
        (h.inbox / "answers.csv").write_text("id,response,human,topic\n" + "\n".join(lines) + "\n")
        t = time.perf_counter()
        subprocess.run([bgctl, "daemon", "--once", "--sandbox"], env=env, capture_output=True, check=True)
        print(f"job of {args.rows:,} rows run in the sandbox in {time.perf_counter() - t:.1f} s")
        status = json.loads(subprocess.run([bgctl, "status", "--json"], env=env, capture_output=True, check=True).stdout)
        job_id = status[0]["job_id"]

        events = read_events_of(h, job_id)
        report = build_report(events)
        result = report["job"]["result_path"]
        assert report["agreement"]["n"] == args.rows, report["agreement"]

        def read_only() -> None:
            with open_table(Path(result), validated=True) as reader:  # as the report reads it
                for _row in reader:
                    pass

        t_read = best(read_only)
        t_report = best(lambda: build_report(events))
        t_html = best(lambda: render_html(report))
        t_cli = best(lambda: subprocess.run([bgctl, "report", job_id, "--json"], env=env, capture_output=True, check=True))
    print(f"read the result file alone:   {t_read:6.2f} s")
    print(f"build_report (all figures):   {t_report:6.2f} s  ({t_report / t_read:.1f}x the read)")
    print(f"render_html:                  {t_html:6.2f} s")
    print(f"bgctl report JOB --json:      {t_cli:6.2f} s  (the whole command: start-up and imports included)")


if __name__ == "__main__":
    main()
