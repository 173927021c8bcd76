"""A local, SIMULATED OpenAI Files + Batches API for tests, demos and the sandbox mode.

It is a real HTTP server on 127.0.0.1 that the official ``openai`` SDK talks to through
``base_url="http://127.0.0.1:PORT/v1"``.  Nothing here contacts OpenAI.

What it does (see ``/work/shared/reference/openai-batch-api-facts.md`` for the real API):

* ``/v1/files`` (upload, list, retrieve, delete, content) and ``/v1/batches`` (create, list,
  retrieve, cancel) with the real JSON objects and error bodies.
* Batches move ``validating -> in_progress -> finalizing -> completed`` on a configurable clock.
  Transitions are computed lazily, in time order across all batches, whenever state is read,
  so a test can drive an injected :class:`ManualClock` and get the same result however often
  it polls.  Also ``failed`` (validation, token limit, missing file), ``expired`` (deadline or
  forced, with partial output) and ``cancelling -> cancelled`` (partial output).
* Outputs are deterministic answers (hash of custom_id + messages), valid JSON for
  ``response_format`` json_schema/json_object, exact prompt tokens (the project's
  :class:`~batchgrader.tokens.ChatTokenCounter`), shuffled line order (seeded).
* Faults: seeded profiles (``none``, ``flaky``, ``drops``, ``slow``, ``chaos``) and precisely
  scripted faults (``Emulator.script_fault``), e.g. "create the batch, then drop the connection".
* Inspection: :meth:`Emulator.stats` in process and ``GET /_emulator/stats`` over HTTP.
* Optional persistence in ``data_dir`` so a restarted emulator keeps files and batches.

Deliberate simplifications (documented, not hidden): only ``/v1/chat/completions`` requests
are answered (other endpoints are accepted, and each request ends in the error file with a 400);
requests of a cancelled batch that were never started appear in neither file; line numbers in
validation errors are 1-based.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import math
import os
import random
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from batchgrader.fsio import atomic_write_bytes

log = logging.getLogger(__name__)

SIMULATED_BANNER = "SIMULATED — not a real OpenAI service"

VALID_ENDPOINTS = (
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
)
CHAT_ENDPOINT = "/v1/chat/completions"
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
# Batches whose input tokens count against the per-model enqueued-token limit.
ENQUEUED_STATUSES = frozenset({"in_progress", "finalizing", "cancelling"})

#: Metadata key: the batch expires after this many requests were answered (tests).
EXPIRE_AFTER_METADATA_KEY = "emulator_expire_after_requests"
#: Trigger strings: a request whose user content contains one fails with that HTTP status.
FAIL_400_TRIGGER = "__FAIL_400__"
FAIL_500_TRIGGER = "__FAIL_500__"

BATCH_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
THIRTY_DAYS = 30 * 86400
REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


class ManualClock:
    """A clock that only moves when told to. Pass it as ``EmulatorConfig(clock=...)``."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._t = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._t

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._t += seconds
            return self._t

    def set(self, t: float) -> None:
        with self._lock:
            if t < self._t:
                raise ValueError("a clock does not go backwards")
            self._t = float(t)


@dataclass(frozen=True)
class FaultRates:
    """Probabilities per API request (drawn from the seeded generator, in arrival order)."""

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    drop_before: float = 0.0  # connection closed before the call took effect
    drop_after: float = 0.0  # the call took effect, then the connection closed without a response
    slow: float = 0.0  # probability of a delayed response
    slow_delay_s: tuple[float, float] = (0.05, 0.3)
    retry_after_s: float = 1.0  # sent with 429/503 as retry-after (s) and retry-after-ms


FAULT_PROFILES: dict[str, FaultRates] = {
    "none": FaultRates(),
    "flaky": FaultRates(rate_429=0.08, rate_500=0.04, rate_503=0.04),
    "drops": FaultRates(drop_before=0.05, drop_after=0.05),
    "slow": FaultRates(slow=0.3),
    "chaos": FaultRates(rate_429=0.06, rate_500=0.03, rate_503=0.03, drop_before=0.04, drop_after=0.04, slow=0.2),
}

FAULT_KINDS = ("status", "drop_before", "drop_after", "delay", "hang_after", "truncate", "garbage")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    kind:
      ``status``      answer ``status`` with an OpenAI error body (plus retry-after headers when
                      ``retry_after`` is set) without performing the call;
      ``drop_before`` close the connection without a response, call NOT performed;
      ``drop_after``  perform the call, then close the connection without a response;
      ``delay``       wait ``seconds`` before handling the call normally;
      ``hang_after``  perform the call, then wait ``seconds`` before responding (client timeouts);
      ``truncate``    perform the call, send the headers and half of the body, then close;
      ``garbage``     perform the call, answer 200 with a body that is not JSON.
    """

    kind: str
    status: int = 500
    retry_after: float | None = None
    seconds: float = 0.0
    message: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r} (one of {', '.join(FAULT_KINDS)})")


@dataclass
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    api_key: str | None = None  # None: any non-empty bearer key is accepted
    organization: str = "org-emulator"
    validating_s: float = 0.05
    in_progress_s: float = 0.05
    finalizing_s: float = 0.05
    cancelling_s: float = 0.05
    completion_window_s: float = 86400.0  # a batch still in progress this long after creation expires
    clock: Callable[[], float] = time.time
    token_limits: Mapping[str, int] = field(default_factory=dict)  # model -> enqueued-token limit
    max_requests_per_batch: int = 50_000
    max_batch_file_bytes: int = 200 * 1024 * 1024
    request_failure_rate: float = 0.0  # seeded fraction of requests that fail with a 500
    faults: str | FaultRates = "none"
    seed: int = 0
    data_dir: str | os.PathLike[str] | None = None
    shuffle_output: bool = True
    answer_fn: Callable[[str, dict[str, Any]], str] | None = None  # custom_id, body -> content
    leak_key_in_errors: bool = False  # test only: echo the presented key verbatim in 401 bodies
    # Called in the handler thread as on_request(method, route, phase) with phase "received"
    # (before the call takes effect) and "effected" (after it took effect, before the answer is
    # sent); route is the template, e.g. "/v1/batches/{id}".  May block (crash tests kill the
    # client here).  Not called for /_emulator admin paths.
    on_request: Callable[[str, str, str], None] | None = None

    def fault_rates(self) -> FaultRates:
        if isinstance(self.faults, FaultRates):
            return self.faults
        try:
            return FAULT_PROFILES[self.faults]
        except KeyError:
            raise ValueError(f"unknown fault profile {self.faults!r} (one of {', '.join(FAULT_PROFILES)})") from None


# ----------------------------------------------------------------------------------------------
# errors and helpers
# ----------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered with the OpenAI error body."""

    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _now_int(t: float) -> int:
    return int(t)


def _hex(*parts: Any, n: int = 24) -> str:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()
    return h[:n]


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts."""
    return int(_hex(*parts, n=13), 16) / float(16**13)


def _mask_presented_key(key: str) -> str:
    if len(key) <= 8:
        return "*" * len(key)
    return f"{key[:3]}{'*' * (len(key) - 7)}{key[-4:]}"


def _is_reasoning_model(model: str) -> bool:
    return model.startswith(REASONING_PREFIXES)


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


# ----------------------------------------------------------------------------------------------
# state
# ----------------------------------------------------------------------------------------------


@dataclass
class _File:
    obj: dict[str, Any]
    seq: int
    data: bytes
    deleted: bool = False


@dataclass
class _Req:
    index: int
    custom_id: str
    body: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    fail_status: int | None = None
    fail_body: dict[str, Any] | None = None


@dataclass
class _Batch:
    obj: dict[str, Any]
    seq: int
    t_created: float
    t_deadline: float
    t_in_progress: float | None = None
    t_finalizing: float | None = None
    t_cancelling: float | None = None
    forced_expire_after: int | None = None
    stop_count: int | None = None  # requests processed when cancelled/expired
    enqueued_tokens: int = 0
    input_data: bytes | None = None
    plan: list[_Req] | None = None

    @property
    def status(self) -> str:
        return self.obj["status"]

    @property
    def n(self) -> int:
        return int(self.obj["request_counts"]["total"])

    def internal(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "t_created": self.t_created,
            "t_deadline": self.t_deadline,
            "t_in_progress": self.t_in_progress,
            "t_finalizing": self.t_finalizing,
            "t_cancelling": self.t_cancelling,
            "forced_expire_after": self.forced_expire_after,
            "stop_count": self.stop_count,
            "enqueued_tokens": self.enqueued_tokens,
        }


def _empty_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


class _Store:
    """All API state and behaviour, independent of HTTP. Every public method takes the lock."""

    def __init__(self, config: EmulatorConfig):
        self.cfg = config
        self.clock = config.clock
        self.lock = threading.RLock()
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self.seq = 0
        self.requests: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.files_created = 0
        self.batches_created = 0
        self.custom_id_seen: Counter[str] = Counter()
        self.scripted: list[dict[str, Any]] = []
        self.rates = config.fault_rates()
        self.fault_rng = random.Random(f"faults:{config.seed}")
        self.data_dir = Path(config.data_dir) if config.data_dir else None
        if self.data_dir:
            self._load()

    # --- persistence -----------------------------------------------------------------------

    def _write_atomic(self, path: Path, data: bytes) -> None:
        atomic_write_bytes(path, data)

    def _save_file(self, f: _File, with_data: bool = False) -> None:
        if not self.data_dir:
            return
        d = self.data_dir / "files"
        if with_data:
            self._write_atomic(d / f"{f.obj['id']}.data", f.data)
        meta = {"obj": f.obj, "seq": f.seq, "deleted": f.deleted}
        self._write_atomic(d / f"{f.obj['id']}.json", json.dumps(meta).encode())

    def _save_batch(self, b: _Batch) -> None:
        if not self.data_dir:
            return
        d = self.data_dir / "batches"
        inp = d / f"{b.obj['id']}.input"
        if b.input_data is not None and not inp.exists():
            src = self.data_dir / "files" / f"{b.obj['input_file_id']}.data"
            try:
                d.mkdir(parents=True, exist_ok=True)
                os.link(src, inp)
            except OSError:
                self._write_atomic(inp, b.input_data)
        meta = {"obj": b.obj, "internal": b.internal()}
        self._write_atomic(d / f"{b.obj['id']}.json", json.dumps(meta).encode())

    def _load(self) -> None:
        assert self.data_dir is not None
        fdir = self.data_dir / "files"
        bdir = self.data_dir / "batches"
        for p in sorted(fdir.glob("*.json")) if fdir.exists() else []:
            meta = json.loads(p.read_text())
            data_path = fdir / f"{meta['obj']['id']}.data"
            data = data_path.read_bytes() if data_path.exists() else b""
            f = _File(meta["obj"], meta["seq"], data, meta.get("deleted", False))
            self.files[f.obj["id"]] = f
            self.seq = max(self.seq, f.seq)
            if f.obj["purpose"] != "batch_output":
                self.files_created += 1
        for p in sorted(bdir.glob("*.json")) if bdir.exists() else []:
            meta = json.loads(p.read_text())
            i = meta["internal"]
            b = _Batch(
                meta["obj"],
                i["seq"],
                i["t_created"],
                i["t_deadline"],
                i["t_in_progress"],
                i["t_finalizing"],
                i["t_cancelling"],
                i["forced_expire_after"],
                i["stop_count"],
                i["enqueued_tokens"],
            )
            inp = bdir / f"{b.obj['id']}.input"
            if inp.exists():
                b.input_data = inp.read_bytes()
            self.batches[b.obj["id"]] = b
            self.seq = max(self.seq, b.seq)
            self.batches_created += 1

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    # --- faults ----------------------------------------------------------------------------

    def script_fault(self, method: str, path: str, fault: Fault, times: int = 1) -> None:
        with self.lock:
            self.scripted.append({"method": method.upper(), "path": path, "fault": fault, "times": times})

    def clear_faults(self) -> None:
        with self.lock:
            self.scripted.clear()

    def choose_faults(self, method: str, route: str, path: str) -> list[Fault]:
        with self.lock:
            for s in self.scripted:
                if s["method"] not in ("*", method):
                    continue
                if not (fnmatch.fnmatchcase(route, s["path"]) or fnmatch.fnmatchcase(path, s["path"])):
                    continue
                s["times"] -= 1
                if s["times"] <= 0:
                    self.scripted.remove(s)
                self.faults_injected[s["fault"].kind] += 1
                return [s["fault"]]
            r = self.rates
            if r == FaultRates():
                return []
            out: list[Fault] = []
            u_slow = self.fault_rng.random()
            delay = self.fault_rng.uniform(*r.slow_delay_s)
            u = self.fault_rng.random()
            if u_slow < r.slow:
                out.append(Fault("delay", seconds=delay))
            cum = 0.0
            for rate, fault in (
                (r.rate_429, Fault("status", status=429, retry_after=r.retry_after_s)),
                (r.rate_500, Fault("status", status=500)),
                (r.rate_503, Fault("status", status=503, retry_after=r.retry_after_s)),
                (r.drop_before, Fault("drop_before")),
                (r.drop_after, Fault("drop_after")),
            ):
                cum += rate
                if u < cum:
                    out.append(fault)
                    break
            for f in out:
                self.faults_injected[f.kind if f.kind != "status" else f"status_{f.status}"] += 1
            return out

    # --- files -----------------------------------------------------------------------------

    def create_file(self, filename: str, data: bytes, purpose: str | None, expires_after: dict[str, Any]) -> dict[str, Any]:
        if not purpose:
            raise ApiError(400, "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter")
        if purpose not in UPLOAD_PURPOSES:
            raise ApiError(
                400,
                f"Invalid value for 'purpose': expected one of {', '.join(repr(p) for p in UPLOAD_PURPOSES)}.",
                param="purpose",
                code="invalid_value",
            )
        if purpose == "batch":
            if not filename.endswith(".jsonl"):
                raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file", code=None)
            if len(data) > self.cfg.max_batch_file_bytes:
                raise ApiError(400, "File is too large.", param="file", code=None)
        with self.lock:
            now = self.clock()
            created = _now_int(now)
            seconds = expires_after.get("seconds")
            expires_at: int | None = None
            if seconds is not None:
                try:
                    seconds = int(seconds)
                except (TypeError, ValueError):
                    raise ApiError(
                        400,
                        "Invalid type for 'expires_after.seconds': expected an integer.",
                        param="expires_after.seconds",
                        code="invalid_type",
                    ) from None
                if not 3600 <= seconds <= 2592000:
                    raise ApiError(
                        400,
                        "Invalid 'expires_after.seconds': must be between 3600 and 2592000.",
                        param="expires_after.seconds",
                        code="invalid_value",
                    )
                expires_at = created + seconds
            elif purpose == "batch":
                expires_at = created + THIRTY_DAYS
            f = self._add_file(filename, data, purpose, created, expires_at)
            self.files_created += 1
            return dict(f.obj)

    def _add_file(self, filename: str, data: bytes, purpose: str, created: int, expires_at: int | None) -> _File:
        fid = "file-" + uuid.uuid4().hex[:24]
        obj = {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": created,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": expires_at,
            "status_details": None,
        }
        f = _File(obj, self._next_seq(), data)
        self.files[fid] = f
        self._save_file(f, with_data=True)
        return f

    def _get_file(self, file_id: str) -> _File:
        f = self.files.get(file_id)
        if f is None or f.deleted:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return f

    def retrieve_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            return dict(self._get_file(file_id).obj)

    def file_content(self, file_id: str) -> bytes:
        with self.lock:
            self._advance_all()
            return self._get_file(file_id).data

    def delete_file(self, file_id: str) -> dict[str, Any]:
        with self.lock:
            f = self._get_file(file_id)
            f.deleted = True
            self._save_file(f)
            if self.data_dir:
                try:
                    (self.data_dir / "files" / f"{file_id}.data").unlink()
                except FileNotFoundError:
                    pass
            f.data = b""
            return {"id": file_id, "object": "file", "deleted": True}

    def list_files(self, query: dict[str, str]) -> dict[str, Any]:
        limit = self._int_param(query, "limit", 10_000, 1, 10_000)
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, "Invalid value for 'order': expected 'asc' or 'desc'.", param="order", code="invalid_value")
        with self.lock:
            self._advance_all()
            items = [f for f in self.files.values() if not f.deleted]
            if query.get("purpose"):
                items = [f for f in items if f.obj["purpose"] == query["purpose"]]
            items.sort(key=lambda f: f.seq, reverse=(order == "desc"))
            return self._page([f.obj for f in items], query.get("after"), limit)

    # --- batches ---------------------------------------------------------------------------

    @staticmethod
    def _int_param(query: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
        raw = query.get(name)
        if raw is None or raw == "":
            return default
        try:
            v = int(raw)
        except ValueError:
            raise ApiError(400, f"Invalid type for '{name}': expected an integer.", param=name, code="invalid_type") from None
        if not lo <= v <= hi:
            raise ApiError(
                400, f"Invalid '{name}': integer must be between {lo} and {hi}.", param=name, code="integer_out_of_range"
            )
        return v

    @staticmethod
    def _page(objs: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
        start = 0
        if after:
            ids = [o["id"] for o in objs]
            start = ids.index(after) + 1 if after in ids else len(objs)
        data = [dict(o) for o in objs[start : start + limit]]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": start + limit < len(objs),
        }

    def create_batch(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "We could not parse the JSON body of your request.", code=None)
        for key in ("input_file_id", "endpoint", "completion_window"):
            if body.get(key) in (None, ""):
                raise ApiError(400, f"Missing required parameter: '{key}'.", param=key, code="missing_required_parameter")
        endpoint = body["endpoint"]
        if endpoint not in VALID_ENDPOINTS:
            raise ApiError(
                400,
                f"Invalid value for 'endpoint': expected one of {', '.join(repr(e) for e in VALID_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise ApiError(
                400, "Invalid value for 'completion_window': expected '24h'.", param="completion_window", code="invalid_value"
            )
        metadata = body.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise ApiError(
                    400,
                    f"Invalid type for 'metadata': expected an object, but got {type(metadata).__name__} instead.",
                    param="metadata",
                    code="invalid_type",
                )
            if len(metadata) > 16:
                raise ApiError(
                    400,
                    f"Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object with {len(metadata)} properties instead.",
                    param="metadata",
                    code="object_above_max_properties",
                )
            for k, v in metadata.items():
                if len(k) > 64:
                    raise ApiError(
                        400,
                        f"Invalid 'metadata': key '{k[:20]}…' is longer than 64 characters.",
                        param="metadata",
                        code="invalid_value",
                    )
                if not isinstance(v, str):
                    kind = {list: "an array", dict: "an object", int: "an integer", float: "a number", bool: "a boolean"}.get(
                        type(v), type(v).__name__
                    )
                    raise ApiError(
                        400,
                        f"Invalid type for 'metadata.{k}': expected a string, but got {kind} instead.",
                        param=f"metadata.{k}",
                        code="invalid_type",
                    )
                if len(v) > 512:
                    raise ApiError(
                        400,
                        f"Invalid 'metadata.{k}': string too long. Expected a string with maximum length 512, but got a string with length {len(v)} instead.",
                        param=f"metadata.{k}",
                        code="string_above_max_length",
                    )
        with self.lock:
            self._advance_all()
            now = self.clock()
            created = _now_int(now)
            bid = "batch_" + uuid.uuid4().hex
            obj: dict[str, Any] = {
                "id": bid,
                "object": "batch",
                "endpoint": endpoint,
                "model": None,
                "errors": None,
                "input_file_id": body["input_file_id"],
                "completion_window": "24h",
                "status": "validating",
                "output_file_id": None,
                "error_file_id": None,
                "created_at": created,
                "in_progress_at": None,
                "expires_at": created + int(math.ceil(self.cfg.completion_window_s)),
                "finalizing_at": None,
                "completed_at": None,
                "failed_at": None,
                "expired_at": None,
                "cancelling_at": None,
                "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "metadata": dict(metadata) if metadata is not None else None,
                "usage": _empty_usage(),
            }
            b = _Batch(obj, self._next_seq(), now, now + self.cfg.completion_window_s)
            if metadata and EXPIRE_AFTER_METADATA_KEY in metadata:
                try:
                    b.forced_expire_after = max(0, int(metadata[EXPIRE_AFTER_METADATA_KEY]))
                except ValueError:
                    pass
            self.batches[bid] = b
            self.batches_created += 1
            self._save_batch(b)
            return json.loads(json.dumps(obj))

    def _get_batch(self, batch_id: str) -> _Batch:
        b = self.batches.get(batch_id)
        if b is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param=None)
        return b

    def retrieve_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            b = self._get_batch(batch_id)
            return self._view(b)

    def list_batches(self, query: dict[str, str]) -> dict[str, Any]:
        limit = self._int_param(query, "limit", 20, 1, 100)
        with self.lock:
            self._advance_all()
            items = sorted(self.batches.values(), key=lambda b: b.seq, reverse=True)
            return self._page([self._view(b) for b in items], query.get("after"), limit)

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            b = self._get_batch(batch_id)
            now = self.clock()
            s = b.status
            if s in ("completed", "failed", "expired"):
                raise ApiError(409, f"Cannot cancel a batch with status '{s}'.", param=None)
            if s in ("cancelling", "cancelled"):
                return self._view(b)
            if s == "validating":
                b.stop_count = 0
            elif s == "in_progress":
                b.stop_count = self._processed(b, now)
            else:  # finalizing: all requests ran
                b.stop_count = b.n
            ok, bad = self._split_counts(b, b.stop_count)
            b.obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
            b.t_cancelling = now
            b.obj["status"] = "cancelling"
            b.obj["cancelling_at"] = _now_int(now)
            self._save_batch(b)
            return self._view(b)

    def expire_batch(self, batch_id: str, completed: int | None = None) -> dict[str, Any]:
        """Force an in-progress batch to expire now; ``completed`` requests (default: as many as
        the clock says were processed) get answers, the rest ``batch_expired`` errors."""
        with self.lock:
            self._advance_all()
            b = self._get_batch(batch_id)
            now = self.clock()
            if b.status == "validating":
                self._apply(b, "validate", now)
            if b.status != "in_progress":
                raise ApiError(409, f"Cannot expire a batch with status '{b.status}'.", param=None)
            count = self._processed(b, now) if completed is None else max(0, min(int(completed), b.n))
            b.stop_count = count
            self._apply(b, "expire", now)
            return self._view(b)

    # --- lifecycle -------------------------------------------------------------------------

    def _view(self, b: _Batch) -> dict[str, Any]:
        obj = json.loads(json.dumps(b.obj))
        if b.status == "in_progress":
            done = self._processed(b, self.clock())
            ok, bad = self._split_counts(b, done)
            obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
        return obj

    def _split_counts(self, b: _Batch, done: int) -> tuple[int, int]:
        plan = self._ensure_plan(b)
        bad = sum(1 for r in plan[:done] if r.fail_status is not None)
        return done - bad, bad

    def _processed(self, b: _Batch, t: float) -> int:
        if b.t_in_progress is None:
            return 0
        n = b.n
        if self.cfg.in_progress_s <= 0:
            done = n
        else:
            done = min(n, max(0, int(n * (t - b.t_in_progress) / self.cfg.in_progress_s + 1e-6)))  # epsilon: float clocks
        if b.forced_expire_after is not None:
            done = min(done, b.forced_expire_after)
        return done

    def _next_event(self, b: _Batch) -> tuple[float, int, str] | None:
        s = b.status
        cfg = self.cfg
        if s == "validating":
            return (b.t_created + cfg.validating_s, 1, "validate")
        if s == "in_progress":
            assert b.t_in_progress is not None
            t_fin = b.t_in_progress + cfg.in_progress_s
            cands = [(t_fin, 2, "finalize")]
            k = b.forced_expire_after
            if k is not None and k < b.n:
                t_k = b.t_in_progress + (cfg.in_progress_s * k / b.n if b.n else 0.0)
                cands.append((t_k, 0, "expire"))
            if b.t_deadline < t_fin:
                cands.append((max(b.t_deadline, b.t_in_progress), 0, "expire"))
            return min(cands)
        if s == "finalizing":
            assert b.t_finalizing is not None
            return (b.t_finalizing + cfg.finalizing_s, 1, "complete")
        if s == "cancelling":
            assert b.t_cancelling is not None
            return (b.t_cancelling + cfg.cancelling_s, 1, "cancelled")
        return None

    def _advance_all(self) -> None:
        now = self.clock()
        while True:
            best: tuple[float, int, int, str, _Batch] | None = None
            for b in self.batches.values():
                if b.status in TERMINAL_STATUSES:
                    continue
                ev = self._next_event(b)
                if ev is None or ev[0] > now:
                    continue
                key = (ev[0], ev[1], b.seq, ev[2], b)
                if best is None or key[:3] < best[:3]:
                    best = key
            if best is None:
                return
            self._apply(best[4], best[3], best[0])

    def _apply(self, b: _Batch, event: str, t: float) -> None:
        ts = _now_int(t)
        obj = b.obj
        if event == "validate":
            errors = self._validate(b)
            if errors:
                obj["status"] = "failed"
                obj["failed_at"] = ts
                obj["errors"] = {"object": "list", "data": errors}
            else:
                obj["status"] = "in_progress"
                obj["in_progress_at"] = ts
                b.t_in_progress = t
        elif event == "finalize":
            obj["status"] = "finalizing"
            obj["finalizing_at"] = ts
            b.t_finalizing = t
            ok, bad = self._split_counts(b, b.n)
            obj["request_counts"] = {"total": b.n, "completed": ok, "failed": bad}
        elif event == "complete":
            self._write_results(b, b.n, t, expired=False)
            obj["status"] = "completed"
            obj["completed_at"] = ts
        elif event == "expire":
            if b.stop_count is None:
                b.stop_count = (
                    b.forced_expire_after if (b.forced_expire_after is not None and t < b.t_deadline) else self._processed(b, t)
                )
            self._write_results(b, b.stop_count, t, expired=True)
            obj["status"] = "expired"
            obj["expired_at"] = ts
        elif event == "cancelled":
            self._write_results(b, b.stop_count or 0, t, expired=False)
            obj["status"] = "cancelled"
            obj["cancelled_at"] = ts
        else:  # pragma: no cover
            raise AssertionError(event)
        self._save_batch(b)

    # --- validation ------------------------------------------------------------------------

    def _validate(self, b: _Batch) -> list[dict[str, Any]]:
        obj = b.obj
        fid = obj["input_file_id"]
        f = self.files.get(fid)
        if f is None or f.deleted:
            return [
                {
                    "code": "invalid_request",
                    "message": f"Cannot find file {fid}, or organization {self.cfg.organization} does not have access to it.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        if f.obj["purpose"] != "batch":
            return [
                {
                    "code": "invalid_request",
                    "message": f"File {fid} has purpose '{f.obj['purpose']}', but the Batch API requires purpose 'batch'.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        data = f.data
        errors: list[dict[str, Any]] = []

        def err(code: str, message: str, param: str | None, line: int | None) -> None:
            if len(errors) < 1000:
                errors.append({"code": code, "message": message, "param": param, "line": line})

        raw_lines = data.split(b"\n")
        while raw_lines and not raw_lines[-1].strip():
            raw_lines.pop()
        if not raw_lines:
            err("empty_file", "The batch input file is empty.", None, None)
            return errors
        if len(raw_lines) > self.cfg.max_requests_per_batch:
            err(
                "too_many_tasks",
                f"The batch input file has {len(raw_lines):,} requests, but a batch can hold at most {self.cfg.max_requests_per_batch:,}.",
                None,
                None,
            )
            return errors
        endpoint = obj["endpoint"]
        model: str | None = None
        seen: set[str] = set()
        parsed: list[tuple[str, dict[str, Any]]] = []
        for lineno, raw in enumerate(raw_lines, start=1):
            try:
                item = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                err("invalid_json_line", "This line is not parseable as valid JSON.", None, lineno)
                continue
            if not isinstance(item, dict):
                err("invalid_json_line", "This line is not parseable as valid JSON.", None, lineno)
                continue
            missing = [k for k in ("custom_id", "method", "url", "body") if item.get(k) is None]
            if missing:
                err("missing_required_parameter", f"Missing required parameter: '{missing[0]}'.", missing[0], lineno)
                continue
            cid = item["custom_id"]
            if not isinstance(cid, str) or not cid:
                err("invalid_request", "Invalid type for 'custom_id': expected a non-empty string.", "custom_id", lineno)
                continue
            if cid in seen:
                err(
                    "duplicate_custom_id",
                    f"The custom_id '{cid}' for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.",
                    "custom_id",
                    lineno,
                )
                continue
            seen.add(cid)
            if not isinstance(item["method"], str) or item["method"].upper() != "POST":
                err("invalid_request", "Invalid value for 'method': only 'POST' is supported.", "method", lineno)
                continue
            if item["url"] != endpoint:
                err("invalid_url", "The URL provided for this request does not match the batch endpoint.", "url", lineno)
                continue
            body = item["body"]
            if not isinstance(body, dict):
                err("invalid_request", "Invalid type for 'body': expected an object.", "body", lineno)
                continue
            if body.get("stream") is True:
                name = "Chat Completions" if endpoint == CHAT_ENDPOINT else endpoint
                err("streaming_unsupported", f"{name}: Streaming is not supported in the Batch API.", "body.stream", lineno)
                continue
            m = body.get("model")
            if not isinstance(m, str) or not m:
                err("invalid_request", "Model parameter is required.", "body.model", lineno)
                continue
            if model is None:
                model = m
            elif m != model:
                err(
                    "mismatched_model",
                    f"The model '{m}' for this request does not match the rest of the batch. Each batch must contain requests for a single model.",
                    "body.model",
                    lineno,
                )
                continue
            if endpoint == CHAT_ENDPOINT and not isinstance(body.get("messages"), list):
                err("invalid_request", "Messages parameter is required.", "body.messages", lineno)
                continue
            parsed.append((cid, body))
        if model is not None:
            obj["model"] = model
        if errors:
            return errors
        assert model is not None
        plan = self._make_plan(b, parsed, model)
        tokens = sum(r.prompt_tokens for r in plan)
        limit = self.cfg.token_limits.get(model)
        if limit is not None:
            enqueued = sum(
                o.enqueued_tokens
                for o in self.batches.values()
                if o is not b and o.status in ENQUEUED_STATUSES and o.obj.get("model") == model
            )
            if enqueued + tokens > limit:
                return [
                    {
                        "code": "token_limit_exceeded",
                        "message": f"Enqueued token limit reached for {model} in organization {self.cfg.organization}. Limit: {limit:,} enqueued tokens. Please try again once some in_progress batches have been completed.",
                        "param": None,
                        "line": None,
                    }
                ]
        for cid, _ in parsed:
            self.custom_id_seen[cid] += 1
        b.plan = plan
        b.input_data = data  # the batch keeps its input even if the file is deleted later
        b.enqueued_tokens = tokens
        obj["request_counts"] = {"total": len(plan), "completed": 0, "failed": 0}
        return []

    def _make_plan(
        self, b: _Batch, parsed: list[tuple[str, dict[str, Any]]], model: str, attempt: dict[str, int] | None = None
    ) -> list[_Req]:
        counter = _counter_for(model)
        endpoint = b.obj["endpoint"]
        messages = [_countable_messages(body.get("messages")) for _, body in parsed]
        if endpoint == CHAT_ENDPOINT:
            prompt = counter.count_many(messages)
        else:
            prompt = [0] * len(parsed)
        first_seen: set[str] = set()
        plan: list[_Req] = []
        for i, ((cid, body), msgs, pt) in enumerate(zip(parsed, messages, prompt)):
            cached = 0
            if msgs and pt >= 1024:
                first = json.dumps(msgs[0], sort_keys=True)
                if first in first_seen:
                    prefix = counter.count([msgs[0]]) - 3
                    cached = min(pt, prefix) // 128 * 128
                    cached = cached if cached >= 1024 else 0
                first_seen.add(first)
            req = _Req(i, cid, body, pt, cached)
            user_text = " ".join(m.get("content", "") for m in msgs)
            occurrence = attempt.get(cid, 0) if attempt is not None else self.custom_id_seen.get(cid, 0)
            if FAIL_400_TRIGGER in user_text:
                req.fail_status, req.fail_body = (
                    400,
                    _error_body(
                        "Invalid request (emulated failure triggered by __FAIL_400__).",
                        "invalid_request_error",
                        None,
                        "invalid_value",
                    ),
                )
            elif FAIL_500_TRIGGER in user_text:
                req.fail_status, req.fail_body = 500, _server_error_body()
            elif endpoint != CHAT_ENDPOINT:
                req.fail_status, req.fail_body = (
                    400,
                    _error_body(
                        f"The emulator does not implement {endpoint}; only {CHAT_ENDPOINT} requests are answered.",
                        "invalid_request_error",
                        "url",
                        "unsupported_endpoint",
                    ),
                )
            elif _is_reasoning_model(model) and "max_tokens" in body:
                req.fail_status, req.fail_body = (
                    400,
                    _error_body(
                        "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                        "invalid_request_error",
                        "max_tokens",
                        "unsupported_parameter",
                    ),
                )
            elif (
                self.cfg.request_failure_rate > 0
                and _unit("fail", self.cfg.seed, cid, occurrence) < self.cfg.request_failure_rate
            ):
                req.fail_status, req.fail_body = 500, _server_error_body()
            plan.append(req)
        return plan

    def _ensure_plan(self, b: _Batch) -> list[_Req]:
        if b.plan is not None:
            return b.plan
        if b.n == 0 or b.input_data is None:
            b.plan = []
            return b.plan
        # Rebuild after a restart: same parse, same deterministic outcomes.
        parsed = []
        for raw in b.input_data.split(b"\n"):
            if raw.strip():
                item = json.loads(raw)
                parsed.append((item["custom_id"], item["body"]))
        occurrence = {cid: max(0, self.custom_id_seen.get(cid, 1) - 1) for cid, _ in parsed}
        b.plan = self._make_plan(b, parsed, b.obj["model"], attempt=occurrence)
        return b.plan

    # --- results ---------------------------------------------------------------------------

    def _write_results(self, b: _Batch, processed: int, t: float, *, expired: bool) -> None:
        plan = self._ensure_plan(b)
        model = b.obj.get("model") or ""
        created = _now_int(t)
        ok_lines: list[str] = []
        err_lines: list[str] = []
        usage = _empty_usage()
        for req in plan[:processed]:
            line_id = "batch_req_" + _hex(b.obj["id"], req.custom_id, n=32)
            request_id = "req_" + _hex("req", b.obj["id"], req.custom_id, n=32)
            if req.fail_status is not None:
                err_lines.append(
                    json.dumps(
                        {
                            "id": line_id,
                            "custom_id": req.custom_id,
                            "response": {"status_code": req.fail_status, "request_id": request_id, "body": req.fail_body},
                            "error": None,
                        }
                    )
                )
                continue
            body = self._answer(req, model, created)
            u = body["usage"]
            usage["input_tokens"] += u["prompt_tokens"]
            usage["input_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
            usage["output_tokens"] += u["completion_tokens"]
            usage["output_tokens_details"]["reasoning_tokens"] += u["completion_tokens_details"]["reasoning_tokens"]
            ok_lines.append(
                json.dumps(
                    {
                        "id": line_id,
                        "custom_id": req.custom_id,
                        "response": {"status_code": 200, "request_id": request_id, "body": body},
                        "error": None,
                    }
                )
            )
        if expired:
            for req in plan[processed:]:
                err_lines.append(
                    json.dumps(
                        {
                            "id": "batch_req_" + _hex(b.obj["id"], req.custom_id, n=32),
                            "custom_id": req.custom_id,
                            "response": None,
                            "error": {"code": "batch_expired", "message": BATCH_EXPIRED_MESSAGE},
                        }
                    )
                )
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        if self.cfg.shuffle_output:
            rng = random.Random(f"shuffle:{self.cfg.seed}:{b.obj['id']}")
            for lines in (ok_lines, err_lines):
                before = list(lines)
                rng.shuffle(lines)
                if len(lines) > 1 and lines == before:  # never hand back input order by luck
                    lines.append(lines.pop(0))
        bid = b.obj["id"]
        if ok_lines:
            f = self._add_file(
                f"{bid}_output.jsonl", ("\n".join(ok_lines) + "\n").encode(), "batch_output", created, created + THIRTY_DAYS
            )
            b.obj["output_file_id"] = f.obj["id"]
        if err_lines:
            f = self._add_file(
                f"{bid}_error.jsonl", ("\n".join(err_lines) + "\n").encode(), "batch_output", created, created + THIRTY_DAYS
            )
            b.obj["error_file_id"] = f.obj["id"]
        b.obj["request_counts"] = {"total": b.n, "completed": len(ok_lines), "failed": len(err_lines)}
        b.obj["usage"] = usage

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
            reasoning = rng.randint(16, 128) if _is_reasoning_model(model) else 0
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

    # --- inspection ------------------------------------------------------------------------

    def count_request(self, method: str, route: str) -> None:
        with self.lock:
            self.requests[f"{method} {route}"] += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            batches = sorted(self.batches.values(), key=lambda b: b.seq)
            return {
                "simulated": True,
                "requests": dict(self.requests),
                "faults_injected": dict(self.faults_injected),
                "files_created": self.files_created,
                "batches_created": self.batches_created,
                "batches": [
                    {
                        "id": b.obj["id"],
                        "status": b.status,
                        "input_file_id": b.obj["input_file_id"],
                        "metadata": b.obj["metadata"],
                        "created_at": b.obj["created_at"],
                        "model": b.obj["model"],
                        "request_counts": self._view(b)["request_counts"],
                    }
                    for b in batches
                ],
                "files": [
                    {
                        "id": f.obj["id"],
                        "filename": f.obj["filename"],
                        "bytes": f.obj["bytes"],
                        "purpose": f.obj["purpose"],
                        "deleted": f.deleted,
                    }
                    for f in sorted(self.files.values(), key=lambda f: f.seq)
                ],
                "scripted_faults_pending": len(self.scripted),
            }


def _error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _server_error_body() -> dict[str, Any]:
    return _error_body("The server had an error while processing your request. Sorry about that!", "server_error", None, None)


_COUNTERS: dict[str, Any] = {}
_COUNTERS_LOCK = threading.Lock()


def _counter_for(model: str) -> Any:
    from batchgrader.pipeline.tokens import ChatTokenCounter

    with _COUNTERS_LOCK:
        c = _COUNTERS.get(model)
        if c is None:
            c = _COUNTERS[model] = ChatTokenCounter(model, num_threads=1)
        return c


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------

_ROUTES: list[tuple[str, re.Pattern[str], str, str]] = [
    ("POST", re.compile(r"^/v1/files$"), "/v1/files", "create_file"),
    ("GET", re.compile(r"^/v1/files$"), "/v1/files", "list_files"),
    ("GET", re.compile(r"^/v1/files/(?P<id>[^/]+)$"), "/v1/files/{id}", "retrieve_file"),
    ("DELETE", re.compile(r"^/v1/files/(?P<id>[^/]+)$"), "/v1/files/{id}", "delete_file"),
    ("GET", re.compile(r"^/v1/files/(?P<id>[^/]+)/content$"), "/v1/files/{id}/content", "file_content"),
    ("POST", re.compile(r"^/v1/batches$"), "/v1/batches", "create_batch"),
    ("GET", re.compile(r"^/v1/batches$"), "/v1/batches", "list_batches"),
    ("GET", re.compile(r"^/v1/batches/(?P<id>[^/]+)$"), "/v1/batches/{id}", "retrieve_batch"),
    ("POST", re.compile(r"^/v1/batches/(?P<id>[^/]+)/cancel$"), "/v1/batches/{id}/cancel", "cancel_batch"),
]


def _parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise ApiError(400, "Could not parse multipart form: missing boundary.")
    boundary = m.group(1).encode("latin-1")
    out: dict[str, tuple[str | None, bytes]] = {}
    delim = b"--" + boundary
    for part in body.split(delim)[1:]:
        if part.startswith(b"--"):
            break
        if part.startswith(b"\r\n"):
            part = part[2:]
        head, sep, content = part.partition(b"\r\n\r\n")
        if not sep:
            continue
        if content.endswith(b"\r\n"):
            content = content[:-2]
        disp = ""
        for line in head.decode("utf-8", "replace").split("\r\n"):
            if line.lower().startswith("content-disposition:"):
                disp = line
        nm = re.search(r'\bname="([^"]*)"', disp)
        fn = re.search(r'\bfilename="([^"]*)"', disp) or re.search(r"\bfilename\*=(?:UTF-8'')?([^;]+)", disp)
        if nm:
            out[nm.group(1)] = (unquote(fn.group(1)) if fn else None, content)
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "BatchgraderEmulator/1.0"
    timeout = 60
    emulator: Emulator  # set on the subclass made per server

    # --- plumbing --------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("emulator: " + format, *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _headers_common(self, request_id: str) -> None:
        self.send_header("x-request-id", request_id)
        self.send_header("openai-organization", self.emulator.config.organization)
        self.send_header("openai-processing-ms", "1")
        self.send_header("x-emulator", "simulated")
        self.send_header("Connection", "close")

    def _send_bytes(
        self, status: int, data: bytes, content_type: str, extra: Mapping[str, str] | None = None, *, truncate: bool = False
    ) -> None:
        request_id = "req_" + uuid.uuid4().hex
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self._headers_common(request_id)
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if truncate:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._drop()
                return
            view = memoryview(data)
            for i in range(0, len(data), 1 << 16):
                self.wfile.write(view[i : i + (1 << 16)])
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def _send_json(self, status: int, obj: Any, extra: Mapping[str, str] | None = None, *, truncate: bool = False) -> None:
        self._send_bytes(status, json.dumps(obj).encode("utf-8"), "application/json", extra, truncate=truncate)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # --- dispatch --------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        emu = self.emulator
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self.close_connection = True
            return
        if path.startswith("/_emulator"):
            self._admin(method, path, query, body)
            return
        route = None
        params: dict[str, str] = {}
        action = None
        for m, rx, template, name in _ROUTES:
            mt = rx.match(path)
            if mt and m == method:
                route, params, action = template, mt.groupdict(), name
                break
        store = emu.store
        store.count_request(method, route or path)
        self._hook(method, route or path, "received")
        faults = store.choose_faults(method, route or path, path)
        after: Fault | None = None
        for fault in faults:
            if fault.kind == "delay":
                emu._stopping.wait(fault.seconds)
            elif fault.kind == "drop_before":
                self._drop()
                return
            elif fault.kind == "status":
                extra = {}
                if fault.retry_after is not None:
                    extra["retry-after"] = str(max(0, math.ceil(fault.retry_after)))
                    extra["retry-after-ms"] = str(int(fault.retry_after * 1000))
                msg = fault.message or {
                    429: "Rate limit reached for requests (emulated). Please try again later.",
                    503: "The engine is currently overloaded, please try again later.",
                }.get(fault.status, "The server had an error while processing your request. Sorry about that!")
                etype = {429: "requests", 503: "server_error"}.get(
                    fault.status, "server_error" if fault.status >= 500 else "invalid_request_error"
                )
                code = {429: "rate_limit_exceeded"}.get(fault.status)
                self._send_json(fault.status, _error_body(msg, etype, None, code), extra)
                return
            else:
                after = fault
        try:
            self._check_auth()
            if action is None:
                raise ApiError(404, f"Invalid URL ({method} {path})")
            result = self._call(action, params, query, body)
        except ApiError as e:
            result = (e.status, e.body())
        except Exception:  # pragma: no cover - a bug in the emulator; still answer like the API
            log.exception("emulator: unhandled error for %s %s", method, path)
            result = (500, _server_error_body())
        self._hook(method, route or path, "effected")
        if after is not None:
            if after.kind == "drop_after":
                self._drop()
                return
            if after.kind == "hang_after":
                emu._stopping.wait(after.seconds)
            if after.kind == "garbage":
                self._send_bytes(200, b'{"id": "trunc', "application/json")
                return
        status, payload = result
        truncate = after is not None and after.kind == "truncate"
        if isinstance(payload, bytes):
            self._send_bytes(status, payload, "application/octet-stream", truncate=truncate)
        else:
            self._send_json(status, payload, truncate=truncate)

    def _hook(self, method: str, route: str, phase: str) -> None:
        hook = self.emulator.config.on_request
        if hook is None:
            return
        try:
            hook(method, route, phase)
        except Exception:  # a test hook must not take the server down
            log.exception("emulator: on_request hook failed")

    def _check_auth(self) -> None:
        auth = self.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not key:
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        expected = self.emulator.config.api_key
        if expected is not None and key != expected:
            shown = key if self.emulator.config.leak_key_in_errors else _mask_presented_key(key)
            raise ApiError(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )

    def _call(self, action: str, params: dict[str, str], query: dict[str, str], body: bytes) -> tuple[int, Any]:
        store = self.emulator.store
        if action == "create_file":
            ctype = self.headers.get("Content-Type", "")
            if "multipart/form-data" not in ctype:
                raise ApiError(400, "Expected a multipart/form-data request body.")
            form = _parse_multipart(body, ctype)
            if "file" not in form:
                raise ApiError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
            filename, data = form["file"]
            purpose = form.get("purpose", (None, b""))[1].decode("utf-8", "replace") or None
            expires_after = {}
            for k in ("anchor", "seconds"):
                if f"expires_after[{k}]" in form:
                    expires_after[k] = form[f"expires_after[{k}]"][1].decode()
            return 200, store.create_file(filename or "upload", data, purpose, expires_after)
        if action == "list_files":
            return 200, store.list_files(query)
        if action == "retrieve_file":
            return 200, store.retrieve_file(params["id"])
        if action == "delete_file":
            return 200, store.delete_file(params["id"])
        if action == "file_content":
            return 200, store.file_content(params["id"])
        if action == "create_batch":
            try:
                parsed = json.loads(body or b"null")
            except ValueError:
                raise ApiError(
                    400,
                    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)",
                ) from None
            return 200, store.create_batch(parsed)
        if action == "list_batches":
            return 200, store.list_batches(query)
        if action == "retrieve_batch":
            return 200, store.retrieve_batch(params["id"])
        if action == "cancel_batch":
            return 200, store.cancel_batch(params["id"])
        raise ApiError(404, f"Invalid URL ({action})")  # pragma: no cover

    def _admin(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        store = self.emulator.store
        try:
            payload = json.loads(body) if body else {}
            if method == "GET" and path == "/_emulator/stats":
                self._send_json(200, store.stats())
            elif method == "POST" and path == "/_emulator/faults":
                items = payload if isinstance(payload, list) else [payload]
                for item in items:
                    fault = Fault(
                        kind=item["kind"],
                        status=int(item.get("status", 500)),
                        retry_after=item.get("retry_after"),
                        seconds=float(item.get("seconds", 0.0)),
                        message=item.get("message"),
                    )
                    store.script_fault(item.get("method", "*"), item.get("path", "*"), fault, int(item.get("times", 1)))
                self._send_json(200, {"scripted": len(items)})
            elif method == "DELETE" and path == "/_emulator/faults":
                store.clear_faults()
                self._send_json(200, {"cleared": True})
            elif method == "POST" and (mt := re.match(r"^/_emulator/batches/([^/]+)/expire$", path)):
                completed = payload.get("completed") if isinstance(payload, dict) else None
                self._send_json(200, store.expire_batch(mt.group(1), completed))
            else:
                raise ApiError(404, f"Invalid URL ({method} {path})")
        except ApiError as e:
            self._send_json(e.status, e.body())
        except (ValueError, KeyError, TypeError) as e:
            self._send_json(400, _error_body(f"bad admin request: {e}", "invalid_request_error", None, None))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128


class Emulator:
    """The emulator: ``with Emulator(EmulatorConfig(...)) as emu: OpenAI(base_url=emu.base_url, ...)``."""

    def __init__(self, config: EmulatorConfig | None = None, **overrides: Any):
        config = config or EmulatorConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.store = _Store(config)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Emulator:
        if self._server is not None:
            return self
        self._stopping.clear()
        handler = type("_BoundHandler", (_Handler,), {"emulator": self})
        self._server = _Server((self.config.host, self.config.port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="batch-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("emulator not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    # --- inspection and control ------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def request_count(self, method: str, route: str) -> int:
        """Calls received for a route template, e.g. ``("POST", "/v1/batches")``,
        ``("GET", "/v1/batches/{id}")`` (faulted calls included)."""
        with self.store.lock:
            return self.store.requests.get(f"{method.upper()} {route}", 0)

    def batches_created(self) -> int:
        """Batches that exist because a POST /v1/batches took effect (faulted ones included)."""
        with self.store.lock:
            return self.store.batches_created

    def files_created(self) -> int:
        """Files uploaded through POST /v1/files that took effect (outputs not counted)."""
        with self.store.lock:
            return self.store.files_created

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self.store.retrieve_batch(batch_id)

    def batches(self) -> list[dict[str, Any]]:
        """Every batch, oldest first, as the API would show it now."""
        with self.store.lock:
            self.store._advance_all()
            return [self.store._view(b) for b in sorted(self.store.batches.values(), key=lambda b: b.seq)]

    def file_bytes(self, file_id: str) -> bytes:
        return self.store.file_content(file_id)

    def script_fault(self, method: str, path: str, fault: Fault | str, times: int = 1, **kwargs: Any) -> None:
        """Inject ``fault`` into the next ``times`` calls matching ``method`` (or ``*``) and
        ``path`` (a route template such as ``/v1/batches/{id}`` or an fnmatch pattern of the path)."""
        if isinstance(fault, str):
            fault = Fault(fault, **kwargs)
        self.store.script_fault(method, path, fault, times)

    def clear_faults(self) -> None:
        self.store.clear_faults()

    def expire_batch(self, batch_id: str, completed: int | None = None) -> dict[str, Any]:
        return self.store.expire_batch(batch_id, completed)


def serve_forever(
    port: int = 0,
    faults: str = "none",
    seed: int = 0,
    data_dir: str | None = None,
    *,
    host: str = "127.0.0.1",
    ready: Callable[[Emulator], None] | None = None,
    stop_event: threading.Event | None = None,
    **config: Any,
) -> None:
    """Run an emulator until ``stop_event`` is set or KeyboardInterrupt."""
    emu = Emulator(EmulatorConfig(host=host, port=port, faults=faults, seed=seed, data_dir=data_dir, **config)).start()
    try:
        if ready is not None:
            ready(emu)
        (stop_event or threading.Event()).wait()
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()


def run_emulator(port: int, faults: str, seed: int, data_dir: str | None, **config: Any) -> None:
    """The ``bgctl emulator`` command: print the banner and base URL, serve until interrupted.

    Phase durations default to a few seconds so a person can watch a batch move."""
    config.setdefault("validating_s", 2.0)
    config.setdefault("in_progress_s", 5.0)
    config.setdefault("finalizing_s", 2.0)
    config.setdefault("cancelling_s", 2.0)

    def ready(emu: Emulator) -> None:
        print("=" * 64, flush=True)
        print(f"  {SIMULATED_BANNER}", flush=True)
        print(f"  base URL: {emu.base_url}", flush=True)
        print(f"  faults: {faults}  seed: {seed}  data: {data_dir or '(in memory)'}", flush=True)
        print(f"  stats: {emu.root_url}/_emulator/stats", flush=True)
        print("  export OPENAI_BASE_URL=" + emu.base_url + "  (any non-empty OPENAI_API_KEY works)", flush=True)
        print("  Ctrl-C to stop.", flush=True)
        print("=" * 64, flush=True)

    serve_forever(port, faults, seed, data_dir, ready=ready, **config)
