"""What is due for an imported eval: a pure decision over what its folder records (its stages'
queued files, the results written) and the folded state.  No I/O, no clock.

An eval runs as one or two stages of ordinary jobs, each stage the files queued in the inbox
with the log position before they were queued:

* an eval whose items carry their samples: one stage, the grading (the model criteria's jobs,
  queued by `bgctl evals import`);
* generate-then-grade (a run with a ``completions`` or ``responses`` data source): the
  generation (one job: the items with the templated messages, queued by the import), then the
  grading of its answers, queued once the generation's result is written.

The job of a queued file is the first job accepted (or rejected) from its inbox path after the
stage's log position (``first_seq`` gives each candidate job's first event: :func:`candidates`
names the jobs it is needed for).  A job has *ended* when its result or error report is written
(``ResultWritten`` after its ending, as `bgctl evals results` waits for), or when its file was
rejected.

:func:`decide_eval` then says, in this order:

* :class:`QueueGrading`: the generation ended with its result written and no grading is
  recorded yet.  The effect records the grading (``grading.json``) before it copies any file
  into the inbox, so a daemon killed between the two jobs finds the record and never queues
  the grading twice;
* :class:`Requeue`: a recorded grading file that is neither in the inbox (``waiting``) nor taken
  by a job: the copy was cut short by a crash, so it is copied again (to the same path);
* :class:`WriteResults`: every job of the last stage ended (or the generation ended with no
  answer to grade) and the results were not written for these very results.  ``results_for``
  (what ``results.json`` recorded) is compared with :attr:`WriteResults.fingerprint` (each
  job's id, result path and row counts), so the results are written once, again after a crash
  that came before ``results.json``, and again when `bgctl retry` rewrote a job's result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from batchgrader.core.log.jobstate import JobState
from batchgrader.core.log.state import State

#: how a generation job may end for its answers to be graded
GRADABLE = ("completed", "completed_with_errors")


@dataclass(frozen=True)
class QueuedFile:
    key: str  # the job's key in the eval's plan ("gen", "j1", ...)
    path: str  # the inbox path it was queued at (as JobAccepted.source records it)


@dataclass(frozen=True)
class Stage:
    name: str  # "generation" | "grading"
    after_seq: int  # the log position before its files were queued
    files: tuple[QueuedFile, ...]


@dataclass(frozen=True)
class EvalRecord:
    """What an eval's folder records (read by :func:`batchgrader.pipeline.evals.folder.record`)."""

    name: str
    generation: Stage | None  # None: the items carry their samples
    grading: Stage | None  # None: not queued yet (generate-then-grade before its generation ended)
    results_for: tuple[str, ...] | None  # the fingerprint the written results were computed from; None: none written


@dataclass(frozen=True)
class QueueGrading:
    name: str
    generation_job: str


@dataclass(frozen=True)
class Requeue:
    name: str
    key: str
    path: str


@dataclass(frozen=True)
class WriteResults:
    name: str
    jobs: tuple[tuple[str, str], ...]  # (key, job id) of every job of the run, in stage order
    fingerprint: tuple[str, ...]


EvalAction = QueueGrading | Requeue | WriteResults


def _same(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def candidates(record: EvalRecord, state: State) -> list[str]:
    """The jobs whose first event's ``seq`` :func:`decide_eval` needs: those taken from a queued
    file's inbox path (by source, any time)."""
    paths = [f.path for s in (record.generation, record.grading) if s is not None for f in s.files]
    return [j.job_id for j in state.jobs.values() if j.source and any(_same(j.source, p) for p in paths)]


def job_of(f: QueuedFile, stage: Stage, state: State, first_seq: Mapping[str, int]) -> JobState | None:
    """The job made of a queued file: the first accepted or rejected from its path after the stage's position."""
    found = [
        j
        for j in state.jobs.values()
        if j.source and _same(j.source, f.path) and j.panel_of is None and first_seq.get(j.job_id, 0) > stage.after_seq
    ]
    return min(found, key=lambda j: first_seq[j.job_id], default=None)


def has_ended(job: JobState) -> bool:
    """Its result (or error report) written after its ending, or its file rejected."""
    return job.rejected or (job.ended is not None and job.outbox == "done")


def _fingerprint(jobs: list[tuple[str, JobState]]) -> tuple[str, ...]:
    return tuple(f"{key}:{j.job_id}:{j.result_path or ''}:{j.error_path or ''}:{j.result_counts or ''}" for key, j in jobs)


def decide_eval(
    record: EvalRecord, state: State, first_seq: Mapping[str, int], waiting: frozenset[str] = frozenset()
) -> EvalAction | None:
    """What is due for the eval now (see the module's docstring); None: nothing (waiting on a job, or done).
    ``first_seq``: the first event's ``seq`` of each of :func:`candidates`; ``waiting``: the
    queued paths (normalised) still in the inbox."""
    done: list[tuple[str, JobState]] = []
    gen = record.generation
    if gen is not None:
        for f in gen.files:
            job = job_of(f, gen, state, first_seq)
            if job is None or not has_ended(job):
                return None
            done.append((f.key, job))
        if record.grading is None:
            if gen.files and all(j.ended in GRADABLE and j.result_path for _k, j in done):
                return QueueGrading(record.name, done[0][1].job_id)
            return _results(record, done)  # nothing to grade: every item errored
    grading = record.grading
    if grading is not None:
        pending = False
        for f in grading.files:
            job = job_of(f, grading, state, first_seq)
            if job is None and gen is not None and os.path.normpath(f.path) not in waiting:
                return Requeue(record.name, f.key, f.path)
            if job is None or not has_ended(job):
                pending = True
            else:
                done.append((f.key, job))
        if pending:
            return None
    return _results(record, done)


def _results(record: EvalRecord, done: list[tuple[str, JobState]]) -> WriteResults | None:
    fp = _fingerprint(done)
    if record.results_for == fp:
        return None
    return WriteResults(record.name, tuple((k, j.job_id) for k, j in done), fp)


def run_jobs(record: EvalRecord, state: State, first_seq: Mapping[str, int]) -> list[tuple[str, str, JobState | None]]:
    """Every queued file of the run as ``(stage, key, its job or None)``, in stage order: what
    `bgctl evals list` and `results` show as one run."""
    out: list[tuple[str, str, JobState | None]] = []
    for stage in (record.generation, record.grading):
        if stage is not None:
            out += [(stage.name, f.key, job_of(f, stage, state, first_seq)) for f in stage.files]
    return out


def run_state(record: EvalRecord, state: State, first_seq: Mapping[str, int]) -> str:
    """The run's state in one word: ``generating``, ``grading`` (a job of the stage not ended or
    not taken yet), ``results due`` (every job ended; the results not written for them) or ``done``."""
    for stage, _key, job in run_jobs(record, state, first_seq):
        if job is None or not has_ended(job):
            return "generating" if stage == "generation" else "grading"
    due = decide_eval(record, state, first_seq, frozenset(f.path for s in (record.grading,) if s for f in s.files))
    if isinstance(due, QueueGrading):
        return "grading"
    return "results due" if isinstance(due, WriteResults) else "done"
