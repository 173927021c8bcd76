"""Several samples per row (the ``samples`` key): their custom ids, their request keys and the vote.

A profile with ``samples: k`` sends k independent requests per row.  Sample 1 goes under the
row's own custom id, sample j (2..k) under ``<row id>-s<j>`` (:func:`sample_id`): the ids
follow from the row's id alone, so they are the same after a restart and in a retry, and each
sample fails, is retried and is reused on its own.  The k requests are identical, so each
sample's request key (:mod:`~batchgrader.pipeline.answerkey`) is the body's key mixed with its
sample number (:func:`sample_key`): a stored answer serves the same sample of a later job, never
two samples of one row.

When the result is written, the k answers of a row are put to a vote (:func:`vote`, rules in
docs/configuration.md): the voted value is that of a *field* of the answer (:class:`VoteSpec`:
``reference_field``, else the schema's first score field, else the plain answer text); numbers
take the median, other answers the most common value; a tie fails closed as ``no_majority``.
A sample that failed or whose answer has no usable value is left out of the vote and shown as
null among the samples.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchgrader.core.configuration.config import MAX_SAMPLES
from batchgrader.core.log.answer_sources import ANSWERED_BY, BILLED_ELSEWHERE

NO_MAJORITY = "no_majority"
SAMPLE_SUFFIX = "-s"
_SAMPLE_RE = re.compile(r"-s([0-9]{1,3})$")


def sample_id(row_id: str, j: int) -> str:
    """The custom id of sample ``j`` (1-based) of the row whose custom id is ``row_id``."""
    return row_id if j == 1 else f"{row_id}{SAMPLE_SUFFIX}{j}"


def sample_ids(row_id: str, k: int) -> list[str]:
    return [sample_id(row_id, j) for j in range(1, k + 1)]


def sample_number(custom_id: str) -> int:
    """The sample a custom id names: ``j`` for ``<id>-s<j>`` with 2 <= j <= MAX_SAMPLES, else 1."""
    if SAMPLE_SUFFIX not in custom_id:
        return 1
    m = _SAMPLE_RE.search(custom_id)
    if m is None:
        return 1
    j = int(m.group(1))
    return j if 2 <= j <= MAX_SAMPLES and m.group(1)[0] != "0" else 1


def sample_key(custom_id: str, key: str) -> str:
    """The request key of the request ``custom_id`` whose body has the key ``key``: the body's
    key for sample 1 (so a job without samples, and sample 1 of one with, find the same stored
    answers), a key of its own for every other sample."""
    j = sample_number(custom_id)
    if j == 1:
        return key
    return hashlib.sha256(f"{key}\x00sample\x00{j}".encode()).hexdigest()


def id_problem(row_id: str, k: int) -> str | None:
    """Why an id column value cannot carry ``k`` samples (it looks like another row's sample id)."""
    if k > 1 and sample_number(row_id) != 1:
        return (
            f"ends like the id of a row's sample ('-s' and a number from 2 to {MAX_SAMPLES}), "
            f"which with samples: {k} could be another row's sample; rename such ids"
        )
    return None


# --- the vote -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VoteSpec:
    """What is voted on: the answer's ``field`` (None: the plain answer text), as numbers or not."""

    field: str | None = None
    numeric: bool | None = None  # None: numbers when every valid sample is a number

    @classmethod
    def of(cls, response_format: Mapping[str, Any] | None, reference_field: str | None = None) -> VoteSpec:
        schema = (response_format or {}).get("json_schema", {}).get("schema") if response_format else None
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        if not isinstance(props, Mapping) or not props:
            return cls(None, None)
        name = reference_field if reference_field in props else _first_score_field(props)
        spec = props.get(name)
        types = spec.get("type") if isinstance(spec, Mapping) else None
        types = set(types) if isinstance(types, list) else {types}
        return cls(name, bool(types & {"integer", "number"}) and not (isinstance(spec, Mapping) and "enum" in spec))

    def value(self, record: Mapping[str, Any] | None) -> Any:
        """A sample's value to vote with, or None (failed, unparseable, or without the field)."""
        if not record or not record.get("ok"):
            return None
        content = record.get("content")
        if not isinstance(content, str):
            return None
        if self.field is None:
            text = content.strip()
            return text or None
        try:
            parsed = json.loads(content)
        except json.JSONDecodeError:
            return None
        v = parsed.get(self.field) if isinstance(parsed, dict) else None
        return None if v is None or isinstance(v, (dict, list)) else v


def _first_score_field(props: Mapping[str, Any]) -> str:
    for name, spec in props.items():
        if isinstance(spec, Mapping):
            types = spec.get("type")
            types = set(types) if isinstance(types, list) else {types}
            if "enum" in spec or types & {"integer", "number", "boolean"}:
                return str(name)
    return str(next(iter(props)))


@dataclass(frozen=True)
class Vote:
    """The vote of one row's samples: ``value`` (None when it failed), ``winner`` (the first
    sample whose value is the vote), ``agree`` (samples whose value is the vote), ``valid``
    (samples with a value), ``k``, and ``code``/``message`` when the vote failed."""

    value: Any
    winner: int | None
    agree: int
    valid: int
    k: int
    code: str | None = None
    message: str | None = None

    @property
    def share(self) -> float | None:
        """The share of the k samples that agree with the vote (None when it failed)."""
        return None if self.winner is None else round(self.agree / self.k, 4)


def vote(values: Sequence[Any], numeric: bool | None = None) -> Vote:
    """The vote of ``values`` (one per sample, None for a sample without a value).  Numbers
    (``numeric``, or None: when every value is one) take the median, which must be one of the
    values: with an even count the two middle values must be equal.  Other values take the most
    common one (text compared with case and surrounding space ignored).  A tie, or no value at
    all, fails as ``no_majority``."""
    k = len(values)
    valid = [(i, v) for i, v in enumerate(values) if v is not None]
    if not valid:
        return Vote(None, None, 0, 0, k, NO_MAJORITY, f"none of the {k} samples has an answer to vote with")
    nums = [as_number(v) for _i, v in valid]
    if numeric is None:
        numeric = all(n is not None for n in nums) and not any(isinstance(v, bool) for _i, v in valid)
    if numeric and all(n is not None for n in nums):
        return _median_vote(values, valid, nums)
    return _majority_vote(values, valid)


def _median_vote(values: Sequence[Any], valid: list[tuple[int, Any]], nums: list[float | None]) -> Vote:
    """The vote of numbers: their median, which must be one of them."""
    ordered = sorted(n for n in nums if n is not None)
    m = len(ordered)
    low, high = ordered[(m - 1) // 2], ordered[m // 2]
    if low != high:
        return _tie(values, valid, f"the middle values {_show(low)} and {_show(high)} differ")
    return _won(values, valid, [n == low for n in nums])


def _majority_vote(values: Sequence[Any], valid: list[tuple[int, Any]]) -> Vote:
    """The vote of categories: the most common (text compared as :func:`category_text`)."""
    norm = [category_text(v) for _i, v in valid]
    counts = Counter(norm).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        tied = [c for c, n in counts if n == counts[0][1]]
        return _tie(values, valid, f"{len(tied)} answers are as common as each other")
    return _won(values, valid, [x == counts[0][0] for x in norm])


def _won(values: Sequence[Any], valid: list[tuple[int, Any]], keys: list[bool]) -> Vote:
    """The vote won by the valid samples whose ``keys`` are true (the first of them is the winner)."""
    first = next(i for (i, _v), hit in zip(valid, keys, strict=True) if hit)
    return Vote(values[first], first, sum(keys), len(valid), len(values))


def _tie(values: Sequence[Any], valid: list[tuple[int, Any]], why: str) -> Vote:
    k = len(values)
    shown = ", ".join(_show(v) for _i, v in valid)
    return Vote(
        None,
        None,
        0,
        len(valid),
        k,
        NO_MAJORITY,
        f"the samples tie ({len(valid)} of {k} valid: {shown}): {why}; no answer is picked",
    )


def as_number(v: Any) -> float | None:
    """``v`` as a finite number, or None (a boolean is not a number)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    try:
        f = float(str(v).strip())
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def category_text(v: Any) -> str:
    """The text a category is counted (and a label compared) by: numbers as numbers, words case-folded."""
    if isinstance(v, bool):
        return str(v).lower()
    n = as_number(v)
    if n is not None:
        return str(int(n)) if n.is_integer() else repr(n)
    return str(v).strip().casefold()


def _show(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)


# --- the result row -----------------------------------------------------------------------------


def voted_values(
    cols: Any,
    outcomes: Sequence[Mapping[str, Any] | None],
    errors: Sequence[str | None],
    spec: VoteSpec,
    json_values: bool,
) -> dict[str, Any]:
    """The added cells of a row with k samples (``cols``: its
    :class:`~batchgrader.pipeline.outbox.AddedColumns`, with ``samples``; ``outcomes`` and
    ``errors``: each sample's stored result and row error, as a single row's are given to
    :func:`~batchgrader.pipeline.outbox.result_values`).  The answer and its fields are those of
    the first sample that has the voted value; the token cells sum what every sample was billed
    in this job; a failed vote leaves the answer empty with ``no_majority`` (or, when no sample
    was answered, the first sample's own error) in the error column."""
    from batchgrader.pipeline.outbox import result_values

    values = [spec.value(o) for o in outcomes]
    v = vote(values, spec.numeric)
    if v.winner is not None:
        out = result_values(cols, outcomes[v.winner], None, json_values)
    else:
        out = result_values(cols, None, _vote_error(v, outcomes, errors), json_values)
    blank: Any = None if json_values else ""
    billed = [b for b in (_billed(o) for o in outcomes) if b is not None]
    if billed:
        pt, ct = sum(b[0] for b in billed), sum(b[1] for b in billed)
        out[cols.input_tokens] = pt if json_values else str(pt)
        out[cols.output_tokens] = ct if json_values else str(ct)
    by = [a for a in dict.fromkeys(_answered_by(o) for o in outcomes) if a]
    out[cols.answered_by] = "+".join(by) if by else blank
    out.update(_sample_cells(cols.samples, values, v, json_values))
    return out


def _vote_error(v: Vote, outcomes: Sequence[Mapping[str, Any] | None], errors: Sequence[str | None]) -> str:
    """The error cell of a failed vote: ``no_majority``, or, when no sample was answered, the
    first sample's own error."""
    own = next((_error_of(o, e) for o, e in zip(outcomes, errors, strict=True) if _error_of(o, e)), None)
    return own if v.valid == 0 and own else f"{NO_MAJORITY}: {v.message}"


def _sample_cells(columns: tuple[str, ...], values: list[Any], v: Vote, json_values: bool) -> dict[str, Any]:
    """The samples' cells: every sample's value, the share that agrees with the vote, the count of valid ones."""
    blank: Any = None if json_values else ""
    listed, agree, valid = columns
    share = v.share
    return {
        listed: json.dumps(values, ensure_ascii=False),
        agree: (share if json_values else f"{share:g}") if share is not None else blank,
        valid: v.valid if json_values else str(v.valid),
    }


def _error_of(outcome: Mapping[str, Any] | None, error: str | None) -> str | None:
    if error:
        return error
    if outcome is not None and not outcome.get("ok"):
        return f"{outcome.get('error_code') or 'error'}: {outcome.get('error_message') or ''}".strip()
    return None


def _billed(outcome: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """(input, output) tokens a sample was billed in this job, or None when it was not answered."""
    if outcome is None or not (outcome.get("ok") or outcome.get("status_code") == 200):
        return None
    if outcome.get("reused") in BILLED_ELSEWHERE:
        return 0, 0
    return int(outcome.get("prompt_tokens") or 0), int(outcome.get("completion_tokens") or 0)


def _answered_by(outcome: Mapping[str, Any] | None) -> str | None:
    if outcome is None or not (outcome.get("ok") or outcome.get("status_code") == 200):
        return None
    return ANSWERED_BY.get(outcome.get("reused"), "batch")
