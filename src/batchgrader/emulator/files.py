"""The Files API: upload, list, retrieve, delete, content."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from batchgrader.emulator.common import ApiError, _now_int
from batchgrader.emulator.config import THIRTY_DAYS, UPLOAD_PURPOSES
from batchgrader.emulator.state import _File, _StoreBase
from batchgrader.emulator.upload import FileBody
from batchgrader.fsio import atomic_write

#: Azure OpenAI's shortest ``expires_after`` for batch files: 14 days (learn.microsoft.com batch how-to)
AZURE_MIN_EXPIRY_S = 14 * 86_400


class FilesMixin(_StoreBase):
    """Files, and the list paging the Batches API shares."""

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
            if not filename.endswith(".jsonl"):
                raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file", code=None)
            size = data.stat().st_size if isinstance(data, Path) else len(data)
            if size > self.cfg.max_batch_file_bytes:
                raise ApiError(400, "File is too large.", param="file", code=None)
        with self.lock:
            now = self.clock()
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
            f = self._add_file(filename, data, purpose, created, expires_at)
            self.files_created += 1
            return dict(f.obj)

    def _azure_file_cap(self) -> None:
        cap = self.cfg.azure_files_without_expiry
        live = sum(
            1 for f in self.files.values() if not f.deleted and f.obj["purpose"] == "batch" and f.obj["expires_at"] is None
        )
        if live >= cap:
            raise ApiError(
                400,
                f"This resource already holds {cap} batch files without an expiration, the most allowed. "
                "Set expires_after on uploads (up to 10,000 files), or delete files. (emulated wording)",
                param="file",
                code="quota_exceeded",
            )

    def _blob_dir(self, kind: str) -> Path:
        """Where files' bytes (``files``) and batches' inputs (``batches``) are kept: in
        ``data_dir`` (kept across restarts), else in this process's scratch folder."""
        d = (self.data_dir or self.scratch) / kind
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _add_file(
        self, filename: str, data: bytes | memoryview | Path, purpose: str, created: int, expires_at: int | None
    ) -> _File:
        """A new file of ``data``: bytes, or a finished file of this process (moved into place)."""
        fid = "file-" + uuid.uuid4().hex[:24]
        path = self._blob_dir("files") / f"{fid}.data"
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
        f = _File(obj, self._next_seq(), path)
        self.files[fid] = f
        self._save_file(f)
        return f

    def _get_file(self, file_id: str) -> _File:
        f = self.files.get(file_id)
        if f is None or f.deleted:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return f

    def retrieve_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            return dict(self._get_file(file_id).obj)

    def file_content(self, file_id: str) -> bytes:
        with self.lock:
            self._advance_all()
            return self._get_file(file_id).content()

    def file_body(self, file_id: str) -> FileBody:
        """A file's content, to be sent as it is read (opened now: a delete meanwhile does not cut it)."""
        with self.lock:
            self._advance_all()
            return FileBody.open(self._get_file(file_id).path)

    def delete_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            f = self._get_file(file_id)
            f.deleted = True
            self._save_file(f)
            if f.path is not None:
                f.path.unlink(missing_ok=True)  # a batch that read it keeps its own link
            f.path = None
            return {"id": file_id, "object": "file", "deleted": True}

    def list_files(self, query: dict[str, str]) -> dict[str, Any]:
        limit = self._int_param(query, "limit", 10_000, 1, 10_000)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
        with self.lock:
            self._advance_all()
            items = [f for f in self.files.values() if not f.deleted]
            if query.get("purpose"):
                items = [f for f in items if f.obj["purpose"] == query["purpose"]]
            items.sort(key=lambda f: f.seq, reverse=(order == "desc"))
            return self._page([f.obj for f in items], self._cursor(query), limit)

    # --- batches ---------------------------------------------------------------------------

    @staticmethod
    def _int_param(query: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
        raw = query.get(name)
        if raw is None or raw == "":
            return default
        try:
            v = int(raw)
        except ValueError:
            raise ApiError(400, f"Invalid type for '{name}': expected an integer.", param=name, code="invalid_type") from None
        if not lo <= v <= hi:
            raise ApiError(
                400, f"Invalid '{name}': integer must be between {lo} and {hi}.", param=name, code="integer_out_of_range"
            )
        return v

    def _cursor(self, query: dict[str, str]) -> str | None:
        """The ``after`` cursor, unless this emulated provider ignores it (``ignore_after_cursor``)."""
        return None if self.cfg.ignore_after_cursor else query.get("after")

    @staticmethod
    def _page(objs: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
        start = 0
        if after:
            ids = [o["id"] for o in objs]
            start = ids.index(after) + 1 if after in ids else len(objs)
        data = [dict(o) for o in objs[start : start + limit]]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + limit < len(objs),
        }
