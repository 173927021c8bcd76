"""Shared by the benchmark scripts: the machine description, and writing one '## ' section of
docs/benchmarks.md while keeping the rest."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(heading: str, text: str, path: Path = DOC) -> Path:
    """Put ``text`` (which starts with ``heading``) in place of that section, or append it."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if heading in old:
        start = old.index(heading)
        m = re.search(r"^## ", old[start + len(heading) :], flags=re.M)
        end = start + len(heading) + m.start() if m else len(old)
        new = old[:start] + text + ("\n" if m else "") + old[end:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")
    return path


def publish(heading: str, lines: list[str], write: bool) -> str:
    """A benchmark's section (``lines``, starting with ``heading``): printed, and written into
    docs/benchmarks.md when ``write``; returns its text."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        write_section(heading, text)
    return text


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def machine(extra: str) -> str:
    """Cores, CPU model, OS, Python, ``extra`` (library versions) and the current load."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"{extra}; load average {load_average():.1f} at the start"
    )
