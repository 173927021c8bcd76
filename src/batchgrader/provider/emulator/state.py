"""The emulator's records: files, batches, planned requests, and the shared store state."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchgrader.provider.emulator.answers import _Draft
    from batchgrader.provider.emulator.background import Pending, TokenCache, Worker
    from batchgrader.provider.emulator.config import EmulatorConfig
    from batchgrader.provider.emulator.faults import FaultRates


@dataclass
class _File:
    obj: dict[str, Any]
    seq: int
    data: bytes
    deleted: bool = False


@dataclass
class _Req:
    index: int
    custom_id: str
    body: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    fail_status: int | None = None
    fail_body: dict[str, Any] | None = None
    # Generated while the batch runs (at the time the request is processed), like a real provider:
    # the output line and its (input, cached, output, reasoning) tokens; None until then.
    line: str | None = None
    tokens: tuple[int, int, int, int] | None = None


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
    input_data: bytes | None = None
    plan: list[_Req] | None = None
    answered: int = 0  # requests of ``plan`` whose answer is generated (not persisted: regenerated)
    # The background parse-and-count of the input file while validating (not persisted: restarted)
    checking: Pending | None = None
    # Answers drafted in the background while the batch runs (real clock; not persisted): per
    # request, its output line without ``created`` (see AnswersMixin._draft), None until drafted
    drafts: list[_Draft | None] | None = None

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


class _StoreBase:
    """The state every part of the store shares; the parts are mixins combined in store.py."""

    cfg: EmulatorConfig
    clock: Callable[[], float]
    lock: threading.RLock
    files: dict[str, _File]
    batches: dict[str, _Batch]
    seq: int
    requests: Counter[str]
    faults_injected: Counter[str]
    files_created: int
    batches_created: int
    custom_id_seen: Counter[str]
    scripted: list[dict[str, Any]]
    rates: FaultRates
    fault_rng: random.Random
    data_dir: Path | None
    token_cache: TokenCache
    worker: Worker
    # The clock is the real one: a batch stays validating until its background parse-and-count
    # is done, and its answers are drafted in the background while it runs; on another (a test's
    # manual) clock a due validation waits for that work and answers are made in place, so that
    # the outcome does not depend on the machine's speed.
    real_clock: bool
    answerer: Worker

    if TYPE_CHECKING:  # implemented by the mixins

        def _next_seq(self) -> int: ...
        def _save_file(self, f: _File, with_data: bool = False) -> None: ...
        def _save_batch(self, b: _Batch) -> None: ...
        def _add_file(self, filename: str, data: bytes, purpose: str, created: int, expires_at: int | None) -> _File: ...
        def _advance_all(self) -> None: ...
        def _view(self, b: _Batch) -> dict[str, Any]: ...
        def _cursor(self, query: dict[str, str]) -> str | None: ...
        def _processed(self, b: _Batch, t: float) -> int: ...
        def _validate(self, b: _Batch) -> list[dict[str, Any]]: ...
        def _start_validation(self, b: _Batch) -> None: ...
        def _start_answers(self, b: _Batch) -> None: ...
        def _validation_ready(self, b: _Batch) -> tuple[bool, float]: ...
        def _ensure_plan(self, b: _Batch) -> list[_Req]: ...
        def _write_results(self, b: _Batch, processed: int, t: float, *, expired: bool) -> None: ...
        def _answer_upto(self, b: _Batch, processed: int, t: float, drafted_only: bool = False) -> None: ...
        @staticmethod
        def _int_param(query: dict[str, str], name: str, default: int, lo: int, hi: int) -> int: ...
        @staticmethod
        def _page(objs: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]: ...
