"""What every table format shares: ``InputError``, ``Row``, ``Layout``, ``text_of``, the formula guard and format detection."""

from __future__ import annotations

import codecs
import datetime
import decimal
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from batchgrader.pipeline.formats.jsonvalue import _dumps

Format = Literal["csv", "jsonl", "json", "xlsx", "parquet"]

DEFAULT_MAX_FIELD_SIZE = 10 * 1024 * 1024  # characters in one CSV field
DEFAULT_MAX_RECORD_SIZE = 64 * 1024 * 1024  # bytes in one CSV row / JSONL line / JSON element
DEFAULT_MAX_DEPTH = 100  # nesting levels inside one JSON record
# An Excel workbook is a zip archive that is inflated and read whole into memory: its parts'
# sizes (the zip's own record of them, which reading enforces) are checked before that
MAX_WORKBOOK_INFLATED_BYTES = 128 * 1024 * 1024  # all parts of one workbook, inflated
MAX_WORKBOOK_RATIO = 100  # inflated / compressed bytes of one part (over 1 MiB inflated); text XML is about 5-20

_UTF8_BOM = b"\xef\xbb\xbf"

# --- errors ------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _display_name(path: Any) -> str:
    if path is None:
        return "<input>"
    name = os.path.basename(os.fspath(path)) or os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return repr(name) if _CONTROL.search(name) else name


class InputError(ValueError):
    """The input file is not something we can read exactly.

    ``str()`` is ``"<file name>: line N: column 'c': reason"``, leaving out the parts that
    are ``None``.
    """

    def __init__(self, path: Any, reason: str, line: int | None = None, column: str | None = None):
        super().__init__(path, reason, line, column)
        self.path = path
        self.reason = reason
        self.line = line
        self.column = column

    def __str__(self) -> str:
        parts = [_display_name(self.path)]
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        parts.append(self.reason)
        return ": ".join(parts)


class MissingColumn(InputError):
    """A required column (or JSON key) is not in the file; ``available`` lists the file's columns
    (or the record's keys), so a caller that knows why the column is required can name the
    setting to change and the closest column.  A workbook's ``sheets`` are its other sheets that
    hold every required column (so the fix is the ``sheet`` key) and ``other_sheets`` all its
    other sheets' names (empty for the other formats)."""

    def __init__(
        self,
        path: Any,
        reason: str,
        line: int | None,
        column: str,
        available: Iterable[Any] = (),
        sheets: Iterable[str] = (),
        other_sheets: Iterable[str] = (),
    ):
        super().__init__(path, reason, line, column)
        self.available = [str(c) for c in available]
        self.sheets = list(sheets)
        self.other_sheets = list(other_sheets)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason, self.line, self.column, self.available, self.sheets, self.other_sheets))


def text_of(value: Any) -> str:
    """The text a template placeholder gets for ``value`` (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):  # Excel and Parquet cells
        return value.isoformat(sep=" ")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return _dumps(value, compact=True)


_FORMULA_START = frozenset("=+-@\t\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")


def defuse_formula(text: str) -> str:
    """Prefix ``'`` to a cell a spreadsheet would run as a formula (OWASP CSV injection).

    A cell starting with ``=``, ``+``, ``-``, ``@``, tab or CR is prefixed, unless it is
    entirely a plain decimal number (``-5``, ``+1.5e3``).
    """
    if text and text[0] in _FORMULA_START and not _PLAIN_NUMBER.match(text):
        return "'" + text
    return text


# --- data types --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    number: int  # 1-based record number
    line: int  # physical line where the record starts
    values: dict[str, Any]
    # A CSV record read again (``validated``) from one physical line without a quote: the line
    # without its terminator, which is exactly what a writer of the same layout makes of ``values``
    # (no cell holds a quote, CR, LF or the delimiter), so a writer can copy it (None: otherwise)
    text: str | None = None


@dataclass(frozen=True)
class Layout:
    """How a table file is laid out: enough to write another one the same way."""

    fmt: Format
    columns: tuple[str, ...] = ()
    delimiter: str = ","
    lineterminator: str = "\n"
    bom: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in ("csv", "jsonl", "json"):
            raise ValueError(f"unknown format {self.fmt!r}")
        if self.lineterminator not in ("\n", "\r\n", "\r"):
            raise ValueError(f"unsupported line terminator {self.lineterminator!r}")
        if len(self.delimiter) != 1 or self.delimiter in '"\r\n':
            raise ValueError(f"invalid delimiter {self.delimiter!r}")
        object.__setattr__(self, "columns", tuple(self.columns))


def check_encoding(name: str) -> str:
    """The codec name for a text file's ``encoding``; ``ValueError`` unless ASCII-compatible.

    ``utf-8`` (and ``utf-8-sig``) read with or without a BOM; UTF-16/32 are refused (the
    readers split lines on the byte ``\\n``).
    """
    try:
        codec = codecs.lookup(name).name
    except (LookupError, TypeError):
        raise ValueError(f"unknown text encoding {name!r}") from None
    if codec in ("utf-8", "utf-8-sig"):
        return "utf-8"
    sample = '\n\r,;\t"[]{}:azAZ09'
    try:
        ok = sample.encode(codec) == sample.encode("ascii") and not codec.startswith(("utf-16", "utf-32"))
    except (UnicodeError, LookupError):
        ok = False
    if not ok:
        raise ValueError(f"encoding {name!r} is not ASCII-compatible (use UTF-8, or a single-byte code page such as cp1252)")
    return codec


# What an input that is not valid UTF-8 is told to do: both fixes, the file or the config.
NOT_UTF8_FIX = "save the file as UTF-8, or set `encoding: cp1252` (or latin-1) in config.yaml or the profile to read it as it is"
