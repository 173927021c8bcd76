"""Excel workbooks (``.xlsx``, and ``.xlsm`` read as data) through openpyxl.

Reading: rows come from the first sheet, or the sheet named by the profile key ``sheet``.
The header is the first non-empty row; completely empty rows are skipped, as in CSV.  Cells
are read as values, never formulas (the value Excel last computed; ``None`` when the file
holds no computed value).  Values keep their Python type: ``str``, ``int``, ``float``,
``bool``, ``datetime``; an empty cell is ``None``.  pandas' ``read_excel`` is not used: it
turns empty cells into ``""`` or NaN, error values such as ``#N/A`` into NaN and renames
duplicate headers, which loses exactly what this module must keep.

Writing: the result workbook is the input workbook with the added columns appended to the
right of the data sheet's header; every cell already there, and every other sheet, is left
as it was (types, formats, formulas).  Added text cells are always stored as text (a string
starting with ``=`` never becomes a formula), and with ``formula_guard`` the formula guard
prefixes ``'`` as in CSV.  A ``.xlsm`` input gives a macro-free ``.xlsx`` result.
openpyxl does not keep charts or images it cannot read; such sheets lose them.

Bad input raises :class:`InputError` naming the problem and the sheet: an encrypted
(password-protected) or old ``.xls`` workbook, a file that is not a workbook, a missing
sheet, an empty sheet, a header with an empty or duplicate name, or a value to the right of
the header.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from batchgrader.pipeline.formats.common import DEFAULT_MAX_FIELD_SIZE, InputError, Row, defuse_formula, text_of

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # encrypted OOXML and old .xls are OLE2 files


@dataclass(frozen=True)
class ExcelLayout:
    path: Any
    sheet: str
    columns: tuple[str, ...]
    header_row: int
    fmt: str = "xlsx"


def _column_letter(i: int) -> str:
    from openpyxl.utils import get_column_letter

    return get_column_letter(i)


def _empty(v: Any) -> bool:
    return v is None or v == ""


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
        self._wb: Any = None
        try:
            self._open(source, sheet, tuple(required_columns), max_field_size)
        except BaseException:
            self.close()
            raise

    def _error(self, reason: str, line: int | None = None, column: str | None = None) -> InputError:
        return InputError(self.path, reason, line, column)

    def _open(self, source: Any, sheet: str | None, required: tuple[str, ...], max_field: int) -> None:
        import zipfile

        import openpyxl
        from openpyxl.utils.exceptions import InvalidFileException

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
        try:
            self._wb = openpyxl.load_workbook(source, read_only=True, data_only=True, keep_links=False)
        except (zipfile.BadZipFile, InvalidFileException, KeyError, ValueError, TypeError, OSError) as exc:
            raise self._error(f"not a readable .xlsx workbook (corrupt?): {type(exc).__name__}: {exc}") from None
        names = list(self._wb.sheetnames)
        if sheet is None:
            if not names:
                raise self._error("the workbook has no sheets")
            sheet = names[0]
        elif sheet not in names:
            have = ", ".join(repr(n) for n in names)
            raise self._error(f"the workbook has no sheet named {sheet!r}; its sheets are: {have}")
        self.sheet = sheet
        ws = self._wb[sheet]
        if not hasattr(ws, "iter_rows"):
            raise self._error(f"sheet {sheet!r} is a chart sheet, not a table")
        self._rows_iter = ws.iter_rows(min_row=1, min_col=1, values_only=True)
        header: tuple[Any, ...] | None = None
        line = 0
        for values in self._rows_iter:
            line += 1
            if not all(_empty(v) for v in values):
                header = values
                break
        if header is None:
            raise self._error(f"sheet {sheet!r} is empty")
        cells = list(header)
        while cells and _empty(cells[-1]):
            cells.pop()
        self.header_row = line
        names_: list[str] = []
        for i, v in enumerate(cells, 1):
            if _empty(v):
                raise self._error(f"sheet {sheet!r}: header column {_column_letter(i)} is empty", line)
            name = text_of(v)
            if len(name) > max_field:
                raise self._error(f"sheet {sheet!r}: header column {_column_letter(i)} is too long", line)
            names_.append(name)
        positions: dict[str, list[str]] = {}
        for i, n in enumerate(names_, 1):
            positions.setdefault(n, []).append(_column_letter(i))
        dups = {n: p for n, p in positions.items() if len(p) > 1}
        if dups:
            desc = "; ".join(f"{n!r} (columns {', '.join(p)})" for n, p in dups.items())
            raise self._error(f"sheet {sheet!r}: duplicate column names in the header: {desc}", line, next(iter(dups)))
        for name in required:
            if name not in positions:
                found = ", ".join(repr(c) for c in names_)
                raise self._error(f"sheet {sheet!r}: required column not found; the header has: {found}", line, name)
        self.columns = names_
        self._max_field = max_field
        self._gen = self._iter(line)
        try:
            self._first: Row | None = next(self._gen)
        except StopIteration:
            raise self._error(f"sheet {sheet!r} has a header but no data rows", line) from None

    def _iter(self, line: int) -> Iterator[Row]:
        cols = self.columns
        width = len(cols)
        number = 0
        for values in self._rows_iter:
            line += 1
            if all(_empty(v) for v in values):
                continue
            for i in range(width, len(values)):
                if not _empty(values[i]):
                    raise self._error(
                        f"sheet {self.sheet!r}: a value in column {_column_letter(i + 1)}, right of the header's last column",
                        line,
                    )
            cells = list(values[:width]) + [None] * (width - len(values))
            for name, v in zip(cols, cells):
                if isinstance(v, str) and len(v) > self._max_field:
                    raise self._error(f"sheet {self.sheet!r}: cell longer than {self._max_field} characters", line, name)
            number += 1
            yield Row(number, line, dict(zip(cols, cells)))

    @property
    def layout(self) -> ExcelLayout:
        return ExcelLayout(self.path, self.sheet, tuple(self.columns), self.header_row)

    def __iter__(self) -> Iterator[Row]:
        first, self._first = self._first, None
        if first is not None:
            yield first
        yield from self._gen

    def close(self) -> None:
        if self._wb is not None:
            self._wb.close()
            self._wb = None

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
        # the same reader finds the same data rows, so the added cells land beside their row
        self._rows = ExcelReader(layout.path, sheet=layout.sheet)
        self._row_iter = iter(self._rows)
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
            row = next(self._row_iter)
        except StopIteration:
            raise ValueError("more records written than the sheet has data rows") from None
        for j, name in enumerate(self._added):
            self._set(row.line, self._first_col + j, values.get(name))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._wb.save(self._target)
        finally:
            self._rows.close()

    def __enter__(self) -> ExcelWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True
            self._rows.close()
