"""daemon: the long-running process that moves jobs from inbox to outbox.

``engine`` is the reconciler (``Engine.tick(now)`` takes every job one step further, each
external action written as intent -> call -> outcome) over the steps of ``steps/``, each built
over the one ``context`` and found through the engine's action table; ``process`` wraps it with
the lock, signals (which only set flags), the one loop, the inbox watcher and the logs;
``shared`` holds the leases of several daemons on one store; ``workers`` merges large chunks in
worker processes; ``control`` reads the control requests (``cancel``, ``retry``).
"""
