"""OpenAI Evals (and Azure AI Foundry's copy of the same schema) as BatchGrader jobs: the part the
daemon runs too.

``spec`` reads an eval object, a run and its output items as the API returned them (checked with
openai-python's own types) into :class:`~batchgrader.pipeline.evals.spec.EvalSpec`;
``templates`` fills ``{{ item.x }}`` / ``{{ sample.output_text }}``; ``data`` reads the items;
``graders`` computes ``string_check`` and ``text_similarity`` locally and reads the model
criteria's answers; ``plan`` turns the model criteria into profiles and request rows (one job
per model); ``chain`` is generate-then-grade (the generation job, then its answers graded);
``folder`` is what an eval's folder records; ``results`` writes an OpenAI-shaped ``run.json``
and ``output_items.jsonl`` once the jobs ended, with the report and the comparison with OpenAI's
own output items; ``pygrader`` runs a ``python`` grader in a limited subprocess (opt-in).
"""
