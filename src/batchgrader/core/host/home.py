"""The one state root: every file BatchGrader reads or writes lives under it.

``BATCHGRADER_HOME`` (or ``bgctl --home DIR``) relocates all of it; the default is the
platform's user data directory.  Nothing here touches the disk until ``ensure()`` is called.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "BATCHGRADER_HOME"


def default_home() -> Path:
    import platformdirs  # only when no home was given

    return Path(platformdirs.user_data_dir("batchgrader", appauthor=False))


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def resolve(cls, explicit: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None) -> Home:
        env = os.environ if environ is None else environ
        if explicit:
            root = Path(explicit)
        elif env.get(HOME_ENV):
            root = Path(env[HOME_ENV])
        else:
            root = default_home()
        return cls(root.expanduser().absolute())

    # --- well-known locations -------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.root / "config.yaml"

    @property
    def prompts_file(self) -> Path:
        return self.root / "prompts.yaml"

    @property
    def pricing_file(self) -> Path:
        """Optional user pricing overrides, merged over the shipped table."""
        return self.root / "pricing.csv"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def outbox(self) -> Path:
        return self.root / "outbox"

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def failed(self) -> Path:
        return self.root / "failed"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def db(self) -> Path:
        return self.root / "batchgrader.db"

    @property
    def lock_file(self) -> Path:
        return self.root / "daemon.lock"

    def job_dir(self, job_id: str) -> Path:
        return self.work / job_id

    def dirs(self) -> list[Path]:
        return [self.root, self.inbox, self.outbox, self.archive, self.failed, self.work, self.logs]

    def ensure(self) -> Home:
        """Create the directory tree (mode 0700). Idempotent."""
        for d in self.dirs():
            d.mkdir(parents=True, exist_ok=True)
            try:
                os.chmod(d, 0o700)
            except OSError:
                pass
        return self
