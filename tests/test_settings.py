"""The settings' declarations (core/configuration/settings.py): each setting once, and the lists the loader,
the daemon and the docs use derived from them."""

from __future__ import annotations

import dataclasses

import pytest

from batchgrader.core.configuration import settings
from batchgrader.core.configuration.config import KEYS, Config, ConfigError, Profile, load_config
from batchgrader.core.configuration.providers import PROVIDER_FACTS


@pytest.mark.parametrize("key", list(KEYS))
def test_every_default_passes_its_own_check_unchanged(key):
    spec = KEYS[key]
    assert spec.check(spec.default) == spec.default, f"{key}: its default is not a value its check accepts as it is"


def test_each_setting_is_declared_once_under_its_key_in_a_documented_section():
    assert [s.name for s in KEYS.values()] == list(KEYS)
    assert {s.section for s in KEYS.values()} == set(settings.SECTIONS)
    assert all(s.doc and "|" not in s.doc for s in KEYS.values())


def test_the_lists_are_derived_from_the_declarations():
    assert settings.GLOBAL_ONLY == {k for k, s in KEYS.items() if not s.profile}
    assert "log_level" in settings.GLOBAL_ONLY and "model" not in settings.GLOBAL_ONLY
    assert settings.RESTART_ONLY_KEYS == tuple(k for k, s in KEYS.items() if s.restart)
    assert {"log_level", "api_key", "poll_interval_seconds"} <= set(settings.RESTART_ONLY_KEYS)
    assert {f.key_setting for f in PROVIDER_FACTS.values()} <= set(settings.SECRET_KEYS)


def test_the_daemon_warns_about_exactly_the_restart_only_settings():
    from batchgrader.core.configuration.watch import RESTART_ONLY_KEYS

    assert set(RESTART_ONLY_KEYS) == set(settings.RESTART_ONLY_KEYS)


def test_a_declaration_adds_a_key_with_every_fact_of_it():
    class More(settings.Settings):
        retries = settings.Setting(3, settings._int(0), settings.RUN, "Times a thing is tried.", profile=False, restart=True)

    spec = vars(More)["retries"]
    assert (spec.name, spec.env, spec.default, spec.profile, spec.restart, spec.secret) == (
        "retries",
        "BATCHGRADER_RETRIES",
        3,
        False,
        True,
        False,
    )
    with pytest.raises(ValueError, match="an integer >= 0"):
        spec.check(-1)


def test_no_setting_shadows_a_member_of_a_profile_or_the_configuration():
    members = {name for cls in (Profile, Config) for name in vars(cls) if not name.startswith("__")}
    members |= {f.name for cls in (Profile, Config) for f in dataclasses.fields(cls)}
    assert {"name", "values", "sources", "home", "default", "profiles", "get", "explain"} <= members
    assert not members & set(KEYS)


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
