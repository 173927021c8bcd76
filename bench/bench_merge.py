"""Merge benchmark (issue 9, item 5): merging a 50,000-row chunk's results into its rows, next to
bare ``json.loads`` of every line of the same output file (the least any merge must do).  Not a test.

    .venv/bin/python bench/bench_merge.py            # 50,000 rows
    .venv/bin/python bench/bench_merge.py --rows 10000

The output file is shuffled (the Batch API does not keep the input order) and each answer is
about 300 characters.  The merge is what the daemon does (``pipeline/merge.merge_chunk``, in
the daemon or, for a chunk of ``merge_worker_rows`` rows or more, a worker process): the outcomes
read (``pipeline/results.iter_outcomes``) into a ``ChunkSpool`` and written in the chunk's order.
Best of three runs each, measured in one run, so the ratio holds on a noisy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from batchgrader.pipeline.merge import ChunkSpool  # noqa: E402
from batchgrader.pipeline.results import iter_outcomes  # noqa: E402


def output_file(path: Path, ids: list[str]) -> None:
    lines = []
    for cid in ids:
        body = {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "model": "gpt-5.4-mini",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "A fair grade. " * 22}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 370, "completion_tokens": 50, "total_tokens": 420},
        }
        lines.append(
            json.dumps(
                {"id": "r", "custom_id": cid, "response": {"status_code": 200, "request_id": "q", "body": body}, "error": None}
            )
        )
    random.Random(1).shuffle(lines)
    path.write_text("\n".join(lines) + "\n")


def best(f, runs: int = 3) -> float:
    out = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        ids = [f"bg-0123456789ab-{i}" for i in range(args.rows)]
        out = Path(tmp) / "output.jsonl"
        output_file(out, ids)

        def merge() -> None:
            with open(Path(tmp) / "merged.jsonl", "wb") as f, ChunkSpool(ids) as spool:
                spool.read(iter_outcomes(out))
                m = spool.write(f.write, "completed")
            assert m.succeeded == args.rows

        def bare() -> None:
            with open(out, "rb") as f:
                for line in f:
                    json.loads(line)

        t_merge, t_bare = best(merge), best(bare)
    load = os.getloadavg()[0]
    print(
        f"merge of {args.rows:,} rows: {t_merge:.2f} s; bare json.loads of the output: {t_bare:.2f} s "
        f"(ratio {t_merge / t_bare:.1f}); load {load:.1f}"
    )


if __name__ == "__main__":
    main()
