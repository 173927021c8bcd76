"""The request key: which requests are the same question, so one answer serves them all.

A request's key is the sha256 of its canonical body: the provider it goes to, the endpoint,
and the whole request body (model, every message, and every parameter that shapes the answer:
``max_completion_tokens``/``max_tokens``, ``temperature``, ``response_format``, ...; not the
``prompt_cache_key``, which only routes the request).  The
``custom_id`` is left out, so the same question asked from another row, another file or another
job has the same key.  Canonical means JSON with sorted keys and no insignificant whitespace:
the order in which a body's fields were written does not matter, anything else does.
The samples of a row (``samples: k``) are k identical bodies: sample 2 and later mix their
sample number into the key (:func:`~batchgrader.pipeline.samples.sample_key`), so a stored
answer serves the same sample of another job and never two samples of one row.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from batchgrader.core.configuration.providers import OPENAI_DEFAULT_BASE, PROVIDER_FACTS
from batchgrader.pipeline.samples import sample_key

DEFAULT_BASE_URL = OPENAI_DEFAULT_BASE
SANDBOX_PROVIDER = "sandbox"  # the emulator's simulated answers are never reused for real jobs
KEY_VERSION = 1  # part of the hashed text: a future change of the canonical form starts afresh


#: each provider's API base when its setting is not set (what its official SDK uses; core/configuration/providers.py)
DEFAULT_API_BASE = {name: f.default_base for name, f in PROVIDER_FACTS.items() if f.default_base}
#: the profile setting that holds each provider's API base (Azure: the resource endpoint)
API_BASE_SETTING = {name: f.base_setting for name, f in PROVIDER_FACTS.items()}


def provider_id(base_url: str | None, sandbox: bool = False) -> str:
    """Who answers: ``sandbox`` for the built-in emulator, else the normalised API base URL."""
    if sandbox:
        return SANDBOX_PROVIDER
    u = urlsplit((base_url or DEFAULT_BASE_URL).strip())
    host = (u.hostname or "").lower()
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme.lower()}://{host}{port}{u.path.rstrip('/')}"


def provider_id_of(profile: Any, sandbox: bool = False) -> str:
    """Who answers a profile's requests: the one rule the daemon (storing and reusing answers)
    and ``bgctl count`` (predicting the reuse) both follow.

    Each provider's ``identity`` (:mod:`batchgrader.core.configuration.providers`) says which rule it follows:

    * ``base`` (``openai``): the normalised ``base_url`` (OpenAI's by default);
    * ``endpoint`` (``azure``): the normalised resource endpoint (``azure_endpoint``);
    * ``prefixed`` (``anthropic`` / ``gemini``): ``<provider>:`` and the normalised API base
      (``anthropic_base_url`` / ``gemini_base_url``, else the provider's own), so their answers
      are never keyed under another provider's, even behind one address (a proxy, the emulator);
    * in the sandbox: ``sandbox`` (OpenAI) or ``sandbox:<provider>``: simulated answers are never
      reused for real jobs, nor one provider's for another's.

    The OpenAI and Azure ids are the ones used before this rule, so answers stored then are still
    found."""
    provider = str(profile.get("provider") or "openai")
    facts = PROVIDER_FACTS.get(provider)
    identity = facts.identity if facts is not None else "prefixed"
    if sandbox:
        return SANDBOX_PROVIDER if identity == "base" else f"{SANDBOX_PROVIDER}:{provider}"
    base = profile.get(facts.base_setting if facts is not None else "base_url")
    if identity == "base":
        return provider_id(base)
    if identity == "endpoint":
        return provider_id(base) if base else f"{provider}:"  # no endpoint: refused before any job runs
    return f"{provider}:{provider_id(base or (facts.default_base if facts is not None else None))}"


#: body fields that route a request without shaping its answer: left out of the key, so that
#: turning ``prompt_caching`` on or off (or another file's cache key) finds the same answers
ROUTING_FIELDS = frozenset({"prompt_cache_key"})


def canonical_request(provider: str, request: dict[str, Any]) -> bytes:
    """The exact text a key is the hash of: everything in ``request`` but its ``custom_id``
    and the body's :data:`ROUTING_FIELDS`."""
    body = request.get("body")
    if isinstance(body, dict) and not ROUTING_FIELDS.isdisjoint(body):
        body = {k: v for k, v in body.items() if k not in ROUTING_FIELDS}
    doc = {
        "v": KEY_VERSION,
        "provider": provider,
        "method": request.get("method", "POST"),
        "url": request.get("url"),
        "body": body,
    }
    return json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def request_key(provider: str, request: dict[str, Any]) -> str:
    """sha256 (hex) of :func:`canonical_request`."""
    return hashlib.sha256(canonical_request(provider, request)).hexdigest()


def line_key(provider: str, line: bytes | str) -> tuple[str, str]:
    """``(custom_id, key)`` of one batch-input JSONL line (a sample's key of its own:
    :func:`~batchgrader.pipeline.samples.sample_key`)."""
    request = json.loads(line)
    cid = request["custom_id"]
    return cid, sample_key(cid, request_key(provider, request))


scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_encode_str = json.encoder.encode_basestring  # type: ignore[attr-defined]  # json.dumps(ensure_ascii=False)'s string encoder
_CID = "\x00bg-key-custom-id\x00"
_USER = "\x00bg-key-user-content\x00"


class _Template:
    """A job's request lines are one object except for the ``custom_id`` and the last message's
    ``content`` (see ``prepare.LineTemplate``).  Cut once from the first line, this gives each
    line's key from those two strings alone: the canonical text is ``pre + enc(user) + post``,
    byte for byte what :func:`canonical_request` builds, without parsing and re-serialising every
    request.  A line that does not have exactly that shape falls back to :func:`line_key`."""

    def __init__(self, head: str, mid: str, tail: str, pre: str, post: str):
        self.head, self.mid, self.tail, self.pre, self.post = head, mid, tail, pre, post
        self.pre_hash = hashlib.sha256(pre.encode("utf-8"))

    @classmethod
    def build(cls, provider: str, line: bytes | str) -> _Template | None:
        try:
            request = json.loads(line)
            field = "messages" if "messages" in request["body"] else "input"  # a chat body, or a response's
            messages = request["body"][field]
            if not isinstance(messages[-1].get("content"), str) or not isinstance(request.get("custom_id"), str):
                return None
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None
        probe = json.loads(line)
        probe["custom_id"] = _CID
        probe["body"][field][-1]["content"] = _USER
        text = json.dumps(probe, ensure_ascii=False, separators=(",", ":")) + "\n"
        canon = canonical_request(provider, probe).decode("utf-8")
        c, u = _encode_str(_CID), _encode_str(_USER)
        if text.count(c) != 1 or text.count(u) != 1 or canon.count(u) != 1 or text.index(c) > text.index(u):
            return None
        head, rest = text.split(c)
        mid, tail = rest.split(u)
        pre, post = canon.split(u)
        t = cls(head, mid, tail, pre, post)
        return t if t.key(line) == line_key(provider, line) else None

    def content_key(self, content: str) -> str:
        """The key of this job's request whose last message is ``content`` (no line needed), as
        sample 1 has it (:func:`~batchgrader.pipeline.samples.sample_key` gives another sample's)."""
        h = self.pre_hash.copy()
        h.update((_encode_str(content) + self.post).encode("utf-8"))
        return h.hexdigest()

    def key(self, line: bytes | str) -> tuple[str, str] | None:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        if not text.endswith("\n"):
            text += "\n"
        head, mid, tail = self.head, self.mid, self.tail
        if not text.startswith(head) or not text.endswith(tail):
            return None
        n = len(head)
        try:
            cid, end = scanstring(text, n + 1)
            if not text.startswith(mid, end):
                return None
            start = end + len(mid)
            user, end = scanstring(text, start + 1)
        except ValueError:
            return None
        if text[start] != '"' or text[n] != '"' or end != len(text) - len(tail):
            return None
        h = self.pre_hash.copy()  # the prefix (system prompt, examples) is hashed once per job
        h.update((_encode_str(user) + self.post).encode("utf-8"))
        return cid, sample_key(cid, h.hexdigest())


def line_keys(provider: str, lines: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """``(custom_id, key)`` of each line, as :func:`line_key` gives it, fast for a job's lines."""
    template: _Template | None = None
    tried = False
    for line in lines:
        if not tried:
            tried = True
            template = _Template.build(provider, line)
        got = template.key(line) if template is not None else None
        yield got if got is not None else line_key(provider, line)
