"""The engine's shape: every action :mod:`batchgrader.core.decide` can return has a handler in
the dispatch table, and the step objects share one context (no step reaches another through a
shared ``self``)."""

from __future__ import annotations

import inspect

import pytest

from batchgrader.core import actions
from batchgrader.core.actions import Action
from batchgrader.daemon.dispatch import EngineSteps
from ticks import Rig


def _action_types() -> list[type[Action]]:
    return [
        t
        for _, t in inspect.getmembers(actions, inspect.isclass)
        if issubclass(t, Action) and t is not Action and t.__module__ == actions.__name__
    ]


@pytest.fixture
def rig(home):
    r = Rig(home)
    yield r
    r.close()


def test_every_action_type_has_a_handler(rig):
    table = rig.engine.handlers
    missing = [t.__name__ for t in _action_types() if not any(k in table for k in t.__mro__)]
    assert not missing, f"actions without a handler in daemon/dispatch.py: {missing}"


def test_an_unknown_action_is_refused_not_ignored(rig):
    class Unknown(Action):
        pass

    job = rig.drop(1)
    with pytest.raises(TypeError, match="unknown action"):
        rig.engine.act(Unknown(job.job_id), rig.now)


def test_the_steps_share_one_context_and_the_engine_surface_reads_it(rig):
    steps = rig.engine.steps
    assert isinstance(steps, EngineSteps)
    ctx = rig.engine.ctx
    for name in ("intake", "reuse", "finish", "collect", "submit", "prepare", "preflight"):
        assert getattr(steps, name).ctx is ctx, name
    assert steps.finish.intake is steps.intake and steps.prepare.submit is steps.submit
    assert rig.engine.ctx.state is ctx.state and rig.engine.ctx.config is ctx.config
    rig.engine.ctx.merge_workers = None
    seen: list[str] = []
    rig.engine.ctx.on_rows_to_send = seen.append
    assert ctx.on_rows_to_send is rig.engine.ctx.on_rows_to_send
    rig.engine.scan_requested = False
    assert steps.intake.scan_requested is False
