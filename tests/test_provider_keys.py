"""Who answers: stored answers are keyed under the provider that gave them
(``answerkey.provider_id_of``), by the daemon and by ``bgctl count`` alike.

The real daemon (subprocess) grades one file through each provider's API on one emulator (every
provider behind one address, as behind a proxy), then a second file that repeats some rows:
``bgctl count`` predicts exactly the cache hits the daemon then has, for each provider, and an
OpenAI job whose request bodies are identical to the Anthropic job's reuses none of its answers.
Also: bad provider settings are refused naming the profile and the key to fix."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from batchgrader.emulator import Emulator, EmulatorConfig
from harness import BGCTL, FAST_CONFIG, daemon_env

CLAUDE = "claude-haiku-4-5"
PROFILES = {
    "o": "provider: openai\n    model: gpt-5.4-mini",
    "a": f"provider: anthropic\n    model: {CLAUDE}",
    "g": "provider: gemini\n    model: gemini-2.5-flash-lite",
    "z": "provider: azure\n    model: grader-deploy\n    azure_model: gpt-5.4-mini",
    # OpenAI's API (here: the emulator's) asked the very requests the Anthropic profile sends
    "oc": f"provider: openai\n    model: {CLAUDE}",
}
CONFIG = FAST_CONFIG + "profiles:\n" + "".join(f"  {name}:\n    {body}\n" for name, body in PROFILES.items())


def env_for(home: Path, emu: Emulator) -> dict[str, str]:
    env = {
        k: v
        for k, v in daemon_env(home, emu.base_url).items()
        if not k.startswith(("ANTHROPIC_", "GEMINI_", "GOOGLE_", "AZURE_"))
    }
    env.update(
        ANTHROPIC_BASE_URL=emu.root_url,
        ANTHROPIC_API_KEY="sk-ant-keys-test-0123456789",
        GOOGLE_GEMINI_BASE_URL=emu.root_url,
        GEMINI_API_KEY="AIza-keys-test-0123456789",
        AZURE_OPENAI_ENDPOINT=emu.root_url,
        AZURE_OPENAI_API_KEY="azure-keys-test-0123456789",
    )
    return env


def bg(home: Path, emu: Emulator, *args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([BGCTL, *args], env=env_for(home, emu), capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def rows(numbers: range) -> str:
    return "id,response\n" + "".join(f"{i},answer number {i}\n" for i in numbers)


def events(home: Path, type_: str) -> dict[str, dict]:
    """job_id -> payload of its ``type_`` event."""
    with sqlite3.connect(home / "batchgrader.db") as conn:
        got = conn.execute("SELECT job_id, payload FROM events WHERE type = ?", (type_,)).fetchall()
    return {job: json.loads(p) for job, p in got}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_answers_are_keyed_by_who_answers_and_count_predicts_the_daemons_reuse(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(CONFIG)
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    first.write_text(rows(range(0, 4)))
    second.write_text(rows(range(2, 7)))  # rows 2 and 3 were answered already
    with Emulator(EmulatorConfig(seed=3, extra_models=("grader-deploy",))) as emu:  # the Azure deployment
        for name in ("o", "a", "g", "z"):
            bg(home, emu, "submit", str(first), "--profile", name)
        bg(home, emu, "daemon", "--once")
        accepted = {p["profile"]: job for job, p in events(home, "JobAccepted").items()}
        assert set(accepted) == {"o", "a", "g", "z"}
        with sqlite3.connect(home / "batchgrader.db") as conn:
            stored = dict(conn.execute("SELECT job_id, group_concat(DISTINCT provider) FROM answers GROUP BY job_id"))
        root = emu.root_url.rstrip("/")
        assert stored == {
            accepted["o"]: emu.base_url.rstrip("/"),
            accepted["a"]: f"anthropic:{root}",
            accepted["g"]: f"gemini:{root}",
            accepted["z"]: root,
        }

        # bgctl count's prediction, then the daemon's decision, for each provider
        predicted = {}
        for name in ("o", "a", "g", "z"):
            summary = json.loads(bg(home, emu, "count", str(second), "--profile", name, "--json").stdout)
            predicted[name] = summary["reuse"]["cached_rows"]
        summary = json.loads(bg(home, emu, "count", str(first), "--profile", "oc", "--json").stdout)
        predicted["oc"] = summary["reuse"]["cached_rows"]
        assert predicted == {"o": 2, "a": 2, "g": 2, "z": 2, "oc": 0}

        before = set(events(home, "JobAccepted"))
        for name in ("o", "a", "g", "z"):
            bg(home, emu, "submit", str(second), "--profile", name)
        bg(home, emu, "submit", str(first), "--profile", "oc")
        bg(home, emu, "daemon", "--once")
    new = {p["profile"]: job for job, p in events(home, "JobAccepted").items() if job not in before}
    reused = events(home, "RequestsReused")
    got = {name: reused[job]["cached_rows"] if job in reused else 0 for name, job in new.items()}
    assert got == predicted
    assert set(events(home, "JobCompleted")) == set(accepted.values()) | set(new.values())  # all 9 jobs done
    # the OpenAI job asked exactly the Anthropic job's questions (the prompt-cache key routes a
    # request, it is not part of the question), and still sent every row
    from batchgrader.pipeline.answerkey import ROUTING_FIELDS

    bodies = {
        name: [
            {k: v for k, v in json.loads(line)["body"].items() if k not in ROUTING_FIELDS}
            for line in (home / "work" / job / "requests.jsonl").read_text().splitlines()
        ]
        for name, job in (("a", accepted["a"]), ("oc", new["oc"]))
    }
    assert bodies["a"] == bodies["oc"] and len(bodies["a"]) == 4
    assert events(home, "JobPrepared")[new["oc"]]["requests"] == 4


@pytest.mark.parametrize(
    "profile,environ,needles",
    [
        ("provider: mistral\n    model: x", {}, ["profiles.p: key 'provider'", "'anthropic'", "'mistral'"]),
        (
            "provider: gemini\n    model: claude-haiku-4-5",
            {},
            ["profiles.p: key 'model'", "does not offer", "set 'model' or 'provider'"],
        ),
        ("provider: anthropic\n    model: gpt-5.4-mini", {}, ["profiles.p: key 'model'", "'claude-'"]),
        (f"provider: anthropic\n    model: {CLAUDE}", {}, ["profile 'p'", "ANTHROPIC_API_KEY"]),
        ("provider: gemini\n    model: gemini-2.5-flash", {}, ["profile 'p'", "GEMINI_API_KEY (or GOOGLE_API_KEY)"]),
        ("provider: azure\n    model: dep\n    azure_model: gpt-5.4-mini", {}, ["profile 'p'", "AZURE_OPENAI_API_KEY"]),
        (
            "provider: azure\n    model: dep\n    azure_model: gpt-5.4-mini",
            {"AZURE_OPENAI_API_KEY": "k"},
            ["profile 'p'", "AZURE_OPENAI_ENDPOINT"],
        ),
    ],
    ids=[
        "unknown provider",
        "claude model for gemini",
        "gpt model for anthropic",
        "no anthropic key",
        "no gemini key",
        "no azure key",
        "no azure endpoint",
    ],
)
def test_bad_provider_settings_name_the_profile_and_the_key(tmp_path: Path, profile: str, environ: dict, needles: list) -> None:
    """Checked when the configuration loads (or, for keys, before the daemon makes a provider):
    nothing can be sent, and the message names the profile and what to set."""
    from batchgrader.core.configuration.config import ConfigError, load_config, provider_key_problem
    from batchgrader.core.host.home import Home

    (tmp_path / "config.yaml").write_text(f"profiles:\n  p:\n    {profile}\n")
    try:
        message = provider_key_problem(load_config(Home(tmp_path), environ=environ))
    except ConfigError as exc:
        message = str(exc)
    assert message is not None and all(n in message for n in needles), message
