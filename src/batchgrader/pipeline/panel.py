"""The result of a judge panel: the judges' result files combined row by row with the input.

Each judge's job wrote its result (the input's rows in order, in the input's format) into the
panel's work folder.  The panel's result is the input's columns, then one column per judge
(``<output_column>_<judge>``: the value the judge's answer is voted with, as
:class:`~batchgrader.pipeline.samples.VoteSpec` picks it: ``reference_field``, else the schema's
first score field, else the answer text), the consensus (``<output_column>``: the judges' vote,
majority or median, :func:`~batchgrader.pipeline.samples.vote`), the share of the judges that
agree with it (``<output_column>_agreement``) and ``error``; then, judge by judge, what that
judge's result has for the row: each field of its schema, its token columns, its error, how the
row was answered and, with samples, its samples (``<column>_<judge>``: ``reason_mini``,
``input_tokens_mini``, ``samples_mini``, ...).

What counts as failed: as in every result file, a row whose ``error`` cell says why it has no
answer.  A panel row has none when no judge answered it (``no_answer: ...`` with each judge's
error) or when the judges' vote ties (``no_majority: the judges tie (...)``: no answer is
picked, as a tie among samples fails closed).  A judge whose job failed, or whose row failed, is
left out of that row's vote and its cells are empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from batchgrader.pipeline.samples import NO_MAJORITY, VoteSpec, vote
from batchgrader.pipeline.tables import TableWriter, defuse_formula, open_table, text_of

#: the error code of a panel row that no judge answered (the one kind of failed panel row)
NO_ANSWER = "no_answer"

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Judge:
    """One judge of a panel: its profile's name, its result file (None: its job wrote none), the
    column of that file holding its answer, and the schema the answer follows."""

    name: str
    result_path: str | None
    output_column: str
    response_format: Mapping[str, Any] | None
    samples: int = 1

    def columns(self, input_columns: Sequence[str]) -> tuple[str, str]:
        """The answer and error columns of its result file (named as the input's columns allow)."""
        cols = self.added(input_columns)
        return cols.output, cols.error

    def added(self, input_columns: Sequence[str]) -> Any:
        """The columns its job added to its result file (:class:`~batchgrader.pipeline.outbox.AddedColumns`)."""
        from batchgrader.pipeline.outbox import added_columns

        return added_columns(input_columns, self.output_column, self.response_format, self.samples)

    def kept(self, input_columns: Sequence[str]) -> list[tuple[str, str]]:
        """``(name, column of its result)`` of each column of its result the panel's result keeps:
        its schema's fields, its tokens, its error, how the row was answered, and its samples."""
        from batchgrader.pipeline.outbox import SAMPLE_COLUMNS

        cols = self.added(input_columns)
        out = list(cols.fields)
        out += [("input_tokens", cols.input_tokens), ("output_tokens", cols.output_tokens), ("error", cols.error)]
        out.append(("answered_by", cols.answered_by))
        out += list(zip(SAMPLE_COLUMNS, cols.samples, strict=False))
        return out


@dataclass(frozen=True)
class PanelColumns:
    judges: tuple[str, ...]
    consensus: str
    agreement: str
    error: str
    details: tuple[tuple[str, ...], ...] = ()  # per judge: the columns of its result kept (Judge.kept)

    def core(self) -> list[str]:
        """The per-judge values, the consensus, the agreement and the error (what the report reads)."""
        return [*self.judges, self.consensus, self.agreement, self.error]

    def written(self) -> list[str]:
        return [*self.core(), *(c for d in self.details for c in d)]


def panel_columns(
    input_columns: Sequence[str], output_column: str, judges: Sequence[str], details: Sequence[Sequence[str]] = ()
) -> PanelColumns:
    """The added columns' names (a name the input has already gets ``bg_`` in front, as elsewhere);
    ``details``: per judge, the names of its result's columns kept (each becomes ``<name>_<judge>``)."""
    taken = set(input_columns)

    def name(n: str) -> str:
        while n in taken:
            n = "bg_" + n
        taken.add(n)
        return n

    per_judge = tuple(name(f"{output_column}_{j}") for j in judges)
    consensus, agreement, error = name(output_column), name(f"{output_column}_agreement"), name("error")
    kept = tuple(tuple(name(f"{c}_{j}") for c in cols) for j, cols in zip(judges, details, strict=False))
    return PanelColumns(per_judge, consensus, agreement, error, kept)


def find_panel_columns(header: Sequence[str], output_column: str, judges: Sequence[str]) -> tuple[int, PanelColumns] | None:
    """Where a panel's result with ``header`` has its added columns: ``(how many input columns,
    their names)`` (the judges' kept columns follow them), or None when it is not laid out as a
    panel's.  A result written before the judges' columns were kept (no columns after ``error``)
    is found too."""
    n = len(judges) + 3
    for i in range(len(header) - n, -1, -1):
        cols = panel_columns(header[:i], output_column, judges)
        if cols.core() == list(header[i : i + n]):
            return i, cols
    return None


def cell(v: Any, json_values: bool) -> Any:
    """A value as a typed format keeps it, or as text (a whole number without ``.0``)."""
    if v is None:
        return None if json_values else ""
    if json_values:
        return v
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


@contextlib.contextmanager
def _judge_rows(judge: Judge, sheet: str | None) -> Iterator[Iterator[Mapping[str, Any] | None]]:
    """The rows of a judge's result file (an endless run of None when it wrote none)."""
    if judge.result_path is None or not Path(judge.result_path).exists():

        def nothing() -> Iterator[None]:
            while True:
                yield None

        yield nothing()
        return
    with open_table(Path(judge.result_path), sheet=sheet, validated=True) as reader:
        yield (row.values for row in reader)


def judged_value(
    judge: Judge, spec_field: str | None, row: Mapping[str, Any] | None, columns: tuple[str, str]
) -> tuple[Any, str | None]:
    """A judge's value for one row to vote with (None: none) and its error text, if any
    (``columns``: the answer and error columns of its result)."""
    if row is None:
        return None, "the judge's job wrote no result"
    output, error = columns
    err = text_of(row.get(error)) if row.get(error) not in (None, "") else None
    content = row.get(output)
    if err or content in (None, ""):
        return None, err
    spec = VoteSpec.of(judge.response_format, spec_field)
    return spec.value({"ok": True, "content": content if isinstance(content, str) else text_of(content)}), None


def write_panel_result(
    f: IO[bytes],
    input_path: Path,
    judges: Sequence[Judge],
    output_column: str,
    *,
    reference_field: str | None = None,
    sheet: str | None = None,
    encoding: str = "utf-8",
    formula_guard: bool = True,
) -> tuple[int, int]:
    """Write the panel's result to ``f``; returns (rows answered, rows failed: without an answer)."""
    from batchgrader.pipeline.formats.registry import format_spec
    from batchgrader.pipeline.outbox import added_column_types

    numeric = VoteSpec.of(judges[0].response_format, reference_field).numeric if judges else None
    succeeded = failed = 0
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(open_table(input_path, sheet=sheet, encoding=encoding, validated=True))
        streams = [stack.enter_context(_judge_rows(j, sheet)) for j in judges]
        kept = [j.kept(reader.columns) for j in judges]
        cols = panel_columns(reader.columns, output_column, [j.name for j in judges], [[n for n, _c in k] for k in kept])
        own = [j.columns(reader.columns) for j in judges]
        spec = format_spec(reader.fmt)
        json_values, guard = spec.typed_cells, formula_guard and spec.formula_guard
        types = {c: "string" for c in cols.written()}
        types[cols.agreement] = "double"
        for j, k, names in zip(judges, kept, cols.details, strict=True):  # as typed as in the judge's own result
            theirs = added_column_types(j.added(reader.columns), j.response_format)
            types.update({name: theirs.get(c, "string") for (_n, c), name in zip(k, names, strict=True)})
        w = stack.enter_context(TableWriter(f, reader, cols.written(), column_types=types))
        for row in reader:
            rows = [next(s, None) for s in streams]
            got = [judged_value(j, reference_field, r, c) for j, r, c in zip(judges, rows, own, strict=True)]
            values = [v for v, _e in got]
            v = vote(values, numeric)
            added: dict[str, Any] = {c: cell(x, json_values) for c, x in zip(cols.judges, values, strict=True)}
            added[cols.consensus] = cell(v.value, json_values)
            added[cols.agreement] = (
                (v.share if json_values else f"{v.share:g}") if v.share is not None else cell(None, json_values)
            )
            added[cols.error] = cell(_row_error(v, got, judges), json_values)
            for r, k, names in zip(rows, kept, cols.details, strict=True):
                for (_n, c), name in zip(k, names, strict=True):
                    added[name] = _copied(r.get(c) if r is not None else None, json_values)
            if guard:  # the models' answers are attacker-influenced; input cells stay unchanged
                added = {k: defuse_formula(x) if type(x) is str and x and x[0] in _FORMULA_START else x for k, x in added.items()}
            w.write({**row.values, **added})
            if v.winner is None:  # no answer: no judge answered, or the judges tie (the row's error says which)
                failed += 1
            else:
                succeeded += 1
    return succeeded, failed


def _copied(v: Any, json_values: bool) -> Any:
    """A judge's cell as the panel's result keeps it (an empty cell: empty)."""
    if v is None or (isinstance(v, str) and v == ""):
        return None if json_values else ""
    return v if json_values or isinstance(v, str) else cell(v, False)


def _row_error(v: Any, got: Sequence[tuple[Any, str | None]], judges: Sequence[Judge]) -> str | None:
    if v.winner is not None:
        return None
    if v.valid == 0:
        errors = [f"{j.name}: {e}" for j, (_x, e) in zip(judges, got, strict=True) if e]
        return f"{NO_ANSWER}: no judge answered" + (f" ({'; '.join(errors)})" if errors else "")
    shown = ", ".join(f"{j.name}={cell(x, False)}" for j, (x, _e) in zip(judges, got, strict=True) if x is not None)
    return f"{NO_MAJORITY}: the judges tie ({shown}); no answer is picked"


def is_failed_row(error: str) -> bool:
    """Whether a panel row whose ``error`` cell holds ``error`` failed: it has no answer (no judge
    answered it, or the judges tie), as any result row with an error."""
    return bool(error.strip())


def is_tie(error: str) -> bool:
    """Whether a panel row's ``error`` is a tie among judges that answered (``no_majority``; a
    result written before ``no_answer`` said ``no_majority: no judge answered`` for a row none answered)."""
    return error.startswith(f"{NO_MAJORITY}:") and not error.startswith(f"{NO_MAJORITY}: no judge answered")


def count_panel_result(path: Path, output_column: str, judges: Sequence[str], sheet: str | None = None) -> tuple[int, int]:
    """(rows answered, rows failed) of a panel result written before, as :func:`write_panel_result`
    counts them."""
    succeeded = failed = 0
    with open_table(path, sheet=sheet, validated=True) as reader:
        found = find_panel_columns(list(reader.columns), output_column, judges)
        error = found[1].error if found else reader.columns[-1]
        for row in reader:
            if is_failed_row(text_of(row.values.get(error))):
                failed += 1
            else:
                succeeded += 1
    return succeeded, failed
