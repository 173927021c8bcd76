"""Shell completion of job ids and profile names (click's ``shell_complete``): read-only and
quiet, since a completion that fails must print nothing (no database yet, a config.yaml that
does not load: no suggestions)."""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem


def _home(ctx: click.Context) -> Any:
    """The home the command line names (``--home`` or ``$BATCHGRADER_HOME``): during completion
    the group's callback does not run, so ``ctx.obj`` is not set."""
    from batchgrader.core.host.home import Home

    return Home.resolve(ctx.find_root().params.get("home"))


def complete_job_id(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The job ids starting with ``incomplete``, newest first, with the file name as help."""
    from batchgrader.store.queries import job_ids

    try:
        found = job_ids(_home(ctx), incomplete)
    except Exception:  # noqa: BLE001 - no database, a locked or damaged one: no suggestion
        return []
    return [CompletionItem(job_id, help=f"{file or '-'} ({state})") for job_id, file, state in found]


def complete_profile(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The profile names of config.yaml starting with ``incomplete``."""
    from batchgrader.core.configuration.config import load_config

    try:
        names = sorted(load_config(_home(ctx)).profiles)
    except Exception:  # noqa: BLE001 - a config.yaml that does not load: no suggestion
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]
