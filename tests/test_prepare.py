"""Request building, deterministic ids, prompts, and the `count` / `split` commands."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchgrader.cli import cli
from batchgrader.config import ConfigError, load_config
from batchgrader.prepare import default_custom_id, prepare, split_file, token_param_for
from batchgrader.pricing import load_pricing
from batchgrader.tables import InputError
from batchgrader.tokens import count_chat_tokens


def csv_file(tmp_path, text, name="data.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def lines_of(prep_path, profile, home):
    import io

    buf = io.BytesIO()
    prep = prepare(prep_path, profile, home, requests_out=buf)
    return prep, [json.loads(x) for x in buf.getvalue().splitlines()]


def test_one_request_per_row_with_exact_tokens(tmp_path, home):
    f = csv_file(tmp_path, "id,response\n1,good\n2,bad and ugly\n")
    profile = load_config(home, environ={}).default
    prep, lines = lines_of(f, profile, home)
    assert prep.rows == 2 and len(lines) == 2
    first = lines[0]
    assert first["method"] == "POST" and first["url"] == "/v1/chat/completions"
    body = first["body"]
    assert body["model"] == "gpt-4o-mini" and body["max_completion_tokens"] == 1000 and "temperature" not in body
    assert body["messages"][1] == {"role": "user", "content": "Please evaluate the following text: good"}
    assert list(prep.tokens) == [count_chat_tokens(l["body"]["messages"], "gpt-4o-mini") for l in lines]
    assert prep.sizes[0] == len((json.dumps(first, ensure_ascii=False, separators=(",", ":")) + "\n").encode())


def test_custom_ids_are_deterministic_and_never_touch_the_users_id_column(tmp_path, home):
    f = csv_file(tmp_path, "id,response\n7,a\n7,b\n")
    profile = load_config(home, environ={}).default
    a = [l["custom_id"] for l in lines_of(f, profile, home)[1]]
    b = [l["custom_id"] for l in lines_of(f, profile, home)[1]]
    assert a == b and len(set(a)) == 2
    prep = prepare(f, profile, home)
    assert a == [default_custom_id(prep.sha256, 1), default_custom_id(prep.sha256, 2)]


def test_configured_id_column_gives_ids_and_must_be_unique(tmp_path, home):
    home.config_file.write_text("id_column: id\n")
    profile = load_config(home, environ={}).default
    ok = csv_file(tmp_path, "id,response\nA-1,x\nB-2,y\n")
    assert [l["custom_id"] for l in lines_of(ok, profile, home)[1]] == ["A-1", "B-2"]
    dup = csv_file(tmp_path, "id,response\nA-1,x\nA-1,y\n", "dup.csv")
    with pytest.raises(InputError, match=r"dup.csv.*line 3.*'A-1' repeats"):
        prepare(dup, profile, home)


def test_examples_file_with_braces_and_named_prompt(tmp_path, home):
    (home.root / "examples.txt").write_text('Example: {"score": 5, "why": "clear"}\n', encoding="utf-8")
    home.prompts_file.write_text("prompts:\n  strict: 'Be strict. Examples follow.\n\n    {examples}\n\n    Answer in JSON {{like this}}.'\n")
    home.config_file.write_text("system_prompt_name: strict\nexamples_file: examples.txt\nuser_prompt: 'Product {product}: {response}'\n")
    profile = load_config(home, environ={}).default
    f = csv_file(tmp_path, "product,response\nKettle,{weird} braces {{ in data\n")
    _prep, lines = lines_of(f, profile, home)
    system, user = lines[0]["body"]["messages"]
    assert '{"score": 5, "why": "clear"}' in system["content"] and "{like this}" in system["content"]
    assert user["content"] == "Product Kettle: {weird} braces {{ in data"


def test_placeholder_for_missing_column_is_a_clear_error(tmp_path, home):
    home.config_file.write_text("user_prompt: 'Grade {answer}'\n")
    profile = load_config(home, environ={}).default
    f = csv_file(tmp_path, "response\nx\n")
    with pytest.raises(InputError, match="answer"):
        prepare(f, profile, home)


def test_missing_examples_file_and_unknown_prompt_name(home, tmp_path):
    f = csv_file(tmp_path, "response\nx\n")
    home.config_file.write_text("examples_file: nope.txt\n")
    with pytest.raises(ConfigError, match="examples_file .*nope.txt.* does not exist"):
        prepare(f, load_config(home, environ={}).default, home)
    home.config_file.write_text("system_prompt_name: ghost\n")
    with pytest.raises(ConfigError, match="system_prompt_name 'ghost' is not in"):
        prepare(f, load_config(home, environ={}).default, home)


def test_oversized_row_is_a_reported_row_error_not_a_drop(tmp_path, home):
    home.config_file.write_text("split_token_limit: 60\n")
    f = csv_file(tmp_path, "response\nshort\n" + ("word " * 200) + "\nalso short\n")
    prep = prepare(f, load_config(home, environ={}).default, home)
    assert prep.rows == 3 and prep.requests == 2
    assert [p.row for p in prep.problems] == [2]
    assert prep.problems[0].code == "request_too_large" and "split_token_limit" in prep.problems[0].message


def test_context_window_from_pricing_makes_row_oversized(tmp_path, home):
    home.config_file.write_text("model: gpt-3.5-turbo-0125\nmax_completion_tokens: 16000\n")
    f = csv_file(tmp_path, "response\n" + "hello " * 600 + "\n")
    prep = prepare(f, load_config(home, environ={}).default, home, prices=load_pricing())
    assert prep.requests == 0 and "context window" in prep.problems[0].message.lower()


def test_token_param_and_temperature_and_response_format(tmp_path, home):
    assert token_param_for("gpt-3.5-turbo") == "max_tokens" and token_param_for("gpt-4o") == "max_completion_tokens"
    home.config_file.write_text("model: gpt-3.5-turbo\ntemperature: 0\nresponse_format: {type: object, properties: {score: {type: integer}}, required: [score], additionalProperties: false}\n")
    _p, lines = lines_of(csv_file(tmp_path, "response\nx\n"), load_config(home, environ={}).default, home)
    body = lines[0]["body"]
    assert body["max_tokens"] == 1000 and "max_completion_tokens" not in body and body["temperature"] == 0.0
    assert body["response_format"]["type"] == "json_schema"


def test_unknown_model_warns(tmp_path, home):
    home.config_file.write_text("model: acme-llm-1\n")
    prep = prepare(csv_file(tmp_path, "response\nx\n"), load_config(home, environ={}).default, home)
    assert "not known to tiktoken" in prep.warnings[0]


def test_count_json_has_the_documented_keys_and_costs(tmp_path, home):
    f = csv_file(tmp_path, "response\n" + "\n".join(f"text number {i}" for i in range(10)) + "\n")
    home.config_file.write_text("split_row_limit: 4\nmax_completion_tokens: 10\n")
    res = CliRunner().invoke(cli, ["count", str(f), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    for key in ("rows", "requests", "input_tokens", "max_request_tokens", "chunks", "estimated_cost_usd"):
        assert key in data
    assert data["rows"] == data["requests"] == 10
    assert [c["requests"] for c in data["chunks"]] == [4, 4, 2]
    assert sum(c["input_tokens"] for c in data["chunks"]) == data["input_tokens"]
    est = data["estimated_cost_usd"]
    assert est["input"] == pytest.approx(data["input_tokens"] * 0.075 / 1e6)
    assert est["max_total"] == pytest.approx(est["input"] + 10 * 10 * 0.30 / 1e6)


def test_count_reports_malformed_input_with_line(tmp_path, home):
    f = csv_file(tmp_path, "a,response\n1,x\n2,y,z\n")
    res = CliRunner().invoke(cli, ["count", str(f)])
    assert res.exit_code != 0
    assert "data.csv" in str(res.exception) + res.output and "line 3" in str(res.exception) + res.output


def test_split_writes_every_request_once_in_order(tmp_path, home):
    n = 1234
    f = csv_file(tmp_path, "response\n" + "\n".join(f"row {i}" for i in range(n)) + "\n")
    home.config_file.write_text("split_row_limit: 500\n")
    out = tmp_path / "out"
    prep, files = split_file(f, load_config(home, environ={}).default, home, out)
    assert [p.name for p in files] == ["data-chunk-0001.jsonl", "data-chunk-0002.jsonl", "data-chunk-0003.jsonl"]
    ids = [json.loads(l)["custom_id"] for p in files for l in p.read_text().splitlines()]
    assert ids == [default_custom_id(prep.sha256, i) for i in range(1, n + 1)]
    assert not list(out.glob(".*"))  # no temporary files left
    assert not list(home.inbox.iterdir())  # chunk files never go into the inbox


def test_split_cli_defaults_to_work_folder(tmp_path, home):
    f = csv_file(tmp_path, "response\nx\ny\n")
    res = CliRunner().invoke(cli, ["split", str(f), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert Path(data["chunks"][0]["path"]).parent == home.work / "split" / "data"
