"""The stragglers step (the rules: :mod:`batchgrader.core.rules.stragglers`): the rows of a batch
cancelled as its job's deadline nears, and a chunk its deadline leaves no time to batch, finished
through the synchronous route.

* the cancel itself is the submit step's (``CancelBatch``: one with a reason records
  ``StragglerCancelRequested`` before it leaves); the cancelled batch is polled, downloaded and
  merged as any other;
* :meth:`StragglersStep.plan` writes the rows its partial output did not answer as a chunk for
  the synchronous route (``RetryPlanned`` with ``route``: ``flex`` where the model has a flex
  tier, else ``online``);
* :meth:`StragglersStep.route` sends a chunk never sent the synchronous way (``ChunkRouted``);
* the online step sends such a chunk's rows (``SendStragglers``: intent ``OnlineRequestSent``
  before each request, ``OnlineRequestAnswered`` with its ``TokensUsed`` at the tier's price);
  once every row has its outcome, the chunk's results file is written (in the chunk's order, as a
  merged batch's) and ``RowsFailed`` / ``ChunkCompleted`` recorded, so the result file takes the
  answers like a retry chunk's.
"""

from __future__ import annotations

import logging

from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import PlanStragglers, RouteChunk
from batchgrader.core.rules.decide import token_cap
from batchgrader.core.rules.stragglers import straggler_rows
from batchgrader.daemon.context import Context
from batchgrader.pipeline.chunkplan import retry_chunks
from batchgrader.pipeline.pricing import has_flex

log = logging.getLogger("batchgrader.engine")


class StragglersStep:
    """A straggler's rows planned for the synchronous route, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def _tier(self, job: JobState) -> str:
        """The synchronous route a straggler's rows take: flex where the model has it, else online."""
        return "flex" if has_flex(self.ctx.profile_of(job), self.ctx.prices) else "online"

    def plan(self, a: PlanStragglers, job: JobState, now: float) -> None:
        """The rows a cancelled straggler's output did not answer, as a chunk for the synchronous route."""
        ids = straggler_rows(job, job.chunks[a.chunk])
        if not ids:
            return
        ctx = self.ctx
        profile = ctx.profile_of(job)
        cap = token_cap(ctx.state, ctx.config, profile, job.model or profile.model, ctx.queue_url_for(job))
        planned = retry_chunks(
            job, ids, profile, cap, ctx.reuse.followers_of(job), ctx.home.job_dir(job.job_id), route=self._tier(job)
        )
        ctx.emit(job.job_id, *[_e("RetryPlanned", **p) for p in planned])

    def route(self, a: RouteChunk, job: JobState, now: float) -> None:
        """A chunk never sent, its deadline too near for a batch: its rows take the synchronous
        route (sent by ``SendStragglers`` as a straggler's)."""
        tier = self._tier(job)
        self.ctx.emit(
            job.job_id,
            _e(
                "ChunkRouted",
                chunk=a.chunk,
                route=tier,
                deadline_at=float(a.deadline_at),
                margin_seconds=float(a.margin),
                reason=a.reason,
            ),
        )
        log.warning("job %s chunk %d: sent %s, not in a batch: %s", job.job_id, a.chunk, tier, a.reason)
