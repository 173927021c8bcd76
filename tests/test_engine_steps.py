"""The engine's shape: every action :mod:`batchgrader.core.rules.decide` can return has a handler in
the engine's action table, and the steps are classes over the one context, none of which imports or
calls another (issue 36)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from batchgrader.core.rules import actions
from batchgrader.core.rules.actions import Action
from batchgrader.daemon.engine import Steps
from ticks import Rig

STEPS = Path(__file__).resolve().parents[1] / "src" / "batchgrader" / "daemon" / "steps"


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
    assert not missing, f"actions without a handler in daemon/engine.py action_table: {missing}"


def test_an_unknown_action_is_refused_not_ignored(rig):
    class Unknown(Action):
        pass

    job = rig.drop(1)
    with pytest.raises(TypeError, match="unknown action"):
        rig.engine.act(Unknown(job.job_id), rig.now)


def test_every_step_is_built_over_the_context_alone(rig):
    steps = rig.engine.steps
    assert isinstance(steps, Steps)
    ctx = rig.engine.ctx
    for name in ("intake", "preflight", "online", "prepare", "submit", "collect", "stragglers", "reuse", "finish", "panel"):
        step = getattr(steps, name)
        assert step.ctx is ctx, name
        assert list(inspect.signature(type(step).__init__).parameters) == ["self", "ctx"], name
        others = [k for k, v in vars(step).items() if k != "ctx" and type(v).__module__.startswith("batchgrader.daemon")]
        assert not others, f"{name} holds {others}"
    rig.engine.scan_requested = False
    assert steps.intake.scan_requested is False


def test_no_step_imports_another_or_reaches_into_one():
    """A step module imports no other step (nor the engine's table), a step class never names
    another step class of its module, and no step calls a private method of anything but itself."""
    for path in sorted(STEPS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Step")]
        for cls in classes:
            named = {n.id for n in ast.walk(cls) if isinstance(n, ast.Name)}
            assert not named & ({c.name for c in classes} - {cls.name}), f"{path.name}: {cls.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("batchgrader.daemon.steps", "batchgrader.daemon.engine")), path.name
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = ast.unparse(node.value)
                assert owner in ("self", "cls"), f"{path.name}: {owner}.{node.attr}"


def test_each_action_method_takes_the_action_the_job_and_the_clock(rig):
    """The one convention: a step method named in the table takes ``(action, job, now)``."""
    for kind, handler in rig.engine.handlers.items():
        if inspect.ismethod(handler):
            assert list(inspect.signature(handler).parameters)[:3] in (["a", "job", "now"], ["a", "panel", "now"]), kind
