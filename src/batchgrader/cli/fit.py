"""Column fitting for the terminal tables: ids, states, counts and amounts are never cut.

Each column says how it may give way when the terminal is too narrow for every column at its
natural width: a *whole* column never does (it keeps its natural width: an id, a state, a count,
an amount); a *shrinkable* column may lose characters down to ``min_width`` (shown with an
ellipsis: a file or profile name); a *droppable* column may be left out entirely (then the table
says which columns it left out).  Columns give way in the order of their ``give_way`` rank, lowest
first: each is shrunk as far as it may, then dropped if it may be, until the table fits.  When
the table is still too wide, a column marked ``cut_middle`` (the job ids) is cut in the middle,
down to :data:`MIDDLE_MIN`, keeping the ends of each line (``x-52fbb…-2-j1``: a panel's judges
stay told apart by their suffix), rather than rich cutting every column's end.

The width arithmetic is rich's for a table with ``box.SIMPLE_HEAD``, ``pad_edge=False`` and
``collapse_padding=True`` (one edge character each side, two between columns): :func:`table_width`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

NEVER = 10**6  # give_way rank of a column that never gives way
MIDDLE_MIN = 12  # the narrowest a cut_middle column is cut to


@dataclass
class Col:
    """A column and its cells, with how it may give way (see the module docstring)."""

    header: str
    cells: list[Any] = field(default_factory=list)
    justify: str = "left"
    give_way: int = NEVER  # lower gives way first; NEVER: a whole column
    min_width: int | None = None  # may shrink (with an ellipsis) down to this width
    droppable: bool = False  # may be left out once shrunk as far as it may
    style: str = ""
    footer: str = ""
    width: int = 0  # the width chosen by fit()
    cut_middle: bool = False  # when nothing else gives way: cut in the middle, keeping each line's ends

    def natural(self) -> int:
        """The widest line of the header, footer and cells."""
        lines = [self.header, self.footer]
        for c in self.cells:
            lines.extend((c.plain if isinstance(c, Text) else str(c)).split("\n"))
        return max(cell_len(s) for s in lines)


def table_width(widths: Sequence[int]) -> int:
    """The printed width of a SIMPLE_HEAD table without edge padding, collapsed padding."""
    return sum(widths) + 2 + 2 * max(0, len(widths) - 1)


def fit(columns: Sequence[Col], width: int) -> tuple[list[Col], list[Col]]:
    """The columns kept (with ``width`` set) and the columns left out, for a terminal of ``width``."""
    kept = list(columns)
    for c in kept:
        c.width = c.natural()
    for col in sorted((c for c in columns if c.give_way < NEVER), key=lambda c: c.give_way):
        over = table_width([c.width for c in kept]) - width
        if over <= 0:
            break
        if col.min_width is not None:
            col.width = max(col.min_width, col.width - over)
            over = table_width([c.width for c in kept]) - width
        if over > 0 and col.droppable:
            kept.remove(col)
    over = table_width([c.width for c in kept]) - width
    for col in (c for c in kept if c.cut_middle and over > 0):
        cut = min(over, max(0, col.width - MIDDLE_MIN))
        col.width -= cut
        over -= cut
    dropped = [c for c in columns if c not in kept]
    return kept, dropped


def fitted_table(columns: Sequence[Col], width: int, title: str | None = None, footer: bool = False) -> tuple[Table, list[Col]]:
    """A rich table of the columns that fit ``width`` (their cells as rows), and the columns left out."""
    kept, dropped = fit(columns, width)
    t = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        expand=False,
        collapse_padding=True,
        show_footer=footer,
    )
    for c in kept:
        shrunk = c.width < c.natural()
        t.add_column(
            c.header,
            justify=c.justify,  # type: ignore[arg-type]
            width=c.width,
            no_wrap=True,
            overflow="ellipsis" if shrunk else "fold",
            style=c.style,
            footer=c.footer,
        )
    n = max((len(c.cells) for c in kept), default=0)
    for i in range(n):
        t.add_row(*(_middle_cut(_cell(c.cells[i]), c.width) if c.cut_middle else _cell(c.cells[i]) for c in kept))
    return t, dropped


def _middle_cut(text: Text, width: int) -> Text:
    """Each line of ``text`` longer than ``width`` cut in the middle: its start, an ellipsis, its end
    (the longer part, where ids differ: ``-2-j1``)."""
    lines = text.split("\n")
    out = []
    for line in lines:
        if cell_len(line.plain) <= width:
            out.append(line)
            continue
        tail = width // 2
        head = width - 1 - tail
        out.append(Text.assemble(line[:head], "…", line[len(line) - tail :]))
    return Text("\n").join(out)


def _cell(v: Any) -> Text:
    """A cell as Text: file names, errors and ids are data, never rich markup ("[x]" stays)."""
    return v if isinstance(v, Text) else Text("-" if v is None else str(v))
