"""The key tables of docs/configuration.md, generated from the settings' declarations
(:mod:`batchgrader.core.configuration.settings`): under each section's heading, one row per setting declared in
it, in declaration order.  ``python -m batchgrader.core.configuration.config_docs docs/configuration.md``
rewrites the tables in place; ``tests/test_docs.py`` fails while one is stale."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.settings import KEYS, SECTIONS, Setting, sdk_env_names

HEADER = "| key | default | environment variable | what it does | profile | reload |\n|---|---|---|---|---|---|\n"


class StaleSection(ValueError):
    """The page has no heading for a section the declarations name."""


def _default(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def row(s: Setting[Any]) -> str:
    env = ", ".join(f"`{name}`" for name in (s.env, *sdk_env_names(s.name)))
    cells = (f"`{s.name}`", _default(s.default), env, s.doc, "yes" if s.profile else "no", "no: restart" if s.restart else "yes")
    return "| " + " | ".join(cells) + " |"


def table(section: str) -> str:
    """The key table of ``section``: its header and one row per setting declared in it."""
    return HEADER + "".join(row(s) + "\n" for s in KEYS.values() if s.section == section)


def regenerate(text: str) -> str:
    """``text`` (docs/configuration.md) with the table under each section's heading generated anew."""
    for section in SECTIONS:
        heading = re.compile(rf"^### {re.escape(section)}\n\n(?:\|.*\n)*", re.M)
        if not heading.search(text):
            raise StaleSection(f"docs/configuration.md lacks a '### {section}' heading followed by a blank line")
        text = heading.sub(lambda m: f"### {section}\n\n{table(section)}", text, count=1)  # noqa: B023
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/configuration.md")
    text = path.read_text(encoding="utf-8")
    new = regenerate(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    print(f"{path}: {'rewritten' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
