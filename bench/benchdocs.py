"""Shared by the benchmark scripts: replace one '## ' section of docs/benchmarks.md, keep the rest."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(heading: str, text: str, path: Path = DOC) -> Path:
    """Put ``text`` (which starts with ``heading``) in place of that section, or append it."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if heading in old:
        start = old.index(heading)
        m = re.search(r"^## ", old[start + len(heading):], flags=re.M)
        end = start + len(heading) + m.start() if m else len(old)
        new = old[:start] + text + ("\n" if m else "") + old[end:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")
    return path
