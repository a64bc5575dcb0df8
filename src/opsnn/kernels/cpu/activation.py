"""CPU activation kernels (numba): parallel over elements, serial below a size threshold.

Each kernel takes flat contiguous arrays; ``PARALLEL_MIN`` decides in prepare whether a
launch is worth the thread fan-out.
"""
from __future__ import annotations

import numba as nb
import numpy as np

#: below this many elements the serial variant runs (thread fan-out costs ~10 µs)
PARALLEL_MIN = 1 << 15


@nb.njit(parallel=True, nogil=True, cache=True)
def relu_parallel(x, out):
    for i in nb.prange(x.size):
        v = x[i]
        out[i] = v if v > 0 else 0


@nb.njit(nogil=True, cache=True)
def relu_serial(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = v if v > 0 else 0


def relu(ins, outs, attrs, plan, ws):
    x = ins[0].reshape(-1)
    out = outs[0].reshape(-1)
    (relu_parallel if plan else relu_serial)(x, out)


def parallel_plan(ctx) -> bool:
    """Plan for flat maps: run the parallel variant for large tensors."""
    return int(np.prod(ctx.shape(0))) >= PARALLEL_MIN
