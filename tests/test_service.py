"""Service installation: unit/plist rendering, the 0600 secrets file, install/uninstall/status."""

from __future__ import annotations

import json
import os
import plistlib
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from batchgrader.core.host.secrets import (
    EnvFileError,
    apply_env_file,
    env_file_path,
    load_env_file,
    parse_env_text,
    write_env_file,
)
from batchgrader.ops import service
from batchgrader.ops.service import (
    CommandResult,
    ServiceError,
    install,
    render_launchd_plist,
    render_systemd_unit,
    status,
    uninstall,
)

KEY = "sk-test-Secret0123456789abcdef"
ME = pwd.getpwuid(os.geteuid()).pw_name


def directives(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every non-comment line, in order."""
    out, section = [], None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key, value))
    return out


@pytest.fixture
def odd_dir(tmp_path: Path) -> Path:
    """A directory whose name needs systemd quoting and escaping: space, %, $ (systemd
    refuses quotes and backslashes in the executable's own path; see below)."""
    d = tmp_path / "my dir %h $HOME"
    d.mkdir()
    return d


@pytest.fixture
def fake_bgctl(odd_dir: Path) -> Path:
    exe = odd_dir / "bin dir" / "bgctl"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


@pytest.fixture
def odd_home(odd_dir: Path) -> Home:
    return Home.resolve(odd_dir / 'state "root" it\'s \\ x').ensure()


class FakeRunner:
    def __init__(self, replies: dict[str, tuple[int, str, str]] | None = None):
        self.replies = replies or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        rc, out, err = self.replies.get(" ".join(argv), (0, "", ""))
        return CommandResult(list(argv), rc, out, err)


def all_text_under(root: Path, skip: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p != skip)


# --- the systemd unit --------------------------------------------------------------------


def test_system_unit_line_by_line(home: Home):
    env_file = env_file_path(home)
    text = render_systemd_unit(home, "/opt/bg/bin/bgctl", False, env_file, user="alice", group="staff")
    assert directives(text) == [
        ("Unit", "Description", "BatchGrader daemon (grades inbox files with LLM batch jobs)"),
        ("Unit", "After", "network-online.target"),
        ("Unit", "Wants", "network-online.target"),
        ("Service", "Type", "notify"),
        ("Service", "NotifyAccess", "main"),
        ("Service", "ExecStart", f"/opt/bg/bin/bgctl --home {home.root} daemon"),
        ("Service", "EnvironmentFile", f"-{home.root}/secrets.env"),
        ("Service", "Environment", "PYTHONUNBUFFERED=1"),
        ("Service", "WatchdogSec", "60"),
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartPreventExitStatus", "78"),
        ("Service", "RestartSec", "10"),
        ("Service", "TimeoutStopSec", "90"),
        ("Service", "User", "alice"),
        ("Service", "Group", "staff"),
        ("Service", "UMask", "0077"),
        ("Service", "NoNewPrivileges", "yes"),
        ("Service", "ProtectSystem", "strict"),
        ("Service", "ProtectHome", "read-only"),
        ("Service", "ReadWritePaths", str(home.root)),
        ("Service", "PrivateTmp", "yes"),
        ("Install", "WantedBy", "multi-user.target"),
    ]
    assert "OPENAI_API_KEY=" not in text and "sk-" not in text


def test_system_unit_defaults_to_invoking_user(home: Home):
    text = render_systemd_unit(home, "/opt/bg/bin/bgctl", False, env_file_path(home))
    d = {k: v for _, k, v in directives(text)}
    assert d["User"] == ((os.geteuid() == 0 and os.environ.get("SUDO_USER")) or ME)  # the sudo caller


def test_user_unit_line_by_line_and_documents_missing_sandbox(home: Home):
    text = render_systemd_unit(home, "/opt/bg/bin/bgctl", True, env_file_path(home))
    assert directives(text) == [
        ("Unit", "Description", "BatchGrader daemon (grades inbox files with LLM batch jobs)"),
        ("Service", "Type", "notify"),
        ("Service", "NotifyAccess", "main"),
        ("Service", "ExecStart", f"/opt/bg/bin/bgctl --home {home.root} daemon"),
        ("Service", "EnvironmentFile", f"-{home.root}/secrets.env"),
        ("Service", "Environment", "PYTHONUNBUFFERED=1"),
        ("Service", "WatchdogSec", "60"),
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartPreventExitStatus", "78"),
        ("Service", "RestartSec", "10"),
        ("Service", "TimeoutStopSec", "90"),
        ("Service", "UMask", "0077"),
        ("Service", "NoNewPrivileges", "yes"),
        ("Install", "WantedBy", "default.target"),
    ]
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for word in ("ProtectSystem=", "ReadWritePaths=", "PrivateUsers=", "226/NAMESPACE", "network-online.target"):
        assert word in comments


def test_paths_with_spaces_percent_dollar_quotes(odd_home: Home, fake_bgctl: Path):
    text = render_systemd_unit(odd_home, str(fake_bgctl), False, env_file_path(odd_home), user="a", group="a")
    d = {k: v for _, k, v in directives(text)}
    exe = str(fake_bgctl).replace("%", "%%")  # argv[0]: no $ expansion
    root_arg = str(odd_home.root).replace("%", "%%").replace("$", "$$").replace("\\", "\\\\").replace('"', '\\"')
    assert d["ExecStart"] == f'"{exe}" --home "{root_arg}" daemon'
    rw = str(odd_home.root).replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    assert d["ReadWritePaths"] == f'"{rw}"'
    # EnvironmentFile= is not unquoted by systemd: raw path, % doubled, glob chars escaped
    assert d["EnvironmentFile"] == "-" + str(env_file_path(odd_home)).replace("%", "%%").replace("\\", "\\\\")


def test_env_file_glob_characters_are_escaped(tmp_path: Path):
    h = Home.resolve(tmp_path / "a[1]*?")
    text = render_systemd_unit(h, "/bin/true", True, env_file_path(h))
    d = {k: v for _, k, v in directives(text)}
    assert d["EnvironmentFile"].endswith(r"/a\[1]\*\?/secrets.env")


def test_refuses_paths_a_unit_cannot_express(tmp_path: Path):
    h = Home.resolve(tmp_path / "new\nline")
    with pytest.raises(ServiceError, match="newline or control"):
        render_systemd_unit(h, "/bin/true", True, env_file_path(h))
    with pytest.raises(ServiceError, match="newline or control"):
        render_launchd_plist(h, "/bin/true")
    with pytest.raises(ServiceError, match="absolute"):
        render_systemd_unit(Home.resolve(tmp_path), "./bgctl", True, tmp_path / "e")
    for bad in ("/opt/o'brien/bgctl", '/opt/"q"/bgctl', "/opt/back\\slash/bgctl"):
        with pytest.raises(ServiceError, match="quote or a backslash"):
            render_systemd_unit(Home.resolve(tmp_path), bad, True, tmp_path / "e")
        assert render_launchd_plist(Home.resolve(tmp_path), bad)  # launchd has no such rule


def _verify(unit_text: str, where: Path, user: bool) -> subprocess.CompletedProcess:
    where.mkdir(parents=True, exist_ok=True)
    unit = where / "batchgrader.service"
    unit.write_text(unit_text)
    env = dict(os.environ)
    argv = ["systemd-analyze"]
    if user:
        runtime = where / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        argv.append("--user")
    return subprocess.run([*argv, "verify", str(unit)], capture_output=True, text=True, env=env, timeout=60)


def _complaints(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if "batchgrader.service" in ln]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("user_mode", [False, True], ids=["system", "user"])
def test_systemd_analyze_verify(odd_home: Home, fake_bgctl: Path, tmp_path: Path, user_mode: bool):
    """Real systemd parsing: quoted ExecStart with spaces, %% and quotes must reach the binary;
    no unknown keys or unparseable values (verify only warns about those, so check output)."""
    text = render_systemd_unit(odd_home, str(fake_bgctl), user_mode, env_file_path(odd_home))
    proc = _verify(text, tmp_path / "verify", user_mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _complaints(proc) == []
    # control: the same check fails when ExecStart's binary is missing
    broken = render_systemd_unit(odd_home, str(fake_bgctl) + "-missing", user_mode, env_file_path(odd_home))
    proc = _verify(broken, tmp_path / "verify-broken", user_mode)
    assert proc.returncode != 0 and "is not executable" in proc.stdout + proc.stderr


# --- the launchd plist -------------------------------------------------------------------


def test_launchd_plist_keys(odd_home: Home, fake_bgctl: Path):
    p = plistlib.loads(render_launchd_plist(odd_home, str(fake_bgctl)).encode())
    assert p == {
        "Label": "com.batchgrader.daemon",
        "ProgramArguments": [str(fake_bgctl), "--home", str(odd_home.root), "daemon"],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "WorkingDirectory": str(odd_home.root),
        "StandardOutPath": str(odd_home.logs / "launchd.out.log"),
        "StandardErrorPath": str(odd_home.logs / "launchd.err.log"),
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "Umask": 63,
        "ProcessType": "Background",
        "ExitTimeOut": 90,
    }
    assert render_launchd_plist(odd_home, str(fake_bgctl), label="x.y")
    assert plistlib.loads(render_launchd_plist(odd_home, str(fake_bgctl), label="x.y").encode())["Label"] == "x.y"


def test_launchd_plist_python_m_fallback(home: Home):
    p = plistlib.loads(render_launchd_plist(home, [sys.executable, "-m", "batchgrader"]).encode())
    assert p["ProgramArguments"] == [sys.executable, "-m", "batchgrader", "--home", str(home.root), "daemon"]


# --- install / uninstall / status --------------------------------------------------------


def test_install_user_unit_and_key(home: Home, fake_bgctl: Path, tmp_path: Path):
    units = tmp_path / "units"
    r = install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=units)
    unit = units / "batchgrader.service"
    assert r.written and r.path == unit and unit.read_text() == r.content
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert KEY not in r.content and "OPENAI_API_KEY" not in {k for _, k, _ in directives(r.content)}
    env_file = env_file_path(home)
    assert r.env_file == env_file and r.env_file_written
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert f"OPENAI_API_KEY={KEY}" in env_file.read_text().splitlines()
    assert load_env_file(env_file) == {"OPENAI_API_KEY": KEY}
    assert r.next_steps == ["systemctl --user daemon-reload", "systemctl --user enable --now batchgrader.service"]
    assert any("loginctl enable-linger" in n for n in r.notes)
    assert KEY not in json.dumps(r.to_dict()) and KEY not in repr(r)
    assert KEY not in all_text_under(tmp_path, skip=env_file)  # nowhere but the env file
    assert not list(units.glob(".*.tmp")) and not list(home.root.glob(".*.tmp"))


def test_install_print_only_touches_nothing(tmp_path: Path, fake_bgctl: Path):
    h = Home.resolve(tmp_path / "fresh")
    units = tmp_path / "units"
    r = install(h, "user", print_only=True, platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=units)
    assert not r.written and not r.env_file_written
    assert "[Service]" in r.content and KEY not in r.content
    assert not units.exists() and not h.root.exists()
    assert any("API key was not written" in n for n in r.notes)


def test_install_creates_missing_home_and_notes_missing_key(tmp_path: Path, fake_bgctl: Path):
    h = Home.resolve(tmp_path / "fresh")
    r = install(h, "user", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=tmp_path / "u")
    assert all(d.is_dir() for d in h.dirs())
    assert not r.env_file_written and not env_file_path(h).exists()
    assert any("No API key stored" in n for n in r.notes)


def test_reinstall_keeps_other_env_lines_and_restarts(home: Home, fake_bgctl: Path, tmp_path: Path):
    env_file = env_file_path(home)
    env_file.write_text("# mine\nOPENAI_BASE_URL=http://localhost:8080/v1\nOPENAI_API_KEY=old\nOPENAI_API_KEY=older\n")
    env_file.chmod(0o644)  # too open: rewriting fixes it
    units = tmp_path / "units"
    install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=units)
    r = install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=units)
    assert env_file.read_text().splitlines() == ["# mine", "OPENAI_BASE_URL=http://localhost:8080/v1", f"OPENAI_API_KEY={KEY}"]
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert r.next_steps[-1] == "systemctl --user restart batchgrader.service"


def test_install_system_unit(home: Home, fake_bgctl: Path, tmp_path: Path):
    r = install(home, "system", platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=tmp_path / "sys", run_as=ME)
    d = {k: v for _, k, v in directives(r.content)}
    assert d["User"] == ME and d["WantedBy"] == "multi-user.target" and d["ProtectHome"] == "read-only"
    assert r.next_steps == ["systemctl daemon-reload", "systemctl enable --now batchgrader.service"]
    assert env_file_path(home).stat().st_uid == os.geteuid()


def test_install_system_refuses_someone_elses_home(home: Home, fake_bgctl: Path, tmp_path: Path):
    other = "nobody" if os.geteuid() == 0 else "root"
    try:
        pwd.getpwnam(other)
    except KeyError:
        pytest.skip(f"no {other} account")
    with pytest.raises(ServiceError, match="owned by uid"):
        install(home, "system", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=tmp_path / "s", run_as=other)
    assert not (tmp_path / "s").exists()


def test_install_launchd(home: Home, fake_bgctl: Path, tmp_path: Path):
    agents = tmp_path / "LaunchAgents"
    r = install(home, "user", platform="darwin", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=agents)
    plist = agents / "com.batchgrader.daemon.plist"
    assert r.manager == "launchd" and r.path == plist
    p = plistlib.loads(plist.read_bytes())
    assert p["ProgramArguments"][0] == str(fake_bgctl) and KEY not in plist.read_text()
    assert load_env_file(env_file_path(home))["OPENAI_API_KEY"] == KEY
    uid = os.getuid()
    assert [s.argv for s in r.steps] == [
        ["launchctl", "bootout", f"gui/{uid}/com.batchgrader.daemon"],
        ["launchctl", "bootstrap", f"gui/{uid}", str(plist)],
    ]
    assert r.steps[0].optional and not r.steps[1].optional
    with pytest.raises(ServiceError, match="--user"):
        install(home, "system", platform="darwin", bgctl_path=str(fake_bgctl), unit_dir=agents)


@pytest.mark.parametrize("platform", ["win32", "cygwin", "freebsd14"])
def test_unsupported_platform(home: Home, platform: str):
    with pytest.raises(ServiceError, match="Linux"):
        install(home, "user", platform=platform, bgctl_path="/bin/true")


def test_bad_mode(home: Home):
    with pytest.raises(ServiceError, match="mode"):
        install(home, "global", platform="linux", bgctl_path="/bin/true")


def test_activate_runs_the_steps(home: Home, fake_bgctl: Path, tmp_path: Path):
    ok = FakeRunner()
    r = install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=tmp_path / "u", activate=True, runner=ok)
    assert ok.calls == [s.argv for s in r.steps] and all(c.ok for c in r.activation)
    failing = FakeRunner({"systemctl --user daemon-reload": (1, "", "Failed to connect to bus")})
    r = install(
        home, "user", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=tmp_path / "u", activate=True, runner=failing
    )
    assert len(failing.calls) == 1 and r.activation[0].stderr == "Failed to connect to bus"
    assert r.to_dict()["activation"][0]["returncode"] == 1


def test_uninstall_leaves_key_and_home(home: Home, fake_bgctl: Path, tmp_path: Path):
    units = tmp_path / "units"
    install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=units)
    (home.inbox / "todo.csv").write_text("a\n1\n")
    wants = units / "default.target.wants"
    wants.mkdir()
    (wants / "batchgrader.service").symlink_to(units / "batchgrader.service")
    (wants / "other.service").symlink_to(units / "other.service")
    r = uninstall(home, "user", platform="linux", unit_dir=units)
    assert r.removed and not (units / "batchgrader.service").exists()
    assert r.removed_links == [wants / "batchgrader.service"] and (wants / "other.service").is_symlink()
    assert load_env_file(env_file_path(home)) == {"OPENAI_API_KEY": KEY}
    assert (home.inbox / "todo.csv").exists()
    assert any("Left untouched" in n and str(env_file_path(home)) in n for n in r.notes)
    assert r.next_steps[0].startswith("systemctl --user stop batchgrader.service")
    again = uninstall(home, "user", platform="linux", unit_dir=units)
    assert not again.removed and any("nothing installed" in n for n in again.notes)


def test_uninstall_activate_stops_first(home: Home, fake_bgctl: Path, tmp_path: Path):
    units = tmp_path / "units"
    install(home, "system", platform="linux", bgctl_path=str(fake_bgctl), unit_dir=units, run_as=ME)
    runner = FakeRunner()
    r = uninstall(home, "system", platform="linux", unit_dir=units, activate=True, runner=runner)
    assert runner.calls == [["systemctl", "disable", "--now", "batchgrader.service"], ["systemctl", "daemon-reload"]]
    assert r.removed and r.next_steps == []


def test_uninstall_launchd(home: Home, fake_bgctl: Path, tmp_path: Path):
    agents = tmp_path / "LaunchAgents"
    install(home, "user", platform="darwin", bgctl_path=str(fake_bgctl), unit_dir=agents)
    r = uninstall(home, "user", platform="darwin", unit_dir=agents)
    assert r.removed and not any(agents.iterdir())
    assert r.steps[0].argv == ["launchctl", "bootout", f"gui/{os.getuid()}/com.batchgrader.daemon"]


def test_status(home: Home, fake_bgctl: Path, tmp_path: Path):
    units = tmp_path / "units"
    s = status(home, "user", platform="linux", unit_dir=units, which=lambda _: None)
    assert s["installed"] is False and s["active"] is None and s["detail"] == "systemctl not found"
    install(home, "user", platform="linux", bgctl_path=str(fake_bgctl), api_key=KEY, unit_dir=units)
    runner = FakeRunner({"systemctl --user is-active batchgrader.service": (0, "active\n", "")})
    s = status(home, "user", platform="linux", unit_dir=units, runner=runner, which=lambda _: "/usr/bin/systemctl")
    assert s["installed"] and s["active"] == "active" and s["path"] == str(units / "batchgrader.service")
    assert s["env_file_present"] and s["env_file_mode"] == "0600"
    nobus = FakeRunner({"systemctl --user is-active batchgrader.service": (1, "", "Failed to connect to bus\n")})
    s = status(home, "user", platform="linux", unit_dir=units, runner=nobus, which=lambda _: "x")
    assert s["active"] is None and s["detail"] == "Failed to connect to bus"
    assert KEY not in json.dumps(s)


def test_status_launchd(home: Home, tmp_path: Path):
    loaded = FakeRunner({f"launchctl print gui/{os.getuid()}/com.batchgrader.daemon": (0, "{\n\tstate = running\n}", "")})
    s = status(home, None, platform="darwin", unit_dir=tmp_path, runner=loaded, which=lambda _: "x")
    assert s["mode"] == "user" and s["active"] == "running"
    s = status(
        home,
        None,
        platform="darwin",
        unit_dir=tmp_path,
        runner=FakeRunner({f"launchctl print gui/{os.getuid()}/com.batchgrader.daemon": (113, "", "Could not find service")}),
        which=lambda _: "x",
    )
    assert s["active"] == "not loaded"


def test_status_real_systemctl_does_not_crash(home: Home, tmp_path: Path):
    s = status(home, "user", platform="linux", unit_dir=tmp_path)
    assert set(s) >= {"installed", "path", "active", "detail"}


def test_bgctl_path_resolution(home: Home, tmp_path: Path):
    venv_bgctl = Path(sys.executable).parent / "bgctl"
    if venv_bgctl.exists():
        assert service.default_bgctl_command() == [str(venv_bgctl)]
    assert service.daemon_argv(home, "sh")[0] == shutil.which("sh")
    with pytest.raises(ServiceError, match="absolute"):
        service.daemon_argv(home, "bin/bgctl")
    with pytest.raises(ServiceError, match="not found on PATH"):
        service.daemon_argv(home, "no-such-bgctl-anywhere")
    r = install(home, "user", print_only=True, platform="linux", bgctl_path=str(tmp_path / "nope"))
    assert any("not an executable" in w for w in r.warnings)


# --- the secrets file --------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o601])
def test_load_refuses_open_permissions(tmp_path: Path, mode: int):
    f = tmp_path / "secrets.env"
    f.write_text(f"OPENAI_API_KEY={KEY}\n")
    f.chmod(mode)
    with pytest.raises(EnvFileError, match="too open") as exc:
        load_env_file(f)
    assert f"chmod 600 {f}" in str(exc.value) and KEY not in str(exc.value)
    with pytest.raises(EnvFileError):
        apply_env_file(f, {"OPENAI_API_KEY": "already-set"})  # checked even when not needed


def test_load_refuses_fifo_without_blocking(tmp_path: Path):
    f = tmp_path / "fifo"
    os.mkfifo(f, 0o600)
    with pytest.raises(EnvFileError, match="not a regular file"):
        load_env_file(f)


def test_apply_env_file_fills_only_unset(tmp_path: Path):
    f = write_env_file(tmp_path / "secrets.env", {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://x"})
    env = {"OPENAI_BASE_URL": "http://mine", "OTHER": "1"}
    assert apply_env_file(f, env) == ["OPENAI_API_KEY"]
    assert env == {"OPENAI_BASE_URL": "http://mine", "OTHER": "1", "OPENAI_API_KEY": KEY}
    assert apply_env_file(f, {"OPENAI_API_KEY": ""}) == ["OPENAI_API_KEY", "OPENAI_BASE_URL"]  # empty = unset
    assert apply_env_file(tmp_path / "absent.env", env) == []


def test_parse_env_text_systemd_subset():
    text = "\n".join(
        [
            "# comment",
            "; comment",
            "",
            "no equals sign",
            "bad-name=1",
            "export X=1",
            "PLAIN = value with  inner space  ",
            "SINGLE='a \\n $b \"c\"'",
            'DOUBLE="a \\"q\\" \\\\ \\$ \\n"',
            "BACKSLASH=a\\ b\\\\c",
            "EQ=a=b=c",
            "HASH=x # not a comment",
        ]
    )
    assert parse_env_text(text) == {
        "PLAIN": "value with  inner space",
        "SINGLE": 'a \\n $b "c"',
        "DOUBLE": 'a "q" \\ $ \\n',
        "BACKSLASH": "a b\\c",
        "EQ": "a=b=c",
        "HASH": "x # not a comment",
    }
    for bad in ["A='open", 'A="open', "A=continued\\", "A='x' y"]:
        with pytest.raises(EnvFileError):
            parse_env_text(bad)


@pytest.mark.parametrize("key", ["sk-proj-AbC_123", "abc+/==", 'we!rd$`\\"key'])
def test_env_file_roundtrip_of_odd_keys(tmp_path: Path, key: str):
    f = write_env_file(tmp_path / "s.env", {"OPENAI_API_KEY": key})
    assert load_env_file(f)["OPENAI_API_KEY"] == key


@pytest.mark.parametrize("key", ["", "sk-abc def", "sk-abc\n", "it's\\odd"])
def test_env_file_refuses_unstorable_keys_without_echoing_them(tmp_path: Path, key: str):
    with pytest.raises(EnvFileError) as exc:
        write_env_file(tmp_path / "s.env", {"OPENAI_API_KEY": key})
    assert not key or key not in str(exc.value)
    assert not (tmp_path / "s.env").exists()


def test_env_file_refuses_symlink(tmp_path: Path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "s.env").symlink_to(target)
    with pytest.raises(EnvFileError, match="symlink"):
        write_env_file(tmp_path / "s.env", {"OPENAI_API_KEY": KEY})
    assert target.read_text() == ""
