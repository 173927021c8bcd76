"""Streaming parsers for Batch API output and error files, and the join of merged chunk results to the rows.

A line is a success **only** when ``response.status_code == 200`` (never "because ``error`` is
null": HTTP-level failures carry ``error: null`` and a 4xx/5xx response).  Every other line —
``response: null`` with a top-level ``error`` (e.g. ``batch_expired``), or a 4xx/5xx response
whose body is ``{"error": {...}}`` — becomes a per-row error with a code and a message.
Output order is not input order: everything is keyed by ``custom_id``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

_decode = json.JSONDecoder().decode  # json.loads without its per-call checks (a str: no encoding to detect)


class ResultsFormatError(ValueError):
    """A line of a result file cannot be attributed to a row (not JSON, no custom_id)."""

    def __init__(self, source: str, line: int, reason: str):
        self.source = source
        self.line = line
        self.reason = reason
        super().__init__(f"{source}:{line}: {reason}")


@dataclass(frozen=True)
class RowOutcome:
    custom_id: str
    ok: bool
    content: str | None = None
    status_code: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    finish_reason: str | None = None
    refusal: str | None = None
    request_id: str | None = None
    line_id: str | None = None
    cache_write_tokens: int = 0  # of prompt_tokens: prompt-cache writes (billed above the input price)


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _usage(body: dict[str, Any]) -> tuple[int, int, int, int]:
    """(prompt, cached, completion, reasoning) from a chat.completion or a response body."""
    u = body.get("usage")
    if not isinstance(u, dict):
        return 0, 0, 0, 0
    if "prompt_tokens" in u or "completion_tokens" in u:  # chat completions
        pd = u.get("prompt_tokens_details") or {}
        cd = u.get("completion_tokens_details") or {}
        return (
            _int(u.get("prompt_tokens")),
            _int(pd.get("cached_tokens")),
            _int(u.get("completion_tokens")),
            _int(cd.get("reasoning_tokens")),
        )
    pd = u.get("input_tokens_details") or {}  # /v1/responses
    cd = u.get("output_tokens_details") or {}
    return (
        _int(u.get("input_tokens")),
        _int(pd.get("cached_tokens")),
        _int(u.get("output_tokens")),
        _int(cd.get("reasoning_tokens")),
    )


def _cache_writes(body: dict[str, Any]) -> int:
    """Prompt-cache writes inside ``prompt_tokens`` (``prompt_tokens_details.cache_write_tokens``,
    as the Anthropic adapter reports ``cache_creation_input_tokens``); 0 when absent."""
    u = body.get("usage")
    pd = u.get("prompt_tokens_details") if isinstance(u, dict) else None
    return _int(pd.get("cache_write_tokens")) if isinstance(pd, dict) else 0


def _content(body: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(content, finish_reason, refusal) from a chat.completion or a /v1/responses body; from a
    /v1/embeddings body (``data[0].embedding``) the vector as compact JSON text."""
    if body.get("object") == "list" and isinstance(body.get("data"), list):
        return _embedding_content(body["data"]), None, None
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        return _chat_content(choices)
    output = body.get("output")
    if isinstance(output, list):
        return _responses_content(body, output)
    return None, None, None


def _embedding_content(data: list[Any]) -> str | None:
    first = data[0] if data and isinstance(data[0], dict) else {}
    vector = first.get("embedding")
    if isinstance(vector, str):  # encoding_format base64: little-endian float32
        import base64
        from array import array

        floats = array("f")
        floats.frombytes(base64.b64decode(vector))
        vector = list(floats)
    if not isinstance(vector, list):
        return None
    return json.dumps(vector, separators=(",", ":"))


def _chat_content(choices: list[Any]) -> tuple[str | None, str | None, str | None]:
    c0 = choices[0] if isinstance(choices[0], dict) else {}
    msg: dict[str, Any] = c0.get("message") if isinstance(c0.get("message"), dict) else {}  # type: ignore[assignment]
    content = msg.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return (content if isinstance(content, str) else None), c0.get("finish_reason"), msg.get("refusal")


def _responses_content(body: dict[str, Any], output: list[Any]) -> tuple[str | None, str | None, str | None]:
    texts: list[str] = []
    refusal = None
    for item in output:
        if not isinstance(item, dict):
            continue
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal":
                refusal = part.get("refusal")
    finish = body.get("status")
    inc = body.get("incomplete_details")
    if isinstance(inc, dict) and inc.get("reason"):
        finish = inc["reason"]
    return ("".join(texts) if texts else None), finish, refusal


#: finish reasons of a complete answer (chat completions; a /v1/responses body's status)
ANSWERED = frozenset({"stop", "completed"})
#: cut off by the output bound: OpenAI ``length`` (``max_output_tokens`` on /v1/responses);
#: the Anthropic and Gemini adapters translate ``max_tokens`` / ``MAX_TOKENS`` to ``length``
TRUNCATED = frozenset({"length", "max_output_tokens"})
#: refused or filtered: OpenAI ``content_filter`` (the adapters translate Anthropic ``refusal``
#: and Gemini ``SAFETY``/``RECITATION``/``BLOCKLIST``/``PROHIBITED_CONTENT``/``SPII`` to it)
REFUSED = frozenset({"content_filter"})
#: the row outcome codes of an HTTP-200 answer that is not an answer (never stored for reuse,
#: never retried automatically: the same request fails again the same way)
NOT_ANSWERS = frozenset({"truncated", "refused", "invalid_output", "unexpected_finish"})
BOUND_FIX = "raise max_completion_tokens in the profile, or `bgctl retry JOB --max-completion-tokens N`"


def answer_problem(finish: Any, refusal: Any, completion_tokens: int = 0, reasoning_tokens: int = 0) -> tuple[str, str] | None:
    """Why an HTTP-200 answer is not an answer, as (code, message), from the provider's own
    finish reason and refusal field; None for a complete answer.  A missing finish reason is
    taken as complete (nothing says otherwise); a finish reason not known here never is."""
    if isinstance(refusal, str) and refusal:
        return "refused", f"the model refused: {refusal}"
    if finish is None or finish in ANSWERED:
        return None
    if finish in TRUNCATED:
        spent = f"{completion_tokens:,} output tokens, {reasoning_tokens:,} of them reasoning" if completion_tokens else ""
        return "truncated", (
            f"the answer was cut off by the output bound (finish_reason: {finish}"
            + (f"; {spent}" if spent else "")
            + f"); {BOUND_FIX}"
        )
    if finish in REFUSED:
        return "refused", f"the provider refused or filtered the answer (finish_reason: {finish})"
    return "unexpected_finish", (
        f"the answer ended with finish reason {finish!r}, which is not a complete answer; see the provider's "
        "documentation of that reason, then `bgctl retry JOB`"
    )


def parse_line(obj: Any, *, source: str = "<line>", line: int = 0) -> RowOutcome:
    """One decoded output/error line → :class:`RowOutcome`."""
    if not isinstance(obj, dict):
        raise ResultsFormatError(source, line, "line is not a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise ResultsFormatError(source, line, "line has no custom_id")
    line_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    resp = obj.get("response")
    err = obj.get("error")
    if isinstance(resp, dict):
        return _response_outcome(cid, resp, err, line_id)
    if isinstance(err, dict):
        return RowOutcome(
            cid,
            False,
            None,
            None,
            str(err.get("code") or "unknown_error"),
            str(err.get("message") or "request failed without a message"),
            line_id=line_id,
        )
    return RowOutcome(cid, False, None, None, "malformed_result", "line has neither a response nor an error", line_id=line_id)


def _response_outcome(cid: str, resp: dict[str, Any], err: Any, line_id: str | None) -> RowOutcome:
    """The outcome of a line with a ``response``: an answer (HTTP 200, complete or not) or the
    HTTP error it carries (its body's error, else the line's own)."""
    status = resp.get("status_code")
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    body: dict[str, Any] = resp.get("body") if isinstance(resp.get("body"), dict) else {}  # type: ignore[assignment]
    request_id = resp.get("request_id") if isinstance(resp.get("request_id"), str) else None
    p, c, o, r = _usage(body)
    if status == 200:
        content, finish, refusal = _content(body)
        problem = answer_problem(finish, refusal, o, r)
        code, message = problem if problem else (None, None)
        w = _cache_writes(body)
        return RowOutcome(cid, problem is None, content, 200, code, message, p, c, o, r, finish, refusal, request_id, line_id, w)
    e: dict[str, Any] = body.get("error") if isinstance(body.get("error"), dict) else {}  # type: ignore[assignment]
    if not e and isinstance(err, dict):
        e = err
    code = e.get("code") or e.get("type") or (f"http_{status}" if status is not None else "unknown_error")
    message = e.get("message") or (f"HTTP {status}" if status is not None else "request failed without a message")
    return RowOutcome(cid, False, None, status, str(code), str(message), p, c, o, r, None, None, request_id, line_id)


def iter_outcomes(
    source: str | os.PathLike[str] | Iterable[bytes | str],
    *,
    on_malformed: Literal["raise", "skip"] = "raise",
    malformed: list[ResultsFormatError] | None = None,
) -> Iterator[RowOutcome]:
    """Stream a JSONL output or error file (a path, or any iterable of lines) one row at a
    time. Blank lines are skipped. A line that cannot be attributed raises
    :class:`ResultsFormatError` (or, with ``on_malformed="skip"``, is appended to ``malformed``)."""
    if isinstance(source, (str, os.PathLike)):
        name = str(source)
        with open(source, "rb") as fh:
            yield from _iter_lines(fh, name, on_malformed, malformed)
    else:
        yield from _iter_lines(source, "<lines>", on_malformed, malformed)


def _iter_lines(
    lines: Iterable[bytes | str], name: str, on_malformed: str, malformed: list[ResultsFormatError] | None
) -> Iterator[RowOutcome]:
    for lineno, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                problem = ResultsFormatError(name, lineno, "line is not valid UTF-8")
                if on_malformed == "raise":
                    raise problem from None
                if malformed is not None:
                    malformed.append(problem)
                continue
        if not raw.strip():
            continue
        try:
            yield parse_line(json.loads(raw), source=name, line=lineno)
        except ValueError as exc:
            problem = (
                exc
                if isinstance(exc, ResultsFormatError)
                else ResultsFormatError(name, lineno, f"line is not valid JSON ({exc})")
            )
            if on_malformed == "raise":
                raise problem from None
            if malformed is not None:
                malformed.append(problem)


# --- joining the merged chunk results to the input rows -----------------------------------------


class ResultsJoin:
    """The merged results of a job's chunks, taken row by row in input order, in O(chunks) memory.

    Every chunk's results file lists its rows in input order (planned ranges, and retry or
    re-planned chunks built in input order), so the next input row that a chunk holds is that
    chunk's next line.  The join keeps one open file and its head line per chunk, indexed by
    custom id: :meth:`take` is a dict lookup, whatever the size of the file.  A row held by
    several chunks (failed, then retried) gets the record of the latest chunk."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]]):
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed in close()
        self._heads: dict[str, list[int]] = {}
        self._records: list[dict[str, Any] | None] = [None] * len(self._files)
        for i in range(len(self._files)):
            self._advance(i)

    def _advance(self, i: int) -> None:
        for raw in self._files[i]:
            if raw.strip():
                rec = _decode(raw.decode("utf-8"))  # our own UTF-8 records: no encoding to detect
                self._records[i] = rec
                self._heads.setdefault(rec["custom_id"], []).append(i)
                return
        self._records[i] = None

    def take(self, custom_id: str) -> dict[str, Any] | None:
        """The record of ``custom_id`` (the next input row), or None when no chunk holds it."""
        holders = self._heads.pop(custom_id, None)
        if not holders:
            return None
        rec = self._records[max(holders)]
        for i in holders:
            self._advance(i)
        return rec

    def close(self) -> None:
        for f in self._files:
            f.close()

    def __enter__(self) -> ResultsJoin:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
