"""The table formats in one place: for each, its file suffixes, how it is read and written, and
what it can hold.  :mod:`batchgrader.pipeline.tables` opens readers and writers through it,
:mod:`batchgrader.pipeline.inbox` accepts the suffixes it lists, and the daemon asks a format's
capabilities (``typed_cells``, ``formula_guard``) rather than its name.

A new format is one module under ``pipeline/formats/`` and one :class:`FormatSpec` here.
The reader and writer modules are imported when a file of that format is opened (openpyxl and
pyarrow cost time to import), so the specs name them through small functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from batchgrader.pipeline.formats.common import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FIELD_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    Format,
    InputError,
)


@dataclass(frozen=True)
class ReadOptions:
    """What a reader may be asked; each format takes the options that apply to it."""

    delimiter: str | None = None  # CSV/TSV
    encoding: str = "utf-8"  # the text formats
    sheet: str | None = None  # Excel: default the first sheet
    max_field_size: int = DEFAULT_MAX_FIELD_SIZE
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE
    max_depth: int = DEFAULT_MAX_DEPTH
    validated: bool = False  # read in full with every check before (the daemon writing a result)


@dataclass(frozen=True)
class WriteOptions:
    formula_guard: bool = False  # formats opened by spreadsheet programs
    column_types: Mapping[str, str] | None = None  # added column -> "string", "int64", "double", "bool" (typed formats)


Source = str | os.PathLike[str] | IO[bytes]
Reader = Callable[[Source, Format | None, Iterable[str], ReadOptions], Any]
Writer = Callable[[Any, Any, Sequence[str], WriteOptions], Any]


@dataclass(frozen=True)
class FormatSpec:
    name: Format
    suffixes: tuple[str, ...]  # lower case, the first is the format's own
    read: Reader
    write: Writer
    typed_cells: bool  # cells hold typed values (JSON values, numbers): added cells are typed, an empty one is null
    formula_guard: bool  # opened by spreadsheet programs: `csv_formula_guard` defuses formulas in added cells
    result_suffixes: Mapping[str, str] = field(default_factory=dict)  # input suffix -> the result file's, when not the same


# --- readers and writers, imported at first use -------------------------------------------------


def _text_reader(source: Source, fmt: Format | None, required: Iterable[str], o: ReadOptions) -> Any:
    from batchgrader.pipeline.formats.text import TableReader

    return TableReader(
        source,
        fmt,
        required,
        delimiter=o.delimiter,
        encoding=o.encoding,
        max_field_size=o.max_field_size,
        max_record_size=o.max_record_size,
        max_depth=o.max_depth,
        validated=o.validated,
    )


def _text_writer(target: Any, layout: Any, added: Sequence[str], o: WriteOptions) -> Any:
    from batchgrader.pipeline.formats.writer import TextTableWriter

    return TextTableWriter(target, layout, added, formula_guard=o.formula_guard)


def _excel_reader(source: Source, fmt: Format | None, required: Iterable[str], o: ReadOptions) -> Any:
    from batchgrader.pipeline.formats.excel import ExcelReader

    return ExcelReader(source, required, sheet=o.sheet, max_field_size=o.max_field_size)


def _excel_writer(target: Any, layout: Any, added: Sequence[str], o: WriteOptions) -> Any:
    from batchgrader.pipeline.formats.excel import ExcelWriter

    return ExcelWriter(target, layout, added, formula_guard=o.formula_guard)


def _parquet_reader(source: Source, fmt: Format | None, required: Iterable[str], o: ReadOptions) -> Any:
    from batchgrader.pipeline.formats.parquet import ParquetReader

    return ParquetReader(source, required)


def _parquet_writer(target: Any, layout: Any, added: Sequence[str], o: WriteOptions) -> Any:
    from batchgrader.pipeline.formats.parquet import ParquetWriter

    return ParquetWriter(target, layout, added, column_types=o.column_types)


# --- the registry ---------------------------------------------------------------------------------

FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec("csv", (".csv", ".tsv"), _text_reader, _text_writer, typed_cells=False, formula_guard=True),
        FormatSpec("json", (".json",), _text_reader, _text_writer, typed_cells=True, formula_guard=False),
        FormatSpec(
            "jsonl",
            (".jsonl", ".ndjson"),
            _text_reader,
            _text_writer,
            typed_cells=True,
            formula_guard=False,
            result_suffixes={".ndjson": ".jsonl"},
        ),
        FormatSpec(
            "xlsx",
            (".xlsx", ".xlsm"),
            _excel_reader,
            _excel_writer,
            typed_cells=True,
            formula_guard=True,
            result_suffixes={".xlsm": ".xlsx"},  # written by openpyxl without the macros
        ),
        FormatSpec("parquet", (".parquet",), _parquet_reader, _parquet_writer, typed_cells=True, formula_guard=False),
    )
}

SUFFIXES: dict[str, FormatSpec] = {suffix: spec for spec in FORMATS.values() for suffix in spec.suffixes}
SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(SUFFIXES)


def format_spec(fmt: str) -> FormatSpec:
    """The spec of format ``fmt`` (a reader's or layout's ``fmt``)."""
    return FORMATS[fmt]


def detect_format(path: str | os.PathLike[str]) -> Format:
    """The format of a file from its suffix (case-insensitive); an :class:`InputError` naming
    the supported suffixes for any other."""
    suffix = Path(os.fspath(path)).suffix.lower()
    spec = SUFFIXES.get(suffix)
    if spec is None:
        what = f"extension {suffix!r}" if suffix else "no extension"
        supported = ", ".join(SUPPORTED_SUFFIXES)
        raise InputError(path, f"unsupported file type ({what}); supported extensions are {supported}")
    return spec.name


def result_suffix(input_suffix: str) -> str:
    """The suffix of the result file written for an input with ``input_suffix``."""
    suffix = input_suffix.lower()
    spec = SUFFIXES.get(suffix)
    return spec.result_suffixes.get(suffix, suffix) if spec else suffix
