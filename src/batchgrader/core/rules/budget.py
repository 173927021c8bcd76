"""The budget as pure rules: whether a job may be submitted now under ``max_cost_per_job_usd``,
``daily_cost_limit_usd`` and ``daily_token_limit``, counting what jobs already submitting may
still spend (their estimate, or their token bound, less what they used)."""

from __future__ import annotations

from datetime import UTC, datetime

from batchgrader.core.configuration.config import Config, Profile
from batchgrader.core.configuration.routes import SYNC_ROUTES
from batchgrader.core.log.state import JobState, State


def utc_day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def job_tokens_bound(job: JobState, profile: Profile) -> int:
    input_tokens = sum(c.input_tokens for c in job.chunks.values())
    return input_tokens + job.requests * profile.max_completion_tokens


def _batches_sent(j: JobState) -> bool:
    """Whether ``j`` has begun sending its batches (a chunk uploaded)."""
    return j.prepared and any(c.upload != "none" for c in j.chunks.values())


def spending(j: JobState) -> bool:
    """Whether ``j`` is already sending: a batch uploaded, or rows on its synchronous route."""
    return (j.online.route in SYNC_ROUTES and not j.online.done) or _batches_sent(j)


def committed_cost(state: State, exclude: str) -> float:
    """What jobs already sending may still spend (their estimate less what they cost so far)."""
    total = 0.0
    judged = state.jobs.get(exclude)
    for j in state.active_jobs():
        if judged is not None and j.sandbox != judged.sandbox:
            continue  # simulated spend and real spend never count against each other
        if j.job_id != exclude and spending(j):
            total += max(0.0, ((j.estimate or {}).get("max_total") or 0.0) - j.cost_usd)
    return total


def budget_problem(state: State, job: JobState, config: Config, now: float) -> tuple[str, str] | None:
    """Why ``job`` may not be submitted now (the limit's name and a message), or None."""
    if job.override_budget:
        return None
    profile = config.profile(job.profile)
    settings = config.default
    est = (job.estimate or {}).get("max_total") or 0.0
    if profile.max_cost_per_job_usd is not None and est > profile.max_cost_per_job_usd:
        return (
            "max_cost_per_job_usd",
            f"estimated cost up to ${est:.4f} exceeds max_cost_per_job_usd ${profile.max_cost_per_job_usd:.4f}; "
            f"raise the limit in config.yaml (then SIGHUP the daemon) or run `bgctl retry {job.job_id}` to submit anyway",
        )
    day = utc_day(now)
    if settings.daily_cost_limit_usd is not None:
        spent = state.spend_by_day.get(day, 0.0) + committed_cost(state, exclude=job.job_id)
        if spent + est > settings.daily_cost_limit_usd:
            return (
                "daily_cost_limit_usd",
                f"today's spend ${spent:.4f} plus this job's estimate ${est:.4f} would exceed daily_cost_limit_usd "
                f"${settings.daily_cost_limit_usd:.4f}; it will be submitted when the limit allows (UTC day) or with `bgctl retry {job.job_id}`",
            )
    if settings.daily_token_limit is not None:
        tokens = job_tokens_bound(job, profile)
        used = state.tokens_by_day.get(day, 0) + committed_tokens(state, config, exclude=job.job_id)
        if used + tokens > settings.daily_token_limit:
            return (
                "daily_token_limit",
                f"today's {used:,} tokens plus this job's up to {tokens:,} would exceed daily_token_limit "
                f"{settings.daily_token_limit:,}; it will be submitted when the limit allows or with `bgctl retry {job.job_id}`",
            )
    return None


def committed_tokens(state: State, config: Config, exclude: str) -> int:
    """Tokens jobs already submitting may still use (their bound less what they used), as
    :func:`committed_cost` does for money: jobs cannot each pass daily_token_limit and together exceed it."""
    total = 0
    judged = state.jobs.get(exclude)
    for j in state.active_jobs():
        if judged is not None and j.sandbox != judged.sandbox:
            continue
        if j.job_id != exclude and _batches_sent(j):
            used = j.prompt_tokens + j.completion_tokens
            total += max(0, job_tokens_bound(j, config.profile(j.profile)) - used)
    return total
