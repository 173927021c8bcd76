"""`bgctl`: a thin command line over the library. Each command parses, calls, renders."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from batchgrader import __version__
from batchgrader.cli import helptext
from batchgrader.cli.admin import ADMIN_COMMANDS
from batchgrader.cli.complete import complete_job_id, complete_profile
from batchgrader.cli.context import Ctx, emit_json, fixed_now, no_db_guard
from batchgrader.cli.errors import (
    EXIT_COUNT_PROBLEMS,
    EXIT_FAILURE,
    EXIT_JOBS_FAILED,
    EXIT_USAGE,
    BgctlError,
    ErrorMappingGroup,
    run_main,
)
from batchgrader.cli.evals import EVALS_COMMANDS
from batchgrader.cli.quickstart import QUICKSTART_COMMANDS
from batchgrader.cli.store_cmd import store


@click.group(cls=ErrorMappingGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--profile", "-p", default=None, help="Profile to show (default: the top level).", shell_complete=complete_profile)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def config_show(obj: Ctx, profile: str | None, as_json: bool) -> None:
    """Print every effective setting and where its value came from (API key masked)."""
    from batchgrader.cli.render import render_config
    from batchgrader.pipeline.catalogue import with_catalogue_bounds

    rows = with_catalogue_bounds(obj.config()).explain(profile)
    if as_json:
        emit_json({"home": str(obj.home.root), "profile": profile or "default", "settings": rows})
    else:
        render_config(rows, obj.home, profile)


def _profile_opt(f):
    return click.option(
        "--profile",
        "-p",
        default=None,
        help="Profile from config.yaml (default: the top level).",
        shell_complete=complete_profile,
    )(f)


def _load(obj: Ctx, profile: str | None, as_json: bool = False):
    """The configuration checked against the catalogue, the profile and the catalogue; a model
    that shuts down soon is warned about on standard error (not with ``--json``: the caller adds
    :func:`_shutdown_notes` to its JSON)."""
    from batchgrader.pipeline.catalogue import load_checked, today_of

    cfg = obj.config()
    cfg.profile(profile)  # an unknown profile is named before anything else
    # a model missing from the catalogue is reported by the count itself (exit 3), not here
    cfg, table = load_checked(cfg, missing=False, today=today_of(fixed_now()))
    if not as_json:
        for warning in _shutdown_notes(cfg, table):
            click.echo(f"warning: {warning}", err=True)
    return cfg, cfg.profile(profile), table


def _shutdown_notes(cfg, table) -> list[str]:  # noqa: ANN001
    from batchgrader.pipeline.catalogue import shutdown_warnings, today_of

    return shutdown_warnings(cfg, table, today_of(fixed_now()))


def _warn_shutdowns(obj: Ctx) -> None:
    """``status``: a warning for each profile whose model shuts down soon (nothing when the
    configuration or the catalogue does not load: other commands name that)."""
    from batchgrader.core.configuration.config import ConfigError
    from batchgrader.pipeline.catalogue import shutdown_warnings, today_of
    from batchgrader.pipeline.pricing import PricingError, load_pricing

    try:
        cfg = obj.config()
        warnings = shutdown_warnings(cfg, load_pricing(cfg.pricing_path()), today_of(fixed_now()))
    except (ConfigError, PricingError, OSError):
        return
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_profile_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--sandbox", is_flag=True, help="Look for stored answers of sandbox (SIMULATED) jobs instead of real ones.")
@click.pass_obj
def count(obj: Ctx, file: Path, profile: str | None, as_json: bool, sandbox: bool) -> None:
    """Count a file's requests and exact input tokens, plan its chunks, estimate the cost. No API call.

    Rows that stored answers (or identical rows of the file) would answer are shown apart."""
    from batchgrader.cli.render import render_count, render_panel_count
    from batchgrader.ops.count import count_file, count_panel

    cfg, prof, prices = _load(obj, profile, as_json)
    if prof.values.get("judges"):  # a panel: each judge's model, samples and output bound, and their sum
        summary = count_panel(obj.home, file, cfg, prof, prices, sandbox=sandbox)
        emit_json(summary) if as_json else render_panel_count(summary)
    else:
        summary = count_file(obj.home, file, prof, prices, sandbox=sandbox)
        if as_json and (notes := _shutdown_notes(cfg, prices)):
            summary["warnings"] = [*summary.get("warnings", []), *notes]
        emit_json(summary) if as_json else render_count(summary)
    if _unsendable(summary) or summary.get("pricing_error"):
        sys.exit(EXIT_COUNT_PROBLEMS)  # a script must not read "0" as "ready to send"


def _unsendable(summary: dict) -> bool:
    """Rows that can never be sent, but for those ``skip_empty`` leaves out by choice."""
    return any(e.get("code") != "empty_input" for e in summary.get("row_errors") or ())


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
    summary["duplicate_rows"] = prep.duplicate_rows
    for chunk, path in zip(summary["chunks"], files):
        chunk["path"] = str(path)
    emit_json(summary) if as_json else render_split(summary)
    if _unsendable(summary) or summary.get("pricing_error"):
        sys.exit(EXIT_COUNT_PROBLEMS)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_profile_opt
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--fresh", is_flag=True, help="Send every row: reuse no stored answer and merge no identical rows.")
@click.pass_obj
def submit(obj: Ctx, file: Path, profile: str | None, as_json: bool, fresh: bool) -> None:
    """Copy FILE into the inbox atomically (the daemon picks it up)."""
    from batchgrader.ops.actions import submit_action

    res = submit_action(obj.home, file, profile, obj.config, fresh=fresh)
    emit_json(res) if as_json else click.echo(res["message"])


@cli.command()
@click.option(
    "--once",
    is_flag=True,
    help="Process everything in the inbox until every job has ended, then exit: 0, or 4 if a job ended failed.",
)
@click.option("--sandbox", is_flag=True, help="Use the built-in Batch API emulator: SIMULATED results, no API key, no cost.")
@click.pass_obj
def daemon(obj: Ctx, once: bool, sandbox: bool) -> None:
    """Run the daemon in the foreground (as systemd and launchd expect)."""
    from batchgrader.cli.render import LiveView, render_summary, sandbox_banner
    from batchgrader.daemon.process import Daemon, DaemonError

    view = LiveView(sandbox=sandbox) if sys.stdout.isatty() else None
    if sandbox:
        sandbox_banner()
    d = Daemon(obj.home, sandbox=sandbox, once=once, view=view)
    d.install_signal_handlers()
    started = datetime.now(UTC).isoformat(timespec="microseconds")
    try:
        code = d.run()
    except DaemonError as exc:
        raise BgctlError(str(exc), exc.exit_code) from None
    if once:
        render_summary(d.engine.ctx.state, sandbox, since=started)
        failed = sorted(j.job_id for j in d.engine.ctx.state.jobs.values() if j.ended == "failed" and j.updated_ts >= started)
        if code == 0 and failed:
            click.echo(f"bgctl: {len(failed)} job(s) failed: {', '.join(failed)} (exit {EXIT_JOBS_FAILED})", err=True)
            code = EXIT_JOBS_FAILED
    sys.exit(code)


@cli.command()
@click.argument("job_id", shell_complete=complete_job_id)
@click.option("--reason", default="cancelled by user", help="Recorded with the request.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def cancel(obj: Ctx, job_id: str, reason: str, as_json: bool) -> None:
    """Cancel JOB's batches and end it with the partial results written."""
    from batchgrader.ops.actions import control_action

    no_db_guard(obj)
    _answer(control_action(obj.home, "cancel", job_id, reason), as_json)


@cli.command()
@click.argument("job_id", shell_complete=complete_job_id)
@click.option("--reason", default="retry requested by user", help="Recorded with the request.")
@click.option(
    "--max-completion-tokens",
    "bound",
    type=click.IntRange(min=1),
    default=None,
    help="The output bound of the rows sent again (e.g. for rows failed as truncated).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def retry(obj: Ctx, job_id: str, reason: str, bound: int | None, as_json: bool) -> None:
    """Resubmit the failed rows of a finished JOB (or submit a held JOB anyway) and rewrite its result."""
    from batchgrader.ops.actions import control_action

    no_db_guard(obj)
    _answer(control_action(obj.home, "retry", job_id, reason, max_completion_tokens=bound), as_json)


def _answer(res: dict, as_json: bool) -> None:
    """Print a cancel/retry answer; a refusal exits 1 (the request was not recorded)."""
    if as_json:
        emit_json(res)
    elif res["accepted"]:
        click.echo(res["message"])
    if not res["accepted"]:
        if as_json:
            sys.exit(EXIT_FAILURE)
        raise BgctlError(res["message"], EXIT_FAILURE)


@cli.command()
@click.argument("job_id", required=False, shell_complete=complete_job_id)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh every second until interrupted.")
@click.option(
    "--all", "show_all", is_flag=True, help="List every job (the table shows the newest 20 unfinished and 10 finished)."
)
@click.pass_obj
def status(obj: Ctx, job_id: str | None, as_json: bool, watch: bool, show_all: bool) -> None:
    """Jobs with their state, rows, chunks, batches, tokens, cost and last error; or one JOB in detail."""
    from batchgrader.cli.render_job import render_job
    from batchgrader.cli.render_status import (
        render_leases,
        render_overview,
        render_status,
        render_waiting,
        unfinished_jobs,
    )
    from batchgrader.fsio import shown_names
    from batchgrader.ops.actions import daemon_info, inbox_files, note_unknown_profiles
    from batchgrader.store import queries as queries

    def show() -> None:
        has_db = queries.log_exists(obj.home)  # False also while the daemon is creating it
        if job_id:
            no_db_guard(obj)
            detail = queries.job_detail(obj.home, job_id, now=fixed_now())
            emit_json(detail) if as_json else render_job(shown_names(detail))
            return
        inbox = inbox_files(obj.home)
        if any(f["profile"] != "default" for f in inbox):
            note_unknown_profiles(obj.home, inbox, _profile_names(obj))
        leases = queries.leases(obj.home, now=fixed_now())  # None: the SQLite file (no leases)
        if as_json:  # the jobs, the files still waiting in the inbox (state "inbox", no job id yet), the leases
            jobs = queries.status(obj.home, now=fixed_now()) if has_db else []
            held = [{"job_id": None, "state": "lease", **x} for x in leases or ()]
            emit_json(jobs + [{"job_id": None, "state": "inbox", **f} for f in inbox] + held)
            return
        shown: dict = {"jobs": []}
        if not has_db:
            render_status([])
        elif show_all:
            shown["jobs"] = shown_names(queries.status(obj.home, now=fixed_now()))
            render_status(shown["jobs"], max_finished=None)
        else:
            shown = shown_names(queries.status_overview(obj.home, active_limit=20, finished_limit=10, now=fixed_now()))
            render_overview(shown)
        render_waiting(shown_names(inbox), daemon_info(obj.home), unfinished=unfinished_jobs(shown))
        render_leases(leases)

    if not job_id and not as_json:
        _warn_shutdowns(obj)
    if not watch or job_id or as_json:
        return show()
    from batchgrader.cli.render_watch import watch_loop

    watch_loop(obj.home, show_all, fixed_now())


@cli.command()
@click.argument("job_id", required=False, shell_complete=complete_job_id)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they are recorded.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option("--last", type=int, default=None, help="Only the last N events.")
@click.pass_obj
def events(obj: Ctx, job_id: str | None, follow: bool, as_json: bool, last: int | None) -> None:
    """The event log, newest last."""
    from batchgrader.cli.render_events import render_events
    from batchgrader.fsio import shown_names
    from batchgrader.store import log_queries

    no_db_guard(obj)
    rows = log_queries.events(obj.home, job_id, last=last)
    if as_json:
        for r in rows:
            click.echo(json.dumps(r, ensure_ascii=False, default=str))
    else:
        render_events(shown_names(rows), show_job=job_id is None)
    if follow:
        after = rows[-1]["seq"] if rows else 0
        try:
            for ev in log_queries.follow_events(obj.home, job_id, poll=0.5, after=after):
                if as_json:
                    click.echo(json.dumps(ev, ensure_ascii=False, default=str))
                else:
                    render_events(shown_names([ev]), show_job=job_id is None)
        except KeyboardInterrupt:
            pass


@cli.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines as the daemon writes them.")
@click.option("--since", default=None, help="Only lines from this UTC time (YYYY-MM-DD[ HH:MM[:SS]]) or age (30s, 10m, 2h, 1d).")
@click.option("--lines", "-n", type=click.IntRange(min=0), default=None, help="Only the last N lines (before following).")
@click.option("--max-seconds", type=click.FloatRange(min=0), default=None, help="With -f: stop after this many seconds.")
@click.option("--until", "until_text", default=None, help="With -f: stop after the first line containing this text.")
@click.pass_obj
def logs(obj: Ctx, follow: bool, since: str | None, lines: int | None, max_seconds: float | None, until_text: str | None) -> None:
    """The daemon's log (<home>/logs/daemon.log): when it started and stopped and why, warnings and errors."""
    from batchgrader.ops.logs import LogError, log_files, parse_since, read_lines
    from batchgrader.ops.logs import follow as follow_log

    try:
        cut = parse_since(since) if since else None
    except LogError as exc:
        raise BgctlError(str(exc), EXIT_USAGE) from None
    if not log_files(obj.home) and not follow:
        raise BgctlError(f"no daemon log yet in {obj.home.logs}: it is written once `bgctl daemon` has run", EXIT_FAILURE)
    shown = read_lines(obj.home, cut)
    for line in shown[max(0, len(shown) - lines) :] if lines is not None else shown:
        click.echo(line)
    if follow:
        try:
            for line in follow_log(obj.home, max_seconds=max_seconds, until=until_text):
                click.echo(line)
        except KeyboardInterrupt:
            pass


@cli.command()
@click.option("--since", default=None, help="First UTC day (YYYY-MM-DD), inclusive.")
@click.option("--until", default=None, help="Last UTC day (YYYY-MM-DD), inclusive.")
@click.option(
    "--by",
    type=click.Choice(["day", "model", "job", "route"]),
    default="day",
    show_default=True,
    help="Group by UTC day, model, job, or route (batch, preflight, flex, online; reused answers' savings only in the totals).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def costs(obj: Ctx, since: str | None, until: str | None, by: str, as_json: bool) -> None:
    """Billed cost from the token-usage events (not re-estimated), with spend per day as a bar chart."""
    from batchgrader.cli.render_costs import render_costs
    from batchgrader.store import costs as costs_mod

    no_db_guard(obj)
    result = costs_mod.costs(obj.home, since=since, until=until, by=by)
    emit_json(result) if as_json else render_costs(result)


@cli.command()
@click.argument("job_id", shell_complete=complete_job_id)
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained HTML page (inline SVG charts, works offline).",
)
@click.option(
    "--disagreements",
    "disagreements_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the labelled rows whose answer differs from the label (reference_column), in the input's format.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the same figures).")
@click.pass_obj
def report(obj: Ctx, job_id: str, html_file: Path | None, disagreements_file: Path | None, as_json: bool) -> None:
    """How a job went: rows, tokens and cost, time per phase, score distributions, agreement with human labels."""
    from batchgrader.reports.report import load_report
    from batchgrader.reports.report_text import render_text

    no_db_guard(obj)
    figures = load_report(obj.home, job_id)
    if disagreements_file is not None:
        from batchgrader.reports.disagreements import DisagreementsError, write_disagreements

        try:
            figures["disagreements"] = write_disagreements(obj.home, job_id, disagreements_file)
        except DisagreementsError as exc:
            raise click.ClickException(str(exc)) from None
        except FileExistsError:
            raise click.ClickException(f"{disagreements_file} exists already: name a new file (it is never replaced)") from None
    if html_file is not None:
        from batchgrader.fsio import atomic_write_bytes
        from batchgrader.reports.report_html import render_html

        atomic_write_bytes(html_file, render_html(figures).encode("utf-8"))
    if as_json:
        emit_json(figures)
    else:
        click.echo(render_text(figures), nl=False)
        if html_file is not None:
            click.echo(f"HTML report: {html_file}")
        if disagreements_file is not None:
            from batchgrader.reports.disagreements import disagreements_line

            click.echo(disagreements_line(figures["disagreements"]))


@cli.command()
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path), default=Path("bgctl-examples"))
def examples(dest: Path) -> None:
    """Copy the example files shipped with bgctl into DEST (default: ./bgctl-examples); never overwrites."""
    from importlib.resources import files

    src = files("batchgrader") / "data" / "examples"
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(src.iterdir(), key=lambda p: p.name):
        target = dest / item.name
        if target.exists():
            click.echo(f"kept {target} (already there)")
            continue
        target.write_bytes(item.read_bytes())
        click.echo(f"wrote {target}")


@cli.command()
@click.pass_obj
def rebuild(obj: Ctx) -> None:
    """Recreate the read-side tables (status, costs) from the event log alone."""
    from batchgrader.store.readmodels import rebuild as rebuild_models

    no_db_guard(obj)
    emit_json(rebuild_models(obj.home.db))


def _profile_names(obj: Ctx) -> list[str] | None:
    """The config's profile names, or None when the config cannot be read (its error is shown by
    the commands that need it)."""
    from batchgrader.core.configuration.config import ConfigError

    try:
        return list(obj.config().profiles)
    except ConfigError:
        return None


for _command in ADMIN_COMMANDS:  # bgctl's administrative commands (cli/admin.py)
    cli.add_command(_command)
for _command in QUICKSTART_COMMANDS:  # bgctl init, bgctl grade (cli/quickstart.py)
    cli.add_command(_command)
cli.add_command(store)  # bgctl store copy (cli/store_cmd.py)
for _command in EVALS_COMMANDS:  # bgctl evals (cli/evals.py)
    cli.add_command(_command)
helptext.apply(cli)  # whole one-line summaries and an example in each command's --help (cli/helptext.py)


def main() -> None:
    run_main(cli)
