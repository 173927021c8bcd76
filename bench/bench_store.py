"""Event-store benchmark (issue 37): appends per second and fold time, SQLite against PostgreSQL.

    .venv/bin/python bench/bench_store.py                   # prints the figures
    .venv/bin/python bench/bench_store.py --write-docs      # ... and records them in docs/benchmarks.md
    .venv/bin/python bench/bench_store.py --events 20000    # a quick look

Both logs get the same events, made of the golden logs in tests/golden/ as bench_events.py makes
them, through each backend's ``append`` with its read models (one transaction per append, as the
daemon writes).  PostgreSQL is a throw-away server started here from Debian's package
(tests/pg_server.py) with fsync on, on loopback; SQLite is a file in WAL mode with
``synchronous=FULL`` on the same disk.  Fold: ``fold(store.read())`` of the whole log in this
process, after ``bgctl store copy`` filled PostgreSQL with the SQLite log (its time is shown too).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import benchdocs  # noqa: E402
from batchgrader.core.log.events import NewEvent  # noqa: E402
from batchgrader.core.log.state import fold  # noqa: E402
from batchgrader.store.backend import EventLog, open_log  # noqa: E402
from batchgrader.store.copy import copy_log  # noqa: E402
from bench_events import bulk_load, job_logs  # noqa: E402
from pg_server import PostgresServer, find_bindir  # noqa: E402

SECTION = "## Event store: SQLite and PostgreSQL (`bench/bench_store.py`)"
CASES = (("1 event per append", 1), ("10 events per append", 10))


def batches(n_events: int, group: int) -> list[tuple[str, int, list[NewEvent]]]:
    out = []
    for job_id, log in job_logs(n_events=n_events):
        evs = [NewEvent(e["type"], e["payload"]) for e in log]
        for i in range(0, len(evs), group):
            out.append((job_id, i, evs[i : i + group]))
    return out


def append_rate(store: EventLog, work: list[tuple[str, int, list[NewEvent]]], prefix: str) -> tuple[float, float]:
    """(events/s, appends/s) of appending ``work`` (job ids prefixed, so each run has new jobs)."""
    n = sum(len(evs) for _, _, evs in work)
    t0 = time.perf_counter()
    for job_id, version, evs in work:
        store.append(prefix + job_id, evs, expected_version=version)
    dt = time.perf_counter() - t0
    return n / dt, len(work) / dt


def two_writers(url: str, work: list[tuple[str, int, list[NewEvent]]]) -> float:
    """Appends/s of two daemons (two connections) appending different jobs at once."""
    halves = [[w for w in work if hash(w[0]) % 2 == k] for k in (0, 1)]  # each job's appends in one writer
    stores = [open_log(url), open_log(url)]
    errors: list[BaseException] = []

    def run(s: EventLog, half: list[tuple[str, int, list[NewEvent]]]) -> None:
        try:
            append_rate(s, half, "")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=run, args=(s, h)) for s, h in zip(stores, halves)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return len(work) / dt
    finally:
        for s in stores:
            s.close()


def fold_seconds(store: EventLog, runs: int = 3) -> tuple[float, int]:
    best, jobs = float("inf"), 0
    for _ in range(runs):
        t0 = time.perf_counter()
        st = fold(store.read())
        best = min(best, time.perf_counter() - t0)
        jobs = len(st.jobs)
    return best, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="events in the log that is folded")
    ap.add_argument("--append-events", type=int, default=5_000, help="events appended per case")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("no PostgreSQL server binaries: install Debian's postgresql package")
    import psycopg

    with_pg = f"PostgreSQL {server_version(bindir)} (Debian package, fsync on, loopback), SQLite {sqlite3.sqlite_version}, psycopg {psycopg.__version__}"
    where = benchdocs.machine(with_pg)  # with the load at the start
    server = PostgresServer(bindir, durable=True).start()
    rows: list[tuple[str, float, float, float, float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, group in CASES:
                work = batches(args.append_events, group)
                db = Path(tmp) / f"append-{group}.db"
                url = server.create_database()
                with open_log(db) as lite, open_log(url) as pg:
                    se, sa = append_rate(lite, work, "")
                    pe, pa = append_rate(pg, work, "")
                rows.append((label, se, sa, pe, pa))
                print(f"  append {label}: SQLite {sa:,.0f}/s, PostgreSQL {pa:,.0f}/s ({pa / sa:.2f}x)", flush=True)
            url = server.create_database()
            two = two_writers(url, batches(args.append_events, 1))
            print(f"  two writers, 1 event per append: PostgreSQL {two:,.0f} appends/s", flush=True)

            db = Path(tmp) / "fold.db"
            n, _ = bulk_load(db, n_events=args.events)
            from batchgrader.store.readmodels import rebuild

            rebuild(db)
            url = server.create_database()
            t0 = time.perf_counter()
            res = copy_log(db, url)
            copy_s = time.perf_counter() - t0
            assert res.same_state, res.differences
            with open_log(db, readonly=True) as lite, open_log(url, readonly=True) as pg:
                sf, jobs = fold_seconds(lite)
                pf, _ = fold_seconds(pg)
            print(
                f"  fold {n:,} events: SQLite {sf:.2f} s, PostgreSQL {pf:.2f} s ({pf / sf:.2f}x); copy {copy_s:.1f} s", flush=True
            )
    finally:
        server.stop()
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/bench_store.py --write-docs`. Measured {time.strftime('%Y-%m-%d')}, "
        f"{where} and {benchdocs.load_average():.1f} at the end: "
        "the machine is shared, so the ratios matter more than the rates. Events: the golden logs of `tests/golden/`, "
        "appended through each store's `append` with its read models, one transaction per append.",
        "",
        f"**Appends** ({args.append_events:,} events per case):",
        "",
        "| case | SQLite appends/s (events/s) | PostgreSQL appends/s (events/s) | PostgreSQL / SQLite |",
        "|---|---:|---:|---:|",
        *[f"| {label} | {sa:,.0f} ({se:,.0f}) | {pa:,.0f} ({pe:,.0f}) | {pa / sa:.2f}× |" for label, se, sa, pe, pa in rows],
        f"| two writers at once, 1 event per append | | {two:,.0f} | |",
        "",
        f"**Fold** of the whole log ({n:,} events, {jobs:,} jobs; best of 3, in this process): SQLite {sf:.2f} s, "
        f"PostgreSQL {pf:.2f} s (**{pf / sf:.2f}×**). `bgctl store copy` of that log took {copy_s:.1f} s "
        "(copy, read models, and both folds compared).",
        "",
        "Every PostgreSQL append takes the `events` table lock (positions in commit order), so appends from several "
        "daemons are serialised: two writers share one writer's rate. A daemon appends a handful of events per "
        "provider call, so either store is far from limiting.",
    ]
    benchdocs.publish(SECTION, lines, args.write_docs)


def server_version(bindir: Path) -> str:
    import subprocess

    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=False).stdout
    return out.split()[2] if len(out.split()) > 2 else "?"  # postgres (PostgreSQL) 15.18 (Debian ...)


if __name__ == "__main__":
    main()
