"""Tick-level (in-memory provider, fake clock): retries keep the grouping of identical rows, and
the ``on_job_end`` command of a job that fails in prepare sees its error report."""

from __future__ import annotations

import time
from pathlib import Path

from ticks import Rig


def _batch_inputs(rig: Rig) -> list[list[dict]]:
    """The request lines of every batch input file uploaded so far, in upload order."""
    files = [f for f in rig.provider.files.values() if f.info.purpose == "batch"]
    return [rig.provider.requests_in(f.info.id) for f in files]


def test_a_failed_leader_is_retried_once_and_its_duplicates_copy_its_answer(home):
    rig = Rig(home, "max_row_retries: 2\n")
    texts = ["same answer", "other", "same answer", "same answer", "third", "same answer"]
    (home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)))
    rig.tick()
    assert rig.tick()[:2] == ["JobAccepted", "JobPrepared"]
    rig.tick()
    (first,) = _batch_inputs(rig)
    assert len(first) == 3  # "same answer" is sent once
    leader = next(r["custom_id"] for r in first if r["body"]["messages"][-1]["content"].endswith("same answer"))
    rig.provider.row_errors = {leader: ("server_error", "try again")}
    rig.provider.finish_all()
    assert rig.tick()[-1] == "RetryPlanned"
    (retry,) = rig.events("RetryPlanned")
    assert len(retry["custom_ids"]) == 4 and leader in retry["custom_ids"]  # the leader and its 3 duplicates
    assert retry["requests"] == 1  # ... sent as one request
    rig.provider.row_errors = {}
    rig.tick()
    inputs = _batch_inputs(rig)
    assert len(inputs) == 2 and [r["custom_id"] for r in inputs[1]] == [leader]
    rig.provider.finish_all()
    for _ in range(5):
        rig.tick()
        if rig.job().ended:
            break
    job = rig.job()
    assert job.ended == "completed" and not job.failed_rows and job.succeeded_rows == 6
    rows = rig.result_rows()
    same = [r for r in rows if r["response"] == "same answer"]
    assert len(same) == 4 and all(r["error"] == "" for r in rows)
    assert len({r["grade"] for r in same}) == 1 and same[0]["grade"]
    assert rig.calls("upload") == 2  # the first chunk (3 requests) and the retry (1): no duplicate sent alone
    rig.close()


def _wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written within {timeout} s")


def test_on_job_end_of_a_job_failing_in_prepare_sees_its_error_report(home, tmp_path):
    out = tmp_path / "hook.txt"
    hook = f'on_job_end: \'if test -s "$BG_ERROR_PATH"; then echo "$BG_JOB_STATE report $BG_ERROR_PATH"; else echo "$BG_JOB_STATE no-report [$BG_ERROR_PATH]"; fi >> {out}\'\n'
    rig = Rig(home, hook)
    (home.inbox / "bad.csv").write_text('id,response\n1,"never closed\n')
    rig.tick()
    rig.tick()
    job = rig.job()
    assert job.ended == "failed" and job.error_path
    line = _wait_for(out)
    assert line == f"failed report {job.error_path}\n"
    rig.close()


def test_on_job_end_after_a_crash_between_naming_and_writing_the_error_report(home, tmp_path):
    """kill -9 after ``OutboxWriteStarted`` named the error report but before it was written: on
    restart the job fails in prepare again, and the hook runs only once the report exists."""
    from batchgrader.store.eventstore import EventStore, NewEvent

    rig = Rig(home)
    (home.inbox / "bad.csv").write_text('id,response\n1,"never closed\n')
    rig.tick()
    rig.tick()
    job = rig.job()
    assert job.ended == "failed"
    kept = []
    for e in rig.store.read():
        kept.append(e)
        if e.type == "OutboxWriteStarted":
            break
    rig.close()
    # the state a kill -9 leaves at that point: the report named but not written, the input in work/
    Path(job.error_path).unlink()
    Path(job.archived_path).rename(job.input_path)
    home.db.unlink()
    with EventStore(home.db) as store:
        for e in kept:
            store.append(e.job_id, [NewEvent(e.type, e.payload)])

    out = tmp_path / "hook.txt"
    hook = f'on_job_end: \'if test -s "$BG_ERROR_PATH"; then echo "report $BG_ERROR_PATH"; else echo "no-report [$BG_ERROR_PATH]"; fi >> {out}\'\n'
    rig = Rig(home, hook)
    assert rig.job().outbox == "started" and not rig.job().ended
    rig.tick()
    job = rig.job()
    assert job.ended == "failed" and job.error_path and Path(job.error_path).is_file()
    assert Path(job.error_path).read_text().startswith("BatchGrader could not process bad.csv")
    assert _wait_for(out) == f"report {job.error_path}\n"
    rig.close()
