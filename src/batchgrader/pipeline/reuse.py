"""Which rows of a prepared job need a request, and which are answered already.

Decided once, when the job is prepared, from the request lines alone (pure, apart from the
``lookup`` of stored answers it is given):

* a row whose request key has a usable stored answer is **answered from the cache**: it gets
  that answer, with the token counts it was originally billed for, and is not sent;
* of the other rows, those whose request is identical to an earlier row's in the same file are
  **duplicates**: only the first (the *leader*) is sent, and its answer is copied to them when
  its chunk is merged;
* every other row is sent.

The engine records the decision as a ``RequestsReused`` event (with the file written here) in
the same transaction as ``JobPrepared``, before any chunk exists; see docs/events.md.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from array import array
from collections.abc import Callable, Container, Iterable, MutableSequence, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from batchgrader.core.log.answer_sources import ANSWERED_IN_JOB, DUPLICATE
from batchgrader.core.rules.decide import reuse_allowed
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.samples import sample_key
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks

Lookup = Callable[[Sequence[str]], dict[str, Any]]  # keys -> {key: StoredAnswer-like with .record(cid)}
#: the counting hook as the pipeline sees it: request lines -> (exact counts or None, what happened)
ExactCount = Callable[[list[bytes]], tuple[list[int] | None, dict[str, Any]]]


def counts_apply(prep: Any, positions: Sequence[int], counts: list[int] | None, counting: dict[str, Any] | None) -> bool:
    """Put exact counts (one per line at ``positions``: the rows that are sent) in place of
    ``prep.tokens``; True when they were applied.  Other rows (oversized, answered from the
    cache, duplicates) keep their local count: they are never sent."""
    from array import array

    if counts is None or counting is None:
        return False
    if len(positions) != len(counts):
        counting.update(exact=False, reason=f"{len(counts)} counts for {len(positions)} requests")
        return False
    tokens = array("Q", prep.tokens)
    for pos, n in zip(positions, counts, strict=True):
        tokens[pos] = n
    prep.tokens = tokens
    return True


@dataclass(frozen=True)
class StoredAnswer:
    """An answer a row may take instead of a request: one from the answers store
    (``store/answers.py``), or one the job paid for itself (its preflight's, its synchronous
    route's: ``ts`` names how, :mod:`batchgrader.core.log.answer_sources`)."""

    key: str
    content: str
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    job_id: str
    custom_id: str
    ts: str
    # a billed answer of this job that is not usable (truncated, refused on a synchronous route):
    # the row fails with it; never in the store
    error_code: str | None = None
    error_message: str | None = None


@dataclass
class ReusePlan:
    keep: MutableSequence[int] = field(default_factory=list)  # positions still to send, in order (an array('q') from ReuseProbe)
    cached: list[tuple[str, Any]] = field(default_factory=list)  # (custom_id, stored answer) of rows answered from the cache
    followers: dict[str, str] = field(default_factory=dict)  # duplicate custom_id -> its leader's custom_id
    cached_usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0}
    )

    @property
    def reused(self) -> bool:
        return bool(self.cached or self.followers)

    def lines(self) -> Iterable[bytes]:
        """The reuse file: one JSON array per line, ``["cache", custom_id, key, content, finish_reason,
        prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, answered_in]`` per cached
        row (``+ [how]`` for an answer of this job's preflight or route, ``+ [how, code, message]``
        for such an answer that is not usable) and ``["duplicate", custom_id, leader]`` per duplicate (see :func:`read_reuse_file`)."""
        dumps = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(..., ensure_ascii=False), one encoder
        for cid, a in self.cached:
            row = ["cache", cid, a.key, a.content, a.finish_reason, a.prompt_tokens, a.cached_tokens]
            row += [a.completion_tokens, a.reasoning_tokens, a.job_id, *_answered_by(a)]
            yield (dumps(row) + "\n").encode("utf-8")
        for cid, leader in self.followers.items():
            yield (dumps(["duplicate", cid, leader]) + "\n").encode("utf-8")

    def cached_records(self) -> list[dict[str, Any]]:
        return [
            _record(
                [
                    "cache",
                    cid,
                    a.key,
                    a.content,
                    a.finish_reason,
                    a.prompt_tokens,
                    a.cached_tokens,
                    a.completion_tokens,
                    a.reasoning_tokens,
                    a.job_id,
                    *_answered_by(a),
                ]
            )
            for cid, a in self.cached
        ]


def _answered_by(a: Any) -> list[str]:
    """The reuse file's optional last fields: how this job answered the row itself (``preflight``,
    ``flex``, ``online``: billed in this job), then the code and message of such an answer that
    is not usable (the row fails with them); nothing for an answer from the store."""
    if a.ts not in ANSWERED_IN_JOB and a.ts != DUPLICATE:
        return []
    return [a.ts, a.error_code, a.error_message] if getattr(a, "error_code", None) else [a.ts]


def _record(row: list[Any]) -> dict[str, Any]:
    """A cached row's result record (the shape of a merged chunk's results file)."""
    _, cid, key, content, finish, pt, ct, comp, rt, job, *how = row
    code, message = (how[1], how[2]) if len(how) >= 3 else (None, None)
    return {
        "custom_id": cid,
        "ok": code is None,
        "content": content,
        "status_code": 200,
        "error_code": code,
        "error_message": message,
        "prompt_tokens": pt,
        "cached_tokens": ct,
        "completion_tokens": comp,
        "reasoning_tokens": rt,
        "finish_reason": finish,
        "reused": how[0] if how and how[0] in (*ANSWERED_IN_JOB, DUPLICATE) else "cache",
        "key": key,
        "answered_in": job,
    }


def read_reuse_file(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """The reuse file back: (custom_id -> result record of each cached row, leader -> its duplicates)."""
    text = Path(path).read_text(encoding="utf-8")
    rows = json.loads("[" + ",".join(text.splitlines()) + "]") if text else []
    cached: dict[str, dict[str, Any]] = {}
    followers: dict[str, list[str]] = {}
    for row in rows:
        if row[0] == "cache":
            cached[row[1]] = _record(row)
        else:
            followers.setdefault(row[2], []).append(row[1])
    return cached, followers


BLOCK = 4096  # request lines keyed, looked up and deduplicated together


class _Leaders:
    """The request keys seen so far in a file, each with the custom id and position of its first
    row (the leader).  Memory stays small whatever the number of rows (a dict of a million keys
    took about 320-350 MB): in memory only a 64-bit fingerprint per key (``hash``) and an
    open-addressing table of int32 slots (16-24 bytes a key); the keys themselves, with their
    custom id and position, are appended to a private temporary SQLite database on disk, read
    back only to confirm a fingerprint match (a duplicate, or a rare fingerprint collision), so a
    row is called a duplicate only when its key is equal."""

    _M64 = (1 << 64) - 1

    def __init__(self) -> None:
        self.conn = sqlite3.connect("")  # "": a temporary database on disk, deleted when closed
        self.conn.execute("CREATE TABLE seen (n INTEGER PRIMARY KEY, key TEXT NOT NULL, cid TEXT NOT NULL, pos INTEGER NOT NULL)")
        self._fps = array("Q")  # fingerprint of the n-th key added
        self._slots = array("i", bytes(4 * 65536))  # n + 1 of the key in a slot, 0 for an empty one
        self._mask = 65535

    def _place(self, n: int, h: int) -> None:
        slots, mask = self._slots, self._mask
        i = h & mask
        while slots[i]:
            i = (i + 1) & mask
        slots[i] = n + 1

    def find(self, keys: Iterable[str]) -> dict[str, tuple[str, int]]:
        """key -> (leader's custom id, its position), for the keys seen before."""
        slots, fps, mask, m64 = self._slots, self._fps, self._mask, self._M64
        candidates: dict[int, set[str]] = {}  # n -> the keys it may be
        for key in keys:
            h = hash(key) & m64
            i = h & mask
            while s := slots[i]:
                if fps[s - 1] == h:
                    candidates.setdefault(s - 1, set()).add(key)
                i = (i + 1) & mask
        out: dict[str, tuple[str, int]] = {}
        ns = list(candidates)
        for j in range(0, len(ns), 500):
            part = ns[j : j + 500]
            sql = f"SELECT n, key, cid, pos FROM seen WHERE n IN ({','.join('?' * len(part))})"
            for n, key, cid, pos in self.conn.execute(sql, part):
                if key in candidates[n]:
                    out[key] = (cid, pos)
        return out

    def add(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Keys not seen before (each once), with their custom id and position."""
        fps, m64 = self._fps, self._M64
        batch = []
        for key, cid, pos in rows:
            n = len(fps)
            h = hash(key) & m64
            fps.append(h)
            if 2 * (n + 1) > self._mask + 1:
                self._grow()
            else:
                slots, mask = self._slots, self._mask
                i = h & mask
                while slots[i]:
                    i = (i + 1) & mask
                slots[i] = n + 1
            batch.append((n, key, cid, pos))
        self.conn.executemany("INSERT INTO seen (n, key, cid, pos) VALUES (?, ?, ?, ?)", batch)

    def _grow(self) -> None:
        size = 2 * (self._mask + 1)
        self._slots, self._mask = array("i", bytes(4 * size)), size - 1
        for n, h in enumerate(self._fps):
            self._place(n, h)

    def close(self) -> None:
        self.conn.close()


def plan_reuse(
    lines: Iterable[bytes], provider: str, skip: Container[int], lookup: Lookup | None, dedupe: bool = True
) -> ReusePlan:
    """The plan for the request lines of one job (every row, in position order).

    ``skip``: positions that are never sent (oversized); ``lookup``: stored answers by key, or
    None to use no stored answer; ``dedupe``: send identical requests within the file once.
    Lines are taken in blocks of :data:`BLOCK` (keyed, looked up, deduplicated), so memory holds
    one block, the positions to send and the rows reused, never a key per row.
    """
    positions: list[int] = []

    def kept() -> Iterable[bytes]:
        for pos, line in enumerate(lines):
            if pos not in skip:
                positions.append(pos)
                yield line

    plan = ReusePlan()
    keep = plan.keep
    usage = plan.cached_usage
    pt = ct = comp = rt = 0
    leaders = _Leaders() if dedupe else None
    pairs_iter = line_keys(provider, kept())
    try:
        while True:
            block = list(islice(pairs_iter, BLOCK))
            if not block:
                break
            block_pos, positions[:] = positions[: len(block)], positions[len(block) :]
            keys = [k for _, k in block]
            stored = lookup(keys) if lookup is not None else {}
            earlier = leaders.find(keys) if leaders is not None else {}
            new: dict[str, tuple[str, int]] = {}
            for pos, (cid, key) in zip(block_pos, block):
                answer = stored.get(key)
                if answer is not None:
                    plan.cached.append((cid, answer))
                    pt += answer.prompt_tokens
                    ct += answer.cached_tokens
                    comp += answer.completion_tokens
                    rt += answer.reasoning_tokens
                elif leaders is not None and (key in earlier or key in new):
                    plan.followers[cid] = (earlier.get(key) or new[key])[0]
                else:
                    new.setdefault(key, (cid, pos))
                    keep.append(pos)
            if leaders is not None:
                leaders.add((k, c, p) for k, (c, p) in new.items())
    finally:
        if leaders is not None:
            leaders.close()
    usage.update(prompt_tokens=pt, cached_tokens=ct, completion_tokens=comp, reasoning_tokens=rt)
    return plan


class ReuseProbe:
    """:func:`plan_reuse` decided while :func:`~batchgrader.pipeline.prepare.prepare` streams the
    rows: each block of request lines is keyed and looked up at once (one batched lookup per
    block), and prepare counts the tokens of the rows still to send only.  A row answered from
    the cache gets no token count (0, and size 0: it is never planned into a chunk); a duplicate
    gets its leader's count (the same request).  ``finish`` gives the same plan as
    ``plan_reuse(lines, provider, skip, lookup, dedupe)``, except that a row that is oversized
    but has a stored answer is answered from the cache rather than refused."""

    def __init__(self, provider: str, lookup: Lookup | None, dedupe: bool = True, on_send: Callable[[], None] | None = None):
        self.provider, self.lookup, self.dedupe = provider, lookup, dedupe
        self.on_send = on_send  # called once, at the first row found to need a request
        self._plan = ReusePlan(keep=array("q"))  # 8 bytes a row sent
        # the keys of the rows sent, with their custom_id and position: on disk, not a dict of
        # a million keys (about 320 bytes a row)
        self._leaders: _Leaders | None = _Leaders() if dedupe else None
        self._leader_pos: dict[int, int] = {}  # duplicate position -> its leader's position
        self._cached_pos: set[int] = set()
        self._positions: dict[str, int] = {}  # custom_id -> position, of duplicates
        self._pos = 0
        self._template: Any = None
        self._tried = False
        self._usage = [0, 0, 0, 0]

    def _keys(
        self, lines: Sequence[bytes], cids: Sequence[str] | None = None, contents: Sequence[str] | None = None
    ) -> list[tuple[str, str]]:
        from batchgrader.pipeline.answerkey import _Template, line_key

        if not self._tried and lines:
            self._tried = True
            self._template = _Template.build(self.provider, lines[0])
        t = self._template
        if t is not None and cids is not None and contents is not None and lines:
            # lines built from one template differ only in custom_id and content: key the
            # contents, after checking the block's first line gives the same key both ways
            if t.key(lines[0]) == (cids[0], sample_key(cids[0], t.content_key(contents[0]))):
                ck = t.content_key
                return [(cid, sample_key(cid, ck(c))) for cid, c in zip(cids, contents)]
        out = []
        for line in lines:
            got = t.key(line) if t is not None else None
            out.append(got if got is not None else line_key(self.provider, line))
        return out

    def block(
        self, lines: Sequence[bytes], cids: Sequence[str] | None = None, contents: Sequence[str] | None = None
    ) -> list[bool]:
        """The next rows' request lines (in order); for each, whether it is still to be sent.
        ``cids`` and ``contents`` (each line's custom_id and last message, when every line is
        built from one template) let the keys be computed without parsing the lines."""
        pairs = self._keys(lines, cids, contents)
        stored = self.lookup([k for _, k in pairs]) if self.lookup is not None else {}
        plan, usage = self._plan, self._usage
        earlier: dict[str, tuple[str, int]] = {}
        if self._leaders is not None:
            earlier = self._leaders.find([k for _, k in pairs if k not in stored])
        new: dict[str, tuple[str, int]] = {}  # this block's leaders
        send: list[bool] = []
        pos = self._pos
        for cid, key in pairs:
            answer = stored.get(key)
            if answer is not None:
                plan.cached.append((cid, answer))
                self._cached_pos.add(pos)
                usage[0] += answer.prompt_tokens
                usage[1] += answer.cached_tokens
                usage[2] += answer.completion_tokens
                usage[3] += answer.reasoning_tokens
                send.append(False)
            elif self.dedupe and (key in earlier or key in new):
                leader_cid, leader_pos = earlier.get(key) or new[key]
                plan.followers[cid] = leader_cid
                self._leader_pos[pos] = leader_pos
                self._positions[cid] = pos
                send.append(False)
            else:
                if self.dedupe:
                    new[key] = (cid, pos)
                plan.keep.append(pos)
                send.append(True)
            pos += 1
        self._pos = pos
        if self._leaders is not None and new:
            self._leaders.add((k, c, p) for k, (c, p) in new.items())
        if self.on_send is not None and len(plan.keep):
            on_send, self.on_send = self.on_send, None
            on_send()
        return send

    def leader_position(self, pos: int) -> int | None:
        """The position whose request a duplicate at ``pos`` repeats; None for a cached row."""
        return self._leader_pos.get(pos)

    def finish(self, skip: Container[int]) -> ReusePlan:
        """The plan, leaving out ``skip`` (oversized rows: never sent; their duplicates are
        oversized too and are reported with them)."""
        plan = self._plan
        if self._leaders is not None:
            self._leaders.close()
            self._leaders = None
        if skip:
            plan.keep = array("q", (p for p in plan.keep if p not in skip))
            # a row never sent (skip_empty) takes no stored answer either: plan.cached is in
            # position order, as the positions in _cached_pos
            dropped = [a for (_cid, a), pos in zip(plan.cached, sorted(self._cached_pos)) if pos in skip]
            if dropped:
                plan.cached = [ca for ca, pos in zip(plan.cached, sorted(self._cached_pos)) if pos not in skip]
                for a in dropped:
                    self._usage[0] -= a.prompt_tokens
                    self._usage[1] -= a.cached_tokens
                    self._usage[2] -= a.completion_tokens
                    self._usage[3] -= a.reasoning_tokens
        plan.followers = {c: leader for c, leader in plan.followers.items() if self._positions[c] not in skip}
        u = self._usage
        plan.cached_usage.update(prompt_tokens=u[0], cached_tokens=u[1], completion_tokens=u[2], reasoning_tokens=u[3])
        return plan


def replan(tokens: Sequence[int], sizes: Sequence[int], keep: Sequence[int], limits: Limits) -> list[Chunk]:
    """The chunk plan of the rows still to send.  Chunk positions (``start``/``end``) then count
    those rows only, in order: the chunk files are written from exactly these lines."""
    from array import array

    sub_tokens = array("Q", (tokens[i] for i in keep))
    sub_sizes = array("Q", (sizes[i] for i in keep))
    chunks, oversized = plan_chunks(sub_tokens, sub_sizes, limits)
    if oversized:  # cannot happen: the same limits already set every oversized row aside
        raise ValueError(f"{len(oversized)} rows became oversized when planned again")
    return chunks


def _replan_preview(
    prep: Any, plan: ReusePlan, counts: list[int] | None, counting: dict[str, Any] | None, limits: Limits
) -> None:
    """Plan the chunks of the rows left to send, on the exact counts when they apply (an exact
    count that puts a row over a cap keeps the local counts, and says so in ``counting``)."""
    local_tokens = prep.tokens
    if counts_apply(prep, plan.keep, counts, counting):
        try:
            prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits)
            return
        except ValueError as exc:  # an exact count put a row over a cap: keep the local plan, labelled
            prep.tokens = local_tokens
            assert counting is not None
            counting.update(exact=False, reason=f"exact counts do not fit the plan: {exc}")
    if plan.reused:
        prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits)


def _saved_usd(plan: ReusePlan, prices: Any, model: str) -> float:
    """What the stored answers cost when they were paid for (a duplicate's saving is known only
    once its leader is answered, so it is not counted here); 0 without a price."""
    from batchgrader.pipeline.pricing import PricingError, billed_cost

    try:
        price = prices.get(model)
    except PricingError:
        return 0.0
    u = plan.cached_usage
    return float(billed_cost(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"]))


def preview(
    path: Path,
    profile: Any,
    home: Any,
    *,
    prices: Any,
    provider: str,
    lookup: Lookup | None,
    limits: Limits | None = None,
    schema_overhead: float | None = None,
    count_exact: ExactCount | None = None,
) -> dict[str, Any]:
    """`bgctl count`: the summary of :func:`prepare` as the daemon would plan the job now, with
    ``reuse``: how many rows the stored answers and identical rows answer, and what that saves.

    ``count_exact`` (the counting hook, :mod:`batchgrader.provider.counting`) is given the request
    lines when the local count is only an estimate for the profile's provider; when it answers
    with a count for every line, those counts replace the local ones (``input_tokens_exact``)."""
    from batchgrader.pipeline.prepare import limits_for, prepare, unsent_positions

    enabled = reuse_allowed(profile)
    info: dict[str, Any] = {"enabled": enabled, "cached_rows": 0, "duplicate_rows": 0, "saved_usd": 0.0}
    if not enabled and count_exact is None:
        summary = prepare(path, profile, home, prices=prices, limits=limits).summary(prices, schema_overhead)
        summary["reuse"] = info
        return summary
    counts: list[int] | None = None
    counting: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as tmp:
        prep = prepare(path, profile, home, requests_out=tmp, prices=prices, limits=limits)
        skip = unsent_positions(prep)
        tmp.seek(0)
        plan = plan_reuse(tmp, provider, skip, lookup if enabled else None, dedupe=enabled)
        if count_exact is not None:
            tmp.seek(0)
            wanted = set(plan.keep)
            counts, counting = count_exact([line for pos, line in enumerate(tmp) if pos in wanted])
    window = profile.context_window
    if window is None and prices is not None:
        price = prices.find(profile.model)
        window = price.context_window if price else None
    _replan_preview(prep, plan, counts, counting, limits or limits_for(profile, window))
    summary = prep.summary(prices, schema_overhead)
    if counting is not None:
        summary["input_tokens_exact"] = bool(counting.get("exact"))
        summary["token_count"] = counting
    info["cached_rows"], info["duplicate_rows"] = len(plan.cached), len(plan.followers)
    if plan.reused and prices is not None:
        info["saved_usd"] = _saved_usd(plan, prices, profile.model)
    summary["reuse"] = info
    return summary


def apply_exact_counts(prep: Any, requests_path: Path, count_exact: ExactCount, limits: Limits) -> dict[str, Any]:
    """The daemon's planning with the provider's exact counts (the counting hook): every request
    that can be sent is counted (``count_exact``: lines -> counts or None, what happened), and when
    all are, their counts replace the local estimates and the chunks are planned again under
    ``limits`` (the same positions, so the chunk files are cut as before).  Counts that would
    change which rows fit at all are not applied (the plan keeps the estimates, and says so).
    Returns what happened, for ``InputTokensCounted``."""
    from batchgrader.pipeline.prepare import oversized_positions, unsent_positions

    skip = unsent_positions(prep)
    positions = [i for i in range(len(prep.tokens)) if i not in skip]
    with open(requests_path, "rb") as f:
        lines = [line for pos, line in enumerate(f) if pos not in skip]
    counts, info = count_exact(lines)
    local = prep.tokens
    if not counts_apply(prep, positions, counts, info):
        return info
    chunks, oversized = plan_chunks(prep.tokens, prep.sizes, limits, skip=prep.skipped)
    if {o.position for o in oversized} != oversized_positions(prep):
        prep.tokens = local
        info.update(exact=False, reason="the exact counts change which rows fit the limits; the plan keeps the estimates")
        return info
    prep.chunks = chunks
    return info
