"""emulator: a local, SIMULATED OpenAI Files + Batches API (and Azure's, Anthropic's, Gemini's) for
tests, demos and the sandbox mode (``bgctl emulator``, ``bgctl daemon --sandbox``).

It is a real HTTP server on 127.0.0.1 that the official ``openai`` SDK talks to through
``base_url="http://127.0.0.1:PORT/v1"``.  Nothing here contacts OpenAI.

What it does (see ``/work/shared/reference/openai-batch-api-facts.md`` for the real API):

* ``/v1/files`` (upload, list, retrieve, delete, content) and ``/v1/batches`` (create, list,
  retrieve, cancel) with the real JSON objects and error bodies.
* Batches move ``validating -> in_progress -> finalizing -> completed`` on a configurable clock.
  Transitions are computed lazily, in time order across all batches, whenever state is read,
  so a test can drive an injected :class:`ManualClock` and get the same result however often
  it polls.  An input file is parsed and counted in a background worker (not in a client's
  request), so on the real clock a batch validates when that work is done; on another clock a
  due validation waits for it.  Also ``failed`` (validation, token limit, missing file), ``expired`` (deadline or
  forced, with partial output) and ``cancelling -> cancelled`` (partial output).
* Outputs are deterministic answers (hash of custom_id + messages), valid JSON for
  ``response_format`` json_schema/json_object, exact prompt tokens (the project's
  :class:`~batchgrader.tokens.ChatTokenCounter`), shuffled line order (seeded).
* Faults: seeded profiles (``none``, ``flaky``, ``drops``, ``slow``, ``chaos``) and precisely
  scripted faults (``Emulator.script_fault``), e.g. "create the batch, then drop the connection".
* Inspection: :meth:`Emulator.stats` in process and ``GET /_emulator/stats`` over HTTP.
* Optional persistence in ``data_dir`` so a restarted emulator keeps files and batches.

Deliberate simplifications (documented, not hidden): only ``/v1/chat/completions`` requests
are answered (other endpoints are accepted, and each request ends in the error file with a 400);
requests of a cancelled batch that were never started appear in neither file; line numbers in
validation errors are 1-based.

The package, by concept.  One shared :class:`~batchgrader.emulator.state.State` (``state``:
the lock, clock, configuration, OpenAI files and batches, counters, workers) and one part per
concern, each given what it uses when ``store`` builds it (no part reaches another through the
store).  OpenAI and Azure: ``files`` (Files API), ``lifecycle`` (Batches API and the clock),
``validation`` (input checks and request plans), ``results`` (answers as they are due, result
files), ``answers`` (chat answers), ``persistence`` (``data_dir``).  Anthropic: ``anthropic``
(Message Batches).  Gemini: ``gemini`` (Files API, answers) and ``gemini_batches``.  All
providers: ``sync`` (the synchronous endpoints), ``faults`` (profiles and scripted faults),
``rules`` (per-request rules from the catalogue), ``prompt_cache``, ``schema_values`` (JSON for
structured outputs), ``background`` (the token cache and the worker off the request path),
``config`` (constants, :class:`EmulatorConfig`).  HTTP: ``routes`` (the route table),
``dialects`` (each API's auth and error bodies), ``routing`` (the request handler), ``upload``
(bodies to disk); ``server`` (:class:`Emulator`, :func:`run_emulator`).
"""

from batchgrader.emulator.common import ApiError
from batchgrader.emulator.config import (
    BATCH_EXPIRED_MESSAGE,
    CHAT_ENDPOINT,
    ENQUEUED_STATUSES,
    EXPIRE_AFTER_METADATA_KEY,
    FAIL_400_TRIGGER,
    FAIL_500_TRIGGER,
    REFUSE_TRIGGER,
    RESPONSES_ENDPOINT,
    SIMULATED_BANNER,
    TERMINAL_STATUSES,
    THIRTY_DAYS,
    UPLOAD_PURPOSES,
    VALID_ENDPOINTS,
    EmulatorConfig,
    token_limit_message,
)
from batchgrader.emulator.faults import FAULT_KINDS, FAULT_PROFILES, Fault, FaultRates
from batchgrader.emulator.lifecycle import ManualClock
from batchgrader.emulator.schema_values import generate_from_schema
from batchgrader.emulator.server import Emulator, run_emulator, serve_forever

__all__ = [
    "token_limit_message",
    "BATCH_EXPIRED_MESSAGE",
    "CHAT_ENDPOINT",
    "REFUSE_TRIGGER",
    "RESPONSES_ENDPOINT",
    "ENQUEUED_STATUSES",
    "EXPIRE_AFTER_METADATA_KEY",
    "FAIL_400_TRIGGER",
    "FAIL_500_TRIGGER",
    "FAULT_KINDS",
    "FAULT_PROFILES",
    "SIMULATED_BANNER",
    "TERMINAL_STATUSES",
    "THIRTY_DAYS",
    "UPLOAD_PURPOSES",
    "VALID_ENDPOINTS",
    "ApiError",
    "Emulator",
    "EmulatorConfig",
    "Fault",
    "FaultRates",
    "ManualClock",
    "generate_from_schema",
    "run_emulator",
    "serve_forever",
]
