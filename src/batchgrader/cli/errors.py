"""Exit codes and the one place where an exception becomes a message and an exit code.

Every ``bgctl`` command runs inside :class:`ErrorMappingGroup`, so a known problem (a bad
argument, a config error, an unknown job) prints ``bgctl: error: ...`` and exits with its code;
a Python traceback is never what a user sees for a mistake they can fix.  The codes are
documented in docs/guide.md ("Exit codes").
"""

from __future__ import annotations

import sys
from typing import Any

import click

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and the answer is "no" (doctor found a failure, cancel refused)
EXIT_USAGE = 2  # bad arguments, an unknown job, an unreadable input file
EXIT_COUNT_PROBLEMS = 3  # `count`/`split`: some rows can never be sent, or the model has no price
EXIT_JOBS_FAILED = 4  # `daemon --once`: every job ended, and at least one of them ended `failed`
EXIT_TEMPFAIL = 75  # EX_TEMPFAIL: another daemon holds the home's lock
EXIT_CONFIG = 78  # EX_CONFIG: config.yaml, pricing.csv, the API key or secrets.env is wrong


class BgctlError(click.ClickException):
    """A refusal or failure with its own exit code (``bgctl: error: <message>`` on stderr)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = exit_code
        setattr(self, "exit_code", exit_code)  # noqa: B010  (click declares it a class variable)

    def show(self, file: Any = None) -> None:
        click.echo(f"bgctl: error: {self.format_message()}", err=True)


def map_exception(exc: BaseException) -> BgctlError | None:
    """The message and exit code for an exception a user can act on; None for a real bug."""
    # imported only now: naming these up front would cost every command ~50 ms of start-up
    from batchgrader.core.configuration.config import ConfigError
    from batchgrader.core.host.secrets import EnvFileError
    from batchgrader.pipeline.pricing import PricingError
    from batchgrader.pipeline.tables import InputError
    from batchgrader.store.queries import QueryError

    if isinstance(exc, (ConfigError, PricingError, EnvFileError)):
        return BgctlError(str(exc), EXIT_CONFIG)
    if isinstance(exc, (InputError, QueryError, FileNotFoundError, IsADirectoryError)):
        return BgctlError(str(exc), EXIT_USAGE)
    if isinstance(exc, PermissionError):
        return BgctlError(f"permission denied: {exc.filename or exc}", EXIT_FAILURE)
    if isinstance(exc, UnicodeDecodeError):
        return BgctlError(f"not valid text: {exc}", EXIT_USAGE)
    return None


class ErrorMappingGroup(click.Group):
    """A click group whose commands never end in a traceback for a known problem."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The top level's commands in sections (cli/helptext.py); a subgroup's as click lists them."""
        if ctx.parent is not None:
            return super().format_commands(ctx, formatter)
        from batchgrader.cli.helptext import format_sections

        format_sections(self, ctx, formatter)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:
            mapped = map_exception(exc)
            if mapped is None:
                raise
            raise mapped from None


def run_main(cli: click.Group) -> None:
    """The console-script entry point around ``cli`` (exit codes above)."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        mapped = map_exception(exc)
        if mapped is None:
            raise
        mapped.show()
        sys.exit(mapped.exit_code)
