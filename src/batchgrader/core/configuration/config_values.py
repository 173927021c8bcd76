"""Value checks for the configuration's key catalogue (:data:`batchgrader.core.configuration.config.KEYS`).

Each returns the normalised value or raises ``ValueError`` with the expected form; the loader
turns that into a :class:`~batchgrader.core.configuration.config.ConfigError` naming the source and the key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from batchgrader.core.host.secrets import clean_api_key


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("a non-empty string")
    return v


def _opt_str(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError("a string or null")
    return v or None


def _store_url(v: Any) -> str | None:
    """Where the event log is: null (the SQLite file in the home) or a ``postgresql://`` URL."""
    v = _opt_str(v)
    if v is not None and not v.startswith(("postgresql://", "postgres://")):
        raise ValueError("null (the SQLite file in the home) or a postgresql://USER@HOST:PORT/DATABASE URL")
    if v is not None:
        from urllib.parse import urlsplit

        if urlsplit(v).password is not None:  # it would show in `bgctl config show` and the logs
            raise ValueError("a URL without its password: put the password in ~/.pgpass or PGPASSWORD")
    return v


def _opt_names(v: Any) -> list[str] | None:
    """A list of distinct non-empty names (profile names of a panel: the ``judges`` key), or null."""
    if v is None:
        return None
    if not isinstance(v, list) or len(v) < 2 or not all(isinstance(x, str) and x.strip() for x in v):
        raise ValueError("a list of at least two profile names, or null")
    if len(set(v)) != len(v):
        raise ValueError("a list of distinct profile names (a judge named twice)")
    return list(v)


def _api_key(v: Any) -> str | None:
    """A key is stripped of surrounding whitespace/CR/LF; other control characters are refused."""
    key = _opt_str(v)
    return clean_api_key(key) or None if key is not None else None


def _int(minimum: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, str) and v.strip().lstrip("-").isdigit():
                v = int(v)
            else:
                raise ValueError(f"an integer >= {minimum}")
        if v < minimum:
            raise ValueError(f"an integer >= {minimum}")
        return v

    return check


def _int_between(minimum: int, maximum: int) -> Callable[[Any], int]:
    inner = _int(minimum)

    def check(v: Any) -> int:
        try:
            n = inner(v)
        except ValueError:
            raise ValueError(f"an integer from {minimum} to {maximum}") from None
        if n > maximum:
            raise ValueError(f"an integer from {minimum} to {maximum}")
        return n

    return check


def _opt_int(minimum: int) -> Callable[[Any], int | None]:
    inner = _int(minimum)

    def check(v: Any) -> int | None:
        if v is None or v == "":
            return None
        try:
            return inner(v)
        except ValueError:
            raise ValueError(f"an integer >= {minimum}, or null") from None

    return check


def _float(minimum: float) -> Callable[[Any], float]:
    """A number of at least ``minimum``; null is refused (the setting has no "unset" meaning)."""
    inner = _opt_float(minimum)

    def check(v: Any) -> float:
        f = inner(v)
        if f is None:
            raise ValueError(f"a number >= {minimum}")
        return f

    return check


def _opt_float(minimum: float, maximum: float | None = None) -> Callable[[Any], float | None]:
    form = f"a number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "") + ", or null"

    def check(v: Any) -> float | None:
        if v is None or v == "":
            return None
        if isinstance(v, bool):
            raise ValueError(form)
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ValueError(form) from None
        if f < minimum or (maximum is not None and f > maximum):
            raise ValueError(form)
        return f

    return check


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def _opt_bool(v: Any) -> bool | None:
    if v is None or v == "" or (isinstance(v, str) and v.strip().lower() in ("auto", "null")):
        return None
    try:
        return _bool(v)
    except ValueError:
        raise ValueError("true, false or null (auto)") from None


def _days(v: Any) -> float:
    f = _opt_float(0.0)(v)
    if f is None:
        raise ValueError("a number of days >= 0")
    return f


def _choice(*options: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in options:
            raise ValueError("one of " + ", ".join(repr(o) for o in options))
        return v

    return check


def _date_choice(*options: str) -> Callable[[Any], str]:
    """One of ``options``, dates written ``YYYY-MM-DD`` (YAML reads an unquoted one as a date)."""
    import datetime

    def check(v: Any) -> str:
        if isinstance(v, datetime.date):
            v = v.isoformat()
        if v not in options:
            raise ValueError("one of " + ", ".join(repr(o) for o in options))
        return str(v)

    return check


def _opt_choice(*options: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v is None or v == "":
            return None
        if v not in options:
            raise ValueError("null or one of " + ", ".join(repr(o) for o in options))
        return v  # type: ignore[no-any-return]

    return check


def _response_format(v: Any) -> dict | None:
    if v is None or v == "":
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise ValueError("a JSON schema object (mapping), or null") from None
    if not isinstance(v, Mapping):
        raise ValueError("a JSON schema object (mapping), or null")
    v = json.loads(json.dumps(v))  # plain dicts, JSON-serialisable
    if v.get("type") in ("json_schema", "json_object", "text"):
        js = v.get("json_schema")
        if v["type"] == "json_schema" and isinstance(js, Mapping) and js.get("strict"):
            _check_strict(js.get("schema"))
        return v  # already an API response_format object
    if "properties" not in v and v.get("type") != "object":
        raise ValueError("a JSON schema with 'type: object' and 'properties'")
    _check_strict(v)
    return {"type": "json_schema", "json_schema": {"name": "grade", "strict": True, "schema": v}}


def _check_strict(schema: Any) -> None:
    """Refuse now a schema the provider's strict mode would reject (with every batch it is in)."""
    from batchgrader.core.configuration.strict_schema import DOCS, strict_problems

    problems = strict_problems(schema)
    if problems:
        raise ValueError(f"a JSON schema that OpenAI's strict mode accepts ({DOCS}); in the schema: " + "; ".join(problems))


def _int_map(v: Any) -> dict[str, int]:
    if v is None or v == "":
        return {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise ValueError("a mapping of model name to integer") from None
    if not isinstance(v, Mapping):
        raise ValueError("a mapping of model name to integer")
    out = {}
    for k, n in v.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError("a mapping of model name to a positive integer")
        out[str(k)] = n
    return out


def _encoding(v: Any) -> str:
    import codecs

    form = "a text encoding Python knows that is ASCII-compatible, such as utf-8, cp1252 or latin-1"
    if not isinstance(v, str) or not v.strip():
        raise ValueError(form)
    try:
        name = codecs.lookup(v.strip()).name
    except LookupError:
        raise ValueError(form) from None
    if name.startswith(("utf-16", "utf-32")):
        raise ValueError(form)
    return v.strip()
