"""evals: OpenAI Evals (and Azure AI Foundry's copy of the same schema) run at batch price.

``spec`` reads an eval object, a run and its output items as the API returned them (checked with
openai-python's own types) into :class:`~batchgrader.evals.spec.EvalSpec`; ``templates`` fills
``{{ item.x }}`` / ``{{ sample.output_text }}``; ``data`` reads the items; ``graders`` computes
``string_check`` and ``text_similarity`` locally and reads the model criteria's answers;
``plan`` turns the model criteria into profiles and request rows (one job per model);
``importer`` writes all of it into the home atomically and queues the rows; ``results`` writes
an OpenAI-shaped ``run.json`` and ``output_items.jsonl`` once the job ended, with the report
and the comparison with OpenAI's own output items; ``pygrader`` runs a ``python`` grader in a
limited subprocess (opt-in); ``schedule`` and ``chain`` are the pure decisions the daemon needs
for cron schedules and generate-then-grade.
"""
