"""Several daemons on one PostgreSQL store (issue 37): how long after ``kill -9`` of the daemon
holding a job and the provider account another daemon carries on, and the time to results of
several files with three daemons against one.

    .venv/bin/python bench/bench_takeover.py                # prints the figures
    .venv/bin/python bench/bench_takeover.py --write-docs   # ... and records them in docs/benchmarks.md

Real ``bgctl daemon`` processes, one home, the emulator in this process (its batches run
``--batch-seconds``), a throw-away PostgreSQL server (tests/pg_server.py).  Takeover: daemons A
and B run; once A holds the account's lease and a batch is in flight (B polls it: A let the job go
when it began to wait), A is killed (``kill -9``); measured until B holds the account's lease (the
next fence, taken for the job's deletes), then until the job has
completed (its batch, still running when A was killed, ends ``lease_seconds`` + 5 s after it was created).  Throughput: ``--files`` files of ``--rows`` rows dropped at once, timed from the
drop to the last ``JobCompleted``, with one daemon and with three.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import benchdocs  # noqa: E402
from batchgrader.core.host.home import Home  # noqa: E402
from batchgrader.emulator import Emulator, EmulatorConfig  # noqa: E402
from harness import BGCTL, FAST_CONFIG, TEST_KEY, daemon_env, start_daemon  # noqa: E402
from pg_server import PostgresServer, find_bindir  # noqa: E402

SECTION = "## Several daemons on one store: takeover and three daemons (`bench/bench_takeover.py`)"
BIG_SECTION = "## One large job with three daemons against one (`bench/bench_takeover.py --big-rows`)"


def _query(url: str, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def _ended(url: str) -> int:
    return int(_query(url, "SELECT count(*) FROM events WHERE type = 'JobCompleted'")[0][0])


def _wait(cond, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def _home(tmp: Path, name: str, lease: float) -> Home:
    home = Home.resolve(tmp / name).ensure()
    home.config_file.write_text(
        FAST_CONFIG.replace("request_timeout_seconds: 5", "request_timeout_seconds: 2")
        + f"lease_seconds: {lease}\nsplit_row_limit: 500\n"
    )
    return home


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.communicate(timeout=60)


def takeover(server: PostgresServer, tmp: Path, lease: float, batch_seconds: float) -> tuple[float, float]:
    """(s from kill -9 to the other daemon holding the account, s from kill -9 to the job's end)."""
    url = server.create_database()
    home = _home(tmp, f"takeover-{lease}", lease)
    emu = Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1, in_progress_s=batch_seconds)).start()
    env = {"BATCHGRADER_STORE_URL": url}
    try:
        a = start_daemon(home.root, emu.base_url, extra_env=env)
        (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},text {i}\n" for i in range(1000)))
        _wait(
            lambda: _query(url, "SELECT 1 FROM events WHERE type = 'BatchCreated' LIMIT 1") if _has_events(url) else None,
            60,
            "a batch",
        )
        b = start_daemon(home.root, emu.base_url, extra_env=env)
        time.sleep(1.5)  # B up, following the log
        holder = _query(url, "SELECT holder, fence FROM leases WHERE name LIKE 'account:%'")[0]
        assert holder[0].split(":")[1] == str(a.pid), holder
        os.kill(a.pid, signal.SIGKILL)
        t0 = time.monotonic()
        a.wait(timeout=30)
        _wait(lambda: _query(url, f"SELECT 1 FROM leases WHERE name LIKE 'account:%' AND fence > {holder[1]}"), 120, "takeover")
        took = time.monotonic() - t0
        _wait(lambda: _ended(url) >= 1, 120, "the job's end")
        done = time.monotonic() - t0
        _stop([a, b])
        return took, done
    finally:
        emu.stop()


def _has_events(url: str) -> bool:
    return bool(_query(url, "SELECT to_regclass('events') IS NOT NULL")[0][0])


def throughput(
    server: PostgresServer, tmp: Path, daemons: int, files: int, rows: int, batch_seconds: float, run: int = 0
) -> float:
    """Seconds from dropping ``files`` files to the last one's result, with ``daemons`` daemons."""
    url = server.create_database()
    home = _home(tmp, f"run-{daemons}-{run}", 30.0)
    emu = Emulator(EmulatorConfig(api_key=TEST_KEY, seed=1, in_progress_s=batch_seconds)).start()
    try:
        procs = [start_daemon(home.root, emu.base_url, extra_env={"BATCHGRADER_STORE_URL": url}) for _ in range(daemons)]
        _wait(lambda: _has_events(url) and _query(url, "SELECT to_regclass('leases') IS NOT NULL")[0][0], 60, "the store")
        time.sleep(1.0)  # every daemon up
        staged = tmp / f"staged-{daemons}-{run}"
        staged.mkdir()
        for k in range(files):
            (staged / f"f{k}.csv").write_text("id,response\n" + "".join(f"{i},file {k} text {i}\n" for i in range(rows)))
        t0 = time.monotonic()
        for k in range(files):
            os.rename(staged / f"f{k}.csv", home.inbox / f"f{k}.csv")
        _wait(lambda: _ended(url) >= files, 600, "every job's end")
        took = time.monotonic() - t0
        _stop(procs)
        return took
    finally:
        emu.stop()


def _emulator_process(tmp: Path, batch_seconds: float) -> tuple[subprocess.Popen, str]:
    """The emulator in a process of its own (``python -m batchgrader.emulator.child``, as the
    sandbox starts it), so its memory and CPU are not the bench's: (process, its base URL).  It
    stops when its standard input is closed."""
    import json

    proc = subprocess.Popen(
        [sys.executable, "-m", "batchgrader.emulator.child", "--data-dir", str(tmp / "emulator"), "--api-key", TEST_KEY,
         "--in-progress-s", str(batch_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())["base_url"]


def _billed_requests(base_url: str) -> int:
    """Requests the emulator answered and billed, over every batch it ran."""
    import openai

    client = openai.OpenAI(api_key=TEST_KEY, base_url=base_url)
    return sum(int(b.request_counts.completed if b.request_counts else 0) for b in client.batches.list(limit=100))


def big_job(server: PostgresServer, tmp: Path, daemons: int, rows: int, batch_seconds: float) -> dict[str, Any]:
    """One job of ``rows`` rows with ``daemons`` daemons, the emulator in its own process: seconds
    to its result (drop to ``ResultWritten``), each daemon's peak memory (MiB: its VmHWM, or its
    resident set plus its merge workers', sampled), and the rows billed more than once."""
    from bench_schedule import _children, _is_worker, _mem_kib

    url = server.create_database()
    home = Home.resolve(tmp / f"big-{daemons}").ensure()
    home.config_file.write_text(
        FAST_CONFIG.replace("poll_interval_seconds: 0.05", "poll_interval_seconds: 1") + "lease_seconds: 30\n"
    )
    emu, base_url = _emulator_process(tmp / f"emu-{daemons}", batch_seconds)
    procs: list[subprocess.Popen] = []
    try:
        env = {**daemon_env(home.root, base_url), "BATCHGRADER_STORE_URL": url}
        for k in range(daemons):  # their logs to files: a long run's log would fill a pipe
            with (tmp / f"big-{daemons}-daemon{k}.log").open("w") as log:
                procs.append(subprocess.Popen([BGCTL, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=log))
        _wait(lambda: _has_events(url) and _query(url, "SELECT to_regclass('leases') IS NOT NULL")[0][0], 60, "the store")
        time.sleep(1.0)  # every daemon up
        staged = tmp / f"big-{daemons}.csv"
        with staged.open("w") as f:
            f.write("id,response\n")
            for i in range(rows):
                f.write(f"{i},the order {i} arrived late and the support team was helpful about the refund\n")
        peaks = {p.pid: 0 for p in procs}
        t0 = time.monotonic()
        os.rename(staged, home.inbox / "big.csv")

        def written() -> bool:
            for p in procs:
                rss, hwm = _mem_kib(p.pid)
                workers = sum(_mem_kib(c)[0] for c in _children(p.pid) if _is_worker(c))
                peaks[p.pid] = max(peaks[p.pid], hwm, rss + workers)
            return bool(_query(url, "SELECT 1 FROM events WHERE type = 'ResultWritten' LIMIT 1"))

        _wait(written, 1800, "the result")
        took = time.monotonic() - t0
        _wait(lambda: written() and _ended(url) >= 1, 600, "the job's end")
        callers = _query(url, "SELECT count(DISTINCT holder) FROM intent_fences")[0][0]
        twice = _billed_requests(base_url) - rows
        return {"seconds": took, "peaks": sorted((k / 1024 for k in peaks.values()), reverse=True), "twice": twice,
                "callers": int(callers)}  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(timeout=120)
        if emu.stdin is not None:
            emu.stdin.close()
        emu.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", default="4,8", help="lease_seconds values for the takeover ('': none)")
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--batch-seconds", type=float, default=2.0, help="how long each emulated batch runs")
    ap.add_argument("--big-rows", type=int, default=1_000_000, help="rows of the one large job (0: not run)")
    ap.add_argument("--big-batch-seconds", type=float, default=5.0, help="how long each of its emulated batches runs")
    ap.add_argument("--skip-small", action="store_true", help="only the large job")
    ap.add_argument("--repeat", type=int, default=1, help="runs of one and of three daemons, interleaved (1, 3, 1, 3, ...)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("no PostgreSQL server binaries: install Debian's postgresql package")
    where = benchdocs.machine("PostgreSQL from Debian's package on loopback, the emulator in the bench's process")
    server = PostgresServer(bindir).start()
    takeovers: list[tuple[float, float, float]] = []
    runs: dict[int, list[float]] = {1: [], 3: []}
    big: dict[int, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            for lease in (float(x) for x in args.leases.split(",") if x) if not args.skip_small else ():
                took, done = takeover(server, tmp, lease, lease + 5.0)  # the batch still runs when A is killed
                takeovers.append((lease, took, done))
                print(
                    f"  lease {lease:g} s: account taken over {took:.1f} s after kill -9, job ended {done:.1f} s after",
                    flush=True,
                )
            for k in range(args.repeat) if not args.skip_small else ():
                for n in (1, 3):
                    runs[n].append(throughput(server, tmp, n, args.files, args.rows, args.batch_seconds, run=k))
                    print(f"  {n} daemon(s): {args.files} files x {args.rows:,} rows in {runs[n][-1]:.1f} s", flush=True)
            for n in (1, 3) if args.big_rows else ():
                big[n] = big_job(server, tmp, n, args.big_rows, args.big_batch_seconds)
                r = big[n]
                print(
                    f"  {n} daemon(s), one job of {args.big_rows:,} rows: result in {r['seconds']:.1f} s, peak memory "
                    f"{' / '.join(f'{m:.0f}' for m in r['peaks'])} MiB, rows paid twice {r['twice']}, "
                    f"daemons that called the provider {r['callers']}",
                    flush=True,
                )
    finally:
        server.stop()
    if big:
        publish_big(
            big, args, benchdocs.machine("PostgreSQL from Debian's package on loopback, the emulator in a process of its own")
        )
    if args.skip_small:
        return
    flags = (" --big-rows 0" if not args.big_rows else "") + (f" --repeat {args.repeat}" if args.repeat > 1 else "")
    lines = [
        SECTION,
        "",
        f"Command: `.venv/bin/python bench/bench_takeover.py{flags} --write-docs`. Measured {time.strftime('%Y-%m-%d')}, {where} "
        f"and {benchdocs.load_average():.1f} at the end. Real `bgctl daemon` processes on one home and one PostgreSQL "
        f"store, the emulator's batches running {args.batch_seconds:g} s, `request_timeout_seconds: 2`.",
        "",
        "**Takeover** (daemons A and B; A holds the provider account with a batch in flight, which B polls; `kill -9` of A):",
        "",
        "| `lease_seconds` | B holds the account after | / `lease_seconds` | the job has ended after |",
        "|---:|---:|---:|---:|",
        *[f"| {lease:g} | {took:.1f} s | {took / lease:.2f}× | {done:.1f} s |" for lease, took, done in takeovers],
        "",
        "A let the job go when it began to wait (B is live and holds no account), so B polls it and merges its result "
        "without a takeover; it takes the account's lease for the job's deletes, its first call, which comes when the "
        "batch has ended (it ran `lease_seconds` + 5 s here) and no sooner than A's lease lapses (`lease_seconds` "
        "after its last renewal, renewed every third of it), plus the wait before a refused lease is asked for again "
        "(a quarter of `lease_seconds`, at most 5 s).",
        "",
        f"**Three daemons against one** ({args.files} files of {args.rows:,} rows dropped at once, one provider account, "
        "time to the last result):",
        "",
        "| daemons | time to results (each run, interleaved) | mean against one |",
        "|---:|---:|---:|",
        *[
            f"| {n} | {' / '.join(f'{x:.1f} s' for x in xs)} | {sum(xs) / len(xs) / (sum(runs[1]) / len(runs[1])):.2f}× |"
            for n, xs in runs.items()
        ],
        "",
        "Every provider call is the account lease holder's, so the batches go out as from one daemon; the holder "
        "leaves each job's local work (preparing, downloading, merging, writing the result) to the daemons that hold "
        "no account. One large job with its peak memory per daemon: the next section.",
    ]
    benchdocs.publish(SECTION, lines, args.write_docs)


def publish_big(big: dict[int, dict[str, Any]], args: argparse.Namespace, where: str) -> None:
    rows = args.big_rows
    lines = [
        BIG_SECTION,
        "",
        f"Command: `.venv/bin/python bench/bench_takeover.py --skip-small --big-rows {rows} --write-docs`. Measured "
        f"{time.strftime('%Y-%m-%d')}, {where} and {benchdocs.load_average():.1f} at the end. One input of {rows:,} "
        "rows (~20 prompt tokens each, default batch sizes: 50,000 requests a batch) dropped into the shared inbox of "
        "real `bgctl daemon` processes on one PostgreSQL store and one provider account; the emulator "
        f"(`python -m batchgrader.emulator.child`) in a process of its own, its batches running {args.big_batch_seconds:g} s. "
        "Time to results: from the drop to `ResultWritten`. Peak memory: each daemon's VmHWM, or its resident set "
        "plus its merge workers' (sampled every 50 ms), whichever is larger. Rows paid twice: requests the emulator "
        "billed, over every batch, less the job's rows.",
        "",
        "| daemons | time to results | against one | peak memory per daemon | rows paid twice | daemons that called the provider |",
        "|---:|---:|---:|---|---:|---:|",
        *[
            f"| {n} | {r['seconds']:.1f} s | {r['seconds'] / big[min(big)]['seconds']:.2f}× | "
            f"{' / '.join(f'{m:.0f} MiB' for m in r['peaks'])} | {r['twice']} | {r['callers']} |"
            for n, r in big.items()
        ],
        "",
        "One job is advanced by one daemon at a time (its job lease), and every provider call of the account is its "
        "lease holder's, so the daemon holding the account ends up holding the job while it sends: the other daemons "
        "stay small and idle, and three daemons finish one job in about the time one does. They add a takeover when "
        "that daemon dies, not speed for one job. A difference between the two times beyond a few percent is the "
        "machine's load (above), not the daemons: the other daemons' peaks show they never loaded the job.",
    ]
    benchdocs.publish(BIG_SECTION, lines, args.write_docs)


if __name__ == "__main__":
    main()
