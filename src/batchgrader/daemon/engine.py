"""The reconciler: from the folded state, take each job one step further.

``Engine.tick(now)`` is the whole daemon logic; the process around it (locks, signals,
scheduling, the inbox watcher, the screen) lives in :mod:`batchgrader.daemon`.  Every external
action is an intent event, then the call, then an outcome event.  After a crash an intent
without an outcome is reconciled against the provider (listing files and batches and matching
them by name, input file and metadata) before anything is sent again.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

from batchgrader.core import queue
from batchgrader.core.config import Config, ConfigError, Profile
from batchgrader.core.decide import (
    FIRST_POLL_DELAY,
    Action,
    Archive,
    CancelBatch,
    CheckDuplicates,
    Create,
    DeleteProviderFiles,
    Download,
    FailBatch,
    FailUnstarted,
    Finish,
    Hold,
    Merge,
    PlanRetries,
    Poll,
    Prepare,
    Reconcile,
    RecoverEnded,
    Release,
    Replan,
    RestoreInput,
    SearchRecovered,
    Step,
    Timers,
    Upload,
    WriteResult,
    capacity_refusal,
    create_settle_seconds,
    epoch,
    list_round_due,
    next_action,
    next_poll_delay,
    probe_after_completion,
    queue_limit,
    refusal_lesson,
    resubmit_delay,
    token_cap,
    upload_name,
    utc_day,
)
from batchgrader.core.home import Home
from batchgrader.core.state import TERMINAL_BATCH, ChunkState, JobState, State, fold
from batchgrader.daemon import jobhook
from batchgrader.fsio import atomic_write, atomic_write_bytes, free_path, move_no_clobber, remove_stale_temp_files
from batchgrader.pipeline import inbox as inbox_mod
from batchgrader.pipeline.calibration import learned_overhead, overhead_payload
from batchgrader.pipeline.merge import merge_chunk
from batchgrader.pipeline.outbox import added_column_types, added_columns, error_name, error_report, result_name, result_values
from batchgrader.pipeline.prepare import ENDPOINT, default_custom_id, file_sha256, oversized_positions, prepare
from batchgrader.pipeline.pricing import PriceTable, PricingError
from batchgrader.pipeline.results import ResultsJoin, iter_outcomes
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks, write_chunk_files
from batchgrader.pipeline.tables import InputError, TableWriter, defuse_formula, open_table, text_of
from batchgrader.provider.openai_api import (
    OutcomeUnknown,
    Provider,
    ProviderError,
    ProviderRejected,
    list_statuses,
    reconcile_batch,
    reconcile_upload,
)
from batchgrader.store.eventstore import DatabaseMoved, EventStore, NewEvent

log = logging.getLogger("batchgrader.engine")

CLOCK_SKEW_SLACK = 600  # s, between our clock and the provider's, for created_after
REJECTION_HINTS = {
    "not_regular_file": "Copy the real file (not a link or special file) into the inbox.",
    "unsupported_format": "Save the data as .csv, .json or .jsonl and drop it in the inbox again.",
    "bad_file_name": "Rename the file (UTF-8 letters only) and drop it in the inbox again.",
    "cross_device": "Keep the inbox on the same file system as the BatchGrader home (or copy files in with `bgctl submit`).",
    "unreadable": "Make the file readable by the daemon's user and drop it in the inbox again.",
}
UNMOVABLE_REJECTIONS = frozenset({"not_regular_file", "unknown_profile"})  # left where they are
MAX_DOWNLOAD_ATTEMPTS = 4  # failed downloads of one file (each with the client's own retries) before its rows fail
MAX_MALFORMED_DOWNLOADS = 2  # downloads again of a malformed result file before its bad lines' rows fail

__all__ = ["Engine", "resubmit_delay", "utc_day"]


def _e(type_: str, **payload: Any) -> NewEvent:
    return NewEvent(type_, payload)


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")


def input_error_for_user(exc: InputError, user_file: str) -> str:
    """An input error as the user should read it: named after their file (``reviews.csv``), not
    the daemon's work copy (``input.csv``)."""
    return str(InputError(user_file, exc.reason, exc.line, exc.column))


@dataclass
class Engine:
    home: Home
    config: Config
    store: EventStore
    provider: Provider | None
    prices: PriceTable
    sandbox: bool = False
    state: State = field(default_factory=State)
    _next_poll: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    _not_before: dict[tuple[str, int], float] = field(default_factory=dict)
    _cancel_sent: set[str] = field(default_factory=set)
    _next_listing: dict[tuple[str, int], float] = field(default_factory=dict)
    _requested_at: dict[tuple[str, int], float] = field(default_factory=dict)
    _corrupt_logged: set[str] = field(default_factory=set)
    _effects_checked: set[str] = field(default_factory=set)
    _download_failures: dict[tuple[str, int, str], tuple[int, float]] = field(default_factory=dict)
    _scanner: inbox_mod.InboxScanner | None = None
    idle: bool = False
    scan_requested: bool = True  # set by the daemon when the watcher saw a change
    _last_scan: float = float("-inf")
    should_stop: Callable[[], bool] = lambda: False  # set by the daemon: SIGTERM finishes the current step
    on_progress: Callable[[], None] = lambda: None  # heartbeat for long steps (systemd watchdog)

    def __post_init__(self) -> None:
        self.state = fold(self.store.read())
        if self.provider is not None and hasattr(self.provider, "on_page"):
            # a long listing (many pages) keeps the watchdog fed from this, the working thread
            self.provider.on_page = lambda: self.on_progress()

    # --- plumbing -----------------------------------------------------------------------------
    def emit(self, job_id: str, *events: NewEvent) -> None:
        job = self.state.jobs.get(job_id)
        stored = self.store.append(job_id, events, expected_version=job.version if job else 0)
        for ev in stored:
            self.state.apply(ev)
            log.info("event %s %s %s", job_id, ev.type, _short(ev.payload))

    def profile_of(self, job: JobState) -> Profile:
        return self.config.profile(job.profile)

    def reload(self, config: Config, prices: PriceTable) -> None:
        self.config, self.prices = config, prices
        if self._scanner is not None:
            self._scanner.profiles = set(config.profiles)
            self._scanner.stable_seconds = config.default.stable_seconds
        self.scan_requested = True

    @property
    def settings(self) -> Profile:
        return self.config.default

    def inbox_pending(self) -> bool:
        """Files seen in the inbox but not yet taken (waiting to be stable)."""
        return self._scanner is not None and self._scanner.pending()

    def busy(self) -> bool:
        """True while a job can still make progress on its own (held jobs wait for the user)."""
        return any(not j.held for j in self.state.active_jobs())

    # --- the tick -------------------------------------------------------------------------------
    def startup(self, now: float) -> None:
        """Recover after a crash: our temp files, claimed-but-unrecorded inputs."""
        remove_stale_temp_files(self.home.outbox)
        for job_dir in sorted(self.home.work.glob("*")) if self.home.work.is_dir() else []:
            remove_stale_temp_files(job_dir, recursive=True)
            if job_dir.name in self.state.jobs or not job_dir.is_dir():
                continue
            record = inbox_mod.read_claim(job_dir)
            if record is None:
                continue
            input_path = inbox_mod.claimed_input(job_dir)
            if input_path is None:
                continue  # the rename never happened: the file is still in the inbox
            self._accept(job_dir.name, record, input_path)
            self._mark_recovered(job_dir)
        self.intake(now)

    def tick(self, now: float) -> None:
        """One pass over every job. Sets ``idle`` when, at the end of the pass, no job is active
        and no inbox file is waiting (decided here, not by another thread, to avoid races)."""
        self.idle = False
        self.intake(now)
        self._advance_all(now)
        self.idle = not self.busy() and not self.inbox_pending()

    def _advance_all(self, now: float) -> None:
        try:
            self._list_round(now)
        except ProviderError as exc:
            log.warning("listing batches: %s (polling them one by one)", exc)
        for job in sorted(self.state.jobs.values(), key=lambda j: j.created_ts):
            if self.should_stop():
                return
            if job.corrupt:
                self._report_corrupt(job)
                continue
            self.on_progress()
            try:
                self.advance(job, now)
            except DatabaseMoved:
                raise  # never go on writing to a file nobody reads
            except (ProviderError, OSError) as exc:
                log.warning("job %s: %s (will retry)", job.job_id, exc)
            except Exception as exc:  # one job's problem must not stop the others
                log.exception("job %s: unexpected error (will retry): %s", job.job_id, exc)

    # --- intake ---------------------------------------------------------------------------------
    def intake(self, now: float) -> None:
        """Scan the inbox when woken by the watcher, while a file waits to become stable, and
        every rescan_interval_seconds regardless (file events can be lost)."""
        if self._scanner is None:
            self._scanner = inbox_mod.InboxScanner(self.home, set(self.config.profiles), self.settings.stable_seconds)
        due = now - self._last_scan >= self.settings.rescan_interval_seconds
        if not (self.scan_requested or self._scanner.pending() or due):
            return
        self.scan_requested = False
        self._last_scan = now
        ready, rejected = self._scanner.scan(now)
        for r in rejected:
            if r.fingerprint in self.state.rejected:
                continue
            self._reject(r, now)
        for cand in ready:
            self._scanner.forget(cand.path)
            try:
                fp = inbox_mod.fingerprint(cand.path, os.lstat(cand.path))
            except FileNotFoundError:
                continue
            if _shown(fp) in self.state.rejected:
                continue  # reported already (it could not be taken)
            job_id = None
            try:
                cand.path.name.encode("utf-8")  # a name that is not UTF-8 cannot be recorded as it is
                sha = file_sha256(cand.path)
                job_id = self._new_job_id(sha)
                record = {"file": cand.path.name, "source": str(cand.path), "profile": cand.profile}
                input_path = inbox_mod.claim(self.home.job_dir(job_id), cand, record)
            except FileNotFoundError:
                self._drop_empty_claim(job_id)
                continue
            except (OSError, UnicodeError) as exc:  # one bad file never stops the scan or the other jobs
                self._drop_empty_claim(job_id)
                self._cannot_take(cand, fp, exc, now)
                continue
            self._accept(job_id, record, input_path, sha)

    def _drop_empty_claim(self, job_id: str | None) -> None:
        """A work folder whose claim never got its input (the move failed): removed, not left to pile up."""
        if job_id is None:
            return
        job_dir = self.home.job_dir(job_id)
        if job_dir.is_dir() and inbox_mod.claimed_input(job_dir) is None and job_id not in self.state.jobs:
            shutil.rmtree(job_dir, ignore_errors=True)

    def _cannot_take(self, cand: inbox_mod.Candidate, fp: str, exc: BaseException, now: float) -> None:
        """An inbox file that cannot be taken: an error report, and the scan goes on."""
        name = _shown(cand.path.name)
        if isinstance(exc, UnicodeError):
            code, why, movable = "bad_file_name", "its name is not valid UTF-8; rename it and drop it in again", True
        elif getattr(exc, "errno", None) == errno.EXDEV:
            code = "cross_device"
            why = "it cannot be moved into the work area (the inbox is on another file system); put the inbox on the same file system as the BatchGrader home"
            movable = False
        else:
            code, why, movable = "unreadable", f"it cannot be read or moved ({exc.__class__.__name__}: {exc})", True
        log.error("inbox file %s cannot be taken: %s", name, why)
        self._reject(inbox_mod.Rejection(cand.path, cand.profile, code, f"{name}: {why}", _shown(fp), movable=movable), now)

    def _new_job_id(self, sha: str) -> str:
        base = sha[:12]
        n, job_id = 1, base
        while job_id in self.state.jobs or self.home.job_dir(job_id).exists():
            n += 1
            job_id = f"{base}-{n}"
        return job_id

    def _accept(self, job_id: str, record: dict, input_path: Path, sha: str | None = None) -> None:
        sha = sha or file_sha256(input_path)
        self.emit(
            job_id,
            _e(
                "JobAccepted",
                file=record["file"],
                source=record["source"],
                profile=record["profile"],
                sha256=sha,
                bytes=input_path.stat().st_size,
                input_path=str(input_path),
                result_name=result_name(record["file"]),
                sandbox=self.sandbox,
            ),
        )

    def _reject(self, r: inbox_mod.Rejection, now: float) -> None:
        job_id = "x-" + hashlib.sha256(_shown(r.fingerprint).encode()).hexdigest()[:12]
        if job_id in self.state.jobs:
            return
        name = _shown(r.path.name)
        err_path = free_path(self.home.outbox, error_name(name), stamp(now))
        self.emit(
            job_id,
            _e(
                "FileRejected",
                file=name,
                path=_shown(str(r.path)),
                reason=_shown(r.reason),
                code=r.code,
                fingerprint=_shown(r.fingerprint),
            ),
        )
        hint = REJECTION_HINTS.get(r.code, "Define the profile in config.yaml, or move the file to a profile folder that exists.")
        self._write_error(job_id, name, err_path, _shown(r.reason), hint)
        if r.movable and r.path.exists():
            try:
                dest = move_no_clobber(r.path, self.home.failed, name, stamp(now))
            except OSError as exc:
                log.error("could not move %s to %s: %s", name, self.home.failed, exc)
                return
            self.emit(job_id, _e("InputArchived", path=str(dest)))

    def _write_error(self, job_id: str, file: str, path: Path, reason: str, hint: str) -> None:
        self.emit(job_id, _e("OutboxWriteStarted", path=None, error_path=str(path)))
        if not path.exists():
            atomic_write_bytes(path, error_report(file, job_id, reason, hint).encode("utf-8"), overwrite=False)
        self.emit(job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(path)))

    def _mark_recovered(self, job_dir: Path) -> None:
        """A work folder claimed but unknown to the log (a crash before JobAccepted, or a lost or
        restored database): batches of this job may exist at the provider already; search for
        them before the first create."""
        since = job_dir.stat().st_mtime - CLOCK_SKEW_SLACK
        self.emit(job_dir.name, _e("JobRecovered", since=since, reason="work folder with a claim but no JobAccepted"))

    def _adopt_recovered(self, job: JobState, now: float) -> None:
        """Before the first create of a recovered job: list the provider's batches since the
        claim, and adopt for each chunk the one created under its bg_key (same input size)."""
        assert self.provider is not None and job.recovered_since is not None
        mine: dict[int, list[Any]] = {}
        for b in self.provider.find_batches(metadata={"bg_job": job.job_id}, created_after=int(job.recovered_since)):
            if str(b.metadata.get("bg_chunk", "")).isdigit():
                mine.setdefault(int(b.metadata["bg_chunk"]), []).append(b)
        adopted: dict[str, str] = {}
        ignored: list[str] = []
        for index, found in sorted(mine.items()):
            c = job.chunks.get(index)
            usable = [b for b in found if b.status not in ("failed", "cancelled", "cancelling")]
            keep = self._matching_batch(job, c, usable) if c is not None and c.upload == "none" else None
            if keep is None:
                ignored += [b.id for b in found]
                continue
            self._adopt_batch(job, c, keep, now)  # type: ignore[arg-type]
            adopted[str(index)] = keep.id
            ignored += [b.id for b in found if b.id != keep.id]
        if ignored:
            log.warning("job %s: batches at the provider not adopted: %s", job.job_id, ", ".join(ignored))
        self.emit(job.job_id, _e("RecoveredBatchesAdopted", adopted=adopted, ignored=ignored))

    def _matching_batch(self, job: JobState, c: ChunkState, batches: list[Any]) -> Any:
        """The newest batch whose uploaded input is this chunk's (same upload name and size)."""
        assert self.provider is not None
        for b in sorted(batches, key=lambda b: b.created_at, reverse=True):
            attempt = str(b.metadata.get("bg_attempt", ""))
            if not attempt.isdigit():
                continue
            files = self.provider.find_files(upload_name(job.job_id, c.index, int(attempt)), c.bytes)
            if any(f.id == b.input_file_id for f in files):
                return b
        return None

    def _adopt_batch(self, job: JobState, c: ChunkState, b: Any, now: float) -> None:
        attempt = int(b.metadata["bg_attempt"])
        name = upload_name(job.job_id, c.index, attempt)
        jid = job.job_id
        self.emit(jid, _e("UploadStarted", chunk=c.index, attempt=attempt, filename=name, bytes=c.bytes))
        self.emit(jid, _e("FileUploaded", chunk=c.index, attempt=attempt, file_id=b.input_file_id, reconciled=True))
        self.emit(
            jid,
            _e("BatchCreateRequested", chunk=c.index, attempt=attempt, input_file_id=b.input_file_id, metadata=dict(b.metadata)),
        )
        self.emit(jid, _e("BatchCreated", chunk=c.index, attempt=attempt, batch_id=b.id, status="validating", reconciled=True))
        ev = _status_event(self.state.jobs[jid].chunks[c.index], b)
        if ev is not None:
            self.emit(jid, ev)
        self._next_poll[(jid, c.index)] = (now, FIRST_POLL_DELAY)

    def _report_corrupt(self, job: JobState) -> None:
        """A job whose log this code cannot read is set aside (never acted on); logged once."""
        if job.job_id not in self._corrupt_logged:
            self._corrupt_logged.add(job.job_id)
            log.error("job %s (%s) set aside as corrupt: %s", job.job_id, job.file, job.corrupt)

    # --- per job: ask decide, carry out -------------------------------------------------------
    def timers(self) -> Timers:
        return Timers(self._next_poll, self._not_before, self._cancel_sent)

    def advance(self, job: JobState, now: float) -> None:
        """Take one job as far as it goes in this tick: ask :func:`next_action`, carry it out,
        ask again with what was done."""
        step = Step()
        while True:
            action = next_action(self.state, job.job_id, self.config, now, self.timers(), step, self.queue_url)
            if action is None:
                return
            step = step.after(action)
            self.act(action, now)
            if action.ends_step:
                return

    def act(self, a: Action, now: float) -> None:
        """Carry out one action: intent event, call, outcome event."""
        job = self.state.jobs[a.job_id]
        if isinstance(a, RecoverEnded):
            self._finish_effects(job, now)
        elif isinstance(a, RestoreInput):
            if not Path(job.input_path).exists() and job.archived_path and Path(job.archived_path).exists():
                # reopened by `bgctl retry`: bring the input back into the work area
                os.rename(job.archived_path, job.input_path)
                self.emit(job.job_id, _e("InputRestored", path=job.input_path))
        elif isinstance(a, Prepare):
            self._prepare(job, now)
        elif isinstance(a, CancelBatch):
            self._cancel_batch(a, now)
        elif isinstance(a, Release):
            self.emit(job.job_id, _e("JobReleased", reason="budget allows it now", override=False))
        elif isinstance(a, Reconcile):
            c = job.chunks[a.chunk]
            if a.intent == "upload":
                self._reconcile_upload(job, c)
            else:
                self._reconcile_create(job, c, now)
        elif isinstance(a, Poll):
            self._poll(job, job.chunks[a.chunk], now)
        elif isinstance(a, CheckDuplicates):
            self._check_duplicates(job, job.chunks[a.chunk], now)
        elif isinstance(a, SearchRecovered):
            self._adopt_recovered(job, now)
        elif isinstance(a, FailBatch):
            if a.code == "request_too_large":
                self._delete_refused_file_of(job.chunks[a.chunk])  # a row alone over the queue limit
            self.emit(
                job.job_id,
                *self._learned_event(job.model or "", a.learned, a.chunk, a.message),
                _e("ChunkFailed", chunk=a.chunk, batch_id=a.batch_id, code=a.code, error=a.error, retryable=a.retryable),
            )
            if a.retryable:
                if a.retry_delay:
                    self._not_before[(job.job_id, a.chunk)] = now + a.retry_delay
            else:
                self._rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.error)
        elif isinstance(a, Replan):
            self._replan(job, job.chunks[a.chunk], a.limit, a.exact)
        elif isinstance(a, Download):
            self._download(job, job.chunks[a.chunk], a.kind, a.file_id, now)
        elif isinstance(a, Merge):
            self._merge(job, job.chunks[a.chunk], now)
        elif isinstance(a, FailUnstarted):
            self.emit(job.job_id, _e("ChunkFailed", chunk=a.chunk, batch_id=None, code=a.code, error=a.error, retryable=False))
            self._rows_failed_for_chunk(job, job.chunks[a.chunk], a.code, a.row_message)
        elif isinstance(a, Hold):
            self.emit(job.job_id, _e("JobHeld", code=a.code, reason=a.reason))
        elif isinstance(a, Upload):
            self._upload(job, job.chunks[a.chunk], a)
        elif isinstance(a, Create):
            self._create(job, job.chunks[a.chunk], now)
        elif isinstance(a, PlanRetries):
            self._plan_retries(job, list(a.custom_ids))
        elif isinstance(a, WriteResult):
            self._write_outbox(job, a, now)
        elif isinstance(a, Archive):
            src = Path(job.input_path)
            if src.exists():
                dest = move_no_clobber(src, self.home.failed if a.to_failed else self.home.archive, job.file, stamp(now))
                self.emit(job.job_id, _e("InputArchived", path=str(dest)))
        elif isinstance(a, DeleteProviderFiles):
            self._delete_provider_files(job, a.file_ids)
        elif isinstance(a, Finish):
            self.emit(job.job_id, _e(a.event, **a.payload))
            self._after_job_end(job.job_id, now)
        else:  # pragma: no cover - every action type is handled above
            raise TypeError(f"unknown action {a!r}")

    # --- prepare ------------------------------------------------------------------------------
    def _prepare(self, job: JobState, now: float) -> None:
        job_dir = self.home.job_dir(job.job_id)
        try:
            profile = self.profile_of(job)
        except ConfigError as exc:
            return self._fail(
                job,
                "unknown_profile",
                str(exc),
                "Define the profile in config.yaml, then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        try:
            self.prices.get(profile.model)  # fail fast: nothing is spent on an unpriced model
        except PricingError as exc:
            return self._fail(
                job,
                "missing_pricing",
                str(exc),
                "Add the model to pricing.csv in the home (or fix `model`), then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        requests_path = job_dir / "requests.jsonl"
        try:
            with open(requests_path, "wb") as f:
                prep = prepare(
                    Path(job.input_path),
                    profile,
                    self.home,
                    requests_out=cast(IO[bytes], _Heartbeat(f, self.on_progress)),
                    prices=self.prices,
                    file_hash=job.sha256,
                    limits=self._limits(profile),
                )
                f.flush()
                os.fsync(f.fileno())
        except InputError as exc:
            return self._fail(
                job,
                "bad_input",
                input_error_for_user(exc, job.file),
                "Fix the file and drop it in the inbox again.",
                "prepare",
                now,
            )
        except ConfigError as exc:
            return self._fail(
                job,
                "bad_config",
                str(exc),
                "Fix the configuration (bgctl config show), then `bgctl retry " + job.job_id + "`.",
                "prepare",
                now,
            )
        except UnicodeError as exc:
            return self._fail(
                job, "bad_input", f"{job.file}: {exc}", "Save the file as UTF-8 and drop it in the inbox again.", "prepare", now
            )
        sizes_path = job_dir / "tokens.bin"
        atomic_write(sizes_path, lambda f: _write_arrays(f, prep.tokens, prep.sizes))
        chunk_dir = job_dir / "chunks"
        paths = write_chunk_files(_lines(requests_path), prep.chunks, oversized_positions(prep), chunk_dir, job.job_id)
        summary = prep.summary(self.prices, learned_overhead(self.state, prep.model, profile.response_format))
        chunks = [
            {
                "index": c.index,
                "start": c.start,
                "end": c.end,
                "requests": c.requests,
                "input_tokens": c.input_tokens,
                "bytes": c.bytes,
                "path": str(p),
            }
            for c, p in zip(prep.chunks, paths)
        ]
        if not chunks and not prep.problems:
            return self._fail(
                job, "empty_input", f"{job.file}: no rows to grade", "Add data rows and drop the file in again.", "prepare", now
            )
        self.emit(
            job.job_id,
            _e(
                "JobPrepared",
                format=prep.fmt,
                model=prep.model,
                encoding=prep.tokenizer.encoding,
                rows=prep.rows,
                requests=prep.requests,
                input_tokens=prep.input_tokens,
                max_request_tokens=prep.max_request_tokens,
                chunks=chunks,
                row_errors=[p.as_dict() for p in prep.problems],
                estimate_usd=summary["estimated_cost_usd"],
                warnings=prep.warnings,
                requests_path=str(requests_path),
                settings=result_settings(profile),
            ),
        )

    def _limits(self, profile: Profile) -> Limits | None:
        """The split limits, tightened to the model's queue limit (configured or learned)."""
        cap = queue_limit(self.state, self.config, profile.model, self.queue_url)[0]
        if cap is None or (profile.split_token_limit is not None and cap >= profile.split_token_limit):
            return None
        price = self.prices.find(profile.model)
        limits = Limits.from_settings(profile, price.context_window if price else None)
        return dataclasses.replace(limits, token_limit=cap, token_limit_name="enqueued_token_limit")

    # --- the provider's queue limit -----------------------------------------------------------
    @property
    def queue_url(self) -> str:
        """Whose queue a learned limit belongs to: the provider's base URL ('sandbox' in sandbox mode)."""
        if self.sandbox:
            return "sandbox"
        return str(getattr(self.provider, "base_url", "") or self.settings.base_url or "").rstrip("/")

    def _learned_event(self, model: str, learned: queue.Learned | None, chunk: int, message: str | None) -> list[NewEvent]:
        if learned is None:
            return []
        log.warning(
            "queue limit for %s at %s: %s tokens (%s)",
            model,
            self.queue_url or "the provider",
            f"{learned.limit:,}",
            learned.source,
        )
        return [
            _e(
                "QueueLimitLearned",
                base_url=self.queue_url,
                model=model,
                limit=learned.limit,
                exact=learned.exact,
                source=learned.source,
                chunk=chunk,
                message=message,
            )
        ]

    def _delete_refused_file(self, c: ChunkState) -> None:
        """The input file of a batch refused for the queue limit is deleted before its rows are
        sent again (a new upload, or new chunks), so it is never left at the provider.  Deleting
        is idempotent: after a crash it is simply done again."""
        refused_batch = c.failure is not None and c.failure.get("retryable")
        refused_create = c.upload == "done" and c.create == "failed"  # refused at once: no batch uses the file
        if refused_batch or refused_create:
            self._delete_refused_file_of(c)

    def _delete_refused_file_of(self, c: ChunkState) -> None:
        if self.provider is None or not c.file_id:
            return
        try:
            self.provider.delete_file(c.file_id)
        except ProviderError as exc:
            log.info("could not delete refused batch file %s: %s", c.file_id, exc)

    def _replan(self, job: JobState, c: ChunkState, limit: int, exact: bool) -> None:
        """Split the rows of a chunk larger than the queue limit into chunks that fit.  A row
        that alone exceeds a stated limit fails (request_too_large); under an estimated one it
        is tried alone.  Retry counters do not move.  Chunk files first, then one append; a
        crash in between plans the same chunks again."""
        self._delete_refused_file(c)
        ids = set(chunk_custom_ids(c))
        lines: list[bytes] = []
        cids: list[str] = []
        tokens, sizes = array("Q"), array("Q")
        tok_all, size_all = _load_token_sizes(self.home.job_dir(job.job_id) / "tokens.bin")
        first, last = (c.start, c.end) if c.custom_ids is None else (0, None)
        for pos, line in enumerate(islice(_lines(Path(job.requests_path or "")), first, last), start=first):
            cid = json.loads(line)["custom_id"]
            if cid in ids:
                lines.append(line)
                cids.append(cid)
                tokens.append(tok_all[pos])
                sizes.append(size_all[pos])
        profile = self.profile_of(job)
        caps = Limits(
            token_limit=min(limit, profile.split_token_limit or limit),
            row_limit=profile.split_row_limit,
            max_requests=profile.max_requests_per_batch,
            max_bytes=profile.max_batch_bytes,
            token_limit_name="provider's enqueued-token limit",
        )
        chunks, over = plan_chunks(tokens, sizes, caps)
        base = max(job.chunks) + 1
        out_dir = self.home.job_dir(job.job_id) / "chunks"
        skip = {o.position for o in over}
        paths = write_chunk_files(iter(lines), chunks, skip, out_dir, f"{job.job_id}-replan{base:04d}")
        new = [
            {
                "index": base + i,
                "custom_ids": [cids[k] for k in range(ch.start, ch.end) if k not in skip],
                "requests": ch.requests,
                "input_tokens": ch.input_tokens,
                "bytes": ch.bytes,
                "path": str(p),
            }
            for i, (ch, p) in enumerate(zip(chunks, paths))
        ]
        if not exact and over:  # an estimated limit may be too low: each row over it goes alone
            singles = [
                Chunk(index=i, start=i, end=i + 1, requests=1, input_tokens=o.tokens, bytes=o.bytes) for i, o in enumerate(over)
            ]
            spaths = write_chunk_files(
                (lines[o.position] for o in over), singles, set(), out_dir, f"{job.job_id}-replan{base:04d}-alone"
            )
            for o, ch, p in zip(over, singles, spaths):
                new.append(
                    {
                        "index": base + len(new),
                        "custom_ids": [cids[o.position]],
                        "requests": 1,
                        "input_tokens": ch.input_tokens,
                        "bytes": ch.bytes,
                        "path": str(p),
                    }
                )
            over = []
        events = [
            _e(
                "ChunkReplanned",
                chunk=c.index,
                limit=limit,
                chunks=new,
                oversized=[{"custom_id": cids[o.position], "tokens": o.tokens} for o in over],
            )
        ]
        if over:
            rows = [
                {"custom_id": cids[o.position], "code": "request_too_large", "message": o.reason + " (it can never be accepted)"}
                for o in over
            ]
            events.append(_e("RowsFailed", chunk=c.index, batch_id=None, rows=rows))
        log.info(
            "job %s chunk %s: %s tokens over the queue limit %s; re-planned as %d chunks",
            job.job_id,
            c.index,
            f"{c.input_tokens:,}",
            f"{limit:,}",
            len(new),
        )
        self.emit(job.job_id, *events)

    # --- submit -------------------------------------------------------------------------------
    def _upload(self, job: JobState, c: ChunkState, a: Upload) -> None:
        assert self.provider is not None
        self._delete_refused_file(c)
        self.emit(job.job_id, _e("UploadStarted", chunk=c.index, attempt=a.attempt, filename=a.filename, bytes=c.bytes))
        self._do_upload(job, job.chunks[c.index])

    def _do_upload(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.filename
        try:
            info = self.provider.upload(Path(c.path), c.filename)
        except ProviderRejected as exc:
            self.emit(job.job_id, _e("UploadFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            self.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="upload_rejected", error=str(exc), retryable=False),
            )
            self._rows_failed_for_chunk(job, job.chunks[c.index], "upload_rejected", str(exc))
            return
        except OutcomeUnknown as exc:
            log.warning("job %s chunk %s: upload outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_upload(job, c)
            return
        self.emit(job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=info.id, reconciled=False))

    def _reconcile_upload(self, job: JobState, c: ChunkState) -> None:
        assert self.provider is not None and c.filename
        found = reconcile_upload(self.provider, c.filename, c.bytes)
        if found.file is not None:
            if found.duplicates:
                log.warning(
                    "job %s chunk %s: %d extra uploads of %s left at the provider",
                    job.job_id,
                    c.index,
                    len(found.duplicates),
                    c.filename,
                )
            self.emit(job.job_id, _e("FileUploaded", chunk=c.index, attempt=c.attempt, file_id=found.file.id, reconciled=True))
        else:
            self._do_upload(job, c)  # provably absent: uploading again is safe (files cost no tokens)

    def _metadata(self, job: JobState, c: ChunkState) -> dict[str, str]:
        return {
            "bg_job": job.job_id,
            "bg_chunk": str(c.index),
            "bg_attempt": str(c.attempt),
            "bg_key": f"{job.job_id}:{c.index}:{c.attempt}",
        }

    def _create(self, job: JobState, c: ChunkState, now: float) -> None:
        assert self.provider is not None and c.file_id
        self.emit(
            job.job_id,
            _e(
                "BatchCreateRequested", chunk=c.index, attempt=c.attempt, input_file_id=c.file_id, metadata=self._metadata(job, c)
            ),
        )
        self._requested_at[(job.job_id, c.index)] = now  # on this process's clock (the log's after a restart)
        self._do_create(job, job.chunks[c.index], now)

    def _do_create(self, job: JobState, c: ChunkState, now: float) -> None:
        assert self.provider is not None and c.file_id
        try:
            b = self.provider.create_batch(c.file_id, ENDPOINT, self.settings.completion_window, dict(c.metadata))
        except ProviderRejected as exc:
            self.emit(job.job_id, _e("BatchCreateFailed", chunk=c.index, attempt=c.attempt, error=str(exc), definite=True))
            if capacity_refusal(exc.status_code, str(exc)):
                learned = None
                if queue.is_token_limit_refusal(getattr(exc, "code", None), str(exc)):
                    learned = refusal_lesson(self.state, job, c, str(exc), self.queue_url)
                if learned is None:
                    self._not_before[(job.job_id, c.index)] = now + resubmit_delay(self.settings.poll_interval_seconds)
                else:  # some providers refuse at once: learn the limit from that too
                    self.emit(job.job_id, *self._learned_event(job.model or "", learned, c.index, str(exc)))
                return
            self.emit(
                job.job_id,
                _e("ChunkFailed", chunk=c.index, batch_id=None, code="create_rejected", error=str(exc), retryable=False),
            )
            self._rows_failed_for_chunk(job, job.chunks[c.index], "create_rejected", str(exc))
            return
        except OutcomeUnknown as exc:
            log.warning("job %s chunk %s: batch create outcome unknown (%s); reconciling", job.job_id, c.index, exc)
            self._reconcile_create(job, c, now)
            return
        self.emit(
            job.job_id, _e("BatchCreated", chunk=c.index, attempt=c.attempt, batch_id=b.id, status=b.status, reconciled=False)
        )
        self._next_poll[(job.job_id, c.index)] = (now + FIRST_POLL_DELAY, FIRST_POLL_DELAY)

    def _create_settle_seconds(self) -> float:
        return create_settle_seconds(self.config)

    def _listing_floor(self, requested_at: float) -> int:
        """``created_after`` for a reconciliation listing (provider clocks may differ from ours)."""
        return int(requested_at - self._create_settle_seconds() - CLOCK_SKEW_SLACK)

    def _reconcile_create(self, job: JobState, c: ChunkState, now: float) -> None:
        assert self.provider is not None and c.file_id
        key = (job.job_id, c.index)
        if self._next_listing.get(key, float("-inf")) > now:
            return
        requested_at = self._requested_at.get(key, min(epoch(c.requested_ts, now), now))
        found = reconcile_batch(
            self.provider,
            c.file_id,
            {"bg_key": c.metadata.get("bg_key", "")},
            created_after=self._listing_floor(requested_at),
        )
        keep = found.batch
        if keep is None and now < requested_at + self._create_settle_seconds():
            self._next_listing[key] = now + min(5.0, self._create_settle_seconds() / 4)
            return  # a late create may still land: the outcome stays unknown, look again later
        if keep is not None:
            for extra in found.duplicates:  # should never happen; never pay twice
                log.error("job %s chunk %s: duplicate batch %s found; cancelling it", job.job_id, c.index, extra.id)
                try:
                    self.provider.cancel(extra.id)
                except ProviderError as exc:
                    log.error("could not cancel duplicate batch %s: %s", extra.id, exc)
            self.emit(
                job.job_id,
                _e("BatchCreated", chunk=c.index, attempt=c.attempt, batch_id=keep.id, status="validating", reconciled=True),
            )
            # the adopted batch may have moved on (even finished) while we were down: record where it is
            ev = _status_event(self.state.jobs[job.job_id].chunks[c.index], keep)
            if ev is not None:
                self.emit(job.job_id, ev)
            self._next_poll[(job.job_id, c.index)] = (now, FIRST_POLL_DELAY)
        else:
            self.emit(
                job.job_id,
                _e(
                    "BatchCreateFailed",
                    chunk=c.index,
                    attempt=c.attempt,
                    error="not created (absent from the provider's batch list)",
                    definite=True,
                ),
            )
            # the file is uploaded: _submit creates again with it, under the same attempt's metadata

    def _check_duplicates(self, job: JobState, c: ChunkState, now: float) -> None:
        """After a create that followed a failed or absent one of the same attempt, look again by
        ``bg_key`` once the earlier request can no longer land, and cancel any extra batch (never
        pay twice).  Forced (whatever the time) before a terminal batch is collected."""
        assert self.provider is not None and c.file_id and c.batch_id and c.dup_check_due
        if c.status not in TERMINAL_BATCH and now < epoch(c.dup_check_due, now) + self._create_settle_seconds():
            return
        found = self.provider.find_batches(
            input_file_id=c.file_id,
            metadata={"bg_key": c.metadata.get("bg_key", "")},
            created_after=self._listing_floor(min(epoch(c.requested_ts, now), now)),
        )
        extras = [b for b in found if b.id != c.batch_id]
        cancelled = []
        for b in extras:
            log.error("job %s chunk %s: duplicate batch %s (late create); cancelling it", job.job_id, c.index, b.id)
            if b.is_terminal:
                continue
            try:
                self.provider.cancel(b.id)
                cancelled.append(b.id)
            except ProviderRejected as exc:
                log.error("could not cancel duplicate batch %s: %s", b.id, exc)
        self.emit(
            job.job_id,
            _e(
                "DuplicateBatchesChecked",
                chunk=c.index,
                attempt=c.attempt,
                batch_id=c.batch_id,
                extras=[b.id for b in extras],
                cancelled=cancelled,
            ),
        )

    def _cancel_batch(self, a: CancelBatch, now: float) -> None:
        assert self.provider is not None
        try:
            self.provider.cancel(a.batch_id)
        except ProviderRejected as exc:
            log.info("cancel %s: %s", a.batch_id, exc)  # already terminal: collected as usual
        self._cancel_sent.add(a.batch_id)
        self._next_poll[(a.job_id, a.chunk)] = (now, FIRST_POLL_DELAY)

    # --- poll and collect ---------------------------------------------------------------------
    def _list_round(self, now: float) -> None:
        """With several batches in flight, one paged ``batches.list`` per poll round replaces a
        ``retrieve`` per batch (when :func:`list_round_due`); every batch in flight is refreshed."""
        if self.provider is None or not list_round_due(self.state, self.timers(), now):
            return
        flying = [(j, c) for j in self.state.active_jobs() for c in j.chunks.values() if c.in_flight and c.batch_id]
        listed = list_statuses(self.provider, {c.batch_id for _, c in flying if c.batch_id})
        for j, c in flying:
            b = listed.get(c.batch_id or "")
            if b is not None:
                self._poll(j, c, now, b)

    def _poll(self, job: JobState, c: ChunkState, now: float, b: Any = None) -> None:
        assert self.provider is not None and c.batch_id
        key = (job.job_id, c.index)
        _due, delay = self._next_poll.get(key, (now, FIRST_POLL_DELAY))
        if b is None:
            b = self.provider.retrieve(c.batch_id)
        ev = _status_event(c, b)
        if ev is not None:
            self.emit(job.job_id, ev)
        delay = next_poll_delay(delay, ev is not None, b.status != c.status, self.settings.poll_interval_seconds)
        self._next_poll[key] = (now + delay, delay)

    def _download(self, job: JobState, c: ChunkState, kind: str, file_id: str, now: float) -> bool:
        """Download one result file: one intent per download (not per tick), a pause between
        failures, and after ``MAX_DOWNLOAD_ATTEMPTS`` failures or a definite refusal (404: the file
        expired or was deleted) an ``OutputDownloadFailed``: its rows then fail with the reason and
        the job can finish.  True when the file is settled (downloaded or given up)."""
        assert self.provider is not None
        key = (job.job_id, c.index, kind)
        tries, not_before = self._download_failures.get(key, (0, float("-inf")))
        if not_before > now:
            return False
        d = c.downloads.get(kind, {})
        if d.get("state") != "started" or d.get("file_id") != file_id:
            self.emit(job.job_id, _e("OutputDownloadStarted", chunk=c.index, batch_id=c.batch_id, file_id=file_id, kind=kind))
        dest = self.home.job_dir(job.job_id) / "downloads" / f"{c.batch_id}-{kind}.jsonl"
        try:
            n = self.provider.download(file_id, dest)
        except ProviderRejected as exc:  # definite (404: expired or deleted; 403 ...): never comes back
            self._download_failed(job, c, kind, file_id, f"the {kind} file cannot be downloaded: {exc}", tries + 1)
            return True
        except (ProviderError, OSError) as exc:
            tries += 1
            if tries >= MAX_DOWNLOAD_ATTEMPTS:
                msg = f"the {kind} file could not be downloaded after {tries} attempts: {exc}"
                self._download_failed(job, c, kind, file_id, msg, tries)
                return True
            log.warning("job %s chunk %s: download of %s failed (%s); trying again later", job.job_id, c.index, file_id, exc)
            self._download_failures[key] = (tries, now + min(60.0, 2.0**tries))
            return False
        self._download_failures.pop(key, None)
        self.emit(
            job.job_id,
            _e("OutputDownloaded", chunk=c.index, batch_id=c.batch_id, file_id=file_id, kind=kind, path=str(dest), bytes=n),
        )
        return True

    def _download_failed(self, job: JobState, c: ChunkState, kind: str, file_id: str, error: str, attempts: int) -> None:
        self._download_failures.pop((job.job_id, c.index, kind), None)
        log.error("job %s chunk %s: %s", job.job_id, c.index, error)
        self.emit(
            job.job_id,
            _e(
                "OutputDownloadFailed",
                chunk=c.index,
                batch_id=c.batch_id,
                file_id=file_id,
                kind=kind,
                error=error,
                attempts=attempts,
            ),
        )

    def _read_outcomes(self, job: JobState, c: ChunkState) -> tuple[list[Any], list[Any], list[str]]:
        """The rows' outcomes from the downloaded files; the malformed lines (skipped, never
        stopping the merge) and the kinds of file they were in."""
        outcomes: list[Any] = []
        malformed: list[Any] = []
        bad_kinds: list[str] = []
        for kind in ("output", "error"):
            d = c.downloads.get(kind)
            if d and d.get("path") and d.get("state") == "done":
                before = len(malformed)
                outcomes += iter_outcomes(Path(d["path"]), on_malformed="skip", malformed=malformed)
                if len(malformed) > before:
                    bad_kinds.append(kind)
        return outcomes, malformed, bad_kinds

    def _missing_reason(self, c: ChunkState, malformed: list[Any]) -> tuple[str, str] | None:
        """Code and message for a row the downloaded files do not answer (None: the usual ones)."""
        unavailable = [d.get("error") for d in c.downloads.values() if d.get("state") == "failed"]
        if unavailable:
            return "output_unavailable", "; ".join(str(u) for u in unavailable)
        if malformed:
            return (
                "malformed_result",
                f"the provider's result file had {len(malformed)} malformed line(s) after "
                f"{c.malformed_downloads + 1} downloads (first: {malformed[0]})",
            )
        return None

    def _merge(self, job: JobState, c: ChunkState, now: float) -> None:
        """Merge a finished batch's rows; its events go in one transaction.  A malformed file is
        downloaded again (at most MAX_MALFORMED_DOWNLOADS times); then its good lines are kept."""
        outcomes, malformed, bad_kinds = self._read_outcomes(job, c)
        if malformed and c.malformed_downloads < MAX_MALFORMED_DOWNLOADS:
            log.warning("job %s chunk %s: malformed result file (%s); downloading it again", job.job_id, c.index, malformed[0])
            self.emit(
                job.job_id,
                _e(
                    "OutputFileMalformed",
                    chunk=c.index,
                    batch_id=c.batch_id,
                    kinds=bad_kinds,
                    lines=len(malformed),
                    problem=str(malformed[0]),
                ),
            )
            return
        merged = merge_chunk(chunk_custom_ids(c), outcomes, c.status, self._missing_reason(c, malformed))
        results_path = self.home.job_dir(job.job_id) / "results" / f"chunk-{c.index:04d}.jsonl"
        atomic_write_bytes(results_path, b"".join((json.dumps(r, ensure_ascii=False) + "\n").encode() for r in merged.records))
        try:
            cost = merged.cost(self.prices.get(job.model or ""))
        except PricingError:
            cost = 0.0
        events = [
            _e(
                "TokensUsed",
                chunk=c.index,
                batch_id=c.batch_id,
                model=job.model,
                cost_usd=float(cost),
                day=utc_day(now),
                **merged.usage,
            )
        ]
        learned = overhead_payload(job, c, merged.records, self.profile_of(job).response_format)
        if learned is not None:
            events.append(_e("SchemaOverheadLearned", **learned))
        if merged.failed_rows:
            events.append(_e("RowsFailed", chunk=c.index, batch_id=c.batch_id, rows=merged.failed_rows))
        events.append(
            _e(
                "ChunkCompleted",
                chunk=c.index,
                batch_id=c.batch_id,
                status=c.status,
                succeeded=merged.succeeded,
                failed=len(merged.failed_rows),
                results_path=str(results_path),
            )
        )
        if c.status == "completed":
            probe = probe_after_completion(self.state, job, self.queue_url)
            events += self._learned_event(job.model or "", probe, c.index, None)
        self.emit(job.job_id, *events)

    def _rows_failed_for_chunk(self, job: JobState, c: ChunkState, code: str, message: str) -> None:
        rows = [{"custom_id": cid, "code": code, "message": message} for cid in chunk_custom_ids(c)]
        if rows:
            self.emit(job.job_id, _e("RowsFailed", chunk=c.index, batch_id=c.batch_id, rows=rows))

    # --- retrying -------------------------------------------------------------------------------
    def _plan_retries(self, job: JobState, ids: list[str]) -> None:
        """Write the retry chunks of the rows ``ids`` and record them."""
        profile = self.profile_of(job)
        wanted = set(ids)
        lines: list[bytes] = []
        tokens = array("Q")
        sizes = array("Q")
        tok_all, size_all = _load_token_sizes(self.home.job_dir(job.job_id) / "tokens.bin")
        for pos, line in enumerate(_lines(Path(job.requests_path or ""))):
            cid = json.loads(line)["custom_id"]
            if cid in wanted:
                lines.append(line)
                tokens.append(tok_all[pos])
                sizes.append(size_all[pos])
        chunks, _over = plan_chunks(
            tokens,
            sizes,
            Limits(
                token_limit=token_cap(self.state, self.config, profile, job.model or profile.model, self.queue_url),
                row_limit=profile.split_row_limit,
                max_requests=profile.max_requests_per_batch,
                max_bytes=profile.max_batch_bytes,
            ),
        )
        base = max(job.chunks) + 1
        out_dir = self.home.job_dir(job.job_id) / "chunks"
        paths = write_chunk_files(iter(lines), chunks, set(), out_dir, f"{job.job_id}-retry{base:04d}")
        events = []
        for i, (ch, p) in enumerate(zip(chunks, paths)):
            cids = [json.loads(lines[k])["custom_id"] for k in range(ch.start, ch.end)]
            events.append(
                _e(
                    "RetryPlanned",
                    chunk=base + i,
                    source_chunks=sorted(
                        {job.failed_rows[x]["chunk"] for x in cids if job.failed_rows[x].get("chunk") is not None}
                    ),
                    custom_ids=cids,
                    requests=ch.requests,
                    input_tokens=ch.input_tokens,
                    bytes=ch.bytes,
                    path=str(p),
                    manual=job.retry_requested,
                )
            )
        self.emit(job.job_id, *events)

    # --- finish ---------------------------------------------------------------------------------
    def _write_outbox(self, job: JobState, a: WriteResult, now: float) -> None:
        """Name the result (and error report) in an intent event, write them, record them."""
        taken = job.outbox == "started" and bool(job.result_path) and self._outbox_owner(job.result_path or "", job.job_id)
        if taken:  # never accept another job's file as ours: record a new name
            log.error("job %s: %s belongs to another job; choosing another name", job.job_id, job.result_path)
        if job.outbox == "none" or taken:
            path = self._reserve_outbox_path(job.result_name, job.job_id, now)
            err = self._reserve_outbox_path(error_name(job.file), job.job_id, now) if a.failed else None
            self.emit(job.job_id, _e("OutboxWriteStarted", path=str(path), error_path=str(err) if err else None))
        job = self.state.jobs[job.job_id]
        if job.outbox != "started":
            return
        path = Path(job.result_path or "")
        written = self._write_result(job, self.profile_of(job), path) if not path.exists() else job.rows
        if job.error_path and not Path(job.error_path).exists():
            atomic_write_bytes(
                Path(job.error_path),
                error_report(
                    job.file,
                    job.job_id,
                    a.error,
                    a.hint,
                    f"Partial results: {path.name} ({job.succeeded_rows} rows answered).",
                ).encode(),
                overwrite=False,
            )
        self.emit(
            job.job_id,
            _e(
                "ResultWritten",
                path=str(path),
                rows=written,
                succeeded=job.succeeded_rows,
                failed=len(job.failed_rows) + len(job.row_errors),
                error_path=job.error_path,
            ),
        )

    def _outbox_owner(self, path: str, job_id: str) -> str | None:
        """Another job that recorded ``path`` as its result or error file, if any."""
        for j in self.state.jobs.values():
            if j.job_id != job_id and path in (j.result_path, j.error_path):
                return j.job_id
        return None

    def _reserve_outbox_path(self, name: str, job_id: str, now: float) -> Path:
        """A free outbox path that no other job has recorded either (a job that recorded a path
        and crashed before writing it still owns it: two inputs with the same name never swap)."""
        path = free_path(self.home.outbox, name, stamp(now))
        if self._outbox_owner(str(path), job_id) is None:
            return path
        own = f"{Path(name).stem}_{job_id[:12]}{Path(name).suffix}"  # a name only this job uses
        return free_path(self.home.outbox, own, stamp(now))

    def _delete_provider_files(self, job: JobState, ids: tuple[str, ...]) -> None:
        if self.provider is None:
            return
        deleted = []
        for fid in ids:
            try:
                self.provider.delete_file(fid)
                deleted.append(fid)
            except ProviderError as exc:
                log.info("could not delete provider file %s: %s", fid, exc)
        self.emit(job.job_id, _e("ProviderFilesDeleted", file_ids=deleted))

    def _write_result(self, job: JobState, profile: Profile, path: Path) -> int:
        """Stream the input and join each row to its result (ResultsJoin: O(chunks) memory)."""
        paths = [
            c.results_path
            for c in sorted(job.chunks.values(), key=lambda c: c.index)
            if c.results_path and Path(c.results_path).exists()
        ]
        row_errors = job.row_errors
        failed_info = job.failed_rows
        fixed = {**result_settings(profile), **job.settings}  # as prepared, even if the config changed since
        id_column = fixed["id_column"]
        count = 0

        def write(f) -> None:
            nonlocal count
            with (
                open_table(Path(job.input_path), sheet=fixed.get("sheet"), encoding=fixed.get("encoding", "utf-8")) as reader,
                ResultsJoin(paths) as results,
            ):
                cols = added_columns(reader.columns, fixed["output_column"], fixed["response_format"])
                json_values = reader.fmt != "csv"
                guard = fixed["csv_formula_guard"] and reader.fmt in ("csv", "xlsx")
                types = added_column_types(cols, fixed["response_format"])
                with TableWriter(f, reader, cols.names(), column_types=types) as w:
                    for row in reader:
                        cid = text_of(row.values[id_column]) if id_column else default_custom_id(job.sha256, row.number)
                        outcome = results.take(cid)
                        err = None
                        if cid in row_errors:
                            err = f"{row_errors[cid].get('code')}: {row_errors[cid].get('message')}"
                        elif cid in failed_info and outcome is None:
                            err = f"{failed_info[cid].get('code')}: {failed_info[cid].get('message')}"
                        vals = dict(row.values)
                        added = result_values(cols, outcome, err, json_values)
                        if guard:  # the model's output is attacker-influenced; input cells stay unchanged
                            added = {k: defuse_formula(v) if isinstance(v, str) else v for k, v in added.items()}
                        vals.update(added)
                        w.write(vals)
                        count += 1

        atomic_write(path, write, overwrite=False)
        return count

    def _finish_effects(self, job: JobState, now: float) -> None:
        """Effects of an ended job that a crash may have interrupted."""
        if job.outbox == "started" and job.error_path:
            p = Path(job.error_path)
            if not p.exists():
                err = job.error or {}
                atomic_write_bytes(
                    p, error_report(job.file, job.job_id, err.get("error") or "", err.get("hint") or "").encode(), overwrite=False
                )
            self.emit(job.job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(p)))
        self._redo_final_effects(self.state.jobs[job.job_id], now)

    def _fail(self, job: JobState, code: str, error: str, hint: str, stage: str, now: float) -> None:
        """The error report and the move to failed/ first, the final event last (a crash between
        them leaves a job that is not ended, and is failed again on restart)."""
        if job.outbox == "none":
            err_path = free_path(self.home.outbox, error_name(job.file), stamp(now))
            self._write_error(job.job_id, job.file, err_path, error, hint)
        src = Path(job.input_path)
        if src.exists() and not self.state.jobs[job.job_id].archived_path:
            dest = move_no_clobber(src, self.home.failed, job.file, stamp(now))
            self.emit(job.job_id, _e("InputArchived", path=str(dest)))
        self.emit(job.job_id, _e("JobFailed", code=code, error=error, stage=stage, hint=hint))
        self._after_job_end(job.job_id, now)

    def _after_job_end(self, job_id: str, now: float) -> None:
        """Effects of a job's end that never change the job: the HTML report (``write_report``)
        and the ``on_job_end`` command (recorded first, so it runs at most once per end)."""
        job = self.state.jobs[job_id]
        try:
            write_report = bool(self.profile_of(job).get("write_report"))
        except ConfigError:
            write_report = False
        if write_report and job.result_path:
            try:
                from batchgrader.store.report import build_report
                from batchgrader.store.report_html import render_html

                page = render_html(build_report(list(self.store.read(job_id=job_id))))
                dest = free_path(self.home.outbox, jobhook.report_name(job.file), stamp(now))
                atomic_write_bytes(dest, page.encode("utf-8"), overwrite=False)
            except Exception as exc:  # a report is a convenience: never let it stop the daemon
                log.warning("could not write the HTML report of job %s: %s", job_id, exc)
        command = self.settings.get("on_job_end")
        if command and job.end_hook_seq != job.version:
            timeout = float(self.settings.get("on_job_end_timeout_seconds") or 60.0)
            self.emit(job_id, _e("JobEndHookStarted", end_seq=job.version, timeout_seconds=timeout))
            jobhook.start_hook(command, jobhook.hook_env(self.state.jobs[job_id]), timeout)

    def _redo_final_effects(self, job: JobState, now: float) -> None:
        """On restart, redo every effect a final event implies that is missing: the error report
        of a failed (or rejected) job, and the move of its input out of work/ (or the inbox).
        Checked once per job per process."""
        if job.job_id in self._effects_checked:
            return
        self._effects_checked.add(job.job_id)
        if job.ended == "failed" and job.outbox == "none":
            err = job.error or {}
            path = free_path(self.home.outbox, error_name(job.file), stamp(now))
            self._write_error(job.job_id, job.file, path, err.get("error") or job.last_error or "", err.get("hint") or "")
        job = self.state.jobs[job.job_id]
        if job.archived_path:
            return
        if job.rejected:
            code = (job.error or {}).get("code")
            src = Path(job.source) if job.source and code not in UNMOVABLE_REJECTIONS else None
        else:
            src = Path(job.input_path) if job.input_path else None
        if src is not None and src.is_file() and not src.is_symlink():
            folder = self.home.failed if job.ended == "failed" else self.home.archive
            dest = move_no_clobber(src, folder, job.file or src.name, stamp(now))
            self.emit(job.job_id, _e("InputArchived", path=str(dest)))


# --- helpers ----------------------------------------------------------------------------------------


class _Heartbeat:
    """A file wrapper for prepare's output: each block written is a sign of life (the systemd
    watchdog heartbeat comes from the working thread, so a long prepare is not killed)."""

    def __init__(self, f: IO[bytes], beat: Callable[[], None]):
        self._f, self._beat = f, beat

    def write(self, data: bytes) -> int:
        self._beat()
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _shown(text: str) -> str:
    """Text as it can be recorded and shown: bytes of a file name that are not UTF-8 become U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _status_event(c: ChunkState, b: Any) -> NewEvent | None:
    """A BatchStatusChanged for what the provider says of ``c``'s batch, or None if nothing changed."""
    counts = dataclasses.asdict(b.request_counts)
    if (b.status, counts, b.output_file_id, b.error_file_id) == (c.status, c.request_counts, c.output_file_id, c.error_file_id):
        return None
    return _e(
        "BatchStatusChanged",
        chunk=c.index,
        batch_id=b.id,
        status=b.status,
        request_counts=counts,
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        errors=[dataclasses.asdict(x) for x in b.errors],
    )


def _short(payload: dict[str, Any]) -> str:
    s = json.dumps(
        {k: v for k, v in payload.items() if k not in ("rows", "custom_ids", "chunks", "row_errors")},
        ensure_ascii=False,
        default=str,
    )
    return s if len(s) < 300 else s[:297] + "..."


def _write_arrays(f: Any, *arrays: array) -> None:
    for a in arrays:
        a.tofile(f)


def _lines(path: Path) -> Iterable[bytes]:
    with open(path, "rb") as f:
        yield from f


def _load_token_sizes(path: Path) -> tuple[array, array]:
    data = array("Q")
    with open(path, "rb") as f:
        data.frombytes(f.read())
    half = len(data) // 2
    return data[:half], data[half:]


def chunk_custom_ids(c: ChunkState) -> list[str]:
    if c.custom_ids is not None:
        return list(c.custom_ids)
    return [json.loads(line)["custom_id"] for line in _lines(Path(c.path))]


def result_settings(profile: Profile) -> dict[str, Any]:
    """The settings that shape the result file, fixed when the job is prepared."""
    return {
        "output_column": profile.output_column,
        "response_format": profile.response_format,
        "id_column": profile.id_column,
        "csv_formula_guard": profile.csv_formula_guard,
        "sheet": profile.get("sheet"),
        "encoding": profile.get("encoding", "utf-8"),
    }
