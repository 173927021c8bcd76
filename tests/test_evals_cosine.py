"""``text_similarity`` with ``cosine`` (issue 34): the input and the reference embedded through
OpenAI's Batch API (``/v1/embeddings``, at batch price), the score their cosine.

The emulator serves embeddings in a batch and synchronously through the official SDK, and refuses
what the real API refuses (a model that is not an embedding model, an empty input, an embedding
model on chat completions); an imported eval with a cosine criterion runs through the engine on
the emulator to its results, whose cosine scores are those of the emulator's vectors and whose
cost is the tokens the emulator billed at the catalogue's batch price."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import openai
import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.daemon.engine import Engine
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.emulator.embeddings import vector
from batchgrader.evals import importer, results
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.pipeline.evals.spec import EvalInputError
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors

pytestmark = pytest.mark.timeout(120)

KEY = "sk-cosine-test-0123456789abcdef"
EVAL = {
    "object": "eval",
    "id": "eval_cosine",
    "name": "Answers close to the reference",
    "data_source_config": {
        "type": "custom",
        "schema": {
            "type": "object",
            "properties": {
                "item": {"type": "object", "properties": {"reference": {"type": "string"}}, "required": ["reference"]},
                "sample": {"type": "object"},
            },
        },
    },
    "testing_criteria": [
        {
            "id": "close",
            "type": "text_similarity",
            "name": "Close",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference}}",
            "evaluation_metric": "cosine",
            "pass_threshold": 0.6,
        },
        {"type": "string_check", "name": "Says cat", "input": "{{sample.output_text}}", "reference": "cat", "operation": "ilike"},
    ],
}
PAIRS = [
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("A cat was sitting on the mat.", "The cat sat on the mat."),
    ("Stock prices fell sharply today.", "The cat sat on the mat."),
]


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps(EVAL))
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"item": {"reference": r}, "sample": {"output_text": o}}) + "\n" for o, r in PAIRS))
    return ev, items


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture
def emu():
    clock = ManualClock()
    e = Emulator(EmulatorConfig(api_key=KEY, clock=clock, validating_s=0.2, in_progress_s=1.0, finalizing_s=0.2)).start()
    yield e, clock
    e.stop()


def run_batch(client: openai.OpenAI, clock: ManualClock, lines: list[dict[str, Any]]) -> Any:
    f = client.files.create(file=("in.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    for _ in range(200):
        clock.advance(0.1)
        b = client.batches.retrieve(b.id)
        if b.status in ("completed", "failed"):
            return b
    raise AssertionError("the batch did not end")


def emb_line(cid: str, text: Any, model: str = "text-embedding-3-small") -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": {"model": model, "input": text}}


def test_the_emulator_embeds_in_a_batch_and_refuses_what_openai_refuses(emu):
    e, clock = emu
    client = openai.OpenAI(api_key=KEY, base_url=e.base_url, max_retries=0)
    b = run_batch(client, clock, [emb_line("a", "the cat sat"), emb_line("b", "the cat sat"), emb_line("c", "")])
    assert b.status == "completed" and (b.request_counts.completed, b.request_counts.failed) == (2, 1)
    out = {x["custom_id"]: x for x in map(json.loads, client.files.content(b.output_file_id).text.splitlines())}
    va = out["a"]["response"]["body"]["data"][0]["embedding"]
    assert len(va) == 1536 and cos(va, out["b"]["response"]["body"]["data"][0]["embedding"]) == pytest.approx(1.0)
    assert out["a"]["response"]["body"]["usage"] == {"prompt_tokens": 3, "total_tokens": 3}  # the text's tokens only
    assert b.usage.input_tokens == 6 and b.usage.output_tokens == 0
    (err,) = map(json.loads, client.files.content(b.error_file_id).text.splitlines())
    assert err["response"]["status_code"] == 400 and "'$.input' is invalid" in err["response"]["body"]["error"]["message"]
    refused = run_batch(client, clock, [emb_line("a", "x", model="gpt-4.1-nano")])
    assert refused.status == "failed" and refused.errors.data[0].code == "model_not_found"
    sync = client.embeddings.create(model="text-embedding-3-large", input="the cat sat")
    assert len(sync.data[0].embedding) == 3072
    with pytest.raises(openai.NotFoundError, match="not a chat model"):
        client.chat.completions.create(model="text-embedding-3-large", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="input"):
        client.embeddings.create(model="text-embedding-3-large", input=[])


def test_a_cosine_eval_runs_through_the_batch_api_to_its_results(home, tmp_path, emu):
    e, clock = emu
    home.config_file.write_text(
        "poll_interval_seconds: 0.05\nstable_seconds: 0.05\nrescan_interval_seconds: 0.2\ndelete_provider_files: false\n"
        "preflight_rows: 0\n"  # every request in the batch (the preflight sends its rows through the sync API)
    )
    ev, items = write_inputs(tmp_path)
    prepared = importer.prepare_import(home, ev, data_path=items, name="close", embedding_model="text-embedding-3-small")
    (job,) = prepared.jobs
    assert job.kind == "embeddings" and len(job.rows) == 2 * len(PAIRS)
    importer.install(home, prepared, lambda: load_config(home, environ={}))
    config, table = load_checked(load_config(home, environ={}))
    store = EventStore(home.db, projectors=projectors())
    engine = Engine(home, config, store, OpenAIProvider(api_key=KEY, base_url=e.base_url, timeout=10), table)
    try:
        for _ in range(3000):
            engine.tick(clock.advance(0.05))
            if (home.outbox / "close_run.json").exists():
                break
        rep = results.finish(home, "close", now=1_762_400_000)
    finally:
        store.close()
    run = json.loads((home.outbox / "close_run.json").read_text())
    items_out = [json.loads(x) for x in (home.outbox / "close_output_items.jsonl").read_text().splitlines()]
    scores = [next(r for r in i["results"] if r["name"] == "Close")["score"] for i in items_out]
    expected = [cos(vector(o, 1536), vector(r, 1536)) for o, r in PAIRS]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert scores[0] == pytest.approx(1.0, abs=1e-5) and scores[1] > scores[2]
    assert [i["status"] for i in items_out] == ["pass" if s >= 0.6 else "fail" for s in expected]
    close = rep["criteria"][0]
    assert (
        close["variant"] == "openai-text-embedding-3-small"
        and "text-embedding-3-small embeddings" in close["variant_description"]
    )
    (usage,) = run["per_model_usage"]
    assert usage["model_name"] == "text-embedding-3-small" and usage["completion_tokens"] == 0
    billed = sum(
        json.loads(x)["response"]["body"]["usage"]["prompt_tokens"]
        for b in e.batches()
        if b.get("output_file_id")
        for x in e.file_bytes(b["output_file_id"]).splitlines()
        if x.strip()
    )
    # the job's tokens are the batch's; a text repeated in the job is embedded once (stored-answer reuse)
    assert usage["prompt_tokens"] == billed > 0
    assert usage["invocation_count"] == len({t for pair in PAIRS for t in pair})
    price = load_pricing().get("text-embedding-3-small")
    assert rep["cost_usd"] == pytest.approx(usage["prompt_tokens"] * price.input_per_1m / 1e6, rel=0.02, abs=1e-9)
    assert price.input_per_1m == pytest.approx(0.01)  # half the standard $0.02 / 1M


def test_an_embedding_model_that_is_not_openais_is_refused_with_the_fix(home, tmp_path):
    ev, items = write_inputs(tmp_path)
    with pytest.raises(EvalInputError) as exc:
        importer.prepare_import(home, ev, data_path=items, name="x", embedding_model="gpt-5.4-mini")
    (p,) = exc.value.problems
    assert p.where == "--embedding-model" and "not an embedding model" in p.what and "text-embedding-3-large" in p.fix
    prepared = importer.prepare_import(home, ev, data_path=items, name="x")
    assert prepared.embedding_model == "text-embedding-3-large"  # what OpenAI's Evals used


def test_a_profile_on_an_embedding_model_refuses_what_an_embedding_cannot_carry(home):
    from batchgrader.core.configuration.config import ConfigError
    from batchgrader.pipeline.requests import request_url

    home.config_file.write_text("model: text-embedding-3-small\n")
    config, _table = load_checked(load_config(home, environ={}))
    assert request_url(config.default) == "/v1/embeddings"
    home.config_file.write_text("model: text-embedding-3-small\ntemperature: 0.2\nsamples: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_checked(load_config(home, environ={}))
    assert "key 'temperature' is set" in str(exc.value) and "set 'samples: 1'" in str(exc.value)
