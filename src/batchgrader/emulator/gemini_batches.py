"""The emulator's Gemini Batch API (SIMULATED): ``batchGenerateContent`` over an uploaded file
or inline requests, batches as long-running operations (list, get, cancel, delete) on the clock,
and ``countTokens``; the Files API and the answers are :mod:`gemini`'s."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from batchgrader.emulator.gemini import (
    BATCH_TYPE,
    GEMINI_MAX_INLINE_BYTES,
    OUTPUT_TYPE,
    GeminiApiError,
    GeminiFiles,
    _checked_request,
    _file_requests,
    _GemBatch,
    _get,
    _page,
    _rfc3339,
    gem_tokens,
    gemini_result,
)
from batchgrader.emulator.prompt_cache import BatchCache
from batchgrader.emulator.rules import known_model
from batchgrader.emulator.spool import LinesWriter, read_jsonl, write_jsonl
from batchgrader.emulator.state import State
from batchgrader.fsio import atomic_write_bytes


class GeminiBatches:
    """Gemini batches over the shared state and Gemini's files; its batches are its own
    (``batches``)."""

    def __init__(self, state: State, files: GeminiFiles) -> None:
        self.state = state
        self.files = files
        self.batches: dict[str, _GemBatch] = {}

    def _save(self, b: _GemBatch) -> None:
        if self.state.data_dir:
            rec = {k: getattr(b, k) for k in ("name", "seq", "t_created", "model", "display_name", "input_file", "n", "inline")}
            rec |= {"t_cancel": b.t_cancel, "deleted": b.deleted}
            atomic_write_bytes(
                self.state.data_dir / "gemini" / "batches" / f"{b.name.split('/')[-1]}.json", json.dumps(rec).encode()
            )

    def _requests_path(self, name: str) -> Path:
        return self.state.blob_dir("gemini/batches") / f"{name.split('/')[-1]}.requests.jsonl"

    def load(self) -> None:
        root = self.state.data_dir / "gemini" if self.state.data_dir else None
        if root is None or not root.exists():
            return
        for p in sorted((root / "batches").glob("*.json")):
            r = json.loads(p.read_text(encoding="utf-8"))
            path = self._requests_path(r["name"])
            if "requests" in r:  # a record of an older version
                r["n"], r["inline"] = write_jsonl(path, r["requests"]), bool(r["requests"] and r["requests"][0].get("inline"))
            args = (r["name"], r["seq"], r["t_created"], r["model"], r["display_name"], r["input_file"])
            b = _GemBatch(*args, r["n"], path, r["inline"], r["t_cancel"])
            b.deleted = r["deleted"]
            self.batches[b.name] = b
            self.state.seq = max(self.state.seq, b.seq)
            self.state.batches_created += 1

    def create_batch(self, model: str, body: Any) -> dict[str, Any]:
        model = model.removeprefix("models/")
        if not model.startswith("gemini-") or not known_model(model, self.state.cfg):
            raise GeminiApiError(
                404, f"models/{model} is not found for API version v1beta, or is not supported for batchGenerateContent."
            )
        batch = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch, dict):
            raise GeminiApiError(400, "Invalid JSON payload: 'batch' is required.")
        display = batch.get("displayName") or batch.get("display_name")
        if not display:
            raise GeminiApiError(400, "batch.display_name is required.")
        src = batch.get("inputConfig") or batch.get("input_config") or {}
        with self.state.lock:
            file_name = _get(src, "fileName", "file_name")
            if file_name:
                requests = _file_requests(file_name, self.files.get(file_name).path)
            else:
                inline = (src.get("requests") or {}).get("requests")
                if not isinstance(inline, list) or not inline:
                    raise GeminiApiError(400, "batch.input_config must name a file_name or hold requests.")
                if len(json.dumps(inline)) > GEMINI_MAX_INLINE_BYTES:
                    raise GeminiApiError(400, "Inline batch requests exceed 20 MB; use an input file.")
                requests = (
                    {"key": str((r.get("metadata") or {}).get("key") or i), "request": r.get("request") or {}}
                    for i, r in enumerate(inline)
                )
            name = "batches/" + uuid.uuid4().hex[:16]
            path = self._requests_path(name)
            n = write_jsonl(path, (_checked_request(r) for r in requests))
            if not n:
                path.unlink(missing_ok=True)
                raise GeminiApiError(400, "Every batch line must be an object with a 'request'.")
            b = _GemBatch(name, self.state.next_seq(), self.state.clock(), model, str(display), file_name, n, path, not file_name)
            self.batches[b.name] = b
            self.state.batches_created += 1
            self._save(b)
            return self._view(b)

    def _get(self, batch_id: str) -> _GemBatch:
        name = batch_id if batch_id.startswith("batches/") else "batches/" + batch_id
        b = self.batches.get(name)
        if b is None or b.deleted:
            raise GeminiApiError(404, f"Batch {name} not found.")
        self._advance(b)
        return b

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            return self._view(self._get(batch_id))

    def list_batches(self, query: dict[str, str]) -> dict[str, Any]:
        with self.state.lock:
            items = sorted((b for b in self.batches.values() if not b.deleted), key=lambda b: b.seq, reverse=True)
            page, token = _page(items, query)
            out: dict[str, Any] = {"operations": [self._view(self._get(b.name)) for b in page]}
            if token:
                out["nextPageToken"] = token
            return out

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            b = self._get(batch_id)
            if b.results_path is not None:
                raise GeminiApiError(400, f"Batch {b.name} has already ended ({b.state}).")
            if b.t_cancel is None:
                b.t_cancel = self.state.clock()
                self._save(b)
            return {}

    def delete_batch(self, batch_id: str) -> dict[str, Any]:
        with self.state.lock:
            b = self._get(batch_id)
            b.deleted = True
            self._save(b)
            return {}

    def count_tokens(self, body: Any) -> dict[str, Any]:
        """``models.countTokens``: ``contents`` alone, or a whole ``generateContentRequest``
        (``model`` and ``contents`` required; ``systemInstruction`` counted as the batch bills it;
        top-level ``contents`` then ignored).  Request fields other than ``contents`` at the top
        level are refused as the API refuses them (it reads them as a ``generateContentRequest``
        without its model and contents)."""
        if not isinstance(body, dict):
            raise GeminiApiError(400, "Invalid JSON payload received.")
        full = None if self.state.cfg.gemini_count_contents_only else body.get("generateContentRequest")
        stray = [k for k in ("systemInstruction", "generationConfig", "tools", "toolConfig", "safetySettings") if k in body]
        if full is None and stray:
            full = {k: body[k] for k in stray}
        if full is not None:
            missing = [
                f"* CountTokensRequest.generate_content_request.{f}: {f} is not specified\n"
                for f in ("contents", "model")
                if not (full.get(f) if isinstance(full, dict) else None)
            ]
            if missing:
                raise GeminiApiError(400, "".join(missing))
            if not isinstance(full["contents"], list):
                raise GeminiApiError(400, "Invalid value at 'generate_content_request.contents'")
            n = gem_tokens(full)
        elif isinstance(body.get("contents"), list) and body["contents"]:
            n = gem_tokens({"contents": body["contents"]})
        else:
            raise GeminiApiError(400, "contents is required.")
        return {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}

    def advance_all(self) -> None:
        for b in list(self.batches.values()):
            self._advance(b)

    def _processed(self, b: _GemBatch, t: float) -> int:
        span = self.state.cfg.in_progress_s + self.state.cfg.finalizing_s
        run = t - b.t_created - self.state.cfg.validating_s
        if span <= 0:
            return b.n if run >= 0 else 0
        return min(b.n, max(0, int(b.n * run / span + 1e-6)))

    def _advance(self, b: _GemBatch) -> None:
        if b.results_path is not None:
            return
        now = self.state.clock()
        t_end = b.t_created + self.state.cfg.validating_s + self.state.cfg.in_progress_s + self.state.cfg.finalizing_s
        deadline = b.t_created + self.state.cfg.completion_window_s
        if b.t_cancel is not None and b.t_cancel < t_end:
            if now >= b.t_cancel + self.state.cfg.cancelling_s:
                self._finish(b, b.t_cancel + self.state.cfg.cancelling_s, self._processed(b, b.t_cancel), "BATCH_STATE_CANCELLED")
            else:
                b.state = "BATCH_STATE_RUNNING"
        elif deadline < t_end and now >= deadline:
            self._finish(b, deadline, self._processed(b, deadline), "BATCH_STATE_EXPIRED")
        elif now >= t_end and deadline >= t_end:
            self._finish(b, t_end, b.n, "BATCH_STATE_SUCCEEDED")
        else:
            b.state = "BATCH_STATE_PENDING" if now < b.t_created + self.state.cfg.validating_s else "BATCH_STATE_RUNNING"

    def _finish(self, b: _GemBatch, t: float, processed: int, state: str) -> None:
        """Its results, written to disk as they are made (then shuffled there, if configured);
        for a batch of an input file, they are its generated responses file."""
        seen: BatchCache = set()  # the batch's implicit prompt cache, filled in request order
        key = b.name.split("/")[-1]
        out = LinesWriter(self.state.scratch / f"gemini-{key}.results.jsonl")
        for i, line in enumerate(read_jsonl(b.requests_path)):
            if i >= processed:
                break
            r = gemini_result(self.state.cfg, b.model, b.name, line, seen)
            b.succeeded += "response" in r
            out.add(r)
        b.answered = len(out.offsets)
        b.results_path = out.close(f"shuffle:{self.state.cfg.seed}:{b.name}" if self.state.cfg.shuffle_output else None)
        b.t_ended, b.state = t, state
        name = "files/batch-" + key
        if b.answered and not b.inline:
            self.files.add_generated(name, b.results_path, t)

    def _view(self, b: _GemBatch) -> dict[str, Any]:
        n, done, ok = b.n, b.results_path is not None, b.succeeded
        meta: dict[str, Any] = {
            "@type": BATCH_TYPE,
            "name": b.name,
            "model": f"models/{b.model}",
            "displayName": b.display_name,
            "createTime": _rfc3339(b.t_created),
            "updateTime": _rfc3339(b.t_ended or b.t_created),
            "batchStats": {
                "requestCount": str(n),
                "successfulRequestCount": str(ok),
                "failedRequestCount": str(b.answered - ok),
                "pendingRequestCount": str(0 if done else n),
            },
            "state": b.state,
            "inputConfig": {"fileName": b.input_file} if b.input_file else {"requests": {}},
        }
        if done:
            meta["endTime"] = _rfc3339(b.t_ended)
            if b.inline:  # (at most 20 MB of requests)
                inline = [
                    {"metadata": {"key": r["key"]}, **({"response": r["response"]} if "response" in r else {"error": r["error"]})}
                    for r in read_jsonl(b.results_path)
                ]
                meta["output"] = {"inlinedResponses": {"inlinedResponses": inline}}
            elif b.answered:
                meta["output"] = {"responsesFile": "files/batch-" + b.name.split("/")[-1]}
        op: dict[str, Any] = {"name": b.name, "metadata": meta, "done": done}
        if done and "output" in meta:
            op["response"] = {"@type": OUTPUT_TYPE, **meta["output"]}
        return op
