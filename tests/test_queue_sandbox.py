"""Issue 32 item 3: a sandbox job's batches are in the emulator's queue, not the provider's:
they take none of a real job's ``max_simultaneous_batches``, enqueued tokens or daily budget, and
a job waiting for a batch slot says so in ``bgctl status``.  Tick by tick, in-memory providers."""

from __future__ import annotations

from rich.console import Console

from batchgrader.cli.render_status import render_status
from batchgrader.core.host.home import Home
from batchgrader.store import queries
from test_sandbox_apart import CONFIG, Daemon, _drop, _running


def test_a_sandbox_batch_in_flight_leaves_a_real_job_its_batch_slot(home: Home) -> None:
    home.config_file.write_text(CONFIG + "max_simultaneous_batches: 1\n")
    sandbox = Daemon(home, sandbox=True, now=1_000_000.0)
    _drop(home)
    assert _running(sandbox).sandbox
    now = sandbox.close()

    real = Daemon(home, sandbox=False, now=now)
    _drop(home, "b.csv")
    job = _running(real, "b.csv")  # its batch is sent: the sandbox's batch is not in its queue
    assert not job.sandbox and real.provider.calls and real.provider.open_batches()
    real.close()


def test_a_job_waiting_for_a_batch_slot_says_so_in_status(home: Home) -> None:
    home.config_file.write_text(CONFIG + "max_simultaneous_batches: 1\n")
    real = Daemon(home, sandbox=False, now=1_000_000.0)
    _drop(home)
    _running(real)
    _drop(home, "b.csv")
    for _ in range(6):
        real.tick(30.0)  # the inbox is looked at again every rescan_interval_seconds
    assert real.job("b.csv").state == "queued" and len(real.provider.open_batches()) == 1
    (row,) = [r for r in queries.status(home) if r["file"] == "b.csv"]
    assert row["waiting_for"]["code"] == "max_simultaneous_batches"
    console = Console(record=True, width=200)
    render_status(queries.status(home), console)
    shown = " ".join(console.export_text().split())
    assert f"{row['job_id']} waiting for a batch slot: 1 of max_simultaneous_batches 1 in use" in shown
    real.close()


def test_a_sandbox_jobs_estimate_takes_nothing_of_a_real_jobs_daily_limit(home: Home) -> None:
    # 3 rows x 1,000 output tokens at gpt-5.4-mini's Batch price: about $0.0068 a job; two do not fit $0.01
    config = CONFIG.replace("max_completion_tokens: 50", "max_completion_tokens: 1000") + "daily_cost_limit_usd: 0.01\n"
    home.config_file.write_text(config)
    sandbox = Daemon(home, sandbox=True, now=1_000_000.0)
    _drop(home)
    assert _running(sandbox).sandbox
    now = sandbox.close()

    real = Daemon(home, sandbox=False, now=now)
    _drop(home, "b.csv")
    job = _running(real, "b.csv")
    assert not job.held and real.provider.open_batches()
    real.close()
