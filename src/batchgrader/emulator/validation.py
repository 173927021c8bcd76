"""Validation of a batch's input file and the plan of its requests (outcomes decided up front).

The parse-and-count of an input file (:func:`check_input`) is a pure function of the file's
bytes, the batch's endpoint and the configuration: it runs in the store's background worker
from ``create_batch`` on, outside the lock, and ``Validation.validate`` (due ``validating_s`` after the
create) only applies its result, and decides the enqueued-token limit, under the lock."""

from __future__ import annotations

import json
import os
import shutil
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from batchgrader.emulator import embeddings
from batchgrader.emulator.answers import _countable_messages, _counter_for, _is_reasoning_model, chat_format, responses_messages
from batchgrader.emulator.common import _error_body, _server_error_body, _unit
from batchgrader.emulator.config import (
    AZURE_CHAT_ENDPOINT,
    CHAT_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    ENQUEUED_STATUSES,
    FAIL_400_TRIGGER,
    FAIL_500_TRIGGER,
    RESPONSES_ENDPOINT,
    token_limit_message,
)
from batchgrader.emulator.embeddings import is_embedding_model
from batchgrader.emulator.prompt_cache import BatchCache, openai_cached_tokens
from batchgrader.emulator.rules import known_model, openai_request_error, responses_request_error_of, shut_down
from batchgrader.emulator.state import (
    FAIL_CONTENT,
    FAIL_NONE,
    FAIL_SEEDED,
    State,
    _Batch,
    _Lines,
    _Plan,
    _Req,
)

if TYPE_CHECKING:
    from batchgrader.emulator.background import TokenCache
    from batchgrader.emulator.config import EmulatorConfig

#: How long a validation that is due waits for its background parse-and-count (on a manual
#: clock, or when forced) before doing the work itself.
VALIDATION_WAIT_S = 120.0


@dataclass
class _Checked:
    """The pure part of a batch's validation: the input errors (the first 1,000, in line order)
    or, if none, the plan of its requests (without the seeded failures, which depend on how often
    a custom_id was seen) and their prompt tokens."""

    errors: list[dict[str, Any]]
    model: str | None
    plan: _Plan | None
    tokens: int


#: Requests planned (their prompts counted) at a time while an input file is read.
PLAN_CHUNK = 2048


def _request_lines(fh: BinaryIO) -> tuple[int, int]:
    """(lines, requests) of an input file: its lines, and the lines up to its last non-blank one
    (trailing blank lines are not requests)."""
    lines = last = 0
    for raw in fh:
        lines += 1
        if raw.strip():
            last = lines
    fh.seek(0)
    return lines, last


def check_input(source: Path | BinaryIO, endpoint: str, cfg: EmulatorConfig, cache: TokenCache, azure: bool = False) -> _Checked:
    """Parse and check every line of an input file like the Batch API does, then plan it, reading
    the file line by line (``source``: its path, or the file open for reading, closed here).

    ``azure``: as Azure OpenAI does, a line whose ``url`` is not the batch's endpoint is refused
    with ``url_mismatch``, and its api-version chat endpoint ``/chat/completions`` is chat."""
    fh = open(source, "rb") if isinstance(source, Path) else source  # noqa: SIM115 (closed below)
    with fh:
        return _check_lines(fh, endpoint, cfg, cache, azure)


class _LineError(Exception):
    """A line of an input file refused: its error's code, message and param."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _item_of(raw: bytes, seen: set[str]) -> dict[str, Any]:
    """A line's request object, its ``custom_id`` new to the batch (then noted in ``seen``)."""
    try:
        item = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _LineError("invalid_json_line", "This line is not parseable as valid JSON.") from None
    if not isinstance(item, dict):
        raise _LineError("invalid_json_line", "This line is not parseable as valid JSON.")
    missing = [k for k in ("custom_id", "method", "url", "body") if item.get(k) is None]
    if missing:
        raise _LineError("missing_required_parameter", f"Missing required parameter: '{missing[0]}'.", missing[0])
    cid = item["custom_id"]
    if not isinstance(cid, str) or not cid:
        raise _LineError("invalid_request", "Invalid type for 'custom_id': expected a non-empty string.", "custom_id")
    if cid in seen:
        raise _LineError(
            "duplicate_custom_id",
            f"The custom_id '{cid}' for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.",
            "custom_id",
        )
    seen.add(cid)
    return item


def _body_of(item: dict[str, Any], endpoint: str, chat: bool, azure: bool) -> tuple[dict[str, Any], str]:
    """A request's body and model, checked against the batch's endpoint."""
    if not isinstance(item["method"], str) or item["method"].upper() != "POST":
        raise _LineError("invalid_request", "Invalid value for 'method': only 'POST' is supported.", "method")
    if item["url"] != endpoint:
        if azure:
            message = f"The provided url '{item['url']}' does not match the endpoint '{endpoint}' of the batch."
            raise _LineError("url_mismatch", message, "url")
        raise _LineError("invalid_url", "The URL provided for this request does not match the batch endpoint.", "url")
    body = item["body"]
    if not isinstance(body, dict):
        raise _LineError("invalid_request", "Invalid type for 'body': expected an object.", "body")
    if body.get("stream") is True:
        name = "Chat Completions" if chat else "Responses" if endpoint == RESPONSES_ENDPOINT else endpoint
        raise _LineError("streaming_unsupported", f"{name}: Streaming is not supported in the Batch API.", "body.stream")
    m = body.get("model")
    if not isinstance(m, str) or not m:
        raise _LineError("invalid_request", "Model parameter is required.", "body.model")
    return body, m


def _size_error(n_requests: int, cfg: EmulatorConfig) -> dict[str, Any] | None:
    """The error of a file with no request, or too many."""
    if not n_requests:
        return {"code": "empty_file", "message": "The batch input file is empty.", "param": None, "line": None}
    if n_requests > cfg.max_requests_per_batch:
        message = (
            f"The batch input file has {n_requests:,} requests, but a batch can hold at most {cfg.max_requests_per_batch:,}."
        )
        return {"code": "too_many_tasks", "message": message, "param": None, "line": None}
    return None


class _LineChecker:
    """The lines of one input file checked in order: the first 1,000 errors, else the plan."""

    def __init__(self, endpoint: str, cfg: EmulatorConfig, cache: TokenCache, azure: bool) -> None:
        self.endpoint, self.cfg, self.cache, self.azure = endpoint, cfg, cache, azure
        self.chat = endpoint == CHAT_ENDPOINT or (azure and endpoint == AZURE_CHAT_ENDPOINT)
        self.embeddings = endpoint == EMBEDDINGS_ENDPOINT and not azure
        self.answered = self.chat or endpoint == RESPONSES_ENDPOINT or self.embeddings  # the endpoints the emulator answers
        self.errors: list[dict[str, Any]] = []
        self.model: str | None = None
        self.seen: set[str] = set()
        self.planner: _Planner | None = None
        self.parsed: list[tuple[str, dict[str, Any]]] = []  # waiting to be planned (PLAN_CHUNK at a time)

    def line(self, lineno: int, raw: bytes) -> None:
        try:
            item = _item_of(raw, self.seen)
            body, m = _body_of(item, self.endpoint, self.chat, self.azure)
            self._same_model(m)
            if self.answered and not known_model(m, self.cfg):
                raise _LineError("model_not_found", f"The provided model '{m}' is not supported by the Batch API.", "body.model")
            if self.embeddings and not is_embedding_model(m):  # the unknown model's wording; this case not seen live
                raise _LineError("model_not_found", f"The provided model '{m}' is not supported by the Batch API.", "body.model")
            if self.answered and not self.azure and (gone := shut_down(m, self.cfg)) is not None:
                raise _LineError("model_not_found", gone, "body.model")  # the batch's wording is not verified live
            if self.chat and not isinstance(body.get("messages"), list):
                raise _LineError("invalid_request", "Messages parameter is required.", "body.messages")
        except _LineError as e:
            if len(self.errors) < 1000:
                self.errors.append({"code": e.code, "message": e.message, "param": e.param, "line": lineno})
            return
        if self.errors:
            return  # no plan for a file with errors: only the rest of its errors are looked for
        self.parsed.append((item["custom_id"], body))
        if len(self.parsed) >= PLAN_CHUNK:
            assert self.planner is not None
            self.planner.add(self.parsed)
            self.parsed = []

    def _same_model(self, m: str) -> None:
        if self.model is None:
            self.model = m
            self.planner = _Planner(self.endpoint, m, self.cfg, self.cache)
        elif m != self.model:
            raise _LineError(
                "mismatched_model",
                f"The model '{m}' for this request does not match the rest of the batch. Each batch must contain requests for a single model.",
                "body.model",
            )

    def checked(self) -> _Checked:
        if self.errors:
            return _Checked(self.errors, self.model, None, 0)
        assert self.model is not None and self.planner is not None
        self.planner.add(self.parsed)
        plan = self.planner.plan
        return _Checked([], self.model, plan, sum(plan.prompt))


def _check_lines(fh: BinaryIO, endpoint: str, cfg: EmulatorConfig, cache: TokenCache, azure: bool) -> _Checked:
    _, n_requests = _request_lines(fh)
    size_error = _size_error(n_requests, cfg)
    if size_error is not None:
        return _Checked([size_error], None, None, 0)
    checker = _LineChecker(endpoint, cfg, cache, azure)
    for lineno, raw in enumerate(fh, start=1):
        if lineno > n_requests:
            break
        checker.line(lineno, raw)
    return checker.checked()


def schema_tokens(model: str, response_format: Any, cfg: EmulatorConfig, cache: dict[str, int]) -> int:
    """Prompt tokens billed for a request's ``json_schema`` ``response_format``, as the real API
    bills the schema on top of the messages: ``cfg.schema_overhead_tokens`` when set, else the
    tokens of the ``json_schema`` object as compact JSON in the model's encoding (the allowance
    ``bgctl count`` states, ``pipeline/prepare.schema_allowance``).  0 without a schema."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return 0
    if cfg.schema_overhead_tokens is not None:
        return cfg.schema_overhead_tokens
    text = json.dumps(response_format.get("json_schema") or {}, separators=(",", ":"), ensure_ascii=False)
    found = cache.get(text)
    if found is None:
        found = cache[text] = _counter_for(model).text_tokens([text])[0]
    return found


def messages_of(endpoint: str, body: dict[str, Any]) -> list[dict[str, str]]:
    """A request's messages as counted: a chat body's ``messages``, a Responses body's
    ``instructions`` and ``input`` (:func:`~batchgrader.emulator.answers.responses_messages`)."""
    return _countable_messages(responses_messages(body) if endpoint == RESPONSES_ENDPOINT else body.get("messages"))


def content_failure(endpoint: str, body: dict[str, Any], model: str) -> tuple[int, dict[str, Any]] | None:
    """The reply of a request that fails by its content alone (status, body), or None."""
    chat = endpoint in (CHAT_ENDPOINT, AZURE_CHAT_ENDPOINT)  # the Azure one only exists on Azure batches
    msgs = messages_of(endpoint, body)
    user_text = " ".join(m.get("content", "") for m in msgs)
    if endpoint == EMBEDDINGS_ENDPOINT:
        user_text = json.dumps(body.get("input"), ensure_ascii=False)
    if FAIL_400_TRIGGER in user_text:
        return (
            400,
            _error_body(
                "Invalid request (emulated failure triggered by __FAIL_400__).",
                "invalid_request_error",
                None,
                "invalid_value",
            ),
        )
    if FAIL_500_TRIGGER in user_text:
        return 500, _server_error_body()
    if endpoint == RESPONSES_ENDPOINT:
        return responses_request_error_of(body)
    if endpoint == EMBEDDINGS_ENDPOINT:
        return embeddings.request_error(body, model)
    if not chat:
        return (
            400,
            _error_body(
                f"The emulator does not implement {endpoint}; only {CHAT_ENDPOINT} and {RESPONSES_ENDPOINT} requests are answered.",
                "invalid_request_error",
                "url",
                "unsupported_endpoint",
            ),
        )
    if (refused := openai_request_error(body)) is not None:
        return refused
    if _is_reasoning_model(model) and "max_tokens" in body:
        return (
            400,
            _error_body(
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                "invalid_request_error",
                "max_tokens",
                "unsupported_parameter",
            ),
        )
    return None


class _Planner:
    """Plans a batch's requests a chunk at a time, in order: each request's prompt and cached
    tokens, and whether it fails by its content alone."""

    def __init__(self, endpoint: str, model: str, cfg: EmulatorConfig, cache: TokenCache) -> None:
        self.endpoint, self.model, self.cfg, self.cache = endpoint, model, cfg, cache
        self.chat = endpoint in (CHAT_ENDPOINT, AZURE_CHAT_ENDPOINT, RESPONSES_ENDPOINT)  # counted and answered
        self.responses = endpoint == RESPONSES_ENDPOINT
        self.embeddings = endpoint == EMBEDDINGS_ENDPOINT
        self.plan = _Plan(model, endpoint, array("q"), array("q"), bytearray())
        self.seen: BatchCache = set()  # prompt-cache prefixes written so far in this batch
        self.prefix_tokens: dict[str, int] = {}
        self.schema_cache: dict[str, int] = {}

    def add(self, parsed: list[tuple[str, dict[str, Any]]]) -> None:
        model, cache, plan = self.model, self.cache, self.plan
        if self.embeddings:
            for _, body in parsed:
                failed = content_failure(self.endpoint, body, model) is not None
                plan.prompt.append(0 if failed else embeddings.input_tokens(model, body))
                plan.cached.append(0)
                plan.fail.append(FAIL_CONTENT if failed else FAIL_NONE)
            return
        messages = [messages_of(self.endpoint, body) for _, body in parsed]
        prompt = cache.count_many(model, messages) if self.chat else [0] * len(parsed)
        for (_, body), msgs, pt in zip(parsed, messages, prompt):
            cached = 0
            rf = chat_format(body) if self.responses else body.get("response_format")
            if msgs:
                first = json.dumps(msgs[0], sort_keys=True)

                def count_first(first: str = first, msg: dict[str, str] = msgs[0]) -> int:
                    if first not in self.prefix_tokens:
                        self.prefix_tokens[first] = cache.count_many(model, [[msg]])[0] - 3
                    return self.prefix_tokens[first]

                # the schema is a prefix to the system message ("Structured Outputs: the output schema serves
                # as a prefix to the system message and can be cached"): only requests with the same schema share a cache
                prefix = first if not isinstance(rf, dict) else json.dumps(rf, sort_keys=True) + first
                cached = openai_cached_tokens(self.seen, model, pt, prefix, count_first, body.get("prompt_cache_key"))
            pt += schema_tokens(model, rf, self.cfg, self.schema_cache)
            plan.prompt.append(pt)
            plan.cached.append(cached)
            failed = content_failure(self.endpoint, body, model) is not None
            plan.fail.append(FAIL_CONTENT if failed else FAIL_NONE)


def request_of(plan: _Plan, i: int, raw: bytes) -> _Req:
    """Request ``i`` of a planned batch, from its input line ``raw``, with its planned outcome."""
    item = json.loads(raw)
    body = item["body"]
    req = _Req(i, item["custom_id"], body, plan.prompt[i], plan.cached[i])
    kind = plan.fail[i]
    if kind == FAIL_CONTENT:
        failure = content_failure(plan.endpoint, body, plan.model)
        assert failure is not None
        req.fail_status, req.fail_body = failure
    elif kind == FAIL_SEEDED:
        req.fail_status, req.fail_body = 500, _server_error_body()
    return req


class Validation:
    """Checks a batch's input file like the Batch API does (in the background worker), then
    plans each request; the plan is rebuilt from the batch's input after a restart."""

    def __init__(self, state: State) -> None:
        self.state = state

    def start(self, b: _Batch) -> None:
        """Start the parse-and-count of ``b``'s input file in the background (if it has one)."""
        f = self.state.files.get(b.obj["input_file_id"])
        if f is None or f.deleted or f.obj["purpose"] != "batch" or f.path is None:
            return  # validate reports it; nothing to compute
        try:
            fh = open(f.path, "rb")  # noqa: SIM115 (closed by check_input): read as it is now
        except FileNotFoundError:
            return
        endpoint, cfg, cache, azure = b.obj["endpoint"], self.state.cfg, self.state.token_cache, b.azure
        b.checking = self.state.worker.submit(lambda: check_input(fh, endpoint, cfg, cache, azure))

    def ready(self, b: _Batch) -> tuple[bool, float]:
        """Whether ``b``'s validation may be applied, and from when (``validating_s`` after its
        create, or later if its background parse-and-count finished later).  On any clock but the real one (a test's manual clock)
        the validation is always ready on time (``validate`` then waits for the work)."""
        due = b.t_created + self.state.cfg.validating_s
        p = b.checking
        if p is None or not self.state.real_clock:
            return True, due
        if not p.done() or p.t_done is None:
            return False, due
        return True, max(due, p.t_done)

    def _checked(self, b: _Batch, path: Path) -> _Checked:
        p = b.checking
        b.checking = None
        if p is not None and p.wait(VALIDATION_WAIT_S) and p.error is None:
            return p.result  # type: ignore[no-any-return]
        return check_input(path, b.obj["endpoint"], self.state.cfg, self.state.token_cache, b.azure)

    def validate(self, b: _Batch) -> list[dict[str, Any]]:
        obj = b.obj
        fid = obj["input_file_id"]
        f = self.state.files.get(fid)
        if f is None or f.deleted:
            b.checking = None
            return [
                {
                    "code": "invalid_request",
                    "message": f"Cannot find file {fid}, or organization {self.state.cfg.organization} does not have access to it.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        if f.obj["purpose"] != "batch":
            b.checking = None
            return [
                {
                    "code": "invalid_request",
                    "message": f"File {fid} has purpose '{f.obj['purpose']}', but the Batch API requires purpose 'batch'.",
                    "param": "file_id",
                    "line": None,
                }
            ]
        assert f.path is not None  # a file not deleted has its bytes
        checked = self._checked(b, f.path)
        model = checked.model
        if model is not None:
            obj["model"] = model
        if checked.errors:
            return checked.errors
        assert model is not None and checked.plan is not None
        plan = checked.plan
        tokens = checked.tokens
        limit = self.state.cfg.token_limits.get(model)
        if limit is not None:
            enqueued = sum(
                o.enqueued_tokens
                for o in self.state.batches.values()
                if o is not b and o.status in ENQUEUED_STATUSES and o.obj.get("model") == model
            )
            if enqueued + tokens > limit:
                return [
                    {
                        "code": "token_limit_exceeded",
                        "message": token_limit_message(
                            model, self.state.cfg.organization, limit if self.state.cfg.token_limit_figure else None
                        ),
                        "param": None,
                        "line": None,
                    }
                ]
        # the batch keeps its input even if the file is deleted later: a link of its own
        inp = self.state.blob_dir("batches") / f"{obj['id']}.input"
        inp.unlink(missing_ok=True)
        try:
            os.link(f.path, inp)
        except OSError:
            shutil.copyfile(f.path, inp)
        b.input_path = inp
        seen = self.state.custom_id_seen
        b.plan = self._fail_seeded(plan, inp, lambda cid: seen.get(cid, 0), count=True)
        b.enqueued_tokens = tokens
        obj["request_counts"] = {"total": plan.n, "completed": 0, "failed": 0}
        return []

    def _fail_seeded(self, plan: _Plan, path: Path, seen_before: Callable[[str], int], count: bool = False) -> _Plan:
        """The seeded fraction of requests that fail with a 500 (``request_failure_rate``); a
        custom_id's draw depends on how often it was seen before (a retry may succeed).
        ``count``: each custom_id is counted as seen once more (only with a failure rate: the
        count is used only for the draw)."""
        rate = self.state.cfg.request_failure_rate
        if rate <= 0:
            return plan
        with open(path, "rb") as fh:
            for i in range(plan.n):
                cid = json.loads(fh.readline())["custom_id"]
                if plan.fail[i] == FAIL_NONE and _unit("fail", self.state.cfg.seed, cid, seen_before(cid)) < rate:
                    plan.fail[i] = FAIL_SEEDED
                if count:
                    self.state.custom_id_seen[cid] += 1
        return plan

    def ensure_plan(self, b: _Batch) -> _Plan:
        if b.plan is not None:
            return b.plan
        if b.n == 0 or b.input_path is None:
            b.plan = _Plan(b.obj.get("model") or "", b.obj["endpoint"], array("q"), array("q"), bytearray())
            return b.plan
        # Rebuild after a restart: same parse, same deterministic outcomes.
        model = b.obj["model"]
        planner = _Planner(b.obj["endpoint"], model, self.state.cfg, self.state.token_cache)
        parsed: list[tuple[str, dict[str, Any]]] = []
        with open(b.input_path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    item = json.loads(raw)
                    parsed.append((item["custom_id"], item["body"]))
                if len(parsed) >= PLAN_CHUNK:
                    planner.add(parsed)
                    parsed = []
        planner.add(parsed)
        seen = self.state.custom_id_seen
        b.plan = self._fail_seeded(planner.plan, b.input_path, lambda cid: max(0, seen.get(cid, 1) - 1))
        return b.plan

    def request(self, b: _Batch, i: int) -> _Req:
        """Request ``i`` of ``b``, read from its input file (forward: ``i`` never decreases)."""
        plan = self.ensure_plan(b)
        if b.inputs is None:
            assert b.input_path is not None
            b.inputs = _Lines(b.input_path)
        return request_of(plan, i, b.inputs.get(i))
