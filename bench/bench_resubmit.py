"""Resubmission benchmark (issue 32): what a file costs the second time.

    .venv/bin/python bench/bench_resubmit.py                        # 10,000 rows; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_resubmit.py --rows 2000 --no-docs  # a quick look

One run, in a fresh temporary home, with the default settings (``preflight_rows: 3``, answer
reuse on), each step a whole ``bgctl daemon --sandbox --once`` subprocess:

1. a CSV ``id,response`` of ``--rows`` distinct texts is put in the inbox and graded;
2. the same file is put in the inbox again (a resubmission: every row answered before);
3. the file with one row changed is put in the inbox.

For each job it reads, from the event log, the requests sent (batch lines, preflight and
synchronous requests) and the cost billed, and from ``bgctl costs --by job --json`` the cost
again.  Targets: the resubmission sends 0 requests and costs $0; the changed file sends exactly 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdocs import machine, publish  # noqa: E402

SECTION = "## Resubmitting an answered file (`bench/bench_resubmit.py`)"
BGCTL = str(Path(sys.executable).parent / "bgctl")
WORDS = "the essay argues clearly that evidence supports a careful reading of each claim while some premises remain weak".split()


def make_file(path: Path, rows: int, changed: int | None = None) -> None:
    rnd = random.Random(32)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,response\n")
        for i in range(rows):
            text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(15, 90)))
            f.write(f"{i},row {i}: {text}{' (rewritten)' if i == changed else ''}\n")


def env(root: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    e["BATCHGRADER_HOME"] = str(root)
    return e


def daemon_once(root: Path) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([BGCTL, "daemon", "--sandbox", "--once"], env=env(root), capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"bgctl daemon --sandbox --once failed ({res.returncode}): {res.stderr[-2000:]}")
    return time.perf_counter() - t0


def sent_and_billed(db: Path) -> dict[str, dict[str, float]]:
    """Per job: batch requests created, synchronous requests sent (preflight and routes) and the cost billed."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        evs = conn.execute("SELECT job_id, type, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    out: dict[str, dict[str, float]] = {}
    chunks: dict[tuple[str, int], int] = {}
    for job, kind, raw in evs:
        p = json.loads(raw)
        j = out.setdefault(job, {"batch": 0, "sync": 0, "cost": 0.0, "file": 0})
        if kind == "JobAccepted":
            j["file"] = p["file"]
        elif kind == "JobPrepared":
            for c in p["chunks"]:
                chunks[(job, c["index"])] = c.get("requests", c.get("end", 0) - c.get("start", 0))
        elif kind == "BatchCreated":
            j["batch"] += chunks.get((job, p["chunk"]), 0)
        elif kind in ("PreflightRequested",):
            j["sync"] += len(p["rows"])
        elif kind in ("PreflightRowRequested", "OnlineRequestSent"):
            j["sync"] += 1
        elif kind == "TokensUsed":
            j["cost"] += float(p.get("cost_usd") or 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("SQLite " + sqlite3.sqlite_version)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "home"
        subprocess.run([BGCTL, "doctor", "--sandbox"], env=env(root), capture_output=True)  # lays the home out
        (root / "inbox").mkdir(parents=True, exist_ok=True)
        src, changed = Path(tmp) / "graded.csv", Path(tmp) / "changed.csv"
        make_file(src, args.rows)
        make_file(changed, args.rows, changed=args.rows // 2)
        seconds = []
        for path, name in ((src, "graded.csv"), (src, "graded.csv"), (changed, "graded.csv")):
            shutil.copy(path, root / "inbox" / name)
            seconds.append(daemon_once(root))
        per_job = {k: j for k, j in sent_and_billed(root / "batchgrader.db").items() if j["file"]}
        ids, jobs = list(per_job), list(per_job.values())
        costs = json.loads(
            subprocess.run([BGCTL, "costs", "--by", "job", "--json"], env=env(root), capture_output=True, text=True).stdout
        )
    assert len(jobs) == 3, jobs
    by_key = {r["key"]: r for r in costs["rows"]}
    first, again, one = jobs
    resubmit_ok = again["batch"] + again["sync"] == 0 and again["cost"] == 0
    changed_ok = one["batch"] + one["sync"] == 1
    rows = [
        ("first submission", first, seconds[0]),
        ("resubmitted, every row answered", again, seconds[1]),
        ("one row changed", one, seconds[2]),
    ]
    lines = [
        SECTION,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `.venv/bin/python bench/bench_resubmit.py --rows {args.rows}` on {load}. "
        f"A {args.rows:,}-row CSV (distinct texts) graded in the sandbox with the default settings (`preflight_rows: 3`, "
        "answer reuse on), then put in the inbox again, then again with one row changed; each a whole "
        "`bgctl daemon --sandbox --once` run in the same home. Requests and cost read from the event log "
        "(batch lines created, preflight and synchronous requests sent, `TokensUsed`); SIMULATED prices.",
        "",
        "| submission | batch requests | synchronous requests | cost billed | daemon run |",
        "|---|---:|---:|---:|---:|",
        *(f"| {label} | {int(j['batch']):,} | {int(j['sync'])} | ${j['cost']:.6f} | {s:.1f} s |" for label, j, s in rows),
        "",
        f"Targets: the resubmission sends 0 requests and costs $0 ({'**met**' if resubmit_ok else '**MISSED**'}); "
        f"the file with one row changed sends exactly 1 request ({'**met**' if changed_ok else '**MISSED**'}). "
        "`bgctl costs --by job` agrees, in the same order: "
        + ", ".join(f"${by_key[k]['cost_usd'] + by_key[k]['simulated_usd']:.6f}" for k in ids)
        + ".",
    ]
    publish(SECTION, lines, write=not args.no_docs)
    if not (resubmit_ok and changed_ok):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
