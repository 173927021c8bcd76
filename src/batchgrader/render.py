"""Rich rendering for the terminal. Pure presentation: no business logic here."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def render_config(rows: list[dict[str, Any]], home, profile: str | None) -> None:
    t = Table(title=f"Effective configuration — profile {profile or 'default'} — home {home.root}")
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    t.add_column("source", style="dim")
    for r in rows:
        t.add_row(r["key"], _fmt(r["value"]), r["source"])
    console.print(t)
