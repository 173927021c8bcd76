"""The daemon's log masks every registered provider's key, whichever of the variables the provider
registry names for it holds it (core/configuration/providers.py ``key_vars``, and ``BATCHGRADER_<KEY>``): the
list comes from the registry and the settings declared secret, so a new provider's key is masked
without anyone listing it."""

from __future__ import annotations

import logging

import pytest

from batchgrader.core.configuration.config import SECRET_KEYS, env_name, load_config
from batchgrader.daemon.process import setup_logging
from batchgrader.provider.registry import PROVIDERS

KEY_VARS = [(name, var) for name, spec in PROVIDERS.items() for var in (*spec.facts.key_vars, env_name(spec.facts.key_setting))]


def _logged(home, environ: dict[str, str], message: str) -> str:
    config = load_config(home, environ=environ)
    handler = setup_logging(home, "INFO", config.secret_values(environ), to_stderr=False)
    try:
        logging.getLogger("batchgrader.test").warning(message)
        handler.flush()
    finally:
        logging.getLogger("batchgrader").removeHandler(handler)
        handler.close()
    return (home.logs / "daemon.log").read_text(encoding="utf-8")


@pytest.mark.parametrize(("provider", "var"), KEY_VARS, ids=[f"{p}-{v}" for p, v in KEY_VARS])
def test_a_registered_providers_key_is_masked_in_the_log(home, provider, var):
    key = f"{provider}Key-{var.lower()}-Zq81xKp3"
    log = _logged(home, {var: key}, f"calling {provider} with {key} and {key!r}")
    assert key not in log and "Zq81xKp3" not in log
    assert f"calling {provider} with ****" in log


def test_a_key_another_variable_overrides_is_masked_too(home):
    # GOOGLE_API_KEY wins over GEMINI_API_KEY (as in google-genai); the SDK may still read the other
    log = _logged(home, {"GEMINI_API_KEY": "gemini-one-Zq81xKp3", "GOOGLE_API_KEY": "google-two-Wm55yTr7"}, "gemini-one-Zq81xKp3")
    assert "Zq81xKp3" not in log


def test_every_registered_providers_key_setting_is_a_secret():
    assert {spec.facts.key_setting for spec in PROVIDERS.values()} <= set(SECRET_KEYS)


def test_a_value_that_is_no_secret_is_logged_as_it_is(home):
    log = _logged(home, {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1-Zq81xKp3"}, "base http://127.0.0.1:9/v1-Zq81xKp3")
    assert "http://127.0.0.1:9/v1-Zq81xKp3" in log
