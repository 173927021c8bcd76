"""One module per concern of reading and writing tables; :mod:`batchgrader.pipeline.tables` is the entry point.

``common`` (errors, rows, layouts, ``text_of``, the formula guard, format detection),
``jsonvalue`` (exact JSON values), ``text``, ``jsontext`` and ``writer`` (CSV/TSV, JSON, JSONL),
``excel`` (``.xlsx``/``.xlsm``) and ``parquet``.
"""
