"""CSV and TSV records of a :class:`~batchgrader.pipeline.formats.text.TableReader`: the header
(its delimiter sniffed, its names checked), then the rows, every line checked, or (a file read in
full before) only the number of fields.  The reader hands out the physical lines and keeps their
count; :class:`CsvRecords` parses them."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from batchgrader.pipeline.formats.common import InputError, MissingColumn, Row

if TYPE_CHECKING:
    from batchgrader.pipeline.formats.text import TableReader


class CsvRecords:
    """The records of one CSV/TSV file, read through ``reader``'s physical lines; the header is
    read (and ``reader.columns``, ``delimiter`` and ``lineterminator`` set) when it is created."""

    def __init__(self, reader: TableReader, delimiter: str | None):
        r = self.reader = reader
        lines = r._physical_lines()
        r._begin_record()
        first = ""
        for first in lines:
            if first.strip():
                break
            r._begin_record()
        else:
            raise r._error("file is empty")
        self.header_line = r._line
        body = first.rstrip("\r\n")
        if delimiter is None:
            delimiter = ","
            if "," not in body and (";" in body or "\t" in body):
                delimiter = ";" if body.count(";") >= body.count("\t") else "\t"
        r.delimiter = delimiter
        needed = r._max_record + 2
        if csv.field_size_limit() < needed:
            csv.field_size_limit(needed)
        self._csv = csv.reader(
            itertools.chain((first,), lines),
            delimiter=delimiter,
            quotechar='"',
            doublequote=True,
            strict=True,
        )
        r._rec_bytes = len(first.encode(r.encoding))
        header = self._next_record()
        assert header is not None
        # the terminator ending the header record (its last physical line)
        last = r._last_text
        r.lineterminator = last[len(last.rstrip("\r\n")) :] or "\n"
        self._check_header(header)

    def _next_record(self) -> list[str] | None:
        try:
            return next(self._csv)
        except StopIteration:
            return None
        except csv.Error as e:
            raise self._csv_error(e) from None

    def _check_header(self, header: list[str]) -> None:
        r, line = self.reader, self.header_line
        for i, name in enumerate(header, 1):
            if name == "":
                hint = " (is there a trailing delimiter?)" if i == len(header) > 1 else ""
                raise r._error(f"header column {i} has an empty name{hint}", line)
        positions: dict[str, list[int]] = {}
        for i, name in enumerate(header, 1):
            positions.setdefault(name, []).append(i)
        dups = {n: p for n, p in positions.items() if len(p) > 1}
        if dups:
            desc = "; ".join(f"{n!r} (columns {', '.join(map(str, p))})" for n, p in dups.items())
            raise r._error(f"duplicate column names in the header: {desc}", line, next(iter(dups)))
        for i, name in enumerate(header, 1):
            if len(name) > r._max_field:
                raise r._error(f"header column {i} is longer than the limit of {r._max_field} characters", line)
        r.columns = header
        for name in r.required_columns:
            if name not in positions:
                found = ", ".join(repr(c) for c in header)
                raise MissingColumn(r.path, f"required column not found; the header has: {found}", line, name, header)

    def _csv_error(self, e: csv.Error) -> InputError:
        r, msg = self.reader, str(e)
        if msg == "unexpected end of data":
            line = self._find_open_quote() or r._rec_line
            return r._error(
                "unbalanced quote: the quoted field starting on this line is never closed (reached the end of the file)",
                line,
            )
        if "expected after" in msg:
            return r._error(
                f"malformed quoting: {msg} (a quote inside a quoted field must be doubled, and "
                "a quoted field must end at a delimiter or the end of the line)",
                r._line,
            )
        if "field larger than field limit" in msg:
            return r._error(f"a field is larger than the limit of {r._max_field} characters", r._rec_line)
        return r._error(f"unreadable CSV: {msg}", r._rec_line)

    def _find_open_quote(self) -> int | None:
        """Line where the never-closed quoted field of the current record opens (or None)."""
        r = self.reader
        try:
            if not r._file.seekable():
                return None
            r._file.seek(r._rec_offset)
            data = r._file.read(r._max_record + 1)
        except (OSError, ValueError):
            return None
        text = data.decode("utf-8", errors="replace")
        if r._rec_offset == 0 and text.startswith("\ufeff"):
            text = text[1:]
        return _open_quote_line(text, r.delimiter, r._rec_line)

    def rows(self) -> Iterator[Row]:
        """The data rows, each line checked (fields, sizes, quoting)."""
        r = self.reader
        cols = r.columns
        ncols = len(cols)
        limit = r._max_field
        number = 0
        reader = self._csv
        while True:
            r._rec_line = r._line + 1  # inlined r._begin_record(): this loop is hot
            r._rec_bytes = 0
            r._rec_offset = r._offset
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise self._csv_error(e) from None
            if not fields:  # an empty line
                continue
            if len(fields) != ncols:
                raise r._error(f"expected {ncols} fields (as in the header), found {len(fields)}", r._rec_line)
            if max(map(len, fields)) > limit:
                for name, value in zip(cols, fields):
                    if len(value) > limit:
                        raise r._error(
                            f"field is larger than the limit of {limit} characters ({len(value)} characters)",
                            r._rec_line,
                            name,
                        )
            number += 1
            yield Row(number, r._rec_line, dict(zip(cols, fields)))

    def rows_validated(self) -> Iterator[Row]:
        """The rows of a CSV file that was read in full through :meth:`rows` before (the
        daemon writing a result reads its input a second time): the same rows, checking only the
        number of fields.  The lines come from a text stream (CR, LF and CRLF are line breaks
        there, as for the ``csv`` module).  A line without a quote is a record of its own, split
        at the delimiter, and its text is kept in :attr:`Row.text`; a line with a quote starts a
        record that the ``csv`` module reads (with the lines it needs after it)."""
        r = self.reader
        text = io.TextIOWrapper(r._file, encoding=r.encoding, errors="strict", newline="")  # type: ignore[type-var]
        try:
            feed = _LineFeed(text)
            reader = csv.reader(feed, delimiter=r.delimiter, quotechar='"', doublequote=True, strict=True)
            cols = r.columns
            ncols = len(cols)
            delim = r.delimiter
            seps = ncols - 1
            line = r._line  # physical lines up to the end of the header, then up to the record
            number = 0
            while True:
                try:
                    raw = next(feed)
                except StopIteration:
                    return
                except UnicodeDecodeError as e:
                    raise r._error(f"unreadable CSV: {e}", line + 1) from None
                line += 1
                if '"' not in raw:
                    body = raw[:-2] if raw[-2:] == "\r\n" else raw[:-1] if raw[-1:] in ("\n", "\r") else raw
                    if not body:  # an empty line
                        continue
                    if body.count(delim) != seps:
                        raise r._error(f"expected {ncols} fields (as in the header), found {body.count(delim) + 1}", line)
                    number += 1
                    yield Row(number, line, dict(zip(cols, body.split(delim))), body)
                    continue
                feed.back(raw)
                before = reader.line_num
                try:
                    fields = next(reader)
                except (csv.Error, UnicodeDecodeError) as e:
                    raise r._error(f"unreadable CSV: {e}", line) from None
                start, line = line, line + reader.line_num - before - 1
                if not fields:  # an empty line
                    continue
                if len(fields) != ncols:
                    raise r._error(f"expected {ncols} fields (as in the header), found {len(fields)}", start)
                number += 1
                yield Row(number, start, dict(zip(cols, fields)))
        finally:
            if not r._file.closed:
                text.detach()  # the binary file stays open: close() (or its owner) closes it


def _open_quote_line(text: str, delim: str, line: int) -> int | None:
    """The line where a quoted field of CSV ``text`` (starting at ``line``) opens and is never
    closed, or None when every quoted field closes."""
    in_quotes = False
    field_start = True
    opened = None
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        # a line ends at "\n", "\r\n" or a lone "\r"
        line_end = c == "\n" or (c == "\r" and text[i + 1 : i + 2] != "\n")
        if in_quotes:
            if c == '"':
                if i + 1 < n and text[i + 1] == '"':
                    i += 1
                else:
                    in_quotes = False
            elif line_end:
                line += 1
        else:
            if c == '"' and field_start:
                in_quotes, opened = True, line
            if c == delim:
                field_start = True
            elif line_end:
                line += 1
                field_start = True
            elif c != "\r":
                field_start = False
        i += 1
    return opened if in_quotes else None


class _LineFeed:
    """The lines of a text stream, with one line that can be handed back (:meth:`back`): the
    validated CSV reader takes lines itself and gives a line with a quote to the ``csv`` module,
    which reads it again from here, then the lines the record needs after it."""

    __slots__ = ("_lines", "_back")

    def __init__(self, lines: Iterable[str]):
        self._lines = iter(lines)
        self._back: str | None = None

    def __iter__(self) -> _LineFeed:
        return self

    def __next__(self) -> str:
        line = self._back
        if line is not None:
            self._back = None
            return line
        return next(self._lines)

    def back(self, line: str) -> None:
        self._back = line
