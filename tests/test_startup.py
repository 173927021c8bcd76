"""Start-up pays only for what it uses: a daemon builds a provider (imports its SDK, starts the
sandbox's emulator) at the provider's first call, so a job answered entirely from the answers
store runs without either."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from batchgrader.core.state import fold
from batchgrader.daemon.process import DeferredProvider
from batchgrader.store.eventstore import EventStore
from emulator_fixtures import API_KEY, clock, emu, emu_factory  # noqa: F401 - fixtures
from harness import FAST_CONFIG, daemon_env


def imported(importtime_stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported (its stderr)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def daemon_once(home: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = daemon_env(home, None, key=None)
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "batchgrader.cli", "daemon", "--sandbox", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res, imported(res.stderr)


OPENAI = {"openai", "batchgrader.provider.openai_api", "batchgrader.emulator"}
SDKS = OPENAI | {"anthropic", "google.genai"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_answered_from_the_store_runs_without_the_provider_sdk_or_the_emulator(home, tmp_path):
    home.config_file.write_text(FAST_CONFIG)
    src = tmp_path / "essays.csv"
    src.write_text("id,response\n1,first essay\n2,second essay\n3,first essay\n", encoding="utf-8")
    shutil.copy(src, home.inbox / "essays.csv")
    _, first = daemon_once(home.root)  # rows to send: the provider is built, the emulator started
    # (its module may be imported by a background thread, whose importtime lines can interleave)
    assert {"openai", "batchgrader.emulator"} <= first and "anthropic" not in first
    assert (home.root / "sandbox").is_dir()
    shutil.rmtree(home.root / "sandbox")
    shutil.copy(src, home.inbox / "again.csv")
    _, second = daemon_once(home.root)
    assert not SDKS & second, sorted(SDKS & second)
    assert not (home.root / "sandbox").exists()  # the emulator was never started
    with EventStore(home.db, readonly=True) as s:
        jobs = sorted(fold(s.read()).jobs.values(), key=lambda j: j.created_ts)
    assert [j.ended for j in jobs] == ["completed", "completed"]
    assert jobs[1].cached_rows == 3 and jobs[1].requests == 0 and jobs[1].chunks == {}
    import csv

    a, b = (list(csv.DictReader(Path(j.result_path or "").open(encoding="utf-8"))) for j in jobs)
    # the same answers; the second job's rows are reused and bill no token (issue 27, item 7)
    assert [(r["id"], r["grade"], r["error"]) for r in a] == [(r["id"], r["grade"], r["error"]) for r in b]
    assert [r["answered_by"] for r in b] == ["reused"] * 3
    assert all(r["input_tokens"] == r["output_tokens"] == "0" for r in b)


def test_a_deferred_provider_is_built_once_at_its_first_use_and_not_for_its_repr():
    built: list[int] = []

    class Real:
        base_url = "http://x"
        on_page = None

        def retrieve(self, batch_id: str) -> str:
            return f"batch {batch_id}"

    def build() -> Real:
        built.append(1)
        return Real()

    p = DeferredProvider("openai", build)
    assert "built=False" in repr(p) and not p.built and built == []
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(p)
    assert built == []
    assert p.retrieve("b1") == "batch b1" and p.base_url == "http://x"
    p.on_page = print  # passed on to the provider built
    assert built == [1] and p.built and p._real.on_page is print


def test_a_deferred_providers_sdk_is_imported_ahead_while_a_job_is_prepared(home, tmp_path, monkeypatch):
    """While a job with rows to send is prepared (seconds to minutes of counting), the SDK of its
    provider is imported in the background (``prefetch``: once, building nothing), so the first
    upload after it does not wait about a second for the import.  The engine says which provider
    has rows to send (``on_rows_to_send``), the daemon finds it behind the router; a job answered
    from the store says nothing (see the test below: no SDK is imported then)."""
    from batchgrader.core.home import Home
    from batchgrader.daemon.process import Daemon
    from ticks import Rig

    (tmp_path / "bg_fake_sdk_for_prefetch.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    built: list[int] = []
    deferred = DeferredProvider("openai", lambda: built.append(1), "bg_fake_sdk_for_prefetch")
    daemon = Daemon(Home(tmp_path / "daemon-home"), deferred={"openai": deferred})
    daemon.prefetch("anthropic")  # not configured here: nothing to ready
    daemon.prefetch("openai")
    assert deferred._prefetching is not None
    deferred._prefetching.join(timeout=30)
    assert "bg_fake_sdk_for_prefetch" in sys.modules and built == [] and not deferred.built
    assert deferred.prefetch() is None  # once
    assert DeferredProvider("openai", lambda: None, "no_such_sdk_module_anywhere").prefetch().join(timeout=30) is None

    rig = Rig(home)
    to_send: list[str] = []
    rig.engine.ctx.on_rows_to_send = to_send.append
    rig.drop(3)
    assert to_send == ["openai"]  # once, at the first row to send
    rig.close()


def test_the_listing_heartbeat_reaches_a_deferred_provider_behind_the_router(emu):
    """The engine sets ``on_page`` on whatever provider it has (a router of deferred providers in
    the daemon): setting it builds nothing, and once built, every page listed feeds the heartbeat
    (the systemd watchdog during a long listing)."""
    from batchgrader.provider.openai_api import OpenAIProvider
    from batchgrader.provider.router import ProviderRouter

    deferred = DeferredProvider("openai", lambda: OpenAIProvider(api_key=API_KEY, base_url=emu.base_url, timeout=10))
    router = ProviderRouter({"openai": deferred})
    beats: list[int] = []
    router.on_page = lambda: beats.append(1)
    assert not deferred.built and beats == []
    router.list_batches()
    assert deferred.built and len(beats) == 1
    deferred.find_files("nothing.jsonl")
    assert len(beats) == 2


def test_a_missing_api_key_is_still_refused_at_start_up(home):
    env = {**daemon_env(home.root, None, key=None), "PATH": os.environ.get("PATH", "")}
    res = subprocess.run(
        [sys.executable, "-m", "batchgrader.cli", "daemon", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 78 and "OPENAI_API_KEY" in res.stderr
