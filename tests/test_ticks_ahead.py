"""Uploading ahead of queue room (issue 9): a chunk that waits for room in the provider's queue has
its file uploaded while it waits, so that when room appears only ``batches.create`` is left.
Tick by tick with the in-memory provider (no sleeps)."""

from __future__ import annotations

from batchgrader.core.rules.decide import upload_name
from batchgrader.provider.pool import Providers
from batchgrader.store.readmodels import chunk_label
from ticks import BASE_CONFIG, Rig, refusal

SPLIT = "split_row_limit: 2\nmax_simultaneous_batches: 5\n"


def _limited(home, rows: int, room_for: float = 1.0) -> Rig:
    """A rig whose file is cut into chunks of two rows, with a configured queue limit that holds
    ``room_for`` chunks (the limit is set after prepare, when the chunk sizes are known)."""
    rig = Rig(home, SPLIT)
    job = rig.drop(rows)
    per_chunk = max(c.input_tokens for c in job.chunks.values())
    rig.reconfigure(SPLIT + f"enqueued_token_limit: {{gpt-5.4-mini: {int(per_chunk * room_for) + 1}}}\n")
    return rig


def _chunk_events(rig: Rig, after: int, chunk: int) -> list[str]:
    return [e.type for e in rig.store.read(after=after) if e.payload.get("chunk") == chunk]


def _batch_files(rig: Rig, chunk: int) -> list[str]:
    """The ids of the provider's uploaded input files of ``chunk`` (any attempt)."""
    return [fid for fid, f in rig.provider.files.items() if f.info.purpose == "batch" and f"-c{chunk:04d}-" in f.info.filename]


def test_a_chunk_waiting_for_queue_room_is_uploaded_ahead_and_created_with_that_file(home):
    rig = _limited(home, 6)  # three chunks; room for one
    before = rig.store.last_seq()
    rig.tick()
    assert rig.calls("create_batch") == 1  # the queue holds one chunk
    assert rig.calls("upload") == 2  # ... and the next one's file is uploaded while it waits
    assert _chunk_events(rig, before, 1) == ["UploadStarted", "UploadAheadPlanned", "FileUploaded"]
    (ahead,) = rig.events("UploadAheadPlanned")
    assert ahead["chunk"] == 1 and ahead["attempt"] == 1 and ahead["enqueued"] == rig.job().chunks[0].input_tokens
    staged = rig.job().chunks[1]
    assert staged.staged and staged.upload == "done" and staged.create == "none"
    assert chunk_label(staged) == "waiting"  # `bgctl status`: the job waits for queue room
    assert not rig.job().chunks[2].staged and rig.job().chunks[2].upload == "none"  # ahead: one limit's worth at most
    (file_1,) = _batch_files(rig, 1)
    assert rig.tick() == ["BatchStatusChanged"]  # still no room: nothing more is uploaded or created
    assert rig.calls("upload") == 2 and rig.calls("create_batch") == 1

    (first,) = rig.provider.open_batches()
    rig.provider.finish(first.id)
    before = rig.store.last_seq()
    types = rig.tick()
    # room again: the waiting chunk is created at once with the file uploaded ahead, no upload first
    assert _chunk_events(rig, before, 1) == ["BatchCreateRequested", "BatchCreated"]
    # ... right after the poll that saw the room, before the batch that made room is collected
    assert types.index("BatchCreated") < types.index("OutputDownloadStarted") < types.index("ChunkCompleted")
    assert rig.events("BatchCreateRequested")[1]["input_file_id"] == file_1
    assert rig.provider.batches[rig.job().chunks[1].batch_id or ""].input_file_id == file_1
    assert _chunk_events(rig, before, 2)[:2] == ["UploadStarted", "UploadAheadPlanned"]  # and the last one waits uploaded
    assert rig.calls("upload") == 3 and rig.calls("create_batch") == 2

    rig.provider.finish_all()
    rig.tick()
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"
    assert [r["id"] for r in rig.result_rows()] == [str(i) for i in range(6)]
    assert all(r["error"] == "" for r in rig.result_rows())
    assert rig.calls("upload") == 3 and len(rig.provider.batches) == 3  # one file and one batch per chunk
    assert not rig.provider.files  # nothing left at the provider
    rig.close()


def test_a_chunk_uploaded_ahead_then_replanned_has_its_file_deleted(home):
    rig = _limited(home, 4)  # two chunks of two rows; room for one
    rig.tick()
    (batch,) = rig.provider.open_batches()
    assert rig.job().chunks[1].staged
    (staged_file,) = _batch_files(rig, 1)
    # the provider states a lower limit: one row fits, two do not; both chunks are re-planned
    limit = max(c.input_tokens for c in rig.job().chunks.values()) * 2 // 3
    rig.provider.finish(batch.id, "failed", errors=refusal(limit))
    rig.tick()
    replanned = {e["chunk"]: e for e in rig.events("ChunkReplanned")}
    assert set(replanned) == {0, 1}
    assert [len(c["custom_ids"]) for c in replanned[1]["chunks"]] == [1, 1]
    assert staged_file not in rig.provider.files  # the file uploaded ahead is deleted, not leaked
    assert batch.input_file_id not in rig.provider.files
    assert not rig.events("RowsFailed") and not rig.job().row_attempts  # no row used a retry
    for _ in range(6):
        rig.provider.finish_all()
        if rig.tick()[-1:] == ["JobCompleted"]:
            break
    assert rig.job().ended == "completed" and all(r["error"] == "" for r in rig.result_rows())
    assert sum(b.request_counts.completed for b in rig.provider.batches.values()) == 4  # each row answered once
    assert not rig.provider.files
    rig.close()


def test_a_cancelled_job_deletes_the_file_it_uploaded_ahead(home):
    rig = _limited(home, 4)
    rig.reconfigure(_extra(rig) + "delete_provider_files: false\n")
    rig.tick()
    (staged_file,) = _batch_files(rig, 1)
    rig.control("CancelRequested")
    rig.tick()
    rig.provider.finish_all("cancelled")
    rig.tick()
    assert rig.job().ended == "cancelled"
    assert staged_file not in rig.provider.files  # never used by a batch: deleted even when files are kept
    rig.close()


def test_a_halted_job_fails_the_chunk_uploaded_ahead_and_deletes_its_file(home):
    rig = _limited(home, 6)  # three chunks; room for one
    rig.reconfigure(_extra(rig) + "halt_on_chunk_failure: true\n")
    rig.tick()
    (staged_file,) = _batch_files(rig, 1)
    (batch,) = rig.provider.open_batches()
    rig.provider.finish(batch.id, "failed", errors=[("invalid_request", "model not allowed for this project")])
    types = rig.tick()
    assert types[-1] == "JobFailed" and rig.job().error["code"] == "halted"
    halted = sorted(e["chunk"] for e in rig.events("ChunkFailed") if e["code"] == "halted")
    assert halted == [1, 2]  # the chunk uploaded ahead too: the job does not wait for it forever
    assert staged_file not in rig.provider.files
    assert rig.calls("create_batch") == 1
    rig.close()


def _extra(rig: Rig) -> str:
    """The rig's configuration beyond the base one."""
    text = rig.home.config_file.read_text()
    assert text.startswith(BASE_CONFIG)
    return text[len(BASE_CONFIG) :]


def _restart(rig: Rig) -> Rig:
    """A new engine process over the same home and provider (state folded from the log, timers fresh)."""
    provider, now, extra = rig.provider, rig.now, _extra(rig)
    rig.close()
    again = Rig(rig.home, extra)
    again.provider = provider
    again.engine.ctx.providers = Providers.of(provider)
    again.now = now
    return again


def test_a_kill_between_the_upload_ahead_and_the_create_neither_leaks_nor_pays_twice(home):
    rig = _limited(home, 4)  # two chunks; room for one
    job_id = rig.job().job_id
    name = upload_name(job_id, 1, 1)
    # the upload ahead reaches the provider but its reply is lost, and the listing fails too:
    # the daemon dies with the upload's intent open
    rig.provider.fail_next("upload", "lost", match=name)
    rig.provider.fail_next("find_files", "unavailable")
    rig.tick()
    assert rig.job().chunks[1].open_intent == "upload" and rig.job().chunks[1].staged
    assert rig.calls("create_batch") == 1

    rig = _restart(rig)
    types = rig.tick()
    assert "FileUploaded" in types and rig.events("FileUploaded")[-1]["reconciled"] is True  # found by its name
    assert "BatchCreateRequested" not in types  # still no room: the reconciled file waits, staged
    assert rig.job().chunks[1].staged
    assert [f.info.filename for f in rig.provider.files.values()].count(name) == 1
    assert rig.provider.calls.count(("upload", name)) == 1  # reused, never uploaded twice
    staged_file = rig.job().chunks[1].file_id

    rig = _restart(rig)  # killed again, now between the upload and the create
    (first,) = rig.provider.open_batches()
    rig.provider.finish(first.id)
    before = rig.store.last_seq()
    rig.tick()
    assert _chunk_events(rig, before, 1) == ["BatchCreateRequested", "BatchCreated"]
    assert rig.events("BatchCreateRequested")[-1]["input_file_id"] == staged_file
    rig.provider.finish_all()
    assert rig.tick()[-1] == "JobCompleted"
    assert rig.calls("upload") == 2 and rig.provider.calls.count(("upload", name)) == 1
    assert len(rig.provider.batches) == 2 and all(r["error"] == "" for r in rig.result_rows())
    assert not rig.provider.files
    rig.close()


def test_the_room_ahead_goes_to_the_largest_waiting_chunk_not_to_a_remainder_uploaded_earlier(home):
    """Two chunks refused for the queue limit (rows big, big, small each): each is re-planned into
    a full chunk (big, big) and a remainder (small).  At the first refusal the first full chunk
    is created (the other batch, larger than the stated limit, holds no room) and its remainder
    is uploaded ahead.  At the second, its full chunk is uploaded ahead too, since it is sent
    next (largest first), although the remainder holds a part of one limit's worth."""
    rig = Rig(home, "split_row_limit: 3\n")
    big, small = "good " * 200, "ok"
    texts = [big, big, small, big, big, small]
    (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t} {i}\n" for i, t in enumerate(texts)))
    for _ in range(5):
        rig.tick()
        if len(rig.provider.open_batches()) == 2:
            break
    first, second = rig.provider.open_batches()
    tokens = {c.index: c.input_tokens for c in rig.job().chunks.values()}
    limit = tokens[0] - 1  # the full chunks (big, big) fit, a whole chunk does not
    rig.provider.finish(first.id, "failed", errors=refusal(limit))
    rig.tick()
    job = rig.job()
    assert job.chunks[2].in_flight and job.chunks[3].staged  # created; the remainder uploaded ahead
    rig.provider.finish(second.id, "failed", errors=refusal(limit))
    rig.tick()
    job = rig.job()
    assert job.chunks[2].in_flight and job.chunks[3].staged
    assert job.chunks[4].input_tokens + job.chunks[3].input_tokens > limit  # both do not fit the room ahead ...
    assert job.chunks[4].staged  # ... and the full chunk, sent next, is uploaded ahead
    (batch,) = rig.provider.open_batches()
    rig.provider.finish(batch.id)
    rig.tick()
    assert rig.job().chunks[4].in_flight  # created with the file uploaded ahead
    for _ in range(3):
        rig.provider.finish_all()
        rig.tick()
    assert rig.events("JobCompleted")
    rig.close()
