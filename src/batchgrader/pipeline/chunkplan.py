"""A job's chunks planned and written on disk, as the daemon's steps record them: the chunks of a
prepared job (``JobPrepared.chunks``), a chunk larger than the provider's queue limit planned
again (``ChunkReplanned``), and the retry chunks of failed rows (``RetryPlanned``).

Pure apart from the files: each function reads the job's request lines (``requests.jsonl``) and
token counts (``tokens.bin``: every row's tokens, then every row's sizes, ``Q`` each), writes the
chunk files, and returns the payloads the step appends; the step records them (one append) and
says what happened.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Profile
from batchgrader.core.log.state import ChunkState, JobState
from batchgrader.pipeline.merge import riders, sent_ids
from batchgrader.pipeline.requests import with_output_bound
from batchgrader.pipeline.splitting import Chunk, Limits, custom_ids_in, plan_chunks, request_custom_id, write_chunk_files


def lines(path: Path) -> Iterator[bytes]:
    """The lines of ``path``, one at a time."""
    with open(path, "rb") as f:
        yield from f


def write_token_sizes(f: Any, tokens: array, sizes: array) -> None:
    """``tokens.bin``: every row's tokens, then every row's sizes."""
    tokens.tofile(f)
    sizes.tofile(f)


def token_sizes(path: Path, first: int = 0, last: int | None = None) -> tuple[array, array]:
    """The token counts and sizes of the rows ``first`` to ``last`` (None: to the end) from
    ``tokens.bin``; only that range is read."""
    n = path.stat().st_size // 16
    last = n if last is None else min(last, n)
    tokens, sizes = array("Q"), array("Q")
    with open(path, "rb") as f:
        f.seek(first * 8)
        tokens.frombytes(f.read((last - first) * 8))
        f.seek((n + first) * 8)
        sizes.frombytes(f.read((last - first) * 8))
    return tokens, sizes


def kept_lines(path: Path, keep: Iterable[int]) -> Iterator[bytes]:
    """The lines of ``path`` at the positions in ``keep`` (ascending)."""
    wanted = iter(keep)
    nxt = next(wanted, None)
    if nxt is None:
        return
    for pos, line in enumerate(lines(path)):
        if pos == nxt:
            yield line
            nxt = next(wanted, None)
            if nxt is None:
                return


def chunk_custom_ids(c: ChunkState) -> list[str]:
    """The custom ids of a chunk: recorded with it, or read from its request file."""
    if c.custom_ids is not None:
        return list(c.custom_ids)
    return custom_ids_in(Path(c.path))


def with_followers(ids: list[str], followers: Mapping[str, Sequence[str]]) -> list[str]:
    """``ids`` and, after them, the duplicates of each not among them already (they fail with it)."""
    if not followers:
        return ids
    here = set(ids)
    return ids + [f for cid in list(ids) for f in followers.get(cid, ()) if f not in here]


def prepared_chunks(
    prep: Any, requests_path: Path, keep: Sequence[int] | None, skip: set[int], chunk_dir: Path, job_id: str
) -> list[dict[str, Any]]:
    """Write a prepared job's chunk files (``keep``: the positions still to send when answers are
    reused, else every line but those in ``skip``) and return ``JobPrepared.chunks``."""
    source = lines(requests_path) if keep is None else kept_lines(requests_path, keep)
    paths = write_chunk_files(source, prep.chunks, skip if keep is None else set(), chunk_dir, job_id)
    return [
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


@dataclass
class Replanned:
    """A refused chunk planned again: its new chunks, the rows that can never fit, and those rows
    (with their duplicates) failed as ``request_too_large``."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    oversized: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)


def replan_chunk(
    job: JobState, c: ChunkState, limit: int, exact: bool, profile: Profile, followers: Mapping[str, Sequence[str]], job_dir: Path
) -> Replanned:
    """Split the rows of a chunk larger than the queue limit ``limit`` into chunks that fit.  A
    row that alone exceeds a stated (``exact``) limit can never be accepted; under an estimated
    one it goes alone.  The chunk's lines are read twice (to plan, then to write), never held: a
    refused chunk may be the whole file."""
    in_chunk = chunk_custom_ids(c)
    riding = riders(in_chunk, followers)  # duplicates riding with their leader stay with it
    ids = set(sent_ids(list(in_chunk), followers))
    del in_chunk
    cids: list[str] = []
    positions, tokens, sizes = array("q"), array("Q"), array("Q")
    # A prepared chunk's range counts the rows sent: with answers reused, its rows sit at file
    # positions from ``start`` on, later by the rows reused before them; so the file is read from
    # ``start`` until every row of the chunk is found.
    first = c.start if c.custom_ids is None else 0
    tok_all, size_all = token_sizes(job_dir / "tokens.bin", first)
    requests_path = Path(job.requests_path or "")
    for pos, line in enumerate(islice(lines(requests_path), first, None), start=first):
        cid = request_custom_id(line)
        if cid in ids:
            positions.append(pos)
            cids.append(cid)
            tokens.append(tok_all[pos - first])
            sizes.append(size_all[pos - first])
            if len(cids) == len(ids):
                break
    del tok_all, size_all
    caps = Limits(
        token_limit=min(limit, profile.split_token_limit or limit),
        row_limit=profile.split_row_limit,
        max_requests=profile.max_requests_per_batch,
        max_bytes=profile.max_batch_bytes,
        token_limit_name="provider's enqueued-token limit",
    )
    chunks, over = plan_chunks(tokens, sizes, caps)
    base = max(job.chunks) + 1
    out_dir = job_dir / "chunks"
    skip = {o.position for o in over}
    paths = write_chunk_files(kept_lines(requests_path, positions), chunks, skip, out_dir, f"{job.job_id}-replan{base:04d}")
    out = Replanned()
    for i, (ch, p) in enumerate(zip(chunks, paths)):
        ride = [x for k in range(ch.start, ch.end) if k not in skip for x in (cids[k], *riding.get(cids[k], ()))]
        out.chunks.append(_chunk(base + i, ride, ch, p))
    if not exact and over:  # an estimated limit may be too low: each row over it goes alone
        singles = [
            Chunk(index=i, start=i, end=i + 1, requests=1, input_tokens=o.tokens, bytes=o.bytes) for i, o in enumerate(over)
        ]
        spaths = write_chunk_files(
            kept_lines(requests_path, [positions[o.position] for o in over]),
            singles,
            set(),
            out_dir,
            f"{job.job_id}-replan{base:04d}-alone",
        )
        for o, ch, p in zip(over, singles, spaths):
            out.chunks.append(_chunk(base + len(out.chunks), [cids[o.position], *riding.get(cids[o.position], ())], ch, p))
        return out
    out.oversized = [{"custom_id": cids[o.position], "tokens": o.tokens} for o in over]
    out.failed = [
        {"custom_id": x, "code": "request_too_large", "message": o.reason + " (it can never be accepted)"}
        for o in over
        for x in (cids[o.position], *riding.get(cids[o.position], ()))
    ]
    return out


def _chunk(index: int, custom_ids: list[str], ch: Chunk, path: Path) -> dict[str, Any]:
    return {
        "index": index,
        "custom_ids": custom_ids,
        "requests": ch.requests,
        "input_tokens": ch.input_tokens,
        "bytes": ch.bytes,
        "path": str(path),
    }


def retry_chunks(
    job: JobState,
    ids: list[str],
    profile: Profile,
    token_limit: int | None,
    followers: Mapping[str, Sequence[str]],
    job_dir: Path,
    route: str | None = None,
) -> list[dict[str, Any]]:
    """Write the retry chunks of the rows ``ids`` and return their ``RetryPlanned`` payloads
    (``route``: flex or online, a straggler's rows sent through the synchronous route).  A failed
    leader is sent once; its failed duplicates ride with it.  After ``bgctl retry`` with an
    output bound, each line carries it."""
    riding = riders(ids, followers)
    wanted = set(sent_ids(ids, followers))
    picked: list[bytes] = []
    tokens, sizes = array("Q"), array("Q")
    tok_all, size_all = token_sizes(job_dir / "tokens.bin")
    bound = job.retry_bound if job.retry_requested else None
    for pos, line in enumerate(lines(Path(job.requests_path or ""))):
        if request_custom_id(line) in wanted:
            if bound is not None:
                line = with_output_bound(line, bound)
            picked.append(line)
            tokens.append(tok_all[pos])
            # a row taken at prepare (a synchronous route's failed answer) was never planned: size 0
            sizes.append(len(line) if bound is not None or not size_all[pos] else size_all[pos])
    caps = Limits(
        token_limit=token_limit,
        row_limit=profile.split_row_limit,
        max_requests=profile.max_requests_per_batch,
        max_bytes=profile.max_batch_bytes,
    )
    chunks, _over = plan_chunks(tokens, sizes, caps)
    base = max(job.chunks, default=-1) + 1
    paths = write_chunk_files(iter(picked), chunks, set(), job_dir / "chunks", f"{job.job_id}-retry{base:04d}")
    out = []
    for i, (ch, p) in enumerate(zip(chunks, paths)):
        cids = [request_custom_id(picked[k]) for k in range(ch.start, ch.end)]
        cids += [f for x in cids for f in riding.get(x, ())]
        sources = {job.failed_rows[x]["chunk"] for x in cids if job.failed_rows[x].get("chunk") is not None}
        out.append(
            {
                "chunk": base + i,
                "source_chunks": sorted(sources),
                "custom_ids": cids,
                "requests": ch.requests,
                "input_tokens": ch.input_tokens,
                "bytes": ch.bytes,
                "path": str(p),
                "manual": job.retry_requested,
                **({"route": route} if route else {}),
            }
        )
    return out
