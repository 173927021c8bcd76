"""Reconciliation over any :class:`~batchgrader.provider.protocol.Provider` (never submit twice):
after an ambiguous write, list and match before sending again; and the list round that refreshes
many batches with one call per 100.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batchgrader.provider.protocol import BatchInfo, FileInfo, OutcomeUnknown, Provider, ProviderUnavailable

log = logging.getLogger("batchgrader.provider.openai_api")


def list_statuses(provider: Provider, wanted: set[str], max_pages: int | None = None) -> dict[str, BatchInfo]:
    """The current state of every batch in ``wanted`` from paged ``batches.list`` calls (newest
    first, 100 a page): one call per 100 batches instead of one ``retrieve`` per batch.  Stops
    once every wanted batch was seen, at the last page, or after ``max_pages`` (default: two
    pages more than the wanted batches fill; batches in flight are among the newest).  Batches
    not found are absent from the answer (the caller retrieves them)."""
    found: dict[str, BatchInfo] = {}
    after: str | None = None
    pages = 0
    limit = max_pages if max_pages is not None else len(wanted) // 100 + 3
    while len(found) < len(wanted) and pages < limit:
        page = provider.list_batches(limit=100, after=after)
        pages += 1
        for b in page.items:
            if b.id in wanted:
                found[b.id] = b
        if not page.has_more or page.last_id is None:
            break
        after = page.last_id
    return found


def batch_matches(b: BatchInfo, input_file_id: str | None, metadata: Mapping[str, str] | None) -> bool:
    """A batch is ours when its input file and every ``metadata`` pair match.  A provider that
    drops metadata (the batch comes back with none) is matched on the input file alone, so a
    batch that exists is never taken for absent (one uploaded file backs one chunk attempt)."""
    if input_file_id is not None and b.input_file_id != input_file_id:
        return False
    if metadata:
        if not b.metadata and input_file_id is not None:
            return True  # metadata dropped by the provider: the input file id decides
        for k, v in metadata.items():
            if b.metadata.get(k) != v:
                return False
    return True


# ----------------------------------------------------------------------------------------------
# reconciliation (never submit twice)
# ----------------------------------------------------------------------------------------------

Outcome = Literal["created", "adopted", "not_created"]


@dataclass(frozen=True)
class BatchSubmission:
    """Result of :func:`create_batch_reconciled`.

    ``created``: the one call succeeded.  ``adopted``: the call's outcome was unknown and a
    matching batch was found (``batch``; further matches in ``duplicates``, oldest first — the
    caller should cancel them).  ``not_created``: the outcome was unknown and the listing found
    nothing; the caller may retry (with a fresh intent record), never blindly in a loop."""

    outcome: Outcome
    batch: BatchInfo | None
    duplicates: tuple[BatchInfo, ...] = ()
    cause: str | None = None


@dataclass(frozen=True)
class UploadResult:
    outcome: Outcome
    file: FileInfo | None
    duplicates: tuple[FileInfo, ...] = ()
    cause: str | None = None


def reconcile_batch(
    provider: Provider,
    input_file_id: str,
    metadata: Mapping[str, str] | None = None,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    cause: str | None = None,
) -> BatchSubmission:
    """List and match only (no create): ``adopted`` (oldest match; the rest in ``duplicates``)
    or ``not_created``.  With ``settle_s`` > 0, an empty listing is repeated once after that
    wait (a request may still have been in flight).  A failing listing raises
    :class:`ProviderUnavailable`: the outcome is still unknown, run this again later."""
    found = provider.find_batches(input_file_id=input_file_id, metadata=metadata, created_after=created_after)
    if not found and settle_s > 0:
        sleep(settle_s)
        found = provider.find_batches(input_file_id=input_file_id, metadata=metadata, created_after=created_after)
    if not found:
        return BatchSubmission("not_created", None, (), cause)
    return BatchSubmission("adopted", found[0], tuple(found[1:]), cause)


def create_batch_reconciled(
    provider: Provider,
    input_file_id: str,
    endpoint: str | None = None,
    completion_window: str = "24h",
    metadata: Mapping[str, str] | None = None,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> BatchSubmission:
    """Try ``create_batch`` once; on :class:`OutcomeUnknown` list and match by
    ``input_file_id`` and ``metadata`` (:func:`reconcile_batch`) and adopt the oldest match.
    Only when the listing finds nothing is ``not_created`` reported; the caller may then send
    again (after recording a new attempt), never blindly in a loop.

    Raises :class:`ProviderRejected` (definitely not created) and :class:`OutcomeUnknown` when
    the create was ambiguous *and* the listing failed too — the caller must then call
    :func:`reconcile_batch` until it answers, and must not call this function again."""
    try:
        return BatchSubmission("created", provider.create_batch(input_file_id, endpoint, completion_window, metadata))
    except OutcomeUnknown as exc:
        first = exc
        log.warning("batches.create outcome unknown (%s); reconciling by listing", exc.cause)
    try:
        return reconcile_batch(
            provider, input_file_id, metadata, created_after=created_after, settle_s=settle_s, sleep=sleep, cause=str(first)
        )
    except ProviderUnavailable as exc:
        raise OutcomeUnknown("batches.create", f"{first.cause}; reconciliation listing failed too: {exc}") from None


def reconcile_upload(
    provider: Provider,
    filename: str,
    size: int,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    cause: str | None = None,
) -> UploadResult:
    """List and match only (no upload): a batch file with this name and byte size."""
    found = provider.find_files(filename, size, created_after)
    if not found and settle_s > 0:
        sleep(settle_s)
        found = provider.find_files(filename, size, created_after)
    if not found:
        return UploadResult("not_created", None, (), cause)
    return UploadResult("adopted", found[0], tuple(found[1:]), cause)


def upload_reconciled(
    provider: Provider,
    path: str | os.PathLike[str],
    filename: str,
    *,
    created_after: int | None = None,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> UploadResult:
    """Upload once; on :class:`OutcomeUnknown` look for a batch file with the same name and byte
    size (:func:`reconcile_upload`) and adopt the oldest.  ``filename`` should be unique per
    intent (e.g. include a content hash), since files carry no metadata.  Raises like
    :func:`create_batch_reconciled`."""
    size = Path(path).stat().st_size
    try:
        return UploadResult("created", provider.upload(path, filename))
    except OutcomeUnknown as exc:
        first = exc
        log.warning("files.create outcome unknown (%s); reconciling by listing", exc.cause)
    try:
        return reconcile_upload(
            provider, filename, size, created_after=created_after, settle_s=settle_s, sleep=sleep, cause=str(first)
        )
    except ProviderUnavailable as exc:
        raise OutcomeUnknown("files.create", f"{first.cause}; reconciliation listing failed too: {exc}") from None
