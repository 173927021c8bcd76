"""A ``python`` grader's ``grade(sample, item) -> float``, run only when the import was given
``--allow-python``, in a child process with OpenAI's published limits:

* no network: the child enters a network namespace of its own (``unshare``: a user namespace
  too where the user is not root) before it runs anything, so it has only a loopback that
  nothing listens on.  Where the kernel refuses, python graders are refused (:func:`unavailable`);
* ``TIME_LIMIT_SECONDS`` (2 minutes) per row, on the wall clock: a row over it is an error
  (``python_grader_timeout``) and the child is replaced for the next row;
* ``MEMORY_LIMIT_BYTES`` (2 GiB) of address space and ``DISK_LIMIT_BYTES`` (1 GiB) per file
  written (``setrlimit``);
* Python in isolated mode (``-I``: no user site, no environment variables read), started with
  an empty environment.

The grader's own prints go to the child's stderr (dropped), never into the protocol.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from batchgrader.pipeline.evals import templates
from batchgrader.pipeline.evals.data import Row
from batchgrader.pipeline.evals.graders import Verdict
from batchgrader.pipeline.evals.spec import Criterion

TIME_LIMIT_SECONDS = 120.0
MEMORY_LIMIT_BYTES = 2 * 1024**3
DISK_LIMIT_BYTES = 1024**3
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000

_RUNNER = r"""
import json, os, sys
real_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
source = json.loads(sys.stdin.readline())["source"]
ns = {"__name__": "grader"}
try:
    exec(compile(source, "<grader>", "exec"), ns)
    grade = ns["grade"]
except BaseException as e:
    real_out.write(json.dumps({"fatal": f"{type(e).__name__}: {e}"}) + "\n")
    real_out.flush()
    raise SystemExit(0)
real_out.write(json.dumps({"ready": True}) + "\n")
real_out.flush()
for line in sys.stdin:
    rec = json.loads(line)
    try:
        out = {"score": float(grade(rec["sample"], rec["item"]))}
    except BaseException as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    real_out.write(json.dumps(out) + "\n")
    real_out.flush()
"""


def _isolate() -> None:
    """In the child, before exec: a network namespace of its own, then the resource limits."""
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0 and libc.unshare(_CLONE_NEWNET) != 0:
        os._exit(97)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (DISK_LIMIT_BYTES, DISK_LIMIT_BYTES))


def _start() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _RUNNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={},
        preexec_fn=_isolate,  # noqa: PLW1509 (no threads start children here)
        close_fds=True,
    )


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why python graders cannot be run here (the sandbox cannot cut the network), or None."""
    if not sys.platform.startswith("linux"):
        return "python graders run only on Linux here (the sandbox needs a network namespace)"
    probe = subprocess.run(
        [sys.executable, "-I", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"],
        preexec_fn=_isolate,  # noqa: PLW1509
        env={},
        capture_output=True,
        timeout=30,
    )
    if probe.returncode == 97:
        return "this kernel refuses an unprivileged network namespace (unshare), so a python grader could reach the network"
    if probe.returncode == 0:
        return "the sandbox still reached the network, so python graders are refused"
    return None


def _read_line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any] | None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _w, _x = select.select([proc.stdout], [], [], left)
        if ready:
            line = proc.stdout.readline()
            return json.loads(line) if line else {"error": f"the grader's process ended (exit {proc.wait()})"}


def grade_rows(c: Criterion, rows: Sequence[Row], time_limit: float = TIME_LIMIT_SECONDS) -> list[Verdict]:
    """The criterion's verdict on each row (scores at ``>= pass_threshold``, 1 without one)."""
    why = unavailable()
    if why:
        return [Verdict(None, False, "python_grader_refused", {"message": why}) for _ in rows]
    threshold = c.threshold if c.threshold is not None else 1.0
    out: list[Verdict] = []
    proc: subprocess.Popen[str] | None = None
    try:
        for r in rows:
            if proc is None:
                proc = _start()
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"source": c.raw["source"]}) + "\n")
                proc.stdin.flush()
                first = _read_line(proc, time_limit)
                if first is None or "fatal" in first:
                    msg = (first or {}).get("fatal") or "the grader's code did not load within the time limit"
                    return out + [Verdict(None, False, "python_grader_runtime_error", {"message": msg}) for _ in rows[len(out) :]]
            assert proc.stdin is not None
            sample = templates.sample_namespace(r.sample) or {}
            try:
                proc.stdin.write(json.dumps({"sample": sample, "item": r.item}) + "\n")
                proc.stdin.flush()
                got = _read_line(proc, time_limit)
            except BrokenPipeError:
                got = {"error": f"the grader's process ended (exit {proc.wait()})"}
            if got is None:
                proc.kill()
                proc.wait()
                proc = None
                out.append(Verdict(None, False, "python_grader_timeout", {"message": f"grade() ran over {time_limit:g} s"}))
            elif "score" in got:
                out.append(Verdict(got["score"], got["score"] >= threshold))
            else:
                out.append(Verdict(None, False, "python_grader_runtime_error", {"message": got.get("error", "?")}))
                if proc.poll() is not None:
                    proc = None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    return out
