"""The read-side tables as both backends hold them: columns (in INSERT order), their types and
keys, read from :mod:`batchgrader.store.readmodel_schema` (which creates them in the SQLite file)
so that a PostgreSQL log gets the same tables (:mod:`batchgrader.store.pg_readmodels`) and the
two can be compared row for row (``read_model``)."""

from __future__ import annotations

from dataclasses import dataclass

from batchgrader.store.readmodel_schema import JOB_STATUS_COLUMNS, QUEUE_LIMIT_COLUMNS, SAVINGS_COLUMNS, USAGE_COLUMNS
from batchgrader.store.runtimes import BATCH_RUN_COLUMNS

_SQL_TYPE = {str: 'TEXT COLLATE "C"', int: "BIGINT", float: "DOUBLE PRECISION"}


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    types: tuple[type, ...]
    key: tuple[str, ...]

    def ddl(self, name: str) -> str:
        """``CREATE TABLE`` in PostgreSQL."""
        cols = ", ".join(f"{c} {_SQL_TYPE[t]}" for c, t in zip(self.columns, self.types))
        return f"CREATE TABLE IF NOT EXISTS {name} ({cols}, PRIMARY KEY ({', '.join(self.key)}))"

    def upsert(self, name: str) -> str:
        """Insert or replace a row, in PostgreSQL."""
        marks = ", ".join(["%s"] * len(self.columns))
        rest = [c for c in self.columns if c not in self.key]
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in rest)
        return f"INSERT INTO {name} ({', '.join(self.columns)}) VALUES ({marks}) ON CONFLICT ({', '.join(self.key)}) DO UPDATE SET {sets}"

    def select(self, name: str) -> str:
        """Every row in key order (the same text in both backends)."""
        return f"SELECT {', '.join(self.columns)} FROM {name} ORDER BY {', '.join(self.key)}"


def _table(columns: dict[str, type], key: tuple[str, ...]) -> Table:
    return Table(tuple(columns), tuple(columns.values()), key)


#: the read-side tables (the keys of the SQLite migrations)
TABLES: dict[str, Table] = {
    "job_status": _table(JOB_STATUS_COLUMNS, ("job_id",)),
    "usage": _table(USAGE_COLUMNS, ("seq",)),
    "queue_limits": _table(QUEUE_LIMIT_COLUMNS, ("base_url", "model")),
    "savings": _table(SAVINGS_COLUMNS, ("seq",)),
    "batch_runs": _table(BATCH_RUN_COLUMNS, ("batch_id",)),
    "projection_state": _table({"name": str, "last_seq": int}, ("name",)),
}
