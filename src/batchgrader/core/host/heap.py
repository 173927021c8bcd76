"""Giving the C heap's free memory back to the system after a large step.

Preparing a large file counts its rows on a pool of threads; glibc gives each thread's
allocations an arena of its own and keeps what is freed there for later use, so a daemon that
prepared a million rows keeps tens of MiB it no longer needs while its batches run for hours.
:func:`trim_heap` asks glibc to return it (``malloc_trim(0)``, which trims every arena). Where
the C library has no such call (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the heap's free pages to the system; True if some were returned."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
