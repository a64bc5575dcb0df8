"""CPU elementwise kernels: numba maps, broadcasting binary ops, comparisons, Where, Clip; numpy
kernels for the rarely-hot logic, bitwise and cast ops.

Broadcasting is planned once, at prepare time (:func:`plan_layout`): the output shape loses its
size-1 dims, adjacent dims merge wherever every input is laid out contiguously across them, and
each input gets per-dim element strides (0 on a broadcast dim). The kernels walk the output row
by row (a row is the innermost merged dim; rows group in planes so that a row's offsets are a
multiply away). Inside a row every input's stride is 1 or 0, so the hot loops are a flat loop
(``flat``), a loop against one scalar (``scalar``) or, for general broadcasting, one of those per
row (``broadcast``); rows shorter than ``SHORT_ROW`` run one inline loop. Parallel variants split
the walk into tasks of whole rows or row pieces; the plan sizes them and picks serial below
``PARALLEL_MIN``.

Op codes select the operation inside one compiled kernel per dtype, with the switch outside the
loops, so the suite compiles a handful of specializations rather than one per op and dtype.
Transcendental maps (exp, log, trig) run numpy's SIMD loops instead (see ``NUMPY_SIMD``): numba
calls scalar libm per element, far slower (docs/performance.md).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ml_dtypes
import numba as nb
import numpy as np
from numba.core import types
from numba.extending import overload

from .gemm import bf16_to_f32, f32_to_bf16

_BF16 = np.dtype(ml_dtypes.bfloat16)

#: below this many output elements the serial variant runs: waking a parallel region's second
#: thread costs more than it saves (figures: docs/performance.md, "Parallel thresholds")
PARALLEL_MIN = 1 << 18
#: fewest elements one parallel task gets
GRAIN = 1 << 14
#: rows shorter than this run an inline loop instead of the per-row fast paths
SHORT_ROW = 16

# -- op codes -----------------------------------------------------------------------------------
ADD, SUB, MUL, DIV, POW, MAX, MIN, MOD, FMOD = range(9)
EQ, LT, LE, GT, GE = range(5)
(
    U_NEG,
    U_ABS,
    U_SIGN,
    U_EXP,
    U_LOG,
    U_SQRT,
    U_RSQRT,
    U_FLOOR,
    U_CEIL,
    U_ROUND,
    U_RECIP,
    U_ERF,
    U_SIN,
    U_COS,
    U_TAN,
    U_ASIN,
    U_ACOS,
    U_ATAN,
    U_SINH,
    U_COSH,
    U_ASINH,
    U_ACOSH,
    U_ATANH,
) = range(23)


# -- scalar semantics shared by every layout (type-dispatched at compile time) -------------------
def _div(x, y):  # pragma: no cover - numba stub, see the overload
    raise NotImplementedError


def _mod(x, y):  # pragma: no cover
    raise NotImplementedError


def _fmod(x, y):  # pragma: no cover
    raise NotImplementedError


def _pow(x, y):  # pragma: no cover
    raise NotImplementedError


_NP_ERRORS = {"error_model": "numpy"}


@overload(_div, jit_options=_NP_ERRORS)
def _div_impl(x, y):
    if isinstance(x, types.Integer):

        def int_div(x, y):
            # ONNX: integer division truncates toward zero. x/0 is undefined there; we give 0 like
            # numpy. y == -1 is special-cased because INT_MIN // -1 traps on x86.
            if y == 0:
                return 0
            if y == -1:
                return -x
            q = x // y
            if q * y != x and ((x < 0) != (y < 0)):
                q += 1
            return q

        return int_div
    return lambda x, y: x / y


@overload(_mod, jit_options=_NP_ERRORS)
def _mod_impl(x, y):
    if isinstance(x, types.Integer):

        def int_mod(x, y):  # sign of the divisor (Python / numpy remainder)
            if y == 0 or y == -1:
                return 0
            return x % y

        return int_mod

    def float_mod(x, y):
        m = np.fmod(x, y)
        if m != 0:
            if (y < 0) != (m < 0):
                m += y
        else:
            m = math.copysign(0.0, y)
        return m

    return float_mod


@overload(_fmod, jit_options=_NP_ERRORS)
def _fmod_impl(x, y):
    if isinstance(x, types.Integer):

        def int_fmod(x, y):  # sign of the dividend (C remainder)
            if y == 0 or y == -1:
                return 0
            r = x % y
            if r != 0 and ((r < 0) != (x < 0)):
                r -= y
            return r

        return int_fmod
    return lambda x, y: np.fmod(x, y)


@overload(_pow, jit_options=_NP_ERRORS)
def _pow_impl(x, y):
    if isinstance(x, types.Integer):

        def int_pow(x, y):
            # exponentiation by squaring, wrapping like the integer type; a negative exponent
            # gives the truncated 1/x**-y (0 unless |x| == 1)
            if y < 0:
                if x == 1:
                    return 1
                if x == -1:
                    return 1 if y % 2 == 0 else -1
                return 0
            r = 1
            base = x
            e = y
            while e > 0:
                if e & 1:
                    r = r * base
                base = base * base
                e >>= 1
            return r

        return int_pow
    return lambda x, y: x**y


@nb.njit(inline="always", error_model="numpy")
def _bop(op, x, y):
    if op == ADD:
        return x + y
    if op == SUB:
        return x - y
    if op == MUL:
        return x * y
    if op == DIV:
        return _div(x, y)
    if op == POW:
        return _pow(x, y)
    if op == MAX:
        return x if (x > y or x != x) else y  # NaN propagates, as in np.maximum
    if op == MIN:
        return x if (x < y or x != x) else y
    if op == MOD:
        return _mod(x, y)
    return _fmod(x, y)


@nb.njit(inline="always")
def _cop(op, x, y):
    if op == EQ:
        return x == y
    if op == LT:
        return x < y
    if op == LE:
        return x <= y
    if op == GT:
        return x > y
    return x >= y


# -- the strided walk ---------------------------------------------------------------------------
# Rows are grouped in planes (the second-innermost merged dim): inside a plane a row's offsets are
# a multiply away, and the odometer over the outer dims only runs once per plane.
@nb.njit(nogil=True, cache=True)
def _start(shape, st, plane, idx, off):
    """Outer multi-index ``idx`` and per-input offsets ``off`` of plane number ``plane``."""
    rem = plane
    for k in range(off.size):
        off[k] = 0
    for d in range(shape.size - 3, -1, -1):
        i = rem % shape[d]
        rem //= shape[d]
        idx[d] = i
        for k in range(off.size):
            off[k] += i * st[k, d]


@nb.njit(inline="always")
def _next_plane(shape, st, idx, off):
    """Step ``idx``/``off`` to the next plane (odometer over the dims above the plane)."""
    d = shape.size - 3
    while d >= 0:
        idx[d] += 1
        for k in range(off.size):
            off[k] += st[k, d]
        if idx[d] < shape[d]:
            return
        for k in range(off.size):
            off[k] -= st[k, d] * shape[d]
        idx[d] = 0
        d -= 1


@nb.njit(inline="always")
def _plane_geometry(shape, st, r0, idx, off):
    """(rows per plane, the row index of r0 inside its plane) with idx/off set to r0's plane."""
    nd = shape.size
    mid = shape[nd - 2] if nd >= 2 else 1
    p = r0 // mid
    _start(shape, st, p, idx, off)
    return mid, r0 - p * mid


# -- binary arithmetic ----------------------------------------------------------------------------
@nb.njit(inline="always", error_model="numpy")
def _binary_seg(op, a, oa, ia, b, ob, ib, out, oo, n):
    """out[oo:oo+n] = a[oa::ia] (op) b[ob::ib] for strides ia, ib in {0, 1}."""
    O = out[oo : oo + n]
    if ia == 1 and ib == 1:
        A = a[oa : oa + n]
        B = b[ob : ob + n]
        if op == ADD:
            for j in range(n):
                O[j] = A[j] + B[j]
        elif op == SUB:
            for j in range(n):
                O[j] = A[j] - B[j]
        elif op == MUL:
            for j in range(n):
                O[j] = A[j] * B[j]
        elif op == DIV:
            for j in range(n):
                O[j] = _div(A[j], B[j])
        else:
            for j in range(n):
                O[j] = _bop(op, A[j], B[j])
    elif ia == 1 and ib == 0:
        A = a[oa : oa + n]
        y = b[ob]
        if op == ADD:
            for j in range(n):
                O[j] = A[j] + y
        elif op == SUB:
            for j in range(n):
                O[j] = A[j] - y
        elif op == MUL:
            for j in range(n):
                O[j] = A[j] * y
        elif op == DIV:
            for j in range(n):
                O[j] = _div(A[j], y)
        elif op == POW and y == 2:
            for j in range(n):
                O[j] = A[j] * A[j]
        else:
            for j in range(n):
                O[j] = _bop(op, A[j], y)
    elif ia == 0 and ib == 1:
        x = a[oa]
        B = b[ob : ob + n]
        if op == ADD:
            for j in range(n):
                O[j] = x + B[j]
        elif op == SUB:
            for j in range(n):
                O[j] = x - B[j]
        elif op == MUL:
            for j in range(n):
                O[j] = x * B[j]
        else:
            for j in range(n):
                O[j] = _bop(op, x, B[j])
    else:
        for j in range(n):
            O[j] = _bop(op, a[oa + j * ia], b[ob + j * ib])


@nb.njit(nogil=True, cache=True)
def binary_block(op, a, b, out, shape, st, r0, r1, j0, n):
    """Rows [r0, r1), columns [j0, j0+n) of the walk; the whole walk is the serial kernel."""
    nd = shape.size
    inner = shape[nd - 1]
    ia, ib = st[0, nd - 1], st[1, nd - 1]
    ma, mb = (st[0, nd - 2], st[1, nd - 2]) if nd >= 2 else (0, 0)
    idx = np.zeros(nd, np.int64)
    off = np.zeros(2, np.int64)
    mid, i = _plane_geometry(shape, st, r0, idx, off)
    r = r0
    while r < r1:
        cnt = min(mid - i, r1 - r)
        pa = off[0] + j0 * ia + i * ma
        pb = off[1] + j0 * ib + i * mb
        po = r * inner + j0
        if n < SHORT_ROW:  # short rows: one inline loop, no per-row fast-path dispatch
            for t in range(cnt):
                oa, ob, oo = pa + t * ma, pb + t * mb, po + t * inner
                for j in range(n):
                    out[oo + j] = _bop(op, a[oa + j * ia], b[ob + j * ib])
        else:
            for t in range(cnt):
                _binary_seg(op, a, pa + t * ma, ia, b, pb + t * mb, ib, out, po + t * inner, n)
        r += cnt
        i = 0
        _next_plane(shape, st, idx, off)


@nb.njit(parallel=True, nogil=True, cache=True)
def binary_parallel(op, a, b, out, shape, st, rows_per_task, chunk):
    inner = shape[shape.size - 1]
    rows = out.size // inner
    nch = (inner + chunk - 1) // chunk
    ntask = ((rows + rows_per_task - 1) // rows_per_task) * nch
    for t in nb.prange(ntask):
        rb = t // nch
        c = t - rb * nch
        r0 = rb * rows_per_task
        j0 = c * chunk
        binary_block(op, a, b, out, shape, st, r0, min(r0 + rows_per_task, rows), j0, min(chunk, inner - j0))


# -- comparisons (bool output) ----------------------------------------------------------------------
@nb.njit(inline="always")
def _compare_seg(op, a, oa, ia, b, ob, ib, out, oo, n):
    O = out[oo : oo + n]
    if ia == 1 and ib == 1:
        A = a[oa : oa + n]
        B = b[ob : ob + n]
        if op == EQ:
            for j in range(n):
                O[j] = A[j] == B[j]
        elif op == LT:
            for j in range(n):
                O[j] = A[j] < B[j]
        elif op == LE:
            for j in range(n):
                O[j] = A[j] <= B[j]
        elif op == GT:
            for j in range(n):
                O[j] = A[j] > B[j]
        else:
            for j in range(n):
                O[j] = A[j] >= B[j]
    elif ia == 1 and ib == 0:
        A = a[oa : oa + n]
        y = b[ob]
        for j in range(n):
            O[j] = _cop(op, A[j], y)
    else:
        for j in range(n):
            O[j] = _cop(op, a[oa + j * ia], b[ob + j * ib])


@nb.njit(nogil=True, cache=True)
def compare_block(op, a, b, out, shape, st, r0, r1, j0, n):
    nd = shape.size
    inner = shape[nd - 1]
    ia, ib = st[0, nd - 1], st[1, nd - 1]
    ma, mb = (st[0, nd - 2], st[1, nd - 2]) if nd >= 2 else (0, 0)
    idx = np.zeros(nd, np.int64)
    off = np.zeros(2, np.int64)
    mid, i = _plane_geometry(shape, st, r0, idx, off)
    r = r0
    while r < r1:
        cnt = min(mid - i, r1 - r)
        pa = off[0] + j0 * ia + i * ma
        pb = off[1] + j0 * ib + i * mb
        po = r * inner + j0
        if n < SHORT_ROW:
            for t in range(cnt):
                oa, ob, oo = pa + t * ma, pb + t * mb, po + t * inner
                for j in range(n):
                    out[oo + j] = _cop(op, a[oa + j * ia], b[ob + j * ib])
        else:
            for t in range(cnt):
                _compare_seg(op, a, pa + t * ma, ia, b, pb + t * mb, ib, out, po + t * inner, n)
        r += cnt
        i = 0
        _next_plane(shape, st, idx, off)


@nb.njit(parallel=True, nogil=True, cache=True)
def compare_parallel(op, a, b, out, shape, st, rows_per_task, chunk):
    inner = shape[shape.size - 1]
    rows = out.size // inner
    nch = (inner + chunk - 1) // chunk
    ntask = ((rows + rows_per_task - 1) // rows_per_task) * nch
    for t in nb.prange(ntask):
        rb = t // nch
        c = t - rb * nch
        r0 = rb * rows_per_task
        j0 = c * chunk
        compare_block(op, a, b, out, shape, st, r0, min(r0 + rows_per_task, rows), j0, min(chunk, inner - j0))


# -- Where ------------------------------------------------------------------------------------------
@nb.njit(inline="always")
def _where_seg(c, oc, ic, x, ox, ix, y, oy, iy, out, oo, n):
    # both values are loaded before the select, so LLVM emits a (vectorizable) select, not a branch
    O = out[oo : oo + n]
    if ic == 1 and ix == 1 and iy == 1:
        C = c[oc : oc + n]
        X = x[ox : ox + n]
        Y = y[oy : oy + n]
        for j in range(n):
            u = X[j]
            v = Y[j]
            O[j] = u if C[j] else v
    elif ic == 1 and ix == 1 and iy == 0:
        C = c[oc : oc + n]
        X = x[ox : ox + n]
        v = y[oy]
        for j in range(n):
            u = X[j]
            O[j] = u if C[j] else v
    elif ic == 1 and ix == 0 and iy == 1:
        C = c[oc : oc + n]
        u = x[ox]
        Y = y[oy : oy + n]
        for j in range(n):
            v = Y[j]
            O[j] = u if C[j] else v
    else:
        for j in range(n):
            u = x[ox + j * ix]
            v = y[oy + j * iy]
            O[j] = u if c[oc + j * ic] else v


@nb.njit(nogil=True, cache=True)
def where_block(c, x, y, out, shape, st, r0, r1, j0, n):
    nd = shape.size
    inner = shape[nd - 1]
    ic, ix, iy = st[0, nd - 1], st[1, nd - 1], st[2, nd - 1]
    mc, mx, my = (st[0, nd - 2], st[1, nd - 2], st[2, nd - 2]) if nd >= 2 else (0, 0, 0)
    idx = np.zeros(nd, np.int64)
    off = np.zeros(3, np.int64)
    mid, i = _plane_geometry(shape, st, r0, idx, off)
    r = r0
    while r < r1:
        cnt = min(mid - i, r1 - r)
        pc = off[0] + j0 * ic + i * mc
        px = off[1] + j0 * ix + i * mx
        py = off[2] + j0 * iy + i * my
        po = r * inner + j0
        for t in range(cnt):
            _where_seg(c, pc + t * mc, ic, x, px + t * mx, ix, y, py + t * my, iy, out, po + t * inner, n)
        r += cnt
        i = 0
        _next_plane(shape, st, idx, off)


@nb.njit(parallel=True, nogil=True, cache=True)
def where_parallel(c, x, y, out, shape, st, rows_per_task, chunk):
    inner = shape[shape.size - 1]
    rows = out.size // inner
    nch = (inner + chunk - 1) // chunk
    ntask = ((rows + rows_per_task - 1) // rows_per_task) * nch
    for t in nb.prange(ntask):
        rb = t // nch
        k = t - rb * nch
        r0 = rb * rows_per_task
        j0 = k * chunk
        where_block(c, x, y, out, shape, st, r0, min(r0 + rows_per_task, rows), j0, min(chunk, inner - j0))


@nb.njit(nogil=True, cache=True)
def _where_over_seg(c, keep_true, other, scalar, out, lo, hi):
    # out already holds one branch (the graph engine wrote Where over that dying input): reading it
    # as ``out`` itself, not as a second array, keeps the loop free of LLVM's overlap check, whose
    # failure (exact aliasing) would run it scalar
    O = out[lo:hi]
    C = c[lo:hi]
    n = hi - lo
    if scalar:
        v = other[0]
        if keep_true:
            for j in range(n):
                u = O[j]
                O[j] = u if C[j] else v
        else:
            for j in range(n):
                u = O[j]
                O[j] = v if C[j] else u
    else:
        Y = other[lo:hi]
        if keep_true:
            for j in range(n):
                u = O[j]
                v = Y[j]
                O[j] = u if C[j] else v
        else:
            for j in range(n):
                u = O[j]
                v = Y[j]
                O[j] = v if C[j] else u


@nb.njit(parallel=True, nogil=True, cache=True)
def _where_over_parallel(c, keep_true, other, scalar, out, chunk):
    n = out.size
    for t in nb.prange(-(-n // chunk)):
        _where_over_seg(c, keep_true, other, scalar, out, t * chunk, min(n, (t + 1) * chunk))


# -- unary maps ---------------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True, error_model="numpy")
def unary_seg(op, x, out, lo, hi):
    """out[lo:hi] = f(x[lo:hi]) for float x; the whole range is the serial kernel."""
    X = x[lo:hi]
    O = out[lo:hi]
    n = hi - lo
    if op == U_NEG:
        for j in range(n):
            O[j] = -X[j]
    elif op == U_ABS:
        for j in range(n):
            O[j] = abs(X[j])
    elif op == U_SIGN:
        for j in range(n):
            v = X[j]
            O[j] = 1.0 if v > 0 else (-1.0 if v < 0 else v)  # keeps NaN and signed zeros
    elif op == U_EXP:
        for j in range(n):
            O[j] = math.exp(X[j])
    elif op == U_LOG:
        for j in range(n):
            O[j] = math.log(X[j])
    elif op == U_SQRT:
        for j in range(n):
            O[j] = math.sqrt(X[j])
    elif op == U_RSQRT:
        for j in range(n):
            O[j] = 1.0 / math.sqrt(X[j])
    elif op == U_FLOOR:
        for j in range(n):
            O[j] = np.floor(X[j])
    elif op == U_CEIL:
        for j in range(n):
            O[j] = np.ceil(X[j])
    elif op == U_ROUND:
        for j in range(n):
            O[j] = np.rint(X[j])  # half to even
    elif op == U_RECIP:
        for j in range(n):
            O[j] = 1.0 / X[j]
    elif op == U_ERF:
        for j in range(n):
            O[j] = math.erf(X[j])
    elif op == U_SIN:
        for j in range(n):
            O[j] = math.sin(X[j])
    elif op == U_COS:
        for j in range(n):
            O[j] = math.cos(X[j])
    elif op == U_TAN:
        for j in range(n):
            O[j] = math.tan(X[j])
    elif op == U_ASIN:
        for j in range(n):
            O[j] = math.asin(X[j])
    elif op == U_ACOS:
        for j in range(n):
            O[j] = math.acos(X[j])
    elif op == U_ATAN:
        for j in range(n):
            O[j] = math.atan(X[j])
    elif op == U_SINH:
        for j in range(n):
            O[j] = math.sinh(X[j])
    elif op == U_COSH:
        for j in range(n):
            O[j] = math.cosh(X[j])
    elif op == U_ASINH:
        for j in range(n):
            O[j] = math.asinh(X[j])
    elif op == U_ACOSH:
        for j in range(n):
            O[j] = math.acosh(X[j])
    else:
        for j in range(n):
            O[j] = math.atanh(X[j])


@nb.njit(parallel=True, nogil=True, cache=True)
def unary_parallel(op, x, out, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        unary_seg(op, x, out, t * chunk, min(t * chunk + chunk, n))


@nb.njit(nogil=True, cache=True)
def unary_int_seg(op, x, out, lo, hi):
    """Neg / Abs / Sign on integers (wrapping like the type: -INT_MIN == INT_MIN)."""
    X = x[lo:hi]
    O = out[lo:hi]
    n = hi - lo
    if op == U_NEG:
        for j in range(n):
            O[j] = -X[j]
    elif op == U_ABS:
        for j in range(n):
            v = X[j]
            O[j] = -v if v < 0 else v
    else:
        for j in range(n):
            v = X[j]
            O[j] = 1 if v > 0 else (-1 if v < 0 else 0)


@nb.njit(parallel=True, nogil=True, cache=True)
def unary_int_parallel(op, x, out, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        unary_int_seg(op, x, out, t * chunk, min(t * chunk + chunk, n))


@nb.njit(nogil=True, cache=True)
def clip_seg(x, out, lo_v, hi_v, lo, hi):
    """min(max(x, lo_v), hi_v) with numpy's NaN behaviour (a NaN bound or input gives NaN)."""
    X = x[lo:hi]
    O = out[lo:hi]
    for j in range(hi - lo):
        v = X[j]
        if v < lo_v or lo_v != lo_v:
            v = lo_v
        if v > hi_v or hi_v != hi_v:
            v = hi_v
        O[j] = v


@nb.njit(parallel=True, nogil=True, cache=True)
def clip_parallel(x, out, lo_v, hi_v, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        clip_seg(x, out, lo_v, hi_v, t * chunk, min(t * chunk + chunk, n))


# -- plans ------------------------------------------------------------------------------------------
def _threads() -> int:
    return max(1, nb.get_num_threads())


@dataclass(frozen=True)
class Layout:
    """A coalesced strided walk over an output (see the module docstring)."""

    kind: str  # "flat" | "scalar" | "broadcast" | "empty"
    shape: np.ndarray  # int64 merged output dims (at least one)
    strides: np.ndarray  # int64 [num_inputs, ndim] element strides, 0 on broadcast dims
    size: int
    parallel: bool
    rows_per_task: int
    chunk: int

    @property
    def rows(self) -> int:
        return self.size // int(self.shape[-1]) if self.size else 0


def plan_layout(out_shape, in_shapes) -> Layout:
    """Plan the walk of ``out_shape`` for contiguous inputs of ``in_shapes`` (numpy broadcasting).

    >>> lay = plan_layout((2, 3, 4), [(2, 3, 4), (3, 1)])
    >>> lay.kind, lay.shape.tolist(), lay.strides.tolist()
    ('broadcast', [2, 3, 4], [[12, 4, 1], [0, 1, 0]])
    """
    out_shape = tuple(int(d) for d in out_shape)
    nd = len(out_shape)
    size = math.prod(out_shape)
    k = len(in_shapes)
    per_input = []
    for s in in_shapes:
        s = (1,) * (nd - len(s)) + tuple(int(d) for d in s)
        st, acc = [0] * nd, 1
        for d in range(nd - 1, -1, -1):
            st[d] = 0 if s[d] == 1 else acc
            acc *= s[d]
        per_input.append(st)
    dims = [d for d in range(nd) if out_shape[d] != 1]
    shape: list[int] = []
    strides: list[list[int]] = [[] for _ in range(k)]
    for d in dims:
        if shape and all(strides[i][-1] == per_input[i][d] * out_shape[d] for i in range(k)):
            shape[-1] *= out_shape[d]
            for i in range(k):
                strides[i][-1] = per_input[i][d]
            continue
        shape.append(out_shape[d])
        for i in range(k):
            strides[i].append(per_input[i][d])
    if not shape:  # every dim is 1: one element
        shape = [1]
        strides = [[0] for _ in range(k)]
    if size == 0:
        kind = "empty"
    elif len(shape) == 1 and all(s[0] == 1 for s in strides):
        kind = "flat"
    elif len(shape) == 1 and all(s[0] in (0, 1) for s in strides):
        kind = "scalar"
    else:
        kind = "broadcast"
    threads = _threads()
    parallel = size >= PARALLEL_MIN and threads > 1
    inner = shape[-1]
    rows = size // inner if size else 0
    if parallel:
        target = max(GRAIN, -(-size // threads))
        if inner >= target:
            rows_per_task, chunk = 1, target
        else:
            rows_per_task, chunk = max(1, target // inner), inner
    else:
        rows_per_task, chunk = max(rows, 1), max(inner, 1)
    return Layout(
        kind,
        np.asarray(shape, np.int64),
        np.asarray(strides, np.int64).reshape(k, len(shape)),
        size,
        parallel,
        rows_per_task,
        chunk,
    )


@dataclass(frozen=True)
class BinaryPlan:
    op: int
    layout: Layout

    @property
    def kind(self) -> str:
        return self.layout.kind


@dataclass(frozen=True)
class VariadicPlan:
    """Max/Min/Sum/Mean: fold the inputs into the output one binary step at a time."""

    op: int
    steps: tuple  # Layout per step: (in0, in1) -> out, then (out, in_k) -> out
    mean: bool
    layout: Layout  # of the whole output (for the Mean scaling and the kind)

    @property
    def kind(self) -> str:
        return self.layout.kind


@dataclass(frozen=True)
class MapPlan:
    """Flat maps (unary ops, Clip): serial below PARALLEL_MIN, else tasks of ``chunk``."""

    op: int
    size: int
    parallel: bool
    chunk: int
    integer: bool
    kind: str = "flat"


def binary_plan(ctx, op: int) -> BinaryPlan:
    return BinaryPlan(op, plan_layout(ctx.outputs[0].shape, [ctx.shape(0), ctx.shape(1)]))


def variadic_plan(ctx, op: int, mean: bool = False) -> VariadicPlan:
    out = ctx.outputs[0].shape
    shapes = [m.shape for m in ctx.inputs]
    steps = []
    if len(shapes) >= 2:
        steps.append(plan_layout(out, shapes[:2]))
        steps += [plan_layout(out, [out, s]) for s in shapes[2:]]
    return VariadicPlan(op, tuple(steps), mean, plan_layout(out, [out, ()]))


def map_plan(ctx, op: int = -1) -> MapPlan:
    size = math.prod(ctx.outputs[0].shape)
    threads = _threads()
    parallel = size >= PARALLEL_MIN and threads > 1
    chunk = max(GRAIN, -(-size // threads)) if parallel else max(size, 1)
    return MapPlan(op, size, parallel, chunk, np.dtype(ctx.dtype(0)).kind in "iu")


# -- kernel entry points: fn(ins, outs, attrs, plan, workspace) -------------------------------------------
def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)


def _run_binary(op, lay: Layout, a, b, out) -> None:
    if lay.parallel:
        binary_parallel(op, a, b, out, lay.shape, lay.strides, lay.rows_per_task, lay.chunk)
    else:
        binary_block(op, a, b, out, lay.shape, lay.strides, 0, lay.rows, 0, int(lay.shape[-1]))


def binary(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    if plan.layout.size:
        _run_binary(plan.op, plan.layout, _flat(ins[0]), _flat(ins[1]), _flat(outs[0]))


def _unaliased(ins, out, start: int) -> list:
    """Inputs from ``start`` on that overlap ``out`` (the graph engine may write an op's output over a
    dying input) are copied: a fold writes ``out`` before it reads them."""
    return [np.array(x) if i >= start and np.may_share_memory(x, out) else x for i, x in enumerate(ins)]


def variadic(ins, outs, attrs, plan: VariadicPlan, ws) -> None:
    out = outs[0]
    if not plan.layout.size:
        return
    ins = _unaliased(ins, out, 2)  # in0 and in1 are read in step with the first write
    if len(ins) == 1:
        np.copyto(out, ins[0])
    else:
        o = _flat(out)
        _run_binary(plan.op, plan.steps[0], _flat(ins[0]), _flat(ins[1]), o)
        for lay, x in zip(plan.steps[1:], ins[2:]):
            _run_binary(plan.op, lay, o, _flat(x), o)
    if plan.mean:
        n = np.full(1, len(ins), out.dtype)
        _run_binary(DIV, plan.layout, _flat(out), n, _flat(out))


def compare(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    lay = plan.layout
    if not lay.size:
        return
    a, b, out = _flat(ins[0]), _flat(ins[1]), _flat(outs[0])
    if lay.parallel:
        compare_parallel(plan.op, a, b, out, lay.shape, lay.strides, lay.rows_per_task, lay.chunk)
    else:
        compare_block(plan.op, a, b, out, lay.shape, lay.strides, 0, lay.rows, 0, int(lay.shape[-1]))


_BITS_VIEW = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def where_plan(ctx) -> BinaryPlan:
    return BinaryPlan(-1, plan_layout(ctx.outputs[0].shape, [ctx.shape(0), ctx.shape(1), ctx.shape(2)]))


def where_applies(ctx):
    dt = np.dtype(ctx.dtype(1))
    if dt.kind in "OUS" or dt.itemsize not in _BITS_VIEW:
        return f"Where on {dt} needs the numpy kernel"
    return True


def _written_over(c, x, y, out):
    """(keep_true, other) when ``out`` is the memory of the branch ``x`` (keep_true) or ``y``, with
    the condition and the other branch each full-size or (the other) a single value; else None."""
    if c.size != out.size or not (c.flags.c_contiguous and out.flags.c_contiguous):
        return None
    for keep_true, same, other in ((True, x, y), (False, y, x)):
        if (
            same.size == out.size
            and same.ctypes.data == out.ctypes.data
            and same.strides == out.strides
            and other.size in (1, out.size)
            and other.flags.c_contiguous
            and not np.may_share_memory(other, out)
        ):
            return keep_true, other
    return None


def where(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    """Selection only moves bits, so any 1/2/4/8-byte dtype runs as a same-width integer."""
    lay = plan.layout
    if not lay.size:
        return
    view = _BITS_VIEW[outs[0].dtype.itemsize]
    c = _flat(ins[0])
    x, y, out = (_flat(a).view(view) for a in (ins[1], ins[2], outs[0]))
    over = _written_over(c, x, y, out)
    if over is not None:
        keep_true, other = over
        if lay.parallel:
            chunk = max(lay.chunk * lay.rows_per_task, 1)
            _where_over_parallel(c, keep_true, other, other.size == 1, out, chunk)
        else:
            _where_over_seg(c, keep_true, other, other.size == 1, out, 0, out.size)
        return
    if lay.parallel:
        where_parallel(c, x, y, out, lay.shape, lay.strides, lay.rows_per_task, lay.chunk)
    else:
        where_block(c, x, y, out, lay.shape, lay.strides, 0, lay.rows, 0, int(lay.shape[-1]))


def unary(ins, outs, attrs, plan: MapPlan, ws) -> None:
    if not plan.size:
        return
    x, out = _flat(ins[0]), _flat(outs[0])
    if plan.integer:
        if plan.parallel:
            unary_int_parallel(plan.op, x, out, plan.chunk)
        else:
            unary_int_seg(plan.op, x, out, 0, plan.size)
    elif plan.parallel:
        unary_parallel(plan.op, x, out, plan.chunk)
    else:
        unary_seg(plan.op, x, out, 0, plan.size)


def clip(ins, outs, attrs, plan: MapPlan, ws) -> None:
    if not plan.size:
        return
    x, out = _flat(ins[0]), _flat(outs[0])
    dt = x.dtype
    if dt.kind == "f":
        lo_default, hi_default = dt.type(-np.inf), dt.type(np.inf)
    else:
        lo_default, hi_default = dt.type(np.iinfo(dt).min), dt.type(np.iinfo(dt).max)
    lo = _flat(ins[1])[0] if len(ins) > 1 and ins[1] is not None else lo_default
    hi = _flat(ins[2])[0] if len(ins) > 2 and ins[2] is not None else hi_default
    if plan.parallel:
        clip_parallel(x, out, lo, hi, plan.chunk)
    else:
        clip_seg(x, out, lo, hi, 0, plan.size)


# -- numpy kernels: other integer widths, bool/string logic, bitwise, cast ----------------------------------
def _np_trunc_div(a, b, out):
    if a.dtype.kind in "iu":
        # a - fmod(a, b) is an exact multiple of b, so floor division of it truncates
        np.floor_divide(a - np.fmod(a, b), b, out=out)
    else:
        np.divide(a, b, out=out)


def pow_mixed(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    """Pow with X and Y of different dtypes: integers in int64 (numba, wrapping), else float64 math."""
    a, b, out = ins[0], ins[1], outs[0]
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        tmp = np.empty(out.shape, np.int64)
        if plan.layout.size:
            _run_binary(POW, plan.layout, _flat(a.astype(np.int64)), _flat(b.astype(np.int64)), _flat(tmp))
        np.copyto(out, tmp, casting="unsafe")
    else:
        with np.errstate(all="ignore"):
            np.copyto(out, np.power(a.astype(np.float64), b.astype(np.float64)), casting="unsafe")


NUMPY_BINARY = {
    ADD: np.add,
    SUB: np.subtract,
    MUL: np.multiply,
    DIV: _np_trunc_div,
    MAX: np.maximum,
    MIN: np.minimum,
    MOD: np.mod,
    FMOD: np.fmod,
}
NUMPY_COMPARE = {EQ: np.equal, LT: np.less, LE: np.less_equal, GT: np.greater, GE: np.greater_equal}


def binary_numpy(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    with np.errstate(all="ignore"):
        NUMPY_BINARY[plan.op](ins[0], ins[1], out=outs[0])


def variadic_numpy(ins, outs, attrs, plan: VariadicPlan, ws) -> None:
    out = outs[0]
    ins = _unaliased(ins, out, 1)
    np.copyto(out, ins[0])
    with np.errstate(all="ignore"):
        for x in ins[1:]:
            NUMPY_BINARY[plan.op](out, x, out=out)
        if plan.mean:
            np.divide(out, len(ins), out=out, casting="unsafe")


def compare_numpy(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    NUMPY_COMPARE[plan.op](ins[0], ins[1], out=outs[0])


def ufunc_kernel(ufunc):
    """A numpy kernel applying ``ufunc`` to all inputs (logic, bitwise, unary integer maps)."""

    def run(ins, outs, attrs, plan, ws):
        with np.errstate(all="ignore"):
            ufunc(*ins, out=outs[0])

    run.__name__ = f"{ufunc.__name__}_kernel"
    return run


NUMPY_UNARY_INT = {U_NEG: np.negative, U_ABS: np.abs, U_SIGN: np.sign}

#: transcendental maps whose numpy loops are SIMD (AVX2/AVX-512), far faster than numba's
#: per-element libm calls, so they are these ops' first kernel
NUMPY_SIMD = {
    U_EXP: np.exp,
    U_LOG: np.log,
    U_SIN: np.sin,
    U_COS: np.cos,
    U_TAN: np.tan,
    U_ASIN: np.arcsin,
    U_ACOS: np.arccos,
    U_ATAN: np.arctan,
    U_SINH: np.sinh,
    U_COSH: np.cosh,
    U_ASINH: np.arcsinh,
    U_ACOSH: np.arccosh,
    U_ATANH: np.arctanh,
}
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads_pool() -> ThreadPoolExecutor:
    """Worker threads for chunked numpy maps (numpy releases the GIL inside ufunc loops)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="opsnn-map")
        return _pool


def _apply(ufunc, x, out) -> None:
    with np.errstate(all="ignore"):
        ufunc(x, out=out)


def unary_simd(ins, outs, attrs, plan: MapPlan, ws) -> None:
    """numpy's SIMD ufunc over the flat tensor, in ``chunk``-sized pieces on worker threads when large."""
    f = NUMPY_SIMD[plan.op]
    x, out = _flat(ins[0]), _flat(outs[0])
    if not plan.parallel:
        _apply(f, x, out)
        return
    pool, c = _threads_pool(), plan.chunk
    jobs = [pool.submit(_apply, f, x[lo : lo + c], out[lo : lo + c]) for lo in range(c, plan.size, c)]
    _apply(f, x[:c], out[:c])  # the calling (stream) thread takes the first piece
    for job in jobs:
        job.result()


def unary_numpy(ins, outs, attrs, plan: MapPlan, ws) -> None:
    with np.errstate(all="ignore"):
        NUMPY_UNARY_INT[plan.op](ins[0], out=outs[0])


def clip_numpy(ins, outs, attrs, plan, ws) -> None:
    x = ins[0]
    lo = ins[1].reshape(()) if len(ins) > 1 and ins[1] is not None else None
    hi = ins[2].reshape(()) if len(ins) > 2 and ins[2] is not None else None
    r = x
    if lo is not None:
        r = np.maximum(r, lo)
    if hi is not None:
        r = np.minimum(r, hi)
    np.copyto(outs[0], r)


def where_numpy(ins, outs, attrs, plan, ws) -> None:
    np.copyto(outs[0], np.where(ins[0], ins[1], ins[2]))


def bitshift(ins, outs, attrs, plan, ws) -> None:
    """ONNX BitShift: shifts outside [0, bits) give the sign fill (-1 or 0) right, 0 left."""
    x, s = np.broadcast_arrays(ins[0], ins[1])
    bits = x.dtype.itemsize * 8
    s64 = s.astype(np.int64)
    valid = (s64 >= 0) & (s64 < bits)
    count = np.where(valid, s64, 0).astype(x.dtype)
    if plan == "RIGHT":
        shifted = np.right_shift(x, count)  # arithmetic for signed types
        fill = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else np.zeros_like(x)
    else:
        u = np.dtype(f"u{x.dtype.itemsize}")  # shift the bits, not the value: no signed overflow
        shifted = np.left_shift(x.view(u), count.astype(u)).view(x.dtype)
        fill = np.zeros_like(x)
    np.copyto(outs[0], np.where(valid, shifted, fill))


def isinf(ins, outs, attrs, plan, ws) -> None:
    x = ins[0]
    neg, pos = plan
    if neg and pos:
        np.isinf(x, out=outs[0])
    elif neg:
        np.logical_and(np.isinf(x), np.signbit(x.astype(np.float32)), out=outs[0])
    elif pos:
        np.logical_and(np.isinf(x), ~np.signbit(x.astype(np.float32)), out=outs[0])
    else:
        outs[0].fill(False)


# -- Cast ----------------------------------------------------------------------------------------------
FLOAT8 = tuple(
    np.dtype(getattr(ml_dtypes, n)) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


@dataclass(frozen=True)
class CastPlan:
    mode: str  # "copy" | "astype" | "saturate" | "e8m0" | "from_string"
    dst: np.dtype
    round_mode: str = "up"
    saturate: bool = True

    @property
    def kind(self) -> str:
        return self.mode


def cast_plan(ctx) -> CastPlan:
    src, dst = np.dtype(ctx.dtype(0)), np.dtype(ctx.outputs[0].dtype)
    saturate = bool(ctx.attrs.get("saturate", 1))
    rm = ctx.attrs.get("round_mode", "up")
    rm = rm.decode() if isinstance(rm, bytes) else rm
    if src.kind in "OUS":
        return CastPlan("from_string", dst)
    if src == dst:
        return CastPlan("copy", dst)
    if (src, dst) in ((np.dtype(np.float32), _BF16), (_BF16, np.dtype(np.float32))):
        return CastPlan("bf16", dst)  # numba bit conversions (faster than ml_dtypes' astype)
    if dst in FLOAT8 and saturate:
        return CastPlan("saturate", dst)
    if dst == E8M0:
        return CastPlan("e8m0", dst, rm, saturate)
    return CastPlan("astype", dst)


def to_e8m0(x: np.ndarray, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """float -> float8_e8m0fnu (a bare power-of-two exponent, bits 255 = NaN).

    The exponent of ``x`` as float32, rounded by the fraction bits: ``up`` when any is set,
    ``down`` never, ``nearest`` at the halfway bit, ties to even on the significand (the kept bit
    is the implicit leading one, so ties of normal numbers round up and of subnormals down).
    Saturation keeps overflow and infinities at the largest exponent (254); without it they
    become NaN.
    """
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    frac = bits & 0x7FFFFF
    special = exp == 0xFF
    isnan = special & (frac != 0)
    if round_mode == "up":
        exp = exp + (frac != 0)
    elif round_mode == "nearest":
        half = (frac & 0x400000) != 0
        rest = (frac & 0x3FFFFF) != 0
        exp = exp + (half & (rest | (exp > 0)))
    elif round_mode != "down":
        raise ValueError(f"round_mode {round_mode!r}")
    if saturate:
        exp = np.where(special, 0xFE, np.minimum(exp, 0xFE))
    else:
        exp = np.where(special | (exp > 0xFE), 0xFF, exp)
    exp = np.where(isnan, 0xFF, exp)
    return exp.astype(np.uint8).view(E8M0)


def cast(ins, outs, attrs, plan: CastPlan, ws) -> None:
    x, out = ins[0], outs[0]
    with np.errstate(all="ignore"):
        if plan.mode == "copy":
            np.copyto(out, x)
        elif plan.mode == "bf16":
            if x.dtype == np.float32:
                xf = np.ascontiguousarray(x).reshape(-1)
                f32_to_bf16(xf, xf.view(np.uint32), out.reshape(-1).view(np.uint16))
            else:
                bf16_to_f32(np.ascontiguousarray(x).reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint32))
        elif plan.mode == "saturate":
            fmax = float(ml_dtypes.finfo(plan.dst).max)
            src = x if x.dtype in (np.float16, np.float32, np.float64) else x.astype(np.float32)
            np.copyto(out, np.clip(src, -fmax, fmax).astype(plan.dst))
        elif plan.mode == "e8m0":
            np.copyto(out, to_e8m0(x, plan.saturate, plan.round_mode))
        elif plan.mode == "from_string":
            try:
                v = x.astype(plan.dst)
            except (ValueError, TypeError):  # "100.5" -> int goes through float, as ONNX allows
                v = x.astype(np.float64).astype(plan.dst)
            np.copyto(out, v)
        elif x.dtype.kind == "V" or plan.dst.kind == "V":
            np.copyto(out, x.astype(plan.dst))  # ml_dtypes types (bfloat16, float8, int4...) via astype
        else:
            np.copyto(out, x, casting="unsafe")
