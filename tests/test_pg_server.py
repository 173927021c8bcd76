"""The real PostgreSQL server the store's tests use (tests/pg_server.py): started by the tests on
loopback as an unprivileged user, one empty database per test."""

from __future__ import annotations

import os


def test_the_server_runs_unprivileged_on_loopback(pg_server, pg_url):
    import psycopg

    with psycopg.connect(pg_url) as conn:
        addr, version = conn.execute("SELECT inet_server_addr()::text, current_setting('server_version_num')::int").fetchone()
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]
        (tables,) = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert addr.split("/")[0] == "127.0.0.1"
    assert version >= 130000
    assert tables == 0  # each test gets an empty database
    owner = os.stat(data_dir).st_uid
    assert owner != 0  # the server refuses root; it runs as the data folder's owner
    if os.geteuid() == 0:
        assert pg_server.user is not None and owner == pg_server.user.pw_uid


def test_each_test_gets_its_own_database(pg_server, pg_url):
    other = pg_server.create_database()
    try:
        assert other != pg_url
    finally:
        pg_server.drop_database(other)
