"""The report of :mod:`batchgrader.store.report` as one self-contained HTML page.

No script, no stylesheet or font from elsewhere, no network: the charts are inline SVG (one
``<svg class="chart">`` per result column), the style is inline, every text is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{padding:.2em .8em;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.sim{color:#b00;font-weight:bold}
svg.chart{display:block;margin:.5em 0}svg text{font:12px system-ui,sans-serif;fill:#222}
"""


def _label(b: dict[str, Any]) -> str:
    def f(x: float) -> str:
        return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"

    return f(b["low"]) if b["low"] == b["high"] else f"{f(b['low'])}–{f(b['high'])}"


def _chart(col: dict[str, Any]) -> str:
    if col["kind"] == "numeric":
        items = [(_label(b), b["count"]) for b in col["bins"]]
    else:
        items = [(v["value"].replace("\n", " ")[:40], v["count"]) for v in col["counts"]]
        if col["other"]:
            items.append((f"({col['distinct'] - len(col['counts'])} others)", col["other"]))
    bar_h, gap, label_w, bar_w = 18, 4, 260, 380
    top = max((n for _l, n in items), default=0) or 1
    height = max(1, len(items)) * (bar_h + gap) + gap
    parts = [
        f'<svg class="chart" data-column="{escape(col["name"])}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{label_w + bar_w + 60}" height="{height}" role="img" aria-label="{escape(col["name"])}">'
    ]
    for i, (label, n) in enumerate(items):
        y = gap + i * (bar_h + gap)
        w = round(n * bar_w / top)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 5}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar_h}" fill="#4a78b5"><title>{escape(label)}: {n}</title></rect>'
            f'<text x="{label_w + w + 4}" y="{y + bar_h - 5}">{n}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f'<tr><th>{escape(str(k))}</th><td class="n">{escape(str(v))}</td></tr>' for k, v in rows)
    return f"<table>{cells}</table>"


def render_html(report: dict[str, Any]) -> str:
    j, r, t, c = report["job"], report["rows"], report["tokens"], report["cost_usd"]
    est = c.get("estimate") or {}
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>BatchGrader report: {escape(j['file'])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{escape(j['file'])} <small>({escape(j['state'])})</small></h1>",
        f"<p>job <code>{escape(j['id'])}</code>, model {escape(str(j['model']))}, profile {escape(str(j['profile']))}</p>",
    ]
    if j["sandbox"]:
        out.append('<p class="sim">SIMULATED results (emulator), not a real model.</p>')
    if j.get("error"):
        out.append(f"<p>Error: {escape(str(j['error']))}</p>")
    out.append("<h2>Rows</h2>")
    row_items: list[tuple[str, Any]] = [("rows", r["total"]), ("answered", r["answered"])]
    if r.get("answered_on_retry") is not None:
        row_items.append(("answered on retry", r["answered_on_retry"]))
    row_items.append(("failed", r["failed"]))
    row_items += [(f"failed: {code}", n) for code, n in (r.get("failed_by_code") or {}).items()]
    out.append(_table(row_items))
    out.append("<h2>Tokens and cost</h2>")
    out.append(
        _table(
            [
                ("input tokens (billed)", t["prompt"]),
                ("input tokens (estimated before sending)", t["estimated_input"]),
                ("cached input tokens", t["cached"]),
                ("output tokens", t["completion"]),
                ("cost (billed, USD)", f"{c['billed']:.4f}"),
                ("estimate before sending: input (USD)", f"{est.get('input', 0):.4f}" if est else "n/a"),
                ("estimate before sending: at most (USD)", f"{est.get('max_total', 0):.4f}" if est else "n/a"),
            ]
        )
    )
    out.append("<h2>Time per phase</h2>")
    out.append(_table([(p["phase"], "n/a" if p["seconds"] is None else f"{p['seconds']:.1f} s") for p in report["phases"]]))
    for col in report["columns"]:
        out.append(f"<h2>{escape(col['name'])}</h2>")
        out.append(f"<p>{col['values']} values, {col['missing']} empty</p>")
        out.append(_chart(col))
    if report["failed_rows"]:
        out.append(f"<h2>Failed rows (first {len(report['failed_rows'])})</h2>")
        head = "<tr><th>row</th><th>input</th><th>error</th></tr>"
        body = "".join(
            f'<tr><td class="n">{f["row"]}</td><td>{escape(", ".join(f"{k}={v}" for k, v in f["input"].items()))}</td>'
            f"<td>{escape(f['error'])}</td></tr>"
            for f in report["failed_rows"]
        )
        out.append(f'<table class="failed">{head}{body}</table>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
