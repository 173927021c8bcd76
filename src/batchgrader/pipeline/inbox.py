"""The inbox: find complete files, reject what cannot be read, claim the rest.

File-system events only *wake* the daemon (watchdog drops inotify overflows silently); the truth
is a full scan, done at start-up, on every wake and periodically.  A file is taken only when its
size and mtime are unchanged across two looks ``stable_seconds`` apart, or at its first look when
its mtime is at least ``stable_seconds`` older than its ctime (a file moved in whole: its content
had settled before the move, by the file system's clock), and a file in a folder
that names no profile is rejected only then too (the daemon reloads an edited config.yaml
before each scan: a profile written just before its file was queued is known by then).  Claiming writes a claim
record in the job's work folder, then renames the file into it (same filesystem, atomic), so a
crash between the two is recovered at start-up from the work folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from batchgrader.core.host.home import Home
from batchgrader.fsio import atomic_write_bytes, fit_name, fsync_dir, shown_name
from batchgrader.pipeline.formats.registry import SUPPORTED_SUFFIXES as SUPPORTED_SUFFIXES  # read by ops/actions too

IGNORED_SUFFIXES = (".part", ".tmp", ".partial", ".crdownload", ".swp", "~")
CLAIM_FILE = "claim.json"


class HashAhead:
    """The sha256 of each file seen in the inbox, computed in a background thread while the file
    becomes stable (file reads and hashlib release the interpreter's lock: it runs beside the
    daemon), for its claim if its size and mtime are still those it was first seen with (a file
    changed since is hashed again at its claim, as a file is taken only unchanged).  A file is
    hashed ahead once, at its first look: one still being written costs one read too many."""

    def __init__(self, hash_file: Callable[[Path], str]) -> None:
        self._hash_file = hash_file
        self._ahead: dict[Path, tuple[tuple[int, int], Future[str]]] = {}

    def start(self, waiting: Mapping[Path, tuple[int, int]]) -> None:
        """Hash the files of ``waiting`` (path -> size and mtime) not seen before, one after the
        other in a thread of their own; forget those no longer waiting."""
        for gone in set(self._ahead) - set(waiting):
            del self._ahead[gone]
        new = [(path, look, Future[str]()) for path, look in waiting.items() if path not in self._ahead]
        if not new:
            return
        for path, look, fut in new:
            self._ahead[path] = (look, fut)

        def run() -> None:
            for path, _look, fut in new:
                try:
                    fut.set_result(self._hash_file(path))
                except BaseException as exc:  # noqa: BLE001 - the claim hashes it again, and reports
                    fut.set_exception(exc)

        threading.Thread(target=run, name="hash-ahead", daemon=True).start()

    def take(self, path: Path, size: int, mtime_ns: int) -> str | None:
        """The sha256 of ``path`` hashed ahead (waiting for it if under way), if it had this size
        and mtime then; else None."""
        got = self._ahead.pop(path, None)
        if got is None or got[0] != (size, mtime_ns):
            return None
        try:
            return got[1].result()
        except Exception:  # noqa: BLE001 - gone or unreadable then: hashed again by the caller
            return None


def is_ignored(name: str) -> bool:
    return name.startswith((".", "~")) or name.lower().endswith(IGNORED_SUFFIXES)


@dataclass(frozen=True)
class Candidate:
    path: Path
    profile: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Rejection:
    path: Path
    profile: str
    code: str
    reason: str
    fingerprint: str
    movable: bool  # a regular file we may move to failed/; links and special files are left alone


def _link_or_special(st: os.stat_result) -> str | None:
    """What an inbox entry is when it is not a file of its own (None: it is one): a symbolic link,
    a hard link (a regular file with other names, perhaps outside the home, which the daemon
    must not take over as its input), a FIFO, a device or socket."""
    if stat.S_ISREG(st.st_mode):
        if st.st_nlink > 1:
            return (
                f"a hard link (one of {st.st_nlink} names of the same file, which may be outside the home), not a file of its own"
            )
        return None
    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
    return f"{kind}, not a regular file"


def fingerprint(path: Path, st: os.stat_result) -> str:
    return f"{path}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


class InboxScanner:
    """Scans ``inbox/`` and ``inbox/<profile>/``; returns files ready to claim and rejections."""

    def __init__(self, home: Home, profiles: set[str], stable_seconds: float):
        self.home = home
        self.profiles = set(profiles)
        self.stable_seconds = stable_seconds
        self._looks: dict[Path, tuple[int, int, float]] = {}
        self._unknown: dict[Path, tuple[int, int]] = {}  # stable files of folders that name no profile (size, mtime)

    def scan(self, now: float) -> tuple[list[Candidate], list[Rejection]]:
        ready: list[Candidate] = []
        rejected: list[Rejection] = []
        seen: set[Path] = set()
        for profile, folder in self._folders():
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except FileNotFoundError:
                continue
            for entry in entries:
                if is_ignored(entry.name):
                    continue
                path = Path(entry.path)
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    continue  # profile folders handled by _folders
                if profile not in self.profiles and folder != self.home.inbox:
                    if stat.S_ISREG(st.st_mode):
                        seen.add(path)
                        if self._unknown.get(path) == (st.st_size, st.st_mtime_ns) or self._stable(path, st, now):
                            self._looks.pop(path, None)  # reported: it waits for nothing (the daemon does not wake for it)
                            self._unknown[path] = (st.st_size, st.st_mtime_ns)
                            rejected.append(self._unknown_profile(path, profile, entry.name, st))
                    continue
                kind = _link_or_special(st)
                if kind is not None:
                    rejected.append(
                        Rejection(
                            path,
                            profile,
                            "not_regular_file",
                            f"{shown_name(entry.name)} is {kind}; it was left where it is. Copy the real file into the inbox instead.",
                            fingerprint(path, st),
                            movable=False,
                        )
                    )
                    continue
                if not entry.name.lower().endswith(SUPPORTED_SUFFIXES):
                    rejected.append(
                        Rejection(
                            path,
                            profile,
                            "unsupported_format",
                            f"{shown_name(entry.name)}: unsupported file type; supported: {', '.join(SUPPORTED_SUFFIXES)}",
                            fingerprint(path, st),
                            movable=True,
                        )
                    )
                    continue
                seen.add(path)
                if self._stable(path, st, now) or self._moved_in_settled(st):
                    ready.append(Candidate(path, profile, st.st_size, st.st_mtime_ns))
        for gone in set(self._looks) - seen:
            del self._looks[gone]
        for gone in set(self._unknown) - seen:
            del self._unknown[gone]
        return ready, rejected

    def _stable(self, path: Path, st: os.stat_result, now: float) -> bool:
        """Whether ``path`` had this size and mtime at a look ``stable_seconds`` ago (this look is noted)."""
        look = (st.st_size, st.st_mtime_ns)
        prev = self._looks.get(path)
        if prev is None or (prev[0], prev[1]) != look:
            self._looks[path] = (*look, now)
            return False
        return now - prev[2] >= self.stable_seconds

    def _moved_in_settled(self, st: os.stat_result) -> bool:
        """Whether the file's content had not changed for ``stable_seconds`` when its inode last
        changed (its move into the inbox, typically): its mtime that much older than its ctime,
        both stamped by the file system's own clock.  Such a file is taken at its first look; a
        file written in place (each write stamps both) waits for the two looks."""
        return self.stable_seconds > 0 and st.st_ctime_ns - st.st_mtime_ns >= self.stable_seconds * 1e9

    def pending(self) -> bool:
        return bool(self._looks)

    def waiting_profiles(self) -> set[str]:
        """The profiles of the files waiting to be stable (``default``: the inbox's own files)."""
        return {"default" if path.parent == self.home.inbox else path.parent.name for path in self._looks}

    def due(self) -> float | None:
        """When a file waiting to be stable can next be found so (its last change seen plus
        ``stable_seconds``); None when none waits."""
        return min((seen + self.stable_seconds for _, _, seen in self._looks.values()), default=None)

    def forget(self, path: Path) -> None:
        self._looks.pop(path, None)

    def waiting(self) -> dict[Path, tuple[int, int]]:
        """The files waiting to be stable, each with its size and mtime (ns) at its last look."""
        return {path: (size, mtime) for path, (size, mtime, _seen) in self._looks.items()}

    def _folders(self):
        """``("default", inbox/)``, then each folder of the inbox with its name: a profile's, or one
        config.yaml does not define (whose files :meth:`scan` rejects once they are stable)."""
        inbox = self.home.inbox
        yield "default", inbox
        try:
            entries = sorted(os.scandir(inbox), key=lambda e: e.name)
        except FileNotFoundError:
            return
        for entry in entries:
            if is_ignored(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            yield entry.name, Path(entry.path)

    def _unknown_profile(self, path: Path, folder: str, name: str, st: os.stat_result) -> Rejection:
        """A file in a folder that names no profile.  It is rejected only once stable, as a file
        is taken only once stable: a daemon reloads an edited config.yaml before each scan, so a
        file queued in a profile's folder just after the profile was written into config.yaml
        (`bgctl submit`, the Python API's settings) is seen with its profile, never rejected."""
        known = ", ".join(sorted(self.profiles)) or "none defined"
        return Rejection(
            path,
            folder,
            "unknown_profile",
            f"{shown_name(folder)}/{shown_name(name)}: folder {folder!r} is not a profile in config.yaml (profiles: {known}); "
            "the file was left where it is",
            fingerprint(path, st),
            movable=False,
        )


def write_claim(job_dir: Path, record: dict) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(job_dir / CLAIM_FILE, json.dumps(record, ensure_ascii=False, indent=1).encode())


def read_claim(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / CLAIM_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def claim(job_dir: Path, cand: Candidate, record: dict) -> Path:
    """Record the claim, then move the file into the job's work folder (atomic rename)."""
    write_claim(job_dir, record)
    dest = job_dir / ("input" + cand.path.suffix.lower())
    os.rename(cand.path, dest)
    fsync_dir(job_dir)
    fsync_dir(cand.path.parent)
    return dest


def claimed_input(job_dir: Path) -> Path | None:
    for p in sorted(job_dir.glob("input.*")):
        if p.is_file():
            return p
    return None


def fresh_marker(inbox_file: Path) -> Path:
    """`bgctl submit --fresh`: an empty dot-file next to the inbox file (ignored by the scan); the
    daemon notes it in the claim record and then removes it."""
    p = Path(inbox_file)
    return p.parent / fit_name(f".{p.name}", ".fresh")


def submit_file(home: Home, src: Path, profile: str | None = None, fresh: bool = False) -> Path:
    """`bgctl submit`: copy a file into the inbox atomically (temporary name, then rename).
    With ``fresh`` the marker is written first, so the daemon never takes the file without it."""
    src = Path(src)
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no such file")
    folder = home.inbox / profile if profile and profile != "default" else home.inbox
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / src.name
    n = 1
    while dest.exists():
        dest = folder / fit_name(src.stem, f"-{n}{src.suffix}")
        n += 1
    tmp = folder / fit_name(f".{dest.name}", ".part")
    if fresh:
        marker = fresh_marker(dest)
        marker.write_bytes(b"")
        with open(marker, "rb") as f:
            os.fsync(f.fileno())
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.rename(tmp, dest)
    fsync_dir(folder)
    return dest


class _StopRace(logging.Filter):
    """Drops watchdog's "queue_events() called when the thread is inactive": logged (as an error)
    when its reading thread wakes up after :meth:`InboxWatcher.stop` deactivated it, a race
    that loses nothing (the daemon is stopping and scans the inbox at its next start)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in str(record.msg)


_STOP_RACE = _StopRace()


class InboxWatcher:
    """A watchdog observer whose only job is to wake the daemon; scanning does the rest."""

    def __init__(self, home: Home, wake: threading.Event):
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        logging.getLogger("watchdog.observers.inotify").addFilter(_STOP_RACE)  # once: a filter is added once

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # noqa: ANN001
                wake.set()

        self.observer = Observer()
        self.observer.schedule(_Handler(), str(home.inbox), recursive=True)

    def start(self) -> None:
        self.observer.start()

    def stop(self) -> None:
        self.observer.stop()
        self.observer.join(timeout=5)
