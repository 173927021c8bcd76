"""The screen and systemd read an immutable snapshot taken by the tick thread, never the live state."""

from __future__ import annotations

from types import SimpleNamespace

from batchgrader.cli.render import LiveView
from batchgrader.core.log.state import State
from batchgrader.core.rules.due import TickOutcome, TickPace
from batchgrader.daemon.process import Daemon
from batchgrader.store.snapshot import Snapshot, take
from ticks import Rig


class MutatingJobs(dict):
    """The jobs dict as another thread sees it while the tick thread adds a job: iterating it fails."""

    def _changing(self, *a, **k):
        raise RuntimeError("dictionary changed size during iteration")

    __iter__ = values = items = keys = _changing  # type: ignore[assignment]


class Notifier:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def watchdog_interval(self) -> None:
        return None

    def status(self, line: str) -> None:
        self.lines.append(line)


def test_a_snapshot_is_a_value_the_tick_thread_can_no_longer_change(home):
    rig = Rig(home, "split_row_limit: 2\n")
    rig.drop(4)
    rig.tick()
    snap = take(rig.engine.ctx.state)
    assert snap.status_line(sandbox=False) == "1 active jobs, 2 batches running, 0 finished"
    (row,) = snap.jobs
    assert (row.state, row.chunks_done, row.chunks_total, row.running) == ("running", 0, 2, 2)
    rig.provider.finish_all()
    rig.tick()  # the job finishes: the live state changes, the snapshot taken before does not
    assert snap.jobs == (row,) and snap.status_line(sandbox=False) == "1 active jobs, 2 batches running, 0 finished"
    assert (
        take(rig.engine.ctx.state).status_line(sandbox=True) == "SANDBOX (simulated) 0 active jobs, 0 batches running, 1 finished"
    )
    rig.close()


def test_the_main_loop_never_iterates_the_state_the_tick_thread_mutates(home):
    state = State()
    state.jobs = MutatingJobs()
    engine = SimpleNamespace(state=state, idle=True, scan_requested=False)
    daemon = Daemon(home, once=True, view=LiveView(sandbox=False))
    daemon.snapshot = Snapshot()
    notifier = Notifier()
    tick = lambda: TickOutcome(None, 0.0)  # noqa: E731
    assert daemon._main_loop(engine, notifier, tick, TickPace.of(60.0)) == 0
    assert notifier.lines == ["0 active jobs, 0 batches running, 0 finished"]
