"""What to do next: a pure function of the folded state, the configuration and the time.

:func:`decide_job` returns the actions that take one job a step further, in the order the engine
carries them out; :func:`decide` does so for every job.  Nothing here does I/O, reads a clock,
talks to a provider or changes its arguments: the same inputs always give the same actions.

The per-process timing the daemon keeps (when each batch is next polled, which chunks wait
before they are sent again, which batches a cancel was already sent for) is an explicit input,
:class:`Timers`.  Within one tick the engine asks again after each action, passing a
:class:`Step` (the stage reached and the actions already carried out), so that every decision
sees the outcome of the previous one, and each action is tried at most once per tick.

The stages, in order: 0 recover an ended job, 1 restore a reopened input, 2 preflight (the
first rows through the synchronous API, when ``preflight_rows`` > 0) and prepare, 3 cancel
or hold/release, 4 reconcile open intents, 5 poll, 6 collect (download, merge), 7 halt or
cancel unstarted chunks and submit (hold, upload, create), 8 retry failed rows or finish
(write the result, archive the input, delete provider files, end).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from batchgrader.core.configuration.config import Config, Profile
from batchgrader.core.configuration.routes import SYNC_ROUTES
from batchgrader.core.log.route_state import refused_rows
from batchgrader.core.log.state import TERMINAL_BATCH, ChunkState, JobState, State
from batchgrader.core.rules import queue
from batchgrader.core.rules.actions import (
    Action,
    CancelBatch,
    CheckDuplicates,
    Create,
    CreateStaged,
    Download,
    FailBatch,
    FailUnstarted,
    Hold,
    Merge,
    PlanRetries,
    Poll,
    Preflight,
    Prepare,
    Reconcile,
    RecoverEnded,
    Release,
    Replan,
    RestoreInput,
    SearchRecovered,
    SendOnline,
    Step,
    StoreAnswers,
    Timers,
    Upload,
)
from batchgrader.core.rules.budget import budget_problem, job_tokens_bound, utc_day  # noqa: F401 - part of the rules' interface
from batchgrader.core.rules.ending import ending, finish_actions, first_error, reopened_archive, start_failure_actions  # noqa: F401 - part of the rules' interface
from batchgrader.core.rules.panel import decide_panel
from batchgrader.core.rules.polling import MIN_DELAY
from batchgrader.core.rules.preflight_rules import preflight_due
from batchgrader.core.rules.queue import (  # noqa: F401 - part of the rules' interface
    enqueued_tokens,
    known_limit,
    probe_after_completion,
    queue_limit,
    refusal_lesson,
    token_cap,
)
from batchgrader.core.rules.route_rules import online_waits, sync_route
from batchgrader.core.rules.stragglers import past_cutoff, pending, straggler_actions, straggler_cancels, unsent_routes

FIRST_POLL_DELAY = MIN_DELAY  # the first poll after a create (core/rules/polling.py sets the later ones)
#: Row codes never resubmitted automatically; `bgctl retry` still sends them.  Sending them again
#: at once would fail the same way (a row over the limit; an answer cut off by the same output
#: bound or refused by the same model; a chunk the provider's queue refused through every round),
#: or pay twice (rows answered and paid for whose answer could not be read).
NEVER_RETRIED = frozenset({"request_too_large", "truncated", "refused", "queue_full", "output_unavailable", "malformed_result"})
#: A row the provider answered with one of these HTTP statuses is not resent automatically: the
#: request itself is refused (bad parameter, too long, invalid schema) and would fail again.
#: `bgctl retry` still resends it (after the profile or the input was fixed).
NEVER_RETRIED_STATUS = frozenset({400, 404, 413, 422})


def resubmit_delay(poll_interval: float) -> float:
    """How long a chunk refused for the enqueued-token limit waits before it is sent again."""
    return min(max(2 * poll_interval, 1.0), 600.0)


def capacity_refusal(status_code: int | None, message: str) -> bool:
    """A refused create that means "not now" (rate or enqueued-token limit), not "never"."""
    return status_code == 429 or "token_limit" in message


# --- the rules ------------------------------------------------------------------------------------


def upload_name(job_id: str, chunk: int, attempt: int) -> str:
    return f"bg-{job_id}-c{chunk:04d}-a{attempt}.jsonl"


def batches_in_use(state: State, sandbox: bool | None = None) -> int:
    """Batches counted against max_simultaneous_batches: in flight, being sent, or uploaded and
    waiting to be created; with ``sandbox`` given, only those of that queue (a sandbox job's
    batches are the emulator's, a real job's the provider's)."""
    used = 0
    for j in state.active_jobs():
        if sandbox is not None and j.sandbox != sandbox:
            continue
        for c in j.chunks.values():
            if c.staged:
                continue  # uploaded ahead of queue room: not a batch yet
            if c.in_flight or c.open_intent or (c.upload == "done" and c.create in ("none", "failed") and not c.done):
                used += 1
    return used


def list_round_due(state: State, timers: Timers, now: float) -> bool:
    """With two or more batches in flight, one paged batches.list refreshes them all; it is due
    when any of them is due by its own backoff."""
    flying = [(j.job_id, c.index) for j in state.active_jobs() for c in j.chunks.values() if c.in_flight and c.batch_id]
    t = timers.clock(now)
    return len(flying) >= 2 and any(timers.next_poll.get(k, (t, 0.0))[0] <= t for k in flying)


def collectable(c: ChunkState) -> bool:
    """A batch seen ended (read back from the provider, not only named so in a create reply),
    not collected yet, with no duplicate check pending."""
    return (
        c.create == "done" and c.status in TERMINAL_BATCH and c.read_back and not c.done and not c.failure and not c.dup_check_due
    )


def epoch(iso_ts: str | None, default: float) -> float:
    """An event's ISO timestamp as epoch seconds (``default`` when absent)."""
    if not iso_ts:
        return default
    try:
        return datetime.fromisoformat(iso_ts).timestamp()
    except ValueError:
        return default


def duplicate_check_due(c: ChunkState, now: float, timers: Timers, key: tuple[str, int]) -> bool:
    """A chunk created again after an absent or refused create of the same attempt is listed for
    a late batch of the earlier request at once, then every few seconds while the watch lasts
    (``timers.dup_next``; unknown to this process, e.g. after a restart: at once), and always
    before its terminal batch is collected."""
    if not (c.dup_check_due and c.create == "done" and c.batch_id and not c.done):
        return False
    if c.status in TERMINAL_BATCH:
        return True
    due = timers.dup_next.get(key)
    return due is None or timers.clock(now) >= due


def waiting_to_resend(c: ChunkState) -> bool:
    """Refused for the provider's queue limit (token_limit_exceeded): waiting to be sent again."""
    return not c.done and not c.in_flight and not c.open_intent and bool(c.failure and c.failure.get("retryable"))


def unstarted(c: ChunkState) -> bool:
    """Never sent, refused for good before a batch existed, or refused for the queue limit and
    waiting: nothing of it is at the provider."""
    refused = c.failure is not None and bool(c.failure.get("retryable"))
    return (
        not c.done
        and not c.in_flight
        and not c.open_intent
        and (refused or not (c.create == "done" and c.status in TERMINAL_BATCH))
    )


def halt_reason(job: JobState, profile: Profile) -> str | None:
    """With halt_on_chunk_failure, the reason the job's unsent chunks stop (a chunk failed for good)."""
    if not profile.halt_on_chunk_failure or job.retry_requested:
        return None
    failed = [
        c for c in job.chunks.values() if c.failure and not c.failure.get("retryable") and c.failure.get("code") != "halted"
    ]
    if not failed:
        return None
    return f"halted because chunk {failed[0].index} failed: {(failed[0].failure or {}).get('error')}"


def batch_failure(state: State, job: JobState, c: ChunkState, poll_interval: float, queue_url: str = "") -> FailBatch:
    codes = [e.get("code") for e in c.batch_errors]
    msg = (
        "; ".join(
            f"{e.get('code')}: {e.get('message')}" + (f" (line {e['line']})" if e.get("line") else "") for e in c.batch_errors
        )
        or "batch failed"
    )
    if "token_limit_exceeded" in codes:
        refusal = next((e.get("message") for e in c.batch_errors if e.get("code") == "token_limit_exceeded"), msg)
        if queue.fails_alone(
            c.requests, enqueued_tokens(state, job.model or "", exclude=(job.job_id, c.index), sandbox=job.sandbox)
        ):
            why = f"this row alone ({c.input_tokens:,} input tokens) is over the provider's enqueued-token limit: {refusal}"
            return FailBatch(job.job_id, c.index, c.batch_id, "request_too_large", why, False, message=refusal)
        learned = refusal_lesson(state, job, c, refusal, queue_url)
        if learned is not None:
            return FailBatch(job.job_id, c.index, c.batch_id, "token_limit_exceeded", msg, True, 0.0, learned, refusal)
        # nothing new to go by (a queue shared with others): wait longer each round, then give up
        rounds = c.refusals + 1
        if queue.queue_full(rounds):
            why = (
                f"refused {rounds} times for the provider's queue limit although it fits the limit known "
                f"(the queue may be shared with other work); last refusal: {refusal}"
            )
            return FailBatch(job.job_id, c.index, c.batch_id, "queue_full", why, False, message=refusal)
        delay = queue.refusal_wait(resubmit_delay(poll_interval), rounds)
        waiting = (
            f"waiting for room in the provider's queue (refusal {rounds} of {queue.QUEUE_FULL_ROUNDS} although the "
            f"chunk fits the limit known: the queue may be shared; sent again in {delay:.0f} s, after "
            f"{queue.QUEUE_FULL_ROUNDS} refusals its rows fail as queue_full): {msg}"
        )
        return FailBatch(job.job_id, c.index, c.batch_id, "token_limit_exceeded", waiting, True, delay, None, refusal)
    return FailBatch(job.job_id, c.index, c.batch_id, str(codes[0]) if codes else "batch_failed", msg, False)


def retry_ids(job: JobState, profile: Profile) -> list[str]:
    """Failed rows to send again: on `bgctl retry` all but those too large to be accepted
    (``request_too_large``: they would fail the same way; a retry with a new
    ``--max-completion-tokens`` sends them too), else those under max_row_retries (none after a
    halt or a cancel)."""
    if not job.failed_rows:
        return []
    if job.retry_requested:
        if job.retry_bound is not None:  # a new output bound may make a request that was too large fit
            return list(job.failed_rows)
        return [cid for cid, info in job.failed_rows.items() if info.get("code") != "request_too_large"]
    if any(info.get("code") in ("halted", "cancelled") for info in job.failed_rows.values()):
        return []
    refused = set(refused_rows(job))  # refused for good on the synchronous route: `bgctl retry` only
    return [
        cid
        for cid, info in job.failed_rows.items()
        if job.row_attempts.get(cid, 0) < profile.max_row_retries
        and info.get("code") not in NEVER_RETRIED
        and info.get("status") not in NEVER_RETRIED_STATUS
        and cid not in refused
    ]


# --- the decision -----------------------------------------------------------------------------------


def decide(state: State, config: Config, now: float, timers: Timers = Timers(), queue_url: str = "") -> list[Action]:
    """The next actions of every job, oldest job first."""
    actions: list[Action] = []
    for job in sorted(state.jobs.values(), key=lambda j: j.created_ts):
        actions += decide_job(state, job.job_id, config, now, timers, queue_url=queue_url)
    return actions


def next_action(
    state: State, job_id: str, config: Config, now: float, timers: Timers, step: Step, queue_url: str = ""
) -> Action | None:
    """The first action of :func:`decide_job` not yet done and not behind the stage reached."""
    for a in decide_job(state, job_id, config, now, timers, step, queue_url):
        if a.stage >= step.stage and a.key not in step.done:
            return a
    return None


#: a job whose steps raised an unexpected error (a bug, or a fault nothing here foresaw) this many
#: times in a row is held with that error (``JobHeld`` code :data:`STEP_FAILED`), never tried
#: without end; ``bgctl retry`` tries it again, ``bgctl cancel`` ends it
STEP_FAILURES_MAX = 5
STEP_FAILED = "step_failed"


def step_failed(job: JobState) -> bool:
    """Whether the job is held because its steps kept raising (:data:`STEP_FAILURES_MAX`)."""
    return bool(job.held) and (job.held or {}).get("code") == STEP_FAILED


def decide_job(
    state: State,
    job_id: str,
    config: Config,
    now: float,
    timers: Timers = Timers(),
    step: Step = Step(),
    queue_url: str = "",
) -> list[Action]:
    """The actions that take one job a step further, in order.

    Later actions assume the earlier ones succeed (a planned upload uses up capacity), so the
    engine carries out only the first and asks again; ``step`` skips what it already did."""
    job = state.jobs[job_id]
    if job.corrupt:
        return []  # set aside: its log cannot be read
    if job.ended:
        return _after_the_end(job)
    if step_failed(job):  # held after its steps kept raising: until `bgctl retry` (its fold ends the hold) or `bgctl cancel`
        if not job.cancel_requested:
            return []
        released = Release(job_id, "bgctl cancel of a job held for an unexpected error")
        return [released, *_decide_rest(state, job, config, now, timers, step, queue_url)]
    return _decide_rest(state, job, config, now, timers, step, queue_url)


def _decide_rest(
    state: State, job: JobState, config: Config, now: float, timers: Timers, step: Step, queue_url: str
) -> list[Action]:
    """:func:`decide_job` for a job that is not ended, corrupt or held for an unexpected error."""
    job_id = job.job_id
    if job.start_failure is not None:  # it failed before it was prepared: it ends (core/rules/ending.py)
        return start_failure_actions(job)
    panel = decide_panel(state, job, config, now, timers)  # a panel job acts through its judges' jobs
    if panel is not None:
        return panel
    out: list[Action] = [RestoreInput(job_id)] if reopened_archive(job) else []
    if not job.prepared:
        return out + _before_prepare(state, job, config, now, timers)
    held = _cancel_or_release(state, job, config, now, timers)
    if held is None:
        return out  # still held: nothing moves
    out += held
    out += straggler_cancels(job, config, now, timers)  # a deadline near: running batches cancelled
    chunks = list(job.chunks.values())
    out += _open_and_running(job, chunks, now, timers)
    out += _staged_creates(state, job, chunks, config, now, timers, step, queue_url)
    for c in chunks:
        if collectable(c):
            out += _collect(state, job, c, config.default.poll_interval_seconds, queue_url, timers.clock(now), timers)
    if job.cancel_requested:
        out += [
            FailUnstarted(
                job_id, c.index, "cancelled", "cancelled before submission", "the job was cancelled before this row was submitted"
            )
            for c in chunks
            if unstarted(c) or waiting_to_resend(c)
        ]
    else:
        routed = unsent_routes(job, config, now)  # a chunk never sent that a batch could not finish in time
        out += routed
        out += straggler_actions(job, now, timers)  # a cancelled straggler's rows, synchronously
        if not routed:
            out += _submit(state, job, config, now, timers, step, queue_url)
    return out + _when_chunks_are_done(state, job, chunks, config, now, timers)


def _after_the_end(job: JobState) -> list[Action]:
    """An ended job: its final effects again when a crash may have left them undone."""
    if (
        (job.outbox == "started" and job.error_path)
        or (not job.archived_path and job.panel_of is None)  # a judge's job leaves the panel's input alone
        or (job.ended == "failed" and job.outbox == "none")
    ):
        return [RecoverEnded(job.job_id)]
    return []


def _before_prepare(state: State, job: JobState, config: Config, now: float, timers: Timers) -> list[Action]:
    """A job not prepared yet: its synchronous route (within today's limits), else its preflight,
    else its preparation."""
    job_id = job.job_id
    if sync_route(job, config) is not None:
        problem = None if job.override_budget else budget_problem(state, job, config, now)
        if problem is not None:  # today's limits: no request leaves (its estimate comes at prepare)
            return [] if job.held else [Hold(job_id, problem[0], problem[1])]
        out: list[Action] = [Release(job_id)] if job.held else []
        if not online_waits(job, now, timers):
            out.append(SendOnline(job_id))
        return out
    if preflight_due(job, config) and job.online.route not in SYNC_ROUTES and not job.cancel_requested:  # cancelled: nothing sent
        if job.preflight == "unreachable" and job.preflight_retry_at is not None and now < job.preflight_retry_at:
            return []  # the provider could not be reached: wait for the backoff
        return [Preflight(job_id)]
    return [Prepare(job_id)]


def _cancel_or_release(state: State, job: JobState, config: Config, now: float, timers: Timers) -> list[Action] | None:
    """A cancel sent to each running batch, or the release of a hold the budget now allows;
    None while the job stays held."""
    if job.cancel_requested:
        return [
            CancelBatch(job.job_id, c.index, c.batch_id)
            for c in job.chunks.values()
            if c.in_flight
            and c.batch_id
            and c.batch_id not in timers.cancel_sent
            and c.status not in ("cancelling", *TERMINAL_BATCH)
        ]
    if job.held:
        if not (job.override_budget or budget_problem(state, job, config, now) is None):
            return None
        return [Release(job.job_id)]
    return []


def _open_and_running(job: JobState, chunks: list[ChunkState], now: float, timers: Timers) -> list[Action]:
    """Every open intent reconciled, every running batch whose poll is due polled, every chunk
    whose duplicate listing is due listed."""
    job_id = job.job_id
    t = timers.clock(now)
    # a create whose outcome is unknown is listed at its settle times (core/rules/settle.py), an upload at once
    out: list[Action] = [
        Reconcile(job_id, c.index, c.open_intent)
        for c in chunks
        if c.open_intent and (c.open_intent != "create" or timers.next_listing.get((job_id, c.index), t) <= t)
    ]
    for c in chunks:
        if c.in_flight and c.batch_id and timers.next_poll.get((job_id, c.index), (t, 0.0))[0] <= t:
            out.append(Poll(job_id, c.index, c.batch_id))
    out += [CheckDuplicates(job_id, c.index) for c in chunks if duplicate_check_due(c, now, timers, (job_id, c.index))]
    return out


def _staged_creates(
    state: State, job: JobState, chunks: list[ChunkState], config: Config, now: float, timers: Timers, step: Step, queue_url: str
) -> list[Action]:
    """Room may have just appeared: a chunk uploaded ahead is created before any collect (not
    before a refused batch of the model is collected: it may teach a lower limit)."""
    if (
        job.cancel_requested
        or not any(c.staged and c.upload == "done" for c in chunks)
        or _refusal_to_learn(state, job.model, job.sandbox)
    ):
        return []
    staged = {c.index for c in chunks if c.staged}
    return [
        CreateStaged(job.job_id, a.chunk)
        for a in _submit(state, job, config, now, timers, step, queue_url)
        if type(a) is Create and a.chunk in staged
    ]


def _when_chunks_are_done(
    state: State, job: JobState, chunks: list[ChunkState], config: Config, now: float, timers: Timers
) -> list[Action]:
    """Once every chunk is done: the retries, or the job's end; a merged chunk's answers are
    stored after everything that brings results sooner, and not while any batch runs (the end of
    a batch seen seconds late costs more)."""
    store: list[Action] = [StoreAnswers(job.job_id, c.index) for c in chunks if c.answers_due is not None]
    if all(c.done for c in chunks):
        profile = config.profile(job.profile)
        ids = [] if job.cancel_requested or past_cutoff(job, now) else retry_ids(job, profile)
        if ids:
            return [PlanRetries(job.job_id, tuple(ids))]
        return finish_actions(job, config, store, now, timers)
    if store and not batches_in_flight(state):
        return store
    return []


def batches_in_flight(state: State) -> bool:
    """Whether a batch of any job is at the provider and not collected (running, its create
    asked, or ended and not merged yet).  Storing a chunk's answers takes seconds per 50,000
    rows, with no poll meanwhile and the CPU a merge in a worker process needs."""
    return any(c.in_flight or c.create == "requested" or collectable(c) for j in state.active_jobs() for c in j.chunks.values())


def _refusal_to_learn(state: State, model: str | None, sandbox: bool | None = None) -> bool:
    """A failed batch of ``model`` not collected yet (a refusal may teach a lower queue limit),
    in the queue of the ``sandbox`` flag given."""
    return any(collectable(c) and c.status == "failed" for _, c in queue.model_chunks(state, model, sandbox))


def _collect(
    state: State, job: JobState, c: ChunkState, poll_interval: float, queue_url: str, t: float, timers: Timers
) -> list[Action]:
    """A batch seen ended: its failure, its result files downloaded (each once its back-off after
    a failed download has passed), then its merge (not while a worker process merges it)."""
    if c.status == "failed":
        return [batch_failure(state, job, c, poll_interval, queue_url)]
    out: list[Action] = []
    waiting = False
    for kind, file_id in (("output", c.output_file_id), ("error", c.error_file_id)):
        if file_id and c.downloads.get(kind, {}).get("state") not in ("done", "failed"):
            waiting = True
            if timers.download_after.get((job.job_id, c.index, kind), t) <= t:
                out.append(Download(job.job_id, c.index, c.batch_id, kind, file_id))
    if not waiting and timers.merging.get((job.job_id, c.index), t) <= t:  # every file downloaded (or given up): merge
        out.append(Merge(job.job_id, c.index))
    return out


def _submit(
    state: State, job: JobState, config: Config, now: float, timers: Timers, step: Step, queue_url: str = ""
) -> list[Action]:
    """Halt after a failed chunk, hold over budget, else upload and create as far as the
    provider's queue limit (and max_simultaneous_batches, if set) allows; re-plan a chunk
    larger than the limit."""
    profile = config.profile(job.profile)
    reason = halt_reason(job, profile)
    if reason is not None:
        # retry and re-planned chunks too, or the job would wait for them forever (a file uploaded ahead is deleted)
        return [FailUnstarted(job.job_id, c.index, "halted", reason, reason) for c in job.chunks.values() if pending(c)]
    waiting = [c for c in job.chunks.values() if pending(c)]
    if not waiting:
        return []
    if job.recovered_since is not None:
        return [SearchRecovered(job.job_id)]  # its batches may exist from before the log was lost
    if not any(c.upload != "none" for c in job.chunks.values()):
        problem = budget_problem(state, job, config, now)
        if problem:
            return [Hold(job.job_id, problem[0], problem[1])]
    halt = profile.halt_on_chunk_failure and not job.retry_requested
    if halt and any(x.failure and not x.failure.get("retryable") for x in job.chunks.values()):
        return []  # only "halted" chunks failed: nothing more is sent
    return _fill_queue(state, job, waiting, config, now, timers, step, queue_url)


@dataclass
class _Room:
    """What is left while the waiting chunks are offered the provider's queue: batches under
    ``max_simultaneous_batches``, the tokens enqueued so far, and the room for files uploaded
    ahead of queue room (None: no known limit)."""

    free: int
    enqueued: int
    ahead: int | None


def _fill_queue(
    state: State,
    job: JobState,
    waiting: list[ChunkState],
    config: Config,
    now: float,
    timers: Timers,
    step: Step,
    queue_url: str,
) -> list[Action]:
    model = job.model or ""
    limit, exact = queue_limit(state, config, model, queue_url)
    cap = config.default.max_simultaneous_batches
    sandbox = job.sandbox  # the emulator's queue or the provider's: the other's batches take no room here
    enqueued = enqueued_tokens(state, model, sandbox=sandbox) - queue.doomed_tokens(
        state, model, known_limit(state, queue_url, model), sandbox=sandbox
    )
    # files uploaded ahead of queue room: one queue limit's worth per model, the chunks that will
    # be sent next (largest first: a waiting chunk already uploaded ahead keeps a part of it only
    # when it fits there, as a larger one is sent before it)
    waiting_here = {c.index for c in waiting}
    room = _Room(
        free=(1 << 30) if cap is None else cap - batches_in_use(state, sandbox),
        enqueued=enqueued,
        ahead=None
        if limit is None
        else limit - queue.staged_tokens(state, model, but=(job.job_id, waiting_here), sandbox=sandbox),
    )
    # a chunk over the limit is re-planned at once (the wait after a refusal is for sending it
    # again), after the chunks that can be sent now: a re-plan takes a while, the queue's room
    # does not wait for it
    out: list[Action] = []
    replans: list[Action] = []
    for c in queue.fill_order(waiting):
        if queue.needs_replan(limit, c.input_tokens, c.requests, exact):
            assert limit is not None
            if ("Replan", c.index, None) not in step.done:
                replans.append(Replan(job.job_id, c.index, limit, exact))
            continue
        if timers.not_before.get((job.job_id, c.index), float("-inf")) > timers.clock(now):
            continue
        if c.upload == "done" and c.create in ("none", "failed"):
            out += _create_uploaded(job, c, room, limit, exact, step)
            continue
        if room.free <= 0:
            break
        if not queue.has_room(limit, room.enqueued, c.input_tokens, exact):
            out += _upload_ahead(job, c, room, limit, step)
            continue
        if ("Upload", c.index, None) in step.done:
            continue
        attempt = c.attempt + 1
        out.append(Upload(job.job_id, c.index, attempt, upload_name(job.job_id, c.index, attempt)))
        out.append(Create(job.job_id, c.index))
        room.free -= 1
        room.enqueued += c.input_tokens
    return out + replans


def _create_uploaded(job: JobState, c: ChunkState, room: _Room, limit: int | None, exact: bool, step: Step) -> list[Action]:
    """A chunk whose file is at the provider: create (again) with the same file when the queue has
    room; a chunk uploaded ahead that still waits holds its part of the room ahead."""
    staged = c.staged  # uploaded ahead: not counted by enqueued_tokens nor batches_in_use
    counted = c.input_tokens if c.failure is None and not staged else 0  # enqueued_tokens counts it already
    if (
        (room.free > 0 or not staged)
        and ("Create", c.index, None) not in step.done
        and queue.has_room(limit, room.enqueued - counted, c.input_tokens, exact)
    ):
        room.enqueued += c.input_tokens - counted
        room.free -= 1 if staged else 0
        return [Create(job.job_id, c.index)]
    if staged and room.ahead is not None and c.input_tokens <= room.ahead:
        room.ahead -= c.input_tokens
    return []


def _upload_ahead(job: JobState, c: ChunkState, room: _Room, limit: int | None, step: Step) -> list[Action]:
    """Waiting for room in the provider's queue: upload the file now, so that only the create is
    left when room appears (within one queue limit's worth of files ahead)."""
    if room.ahead is None or c.upload == "started" or c.input_tokens > room.ahead or ("Upload", c.index, None) in step.done:
        return []
    attempt = c.attempt + 1
    room.ahead -= c.input_tokens
    return [Upload(job.job_id, c.index, attempt, upload_name(job.job_id, c.index, attempt), True, limit, room.enqueued)]


# --- reusing answers (issue 14) ----------------------------------------------------------------------
def reuse_allowed(profile: Profile) -> bool:
    """Whether a profile reuses answers: ``cache_days`` > 0 and ``reuse_answers`` true, or left
    unset (null) with a temperature of 0 or none.  With a temperature above 0 people sample on
    purpose and want a new answer each time, so reuse then needs ``reuse_answers: true``."""
    if profile.cache_days <= 0 or profile.reuse_answers is False:
        return False
    return profile.reuse_answers is True or not (profile.temperature or 0) > 0


def reuse_enabled(job: JobState, profile: Profile) -> bool:
    """Whether a job's rows may be answered from stored answers or identical rows: the profile
    allows it and the file was not submitted with ``bgctl submit --fresh``."""
    return not job.fresh and reuse_allowed(profile)
