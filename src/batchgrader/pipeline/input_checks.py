"""The checks of an input file that need only its header and the configuration (format,
encoding, sheet, the columns the prompts, ``response_field``, ``id_column``, ``reference_column``
and ``group_column`` ask for), each failure an :class:`InputError` naming the fix: one function,
:func:`open_checked`, for prepare, the preflight, ``bgctl submit`` and the synchronous routes
(:func:`check_input`)."""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.core.host.home import Home
from batchgrader.pipeline.labels import check_columns
from batchgrader.pipeline.prompts import PromptSpec
from batchgrader.pipeline.requests import RequestBuilder
from batchgrader.pipeline.tables import InputError, MissingColumn, open_table


def missing_column_advice(exc: MissingColumn, profile: Profile, spec: PromptSpec) -> InputError:
    """``exc`` with the fix named: which setting asks for the column, and the file's closest
    column to set it to (or to rename)."""

    name = exc.column or ""
    where = "config.yaml" if profile.name == "default" else f"profile {profile.name!r} in config.yaml"
    sheets = getattr(exc, "sheets", [])
    if sheets:  # the columns are on another sheet of the workbook: the fix is the `sheet` key
        named = ", ".join(repr(s) for s in sheets)
        advice = (
            f"the workbook's sheet{'s' if len(sheets) > 1 else ''} {named} "
            f"{'have' if len(sheets) > 1 else 'has'} the columns the prompts ask for: set `sheet: {_yaml_text(sheets[0])}` "
            f"({where}) to grade it"
        )
        return InputError(exc.path, f"{exc.reason} — {advice}", exc.line, exc.column)
    why = []
    if name == profile.response_field:
        why.append("`response_field`")
    if name in spec.user_fields:
        why.append(f"the `user_prompt` placeholder {{{name}}}")
    if name == profile.id_column:
        why.append("`id_column`")
    if not why:
        return exc
    close = difflib.get_close_matches(name, exc.available, n=1, cutoff=0.3)
    target = f"{close[0]!r} (the closest column)" if close else "one of the file's columns"
    them = "it" if len(why) == 1 else "them"
    advice = (
        f"this column is asked for by {' and '.join(why)} ({where}): change {them} to {target}, or rename the column in the file"
    )
    others = getattr(exc, "other_sheets", [])
    if others:  # a workbook: no other sheet has the columns either, but say which there are and the key
        names = ", ".join(repr(s) for s in others)
        advice += (
            f" (no other sheet of the workbook, {names}, has every column the prompts ask for; the `sheet` key picks the sheet)"
        )
    return InputError(exc.path, f"{exc.reason} — {advice}", exc.line, exc.column)


def _yaml_text(text: str) -> str:
    """``text`` as a YAML scalar a user can paste: bare when plain, else single-quoted."""

    return text if re.fullmatch(r"[A-Za-z][A-Za-z0-9_ .-]*[A-Za-z0-9_]|[A-Za-z]", text) else "'" + text.replace("'", "''") + "'"


@contextlib.contextmanager
def open_checked(path: Path, profile: Profile, builder: RequestBuilder) -> Iterator[Any]:
    """The table opened as :func:`~batchgrader.pipeline.prepare.prepare` reads it, after every check that needs only its header
    and the configuration: its format and encoding, the sheet, the columns the prompts, the
    ``response_field`` and the ``id_column`` ask for (a missing one named with its fix,
    :func:`missing_column_advice`), the ``reference_column`` and ``group_column``
    (:func:`~batchgrader.pipeline.labels.check_columns`).  Prepare and the preflight both open
    the input here, so the preflight pays nothing for a file prepare would refuse at its header."""
    try:
        with open_table(
            Path(path),
            required_columns=builder.required_columns(),
            sheet=profile.get("sheet"),
            encoding=profile.get("encoding", "utf-8"),
        ) as reader:
            check_columns(Path(path), profile, list(reader.columns))
            yield reader
    except MissingColumn as exc:
        raise missing_column_advice(exc, profile, builder.spec) from None


def check_input(path: Path, profile: Profile, home: Home, rows: int | None = None) -> int:
    """Read ``path`` through as :func:`~batchgrader.pipeline.prepare.prepare` would (its format, encoding, sheet, the columns
    the profile's prompts need and every other check of its header, :func:`open_checked`),
    without counting tokens: the number of rows, or the :class:`InputError` :func:`~batchgrader.pipeline.prepare.prepare` (and
    ``bgctl count``) would raise for an empty, undecodable or malformed file, or one without a
    required column (a misspelt ``reference_column`` too).  ``rows``: read no further than that
    many rows (``bgctl submit``: the header and the first rows; what lies beyond is the daemon's
    to report, before anything is paid)."""
    builder = RequestBuilder(profile, home, "0" * 64)
    n = 0
    with open_checked(Path(path), profile, builder) as reader:
        for _row in reader:
            n += 1
            if rows is not None and n >= rows:
                break
    return n
