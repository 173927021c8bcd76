"""Reading and writing the user's data files: CSV/TSV, JSON, JSONL, Excel and Parquet.

The product reads a data file, builds one request per row, and later writes a result file in
the same format: every input column unchanged, in input row order, plus added columns.
Memory stays flat whatever the file size, and cell text is kept exactly.

This module is the one entry point; it finds each format's reader and writer in
:mod:`batchgrader.pipeline.formats.registry`, and the work is done per format in
:mod:`batchgrader.pipeline.formats`: ``common`` (errors, rows, ``text_of``, the formula
guard), ``jsonvalue`` (exact JSON values), ``text`` and ``jsontext`` (CSV/JSON/JSONL reader), ``writer``
(CSV/JSON/JSONL writer), ``excel`` (``.xlsx``/``.xlsm``, through openpyxl) and ``parquet``
(through pyarrow).  The text formats use the standard library only; openpyxl and pyarrow
are imported only when an Excel or Parquet file is opened.  Excel and Parquet are described
in their modules; the rest of this docstring is about the text formats.

Public API
----------
``InputError(ValueError)``
    Bad input.  Attributes ``path``, ``line`` (1-based physical line or ``None``), ``column``
    (a column *name* or ``None``) and ``reason``.  ``str()`` reads
    ``"data.csv: line 7: expected 3 fields (as in the header), found 4"``; the file is shown
    by its base name (``repr`` of it if it holds control characters), ``.path`` keeps the
    full path.
``detect_format(path) -> "csv" | "jsonl" | "json" | "xlsx" | "parquet"``
    By extension, from the registry in :mod:`batchgrader.pipeline.formats.registry`
    (``.csv``/``.tsv`` -> ``"csv"``, ``.jsonl``/``.ndjson`` -> ``"jsonl"``, ``.json`` ->
    ``"json"``, ``.xlsx``/``.xlsm`` -> ``"xlsx"``, ``.parquet``); anything else is an
    ``InputError`` naming the supported ones.
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
  it) so that these checks, which name the line and column, apply first.  An Excel workbook,
  read whole into memory, is refused before it is inflated when its parts inflate past
  ``MAX_WORKBOOK_INFLATED_BYTES`` (128 MiB) or one part more than ``MAX_WORKBOOK_RATIO``
  (100) times its compressed size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from batchgrader.pipeline.formats.common import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FIELD_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    Format,
    InputError,
    Layout,
    MissingColumn,
    Row,
    defuse_formula,
    text_of,
)
from batchgrader.pipeline.formats.jsonvalue import ExactFloat
from batchgrader.pipeline.formats.registry import FORMATS, ReadOptions, WriteOptions, detect_format
from batchgrader.pipeline.formats.text import TableReader

__all__ = [
    "MissingColumn",
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


def open_table(
    source: str | os.PathLike[str] | IO[bytes],
    fmt: Format | None = None,
    required_columns: Iterable[str] = (),
    *,
    delimiter: str | None = None,
    encoding: str = "utf-8",
    sheet: str | None = None,
    max_field_size: int = DEFAULT_MAX_FIELD_SIZE,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    max_depth: int = DEFAULT_MAX_DEPTH,
    validated: bool = False,
) -> Any:
    """Open a table for streaming; see the module docstring for what is checked up front.

    ``encoding`` applies to the text formats, ``sheet`` to Excel workbooks (default: the
    first sheet).  ``validated``: the file was read in full before, with every check (the
    daemon writing a result reads its input again); a CSV file is then read by the ``csv``
    module alone, checking only the number of fields (the rows are the same).  Returns a reader: ``fmt``, ``columns``, ``layout``, ``iter()`` of
    :class:`Row`, ``close()``, and a context manager.
    """
    if fmt is None:
        name = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", None)
        if isinstance(name, (str, os.PathLike)):
            fmt = detect_format(name)
    options = ReadOptions(delimiter, encoding, sheet, max_field_size, max_record_size, max_depth, validated)
    spec = FORMATS[fmt] if fmt in FORMATS else FORMATS["csv"]  # the text reader detects the format itself, or refuses it
    return spec.read(source, fmt, required_columns, options)


def TableWriter(  # noqa: N802 - a factory that reads like the class it used to be
    target: str | os.PathLike[str] | IO[Any],
    like: Any,
    added_columns: Sequence[str] = (),
    *,
    formula_guard: bool = False,
    column_types: Mapping[str, str] | None = None,
) -> Any:
    """A writer in the format and layout of ``like`` (a reader or its ``layout``).

    ``write(values)`` writes one record, ``close()`` finishes the file; use it as a context
    manager.  ``column_types`` (added column -> ``"string"``, ``"int64"``, ``"double"``,
    ``"bool"``) types the added columns where the format has types (Parquet).
    """
    layout = getattr(like, "layout", like)
    fmt = getattr(layout, "fmt", None)
    spec = FORMATS[fmt] if fmt in FORMATS else FORMATS["csv"]  # the text writer refuses what it cannot write
    return spec.write(target, layout, added_columns, WriteOptions(formula_guard, column_types))
