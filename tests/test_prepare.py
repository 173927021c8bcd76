"""Request building, deterministic ids, prompts, and the `count` / `split` commands."""

import io
import json
import re
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.cli.commands import cli
from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.host.home import Home
from batchgrader.pipeline import prepare as prepare_mod
from batchgrader.pipeline.prepare import prepare, split_file
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.pipeline.prompts import compile_template, render
from batchgrader.pipeline.requests import LineTemplate, RequestBuilder, default_custom_id, dumps_line, token_param_for
from batchgrader.pipeline.sync_lines import oversized_lines
from batchgrader.pipeline.tables import InputError, open_table
from batchgrader.pipeline.tokens import ChatTokenCounter


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
    assert body["model"] == "gpt-5.4-mini" and body["max_completion_tokens"] == 1000 and "temperature" not in body
    assert body["messages"][1] == {"role": "user", "content": "Please evaluate the following text: good"}
    assert list(prep.tokens) == [ChatTokenCounter("gpt-5.4-mini", num_threads=1).count(l["body"]["messages"]) for l in lines]
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
    home.prompts_file.write_text(
        "prompts:\n  strict: 'Be strict. Examples follow.\n\n    {examples}\n\n    Answer in JSON {{like this}}.'\n"
    )
    home.config_file.write_text(
        "system_prompt_name: strict\nexamples_file: examples.txt\nuser_prompt: 'Product {product}: {response}'\n"
    )
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
    home.config_file.write_text(
        "model: gpt-3.5-turbo\ntemperature: 0\nresponse_format: {type: object, properties: {score: {type: integer}}, required: [score], additionalProperties: false}\n"
    )
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
    assert est["input"] == pytest.approx(data["input_tokens"] * 0.375 / 1e6)
    assert est["max_total"] == pytest.approx(est["input"] + 10 * 10 * 2.25 / 1e6)


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
    assert [p.name for p in files] == ["data-chunk-0000.jsonl", "data-chunk-0001.jsonl", "data-chunk-0002.jsonl"]
    ids = [json.loads(l)["custom_id"] for p in files for l in p.read_text().splitlines()]
    assert ids == [default_custom_id(prep.sha256, i) for i in range(1, n + 1)]
    assert not list(out.glob(".*"))  # no temporary files left


def test_split_writes_identical_rows_once_as_count_and_the_daemon_send_them(tmp_path, home):
    """Issue 27, item 4: `split` writes what the daemon would send: 800 rows, 398 distinct."""
    from batchgrader.pipeline.reuse import preview

    texts = [f"essay {i % 398}" for i in range(800)]
    f = csv_file(tmp_path, "response\n" + "\n".join(texts) + "\n")
    home.config_file.write_text("split_row_limit: 150\n")
    profile = load_config(home, environ={}).default
    prep, files = split_file(f, profile, home, tmp_path / "out")
    written = [json.loads(l) for p in files for l in p.read_text().splitlines()]
    assert len(written) == 398 == sum(c.requests for c in prep.chunks) and prep.duplicate_rows == 402
    assert len({r["body"]["messages"][-1]["content"] for r in written}) == 398
    counted = preview(f, profile, home, prices=None, provider="openai", lookup=None)
    assert counted["requests"] == 398 and [c["requests"] for c in counted["chunks"]] == [c.requests for c in prep.chunks]
    assert [p.name for p in files] == [f"data-chunk-{c.index:04d}.jsonl" for c in prep.chunks]
    home.config_file.write_text("split_row_limit: 150\nreuse_answers: false\n")  # reuse off: every row is sent
    prep, files = split_file(f, load_config(home, environ={}).default, home, tmp_path / "out2")
    assert sum(len(p.read_text().splitlines()) for p in files) == 800 and prep.duplicate_rows == 0
    assert not list(home.inbox.iterdir())  # chunk files never go into the inbox


def test_split_cli_defaults_to_work_folder(tmp_path, home):
    f = csv_file(tmp_path, "response\nx\ny\n")
    res = CliRunner().invoke(cli, ["split", str(f), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert Path(data["chunks"][0]["path"]).parent == home.work / "split" / "data"


# --- the fast path: line template, constant token part, pipelined counting ------------------------

TRICKY = [
    "",
    "plain",
    'quo"te',
    "back\\slash",
    "new\nline\r\n",
    "tab\tctl\x00\x01\x1f\x7f",
    "\u2028\u2029",
    "héllo wörld",
    "打字手感很好",
    "emoji 🔋⚡ 👨‍👩‍👧",
    "</script>",
    "{braces} {{x}}",
    "\\u0000bg-user-content\\u0000",
    '"\x00bg-custom-id\x00"',
    "a" * 3000,
    "a special <|endoftext|> token as text",
]


def _profiles(home):
    configs = [
        "",
        "temperature: 0.2\nresponse_format: {type: object, properties: {score: {type: integer}}, required: [score], additionalProperties: false}\n",
        "model: gpt-3.5-turbo\nsystem_prompt: 'Quotes \"here\", back\\\\slash, 世界 🎉 and a sentinel-ish \\\\u0000bg-user-content'\n",
        "system_prompt: ''\nuser_prompt: 'A {response} B {response} {{literal}}'\n",
        "id_column: id\n",
    ]
    for text in configs:
        home.config_file.write_text(text, encoding="utf-8")
        yield load_config(home, environ={}).default


def test_line_template_is_byte_identical_to_json_dumps(home):
    for profile in _profiles(home):
        builder = RequestBuilder(profile, home, "ab" * 32)
        tpl = builder.line_template()
        assert tpl is not None
        for cid in ["bg-abababababababab-1", "ID 7", 'odd "id" ✓', "\x00bg-custom-id\x00"]:
            for user in TRICKY:
                real = dumps_line(builder.request(cid, builder.spec.chat(user)))
                assert tpl.line(cid, user) == real
                assert tpl.size(cid, user) == len(real)


@settings(max_examples=300, deadline=None)
@given(cid=st.text(max_size=40), user=st.text(max_size=400))
def test_line_template_size_equals_real_line_size_for_any_text(cid, user):
    home = Home.resolve("/nonexistent-bg-home")  # no config file: the default profile
    builder = RequestBuilder(load_config(home, environ={}).default, home, "0" * 64)
    tpl = builder.line_template()
    try:
        real = dumps_line(builder.request(cid, builder.spec.chat(user)))
    except UnicodeEncodeError:  # lone surrogates: both ways refuse
        with pytest.raises(UnicodeEncodeError):
            tpl.size(cid, user)
        with pytest.raises(UnicodeEncodeError):
            tpl.line(cid, user)
        return
    assert tpl.line(cid, user) == real
    assert tpl.size(cid, user) == len(real)


def test_line_template_refuses_when_a_sentinel_is_not_unique(home):
    home.config_file.write_text('system_prompt: "\\0bg-user-content\\0"\n', encoding="utf-8")
    profile = load_config(home, environ={}).default
    assert profile.system_prompt == LineTemplate._USER
    builder = RequestBuilder(profile, home, "0" * 64)
    assert builder.line_template() is None


def _reference(f, profile, home, sha):
    """Every request built and counted the slow, obvious way."""
    builder = RequestBuilder(profile, home, sha)
    out = []
    with open_table(f, required_columns=builder.required_columns()) as reader:
        for row in reader:
            cid, messages, obj = builder.line(row)
            out.append((dumps_line(obj), ChatTokenCounter(profile.model, num_threads=1).count(messages)))
    return out


@pytest.mark.parametrize("block_rows", [1, 3, 4096])
def test_pipelined_prepare_equals_the_reference_counts_and_sizes(tmp_path, home, monkeypatch, block_rows):
    monkeypatch.setattr(prepare_mod, "BLOCK_ROWS", block_rows)
    rows = [t.replace("\r", "").replace("\n", " ") for t in TRICKY] + [f"row {i} 🎉 {'x' * (i * 37 % 500)}" for i in range(40)]
    f = tmp_path / "mixed.jsonl"
    f.write_text(
        "".join(json.dumps({"id": f"r{i}", "response": t, "n": i}, ensure_ascii=False) + "\n" for i, t in enumerate(rows)),
        encoding="utf-8",
    )
    for profile in _profiles(home):
        buf = io.BytesIO()
        prep = prepare(f, profile, home, requests_out=buf)
        counted = prepare(f, profile, home)
        ref = _reference(f, profile, home, prep.sha256)
        assert buf.getvalue() == b"".join(line for line, _ in ref)
        assert list(prep.sizes) == list(counted.sizes) == [len(line) for line, _ in ref]
        assert list(prep.tokens) == list(counted.tokens) == [n for _, n in ref]
        assert prep.rows == counted.rows == len(rows)


def test_prepare_falls_back_to_building_each_request_when_no_template(tmp_path, home, monkeypatch):
    monkeypatch.setattr(RequestBuilder, "line_template", lambda self: None)
    f = csv_file(tmp_path, 'id,response\n1,"a, b"\n2,ü\n')
    profile = load_config(home, environ={}).default
    buf = io.BytesIO()
    prep = prepare(f, profile, home, requests_out=buf)
    ref = _reference(f, profile, home, prep.sha256)
    assert buf.getvalue() == b"".join(line for line, _ in ref)
    assert list(prep.sizes) == [len(line) for line, _ in ref] and list(prep.tokens) == [n for _, n in ref]


def test_lone_surrogate_from_json_input_is_refused_as_before(tmp_path, home):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"response": "fine"}\n{"response": "half a pair \\ud800 here"}\n', encoding="utf-8")
    profile = load_config(home, environ={}).default
    with pytest.raises(UnicodeEncodeError) as counting:
        prepare(f, profile, home)
    with pytest.raises(UnicodeEncodeError) as writing:
        prepare(f, profile, home, requests_out=io.BytesIO())
    assert str(counting.value) == str(writing.value)


def test_error_in_a_later_block_leaves_no_worker_threads(tmp_path, home, monkeypatch):
    monkeypatch.setattr(prepare_mod, "BLOCK_ROWS", 2)
    f = csv_file(tmp_path, "response\n" + "\n".join(f"r{i}" for i in range(7)) + "\n8,extra\n")
    with pytest.raises(InputError, match="line 9"):
        prepare(f, load_config(home, environ={}).default, home)
    assert not [t for t in threading.enumerate() if t.name.startswith("bg-tokens")]


_OLD_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


def _old_render(template, lookup):
    def sub(m):
        whole = m.group(0)
        if whole == "{{":
            return "{"
        if whole == "}}":
            return "}"
        return lookup(m.group(1))

    return _OLD_TOKEN.sub(sub, template)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="{}ab xé", max_size=30))
def test_compiled_render_equals_regex_substitution(template):
    calls_old, calls_new = [], []
    old = _old_render(template, lambda n: calls_old.append(n) or f"<{n}>")
    new = render(template, lambda n: calls_new.append(n) or f"<{n}>")
    assert new == old and calls_new == calls_old
    assert "".join(f"<{t}>" if ph else t for t, ph in compile_template(template)) == old


def test_requests_too_large_are_found_without_the_tokenizer_when_their_bytes_fit(home):
    """Issue 38: the preflight leaves out a row prepare would fail as too large without loading
    the tokenizer when every line's bytes fit the limits: a request's tokens never exceed its
    line's bytes.  Whatever the texts and limits, the rows left out are those the exact count finds."""
    from array import array

    from batchgrader.pipeline.splitting import Limits, plan_chunks

    profile = load_config(home, environ={}).default
    builder = RequestBuilder(profile, home, "0" * 64)
    counter = ChatTokenCounter(profile.model, num_threads=1)

    @settings(max_examples=60, deadline=None)
    @given(
        texts=st.lists(st.text(max_size=120), min_size=1, max_size=5),
        limit=st.integers(1, 400),
        window=st.one_of(st.none(), st.integers(1, 400)),
    )
    def check(texts: list[str], limit: int, window: int | None) -> None:
        lines = [dumps_line(builder.request(f"r{i}", builder.spec.chat(t))) for i, t in enumerate(texts)]
        tokens = counter.count_many([json.loads(line)["body"]["messages"] for line in lines])
        assert all(n <= len(line) for n, line in zip(tokens, lines))  # the bound the shortcut rests on
        limits = Limits(token_limit=limit, context_window=window, max_output_tokens=20)
        sizes = array("Q", (len(line) for line in lines))
        exact = {o.position for o in plan_chunks(array("Q", tokens), sizes, limits)[1]}
        assert oversized_lines(lines, profile, limits) == exact

    check()
