"""A result that cannot be written (issue 27, item 2): the cause is the job's last error in
`status`, `status JOB` and `--json`, the write is tried again with a back-off, and the cause is
recorded and logged once per change, not twice a second."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from batchgrader.store import queries
from cli_fixtures import run
from ticks import Rig


def _lock(outbox: Path) -> None:
    """Make the outbox a folder nobody may write to (for root, who ignores modes: /sys)."""
    shutil.rmtree(outbox)
    if os.geteuid() == 0:
        if not Path("/sys").is_dir() or os.access("/sys", os.W_OK) and Path("/sys").stat().st_mode & 0o200:
            pytest.skip("running as root without a read-only /sys to stand for an unwritable folder")
        outbox.symlink_to("/sys")
    else:
        outbox.mkdir()
        outbox.chmod(0o500)


def _unlock(outbox: Path) -> None:
    if outbox.is_symlink():
        outbox.unlink()
        outbox.mkdir()
    else:
        outbox.chmod(0o700)


def test_an_unwritable_outbox_is_the_jobs_last_error_and_is_tried_again_later(home, caplog, monkeypatch):
    rig = Rig(home)
    try:
        job = rig.drop(3)
        rig.tick()
        rig.tick()
        rig.provider.finish_all()
        _lock(home.outbox)
        with caplog.at_level(logging.WARNING, logger="batchgrader.engine"):
            first = rig.tick()
            for _ in range(3):
                assert rig.tick() == []  # backing off: nothing recorded, nothing tried
        expected = f"cannot write the outbox: permission denied: {home.outbox}"
        assert first[-1] == "OutboxWriteFailed" and "ResultWritten" not in first
        assert rig.events("OutboxWriteFailed") == [{"path": str(home.outbox), "error": expected, "code": "permission_denied"}]
        warnings = [r.getMessage() for r in caplog.records if "cannot write the outbox" in r.getMessage()]
        assert len(warnings) == 1
        assert rig.engine.ctx.state.jobs[job.job_id].last_error == expected
        rig.store.close()
        (row,) = queries.status(home)
        assert row["last_error"] == expected and row["state"] == "downloading"
        assert queries.job_detail(home, job.job_id)["last_error"] == expected
        monkeypatch.setenv("BATCHGRADER_HOME", str(home.root))
        assert expected in run("status", columns=200).output.replace("\n", "")
        assert expected in run("status", job.job_id, columns=300).output
        rig = Rig(home)  # the daemon restarts: it tries at once, and records the same cause no second time
        assert rig.tick() == []
        assert len(rig.events("OutboxWriteFailed")) == 1
        _unlock(home.outbox)
        assert "ResultWritten" not in rig.tick(2.0)  # the back-off (5 s) has not passed yet
        done = rig.tick(5.0)
        assert "ResultWritten" in done and done[-1] == "JobCompleted"
        assert rig.engine.ctx.state.jobs[job.job_id].last_error is None  # the outbox error is over
        assert [r["id"] for r in rig.result_rows()] == ["0", "1", "2"]
    finally:
        if home.outbox.is_symlink():
            _unlock(home.outbox)
        rig.close()


def test_cancelling_a_retry_leaves_a_completed_with_errors_job_as_it_was(home):
    """Issue 27, item 11: `bgctl retry` then `bgctl cancel` ends the job as its rows say
    (completed_with_errors), not `cancelled`; a job that was never ended before is cancelled."""
    rig = Rig(home, "max_row_retries: 0\n")
    try:
        rig.drop(3)
        rig.tick()
        ids = rig.provider.requests_in(next(iter(rig.provider.files)))
        rig.provider.row_errors = {ids[1]["custom_id"]: ("server_error", "try again")}
        rig.provider.finish_all()
        rig.tick()
        assert rig.job().ended == "completed_with_errors"
        rig.control("RetryRequested")
        rig.tick()
        rig.tick()
        (batch,) = rig.provider.open_batches()
        rig.control("CancelRequested")
        rig.tick()
        assert rig.calls("cancel") == 1  # the retry's batch is cancelled at the provider
        rig.provider.finish(batch.id, "cancelled", answered=0)
        types = rig.tick()
        for _ in range(3):
            if rig.job().ended:
                break
            types = rig.tick()
        assert rig.job().ended == "completed_with_errors" and "JobCancelled" not in types
        errors = [r["error"] for r in rig.result_rows(sorted(p.name for p in home.outbox.iterdir())[-1])]
        assert errors.count("") == 2 and rig.job().succeeded_rows == 2
    finally:
        rig.close()


def test_a_row_refused_with_400_is_not_retried_automatically_but_bgctl_retry_resends_it(home):
    """Issue 27, item 11: a 400 (a refused request) fails again if resent as it is, so it is not
    resent automatically; a 500 is.  `bgctl retry` still resends both."""
    rig = Rig(home, "max_row_retries: 2\n")
    try:
        rig.drop(3)
        rig.tick()
        ids = [r["custom_id"] for r in rig.provider.requests_in(next(iter(rig.provider.files)))]
        rig.provider.row_errors = {ids[0]: ("invalid_value", "bad parameter"), ids[1]: ("server_error", "try again")}
        rig.provider.finish_all()
        types = rig.tick()
        assert types[-1] == "RetryPlanned"
        (retry,) = rig.events("RetryPlanned")
        assert retry["custom_ids"] == [ids[1]]  # the 500 only
        (failed,) = rig.events("RowsFailed")
        assert {r["custom_id"]: r.get("status") for r in failed["rows"]} == {ids[0]: 400, ids[1]: 500}
        rig.provider.row_errors = {}
        rig.tick()
        rig.provider.finish_all()
        types = rig.tick()
        assert types[-1] == "JobCompleted" and rig.job().ended == "completed_with_errors"
        assert list(rig.job().failed_rows) == [ids[0]]
        rig.control("RetryRequested")  # the user fixed the cause: bgctl retry resends it
        rig.tick()
        assert rig.events("RetryPlanned")[-1]["custom_ids"] == [ids[0]]
    finally:
        rig.close()
