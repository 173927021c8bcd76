"""Azure OpenAI: the emulator serves ``/openai/files`` and ``/openai/batches`` (``api-version``
query, ``api-key`` header, Azure's error bodies) to the official SDK's ``AzureOpenAI`` client over
real HTTP; the adapter names its ids ``azure:``, reconciles by listing like OpenAI's, and the
configuration refuses what Azure would (no key, no endpoint, an unpriced deployment) up front."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from batchgrader.core.configuration.config import ConfigError, load_config, provider_key_problem
from batchgrader.core.host.home import Home
from batchgrader.core.rules.queue import parse_queue_limit
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.pipeline.pricing import PricingError, load_pricing, with_deployments
from batchgrader.pipeline.results import iter_outcomes
from batchgrader.provider.azure_api import AZURE_ENDPOINT, ID_PREFIX, AzureOpenAIProvider, raw_id
from batchgrader.provider.openai_api import (
    ProviderConfigError,
    ProviderRejected,
    create_batch_reconciled,
    upload_reconciled,
)
from emulator_fixtures import chat_line, jsonl

KEY = "azure-key-never-written-0123456789abcdef"
VERSION = "2025-04-01-preview"
DEPLOYMENT = "grader-4o-mini"
SERVED = (DEPLOYMENT,)  # the emulator serves this deployment (any other name: 404 DeploymentNotFound)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def emu(clock: ManualClock) -> Iterator[Emulator]:
    with Emulator(
        EmulatorConfig(clock=clock, api_key=KEY, validating_s=1, in_progress_s=5, finalizing_s=1, extra_models=SERVED)
    ) as e:
        yield e


@pytest.fixture
def client(emu: Emulator) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(api_key=KEY, azure_endpoint=emu.root_url, api_version=VERSION, max_retries=0)


@pytest.fixture
def provider(emu: Emulator) -> AzureOpenAIProvider:
    return AzureOpenAIProvider(KEY, emu.root_url, VERSION, timeout=10)


def _input(tmp_path: Path, n: int = 3, **kw) -> Path:  # noqa: ANN003
    p = tmp_path / "bg-job1-c0-a0.jsonl"
    p.write_bytes(jsonl(chat_line(f"row-{i}", f"Grade essay {i}.", model=DEPLOYMENT, **kw) for i in range(n)))
    return p


# --- the emulator's Azure routes, through the official SDK -----------------------------------------


def test_sdk_azure_client_runs_a_batch_on_the_azure_paths(emu: Emulator, client: openai.AzureOpenAI, tmp_path, clock) -> None:  # noqa: ANN001
    f = client.files.create(file=_input(tmp_path).open("rb"), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"bg_key": "job1:0:0"}
    )
    assert emu.request_count("POST", "/openai/files") == 1 and emu.request_count("POST", "/openai/batches") == 1
    assert emu.request_count("POST", "/v1/batches") == 0  # nothing went to the OpenAI paths
    clock.advance(10)
    done = client.batches.retrieve(b.id)
    assert done.status == "completed" and done.metadata == {"bg_key": "job1:0:0"} and done.output_file_id
    lines = client.files.content(done.output_file_id).text.splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in lines) == ["row-0", "row-1", "row-2"]
    assert [x.id for x in client.batches.list()] == [b.id]


def test_azure_error_shapes(emu: Emulator) -> None:
    bad_key = openai.AzureOpenAI(api_key="wrong-key-0000000000", azure_endpoint=emu.root_url, api_version=VERSION, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad_key.batches.list()
    assert e.value.status_code == 401 and e.value.code == "401"
    assert "invalid subscription key or wrong API endpoint" in str(e.value.message)
    old = openai.AzureOpenAI(api_key=KEY, azure_endpoint=emu.root_url, api_version="1999-01-01", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e2:
        old.batches.list()
    assert e2.value.code == "BadRequest" and "API version not supported" in str(e2.value.message)
    import httpx2

    r = httpx2.get(f"{emu.root_url}/openai/batches", headers={"api-key": KEY})  # no api-version
    assert r.status_code == 404 and r.json() == {"error": {"code": "404", "message": "Resource not found"}}
    r = httpx2.get(f"{emu.root_url}/openai/batches?api-version={VERSION}")  # no api-key
    assert r.status_code == 401 and "missing subscription key" in r.json()["error"]["message"]


# --- the adapter ---------------------------------------------------------------------------------------


def test_adapter_ids_are_azures_own_and_usage_is_exact(provider: AzureOpenAIProvider, emu: Emulator, tmp_path, clock) -> None:  # noqa: ANN001
    path = _input(tmp_path, 4, url="/chat/completions")  # the api-version surface's line url
    f = provider.upload(path, path.name)
    assert f.id.startswith("file-")  # no mark: the job records its provider
    b = provider.create_batch(f.id, metadata={"bg_key": "job1:0:0"})
    assert b.id.startswith("batch_") and b.input_file_id == f.id
    clock.advance(10)
    done = provider.retrieve(b.id)
    assert done.status == "completed" and done.output_file_id
    out = tmp_path / "out.jsonl"
    provider.download(done.output_file_id, out)
    outcomes = list(iter_outcomes(out))
    assert len(outcomes) == 4 and all(o.ok for o in outcomes)
    assert done.usage is not None and sum(o.prompt_tokens for o in outcomes) == done.usage.input_tokens > 0
    assert sum(o.completion_tokens for o in outcomes) == done.usage.output_tokens
    assert provider.find_batches(f.id, {"bg_key": "job1:0:0"})[0].id == b.id
    assert provider.delete_file(f.id) is True and provider.delete_file(f.id) is False
    assert raw_id(b.id) in emu.store.state.batches


def test_unknown_outcomes_are_reconciled_by_listing(provider: AzureOpenAIProvider, emu: Emulator, tmp_path) -> None:  # noqa: ANN001
    path = _input(tmp_path)
    emu.script_fault("POST", "/openai/files", "drop_after")
    up = upload_reconciled(provider, path, path.name)
    assert up.outcome == "adopted" and up.file is not None and up.file.id.startswith("file-")
    emu.script_fault("POST", "/openai/batches", "drop_after")
    sub = create_batch_reconciled(provider, up.file.id, metadata={"bg_key": "job1:0:0"})
    assert sub.outcome == "adopted" and sub.batch is not None and sub.batch.metadata["bg_key"] == "job1:0:0"
    assert emu.request_count("POST", "/openai/batches") == 1  # adopted, never sent twice
    emu.script_fault("POST", "/openai/batches", "status", status=400, message="bad input file")
    with pytest.raises(ProviderRejected) as e:
        provider.create_batch(up.file.id)
    assert e.value.status_code == 400 and "bad input file" in str(e.value)


def test_reads_survive_the_flaky_profile(clock: ManualClock, tmp_path) -> None:  # noqa: ANN001
    with Emulator(EmulatorConfig(clock=clock, api_key=KEY, faults="flaky", seed=7, extra_models=SERVED)) as emu:
        p = AzureOpenAIProvider(KEY, emu.root_url, VERSION, timeout=5)
        path = _input(tmp_path)
        up = upload_reconciled(p, path, path.name)
        assert up.file is not None
        sub = create_batch_reconciled(p, up.file.id, metadata={"bg_key": "job1:0:0"})
        assert sub.batch is not None
        clock.advance(100)
        for _ in range(5):
            assert p.retrieve(sub.batch.id).id == sub.batch.id
        assert emu.batches_created() == 1


def test_ids_an_earlier_version_recorded_with_azure_prefix_are_still_read(
    provider: AzureOpenAIProvider, emu: Emulator, tmp_path, clock
) -> None:  # noqa: ANN001
    """A job in flight across the upgrade holds ``azure:<id>`` ids in its log: each call takes them,
    and what it returns names its ids the same way, so the job compares like with like (its own
    batch is never taken for a duplicate of itself)."""
    path = _input(tmp_path, 2, url="/chat/completions")
    f = provider.upload(path, path.name)
    old_file = ID_PREFIX + f.id  # as an earlier version recorded it
    b = provider.create_batch(old_file, metadata={"bg_key": "job1:0:0"})
    assert b.id.startswith("azure:batch_") and b.input_file_id == old_file
    assert [x.id for x in provider.find_batches(old_file, {"bg_key": "job1:0:0"})] == [b.id]
    assert provider.find_batches(f.id, {"bg_key": "job1:0:0"})[0].id == raw_id(b.id)  # a new caller: Azure's own
    clock.advance(10)
    done = provider.retrieve(b.id)
    assert done.status == "completed" and done.output_file_id and done.output_file_id.startswith("azure:")
    assert provider.download(done.output_file_id, tmp_path / "out.jsonl") > 0
    assert provider.delete_file(old_file) is True
    assert raw_id(b.id) in {x.id for x in provider.list_batches(limit=10).items}


def test_a_missing_endpoint_names_the_variable(emu: Emulator) -> None:
    with pytest.raises(ProviderConfigError, match="AZURE_OPENAI_ENDPOINT"):  # the key: tests/provider_contract.py
        AzureOpenAIProvider(KEY, None)


# --- configuration, pricing, queue quota -----------------------------------------------------------


def _home(tmp_path: Path, text: str) -> Home:
    home = Home.resolve(tmp_path / "h").ensure()
    home.config_file.write_text(text)
    return home


def test_missing_key_or_endpoint_names_the_profile_and_the_key(tmp_path: Path) -> None:
    home = _home(tmp_path, f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n")
    cfg = load_config(home, environ={})
    assert (
        provider_key_problem(cfg)
        == "profile 'az' uses provider 'azure': set AZURE_OPENAI_API_KEY (in the environment or secrets.env)"
    )
    cfg = load_config(home, environ={"AZURE_OPENAI_API_KEY": KEY})
    problem = provider_key_problem(cfg)
    assert problem is not None and "profile 'az'" in problem and "AZURE_OPENAI_ENDPOINT" in problem
    cfg = load_config(home, environ={"AZURE_OPENAI_API_KEY": KEY, "AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com"})
    assert provider_key_problem(cfg) is None and provider_key_problem(load_config(home, environ={}), sandbox=True) is None
    assert cfg.azure_api_version == VERSION  # the default
    assert KEY not in json.dumps(cfg.explain("az"), default=str)
    with pytest.raises(ConfigError, match="cannot be set in a profile"):
        load_config(_home(tmp_path / "2", "profiles:\n  az:\n    azure_endpoint: https://x\n"), environ={})


def test_a_deployment_is_priced_as_the_model_it_runs_or_refused(tmp_path: Path) -> None:
    prices = load_pricing()
    home = _home(tmp_path, f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n")
    cfg = load_config(home, environ={})
    with pytest.raises(PricingError) as e:
        with_deployments(prices, [cfg.profile("az")])
    assert "profile 'az'" in str(e.value) and "'azure_model'" in str(e.value) and DEPLOYMENT in str(e.value)
    home.config_file.write_text(
        f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n    azure_model: gpt-5.4-mini\n"
    )
    priced = with_deployments(prices, [load_config(home, environ={}).profile("az")])
    assert priced.get(DEPLOYMENT).input_per_1m == prices.get("gpt-5.4-mini").input_per_1m
    assert priced.get(DEPLOYMENT).model == DEPLOYMENT and "gpt-5.4-mini" in priced
    home.config_file.write_text(f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n    azure_model: gpt-99\n")
    with pytest.raises(PricingError, match="'azure_model' is 'gpt-99'"):
        with_deployments(prices, [load_config(home, environ={}).profile("az")])


def test_count_refuses_an_unpriced_deployment_naming_the_profile(home: Home, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from batchgrader.cli.commands import cli

    home.config_file.write_text(f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n")
    f = tmp_path / "d.csv"
    f.write_text("response\nan essay\n")
    res = CliRunner().invoke(cli, ["count", str(f), "--profile", "az"])
    assert res.exit_code != 0 and "profile 'az'" in res.output and "azure_model" in res.output
    home.config_file.write_text(
        f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n    azure_model: gpt-5.4-mini\n"
    )
    res = CliRunner().invoke(cli, ["count", str(f), "--profile", "az", "--json"])
    summary = json.loads(res.output)
    assert summary["input_tokens_exact"] is True and summary["encoding"] == "o200k_base"  # gpt-5.4-mini's tokenizer
    assert summary["estimated_cost_usd"]["input"] > 0


def test_azure_queue_refusal_message_gives_the_limit() -> None:
    # learn.microsoft.com/en-us/answers/questions/2285577 (2025-06-19): Azure's token_limit_exceeded text
    msg = (
        "The number of enqueued tokens has surpassed the configured limit of 30K for the deployment "
        "'gpt-4.1-batch'. Please either increase the limit or try again once the current jobs have finished."
    )
    assert parse_queue_limit(msg) == 30_000
    assert parse_queue_limit("... configured limit of 1.5M for the deployment 'x' ...") == 1_500_000
    assert parse_queue_limit("... configured limit of 250,000 for the deployment 'x' ...") == 250_000
    assert parse_queue_limit("Enqueued token limit reached for gpt-4o. Limit: 2,000,000 enqueued tokens.") == 2_000_000


# --- the api-version surface's paths, file expiry, null counts (issue 22) -----------------------------


def test_prepared_azure_lines_and_the_create_use_chat_completions(
    home: Home, provider: AzureOpenAIProvider, client: openai.AzureOpenAI, tmp_path, clock
) -> None:  # noqa: ANN001
    from batchgrader.pipeline.requests import RequestBuilder

    home.config_file.write_text(f"provider: azure\nmodel: {DEPLOYMENT}\nazure_model: gpt-5.4-mini\n", encoding="utf-8")
    prof = load_config(home, environ={}).default
    builder = RequestBuilder(prof, home, "0" * 64)
    path = tmp_path / "bg-job1-c0-a0.jsonl"
    path.write_bytes(jsonl(builder.request(f"row-{i}", [{"role": "user", "content": f"essay {i}"}]) for i in range(3)))
    assert all(json.loads(x)["url"] == "/chat/completions" for x in path.read_text().splitlines())
    b = provider.create_batch(provider.upload(path, path.name).id, metadata={"bg_key": "job1:0:0"})
    assert b.endpoint == "/chat/completions"
    clock.advance(10)
    assert provider.retrieve(b.id).status == "completed"


def test_the_emulator_refuses_a_line_url_that_is_not_the_endpoint_as_azure_does(
    provider: AzureOpenAIProvider, tmp_path, clock
) -> None:  # noqa: ANN001
    path = _input(tmp_path, 2)  # lines with /v1/chat/completions, the batch named for Azure's /chat/completions
    b = provider.create_batch(provider.upload(path, path.name).id, AZURE_ENDPOINT, metadata={"bg_key": "job1:0:0"})
    clock.advance(10)
    done = provider.retrieve(b.id)
    assert done.status == "failed"
    assert {e.code for e in done.errors} == {"url_mismatch"}


def test_uploads_carry_expires_after(provider: AzureOpenAIProvider, client: openai.AzureOpenAI, tmp_path) -> None:  # noqa: ANN001
    path = _input(tmp_path, 1, url="/chat/completions")
    f = client.files.retrieve(raw_id(provider.upload(path, path.name).id))
    assert f.expires_at is not None and f.expires_at - f.created_at == 14 * 86_400


def test_a_failed_batch_with_null_counts_reads_as_zero(
    provider: AzureOpenAIProvider, client: openai.AzureOpenAI, tmp_path, clock
) -> None:  # noqa: ANN001
    path = _input(tmp_path, 2)  # a url mismatch: the batch fails validation
    b = provider.create_batch(provider.upload(path, path.name).id, AZURE_ENDPOINT, metadata={"bg_key": "job1:0:0"})
    clock.advance(10)
    raw = client.batches.retrieve(raw_id(b.id))
    assert raw.status == "failed" and raw.request_counts is not None
    assert (raw.request_counts.completed, raw.request_counts.failed) == (None, None)  # as Azure's own example
    counts = provider.retrieve(b.id).request_counts
    assert (counts.completed, counts.failed) == (0, 0)
    assert counts.completed + counts.failed == 0  # what daemon/steps/collect.py adds


def test_a_resource_holds_a_capped_number_of_files_without_expiry(clock, tmp_path) -> None:  # noqa: ANN001
    cfg = EmulatorConfig(clock=clock, api_key=KEY, azure_files_without_expiry=2, extra_models=SERVED)
    with Emulator(cfg) as emu:
        sdk = openai.AzureOpenAI(api_key=KEY, azure_endpoint=emu.root_url, api_version=VERSION, max_retries=0)
        path = _input(tmp_path, 1, url="/chat/completions")
        for _ in range(2):
            assert sdk.files.create(file=path.open("rb"), purpose="batch").expires_at is None  # no default expiry on Azure
        with pytest.raises(openai.BadRequestError) as exc:
            sdk.files.create(file=path.open("rb"), purpose="batch")
        assert "without an expiration" in str(exc.value.message)
        adapter = AzureOpenAIProvider(KEY, emu.root_url, VERSION, timeout=10)
        assert adapter.upload(path, path.name).id.startswith("file-")  # it sets expires_after
