"""The writer for CSV/TSV, JSON and JSONL results, in the layout of the input."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from batchgrader.pipeline.formats.common import Format, Layout, defuse_formula, text_of
from batchgrader.pipeline.formats.jsonvalue import _dumps_record
from batchgrader.pipeline.formats.text import TableReader

# --- writing -----------------------------------------------------------------------------------


def _csv_cell(value: Any) -> str:
    return "" if value is None else text_of(value)


def _csv_quoter(delimiter: str) -> Any:
    """``cells -> line`` (without its terminator), exactly as ``csv.writer`` with
    ``QUOTE_MINIMAL``, ``quotechar='"'``, ``doublequote`` and ``lineterminator="\\r\\n"`` writes
    a row: a cell holding the delimiter, a quote, CR or LF is quoted (its quotes doubled), and a
    row of one empty cell is ``""``.  A row with none of those characters (the usual case) is
    joined in one step; the ``csv`` module looks at every character twice, in C, which cost
    about a second per 100,000 rows of essays."""
    join = delimiter.join
    quoted = _csv_cells_quoter(delimiter)

    def line(cells: list[str]) -> str:
        text = join(cells)
        if '"' in text or "\r" in text or "\n" in text or text.count(delimiter) != len(cells) - 1:
            return quoted(cells)
        return text if text or len(cells) != 1 else '""'

    return line


def _csv_cells_quoter(delimiter: str) -> Any:
    """``cells -> text``: the cells joined by the delimiter, each quoted (its quotes doubled) when
    it holds the delimiter, a quote, CR or LF, as ``csv.writer`` quotes a cell."""
    special = re.compile(f'[{re.escape(delimiter)}"\r\n]').search
    join = delimiter.join

    def quoted(cells: Iterable[str]) -> str:
        return join(['"' + c.replace('"', '""') + '"' if special(c) else c for c in cells])

    return quoted


_BLOCK_ROWS = 512  # rows held before they are written out (one write call per block)


class TextTableWriter:
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
        self._added = added
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
        self._rows: list[str] = []  # CSV rows not written out yet
        lt = layout.lineterminator
        try:
            if layout.fmt == "csv":
                if layout.bom:
                    self._out.write("\ufeff")
                self._line = _csv_quoter(layout.delimiter)
                self._quoted = _csv_cells_quoter(layout.delimiter)
                self._rows.append(self._line(self._cells(self.columns)) + lt)
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

    def write(self, values: Mapping[str, Any], text: str | None = None) -> None:
        """Write one record.  CSV: keys must be output columns (missing ones are written
        empty; non-str values as :func:`text_of`).  JSON/JSONL: the mapping is written as
        one object, keys in its order, values exactly (``ExactFloat`` as spelled).

        ``text`` (CSV): the :attr:`Row.text` of the record ``values`` was read as, by a reader of
        this layout; its input cells are then copied from it (the line they would be written
        as), and only the added columns are made from ``values``."""
        if self._closed:
            raise ValueError("write to a closed TableWriter")
        lt = self.layout.lineterminator
        if self.fmt == "csv":
            if not self._colset.issuperset(values):
                extra = ", ".join(repr(k) for k in values if k not in self._colset)
                raise ValueError(f"not an output column: {extra}")
            if text is not None and not self.formula_guard:
                tail = self._quoted(self._cells(map(values.get, self._added))) if self._added else None
                self._rows.append(text + lt if tail is None else text + self.layout.delimiter + tail + lt)
            else:
                self._rows.append(self._line(self._cells(map(values.get, self.columns))) + lt)
            if len(self._rows) >= _BLOCK_ROWS:
                self._flush_rows()
        else:
            if not isinstance(values, Mapping):
                raise TypeError(f"a record must be a mapping, not {type(values).__name__}")
            text = _dumps_record(values)
            if self.fmt == "jsonl":
                self._out.write(text + lt)
            else:
                self._out.write((lt if self._count == 0 else "," + lt) + text)
        self._count += 1

    def _flush_rows(self) -> None:
        if self._rows:
            self._out.write("".join(self._rows))
            self._rows.clear()

    def close(self) -> None:
        """Finish the file (JSON: the closing bracket), flush, and release the target."""
        if self._closed:
            return
        try:
            self._flush_rows()
            if self.fmt == "json":
                lt = self.layout.lineterminator
                self._out.write((lt + "]" if self._count else "]") + lt)
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        try:
            self._flush_rows()
            self._out.flush()
        finally:
            if self._owned is not None:
                self._owned.close()
            elif self._detach is not None:
                self._detach.detach()

    def __enter__(self) -> TextTableWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif not self._closed:
            self._release()
