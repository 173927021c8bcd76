"""The provider registry: every provider is known by name in one place (core/providers.py for the
facts, provider/registry.py for the adapters), every place that needs a provider by name reads
it, and a job's calls go to the provider recorded for the job, not the one its ids look like."""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest

from batchgrader.core import config as config_mod
from batchgrader.core.providers import PROVIDER_FACTS, facts_of
from batchgrader.core.state import ChunkState, JobState, State
from batchgrader.pipeline import answerkey, caching, modelspec
from batchgrader.provider import counting
from batchgrader.provider.memory import MemoryProvider
from batchgrader.provider.protocol import ProviderError
from batchgrader.provider.registry import PROVIDERS, spec_of
from batchgrader.provider.router import ObjectJobs, ProviderRouter, provider_of_id

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


def test_every_provider_but_the_default_has_ids_of_its_own_shape():
    prefixes = {name: spec.id_prefixes for name, spec in PROVIDERS.items()}
    assert prefixes.pop("openai") == ()  # the fallback's default: every other id is OpenAI's
    for name, own in prefixes.items():
        assert own, f"{name}: no id_prefixes, so the fallback would send its ids to OpenAI"
        for prefix in own:
            assert provider_of_id(prefix + "x") == name
    assert provider_of_id("batch_abc") == provider_of_id("file-abc") == "openai"
    from batchgrader.provider import azure_api

    assert PROVIDERS["azure"].id_prefixes == (azure_api.ID_PREFIX,)  # the adapter names every Azure id so


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


# --- routing by the job's recorded provider ----------------------------------------------------------------


def _state_with_job(job_id: str, provider: str) -> State:
    state = State()
    job = state.jobs[job_id] = JobState(job_id=job_id, created_ts="2026-01-01T00:00:00Z")
    job.provider = provider
    job.chunks[0] = ChunkState(index=0, requests=1, input_tokens=1, bytes=1, path="c0.jsonl")
    state.last_seq = 1
    return state


def _chunk_file(tmp_path: Path) -> Path:
    path = tmp_path / "bg-j1-c0-a1.jsonl"
    path.write_text('{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n')
    return path


def test_calls_that_carry_only_an_id_go_to_the_provider_recorded_for_its_job(tmp_path: Path):
    """Both providers make ids of the same shape (OpenAI's): the shape would send the job's batch
    to the wrong one; the job's recorded provider sends it to the right one."""
    openai, other = MemoryProvider(), MemoryProvider()
    state = _state_with_job("j1", "anthropic")
    router = ProviderRouter(
        {"openai": openai, "anthropic": other},
        provider_of_job=lambda job_id: state.jobs[job_id].provider or "openai",
        job_of_object=ObjectJobs(lambda: state),
    )
    path = _chunk_file(tmp_path)
    f = router.upload(path, path.name)  # by the job named in the upload name
    assert provider_of_id(f.id) == "openai"  # its shape says OpenAI
    state.jobs["j1"].chunks[0].file_id, state.jobs["j1"].version, state.last_seq = f.id, 2, 2  # FileUploaded folded
    b = router.create_batch(f.id, metadata={"bg_key": "j1:0:1"})
    state.jobs["j1"].chunks[0].batch_id, state.jobs["j1"].version, state.last_seq = b.id, 3, 3  # BatchCreated folded
    assert router.retrieve(b.id).id == b.id
    assert [x.id for x in other.open_batches()] == [b.id] and openai.open_batches() == []


def test_an_id_no_job_holds_is_routed_by_its_shape(tmp_path: Path):
    openai, other = MemoryProvider(), MemoryProvider()
    state = _state_with_job("j1", "anthropic")
    router = ProviderRouter(
        {"openai": openai, "anthropic": other},
        provider_of_job=lambda job_id: state.jobs[job_id].provider or "openai",
        job_of_object=ObjectJobs(lambda: state),
    )
    path = _chunk_file(tmp_path)
    f = router.upload(path, path.name)  # went to the job's provider, but the log never recorded the file
    with pytest.raises(ProviderError):
        router.create_batch(f.id)  # unknown to every job: by its shape, to OpenAI's, which does not have it
    assert openai.open_batches() == [] and other.open_batches() == []


def test_the_object_index_reads_again_only_the_jobs_with_new_events():
    state = _state_with_job("j1", "anthropic")
    jobs = ObjectJobs(lambda: state)
    assert jobs("file-1") is None
    state.jobs["j1"].chunks[0].file_id = "file-1"
    state.jobs["j1"].version = 2
    assert jobs("file-1") is None  # same last_seq: the index is not brought up to date for every unknown id
    state.last_seq = 2
    assert jobs("file-1") == "j1"
    state.jobs["j1"].chunks[0].batch_id = "batch-1"  # changed without a new event of the job
    state.last_seq = 3
    assert jobs("batch-1") is None  # j1's version did not move: its chunks are not read again
    state.jobs["j1"].version = 3
    state.last_seq = 4
    assert jobs("batch-1") == "j1" and jobs("file-1") == "j1"


# --- no provider known by name outside its own modules and the registry -------------------------------------

SRC = ROOT / "src" / "batchgrader"
#: where a provider's name may be written: the registry's two halves, the doctor's table of checks, and
#: each provider's own modules (adapters, doctor checks, the emulator's routes)
OWN = ("core/providers.py", "provider/registry.py", "ops/doctor.py", "emulator/")
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
    assert found == KNOWN_ELSEWHERE, "a provider's name outside the registry: read core/providers.py or provider/registry.py"
