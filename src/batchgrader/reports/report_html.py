"""The report of :mod:`batchgrader.reports.report` as one self-contained HTML page.

No script, no stylesheet or font from elsewhere, no network: the charts are inline SVG (one
``<svg class="chart">`` per score column), the confusion matrix a table shaded as a heat map,
the style inline, every text escaped.  Nothing is wider than 60em (840 px), so the page reads
without scrolling sideways at 1280 px.
"""

from __future__ import annotations

from html import escape
from typing import Any

from batchgrader.reports.report_text import AGREEMENT_LABELS, chart_items, num, phase_lines

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{padding:.2em .8em;border-bottom:1px solid #ddd;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.sim{color:#b00;font-weight:bold}
svg.chart{display:block;margin:.5em 0;max-width:100%}svg text{font:12px system-ui,sans-serif;fill:#222}
td{overflow-wrap:anywhere}table.heat td{text-align:center;min-width:2.5em}
blockquote{margin:.2em 0 .2em 1em;color:#444;border-left:3px solid #ccc;padding-left:.6em}
"""


def _chart(col: dict[str, Any]) -> str:
    items = chart_items(col)
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
            f'<text x="{label_w + w + 4}" y="{y + bar_h - 5}">{num(n)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _shown(v: Any) -> str:
    return num(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(f'<tr><th>{escape(str(k))}</th><td class="n">{escape(_shown(v))}</td></tr>' for k, v in rows)
    return f"<table>{cells}</table>"


def _text_column(col: dict[str, Any]) -> str:
    out = []
    length = col.get("length")
    if length:
        out.append(
            f"<p>Free text: {num(length['min'])} to {num(length['max'])} characters "
            f"(median {num(length['median'])}, mean {num(length['mean'])}).</p>"
        )
    for ex in col["examples"]:
        if col.get("examples_by"):
            out.append(f"<h3>{escape(col['examples_by'])} = {escape(ex['level'])}</h3>")
        out += [f"<blockquote>{escape(t)}</blockquote>" for t in ex["texts"]]
    return "".join(out)


def _heat(confusion: dict[str, dict[str, int]]) -> str:
    classes = list(confusion)
    top = max((n for row in confusion.values() for n in row.values()), default=0) or 1
    head = "<tr><th>label \\ answer</th>" + "".join(f"<th>{escape(c[:16])}</th>" for c in classes) + "</tr>"
    body = []
    for a in classes:
        cells = []
        for b in classes:
            n = confusion[a][b]
            shade = round(255 - 170 * n / top)
            colour = f"rgb({shade},{shade},255)" if a == b else f"rgb(255,{shade},{shade})"
            cells.append(f'<td style="background:{colour}" title="label {escape(a)}, answer {escape(b)}: {n}">{num(n)}</td>')
        body.append(f"<tr><th>{escape(a[:16])}</th>{''.join(cells)}</tr>")
    return f'<table class="heat">{head}{"".join(body)}</table>'


def _agreement(a: dict[str, Any]) -> list[str]:
    """Agreement with the labels (with a reference column), then among the samples (with samples)."""
    out = _label_agreement(a) if a.get("reference_column") else []
    out += _panel(a["panel"]) if a.get("panel") else []  # a judge panel: reports/report_panel.py
    return out + (_samples(a["samples"]) if a.get("samples") else [])


def _panel(p: dict[str, Any]) -> list[str]:
    """Agreement among a panel's judges (α, κ of each pair) and each judge's with the labels."""
    judges, alpha = p["judges"], p.get("krippendorff_alpha")
    out = [
        f"<h2>Agreement among the {num(len(judges))} judges</h2>",
        f"<p>{num(p['rows'])} rows; Krippendorff's alpha among the judges: {f'{alpha:.3f}' if alpha is not None else '-'}.</p>",
    ]
    pairs = [(a, b, p["pairwise_kappa"].get(a, {}).get(b)) for i, a in enumerate(judges) for b in judges[i + 1 :]]
    body = "".join(
        f'<tr><th>{escape(a)} / {escape(b)}</th><td class="n">{f"{k:.3f}" if k is not None else "-"}</td></tr>'
        for a, b, k in pairs
    )
    out.append(f"<table><tr><th>judges</th><th>Cohen's kappa</th></tr>{body}</table>")
    if p.get("per_judge"):
        keys = [(k, label) for k, label in AGREEMENT_LABELS if any(f.get(k) is not None for f in p["per_judge"].values())]
        head = "<tr><th>judge</th><th>rows</th>" + "".join(f"<th>{escape(label)}</th>" for _k, label in keys) + "</tr>"
        rows = ""
        for name, f in p["per_judge"].items():
            cells = "".join(f'<td class="n">{f[k]:.3f}</td>' if f.get(k) is not None else "<td>-</td>" for k, _l in keys)
            rows += f'<tr><th>{escape(name)}</th><td class="n">{num(f.get("n") or 0)}</td>{cells}</tr>'
        out.append(f"<h3>Each judge against the labels</h3><table>{head}{rows}</table>")
    return out


def _samples(s: dict[str, Any]) -> list[str]:
    alpha = s.get("krippendorff_alpha")
    shown = f"{alpha:.3f}" if alpha is not None else "-"
    return [
        f"<h2>Agreement among the {num(s['k'])} samples of each row</h2>",
        f"<p>{num(s['rows'])} rows; Krippendorff's alpha ({escape(s['level'])} level) over the samples: {shown};"
        f" {num(s['unanimous'])} rows ({s['unanimous_share']:.1%}) unanimous.</p>",
    ]


def _label_agreement(a: dict[str, Any]) -> list[str]:
    compared = a.get("reference_field") or "the answer column"
    out = [f"<h2>Agreement with the labels in {escape(str(a['reference_column']))} ({escape(str(compared))})</h2>"]
    if a.get("error"):
        return out + [f"<p>{escape(a['error'])}</p>"]
    out.append(
        f"<p>{num(a['n'])} rows compared of {num(a['labelled'])} labelled"
        f" ({num(a['unanswered'])} failed, {num(a['not_comparable'])} answers not comparable);"
        f" 95% intervals from {num(a['bootstrap_resamples'])} bootstrap resamples.</p>"
    )
    head = "<tr><th>figure</th><th>value</th><th>95% interval</th></tr>"
    body = "".join(
        f'<tr><th>{escape(label)}</th><td class="n">{a[key]:.3f}</td><td class="n">{_ci(a["ci"].get(key))}</td></tr>'
        for key, label in AGREEMENT_LABELS
        if a.get(key) is not None
    )
    out.append(f'<table class="agreement">{head}{body}</table>')
    if a.get("confusion"):
        out.append("<h3>Confusion matrix</h3>")
        out.append(_heat(a["confusion"]))
    if a.get("per_class"):
        head = "<tr><th>label</th><th>precision</th><th>recall</th><th>labelled rows</th></tr>"
        body = "".join(
            f'<tr><th>{escape(c)}</th><td class="n">{f["precision"]:.3f}</td><td class="n">{f["recall"]:.3f}</td>'
            f'<td class="n">{num(f["support"])}</td></tr>'
            for c, f in a["per_class"].items()
        )
        out.append(f"<h3>Per class</h3><table>{head}{body}</table>")
    return out


def _ci(ci: list[float] | None) -> str:
    return "n/a" if not ci else f"{ci[0]:.3f} to {ci[1]:.3f}"


def _groups(g: dict[str, Any]) -> list[str]:
    names = list(dict.fromkeys(n for grp in g["groups"] for n in grp["scores"]))
    head = "<tr><th>" + escape(g["column"]) + "</th><th>answered</th><th>failed</th>"
    head += "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    body = []
    for grp in g["groups"]:
        cells = []
        for n in names:
            s = grp["scores"].get(n)
            shown = "" if s is None else (f"{s['mean']:.2f}" if "mean" in s else f"{s['top']} ({s['share']:.0%})")
            cells.append(f'<td class="n">{escape(shown)}</td>')
        body.append(
            f'<tr><td>{escape(grp["value"][:60] or "(empty)")}</td><td class="n">{num(grp["answered"])}</td>'
            f'<td class="n">{num(grp["failed"])}</td>{"".join(cells)}</tr>'
        )
    out = [f"<h2>Scores by {escape(g['column'])}</h2>", f"<table>{head}{''.join(body)}</table>"]
    if g["other_groups"]:
        out.append(f"<p>{num(g['other_groups'])} smaller groups not shown.</p>")
    return out


def _failed_rows(rows: list[dict[str, Any]]) -> list[str]:
    head = "<tr><th>row</th><th>input</th><th>error</th><th>partial answer</th></tr>"
    body = "".join(
        f'<tr><td class="n">{num(f["row"])}</td><td>{escape(", ".join(f"{k}={v}" for k, v in f["input"].items()))}</td>'
        f"<td>{escape(f['error'])}</td><td>{escape(f.get('answer') or '')}</td></tr>"
        for f in rows
    )
    return [f"<h2>Failed rows (first {num(len(rows))})</h2>", f'<table class="failed">{head}{body}</table>']


def _cache_items(t: dict[str, Any], c: dict[str, Any]) -> list[tuple[str, Any]]:
    """The prompt cache's lines of the cost table (none when nothing was read or written)."""
    writes = c.get("cache_write_tokens") or 0
    if not t["cached"] and not writes:
        return []
    return [("prompt-cache writes (tokens)", writes), ("saved by prompt caching (USD)", f"{c.get('cache_saved') or 0:,.4f}")]


def render_html(report: dict[str, Any]) -> str:
    j, r, t, c = report["job"], report["rows"], report["tokens"], report["cost_usd"]
    est = c.get("estimate") or {}
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
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
    if report.get("agreement"):
        out += _agreement(report["agreement"])
    for col in report["columns"]:
        out.append(f"<h2>{escape(col['name'])}</h2>")
        out.append(f"<p>{num(col['values'])} values, {num(col['missing'])} empty</p>")
        out.append(_text_column(col) if col["kind"] == "text" else _chart(col))
    if report.get("groups"):
        out += _groups(report["groups"])
    if report["failed_rows"]:
        out += _failed_rows(report["failed_rows"])
    out.append("<h2>Tokens and cost</h2>")
    out.append(
        _table(
            [
                ("input tokens (billed)", t["prompt"]),
                ("input tokens (estimated before sending)", "n/a" if t["estimated_input"] is None else t["estimated_input"]),
                ("cached input tokens", t["cached"]),
                ("output tokens", t["completion"]),
                ("cost (billed, USD)", f"{c['billed']:,.4f}"),
                ("estimate before sending: input (USD)", f"{est.get('input', 0):,.4f}" if est else "n/a"),
                ("estimate before sending: at most (USD)", f"{est.get('max_total', 0):,.4f}" if est else "n/a"),
            ]
            + _cache_items(t, c)
        )
    )
    out.append("<h2>Time</h2>")
    out.append("".join(f"<p>{escape(line)}</p>" for line in phase_lines(report["phases"])))
    out.append("</body></html>")
    return "\n".join(out) + "\n"
