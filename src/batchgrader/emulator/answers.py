"""Answer generation: deterministic completions (valid JSON for structured output), exact prompt
tokens, and the output and error files of a finished batch."""

from __future__ import annotations

import json
import math
import random
import threading
import uuid
from array import array
from pathlib import Path
from typing import Any

from batchgrader.emulator.common import _hex, _now_int
from batchgrader.emulator.config import BATCH_EXPIRED_MESSAGE, REASONING_PREFIXES, THIRTY_DAYS
from batchgrader.emulator.state import _Batch, _empty_usage, _Lines, _Out, _Req, _StoreBase


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


_WORDS = (
    "the answer is clear and consistent with the rubric the text shows a careful argument with minor gaps "
    "evidence supports the main claim though one step is asserted rather than shown overall quality is good "
    "style is concise structure is logical references are adequate conclusion follows from premises"
).split()


def _sentence(rng: random.Random, lo: int = 4, hi: int = 30) -> str:
    n = rng.randint(lo, hi)
    words = [rng.choice(_WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def generate_from_schema(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A value that conforms to a (JSON Schema subset) schema: types, enum, const, required,
    anyOf/oneOf/allOf, $ref to $defs/definitions, string/array length and numeric bounds."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 12:
        return None
    if "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        if isinstance(ref, str) and ref.startswith("#"):
            for part in [p for p in ref[1:].split("/") if p]:
                target = target.get(part) if isinstance(target, dict) else None
        return generate_from_schema(target, rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return generate_from_schema(rng.choice(non_null or options), rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for sub in schema["allOf"]:
            if isinstance(sub, dict):
                for k, v in sub.items():
                    if k == "properties" and isinstance(merged.get("properties"), dict):
                        merged["properties"] = {**merged["properties"], **v}
                    elif k == "required" and isinstance(merged.get("required"), list):
                        merged["required"] = merged["required"] + list(v)
                    else:
                        merged[k] = v
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return generate_from_schema({**merged, **rest}, rng, root, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        t = non_null[0] if non_null else "null"
    if t is None:
        t = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if t == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or rng.random() < 0.5:
                out[name] = generate_from_schema(sub, rng, root, depth + 1)
        return out
    if t == "array":
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, min(lo + 2, 5))))
        n = rng.randint(lo, max(lo, hi))
        items = schema.get("items", {})
        values: list[Any] = []
        for _ in range(n * 4):
            if len(values) >= n:
                break
            v = generate_from_schema(items, rng, root, depth + 1)
            if schema.get("uniqueItems") and v in values:
                continue
            values.append(v)
        return values
    if t == "integer":
        lo = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else 0)
        hi = schema.get("maximum", schema["exclusiveMaximum"] - 1 if "exclusiveMaximum" in schema else lo + 100)
        return rng.randint(math.ceil(lo), max(math.ceil(lo), math.floor(hi)))
    if t == "number":
        flo = float(schema.get("minimum", schema.get("exclusiveMinimum", 0.0)) or 0.0)
        fhi = float(schema.get("maximum", schema.get("exclusiveMaximum", flo + 100.0)) or 0.0)
        v = round(rng.uniform(flo, fhi), 2)
        if "exclusiveMinimum" in schema and v <= flo or "exclusiveMaximum" in schema and v >= fhi:
            v = (flo + fhi) / 2
        return min(max(v, flo), fhi)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    # string
    fmt = schema.get("format")
    if fmt == "date":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    if fmt == "email":
        return f"user{rng.randint(1, 999)}@example.com"
    if fmt == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if fmt in ("uri", "url"):
        return f"https://example.com/{rng.randint(1, 999)}"
    s = _sentence(rng, 2, 12)
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")  # type: ignore[assignment]
    while len(s) < lo:
        s += " " + _sentence(rng, 2, 6)
    if hi is not None:
        s = s[: int(hi)]
    return s


_COUNTERS: dict[str, Any] = {}
_COUNTERS_LOCK = threading.Lock()


def _counter_for(model: str) -> Any:
    from batchgrader.pipeline.tokens import ChatTokenCounter

    with _COUNTERS_LOCK:
        c = _COUNTERS.get(model)
        if c is None:
            c = _COUNTERS[model] = ChatTokenCounter(model, num_threads=1)
        return c


#: Stands for ``created`` in a drafted output line (the line is made before it is dated).
_CREATED_SLOT = 8_164_093_251_076_543_219
_CREATED_KEY = f'"created": {_CREATED_SLOT}'

_Draft = tuple[str, str | None, tuple[int, int, int, int] | None]


def _encode_draft(d: _Draft | None) -> bytes:
    """A draft as one line of text (JSON text holds no raw tab or newline): ``head`` alone for a
    failed request's line, ``head TAB tail TAB tokens``, or an empty line for none."""
    if d is None:
        return b"\n"
    head, tail, tokens = d
    if tail is None:
        return head.encode() + b"\n"
    assert tokens is not None
    return f"{head}\t{tail}\t{tokens[0]},{tokens[1]},{tokens[2]},{tokens[3]}\n".encode()


def _decode_draft(raw: bytes) -> _Draft | None:
    text = raw.decode().rstrip("\n")
    if not text:
        return None
    parts = text.split("\t")
    if len(parts) == 1:
        return text, None, None
    head, tail, tok = parts
    p, c, o, r = (int(x) for x in tok.split(","))
    return head, tail, (p, c, o, r)


class _Drafts:
    """A running batch's answers drafted in the background, spooled to a file line by line in
    request order; ``ready`` lines are written out (the drafter's thread raises it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready = 0
        self._lines: _Lines | None = None

    def take(self, i: int) -> _Draft | None:
        """Draft ``i`` (below ``ready``; never one before the last taken), None if it was skipped."""
        if self._lines is None:
            self._lines = _Lines(self.path)
        return _decode_draft(self._lines.get(i))

    def discard(self) -> None:
        if self._lines is not None:
            self._lines.close()
        self.path.unlink(missing_ok=True)


#: Drafted lines written out between two raises of ``_Drafts.ready``.
DRAFT_FLUSH = 64


def _shuffled(src: Path, offsets: array[int], order: list[int], dest: Path) -> Path:
    """``src``'s lines (starting at ``offsets``) in ``order``, written to ``dest``."""
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        for k in order:
            fin.seek(offsets[k])
            fout.write(fin.readline())
    src.unlink()
    return dest


class AnswersMixin(_StoreBase):
    """The results of a batch."""

    def _draft(self, req: _Req, model: str, bid: str) -> _Draft:
        """A request's output line, undated: ``(head, tail, tokens)``; the line dated ``created`` is
        ``head + str(created) + tail`` (a failed request's line has no date: ``(line, None, None)``).
        ``tokens`` is (input, cached, output, reasoning)."""
        line_id = "batch_req_" + _hex(bid, req.custom_id, n=32)
        request_id = "req_" + _hex("req", bid, req.custom_id, n=32)
        if req.fail_status is not None:
            line = json.dumps(
                {
                    "id": line_id,
                    "custom_id": req.custom_id,
                    "response": {"status_code": req.fail_status, "request_id": request_id, "body": req.fail_body},
                    "error": None,
                }
            )
            return line, None, None
        body = self._answer(req, model, _CREATED_SLOT)
        u = body["usage"]
        tokens = (
            u["prompt_tokens"],
            u["prompt_tokens_details"]["cached_tokens"],
            u["completion_tokens"],
            u["completion_tokens_details"]["reasoning_tokens"],
        )
        line = json.dumps(
            {
                "id": line_id,
                "custom_id": req.custom_id,
                "response": {"status_code": 200, "request_id": request_id, "body": body},
                "error": None,
            }
        )
        # The first '"created": N' outside a string (a string holds no bare quote) is the body's.
        head, tail = line.split(_CREATED_KEY, 1)
        return head + '"created": ', tail, tokens

    def _start_answers(self, b: _Batch) -> None:
        """On the real clock, draft the answers of a batch that starts running in the background,
        in request order, so that the look at the batch that finds requests processed only dates
        their lines (``_answer_upto``) instead of generating them in a client's request."""
        plan = b.plan
        if not self.real_clock or self.cfg.answer_fn is not None or not plan or b.input_path is None:
            return  # a test's clock or answer function: answers are made in place, as they are due
        drafts = _Drafts(self.scratch / f"{b.obj['id']}.drafts")
        drafts.path.touch()
        b.drafts = drafts
        model = b.obj.get("model") or ""
        bid = b.obj["id"]
        source = b.input_path

        def draft_all() -> None:
            from batchgrader.emulator.validation import request_of  # (it imports this module)

            lines = _Lines(source)
            try:
                with open(drafts.path, "wb") as out:
                    for i in range(plan.n):
                        if i % 256 == 0 and (b.drafts is not drafts or b.status not in ("in_progress", "finalizing")):
                            return  # done with, cancelled or expired: the rest is not needed
                        raw = lines.get(i)
                        d = self._draft(request_of(plan, i, raw), model, bid) if i >= b.answered else None
                        out.write(_encode_draft(d))
                        if (i + 1) % DRAFT_FLUSH == 0:
                            out.flush()
                            drafts.ready = i + 1
                    out.flush()
                    drafts.ready = plan.n
            finally:
                lines.close()

        self.answerer.submit(draft_all)

    def _answer_upto(self, b: _Batch, processed: int, t: float, drafted_only: bool = False) -> None:
        """Generate the answers of the first ``processed`` requests that have none yet, as of time
        ``t`` (their ``created``), and spool them to disk (``b.out``).  Called while the batch
        runs, so that, as at a real provider, the answers exist by the time the batch ends and the
        retrieve that finds it done does not generate them all at once.  ``drafted_only`` (a look
        at a running batch): only the answers drafted in the background are dated, none is made in
        the client's request; the rest are dated by a later look, or made when the batch ends."""
        plan = self._ensure_plan(b)
        processed = min(processed, plan.n)
        drafts = b.drafts
        if drafted_only and drafts is not None:
            processed = max(b.answered, min(processed, drafts.ready))
        if processed <= b.answered:
            return
        if b.out is None:
            b.out = _Out(self.scratch, b.obj["id"])
        model = b.obj.get("model") or ""
        created = str(_now_int(t))
        bid = b.obj["id"]
        for i in range(b.answered, processed):
            # drafted in the background (real clock), or made now: the same line either way
            d = drafts.take(i) if drafts is not None and i < drafts.ready else None
            head, tail, tokens = d if d is not None else self._draft(self._request(b, i), model, bid)
            b.out.add(head if tail is None else head + created + tail, tokens)
        b.answered = processed
        if drafts is not None and processed >= plan.n:
            drafts.discard()
            b.drafts = None  # all used

    def _write_results(self, b: _Batch, processed: int, t: float, *, expired: bool) -> None:
        plan = self._ensure_plan(b)
        created = _now_int(t)
        self._answer_upto(b, processed, t)
        if b.out is None:
            b.out = _Out(self.scratch, b.obj["id"])
        out = b.out
        if expired:
            for i in range(processed, plan.n):
                req = self._request(b, i)
                line = json.dumps(
                    {
                        "id": "batch_req_" + _hex(b.obj["id"], req.custom_id, n=32),
                        "custom_id": req.custom_id,
                        "response": None,
                        "error": {"code": "batch_expired", "message": BATCH_EXPIRED_MESSAGE},
                    }
                )
                out.add(line, None)
        out.close()
        prompt, cached, completion, reasoning = out.usage
        usage = _empty_usage()
        usage["input_tokens"] = prompt
        usage["input_tokens_details"]["cached_tokens"] = cached
        usage["output_tokens"] = completion
        usage["output_tokens_details"]["reasoning_tokens"] = reasoning
        usage["total_tokens"] = prompt + completion
        rng = random.Random(f"shuffle:{self.cfg.seed}:{b.obj['id']}")
        bid = b.obj["id"]
        counts = []
        for (path, offsets), (suffix, key) in zip(
            zip(out.paths, out.offsets), (("output", "output_file_id"), ("error", "error_file_id"))
        ):
            counts.append(len(offsets))
            if not offsets:
                continue
            if self.cfg.shuffle_output:
                order = list(range(len(offsets)))
                rng.shuffle(order)
                if len(order) > 1 and all(k == i for i, k in enumerate(order)):  # never hand back input order by luck
                    order.append(order.pop(0))
                path = _shuffled(path, offsets, order, path.with_suffix(".shuffled"))
            f = self._add_file(f"{bid}_{suffix}.jsonl", path, "batch_output", created, created + THIRTY_DAYS)
            b.obj[key] = f.obj["id"]
        b.obj["request_counts"] = {"total": b.n, "completed": counts[0], "failed": counts[1]}
        b.obj["usage"] = usage
        out.discard()
        b.out = None
        if b.drafts is not None:
            b.drafts.discard()
        b.drafts = None
        if b.inputs is not None:
            b.inputs.close()
            b.inputs = None
        b.plan = None  # ended: its counts are in its object; the plan is only needed while it runs

    def _answer(self, req: _Req, model: str, created: int) -> dict[str, Any]:
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
            content = self._content(req, rng, ci)
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
                    "message": {"role": "assistant", "content": content, "refusal": None, "annotations": []},
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

    def _content(self, req: _Req, rng: random.Random, choice: int) -> str:
        if self.cfg.answer_fn is not None:
            return str(self.cfg.answer_fn(req.custom_id, req.body))
        rf = req.body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            schema = js.get("schema") if isinstance(js, dict) else None
            return json.dumps(generate_from_schema(schema or {"type": "object"}, rng), ensure_ascii=False)
        if isinstance(rf, dict) and rf.get("type") == "json_object":
            return json.dumps({"answer": _sentence(rng)})
        return _sentence(rng)
