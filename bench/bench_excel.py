"""Reading a 100,000-row Excel sheet (issue 13): wall time and peak RSS of ``open_table`` over every row.

    .venv/bin/python bench/bench_excel.py                          # 100,000 rows, 3 runs; prints the figures
    .venv/bin/python bench/bench_excel.py --rows 20000 --repeat 1  # a quick look
    git archive COMMIT src | tar -x -C /tmp/old && .venv/bin/python bench/bench_excel.py --before /tmp/old/src
                                                                   # alternate runs with an older reader

The workbook (``id`` int, ``response`` text of 100-600 characters, ``when`` datetime,
``amount`` float or empty; seeded) is written once with openpyxl's write-only mode into the
temporary directory ``bench/out``.  Each run is a fresh Python process that imports the
reader, iterates every row of ``open_table(path)`` and reports its wall time (reading only,
imports excluded) and the process's peak RSS (``getrusage``).  The figures are printed; the
Excel paragraph of docs/benchmarks.md ("Parquet and CSV inputs") quotes them by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "out"
WORDS = "the essay argues clearly that evidence supports a careful reading of each claim while some premises remain weak".split()

CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from batchgrader.pipeline.tables import open_table
t0 = time.perf_counter()
rows = chars = 0
with open_table(sys.argv[1]) as r:
    for row in r:
        rows += 1
        chars += len(row.values["response"])
wall = time.perf_counter() - t0
print(json.dumps({"rows": rows, "chars": chars, "wall_s": wall,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_workbook(rows: int) -> Path:
    import openpyxl

    path = OUT / f"excel_{rows}.xlsx"
    if path.exists():
        return path
    OUT.mkdir(exist_ok=True)
    rnd = random.Random(13)
    wb = openpyxl.Workbook(write_only=True)
    ws = wb.create_sheet("Data")
    ws.append(["id", "response", "when", "amount"])
    start = datetime.datetime(2020, 1, 1)
    for i in range(1, rows + 1):
        text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(15, 90)))
        amount = None if i % 7 == 0 else round(rnd.uniform(0, 100), 2)
        ws.append([i, text, start + datetime.timedelta(minutes=i), amount])
    tmp = path.with_suffix(".tmp.xlsx")
    wb.save(tmp)
    tmp.rename(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", help="another src/ directory (an older reader), run alternately with this one")
    a = ap.parse_args()
    path = make_workbook(a.rows)
    trees = {"this": str(ROOT / "src")}
    if a.before:
        trees = {"before": a.before, **trees}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for i in range(a.repeat):
        for name, src in trees.items():
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), src], stdout=subprocess.PIPE, check=True)
            r = json.loads(out.stdout)
            runs[name].append(r)
            print(f"  run {i + 1} {name}: {r['rows']} rows in {r['wall_s']:.1f} s, peak RSS {r['rss_mb']:.0f} MB", flush=True)
    for name, rs in runs.items():
        print(
            f"{name}: median {statistics.median(r['wall_s'] for r in rs):.1f} s, max peak RSS {max(r['rss_mb'] for r in rs):.0f} MB "
            f"({path.stat().st_size / 1e6:.0f} MB workbook, {a.rows:,} rows)"
        )


if __name__ == "__main__":
    main()
