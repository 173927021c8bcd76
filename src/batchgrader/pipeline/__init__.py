"""pipeline: the data path from an input file to a result file, in the order rows flow.

``inbox`` (claim a stable file) -> ``tables`` (read rows exactly) -> ``prompts`` and ``prepare``
(one chat request per row) -> ``tokens`` (exact counts) -> ``pricing`` (estimates and billed
cost) -> ``splitting`` (chunks under every cap) -> ``results`` (parse the provider's output)
-> ``outbox`` (the result file and error reports).  No module here talks to a provider or
writes to the event log.
"""
