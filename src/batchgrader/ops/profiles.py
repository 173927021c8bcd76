"""Settings given with a job (the Python API's ``bg.grade(..., model=..., temperature=...)``) as
a profile of ``config.yaml``, the one place the daemon reads a job's settings from.

There are no per-job settings in the event log: a job takes its profile's settings when it is
prepared, and a file names its profile by the inbox folder it waits in.  So the settings become a
generated profile, ``py-<hash>``: the base profile's own overrides with the settings over them,
named by a hash of both (the same settings reuse the same profile; nothing is written twice).
It is inserted as text under ``profiles:`` (or a new ``profiles:`` block is appended), so the
file's comments and layout stay as they are; the whole file is then loaded as the daemon loads
it, and on any error put back as it was, with the error raised.  A running daemon reloads an
edited ``config.yaml`` before its next scan of the inbox.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from batchgrader.core.host.home import Home

PREFIX = "py-"
_PROFILES_LINE = re.compile(r"^profiles:[ \t]*(#.*)?$", re.M)


def profile_name(base: str | None, settings: Mapping[str, Any], prefix: str = PREFIX) -> str:
    """``py-`` (or ``prefix``) and a hash of the base profile and the settings."""
    key = json.dumps({"base": base or "default", "settings": dict(settings)}, sort_keys=True, default=str)
    return prefix + hashlib.sha256(key.encode("utf-8")).hexdigest()[:10]


def profile_with(
    home: Home, base: str | None, settings: Mapping[str, Any], *, prefix: str = PREFIX, written_by: str = "batchgrader.api"
) -> str:
    """The name of a profile of ``home``'s config.yaml that is ``base`` (None: the top level) with
    ``settings`` over it, written into config.yaml unless it is there already.  An unknown base
    profile, an unknown key or a bad value raises ``ConfigError`` (config.yaml unchanged).
    ``prefix`` starts the generated name and ``written_by`` is named in its comment (the Python
    API's ``py-``; `bgctl evals import` writes ``eval-`` profiles)."""
    import yaml

    from batchgrader.core.configuration.config import ConfigError, load_config, read_yaml_file
    from batchgrader.fsio import atomic_write_bytes

    load_config(home).profile(base)  # an unknown base profile is named before anything is written
    path = home.config_file
    existed = path.exists()
    text = path.read_text(encoding="utf-8") if existed else ""
    data = (read_yaml_file(path) if existed else None) or {}
    profiles = data.get("profiles") or {}
    name = profile_name(base, settings, prefix)
    if name in profiles:
        return name
    own = dict(profiles.get(base) or {}) if base and base != "default" else {}
    overrides = {**own, **settings}
    comment = f"# written by {written_by}: profile {base or 'default'} with {', '.join(sorted(settings))}"
    block = yaml.safe_dump({name: overrides}, sort_keys=True, default_flow_style=False, allow_unicode=True)
    m = _PROFILES_LINE.search(text)
    if m is not None:
        indent = _indent_after(text, m.end())
        lines = [comment, *block.splitlines()]
        inserted = "".join(f"{indent}{line}\n" for line in lines)
        new = text[: m.end()] + "\n" + inserted + text[m.end() + 1 :]
    elif "profiles" in data:
        raise ConfigError(
            f"{path}: 'profiles' is not written as a block ('profiles:' on a line of its own, one profile per "
            "indented entry): write it so, or add the profile yourself and pass profile="
        )
    else:
        sep = "" if not text or text.endswith("\n") else "\n"
        new = text + sep + "\nprofiles:\n" + "".join(f"  {line}\n" for line in [comment, *block.splitlines()])
    atomic_write_bytes(path, new.encode("utf-8"))
    try:
        prof = load_config(home).profile(name)
        for key in settings:  # an environment variable wins over every profile: the setting would be lost
            source = prof.sources.get(key, "")
            if not source.startswith("config.yaml profiles."):
                raise ConfigError(f"{key}={settings[key]!r} cannot take effect: {source} overrides every profile; unset it")
    except Exception:  # put back as it was
        if existed:
            atomic_write_bytes(path, text.encode("utf-8"))
        else:
            path.unlink(missing_ok=True)
        raise
    return name


def _indent_after(text: str, pos: int) -> str:
    """The indentation of the first entry under ``profiles:`` (two spaces when it has none)."""
    for line in text[pos:].splitlines()[1:]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        stripped = line.lstrip(" ")
        return line[: len(line) - len(stripped)] if len(stripped) < len(line) else "  "
    return "  "
