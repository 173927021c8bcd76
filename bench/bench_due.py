"""Never idle while work is due (issue 38): time to results against the ideal schedule, and the
gap from a batch's end to its download request, for this checkout and another code tree (the
previous release's, e.g. a ``git worktree`` of it), interleaved in one run.  Not a test.

    .venv/bin/python bench/bench_due.py --before /tmp/before/src              # the default sizes
    .venv/bin/python bench/bench_due.py --before /tmp/before/src --runs 10000:0.6 20000:30 --write-docs

Each run is a real daemon (``python -m batchgrader.cli daemon --once``, a subprocess, default
settings but ``stable_seconds: 0.2`` and ``rescan_interval_seconds: 1`` as in
``bench_schedule.py``, whose helpers it uses) on a CSV already in the inbox, against the emulator
(in this process, real HTTP) whose batches take the given seconds (validating 5 %, in progress
90 %, finalizing 5 %).  The two trees run one after the other for each size and repetition
(after, before, after, ...), so both see the same load.

* **time to results**: the daemon's start to its ``ResultWritten``;
* **ideal**: ``bgctl count`` of the file (reading, counting) + one batch's run time (every
  chunk runs at once: no queue limit);
* **gap at create**: for a batch the create reply already names ended, its ``BatchCreated``
  to its ``OutputDownloadStarted``;
* **gap while polled**: for the others, the batch's end (its ``BatchCreateRequested`` + the
  batch's run time: an upper bound of the gap, as the batch is created after its request
  leaves) to its ``OutputDownloadStarted``, against the documented bound (15 % of the batch's
  age at its end, at least 0.5 s).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_schedule as sched  # noqa: E402
import benchdocs  # noqa: E402
from bench_schedule import CONFIG, KEY, Emulator, EmulatorConfig, count, env, make_csv  # noqa: E402

SECTION = "## Never idle while work is due (`bench/bench_due.py`)"
AGE_FRACTION, MIN_DELAY = 0.15, 0.5  # core/rules/polling.py's documented bound (kept here: both trees are measured)


def run_once(tree: Path, work: Path, csv: Path, batch_s: float, tag: str) -> dict:
    home = work / f"home-{csv.stem}-{batch_s:g}-{tag}"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(CONFIG)
    (home / "inbox").mkdir()
    shutil.copyfile(csv, home / "inbox" / csv.name)  # a hard link is refused at intake
    cfg = EmulatorConfig(
        api_key=KEY, validating_s=batch_s * 0.05, in_progress_s=batch_s * 0.90, finalizing_s=batch_s * 0.05, shuffle_output=True
    )
    load = benchdocs.load_average()
    with Emulator(cfg) as emu:
        e = env(home, emu.base_url)
        e["PYTHONPATH"] = str(tree)
        started = time.time()
        subprocess.run(
            [sys.executable, "-m", "batchgrader.cli", "daemon", "--once"],
            env=e,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=3600,
        )
    ev = sched._events(home)
    result = next(ts for ts, t, _p in ev if t == "ResultWritten") - started
    requested: dict[int, float] = {}
    at_create: dict[int, float] = {}
    polled: dict[int, float] = {}
    gaps_create: list[float] = []
    gaps_polled: list[tuple[float, float]] = []  # (gap, bound)
    for ts, t, p in ev:
        c = p.get("chunk")
        if t == "BatchCreateRequested":
            requested[c] = ts
        elif t == "BatchCreated" and c in requested:
            if p["status"] in ("completed", "failed", "expired", "cancelled"):
                at_create[c] = ts
            else:
                polled[c] = requested[c] + batch_s
        elif t == "OutputDownloadStarted" and p["kind"] == "output":
            if c in at_create:
                gaps_create.append(ts - at_create.pop(c))
            elif c in polled:
                end = polled.pop(c)
                gaps_polled.append((ts - end, max(AGE_FRACTION * batch_s, MIN_DELAY)))
    return {"seconds": result, "load": load, "at_create": gaps_create, "polled": gaps_polled}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the previous release's src (a checkout's src folder)")
    ap.add_argument("--runs", nargs="*", default=["10000:0.6", "20000:30", "100000:6"], help="rows:batch-seconds")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    trees = {"this": Path(__file__).resolve().parent.parent / "src", "before": args.before.resolve()}
    rows_out = []
    t0 = time.time()
    load0 = benchdocs.machine("in-process emulator")
    with tempfile.TemporaryDirectory(prefix="bench-due-") as tmp:
        work = Path(tmp)
        for spec in args.runs:
            rows_s, batch_s = spec.split(":")
            rows, batch = int(rows_s), float(batch_s)
            csv = work / f"reviews_{rows}.csv"
            make_csv(csv, rows)
            count_s, _tokens = count(work / f"count-{rows}", csv)
            ideal = count_s + batch
            got: dict[str, list[dict]] = {"this": [], "before": []}
            for rep in range(args.reps):
                for name in ("this", "before"):
                    r = run_once(trees[name], work, csv, batch, f"{name}-{rep}")
                    got[name].append(r)
                    print(
                        f"{rows:>7,} rows, {batch:g} s batches, {name:>6}: {r['seconds']:6.1f} s (ideal {ideal:.1f} s, "
                        f"{r['seconds'] / ideal:.2f}x); gaps at create {_fmt([g for g in r['at_create']])}, "
                        f"while polled {_fmt([g for g, _b in r['polled']])}; load {r['load']:.1f}",
                        flush=True,
                    )
            rows_out.append((rows, batch, ideal, got))
    lines = [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))} with "
        f"`.venv/bin/python bench/bench_due.py {' '.join(sys.argv[1:]).replace(str(args.before), '<before>/src')}` on {load0}. "
        "`<before>` is a `git worktree` of the previous release (`40da963`); each size runs this checkout and it one after the "
        "other. Time to results: the daemon's start to `ResultWritten`; ideal: `bgctl count` of the file + one batch's run time; "
        "gaps: a batch's end to its output's `OutputDownloadStarted` (for a batch the create reply names ended: from that reply; "
        "else from its request + its run time, an upper bound), against the documented bound (15 % of the batch's age, at least 0.5 s).",
        "",
        "| rows | batch | ideal | this checkout | × ideal | previous release | × ideal | gap at create (this / before) | gap while polled, max (this / before) | bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rows, batch, ideal, got in rows_out:
        this, before = (statistics.median(r["seconds"] for r in got[k]) for k in ("this", "before"))
        gc = [max((g for r in got[k] for g in r["at_create"]), default=None) for k in ("this", "before")]
        gp = [max((g for r in got[k] for g, _b in r["polled"]), default=None) for k in ("this", "before")]
        bound = max(AGE_FRACTION * batch, MIN_DELAY)
        lines.append(
            f"| {rows:,} | {batch:g} s | {ideal:.1f} s | {this:.1f} s | **{this / ideal:.2f}** | {before:.1f} s | {before / ideal:.2f} "
            f"| {_one(gc[0])} / {_one(gc[1])} | {_one(gp[0])} / {_one(gp[1])} | {bound:.1f} s |"
        )
    lines += [
        "",
        "What the ratios leave out: this ideal is `bgctl count` + one batch's run time; issue 38's also counts the upload, the "
        "download and the merge, which are not timed apart here, so the ratios are upper bounds of the issue's. The emulator "
        "runs in the benchmark's process: for the 100,000-row batches its own reading and counting of the uploaded file "
        "competes with the daemon for the two cores, and the gap while polled (from the create request + the run time) "
        "includes that validation. The emulator never answers a create with a batch already ended, so that case (which "
        "waited for the inbox's rescan before) is shown through `tick(now)` in `tests/test_due_property.py`.",
    ]
    benchdocs.publish(SECTION, lines, args.write_docs)


def _fmt(gaps: list[float]) -> str:
    return "-" if not gaps else f"n={len(gaps)} max {max(gaps):.2f} s"


def _one(g: float | None) -> str:
    return "-" if g is None else f"{g:.2f} s"


if __name__ == "__main__":
    main()
