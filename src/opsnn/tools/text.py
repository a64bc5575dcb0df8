"""Plain-text tables for command-line reports (rich, no colour, no borders)."""

from __future__ import annotations

import argparse


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


def shape_arg(text: str) -> tuple[str, tuple]:
    """An argparse type for ``--shape NAME=D0,D1,...`` (``x`` also separates dims: ``x=1x3x224x224``)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--shape wants NAME=D0,D1,..., got {text!r}")
    name, dims = text.split("=", 1)
    try:
        shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: dims must be integers") from None
    if any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"--shape {text!r}: dims must be >= 0")
    return name, shape
