"""`bgctl doctor`'s checks for profiles with ``provider: gemini``: the key is present (masked), the
Gemini API answers with it, and ``models.count_tokens`` answers for the profile's model.  (Prices
of every configured model, Gemini's included, are checked by :func:`~batchgrader.ops.doctor.check_pricing`.)
``google-genai`` is imported only when a profile uses Gemini."""

from __future__ import annotations

from collections.abc import Callable

from batchgrader.core.configuration.config import Config
from batchgrader.core.host.secrets import mask_secret
from batchgrader.ops.checks import FAIL, OK, WARN, Check

KEY_VARS = "GEMINI_API_KEY (or GOOGLE_API_KEY)"


def check_gemini(config: Config | None, timeout: float, scrub: Callable[[str], str]) -> list[Check]:
    """For profiles with ``provider: gemini``: key present, endpoint reachable, token counting."""
    if config is None:
        return []
    users = [p for p in (config.default, *config.profiles.values()) if p.values["provider"] == "gemini"]
    if not users:
        return []
    names = ", ".join("default" if p.name == "default" else p.name for p in users)
    key = config.default.gemini_api_key
    if not key:
        return [
            Check(
                "gemini key",
                FAIL,
                f"profile(s) {names} use provider 'gemini', but {KEY_VARS} is not set",
                "export GEMINI_API_KEY=... (or add it to secrets.env); or try it with bgctl daemon --sandbox",
            )
        ]
    from google import genai
    from google.genai import errors, types

    source = config.default.sources.get("gemini_api_key", "")
    checks = [Check("gemini key", OK, f"{mask_secret(key)} (from {source}; used by {names})")]
    base_url = (config.default.gemini_base_url or "https://generativelanguage.googleapis.com").rstrip("/")
    client = genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base_url, timeout=int(timeout * 1000)))
    try:
        client.batches.list(config={"page_size": 1})
        checks.append(Check("gemini endpoint", OK, f"listing batches at {base_url} answered with the key"))
    except errors.APIError as exc:
        fix = (
            f"the key was rejected: check it and set {KEY_VARS}"
            if exc.code in (400, 401, 403)
            else f"the server answered {exc.code}: check gemini_base_url (or GOOGLE_GEMINI_BASE_URL) and retry later"
        )
        checks.append(Check("gemini endpoint", FAIL, scrub(f"listing batches at {base_url}: HTTP {exc.code} {exc.status}"), fix))
        return checks
    except Exception as exc:  # transport errors of httpx or httpx2
        detail = scrub(f"listing batches at {base_url}: cannot connect ({type(exc).__name__})")
        checks.append(Check("gemini endpoint", FAIL, detail, "check the network, and gemini_base_url / GOOGLE_GEMINI_BASE_URL"))
        return checks
    model = users[0].values["model"]
    from batchgrader.provider.gemini_batches import GeminiBatchProvider, GeminiTokenCounter
    from batchgrader.provider.openai_api import ProviderError

    # the very call `bgctl count` and the daemon make: a whole request, system prompt included
    probe = {
        "custom_id": "doctor",
        "body": {"model": model, "messages": [{"role": "system", "content": "You grade."}, {"role": "user", "content": "ping"}]},
    }
    try:
        counter = GeminiTokenCounter(GeminiBatchProvider(key, base_url, timeout=timeout, max_retries=0), workers=1)
        (n,) = counter.count_tokens([probe])
        checks.append(
            Check(
                "gemini token counting",
                OK,
                f"models.countTokens counts whole requests for {model} ({n} tokens for a system prompt and 'ping')",
            )
        )
    except (ProviderError, ValueError) as exc:  # refused, unreachable, or the full request ignored: estimates
        checks.append(
            Check(
                "gemini token counting",
                WARN,
                scrub(f"models.countTokens for {model}: {type(exc).__name__}: {exc}")[:300],
                "bgctl count then estimates Gemini input tokens with tiktoken; billed costs still come from reported usage",
            )
        )
    return checks
