"""Emulator constants and configuration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchgrader.emulator.faults import FAULT_PROFILES, FaultRates

SIMULATED_BANNER = "SIMULATED — not a real OpenAI service"

VALID_ENDPOINTS = (
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
)
CHAT_ENDPOINT = "/v1/chat/completions"
#: OpenAI's Responses API: ``POST /v1/responses``, and a batch whose lines target it
RESPONSES_ENDPOINT = "/v1/responses"
#: OpenAI's embeddings: a batch whose lines target it (answered by :mod:`batchgrader.emulator.embeddings`)
EMBEDDINGS_ENDPOINT = "/v1/embeddings"
#: Azure OpenAI's chat endpoint on its date-versioned (api-version) surface: the batch's
#: ``endpoint`` and every line's ``url`` (learn.microsoft.com batch how-to, Python tab)
AZURE_CHAT_ENDPOINT = "/chat/completions"
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
# Batches whose input tokens count against the per-model enqueued-token limit.
ENQUEUED_STATUSES = frozenset({"in_progress", "finalizing", "cancelling"})

#: Metadata key: the batch expires after this many requests were answered (tests).
EXPIRE_AFTER_METADATA_KEY = "emulator_expire_after_requests"
#: Trigger strings: a request whose user content contains one fails with that HTTP status.
FAIL_400_TRIGGER = "__FAIL_400__"
FAIL_500_TRIGGER = "__FAIL_500__"
#: A request whose user content contains it is answered with a refusal (HTTP 200; the answer's
#: ``refusal``, as the model's own refusal arrives), on chat completions and the Responses API.
REFUSE_TRIGGER = "__REFUSE__"
REFUSAL_TEXT = "I'm sorry, but I can't help with that."

BATCH_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
THIRTY_DAYS = 30 * 86400
REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


@dataclass
class EmulatorConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    api_key: str | None = None  # None: any non-empty bearer key is accepted
    organization: str = "org-emulator"
    validating_s: float = 0.05
    in_progress_s: float = 0.05
    finalizing_s: float = 0.05
    cancelling_s: float = 0.05
    completion_window_s: float = 86400.0  # a batch still in progress this long after creation expires
    clock: Callable[[], float] = time.time
    token_limits: Mapping[str, int] = field(default_factory=dict)  # model -> enqueued-token limit
    # False: the token_limit_exceeded message leaves out "Limit: N enqueued tokens." (the client
    # must then find the limit by itself, as with providers whose message carries no figure)
    token_limit_figure: bool = True
    max_requests_per_batch: int = 50_000
    max_batch_file_bytes: int = 200 * 1024 * 1024
    # Azure OpenAI: live batch files uploaded without ``expires_after`` a resource may hold
    # (learn.microsoft.com batch how-to: 500; 10,000 with an expiry of 14 to 30 days)
    azure_files_without_expiry: int = 500
    request_failure_rate: float = 0.0  # seeded fraction of requests that fail with a 500
    # per-minute limits of the synchronous endpoints, per model (None: none): over one, a 429 with
    # Retry-After and the provider's rate-limit headers (sync.py)
    sync_requests_per_minute: int | None = None
    sync_tokens_per_minute: int | None = None
    sync_limit_window_s: float = 60.0  # the "minute" of those limits (tests shorten it)
    faults: str | FaultRates = "none"
    seed: int = 0
    data_dir: str | os.PathLike[str] | None = None
    shuffle_output: bool = True
    answer_fn: Callable[[str, dict[str, Any]], str] | None = None  # custom_id, body -> content
    # The models it serves (rules.known_model): the shipped catalogue's (data/pricing.csv, with
    # aliases and dated snapshots), these ids (e.g. Azure deployment names), and the ``model``
    # column of this catalogue file (a user's pricing.csv; read again when it changes).  Any other
    # id is answered 404 as the real API answers a model it does not know.
    extra_models: tuple[str, ...] = ()
    models_file: str | os.PathLike[str] | None = None
    leak_key_in_errors: bool = False  # test only: echo the presented key verbatim in 401 bodies
    # Provider quirks (adversarial tests): batches answered without their metadata; list
    # endpoints that ignore the ``after`` cursor (always the first page); file content sent
    # gzip-compressed with the compressed Content-Length (as a compressing proxy does).
    drop_metadata: bool = False
    # Gemini's countTokens counts the top-level ``contents`` and ignores ``generateContentRequest``
    # (an endpoint that does not honour the full request: the counting hook must notice)
    gemini_count_contents_only: bool = False
    ignore_after_cursor: bool = False
    gzip_content: bool = False
    # prompt tokens billed on top of the messages for a request with a json_schema response_format
    # (the real provider bills the schema too, in an amount it does not publish); None: the tokens
    # of the json_schema object as compact JSON (validation.schema_tokens); 0: none
    schema_overhead_tokens: int | None = None
    # Called in the handler thread as on_request(method, route, phase) with phase "received"
    # (before the call takes effect) and "effected" (after it took effect, before the answer is
    # sent); route is the template, e.g. "/v1/batches/{id}".  May block (crash tests kill the
    # client here).  Not called for /_emulator admin paths.
    on_request: Callable[[str, str, str], None] | None = None

    def fault_rates(self) -> FaultRates:
        if isinstance(self.faults, FaultRates):
            return self.faults
        try:
            return FAULT_PROFILES[self.faults]
        except KeyError:
            raise ValueError(f"unknown fault profile {self.faults!r} (one of {', '.join(FAULT_PROFILES)})") from None


def token_limit_message(model: str, organization: str, limit: int | None) -> str:
    """The real API's text for a batch refused at validation for the enqueued-token limit;
    ``limit=None`` gives the same text without the figure."""
    figure = f" Limit: {limit:,} enqueued tokens." if limit is not None else ""
    return (
        f"Enqueued token limit reached for {model} in organization {organization}.{figure} "
        "Please try again once some in_progress batches have been completed."
    )
