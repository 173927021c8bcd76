"""Prompt templates: named system prompts, the examples file, `{column}` placeholders.

Placeholders are replaced by plain text substitution, never ``str.format``: user data and
examples files may contain braces (JSON examples made the old tool crash with a KeyError).
``{{`` and ``}}`` stand for literal braces in templates.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import ConfigError, Profile, read_yaml_file
from batchgrader.core.host.home import Home

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
EXAMPLES_PLACEHOLDER = "examples"


class TemplateError(ValueError):
    pass


def placeholders(template: str) -> list[str]:
    """Names of the `{...}` placeholders in a template, in order of first use."""
    seen: dict[str, None] = {}
    for m in _TOKEN.finditer(template):
        if m.group(1) is not None:
            name = m.group(1)
            if not name.strip():
                raise TemplateError(f"empty placeholder '{{}}' in template {template[:60]!r}")
            seen.setdefault(name, None)
    return list(seen)


@functools.lru_cache(maxsize=256)
def compile_template(template: str) -> tuple[tuple[str, bool], ...]:
    """``template`` as (text, is_placeholder) parts, in order: literal text (``{{``/``}}``
    already turned into braces) and placeholder names.  :func:`render` joins them."""
    parts: list[tuple[str, bool]] = []
    literal: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(template):
        literal.append(template[pos : m.start()])
        whole = m.group(0)
        if whole == "{{":
            literal.append("{")
        elif whole == "}}":
            literal.append("}")
        else:
            if any(literal):
                parts.append(("".join(literal), False))
            literal = []
            parts.append((m.group(1), True))
        pos = m.end()
    literal.append(template[pos:])
    if any(literal):
        parts.append(("".join(literal), False))
    return tuple(parts)


def render(template: str, lookup: Callable[[str], str]) -> str:
    """Replace each ``{name}`` by ``lookup(name)`` (called left to right), ``{{``/``}}`` by braces."""
    return "".join([lookup(text) if placeholder else text for text, placeholder in compile_template(template)])


def load_named_prompts(home: Home) -> dict[str, str]:
    path = home.prompts_file
    if not path.exists():
        return {}
    data = read_yaml_file(path) or {}
    prompts = data.get("prompts", data) if isinstance(data, dict) else None
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError(f"{path}: expected a mapping 'prompts:' of prompt name to prompt text")
    return prompts


@dataclass(frozen=True)
class PromptSpec:
    """Everything needed to build each row's messages; resolved once per job."""

    system: str | None  # final system prompt text (examples inserted), constant for the job
    user_template: str
    user_fields: tuple[str, ...]  # columns the user template reads

    def user_message(self, values: Mapping[str, Any], text_of: Callable[[Any], str]) -> str:
        return "".join(
            [text_of(values[text]) if placeholder else text for text, placeholder in compile_template(self.user_template)]
        )

    def messages(self, values: Mapping[str, Any], text_of: Callable[[Any], str]) -> list[dict[str, str]]:
        return self.chat(self.user_message(values, text_of))

    def chat(self, user_content: str) -> list[dict[str, str]]:
        """The messages of one request whose user message is ``user_content``."""
        msgs = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        msgs.append({"role": "user", "content": user_content})
        return msgs


def resolve_prompts(profile: Profile, home: Home) -> PromptSpec:
    """Resolve the system prompt (named or literal, with examples) and the user template."""
    system = _system_text(profile, home)
    examples_text = _examples_text(profile, home)
    if system is not None:
        system = _with_examples(system, examples_text)
    elif examples_text is not None:
        system = examples_text
    template = profile.user_prompt or f"Please evaluate the following text: {{{profile.response_field}}}"
    try:
        fields = tuple(placeholders(template))
    except TemplateError as exc:
        raise ConfigError(f"user_prompt: {exc}") from None
    if not fields:
        raise ConfigError(f"user_prompt has no {{column}} placeholder, so every request would be identical: {template!r}")
    return PromptSpec(system=system or None, user_template=template, user_fields=fields)


def _system_text(profile: Profile, home: Home) -> str | None:
    """The system prompt as configured: the named prompt from prompts.yaml, else the literal one."""
    if not profile.system_prompt_name:
        return profile.system_prompt
    named = load_named_prompts(home)
    if profile.system_prompt_name not in named:
        known = ", ".join(sorted(named)) or "none"
        raise ConfigError(
            f"system_prompt_name {profile.system_prompt_name!r} is not in {home.prompts_file} (prompts there: {known})"
        )
    return named[profile.system_prompt_name]


def _examples_text(profile: Profile, home: Home) -> str | None:
    """The examples file's text (paths relative to the home), or None when none is configured."""
    if not profile.examples_file:
        return None
    path = Path(profile.examples_file).expanduser()
    if not path.is_absolute():
        path = home.root / path
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"examples_file {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"examples_file {str(path)!r} is not UTF-8 text ({exc})") from None


def _with_examples(system: str, examples_text: str | None) -> str:
    """The system prompt with the examples where it says {examples}, else after it; any other
    placeholder is refused (row fields belong in the user prompt)."""
    names = placeholders(system)
    unknown = [n for n in names if n != EXAMPLES_PLACEHOLDER]
    if unknown:
        raise ConfigError(
            f"system prompt has placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; only {{examples}} is "
            "allowed there (row fields go in user_prompt; write {{ and }} for literal braces)"
        )
    if EXAMPLES_PLACEHOLDER in names and examples_text is None:
        raise ConfigError("system prompt uses {examples} but no examples_file is configured")
    system = render(system, lambda _n: examples_text or "")
    if examples_text is not None and EXAMPLES_PLACEHOLDER not in names:
        system = system.rstrip() + "\n\n" + examples_text
    return system
