"""Issue 35, item 4: the stumbles of a first run, each told in words (an encoding that is not
the file's, a workbook's other sheet, empty answer cells, a finished sandbox run, the service's
status, an empty database, a report's name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from batchgrader.pipeline.tables import open_table
from cli_fixtures import run
from harness import FAST_CONFIG, bgctl

# --- submit refuses what count and the daemon refuse ------------------------------------------------


@pytest.mark.parametrize(
    ("config", "code", "says"),
    [
        ("model: gpt-5.4-minii\n", 78, ["no price for model 'gpt-5.4-minii'", "Did you mean 'gpt-5.4-mini'"]),
        ("reference_column: lable\n", 2, ["'reference_column' is 'lable'", "did you mean 'label'"]),
        (
            "provider: anthropic\nmodel: claude-haiku-4-5\ntemperature: 0.5\n",
            78,
            ["'temperature'", "2026-10-21"],
        ),
    ],
)
def test_submit_refuses_a_file_the_daemon_would_refuse_and_queues_nothing(home: Home, tmp_path: Path, config, code, says) -> None:
    """Issue 35: `submit` printed "queued" and exited 0 for a model typo or a label-column typo
    that the daemon then refused (after a preflight, for the label)."""
    home.config_file.write_text(config)
    data = tmp_path / "a.csv"
    data.write_text("id,response,label\n1,good,5\n2,bad,1\n")
    res = run("submit", str(data))
    assert res.exit_code == code, res.output
    assert all(s in res.output for s in says), res.output
    assert list(home.inbox.iterdir()) == []


# --- a. a standing `encoding: latin-1` never turns a UTF-8 file into mojibake ----------------------


def test_a_utf8_file_is_read_as_utf8_whatever_the_configured_encoding(tmp_path: Path) -> None:
    utf8 = tmp_path / "utf8.csv"
    utf8.write_bytes("id,response\n1,café crème\n".encode())
    with open_table(utf8, encoding="latin-1") as r:
        assert [row.values["response"] for row in r] == ["café crème"] and r.encoding == "utf-8"
    latin = tmp_path / "latin.csv"
    latin.write_bytes("id,response\n1,café crème\n".encode("latin-1"))
    with open_table(latin, encoding="latin-1") as r:  # the configured encoding: where the file is not UTF-8
        assert [row.values["response"] for row in r] == ["café crème"] and r.encoding == "iso8859-1"
    jsonl = tmp_path / "utf8.jsonl"
    jsonl.write_bytes('{"response": "naïve"}\n'.encode())
    with open_table(jsonl, encoding="cp1252") as r:
        assert [row.values["response"] for row in r] == ["naïve"] and r.encoding == "utf-8"


def test_count_and_split_read_a_utf8_file_as_utf8_and_say_which_encoding(home: Home, tmp_path: Path) -> None:
    home.config_file.write_text("encoding: latin-1\n")
    utf8 = tmp_path / "answers.csv"
    utf8.write_bytes("id,response\n1,café crème\n".encode())
    summary = json.loads(run("count", str(utf8), "--json").output)
    assert summary["text_encoding"] == "utf-8"
    assert "file encoding" in run("count", str(utf8), columns=120).output
    out = tmp_path / "split"
    assert run("split", str(utf8), "--out", str(out)).exit_code == 0
    sent = "".join(p.read_text(encoding="utf-8") for p in sorted(out.glob("*.jsonl")))
    assert "café crème" in json.loads(sent.splitlines()[0])["body"]["messages"][-1]["content"] and "Ã" not in sent
    latin = tmp_path / "latin.csv"
    latin.write_bytes("id,response\n1,café crème\n".encode("latin-1"))
    assert json.loads(run("count", str(latin), "--json").output)["text_encoding"] == "iso8859-1"


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_a_jobs_status_says_which_encoding_its_file_was_read_in(home: Home) -> None:
    home.config_file.write_text(FAST_CONFIG + "encoding: latin-1\n")
    (home.inbox / "utf8.csv").write_bytes("id,response\n1,café crème\n".encode())
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    (job,) = json.loads(bgctl(home.root, "status", "--json").stdout)
    detail = json.loads(bgctl(home.root, "status", job["job_id"], "--json").stdout)
    assert detail["text_encoding"] == "utf-8"
    assert "file encoding" in bgctl(home.root, "status", job["job_id"]).stdout
    result = next(home.outbox.glob("utf8_results*.csv")).read_text(encoding="utf-8-sig")
    assert "café crème" in result and "Ã" not in result


# --- b. a workbook with its data on another sheet names the sheet and the `sheet` key ---------------


def _workbook(path: Path, sheets: dict[str, list[list[object]]]) -> Path:
    import openpyxl

    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for title, rows in sheets.items():
        ws = wb.create_sheet(title)
        for r in rows:
            ws.append(r)
    wb.save(path)
    return path


def test_a_workbook_with_its_data_on_the_second_sheet_names_that_sheet_and_the_key(home: Home, tmp_path: Path) -> None:
    book = _workbook(
        tmp_path / "answers.xlsx",
        {"Notes": [["read me first"], ["graded by the team"]], "Answers 2026": [["id", "response"], [1, "a fine answer"]]},
    )
    res = run("count", str(book), columns=400)
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "'Answers 2026'" in out and "`sheet: Answers 2026`" in out and "rename the column" not in out
    home.config_file.write_text("sheet: Answers 2026\n")  # the advice works
    assert run("count", str(book)).exit_code == 0


def test_a_workbook_without_the_columns_anywhere_names_its_other_sheets(home: Home, tmp_path: Path) -> None:
    book = _workbook(tmp_path / "answers.xlsx", {"First": [["id", "answer"], [1, "x"]], "Second": [["id", "note"], [1, "y"]]})
    out = " ".join(run("count", str(book), columns=400).output.split())
    assert "`response_field`" in out and "'Second'" in out and "`sheet` key" in out


# --- c. rows with an empty answer cell are counted, and `skip_empty` leaves them unpaid -------------

EMPTY_ROWS = "id,response\n1,a fine answer\n2,\n3,   \n4,another answer\n"


def test_count_says_how_many_rows_have_an_empty_graded_column(home: Home, tmp_path: Path) -> None:
    f = tmp_path / "answers.csv"
    f.write_text(EMPTY_ROWS)
    res = run("count", str(f), "--json")
    summary = json.loads(res.output)
    assert res.exit_code == 0 and summary["empty_rows"] == 2 and summary["requests"] == 4
    out = " ".join(run("count", str(f), columns=200).output.split())
    assert "2 row(s) have an empty `response`" in out and "skip_empty: true" in out
    home.config_file.write_text("skip_empty: true\n")
    res = run("count", str(f), "--json")
    summary = json.loads(res.output)
    assert res.exit_code == 0, res.output  # left out by choice: not "rows that can never be sent"
    assert summary["empty_rows"] == 2 and summary["requests"] == 2
    assert sorted((e["row"], e["code"]) for e in summary["row_errors"]) == [(2, "empty_input"), (3, "empty_input")]
    out = tmp_path / "split"
    assert run("split", str(f), "--out", str(out)).exit_code == 0
    sent = [json.loads(line) for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert len(sent) == 2 and all("answer" in r["body"]["messages"][-1]["content"] for r in sent)


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_skip_empty_leaves_empty_rows_ungraded_and_unbilled(home: Home) -> None:
    home.config_file.write_text(FAST_CONFIG + "skip_empty: true\n")
    (home.inbox / "answers.csv").write_text(EMPTY_ROWS)
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    (job,) = json.loads(bgctl(home.root, "status", "--json").stdout)
    detail = json.loads(bgctl(home.root, "status", job["job_id"], "--json").stdout)
    assert detail["empty_rows"] == 2 and detail["succeeded"] == 2 and detail["failed"] == 2
    assert sum(c["requests"] for c in detail["chunks"]) == 2  # only the two answers were sent
    assert "empty graded column" in bgctl(home.root, "status", job["job_id"]).stdout
    import csv

    rows = list(csv.DictReader(next(home.outbox.glob("answers_results*.csv")).open(encoding="utf-8-sig")))
    assert [r["error"].split(":")[0] for r in rows] == ["", "empty_input", "empty_input", ""]
    assert [r["answered_by"] for r in rows][0] and not rows[1]["grade"]


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_without_skip_empty_status_says_the_empty_rows_were_sent(home: Home) -> None:
    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / "answers.csv").write_text(EMPTY_ROWS)
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    (job,) = json.loads(bgctl(home.root, "status", "--json").stdout)
    detail = json.loads(bgctl(home.root, "status", job["job_id"], "--json").stdout)
    assert detail["empty_rows"] == 2 and detail["succeeded"] == 4
    assert "sent and billed" in " ".join(bgctl(home.root, "status", job["job_id"]).stdout.split())


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_skip_empty_takes_no_stored_answer_for_an_empty_row(home: Home) -> None:
    import csv

    home.config_file.write_text(FAST_CONFIG)  # the first run sends the empty rows: their answer is stored
    (home.inbox / "answers.csv").write_text(EMPTY_ROWS)
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    home.config_file.write_text(FAST_CONFIG + "skip_empty: true\n")
    (home.inbox / "again.csv").write_text(EMPTY_ROWS)
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    rows = list(csv.DictReader(next(home.outbox.glob("again_results*.csv")).open(encoding="utf-8-sig")))
    assert [r["error"].split(":")[0] for r in rows] == ["", "empty_input", "empty_input", ""]
    assert [r["answered_by"] for r in rows] == ["reused", "", "", "reused"]


@pytest.mark.parametrize("setting", ["preflight_rows: 4\n", "route: online\n"], ids=["preflight", "online route"])
def test_skip_empty_holds_on_the_synchronous_paths_tick_by_tick(home: Home, setting: str) -> None:
    """The rule of the test below, through ``tick(now)``: the empty rows are never sent on the
    preflight or the online route, and fail ``empty_input`` in the result."""
    import csv

    from ticks import Rig

    rig = Rig(home, setting + "skip_empty: true\n")
    try:
        (home.inbox / "answers.csv").write_text(EMPTY_ROWS)
        for _ in range(40):
            rig.tick()
            rig.provider.finish_all()
            if any(j.ended for j in rig.engine.ctx.state.jobs.values()):
                break
        (job,) = rig.engine.ctx.state.jobs.values()
        assert job.ended == "completed_with_errors"
        sent = [e for e in rig.store.read() if e.type in ("PreflightRequested", "OnlineRequestSent")]
    finally:
        rig.close()
    rows = list(csv.DictReader(next(home.outbox.glob("answers_results*.csv")).open(encoding="utf-8-sig")))
    assert [r["error"].split(":")[0] for r in rows] == ["", "empty_input", "empty_input", ""]
    assert rows[0]["answered_by"] in ("preflight", "online") and not rows[1]["answered_by"]
    assert sent and len(sent) <= 2  # the two answers only: the empty rows are never paid for


@pytest.mark.slow  # a sandbox daemon run in a subprocess; the rule is tested tick by tick above
@pytest.mark.parametrize("setting", ["preflight_rows: 4\n", "route: online\n"], ids=["preflight", "online route"])
def test_skip_empty_holds_on_the_synchronous_paths(home: Home, setting: str) -> None:
    import csv

    home.config_file.write_text(FAST_CONFIG.replace("preflight_rows: 0\n", "") + setting + "skip_empty: true\n")
    (home.inbox / "answers.csv").write_text(EMPTY_ROWS)
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    rows = list(csv.DictReader(next(home.outbox.glob("answers_results*.csv")).open(encoding="utf-8-sig")))
    assert [r["error"].split(":")[0] for r in rows] == ["", "empty_input", "empty_input", ""]
    assert rows[0]["answered_by"] in ("preflight", "online") and not rows[1]["answered_by"]
    sent = [json.loads(line) for line in bgctl(home.root, "events", "--json").stdout.splitlines()]
    sent = [e for e in sent if e["type"] in ("PreflightRequested", "OnlineRequestSent")]
    assert sent and len(sent) <= 2  # the two answers only: the empty rows are never paid for


# --- d. after the last job has ended, status does not warn that no daemon is running ----------------


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_status_warns_of_no_daemon_only_when_something_waits_for_one(home: Home) -> None:
    home.config_file.write_text(FAST_CONFIG)
    (home.inbox / "answers.csv").write_text("id,response\n1,a fine answer\n")
    waiting = " ".join(bgctl(home.root, "status").stdout.split())
    assert "No daemon is running for this home: nothing is processed until one starts" in waiting
    assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    lines = bgctl(home.root, "status").stdout.strip().splitlines()
    assert "No daemon is running for this home" not in "\n".join(lines)
    assert lines[-1] == "No daemon is running; nothing is waiting for one."


# --- f. a database file that exists but is still empty is "no jobs yet" for every command ----------


def test_an_empty_database_file_is_no_jobs_yet_everywhere(home: Home) -> None:
    from rich.console import Console

    from batchgrader.cli.render_watch import watch_overview, watch_screen

    home.db.touch()  # a daemon is creating it: the file is there, its tables not yet
    overview = watch_overview(home, False, None)
    screen = watch_screen(overview, [], {"running": False}, Console(width=80, record=True), 40)
    assert "No jobs yet" in screen
    for args in (["status"], ["status", "--json"], ["events"], ["costs"], ["report", "x"], ["cancel", "x"], ["rebuild"]):
        res = run(*args)
        assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit), args
        assert "no jobs yet" in res.output.lower() or res.output.strip() == "[]", (args, res.output)


# --- e. `bgctl service status` speaks in words, not Python values ----------------------------------


def test_service_status_prints_words_not_python_values(home: Home) -> None:
    out = run("service", "status").output
    assert "installed: no" in out and "bgctl service install --user" in out and "secrets file: none" in out
    assert not any(word in out.split() for word in ("False", "True", "None", "False,", "None,"))
    from batchgrader.cli.admin import service_status_lines

    base = {"manager": "systemd", "mode": "user", "path": "/u/batchgrader.service", "env_file": "/h/secrets.env"}
    lines = service_status_lines(
        {**base, "installed": True, "active": "active", "env_file_present": True, "env_file_mode": "0644"}
    )
    assert lines == [
        "installed: yes (user systemd unit /u/batchgrader.service)",
        "running: yes (active)",
        "secrets file: /h/secrets.env, mode 0644: others can read it; run chmod 600 /h/secrets.env",
    ]
    lines = service_status_lines(
        {**base, "installed": True, "active": "inactive", "env_file_present": True, "env_file_mode": "0600"}
    )
    assert lines[1:] == ["running: no (inactive)", "secrets file: /h/secrets.env, mode 0600"]


# --- g. a result and its report share their stem ---------------------------------------------------


@pytest.mark.slow  # a sandbox daemon run in a subprocess
def test_a_result_and_its_report_share_their_stem(home: Home) -> None:
    home.config_file.write_text(FAST_CONFIG + "write_report: true\n")
    home.outbox.mkdir(parents=True, exist_ok=True)
    (home.outbox / "answers_report.html").write_text("an old report, its result deleted")
    for i in (1, 2):
        (home.inbox / "answers.csv").write_text(f"id,response\n1,answer {i}\n")
        assert bgctl(home.root, "daemon", "--sandbox", "--once", key=None).returncode == 0
    results = sorted(p.name for p in home.outbox.glob("answers_results*.csv"))
    reports = sorted(p.name for p in home.outbox.glob("answers_report*.html"))
    assert len(results) == 2 and reports[0] == "answers_report.html"
    assert (home.outbox / "answers_report.html").read_text() == "an old report, its result deleted"
    assert sorted(r.replace("_results", "_report").replace(".csv", ".html") for r in results) == reports[1:]


# --- h. whole one-line summaries, and an example in every command's --help -------------------------


def _commands(group, prefix=()):  # noqa: ANN001, ANN202
    import click

    for name, cmd in sorted(group.commands.items()):
        yield (*prefix, name), cmd, group
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))


def test_every_command_has_a_whole_summary_and_an_example_that_parses(home: Home) -> None:
    import shlex

    import click

    from batchgrader.cli.commands import cli

    for path, cmd, _parent in _commands(cli):
        listing = " ".join(run(*path[:-1], "--help").output.split())
        summary = cmd.get_short_help_str(limit=200)
        assert summary and not summary.endswith("...") and summary in listing, (path, summary)
        help_text = run(*path, "--help").output
        assert "Example" in help_text, f"bgctl {' '.join(path)} --help has no example"
        examples = [line.strip() for line in help_text.split("Example", 1)[1].splitlines()[1:] if line.strip()]
        assert examples and all(e.startswith("bgctl " + " ".join(path)) for e in examples), (path, examples)
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        if isinstance(cmd, click.Group):  # a group's example runs one of its commands
            known |= {o for sub in cmd.commands.values() for p in sub.params for o in (*p.opts, *p.secondary_opts)}
        for example in examples:
            used = {a.split("=")[0] for a in shlex.split(example) if a.startswith("-")}
            assert used <= known, f"{example}: no option {sorted(used - known)}"


def test_bgctl_help_lists_every_command_in_a_section(home: Home) -> None:
    """Issue 35: 19 top-level commands in one list; now grouped by what they are for, and a new
    command no section names would show under "Other commands" rather than be hidden."""
    from batchgrader.cli.commands import cli
    from batchgrader.cli.helptext import SECTIONS

    text = run("--help").output
    assert [t for t in SECTIONS if f"\n{t}:\n" in text] == list(SECTIONS)
    assert sorted(n for names in SECTIONS.values() for n in names) == sorted(cli.commands)
    assert "Other commands" not in text
