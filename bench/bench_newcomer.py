"""A newcomer's first minutes (issue 35): the README's sandbox command on a fresh clone, and
`bgctl init` to a graded sandbox file.

    .venv/bin/python bench/bench_newcomer.py             # figures into docs/benchmarks.md
    .venv/bin/python bench/bench_newcomer.py --no-clone  # only init -> graded (seconds)
    .venv/bin/python bench/bench_newcomer.py --tests     # also the README's test command on the clone (minutes)

1. ``git clone`` of this repository into a temporary folder, then the README's first command
   there, verbatim (venv, ``pip install -e .``, ``bgctl submit``, ``bgctl daemon --sandbox
   --once``, ``bgctl status``), timed as a whole (pip reads this machine's package cache, so a
   machine that has never downloaded the packages takes longer);
2. with this checkout's ``bgctl``: ``bgctl init DIR`` then ``bgctl --home DIR grade
   DIR/examples/reviews.csv --sandbox``, timed from the start of ``init`` to ``grade``'s exit, with
   the job's state read from its output.

3. with ``--tests``: the README's second command (the test suite) in the same fresh clone,
   verbatim, timed as a whole, with pytest's closing line.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdocs import machine, publish  # noqa: E402

SECTION = "## A newcomer's first minutes (`bench/bench_newcomer.py`)"
BGCTL = str(Path(sys.executable).parent / "bgctl")


def readme_command(marker: str) -> str:
    """The README's plain fenced block (```` ``` ```` without a language) that contains ``marker``, verbatim."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    fence = ""
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if current is None and line.startswith("```"):
            fence, current = line, []
        elif current is not None and line == "```":
            if fence == "```":
                blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return next("\n".join(b) for b in blocks if marker in "\n".join(b)).strip()


def timed(cmd: str | list[str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{cmd} failed ({res.returncode}): {res.stderr[-2000:]}")
    return dt, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-clone", action="store_true", help="skip the fresh clone's README command")
    ap.add_argument("--tests", action="store_true", help="also time the README's test command on the clone")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("git clone of the current commit")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_clone:
            subprocess.run(["git", "clone", "-q", str(ROOT), str(work / "clone")], check=True)
            dt, out = timed(readme_command("daemon --sandbox --once"), work / "clone")
            state = "completed" if "completed" in out else "NOT COMPLETED"
            rows.append(
                f"| the README's sandbox command on a fresh clone (venv, install, submit, daemon, status) | {dt:.1f} s | {state} |"
            )
            if args.tests:
                dt, out = timed(readme_command("pytest"), work / "clone")
                closing = (out.strip().splitlines() or ["(no output)"])[-1]
                rows.append(
                    f"| the README's test command in the same clone (the test extra installed, the whole suite) | {dt / 60:.1f} min | {closing} |"
                )
        t0 = time.perf_counter()
        timed([BGCTL, "init", str(work / "home")], work)
        _dt, out = timed(
            [BGCTL, "--home", str(work / "home"), "grade", str(work / "home/examples/reviews.csv"), "--sandbox"], work
        )
        dt = time.perf_counter() - t0
        m = re.search(r"job \S+ (\w+), (\d+) rows", out)
        rows.append(
            f"| `bgctl init DIR`, then `bgctl grade DIR/examples/reviews.csv --sandbox` (12 rows) | {dt:.1f} s | "
            f"{m.group(1) + ', ' + m.group(2) + ' rows' if m else 'NOT COMPLETED'} |"
        )
    lines = [
        SECTION,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `.venv/bin/python bench/bench_newcomer.py` on {load}. "
        "Wall clock of whole subprocesses; pip reads this machine's package cache (a machine that never downloaded "
        "the packages also waits for the downloads). `--tests` also times the README's test command in the clone.",
        "",
        "| step | time | outcome |",
        "|---|---:|---|",
        *rows,
    ]
    publish(SECTION, lines, write=not args.no_docs)


if __name__ == "__main__":
    main()
