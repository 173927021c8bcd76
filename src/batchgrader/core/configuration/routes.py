"""How a job's rows travel: the ``route`` and ``deadline`` keys, and the choice ``route: auto`` makes.

* ``batch`` (default): the rows go in batches (half price, results within the completion window);
* ``flex``: each row through the provider's synchronous API at the flex tier (OpenAI
  ``service_tier: "flex"``, billed at the Batch price; only models whose catalogue row says
  ``flex: yes``);
* ``online``: each row through the synchronous API at the standard tier (standard price, seconds);
* ``auto``: :func:`choose_route` picks one of the three from the file's row count and the deadline.

A ``deadline`` is either a duration counted from the job's arrival (``90s``, ``45m``, ``2h``,
``1d``; a plain number is seconds) or an absolute time in ISO 8601 with its offset
(``2026-11-27T09:00:00Z``, ``2026-11-27T10:00:00+01:00``).  A timestamp without an offset is
refused (ambiguous), and so is one already past when the configuration is loaded.
Everything here is pure: no clock is read (the caller passes ``now``).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

ROUTES = ("batch", "flex", "online", "auto")
#: the routes whose rows go through the synchronous API
SYNC_ROUTES = ("flex", "online")
#: what the batch route is expected to take when nothing better is known: its completion window
DEFAULT_BATCH_SECONDS = 24 * 3600.0

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_deadline(v: Any) -> str | None:
    """The ``deadline`` key's check: None, a duration or an ISO 8601 time with its offset; the
    value is kept as written (normalised to a string)."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        raise ValueError("a duration (90s, 45m, 2h, 1d) or an ISO 8601 time with its offset (2026-11-27T09:00:00Z)")
    if isinstance(v, (int, float)):
        if v <= 0:
            raise ValueError("a duration > 0 (90s, 45m, 2h, 1d)")
        return str(v)
    if isinstance(v, datetime):  # YAML reads an unquoted timestamp as a datetime
        if v.tzinfo is None:
            raise ValueError("an ISO 8601 time WITH its offset, e.g. 2026-11-27T09:00:00Z (a time without one is ambiguous)")
        return v.isoformat()
    if not isinstance(v, str):
        raise ValueError("a duration (90s, 45m, 2h, 1d) or an ISO 8601 time with its offset (2026-11-27T09:00:00Z)")
    if duration_seconds(v) is not None:
        if (duration_seconds(v) or 0.0) <= 0:
            raise ValueError("a duration > 0 (90s, 45m, 2h, 1d)")
        return v.strip()
    if absolute_deadline(v) is None:
        raise ValueError(
            "a duration (90s, 45m, 2h, 1d) or an ISO 8601 time with its offset, e.g. 2026-11-27T09:00:00Z "
            "(a time without an offset is ambiguous)"
        )
    return v.strip()


def duration_seconds(value: str) -> float | None:
    """Seconds of a duration written ``90s``/``45m``/``2h``/``1d`` (a plain number: seconds); None
    when ``value`` is not a duration."""
    m = _DURATION.match(value)
    if m is None:
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def absolute_deadline(value: str) -> float | None:
    """Epoch seconds of an ISO 8601 time with its offset; None when ``value`` is not one."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def deadline_at(value: str | None, arrival: float) -> float | None:
    """When a job that arrived at ``arrival`` is due (epoch seconds; None: no deadline)."""
    if not value:
        return None
    seconds = duration_seconds(value)
    if seconds is not None:
        return arrival + seconds
    return absolute_deadline(value)


def deadline_problem(value: str | None, now: float) -> str | None:
    """Why a ``deadline`` cannot be kept before anything is sent (an absolute time already past), or None."""
    if not value or duration_seconds(value) is not None:
        return None
    at = absolute_deadline(value)
    if at is not None and at <= now:
        return f"is {value!r}, which is already past; set a later time or a duration such as '2h'"
    return None


def choose_route(
    rows: int,
    online_max_rows: int,
    *,
    deadline: float | None,
    now: float,
    flex: bool,
    batch_seconds: float = DEFAULT_BATCH_SECONDS,
) -> tuple[str, str]:
    """The route ``auto`` takes for a file of ``rows`` rows, and why.

    * a deadline sooner than the batch route is expected to take (``batch_seconds``: the
      model's observed batch time, else the completion window) -> ``online`` (the standard tier
      answers in seconds; flex has no latency promise);
    * a file of at most ``online_max_rows`` rows -> ``flex`` where the model has it (the batch
      price, answers in minutes), else ``online``;
    * otherwise ``batch``."""
    if deadline is not None and deadline - now < batch_seconds:
        return (
            "online",
            f"the deadline is in {max(0.0, deadline - now):.0f} s, sooner than a batch takes (~{batch_seconds:.0f} s)",
        )
    if rows <= online_max_rows:
        tier = "flex" if flex else "online"
        return tier, f"{rows} rows, at most online_max_rows ({online_max_rows})"
    return "batch", f"{rows} rows, more than online_max_rows ({online_max_rows}), and no deadline sooner than a batch"
