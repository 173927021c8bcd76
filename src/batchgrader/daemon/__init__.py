"""daemon: the long-running process that moves jobs from inbox to outbox.

``engine`` is the reconciler (``Engine.tick(now)`` takes every job one step further, each
external action written as intent -> call -> outcome) over the steps of ``steps/``, each built
over the one ``context`` and found through ``dispatch``'s table; ``process`` wraps it with the
lock, signals (which only set flags), the one loop, the inbox watcher and the logs; ``notify``
speaks systemd's ``sd_notify``.
"""
