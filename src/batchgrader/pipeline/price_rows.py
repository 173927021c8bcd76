"""One catalogue file's rows read into :class:`~batchgrader.pipeline.price.Price` values
(:func:`parse_catalogue`): the header checked, each cell in its form (a bad one refused naming its
line and column), a model's dated rows (``price_from``) made its periods, and where each price
figure comes from.  The shipped file and a user's ``pricing.csv`` are read alike
(:func:`batchgrader.pipeline.pricing.load_pricing`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Mapping, Sequence
from datetime import date

from batchgrader.pipeline.maintained import PRICE_FIELDS, SHIPPED_SOURCE, USER_SOURCE, shipped_figures
from batchgrader.pipeline.modelspec import CatalogueFormatError, parse_spec
from batchgrader.pipeline.price import COLUMNS, DATED_ROW_COLUMNS, REQUIRED, SHIPPED, Price, PricePeriod, PricingError, is_date


def _price_value(text: str, where: str, column: str, required: bool) -> float | None:
    text = text.strip().lstrip("$").strip()
    if not text:
        if required:
            raise PricingError(f"{where}, column {column!r}: a price is required (USD per 1M tokens)")
        return None
    try:
        value = float(text)
    except ValueError:
        raise PricingError(f"{where}, column {column!r}: {text!r} is not a number (USD per 1M tokens, e.g. 0.075)") from None
    if not math.isfinite(value) or value < 0:
        raise PricingError(f"{where}, column {column!r}: {text!r} must be a finite price >= 0")
    return value


def parse_catalogue(
    text: str, name: str, origin: str, base: Mapping[str, Price] | None = None, day: date | None = None
) -> dict[str, Price]:
    """The rows of one catalogue file; a catalogue column the header leaves out is taken from
    ``base``'s row of the same model (the shipped row, for a user file).  A model's dated rows
    (``price_from``) become its :attr:`Price.periods`; with ``day`` each row is the prices in
    force that day, else the prices before its first dated row."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    reader.fieldnames = _checked_header(reader.fieldnames, name)
    out: dict[str, Price] = {}
    first_line: dict[str, int] = {}
    dated: dict[str, dict[str, tuple[int, PricePeriod]]] = {}
    for row in reader:
        line = reader.line_num
        where = f"{name}, line {line}"
        if None in row:
            raise PricingError(f"{where}: more fields than the {len(reader.fieldnames)} columns of the header")
        cells = {k: (v or "") for k, v in row.items()}
        model = cells["model"].strip()
        if not model:
            if not any(v.strip() for v in cells.values()):
                continue  # a line of empty cells
            raise PricingError(f"{where}, column 'model': the model name is empty")
        key = model.lower()
        base_row = (base or {}).get(key)
        if cells.get("price_from", "").strip():
            start, period = _dated_row(cells, model, where, first_line.get(key), base_row)
            seen = dated.setdefault(key, {})
            if start in seen:
                raise PricingError(f"{where}, column 'price_from': {model!r} has a row from {start} on line {seen[start][0]}")
            seen[start] = (line, period)
            continue
        if key in first_line:
            raise PricingError(f"{where}, column 'model': {model!r} is already listed on line {first_line[key]}")
        first_line[key] = line
        out[key] = _price_row(cells, model, where, origin, base_row)
    for key, price in out.items():
        if key in dated:
            price = _with_periods(price, [p for _, (_, p) in sorted(dated[key].items())])
        if day is not None:
            price = price.on(day)
        out[key] = dataclasses.replace(price, sources=_sources(price, reader.fieldnames, origin, (base or {}).get(key)))
    return out


def _dated_row(
    cells: dict[str, str], model: str, where: str, model_line: int | None, base: Price | None
) -> tuple[str, PricePeriod]:
    """A dated row's :class:`PricePeriod`; refused unless it follows the model's undated row and
    fills only :data:`DATED_ROW_COLUMNS`.  A price column the header leaves out is ``base``'s."""
    start = cells["price_from"].strip()
    if not is_date(start):
        raise PricingError(f"{where}, column 'price_from': {start!r} must be a date YYYY-MM-DD (UTC), or empty")
    if model_line is None:
        raise PricingError(
            f"{where}, column 'price_from': the prices of {model!r} from {start} need the model's row without "
            "'price_from' above them (it holds the model's rules and its prices before that day)"
        )
    stray = [c for c, v in cells.items() if v.strip() and c not in DATED_ROW_COLUMNS]
    if stray:
        raise PricingError(
            f"{where}, column {stray[0]!r}: a dated row (price_from) carries prices only; put {stray[0]!r} on the "
            f"row of {model!r} without 'price_from' (line {model_line})"
        )
    day = date.fromisoformat(start).isoformat()
    return day, _period(_price_row(cells, model, where, "", base), day)


def _with_periods(price: Price, later: list[PricePeriod]) -> Price:
    """``price`` (its undated row) with its dated periods; its own figures stay those before the first."""
    return dataclasses.replace(price, periods=(_period(price, None), *later))


def _period(price: Price, start: str | None) -> PricePeriod:
    """The figures of ``price``'s row as the period from ``start`` (None: before any dated row)."""
    spec = price.spec
    return PricePeriod(
        start=start,
        input_per_1m=price.input_per_1m,
        cached_input_per_1m=price.cached_input_per_1m,
        output_per_1m=price.output_per_1m,
        cache_write_per_1m=spec.cache_write_per_1m,
        standard_input_per_1m=spec.standard_input_per_1m,
        standard_cached_input_per_1m=spec.standard_cached_input_per_1m,
        standard_output_per_1m=spec.standard_output_per_1m,
        taken_on=price.taken_on,
        source=price.source,
    )


def _sources(price: Price, header: Sequence[str], origin: str, base: Price | None) -> tuple[tuple[str, str], ...]:
    """Each price figure's source: a user file's for every column its header has (an empty cell is
    its choice), else the base row's; the shipped file's for each figure it gives."""
    if origin == SHIPPED:
        figures = shipped_figures(price)
        return tuple((f, SHIPPED_SOURCE) for f in PRICE_FIELDS if figures[f] is not None)
    inherited = dict(base.sources) if base is not None else {}
    return tuple(
        (f, USER_SOURCE if f in header or base is None else inherited[f])
        for f in PRICE_FIELDS
        if f in header or base is None or f in inherited
    )


def _checked_header(header: Sequence[str | None] | None, name: str) -> list[str]:
    """The header's column names, stripped; a missing required, unknown or repeated column is refused."""
    if not header:
        raise PricingError(f"{name}: empty file; expected a header line with the columns {','.join(COLUMNS)}")
    names = [h.strip() if h is not None else "" for h in header]
    missing = [c for c in REQUIRED if c not in names]
    unknown = [h for h in names if h not in COLUMNS]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            parts.append(f"unknown column(s) {', '.join(repr(u) for u in unknown)}")
        raise PricingError(f"{name}, line 1 (header): {'; '.join(parts)}; the columns are {','.join(COLUMNS)}")
    dupes = {h for h in names if names.count(h) > 1}
    if dupes:
        raise PricingError(f"{name}, line 1 (header): column(s) {', '.join(sorted(dupes))} appear more than once")
    return names


def _price_row(cells: dict[str, str], model: str, where: str, origin: str, shipped: Price | None) -> Price:
    """One row's :class:`Price`; a cell out of form is refused naming its line and column."""
    inp = _price_value(cells["input_per_1m"], where, "input_per_1m", True)
    cached = _price_value(cells.get("cached_input_per_1m", ""), where, "cached_input_per_1m", False)
    outp = _price_value(cells["output_per_1m"], where, "output_per_1m", True)
    cw_text = cells.get("context_window", "").strip().replace(",", "").replace("_", "")
    cw: int | None = None
    if cw_text:
        if not cw_text.isdigit() or int(cw_text) < 1:
            raise PricingError(f"{where}, column 'context_window': {cw_text!r} must be a whole number of tokens >= 1, or empty")
        cw = int(cw_text)
    taken = cells.get("taken_on", "").strip() or None
    if taken is not None and not is_date(taken):
        raise PricingError(f"{where}, column 'taken_on': {taken!r} must be a date YYYY-MM-DD, or empty")
    try:
        spec = parse_spec(cells, shipped.spec if shipped is not None else None)
    except CatalogueFormatError as exc:
        raise PricingError(f"{where}, {exc}") from None
    return Price(
        model=model,
        input_per_1m=inp,  # type: ignore[arg-type]  # required: never None
        cached_input_per_1m=cached,
        output_per_1m=outp,  # type: ignore[arg-type]
        context_window=cw,
        taken_on=taken,
        source=cells.get("source", "").strip() or None,
        origin=origin,
        spec=spec,
    )
