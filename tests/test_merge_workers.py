"""Merging a large chunk in a worker process (daemon/workers.py) while the engine goes on.

Tick-level tests drive the engine with workers the test ends (``HeldWorkers``: the merge itself
is the real ``merge_chunk``, run when the test says the worker ended); the others run the real
worker process on real files.  The daemon's kill -9 tests with merges in workers are in
tests/test_crash.py."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Hashable
from pathlib import Path

import pytest

from batchgrader.daemon.workers import MergeWorkerFailed, MergeWorkers, main
from batchgrader.fsio import TMP_PREFIX
from batchgrader.pipeline.merge import MergeInputs, MergeOutcome, merge_chunk
from ticks import Rig


class HeldWorkers(MergeWorkers):
    """Workers that end when the test calls :meth:`end` (then the real merge runs here)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.held: dict[Hashable, MergeInputs] = {}
        self.ended: dict[Hashable, MergeOutcome | None] = {}
        self.started: list[Hashable] = []

    def running(self, key: Hashable) -> bool:
        return key in self.held or key in self.ended

    def start(self, key: Hashable, inputs: MergeInputs, folder: Path) -> None:
        self.started.append(key)
        self.held[key] = inputs

    def end(self, key: Hashable) -> None:
        inputs = self.held.pop(key)
        self.ended[key] = None if self.fail else merge_chunk(inputs)

    def poll(self, key: Hashable) -> MergeOutcome | None:
        if key in self.held:
            return None
        outcome = self.ended.pop(key)
        if outcome is None:
            raise MergeWorkerFailed("the merge worker ended (exit code 1) without an outcome")
        return outcome


def _two_chunks(rig: Rig, workers: MergeWorkers) -> tuple[str, str]:
    """A 5-row file in chunks of 3 and 2 rows, both batches created; merge_worker_rows 3."""
    rig.reconfigure("split_row_limit: 3\nmerge_worker_rows: 3\n")
    rig.engine.ctx.merge_workers = workers
    rig.drop(5)
    rig.tick()
    first, second = sorted(rig.provider.open_batches(), key=lambda b: b.created_at or 0)
    return first.id, second.id


def _first_chunk_ended(rig: Rig, workers: MergeWorkers) -> tuple[str, int]:
    """The 5-row file of :func:`_two_chunks`, its first batch ended and collected (one tick):
    the key of its merge."""
    first, _ = _two_chunks(rig, workers)
    rig.provider.finish(first)
    rig.tick()
    return rig.job().job_id, 0


def test_a_large_chunk_is_merged_off_the_tick_while_the_other_batch_is_polled(home):
    rig = Rig(home)
    workers = HeldWorkers()
    first, second = _two_chunks(rig, workers)
    job_id = rig.job().job_id
    rig.provider.finish(first)
    seen = rig.tick()
    assert "OutputDownloaded" in seen and "ChunkCompleted" not in seen
    assert workers.started == [(job_id, 0)]
    polls = rig.calls("retrieve") + rig.calls("list")
    assert rig.tick(5) == [] and rig.tick(5) == []  # merging: nothing recorded, nothing started twice
    assert rig.calls("retrieve") + rig.calls("list") > polls  # ... while the other batch is polled
    assert workers.started == [(job_id, 0)]
    rig.provider.finish(second)
    seen = rig.tick(5)
    assert "ChunkCompleted" in seen  # the 2-row chunk is merged within its tick
    job = rig.job()
    assert [c.done for c in job.chunks.values()] == [False, True]
    # nothing else runs meanwhile: the answers wait for the merge, the result for the chunk
    assert rig.tick() == [] and rig.events("AnswersStored") == [] and rig.events("ResultWritten") == []
    workers.end((job_id, 0))
    seen = rig.tick()
    assert seen[:2] == ["TokensUsed", "ChunkCompleted"] and "ResultWritten" in seen
    assert rig.job().ended == "completed"
    rows = rig.result_rows()
    assert [r["id"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert all(r["error"] == "" and "SIMULATED" in r["grade"] for r in rows)
    assert sum(e["rows"] for e in rig.events("AnswersToStore")) == 5
    rig.close()


def test_a_chunk_under_merge_worker_rows_is_merged_within_its_tick(home):
    rig = Rig(home)
    workers = HeldWorkers()
    first, _ = _two_chunks(rig, workers)
    rig.reconfigure("split_row_limit: 3\nmerge_worker_rows: 4\n")
    rig.provider.finish(first)
    assert "ChunkCompleted" in rig.tick()
    assert workers.started == []
    rig.close()


def test_a_merge_whose_worker_fails_is_done_in_the_daemon(home):
    rig = Rig(home)
    workers = HeldWorkers(fail=True)
    key = _first_chunk_ended(rig, workers)
    assert workers.started == [key]
    workers.end(key)
    seen = rig.tick()
    assert "ChunkCompleted" in seen and workers.started == [key]  # not sent to a worker again
    assert rig.job().chunks[0].done
    rig.close()


def test_a_merge_whose_worker_cannot_start_is_done_within_its_tick(home, tmp_path):
    rig = Rig(home)
    workers = MergeWorkers(python=str(tmp_path / "no-such-python"))
    first, _ = _two_chunks(rig, workers)
    rig.provider.finish(first)
    assert "ChunkCompleted" in rig.tick()
    assert not list((home.work).rglob(TMP_PREFIX + "*"))  # its inputs' file is removed
    rig.close()


def _run(home, workers: MergeWorkers | None, rows_at_least: str) -> tuple[bytes, bytes]:
    """A 5-row file run to its end; its first chunk's results file and the result file."""
    rig = Rig(home)
    rig.reconfigure(f"split_row_limit: 3\nmerge_worker_rows: {rows_at_least}\n")
    rig.engine.ctx.merge_workers = workers
    job = rig.drop(5)
    rig.tick()
    rig.provider.finish_all()
    for _ in range(20):
        rig.tick()
        for key in list(workers._runs) if workers else []:
            assert workers.wait(key, timeout=60), "the merge worker did not end"
        if rig.job().ended:
            break
    assert rig.job().ended == "completed"
    chunk = Path(rig.job().chunks[0].results_path or "").read_bytes()
    result = (home.outbox / "a_results.csv").read_bytes()
    rig.close()
    assert job.job_id
    return chunk, result


def test_a_worker_process_merges_as_the_daemon_does(tmp_path):
    from batchgrader.core.host.home import Home

    homes = [Home.resolve(tmp_path / name).ensure() for name in ("worker", "daemon")]
    workers = MergeWorkers()
    in_worker = _run(homes[0], workers, "1")
    in_daemon = _run(homes[1], None, "null")
    assert in_worker == in_daemon
    assert not workers._runs
    assert not list(homes[0].work.rglob(TMP_PREFIX + "*"))  # its inputs and outcome files are removed


def _inputs(tmp_path: Path) -> MergeInputs:
    out = tmp_path / "output.jsonl"
    lines = [
        {
            "custom_id": f"r{i}",
            "response": {
                "status_code": 200,
                "body": {
                    "choices": [{"message": {"content": f"answer {i}"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2},
                },
            },
            "error": None,
        }
        for i in range(3)
    ]
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return MergeInputs(
        custom_ids=("r0", "r1", "r2", "r3"),
        files=(("output", str(out)),),
        status="completed",
        results_path=str(tmp_path / "results" / "chunk-0000.jsonl"),
    )


def test_merge_inputs_and_outcomes_go_through_json_unchanged(tmp_path):
    inputs = _inputs(tmp_path)
    assert MergeInputs.from_json(json.loads(json.dumps(inputs.to_json()))) == inputs
    outcome = merge_chunk(inputs)
    assert outcome.merged is not None and outcome.merged.succeeded == 3
    assert [r["code"] for r in outcome.merged.failed_rows] == ["missing_result"]
    assert MergeOutcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


def test_a_worker_whose_daemon_has_gone_writes_the_results_but_no_outcome(tmp_path):
    inputs = _inputs(tmp_path)
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    spec.write_text(json.dumps(inputs.to_json()))
    gone = os.getppid() + 1 if os.getppid() != sys.maxsize else 1
    assert main([str(spec), str(out), str(gone)]) == 3
    assert not out.exists() and not spec.exists()
    assert len(Path(inputs.results_path).read_text().splitlines()) == 4
    spec.write_text(json.dumps(inputs.to_json()))
    assert main([str(spec), str(out), str(os.getppid())]) == 0
    assert MergeOutcome.from_json(json.loads(out.read_text())) == merge_chunk(inputs)


def test_a_worker_that_ends_without_an_outcome_is_reported(tmp_path):
    inputs = _inputs(tmp_path)
    Path(inputs.files[0][1]).unlink()  # nothing to merge: the worker fails
    workers = MergeWorkers()
    workers.start("k", inputs, tmp_path / "merging")
    assert workers.wait("k", timeout=60)
    with pytest.raises(MergeWorkerFailed, match="without an outcome"):
        workers.poll("k")
    assert not workers.running("k") and not list((tmp_path / "merging").iterdir())


def test_the_rows_merged_are_those_sent_without_the_duplicates_that_ride_with_their_leader(tmp_path):
    """A worker reads the chunk's rows from its request file (custom_ids at the start of each
    line as the daemon writes them, or anywhere in a line written otherwise); a duplicate whose
    leader is in the chunk is not among them (it takes the leader's outcome)."""
    requests = tmp_path / "chunk.jsonl"
    lines = [
        '{"custom_id":"a","body":{}}',
        '{"custom_id":"b","body":{}}',
        '{"custom_id":"c\\"q\\u00e9","body":{}}',
        '{"body": {}, "custom_id": "d"}',
    ]
    requests.write_text("".join(x + "\n" for x in lines))
    inputs = MergeInputs(files=(), status="completed", results_path=str(tmp_path / "r.jsonl"), requests_path=str(requests))
    assert inputs.expected() == ["a", "b", 'c"qé', "d"]
    rides = MergeInputs.from_json({**inputs.to_json(), "followers": {"a": ["b", "zz"], "d": ["x"]}})
    assert rides.expected() == ["a", 'c"qé', "d"]  # b rides with a; zz and x are not in the chunk
    recorded = MergeInputs.from_json({**rides.to_json(), "custom_ids": ["d", "a", "b"]})
    assert recorded.expected() == ["d", "a"]  # a retry chunk's recorded rows, not its file


def test_a_worker_that_runs_too_long_is_stopped_and_reported(tmp_path):
    """No merge holds its job forever (a stalled disk): past the timeout the worker is killed
    and the engine merges in the daemon (see test_a_merge_whose_worker_fails_is_done_in_the_daemon)."""
    stuck = tmp_path / "stuck-python"
    stuck.write_text("#!/bin/sh\nexec sleep 300\n")
    stuck.chmod(0o755)
    workers = MergeWorkers(python=str(stuck), timeout=0.0)
    workers.start("k", _inputs(tmp_path), tmp_path / "merging")
    proc = workers._runs["k"].proc
    with pytest.raises(MergeWorkerFailed, match="stopped after 0 s"):
        workers.poll("k")
    assert proc.poll() is not None and not workers.running("k")
    assert not list((tmp_path / "merging").iterdir())  # the inputs' file is removed


def test_a_chunk_whose_worker_failed_is_not_sent_to_a_worker_again(home):
    """When the merge fails in the daemon too (here its downloaded file is gone), later tries
    are made in the daemon, each tick, not by starting a worker process per tick."""
    rig = Rig(home)
    workers = HeldWorkers(fail=True)
    key = _first_chunk_ended(rig, workers)
    Path(rig.job().chunks[0].downloads["output"]["path"]).unlink()
    workers.end(key)
    for _ in range(3):
        rig.tick()
    assert workers.started == [key] and not rig.job().chunks[0].done
    rig.close()


def test_at_most_max_running_workers_run_at_once_and_the_others_wait_their_turn(tmp_path):
    """Chunks that end together (a million-row file's twenty, in the sandbox) are not merged by
    twenty workers at once, each holding its chunk's ids: one per core, the others after."""
    gate = tmp_path / "go"
    gated = tmp_path / "gated-python"  # a worker that starts merging once the gate is open
    gated.write_text(f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.01; done\nexec "{sys.executable}" "$@"\n')
    gated.chmod(0o755)
    workers = MergeWorkers(python=str(gated), max_running=2)
    keys = ["a", "b", "c"]
    for k in keys:
        (tmp_path / k).mkdir()
        workers.start(k, _inputs(tmp_path / k), tmp_path / k / "merging")
    assert [workers._runs[k].proc is not None for k in keys] == [True, True, False]  # c waits
    assert workers.poll("c") is None and workers.running("c")
    gate.touch()
    for k in keys:
        assert workers.wait(k, timeout=60)
        outcome = workers.poll(k)
        assert outcome is not None and outcome.merged is not None and outcome.merged.rows == 4
        assert (tmp_path / k / "results" / "chunk-0000.jsonl").exists()
    assert not workers._runs


def test_a_waiting_merge_whose_worker_cannot_start_is_reported(tmp_path):
    gate = tmp_path / "go"
    gated = tmp_path / "gated-python"
    gated.write_text(f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.01; done\nexec "{sys.executable}" "$@"\n')
    gated.chmod(0o755)
    workers = MergeWorkers(python=str(gated), max_running=1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    workers.start("a", _inputs(tmp_path / "a"), tmp_path / "a" / "merging")
    workers.start("b", _inputs(tmp_path / "b"), tmp_path / "b" / "merging")
    workers.python = str(tmp_path / "no-such-python")
    workers._runs["b"].args[0] = workers.python  # the interpreter is gone by the time b's turn comes
    gate.touch()
    assert workers.wait("a", timeout=60) and workers.poll("a") is not None
    assert workers.wait("b", timeout=60)
    with pytest.raises(MergeWorkerFailed, match="could not be started"):
        workers.poll("b")
    assert not list((tmp_path / "b" / "merging").iterdir())  # its inputs' file is removed
