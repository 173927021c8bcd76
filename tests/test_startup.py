"""Start-up pays only for what it uses: a daemon builds a provider (imports its SDK, starts the
sandbox's emulator) at the provider's first call, or ahead of it in the background when a job
will call it (a file seen, or an idle daemon's inbox, while the answers store could answer
nothing), so a job answered entirely from the answers store runs without either."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from batchgrader.core.log.state import fold
from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.pool import Providers
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


def test_a_provider_is_built_once_at_its_first_use_and_not_for_its_repr():
    built: list[int] = []

    class Real:
        base_url = "http://x"
        on_page = None

        def retrieve(self, batch_id: str) -> str:
            return f"batch {batch_id}"

    def build() -> Real:
        built.append(1)
        return Real()

    providers = Providers({"openai": build})  # type: ignore[dict-item]
    assert "built=[]" in repr(providers) and built == []
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(providers)
    providers.set_on_page(print)  # kept for the provider built later
    assert built == []
    p = providers.get("openai")
    assert p.retrieve("b1") == "batch b1" and providers.get("openai") is p  # type: ignore[attr-defined]
    assert built == [1] and p.on_page is print  # type: ignore[attr-defined]


def test_a_providers_sdk_is_imported_and_its_client_built_ahead_while_a_job_is_prepared(home, tmp_path, monkeypatch):
    """While a job with rows to send is prepared (seconds to minutes of counting), its provider is
    built in the background (``prefetch``: once; the SDK imported, the client made), so the first
    upload after it does not wait for them.  The prepare step asks at the first row to send; a job
    answered from the store asks nothing (see the test above: no SDK is imported then)."""
    from ticks import Rig

    (tmp_path / "bg_fake_sdk_for_prefetch.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    built: list[str] = []

    def build():  # noqa: ANN202
        importlib.import_module("bg_fake_sdk_for_prefetch")  # the costly part: the SDK's import
        built.append("openai")
        return MemoryProvider()

    providers = Providers({"openai": build})
    assert providers.prefetch("anthropic") is None  # not configured here: nothing to ready
    thread = providers.prefetch("openai")
    assert thread is not None
    thread.join(timeout=30)
    assert "bg_fake_sdk_for_prefetch" in sys.modules and built == ["openai"]
    assert providers.prefetch("openai") is None  # once

    def broken():  # noqa: ANN202
        raise RuntimeError("no such SDK")

    failing = Providers({"openai": broken})
    failing.prefetch("openai").join(timeout=30)  # reported by the call that needs it, not here
    with pytest.raises(RuntimeError, match="no such SDK"):
        failing.get("openai")

    rig = Rig(home)
    memory = rig.provider
    asked = threading.Event()

    def build_rig():  # noqa: ANN202
        asked.set()
        return memory

    rig.engine.ctx.providers = Providers({"openai": build_rig})
    rig.drop(3)  # accepted and prepared: nothing sent yet
    assert asked.wait(timeout=30)  # built from the first row to send on, in the background
    assert memory.calls == []
    rig.close()


def test_a_file_seen_in_the_inbox_builds_its_provider_ahead_unless_the_store_may_answer_it(home, tmp_path):
    """Issue 38: the SDK's import and the client's construction are off the critical path: a file
    seen in the inbox, not yet stable, has its profile's provider built in the background while it
    becomes stable and its job starts (the preflight's first row needs it at once).  Not while the
    answers store holds answers the profile reads: a job they answer whole never builds it."""
    from ticks import Rig

    rig = Rig(home)
    built = threading.Event()

    def build():  # noqa: ANN202
        built.set()
        return rig.provider

    rig.engine.ctx.providers = Providers({"openai": build})
    (home.inbox / "a.csv").write_text("id,response\n0,first\n1,second\n")
    assert rig.tick() == []  # seen, not yet stable: no job yet
    assert built.wait(timeout=30)  # built meanwhile, in the background
    job = rig.run_file("a.csv", ["first", "second"])
    assert job.ended == "completed" and rig.calls("upload") == 1  # its answers are in the store now

    again = threading.Event()

    def build_again():  # noqa: ANN202
        again.set()
        return rig.provider

    rig.engine.ctx.providers = Providers({"openai": build_again})  # a daemon started again
    job = rig.run_file("b.csv", ["first", "second"])  # answered whole from the store
    assert job.ended == "completed" and job.cached_rows == 2
    assert not any(t.name == "prefetch-openai" for t in threading.enumerate())  # no build under way ...
    assert not again.is_set()  # ... nor done: never built
    rig.close()


def test_an_idle_daemon_readies_the_inbox_files_tokenizer_then_provider_at_its_first_scan(home):
    """Issue 38: a daemon waiting for files readies, from its first scan on and in the background,
    what a file dropped into the inbox will first need: the default profile's tokenizer, then its
    provider (the build waits for the tokenizer's); the first file after a start waits for
    neither.  Not while the answers store may answer that file, and not in the sandbox (whose
    provider is an emulator started for the first file that needs it)."""
    from batchgrader.core.configuration.config import load_config
    from batchgrader.daemon.engine import Engine
    from batchgrader.pipeline import tokens
    from batchgrader.pipeline.pricing import load_pricing
    from ticks import Rig

    rig = Rig(home)
    built = threading.Event()

    def build():  # noqa: ANN202
        built.set()
        return rig.provider

    rig.engine.ctx.providers = Providers({"openai": build})
    assert rig.tick() == []  # an empty inbox: nothing happens ...
    assert built.wait(timeout=30)  # ... but the provider is built meanwhile
    assert "o200k_base" in tokens._AHEAD  # and the tokenizer's build was started (before it)
    job = rig.run_file("a.csv", ["first", "second"])  # its answers go to the store
    assert job.ended == "completed"

    def restarted(sandbox: bool) -> threading.Event:
        asked = threading.Event()

        def build_again():  # noqa: ANN202
            asked.set()
            return rig.provider

        rig.engine = Engine(home, load_config(home, environ={}), rig.store, rig.provider, load_pricing(), sandbox=sandbox)
        rig.engine.ctx.providers = Providers({"openai": build_again})
        assert rig.tick() == []
        return asked

    asked = restarted(sandbox=False)  # the store may answer the next file: its provider waits for it
    assert not any(t.name == "prefetch-openai" for t in threading.enumerate()) and not asked.is_set()
    assert rig.store.answers.clear(now=rig.now) == 2
    asked = restarted(sandbox=True)  # the sandbox's emulator waits for a file that needs it
    assert not any(t.name == "prefetch-openai" for t in threading.enumerate()) and not asked.is_set()
    asked = restarted(sandbox=False)  # nothing the store could answer: built ahead again
    assert asked.wait(timeout=30)
    rig.close()


def test_the_listing_heartbeat_reaches_a_provider_built_later(emu):
    """The engine sets the listing heartbeat on its providers: setting it builds nothing, and once a
    provider is built, every page listed feeds the heartbeat (the systemd watchdog during a long
    listing)."""
    from batchgrader.provider.openai_api import OpenAIProvider

    providers = Providers({"openai": lambda: OpenAIProvider(api_key=API_KEY, base_url=emu.base_url, timeout=10)})
    beats: list[int] = []
    providers.set_on_page(lambda: beats.append(1))
    assert providers.built() == {} and beats == []
    p = providers.get("openai")
    p.list_batches()
    assert len(beats) == 1
    p.find_files("nothing.jsonl")
    assert len(beats) == 2


def test_a_missing_api_key_is_still_refused_at_start_up(home):
    env = {**daemon_env(home.root, None, key=None), "PATH": os.environ.get("PATH", "")}
    res = subprocess.run(
        [sys.executable, "-m", "batchgrader.cli", "daemon", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 78 and "OPENAI_API_KEY" in res.stderr
