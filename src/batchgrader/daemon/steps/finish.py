"""The steps that finish a job.

:class:`FinishStep`: write the result (and error report) into the outbox, archive the input (or
bring it back for ``bgctl retry``), delete provider files, record the job's end and run what
follows it, and redo final effects after a crash.  When a job ends is decided by the rules
(core/rules/ending.py), never here.

:class:`ReuseStep`: the answers a merged chunk adds to the answers store (``StoreAnswers``),
after the job's result is written.  Which rows reuse answers is decided when the job is prepared
(:mod:`batchgrader.pipeline.job_reuse`, read by the prepare step).

What follows a job's end and never changes the job: the ``on_job_end`` command
(:func:`start_hook`).  It runs in a thread of its own (the engine does not wait for it), through
the shell, with the job's figures in ``BG_*`` environment variables and without any API key: every
variable the config reads a key from (:func:`~batchgrader.core.configuration.config.secret_env_names`,
also when ``secrets.env`` set it) and every variable holding a key's value is left out.  Its
output and exit status go to the daemon log; after ``timeout`` seconds its whole process group is
killed.  Nothing it does is reported back to the engine: a failing command never affects the job.
The engine records ``JobEndHookStarted`` before starting it, so it runs at most once per end of a
job, also across crashes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import SECRET_KEYS, ConfigError, Profile, secret_env_names
from batchgrader.core.log.events import new_event as _e
from batchgrader.core.log.state import JobState
from batchgrader.core.rules.actions import (
    OUTBOX_TIMER,
    Archive,
    DeleteProviderFiles,
    Finish,
    RecoverEnded,
    RestoreInput,
    StoreAnswers,
    WriteErrorReport,
    WriteResult,
)
from batchgrader.core.rules.outcomes import outbox_retry_at
from batchgrader.daemon.context import Context
from batchgrader.fsio import TMP_PREFIX, atomic_write, atomic_write_bytes, move_no_clobber, stamp
from batchgrader.pipeline.formats.registry import format_spec
from batchgrader.pipeline.job_reuse import answers_to_store
from batchgrader.pipeline.outbox import (
    added_column_types,
    added_columns,
    error_name,
    error_report,
    outbox_error,
    report_name,
    result_settings,
    result_values,
)
from batchgrader.pipeline.requests import default_custom_id
from batchgrader.pipeline.results import ResultsJoin
from batchgrader.pipeline.reuse import read_reuse_file
from batchgrader.pipeline.samples import VoteSpec, sample_ids, voted_values
from batchgrader.pipeline.tables import TableWriter, defuse_formula, open_table, text_of
from batchgrader.provider.protocol import ProviderError

_FORMULA_START = frozenset("=+-@\t\r")  # what defuse_formula may prefix (it checks again)

log = logging.getLogger("batchgrader.engine")
hook_log = logging.getLogger("batchgrader.jobhook")

UNMOVABLE_REJECTIONS = frozenset({"not_regular_file", "unknown_profile"})  # left where they are


class FinishStep:
    """End a job, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._effects_checked: set[str] = set()

    def write_result(self, a: WriteResult, job: JobState, now: float) -> None:
        """Write the result; one that cannot be written (a folder without write permission, a
        full disk) is the job's last error (``OutboxWriteFailed``, recorded and logged once per
        change of cause) and is tried again after a back-off of 5 s doubling up to 5 minutes."""
        try:
            self._write_outbox_once(job, a, now)
        except OSError as exc:
            job = self.ctx.state.jobs[job.job_id]
            path = str(exc.filename or job.result_path or self.ctx.home.outbox)
            if exc.filename and Path(exc.filename).name.startswith(TMP_PREFIX):
                path = str(Path(exc.filename).parent)  # the temporary file: name its folder
            code, error = outbox_error(exc, path)
            n = self.ctx.schedule.outbox_failures.get(job.job_id, 0) + 1
            self.ctx.schedule.outbox_failures[job.job_id] = n
            self.ctx.schedule.not_before[(job.job_id, OUTBOX_TIMER)] = outbox_retry_at(n, now)
            if job.outbox_error != error:
                log.warning("job %s: %s (tried again with a back-off)", job.job_id, error)
                self.ctx.emit(job.job_id, _e("OutboxWriteFailed", path=path, error=error, code=code))
            return
        self.ctx.schedule.outbox_written(job.job_id)

    def _write_outbox_once(self, job: JobState, a: WriteResult, now: float) -> None:
        """Name the result (and error report) in an intent event, write them, record them."""
        outbox = self.ctx.outbox
        taken = job.outbox == "started" and bool(job.result_path) and outbox.owner(job.result_path or "", job.job_id)
        if taken:  # never accept another job's file as ours: record a new name
            log.error("job %s: %s belongs to another job; choosing another name", job.job_id, job.result_path)
        if job.outbox == "none" or taken:
            path = outbox.reserve(job.result_name, job.job_id, now, outbox.report_of(job))
            err = outbox.reserve(error_name(job.file), job.job_id, now) if a.failed else None
            self.ctx.emit(job.job_id, _e("OutboxWriteStarted", path=str(path), error_path=str(err) if err else None))
        job = self.ctx.state.jobs[job.job_id]
        if job.outbox != "started":
            return
        path = Path(job.result_path or "")
        # rows of the result and those failed (their error column set); None: written before a crash
        written, failed = self._write_result(job, self.ctx.profile_of(job), path) if not path.exists() else (job.rows, None)
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
        self.ctx.emit(
            job.job_id,
            _e(
                "ResultWritten",
                path=str(path),
                rows=written,
                succeeded=job.succeeded_rows if failed is None else written - failed,
                failed=len(job.failed_rows) + len(job.row_errors) if failed is None else failed,
                error_path=job.error_path,
            ),
        )

    def delete_provider_files(self, a: DeleteProviderFiles, job: JobState, now: float) -> None:
        """Delete the job's files at the provider, each delete's intent recorded before it leaves."""
        deleted = []
        for fid in a.file_ids:
            try:
                self.ctx.delete_provider_file(job, fid, "finished")
                deleted.append(fid)
            except ProviderError as exc:
                log.info("could not delete provider file %s: %s", fid, exc)
        self.ctx.emit(job.job_id, _e("ProviderFilesDeleted", file_ids=deleted))

    def _write_result(self, job: JobState, profile: Profile, path: Path) -> tuple[int, int]:
        """Stream the input and join each row to its result (ResultsJoin: O(chunks) memory).  A row
        answered from the store takes its stored answer; a duplicate that no chunk answered
        takes its leader's outcome (leaders come first in the input)."""
        paths = [
            c.results_path
            for c in sorted(job.chunks.values(), key=lambda c: c.index)
            if c.results_path and Path(c.results_path).exists()
        ]
        cached: dict[str, dict[str, Any]] = {}
        answered = self.ctx.reuse.take_answered(job.job_id)  # prepared in this process: no need to read the file
        if answered is not None:
            cached = {r["custom_id"]: r for r in answered.cached_records()}
        elif job.cached_rows and job.reuse_path:
            cached = read_reuse_file(Path(job.reuse_path))[0]
        leader_of = {d: leader for leader, ds in self.ctx.reuse.followers_of(job).items() for d in ds}
        leads = set(leader_of.values())
        led: dict[str, dict[str, Any]] = {}
        row_errors = job.row_errors
        failed_info = job.failed_rows
        fixed = {**result_settings(profile), **job.settings}  # as prepared, even if the config changed since
        id_column = fixed["id_column"]
        count = failed = 0

        def write(f) -> None:
            nonlocal count, failed
            with (
                open_table(
                    Path(job.input_path), sheet=fixed.get("sheet"), encoding=fixed.get("encoding", "utf-8"), validated=True
                ) as reader,
                ResultsJoin(paths) as results,
            ):
                per_row = int(fixed.get("samples") or 1)
                vote_spec = VoteSpec.of(fixed["response_format"], fixed.get("reference_field"))
                cols = added_columns(reader.columns, fixed["output_column"], fixed["response_format"], per_row)
                spec = format_spec(reader.fmt)
                json_values = spec.typed_cells
                guard = fixed["csv_formula_guard"] and spec.formula_guard
                types = added_column_types(cols, fixed["response_format"])
                with TableWriter(f, reader, cols.written(), column_types=types) as w:
                    write_row, take, stored, sha = w.write, results.take, cached.get, job.sha256

                    def lookup(cid: str) -> tuple[dict[str, Any] | None, str | None]:
                        outcome = take(cid)
                        if outcome is None:
                            outcome = stored(cid)
                            if outcome is None and cid in leader_of and leader_of[cid] in led:
                                outcome = {
                                    **led[leader_of[cid]],
                                    "custom_id": cid,
                                    "reused": "duplicate",
                                    "leader": leader_of[cid],
                                }
                        if cid in leads and outcome is not None:
                            led[cid] = outcome
                        err = None
                        if cid in row_errors:
                            err = f"{row_errors[cid].get('code')}: {row_errors[cid].get('message')}"
                        elif outcome is None and cid in failed_info:
                            err = f"{failed_info[cid].get('code')}: {failed_info[cid].get('message')}"
                        return outcome, err

                    for row in reader:
                        vals = row.values  # every reader yields a new dict per row
                        cid = text_of(vals[id_column]) if id_column else default_custom_id(sha, row.number)
                        if per_row > 1:  # the vote of the row's samples (pipeline/samples.py)
                            got = [lookup(s) for s in sample_ids(cid, per_row)]
                            added = voted_values(cols, [o for o, _ in got], [e for _, e in got], vote_spec, json_values)
                        else:
                            added = result_values(cols, *lookup(cid), json_values)
                        if guard:  # the model's output is attacker-influenced; input cells stay unchanged
                            for k, v in added.items():
                                if type(v) is str and v and v[0] in _FORMULA_START:
                                    added[k] = defuse_formula(v)
                        failed += bool(added.get(cols.error))  # a row failed: its request, or its samples' vote
                        vals.update(added)
                        if row.text is None:
                            write_row(vals)
                        else:  # a CSV line read as it is written: copied, not joined again
                            write_row(vals, row.text)
                        count += 1

        atomic_write(path, write, overwrite=False)
        return count, failed

    def recover_ended(self, a: RecoverEnded, job: JobState, now: float) -> None:
        """Effects of an ended job that a crash may have interrupted."""
        if job.outbox == "started" and job.error_path:
            p = Path(job.error_path)
            if not p.exists():
                err = job.error or {}
                atomic_write_bytes(
                    p, error_report(job.file, job.job_id, err.get("error") or "", err.get("hint") or "").encode(), overwrite=False
                )
            self.ctx.emit(job.job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(p)))
        self._redo_final_effects(self.ctx.state.jobs[job.job_id], now)

    def write_error_report(self, a: WriteErrorReport, job: JobState, now: float) -> None:
        """Write and record the error report of a job that failed before it was prepared, unless
        it has one on disk.  A report named by ``OutboxWriteStarted`` but never written (a crash
        in between) is written under that name; otherwise a new one is named, written and recorded."""
        job_id, error, hint = job.job_id, a.error, a.hint
        job = self.ctx.state.jobs[job_id]
        if job.outbox == "done" and job.error_path and Path(job.error_path).is_file():
            return
        if job.outbox == "started" and job.error_path and not job.result_path:
            p = Path(job.error_path)
            if not p.exists():
                atomic_write_bytes(p, error_report(job.file, job_id, error, hint).encode("utf-8"), overwrite=False)
            self.ctx.emit(job_id, _e("ResultWritten", path=None, rows=0, succeeded=0, failed=0, error_path=str(p)))
            return
        self.ctx.outbox.write_error_report(job_id, job.file, self.ctx.outbox.error_path(job, now), error, hint)

    def restore_input(self, a: RestoreInput, job: JobState, now: float) -> None:
        """A job reopened by ``bgctl retry``: bring its input back into the work area."""
        if not Path(job.input_path).exists() and job.archived_path and Path(job.archived_path).exists():
            os.rename(job.archived_path, job.input_path)
            self.ctx.emit(job.job_id, _e("InputRestored", path=job.input_path))

    def archive(self, a: Archive, job: JobState, now: float) -> None:
        src = Path(job.input_path)
        if src.exists():
            home = self.ctx.home
            dest = move_no_clobber(src, home.failed if a.to_failed else home.archive, job.file, stamp(now))
            self.ctx.emit(job.job_id, _e("InputArchived", path=str(dest)))

    def finish(self, a: Finish, job: JobState, now: float) -> None:
        """The job's end, as the rules decided it (core/rules/ending.py), and what follows it."""
        self.ctx.emit(job.job_id, _e(a.event, **a.payload))
        self._after_job_end(job.job_id, now)

    def _after_job_end(self, job_id: str, now: float) -> None:
        """Effects of a job's end that never change the job: the HTML report (``write_report``)
        and the ``on_job_end`` command (recorded first, so it runs at most once per end)."""
        job = self.ctx.state.jobs[job_id]
        try:
            write_report = bool(self.ctx.profile_of(job).get("write_report"))
        except ConfigError:
            write_report = False
        if write_report and job.result_path:
            try:
                from batchgrader.reports.report import build_report
                from batchgrader.reports.report_html import render_html

                # the result's name was chosen with its report's free (ctx.outbox.reserve): the
                # two share their stem; a report already there is this result's, written before
                dest = self.ctx.home.outbox / report_name(job.result_path)
                if not dest.exists():
                    page = render_html(build_report(list(self.ctx.store.read(job_id=job_id))))
                    atomic_write_bytes(dest, page.encode("utf-8"), overwrite=False)
            except Exception as exc:  # a report is a convenience: never let it stop the daemon
                log.warning("could not write the HTML report of job %s: %s", job_id, exc)
        command = self.ctx.settings.get("on_job_end")
        if command and job.end_hook_seq != job.version:
            timeout = float(self.ctx.settings.get("on_job_end_timeout_seconds") or 60.0)
            self.ctx.emit(job_id, _e("JobEndHookStarted", end_seq=job.version, timeout_seconds=timeout))
            start_hook(command, hook_env(self.ctx.state.jobs[job_id]), timeout, self._secrets())

    def _secrets(self) -> list[str]:
        """Every API key the config holds (the default settings and each profile's)."""
        return [
            str(p.get(k)) for p in (self.ctx.config.default, *self.ctx.config.profiles.values()) for k in SECRET_KEYS if p.get(k)
        ]

    def _redo_final_effects(self, job: JobState, now: float) -> None:
        """On restart, redo every effect a final event implies that is missing: the error report
        of a failed (or rejected) job, and the move of its input out of work/ (or the inbox).
        Checked once per job per process."""
        if job.job_id in self._effects_checked:
            return
        self._effects_checked.add(job.job_id)
        if job.ended == "failed" and job.outbox == "none":
            err = job.error or {}
            path = self.ctx.outbox.error_path(job, now)
            self.ctx.outbox.write_error_report(
                job.job_id, job.file, path, err.get("error") or job.last_error or "", err.get("hint") or ""
            )
        job = self.ctx.state.jobs[job.job_id]
        if job.archived_path or job.panel_of is not None:  # a judge's job leaves the panel's input alone
            return
        if job.rejected:
            code = (job.error or {}).get("code")
            src = Path(job.source) if job.source and code not in UNMOVABLE_REJECTIONS else None
        else:
            src = Path(job.input_path) if job.input_path else None
        if src is not None and src.is_file() and not src.is_symlink():
            folder = self.ctx.home.failed if job.ended == "failed" else self.ctx.home.archive
            dest = move_no_clobber(src, folder, job.file or src.name, stamp(now))
            self.ctx.emit(job.job_id, _e("InputArchived", path=str(dest)))


class ReuseStep:
    """Store a merged chunk's answers, over the :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def store_answers(self, a: StoreAnswers, job: JobState, now: float) -> None:
        """Store a merged chunk's successful answers (``AnswersToStore``), recorded by
        ``AnswersStored`` in the same transaction.  Done after the job's result file is written,
        so storing never delays the results; after a crash in between it is simply done again
        (a stored answer is never duplicated).  A results file that cannot be read stores
        nothing, says why, and lets the job end."""
        c = job.chunks[a.chunk]
        rows, path = c.answers_due or 0, Path(c.results_path or "")
        keep_days = self.ctx.settings.cache_days
        provider = self.ctx.provider_key_for(job)
        store = self.ctx.store.answers

        def put(conn: Any) -> None:
            if keep_days > 0:
                # the retention's clock never runs ahead of the monotonic one (a forward step purges nothing)
                found = answers_to_store(job, c, provider, path, rows)
                store.put(conn, found, now=self.ctx.trusted_wall(), keep_days=keep_days)

        try:
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=None), also=put)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # the transaction was rolled back
            error = f"the chunk's results could not be read: {exc}"
            log.warning("job %s chunk %s: answers not stored: %s", job.job_id, c.index, error)
            self.ctx.emit(job.job_id, _e("AnswersStored", chunk=c.index, error=error))


# --- the on_job_end command ------------------------------------------------------------------------


def hook_env(job: Any) -> dict[str, str]:
    """The ``BG_*`` variables for a folded ended job."""
    return {
        "BG_JOB_ID": job.job_id,
        "BG_JOB_STATE": job.state,
        "BG_RESULT_PATH": job.result_path or "",
        "BG_ERROR_PATH": job.error_path or "",
        "BG_COST_USD": f"{job.cost_usd:.6f}",
        "BG_INPUT_FILE": job.file,
    }


def _run(command: str, env: dict[str, str], timeout: float, job_id: str) -> None:
    try:
        proc = subprocess.Popen(
            command,
            shell=True,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        hook_log.warning("on_job_end for job %s could not start: %s", job_id, exc)
        return
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        out, _ = proc.communicate()
        timed_out = True
    for line in (out or b"").decode("utf-8", errors="replace").splitlines():
        hook_log.info("on_job_end %s: %s", job_id, line)
    if timed_out:
        hook_log.warning("on_job_end for job %s was killed after %.1f s", job_id, timeout)
    elif proc.returncode:
        hook_log.warning("on_job_end for job %s exited with status %s (the job is not affected)", job_id, proc.returncode)
    else:
        hook_log.info("on_job_end for job %s finished", job_id)


def hook_environment(
    variables: Mapping[str, str], secrets: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The command's environment: the daemon's, less every key variable the config knows and
    every variable whose value is one of ``secrets`` (the keys in use), plus ``variables``."""
    names = secret_env_names()
    values = {s for s in secrets if s}
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in names and v not in values}
    env.update(variables)
    return env


def start_hook(command: str, variables: Mapping[str, str], timeout: float, secrets: Iterable[str] = ()) -> threading.Thread:
    """Start ``command`` in a (non-daemon) thread: a ``daemon --once`` exit waits for it."""
    env = hook_environment(variables, secrets)
    t = threading.Thread(
        target=_run, args=(command, env, timeout, variables.get("BG_JOB_ID", "")), name="on_job_end", daemon=False
    )
    t.start()
    return t
