"""`bgctl doctor`'s checks for profiles with ``provider: azure`` (Azure OpenAI): the key, the
endpoint answering with it at the configured ``api-version``, and every deployment priced.
Read-only; the key is never shown (masked here, and scrubbed again by :func:`run_checks`)."""

from __future__ import annotations

from typing import Any

from batchgrader.core.configuration.config import Config
from batchgrader.core.host.secrets import mask_secret


def check_azure(config: Config | None, timeout: float) -> list[Any]:
    from batchgrader.ops.checks import FAIL, OK, Check, _scrubber

    if config is None:
        return []
    users = [p for p in (config.default, *config.profiles.values()) if p.values["provider"] == "azure"]
    if not users:
        return []
    names = ", ".join(p.name for p in users)
    checks: list[Any] = [*_priced(config, users)]
    key, endpoint, version = config.default.azure_api_key, config.default.azure_endpoint, config.default.azure_api_version
    if not key:
        checks.insert(
            0,
            Check(
                "azure key",
                FAIL,
                f"profile(s) {names} use provider 'azure', but AZURE_OPENAI_API_KEY is not set",
                "export AZURE_OPENAI_API_KEY=... (or add it to secrets.env); or try it with bgctl daemon --sandbox",
            ),
        )
        return checks
    source = config.default.sources.get("azure_api_key", "")
    checks.insert(0, Check("azure key", OK, f"{mask_secret(key)} (from {source}; used by {names})"))
    if not endpoint:
        checks.insert(
            1,
            Check(
                "azure endpoint",
                FAIL,
                f"profile(s) {names} use provider 'azure', but no endpoint is set",
                "export AZURE_OPENAI_ENDPOINT=https://NAME.openai.azure.com (or set azure_endpoint in config.yaml)",
            ),
        )
        return checks
    checks.insert(1, _reachable(key, endpoint, version, timeout, _scrubber([key])))
    return checks


def _reachable(key: str, endpoint: str, version: str, timeout: float, scrub: Any) -> Any:
    import openai

    from batchgrader.ops.checks import FAIL, OK, Check

    where = f"GET {endpoint.rstrip('/')}/openai/batches?api-version={version}"
    client = openai.AzureOpenAI(api_key=key, azure_endpoint=endpoint, api_version=version, timeout=timeout, max_retries=0)
    try:
        client.batches.list(limit=1)
    except openai.APIStatusError as exc:
        message = str((exc.body or {}).get("message") if isinstance(exc.body, dict) else exc.message)
        if exc.status_code in (401, 403):
            fix = "the key was rejected for this endpoint: check AZURE_OPENAI_API_KEY and AZURE_OPENAI_ENDPOINT belong to the same resource"
        elif "api version" in message.lower() or exc.status_code == 404:
            fix = f"the api-version {version!r} or the endpoint is wrong: set azure_api_version (e.g. 2025-04-01-preview or 2024-10-21) and check azure_endpoint"
        else:
            fix = "check azure_endpoint (or AZURE_OPENAI_ENDPOINT) and retry later"
        return Check("azure endpoint", FAIL, scrub(f"{where}: HTTP {exc.status_code}: {message}"), fix)
    except openai.APIError as exc:
        return Check(
            "azure endpoint",
            FAIL,
            scrub(f"{where}: cannot connect ({type(exc).__name__})"),
            "check the network and azure_endpoint / AZURE_OPENAI_ENDPOINT",
        )
    return Check("azure endpoint", OK, f"{where} answered 200 with the key (api-version {version})")


def _priced(config: Config, users: list[Any]) -> list[Any]:
    from batchgrader.ops.checks import FAIL, OK, Check
    from batchgrader.pipeline.pricing import PricingError, load_pricing, with_deployments

    try:
        table = load_pricing(config.pricing_path())
    except PricingError:
        return []  # the pricing check reports the broken file
    out = []
    for prof in users:
        deployment = prof.values["model"]
        try:
            price = with_deployments(table, [prof]).get(deployment)
        except PricingError as exc:
            out.append(
                Check(
                    f"azure deployment: {deployment}",
                    FAIL,
                    str(exc),
                    f"set azure_model in {'config.yaml' if prof.name == 'default' else f'profiles.{prof.name}'} to the model the deployment runs",
                )
            )
            continue
        runs = prof.values.get("azure_model") or "its own price row"
        out.append(
            Check(
                f"azure deployment: {deployment}",
                OK,
                f"profile {prof.name}: priced as {runs} (${price.input_per_1m:g} in, ${price.output_per_1m:g} out per 1M tokens)",
            )
        )
    return out
