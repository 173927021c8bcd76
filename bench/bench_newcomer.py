"""A newcomer's first minutes (issue 35): the README's sandbox command on a fresh clone, and
`bgctl init` to a graded sandbox file.

    .venv/bin/python bench/bench_newcomer.py             # figures into docs/benchmarks.md
    .venv/bin/python bench/bench_newcomer.py --no-clone  # only init -> graded (seconds)

1. ``git clone`` of this repository into a temporary folder, then the README's first command
   there, verbatim (venv, ``pip install -e .``, ``bgctl submit``, ``bgctl daemon --sandbox
   --once``, ``bgctl status``), timed as a whole (pip reads this machine's package cache, so a
   machine that has never downloaded the packages takes longer);
2. with this checkout's ``bgctl``: ``bgctl init DIR`` then ``bgctl --home DIR grade
   DIR/examples/reviews.csv --sandbox``, timed from the start of ``init`` to ``grade``'s exit, with
   the job's state read from its output.

The README's second command (the test suite) is timed by CI itself (``.ci/run``); its figure is
in the stop note of each session.
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
from benchdocs import machine, write_section  # noqa: E402

SECTION = "## A newcomer's first minutes (`bench/bench_newcomer.py`)"
BGCTL = str(Path(sys.executable).parent / "bgctl")


def readme_sandbox_command() -> str:
    """The README's first fenced command (the sandbox run), verbatim."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```\n(.*?)\n```$", text, flags=re.M | re.S)
    return next(b for b in blocks if "daemon --sandbox --once" in b).strip()


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
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("git clone of the current commit")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_clone:
            subprocess.run(["git", "clone", "-q", str(ROOT), str(work / "clone")], check=True)
            cmd = readme_sandbox_command()
            dt, out = timed(cmd, work / "clone")
            state = "completed" if "completed" in out else "NOT COMPLETED"
            rows.append(
                f"| the README's sandbox command on a fresh clone (venv, install, submit, daemon, status) | {dt:.1f} s | {state} |"
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
        "the packages also waits for the downloads). The README's test command is timed by CI (`.ci/run`).",
        "",
        "| step | time | outcome |",
        "|---|---:|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_docs:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
