"""The provider registry: every provider is known by name in one place (core/configuration/providers.py for the
facts, provider/registry.py for the adapters), every place that needs a provider by name reads
it, and a job's calls go to the provider recorded for the job, not the one its ids look like."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest

from batchgrader.core.configuration import config as config_mod
from batchgrader.core.configuration.config import load_config
from batchgrader.core.configuration.providers import PROVIDER_FACTS, facts_of
from batchgrader.core.host.home import Home
from batchgrader.daemon.engine import Engine
from batchgrader.pipeline import answerkey, caching, modelspec
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider import counting
from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.pool import Providers
from batchgrader.provider.protocol import ProviderConfigError
from batchgrader.provider.registry import PROVIDERS, spec_of
from batchgrader.store.eventstore import EventStore

ROOT = Path(__file__).resolve().parent.parent


def test_the_registry_and_the_facts_name_the_same_providers():
    assert list(PROVIDERS) == list(PROVIDER_FACTS)
    for name, spec in PROVIDERS.items():
        assert spec.facts is PROVIDER_FACTS[name] and spec.name == name
        importlib.import_module(spec.adapter_module)  # the module the daemon prefetches exists
        assert spec.batch.__module__ == "batchgrader.provider.registry"


def test_every_place_that_knows_a_provider_by_name_knows_the_registry():
    names = set(PROVIDERS)
    assert set(config_mod.PROVIDERS) == names
    check = config_mod.KEYS["provider"].check  # the `provider` key takes exactly the registered names
    assert all(check(name) == name for name in names)
    with pytest.raises(ValueError, match="one of " + ", ".join(repr(n) for n in PROVIDERS)):
        check("mistral")
    assert set(answerkey.API_BASE_SETTING) == names
    assert set(answerkey.DEFAULT_API_BASE) <= names and set(config_mod.PROVIDER_MODEL_PREFIX) <= names
    assert caching.KEYED_PROVIDERS <= names and counting.OFFLINE_EXACT <= names
    assert set(modelspec.PROVIDERS) <= names
    from batchgrader.ops.doctor import provider_checks

    assert set(provider_checks()) == names - {"openai"}  # OpenAI's key and base URL are checked for every daemon
    with (ROOT / "src" / "batchgrader" / "data" / "pricing.csv").open(encoding="utf-8") as f:
        priced = {row["provider"] for row in csv.DictReader(f) if row.get("provider")}
    assert priced <= names, f"pricing.csv names providers the registry does not: {sorted(priced - names)}"


def test_each_providers_settings_are_config_keys_read_from_its_sdks_variables():
    for f in PROVIDER_FACTS.values():
        for key in (f.key_setting, f.base_setting, *f.required_settings, *f.other_env.values()):
            assert key in config_mod.KEYS, (f.name, key)
        assert f.key_setting in config_mod.SECRET_KEYS
        for var in (*f.key_vars, *f.base_vars):
            assert config_mod.SDK_ENV[var] in (f.key_setting, f.base_setting)
        if f.deployment_model_setting:
            assert f.deployment_model_setting in config_mod.KEYS
        assert f.offline_exact or (f.counting_endpoint and PROVIDERS[f.name].counter is not None), f.name


def test_an_unknown_provider_is_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="unknown provider 'mistral'; known: openai, anthropic, gemini, azure"):
        facts_of("mistral")
    with pytest.raises(KeyError, match="unknown provider 'mistral'"):
        spec_of("mistral")


def test_the_key_messages_come_from_the_facts():
    assert PROVIDER_FACTS["gemini"].key_var_text == "GEMINI_API_KEY (or GOOGLE_API_KEY)"
    assert list(config_mod.SDK_ENV)[:2] == ["OPENAI_API_KEY", "OPENAI_BASE_URL"]
    # GOOGLE_API_KEY is read after GEMINI_API_KEY, so it wins when both are set (as in google-genai)
    env = list(config_mod.SDK_ENV)
    assert env.index("GOOGLE_API_KEY") > env.index("GEMINI_API_KEY")


# --- each call goes to the provider recorded for its job ---------------------------------------------------

TWO = (
    "stable_seconds: 0\npoll_interval_seconds: 2\nmax_completion_tokens: 50\npreflight_rows: 0\nsplit_row_limit: 1\n"
    "azure_endpoint: https://res.openai.azure.com\nprofiles:\n  az:\n    provider: azure\n"
)


def _two_providers(home: Home) -> tuple[Engine, EventStore, MemoryProvider, MemoryProvider]:
    home.config_file.write_text(TWO)
    (home.inbox / "az").mkdir(parents=True, exist_ok=True)
    openai, azure = MemoryProvider(), MemoryProvider()  # the same id shapes: only the job tells them apart
    store = EventStore(home.db)
    providers = Providers({"openai": lambda: openai, "azure": lambda: azure})
    engine = Engine(home, load_config(home, environ={}), store, providers, load_pricing())
    (home.inbox / "o.csv").write_text("id,response\n1,a\n2,b\n")
    (home.inbox / "az" / "z.csv").write_text("id,response\n1,c\n2,d\n")
    return engine, store, openai, azure


def _ids(p: MemoryProvider) -> set[str]:
    return {arg for op, arg in p.calls}


def _sent(engine: Engine, now: float) -> float:
    for _ in range(4):
        now += 1
        engine.tick(now)
    return now


def test_each_call_goes_to_the_provider_recorded_for_its_job(home: Home) -> None:
    """Both providers make ids of the same shape: each job's uploads, creates, polls, downloads and
    deletes reach its own provider (``Context.provider_for``), never the other."""
    engine, store, openai, azure = _two_providers(home)
    now = _sent(engine, 1_000_000.0)
    jobs = {j.file: j for j in engine.ctx.state.jobs.values()}
    assert jobs["o.csv"].provider == "openai" and jobs["z.csv"].provider == "azure"
    assert len(openai.open_batches()) == len(azure.open_batches()) == 2  # one row a chunk
    assert {c.batch_id for c in jobs["o.csv"].chunks.values()} == {b.id for b in openai.open_batches()}
    assert {c.batch_id for c in jobs["z.csv"].chunks.values()} == {b.id for b in azure.open_batches()}
    for p in (openai, azure):
        p.finish_all()
    for _ in range(10):
        now += 5
        engine.tick(now)
        if all(j.ended for j in engine.ctx.state.jobs.values()):
            break
    jobs = {j.file: j for j in engine.ctx.state.jobs.values()}
    assert {j.ended for j in jobs.values()} == {"completed"}
    o_job, z_job = jobs["o.csv"].job_id, jobs["z.csv"].job_id
    assert not any(z_job in arg for arg in _ids(openai)) and not any(o_job in arg for arg in _ids(azure))
    for p in (openai, azure):  # each provider got its own job's whole run, ids alike in both
        ops = [op for op, _ in p.calls]
        assert ops.count("upload") == ops.count("create_batch") == 2 and ops.count("download") >= 2, ops
        own = o_job if p is openai else z_job
        assert {arg for op, arg in p.calls if op == "upload"} == {f"bg-{own}-c000{i}-a1.jsonl" for i in (0, 1)}
    store.close()


def test_a_list_round_lists_each_provider_and_a_failing_one_is_polled_by_retrieve(home: Home) -> None:
    engine, store, openai, azure = _two_providers(home)
    now = _sent(engine, 1_000_000.0)
    openai.calls.clear()
    azure.calls.clear()
    azure.fail_next("list_batches", "unavailable")
    engine.tick(now + 60)  # every batch due: one list round
    assert [op for op, _ in openai.calls] == ["list_batches"]  # both of its batches seen in one page
    ops = [op for op, _ in azure.calls]
    assert ops.count("list_batches") == 1 and ops.count("retrieve") == 2  # its listing failed: one by one
    store.close()


def test_providers_are_built_once_at_their_first_use_and_a_name_never_configured_is_refused() -> None:
    built: list[str] = []

    class Paged(MemoryProvider):
        on_page = staticmethod(lambda: None)  # a provider that pages (the protocol's optional heartbeat)

    def build() -> MemoryProvider:
        built.append("openai")
        return Paged()

    providers = Providers({"openai": build})
    beats: list[int] = []
    providers.set_on_page(lambda: beats.append(1))
    assert built == [] and providers.built() == {}
    p = providers.get("openai")
    assert providers.get("openai") is p and built == ["openai"]
    p.on_page()  # type: ignore[attr-defined]
    assert beats == [1]  # the heartbeat reaches a provider built after it was set
    with pytest.raises(ProviderConfigError, match="'gemini' is not configured"):
        providers.get("gemini")
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(providers)


# --- no provider known by name outside its own modules and the registry -------------------------------------

SRC = ROOT / "src" / "batchgrader"
#: where a provider's name may be written: the registry's two halves, the doctor's table of checks, and
#: each provider's own modules (adapters, doctor checks, the emulator's routes)
OWN = ("core/configuration/providers.py", "provider/registry.py", "ops/doctor.py", "emulator/")
#: provider-specific rules still keyed by name outside the registry (each a rule of its own, not a table):
#: the queue a learned limit belongs to, the thinking budgets of reasoning_effort, Azure deployments' prices
KNOWN_ELSEWHERE = {
    "pipeline/catalogue.py": {"anthropic"},
    "pipeline/pricing.py": {"azure"},
}


def _own(rel: str, name: str) -> bool:
    module = rel.rsplit("/", 1)[-1]
    return rel.startswith(OWN) or module.startswith((f"{name}_", f"doctor_{name}"))


def test_no_module_keys_a_rule_by_a_providers_name_outside_the_registry():
    import ast

    names = set(PROVIDERS) - {"openai"}  # "openai" is the default everywhere a provider is not set
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names and not _own(rel, node.value):
                found.setdefault(rel, set()).add(node.value)
    assert found == KNOWN_ELSEWHERE, (
        "a provider's name outside the registry: read core/configuration/providers.py or provider/registry.py"
    )
