"""sqlite-utils (which loads pandas and numpy with it, about 80 MiB) is imported only where it is
needed: when a read-side migration is pending (a new home, an upgrade), never to open a home whose
read side is current, nor by importing the store."""

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
imported = "sqlite_utils" in sys.modules
with EventStore(Path(sys.argv[1]), projectors=projectors()) as s:
    tables = sorted(r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
print(json.dumps({"on_import": imported, "after_open": "sqlite_utils" in sys.modules, "tables": tables}))
"""


def _probe(db: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(db)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow  # two subprocesses, one of which imports pandas
def test_sqlite_utils_is_imported_only_to_migrate(tmp_path: Path) -> None:
    db = tmp_path / "bg.db"
    first = _probe(db)
    assert first["on_import"] is False  # importing the store does not load it
    assert first["after_open"] is True  # a new home: the migrations ran
    assert {"job_status", "usage"} <= set(first["tables"])
    again = _probe(db)
    assert (again["on_import"], again["after_open"]) == (False, False)  # nothing pending: never loaded
    assert again["tables"] == first["tables"]
