"""What `bgctl submit` reads of a file before it queues it (issue 38, item 3): the whole file
through prepare's checks (as before) against its header and first rows
(``ops/actions.py`` ``SUBMIT_CHECKED_ROWS``), on CSVs of 20,000 and 100,000 rows, interleaved
in one run (median of 5).  Not a test.

    .venv/bin/python bench/bench_submit_check.py [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchdocs  # noqa: E402
from batchgrader.core.configuration.config import load_config  # noqa: E402
from batchgrader.core.host.home import Home  # noqa: E402
from batchgrader.ops.actions import SUBMIT_CHECKED_ROWS  # noqa: E402
from batchgrader.pipeline.input_checks import check_input  # noqa: E402

SECTION = "## What `bgctl submit` reads (`bench/bench_submit_check.py`)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Home(Path(tmp) / "home")
        home.ensure()
        profile = load_config(home, environ={}).profile(None)
        for n in (20_000, 100_000):
            f = Path(tmp) / f"rows{n}.csv"
            f.write_text("id,response\n" + "".join(f"{i},an answer of some length to grade number {i}\n" for i in range(n)))
            whole, head = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                check_input(f, profile, home)
                whole.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                check_input(f, profile, home, rows=SUBMIT_CHECKED_ROWS)
                head.append(time.perf_counter() - t0)
            w, h = statistics.median(whole), statistics.median(head)
            rows.append(f"| {n:,} | {w:.3f} s | {h:.3f} s | {w / h:.0f}× |")
    benchdocs.publish(
        SECTION,
        [
            SECTION,
            "",
            "`bgctl submit` checks a file as `bgctl count` reads it before it queues it; it now reads the header and",
            f"the first {SUBMIT_CHECKED_ROWS:,} rows (the rest is the daemon's to check at prepare, before anything is",
            "paid), no longer the whole file. Median of 5, interleaved:",
            "",
            "| rows | whole file (before) | first rows (now) | ratio |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Command: `.venv/bin/python bench/bench_submit_check.py --write-docs`. {benchdocs.machine('no daemon')}.",
        ],
        args.write_docs,
    )


if __name__ == "__main__":
    main()
