"""decide() itself: a pure function of (state, config, now, timers) — no I/O, no clock, no provider."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.log.state import fold
from batchgrader.core.rules.actions import (
    CancelBatch,
    Create,
    FailUnstarted,
    Finish,
    Hold,
    Poll,
    Prepare,
    Release,
    Step,
    Timers,
    Upload,
)
from batchgrader.core.rules.decide import (
    budget_problem,
    decide,
    decide_job,
    ending,
    next_action,
    upload_name,
)
from ticks import Rig, config_text


@pytest.fixture
def rig(home):
    r = Rig(home, "split_row_limit: 2\nmax_simultaneous_batches: 2\n")
    yield r
    r.close()


def config(home, extra: str):
    home.config_file.write_text(config_text(extra))
    return load_config(home, environ={})


def snapshot(state):
    return copy.deepcopy(state)


def test_a_prepared_job_uploads_and_creates_within_capacity(rig):
    job = rig.drop(6)
    state = rig.engine.ctx.state
    before = snapshot(state)
    actions = decide(state, rig.engine.ctx.config, rig.now)
    j = job.job_id
    assert actions == [
        Upload(j, 0, 1, upload_name(j, 0, 1)),
        Create(j, 0),
        Upload(j, 1, 1, upload_name(j, 1, 1)),
        Create(j, 1),
    ]
    assert state == before  # decide changes nothing
    assert decide(state, rig.engine.ctx.config, rig.now) == actions  # and gives the same answer again


def test_not_before_and_step_skip_chunks(rig):
    job = rig.drop(6)
    j = job.job_id
    cfg = rig.engine.ctx.config
    timers = Timers(not_before={(j, 0): rig.now + 10})
    assert [a for a in decide_job(rig.engine.ctx.state, j, cfg, rig.now, timers) if isinstance(a, Upload)] == [
        Upload(j, 1, 1, upload_name(j, 1, 1)),
        Upload(j, 2, 1, upload_name(j, 2, 1)),
    ]
    assert [a.chunk for a in decide_job(rig.engine.ctx.state, j, cfg, rig.now + 11, timers) if isinstance(a, Upload)] == [0, 1]
    step = Step().after(Upload(j, 0, 1, upload_name(j, 0, 1)))
    # an action done in this tick is never repeated in it, whatever its outcome
    assert next_action(rig.engine.ctx.state, j, cfg, rig.now, Timers(), step) == Upload(j, 1, 1, upload_name(j, 1, 1))
    assert next_action(rig.engine.ctx.state, j, cfg, rig.now, Timers(), Step(stage=8)) is None  # nothing behind the stage


def test_unprepared_job_only_prepares(rig):
    (rig.home.inbox / "a.csv").write_text("id,response\n1,x\n")
    rig.tick()
    rig.engine.intake(rig.now + 1)  # accepted, not yet prepared
    (job,) = rig.engine.ctx.state.jobs.values()
    assert decide(rig.engine.ctx.state, rig.engine.ctx.config, rig.now) == [Prepare(job.job_id)]
    assert Prepare.ends_step


def test_budget_hold_and_release_depend_only_on_the_inputs(rig, home):
    job = rig.drop(2)
    j = job.job_id
    tight = config(home, "max_cost_per_job_usd: 0.0000001\n")
    (hold,) = decide_job(rig.engine.ctx.state, j, tight, rig.now)
    assert isinstance(hold, Hold) and hold.code == "max_cost_per_job_usd"
    assert budget_problem(rig.engine.ctx.state, job, rig.engine.ctx.config, rig.now) is None
    state = fold(rig.store.read())
    state.jobs[j].held = {"code": hold.code, "reason": hold.reason}
    assert decide_job(state, j, tight, rig.now) == []  # held: wait
    assert decide_job(state, j, rig.engine.ctx.config, rig.now)[0] == Release(j)  # the limit was raised


def test_daily_limits_count_the_utc_day(rig, home):
    job = rig.drop(2)
    cfg = config(home, "daily_cost_limit_usd: 1.0\n")
    state = rig.engine.ctx.state
    day = "1970-01-12"  # rig.now is 1,000,000 s after the epoch
    state2 = dataclasses.replace(state, spend_by_day={day: 0.9999999})
    assert budget_problem(state2, job, cfg, rig.now)[0] == "daily_cost_limit_usd"
    assert budget_problem(state2, job, cfg, rig.now + 86400) is None  # a new UTC day


def test_poll_due_and_cancel_sent_are_inputs(rig):
    job = rig.drop(2)
    rig.tick()
    j = job.job_id
    (c,) = [c for c in rig.engine.ctx.state.jobs[j].chunks.values() if c.in_flight]
    cfg = rig.engine.ctx.config
    due = Timers(next_poll={(j, c.index): (rig.now + 5, 0.5)})
    assert Poll(j, c.index, c.batch_id) not in decide_job(rig.engine.ctx.state, j, cfg, rig.now, due)
    assert Poll(j, c.index, c.batch_id) in decide_job(rig.engine.ctx.state, j, cfg, rig.now + 5, due)
    rig.control("CancelRequested")
    actions = decide_job(rig.engine.ctx.state, j, cfg, rig.now, due)
    assert actions[0] == CancelBatch(j, c.index, c.batch_id)
    assert [a for a in actions if isinstance(a, FailUnstarted)] == []  # one chunk, already sent
    sent = Timers(next_poll=due.next_poll, cancel_sent=frozenset({c.batch_id}))
    assert CancelBatch(j, c.index, c.batch_id) not in decide_job(rig.engine.ctx.state, j, cfg, rig.now, sent)


FINISH_EVENTS = ("OutboxWriteStarted", "ResultWritten", "InputArchived", "ProviderFilesDeleted", "JobCompleted")


def test_how_a_finished_job_ends(rig):
    job = rig.drop(2)
    j = job.job_id
    rig.tick()
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"
    state = fold(e for e in rig.store.read() if e.type not in FINISH_EVENTS)  # every chunk done, not finished
    actions = decide_job(state, j, rig.engine.ctx.config, rig.now)
    assert [type(a).__name__ for a in actions] == ["WriteResult", "Archive", "DeleteProviderFiles", "Finish"]
    assert actions[-1] == Finish(j, "JobCompleted", {"state": "completed", "succeeded": 2, "failed": 0})
    no_delete = config(rig.home, "split_row_limit: 2\ndelete_provider_files: false\n")
    assert "DeleteProviderFiles" not in [type(a).__name__ for a in decide_job(state, j, no_delete, rig.now)]
    state.jobs[j].cancel_requested = True
    assert ending(state.jobs[j]) == ("JobCancelled", {"succeeded": 2, "failed": 0})


def test_a_row_the_result_has_no_answer_for_never_ends_the_job_completed(rig):
    """A row no event failed but the result file has no answer for ("no result (row was not
    processed)": lost on the way) makes the job completed_with_errors, not completed."""
    import dataclasses

    job = rig.drop(3)
    rig.tick()
    rig.provider.finish_all()
    rig.tick()
    done = rig.engine.ctx.state.jobs[job.job_id]
    assert ending(done) == ("JobCompleted", {"state": "completed", "succeeded": 3, "failed": 0})
    lost = dataclasses.replace(done, result_counts=(2, 1))  # what ResultWritten said: one row without an answer
    assert ending(lost) == ("JobCompleted", {"state": "completed_with_errors", "succeeded": 3, "failed": 1})
