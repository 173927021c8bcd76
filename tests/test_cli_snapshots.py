"""Snapshots of every command's ``--help`` and of the tables at 80 columns (issue 15, item 8).

Deterministic: a fixed width (COLUMNS=80 and click's terminal_width), no colours (NO_COLOR,
TERM=dumb, output to a pipe), a fixed "now" (BGCTL_NOW), and a home built from the golden event
logs (their own ids, times and paths).  The snapshots are files in tests/snapshots/; after an
intended change, regenerate them with

    BGCTL_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest -q tests/test_cli_snapshots.py

and review the diff.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from batchgrader.cli.commands import cli
from batchgrader.core.host.home import Home
from cli_fixtures import busy_home, check_snapshot, golden_home, run

ESSAYS = "id,response\n" + "".join(f"{i},essay number {i} about the sea and the sky\n" for i in range(7))


def _commands(group, prefix=()):
    yield prefix
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


COMMANDS = list(_commands(cli))


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "bgctl" for p in COMMANDS])
def test_help_snapshot(path: tuple[str, ...]) -> None:
    res = run(*path, "--help")
    assert res.exit_code == 0, res.output
    check_snapshot(f"help/{'_'.join(path) or 'bgctl'}.txt", res.output)


TABLES = {
    "status": ["status"],
    "status_all": ["status", "--all"],
    "status_job": ["status", "32c86eafae56"],
    "status_held_job": ["status", "194352796bbb-3"],
    "events": ["events", "--last", "12"],
    "events_job": ["events", "x-52fbb30faf37"],
    "costs": ["costs"],
    "costs_by_job": ["costs", "--by", "job"],
    "costs_by_model": ["costs", "--by", "model"],
}


@pytest.mark.parametrize("name", sorted(TABLES))
@pytest.mark.parametrize("columns", [80, 120])
def test_table_at_80_and_120_columns(home: Home, name: str, columns: int) -> None:
    golden_home(home)
    res = run(*TABLES[name], columns=columns)
    assert res.exit_code == 0, res.output
    check_snapshot(f"{columns}col/{name}.txt", res.output)
    # ids, states and counts stay whole: nothing in a table row is cut with an ellipsis
    assert "…" not in res.output


BUSY_TABLES = {"status": ["status"], "costs_by_job": ["costs", "--by", "job"], "costs_by_model": ["costs", "--by", "model"]}


@pytest.mark.parametrize("name", sorted(BUSY_TABLES))
@pytest.mark.parametrize("columns", [80, 100, 120])
def test_busy_tables_keep_ids_states_counts_and_amounts_whole(home: Home, name: str, columns: int) -> None:
    """A profile, token counts in the millions and costs in dollars (issue 27, item 6): other
    columns give way, and what is shown is whole and fits the width."""
    busy_home(home)
    res = run(*BUSY_TABLES[name], columns=columns)
    assert res.exit_code == 0, res.output
    check_snapshot(f"{columns}col/busy_{name}.txt", res.output)
    table = res.output.split("\n\n")[0] if name == "status" else res.output
    assert "…" not in res.output
    if name == "status":
        wholes = ["completed_with_errors", "194352796bbb-4", "$53.7963", "$39.9074", "5 ok/7", "2 failed"]
    else:
        wholes = ["115,555,752", "40,370,439", "$167.8702", "$39.9074"]
        wholes += ["194352796bbb-4", "$53.7963"] if name == "costs_by_job" else ["gpt-5.4-mini"]
    for whole in wholes:
        assert whole in res.output
    rows = [ln for ln in table.splitlines() if ln.startswith(" ")]
    assert all(len(ln) <= columns for ln in rows), rows


def test_count_at_80_columns(home: Home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the title names the file as given: a relative name is the same every run
    Path("essays.csv").write_text(ESSAYS)
    res = run("count", "essays.csv")
    assert res.exit_code == 0, res.output
    check_snapshot("80col/count.txt", res.output)
    home.config_file.write_text(
        "response_format:\n  type: object\n  properties:\n    score: {type: integer}\n  required: [score]\n"
        "  additionalProperties: false\n"
    )
    res = run("count", "essays.csv")
    assert res.exit_code == 0, res.output
    check_snapshot("80col/count_schema.txt", res.output)


def _fixed_length_home() -> tuple[Home, str]:
    """A home whose path always has the same length (mkdtemp's suffix is 8 characters), so that
    replacing it with a placeholder of that length keeps the wrapping identical."""
    root = Path(tempfile.mkdtemp(prefix="bgsnap-", dir="/tmp"))
    return Home.resolve(root / "h").ensure(), str(root)


def test_doctor_and_config_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    home, root = _fixed_length_home()
    try:
        monkeypatch.setenv("BATCHGRADER_HOME", str(home.root))
        placeholder = "/tmp/bgsnap-XXXXXXXX"
        assert len(placeholder) == len(root)
        res = run("doctor", "--sandbox")
        text = res.output.replace(root, placeholder)
        # the daemon/service lines depend on the machine (systemd or not): keep the rest
        lines = [
            ln for ln in text.splitlines() if not ln.startswith(("✓ daemon", "! daemon", "✗ daemon", "    fix: bgctl service"))
        ]
        check_snapshot("80col/doctor_sandbox.txt", "\n".join(lines[:14]) + "\n")
        assert "✗" not in "\n".join(lines[:14])
        res = run("doctor")
        assert res.exit_code == 1
        assert "✗ api key: no API key" in res.output
        fix = [ln for ln in res.output.splitlines() if ln.startswith("    fix: export OPENAI_API_KEY")]
        assert len(fix) == 1 and fix[0].endswith("bgctl daemon --sandbox")  # a command to paste: one line
        res = run("config", "show")
        assert res.exit_code == 0
        check_snapshot("80col/config_show.txt", res.output.replace(root, placeholder))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_models_at_80_columns(home) -> None:  # noqa: ANN001
    res = run("models", "--provider", "anthropic")
    assert res.exit_code == 0, res.output
    check_snapshot("80col/models_anthropic.txt", res.output)


def test_watch_screen_fits_the_terminal_newest_and_active_first(home: Home) -> None:
    """`status --watch` with more jobs than the screen holds (issue 27, item 6): the header stays,
    unfinished jobs come first, then the newest finished, and a "+N more" line counts the rest."""
    from rich.console import Console

    from batchgrader.cli.render_watch import screen_rows, watch_screen
    from batchgrader.store import queries

    golden_home(home)
    overview = queries.status_overview(home, now=0.0)
    jobs = overview["jobs"]
    many = [dict(j, job_id=f"{j['job_id']}-{k}", created_ts=f"{j['created_ts']}{k:03d}") for k in range(4) for j in jobs]
    overview = {**overview, "jobs": many}
    console = Console(width=80, height=24, color_system=None, force_terminal=False)
    screen = watch_screen(overview, [], {"running": True, "pid": 1}, console, height=24)
    assert screen_rows(screen, 80) <= 24
    lines = screen.splitlines()
    assert lines[0].startswith("BatchGrader jobs") and "state" in lines[2]
    listed = [m.group(1) for ln in lines if (m := re.match(r" ((?:x-)?[0-9a-f]{12}[-0-9]*) ", ln))]
    assert listed[0] == "194352796bbb-3-3"  # the one held (unfinished) job, newest copy first
    assert listed[1] == "194352796bbb-3-2"
    more = [ln for ln in lines if ln.startswith("+")]
    assert more and more[0].startswith(f"+{len(many) - len(listed)} more jobs")
