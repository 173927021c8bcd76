"""The combination matrix (issue 32) as a table: every all-pairs combination of the features
(``tests/combos.py``: route, samples, judges, preflight, reuse, structured output (none, the profile's, each row's own), provider, a settings edit, a refused row, the OpenAI endpoint) run
tick by tick with the in-memory provider, and which of the invariants each holds.

    .venv/bin/python bench/bench_matrix.py            # the table into docs/benchmarks.md
    .venv/bin/python bench/bench_matrix.py --no-docs  # print it only

The same runs and checks as ``tests/test_combinations.py`` (which fails on any break); this
script only tabulates them.  Each combination runs in a fresh temporary home.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
from batchgrader.core.host.home import Home  # noqa: E402
from benchdocs import machine, publish  # noqa: E402
from combos import FEATURES, INVARIANTS, count_of, matrix, run_combo, texts_of, violations  # noqa: E402

SECTION = "## Combination matrix (`bench/bench_matrix.py`)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("in-memory provider")
    combos = matrix()
    names = list(INVARIANTS)
    rows, broken_total = [], 0
    t0 = time.perf_counter()
    for combo in combos:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "home"
            os.environ["BATCHGRADER_HOME"] = str(root)
            home = Home.resolve(root).ensure()
            out = run_combo(home, combo)
            try:
                broken = violations(out, count_of(home, combo, texts_of(combo)[0]))
            finally:
                out.rig.close()
        broken_total += len(broken)
        cells = ["broken" if n in broken else "holds" for n in names]
        rows.append(f"| {' | '.join(str(getattr(combo, f)) for f in FEATURES)} | {' | '.join(cells)} |")
        for name, seen in broken.items():
            print(f"{combo}: {name}: {seen}", file=sys.stderr)
    seconds = time.perf_counter() - t0
    lines = [
        SECTION,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `.venv/bin/python bench/bench_matrix.py` on {load}. "
        f"{len(combos)} combinations: allpairspy's all-pairs set over the features, completed with the pairs its "
        "filter leaves out and the combinations the issue reported (`tests/combos.py`), each run tick by tick "
        f"through the real engine with the in-memory provider; {seconds:.1f} s in all. "
        f"Invariants: {'; '.join(f'*{n}*: {d}' for n, d in INVARIANTS.items())}. "
        "`tests/test_combinations.py` runs the same and fails on any break; it also cancels each combination "
        "at every tick and checks that the job ends cancelled with nothing paid afterwards.",
        "",
        f"| {' | '.join(FEATURES)} | {' | '.join(names)} |",
        f"|{'---|' * (len(FEATURES) + len(names))}",
        *rows,
        "",
        f"{len(combos)} combinations × {len(names)} invariants: "
        + ("**all hold**." if broken_total == 0 else f"**{broken_total} broken** (printed above)."),
    ]
    publish(SECTION, lines, write=not args.no_docs)
    if broken_total:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
