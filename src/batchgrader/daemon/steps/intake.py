"""The intake step: take stable inbox files, accept or reject them, adopt inputs and batches
recovered after a crash, and set corrupt jobs aside.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import ConfigError, Profile
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import ChunkState, JobState
from batchgrader.core.rules.actions import SearchRecovered
from batchgrader.core.rules.decide import FIRST_POLL_DELAY, upload_name
from batchgrader.core.rules.due import InboxTimes
from batchgrader.core.rules.outcomes import batch_status_event
from batchgrader.daemon.context import CLOCK_SKEW_SLACK, Context
from batchgrader.fsio import free_path, move_no_clobber, shown_name, stamp
from batchgrader.pipeline import inbox as inbox_mod
from batchgrader.pipeline.outbox import error_name, result_name
from batchgrader.pipeline.prepare import file_sha256
from batchgrader.pipeline.tokens import build_ahead, tokenizer_for_model

log = logging.getLogger("batchgrader.engine")

REJECTION_HINTS = {
    "not_regular_file": "Copy the real file (not a link or special file) into the inbox.",
    "unsupported_format": "Save the data as .csv, .json or .jsonl and drop it in the inbox again.",
    "bad_file_name": "Rename the file (UTF-8 letters only) and drop it in the inbox again.",
    "cross_device": "Keep the inbox on the same file system as the BatchGrader home (or copy files in with `bgctl submit`).",
    "unreadable": "Make the file readable by the daemon's user and drop it in the inbox again.",
}


def _shown(text: str) -> str:
    """Text as it can be recorded and shown: bytes of a file name that are not UTF-8 become U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class IntakeStep:
    """The inbox and recovery step, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.scanner: inbox_mod.InboxScanner | None = None
        self.hashes = inbox_mod.HashAhead(file_sha256)  # files hashed while they become stable
        self.scan_requested = True  # set by the daemon when the watcher saw a change
        self._last_scan = float("-inf")
        self._corrupt_logged: set[str] = set()

    def reload(self) -> None:
        """The config was reloaded: the scanner follows its profiles and stable time, and scans at once."""
        if self.scanner is not None:
            self.scanner.profiles = set(self.ctx.config.profiles)
            self.scanner.stable_seconds = self.ctx.config.default.stable_seconds
        self.scan_requested = True

    def pending(self) -> bool:
        """Files seen in the inbox but not yet taken (waiting to be stable)."""
        return self.scanner is not None and self.scanner.pending()

    def due(self) -> float | None:
        """When a file seen in the inbox can next be found stable and taken (None: none waits)."""
        return self.scanner.due() if self.scanner is not None else None

    def times(self) -> InboxTimes:
        """The inbox's waits (wall clock), for :func:`batchgrader.core.rules.due.next_due`."""
        return InboxTimes(self.scan_requested, self.due(), self._last_scan)

    def intake(self, now: float) -> None:
        """Scan the inbox when woken by the watcher, while a file waits to become stable, and
        every rescan_interval_seconds regardless (file events can be lost)."""
        first = self.scanner is None
        if self.scanner is None:
            self.scanner = inbox_mod.InboxScanner(self.ctx.home, set(self.ctx.config.profiles), self.ctx.settings.stable_seconds)
        due = now - self._last_scan >= self.ctx.settings.rescan_interval_seconds
        if not (self.scan_requested or self.scanner.pending() or due):
            return
        self.scan_requested = False
        self._last_scan = now
        ready, rejected = self.scanner.scan(now)
        self.hashes.start({**self.scanner.waiting(), **{c.path: (c.size, c.mtime_ns) for c in ready}})
        self._build_ahead({*self.scanner.waiting_profiles(), *(c.profile for c in ready)})
        if first:
            self._ready_idle()
        for r in rejected:
            if r.fingerprint in self.ctx.state.rejected:
                continue
            self._reject(r, now)
        for cand in ready:
            self.scanner.forget(cand.path)
            try:
                fp = inbox_mod.fingerprint(cand.path, os.lstat(cand.path))
            except FileNotFoundError:
                continue
            if _shown(fp) in self.ctx.state.rejected:
                continue  # reported already (it could not be taken)
            job_id = None
            try:
                cand.path.name.encode("utf-8")  # a name that is not UTF-8 cannot be recorded as it is
                sha = self.hashes.take(cand.path, cand.size, cand.mtime_ns) or file_sha256(cand.path)
                job_id = self._claim(fp, sha)
                if job_id is None:
                    continue  # another daemon on the shared store took it
                record: dict[str, Any] = {
                    "file": cand.path.name,
                    "source": str(cand.path),
                    "profile": cand.profile,
                    "sandbox": self.ctx.sandbox,  # the claim's mode: a recovered claim keeps it
                }
                if inbox_mod.fresh_marker(cand.path).exists():
                    record["fresh"] = True  # bgctl submit --fresh: kept in the claim record
                input_path = inbox_mod.claim(self.ctx.home.job_dir(job_id), cand, record)
            except FileNotFoundError:
                self._drop_empty_claim(job_id)
                continue
            except (OSError, UnicodeError) as exc:  # one bad file never stops the scan or the other jobs
                self._drop_empty_claim(job_id)
                self._cannot_take(cand, fp, exc, now)
                continue
            self.accept(job_id, record, input_path, sha)

    def _build_ahead(self, profiles: set[str]) -> None:
        """Ready what the jobs of files seen in the inbox will first need, in the background, while
        the files become stable and are hashed and claimed: their providers (SDKs imported,
        clients made; the preflight's first row calls it at once), then their tokenizers (the
        rank file read, while the preflight's rows are sent; prepare counts with it).  Only while no row can be answered from the
        answers store (it is empty, or the profile keeps none): a job the store may answer whole
        builds its provider at its first row to send, or never."""
        todo: dict[str, Profile] = {}
        for name in sorted(profiles):
            try:
                profile = self.ctx.config.profile(name)
            except ConfigError:
                continue  # the file is rejected for its profile
            if not self.ctx.providers.is_built(profile.provider):
                todo[name] = profile
        if not todo:
            return
        stored = any(p.cache_days > 0 for p in todo.values()) and not self.ctx.store.answers.empty()
        for profile in todo.values():
            if profile.cache_days > 0 and stored:
                continue
            provider = self.ctx.providers.prefetch(profile.provider)
            if model := profile.get("azure_model") or profile.model:  # after the provider, which the preflight needs first
                build_ahead(tokenizer_for_model(model, profile.default_encoding).encoding, after=provider)

    def _ready_idle(self) -> None:
        """At the daemon's first scan, what a file dropped into the inbox itself (the default
        profile) will first need is readied in the background, while the daemon waits for files:
        the tokenizer's rank file (prepare counts with it), then the provider (its SDK imported, its
        client made; the preflight's first row calls it), so the first file after a start waits for
        neither (issue 38).  The provider under the rule of a file seen (:meth:`_build_ahead`: not
        while the answers store may answer the file), and neither in the sandbox, whose provider is
        an emulator started for the first file that needs it.  A file already waiting at the first
        scan had its own readied first, provider first (nothing is built twice)."""
        if self.ctx.sandbox:
            return
        try:
            profile = self.ctx.config.profile(None)
        except ConfigError:
            return
        tokenizer = None
        if model := profile.get("azure_model") or profile.model:
            tokenizer = build_ahead(tokenizer_for_model(model, profile.default_encoding).encoding)
        if self.ctx.providers.is_built(profile.provider):
            return
        if profile.cache_days > 0 and not self.ctx.store.answers.empty():
            return  # a file the store answers whole never builds it
        self.ctx.providers.prefetch(profile.provider, after=tokenizer)

    def _drop_empty_claim(self, job_id: str | None) -> None:
        """A work folder whose claim never got its input (the move failed): removed, not left to pile up."""
        if job_id is None:
            return
        job_dir = self.ctx.home.job_dir(job_id)
        if job_dir.is_dir() and inbox_mod.claimed_input(job_dir) is None and job_id not in self.ctx.state.jobs:
            shutil.rmtree(job_dir, ignore_errors=True)

    def _cannot_take(self, cand: inbox_mod.Candidate, fp: str, exc: BaseException, now: float) -> None:
        """An inbox file that cannot be taken: an error report, and the scan goes on."""
        name = shown_name(_shown(cand.path.name))
        if isinstance(exc, UnicodeError):
            code, why, movable = "bad_file_name", "its name is not valid UTF-8; rename it and drop it in again", True
        elif getattr(exc, "errno", None) == errno.EXDEV:
            code = "cross_device"
            why = "it cannot be moved into the work area (the inbox is on another file system); put the inbox on the same file system as the BatchGrader home"
            movable = False
        else:
            code, why, movable = (
                "unreadable",
                f"it cannot be read or moved ({exc.__class__.__name__}: {shown_name(str(exc))})",
                True,
            )
        log.error("inbox file %s cannot be taken: %s", name, why)
        self._reject(inbox_mod.Rejection(cand.path, cand.profile, code, f"{name}: {why}", _shown(fp), movable=movable), now)

    def _job_ids(self, sha: str) -> Iterator[str]:
        """The ids a new job of this content may take, first free first: ``abc``, ``abc-2``, ..."""
        base = sha[:12]
        n, job_id = 1, base
        while True:
            if job_id not in self.ctx.state.jobs and not self.ctx.home.job_dir(job_id).exists():
                yield job_id
            n += 1
            job_id = f"{base}-{n}"

    def _claim(self, fp: str, sha: str) -> str | None:
        """The new job's id; on a shared store claimed in the database (None: another daemon
        took the input, :meth:`~batchgrader.daemon.shared.SharedWork.claim`)."""
        if self.ctx.shared is not None:
            return self.ctx.shared.claim(_shown(fp), self._job_ids(sha))  # type: ignore[no-any-return]
        return next(self._job_ids(sha))

    def accept(self, job_id: str, record: dict, input_path: Path, sha: str | None = None) -> None:
        sha = sha or file_sha256(input_path)
        fresh = [_e("FreshAnswersRequested", reason="bgctl submit --fresh")] if record.get("fresh") else []
        sandbox = bool(record.get("sandbox", self.ctx.sandbox))  # a claim before the mode was recorded: this daemon's
        try:  # who answers the job, fixed from now on
            answered_by = self.ctx.accepted_as(self.ctx.config.profile(record["profile"]), sandbox)
        except ConfigError:  # a recovered claim whose profile is gone: it fails in prepare, naming it
            answered_by = {"sandbox": sandbox}
        self.ctx.emit(
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
                **answered_by,
            ),
            *fresh,
        )
        if fresh:
            inbox_mod.fresh_marker(Path(record["source"])).unlink(missing_ok=True)

    def _reject(self, r: inbox_mod.Rejection, now: float) -> None:
        job_id = "x-" + hashlib.sha256(_shown(r.fingerprint).encode()).hexdigest()[:12]
        if job_id in self.ctx.state.jobs:
            return
        if self.ctx.shared is not None and self.ctx.shared.claim(_shown(r.fingerprint), [job_id]) is None:
            return  # another daemon on the shared store reports it
        name = _shown(r.path.name)
        err_path = free_path(self.ctx.home.outbox, error_name(name), stamp(now))
        self.ctx.emit(
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
        self.ctx.outbox.write_error_report(job_id, name, err_path, _shown(r.reason), hint)
        if r.movable and r.path.exists():
            try:
                dest = move_no_clobber(r.path, self.ctx.home.failed, name, stamp(now))
            except OSError as exc:
                log.error("could not move %s to %s: %s", name, self.ctx.home.failed, exc)
                return
            self.ctx.emit(job_id, _e("InputArchived", path=str(dest)))

    def mark_recovered(self, job_dir: Path) -> None:
        """A work folder claimed but unknown to the log (a crash before JobAccepted, or a lost or
        restored database): batches of this job may exist at the provider already; search for
        them before the first create."""
        since = job_dir.stat().st_mtime - CLOCK_SKEW_SLACK
        self.ctx.emit(job_dir.name, _e("JobRecovered", since=since, reason="work folder with a claim but no JobAccepted"))

    def adopt_recovered(self, a: SearchRecovered, job: JobState, now: float) -> None:
        """Before the first create of a recovered job: list the provider's batches since the
        claim, and adopt for each chunk the one created under its bg_key (same input size); the
        adopted batches are polled then."""
        assert job.recovered_since is not None
        now = self.ctx.mono
        mine: dict[int, list[Any]] = {}
        for b in self.ctx.provider_for(job).find_batches(metadata={"bg_job": job.job_id}, created_after=int(job.recovered_since)):
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
        self.ctx.emit(job.job_id, _e("RecoveredBatchesAdopted", adopted=adopted, ignored=ignored))

    def _matching_batch(self, job: JobState, c: ChunkState, batches: list[Any]) -> Any:
        """The newest batch whose uploaded input is this chunk's (same upload name and size)."""
        provider = self.ctx.provider_for(job)
        for b in sorted(batches, key=lambda b: b.created_at, reverse=True):
            attempt = str(b.metadata.get("bg_attempt", ""))
            if not attempt.isdigit():
                continue
            files = provider.find_files(upload_name(job.job_id, c.index, int(attempt)), c.bytes)
            if any(f.id == b.input_file_id for f in files):
                return b
        return None

    def _adopt_batch(self, job: JobState, c: ChunkState, b: Any, now: float) -> None:
        attempt = int(b.metadata["bg_attempt"])
        name = upload_name(job.job_id, c.index, attempt)
        jid = job.job_id
        self.ctx.emit(jid, _e("UploadStarted", chunk=c.index, attempt=attempt, filename=name, bytes=c.bytes))
        self.ctx.emit(jid, _e("FileUploaded", chunk=c.index, attempt=attempt, file_id=b.input_file_id, reconciled=True))
        self.ctx.emit(
            jid,
            _e("BatchCreateRequested", chunk=c.index, attempt=attempt, input_file_id=b.input_file_id, metadata=dict(b.metadata)),
        )
        self.ctx.emit(
            jid, _e("BatchCreated", chunk=c.index, attempt=attempt, batch_id=b.id, status="validating", reconciled=True)
        )
        ev = batch_status_event(self.ctx.state.jobs[jid].chunks[c.index], b)
        if ev is not None:
            self.ctx.emit(jid, ev)
        self.ctx.schedule.next_poll[(jid, c.index)] = (now, FIRST_POLL_DELAY)

    def report_corrupt(self, job: JobState) -> None:
        """A job whose log this code cannot read is set aside (never acted on); logged once."""
        if job.job_id not in self._corrupt_logged:
            self._corrupt_logged.add(job.job_id)
            log.error("job %s (%s) set aside as corrupt: %s", job.job_id, job.file, job.corrupt)
