"""``bgctl events``: one line per event, its payload packed into ``k=v`` parts (split from
:mod:`batchgrader.cli.render_status`, whose helpers it uses)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from batchgrader.cli.render_status import NARROW, _console, short_ts


def _print_packed(parts: Sequence[str], console: Console, indent: int) -> None:
    """``k=v`` parts packed into lines under ``indent`` spaces; a part longer than the line (a
    path, an id) gets a line of its own and is never broken by us (the terminal soft-wraps it,
    and a copy gives it back whole)."""
    room = max(20, console.width - indent)
    line = ""
    pad = " " * indent
    for part in parts:
        if line and len(line) + 1 + len(part) > room:
            console.print(Text(pad + line), soft_wrap=True)
            line = ""
        line = f"{line} {part}" if line else part
    if line:
        console.print(Text(pad + line), soft_wrap=True)


def _brief_parts(payload: dict[str, Any]) -> list[str]:
    parts = []
    for k, v in payload.items():
        if isinstance(v, list):
            parts.append(f"{k}=[{len(v)}]")
        elif isinstance(v, dict):
            parts.append(f"{k}={json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(',', ':'))}")
        elif v is not None:
            parts.append(f"{k}={v}")
    return parts


def _brief(payload: dict[str, Any], width: int = 160) -> str:
    parts = []
    for k, v in payload.items():
        if isinstance(v, list):
            parts.append(f"{k}=[{len(v)}]")
        elif isinstance(v, dict):
            parts.append(f"{k}={json.dumps(v, ensure_ascii=False, sort_keys=True)}")
        elif v is None:
            continue
        else:
            parts.append(f"{k}={v}")
    s = " ".join(parts)
    return s if len(s) <= width else s[: width - 1] + "…"


def render_events(events: Sequence[dict[str, Any]], console: Console | None = None, show_job: bool = True) -> None:
    """One line per event (suits ``--follow``: call it with each new event)."""
    console = _console(console)
    narrow = console.width < NARROW + 20
    for e in events:
        line = Text()
        line.append(f"{e['seq']:>7} ", style="dim")
        line.append(short_ts(e.get("ts")) + " ", style="dim")
        if show_job:
            line.append(f"{e['job_id']:<14} ", style="bold")
        style = (
            "red"
            if e["type"] in ("JobFailed", "ChunkFailed", "RowsFailed", "UploadFailed", "BatchCreateFailed", "FileRejected")
            else ("green" if e["type"] in ("JobCompleted", "ChunkCompleted", "ResultWritten") else "cyan")
        )
        brief = _brief(e.get("payload") or {}, width=10**6)
        if narrow or line.cell_len + 22 + len(brief) > console.width:
            # the payload on its own lines, wrapped between words: ids and paths stay whole
            line.append(e["type"], style=style)
            console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
            _print_packed(_brief_parts(e.get("payload") or {}), console, indent=8)
            continue
        line.append(f"{e['type']:<22}", style=style)
        line.append(brief)
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
