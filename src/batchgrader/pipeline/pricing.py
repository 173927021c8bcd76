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

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
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
    genai_prices_source,
    maintained_prices,
)
from batchgrader.pipeline.price import COLUMNS as COLUMNS  # re-exported
from batchgrader.pipeline.price import PRICING_DOCS, SHIPPED, is_date
from batchgrader.pipeline.price import Price as Price  # re-exported
from batchgrader.pipeline.price import PricingError as PricingError  # re-exported
from batchgrader.pipeline.price_rows import parse_catalogue

_MILLION = Decimal(1_000_000)
_DATED = re.compile(r"^(?P<base>.+)-(?P<date>\d{4}-\d{2}-\d{2})$")
_DATED_COMPACT = re.compile(r"^(?P<base>.+)-(?P<date>\d{8})$")

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
            if m and is_date(m.group("date")):
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
    return is_date(f"{text[:4]}-{text[4:6]}-{text[6:]}")


def shipped_prices() -> dict[str, Price]:
    """The table shipped with the package (a copy the caller may change; its rows are frozen)."""
    return dict(_shipped_prices())


@functools.cache
def _shipped_prices() -> dict[str, Price]:
    """The shipped table, parsed once per process: it is package data, and every load of the
    pricing (each start, each reload, each command) starts from it."""
    text = resources.files("batchgrader").joinpath("data/pricing.csv").read_text(encoding="utf-8-sig")
    return parse_catalogue(text, "shipped pricing.csv", SHIPPED)


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
            prices.update(parse_catalogue(text, str(path), str(path), base=prices, day=d))
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
