"""provider: talking to a batch API, and the local emulator of one.

``openai_api`` holds the ``Provider`` protocol the engine uses and the OpenAI Files and Batches
client (creates sent once, reads retried, listing used to reconcile); ``emulator`` is a real
HTTP server on 127.0.0.1 that the official SDK talks to unchanged, with faults and a clock.
"""
