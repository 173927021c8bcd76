"""An in-memory provider: the :class:`~batchgrader.provider.openai_api.Provider` protocol without
HTTP, threads or sleeps, for driving the engine tick by tick.

Batches move only when told: :meth:`MemoryProvider.finish` ends one (completed, failed with
errors such as ``token_limit_exceeded``, expired or cancelled with partial results), and
:meth:`MemoryProvider.finish_all` ends every open batch.  The clock is a number the caller
sets (``provider.now``).  Faults are scripted per operation and consumed one per call:

* ``lost``: the call took effect but the reply was lost (:class:`OutcomeUnknown`);
* ``dropped``: the call did not take effect and the caller cannot know (:class:`OutcomeUnknown`);
* ``refused``: a definite 4xx (:class:`ProviderRejected`, with a status, message and code);
* ``unavailable``: the provider cannot be reached (:class:`ProviderUnavailable`);
* ``broken``: the client raises an error that is no provider error (a ``RuntimeError``: an SDK
  bug, or a fault nothing foresaw).

Rows answer with :attr:`MemoryProvider.answer` (a function of the custom id and the request
body), ending with :attr:`MemoryProvider.finish_reason` (the same arguments; ``stop`` unless
told, e.g. ``length`` under a small bound) unless listed in :attr:`MemoryProvider.row_errors`,
in a batch and through :meth:`MemoryProvider.complete` (the synchronous API) alike: a chat
completion, or a ``response`` for a line whose ``url`` is the Responses API's.  Results are SIMULATED.  Every call
is recorded in :attr:`MemoryProvider.calls`.

:meth:`MemoryProvider.complete` may be called from several threads at once (the preflight sends
its rows together): its bookkeeping is under a lock, :attr:`MemoryProvider.most_in_flight` is the
most calls ever in flight at once, and a :attr:`MemoryProvider.complete_gate` (a
:class:`threading.Barrier` the caller sets) holds each call until that many are in flight
together, or :data:`GATE_TIMEOUT` seconds pass (the barrier is then broken): a test sees the
calls overlap without a sleep.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.catalogue import EMBEDDINGS_URL, RESPONSES_URL
from batchgrader.provider.openai_api import (
    DEFAULT_ENDPOINT,
    BatchErrorInfo,
    BatchInfo,
    BatchPage,
    FileInfo,
    FrozenMap,
    OutcomeUnknown,
    ProviderRejected,
    ProviderUnavailable,
    RequestCounts,
    batch_matches,
)

OPERATIONS = (
    "upload",
    "find_files",
    "create_batch",
    "find_batches",
    "list_batches",
    "retrieve",
    "cancel",
    "download",
    "delete_file",
    "complete",
)
FAULT_KINDS = ("lost", "dropped", "refused", "unavailable", "broken")
GATE_TIMEOUT = 10.0  # seconds a synchronous call waits at the complete_gate for the others


# The HTTP status of a row error, as the real API answers it (a code not listed: 400, a bad request).
ROW_ERROR_STATUS = {"server_error": 500, "rate_limit_exceeded": 429, "timeout": 504, "service_unavailable": 503}


@dataclass(frozen=True)
class Fault:
    kind: str  # lost | dropped | refused | unavailable | broken
    status_code: int = 400
    message: str = "refused by the in-memory provider"
    code: str | None = None
    match: str | None = None  # only a call whose argument (file name, id) contains this
    retry_after: float | None = None  # refused: the seconds the provider asks to wait (Retry-After)

    def error(self, op: str) -> Exception:
        """The error the call ``op`` (the SDK method's name) raises under this fault."""
        if self.kind == "broken":
            return RuntimeError(f"scripted: {op} raised an error that is no provider error")
        if self.kind == "refused":
            return ProviderRejected(op, self.status_code, self.message, code=self.code, retry_after=self.retry_after)
        if self.kind == "unavailable":
            return ProviderUnavailable(op, 1, "scripted: provider unavailable")
        return OutcomeUnknown(op, f"scripted: reply {'lost' if self.kind == 'lost' else 'never came'}")


@dataclass
class FaultScript:
    """The faults scripted per operation, each consumed by one call."""

    queues: dict[str, deque[Fault]] = field(default_factory=dict)

    def add(self, operation: str, kind: str, **details: Any) -> None:
        """The next call of ``operation`` fails with ``kind`` (see :meth:`MemoryProvider.fail_next`)."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {', '.join(OPERATIONS)}")
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(FAULT_KINDS)}")
        self.queues.setdefault(operation, deque()).append(Fault(kind, **details))

    def take(self, operation: str, arg: str) -> Fault | None:
        """The first fault scripted for a call of ``operation`` with argument ``arg`` (removed), or None."""
        queue = self.queues.get(operation)
        for fault in queue or ():
            if fault.match is None or fault.match in arg:
                assert queue is not None
                queue.remove(fault)
                return fault
        return None


def default_answer(custom_id: str, body: Mapping[str, Any]) -> str:
    return f"SIMULATED answer for {custom_id}"


def default_finish(custom_id: str, body: Mapping[str, Any]) -> str:
    return "stop"


@dataclass
class _File:
    info: FileInfo
    data: bytes


@dataclass
class MemoryProvider:
    now: float = 0.0
    answer: Callable[[str, Mapping[str, Any]], str] = default_answer
    finish_reason: Callable[[str, Mapping[str, Any]], str] = default_finish
    row_errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # custom_id -> (code, message)
    prompt_tokens: int = 10
    completion_tokens: int = 5
    files: dict[str, _File] = field(default_factory=dict)
    batches: dict[str, BatchInfo] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    complete_times: list[tuple[str, float]] = field(default_factory=list)  # (custom_id, now) of each synchronous request
    # every answer the provider billed, batch lines and synchronous calls alike: (job id, custom_id, body)
    billed: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    # timed batches: seconds from create to completed for a new batch (None: batches move only
    # when told; 0: completed in the create reply); :meth:`advance` then moves them as the clock passes
    lifetime: Callable[[BatchInfo], float] | None = None
    ends: dict[str, float] = field(default_factory=dict)  # batch id -> when it completes (timed batches)
    # synchronous calls: a barrier each waits on before it is answered (None: none), and the most in flight at once
    complete_gate: threading.Barrier | None = None
    most_in_flight: int = 0
    _faults: FaultScript = field(default_factory=FaultScript)
    _ids: int = 0
    _in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # --- scripting ------------------------------------------------------------------------------
    def fail_next(self, operation: str, kind: str, **details: Any) -> None:
        """The next call of ``operation`` fails with ``kind`` (queued: one fault per call).
        ``match=...``: the next call whose argument (file name, id) contains that text."""
        self._faults.add(operation, kind, **details)

    def open_batches(self) -> list[BatchInfo]:
        return [b for b in self.batches.values() if not b.is_terminal]

    def finish(
        self,
        batch_id: str,
        status: str = "completed",
        *,
        answered: int | None = None,
        errors: list[tuple[str, str]] | None = None,
    ) -> BatchInfo:
        """End a batch. ``answered`` rows (all by default; for expired and cancelled batches,
        none) get results, in input order; ``errors`` are the batch's own errors (``failed``)."""
        b = self.batches[batch_id]
        if status not in ("completed", "failed", "expired", "cancelled"):
            raise ValueError(f"not a terminal status: {status}")
        requests = self.requests_in(b.input_file_id)
        if status == "failed":
            answered = 0
        elif answered is None:
            answered = len(requests) if status == "completed" else 0
        out: list[bytes] = []
        err: list[bytes] = []
        for req in requests[:answered]:
            cid = req["custom_id"]
            if cid in self.row_errors:
                code, message = self.row_errors[cid]
                err.append(_line(_error_line(self, cid, code, message)))
            else:
                out.append(_line(_output_line(self, cid, req.get("body") or {}, req.get("url"))))
                self.billed.append((b.metadata.get("bg_job", ""), cid, req.get("body") or {}))
        stamp = int(self.now)
        b = dataclasses.replace(
            b,
            status=status,
            output_file_id=self._store_file(f"{batch_id}_output.jsonl", b"".join(out), "batch_output") if out else None,
            error_file_id=self._store_file(f"{batch_id}_error.jsonl", b"".join(err), "batch_output") if err else None,
            request_counts=RequestCounts(len(requests), len(out), len(err)),
            errors=tuple(BatchErrorInfo(code, message) for code, message in errors or ()),
        )
        b = dataclasses.replace(b, **{f"{status}_at": stamp})  # type: ignore[arg-type]
        self.batches[batch_id] = b
        return b

    def start(self, batch_id: str) -> BatchInfo:
        """validating -> in_progress."""
        b = dataclasses.replace(self.batches[batch_id], status="in_progress", in_progress_at=int(self.now))
        self.batches[batch_id] = b
        return b

    def advance(self, now: float) -> list[BatchInfo]:
        """Set the clock; timed batches past their first 5 % are in progress, and those whose
        end has come are completed (in the order they end).  Returns the batches completed."""
        self.now = now
        done = []
        for bid, end in sorted(self.ends.items(), key=lambda kv: kv[1]):
            b = self.batches[bid]
            if b.is_terminal:
                self.ends.pop(bid)
            elif end <= now:
                self.ends.pop(bid)
                self.now = end  # stamped with the time it ended
                done.append(self.finish(bid, "cancelled" if b.status == "cancelling" else "completed"))
                self.now = now
            elif b.status == "validating" and now >= b.created_at + 0.05 * (end - b.created_at):
                self.start(bid)
        return done

    def next_end(self) -> float | None:
        """When the next timed batch completes (None: none is running)."""
        return min(self.ends.values(), default=None)

    def requests_in(self, file_id: str) -> list[dict[str, Any]]:
        """The request lines of an uploaded file (none: no such file)."""
        f = self.files.get(file_id)
        return [json.loads(line) for line in f.data.splitlines() if line.strip()] if f else []

    def finish_all(self, status: str = "completed", **kw: Any) -> list[BatchInfo]:
        return [self.finish(b.id, "cancelled" if b.status == "cancelling" else status, **kw) for b in self.open_batches()]

    # --- the Provider protocol --------------------------------------------------------------------
    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        fault = self._fault("upload", filename)
        data = Path(path).read_bytes()
        if fault is not None and fault.kind != "lost":
            raise fault.error("files.create")
        fid = self._store_file(filename, data, "batch")
        if fault is not None:
            raise fault.error("files.create")
        return self.files[fid].info

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        self._raise_if_faulted("find_files", filename, "files.list")
        return [
            f.info
            for f in self.files.values()
            if f.info.filename == filename
            and f.info.purpose == "batch"
            and (size is None or f.info.bytes == size)
            and (created_after is None or f.info.created_at >= created_after)
        ]

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        fault = self._fault("create_batch", input_file_id)
        if fault is not None and fault.kind != "lost":
            raise fault.error("batches.create")
        if input_file_id not in self.files:
            raise ProviderRejected("batches.create", 400, f"no such file: {input_file_id}", code="invalid_request_error")
        bid = self._new_id("batch")
        requests = self.requests_in(input_file_id)
        if endpoint is None:  # the url of the file's lines, as an OpenAI batch names it
            endpoint = str(requests[0].get("url") or DEFAULT_ENDPOINT) if requests else DEFAULT_ENDPOINT
        total = len(requests)
        self.batches[bid] = BatchInfo(
            id=bid,
            status="validating",
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            created_at=int(self.now),
            request_counts=RequestCounts(total, 0, 0),
            metadata=FrozenMap(metadata or {}),
        )
        if self.lifetime is not None:
            life = self.lifetime(self.batches[bid])
            if life <= 0:  # ended before the reply (a fast server, a small batch on a quiet day)
                self.finish(bid)
            else:
                self.ends[bid] = self.now + life
        if fault is not None:
            raise fault.error("batches.create")
        return self.batches[bid]

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]:
        self._raise_if_faulted("find_batches", input_file_id or "", "batches.list")
        return [
            b
            for b in self.batches.values()
            if batch_matches(b, input_file_id, metadata) and (created_after is None or b.created_at >= created_after)
        ]

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        """One page of batches, newest first, as the API pages them."""
        self._raise_if_faulted("list_batches", after or "", "batches.list")
        newest = list(reversed(self.batches.values()))
        start = next((i + 1 for i, b in enumerate(newest) if b.id == after), 0) if after else 0
        items = tuple(newest[start : start + limit])
        return BatchPage(items, start + limit < len(newest), items[-1].id if items else None)

    def retrieve(self, batch_id: str) -> BatchInfo:
        self._raise_if_faulted("retrieve", batch_id, "batches.retrieve")
        return _batch(self, batch_id, "batches.retrieve")

    def cancel(self, batch_id: str) -> BatchInfo:
        self._raise_if_faulted("cancel", batch_id, "batches.cancel")
        b = _batch(self, batch_id, "batches.cancel")
        if b.is_terminal:
            raise ProviderRejected("batches.cancel", 409, f"batch {batch_id} is already {b.status}", code="conflict")
        b = dataclasses.replace(b, status="cancelling", cancelling_at=int(self.now))
        self.batches[batch_id] = b
        return b

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        self._raise_if_faulted("download", file_id, "files.content")
        f = self.files.get(file_id)
        if f is None:
            raise ProviderRejected("files.content", 404, f"no such file: {file_id}", code="not_found")
        dest = Path(dest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dest, f.data)
        return len(f.data)

    def delete_file(self, file_id: str) -> bool:
        self._raise_if_faulted("delete_file", file_id, "files.delete")
        if self.files.pop(file_id, None) is None:
            raise ProviderRejected("files.delete", 404, f"no such file: {file_id}", code="not_found")
        return True

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One request line through the synchronous API: the batch output line a batch would give
        it; a row listed in ``row_errors`` is a definite 400.  Safe to call from several threads
        at once (see the module docstring: :attr:`complete_gate`, :attr:`most_in_flight`)."""
        with self._lock:
            self._in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)
        try:
            if self.complete_gate is not None:
                try:
                    self.complete_gate.wait(GATE_TIMEOUT)
                except threading.BrokenBarrierError:
                    pass  # not that many in flight together: the broken gate says so
            with self._lock:
                return self._complete(line, job_id)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _complete(self, line: Mapping[str, Any], job_id: str | None) -> dict[str, Any]:
        cid = str(line.get("custom_id") or "")
        self.complete_times.append((cid, self.now))
        op = "responses.create" if line.get("url") == RESPONSES_URL else "chat.completions.create"
        fault = self._fault("complete", cid)
        if fault is not None and fault.kind != "lost":
            raise fault.error(op)
        if cid in self.row_errors:
            code, message = self.row_errors[cid]
            raise ProviderRejected(op, 400, message, code=code)
        out = _output_line(self, cid, line.get("body") or {}, line.get("url"))
        self.billed.append((job_id or "", cid, dict(line.get("body") or {})))
        if fault is not None:
            raise fault.error(op)
        return out

    # --- internals --------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}_mem{self._ids:06d}"

    def _store_file(self, filename: str, data: bytes, purpose: str) -> str:
        fid = self._new_id("file")
        self.files[fid] = _File(FileInfo(fid, filename, len(data), purpose, int(self.now), "processed"), data)
        return fid

    def _fault(self, operation: str, arg: str) -> Fault | None:
        self.calls.append((operation, arg))
        return self._faults.take(operation, arg)

    def _raise_if_faulted(self, operation: str, arg: str, op_name: str) -> None:
        fault = self._fault(operation, arg)
        if fault is not None:
            raise fault.error(op_name)


# --- what a row answers, and lookups (apart from the calls and the told clock) --------------------------


def _batch(p: MemoryProvider, batch_id: str, op: str) -> BatchInfo:
    b = p.batches.get(batch_id)
    if b is None:
        raise ProviderRejected(op, 404, f"no such batch: {batch_id}", code="not_found")
    return b


def _batch_line(p: MemoryProvider, cid: str, body: dict[str, Any], status_code: int = 200) -> dict[str, Any]:
    """A batch output line: the row's ``custom_id`` and the response the provider gave it."""
    return {
        "id": p._new_id("batch_req"),
        "custom_id": cid,
        "response": {"status_code": status_code, "request_id": p._new_id("req"), "body": body},
        "error": None,
    }


def _output_line(p: MemoryProvider, cid: str, body: Mapping[str, Any], url: Any = None) -> dict[str, Any]:
    """A row's answer as a batch output line: :attr:`MemoryProvider.answer`, its finish reason and usage
    (a ``response`` for a Responses API line)."""
    if url == RESPONSES_URL:
        return _response_line(p, cid, body)
    if url == EMBEDDINGS_URL:
        return _embedding_line(p, cid, body)
    return _batch_line(
        p,
        cid,
        {
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": p.answer(cid, body)},
                    "finish_reason": p.finish_reason(cid, body),
                }
            ],
            "usage": {
                "prompt_tokens": p.prompt_tokens,
                "completion_tokens": p.completion_tokens,
                "total_tokens": p.prompt_tokens + p.completion_tokens,
            },
        },
    )


def _embedding_line(p: MemoryProvider, cid: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The output line of an embeddings request: :attr:`MemoryProvider.answer` as the vector when it
    is a JSON list of numbers, else the input's words hashed into 64 dimensions."""
    import hashlib
    import re

    try:
        vector = json.loads(p.answer(cid, body))
    except ValueError:
        vector = None
    if not isinstance(vector, list):
        vector = [0.0] * 64
        for w in re.findall(r"\w+", str(body.get("input", "")).lower()):
            vector[hashlib.sha256(w.encode()).digest()[0] % 64] += 1.0
    return _batch_line(
        p,
        cid,
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": body.get("model"),
            "usage": {"prompt_tokens": p.prompt_tokens, "total_tokens": p.prompt_tokens},
        },
    )


def _response_line(p: MemoryProvider, cid: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """The output line of a Responses API request: a ``response`` whose message holds the
    answer; a finish reason ``length`` is ``status: incomplete`` for ``max_output_tokens``
    (another finish reason is the incomplete reason itself)."""
    finish = p.finish_reason(cid, body)
    done = finish == "stop"
    reason = "max_output_tokens" if finish == "length" else finish
    text = {"type": "output_text", "text": p.answer(cid, body), "annotations": []}
    return _batch_line(
        p,
        cid,
        {
            "object": "response",
            "model": body.get("model"),
            "status": "completed" if done else "incomplete",
            "incomplete_details": None if done else {"reason": reason},
            "output": [{"type": "message", "role": "assistant", "status": "completed", "content": [text]}],
            "usage": {
                "input_tokens": p.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": p.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": p.prompt_tokens + p.completion_tokens,
            },
        },
    )


def _error_line(p: MemoryProvider, cid: str, code: str, message: str) -> dict[str, Any]:
    """A row listed in :attr:`MemoryProvider.row_errors`, as a batch error line."""
    return _batch_line(p, cid, {"error": {"code": code, "message": message}}, ROW_ERROR_STATUS.get(code, 400))


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()
