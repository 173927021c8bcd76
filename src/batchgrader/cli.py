"""`bgctl`: a thin command line over the library. Each command parses, calls, renders."""

from __future__ import annotations

import json
import sys

import click

from . import __version__
from .config import ConfigError, load_config
from .home import Home


class Ctx:
    def __init__(self, home: str | None):
        self.home = Home.resolve(home)

    def config(self, **flags):
        return load_config(self.home, flags=flags)


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="BATCHGRADER_HOME", type=click.Path(file_okay=False), help="State root (inbox, outbox, db, logs). Env: BATCHGRADER_HOME.")
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
    from .render import render_config

    rows = obj.config().explain(profile)
    if as_json:
        emit_json({"home": str(obj.home.root), "profile": profile or "default", "settings": rows})
    else:
        render_config(rows, obj.home, profile)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except ConfigError as exc:  # pragma: no cover - click handles most paths; see _errors
        click.echo(f"bgctl: configuration error: {exc}", err=True)
        sys.exit(2)
