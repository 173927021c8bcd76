"""Which scheduled run of a cron ``schedule:`` is due: a pure decision over (the schedule, the
scheduled times already recorded, now), for the daemon to act on.

Rules:

* the fire times come from APScheduler's ``CronTrigger`` (the project's scheduler), in the
  schedule's time zone;
* a time counts from the later of the last *recorded* scheduled time and the moment the schedule
  was first seen (``since``): adding a schedule never runs its past times;
* the misfire rule: several times missed while no daemon ran are coalesced into one run, of the
  latest of them (``runs_once``); a time later than ``grace_seconds`` past its moment is skipped
  (recorded as skipped, not run), when a grace is set;
* a scheduled time is recorded before its run is queued (the daemon's event, keyed by the
  schedule and the time); since the decision only ever proposes times after the last recorded
  one, a restart never runs a time twice, and a second daemon whose append of the same time is
  refused by the event store's expected version runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo


@dataclass(frozen=True)
class CronSchedule:
    name: str  # the profile (or eval) it runs
    cron: str  # five fields: minute hour day month day-of-week
    timezone: str = "UTC"
    grace_seconds: float | None = None  # None: a missed time runs however late (once)


@dataclass(frozen=True)
class Decision:
    run: float | None  # the scheduled time to record and run now (epoch seconds), or None
    skipped: tuple[float, ...]  # missed times not run (coalesced, or past the grace)
    next_due: float | None  # the next fire time after now (for the daemon's timer)


def check(cron: str, timezone: str = "UTC") -> str | None:
    """Why a cron expression or time zone is refused (for the config's validator), or None."""
    try:
        _trigger(cron, timezone)
    except (ValueError, KeyError) as exc:
        return f"schedule {cron!r} is not a five-field cron expression ({exc}); e.g. '0 2 * * *' is 02:00 every day"
    return None


def _trigger(cron: str, timezone: str):  # noqa: ANN202
    from apscheduler.triggers.cron import CronTrigger

    return CronTrigger.from_crontab(cron, timezone=ZoneInfo(timezone))


def fire_times(cron: str, after: float, until: float, timezone: str = "UTC", limit: int = 10_000) -> list[float]:
    """The fire times in ``(after, until]``, oldest first (at most ``limit``: the latest kept)."""
    trig = _trigger(cron, timezone)
    tz = ZoneInfo(timezone)
    prev: datetime | None = None
    now = datetime.fromtimestamp(after, tz) + timedelta(microseconds=1)
    out: list[float] = []
    while True:
        nxt = trig.get_next_fire_time(prev, now)
        if nxt is None or nxt.timestamp() > until:
            return out
        out.append(nxt.timestamp())
        if len(out) > limit:
            out.pop(0)
        prev, now = nxt, nxt + timedelta(microseconds=1)


def decide(schedule: CronSchedule, last_recorded: float | None, since: float, now: float) -> Decision:
    """What to do now (see the module's docstring)."""
    anchor = max(last_recorded, since) if last_recorded is not None else since
    missed = fire_times(schedule.cron, anchor, now, schedule.timezone)
    tz = ZoneInfo(schedule.timezone)
    after = _trigger(schedule.cron, schedule.timezone).get_next_fire_time(
        None, datetime.fromtimestamp(now, tz) + timedelta(microseconds=1)
    )
    nxt = after.timestamp() if after is not None else None
    if not missed:
        return Decision(None, (), nxt)
    latest = missed[-1]
    if schedule.grace_seconds is not None and now - latest > schedule.grace_seconds:
        return Decision(None, tuple(missed), nxt)
    return Decision(latest, tuple(missed[:-1]), nxt)


def as_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()
