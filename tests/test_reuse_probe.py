"""Reuse decided while the rows are prepared (``ReuseProbe``): the same plan as ``plan_reuse``
over the written lines, exact token counts for the rows still sent, no counting for the others."""

from __future__ import annotations

import io

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.pipeline.answerkey import line_key
from batchgrader.pipeline.prepare import oversized_positions, prepare
from batchgrader.pipeline.reuse import ReuseProbe, plan_reuse
from batchgrader.pipeline.splitting import Limits
from batchgrader.store.answers import StoredAnswer

PROVIDER = "sandbox"


def _answer(key: str) -> StoredAnswer:
    return StoredAnswer(key, "stored", "stop", 21, 3, 8, 1, "job0", "old", "2026-01-01T00:00:00+00:00")


def _file(tmp_path, texts):
    p = tmp_path / "data.csv"
    p.write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    return p


def _prepared(path, profile, home, probe=None, limits=None):
    buf = io.BytesIO()
    prep = prepare(path, profile, home, requests_out=buf, reuse=probe, limits=limits)
    return prep, buf.getvalue().splitlines(keepends=True)


def test_probe_plans_like_plan_reuse_and_counts_only_the_rows_sent(tmp_path, home, monkeypatch):
    import batchgrader.pipeline.prepare as prepare_mod

    monkeypatch.setattr(prepare_mod, "BLOCK_ROWS", 7)  # several blocks: leaders and duplicates across blocks
    texts = [f"answer {i % 9}" + (" long" * (i % 4)) for i in range(40)]
    path = _file(tmp_path, texts)
    profile = load_config(home, environ={}).default
    full, lines = _prepared(path, profile, home)
    stored = {line_key(PROVIDER, lines[i])[1] for i in (0, 5, 13)}

    def lookup(keys):
        return {k: _answer(k) for k in keys if k in stored}

    expected = plan_reuse(lines, PROVIDER, oversized_positions(full), lookup)
    probe = ReuseProbe(PROVIDER, lookup)
    prep, probe_lines = _prepared(path, profile, home, probe)
    plan = probe.finish(oversized_positions(prep))
    assert probe_lines == lines  # every row's line is still written, in order
    assert list(plan.keep) == expected.keep and plan.followers == expected.followers
    assert [(c, a.key) for c, a in plan.cached] == [(c, a.key) for c, a in expected.cached]
    assert plan.cached_usage == expected.cached_usage and plan.cached_usage["prompt_tokens"] == 21 * len(plan.cached)
    cached_pos = {int(c.rsplit("-", 1)[-1]) - 1 for c, _ in plan.cached}
    assert cached_pos and plan.followers and plan.keep
    for pos in range(len(texts)):
        if pos in cached_pos:
            assert prep.tokens[pos] == 0 and prep.sizes[pos] == 0
        else:  # sent rows and duplicates: the exact count of their (identical) request
            assert prep.tokens[pos] == full.tokens[pos] and prep.sizes[pos] == full.sizes[pos]


def test_probe_oversized_leader_takes_its_duplicates_with_it(tmp_path, home):
    texts = ["short", "word " * 400, "short", "word " * 400, "other"]
    path = _file(tmp_path, texts)
    profile = load_config(home, environ={}).default
    limits = Limits(token_limit=300)
    full, lines = _prepared(path, profile, home, limits=limits)
    expected = plan_reuse(lines, PROVIDER, oversized_positions(full), None)
    probe = ReuseProbe(PROVIDER, None)
    prep, _ = _prepared(path, profile, home, probe, limits=limits)
    plan = probe.finish(oversized_positions(prep))
    assert oversized_positions(prep) == oversized_positions(full) == {1, 3}
    assert list(plan.keep) == expected.keep == [0, 4]
    assert plan.followers == expected.followers and len(plan.followers) == 1  # row 3 follows nothing: refused too


def test_seen_keys_confirm_a_fingerprint_match_with_the_key_itself():
    """The keys seen are kept as 64-bit fingerprints in memory and confirmed on disk: with every
    fingerprint equal (all keys collide), only an equal key is found, with its leader."""
    from batchgrader.pipeline.reuse import _Leaders

    class Colliding(_Leaders):
        _M64 = 0  # every key gets fingerprint 0

    for seen in (_Leaders(), Colliding()):
        seen.add((f"k{i}", f"c{i}", 10 * i) for i in range(300))  # past the first table's half: it grows
        assert seen.find(["k7", "k299", "nope", "k7x"]) == {"k7": ("c7", 70), "k299": ("c299", 2990)}
        seen.add([("nope", "c-new", 5)])
        assert seen.find(["nope"]) == {"nope": ("c-new", 5)}
        seen.close()


@pytest.mark.slow  # a memory measurement over many rows
def test_the_probe_holds_a_few_bytes_per_row_sent():
    """A million rows must not mean a dict of a million keys: the probe keeps an array of
    positions and a fingerprint table (about 30 bytes a row, not ~320)."""
    import tracemalloc

    from batchgrader.pipeline.requests import dumps_line

    def line(i: int) -> bytes:
        body = {"model": "gpt-5.4-mini", "messages": [{"role": "user", "content": f"text number {i}"}]}
        return dumps_line(
            {"custom_id": f"bg-0123456789abcdef-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )

    n, block = 40_000, 4096
    blocks = [[line(i) for i in range(s, min(n, s + block))] for s in range(0, n, block)]
    probe = ReuseProbe(PROVIDER, None)
    probe.block(blocks[0][:1])  # the key template, built once
    tracemalloc.start()
    try:
        for b in blocks:
            probe.block(b[1:] if b is blocks[0] else b)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    plan = probe.finish(set())
    assert len(plan.keep) == n and not plan.followers
    assert held / n < 60, f"{held / n:.0f} bytes a row"
