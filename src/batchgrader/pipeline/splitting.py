"""Split a job's requests into batches (chunks) and write the chunk JSONL files.

The input is two parallel integer sequences indexed by request *position* (0-based, in input
order): the exact prompt-token count of each request and the byte size of its JSONL line
*including the trailing newline*.  For a million-row file these are two ``array`` objects, never
request objects; planning builds their prefix sums (at C speed) and finds each chunk boundary by
bisection, so a million requests plan in a fraction of a second.

Rules (see :func:`plan_chunks`):

* A chunk closes when adding the next request would exceed the token limit, the row limit, the
  provider's request cap or the provider's byte cap.  Nothing is truncated, duplicated or
  reordered: the chunks' member positions, concatenated, are every non-oversized position in
  order.
* A request that cannot fit in *any* chunk (more tokens than the token limit, a line larger than
  the byte cap, or prompt + ``max_output_tokens`` over the model's context window) is reported as
  :class:`Oversized` with a readable reason, belongs to no chunk, and planning carries on.
* ``force_chunk_count=n`` gives ``n`` chunks of near-equal *input tokens*; the caps still win:
  if they need more than ``n`` chunks, there are exactly as many as they need.

Byte sizes are plain bytes; the provider's "200 MB" input-file cap is taken as the decimal
200,000,000 (the smaller reading of "MB").
"""

from __future__ import annotations

import heapq
import json
import os
import re
import tempfile
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Container, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate, compress
from pathlib import Path
from typing import Any

from batchgrader.fsio import TMP_PREFIX, fsync_dir, fsync_file

__all__ = [
    "Limits",
    "Chunk",
    "Oversized",
    "plan_chunks",
    "chunk_positions",
    "chunk_file_name",
    "write_chunk_files",
    "PROVIDER_MAX_REQUESTS",
    "PROVIDER_MAX_BYTES",
]

PROVIDER_MAX_REQUESTS = 50_000
PROVIDER_MAX_BYTES = 200_000_000


@dataclass(frozen=True)
class Limits:
    """Everything that bounds a chunk, plus the per-request context-window check.

    ``max_output_tokens`` is the request's output bound (the ``max_completion_tokens`` setting);
    it only matters together with ``context_window``: a request whose prompt tokens plus
    ``max_output_tokens`` exceed the window is oversized.  With ``context_window=None`` the
    window is not checked.
    """

    token_limit: int | None  # None: no token cap (the request-count and byte caps still apply)
    row_limit: int | None = None
    force_chunk_count: int | None = None
    max_requests: int = PROVIDER_MAX_REQUESTS
    max_bytes: int = PROVIDER_MAX_BYTES
    context_window: int | None = None
    max_output_tokens: int = 0
    # Setting named in the oversized message when a request exceeds ``token_limit`` (e.g.
    # "enqueued_token_limit" when the caller lowered the limit to a per-model queue cap).
    token_limit_name: str = "split_token_limit"

    def __post_init__(self) -> None:
        def positive(name: str, value: Any, optional: bool = False) -> None:
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be an integer >= 1{' or None' if optional else ''}, got {value!r}")

        positive("token_limit", self.token_limit, optional=True)
        positive("row_limit", self.row_limit, optional=True)
        positive("force_chunk_count", self.force_chunk_count, optional=True)
        positive("max_requests", self.max_requests)
        positive("max_bytes", self.max_bytes)
        positive("context_window", self.context_window, optional=True)
        mo = self.max_output_tokens
        if isinstance(mo, bool) or not isinstance(mo, int) or mo < 0:
            raise ValueError(f"Limits.max_output_tokens must be an integer >= 0, got {mo!r}")

    @property
    def requests_per_chunk(self) -> int:
        """The effective request cap of one chunk: the row limit or the provider cap, whichever is lower."""
        return self.max_requests if self.row_limit is None else min(self.row_limit, self.max_requests)

    @property
    def max_request_tokens(self) -> int | None:
        """Largest prompt a single request may have under the context-window rule (None: unchecked)."""
        if self.context_window is None:
            return None
        return self.context_window - self.max_output_tokens

    @classmethod
    def from_settings(cls, settings: Any, context_window: int | None = None) -> Limits:
        """Build limits from a config profile (anything with the config keys as attributes).

        ``context_window`` is used when the profile's own ``context_window`` is unset (the caller
        passes the pricing table's window for the model, if any).
        """
        cw = getattr(settings, "context_window", None)
        return cls(
            token_limit=settings.split_token_limit,
            row_limit=settings.split_row_limit,
            force_chunk_count=settings.force_chunk_count,
            max_requests=settings.max_requests_per_batch,
            max_bytes=settings.max_batch_bytes,
            context_window=cw if cw is not None else context_window,
            max_output_tokens=settings.max_completion_tokens,
        )


@dataclass(frozen=True)
class Chunk:
    """One batch: the requests at positions ``[start, end)`` except the oversized ones in that range.

    ``start`` is the first member's position and ``end`` is one past the last member's, so
    ``requests`` (the member count) is ``end - start`` minus the oversized positions inside.
    """

    index: int
    start: int
    end: int
    requests: int
    input_tokens: int
    bytes: int


@dataclass(frozen=True)
class Oversized:
    """A request that fits in no chunk.  ``kind`` is the first violated rule
    (``token_limit``, ``context_window`` or ``byte_limit``); ``reason`` names every violated rule."""

    position: int
    tokens: int
    bytes: int
    reason: str
    kind: str


#: The token cap used when ``Limits.token_limit`` is None (more than any file can hold).
UNCAPPED = 1 << 62


def _n(x: int) -> str:
    return f"{x:,}"


def _oversized(position: int, t: int, b: int, limits: Limits) -> Oversized:
    kinds: list[str] = []
    reasons: list[str] = []
    if limits.token_limit is not None and t > limits.token_limit:
        kinds.append("token_limit")
        reasons.append(f"request has {_n(t)} input tokens, over the {limits.token_limit_name} of {_n(limits.token_limit)}")
    cap = limits.max_request_tokens
    if cap is not None and t > cap:
        kinds.append("context_window")
        reasons.append(
            f"request has {_n(t)} input tokens + max_completion_tokens {_n(limits.max_output_tokens)}"
            f" = {_n(t + limits.max_output_tokens)}, over the model's context window of {_n(limits.context_window or 0)}"
        )
    if b > limits.max_bytes:
        kinds.append("byte_limit")
        reasons.append(f"request line is {_n(b)} bytes, over the batch input-file cap of {_n(limits.max_bytes)} bytes")
    return Oversized(position=position, tokens=t, bytes=b, reason="; ".join(reasons), kind=kinds[0])


# --- planning core ---------------------------------------------------------------------------
# The eligible (non-oversized) requests are indexed 0..m-1.  ``pt``/``pb`` are their prefix sums
# of tokens/bytes (length m+1, ``pt[0] == 0``), built at C speed; a chunk boundary is then found
# with a bisection, so a plan costs O(m) in C plus O(chunks x log m) in Python.  A partition is a
# list of boundaries ``[0, b1, ..., m]``.


def _greedy(
    pt: Sequence[int], pb: Sequence[int], m: int, tcap: int, rcap: int, bcap: int, stop_after: int | None = None
) -> list[int]:
    """Fill each chunk as far as every cap allows (every single request must fit on its own).

    This gives the fewest chunks the caps allow.  With ``stop_after`` it gives up (returning a
    partial list) once it has made more than that many chunks.
    """
    bounds = [0]
    s = 0
    while s < m:
        e = min(
            bisect_right(pt, pt[s] + tcap, s + 1, m + 1) - 1,
            bisect_right(pb, pb[s] + bcap, s + 1, m + 1) - 1,
            s + rcap,
        )
        bounds.append(e)
        s = e
        if stop_after is not None and len(bounds) - 1 > stop_after:
            break
    return bounds


def _greedy_chunks(
    etok: Sequence[int], esize: Sequence[int], epos: Sequence[int], tcap: int, rcap: int, bcap: int
) -> list[Chunk]:
    """The chunks of :func:`_greedy` in one pass over the eligible requests (each fits alone)."""
    chunks: list[Chunk] = []
    a = tokens = size = 0
    for z, (t, b) in enumerate(zip(etok, esize)):
        if z > a and (tokens + t > tcap or size + b > bcap or z - a >= rcap):
            chunks.append(Chunk(len(chunks), epos[a], epos[z - 1] + 1, z - a, tokens, size))
            a, tokens, size = z, 0, 0
        tokens += t
        size += b
    chunks.append(Chunk(len(chunks), epos[a], epos[len(etok) - 1] + 1, len(etok) - a, tokens, size))
    return chunks


def _midpoint_split(pt: Sequence[int], m: int, k: int) -> list[int]:
    """Split into exactly ``k`` non-empty parts (``1 <= k <= m``) of near-equal tokens.

    Request ``i`` (with ``P`` tokens before it and ``w`` of its own) goes to the part holding the
    midpoint of its token span: part ``floor(k * (P + w/2) / T)``.  Then boundaries are nudged
    apart so no part is empty.  If every request has 0 tokens, requests are balanced by count.

    Bound: with ``W = max(w)``, every part has ``|tokens - T/k| <= W``.  Proof sketch:

    * A raw part ``j`` holds the requests whose midpoints lie in ``[jT/k, (j+1)T/k)``; their
      spans start at ``>= jT/k - W/2`` and end at ``< (j+1)T/k + W/2``, so the part has
      ``< T/k + W`` tokens, and it covers that interval except at most half a request at each
      end, so ``> T/k - W``.
    * A raw part is empty only if two neighbouring midpoints are ``>= T/k`` apart, i.e. some
      ``w >= T/k``; the last part is squeezed only if the last request's half exceeds ``T/k``.
      Without such a request no boundary moves.  With one, ``T/k - W <= 0`` and the lower bound
      is trivial, and moving boundaries only ever turns a part into a single request (``<= W``)
      or a sub-range of its raw part, so the upper bound still holds.
    """
    total = pt[m]
    idx = range(m)
    if total == 0:
        two_t = 2 * m

        def key(i: int) -> int:
            return k * (2 * i + 1)
    else:
        two_t = 2 * total

        def key(i: int) -> int:
            return k * (pt[i] + pt[i + 1])  # k * 2 * midpoint of request i

    bounds = [0]
    for j in range(1, k):
        bounds.append(bisect_left(idx, j * two_t, bounds[-1], m, key=key))
    bounds.append(m)
    for j in range(1, k):  # no empty parts: push forward, then pull back so the tail has room
        if bounds[j] <= bounds[j - 1]:
            bounds[j] = bounds[j - 1] + 1
    for j in range(1, k):
        bounds[j] = min(bounds[j], m - (k - j))
    return bounds


def _fits(bounds: list[int], pt: Sequence[int], pb: Sequence[int], tcap: int, rcap: int, bcap: int) -> bool:
    for a, z in zip(bounds, bounds[1:]):
        if pt[z] - pt[a] > tcap or pb[z] - pb[a] > bcap or z - a > rcap:
            return False
    return True


def _forced(pt: Sequence[int], pb: Sequence[int], m: int, k: int, tcap: int, rcap: int, bcap: int, widest: int) -> list[int]:
    """Exactly ``k`` chunks (``1 <= k <= m``, ``k`` >= the greedy count), balanced by tokens.

    First the midpoint split; if that breaks a cap, the partition into ``k`` chunks that
    minimises the largest chunk's tokens under the caps (bisection on that bound, each probe a
    greedy count), then chunks are halved (largest first) until there are ``k``.
    """
    bounds = _midpoint_split(pt, m, k)
    if _fits(bounds, pt, pb, tcap, rcap, bcap):
        return bounds
    # Smallest token bound B <= tcap whose greedy partition (under all caps) has <= k chunks.
    # Any partition into k chunks has one with >= ceil(T/k) tokens, and B >= the largest request.
    lo = max(-(-pt[m] // k), widest, 1)
    hi = tcap  # feasible: the greedy count under the caps alone is <= k
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy(pt, pb, m, mid, rcap, bcap, stop_after=k)) - 1 <= k:
            hi = mid
        else:
            lo = mid + 1
    bounds = _greedy(pt, pb, m, hi, rcap, bcap)
    if len(bounds) - 1 < k:
        bounds = _split_up(bounds, pt, k)
    return bounds


def _split_up(bounds: list[int], pt: Sequence[int], k: int) -> list[int]:
    """Halve the part with the most tokens (among parts of >= 2 requests) until there are ``k``."""
    heap = [(-(pt[z] - pt[a]), a, z) for a, z in zip(bounds, bounds[1:])]
    heapq.heapify(heap)
    singles: list[tuple[int, int]] = []
    while len(heap) + len(singles) < k:
        _, a, z = heapq.heappop(heap)
        if z - a < 2:
            singles.append((a, z))
            continue
        # cut at the token midpoint, keeping both halves non-empty
        half = (pt[a] + pt[z]) // 2
        c = min(max(bisect_left(pt, half, a + 1, z), a + 1), z - 1)
        heapq.heappush(heap, (-(pt[c] - pt[a]), a, c))
        heapq.heappush(heap, (-(pt[z] - pt[c]), c, z))
    cuts = sorted({a for _, a, _ in heap} | {a for a, _ in singles})
    return cuts + [bounds[-1]]


def plan_chunks(
    tokens: Sequence[int], sizes: Sequence[int], limits: Limits, skip: AbstractSet[int] = frozenset()
) -> tuple[list[Chunk], list[Oversized]]:
    """Plan the chunks of one job.

    Positions in ``skip`` (requests that are never sent: ``skip_empty``) are in no chunk and
    are not reported as oversized.

    ``tokens[i]`` is request ``i``'s prompt tokens; ``sizes[i]`` the bytes of its JSONL line
    including the newline.  Returns the chunks (indexes ``0..k-1``, in position order, none
    empty) and the oversized requests (in position order).

    Without ``force_chunk_count`` the split is greedy: a chunk takes requests until the next one
    would break a cap.  That gives the fewest chunks the caps allow (call it ``g``).

    With ``force_chunk_count=n`` there are exactly ``max(n, g)`` chunks, or one per request when
    there are fewer than ``n`` eligible requests; so the count is larger than ``n`` only when the
    caps require it.  The chunks are balanced by input tokens: a request goes to the chunk that
    holds the midpoint of its token span, which puts every chunk within ``max request tokens``
    of the mean.  If that split breaks a cap (caps nearly binding), the chunks are instead the
    ``max(n, g)``-chunk partition with the smallest possible largest chunk under the caps.
    """
    n = len(tokens)
    if len(sizes) != n:
        raise ValueError(f"tokens has {n} entries but sizes has {len(sizes)}")
    tcap = limits.token_limit if limits.token_limit is not None else UNCAPPED
    bcap = limits.max_bytes
    rcap = limits.requests_per_chunk
    single_tcap = tcap
    if limits.max_request_tokens is not None:
        single_tcap = min(tcap, limits.max_request_tokens)

    oversized: list[Oversized] = []
    if n and (min(tokens) < 0 or min(sizes) < 0):
        raise ValueError("token counts and sizes must be >= 0")
    epos: Sequence[int]
    if n == 0 or (not skip and max(tokens) <= single_tcap and max(sizes) <= bcap):
        # Fast path: nothing oversized, eligible index == position.
        etok, esize, epos = tokens, sizes, range(n)
    else:
        bad = [i for i, (t, b) in enumerate(zip(tokens, sizes)) if (t > single_tcap or b > bcap) and i not in skip]
        oversized = [_oversized(i, tokens[i], sizes[i], limits) for i in bad]
        keep = bytearray(b"\x01") * n
        for i in bad:
            keep[i] = 0
        for i in skip:
            if 0 <= i < n:
                keep[i] = 0
        etok = array("Q", compress(tokens, keep))
        esize = array("Q", compress(sizes, keep))
        epos = array("Q", compress(range(n), keep))
    m = len(etok)
    if m == 0:
        return [], oversized
    if limits.force_chunk_count is None:  # one pass, no prefix sums (16 bytes a row fewer)
        return _greedy_chunks(etok, esize, epos, tcap, rcap, bcap), oversized
    pt = array("Q", accumulate(etok, initial=0))
    pb = array("Q", accumulate(esize, initial=0))

    bounds = _greedy(pt, pb, m, tcap, rcap, bcap)
    want = limits.force_chunk_count
    if want is not None:
        bounds = _forced(pt, pb, m, min(max(want, len(bounds) - 1), m), tcap, rcap, bcap, max(etok))

    chunks = [
        Chunk(index=idx, start=epos[a], end=epos[z - 1] + 1, requests=z - a, input_tokens=pt[z] - pt[a], bytes=pb[z] - pb[a])
        for idx, (a, z) in enumerate(zip(bounds, bounds[1:]))
    ]
    return chunks, oversized


def chunk_positions(chunk: Chunk, oversized_positions: Container[int]) -> Iterator[int]:
    """The member positions of ``chunk`` in order (its range minus oversized positions).

    Pass a ``set`` (or other fast container) of the oversized positions.
    """
    for pos in range(chunk.start, chunk.end):
        if pos not in oversized_positions:
            yield pos


# --- writing chunk files ----------------------------------------------------------------------


def chunk_file_name(prefix: str, index: int) -> str:
    """File name of chunk ``index``, numbered as the tables (`count`, `split`, `status JOB`) and
    the events number chunks, from 0: ``{prefix}-chunk-0000.jsonl`` is chunk 0."""
    return f"{prefix}-chunk-{index:04d}.jsonl"


def _skip_to(it: Iterator[bytes], pos: int, chunk: Chunk, oversized_positions: Container[int]) -> int:
    """Consume the lines before ``chunk`` (they must all be oversized ones); the chunk's start."""
    while pos < chunk.start:
        if next(it, None) is None:
            raise ValueError(f"lines ended at position {pos}, before chunk {chunk.index} (starts at {chunk.start})")
        if pos not in oversized_positions:
            raise ValueError(f"position {pos} is in no chunk and not oversized")
        pos += 1
    return pos


def _write_chunk(fd: int, it: Iterator[bytes], pos: int, chunk: Chunk, oversized_positions: Container[int]) -> int:
    """Write ``chunk``'s lines (oversized ones skipped) to the open file ``fd`` and fsync it; check
    the count and bytes against the plan; the position after the chunk."""
    written = 0
    count = 0
    with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
        while pos < chunk.end:
            line = next(it, None)
            if line is None:
                raise ValueError(f"lines ended at position {pos}, inside chunk {chunk.index} (ends at {chunk.end})")
            if pos not in oversized_positions:
                if not line.endswith(b"\n"):
                    line += b"\n"
                if b"\n" in line[:-1]:
                    raise ValueError(f"line at position {pos} contains a newline inside the JSON")
                fh.write(line)
                written += len(line)
                count += 1
            pos += 1
        fh.flush()
        fsync_file(fh.fileno())
    if count != chunk.requests or written != chunk.bytes:
        raise ValueError(
            f"chunk {chunk.index}: wrote {count} lines / {written} bytes but the plan says "
            f"{chunk.requests} lines / {chunk.bytes} bytes (sizes must count each line with its newline)"
        )
    return pos


def write_chunk_files(
    lines: Iterable[bytes],
    chunks: Sequence[Chunk],
    oversized_positions: Container[int],
    out_dir: str | os.PathLike[str],
    name_prefix: str,
) -> list[Path]:
    """Write one JSONL file per chunk and return their paths (in chunk order).

    ``lines`` yields every request's JSONL line in position order (oversized ones included; they
    are skipped) and is consumed once.  A line may or may not end in ``\\n``; one is added if
    missing.  Each chunk's bytes must equal ``chunk.bytes`` from the plan (so the byte cap the
    plan enforced really holds); a mismatch, a line with an embedded newline, or a line count
    that does not match the plan raises ``ValueError`` and leaves no chunk file behind.

    Files are written to temporary names in ``out_dir`` and fsynced; only when every chunk is
    written are they renamed into place (replacing files of the same name) and the directory
    fsynced.
    """
    if not name_prefix or "/" in name_prefix or "\\" in name_prefix or name_prefix in (".", ".."):
        raise ValueError(f"name_prefix must be a plain file-name prefix, got {name_prefix!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    finals = [out / chunk_file_name(name_prefix, c.index) for c in chunks]
    temps: list[Path] = []
    it = iter(lines)
    pos = 0
    try:
        for chunk in chunks:
            if chunk.start < pos:
                raise ValueError(
                    f"chunk {chunk.index} starts at position {chunk.start}, before position {pos}: chunks overlap or are out of order"
                )
            pos = _skip_to(it, pos, chunk, oversized_positions)
            fd, tmp_name = tempfile.mkstemp(dir=out, prefix=f"{TMP_PREFIX}{name_prefix}-chunk-", suffix=".jsonl.tmp")
            temps.append(Path(tmp_name))
            pos = _write_chunk(fd, it, pos, chunk, oversized_positions)
        # Trailing lines after the last chunk must all be oversized.
        for _line in it:
            if pos not in oversized_positions:
                raise ValueError(f"position {pos} is in no chunk and not oversized")
            pos += 1
        for tmp, final in zip(temps, finals):
            os.replace(tmp, final)
        temps.clear()
        fsync_dir(out)
    finally:
        for tmp in temps:
            try:
                tmp.unlink()
            except FileNotFoundError:
                pass
    return finals


_CUSTOM_ID = re.compile(rb'^\{"custom_id":("(?:[^"\\]|\\.)*")')


def request_custom_id(line: bytes) -> str:
    """The custom_id of a request line (read from the start of the line when it is there, as
    the daemon writes it; otherwise the line is parsed)."""
    m = _CUSTOM_ID.match(line)
    return str(json.loads(m.group(1)) if m else json.loads(line)["custom_id"])


def custom_ids_in(path: Path) -> list[str]:
    """The custom_ids of a chunk's request file, in its order."""
    with open(path, "rb") as f:
        return [request_custom_id(line) for line in f]
