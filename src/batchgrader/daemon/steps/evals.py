"""The daemon's eval and schedule steps: what imported evals and scheduled profiles need from the
daemon, on the engine's shared :class:`~batchgrader.daemon.context.Context`.

Both are steps of :class:`~batchgrader.daemon.engine.Steps`, run by :meth:`Engine.tick
<batchgrader.daemon.engine.Engine.tick>` around the jobs' pass.

:class:`ScheduleStep` runs once per tick before the jobs are taken further: each profile's
``schedule`` (:func:`batchgrader.core.rules.cron.due_runs`) starts its ``schedule_source`` files as
jobs, each claimed into its work folder as the inbox claims a file (copied:
:mod:`batchgrader.pipeline.scheduled`), then ``JobAccepted`` and ``ScheduledRunStarted`` appended
together to a job whose id is derived from (profile, time, file), expecting a new job: a second
daemon's append fails (it removes its claim and runs nothing), a restart finds the time
recorded.  A claim whose append never happened is accepted by the start-up recovery; the step
then finds the job and appends its ``ScheduledRunStarted``.  A source with no file is logged
once per time and tried again (the time is run once the file is there).

:class:`EvalStep` runs once per tick after every job has been taken a step further (so a job
that ended in this tick is seen), over the evals imported into the home (``<home>/evals/*``):

* the decision is :func:`batchgrader.core.rules.evalchain.decide_eval` over what the eval's folder
  records and the engine's folded state (pure; each candidate job's first event ``seq`` is read
  once from the store and kept);
* :class:`~batchgrader.core.rules.evalchain.QueueGrading`: the generation of a generate-then-grade run
  ended with its result written, so its grading is queued
  (:func:`batchgrader.pipeline.evals.chain.queue_grading`: recorded in the eval's folder before
  any file is copied into the inbox, so a daemon killed between the two jobs queues it once);
* :class:`~batchgrader.core.rules.evalchain.Requeue`: a recorded grading file that a crash kept from
  the inbox is copied there again;
* :class:`~batchgrader.core.rules.evalchain.WriteResults`: every job of the eval ended, so run.json,
  output_items.jsonl and the report are written into the outbox
  (:func:`batchgrader.pipeline.evals.results.finish`), with no `bgctl evals results`; written
  once per set of job results, again after a crash that came before the record.

:meth:`EvalStep.run` returns whether it copied a file into the inbox (the engine then scans the
inbox and ticks again at once).  An eval whose folder cannot be read, or whose effect fails, is
logged and tried again at the next tick (``failed`` is set); it never stops the jobs.

How the engine runs them: :meth:`ScheduleStep.run` after the inbox's intake (the jobs it
starts are prepared in the same pass); :meth:`EvalStep.run` after every job was taken a step
further (a grading file it copied into the inbox is taken in the same tick, so a ``--once``
daemon is not idle); :meth:`ScheduleStep.next_due` (a wall-clock time) joins the engine's next
due time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from batchgrader.core.configuration.config import ConfigError
from batchgrader.core.log.events import NewEvent, new_event
from batchgrader.core.rules import cron
from batchgrader.core.rules import evalchain as ec
from batchgrader.daemon.context import Context
from batchgrader.pipeline import scheduled
from batchgrader.pipeline.evals import chain, runs
from batchgrader.pipeline.evals import folder as evfolder
from batchgrader.pipeline.evals.spec import EvalInputError
from batchgrader.pipeline.outbox import result_name
from batchgrader.pipeline.prepare import file_sha256
from batchgrader.store.eventstore import ConcurrencyError

log = logging.getLogger("batchgrader.engine")


class EvalStep:
    """The eval step (see the module docstring), on the engine's shared :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.first_seq: dict[str, int] = {}  # job id -> the seq of its first event (never changes)
        self.failed = False  # the last run's effect failed for an eval (logged; tried again at the next tick)

    def _first_seqs(self, record: ec.EvalRecord) -> dict[str, int]:
        for job_id in ec.candidates(record, self.ctx.state):
            if job_id not in self.first_seq:
                first = next(iter(self.ctx.store.read(job_id=job_id, limit=1)), None)
                if first is not None:
                    self.first_seq[job_id] = first.seq
        return self.first_seq

    def decide(self, name: str) -> ec.EvalAction | None:
        """What is due for the eval ``name`` now."""
        record = evfolder.record(self.ctx.home, name)
        stages = [s for s in (record.generation, record.grading) if s is not None]
        waiting = frozenset(f.path for s in stages for f in s.files if os.path.exists(f.path))
        return ec.decide_eval(record, self.ctx.state, self._first_seqs(record), waiting)

    def run(self, now: float) -> bool:
        """Do what is due for every imported eval; whether a file was copied into the inbox."""
        queued = self.failed = False
        for name in evfolder.names(self.ctx.home):
            try:
                due = self.decide(name)
                if due is not None:
                    queued |= self.act(due, now)
            except (OSError, ValueError, LookupError) as exc:  # one eval's problem never stops the others, nor the jobs
                self.failed = True
                log.warning("eval %s: %s (tried again at the next tick)", name, exc)
        return queued

    def act(self, due: ec.EvalAction, now: float) -> bool:
        """Carry out one decision; whether a file was copied into the inbox."""
        home, state = self.ctx.home, self.ctx.state
        if isinstance(due, ec.QueueGrading):
            paths = chain.queue_grading(home, due.name, state.jobs[due.generation_job], state.last_seq)
            log.info("eval %s: generation %s ended, grading queued: %s", due.name, due.generation_job, ", ".join(map(str, paths)))
            return bool(paths)
        if isinstance(due, ec.Requeue):
            path = chain.requeue(home, due.name, due.key)
            log.warning("eval %s: grading file %s was not in the inbox after a restart: copied again", due.name, path)
            return True
        from batchgrader.pipeline.evals.results import finish

        rep = finish(home, due.name, [(k, state.jobs[j]) for k, j in due.jobs], fingerprint=due.fingerprint, now=now)
        rc = rep["result_counts"]
        log.info(
            "eval %s: results written (%d passed, %d failed, %d errored of %d): %s",
            due.name,
            rc["passed"],
            rc["failed"],
            rc["errored"],
            rc["total"],
            rep["paths"]["run"],
        )
        return False


class ScheduleStep:
    """The schedule step (see the module docstring), on the engine's shared :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.since: dict[str, float] = {}  # profile -> when this daemon first saw its schedule (wall)
        self._warned: set[tuple[str, float]] = set()
        self.failed = False  # the last run could not start a due run (logged; tried again at the next tick)
        self.started = 0  # the jobs the last run started

    def _eval_schedules(self) -> list[cron.ProfileSchedule]:
        try:
            return runs.eval_schedules(self.ctx.home)
        except (OSError, ValueError) as exc:
            log.warning("imported evals' schedules cannot be read: %s (tried again at the next tick)", exc)
            return []

    def next_due(self, now: float) -> float | None:
        """The next fire time of any schedule, a profile's or an imported eval's (wall clock),
        for the daemon's due time."""
        return cron.next_fire(self.ctx.config, now, self._eval_schedules())

    def run(self, now: float) -> int:
        """Start what is due; the jobs started."""
        evals = self._eval_schedules()
        for sch in cron.profile_schedules(self.ctx.config) + evals:
            self.since.setdefault(sch.profile, now)
        started, self.failed = 0, False
        dues = cron.due_runs(self.ctx.config, self.ctx.state, self.since, now)
        dues += cron.due_runs_of(evals, self.ctx.state, self.since, now)
        for due in dues:
            try:
                started += self._start_eval(due) if due.profile.startswith(runs.PREFIX) else self._start(due)
            except (OSError, ConfigError, ValueError, LookupError) as exc:
                self.failed = True
                log.warning("schedule %s: %s (tried again at the next tick)", due.profile, exc)
        self.started = started
        return started

    def _warn_once(self, due: cron.StartRun | cron.ResumeRun, message: str, *args: object) -> None:
        if (due.profile, due.scheduled_for) not in self._warned:
            self._warned.add((due.profile, due.scheduled_for))
            log.warning(message, *args)

    def _start_eval(self, due: cron.StartRun | cron.ResumeRun) -> int:
        """A scheduled time of an imported eval: its run's folder staged (once), then each of its
        first stage's request files started as a job (see :mod:`batchgrader.pipeline.evals.runs`)."""
        name = due.profile.removeprefix(runs.PREFIX)
        try:
            staged = runs.stage_run(self.ctx.home, name, due.scheduled_for, self.ctx.state.last_seq)
        except EvalInputError as exc:
            self._report_problems(due, name, exc)
            return 0
        if staged is None:
            self._warn_once(
                due,
                "schedule of eval %s: %s has no items to run at %s; it runs once there are some",
                name,
                due.source,
                cron.as_utc(due.scheduled_for),
            )
            return 0
        files = [f.path for f in staged.files]
        todo = set(due.files) if isinstance(due, cron.ResumeRun) else set(files)
        missed = list(due.missed) if isinstance(due, cron.StartRun) else []
        started = 0
        for f in staged.files:
            if f.path not in todo:
                continue
            job_id = cron.scheduled_job_id(due.profile, due.scheduled_for, f.path)
            record = new_event(
                "ScheduledRunStarted",
                schedule=due.profile,
                cron=due.cron,
                scheduled_for=due.scheduled_for,
                source=f.path,
                files=files,
                missed=missed,
            )
            if self.ctx.state.jobs.get(job_id) is not None:  # claimed before a crash, accepted by the start-up recovery
                if self.ctx.state.scheduled_runs.get(due.profile, {}).get("scheduled_for") != due.scheduled_for:
                    self.ctx.emit(job_id, record)
                continue
            started += self._accept(job_id, f.profile, Path(f.path), record)
        if started:
            log.info("schedule of eval %s: run %s started (%d job(s))", name, staged.name, started)
        return started

    def _report_problems(self, due: cron.StartRun | cron.ResumeRun, name: str, exc: EvalInputError) -> None:
        """Items the eval cannot grade: logged, and written into the outbox (once per time); the
        time runs once they are corrected."""
        if (due.profile, due.scheduled_for) in self._warned:
            return
        self._warn_once(due, "schedule of eval %s: the items cannot be graded, nothing was sent: %s", name, exc)
        outbox = self.ctx.home.outbox
        outbox.mkdir(parents=True, exist_ok=True)
        path = outbox / f"{runs.run_name(name, due.scheduled_for)}_problems.json"
        evfolder.write_json(path, {"eval": name, "scheduled_for": cron.as_utc(due.scheduled_for), "problems": exc.as_dicts()})

    def _start(self, due: cron.StartRun | cron.ResumeRun) -> int:
        if isinstance(due, cron.ResumeRun):
            files = list(due.files)
            missed: tuple[float, ...] = ()
        else:
            files = scheduled.source_files(self.ctx.home, due.source)
            missed = due.missed
            if not files:
                if (due.profile, due.scheduled_for) not in self._warned:
                    self._warned.add((due.profile, due.scheduled_for))
                    log.warning(
                        "schedule of profile %s: %s has no file to run at %s; it runs once there is one",
                        due.profile,
                        scheduled.source_path(self.ctx.home, due.source),
                        cron.as_utc(due.scheduled_for),
                    )
                return 0
        started = 0
        for f in files:
            job_id = cron.scheduled_job_id(due.profile, due.scheduled_for, f)
            record = new_event(
                "ScheduledRunStarted",
                schedule=due.profile,
                cron=due.cron,
                scheduled_for=due.scheduled_for,
                source=f,
                files=list(files)
                if isinstance(due, cron.StartRun)
                else list(self.ctx.state.scheduled_runs[due.profile]["files"]),
                missed=list(missed),
            )
            job = self.ctx.state.jobs.get(job_id)
            if job is not None:  # claimed before a crash, accepted by the start-up recovery: recorded now
                if self.ctx.state.scheduled_runs.get(due.profile, {}).get("scheduled_for") != due.scheduled_for:
                    self.ctx.emit(job_id, record)
                continue
            started += self._accept(job_id, due.profile, Path(f), record)
        if started:
            log.info(
                "schedule of profile %s: run of %s started (%d job(s))", due.profile, cron.as_utc(due.scheduled_for), started
            )
        return started

    def _accept(self, job_id: str, profile: str, src: Path, record: NewEvent) -> int:
        claim = {"file": src.name, "source": str(src), "profile": profile, "sandbox": self.ctx.sandbox}
        input_path = scheduled.claim_copy(self.ctx.home, job_id, src, claim)
        accepted = new_event(
            "JobAccepted",
            file=src.name,
            source=str(src),
            profile=profile,
            sha256=file_sha256(input_path),
            bytes=input_path.stat().st_size,
            input_path=str(input_path),
            result_name=result_name(src.name),
            **self.ctx.accepted_as(self.ctx.config.profile(profile), self.ctx.sandbox),
        )
        try:
            self.ctx.emit(job_id, accepted, record)
        except ConcurrencyError:  # another daemon started this time first
            scheduled.unclaim(self.ctx.home, job_id)
            log.info("schedule of profile %s: %s was started by another daemon", profile, job_id)
            return 0
        return 1
