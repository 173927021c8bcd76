"""Creating a home's read side loads sqlite-utils without pandas and numpy (about 80 MiB resident
in the daemon), and pandas still loads afterwards for the files that need it."""

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
with EventStore(Path(sys.argv[1]), projectors=projectors()) as s:
    tables = sorted(r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
loaded = {name: name in sys.modules for name in ("sqlite_utils.migrations", "pandas", "numpy")}
import pandas
print(json.dumps({"loaded": loaded, "tables": tables, "pandas_later": pandas.DataFrame({"a": [1]}).shape[0]}))
"""


@pytest.mark.slow  # a subprocess that imports pandas
def test_a_new_home_is_migrated_without_loading_pandas_or_numpy(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "bg.db")], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    assert got["loaded"] == {"sqlite_utils.migrations": True, "pandas": False, "numpy": False}
    assert {"job_status", "usage"} <= set(got["tables"])  # the migrations ran
    assert got["pandas_later"] == 1  # hidden only while sqlite-utils was imported
