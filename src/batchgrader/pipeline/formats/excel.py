"""Excel workbooks (``.xlsx``, and ``.xlsm`` read as data): read through pandas, written through openpyxl.

Reading: ``pandas.read_excel(..., header=None, dtype=object, na_filter=False,
keep_default_na=False)`` with the openpyxl engine, so pandas neither names the columns nor
guesses missing values: the header row comes raw (duplicate names are reported, not renamed)
and an empty cell arrives as ``""``.  Rows come from the first sheet, or the sheet named by the
profile key ``sheet``.  The header is the first non-empty row; completely empty rows are
skipped, as in CSV.  Cells are read as values, never formulas (the value Excel last computed;
empty when the file holds no computed value).  Values keep their Python type: ``str``,
``int``, ``float``, ``bool``, ``datetime``/``time``; an empty cell is ``None``.  A number
stored as a whole float (``2.0``) arrives as the ``int`` 2 (pandas' rule, what Excel shows).
An error cell (``#N/A``, ``#DIV/0!``, ``#VALUE!`` ...) arrives from pandas as NaN, which
keeps no trace of which error it was: it becomes ``None``, so the prompt gets empty text for
it (the row is still a data row; the result workbook keeps the error cell as it was).

The workbook is read whole into memory by pandas (the sheet's cells as Python objects), then
handed out row by row; see docs/benchmarks.md for time and memory at 100,000 rows.

Writing: the result workbook is the input workbook with the added columns appended to the
right of the data sheet's header; every cell already there, and every other sheet, is left
as it was (types, formats, formulas).  Added text cells are always stored as text (a string
starting with ``=`` never becomes a formula), and with ``formula_guard`` the formula guard
prefixes ``'`` as in CSV.  A ``.xlsm`` input gives a macro-free ``.xlsx`` result.
openpyxl does not keep charts or images it cannot read; such sheets lose them: the reader
lists a warning (``warnings``) when the workbook holds any.

Bad input raises :class:`InputError` naming the problem and the sheet: an encrypted
(password-protected) or old ``.xls`` workbook, a file that is not a workbook, a workbook that
would inflate past ``MAX_WORKBOOK_INFLATED_BYTES`` or whose parts are compressed more than
``MAX_WORKBOOK_RATIO`` times (both checked from the zip's directory before anything is inflated), a missing
sheet, an empty sheet, a header with an empty, error or duplicate name, or a value to the
right of the header.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from batchgrader.pipeline.formats.common import (
    DEFAULT_MAX_FIELD_SIZE,
    MAX_WORKBOOK_INFLATED_BYTES,
    MAX_WORKBOOK_RATIO,
    InputError,
    MissingColumn,
    Row,
    defuse_formula,
    text_of,
)

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # encrypted OOXML and old .xls are OLE2 files


@dataclass(frozen=True)
class ExcelLayout:
    path: Any
    sheet: str
    columns: tuple[str, ...]
    header_row: int
    fmt: str = "xlsx"
    data_lines: tuple[int, ...] | None = None  # the sheet rows of the data rows, in order (None: find them again)


def _column_letter(i: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(i)


def _is_error(v: Any) -> bool:
    """pandas' value for an error cell: NaN (no numeric cell of a workbook holds NaN)."""
    return isinstance(v, float) and v != v


def _cell(v: Any) -> Any:
    """A pandas cell value as this module hands it out (see the module docstring)."""
    t = type(v)
    if t is str:
        return v if v else None
    if t is int or t is bool or t is datetime.datetime:
        return v
    if t is float:
        return None if v != v else v
    if hasattr(v, "to_pydatetime"):  # pandas.Timestamp (older pandas may convert dates)
        return v.to_pydatetime()
    if hasattr(v, "item") and type(v).__module__ == "numpy":  # numpy scalars
        return _cell(v.item())
    return v


def drawings(source: str | os.PathLike[str] | IO[bytes]) -> tuple[int, int]:
    """(charts, images) in the workbook's zip: parts that openpyxl may drop when it re-saves it."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return 0, 0
    charts = sum(1 for n in names if n.startswith("xl/charts/chart") and n.endswith(".xml"))
    images = sum(1 for n in names if n.startswith("xl/media/"))
    return charts, images


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):,.1f} MiB"


def inflation_problem(source: str | os.PathLike[str] | IO[bytes]) -> str | None:
    """Why the workbook's zip must not be inflated (None: it may): its parts together inflate past
    ``MAX_WORKBOOK_INFLATED_BYTES``, or one part inflates more than ``MAX_WORKBOOK_RATIO`` times
    its compressed size (a zip bomb).  Reads only the zip's directory; the sizes it declares
    are the most :mod:`zipfile` inflates (more data fails its check)."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as z:
            parts = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None  # refused as not a readable workbook when opened
    fix = "save the sheet as CSV or Parquet (read row by row, without this limit), or split it into smaller workbooks"
    total = sum(p.file_size for p in parts)
    if total > MAX_WORKBOOK_INFLATED_BYTES:
        packed = sum(p.compress_size for p in parts)
        return (
            f"the workbook inflates to {_mib(total)} ({_mib(packed)} compressed), over the limit of "
            f"{_mib(MAX_WORKBOOK_INFLATED_BYTES)} for a workbook (it is read whole into memory); {fix}"
        )
    for p in parts:
        if p.file_size > 1024 * 1024 and p.file_size > MAX_WORKBOOK_RATIO * max(p.compress_size, 1):
            return (
                f"its part {p.filename!r} inflates {p.file_size // max(p.compress_size, 1):,} times "
                f"({_mib(p.compress_size)} to {_mib(p.file_size)}), over the limit of {MAX_WORKBOOK_RATIO} times "
                f"(a workbook's parts compress about 5 to 20 times: this looks like a zip bomb); {fix}"
            )
    return None


class ExcelReader:
    """Rows of one sheet of a workbook; create it with ``open_table``."""

    fmt = "xlsx"

    def __init__(
        self,
        source: str | os.PathLike[str] | IO[bytes],
        required_columns: Iterable[str] = (),
        *,
        sheet: str | None = None,
        max_field_size: int = DEFAULT_MAX_FIELD_SIZE,
    ):
        self.path: Any = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", None)
        self.columns: list[str] = []
        self.warnings: list[str] = []
        self._xl: Any = None
        self._frame: Any = None
        self._first: Row | None = None
        self._gen: Iterator[Row] = iter(())
        try:
            self._open(source, sheet, tuple(required_columns), max_field_size)
        except BaseException:
            self.close()
            raise

    def _error(self, reason: str, line: int | None = None, column: str | None = None) -> InputError:
        return InputError(self.path, reason, line, column)

    def _open(self, source: Any, sheet: str | None, required: tuple[str, ...], max_field: int) -> None:
        pos = None if isinstance(source, (str, os.PathLike)) else source.tell()
        self._check_magic(source)
        problem = inflation_problem(source)
        if problem is not None:
            raise self._error(problem)
        if pos is not None:
            source.seek(pos)
        self._source, self._pos = source, pos  # to look at the other sheets' headers, for a missing column
        frame = self._read_sheet(source, sheet)
        sheet = self.sheet
        if pos is not None:
            source.seek(pos)
        charts, images = drawings(source)
        if charts or images:
            self.warnings.append(
                f"the workbook holds {charts} chart(s) and {images} image(s): the result workbook is written with openpyxl, "
                "which may drop or change them (the input file itself is not changed)"
            )
        # pandas' rows are the sheet's rows from row 1 and its columns the sheet's from column A
        self._frame = frame
        rows: Iterator[tuple[Any, ...]] = frame.itertuples(index=False, name=None)
        header: tuple[Any, ...] | None = None
        line = 0
        for values in rows:
            line += 1
            if any(v != "" for v in values):
                header = values
                break
        if header is None:
            raise self._error(f"sheet {sheet!r} is empty")
        self.header_row = line
        names_ = self._header_names(list(header), line, max_field)
        self._check_columns(names_, required, line)
        self.columns = names_
        self._max_field = max_field
        self._data_lines = tuple(n for n, values in enumerate(rows, line + 1) if any(v != "" for v in values))
        self._gen = self._iter(line)
        try:
            self._first = next(self._gen)
        except StopIteration:
            raise self._error(f"sheet {sheet!r} has a header but no data rows", line) from None

    def _check_magic(self, source: Any) -> None:
        """Refuse at once what is not an .xlsx workbook (an encrypted or .xls file, not a zip)."""
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                magic = f.read(8)
        else:
            pos = source.tell()
            magic = source.read(8)
            source.seek(pos)
        if magic.startswith(_OLE_MAGIC):
            raise self._error(
                "the workbook is password-protected (encrypted) or in the old .xls format; save it as .xlsx without a password"
            )
        if not magic.startswith(b"PK"):
            raise self._error("not a readable .xlsx workbook (the file is not a zip archive: corrupt or misnamed?)")

    def _read_sheet(self, source: Any, sheet: str | None) -> Any:
        """The cells of ``sheet`` (the first when None) as a frame of strings and values; sets ``self.sheet``."""
        import zipfile

        import pandas as pd
        from openpyxl.utils.exceptions import InvalidFileException

        corrupt = (zipfile.BadZipFile, InvalidFileException, KeyError, ValueError, TypeError, OSError)
        try:
            self._xl = pd.ExcelFile(source, engine="openpyxl")
            names = list(self._xl.sheet_names)
        except corrupt as exc:
            raise self._error(f"not a readable .xlsx workbook (corrupt?): {type(exc).__name__}: {exc}") from None
        if sheet is None:
            if not names:
                raise self._error("the workbook has no sheets")
            sheet = names[0]
        elif sheet not in names:
            have = ", ".join(repr(n) for n in names)
            raise self._error(f"the workbook has no sheet named {sheet!r}; its sheets are: {have}")
        self.sheet = sheet
        if not hasattr(self._xl.book[sheet], "iter_rows"):
            raise self._error(f"sheet {sheet!r} is a chart sheet, not a table")
        try:
            return pd.read_excel(self._xl, sheet_name=sheet, header=None, dtype=object, na_filter=False, keep_default_na=False)
        except corrupt as exc:
            raise self._error(f"sheet {sheet!r} is not readable (corrupt?): {type(exc).__name__}: {exc}") from None
        finally:
            self._xl.close()  # the cells are all in the frame now
            self._xl = None

    def _header_names(self, cells: list[Any], line: int, max_field: int) -> list[str]:
        """The header row's column names (trailing empty cells dropped); an error value, an empty or
        an over-long name is refused with its column letter."""
        sheet = self.sheet
        while cells and cells[-1] == "":
            cells.pop()
        names: list[str] = []
        for i, v in enumerate(cells, 1):
            if _is_error(v):
                raise self._error(f"sheet {sheet!r}: header column {_column_letter(i)} is an error value (#N/A, #REF! ...)", line)
            v = _cell(v)
            if v is None:
                raise self._error(f"sheet {sheet!r}: header column {_column_letter(i)} is empty", line)
            name = text_of(v)
            if len(name) > max_field:
                raise self._error(f"sheet {sheet!r}: header column {_column_letter(i)} is too long", line)
            names.append(name)
        return names

    def _check_columns(self, names: list[str], required: tuple[str, ...], line: int) -> None:
        """No duplicate column names, and every required column present."""
        sheet = self.sheet
        positions: dict[str, list[str]] = {}
        for i, n in enumerate(names, 1):
            positions.setdefault(n, []).append(_column_letter(i))
        dups = {n: p for n, p in positions.items() if len(p) > 1}
        if dups:
            desc = "; ".join(f"{n!r} (columns {', '.join(p)})" for n, p in dups.items())
            raise self._error(f"sheet {sheet!r}: duplicate column names in the header: {desc}", line, next(iter(dups)))
        for name in required:
            if name not in positions:
                found = ", ".join(repr(c) for c in names)
                reason = f"sheet {sheet!r}: required column not found; the header has: {found}"
                headers = self._other_headers()
                holders = [s for s, cols in headers.items() if set(required) <= set(cols)]
                raise MissingColumn(self.path, reason, line, name, names, holders, list(headers))

    def _other_headers(self) -> dict[str, list[str]]:
        """The header (first non-empty row, as text) of every other worksheet, in workbook order;
        empty when the workbook cannot be read again."""
        from openpyxl import load_workbook

        source = self._source
        if self._pos is not None:
            source.seek(self._pos)
        out: dict[str, list[str]] = {}
        try:
            book = load_workbook(source, read_only=True, data_only=True)
        except Exception:  # noqa: BLE001 - only a hint: the error it adds to stands without it
            return out
        try:
            for ws in book.worksheets:
                if ws.title == self.sheet:
                    continue
                out[ws.title] = []
                for values in ws.iter_rows(values_only=True):
                    cells = [text_of(_cell(v)) if _cell(v) is not None else "" for v in values]
                    if any(cells):
                        out[ws.title] = [c for c in cells if c]
                        break
        finally:
            book.close()
            if self._pos is not None:
                self._source.seek(self._pos)
        return out

    def _iter(self, header_line: int) -> Iterator[Row]:
        import itertools

        cols = self.columns
        width = len(cols)
        max_field = self._max_field
        number = 0
        rows = itertools.islice(self._frame.itertuples(index=False, name=None), header_line, None)
        for line, values in enumerate(rows, header_line + 1):
            if all(v == "" for v in values):  # the same test as ``_data_lines``
                continue
            for i in range(width, len(values)):
                if values[i] != "":
                    raise self._error(
                        f"sheet {self.sheet!r}: a value in column {_column_letter(i + 1)}, right of the header's last column",
                        line,
                    )
            cells = [_cell(v) for v in values[:width]]
            cells += [None] * (width - len(cells))
            for name, v in zip(cols, cells):
                if isinstance(v, str) and len(v) > max_field:
                    raise self._error(f"sheet {self.sheet!r}: cell longer than {max_field} characters", line, name)
            number += 1
            yield Row(number, line, dict(zip(cols, cells)))

    @property
    def layout(self) -> ExcelLayout:
        return ExcelLayout(self.path, self.sheet, tuple(self.columns), self.header_row, data_lines=self._data_lines)

    def __iter__(self) -> Iterator[Row]:
        first, self._first = self._first, None
        if first is not None:
            yield first
        yield from self._gen

    def close(self) -> None:
        if self._xl is not None:
            self._xl.close()
            self._xl = None
        self._gen = iter(())
        self._first = None
        self._frame = None

    def __enter__(self) -> ExcelReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExcelWriter:
    """The input workbook with the added columns; written to ``target`` on ``close()``."""

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[bytes],
        layout: ExcelLayout,
        added_columns: Sequence[str] = (),
        *,
        formula_guard: bool = False,
    ):
        import openpyxl

        self.layout = layout
        self.fmt = "xlsx"
        self._target = target
        self._added = list(added_columns)
        clash = set(self._added) & set(layout.columns)
        if clash:
            raise ValueError(f"output column {sorted(clash)[0]!r} appears twice (an added column clashes with an input column?)")
        self._guard = formula_guard
        # the reader's data rows (or the same reader again), so the added cells land beside their row
        self._rows: ExcelReader | None = None
        if layout.data_lines is not None:
            self._line_iter: Iterator[int] = iter(layout.data_lines)
        else:
            self._rows = ExcelReader(layout.path, sheet=layout.sheet)
            self._line_iter = (row.line for row in self._rows)
        self._wb = openpyxl.load_workbook(layout.path, keep_vba=False, keep_links=True)
        self._ws = self._wb[layout.sheet]
        self._first_col = len(layout.columns) + 1
        for j, name in enumerate(self._added):
            self._set(layout.header_row, self._first_col + j, name)
        self._closed = False

    def _set(self, row: int, col: int, v: Any) -> None:
        if v is None:
            return
        if isinstance(v, (dict, list, tuple)):
            v = text_of(v)
        cell = self._ws.cell(row=row, column=col)
        if isinstance(v, str):
            if self._guard:
                v = defuse_formula(v)
            cell.value = v
            cell.data_type = "s"  # text, never a formula
        else:
            cell.value = v

    def write(self, values: Mapping[str, Any]) -> None:
        if self._closed:
            raise ValueError("write to a closed TableWriter")
        try:
            line = next(self._line_iter)
        except StopIteration:
            raise ValueError("more records written than the sheet has data rows") from None
        for j, name in enumerate(self._added):
            self._set(line, self._first_col + j, values.get(name))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wb.save(self._target)
        finally:
            self._close_rows()

    def _close_rows(self) -> None:
        if self._rows is not None:
            self._rows.close()

    def __enter__(self) -> ExcelWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._close_rows()
