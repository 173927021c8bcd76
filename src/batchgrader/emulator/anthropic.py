"""The emulator's Anthropic Message Batches API (SIMULATED), for the official ``anthropic`` SDK.

Served under the same root as the OpenAI routes (``Anthropic(base_url=emu.root_url)``):
``POST/GET /v1/messages/batches``, ``GET/DELETE /v1/messages/batches/{id}``,
``POST /v1/messages/batches/{id}/cancel``, ``GET /v1/messages/batches/{id}/results`` and
``POST /v1/messages/count_tokens``, with Anthropic's objects and error bodies
(``{"type": "error", "error": {"type": ..., "message": ...}}``) and ``x-api-key`` auth.

A batch is ``in_progress`` for ``validating_s + in_progress_s + finalizing_s`` after creation,
then ``ended``; cancel makes it ``canceling`` for ``cancelling_s``, then ``ended`` with the
unprocessed requests ``canceled``; past ``completion_window_s`` the rest are ``expired``.
Requests are checked when created (custom_id ``^[a-zA-Z0-9_-]{1,64}$``, unique, 1 to
100,000 requests) and their params when processed (an ``errored`` result, as the real API
does), by the rules of the ``anthropic-version`` the batch was created with (kept with it:
under 2026-10-21 a sampling parameter errors every request that has one).  Input tokens are counted with the project's tiktoken counter: a stand-in, since
Claude's tokenizer is not public.  A ``cache_control`` breakpoint on the system prompt is
cached by the rules in ``prompt_cache`` (writes, then reads, within the batch).  A batch's
requests and results are kept on disk (JSON lines), not in memory: its requests in
``msgbatches/`` of ``data_dir`` (else the emulator's scratch folder), its results in the scratch
folder (recomputed, deterministically, after a restart).
"""

from __future__ import annotations

import json
import random
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.providers import ANTHROPIC_DEFAULT_API_VERSION
from batchgrader.emulator.answers import _countable_messages, _counter_for
from batchgrader.emulator.common import ApiError, _hex, int_param
from batchgrader.emulator.config import FAIL_400_TRIGGER, FAIL_500_TRIGGER, EmulatorConfig
from batchgrader.emulator.prompt_cache import BatchCache, anthropic_cache_split, system_tokens
from batchgrader.emulator.rules import anthropic_request_error, anthropic_thinking_effort, known_model, reasoning_tokens
from batchgrader.emulator.schema_values import generate_from_schema, sentence
from batchgrader.emulator.spool import LinesWriter, read_jsonl, write_jsonl
from batchgrader.emulator.state import State
from batchgrader.emulator.upload import FileBody
from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.catalogue import shipped_spec

ANTHROPIC_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BATCH_BYTES = 256 * 1024 * 1024
ANTHROPIC_RESULTS_DAYS = 29
#: emulated input-token counting uses this tiktoken model (Claude's tokenizer is not public)
COUNTING_STAND_IN = "gpt-4o"


class AnthropicApiError(ApiError):
    """An error answered with Anthropic's error body."""

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


def anthropic_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _MsgBatch:
    id: str
    seq: int
    t_created: float
    n: int  # its requests, kept in ``requests_path`` (one JSON line each, in order)
    requests_path: Path
    t_cancel: float | None = None
    counts: dict[str, int] | None = None  # once it has ended: its results by type
    results_path: Path | None = None  # once it has ended: its results, one JSON line each
    t_ended: float | None = None
    archived: bool = False
    version: str = "2023-06-01"  # the anthropic-version it was created with: its requests' rules

    @property
    def results(self) -> list[dict[str, Any]] | None:
        """Its results read back (inspection by tests; the API sends the file as it is read)."""
        return None if self.counts is None else list(read_jsonl(self.results_path))


class AnthropicBatches:
    """Message Batches over the shared state: create, retrieve, list, cancel, delete, results,
    and count_tokens; its batches are its own (``batches``)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.batches: dict[str, _MsgBatch] = {}

    # --- persistence -------------------------------------------------------------------------

    def _requests_path(self, batch_id: str) -> Path:
        return self.state.blob_dir("msgbatches") / f"{batch_id}.requests.jsonl"

    def _save(self, m: _MsgBatch) -> None:
        if not self.state.data_dir:
            return
        rec = {"id": m.id, "seq": m.seq, "t_created": m.t_created, "n": m.n, "t_cancel": m.t_cancel}
        rec["archived"] = m.archived
        rec["version"] = m.version
        atomic_write_bytes(self.state.data_dir / "msgbatches" / f"{m.id}.json", json.dumps(rec).encode("utf-8"))

    def load(self) -> None:
        d = self.state.data_dir / "msgbatches" if self.state.data_dir else None
        for p in sorted(d.glob("*.json")) if d is not None and d.exists() else []:
            rec = json.loads(p.read_text(encoding="utf-8"))
            path = self._requests_path(rec["id"])
            n = write_jsonl(path, rec["requests"]) if "requests" in rec else rec["n"]  # a record of an older version
            m = _MsgBatch(rec["id"], rec["seq"], rec["t_created"], n, path, rec["t_cancel"], archived=rec["archived"])
            m.version = rec.get("version", m.version)  # a record of an older version: the rules it had
            self.batches[m.id] = m
            self.state.seq = max(self.state.seq, m.seq)
            self.state.batches_created += 1

    # --- timing ------------------------------------------------------------------------------

    def _processing_s(self) -> float:
        return self.state.cfg.validating_s + self.state.cfg.in_progress_s + self.state.cfg.finalizing_s

    def _done_by(self, m: _MsgBatch, t: float) -> int:
        span = self._processing_s()
        n = m.n
        if span <= 0:
            return n
        return min(n, max(0, int(n * (t - m.t_created) / span + 1e-6)))

    def _advance(self, m: _MsgBatch) -> None:
        if m.counts is not None:
            return
        now = self.state.clock()
        t_end = m.t_created + self._processing_s()
        deadline = m.t_created + self.state.cfg.completion_window_s
        if m.t_cancel is not None and m.t_cancel < t_end:
            if now >= m.t_cancel + self.state.cfg.cancelling_s:
                self._finish(m, m.t_cancel + self.state.cfg.cancelling_s, self._done_by(m, m.t_cancel), "canceled")
        elif deadline < t_end:
            if now >= deadline:
                self._finish(m, deadline, self._done_by(m, deadline), "expired")
        elif now >= t_end:
            self._finish(m, t_end, m.n, "expired")

    def _finish(self, m: _MsgBatch, t: float, processed: int, rest: str) -> None:
        """Its results, written to disk as they are made (then shuffled there, if configured)."""
        seen: BatchCache = set()  # the batch's prompt cache, filled in request order
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        out = LinesWriter(self.state.scratch / f"{m.id}.results.jsonl")
        for i, r in enumerate(read_jsonl(m.requests_path)):
            res = (
                anthropic_result(self.state.cfg, m.id, r, seen, m.version)
                if i < processed
                else {"custom_id": r["custom_id"], "result": {"type": rest}}
            )
            counts[res["result"]["type"]] += 1
            out.add(res)
        m.results_path = out.close(f"shuffle:{self.state.cfg.seed}:{m.id}" if self.state.cfg.shuffle_output else None)
        m.counts, m.t_ended = counts, t

    # --- objects -----------------------------------------------------------------------------

    def _view(self, m: _MsgBatch) -> dict[str, Any]:
        self._advance(m)
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if m.counts is None:
            counts["processing"] = m.n
            status = "in_progress" if m.t_cancel is None else "canceling"
        else:
            counts = dict(m.counts)
            status = "ended"
        return {
            "id": m.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "created_at": _rfc3339(m.t_created),
            "expires_at": _rfc3339(m.t_created + 86400),
            "ended_at": _rfc3339(m.t_ended),
            "cancel_initiated_at": _rfc3339(m.t_cancel),
            "archived_at": None,
            "results_url": f"/v1/messages/batches/{m.id}/results" if m.counts is not None else None,
        }

    def _get(self, batch_id: str) -> _MsgBatch:
        m = self.batches.get(batch_id)
        if m is None or m.archived:
            raise AnthropicApiError(404, f"Message batch {batch_id} not found.", type="not_found_error")
        return m

    # --- API ---------------------------------------------------------------------------------

    def create_batch(self, body: Any, raw_size: int, version: str | None = None) -> dict[str, Any]:
        def bad(message: str) -> AnthropicApiError:
            return AnthropicApiError(400, message, type="invalid_request_error")

        if raw_size > ANTHROPIC_MAX_BATCH_BYTES:
            raise AnthropicApiError(413, "Request exceeds the maximum allowed number of bytes.", type="request_too_large")
        if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
            raise bad("requests: Field required")
        reqs = body["requests"]
        if not 1 <= len(reqs) <= ANTHROPIC_MAX_REQUESTS:
            raise bad(f"requests: List should have at least 1 item and at most {ANTHROPIC_MAX_REQUESTS} items")
        seen: set[str] = set()
        for i, r in enumerate(reqs):
            if not isinstance(r, dict) or not isinstance(r.get("params"), dict):
                raise bad(f"requests.{i}.params: Field required")
            cid = r.get("custom_id")
            if not isinstance(cid, str) or not ANTHROPIC_CUSTOM_ID.match(cid):
                raise bad(f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            if cid in seen:
                raise bad(f"Duplicate custom_id: {cid}. custom_id must be unique within a batch.")
            seen.add(cid)
        with self.state.lock:
            bid = "msgbatch_" + uuid.uuid4().hex[:24]
            path = self._requests_path(bid)
            m = _MsgBatch(bid, self.state.next_seq(), self.state.clock(), write_jsonl(path, reqs), path)
            m.version = version or ANTHROPIC_DEFAULT_API_VERSION
            self.batches[bid] = m
            self.state.batches_created += 1
            self._save(m)
            return self._view(m)

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            return self._view(self._get(batch_id))

    def list_batches(self, query: dict[str, str]) -> dict[str, Any]:
        limit = int_param(query, "limit", 20, 1, 1000)
        with self.state.lock:
            items = [m for m in sorted(self.batches.values(), key=lambda m: m.seq, reverse=True) if not m.archived]
            ids = [m.id for m in items]
            start, end = 0, len(items)
            if query.get("after_id"):
                start = ids.index(query["after_id"]) + 1 if query["after_id"] in ids else len(items)
            if query.get("before_id") and query["before_id"] in ids:
                end = ids.index(query["before_id"])
                start = max(start, end - limit)
            page = items[start : min(end, start + limit)]
            data = [self._view(m) for m in page]
            return {
                "data": data,
                "has_more": start + len(page) < end or (bool(query.get("before_id")) and start > 0),
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            m = self._get(batch_id)
            self._advance(m)
            if m.counts is None and m.t_cancel is None:
                m.t_cancel = self.state.clock()
                self._save(m)
            return self._view(m)

    def delete_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            m = self._get(batch_id)
            self._advance(m)
            if m.counts is None:
                raise AnthropicApiError(
                    400,
                    f"Message batch {batch_id} is still processing; cancel it and wait for it to end before deleting.",
                    type="invalid_request_error",
                )
            m.archived = True
            self._save(m)
            return {"id": batch_id, "type": "message_batch_deleted"}

    def results(self, batch_id: str) -> FileBody:
        with self.state.lock:
            m = self._get(batch_id)
            self._advance(m)
            if m.counts is None:
                raise AnthropicApiError(
                    400, f"Message batch {batch_id} has not ended; results are not available yet.", type="invalid_request_error"
                )
            return FileBody.open(m.results_path)

    def count_tokens(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body.get("model"):
            raise AnthropicApiError(400, "model and messages: Field required", type="invalid_request_error")
        if not known_model(str(body["model"]), self.state.cfg):
            raise AnthropicApiError(404, f"model: {body['model']}", type="not_found_error")
        return {"input_tokens": input_tokens(body)}


# --- answers ---------------------------------------------------------------------------------


def input_tokens(params: dict[str, Any]) -> int:
    """A request's input tokens (system prompt and messages), by the tiktoken stand-in."""
    msgs = _countable_messages(params.get("messages"))
    system = params.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text", "") for b in system if isinstance(b, dict))
    if isinstance(system, str) and system:
        msgs = [{"role": "system", "content": system}, *msgs]
    return int(_counter_for(COUNTING_STAND_IN).count(msgs))


def _refusal(cfg: EmulatorConfig, p: dict[str, Any], version: str | None) -> tuple[int, str] | None:
    """Why a request's params are refused when it is processed under API ``version`` (status,
    message), or None."""
    if not isinstance(p.get("model"), str) or not p.get("model"):
        return 400, "model: Field required"
    if not known_model(p["model"], cfg):
        return 404, f"model: {p['model']}"
    if not isinstance(p.get("max_tokens"), int) or p["max_tokens"] < 1:
        return 400, "max_tokens: Field required (an integer >= 1)"
    if not isinstance(p.get("messages"), list) or not p["messages"]:
        return 400, "messages: Field required"
    if p.get("stream"):
        return 400, "stream: streaming is not supported in the Message Batches API"
    refused = anthropic_request_error(p, version)
    if refused is not None:
        return 400, refused
    text = " ".join(x.get("content", "") for x in _countable_messages(p["messages"]))
    if FAIL_400_TRIGGER in text:
        return 400, "Invalid request (emulated failure triggered by __FAIL_400__)."
    if FAIL_500_TRIGGER in text:
        return 500, "Internal server error"
    return None


def _text(cfg: EmulatorConfig, cid: str, p: dict[str, Any], rng: random.Random) -> str:
    fmt = (p.get("output_config") or {}).get("format") if isinstance(p.get("output_config"), dict) else None
    if cfg.answer_fn is not None:
        return str(cfg.answer_fn(cid, p))
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return json.dumps(generate_from_schema(fmt.get("schema") or {"type": "object"}, rng), ensure_ascii=False)
    return sentence(rng)


def anthropic_result(
    cfg: EmulatorConfig, batch_id: str, req: dict[str, Any], seen: BatchCache, version: str | None
) -> dict[str, Any]:
    """The result line of request ``req`` (``{"custom_id", "params"}``) of batch ``batch_id``:
    ``succeeded`` with its ``Message``, or ``errored``; ``seen`` is the batch's prompt cache;
    ``version`` the ``anthropic-version`` whose rules apply."""
    cid, p = req["custom_id"], req["params"]
    refused = _refusal(cfg, p, version)
    if refused is not None:
        status, message = refused
        err = {"type": anthropic_error_type(status), "message": message}
        error = {"type": "error", "error": err, "request_id": "req_" + _hex(batch_id, cid)}
        return {"custom_id": cid, "result": {"type": "errored", "error": error}}
    return {"custom_id": cid, "result": {"type": "succeeded", "message": _message(cfg, batch_id, cid, p, seen)}}


def _message(cfg: EmulatorConfig, batch_id: str, cid: str, p: dict[str, Any], seen: BatchCache) -> dict[str, Any]:
    rng = random.Random(_hex("answer", cid, json.dumps(p["messages"], sort_keys=True), n=32))
    content = _text(cfg, cid, p, rng)
    enc = _counter_for(COUNTING_STAND_IN).encoding
    tokens = enc.encode_ordinary(content)
    effort, budget = anthropic_thinking_effort(p)
    spec = shipped_spec(p["model"])
    thinking = reasoning_tokens(spec, effort, rng, budget) if (spec.reasoning or budget) else 0
    thinking = min(thinking, p["max_tokens"])
    stop = "end_turn"
    if thinking + len(tokens) > p["max_tokens"]:
        tokens, stop = tokens[: p["max_tokens"] - thinking], "max_tokens"
        content = enc.decode(tokens)
    blocks: list[dict[str, Any]] = []
    if thinking:
        blocks.append({"type": "thinking", "thinking": "(emulated reasoning)", "signature": _hex("sig", batch_id, cid)})
    if content or not thinking:
        blocks.append({"type": "text", "text": content})
    write, read = anthropic_cache_split(seen, p["model"], p.get("system"), system_tokens)
    usage: dict[str, Any] = {
        "input_tokens": input_tokens(p) - write - read,
        "output_tokens": thinking + len(tokens),
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "service_tier": "batch",
    }
    if thinking:
        usage["output_tokens_details"] = {"thinking_tokens": thinking}
    return {
        "id": "msg_" + _hex("msg", batch_id, cid),
        "type": "message",
        "role": "assistant",
        "model": p["model"],
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
