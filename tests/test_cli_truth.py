"""Issue 15, "the command line tells the truth": one test (or a few) per item, each through the
real command line (click's runner on the golden home, or the bgctl executable)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from cli_fixtures import golden_home, run
from harness import BGCTL, TEST_KEY, bgctl, daemon_env

SCHEMA_CONFIG = """\
model: gpt-5.4-mini
response_format:
  type: object
  properties:
    score: {type: integer}
    reason: {type: string}
  required: [score, reason]
  additionalProperties: false
"""


def write_rows(path: Path, n: int) -> Path:
    path.write_text("id,response\n" + "".join(f"{i},answer number {i}\n" for i in range(n)), encoding="utf-8")
    return path


def assert_clean_error(res, code: int) -> None:
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


# --- 1. job ids you can tell apart ------------------------------------------------------------------


def test_ids_are_whole_unique_and_open_exactly_that_job(home: Home) -> None:
    golden_home(home)
    table = run("status").output
    for jid in ("194352796bbb", "194352796bbb-2", "194352796bbb-3", "194352796bbb-4", "32c86eafae56", "x-52fbb30faf37"):
        assert jid in table
    for args in (["events", "--last", "200"], ["costs", "--by", "job"]):
        assert "194352796bbb-2" in run(*args).output
    # pasted back in: each id opens exactly that job (the short one is not the -2 job)
    for jid in ("194352796bbb", "194352796bbb-2", "194352796bbb-4"):
        res = run("status", jid, "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["job_id"] == jid
    assert_clean_error(run("status", "1943"), 2)  # a prefix of several: refused, with the candidates
    assert "194352796bbb-2" in run("status", "1943").output


# --- 2. no tracebacks ---------------------------------------------------------------------------------


def _commands(group, prefix=()):
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


BAD_ARGUMENTS = [
    (["costs", "--since", "yesterday"], 2, "expected a date"),
    (["costs", "--since", "2026-13-01"], 2, "expected a date"),
    (["costs", "--since", "2026-11-30", "--until", "2026-11-01"], 2, "is after --until"),
    (["costs", "--by", "week"], 2, "Invalid value"),
    (["status", "nosuchjob"], 2, "no job 'nosuchjob'"),
    (["events", "nosuchjob"], 2, "no job 'nosuchjob'"),
    (["cancel", "nosuchjob"], 2, "no job 'nosuchjob'"),
    (["retry", "nosuchjob"], 2, "no job 'nosuchjob'"),
    (["events", "--last", "many"], 2, "Invalid value"),
    (["logs", "--since", "yesterday"], 2, "expected a UTC time"),
    (["count", "missing.csv"], 2, "does not exist"),
    (["split", "missing.csv"], 2, "does not exist"),
    (["submit", "missing.csv"], 2, "does not exist"),
    (["emulator", "--port", "eighty"], 2, "Invalid value"),
    (["config", "show", "--profile", "nosuch"], 78, "nosuch"),
]


@pytest.mark.parametrize(("args", "code", "says"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _, _ in BAD_ARGUMENTS])
def test_bad_arguments_give_a_message_and_a_code_never_a_traceback(home: Home, args, code, says) -> None:
    golden_home(home)
    res = run(*args)
    assert_clean_error(res, code)
    assert says in res.output


def test_every_command_rejects_an_unknown_option_without_a_traceback(home: Home) -> None:
    commands = list(_commands(cli))
    assert len(commands) >= 16
    for path in commands:
        res = run(*path, "--no-such-option")
        assert_clean_error(res, 2)
        assert "No such option" in res.output, path


def test_the_installed_bgctl_prints_no_traceback(home: Home) -> None:
    golden_home(home)
    for args, code in ((["costs", "--since", "yesterday"], 2), (["status", "nosuchjob"], 2)):
        p = bgctl(home.root, *args)
        assert p.returncode == code and "Traceback" not in p.stderr
        assert p.stderr.startswith("bgctl: error: ")


def test_input_file_problems_are_usage_errors(home: Home, tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    res = run("count", str(bad))
    assert_clean_error(res, 2)
    assert "notes.txt" in res.output


# --- 3. cancel, retry and submit say what will really happen ----------------------------------------


def test_cancel_of_a_finished_job_is_refused_and_nothing_is_recorded(home: Home) -> None:
    golden_home(home)
    res = run("cancel", "194352796bbb-2")
    assert_clean_error(res, 1)
    assert "has already ended (completed)" in res.output
    res = run("cancel", "194352796bbb-2", "--json")
    assert res.exit_code == 1
    answer = json.loads(res.output)
    assert answer["accepted"] is False and answer["state"] == "completed" and answer["job_id"] == "194352796bbb-2"
    assert not list((home.root / "control").glob("*.json"))


def test_cancel_of_an_unfinished_job_is_recorded(home: Home) -> None:
    golden_home(home)
    res = run("cancel", "194352796bbb-3", "--json")  # held: not finished
    assert res.exit_code == 0, res.output
    answer = json.loads(res.output)
    assert answer["accepted"] is True and answer["daemon_running"] is False
    (req,) = (home.root / "control").glob("*.json")
    assert json.loads(req.read_text())["job_id"] == "194352796bbb-3"


def test_retry_says_whether_there_is_anything_to_retry(home: Home) -> None:
    golden_home(home)
    res = run("retry", "194352796bbb")
    assert_clean_error(res, 1)
    assert "every row answered; there is nothing to retry" in res.output
    res = run("retry", "32c86eafae56", "--json")  # completed_with_errors
    assert res.exit_code == 0 and json.loads(res.output)["accepted"] is True
    res = run("retry", "194352796bbb-3")  # held: "submit anyway"
    assert res.exit_code == 0 and "retry requested for job 194352796bbb-3" in res.output


def test_submit_checks_the_type_first(home: Home, tmp_path: Path) -> None:
    bad = tmp_path / "report.docx"
    bad.write_bytes(b"PK\x03\x04")
    res = run("submit", str(bad))
    assert_clean_error(res, 2)
    assert "unsupported file type '.docx'" in res.output
    assert not any(home.inbox.iterdir())
    good = write_rows(tmp_path / "a.csv", 3)
    res = run("submit", str(good), "--json")
    assert res.exit_code == 0
    answer = json.loads(res.output)
    assert answer["queued"] is True and Path(answer["path"]) == home.inbox / "a.csv" and answer["daemon_running"] is False


# --- 4. status shows what is waiting and whether anyone is working ----------------------------------


def test_status_before_the_first_daemon_run_lists_the_inbox(home: Home, tmp_path: Path) -> None:
    assert run("submit", str(write_rows(tmp_path / "reviews.csv", 3))).exit_code == 0
    res = run("status")
    assert res.exit_code == 0, res.output
    assert "reviews.csv" in res.output and "Waiting in the inbox" in res.output
    assert "No daemon is running" in res.output and "  bgctl daemon\n" in res.output
    res = run("status", "--json")
    assert res.exit_code == 0
    (entry,) = json.loads(res.output)
    assert entry["state"] == "inbox" and entry["job_id"] is None and entry["file"] == "reviews.csv"
    assert entry["supported"] is True


def test_status_json_of_an_empty_home_is_an_empty_list(home: Home) -> None:
    res = run("status", "--json")
    assert res.exit_code == 0 and json.loads(res.output) == []


# --- 5. structured output is checked and counted honestly -------------------------------------------


def test_a_schema_strict_mode_rejects_is_refused_naming_the_path(home: Home) -> None:
    home.config_file.write_text(
        "response_format:\n  type: object\n  properties:\n    score: {type: integer}\n"
        "    tags: {type: array, items: {type: object, properties: {t: {type: string}}, required: [t]}}\n"
        "  required: [score]\n  additionalProperties: false\n"
    )
    res = run("config", "show")
    assert_clean_error(res, 78)
    assert "$: every property must be listed in 'required' (missing: tags)" in res.output
    assert "$.properties.tags.items: every object needs additionalProperties: false" in res.output


def test_count_with_a_schema_is_an_estimate_with_a_stated_allowance(home: Home, tmp_path: Path) -> None:
    data = write_rows(tmp_path / "a.csv", 5)
    plain = json.loads(run("count", str(data), "--json").output)
    assert "schema" not in plain and "input_tokens_estimate" not in plain
    assert "input tokens (exact)" in run("count", str(data)).output
    home.config_file.write_text(SCHEMA_CONFIG)
    res = run("count", str(data), "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["input_tokens"] == plain["input_tokens"]  # the local count is unchanged
    sch = s["schema"]
    assert sch["source"] == "allowance" and sch["allowance_tokens"] > 10 and sch["per_request"] == sch["allowance_tokens"]
    assert s["input_tokens_estimate"] == s["input_tokens"] + sch["allowance_tokens"] * 5
    assert s["estimated_cost_usd"]["input"] > plain["estimated_cost_usd"]["input"]
    text = run("count", str(data), columns=120).output
    assert f"allowance: {sch['allowance_tokens']} tokens/request for the schema, not yet calibrated" in text


@pytest.mark.slow
def test_the_daemon_learns_the_schema_overhead_and_count_shows_it_calibrated(home: Home, tmp_path: Path) -> None:
    from batchgrader.emulator import Emulator, EmulatorConfig
    from harness import FAST_CONFIG

    # cache_days 0: the second file repeats the first's rows; every row must be sent (and estimated)
    home.config_file.write_text(FAST_CONFIG + SCHEMA_CONFIG + "cache_days: 0\n")
    write_rows(home.inbox / "first.csv", 4)
    with Emulator(EmulatorConfig(api_key=TEST_KEY, schema_overhead_tokens=37)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
        learned = [json.loads(line) for line in bgctl(home.root, "events", "--json").stdout.splitlines()]
        (ev,) = [e for e in learned if e["type"] == "SchemaOverheadLearned"]
        assert ev["payload"]["per_request"] == 37.0 and ev["payload"]["requests"] == 4
        assert ev["payload"]["billed_prompt_tokens"] - ev["payload"]["counted_tokens"] == 4 * 37
        # count (for the same provider endpoint) now uses the learned overhead, and says so
        data = write_rows(tmp_path / "later.csv", 6)
        at_emu = {"OPENAI_BASE_URL": emu.base_url}
        s = json.loads(run("count", str(data), "--json", env=at_emu).output)
        assert s["schema"]["source"] == "calibrated" and s["schema"]["per_request"] == 37.0
        assert s["input_tokens_estimate"] == s["input_tokens"] + 6 * 37
        assert "calibrated: 37 tokens/request learned from job" in run("count", str(data), columns=140, env=at_emu).output
        # ... and another provider's estimate does not: what is learned is kept per provider
        assert json.loads(run("count", str(data), "--json").output)["schema"]["source"] == "allowance"
        # and so does the daemon's estimate of a later job
        write_rows(home.inbox / "second.csv", 6)
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
    (second,) = [j for j in json.loads(bgctl(home.root, "status", "--json").stdout) if j["file"] == "second.csv"]
    detail = json.loads(bgctl(home.root, "status", second["job_id"], "--json").stdout)
    assert detail["estimate"]["input"] == pytest.approx((s["input_tokens"] + 6 * 37) * 0.375 / 1e6)


# --- 6. exit codes a script can trust ---------------------------------------------------------------


def test_count_exits_3_when_the_model_has_no_price(home: Home, tmp_path: Path) -> None:
    home.config_file.write_text("model: acme-grader-1\ndefault_encoding: o200k_base\n")
    res = run("count", str(write_rows(tmp_path / "a.csv", 2)))
    assert_clean_error(res, 3)
    res = run("split", str(tmp_path / "a.csv"), "--out", str(tmp_path / "out"))
    assert_clean_error(res, 3)


def test_count_exits_3_when_rows_can_never_be_sent(home: Home, tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("id,response\n1,short\n2," + "word " * 3000 + "\n")
    home.config_file.write_text("context_window: 1000\nmax_completion_tokens: 100\n")
    res = run("count", str(data), "--json")
    assert res.exit_code == 3, res.output
    assert len(json.loads(res.output)["row_errors"]) == 1
    assert run("count", str(write_rows(tmp_path / "ok.csv", 2))).exit_code == 0


def test_config_errors_exit_78_usage_errors_exit_2(home: Home, tmp_path: Path) -> None:
    data = write_rows(tmp_path / "a.csv", 2)
    assert run("count", str(data), "--bogus").exit_code == 2
    home.config_file.write_text("temperature: hot\n")
    for args in (["count", str(data)], ["config", "show"], ["submit", "--profile", "x", str(data)]):
        assert_clean_error(run(*args), 78)


def test_doctor_fails_without_a_key_unless_sandbox(home: Home) -> None:
    res = run("doctor", "--json")
    out = json.loads(res.output)
    assert res.exit_code == 1 and out["exit_code"] == 1
    (key,) = [c for c in out["checks"] if c["name"] == "api key"]
    assert key["status"] == "fail" and "refuses to start" in key["detail"]
    res = run("doctor", "--json", "--sandbox")
    (key,) = [c for c in json.loads(res.output)["checks"] if c["name"] == "api keys"]
    assert key["status"] == "ok" and "not needed in the sandbox" in key["detail"]  # issue 27, item 8
    assert res.exit_code == (0 if all(c["status"] != "fail" for c in json.loads(res.output)["checks"]) else 1)


@pytest.mark.slow
def test_daemon_once_exits_4_when_a_job_failed_and_names_the_users_file(home: Home) -> None:
    from batchgrader.emulator import Emulator, EmulatorConfig
    from harness import FAST_CONFIG

    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / "latin.csv").write_bytes("id,response\n1,caf\xe9 cr\xe8me\n".encode("latin-1"))
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        p = bgctl(home.root, "daemon", "--once", base_url=emu.base_url)
    assert p.returncode == 4, p.stderr
    assert "1 job(s) failed" in p.stderr
    (job,) = json.loads(bgctl(home.root, "status", "--json").stdout)
    assert job["state"] == "failed"
    assert job["error"].startswith("latin.csv: ") and "input.csv" not in job["error"]
    report = (home.outbox / "latin_error.txt").read_text()
    assert "latin.csv" in report and "input.csv" not in report
    # a second --once run with nothing new ends 0: only jobs that failed in this run count
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0


# --- 7. messages that name the user's file and key ---------------------------------------------------


def test_unknown_model_gets_did_you_mean_and_the_docs_not_a_price_line(home: Home, tmp_path: Path) -> None:
    home.config_file.write_text("model: gpt-5.4-minii\ndefault_encoding: o200k_base\n")
    res = run("count", str(write_rows(tmp_path / "a.csv", 2)), columns=200)
    assert res.exit_code == 3
    assert "Did you mean 'gpt-5.4-mini'" in res.output
    assert "https://developers.openai.com/api/docs/pricing" in res.output
    assert "gpt-5.4-minii," not in res.output


def test_a_config_with_several_errors_lists_them_all(home: Home) -> None:
    home.config_file.write_text("temprature: 0.2\nmax_completion_tokens: -5\nprofiles:\n  p:\n    api_key: sk-x\n")
    res = run("config", "show", columns=200)
    assert_clean_error(res, 78)
    assert "3 configuration errors:" in res.output
    assert "unknown key 'temprature' (did you mean 'temperature'?)" in res.output
    assert "key 'max_completion_tokens' must be an integer >= 1" in res.output
    assert "key 'api_key' configures the daemon and cannot be set in a profile" in res.output


# --- 9. bgctl logs --------------------------------------------------------------------------------------


def test_logs_since_and_a_bounded_follow(home: Home) -> None:
    home.logs.mkdir(parents=True, exist_ok=True)
    (home.logs / "daemon.log.1").write_text("2026-11-20 10:00:00,000 INFO batchgrader: daemon starting (pid 1)\n")
    (home.logs / "daemon.log").write_text(
        "2026-11-21 09:00:00,000 INFO batchgrader: daemon stopped (pid 1): signal SIGTERM\n"
        "2026-11-21 12:00:00,000 ERROR batchgrader: tick failed: boom\n"
        "Traceback (most recent call last):\n  ValueError: boom\n"
    )
    res = run("logs")
    assert res.exit_code == 0 and res.output.splitlines()[0].endswith("daemon starting (pid 1)")
    res = run("logs", "--since", "2026-11-21 10:00")
    assert res.output.splitlines() == [
        "2026-11-21 12:00:00,000 ERROR batchgrader: tick failed: boom",
        "Traceback (most recent call last):",
        "  ValueError: boom",
    ]
    assert run("logs", "-n", "1").output == "  ValueError: boom\n"
    res = run("logs", "-f", "--max-seconds", "0.2", "-n", "0")  # nothing new: ends at the bound
    assert res.exit_code == 0 and res.output == ""


def test_logs_without_a_log_says_so(home: Home) -> None:
    res = run("logs")
    assert_clean_error(res, 1)
    assert "no daemon log yet" in res.output


@pytest.mark.slow
def test_logs_follow_shows_the_daemon_start_and_stop_and_why(home: Home) -> None:
    from batchgrader.emulator import Emulator, EmulatorConfig
    from harness import FAST_CONFIG

    home.config_file.write_text(FAST_CONFIG)
    write_rows(home.inbox / "a.csv", 3)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        env = daemon_env(home.root, emu.base_url)
        # started before the daemon: it reads the new log from its start, until the stop line
        follower = subprocess.Popen(
            [BGCTL, "logs", "-f", "--until", "daemon stopped", "--max-seconds", "120"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert bgctl(home.root, "daemon", "--once", base_url=emu.base_url).returncode == 0
            out, err = follower.communicate(timeout=120)
        finally:
            follower.kill()
    assert follower.returncode == 0, err
    lines = out.splitlines()
    assert "daemon starting" in lines[0] and "--once" in lines[0]
    assert lines[-1].endswith(
        "daemon stopped (pid " + lines[-1].split("(pid ")[1].split(")")[0] + "): --once: every job has ended"
    )
    assert any("JobCompleted" in line for line in lines)


# --- 10. prices for every chat model the Batch API accepts --------------------------------------------


@pytest.mark.parametrize("model", ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo"])
def test_legacy_chat_models_have_a_price(home: Home, tmp_path: Path, model: str) -> None:
    home.config_file.write_text(f"model: {model}\n")
    res = run("count", str(write_rows(tmp_path / "a.csv", 2)), "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["pricing_error"] is None and s["estimated_cost_usd"]["input"] > 0
    doctor = json.loads(run("doctor", "--json", "--sandbox").output)
    (price,) = [c for c in doctor["checks"] if c["name"] == f"pricing: {model}"]
    assert price["status"] == "ok" and "2026-11-23" in price["detail"]
