"""Each command's one-line summary (whole, as ``bgctl --help`` lists it: click would cut a
docstring's first sentence mid-word) and an example at the end of its ``--help``.

:func:`apply` sets them on the command tree; a command that brings its own ``short_help`` or
``epilog`` keeps it.  ``tests/test_stumbles.py`` checks that every command has both and that each
example parses."""

from __future__ import annotations

import click

# command path -> (summary, examples)
HELP: dict[str, tuple[str, tuple[str, ...]]] = {
    "cache": ("The stored answers reused for identical requests.", ("bgctl cache stats",)),
    "cache clear": ("Remove stored answers (all, or the older ones).", ("bgctl cache clear --older-than 30",)),
    "cache stats": ("How many answers are stored, how large and how old.", ("bgctl cache stats",)),
    "cancel": ("Cancel a job, keeping the rows already answered.", ('bgctl cancel 78db4dc4dc36 --reason "wrong prompt"',)),
    "config": ("Inspect the effective configuration.", ("bgctl config show --profile scored",)),
    "config show": ("Every effective setting and where it came from.", ("bgctl config show --profile scored",)),
    "costs": ("Billed cost by day, model, job or route.", ("bgctl costs --by model --since 2026-11-01",)),
    "count": ("Exact tokens, chunk plan and cost of a file; nothing is sent.", ("bgctl count answers.csv --profile scored",)),
    "daemon": ("Run the daemon in the foreground.", ("bgctl daemon", "bgctl daemon --sandbox --once")),
    "doctor": ("Check everything the daemon needs, each problem with its fix.", ("bgctl doctor", "bgctl doctor --sandbox")),
    "emulator": ("Run the Batch API emulator as a local server (SIMULATED).", ("bgctl emulator --port 8765 --faults flaky",)),
    "events": ("The event log, in order (newest last).", ("bgctl events 78db4dc4dc36 --last 20",)),
    "evals": ("OpenAI Evals at batch price: import, run, read run.json.", ("bgctl evals import eval.json --data items.jsonl",)),
    "evals import": (
        "Import an eval as OpenAI returned it; queue its model criteria.",
        (
            "bgctl evals import eval.json --data items.jsonl",
            "bgctl evals import eval.json --output-items output_items.jsonl --dry-run",
        ),
    ),
    "evals list": ("The evals imported into the home.", ("bgctl evals list",)),
    "evals results": (
        "An eval's run.json, output items and pass rates, once its jobs ended.",
        ("bgctl evals results eval_67abd54d --wait",),
    ),
    "examples": ("Copy the shipped example files into a folder.", ("bgctl examples ./bgctl-examples",)),
    "grade": (
        "Queue a file and wait until its job ends; print the result's path.",
        ("bgctl grade answers.csv --profile scored", "bgctl grade reviews.csv --sandbox"),
    ),
    "init": ("Write a starter config.yaml and example file; overwrite nothing.", ("bgctl init ./bg-home",)),
    "logs": ("The daemon's log: starts, stops, warnings and errors.", ("bgctl logs -f --max-seconds 60",)),
    "models": ("The model catalogue: prices, limits and rules.", ("bgctl models --provider anthropic",)),
    "rebuild": ("Recreate the status and cost tables from the event log.", ("bgctl rebuild",)),
    "store": (
        "The event log itself: move it into a shared PostgreSQL store.",
        ("bgctl store copy --to postgresql://bg@db/batchgrader",),
    ),
    "store copy": (
        "Copy the SQLite event log into PostgreSQL and verify both fold alike.",
        ("bgctl store copy --to postgresql://bg@db/batchgrader --json",),
    ),
    "report": ("How a finished job went, as text, JSON or an HTML page.", ("bgctl report 78db4dc4dc36 --html report.html",)),
    "retry": (
        "Resubmit an ended job's failed rows, or release a held job.",
        ("bgctl retry 78db4dc4dc36 --max-completion-tokens 800",),
    ),
    "service": ("Run the daemon as a systemd or launchd service.", ("bgctl service install --user --store-key",)),
    "service install": (
        "Write the service definition (the key never goes into it).",
        ("bgctl service install --user --store-key",),
    ),
    "service status": ("Whether the service is installed and running.", ("bgctl service status",)),
    "service uninstall": ("Remove the service definition, keeping the home.", ("bgctl service uninstall --user",)),
    "split": ("Write a file's batch-ready chunk files; no API call.", ("bgctl split answers.csv --out ./chunks",)),
    "status": ("The jobs, or one job in detail.", ("bgctl status", "bgctl status 78db4dc4dc36", "bgctl status --watch")),
    "submit": ("Check a file as count does, then queue it in the inbox.", ("bgctl submit answers.csv --profile scored",)),
}


#: the top-level commands as ``bgctl --help`` lists them, by what they are for
SECTIONS: dict[str, tuple[str, ...]] = {
    "Get started": ("init", "examples", "grade"),
    "Work": ("count", "submit", "daemon", "cancel", "retry", "split", "evals"),
    "Inspect": ("status", "report", "costs", "events", "logs", "models", "config", "cache"),
    "Administer": ("doctor", "service", "rebuild", "store", "emulator"),
}


def format_sections(group: click.Group, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """``bgctl --help``'s commands under :data:`SECTIONS` (a command no section names: under
    "Other commands", so a new command is never hidden)."""
    listed = {name for names in SECTIONS.values() for name in names}
    rest = tuple(sorted(n for n in group.list_commands(ctx) if n not in listed))
    sections = {**SECTIONS, **({"Other commands": rest} if rest else {})}
    width = max((len(n) for names in sections.values() for n in names), default=0)
    for title, names in sections.items():
        rows = []
        for name in names:
            cmd = group.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name.ljust(width), cmd.get_short_help_str(limit=formatter.width - 6 - width)))
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


def epilog(examples: tuple[str, ...]) -> str:
    """The ``--help`` ending for ``examples`` (``\\b``: click prints the lines as they are)."""
    label = "Example:" if len(examples) == 1 else "Examples:"
    return "\b\n" + label + "\n" + "\n".join(f"  {e}" for e in examples)


def apply(group: click.Group, prefix: tuple[str, ...] = ()) -> None:
    """Set the summary and the examples of every command of ``group`` that :data:`HELP` lists."""
    for name, cmd in group.commands.items():
        path = " ".join((*prefix, name))
        if path in HELP:
            summary, examples = HELP[path]
            cmd.short_help = cmd.short_help or summary
            cmd.epilog = cmd.epilog or epilog(examples)
        if isinstance(cmd, click.Group):
            apply(cmd, (*prefix, name))
