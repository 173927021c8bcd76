"""trim_heap gives back what a worker thread freed (glibc keeps it in the thread's arena)."""

from __future__ import annotations

import sys
import threading

import pytest

from batchgrader.core.host.heap import _malloc_trim, trim_heap


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or _malloc_trim() is None, reason="glibc's malloc_trim")
def test_memory_a_thread_freed_is_given_back_to_the_system():
    def churn() -> None:
        blocks = [bytes(2048) + bytes([i % 251]) for i in range(40_000)]  # ~80 MiB of C-heap blocks in this thread's arena
        del blocks[:-1]  # the last block keeps the arena's top in use, so free() alone cannot shrink it

    base = _rss_kib()
    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    kept = _rss_kib() - base
    assert kept > 20 * 1024  # freed, yet still held by the process
    assert trim_heap()
    assert _rss_kib() - base < kept / 2  # most of it went back


def test_trim_heap_is_harmless_where_there_is_nothing_to_give_back():
    trim_heap()
    assert trim_heap() in (True, False)
