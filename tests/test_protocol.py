"""The provider's documented protocol is exactly what the engine calls (issue 11, item 7)."""

from __future__ import annotations

import ast
from pathlib import Path

from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.protocol import Provider

SRC = Path(__file__).resolve().parents[1] / "src" / "batchgrader"
# the engine and the reconciliation it runs before anything is sent again
CALLERS = sorted((SRC / "daemon").rglob("*.py")) + [SRC / "provider" / "reconcile.py", SRC / "provider" / "pool.py"]
OPTIONAL = {"base_url", "on_page"}  # documented in Provider's docstring


def _protocol_methods() -> set[str]:
    return {n for n, v in vars(Provider).items() if not n.startswith("_") and callable(v)}


def _provider_uses() -> tuple[set[str], set[str]]:
    """Attributes read from a provider (``provider.x`` / ``self.provider.x`` /
    ``ctx.provider_for(job).x``), and the ones only probed with hasattr/getattr."""
    used: set[str] = set()
    probed: set[str] = set()
    for path in CALLERS:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                v = node.value
                by_job = isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "provider_for"
                if (
                    (isinstance(v, ast.Name) and v.id == "provider")
                    or (isinstance(v, ast.Attribute) and v.attr == "provider")
                    or by_job
                ):
                    used.add(node.attr)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
                target, name = node.args[0], node.args[1]
                if isinstance(name, ast.Constant) and "provider" in ast.unparse(target):
                    probed.add(name.value)
    return used, probed


def test_the_engine_calls_exactly_the_protocol():
    used, probed = _provider_uses()
    methods = _protocol_methods()
    assert methods == {
        "upload",
        "find_files",
        "create_batch",
        "find_batches",
        "retrieve",
        "cancel",
        "list_batches",
        "download",
        "delete_file",
        "complete",
    }
    assert used - OPTIONAL == methods  # nothing called outside the protocol, nothing in it unused
    assert probed <= OPTIONAL


def test_every_provider_implements_the_protocol():
    memory = MemoryProvider()
    assert isinstance(memory, Provider)
    for impl in (
        "batchgrader.provider.openai_api.OpenAIProvider",
        "batchgrader.provider.anthropic_batches.AnthropicBatchProvider",
    ):
        module, name = impl.rsplit(".", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
        assert _protocol_methods() <= {n for n in dir(cls) if callable(getattr(cls, n))}, impl
