"""The `bgctl status` table selects the newest jobs per group in SQL and says what it left out."""

from __future__ import annotations

import json

from click.testing import CliRunner

from batchgrader.cli.commands import cli
from batchgrader.store import queries
from batchgrader.store.eventstore import EventStore, NewEvent
from batchgrader.store.readmodels import projectors


def make_jobs(home, active: int, finished: int) -> None:
    with EventStore(home.db, projectors=projectors()) as store:
        for i in range(active + finished):
            name = f"f{i:03d}.csv"
            accepted = {"file": name, "source": name, "profile": "default", "sha256": f"{i:064d}", "bytes": 1}
            accepted |= {"input_path": name, "result_name": name, "sandbox": False}
            evs = [NewEvent("JobAccepted", accepted)]
            if i < finished:
                evs.append(NewEvent("JobCompleted", {"state": "completed", "succeeded": 1, "failed": 0}))
            store.append(f"job{i:03d}", evs, expected_version=0)


def test_overview_limits_and_counts(home):
    make_jobs(home, active=7, finished=12)
    ov = queries.status_overview(home, active_limit=3, finished_limit=4)
    ids = [r["job_id"] for r in ov["jobs"]]
    assert ids == ["job008", "job009", "job010", "job011", "job016", "job017", "job018"]  # oldest first
    assert ov["counts"] == {"completed": 12, "preparing": 7} and ov["total"] == 19
    assert (ov["hidden_active"], ov["hidden_finished"]) == (4, 8)
    assert ov["source"] == "read_model"


def test_status_table_says_what_is_hidden_and_json_lists_everything(home):
    make_jobs(home, active=25, finished=15)
    table = CliRunner().invoke(cli, ["status"])
    assert table.exit_code == 0, table.output
    assert "5 older unfinished and 5 older finished jobs not shown" in " ".join(table.output.split())
    everything = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert len(everything) == 40 and {r["state"] for r in everything} == {"completed", "preparing"}
    assert CliRunner().invoke(cli, ["status", "--all"]).output.count("f0") >= 40
