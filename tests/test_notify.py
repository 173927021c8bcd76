"""sd_notify: real AF_UNIX datagram sockets, the environment passed explicitly."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from batchgrader.core.host.sdnotify import STATUS_MAX, Notifier, clean_status

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="needs AF_UNIX sockets")


@pytest.fixture
def listener():
    """A bound datagram socket in a short temp dir (AF_UNIX paths are limited to ~104 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sdn") as d:
        path = str(Path(d) / "notify.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(2)
            yield path, sock


def drain(sock: socket.socket) -> list[bytes]:
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(sock.recv(65536))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(2)
    return out


def test_exact_datagrams(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready()
    assert n.status("3 jobs running, 12 batches in_progress")
    assert n.watchdog()
    assert n.extend_timeout(1.5)
    assert n.stopping()
    assert n.ready(status="replayed")
    assert [sock.recv(4096) for _ in range(6)] == [
        b"READY=1",
        b"STATUS=3 jobs running, 12 batches in_progress",
        b"WATCHDOG=1",
        b"EXTEND_TIMEOUT_USEC=1500000",
        b"STOPPING=1",
        b"READY=1\nSTATUS=replayed",
    ]
    assert (n.sent, n.errors, n.last_error) == (6, 0, None)


def test_status_is_one_clean_line(listener):
    path, sock = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    n.status("line one\nREADY=1\r\n\x00\tend \u2028 x\x1b[31m")
    assert sock.recv(4096) == b"STATUS=line one READY=1 end x [31m"
    n.status("h\u00e9llo \u2713")
    assert sock.recv(4096) == "STATUS=h\u00e9llo \u2713".encode()
    n.status("x" * (STATUS_MAX + 50))
    assert sock.recv(65536) == b"STATUS=" + b"x" * STATUS_MAX
    assert clean_status("  \n ") == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract namespace is Linux-only")
def test_abstract_namespace():
    name = f"batchgrader-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_unset_is_a_silent_noop():
    n = Notifier({})
    assert not n.enabled
    assert not any([n.ready(), n.status("x"), n.watchdog(), n.stopping(), n.extend_timeout(5)])
    assert (n.sent, n.errors) == (0, 0)
    assert not Notifier({"NOTIFY_SOCKET": ""}).enabled


def test_send_errors_are_swallowed_counted_and_logged_once(tmp_path, caplog):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    with caplog.at_level(logging.DEBUG, logger="batchgrader.core.host.sdnotify"):
        assert n.ready() is False
        assert n.watchdog() is False
    assert n.errors == 2 and n.sent == 0
    assert "FileNotFoundError" in n.last_error or "ConnectionRefused" in n.last_error
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG]


def test_unsupported_address_counts_as_error():
    n = Notifier({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert n.enabled and n.ready() is False
    assert n.errors == 1 and "unsupported NOTIFY_SOCKET" in n.last_error


def test_reads_process_environment_by_default(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert Notifier().ready()
    assert drain(sock) == [b"READY=1"]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4242"}, 30.0),  # our (given) pid
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4243"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": ""}, 30.0),  # empty = absent
        ({"WATCHDOG_USEC": "1500"}, 0.00075),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "sixty"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_PID": "4242"}, None),
    ],
)
def test_watchdog_interval(env, expected):
    assert Notifier(env, pid=4242).watchdog_interval() == expected


def test_watchdog_pid_defaults_to_ours():
    env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(env).watchdog_interval() == 1.0
