"""Magnitude bounds handed from a kernel to the kernels that read its output, within one bound plan.

A kernel that knows, on every run, an upper bound of ``max |y|`` for an output (a convolution
whose inputs' bounds it knows: ``max|X| * max sum|W| + max|B| + max|Z|``) publishes a cell for
``y`` while a compiled plan binds its steps; a kernel bound later in the same plan that reads
``y`` looks the cell up and uses the bound instead of reading ``y``. Steps run in the order they
were bound, so the producer has written the cell by the time its consumers read it. A cell is
keyed by the array object the plan hands to the producer and to its consumers (one per value);
outside :func:`binding` (eager calls, steps bound per run) nothing is published or found.

A cell holds ``[bound]``: a float, ``None`` while unknown; ``inf`` when the producer could not
bound its output (a NaN or an Inf, or a bound past float32's range).
"""

from __future__ import annotations

import contextlib
import threading

_local = threading.local()


@contextlib.contextmanager
def binding(cells: dict | None = None, grow: bool = True):
    """The scope of one plan's binding: cells published inside it are found only inside it. ``cells``:
    a plan's own table, entered again to bind its per-run steps; ``grow=False`` publishes no new cell
    there (those steps' outputs are fresh arrays each run), it only hands out the ones made at plan time."""
    prev = getattr(_local, "scope", None)
    _local.scope = ({} if cells is None else cells, grow)
    try:
        yield _local.scope[0]
    finally:
        _local.scope = prev


def _cells(new: bool = False):
    scope = getattr(_local, "scope", None)
    if scope is None or (new and not scope[1]):
        return None
    return scope[0]


def publish(arr) -> list | None:
    """The cell for ``arr``'s bound (a new one unless the plan made it already; None outside
    :func:`binding`): the caller writes it on every run."""
    cell = lookup(arr)
    if cell is not None:
        return cell
    cells = _cells(new=True)
    if cells is None or arr is None:
        return None
    cell = [None]
    cells[id(arr)] = (arr, cell)  # the array kept beside its id: an id is never reused while bound
    return cell


def lookup(arr) -> list | None:
    """The cell a kernel bound earlier in this plan publishes for ``arr``, or None."""
    cells = _cells()
    if cells is None or arr is None:
        return None
    hit = cells.get(id(arr))
    return hit[1] if hit is not None and hit[0] is arr else None


def share(src, dst) -> None:
    """``dst``'s values are values of ``src`` (max pooling): ``dst`` gets ``src``'s cell."""
    cell = lookup(src)
    cells = _cells(new=True)
    if cell is not None and cells is not None and dst is not None:
        cells[id(dst)] = (dst, cell)


def forget(arr) -> None:
    """``arr`` gets a new writer: a bound published for it before no longer holds."""
    cells = _cells()
    if cells is not None and arr is not None:
        cells.pop(id(arr), None)


def known(cell) -> float | None:
    """The finite bound in ``cell``, or None (no cell, not written, or not finite)."""
    if cell is None:
        return None
    b = cell[0]
    return b if b is not None and b < float("inf") else None
