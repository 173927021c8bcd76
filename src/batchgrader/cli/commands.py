"""`bgctl`: a thin command line over the library. Each command parses, calls, renders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from batchgrader import __version__
from batchgrader.core.home import Home


class Ctx:
    def __init__(self, home: str | None):
        self.home = Home.resolve(home)

    def config(self, **flags):
        from batchgrader.core.config import load_config

        return load_config(self.home, flags=flags)


def emit_json(obj) -> None:
    """Indented for a person at a terminal, compact (and several times faster) for a pipe."""
    if sys.stdout.isatty():
        click.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))
    else:
        click.echo(json.dumps(obj, ensure_ascii=False, default=str, separators=(",", ":")))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    envvar="BATCHGRADER_HOME",
    type=click.Path(file_okay=False),
    help="State root (inbox, outbox, db, logs). Env: BATCHGRADER_HOME.",
)
@click.version_option(__version__, prog_name="bgctl")
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """BatchGrader: grade large text datasets with LLMs at batch prices."""
    ctx.obj = Ctx(home)


@cli.group()
def config() -> None:
    """Inspect the effective configuration."""


@config.command("show")
@click.option("--profile", "-p", default=None, help="Profile to show (default: the top level).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def config_show(obj: Ctx, profile: str | None, as_json: bool) -> None:
    """Print every effective setting and where its value came from (API key masked)."""
    from batchgrader.cli.render import render_config

    rows = obj.config().explain(profile)
    if as_json:
        emit_json({"home": str(obj.home.root), "profile": profile or "default", "settings": rows})
    else:
        render_config(rows, obj.home, profile)


def _profile_opt(f):
    return click.option("--profile", "-p", default=None, help="Profile from config.yaml (default: the top level).")(f)


def _load(obj: Ctx, profile: str | None):
    from batchgrader.pipeline.pricing import load_pricing

    cfg = obj.config()
    return cfg, cfg.profile(profile), load_pricing(cfg.pricing_path())


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_profile_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def count(obj: Ctx, file: Path, profile: str | None, as_json: bool) -> None:
    """Count a file's requests and exact input tokens, plan its chunks, estimate the cost. No API call."""
    from batchgrader.cli.render import render_count
    from batchgrader.pipeline.prepare import prepare

    _cfg, prof, prices = _load(obj, profile)
    summary = prepare(file, prof, obj.home, prices=prices).summary(prices)
    # tiktoken is exact for OpenAI models only; for another provider it is a stand-in estimate
    summary["input_tokens_exact"] = prof.provider == "openai"
    summary["provider"] = prof.provider
    emit_json(summary) if as_json else render_count(summary)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the chunk files (default: work/split/<name> under the home).",
)
@_profile_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def split(obj: Ctx, file: Path, out_dir: Path | None, profile: str | None, as_json: bool) -> None:
    """Write batch-ready JSONL chunk files for FILE and print each file's requests and tokens. No API call."""
    from batchgrader.cli.render import render_split
    from batchgrader.pipeline.prepare import split_file

    _cfg, prof, prices = _load(obj, profile)
    out_dir = out_dir or obj.home.work / "split" / file.stem
    prep, files = split_file(file, prof, obj.home, out_dir, prices=prices)
    summary = prep.summary(prices)
    for chunk, path in zip(summary["chunks"], files):
        chunk["path"] = str(path)
    emit_json(summary) if as_json else render_split(summary)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_profile_opt
@click.pass_obj
def submit(obj: Ctx, file: Path, profile: str | None) -> None:
    """Copy FILE into the inbox atomically (the daemon picks it up)."""
    from batchgrader.pipeline.inbox import submit_file

    if profile:
        obj.config().profile(profile)  # fail now on an unknown profile
    dest = submit_file(obj.home.ensure(), file, profile)
    click.echo(f"queued {dest}")


@cli.command()
@click.option("--once", is_flag=True, help="Process everything in the inbox until every job has ended, then exit 0.")
@click.option("--sandbox", is_flag=True, help="Use the built-in Batch API emulator: SIMULATED results, no API key, no cost.")
@click.pass_obj
def daemon(obj: Ctx, once: bool, sandbox: bool) -> None:
    """Run the daemon in the foreground (as systemd and launchd expect)."""
    from batchgrader.cli.render import render_summary, sandbox_banner
    from batchgrader.daemon.process import Daemon, DaemonError

    live = sys.stdout.isatty()
    if sandbox:
        sandbox_banner()
    d = Daemon(obj.home, sandbox=sandbox, once=once, live=live)
    d.install_signal_handlers()
    try:
        code = d.run()
    except DaemonError as exc:
        err = click.ClickException(str(exc))
        err.exit_code = exc.exit_code  # type: ignore[misc]
        raise err from None
    if once:
        render_summary(d.engine.state, sandbox)
    sys.exit(code)


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="cancelled by user", help="Recorded with the request.")
@click.pass_obj
def cancel(obj: Ctx, job_id: str, reason: str) -> None:
    """Cancel JOB's batches and end it with the partial results written."""
    from batchgrader.daemon.process import daemon_pid, request_control

    request_control(obj.home.ensure(), "cancel", _resolve_job(obj, job_id), reason)
    click.echo("cancel requested" + ("" if daemon_pid(obj.home) else " (applied when the daemon next runs)"))


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="retry requested by user", help="Recorded with the request.")
@click.pass_obj
def retry(obj: Ctx, job_id: str, reason: str) -> None:
    """Resubmit the failed rows of a finished JOB (or submit a held JOB anyway) and rewrite its result."""
    from batchgrader.daemon.process import daemon_pid, request_control

    resolved = _resolve_job(obj, job_id)
    why_not = _not_retryable(obj, resolved)
    if why_not:
        raise click.ClickException(why_not)
    request_control(obj.home.ensure(), "retry", resolved, reason)
    click.echo("retry requested" + ("" if daemon_pid(obj.home) else " (applied when the daemon next runs)"))


@cli.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh every second until interrupted.")
@click.option(
    "--all", "show_all", is_flag=True, help="List every job (the table shows the newest 20 unfinished and 10 finished)."
)
@click.pass_obj
def status(obj: Ctx, job_id: str | None, as_json: bool, watch: bool, show_all: bool) -> None:
    """Jobs with their state, rows, chunks, batches, tokens, cost and last error; or one JOB in detail."""
    from batchgrader.cli.render_status import render_job, render_overview, render_status
    from batchgrader.store import queries as queries

    def show() -> None:
        if job_id:
            detail = queries.job_detail(obj.home, job_id)
            emit_json(detail) if as_json else render_job(detail)
        elif as_json:
            emit_json(queries.status(obj.home))
        elif show_all:
            render_status(queries.status(obj.home), max_finished=None)
        else:
            render_overview(queries.status_overview(obj.home, active_limit=20, finished_limit=10))

    _no_db_guard(obj)
    if not watch:
        return show()
    import time

    from batchgrader.cli.render import console

    try:
        while True:
            console.clear()
            show()
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass


@cli.command()
@click.argument("job_id", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are recorded.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--last", type=int, default=None, help="Only the last N events.")
@click.pass_obj
def events(obj: Ctx, job_id: str | None, follow: bool, as_json: bool, last: int | None) -> None:
    """The event log, newest last."""
    from batchgrader.cli.render_status import render_events
    from batchgrader.store import queries as queries

    _no_db_guard(obj)
    rows = queries.events(obj.home, job_id, last=last)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, ensure_ascii=False, default=str))
    else:
        render_events(rows, show_job=job_id is None)
    if follow:
        after = rows[-1]["seq"] if rows else 0
        try:
            for ev in queries.follow_events(obj.home, job_id, poll=0.5, after=after):
                if as_json:
                    click.echo(json.dumps(ev, ensure_ascii=False, default=str))
                else:
                    render_events([ev], show_job=job_id is None)
        except KeyboardInterrupt:
            pass


@cli.command()
@click.option("--since", default=None, help="First UTC day (YYYY-MM-DD), inclusive.")
@click.option("--until", default=None, help="Last UTC day (YYYY-MM-DD), inclusive.")
@click.option("--by", type=click.Choice(["day", "model", "job"]), default="day", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def costs(obj: Ctx, since: str | None, until: str | None, by: str, as_json: bool) -> None:
    """Billed cost from the token-usage events (not re-estimated), with spend per day as a bar chart."""
    from batchgrader.cli.render_status import render_costs
    from batchgrader.store import queries as queries

    _no_db_guard(obj)
    result = queries.costs(obj.home, since=since, until=until, by=by)
    emit_json(result) if as_json else render_costs(result)


@cli.command()
@click.pass_obj
def rebuild(obj: Ctx) -> None:
    """Recreate the read-side tables (status, costs) from the event log alone."""
    from batchgrader.store.readmodels import rebuild as rebuild_models

    _no_db_guard(obj)
    emit_json(rebuild_models(obj.home.db))


@cli.command()
@click.option("--port", type=int, default=8765, show_default=True, help="Port on 127.0.0.1 (0 picks a free one).")
@click.option("--faults", type=click.Choice(["none", "flaky", "drops", "slow", "chaos"]), default="none", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for faults, answers and output order.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Keep files and batches here across restarts.")
def emulator(port: int, faults: str, seed: int, data_dir: str | None) -> None:
    """Run the local Batch API emulator (SIMULATED results) for offline use with any OpenAI client."""
    from batchgrader.provider.emulator import run_emulator

    run_emulator(port, faults, seed, data_dir)


def _no_db_guard(obj: Ctx) -> None:
    if not obj.home.db.exists():
        raise click.ClickException(
            f"no event log yet at {obj.home.db}: start the daemon (bgctl daemon) or try `bgctl daemon --sandbox`"
        )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def doctor(obj: Ctx, as_json: bool) -> None:
    """Check config, key, API, pricing, tokenizers, permissions, database and daemon; each problem with its fix."""
    from batchgrader.cli.render import console
    from batchgrader.ops.doctor import checks_as_json, exit_code, render_checks, run_checks

    checks = run_checks(obj.home)
    emit_json(checks_as_json(checks)) if as_json else render_checks(checks, console)
    sys.exit(exit_code(checks))


@cli.group()
def service() -> None:
    """Install, remove or inspect the systemd (Linux) or launchd (macOS) service."""


@service.command("install")
@click.option("--user", "mode", flag_value="user", default=True, help="A per-user service (default).")
@click.option("--system", "mode", flag_value="system", help="A system-wide service (run with sudo).")
@click.option("--print", "print_only", is_flag=True, help="Print the unit/plist instead of writing it.")
@click.option("--store-key", is_flag=True, help="Store $OPENAI_API_KEY in <home>/secrets.env (mode 0600) for the service.")
@click.option("--activate", is_flag=True, help="Also run systemctl/launchctl to enable and start it.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def service_install(obj: Ctx, mode: str, print_only: bool, store_key: bool, activate: bool, as_json: bool) -> None:
    """Write the service definition; the API key goes only to a 0600 env file, never into the unit."""
    import os

    from batchgrader.ops.service import ServiceError, install
    from batchgrader.secrets import EnvFileError

    key = os.environ.get("OPENAI_API_KEY") if store_key else None
    if store_key and not key:
        raise click.ClickException("--store-key: OPENAI_API_KEY is not set in this shell")
    try:
        res = install(obj.home, mode=mode, print_only=print_only, api_key=key, activate=activate)
    except (ServiceError, EnvFileError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit_json(res.to_dict())
    elif print_only:
        click.echo(res.content)
    else:
        _echo_steps(res)


@service.command("uninstall")
@click.option("--user", "mode", flag_value="user", default=True, help="The per-user service (default).")
@click.option("--system", "mode", flag_value="system", help="The system-wide service.")
@click.option("--activate", is_flag=True, help="Also stop and disable it.")
@click.pass_obj
def service_uninstall(obj: Ctx, mode: str, activate: bool) -> None:
    """Remove the service definition (the home, its data and secrets.env are left untouched)."""
    from batchgrader.ops.service import ServiceError, uninstall

    try:
        res = uninstall(obj.home, mode=mode, activate=activate)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from None
    _echo_steps(res)


@service.command("status")
@click.option("--user", "mode", flag_value="user", default=None, help="Only the per-user service.")
@click.option("--system", "mode", flag_value="system", help="Only the system-wide service.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def service_status(obj: Ctx, mode: str | None, as_json: bool) -> None:
    """Is the service installed, and is it running?"""
    from batchgrader.ops.service import status

    info = status(obj.home, mode=mode)
    if as_json:
        emit_json(info)
    else:
        for k, v in info.items():
            click.echo(f"{k}: {v}")


def _echo_steps(res) -> None:  # noqa: ANN001
    d = res.to_dict()
    for key in ("path", "env_file"):
        if d.get(key):
            click.echo(f"{key}: {d[key]}")
    for label in ("next_steps", "notes", "warnings"):
        for line in d.get(label) or []:
            click.echo(f"{label.replace('_', ' ')}: {line}")


def _not_retryable(obj: Ctx, job_id: str) -> str | None:
    """Why JOB cannot be retried (a rejected file has no rows to send again), or None."""
    from batchgrader.store.queries import reading

    with reading(obj.home) as conn:
        row = conn.execute(
            "SELECT payload FROM events WHERE job_id = ? AND type = 'FileRejected' ORDER BY seq DESC LIMIT 1", (job_id,)
        ).fetchone()
    if row is None:
        return None
    try:
        reason = json.loads(row[0]).get("reason", "")
    except (ValueError, AttributeError):
        reason = ""
    return (
        f"job {job_id} cannot be retried: its file was rejected before any row was read"
        + (f" ({reason})" if reason else "")
        + ". Fix the file and put it in the inbox again."
    )


def _resolve_job(obj: Ctx, prefix: str) -> str:
    from batchgrader.store.queries import reading, resolve_job

    _no_db_guard(obj)
    with reading(obj.home) as conn:
        return resolve_job(conn, prefix)


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        # imported only now: naming these up front would cost every command ~50 ms of start-up
        from batchgrader.core.config import ConfigError
        from batchgrader.pipeline.pricing import PricingError
        from batchgrader.pipeline.tables import InputError
        from batchgrader.store.queries import AmbiguousJob, UnknownJob

        if isinstance(exc, (ConfigError, InputError, PricingError, FileNotFoundError, UnknownJob, AmbiguousJob)):
            click.echo(f"bgctl: error: {exc}", err=True)
            sys.exit(2)
        raise
