"""Chunk planning and chunk-file writing."""

from __future__ import annotations

import json
import time
from array import array
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchgrader.core.configuration.config import load_config
from batchgrader.pipeline.splitting import (
    PROVIDER_MAX_BYTES,
    PROVIDER_MAX_REQUESTS,
    Chunk,
    Limits,
    chunk_file_name,
    chunk_positions,
    plan_chunks,
    write_chunk_files,
)

# --- helpers ------------------------------------------------------------------------------------


def members(chunks, oversized) -> list[int]:
    skip = {o.position for o in oversized}
    return [p for c in chunks for p in chunk_positions(c, skip)]


def fits_alone(t: int, b: int, lim: Limits) -> bool:
    if t > lim.token_limit or b > lim.max_bytes:
        return False
    return lim.context_window is None or t + lim.max_output_tokens <= lim.context_window


def check_invariants(tokens, sizes, lim: Limits, chunks, oversized) -> None:
    """Everything that must hold for any input."""
    n = len(tokens)
    over = [o.position for o in oversized]
    over_set = set(over)
    # oversized: in order, unique, each really too big, with its figures
    assert over == sorted(over_set)
    for o in oversized:
        assert not fits_alone(tokens[o.position], sizes[o.position], lim)
        assert (o.tokens, o.bytes) == (tokens[o.position], sizes[o.position])
        assert o.reason and o.kind in ("token_limit", "context_window", "byte_limit")
    # every request that fits alone is in exactly one chunk, in order; nothing else is
    eligible = [p for p in range(n) if p not in over_set]
    assert all(fits_alone(tokens[p], sizes[p], lim) for p in eligible)
    assert members(chunks, oversized) == eligible
    # chunk bookkeeping and caps
    assert [c.index for c in chunks] == list(range(len(chunks)))
    cap_rows = lim.max_requests if lim.row_limit is None else min(lim.row_limit, lim.max_requests)
    prev_end = 0
    for c in chunks:
        pos = list(chunk_positions(c, over_set))
        assert pos, "empty chunk"
        assert pos[0] == c.start and pos[-1] == c.end - 1 and c.start >= prev_end
        prev_end = c.end
        assert c.requests == len(pos)
        assert c.input_tokens == sum(tokens[p] for p in pos)
        assert c.bytes == sum(sizes[p] for p in pos)
        assert c.input_tokens <= lim.token_limit
        assert c.requests <= cap_rows
        assert c.bytes <= lim.max_bytes


def _ok_to_add(c: Chunk, t: int, b: int, lim: Limits) -> bool:
    cap_rows = lim.max_requests if lim.row_limit is None else min(lim.row_limit, lim.max_requests)
    return c.input_tokens + t <= lim.token_limit and c.bytes + b <= lim.max_bytes and c.requests + 1 <= cap_rows


# --- strategies ---------------------------------------------------------------------------------


@st.composite
def cases(draw, force: bool | None = None):
    n = draw(st.integers(0, 120))
    big = draw(st.booleans())  # sometimes allow requests that are oversized
    tokens = draw(st.lists(st.integers(0, 80 if big else 30), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(1, 90 if big else 30), min_size=n, max_size=n))
    if force is None:
        fcc = draw(st.none() | st.integers(1, 40))
    elif force:
        fcc = draw(st.integers(1, 40))
    else:
        fcc = None
    lim = Limits(
        token_limit=draw(st.integers(1, 200)),
        row_limit=draw(st.none() | st.integers(1, 25)),
        force_chunk_count=fcc,
        max_requests=draw(st.integers(1, 40)),
        max_bytes=draw(st.integers(1, 300)),
        context_window=draw(st.none() | st.integers(1, 120)),
        max_output_tokens=draw(st.integers(0, 60)),
    )
    return tokens, sizes, lim


PROPS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- properties ---------------------------------------------------------------------------------


@settings(PROPS, max_examples=200)
@given(cases())
def test_plan_properties_for_any_input(case):
    """One drawn case, every property of the plan (drawing a case costs far more than planning
    it): any input keeps the invariants and plans the same from arrays; without a forced count a
    chunk closes only when the next request would break a cap; with one there are n chunks, or
    what the caps need.  200 examples, about half of them forced (the fast suite's one-minute
    budget; CI runs them on every push)."""
    tokens, sizes, lim = case
    chunks, oversized = plan_chunks(tokens, sizes, lim)
    check_invariants(tokens, sizes, lim, chunks, oversized)
    assert plan_chunks(array("I", tokens), array("Q", sizes), lim) == (chunks, oversized)
    if lim.force_chunk_count is None:
        over = {o.position for o in oversized}
        for c, nxt in zip(chunks, chunks[1:]):
            p = nxt.start
            assert p not in over
            assert not _ok_to_add(c, tokens[p], sizes[p], lim)
    else:
        unforced, _ = plan_chunks(tokens, sizes, replace(lim, force_chunk_count=None))
        eligible = len(tokens) - len(oversized)
        n = lim.force_chunk_count
        # at least n (or one per request when there are fewer), more only when the caps need it
        assert len(chunks) == max(min(n, eligible), len(unforced))
        if eligible < n and len(unforced) <= eligible:
            assert all(c.requests == 1 for c in chunks)


def assert_balanced(chunks, k: int, w: int) -> None:
    """Every chunk is within the largest request's tokens ``w`` of the mean: |tokens - T/k| <= w.

    (Proof in ``batchgrader.splitting._balanced``.)  Integer form: |tokens*k - T| <= w*k.
    """
    total = sum(c.input_tokens for c in chunks)
    assert len(chunks) == k
    for c in chunks:
        assert abs(c.input_tokens * k - total) <= w * k, (c, total, k, w)


@PROPS
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=300),
    st.integers(1, 60),
)
def test_force_chunk_count_balances_tokens_when_caps_do_not_bind(tokens, n):
    sizes = [1] * len(tokens)
    lim = Limits(token_limit=10**9, force_chunk_count=n, max_requests=10**6, max_bytes=10**9)
    chunks, oversized = plan_chunks(tokens, sizes, lim)
    assert not oversized
    check_invariants(tokens, sizes, lim, chunks, oversized)
    k = min(n, len(tokens))
    assert len(chunks) == k
    assert_balanced(chunks, k, max(tokens))
    if sum(tokens) == 0:  # nothing to balance by tokens: balanced by count
        counts = [c.requests for c in chunks]
        assert max(counts) - min(counts) <= 1


def min_max_tokens(tokens, sizes, lim: Limits, k: int) -> int:
    """Brute force: the smallest possible largest-chunk token count over partitions of the
    requests into at most ``k`` chunks that respect every cap."""
    m = len(tokens)
    cap_rows = lim.max_requests if lim.row_limit is None else min(lim.row_limit, lim.max_requests)
    inf = float("inf")
    # best[j][i]: min over partitions of the first i requests into j chunks of the largest chunk
    best = [[inf] * (m + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(1, m + 1):
            t = b = 0
            for s in range(i - 1, -1, -1):  # last chunk = requests s..i-1
                t += tokens[s]
                b += sizes[s]
                if t > lim.token_limit or b > lim.max_bytes or i - s > cap_rows:
                    break
                if best[j - 1][s] < inf:
                    best[j][i] = min(best[j][i], max(best[j - 1][s], t))
    return min(best[j][m] for j in range(1, k + 1))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=24),
    st.integers(1, 12),
    st.integers(40, 150),
    st.none() | st.integers(1, 8),
    st.integers(40, 200),
)
def test_forced_split_is_balanced_or_min_max_optimal(reqs, n, token_limit, row_limit, max_bytes):
    """When caps bind, the forced split's largest chunk is no worse than the best possible
    partition into that many chunks; when they do not, it is within W of the mean."""
    tokens = [t for t, _ in reqs]
    sizes = [b for _, b in reqs]
    lim = Limits(token_limit=token_limit, row_limit=row_limit, force_chunk_count=n, max_bytes=max_bytes)
    chunks, oversized = plan_chunks(tokens, sizes, lim)
    assert not oversized
    check_invariants(tokens, sizes, lim, chunks, oversized)
    k = len(chunks)
    total, w = sum(tokens), max(tokens)
    largest = max(c.input_tokens for c in chunks)
    assert largest * k <= max(min_max_tokens(tokens, sizes, lim, k) * k, total + w * k)


# --- examples -----------------------------------------------------------------------------------


def test_120000_tiny_requests_make_3_chunks_and_lose_nothing(tmp_path: Path):
    n = 120_000
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST"}).encode() + b"\n" for i in range(n)]
    tokens = array("I", [7] * n)
    sizes = array("Q", [len(x) for x in lines])
    chunks, oversized = plan_chunks(tokens, sizes, Limits(token_limit=500_000))
    assert not oversized
    assert [(c.start, c.end, c.requests) for c in chunks] == [
        (0, 50_000, 50_000),
        (50_000, 100_000, 50_000),
        (100_000, 120_000, 20_000),
    ]
    assert sum(c.input_tokens for c in chunks) == 7 * n
    paths = write_chunk_files(iter(lines), chunks, set(), tmp_path, "job1")
    ids = [json.loads(line)["custom_id"] for p in paths for line in p.read_bytes().splitlines()]
    assert ids == [f"r{i}" for i in range(n)]  # every row once, in order: nothing truncated at 50,000
    assert [len(p.read_bytes().splitlines()) for p in paths] == [50_000, 50_000, 20_000]


def test_token_limit_closes_chunks():
    chunks, _ = plan_chunks([3, 3, 3, 3, 1], [1] * 5, Limits(token_limit=6))
    assert [(c.start, c.end, c.input_tokens) for c in chunks] == [(0, 2, 6), (2, 4, 6), (4, 5, 1)]


def test_row_limit_and_request_cap_whichever_is_lower():
    chunks, _ = plan_chunks([1] * 7, [1] * 7, Limits(token_limit=100, row_limit=3))
    assert [c.requests for c in chunks] == [3, 3, 1]
    chunks, _ = plan_chunks([1] * 7, [1] * 7, Limits(token_limit=100, row_limit=5, max_requests=2))
    assert [c.requests for c in chunks] == [2, 2, 2, 1]


def test_byte_cap_closes_chunks():
    chunks, _ = plan_chunks([1] * 4, [60, 50, 40, 100], Limits(token_limit=100, max_bytes=110))
    assert [(c.start, c.end, c.bytes) for c in chunks] == [(0, 2, 110), (2, 3, 40), (3, 4, 100)]


def test_exactly_at_the_limits_fits():
    chunks, oversized = plan_chunks([500_000], [PROVIDER_MAX_BYTES], Limits(token_limit=500_000))
    assert not oversized and len(chunks) == 1


def test_oversized_request_is_reported_and_planning_continues():
    tokens = [10, 612_003, 20, 30]
    chunks, oversized = plan_chunks(tokens, [5, 5, 5, 5], Limits(token_limit=500_000))
    assert len(oversized) == 1
    o = oversized[0]
    assert (o.position, o.tokens, o.bytes, o.kind) == (1, 612_003, 5, "token_limit")
    assert o.reason == "request has 612,003 input tokens, over the split_token_limit of 500,000"
    assert len(chunks) == 1
    c = chunks[0]
    assert (c.start, c.end, c.requests, c.input_tokens, c.bytes) == (0, 4, 3, 60, 15)
    assert list(chunk_positions(c, {1})) == [0, 2, 3]
    _, oversized = plan_chunks(tokens, [5] * 4, Limits(token_limit=90_000, token_limit_name="enqueued_token_limit"))
    assert oversized[0].reason == "request has 612,003 input tokens, over the enqueued_token_limit of 90,000"


def test_oversized_by_bytes_and_by_context_window():
    lim = Limits(token_limit=1000, max_bytes=100, context_window=128_000 // 1000, max_output_tokens=28)
    # window 128, output 28: a prompt may have at most 100 tokens
    tokens = [100, 101, 5, 2000]
    sizes = [10, 10, 101, 10]
    chunks, oversized = plan_chunks(tokens, sizes, lim)
    assert [(o.position, o.kind) for o in oversized] == [(1, "context_window"), (2, "byte_limit"), (3, "token_limit")]
    assert (
        oversized[0].reason
        == "request has 101 input tokens + max_completion_tokens 28 = 129, over the model's context window of 128"
    )
    assert oversized[1].reason == "request line is 101 bytes, over the batch input-file cap of 100 bytes"
    # a request breaking several rules names them all
    assert "split_token_limit" in oversized[2].reason and "context window" in oversized[2].reason
    assert [(c.start, c.end, c.requests) for c in chunks] == [(0, 1, 1)]


def test_all_oversized_gives_no_chunks():
    chunks, oversized = plan_chunks([5, 6], [1, 1], Limits(token_limit=4))
    assert chunks == [] and [o.position for o in oversized] == [0, 1]


def test_empty_input():
    assert plan_chunks([], [], Limits(token_limit=1)) == ([], [])
    assert plan_chunks([], [], Limits(token_limit=1, force_chunk_count=3)) == ([], [])


def test_force_chunk_count_examples():
    lim = Limits(token_limit=1000, force_chunk_count=3)
    chunks, _ = plan_chunks([10] * 10, [1] * 10, lim)
    assert [c.requests for c in chunks] == [3, 4, 3]
    assert [c.input_tokens for c in chunks] == [30, 40, 30]
    # fewer requests than n: one chunk per request
    chunks, _ = plan_chunks([10, 20], [1, 1], Limits(token_limit=1000, force_chunk_count=5))
    assert [(c.start, c.end) for c in chunks] == [(0, 1), (1, 2)]
    # one heavy request gets a chunk of its own; the rest are shared out
    chunks, _ = plan_chunks([1, 1, 100, 1, 1, 1], [1] * 6, Limits(token_limit=1000, force_chunk_count=3))
    assert len(chunks) == 3 and all(c.requests for c in chunks)
    assert [c.input_tokens for c in chunks].count(100) == 1


def test_force_chunk_count_yields_to_caps():
    # 12 x 100 tokens, limit 300 -> at least 4 chunks even though 2 were asked for, and they are even
    lim = Limits(token_limit=300, force_chunk_count=2)
    chunks, _ = plan_chunks([100] * 12, [1] * 12, lim)
    assert [c.input_tokens for c in chunks] == [300, 300, 300, 300]
    # the 50,000 cap wins too
    chunks, _ = plan_chunks([1] * 120_000, [1] * 120_000, Limits(token_limit=10**9, force_chunk_count=2))
    assert len(chunks) == 3 and [c.requests for c in chunks] == [40_000, 40_000, 40_000]


def test_force_chunk_count_is_deterministic_and_balanced_on_uneven_tokens():
    import random

    rng = random.Random(7)
    tokens = [rng.randint(1, 2000) for _ in range(5000)]
    lim = Limits(token_limit=10**9, force_chunk_count=7)
    a, _ = plan_chunks(tokens, [1] * 5000, lim)
    b, _ = plan_chunks(tokens, [1] * 5000, lim)
    assert a == b and len(a) == 7
    total = sum(tokens)
    assert all(abs(c.input_tokens - total / 7) <= 2000 for c in a)


def test_limits_validation():
    with pytest.raises(ValueError, match="token_limit"):
        Limits(token_limit=0)
    with pytest.raises(ValueError, match="row_limit"):
        Limits(token_limit=1, row_limit=0)
    with pytest.raises(ValueError, match="force_chunk_count"):
        Limits(token_limit=1, force_chunk_count=0)
    with pytest.raises(ValueError, match="max_output_tokens"):
        Limits(token_limit=1, max_output_tokens=-1)
    with pytest.raises(ValueError, match="sizes"):
        plan_chunks([1, 2], [1], Limits(token_limit=1))
    with pytest.raises(ValueError, match=">= 0"):
        plan_chunks([1, -2], [1, 1], Limits(token_limit=1))


def test_limits_from_settings(home):
    cfg = load_config(home, environ={}, flags={"split_row_limit": 1000, "max_completion_tokens": 300})
    lim = Limits.from_settings(cfg.default, context_window=128_000)
    assert lim == Limits(
        token_limit=None,  # the default: no token cap of our own
        row_limit=1000,
        force_chunk_count=None,
        max_requests=PROVIDER_MAX_REQUESTS,
        max_bytes=PROVIDER_MAX_BYTES,
        context_window=128_000,
        max_output_tokens=300,
    )
    cfg = load_config(home, environ={}, flags={"context_window": 8000})
    assert Limits.from_settings(cfg.default, context_window=128_000).context_window == 8000


def test_one_million_requests_plan_quickly():
    n = 1_000_000
    tokens = array("I", [(i * 7919) % 600 + 20 for i in range(n)])
    sizes = array("Q", [(i * 104729) % 900 + 200 for i in range(n)])
    t0 = time.perf_counter()
    chunks, oversized = plan_chunks(tokens, sizes, Limits(token_limit=500_000))
    elapsed = time.perf_counter() - t0
    assert not oversized
    assert sum(c.requests for c in chunks) == n
    assert sum(c.input_tokens for c in chunks) == sum(tokens)
    assert elapsed < 5, elapsed  # ~0.3 s on a laptop; generous for slow CI


# --- writing chunk files ------------------------------------------------------------------------


def _lines(n: int) -> list[bytes]:
    return [json.dumps({"custom_id": f"id-{i}", "x": "y" * (i % 5)}).encode() + b"\n" for i in range(n)]


def test_write_chunk_files_skips_oversized_and_names_files(tmp_path: Path):
    lines = _lines(10)
    tokens = [1, 1, 50, 1, 1, 1, 1, 1, 50, 1]
    sizes = [len(x) for x in lines]
    chunks, oversized = plan_chunks(tokens, sizes, Limits(token_limit=3))
    over = {o.position for o in oversized}
    assert over == {2, 8}
    paths = write_chunk_files((x for x in lines), chunks, over, tmp_path / "out", "job-7")
    assert [p.name for p in paths] == [f"job-7-chunk-{i:04d}.jsonl" for i in range(len(chunks))]  # as the tables number them
    assert paths[0].name == chunk_file_name("job-7", 0) == "job-7-chunk-0000.jsonl"
    for c, p in zip(chunks, paths):
        data = p.read_bytes()
        assert data == b"".join(lines[i] for i in chunk_positions(c, over))
        assert len(data) == c.bytes
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == sorted(p.name for p in paths)  # no temp files left


def test_write_chunk_files_adds_missing_newline(tmp_path: Path):
    lines = [b'{"a":1}', b'{"b":2}\n']
    chunks, _ = plan_chunks([1, 1], [8, 8], Limits(token_limit=10))
    (p,) = write_chunk_files(lines, chunks, set(), tmp_path, "j")
    assert p.read_bytes() == b'{"a":1}\n{"b":2}\n'


def test_write_chunk_files_replaces_existing_file(tmp_path: Path):
    (tmp_path / "j-chunk-0000.jsonl").write_bytes(b"old\n")
    chunks, _ = plan_chunks([1], [4], Limits(token_limit=10))
    (p,) = write_chunk_files([b"new\n"], chunks, set(), tmp_path, "j")
    assert p.read_bytes() == b"new\n"


@pytest.mark.parametrize(
    "lines, why",
    [
        ([b"aaa\n", b"bb\n"], "plan says"),  # sizes do not match the plan
        ([b"aaa\n"], "lines ended"),  # too few lines
        ([b"aaa\n", b"bbb\n", b"ccc\n"], "in no chunk"),  # a line the plan does not know
        ([b"a\na\n", b"bbb\n"], "newline inside"),
    ],
)
def test_write_chunk_files_rejects_lines_not_matching_the_plan(tmp_path: Path, lines, why):
    chunks, _ = plan_chunks([1, 1], [4, 4], Limits(token_limit=1))
    assert len(chunks) == 2
    with pytest.raises(ValueError, match=why):
        write_chunk_files(iter(lines), chunks, set(), tmp_path / "out", "j")
    assert list((tmp_path / "out").iterdir()) == []  # all or nothing, no temp files


def test_write_chunk_files_rejects_bad_prefix(tmp_path: Path):
    with pytest.raises(ValueError, match="prefix"):
        write_chunk_files([], [], set(), tmp_path, "../x")


@settings(max_examples=60, deadline=None)
@given(cases())
def test_written_files_hold_exactly_the_eligible_lines(tmp_path_factory, case):
    tokens, sizes, lim = case
    lines = [(b"%d:" % i).ljust(max(s, len(b"%d:" % i) + 1) - 1, b"x") + b"\n" for i, s in enumerate(sizes)]
    sizes = [len(x) for x in lines]
    chunks, oversized = plan_chunks(tokens, sizes, lim)
    check_invariants(tokens, sizes, lim, chunks, oversized)
    over = {o.position for o in oversized}
    out = tmp_path_factory.mktemp("chunks")
    paths = write_chunk_files(iter(lines), chunks, over, out, "p")
    got = b"".join(p.read_bytes() for p in paths)
    assert got == b"".join(x for i, x in enumerate(lines) if i not in over)


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 40)), max_size=60),
    st.integers(50, 200),
    st.integers(1, 12),
    st.integers(40, 300),
)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_one_pass_greedy_split_equals_the_prefix_sum_one(rows, tcap, rcap, bcap):
    """plan_chunks without force_chunk_count plans in one pass (no prefix-sum arrays: 16 bytes a
    row fewer at a million rows); the chunks are those of the bisect-based greedy split."""
    from itertools import accumulate

    from batchgrader.pipeline.splitting import _greedy, _greedy_chunks

    tokens, sizes = [t for t, _ in rows], [b for _, b in rows]
    if not rows:
        return
    pt, pb = list(accumulate(tokens, initial=0)), list(accumulate(sizes, initial=0))
    bounds = _greedy(pt, pb, len(rows), tcap, rcap, bcap)
    want = [(a, z, z - a, pt[z] - pt[a], pb[z] - pb[a]) for a, z in zip(bounds, bounds[1:])]
    got = _greedy_chunks(tokens, sizes, range(len(rows)), tcap, rcap, bcap)
    assert [(c.start, c.end, c.requests, c.input_tokens, c.bytes) for c in got] == want
    assert [c.index for c in got] == list(range(len(got)))
