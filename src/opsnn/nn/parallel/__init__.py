"""``opsnn.nn.parallel``: data-parallel training across processes (``DistributedDataParallel``),
over the collectives of ``opsnn.distributed`` (imported when a wrapper is built, not before)."""

from .distributed import (
    DistributedDataParallel,
    ModelMismatchError,
    ReducerStateError,
    UnusedParameterError,
    assign_buckets,
)

DDP = DistributedDataParallel

__all__ = [
    "DDP",
    "DistributedDataParallel",
    "ModelMismatchError",
    "ReducerStateError",
    "UnusedParameterError",
    "assign_buckets",
]
