"""secrets: the API key's life in one place: the ``secrets.env`` file, and masking.

``secrets.env`` in the home holds ``NAME=value`` lines (the same syntax systemd's
``EnvironmentFile=`` reads).  It is written 0600, and a file that others can read, or that
another user owns, is refused rather than loaded.  :func:`mask_secret` is how a key is shown
anywhere (``sk-…abcd``), and :class:`MaskSecrets` is the logging filter that removes every
known secret, and anything shaped like an OpenAI key, from log lines and tracebacks.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import stat
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from batchgrader.core.host.home import Home
from batchgrader.fsio import atomic_write_bytes

ENV_FILE_NAME = "secrets.env"
API_KEY_VAR = "OPENAI_API_KEY"


class EnvFileError(RuntimeError):
    """The secrets file is unsafe (too open, wrong owner) or unparseable."""


def env_file_path(home: Home) -> Path:
    return home.root / ENV_FILE_NAME


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_PLAIN = re.compile(r"[A-Za-z0-9_.,:/+=@%~^-]+")


def _format_env_value(value: str) -> str:
    if not value or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise EnvFileError("the API key is empty or contains whitespace/control characters (a paste error?)")
    if _ENV_PLAIN.fullmatch(value):
        return value
    if "'" not in value:
        return f"'{value}'"  # single quotes: verbatim for systemd and for parse_env_text
    raise EnvFileError("the API key contains both special characters and a single quote; cannot store it safely in an env file")


def _line_name(line: str) -> str | None:
    s = line.strip()
    if not s or s[0] in "#;" or "=" not in s:
        return None
    return s.split("=", 1)[0].strip()


def write_env_file(path: str | os.PathLike, values: Mapping[str, str], *, uid: int | None = None, gid: int | None = None) -> Path:
    """Set ``values`` in the env file, keeping every other line; atomic, mode 0600."""
    path = Path(path)
    if path.is_symlink():
        raise EnvFileError(f"{path} is a symlink; refusing to write a secret through it")
    formatted = {k: _format_env_value(v) for k, v in values.items()}
    old = (
        path.read_text(encoding="utf-8").splitlines()
        if path.exists()
        else [
            "# BatchGrader secrets: keep this file mode 0600. Loaded by systemd (EnvironmentFile=)",
            "# and by `bgctl daemon` for variables not already set in its environment.",
        ]
    )
    out, pending = [], dict(formatted)
    for line in old:
        name = _line_name(line)
        if name in formatted:
            if name in pending:
                out.append(f"{name}={pending.pop(name)}")
            continue  # drop duplicates of a name we set
        out.append(line)
    out += [f"{k}={v}" for k, v in pending.items()]
    atomic_write_bytes(Path(path), ("\n".join(out) + "\n").encode("utf-8"), mode=0o600, owner=(uid, gid))
    return path


def load_env_file(path: str | os.PathLike) -> dict[str, str]:
    """Parse a KEY=VALUE env file after ssh-style checks.

    Raises FileNotFoundError if absent, EnvFileError if it is not a regular file, not owned
    by us (or root), or accessible by group/others."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except PermissionError as exc:
        raise EnvFileError(f"cannot read {path}: permission denied") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        q = shlex.quote(str(path))
        if not stat.S_ISREG(st.st_mode):
            raise EnvFileError(f"{path} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise EnvFileError(
                f"{path} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
                f"it holds an API key. Fix: chown {os.geteuid()} {q}"
            )
        if st.st_mode & 0o077:
            raise EnvFileError(
                f"permissions {stat.S_IMODE(st.st_mode):04o} for {path} are too open: it "
                f"holds an API key and must not be accessible by group or others. "
                f"Fix: chmod 600 {q}"
            )
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path} is not UTF-8") from exc
    return parse_env_text(text, str(path))


def parse_env_text(text: str, source: str = "<env>") -> dict[str, str]:
    """The single-line subset of systemd's EnvironmentFile= syntax.

    Blank lines, lines starting with # or ;, lines without '=' and invalid names are ignored
    (as systemd does).  Values: 'single' (verbatim), "double" (\\ escapes for " \\ ` $),
    or unquoted (backslash keeps the next character).  Multi-line values are refused."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        name = _line_name(raw)
        if name is None or not _ENV_NAME.fullmatch(name):
            continue
        value = raw.split("=", 1)[1].strip()
        where = f"{source}:{lineno}"
        out[name] = _unquote(value, where)
    return out


def _unquote(value: str, where: str) -> str:
    if value[:1] == "'":
        end = value.find("'", 1)
        if end < 0 or value[end + 1 :].strip():
            raise EnvFileError(f"{where}: unterminated or trailing text after '...' (multi-line values unsupported)")
        return value[1:end]
    quote = value[:1] == '"'
    buf, i = [], 1 if quote else 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            if i + 1 >= len(value):
                raise EnvFileError(f"{where}: line continuation is not supported")
            nxt = value[i + 1]
            buf.append(nxt if (not quote or nxt in '"\\`$') else c + nxt)
            i += 2
            continue
        if quote and c == '"':
            if value[i + 1 :].strip():
                raise EnvFileError(f'{where}: trailing text after "..."')
            return "".join(buf)
        buf.append(c)
        i += 1
    if quote:
        raise EnvFileError(f'{where}: unterminated " quote (multi-line values unsupported)')
    return "".join(buf)


def apply_env_file(path: str | os.PathLike, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """For ``bgctl daemon`` at start-up: load the env file if present and set the variables
    that are unset or empty in ``environ``.  Returns their names (never the values).

    The permission check runs whenever the file exists, even if everything is already set
    (under systemd), so a key left world-readable stops the daemon with a clear message."""
    env = os.environ if environ is None else environ
    try:
        values = load_env_file(path)
    except FileNotFoundError:
        return []
    applied = [k for k in values if not env.get(k)]
    for k in applied:
        env[k] = values[k]
    return applied


# --- file and command helpers ------------------------------------------------------------


def mask_secret(value: str | None) -> str | None:
    if not value:
        return value
    if len(value) <= 8:
        return "****"
    return f"{value[:3]}…{value[-4:]}"


_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_\-]{8,}")
# whatever follows "Bearer " in a header an HTTP library prints (any key shape, not only sk-)
_BEARER_PATTERN = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=%\\-]{8,}")


def clean_api_key(value: str) -> str:
    """An API key as loaded from the environment, a file or config: surrounding whitespace and a
    trailing CR/LF (a paste, a file edited on Windows) are stripped; any other control character
    or inner whitespace is refused (ValueError, which never quotes the key)."""
    key = value.strip()
    if any(ord(c) < 32 or ord(c) == 127 or c.isspace() for c in key):
        raise ValueError("an API key without control characters or inner whitespace (a paste error?)")
    return key


def secret_forms(secret: str) -> list[str]:
    """The secret as written and as libraries print it (repr and JSON escapes, percent-encoding,
    a bytes repr), longest first; forms under 8 characters are left out (they garble text)."""
    import json
    import urllib.parse

    base = {secret, secret.strip()}
    forms = set(base)
    for s in base:
        forms.add(json.dumps(s)[1:-1])
        forms.add(json.dumps(s)[1:-1].replace("/", "\\/"))  # JSON writers that escape '/'
        forms.add(repr(s)[1:-1])
        forms.add(urllib.parse.quote(s, safe=""))
        forms.add(urllib.parse.quote_plus(s))
        forms.add(repr(s.encode("utf-8"))[2:-1])
    return sorted((f for f in forms if len(f) >= 8), key=len, reverse=True)


class MaskSecrets(logging.Filter):
    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = [s for s in secrets if s]
        self.forms = sorted({f for s in self.secrets for f in secret_forms(s)}, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "****")
        for f in self.forms:
            text = text.replace(f, "****")
        text = _BEARER_PATTERN.sub(r"\1****", text)
        return _KEY_PATTERN.sub("sk-****", text)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.mask(record.getMessage())
        record.args = ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = self.mask(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
