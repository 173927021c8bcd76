"""The Python API: ``import batchgrader as bg``, then ``bg.grade(df)`` in a script or a notebook.

A thin layer over the same calls as `bgctl grade` (docs/python.md): a DataFrame is written to a
Parquet file under ``<home>/work/api/``, queued in the inbox with `bgctl submit`'s checks, and
graded by the daemon (a running one, else one run in the foreground as `bgctl daemon --once`
does); :mod:`batchgrader.ops.grade` waits for the job's end and the result file is read back.
Settings given as keywords become a generated profile of config.yaml
(:mod:`batchgrader.ops.profiles`).  Nothing is imported here until a function is called:
``import batchgrader`` stays cheap and has no side effect.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from batchgrader.core.host.home import Home
    from batchgrader.ops.grade import Queued

__all__ = ["Job", "grade", "job"]


def grade(
    data: Any,
    profile: str | None = None,
    home: str | os.PathLike[str] | None = None,
    sandbox: bool = False,
    wait: bool = True,
    *,
    timeout: float | None = None,
    progress: bool = True,
    **settings: Any,
) -> pd.DataFrame | Job:
    """Grade ``data`` (a pandas DataFrame, or the path of a data file) and return the result as a
    DataFrame: every input column, the answer (``output_column``, or the ``response_format``'s
    fields) and the usual added columns.  ``wait=False`` returns at once with a :class:`Job`.

    ``profile``: a profile of config.yaml (None: the top level); ``home``: the state folder (None:
    ``BATCHGRADER_HOME`` or the platform's default); ``sandbox``: when no daemon runs, run it with
    the emulator (SIMULATED answers, no API key); ``timeout``: stop waiting after this many seconds
    (``GradeTimeout``, the job goes on); ``progress``: print a progress line with an ETA;
    ``settings``: configuration keys over the profile (``model="gpt-5.4"``, ``temperature=0``),
    written to config.yaml as a generated profile."""
    from pathlib import Path

    from batchgrader.core.configuration.config import load_config
    from batchgrader.ops import grade as g
    from batchgrader.ops.actions import submit_action

    h = _home(home)
    g.check_mode(h, sandbox)  # a real daemon would not simulate: refused before anything is written
    if settings:
        from batchgrader.ops.profiles import profile_with

        profile = profile_with(h, profile, settings)
    path = Path(os.fspath(data)) if isinstance(data, (str, os.PathLike)) else _write_frame(h, data)
    after = g.log_position(h)
    res = submit_action(h, path, profile, lambda: load_config(h))
    handle = Job(h, queued=g.Queued(Path(res["path"]), after), sandbox=sandbox)
    if not wait:
        return handle
    handle.wait(timeout=timeout, progress=progress)
    return handle.result()


def job(job_id: str, home: str | os.PathLike[str] | None = None) -> Job:
    """The job ``job_id`` (a unique prefix works), e.g. to wait for it again after the kernel died."""
    from batchgrader.store import queries

    h = _home(home)
    if not queries.log_exists(h):
        raise LookupError(f"no jobs yet: no event log at {h.db}")
    (row,) = queries.status(h, job_id)
    return Job(h, job_id=row["job_id"])


class Job:
    """A queued or running job: :meth:`status`, :meth:`wait`, :meth:`result`, :meth:`cancel`."""

    def __init__(self, home: Home, job_id: str | None = None, queued: Queued | None = None, sandbox: bool | None = None):
        self.home = home
        self._job_id = job_id
        self._queued = queued
        self._sandbox = sandbox  # the foreground daemon's mode; None: the job's own
        self._ended: dict[str, Any] | None = None

    @property
    def id(self) -> str | None:
        """The job id (None while the file waits in the inbox, not taken by the daemon yet)."""
        if self._job_id is None and self._queued is not None:
            from batchgrader.ops.grade import job_of

            self._job_id = job_of(self.home, self._queued)
        return self._job_id

    def __repr__(self) -> str:
        return f"<batchgrader Job {self.id or 'waiting in the inbox'} ({self.status()['state']})>"

    def status(self) -> dict[str, Any]:
        """The job's `bgctl status --json` row (``state``, ``rows``, ``progress``, ``eta_seconds``,
        ``cost_usd``, ...); ``{"job_id": None, "state": "inbox", "path": ...}`` while it waits."""
        from batchgrader.ops.grade import job_status

        if self.id is None:
            return {"job_id": None, "state": "inbox", "path": str(self._queued.path) if self._queued else None}
        return job_status(self.home, self.id)

    def wait(self, timeout: float | None = None, progress: bool = True) -> dict[str, Any]:
        """Wait until the job has ended and its result is written (running the daemon in this
        process when none runs); its status row with ``result_path`` and ``error_path``."""
        from batchgrader.ops.grade import follow

        show = _Progress() if progress else None
        try:
            self._ended = follow(
                self.home, self._queued, job_id=self.id, sandbox=self._sandbox, timeout=timeout, on_progress=show
            )
        finally:
            if show is not None:
                show.close()
        self._job_id = self._ended["job_id"]
        if show is not None:
            from batchgrader.ops.grade import summary_line

            print(summary_line(self._ended), file=sys.stderr)
        return self._ended

    def result(self) -> pd.DataFrame:
        """The result file as a DataFrame (waits for the job's end first)."""
        row = self._ended or self.wait(progress=False)
        if not row.get("result_path"):
            raise RuntimeError(f"job {row['job_id']} ended {row['state']} without a result: {row.get('error_path')}")
        return read_result(row["result_path"])

    def cancel(self, reason: str = "cancelled from Python") -> dict[str, Any]:
        """Ask the daemon to cancel the job (as `bgctl cancel`): ``{accepted, message, ...}``."""
        from batchgrader.ops.actions import control_action

        if self.id is None:
            return {"accepted": False, "message": "the file waits in the inbox: no job to cancel yet"}
        return control_action(self.home, "cancel", self.id, reason)


def read_result(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A result file as a DataFrame, by its format (CSV cells as text, exactly as written)."""
    import pandas as pd

    from batchgrader.pipeline.formats.registry import detect_format

    fmt = detect_format(path)
    if fmt == "parquet":
        return pd.read_parquet(path)
    if fmt == "csv":
        sep = "\t" if str(path).lower().endswith(".tsv") else ","
        return pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False)
    if fmt == "jsonl":
        return pd.read_json(path, lines=True)
    if fmt == "json":
        return pd.read_json(path)
    return pd.read_excel(path)


def _home(home: str | os.PathLike[str] | None) -> Home:
    from batchgrader.core.host.home import Home

    return Home.resolve(home)


def _write_frame(home: Home, df: Any) -> Any:
    """A DataFrame as a Parquet file under ``<home>/work/api/`` (the types kept), named by its
    content, for the inbox."""
    import hashlib
    import io

    import pandas as pd

    from batchgrader.fsio import atomic_write_bytes

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"grade() takes a pandas DataFrame or a file path, not {type(df).__name__}")
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    data = buf.getvalue()
    path = home.work / "api" / f"frame-{hashlib.sha256(data).hexdigest()[:12]}.parquet"
    if not path.exists():
        atomic_write_bytes(path, data)
    return path


class _Progress:
    """One line of progress (state, rows answered, ETA), rewritten in place on a terminal or in
    a notebook's output (a carriage return), on stderr."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, row: dict[str, Any]) -> None:
        from batchgrader.ops.grade import progress_line

        sys.stderr.write("\r" + progress_line(row).ljust(79))
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
