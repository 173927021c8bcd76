"""OpenAI strict-mode rules for a ``response_format`` JSON schema, checked when the config loads.

With ``strict: true`` the provider accepts only a subset of JSON Schema, and it rejects the
whole batch (every request) for a schema outside it.  The rules, from OpenAI's Structured
Outputs guide, "Supported schemas"
(https://platform.openai.com/docs/guides/structured-outputs#supported-schemas):

* the root is an object (not ``anyOf``);
* every object has ``additionalProperties: false`` and lists every property in ``required``
  (an optional field is written as a union with ``null``: ``type: [string, "null"]``);
* types are ``string``, ``number``, ``integer``, ``boolean``, ``object``, ``array`` and ``null``;
  ``enum``, ``const``, ``anyOf``, ``$ref`` / ``$defs`` are supported;
* type-specific keywords: strings ``pattern``, ``format``; numbers ``minimum``, ``maximum``,
  ``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``; arrays ``minItems``, ``maxItems``;
  other keywords (``allOf``, ``oneOf``, ``not``, ``if``, ``patternProperties``, ``minLength``, ...)
  are not supported;
* at most 10 levels of nesting and 5,000 object properties in all.

:func:`strict_problems` returns every problem, each naming its JSON path inside the schema
(``$.properties.reason``).
"""

from __future__ import annotations

from typing import Any

TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
COMMON = frozenset({"type", "description", "title", "enum", "const", "anyOf", "$ref", "$defs", "definitions", "$schema"})
BY_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}
ALL_KEYWORDS = COMMON.union(*BY_TYPE.values())
MAX_DEPTH = 10
MAX_PROPERTIES = 5000
DOCS = "https://platform.openai.com/docs/guides/structured-outputs#supported-schemas"


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.replace("_", "").isalnum() else f"{path}[{key!r}]"


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.properties = 0

    def add(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def node(self, s: Any, path: str, depth: int) -> None:
        if not isinstance(s, dict):
            self.add(path, "must be a schema object")
            return
        if depth > MAX_DEPTH:
            self.add(path, f"nested deeper than {MAX_DEPTH} levels (strict mode's limit)")
            return
        types = s.get("type")
        type_list = types if isinstance(types, list) else [types] if types is not None else []
        self.keywords(s, path, types, type_list)
        if "object" in type_list or "properties" in s:
            self.object(s, path, depth)
        if "array" in type_list:
            items = s.get("items")
            if items is None:
                self.add(path, "an array needs 'items'")
            else:
                self.node(items, _key_path(path, "items"), depth + 1)
        for i, sub in enumerate(s.get("anyOf") or []):
            self.node(sub, f"{path}.anyOf[{i}]", depth + 1)
        for defs in ("$defs", "definitions"):
            for name, sub in (s.get(defs) or {}).items():
                self.node(sub, _key_path(_key_path(path, defs), name), depth)

    def keywords(self, s: dict, path: str, types: Any, type_list: list[Any]) -> None:
        """Known types only, something that says what the node is, and only the keywords strict
        mode supports for its types."""
        for t in type_list:
            if t not in TYPES:
                self.add(_key_path(path, "type"), f"type {t!r} is not supported (use one of {', '.join(sorted(TYPES))})")
        if types is None and not any(k in s for k in ("anyOf", "$ref", "enum", "const")):
            self.add(path, "has no 'type' (or anyOf / $ref / enum / const)")
        allowed = set(COMMON).union(*(BY_TYPE.get(t, set()) for t in type_list))
        for k in s:
            if k not in allowed:
                why = "is not supported in strict mode" if k not in ALL_KEYWORDS else f"does not apply to type {types!r}"
                self.add(_key_path(path, k), f"keyword {k!r} {why}")

    def object(self, s: dict, path: str, depth: int) -> None:
        props = s.get("properties")
        if not isinstance(props, dict):
            self.add(path, "an object needs 'properties' (a mapping)")
            props = {}
        if s.get("additionalProperties") is not False:
            self.add(path, "every object needs additionalProperties: false")
        required = s.get("required")
        if not isinstance(required, list):
            required = []
        missing = [p for p in props if p not in required]
        if missing:
            self.add(
                path,
                f"every property must be listed in 'required' (missing: {', '.join(missing)}); "
                "make a field optional with a null type instead, e.g. type: [string, 'null']",
            )
        unknown = [r for r in required if r not in props]
        if unknown:
            self.add(_key_path(path, "required"), f"names properties that do not exist: {', '.join(map(str, unknown))}")
        self.properties += len(props)
        for name, sub in props.items():
            self.node(sub, _key_path(_key_path(path, "properties"), name), depth + 1)


def strict_problems(schema: Any) -> list[str]:
    """Every way ``schema`` breaks the strict-mode rules (empty: the provider will accept it)."""
    c = _Checker()
    if not isinstance(schema, dict):
        return ["$: the schema must be an object"]
    if "anyOf" in schema and "type" not in schema:
        c.add("$", "the root must be an object, not anyOf")
    elif schema.get("type") != "object":
        c.add("$", "the root must have type: object")
    c.node(schema, "$", 1)
    if c.properties > MAX_PROPERTIES:
        c.add("$", f"{c.properties} object properties in all; strict mode allows {MAX_PROPERTIES}")
    return c.problems
