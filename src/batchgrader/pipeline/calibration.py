"""Learning what a JSON schema really costs: pure functions, no I/O.

The provider bills a ``response_format`` schema as prompt tokens and does not publish how many.
Until it is known, estimates add a stated allowance per request (:func:`prepare.schema_allowance`).
After the first batch of a job with a schema comes back, the billed prompt tokens minus the
tokens counted locally, per request, is the real overhead for that model and schema; the daemon
records it as a ``SchemaOverheadLearned`` event (:func:`overhead_payload`), the state keeps the
newest value per (model, schema), and later estimates use it (:func:`learned_overhead`).
"""

from __future__ import annotations

from typing import Any

from batchgrader.core.state import ChunkState, JobState, State
from batchgrader.pipeline.prepare import schema_sha256


def learned_overhead(state: State, model: str | None, response_format: dict[str, Any] | None) -> float | None:
    """The newest learned overhead per request for this model and schema, or None."""
    sha = schema_sha256(response_format)
    if sha is None or not model:
        return None
    return state.schema_overhead.get((model, sha))


def overhead_payload(
    job: JobState, chunk: ChunkState, rows: int, all_ok: bool, billed: int, response_format: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The ``SchemaOverheadLearned`` payload to record when ``chunk`` is merged (``rows`` rows,
    ``all_ok`` when every one was answered, ``billed`` prompt tokens over them), or None.

    Only for the job's first chunk to come back, with a JSON schema, and when every row of the
    chunk was answered (then the chunk's counted tokens are exactly those of the billed rows)."""
    sha = schema_sha256(response_format)
    if sha is None or not job.model or not rows:
        return None
    if any(c.done for c in job.chunks.values() if c.index != chunk.index):
        return None  # not the first batch of this job
    if rows != chunk.requests or not all_ok:
        return None
    counted = chunk.input_tokens
    return {
        "model": job.model,
        "schema_sha256": sha,
        "chunk": chunk.index,
        "requests": rows,
        "counted_tokens": counted,
        "billed_prompt_tokens": billed,
        "per_request": round((billed - counted) / rows, 2),
    }
