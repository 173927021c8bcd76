"""sqlite-utils, imported without the data-frame libraries it would load with it.

sqlite-utils 4 imports pandas and numpy when it is imported, if they are installed, only to map
their scalar types to SQLite column types. The store never passes either, but loading them costs
about 80 MiB of resident memory (and about a second) in every process that creates or upgrades the
read side: the daemon on a new home, and any command run first on it. So the first import of
sqlite-utils in a process hides them when neither is loaded yet; sqlite-utils then records them as
absent. A later ``import pandas`` (an Excel or Parquet file, a report) loads it as usual.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

_HIDDEN = ("pandas", "numpy")
_lock = threading.Lock()


def sqlite_utils() -> ModuleType:
    """The ``sqlite_utils`` package with its ``migrations`` module loaded."""
    with _lock:
        if "sqlite_utils.migrations" not in sys.modules:
            hidden = [name for name in _HIDDEN if name not in sys.modules]
            for name in hidden:
                sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError
            try:
                importlib.import_module("sqlite_utils.migrations")
            finally:
                for name in hidden:
                    if name in sys.modules and sys.modules[name] is None:
                        del sys.modules[name]
        return importlib.import_module("sqlite_utils")
