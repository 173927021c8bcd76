"""Streaming, exact readers for CSV/TSV, JSON and JSONL (see :mod:`batchgrader.pipeline.tables`): the
reader and its physical lines here; CSV records in :mod:`.csvtext`, JSON and JSONL in :mod:`.jsontext`."""

from __future__ import annotations

import codecs
import io
import itertools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from batchgrader.pipeline.formats.common import (
    _UTF8_BOM,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FIELD_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    NOT_UTF8_FIX,
    Format,
    InputError,
    Layout,
    Row,
    check_encoding,
)
from batchgrader.pipeline.formats.csvtext import CsvRecords
from batchgrader.pipeline.formats.jsontext import JsonRecords
from batchgrader.pipeline.formats.registry import detect_format

# --- reading -----------------------------------------------------------------------------------

_LINE_SPLIT = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def is_utf8(f: IO[bytes]) -> bool:
    """Whether the whole of ``f`` (from its position on) decodes as UTF-8; ``f`` is left where it
    was.  A file that cannot seek (a pipe) is not checked: False."""
    try:
        start = f.tell()
    except (OSError, AttributeError, io.UnsupportedOperation):
        return False
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        for block in iter(lambda: f.read(1 << 20), b""):
            decoder.decode(block)
        decoder.decode(b"", True)
    except UnicodeDecodeError:
        return False
    finally:
        f.seek(start)
    return True


def _char_column(raw: bytes, byte_index: int) -> int:
    """1-based character column of ``raw[byte_index]`` within its (undecodable) line."""
    start = raw.rfind(b"\n", 0, byte_index) + 1
    return len(raw[start:byte_index].decode("utf-8", errors="replace")) + 1


def _file_name(source: object) -> Any:
    """The path a file object was opened from, or None."""
    name = getattr(source, "name", None)
    return name if isinstance(name, (str, bytes, os.PathLike)) else None


def _checked_format(fmt: Format | None, path: Any, delimiter: str | None) -> Format:
    """The format to read (``fmt``, or the one the path's name says); an unknown format or an
    invalid delimiter is refused."""
    if fmt is None:
        if path is None:
            raise ValueError("fmt is required for a file object without a name")
        fmt = detect_format(path)
    if fmt not in ("csv", "jsonl", "json"):
        raise ValueError(f"unknown format {fmt!r}")
    if delimiter is not None and (len(delimiter) != 1 or delimiter in '"\r\n'):
        raise ValueError(f"invalid delimiter {delimiter!r}")
    return fmt


class TableReader(JsonRecords):
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
        encoding: str = "utf-8",
        validated: bool = False,
    ):
        owns = isinstance(source, (str, os.PathLike))
        self.path: Any = source if owns else _file_name(source)
        self.fmt: Format = _checked_format(fmt, self.path, delimiter)
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
        # the encoding the file is read in: UTF-8 whenever the whole file is valid UTF-8, the
        # configured one only for a file that is not (a standing `encoding: latin-1` must not
        # turn the next UTF-8 file into mojibake)
        self.configured_encoding = check_encoding(encoding)
        self.encoding = self.configured_encoding
        if self.encoding != "utf-8":
            try:
                if is_utf8(self._file):
                    self.encoding = "utf-8"
            except BaseException:
                self.close()
                raise
        self._utf8 = self.encoding == "utf-8"
        self._json_decoder = None if self._utf8 else codecs.getincrementaldecoder(self.encoding)("strict")
        # physical-line bookkeeping shared by the CSV and JSONL readers
        self._line = 0  # physical lines handed out so far
        self._last_text = ""  # the last physical line handed out
        self._offset = 0  # bytes consumed so far
        self._rec_line = 0
        self._rec_bytes = 0
        self._rec_offset = 0
        try:
            gen = self._records(delimiter, validated)
            try:
                first = next(gen)
            except StopIteration:
                raise self._no_records() from None
            self._rows: Iterator[Row] = itertools.chain((first,), gen)
        except BaseException:
            self.close()
            raise

    def _records(self, delimiter: str | None, validated: bool) -> Iterator[Row]:
        """The reader of the file's records in its format (a CSV file's header read)."""
        if self.fmt == "jsonl":
            return self._iter_jsonl()
        if self.fmt == "json":
            return self._iter_json()
        if delimiter is None and self.path is not None and Path(os.fsdecode(self.path)).suffix.lower() == ".tsv":
            delimiter = "\t"
        self._csv = CsvRecords(self, delimiter)
        # a file read in full before (the daemon's prepare) is read again without the
        # per-line checks, when its header ended a line of its own ("\n" or "\r\n")
        fast = validated and self.lineterminator in ("\n", "\r\n") and self._last_text.endswith("\n")
        return self._csv.rows_validated() if fast else self._csv.rows()

    # -- public --------------------------------------------------------------------------------

    @property
    def layout(self) -> Layout:
        # results are UTF-8; a CSV read in another encoding gets a BOM so spreadsheets see UTF-8
        bom = self.bom or (self.fmt == "csv" and not self._utf8)
        return Layout(self.fmt, tuple(self.columns), self.delimiter, self.lineterminator, bom)

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
            return self._error("has a header but no data rows", self._csv.header_line)
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
            if first and self._utf8:
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
                text = raw.decode(self.encoding)
            except UnicodeDecodeError as e:
                if not self._utf8:
                    raise self._error(
                        f"not valid {self.encoding} (byte 0x{raw[e.start]:02x}) — check the profile's encoding", line_no
                    ) from None
                raise self._error(
                    f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {_char_column(raw, e.start)}) — {NOT_UTF8_FIX}",
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
