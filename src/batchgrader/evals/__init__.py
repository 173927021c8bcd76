"""evals: OpenAI Evals at batch price, from the command line: ``importer`` writes an exported eval
into the home and queues its first jobs; ``results`` follows its run from the event log and has
its results written.  What the daemon runs as well (the graders, the plans, generate-then-grade,
the results) is in :mod:`batchgrader.pipeline.evals`; the pure decisions in
:mod:`batchgrader.core.rules.evalchain` and :mod:`batchgrader.core.rules.cron`.
"""
