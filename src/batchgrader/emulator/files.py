"""The OpenAI (and Azure OpenAI) Files API: upload, list, retrieve, delete, content."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchgrader.emulator.common import ApiError, _now_int, int_param, page
from batchgrader.emulator.config import THIRTY_DAYS, UPLOAD_PURPOSES, EmulatorConfig
from batchgrader.emulator.persistence import Persistence
from batchgrader.emulator.state import State, _File
from batchgrader.emulator.upload import FileBody
from batchgrader.fsio import atomic_write

#: Azure OpenAI's shortest ``expires_after`` for batch files: 14 days (learn.microsoft.com batch how-to)
AZURE_MIN_EXPIRY_S = 14 * 86_400


class Files:
    """The OpenAI (and Azure) Files API over the shared state: upload, list, retrieve, delete,
    content; and the files a finished batch writes (``add_file``).  ``advance`` brings every
    batch up to the clock before a read (the lifecycle's ``Batches.advance_all``), so that a
    batch's result files exist when its end is due."""

    def __init__(self, state: State, persist: Persistence, advance: Callable[[], None]) -> None:
        self.state = state
        self.persist = persist
        self.advance = advance

    def create_file(
        self,
        filename: str,
        data: bytes | memoryview | Path,
        purpose: str | None,
        expires_after: dict[str, Any],
        azure: bool = False,
    ) -> dict[str, Any]:
        """Upload a file: its bytes, or a file the upload was received into (moved into place).  ``azure``: through Azure OpenAI's routes, where a batch file has no
        default expiry, ``expires_after`` takes 14 to 30 days, and a resource holds at most
        ``azure_files_without_expiry`` live batch files without one."""
        if not purpose:
            raise ApiError(400, "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter")
        if purpose not in UPLOAD_PURPOSES:
            raise ApiError(
                400,
                f"Invalid value for 'purpose': expected one of {', '.join(repr(p) for p in UPLOAD_PURPOSES)}.",
                param="purpose",
                code="invalid_value",
            )
        if purpose == "batch":
            # a name with another extension is refused; one without (the SDK names raw bytes
            # "upload", as bespokelabs-curator sends its batch file) is accepted, as OpenAI does
            if "." in filename.rsplit("/", 1)[-1] and not filename.endswith(".jsonl"):
                raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file", code=None)
            size = data.stat().st_size if isinstance(data, Path) else len(data)
            if size > self.state.cfg.max_batch_file_bytes:
                raise ApiError(400, "File is too large.", param="file", code=None)
        st = self.state
        with st.lock:
            now = st.clock()
            created = _now_int(now)
            seconds = expires_after.get("seconds")
            expires_at: int | None = None
            if seconds is not None:
                try:
                    seconds = int(seconds)
                except (TypeError, ValueError):
                    raise ApiError(
                        400,
                        "Invalid type for 'expires_after.seconds': expected an integer.",
                        param="expires_after.seconds",
                        code="invalid_type",
                    ) from None
                low = AZURE_MIN_EXPIRY_S if azure else 3600
                if not low <= seconds <= 2592000:
                    raise ApiError(
                        400,
                        f"Invalid 'expires_after.seconds': must be between {low} and 2592000.",
                        param="expires_after.seconds",
                        code="invalid_value",
                    )
                expires_at = created + seconds
            elif purpose == "batch" and azure:
                self._azure_file_cap()
            elif purpose == "batch":
                expires_at = created + THIRTY_DAYS
            f = self.add_file(filename, data, purpose, created, expires_at)
            self.state.files_created += 1
            return dict(f.obj)

    def _azure_file_cap(self) -> None:
        cap = self.state.cfg.azure_files_without_expiry
        live = sum(
            1 for f in self.state.files.values() if not f.deleted and f.obj["purpose"] == "batch" and f.obj["expires_at"] is None
        )
        if live >= cap:
            raise ApiError(
                400,
                f"This resource already holds {cap} batch files without an expiration, the most allowed. "
                "Set expires_after on uploads (up to 10,000 files), or delete files. (emulated wording)",
                param="file",
                code="quota_exceeded",
            )

    def add_file(
        self, filename: str, data: bytes | memoryview | Path, purpose: str, created: int, expires_at: int | None
    ) -> _File:
        """A new file of ``data``: bytes, or a finished file of this process (moved into place)."""
        fid = "file-" + uuid.uuid4().hex[:24]
        path = self.state.blob_dir("files") / f"{fid}.data"
        if isinstance(data, Path):
            shutil.move(data, path)  # a rename: received in this folder (routing._Handler._receive)
        else:
            view = data
            atomic_write(path, lambda fh: None if fh.write(view) else None)
        obj = {
            "id": fid,
            "object": "file",
            "bytes": path.stat().st_size,
            "created_at": created,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": expires_at,
            "status_details": None,
        }
        f = _File(obj, self.state.next_seq(), path)
        self.state.files[fid] = f
        self.persist.save_file(f)
        return f

    def get(self, file_id: str) -> _File:
        f = self.state.files.get(file_id)
        if f is None or f.deleted:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return f

    def retrieve_file(self, file_id: str) -> dict[str, Any]:
        with self.state.lock:
            self.advance()
            return dict(self.get(file_id).obj)

    def file_content(self, file_id: str) -> bytes:
        with self.state.lock:
            self.advance()
            return self.get(file_id).content()

    def file_body(self, file_id: str) -> FileBody:
        """A file's content, to be sent as it is read (opened now: a delete meanwhile does not cut it)."""
        with self.state.lock:
            self.advance()
            return FileBody.open(self.get(file_id).path)

    def delete_file(self, file_id: str) -> dict[str, Any]:
        with self.state.lock:
            f = self.get(file_id)
            f.deleted = True
            self.persist.save_file(f)
            if f.path is not None:
                f.path.unlink(missing_ok=True)  # a batch that read it keeps its own link
            f.path = None
            return {"id": file_id, "object": "file", "deleted": True}

    def list_files(self, query: dict[str, str]) -> dict[str, Any]:
        limit = int_param(query, "limit", 10_000, 1, 10_000)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
        with self.state.lock:
            self.advance()
            items = [f for f in self.state.files.values() if not f.deleted]
            if query.get("purpose"):
                items = [f for f in items if f.obj["purpose"] == query["purpose"]]
            items.sort(key=lambda f: f.seq, reverse=(order == "desc"))
            return page([f.obj for f in items], cursor(self.state.cfg, query), limit)


def cursor(cfg: EmulatorConfig, query: dict[str, str]) -> str | None:
    """The ``after`` cursor, unless this emulated provider ignores it (``ignore_after_cursor``)."""
    return None if cfg.ignore_after_cursor else query.get("after")
