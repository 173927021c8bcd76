"""Rich rendering of one job in full (``bgctl status JOB``): its figures, paths, chunks, first
failures and recent events.  Pure presentation over :func:`batchgrader.store.queries.job_detail`;
the formatters it shares with the jobs table are :mod:`batchgrader.cli.render_status`'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from batchgrader.cli.render_status import (
    CHUNK_STYLE,
    NARROW,
    SIMULATED,
    _cells,
    _console,
    answers_wanted,
    count,
    duplicate_rows,
    duration,
    money,
    one_line,
    progress_line,
    reused_rows,
    route_line,
    short_ts,
    state_text,
)


def render_job(detail: dict[str, Any], console: Console | None = None) -> None:
    """One job in full (``bgctl status JOB``)."""
    console = _console(console)
    d = detail
    head = Text()
    head.append(f"Job {d['job_id']}  ", style="bold")
    head.append_text(state_text(d["state"], bool(d.get("sandbox"))))
    console.print(head)
    if d.get("sandbox"):
        console.print(
            Text(f"{SIMULATED}: the results of this job were produced by the local emulator, not by OpenAI.", style="yellow")
        )
    info = Table.grid(padding=(0, 2))
    info.add_column(style="dim")
    info.add_column(overflow="fold")
    for k, v in _job_pairs(d):
        if v not in (None, ""):
            info.add_row(*_cells(k, v))
    console.print(info)
    _print_paths(d, console)
    chunks = d.get("chunks") or []
    if chunks:
        console.print(_chunks_table(chunks, console.width < NARROW))
    _print_failures(d, console)
    recent = d.get("recent_events") or []
    if recent:
        console.print(Text(f"Recent events ({len(recent)} of {d.get('events_total', len(recent))}):", style="bold"))
        from batchgrader.cli.render_events import render_events

        render_events(recent, console, show_job=False)


def _print_failures(d: dict[str, Any], console: Console) -> None:
    """The job's first failed rows, and rows that could not be sent."""
    failed = d.get("failed_rows") or []
    if failed:
        t = Table(
            title=f"Failed rows ({d.get('failed_rows_total', len(failed))}, first {len(failed)})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        t.add_column("custom_id")
        t.add_column("chunk", justify="right")
        t.add_column("code")
        t.add_column("message", overflow="fold")
        for f in failed:
            t.add_row(*_cells(f.get("custom_id"), f.get("chunk", "-"), f.get("code") or "-", f.get("message") or ""))
        console.print(t)
    row_errors = d.get("row_errors") or []
    if row_errors:
        console.print(Text(f"{d.get('row_errors_total', len(row_errors))} row(s) could not be sent, e.g.:", style="yellow"))
        for r in row_errors:
            console.print(f"  row {r.get('row', '?')}: [{r.get('code')}] {r.get('message')}", markup=False)


def _job_pairs(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """The (label, value) lines of ``bgctl status JOB``; a None or empty value is not shown."""
    return [
        ("file", one_line(d["file"]) if d.get("file") else None),
        ("file encoding", d.get("text_encoding")),
        ("profile / model", f"{d.get('profile') or '-'} / {d.get('model') or '-'}"),
        ("rows", _rows_text(d)),
        ("empty rows", empty_rows_text(d.get("empty_rows"), bool(d.get("skip_empty")))),
        ("chunks", f"{d.get('chunks_done', 0)}/{d.get('chunks_total', 0)} done"),
        ("progress", progress_line(d)),
        (
            "input tokens (estimated)"
            if d.get("input_tokens_exact", True)
            else "input tokens (ESTIMATE: not counted by the provider; tiktoken stand-in)",
            count(d.get("input_tokens")),
        ),
        (
            "billed tokens",
            f"{count(d.get('prompt_tokens'))} prompt ({count(d.get('cached_tokens'))} cached), "
            f"{count(d.get('output_tokens'))} output ({count(d.get('reasoning_tokens'))} reasoning)",
        ),
        ("cost (billed)", money(d.get("cost_usd")) + (f" ({SIMULATED})" if d.get("sandbox") else "")),
        ("prompt cache", _cache_text(d)),
        ("reused answers", _reused_text(d)),
        ("route", route_line(d.get("route_summary"))),
        ("estimate (max)", money(d.get("estimate_usd"))),
        (
            "created / updated",
            f"{short_ts(d.get('created_ts'))} / {short_ts(d.get('updated_ts'))} (age {duration(d.get('age_seconds'))})",
        ),
        ("daemon", d.get("daemon")),  # on a shared store: the daemon holding the job's lease
        ("held", d.get("held_reason")),
        ("error", (f"[{d.get('error_code')}] {d.get('error')}" if d.get("error") else None)),
        ("hint", d.get("error_hint")),
        ("last error", d.get("last_error") if d.get("last_error") != d.get("error") else None),
        ("cancel requested", "yes" if d.get("cancel_requested") and d["state"] != "cancelled" else None),
    ]


def empty_rows_text(n: int | None, skipped: bool) -> str | None:
    """What ``count`` and ``status JOB`` say of the rows whose graded column is empty."""
    if not n:
        return None
    if skipped:
        return f"{count(n)} with an empty graded column: not sent (skip_empty), failed as empty_input"
    return f"{count(n)} with an empty graded column: sent and billed (skip_empty: true leaves them out)"


def _rows_text(d: dict[str, Any]) -> str:
    rows, wanted = int(d.get("rows") or 0), answers_wanted(d)
    done = f"{count(d.get('rows'))} ({count(d.get('succeeded'))} answered, {count(d.get('failed'))} failed)"
    if wanted == rows:
        return done
    return f"{done}, {wanted // max(1, rows)} samples each: {count(wanted)} requests"


def _cache_text(d: dict[str, Any]) -> str | None:
    if not (d.get("cached_tokens") or d.get("cache_write_tokens")):
        return None
    return (
        f"{count(d.get('cached_tokens'))} tokens read, {count(d.get('cache_write_tokens'))} written; "
        f"saved {money(d.get('cache_saved_usd'))}"
    )


def _reused_text(d: dict[str, Any]) -> str | None:
    if not (reused_rows(d) or duplicate_rows(d)):
        return None
    return (
        f"{count(reused_rows(d) + duplicate_rows(d))} rows answered without a request "
        f"({count(reused_rows(d))} reused from earlier jobs, {count(duplicate_rows(d))} duplicate: copied from an identical row), "
        f"{count(d.get('requests'))} sent; saved {money(d.get('saved_usd'))}"
    )


def _print_paths(d: dict[str, Any], console: Console) -> None:
    paths = [
        ("result", d.get("result_path")),
        ("error report", d.get("error_path")),
        ("input", d.get("archived_path") or d.get("input_path")),
    ]
    for k, v in paths:  # paths to paste: on their own line, never broken by us
        if v:
            console.print(Text(f"{k + ':':<25} {v}"), soft_wrap=True)
    for w in d.get("warnings") or []:
        console.print(Text(f"warning: {w}", style="yellow"))


def _chunks_table(chunks: Sequence[dict[str, Any]], narrow: bool) -> Table:
    """The job's chunks: status, batch id (always whole), counts, and tokens, attempts and errors
    where they say something."""
    retries = any((c.get("attempt") or 0) > 1 for c in chunks)
    errors = any(c.get("error") for c in chunks)
    t = Table(title="Chunks", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    t.add_column("#", justify="right", no_wrap=True, min_width=2)
    t.add_column("status", no_wrap=True)
    # batch ids are pasted into the provider's dashboard: always whole
    t.add_column("batch", no_wrap=True, min_width=max((len(c.get("batch_id") or "-") for c in chunks), default=5))
    t.add_column("ok/err/all", justify="right", no_wrap=True)
    if not narrow:
        t.add_column("tokens", justify="right", no_wrap=True)
    if retries:
        t.add_column("attempt", justify="right", no_wrap=True)
    if errors:
        t.add_column("error", overflow="fold", min_width=12)
    for c in chunks:
        rc = c.get("request_counts") or {}
        counts = f"{rc.get('completed', 0)}/{rc.get('failed', 0)}/{rc.get('total', 0)}" if rc else "-"
        label = c["status"] + (" (retry)" if c.get("retry") else "")
        cells: list[Any] = [
            str(c["index"]),
            Text(label, style=CHUNK_STYLE.get(c["status"], "cyan")),
            c.get("batch_id") or "-",
            counts,
        ]
        if not narrow:
            cells.append(count(c.get("input_tokens")))
        if retries:
            cells.append(str(c.get("attempt") or "-"))
        if errors:
            cells.append(c.get("error") or "")
        t.add_row(*_cells(*cells))
    return t
