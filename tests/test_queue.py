"""The provider's queue limit: the pure rules, a property test of planning under them, and the
engine ticked in process against the emulator on a manual clock (learning, halving, probing,
re-planning, waiting), with no sleeps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.cli.commands import cli
from batchgrader.core.configuration.config import load_config
from batchgrader.core.rules import queue
from batchgrader.daemon.engine import Engine
from batchgrader.emulator import Emulator, EmulatorConfig, ManualClock, token_limit_message
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.pipeline.splitting import Limits, plan_chunks
from batchgrader.provider.openai_api import OpenAIProvider
from batchgrader.provider.pool import Providers
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors

MODEL = "gpt-5.4-mini"
KEY = "sk-queue-test-0123456789abcdef"
# the preflight (tests/test_preflight*.py) is off: these rigs prepare before the provider exists
CONFIG = "poll_interval_seconds: 0.05\nstable_seconds: 0.05\nrescan_interval_seconds: 0.2\nmax_completion_tokens: 50\npreflight_rows: 0\n"

# --- the rules ------------------------------------------------------------------------------------


def test_the_figure_is_read_from_the_real_message():
    msg = token_limit_message(MODEL, "org-abc", 2_000_000)
    assert "Limit: 2,000,000 enqueued tokens." in msg
    assert queue.parse_queue_limit(msg) == 2_000_000
    assert queue.parse_queue_limit(token_limit_message(MODEL, "org-abc", None)) is None
    assert queue.parse_queue_limit("Limit: 90000 enqueued tokens") == 90_000
    assert queue.parse_queue_limit(None) is None


def test_what_a_refusal_teaches():
    with_figure = token_limit_message(MODEL, "org", 1000)
    assert queue.after_refusal(with_figure, 1500, None) == queue.Learned(1000, True, "message")
    assert queue.after_refusal(with_figure, 1500, {"limit": 1000, "exact": True}) is None  # nothing new
    bare = token_limit_message(MODEL, "org", None)
    assert queue.after_refusal(bare, 1500, None) == queue.Learned(750, False, "halved")
    assert queue.after_refusal(bare, 1500, {"limit": 600, "exact": False}) is None  # already below half
    assert queue.after_refusal(bare, 1500, {"limit": 1000, "exact": True}) is None  # a shared queue: wait
    assert queue.after_completion({"limit": 750, "exact": False}) == queue.Learned(1125, False, "probe")
    assert queue.after_completion({"limit": 750, "exact": True}) is None
    assert queue.limit_in_force(None, None) is None
    assert queue.limit_in_force(500, {"limit": 800}) == 500 and queue.limit_in_force(None, {"limit": 800}) == 800
    assert queue.has_room(None, 10**9, 10**9) and queue.has_room(100, 60, 40) and not queue.has_room(100, 61, 40)
    assert queue.needs_replan(100, 101) and not queue.needs_replan(100, 100) and not queue.needs_replan(None, 10**9)


# --- property: planning and scheduling under a limit learned from refusals --------------------------


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=60),
    real_limit=st.integers(min_value=50, max_value=3000),
    figure=st.booleans(),
    row_limit=st.one_of(st.none(), st.integers(min_value=1, max_value=20)),
    finish_order=st.randoms(use_true_random=False),
)
def test_chunks_cover_every_row_once_and_in_flight_stays_under_the_known_limit(
    tokens, real_limit, figure, row_limit, finish_order
):
    """The engine's rules (core/rules/queue.py + plan_chunks), modelled step by step against a provider
    that refuses whatever would push its queue over ``real_limit``."""
    sizes = [t * 4 + 1 for t in tokens]
    caps = Limits(token_limit=None, row_limit=row_limit, max_requests=50, max_bytes=10_000)
    first, over = plan_chunks(tokens, sizes, caps)
    assert not over
    pending: list[list[int]] = [list(range(c.start, c.end)) for c in first]
    known: dict[str, Any] | None = None
    in_flight: list[list[int]] = []
    answered: list[int] = []
    failed: list[int] = []
    for _step in range(20_000):
        if not pending and not in_flight:
            break
        progressed = False
        for rows in list(pending):
            t = sum(tokens[r] for r in rows)
            assert len(rows) <= caps.requests_per_chunk and sum(sizes[r] for r in rows) <= caps.max_bytes
            limit = queue.limit_in_force(None, known)
            exact = known is None or bool(known["exact"])
            if queue.needs_replan(limit, t, len(rows), exact):
                assert limit is not None
                pending.remove(rows)
                sub, big = plan_chunks(
                    [tokens[r] for r in rows], [sizes[r] for r in rows], dataclasses.replace(caps, token_limit=limit)
                )
                assert all(c.input_tokens <= limit for c in sub)
                skip = {o.position for o in big}
                pending += [[rows[p] for p in range(c.start, c.end) if p not in skip] for c in sub]
                if exact:
                    failed += [rows[o.position] for o in big]
                else:
                    pending += [[rows[o.position]] for o in big]  # tried alone
                progressed = True
                continue
            queued = sum(tokens[r] for f in in_flight for r in f)
            if not queue.has_room(limit, queued, t, exact):
                continue
            pending.remove(rows)
            progressed = True
            if queued + t > real_limit:  # the provider refuses it
                if queue.fails_alone(len(rows), queued):
                    failed += rows
                    continue
                msg = token_limit_message(MODEL, "org", real_limit if figure else None)
                learned = queue.after_refusal(msg, queued + t, known)
                if learned is not None:
                    known = {"limit": learned.limit, "exact": learned.exact}
                pending.append(rows)
                continue
            in_flight.append(rows)
            if known is not None and known["exact"]:
                assert queued + t <= known["limit"]  # never more in flight than the known limit
        if in_flight and (not progressed or finish_order.random() < 0.5):
            done = in_flight.pop(finish_order.randrange(len(in_flight)))
            answered += done
            probe = queue.after_completion(known)
            if probe is not None:
                known = {"limit": probe.limit, "exact": probe.exact}
        elif not progressed and not in_flight:
            raise AssertionError(f"stuck: pending {pending}, known {known}")
    else:
        raise AssertionError("did not finish")
    assert sorted(answered + failed) == list(range(len(tokens)))  # every row once: answered or failed
    assert all(tokens[r] > real_limit for r in failed)  # only rows that can never be accepted fail
    assert sum(tokens[r] for f in in_flight for r in f) == 0


# --- the engine, ticked in process ------------------------------------------------------------------


class Rig:
    """An engine in this process, a real emulator over HTTP, one manual clock for both."""

    def __init__(self, home, config: str = CONFIG, **emu: Any):
        self.home = home
        home.config_file.write_text(config)
        self.clock = ManualClock()
        self.cfg = load_config(home, environ={})
        self.store = EventStore(home.db, projectors=projectors())
        self.engine = Engine(home, self.cfg, self.store, None, load_pricing(None))
        self.emu_kw = {"api_key": KEY, "validating_s": 0.2, "in_progress_s": 1.0, "finalizing_s": 0.2, **emu}
        self.emu: Emulator | None = None

    def prepare(self, rows: list[str]) -> int:
        """Drop the file, let the engine take and prepare it (no provider yet); its input tokens."""
        (self.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(rows)))
        self.run(lambda: any(j.prepared or j.ended for j in self.engine.ctx.state.jobs.values()), ticks=200)
        (job,) = self.engine.ctx.state.jobs.values()
        return sum(c.input_tokens for c in job.chunks.values())

    def start(self, **emu: Any) -> Emulator:
        self.emu = Emulator(EmulatorConfig(clock=self.clock, **{**self.emu_kw, **emu})).start()
        self.engine.ctx.providers = Providers.of(OpenAIProvider(api_key=KEY, base_url=self.emu.base_url, timeout=10))
        return self.emu

    def run(self, until, ticks: int = 4000, step: float = 0.05) -> None:
        for _ in range(ticks):
            self.engine.tick(self.clock.advance(step))
            if until():
                return
        raise AssertionError("condition not reached")

    def finish(self) -> Any:
        self.run(lambda: all(j.ended for j in self.engine.ctx.state.jobs.values()))
        (job,) = self.engine.ctx.state.jobs.values()
        return job

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.store.read() if e.type == type_]

    def close(self) -> None:
        if self.emu is not None:
            self.emu.stop()
        self.store.close()


@pytest.fixture
def rig(home):
    made: list[Rig] = []

    def make(**kw: Any) -> Rig:
        r = Rig(home, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def rows_text(n: int) -> list[str]:
    return [f"review number {i}: the product was fine and delivery slow" for i in range(n)]


def answered_once(rig: Rig, n: int) -> None:
    """Every row answered exactly once at the provider (no row paid twice), and in the result."""
    assert rig.emu is not None
    done = [b for b in rig.emu.batches() if b["status"] == "completed"]
    assert sum(b["request_counts"]["completed"] for b in done) == n
    lines = (rig.home.outbox / "a_results.csv").read_text().splitlines()[1:]
    assert len(lines) == n and all(line.endswith(",") for line in lines)  # empty error column


@pytest.mark.slow
def test_a_limit_in_the_message_is_learned_and_the_chunk_replanned(rig):
    r = rig()
    total = r.prepare(rows_text(30))
    limit = total * 45 // 100
    emu = r.start(token_limits={MODEL: limit})
    job = r.finish()
    assert job.ended == "completed" and not job.row_attempts  # the refusal used up no retries
    (learned,) = r.events("QueueLimitLearned")
    assert (learned["limit"], learned["exact"], learned["source"], learned["model"]) == (limit, True, "message", MODEL)
    assert learned["base_url"] == r.engine.ctx.queue_url and "Limit:" in learned["message"]
    (replanned,) = r.events("ChunkReplanned")
    assert replanned["limit"] == limit and len(replanned["chunks"]) == 3  # ceil(1 / 0.45)
    assert all(c["input_tokens"] <= limit for c in replanned["chunks"])
    assert sorted(x for c in replanned["chunks"] for x in c["custom_ids"]) == sorted(
        json.loads(line)["custom_id"] for line in Path(job.requests_path).read_text().splitlines()
    )
    statuses = [b["status"] for b in emu.batches()]
    assert statuses.count("failed") == 1 and statuses.count("completed") == 3  # refused once, never again
    answered_once(r, 30)
    refused = next(b for b in emu.batches() if b["status"] == "failed")
    assert emu.store.state.files[refused["input_file_id"]].deleted  # the refused batch's file is not leaked
    assert r.engine.ctx.state.queue_limits[(r.engine.ctx.queue_url, MODEL)]["limit"] == limit


def test_without_a_figure_the_limit_is_halved_then_probed_upward(rig):
    r = rig()
    total = r.prepare(rows_text(24))
    emu = r.start(token_limits={MODEL: total * 45 // 100}, token_limit_figure=False)
    job = r.finish()
    assert job.ended == "completed" and not job.row_attempts
    learned = r.events("QueueLimitLearned")
    assert learned[0]["source"] == "halved" and learned[0]["limit"] == total // 2 and not learned[0]["exact"]
    assert {x["source"] for x in learned} >= {"halved", "probe"}
    assert r.events("ChunkReplanned")
    answered_once(r, 24)
    failed = [b for b in emu.batches() if b["status"] == "failed"]
    assert failed and all(emu.store.state.files[b["input_file_id"]].deleted for b in failed)


def test_a_row_alone_over_the_limit_fails_clearly_and_is_not_retried(rig):
    r = rig(config=CONFIG + "max_row_retries: 2\n")
    rows = rows_text(10)
    rows[4] = "huge " * 400
    total = r.prepare(rows)
    r.start(token_limits={MODEL: (total - 400) // 3})
    job = r.finish()
    assert job.ended == "completed_with_errors"
    over = [o for e in r.events("ChunkReplanned") for o in e["oversized"]]
    assert len(over) == 1
    info = job.failed_rows[over[0]["custom_id"]]
    assert info["code"] == "request_too_large" and "enqueued-token limit" in info["message"]
    assert not job.row_attempts  # neither the refusal nor the oversized row used a retry
    result = (r.home.outbox / "a_results.csv").read_text().splitlines()
    assert "request_too_large" in result[5] and sum("request_too_large" in x for x in result) == 1


def test_a_configured_limit_is_used_from_the_start(rig):
    r = rig(config=CONFIG + f"enqueued_token_limit: {{{MODEL}: 700}}\n")
    r.prepare(rows_text(30))
    emu = r.start(token_limits={MODEL: 700})
    job = r.finish()
    assert job.ended == "completed"
    assert all(c.input_tokens <= 700 for c in job.chunks.values())
    assert [b["status"] for b in emu.batches()].count("failed") == 0  # never refused
    assert not r.events("QueueLimitLearned")
    answered_once(r, 30)


@pytest.mark.slow
def test_a_job_waits_for_queue_room_and_status_says_so(rig):
    from batchgrader.store import queries

    r = rig()
    total = r.prepare(rows_text(30))
    r.start(token_limits={MODEL: total * 45 // 100}, in_progress_s=3.0)
    r.run(
        lambda: (
            bool(r.events("ChunkReplanned"))
            and any(c.in_flight for j in r.engine.ctx.state.jobs.values() for c in j.chunks.values())
        )
    )
    (row,) = queries.status(r.home)
    assert row["queue"]["limit"] == total * 45 // 100 and row["queue"]["exact"] and row["queue"]["waiting"]
    shown = CliRunner().invoke(cli, ["status"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    assert f"waiting for queue room: {MODEL} may have {total * 45 // 100:,} prompt tokens in flight" in shown.output
    job = r.finish()
    assert job.ended == "completed"
    (row,) = queries.status(r.home)
    assert row["queue"]["waiting"] is False


def test_one_list_per_poll_round_replaces_a_retrieve_per_batch(rig):
    r = rig(config=CONFIG + "split_row_limit: 5\n")
    r.prepare(rows_text(30))  # six batches, all in flight at once
    emu = r.start()
    job = r.finish()
    assert job.ended == "completed" and emu.batches_created() == 6
    lists = emu.request_count("GET", "/v1/batches")
    retrieves = emu.request_count("GET", "/v1/batches/{id}")
    assert lists >= 3  # validating -> in_progress -> finalizing -> completed, seen by listing
    assert retrieves == 0, (lists, retrieves)
    answered_once(r, 30)
