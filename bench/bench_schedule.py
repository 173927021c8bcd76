"""Scheduling benchmark (issue 9): time to results against the emulator next to the ideal
schedule, the API calls, and the daemon's peak memory.  Not a test.

    .venv/bin/python bench/bench_schedule.py                       # 20,000 and 100,000 rows
    .venv/bin/python bench/bench_schedule.py --write-docs          # ... and record docs/benchmarks.md
    .venv/bin/python bench/bench_schedule.py --rows 2000 --batch-seconds 6   # a quick look
    .venv/bin/python bench/bench_schedule.py --memory-rows 10000 100000 1000000 --rows
    .venv/bin/python bench/bench_schedule.py --rows --memory-rows --sandbox-rows 1000000   # the sandbox daemon

For each file size, two runs of the real daemon (`bgctl daemon --once`, a subprocess, default
settings) against the emulator (in this process, real HTTP), whose batches take
``--batch-seconds`` each (validating 5 %, in progress 90 %, finalizing 5 %):

* (a) no queue limit;
* (b) an enqueued-token limit of 45 % of the file's tokens, which the daemon is not told.

Ideal = ceil(tokens / limit) rounds x batch time + the local work, i.e. `bgctl count` of the
same file.  Time to results is from the daemon's start (the file already in the inbox) to the
result file complete in the outbox (its ``ResultWritten``); the daemon's exit, after it has ended
the job (stored the answers for reuse, archived the input, deleted the provider's files), is
shown beside it.  Peak RSS is the daemon process's own peak resident set (VmHWM), or its
resident set plus its merge workers' (sampled), whichever is larger.  Requests are ~370 prompt tokens each (English words, deterministic).
"""

from __future__ import annotations

import argparse
import json
import math
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchdocs  # noqa: E402
from benchdocs import write_section  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from batchgrader.emulator import Emulator, EmulatorConfig  # noqa: E402

BGCTL = str(Path(sys.executable).parent / "bgctl")
KEY = "sk-bench-schedule-0123456789abcdef"
MODEL = "gpt-5.4-mini"
SECTION = "## Time to results and peak memory (`bench/bench_schedule.py`)"
WORDS = (
    "the a product quality service delivery price support team value order refund fast slow good poor "
    "excellent terrible helpful rude package arrived late early broken working perfectly expected better worse "
    "recommend never again friendly staff store online website checkout shipping tracking return exchange"
).split()
# Local settings for the runs (the inbox is looked at quickly); polling is the default one, which
# adapts to a batch's age (core/rules/polling.py), so poll_interval_seconds keeps its default of 60 s.
CONFIG = "stable_seconds: 0.2\nrescan_interval_seconds: 1\nmax_completion_tokens: 50\n"
PREFLIGHT_ROWS: list[int | None] = [None]  # --preflight-rows: None keeps the default (3)


def make_csv(path: Path, rows: int, seed: int = 9) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,response\n")
        for i in range(rows):
            f.write(f"{i},{' '.join(rng.choice(WORDS) for _ in range(320))}\n")


def env(home: Path, base_url: str | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    e["BATCHGRADER_HOME"] = str(home)
    e["OPENAI_API_KEY"] = KEY
    if base_url:
        e["OPENAI_BASE_URL"] = base_url
    return e


def count(home: Path, csv: Path) -> tuple[float, int]:
    """`bgctl count` of the file: (seconds, input tokens)."""
    t = time.perf_counter()
    out = subprocess.run([BGCTL, "count", str(csv), "--json"], env=env(home), capture_output=True, text=True, check=True)
    return time.perf_counter() - t, int(json.loads(out.stdout)["input_tokens"])


def _events(home: Path) -> list[tuple[float, str, dict]]:
    conn = sqlite3.connect(f"file:{home / 'batchgrader.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT ts, type, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [(datetime.fromisoformat(ts).timestamp(), t, json.loads(p)) for ts, t, p in rows]


def phases(home: Path, started: float, ended: float, batch_s: float) -> dict[str, float]:
    """Where the time went, from the event log (seconds, summed over batches where several):

    * ``startup``: daemon start to JobAccepted (imports, the inbox's stable wait, hashing);
    * ``prepare``: JobAccepted to JobPrepared (counting, writing requests and chunks);
    * ``submit``: JobPrepared to the first BatchCreated (upload and create);
    * ``provider``: time the emulator's batches ran (created to due end), the part the schedule
      cannot shorten when they run in sequence (rounds x batch time);
    * ``poll_lag``: a batch's due end to the daemon's seeing it (poll interval overshoot);
    * ``collect``: seeing a batch end to its ChunkCompleted (download and merge);
    * ``refill``: a batch seen ended (completed: queue room; or refused) to the next BatchCreated
      (queue room to create; a chunk uploaded ahead is created before the ended batch is collected);
    * ``result``: the last ChunkCompleted to ResultWritten; ``exit``: to the daemon's exit.
    """
    ev = _events(home)
    first = {}
    for ts, t, _p in ev:
        first.setdefault(t, ts)
    out = {
        "startup": first["JobAccepted"] - started,
        "prepare": first["JobPrepared"] - first["JobAccepted"],
        "submit": first["BatchCreated"] - first["JobPrepared"],
        "provider": 0.0,
        "poll_lag": 0.0,
        "collect": 0.0,
        "refill": 0.0,
    }
    created: dict[int, float] = {}
    seen_end: dict[int, float] = {}
    last_free: float | None = None  # when queue room was last seen (a batch ended or was refused)
    for ts, t, p in ev:
        if t == "BatchCreated":
            created[p["chunk"]] = ts
            if last_free is not None:
                out["refill"] += ts - last_free
                last_free = None
        elif t == "BatchStatusChanged" and p["status"] in ("completed", "failed") and p["chunk"] in created:
            due = created[p["chunk"]] + (batch_s if p["status"] == "completed" else batch_s * 0.05)
            out["provider"] += due - created.pop(p["chunk"])
            out["poll_lag"] += max(0.0, ts - due)
            seen_end[p["chunk"]] = ts
            last_free = ts
        elif t == "ChunkCompleted" and p["chunk"] in seen_end:
            out["collect"] += ts - seen_end.pop(p["chunk"])
    chunk_done = [ts for ts, t, _p in ev if t == "ChunkCompleted"]
    out["result"] = first["ResultWritten"] - chunk_done[-1]
    out["exit"] = ended - first["ResultWritten"]
    return out


def peak_phase(home: Path) -> str:
    """The last event before the highest sampled resident set of the run (where the peak was)."""
    if not SAMPLES:
        return "?"
    t_peak = max(SAMPLES, key=lambda s: s[1])[0]
    before = [t for ts, t, _p in _events(home) if ts <= t_peak]
    return f"after {before[-1]}" if before else "before JobAccepted"


def _mem_kib(pid: int) -> tuple[int, int]:
    """The process's resident set now and its peak so far (VmRSS, VmHWM), 0 if it is gone."""
    rss = hwm = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def _children(pid: int) -> list[int]:
    """The process's children, started by any of its threads (the sandbox's emulator is started
    by the thread that first calls the provider)."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


CASES: list[float | None] = [None, 0.45]  # queue limit as a share of the file's tokens (None: no limit)
TIMELINE = [False]
SHOWN = (
    "JobAccepted JobPrepared UploadCompleted BatchCreateRequested BatchCreated BatchStatusChanged ChunkReplanned "
    "QueueLimitLearned OutputDownloaded ChunkCompleted ResultWritten"
).split()


def timeline(home: Path, started: float) -> None:
    """The run's main events, in seconds from the daemon's start."""
    for ts, t, p in _events(home):
        if t in SHOWN:
            about = {k: p[k] for k in ("chunk", "status", "limit", "batch_id", "requests") if k in p}
            print(f"    {ts - started:7.1f} s  {t} {about}")


SAMPLES: list[tuple[float, int]] = []  # (time, VmRSS KiB) of the last daemon run


def run_daemon(home: Path, emu: Emulator) -> tuple[float, int, int]:
    """Run `bgctl daemon --once` until it exits: (seconds, exit code, peak RSS in KiB).

    The peak is the larger of the daemon's own VmHWM, read while it runs (``wait4``'s
    ``ru_maxrss`` would also count the copy of this benchmark process that the fork made before
    exec), and the daemon's resident set plus its merge workers', sampled every 50 ms."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [BGCTL, "daemon", "--once"], env=env(home, emu.base_url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    peak = 0
    SAMPLES.clear()
    while proc.poll() is None:
        rss, hwm = _mem_kib(proc.pid)
        workers = sum(_mem_kib(c)[0] for c in _children(proc.pid) if _is_worker(c))  # merge workers (daemon/workers.py)
        peak = max(peak, hwm, rss + workers)
        SAMPLES.append((time.time(), rss + workers))
        time.sleep(0.05)  # sampling interval of the workers' part; the daemon's VmHWM never misses a peak
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return seconds, proc.returncode, peak


def one_run(work: Path, csv: Path, rows: int, batch_s: float, limit_share: float | None, tokens: int) -> dict:
    home = work / f"home-{csv.stem}-{'limit' if limit_share else 'free'}"
    home.mkdir(parents=True)
    rows_setting = PREFLIGHT_ROWS[0]
    (home / "config.yaml").write_text(CONFIG + ("" if rows_setting is None else f"preflight_rows: {rows_setting}\n"))
    (home / "inbox").mkdir()
    try:
        shutil.copyfile(csv, home / "inbox" / csv.name)  # a hard link is refused at intake
    except OSError:
        shutil.copyfile(csv, home / "inbox" / csv.name)
    limit = int(tokens * limit_share) if limit_share else None
    cfg = EmulatorConfig(
        api_key=KEY,
        validating_s=batch_s * 0.05,
        in_progress_s=batch_s * 0.90,
        finalizing_s=batch_s * 0.05,
        token_limits={MODEL: limit} if limit else {},
        shuffle_output=True,
    )
    load = benchdocs.load_average()
    with Emulator(cfg) as emu:
        started = time.time()
        seconds, _code, rss_kib = run_daemon(home, emu)
        ended = time.time()
        if TIMELINE[0]:
            timeline(home, started)
        stats = emu.stats()
        batches = emu.batches()
    req = stats["requests"]
    status_calls = req.get("GET /v1/batches", 0) + req.get("GET /v1/batches/{id}", 0)
    batch_hours = 0.0
    for b in batches:
        end = b.get("completed_at") or b.get("failed_at") or b.get("expired_at") or b.get("cancelled_at") or b["created_at"]
        batch_hours += max(1, end - b["created_at"]) / 3600
    to_result = next(ts for ts, t, _p in _events(home) if t == "ResultWritten") - started
    result = home / "outbox" / f"{csv.stem}_results.csv"
    answered = sum(1 for line in result.read_text(encoding="utf-8").splitlines()[1:] if line.endswith(","))
    return {
        "rows": rows,
        "load": load,
        "case": "b" if limit else "a",
        "limit": limit,
        "seconds": to_result,
        "exit_s": seconds,
        "rss_mib": rss_kib / 1024,
        "batches": len(batches),
        "refused": sum(1 for b in batches if b["status"] == "failed"),
        "api_calls": sum(req.values()),
        "calls": req,
        "status_calls": status_calls,
        "status_per_batch_hour": status_calls / batch_hours if batch_hours else float("nan"),
        "answered": answered,
        "phases": phases(home, started, ended, batch_s),
        "peak_at": peak_phase(home),
    }


def schedule(rows_list: list[int], batch_s: float, work: Path) -> list[dict]:
    out = []
    for rows in rows_list:
        csv = work / f"reviews_{rows}.csv"
        make_csv(csv, rows)
        count_s, tokens = count(work / "count-home", csv)
        for share in CASES:
            r = one_run(work, csv, rows, batch_s, share, tokens)
            rounds = 1 if share is None else math.ceil(tokens / r["limit"])
            r.update(tokens=tokens, count_s=count_s, rounds=rounds, ideal=rounds * batch_s + count_s)
            r["ratio"] = r["seconds"] / r["ideal"]
            print(
                f"{rows:>9,} rows ({r['case']}) {tokens:>12,} tokens: {r['seconds']:7.1f} s (exit {r['exit_s']:.1f} s), "
                f"ideal {r['ideal']:6.1f} s "
                f"(ratio {r['ratio']:.2f}); {r['batches']} batches ({r['refused']} refused), {r['api_calls']} API calls, "
                f"{r['status_per_batch_hour']:.0f} status calls/batch-hour; peak RSS {r['rss_mib']:.0f} MiB; "
                f"{r['answered']:,} rows answered{'' if r['answered'] == rows else f' (OF {rows:,}: ROWS LOST)'}; load {r['load']:.1f}; "
                + ", ".join(f"{k} {v:.1f} s" for k, v in r["phases"].items()),
                flush=True,
            )
            out.append(r)
    return out


def memory(rows_list: list[int], work: Path) -> list[dict]:
    out = []
    for rows in rows_list:
        csv = work / f"mem_{rows}.csv"
        make_csv(csv, rows, seed=rows)
        r = one_run(work, csv, rows, 1.0, None, 0)
        print(
            f"memory {rows:>9,} rows: peak RSS {r['rss_mib']:.0f} MiB in {r['exit_s']:.0f} s ({r['peak_at']}; load {r['load']:.1f})",
            flush=True,
        )
        out.append(r)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _is_emulator(pid: int) -> bool:
    return b"emulator.child" in _cmdline(pid)


def _is_worker(pid: int) -> bool:
    """A merge worker (``python -m batchgrader.daemon.workers``).  A child not yet past its exec
    shares the daemon's pages (vfork) and shows the daemon's resident set: not counted."""
    return b"batchgrader.daemon.workers" in _cmdline(pid)


def run_sandbox_daemon(home: Path) -> dict:
    """Run `bgctl daemon --sandbox --once` until it exits, sampling every 50 ms the resident sets
    of the daemon, its merge workers and its emulator process.  Returns (KiB): ``daemon`` its peak
    as in :func:`run_daemon` (its VmHWM, or its resident set plus its merge workers', sampled);
    ``emulator`` the emulator process's own VmHWM; ``sum`` the peak of daemon + workers +
    emulator, sampled (the whole sandbox at one moment); and ``seconds``."""
    t = time.perf_counter()
    e = {k: v for k, v in env(home).items() if k != "OPENAI_API_KEY"}
    proc = subprocess.Popen([BGCTL, "daemon", "--sandbox", "--once"], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = emu_peak = sum_peak = 0
    SAMPLES.clear()
    trace = open(home / "memory.tsv", "w")  # noqa: SIM115 - time, daemon, workers, emulator (KiB): kept with --keep
    while proc.poll() is None:
        rss, hwm = _mem_kib(proc.pid)
        kids = _children(proc.pid)
        emus = [c for c in kids if _is_emulator(c)]
        workers = sum(_mem_kib(c)[0] for c in kids if _is_worker(c))
        emu_now = [_mem_kib(c) for c in emus]
        emu_peak = max([emu_peak, *(h for _r, h in emu_now)])
        peak = max(peak, hwm, rss + workers)
        whole = rss + workers + sum(r for r, _h in emu_now)
        sum_peak = max(sum_peak, whole)
        SAMPLES.append((time.time(), whole))
        trace.write(f"{time.perf_counter() - t:.2f}\t{rss}\t{workers}\t{whole - rss - workers}\n")
        time.sleep(0.05)
    trace.close()
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    return {"seconds": seconds, "daemon": peak, "emulator": emu_peak, "sum": sum_peak}


#: The memory goal of a live run, which the whole sandbox (daemon and emulator) is held to: 400 MB.
GOAL_MIB = 400e6 / 2**20


def sandbox_memory(rows_list: list[int], work: Path) -> list[dict]:
    """`bgctl daemon --sandbox --once` on files of ``rows_list`` rows: the daemon's peak, its
    emulator process's, and the peak of their sum, next to the goal."""
    out = []
    for rows in rows_list:
        csv = work / f"sandbox_{rows}.csv"
        make_csv(csv, rows, seed=rows)
        home = work / f"home-sandbox-{rows}"
        (home / "inbox").mkdir(parents=True)
        (home / "config.yaml").write_text(CONFIG)
        try:
            shutil.copyfile(csv, home / "inbox" / csv.name)  # a hard link is refused at intake
        except OSError:
            shutil.copyfile(csv, home / "inbox" / csv.name)
        load = benchdocs.load_average()
        m = run_sandbox_daemon(home)
        r = {
            "rows": rows,
            "rss_mib": m["daemon"] / 1024,
            "emulator_mib": m["emulator"] / 1024,
            "sum_mib": m["sum"] / 1024,
            "exit_s": m["seconds"],
            "load": load,
            "load_end": benchdocs.load_average(),
            "peak_at": peak_phase(home),
        }
        verdict = "within" if r["sum_mib"] <= GOAL_MIB else "OVER"
        print(
            f"sandbox {rows:>9,} rows: peak RSS daemon {r['rss_mib']:.0f} MiB, emulator process {r['emulator_mib']:.0f} MiB, "
            f"sum {r['sum_mib']:.0f} MiB ({r['sum_mib'] * 2**20 / 1e6:.0f} MB: {verdict} the goal of 400 MB), "
            f"in {r['exit_s']:.0f} s (sum's peak {r['peak_at']}; load {load:.1f} at the start, {r['load_end']:.1f} at the end)",
            flush=True,
        )
        out.append(r)
    return out


def write_docs(sched: list[dict], mem: list[dict], batch_s: float, argv: str) -> Path:
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        SECTION,
        "",
        f"Measured {when} with `.venv/bin/python bench/bench_schedule.py {argv}` on "
        + benchdocs.machine("the emulator in the benchmark's process")
        + f" (load average {benchdocs.load_average():.1f} at the end).",
        "",
        "Default settings (no `max_simultaneous_batches`, no `split_token_limit`, `poll_interval_seconds` 60: the wait "
        f"between polls adapts to the batch's age); a batch takes {batch_s:g} s (5 % validating, 90 % in progress, "
        "5 % finalizing). "
        "Requests are ~370 prompt tokens (gpt-5.4-mini). Ideal = ceil(tokens / limit) rounds x batch time + `bgctl count` "
        "of the same file. (a) no queue limit; (b) a limit of 45 % of the file's tokens that the daemon is not told "
        "(it learns it from the first refusal).",
        "",
        "| rows | case | tokens | limit | time to results (to exit) | ideal | ratio | batches (refused) | API calls | status calls / batch-hour | peak RSS | load | startup / prepare / submit / provider / poll lag / collect / refill / result / exit |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in sched:
        lim = f"{r['limit']:,}" if r["limit"] else "none"
        lines.append(
            f"| {r['rows']:,} | ({r['case']}) | {r['tokens']:,} | {lim} | {r['seconds']:.1f} s ({r['exit_s']:.1f} s) | {r['ideal']:.1f} s | "
            f"{r['ratio']:.2f} | {r['batches']} ({r['refused']}) | {r['api_calls']} | {r['status_per_batch_hour']:.0f} | "
            f"{r['rss_mib']:.0f} MiB | {r['load']:.1f} | " + " / ".join(f"{v:.1f}" for v in r["phases"].values()) + " s |"
        )
    lines += ["", "Target: time to results ≤ 1.25 × the ideal; ≤ 30 status calls per batch-hour.", ""]
    if mem:
        lines += [
            "### Peak memory of a whole daemon run (submit to result)",
            "",
            "Batches of 1 s, no queue limit, the same ~370-token rows. Peak RSS: the daemon process's own VmHWM, or its resident set plus its merge workers' (sampled every 50 ms), whichever is larger.",
            "",
            "| rows | peak RSS | time | load | peak |",
            "|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {r['rows']:,} | {r['rss_mib']:.0f} MiB | {r['exit_s']:.0f} s | {r['load']:.1f} | {r['peak_at']} |" for r in mem
        ]
        lines += ["", "Target: ≤ 400 MB at 1,000,000 rows, and 10x the rows ≤ 1.3x the memory.", ""]
    return write_section(SECTION, "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[20_000, 100_000])
    ap.add_argument("--batch-seconds", type=float, default=30.0)
    ap.add_argument("--memory-rows", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--cases", default="ab", help="which cases to run: a (no queue limit), b (unknown limit), or ab")
    ap.add_argument("--timeline", action="store_true", help="print each run's batch and chunk events, timed from its start")
    ap.add_argument("--keep", type=Path, help="keep the runs' homes under this (new) folder")
    ap.add_argument(
        "--sandbox-rows", type=int, nargs="*", default=[], help="also run `bgctl daemon --sandbox --once` on files of these sizes"
    )
    ap.add_argument("--preflight-rows", type=int, help="preflight_rows of the runs (default: the product's, 3; 0: off)")
    args = ap.parse_args()
    PREFLIGHT_ROWS[0] = args.preflight_rows
    CASES[:] = [None if c == "a" else 0.45 for c in args.cases]
    TIMELINE[0] = args.timeline
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as tmp:
        work = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True)
            work = args.keep
        sched = schedule(args.rows, args.batch_seconds, work)
        mem = memory(args.memory_rows, work)
        sandbox_memory(args.sandbox_rows, work)
    if args.write_docs:
        argv = " ".join(a for a in sys.argv[1:] if a != "--write-docs")
        print("wrote", write_docs(sched, mem, args.batch_seconds, argv))


if __name__ == "__main__":
    main()
