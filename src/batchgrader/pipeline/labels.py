"""Checks of a profile's human labels (``reference_column``) and grouping column
(``group_column``) against the input, made while the file is prepared, before anything is sent.

* :func:`check_columns`: both columns must be in the file;
* :func:`label_checker`: when the labels are compared with a schema field of type integer,
  number or boolean, or with an ``enum``, each non-empty label must be such a value (a word
  against numbers could never agree, and would make every figure of the report meaningless).

Each error names the profile, the key and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.pipeline.formats.common import InputError


def _where(profile: Profile, key: str) -> str:
    name = "the default profile" if profile.name == "default" else f"profile {profile.name!r}"
    return f"{name}: key {key!r} is {profile.get(key)!r}"


def check_columns(path: Path, profile: Profile, columns: Sequence[str]) -> None:
    """Raise :class:`InputError` when ``reference_column`` or ``group_column`` is not a column."""
    import difflib

    for key in ("reference_column", "group_column"):
        name = profile.get(key)
        if name is None or name in columns:
            continue
        close = difflib.get_close_matches(name, list(columns), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        found = ", ".join(repr(c) for c in columns)
        raise InputError(path, f"{_where(profile, key)}, which is not a column of the file{hint}; the header has: {found}")


def _field_spec(profile: Profile) -> Mapping[str, Any] | None:
    rf = profile.get("response_format") or {}
    schema = rf.get("json_schema", {}).get("schema") if isinstance(rf.get("json_schema"), Mapping) else None
    props = (schema or {}).get("properties") if isinstance(schema, Mapping) else None
    spec = (props or {}).get(profile.get("reference_field")) if profile.get("reference_field") else None
    return spec if isinstance(spec, Mapping) else None


def _is_number(text: str, whole: bool) -> bool:
    try:
        f = float(text)
    except ValueError:
        return False
    return f.is_integer() if whole else f == f


def label_checker(profile: Profile) -> Callable[[str], str | None] | None:
    """A function telling what is wrong with one label's text (None: nothing), or None when the
    labels are compared with free text (anything goes)."""
    if profile.get("reference_column") is None:
        return None
    spec = _field_spec(profile)
    if spec is None:
        return None
    if "enum" in spec:
        allowed = {str(v).strip().casefold(): v for v in spec["enum"]}
        shown = ", ".join(repr(v) for v in spec["enum"])
        return lambda t: None if t.strip().casefold() in allowed else f"is not one of the schema's values ({shown})"
    types = spec.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "integer" in types:
        return lambda t: None if _is_number(t.strip(), whole=True) else "is not a whole number, as the schema's answers are"
    if "number" in types:
        return lambda t: None if _is_number(t.strip(), whole=False) else "is not a number, as the schema's answers are"
    if "boolean" in types:
        return lambda t: (
            None if t.strip().casefold() in ("true", "false") else "is not true or false, as the schema's answers are"
        )
    return None


def label_error(path: Path, profile: Profile, label: str, problem: str, row: int, line: int | None) -> InputError:
    column = profile.get("reference_column")
    return InputError(
        path,
        f"{_where(profile, 'reference_column')}: its label {label!r} in row {row} {problem} "
        f"(field {profile.get('reference_field')!r}); labels must be comparable with the answers",
        line=line,
        column=column,
    )
