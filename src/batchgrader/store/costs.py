"""`bgctl costs`: billed usage between two UTC days, grouped by day, model, job or route, from the
``usage`` and ``savings`` read models (or folded from the log when they cannot be trusted)."""

from __future__ import annotations

import sqlite3
from datetime import date, datetime
from typing import Any

from batchgrader.store.queries import (
    SOURCE_LOG,
    SOURCE_READ_MODEL,
    HomeLike,
    QueryError,
    fallback_note,
    gc_paused,
    read_model_problem,
    reading,
)

COST_GROUPS = ("day", "model", "job", "route")


def _day(value: str | date | None, name: str) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    try:
        return date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise QueryError(f"--{name} {value!r}: expected a date YYYY-MM-DD (UTC)") from None


_SUMS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


def _zero() -> dict[str, Any]:
    return {
        **{k: 0 for k in _SUMS},
        "cost_usd": 0.0,
        "simulated_usd": 0.0,
        "saved_usd": 0.0,
        "simulated_saved_usd": 0.0,
        "cache_saved_usd": 0.0,
        "simulated_cache_saved_usd": 0.0,
        "reused_rows": 0,
        "batches": 0,
        "requests": 0,  # synchronous requests (flex, online): one TokensUsed each, not a batch
        "jobs": set(),
    }


def _add_saving(acc: dict[str, Any], s: dict[str, Any]) -> None:
    acc["saved_usd" if not s["sandbox"] else "simulated_saved_usd"] += s["saved_usd"]
    acc["reused_rows"] += s["rows"]
    acc["jobs"].add(s["job_id"])


def _add(acc: dict[str, Any], u: dict[str, Any]) -> None:
    for k in _SUMS:
        acc[k] += u[k]
    acc["cost_usd" if not u["sandbox"] else "simulated_usd"] += u["cost_usd"]
    acc["cache_saved_usd" if not u["sandbox"] else "simulated_cache_saved_usd"] += u.get("cache_saved_usd") or 0.0
    route = _route(u)
    if route == "batch":
        acc["batches"] += 1
    elif route in ("flex", "online"):
        acc["requests"] += 1
    acc["jobs"].add(u["job_id"])


def _finish(acc: dict[str, Any]) -> dict[str, Any]:
    out = dict(acc)
    out["jobs"] = len(acc["jobs"])
    return out


def _route(u: dict[str, Any]) -> str:
    """A usage row's route (a row projected before migration 0008 has none: from its chunk)."""
    from batchgrader.store.readmodels import usage_route

    return u.get("route") or usage_route(None, u.get("chunk"))


def costs(home: HomeLike, since: str | date | None = None, until: str | date | None = None, by: str = "day") -> dict[str, Any]:
    """Billed usage between two UTC days (inclusive), grouped ``by`` day, model, job or route (batch, preflight, flex, online).

    From the ``usage`` table (one row per ``TokensUsed``: what was billed, never re-estimated).
    Sandbox usage is SIMULATED: it is summed into ``simulated_usd``, never into ``cost_usd``.

    Returns ``{by, since, until, rows, totals, daily, source, note}``: ``rows`` are
    ``{key, prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, cost_usd,
    simulated_usd, batches, requests, jobs}`` (``batches``: billed batches; ``requests``: billed
    synchronous requests, flex and online; a preflight is neither) (plus ``file`` when by job) ordered by day, or by cost
    descending for model/job; ``totals`` has the same sums; ``daily`` is
    ``[{day, cost_usd, simulated_usd}]`` for every day with usage (for the chart).
    """
    if by not in COST_GROUPS:
        raise QueryError(f"--by {by!r}: expected one of {', '.join(COST_GROUPS)}")
    lo, hi = _day(since, "since"), _day(until, "until")
    if lo and hi and lo > hi:
        raise QueryError(f"--since {lo} is after --until {hi}")
    with reading(home) as conn, gc_paused():
        problem = read_model_problem(conn)
        if problem is None:
            usage, saved, files = _from_read_model(conn, lo, hi, by == "job")
            source, note = SOURCE_READ_MODEL, None
        else:
            usage, saved, files = _from_log(conn, lo, hi)
            source, note = SOURCE_LOG, fallback_note(problem)
    rows, totals, daily = _grouped(usage, saved, by, files)
    return {
        "by": by,
        "since": lo,
        "until": hi,
        "rows": rows,
        "totals": totals,
        "daily": daily,
        "source": source,
        "note": note,
    }


Rows = list[dict[str, Any]]


def _from_read_model(
    conn: sqlite3.Connection, lo: str | None, hi: str | None, with_files: bool
) -> tuple[Rows, Rows, dict[str, str]]:
    """The usage and savings rows between two days from the read model (and each job's file)."""
    from batchgrader.store import readmodels as rm

    where, args = " WHERE 1=1", []
    if lo:
        where += " AND day >= ?"
        args.append(lo)
    if hi:
        where += " AND day <= ?"
        args.append(hi)
    sql = f"SELECT {', '.join(rm.USAGE_COLUMNS)} FROM usage{where} ORDER BY seq"
    usage = [dict(zip(rm.USAGE_COLUMNS, r)) for r in conn.execute(sql, args)]
    sql = f"SELECT {', '.join(rm.SAVINGS_COLUMNS)} FROM savings{where} ORDER BY seq"
    saved = [dict(zip(rm.SAVINGS_COLUMNS, r)) for r in conn.execute(sql, args)]
    files: dict[str, str] = {}
    if with_files:
        ids = sorted({u["job_id"] for u in [*usage, *saved]})
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            sql = f"SELECT job_id, file FROM job_status WHERE job_id IN ({', '.join('?' * len(part))})"
            files.update(conn.execute(sql, part).fetchall())
    return usage, saved, files


def _from_log(conn: sqlite3.Connection, lo: str | None, hi: str | None) -> tuple[Rows, Rows, dict[str, str]]:
    """The same rows folded from the log, when the read model cannot be trusted."""
    from batchgrader.core.log.state import State
    from batchgrader.store import readmodels as rm  # the fold and projector: only off the fast path

    state = State()
    usage: Rows = []
    saved: Rows = []
    for e in rm.iter_events(conn):
        state.apply(e)
        if e.type == "TokensUsed":
            u = rm.usage_row(e, state.jobs[e.job_id].sandbox)
            if (lo is None or u["day"] >= lo) and (hi is None or u["day"] <= hi):
                usage.append(u)
        elif e.type in rm.SAVING_EVENTS:
            sv = rm.saving_row(e, state.jobs[e.job_id])
            if (lo is None or sv["day"] >= lo) and (hi is None or sv["day"] <= hi):
                saved.append(sv)
    return usage, saved, {j.job_id: j.file for j in state.jobs.values()}


def _grouped(usage: Rows, saved: Rows, by: str, files: dict[str, str]) -> tuple[Rows, dict[str, Any], Rows]:
    """(rows grouped ``by``, totals, daily) of the usage and savings rows."""
    groups: dict[str, dict[str, Any]] = {}
    daily: dict[str, dict[str, Any]] = {}
    totals = _zero()
    for u in usage:
        key = {"day": u["day"], "model": u["model"] or "?", "job": u["job_id"], "route": _route(u)}[by]
        _add(groups.setdefault(key, _zero()), u)
        _add(daily.setdefault(u["day"], _zero()), u)
        _add(totals, u)
    for sv in saved:
        if by != "route":  # a route groups what was billed; the savings stay in the totals
            key = {"day": sv["day"], "model": sv["model"] or "?", "job": sv["job_id"]}[by]
            _add_saving(groups.setdefault(key, _zero()), sv)
        _add_saving(daily.setdefault(sv["day"], _zero()), sv)
        _add_saving(totals, sv)
    rows = []
    for key, acc in groups.items():
        row = {"key": key, **_finish(acc)}
        if by == "job":
            row["file"] = files.get(key, "")
        rows.append(row)
    if by == "day":
        rows.sort(key=lambda r: r["key"])
    else:
        rows.sort(key=lambda r: (-(r["cost_usd"] + r["simulated_usd"]), r["key"]))
    return (
        rows,
        _finish(totals),
        [{"day": d, "cost_usd": a["cost_usd"], "simulated_usd": a["simulated_usd"]} for d, a in sorted(daily.items())],
    )
