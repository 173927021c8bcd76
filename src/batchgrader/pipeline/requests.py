"""The request a row becomes: its body (:class:`RequestBuilder`), a chat completion or, for OpenAI
models served through the Responses API, a response (:func:`request_url`); the byte template that
writes every row's JSONL line without re-serialising the shared part (:class:`LineTemplate`); the
output-bound parameter a model takes; and the response schema's share of a request's tokens.
:mod:`batchgrader.pipeline.prepare` builds one per row of a file with these."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.core.host.home import Home
from batchgrader.pipeline.caching import caching_fields
from batchgrader.pipeline.catalogue import EMBEDDINGS_URL, RESPONSES_URL, shipped_spec, uses_responses
from batchgrader.pipeline.modelspec import ModelSpec
from batchgrader.pipeline.prompts import PromptSpec, resolve_prompts
from batchgrader.pipeline.tables import text_of

#: the ``endpoint`` the engine names when it creates a batch: None, which every provider reads as
#: the ``url`` its chunk's lines carry (one url per job, :func:`request_url`; an OpenAI batch must
#: name the url of its lines, so the lines are the one record of it)
ENDPOINT: str | None = None


def default_custom_id(file_hash: str, row_number: int) -> str:
    """Deterministic: the same file always yields the same ids."""
    return f"bg-{file_hash[:16]}-{row_number}"


_LEGACY_MAX_TOKENS_PREFIXES = ("gpt-3.5", "gpt-35")
_LEGACY_MAX_TOKENS_EXACT = {"gpt-4", "gpt-4-0613", "gpt-4-0314", "gpt-4-32k", "gpt-4-turbo", "gpt-4-turbo-preview"}


def token_param_for(model: str, setting: str = "auto") -> str:
    if setting != "auto":
        return setting
    if model in _LEGACY_MAX_TOKENS_EXACT or model.startswith(_LEGACY_MAX_TOKENS_PREFIXES):
        return "max_tokens"
    return "max_completion_tokens"


def request_url(profile: Profile, spec: ModelSpec | None = None) -> str:
    """The ``url`` of every request line of ``profile``'s jobs: :data:`RESPONSES_URL` when they
    go through the Responses API (:func:`uses_responses`; ``spec`` is the model's catalogue row,
    the shipped one unless given), :data:`EMBEDDINGS_URL` on an embedding model, else the
    provider's ``request_url``."""
    provider = str(profile.get("provider") or "openai")
    if spec is None:
        spec = shipped_spec(str(profile.get("azure_model") or profile.model))
    if spec.embeddings:
        return EMBEDDINGS_URL
    if uses_responses(provider, profile.get("openai_endpoint"), spec):
        return RESPONSES_URL
    return PROVIDER_FACTS[provider].request_url


def responses_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """A chat ``response_format`` as the Responses API's ``text.format``: a JSON schema's
    ``name``, ``schema`` and ``strict`` sit beside its ``type`` instead of under ``json_schema``."""
    if response_format.get("type") == "json_schema":
        return {"type": "json_schema", **(response_format.get("json_schema") or {})}
    return dict(response_format)


def request_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages of a request body as written here: a chat body's ``messages``, a Responses
    body's ``input`` (the same list of ``{role, content}`` messages)."""
    messages = body.get("messages")
    if messages is None:
        messages = body.get("input")
    return messages if isinstance(messages, list) else []


def with_output_bound(line: bytes, bound: int) -> bytes:
    """A request line with its output bound set to ``bound`` (the token parameter it carries:
    ``max_output_tokens`` on the Responses API, else ``max_completion_tokens`` when it carries
    none), for rows sent again with a raised bound."""
    obj = json.loads(line)
    body = obj["body"]
    if obj.get("url") == RESPONSES_URL or "max_output_tokens" in body:
        key = "max_output_tokens"
    elif "max_tokens" in body and "max_completion_tokens" not in body:
        key = "max_tokens"
    else:
        key = "max_completion_tokens"
    body[key] = int(bound)
    return dumps_line(obj)


def dumps_line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def schema_sha256(response_format: dict[str, Any] | None) -> str | None:
    """The identity of a JSON-schema response_format (sha256 of its canonical JSON), else None."""
    if not response_format or response_format.get("type") != "json_schema":
        return None
    canon = json.dumps(response_format, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def schema_allowance(response_format: dict[str, Any], encoding: str) -> int:
    """The stated allowance for a schema's unpublished prompt-token cost: the tokens of the
    ``json_schema`` object (name, strict flag, schema) as compact JSON, in the model's encoding."""
    from batchgrader.pipeline.tokens import get_encoding

    text = json.dumps(response_format.get("json_schema") or {}, separators=(",", ":"), ensure_ascii=False)
    return len(get_encoding(encoding).encode_ordinary(text))


def schema_info(response_format: dict[str, Any] | None, encoding: str, learned: float | None) -> dict[str, Any] | None:
    """``{sha256, allowance_tokens, per_request, source}`` for a JSON schema (None without one):
    ``source`` is ``calibrated`` when a learned overhead is known, else ``allowance``.  A learned
    overhead below 0 (the provider billed fewer prompt tokens than the offline count, which is an
    estimate for some providers) adds nothing: an estimate is never below the count, nor negative."""
    sha = schema_sha256(response_format)
    if sha is None or response_format is None:
        return None
    allowance = schema_allowance(response_format, encoding)
    return {
        "sha256": sha,
        "allowance_tokens": allowance,
        "per_request": float(allowance) if learned is None else max(0.0, float(learned)),
        "source": "allowance" if learned is None else "calibrated",
    }


class RequestBuilder:
    """Builds the batch line for each row of one file under one profile: a chat completion, or a
    response when the profile's requests go through the Responses API (:func:`request_url`)."""

    def __init__(self, profile: Profile, home: Home, file_hash: str, spec: PromptSpec | None = None):
        self.profile = profile
        self.spec = spec or resolve_prompts(profile, home)
        self.file_hash = file_hash
        self.id_column = profile.id_column
        self.url = request_url(profile)
        self.responses = self.url == RESPONSES_URL
        self.embeddings = self.url == EMBEDDINGS_URL
        # the Responses API has one output bound, whatever token_param says (it names a chat field)
        self.token_param = "max_output_tokens" if self.responses else token_param_for(profile.model, profile.token_param)
        self.caching = caching_fields(profile, self.spec.system, file_hash, shipped_spec(profile.model).min_cache_prefix)
        self.schema_column = profile.get("schema_column") or None  # each row's own schema (pipeline/rowschema.py)

    def required_columns(self) -> list[str]:
        cols = [self.profile.response_field, *self.spec.user_fields]
        if self.id_column:
            cols.append(self.id_column)
        if self.schema_column:
            cols.append(self.schema_column)
        return list(dict.fromkeys(cols))

    def custom_id(self, row) -> str:
        if self.id_column:
            return text_of(row.values[self.id_column])
        return default_custom_id(self.file_hash, row.number)

    def request(self, cid: str, messages: list[dict[str, str]], response_format: dict[str, Any] | None = None) -> dict[str, Any]:
        """The batch-input object of one request: a chat completion's body (``messages``,
        ``reasoning_effort``, ``response_format``), or a response's (the same messages as
        ``input``, ``max_output_tokens``, ``reasoning: {effort}``, ``text: {format}``), or on an
        embedding model an embedding's (the user message's text as ``input``, floats).
        ``response_format``: the row's own schema (``schema_column``), else the profile's."""
        if self.embeddings:
            text = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
            body_e = {"model": self.profile.model, "input": text, "encoding_format": "float"}
            return {"custom_id": cid, "method": "POST", "url": self.url, "body": body_e}
        effort, rf = self.profile.get("reasoning_effort"), response_format or self.profile.response_format
        body: dict[str, Any] = {
            "model": self.profile.model,
            "input" if self.responses else "messages": messages,
            self.token_param: self.profile.max_completion_tokens,
        }
        if self.profile.temperature is not None:
            body["temperature"] = self.profile.temperature
        if effort is not None:
            body.update({"reasoning": {"effort": effort}} if self.responses else {"reasoning_effort": effort})
        if rf is not None:
            body.update({"text": {"format": responses_format(rf)}} if self.responses else {"response_format": rf})
        body.update(self.caching)  # per job: the shared part stays byte-identical across rows
        return {"custom_id": cid, "method": "POST", "url": self.url, "body": body}

    def line(self, row, response_format: dict[str, Any] | None = None) -> tuple[str, list[dict[str, str]], dict[str, Any]]:
        messages = self.spec.messages(row.values, text_of)
        cid = self.custom_id(row)
        return cid, messages, self.request(cid, messages, response_format)

    def line_template(self, response_format: dict[str, Any] | None = None) -> LineTemplate | None:
        """The constant JSONL text around each row's two varying strings (None if it cannot be cut
        out), for requests carrying ``response_format`` (default: the profile's)."""
        return LineTemplate.build(self, response_format)


_encode_str = json.encoder.encode_basestring  # what json.dumps(..., ensure_ascii=False) uses for every str


class LineTemplate:
    """A request's JSONL line as constant text around the only two strings that vary per row.

    Within one job every request is the same object except for ``custom_id`` and the user
    message's ``content`` (model, system prompt, limits, response format are per job; with
    ``schema_column`` the response format is per row, and there is one template per schema), so
    ``dumps_line(builder.request(cid, builder.spec.chat(user)))`` is exactly
    ``head + enc(cid) + mid + enc(user) + tail`` where ``enc`` is the JSON string encoder
    ``json.dumps`` itself uses.  It is built by serialising one request with two sentinel
    strings and cutting at their encodings, which must each occur exactly once (an encoded
    string starts and ends with an unescaped quote, so it cannot appear inside another string).
    """

    _CID = "\x00bg-custom-id\x00"
    _USER = "\x00bg-user-content\x00"

    def __init__(self, head: str, mid: str, tail: str):
        self.head, self.mid, self.tail = head, mid, tail
        self.fixed_bytes = len((head + mid + tail).encode("utf-8"))

    @classmethod
    def build(cls, builder: RequestBuilder, response_format: dict[str, Any] | None = None) -> LineTemplate | None:
        text = dumps_line(builder.request(cls._CID, builder.spec.chat(cls._USER), response_format)).decode("utf-8")
        c, u = _encode_str(cls._CID), _encode_str(cls._USER)
        if text.count(c) != 1 or text.count(u) != 1 or text.index(c) > text.index(u):
            return None
        head, rest = text.split(c)
        mid, tail = rest.split(u)
        return cls(head, mid, tail)

    def line(self, cid: str, user: str) -> bytes:
        """``dumps_line`` of the request, without building it."""
        return (self.head + _encode_str(cid) + self.mid + _encode_str(user) + self.tail).encode("utf-8")

    def size(self, cid: str, user: str) -> int:
        """``len(self.line(cid, user))``, without serialising."""
        return self.fixed_bytes + json_str_bytes(cid) + json_str_bytes(user)


_JSON_ESCAPED = bytes(range(0x20)) + b'"\\'  # what the JSON string encoder escapes (nothing else)
_JSON_LONG_ESCAPED = bytes(c for c in range(0x20) if c not in b"\b\t\n\f\r")  # written \u00XX; the rest as \X


def json_str_bytes(s: str) -> int:
    r"""``len(_encode_str(s).encode("utf-8"))``: the UTF-8 size of ``s`` as a JSON string.

    The encoder (``ensure_ascii=False``) writes every character as itself except ``"``, ``\``
    and the control characters U+0000-U+001F: ``\b \t \n \f \r \" \\`` take two bytes,
    the other controls six (``\u00XX``).  In UTF-8 those characters are single bytes that
    occur in no other character's encoding, so they can be counted in the encoded bytes.
    """
    b = s.encode("utf-8")
    n = len(b)
    escaped = n - len(b.translate(None, _JSON_ESCAPED))
    if escaped:
        escaped += 4 * (n - len(b.translate(None, _JSON_LONG_ESCAPED)))
    return n + 2 + escaped
