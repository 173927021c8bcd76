"""daemon: the long-running process that moves jobs from inbox to outbox.

``engine`` is the reconciler (``Engine.tick(now)`` takes every job one step further, each
external action written as intent -> call -> outcome); ``process`` wraps it with the lock,
signals (which only set flags), the scheduler, the inbox watcher and the logs; ``notify``
speaks systemd's ``sd_notify``.
"""
