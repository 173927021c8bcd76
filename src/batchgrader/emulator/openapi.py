"""OpenAI requests checked against OpenAI's published OpenAPI spec, as the real API refuses them.

The part of the spec the emulator serves (chat completions, batches, files, the error shape) is
pinned beside this module as ``openai_openapi.yaml`` (its header names the source commit and
date; ``tests/pin_openai_spec.py`` regenerates it). The tests validate every emulator answer
against the same file with ``jsonschema``; here a small walk of the request schema refuses what
the spec forbids, without a validator at run time:

* :func:`chat_request_error` -> the ``error`` object of a 400 for a chat-completions body: a
  required parameter missing, a scalar of the wrong type, a number outside the spec's
  ``minimum``/``maximum`` (``temperature: 3``, ``top_p: 1.5``, ``n: 0``), a value outside an
  ``enum``, an empty ``messages``, a message ``role`` the spec does not list; the ``param`` is
  the parameter's path (``messages[0].role``), the codes and wording those of OpenAI's errors;
* :func:`responses_request_error` -> the same for a Responses API body (``CreateResponse``);
* :func:`batch_request_error` -> the same for a ``POST /v1/batches`` body's
  ``output_expires_after`` (``seconds`` between the spec's 3600 and 2592000).

Only what the walk understands is checked: scalars (type, bounds, enum), objects (required and
known properties), arrays (``minItems``, items) and a ``oneOf`` with a ``discriminator``; any
other combination (a string or an array of content parts, response formats, tools) is
accepted as before."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SPEC_FILE", "schemas", "chat_request_error", "responses_request_error", "batch_request_error"]

#: The pinned part of OpenAI's OpenAPI spec (package data)
SPEC_FILE = Path(__file__).with_name("openai_openapi.yaml")

_SCALARS = {"number", "integer", "string", "boolean"}
_ARTICLE = {"number": "a decimal", "integer": "an integer", "string": "a string", "boolean": "a boolean"}
_SEEN = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string", list: "an array", dict: "an object"}


@functools.cache
def schemas() -> dict[str, Any]:
    """The pinned ``components.schemas``, by name."""
    with open(SPEC_FILE, encoding="utf-8") as fh:
        out: dict[str, Any] = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["components"]["schemas"]
    return out


def _resolve(schema: Any) -> Any:
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        schema = schemas()[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _merged(schema: Any) -> Any:
    """``schema`` with its ``allOf`` parts merged into one object schema."""
    schema = _resolve(schema)
    if not isinstance(schema, Mapping) or "allOf" not in schema:
        return schema
    props: dict[str, Any] = dict(schema.get("properties") or {})
    required: list[str] = list(schema.get("required") or [])
    for part in schema["allOf"]:
        part = _merged(part)
        props.update(part.get("properties") or {})
        required += [r for r in part.get("required") or [] if r not in required]
    return {"type": "object", "properties": props, "required": required}


def _error(message: str, param: str, code: str) -> dict[str, Any]:
    return {"message": message, "type": "invalid_request_error", "param": param, "code": code}


def _kind(value: Any) -> str:
    return _SEEN.get(type(value), "null" if value is None else "a value")


def _is(value: Any, t: str) -> bool:
    if t == "boolean":
        return isinstance(value, bool)
    if t == "string":
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    if t == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return isinstance(value, (int, float))


def _listed(values: list[Any]) -> str:
    quoted = [f"'{v}'" for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"


def _scalar_error(param: str, value: Any, branch: Mapping[str, Any]) -> dict[str, Any] | None:
    """Bounds and enum of a scalar ``value`` of the branch's type."""
    word = "integer" if branch["type"] == "integer" else "decimal"
    shown = json.dumps(value)
    if "minimum" in branch and value < branch["minimum"]:
        return _error(
            f"Invalid '{param}': {word} below minimum value. Expected a value >= {json.dumps(branch['minimum'])}, "
            f"but got {shown} instead.",
            param,
            f"{word}_below_min_value",
        )
    if "maximum" in branch and value > branch["maximum"]:
        return _error(
            f"Invalid '{param}': {word} above maximum value. Expected a value <= {json.dumps(branch['maximum'])}, "
            f"but got {shown} instead.",
            param,
            f"{word}_above_max_value",
        )
    enum = branch.get("enum")
    if isinstance(enum, list) and value not in enum:
        return _error(f"Invalid value: '{value}'. Supported values are: {_listed(enum)}.", param, "invalid_value")
    return None


def _check(param: str, value: Any, schema: Any) -> dict[str, Any] | None:
    """The error of ``value`` at ``param`` under ``schema``, or None (also when not understood)."""
    schema = _merged(schema)
    if not isinstance(schema, Mapping):
        return None
    branches = [_merged(b) for b in schema.get("anyOf") or schema.get("oneOf") or [schema]]
    nullable = schema.get("nullable") is True or any(isinstance(b, Mapping) and b.get("type") == "null" for b in branches)
    if value is None:
        return None if nullable or not branches else _error(f"Invalid type for '{param}': got null.", param, "invalid_type")
    if "discriminator" in schema:
        return _discriminated(param, value, schema, branches)
    real = [b for b in branches if isinstance(b, Mapping) and b.get("type") != "null"]
    if real and all(b.get("type") in _SCALARS and "anyOf" not in b and "oneOf" not in b for b in real):
        for b in real:
            if _is(value, b["type"]):
                return _scalar_error(param, value, b)
        expected = _ARTICLE[real[0]["type"]]
        return _error(f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.", param, "invalid_type")
    if len(real) == 1 and real[0].get("type") == "object" and "properties" in real[0]:
        return _object_error(param, value, real[0])
    if len(real) == 1 and real[0].get("type") == "array":
        return _array_error(param, value, real[0])
    return None


def _object_error(param: str, value: Any, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    prefix = f"{param}." if param else ""
    if not isinstance(value, Mapping):
        return _error(f"Invalid type for '{param}': expected an object, but got {_kind(value)} instead.", param, "invalid_type")
    for key in schema.get("required") or []:
        if value.get(key) is None:
            return _error(f"Missing required parameter: '{prefix}{key}'.", prefix + key, "missing_required_parameter")
    props = schema.get("properties") or {}
    for key, item in value.items():
        if key in props and (refused := _check(prefix + key, item, props[key])) is not None:
            return refused
    return None


def _array_error(param: str, value: Any, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(value, list):
        return _error(f"Invalid type for '{param}': expected an array, but got {_kind(value)} instead.", param, "invalid_type")
    low = schema.get("minItems")
    if isinstance(low, int) and len(value) < low:
        return _error(
            f"Invalid '{param}': empty array. Expected an array with minimum length {low}, but got an empty array instead.",
            param,
            "empty_array",
        )
    items = schema.get("items")
    for i, item in enumerate(value if items is not None else []):
        if (refused := _check(f"{param}[{i}]", item, items)) is not None:
            return refused
    return None


def _discriminated(param: str, value: Any, schema: Mapping[str, Any], branches: list[Any]) -> dict[str, Any] | None:
    """A ``oneOf`` whose branch the ``discriminator`` property names (a message's ``role``)."""
    key = schema["discriminator"]["propertyName"]
    if not isinstance(value, Mapping):
        return _error(f"Invalid type for '{param}': expected an object, but got {_kind(value)} instead.", param, "invalid_type")
    by_value: dict[Any, Any] = {}
    for b in branches:
        for v in ((b.get("properties") or {}).get(key) or {}).get("enum") or []:
            by_value.setdefault(v, b)
    if value.get(key) is None:
        return _error(f"Missing required parameter: '{param}.{key}'.", f"{param}.{key}", "missing_required_parameter")
    chosen = by_value.get(value[key])
    if chosen is None:
        return _error(
            f"Invalid value: '{value[key]}'. Supported values are: {_listed(list(by_value))}.", f"{param}.{key}", "invalid_value"
        )
    return _object_error(param, value, chosen)


def chat_request_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``error`` of the 400 OpenAI answers for a chat-completions ``body`` the spec refuses."""
    return _object_error("", body, _merged(schemas()["CreateChatCompletionRequest"]))


def responses_request_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``error`` of the 400 OpenAI answers for a ``POST /v1/responses`` ``body`` the spec
    refuses (``CreateResponse``: ``max_output_tokens`` below 16, ``temperature: 3``, a
    ``reasoning.effort`` or ``service_tier`` outside its enum, an input item's ``role``, ...)."""
    refused = _object_error("", body, _merged(schemas()["CreateResponse"]))
    items = body.get("input")
    if refused is not None or not isinstance(items, list):
        return refused
    # ``input`` is a string or items; an item without a ``type`` (or ``type: message``) is an
    # ``EasyInputMessage`` (role user, assistant, system or developer), which the walk checks
    message = _merged(schemas()["EasyInputMessage"])
    for i, item in enumerate(items):
        if isinstance(item, Mapping) and item.get("type") in (None, "message"):
            if (refused := _object_error(f"input[{i}]", item, message)) is not None:
                return refused
    return None


def batch_request_error(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``error`` of the 400 for a ``POST /v1/batches`` body's ``output_expires_after``."""
    if "output_expires_after" not in body:
        return None
    props = _merged(schemas()["CreateBatchRequest"])["properties"]
    return _check("output_expires_after", body["output_expires_after"], props["output_expires_after"])
