"""Answers to OpenAI chat-completions and Responses API requests: deterministic completions
(valid JSON for structured output) with exact prompt tokens and drawn reasoning tokens, a refusal
for a request carrying :data:`~batchgrader.emulator.config.REFUSE_TRIGGER`; and the message
helpers every API's answers share.  A batch's result files are :mod:`results`'."""

from __future__ import annotations

import json
import random
import threading
from typing import TYPE_CHECKING, Any

from batchgrader.emulator.common import _hex
from batchgrader.emulator.config import REASONING_PREFIXES, REFUSAL_TEXT, REFUSE_TRIGGER
from batchgrader.emulator.schema_values import generate_from_schema, sentence

if TYPE_CHECKING:
    from batchgrader.emulator.config import EmulatorConfig
    from batchgrader.emulator.state import _Req


def _is_reasoning_model(model: str) -> bool:
    return model.startswith(REASONING_PREFIXES)


def _reasoning_draw(model: str, effort: Any, rng: random.Random) -> int:
    """Reasoning tokens of one answer: from the catalogue's rules for the model (hundreds to
    thousands by effort); a reasoning model the catalogue lacks draws 16-128."""
    from batchgrader.emulator.rules import reasoning_tokens
    from batchgrader.pipeline.catalogue import shipped_spec

    spec = shipped_spec(model)
    if spec.reasoning is not None:
        return reasoning_tokens(spec, effort if isinstance(effort, str) else None, rng)
    return rng.randint(16, 128) if _is_reasoning_model(model) else 0


def _text_of_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif isinstance(p, str):
                parts.append(p)
        return "".join(parts)
    return ""


def _countable_messages(messages: Any) -> list[dict[str, str]]:
    """Messages reduced to their string fields (the project's token rules count strings only)."""
    out: list[dict[str, str]] = []
    if not isinstance(messages, list):
        return out
    for m in messages:
        if not isinstance(m, dict):
            continue
        msg: dict[str, str] = {}
        for k, v in m.items():
            if k == "content" and not isinstance(v, str):
                v = _text_of_content(v)
            if isinstance(v, str):
                msg[k] = v
        out.append(msg)
    return out


def responses_messages(body: Any) -> list[Any]:
    """A Responses API body's ``instructions`` and ``input`` as chat messages (what is counted and
    answered): a string input is one user message; input items keep their role and content."""
    if not isinstance(body, dict):
        return []
    out: list[Any] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "developer", "content": body["instructions"]})
    inp = body.get("input")
    if isinstance(inp, str):
        out.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        out += [item for item in inp if isinstance(item, dict) and "role" in item]
    return out


def chat_format(body: Any) -> Any:
    """A Responses body's ``text.format`` as the chat ``response_format`` it stands for (None without one)."""
    text = body.get("text") if isinstance(body, dict) else None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def _refuses(messages: Any) -> bool:
    return any(REFUSE_TRIGGER in m.get("content", "") for m in _countable_messages(messages) if m.get("role") == "user")


_COUNTERS: dict[str, Any] = {}
_COUNTERS_LOCK = threading.Lock()


def _counter_for(model: str) -> Any:
    from batchgrader.pipeline.tokens import ChatTokenCounter

    with _COUNTERS_LOCK:
        c = _COUNTERS.get(model)
        if c is None:
            c = _COUNTERS[model] = ChatTokenCounter(model, num_threads=1)
        return c


def chat_answer(cfg: EmulatorConfig, req: _Req, model: str, created: int) -> dict[str, Any]:
    """The chat completion answering ``req`` (deterministic: a hash of its custom_id and messages),
    dated ``created``."""
    counter = _counter_for(model)
    enc = counter.encoding
    body = req.body
    seed_material = json.dumps(body.get("messages"), sort_keys=True, ensure_ascii=False)
    n_choices: int = body["n"] if isinstance(body.get("n"), int) and body["n"] > 0 else 1
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    cap = cap if isinstance(cap, int) and cap >= 0 else None
    choices = []
    total_completion = 0
    total_reasoning = 0
    for ci in range(n_choices):
        rng = random.Random(_hex("answer", req.custom_id, seed_material, ci, n=32))
        refused = _refuses(body.get("messages"))
        content = REFUSAL_TEXT if refused else _content(cfg, req, rng, ci)
        tokens = enc.encode_ordinary(content)
        reasoning = _reasoning_draw(model, body.get("reasoning_effort"), rng)
        finish = "stop"
        if cap is not None and reasoning + len(tokens) > cap:
            finish = "length"
            reasoning = min(reasoning, cap)
            tokens = tokens[: max(0, cap - reasoning)]
            content = enc.decode(tokens)
        total_completion += reasoning + len(tokens)
        total_reasoning += reasoning
        choices.append(
            {
                "index": ci,
                "message": {
                    "role": "assistant",
                    "content": None if refused else content,
                    "refusal": content if refused else None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": finish,
            }
        )
    return {
        "id": "chatcmpl-" + _hex("chatcmpl", req.custom_id, seed_material, n=29),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": total_completion,
            "total_tokens": req.prompt_tokens + total_completion,
            "prompt_tokens_details": {"cached_tokens": req.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": total_reasoning,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_emulator",
    }


def responses_answer(cfg: EmulatorConfig, req: _Req, model: str, created: int) -> dict[str, Any]:
    """The ``response`` object answering a Responses API ``req`` (deterministic, as
    :func:`chat_answer`), dated ``created``: a reasoning item when the model reasons, then the
    assistant message (``output_text``, or a ``refusal`` part); ``status: incomplete`` with
    ``incomplete_details.reason: max_output_tokens`` when the bound cuts it."""
    enc = _counter_for(model).encoding
    body = req.body
    messages = responses_messages(body)
    seed_material = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    rng = random.Random(_hex("answer", req.custom_id, seed_material, 0, n=32))
    refused = _refuses(messages)
    content = REFUSAL_TEXT if refused else _content(cfg, req, rng, 0, chat_format(body))
    tokens = enc.encode_ordinary(content)
    reasoning_param = body.get("reasoning")
    effort = reasoning_param.get("effort") if isinstance(reasoning_param, dict) else None
    reasoning = _reasoning_draw(model, effort, rng)
    cap = body.get("max_output_tokens")
    cap = cap if isinstance(cap, int) and cap >= 0 else None
    incomplete = cap is not None and reasoning + len(tokens) > cap
    if incomplete:
        assert cap is not None
        reasoning = min(reasoning, cap)
        tokens = tokens[: max(0, cap - reasoning)]
        content = enc.decode(tokens)
    rid = _hex("resp", req.custom_id, seed_material, n=48)
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append({"id": "rs_" + rid, "type": "reasoning", "summary": []})
    if tokens or not incomplete:
        part = (
            {"type": "refusal", "refusal": content}
            if refused
            else {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
        )
        status = "incomplete" if incomplete else "completed"
        output.append({"id": "msg_" + rid, "type": "message", "status": status, "role": "assistant", "content": [part]})
    completion = reasoning + len(tokens)
    text_param = body.get("text")
    text_format = text_param.get("format") if isinstance(text_param, dict) else None
    return {
        "id": "resp_" + rid,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": effort, "summary": None},
        "service_tier": "flex" if body.get("service_tier") == "flex" else "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text_format or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": req.prompt_tokens,
            "input_tokens_details": {"cached_tokens": req.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": req.prompt_tokens + completion,
        },
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def _content(cfg: EmulatorConfig, req: _Req, rng: random.Random, choice: int, rf: Any = None) -> str:
    if cfg.answer_fn is not None:
        return str(cfg.answer_fn(req.custom_id, req.body))
    rf = rf if rf is not None else req.body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        js = rf.get("json_schema") or {}
        schema = js.get("schema") if isinstance(js, dict) else None
        return json.dumps(generate_from_schema(schema or {"type": "object"}, rng), ensure_ascii=False)
    if isinstance(rf, dict) and rf.get("type") == "json_object":
        return json.dumps({"answer": sentence(rng)})
    return sentence(rng)
