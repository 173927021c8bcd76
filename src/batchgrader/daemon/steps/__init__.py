"""The engine's steps, one class per concern, each built over the
:class:`~batchgrader.daemon.context.Context` alone; a module holds the steps of one phase
(``collect``: collecting and the stragglers; ``finish``: finishing and storing answers).

The convention: a step's public method that carries out an action takes ``(action, job, now)``
(``now``: the tick's wall clock; waits run on ``ctx.mono``) and is named in
:func:`batchgrader.daemon.engine.action_table`.  A step imports no other step, names none and calls none:
what two steps share is on the context (``emit``, a chunk's rows failed, a refused file deleted,
the outbox's paths and error reports, the provider of a job), and the pure logic is in
``pipeline/`` (the chunks planned, re-planned and retried: ``pipeline/chunkplan.py``; the reuse
probes and answers: ``pipeline/job_reuse.py``).
"""
