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
import tempfile
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.core.decide import reuse_allowed
from batchgrader.pipeline.answerkey import line_keys
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks

Lookup = Callable[[Sequence[str]], dict[str, Any]]  # keys -> {key: StoredAnswer-like with .record(cid)}


@dataclass
class ReusePlan:
    keep: list[int] = field(default_factory=list)  # positions still to send, in order
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
        row and ``["duplicate", custom_id, leader]`` per duplicate (see :func:`read_reuse_file`)."""
        dumps = json.dumps
        for cid, a in self.cached:
            row = ["cache", cid, a.key, a.content, a.finish_reason, a.prompt_tokens, a.cached_tokens]
            row += [a.completion_tokens, a.reasoning_tokens, a.job_id]
            yield (dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        for cid, leader in self.followers.items():
            yield (dumps(["duplicate", cid, leader], ensure_ascii=False) + "\n").encode("utf-8")

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
                ]
            )
            for cid, a in self.cached
        ]


def _record(row: list[Any]) -> dict[str, Any]:
    """A cached row's result record (the shape of a merged chunk's results file)."""
    _, cid, key, content, finish, pt, ct, comp, rt, job = row
    return {
        "custom_id": cid,
        "ok": True,
        "content": content,
        "status_code": 200,
        "error_code": None,
        "error_message": None,
        "prompt_tokens": pt,
        "cached_tokens": ct,
        "completion_tokens": comp,
        "reasoning_tokens": rt,
        "finish_reason": finish,
        "reused": "cache",
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


def plan_reuse(
    lines: Iterable[bytes], provider: str, skip: Container[int], lookup: Lookup | None, dedupe: bool = True
) -> ReusePlan:
    """The plan for the request lines of one job (every row, in position order).

    ``skip``: positions that are never sent (oversized); ``lookup``: stored answers by key, or
    None to use no stored answer; ``dedupe``: send identical requests within the file once.
    """
    positions: list[int] = []

    def kept() -> Iterable[bytes]:
        for pos, line in enumerate(lines):
            if pos not in skip:
                positions.append(pos)
                yield line

    pairs = list(line_keys(provider, kept()))
    stored = lookup([k for _, k in pairs]) if lookup is not None else {}
    plan = ReusePlan()
    leaders: dict[str, str] = {}
    usage = plan.cached_usage
    pt = ct = comp = rt = 0
    for pos, (cid, key) in zip(positions, pairs):
        answer = stored.get(key)
        if answer is not None:
            plan.cached.append((cid, answer))
            pt += answer.prompt_tokens
            ct += answer.cached_tokens
            comp += answer.completion_tokens
            rt += answer.reasoning_tokens
        elif dedupe and key in leaders:
            plan.followers[cid] = leaders[key]
        else:
            leaders.setdefault(key, cid)
            plan.keep.append(pos)
    usage.update(prompt_tokens=pt, cached_tokens=ct, completion_tokens=comp, reasoning_tokens=rt)
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
) -> dict[str, Any]:
    """`bgctl count`: the summary of :func:`prepare` as the daemon would plan the job now, with
    ``reuse``: how many rows the stored answers and identical rows answer, and what that saves."""
    from batchgrader.pipeline.prepare import limits_for, oversized_positions, prepare
    from batchgrader.pipeline.pricing import PricingError, billed_cost

    enabled = reuse_allowed(profile)
    info: dict[str, Any] = {"enabled": enabled, "cached_rows": 0, "duplicate_rows": 0, "saved_usd": 0.0}
    if not enabled:
        summary = prepare(path, profile, home, prices=prices, limits=limits).summary(prices, schema_overhead)
        summary["reuse"] = info
        return summary
    with tempfile.TemporaryFile() as tmp:
        prep = prepare(path, profile, home, requests_out=tmp, prices=prices, limits=limits)
        tmp.seek(0)
        plan = plan_reuse(tmp, provider, oversized_positions(prep), lookup)
    if plan.reused:
        window = profile.context_window
        if window is None and prices is not None:
            price = prices.find(profile.model)
            window = price.context_window if price else None
        prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits or limits_for(profile, window))
    summary = prep.summary(prices, schema_overhead)
    info["cached_rows"], info["duplicate_rows"] = len(plan.cached), len(plan.followers)
    if plan.reused and prices is not None:
        try:
            price = prices.get(profile.model)
        except PricingError:
            pass
        else:
            u = plan.cached_usage
            # what the stored answers cost when they were paid for (a duplicate's saving is known
            # only once its leader is answered, so it is not counted here)
            info["saved_usd"] = float(billed_cost(price, u["prompt_tokens"], u["cached_tokens"], u["completion_tokens"]))
    summary["reuse"] = info
    return summary
