"""Errors answered with the OpenAI error body, and small deterministic helpers."""

from __future__ import annotations

import hashlib
from typing import Any


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


def _error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _server_error_body() -> dict[str, Any]:
    return _error_body("The server had an error while processing your request. Sorry about that!", "server_error", None, None)


# --- list paging (the OpenAI Files and Batches APIs; Anthropic's and Gemini's page sizes) ------


def int_param(query: dict[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter between ``lo`` and ``hi``, refused as the OpenAI API refuses it."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ApiError(400, f"Invalid type for '{name}': expected an integer.", param=name, code="invalid_type") from None
    if not lo <= v <= hi:
        raise ApiError(400, f"Invalid '{name}': integer must be between {lo} and {hi}.", param=name, code="integer_out_of_range")
    return v


def page(objs: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """An OpenAI list page: up to ``limit`` objects after the one with id ``after``."""
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
