"""Print a rich table so that no figure is lost, whatever the output.

rich fits a table to the console's width by squeezing its wrappable columns, down to nothing: a
comparison table piped to a file (80 columns) or shown on a terminal narrower than the table
printed its row names and empty columns. Here the boxed table is printed only on a terminal wide
enough for it. Anywhere else the same cells come as plain aligned columns: one line per row when
the output is not a terminal (a file, `grep`, `awk`), and on a narrow terminal folded into groups
of columns that fit, each group led by the first (row-name) column.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

_GAP = 2  # spaces between two plain columns


def print_table(table: Table, console: Console) -> None:
    """Print `table` on `console`: boxed if the terminal is wide enough, plain columns otherwise."""
    headers = [_text(column.header) for column in table.columns]
    cells = [[_text(cell) for cell in column.cells] for column in table.columns]
    widths = [
        max([cell_len(header), *map(cell_len, column)]) for header, column in zip(headers, cells, strict=True)
    ]
    boxed_width = sum(widths) + 3 * len(widths) + 1  # a space each side of a cell, a bar between two
    if console.is_terminal and boxed_width <= console.width:
        console.print(table)
        return
    right = [column.justify == "right" for column in table.columns]
    rows = [list(row) for row in zip(*cells, strict=True)]
    if table.title:
        console.out(_text(table.title), highlight=False)
    groups = _fold(widths, console.width if console.is_terminal else None)
    for index, group in enumerate(groups):
        if index:
            console.out("", highlight=False)
        pick = [0, *group]
        lines = [
            [headers[i] for i in pick],
            ["-" * widths[i] for i in pick],
            *([row[i] for i in pick] for row in rows),
        ]
        for line in lines:
            console.out(_join(line, [widths[i] for i in pick], [right[i] for i in pick]), highlight=False)


def _fold(widths: Sequence[int], limit: int | None) -> list[list[int]]:
    """Columns 1.. in groups whose line (led by column 0) fits `limit`; one group when unlimited.
    A column too wide for any group gets one of its own."""
    groups: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(widths)):
        if limit is not None and groups[-1] and used + _GAP + widths[i] > limit:
            groups.append([])
            used = widths[0]
        groups[-1].append(i)
        used += _GAP + widths[i]
    return groups


def _join(cells: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    padded = (
        " " * (width - cell_len(cell)) + cell if is_right else cell + " " * (width - cell_len(cell))
        for cell, width, is_right in zip(cells, widths, right, strict=True)
    )
    return (" " * _GAP).join(padded).rstrip()


def _text(cell: object) -> str:
    """A cell's characters: the tables here hold strings or rich Text."""
    return cell.plain if isinstance(cell, Text) else str(cell)
