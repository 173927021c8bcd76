"""`bgctl doctor`'s checks for profiles with ``provider: anthropic``: the key, the Message Batches
endpoint answering with it, and token counting.  Read-only; the key is never shown (masked here,
and scrubbed again by :func:`batchgrader.ops.doctor.run_checks`)."""

from __future__ import annotations

from batchgrader.core.configuration.config import Config
from batchgrader.core.configuration.providers import anthropic_refused_sampling
from batchgrader.core.host.secrets import mask_secret
from batchgrader.ops.checks import FAIL, OK, WARN, Check, _scrubber


def check_anthropic(config: Config | None, timeout: float) -> list[Check]:
    """For profiles with ``provider: anthropic``: key present, endpoint reachable, token counting."""
    if config is None:
        return []
    users = [p for p in (config.default, *config.profiles.values()) if p.values["provider"] == "anthropic"]
    if not users:
        return []
    import anthropic

    names = ", ".join("default" if p.name == "default" else p.name for p in users)
    version = config.default.anthropic_api_version
    refused = anthropic_refused_sampling(version)
    rule = f"{', '.join(refused)} refused on every model" if refused else "sampling parameters as each model's catalogue row says"
    checks = [
        Check(
            "anthropic api version",
            OK,
            f"anthropic-version {version} (from {config.default.sources.get('anthropic_api_version', 'default')}): {rule}",
        )
    ]
    key = config.default.anthropic_api_key
    if not key:
        return checks + [
            Check(
                "anthropic key",
                FAIL,
                f"profile(s) {names} use provider 'anthropic', but ANTHROPIC_API_KEY is not set",
                "export ANTHROPIC_API_KEY=sk-ant-... (or add it to secrets.env); or try it with bgctl daemon --sandbox",
            )
        ]
    source = config.default.sources.get("anthropic_api_key", "")
    checks.append(Check("anthropic key", OK, f"{mask_secret(key)} (from {source}; used by {names})"))
    base_url = config.default.anthropic_base_url or "https://api.anthropic.com"
    scrub = _scrubber([key])
    client = anthropic.Anthropic(
        api_key=key, base_url=base_url, timeout=timeout, max_retries=0, default_headers={"anthropic-version": version}
    )
    try:
        client.messages.batches.list(limit=1)
        checks.append(Check("anthropic endpoint", OK, f"GET {base_url}/v1/messages/batches answered 200 with the key"))
    except anthropic.APIStatusError as exc:
        fix = (
            "the key was rejected: check it and set ANTHROPIC_API_KEY"
            if exc.status_code in (401, 403)
            else f"the server answered {exc.status_code}: check anthropic_base_url (or ANTHROPIC_BASE_URL) and retry later"
        )
        checks.append(
            Check("anthropic endpoint", FAIL, scrub(f"GET {base_url}/v1/messages/batches: HTTP {exc.status_code}"), fix)
        )
        return checks
    except anthropic.APIError as exc:
        checks.append(
            Check(
                "anthropic endpoint",
                FAIL,
                scrub(f"GET {base_url}/v1/messages/batches: cannot connect ({type(exc).__name__})"),
                "check the network, and anthropic_base_url / ANTHROPIC_BASE_URL",
            )
        )
        return checks
    model = users[0].values["model"]
    try:
        n = client.messages.count_tokens(model=model, messages=[{"role": "user", "content": "ping"}]).input_tokens
        checks.append(Check("anthropic token counting", OK, f"messages.count_tokens answers for {model} ({n} tokens for 'ping')"))
    except anthropic.APIError as exc:
        checks.append(
            Check(
                "anthropic token counting",
                WARN,
                scrub(f"messages.count_tokens for {model}: {type(exc).__name__}"),
                "bgctl count then estimates Claude input tokens with tiktoken; billed costs still come from reported usage",
            )
        )
    return checks
