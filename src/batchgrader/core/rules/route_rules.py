"""The rules of the synchronous routes (``route: flex | online | auto``), as :mod:`batchgrader.core.rules.decide`
asks them: whether a job still sends rows through the synchronous API before it is prepared, and
whether it must wait for the provider's Retry-After first.  Pure: no clock, no I/O.
"""

from __future__ import annotations

from batchgrader.core.configuration.config import Config, ConfigError
from batchgrader.core.configuration.routes import SYNC_ROUTES
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import ONLINE_TIMER, Timers


def sync_route(job: JobState, config: Config) -> str | None:
    """The route (``flex``, ``online``, or ``auto`` not chosen yet) whose requests the job still
    sends before it is prepared; None: it goes by batch (or its synchronous route is done, or it
    is being cancelled)."""
    if job.online.done or job.cancel_requested or job.online.route == "batch":
        return None
    if job.online.route in SYNC_ROUTES:
        return job.online.route
    try:
        route = str(config.profile(job.profile).get("route") or "batch")
    except ConfigError:
        return None  # prepare fails the job for its profile
    return None if route == "batch" else route


def online_waits(job: JobState, now: float, timers: Timers) -> bool:
    """Whether a synchronous route must wait before its next request: the provider's
    Retry-After (on the monotonic clock, ``timers.not_before``; after a restart, the wall-clock
    ``retry_at`` its event recorded)."""
    if timers.not_before.get((job.job_id, ONLINE_TIMER), float("-inf")) > timers.clock(now):
        return True
    return job.online.retry_at is not None and job.online.retry_at > now and (job.job_id, ONLINE_TIMER) not in timers.not_before
