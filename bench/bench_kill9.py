"""Random kill -9 over a multi-file run (issue 10): count duplicate batches, rows paid twice, and
compare the outbox with an uninterrupted run byte for byte.

    .venv/bin/python bench/bench_kill9.py --files 20 --kills 100

A supervisor starts ``bgctl daemon --once`` against the in-process emulator and sends SIGKILL
at a random moment (seeded) while it works, ``--kills`` times; then lets it finish.  A kill is
counted only when the daemon was still running at that moment.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from batchgrader.emulator import Emulator, EmulatorConfig

KEY = "sk-bench-kill9-0123456789abcdef"
CONFIG = """\
poll_interval_seconds: 0.05
stable_seconds: 0.05
rescan_interval_seconds: 0.2
max_completion_tokens: 50
request_timeout_seconds: 5
split_row_limit: 3
max_simultaneous_batches: 4
delete_provider_files: false
"""
BGCTL = str(Path(sys.executable).parent / "bgctl")


def make_home(root: Path, files: int) -> Path:
    home = root
    (home / "inbox").mkdir(parents=True)
    (home / "config.yaml").write_text(CONFIG)
    for n in range(files):
        rows = 4 + n % 5
        (home / "inbox" / f"f{n:02d}.csv").write_text("id,response\n" + "".join(f"{i},file {n} row {i}\n" for i in range(rows)))
    return home


def env(home: Path, emu: Emulator) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_"))}
    e.update(BATCHGRADER_HOME=str(home), OPENAI_API_KEY=KEY, OPENAI_BASE_URL=emu.base_url)
    return e


def run_once(home: Path, emu: Emulator, timeout: float = 600) -> int:
    return subprocess.run([BGCTL, "daemon", "--once"], env=env(home, emu), capture_output=True, timeout=timeout).returncode


def outbox(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((home / "outbox").iterdir()) if p.is_file()}


def paid(emu: Emulator) -> tuple[int, int, int]:
    """(batches, duplicate bg_keys, rows answered more than once) as the provider saw them."""
    batches = emu.batches()
    keys = Counter(b["metadata"]["bg_key"] for b in batches)
    answered: Counter[str] = Counter()
    for b in batches:
        if b.get("output_file_id"):
            for line in emu.file_bytes(b["output_file_id"]).splitlines():
                if line.strip():
                    answered[json.loads(line)["custom_id"]] += 1
    return len(batches), sum(1 for n in keys.values() if n > 1), sum(1 for n in answered.values() if n > 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--min-wait", type=float, default=0.3)
    ap.add_argument("--max-wait", type=float, default=1.5)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bg-kill9-"))
    try:
        golden_home = make_home(tmp / "golden", args.files)
        with Emulator(EmulatorConfig(api_key=KEY, seed=11)) as emu:
            t0 = time.monotonic()
            assert run_once(golden_home, emu) == 0
            golden_s = time.monotonic() - t0
            golden_batches = emu.batches_created()
        golden = outbox(golden_home)

        home = make_home(tmp / "killed", args.files)
        kills = starts = 0
        t0 = time.monotonic()
        with Emulator(EmulatorConfig(api_key=KEY, seed=11)) as emu:
            while kills < args.kills:
                proc = subprocess.Popen(
                    [BGCTL, "daemon", "--once"], env=env(home, emu), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                starts += 1
                try:
                    proc.wait(timeout=rng.uniform(args.min_wait, args.max_wait))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=30)
                    kills += 1
                    continue
                if proc.returncode == 0:
                    break  # the work was done before all the kills were spent
            finished = 0
            for _ in range(4):
                finished += 1
                if run_once(home, emu) == 0:
                    break
            batches, dup_keys, rows_twice = paid(emu)
        same = outbox(home) == golden
        print(
            json.dumps(
                {
                    "files": args.files,
                    "chunks (uninterrupted run: batches)": golden_batches,
                    "uninterrupted_s": round(golden_s, 1),
                    "daemon_starts": starts,
                    "kills_while_working": kills,
                    "final_runs": finished,
                    "killed_run_s": round(time.monotonic() - t0, 1),
                    "batches_created": batches,
                    "duplicate_batches": dup_keys,
                    "rows_paid_twice": rows_twice,
                    "outbox_identical": same,
                    "seed": args.seed,
                },
                indent=1,
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
