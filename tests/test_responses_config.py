"""``openai_endpoint`` (issue 33, item 2): which OpenAI API a profile's requests go through, decided
when the configuration loads against the model's catalogue row, and refused with the fix where it
cannot work (nothing sent)."""

from __future__ import annotations

import datetime
import json

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.host.home import Home
from batchgrader.pipeline.catalogue import catalogue_problems, load_checked
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.pipeline.requests import RequestBuilder, request_url, with_output_bound

TODAY = datetime.date(2026, 11, 29)


def problems(home: Home, text: str) -> list[str]:
    home.config_file.write_text(text, encoding="utf-8")
    return catalogue_problems(load_config(home, environ={}), load_pricing(), today=TODAY)


def test_auto_follows_the_catalogues_endpoint_column(home: Home):
    home.config_file.write_text(
        "model: gpt-5.4-mini\nprofiles:\n  pro:\n    model: gpt-5.5-pro\n  claude:\n    provider: anthropic\n"
        "    model: claude-haiku-4-5\n",
        encoding="utf-8",
    )
    config, _ = load_checked(load_config(home, environ={}), today=TODAY)
    assert config.default.openai_endpoint == "chat_completions"
    assert config.profile("pro").openai_endpoint == "responses"
    assert config.profile("pro").sources["openai_endpoint"] == "catalogue: endpoint of gpt-5.5-pro"
    assert config.profile("claude").openai_endpoint == "auto"  # its adapter translates a chat request
    urls = [request_url(config.profile(p)) for p in ("default", "pro", "claude")]
    assert urls == ["/v1/chat/completions", "/v1/responses", "/v1/chat/completions"]


@pytest.mark.parametrize("model", ["o1-pro", "o3-pro", "gpt-5-pro", "gpt-5.2-pro", "gpt-5.4-pro", "gpt-5.5-pro"])
def test_every_responses_only_model_goes_through_the_responses_api(home: Home, model):
    home.config_file.write_text(f"model: {model}\n", encoding="utf-8")
    config, _ = load_checked(load_config(home, environ={}), today=TODAY)
    assert request_url(config.default) == "/v1/responses"


def test_chat_completions_on_a_responses_only_model_is_refused_with_the_fix(home: Home):
    [msg] = problems(home, "model: gpt-5.5-pro\nopenai_endpoint: chat_completions\n")
    assert msg.startswith("the default profile: key 'openai_endpoint' is 'chat_completions', but model 'gpt-5.5-pro'")
    assert "only supported in v1/responses" in msg and "set 'openai_endpoint' to 'auto' or 'responses'" in msg


def test_responses_on_a_model_not_known_to_be_served_there_is_refused(home: Home):
    home.pricing_file.write_text("model,input_per_1m,output_per_1m,provider\nacme-1,1,2,openai\n", encoding="utf-8")
    home.config_file.write_text("model: acme-1\nopenai_endpoint: responses\n", encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load_checked(load_config(home, environ={}), today=TODAY)
    assert "key 'openai_endpoint' is 'responses'" in str(exc.value) and "endpoint 'both'" in str(exc.value)
    home.pricing_file.write_text("model,input_per_1m,output_per_1m,provider,endpoint\nacme-1,1,2,openai,both\n")
    config, _ = load_checked(load_config(home, environ={}), today=TODAY)
    assert request_url(config.default) == "/v1/responses"


def checked_error(home: Home, text: str) -> str:
    home.config_file.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load_checked(load_config(home, environ={}), today=TODAY)
    return str(exc.value)


def test_azure_is_not_sent_through_the_responses_api(home: Home):
    base = "provider: azure\nazure_endpoint: https://x.openai.azure.com\nmodel: grader\n"
    msg = checked_error(home, base + "azure_model: gpt-5.5-pro\n")
    assert "model 'grader' would go through the Responses API" in msg and "v1 surface" in msg
    msg = checked_error(home, base + "azure_model: gpt-5.4-mini\nopenai_endpoint: responses\n")
    assert "(key 'openai_endpoint' is 'responses')" in msg
    home.config_file.write_text(base + "azure_model: gpt-5.4-mini\n", encoding="utf-8")
    config, _ = load_checked(load_config(home, environ={}), today=TODAY)  # chat completions, as before
    assert request_url(config.default) == "/chat/completions"


def test_a_setting_on_a_provider_without_openai_endpoints_is_refused(home: Home):
    [msg] = problems(home, "provider: anthropic\nmodel: claude-haiku-4-5\nopenai_endpoint: responses\n")
    assert msg.startswith("the default profile: key 'openai_endpoint' is 'responses', but provider 'anthropic'")


def test_an_output_bound_below_the_responses_minimum_is_refused(home: Home):
    [msg] = problems(home, "model: gpt-5.5-pro\nmax_completion_tokens: 15\n")
    assert "below 16, the least 'max_output_tokens'" in msg
    assert problems(home, "model: gpt-5.5-pro\nmax_completion_tokens: 16\n") == []
    assert problems(home, "model: gpt-5.4-mini\nmax_completion_tokens: 15\n") == []  # chat completions take it


def test_count_exits_78_on_chat_completions_for_a_responses_only_model(home: Home, tmp_path):
    from cli_fixtures import run

    data = tmp_path / "a.csv"
    data.write_text("id,response\n1,fine\n", encoding="utf-8")
    home.config_file.write_text("model: gpt-5.5-pro\nopenai_endpoint: chat_completions\n", encoding="utf-8")
    res = run("count", str(data))
    assert res.exit_code == 78 and "key 'openai_endpoint'" in res.output, res.output
    home.config_file.write_text("model: gpt-5.5-pro\n", encoding="utf-8")
    out = run("count", str(data), "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["input_tokens"] > 0


def test_the_responses_body_counts_the_tokens_of_the_same_messages(home: Home):
    """The Responses body carries the chat messages as ``input``: the offline count is the same."""
    from batchgrader.pipeline.requests import dumps_line
    from batchgrader.pipeline.sync_lines import input_tokens_of

    home.config_file.write_text("model: gpt-5.4-mini\nopenai_endpoint: responses\n", encoding="utf-8")
    resp = load_config(home, environ={}).default
    home.config_file.write_text("model: gpt-5.4-mini\nopenai_endpoint: chat_completions\n", encoding="utf-8")
    chat = load_config(home, environ={}).default
    msgs = [{"role": "system", "content": "Grade it."}, {"role": "user", "content": "An essay of some length, été."}]
    lines = {p.openai_endpoint: dumps_line(RequestBuilder(p, home, "0" * 64).request("c1", msgs)) for p in (resp, chat)}
    assert json.loads(lines["responses"])["body"]["input"] == msgs
    counts = {k: input_tokens_of([v], resp) for k, v in lines.items()}
    assert counts["responses"] == counts["chat_completions"] > 10


def test_the_line_template_writes_exactly_the_responses_line(home: Home):
    home.config_file.write_text("model: gpt-5.5-pro\nreasoning_effort: high\n", encoding="utf-8")
    builder = RequestBuilder(load_config(home, environ={}).default, home, "0" * 64)
    template = builder.line_template()
    assert template is not None
    from batchgrader.pipeline.requests import dumps_line

    user = 'a "quoted"\nrow'
    assert template.line("c9", user) == dumps_line(builder.request("c9", builder.spec.chat(user)))


def test_with_output_bound_raises_max_output_tokens_on_a_responses_line():
    line = b'{"custom_id":"a","method":"POST","url":"/v1/responses","body":{"model":"m","input":[],"max_output_tokens":50}}\n'
    body = json.loads(with_output_bound(line, 900))["body"]
    assert body["max_output_tokens"] == 900 and "max_completion_tokens" not in body
    chat = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[],"max_tokens":50}}\n'
    assert json.loads(with_output_bound(chat, 900))["body"] == {"model": "m", "messages": [], "max_tokens": 900}


def test_models_shows_the_endpoint_column(home: Home):
    from cli_fixtures import run

    rows = {r["model"]: r for r in json.loads(run("models", "--json").output)["models"]}
    assert rows["gpt-5.5-pro"]["endpoint"] == "responses" and rows["gpt-5.4-mini"]["endpoint"] == "both"


def test_a_responses_request_has_its_own_answer_key_computed_fast_as_slow(home: Home):
    from batchgrader.pipeline.answerkey import _Template, line_key, line_keys
    from batchgrader.pipeline.requests import dumps_line

    keys = {}
    for endpoint in ("responses", "chat_completions"):
        home.config_file.write_text(f"model: gpt-5.4-mini\nopenai_endpoint: {endpoint}\n", encoding="utf-8")
        builder = RequestBuilder(load_config(home, environ={}).default, home, "0" * 64)
        lines = [dumps_line(builder.request(f"c{i}", builder.spec.chat(f"row {i}"))) for i in range(3)]
        assert _Template.build("p", lines[0]) is not None  # the fast path serves a Responses body too
        fast = list(line_keys("p", lines))
        assert fast == [line_key("p", x) for x in lines]  # the template's keys are the canonical ones
        keys[endpoint] = fast
    assert not {k for _, k in keys["responses"]} & {k for _, k in keys["chat_completions"]}
