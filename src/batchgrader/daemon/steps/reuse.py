"""The reuse step: the answers a merged chunk adds to the answers store (``StoreAnswers``), after
the job's result is written.  Which rows reuse answers is decided when the job is prepared
(:mod:`batchgrader.pipeline.job_reuse`, read by the prepare step).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import StoreAnswers
from batchgrader.daemon.context import Context
from batchgrader.pipeline.job_reuse import answers_to_store

log = logging.getLogger("batchgrader.engine")


class ReuseStep:
    """Store a merged chunk's answers, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def store_answers(self, a: StoreAnswers, job: JobState, now: float) -> None:
        """Store a merged chunk's successful answers (``AnswersToStore``), recorded by
        ``AnswersStored`` in the same transaction.  Done after the job's result file is written,
        so storing never delays the results; after a crash in between it is simply done again
        (a stored answer is never duplicated).  A results file that cannot be read stores
        nothing, says why, and lets the job end."""
        c = job.chunks[a.chunk]
        rows, path = c.answers_due or 0, Path(c.results_path or "")
        keep_days = self.ctx.settings.cache_days
        provider = self.ctx.provider_key_for(job)
        store = self.ctx.store.answers

        def put(conn: Any) -> None:
            if keep_days > 0:
                # the retention's clock never runs ahead of the monotonic one (a forward step purges nothing)
                found = answers_to_store(job, c, provider, path, rows)
                store.put(conn, found, now=self.ctx.trusted_wall(), keep_days=keep_days)

        try:
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=None), also=put)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the transaction was rolled back
            error = f"the chunk's results could not be read: {exc}"
            log.warning("job %s chunk %s: answers not stored: %s", job.job_id, c.index, error)
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=error))
