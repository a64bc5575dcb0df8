"""Plain-text tables for command-line reports (rich, no colour, no borders)."""
from __future__ import annotations


def table(rows: list, header: list, width: int = 120) -> str:
    """``rows`` (lists of cells, any type) under ``header`` as aligned plain text."""
    from rich.console import Console
    from rich.table import Table

    t = Table(*header, show_edge=False, pad_edge=False, box=None)
    for row in rows:
        t.add_row(*[str(c) for c in row])
    console = Console(width=width, force_terminal=False, no_color=True)
    with console.capture() as cap:
        console.print(t)
    return cap.get().rstrip()
