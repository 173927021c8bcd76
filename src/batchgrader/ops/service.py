"""Install ``bgctl daemon`` as a service: a systemd unit (Linux) or a launchd agent (macOS).

What lives where
  * the unit / plist: ``~/.config/systemd/user/batchgrader.service`` (``--user``),
    ``/etc/systemd/system/batchgrader.service`` (``--system``, runs as the invoking user), or
    ``~/Library/LaunchAgents/com.batchgrader.daemon.plist``.  It holds no secret.
  * the API key: ``<home>/secrets.env`` (``OPENAI_API_KEY=...``, mode 0600, owned by the user
    the daemon runs as).  That one file serves both platforms: systemd loads it through
    ``EnvironmentFile=-`` (optional, so the unit starts without it); launchd cannot load env
    files, so ``bgctl daemon`` calls :func:`apply_env_file` at start-up, which fills in only
    variables that are not already set and refuses a file readable by group/others (as ssh
    does with private keys).  The key is never written to the unit, the plist or argv.

Nothing here runs systemctl/launchctl unless ``activate=True``; otherwise the results list
the commands for the user to run.  ``uninstall`` removes only the unit/plist (and systemd's
enablement symlink to it): the env file and the home are the user's and stay.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.host.secrets import API_KEY_VAR, env_file_path, write_env_file
from batchgrader.fsio import atomic_write_bytes
from batchgrader.ops.unitfiles import (
    LAUNCHD_LABEL,
    UNIT_NAME,
    BgctlCommand,
    ServiceError,
    _bgctl_argv,
    _check_mode,
    _invoking_user,
    manager_for,
    render_launchd_plist,
    render_systemd_unit,
    unit_path,
)
from batchgrader.ops.unitfiles import daemon_argv as daemon_argv  # re-exported
from batchgrader.ops.unitfiles import default_bgctl_command as default_bgctl_command

Runner = Callable[[Sequence[str]], "CommandResult"]


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def to_dict(self) -> dict[str, Any]:
        return {"command": shlex.join(self.argv), "returncode": self.returncode, "stdout": self.stdout, "stderr": self.stderr}


@dataclass(frozen=True)
class Step:
    """A command for the user (or ``activate=True``) to run; ``optional`` failures are fine."""

    argv: list[str]
    optional: bool = False

    def __str__(self) -> str:
        return shlex.join(self.argv) + ("   # may fail harmlessly if not loaded" if self.optional else "")


@dataclass
class InstallResult:
    manager: str  # "systemd" | "launchd"
    mode: str  # "user" | "system"
    path: Path  # where the unit/plist goes
    content: str
    written: bool
    env_file: Path
    env_file_written: bool
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    activation: list[CommandResult] = field(default_factory=list)

    @property
    def next_steps(self) -> list[str]:
        return [str(s) for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return {
            "manager": self.manager,
            "mode": self.mode,
            "path": str(self.path),
            "written": self.written,
            "env_file": str(self.env_file),
            "env_file_written": self.env_file_written,
            "next_steps": self.next_steps,
            "notes": self.notes,
            "warnings": self.warnings,
            "activation": [r.to_dict() for r in self.activation],
        }


@dataclass
class UninstallResult:
    manager: str
    mode: str
    path: Path
    removed: bool
    removed_links: list[Path] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    activation: list[CommandResult] = field(default_factory=list)

    @property
    def next_steps(self) -> list[str]:
        return [str(s) for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return {
            "manager": self.manager,
            "mode": self.mode,
            "path": str(self.path),
            "removed": self.removed,
            "removed_links": [str(p) for p in self.removed_links],
            "next_steps": self.next_steps,
            "notes": self.notes,
            "activation": [r.to_dict() for r in self.activation],
        }


# --- the env (secrets) file --------------------------------------------------------------


def _atomic_write(path: Path, data: bytes, mode: int, *, uid: int | None = None, gid: int | None = None) -> None:
    atomic_write_bytes(path, data, mode=mode, owner=(uid, gid))


def run_command(argv: Sequence[str]) -> CommandResult:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return CommandResult(list(argv), 127, "", f"{type(exc).__name__}: {exc}")
    return CommandResult(list(argv), p.returncode, p.stdout, p.stderr)


def _run_steps(steps: Sequence[Step], runner: Runner) -> list[CommandResult]:
    results = []
    for step in steps:
        r = runner(step.argv)
        results.append(r)
        if not r.ok and not step.optional:
            break
    return results


def _systemctl(mode: str, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if mode == "user" else []), *args]


def _gui_domain() -> str:
    return f"gui/{os.getuid()}"


# --- install / uninstall / status --------------------------------------------------------


def install(
    home: Home,
    mode: str = "user",
    print_only: bool = False,
    platform: str = sys.platform,
    bgctl_path: BgctlCommand | None = None,
    api_key: str | None = None,
    unit_dir: str | os.PathLike | None = None,
    *,
    activate: bool = False,
    run_as: str | None = None,
    runner: Runner | None = None,
    environ: Mapping[str, str] | None = None,
) -> InstallResult:
    """Write the unit/plist (and the key to the 0600 env file if ``api_key``); return next steps.

    ``print_only``: render and return, touch nothing (the key is not written either).
    ``activate``: also run the next steps (daemon-reload, enable --now / bootstrap) now.
    ``run_as`` (system units): the account to run as; default the invoking (sudo) user."""
    _check_mode(mode)
    manager = manager_for(platform)
    env = os.environ if environ is None else environ
    dest = unit_path(mode, platform, unit_dir, env)
    env_file = env_file_path(home)
    argv = _bgctl_argv(bgctl_path)
    warnings: list[str] = []
    notes: list[str] = []
    if not (os.path.isfile(argv[0]) and os.access(argv[0], os.X_OK)):
        warnings.append(f"{argv[0]} is not an executable file; the service will fail to start")

    content, uid, gid = _render_for(manager, mode, home, argv, env_file, env, run_as, warnings)
    existed = dest.exists()
    steps = _install_steps(manager, mode, dest, existed)
    notes += _install_notes(manager, mode, home, env)

    result = InstallResult(manager, mode, dest, content, False, env_file, False, steps, notes, warnings)
    if print_only:
        if api_key:
            notes.append(f"--print: the API key was not written; it belongs in {env_file} (mode 0600)")
        return result

    _write_install(result, home, api_key, uid, gid)
    if not result.env_file_written and not env_file.exists():
        notes.append(f"No API key stored: put {API_KEY_VAR}=... in {env_file} (chmod 600) or the daemon will start without one")
    if activate:
        result.activation = _run_steps(steps, runner or run_command)
    return result


def _render_for(
    manager: str,
    mode: str,
    home: Home,
    argv: list[str],
    env_file: Path,
    env: Mapping[str, str],
    run_as: str | None,
    warnings: list[str],
) -> tuple[str, int | None, int | None]:
    """The unit file or plist for ``manager`` and ``mode``, and the uid and gid a system unit runs
    as (None for the others); what deserves a warning is added to ``warnings``."""
    if manager != "systemd":
        if os.geteuid() == 0:
            warnings.append("running as root: the LaunchAgent belongs in your own account; run without sudo")
        return render_launchd_plist(home, argv), None, None
    if mode != "system":
        if os.geteuid() == 0:
            warnings.append("installing a user unit for root; for a service that runs as you, run without sudo (or use --system)")
        return render_systemd_unit(home, argv, True, env_file), None, None
    user, group, uid, gid = _invoking_user(env, run_as)
    if uid == 0:
        warnings.append(
            "the system unit will run the daemon as root; prefer your own account "
            "(run with sudo from it, or pass the user to run as)"
        )
    _check_home_owner(home, uid, user)
    return render_systemd_unit(home, argv, False, env_file, user=user, group=group), uid, gid


def _install_notes(manager: str, mode: str, home: Home, env: Mapping[str, str]) -> list[str]:
    """Where the service's logs go, and (user units) that it runs only while the user is logged in."""
    if manager != "systemd":
        return [f"Logs: {home.logs / 'launchd.err.log'} and {home.logs / 'launchd.out.log'}"]
    notes = []
    if mode == "user":
        notes.append(
            "A user service runs only while you are logged in unless lingering is on: "
            f"loginctl enable-linger {env.get('USER') or _invoking_user(env)[0]}"
        )
    notes.append("Logs: journalctl " + ("--user " if mode == "user" else "") + "-u batchgrader -f")
    return notes


def _write_install(result: InstallResult, home: Home, api_key: str | None, uid: int | None, gid: int | None) -> None:
    """Create the home, write the key (0600) when given, then the unit file; a refusal names the fix."""
    try:
        _prepare_home(home, uid, gid)
        if api_key:
            write_env_file(result.env_file, {API_KEY_VAR: api_key}, uid=uid, gid=gid)
            result.env_file_written = True
        _atomic_write(result.path, result.content.encode("utf-8"), 0o644)
        result.written = True
    except PermissionError as exc:
        raise ServiceError(
            f"permission denied writing {exc.filename or result.path}"
            + (": run as root (sudo), or use --print and install it yourself" if result.mode == "system" else "")
        ) from exc


def _install_steps(manager: str, mode: str, dest: Path, existed: bool) -> list[Step]:
    if manager == "launchd":
        return [
            Step(["launchctl", "bootout", f"{_gui_domain()}/{LAUNCHD_LABEL}"], optional=True),
            Step(["launchctl", "bootstrap", _gui_domain(), str(dest)]),
        ]
    steps = [Step(_systemctl(mode, "daemon-reload"))]
    if existed:  # enable --now would leave an already running old version running
        steps += [Step(_systemctl(mode, "enable", UNIT_NAME)), Step(_systemctl(mode, "restart", UNIT_NAME))]
    else:
        steps.append(Step(_systemctl(mode, "enable", "--now", UNIT_NAME)))
    return steps


def _check_home_owner(home: Home, uid: int, user: str) -> None:
    """A system unit runs as ``user``: its state root must be theirs (sudo may have
    resolved the default home to root's)."""
    root = home.root
    if root.exists() and root.stat().st_uid != uid:
        raise ServiceError(
            f"the state root {root} is owned by uid {root.stat().st_uid}, but the service "
            f"would run as {user} (uid {uid}); pass --home with {user}'s state root"
        )
    if uid != 0 and (root == Path("/root") or Path("/root") in root.parents):
        raise ServiceError(
            f"the state root {root} is under /root, which {user} cannot reach (sudo changes HOME); pass --home explicitly"
        )


def _prepare_home(home: Home, uid: int | None, gid: int | None) -> None:
    """Create the state root (ReadWritePaths= and launchd's log paths need it); when root
    installs for another user, hand the directories it created to that user."""
    missing = [d for d in home.dirs() if not d.exists()]
    home.ensure()
    if uid is not None and os.geteuid() == 0 and uid != 0:
        for d in missing:
            os.chown(d, uid, -1 if gid is None else gid)


def uninstall(
    home: Home,
    mode: str = "user",
    platform: str = sys.platform,
    unit_dir: str | os.PathLike | None = None,
    *,
    activate: bool = False,
    runner: Runner | None = None,
    environ: Mapping[str, str] | None = None,
) -> UninstallResult:
    """Remove the unit/plist and systemd's enablement symlink to it.  The env file (the key)
    and the whole state root are left alone.  With ``activate`` the service is stopped and
    disabled first (and systemd reloaded after); otherwise the steps say how."""
    _check_mode(mode)
    manager = manager_for(platform)
    dest = unit_path(mode, platform, unit_dir, environ)
    result = UninstallResult(manager, mode, dest, False)
    runner = runner or run_command
    if manager == "systemd":
        stop_first = [Step(_systemctl(mode, "disable", "--now", UNIT_NAME), optional=True)]
        after = [Step(_systemctl(mode, "daemon-reload"))]
        # Once the file is gone `disable` cannot find it, but `stop` still works on the loaded unit.
        result.steps = [Step(_systemctl(mode, "stop", UNIT_NAME), optional=True), *after]
    else:
        stop_first = [Step(["launchctl", "bootout", f"{_gui_domain()}/{LAUNCHD_LABEL}"], optional=True)]
        after = []
        result.steps = list(stop_first)
    existed = dest.exists() or dest.is_symlink()
    if activate and existed:
        result.activation += _run_steps(stop_first, runner)
    if manager == "systemd":
        target = "default.target" if mode == "user" else "multi-user.target"
        link = dest.parent / f"{target}.wants" / UNIT_NAME
        if link.is_symlink() and os.readlink(link) in (str(dest), f"../{UNIT_NAME}"):
            link.unlink()
            result.removed_links.append(link)
    if existed:
        try:
            dest.unlink()
        except PermissionError as exc:
            raise ServiceError(
                f"permission denied removing {dest}" + (": run as root (sudo)" if mode == "system" else "")
            ) from exc
        result.removed = True
        if activate:
            result.activation += _run_steps(after, runner)
            result.steps = []
    else:
        result.notes.append(f"nothing installed at {dest}")
    result.notes.append(
        f"Left untouched: {env_file_path(home)} (your API key) and {home.root} (inbox, "
        "outputs, database, logs). Delete them yourself if you no longer need them."
    )
    return result


def status(
    home: Home,
    mode: str | None = None,
    platform: str = sys.platform,
    unit_dir: str | os.PathLike | None = None,
    *,
    runner: Runner | None = None,
    which: Callable[[str], str | None] = shutil.which,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Installed? where? and, when the manager's CLI exists, whether it is running.

    ``mode=None`` picks the installed one (user first), else reports the user location."""
    manager = manager_for(platform)
    if mode is None:
        mode = "user"
        if (
            manager == "systemd"
            and unit_dir is None
            and not unit_path("user", platform, None, environ).exists()
            and unit_path("system", platform, None, environ).exists()
        ):
            mode = "system"
    dest = unit_path(mode, platform, unit_dir, environ)
    env_file = env_file_path(home)
    out: dict[str, Any] = {
        "manager": manager,
        "mode": mode,
        "path": str(dest),
        "installed": dest.exists(),
        "env_file": str(env_file),
        "env_file_present": env_file.exists(),
        "env_file_mode": f"{stat.S_IMODE(env_file.stat().st_mode):04o}" if env_file.exists() else None,
        "active": None,
        "detail": None,
    }
    tool = "systemctl" if manager == "systemd" else "launchctl"
    if not which(tool):
        out["detail"] = f"{tool} not found"
        return out
    runner = runner or run_command
    if manager == "systemd":
        r = runner(_systemctl(mode, "is-active", UNIT_NAME))
        out["active"] = r.stdout.strip() or None  # active / inactive / failed / activating ...
        out["detail"] = r.stderr.strip() or None  # e.g. "Failed to connect to bus" in containers
    else:
        r = runner(["launchctl", "print", f"{_gui_domain()}/{LAUNCHD_LABEL}"])
        if r.ok:
            m = re.search(r"^\s*state = (\S+)", r.stdout, re.M)
            out["active"] = m.group(1) if m else "loaded"
        else:
            out["active"] = "not loaded"
            out["detail"] = r.stderr.strip() or None
    return out
