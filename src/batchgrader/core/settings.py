"""The typed view of a profile's settings: one attribute per configuration key, with the type its
check returns (:data:`batchgrader.core.config.KEYS`; ``tests/test_config.py`` holds the two in
step).  :class:`~batchgrader.core.config.Profile` and :class:`~batchgrader.core.config.Config`
take these annotations, so the type checker knows that ``profile.max_row_retries`` is an ``int``
and that ``profile.context_window`` may be ``None``, and refuses a misspelt key."""

from __future__ import annotations

from typing import Any


class Settings:
    """Annotations only: the values live in the profile's mapping (read by ``__getattr__``)."""

    # what to ask
    model: str
    response_field: str
    skip_empty: bool
    output_column: str
    id_column: str | None
    system_prompt: str | None
    system_prompt_name: str | None
    user_prompt: str | None
    examples_file: str | None
    max_completion_tokens: int
    reasoning_effort: str | None
    token_param: str
    temperature: float | None
    response_format: dict[str, Any] | None
    default_encoding: str
    context_window: int | None
    # splitting
    split_token_limit: int | None
    split_row_limit: int | None
    force_chunk_count: int | None
    max_requests_per_batch: int
    max_batch_bytes: int
    # running
    max_simultaneous_batches: int | None
    merge_worker_rows: int | None
    halt_on_chunk_failure: bool
    poll_interval_seconds: float
    max_row_retries: int
    preflight_rows: int
    enqueued_token_limit: dict[str, int]
    max_cost_per_job_usd: float | None
    daily_cost_limit_usd: float | None
    daily_token_limit: int | None
    completion_window: str
    delete_provider_files: bool
    csv_formula_guard: bool
    sheet: str | None
    encoding: str
    write_report: bool
    # judging the grader
    reference_column: str | None
    reference_field: str | None
    group_column: str | None
    samples: int
    judges: list[str] | None
    on_job_end: str | None
    on_job_end_timeout_seconds: float
    pricing_file: str | None
    # provider
    base_url: str | None
    api_key: str | None
    request_timeout_seconds: float
    provider: str
    anthropic_api_key: str | None
    anthropic_base_url: str | None
    anthropic_api_version: str
    gemini_api_key: str | None
    gemini_base_url: str | None
    azure_api_key: str | None
    azure_endpoint: str | None
    azure_api_version: str
    azure_model: str | None
    # housekeeping
    rescan_interval_seconds: float
    stable_seconds: float
    log_level: str
    store_url: str | None
    # routes: batch, flex, online
    route: str
    deadline: str | None
    online_max_rows: int
    online_concurrency: int
    # reusing answers and caching
    reuse_answers: bool | None
    reuse_truncated_answers: bool
    cache_days: float
    prompt_caching: bool
