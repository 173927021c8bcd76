"""The model catalogue: lookups, a user's rows, and profiles checked against their model."""

from __future__ import annotations

import datetime
import json

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.host.home import Home
from batchgrader.pipeline.catalogue import catalogue_problems, load_checked
from batchgrader.pipeline.pricing import COLUMNS, PricingError, load_pricing

#: the date shutdown dates are compared with here (gpt-5-mini shuts down on 2026-12-11: tests/test_shutdown.py)
TODAY = datetime.date(2026, 11, 28)

# current models on the providers' pages (audit of 2026-11-25, section 6)
CURRENT = [
    "gpt-6-astra",
    "gpt-6-sol",
    "gpt-6-luna",
    "gpt-5.6-sol",
    "gpt-5.6-terra",
    "gpt-5.6-luna",
    "gpt-5.5-pro",
    "gpt-5.4-pro",
    "gpt-5.2-pro",
    "o1-pro",
    "claude-opus-4-5",
    "claude-opus-4-6",
    "claude-opus-4-7",
    "claude-opus-4-8",
    "claude-sonnet-4-5",
    "claude-sonnet-4-6",
    "claude-fable-5",
    "claude-fable-5-2",
    "claude-mythos-5-2",
    "gemini-3-flash-preview",
    "gemini-3.1-flash-lite",
    "gemini-3.8-flash",
]


@pytest.mark.parametrize("model", CURRENT)
def test_current_models_have_a_row_with_provider_limits_source_and_date(model):
    p = load_pricing().get(model)
    assert p.spec.provider in ("openai", "anthropic", "gemini")
    assert p.input_per_1m > 0 and p.output_per_1m > 0 and p.spec.standard_input_per_1m
    assert p.context_window and p.source and p.taken_on and p.spec.output_param


def test_audit_batch_prices_of_the_new_openai_rows():
    t = load_pricing()
    want = {  # input, cached, output: the pricing page's Batch table (audit section 6)
        "gpt-6-astra": (5.00, 0.50, 25.00),
        "gpt-6-sol": (1.00, 0.10, 5.00),
        "gpt-6-luna": (0.05, 0.005, 0.25),
        "gpt-5.6-sol": (2.00, 0.20, 10.00),
        "gpt-5.6-terra": (1.00, 0.10, 6.00),
        "gpt-5.6-luna": (0.10, 0.01, 0.60),
    }
    for model, prices in want.items():
        p = t.get(model)
        assert (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m) == prices
        assert p.spec.cache_write_per_1m == pytest.approx(1.25 * p.input_per_1m)
    assert (t.get("gpt-5.5-pro").input_per_1m, t.get("gpt-5.5-pro").output_per_1m) == (15, 90)
    assert (t.get("o1-pro").input_per_1m, t.get("o1-pro").output_per_1m) == (75, 300)


@pytest.mark.parametrize(
    "alias, model",
    [
        ("claude-haiku-4-5-20251001", "claude-haiku-4-5"),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5"),
        ("claude-opus-4-8-20261001", "claude-opus-4-8"),  # any real YYYYMMDD snapshot
        ("gpt-6-sol-2026-10-01", "gpt-6-sol"),
    ],
)
def test_dated_and_aliased_ids_resolve_to_their_entry(alias, model):
    assert load_pricing().get(alias).model == model


def test_a_compact_suffix_that_is_no_date_does_not_resolve():
    assert load_pricing().find("claude-opus-4-8-20261399") is None


def test_reasoning_and_temperature_rules_of_known_models():
    t = load_pricing()
    assert t.get("gpt-5").spec.temperature == "default" and t.get("gpt-5").spec.reasoning_default == "medium"
    assert t.get("gpt-5.1").spec.temperature == "effort-none" and t.get("gpt-5.1").spec.reasoning_default == "none"
    assert t.get("claude-opus-4-8").spec.temperature == "deprecated"
    assert t.get("claude-haiku-4-5").spec.temperature == "any" and t.get("claude-haiku-4-5").spec.reasoning == "budget"
    assert t.get("gemini-2.5-pro").spec.reasoning_efforts == ("low", "medium", "high")  # thinking cannot be turned off
    assert t.get("gpt-4o-mini").spec.reasoning is None and t.get("gpt-4o-mini").spec.max_output == 16384
    assert t.get("gpt-5").spec.reasoning_bound >= 25_000  # OpenAI: reserve at least 25,000 tokens


# --- a user's rows ------------------------------------------------------------------------------


def test_a_price_only_user_row_keeps_the_shipped_rules(home: Home):
    home.pricing_file.write_text("model,input_per_1m,output_per_1m\ngpt-5,0.5,4\n", encoding="utf-8")
    p = load_pricing(home.pricing_file).get("gpt-5")
    assert (p.input_per_1m, p.output_per_1m, p.origin) == (0.5, 4.0, str(home.pricing_file))
    assert p.spec.temperature == "default" and p.spec.reasoning == "effort"


def test_a_user_row_may_describe_a_new_model(home: Home):
    home.pricing_file.write_text(
        "model,input_per_1m,output_per_1m,provider,max_output,reasoning,reasoning_efforts,reasoning_default,temperature\n"
        "acme-think,1,2,openai,8000,effort,low|high,low,default\n",
        encoding="utf-8",
    )
    spec = load_pricing(home.pricing_file).get("acme-think").spec
    assert (spec.max_output, spec.reasoning_efforts, spec.temperature) == (8000, ("low", "high"), "default")


@pytest.mark.parametrize(
    "row, where",
    [
        ("x,1,2,openai,many,,,,", "line 2, column 'max_output': 'many' must be a whole number"),
        ("x,1,2,acme,,,,,", "line 2, column 'provider': 'acme' must be one of openai, anthropic, gemini"),
        ("x,1,2,openai,,effort,low|huge,,", "line 2, column 'reasoning_efforts': 'huge' not among"),
        ("x,1,2,openai,,,,,cold", "line 2, column 'temperature': 'cold' must be one of"),
        ("x,1,2,openai,,think,low,,", "line 2, column 'reasoning': 'think' must be one of effort, budget, level"),
        ("x,1,2,openai,,effort,,,", "line 2, column 'reasoning_efforts': a model with reasoning 'effort' needs its efforts"),
    ],
)
def test_a_malformed_user_row_names_file_line_and_field(home: Home, row, where):
    home.pricing_file.write_text(
        "model,input_per_1m,output_per_1m,provider,max_output,reasoning,reasoning_efforts,reasoning_default,temperature\n"
        + row
        + "\n",
        encoding="utf-8",
    )
    with pytest.raises(PricingError) as exc:
        load_pricing(home.pricing_file)
    assert str(exc.value).startswith(f"{home.pricing_file}, {where}")


def test_a_malformed_user_row_stops_the_check_before_anything_is_sent(home: Home):
    home.pricing_file.write_text("model,input_per_1m,output_per_1m,max_output\ngpt-5,1,2,-3\n", encoding="utf-8")
    with pytest.raises(PricingError, match="line 2, column 'max_output'"):
        load_checked(load_config(home, environ={}), today=TODAY)


# --- profiles checked against their model -----------------------------------------------------


def problems(home: Home, text: str) -> list[str]:
    home.config_file.write_text(text, encoding="utf-8")
    return catalogue_problems(load_config(home, environ={}), load_pricing(), today=TODAY)


def test_temperature_on_a_model_that_takes_only_its_default(home: Home):
    [msg] = problems(home, "model: gpt-5-mini\nprofiles:\n  strict:\n    temperature: 0\n")
    assert msg.startswith("profile 'strict': key 'temperature' is 0, but model 'gpt-5-mini' accepts only its default")
    assert "remove 'temperature'" in msg
    assert problems(home, "model: gpt-5-mini\ntemperature: 1\n") == []


def test_temperature_on_a_model_that_deprecated_it(home: Home):
    pinned = "anthropic_api_version: 2023-06-01\nprovider: anthropic\n"  # the catalogue's rules (2026-10-21: below)
    [msg] = problems(home, pinned + "model: claude-opus-4-8\ntemperature: 0\n")
    assert "the default profile: key 'temperature'" in msg and "deprecated for this model" in msg
    assert problems(home, pinned + "model: claude-haiku-4-5\ntemperature: 0\n") == []


def test_temperature_only_at_effort_none(home: Home):
    assert problems(home, "model: gpt-5.1\ntemperature: 0\n") == []  # its default effort is none
    [msg] = problems(home, "model: gpt-5.1\ntemperature: 0\nreasoning_effort: high\n")
    assert "only at reasoning_effort 'none'" in msg and "reasoning_effort: none" in msg


def test_a_reasoning_effort_the_model_lacks(home: Home):
    [msg] = problems(home, "model: gpt-5\nreasoning_effort: xhigh\n")
    assert "key 'reasoning_effort' is 'xhigh', which model 'gpt-5' does not take" in msg
    assert "minimal, low, medium, high" in msg
    [msg] = problems(home, "model: gpt-4o-mini\nreasoning_effort: low\n")
    assert "does not reason" in msg
    [msg] = problems(home, "provider: gemini\nmodel: gemini-2.5-pro\nreasoning_effort: none\n")
    assert "'none', which model 'gemini-2.5-pro' does not take" in msg


def test_an_output_bound_above_the_maximum(home: Home):
    [msg] = problems(home, "model: gpt-4o-mini\nmax_completion_tokens: 20000\n")
    assert "key 'max_completion_tokens' is 20000, above the 16384-token output maximum of model 'gpt-4o-mini'" in msg
    assert "at most 16384" in msg


def test_a_thinking_budget_that_does_not_fit_the_bound(home: Home):
    [msg] = problems(home, "provider: anthropic\nmodel: claude-haiku-4-5\nreasoning_effort: high\nmax_completion_tokens: 4000\n")
    assert "budget of 16384 tokens" in msg and "at least 17408" in msg


def test_a_schema_on_a_model_without_structured_output(home: Home):
    [msg] = problems(
        home,
        "model: gpt-3.5-turbo\nresponse_format:\n  type: json_schema\n  json_schema:\n    name: g\n"
        "    schema: {type: object, properties: {}, additionalProperties: false, required: []}\n    strict: true\n",
    )
    assert "key 'response_format' asks for a JSON schema, which model 'gpt-3.5-turbo' does not support" in msg


def test_a_missing_model_names_the_closest_ids_and_how_to_add_a_row(home: Home):
    home.config_file.write_text("model: gpt-6-sool\n", encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load_checked(load_config(home, environ={}), today=TODAY)
    msg = str(exc.value)
    assert msg.startswith("the default profile: key 'model': no price for model 'gpt-6-sool'")
    assert "'gpt-6-sol'" in msg and "add a row" in msg


def test_every_problem_is_listed_at_once(home: Home):
    home.config_file.write_text(
        "anthropic_api_version: 2023-06-01\nmodel: gpt-5\ntemperature: 0\nprofiles:\n  c:\n    provider: anthropic\n"
        "    model: claude-opus-5\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as exc:
        load_checked(load_config(home, environ={}), today=TODAY)
    assert str(exc.value).startswith("2 settings the models refuse (nothing was sent):")


def test_an_unset_output_bound_is_the_models_reasoning_bound(home: Home):
    home.config_file.write_text("model: gpt-5-mini\nprofiles:\n  own:\n    max_completion_tokens: 3000\n", encoding="utf-8")
    config, _ = load_checked(load_config(home, environ={}), today=TODAY)
    assert config.default.max_completion_tokens == 25_000
    assert config.default.sources["max_completion_tokens"] == "catalogue: reasoning_bound of gpt-5-mini"
    assert config.profile("own").max_completion_tokens == 3000
    # a model that does not reason keeps the key's default
    home.config_file.write_text("model: gpt-4o-mini\n", encoding="utf-8")
    assert load_checked(load_config(home, environ={}), today=TODAY)[0].default.max_completion_tokens == 1000
    # reasoning turned off: no room needed
    home.config_file.write_text("model: gpt-5.1\n", encoding="utf-8")
    assert load_checked(load_config(home, environ={}), today=TODAY)[0].default.max_completion_tokens == 1000


def test_the_columns_are_documented():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert all(f"`{c}`" in doc for c in COLUMNS)


# --- through the commands ---------------------------------------------------------------------


def test_count_refuses_a_setting_the_model_refuses(home: Home, tmp_path):
    from cli_fixtures import run

    data = tmp_path / "a.csv"
    data.write_text("id,response\n1,fine\n", encoding="utf-8")
    home.config_file.write_text("model: gpt-5-mini\ntemperature: 0\n", encoding="utf-8")
    res = run("count", str(data))
    assert res.exit_code == 78, res.output
    assert "key 'temperature' is 0, but model 'gpt-5-mini' accepts only its default" in res.output
    home.config_file.write_text("model: gpt-5-mini\n", encoding="utf-8")
    out = run("count", str(data), "--json")
    assert out.exit_code == 0, out.output
    # the estimate uses the model's reasoning bound and says the output part is an upper bound
    assert json.loads(out.output)["estimated_cost_usd"]["max_output"] == pytest.approx(25_000 * 1.00 / 1e6)


def test_doctor_fails_the_model_settings_check(home: Home):
    from batchgrader.ops.doctor import FAIL, run_checks

    home.config_file.write_text(
        "anthropic_api_version: 2023-06-01\nprovider: anthropic\nmodel: claude-sonnet-5\ntemperature: 0.2\n", encoding="utf-8"
    )
    checks = [c for c in run_checks(home, environ={}, require_key=False) if c.name == "model settings"]
    assert [c.status for c in checks] == [FAIL]
    assert "deprecated for this model" in checks[0].detail and "bgctl models" in checks[0].fix


def test_models_lists_the_catalogue(home: Home):
    from cli_fixtures import run

    home.pricing_file.write_text("model,input_per_1m,output_per_1m,provider\nacme-1,1,2,openai\n", encoding="utf-8")
    rows = json.loads(run("models", "--json").output)["models"]
    by = {r["model"]: r for r in rows}
    assert by["acme-1"]["origin"] == str(home.pricing_file) and by["gpt-6-sol"]["origin"] == "shipped"
    assert by["claude-haiku-4-5"]["aliases"] == ["claude-haiku-4-5-20251001"]
    only = json.loads(run("models", "--provider", "gemini", "--json").output)["models"]
    assert only and {r["provider"] for r in only} == {"gemini"}


@pytest.mark.slow  # a real daemon process
def test_daemon_exits_78_on_a_setting_the_model_refuses(home: Home):
    from harness import bgctl

    home.config_file.write_text("model: o4-mini\ntemperature: 0\n", encoding="utf-8")
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=60)
    assert res.returncode == 78, res.stderr
    assert "key 'temperature' is 0, but model 'o4-mini' accepts only its default" in res.stderr
    assert not home.db.exists() or "submitted" not in res.stderr


def test_temperature_with_anthropic_thinking_only_when_the_profile_asks_for_thinking(home: Home):
    pinned = "anthropic_api_version: 2023-06-01\nprovider: anthropic\n"
    assert problems(home, pinned + "model: claude-sonnet-4-6\ntemperature: 0\n") == []
    [msg] = problems(home, pinned + "model: claude-haiku-4-5\ntemperature: 0\nreasoning_effort: low\n")
    assert "Anthropic accepts no other temperature than 1 with thinking" in msg


@pytest.mark.slow  # a real daemon process
def test_daemon_exits_78_on_a_model_missing_from_the_catalogue(home: Home):
    from harness import bgctl

    home.config_file.write_text("model: gpt-6-sool\n", encoding="utf-8")
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=60)
    assert res.returncode == 78, res.stderr
    assert "no price for model 'gpt-6-sool'" in res.stderr and "'gpt-6-sol'" in res.stderr and "add a row" in res.stderr


def test_config_show_says_the_bound_comes_from_the_catalogue(home: Home):
    from cli_fixtures import run

    home.config_file.write_text("model: o4-mini\n", encoding="utf-8")
    rows = {r["key"]: r for r in json.loads(run("config", "show", "--json").output)["settings"]}
    assert rows["max_completion_tokens"] == {
        "key": "max_completion_tokens",
        "value": 25_000,
        "source": "catalogue: reasoning_bound of o4-mini",
    }
