"""The sandbox's emulator in a process of its own: ``python -m batchgrader.emulator.child``.

Started by ``bgctl daemon --sandbox`` (:mod:`batchgrader.daemon.sandbox`), so the emulator's
memory (each input file parsed and counted, every answer drafted) is never the daemon's.  It
serves on a free port of 127.0.0.1 with its state in ``--data-dir`` (a restarted sandbox finds
its batches again), writes one JSON line ``{"pid", "root_url", "base_url"}`` to stdout when it
is serving, and stops when its standard input is closed: by the daemon when it stops, or by the
kernel when the daemon dies (even kill -9), so it never outlives the daemon.  It ignores SIGINT
(a Ctrl-C in the daemon's terminal is for the daemon, which then closes its input).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

#: the first word of its command line after ``-m``: how ``ps`` shows it
MODULE = "batchgrader.emulator.child"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=MODULE, description="The SIMULATED Batch API emulator of `bgctl daemon --sandbox`.")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--label", default="sandbox emulator", help="Only shown in the process list.")
    ap.add_argument("--validating-s", type=float, default=0.5)
    ap.add_argument("--in-progress-s", type=float, default=1.5)
    ap.add_argument("--finalizing-s", type=float, default=0.5)
    ap.add_argument("--model", action="append", default=[], help="A model it serves besides the shipped catalogue's.")
    ap.add_argument("--models-file", default=None, help="A catalogue CSV whose models it serves too (read when it changes).")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    from batchgrader.emulator import Emulator, EmulatorConfig

    os.makedirs(args.data_dir, exist_ok=True)
    emu = Emulator(
        EmulatorConfig(
            api_key=args.api_key,
            data_dir=args.data_dir,
            validating_s=args.validating_s,
            in_progress_s=args.in_progress_s,
            finalizing_s=args.finalizing_s,
            extra_models=tuple(args.model),
            models_file=args.models_file,
        )
    ).start()
    try:
        sys.stdout.write(json.dumps({"pid": os.getpid(), "root_url": emu.root_url, "base_url": emu.base_url}) + "\n")
        sys.stdout.flush()
        while sys.stdin.buffer.read(4096):  # until the daemon closes it (or dies)
            pass
    finally:
        emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
