"""fsio: every durable write in one place, and the names derived from a file's name (:func:`fit_name`
for the file system, :func:`shown_name` for people).

A file is written to a temporary name (``TMP_PREFIX``) in its final folder, flushed, fsynced,
then renamed (or, with ``overwrite=False``, linked) into place, and the folder is fsynced.  So a
final name either does not exist or holds the complete file, and a crash leaves only our own
temporary files, which :func:`remove_stale_temp_files` clears at start-up.  Moves never clobber.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

TMP_PREFIX = ".bg-tmp-"
#: the most bytes one path component may have (ext4, XFS, Btrfs, ZFS, APFS): every name derived
#: from an input file's name (result, error report, archived copy, temporary file) is made to fit
NAME_MAX = 255
#: a name derived from an input file's (its result, its error report) is cut to this, leaving room
#: for what may be added to it later (a job id, then free_path's time stamp and counter), so
#: ``a_results.csv`` stays ``a_results_20261128T231500Z.csv`` however long ``a`` is
DERIVED_NAME_MAX = NAME_MAX - 40
_TMP_RANDOM = 8  # the characters tempfile.mkstemp adds after the prefix


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # a name's undecodable bytes are one byte each


#: what a name shown to people never holds as it is: C0 and C1 control characters (newline, ESC
#: and the terminal sequences it starts), DEL, the Unicode line separators and the bidirectional
#: overrides (which make a name read differently from what it is)
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def shown_name(name: str) -> str:
    """A file name as it is shown (status tables, error reports, rejection reasons, logs): each
    control character escaped as Python writes it (``\\n``, ``\\x1b``, ``\\u202e``), so a name
    stays on one line and never moves the cursor, colours the terminal or fakes another line;
    a name without any is itself."""
    return _UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), name)


def shown_names(data: Any) -> Any:
    """``data`` (the rows, events and payloads ``bgctl status``, ``bgctl events`` and the
    dashboard show: dicts and lists) with every text passed through :func:`shown_name`: a file
    name reaches them in many fields (file, path, fingerprint, reasons quoting it), and none of
    them is meant to hold a control character.  ``--json`` output keeps the text as it is (JSON
    escapes it itself)."""
    if isinstance(data, str):
        return shown_name(data)
    if isinstance(data, dict):
        return {k: shown_names(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [shown_names(v) for v in data]
    return data


def fit_name(stem: str, tail: str = "", limit: int = NAME_MAX) -> str:
    """``stem + tail`` when its UTF-8 bytes fit in ``limit`` (one path component), else ``stem``
    cut at a character boundary, ``~`` and 8 hex digits of a hash of the whole ``stem``, then
    ``tail`` (a name's own ending, such as ``_results.csv``): the same stem always gives the same
    name, and stems that differ only past the cut get different ones.  A ``tail`` too long to
    keep is cut with the stem."""
    if len(_bytes(stem + tail)) <= limit:
        return stem + tail
    if len(_bytes(tail)) > limit // 2:
        stem, tail = stem + tail, ""
    import hashlib

    tag = "~" + hashlib.sha256(_bytes(stem)).hexdigest()[:8]
    room = limit - len(_bytes(tag + tail))
    kept, used = [], 0
    for ch in stem:
        n = len(_bytes(ch))
        if used + n > room:
            break
        kept.append(ch)
        used += n
    return "".join(kept) + tag + tail


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


def atomic_write(
    path: Path,
    write: Callable[[IO[bytes]], None],
    overwrite: bool = True,
    *,
    mode: int | None = None,
    owner: tuple[int | None, int | None] | None = None,
) -> Path:
    """Write ``path`` atomically via ``write(fileobj)``. With ``overwrite=False`` an existing
    file is never replaced (FileExistsError).  The file is created 0600; ``mode`` and ``owner``
    (uid, gid) are set on the temporary file, before it gets its final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    room = NAME_MAX - len(TMP_PREFIX) - 1 - _TMP_RANDOM
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + fit_name(path.name, limit=room) + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if owner is not None and owner != (None, None):
                uid, gid = owner
                os.fchown(f.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
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


def atomic_write_bytes(path: Path, data: bytes, overwrite: bool = True, **kw: Any) -> Path:
    return atomic_write(path, lambda f: None if f.write(data) else None, overwrite=overwrite, **kw)


def remove_stale_temp_files(folder: Path, recursive: bool = False) -> list[Path]:
    """Our own leftovers from a crash mid-write (names starting with TMP_PREFIX; never anything else)."""
    removed = []
    if folder.is_dir():
        for p in folder.rglob(TMP_PREFIX + "*") if recursive else folder.glob(TMP_PREFIX + "*"):
            if p.is_file() and not p.is_symlink():
                p.unlink()
                removed.append(p)
    return removed


def stamp(ts: float) -> str:
    """A time as it is put in a file name: ``20261125T101500Z`` (UTC)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


def free_path(folder: Path, name: str, stamp: str, companion: Callable[[str], str] | None = None) -> Path:
    """``folder/name`` if free, else ``name`` with a timestamp suffix (then a counter); each cut to
    fit the file system (:func:`fit_name`).  With ``companion`` (a name -> the name of a file
    written beside it later, such as a result's report), a name is free only if its companion's
    is too, so the two keep one stem."""

    def taken(p: Path) -> bool:
        return p.exists() or (companion is not None and (folder / companion(p.name)).exists())

    stem, suffix = Path(name).stem, Path(name).suffix
    p = folder / fit_name(stem, suffix)
    if not taken(p):
        return p
    safe = re.sub(r"[^0-9A-Za-z]", "", stamp)
    cand = folder / fit_name(stem, f"_{safe}{suffix}")
    n = 2
    while taken(cand):
        cand = folder / fit_name(stem, f"_{safe}-{n}{suffix}")
        n += 1
    return cand


def move_no_clobber(src: Path, folder: Path, name: str, stamp: str) -> Path:
    """Move ``src`` into ``folder`` under ``name`` (or a free variant of it), never replacing a
    file, even one that appears between the check and the move: the move is a hard link (which
    fails on an existing name) then an unlink of the source; where links are not possible (a file
    system without them), ``renameat2(RENAME_NOREPLACE)`` is used, and only if neither exists a plain
    rename after the check.  A move cut short between its link and its unlink (``kill -9``) left
    ``src`` in ``folder`` already: that link is kept and ``src`` unlinked, so a redone move never
    makes a second copy."""
    folder.mkdir(parents=True, exist_ok=True)
    left = _link_in(src, folder)
    if left is not None:
        os.unlink(src)
        fsync_dir(folder)
        fsync_dir(src.parent)
        return left
    for _ in range(1000):
        dest = free_path(folder, name, stamp)
        try:
            _link_or_rename_noreplace(src, dest)
        except FileExistsError:
            continue  # somebody took that name meanwhile: choose again
        fsync_dir(folder)
        fsync_dir(src.parent)
        return dest
    raise FileExistsError(f"no free name for {name} in {folder}")


def _link_in(src: Path, folder: Path) -> Path | None:
    """A name in ``folder`` for the very file ``src`` is (a hard link), or None."""
    try:
        st = os.stat(src, follow_symlinks=False)
    except OSError:
        return None
    if st.st_nlink < 2:
        return None  # the usual case: no other name, nothing to look for
    with os.scandir(folder) as entries:
        for e in entries:
            if e.inode() == st.st_ino and e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_dev == st.st_dev:
                return Path(e.path)
    return None


def _link_or_rename_noreplace(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:
        if _rename_noreplace(src, dest):
            return
        if dest.exists():
            raise FileExistsError(str(dest)) from None
        os.rename(src, dest)
        return
    os.unlink(src)


def _rename_noreplace(src: Path, dest: Path) -> bool:
    """Linux ``renameat2(RENAME_NOREPLACE)``; False when unavailable (other systems, old kernels)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_noreplace = -100, 1
    rc = renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dest), rename_noreplace)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise FileExistsError(str(dest))
    return False
