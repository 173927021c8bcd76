"""The kill -9 suite, shared by every provider's daemon tests.

One ``KillSuite`` describes how to run the real ``bgctl daemon`` against the emulator for one
provider (configuration, environment, emulator).  The same two inputs make 4 chunks, 2 of them in
flight at a time.  Each interrupted run is compared with an uninterrupted *golden* run:

- ``kill_inside_api_call``: the emulator's request hook sends SIGKILL to the daemon when the n-th
  matching call has been *received* (before it takes effect) or has *taken effect* (before the
  answer reaches the daemon), the windows in which a naive client pays twice;
- ``kill_after_event``: a reader kills the daemon right after the n-th event of a type commits.

After the kill the daemon is restarted with ``--once`` until it finishes; ``check`` then asserts
that the outbox equals the golden one byte for byte, the emulator saw exactly one batch per chunk,
no temporary file is left, ``PRAGMA integrity_check`` is ok and both inputs are archived.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchgrader.emulator import Emulator, EmulatorConfig
from harness import BGCTL, event_types, integrity, outbox_files, temp_leftovers, wait_for

CHUNKS = 3 + 1  # a.csv: 7 rows / 3 per chunk; b.jsonl: 2 rows
SPLIT = "split_row_limit: 3\nmax_simultaneous_batches: 2\n"


def make_inputs(home: Path, config: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(config)
    (home / "inbox").mkdir(parents=True, exist_ok=True)
    (home / "inbox" / "a.csv").write_text("id,response\n" + "".join(f"{i},row {i} =cmd\n" for i in range(7)))
    (home / "inbox" / "b.jsonl").write_text('{"response": "one"}\n{"response": "two"}\n')


# The kills after an event for Anthropic, Azure OpenAI and Gemini: after each intent the provider's
# own records are reconciled (upload, create, download), and after the create's outcome.  Kills
# after the other events exercise engine steps that are the same for every provider;
# tests/test_crash.py covers them (OpenAI), which keeps the suite's time.
PROVIDER_EVENT_POINTS = [
    ("UploadStarted", 1),
    ("BatchCreateRequested", 1),
    ("BatchCreated", 1),
    ("OutputDownloadStarted", 1),
]

Hook = Callable[[str, str, str], None]


@dataclass(frozen=True)
class KillSuite:
    """How one provider's daemon runs against the emulator: its configuration (the inputs above
    split into ``CHUNKS`` chunks under it), the emulator's key and the daemon's environment."""

    config: str
    api_key: str
    env_for: Callable[[Path, Emulator], dict[str, str]]
    finish_attempts: int = 4
    served: tuple[str, ...] = ()  # model ids the emulator serves besides the catalogue's (Azure deployments)

    def make_inputs(self, home: Path, config: str | None = None) -> None:
        make_inputs(home, self.config if config is None else config)

    def emulator(self, hook: Hook | None = None, **kw: object) -> Emulator:
        cfg = EmulatorConfig(api_key=self.api_key, seed=11, on_request=hook, extra_models=self.served, **kw)  # type: ignore[arg-type]
        return Emulator(cfg).start()

    def start(self, home: Path, emu: Emulator) -> subprocess.Popen:
        env = self.env_for(home, emu)
        return subprocess.Popen([BGCTL, "daemon", "--once"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, home: Path, emu: Emulator, attempts: int | None = None) -> None:
        """Run ``daemon --once`` until it exits 0 (a restart after a kill may need several)."""
        res = None
        for _ in range(attempts or self.finish_attempts):
            res = subprocess.run(
                [BGCTL, "daemon", "--once"], env=self.env_for(home, emu), capture_output=True, text=True, timeout=180, check=False
            )
            if res.returncode == 0:
                return
        raise AssertionError(f"daemon did not finish: {res.stderr[-2000:] if res else ''}")

    def golden(self, home: Path) -> dict[str, bytes]:
        """The outbox of an uninterrupted run, in one ``--once`` pass."""
        self.make_inputs(home)
        emu = self.emulator()
        try:
            self.finish(home, emu, attempts=1)
            assert emu.batches_created() == CHUNKS
            return outbox_files(home)
        finally:
            emu.stop()

    def check(self, home: Path, emu: Emulator, golden: dict[str, bytes]) -> None:
        assert outbox_files(home) == golden
        assert emu.batches_created() == CHUNKS, emu.stats()  # never paid twice
        assert not temp_leftovers(home)
        assert integrity(home / "batchgrader.db") == "ok"
        assert sorted(p.name for p in (home / "archive").iterdir()) == ["a.csv", "b.jsonl"]

    def kill_inside_api_call(self, home: Path, golden: dict[str, bytes], method: str, route: str, phase: str, nth: int) -> None:
        self.make_inputs(home)
        target: dict[str, int] = {}
        seen = {"n": 0}
        killed = threading.Event()
        reaped = threading.Event()

        def hook(m: str, r: str, p: str) -> None:
            if (m, r, p) == (method, route, phase) and not killed.is_set():
                seen["n"] += 1
                if seen["n"] == nth and "pid" in target:
                    os.kill(target["pid"], signal.SIGKILL)
                    killed.set()
                    reaped.wait(timeout=30)  # the handler must not answer a dead client before it is gone

        emu = self.emulator(hook)
        try:
            proc = self.start(home, emu)
            target["pid"] = proc.pid
            try:
                proc.wait(timeout=180)
            finally:
                reaped.set()
            assert killed.is_set(), f"kill point {method} {route} {phase} #{nth} never reached"
            assert proc.returncode == -signal.SIGKILL
            self.finish(home, emu)
            self.check(home, emu, golden)
        finally:
            emu.stop()

    def kill_after_event(self, home: Path, golden: dict[str, bytes], event: str, nth: int) -> None:
        self.make_inputs(home)
        emu = self.emulator()
        try:
            proc = self.start(home, emu)
            db = home / "batchgrader.db"
            try:
                wait_for(
                    lambda: event_types(db).count(event) >= nth or proc.poll() is not None,
                    timeout=120,
                    interval=0.002,
                    what=f"{event} #{nth}",
                )
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
            self.finish(home, emu)
            self.check(home, emu, golden)
        finally:
            emu.stop()
