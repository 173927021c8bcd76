"""The Responses API end to end (issue 33, item 2): the engine ticked in this process on a manual
clock, the official ``openai`` SDK unchanged, the emulator over real HTTP refusing what the spec
refuses.  A Responses-only model completes in a batch, in the preflight and on the online route; a
JSON schema travels as ``text.format``; a cut answer is ``truncated``; the job's tokens and cost are
the usage the emulator billed.  Tick rules with the in-memory provider: tests/test_responses_ticks.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.daemon.engine import Engine
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock
from batchgrader.pipeline.catalogue import load_checked
from batchgrader.pipeline.pricing import Price, standard_price
from batchgrader.pipeline.requests import schema_allowance
from batchgrader.pipeline.results import parse_line
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors

pytestmark = pytest.mark.timeout(120)

KEY = "sk-responses-test-0123456789abcdef"
MODEL = "gpt-5.5-pro"  # Responses only; no shutdown date in the catalogue
CONFIG = (
    "poll_interval_seconds: 0.05\nstable_seconds: 0.05\nrescan_interval_seconds: 0.2\npreflight_rows: 0\n"
    "delete_provider_files: false\n"  # max_completion_tokens unset: the model's reasoning_bound
)
SCHEMA = (
    "response_format:\n  type: object\n  properties:\n    score: {type: integer}\n    reason: {type: string}\n"
    "  required: [score, reason]\n  additionalProperties: false\n"
)


class EmuRig:
    """The daemon's engine in this process with the daemon's own configuration check
    (``load_checked``), the OpenAI provider on the SDK, and the emulator, on one manual clock."""

    def __init__(self, home: Any, config: str) -> None:
        self.home = home
        home.config_file.write_text(CONFIG + ("" if "model:" in config else f"model: {MODEL}\n") + config)
        self.clock = ManualClock()
        self.emu = Emulator(
            EmulatorConfig(api_key=KEY, clock=self.clock, validating_s=0.2, in_progress_s=1.0, finalizing_s=0.2)
        ).start()
        self.config, self.table = load_checked(load_config(home, environ={}))
        self.store = EventStore(home.db, projectors=projectors())
        self.provider = OpenAIProvider(api_key=KEY, base_url=self.emu.base_url, timeout=10)
        self.engine = Engine(home, self.config, self.store, self.provider, self.table)

    def run(self, rows: list[str], ticks: int = 3000) -> Any:
        (self.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(rows)))
        for _ in range(ticks):
            self.engine.tick(self.clock.advance(0.05))
            jobs = list(self.engine.ctx.state.jobs.values())
            if jobs and all(j.ended for j in jobs):
                (job,) = jobs
                return job
        raise AssertionError("the job did not end")

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.store.read() if e.type == type_]

    def result_rows(self) -> list[dict[str, str]]:
        import csv
        import io

        return list(csv.DictReader(io.StringIO((self.home.outbox / "a_results.csv").read_text(encoding="utf-8"))))

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(api_key=KEY, base_url=self.emu.base_url, max_retries=0)

    def close(self) -> None:
        self.emu.stop()
        self.store.close()


@pytest.fixture
def rig(home):
    made: list[EmuRig] = []

    def make(config: str = "") -> EmuRig:
        r = EmuRig(home, config)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def texts(n: int) -> list[str]:
    return [f"essay {i}: the argument is clear but the evidence thin" for i in range(n)]


def cost(usage: dict[str, Any], price: Price) -> float:
    """What ``usage`` (a Responses body's, no cache hits) costs at ``price``: output tokens include reasoning."""
    assert (usage.get("input_tokens_details") or {}).get("cached_tokens", 0) == 0
    return (usage["input_tokens"] * price.input_per_1m + usage["output_tokens"] * price.output_per_1m) / 1e6


def billed_lines(r: EmuRig) -> list[dict[str, Any]]:
    """Every output line of every batch, as the emulator wrote them."""
    out = []
    for b in r.emu.batches():
        if b.get("output_file_id"):
            out += [json.loads(x) for x in r.emu.file_bytes(b["output_file_id"]).splitlines() if x.strip()]
    return out


def test_a_responses_only_model_completes_in_a_batch_and_costs_what_the_emulator_billed(rig):
    r = rig()
    job = r.run(texts(5))
    assert job.ended == "completed", job.last_error
    assert r.emu.request_count("POST", "/v1/chat/completions") == 0
    (batch,) = r.emu.batches()
    assert batch["endpoint"] == "/v1/responses" and batch["request_counts"]["completed"] == 5
    lines = billed_lines(r)
    bodies = [x["response"]["body"] for x in lines]
    assert all(b["object"] == "response" and b["status"] == "completed" for b in bodies)
    rows = r.result_rows()
    answers = {x["custom_id"]: parse_line(x).content for x in lines}
    assert all(row["error"] == "" and row["grade"] for row in rows)
    assert sorted(row["grade"] for row in rows) == sorted(answers.values())
    usage = [b["usage"] for b in bodies]
    assert job.prompt_tokens == sum(u["input_tokens"] for u in usage)
    assert job.completion_tokens == sum(u["output_tokens"] for u in usage)
    reasoning = sum(u["output_tokens_details"]["reasoning_tokens"] for u in usage)
    assert job.reasoning_tokens == reasoning > 0  # gpt-5.5-pro reasons (effort high by default)
    price = r.table.get(MODEL)
    assert job.cost_usd == pytest.approx(sum(cost(u, price) for u in usage))  # the batch price
    # the counts the plan was made on are the tokens the emulator billed (no schema: exact)
    assert sum(c.input_tokens for c in job.chunks.values()) == job.prompt_tokens


def test_the_preflight_goes_through_the_responses_api_at_the_standard_price(rig):
    r = rig("preflight_rows: 2\n")
    job = r.run(texts(4))
    assert job.preflight == "passed" and job.ended == "completed", job.last_error
    assert r.emu.request_count("POST", "/v1/responses") == 2
    assert r.emu.request_count("POST", "/v1/chat/completions") == 0
    assert sum(c.requests for c in job.chunks.values()) == 2  # the preflight's rows were not sent again
    answered = {p["custom_id"]: p for p in r.events("PreflightRowAnswered")}
    assert len(answered) == 2
    sent = [json.loads(x) for x in Path(job.requests_path).read_bytes().splitlines()]
    price = standard_price(r.table.get(MODEL))
    client = r.client()
    for line in sent:
        if line["custom_id"] not in answered:
            continue
        # the emulator answers a body deterministically: the same body again shows what it billed
        usage = client.responses.create(**line["body"]).model_dump()["usage"]
        got = answered[line["custom_id"]]
        assert (got["prompt_tokens"], got["completion_tokens"], got["reasoning_tokens"]) == (
            usage["input_tokens"],
            usage["output_tokens"],
            usage["output_tokens_details"]["reasoning_tokens"],
        )
        assert got["cost_usd"] == pytest.approx(cost(usage, price))


def test_the_online_route_sends_every_row_through_the_responses_api(rig):
    r = rig("route: online\n")
    job = r.run(texts(3))
    assert job.ended == "completed", job.last_error
    assert r.emu.request_count("POST", "/v1/responses") == 3 and r.emu.batches_created() == 0
    assert [row["answered_by"] for row in r.result_rows()] == ["online"] * 3
    assert job.cost_usd > 0 and job.reasoning_tokens > 0


def test_the_flex_route_sends_a_model_served_by_both_through_the_responses_api_at_the_flex_tier(rig):
    r = rig("model: gpt-5.4-mini\nopenai_endpoint: responses\nroute: flex\n")
    job = r.run(texts(2))
    assert job.ended == "completed", job.last_error
    assert r.emu.request_count("POST", "/v1/responses") == 2 and r.emu.request_count("POST", "/v1/chat/completions") == 0
    assert [row["answered_by"] for row in r.result_rows()] == ["flex", "flex"]
    sent = {e["tier"] for e in r.events("OnlineRequestSent")}
    assert sent == {"flex"} and job.model == "gpt-5.4-mini"


def test_a_structured_output_job_on_the_responses_api(rig):
    r = rig(SCHEMA)
    job = r.run(texts(3))
    assert job.ended == "completed", job.last_error
    lines = billed_lines(r)
    assert len(lines) == 3
    rows = r.result_rows()
    for row in rows:
        answer = json.loads(row["grade"])
        assert set(answer) == {"score", "reason"} and isinstance(answer["score"], int)
        assert row["score"] == str(answer["score"]) and row["reason"] == answer["reason"]
    # the billed prompt tokens minus the counted ones: the schema's share, which the emulator bills as
    # the stated allowance (docs/configuration.md), the same on the Responses API as on chat completions
    (learned,) = r.events("SchemaOverheadLearned")
    allowance = schema_allowance(r.config.default.response_format, "o200k_base")
    assert learned["model"] == MODEL and learned["per_request"] == allowance > 0
    assert learned["billed_prompt_tokens"] == job.prompt_tokens


def test_an_answer_cut_by_the_bound_is_a_truncated_row_not_an_answer(rig):
    r = rig("max_completion_tokens: 16\n")  # the least the Responses API takes; reasoning counts against it
    job = r.run(texts(2))
    assert job.ended == "failed"
    bodies = [x["response"]["body"] for x in billed_lines(r)]
    assert [b["status"] for b in bodies] == ["incomplete", "incomplete"]
    assert {b["incomplete_details"]["reason"] for b in bodies} == {"max_output_tokens"}
    rows = r.result_rows()
    assert all(row["error"].startswith("truncated: the answer was cut off") for row in rows)
    assert all("max_output_tokens" in row["error"] for row in rows)
    assert job.cost_usd > 0  # a cut answer is billed all the same


def test_the_sync_call_reads_a_response_as_a_batch_output_line(tmp_path):
    with Emulator(EmulatorConfig(api_key=KEY)) as emu:
        provider = OpenAIProvider(api_key=KEY, base_url=emu.base_url, timeout=10)
        body = {"model": MODEL, "input": [{"role": "user", "content": "grade this"}], "max_output_tokens": 25000}
        out = provider.complete({"custom_id": "r1", "method": "POST", "url": "/v1/responses", "body": body})
        assert emu.request_count("POST", "/v1/responses") == 1 and emu.request_count("POST", "/v1/chat/completions") == 0
        row = parse_line(out)
        assert row.ok and row.content and row.finish_reason == "completed"
        assert row.prompt_tokens > 0 and row.completion_tokens > row.reasoning_tokens > 0
        refused = {**body, "input": [{"role": "user", "content": "__REFUSE__ this"}]}
        no = parse_line(provider.complete({"custom_id": "r2", "method": "POST", "url": "/v1/responses", "body": refused}))
        assert not no.ok and no.error_code == "refused"


def test_a_batch_created_by_another_process_names_the_endpoint_of_its_lines(tmp_path):
    """After a restart between the upload and the create, the endpoint is read from the file."""
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": MODEL, "input": [{"role": "user", "content": "grade"}], "max_output_tokens": 25000},
    }
    path = tmp_path / "bg-job1-c0-a0.jsonl"
    path.write_text(json.dumps(line) + "\n")
    clock = ManualClock()
    with Emulator(EmulatorConfig(api_key=KEY, clock=clock)) as emu:
        uploaded = OpenAIProvider(api_key=KEY, base_url=emu.base_url, timeout=10).upload(path, path.name)
        restarted = OpenAIProvider(api_key=KEY, base_url=emu.base_url, timeout=10)
        b = restarted.create_batch(uploaded.id, metadata={"bg_key": "job1:0:0"})
        assert b.endpoint == "/v1/responses"
        assert emu.request_count("GET", "/v1/files/{id}/content") == 1
        clock.advance(3600)
        done = restarted.retrieve(b.id)
        assert done.status == "completed" and done.request_counts.completed == 1
        chat = tmp_path / "bg-job1-c1-a0.jsonl"
        chat.write_text(json.dumps({**line, "url": "/v1/chat/completions", "body": {"model": MODEL, "messages": []}}) + "\n")
        f = restarted.upload(chat, chat.name)
        assert restarted.create_batch(f.id).endpoint == "/v1/chat/completions"  # read at upload: no download
        assert emu.request_count("GET", "/v1/files/{id}/content") == 1
