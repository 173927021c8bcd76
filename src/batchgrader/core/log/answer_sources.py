"""Where a request's answer comes from: every answer source, declared once, in the order a job
tries them (a stored answer, then an earlier identical request of the same file, then the
preflight, then the route that sends the rest).

The result file's ``answered_by`` column, which answers are billed in the job (and so which rows
keep their token columns), what ``bgctl status``, ``report`` and ``costs`` call each kind of row,
and the table in docs/configuration.md (:func:`doc_table`, checked by ``tests/test_docs.py``) are
all read from :data:`SOURCES`.  A new answer source is one more entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AnswerSource:
    """One source of answers.

    ``name`` is what the result's ``answered_by`` says and what every command calls such rows;
    ``tag`` marks an answer of this source in a result record (its ``reused`` field; None for a
    batch's own answer, the default); ``billed_in_job``: its tokens and cost were billed to this
    job (else billed once elsewhere: the row shows 0 tokens and counts as saved)."""

    name: str
    tag: str | None
    billed_in_job: bool
    doc: str


#: every answer source, in the order a job's requests are given one
SOURCES: tuple[AnswerSource, ...] = (
    AnswerSource("reused", "cache", False, "a stored answer to the same request, from an earlier job (the answers store)"),
    AnswerSource("duplicate", "duplicate", False, "an earlier identical request of the same job (only the first is sent)"),
    AnswerSource("preflight", "preflight", True, "the preflight: the job's first requests through the synchronous API"),
    AnswerSource("batch", None, True, "a batch of the job"),
    AnswerSource("online", "online", True, "the synchronous API at the standard tier (`route: online`, or a straggler's rescue)"),
    AnswerSource("flex", "flex", True, "the synchronous API at the flex tier (`route: flex`, or a straggler's rescue)"),
)

#: a result record's ``reused`` tag -> the source's name (``answered_by``)
ANSWERED_BY: dict[str | None, str] = {s.tag: s.name for s in SOURCES}
#: tags of answers billed elsewhere (an earlier job, or the identical row that was sent)
BILLED_ELSEWHERE: frozenset[str] = frozenset(s.tag for s in SOURCES if s.tag and not s.billed_in_job)
#: tags of answers the job sent and paid for itself before it was prepared, taken at prepare as
#: stored answers are (preflight, online, flex): their rows keep their tokens
ANSWERED_IN_JOB: tuple[str, ...] = tuple(s.tag for s in SOURCES if s.tag and s.billed_in_job)
PREFLIGHT = "preflight"
DUPLICATE = "duplicate"


def doc_table() -> str:
    """The docs' table of answer sources, in order."""
    rows = [
        f"| {i} | `{s.name}` | {s.doc} | {'yes' if s.billed_in_job else 'no: 0 tokens, counted as saved'} |"
        for i, s in enumerate(SOURCES, 1)
    ]
    return (
        "\n".join(["| order | `answered_by` | the answer comes from | billed in this job |", "|---|---|---|---|", *rows]) + "\n"
    )
