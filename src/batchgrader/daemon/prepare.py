"""The engine steps that plan a job's chunks: prepare (read the input, count, apply reuse,
split into chunk files, ``JobPrepared``) and replan a chunk refused for the queue limit.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

from batchgrader.core.config import ConfigError
from batchgrader.core.heap import trim_heap
from batchgrader.core.state import ChunkState, JobState
from batchgrader.core.stragglers import deadline_of
from batchgrader.daemon.base import (
    _e,
    _lines,
    chunk_custom_ids,
    result_settings,
)
from batchgrader.daemon.context import Context
from batchgrader.daemon.online import answered_online_first
from batchgrader.daemon.reuse import ReuseSteps
from batchgrader.daemon.submit import SubmitSteps
from batchgrader.fsio import atomic_write
from batchgrader.pipeline.calibration import learned_overhead
from batchgrader.pipeline.prepare import prepare, unsent_positions
from batchgrader.pipeline.pricing import PricingError
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks, request_custom_id, write_chunk_files
from batchgrader.pipeline.tables import InputError

log = logging.getLogger("batchgrader.engine")


def input_error_for_user(exc: InputError, user_file: str) -> str:
    """An input error as the user should read it: named after their file (``reviews.csv``), not
    the daemon's work copy (``input.csv``)."""
    return str(InputError(user_file, exc.reason, exc.line, exc.column))


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


def _write_arrays(f: Any, *arrays: array) -> None:
    for a in arrays:
        a.tofile(f)


def _token_sizes(path: Path, first: int, last: int | None) -> tuple[array, array]:
    """The token counts and sizes (tokens.bin: every row's tokens, then every row's sizes) of
    the rows ``first`` to ``last`` (None: to the end); only that range is read."""
    n = path.stat().st_size // 16
    last = n if last is None else min(last, n)
    tokens, sizes = array("Q"), array("Q")
    with open(path, "rb") as f:
        f.seek(first * 8)
        tokens.frombytes(f.read((last - first) * 8))
        f.seek((n + first) * 8)
        sizes.frombytes(f.read((last - first) * 8))
    return tokens, sizes


def _kept_lines(path: Path, keep: Iterable[int]) -> Iterable[bytes]:
    """The lines of ``path`` at the positions in ``keep`` (ascending)."""
    wanted = iter(keep)
    nxt = next(wanted, None)
    if nxt is None:
        return
    for pos, line in enumerate(_lines(path)):
        if pos == nxt:
            yield line
            nxt = next(wanted, None)
            if nxt is None:
                return


class PrepareSteps:
    """The steps that plan a job's chunks, on the shared :class:`~batchgrader.daemon.context.Context`."""

    def __init__(self, ctx: Context, reuse: ReuseSteps, submit: SubmitSteps) -> None:
        self.ctx = ctx
        self.reuse = reuse
        self.submit = submit

    def _cannot_prepare(self, job: JobState, code: str, error: str, hint: str) -> None:
        """Record why the job cannot be prepared; the rules end it (core/ending.py)."""
        self.ctx.emit(job.job_id, _e("PrepareFailed", code=code, error=error, hint=hint))

    def prepare(self, job: JobState, now: float) -> None:
        """Prepare ``job`` (its chunks written and planned, or it fails for its input), then give
        the memory the counting threads freed back to the system (:mod:`batchgrader.core.heap`)."""
        try:
            self._prepare(job, now)
        finally:
            trim_heap()

    def _prepare(self, job: JobState, now: float) -> None:
        job_dir = self.ctx.home.job_dir(job.job_id)
        try:
            profile = self.ctx.profile_of(job)
        except ConfigError as exc:
            return self._cannot_prepare(
                job, "unknown_profile", str(exc), "Define the profile in config.yaml, then `bgctl retry " + job.job_id + "`."
            )
        try:
            self.ctx.prices.get(profile.model)  # fail fast: nothing is spent on an unpriced model
        except PricingError as exc:
            return self._cannot_prepare(
                job,
                "missing_pricing",
                str(exc),
                "Add the model to pricing.csv in the home (or fix `model`), then `bgctl retry " + job.job_id + "`.",
            )
        requests_path = job_dir / "requests.jsonl"
        probe = self.reuse.reuse_probe(job, profile, self.ctx.trusted_wall())  # retention: not by a clock stepped forward
        on_send = lambda: self.ctx.on_rows_to_send(profile.provider)  # noqa: E731
        # its route's answers (and refusals) by row, whatever the settings now
        probe = answered_online_first(probe, job, self.ctx.provider_key_for(job), on_send)
        if probe is None:  # every row is sent (else the probe says so at the first row to send)
            self.ctx.on_rows_to_send(profile.provider)
        try:
            with open(requests_path, "wb") as f:
                prep = prepare(
                    Path(job.input_path),
                    profile,
                    self.ctx.home,
                    requests_out=cast(IO[bytes], _Heartbeat(f, self.ctx.on_progress)),
                    prices=self.ctx.prices,
                    file_hash=job.sha256,
                    limits=self.ctx.limits(profile),
                    reuse=probe,
                )
                f.flush()
                os.fsync(f.fileno())
        except InputError as exc:
            return self._cannot_prepare(
                job, "bad_input", input_error_for_user(exc, job.file), "Fix the file and drop it in the inbox again."
            )
        except ConfigError as exc:
            return self._cannot_prepare(
                job, "bad_config", str(exc), "Fix the configuration (bgctl config show), then `bgctl retry " + job.job_id + "`."
            )
        except UnicodeError as exc:
            return self._cannot_prepare(
                job, "bad_input", f"{job.file}: {exc}", "Save the file as UTF-8 and drop it in the inbox again."
            )
        counted = self.reuse.count_exact(profile, requests_path, prep)  # the provider's exact counts, if it has them
        sizes_path = job_dir / "tokens.bin"
        atomic_write(sizes_path, lambda f: _write_arrays(f, prep.tokens, prep.sizes))
        reuse = self.reuse.decide_reuse(job, profile, probe, prep)
        chunk_dir = job_dir / "chunks"
        if reuse is None:
            paths = write_chunk_files(_lines(requests_path), prep.chunks, unsent_positions(prep), chunk_dir, job.job_id)
        else:
            paths = write_chunk_files(_kept_lines(requests_path, reuse.keep), prep.chunks, set(), chunk_dir, job.job_id)
        summary = prep.summary(
            self.ctx.prices, learned_overhead(self.ctx.state, prep.model, profile.response_format, self.ctx.provider_key_for(job))
        )
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
        if not chunks and not prep.problems and not (reuse and reuse.cached):
            return self._cannot_prepare(
                job, "empty_input", f"{job.file}: no rows to grade", "Add data rows and drop the file in again."
            )
        self.ctx.emit(
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
                **_deadline(job, profile.get("deadline"), now),
                **({"text_encoding": prep.text_encoding} if prep.text_encoding else {}),
                **({"empty_rows": prep.empty_rows} if prep.empty_rows else {}),
            ),
            *([_e("InputTokensCounted", **{**counted, "input_tokens": prep.input_tokens})] if counted else []),
            *self.reuse.reuse_events(job, reuse),
        )

    def replan(self, job: JobState, c: ChunkState, limit: int, exact: bool) -> None:
        """Split the rows of a chunk larger than the queue limit into chunks that fit.  A row
        that alone exceeds a stated limit fails (request_too_large); under an estimated one it
        is tried alone.  Retry counters do not move.  Chunk files first, then one append; a
        crash in between plans the same chunks again."""
        self.submit.delete_refused_file(c)
        in_chunk = chunk_custom_ids(c)
        riders = self.reuse.riders(job, in_chunk)  # duplicates riding with their leader stay with it
        ids = set(self.reuse.sent_ids(job, in_chunk))
        del in_chunk
        # the chunk's lines are read twice (to plan, then to write), never held: a refused chunk
        # may be the whole file
        cids: list[str] = []
        positions, tokens, sizes = array("q"), array("Q"), array("Q")
        # A prepared chunk's range counts the rows sent: with answers reused, its rows sit at
        # file positions from ``start`` on, later by the rows reused before them; so the file is
        # read from ``start`` until every row of the chunk is found.
        first = c.start if c.custom_ids is None else 0
        tok_all, size_all = _token_sizes(self.ctx.home.job_dir(job.job_id) / "tokens.bin", first, None)
        requests_path = Path(job.requests_path or "")
        for pos, line in enumerate(islice(_lines(requests_path), first, None), start=first):
            cid = request_custom_id(line)
            if cid in ids:
                positions.append(pos)
                cids.append(cid)
                tokens.append(tok_all[pos - first])
                sizes.append(size_all[pos - first])
                if len(cids) == len(ids):
                    break
        del tok_all, size_all
        profile = self.ctx.profile_of(job)
        caps = Limits(
            token_limit=min(limit, profile.split_token_limit or limit),
            row_limit=profile.split_row_limit,
            max_requests=profile.max_requests_per_batch,
            max_bytes=profile.max_batch_bytes,
            token_limit_name="provider's enqueued-token limit",
        )
        chunks, over = plan_chunks(tokens, sizes, caps)
        base = max(job.chunks) + 1
        out_dir = self.ctx.home.job_dir(job.job_id) / "chunks"
        skip = {o.position for o in over}
        paths = write_chunk_files(_kept_lines(requests_path, positions), chunks, skip, out_dir, f"{job.job_id}-replan{base:04d}")
        new = [
            {
                "index": base + i,
                "custom_ids": [x for k in range(ch.start, ch.end) if k not in skip for x in (cids[k], *riders.get(cids[k], ()))],
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
                _kept_lines(requests_path, [positions[o.position] for o in over]),
                singles,
                set(),
                out_dir,
                f"{job.job_id}-replan{base:04d}-alone",
            )
            for o, ch, p in zip(over, singles, spaths):
                new.append(
                    {
                        "index": base + len(new),
                        "custom_ids": [cids[o.position], *riders.get(cids[o.position], ())],
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
                {"custom_id": x, "code": "request_too_large", "message": o.reason + " (it can never be accepted)"}
                for o in over
                for x in (cids[o.position], *riders.get(cids[o.position], ()))
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
        self.ctx.emit(job.job_id, *events)

    # --- submit -------------------------------------------------------------------------------


def _deadline(job: JobState, value: str | None, now: float) -> dict[str, float]:
    """``JobPrepared.deadline_at``: when the job is due, fixed at its preparation (none: absent)."""
    from batchgrader.core.decide import epoch

    due = deadline_of(value, epoch(job.created_ts, now), now)
    return {} if due is None else {"deadline_at": due}
