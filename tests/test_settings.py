"""The typed settings (core/settings.py) and the configuration keys (core/config.py KEYS) say
the same: one annotation per key, of the type the key's check returns."""

from __future__ import annotations

import pytest

from batchgrader.core.config import KEYS, ConfigError, load_config
from batchgrader.core.settings import Settings


def _norm(t: str) -> str:
    return t.replace("typing.", "").replace("Dict", "dict").replace(" ", "").replace("dict[str,Any]", "dict")


def test_every_key_has_one_annotation_of_the_type_its_check_returns():
    annotations = Settings.__annotations__
    assert set(annotations) == set(KEYS), "add the key to core/settings.py (or remove it there)"
    for key, spec in KEYS.items():
        returns = spec.check.__annotations__.get("return")
        assert returns is not None, f"{key}: its check has no return annotation"
        assert _norm(annotations[key]) == _norm(str(returns)), (
            f"{key}: Settings says {annotations[key]}, its check returns {returns}"
        )


def test_a_profile_reads_its_values_through_the_typed_attributes(home):
    home.config_file.write_text("model: gpt-5.4-mini\nmax_row_retries: 5\nprofiles:\n  b:\n    max_row_retries: 1\n")
    config = load_config(home, environ={})
    assert config.max_row_retries == 5 and config.profile("b").max_row_retries == 1
    assert config.profile("b").model == "gpt-5.4-mini"  # inherited from the top level
    with pytest.raises(AttributeError):
        config.profile("b").no_such_key  # noqa: B018


@pytest.mark.parametrize(
    "key",
    [
        "poll_interval_seconds",
        "request_timeout_seconds",
        "stable_seconds",
        "rescan_interval_seconds",
        "on_job_end_timeout_seconds",
    ],
)
def test_a_wait_that_has_no_unset_meaning_refuses_null_naming_the_key(home, key):
    home.config_file.write_text(f"model: gpt-5.4-mini\n{key}: null\n")
    with pytest.raises(ConfigError, match=key):  # the daemon divided by it, or waited on None
        load_config(home, environ={})
