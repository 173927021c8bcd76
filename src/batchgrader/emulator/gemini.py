"""The emulator's Gemini Batch API (SIMULATED), for the official ``google-genai`` SDK.

Served under the same root as the other routes (``genai.Client(api_key=...,
http_options=types.HttpOptions(base_url=emu.root_url))``), with Google's objects and error
bodies (``{"error": {"code", "message", "status"}}``) and ``x-goog-api-key`` auth:

* Files: the resumable upload (``POST /upload/v1beta/files`` with ``X-Goog-Upload-Command:
  start``, answered with ``X-Goog-Upload-URL``; then ``upload, finalize`` with the bytes),
  ``GET /v1beta/files`` (pages), ``GET/DELETE /v1beta/files/{id}`` and
  ``GET /v1beta/files/{id}:download`` (generated files only, as the real API).
* Batches: ``POST /v1beta/models/{model}:batchGenerateContent`` (a JSONL input file of
  ``{"key", "request"}`` lines, or inline requests), ``GET /v1beta/batches`` (newest first,
  pages), ``GET/DELETE /v1beta/batches/{id}``, ``POST /v1beta/batches/{id}:cancel``; batch
  resources are long-running operations whose ``metadata`` is the ``GenerateContentBatch``.
* ``POST /v1beta/models/{model}:countTokens``.

A batch is ``BATCH_STATE_PENDING`` for ``validating_s``, ``BATCH_STATE_RUNNING`` for
``in_progress_s + finalizing_s``, then ``BATCH_STATE_SUCCEEDED`` with a generated responses
file (``files/batch-<id>``).  A cancel ends it ``cancelling_s`` later as
``BATCH_STATE_CANCELLED``; past ``completion_window_s`` it is ``BATCH_STATE_EXPIRED``; both
keep the answers of the requests processed by then.  A request is checked when processed (an
``error`` line with a ``google.rpc.Status``, gRPC codes, as the real output file has).  Input
tokens are counted with the project's tiktoken counter (a stand-in: Gemini's tokenizer is not
offline).  Every model but the ``-lite`` ones thinks: it reports ``thoughtsTokenCount``.
Files, a batch's requests and its results are kept on disk, not in memory: with ``data_dir``,
files and batches in ``gemini/``, else in the emulator's scratch folder; results in the scratch
folder (recomputed, deterministically, after a restart).
"""

from __future__ import annotations

import json
import random
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.emulator.answers import _counter_for, _sentence, generate_from_schema
from batchgrader.emulator.common import ApiError, _hex
from batchgrader.emulator.config import FAIL_400_TRIGGER, FAIL_500_TRIGGER
from batchgrader.emulator.prompt_cache import BatchCache, gemini_cached_tokens, system_tokens
from batchgrader.emulator.rules import gemini_request_error, gemini_thinking_effort, reasoning_tokens
from batchgrader.emulator.spool import LinesWriter, read_jsonl, size_and_sha256, write_jsonl
from batchgrader.emulator.state import _StoreBase
from batchgrader.emulator.upload import PART_SUFFIX, FileBody
from batchgrader.fsio import atomic_write_bytes
from batchgrader.pipeline.catalogue import shipped_spec

COUNTING_STAND_IN = "gpt-4o"
GEMINI_MAX_FILE_BYTES = 2 * 1024 * 1024 * 1024
GEMINI_MAX_INLINE_BYTES = 20 * 1024 * 1024
FILE_KEPT_S = 48 * 3600
BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput"
STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
STATUS_NAMES |= {409: "ALREADY_EXISTS", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def google_status(status: int) -> str:
    return STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")


class GeminiApiError(ApiError):
    """An error answered with Google's error body."""

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "status": google_status(self.status)}}


def gemini_error_body(status: int, message: str) -> dict[str, Any]:
    return GeminiApiError(status, message).body()


def _rfc3339(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    return d.get(camel, d.get(snake))


@dataclass
class _GemFile:
    name: str
    seq: int
    display_name: str
    mime_type: str
    t_created: float
    path: Path | None  # where its bytes are kept
    size: int
    sha256: str
    source: str = "UPLOADED"
    deleted: bool = False


@dataclass
class _GemBatch:
    name: str
    seq: int
    t_created: float
    model: str
    display_name: str
    input_file: str | None
    n: int  # its requests, kept in ``requests_path`` ({"key", "request"} JSON lines, in order)
    requests_path: Path
    inline: bool  # sent in the create call (its answers are then inline in the batch too)
    t_cancel: float | None = None
    deleted: bool = False
    state: str = "BATCH_STATE_PENDING"
    t_ended: float | None = None
    results_path: Path | None = None  # once it has ended: its results, one JSON line each
    answered: int = 0  # once it has ended: its results
    succeeded: int = 0  # ... of which answers (the rest errors)

    @property
    def results(self) -> list[dict[str, Any]] | None:
        """Its results read back (inspection by tests; the API sends the file as it is read)."""
        return None if self.results_path is None else list(read_jsonl(self.results_path))


def _file_requests(file_name: str, path: Path | None) -> Iterator[Any]:
    """The lines of an uploaded input file, parsed one at a time."""
    try:
        yield from read_jsonl(path)
    except ValueError:
        raise GeminiApiError(400, f"{file_name} is not valid JSONL.") from None


def _checked_request(r: Any) -> dict[str, Any]:
    """A batch line as kept: ``{"key", "request"}``; refused unless it is an object with a request."""
    if not isinstance(r, dict) or not isinstance(r.get("request"), dict):
        raise GeminiApiError(400, "Every batch line must be an object with a 'request'.")
    return {"key": r.get("key"), "request": r["request"]}


class GeminiMixin(_StoreBase):
    """Gemini Files and Batch API state and behaviour."""

    gem_files: dict[str, _GemFile]
    gem_batches: dict[str, _GemBatch]
    gem_uploads: dict[str, dict[str, Any]]

    # --- persistence -------------------------------------------------------------------------

    def _gem_save_file(self, f: _GemFile) -> None:
        """Its record (its bytes are already in place: see ``gem_upload_chunk``)."""
        if self.data_dir and f.source == "UPLOADED":
            d = self.data_dir / "gemini" / "files"
            rec = {"name": f.name, "seq": f.seq, "display_name": f.display_name, "mime_type": f.mime_type}
            rec |= {"t_created": f.t_created, "deleted": f.deleted, "size": f.size, "sha256": f.sha256}
            atomic_write_bytes(d / f"{f.name.split('/')[-1]}.json", json.dumps(rec).encode("utf-8"))

    def _gem_save_batch(self, b: _GemBatch) -> None:
        if self.data_dir:
            rec = {k: getattr(b, k) for k in ("name", "seq", "t_created", "model", "display_name", "input_file", "n", "inline")}
            rec |= {"t_cancel": b.t_cancel, "deleted": b.deleted}
            atomic_write_bytes(self.data_dir / "gemini" / "batches" / f"{b.name.split('/')[-1]}.json", json.dumps(rec).encode())

    def _gem_requests_path(self, name: str) -> Path:
        return self._blob_dir("gemini/batches") / f"{name.split('/')[-1]}.requests.jsonl"

    def _gem_load(self) -> None:
        root = self.data_dir / "gemini" if self.data_dir else None
        if root is None or not root.exists():
            return
        for p in sorted((root / "files").glob("*.json")):
            r = json.loads(p.read_text(encoding="utf-8"))
            data = p.with_suffix(".data")
            size, sha = (r["size"], r["sha256"]) if "sha256" in r else size_and_sha256(data)
            f = _GemFile(r["name"], r["seq"], r["display_name"], r["mime_type"], r["t_created"], data, size, sha)
            f.deleted = r["deleted"]
            self.gem_files[f.name] = f
            self.seq = max(self.seq, f.seq)
            self.files_created += 1
        for p in sorted((root / "batches").glob("*.json")):
            r = json.loads(p.read_text(encoding="utf-8"))
            path = self._gem_requests_path(r["name"])
            if "requests" in r:  # a record of an older version
                r["n"], r["inline"] = write_jsonl(path, r["requests"]), bool(r["requests"] and r["requests"][0].get("inline"))
            args = (r["name"], r["seq"], r["t_created"], r["model"], r["display_name"], r["input_file"])
            b = _GemBatch(*args, r["n"], path, r["inline"], r["t_cancel"])
            b.deleted = r["deleted"]
            self.gem_batches[b.name] = b
            self.seq = max(self.seq, b.seq)
            self.batches_created += 1

    # --- files -------------------------------------------------------------------------------

    def _gem_file_view(self, f: _GemFile) -> dict[str, Any]:
        view = {
            "name": f.name,
            "displayName": f.display_name,
            "mimeType": f.mime_type,
            "sizeBytes": str(f.size),
            "createTime": _rfc3339(f.t_created),
            "updateTime": _rfc3339(f.t_created),
            "expirationTime": _rfc3339(f.t_created + FILE_KEPT_S),
            "sha256Hash": f.sha256,
            "uri": f"https://generativelanguage.googleapis.com/v1beta/{f.name}",
            "state": "ACTIVE",
            "source": f.source,
        }
        if f.source == "GENERATED":
            view["downloadUri"] = f"{view['uri']}:download?alt=media"
        return view

    def _gem_file(self, file_id: str) -> _GemFile:
        name = file_id if file_id.startswith("files/") else "files/" + file_id
        self._gem_advance_all()
        f = self.gem_files.get(name)
        if f is None or f.deleted:
            raise GeminiApiError(403, f"You do not have permission to access the File {file_id} or it may not exist.")
        return f

    def gem_upload_start(self, body: Any, headers: Any, upload_root: str) -> tuple[dict[str, Any], dict[str, str]]:
        meta: dict[str, Any] = body["file"] if isinstance(body, dict) and isinstance(body.get("file"), dict) else {}
        size = int(headers.get("X-Goog-Upload-Header-Content-Length") or _get(meta, "sizeBytes", "size_bytes") or 0)
        if size > GEMINI_MAX_FILE_BYTES:
            raise GeminiApiError(400, "File size exceeds the 2 GB limit.")
        mime = (
            headers.get("X-Goog-Upload-Header-Content-Type") or _get(meta, "mimeType", "mime_type") or "application/octet-stream"
        )
        upload_id = uuid.uuid4().hex
        with self.lock:
            self.gem_uploads[upload_id] = {
                "size": size,
                "display_name": _get(meta, "displayName", "display_name") or "",
                "mime": mime,
                "path": self.scratch / f"gemini-upload-{upload_id}{PART_SUFFIX}",
                "received": 0,
            }
        url = f"{upload_root}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable"
        return {}, {"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active", "X-Goog-Upload-Chunk-Granularity": "8388608"}

    def gem_upload_chunk(
        self, upload_id: str, command: str, offset: int, data: bytes | Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A chunk of a resumable upload (its bytes, or the file it was received into), appended
        to the session's file on disk."""
        with self.lock:
            up = self.gem_uploads.get(upload_id)
            if up is None:
                raise GeminiApiError(404, "Upload session not found.")
            if offset != up["received"]:
                raise GeminiApiError(400, f"Invalid upload offset {offset}; expected {up['received']}.")
            with open(up["path"], "ab") as out:
                if isinstance(data, Path):
                    with open(data, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                else:
                    out.write(data)
                up["received"] = out.tell()
            if "finalize" not in command:
                return {}, {"X-Goog-Upload-Status": "active"}
            del self.gem_uploads[upload_id]
            if up["received"] != up["size"]:
                up["path"].unlink(missing_ok=True)
                raise GeminiApiError(400, f"Upload size {up['received']} does not match the declared {up['size']}.")
            name = "files/" + uuid.uuid4().hex[:12]
            path = self._blob_dir("gemini/files") / f"{name.split('/')[-1]}.data"
            shutil.move(up["path"], path)
            size, sha = size_and_sha256(path)
            f = _GemFile(name, self._next_seq(), up["display_name"], up["mime"], self.clock(), path, size, sha)
            self.gem_files[f.name] = f
            self.files_created += 1
            self._gem_save_file(f)
            return {"file": self._gem_file_view(f)}, {"X-Goog-Upload-Status": "final"}

    def gem_list_files(self, query: dict[str, str]) -> dict[str, Any]:
        with self.lock:
            self._gem_advance_all()
            items = sorted((f for f in self.gem_files.values() if not f.deleted), key=lambda f: f.seq, reverse=True)
            page, token = self._gem_page(items, query)
            out: dict[str, Any] = {"files": [self._gem_file_view(f) for f in page]}
            if token:
                out["nextPageToken"] = token
            return out

    def gem_get_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            return self._gem_file_view(self._gem_file(file_id))

    def gem_delete_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            f = self._gem_file(file_id)
            f.deleted = True
            self._gem_save_file(f)
            return {}

    def gem_download(self, file_id: str) -> FileBody:
        with self.lock:
            f = self._gem_file(file_id)
            if f.source != "GENERATED":
                raise GeminiApiError(400, "Only generated files can be downloaded; uploaded files cannot.")
            return FileBody.open(f.path)

    def _gem_page(self, items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
        size = self._int_param({"n": query.get("pageSize", "")}, "n", 10, 1, 1000)
        start = int(query["pageToken"]) if query.get("pageToken", "").isdigit() else 0
        page = items[start : start + size]
        return page, str(start + size) if start + size < len(items) else None

    # --- batches -----------------------------------------------------------------------------

    def gem_create_batch(self, model: str, body: Any) -> dict[str, Any]:
        model = model.removeprefix("models/")
        if not model.startswith("gemini-"):
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
        with self.lock:
            file_name = _get(src, "fileName", "file_name")
            if file_name:
                requests = _file_requests(file_name, self._gem_file(file_name).path)
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
            path = self._gem_requests_path(name)
            n = write_jsonl(path, (_checked_request(r) for r in requests))
            if not n:
                path.unlink(missing_ok=True)
                raise GeminiApiError(400, "Every batch line must be an object with a 'request'.")
            b = _GemBatch(name, self._next_seq(), self.clock(), model, str(display), file_name, n, path, not file_name)
            self.gem_batches[b.name] = b
            self.batches_created += 1
            self._gem_save_batch(b)
            return self._gem_view(b)

    def _gem_batch(self, batch_id: str) -> _GemBatch:
        name = batch_id if batch_id.startswith("batches/") else "batches/" + batch_id
        b = self.gem_batches.get(name)
        if b is None or b.deleted:
            raise GeminiApiError(404, f"Batch {name} not found.")
        self._gem_advance(b)
        return b

    def gem_get_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            return self._gem_view(self._gem_batch(batch_id))

    def gem_list_batches(self, query: dict[str, str]) -> dict[str, Any]:
        with self.lock:
            items = sorted((b for b in self.gem_batches.values() if not b.deleted), key=lambda b: b.seq, reverse=True)
            page, token = self._gem_page(items, query)
            out: dict[str, Any] = {"operations": [self._gem_view(self._gem_batch(b.name)) for b in page]}
            if token:
                out["nextPageToken"] = token
            return out

    def gem_cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            b = self._gem_batch(batch_id)
            if b.results_path is not None:
                raise GeminiApiError(400, f"Batch {b.name} has already ended ({b.state}).")
            if b.t_cancel is None:
                b.t_cancel = self.clock()
                self._gem_save_batch(b)
            return {}

    def gem_delete_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            b = self._gem_batch(batch_id)
            b.deleted = True
            self._gem_save_batch(b)
            return {}

    def gem_count_tokens(self, body: Any) -> dict[str, Any]:
        """``models.countTokens``: ``contents`` alone, or a whole ``generateContentRequest``
        (``model`` and ``contents`` required; ``systemInstruction`` counted as the batch bills it;
        top-level ``contents`` then ignored).  Request fields other than ``contents`` at the top
        level are refused as the API refuses them (it reads them as a ``generateContentRequest``
        without its model and contents)."""
        if not isinstance(body, dict):
            raise GeminiApiError(400, "Invalid JSON payload received.")
        full = None if self.cfg.gemini_count_contents_only else body.get("generateContentRequest")
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
            n = self._gem_tokens(full)
        elif isinstance(body.get("contents"), list) and body["contents"]:
            n = self._gem_tokens({"contents": body["contents"]})
        else:
            raise GeminiApiError(400, "contents is required.")
        return {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}

    # --- the lifecycle -----------------------------------------------------------------------

    def _gem_advance_all(self) -> None:
        for b in list(self.gem_batches.values()):
            self._gem_advance(b)

    def _gem_processed(self, b: _GemBatch, t: float) -> int:
        span = self.cfg.in_progress_s + self.cfg.finalizing_s
        run = t - b.t_created - self.cfg.validating_s
        if span <= 0:
            return b.n if run >= 0 else 0
        return min(b.n, max(0, int(b.n * run / span + 1e-6)))

    def _gem_advance(self, b: _GemBatch) -> None:
        if b.results_path is not None:
            return
        now = self.clock()
        t_end = b.t_created + self.cfg.validating_s + self.cfg.in_progress_s + self.cfg.finalizing_s
        deadline = b.t_created + self.cfg.completion_window_s
        if b.t_cancel is not None and b.t_cancel < t_end:
            if now >= b.t_cancel + self.cfg.cancelling_s:
                self._gem_finish(
                    b, b.t_cancel + self.cfg.cancelling_s, self._gem_processed(b, b.t_cancel), "BATCH_STATE_CANCELLED"
                )
            else:
                b.state = "BATCH_STATE_RUNNING"
        elif deadline < t_end and now >= deadline:
            self._gem_finish(b, deadline, self._gem_processed(b, deadline), "BATCH_STATE_EXPIRED")
        elif now >= t_end and deadline >= t_end:
            self._gem_finish(b, t_end, b.n, "BATCH_STATE_SUCCEEDED")
        else:
            b.state = "BATCH_STATE_PENDING" if now < b.t_created + self.cfg.validating_s else "BATCH_STATE_RUNNING"

    def _gem_finish(self, b: _GemBatch, t: float, processed: int, state: str) -> None:
        """Its results, written to disk as they are made (then shuffled there, if configured);
        for a batch of an input file, they are its generated responses file."""
        seen: BatchCache = set()  # the batch's implicit prompt cache, filled in request order
        key = b.name.split("/")[-1]
        out = LinesWriter(self.scratch / f"gemini-{key}.results.jsonl")
        for i, line in enumerate(read_jsonl(b.requests_path)):
            if i >= processed:
                break
            r = self._gem_result(b, line, seen)
            b.succeeded += "response" in r
            out.add(r)
        b.answered = len(out.offsets)
        b.results_path = out.close(f"shuffle:{self.cfg.seed}:{b.name}" if self.cfg.shuffle_output else None)
        b.t_ended, b.state = t, state
        name = "files/batch-" + key
        if b.answered and not b.inline and name not in self.gem_files:
            size, sha = size_and_sha256(b.results_path)
            gen = _GemFile(name, self._next_seq(), name, "application/jsonl", t, b.results_path, size, sha, "GENERATED")
            self.gem_files[name] = gen

    def _gem_view(self, b: _GemBatch) -> dict[str, Any]:
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

    # --- answers -----------------------------------------------------------------------------

    @staticmethod
    def _gem_text(content: Any) -> str:
        parts = content.get("parts") if isinstance(content, dict) else None
        return "".join(p.get("text", "") for p in parts or [] if isinstance(p, dict))

    def _gem_tokens(self, req: dict[str, Any]) -> int:
        msgs = [{"role": "user", "content": self._gem_text(c)} for c in req.get("contents") or []]
        system = req.get("systemInstruction") or req.get("system_instruction")
        if system:
            msgs = [{"role": "system", "content": self._gem_text(system)}, *msgs]
        return int(_counter_for(COUNTING_STAND_IN).count(msgs))

    @staticmethod
    def _gem_thoughts(model: str, req: dict[str, Any], rng: random.Random) -> int:
        """Thinking tokens of one answer: by the catalogue's rules for the model (hundreds to
        thousands by level or budget); a model the catalogue lacks thinks 4-24 tokens unless it is a Lite one."""
        spec = shipped_spec(model)
        if spec.reasoning is None:
            return rng.randint(4, 24) if "-lite" not in model and not spec.provider else 0
        effort, budget = gemini_thinking_effort(model, req)
        return reasoning_tokens(spec, effort, rng, budget)

    def _gem_result(self, b: _GemBatch, line: dict[str, Any], seen: BatchCache) -> dict[str, Any]:
        key, req = str(line.get("key")), line["request"]

        def error(code: int, status: str, message: str) -> dict[str, Any]:
            return {"key": key, "error": {"code": code, "message": message, "status": status}}

        contents = req.get("contents")
        if not isinstance(contents, list) or not contents:
            return error(3, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified")
        text = " ".join(self._gem_text(c) for c in contents)
        if FAIL_400_TRIGGER in text:
            return error(3, "INVALID_ARGUMENT", "Invalid request (emulated failure triggered by __FAIL_400__).")
        if FAIL_500_TRIGGER in text:
            return error(13, "INTERNAL", "An internal error has occurred.")
        refused = gemini_request_error(b.model, req)
        if refused is not None:
            return error(*refused)
        gen = req.get("generationConfig") or req.get("generation_config") or {}
        rng = random.Random(_hex("answer", key, json.dumps(contents, sort_keys=True), n=32))
        schema = gen.get("responseJsonSchema") or gen.get("responseSchema") or gen.get("response_json_schema")
        if self.cfg.answer_fn is not None:
            content = str(self.cfg.answer_fn(key, req))
        elif schema:
            content = json.dumps(generate_from_schema(schema, rng), ensure_ascii=False)
        else:
            content = _sentence(rng)
        enc = _counter_for(COUNTING_STAND_IN).encoding
        tokens = enc.encode_ordinary(content)
        thoughts = self._gem_thoughts(b.model, req, rng)  # thinking models report thoughtsTokenCount
        cap = gen.get("maxOutputTokens") or gen.get("max_output_tokens")
        finish = "STOP"
        if isinstance(cap, int) and thoughts + len(tokens) > cap:
            thoughts = min(thoughts, cap)
            tokens, finish = tokens[: cap - thoughts], "MAX_TOKENS"
            content = enc.decode(tokens)
        prompt = self._gem_tokens(req)
        system = req.get("systemInstruction") or req.get("system_instruction")
        cached = gemini_cached_tokens(seen, b.model, self._gem_text(system) if system else "", system_tokens)
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": len(tokens),
            "totalTokenCount": prompt + len(tokens) + thoughts,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
        }
        if cached:  # promptTokenCount includes the cached tokens
            usage["cachedContentTokenCount"] = cached
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        response = {
            "candidates": [{"content": {"parts": [{"text": content}], "role": "model"}, "finishReason": finish, "index": 0}],
            "usageMetadata": usage,
            "modelVersion": b.model,
            "responseId": _hex("resp", b.name, key, n=22),
        }
        return {"key": key, "response": response}
