"""provider: talking to a batch API, and the local emulator of one.

``protocol`` holds the ``Provider`` protocol the engine uses (its values and errors),
``reconcile`` the list-and-match that runs before anything is sent again, ``openai_api`` the
OpenAI Files and Batches client (creates sent once, reads retried); ``emulator`` is a real
HTTP server on 127.0.0.1 that the official SDK talks to unchanged, with faults and a clock.
"""
