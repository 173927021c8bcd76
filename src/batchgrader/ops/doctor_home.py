"""The doctor's checks of the home and the daemon: permissions, database integrity, answer-store size,
learned queue limits, and whether the daemon (or its service unit) runs.  They only read.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Config
from batchgrader.core.host.home import Home
from batchgrader.ops.checks import FAIL, OK, WARN, Check, _mode, _q, _timeout_runner

ServiceStatus = Callable[[Home], "Mapping[str, Any] | None"]


# --- 6. home permissions -------------------------------------------------------------------------


def check_permissions(home: Home) -> Check:
    root = home.root
    if not root.is_dir():
        return Check(
            "home permissions",
            WARN,
            f"{root} does not exist yet (bgctl daemon creates it, mode 0700)",
            f"mkdir -p -m 700 {_q(root)}",
        )
    dirs = [root] + sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    loose_dirs = _loose(dirs)
    loose_files = _loose([f for f in _home_files(home) if f.is_file()])
    if not loose_dirs and not loose_files:
        return Check(
            "home permissions", OK, f"{root} and its {len(dirs) - 1} folders are 0700 or stricter; its files 0600 or stricter"
        )
    found = [f"{p} is {m:04o}" for p, m in loose_dirs + loose_files]
    detail = "group/others can access: " + "; ".join(found[:8]) + (f"; and {len(found) - 8} more" if len(found) > 8 else "")
    return Check("home permissions", WARN, detail, _permissions_fix(root, loose_dirs, loose_files))


def _home_files(home: Home) -> list[Path]:
    """The home's files whose mode matters (secrets.env has its own check: a fail, not a warning)."""
    from batchgrader.core.host.secrets import ENV_FILE_NAME

    files = [home.config_file, home.prompts_file, home.db, Path(f"{home.db}-wal"), Path(f"{home.db}-shm"), home.lock_file]
    if home.logs.is_dir():
        files += sorted(p for p in home.logs.iterdir() if p.is_file() and not p.is_symlink())
    return [f for f in files if f.name != ENV_FILE_NAME]


def _loose(paths: list[Path]) -> list[tuple[Path, int]]:
    """The paths group or others can access, with their modes; a path that cannot be read is skipped."""
    out = []
    for p in paths:
        try:
            if _mode(p) & 0o077:
                out.append((p, _mode(p)))
        except OSError:
            pass
    return out


def _permissions_fix(root: Path, loose_dirs: list[tuple[Path, int]], loose_files: list[tuple[Path, int]]) -> str:
    if len(loose_dirs) + len(loose_files) > 8:
        return f"chmod -R go-rwx {_q(root)}"
    cmds = []
    if loose_dirs:
        cmds.append("chmod 700 " + " ".join(_q(p) for p, _ in loose_dirs))
    if loose_files:
        cmds.append("chmod 600 " + " ".join(_q(p) for p, _ in loose_files))
    return " && ".join(cmds)


# --- 7. database integrity -----------------------------------------------------------------------


def check_database(home: Home) -> Check:
    from batchgrader.store.eventstore import EventStore

    db = home.db
    if not db.exists():
        return Check("database", OK, f"no database yet at {db} (the daemon creates it)")
    recover = (
        f"stop the daemon, keep a copy (cp {_q(db)} {_q(str(db) + '.bad')}), then recover: "
        f"sqlite3 {_q(db)} .recover | sqlite3 {_q(str(db) + '.recovered')} and move that file to {_q(db)}"
    )
    try:
        with EventStore(db, readonly=True) as store:
            result = store.integrity_check()
            cache = answers_size(store.conn)
    except sqlite3.DatabaseError as exc:
        return Check("database", FAIL, f"{db}: {exc}", recover)
    except OSError as exc:
        return Check("database", FAIL, f"{db}: cannot open ({exc})", f"ls -l {_q(db)}")
    if result != "ok":
        return Check("database", FAIL, f"{db}: PRAGMA integrity_check: {result[:300]}", recover)
    return Check("database", OK, f"{db}: PRAGMA integrity_check ok; {cache}")


def answers_size(conn: sqlite3.Connection) -> str:
    """The answers store's size, for the database check (`bgctl cache stats` has the details)."""
    from batchgrader.store import answers

    st = answers.stats(conn)
    if not st["answers"]:
        return "answers store: empty"
    return (
        f"answers store: {st['answers']:,} answers, {st['content_bytes'] / 1e6:.1f} MB of answer text, "
        f"oldest {str(st['oldest'])[:10]} (bgctl cache clear --older-than DAYS frees space)"
    )


def check_queue_limits(home: Home, config: Config | None) -> Check:
    """The provider queue limits: configured (enqueued_token_limit) and learned (QueueLimitLearned)."""
    parts = [f"{m}: {n:,} (configured)" for m, n in sorted((config.enqueued_token_limit if config else {}).items())]
    if home.db.exists():
        try:
            conn = sqlite3.connect(f"file:{home.db}?mode=ro", uri=True, timeout=5)
            try:
                rows = conn.execute("SELECT payload FROM events WHERE type = 'QueueLimitLearned' ORDER BY seq").fetchall()
            finally:
                conn.close()
        except sqlite3.Error as exc:
            return Check("queue limits", WARN, f"cannot read {home.db}: {exc}", "see the database check")
        learned: dict[tuple[str, str], dict[str, Any]] = {}
        for (payload,) in rows:
            p = json.loads(payload)
            learned[(p.get("base_url") or "", p.get("model") or "")] = p
        for (url, model), p in sorted(learned.items()):
            how = "stated by the provider" if p.get("exact") else f"estimated, {p.get('source')}"
            parts.append(f"{model} at {url or 'the provider'}: {int(p.get('limit') or 0):,} ({how})")
    detail = "; ".join(parts) if parts else "none known yet: learned from the provider's first token_limit_exceeded"
    return Check("queue limits", OK, "enqueued prompt tokens per model: " + detail)


# --- 8. the daemon ---------------------------------------------------------------------------------


def check_daemon(home: Home, service_status: ServiceStatus | None) -> Check:
    from batchgrader.core.host.lock import daemon_pid

    try:
        pid = daemon_pid(home)
    except OSError as exc:
        return Check("daemon", WARN, f"cannot read {home.lock_file}: {exc}", f"ls -l {_q(home.lock_file)}")
    svc = ""
    if service_status is not None:
        try:
            info = service_status(home)
        except Exception:  # noqa: BLE001 - e.g. an unsupported platform: no service part
            info = None
        svc = _describe_service(info)
    if pid is not None:
        running = f"running (pid {pid})" if pid > 0 else "running (pid unknown)"
        return Check("daemon", OK, running + (f"; {svc}" if svc else ""))
    return Check(
        "daemon",
        WARN,
        "not running" + (f"; {svc}" if svc else ""),
        "bgctl daemon (in a terminal), or bgctl service install (start it at login)",
    )


def _describe_service(info: Mapping[str, Any] | None) -> str:
    if not info:
        return ""
    unit = f"{info.get('manager') or 'service'} {info.get('mode') or ''} unit".replace("  ", " ")
    if not info.get("installed"):
        return f"service: {unit} not installed ({info.get('path')})"
    active = info.get("active")
    state = active if active else (info.get("detail") or "state unknown")
    return f"service: {unit} installed ({info.get('path')}), {state}"


def _default_service_status(env: Mapping[str, str], timeout: float) -> ServiceStatus:
    def get(home: Home) -> Mapping[str, Any] | None:
        from batchgrader.ops.service import status

        return status(home, runner=_timeout_runner(timeout), environ=env)

    return get
