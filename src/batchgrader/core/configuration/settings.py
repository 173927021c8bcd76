"""The settings, each declared once: one :class:`Setting` per configuration key, in :class:`Settings`.

A declaration holds every fact of its setting: the default, the check (which returns the normalised
value or raises ``ValueError`` with the expected form; the setting's type is what the check returns),
the section of docs/configuration.md that documents it and its doc line there, whether a profile may
set it (``profile=False``: it configures the daemon, so only the top level of config.yaml or the
environment sets it), whether only a restart applies a change (``restart=True``: the daemon reads it
at start-up), and whether it is a secret (``secret=True``: masked wherever a value is shown, kept out
of logs and of a hook's environment).  Its environment variables follow: ``BATCHGRADER_<KEY>``, and
the provider SDK's own variables that :mod:`batchgrader.core.configuration.providers` declares for it.

Everything else is derived from the declarations: :data:`KEYS` (what the loader validates, in the
order ``bgctl config show`` prints), :data:`GLOBAL_ONLY`, :data:`RESTART_ONLY_KEYS`,
:data:`SECRET_KEYS` and the key tables of docs/configuration.md (:mod:`batchgrader.core.configuration.config_docs`).
:class:`~batchgrader.core.configuration.config.Profile` and :class:`~batchgrader.core.configuration.config.Config` inherit the
declarations as typed attributes: ``profile.max_row_retries`` is an ``int``, ``profile.context_window``
an ``int | None``, and a misspelt name is a type error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from batchgrader.core.configuration.config_values import (
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
from batchgrader.core.configuration.providers import ANTHROPIC_API_VERSIONS, ANTHROPIC_DEFAULT_API_VERSION, PROVIDER_FACTS
from batchgrader.core.configuration.routes import ROUTES, parse_deadline
from batchgrader.core.rules.cron import check_schedule

ENV_PREFIX = "BATCHGRADER_"
#: the most samples a row may ask for (the ``samples`` key): k requests per row multiply the bill by k
MAX_SAMPLES = 20
#: selectable providers (core/configuration/providers.py), in the order ``provider`` lists its choices
PROVIDERS = tuple(PROVIDER_FACTS)
#: Azure OpenAI data-plane (authoring: files and batches) api-version used unless configured:
#: the latest dated release listed on learn.microsoft.com/azure/ai-services/openai/authoring-reference-preview
#: (checked 2026-11-23; the latest GA release there is 2024-10-21, which newer models do not support)
AZURE_DEFAULT_API_VERSION = "2025-04-01-preview"
#: the values of the reasoning_effort key (the catalogue says which ones each model takes)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

T = TypeVar("T")


class _Values(Protocol):
    """What a setting is read from: a profile's (or the configuration's default) values by key."""

    @property
    def values(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, eq=False)
class Setting(Generic[T]):
    """One setting's declaration, and (as a class attribute of :class:`Settings`) the typed
    attribute that reads its value from ``values``."""

    default: Any  # checked by tests/test_settings.py: its check returns it unchanged
    check: Callable[[Any], T]  # the setting's type is what it returns
    section: str  # the heading of docs/configuration.md whose table lists it
    doc: str  # its row's "what it does"
    profile: bool = True  # a profile may set it (False: the top level of config.yaml or the environment only)
    restart: bool = False  # read when the daemon starts: a reload keeps the old value and warns
    secret: bool = False  # never shown, logged, stored, or passed to a hook
    name: str = field(default="", init=False)  # the key, from the attribute it is declared as

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "name", name)

    @property
    def env(self) -> str:
        """Its own environment variable (the SDKs' variables are :func:`sdk_env_names`)."""
        return env_name(self.name)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, obj: _Values, owner: type | None = None) -> T: ...

    def __get__(self, obj: _Values | None, owner: type | None = None) -> Setting[T] | T:
        if obj is None:
            return self
        return obj.values[self.name]  # type: ignore[no-any-return]


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


# the sections of docs/configuration.md, in the order of its tables
ASK = "What to ask"
SPLIT = "Splitting into batches"
RUN = "Running"
PROVIDER = "Provider"
HOUSE = "Housekeeping"
REUSE = "Reusing answers"
CACHING = "Prompt caching"
JUDGING = "Judging the grader"
SECTIONS = (ASK, SPLIT, RUN, PROVIDER, HOUSE, REUSE, CACHING, JUDGING)


class Settings:
    """Every setting, in the order ``bgctl config show`` lists them.  The values live in the
    holder's ``values`` mapping (a :class:`~batchgrader.core.configuration.config.Profile`'s, or a
    :class:`~batchgrader.core.configuration.config.Config`'s default profile's)."""

    # one declaration per setting: default, check, section, then its doc line and flags
    # fmt: off
    model = Setting("gpt-5.4-mini", _str, ASK,
        "Model for every request of the job (a batch always has one model). The model needs a row in the pricing table, or the "
        "job fails before anything is sent.")
    response_field = Setting("response", _str, ASK,
        "Input column holding the text to grade. The default `user_prompt` uses it, and every row must have it.")
    skip_empty = Setting(False, _bool, ASK,
        "Rows whose `response_field` is empty (or only spaces) are counted either way (`bgctl count`, `bgctl status JOB`: "
        "`empty_rows` in `--json`). With `false` they are sent and billed like any row; with `true` they are never sent: each "
        "is failed with `empty_input` in the result's `error` column (not retried, not counted against the exit code of "
        "`count`).")
    output_column = Setting("grade", _str, ASK,
        "Name of the result column that receives the model's answer (prefixed `bg_` if the input already has such a column).")
    id_column = Setting(None, _opt_str, ASK,
        "Input column whose values become the requests' `custom_id`. The values must be non-empty and unique, or the job fails."
        " The default is `bg-<first 16 hex digits of the file's sha256>-<row number>`, which is deterministic.")
    system_prompt = Setting("You are a careful grader. Read the text and give a short, fair assessment.", _opt_str, ASK,
        "System prompt text. Only the `{examples}` placeholder is allowed in it (see below). `null` sends no system message, "
        "unless an examples file is set.")
    system_prompt_name = Setting(None, _opt_str, ASK,
        "Name of a prompt in `<home>/prompts.yaml`. It replaces `system_prompt` when set.")
    user_prompt = Setting(None, _opt_str, ASK,
        "User message template with `{column}` placeholders. `null` means `Please evaluate the following text: "
        "{<response_field>}`. It needs at least one placeholder.")
    examples_file = Setting(None, _opt_str, ASK,
        "UTF-8 text file inserted into the system prompt at `{examples}`. A relative path is taken under the home.")
    max_completion_tokens = Setting(1000, _int(1), ASK,
        "Upper bound on output tokens per request, reasoning (thinking) tokens included. It is sent with every request and is "
        "also the output part of the maximum cost estimate. Left unset, a model that reasons (under its default or the "
        "profile's `reasoning_effort`) gets its catalogue row's `reasoning_bound` (25,000 for OpenAI reasoning models, as "
        "OpenAI recommends); any other model 1000. A bound above the model's `max_output` is a configuration error.")
    reasoning_effort = Setting(None, _opt_choice(*REASONING_EFFORTS), ASK,
        "How hard a reasoning model thinks: `none`, `minimal`, `low`, `medium`, `high`, `xhigh` or `max`. Sent as OpenAI "
        "`reasoning_effort`; Anthropic extended thinking `budget_tokens` (low 1,024, medium 4,096, high 16,384) or adaptive "
        "thinking with `output_config.effort`; Gemini `thinkingConfig.thinkingBudget` (2.5: low 1,024, medium 8,192, high "
        "24,576; `none` 0) or `thinkingLevel` (3.x). `null` leaves the model's default. An effort the model does not take (its "
        "catalogue row's `reasoning_efforts`), or any effort on a model that does not reason, is a configuration error.")
    token_param = Setting("auto", _choice("auto", "max_completion_tokens", "max_tokens"), ASK,
        "Request field that carries that bound: `max_completion_tokens`, `max_tokens`, or `auto`. `auto` uses `max_tokens` for "
        "`gpt-3.5*`, `gpt-4`, `gpt-4-turbo` and the other older models that need it.")
    temperature = Setting(None, _opt_float(0.0, 2.0), ASK,
        "Sampling temperature (0 to 2). `null` leaves it out of the request. Checked against the model's catalogue row: a model"
        " that takes only its default (OpenAI gpt-5, o-series, gpt-5.6, gpt-6), takes it only at `reasoning_effort: none` "
        "(gpt-5.1 to gpt-5.5), or has deprecated it (Claude Opus 4.7 and later, the Claude 5 family) refuses any other value, "
        "and the configuration does not load. On Anthropic under API version `2026-10-21` (the default `anthropic_api_version`)"
        " any `temperature` is refused for every Claude model.")
    response_format = Setting(None, _response_format, ASK,
        "A JSON schema (an object) for structured answers. Each top-level property becomes its own result column (see below).")
    schema_column = Setting(None, _opt_str, ASK,
        "Input column holding, per row, the JSON schema of that row's request (an object as `response_format` takes it, checked"
        " by the same strict-mode rules); an empty cell sends the profile's `response_format`. It needs a `response_format`, "
        "which names the result's columns: each row's schema must have the same top-level properties. The answer is checked "
        "against its own request's schema (else `invalid_output`), and each schema's tokens are counted per request. One job "
        "then holds requests of different kinds (an imported eval's label and score criteria); a schema is part of the "
        "prompt's cached prefix, so only requests with the same schema share a cache.")
    default_encoding = Setting("o200k_base", _choice("o200k_base", "cl100k_base"), ASK,
        "tiktoken encoding (`o200k_base` or `cl100k_base`) for models tiktoken does not know. A warning says the counts may "
        "differ from the bill.")
    context_window = Setting(None, _opt_int(1), ASK,
        "Context window in tokens. A request whose prompt plus `max_completion_tokens` exceeds it is not sent "
        "(`request_too_large`). `null` takes the value from the pricing table; if the table has none, the size is not checked.")
    split_token_limit = Setting(None, _opt_int(1), SPLIT,
        "Maximum input tokens per batch. `null` (the default): a batch is as large as the provider's caps "
        "(`max_requests_per_batch`, `max_batch_bytes`) and its queue limit allow. A single request larger than this is not sent"
        " (`request_too_large`).")
    split_row_limit = Setting(None, _opt_int(1), SPLIT,
        "Maximum requests per batch (`max_requests_per_batch` applies in any case). For people who want smaller batches.")
    force_chunk_count = Setting(None, _opt_int(1), SPLIT,
        "Split into this many batches of near-equal input tokens. If the other limits need more batches, there are as many as "
        "they need.")
    max_requests_per_batch = Setting(50000, _int(1), SPLIT,
        "The provider's hard cap on requests in one batch. Lower it for providers with a smaller cap.")
    max_batch_bytes = Setting(200_000_000, _int(1024), SPLIT,
        "The provider's hard cap on the size of one batch input file, in bytes (minimum 1024). Lower it for providers with a "
        "smaller cap.")
    max_simultaneous_batches = Setting(None, _opt_int(1), RUN,
        "Batches in flight (uploading, created, running) at once, across all jobs of one queue: sandbox jobs' batches are in "
        "the emulator's queue and real jobs' in the provider's, so neither takes the other's slots (nor its enqueued tokens). A"
        " job waiting for a slot says so under `bgctl status` (`waiting_for` in `--json`). `null` (the default): no fixed cap; "
        "the provider's queue limit decides (see *The provider's queue limit* below).", profile=False)
    merge_worker_rows = Setting(10000, _opt_int(1), RUN,
        "An ended batch of at least this many rows is merged into its rows in a separate process (one per batch, at most one "
        "per core at once; the others wait their turn), while the daemon goes on polling, downloading and submitting; two "
        "batches that end together are merged on two cores. Smaller batches are merged in the daemon within its tick (starting "
        "a process costs more than they take). `null`: every batch is merged in the daemon's own process.", profile=False)
    halt_on_chunk_failure = Setting(False, _bool, RUN,
        "After one of a job's batches fails, submit none of its remaining chunks. Their rows are marked `halted` and the job "
        "ends `failed`.")
    poll_interval_seconds = Setting(60.0, _float(0.01), RUN,
        "Longest wait between two polls of a running batch. The first poll comes 0.2 s after the create; after that the wait is"
        " 15 % of the batch's age (at least 0.2 s, at most this value), so a batch is seen done at most about 15 % of its run "
        "time late, and a long one costs one poll per this value. The wait is shorter when the batch is expected to end sooner:"
        " just after the end its own progress (finished requests) points to, or the run time of the last batches of the same "
        "model. With several batches in flight one `batches.list` serves them all. A larger value means fewer calls for long "
        "batches (120 gives about 30 an hour for a batch running alone). It is also the longest the daemon waits between two "
        "ticks: a tick runs when something is due (a poll, a wait's end, an inbox file or rescan) or the daemon is woken, never"
        " more than this (and a minute) apart (read at start-up).", profile=False, restart=True)
    max_row_retries = Setting(2, _int(0), RUN,
        "How many times a failed row is resubmitted automatically before the result is written. A row the provider refused as a"
        " bad request (HTTP 400, 404, 413 or 422: it would fail again as it is), a `request_too_large` row, and `truncated` and"
        " `refused` rows are not resubmitted automatically. `bgctl retry` resubmits failed rows whatever this says.")
    preflight_rows = Setting(3, _int(0), RUN,
        "Before a job's first batch, this many of the requests it will actually send (rows with a usable stored answer, rows "
        "identical to an earlier row of the file and rows too large to be sent are left out; with nothing left to send there is"
        " no preflight) go through the provider's synchronous API with exactly the bodies the batch would carry. The file is "
        "first checked as prepare checks it (header, sheet, label and group columns, and the ids and labels of the rows read), "
        "so a file prepare would refuse fails before anything is paid. If one fails (an HTTP error such as a refused parameter,"
        " a request the provider's client refuses to send, or an answer that is `truncated`, `refused`, `invalid_output` or "
        "`unexpected_finish`), no batch is created: the job fails within seconds with `preflight_failed`, the provider's "
        "message and the fix (`bgctl retry JOB` runs the preflight again after a config change), even if another row met a "
        "transient error. The rows' requests go out together (at most 8 at a time); each answer is recorded once they are "
        "back, in row order (`PreflightRowAnswered`), with its cost at the standard (synchronous) price of the model's "
        "catalogue row (twice the batch price where the row has none), is that row's answer (not sent in the batch, never paid"
        " again) and is stored for later jobs like any answer. A transient error (connection, timeout, 5xx, 429) is retried "
        "for the rows not answered yet, no earlier than the longest Retry-After the provider gave them, else after 5 s "
        "doubling to 5 min (`PreflightUnreachable`, the reason shown by `bgctl status`), at most 8 tries, after which the job "
        "fails. A daemon killed between a request and its "
        "outcome sends that row once more on restart. `0` turns it off.")
    route = Setting("batch", _choice(*ROUTES), RUN,
        "How a job's rows travel (see [Routes](#routes-batch-flex-online-auto)): `batch` (batches, half the standard price, "
        "results within the completion window), `flex` (each row through the synchronous API at OpenAI's flex tier, billed at "
        "the Batch price; only models whose catalogue row has `flex: yes`), `online` (each row through the synchronous API at "
        "the standard tier and price, seconds) or `auto` (`online_max_rows` and `deadline` choose). Any other value, or `flex` "
        "on a provider or model without a flex tier, is refused when the configuration is loaded, naming the profile and the "
        "key.")
    deadline = Setting(None, parse_deadline, RUN,
        "When a job's results are wanted: a duration counted from the job's arrival (`90s`, `45m`, `2h`, `1d`; a plain number "
        "is seconds) or an ISO 8601 time with its offset (`2026-11-27T09:00:00Z`). With `route: auto` a deadline sooner than a "
        "batch of the model is expected to take (the median of its observed batch run times, else 24 h) sends the job `online`."
        " On any route, a batch still running when the deadline nears is cancelled and its unanswered rows finished "
        "synchronously (see [Stragglers](#stragglers-a-deadline-and-a-batch-still-running)). A time without an offset "
        "(ambiguous) or already past when the configuration is loaded is refused, naming the profile and the key.")
    online_max_rows = Setting(100, _int(0), RUN,
        "With `route: auto`, a file of at most this many rows goes through the synchronous API: `flex` where the model has it, "
        "else `online`.")
    online_concurrency = Setting(4, _int(1), RUN,
        "Routes `flex` and `online`: requests of one job in flight at once. On top of it the provider's 429 and `Retry-After` "
        "hold every request of the job until the wait has passed.")
    enqueued_token_limit = Setting({}, _int_map, RUN,
        "Per-model cap on input tokens in flight (`{model: tokens}`), matching the provider's queue limit. Used from the start;"
        " without it the limit is learned from the provider's refusals. Chunks are planned no larger than it, and a chunk waits"
        " until it fits (its file is uploaded while it waits, for one limit's worth of the chunks sent next, so that only the "
        "create is left when room appears).", profile=False)
    max_cost_per_job_usd = Setting(None, _opt_float(0.0), RUN,
        "Hold a job whose estimated maximum cost exceeds this.")
    daily_cost_limit_usd = Setting(None, _opt_float(0.0), RUN,
        "Hold a new job while today's billed spend (UTC day), plus what running jobs may still spend, plus its estimate would "
        "exceed this.", profile=False)
    daily_token_limit = Setting(None, _opt_int(1), RUN,
        "Hold a new job while today's billed tokens plus its maximum (input + requests × `max_completion_tokens`) would exceed "
        "this.", profile=False)
    completion_window = Setting("24h", _str, RUN,
        "Completion window sent with every batch (daemon-wide).", profile=False)
    delete_provider_files = Setting(True, _bool, RUN,
        "Once a job's result is written, delete its uploaded input files and its output and error files at the provider.", profile=False)
    csv_formula_guard = Setting(True, _bool, RUN,
        "In CSV results, prefix `'` to added cells (the model's output) that start with `=` `+` `-` `@`, a tab or a CR, unless "
        "the cell is a plain number. The input cells are never changed.")
    sheet = Setting(None, _opt_str, RUN,
        "Excel inputs (`.xlsx`, `.xlsm`): the sheet whose rows are graded. `null` is the first sheet. A name the workbook does "
        "not have fails the job with an error report listing its sheets.")
    encoding = Setting("utf-8", _encoding, RUN,
        "Text encoding of CSV/TSV/JSON/JSONL inputs that are not valid UTF-8, for files saved by spreadsheet programs as "
        "`cp1252` or `latin-1`. A file that is valid UTF-8 (with or without a BOM) is read as UTF-8 whatever this says, so a "
        "standing `encoding: latin-1` never turns the next UTF-8 file into mojibake; `bgctl count` and `bgctl status JOB` show "
        "the encoding each file was read in (`text_encoding` in `--json` and `JobPrepared`). Must be ASCII-compatible (not "
        "UTF-16). Results are always written in UTF-8 (a CSV read in another encoding gets a BOM, so spreadsheets read it as "
        "UTF-8).")
    write_report = Setting(False, _bool, RUN,
        "Also write the page `bgctl report --html` writes beside each result file, named after the result: "
        "`answers_results.csv` gets `answers_report.html`, a result renamed with a timestamp "
        "(`answers_results_20261125T101500Z.csv`) gets the same suffix (`answers_report_20261125T101500Z.html`). The result's "
        "name is chosen so that its report's name is free too, so the two always share their stem (an old report left in the "
        "outbox is never overwritten).")
    reference_column = Setting(None, _opt_str, JUDGING,
        "Input column of human labels. `bgctl report` then shows how the answers agree with them (rows with an empty label are "
        "left out): accuracy, Cohen's κ, the confusion matrix and the majority-class baseline for categories; MAE, RMSE, "
        "Pearson and Spearman for numbers; each with a bootstrap 95 % interval.")
    reference_field = Setting(None, _opt_str, JUDGING,
        "The `response_format` field compared with the labels (e.g. `score`). Unset: the output column, which is only right "
        "without a schema, so with a schema it must be set.")
    group_column = Setting(None, _opt_str, JUDGING,
        "Input column (e.g. the question or rubric item) by whose values `bgctl report` breaks the scores down.")
    samples = Setting(1, _int_between(1, MAX_SAMPLES), JUDGING,
        "Independent answers asked per row, 1 to 20: each row is sent k times and the answer column holds their vote (see "
        "[Several samples per row](#several-samples-per-row)).")
    judges = Setting(None, _opt_names, JUDGING,
        "A judge panel: a list of at least two profiles that answer the same rows in one job; the result has a column per judge"
        " and their consensus (see [A judge panel](#a-judge-panel)). Set in a profile only.")
    schedule = Setting(None, check_schedule, RUN,
        "Run this profile at the times of a cron expression (five fields, UTC: `0 2 * * *` is 02:00 every day; checked with "
        "APScheduler's `CronTrigger`): each file of `schedule_source` becomes a job of the profile, as if dropped in its inbox"
        " folder. Each time runs once, whatever the restarts and however many daemons share the event log; times missed while"
        " no daemon ran are run once, as the latest of them; a schedule's times before a daemon first saw it are not run. Set "
        "in a profile (the top level's schedules the default profile only). See [Scheduled runs](#scheduled-runs)."
        )
    schedule_source = Setting(None, _opt_str, RUN,
        "The file, or the folder of files (each a job), that `schedule` runs; copied at each time, never moved. A relative "
        "path is taken under the home. Required with `schedule`.")
    on_job_end = Setting(None, _opt_str, RUN,
        "Shell command run once when a job ends (see [Running a command when a job ends](#running-a-command-when-a-job-ends)).", profile=False)
    on_job_end_timeout_seconds = Setting(60.0, _float(0.1), RUN,
        "Time limit of the `on_job_end` command; it is killed after it.", profile=False)
    pricing_file = Setting(None, _opt_str, RUN,
        "CSV of prices merged over the shipped table. `null` uses `<home>/pricing.csv` if it exists. A relative path is taken "
        "from the home.", profile=False)
    base_url = Setting(None, _opt_str, PROVIDER,
        "Base URL of an OpenAI-compatible API. `null` is `https://api.openai.com/v1`.", profile=False, restart=True)
    api_key = Setting(None, _api_key, PROVIDER,
        "API key. It is never written to logs, the database or outputs, and `config show` masks it. Prefer the environment or "
        "`secrets.env` to `config.yaml`.", profile=False, restart=True, secret=True)
    request_timeout_seconds = Setting(120.0, _float(0.1), PROVIDER,
        "Timeout of one HTTP request to the provider: of each attempt of a read (the provider's SDK makes up to 3, "
        "[providers.md](providers.md#read-retries)) and of a write (sent once).", profile=False, restart=True)
    provider = Setting("openai", _choice(*PROVIDERS), PROVIDER,
        "The Batch API a profile's jobs go to: `openai` (the OpenAI Batch API, or a server that copies it through `base_url`) "
        "`anthropic` (Anthropic's Message Batches; needs `ANTHROPIC_API_KEY`, and a `claude-…` model), `gemini` (the Gemini "
        "Batch API; needs `GEMINI_API_KEY` or `GOOGLE_API_KEY`, and a `gemini-…` model) or `azure` (Azure OpenAI's Batch API "
        "through the `openai` SDK's `AzureOpenAI` client; needs `AZURE_OPENAI_API_KEY` and `azure_endpoint`; `model` is a "
        "deployment name, priced through `azure_model`). Any other name, a model the provider does not offer, or a missing key "
        "stops the daemon at start-up with a message naming the profile and the key to fix.")
    openai_endpoint = Setting("auto", _choice("auto", "chat_completions", "responses"), PROVIDER,
        "The OpenAI API a profile's requests go through, in batches, the preflight and the `flex`/`online` routes: `auto` (the "
        "model's catalogue row decides: the Responses API (`/v1/responses`) for a Responses-only model such as `o3-pro` or "
        "`gpt-5.5-pro`, chat completions for every other), `chat_completions` or `responses` (any model whose row says it is "
        "served there). Through the Responses API the messages are sent as `input`, the bound as `max_output_tokens` (whatever "
        "`token_param` says), `reasoning_effort` as `reasoning.effort` and a schema as `text.format`. `chat_completions` on a Responses-only model, `responses` on a model not known to be served there, "
        "`responses` with `provider: azure` (see [providers.md](providers.md#the-responses-api-in-batchgraders-requests)), or "
        "a value other than `auto` with `provider: anthropic` or `gemini` is refused when the configuration is loaded.")
    anthropic_api_key = Setting(None, _opt_str, PROVIDER,
        "Anthropic API key (in the environment or `secrets.env`). Masked like `api_key`, and never written to logs, the "
        "database or outputs.", profile=False, restart=True, secret=True)
    anthropic_base_url = Setting(None, _opt_str, PROVIDER,
        "Base URL of the Anthropic API. `null` is `https://api.anthropic.com`.", profile=False, restart=True)
    anthropic_api_version = Setting(ANTHROPIC_DEFAULT_API_VERSION, _date_choice(*ANTHROPIC_API_VERSIONS), PROVIDER,
        "The `anthropic-version` header sent with every Anthropic call (`2026-10-21` or `2023-06-01`). The default is the "
        "version the `anthropic` SDK sends since 2.0.0; under it Anthropic refuses `temperature`, `top_p` and `top_k` on every "
        "model, so a profile with `provider: anthropic` and a `temperature` does not load. `2023-06-01` applies each model's "
        "catalogue row instead (see [providers.md](providers.md#anthropic-api-versions)). `bgctl doctor` shows the version in "
        "use.", profile=False, restart=True)
    gemini_api_key = Setting(None, _opt_str, PROVIDER,
        "Gemini API key (in the environment or `secrets.env`; when both SDK variables are set `GOOGLE_API_KEY` wins, as in the "
        "`google-genai` SDK). Masked like `api_key`, and never written to logs, the database or outputs.", profile=False, restart=True, secret=True)
    gemini_base_url = Setting(None, _opt_str, PROVIDER,
        "Base URL of the Gemini API. `null` is `https://generativelanguage.googleapis.com`.", profile=False, restart=True)
    azure_api_key = Setting(None, _opt_str, PROVIDER,
        "Azure OpenAI API key (in the environment or `secrets.env`), sent in the `api-key` header. Masked like `api_key`, and "
        "never written to logs, the database or outputs.", profile=False, restart=True, secret=True)
    azure_endpoint = Setting(None, _opt_str, PROVIDER,
        "The Azure OpenAI resource endpoint, e.g. `https://NAME.openai.azure.com`. Required by `provider: azure`; one resource "
        "per daemon.", profile=False, restart=True)
    azure_api_version = Setting(AZURE_DEFAULT_API_VERSION, _str, PROVIDER,
        "The `api-version` sent with every Azure Files and Batches call. The default is the latest data-plane authoring release"
        " listed by Microsoft (checked 2026-11-23); the GA release `2024-10-21` does not support newer models.", profile=False, restart=True)
    azure_model = Setting(None, _opt_str, PROVIDER,
        "With `provider: azure`, `model` names your *deployment*; `azure_model` names the model it runs (e.g. `gpt-5.4-mini`), "
        "whose price, tokenizer and context window are used. Unset, the deployment name itself must have a row in the price "
        "table; otherwise the daemon (and `bgctl count`) refuses, naming the profile and this key, before anything is uploaded.")
    rescan_interval_seconds = Setting(30.0, _float(0.05), HOUSE,
        "Period of the full inbox rescan, which finds files whose file-system events were lost. The inbox is also scanned "
        "whenever the watcher reports a change, and every tick while a file waits to become stable.", profile=False)
    stable_seconds = Setting(1.0, _float(0.0), HOUSE,
        "A file is taken from the inbox once its size and modification time are unchanged across two looks this many seconds "
        "apart, or at once when it arrives already settled: its modification time at least this much older than its last "
        "inode change (a file moved into the inbox whose content had not changed for this long before the move, as both "
        "times are stamped by the file system). A file written in the inbox itself, or copied in, waits for the two looks.",
        profile=False)
    log_level = Setting("INFO", _choice("DEBUG", "INFO", "WARNING", "ERROR"), HOUSE,
        "Level of `<home>/logs/daemon.log`: `DEBUG`, `INFO`, `WARNING` or `ERROR`.", profile=False, restart=True)
    store_url = Setting(None, _store_url, HOUSE,
        "Where the event log is. `null`: the SQLite file in the home (`batchgrader.db`), which needs nothing. A "
        "`postgresql://USER@HOST:PORT/DATABASE` URL: a PostgreSQL database that several daemons share (needs the `[postgres]` "
        "extra; keep the password out of the URL, in `~/.pgpass` or `PGPASSWORD`). See [scaling.md](scaling.md); `bgctl store "
        "copy` moves an existing log there. Read at start-up.", profile=False, restart=True)
    lease_seconds = Setting(300.0, _float(1.0), HOUSE,
        "With `store_url`: the lifetime of a daemon's leases on jobs and provider accounts, renewed every third of it. "
        "Another daemon takes a job (or an account's calls) over this long after its daemon died. It must be longer than "
        "`request_timeout_seconds` (a call is made only while the account's lease outlasts it); make it several times "
        "longer. See [scaling.md](scaling.md).", profile=False, restart=True)
    reuse_answers = Setting(None, _opt_bool, REUSE,
        "Answer a request that is identical to one already answered (an earlier row of the same file, or any earlier job within"
        " `cache_days`) with that answer instead of sending it. `null` means on, except when `temperature` is above 0; `true` "
        "turns it on even then; `false` turns it off.")
    reuse_truncated_answers = Setting(False, _bool, REUSE,
        "Deprecated; accepted and without effect. An answer cut off by the output limit is a failed row (`truncated`): it is "
        "never stored, and a stored one (from before) is never reused, since reusing it would turn a failure into a success.")
    cache_days = Setting(30.0, _days, REUSE,
        "How long stored answers are reused; older ones are dropped. `0` turns reuse off (and stores nothing).")
    prompt_caching = Setting(True, _bool, CACHING,
        "Lay requests out for the provider's prompt cache: OpenAI requests carry a `prompt_cache_key` per job and profile; "
        "Anthropic requests mark the system prompt with `cache_control` when it is at least the model's `min_cache_prefix` "
        "tokens. `false` sends neither (the requests are otherwise the same, and so are their request keys).")
    # fmt: on


#: every setting by key, in declaration order
KEYS: dict[str, Setting[Any]] = {name: s for name, s in vars(Settings).items() if isinstance(s, Setting)}
#: keys that make no sense inside a profile (they configure the daemon, not a job)
GLOBAL_ONLY = frozenset(k for k, s in KEYS.items() if not s.profile)
#: keys read only when the daemon starts (provider clients, the log, the tick period): a reload keeps
#: the old value, so a change of one of them is reported with the fix (a restart)
RESTART_ONLY_KEYS = tuple(k for k, s in KEYS.items() if s.restart)
#: keys holding a secret: masked wherever a value is shown; a registered provider's key
#: (core/configuration/providers.py ``key_setting``) is one whether or not its declaration says so
SECRET_KEYS = tuple(k for k, s in KEYS.items() if s.secret or k in {f.key_setting for f in PROVIDER_FACTS.values()})


def sdk_env_names(key: str) -> tuple[str, ...]:
    """The provider SDKs' environment variables that set ``key`` (core/configuration/providers.py), in the order read."""
    return tuple(var for f in PROVIDER_FACTS.values() for var, k in f.sdk_env.items() if k == key)
