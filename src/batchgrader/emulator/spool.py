"""JSON lines kept on disk, for the Anthropic and Gemini emulators: a batch's requests written
once when it is created and read back forward, its results written as they are made (shuffled
on disk if the configuration asks), and a file's size and hash read without holding it."""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from batchgrader.fsio import atomic_write


def write_jsonl(path: Path, items: Iterable[Any]) -> int:
    """``items`` as JSON lines, written atomically; how many there were."""
    n = 0

    def write(fh: Any) -> None:
        nonlocal n
        for item in items:
            fh.write(json.dumps(item).encode("utf-8") + b"\n")
            n += 1

    atomic_write(path, write)
    return n


def read_jsonl(path: Path | None) -> Iterator[Any]:
    """The JSON lines of ``path``, one at a time (none if there is no file)."""
    if path is None or not path.exists():
        return
    with open(path, "rb") as fh:
        for raw in fh:
            if raw.strip():
                yield json.loads(raw)


class LinesWriter:
    """JSON lines written to ``path`` as they come, each line's offset kept (8 bytes a line) so
    that they can be put in another order on disk (:meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._pos = 0
        self.offsets: array[int] = array("q")

    def add(self, obj: Any) -> None:
        data = json.dumps(obj).encode("utf-8") + b"\n"
        self.offsets.append(self._pos)
        self._fh.write(data)
        self._pos += len(data)

    def close(self, shuffle_seed: str | None = None) -> Path:
        """Done: the lines in the order written, or shuffled by ``shuffle_seed``."""
        self._fh.close()
        if shuffle_seed is None or len(self.offsets) < 2:
            return self.path
        order = list(range(len(self.offsets)))
        random.Random(shuffle_seed).shuffle(order)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(self.path, "rb") as fin, open(tmp, "wb") as fout:
            for k in order:
                fin.seek(self.offsets[k])
                fout.write(fin.readline())
        tmp.replace(self.path)
        return self.path


def size_and_sha256(path: Path | None) -> tuple[int, str]:
    """A file's size and SHA-256 (hex), read a block at a time; (0, hash of nothing) if it is gone."""
    h = hashlib.sha256()
    size = 0
    try:
        with open(path or "", "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
                size += len(block)
    except FileNotFoundError:
        return 0, hashlib.sha256().hexdigest()
    return size, h.hexdigest()
