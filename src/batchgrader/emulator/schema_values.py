"""Values that conform to a JSON Schema (the subset structured outputs use): the emulator's
answers to a ``json_schema`` response format, on every provider's routes."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from typing import Any

_WORDS = (
    "the answer is clear and consistent with the rubric the text shows a careful argument with minor gaps "
    "evidence supports the main claim though one step is asserted rather than shown overall quality is good "
    "style is concise structure is logical references are adequate conclusion follows from premises"
).split()

#: How deep a schema is followed (through $ref, combinators, properties and items)
MAX_DEPTH = 12


def sentence(rng: random.Random, lo: int = 4, hi: int = 30) -> str:
    """A sentence of ``lo`` to ``hi`` words drawn from ``rng``."""
    n = rng.randint(lo, hi)
    words = [rng.choice(_WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def generate_from_schema(schema: Any, rng: random.Random, root: Any = None, depth: int = 0) -> Any:
    """A value that conforms to a (JSON Schema subset) schema: types, enum, const, required,
    anyOf/oneOf/allOf, $ref to $defs/definitions, string/array length and numeric bounds."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    found, value = _by_keyword(schema, rng, root, depth)
    if found:
        return value
    return _BY_TYPE.get(_type_of(schema), _string)(schema, rng, root, depth)


def _by_keyword(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> tuple[bool, Any]:
    """``(True, value)`` when a keyword decides the value ($ref, const, enum, a combinator)."""
    if "$ref" in schema:
        return True, generate_from_schema(_resolve(root, schema["$ref"]), rng, root, depth + 1)
    if "const" in schema:
        return True, schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return True, rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return True, generate_from_schema(rng.choice(non_null or options), rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return True, generate_from_schema({**_merged(schema["allOf"]), **rest}, rng, root, depth + 1)
    return False, None


def _resolve(root: Any, ref: Any) -> Any:
    target: Any = root
    if isinstance(ref, str) and ref.startswith("#"):
        for part in [p for p in ref[1:].split("/") if p]:
            target = target.get(part) if isinstance(target, dict) else None
    return target


def _merged(subs: list[Any]) -> dict[str, Any]:
    """``allOf``'s schemas as one: properties merged, required lists joined, the rest overwritten."""
    merged: dict[str, Any] = {}
    for sub in subs:
        if not isinstance(sub, dict):
            continue
        for k, v in sub.items():
            if k == "properties" and isinstance(merged.get("properties"), dict):
                merged["properties"] = {**merged["properties"], **v}
            elif k == "required" and isinstance(merged.get("required"), list):
                merged["required"] = merged["required"] + list(v)
            else:
                merged[k] = v
    return merged


def _type_of(schema: dict[str, Any]) -> str:
    t = schema.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        t = non_null[0] if non_null else "null"
    if t is None:
        t = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return str(t)


def _object(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or rng.random() < 0.5:
            out[name] = generate_from_schema(sub, rng, root, depth + 1)
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
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


def _integer(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    lo = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema else 0)
    hi = schema.get("maximum", schema["exclusiveMaximum"] - 1 if "exclusiveMaximum" in schema else lo + 100)
    return rng.randint(math.ceil(lo), max(math.ceil(lo), math.floor(hi)))


def _number(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    flo = float(schema.get("minimum", schema.get("exclusiveMinimum", 0.0)) or 0.0)
    fhi = float(schema.get("maximum", schema.get("exclusiveMaximum", flo + 100.0)) or 0.0)
    v = round(rng.uniform(flo, fhi), 2)
    if "exclusiveMinimum" in schema and v <= flo or "exclusiveMaximum" in schema and v >= fhi:
        v = (flo + fhi) / 2
    return min(max(v, flo), fhi)


def _boolean(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    return rng.random() < 0.5


def _null(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    return None


#: A string of a ``format``, drawn from the generator
_FORMATS: dict[str, Callable[[random.Random], str]] = {
    "date": lambda rng: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "date-time": lambda rng: f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
    "email": lambda rng: f"user{rng.randint(1, 999)}@example.com",
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "uri": lambda rng: f"https://example.com/{rng.randint(1, 999)}",
    "url": lambda rng: f"https://example.com/{rng.randint(1, 999)}",
}


def _string(schema: dict[str, Any], rng: random.Random, root: Any, depth: int) -> Any:
    name = schema.get("format")
    fmt = _FORMATS.get(name) if isinstance(name, str) else None
    if fmt is not None:
        return fmt(rng)
    s = sentence(rng, 2, 12)
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")
    while len(s) < lo:
        s += " " + sentence(rng, 2, 6)
    if hi is not None:
        s = s[: int(hi)]
    return s


_Gen = Callable[[dict[str, Any], random.Random, Any, int], Any]
_BY_TYPE: dict[str, _Gen] = {
    "object": _object,
    "array": _array,
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
}
