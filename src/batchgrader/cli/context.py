"""What every `bgctl` command shares: the home it works on (:class:`Ctx`), JSON output, the
fixed clock of the snapshot tests, and the refusal when no event log exists yet."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import click

from batchgrader.core.host.home import Home


class Ctx:
    def __init__(self, home: str | None):
        self.home = Home.resolve(home)

    def config(self, **flags):
        from batchgrader.core.configuration.config import load_config

        return load_config(self.home, flags=flags)


def fixed_now() -> float | None:
    """``$BGCTL_NOW`` (an ISO time, UTC if no zone) as "now" for ages, for reproducible output
    (the snapshot tests and the docs); None: the real clock."""
    import os

    text = os.environ.get("BGCTL_NOW")
    if not text:
        return None
    dt = datetime.fromisoformat(text)
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def emit_json(obj) -> None:
    """Indented for a person at a terminal, compact (and several times faster) for a pipe."""
    if sys.stdout.isatty():
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))
    else:
        click.echo(json.dumps(obj, ensure_ascii=False, default=str, separators=(",", ":")))


def no_db_guard(obj: Ctx) -> None:
    from batchgrader.store.queries import log_exists

    if not log_exists(obj.home):  # no database yet, or the daemon is creating it
        raise click.ClickException(
            f"no jobs yet: no event log at {obj.home.db} (a daemon starting now creates it): "
            "start the daemon (bgctl daemon) or try `bgctl daemon --sandbox`"
        )
