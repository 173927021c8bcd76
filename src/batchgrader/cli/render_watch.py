"""``bgctl status --watch``: the status screen cut to the terminal's height.

Unfinished jobs come first (newest first), then finished ones (newest first); jobs are left out
from the end until the whole screen (table, notes, inbox) fits, and a ``+N more`` line counts
them, so the header never scrolls off the top."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from batchgrader.cli.render_status import FINISHED, render_status, render_waiting, unfinished_jobs


def watch_order(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unfinished jobs newest first, then finished jobs newest first."""
    newest = sorted(jobs, key=lambda r: (r.get("created_ts") or "", r["job_id"]), reverse=True)
    return [r for r in newest if r["state"] not in FINISHED] + [r for r in newest if r["state"] in FINISHED]


def screen_rows(text: str, width: int) -> int:
    """How many terminal rows ``text`` (possibly with ANSI styles) takes at ``width`` columns."""
    rows = 0
    for line in text.rstrip("\n").split("\n"):
        rows += max(1, math.ceil(Text.from_ansi(line).cell_len / max(1, width)))
    return rows


def _screen(
    console: Console,
    jobs: Sequence[dict[str, Any]],
    more: int,
    inbox: Sequence[dict[str, Any]],
    daemon: dict[str, Any],
    unfinished: int = 0,
) -> str:
    with console.capture() as cap:
        render_status(jobs, console, max_finished=None)
        if more:
            console.print(Text(f"+{more:,} more jobs: `bgctl status --all` lists every job", style="dim"))
        render_waiting(inbox, daemon, console, unfinished)
    return cap.get()


def watch_screen(
    overview: dict[str, Any], inbox: Sequence[dict[str, Any]], daemon: dict[str, Any], console: Console, height: int
) -> str:
    """The text of one ``--watch`` screen of at most ``height`` rows (at least the header and one job)."""
    jobs = watch_order(overview["jobs"])
    elsewhere = int(overview.get("hidden_active") or 0) + int(overview.get("hidden_finished") or 0)
    n = len(jobs)
    while True:
        text = _screen(console, jobs[:n], len(jobs) - n + elsewhere, inbox, daemon, unfinished_jobs(overview))
        if n <= 1 or screen_rows(text, console.width) <= height:
            return text
        n -= 1


def watch_overview(home: Any, show_all: bool, now: float | None) -> dict[str, Any]:
    """The jobs one ``--watch`` screen picks from (all of them with ``--all``)."""
    from batchgrader.store import queries

    if not queries.log_exists(home):  # no database yet, or one the daemon is still creating: no jobs yet
        return {"jobs": []}
    if show_all:
        return {"jobs": queries.status(home, now=now)}
    return queries.status_overview(home, active_limit=20, finished_limit=10, now=now)


def watch_loop(home: Any, show_all: bool, now: float | None) -> None:
    """``bgctl status --watch``: a screen fitted to the terminal, every second, until Ctrl-C."""
    import time

    from batchgrader.fsio import shown_names
    from batchgrader.ops.actions import daemon_info, inbox_files

    try:
        while True:
            console = Console()  # the terminal's size now: a resized window gets a fitted screen
            screen = watch_screen(
                shown_names(watch_overview(home, show_all, now)),
                shown_names(inbox_files(home)),
                daemon_info(home),
                console,
                console.height - 1,
            )
            console.clear()
            console.file.write(screen)
            console.file.flush()
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
