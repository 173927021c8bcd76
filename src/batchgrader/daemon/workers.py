"""Merging a large chunk in a separate process, so the daemon goes on polling, downloading and
submitting meanwhile (and two ended chunks are merged on two cores).

The engine starts a merge with :meth:`MergeWorkers.start` and asks :meth:`MergeWorkers.poll`
on later ticks; the worker (``python -m batchgrader.daemon.workers``) runs
:func:`batchgrader.pipeline.merge.merge_chunk` on the inputs it is given and writes the outcome
for the daemon to read, and a thread that waits for it wakes the daemon.  Nothing about a merge
is recorded until the daemon has its outcome, so a merge that is lost (the daemon or the worker
killed, the outcome unreadable) is simply done again; the results file is written atomically,
so a worker left running by a killed daemon and the one the next daemon starts leave one whole
file (the same, from the same inputs).  A worker whose daemon has gone writes no outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.fsio import TMP_PREFIX, atomic_write_bytes
from batchgrader.pipeline.merge import MergeInputs, MergeOutcome, merge_chunk
from batchgrader.pipeline.merge import MergeWorkerFailed as MergeWorkerFailed  # re-exported

#: A merge running longer than this is stopped and done in the daemon instead (a 50,000-row
#: chunk takes about 2 s here): a worker stuck on a stalled disk never holds its job forever.
MERGE_WORKER_TIMEOUT_SECONDS = 600.0


@dataclass
class _Run:
    args: list[str]
    spec: Path
    outcome_path: Path
    proc: subprocess.Popen[bytes] | None = None  # None while it waits for a free worker
    started: float = field(default_factory=time.monotonic)
    ended: threading.Event = field(default_factory=threading.Event)
    failed: str | None = None  # why it ended without running (its worker could not be started)


class MergeWorkers:
    """The merges running in worker processes, by key (the engine's (job, chunk)).  ``wake`` is
    called, from a waiting thread, when one ends; ``python`` is the interpreter that runs them;
    a worker still running after ``timeout`` seconds is killed (:meth:`poll` then raises).  At
    most ``max_running`` workers run at once (one per core: more would not merge sooner, and
    each holds its chunk's ids, ~35 MiB for 50,000 rows; twenty chunks of a million-row file
    that end together held 355 MiB); the others wait, in the order started, for one to end."""

    def __init__(
        self,
        wake: Callable[[], None] = lambda: None,
        python: str = sys.executable,
        timeout: float = MERGE_WORKER_TIMEOUT_SECONDS,
        max_running: int | None = None,
    ) -> None:
        self.wake = wake
        self.python = python
        self.timeout = timeout
        self.max_running = max(1, max_running or os.cpu_count() or 1)
        self._runs: dict[Hashable, _Run] = {}
        self._waiting: list[_Run] = []  # started, waiting for a free worker (oldest first)
        self._lock = threading.Lock()

    def running(self, key: Hashable) -> bool:
        return key in self._runs

    def awaited(self) -> dict[Any, float]:
        """The merges not ended yet, each with the monotonic time until which it is waited for
        (its start plus ``timeout``; infinite while it waits for a free worker): nothing is due
        for them before then, as the end of each wakes the daemon."""
        with self._lock:
            return {
                key: (run.started + self.timeout if run.proc is not None else float("inf"))
                for key, run in self._runs.items()
                if not run.ended.is_set()
            }

    def start(self, key: Hashable, inputs: MergeInputs, folder: Path) -> None:
        """Start merging in a worker; its inputs and outcome are files in ``folder`` (temporary
        names, so a daemon starting after a crash removes what a lost merge left).  Raises
        :class:`MergeWorkerFailed` when the worker cannot be started."""
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{TMP_PREFIX}merge-{uuid.uuid4().hex}"
        spec, outcome = folder / f"{name}.in.json", folder / f"{name}.out.json"
        atomic_write_bytes(spec, json.dumps(inputs.to_json()).encode())
        args = [self.python, "-m", "batchgrader.daemon.workers", str(spec), str(outcome), str(os.getpid())]
        run = _Run(args, spec, outcome)
        with self._lock:
            if self._running() >= self.max_running:
                self._waiting.append(run)
                self._runs[key] = run
                return
            try:
                self._launch(run)
            except OSError as exc:
                spec.unlink(missing_ok=True)
                raise MergeWorkerFailed(f"the merge worker could not be started: {exc}") from None
            self._runs[key] = run

    def _running(self) -> int:
        return sum(1 for r in self._runs.values() if r.proc is not None and not r.ended.is_set())

    def _launch(self, run: _Run) -> None:
        run.proc = subprocess.Popen(run.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
        run.started = time.monotonic()
        threading.Thread(target=self._wait, args=(run,), name="merge-worker", daemon=True).start()

    def _wait(self, run: _Run) -> None:
        assert run.proc is not None
        run.proc.wait()
        run.spec.unlink(missing_ok=True)  # the worker removes it once read; not if it could not start Python
        run.ended.set()
        self._next()
        self.wake()

    def _next(self) -> None:
        """Start the oldest waiting merge, if any (a worker has ended)."""
        with self._lock:
            while self._waiting and self._running() < self.max_running:
                run = self._waiting.pop(0)
                try:
                    self._launch(run)
                except OSError as exc:
                    run.spec.unlink(missing_ok=True)
                    run.failed = f"the merge worker could not be started: {exc}"
                    run.ended.set()

    def poll(self, key: Hashable) -> MergeOutcome | None:
        """The outcome of the merge started for ``key`` once its worker has ended (the run is then
        forgotten), None while it runs.  Raises :class:`MergeWorkerFailed` when it ended without one,
        or ran longer than ``timeout`` (it is killed then)."""
        run = self._runs[key]
        if not run.ended.is_set():
            if run.proc is None or time.monotonic() - run.started < self.timeout:
                return None  # running, or waiting for a free worker
            run.proc.kill()
            run.ended.wait()
            del self._runs[key]
            raise MergeWorkerFailed(f"the merge worker was stopped after {self.timeout:g} s")
        del self._runs[key]
        if run.failed is not None:
            raise MergeWorkerFailed(run.failed)
        assert run.proc is not None
        try:
            data = run.outcome_path.read_bytes()
        except OSError:
            raise MergeWorkerFailed(f"the merge worker ended (exit code {run.proc.returncode}) without an outcome") from None
        finally:
            run.outcome_path.unlink(missing_ok=True)
        return MergeOutcome.from_json(json.loads(data))

    def wait(self, key: Hashable, timeout: float | None = None) -> bool:
        """Block until the worker for ``key`` has ended (True) or ``timeout`` passed (False)."""
        return self._runs[key].ended.wait(timeout)


def main(argv: list[str]) -> int:
    """The worker: merge with the inputs in ``argv[0]`` (removed once read), write the outcome
    to ``argv[1]``, unless the daemon (pid ``argv[2]``) has gone meanwhile."""
    spec, outcome, parent = Path(argv[0]), Path(argv[1]), int(argv[2])
    inputs = MergeInputs.from_json(json.loads(spec.read_bytes()))
    spec.unlink(missing_ok=True)
    result = merge_chunk(inputs)
    if os.getppid() != parent:
        return 3  # nobody to read it: the next daemon merges again
    atomic_write_bytes(outcome, json.dumps(result.to_json()).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
