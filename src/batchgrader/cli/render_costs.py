"""Terminal rendering of `bgctl costs`: the cost table grouped by day, model, job or route, and
the spend per day as a bar chart (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from batchgrader.cli.fit import Col, fitted_table
from batchgrader.cli.render_status import BLOCKS, SIMULATED, _console, _note, count, money


def bar(value: float, maximum: float, width: int) -> str:
    """A horizontal bar of unicode eighth blocks, ``value/maximum`` of ``width`` cells."""
    if maximum <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / maximum * width * 8))
    full, rest = divmod(eighths, 8)
    return "█" * full + (BLOCKS[rest] if rest else "")


def cost_columns(result: dict[str, Any]) -> list[Col]:
    """The columns of ``bgctl costs``: the key (day, model or job id), counts and amounts are whole
    at every width; the file name shrinks, then it and the cached tokens give way."""
    rows = result.get("rows") or []
    by = result.get("by", "day")
    tot = result["totals"]
    key = Col(by, footer="total", style="bold")
    file = Col("file", min_width=8, give_way=2, droppable=True)
    batches = Col("batches", justify="right", footer=count(tot["batches"]))
    requests = Col("requests", justify="right", footer=count(tot.get("requests")))  # synchronous ones
    jobs = Col("jobs", justify="right", footer=count(tot["jobs"]))
    prompt = Col("prompt", justify="right", footer=count(tot["prompt_tokens"]))
    cached = Col("cached", justify="right", footer=count(tot["cached_tokens"]), give_way=1, droppable=True)
    output = Col("output", justify="right", footer=count(tot["completion_tokens"]))
    cost = Col("cost", justify="right", footer=money(tot["cost_usd"]))
    simulated = Col(SIMULATED, justify="right", style="yellow", footer=money(tot.get("simulated_usd")))
    saved = Col("saved", justify="right", style="green", footer=money(tot.get("saved_usd")))
    simulated_saved = Col(f"saved {SIMULATED}", justify="right", style="yellow", footer=money(tot.get("simulated_saved_usd")))
    cache_saved = Col("cache saved", justify="right", style="green", footer=money(tot.get("cache_saved_usd")))
    simulated_cache_saved = Col(
        f"cache saved {SIMULATED}", justify="right", style="yellow", footer=money(tot.get("simulated_cache_saved_usd"))
    )
    for r in rows:
        key.cells.append(str(r["key"]))
        file.cells.append(r.get("file") or "-")
        batches.cells.append(count(r["batches"]))
        requests.cells.append(count(r.get("requests")))
        jobs.cells.append(count(r["jobs"]))
        prompt.cells.append(count(r["prompt_tokens"]))
        cached.cells.append(count(r["cached_tokens"]))
        output.cells.append(count(r["completion_tokens"]))
        cost.cells.append(money(r["cost_usd"]))
        simulated.cells.append(money(r.get("simulated_usd")))
        saved.cells.append(money(r.get("saved_usd")))
        simulated_saved.cells.append(money(r.get("simulated_saved_usd")))
        cache_saved.cells.append(money(r.get("cache_saved_usd")))
        simulated_cache_saved.cells.append(money(r.get("simulated_cache_saved_usd")))
    synchronous = [requests] if any(r.get("requests") for r in rows) else []
    cols = (
        [key] + ([file, batches, *synchronous] if by == "job" else [batches, *synchronous, jobs]) + [prompt, cached, output, cost]
    )
    optional = (
        (simulated, "simulated_usd"),
        (saved, "saved_usd"),
        (simulated_saved, "simulated_saved_usd"),
        (cache_saved, "cache_saved_usd"),
        (simulated_cache_saved, "simulated_cache_saved_usd"),
    )
    for col, name in optional:
        if any(r.get(name) for r in rows):
            cols.append(col)
    return cols


def render_costs(result: dict[str, Any], console: Console | None = None, chart_width: int = 40) -> None:
    """The ``bgctl costs`` table and a bar chart of spend per day."""
    console = _console(console)
    rows = result.get("rows") or []
    by = result.get("by", "day")
    span = f"{result.get('since') or 'start'} .. {result.get('until') or 'today'} (UTC)"
    if not rows:
        console.print(f"No billed usage {span}.")
        _note(result.get("note"), console)
        return
    table, dropped = fitted_table(cost_columns(result), console.width, title=f"Billed usage by {by}, {span}", footer=True)
    console.print(table)
    if dropped:
        names = " and ".join(c.header for c in dropped)
        console.print(Text(f"(not shown at this width: {names}; `bgctl costs --json` has them)", style="dim"))

    daily = result.get("daily") or []
    if daily:
        key = "cost_usd" if any(d["cost_usd"] for d in daily) else "simulated_usd"
        top = max(d[key] for d in daily)
        title = "Spend per day" + (f" ({SIMULATED})" if key == "simulated_usd" else "")
        console.print(Text(title, style="bold"))
        for d in daily:
            line = Text(f"{d['day']} ")
            line.append(f"{bar(d[key], top, chart_width):<{chart_width}}", style="yellow" if key == "simulated_usd" else "green")
            line.append(f" {money(d[key])}")
            console.print(line)
    _note(result.get("note"), console)
