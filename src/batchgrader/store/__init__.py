"""store: the event log (SQLite by default, PostgreSQL when `store_url` is set) and its read models (reports on what they hold: ``batchgrader.reports``).

``eventstore`` is the append-only store (WAL, ``BEGIN IMMEDIATE``, per-job optimistic
concurrency, projectors in the same transaction); ``readmodels`` keeps the ``job_status`` and
``usage`` tables current and can rebuild them from the log; ``readside`` checks they are current
without a fold; ``queries`` answers ``bgctl status / events / costs`` on a read-only connection.
"""
