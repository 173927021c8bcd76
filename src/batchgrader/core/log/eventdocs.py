"""The generated parts of ``docs/events.md``: each event section's version line and field table,
written from the declarations in :mod:`batchgrader.core.log.payloads`.

The prose of a section (what the event means, what the fold does) is written by hand and kept;
:func:`regenerate` rewrites only the ``version N · emitted by: STEP.`` opening of the version
line and the ``| field | meaning |`` table.  ``tests/test_docs.py`` fails when the file differs
from what :func:`regenerate` makes of it; ``python -m batchgrader.core.log.eventdocs docs/events.md``
rewrites it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from batchgrader.core.log.payloads import DECLARATIONS, EventDeclaration

_HEADING = re.compile(r"^### `(\w+)`\n", flags=re.M)
_VERSION_LINE = re.compile(r"^version \d+ · emitted by: .*?\.(?= |$)", flags=re.M)
_TABLE = re.compile(r"^\| field \| meaning \|\n\|---\|---\|\n(?:\|.*\|\n?)*", flags=re.M)


class StaleSection(ValueError):
    """A section of the doc cannot be regenerated (no version line or field table), or an event has none."""


def version_line(d: EventDeclaration) -> str:
    """The generated opening of the section's version line."""
    return f"version {d.version} · emitted by: {d.step}."


def field_table(d: EventDeclaration) -> str:
    """The section's payload table: every field in declaration order, optional ones marked."""
    rows = [f"| `{name}` | {'(optional) ' if name in d.optional else ''}{meaning} |" for name, meaning in d.meanings.items()]
    return "\n".join(["| field | meaning |", "|---|---|", *rows]) + "\n"


def _section(name: str, body: str) -> str:
    d = DECLARATIONS.get(name)
    if d is None:
        raise StaleSection(f"docs/events.md has a section for {name!r}, which is not a declared event")
    body, lines = _VERSION_LINE.subn(lambda _m: version_line(d), body, count=1)
    body, tables = _TABLE.subn(lambda _m: field_table(d), body, count=1)
    if not (lines and tables):
        raise StaleSection(f"docs/events.md, section {name!r}: no version line or no field table to regenerate")
    return body


def regenerate(text: str) -> str:
    """``text`` (docs/events.md) with every event section's version line and field table regenerated."""
    parts = _HEADING.split(text)
    documented = parts[1::2]
    missing = [name for name in DECLARATIONS if name not in documented]
    if missing:
        raise StaleSection(f"docs/events.md lacks a section for: {', '.join(missing)}")
    out = [parts[0]]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        own, _, rest = body.partition("\n## ")  # a section ends at the next heading of either level
        out.append(f"### `{name}`\n" + _section(name, own) + (f"\n## {rest}" if _ else ""))
    return "".join(out)


def main(argv: list[str]) -> int:
    for name in argv:
        path = Path(name)
        path.write_text(regenerate(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
