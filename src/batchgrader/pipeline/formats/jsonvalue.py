"""JSON values read and written exactly: ``ExactFloat``, the exact serialiser, the strict decoder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# --- values ------------------------------------------------------------------------------------


class ExactFloat(float):
    """A JSON number with a fraction or exponent: a ``float`` that keeps its spelling.

    ``ExactFloat("19.90") == 19.9``; ``str()``, :func:`text_of` and :class:`TableWriter`
    give back ``"19.90"``.  Arithmetic returns plain floats.
    """

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> ExactFloat:
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:
        return self.text if not spec else float.__format__(self, spec)

    def __reduce__(self):
        return (ExactFloat, (self.text,))


def _float_json(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{v!r} is not valid JSON (NaN and Infinity are not allowed)")
    return float.__repr__(v)


_encode_str = json.encoder.encode_basestring  # the non-ASCII-preserving encoder (C if available)


def _dump(v: Any, out: list[str], compact: bool) -> None:
    """Serialise one JSON value exactly (ExactFloat spelled as read), appending to ``out``."""
    if isinstance(v, str):
        out.append(_encode_str(v))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, ExactFloat):
        out.append(v.text)
    elif isinstance(v, float):
        out.append(_float_json(v))
    elif isinstance(v, Mapping):
        item_sep, key_sep = (",", ":") if compact else (", ", ": ")
        out.append("{")
        first = True
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be str, not {type(k).__name__}: {k!r}")
            if not first:
                out.append(item_sep)
            first = False
            out.append(_encode_str(k))
            out.append(key_sep)
            _dump(x, out, compact)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        item_sep = "," if compact else ", "
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(item_sep)
            _dump(x, out, compact)
        out.append("]")
    else:
        raise TypeError(f"cannot write a {type(v).__name__} as JSON: {v!r}")


def _dumps(v: Any, compact: bool = False) -> str:
    out: list[str] = []
    _dump(v, out, compact)
    return "".join(out)


def _dumps_record(record: Mapping[str, Any]) -> str:
    """``_dumps`` for one output record, with the common flat str/int values inlined."""
    out: list[str] = ["{"]
    append = out.append
    for k, v in record.items():
        if type(k) is not str:
            raise TypeError(f"JSON object keys must be str, not {type(k).__name__}: {k!r}")
        if len(out) > 1:
            append(", ")
        append(_encode_str(k))
        append(": ")
        t = type(v)
        if t is str:
            append(_encode_str(v))
        elif t is int:
            append(int.__repr__(v))
        else:
            _dump(v, out, False)
    append("}")
    return "".join(out)


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return "a string"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return "a number"


def _too_deep(obj: Any, limit: int) -> bool:
    """True if ``obj`` (a dict) nests containers more than ``limit`` levels deep."""
    stack = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        children = v.values() if isinstance(v, dict) else v
        for c in children:
            if isinstance(c, (dict, list)):
                stack.append((c, depth + 1))
    return False


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


class _BadConstant(Exception):
    def __init__(self, name: str):
        self.name = name


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _reject_constant(name: str) -> Any:
    raise _BadConstant(name)


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(object_pairs_hook=_pairs_hook, parse_float=ExactFloat, parse_constant=_reject_constant)
