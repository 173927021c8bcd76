"""Does a structured answer parse under the profile's JSON schema?

:func:`output_problem` checks an answer's text against a ``response_format`` of type
``json_schema``: it must be JSON, and the value must satisfy the schema's keywords that the
strict-mode subset allows (``core/configuration/strict_schema.py``): ``type``, ``enum``, ``const``,
``properties`` / ``required`` / ``additionalProperties``, ``items``, ``minItems`` /
``maxItems``, ``anyOf``, ``$ref`` into ``$defs`` / ``definitions``, and the numeric bounds.
Other keywords are not checked.  A failed check makes the row ``invalid_output``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}
_BOUNDS = (
    ("minimum", lambda v, b: v >= b),
    ("maximum", lambda v, b: v <= b),
    ("exclusiveMinimum", lambda v, b: v > b),
    ("exclusiveMaximum", lambda v, b: v < b),
)


def schema_of(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema of a ``json_schema`` response_format, else None (nothing to check)."""
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    schema = (response_format.get("json_schema") or {}).get("schema")
    return schema if isinstance(schema, dict) else None


def output_problem(content: Any, schema: Mapping[str, Any]) -> str | None:
    """Why ``content`` (an answer's text) does not parse under ``schema``, or None."""
    if not isinstance(content, str):
        return "the answer has no text"
    try:
        value = json.loads(content)
    except ValueError as exc:
        return f"the answer is not JSON ({exc})"
    return value_problem(value, schema, schema, "$")


def _is(value: Any, t: str) -> bool:
    if t in ("number", "integer") and isinstance(value, bool):
        return False
    if t == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PY_TYPES.get(t, object))


def _resolve(ref: str, root: Mapping[str, Any]) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.lstrip("#/").split("/"):
        node = node.get(part, {}) if isinstance(node, Mapping) and part else node
    return node if isinstance(node, Mapping) else {}


def value_problem(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (at JSON path ``path``), or None."""
    if isinstance(schema.get("$ref"), str):
        return value_problem(value, _resolve(schema["$ref"], root), root, path)
    if isinstance(schema.get("anyOf"), list):
        if all(value_problem(value, s, root, path) for s in schema["anyOf"] if isinstance(s, Mapping)):
            return f"{path}: matches none of anyOf"
    problem = _kind_problem(value, schema, path)
    if problem is not None:
        return problem
    if isinstance(value, dict):
        return _object_problem(value, schema, root, path)
    if isinstance(value, list):
        return _array_problem(value, schema, root, path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _bounds_problem(value, schema, path)
    return None


def _kind_problem(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    """The value's type against ``type``, and its value against ``enum`` and ``const``."""
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if isinstance(t, str) else []
    if types and not any(_is(value, x) for x in types):
        return f"{path}: expected {' or '.join(types)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} is not one of {schema['enum']!r}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: {value!r} is not {schema['const']!r}"
    return None


def _bounds_problem(value: float, schema: Mapping[str, Any], path: str) -> str | None:
    for key, ok in _BOUNDS:
        b = schema.get(key)
        if isinstance(b, (int, float)) and not ok(value, b):
            return f"{path}: {value!r} breaks {key} {b!r}"
    return None


def _object_problem(value: dict[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> str | None:
    raw = schema.get("properties")
    props: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    for name in schema.get("required") or ():
        if name not in value:
            return f"{path}: missing required property {name!r}"
    if schema.get("additionalProperties") is False:
        extra = sorted(set(value) - set(props))
        if extra:
            return f"{path}: property {extra[0]!r} is not allowed"
    for name, sub in props.items():
        if name in value and isinstance(sub, Mapping):
            problem = value_problem(value[name], sub, root, f"{path}.{name}")
            if problem:
                return problem
    return None


def _array_problem(value: list[Any], schema: Mapping[str, Any], root: Mapping[str, Any], path: str) -> str | None:
    lo, hi = schema.get("minItems"), schema.get("maxItems")
    if isinstance(lo, int) and len(value) < lo:
        return f"{path}: {len(value)} items, fewer than minItems {lo}"
    if isinstance(hi, int) and len(value) > hi:
        return f"{path}: {len(value)} items, more than maxItems {hi}"
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, v in enumerate(value):
            problem = value_problem(v, items, root, f"{path}[{i}]")
            if problem:
                return problem
    return None


def body_schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request body carries: a chat body's ``response_format``, or a Responses
    body's ``text.format`` (None without one)."""
    text = body.get("text")
    if "response_format" not in body and isinstance(text, Mapping) and isinstance(text.get("format"), Mapping):
        fmt = text["format"]
        schema = fmt.get("schema") if fmt.get("type") == "json_schema" else None
        return schema if isinstance(schema, dict) else None
    return schema_of(body.get("response_format"))


def line_schemas(lines: Any) -> dict[str, dict[str, Any] | None]:
    """custom_id -> the JSON schema its request line carried (:func:`body_schema`), for request
    lines (bytes, JSONL); equal schemas are one object."""
    out: dict[str, dict[str, Any] | None] = {}
    seen: dict[str, dict[str, Any] | None] = {}
    for raw in lines:
        if not raw.strip():
            continue
        obj = json.loads(raw)
        schema = body_schema(obj.get("body") or {})
        canon = json.dumps(schema, sort_keys=True)
        out[str(obj.get("custom_id"))] = seen.setdefault(canon, schema)
    return out
