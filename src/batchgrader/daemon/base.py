"""Small helpers the engine's step modules share: ``_e`` (an event to append), ``stamp``, the
``BatchStatusChanged`` of a batch read back, a chunk's custom ids, the result settings.

The shared state and plumbing (``emit``, settings, clocks, the schedule) is the explicit
:class:`batchgrader.daemon.context.Context` every step object receives.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from array import array
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.core.config import Profile
from batchgrader.core.events import new_event
from batchgrader.core.state import ChunkState
from batchgrader.pipeline.splitting import custom_ids_in
from batchgrader.store.eventstore import NewEvent

log = logging.getLogger("batchgrader.engine")

CLOCK_SKEW_SLACK = 600  # s, between our clock and the provider's, for created_after


def _e(type_: str, **payload: Any) -> NewEvent:
    """A new event of a declared type, its payload checked against the declaration."""
    return new_event(type_, **payload)


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


def _status_event(c: ChunkState, b: Any) -> NewEvent | None:
    """A BatchStatusChanged for what the provider says of ``c``'s batch, or None if nothing changed
    (always one for a batch not read back since its create reply: that it was read is recorded)."""
    counts = dataclasses.asdict(b.request_counts)
    same = (b.status, counts, b.output_file_id, b.error_file_id) == (
        c.status,
        c.request_counts,
        c.output_file_id,
        c.error_file_id,
    )
    if same and c.read_back:
        return None
    return _e(
        "BatchStatusChanged",
        chunk=c.index,
        batch_id=b.id,
        status=b.status,
        request_counts=counts,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        errors=[dataclasses.asdict(x) for x in b.errors],
    )


def _short(payload: dict[str, Any]) -> str:
    s = json.dumps(
        {k: v for k, v in payload.items() if k not in ("rows", "custom_ids", "chunks", "row_errors")},
        ensure_ascii=False,
        default=str,
    )
    return s if len(s) < 300 else s[:297] + "..."


def _lines(path: Path) -> Iterable[bytes]:
    with open(path, "rb") as f:
        yield from f


def _load_token_sizes(path: Path) -> tuple[array, array]:
    data = array("Q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    half = len(data) // 2
    return data[:half], data[half:]


def chunk_custom_ids(c: ChunkState) -> list[str]:
    if c.custom_ids is not None:
        return list(c.custom_ids)
    return custom_ids_in(Path(c.path))


def result_settings(profile: Profile) -> dict[str, Any]:
    """The settings that shape the result file, fixed when the job is prepared."""
    return {
        "output_column": profile.output_column,
        "response_format": profile.response_format,
        "id_column": profile.id_column,
        "csv_formula_guard": profile.csv_formula_guard,
        "sheet": profile.get("sheet"),
        "encoding": profile.get("encoding", "utf-8"),
        **({"skip_empty": True} if profile.get("skip_empty") else {}),  # empty rows were left out (empty_input)
        # read by `bgctl report` only; kept when set, so the settings of other jobs stay as they were
        **{k: profile.get(k) for k in ("reference_column", "reference_field", "group_column") if profile.get(k) is not None},
        **({"samples": profile.samples} if profile.get("samples", 1) != 1 else {}),  # requests per row: the vote
    }
