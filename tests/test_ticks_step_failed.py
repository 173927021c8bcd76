"""Nothing loops without a bound (issue 32 item 4): a job whose step keeps raising an error no
rule foresaw (here the client raising something that is no provider error at every poll) is tried
again at the next ticks, then held with the error after STEP_FAILURES_MAX tries in a row, so a
`daemon --once` ends and `bgctl status` says why; `bgctl retry` tries it again and `bgctl cancel`
ends it.  Before, it was tried at every tick without end."""

from __future__ import annotations

from batchgrader.core.rules.decide import STEP_FAILED, STEP_FAILURES_MAX
from batchgrader.daemon.control import apply_control
from ticks import Rig


def _rig(home) -> Rig:
    rig = Rig(home)
    rig.drop(2)
    rig.tick()  # uploaded and created
    for _ in range(50):
        rig.provider.fail_next("retrieve", "broken")
    return rig


def test_a_step_that_keeps_raising_holds_its_job_with_the_error_and_nothing_more_is_sent(home):
    rig = _rig(home)
    try:
        for _ in range(STEP_FAILURES_MAX + 3):
            rig.tick()
        job = rig.job()
        assert job.held and job.held["code"] == STEP_FAILED
        assert "RuntimeError: scripted: batches.retrieve raised" in job.held["reason"] and "bgctl retry" in job.held["reason"]
        assert not rig.engine.busy()  # daemon --once ends: the job waits for the user
        polled = rig.calls("retrieve")
        assert polled == STEP_FAILURES_MAX  # one poll per failing try, then none
        for _ in range(5):
            rig.tick(60)
        assert rig.calls("retrieve") == polled and len(rig.events("JobHeld")) == 1
    finally:
        rig.close()


def test_retry_of_a_job_held_for_an_unexpected_error_tries_again_and_it_completes(home):
    rig = _rig(home)
    try:
        for _ in range(STEP_FAILURES_MAX + 1):
            rig.tick()
        job = rig.job()
        assert job.held and job.held["code"] == STEP_FAILED
        rig.provider._faults.queues.clear()  # fixed (an upgrade)
        assert apply_control(rig.engine, {"action": "retry", "job_id": job.job_id, "reason": "fixed"}) is None
        for _ in range(10):
            rig.tick()
            rig.provider.finish_all()
            if rig.job().ended:
                break
        assert rig.job().ended == "completed" and not rig.job().held
    finally:
        rig.close()


def test_cancel_of_a_job_held_for_an_unexpected_error_ends_it(home):
    rig = _rig(home)
    try:
        for _ in range(STEP_FAILURES_MAX + 1):
            rig.tick()
        job = rig.job()
        rig.provider._faults.queues.clear()
        assert apply_control(rig.engine, {"action": "cancel", "job_id": job.job_id, "reason": "no"}) is None
        for _ in range(10):
            rig.tick()
            rig.provider.finish_all()
            if rig.job().ended:
                break
        assert rig.job().ended == "cancelled" and rig.calls("complete") == 0
        assert rig.events("JobReleased")[-1]["reason"] == "bgctl cancel of a job held for an unexpected error"
    finally:
        rig.close()
