"""Opening the store never loads the data-frame libraries: neither to open a home whose read side is
current nor to migrate a new one (sqlite-utils, which would load pandas and numpy with it, about
80 MiB, is not used for the read-side migrations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
from pathlib import Path
from batchgrader.store.eventstore import EventStore
from batchgrader.store.readmodels import projectors
heavy = ("sqlite_utils", "pandas", "numpy")
on_import = sorted(m for m in heavy if m in sys.modules)
with EventStore(Path(sys.argv[1]), projectors=projectors()) as s:
    tables = sorted(r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
print(json.dumps({"on_import": on_import, "after_open": sorted(m for m in heavy if m in sys.modules), "tables": tables}))
"""


def _probe(db: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(db)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow  # two subprocesses
def test_neither_a_new_home_nor_a_current_one_loads_pandas(tmp_path: Path) -> None:
    db = tmp_path / "bg.db"
    first = _probe(db)
    assert first["on_import"] == []  # importing the store loads none of them
    assert first["after_open"] == []  # a new home: the migrations ran without them
    assert {"job_status", "usage", "_sqlite_migrations"} <= set(first["tables"])
    again = _probe(db)
    assert (again["on_import"], again["after_open"]) == ([], [])
    assert again["tables"] == first["tables"]
