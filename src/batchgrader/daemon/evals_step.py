"""The daemon's eval step: what an imported eval needs from the daemon once its jobs move.

NOT REGISTERED YET: the engine does not call it (the daemon's steps are being restructured).
Wired, it runs once per tick after every job has been taken a step further (so a job that
ended in this tick is seen), over the evals imported into the home (``<home>/evals/*``):

* the decision is :func:`batchgrader.core.evalchain.decide_eval` over what the eval's folder
  records and the engine's folded state (pure; each candidate job's first event ``seq`` is read
  once from the store and kept);
* :class:`~batchgrader.core.evalchain.QueueGrading`: the generation of a generate-then-grade run
  ended with its result written, so its grading is queued
  (:func:`batchgrader.pipeline.evals.chain.queue_grading`: recorded in the eval's folder before
  any file is copied into the inbox, so a daemon killed between the two jobs queues it once);
* :class:`~batchgrader.core.evalchain.Requeue`: a recorded grading file that a crash kept from
  the inbox is copied there again;
* :class:`~batchgrader.core.evalchain.WriteResults`: every job of the eval ended, so run.json,
  output_items.jsonl and the report are written into the outbox
  (:func:`batchgrader.pipeline.evals.results.finish`), with no `bgctl evals results`; written
  once per set of job results, again after a crash that came before the record.

:meth:`EvalStep.run` returns whether it copied a file into the inbox (the engine then scans the
inbox and ticks again at once).  An eval whose folder cannot be read, or whose effect fails, is
logged and tried again at the next tick; it never stops the jobs.
"""

from __future__ import annotations

import logging
import os

from batchgrader.core import evalchain as ec
from batchgrader.daemon.context import Context
from batchgrader.pipeline.evals import chain
from batchgrader.pipeline.evals import folder as evfolder

log = logging.getLogger("batchgrader.engine")


class EvalStep:
    """The eval step (see the module docstring), on the engine's shared :class:`Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.first_seq: dict[str, int] = {}  # job id -> the seq of its first event (never changes)

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
        queued = False
        for name in evfolder.names(self.ctx.home):
            try:
                due = self.decide(name)
                if due is not None:
                    queued |= self.act(due, now)
            except (OSError, ValueError, KeyError) as exc:  # one eval's problem never stops the others, nor the jobs
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
