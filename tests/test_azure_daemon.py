"""A profile with ``provider: azure``: the real daemon (subprocess) against the emulator's Azure
OpenAI routes (``/openai/files``, ``/openai/batches``) over HTTP, through the official SDK's
``AzureOpenAI`` client.  End to end, kill -9 at each intent and outcome, a fault profile, usage and
cost exact, bad settings refused before anything is sent, and the key never written."""

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
from killsuite import PROVIDER_EVENT_POINTS, SPLIT, KillSuite

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

AZURE_KEY = "azure-test-key-never-written-0123456789"
DEPLOYMENT = "grader-mini-batch"
SERVED = (DEPLOYMENT, "scorer-nano")  # the deployments the emulator serves (any other name: 404)
CONFIG = FAST_CONFIG + SPLIT + (f"provider: azure\nmodel: {DEPLOYMENT}\nazure_model: gpt-5.4-mini\n")


def env_for(home: Path, emu: Emulator, key: str | None = AZURE_KEY, endpoint: bool = True) -> dict[str, str]:
    env = {k: v for k, v in daemon_env(home, None, key=None).items() if not k.startswith("AZURE_")}
    if endpoint:
        env["AZURE_OPENAI_ENDPOINT"] = emu.root_url
    if key:
        env["AZURE_OPENAI_API_KEY"] = key
    return env


def run(home: Path, emu: Emulator, *args: str, key: str | None = AZURE_KEY, endpoint: bool = True) -> subprocess.CompletedProcess:
    env = env_for(home, emu, key, endpoint)
    return subprocess.run([BGCTL, *args], env=env, capture_output=True, text=True, timeout=180, check=False)


def state_of(home: Path):  # noqa: ANN201
    with EventStore(home / "batchgrader.db", readonly=True) as s:
        return fold(s.read())


SUITE = KillSuite(config=CONFIG, api_key=AZURE_KEY, env_for=env_for, finish_attempts=6, served=SERVED)


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
    provider: azure
    model: scorer-nano
    azure_model: gpt-4.1-nano
    output_column: verdict
    response_format:
      type: object
      properties: {score: {type: integer, minimum: 1, maximum: 5}, reason: {type: string}}
      required: [score, reason]
      additionalProperties: false
""",
    )
    (home / "inbox" / "scored").mkdir()
    (home / "inbox" / "scored" / "s.jsonl").write_text("".join(json.dumps({"response": f"essay {i}"}) + "\n" for i in range(4)))
    (home / "inbox" / "list.json").write_text(json.dumps([{"response": "x"}, {"response": "y"}]))
    with Emulator(EmulatorConfig(api_key=AZURE_KEY, seed=3, extra_models=SERVED)) as emu:
        res = run(home, emu, "daemon", "--once")
        assert res.returncode == 0, res.stderr
        out = outbox_files(home)
        assert set(out) == {"a_results.csv", "b_results.jsonl", "s_results.jsonl", "list_results.json"}
        rows = list(csv.DictReader(io.StringIO(out["a_results.csv"].decode())))
        assert [r["id"] for r in rows] == [str(i) for i in range(7)]
        assert all(r["grade"] and r["error"] == "" and int(r["input_tokens"]) > 0 for r in rows)
        scored = [json.loads(line) for line in out["s_results.jsonl"].decode().splitlines()]
        assert all(1 <= r["score"] <= 5 and isinstance(r["reason"], str) for r in scored)
        assert [r["response"] for r in json.loads(out["list_results.json"])] == ["x", "y"]
        requests = emu.stats()["requests"]
        # a.csv 3 + b.jsonl 1 + s.jsonl 2 (4 rows, 3 a chunk) + list.json 1 batches, all on the Azure paths
        assert requests.get("POST /openai/batches") == 7 and requests.get("POST /openai/files") == 7
        assert not any(k.startswith(("POST /v1/", "GET /v1/")) for k in requests)
        bodies = [  # every batch's input lines (each batch keeps a link to its input once validated)
            json.loads(line)["body"]["model"]
            for b in emu.store.state.batches.values()
            if b.input_path is not None
            for line in b.input_path.read_bytes().splitlines()
            if line.strip()
        ]
        assert bodies and set(bodies) <= {DEPLOYMENT, "scorer-nano"}  # the deployment names travel in the lines
        st = state_of(home)
        jobs = {j.file: j for j in st.jobs.values()}
        assert jobs["a.csv"].chunks_total == 3 and all(j.ended == "completed" for j in jobs.values())
        assert all(c.batch_id.startswith("batch_") for j in jobs.values() for c in j.chunks.values())
    blob = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert AZURE_KEY.encode() not in blob  # the key is written nowhere


def test_usage_and_cost_parsed_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    (home / "inbox" / "b.jsonl").unlink()
    with Emulator(EmulatorConfig(api_key=AZURE_KEY, seed=5, extra_models=SERVED)) as emu:
        assert run(home, emu, "daemon", "--once").returncode == 0
        batches = [emu.store.batches.retrieve_batch(b) for b in list(emu.store.state.batches)]  # the batch objects' usage
        assert {b["status"] for b in batches} == {"completed"}
        reported_in = sum(b["usage"]["input_tokens"] for b in batches)
        reported_out = sum(b["usage"]["output_tokens"] for b in batches)
    assert reported_in > 0 and reported_out > 0
    rows = list(csv.DictReader(io.StringIO((home / "outbox" / "a_results.csv").read_text())))
    assert sum(int(r["input_tokens"]) for r in rows) == reported_in
    assert sum(int(r["output_tokens"]) for r in rows) == reported_out
    (job,) = state_of(home).jobs.values()
    expected = (reported_in * 0.375 + reported_out * 2.25) / 1e6  # gpt-5.4-mini batch prices, via azure_model
    assert job.cost_usd == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "config,key,endpoint,needle",
    [
        (CONFIG, None, True, "AZURE_OPENAI_API_KEY"),
        (CONFIG, AZURE_KEY, False, "AZURE_OPENAI_ENDPOINT"),
        (CONFIG.replace("azure_model: gpt-5.4-mini\n", ""), AZURE_KEY, True, "set 'azure_model' in the default profile"),
        (
            FAST_CONFIG + f"profiles:\n  az:\n    provider: azure\n    model: {DEPLOYMENT}\n",
            AZURE_KEY,
            True,
            "profile 'az' uses Azure OpenAI deployment",
        ),
    ],
    ids=["missing key", "missing endpoint", "unpriced deployment", "unpriced deployment in a profile"],
)
def test_bad_settings_refused_before_anything_is_sent(
    tmp_path: Path, config: str, key: str | None, endpoint: bool, needle: str
) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home, config)
    with Emulator(EmulatorConfig(seed=1)) as emu:
        res = run(home, emu, "daemon", "--once", key=key, endpoint=endpoint)
        assert res.returncode == 78 and needle in res.stderr, res.stderr
        assert emu.stats()["requests"] == {}


def test_flaky_fault_profile_finishes_without_paying_twice(tmp_path: Path, golden: dict[str, bytes]) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    emu = SUITE.emulator(faults="flaky")
    try:
        SUITE.finish(home, emu, attempts=10)
        SUITE.check(home, emu, golden)
    finally:
        emu.stop()


# Azure runs the OpenAI adapter's code (its ids prefixed, its paths and quota its own): the kills
# here are those where Azure's own records are read back (the upload and the create reconciled by
# listing, a download again); tests/test_crash.py kills OpenAI's at every other point.
API_POINTS = [
    ("POST", "/openai/files", "effected", 2),
    ("POST", "/openai/batches", "received", 1),
    ("POST", "/openai/batches", "effected", 1),
    ("GET", "/openai/files/{id}/content", "effected", 2),
]
AZURE_EVENT_POINTS = [("BatchCreateRequested", 1), ("OutputDownloadStarted", 1)]


@pytest.mark.parametrize("method,route,phase,nth", API_POINTS, ids=[f"{m} {r} {p} #{n}" for m, r, p, n in API_POINTS])
def test_kill_inside_api_call(tmp_path: Path, golden: dict[str, bytes], method: str, route: str, phase: str, nth: int) -> None:
    SUITE.kill_inside_api_call(tmp_path / "home", golden, method, route, phase, nth)


@pytest.mark.parametrize("event,nth", AZURE_EVENT_POINTS, ids=[f"after {e} #{n}" for e, n in AZURE_EVENT_POINTS])
def test_kill_after_event(tmp_path: Path, golden: dict[str, bytes], event: str, nth: int) -> None:
    SUITE.kill_after_event(tmp_path / "home", golden, event, nth)


def test_sandbox_serves_azure_profiles_without_any_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BATCHGRADER_", "AZURE_"))}
    env["BATCHGRADER_HOME"] = str(home)
    res = subprocess.run([BGCTL, "daemon", "--sandbox", "--once"], env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    status = json.loads(subprocess.run([BGCTL, "status", "--json"], env=env, capture_output=True, text=True).stdout)
    assert {s["state"] for s in status} == {"completed"} and all(s["sandbox"] for s in status)
    rows = list(csv.DictReader(io.StringIO((home / "outbox" / "a_results.csv").read_text())))
    assert len(rows) == 7 and all(r["grade"] for r in rows)


def test_queue_limit_is_learned_per_endpoint_and_deployment(tmp_path: Path) -> None:
    """Azure's enqueued-token quota is per deployment: a refusal teaches a limit kept under the
    resource endpoint and the deployment name, and the job still finishes within it."""
    home = tmp_path / "home"
    SUITE.make_inputs(home)
    (home / "inbox" / "b.jsonl").unlink()
    with Emulator(EmulatorConfig(api_key=AZURE_KEY, seed=2, token_limits={DEPLOYMENT: 60}, extra_models=SERVED)) as emu:
        SUITE.finish(home, emu)
        (job,) = state_of(home).jobs.values()
        assert job.ended == "completed"
        with EventStore(home / "batchgrader.db", readonly=True) as s:
            learned = [e.payload for e in s.read() if e.type == "QueueLimitLearned"]
        assert learned and {(p["base_url"], p["model"]) for p in learned} == {(emu.root_url, DEPLOYMENT)}
        assert learned[0]["limit"] == 60 and learned[0]["exact"] is True
        status = json.loads(run(home, emu, "status", "--json").stdout)
        assert status[0]["state"] == "completed" and status[0]["input_tokens_exact"] is True
