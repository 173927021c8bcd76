"""What the user sees is true: bad input, start-up and completion checked through the command line (click's
runner at a fixed width; the tables have their snapshots in test_cli_snapshots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from cli_fixtures import run

# --- 9. advice that names the fix ----------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_latin1_file_names_the_encoding_key(home: Home, tmp_path: Path) -> None:
    latin = tmp_path / "latin.csv"
    latin.write_bytes("id,response\n1,café crème\n".encode("latin-1"))
    res = run("count", str(latin), columns=300)
    assert res.exit_code == 2
    out = _one_line(res.output)
    assert "not valid UTF-8" in out and "save the file as UTF-8" in out and "`encoding: cp1252` (or latin-1)" in out
    home.config_file.write_text("encoding: latin-1\n")  # the advice works
    assert run("count", str(latin)).exit_code == 0


def test_a_missing_column_names_the_setting_and_the_closest_column(home: Home, tmp_path: Path) -> None:
    f = tmp_path / "answers.csv"
    f.write_text("id,responses\n1,a fine answer\n", encoding="utf-8")
    res = run("count", str(f), columns=300)
    assert res.exit_code == 2
    out = _one_line(res.output)
    assert "required column not found" in out
    assert "`response_field` and the `user_prompt` placeholder {response} (config.yaml)" in out
    assert "'responses' (the closest column)" in out
    home.config_file.write_text("profiles:\n  essay:\n    response_field: responses\n    user_prompt: 'Grade: {essay}'\n")
    out = _one_line(run("count", str(f), "--profile", "essay", columns=300).output)
    assert "asked for by the `user_prompt` placeholder {essay} (profile 'essay' in config.yaml)" in out


@pytest.mark.parametrize(
    "name, data, expected",
    [
        ("empty.csv", b"id,response\n", "has a header but no data rows"),
        ("latin.csv", "id,response\n1,café\n".encode("latin-1"), "`encoding: cp1252`"),
        ("other.csv", b"id,text\n1,hello\n", "asked for by `response_field`"),
    ],
)
def test_submit_refuses_what_count_refuses_with_the_same_message(
    home: Home, tmp_path: Path, name: str, data: bytes, expected: str
) -> None:
    f = tmp_path / name
    f.write_bytes(data)
    counted = run("count", str(f), columns=300)
    submitted = run("submit", str(f), columns=300)
    assert submitted.exit_code == counted.exit_code == 2
    assert expected in _one_line(submitted.output) and "queued" not in submitted.output
    assert _one_line(submitted.output) == _one_line(counted.output)
    assert not any(home.inbox.iterdir())  # nothing queued


# --- 11. a `daemon --once` summary lists only this run's jobs ------------------------------------


@pytest.mark.slow  # two real daemon runs
def test_daemon_once_summary_lists_only_this_runs_jobs(home: Home) -> None:
    from harness import FAST_CONFIG, bgctl

    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / "first.csv").write_text("id,response\n1,one answer\n")
    res = bgctl(home.root, "daemon", "--sandbox", "--once", key=None)
    assert res.returncode == 0, res.stderr
    assert "first.csv" in res.stdout
    (home.inbox / "second.csv").write_text("id,response\n1,another answer\n")
    res = bgctl(home.root, "daemon", "--sandbox", "--once", key=None)
    assert res.returncode == 0, res.stderr
    assert "second.csv" in res.stdout and "first.csv" not in res.stdout
    res = bgctl(home.root, "daemon", "--sandbox", "--once", key=None)  # nothing to do
    assert "no job had anything to do in this run" in res.stdout and ".csv" not in res.stdout


# --- 11. shell completion completes job ids and profile names ------------------------------------


def _complete(words: str) -> list[str]:
    from click.testing import CliRunner

    from batchgrader.cli.commands import cli

    env = {
        "_BGCTL_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    res = CliRunner().invoke(cli, [], env=env, prog_name="bgctl")
    return [line.split(",", 1)[1] for line in res.output.splitlines() if line.startswith("plain,")]


def test_shell_completion_completes_job_ids_and_profile_names(home: Home) -> None:
    from cli_fixtures import golden_home

    assert _complete("bgctl status ") == []  # no database yet: nothing, and no error
    golden_home(home)
    assert _complete("bgctl status 194352796bbb-") == ["194352796bbb-4", "194352796bbb-3", "194352796bbb-2"]
    assert _complete("bgctl cancel x-") == ["x-52fbb30faf37"]
    assert set(_complete("bgctl report ")) >= {"32c86eafae56", "194352796bbb"}
    home.config_file.write_text("profiles:\n  essays:\n    model: gpt-4.1-nano\n  emails:\n    model: gpt-5.4-mini\n")
    assert _complete("bgctl count --profile e") == ["emails", "essays"]
    assert _complete("bgctl submit -p es") == ["essays"]
