"""The batch lifecycle and its clock: create, retrieve, list, cancel, expire, and the lazy
time-ordered transitions validating -> in_progress -> finalizing -> completed (or failed,
expired, cancelling -> cancelled)."""

from __future__ import annotations

import json
import math
import threading
import uuid
from typing import Any

from batchgrader.emulator.common import ApiError, _now_int, int_param, page
from batchgrader.emulator.config import (
    AZURE_CHAT_ENDPOINT,
    EXPIRE_AFTER_METADATA_KEY,
    TERMINAL_STATUSES,
    VALID_ENDPOINTS,
)
from batchgrader.emulator.files import cursor
from batchgrader.emulator.openapi import batch_request_error
from batchgrader.emulator.persistence import Persistence
from batchgrader.emulator.results import Results
from batchgrader.emulator.state import State, _Batch, _empty_usage
from batchgrader.emulator.validation import Validation


class ManualClock:
    """A clock that only moves when told to. Pass it as ``EmulatorConfig(clock=...)``."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._t = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._t += seconds
            return self._t

    def set(self, t: float) -> None:
        with self._lock:
            if t < self._t:
                raise ValueError("a clock does not go backwards")
            self._t = float(t)


class Batches:
    """The OpenAI (and Azure) Batches API over the shared state: create, retrieve, list,
    cancel, expire; and every batch's transitions on the clock (``advance_all``)."""

    def __init__(self, state: State, persist: Persistence, validation: Validation, results: Results) -> None:
        self.state = state
        self.persist = persist
        self.validation = validation
        self.results = results

    def create_batch(self, body: Any, azure: bool = False) -> dict[str, Any]:
        """Create a batch; ``azure``: through Azure OpenAI's routes, which also take the
        ``/chat/completions`` endpoint of its api-version surface."""
        if not isinstance(body, dict):
            raise ApiError(400, "We could not parse the JSON body of your request.", code=None)
        for key in ("input_file_id", "endpoint", "completion_window"):
            if body.get(key) in (None, ""):
                raise ApiError(400, f"Missing required parameter: '{key}'.", param=key, code="missing_required_parameter")
        endpoint = body["endpoint"]
        if endpoint not in VALID_ENDPOINTS and not (azure and endpoint == AZURE_CHAT_ENDPOINT):
            raise ApiError(
                400,
                f"Invalid value for 'endpoint': expected one of {', '.join(repr(e) for e in VALID_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise ApiError(
                400, "Invalid value for 'completion_window': expected '24h'.", param="completion_window", code="invalid_value"
            )
        metadata = body.get("metadata")
        if metadata is not None:
            _check_metadata(metadata)
        if (invalid := batch_request_error(body)) is not None:
            raise ApiError(400, invalid["message"], param=invalid["param"], code=invalid["code"])
        with self.state.lock:
            self.advance_all()
            now = self.state.clock()
            created = _now_int(now)
            bid = "batch_" + uuid.uuid4().hex
            obj: dict[str, Any] = {
                "id": bid,
                "object": "batch",
                "endpoint": endpoint,
                "model": None,
                "errors": None,
                "input_file_id": body["input_file_id"],
                "completion_window": "24h",
                "status": "validating",
                "output_file_id": None,
                "error_file_id": None,
                "created_at": created,
                "in_progress_at": None,
                "expires_at": created + int(math.ceil(self.state.cfg.completion_window_s)),
                "finalizing_at": None,
                "completed_at": None,
                "failed_at": None,
                "expired_at": None,
                "cancelling_at": None,
                "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "metadata": dict(metadata) if metadata is not None else None,
                "usage": _empty_usage(),
            }
            b = _Batch(obj, self.state.next_seq(), now, now + self.state.cfg.completion_window_s, azure=azure)
            if metadata and EXPIRE_AFTER_METADATA_KEY in metadata:
                try:
                    b.forced_expire_after = max(0, int(metadata[EXPIRE_AFTER_METADATA_KEY]))
                except ValueError:
                    pass
            self.state.batches[bid] = b
            self.state.batches_created += 1
            self.validation.start(b)
            self.persist.save_batch(b)
            return json.loads(json.dumps(obj))

    def get(self, batch_id: str) -> _Batch:
        b = self.state.batches.get(batch_id)
        if b is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param=None)
        return b

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            self.advance_all()
            b = self.get(batch_id)
            return self.view(b)

    def list_batches(self, query: dict[str, str]) -> dict[str, Any]:
        limit = int_param(query, "limit", 20, 1, 100)
        with self.state.lock:
            self.advance_all()
            items = sorted(self.state.batches.values(), key=lambda b: b.seq, reverse=True)
            return page([self.view(b) for b in items], cursor(self.state.cfg, query), limit)

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            self.advance_all()
            b = self.get(batch_id)
            now = self.state.clock()
            s = b.status
            if s in ("completed", "failed", "expired"):
                raise ApiError(409, f"Cannot cancel a batch with status '{s}'.", param=None)
            if s in ("cancelling", "cancelled"):
                return self.view(b)
            if s == "validating":
                b.stop_count = 0
                b.checking = None  # its background validation's result is not needed
            elif s == "in_progress":
                b.stop_count = self.processed(b, now)
            else:  # finalizing: all requests ran
                b.stop_count = b.n
            ok, bad = self.split_counts(b, b.stop_count)
            b.obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
            b.t_cancelling = now
            b.obj["status"] = "cancelling"
            b.obj["cancelling_at"] = _now_int(now)
            self.persist.save_batch(b)
            return self.view(b)

    def expire_batch(self, batch_id: str, completed: int | None = None) -> dict[str, Any]:
        """Force an in-progress batch to expire now; ``completed`` requests (default: as many as
        the clock says were processed) get answers, the rest ``batch_expired`` errors."""
        with self.state.lock:
            self.advance_all()
            b = self.get(batch_id)
            now = self.state.clock()
            if b.status == "validating":
                self.apply(b, "validate", now)
            if b.status != "in_progress":
                raise ApiError(409, f"Cannot expire a batch with status '{b.status}'.", param=None)
            count = self.processed(b, now) if completed is None else max(0, min(int(completed), b.n))
            b.stop_count = count
            self.apply(b, "expire", now)
            return self.view(b)

    # --- lifecycle -------------------------------------------------------------------------

    def view(self, b: _Batch) -> dict[str, Any]:
        obj = json.loads(json.dumps(b.obj))
        if b.status == "in_progress":
            now = self.state.clock()
            done = self.processed(b, now)
            self.results.answer_upto(b, done, now, drafted_only=True)
            ok, bad = self.split_counts(b, done)
            obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
        if self.state.cfg.drop_metadata:
            obj["metadata"] = None  # a provider that does not keep metadata
        return obj

    def split_counts(self, b: _Batch, done: int) -> tuple[int, int]:
        bad = self.validation.ensure_plan(b).bad_upto(done)
        return done - bad, bad

    def processed(self, b: _Batch, t: float) -> int:
        if b.t_in_progress is None:
            return 0
        n = b.n
        if self.state.cfg.in_progress_s <= 0:
            done = n
        else:
            done = min(n, max(0, int(n * (t - b.t_in_progress) / self.state.cfg.in_progress_s + 1e-6)))  # epsilon: float clocks
        if b.forced_expire_after is not None:
            done = min(done, b.forced_expire_after)
        return done

    def _next_event(self, b: _Batch) -> tuple[float, int, str] | None:
        s = b.status
        cfg = self.state.cfg
        if s == "validating":
            ready, t = self.validation.ready(b)
            return (t, 1, "validate") if ready else None
        if s == "in_progress":
            assert b.t_in_progress is not None
            t_fin = b.t_in_progress + cfg.in_progress_s
            cands = [(t_fin, 2, "finalize")]
            k = b.forced_expire_after
            if k is not None and k < b.n:
                t_k = b.t_in_progress + (cfg.in_progress_s * k / b.n if b.n else 0.0)
                cands.append((t_k, 0, "expire"))
            if b.t_deadline < t_fin:
                cands.append((max(b.t_deadline, b.t_in_progress), 0, "expire"))
            return min(cands)
        if s == "finalizing":
            assert b.t_finalizing is not None
            return (b.t_finalizing + cfg.finalizing_s, 1, "complete")
        if s == "cancelling":
            assert b.t_cancelling is not None
            return (b.t_cancelling + cfg.cancelling_s, 1, "cancelled")
        return None

    def advance_all(self) -> None:
        now = self.state.clock()
        while True:
            best: tuple[float, int, int, str, _Batch] | None = None
            for b in self.state.batches.values():
                if b.status in TERMINAL_STATUSES:
                    continue
                ev = self._next_event(b)
                if ev is None or ev[0] > now:
                    continue
                key = (ev[0], ev[1], b.seq, ev[2], b)
                if best is None or key[:3] < best[:3]:
                    best = key
            if best is None:
                return
            self.apply(best[4], best[3], best[0])

    def apply(self, b: _Batch, event: str, t: float) -> None:
        started = self.state.clock()
        self._apply(b, event, t)
        b.times[event] = t
        b.times[f"{event}_work"] = max(0.0, self.state.clock() - started)

    def _apply(self, b: _Batch, event: str, t: float) -> None:
        ts = _now_int(t)
        obj = b.obj
        if event == "validate":
            errors = self.validation.validate(b)
            if errors:
                obj["status"] = "failed"
                obj["failed_at"] = ts
                obj["errors"] = {"object": "list", "data": errors}
                if b.azure:  # Azure's failed batch reports no per-request counts (how-to/batch.md, "Troubleshooting")
                    obj["request_counts"] = {"total": obj["request_counts"]["total"], "completed": None, "failed": None}
            else:
                obj["status"] = "in_progress"
                obj["in_progress_at"] = ts
                # the batch's requests run from the configured end of validating: this process's
                # parse-and-count (background work, on the real clock) does not lengthen the
                # batch beyond its configured phase times, as a real provider's servers would not
                b.t_in_progress = min(t, b.t_created + self.state.cfg.validating_s)
                self.results.start(b)
        elif event == "finalize":
            obj["status"] = "finalizing"
            obj["finalizing_at"] = ts
            b.t_finalizing = t
            self.results.answer_upto(b, b.n, t)
            ok, bad = self.split_counts(b, b.n)
            obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
        elif event == "complete":
            self.results.write(b, b.n, t, expired=False)
            obj["status"] = "completed"
            obj["completed_at"] = ts
        elif event == "expire":
            if b.stop_count is None:
                b.stop_count = (
                    b.forced_expire_after if (b.forced_expire_after is not None and t < b.t_deadline) else self.processed(b, t)
                )
            self.results.write(b, b.stop_count, t, expired=True)
            obj["status"] = "expired"
            obj["expired_at"] = ts
        elif event == "cancelled":
            self.results.write(b, b.stop_count or 0, t, expired=False)
            obj["status"] = "cancelled"
            obj["cancelled_at"] = ts
        else:  # pragma: no cover
            raise AssertionError(event)
        self.persist.save_batch(b)


def _check_metadata(metadata: Any) -> None:
    """A batch's ``metadata`` as the API checks it: an object of at most 16 string values,
    keys of at most 64 characters, values of at most 512."""
    if not isinstance(metadata, dict):
        raise ApiError(
            400,
            f"Invalid type for 'metadata': expected an object, but got {type(metadata).__name__} instead.",
            param="metadata",
            code="invalid_type",
        )
    if len(metadata) > 16:
        raise ApiError(
            400,
            f"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with {len(metadata)} properties instead.",
            param="metadata",
            code="object_above_max_properties",
        )
    for k, v in metadata.items():
        if len(k) > 64:
            raise ApiError(
                400,
                f"Invalid 'metadata': key '{k[:20]}…' is longer than 64 characters.",
                param="metadata",
                code="invalid_value",
            )
        if not isinstance(v, str):
            kind = {list: "an array", dict: "an object", int: "an integer", float: "a number", bool: "a boolean"}.get(
                type(v), type(v).__name__
            )
            raise ApiError(
                400,
                f"Invalid type for 'metadata.{k}': expected a string, but got {kind} instead.",
                param=f"metadata.{k}",
                code="invalid_type",
            )
        if len(v) > 512:
            raise ApiError(
                400,
                f"Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512, but got a string with length {len(v)} instead.",
                param=f"metadata.{k}",
                code="string_above_max_length",
            )
