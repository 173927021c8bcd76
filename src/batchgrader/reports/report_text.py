"""The terminal summary of :mod:`batchgrader.reports.report`: the same figures as the HTML page
(counts with thousands separators, bars drawn with blocks)."""

from __future__ import annotations

from typing import Any

BAR_WIDTH = 40


def num(x: float) -> str:
    """A count with thousands separators, or a figure to three significant digits."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.1f}"


def figure(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def interval(ci: list[float] | None, digits: int = 3) -> str:
    return "" if not ci else f"  (95% CI {ci[0]:.{digits}f} to {ci[1]:.{digits}f})"


def bin_label(b: dict[str, Any]) -> str:
    return num(b["low"]) if b["low"] == b["high"] else f"{num(b['low'])}–{num(b['high'])}"


def chart_items(col: dict[str, Any]) -> list[tuple[str, int]]:
    """(label, count) of each bar of a score column."""
    if col["kind"] == "numeric":
        return [(bin_label(b), b["count"]) for b in col["bins"]]
    items = [(v["value"].replace("\n", " ")[:30], v["count"]) for v in col["counts"]]
    if col["other"]:
        items.append((f"({num(col['distinct'] - len(col['counts']))} others)", col["other"]))
    return items


def phase_lines(phases: list[dict[str, Any]]) -> list[str]:
    """One line per attempt (the idle time before a retry on the retry's line), then the total."""
    by_attempt: dict[Any, list[str]] = {}
    for p in phases:
        if p["seconds"] is not None:
            by_attempt.setdefault(p.get("attempt"), []).append(f"{p['phase']} {p['seconds']:,.1f}s")
    attempts = [a for a in by_attempt if a is not None]
    lines = []
    for a in attempts:
        label = "" if len(attempts) == 1 else ("first run: " if a == 1 else f"retry {a - 1}: ")
        lines.append(label + ", ".join(by_attempt[a]))
    lines += by_attempt.get(None, [])
    return lines


def _rows(r: dict[str, Any]) -> list[str]:
    retry = r.get("answered_on_retry")
    consensus = " with a consensus" if r.get("no_consensus") is not None else ""
    lines = [
        f"rows      {num(r['total'])} total, {num(r['answered'])} answered"
        + (f" ({num(retry)} on retry)" if retry else "")
        + consensus
        + f", {num(r['failed'])} failed"
    ]
    for code, n in (r.get("failed_by_code") or {}).items():
        lines.append(f"            {num(n):>7}  {code}")
    return lines


def _money(t: dict[str, Any], c: dict[str, Any]) -> list[str]:
    est = c.get("estimate") or {}
    est_in = t["estimated_input"]
    return [
        f"tokens    {num(t['prompt'])} input (estimated {num(est_in) if est_in is not None else 'n/a'}), "
        f"{num(t['completion'])} output" + (f", {num(t['cached'])} cached" if t["cached"] else ""),
        f"cost      ${c['billed']:,.4f}"
        + (
            f" (estimated before sending: ${est.get('input', 0):,.4f} input, at most ${est.get('max_total', 0):,.4f})"
            if est
            else ""
        ),
    ] + _cache_line(t, c)


def _judge_lines(judges: list[dict[str, Any]] | None) -> list[str]:
    """A panel's judges: each one's job, model, rows and cost (the panel's cost is their sum)."""
    lines = []
    for i, j in enumerate(judges or ()):
        failed = f", {num(j['failed'])} failed" if j["failed"] else ""
        lines.append(
            ("judges    " if i == 0 else "          ")
            + f"{j['profile']} ({j['model']}): job {j['job_id']}, {j['state']}, {num(j['answered'])}/{num(j['requests'])} "
            + f"requests answered{failed}, {num(j['prompt_tokens'])} input / {num(j['completion_tokens'])} output tokens, "
            + f"${j['cost_usd']:,.4f}"
        )
    return lines


def _cache_line(t: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """What the prompt cache read, wrote and saved (nothing when it was not used)."""
    writes = c.get("cache_write_tokens") or 0
    if not t["cached"] and not writes:
        return []
    return [f"cache     {num(t['cached'])} tokens read, {num(writes)} written; saved ${c.get('cache_saved') or 0:,.4f}"]


def _route_line(route: dict[str, Any] | None) -> list[str]:
    """Rows and cost by route (nothing for a job that went by batch alone)."""
    if not route or not (route["rows"]["flex"] or route["rows"]["online"]):
        return []
    parts = [
        f"{name} {num(route['rows'][name])} rows ${route['cost_usd'][name]:,.4f}"
        for name in ("online", "flex", "batch")
        if route["rows"][name] or route["cost_usd"][name]
    ]
    resent = f"; {route['resent_after_crash']} resent after a crash" if route.get("resent_after_crash") else ""
    return [f"route     {route['route']}: " + ", ".join(parts) + resent]


def _bars(items: list[tuple[str, int]], width: int) -> list[str]:
    top = max((n for _l, n in items), default=0) or 1
    label_w = max((len(label) for label, _n in items), default=0)
    return [f"  {label:<{label_w}}  {'█' * max(1 if n else 0, round(n * width / top))} {num(n)}" for label, n in items]


def _column(col: dict[str, Any], width: int) -> list[str]:
    lines = ["", f"{col['name']}  ({num(col['values'])} values, {num(col['missing'])} empty)"]
    if col["kind"] != "text":
        return lines + _bars(chart_items(col), width)
    length = col.get("length")
    if length:
        lines.append(f"  free text, {num(length['min'])}–{num(length['max'])} characters (median {num(length['median'])})")
    for ex in col["examples"]:
        head = f"  {col['examples_by']} = {ex['level']}:" if col.get("examples_by") else "  examples:"
        lines.append(head)
        lines += [f"    “{t.replace(chr(10), ' ')[:100]}”" for t in ex["texts"]]
    return lines


def _groups(g: dict[str, Any]) -> list[str]:
    lines = ["", f"by {g['column']}"]
    for grp in g["groups"]:
        scores = ", ".join(
            f"{name} {s['mean']:.2f}" if "mean" in s else f"{name} {s['top']} {s['share']:.0%}"
            for name, s in grp["scores"].items()
        )
        failed = f", {num(grp['failed'])} failed" if grp["failed"] else ""
        lines.append(
            f"  {grp['value'][:30] or '(empty)'}: {num(grp['answered'])} answered{failed}" + (f"; {scores}" if scores else "")
        )
    if g["other_groups"]:
        lines.append(f"  ({num(g['other_groups'])} more groups)")
    return lines


AGREEMENT_LABELS = [
    ("accuracy", "accuracy"),
    ("cohen_kappa", "Cohen's kappa"),
    ("weighted_kappa", "weighted kappa (quadratic)"),
    ("baseline_accuracy", "majority-class baseline"),
    ("mae", "mean absolute error"),
    ("rmse", "root mean square error"),
    ("pearson", "Pearson r"),
    ("spearman", "Spearman rho"),
]


def agreement_lines(a: dict[str, Any]) -> list[str]:
    """Agreement with the labels (with a reference column), then among the samples (with samples)."""
    lines = _label_lines(a) if a.get("reference_column") else []
    lines += panel_lines(a["panel"]) if a.get("panel") else []  # a judge panel: reports/report_panel.py
    return lines + (sample_lines(a["samples"]) if a.get("samples") else [])


def panel_lines(p: dict[str, Any]) -> list[str]:
    """Agreement among a panel's judges, and each judge's with the labels."""
    alpha, judges = p.get("krippendorff_alpha"), p["judges"]
    lines = [
        "",
        f"agreement among the {len(judges)} judges ({num(p['rows'])} rows)",
        f"  {'Krippendorff alpha':<28}{figure(alpha) if alpha is not None else '-':>7}",
    ]
    for i, a in enumerate(judges):
        for b in judges[i + 1 :]:
            k = p["pairwise_kappa"].get(a, {}).get(b)
            lines.append(f"  {'Cohen kappa ' + a + ' / ' + b:<28}{figure(k) if k is not None else '-':>7}")
    for name, f in (p.get("per_judge") or {}).items():
        if f.get("error"):
            lines.append(f"  {name}: {f['error']}")
            continue
        shown = [
            f"{label} {figure(f[key])}"
            for key, label in (("accuracy", "accuracy"), ("cohen_kappa", "kappa"), ("mae", "MAE"))
            if f.get(key) is not None
        ]
        lines.append(f"  {name} against the labels ({num(f['n'])} rows): " + ", ".join(shown))
    return lines


def sample_lines(s: dict[str, Any]) -> list[str]:
    alpha = s.get("krippendorff_alpha")
    return [
        "",
        f"agreement among the {s['k']} samples of each row ({num(s['rows'])} rows)",
        f"  {'Krippendorff alpha (' + s['level'] + ')':<28}{figure(alpha) if alpha is not None else '-':>7}",
        f"  {'unanimous rows':<28}{num(s['unanimous']):>7} ({s['unanimous_share']:.1%})",
    ]


def _label_lines(a: dict[str, Any]) -> list[str]:
    compared = a.get("reference_field") or "the answer column"
    lines = ["", f"agreement with the labels in {a['reference_column']!r} ({compared})"]
    if a.get("error"):
        return lines + [f"  {a['error']}"]
    lines.append(
        f"  {num(a['n'])} rows compared of {num(a['labelled'])} labelled"
        + (f" ({num(a['unanswered'])} failed" if a["unanswered"] else "")
        + (")" if a["unanswered"] else "")
        + (f", {num(a['not_comparable'])} answers not comparable" if a["not_comparable"] else "")
    )
    for key, label in AGREEMENT_LABELS:
        if a.get(key) is not None:
            lines.append(f"  {label:<28}{figure(a[key]):>7}{interval(a['ci'].get(key))}")
    confusion = a.get("confusion")
    if confusion:
        lines += _confusion(confusion)
    per_class = a.get("per_class") or {}
    if per_class:
        w = max(5, min(16, max(len(c) for c in per_class)))
        lines.append("  " + "class".ljust(w) + "  precision  recall  labelled")
        for c, f in per_class.items():
            lines.append(f"  {c[:w]:<{w}}  {f['precision']:>9.3f}  {f['recall']:>6.3f}  {num(f['support']):>8}")
    return lines


def _confusion(confusion: dict[str, dict[str, int]], width: int = 78) -> list[str]:
    """The confusion matrix within ``width`` columns where it can be: class names are cut
    first, never below the widest count."""
    classes = list(confusion)
    counts = max(len(num(n)) for row in confusion.values() for n in row.values())
    names = max(len(c) for c in classes)
    w = max(counts, min(12, names, (width - 2) // (len(classes) + 1) - 1), 3)
    out = ["  confusion (rows: label, columns: answer)"]
    out.append("  " + " " * w + "".join(f"{c[:w]:>{w + 1}}" for c in classes))
    for c in classes:
        out.append(f"  {c[:w]:<{w}}" + "".join(f"{num(confusion[c][d]):>{w + 1}}" for d in classes))
    return out


def _failed(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", f"failed rows (first {num(len(rows))})"]
    for f in rows[:10]:
        lines.append(f"  row {num(f['row'])}: {f['error'][:100]}")
        if f.get("answer"):
            lines.append(f"    partial answer: {f['answer'][:100]}")
    if len(rows) > 10:
        lines.append(f"  ... {num(len(rows) - 10)} more (see --json or --html)")
    return lines


def render_text(report: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """The compact terminal summary."""
    j = report["job"]
    lines = [f"job {j['id']}  {j['file']}  {j['state']}" + ("  (SIMULATED)" if j["sandbox"] else "")]
    if j.get("error"):
        lines.append(f"  error: {j['error']}")
    lines += _rows(report["rows"])
    lines += _money(report["tokens"], report["cost_usd"])
    lines += _judge_lines(report.get("judges"))
    lines += _route_line(report.get("route"))
    for i, line in enumerate(phase_lines(report["phases"])):
        lines.append(("time      " if i == 0 else "          ") + line)
    if report.get("agreement"):
        lines += agreement_lines(report["agreement"])
    for col in report["columns"]:
        lines += _column(col, width)
    if report.get("groups"):
        lines += _groups(report["groups"])
    if report["failed_rows"]:
        lines += _failed(report["failed_rows"])
    return "\n".join(lines) + "\n"
