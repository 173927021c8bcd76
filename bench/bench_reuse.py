"""Reused answers benchmark (issue 14): a file answered entirely from the answers store, against
`bgctl count` on the same file.

    .venv/bin/python bench/bench_reuse.py                 # 100,000 rows; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_reuse.py --rows 20000 --no-docs   # a quick look

One run, in a fresh temporary home:

1. writes a CSV ``id,response`` of ``--rows`` distinct texts (seeded, 100-600 characters);
2. fills the answers store with one stored answer per row, as a sandbox job would have left it:
   the request lines are built exactly as the daemon builds them (``prepare``), keyed with
   ``line_key`` and inserted with ``answers.put`` in one transaction (the store's own API), in a
   home whose read models are set up (as the earlier job that answered them would have left it);
3. times ``bgctl count FILE --sandbox --json`` as a subprocess (it builds and counts every
   request, plans the chunks and looks every key up in the store), and the same with
   ``BATCHGRADER_CACHE_DAYS=0`` (counting only, as before reuse existed);
4. times the job: the file is put in the inbox and ``bgctl daemon --sandbox --once`` runs until
   the job is complete (whole subprocess, start-up included), and reports the job's own span
   (``JobAccepted`` to ``JobCompleted`` in the log); checks that no batch was created, that the
   cost is 0 and that every row of the result has its stored answer;
5. records the figures in docs/benchmarks.md under "## Reused answers (issue 14)".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdocs import machine, write_section  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))

from batchgrader.core.configuration.config import load_config  # noqa: E402
from batchgrader.core.host.home import Home  # noqa: E402
from batchgrader.pipeline.answerkey import line_key, provider_id  # noqa: E402
from batchgrader.pipeline.prepare import prepare  # noqa: E402
from batchgrader.store import answers  # noqa: E402
from batchgrader.store.eventstore import EventStore  # noqa: E402
from batchgrader.store.readmodels import projectors  # noqa: E402

SECTION = "## Reused answers (`bench/bench_reuse.py`)"
BGCTL = str(Path(sys.executable).parent / "bgctl")
WORDS = "the essay argues clearly that evidence supports a careful reading of each claim while some premises remain weak".split()
TARGET = 1.5


def make_file(path: Path, rows: int) -> None:
    rnd = random.Random(14)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("id,response\n")
        for i in range(rows):
            n = rnd.randint(15, 90)
            f.write(f"{i},row {i}: {' '.join(rnd.choice(WORDS) for _ in range(n))}\n")


def seed_store(home: Home, path: Path) -> int:
    profile = load_config(home).default
    provider = provider_id(None, sandbox=True)
    with tempfile.TemporaryFile() as tmp:
        prepare(path, profile, home, requests_out=tmp)
        tmp.seek(0)
        rows = []
        for line in tmp:
            cid, key = line_key(provider, line)
            rows.append(
                {
                    "key": key,
                    "provider": provider,
                    "model": profile.model,
                    "content": f"stored answer for {cid}",
                    "finish_reason": "stop",
                    "prompt_tokens": 60,
                    "cached_tokens": 0,
                    "completion_tokens": 12,
                    "reasoning_tokens": 0,
                    "job_id": "seed",
                    "custom_id": cid,
                    "batch_id": None,
                }
            )
    # with the read models set up, as the earlier job that answered these requests left the home
    with EventStore(home.db, projectors=projectors()) as store, store.write() as conn:
        answers.put(conn, rows, now=time.time())
    return len(rows)


def env(home: Home, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    e["BATCHGRADER_HOME"] = str(home.root)
    e.update(extra)
    return e


CPU: list[float] = []  # CPU seconds (user + system) of each timed subprocess, in order


def timed(cmd: list[str], environ: dict[str, str]) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr[-2000:]}")
    return dt, res.stdout


def job_span(db: Path) -> tuple[float, float, dict]:
    """The job's span (``JobAccepted`` to ``JobCompleted``), the result's (``OutboxWriteStarted``
    to ``ResultWritten``: writing the result file) and the ``RequestsReused`` payload."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        evs = conn.execute("SELECT type, ts, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    kinds = ("JobAccepted", "JobCompleted", "OutboxWriteStarted", "ResultWritten")
    ts = {t: datetime.fromisoformat(s) for t, s, _ in evs if t in kinds}
    reused = next(json.loads(p) for t, _, p in evs if t == "RequestsReused")
    job = (ts["JobCompleted"] - ts["JobAccepted"]).total_seconds()
    return job, (ts["ResultWritten"] - ts["OutboxWriteStarted"]).total_seconds(), reused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each measurement (medians)")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("SQLite " + sqlite3.sqlite_version)
    count_s, count_plain_s, daemon_s, span_s, write_s = [], [], [], [], []
    count_cpu, daemon_cpu = [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            home = Home.resolve(Path(tmp) / "home").ensure()
            (home.root / "config.yaml").write_text("poll_interval_seconds: 0.2\nstable_seconds: 0.05\n")
            src = Path(tmp) / "graded.csv"
            make_file(src, args.rows)
            seeded = seed_store(home, src)
            dt, out = timed([BGCTL, "count", str(src), "--sandbox", "--json"], env(home))
            summary = json.loads(out)
            assert summary["reuse"]["cached_rows"] == args.rows == seeded and summary["requests"] == 0, summary["reuse"]
            count_s.append(dt)
            count_cpu.append(CPU[-1])
            dt, out = timed([BGCTL, "count", str(src), "--sandbox", "--json"], env(home, BATCHGRADER_CACHE_DAYS="0"))
            assert json.loads(out)["requests"] == args.rows
            count_plain_s.append(dt)
            os.link(src, home.inbox / src.name)
            dt, _ = timed([BGCTL, "daemon", "--sandbox", "--once"], env(home))
            daemon_s.append(dt)
            daemon_cpu.append(CPU[-1])
            span, written, reused = job_span(home.db)
            span_s.append(span)
            write_s.append(written)
            assert reused["cached_rows"] == args.rows
            result = (home.outbox / "graded_results.csv").read_text(encoding="utf-8")
            assert result.count("stored answer for ") == args.rows
            assert not (home.root / "sandbox").exists() or not any((home.root / "sandbox").rglob("batch_*"))
    med = statistics.median
    c, cp, d, s = med(count_s), med(count_plain_s), med(daemon_s), med(span_s)
    ratio = d / c
    cc, dc = med(count_cpu), med(daemon_cpu)
    verdict = "meets the target" if ratio <= TARGET else "**misses the target**"
    lines = [
        SECTION,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d} with `.venv/bin/python bench/bench_reuse.py --rows {args.rows} --repeat {args.repeat}` "
        f"on {load}. A {args.rows:,}-row CSV (distinct texts of 100-600 characters) whose every request has a stored "
        "answer (seeded through `answers.put`, keyed exactly as the daemon keys them); medians of "
        f"{args.repeat} runs, each in a fresh home, wall clock of the whole subprocess.",
        "",
        "| measurement | median | runs |",
        "|---|---:|---|",
        f"| `bgctl count FILE --sandbox --json` (builds and counts every request, looks every key up) | {c:.2f} s | {', '.join(f'{x:.2f}' for x in count_s)} |",
        f"| the same with `BATCHGRADER_CACHE_DAYS=0` (counting only) | {cp:.2f} s | {', '.join(f'{x:.2f}' for x in count_plain_s)} |",
        f"| **`bgctl daemon --sandbox --once`**: the file answered entirely from the store, result written (start-up included) | **{d:.2f} s** | {', '.join(f'{x:.2f}' for x in daemon_s)} |",
        f"| of which the job itself (`JobAccepted` to `JobCompleted`) | {s:.2f} s | {', '.join(f'{x:.2f}' for x in span_s)} |",
        f"| of which writing the result (`OutboxWriteStarted` to `ResultWritten`) | {med(write_s):.2f} s | {', '.join(f'{x:.2f}' for x in write_s)} |",
        f"| CPU time (user + system) of `bgctl count` | {cc:.2f} s | {', '.join(f'{x:.2f}' for x in count_cpu)} |",
        f"| CPU time (user + system) of `bgctl daemon --once` | {dc:.2f} s | {', '.join(f'{x:.2f}' for x in daemon_cpu)} |",
        "",
        f"Ratio daemon / count: {ratio:.2f} (target ≤ {TARGET}): {verdict}. Ratio daemon / counting only: {d / cp:.2f}. "
        f"CPU-time ratio daemon / count (less sensitive to the machine's load): {dc / cc:.2f}. "
        f"`uptime` load average at the end: {os.getloadavg()[0]:.1f}. "
        "The seeded home has its read models set up, as the earlier job that answered these requests left it. "
        "No batch was created, the job's cost is 0, and every result row carries its stored answer.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
