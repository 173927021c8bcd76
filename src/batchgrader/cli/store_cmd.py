"""`bgctl store`: the event log's own commands (``copy``: move a home's SQLite log into a shared
PostgreSQL store).  A thin click layer over :mod:`batchgrader.store.copy`."""

from __future__ import annotations

import click

from batchgrader.cli.context import Ctx, emit_json, no_db_guard
from batchgrader.cli.errors import EXIT_FAILURE, EXIT_USAGE, BgctlError


@click.group("store")
def store() -> None:
    """The event log itself: copy a home's SQLite log into a PostgreSQL store (docs/scaling.md)."""


@store.command("copy")
@click.option(
    "--to",
    "target",
    default=None,
    metavar="postgresql://...",
    help="The PostgreSQL database to copy into (default: the store_url setting).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def store_copy(obj: Ctx, target: str | None, as_json: bool) -> None:
    """Copy the home's SQLite event log into a PostgreSQL store, then check both fold to the same state."""
    from batchgrader.store.backend import is_postgres_url
    from batchgrader.store.copy import CopyRefused, copy_log

    no_db_guard(obj)
    target = target or obj.config().store_url
    if not is_postgres_url(target):
        raise BgctlError(
            "name the PostgreSQL database to copy into: bgctl store copy --to postgresql://USER@HOST/DATABASE", EXIT_USAGE
        )
    assert target is not None
    try:
        res = copy_log(obj.home.db, target)
    except (CopyRefused, ConnectionError) as exc:
        raise BgctlError(str(exc)) from None
    if as_json:
        emit_json(res.as_dict())
    else:
        click.echo(f"copied {res.copied:,} event(s) from {res.source} to {res.target} ({res.already:,} there already)")
        click.echo(f"{res.jobs:,} job(s), last position {res.last_seq:,}")
        if res.same_state:
            click.echo("verified: both logs fold to the same state")
        for d in res.differences:
            click.echo(f"  differs: {d}")
    if not res.same_state:
        raise BgctlError("the two logs do not fold to the same state (see above): do not switch store_url", EXIT_FAILURE)
