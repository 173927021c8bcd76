"""The doctor's check record (:class:`Check`: status, what was found, the fix), how a list of checks
is shown (table, narrow list, JSON, exit code), and small helpers the checks share (quoting, modes,
scrubbing secrets, a command runner with a timeout).
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from batchgrader.core.host.secrets import mask_secret, secret_forms

Status = Literal["ok", "warn", "fail"]
OK: Status = "ok"
WARN: Status = "warn"
FAIL: Status = "fail"

SYMBOLS = {OK: "✓", WARN: "!", FAIL: "✗"}
_STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red"}


@dataclass(frozen=True)
class Check:
    """One finding. ``fix`` is the concrete action (a command or an edit); empty when ``ok``."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def exit_code(checks: Sequence[Check]) -> int:
    """0 when no check failed (warnings allowed), 1 otherwise."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def checks_as_json(checks: Sequence[Check]) -> dict[str, Any]:
    """A JSON-serialisable summary: ``{"ok", "exit_code", "counts", "checks": [...]}``."""
    counts = {s: sum(1 for c in checks if c.status == s) for s in (OK, WARN, FAIL)}
    code = exit_code(checks)
    return {"ok": code == 0, "exit_code": code, "counts": counts, "checks": [c.to_dict() for c in checks]}


def render_checks(checks: Sequence[Check], console: Any) -> None:
    """A rich table (✓ / ! / ✗, check, detail, fix) and a one-line summary on ``console``."""
    from rich.table import Table

    if getattr(console, "width", 200) < NARROW:
        _render_list(checks, console)
    else:
        t = Table(title="bgctl doctor")
        _table_rows(t, checks)
        console.print(t)
    _render_summary(checks, console)


# below this many columns the checks are a list, not a table: a table would break paths and
# commands mid-word
NARROW = 120


def _render_list(checks: Sequence[Check], console: Any) -> None:
    from rich.text import Text

    console.print(Text("bgctl doctor", style="bold"))
    for c in checks:
        line = Text(SYMBOLS.get(c.status, "?") + " ", style=_STYLES.get(c.status, ""))
        line.append(c.name, style="bold")
        line.append(": " + c.detail)
        console.print(line)
        if c.fix:
            # the fix holds commands and paths to paste: one line, never wrapped by us
            console.print(Text("    fix: " + c.fix, style="cyan"), soft_wrap=True)


def _table_rows(t: Any, checks: Sequence[Check]) -> None:
    from rich.text import Text

    t.add_column("", justify="center", no_wrap=True)
    t.add_column("check", style="bold", no_wrap=True)
    t.add_column("detail", overflow="fold")
    t.add_column("fix", overflow="fold")
    for c in checks:
        style = _STYLES.get(c.status, "")
        # Text(...) so brackets in paths/messages are never read as rich markup
        t.add_row(Text(SYMBOLS.get(c.status, "?"), style=style), Text(c.name), Text(c.detail), Text(c.fix, style="cyan"))


def _render_summary(checks: Sequence[Check], console: Any) -> None:
    from rich.text import Text

    fails = sum(1 for c in checks if c.status == FAIL)
    warns = sum(1 for c in checks if c.status == WARN)
    if fails:
        summary = Text(f"{fails} failed, {warns} warning(s): fix the ✗ rows before starting the daemon", style="bold red")
    elif warns:
        summary = Text(f"no failures, {warns} warning(s)", style="yellow")
    else:
        summary = Text("all checks passed", style="green")
    console.print(summary)


# --- helpers ----------------------------------------------------------------------------------


def _q(path: os.PathLike[str] | str) -> str:
    return shlex.quote(str(path))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _scrubber(secrets: Sequence[str]) -> Callable[[str], str]:
    """Replace every known secret value by its mask (exact values only: a pattern such as
    ``sk-...`` would also mangle paths and names that merely look like one)."""
    # values under 8 characters are no real key, and replacing them would garble ordinary text
    forms = sorted(
        {(f, mask_secret(s.strip()) or "****") for s in secrets if s and len(s) >= 8 for f in secret_forms(s)},
        key=lambda fm: len(fm[0]),
        reverse=True,
    )

    def scrub(text: str) -> str:
        for f, shown in forms:  # the key as written and as libraries escape it
            if f in text:
                text = text.replace(f, shown)
        return text

    return scrub


def _timeout_runner(timeout: float):
    from batchgrader.ops.service import CommandResult

    def run(argv: Sequence[str]) -> CommandResult:
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return CommandResult(list(argv), 127, "", f"{type(exc).__name__}: {exc}")
        return CommandResult(list(argv), p.returncode, p.stdout, p.stderr)

    return run
