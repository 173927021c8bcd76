"""Configuration layering, validation and provenance."""

import json

import pytest
from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.core.configuration.config import KEYS, ConfigError, load_config


def write(home, text):
    home.config_file.write_text(text, encoding="utf-8")


def test_defaults(home):
    cfg = load_config(home, environ={})
    # no fixed chunk size and no fixed cap on batches in flight: the provider's queue limit rules
    assert cfg.split_token_limit is None and cfg.split_row_limit is None and cfg.max_simultaneous_batches is None
    assert cfg.default.sources["model"] == "default"


def test_precedence_defaults_file_env_flags(home):
    write(home, "model: gpt-4.1-nano\nsplit_token_limit: 1000\ntemperature: 0.5\n")
    env = {
        "BATCHGRADER_SPLIT_TOKEN_LIMIT": "2000",
        "OPENAI_API_KEY": "sk-test-1234567890abcdef",
        "OPENAI_BASE_URL": "http://x/v1",
    }
    cfg = load_config(home, environ=env, flags={"temperature": 0.1})
    p = cfg.default
    assert (p.model, p.split_token_limit, p.temperature) == ("gpt-4.1-nano", 2000, 0.1)
    assert p.sources["model"] == "config.yaml"
    assert p.sources["split_token_limit"] == "env BATCHGRADER_SPLIT_TOKEN_LIMIT"
    assert p.sources["temperature"] == "flag --temperature"
    assert (p.api_key, p.sources["api_key"]) == ("sk-test-1234567890abcdef", "env OPENAI_API_KEY")
    assert p.base_url == "http://x/v1"


def test_profiles_override_and_inherit(home):
    write(home, "model: gpt-4.1-nano\nprofiles:\n  cheap:\n    model: gpt-5.4-mini\n    max_completion_tokens: 5\n")
    cfg = load_config(home, environ={})
    cheap = cfg.profile("cheap")
    assert (cheap.model, cheap.max_completion_tokens, cheap.split_token_limit) == ("gpt-5.4-mini", 5, None)
    assert cheap.sources["model"] == "config.yaml profiles.cheap"
    assert cfg.profile(None).model == "gpt-4.1-nano"
    with pytest.raises(ConfigError, match="unknown profile 'nope'.*cheap"):
        cfg.profile("nope")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("modle: gpt-4.1-nano\n", "unknown key 'modle' (did you mean 'model'?)"),
        ("split_token_limit: lots\n", "key 'split_token_limit' must be an integer >= 1, or null; got 'lots'"),
        ("temperature: 7\n", "key 'temperature' must be a number >= 0.0 and <= 2.0"),
        ("halt_on_chunk_failure: maybe\n", "key 'halt_on_chunk_failure' must be true or false"),
        ("response_format: [1, 2]\n", "key 'response_format' must be a JSON schema object"),
        ("profiles:\n  p:\n    base_url: http://x\n", "cannot be set in a profile"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("model: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_values_name_file_key_and_form(home, text, needle):
    write(home, text)
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    assert needle in str(err.value)
    assert str(home.config_file) in str(err.value)


def test_yaml_error_never_quotes_the_line(home):
    write(home, "api_key: 'sk-secret-abcdefghijkl\nmodel: gpt-4.1-nano\n")
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    assert "line" in str(err.value) and "sk-secret" not in str(err.value)


def test_bad_env_value_names_the_variable(home):
    with pytest.raises(
        ConfigError, match="environment variable BATCHGRADER_MAX_ROW_RETRIES: key 'max_row_retries' must be an integer >= 0"
    ):
        load_config(home, environ={"BATCHGRADER_MAX_ROW_RETRIES": "-1"})


def test_config_is_immutable(home):
    cfg = load_config(home, environ={})
    with pytest.raises(TypeError):
        cfg.default.values["model"] = "x"


def test_response_format_schema_is_wrapped_for_the_api(home):
    write(
        home,
        "response_format:\n  type: object\n  properties:\n    score: {type: integer}\n  required: [score]\n  additionalProperties: false\n",
    )
    rf = load_config(home, environ={}).response_format
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"]["properties"]["score"] == {"type": "integer"}


def test_config_show_json_masks_key_and_gives_sources(home, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-SECRET-abcdefghijklmnop")
    write(home, "model: gpt-4.1-nano\n")
    res = CliRunner().invoke(cli, ["config", "show", "--json"])
    assert res.exit_code == 0, res.output
    assert "SECRET" not in res.output
    rows = {r["key"]: r for r in json.loads(res.output)["settings"]}
    assert rows["model"] == {"key": "model", "value": "gpt-4.1-nano", "source": "config.yaml"}
    assert rows["api_key"]["value"].startswith("sk-") and rows["api_key"]["source"] == "env OPENAI_API_KEY"
    assert set(rows) == set(KEYS)


def test_home_flag_relocates_everything(tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "config.yaml").write_text("model: gpt-5.4-nano\n")
    res = CliRunner().invoke(cli, ["--home", str(other), "config", "show", "--json"])
    data = json.loads(res.output)
    assert data["home"] == str(other)
    assert {r["key"]: r["value"] for r in data["settings"]}["model"] == "gpt-5.4-nano"


def test_environment_beats_profile_values_too(home):
    write(home, "profiles:\n  cheap:\n    model: gpt-5.4-mini\n")
    cfg = load_config(home, environ={"BATCHGRADER_MODEL": "gpt-4.1-nano"})
    cheap = cfg.profile("cheap")
    assert (cheap.model, cheap.sources["model"]) == ("gpt-4.1-nano", "env BATCHGRADER_MODEL")


def test_relative_pricing_file_is_under_the_home(home):
    write(home, "pricing_file: prices/mine.csv\n")
    assert load_config(home, environ={}).pricing_path() == home.root / "prices" / "mine.csv"
    write(home, "")
    assert load_config(home, environ={}).pricing_path() is None
    home.pricing_file.write_text("model,input_per_1m,output_per_1m\nx,1,2\n")
    assert load_config(home, environ={}).pricing_path() == home.pricing_file


@pytest.mark.parametrize("value", ["0", "21", "2.5", "three"])
def test_samples_out_of_range_names_the_profile_and_key(home, value):
    write(home, f"profiles:\n  voting:\n    samples: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    msg = str(err.value)
    assert "voting" in msg and "samples" in msg and "from 1 to 20" in msg


def test_samples_default_and_profile_value(home):
    write(home, "profiles:\n  voting:\n    samples: 3\n")
    cfg = load_config(home, environ={})
    assert cfg.default.samples == 1 and cfg.profile("voting").samples == 3


def _laughs(indent: str, levels: int, width: int = 10) -> list[str]:
    """A "billion laughs": each anchor is a list of ``width`` aliases of the one before, so a few
    hundred bytes expand to width**levels values."""
    lines = [f'{indent}l0: &l0 "lol"']
    for i in range(1, levels + 1):
        aliases = ", ".join([f"*l{i - 1}"] * width)
        lines.append(f"{indent}l{i}: &l{i} [{aliases}]")
    return lines


def _alias_bomb(levels: int) -> str:
    head = ["response_format:", "  type: json_schema", "  json_schema:", "    name: x"]
    return "\n".join(head + _laughs("    ", levels)) + "\n"


def test_alias_bomb_in_config_is_refused_naming_the_file_and_the_fix(home):
    write(home, _alias_bomb(7))  # 10**7 values once expanded, from 600 bytes
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    msg = str(err.value)
    assert str(home.config_file) in msg and "aliases" in msg and "write the values out" in msg
    res = CliRunner().invoke(cli, ["config", "show", "--json"])
    assert res.exit_code != 0 and "aliases" in res.output


def test_alias_referring_to_its_own_value_is_refused(home):
    write(home, "response_format: &rf\n  type: json_schema\n  again: *rf\n")
    with pytest.raises(ConfigError, match="refers to the value that contains it"):
        load_config(home, environ={})


def test_a_few_aliases_are_still_fine(home):
    """Anchors shared by profiles (a common YAML idiom) load as before."""
    write(home, "profiles:\n  a: &d\n    temperature: 0.2\n  b:\n    <<: *d\n    model: gpt-5.4-mini\n  c: *d\n")
    cfg = load_config(home, environ={})
    assert [cfg.profile(p).temperature for p in "abc"] == [0.2, 0.2, 0.2] and cfg.profile("b").model == "gpt-5.4-mini"


def test_config_file_over_the_size_limit_is_refused(home):
    from batchgrader.core.configuration.config import MAX_CONFIG_FILE_BYTES

    write(home, "model: gpt-4.1-nano\n" + "# padding\n" * (MAX_CONFIG_FILE_BYTES // 10))
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    assert str(home.config_file) in str(err.value) and f"{MAX_CONFIG_FILE_BYTES:,} bytes" in str(err.value)


def test_alias_bomb_in_prompts_file_is_refused(home):
    from batchgrader.pipeline.prompts import load_named_prompts

    home.prompts_file.write_text("\n".join(["prompts:", *_laughs("  ", 7)]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_named_prompts(home)
    assert str(home.prompts_file) in str(err.value) and "aliases" in str(err.value)
