"""Status calls per batch-hour (issue 9): the real engine against the in-memory provider on a fake
clock, with realistic batch run times (minutes to a day).  Not a test.

    .venv/bin/python bench/bench_polls.py                  # every scenario, poll_interval_seconds 60
    .venv/bin/python bench/bench_polls.py --write-docs     # ... and record docs/benchmarks.md

The daemon's tick is ``Engine.tick(now)``; the simulation calls it as the daemon would (every
0.5 s while it has work), but jumps the clock over stretches where nothing is due: no poll of any
batch in flight, no batch ending, no file arriving (a tick then makes no provider call, so the
counts are those of a real run).  Batches end by themselves after their run time
(``MemoryProvider.lifetime``).  Counted: status calls (``batches.retrieve`` and each page of
``batches.list``) per batch-hour (the summed run time of the batches), and how long after its
end each batch was seen done (the lag), also as a share of its run time.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchdocs  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
from batchgrader.core.configuration.config import load_config  # noqa: E402
from batchgrader.core.host.home import Home  # noqa: E402
from batchgrader.daemon.engine import Engine  # noqa: E402
from batchgrader.pipeline.pricing import load_pricing  # noqa: E402
from batchgrader.provider.memory import MemoryProvider  # noqa: E402
from batchgrader.store.eventstore import EventStore  # noqa: E402

SECTION = "## Status calls per batch-hour (`bench/bench_polls.py`)"
TICK = 0.5  # s, the daemon's tick period
T0 = 1_800_000_000.0
MIN, HOUR = 60.0, 3600.0


def log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def simulate(
    files: list[tuple[float, int]], lifetime: Callable[[int], float], poll_interval: float = 60.0, work: Path | None = None
) -> dict[str, float]:
    """Run the engine until every file is done: ``files`` are (arrival after start, chunks);
    ``lifetime(n)`` is the run time of the n-th batch created."""
    with tempfile.TemporaryDirectory(prefix="bench-polls-", dir=work) as tmp:
        home = Home(Path(tmp))
        home.ensure()
        home.config_file.write_text(
            f"stable_seconds: 0\nrescan_interval_seconds: 1\npoll_interval_seconds: {poll_interval}\nsplit_row_limit: 1\n"
            "max_completion_tokens: 20\npreflight_rows: 0\n"  # every row in a batch: the polls are what is measured
        )
        store = EventStore(home.db)
        created = 0

        def life(_b: object) -> float:
            nonlocal created
            created += 1
            return lifetime(created - 1)

        provider = MemoryProvider(lifetime=life)
        provider.now = T0
        engine = Engine(home, load_config(home, environ={}), store, provider, load_pricing())
        pending = sorted(files)
        now = T0
        ends: dict[str, float] = {}
        seen: dict[str, float] = {}
        dropped = 0
        while True:
            while pending and T0 + pending[0][0] <= now:
                _at, chunks = pending.pop(0)
                (home.inbox / f"f{dropped}.csv").write_text(
                    "id,response\n" + "".join(f"{i},file {dropped} row {i}\n" for i in range(chunks))
                )
                dropped += 1
            provider.advance(now)
            before = store.last_seq()
            engine.tick(now)
            ends.update((bid, t) for bid, t in provider.ends.items() if bid not in ends)
            for b in provider.batches.values():
                if b.is_terminal and b.id not in seen:
                    chunk = engine.ctx.state.batch_index.get(b.id)
                    if chunk is not None:
                        job = engine.ctx.state.jobs[chunk[0]]
                        if job.chunks[chunk[1]].status == b.status:
                            seen[b.id] = now
            jobs = engine.ctx.state.jobs.values()
            if not pending and dropped and all(j.terminal for j in jobs if not j.rejected) and len(jobs) >= dropped:
                break
            if store.last_seq() != before or engine.inbox_pending():
                now += TICK  # work in hand: the next tick comes at once
                continue
            flying = {(j.job_id, c.index) for j in jobs for c in j.chunks.values() if c.in_flight}
            dues = [due for key, (due, _d) in engine.ctx.timers().next_poll.items() if key in flying]
            dues += list(engine.ctx.timers().not_before.values())
            if provider.next_end() is not None:
                dues.append(provider.next_end())  # type: ignore[arg-type]
            if pending:
                dues.append(T0 + pending[0][0])
            upcoming = [d for d in dues if d > now]
            now = max(now + TICK, min(upcoming) if upcoming else now + TICK)
            if now - T0 > 30 * 24 * HOUR:
                raise RuntimeError("simulation did not finish in 30 days")
        store.close()
    status_calls = sum(1 for op, _ in provider.calls if op in ("retrieve", "list_batches"))
    run = {b.id: ends[b.id] - (b.created_at if b.created_at else T0) for b in provider.batches.values() if b.id in ends}
    batch_hours = sum(run.values()) / HOUR
    lags = [seen[bid] - ends[bid] for bid in run if bid in seen]
    shares = [(seen[bid] - ends[bid]) / run[bid] for bid in run if bid in seen and run[bid] > 0]
    return {
        "batches": len(run),
        "batch_hours": batch_hours,
        "status_calls": status_calls,
        "per_batch_hour": status_calls / batch_hours if batch_hours else float("nan"),
        "lag_mean": sum(lags) / len(lags) if lags else float("nan"),
        "lag_max": max(lags, default=float("nan")),
        "lag_share_max": max(shares, default=float("nan")),
        "span_hours": (now - T0) / HOUR,
    }


def scenarios(seed: int) -> list[tuple[str, list[tuple[float, int]], Callable[[int], float]]]:
    rng = random.Random(seed)
    many = [log_uniform(rng, 10 * MIN, 24 * HOUR) for _ in range(60)]
    arrivals = sorted((rng.uniform(0, 2 * HOUR), rng.randint(5, 15)) for _ in range(5))
    out: list[tuple[str, list[tuple[float, int]], Callable[[int], float]]] = [
        ("5 files arriving over 2 h, 5-15 batches each, run times 10 min-24 h (log-uniform)", arrivals, lambda n: many[n])
    ]
    for label, secs in (("30 s", 30.0), ("10 min", 10 * MIN), ("1 h", HOUR), ("6 h", 6 * HOUR), ("24 h", 24 * HOUR)):
        after = [(0.0, 1), (secs + MIN, 1), (2 * secs + 2 * MIN, 1)]  # each file once the one before is done
        out.append((f"3 files one after the other, one batch of {label} each", after, lambda n, s=secs: s))
    out.append(("20 batches of one file, all 1 h", [(0.0, 20)], lambda n: HOUR))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--poll-interval", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    rows = []
    for label, files, lifetime in scenarios(args.seed):
        r = simulate(files, lifetime, args.poll_interval)
        rows.append((label, r))
        print(
            f"{label}: {r['batches']} batches, {r['batch_hours']:.1f} batch-hours, {r['status_calls']} status calls = "
            f"{r['per_batch_hour']:.1f} per batch-hour; seen done {r['lag_mean']:.1f} s late on average "
            f"(at most {r['lag_max']:.1f} s, {100 * r['lag_share_max']:.1f} % of a run time)",
            flush=True,
        )
    if args.write_docs:
        when = datetime.now(UTC).strftime("%Y-%m-%d")
        argv = " ".join(a for a in sys.argv[1:] if a != "--write-docs")
        lines = [
            SECTION,
            "",
            f"Computed {when} with `.venv/bin/python bench/bench_polls.py {argv}`".rstrip()
            + f" (`poll_interval_seconds` {args.poll_interval:g}; a fake clock: the figures do not depend on the machine).",
            "The real `Engine.tick(now)` against the in-memory provider, whose batches end by themselves after their run "
            "time; the clock jumps over stretches where nothing is due. Status calls are `batches.retrieve` and each page "
            "of `batches.list`; a batch-hour is an hour of one batch's run time; the lag is how long after its end a batch "
            "was seen done.",
            "",
            "| scenario | batches | batch-hours | status calls | per batch-hour | lag mean / max | max lag / run time |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, r in rows:
            lines.append(
                f"| {label} | {r['batches']} | {r['batch_hours']:.1f} | {r['status_calls']} | {r['per_batch_hour']:.1f} | "
                f"{r['lag_mean']:.1f} s / {r['lag_max']:.1f} s | {100 * r['lag_share_max']:.1f} % |"
            )
        lines += ["", "Target: ≤ 30 status calls per batch-hour.", ""]
        print("wrote", benchdocs.write_section(SECTION, "\n".join(lines)))


if __name__ == "__main__":
    main()
