"""The engine's :class:`~batchgrader.provider.openai_api.Provider` protocol on Anthropic's
Message Batches, so the daemon runs an Anthropic job exactly like an OpenAI one.

* ``upload`` sends nothing: Anthropic takes the requests inline in the create call.  It checks
  every line (custom_id rule, size and count limits) and names the local chunk file; the file
  id is ``anthropic-local:<absolute path>``, so it survives a restart without any extra state.
  ``find_files`` answers [], so a reconciled upload is simply staged again (free).
* ``create_batch`` reads the chunk file, converts the lines and creates the batch (sent once).
* ``find_batches`` reconciles an unknown create by the matching rule of docs/providers.md:
  batches created since the chunk file was written that hold exactly its request count, and
  whose results, once they exist, name exactly its custom_ids.  A candidate still running
  raises :class:`ProviderUnavailable` (the outcome stays unknown; the engine asks again later),
  because adopting or re-sending on a guess could pay twice or mix chunks up.  Batches known to
  belong to other chunk files are not candidates: the ones this process created, and those noted
  beside the chunk files of the same folder (``<chunk file>.anthropic-batch``, written when a
  create is answered), so that after a restart the job's other running batches are not waited for.
* ``retrieve`` / ``cancel`` / ``list_batches`` give :class:`BatchInfo` in the job model's
  statuses; an ended batch's ``output_file_id`` is ``anthropic-results:<batch id>``, and
  ``download`` writes its results as OpenAI-shaped lines (atomically).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchgrader.fsio import atomic_write_bytes
from batchgrader.provider.anthropic_api import (
    MAX_BATCH_BYTES,
    MAX_REQUESTS,
    AnthropicBatch,
    AnthropicProvider,
    _batch,
    custom_id_problem,
    to_anthropic_request,
    to_openai_result_line,
)
from batchgrader.provider.openai_api import (
    READ_RETRIES,
    BatchInfo,
    BatchPage,
    FileInfo,
    ProviderRejected,
    ProviderUnavailable,
    RequestCounts,
)

LOCAL_PREFIX = "anthropic-local:"
RESULTS_PREFIX = "anthropic-results:"
CLOCK_SKEW_S = 60
#: beside a chunk file, the id of the batch created for it (written once the create is answered)
BATCH_NOTE_SUFFIX = ".anthropic-batch"


def _batch_note(path: Path) -> Path:
    return path.with_name(path.name + BATCH_NOTE_SUFFIX)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]


def _info(b: AnthropicBatch, input_file_id: str = "") -> BatchInfo:
    status = b.job_status
    done = b.is_terminal
    return BatchInfo(
        id=b.id,
        status=status,
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        completion_window="24h",
        created_at=b.created_at,
        output_file_id=RESULTS_PREFIX + b.id if done else None,
        request_counts=RequestCounts(
            total=b.total, completed=b.succeeded, failed=b.errored + b.canceled + b.expired if done else b.errored
        ),
        completed_at=b.ended_at if status == "completed" else None,
        cancelled_at=b.ended_at if status == "cancelled" else None,
        expired_at=b.ended_at if status == "expired" else None,
    )


class AnthropicBatchProvider:
    """:class:`Provider` for Anthropic (see the module docstring)."""

    def __init__(
        self,
        api_key: str | None,
        base_url: str | None = None,
        *,
        timeout: float = 120.0,
        max_retries: int = READ_RETRIES,
        api_version: str | None = None,
    ):
        self.api = AnthropicProvider(api_key, base_url, timeout=timeout, max_retries=max_retries, api_version=api_version)
        self._inputs: dict[str, str] = {}  # batch id -> input file id (this process only)

    def __repr__(self) -> str:
        return f"AnthropicBatchProvider({self.api!r})"

    def __reduce__(self) -> Any:
        raise TypeError("AnthropicBatchProvider holds an API key and cannot be pickled")

    # --- files (local: nothing is uploaded) --------------------------------------------------

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        p = Path(path).resolve()
        data = p.read_bytes()
        lines = _lines(p)
        problem = None
        if not 1 <= len(lines) <= MAX_REQUESTS:
            problem = f"{filename}: a Message Batch holds 1 to {MAX_REQUESTS:,} requests, not {len(lines):,}"
        elif len(data) > MAX_BATCH_BYTES:
            problem = f"{filename}: a Message Batch holds at most 256 MB; this chunk is {len(data):,} bytes"
        else:
            for line in lines:
                problem = custom_id_problem(str(line.get("custom_id")))
                if problem:
                    problem += "; choose an id_column whose values fit, or leave id_column unset"
                    break
        if problem:
            raise ProviderRejected("stage requests", 400, problem, type="invalid_request_error")
        return FileInfo(
            id=LOCAL_PREFIX + str(p),
            filename=filename,
            bytes=len(data),
            purpose="batch",
            created_at=int(p.stat().st_mtime),
            status="processed",
        )

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        return []

    def delete_file(self, file_id: str) -> bool:
        if file_id.startswith(RESULTS_PREFIX):
            try:
                self.api._call("delete batch", lambda: self.api._client.messages.batches.delete(file_id[len(RESULTS_PREFIX) :]))
            except ProviderRejected:
                return False
        return True

    def _path(self, input_file_id: str) -> Path:
        if not input_file_id.startswith(LOCAL_PREFIX):
            raise ProviderRejected("create batch", 400, f"not an Anthropic staged file: {input_file_id}")
        return Path(input_file_id[len(LOCAL_PREFIX) :])

    # --- batches -----------------------------------------------------------------------------

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Any = None,
    ) -> BatchInfo:
        path = self._path(input_file_id)
        requests = [to_anthropic_request(line) for line in _lines(path)]
        b = self.api.create(requests)
        self._inputs[b.id] = input_file_id
        atomic_write_bytes(_batch_note(path), b.id.encode())  # for find_batches after a restart
        return _info(b, input_file_id)

    def _learn_siblings(self, path: Path) -> None:
        """The batches created for the chunk files beside ``path`` (their notes), so that a
        process that has just started does not take a running batch of another chunk of the
        job for a candidate of this one and wait for it to end."""
        for note in path.parent.glob("*" + BATCH_NOTE_SUFFIX):
            try:
                batch_id = note.read_text(encoding="utf-8").strip()
            except OSError:
                continue
            source = note.with_name(note.name[: -len(BATCH_NOTE_SUFFIX)])
            if batch_id and batch_id not in self._inputs:
                self._inputs[batch_id] = LOCAL_PREFIX + str(source)

    def find_batches(
        self, input_file_id: str | None = None, metadata: Any = None, created_after: int | None = None
    ) -> list[BatchInfo]:
        if input_file_id is None or not input_file_id.startswith(LOCAL_PREFIX):
            return []
        path = self._path(input_file_id)
        lines = _lines(path)
        wanted = {str(line["custom_id"]) for line in lines}
        self._learn_siblings(path)
        since = int(path.stat().st_mtime) - CLOCK_SKEW_S
        if created_after is not None:
            since = max(since, created_after - CLOCK_SKEW_S)
        found: list[BatchInfo] = []
        for b in self.api.list_batches():
            if b.created_at < since or b.total != len(wanted):
                continue
            known = self._inputs.get(b.id)
            if known is not None:
                if known == input_file_id:
                    found.append(_info(b, input_file_id))
                continue
            if not b.is_terminal:
                raise ProviderUnavailable(
                    "find batches", 1, f"batch {b.id} may be this chunk's; its custom_ids can be checked once it has ended"
                )
            if {line["custom_id"] for line in self.api.results(b.id)} == wanted:
                self._inputs[b.id] = input_file_id
                found.append(_info(b, input_file_id))
        found.sort(key=lambda b: (b.created_at, b.id))
        return found

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One request line through the synchronous API (``client.messages.create``, sent once)
        with the params a batch would carry: the answer as an OpenAI batch output line."""
        request = to_anthropic_request(line)
        msg = self.api._call("messages.create", lambda: self.api.create_message(request["params"]), idempotent=False)
        item = {"custom_id": request["custom_id"], "result": {"type": "succeeded", "message": msg.model_dump(mode="json")}}
        return to_openai_result_line(item)

    def retrieve(self, batch_id: str) -> BatchInfo:
        return _info(self.api.retrieve(batch_id), self._inputs.get(batch_id, ""))

    def cancel(self, batch_id: str) -> BatchInfo:
        return _info(self.api.cancel(batch_id), self._inputs.get(batch_id, ""))

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        kwargs: dict[str, Any] = {"limit": limit}
        if after:
            kwargs["after_id"] = after
        page = self.api._call("list batches", lambda: self.api._client.messages.batches.list(**kwargs))
        items = tuple(_info(_batch(o), self._inputs.get(o.id, "")) for o in page.data)
        return BatchPage(items, bool(page.has_more), items[-1].id if items else None)

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        if not file_id.startswith(RESULTS_PREFIX):
            raise ProviderRejected("download", 404, f"not an Anthropic results id: {file_id}")
        data = b"".join(
            json.dumps(line, ensure_ascii=False).encode("utf-8") + b"\n"
            for line in self.api.results(file_id[len(RESULTS_PREFIX) :])
        )
        atomic_write_bytes(Path(dest_path), data)
        return len(data)
