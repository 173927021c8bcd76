"""core: what every other layer stands on, with no I/O beyond reading settings.

The event catalogue and its upcasters (``schema``), job state as a pure fold of the log
(``state``), the configuration catalogue and its layered loading (``config``) and the home
folder's well-known paths (``home``).
"""
