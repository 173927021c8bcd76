"""Routes benchmark (issue 26): time to results of a small file on ``route: online`` and
``route: flex`` against ``route: batch``, in the sandbox emulator, with per-minute limits low
enough that 429s happen.  Not a test.

    .venv/bin/python bench/bench_routes.py                  # 50 rows; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_routes.py --no-docs        # print only

For each route, in a fresh temporary home: a CSV of ``--rows`` rows, a profile on model
``o4-mini`` (it has a flex tier) with that route, and one run of the real daemon
(``bgctl daemon --once``, a subprocess) against an in-process emulator over real HTTP, with the
sandbox daemon's batch phases (0.5 s validating, 1.5 s in progress, 0.5 s finalizing) and
``--rpm`` synchronous requests per ``--window`` seconds per model.  Time to results is from the
daemon's start (the file already in the inbox) to its ``ResultWritten``.  The run checks that
every row was answered once (the emulator's 200s on the synchronous endpoint, the result file)
and that no request left before a 429's Retry-After had passed (from the event log).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdocs import load_average, machine, write_section  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from batchgrader.emulator import Emulator, EmulatorConfig  # noqa: E402

BGCTL = str(Path(sys.executable).parent / "bgctl")
KEY = "sk-bench-routes-0123456789abcdef"
SECTION = "## Flex and online routes (`bench/bench_routes.py`)"
CONFIG = "stable_seconds: 0.2\nrescan_interval_seconds: 1\nmodel: o4-mini\nmax_completion_tokens: 2000\nreasoning_effort: low\n"


def env(home: Path, base_url: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    e.update(BATCHGRADER_HOME=str(home), OPENAI_API_KEY=KEY, OPENAI_BASE_URL=base_url)
    return e


def events(home: Path) -> list[tuple[float, str, dict]]:
    conn = sqlite3.connect(f"file:{home / 'batchgrader.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT ts, type, payload FROM events ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [(datetime.fromisoformat(ts).timestamp(), t, json.loads(p)) for ts, t, p in rows]


def early_requests(evs: list[tuple[float, str, dict]]) -> int:
    """Requests that left before the Retry-After of a 429 seen before them had passed."""
    latest, early = None, 0
    for ts, t, p in evs:
        if t == "OnlineRequestFailed" and p.get("retry_at") is not None:
            latest = max(latest or 0.0, float(p["retry_at"]))
        elif t == "OnlineRequestSent" and latest is not None and ts < latest - 0.005:
            early += 1
    return early


def run(route: str, rows: int, rpm: int | None, window: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bg-bench-routes-") as tmp:
        home = Path(tmp) / "home"
        for d in ("inbox", "outbox"):
            (home / d).mkdir(parents=True)
        (home / "config.yaml").write_text(CONFIG + f"route: {route}\n")
        (home / "inbox" / "a.csv").write_text("id,response\n" + "".join(f"{i},essay number {i} on rivers\n" for i in range(rows)))
        cfg = EmulatorConfig(
            api_key=KEY,
            validating_s=0.5,
            in_progress_s=1.5,
            finalizing_s=0.5,
            sync_requests_per_minute=rpm,
            sync_limit_window_s=window,
        )
        with Emulator(cfg) as emu:
            started = time.time()
            proc = subprocess.run([BGCTL, "daemon", "--once"], env=env(home, emu.base_url), capture_output=True, text=True)
            log = list(emu.store.sync_limits().log)
        if proc.returncode != 0:
            raise SystemExit(f"{route}: daemon exited {proc.returncode}: {proc.stderr[-2000:]}")
        evs = events(home)
        written = next(ts for ts, t, _ in evs if t == "ResultWritten")
        answered = [p["custom_id"] for _, t, p in evs if t == "OnlineRequestAnswered"]
        result = (home / "outbox" / "a_results.csv").read_text(encoding="utf-8").splitlines()
        return {
            "route": route,
            "limit": f"{rpm} / {window:g} s" if rpm else "none",
            "seconds": written - started,
            "sync_200": sum(1 for _, _, s, _ in log if s == 200),
            "sync_429": sum(1 for _, _, s, _ in log if s == 429),
            "answered_online": len(answered),
            "answered_once": len(answered) == len(set(answered)),
            "result_rows": len(result) - 1,
            "early": early_requests(evs),
            "cost": sum(p["cost_usd"] for _, t, p in evs if t == "TokensUsed"),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--rpm", type=int, default=12, help="synchronous requests per window per model")
    ap.add_argument("--window", type=float, default=2.0, help="the emulator's 'minute', seconds")
    ap.add_argument("--no-docs", action="store_true", help="print the figures, do not write docs/benchmarks.md")
    args = ap.parse_args()
    load = load_average()
    runs = [("batch", args.rpm), ("online", None), ("flex", None), ("online", args.rpm), ("flex", args.rpm)]
    results = [run(route, args.rows, rpm, args.window) for route, rpm in runs]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION,
        "",
        f"Measured {when} on {machine('emulator in process')}; one run each:",
        f"`.venv/bin/python bench/bench_routes.py --rows {args.rows} --rpm {args.rpm} --window {args.window:g}` (load {load:.1f}).",
        f"A {args.rows}-row CSV on model o4-mini; the emulator's batch phases are the sandbox's (0.5 / 1.5 / 0.5 s) and its",
        f"synchronous endpoint takes {args.rpm} requests per {args.window:g} s per model (a shortened minute), so the",
        "synchronous routes meet 429s (each synchronous route also runs once without a limit);",
        "`online_concurrency` is the default (4).",
        "",
        "| route | sync limit | time to results | sync answered (200) | 429s | rows in result | each row once | sent before Retry-After | billed (SIMULATED) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['route']} | {r['limit']} | {r['seconds']:.1f} s | {r['sync_200']} | {r['sync_429']} | {r['result_rows']} | "
            f"{'yes' if r['answered_once'] else 'NO'} | {r['early']} | ${r['cost']:.6f} |"
        )
    lines += [
        "",
        "The batch route's time is the daemon's start, the sandbox batch's phases plus the daemon's polls, and its",
        "preflight (3 rows through the synchronous endpoint, the default); the synchronous routes' time is the daemon's",
        "start plus the requests, and under the limit the per-minute windows: each 429 holds the job's requests until its",
        "Retry-After. Against a real provider a batch takes minutes to hours",
        "and a synchronous request seconds, so the gap is far wider than here; flex answers more slowly than online",
        "at the Batch price (here the emulator answers both at once).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
