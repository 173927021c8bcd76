"""The preflight's rules, pure: whether a job's preflight is still due, how long after a
transient failure it is sent again, and how many tries it gets (:mod:`batchgrader.daemon.steps.preflight`
sends it; :mod:`batchgrader.core.rules.decide` asks :func:`preflight_due`)."""

from __future__ import annotations

from batchgrader.core.configuration.config import Config, ConfigError
from batchgrader.core.log.jobstate import JobState

PREFLIGHT_FIRST_DELAY = 5.0  # seconds before the first preflight sent again after the provider could not be reached
PREFLIGHT_MAX_DELAY = 300.0
#: Tries of a preflight that meet only transient errors (connection, timeout, 5xx, 429): after
#: this many the job fails with ``preflight_failed`` (about 10 minutes of backoff in all).
PREFLIGHT_MAX_ATTEMPTS = 8


def preflight_due(job: JobState, config: Config) -> bool:
    """Whether the job's preflight is still to be (or being) sent: its profile asks for one
    (``preflight_rows`` > 0), it has not passed and the job is not being cancelled (a cancelled
    job is prepared at once, and its unsent rows fail as cancelled).  An unknown profile has
    none (prepare fails the job for it)."""
    if job.preflight == "passed" or job.cancel_requested:
        return False
    try:
        rows = int(config.profile(job.profile).preflight_rows or 0)
    except ConfigError:
        return False
    return rows > 0


def preflight_delay(attempt: int) -> float:
    """How long after the ``attempt``-th try that could not reach the provider the preflight is
    sent again: 5 s, doubling, at most 5 minutes."""
    return min(PREFLIGHT_MAX_DELAY, PREFLIGHT_FIRST_DELAY * 2 ** max(0, attempt - 1))
