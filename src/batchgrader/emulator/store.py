"""The store: all API state and behaviour, independent of HTTP, combined from the mixins."""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

from batchgrader.emulator.answers import AnswersMixin
from batchgrader.emulator.anthropic import AnthropicMixin, _MsgBatch
from batchgrader.emulator.background import TokenCache, Worker
from batchgrader.emulator.config import EmulatorConfig
from batchgrader.emulator.faults import FaultsMixin
from batchgrader.emulator.files import FilesMixin
from batchgrader.emulator.gemini import GeminiMixin, _GemBatch, _GemFile
from batchgrader.emulator.lifecycle import BatchesMixin
from batchgrader.emulator.persistence import PersistenceMixin
from batchgrader.emulator.state import _Batch, _File
from batchgrader.emulator.sync import SyncMixin
from batchgrader.emulator.validation import ValidationMixin


class _Store(
    SyncMixin, FilesMixin, BatchesMixin, ValidationMixin, AnswersMixin, AnthropicMixin, GeminiMixin, FaultsMixin, PersistenceMixin
):
    """All API state and behaviour, independent of HTTP. Every public method takes the lock."""

    def __init__(self, config: EmulatorConfig):
        self.cfg = config
        self.clock = config.clock
        self.lock = threading.RLock()
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self.msg_batches: dict[str, _MsgBatch] = {}
        self.gem_files: dict[str, _GemFile] = {}
        self.gem_batches: dict[str, _GemBatch] = {}
        self.gem_uploads: dict[str, dict[str, Any]] = {}
        self.seq = 0
        self.requests: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.files_created = 0
        self.batches_created = 0
        self.custom_id_seen: Counter[str] = Counter()
        self.scripted: list[dict[str, Any]] = []
        self.rates = config.fault_rates()
        self.fault_rng = random.Random(f"faults:{config.seed}")
        self.data_dir = Path(config.data_dir) if config.data_dir else None
        self.scratch = Path(tempfile.mkdtemp(prefix="bg-emulator-"))
        weakref.finalize(self, shutil.rmtree, self.scratch, True)  # removed with the store (or at exit)
        self.token_cache = TokenCache()
        self.worker = Worker(self.clock, "emulator-validation")
        self.answerer = Worker(self.clock, "emulator-answers")
        self.real_clock = self.clock is time.time  # see _StoreBase.real_clock
        if self.data_dir:
            self._load()
            self._msg_load()
            self._gem_load()
            for b in self.batches.values():
                if b.status == "validating":  # restarted mid-validation
                    self._start_validation(b)

    # --- inspection ------------------------------------------------------------------------

    def count_request(self, method: str, route: str) -> None:
        with self.lock:
            self.requests[f"{method} {route}"] += 1

    def background_jobs(self) -> int:
        """Background jobs (validations, answer drafts) queued or running."""
        return self.worker.jobs() + self.answerer.jobs()

    def stop_background(self) -> None:
        """Drop queued background work and stop drafting answers (the emulator stops); what a
        later request needs is then done in place."""
        with self.lock:
            for b in self.batches.values():
                if b.drafts is not None:
                    b.drafts.discard()
                b.drafts = None
        self.worker.drop_queued()
        self.answerer.drop_queued()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            self._advance_all()
            batches = sorted(self.batches.values(), key=lambda b: b.seq)
            return {
                "simulated": True,
                "requests": dict(self.requests),
                "faults_injected": dict(self.faults_injected),
                "files_created": self.files_created,
                "batches_created": self.batches_created,
                # requests whose prompt tokens the tokenizer counted (not found in the token cache)
                "tokens_counted_requests": self.token_cache.counted_requests,
                "background_jobs": self.background_jobs(),
                "batches": [
                    {
                        "id": b.obj["id"],
                        "status": b.status,
                        "input_file_id": b.obj["input_file_id"],
                        "metadata": b.obj["metadata"],
                        "created_at": b.obj["created_at"],
                        "model": b.obj["model"],
                        "request_counts": self._view(b)["request_counts"],
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
                    for f in sorted(self.files.values(), key=lambda f: f.seq)
                ],
                "scripted_faults_pending": len(self.scripted),
            }
