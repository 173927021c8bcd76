"""Configuration: defaults < config.yaml < environment < command-line flags.

``config.yaml``'s top level is the default profile; ``profiles:`` maps a name to overrides of
any key.  Everything is validated once into an immutable :class:`Config`; an unknown key, a
wrong type or a bad value raises :class:`ConfigError` naming the source, the key and the
expected form.  :meth:`Config.explain` says where every effective value came from.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.core.configuration.routes import deadline_problem
from batchgrader.core.configuration.settings import (  # noqa: F401 - the settings' declarations are part of the configuration's interface
    AZURE_DEFAULT_API_VERSION,
    ENV_PREFIX,
    GLOBAL_ONLY,
    KEYS,
    MAX_SAMPLES,
    PROVIDERS,
    REASONING_EFFORTS,
    RESTART_ONLY_KEYS,
    SECRET_KEYS,
    Setting,
    Settings,
    env_name,
)
from batchgrader.core.host.home import Home
from batchgrader.core.host.secrets import mask_secret
from batchgrader.core.rules.cron import schedule_problems


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


#: every provider SDK's environment variable -> the config key it sets (core/configuration/providers.py), in the
#: order read: a later variable for the same key wins (GOOGLE_API_KEY over GEMINI_API_KEY, as in google-genai)
SDK_ENV = {var: key for f in PROVIDER_FACTS.values() for var, key in f.sdk_env.items()}
#: what a profile's model must look like for each provider (a model the provider does not offer is
#: refused when the configuration is loaded)
PROVIDER_MODEL_PREFIX = {name: f.model_prefix for name, f in PROVIDER_FACTS.items() if f.model_prefix}


def secret_env_names() -> frozenset[str]:
    """Every environment variable the config reads a secret from (the SDKs' own names and the
    ``BATCHGRADER_*`` ones): what a child process such as the ``on_job_end`` command never gets."""
    return frozenset({name for name, key in SDK_ENV.items() if key in SECRET_KEYS} | {env_name(k) for k in SECRET_KEYS})


@dataclass(frozen=True)
class Profile(Settings):
    """The effective settings of one profile (immutable): each setting is a typed attribute
    (:class:`~batchgrader.core.configuration.settings.Settings`) read from ``values``."""

    name: str
    values: Mapping[str, Any]
    sources: Mapping[str, str]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def as_dict(self, mask: bool = True) -> dict[str, Any]:
        out = copy.deepcopy(dict(self.values))
        if mask:
            for key in SECRET_KEYS:
                out[key] = mask_secret(out.get(key))
        return out

    def __repr__(self) -> str:  # never show the key
        return f"Profile({self.name!r}, model={self.values.get('model')!r}, api_key={mask_secret(self.values.get('api_key'))!r})"


@dataclass(frozen=True)
class Config(Settings):
    """The whole configuration: the default profile (whose settings are also the configuration's
    own typed attributes: ``config.log_level``) and the named profiles of config.yaml."""

    home: Home
    default: Profile
    profiles: Mapping[str, Profile] = field(default_factory=dict)

    @property
    def values(self) -> Mapping[str, Any]:
        """The default profile's values (what the settings' attributes read)."""
        return self.default.values

    def profile(self, name: str | None) -> Profile:
        if not name or name == "default":
            return self.default
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none defined"
            raise ConfigError(f"unknown profile {name!r} (profiles in {self.home.config_file}: {known})") from None

    def secret_values(self, environ: Mapping[str, str] | None = None) -> list[str]:
        """Every secret this configuration holds (each setting declared ``secret``, in every profile)
        and every value of a variable the configuration reads a secret from in ``environ`` (a key
        another variable overrides included): what the daemon's log masks."""
        held = {str(p.values.get(k)) for p in (self.default, *self.profiles.values()) for k in SECRET_KEYS if p.values.get(k)}
        env = {environ[n] for n in secret_env_names() if environ and environ.get(n)}
        return sorted(held | env)

    def pricing_path(self) -> Path | None:
        """The user's pricing overrides file, if any (relative paths are under the home)."""
        if self.default.pricing_file:
            p = Path(self.default.pricing_file).expanduser()
            return p if p.is_absolute() else self.home.root / p
        return self.home.pricing_file if self.home.pricing_file.exists() else None

    def explain(self, profile: str | None = None) -> list[dict[str, Any]]:
        p = self.profile(profile)
        rows = []
        for key in KEYS:
            v = p.values[key]
            if key in SECRET_KEYS:
                v = mask_secret(v)
            rows.append({"key": key, "value": v, "source": p.sources[key]})
        return rows


#: the most bytes a configuration file (config.yaml, prompts.yaml) may have
MAX_CONFIG_FILE_BYTES = 1024 * 1024
#: the most a configuration file may hold once its aliases (``*name``) are expanded: one for each
#: value, key and list item plus the characters of its text (a file without aliases is always
#: within it); a "billion laughs" of nested aliases (a few hundred bytes that expand to gigabytes)
#: is refused before anything reads it
MAX_CONFIG_EXPANDED = 2 * MAX_CONFIG_FILE_BYTES


def read_yaml_file(path: Path) -> Any:
    """The YAML document of a configuration file, read within bounds: a file over
    ``MAX_CONFIG_FILE_BYTES`` or one whose aliases expand past ``MAX_CONFIG_EXPANDED`` raises
    :class:`ConfigError` naming the file and the fix, as does a file that is not valid YAML
    (never quoting its text: it may be the line holding a secret) or not UTF-8.  The only
    loader of config.yaml and prompts.yaml."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a file; remove it or replace it with a YAML file") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(
            f"{path}: larger than the limit of {MAX_CONFIG_FILE_BYTES:,} bytes for a configuration file; "
            "keep it to settings and prompts (long texts such as examples go in a file named by 'examples_file')"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, path)
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{path}: its values nest too deeply to read; flatten the nesting") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, path: Path) -> None:
    """Refuse a document whose aliases expand it past ``MAX_CONFIG_EXPANDED`` (see there), or
    that holds itself (an alias inside the value it names).  Each distinct node is visited once."""
    size: dict[int, int] = {}
    open_: set[int] = set()  # the nodes on the path from the root to the one visited
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            own = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            size[key] = min(1 + own + sum(size[id(c)] for c in children), MAX_CONFIG_EXPANDED + 1)
            open_.discard(key)
            if size[key] > MAX_CONFIG_EXPANDED:
                raise ConfigError(
                    f"{path}: its aliases (*name) expand it past the limit of {MAX_CONFIG_EXPANDED:,} values and "
                    "characters (nested aliases multiply); write the values out, or refer to each anchor (&name) "
                    "from fewer places"
                )
            continue
        if key in size:
            continue
        if key in open_:
            raise ConfigError(f"{path}: an alias (*name) refers to the value that contains it; write the value out instead")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data = read_yaml_file(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and k != "response_format":
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _apply(
    values: dict,
    sources: dict,
    raw: Mapping[str, Any],
    source: str,
    where: str,
    allow_global: bool = True,
    errors: list[str] | None = None,
) -> None:
    """Validate ``raw`` into ``values``; each problem is appended to ``errors`` (all of them are
    reported together), or raised at once when ``errors`` is None."""

    def problem(message: str) -> None:
        if errors is None:
            raise ConfigError(message)
        errors.append(message)

    for key, v in raw.items():
        if key not in KEYS:
            hint = _suggest(key)
            problem(f"{where}: unknown key {key!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
            continue
        if not allow_global and key in GLOBAL_ONLY:
            problem(f"{where}: key {key!r} configures the daemon and cannot be set in a profile")
            continue
        try:
            values[key] = KEYS[key].check(v)
        except ValueError as exc:
            # store_url: a refused URL may hold a password
            shown = "a value that is not shown (it is a secret)" if key in (*SECRET_KEYS, "store_url") else repr(v)
            problem(f"{where}: key {key!r} must be {exc}; got {shown}")
            continue
        sources[key] = source


def _raise_all(errors: list[str]) -> None:
    """One error as it is; several as a numbered list under a count, so none is hidden."""
    if len(errors) == 1:
        raise ConfigError(errors[0])
    if errors:
        raise ConfigError(f"{len(errors)} configuration errors:\n" + "\n".join(f"  {i}. {e}" for i, e in enumerate(errors, 1)))


def _suggest(key: str) -> str | None:
    import difflib

    m = difflib.get_close_matches(key, list(KEYS), n=1)
    return m[0] if m else None


def load_config(
    home: Home,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> Config:
    """Build the effective configuration. Reads config.yaml (if any); no other I/O.  ``now``
    (default: the wall clock) is what an absolute ``deadline`` is checked against."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {k: copy.deepcopy(spec.default) for k, spec in KEYS.items()}
    sources: dict[str, str] = {k: "default" for k in KEYS}

    errors: list[str] = []
    file_data = _read_yaml(home.config_file)
    profiles_raw = file_data.pop("profiles", None) or {}
    if not isinstance(profiles_raw, Mapping):
        errors.append(f"{home.config_file}: key 'profiles' must be a mapping of profile name to overrides")
        profiles_raw = {}
    _apply(values, sources, file_data, "config.yaml", str(home.config_file), errors=errors)

    env_raw, env_src = _env_settings(env)
    for key, v in env_raw.items():
        _apply(values, sources, {key: v}, env_src[key], f"environment variable {env_src[key][4:]}", errors=errors)
    set_flags = {key: v for key, v in (flags or {}).items() if v is not None}
    for key, v in set_flags.items():
        flag = f"--{key.replace('_', '-')}"
        _apply(values, sources, {key: v}, f"flag {flag}", f"command-line flag {flag}", errors=errors)

    default = Profile("default", MappingProxyType(values), MappingProxyType(sources))
    # a profile is part of config.yaml: the environment and flags still win over it
    outer = [*env_raw, *set_flags]
    profiles = _profiles(profiles_raw, default, outer, home.config_file, errors)
    profiles = _panels_take_judges_schema(profiles)
    for prof in (default, *profiles.values()):
        errors += _check_profile(prof, home.config_file, time.time() if now is None else now)
    errors += _check_judges(default, profiles, home.config_file)
    errors += schedule_problems(default, profiles, str(home.config_file))
    _raise_all(errors)
    return Config(home=home, default=default, profiles=MappingProxyType(profiles))


def _env_settings(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The keys the environment sets (the SDKs' own variables, then ours, which win): key ->
    value, and key -> its source (``env NAME``)."""
    env_raw: dict[str, Any] = {}
    env_src: dict[str, str] = {}
    for name, key in SDK_ENV.items():
        if env.get(name):
            env_raw[key], env_src[key] = env[name], f"env {name}"
    for key in KEYS:
        n = env_name(key)
        if n in env:
            env_raw[key], env_src[key] = env[n], f"env {n}"
    return env_raw, env_src


def _profiles(
    profiles_raw: Mapping[Any, Any], default: Profile, outer: list[str], config_file: Path, errors: list[str]
) -> dict[str, Profile]:
    """The profiles of config.yaml: each the default settings with its overrides, except the
    ``outer`` keys (set by the environment or a flag, which win over config.yaml)."""
    profiles: dict[str, Profile] = {}
    for pname, overrides in profiles_raw.items():
        where = f"{config_file}: profiles.{pname}"
        if not isinstance(pname, str) or not pname.replace("-", "").replace("_", "").isalnum():
            errors.append(f"{config_file}: profile name {pname!r} must be letters, digits, '-' or '_'")
            continue
        if not isinstance(overrides, Mapping):
            errors.append(f"{where} must be a mapping of keys to values")
            continue
        pv, ps = dict(default.values), dict(default.sources)
        _apply(pv, ps, overrides, f"config.yaml profiles.{pname}", where, allow_global=False, errors=errors)
        for key in outer:
            pv[key], ps[key] = default.values[key], default.sources[key]
        profiles[pname] = Profile(pname, MappingProxyType(pv), MappingProxyType(ps))
    return profiles


def _check_profile(prof: Profile, config_file: Path, now: float) -> list[str]:
    """The problems of one profile's settings taken together (model, reference, deadline)."""
    problems = (
        _check_provider_model(prof, config_file),
        _check_reference(prof, config_file) if not prof.values.get("judges") else None,  # a panel's: _check_judges
        _check_deadline(prof, config_file, now),
        _check_sampling(prof, config_file),
        _check_schema_column(prof, config_file),
    )
    return [p for p in problems if p]


def _check_schema_column(profile: Profile, config_file: Path) -> str | None:
    """A ``schema_column`` needs a JSON-schema ``response_format``: it names the result's columns,
    which every row's own schema must share."""
    rf = profile.values.get("response_format") or {}
    if profile.values.get("schema_column") is None or rf.get("type") == "json_schema":
        return None
    where = "the default profile" if profile.name == "default" else f"profiles.{profile.name}"
    return (
        f"{config_file}: {where}: key 'schema_column' needs a 'response_format' JSON schema (it names the result's columns, "
        "which each row's schema must have); set one"
    )


def _check_judges(default: Profile, profiles: Mapping[str, Profile], config_file: Path) -> list[str]:
    """Each judge of a panel is a profile that is not a panel itself; the default settings are
    no panel (every profile would inherit it)."""
    if default.values.get("judges"):
        return [
            f"{config_file}: key 'judges' cannot be set in the default settings (every profile would be a panel); set it in a profile"
        ]
    out = []
    for prof in profiles.values():
        if prof.sources.get("judges") == "default":
            continue
        for judge in prof.values.get("judges") or ():
            where = f"{config_file}: profiles.{prof.name}: key 'judges'"
            if judge not in profiles:
                out.append(f"{where} names {judge!r}, which is not a profile; define profiles.{judge} or remove it from the list")
            elif profiles[judge].values.get("judges"):
                out.append(f"{where} names {judge!r}, which is itself a panel (a judge must be a single profile)")
            else:
                out += _check_judge_reference(prof, profiles[judge], config_file)
    return out


def _panels_take_judges_schema(profiles: Mapping[str, Profile]) -> dict[str, Profile]:
    """A panel whose own entry sets no ``response_format`` takes its judges' when they all have the
    same one (its result and report read the judges' answers with it); otherwise it keeps what it has."""
    out = dict(profiles)
    for prof in profiles.values():
        judges = prof.values.get("judges") or ()
        if not judges or prof.sources.get("response_format") == f"config.yaml profiles.{prof.name}":
            continue
        formats = [profiles[j].values.get("response_format") if j in profiles else None for j in judges]
        shared = formats[0]
        if shared is not None and all(f == shared for f in formats) and shared != prof.values.get("response_format"):
            values = MappingProxyType({**prof.values, "response_format": shared})
            out[prof.name] = Profile(prof.name, values, MappingProxyType({**prof.sources, "response_format": "judges"}))
    return out


def _check_judge_reference(panel: Profile, judge: Profile, config_file: Path) -> list[str]:
    """A panel compares its labels with each judge's answers: its ``reference_field`` must be a
    field of every judge's schema (the panel's own schema is not what is compared)."""
    column, field_name = panel.values.get("reference_column"), panel.values.get("reference_field")
    fields = _schema_fields(judge)
    where = f"{config_file}: profiles.{panel.name}"
    fix = (
        "give every judge a response_format with that field (in each judge's profile, or once in the default "
        "settings, where the panel and its judges all inherit it)"
    )
    if field_name is not None and field_name not in fields:
        known = f"its fields are {', '.join(map(repr, fields))}" if fields else f"profile {judge.name!r} has no response_format"
        return [
            f"{where}: key 'reference_field' is {field_name!r}, which is not a field of judge {judge.name!r}'s schema "
            f"({known}); a panel compares the labels with each judge's answer: {fix}"
        ]
    if column is not None and field_name is None and fields:
        return [
            f"{where}: key 'reference_column' is {column!r} but 'reference_field' is not set: judge {judge.name!r} answers "
            f"with a response_format; set 'reference_field' in profiles.{panel.name} to the field the labels are "
            f"compared with (one of {', '.join(map(repr, fields))})"
        ]
    return []


def _schema_fields(profile: Profile) -> list[str]:
    """The fields of ``profile``'s response_format schema (none without one)."""
    rf = profile.values.get("response_format") or {}
    schema = rf.get("json_schema", {}).get("schema") if isinstance(rf.get("json_schema"), Mapping) else None
    return list((schema or {}).get("properties") or {}) if isinstance(schema, Mapping) else []


def _check_provider_model(profile: Profile, config_file: Path) -> str | None:
    """A model the profile's provider does not offer is refused before anything is sent
    (the message, collected with the other configuration errors)."""
    provider = profile.values["provider"]
    prefix = PROVIDER_MODEL_PREFIX.get(provider)
    model = profile.values["model"]
    if prefix and isinstance(model, str) and not model.startswith(prefix):
        where = "the default profile" if profile.name == "default" else f"profiles.{profile.name}"
        return (
            f"{config_file}: {where}: key 'model' is {model!r}, which provider {provider!r} does not offer "
            f"(its models start with {prefix!r}); set 'model' or 'provider'"
        )
    return None


def _check_sampling(profile: Profile, config_file: Path) -> str | None:
    """A ``temperature`` under a provider API version that refuses it on every model (Anthropic
    2026-10-21: core/providers.ANTHROPIC_API_VERSIONS) is refused before anything is sent (the
    message); under a version that does not, the model's catalogue row decides (pipeline/catalogue.py)."""
    t = profile.values.get("temperature")
    facts = PROVIDER_FACTS[profile.values["provider"]]
    if t is None or facts.api_version_setting is None:
        return None
    version = profile.values.get(facts.api_version_setting)
    if "temperature" not in facts.refused_sampling(version):
        return None
    where = "the default profile" if profile.name == "default" else f"profiles.{profile.name}"
    source = profile.sources.get("temperature", "")
    if source.startswith(("env ", "flag ")):
        fix = f"unset {source.split(' ', 1)[1]}" if source.startswith("env ") else "leave out --temperature"
    elif profile.name != "default" and source != f"config.yaml profiles.{profile.name}":
        fix = f"set 'temperature: null' in {where} (it inherits {t:g} from the default settings in config.yaml)"
    else:
        fix = f"remove 'temperature' from {where} in config.yaml"
    return (
        f"{config_file}: {where}: key 'temperature' is {t:g}, but {facts.name} API version {version} (the version "
        f"header this program sends) refuses {', '.join(facts.refused_sampling(version))} on every model: each request "
        f"would fail with 400 invalid_request_error; {fix}: answers then use the model's default sampling (several "
        f"samples still differ), or pin an older '{facts.api_version_setting}' in config.yaml "
        f"({', '.join(v for v, r in facts.api_versions.items() if 'temperature' not in r)}), where each model's "
        "catalogue row decides"
    )


def _check_deadline(profile: Profile, config_file: Path, now: float) -> str | None:
    """A ``deadline`` already past is refused before anything is sent (the message)."""
    problem = deadline_problem(profile.values.get("deadline"), now)
    if problem is None:
        return None
    where = "the default profile" if profile.name == "default" else f"profiles.{profile.name}"
    return f"{config_file}: {where}: key 'deadline' {problem}"


def _check_reference(profile: Profile, config_file: Path) -> str | None:
    """A ``reference_field`` the schema does not have, or a schema without one while labels are
    compared, is refused before anything is sent (the message, collected with the others)."""
    column, field_name = profile.values.get("reference_column"), profile.values.get("reference_field")
    rf = profile.values.get("response_format") or {}
    schema = rf.get("json_schema", {}).get("schema") if isinstance(rf.get("json_schema"), Mapping) else None
    fields = list((schema or {}).get("properties") or {}) if isinstance(schema, Mapping) else []
    where = "the default profile" if profile.name == "default" else f"profiles.{profile.name}"
    if field_name is not None and field_name not in fields:
        known = (
            f"the schema's fields are {', '.join(map(repr, fields))}" if fields else "the profile has no response_format schema"
        )
        return f"{config_file}: {where}: key 'reference_field' is {field_name!r}, which is not a field of the schema ({known})"
    if column is not None and field_name is None and fields:
        return (
            f"{config_file}: {where}: key 'reference_column' is {column!r} but 'reference_field' is not set: with a "
            f"response_format the answer column holds the whole JSON answer; set 'reference_field' to the field the "
            f"labels are compared with (one of {', '.join(map(repr, fields))})"
        )
    return None


def provider_key_problem(config: Config, sandbox: bool = False) -> str | None:
    """Which profile needs a key that is not set (None when every used provider has one)."""
    if sandbox:
        return None
    for prof in (config.default, *config.profiles.values()):
        provider = prof.values["provider"]
        facts = PROVIDER_FACTS[provider]
        where = "the default profile" if prof.name == "default" else f"profile {prof.name!r}"
        if facts.key_checked_by_profile and not prof.values.get(facts.key_setting):
            return f"{where} uses provider {provider!r}: set {facts.key_var_text} (in the environment or secrets.env)"
        for setting, fix in facts.required_settings.items():
            if not prof.values.get(setting):
                return f"{where} uses provider {provider!r}: {fix}"
    return None
