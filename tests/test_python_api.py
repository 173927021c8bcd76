"""The Python API (`import batchgrader as bg`, docs/python.md): a light import, keyword settings
as a generated profile of config.yaml, and the documented notebook example run end to end
against the sandbox (the same inbox, event log and daemon as `bgctl`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.ops.profiles import profile_with
from harness import FAST_CONFIG, bgctl, daemon_env

DOC = Path(__file__).parents[1] / "docs" / "python.md"


def test_import_batchgrader_is_light_and_has_no_side_effect(tmp_path):
    code = (
        "import sys, threading, logging, batchgrader as bg\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('batchgrader', 'pandas', 'click', 'yaml', 'openai', 'pyarrow', 'rich', 'sqlite3')))\n"
        "print(threading.active_count(), logging.getLogger('batchgrader').handlers, callable(bg.grade), bg.Job.__name__)\n"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    res = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
    modules, rest = res.stdout.splitlines()
    assert modules == "['batchgrader', 'batchgrader.api']"
    assert rest == "1 [] True Job"
    assert list(cwd.iterdir()) == []


CONFIG_WITH_COMMENTS = """\
# my settings
model: gpt-5.4-mini   # the cheap one
profiles:
    # the careful one
    careful:
        model: gpt-4.1-nano
        temperature: 0
"""


def test_settings_become_a_generated_profile_and_keep_the_file(home):
    home.config_file.write_text(CONFIG_WITH_COMMENTS)
    name = profile_with(home, "careful", {"max_completion_tokens": 77})
    text = home.config_file.read_text()
    assert text.startswith("# my settings\nmodel: gpt-5.4-mini   # the cheap one\nprofiles:\n")
    assert "    # the careful one\n    careful:\n        model: gpt-4.1-nano\n" in text  # untouched
    prof = load_config(home).profile(name)
    assert name.startswith("py-")
    assert (prof.values["model"], prof.values["temperature"], prof.values["max_completion_tokens"]) == ("gpt-4.1-nano", 0, 77)
    assert profile_with(home, "careful", {"max_completion_tokens": 77}) == name  # the same settings: the same profile
    assert home.config_file.read_text() == text  # nothing written twice
    other = profile_with(home, None, {"max_completion_tokens": 77})
    assert other != name and load_config(home).profile(other).values["model"] == "gpt-5.4-mini"


def test_a_bad_setting_is_refused_and_the_file_put_back(home):
    home.config_file.write_text(CONFIG_WITH_COMMENTS)
    with pytest.raises(ConfigError, match="temperatur"):
        profile_with(home, None, {"temperatur": 0})
    with pytest.raises(ConfigError, match="log_level"):
        profile_with(home, None, {"log_level": "DEBUG"})  # a daemon setting: not in a profile
    with pytest.raises(ConfigError, match="unknown profile"):
        profile_with(home, "nope", {"temperature": 0})
    assert home.config_file.read_text() == CONFIG_WITH_COMMENTS


def test_a_setting_an_environment_variable_would_override_is_refused(home, monkeypatch):
    monkeypatch.setenv("BATCHGRADER_TEMPERATURE", "1")
    with pytest.raises(ConfigError, match=r"temperature=0 cannot take effect: env BATCHGRADER_TEMPERATURE"):
        profile_with(home, None, {"temperature": 0})
    assert not home.config_file.exists()


def test_settings_without_a_config_file_start_a_profiles_block(home):
    name = profile_with(home, None, {"temperature": 0.5})
    assert load_config(home).profile(name).values["temperature"] == 0.5


def python_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```[ \t]*$", markdown, re.M | re.S)]


@pytest.mark.slow  # two jobs, each a daemon and the emulator run in the foreground (about 10 s)
@pytest.mark.timeout(300)
def test_the_documented_example_runs_against_the_sandbox(home, tmp_path):
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) == 2
    checks = (
        "assert list(result['id']) == [1, 2, 3] and result['grade'].str.len().min() > 0\n"
        "assert result['error'].isna().all() and set(result['answered_by']) <= {'batch', 'preflight'}\n"
        "assert again.result().shape == (3, 7) and again.status()['sandbox'] is True\n"
        "assert again.cancel()['accepted'] is False  # it has ended: nothing to cancel\n"
    )
    script = tmp_path / "notebook.py"
    script.write_text("\n".join(blocks) + "\n" + checks)
    home.config_file.write_text(FAST_CONFIG)
    res = subprocess.run(
        [sys.executable, str(script)], env=daemon_env(home.root, None, key=None), capture_output=True, text=True, timeout=240
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "inbox" and res.stdout.splitlines()[1] == "completed 3"
    jobs = json.loads(bgctl(home.root, "status", "--json", key=None).stdout)
    assert [(j["state"], j["sandbox"], j["rows"]) for j in jobs] == [("completed", True, 3)] * 2
    assert jobs[0]["profile"].startswith("py-") and jobs[1]["profile"] == "default"
    assert "max_completion_tokens: 60" in home.config_file.read_text()


@pytest.mark.slow  # a daemon, the emulator and a Python process (6 to 20 s)
@pytest.mark.timeout(300)
def test_a_running_daemon_grades_with_the_settings_given(home, tmp_path):
    """The settings reach a daemon that was already running (it reloads the edited config.yaml):
    an output bound of 1 token cuts every answer off, so the job fails (with the top level's 50 it completes)."""
    from batchgrader.core.host.home import Home
    from batchgrader.core.host.lock import daemon_pid
    from harness import start_daemon, wait_for

    home.config_file.write_text(FAST_CONFIG)
    script = tmp_path / "run.py"
    script.write_text(
        "import pandas as pd, batchgrader as bg\n"
        "df = pd.DataFrame({'id': [1, 2], 'response': ['fine', 'broken']})\n"
        "h = bg.grade(df, wait=False, max_completion_tokens=1)\n"
        "row = h.wait(timeout=120)\n"
        "print(row['state'], row['profile'], row['succeeded'], row['failed'])\n"
    )
    proc = start_daemon(home.root, None, "--sandbox", key=None)
    try:
        pid = wait_for(lambda: daemon_pid(Home(home.root)), timeout=30, what="the daemon's lock")
        res = subprocess.run(
            [sys.executable, str(script)], env=daemon_env(home.root, None, key=None), capture_output=True, text=True, timeout=200
        )
        assert res.returncode == 0, res.stderr
        state, profile, succeeded, failed = res.stdout.split()
        assert (state, succeeded, failed) == ("failed", "0", "2") and profile.startswith("py-")
        assert daemon_pid(Home(home.root)) == pid and proc.poll() is None  # graded by the running daemon
    finally:
        proc.terminate()
        proc.wait(timeout=30)
