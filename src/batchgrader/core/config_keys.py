"""The configuration's key catalogue: every key with its default, its check (which returns the
normalised value or says the expected form) and its one-line description (``bgctl config show``
and docs/configuration.md), and the facts the keys are checked against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batchgrader.core.config_values import (
    _api_key,
    _bool,
    _choice,
    _date_choice,
    _days,
    _encoding,
    _float,
    _int,
    _int_between,
    _int_map,
    _opt_bool,
    _opt_choice,
    _opt_float,
    _opt_int,
    _opt_names,
    _opt_str,
    _response_format,
    _store_url,
    _str,
)
from batchgrader.core.providers import ANTHROPIC_API_VERSIONS, ANTHROPIC_DEFAULT_API_VERSION, PROVIDER_FACTS
from batchgrader.core.routes import ROUTES, parse_deadline

#: the most samples a row may ask for (the ``samples`` key): k requests per row multiply the bill by k
MAX_SAMPLES = 20
#: selectable providers, and what a profile's model must look like for each (a model the
#: provider does not offer is refused when the configuration is loaded)
PROVIDERS = tuple(PROVIDER_FACTS)
PROVIDER_MODEL_PREFIX = {name: f.model_prefix for name, f in PROVIDER_FACTS.items() if f.model_prefix}
#: Azure OpenAI data-plane (authoring: files and batches) api-version used unless configured:
#: the latest dated release listed on learn.microsoft.com/azure/ai-services/openai/authoring-reference-preview
#: (checked 2026-11-23; the latest GA release there is 2024-10-21, which newer models do not support)
AZURE_DEFAULT_API_VERSION = "2025-04-01-preview"
#: the values of the reasoning_effort key (the catalogue says which ones each model takes)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
#: the environment variable that holds each provider's key (also read from secrets.env)
PROVIDER_KEY_VAR = {name: f.key_var_text for name, f in PROVIDER_FACTS.items()}
PROVIDER_KEY_SETTING = {name: f.key_setting for name, f in PROVIDER_FACTS.items()}


# --- key catalogue ---------------------------------------------------------------------------
# Each key: default, validator (returns the normalised value or raises ValueError with the
# expected form), one-line description (used by docs and `config show`).


@dataclass(frozen=True)
class Key:
    default: Any
    check: Callable[[Any], Any]
    help: str


KEYS: dict[str, Key] = {
    # what to ask
    "model": Key("gpt-4o-mini", _str, "Model for every request of the job (one model per batch)."),
    "response_field": Key("response", _str, "Input column holding the text being graded."),
    "skip_empty": Key(
        False,
        _bool,
        "Leave rows whose response_field is empty (or only spaces) ungraded, failed with empty_input, instead of sending and paying for them.",
    ),
    "output_column": Key("grade", _str, "Column added to the result file with the model's answer."),
    "id_column": Key(
        None,
        _opt_str,
        "Input column whose values become the requests' custom_id (must be unique); default: derived from the file's content hash and row number.",
    ),
    "system_prompt": Key(
        "You are a careful grader. Read the text and give a short, fair assessment.",
        _opt_str,
        "System prompt text; '{examples}' is replaced by the examples file's content.",
    ),
    "system_prompt_name": Key(
        None, _opt_str, "Name of a prompt in prompts.yaml to use as the system prompt (overrides system_prompt)."
    ),
    "user_prompt": Key(
        None,
        _opt_str,
        "User message template; {column} placeholders take the row's fields. Default: 'Please evaluate the following text: {<response_field>}'.",
    ),
    "examples_file": Key(
        None, _opt_str, "Text file inserted where the system prompt says {examples} (relative paths are under the home)."
    ),
    "max_completion_tokens": Key(
        1000,
        _int(1),
        "Upper bound on output tokens per request, reasoning tokens included (also bounds the cost estimate); left unset, a model that reasons gets its catalogue bound (reasoning_bound), any other model 1000.",
    ),
    "reasoning_effort": Key(
        None,
        _opt_choice(*REASONING_EFFORTS),
        "How hard a reasoning model thinks: OpenAI reasoning_effort, Anthropic thinking (budget or effort), Gemini thinkingBudget/thinkingLevel; null: the model's default. Checked against the model's catalogue row.",
    ),
    "token_param": Key(
        "auto",
        _choice("auto", "max_completion_tokens", "max_tokens"),
        "Request field carrying the output bound; 'auto' uses max_tokens only for models that need it.",
    ),
    "temperature": Key(None, _opt_float(0.0, 2.0), "Sampling temperature, or null to leave the model's default."),
    "response_format": Key(
        None, _response_format, "A JSON schema (object) for structured answers; its fields become their own result columns."
    ),
    "default_encoding": Key(
        "o200k_base",
        _choice("o200k_base", "cl100k_base"),
        "tiktoken encoding for models tiktoken does not know (a warning is shown).",
    ),
    "context_window": Key(
        None, _opt_int(1), "Context window of the model in tokens; default: from the pricing table, else unchecked."
    ),
    # splitting
    "split_token_limit": Key(
        None, _opt_int(1), "Maximum input tokens per batch; null: as large as the provider's caps and queue limit allow."
    ),
    "split_row_limit": Key(None, _opt_int(1), "Maximum requests per batch (the API's hard cap applies anyway)."),
    "force_chunk_count": Key(None, _opt_int(1), "Split into at least this many batches of near-equal size."),
    "max_requests_per_batch": Key(50000, _int(1), "Provider hard cap on requests in one batch."),
    "max_batch_bytes": Key(200_000_000, _int(1024), "Provider hard cap on the JSONL bytes of one batch input file."),
    # running
    "max_simultaneous_batches": Key(
        None, _opt_int(1), "Batches in flight at once across all jobs; null: no cap (the provider's queue limit rules)."
    ),
    "merge_worker_rows": Key(
        10000,
        _opt_int(1),
        "An ended batch of at least this many rows is merged into its rows in a separate process, while the daemon goes on polling and submitting; null: every batch is merged in the daemon's own process.",
    ),
    "halt_on_chunk_failure": Key(False, _bool, "Stop submitting a job's remaining chunks after one of its batches fails."),
    "poll_interval_seconds": Key(
        60.0,
        _float(0.01),
        "Longest wait between polls of a running batch (the wait is 15% of the batch's age, shorter when its end is expected).",
    ),
    "max_row_retries": Key(2, _int(0), "Times a failed row is resubmitted automatically."),
    "preflight_rows": Key(
        3,
        _int(0),
        "Before a job's first batch, send this many of the requests it will send (stored answers, duplicates and rows too large left out) through the provider's synchronous API; any failure fails the job before a batch is created. 0 turns it off.",
    ),
    "route": Key(
        "batch",
        _choice(*ROUTES),
        "How a job's rows travel: 'batch' (batches, half price), 'flex' (synchronous at the flex tier, Batch price; OpenAI models whose catalogue row has flex), 'online' (synchronous at the standard tier, standard price) or 'auto' (online_max_rows and deadline choose).",
    ),
    "deadline": Key(
        None,
        parse_deadline,
        "When a job's results are wanted: a duration from its arrival (90s, 45m, 2h, 1d) or an ISO 8601 time with its offset; route 'auto' goes online when a batch would take longer. A time already past is refused.",
    ),
    "online_max_rows": Key(
        100,
        _int(0),
        "Route 'auto': a file of at most this many rows goes through the synchronous API (flex where the model has it, else online).",
    ),
    "online_concurrency": Key(
        4,
        _int(1),
        "Routes 'flex' and 'online': requests of one job in flight at once (the provider's per-minute limits and Retry-After are honoured on top).",
    ),
    "enqueued_token_limit": Key(
        {}, _int_map, "Per-model cap on input tokens in flight (model -> tokens); a chunk waits for capacity."
    ),
    "max_cost_per_job_usd": Key(None, _opt_float(0.0), "Hold a job whose estimated cost exceeds this."),
    "daily_cost_limit_usd": Key(
        None, _opt_float(0.0), "Hold new submissions once today's spend plus their estimate would exceed this."
    ),
    "daily_token_limit": Key(None, _opt_int(1), "Hold new submissions once today's tokens plus theirs would exceed this."),
    "completion_window": Key("24h", _str, "Batch completion window sent to the provider."),
    "delete_provider_files": Key(True, _bool, "Delete uploaded and result files at the provider once results are stored."),
    "csv_formula_guard": Key(
        True,
        _bool,
        "In CSV results, prefix ' to cells the model wrote (the added columns) that start with = + - @ tab or CR; input cells are never changed.",
    ),
    "sheet": Key(None, _opt_str, "Excel inputs: the sheet whose rows are graded (default: the first sheet)."),
    "encoding": Key(
        "utf-8",
        _encoding,
        "Text encoding of CSV/TSV/JSON/JSONL inputs that are not valid UTF-8 (e.g. cp1252, latin-1); a valid UTF-8 file is read as UTF-8 whatever it says; results are always UTF-8.",
    ),
    "write_report": Key(
        False,
        _bool,
        "Write the `bgctl report --html` page beside each result, named after it (answers_results.csv: answers_report.html).",
    ),
    # judging the grader (store/agreement.py, pipeline/labels.py)
    "reference_column": Key(
        None,
        _opt_str,
        "Input column of human labels; `bgctl report` then shows the answers' agreement with them (rows with an empty label are left out).",
    ),
    "reference_field": Key(
        None,
        _opt_str,
        "Field of the response_format schema compared with the reference_column's labels; default: the output column (required with a schema).",
    ),
    "group_column": Key(
        None, _opt_str, "Input column by whose values `bgctl report` breaks the scores down (e.g. the question)."
    ),
    "samples": Key(
        1,
        _int_between(1, MAX_SAMPLES),
        "Independent answers asked per row (k requests); the answer column holds their vote (majority, or median for numbers), a tie fails the row as no_majority.",
    ),
    "judges": Key(
        None,
        _opt_names,
        "A judge panel: profiles (each its own model, prompt or provider) that answer the same rows in one job; the result has a column per judge and their consensus (majority, or median for numbers; a tie fails the row as no_majority). Set in a profile, not in the default settings.",
    ),
    "on_job_end": Key(
        None,
        _opt_str,
        "Shell command run once when a job ends, with BG_JOB_ID, BG_JOB_STATE, BG_RESULT_PATH, BG_COST_USD set; its output goes to the log.",
    ),
    "on_job_end_timeout_seconds": Key(60.0, _float(0.1), "Time limit of the on_job_end command (it is killed after it)."),
    "pricing_file": Key(
        None,
        _opt_str,
        "CSV of prices merged over the shipped table; relative paths are under the home (default: pricing.csv in the home, if present).",
    ),
    # provider
    "base_url": Key(None, _opt_str, "OpenAI-compatible API base URL (env OPENAI_BASE_URL)."),
    "api_key": Key(None, _api_key, "API key (env OPENAI_API_KEY); never written to logs, the database or outputs."),
    "request_timeout_seconds": Key(120.0, _float(0.1), "Timeout of one HTTP request to the provider."),
    "provider": Key(
        "openai",
        _choice(*PROVIDERS),
        "Batch API a profile's jobs go to: 'openai' (or a server that copies it), 'anthropic' (Message Batches, key ANTHROPIC_API_KEY) or 'gemini' (Gemini Batch API, key GEMINI_API_KEY or GOOGLE_API_KEY).",
    ),
    "anthropic_api_key": Key(
        None, _opt_str, "Anthropic API key (env ANTHROPIC_API_KEY); never written to logs, the database or outputs."
    ),
    "anthropic_base_url": Key(None, _opt_str, "Anthropic API base URL (env ANTHROPIC_BASE_URL)."),
    "anthropic_api_version": Key(
        ANTHROPIC_DEFAULT_API_VERSION,
        _date_choice(*ANTHROPIC_API_VERSIONS),
        "The anthropic-version header sent with every Anthropic call; 2026-10-21 refuses temperature on every model, 2023-06-01 leaves it to each model's catalogue row.",
    ),
    "gemini_api_key": Key(
        None,
        _opt_str,
        "Gemini API key (env GEMINI_API_KEY or GOOGLE_API_KEY; GOOGLE_API_KEY wins, as in the SDK); never written to logs, the database or outputs.",
    ),
    "gemini_base_url": Key(None, _opt_str, "Gemini API base URL (env GOOGLE_GEMINI_BASE_URL)."),
    "azure_api_key": Key(
        None, _opt_str, "Azure OpenAI API key (env AZURE_OPENAI_API_KEY); never written to logs, the database or outputs."
    ),
    "azure_endpoint": Key(
        None, _opt_str, "Azure OpenAI resource endpoint, e.g. https://NAME.openai.azure.com (env AZURE_OPENAI_ENDPOINT)."
    ),
    "azure_api_version": Key(
        AZURE_DEFAULT_API_VERSION,
        _str,
        "Azure OpenAI data-plane api-version sent with every Files and Batches call (env OPENAI_API_VERSION).",
    ),
    "azure_model": Key(
        None,
        _opt_str,
        "provider 'azure': the model the deployment named by 'model' runs (e.g. gpt-4.1-mini), for its price, tokenizer and context window; unset: the deployment name itself must be in the price table.",
    ),
    # housekeeping
    "rescan_interval_seconds": Key(30.0, _float(0.05), "Full inbox rescan period (file events can be lost)."),
    "stable_seconds": Key(
        1.0, _float(0.0), "A file is taken once its size and mtime are unchanged across two looks this far apart."
    ),
    "log_level": Key("INFO", _choice("DEBUG", "INFO", "WARNING", "ERROR"), "Daemon log level."),
    "store_url": Key(
        None,
        _store_url,
        "Where the event log is: null for the SQLite file in the home, or a postgresql:// URL shared by several daemons (docs/scaling.md).",
    ),
    # reusing answers (pipeline/answerkey.py, store/answers.py)
    "reuse_answers": Key(
        None,
        _opt_bool,
        "Answer a request identical to one already answered (same file or earlier jobs) from the stored answer instead of sending it; null: on, except when temperature > 0.",
    ),
    "reuse_truncated_answers": Key(
        False,
        _bool,
        "Deprecated, no effect: an answer cut off by the output limit is a failed row (truncated), never stored or reused.",
    ),
    "cache_days": Key(30.0, _days, "Stored answers are reused for this many days, then dropped; 0 turns reuse off."),
    # prompt-prefix caching at the provider (pipeline/caching.py)
    "prompt_caching": Key(
        True,
        _bool,
        "Lay requests out for the provider's prompt cache: an OpenAI prompt_cache_key per job, Anthropic cache_control on a shared part long enough to cache; false sends neither.",
    ),
}

# Keys that make no sense inside a profile (they configure the daemon, not a job).
GLOBAL_ONLY = {
    "max_simultaneous_batches",
    "merge_worker_rows",
    "poll_interval_seconds",
    "enqueued_token_limit",
    "daily_cost_limit_usd",
    "daily_token_limit",
    "base_url",
    "api_key",
    "anthropic_api_key",
    "anthropic_base_url",
    "anthropic_api_version",
    "gemini_api_key",
    "gemini_base_url",
    "azure_api_key",
    "azure_endpoint",
    "azure_api_version",
    "request_timeout_seconds",
    "rescan_interval_seconds",
    "stable_seconds",
    "log_level",
    "store_url",
    "pricing_file",
    "delete_provider_files",
    "completion_window",
    "on_job_end",
    "on_job_end_timeout_seconds",
}
