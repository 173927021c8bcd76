"""The request lines a job sends outside its batches: the preflight's and the synchronous route's.

Each is built exactly as :func:`~batchgrader.pipeline.prepare.prepare` writes it, and counted
and sized as prepare counts them, so a row answered here is the row a batch would have sent.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from pathlib import Path

from batchgrader.core.configuration.config import Profile
from batchgrader.core.host.home import Home
from batchgrader.pipeline.prepare import is_empty
from batchgrader.pipeline.requests import RequestBuilder, dumps_line, request_messages
from batchgrader.pipeline.rowschema import row_formats
from batchgrader.pipeline.splitting import Limits, plan_chunks
from batchgrader.pipeline.tables import open_table
from batchgrader.pipeline.tokens import ChatTokenCounter


def first_requests(path: Path, profile: Profile, home: Home, file_hash: str, n: int) -> list[bytes]:
    """The request lines of the first ``n`` rows of ``path``, exactly as :func:`prepare` writes
    them (the preflight's requests).  Raises what :func:`prepare` raises for the same input."""
    builder = RequestBuilder(profile, home, file_hash)
    formats = row_formats(profile)
    out: list[bytes] = []
    with open_table(
        path, required_columns=builder.required_columns(), sheet=profile.get("sheet"), encoding=profile.get("encoding", "utf-8")
    ) as reader:
        skip_empty = bool(profile.get("skip_empty"))
        for row in reader:
            if len(out) >= n:
                break
            if skip_empty and is_empty(row, profile.response_field):
                continue  # never sent (prepare fails it with empty_input)
            rf = formats.of(row, path) if formats is not None else None
            out.append(dumps_line(builder.line(row, rf)[2]))
    return out


def input_tokens_of(lines: Sequence[bytes], profile: Profile) -> int:
    """The input tokens of request lines (as :func:`prepare` writes them), counted offline with
    the model's tokenizer as :func:`prepare` counts them."""
    return sum(_line_tokens(lines, profile))


def oversized_lines(lines: Sequence[bytes], profile: Profile, limits: Limits) -> set[int]:
    """The positions among ``lines`` (request lines as :func:`prepare` writes them) of those that
    prepare would fail alone as ``request_too_large`` under ``limits`` (their tokens counted as
    prepare counts them, their size in bytes)."""
    if not lines:
        return set()
    sizes = array("Q", (len(line) for line in lines))
    if not plan_chunks(sizes, sizes, limits)[1]:
        # a request's tokens never exceed its line's bytes (each token is at least one byte of a
        # string the line carries, and each message's and the reply's overhead fewer than its
        # JSON punctuation): none is too large, and the tokenizer need not be loaded for it
        return set()
    tokens = array("Q", (max(0, n) for n in _line_tokens(lines, profile)))
    return {o.position for o in plan_chunks(tokens, sizes, limits)[1]}


def _line_tokens(lines: Sequence[bytes], profile: Profile) -> list[int]:
    counter = ChatTokenCounter(profile.get("azure_model") or profile.model, profile.default_encoding)
    return counter.count_many([request_messages(json.loads(line)["body"]) for line in lines])
