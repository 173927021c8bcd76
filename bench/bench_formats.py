"""Parquet against CSV (issue 13): `bgctl count` of the same 1,000,000 rows as .parquet and as .csv.

    .venv/bin/python bench/bench_formats.py                 # 1,000,000 rows; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_formats.py --rows 100000 --no-docs   # a quick look

The CSV is bench_count.py's generated file (reused when present); the Parquet file holds the
same rows (``id`` int64, ``response`` string; row groups of 65,536 rows), converted once with
pyarrow's streaming CSV reader.  Each ``bgctl count FILE --json`` runs as a real subprocess in
a fresh wrapper that reports its wall time and peak RSS (as in bench_count.py); the two formats
alternate, ``--repeat`` times, and the medians are reported.  Target: Parquet within 1.2x of
the CSV time, peak RSS within the issue-2 bound (400 MB at 1M rows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_count  # noqa: E402
import benchdocs  # noqa: E402

SECTION = "## Parquet and CSV inputs (`bench/bench_formats.py`)"
TARGET_RATIO = 1.2
RSS_BOUND_MB = 400


def to_parquet(csv_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    out = csv_path.with_suffix(".parquet")
    if out.exists():
        return out
    tmp = out.with_suffix(".parquet.tmp")
    convert = pacsv.ConvertOptions(column_types={"id": pa.int64(), "response": pa.string()}, strings_can_be_null=False)
    parse = pacsv.ParseOptions(newlines_in_values=True)
    reader = pacsv.open_csv(csv_path, parse_options=parse, convert_options=convert)
    with pq.ParquetWriter(tmp, reader.schema) as w:
        for batch in reader:
            w.write_batch(batch, row_group_size=65536)
    tmp.rename(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    csv_path = bench_count.generate([a.rows], a.seed)[a.rows]
    pq_path = to_parquet(csv_path)
    runs: dict[str, list[dict]] = {"csv": [], "parquet": []}
    for i in range(a.repeat):
        for fmt, path in (("csv", csv_path), ("parquet", pq_path)):
            with tempfile.TemporaryDirectory() as home:
                r = bench_count.measure_count(path, Path(home))
            runs[fmt].append(r)
            print(
                f"  run {i + 1} {fmt}: {r['wall_s']:.1f} s, peak RSS {r['rss_mb']:.0f} MB, {r['summary']['input_tokens']} tokens",
                flush=True,
            )
    med = {f: statistics.median(x["wall_s"] for x in rs) for f, rs in runs.items()}
    rss = {f: max(x["rss_mb"] for x in rs) for f, rs in runs.items()}
    same = runs["csv"][0]["summary"]["input_tokens"] == runs["parquet"][0]["summary"]["input_tokens"]
    ratio = med["parquet"] / med["csv"]
    rows = "\n".join(
        f"| {i + 1} | {c['wall_s']:.1f} s | {p['wall_s']:.1f} s | {p['wall_s'] / c['wall_s']:.2f} | {c['rss_mb']:.0f} MB | {p['rss_mb']:.0f} MB |"
        for i, (c, p) in enumerate(zip(runs["csv"], runs["parquet"]))
    )
    text = f"""{SECTION}

{benchdocs.machine("pyarrow " + __import__("pyarrow").__version__)}

Data: bench_count.py's {a.rows:,}-row CSV `id,response` ({csv_path.stat().st_size / 1e6:,.0f} MB) and the same rows as
Parquet ({pq_path.stat().st_size / 1e6:,.0f} MB; `id` int64, `response` string, row groups of 65,536 rows).
Both give the same count: {"yes" if same else "NO"} ({runs["csv"][0]["summary"]["input_tokens"]:,} input tokens).

Command: `.venv/bin/python bench/bench_formats.py --rows {a.rows} --repeat {a.repeat}` (each run is
`bgctl --home <empty temp dir> count FILE --json`, wall clock and peak RSS of the process).

| run | CSV | Parquet | ratio | CSV peak RSS | Parquet peak RSS |
|---:|---:|---:|---:|---:|---:|
{rows}

Median ratio Parquet / CSV: **{ratio:.2f}** (target ≤ {TARGET_RATIO}: {"meets" if ratio <= TARGET_RATIO else "MISSES"} the target).
Peak RSS with Parquet: **{rss["parquet"]:.0f} MB** (bound {RSS_BOUND_MB} MB: {"meets" if rss["parquet"] <= RSS_BOUND_MB else "MISSES"} it;
CSV {rss["csv"]:.0f} MB). The Parquet reader holds one record batch of 8,192 rows as Python objects at a
time; pyarrow itself adds its library and one row group's decoded buffers.
"""
    print(text)
    if not a.no_docs:
        benchdocs.write_section(SECTION, text)


if __name__ == "__main__":
    main()
