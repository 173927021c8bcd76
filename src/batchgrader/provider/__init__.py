"""provider: talking to a batch API.

``protocol`` holds the ``Provider`` protocol the engine uses (its values and errors),
``reconcile`` the list-and-match that runs before anything is sent again, ``openai_api`` the
OpenAI Files and Batches client (creates sent once, reads retried). The local emulator of the
APIs is the sibling package :mod:`batchgrader.emulator`, reached only over HTTP.
"""
