"""``{{ namespace.path }}`` templates of OpenAI's graders.

Only two namespaces exist: ``item`` (the row) and ``sample`` (the answer being graded:
``output_text``, ``output_json`` (its text parsed as JSON), ``choices``, ``output_tools``).
A path goes into objects with ``.key`` and into lists with ``.N`` or ``[N]``.  A value is put in
as its text: a string as it is, anything else as compact JSON.  A variable the row lacks is an
error (:class:`MissingVariable`), never an empty string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_VAR = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
NAMESPACES = ("item", "sample")


class MissingVariable(KeyError):
    """A template variable the row does not have: ``variable`` and the ``reason``."""

    def __init__(self, variable: str, reason: str):
        super().__init__(variable)
        self.variable = variable
        self.reason = reason

    def __str__(self) -> str:
        return f"{{{{{self.variable}}}}}: {self.reason}"


def variables(template: str) -> list[str]:
    """The variables a template uses (``item.question``), in order of first use."""
    seen: dict[str, None] = {}
    for m in _VAR.finditer(template):
        seen.setdefault(m.group(1), None)
    return list(seen)


def bad_variables(template: str) -> list[str]:
    """Variables outside the ``item`` and ``sample`` namespaces (or empty), which no row can fill."""
    return [v for v in variables(template) if not v or v.split(".", 1)[0].split("[", 1)[0] not in NAMESPACES]


def steps(variable: str) -> list[str | int]:
    """``item.a[0].b`` -> ``["item", "a", 0, "b"]``."""
    out: list[str | int] = []
    for m in _STEP.finditer(variable):
        if m.group(2) is not None:
            out.append(int(m.group(2)))
        else:
            name = m.group(1)
            out.append(int(name) if name.isdigit() and out else name)
    return out


def sample_namespace(sample: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``sample`` namespace of a row's sample: ``output_text`` (from the sample's own field,
    its first choice's message, or its ``output`` messages), and ``output_json`` when that text is
    a JSON object or list."""
    if sample is None:
        return None
    ns = dict(sample)
    text = ns.get("output_text")
    if not isinstance(text, str):
        text = _text_of_sample(ns)
        if text is not None:
            ns["output_text"] = text
    if "output_json" not in ns and isinstance(ns.get("output_text"), str):
        try:
            parsed = json.loads(ns["output_text"])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            ns["output_json"] = parsed
    return ns


def _text_of_sample(sample: Mapping[str, Any]) -> str | None:
    choices = sample.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        msg = choices[0].get("message")
        if isinstance(msg, Mapping) and isinstance(msg.get("content"), str):
            return msg["content"]
    output = sample.get("output")
    if isinstance(output, list):
        parts = [m.get("content") for m in output if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant"]
        texts = [p for p in parts if isinstance(p, str)]
        if texts:
            return "".join(texts)
    return None


def lookup(variable: str, item: Mapping[str, Any], sample: Mapping[str, Any] | None) -> Any:
    """The value of ``variable`` in the row, or :class:`MissingVariable` saying where it stops."""
    path = steps(variable)
    if not path or path[0] not in NAMESPACES:
        raise MissingVariable(variable, "only the item and sample namespaces exist")
    value: Any = item if path[0] == "item" else sample
    if value is None:
        raise MissingVariable(variable, "the row has no sample (give items with a 'sample', or output items)")
    walked = [str(path[0])]
    for step in path[1:]:
        if isinstance(step, int) and isinstance(value, list):
            if step >= len(value):
                raise MissingVariable(variable, f"{'.'.join(walked)} has {len(value)} entries, no [{step}]")
            value = value[step]
        elif isinstance(value, Mapping) and str(step) in value:
            value = value[str(step)]
        else:
            what = "is not an object" if not isinstance(value, Mapping) else f"has no {step!r}"
            if walked == ["sample"] and step == "output_json":
                what = "has no output_json (the sample's output_text is not a JSON object)"
            raise MissingVariable(variable, f"{'.'.join(walked)} {what}")
        walked.append(str(step))
    return value


def text(value: Any) -> str:
    """A value as templates put it in: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(template: str, item: Mapping[str, Any], sample: Mapping[str, Any] | None) -> str:
    """The template with every variable replaced (``sample`` as :func:`sample_namespace` made it)."""
    return _VAR.sub(lambda m: text(lookup(m.group(1), item, sample)), template)
