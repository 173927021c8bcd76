"""The JSONL and JSON-array halves of :class:`~batchgrader.pipeline.formats.text.TableReader`
(a mixin: the reader, its physical lines and CSV are in :mod:`.text`)."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from batchgrader.pipeline.formats.common import _UTF8_BOM, NOT_UTF8_FIX, InputError, MissingColumn, Row
from batchgrader.pipeline.formats.jsonvalue import _BadConstant, _decoder, _DuplicateKey, _kind, _too_deep

_CHUNK = 64 * 1024
_JSON_WS = re.compile(r"[ \t\n\r]*")


class JsonRecords:
    """Reading JSONL and JSON-array records; mixed into ``TableReader``, which provides what is
    declared below."""

    if TYPE_CHECKING:
        columns: list[str]
        lineterminator: str
        bom: bool
        encoding: str
        required_columns: tuple[str, ...]
        path: Any
        _file: IO[bytes]
        _utf8: bool
        _json_decoder: Any
        _max_depth: int
        _max_record: int
        _line: int

        def _error(self, reason: str, line: int | None = None, column: str | None = None) -> InputError: ...
        def _physical_lines(self) -> Iterator[str]: ...
        def _begin_record(self) -> None: ...

    # -- JSON records (shared by JSONL and JSON) -----------------------------------------------

    def _check_record(self, obj: Any, line: int, where: str) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self._error(f"{where} is {_kind(obj)}, not a JSON object", line)
        if self._max_depth and _too_deep(obj, self._max_depth):
            raise self._error(f"{where} is nested deeper than {self._max_depth} levels", line)
        for name in self.required_columns:
            if name not in obj:
                keys = ", ".join(repr(k) for k in obj) or "none"
                raise MissingColumn(self.path, f"{where} has no key {name!r} (its keys: {keys})", line, name, obj)
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
        if self._first_chunk and data and self._utf8:
            data = self._json_skip_bom(data, size)
        data = self._pending + data
        text, used = self._json_decode(data, final)
        self._pending = data[used:]
        if self._find_terminator:
            self._json_note_terminator(text)
        self._buf += text
        if final:
            self._eof = True
            return bool(text)
        return True

    def _json_skip_bom(self, data: bytes, size: int) -> bytes:
        """The first bytes of a UTF-8 file without its byte-order mark (noted in ``bom``); a
        UTF-16 file is refused."""
        while len(data) < 3 and _UTF8_BOM.startswith(data):
            more = self._file.read(size)
            if not more:
                break
            data += more
        self._first_chunk = False
        if data.startswith(_UTF8_BOM):
            self.bom = True
            return data[3:]
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise self._error("the file is UTF-16 encoded — save it as UTF-8", 1)
        return data

    def _json_decode(self, data: bytes, final: bool) -> tuple[str, int]:
        """The text of ``data`` and the count of bytes it used (an incomplete character waits for
        more); bytes not in the encoding are refused, naming where they are."""
        try:
            if self._json_decoder is not None:
                return self._json_decoder.decode(data, final), len(data)
            return codecs.utf_8_decode(data, "strict", final)
        except UnicodeDecodeError as e:
            if self._json_decoder is not None:
                raise self._error(
                    f"not valid {self.encoding} — check the profile's encoding", self._line_at(len(self._buf))
                ) from None
            end = len(self._buf)
            line = self._line_at(end) + data.count(b"\n", 0, e.start)
            nl = data.rfind(b"\n", 0, e.start)
            if nl >= 0:
                col = len(data[nl + 1 : e.start].decode("utf-8", errors="replace")) + 1
            else:
                col = self._col_at(end) + len(data[: e.start].decode("utf-8", errors="replace"))
            raise self._error(
                f"not valid UTF-8 (byte 0x{data[e.start]:02x} at column {col}) — {NOT_UTF8_FIX}",
                line,
            ) from None

    def _json_note_terminator(self, text: str) -> None:
        """Learn the file's line terminator from its first newline."""
        nl = text.find("\n")
        if nl >= 0:
            self._find_terminator = False
            if nl > 0 and text[nl - 1] == "\r":
                self.lineterminator = "\r\n"
            elif nl == 0 and self._buf.endswith("\r"):
                self.lineterminator = "\r\n"

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
