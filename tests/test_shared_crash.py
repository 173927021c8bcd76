"""Three `bgctl daemon` processes on one PostgreSQL store, one home and one emulator, under
chaos: ``kill -9`` of the account's holder while it uploads, the database's connections cut
(``pg_terminate_backend``) as a create takes effect and at random moments (a merge, a result
being written), random ``kill -9`` and ``SIGSTOP`` past the leases' lifetime.  Killed daemons
are started again.  Then: one live batch per chunk at the emulator, the token usage recorded
equals the emulator's billed usage, every row answered once in the outbox, no result written
twice or overwritten (docs/scaling.md)."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from batchgrader.core.host.home import Home
from batchgrader.emulator import Emulator, EmulatorConfig
from harness import FAST_CONFIG, TEST_KEY, start_daemon, wait_for

pytestmark = pytest.mark.slow

LEASE = 5.0  # lease_seconds: a dead daemon's jobs are taken over this long after
CONFIG = FAST_CONFIG.replace("request_timeout_seconds: 5", "request_timeout_seconds: 2") + (
    f"split_row_limit: 3\nlease_seconds: {LEASE}\n"
)
OURS = "bg-crash-test"  # the test's own connections (never cut: only the daemons' are)
INPUTS = {"a.csv": 7, "b.csv": 5, "c.csv": 2}  # 3 + 2 + 1 chunks
CHUNKS = 6


def _inputs(home: Home) -> None:
    for name, n in INPUTS.items():
        (home.inbox / name).write_text("id,response\n" + "".join(f"{name[0]}{i},text {i}\n" for i in range(n)))


def _terminate_backends(pg_url: str) -> int:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name <> %s",
            (OURS,),
        ).fetchall()
    return len(rows)


def _account_holder_pid(pg_url: str) -> int | None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        row = conn.execute(
            "SELECT holder FROM leases WHERE name LIKE 'account:%%' AND holder IS NOT NULL "
            "AND expires_at > extract(epoch FROM clock_timestamp())"
        ).fetchone()
    return int(row[0].split(":")[1]) if row else None


def _events(pg_url: str) -> list[tuple[str, str, dict[str, Any]]]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        rows = conn.execute("SELECT job_id, type, payload FROM events ORDER BY seq").fetchall()
    return [(j, t, p if isinstance(p, dict) else json.loads(p)) for j, t, p in rows]


class Daemons:
    """The daemons, started again when killed; each one's stderr kept."""

    def __init__(self, home: Home, emu: Emulator, pg_url: str, n: int) -> None:
        self.home, self.emu, self.pg_url = home, emu, pg_url
        self.procs: list[subprocess.Popen] = []
        self.exits: list[str] = []  # the stderr of each daemon that stopped on its own
        self.lock = threading.Lock()
        for _ in range(n):
            self.procs.append(self._start())

    def _start(self) -> subprocess.Popen:
        return start_daemon(self.home.root, self.emu.base_url, extra_env={"BATCHGRADER_STORE_URL": self.pg_url})

    def pids(self) -> list[int]:
        with self.lock:
            return [p.pid for p in self.procs if p.poll() is None]

    def revive(self) -> None:
        """Start again a daemon that stopped on its own (as a service manager does): one whose
        start-up met a cut connection."""
        with self.lock:
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    self.exits.append(p.communicate(timeout=30)[1])
                    self.procs[i] = self._start()

    def kill(self, pid: int) -> None:
        with self.lock:
            for i, p in enumerate(self.procs):
                if p.pid == pid and p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
                    p.stderr.close()  # type: ignore[union-attr]
                    p.stdout.close()  # type: ignore[union-attr]
                    self.procs[i] = self._start()

    def stop_all(self) -> list[str]:
        with self.lock:
            for p in self.procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
            return [*self.exits, *(p.communicate(timeout=60)[1] for p in self.procs)]


def _batches(emu: Emulator) -> list[dict[str, Any]]:
    """Every batch at the emulator as it stands (its files may be deleted by now)."""
    with emu.store.lock:
        return [dict(b.obj) for b in emu.store.state.batches.values()]


def test_three_daemons_under_kills_pauses_and_cut_connections(tmp_path: Path, pg_url: str):
    from batchgrader.store.leases import Leases
    from batchgrader.store.pgstore import PostgresEventStore

    home = Home.resolve(tmp_path / "home").ensure()
    home.config_file.write_text(CONFIG)
    with PostgresEventStore(pg_url) as store:  # the tables, before the chaos reads them
        Leases(store, "test")
    rng = random.Random(37)
    daemons: Daemons | None = None
    hits: Counter = Counter()

    def hook(method: str, route: str, phase: str) -> None:
        if daemons is None:
            return
        key = (method, route, phase)
        hits[key] += 1
        if key == ("POST", "/v1/files", "received") and hits[key] == 2:
            pid = _account_holder_pid(pg_url)  # kill -9 of the caller while its upload is received
            if pid is not None:
                threading.Thread(target=daemons.kill, args=(pid,), daemon=True).start()
                hits["killed in upload"] += 1
        if key == ("POST", "/v1/batches", "effected") and hits[key] in (1, 3):
            hits["terminated in create"] += _terminate_backends(pg_url)

    emu = Emulator(EmulatorConfig(api_key=TEST_KEY, seed=37, on_request=hook, in_progress_s=1.5)).start()
    try:
        daemons = Daemons(home, emu, pg_url, 3)
        _inputs(home)
        deadline = time.monotonic() + 40
        done = threading.Event()

        def chaos() -> None:
            while not done.wait(rng.uniform(0.8, 1.6)):
                daemons.revive()
                pids = daemons.pids()
                if not pids:
                    continue
                what = rng.choice(["kill", "stop", "cut", "none"])
                if what == "kill":
                    daemons.kill(rng.choice(pids))
                    hits["killed"] += 1
                elif what == "stop":
                    pid = rng.choice(pids)
                    os.kill(pid, signal.SIGSTOP)  # past the lease's lifetime: its leases are taken over
                    hits["stopped"] += 1
                    done.wait(LEASE + 1.5)
                    os.kill(pid, signal.SIGCONT)
                elif what == "cut":
                    hits["cut"] += _terminate_backends(pg_url)

        chaos_thread = threading.Thread(target=chaos, daemon=True)
        chaos_thread.start()

        def ended() -> bool:
            ends = [j for j, t, _ in _events(pg_url) if t in ("JobCompleted", "JobFailed", "JobCancelled")]
            return len(set(ends)) >= len(INPUTS)

        try:
            wait_for(ended, timeout=deadline - time.monotonic(), interval=0.2, what="every job to end")
        finally:
            done.set()
            chaos_thread.join(timeout=30)
            errors = daemons.stop_all()
        events = _events(pg_url)
        batches = _batches(emu)
    finally:
        emu.stop()

    assert hits["killed in upload"] and hits["terminated in create"] and hits["stopped"] + hits["killed"], hits
    # a cut connection fails a tick or a start-up (tried again); nothing else may go wrong
    unexpected = ("ConcurrencyError", "LeaseLost", "deadlock", "AssertionError", "unexpected error", "held")
    assert not [e for e in errors if any(u in e for u in unexpected)], errors
    # every job completed, each result written once
    ends = Counter(t for _, t, _ in events if t.startswith("Job") and t in ("JobCompleted", "JobFailed", "JobCancelled"))
    assert ends == {"JobCompleted": len(INPUTS)}, ends
    written = [p for _, t, p in events if t == "ResultWritten"]
    assert len(written) == len(INPUTS)
    # one live batch per chunk at the emulator
    per_key = Counter(b["metadata"].get("bg_key") for b in batches if b["status"] not in ("failed", "cancelled"))
    assert len(per_key) == CHUNKS and set(per_key.values()) == {1}, per_key
    # the usage recorded equals what the emulator billed: nothing counted twice, nothing missed
    used = [p for _, t, p in events if t == "TokensUsed"]
    billed = [b["usage"] for b in batches if b.get("usage")]
    assert (sum(u["prompt_tokens"] for u in used), sum(u["completion_tokens"] for u in used)) == (
        sum(u["input_tokens"] for u in billed),
        sum(u["output_tokens"] for u in billed),
    )
    assert sum(u["prompt_tokens"] for u in used) > 0
    # every row answered once in the outbox, no result overwritten (one file per input)
    out = sorted(p.name for p in home.outbox.iterdir() if p.is_file())
    assert out == ["a_results.csv", "b_results.csv", "c_results.csv"], out
    for name, n in INPUTS.items():
        with (home.outbox / name.replace(".csv", "_results.csv")).open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert sorted(r["id"] for r in rows) == sorted(f"{name[0]}{i}" for i in range(n))
        assert all(r["error"] == "" for r in rows), rows


#: the appends a test trigger holds open (pg_sleep) the first times they are made, and what is done
#: to them there: the connection cut (pg_terminate_backend) or the appending daemon killed (-9).
#: ChunkCompleted: a merge's append (its TokensUsed in the same transaction); OutboxWriteStarted:
#: the result's intent; ResultWritten: the result file is in the outbox, its record not yet.
CUTS = {
    ("ChunkCompleted", 1): "cut",
    ("ChunkCompleted", 2): "kill",
    ("OutboxWriteStarted", 1): "kill",
    ("ResultWritten", 1): "cut",
    ("ResultWritten", 2): "kill",
}
HOLD = 2.0  # s an aimed append is held open: the watcher acts meanwhile


def _aim_cuts(pg_url: str) -> None:
    """A trigger on ``events``: the first inserts of each type in :data:`CUTS` are held open,
    named in the inserting backend's ``application_name`` (``cut:<type>:<n>:<job_id>``) so the
    test finds them.  Its counters are sequences (not rolled back with a cut transaction)."""
    import psycopg

    types = sorted({t for t, _ in CUTS})
    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        for t in types:
            conn.execute(f"CREATE SEQUENCE cut_{t.lower()}")
        plan = ", ".join(f"('{t}', {max(n for u, n in CUTS if u == t)})" for t in types)
        conn.execute(
            f"""CREATE FUNCTION cut_point() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE planned int; k bigint;
            BEGIN
                SELECT n INTO planned FROM (VALUES {plan}) AS p(t, n) WHERE t = NEW.type;
                IF planned IS NULL THEN RETURN NEW; END IF;
                k := nextval('cut_' || lower(NEW.type));
                IF k <= planned THEN
                    PERFORM set_config('application_name', 'cut:' || NEW.type || ':' || k || ':' || NEW.job_id, true);
                    PERFORM pg_sleep({HOLD});
                END IF;
                RETURN NEW;
            END $$"""
        )
        conn.execute("CREATE TRIGGER cut_point BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION cut_point()")


def _held_appends(pg_url: str) -> list[tuple[int, str, int, str]]:
    """(backend pid, event type, n, job id) of each append the trigger holds open now."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity WHERE application_name LIKE 'cut:%%'").fetchall()
    out = []
    for pid, name in rows:
        _, type_, n, job_id = name.split(":", 3)
        out.append((int(pid), type_, int(n), job_id))
    return out


def _job_holder_pid(pg_url: str, job_id: str) -> int | None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        row = conn.execute("SELECT holder FROM leases WHERE name = %s AND holder IS NOT NULL", (f"job:{job_id}",)).fetchone()
    return int(row[0].split(":")[1]) if row else None


def test_three_daemons_with_cuts_aimed_at_merges_and_result_writing(tmp_path: Path, pg_url: str):
    """The connection cut and the daemon killed exactly while a merge's append, a result's intent
    and a written result's record are in flight (held open by a trigger): no usage counted twice
    or missed, every row answered once, each input's result written once and never overwritten."""
    from batchgrader.store.leases import Leases
    from batchgrader.store.pgstore import PostgresEventStore

    home = Home.resolve(tmp_path / "home").ensure()
    home.config_file.write_text(CONFIG)
    with PostgresEventStore(pg_url) as store:  # the tables, before the trigger is put on them
        Leases(store, "test")
    _aim_cuts(pg_url)
    emu = Emulator(EmulatorConfig(api_key=TEST_KEY, seed=38, in_progress_s=1.0)).start()
    done: dict[tuple[str, int], str] = {}
    try:
        daemons = Daemons(home, emu, pg_url, 3)
        _inputs(home)

        def watch() -> bool:
            """Act on each held append as planned; True once every job has ended."""
            daemons.revive()
            for backend, type_, n, job_id in _held_appends(pg_url):
                what = CUTS.get((type_, n))
                if what is None or (type_, n) in done:
                    continue
                if what == "cut":
                    _terminate_backend(pg_url, backend)
                else:
                    pid = _job_holder_pid(pg_url, job_id)  # the job's holder is the one appending
                    assert pid is not None and pid in daemons.pids(), (type_, n, job_id)
                    daemons.kill(pid)
                done[(type_, n)] = what
            ends = [j for j, t, _ in _events(pg_url) if t in ("JobCompleted", "JobFailed", "JobCancelled")]
            return len(set(ends)) >= len(INPUTS) and len(done) == len(CUTS)

        try:
            wait_for(watch, timeout=90, interval=0.05, what="every job to end and every cut made")
        finally:
            errors = daemons.stop_all()
        events = _events(pg_url)
        batches = _batches(emu)
    finally:
        emu.stop()

    assert done == CUTS
    unexpected = ("ConcurrencyError", "LeaseLost", "deadlock", "AssertionError", "unexpected error", "held")
    assert not [e for e in errors if any(u in e for u in unexpected)], errors
    ends = Counter(t for _, t, _ in events if t in ("JobCompleted", "JobFailed", "JobCancelled"))
    assert ends == {"JobCompleted": len(INPUTS)}, ends
    # each merge recorded once per chunk, its usage equal to what the emulator billed
    completed = Counter((j, p["chunk"]) for j, t, p in events if t == "ChunkCompleted")
    assert len(completed) == CHUNKS and set(completed.values()) == {1}, completed
    used = [p for _, t, p in events if t == "TokensUsed"]
    billed = [b["usage"] for b in batches if b.get("usage")]
    assert (sum(u["prompt_tokens"] for u in used), sum(u["completion_tokens"] for u in used)) == (
        sum(u["input_tokens"] for u in billed),
        sum(u["output_tokens"] for u in billed),
    )
    per_key = Counter(b["metadata"].get("bg_key") for b in batches if b["status"] not in ("failed", "cancelled"))
    assert len(per_key) == CHUNKS and set(per_key.values()) == {1}, per_key
    # each result recorded once, at the name its intent gave it, and the outbox holds those alone
    written = {j: p["path"] for j, t, p in events if t == "ResultWritten"}
    assert len([1 for _, t, _ in events if t == "ResultWritten"]) == len(INPUTS)
    started = {j: p["path"] for j, t, p in events if t == "OutboxWriteStarted"}
    assert written == started
    out = sorted(p.name for p in home.outbox.iterdir() if p.is_file())
    assert out == ["a_results.csv", "b_results.csv", "c_results.csv"], out
    for name, n in INPUTS.items():
        with (home.outbox / name.replace(".csv", "_results.csv")).open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert sorted(r["id"] for r in rows) == sorted(f"{name[0]}{i}" for i in range(n))
        assert all(r["error"] == "" for r in rows), rows


def _terminate_backend(pg_url: str, backend: int) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name=OURS) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
