"""The service definitions ``bgctl service install`` writes, rendered as text: the systemd unit
(user or system, with its sandbox) and the launchd plist, where each goes, and the command line
they start (``bgctl daemon --home ...``).  Nothing here writes or runs anything.
"""

from __future__ import annotations

import importlib.util
import os
import plistlib
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from batchgrader import __version__
from batchgrader.core.host.home import Home

UNIT_NAME = "batchgrader.service"
LAUNCHD_LABEL = "com.batchgrader.daemon"
MODES = ("user", "system")

BgctlCommand = str | os.PathLike | Sequence[str]


class ServiceError(RuntimeError):
    """A refusal or failure with a message meant for the user (never contains the key)."""


# --- locations ---------------------------------------------------------------------------


def manager_for(platform: str) -> str:
    if platform.startswith("linux"):
        return "systemd"
    if platform == "darwin":
        return "launchd"
    raise ServiceError(f"service install is supported on Linux (systemd) and macOS (launchd), not {platform!r}")


def unit_path(
    mode: str, platform: str = sys.platform, unit_dir: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
) -> Path:
    """Where the unit/plist is (or would be) installed."""
    _check_mode(mode)
    manager = manager_for(platform)
    env = os.environ if environ is None else environ
    home_dir = Path(env.get("HOME") or Path.home())
    if manager == "launchd":
        if mode != "user":
            raise ServiceError("on macOS only a per-user LaunchAgent is supported: use --user")
        return Path(unit_dir or home_dir / "Library" / "LaunchAgents") / f"{LAUNCHD_LABEL}.plist"
    if unit_dir is None:
        if mode == "system":
            unit_dir = Path("/etc/systemd/system")
        else:
            xdg = env.get("XDG_CONFIG_HOME", "")
            unit_dir = (Path(xdg) if os.path.isabs(xdg) else home_dir / ".config") / "systemd" / "user"
    return Path(unit_dir) / UNIT_NAME


def default_bgctl_command() -> list[str]:
    """The absolute command that starts bgctl: this venv's script, else PATH, else ``python -m``."""
    if sys.executable:
        venv_bgctl = Path(sys.executable).parent / "bgctl"  # not resolved: keep the venv
        if venv_bgctl.is_file() and os.access(venv_bgctl, os.X_OK):
            return [str(venv_bgctl.absolute())]
    found = shutil.which("bgctl")
    if found:
        return [str(Path(found).absolute())]
    if sys.executable and importlib.util.find_spec("batchgrader.__main__") is not None:
        return [sys.executable, "-m", "batchgrader"]
    raise ServiceError(
        "cannot find the bgctl executable (not next to this Python, not on PATH); pass its absolute path explicitly"
    )


def _bgctl_argv(bgctl_path: BgctlCommand | None) -> list[str]:
    if bgctl_path is None:
        return default_bgctl_command()
    if isinstance(bgctl_path, (str, os.PathLike)):
        argv = [os.fspath(bgctl_path)]
        if os.sep not in argv[0]:  # a bare name: look it up now, services get a minimal PATH
            found = shutil.which(argv[0])
            if not found:
                raise ServiceError(f"{argv[0]!r} not found on PATH; pass an absolute path")
            argv = [found]
    else:
        argv = [os.fspath(a) for a in bgctl_path]
    if not argv or not os.path.isabs(argv[0]):
        raise ServiceError(f"the bgctl path must be absolute, got {argv[:1]!r}")
    return argv


def daemon_argv(home: Home, bgctl_path: BgctlCommand | None = None) -> list[str]:
    return [*_bgctl_argv(bgctl_path), "--home", str(home.root), "daemon"]


# --- systemd quoting ---------------------------------------------------------------------
# Each directive has its own rules (systemd 252 load-fragment.c): ExecStart= and
# ReadWritePaths= split words and unquote ("..." with \\ and \" escapes); EnvironmentFile=
# takes the raw rest of the line (no unquoting, so quotes would become part of the path) and
# then glob(3)s it.  All of them expand %-specifiers, so a literal % is written %%.


def _check_text(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ServiceError(f"{what} contains a newline or control character, which a unit/plist cannot represent: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ServiceError(f"{what} is not valid UTF-8: {value!r}") from exc
    return value


def _systemd_word(value: str, *, dollar: bool) -> str:
    """One word for ExecStart=/ReadWritePaths=; ``dollar`` escapes $ (arguments, not argv[0])."""
    value = _check_text(value, "path").replace("%", "%%")
    if dollar:
        value = value.replace("$", "$$")
    if value and not re.search(r"[\s\"'\\;]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_env_file(path: Path) -> str:
    value = _check_text(str(path), "env file path").replace("%", "%%")
    return re.sub(r"([\\*?\[])", r"\\\1", value)  # glob(3) metacharacters, backslash-escaped


def _invoking_user(environ: Mapping[str, str] | None = None, name: str | None = None) -> tuple[str, str, int, int]:
    """(user, group, uid, gid) of ``name``, or of the user behind sudo, or of us."""
    import grp
    import pwd

    env = os.environ if environ is None else environ
    if name is None and os.geteuid() == 0:
        name = env.get("SUDO_USER") or None
    try:
        pw = pwd.getpwnam(name) if name else pwd.getpwuid(os.geteuid())
    except KeyError as exc:
        raise ServiceError(f"no such user: {name!r}") from exc
    try:
        group = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        group = str(pw.pw_gid)
    return pw.pw_name, group, pw.pw_uid, pw.pw_gid


_USER_SANDBOX_NOTE = """\
# Sandbox: ProtectSystem=, ProtectHome=, ReadWritePaths= and PrivateTmp= need a mount
# namespace, which a per-user service manager can only set up through unprivileged user
# namespaces (an implicit PrivateUsers=).  Depending on the systemd version and the kernel
# they are then silently ignored or make every start fail (status=226/NAMESPACE), so this
# user unit leaves them out; NoNewPrivileges= and UMask= need no namespace and are kept.
# For the full sandbox install the system unit instead (bgctl service install --system),
# which still runs as you.
# No After=/Wants=network-online.target either: a user manager cannot see that system
# target.  The daemon retries network errors on its own."""

_SYSTEM_SANDBOX_NOTE = """\
# Sandbox: the whole file system is read-only except the state root.  ProtectHome= is
# read-only rather than yes because the state root, and usually bgctl's virtualenv, live
# under /home; ReadWritePaths= (a deeper mount) makes the state root writable again.
# /tmp is private.  Anything the daemon writes must be under the state root."""


def render_systemd_unit(
    home: Home, bgctl_path: BgctlCommand, user_mode: bool, env_file: Path, *, user: str | None = None, group: str | None = None
) -> str:
    """The unit text.  System units run as ``user``/``group`` (default: the invoking user)."""
    argv = daemon_argv(home, bgctl_path)
    if re.search(r"[\"'\\]", argv[0]):  # systemd's string_is_safe(): fatal "special characters"
        raise ServiceError(
            f"systemd refuses to run an executable whose path contains a quote or a "
            f"backslash: {argv[0]!r}; install bgctl under a path without them"
        )
    exec_start = " ".join([_systemd_word(argv[0], dollar=False), *(_systemd_word(a, dollar=True) for a in argv[1:])])
    mode = "user" if user_mode else "system"
    lines = [
        f"# {UNIT_NAME}: generated by `bgctl service install --{mode}` (BatchGrader {__version__}).",
        "# Re-run the installer rather than editing; local tweaks belong in `systemctl"
        + (" --user" if user_mode else "")
        + " edit batchgrader`.",
        "# No secret in this file: OPENAI_API_KEY comes from the EnvironmentFile= below (mode 0600);",
        "# its leading '-' lets the service start without one.",
        "",
        "[Unit]",
        "Description=BatchGrader daemon (grades inbox files with LLM batch jobs)",
    ]
    if not user_mode:
        lines += ["After=network-online.target", "Wants=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        f"EnvironmentFile=-{_systemd_env_file(Path(env_file))}",
        "Environment=PYTHONUNBUFFERED=1",
        "WatchdogSec=60",
        "Restart=on-failure",
        "# exit 78 = configuration error (bad config.yaml, no key, unsafe secrets.env): restarting cannot fix it",
        "RestartPreventExitStatus=78",
        "RestartSec=10",
        "TimeoutStopSec=90",
    ]
    if not user_mode:
        if user is None or group is None:
            u, g, _, _ = _invoking_user()
            user, group = user or u, group or g
        lines += [f"User={user}", f"Group={group}"]
    lines += ["UMask=0077", "NoNewPrivileges=yes"]
    if user_mode:
        lines.append(_USER_SANDBOX_NOTE)
    else:
        lines += [
            _SYSTEM_SANDBOX_NOTE,
            "ProtectSystem=strict",
            "ProtectHome=read-only",
            f"ReadWritePaths={_systemd_word(str(home.root), dollar=False)}",
            "PrivateTmp=yes",
        ]
    lines += ["", "[Install]", f"WantedBy={'default.target' if user_mode else 'multi-user.target'}", ""]
    return "\n".join(lines)


def render_launchd_plist(home: Home, bgctl_path: BgctlCommand, label: str = LAUNCHD_LABEL) -> str:
    """A LaunchAgent plist.  KeepAlive={SuccessfulExit: false} mirrors Restart=on-failure:
    relaunch after a crash or a non-zero exit, but not after a clean stop (exit 0 on SIGTERM),
    so `launchctl kill TERM` or a deliberate shutdown is not undone every 10 s."""
    argv = [_check_text(a, "path") for a in daemon_argv(home, bgctl_path)]
    plist = {
        "Label": label,
        "ProgramArguments": argv,
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "WorkingDirectory": str(home.root),
        "StandardOutPath": str(home.logs / "launchd.out.log"),
        "StandardErrorPath": str(home.logs / "launchd.err.log"),
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},  # never the key: see apply_env_file
        "Umask": 0o077,  # 63: plists have no octal
        "ProcessType": "Background",
        "ExitTimeOut": 90,
    }
    return plistlib.dumps(plist, sort_keys=False).decode("utf-8")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ServiceError(f"mode must be 'user' or 'system', not {mode!r}")
