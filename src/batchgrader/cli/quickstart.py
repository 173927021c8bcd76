"""`bgctl init` and `bgctl grade`: start a home, and grade one file from start to result in one
command.  Thin: :mod:`batchgrader.ops.starter` writes the files, `submit`'s checks queue the file
(:func:`batchgrader.ops.actions.submit_action`) and :mod:`batchgrader.ops.grade` waits for its job."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from batchgrader.cli.complete import complete_profile
from batchgrader.cli.context import Ctx, emit_json
from batchgrader.cli.errors import EXIT_FAILURE, EXIT_USAGE, BgctlError


@click.command()
@click.argument("directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def init(obj: Ctx, directory: Path | None, as_json: bool) -> None:
    """Write a commented starter config.yaml and an example data file into the home (DIR: that folder as the home).

    Asks nothing and overwrites nothing: a file already there is kept, and listed."""
    from batchgrader.core.host.home import Home
    from batchgrader.ops.starter import init_home

    home = Home.resolve(directory) if directory is not None else obj.home
    res = init_home(home)
    prefix = "bgctl" if Home.resolve(None).root == home.root else f"bgctl --home {shlex.quote(str(home.root))}"
    res["next"] = [
        f"{prefix} grade {shlex.quote(res['example'])} --sandbox",
        f"{prefix} grade YOUR_FILE.csv",
    ]
    if as_json:
        emit_json(res)
        return
    for path in res["written"]:
        click.echo(f"wrote {path}")
    for path in res["kept"]:
        click.echo(f"kept {path} (already there, left alone)")
    click.echo("next:")
    click.echo(f"  {res['next'][0]}    # try it: simulated answers, no API key, no cost")
    click.echo(f"  {res['next'][1]}    # for real: set OPENAI_API_KEY, edit config.yaml's model and prompts")


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--profile", "-p", default=None, help="Profile from config.yaml (default: the top level).", shell_complete=complete_profile
)
@click.option(
    "--sandbox", is_flag=True, help="When no daemon runs, run it with the built-in emulator: SIMULATED results, no API key."
)
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=None, help="Stop waiting after this many seconds (the job goes on)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the job's status row).")
@click.pass_obj
def grade(obj: Ctx, file: Path, profile: str | None, sandbox: bool, timeout: float | None, as_json: bool) -> None:
    """Queue FILE (as submit does) and wait until its job ends; print the result's path and a summary.

    A running daemon grades it; else the daemon runs in the foreground until the inbox is done,
    as `daemon --once` does. Exit 0, or 4 if the job ended failed."""
    from batchgrader.core.host.lock import DaemonError
    from batchgrader.ops import grade as g
    from batchgrader.ops.actions import submit_action

    try:
        g.check_mode(obj.home, sandbox)
    except g.GradeError as exc:
        raise BgctlError(str(exc), EXIT_USAGE) from None
    after = g.log_position(obj.home)
    res = submit_action(obj.home, file, profile, obj.config)
    queued = g.Queued(Path(res["path"]), after)
    progress = None
    if not as_json and sys.stderr.isatty():

        def progress(row: dict) -> None:
            click.echo("\r\x1b[K" + g.progress_line(row), nl=False, err=True)

    where = "the running daemon takes it" if res["daemon_running"] else "running the daemon until it ends"
    click.echo(
        f"queued {res['path']}: {where}" + (" (SANDBOX: simulated answers)" if sandbox and not res["daemon_running"] else ""),
        err=True,
    )
    try:
        row = g.follow(obj.home, queued, sandbox=sandbox, timeout=timeout, on_progress=progress, install_signals=True)
    except g.GradeError as exc:
        raise BgctlError(str(exc), EXIT_FAILURE) from None
    except DaemonError as exc:  # the daemon cannot start: its code, as `bgctl daemon`
        raise BgctlError(str(exc), exc.exit_code) from None
    finally:
        if progress is not None:
            click.echo("\r\x1b[K", nl=False, err=True)
    if row.get("sandbox") != sandbox and res["daemon_running"]:
        click.echo(f"bgctl: note: the running daemon took it as a {'sandbox' if row.get('sandbox') else 'real'} job", err=True)
    if as_json:
        emit_json(row)
    else:
        click.echo(g.summary_line(row))
        if row.get("result_path"):
            click.echo(f"result: {row['result_path']}")
        if row.get("error_path"):
            click.echo(f"errors: {row['error_path']}")
    sys.exit(g.exit_code(row))


QUICKSTART_COMMANDS = (init, grade)
