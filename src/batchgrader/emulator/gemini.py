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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.emulator.answers import _counter_for
from batchgrader.emulator.common import ApiError, _hex, int_param
from batchgrader.emulator.config import FAIL_400_TRIGGER, FAIL_500_TRIGGER, EmulatorConfig
from batchgrader.emulator.prompt_cache import BatchCache, gemini_cached_tokens, system_tokens
from batchgrader.emulator.rules import gemini_request_error, gemini_thinking_effort, reasoning_tokens
from batchgrader.emulator.schema_values import generate_from_schema, sentence
from batchgrader.emulator.spool import read_jsonl, size_and_sha256
from batchgrader.emulator.state import State
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


def _page(items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
    """A page of ``items`` by ``pageSize`` and ``pageToken`` (an offset), and the next token."""
    size = int_param({"n": query.get("pageSize", "")}, "n", 10, 1, 1000)
    start = int(query["pageToken"]) if query.get("pageToken", "").isdigit() else 0
    page = items[start : start + size]
    return page, str(start + size) if start + size < len(items) else None


class GeminiFiles:
    """Gemini's Files API over the shared state: resumable uploads, list, get, delete, and the
    download of generated files; its files are its own (``files``).  ``advance`` brings every
    batch up to the clock before a read (``GeminiBatches.advance_all``: a batch's responses
    file exists once it has ended)."""

    def __init__(self, state: State, advance: Callable[[], None]) -> None:
        self.state = state
        self.advance = advance
        self.files: dict[str, _GemFile] = {}
        self.uploads: dict[str, dict[str, Any]] = {}

    def _save(self, f: _GemFile) -> None:
        """Its record (its bytes are already in place: see ``gem_upload_chunk``)."""
        if self.state.data_dir and f.source == "UPLOADED":
            d = self.state.data_dir / "gemini" / "files"
            rec = {"name": f.name, "seq": f.seq, "display_name": f.display_name, "mime_type": f.mime_type}
            rec |= {"t_created": f.t_created, "deleted": f.deleted, "size": f.size, "sha256": f.sha256}
            atomic_write_bytes(d / f"{f.name.split('/')[-1]}.json", json.dumps(rec).encode("utf-8"))

    def load(self) -> None:
        root = self.state.data_dir / "gemini" if self.state.data_dir else None
        if root is None or not root.exists():
            return
        for p in sorted((root / "files").glob("*.json")):
            r = json.loads(p.read_text(encoding="utf-8"))
            data = p.with_suffix(".data")
            size, sha = (r["size"], r["sha256"]) if "sha256" in r else size_and_sha256(data)
            f = _GemFile(r["name"], r["seq"], r["display_name"], r["mime_type"], r["t_created"], data, size, sha)
            f.deleted = r["deleted"]
            self.files[f.name] = f
            self.state.seq = max(self.state.seq, f.seq)
            self.state.files_created += 1

    def view(self, f: _GemFile) -> dict[str, Any]:
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

    def get(self, file_id: str) -> _GemFile:
        name = file_id if file_id.startswith("files/") else "files/" + file_id
        self.advance()
        f = self.files.get(name)
        if f is None or f.deleted:
            raise GeminiApiError(403, f"You do not have permission to access the File {file_id} or it may not exist.")
        return f

    def upload_start(self, body: Any, headers: Any, upload_root: str) -> tuple[dict[str, Any], dict[str, str]]:
        meta: dict[str, Any] = body["file"] if isinstance(body, dict) and isinstance(body.get("file"), dict) else {}
        size = int(headers.get("X-Goog-Upload-Header-Content-Length") or _get(meta, "sizeBytes", "size_bytes") or 0)
        if size > GEMINI_MAX_FILE_BYTES:
            raise GeminiApiError(400, "File size exceeds the 2 GB limit.")
        mime = (
            headers.get("X-Goog-Upload-Header-Content-Type") or _get(meta, "mimeType", "mime_type") or "application/octet-stream"
        )
        upload_id = uuid.uuid4().hex
        with self.state.lock:
            self.uploads[upload_id] = {
                "size": size,
                "display_name": _get(meta, "displayName", "display_name") or "",
                "mime": mime,
                "path": self.state.scratch / f"gemini-upload-{upload_id}{PART_SUFFIX}",
                "received": 0,
            }
        url = f"{upload_root}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable"
        return {}, {"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active", "X-Goog-Upload-Chunk-Granularity": "8388608"}

    def upload_chunk(
        self, upload_id: str, command: str, offset: int, data: bytes | Path
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A chunk of a resumable upload (its bytes, or the file it was received into), appended
        to the session's file on disk."""
        with self.state.lock:
            up = self.uploads.get(upload_id)
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
            del self.uploads[upload_id]
            if up["received"] != up["size"]:
                up["path"].unlink(missing_ok=True)
                raise GeminiApiError(400, f"Upload size {up['received']} does not match the declared {up['size']}.")
            name = "files/" + uuid.uuid4().hex[:12]
            path = self.state.blob_dir("gemini/files") / f"{name.split('/')[-1]}.data"
            shutil.move(up["path"], path)
            size, sha = size_and_sha256(path)
            f = _GemFile(name, self.state.next_seq(), up["display_name"], up["mime"], self.state.clock(), path, size, sha)
            self.files[f.name] = f
            self.state.files_created += 1
            self._save(f)
            return {"file": self.view(f)}, {"X-Goog-Upload-Status": "final"}

    def list_files(self, query: dict[str, str]) -> dict[str, Any]:
        with self.state.lock:
            self.advance()
            items = sorted((f for f in self.files.values() if not f.deleted), key=lambda f: f.seq, reverse=True)
            page, token = _page(items, query)
            out: dict[str, Any] = {"files": [self.view(f) for f in page]}
            if token:
                out["nextPageToken"] = token
            return out

    def get_file(self, file_id: str) -> dict[str, Any]:
        with self.state.lock:
            return self.view(self.get(file_id))

    def delete_file(self, file_id: str) -> dict[str, Any]:
        with self.state.lock:
            f = self.get(file_id)
            f.deleted = True
            self._save(f)
            return {}

    def download(self, file_id: str) -> FileBody:
        with self.state.lock:
            f = self.get(file_id)
            if f.source != "GENERATED":
                raise GeminiApiError(400, "Only generated files can be downloaded; uploaded files cannot.")
            return FileBody.open(f.path)

    def add_generated(self, name: str, path: Path, t: float) -> None:
        """A batch's generated responses file (once: a later call for the same name does nothing)."""
        if name not in self.files:
            size, sha = size_and_sha256(path)
            gen = _GemFile(name, self.state.next_seq(), name, "application/jsonl", t, path, size, sha, "GENERATED")
            self.files[name] = gen


# --- answers ---------------------------------------------------------------------------------


def gem_text(content: Any) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    return "".join(p.get("text", "") for p in parts or [] if isinstance(p, dict))


def gem_tokens(req: dict[str, Any]) -> int:
    """A request's prompt tokens (system instruction and contents), by the tiktoken stand-in."""
    msgs = [{"role": "user", "content": gem_text(c)} for c in req.get("contents") or []]
    system = req.get("systemInstruction") or req.get("system_instruction")
    if system:
        msgs = [{"role": "system", "content": gem_text(system)}, *msgs]
    return int(_counter_for(COUNTING_STAND_IN).count(msgs))


def _thoughts(model: str, req: dict[str, Any], rng: random.Random) -> int:
    """Thinking tokens of one answer: by the catalogue's rules for the model (hundreds to
    thousands by level or budget); a model the catalogue lacks thinks 4-24 tokens unless it is a Lite one."""
    spec = shipped_spec(model)
    if spec.reasoning is None:
        return rng.randint(4, 24) if "-lite" not in model and not spec.provider else 0
    effort, budget = gemini_thinking_effort(model, req)
    return reasoning_tokens(spec, effort, rng, budget)


def _refusal(model: str, req: dict[str, Any]) -> tuple[int, str, str] | None:
    """Why a request is refused when it is processed (gRPC code, status, message), or None."""
    contents = req.get("contents")
    if not isinstance(contents, list) or not contents:
        return 3, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified"
    text = " ".join(gem_text(c) for c in contents)
    if FAIL_400_TRIGGER in text:
        return 3, "INVALID_ARGUMENT", "Invalid request (emulated failure triggered by __FAIL_400__)."
    if FAIL_500_TRIGGER in text:
        return 13, "INTERNAL", "An internal error has occurred."
    return gemini_request_error(model, req)


def _text(cfg: EmulatorConfig, key: str, req: dict[str, Any], gen: dict[str, Any], rng: random.Random) -> str:
    schema = gen.get("responseJsonSchema") or gen.get("responseSchema") or gen.get("response_json_schema")
    if cfg.answer_fn is not None:
        return str(cfg.answer_fn(key, req))
    if schema:
        return json.dumps(generate_from_schema(schema, rng), ensure_ascii=False)
    return sentence(rng)


def gemini_result(cfg: EmulatorConfig, model: str, batch_name: str, line: dict[str, Any], seen: BatchCache) -> dict[str, Any]:
    """The result line of ``line`` (``{"key", "request"}``) of batch ``batch_name``: its
    ``response``, or its ``error`` (a ``google.rpc.Status``); ``seen`` is the batch's prompt cache."""
    key, req = str(line.get("key")), line["request"]
    refused = _refusal(model, req)
    if refused is not None:
        code, status, message = refused
        return {"key": key, "error": {"code": code, "message": message, "status": status}}
    gen = req.get("generationConfig") or req.get("generation_config") or {}
    rng = random.Random(_hex("answer", key, json.dumps(req["contents"], sort_keys=True), n=32))
    content = _text(cfg, key, req, gen, rng)
    enc = _counter_for(COUNTING_STAND_IN).encoding
    tokens = enc.encode_ordinary(content)
    thoughts = _thoughts(model, req, rng)  # thinking models report thoughtsTokenCount
    cap = gen.get("maxOutputTokens") or gen.get("max_output_tokens")
    finish = "STOP"
    if isinstance(cap, int) and thoughts + len(tokens) > cap:
        thoughts = min(thoughts, cap)
        tokens, finish = tokens[: cap - thoughts], "MAX_TOKENS"
        content = enc.decode(tokens)
    response = {
        "candidates": [{"content": {"parts": [{"text": content}], "role": "model"}, "finishReason": finish, "index": 0}],
        "usageMetadata": _usage(model, req, len(tokens), thoughts, seen),
        "modelVersion": model,
        "responseId": _hex("resp", batch_name, key, n=22),
    }
    return {"key": key, "response": response}


def _usage(model: str, req: dict[str, Any], answer_tokens: int, thoughts: int, seen: BatchCache) -> dict[str, Any]:
    prompt = gem_tokens(req)
    system = req.get("systemInstruction") or req.get("system_instruction")
    cached = gemini_cached_tokens(seen, model, gem_text(system) if system else "", system_tokens)
    usage: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": answer_tokens,
        "totalTokenCount": prompt + answer_tokens + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if cached:  # promptTokenCount includes the cached tokens
        usage["cachedContentTokenCount"] = cached
        usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": cached}]
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage
