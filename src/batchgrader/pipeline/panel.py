"""The result of a judge panel: the judges' result files combined row by row with the input.

Each judge's job wrote its result (the input's rows in order, in the input's format) into the
panel's work folder.  The panel's result is the input's columns, then one column per judge
(``<output_column>_<judge>``: the value the judge's answer is voted with, as
:class:`~batchgrader.pipeline.samples.VoteSpec` picks it: ``reference_field``, else the schema's
first score field, else the answer text), the consensus (``<output_column>``: the judges' vote,
majority or median, :func:`~batchgrader.pipeline.samples.vote`), the share of the judges that
agree with it (``<output_column>_agreement``) and ``error`` (a tie or no answer at all:
``no_majority``, never a silent pick).  A judge whose job failed, or whose row failed, is left
out of that row's vote and its cell is empty.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from batchgrader.pipeline.samples import NO_MAJORITY, VoteSpec, vote
from batchgrader.pipeline.tables import TableWriter, defuse_formula, open_table, text_of

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
        from batchgrader.pipeline.outbox import added_columns

        cols = added_columns(input_columns, self.output_column, self.response_format, self.samples)
        return cols.output, cols.error


@dataclass(frozen=True)
class PanelColumns:
    judges: tuple[str, ...]
    consensus: str
    agreement: str
    error: str

    def written(self) -> list[str]:
        return [*self.judges, self.consensus, self.agreement, self.error]


def panel_columns(input_columns: Sequence[str], output_column: str, judges: Sequence[str]) -> PanelColumns:
    """The added columns' names (a name the input has already gets ``bg_`` in front, as elsewhere)."""
    taken = set(input_columns)

    def name(n: str) -> str:
        while n in taken:
            n = "bg_" + n
        taken.add(n)
        return n

    per_judge = tuple(name(f"{output_column}_{j}") for j in judges)
    return PanelColumns(per_judge, name(output_column), name(f"{output_column}_agreement"), name("error"))


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
    """Write the panel's result to ``f``; returns (rows with a consensus, rows without)."""
    from batchgrader.pipeline.formats.registry import format_spec

    numeric = VoteSpec.of(judges[0].response_format, reference_field).numeric if judges else None
    succeeded = failed = 0
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(open_table(input_path, sheet=sheet, encoding=encoding, validated=True))
        streams = [stack.enter_context(_judge_rows(j, sheet)) for j in judges]
        cols = panel_columns(reader.columns, output_column, [j.name for j in judges])
        own = [j.columns(reader.columns) for j in judges]
        spec = format_spec(reader.fmt)
        json_values, guard = spec.typed_cells, formula_guard and spec.formula_guard
        types = {c: "string" for c in cols.written()}
        types[cols.agreement] = "double"
        w = stack.enter_context(TableWriter(f, reader, cols.written(), column_types=types))
        for row in reader:
            got = [judged_value(j, reference_field, next(s, None), c) for j, s, c in zip(judges, streams, own, strict=True)]
            values = [v for v, _e in got]
            v = vote(values, numeric)
            added: dict[str, Any] = {c: cell(x, json_values) for c, x in zip(cols.judges, values, strict=True)}
            added[cols.consensus] = cell(v.value, json_values)
            added[cols.agreement] = (
                (v.share if json_values else f"{v.share:g}") if v.share is not None else cell(None, json_values)
            )
            added[cols.error] = cell(_row_error(v, got, judges), json_values)
            if guard:  # the models' answers are attacker-influenced; input cells stay unchanged
                added = {k: defuse_formula(x) if type(x) is str and x and x[0] in _FORMULA_START else x for k, x in added.items()}
            w.write({**row.values, **added})
            if v.winner is None:
                failed += 1
            else:
                succeeded += 1
    return succeeded, failed


def _row_error(v: Any, got: Sequence[tuple[Any, str | None]], judges: Sequence[Judge]) -> str | None:
    if v.winner is not None:
        return None
    if v.valid == 0:
        errors = [f"{j.name}: {e}" for j, (_x, e) in zip(judges, got, strict=True) if e]
        return f"{NO_MAJORITY}: no judge answered" + (f" ({'; '.join(errors)})" if errors else "")
    shown = ", ".join(f"{j.name}={cell(x, False)}" for j, (x, _e) in zip(judges, got, strict=True) if x is not None)
    return f"{NO_MAJORITY}: the judges tie ({shown}); no answer is picked"


def count_panel_result(path: Path, sheet: str | None = None) -> tuple[int, int]:
    """(rows with a consensus, rows without) of a panel result written before (its last column is
    the error)."""
    succeeded = failed = 0
    with open_table(path, sheet=sheet, validated=True) as reader:
        error = reader.columns[-1]
        for row in reader:
            if row.values.get(error) in (None, ""):
                succeeded += 1
            else:
                failed += 1
    return succeeded, failed
