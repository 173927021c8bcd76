"""Work a real provider does on its own servers, done here off the request path.

* :class:`TokenCache`: exact prompt-token counts of requests, cached by content (a 16-byte
  BLAKE2b digest of the ``repr`` of the model and the request's countable messages), so that a
  re-planned or retried batch costs only its parsing.  Bounded: when it holds more than its cap,
  it keeps only the newest half of the cap.
* :class:`Worker`: one background thread that runs jobs in the order they were submitted,
  outside the store's lock, so that no client request waits for them (one worker parses and
  counts batches' input files, another drafts running batches' answers).  The thread ends when
  it has nothing left to do.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from batchgrader.core.host.heap import trim_heap
from batchgrader.emulator.answers import _counter_for

#: Entries kept in the token cache before its oldest half is dropped.
TOKEN_CACHE_CAP = 100_000  # about 120 bytes each: 12 MB; a re-planned 50,000-request chunk is found whole


def _digest(model: str, messages: Sequence[dict[str, str]]) -> bytes:
    # repr of strings, lists and dicts is unambiguous (quotes escaped), and cheaper than JSON
    text = repr((model, messages))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class TokenCache:
    """Prompt tokens of chat requests (lists of string-only messages) for a model, exactly as
    :meth:`ChatTokenCounter.count_many` counts them, remembered by content.  Thread-safe; the
    counting itself runs outside the cache's lock."""

    def __init__(self, cap: int = TOKEN_CACHE_CAP) -> None:
        self.cap = max(2, cap)
        self._counts: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self.counted_requests = 0  # requests the tokenizer counted (misses), for stats()

    def count_many(self, model: str, requests: Sequence[Sequence[dict[str, str]]]) -> list[int]:
        keys = [_digest(model, msgs) for msgs in requests]
        with self._lock:
            found = [self._counts.get(k) for k in keys]
        todo: dict[bytes, int] = {}  # digest -> index of its first request (counted once)
        for i, (k, n) in enumerate(zip(keys, found)):
            if n is None and k not in todo:
                todo[k] = i
        if todo:
            counts = _counter_for(model).count_many([requests[i] for i in todo.values()])
            fresh = dict(zip(todo, counts))
            with self._lock:
                self.counted_requests += len(fresh)
                self._counts.update(fresh)
                if len(self._counts) > self.cap:
                    items = list(self._counts.items())  # insertion order: oldest first
                    self._counts = dict(items[len(items) - self.cap // 2 :])
            found = [fresh[k] if n is None else n for k, n in zip(keys, found)]
        return [int(n) for n in found]  # type: ignore[arg-type]

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)


class Pending:
    """The outcome of a job: ``result`` (or ``error``) and ``t_done``, the clock's time when it
    finished, once ``done()``."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.t_done: float | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    def finish(self, result: Any, error: BaseException | None, t_done: float) -> None:
        self.result, self.error, self.t_done = result, error, t_done
        self._event.set()


class Worker:
    """Runs submitted jobs one at a time, in order, in a background (daemon) thread."""

    def __init__(self, clock: Callable[[], float], name: str = "emulator-worker") -> None:
        self._clock = clock
        self._name = name
        self._jobs: deque[tuple[Callable[[], Any], Pending]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running = 0  # jobs taken and not finished

    def submit(self, job: Callable[[], Any]) -> Pending:
        pending = Pending()
        with self._lock:
            self._jobs.append((job, pending))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return pending

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    break
                job, pending = self._jobs.popleft()
                self._running += 1
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except Exception as exc:  # handed to whoever applies the result
                error = exc
            with self._lock:
                self._running -= 1
            pending.finish(result, error, self._clock())
        trim_heap()  # nothing queued: what the jobs (a batch's validation, its answers) freed goes back

    def jobs(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return len(self._jobs) + self._running

    def drop_queued(self) -> None:
        """Forget the jobs not yet started; whoever needs their result does the work itself."""
        with self._lock:
            dropped = list(self._jobs)
            self._jobs.clear()
        for _, pending in dropped:
            pending.finish(None, RuntimeError("dropped: the emulator stopped"), self._clock())
