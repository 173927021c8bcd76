"""Request bodies received as they arrive: an upload goes to disk a block at a time, never whole
in memory.

* :class:`BodyReader` reads a request's body from the connection (``Content-Length`` or
  ``Transfer-Encoding: chunked``) in blocks.
* :func:`receive_multipart` parses a ``multipart/form-data`` body from such a reader: each
  part with a file name is written to a file of its own in a given folder as it arrives; the
  other parts (small form fields) are kept as bytes.
* :func:`receive_to_file` writes a raw body (a Gemini upload chunk) to a file.
* :class:`FileBody` is a response body sent from a file (a file's content, a batch's results).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import unquote

from batchgrader.emulator.common import ApiError

#: Bytes read from the connection at a time.
BLOCK = 1 << 20
#: The longest header block of a part, and the largest form field kept in memory.
MAX_PART_HEAD = 64 * 1024
MAX_FIELD = 1 << 20
#: Suffix of a file being received (removed when its request ends; left by a crash only).
PART_SUFFIX = ".part"


class _Connection(Protocol):
    def read(self, n: int, /) -> bytes: ...
    def readline(self, limit: int = -1, /) -> bytes: ...


class BodyReader:
    """A request body read from ``rfile`` in blocks: ``length`` bytes, or chunked when ``length``
    is None."""

    def __init__(self, rfile: _Connection, length: int | None) -> None:
        self._rfile = rfile
        self._left = length  # bytes left of a sized body; of the current chunk when chunked
        self._chunked = length is None
        self._done = length == 0

    def read(self, n: int = BLOCK) -> bytes:
        """Up to ``n`` bytes of the body, b"" at its end."""
        if self._done:
            return b""
        if self._chunked and not self._left:
            self._left = self._next_chunk()
            if not self._left:
                self._done = True
                return b""
        assert self._left is not None
        data = self._rfile.read(min(n, self._left))
        if not data:
            raise ValueError("the request body ended early")
        self._left -= len(data)
        if not self._chunked and not self._left:
            self._done = True
        elif self._chunked and not self._left:
            self._rfile.readline()  # the CRLF after a chunk's data
        return data

    def _next_chunk(self) -> int:
        size = int(self._rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while self._rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
        return size

    def read_all(self) -> bytes:
        parts = []
        while block := self.read():
            parts.append(block)
        return b"".join(parts)

    def drain(self) -> None:
        while self.read():
            pass


def _new_file(folder: Path) -> tuple[BinaryIO, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="upload-", suffix=PART_SUFFIX, dir=folder)
    return os.fdopen(fd, "wb"), Path(name)


def receive_to_file(reader: BodyReader, folder: Path) -> Path:
    """The whole body written to a new file in ``folder``."""
    fh, path = _new_file(folder)
    with fh:
        while block := reader.read():
            fh.write(block)
    return path


#: A form part: (file name or None, its bytes, or the file it was written to when it has a file name)
Part = tuple[str | None, bytes | Path]


def _part_names(head: bytes) -> tuple[str | None, str | None]:
    disp = ""
    for line in head.decode("utf-8", "replace").split("\r\n"):
        if line.lower().startswith("content-disposition:"):
            disp = line
    nm = re.search(r'\bname="([^"]*)"', disp)
    fn = re.search(r'\bfilename="([^"]*)"', disp) or re.search(r"\bfilename\*=(?:UTF-8'')?([^;]+)", disp)
    return (nm.group(1) if nm else None), (unquote(fn.group(1)) if fn else None)


class _Buffer:
    """The bytes read from the body and not yet used."""

    def __init__(self, reader: BodyReader) -> None:
        self.reader = reader
        self.data = bytearray()

    def fill(self) -> bool:
        block = self.reader.read()
        self.data += block
        return bool(block)


def receive_multipart(reader: BodyReader, content_type: str, folder: Path) -> dict[str, Part]:
    """The parts of a ``multipart/form-data`` body, by name.  A part with a file name is written
    to a new file in ``folder`` as it arrives (the caller moves or removes it); memory holds at
    most a block of the body at a time."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise ApiError(400, "Could not parse multipart form: missing boundary.")
    delim = b"--" + m.group(1).encode("latin-1")
    buf = _Buffer(reader)
    out: dict[str, Part] = {}
    try:
        if not _skip_to(buf, delim):
            return out
        while _read_part(buf, delim, folder, out):
            pass
        reader.drain()  # the epilogue, if any
    except BaseException:
        for _fn, value in out.values():
            if isinstance(value, Path):
                value.unlink(missing_ok=True)
        raise
    return out


def _skip_to(buf: _Buffer, delim: bytes) -> bool:
    """Past the first delimiter (the preamble dropped); False if there is none."""
    while (i := buf.data.find(delim)) < 0:
        del buf.data[: max(0, len(buf.data) - len(delim))]
        if not buf.fill():
            return False
    del buf.data[: i + len(delim)]
    return True


def _read_part(buf: _Buffer, delim: bytes, folder: Path, out: dict[str, Part]) -> bool:
    """The part after a delimiter into ``out``; False at the closing delimiter or the body's end."""
    while len(buf.data) < 2 and buf.fill():
        pass
    if buf.data.startswith(b"--") or not buf.data:
        return False
    if buf.data.startswith(b"\r\n"):
        del buf.data[:2]
    while (sep := buf.data.find(b"\r\n\r\n")) < 0:
        if len(buf.data) > MAX_PART_HEAD or not buf.fill():
            return False
    name, filename = _part_names(bytes(buf.data[:sep]))
    del buf.data[: sep + 4]
    path: Path | None = None
    sink: BinaryIO
    if filename is not None:
        sink, path = _new_file(folder)
    else:
        sink = io.BytesIO()
    with sink:
        found = _copy_content(buf, b"\r\n" + delim, sink, limit=None if path else MAX_FIELD)
        value: bytes | Path = path if path is not None else sink.getvalue()  # type: ignore[attr-defined]
    if name is None:
        if path is not None:
            path.unlink(missing_ok=True)
    else:
        old = out.get(name)
        if old is not None and isinstance(old[1], Path):
            old[1].unlink(missing_ok=True)
        out[name] = (filename, value)
    return found


def _copy_content(buf: _Buffer, marker: bytes, sink: BinaryIO, limit: int | None) -> bool:
    """A part's content, up to ``marker`` (CRLF and the next delimiter), written to ``sink``;
    False if the body ended first (the rest is then the content, less a final CRLF)."""
    written = 0
    while True:
        j = buf.data.find(marker)
        if j >= 0:
            sink.write(buf.data[:j])
            del buf.data[: j + len(marker)]
            return True
        keep = len(marker) - 1  # a marker may begin in the last bytes
        k = len(buf.data) - keep
        if k > 0:
            sink.write(buf.data[:k])
            del buf.data[:k]
            written += k
            if limit is not None and written > limit:
                raise ApiError(400, "Could not parse multipart form: a form field is too large.")
        if not buf.fill():
            rest = bytes(buf.data)
            sink.write(rest[:-2] if rest.endswith(b"\r\n") else rest)
            buf.data.clear()
            return False


@dataclass
class FileBody:
    """A response body sent from a file as it is read: ``fh`` is opened under the store's lock
    (a delete meanwhile does not cut it short), ``size`` its length."""

    fh: BinaryIO
    size: int

    @classmethod
    def open(cls, path: Path | None) -> FileBody:
        """The file at ``path`` (empty if there is none)."""
        try:
            fh: BinaryIO = open(path, "rb") if path is not None else io.BytesIO()  # noqa: SIM115 (closed by the sender)
        except FileNotFoundError:
            fh = io.BytesIO()
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(0)
        return cls(fh, size)

    def read_all(self) -> bytes:
        with self.fh:
            return self.fh.read()
