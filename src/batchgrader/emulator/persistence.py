"""Optional persistence in ``data_dir`` of the OpenAI files and batches: a restarted emulator
keeps them (Anthropic's and Gemini's batches keep their own records: see their modules)."""

from __future__ import annotations

import json

from batchgrader.emulator.state import State, _Batch, _File
from batchgrader.emulator.upload import PART_SUFFIX
from batchgrader.fsio import atomic_write_bytes


class Persistence:
    """Atomic writes of every OpenAI file and batch record, and loading them back."""

    def __init__(self, state: State) -> None:
        self.state = state

    def save_file(self, f: _File) -> None:
        """Its record (its bytes are already in ``data_dir``: see ``State.blob_dir``)."""
        data_dir = self.state.data_dir
        if not data_dir:
            return
        meta = {"obj": f.obj, "seq": f.seq, "deleted": f.deleted}
        atomic_write_bytes(data_dir / "files" / f"{f.obj['id']}.json", json.dumps(meta).encode())

    def save_batch(self, b: _Batch) -> None:
        """Its record (its input is already linked in ``data_dir``: see ``Validation.validate``)."""
        data_dir = self.state.data_dir
        if not data_dir:
            return
        meta = {"obj": b.obj, "internal": b.internal()}
        atomic_write_bytes(data_dir / "batches" / f"{b.obj['id']}.json", json.dumps(meta).encode())

    def load(self) -> None:
        """The files and batches of ``data_dir`` back into the state."""
        st = self.state
        assert st.data_dir is not None
        fdir = st.data_dir / "files"
        bdir = st.data_dir / "batches"
        for p in fdir.glob(f"upload-*{PART_SUFFIX}") if fdir.exists() else []:
            p.unlink(missing_ok=True)  # an upload being received when the emulator stopped
        for p in sorted(fdir.glob("*.json")) if fdir.exists() else []:
            meta = json.loads(p.read_text())
            data_path = fdir / f"{meta['obj']['id']}.data"
            f = _File(meta["obj"], meta["seq"], data_path if data_path.exists() else None, meta.get("deleted", False))
            st.files[f.obj["id"]] = f
            st.seq = max(st.seq, f.seq)
            if f.obj["purpose"] != "batch_output":
                st.files_created += 1
        for p in sorted(bdir.glob("*.json")) if bdir.exists() else []:
            b = _batch_of(json.loads(p.read_text()))
            inp = bdir / f"{b.obj['id']}.input"
            if inp.exists():
                b.input_path = inp
            st.batches[b.obj["id"]] = b
            st.seq = max(st.seq, b.seq)
            st.batches_created += 1


def _batch_of(meta: dict) -> _Batch:
    i = meta["internal"]
    return _Batch(
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
