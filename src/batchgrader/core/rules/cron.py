"""Scheduled runs: a profile's ``schedule`` (a cron expression, UTC) and ``schedule_source`` (a
file, or a folder of files) run at each fire time as ordinary jobs.  Pure decisions over the
configuration, the folded state (each profile's latest ``ScheduledRunStarted``) and the time,
for the daemon to act on.

A profile is scheduled when it sets ``schedule`` itself (the top level's ``schedule`` schedules
the default profile, and is not inherited by the named profiles).  At a fire time each file of
the source becomes a job of the profile whose id is derived from (profile, time, file)
(:func:`scheduled_job_id`); ``ScheduledRunStarted`` is appended with its ``JobAccepted``, in one
append that expects a new job, so a second daemon's append of the same time fails and it runs
nothing.  :func:`due_runs` says what to start now: :class:`StartRun` (the time due, after the
last recorded one) or :class:`ResumeRun` (files of the last recorded time that a crash kept
from being started).

The times (:func:`decide`):

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

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from batchgrader.core.configuration.config import Config, Profile
    from batchgrader.core.log.state import State


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


def check_schedule(value: Any) -> str | None:
    """The ``schedule`` setting's check: None, or a five-field cron expression APScheduler's
    ``CronTrigger`` accepts (returned stripped); else ``ValueError`` with the expected form."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("a cron expression such as '0 2 * * *' (02:00 UTC every day), or null")
    try:
        _trigger(value.strip(), "UTC")
    except (ValueError, KeyError) as exc:
        raise ValueError(
            f"a five-field cron expression (minute hour day month day-of-week, UTC) such as '0 2 * * *' ({exc})"
        ) from None
    return value.strip()


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


# --- a profile's schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileSchedule:
    profile: str  # the schedule's name: a profile's, or an imported eval's ``eval:<name>``
    cron: str
    source: str | None
    own_profile: bool = True  # its jobs run under the profile of its name (an eval's run under its jobs' profiles)


def _own(prof: Profile, default: Profile) -> bool:
    """Whether ``prof`` sets ``schedule`` itself (a named profile does not inherit the top level's)."""
    return prof is default or prof.sources.get("schedule") == f"config.yaml profiles.{prof.name}"


def profile_schedules(config: Config) -> list[ProfileSchedule]:
    """Every scheduled profile (see the module's docstring), the default first."""
    out = []
    for prof in (config.default, *config.profiles.values()):
        if prof.schedule and _own(prof, config.default):
            out.append(ProfileSchedule(prof.name, prof.schedule, prof.schedule_source))
    return out


def schedule_problems(default: Profile, profiles: Mapping[str, Profile], config_file: str) -> list[str]:
    """A scheduled profile without a ``schedule_source``, for the configuration's checks."""
    out = []
    for prof in (default, *profiles.values()):
        if prof.values.get("schedule") and _own(prof, default) and not prof.values.get("schedule_source"):
            where = "" if prof is default else f"profiles.{prof.name}: "
            out.append(
                f"{config_file}: {where}key 'schedule' needs 'schedule_source': the file, or the folder of files, run at each "
                "time (a relative path is taken under the home)"
            )
    return out


def scheduled_job_id(profile: str, scheduled_for: float, file: str) -> str:
    """The job id of ``file``'s run at ``scheduled_for``: the same in every daemon (it depends on
    the file's name, not on where a daemon's home keeps it), so the time runs once."""
    name = file.replace("\\", "/").rsplit("/", 1)[-1]
    return "s" + hashlib.sha256(f"{profile}|{scheduled_for:.0f}|{name}".encode()).hexdigest()[:11]


@dataclass(frozen=True)
class StartRun:
    profile: str
    cron: str
    source: str
    scheduled_for: float
    missed: tuple[float, ...]


@dataclass(frozen=True)
class ResumeRun:
    """The last recorded run's files that were not started (the daemon stopped between them)."""

    profile: str
    cron: str
    source: str
    scheduled_for: float
    files: tuple[str, ...]


def due_runs(config: Config, state: State, since: Mapping[str, float], now: float) -> list[StartRun | ResumeRun]:
    """What each scheduled profile starts now.  ``since``: when this daemon first saw each
    profile's schedule (a schedule never run before does not run its earlier times)."""
    return due_runs_of(profile_schedules(config), state, since, now)


def due_runs_of(
    schedules: list[ProfileSchedule], state: State, since: Mapping[str, float], now: float
) -> list[StartRun | ResumeRun]:
    """What each schedule starts now (a profile's, or an imported eval's ``eval:<name>``: the
    schedule's name is ``ScheduledRunStarted.schedule``; see :func:`due_runs`)."""
    out: list[StartRun | ResumeRun] = []
    for sch in schedules:
        if not sch.source:
            continue  # refused when the configuration is loaded
        last = state.scheduled_runs.get(sch.profile)
        if last is not None:
            missing = tuple(f for f in last["files"] if scheduled_job_id(sch.profile, last["scheduled_for"], f) not in state.jobs)
            if missing:
                out.append(ResumeRun(sch.profile, sch.cron, sch.source, last["scheduled_for"], missing))
                continue
        first_seen = since.get(sch.profile, now)
        if last is None:
            claimed = _claimed_unrecorded(sch, state, first_seen, now)
            if claimed is not None:  # its first run was claimed, then the daemon stopped: recorded now
                out.append(StartRun(sch.profile, sch.cron, sch.source, claimed, ()))
                continue
        recorded = last["scheduled_for"] if last else None
        d = decide(CronSchedule(sch.profile, sch.cron), recorded, first_seen if recorded is None else recorded, now)
        if d.run is not None:
            out.append(StartRun(sch.profile, sch.cron, sch.source, d.run, d.skipped))
    return out


#: s, how far before a daemon first saw a schedule it looks for a scheduled job claimed but never recorded
RECOVERY_WINDOW = 7 * 86_400.0


def _claimed_unrecorded(sch: ProfileSchedule, state: State, since: float, now: float) -> float | None:
    """The fire time of a job of the profile whose id is a scheduled run's, with no run recorded
    (the start-up recovery accepted its claimed input): the latest such time within the window."""
    ids = {
        j.job_id: j.source
        for j in state.jobs.values()
        if (j.profile == sch.profile or not sch.own_profile) and j.job_id.startswith("s") and j.source
    }
    if not ids:
        return None
    for t in reversed(fire_times(sch.cron, since - RECOVERY_WINDOW, now)):
        if any(scheduled_job_id(sch.profile, t, src) == job_id for job_id, src in ids.items()):
            return t
    return None


def next_fire(config: Config, now: float, more: list[ProfileSchedule] | None = None) -> float | None:
    """The earliest fire time after ``now`` of every scheduled profile (and of ``more``
    schedules: the imported evals'), wall clock, for the daemon's due time; None: no schedule."""
    times = []
    for sch in profile_schedules(config) + list(more or ()):
        if sch.source:
            d = decide(CronSchedule(sch.profile, sch.cron), None, now, now)
            if d.next_due is not None:
                times.append(d.next_due)
    return min(times, default=None)
