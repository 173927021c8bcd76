"""The outbox: result files and error reports, written crash-safely; originals archived.

Every file is written to a temporary name in its final folder, flushed, fsynced, renamed into
place, and the folder fsynced; only then is the outcome event recorded.  A result never
overwrites an existing file (a timestamp suffix is added when the name is taken), and nothing
is ever deleted except our own temporary files.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

TMP_PREFIX = ".bg-tmp-"


def fsync_file(fd: int) -> None:
    """Flush a file to stable storage (F_FULLFSYNC on macOS, where fsync stops at the drive cache)."""
    if sys.platform == "darwin":  # pragma: no cover - macOS only
        import fcntl

        full = getattr(fcntl, "F_FULLFSYNC", None)
        if full is not None:
            try:
                fcntl.fcntl(fd, full)
                return
            except OSError:
                pass
    os.fsync(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or create in ``path`` durable (best effort where directories cannot be synced)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None], overwrite: bool = True) -> Path:
    """Write ``path`` atomically via ``write(fileobj)``. With ``overwrite=False`` an existing
    file is never replaced (FileExistsError)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            fsync_file(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path exists: no clobber
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: Path, data: bytes, overwrite: bool = True) -> Path:
    return atomic_write(path, lambda f: None if f.write(data) else None, overwrite=overwrite)


def remove_stale_temp_files(folder: Path, recursive: bool = False) -> list[Path]:
    """Our own leftovers from a crash mid-write (names starting with TMP_PREFIX; never anything else)."""
    removed = []
    if folder.is_dir():
        for p in folder.rglob(TMP_PREFIX + "*") if recursive else folder.glob(TMP_PREFIX + "*"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
    return removed


def result_name(input_name: str) -> str:
    p = Path(input_name)
    suffix = p.suffix.lower() if p.suffix.lower() != ".ndjson" else ".jsonl"
    return f"{p.stem}_results{suffix}"


def error_name(input_name: str) -> str:
    return f"{Path(input_name).stem}_error.txt"


def free_path(folder: Path, name: str, stamp: str) -> Path:
    """``folder/name`` if free, else ``name`` with a timestamp suffix (then a counter)."""
    p = folder / name
    if not p.exists():
        return p
    stem, suffix = Path(name).stem, Path(name).suffix
    safe = re.sub(r"[^0-9A-Za-z]", "", stamp)
    cand = folder / f"{stem}_{safe}{suffix}"
    n = 2
    while cand.exists():
        cand = folder / f"{stem}_{safe}-{n}{suffix}"
        n += 1
    return cand


def move_no_clobber(src: Path, folder: Path, name: str, stamp: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dest = free_path(folder, name, stamp)
    os.rename(src, dest)
    fsync_dir(folder)
    fsync_dir(src.parent)
    return dest


# --- result rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddedColumns:
    output: str
    fields: tuple[tuple[str, str], ...]  # (schema field, column name)
    input_tokens: str
    output_tokens: str
    error: str

    def names(self) -> list[str]:
        return [self.output, *(c for _f, c in self.fields), self.input_tokens, self.output_tokens, self.error]


def added_columns(input_columns: Iterable[str], output_column: str, response_format: Mapping[str, Any] | None) -> AddedColumns:
    taken = set(input_columns)

    def name(n: str) -> str:
        out = n
        while out in taken:
            out = "bg_" + out
        taken.add(out)
        return out

    out_col = name(output_column)
    fields: list[tuple[str, str]] = []
    schema = (response_format or {}).get("json_schema", {}).get("schema") if response_format else None
    if isinstance(schema, Mapping):
        for f in schema.get("properties") or {}:
            fields.append((f, name(f)))
    return AddedColumns(out_col, tuple(fields), name("input_tokens"), name("output_tokens"), name("error"))


def result_values(
    cols: AddedColumns, outcome: Mapping[str, Any] | None, row_error: str | None, json_values: bool
) -> dict[str, Any]:
    """The added cells of one row. ``outcome`` is a stored per-row result (or None)."""
    out: dict[str, Any] = {}
    blank: Any = None if json_values else ""
    if outcome and outcome.get("ok"):
        content = outcome.get("content")
        out[cols.output] = content if content is not None else blank
        parsed: Any = None
        if cols.fields and isinstance(content, str):
            try:
                parsed = json.loads(content)
            except json.JSONDecodeError:
                parsed = None
        for f, c in cols.fields:
            v = parsed.get(f) if isinstance(parsed, dict) else None
            if json_values:
                out[c] = v
            else:
                out[c] = "" if v is None else v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
        pt, ct = outcome.get("prompt_tokens"), outcome.get("completion_tokens")
        out[cols.input_tokens] = pt if json_values else ("" if pt is None else str(pt))
        out[cols.output_tokens] = ct if json_values else ("" if ct is None else str(ct))
        out[cols.error] = blank
    else:
        out[cols.output] = blank
        for _f, c in cols.fields:
            out[c] = blank
        out[cols.input_tokens] = blank
        out[cols.output_tokens] = blank
        if row_error is None and outcome is not None:
            row_error = f"{outcome.get('error_code') or 'error'}: {outcome.get('error_message') or ''}".strip()
        out[cols.error] = row_error or "no result (row was not processed)"
    return out


def error_report(file: str, job_id: str, reason: str, hint: str, extra: str = "") -> str:
    lines = [
        f"BatchGrader could not process {file}",
        f"job: {job_id}",
        "",
        f"What went wrong: {reason}",
        "",
        f"What to do: {hint}",
    ]
    if extra:
        lines += ["", extra]
    return "\n".join(lines) + "\n"
