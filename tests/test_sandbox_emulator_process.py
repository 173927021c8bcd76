"""Issue 23 (9): the sandbox's emulator runs in a child process of the daemon, labelled in the
process list, and never outlives the daemon (closed input, or the daemon killed with -9)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from batchgrader.daemon.sandbox import SandboxEmulator
from harness import wait_for

pytestmark = pytest.mark.timeout(120)


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status  # exited, waiting to be reaped


def test_the_sandbox_emulator_is_a_labelled_child_process_serving_the_sdk(tmp_path: Path) -> None:
    from openai import OpenAI

    emu = SandboxEmulator(tmp_path / "sandbox", "sk-sandbox-not-a-real-key", label="sandbox emulator of HOME").start()
    try:
        assert emu.pid is not None and emu.pid != os.getpid()
        cmdline = Path(f"/proc/{emu.pid}/cmdline").read_bytes().split(b"\0")
        assert b"batchgrader.emulator.child" in cmdline and b"sandbox emulator of HOME" in cmdline
        client = OpenAI(api_key="sk-sandbox-not-a-real-key", base_url=emu.base_url, max_retries=0)
        assert list(client.batches.list()) == []
        pid = emu.pid
    finally:
        emu.stop()
    assert _gone(pid) and not emu.alive()


def test_the_sandbox_emulator_ends_when_its_daemon_is_killed(tmp_path: Path) -> None:
    code = (
        "import signal; from pathlib import Path; from batchgrader.daemon.sandbox import SandboxEmulator; "
        f"e = SandboxEmulator(Path({str(tmp_path / 'sandbox')!r}), 'sk-sandbox-not-a-real-key').start(); "
        "print(e.pid, flush=True); signal.pause()"  # until it is killed
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not _gone(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    wait_for(lambda: _gone(child), timeout=30, what="the emulator process to end after its daemon was killed")
