"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, ``initdb`` in a
temporary folder, loopback only, run as an unprivileged user (the server refuses to run as root,
and CI runs as root), stopped at the end.

:func:`find_bindir` finds the server binaries; :class:`PostgresServer` starts and stops one
server; the fixtures in ``tests/pg_fixtures.py`` give each test its own empty database on it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

#: the unprivileged users the server may run as when the tests run as root, in order of preference
#: (``postgres`` comes with Debian's package; ``nobody`` is on every system)
SERVER_USERS = ("postgres", "nobody")
START_TIMEOUT_S = 60


def _version_key(path: str) -> tuple[int, ...]:
    parts = Path(path).parent.parent.name.split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def find_bindir() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: the newest of Debian's
    ``/usr/lib/postgresql/*/bin``, else the one ``pg_config --bindir`` names, else ``PATH``'s."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    if found:
        return Path(found[-1]).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False).stdout.strip()
        if out and (Path(out) / "initdb").exists():
            return Path(out)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the server: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError(f"running as root and none of the users {', '.join(SERVER_USERS)} exists to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One throw-away PostgreSQL cluster on 127.0.0.1 (trust authentication, superuser ``bg``)."""

    SUPERUSER = "bg"

    def __init__(self, bindir: Path, durable: bool = False) -> None:
        self.bindir = bindir
        self.durable = durable  # fsync on, as in production (the benchmark); the tests run without it
        self.user = _server_user()
        # not under pytest's tmp folder: that one is 0700 root, which the server's user cannot enter
        self.root = Path(tempfile.mkdtemp(prefix="bg-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.logfile = self.root / "server.log"
        self.port = 0
        self.started = False

    # --- running commands as the server's user -------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        kwargs: dict = {}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "HOME": str(self.root)}
        if self.user is not None:
            kwargs.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        proc = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.root,
            timeout=START_TIMEOUT_S + 30,
            check=False,
            **kwargs,
        )
        if check and proc.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-4000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr or proc.stdout}\n{log}")
        return proc

    def start(self) -> PostgresServer:
        self.sockets.mkdir()
        if self.user is not None:
            for p in (self.root, self.sockets):
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
            os.chmod(self.root, 0o700)
        self._run("initdb", "-D", str(self.data), "-U", self.SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        last: Exception | None = None
        for _ in range(5):  # the free port may be taken between the look and the start
            self.port = _free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sockets} -c max_connections=200"
            if not self.durable:
                options += " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
            proc = self._run(
                "pg_ctl", "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(self.data), "-l", str(self.logfile), "-o", options,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                self.started = True
                return self
            last = RuntimeError(f"pg_ctl start failed: {proc.stderr or proc.stdout}")
        raise RuntimeError(f"{last}\n{self.logfile.read_text(errors='replace')[-4000:] if self.logfile.exists() else ''}")

    def stop(self) -> None:
        if self.started:
            self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data), check=False)
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)

    # --- addresses ------------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
