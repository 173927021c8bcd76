"""Merging a batch's results into the chunk's rows: a pure data transform.

The engine reads the downloaded output and error files (:func:`pipeline.results.iter_outcomes`),
hands the outcomes here with the chunk's custom ids and the batch's final status, and writes
what comes back: one record per row in the chunk's order, the rows that failed, and the usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from batchgrader.pipeline.pricing import Price, billed_cost

USAGE_KEYS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


def outcome_record(o: Any) -> dict[str, Any]:
    """One row's outcome as stored in the chunk's results file (``cache_write_tokens`` only when
    the provider reported prompt-cache writes)."""
    rec = {
        "custom_id": o.custom_id,
        "ok": bool(o.ok),
        "content": o.content,
        "status_code": o.status_code,
        "error_code": o.error_code,
        "error_message": o.error_message,
        "prompt_tokens": o.prompt_tokens,
        "cached_tokens": o.cached_tokens,
        "completion_tokens": o.completion_tokens,
        "reasoning_tokens": o.reasoning_tokens,
        "finish_reason": o.finish_reason,
    }
    if getattr(o, "cache_write_tokens", 0):
        rec["cache_write_tokens"] = int(o.cache_write_tokens)
    return rec


@dataclass(frozen=True)
class ChunkMerge:
    records: list[dict[str, Any]]  # one per expected row, in order
    failed_rows: list[dict[str, Any]]  # {custom_id, code, message}
    usage: dict[str, int]  # summed over the rows that succeeded
    cache_write_tokens: int = 0  # of usage["prompt_tokens"]: prompt-cache writes (billed at 1.25 x input)

    @property
    def succeeded(self) -> int:
        return len(self.records) - len(self.failed_rows)

    def cost(self, price: Price | None) -> float:
        if price is None:
            return 0.0
        u = self.usage
        return float(billed_cost(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"], self.cache_write_tokens))


def merge_chunk(
    expected: Sequence[str], outcomes: Iterable[Any], status: str | None, missing: tuple[str, str] | None = None
) -> ChunkMerge:
    """The rows of a chunk whose batch ended with ``status``, given the outcomes read from its
    files (later outcomes of the same row win; rows the chunk did not send are ignored).  A row
    without an outcome failed: the batch expired, was cancelled, or left it out."""
    wanted = set(expected)
    found: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        if o.custom_id in wanted:
            found[o.custom_id] = outcome_record(o)
    missing_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status or "", "missing_result")
    missing_msg = {
        "batch_expired": "the batch expired before this row was processed",
        "batch_cancelled": "the batch was cancelled before this row was processed",
    }.get(missing_code, "the provider returned no result for this row")
    if missing is not None and missing_code == "missing_result":
        missing_code, missing_msg = missing  # the files could not be had, or had unreadable lines
    failed_rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for cid in expected:
        rec = found.get(cid)
        if rec is None:
            rec = {"custom_id": cid, "ok": False, "error_code": missing_code, "error_message": missing_msg}
        records.append(rec)
        if not rec["ok"]:
            failed_rows.append({"custom_id": cid, "code": rec.get("error_code"), "message": rec.get("error_message")})
    usage = {k: sum(int(r.get(k) or 0) for r in records if r["ok"]) for k in USAGE_KEYS}
    writes = sum(int(r.get("cache_write_tokens") or 0) for r in records if r["ok"])
    return ChunkMerge(records, failed_rows, usage, writes)
