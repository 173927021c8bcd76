"""`bgctl status` (issue 32 items 2, 4 and 6): a job's tokens in, tokens out and cost cover the
same requests (the billed ones once anything is billed, the preflight's and the synchronous
route's included; else an estimate, marked so), "reused" means stored answers of earlier jobs
and "duplicate" a file's own repeats, and a file name with a newline keeps its row whole.
Tick by tick with the in-memory provider and a fake clock."""

from __future__ import annotations

from rich.console import Console

from batchgrader.cli.render_status import render_status, rows_cell, tokens_cell
from batchgrader.store import costs as costs_mod
from batchgrader.store import queries
from ticks import Rig


def drop(rig: Rig, rows: int, name: str = "a.csv", repeat: int = 0) -> None:
    body = "".join(f"{i},review {i}\n" for i in range(rows - repeat)) + "".join(f"x{i},review 0\n" for i in range(repeat))
    (rig.home.inbox / name).write_text("id,response\n" + body)


def run_until_ended(rig: Rig, file: str = "a.csv", ticks: int = 60) -> None:
    for _ in range(ticks):
        rig.tick(2.0)
        rig.provider.finish_all()
        if any(j.file == file and j.ended for j in rig.engine.ctx.state.jobs.values()):
            return
    raise AssertionError("the job did not end")


def status_row(rig: Rig, file: str = "a.csv") -> dict:
    (row,) = [r for r in queries.status(rig.home) if r["file"] == file]
    return row


def figures(cell: str) -> tuple[str, str]:
    tin, tout = cell.splitlines()
    return tin, tout


def test_a_job_with_a_preflight_shows_billed_tokens_in_and_out_for_all_its_rows(home):
    rig = Rig(home, "preflight_rows: 3\n")
    try:
        drop(rig, 20)
        run_until_ended(rig)
        job = rig.job()
        assert job.ended == "completed" and job.preflight_answers  # 3 rows by the preflight, 17 by batch
        row = status_row(rig)
        tin, tout = figures(tokens_cell(row))
        assert tin == f"{job.prompt_tokens:,} in" and tout == f"{job.completion_tokens:,} out"
        assert job.prompt_tokens == 20 * rig.provider.prompt_tokens  # the bill's scope: every row
        assert job.completion_tokens == 20 * rig.provider.completion_tokens
    finally:
        rig.close()


def test_a_job_nothing_is_billed_for_yet_shows_its_estimate_marked_so(home):
    rig = Rig(home)
    try:
        drop(rig, 5)
        rig.tick()
        rig.tick()
        rig.tick()
        row = status_row(rig)
        assert row["cost_usd"] == 0 and row["input_tokens"] > 0
        tin, tout = figures(tokens_cell(row))
        assert tin == f"{row['input_tokens']:,} in (est.)" and tout == "- out"
    finally:
        rig.close()


def test_an_online_job_shows_its_billed_input_tokens_and_costs_counts_requests_not_batches(home):
    rig = Rig(home, "route: online\nonline_concurrency: 2\n")
    try:
        drop(rig, 4)
        run_until_ended(rig)
        tin, tout = figures(tokens_cell(status_row(rig)))
        assert tin == f"{4 * rig.provider.prompt_tokens:,} in" and tout == f"{4 * rig.provider.completion_tokens:,} out"
        by_route = {r["key"]: r for r in costs_mod.costs(home, by="route")["rows"]}
        assert by_route["online"]["batches"] == 0 and by_route["online"]["requests"] == 4
    finally:
        rig.close()


def test_a_files_own_repeats_are_duplicates_and_stored_answers_of_earlier_jobs_are_reused(home):
    rig = Rig(home)
    try:
        drop(rig, 4, repeat=2)  # rows 2 and 3 repeat row 0
        run_until_ended(rig)
        assert sorted(r["answered_by"] for r in rig.result_rows()) == ["batch", "batch", "duplicate", "duplicate"]
        cell = rows_cell(status_row(rig))
        assert "2 duplicate" in cell.splitlines() and "reused" not in cell
        drop(rig, 3, name="b.csv")  # rows 0-2 of a.csv's text: row 0 and 1 answered before
        run_until_ended(rig, "b.csv")
        by = sorted(r["answered_by"] for r in rig.result_rows("b_results.csv"))
        assert by == ["batch", "reused", "reused"]
        cell = rows_cell(status_row(rig, "b.csv"))
        assert "2 reused" in cell.splitlines() and "duplicate" not in cell
    finally:
        rig.close()


def test_a_file_name_with_a_newline_keeps_its_status_row_whole(home):
    rig = Rig(home)
    try:
        drop(rig, 2, name="bad\nname\x1b[31m.csv")
        run_until_ended(rig, "bad\nname\x1b[31m.csv")
        console = Console(record=True, width=200)
        render_status(queries.status(home), console)
        shown = console.export_text()
        assert "bad\\nname\\x1b[31m.csv" in shown
        assert not any(line.strip().startswith("name") for line in shown.splitlines())
    finally:
        rig.close()
