"""Noticing an edited configuration: the daemon reloads ``config.yaml`` and the home's
``pricing.csv`` when they change, as on ``SIGHUP``, so that ``bgctl config show`` and
``bgctl count`` never describe settings the daemon is not using.

A file is compared by its stat fingerprint (inode, size, modification time), checked once per
tick (two ``stat`` calls).  A change is reported once: a file caught half-written by an editor
fails to load (the daemon keeps the configuration it has and logs why), and the editor's last
write is a change of its own."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.settings import RESTART_ONLY_KEYS

Fingerprint = tuple[int, int, int] | None


def fingerprint(path: Path) -> Fingerprint:
    """(inode, size, mtime in ns) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class ConfigWatch:
    """The configuration files as the daemon last loaded them."""

    paths: Sequence[Path]
    seen: list[Fingerprint] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen = [fingerprint(p) for p in self.paths]

    def changed(self) -> list[Path]:
        """The files changed (created, edited, replaced or removed) since the last call (or since
        the watch began); each change is reported once."""
        now = [fingerprint(p) for p in self.paths]
        out = [p for p, a, b in zip(self.paths, self.seen, now) if a != b]
        self.seen = now
        return out


# Settings read only when the daemon starts (the provider clients, the log, the tick period) are
# declared with ``restart=True`` in core/configuration/settings.py: a reload keeps the old value, so a change of
# one of them is reported with the fix (a restart).


def _providers(config: Any) -> set[str]:
    return {str(p.get("provider") or "openai") for p in [config.default, *config.profiles.values()]}


def restart_only_changes(old: Any, new: Any) -> list[str]:
    """What a reload from ``old`` to ``new`` (two :class:`~batchgrader.core.configuration.config.Config`) changed
    that only a restart applies: the names of the changed start-up keys (a key's value is never
    returned), and ``provider <name>`` for a provider no profile used before."""
    changed = [k for k in RESTART_ONLY_KEYS if old.default.get(k) != new.default.get(k)]
    changed += [f"provider {p}" for p in sorted(_providers(new) - _providers(old))]
    return changed
