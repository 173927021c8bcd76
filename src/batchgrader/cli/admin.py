"""`bgctl`'s administrative commands: the answers store (`cache`), the model catalogue
(`models`), `doctor`, the standalone `emulator`, and the system service (`service`).  Each is a
click command of its own; :mod:`batchgrader.cli.commands` adds them to `bgctl`."""

from __future__ import annotations

import sys

import click

from batchgrader.cli.context import Ctx, emit_json, no_db_guard
from batchgrader.core.configuration.providers import PROVIDER_FACTS


@click.group()
def cache() -> None:
    """The answers store: answers reused for identical requests (see docs/configuration.md, cache_days)."""


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def cache_stats(obj: Ctx, as_json: bool) -> None:
    """How many answers are stored, how much text, how old, per model."""
    from batchgrader.store.answers import home_stats

    st = home_stats(obj.home)
    if as_json:
        emit_json(st)
        return
    click.echo(f"answers: {st['answers']:,} ({st['content_bytes']:,} bytes of answer text)")
    click.echo(f"oldest: {st['oldest'] or '-'}  newest: {st['newest'] or '-'}")
    for m in st["by_model"]:
        click.echo(f"  {m['answers']:>10,}  {m['model']}  ({m['provider']})")


@cache.command("clear")
@click.option(
    "--older-than", "older_than", type=click.FloatRange(min=0), default=None, help="Only answers stored more than D days ago."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def cache_clear(obj: Ctx, older_than: float | None, as_json: bool) -> None:
    """Remove stored answers (all, or the older ones). The event log is never touched."""
    from batchgrader.store.answers import home_clear

    no_db_guard(obj)
    removed = home_clear(obj.home, older_than_days=older_than)
    if as_json:
        emit_json({"removed": removed, "older_than_days": older_than})
    else:
        click.echo(f"removed {removed:,} stored answers")


@click.command()
@click.option("--port", type=int, default=8765, show_default=True, help="Port on 127.0.0.1 (0 picks a free one).")
@click.option("--faults", type=click.Choice(["none", "flaky", "drops", "slow", "chaos"]), default="none", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for faults, answers and output order.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="Keep files and batches here across restarts.")
def emulator(port: int, faults: str, seed: int, data_dir: str | None) -> None:
    """Run the local Batch API emulator (SIMULATED results) for offline use with any OpenAI client."""
    from batchgrader.emulator import run_emulator

    run_emulator(port, faults, seed, data_dir)


@click.command()
@click.option(
    "--provider",
    type=click.Choice([name for name, f in PROVIDER_FACTS.items() if f.in_catalogue]),
    default=None,
    help="Only this provider's models.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: every column, source and notes included.")
@click.option(
    "--check",
    is_flag=True,
    help=(
        "List where the shipped prices and genai-prices disagree, today and on each later day a dated price changes; "
        "exit 1 when a difference is not declared deliberate."
    ),
)
@click.pass_obj
def models(obj: Ctx, provider: str | None, as_json: bool, check: bool) -> None:
    """List the model catalogue: Batch prices and where they come from, limits, reasoning and temperature rules.

    Prices come from genai-prices where it has the model, else from the shipped rows, with your
    pricing file's rows merged over them (docs/providers.md).  --check compares the shipped
    prices with genai-prices, today and on each later day a dated price changes, and exits 1 on a
    difference not declared deliberate."""
    from batchgrader.cli.context import fixed_now
    from batchgrader.cli.render import render_models, render_price_check
    from batchgrader.pipeline.catalogue import catalogue_rows, today_of
    from batchgrader.pipeline.pricing import load_pricing

    today = today_of(fixed_now())
    if check:
        from batchgrader.pipeline.maintained import change_days, differences_from, genai_prices_version
        from batchgrader.pipeline.pricing import shipped_prices

        shipped = {k: p for k, p in shipped_prices().items() if provider in (None, p.spec.provider)}
        diffs = differences_from(shipped, today)  # today and each later day a dated price changes
        days = [today, *change_days(shipped, today)]
        undeclared = [d for d in diffs if d.deliberate is None]
        if as_json:
            emit_json(
                {
                    "genai_prices": genai_prices_version(),
                    "day": today.isoformat(),
                    "days": [d.isoformat() for d in days],
                    "rows": len(shipped),
                    "differences": [d.as_dict() for d in diffs],
                    "undeclared": len(undeclared),
                }
            )
        else:
            render_price_check(diffs, len(shipped), genai_prices_version(), [d.isoformat() for d in days])
        if undeclared:
            sys.exit(1)
        return
    config = obj.config()
    table = load_pricing(config.pricing_path(), day=today)
    version = config.default.get("anthropic_api_version")  # the anthropic-version header sent
    rows = [r for r in catalogue_rows(table, version) if provider in (None, r["provider"])]
    emit_json({"models": rows}) if as_json else render_models(rows)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--sandbox", is_flag=True, help="Check for `bgctl daemon --sandbox`: no API key needed.")
@click.pass_obj
def doctor(obj: Ctx, as_json: bool, sandbox: bool) -> None:
    """Check config, key, API, pricing, tokenizers, permissions, database and daemon; each problem with its fix.

    Exits 1 when a check fails, including a missing API key (unless --sandbox)."""
    from batchgrader.cli.context import fixed_now
    from batchgrader.cli.render import make_console
    from batchgrader.ops.doctor import checks_as_json, exit_code, render_checks, run_checks
    from batchgrader.pipeline.catalogue import today_of

    checks = run_checks(obj.home, require_key=not sandbox, sandbox=sandbox, today=today_of(fixed_now()))
    emit_json(checks_as_json(checks)) if as_json else render_checks(checks, make_console())
    sys.exit(exit_code(checks))


@click.group()
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

    from batchgrader.core.host.secrets import EnvFileError
    from batchgrader.ops.service import ServiceError, install

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
        for line in service_status_lines(info):
            click.echo(line)


def service_status_lines(info: dict) -> list[str]:
    """``bgctl service status`` in words: installed or not, running or not, and the secrets file."""
    kind = "systemd unit" if info.get("manager") == "systemd" else "launchd agent"
    where = f"{info.get('mode')} {kind} {info.get('path')}"
    lines = [f"installed: yes ({where})" if info.get("installed") else f"installed: no ({where} does not exist)"]
    if not info.get("installed"):
        lines.append(f"  install it with: bgctl service install --{info.get('mode') or 'user'}")
    active, detail = info.get("active"), info.get("detail")
    if active in ("active", "running"):  # systemd's is-active, launchd's state
        running = f"yes ({active})"
    elif active:
        running = f"no ({active})"
    else:
        running = "unknown" + (f": {detail}" if detail else "")
        detail = None
    lines.append(f"running: {running}" + (f" ({detail})" if detail else ""))
    env = info.get("env_file")
    if not info.get("env_file_present"):
        lines.append(f"secrets file: none at {env} (bgctl service install --store-key writes it)")
    else:
        mode = info.get("env_file_mode") or "?"
        private = mode in ("0600", "0400")
        lines.append(f"secrets file: {env}, mode {mode}" + ("" if private else f": others can read it; run chmod 600 {env}"))
    return lines


def _echo_steps(res) -> None:  # noqa: ANN001
    d = res.to_dict()
    for key in ("path", "env_file"):
        if d.get(key):
            click.echo(f"{key}: {d[key]}")
    for label in ("next_steps", "notes", "warnings"):
        for line in d.get(label) or []:
            click.echo(f"{label.replace('_', ' ')}: {line}")


ADMIN_COMMANDS = (cache, emulator, models, doctor, service)
