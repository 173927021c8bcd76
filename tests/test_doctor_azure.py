"""`bgctl doctor` for ``provider: azure``: key present, endpoint reachable at the configured
api-version, deployments priced; the key never appears in what it prints."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator

import pytest
from rich.console import Console

from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.ops.doctor import FAIL, OK, Check, checks_as_json, render_checks, run_checks

AZ_KEY = "azure-doctor-secret-0123456789abcdef"
PRICED = "profiles:\n  az:\n    provider: azure\n    model: grader-mini\n    azure_model: gpt-5.4-mini\n"


@pytest.fixture(scope="module")
def emu() -> Iterator[Emulator]:
    with Emulator(EmulatorConfig(api_key=AZ_KEY)) as e:
        yield e


def checks(tmp_path, emu: Emulator, config: str = PRICED, **env_over: str) -> dict[str, Check]:  # noqa: ANN001
    home = Home(tmp_path / "home")
    home.root.mkdir(parents=True, exist_ok=True)
    home.config_file.write_text(config)
    env = {"HOME": os.environ.get("HOME", "/tmp"), "AZURE_OPENAI_API_KEY": AZ_KEY, "AZURE_OPENAI_ENDPOINT": emu.root_url}
    env.update(env_over)
    env = {k: v for k, v in env.items() if v}
    found = run_checks(home, env, service_status=None, timeout=3.0)
    buf = io.StringIO()
    render_checks(found, Console(file=buf, width=250, color_system=None))
    shown = buf.getvalue() + json.dumps(checks_as_json(found)) + repr(found)
    assert AZ_KEY not in shown and "wrong-azure-key-00000000000" not in shown
    return {c.name: c for c in found}


def test_azure_profile_is_checked(tmp_path, emu: Emulator) -> None:  # noqa: ANN001
    found = checks(tmp_path, emu)
    assert found["azure key"].status == OK and "AZURE_OPENAI_API_KEY" in found["azure key"].detail
    assert found["azure endpoint"].status == OK and "api-version 2025-04-01-preview" in found["azure endpoint"].detail
    assert found["azure deployment: grader-mini"].status == OK and "gpt-5.4-mini" in found["azure deployment: grader-mini"].detail
    assert found["pricing: gpt-5.4-mini"].status == OK  # the model it runs, not the deployment name
    assert "pricing: grader-mini" not in found


def test_missing_key_endpoint_or_price_fail_naming_the_fix(tmp_path, emu: Emulator) -> None:  # noqa: ANN001
    no_key = checks(tmp_path / "1", emu, AZURE_OPENAI_API_KEY="")
    assert no_key["azure key"].status == FAIL and "AZURE_OPENAI_API_KEY" in no_key["azure key"].detail
    no_endpoint = checks(tmp_path / "2", emu, AZURE_OPENAI_ENDPOINT="")
    assert no_endpoint["azure endpoint"].status == FAIL and "AZURE_OPENAI_ENDPOINT" in no_endpoint["azure endpoint"].fix
    unpriced = checks(tmp_path / "3", emu, config=PRICED.replace("    azure_model: gpt-5.4-mini\n", ""))
    c = unpriced["azure deployment: grader-mini"]
    assert c.status == FAIL and "profile 'az'" in c.detail and "azure_model" in c.fix


def test_rejected_key_and_bad_api_version_fail(tmp_path, emu: Emulator) -> None:  # noqa: ANN001
    bad = checks(tmp_path / "1", emu, AZURE_OPENAI_API_KEY="wrong-azure-key-00000000000")
    assert bad["azure endpoint"].status == FAIL and "HTTP 401" in bad["azure endpoint"].detail
    old = checks(tmp_path / "2", emu, OPENAI_API_VERSION="1999-01-01")
    assert old["azure endpoint"].status == FAIL and "azure_api_version" in old["azure endpoint"].fix


def test_openai_only_config_has_no_azure_checks(tmp_path, emu: Emulator) -> None:  # noqa: ANN001
    assert not [n for n in checks(tmp_path, emu, config="model: gpt-5.4-mini\n") if n.startswith("azure")]
