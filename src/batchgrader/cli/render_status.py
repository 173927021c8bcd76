"""Rich rendering of ``bgctl status``, ``events`` and ``costs``.  Pure presentation: the numbers
come from :mod:`batchgrader.queries`; nothing here computes a state or a cost."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from batchgrader.cli.fit import Col, fitted_table

SIMULATED = "SIMULATED"

STATE_STYLE = {
    "queued": "white",
    "preparing": "cyan",
    "submitting": "cyan",
    "running": "bold cyan",
    "downloading": "cyan",
    "held": "bold magenta",
    "corrupt": "bold red",
    "completed": "green",
    "completed_with_errors": "yellow",
    "failed": "bold red",
    "cancelled": "dim",
}
FINISHED = ("completed", "completed_with_errors", "failed", "cancelled")
CHUNK_STYLE = {"done": "green", "failed": "red", "waiting": "magenta", "pending": "dim"}
BLOCKS = " ▏▎▍▌▋▊▉█"
# Below this many columns `status JOB` drops its chunks' `tokens` column and events put their
# payload on the lines below (ids and paths stay whole). The job and cost tables fit any width
# with batchgrader.cli.fit.
NARROW = 100


# --- small formatters ------------------------------------------------------------------------------


def money(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "$0"
    if abs(v) < 0.01:
        return f"${v:.6f}".rstrip("0")
    return f"${v:,.4f}"


def count(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def short_ts(ts: str | None) -> str:
    return "-" if not ts else ts[:19].replace("T", " ")


def state_text(state: str, sandbox: bool = False, newline: bool = False) -> Text:
    t = Text(state, style=STATE_STYLE.get(state, ""))
    if sandbox:
        t.append("\n" if newline else " ")
        t.append(SIMULATED, style="bold black on yellow")
    return t


def one_line(text: str) -> str:
    """``text`` on one line: a newline, a tab or another control (or unprintable) character is
    shown escaped as Python writes it (``\\n``, ``\\x1b``), so a file name cannot split its row
    or colour the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cells(*values: Any) -> list[Text]:
    """Table cells as Text: file names, errors and ids are data, never rich markup ("[x]" stays)."""
    return [v if isinstance(v, Text) else Text("-" if v is None else str(v)) for v in values]


def _console(console: Console | None) -> Console:
    return console if console is not None else Console()


def _note(note: str | None, console: Console) -> None:
    if note:
        console.print(Text(f"note: {note}", style="yellow"))


# --- status ----------------------------------------------------------------------------------------


def batches_text(batches: Sequence[dict[str, Any]]) -> str:
    """Chunk steps with their counts, e.g. ``2 done, 1 in_progress 40/100`` (requests done/total
    summed over the batches in that step)."""
    groups: dict[str, list[int]] = {}
    for b in batches:
        g = groups.setdefault(b.get("status") or "pending", [0, 0, 0])
        rc = b.get("request_counts") or {}
        g[0] += 1
        g[1] += int(rc.get("completed") or 0) + int(rc.get("failed") or 0)
        g[2] += int(rc.get("total") or 0)
    parts = []
    for st, (n, done, total) in groups.items():
        parts.append(f"{n} {st}" + (f" {done:,}/{total:,}" if total and st not in ("done", "failed") else ""))
    return "\n".join(parts) or "-"


def answers_wanted(r: dict[str, Any]) -> int:
    """The answers a job needs: its rows, or with ``samples: k`` its rows x k (requests sent plus
    rows answered without one; without samples that sum never exceeds the rows)."""
    rows = int(r.get("rows") or 0)
    return max(rows, int(r.get("requests") or 0) + int(r.get("cached_rows") or 0))


def rows_cell(r: dict[str, Any]) -> str:
    """Rows answered of rows and rows failed (the result's: store/figures.py), with samples the
    requests they make, then how many were answered by each source, one short line each."""
    wanted = answers_wanted(r)
    lines = [f"{count(r.get('succeeded'))} ok/{count(r.get('rows'))}"]
    if r.get("failed"):
        lines.append(f"{count(r.get('failed'))} failed")
    if wanted != int(r.get("rows") or 0):
        lines.append(f"{count(wanted)} req")
    route = r.get("route_summary") or {}
    for name in ("online", "flex"):
        if (route.get("rows") or {}).get(name):
            lines.append(f"{count(route['rows'][name])} {name}")
    if route.get("preflight_rows"):
        lines.append(f"{count(route['preflight_rows'])} preflight")
    if reused_rows(r) or duplicate_rows(r):
        lines.append(f"{count(r.get('requests'))} sent")
    if reused_rows(r):
        lines.append(f"{count(reused_rows(r))} reused")
    if duplicate_rows(r):
        lines.append(f"{count(duplicate_rows(r))} duplicate")
    return "\n".join(lines)


def tokens_cell(r: dict[str, Any]) -> str:
    """Tokens in and out of one scope, the cost's: once anything is billed, the billed usage of
    every request (a preflight's, a synchronous route's and the batches'); before that, the
    input tokens of the rows planned into batches, marked ``(est.)``, and no output yet."""
    if r.get("prompt_tokens") or r.get("output_tokens") or r.get("cost_usd"):
        return f"{count(r.get('prompt_tokens'))} in\n{count(r.get('output_tokens'))} out"
    if not r.get("input_tokens"):
        return "- in\n- out"
    return f"{count(r.get('input_tokens'))} in (est.)\n- out"


def status_columns(rows: Sequence[dict[str, Any]], show_profile: bool) -> list[Col]:
    """The columns of the job list.  Ids, states, chunks, rows and costs are whole at every width;
    batches and tokens give way first, then the file name shrinks to the id, then the profile
    and the age (see :mod:`batchgrader.cli.fit`)."""
    width = max(len(r["job_id"]) for r in rows)  # ids are shown whole: `bgctl status <id>` opens that job
    job = Col("job / file", min_width=max(width, 10), give_way=3, cut_middle=True)  # too narrow still: judges' -j1/-j2 kept
    profile = Col("profile", min_width=8, give_way=4, droppable=True)
    state = Col("state")
    chunks = Col("chunks", justify="right")
    batches = Col("batches", give_way=1, droppable=True)
    rows_col = Col("rows", justify="right")
    tokens = Col("tokens", justify="right", give_way=2, droppable=True)
    cost = Col("cost", justify="right")
    age = Col("age", justify="right", give_way=5, droppable=True)
    daemon = Col("daemon", min_width=12, give_way=0, droppable=True)  # on a shared store: the daemon holding the job
    for r in rows:
        sandbox = bool(r.get("sandbox"))
        cell = Text(r["job_id"], style="bold")
        cell.append("\n" + one_line(r.get("file") or "-"), style="dim")
        job.cells.append(cell)
        profile.cells.append(r.get("profile") or "-")
        state.cells.append(state_text(r["state"], sandbox, newline=True))
        chunks.cells.append(f"{r.get('chunks_done', 0)}/{r.get('chunks_total', 0)}")
        batches.cells.append(batches_text(r.get("batches") or []))
        rows_col.cells.append(rows_cell(r))
        tokens.cells.append(tokens_cell(r))
        money_text = money(r.get("cost_usd")) + (f"\nsaved {money(r.get('saved_usd'))}" if r.get("saved_usd") else "")
        cost.cells.append(Text(money_text, style="yellow" if sandbox else ""))
        age.cells.append(duration(r.get("age_seconds")))
        daemon.cells.append(r.get("daemon") or "-")
    cols = [job, profile] if show_profile else [job]
    shared = [daemon] if any(r.get("daemon") for r in rows) else []
    return [*cols, state, chunks, batches, rows_col, tokens, cost, age, *shared]


def progress_line(r: dict[str, Any]) -> str | None:
    """``40/100 rows answered; expected to finish in about 12m (estimate: ...)`` for a job with
    batches sent, or None."""
    p = r.get("progress") or {}
    if not p.get("sent") or r["state"] in FINISHED:
        return None
    line = f"{p['answered']:,}/{p['sent']:,} rows answered"
    if r.get("eta_seconds") is not None:
        when = "any moment now" if r["eta_seconds"] < 1 else f"in about {duration(r['eta_seconds'])}"
        line += f"; expected to finish {when} (estimate: {r['eta_basis']})"
    elif any(b.get("status") in ("validating", "in_progress", "finalizing") for b in r.get("batches") or ()):
        line += f"; no finish estimate yet: no {r.get('model') or ''} batch has completed here to learn its run time"
    return line


def render_overview(overview: dict[str, Any], console: Console | None = None) -> None:
    """The `bgctl status` table from :func:`queries.status_overview`, with what was left out."""
    console = _console(console)
    render_status(overview["jobs"], console, max_finished=None)
    hidden = []
    if overview["hidden_active"]:
        hidden.append(f"{overview['hidden_active']:,} older unfinished")
    if overview["hidden_finished"]:
        hidden.append(f"{overview['hidden_finished']:,} older finished")
    if hidden:
        counts = ", ".join(f"{n:,} {st}" for st, n in sorted(overview["counts"].items()))
        console.print(
            Text(
                f"{' and '.join(hidden)} jobs not shown ({overview['total']:,} in all: {counts}); "
                "`bgctl status --all` or `--json` lists every job",
                style="dim",
            )
        )


def render_leases(leases: Sequence[dict[str, Any]] | None, console: Console | None = None) -> None:
    """The leases of a shared PostgreSQL store (:func:`queries.leases`): which daemon holds each
    provider account and job, with which fence, until when.  Nothing on the SQLite file (None)."""
    if leases is None:
        return
    console = _console(console)
    if not leases:
        console.print(Text("Leases: none taken yet (no daemon has run on this store)", style="dim"))
        return
    t = Table(title="Leases", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("lease", "left"), ("holder", "left"), ("fence", "right"), ("until (UTC)", "left"), ("left", "right")):
        t.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for x in leases:
        if x["held"]:
            holder, until, left = x["holder"], short_ts(x["expires_at"]), duration(x["seconds_left"])
        else:
            holder = f"{x['holder']} (lapsed)" if x["holder"] else "free"
            until, left = "-", "-"
        t.add_row(*_cells(x["name"], holder, x["fence"], until, left))
    console.print(t)


def render_status(rows: Sequence[dict[str, Any]], console: Console | None = None, max_finished: int | None = 30) -> None:
    """The job list of ``bgctl status``: every unfinished job and the ``max_finished`` most recent
    finished ones (None: all; a terminal table of thousands of rows helps nobody), then a line
    counting the finished jobs left out."""
    console = _console(console)
    if not rows:
        console.print("No jobs yet: drop a data file into the inbox, or run `bgctl submit FILE`.")
        return
    rows, hidden = _older_finished(rows, max_finished)
    _print_jobs_table(rows, console)
    if hidden:
        _print_hidden(hidden, console)
    for r in rows:
        _print_job_lines(r, console)
    _note(rows[0].get("note"), console)


def _older_finished(
    rows: Sequence[dict[str, Any]], max_finished: int | None
) -> tuple[Sequence[dict[str, Any]], list[dict[str, Any]]]:
    """The rows to show, and the finished ones left out: all but the ``max_finished`` most recent
    (None: none left out)."""
    finished = [i for i, r in enumerate(rows) if r["state"] in FINISHED]
    if max_finished is None or len(finished) <= max_finished:
        return rows, []
    hidden = set(finished[: len(finished) - max_finished])
    return [r for i, r in enumerate(rows) if i not in hidden], [rows[i] for i in sorted(hidden)]


def _print_jobs_table(rows: Sequence[dict[str, Any]], console: Console) -> None:
    """The table of jobs fitted to the console, with the columns left out named."""
    show_profile = any((r.get("profile") or "default") != "default" for r in rows)
    table, dropped = fitted_table(status_columns(rows, show_profile), console.width, title="BatchGrader jobs")
    if any(r.get("sandbox") for r in rows):
        table.caption = f"{SIMULATED}: sandbox jobs, answered by the local emulator; their costs are not real."
        table.caption_justify = "left"
    console.print(table)
    if dropped:
        names = ", ".join(c.header for c in dropped)
        console.print(Text(f"(not shown at this width: {names}; `bgctl status <job>` has them)", style="dim"))


def _print_hidden(hidden: list[dict[str, Any]], console: Console) -> None:
    """The line counting the finished jobs left out, by state."""
    by_state: dict[str, int] = {}
    for r in hidden:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
    parts = ", ".join(f"{n:,} {st}" for st, n in sorted(by_state.items(), key=lambda kv: -kv[1]))
    console.print(
        Text(
            f"... and {len(hidden):,} older finished jobs not shown ({parts}); `bgctl status --json` lists every job.",
            style="dim",
        )
    )


def _print_job_lines(r: dict[str, Any], console: Console) -> None:
    """The lines under the table about one job: its progress, last error, queue wait, and why it
    is held or failed."""
    line = progress_line(r)
    if line:
        console.print(Text(f"{r['job_id']} {line}", style="cyan"), soft_wrap=True)
    if r.get("last_error") and r["state"] not in FINISHED and r["state"] != "held":
        console.print(Text(f"{r['job_id']} last error: {r['last_error']}", style="yellow"), soft_wrap=True)
    w = r.get("waiting_for")
    if w:
        queue = "the emulator's" if r.get("sandbox") else "the provider's"
        console.print(
            Text(
                f"{r['job_id']} waiting for a batch slot: {w['in_use']:,} of max_simultaneous_batches {w['limit']:,} in use "
                f"in {queue} queue",
                style="magenta",
            ),
            soft_wrap=True,
        )
    q = r.get("queue")
    if q and q.get("waiting"):
        how = "stated by the provider" if q.get("exact") else "estimated"
        console.print(
            Text(
                f"{r['job_id'][:12]} waiting for queue room: {q['model']} may have {q['limit']:,} prompt tokens "
                f"in flight ({how})",
                style="cyan",
            )
        )
    if r.get("held_reason") and r["state"] == "held":
        console.print(Text(f"{r['job_id']} held: {r['held_reason']}", style="magenta"), soft_wrap=True)
    elif r.get("error") and r["state"] == "failed":
        hint = f" - {r['error_hint']}" if r.get("error_hint") else ""
        console.print(Text(f"{r['job_id']} failed: {r['error']}{hint}", style="red"), soft_wrap=True)


def _route_of(d: dict[str, Any]) -> dict[str, Any]:
    """A status row's route summary (as ``bgctl status`` gives it, or the read model's JSON)."""
    route = d.get("route_summary")
    if route is None and isinstance(d.get("route"), str):
        route = json.loads(d["route"])
    return route if isinstance(route, dict) else {}


def _source_count(d: dict[str, Any], name: str) -> int | None:
    """``name``'s count in the job's requests by answer source (core/route_state.requests_by_source),
    None for a row written before it was recorded."""
    route = _route_of(d)
    sources = route.get("sources") if isinstance(route, dict) else None
    return int(sources[name]) if isinstance(sources, dict) and name in sources else None


def reused_rows(d: dict[str, Any]) -> int:
    """Rows answered with a stored answer of an earlier job (``answered_by: reused``): the rows
    answered without a request of their own, less the file's own repeats (:func:`duplicate_rows`)
    and those answered on the job's synchronous route or by its preflight (taken at prepare like
    stored answers, but each sent and billed)."""
    recorded = _source_count(d, "reused")
    if recorded is not None:
        return recorded
    route = _route_of(d)
    in_job = route.get("answered_in_job")  # core/route_state.answered_in_job
    if in_job is None:  # a row written before that key: its synchronous rows (it had no preflight count)
        in_job = sum((route.get("rows") or {}).get(k, 0) for k in ("flex", "online")) - int(route.get("straggler_rows") or 0)
    return max(0, int(d.get("cached_rows") or 0) - duplicate_rows(d) - int(in_job))


def duplicate_rows(d: dict[str, Any]) -> int:
    """Repeats of an earlier row of the same file, given its answer (``answered_by: duplicate``)."""
    recorded = _source_count(d, "duplicate")
    return recorded if recorded is not None else int(d.get("duplicate_rows") or 0)


def route_line(route: dict[str, Any] | None) -> str | None:
    """A job's route and its rows and cost by route (None for a job that went by batch alone)."""
    if not route or (route["route"] == "batch" and not (route["rows"]["flex"] or route["rows"]["online"])):
        return None
    parts = [
        f"{name} {count(route['rows'][name])} rows {money(route['cost_usd'][name])}"
        for name in ("online", "flex", "batch")
        if route["rows"][name] or route["cost_usd"][name]
    ]
    extra = [f"resent after a crash: {route['resent_after_crash']}"] if route.get("resent_after_crash") else []
    if route.get("stragglers") or route.get("straggler_rows"):
        extra.append(
            f"{route['stragglers']} batch(es) cancelled as the deadline neared, "
            f"{count(route.get('straggler_rows') or 0)} rows sent synchronously"
        )
    why = f" ({route['reason']})" if route.get("reason") else ""
    return f"{route['route']}{why}; " + ", ".join(parts + extra)


def unfinished_jobs(overview: dict[str, Any]) -> int:
    """The jobs of ``overview`` (a :func:`queries.status_overview` or ``{"jobs": rows}``) that have
    not ended: those a daemon has still to work on."""
    shown = sum(1 for r in overview.get("jobs") or () if r["state"] not in FINISHED)
    return shown + int(overview.get("hidden_active") or 0)


def render_waiting(
    inbox: Sequence[dict[str, Any]], daemon: dict[str, Any], console: Console | None = None, unfinished: int = 0
) -> None:
    """Files still waiting in the inbox, and whether a daemon is running to take them (and the
    ``unfinished`` jobs): a warning only when something waits for one."""
    console = _console(console)
    if inbox:
        t = Table(title="Waiting in the inbox", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("file", overflow="fold")
        t.add_column("profile", no_wrap=True)
        t.add_column("bytes", justify="right", no_wrap=True)
        t.add_column("note", overflow="fold")
        for f in inbox:
            note = f.get("note") or ("" if f.get("supported", True) else "unsupported type: will be rejected")
            t.add_row(*_cells(one_line(f["file"]), f.get("profile") or "default", count(f.get("bytes")), note))
        console.print(t)
    if daemon.get("running"):
        console.print(Text(f"daemon running (pid {daemon.get('pid')})", style="dim"))
    elif not inbox and not unfinished:
        console.print(Text("No daemon is running; nothing is waiting for one.", style="dim"))
    else:
        console.print(Text("No daemon is running for this home: nothing is processed until one starts.", style="yellow"))
        console.print(Text("Start one with:", style="yellow"))
        for command in daemon.get("start") or ():
            console.print(Text(f"  {command}", style="bold"), soft_wrap=True)  # pasteable: never wrapped


# --- costs -----------------------------------------------------------------------------------------
