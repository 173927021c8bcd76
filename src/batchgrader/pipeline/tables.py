"""Exact, streaming reading and writing of the user's data files: CSV/TSV, JSON and JSONL.

The product reads a data file, builds one request per row, and later writes a result file in
the same format: every input column unchanged, in input row order, plus added columns.
Memory stays flat whatever the file size, and cell text is kept exactly.  Stdlib only.

Public API
----------
``InputError(ValueError)``
    Bad input.  Attributes ``path``, ``line`` (1-based physical line or ``None``), ``column``
    (a column *name* or ``None``) and ``reason``.  ``str()`` reads
    ``"data.csv: line 7: expected 3 fields (as in the header), found 4"``; the file is shown
    by its base name (``repr`` of it if it holds control characters), ``.path`` keeps the
    full path.
``detect_format(path) -> "csv" | "jsonl" | "json"``
    By extension: ``.csv``/``.tsv`` -> ``"csv"``, ``.jsonl``/``.ndjson`` -> ``"jsonl"``,
    ``.json`` -> ``"json"``; anything else is an ``InputError`` naming the supported ones.
``open_table(source, fmt=None, required_columns=(), *, delimiter=None, max_field_size=...,
max_record_size=..., max_depth=...) -> TableReader``
    ``source`` is a path, or a binary file object (then the caller keeps ownership and
    ``fmt`` or the object's ``.name`` decides the format).  Opening validates the header
    (CSV) and reads the first record, so "empty", "header but no rows", "not an array" and
    a bad first record are reported here; later records raise while iterating.
``TableReader``  (context manager; single pass)
    ``fmt``, ``columns`` (list), ``delimiter``, ``lineterminator``, ``bom``, ``layout``;
    ``iter(reader)`` yields :class:`Row` objects lazily.
``Row(number, line, values)``  (frozen)
    ``number`` is the 1-based record number, ``line`` the physical line where the record
    starts, ``values`` maps column -> value.
``Layout(fmt, columns, delimiter, lineterminator, bom)``  (frozen, plain data)
    Everything needed to write "the same way"; ``reader.layout`` gives it, and it can be
    stored (``dataclasses.asdict``) so the output can be written later without re-reading.
``TableWriter(target, like, added_columns=(), *, formula_guard=False)``  (context manager)
    ``target`` is a path (opened and closed here) or an open binary or text file object
    (left open; a text one must have been opened with ``newline=""``).  ``like`` is a
    ``TableReader`` or a ``Layout``.  ``write(values)`` writes one record.  ``close()``
    finalises the file (JSON: the closing ``]``); leaving the ``with`` block through an
    exception only flushes, so a failed output is never a well-formed-looking file.
``text_of(value) -> str``
    The text a template placeholder gets for a value.
``ExactFloat``, ``defuse_formula(text)``
    See below.

Decisions
---------
* CSV cells are always ``str`` exactly as in the file: ``"NA"``, ``"null"``, ``""``,
  ``"007"`` stay as typed; header names are kept as-is (no whitespace stripping).
  Completely empty lines are skipped (as every CSV tool does); a line holding only spaces
  is a row like any other.  Whitespace-only lines before the header are skipped too.
* CSV delimiter: ``.tsv`` means tab.  Otherwise comma, unless the header line contains no
  comma but does contain ``;`` or a tab: then the more frequent of those two is used (``;``
  on a tie).  ``delimiter=`` overrides all of this.  Quote character ``"`` with doubled
  quotes; parsing is strict, so ``"a"b`` is an error instead of silently becoming ``ab``.
* The line terminator written back is the one ending the file's first line (``\\r\\n``,
  ``\\n`` or ``\\r``; ``\\n`` if there is none); a UTF-8 BOM is recorded and written back
  for CSV (Excel needs it), never for JSON/JSONL.
* CSV output is ``QUOTE_MINIMAL``, so a minimally quoted input round-trips byte for byte
  (apart from a missing final newline, which is added).  Fields holding ``\\r`` or ``\\n``
  are always quoted, whatever the terminator.
* JSON/JSONL ``values`` are the parsed JSON values: ``int`` stays ``int``, strings stay
  strings, nested objects/arrays are kept, and a number with a fraction or exponent is an
  :class:`ExactFloat` -- a ``float`` that remembers its spelling, so ``19.90`` is written
  back (and given to a template) as ``19.90``, and ``1e400`` does not turn into ``inf``.
* JSON/JSONL ``columns`` are the keys of the first record in order, extended (appended) as
  new keys appear while iterating; records may have different key sets, and each output
  object is exactly what was passed to ``write`` (the input object plus appended keys).
* Rejected in JSON/JSONL: duplicate keys in an object, ``NaN``/``Infinity`` literals, a
  record that is not an object, nesting deeper than ``max_depth`` (default 100).
* ``text_of``: a ``str`` as is; ``None`` -> ``""`` (like an empty CSV cell, so a JSON null
  never reaches a prompt as the word "null"); ``True``/``False`` -> ``"true"``/``"false"``;
  an ``ExactFloat`` -> its original spelling; other numbers -> their JSON spelling;
  objects and arrays -> compact JSON (``{"a":1,"b":[2,3]}``, non-ASCII kept).
* Formula guard (CSV output only, off by default; ignored for JSON/JSONL): when on, *every*
  cell written -- header, original cells and added cells -- that starts with ``=``, ``+``,
  ``-``, ``@``, tab or CR gets a leading ``'``, except a cell that is entirely a plain
  decimal number such as ``-5`` or ``+1.5e3`` (it cannot be a formula, and quoting it would
  turn a number into text for the spreadsheet user).  Guarded output is for people, not
  for reading back.
* Limits: a CSV field longer than ``max_field_size`` characters (default 10 MiB) names its
  line and column; a record (CSV row, JSONL line, JSON array element) longer than
  ``max_record_size`` bytes (default 64 MiB) is rejected before it is held in memory.
  Reading CSV raises the ``csv`` module's process-wide ``field_size_limit`` (never lowers
  it) so that these checks, which name the line and column, apply first.
"""

from __future__ import annotations

import codecs
import csv
import io
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_FIELD_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "ExactFloat",
    "Format",
    "InputError",
    "Layout",
    "Row",
    "TableReader",
    "TableWriter",
    "defuse_formula",
    "detect_format",
    "open_table",
    "text_of",
]

Format = Literal["csv", "jsonl", "json"]

DEFAULT_MAX_FIELD_SIZE = 10 * 1024 * 1024  # characters in one CSV field
DEFAULT_MAX_RECORD_SIZE = 64 * 1024 * 1024  # bytes in one CSV row / JSONL line / JSON element
DEFAULT_MAX_DEPTH = 100  # nesting levels inside one JSON record

_EXTENSIONS: dict[str, Format] = {
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
}
_UTF8_BOM = b"\xef\xbb\xbf"
_CHUNK = 64 * 1024


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


# --- values ------------------------------------------------------------------------------------


class ExactFloat(float):
    """A JSON number with a fraction or exponent: a ``float`` that keeps its spelling.

    ``ExactFloat("19.90") == 19.9``; ``str()``, :func:`text_of` and :class:`TableWriter`
    give back ``"19.90"``.  Arithmetic returns plain floats.
    """

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> ExactFloat:
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:
        return self.text if not spec else float.__format__(self, spec)

    def __reduce__(self):
        return (ExactFloat, (self.text,))


def _float_json(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"{v!r} is not valid JSON (NaN and Infinity are not allowed)")
    return float.__repr__(v)


_encode_str = json.encoder.encode_basestring  # the non-ASCII-preserving encoder (C if available)


def _dump(v: Any, out: list[str], compact: bool) -> None:
    """Serialise one JSON value exactly (ExactFloat spelled as read), appending to ``out``."""
    if isinstance(v, str):
        out.append(_encode_str(v))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, ExactFloat):
        out.append(v.text)
    elif isinstance(v, float):
        out.append(_float_json(v))
    elif isinstance(v, Mapping):
        item_sep, key_sep = (",", ":") if compact else (", ", ": ")
        out.append("{")
        first = True
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"JSON object keys must be str, not {type(k).__name__}: {k!r}")
            if not first:
                out.append(item_sep)
            first = False
            out.append(_encode_str(k))
            out.append(key_sep)
            _dump(x, out, compact)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        item_sep = "," if compact else ", "
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(item_sep)
            _dump(x, out, compact)
        out.append("]")
    else:
        raise TypeError(f"cannot write a {type(v).__name__} as JSON: {v!r}")


def _dumps(v: Any, compact: bool = False) -> str:
    out: list[str] = []
    _dump(v, out, compact)
    return "".join(out)


def _dumps_record(record: Mapping[str, Any]) -> str:
    """``_dumps`` for one output record, with the common flat str/int values inlined."""
    out: list[str] = ["{"]
    append = out.append
    for k, v in record.items():
        if type(k) is not str:
            raise TypeError(f"JSON object keys must be str, not {type(k).__name__}: {k!r}")
        if len(out) > 1:
            append(", ")
        append(_encode_str(k))
        append(": ")
        t = type(v)
        if t is str:
            append(_encode_str(v))
        elif t is int:
            append(int.__repr__(v))
        else:
            _dump(v, out, False)
    append("}")
    return "".join(out)


def text_of(value: Any) -> str:
    """The text a template placeholder gets for ``value`` (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
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


def _kind(v: Any) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return "a string"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return "a number"


def _too_deep(obj: Any, limit: int) -> bool:
    """True if ``obj`` (a dict) nests containers more than ``limit`` levels deep."""
    stack = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        children = v.values() if isinstance(v, dict) else v
        for c in children:
            if isinstance(c, (dict, list)):
                stack.append((c, depth + 1))
    return False


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


class _BadConstant(Exception):
    def __init__(self, name: str):
        self.name = name


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return d


def _reject_constant(name: str) -> Any:
    raise _BadConstant(name)


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(object_pairs_hook=_pairs_hook, parse_float=ExactFloat, parse_constant=_reject_constant)


# --- format detection --------------------------------------------------------------------------


def detect_format(path: str | os.PathLike[str]) -> Format:
    """``"csv"``, ``"jsonl"`` or ``"json"`` from the file extension (case-insensitive)."""
    suffix = Path(os.fspath(path)).suffix.lower()
    try:
        return _EXTENSIONS[suffix]
    except KeyError:
        supported = ", ".join(_EXTENSIONS)
        what = f"extension {suffix!r}" if suffix else "no extension"
        raise InputError(path, f"unsupported file type ({what}); supported extensions are {supported}") from None


# --- data types --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    number: int  # 1-based record number
    line: int  # physical line where the record starts
    values: dict[str, Any]


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


# --- reading -----------------------------------------------------------------------------------

_LINE_SPLIT = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_JSON_WS = re.compile(r"[ \t\n\r]*")


def _char_column(raw: bytes, byte_index: int) -> int:
    """1-based character column of ``raw[byte_index]`` within its (undecodable) line."""
    start = raw.rfind(b"\n", 0, byte_index) + 1
    return len(raw[start:byte_index].decode("utf-8", errors="replace")) + 1


class TableReader:
    """A streaming reader for one table file; create it with :func:`open_table`."""

    def __init__(
        self,
        source: str | os.PathLike[str] | IO[bytes],
        fmt: Format | None = None,
        required_columns: Iterable[str] = (),
        *,
        delimiter: str | None = None,
        max_field_size: int = DEFAULT_MAX_FIELD_SIZE,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ):
        if isinstance(source, (str, os.PathLike)):
            self.path: Any = source
            owns = True
        else:
            self.path = getattr(source, "name", None)
            if not isinstance(self.path, (str, bytes, os.PathLike)):
                self.path = None
            owns = False
        if fmt is None:
            if self.path is None:
                raise ValueError("fmt is required for a file object without a name")
            fmt = detect_format(self.path)
        if fmt not in ("csv", "jsonl", "json"):
            raise ValueError(f"unknown format {fmt!r}")
        if delimiter is not None and (len(delimiter) != 1 or delimiter in '"\r\n'):
            raise ValueError(f"invalid delimiter {delimiter!r}")
        self.fmt: Format = fmt
        self.columns: list[str] = []
        self.delimiter: str = ","
        self.lineterminator: str = "\n"
        self.bom = False
        self.required_columns = tuple(required_columns)
        self._max_field = max_field_size
        self._max_record = max_record_size
        self._max_depth = max_depth
        self._owns = owns
        self._file: IO[bytes] = open(source, "rb") if owns else source  # type: ignore[arg-type,assignment]
        self._closed = False
        # physical-line bookkeeping shared by the CSV and JSONL readers
        self._line = 0  # physical lines handed out so far
        self._last_text = ""  # the last physical line handed out
        self._offset = 0  # bytes consumed so far
        self._rec_line = 0
        self._rec_bytes = 0
        self._rec_offset = 0
        try:
            if fmt == "csv":
                if delimiter is None and self.path is not None:
                    if Path(os.fsdecode(self.path)).suffix.lower() == ".tsv":
                        delimiter = "\t"
                self._open_csv(delimiter)
                gen = self._iter_csv()
            elif fmt == "jsonl":
                gen = self._iter_jsonl()
            else:
                gen = self._iter_json()
            try:
                first = next(gen)
            except StopIteration:
                raise self._no_records() from None
            self._rows: Iterator[Row] = itertools.chain((first,), gen)
        except BaseException:
            self.close()
            raise

    # -- public --------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        return Layout(self.fmt, tuple(self.columns), self.delimiter, self.lineterminator, self.bom)

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._owns:
                self._file.close()

    def __enter__(self) -> TableReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared helpers ------------------------------------------------------------------------

    def _error(self, reason: str, line: int | None = None, column: str | None = None) -> InputError:
        return InputError(self.path, reason, line, column)

    def _no_records(self) -> InputError:
        if self.fmt == "csv":
            return self._error("has a header but no data rows", self._header_line)
        if self.fmt == "json" and self._saw_array:
            return self._error("file has no records (the array is empty)", self._array_line)
        return self._error("file is empty")

    def _physical_lines(self) -> Iterator[str]:
        """Decoded physical lines, terminators kept; counts lines/bytes; enforces limits."""
        f = self._file
        cap = self._max_record
        first = True
        while True:
            raw = f.readline(cap + 1)
            if not raw:
                return
            self._offset += len(raw)
            self._rec_bytes += len(raw)
            line_no = self._line + 1
            if first:
                first = False
                if raw.startswith(_UTF8_BOM):
                    raw = raw[3:]
                    self.bom = True
                elif raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                    raise self._error("the file is UTF-16 encoded — save it as UTF-8", 1)
            if self._rec_bytes > cap:
                if self.fmt == "csv":
                    reason = f"the row starting here is larger than the limit of {cap} bytes — is a quote unbalanced?"
                else:
                    reason = f"the line is longer than the limit of {cap} bytes"
                raise self._error(reason, self._rec_line)
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise self._error(
                    f"contains a NUL byte (at column {_char_column(raw, nul)}); "
                    "the file may be binary or UTF-16 — save it as UTF-8 text",
                    line_no,
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise self._error(
                    f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column "
                    f"{_char_column(raw, e.start)}) — save the file as UTF-8",
                    line_no,
                ) from None
            # readline() splits on b"\n" only; a lone CR is a line break for CSV too.
            cr = text.find("\r")
            if cr < 0 or (cr == len(text) - 2 and text.endswith("\r\n")) or self.fmt != "csv":
                self._line = line_no
                self._last_text = text
                yield text
            else:
                for piece in _LINE_SPLIT.findall(text):
                    self._line += 1
                    self._last_text = piece
                    yield piece

    def _begin_record(self) -> None:
        self._rec_line = self._line + 1
        self._rec_bytes = 0
        self._rec_offset = self._offset

    # -- CSV -----------------------------------------------------------------------------------

    def _open_csv(self, delimiter: str | None) -> None:
        lines = self._physical_lines()
        self._begin_record()
        first = ""
        for first in lines:
            if first.strip():
                break
            self._begin_record()
        else:
            raise self._error("file is empty")
        self._header_line = self._line
        body = first.rstrip("\r\n")
        if delimiter is None:
            delimiter = ","
            if "," not in body and (";" in body or "\t" in body):
                delimiter = ";" if body.count(";") >= body.count("\t") else "\t"
        self.delimiter = delimiter
        needed = self._max_record + 2
        if csv.field_size_limit() < needed:
            csv.field_size_limit(needed)
        self._csv = csv.reader(
            itertools.chain((first,), lines),
            delimiter=delimiter,
            quotechar='"',
            doublequote=True,
            strict=True,
        )
        self._rec_bytes = len(first.encode("utf-8"))
        header = self._next_csv_record()
        assert header is not None
        # the terminator ending the header record (its last physical line)
        last = self._last_text
        self.lineterminator = last[len(last.rstrip("\r\n")) :] or "\n"
        self._check_header(header)

    def _next_csv_record(self) -> list[str] | None:
        try:
            return next(self._csv)
        except StopIteration:
            return None
        except csv.Error as e:
            raise self._csv_error(e) from None

    def _check_header(self, header: list[str]) -> None:
        line = self._header_line
        for i, name in enumerate(header, 1):
            if name == "":
                hint = " (is there a trailing delimiter?)" if i == len(header) > 1 else ""
                raise self._error(f"header column {i} has an empty name{hint}", line)
        positions: dict[str, list[int]] = {}
        for i, name in enumerate(header, 1):
            positions.setdefault(name, []).append(i)
        dups = {n: p for n, p in positions.items() if len(p) > 1}
        if dups:
            desc = "; ".join(f"{n!r} (columns {', '.join(map(str, p))})" for n, p in dups.items())
            raise self._error(f"duplicate column names in the header: {desc}", line, next(iter(dups)))
        for i, name in enumerate(header, 1):
            if len(name) > self._max_field:
                raise self._error(f"header column {i} is longer than the limit of {self._max_field} characters", line)
        self.columns = header
        for name in self.required_columns:
            if name not in positions:
                found = ", ".join(repr(c) for c in header)
                raise self._error(f"required column not found; the header has: {found}", line, name)

    def _csv_error(self, e: csv.Error) -> InputError:
        msg = str(e)
        if msg == "unexpected end of data":
            line = self._find_open_quote() or self._rec_line
            return self._error(
                "unbalanced quote: the quoted field starting on this line is never closed (reached the end of the file)",
                line,
            )
        if "expected after" in msg:
            return self._error(
                f"malformed quoting: {msg} (a quote inside a quoted field must be doubled, and "
                "a quoted field must end at a delimiter or the end of the line)",
                self._line,
            )
        if "field larger than field limit" in msg:
            return self._error(f"a field is larger than the limit of {self._max_field} characters", self._rec_line)
        return self._error(f"unreadable CSV: {msg}", self._rec_line)

    def _find_open_quote(self) -> int | None:
        """Line where the never-closed quoted field of the current record opens (or None)."""
        try:
            if not self._file.seekable():
                return None
            self._file.seek(self._rec_offset)
            data = self._file.read(self._max_record + 1)
        except (OSError, ValueError):
            return None
        text = data.decode("utf-8", errors="replace")
        if self._rec_offset == 0 and text.startswith("\ufeff"):
            text = text[1:]
        delim = self.delimiter
        line = self._rec_line
        in_quotes = False
        field_start = True
        opened = None
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if in_quotes:
                if c == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        i += 1
                    else:
                        in_quotes = False
                elif c == "\n" or (c == "\r" and text[i + 1 : i + 2] != "\n"):
                    line += 1
            else:
                if c == '"' and field_start:
                    in_quotes, opened = True, line
                if c == delim:
                    field_start = True
                elif c == "\n" or (c == "\r" and text[i + 1 : i + 2] != "\n"):
                    line += 1
                    field_start = True
                elif c != "\r":
                    field_start = False
            i += 1
        return opened if in_quotes else None

    def _iter_csv(self) -> Iterator[Row]:
        cols = self.columns
        ncols = len(cols)
        limit = self._max_field
        number = 0
        reader = self._csv
        while True:
            self._rec_line = self._line + 1  # inlined _begin_record(): this loop is hot
            self._rec_bytes = 0
            self._rec_offset = self._offset
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise self._csv_error(e) from None
            if not fields:  # an empty line
                continue
            if len(fields) != ncols:
                raise self._error(f"expected {ncols} fields (as in the header), found {len(fields)}", self._rec_line)
            if max(map(len, fields)) > limit:
                for name, value in zip(cols, fields):
                    if len(value) > limit:
                        raise self._error(
                            f"field is larger than the limit of {limit} characters ({len(value)} characters)",
                            self._rec_line,
                            name,
                        )
            number += 1
            yield Row(number, self._rec_line, dict(zip(cols, fields)))

    # -- JSON records (shared by JSONL and JSON) -----------------------------------------------

    def _check_record(self, obj: Any, line: int, where: str) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self._error(f"{where} is {_kind(obj)}, not a JSON object", line)
        if self._max_depth and _too_deep(obj, self._max_depth):
            raise self._error(f"{where} is nested deeper than {self._max_depth} levels", line)
        for name in self.required_columns:
            if name not in obj:
                keys = ", ".join(repr(k) for k in obj) or "none"
                raise self._error(f"{where} has no key {name!r} (its keys: {keys})", line, name)
        cols = self.columns
        if len(obj) > len(cols) or any(k not in self._colset for k in obj):
            for k in obj:
                if k not in self._colset:
                    self._colset.add(k)
                    cols.append(k)
        return obj

    def _json_failure(self, exc: BaseException, line: int, where: str) -> InputError:
        if isinstance(exc, _DuplicateKey):
            return self._error(f"{where} has the key {exc.key!r} more than once", line, exc.key)
        if isinstance(exc, _BadConstant):
            return self._error(f"{where} contains {exc.name}, which is not valid JSON", line)
        if isinstance(exc, RecursionError):
            return self._error(f"{where} is nested too deeply", line)
        return self._error(f"{where} is invalid: {exc}", line)

    # -- JSONL ---------------------------------------------------------------------------------

    def _iter_jsonl(self) -> Iterator[Row]:
        self._colset: set[str] = set()
        decoder = _decoder()
        number = 0
        lines = self._physical_lines()
        first = True
        while True:
            self._begin_record()
            text = next(lines, None)
            if text is None:
                return
            if first:
                first = False
                body = text.rstrip("\r\n")
                if len(body) != len(text):
                    self.lineterminator = text[len(body) :]
            if not text.strip():
                continue
            line = self._line
            where = f"record {number + 1}"
            try:
                obj = decoder.decode(text)
            except json.JSONDecodeError as e:
                raise self._error(f"invalid JSON: {e.msg} (column {e.colno})", line) from None
            except (_DuplicateKey, _BadConstant, RecursionError, ValueError) as e:
                raise self._json_failure(e, line, where) from None
            number += 1
            yield Row(number, line, self._check_record(obj, line, where))

    # -- JSON array ----------------------------------------------------------------------------

    _saw_array = False
    _array_line = 1

    def _iter_json(self) -> Iterator[Row]:
        self._colset = set()
        self._buf = ""
        self._pending = b""
        self._eof = False
        self._first_chunk = True
        self._lc_pos = 0  # position in _buf up to which newlines are counted...
        self._lc_line = 1  # ...and the line number there
        self._col0 = 0  # characters on _buf[0]'s line before _buf[0]
        self._find_terminator = True
        decoder = _decoder()
        pos = 0

        c, pos = self._json_skip_ws(pos)
        if c == "":
            return  # empty file: reported by _no_records
        if c != "[":
            line = self._line_at(pos)
            if c == "{":
                found = "an object"
            elif c == '"':
                found = "a string"
            elif c in "-0123456789":
                found = "a number"
            elif c in "tf":
                found = "a boolean"
            elif c == "n":
                found = "null"
            else:
                raise self._error(f"not valid JSON: unexpected character {c!r} (column {self._col_at(pos)})", line)
            raise self._error(
                f"JSON must be an array of objects ([{{...}}, {{...}}]); found {found}. "
                "JSON Lines (one object per line, in a .jsonl file) is also accepted",
                line,
            )
        self._saw_array = True
        self._array_line = self._line_at(pos)
        pos += 1
        c, pos = self._json_skip_ws(pos)
        if c == "]":
            c2, _ = self._json_skip_ws(pos + 1)
            if c2:
                raise self._after_array_error(pos + 1)
            return
        number = 0
        while True:
            if c == "":
                raise self._error(
                    "unexpected end of file: the top-level array is not closed with ']' (is the file truncated?)",
                    self._line_at(pos),
                )
            number += 1
            line = self._line_at(pos)
            where = f"record {number} (array element {number})"
            obj, pos = self._json_element(decoder, pos, line, where)
            yield Row(number, line, self._check_record(obj, line, where))
            pos = self._json_compact(pos)
            c, pos = self._json_skip_ws(pos)
            if c == ",":
                c, pos = self._json_skip_ws(pos + 1)
                if c == "]":
                    raise self._error(f"trailing comma before ']' (column {self._col_at(pos)})", self._line_at(pos))
                continue
            if c == "]":
                c2, p2 = self._json_skip_ws(pos + 1)
                if c2:
                    raise self._after_array_error(p2)
                return
            if c == "":
                raise self._error(
                    "unexpected end of file: the top-level array is not closed with ']' (is the file truncated?)",
                    self._line_at(pos),
                )
            raise self._error(
                f"invalid JSON: expected ',' or ']' after {where}, found {c!r} (column {self._col_at(pos)})",
                self._line_at(pos),
            )

    def _after_array_error(self, pos: int) -> InputError:
        return self._error(
            f"unexpected data after the end of the top-level array (column {self._col_at(pos)})",
            self._line_at(pos),
        )

    def _json_element(self, decoder: json.JSONDecoder, pos: int, line: int, where: str) -> tuple[Any, int]:
        want = _CHUNK
        while True:
            try:
                return decoder.raw_decode(self._buf, pos)
            except json.JSONDecodeError as e:
                near_end = e.pos >= len(self._buf) - 16 or e.msg.startswith("Unterminated string")
                if self._eof or not near_end:
                    if self._eof and near_end and e.pos >= len(self._buf.rstrip()):
                        raise self._error(f"unexpected end of file inside {where} (is the file truncated?)", line) from None
                    raise self._error(
                        f"invalid JSON in {where}: {e.msg} (column {self._col_at(e.pos)})",
                        self._line_at(e.pos),
                    ) from None
            except (_DuplicateKey, _BadConstant, RecursionError, ValueError) as e:
                raise self._json_failure(e, line, where) from None
            if len(self._buf) - pos > self._max_record:
                raise self._error(f"{where} is larger than the limit of {self._max_record} bytes", line)
            self._json_fill(want)
            want = min(want * 2, 16 * 1024 * 1024)

    def _json_skip_ws(self, pos: int) -> tuple[str, int]:
        """Skip JSON whitespace from ``pos``; return (next char or "" at EOF, its position)."""
        while True:
            pos = _JSON_WS.match(self._buf, pos).end()  # type: ignore[union-attr]
            if pos < len(self._buf):
                return self._buf[pos], pos
            if not self._json_fill(_CHUNK):
                return "", pos

    def _json_fill(self, size: int) -> bool:
        """Append up to ``size`` more decoded bytes to the buffer; False at end of file."""
        if self._eof:
            return False
        data = self._file.read(size)
        final = not data
        if self._first_chunk and data:
            while len(data) < 3 and _UTF8_BOM.startswith(data):
                more = self._file.read(size)
                if not more:
                    break
                data += more
            self._first_chunk = False
            if data.startswith(_UTF8_BOM):
                data = data[3:]
                self.bom = True
            elif data.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise self._error("the file is UTF-16 encoded — save it as UTF-8", 1)
        data = self._pending + data
        try:
            text, used = codecs.utf_8_decode(data, "strict", final)
        except UnicodeDecodeError as e:
            end = len(self._buf)
            line = self._line_at(end) + data.count(b"\n", 0, e.start)
            nl = data.rfind(b"\n", 0, e.start)
            if nl >= 0:
                col = len(data[nl + 1 : e.start].decode("utf-8", errors="replace")) + 1
            else:
                col = self._col_at(end) + len(data[: e.start].decode("utf-8", errors="replace"))
            raise self._error(
                f"not valid UTF-8 (byte 0x{data[e.start]:02x} at column {col}) — save the file as UTF-8",
                line,
            ) from None
        self._pending = data[used:]
        if self._find_terminator:
            nl = text.find("\n")
            if nl >= 0:
                self._find_terminator = False
                if nl > 0 and text[nl - 1] == "\r":
                    self.lineterminator = "\r\n"
                elif nl == 0 and self._buf.endswith("\r"):
                    self.lineterminator = "\r\n"
        self._buf += text
        if final:
            self._eof = True
            return bool(text)
        return True

    def _line_at(self, pos: int) -> int:
        if pos >= self._lc_pos:
            self._lc_line += self._buf.count("\n", self._lc_pos, pos)
            self._lc_pos = pos
            return self._lc_line
        return self._lc_line - self._buf.count("\n", pos, self._lc_pos)

    def _col_at(self, pos: int) -> int:
        nl = self._buf.rfind("\n", 0, pos)
        return pos - nl if nl >= 0 else self._col0 + pos + 1

    def _json_compact(self, pos: int) -> int:
        """Drop the consumed part of the buffer once it is large; return the new ``pos``."""
        if pos < _CHUNK:
            return pos
        self._line_at(pos)
        nl = self._buf.rfind("\n", 0, pos)
        self._col0 = pos - nl - 1 if nl >= 0 else self._col0 + pos
        self._buf = self._buf[pos:]
        self._lc_pos = 0
        return 0


def open_table(
    source: str | os.PathLike[str] | IO[bytes],
    fmt: Format | None = None,
    required_columns: Iterable[str] = (),
    *,
    delimiter: str | None = None,
    max_field_size: int = DEFAULT_MAX_FIELD_SIZE,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> TableReader:
    """Open a table for streaming; see the module docstring for what is checked up front."""
    return TableReader(
        source,
        fmt,
        required_columns,
        delimiter=delimiter,
        max_field_size=max_field_size,
        max_record_size=max_record_size,
        max_depth=max_depth,
    )


# --- writing -----------------------------------------------------------------------------------


def _csv_cell(value: Any) -> str:
    return "" if value is None else text_of(value)


class _CRLFToTerminator:
    """csv.writer target: rows are produced with "\\r\\n" (so fields holding CR or LF are
    always quoted) and written with the layout's terminator."""

    __slots__ = ("_write", "_lt")

    def __init__(self, write: Any, lineterminator: str):
        self._write = write
        self._lt = lineterminator

    def write(self, s: str) -> Any:
        return self._write(s[:-2] + self._lt)


class TableWriter:
    """Writes records in the format and dialect of a :class:`Layout` (or a reader's)."""

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[Any],
        like: TableReader | Layout,
        added_columns: Sequence[str] = (),
        *,
        formula_guard: bool = False,
    ):
        layout = like.layout if isinstance(like, TableReader) else like
        self.layout = layout
        self.fmt: Format = layout.fmt
        self.formula_guard = formula_guard and layout.fmt == "csv"
        added = list(added_columns)
        self.columns: list[str] = list(layout.columns) + added
        if layout.fmt == "csv":
            seen: set[str] = set()
            for name in self.columns:
                if name in seen:
                    raise ValueError(f"output column {name!r} appears twice (an added column clashes with an input column?)")
                if name == "":
                    raise ValueError("an output column name is empty")
                seen.add(name)
        self._colset = frozenset(self.columns)
        self._detach: io.TextIOWrapper | None = None
        self._owned: IO[str] | None = None
        if isinstance(target, (str, os.PathLike)):
            self._out: IO[str] = open(target, "w", encoding="utf-8", newline="")
            self._owned = self._out
        elif isinstance(target, io.TextIOBase):
            self._out = target  # type: ignore[assignment]
        else:
            self._out = io.TextIOWrapper(target, encoding="utf-8", newline="")  # type: ignore[arg-type]
            self._detach = self._out  # type: ignore[assignment]
        self._closed = False
        self._count = 0
        lt = layout.lineterminator
        try:
            if layout.fmt == "csv":
                if layout.bom:
                    self._out.write("\ufeff")
                sink = self._out if lt == "\r\n" else _CRLFToTerminator(self._out.write, lt)
                self._csv = csv.writer(
                    sink,
                    delimiter=layout.delimiter,
                    quotechar='"',
                    doublequote=True,
                    quoting=csv.QUOTE_MINIMAL,
                    lineterminator="\r\n",
                )
                self._csv.writerow(self._cells(self.columns))
            elif layout.fmt == "json":
                self._out.write("[")
        except BaseException:
            self._release()
            raise

    def _cells(self, cells: Iterable[Any]) -> list[str]:
        out = [c if type(c) is str else _csv_cell(c) for c in cells]
        if self.formula_guard:
            out = [defuse_formula(c) for c in out]
        return out

    def write(self, values: Mapping[str, Any]) -> None:
        """Write one record.  CSV: keys must be output columns (missing ones are written
        empty; non-str values as :func:`text_of`).  JSON/JSONL: the mapping is written as
        one object, keys in its order, values exactly (``ExactFloat`` as spelled)."""
        if self._closed:
            raise ValueError("write to a closed TableWriter")
        lt = self.layout.lineterminator
        if self.fmt == "csv":
            if not self._colset.issuperset(values):
                extra = ", ".join(repr(k) for k in values if k not in self._colset)
                raise ValueError(f"not an output column: {extra}")
            self._csv.writerow(self._cells(map(values.get, self.columns)))
        else:
            if not isinstance(values, Mapping):
                raise TypeError(f"a record must be a mapping, not {type(values).__name__}")
            text = _dumps_record(values)
            if self.fmt == "jsonl":
                self._out.write(text + lt)
            else:
                self._out.write((lt if self._count == 0 else "," + lt) + text)
        self._count += 1

    def close(self) -> None:
        """Finish the file (JSON: the closing bracket), flush, and release the target."""
        if self._closed:
            return
        try:
            if self.fmt == "json":
                lt = self.layout.lineterminator
                self._out.write((lt + "]" if self._count else "]") + lt)
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        try:
            self._out.flush()
        finally:
            if self._owned is not None:
                self._owned.close()
            elif self._detach is not None:
                self._detach.detach()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._release()
