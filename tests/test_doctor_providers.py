"""`bgctl doctor` checks each configured provider: key present, endpoint reachable, models priced,
token counting available; and the key never appears in what it prints."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator

import pytest
from rich.console import Console

from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.ops.checks import WARN
from batchgrader.ops.doctor import FAIL, OK, Check, checks_as_json, render_checks, run_checks

pytestmark = pytest.mark.slow

KEY = "sk-test-doctor-openai-0123456789abcdef"
ANT_KEY = "sk-ant-doctor-secret-0123456789abcdef"
CONFIG = "profiles:\n  claude:\n    provider: anthropic\n    model: claude-haiku-4-5\n"


@pytest.fixture
def home(tmp_path) -> Home:  # noqa: ANN001
    h = Home(tmp_path / "home")
    h.root.mkdir(parents=True)
    h.config_file.write_text(CONFIG)
    return h


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(api_key=None)) as e:
        import anthropic

        # the emulator's first count loads its tokenizer: do that here, not inside doctor's timeout
        anthropic.Anthropic(base_url=e.root_url, api_key="x").messages.count_tokens(
            model="claude-haiku-4-5", messages=[{"role": "user", "content": "warm up"}]
        )
        yield e


def checks(home: Home, emu: Emulator, ant_key: str | None) -> dict[str, Check]:
    env = {"HOME": os.environ.get("HOME", "/tmp"), "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": emu.base_url}
    env["ANTHROPIC_BASE_URL"] = emu.root_url
    if ant_key:
        env["ANTHROPIC_API_KEY"] = ant_key
    found = run_checks(home, env, service_status=None, timeout=3.0)
    buf = io.StringIO()
    render_checks(found, Console(file=buf, width=250, color_system=None))
    assert ANT_KEY not in buf.getvalue() + json.dumps(checks_as_json(found)) + repr(found)
    return {c.name: c for c in found}


def test_anthropic_profile_is_checked(home: Home, emu: Emulator) -> None:
    c = checks(home, emu, ANT_KEY)
    assert c["anthropic key"].status == OK and "claude" in c["anthropic key"].detail
    assert c["anthropic endpoint"].status == OK
    assert c["anthropic token counting"].status == OK and "claude-haiku-4-5" in c["anthropic token counting"].detail
    assert c["pricing: claude-haiku-4-5"].status == OK and "$0.5 in" in c["pricing: claude-haiku-4-5"].detail


def test_missing_anthropic_key_fails_naming_the_variable(home: Home, emu: Emulator) -> None:
    c = checks(home, emu, None)
    assert c["anthropic key"].status == FAIL and "ANTHROPIC_API_KEY" in c["anthropic key"].fix
    assert "claude" in c["anthropic key"].detail and "anthropic endpoint" not in c


def test_rejected_anthropic_key_fails_without_showing_it(home: Home) -> None:
    with Emulator(EmulatorConfig(api_key="sk-ant-the-right-one-0000000000")) as strict:
        c = checks(home, strict, ANT_KEY)
    assert c["anthropic endpoint"].status == FAIL and "401" in c["anthropic endpoint"].detail


def test_openai_only_config_has_no_anthropic_checks(home: Home, emu: Emulator) -> None:
    home.config_file.write_text("model: gpt-5.4-mini\n")
    assert not [n for n in checks(home, emu, ANT_KEY) if n.startswith("anthropic")]


# --- gemini ------------------------------------------------------------------------------------

GEM_KEY = "AIza-doctor-secret-0123456789abcdef"
GEM_CONFIG = "profiles:\n  gem:\n    provider: gemini\n    model: gemini-2.5-flash\n"


def gemini_checks(home: Home, emu: Emulator, key: str | None, var: str = "GEMINI_API_KEY") -> dict[str, Check]:
    home.config_file.write_text(GEM_CONFIG)
    env = {"HOME": os.environ.get("HOME", "/tmp"), "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": emu.base_url}
    env["GOOGLE_GEMINI_BASE_URL"] = emu.root_url
    if key:
        env[var] = key
    found = run_checks(home, env, service_status=None, timeout=3.0)
    buf = io.StringIO()
    render_checks(found, Console(file=buf, width=250, color_system=None))
    assert GEM_KEY not in buf.getvalue() + json.dumps(checks_as_json(found)) + repr(found)
    return {c.name: c for c in found}


def test_gemini_profile_is_checked(home: Home, emu: Emulator) -> None:
    c = gemini_checks(home, emu, GEM_KEY, var="GOOGLE_API_KEY")
    assert c["gemini key"].status == OK and "gem" in c["gemini key"].detail and "GOOGLE_API_KEY" in c["gemini key"].detail
    assert c["gemini endpoint"].status == OK
    assert c["gemini token counting"].status == OK and "gemini-2.5-flash" in c["gemini token counting"].detail
    assert "whole requests" in c["gemini token counting"].detail
    assert c["pricing: gemini-2.5-flash"].status == OK and "$0.15 in" in c["pricing: gemini-2.5-flash"].detail


def test_missing_gemini_key_fails_naming_the_variables(home: Home, emu: Emulator) -> None:
    c = gemini_checks(home, emu, None)
    assert c["gemini key"].status == FAIL and "GEMINI_API_KEY" in c["gemini key"].fix
    assert "GOOGLE_API_KEY" in c["gemini key"].detail and "gemini endpoint" not in c


def test_rejected_gemini_key_fails_without_showing_it(home: Home) -> None:
    with Emulator(EmulatorConfig(api_key="AIza-the-right-one-0000000000")) as strict:
        c = gemini_checks(home, strict, GEM_KEY)
    assert c["gemini endpoint"].status == FAIL and "400" in c["gemini endpoint"].detail
    assert "rejected" in c["gemini endpoint"].fix


def test_gemini_counting_that_leaves_the_system_prompt_out_is_a_warning(home: Home) -> None:
    with Emulator(EmulatorConfig(gemini_count_contents_only=True)) as partial:
        c = gemini_checks(home, partial, GEM_KEY)
    assert c["gemini endpoint"].status == OK
    assert c["gemini token counting"].status == WARN and "ignored generateContentRequest" in c["gemini token counting"].detail
    assert "estimates" in c["gemini token counting"].fix


def test_sandbox_needs_no_key_for_any_provider_and_counts_claude_and_gemini_with_their_endpoints(home: Home) -> None:
    """`bgctl doctor --sandbox` on a working sandbox config (issue 27, item 8): no failure for
    the Anthropic, Gemini or Azure keys the sandbox does not need, no hint to use --sandbox (it
    was given), and no tokenizer warning whose fix (default_encoding) cannot apply to Claude or
    Gemini models."""
    from batchgrader.ops.doctor import OK, WARN, exit_code, run_checks

    home.config_file.write_text(
        "profiles:\n"
        "  claude:\n    provider: anthropic\n    model: claude-haiku-4-5\n"
        "  gem:\n    provider: gemini\n    model: gemini-2.5-flash\n"
        "  az:\n    provider: azure\n    model: my-deployment\n    azure_model: gpt-5.4-mini\n"
    )
    home.config_file.chmod(0o600)
    checks = run_checks(home, {"HOME": "/tmp"}, service_status=None, timeout=3.0, require_key=False, sandbox=True)
    by = {c.name: c for c in checks}
    assert exit_code(checks) == 0, [c for c in checks if c.status not in (OK, WARN)]
    assert not [c for c in checks if "key" in c.name and c.status != OK]
    assert by["api keys"].status == OK and "anthropic, azure, gemini, openai" in by["api keys"].detail
    assert not [c for c in checks if "--sandbox" in c.fix]
    for model in ("claude-haiku-4-5", "gemini-2.5-flash"):
        assert by[f"tokenizer: {model}"].status == OK and "count_tokens" in by[f"tokenizer: {model}"].detail
    assert all("default_encoding" not in c.fix for c in checks)
