"""Optional persistence in ``data_dir``: a restarted emulator keeps its files and batches."""

from __future__ import annotations

import json
from pathlib import Path

from batchgrader.emulator.state import _Batch, _File, _StoreBase
from batchgrader.emulator.upload import PART_SUFFIX
from batchgrader.fsio import atomic_write_bytes


class PersistenceMixin(_StoreBase):
    """Atomic writes of every file and batch record, and loading them back."""

    def _write_atomic(self, path: Path, data: bytes) -> None:
        atomic_write_bytes(path, data)

    def _save_file(self, f: _File) -> None:
        """Its record (its bytes are already in ``data_dir``: see ``FilesMixin._blob_dir``)."""
        if not self.data_dir:
            return
        d = self.data_dir / "files"
        meta = {"obj": f.obj, "seq": f.seq, "deleted": f.deleted}
        self._write_atomic(d / f"{f.obj['id']}.json", json.dumps(meta).encode())

    def _save_batch(self, b: _Batch) -> None:
        """Its record (its input is already linked in ``data_dir``: see ``ValidationMixin._validate``)."""
        if not self.data_dir:
            return
        d = self.data_dir / "batches"
        meta = {"obj": b.obj, "internal": b.internal()}
        self._write_atomic(d / f"{b.obj['id']}.json", json.dumps(meta).encode())

    def _load(self) -> None:
        assert self.data_dir is not None
        fdir = self.data_dir / "files"
        bdir = self.data_dir / "batches"
        for p in fdir.glob(f"upload-*{PART_SUFFIX}") if fdir.exists() else []:
            p.unlink(missing_ok=True)  # an upload being received when the emulator stopped
        for p in sorted(fdir.glob("*.json")) if fdir.exists() else []:
            meta = json.loads(p.read_text())
            data_path = fdir / f"{meta['obj']['id']}.data"
            f = _File(meta["obj"], meta["seq"], data_path if data_path.exists() else None, meta.get("deleted", False))
            self.files[f.obj["id"]] = f
            self.seq = max(self.seq, f.seq)
            if f.obj["purpose"] != "batch_output":
                self.files_created += 1
        for p in sorted(bdir.glob("*.json")) if bdir.exists() else []:
            meta = json.loads(p.read_text())
            i = meta["internal"]
            b = _Batch(
                meta["obj"],
                i["seq"],
                i["t_created"],
                i["t_deadline"],
                i["t_in_progress"],
                i["t_finalizing"],
                i["t_cancelling"],
                i["forced_expire_after"],
                i["stop_count"],
                i["enqueued_tokens"],
                i.get("azure", False),
            )
            inp = bdir / f"{b.obj['id']}.input"
            if inp.exists():
                b.input_path = inp
            self.batches[b.obj["id"]] = b
            self.seq = max(self.seq, b.seq)
            self.batches_created += 1

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq
