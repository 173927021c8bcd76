"""Prices from a maintained catalogue between our releases: ``genai-prices`` (pydantic).

At run time a shipped catalogue row's *prices* come from ``genai-prices`` where it has the model
(looked up by the row's provider and model id), its rule columns from the shipped row, and a
user's ``pricing.csv`` row replaces both (:func:`batchgrader.pipeline.pricing.load_pricing`).
Where ``genai-prices`` lacks the model, or lacks a figure (e.g. a cache-write price for OpenAI),
the shipped figure applies; where a difference is listed in :data:`DELIBERATE_DIFFERENCES`, the
shipped figure is kept on purpose.  Every figure records its source (:func:`genai_prices_source`,
:data:`SHIPPED_SOURCE` or :data:`USER_SOURCE`).

Only the data bundled in the installed package is read (``genai_prices.data.providers``): the
package's network updater (``genai_prices.UpdatePrices``) is never started, and the bundled
snapshot is read directly so that a custom snapshot set by other code is not used either.

Batch prices are the model's ``processing: batch`` price variant.  A model without one gets
the documented rule of our rows: Batch input, output and cache write are 50% of the standard
prices (:data:`~batchgrader.pipeline.pricing.STANDARD_OVER_BATCH`); a Batch cache hit pays 50%
of the standard cache-read rate, except where the provider's facts say it pays the standard rate
(Gemini, whose Batch guide bills it at "the standard context-caching rate"; core/configuration/providers.py).
A row's provider maps to genai-prices' provider id by ``ProviderFacts.genai_prices_id``.  Tiered (long-context) prices are read at their base tier, as our rows
price prompts below the tier; a dated price (e.g. a price cut) is the one valid on the day asked; the shipped rows carry their own dated prices
(``price_from``), and :func:`change_days` lists the days after today on which either side changes,
so that ``bgctl models --check`` compares both sides on each of them.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from batchgrader.core.configuration.providers import PROVIDER_FACTS

__all__ = [
    "PRICE_FIELDS",
    "genai_prices_source",
    "SHIPPED_SOURCE",
    "USER_SOURCE",
    "Deliberate",
    "DELIBERATE_DIFFERENCES",
    "Difference",
    "genai_prices_version",
    "maintained_prices",
    "differences",
    "change_days",
    "differences_from",
    "doc_table",
]

#: the price figures of a catalogue row, in our column names
PRICE_FIELDS = (
    "input_per_1m",
    "cached_input_per_1m",
    "output_per_1m",
    "cache_write_per_1m",
    "standard_input_per_1m",
    "standard_cached_input_per_1m",
    "standard_output_per_1m",
)

SHIPPED_SOURCE = "shipped catalogue"
USER_SOURCE = "your pricing.csv"

_HALF = Decimal(2)


@functools.cache
def genai_prices_version() -> str | None:
    """The installed ``genai-prices`` version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("genai-prices")
    except PackageNotFoundError:
        return None


def genai_prices_source() -> str:
    """The source label of a figure taken from ``genai-prices``: ``"genai-prices X.Y.Z"``."""
    return f"genai-prices {genai_prices_version()}"


@dataclass(frozen=True)
class Deliberate:
    """A difference from ``genai-prices`` we keep on purpose: the shipped figure stays at run time."""

    ours: float | None
    theirs: float | None
    source_url: str
    checked_on: str  # YYYY-MM-DD
    why: str


#: (model, field) -> why our shipped figure differs from genai-prices and stays.  The one place a
#: difference is declared; docs/providers.md carries :func:`doc_table` (tests/test_docs.py).
#: ``ours``/``theirs`` are the effective figures compared (see :func:`differences`): an entry whose
#: figures no longer match the comparison stops covering it, so a changed price is noticed.
DELIBERATE_DIFFERENCES: dict[tuple[str, str], Deliberate] = {
    (model, "cached_input_per_1m"): Deliberate(
        ours=batch_in,
        theirs=std_cached,
        source_url="https://developers.openai.com/api/docs/pricing",
        checked_on="2026-11-28",
        why=(
            "OpenAI's Batch table publishes no cached-input rate for this model (genai-prices' own comment, "
            "its Batch rates verified 2026-10-14; catalogue check 2026-11-28). genai-prices keeps the standard "
            "cached rate; our row bills Batch cached input at the Batch input rate, the highest reading, so no "
            "cost is understated"
        ),
    )
    for model, batch_in, std_cached in (
        ("gpt-4.1", 1.0, 0.5),
        ("gpt-4.1-mini", 0.2, 0.1),
        ("gpt-4.1-nano", 0.05, 0.025),
        ("o3", 1.0, 0.5),
        ("o4-mini", 0.55, 0.275),
    )
}


@dataclass(frozen=True)
class Difference:
    """One figure where the shipped row and ``genai-prices`` disagree (effective USD per 1M tokens)."""

    model: str
    field: str
    ours: float | None
    theirs: float | None
    deliberate: Deliberate | None = None
    #: the first day compared on which the figures differ (YYYY-MM-DD; see :func:`differences_from`)
    day: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": self.model, "field": self.field, "ours": self.ours, "theirs": self.theirs}
        d["day"] = self.day
        d["deliberate"] = None
        if self.deliberate is not None:
            d["deliberate"] = {
                "source_url": self.deliberate.source_url,
                "checked_on": self.deliberate.checked_on,
                "why": self.deliberate.why,
            }
        return d


def _base(value: Any) -> Decimal | None:
    """A genai-prices price as a Decimal: a tiered price at its base tier."""
    if value is None:
        return None
    if isinstance(value, Decimal):
        return value
    return Decimal(value.base)  # TieredPrices


def _float(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


@functools.cache
def _model(provider: str, model: str) -> Any:
    """genai-prices' ModelInfo for our row, or None where it lacks the provider or the model."""
    facts = PROVIDER_FACTS.get(provider)
    gp_provider = facts.genai_prices_id if facts is not None else None
    if gp_provider is None:
        return None
    from genai_prices.data import providers  # the bundled data only: never the network updater

    for prov in providers:
        if prov.id == gp_provider:
            # the provider's own models only (no fallback to another provider's ids)
            for info in prov.models:
                if info.is_match(model.lower()):
                    return info
    return None


def _has_batch_variant(info: Any, when: datetime.datetime) -> bool:
    for variant in info.price_variants or ():
        if variant.when.get("processing") == "batch" and (variant.constraint is None or variant.constraint.active(when)):
            return True
    return False


@functools.cache
def maintained_prices(provider: str, model: str, day: datetime.date) -> dict[str, float | None] | None:
    """``genai-prices``' figures for our row on ``day``, in our :data:`PRICE_FIELDS` (a field it
    does not give is left out; ``cached_input_per_1m: None`` means no separate cached rate), or
    None where it lacks the model."""
    info = _model(provider, model)
    if info is None:
        return None
    when = datetime.datetime.combine(day, datetime.time(12), tzinfo=datetime.UTC)
    std = info.get_prices(when)
    s_in, s_cached, s_out, s_write = (
        _base(std.input_mtok),
        _base(std.cache_read_mtok),
        _base(std.output_mtok),
        _base(std.cache_write_mtok),
    )
    if s_in is None:
        return None  # not priced per token (an image or audio model)
    if s_out is None:
        s_out = Decimal(0)  # input tokens only: an embedding model
    if _has_batch_variant(info, when):
        batch = info.get_prices(when, {"processing": "batch"})
        b_in, b_cached, b_out, b_write = (
            _base(batch.input_mtok),
            _base(batch.cache_read_mtok),
            _base(batch.output_mtok),
            _base(batch.cache_write_mtok),
        )
    else:  # our documented rule: Batch is 50% of standard
        b_in, b_out = s_in / _HALF, s_out / _HALF
        b_write = None if s_write is None else s_write / _HALF
        facts = PROVIDER_FACTS[provider]  # known: _model found the model
        b_cached = s_cached if facts.batch_cache_hit_at_standard or s_cached is None else s_cached / _HALF
    if b_cached is not None and b_cached == b_in:
        b_cached = None  # no separate cached rate (our empty cell): cached input bills at the input rate
    out: dict[str, float | None] = {
        "input_per_1m": _float(b_in),
        "cached_input_per_1m": _float(b_cached),
        "output_per_1m": _float(b_out),
        "standard_input_per_1m": _float(s_in),
        "standard_cached_input_per_1m": _float(s_cached),
        "standard_output_per_1m": _float(s_out),
    }
    if b_write is not None:
        out["cache_write_per_1m"] = _float(b_write)
    return out


def _effective(fig: dict[str, float | None], provider: str) -> dict[str, float | None]:
    """The figures as billed, after our fallbacks (pipeline/pricing.py): an empty cached rate
    bills at the input rate, an empty cache write at 1.25x input, an empty standard price at
    2x Batch.  Comparing these, not the cells, finds only differences that change a cost."""
    from batchgrader.pipeline.pricing import CACHE_WRITE_MULTIPLIER, STANDARD_OVER_BATCH

    def d(v: float | None) -> Decimal | None:
        return None if v is None else Decimal(repr(v))

    b_in, b_out = d(fig.get("input_per_1m")), d(fig.get("output_per_1m"))
    b_cached = _or(d(fig.get("cached_input_per_1m")), b_in)
    cw = d(fig.get("cache_write_per_1m"))
    if cw is None and b_in is not None:
        cw = b_in * CACHE_WRITE_MULTIPLIER
    k = Decimal(repr(STANDARD_OVER_BATCH))
    s_in = _or(d(fig.get("standard_input_per_1m")), None if b_in is None else b_in * k)
    s_out = _or(d(fig.get("standard_output_per_1m")), None if b_out is None else b_out * k)
    s_cached = _or(d(fig.get("standard_cached_input_per_1m")), None if b_cached is None else b_cached * k)
    out = {
        "input_per_1m": b_in,
        "cached_input_per_1m": b_cached,
        "output_per_1m": b_out,
        "cache_write_per_1m": cw,
        "standard_input_per_1m": s_in,
        "standard_cached_input_per_1m": s_cached,
        "standard_output_per_1m": s_out,
    }
    return {f: _float(v) for f, v in out.items()}


def _or(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    return b if a is None else a


def differences(shipped: Any, day: datetime.date) -> list[Difference]:
    """Every figure where a shipped row and ``genai-prices`` disagree on ``day``, compared after
    our fallbacks (a cache-write price only where genai-prices gives one).  ``shipped`` maps model
    keys to :class:`~batchgrader.pipeline.pricing.Price` (the shipped rows, before any overlay)."""
    out: list[Difference] = []
    for key in sorted(shipped):
        price = shipped[key].on(day)  # a row with dated prices: the period in force that day
        provider = price.spec.provider or ""
        theirs = maintained_prices(provider, price.model, day)
        if theirs is None:
            continue
        ours = _effective(shipped_figures(price), provider)
        theirs_eff = _effective(theirs, provider)
        for field in PRICE_FIELDS:
            if field == "cache_write_per_1m" and "cache_write_per_1m" not in theirs:
                continue
            a, b = ours[field], theirs_eff[field]
            if a is None or b is None or abs(a - b) > 1e-9:
                if a is None and b is None:
                    continue
                known = DELIBERATE_DIFFERENCES.get((price.model, field))
                if known is not None and not (_same(known.ours, a) and _same(known.theirs, b)):
                    known = None  # the entry is about other figures: the difference is new
                out.append(Difference(price.model, field, a, b, known))
    return out


def differences_from(shipped: Any, day: datetime.date) -> list[Difference]:
    """:func:`differences` on ``day`` and on each later day a dated price changes
    (:func:`change_days`), each difference once, with the first day it is found."""
    import dataclasses

    out: list[Difference] = []
    seen: set[tuple[str, str, float | None, float | None]] = set()
    for when in (day, *change_days(shipped, day)):
        for diff in differences(shipped, when):
            key = (diff.model, diff.field, diff.ours, diff.theirs)
            if key not in seen:
                seen.add(key)
                out.append(dataclasses.replace(diff, day=when.isoformat()))
    return out


def change_days(shipped: Any, day: datetime.date) -> list[datetime.date]:
    """The days after ``day`` on which a shipped row's prices or genai-prices' figures for it
    change (their dated prices), in order: with ``day``, the days :func:`differences` must be
    asked about for the rows to stay right across every known change."""
    days: set[datetime.date] = set()
    for price in shipped.values():
        days.update(price.changes_after(day))
        info = _model(price.spec.provider or "", price.model)
        if info is not None:
            days.update(d for d in _start_days(info) if d > day)
    return sorted(days)


def _start_days(info: Any) -> list[datetime.date]:
    """The start dates of a genai-prices model's dated prices and price variants."""
    constraints = [c.constraint for c in info.prices] if isinstance(info.prices, list) else []
    constraints += [v.constraint for v in info.price_variants or ()]
    return [c.start_date for c in constraints if c is not None and hasattr(c, "start_date")]


def _same(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 1e-9)


def shipped_figures(price: Any) -> dict[str, float | None]:
    """A :class:`~batchgrader.pipeline.pricing.Price`'s figures by :data:`PRICE_FIELDS` (cells, no fallbacks)."""
    spec = price.spec
    return {
        "input_per_1m": price.input_per_1m,
        "cached_input_per_1m": price.cached_input_per_1m,
        "output_per_1m": price.output_per_1m,
        "cache_write_per_1m": spec.cache_write_per_1m,
        "standard_input_per_1m": spec.standard_input_per_1m,
        "standard_cached_input_per_1m": spec.standard_cached_input_per_1m,
        "standard_output_per_1m": spec.standard_output_per_1m,
    }


def doc_table() -> str:
    """The Markdown table of :data:`DELIBERATE_DIFFERENCES`, as docs/providers.md carries it."""
    lines = [
        "| model | field | ours | genai-prices | first-party source | checked | why ours stays |",
        "|---|---|---|---|---|---|---|",
    ]
    for (model, field), d in sorted(DELIBERATE_DIFFERENCES.items()):
        lines.append(
            f"| `{model}` | `{field}` | {_cell(d.ours)} | {_cell(d.theirs)} | <{d.source_url}> | {d.checked_on} | {d.why} |"
        )
    if not DELIBERATE_DIFFERENCES:
        lines.append("| (none) | | | | | | |")
    return "\n".join(lines)


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"
