"""The store: every API's state and behaviour, independent of HTTP, composed of one part per
concern over one explicit :class:`~batchgrader.emulator.state.State`.

OpenAI and Azure: ``files`` (:class:`~batchgrader.emulator.files.Files`), ``batches``
(:class:`~batchgrader.emulator.lifecycle.Batches`), which use ``validation`` and ``results``;
Anthropic: ``anthropic`` (:class:`~batchgrader.emulator.anthropic.AnthropicBatches`); Gemini:
``gemini_files`` and ``gemini_batches``; the synchronous endpoints: ``sync``; ``faults``.  Each
part is given the parts it uses when it is built, and no part reaches another through the store.
"""

from __future__ import annotations

from typing import Any

from batchgrader.emulator.anthropic import AnthropicBatches
from batchgrader.emulator.config import EmulatorConfig
from batchgrader.emulator.faults import Faults
from batchgrader.emulator.files import Files
from batchgrader.emulator.gemini import GeminiFiles
from batchgrader.emulator.gemini_batches import GeminiBatches
from batchgrader.emulator.lifecycle import Batches
from batchgrader.emulator.persistence import Persistence
from batchgrader.emulator.results import Results
from batchgrader.emulator.state import State
from batchgrader.emulator.sync import Sync, SyncLimits
from batchgrader.emulator.validation import Validation


class Store:
    """The emulator's parts, built over one shared state; what the HTTP side and ``Emulator``
    call.  Every API method takes the state's lock."""

    def __init__(self, config: EmulatorConfig):
        self.state = state = State(config)
        self.lock = state.lock
        self.persist = Persistence(state)
        self.files = Files(state, self.persist, advance=lambda: self.batches.advance_all())
        self.validation = Validation(state)
        self.results = Results(state, self.validation, self.files)
        self.batches = Batches(state, self.persist, self.validation, self.results)
        self.anthropic = AnthropicBatches(state)
        self.gemini_files = GeminiFiles(state, advance=lambda: self.gemini_batches.advance_all())
        self.gemini_batches = GeminiBatches(state, self.gemini_files)
        self.sync = Sync(state)
        self.faults = Faults(config.fault_rates(), config.seed, state.lock)
        if state.data_dir:
            self.persist.load()
            self.anthropic.load()
            self.gemini_files.load()
            self.gemini_batches.load()
            for b in state.batches.values():
                if b.status == "validating":  # restarted mid-validation
                    self.validation.start(b)

    # --- inspection ------------------------------------------------------------------------

    def count_request(self, method: str, route: str) -> None:
        with self.lock:
            self.state.requests[f"{method} {route}"] += 1

    def sync_limits(self) -> SyncLimits:
        """The synchronous endpoints' per-minute limits (their log of requests, for tests)."""
        return self.sync.sync_limits()

    def background_jobs(self) -> int:
        """Background jobs (validations, answer drafts) queued or running."""
        return self.state.worker.jobs() + self.state.answerer.jobs()

    def stop_background(self) -> None:
        """Drop queued background work and stop drafting answers (the emulator stops); what a
        later request needs is then done in place."""
        with self.lock:
            for b in self.state.batches.values():
                if b.drafts is not None:
                    b.drafts.discard()
                b.drafts = None
        self.state.worker.drop_queued()
        self.state.answerer.drop_queued()

    def stats(self) -> dict[str, Any]:
        st = self.state
        with self.lock:
            self.batches.advance_all()
            batches = sorted(st.batches.values(), key=lambda b: b.seq)
            return {
                "simulated": True,
                "requests": dict(st.requests),
                "faults_injected": dict(self.faults.injected),
                "files_created": st.files_created,
                "batches_created": st.batches_created,
                # requests whose prompt tokens the tokenizer counted (not found in the token cache)
                "tokens_counted_requests": st.token_cache.counted_requests,
                "background_jobs": self.background_jobs(),
                "batches": [
                    {
                        "id": b.obj["id"],
                        "status": b.status,
                        "input_file_id": b.obj["input_file_id"],
                        "metadata": b.obj["metadata"],
                        "created_at": b.obj["created_at"],
                        "model": b.obj["model"],
                        "request_counts": self.batches.view(b)["request_counts"],
                        # on the emulator's clock: created, each transition, and the seconds of its work
                        "times": {"created": b.t_created, **b.times},
                    }
                    for b in batches
                ],
                "files": [
                    {
                        "id": f.obj["id"],
                        "filename": f.obj["filename"],
                        "bytes": f.obj["bytes"],
                        "purpose": f.obj["purpose"],
                        "deleted": f.deleted,
                    }
                    for f in sorted(st.files.values(), key=lambda f: f.seq)
                ],
                "scripted_faults_pending": len(self.faults.scripted),
            }
