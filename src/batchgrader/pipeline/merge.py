"""Merging a batch's results into the chunk's rows: a data transform from files to a file.

:func:`merge_chunk` reads the downloaded output and error files
(:func:`pipeline.results.iter_outcomes`) into a :class:`ChunkSpool` made with the chunk's custom
ids, which writes, given the batch's final status, one record per row in the chunk's order to
the chunk's results file; it returns the rows that failed and the usage (:class:`StreamedMerge`)
in a :class:`MergeOutcome`.  Its inputs and outcome are plain values (:class:`MergeInputs`,
JSON both ways), so the daemon can run it in a separate process (``daemon/workers.py``).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from batchgrader.fsio import atomic_write
from batchgrader.pipeline.outputschema import line_schemas, output_problem
from batchgrader.pipeline.pricing import Price, billed_cost, cache_saving
from batchgrader.pipeline.results import iter_outcomes
from batchgrader.pipeline.splitting import custom_ids_in

USAGE_KEYS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
_dumps = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False) without an encoder per call
FIGURES = 2 + len(USAGE_KEYS)  # numbers a ChunkSpool keeps per record: ok, the USAGE_KEYS tokens, cache-write tokens


def outcome_record(o: Any, schema: Mapping[str, Any] | None = None, whose: str = "the profile's") -> dict[str, Any]:
    """One row's outcome as stored in the chunk's results file (``cache_write_tokens`` only when
    the provider reported prompt-cache writes).  With ``schema`` (the profile's JSON schema, or
    ``whose`` else: the row's own request's) an answer that does not parse under it fails as
    ``invalid_output`` (its text kept)."""
    rec = {
        "custom_id": o.custom_id,
        "ok": bool(o.ok),
        "content": o.content,
        "status_code": o.status_code,
        "error_code": o.error_code,
        "error_message": o.error_message,
        "prompt_tokens": o.prompt_tokens,
        "cached_tokens": o.cached_tokens,
        "completion_tokens": o.completion_tokens,
        "reasoning_tokens": o.reasoning_tokens,
        "finish_reason": o.finish_reason,
    }
    if getattr(o, "cache_write_tokens", 0):
        rec["cache_write_tokens"] = int(o.cache_write_tokens)
    if schema is not None and rec["ok"]:
        problem = output_problem(o.content, schema)
        if problem is not None:
            rec.update(
                ok=False,
                error_code="invalid_output",
                error_message=f"the answer does not parse under {whose} JSON schema: {problem}",
            )
    return rec


def failed_row(custom_id: str, code: Any, message: Any, status: int | None) -> dict[str, Any]:
    """A ``RowsFailed`` row; ``status``: the HTTP status of the row's error answer, when it had one
    (an answer that is not one, ``truncated`` and the like, came with 200 and carries none)."""
    row: dict[str, Any] = {"custom_id": custom_id, "code": code, "message": message}
    if status is not None and status != 200:
        row["status"] = status
    return row


@dataclass(frozen=True)
class StreamedMerge:
    """What :meth:`ChunkSpool.write` wrote: the figures of the chunk's rows and of their
    duplicates (rows of the same file that take a leader's outcome)."""

    rows: int
    failed_rows: list[dict[str, Any]]  # {custom_id, code, message[, status]}
    usage: dict[str, int]  # summed over the rows billed: answered, and answered but failed (truncated, refused, ...)
    duplicates: int = 0
    duplicates_failed: list[dict[str, Any]] = field(default_factory=list)
    duplicates_usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS, 0))
    cache_write_tokens: int = 0  # of usage["prompt_tokens"]: prompt-cache writes (billed at 1.25 x input)

    @property
    def succeeded(self) -> int:
        return self.rows - len(self.failed_rows)

    @property
    def all_ok(self) -> bool:
        return not self.failed_rows

    def cost(self, price: Price | None) -> float:
        if price is None:
            return 0.0
        u = self.usage
        return float(billed_cost(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"], self.cache_write_tokens))

    def cache_saving(self, price: Price | None) -> float:
        """What prompt caching saved on these rows: their cost with every prompt token at the
        input price, minus :meth:`cost` (negative when cache writes cost more than reads saved)."""
        if price is None:
            return 0.0
        u = self.usage
        return float(cache_saving(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"], self.cache_write_tokens))


class ChunkSpool:
    """A chunk's outcomes as they are read, spooled to a temporary file: memory holds, per
    answered row, where its record is and the few figures the merge sums, in flat arrays (never
    the parsed outcomes or the chunk's records, which are not parsed again).  :meth:`write`
    then takes them back in the chunk's order."""

    def __init__(
        self,
        expected: Sequence[str],
        schema: Mapping[str, Any] | None = None,
        row_schemas: Mapping[str, Mapping[str, Any] | None] | None = None,
    ):
        self.expected = expected
        self.schema = schema
        self.row_schemas = row_schemas  # custom_id -> the schema its request carried (``schema_column``)
        self.wanted = set(expected)
        self.found: dict[str, int] = {}  # custom_id -> slot of its record (later outcomes of a row win)
        self.at = array("q")  # per slot: the record's offset in the spool ...
        self.size = array("q")  # ... its size with its newline ...
        self.figures = array("q")  # ... and FIGURES numbers: ok, the USAGE_KEYS tokens, cache-write tokens
        self.errors: dict[int, tuple[Any, Any, Any]] = {}  # slot of a failed row -> (error code, message, HTTP status)
        self.spool: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()

    def read(self, outcomes: Iterable[Any]) -> None:
        dumps, wanted, found, spool = _dumps, self.wanted, self.found, self.spool
        at = spool.tell()
        own = self.row_schemas
        for o in outcomes:
            if o.custom_id in wanted:
                if own is not None and o.custom_id in own:
                    rec = outcome_record(o, own[o.custom_id], "its request's")
                else:
                    rec = outcome_record(o, self.schema)
                line = dumps(rec).encode("utf-8") + b"\n"
                slot = found[o.custom_id] = len(self.at)
                self.at.append(at)
                self.size.append(len(line))
                if rec["ok"] or rec.get("status_code") == 200:  # billed: an answer, or one that is not (truncated, ...)
                    ok = 1 if rec["ok"] else 0
                    self.figures.extend(
                        (ok, *(int(rec.get(k) or 0) for k in USAGE_KEYS), int(rec.get("cache_write_tokens") or 0))
                    )
                else:
                    self.figures.extend((0,) * FIGURES)
                if not rec["ok"]:
                    self.errors[slot] = (rec.get("error_code"), rec.get("error_message"), o.status_code)
                spool.write(line)
                at += len(line)

    def write(
        self,
        write: Callable[[bytes], Any],
        status: str | None,
        missing: tuple[str, str] | None = None,
        followers: Mapping[str, Sequence[str]] | None = None,
    ) -> StreamedMerge:
        """One JSON line per row in the chunk's order (``write`` gets each line), then one line per
        duplicate of a row (its leader's outcome under its own custom id; a duplicate that is one
        of the chunk's own rows is not repeated).  Later outcomes of the same row win; rows the
        chunk did not send are ignored.  A row without an outcome failed: the batch expired
        (``batch_expired``), was cancelled (``batch_cancelled``) or left it out
        (``missing_result``, or ``missing`` when the files could not be had or had unreadable
        lines)."""
        return _write_in_order(write, self, status, missing, followers)

    def close(self) -> None:
        self.spool.close()

    def __enter__(self) -> ChunkSpool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _write_in_order(
    write: Callable[[bytes], Any],
    sp: ChunkSpool,
    status: str | None,
    missing: tuple[str, str] | None,
    followers: Mapping[str, Sequence[str]] | None,
) -> StreamedMerge:
    dumps, loads = _dumps, json.loads
    missing_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status or "", "missing_result")
    missing_msg = {
        "batch_expired": "the batch expired before this row was processed",
        "batch_cancelled": "the batch was cancelled before this row was processed",
    }.get(missing_code, "the provider returned no result for this row")
    if missing is not None and missing_code == "missing_result":
        missing_code, missing_msg = missing
    failed: list[dict[str, Any]] = []
    totals = dict.fromkeys(USAGE_KEYS, 0)
    writes = 0
    dup_lines: list[bytes] = []
    dup_failed: list[dict[str, Any]] = []
    dup_totals = dict.fromkeys(USAGE_KEYS, 0)
    expected, wanted, found, spool, figures = sp.expected, sp.wanted, sp.found, sp.spool, sp.figures
    spool.flush()
    pos = spool.tell()  # where the spool's file position is (a seek is skipped when it is there)
    for cid in expected:
        slot = found.pop(cid, None)
        if slot is None:
            rec: dict[str, Any] | None = {"custom_id": cid, "ok": False, "error_code": missing_code, "error_message": missing_msg}
            line = dumps(rec).encode("utf-8") + b"\n"
            ok, pt, ct, comp, rt, cw = 0, 0, 0, 0, 0, 0
            code, message, http = missing_code, missing_msg, None
        else:
            at = sp.at[slot]
            if at != pos:
                spool.seek(at)
            line = spool.read(sp.size[slot])
            pos = at + len(line)
            rec = None
            ok, pt, ct, comp, rt, cw = figures[slot * FIGURES : slot * FIGURES + FIGURES]
            code, message, http = sp.errors.get(slot, (None, None, None))
        write(line)
        usage = (pt, ct, comp, rt)  # in USAGE_KEYS order; zeros for a row not billed
        for k, v in zip(USAGE_KEYS, usage, strict=True):
            totals[k] += v
        writes += cw
        if not ok:
            failed.append(failed_row(cid, code, message, http))
        for dup in followers.get(cid, ()) if followers else ():
            if dup in wanted:
                continue  # a duplicate resent in a retry chunk has its own outcome
            if rec is None:
                rec = loads(line)
            dup_lines.append(dumps({**rec, "custom_id": dup, "reused": "duplicate", "leader": cid}).encode())
            for k, v in zip(USAGE_KEYS, usage, strict=True):
                dup_totals[k] += v
            if not ok:
                dup_failed.append(failed_row(dup, code, message, http))
    for line in dup_lines:
        write(line + b"\n")
    return StreamedMerge(
        rows=len(expected),
        failed_rows=failed,
        usage=totals,
        duplicates=len(dup_lines),
        duplicates_failed=dup_failed,
        duplicates_usage=dup_totals,
        cache_write_tokens=writes,
    )


def cache_figures(merged: StreamedMerge, price: Price | None) -> dict[str, Any]:
    """The optional ``TokensUsed`` fields of a merge: ``cache_write_tokens`` and
    ``cache_saved_usd``, only when the provider reported cache reads or writes (so the events of
    a job without caching stay as they were)."""
    if not merged.usage["cached_tokens"] and not merged.cache_write_tokens:
        return {}
    return {"cache_write_tokens": merged.cache_write_tokens, "cache_saved_usd": merged.cache_saving(price)}


@dataclass(frozen=True)
class MergeInputs:
    """What merging one ended batch's chunk needs, as plain values: the chunk's rows (its
    ``custom_ids`` as recorded, or None: those of its ``requests_path``, the request file it was
    sent as, in order), the downloaded files as ``(kind, path)`` (output first), the batch's
    final status, where the results go, why files could not be had (failed downloads), how many
    times a malformed file was downloaded again and whether it is to be again (else its good
    lines are kept), and the duplicates (leader -> rows) that take a leader's outcome."""

    files: tuple[tuple[str, str], ...]
    status: str | None
    results_path: str
    custom_ids: tuple[str, ...] | None = None
    requests_path: str | None = None
    unavailable: tuple[str, ...] = ()
    malformed_downloads: int = 0
    download_malformed_again: bool = False
    followers: Mapping[str, Sequence[str]] = field(default_factory=dict)
    schema: Mapping[str, Any] | None = None  # the profile's JSON schema: an answer outside it is invalid_output
    # ``schema_column``: each answer is checked against the schema its own request line carried
    line_schemas: bool = False

    def row_schemas(self) -> dict[str, dict[str, Any] | None] | None:
        """custom_id -> the schema its request line carried (with ``line_schemas`` and the
        chunk's request file at hand; else None: the profile's schema for every row)."""
        if not self.line_schemas or not self.requests_path or not Path(self.requests_path).exists():
            return None
        with open(self.requests_path, "rb") as f:
            return line_schemas(f)

    def expected(self) -> list[str]:
        """The custom_ids of the rows the batch was sent, in the chunk's order: a duplicate that
        rides with its leader in the chunk is not among them (it takes the leader's outcome)."""
        if self.custom_ids is not None:
            ids = list(self.custom_ids)
        else:
            ids = custom_ids_in(Path(self.requests_path or ""))
        return sent_ids(ids, self.followers)

    def to_json(self) -> dict[str, Any]:
        return {
            "files": [list(f) for f in self.files],
            "status": self.status,
            "results_path": self.results_path,
            "custom_ids": None if self.custom_ids is None else list(self.custom_ids),
            "requests_path": self.requests_path,
            "unavailable": list(self.unavailable),
            "malformed_downloads": self.malformed_downloads,
            "download_malformed_again": self.download_malformed_again,
            "followers": {k: list(v) for k, v in self.followers.items()},
            "schema": None if self.schema is None else dict(self.schema),
            "line_schemas": self.line_schemas,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MergeInputs:
        ids = d["custom_ids"]
        return cls(
            files=tuple((k, p) for k, p in d["files"]),
            status=d["status"],
            results_path=d["results_path"],
            custom_ids=None if ids is None else tuple(ids),
            requests_path=d["requests_path"],
            unavailable=tuple(d["unavailable"]),
            malformed_downloads=int(d["malformed_downloads"]),
            download_malformed_again=bool(d["download_malformed_again"]),
            followers=dict(d["followers"]),
            schema=d.get("schema"),
            line_schemas=bool(d.get("line_schemas")),
        )


class MergeWorkerFailed(RuntimeError):
    """A merge worker (``daemon/workers.py``) ended without an outcome (it could not start, failed,
    was killed or took too long): the chunk is merged in the daemon."""


@dataclass(frozen=True)
class MergeOutcome:
    """What :func:`merge_chunk` did: ``merged`` (the results file is written), or None when a
    malformed file is to be downloaded again (nothing written); the malformed lines seen, the
    kinds of file they were in and the first one's problem."""

    merged: StreamedMerge | None
    malformed_lines: int = 0
    bad_kinds: tuple[str, ...] = ()
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MergeOutcome:
        m = d["merged"]
        return cls(
            merged=None if m is None else StreamedMerge(**m),
            malformed_lines=int(d["malformed_lines"]),
            bad_kinds=tuple(d["bad_kinds"]),
            problem=d["problem"],
        )


def merge_chunk(inputs: MergeInputs) -> MergeOutcome:
    """Merge a chunk's downloaded files into its results file (written atomically, so a merge
    done twice, or by two processes at once, leaves one whole file).  A malformed line never
    stops the merge: it is skipped and counted; with ``download_malformed_again`` nothing is
    written and the outcome asks for the files again."""
    malformed: list[Any] = []
    bad_kinds: list[str] = []
    with ChunkSpool(inputs.expected(), inputs.schema, inputs.row_schemas()) as spool:
        spool.read(_outcomes(inputs.files, malformed, bad_kinds))
        problem = str(malformed[0]) if malformed else None
        if malformed and inputs.download_malformed_again:
            return MergeOutcome(None, len(malformed), tuple(bad_kinds), problem)
        missing = _missing_reason(inputs, malformed)
        got: list[StreamedMerge] = []
        atomic_write(
            Path(inputs.results_path), lambda f: got.append(spool.write(f.write, inputs.status, missing, inputs.followers))
        )
    return MergeOutcome(got[0], len(malformed), tuple(bad_kinds), problem)


def _outcomes(files: Iterable[tuple[str, str]], malformed: list[Any], bad_kinds: list[str]) -> Iterator[Any]:
    """The rows' outcomes from the downloaded files, one at a time; the malformed lines (skipped)
    go to ``malformed`` and the kinds of file they were in to ``bad_kinds``."""
    for kind, path in files:
        before = len(malformed)
        yield from iter_outcomes(Path(path), on_malformed="skip", malformed=malformed)
        if len(malformed) > before:
            bad_kinds.append(kind)


def _missing_reason(inputs: MergeInputs, malformed: list[Any]) -> tuple[str, str] | None:
    """Code and message for a row the downloaded files do not answer (None: the usual ones)."""
    if inputs.unavailable:
        return "output_unavailable", "; ".join(inputs.unavailable)
    if inputs.status == "completed" and not inputs.files:
        # read back from the provider and still no result file: what it answered (and billed)
        # cannot be had; sending the rows again would pay twice (`bgctl retry` does it on request)
        return "output_unavailable", "the batch completed but the provider named no output or error file for it"
    if malformed:
        return (
            "malformed_result",
            f"the provider's result file had {len(malformed)} malformed line(s) after "
            f"{inputs.malformed_downloads + 1} downloads (first: {malformed[0]})",
        )
    return None


def riders(ids: Sequence[str], followers: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Of ``ids``, the duplicates whose leader is in ``ids`` too, by leader (``followers``:
    leader -> its duplicates).  In a chunk they ride with their leader: only the leader is
    sent, they take its outcome when the chunk is merged (a retry keeps the grouping)."""
    if not followers:
        return {}
    wanted = set(ids)
    out: dict[str, list[str]] = {}
    for leader in ids:
        fs = followers.get(leader)
        if fs:
            riding = [f for f in fs if f in wanted]
            if riding:
                out[leader] = riding
    return out


def sent_ids(ids: list[str], followers: Mapping[str, Sequence[str]]) -> list[str]:
    """``ids`` without the duplicates that ride with their leader (see :func:`riders`)."""
    ride = {f for fs in riders(ids, followers).values() for f in fs}
    return [x for x in ids if x not in ride] if ride else ids
