"""The request key and the reuse plan: pure functions, no daemon."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.core.rules.decide import reuse_allowed
from batchgrader.pipeline.answerkey import SANDBOX_PROVIDER, line_key, provider_id, provider_id_of, request_key
from batchgrader.pipeline.reuse import plan_reuse
from batchgrader.store.answers import StoredAnswer

PROVIDER = provider_id(None)

text = st.text(min_size=0, max_size=40)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": text}), min_size=1, max_size=4
)
schemas = st.none() | st.fixed_dictionaries(
    {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"name": st.sampled_from(["a", "b"])})}
)


@st.composite
def requests(draw) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["gpt-5.4-mini", "gpt-4.1-nano", "o3-mini"])),
        "messages": draw(messages),
        draw(st.sampled_from(["max_completion_tokens", "max_tokens"])): draw(st.integers(1, 5000)),
    }
    temp = draw(st.none() | st.floats(0, 2, allow_nan=False))
    if temp is not None:
        body["temperature"] = temp
    rf = draw(schemas)
    if rf is not None:
        body["response_format"] = rf
    return {"custom_id": draw(st.text(min_size=1, max_size=20)), "method": "POST", "url": "/v1/chat/completions", "body": body}


def _mutations(req: dict[str, Any]) -> dict[str, Any]:
    """Every answer-shaping field, each changed in one way (name -> changed request)."""
    b = req["body"]
    cap_field = "max_completion_tokens" if "max_completion_tokens" in b else "max_tokens"
    out: dict[str, Any] = {}

    def change(name: str, fn) -> None:  # noqa: ANN001
        r = copy.deepcopy(req)
        fn(r["body"])
        out[name] = r

    change("model", lambda x: x.update(model=x["model"] + "-2"))
    change("message content", lambda x: x["messages"][-1].update(content=x["messages"][-1]["content"] + "!"))
    change("message role", lambda x: x["messages"][0].update(role="developer"))
    change("another message", lambda x: x["messages"].append({"role": "user", "content": ""}))
    change("message order", lambda x: x["messages"].insert(0, {"role": "system", "content": "first"}))
    change(cap_field, lambda x: x.update({cap_field: x[cap_field] + 1}))
    change(
        "the limit's field name",
        lambda x: x.update({"max_tokens" if cap_field != "max_tokens" else "max_completion_tokens": x.pop(cap_field)}),
    )
    change("temperature", lambda x: x.update(temperature=(x.get("temperature") or 0) + 0.5))
    change(
        "response_format",
        lambda x: x.update(
            response_format={"type": "json_object"}
            if x.get("response_format")
            else {"type": "json_schema", "json_schema": {"name": "z"}}
        ),
    )
    change("any other parameter (seed)", lambda x: x.update(seed=7))
    r = copy.deepcopy(req)
    r["url"] = "/v1/responses"
    out["endpoint"] = r
    return out


@settings(max_examples=150, deadline=None)
@given(requests())
def test_the_key_changes_when_any_answer_shaping_field_changes(req):
    key = request_key(PROVIDER, req)
    for name, changed in _mutations(req).items():
        assert request_key(PROVIDER, changed) != key, f"changing {name} kept the key"
    assert request_key(SANDBOX_PROVIDER, req) != key  # the provider is part of the question
    assert request_key(provider_id("http://127.0.0.1:9/v1"), req) != key


@settings(max_examples=150, deadline=None)
@given(requests(), st.text(min_size=1, max_size=20), st.randoms(use_true_random=False))
def test_the_key_ignores_custom_id_and_the_order_fields_are_written_in(req, other_id, rnd):
    key = request_key(PROVIDER, req)
    assert request_key(PROVIDER, {**req, "custom_id": other_id}) == key
    items = list(req["body"].items())
    rnd.shuffle(items)
    assert request_key(PROVIDER, {**req, "body": dict(items)}) == key
    line = json.dumps({**req, "custom_id": other_id}, ensure_ascii=False).encode()
    assert line_key(PROVIDER, line) == (other_id, key)


@pytest.mark.parametrize(
    "field", ["model", "system prompt", "user message", "max_completion_tokens", "temperature", "response_format"]
)
def test_a_key_per_field(field):
    base = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-5.4-mini",
            "messages": [{"role": "system", "content": "Grade it."}, {"role": "user", "content": "essay"}],
            "max_completion_tokens": 100,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        },
    }
    changed = copy.deepcopy(base)
    b = changed["body"]
    if field == "model":
        b["model"] = "gpt-4.1-nano"
    elif field == "system prompt":
        b["messages"][0]["content"] = "Grade it strictly."
    elif field == "user message":
        b["messages"][1]["content"] = "essay."
    elif field == "max_completion_tokens":
        b["max_completion_tokens"] = 101
    elif field == "temperature":
        b["temperature"] = 0.2
    else:
        b["response_format"] = {"type": "text"}
    assert request_key(PROVIDER, changed) != request_key(PROVIDER, base)
    assert request_key(PROVIDER, {**base, "custom_id": "other"}) == request_key(PROVIDER, base)


def test_provider_id_normalises_the_base_url():
    assert provider_id(None) == provider_id("https://API.openai.com/v1/") == "https://api.openai.com/v1"
    assert provider_id("http://127.0.0.1:8765/v1") == "http://127.0.0.1:8765/v1"
    assert provider_id("https://api.openai.com/v1", sandbox=True) == SANDBOX_PROVIDER


def _profiles(tmp_path, environ: dict[str, str]) -> dict[str, Any]:
    from batchgrader.core.configuration.config import load_config
    from batchgrader.core.host.home import Home

    (tmp_path / "config.yaml").write_text(
        "profiles:\n"
        "  o:\n    provider: openai\n    model: claude-haiku-4-5\n"
        "  a:\n    provider: anthropic\n    model: claude-haiku-4-5\n"
        "  g:\n    provider: gemini\n    model: gemini-2.5-flash\n"
        "  z:\n    provider: azure\n    model: my-deployment\n    azure_model: gpt-5.4-mini\n"
    )
    cfg = load_config(Home(tmp_path), environ=environ)
    return {name: cfg.profile(name) for name in ("o", "a", "g", "z")}


def test_provider_id_of_names_who_answers_each_profile(tmp_path):
    """One rule for the daemon and `bgctl count`: each provider's own API base, never OpenAI's
    for an Anthropic or Gemini profile; the OpenAI and Azure ids are those used before."""
    p = _profiles(tmp_path, {"AZURE_OPENAI_ENDPOINT": "https://Res.openai.azure.com/"})
    assert provider_id_of(p["o"]) == provider_id(None) == "https://api.openai.com/v1"
    assert provider_id_of(p["a"]) == "anthropic:https://api.anthropic.com"
    assert provider_id_of(p["g"]) == "gemini:https://generativelanguage.googleapis.com"
    assert provider_id_of(p["z"]) == provider_id("https://res.openai.azure.com") == "https://res.openai.azure.com"
    assert [provider_id_of(x, sandbox=True) for x in p.values()] == [
        SANDBOX_PROVIDER,
        "sandbox:anthropic",
        "sandbox:gemini",
        "sandbox:azure",
    ]
    # every provider behind one address (a proxy, the emulator): still four answerers
    url = "http://127.0.0.1:8765"
    env = {
        "OPENAI_BASE_URL": url + "/v1",
        "ANTHROPIC_BASE_URL": url,
        "GOOGLE_GEMINI_BASE_URL": url + "/",
        "AZURE_OPENAI_ENDPOINT": url,
    }
    ids = {name: provider_id_of(x) for name, x in _profiles(tmp_path, env).items()}
    assert ids == {"o": url + "/v1", "a": "anthropic:" + url, "g": "gemini:" + url, "z": url}
    # the same body sent to OpenAI and to Anthropic has two keys: neither reuses the other's answer
    req = json.loads(_line("c1", "hi", model="claude-haiku-4-5"))
    assert request_key(ids["o"], req) != request_key(ids["a"], req)


# --- the plan ------------------------------------------------------------------------------------


def _line(cid: str, user: str, model: str = "gpt-5.4-mini") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": user}], "max_completion_tokens": 10}
    return (json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n").encode()


def _answer(key: str, content: str) -> StoredAnswer:
    return StoredAnswer(key, content, "stop", 11, 0, 7, 0, "job0", "old", "2026-01-01T00:00:00+00:00")


def test_identical_rows_in_a_file_are_sent_once_and_follow_the_first():
    texts = [f"text {i % 10}" for i in range(50)]
    plan = plan_reuse([_line(f"c{i}", t) for i, t in enumerate(texts)], PROVIDER, set(), lookup=None)
    assert plan.keep == list(range(10))
    assert len(plan.followers) == 40
    assert plan.followers["c37"] == "c7" and plan.cached == []


def test_stored_answers_answer_their_rows_with_the_original_tokens():
    lines = [_line(f"c{i}", f"t{i}") for i in range(5)]
    stored_key = line_key(PROVIDER, lines[2])[1]
    plan = plan_reuse(lines, PROVIDER, {4}, lambda keys: {k: _answer(k, "B") for k in keys if k == stored_key})
    assert plan.keep == [0, 1, 3]  # 4 is oversized: never sent, never reused
    (rec,) = plan.cached_records()
    assert rec["custom_id"] == "c2" and rec["content"] == "B" and rec["prompt_tokens"] == 11 and rec["completion_tokens"] == 7
    assert plan.cached_usage["prompt_tokens"] == 11


def test_row_order_does_not_change_what_is_reused():
    lines = [_line(f"c{i}", f"t{i % 4}") for i in range(12)]
    stored = {line_key(PROVIDER, lines[1])[1]}

    def lookup(keys):
        return {k: _answer(k, "x") for k in keys if k in stored}

    a = plan_reuse(lines, PROVIDER, set(), lookup)
    shuffled = lines[:]
    random.Random(4).shuffle(shuffled)
    b = plan_reuse(shuffled, PROVIDER, set(), lookup)
    assert {cid for cid, _ in a.cached} == {cid for cid, _ in b.cached} == {"c1", "c5", "c9"}
    assert len(a.keep) == len(b.keep) == 3 and len(a.followers) == len(b.followers) == 6


def test_duplicates_across_blocks_follow_the_first_row_of_the_file(monkeypatch):
    import batchgrader.pipeline.reuse as reuse_mod

    monkeypatch.setattr(reuse_mod, "BLOCK", 4)  # a leader in one block, its duplicates in later ones
    lines = [_line(f"c{i}", f"t{i % 3}") for i in range(11)]
    stored = {line_key(PROVIDER, lines[4])[1]}  # t1: every row of it is answered from the store
    plan = plan_reuse(lines, PROVIDER, {0}, lambda keys: {k: _answer(k, "x") for k in keys if k in stored})
    assert plan.keep == [2, 3]  # 0 is oversized; t0's leader is c3, t2's is c2
    assert {cid for cid, _ in plan.cached} == {"c1", "c4", "c7", "c10"}
    assert plan.followers == {"c5": "c2", "c6": "c3", "c8": "c2", "c9": "c3"}


@pytest.mark.slow
def test_planning_reuse_holds_no_key_per_row():
    """Distinct rows: what each further row adds to the peak of Python allocations stays well under
    a key per row (the seen keys are 64-bit fingerprints, confirmed against a temporary database on
    disk; a dict of the keys took about 350 bytes a row).  The growth from 12,000 to 24,000 rows is
    measured, so the fixed part (one block of lines, the table's first size) does not count."""
    import tracemalloc

    def peak(n: int) -> int:
        lines = (_line(f"row-{i:06d}", f"text number {i}") for i in range(n))
        tracemalloc.start()
        plan = plan_reuse(lines, PROVIDER, set(), lambda keys: {})
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(plan.keep) == n and not plan.followers
        return top

    small, large = peak(12_000), peak(24_000)
    assert (large - small) / 12_000 < 100, (small, large)  # the positions to send and a fingerprint


class _P:
    def __init__(self, **kw: Any):
        self.cache_days, self.reuse_answers, self.temperature = kw.get("cache_days", 30.0), kw.get("reuse"), kw.get("t")


def test_reuse_is_off_for_sampling_unless_the_profile_turns_it_on():
    assert reuse_allowed(_P())
    assert reuse_allowed(_P(t=0.0))
    assert not reuse_allowed(_P(t=0.7))
    assert reuse_allowed(_P(t=0.7, reuse=True))
    assert not reuse_allowed(_P(reuse=False))
    assert not reuse_allowed(_P(cache_days=0.0, reuse=True))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=15), st.text(max_size=60)), min_size=1, max_size=8), text)
def test_the_fast_per_job_keys_equal_the_canonical_ones(rows, system):
    from batchgrader.pipeline.answerkey import line_keys

    def line(cid: str, user: str) -> bytes:
        body = {
            "model": "gpt-5.4-mini",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_completion_tokens": 50,
        }
        req = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
        return (json.dumps(req, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")

    lines = [line(c, u) for c, u in rows]
    lines.append(_line("odd, shape", "different model", model="o3-mini"))  # not the template: the slow path
    assert list(line_keys(PROVIDER, lines)) == [line_key(PROVIDER, x) for x in lines]
