"""The combination matrix (issue 32) as a table: every all-pairs combination of the features
(``tests/combos.py``: route, samples, judges, preflight, reuse, structured output (none, the profile's, each row's own), provider, a settings edit, a refused row, the OpenAI endpoint, the store: SQLite, or two daemons on PostgreSQL) run
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
from pg_server import PostgresServer, find_bindir  # noqa: E402

SECTION = "## Combination matrix (`bench/bench_matrix.py`)"


def start_postgres() -> PostgresServer:
    """The test suite's PostgreSQL server (tests/pg_server.py), for the combinations on a shared store."""
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit(
            "no PostgreSQL server binaries: install Debian's postgresql package (the shared-store combinations need one)"
        )
    return PostgresServer(bindir).start()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    load = machine("in-memory provider")
    combos = matrix()
    names = list(INVARIANTS)
    rows, broken_total = [], 0
    server = start_postgres() if any(c.store == "shared" for c in combos) else None
    t0 = time.perf_counter()
    for combo in combos:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "home"
            os.environ["BATCHGRADER_HOME"] = str(root)
            home = Home.resolve(root).ensure()
            url = server.create_database() if server is not None and combo.store == "shared" else None
            out = run_combo(home, combo, pg_url=url)
            try:
                broken = violations(out, count_of(home, combo, texts_of(combo)[0]))
            finally:
                out.rig.close()
                if url is not None and server is not None:
                    server.drop_database(url)
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
        "through the real engine with the in-memory provider (a `shared` store: two engines on one PostgreSQL "
        f"database, ticking in turn under their leases); {seconds:.1f} s in all. "
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
    if server is not None:
        server.stop()
    publish(SECTION, lines, write=not args.no_docs)
    if broken_total:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
