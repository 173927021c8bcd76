"""A profile with ``provider: gemini``: the real daemon (subprocess) against the emulator's Gemini
Batch API over HTTP, through the official ``google-genai`` SDK.  End to end, kill -9 at each intent
and outcome, fault profiles, bad input refused before anything is sent, and the key never written."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from batchgrader.core.log.state import fold
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.store.eventstore import EventStore
from harness import BGCTL, FAST_CONFIG, daemon_env, outbox_files
from killsuite import CHUNKS, PROVIDER_EVENT_POINTS, SPLIT, KillSuite

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

GEMINI_KEY = "AIza-test-key-never-written-0123456789"
MODEL = "gemini-2.5-flash-lite"
CONFIG = FAST_CONFIG + SPLIT + f"provider: gemini\nmodel: {MODEL}\n"
CREATE = "/v1beta/models/{model}:batchGenerateContent"


def env_for(home: Path, emu: Emulator, key: str | None = GEMINI_KEY, var: str = "GEMINI_API_KEY") -> dict[str, str]:
    env = {k: v for k, v in daemon_env(home, emu.base_url).items() if not k.startswith(("GEMINI_", "GOOGLE_"))}
    env["GOOGLE_GEMINI_BASE_URL"] = emu.root_url
    if key:
        env[var] = key
    return env


def run(
    home: Path, emu: Emulator, *args: str, key: str | None = GEMINI_KEY, var: str = "GEMINI_API_KEY"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BGCTL, *args], env=env_for(home, emu, key, var), capture_output=True, text=True, timeout=180, check=False
    )


def state_of(home: Path):  # noqa: ANN201
    with EventStore(home / "batchgrader.db", readonly=True) as s:
        return fold(s.read())


SUITE = KillSuite(config=CONFIG, api_key=GEMINI_KEY, env_for=env_for, finish_attempts=6)


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return SUITE.golden(tmp_path_factory.mktemp("golden"))


def test_end_to_end_csv_json_jsonl_multichunk_structured(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(
        home,
        CONFIG
        + """profiles:
  scored:
    provider: gemini
    model: gemini-2.5-flash-lite
    max_completion_tokens: 400
    output_column: verdict
    response_format:
      type: object
      properties: {score: {type: integer, minimum: 1, maximum: 5}, reason: {type: string}}
      required: [score, reason]
      additionalProperties: false
  gpt:
    provider: openai
    model: gpt-5.4-mini
""",
    )
    (home / "inbox" / "scored").mkdir()
    (home / "inbox" / "scored" / "s.jsonl").write_text("".join(json.dumps({"response": f"essay {i}"}) + "\n" for i in range(4)))
    (home / "inbox" / "list.json").write_text(json.dumps([{"response": "x"}, {"response": "y"}]))
    (home / "inbox" / "gpt").mkdir()
    (home / "inbox" / "gpt" / "g.csv").write_text("response\nopenai row\n")
    with Emulator(EmulatorConfig(api_key=None, seed=3)) as emu:
        res = run(home, emu, "daemon", "--once", var="GOOGLE_API_KEY")  # the other key variable works too
        assert res.returncode == 0, res.stderr
        out = outbox_files(home)
        assert set(out) == {"a_results.csv", "b_results.jsonl", "s_results.jsonl", "list_results.json", "g_results.csv"}
        rows = list(csv.DictReader(io.StringIO(out["a_results.csv"].decode())))
        assert [r["id"] for r in rows] == [str(i) for i in range(7)]
        assert all(r["grade"] and r["error"] == "" and int(r["input_tokens"]) > 0 for r in rows)
        scored = [json.loads(line) for line in out["s_results.jsonl"].decode().splitlines()]
        assert all(1 <= r["score"] <= 5 and isinstance(r["reason"], str) for r in scored)
        assert [r["response"] for r in json.loads(out["list_results.json"])] == ["x", "y"]
        stats = emu.stats()
        # a.csv 3 + b.jsonl 1 + s.jsonl 2 + list.json 1 Gemini batches, and the openai profile's file went to /v1/batches
        assert stats["requests"].get(f"POST {CREATE}") == 7
        assert stats["requests"].get("POST /v1/batches") == 1
        st = state_of(home)
        jobs = {j.file: j for j in st.jobs.values()}
        assert jobs["a.csv"].chunks_total == 3 and all(j.ended == "completed" for j in jobs.values())
        costs = json.loads(run(home, emu, "costs", "--json").stdout)
        assert costs  # priced from the shipped Gemini batch prices
    blob = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert GEMINI_KEY.encode() not in blob  # the key is written nowhere


def test_usage_and_cost_parsed_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(
        home, CONFIG.replace(MODEL, "gemini-2.5-flash") + "max_completion_tokens: 16000\n"
    )  # room for 2.5 Flash's default thinking
    (home / "inbox" / "b.jsonl").unlink()
    with Emulator(EmulatorConfig(api_key=GEMINI_KEY, seed=5)) as emu:
        assert run(home, emu, "daemon", "--once").returncode == 0
        prompt = candidates = thoughts = 0
        for b in emu.store.gemini_batches.batches.values():
            for r in b.results or []:
                u = r["response"]["usageMetadata"]
                prompt += u["promptTokenCount"]
                candidates += u["candidatesTokenCount"]
                thoughts += u.get("thoughtsTokenCount", 0)
    assert prompt > 0 and candidates > 0 and thoughts > 0
    rows = list(csv.DictReader(io.StringIO((home / "outbox" / "a_results.csv").read_text())))
    assert sum(int(r["input_tokens"]) for r in rows) == prompt
    assert sum(int(r["output_tokens"]) for r in rows) == candidates + thoughts  # thinking is billed as output
    (job,) = state_of(home).jobs.values()
    expected = (prompt * 0.15 + (candidates + thoughts) * 1.25) / 1e6  # gemini-2.5-flash batch prices
    assert job.cost_usd == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "config,key,needle",
    [
        (FAST_CONFIG + "profiles:\n  g:\n    provider: gemini\n", GEMINI_KEY, "profiles.g: key 'model'"),
        (FAST_CONFIG + "profiles:\n  g:\n    provider: gemini\n    model: claude-haiku-4-5\n", GEMINI_KEY, "does not offer"),
        (FAST_CONFIG + f"profiles:\n  g:\n    provider: gemini\n    model: {MODEL}\n", None, "GEMINI_API_KEY"),
    ],
    ids=["default model not offered", "claude model for gemini", "missing key"],
)
def test_bad_provider_settings_refused_before_anything_is_sent(tmp_path: Path, config: str, key: str | None, needle: str) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home, config)
    with Emulator(EmulatorConfig(seed=1)) as emu:
        res = run(home, emu, "daemon", "--once", key=key)
        assert res.returncode == 78 and needle in res.stderr, res.stderr
        assert emu.stats()["requests"] == {}


def test_custom_id_gemini_cannot_take_fails_the_job_before_sending(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home, CONFIG + "id_column: id\n")
    (home / "inbox" / "b.jsonl").unlink()
    (home / "inbox" / "a.csv").write_text(f"id,response\nok-1,x\n{'z' * 600},y\n")
    with Emulator(EmulatorConfig(api_key=GEMINI_KEY, seed=1)) as emu:
        res = run(home, emu, "daemon", "--once")
        assert res.returncode == 4, res.stderr  # a job ended failed (docs/guide.md: exit codes)
        assert emu.request_count("POST", "/upload/v1beta/files") == 0 and emu.request_count("POST", CREATE) == 0
    (job,) = state_of(home).jobs.values()
    assert job.ended == "failed" and "Gemini batch key" in job.error["error"]


API_POINTS = [
    ("POST", "/upload/v1beta/files", "received", 1),
    ("POST", "/upload/v1beta/files", "effected", 2),
    ("POST", CREATE, "received", 1),
    ("POST", CREATE, "effected", 1),
    ("POST", CREATE, "effected", 3),
    ("GET", "/v1beta/batches", "effected", 2),  # the poll round's listing
    ("GET", "/v1beta/files/{id}:download", "received", 1),
    ("GET", "/v1beta/files/{id}:download", "effected", 2),
    ("DELETE", "/v1beta/files/{id}", "effected", 1),
]


@pytest.mark.parametrize("method,route,phase,nth", API_POINTS, ids=[f"{m} {r} {p} #{n}" for m, r, p, n in API_POINTS])
def test_kill_inside_api_call(tmp_path: Path, golden: dict[str, bytes], method: str, route: str, phase: str, nth: int) -> None:
    SUITE.kill_inside_api_call(tmp_path / "home", golden, method, route, phase, nth)


@pytest.mark.parametrize("event,nth", PROVIDER_EVENT_POINTS, ids=[f"after {e} #{n}" for e, n in PROVIDER_EVENT_POINTS])
def test_kill_after_event(tmp_path: Path, golden: dict[str, bytes], event: str, nth: int) -> None:
    SUITE.kill_after_event(tmp_path / "home", golden, event, nth)


@pytest.mark.parametrize("profile", ["flaky", "drops"])
def test_fault_profile_still_pays_once(tmp_path: Path, golden: dict[str, bytes], profile: str) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    emu = SUITE.emulator(faults=profile)
    try:
        SUITE.finish(home, emu, attempts=8)
        SUITE.check(home, emu, golden)
        assert sum(emu.stats()["faults_injected"].values()) > 0
    finally:
        emu.stop()


def test_sandbox_serves_gemini_profiles_without_any_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_", "GEMINI_", "GOOGLE_"))}
    env["BATCHGRADER_HOME"] = str(home)
    res = subprocess.run([BGCTL, "daemon", "--sandbox", "--once"], env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    status = json.loads(subprocess.run([BGCTL, "status", "--json"], env=env, capture_output=True, text=True).stdout)
    assert {s["state"] for s in status} == {"completed"} and all(s["sandbox"] for s in status)
    assert len(list((home / "sandbox" / "gemini" / "batches").glob("*.json"))) == CHUNKS  # kept for a restarted sandbox
    rows = list(csv.DictReader(io.StringIO((home / "outbox" / "a_results.csv").read_text())))
    assert len(rows) == 7 and all(r["grade"] for r in rows)
