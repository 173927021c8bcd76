"""Learning what a JSON schema really costs: pure functions, no I/O.

The provider bills a ``response_format`` schema as prompt tokens and does not publish how many.
Until it is known, estimates add a stated allowance per request (:func:`prepare.schema_allowance`).
After the first batch of a job with a schema comes back, the billed prompt tokens minus the
tokens counted locally, per request, is the real overhead for that model and schema; the daemon
records it as a ``SchemaOverheadLearned`` event (:func:`overhead_payload`), the state keeps the
newest value per (provider, model, schema), and later estimates use it (:func:`learned_overhead`).

What is learned is kept apart per provider, and the sandbox's apart from every real provider's:
a sandbox job's lesson (the emulator's billing) never calibrates a real estimate.  The provider is
the job's ``provider_id`` (:func:`~batchgrader.pipeline.answerkey.provider_id_of`, recorded when
it was accepted); an event of an older log, which does not name it, counts for every real
provider (a real job's) or for the sandbox (a sandbox job's).
"""

from __future__ import annotations

from typing import Any

from batchgrader.core.log.state import ChunkState, JobState, State
from batchgrader.pipeline.answerkey import SANDBOX_PROVIDER
from batchgrader.pipeline.requests import schema_sha256


def is_sandbox(provider: str) -> bool:
    """Whether a provider id is the sandbox's (``sandbox`` or ``sandbox:<provider>``)."""
    return provider == SANDBOX_PROVIDER or provider.startswith(SANDBOX_PROVIDER + ":")


def learned_overhead(state: State, model: str | None, response_format: dict[str, Any] | None, provider: str) -> float | None:
    """The newest learned overhead per request at ``provider`` for this model and schema, or None."""
    sha = schema_sha256(response_format)
    if sha is None or not model:
        return None
    found = state.schema_overhead.get((provider, model, sha))
    if found is None:  # an older log's lesson: kept by sandbox or real only
        found = state.schema_overhead.get((SANDBOX_PROVIDER if is_sandbox(provider) else "", model, sha))
    return found


def job_provider(job: JobState) -> str:
    """Who answered ``job``: its recorded ``provider_id``; in an older log, ``sandbox`` or "" (real)."""
    return job.provider_id or (SANDBOX_PROVIDER if job.sandbox else "")


def overhead_payload(
    job: JobState, chunk: ChunkState, rows: int, all_ok: bool, billed: int, response_format: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The ``SchemaOverheadLearned`` payload to record when ``chunk`` is merged (``rows`` rows,
    ``all_ok`` when every one was answered, ``billed`` prompt tokens over them), or None.

    Only for the job's first chunk to come back, with a JSON schema (the profile's for every row:
    not with ``schema_column``), and when every row of the chunk was answered (then the chunk's counted tokens are exactly those of the billed rows)."""
    sha = schema_sha256(response_format)
    if sha is None or not job.model or not rows:
        return None
    if job.settings.get("schema_column"):
        return None  # the rows' requests carry schemas of their own: the overhead is no one schema's
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
        "provider": job_provider(job) or None,
    }
