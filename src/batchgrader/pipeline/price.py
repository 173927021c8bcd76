"""One model's Batch prices as the catalogue gives them (:class:`Price`, its dated periods
:class:`PricePeriod`), the catalogue's columns, and :class:`PricingError`.  Loading and merging
the tables: :mod:`batchgrader.pipeline.pricing`; reading one catalogue file's rows:
:mod:`batchgrader.pipeline.price_rows`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import date

from batchgrader.pipeline.maintained import PRICE_FIELDS, SHIPPED_SOURCE, USER_SOURCE, shipped_figures
from batchgrader.pipeline.modelspec import SPEC_COLUMNS, ModelSpec

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


def is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True
