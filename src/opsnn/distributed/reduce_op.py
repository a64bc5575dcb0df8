"""``ReduceOp``: how a reduction collective combines the ranks' tensors (torch.distributed's names)."""

from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    """``SUM``, ``AVG`` (the sum divided by the world size), ``MAX``, ``MIN``, ``PRODUCT``, and the
    bitwise ``BAND`` / ``BOR`` / ``BXOR`` for integer and bool tensors."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PRODUCT = "product"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"
