"""The files a scheduled run takes (``schedule_source``), and how one is taken: claimed into its
job's work folder as the inbox claims a file (a claim record, then the input), but copied, since
the source stays for the next time.  The pure decision is :mod:`batchgrader.core.rules.cron`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from batchgrader.core.host.home import Home
from batchgrader.fsio import fsync_dir
from batchgrader.pipeline.inbox import SUPPORTED_SUFFIXES, is_ignored, write_claim


def source_path(home: Home, source: str) -> Path:
    """``schedule_source`` as a path (a relative one under the home)."""
    p = Path(source).expanduser()
    return p if p.is_absolute() else home.root / p


def source_files(home: Home, source: str) -> list[str]:
    """The files a run of ``source`` takes: the file itself, or a folder's regular files of a
    supported format (not hidden or partial), sorted; [] when there is none (yet)."""
    p = source_path(home, source)
    if p.is_file():
        return [str(p)]
    if not p.is_dir():
        return []
    return sorted(
        str(f) for f in p.iterdir() if f.is_file() and not is_ignored(f.name) and f.name.lower().endswith(SUPPORTED_SUFFIXES)
    )


def claim_copy(home: Home, job_id: str, src: Path, record: dict) -> Path:
    """``src`` claimed for ``job_id``: the claim record, then a copy as the job's input (the
    daemon's start-up accepts a claimed input whose job was never recorded).  The input's path."""
    job_dir = home.job_dir(job_id)
    write_claim(job_dir, record)
    dest = job_dir / ("input" + src.suffix.lower())
    tmp = job_dir / f".{dest.name}.part"
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    fsync_dir(job_dir)
    return dest


def unclaim(home: Home, job_id: str) -> None:
    """Remove a claim whose job another daemon recorded first."""
    shutil.rmtree(home.job_dir(job_id), ignore_errors=True)
