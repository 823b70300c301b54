"""Markdown pieces the generated pages share."""

from __future__ import annotations

from collections.abc import Iterable


def cell(text: object) -> str:
    """`text` as one table cell: pipes escaped, lines joined (a cell cannot hold a line break)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """`text` as inline code in a table cell (backticks inside it widen the fence)."""
    value = cell(text)
    if not value:
        return ""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """A Markdown table; the rows' cells are written as given (escape them with `cell`/`code`)."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
