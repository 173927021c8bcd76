"""Batch API prices: the shipped table, user overrides, cost estimates and billed cost.

Prices are USD per 1,000,000 tokens at *Batch* rates.  The package ships ``data/pricing.csv``;
at load time each shipped row's prices are replaced by ``genai-prices``' figures where it has
the model (:mod:`batchgrader.pipeline.maintained`; the row's rule columns stay), and a user CSV
with the same columns (normally ``pricing.csv`` in the home) is merged over that: a user row
replaces the row of the same model as a whole, or adds a model.  Each price figure records its
source (:attr:`Price.sources`).

Columns: ``model,input_per_1m,cached_input_per_1m,output_per_1m,context_window,taken_on,source,price_from``
and the rule columns (:data:`~batchgrader.pipeline.modelspec.SPEC_COLUMNS`).
``model``, ``input_per_1m`` and ``output_per_1m`` are required in every row; the other columns
may be left out of a user file or left empty (an empty cached price means cached input is billed
at the input price; an empty context window means unknown).

**Dated prices.** A row with a ``price_from`` date (UTC) gives the prices of a model *in force from
that day*: it follows the model's row without one (whose prices apply before every dated row) and
carries prices only (its rule cells stay empty; the model's row holds the rules).  A job is priced
by the prices in force on the day they are looked up (:meth:`PriceTable.get`, UTC today unless the
table is pinned to a day with :meth:`PriceTable.on`).

Arithmetic is done in :class:`~decimal.Decimal` on the prices' decimal text, so
``1,000,000 x $0.075`` is exactly ``0.075``; results are returned as ``float`` (round them only
for display).  Prices are looked up before anything is submitted: an unknown model raises
:class:`PricingError` so no money is spent on a job whose cost cannot be estimated.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from batchgrader.pipeline.maintained import (
    DELIBERATE_DIFFERENCES,
    PRICE_FIELDS,
    SHIPPED_SOURCE,
    USER_SOURCE,
    genai_prices_source,
    maintained_prices,
    shipped_figures,
)
from batchgrader.pipeline.modelspec import SPEC_COLUMNS, CatalogueFormatError, ModelSpec, parse_spec

__all__ = [
    "COLUMNS",
    "PricingError",
    "Price",
    "PriceTable",
    "Estimate",
    "load_pricing",
    "estimate",
    "billed_cost",
    "cache_saving",
    "with_deployments",
    "with_maintained",
]

COLUMNS = (
    "model",
    "input_per_1m",
    "cached_input_per_1m",
    "output_per_1m",
    "context_window",
    "taken_on",
    "source",
    "price_from",
    *SPEC_COLUMNS,
)
#: the cells a dated row (``price_from`` set) may fill: its prices and where they come from
DATED_ROW_COLUMNS = ("model", "price_from", "taken_on", "source", *PRICE_FIELDS)
REQUIRED = ("model", "input_per_1m", "output_per_1m")
SHIPPED = "shipped"

_MILLION = Decimal(1_000_000)
_DATED = re.compile(r"^(?P<base>.+)-(?P<date>\d{4}-\d{2}-\d{2})$")
_DATED_COMPACT = re.compile(r"^(?P<base>.+)-(?P<date>\d{8})$")


PRICING_DOCS = "https://developers.openai.com/api/docs/pricing"


class PricingError(ValueError):
    """A price table is malformed, or a model has no price."""


@dataclass(frozen=True)
class PricePeriod:
    """A catalogue row's prices in force from ``start`` (a UTC day, YYYY-MM-DD; None: from the
    first day, until the first dated period).  USD per 1M tokens, as :class:`Price`'s fields."""

    start: str | None
    input_per_1m: float
    cached_input_per_1m: float | None
    output_per_1m: float
    cache_write_per_1m: float | None = None
    standard_input_per_1m: float | None = None
    standard_cached_input_per_1m: float | None = None
    standard_output_per_1m: float | None = None
    taken_on: str | None = None
    source: str | None = None

    @property
    def start_day(self) -> date:
        return date.min if self.start is None else date.fromisoformat(self.start)


@dataclass(frozen=True)
class Price:
    """One model's Batch prices in USD per 1M tokens.

    ``cached_input_per_1m=None`` means no separate cached rate: cached input tokens are billed at
    ``input_per_1m``.  ``origin`` is ``"shipped"`` or the path of the user file the row came from.
    """

    model: str
    input_per_1m: float
    cached_input_per_1m: float | None
    output_per_1m: float
    context_window: int | None = None
    taken_on: str | None = None
    source: str | None = None
    origin: str = SHIPPED
    #: what the model accepts (provider, limits, reasoning, temperature, ...): the catalogue columns
    spec: ModelSpec = ModelSpec()
    #: (price field, source) for each figure: "genai-prices X.Y.Z", "shipped catalogue" or "your pricing.csv";
    #: a field neither a source nor the shipped row gives (its fallback rule applies) is left out
    sources: tuple[tuple[str, str], ...] = ()
    #: the first day the figures above are in force (None: from the first day); see :attr:`periods`
    price_from: str | None = None
    #: every period of a row with dated prices, in order (empty: one price, always in force)
    periods: tuple[PricePeriod, ...] = ()

    def on(self, day: date) -> Price:
        """The prices in force on ``day`` (UTC): the last period starting on or before it."""
        if not self.periods:
            return self
        period = self.periods[0]
        for p in self.periods[1:]:
            if p.start_day <= day:
                period = p
        if period.start == self.price_from:
            return self
        spec = dataclasses.replace(
            self.spec,
            cache_write_per_1m=period.cache_write_per_1m,
            standard_input_per_1m=period.standard_input_per_1m,
            standard_cached_input_per_1m=period.standard_cached_input_per_1m,
            standard_output_per_1m=period.standard_output_per_1m,
        )
        out = dataclasses.replace(
            self,
            input_per_1m=period.input_per_1m,
            cached_input_per_1m=period.cached_input_per_1m,
            output_per_1m=period.output_per_1m,
            taken_on=period.taken_on,
            source=period.source,
            spec=spec,
            price_from=period.start,
        )
        if self.origin == SHIPPED:  # every figure of a shipped period is the shipped file's
            figures = shipped_figures(out)
            out = dataclasses.replace(out, sources=tuple((f, SHIPPED_SOURCE) for f in PRICE_FIELDS if figures[f] is not None))
        return out

    def changes_after(self, day: date) -> list[date]:
        """The days after ``day`` on which this row's prices change."""
        return [p.start_day for p in self.periods if p.start is not None and p.start_day > day]

    @property
    def price_source(self) -> str:
        """Where the row's prices come from: one source, or the sources joined with " + "."""
        seen = list(dict.fromkeys(src for _, src in self.sources))
        return " + ".join(seen) if seen else (SHIPPED_SOURCE if self.origin == SHIPPED else USER_SOURCE)

    @property
    def effective_cached_per_1m(self) -> float:
        return self.input_per_1m if self.cached_input_per_1m is None else self.cached_input_per_1m


@dataclass(frozen=True)
class Estimate:
    """Cost of a batch before it runs: input exact, output an upper bound (every request uses its
    whole ``max_completion_tokens``)."""

    input_usd: float
    max_output_usd: float
    max_total_usd: float


def _d(x: float) -> Decimal:
    # repr gives the shortest text that round-trips, i.e. the decimal the CSV said.
    return Decimal(repr(x))


def _count(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    return v


def estimate(price: Price, input_tokens: int, requests: int, max_completion_tokens: int) -> Estimate:
    """Input cost (exact, uncached) plus the worst-case output cost ``requests x max_completion_tokens``."""
    _count("input_tokens", input_tokens)
    _count("requests", requests)
    _count("max_completion_tokens", max_completion_tokens)
    inp = Decimal(input_tokens) * _d(price.input_per_1m) / _MILLION
    out = Decimal(requests) * Decimal(max_completion_tokens) * _d(price.output_per_1m) / _MILLION
    return Estimate(input_usd=float(inp), max_output_usd=float(out), max_total_usd=float(inp + out))


#: a prompt-cache write (Anthropic ``cache_creation_input_tokens``, 5-minute cache) is billed at
#: 1.25 x the input price: https://platform.claude.com/docs/en/build-with-claude/prompt-caching
#: (checked 2026-11-23; the batch discount applies to it like to every input token)
CACHE_WRITE_MULTIPLIER = Decimal("1.25")


def _cache_write_price(price: Price) -> Decimal:
    """The catalogue's cache-write price when the row has one, else :data:`CACHE_WRITE_MULTIPLIER` x input."""
    if price.spec.cache_write_per_1m is not None:
        return _d(price.spec.cache_write_per_1m)
    return _d(price.input_per_1m) * CACHE_WRITE_MULTIPLIER


#: Batch prices are half the standard (synchronous) prices at OpenAI, Anthropic and Gemini: the
#: standard price of a catalogue row without ``standard_*`` prices of its own.
STANDARD_OVER_BATCH = 2.0


def standard_price(price: Price) -> Price:
    """A model's standard (synchronous API) prices, as the preflight pays them: the catalogue row's
    ``standard_*`` prices, each one it lacks taken as the batch price times :data:`STANDARD_OVER_BATCH`."""
    spec = price.spec

    def std(own: float | None, batch: float | None) -> float | None:
        if own is not None:
            return own
        return None if batch is None else batch * STANDARD_OVER_BATCH

    return dataclasses.replace(
        price,
        input_per_1m=std(spec.standard_input_per_1m, price.input_per_1m) or 0.0,
        cached_input_per_1m=std(spec.standard_cached_input_per_1m, price.cached_input_per_1m),
        output_per_1m=std(spec.standard_output_per_1m, price.output_per_1m) or 0.0,
    )


def billed_cost(
    price: Price, prompt_tokens: int, cached_tokens: int, completion_tokens: int, cache_write_tokens: int = 0
) -> float:
    """What the provider bills for reported usage.

    ``prompt_tokens`` includes ``cached_tokens`` and ``cache_write_tokens`` (as in the usage the
    adapters report); the rest is billed at the input price, the cached part at the cached price
    (or the input price when the model has none), the cache writes at the row's
    ``cache_write_per_1m`` (else :data:`CACHE_WRITE_MULTIPLIER` x the input price).  ``completion_tokens`` includes reasoning
    tokens and is billed at the output price.
    """
    _count("prompt_tokens", prompt_tokens)
    _count("cached_tokens", cached_tokens)
    _count("completion_tokens", completion_tokens)
    _count("cache_write_tokens", cache_write_tokens)
    if cached_tokens + cache_write_tokens > prompt_tokens:
        raise ValueError(
            f"cached_tokens ({cached_tokens}) plus cache_write_tokens ({cache_write_tokens}) cannot exceed prompt_tokens ({prompt_tokens})"
        )
    total = (
        Decimal(prompt_tokens - cached_tokens - cache_write_tokens) * _d(price.input_per_1m)
        + Decimal(cached_tokens) * _d(price.effective_cached_per_1m)
        + Decimal(cache_write_tokens) * _cache_write_price(price)
        + Decimal(completion_tokens) * _d(price.output_per_1m)
    ) / _MILLION
    return float(total)


def cache_saving(
    price: Price, prompt_tokens: int, cached_tokens: int, completion_tokens: int, cache_write_tokens: int = 0
) -> float:
    """What prompt caching saved on reported usage: :func:`billed_cost` with every prompt token
    at the input price, minus the billed cost (negative when the cache writes cost more than the
    reads saved).  Computed on the decimal prices, so no saving shows where none was made."""
    _count("prompt_tokens", prompt_tokens)
    _count("cached_tokens", cached_tokens)
    _count("cache_write_tokens", cache_write_tokens)
    if cached_tokens + cache_write_tokens > prompt_tokens:
        raise ValueError(
            f"cached_tokens ({cached_tokens}) plus cache_write_tokens ({cache_write_tokens}) cannot exceed prompt_tokens ({prompt_tokens})"
        )
    inp = _d(price.input_per_1m)
    saved = Decimal(cached_tokens) * (inp - _d(price.effective_cached_per_1m)) + Decimal(cache_write_tokens) * (
        inp - _cache_write_price(price)
    )
    return float(saved / _MILLION)


def _utc_today() -> date:
    return datetime.now(UTC).date()


#: how many days' resolved tables a :class:`PriceTable` keeps (a daemon asks for today's, a check a few)
_DAYS_KEPT = 8


class PriceTable(Mapping[str, Price]):
    """Prices by model name (keys are lower-case).  Use :meth:`get` to look a model up.

    A row with dated prices (:attr:`Price.periods`) is looked up at the prices in force on the
    table's day: the day given to :meth:`on`, else the UTC day of each lookup, so a long-running
    daemon prices with the prices in force when it looks them up.  ``prices`` is either the rows
    (each resolved per day by :meth:`Price.on`) or a function of the day giving the resolved rows
    (:func:`load_pricing`'s layers: shipped, genai-prices, the user's file)."""

    def __init__(
        self,
        prices: Mapping[str, Price] | Callable[[date], Mapping[str, Price]],
        user_file: Path | None = None,
        day: date | None = None,
    ):
        if callable(prices):
            self._build: Callable[[date], Mapping[str, Price]] = prices
        else:
            rows = dict(prices)
            self._build = lambda d: {k: v.on(d) for k, v in rows.items()}
        self.user_file = user_file
        self.day = day
        self._days: dict[date, tuple[dict[str, Price], dict[str, str]]] = {}

    def on(self, day: date) -> PriceTable:
        """This table with the prices in force on ``day`` (UTC)."""
        view = PriceTable(self._build, self.user_file, day)
        view._days = self._days  # one cache for every view of the same rows
        return view

    def resolved(self, day: date | None = None) -> dict[str, Price]:
        """The rows as in force on ``day`` (the table's day when None), by lower-case model name."""
        return self._resolved(day or self.day or _utc_today())[0]

    def _resolved(self, day: date) -> tuple[dict[str, Price], dict[str, str]]:
        hit = self._days.get(day)
        if hit is None:
            prices = {k.lower(): v for k, v in self._build(day).items()}
            aliases = {a: k for k, v in prices.items() for a in v.spec.aliases if a not in prices}
            if len(self._days) >= _DAYS_KEPT:
                self._days.pop(next(iter(self._days)))
            hit = self._days[day] = (prices, aliases)
        return hit

    @property
    def _prices(self) -> dict[str, Price]:
        return self._resolved(self.day or _utc_today())[0]

    def __getitem__(self, model: str) -> Price:
        return self._prices[model.strip().lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.find(model) is not None

    def find(self, model: str) -> Price | None:
        """Like :meth:`get` but returns ``None`` for an unknown model."""
        prices, aliases = self._resolved(self.day or _utc_today())
        key = model.strip().lower()
        price = _lookup(prices, aliases, key)
        if price is None:
            m = _DATED.match(key)
            if m and _is_date(m.group("date")):
                price = _lookup(prices, aliases, m.group("base"))
        if price is None:
            m = _DATED_COMPACT.match(key)
            if m and _is_compact_date(m.group("date")):
                price = _lookup(prices, aliases, m.group("base"))
        return price

    def get(self, model: str) -> Price:  # type: ignore[override]  # raises instead of returning a default
        """The price of ``model``: an exact (case-insensitive) match or alias, else for a dated
        snapshot ``<base>-YYYY-MM-DD`` or ``<base>-YYYYMMDD`` the price of ``<base>``.  Unknown models raise :class:`PricingError`."""
        price = self.find(model)
        if price is not None:
            return price
        where = (
            str(self.user_file)
            if self.user_file
            else "pricing.csv in the BatchGrader home (or the file named by the pricing_file setting)"
        )
        import difflib

        close = difflib.get_close_matches(model.lower(), list(self._prices), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise PricingError(
            f"no price for model {model!r}, so its cost cannot be estimated and nothing is submitted.{hint} "
            f"If the model name is right, add a row for it to {where} with the columns {','.join(COLUMNS)}, "
            f"using the Batch prices (USD per 1M tokens) published at {PRICING_DOCS} "
            "(see docs/configuration.md, 'Prices')"
        )


def _lookup(prices: Mapping[str, Price], aliases: Mapping[str, str], key: str) -> Price | None:
    price = prices.get(key)
    if price is None and key in aliases:
        price = prices.get(aliases[key])
    return price


def _is_compact_date(text: str) -> bool:
    """``YYYYMMDD`` (Anthropic's snapshot suffix, e.g. ``claude-haiku-4-5-20251001``)."""
    return _is_date(f"{text[:4]}-{text[4:6]}-{text[6:]}")


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


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


def _parse(
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
    if not _is_date(start):
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
    if taken is not None and not _is_date(taken):
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


def shipped_prices() -> dict[str, Price]:
    """The table shipped with the package (a copy the caller may change; its rows are frozen)."""
    return dict(_shipped_prices())


@functools.cache
def _shipped_prices() -> dict[str, Price]:
    """The shipped table, parsed once per process: it is package data, and every load of the
    pricing (each start, each reload, each command) starts from it."""
    text = resources.files("batchgrader").joinpath("data/pricing.csv").read_text(encoding="utf-8-sig")
    return _parse(text, "shipped pricing.csv", SHIPPED)


def with_maintained(prices: Mapping[str, Price], day: date | None = None) -> dict[str, Price]:
    """The shipped rows with their prices from ``genai-prices`` where it has the model, as valid
    on ``day`` (UTC today when None); a figure it lacks, and a difference declared deliberate
    (:data:`~batchgrader.pipeline.maintained.DELIBERATE_DIFFERENCES`), keep the shipped figure."""
    day = day or datetime.now(UTC).date()
    out: dict[str, Price] = {}
    for key, price in prices.items():
        theirs = maintained_prices(price.spec.provider or "", price.model, day)
        if theirs is None:
            out[key] = price
            continue
        taken = {f: v for f, v in theirs.items() if (price.model, f) not in DELIBERATE_DIFFERENCES}
        # a figure kept on purpose is the shipped row's, even an empty one (its fallback rule on purpose)
        own = dict(price.sources) | {f: SHIPPED_SOURCE for f in theirs if f not in taken}
        sources = tuple((f, genai_prices_source() if f in taken else own[f]) for f in PRICE_FIELDS if f in taken or f in own)
        spec_fields: dict[str, Any] = {f: v for f, v in taken.items() if f in _SPEC_PRICE_FIELDS}
        out[key] = dataclasses.replace(
            price,
            input_per_1m=taken.get("input_per_1m", price.input_per_1m) or 0.0,
            cached_input_per_1m=taken["cached_input_per_1m"] if "cached_input_per_1m" in taken else price.cached_input_per_1m,
            output_per_1m=taken.get("output_per_1m", price.output_per_1m) or 0.0,
            spec=dataclasses.replace(price.spec, **spec_fields),
            sources=sources,
        )
    return out


_SPEC_PRICE_FIELDS = ("cache_write_per_1m", "standard_input_per_1m", "standard_cached_input_per_1m", "standard_output_per_1m")


def load_pricing(user_file: str | Path | None = None, day: date | None = None, maintained: bool = True) -> PriceTable:
    """The shipped rows, their prices from ``genai-prices`` (``maintained=False``: the shipped
    prices as they are), with ``user_file`` (if given) merged over them by model name, each as in
    force on the day it is looked up: ``day``, else the UTC day of the lookup (:class:`PriceTable`).

    A given ``user_file`` must exist.  Any problem in it raises :class:`PricingError` naming the
    file, the line and the column (here, not at the first lookup).
    """
    shipped = shipped_prices()
    path: Path | None = None
    text: str | None = None
    if user_file is not None:
        path = Path(user_file)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            raise PricingError(f"{path}: pricing file not found") from None
        except UnicodeDecodeError as exc:
            raise PricingError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise PricingError(f"{path}: cannot read pricing file ({exc.strerror or exc})") from None

    def on(d: date) -> dict[str, Price]:
        prices = {k: p.on(d) for k, p in shipped.items()}
        if maintained:
            prices = with_maintained(prices, d)
        if text is not None:
            prices.update(_parse(text, str(path), str(path), base=prices, day=d))
        return prices

    table = PriceTable(on, user_file=path, day=day)
    table.resolved()  # a malformed user file is refused now
    return table


def with_deployments(prices: PriceTable, profiles: Iterable[Any]) -> PriceTable:
    """The table with every Azure OpenAI deployment priced as the model it runs.

    A profile with ``provider: azure`` names a *deployment* in ``model``; its ``azure_model``
    (when set) names the model the deployment runs, whose row is used under the deployment's
    name (with the deployment's own row, if the table has one, taking precedence).  Raises
    :class:`PricingError` naming the profile and the key to set when a deployment has no price,
    so nothing is uploaded for a job whose cost cannot be estimated."""
    extra: dict[str, str] = {}  # deployment -> the model it runs
    for prof in profiles:
        if prof.get("provider") != "azure":
            continue
        deployment, underlying = prof.get("model"), prof.get("azure_model")
        where = "the default profile" if prof.name == "default" else f"profile {prof.name!r}"
        if prices.find(deployment) is not None:
            continue
        if not underlying:
            raise PricingError(
                f"{where} uses Azure OpenAI deployment {deployment!r}, which has no price: set 'azure_model' in "
                f"{where} to the model the deployment runs (e.g. gpt-5.4-mini), or add a row named {deployment!r} to pricing.csv"
            )
        base = prices.find(underlying)
        if base is None:
            raise PricingError(
                f"{where}: 'azure_model' is {underlying!r}, which has no price: set 'azure_model' to a priced model "
                f"or add a row named {deployment!r} (or {underlying!r}) to pricing.csv"
            )
        extra[deployment] = underlying
    if not extra:
        return prices

    def on(d: date) -> dict[str, Price]:
        day_table = prices.on(d)
        merged = dict(day_table.resolved())
        for deployment, underlying in extra.items():
            merged[deployment.lower()] = dataclasses.replace(day_table.get(underlying), model=deployment)
        return merged

    return PriceTable(on, user_file=prices.user_file, day=prices.day)


def has_flex(profile: Any, prices: PriceTable) -> bool:
    """Whether the profile's model is served at the flex tier (OpenAI, catalogue row ``flex: yes``)."""
    try:
        return profile.provider == "openai" and prices.get(profile.model).spec.flex is True
    except PricingError:
        return False
