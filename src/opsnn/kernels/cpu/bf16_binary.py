"""Same-shape binary elementwise ops on bfloat16 storage: blocks of both inputs widened to float32,
combined, rounded to nearest even once (what the fp32 adapter gives, without its whole-tensor
float32 copies). Residual Adds and gradient accumulations of bf16 training are this case.

Comparisons (``A > B`` ...) widen the same way and write bool; ``B`` may be one element (the
``x > 0`` mask of a Relu gradient). Widening is exact, so they equal the float32 comparison,
NaN compares false."""

from __future__ import annotations

import numba as nb
import numpy as np

from .gemm import KIND_BF16, _narrow, _widen

_NJIT = dict(nogil=True, cache=True, error_model="numpy")
BLOCK = 4096  # elements widened at a time (two 16 KB float32 buffers)
PARALLEL_MIN = 1 << 18

ADD = 0
# comparisons, the codes of kernels.cpu.elementwise
EQ, LT, LE, GT, GE = range(5)


@nb.njit(**_NJIT)
def _range(a, b, out, lo, hi, op):
    au = np.empty(BLOCK, np.uint32)
    bu = np.empty(BLOCK, np.uint32)
    af, bf = au.view(np.float32), bu.view(np.float32)
    cu = np.empty(BLOCK, np.uint32)
    cf = cu.view(np.float32)
    for s in range(lo, hi, BLOCK):
        n = min(hi, s + BLOCK) - s
        _widen(a[s : s + n], au[:n], af[:n], KIND_BF16)
        _widen(b[s : s + n], bu[:n], bf[:n], KIND_BF16)
        if op == ADD:
            for i in range(n):
                cf[i] = af[i] + bf[i]
        _narrow(cf[:n], cu[:n], out[s : s + n], KIND_BF16)


@nb.njit(parallel=True, **_NJIT)
def _parallel(a, b, out, op, tasks):
    n = a.size
    for t in nb.prange(tasks):
        _range(a, b, out, t * n // tasks, (t + 1) * n // tasks, op)


def plan(size: int) -> int:
    """Parallel tasks (0: one serial pass)."""
    threads = nb.get_num_threads()
    return 4 * threads if size >= PARALLEL_MIN and threads > 1 else 0


def binary_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray, op: int, tasks: int) -> None:
    """``out = a (op) b`` for contiguous bfloat16 arrays of one shape."""
    a, b, out = a.reshape(-1).view(np.uint16), b.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint16)
    if tasks:
        _parallel(a, b, out, op, tasks)
    elif a.size:
        _range(a, b, out, 0, a.size, op)


@nb.njit(**_NJIT)
def _compare_range(a, b, out, lo, hi, op):
    au = np.empty(BLOCK, np.uint32)
    bu = np.empty(BLOCK, np.uint32)
    af, bf = au.view(np.float32), bu.view(np.float32)
    scalar = b.size == 1
    if scalar:
        bu[:] = np.uint32(b[0]) << np.uint32(16)
    for s in range(lo, hi, BLOCK):
        n = min(hi, s + BLOCK) - s
        _widen(a[s : s + n], au[:n], af[:n], KIND_BF16)
        if not scalar:
            _widen(b[s : s + n], bu[:n], bf[:n], KIND_BF16)
        o = out[s : s + n]
        if op == GT:
            for i in range(n):
                o[i] = af[i] > bf[i]
        elif op == GE:
            for i in range(n):
                o[i] = af[i] >= bf[i]
        elif op == LT:
            for i in range(n):
                o[i] = af[i] < bf[i]
        elif op == LE:
            for i in range(n):
                o[i] = af[i] <= bf[i]
        else:
            for i in range(n):
                o[i] = af[i] == bf[i]


@nb.njit(parallel=True, **_NJIT)
def _compare_parallel(a, b, out, op, tasks):
    n = a.size
    for t in nb.prange(tasks):
        _compare_range(a, b, out, t * n // tasks, (t + 1) * n // tasks, op)


def compare_bf16(a: np.ndarray, b: np.ndarray, out: np.ndarray, op: int, tasks: int) -> None:
    """``out = a (op) b`` (bool) for contiguous bfloat16 ``a`` and ``b`` of ``a``'s size or one
    element; ``out`` has ``a``'s size."""
    a, b, out = a.reshape(-1).view(np.uint16), b.reshape(-1).view(np.uint16), out.reshape(-1)
    if tasks:
        _compare_parallel(a, b, out, op, tasks)
    elif a.size:
        _compare_range(a, b, out, 0, a.size, op)
