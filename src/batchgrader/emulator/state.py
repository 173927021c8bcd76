"""The emulator's records (OpenAI files, batches, planned requests) and :class:`State`, what every
part of the emulator shares."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchgrader.emulator.background import TokenCache, Worker

if TYPE_CHECKING:
    from batchgrader.emulator.background import Pending
    from batchgrader.emulator.config import EmulatorConfig
    from batchgrader.emulator.results import _Drafts


@dataclass
class _File:
    obj: dict[str, Any]
    seq: int
    path: Path | None  # where its bytes are kept (None: deleted, or lost)
    deleted: bool = False

    def content(self) -> bytes:
        if self.path is None:
            return b""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""


@dataclass
class _Req:
    index: int
    custom_id: str
    body: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    fail_status: int | None = None
    fail_body: dict[str, Any] | None = None


#: How a planned request fails (``_Plan.fail``): it does not, by its content (the reply is
#: decided again from its body when it is answered), or by the seeded ``request_failure_rate``.
FAIL_NONE, FAIL_CONTENT, FAIL_SEEDED = 0, 1, 2


@dataclass
class _Plan:
    """What a validated batch keeps per request: its prompt and cached tokens and how it fails
    (a few bytes a request); the request itself is read again from the batch's input file,
    line ``i`` being request ``i``, when it is answered."""

    model: str
    endpoint: str
    prompt: array[int]
    cached: array[int]
    fail: bytearray

    @property
    def n(self) -> int:
        return len(self.prompt)

    def bad_upto(self, done: int) -> int:
        """Failed requests among the first ``done``."""
        return done - self.fail[:done].count(FAIL_NONE)


class _Lines:
    """A file's lines read forward: ``get(i)`` is line ``i`` (0-based), never one before the last
    read."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 (closed by close(), or with the object)
        self._next = 0

    def get(self, i: int) -> bytes:
        while self._next < i:
            self._fh.readline()
            self._next += 1
        self._next += 1
        return self._fh.readline()

    def close(self) -> None:
        self._fh.close()


class _Out:
    """The answered lines of a running batch, spooled to disk as they are made: the output and
    error lines apart, each line's offset, and the usage summed."""

    def __init__(self, folder: Path, bid: str) -> None:
        self.paths = (folder / f"{bid}.ok", folder / f"{bid}.err")
        self._fhs = [open(p, "wb") for p in self.paths]  # noqa: SIM115 (closed by close())
        self._pos = [0, 0]
        self.offsets: tuple[array[int], array[int]] = (array("q"), array("q"))
        self.usage = [0, 0, 0, 0]  # input, cached, output, reasoning tokens of the answered lines

    def add(self, line: str, tokens: tuple[int, int, int, int] | None) -> None:
        k = 1 if tokens is None else 0
        data = line.encode() + b"\n"
        self.offsets[k].append(self._pos[k])
        self._fhs[k].write(data)
        self._pos[k] += len(data)
        if tokens is not None:
            for j, v in enumerate(tokens):
                self.usage[j] += v

    def close(self) -> None:
        for fh in self._fhs:
            fh.close()

    def discard(self) -> None:
        self.close()
        for p in self.paths:
            p.unlink(missing_ok=True)


@dataclass
class _Batch:
    obj: dict[str, Any]
    seq: int
    t_created: float
    t_deadline: float
    t_in_progress: float | None = None
    t_finalizing: float | None = None
    t_cancelling: float | None = None
    forced_expire_after: int | None = None
    stop_count: int | None = None  # requests processed when cancelled/expired
    enqueued_tokens: int = 0
    azure: bool = False  # created through Azure OpenAI's routes (its endpoint and url rules)
    input_path: Path | None = None  # its own link to its input file's bytes, once validated
    plan: _Plan | None = None
    answered: int = 0  # requests of ``plan`` whose answer is generated (not persisted: regenerated)
    # The background parse-and-count of the input file while validating (not persisted: restarted)
    checking: Pending | None = None
    # Answers drafted in the background while the batch runs (real clock; not persisted): each
    # request's output line without ``created`` (see results.Answers.draft), spooled to disk
    drafts: _Drafts | None = None
    inputs: _Lines | None = None  # its input file read forward, as requests are answered in place
    out: _Out | None = None  # the answers generated so far, spooled to disk
    # When it moved, on the emulator's clock (not persisted; ``stats()`` shows them): each
    # transition's time (``validate``: from when its validation could apply, after its
    # parse-and-count) and ``<transition>_work``: the seconds its own work took in the request
    # that applied it (a finished batch's answers made and written: a real provider's servers
    # do that before they show it ended)
    times: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.obj["status"]

    @property
    def n(self) -> int:
        return int(self.obj["request_counts"]["total"])

    def internal(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "t_created": self.t_created,
            "t_deadline": self.t_deadline,
            "t_in_progress": self.t_in_progress,
            "t_finalizing": self.t_finalizing,
            "t_cancelling": self.t_cancelling,
            "forced_expire_after": self.forced_expire_after,
            "stop_count": self.stop_count,
            "enqueued_tokens": self.enqueued_tokens,
            "azure": self.azure,
        }


def _empty_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


class State:
    """What every part of the emulator shares, passed explicitly to each (see ``store.Store``):
    the configuration and clock, the lock every API call takes, the OpenAI files and batches,
    the counters ``stats`` reports, the folders on disk and the background workers."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.cfg = config
        self.clock: Callable[[], float] = config.clock
        self.lock = threading.RLock()
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self.seq = 0
        self.requests: Counter[str] = Counter()
        self.files_created = 0
        self.batches_created = 0
        self.custom_id_seen: Counter[str] = Counter()
        self.data_dir = Path(config.data_dir) if config.data_dir else None
        # a folder of this process (removed with the store): spooled answers, and files without data_dir
        self.scratch = Path(tempfile.mkdtemp(prefix="bg-emulator-"))
        weakref.finalize(self, shutil.rmtree, self.scratch, True)  # removed with the state (or at exit)
        self.token_cache = TokenCache()
        self.worker = Worker(self.clock, "emulator-validation")
        self.answerer = Worker(self.clock, "emulator-answers")
        # The clock is the real one: a batch stays validating until its background parse-and-count
        # is done, and its answers are drafted in the background while it runs; on another (a test's
        # manual) clock a due validation waits for that work and answers are made in place, so that
        # the outcome does not depend on the machine's speed.
        self.real_clock = self.clock is time.time

    def next_seq(self) -> int:
        """The next creation number (files and batches of every API share one sequence)."""
        self.seq += 1
        return self.seq

    def blob_dir(self, kind: str) -> Path:
        """Where files' bytes (``files``) and batches' inputs (``batches``) are kept: in
        ``data_dir`` (kept across restarts), else in this process's scratch folder."""
        d = (self.data_dir or self.scratch) / kind
        d.mkdir(parents=True, exist_ok=True)
        return d
