"""A judge panel (the ``judges`` key), decided purely: a panel job is the parent of one job per judge.

When a job of a profile with ``judges`` is picked up, ``PanelStarted`` records its judges and the
ids of their jobs (:func:`judge_job_id`: the panel's id and the judge's place, so a restart between
that event and a judge's ``JobAccepted`` accepts the missing judges and none twice).  Each judge's
job is an ordinary job on the panel's input (``JobAccepted.panel_of``): its own profile, provider,
preflight, batches and retries; its result goes to the panel's work folder and it never archives
the shared input.  When every judge's job has ended, the panel writes one result (a column per
judge, the consensus and the share that agrees with it), archives the input and ends.

The panel job has no chunks of its own: each judge's job carries what it was billed, and totals
count them once; what the panel shows as its tokens and cost (status, report) is their sum.  A
panel row is failed only when no judge answered it (pipeline/panel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from batchgrader.core.configuration.config import Config, ConfigError, Profile
from batchgrader.core.host.home import Home
from batchgrader.core.log.state import JobState, State
from batchgrader.core.rules.actions import OUTBOX_TIMER, Action, Archive, Finish, RestoreInput, Timers
from batchgrader.core.rules.ending import reopened_archive

ALL_JUDGES_FAILED = "all_judges_failed"
JUDGES_FOLDER = "judges"


@dataclass(frozen=True)
class StartPanel(Action):
    """Record the panel's judges (``PanelStarted``, once) and accept each judge's job not yet accepted."""

    stage: ClassVar[int] = 2


@dataclass(frozen=True)
class CancelJudges(Action):
    """A cancelled panel: ask each judge's job that runs to cancel (``CancelRequested``)."""

    judge_ids: tuple[str, ...]
    stage: ClassVar[int] = 3


@dataclass(frozen=True)
class RetryJudges(Action):
    """A panel reopened by ``bgctl retry``: reopen each judge's job that did not complete (``RetryRequested``)."""

    judge_ids: tuple[str, ...]
    stage: ClassVar[int] = 3


@dataclass(frozen=True)
class WritePanelResult(Action):
    """Combine the judges' results into the panel's result (and, when it failed, its error report)."""

    failed: bool
    error: str
    hint: str
    stage: ClassVar[int] = 8


def judge_job_id(panel_id: str, place: int) -> str:
    """The job id of the judge at ``place`` (1-based) of the panel job ``panel_id``."""
    return f"{panel_id}-j{place}"


def judge_result_path(home: Home, job: JobState, name: str) -> Path:
    """Where the job of a panel's judge writes its result (or error report) named ``name``: in
    the panel's work folder, never the outbox."""
    return home.job_dir(job.panel_of or job.job_id) / JUDGES_FOLDER / f"{job.job_id}-{name}"


def sets_own(profile: Profile, key: str) -> bool:
    """Whether ``profile``'s own entry in config.yaml sets ``key`` (not inherited from the default
    settings, the environment or a flag)."""
    return profile.sources.get(key) == f"config.yaml profiles.{profile.name}"


def judge_profile(judge: Profile, panel_samples: int) -> Profile:
    """The judge's profile as its job in a panel runs: ``samples`` is the panel's (``panel_samples``)
    unless the judge's own profile sets ``samples``.  Used by the daemon (with the panel's samples
    recorded in ``PanelStarted.settings``) and by ``bgctl count --profile PANEL`` alike."""
    if sets_own(judge, "samples") or int(judge.values.get("samples") or 1) == panel_samples:
        return judge
    return Profile(judge.name, {**judge.values, "samples": panel_samples}, {**judge.sources, "samples": "panel"})


def panel_judges(job: JobState, config: Config) -> list[str] | None:
    """The judges' profiles of a panel job (as recorded once started, else as its profile says);
    None for a job that is no panel (or whose profile is gone: preparing it fails, naming it)."""
    if job.panel is not None:
        return [j["profile"] for j in job.panel]
    if job.panel_of is not None or job.prepared:
        return None
    try:
        judges = config.profile(job.profile).values.get("judges")
    except ConfigError:
        return None
    return list(judges) if judges else None


def judge_jobs(state: State, job: JobState) -> list[JobState | None]:
    """Each judge's job of a started panel (None: not accepted yet)."""
    return [state.jobs.get(j["job_id"]) for j in job.panel or ()]


def decide_panel(state: State, job: JobState, config: Config, now: float, timers: Timers) -> list[Action] | None:
    """The next actions of a panel job that has not ended (None: the job is no panel)."""
    if panel_judges(job, config) is None:
        return None
    judges = judge_jobs(state, job)
    if job.panel is None or any(j is None for j in judges):
        return [StartPanel(job.job_id)]
    restore: list[Action] = [RestoreInput(job.job_id)] if reopened_archive(job) else []
    retried = _judges_to_retry(job, judges)
    if retried:
        return [*restore, RetryJudges(job.job_id, retried)]
    running = [j for j in judges if j is not None and not j.ended]
    if running:
        if job.cancel_requested:
            asked = tuple(j.job_id for j in running if not j.cancel_requested)
            return [CancelJudges(job.job_id, asked)] if asked else []
        return restore  # the judges' jobs run: nothing to do until the last has ended
    if job.outbox != "done" and timers.not_before.get((job.job_id, OUTBOX_TIMER), now) > now:
        return []  # the result could not be written: tried again once the back-off has passed
    return _end_panel(state, job, restore)


def _judges_to_retry(job: JobState, judges: list[JobState | None]) -> tuple[str, ...]:
    """A panel reopened by ``bgctl retry``: its judges' jobs that did not complete and were not
    retried for this retry of the panel (each is retried once per retry of the panel)."""
    if job.retry_seq is None:
        return ()
    seq = job.retry_seq
    return tuple(j.job_id for j in judges if j is not None and j.ended and j.ended != "completed" and (j.retry_seq or -1) < seq)


def _end_panel(state: State, job: JobState, restore: list[Action]) -> list[Action]:
    """Every judge's job has ended: the panel's input back (when reopened), its result written,
    its input archived, and its ending."""
    final, payload = panel_ending(state, job)
    failed = final == "JobFailed"
    out: list[Action] = list(restore)  # its input back first: the result is written again from it
    if job.outbox != "done":
        out.append(WritePanelResult(job.job_id, failed, str(payload.get("error", "")), str(payload.get("hint", ""))))
    if not job.archived_path:
        out.append(Archive(job.job_id, failed))
    out.append(Finish(job.job_id, final, payload))
    return out


def panel_ending(state: State, job: JobState) -> tuple[str, dict[str, Any]]:
    """How a panel whose judges' jobs have all ended ends: failed when no judge answered a row,
    cancelled when cancelled, else completed (with errors when a judge failed or a row has no
    consensus).  The counts are those of its written result (rows with a consensus, without)."""
    judges = [j for j in judge_jobs(state, job) if j is not None]
    succeeded, failed = job.result_counts or (0, job.rows)
    if job.cancel_requested:
        return "JobCancelled", {"succeeded": succeeded, "failed": failed}
    if all(j.ended == "failed" or (j.ended == "cancelled" and not j.succeeded_rows) for j in judges):
        first = next((j for j in judges if j.error), None)
        why = f"{first.job_id} ({first.profile}): {(first.error or {}).get('error')}" if first else "no judge answered"
        return "JobFailed", {
            "code": ALL_JUDGES_FAILED,
            "error": f"every judge of the panel failed; first: {why}",
            "stage": "panel",
            "hint": "See each judge's job in `bgctl status`; fix the cause and drop the file in again.",
        }
    clean = all(j.ended == "completed" for j in judges) and failed == 0
    return "JobCompleted", {"state": "completed" if clean else "completed_with_errors", "succeeded": succeeded, "failed": failed}
