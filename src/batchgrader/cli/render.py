"""Rich rendering for the terminal. Pure presentation: no business logic here."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from batchgrader.fsio import shown_name

if TYPE_CHECKING:
    from batchgrader.store.snapshot import Snapshot

console = Console()  # the daemon's live view; one-shot output uses make_console()


def make_console() -> Console:
    """A console sized for the terminal (or $COLUMNS) at the time of the call."""
    return Console()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def render_config(rows: list[dict[str, Any]], home, profile: str | None) -> None:
    console = make_console()
    t = Table(title=f"Effective configuration — profile {profile or 'default'} — home {home.root}")
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    t.add_column("source", style="dim")
    for r in rows:
        t.add_row(r["key"], _fmt(r["value"]), r["source"])
    console.print(t)


def render_models(rows: list[dict[str, Any]]) -> None:
    console = make_console()
    t = Table(title="Model catalogue (Batch USD per 1M tokens)")
    t.add_column("model", no_wrap=True)
    for col in ("in", "out", "context", "max out", "reasons", "temp"):
        t.add_column(col, no_wrap=True)

    def k(n: int | None) -> str:
        return "-" if not n else f"{n // 1000:,}K" if n >= 10_000 else f"{n:,}"

    for r in rows:
        t.add_row(
            r["model"]
            + ("" if r["origin"] == "shipped" else " *")
            + (" °" if "shipped catalogue" in r["price_source"] else "")
            + (" †" if r.get("price_changes") else ""),
            f"{r['batch']['input_per_1m']:g}",
            f"{r['batch']['output_per_1m']:g}",
            k(r["context_window"]),
            k(r["max_output"]),
            "-" if not r["reasoning"] else f"{r['reasoning_default']}",
            r["temperature"],
        )
    console.print(t)
    console.print(
        "reasons: the effort a reasoning model uses by default; temp: which temperatures it takes "
        "(none (API): the Anthropic API version sent, anthropic_api_version, refuses every sampling parameter).  "
        f"Prices from {_maintained_name(rows)} unless marked: ° from the shipped row (some or all), * from your pricing file, "
        "† prices in force today that change on a later day (price_changes).  "
        "`bgctl models --json` adds the provider, efforts, cached and standard prices, each figure's source and notes; "
        "`bgctl models --check` compares the shipped prices with genai-prices."
    )


def _maintained_name(rows: list[dict[str, Any]]) -> str:
    """ "genai-prices X.Y.Z" as the rows name it (the maintained catalogue), else "the maintained catalogue"."""
    for r in rows:
        for src in r["price_sources"].values():
            if src.startswith("genai-prices"):
                return str(src)
    return "the maintained catalogue (genai-prices)"


def render_price_check(diffs: list[Any], rows: int, version: str | None, days: list[str]) -> None:
    """`bgctl models --check`: each figure where the shipped row and genai-prices disagree, on
    ``days`` (today, then each day a dated price changes)."""
    console = make_console()
    undeclared = [d for d in diffs if d.deliberate is None]

    def fig(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    if diffs:
        t = Table(title=f"Shipped prices against genai-prices {version} from {days[0]} (Batch USD per 1M tokens, as billed)")
        for col in ("model", "field", "from", "ours", "theirs", "deliberate"):
            t.add_column(col, no_wrap=col != "deliberate")
        for d in diffs:
            why = "NO: update the row or declare it" if d.deliberate is None else f"yes ({d.deliberate.checked_on})"
            t.add_row(d.model, d.field, d.day or days[0], fig(d.ours), fig(d.theirs), why)
        console.print(t)
    later = f" and on {', '.join(days[1:])} (dated prices change)" if days[1:] else ""
    console.print(
        f"{rows} shipped rows compared on {days[0]}{later}: {len(diffs)} differences, {len(undeclared)} not declared deliberate "
        "(pipeline/maintained.py DELIBERATE_DIFFERENCES; docs/providers.md)."
    )


def _usd(v: float | None) -> str:
    if v is None:
        return "-"
    if 0 < abs(v) < 0.01:
        return f"${v:.6f}".rstrip("0")
    return f"${v:,.4f}"


def _chunk_table(summary: dict[str, Any], with_path: bool = False, schema: bool = False) -> Table:
    t = Table(title="Chunk plan")
    t.add_column("chunk", justify="right")
    t.add_column("requests", justify="right")
    t.add_column("input tokens" + (" (without the schema)" if schema else ""), justify="right")
    t.add_column("bytes", justify="right")
    if with_path:
        t.add_column("file", overflow="fold")
    for c in summary["chunks"]:
        cells = [str(c["index"]), f"{c['requests']:,}", f"{c['input_tokens']:,}", f"{c['bytes']:,}"]
        if with_path:
            cells.append(c.get("path", ""))
        t.add_row(*cells)
    return t


def render_count(summary: dict[str, Any]) -> None:
    console = make_console()
    t = Table(
        title=f"{summary['file']} — {summary['model']} ({summary['encoding']}), profile {summary['profile']}", show_header=False
    )
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    if summary.get("text_encoding"):
        t.add_row("file encoding", str(summary["text_encoding"]))
    t.add_row("rows", f"{summary['rows']:,}")
    if summary.get("empty_rows"):
        skipped = any(e.get("code") == "empty_input" for e in summary.get("row_errors") or ())
        t.add_row("rows with an empty graded column", _empty_rows_text(summary["empty_rows"], skipped))
    t.add_row("requests", f"{summary['requests']:,}")
    _reuse_rows(t, summary.get("reuse") or {})
    exact = summary.get("input_tokens_exact", True)
    schema = summary.get("schema")
    _token_rows(t, summary, schema, exact)
    t.add_row("chunks", str(len(summary["chunks"])))
    _cost_rows(t, summary.get("estimated_cost_usd"), estimate=bool(schema) or not exact)
    console.print(t)
    console.print(_chunk_table(summary, schema=bool(schema)))
    _problems(summary)


def render_panel_count(summary: dict[str, Any]) -> None:
    """``bgctl count --profile PANEL``: each judge's count as :func:`render_count` shows one
    profile's, then the panel's sum (ops/count.py ``count_panel``)."""
    for judge in summary["judges"]:
        make_console().print(f"[bold]judge {judge['judge']}[/bold]: {judge['model']}, {judge['samples']} sample(s) per row")
        render_count(judge)
    t = Table(title=f"panel {summary['profile']}: {len(summary['judges'])} judges on {summary['rows']:,} rows", show_header=True)
    for col in ("judge", "model", "samples", "requests", "est. total (upper bound)"):
        t.add_column(col, justify="left" if col in ("judge", "model") else "right")
    for j in summary["judges"]:
        est = j.get("estimated_cost_usd")
        t.add_row(j["judge"], j["model"], str(j["samples"]), f"{j['requests']:,}", _usd(est["max_total"]) if est else "unknown")
    total = summary.get("estimated_cost_usd")
    t.add_row(
        "panel (sum)",
        ", ".join(summary["models"]),
        "",
        f"{summary['requests']:,}",
        _usd(total["max_total"]) if total else "unknown",
    )
    make_console().print(t)
    if total:
        make_console().print(
            f"estimated cost of the panel: input {_usd(total['input'])}, output up to {_usd(total['max_output'])}, "
            f"total up to {_usd(total['max_total'])} (the sum of its judges')"
        )


def _reuse_rows(t: Table, reuse: dict[str, Any]) -> None:
    """``bgctl count``'s rows about answers reused from earlier jobs and identical rows."""
    if reuse.get("cached_rows") or reuse.get("duplicate_rows"):
        t.add_row("answered from stored answers (not sent)", f"{reuse['cached_rows']:,}")
        t.add_row("identical to an earlier row (sent once)", f"{reuse['duplicate_rows']:,}")
        t.add_row("saved (what the stored answers cost)", _usd(reuse["saved_usd"]))
    elif reuse and not reuse.get("enabled"):
        t.add_row("answer reuse", "off (reuse_answers, temperature or cache_days)")


def _token_rows(t: Table, summary: dict[str, Any], schema: dict[str, Any] | None, exact: bool) -> None:
    """``bgctl count``'s rows about input tokens: counted (and how), estimated with the schema,
    why an estimate, and the mean and largest request."""
    stand_in = "" if exact else f"ESTIMATE: tiktoken stand-in for {summary.get('provider')}"
    if schema:  # the provider bills the schema as prompt tokens, in an amount it does not publish
        counted = "counted, without the schema" if exact else f"{stand_in}, without the schema"
        t.add_row(f"input tokens ({counted})", f"{summary['input_tokens']:,}")
        t.add_row(f"input tokens (estimate; {_schema_allowance(schema)})", f"{summary['input_tokens_estimate']:,}")
    else:
        via = (summary.get("token_count") or {}).get("source") if exact else None
        label = (f"exact, from the {via}" if via else "exact") if exact else stand_in
        t.add_row(f"input tokens ({label})", f"{summary['input_tokens']:,}")
    why = (summary.get("token_count") or {}).get("reason")
    if not exact and why:
        t.add_row("why an estimate", str(why))
    if schema:  # as priced: with the schema's tokens per request
        per = float(schema["per_request"])
        mean, top = round(summary["mean_request_tokens"] + per, 1), round(summary["max_request_tokens"] + per)
        t.add_row("mean / max tokens per request (with the schema)", f"{mean:,} / {top:,}")
    else:
        t.add_row("mean / max tokens per request", f"{summary['mean_request_tokens']:,} / {summary['max_request_tokens']:,}")


def _schema_allowance(schema: dict[str, Any]) -> str:
    """How the schema's tokens per request are known: calibrated from a job, or an allowance."""
    if schema["source"] == "calibrated":
        src = schema.get("learned_from") or {}
        return f"calibrated: {schema['per_request']:g} tokens/request learned from job {src.get('job_id', '?')}"
    return f"allowance: {schema['per_request']:g} tokens/request for the schema, not yet calibrated"


def _cost_rows(t: Table, est: dict[str, Any] | None, estimate: bool) -> None:
    """``bgctl count``'s rows about the cost (``estimate``: the input tokens are an estimate)."""
    if not est:
        t.add_row("estimated cost", "[red]unknown[/red]")
        return
    t.add_row("estimated cost: input" + (" (estimate)" if estimate else " (exact)"), _usd(est["input"]))
    if est.get("output_bound"):
        t.add_row("output bound per request (reasoning incl.)", f"{est['output_bound']:,}")
    t.add_row("estimated cost: output (upper bound)", _usd(est["max_output"]))
    t.add_row("estimated cost: total (upper bound)", _usd(est["max_total"]))


def render_split(summary: dict[str, Any]) -> None:
    console = make_console()
    console.print(_chunk_table(summary, with_path=True))
    console.print(f"{summary['requests']:,} requests, {summary['input_tokens']:,} input tokens in {len(summary['chunks'])} files")
    if summary.get("duplicate_rows"):
        console.print(
            f"{summary['duplicate_rows']:,} rows identical to an earlier row are not written: sent once, as the daemon "
            "does (stored answers of earlier jobs are not consulted; `bgctl count` shows those too)"
        )
    _problems(summary)


def _empty_rows_text(n: int, skipped: bool) -> str:
    if skipped:
        return f"{n:,}: not sent (skip_empty)"
    return f"{n:,}: sent and billed"


def _problems(summary: dict[str, Any]) -> None:
    console = make_console()
    if summary.get("pricing_error"):
        console.print(f"[red]pricing:[/red] {summary['pricing_error']}")
    for w in summary.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {w}")
    if summary.get("empty_rows"):
        field = summary.get("response_field") or "response_field"
        skipped = any(e.get("code") == "empty_input" for e in summary.get("row_errors") or ())
        console.print(
            f"[yellow]{summary['empty_rows']:,} row(s) have an empty `{field}`:[/yellow] "
            + (
                "they are not sent and fail with empty_input (skip_empty: true)"
                if skipped
                else "they are sent and billed like any row; set `skip_empty: true` to leave them ungraded"
            )
        )
    errs = [e for e in summary.get("row_errors", []) if e.get("code") != "empty_input"]
    for e in errs[:20]:
        console.print(f"[red]row {e['row']}:[/red] {e['message']}")
    if len(errs) > 20:
        console.print(f"[red]... and {len(errs) - 20} more rows that cannot be sent[/red]")


def sandbox_banner() -> None:
    console = make_console()
    console.print(
        "[bold black on yellow] SANDBOX [/] results are SIMULATED by the built-in Batch API emulator: "
        "no API key, no cost, and the answers are not real model output."
    )


def jobs_table(snapshot: Snapshot, sandbox: bool, title: str = "Jobs") -> Table:
    t = Table(title=title + (" — SANDBOX: simulated results" if sandbox else ""), title_justify="left")
    for col, just, wrap in (
        ("job / file", "left", False),
        ("state", "left", False),
        ("rows", "right", False),
        ("chunks", "right", False),
        ("cost", "right", False),
        ("batches / error", "left", True),
    ):
        t.add_column(col, justify=just, no_wrap=not wrap, overflow="fold")  # type: ignore[arg-type]
    for j in snapshot.jobs:
        detail = j.batches + (("\n" if j.batches else "") + j.error[:200] if j.error else "")
        t.add_row(
            Text(f"{j.job_id}\n{shown_name(j.file)}"),
            j.state,
            f"{j.rows:,}",
            f"{j.chunks_done}/{j.chunks_total}",
            _usd(j.cost_usd),
            detail,
        )
    return t


def render_summary(state, sandbox: bool, since: str | None = None) -> None:  # noqa: ANN001
    """The jobs of a ``daemon --once`` run: those with an event since ``since``."""
    from batchgrader.store.snapshot import take

    snapshot = take(state, since)
    if not snapshot.jobs:
        make_console().print("Summary: no job had anything to do in this run.")
        return
    make_console().print(jobs_table(snapshot, sandbox, "Summary (this run's jobs)"))


class LiveView:
    """A rich live table of jobs and chunks while the daemon runs in a terminal."""

    console = make_console()

    def __init__(self, sandbox: bool):
        from rich.live import Live

        self.sandbox = sandbox
        self.live = Live(Table(), console=console, refresh_per_second=2, transient=False)

    def start(self) -> None:
        self.live.start()

    def update(self, snapshot: Snapshot) -> None:
        """Show ``snapshot`` (taken by the tick thread; never the live state)."""
        self.live.update(jobs_table(snapshot, self.sandbox, "bgctl daemon"))

    def stop(self) -> None:
        self.live.stop()
