"""The emulator behind ``bgctl daemon --sandbox``, in a child process the daemon starts and stops.

In the daemon's own process the emulator's memory (input files parsed and counted, answers
drafted) added to the daemon's: 2.5 GB at 500,000 rows.  In a child process
(:mod:`batchgrader.emulator.child`, shown in ``ps`` as ``... -m
batchgrader.emulator.child --label sandbox emulator of HOME``) the daemon keeps the
memory of a live run.  It is started at the first provider call of the sandbox and stopped when
the daemon stops; its standard input is a pipe from the daemon, so it also ends when the daemon
is killed.  Its own messages go to ``<home>/sandbox/emulator.log``.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
from pathlib import Path
from typing import IO

log = logging.getLogger("batchgrader.sandbox")

START_TIMEOUT = 60.0  # s: importing the emulator and its tokenizer, on a busy machine
STOP_TIMEOUT = 10.0
#: The child's environment on top of the daemon's: glibc's malloc keeps at most two arenas, so
#: the memory the server's many short request threads free is reused rather than kept per thread
#: (ignored by other C libraries).
CHILD_ENV = {"MALLOC_ARENA_MAX": "2"}


class SandboxEmulatorError(RuntimeError):
    """The sandbox's emulator process did not start."""


class SandboxEmulator:
    """``start()`` runs the child and reads where it serves; ``root_url`` / ``base_url`` as the
    in-process :class:`~batchgrader.emulator.Emulator` has them; ``stop()`` ends it."""

    def __init__(
        self,
        data_dir: Path,
        api_key: str,
        label: str = "sandbox emulator",
        models: tuple[str, ...] = (),
        models_file: Path | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.models, self.models_file = models, models_file  # served besides the shipped catalogue's
        self.api_key = api_key
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None
        self.root_url = ""
        self.base_url = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> SandboxEmulator:
        from batchgrader.emulator.child import MODULE

        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", MODULE, "--label", self.label, "--data-dir", str(self.data_dir), "--api-key", self.api_key]
        for m in self.models:
            cmd += ["--model", m]
        if self.models_file is not None:
            cmd += ["--models-file", str(self.models_file)]
        with open(self.data_dir / "emulator.log", "ab") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                close_fds=True,
                env={**os.environ, **CHILD_ENV},
            )
        assert self.proc.stdout is not None
        line = _read_line(self.proc.stdout, timeout)
        try:
            ready = json.loads(line)
            self.root_url, self.base_url = str(ready["root_url"]), str(ready["base_url"])
        except (ValueError, KeyError, TypeError):
            self.stop()
            raise SandboxEmulatorError(
                f"the sandbox emulator did not start within {timeout:g} s (see {self.data_dir / 'emulator.log'})"
            ) from None
        log.info("sandbox emulator started in its own process (pid %s, %s)", self.proc.pid, self.root_url)
        return self

    def stop(self) -> None:
        """Close its input (it then stops serving and exits); terminate it if it does not."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.info("sandbox emulator stopped (pid %s, exit %s)", proc.pid, proc.returncode)


def _read_line(stream: IO[bytes], timeout: float) -> str:
    """One line from the child's stdout, or "" if none came within ``timeout`` (or it exited)."""
    import time

    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return ""
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            buf += chunk
    return buf.split(b"\n", 1)[0].decode("utf-8", errors="replace")
