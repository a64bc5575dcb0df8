"""CPU activation kernels (numba): pointwise activations, PRelu, SwiGLU and softmax-type row ops.

Every kernel works on flat 1-D contiguous arrays (one numba specialization per dtype).
Loops run over slices from index 0 and compile with ``error_model="numpy"``: numba's
negative-index wraparound and ZeroDivisionError checks otherwise stop LLVM from
vectorizing them. Transcendentals for float32 go through the vectorizable ``fexp`` family
below (float64 keeps libm): without SVML, ``math.exp`` is a scalar call per element.

Pointwise activations share one kernel: ``map_chunk`` switches on an op code once per
chunk to a tight loop per activation. ``op_kernel(op)`` is the serial one with the op a
constant (``chunk_const``), so a model compiles only the activations it runs. The plan,
made at prepare time, picks the op code, casts its parameters to the compute dtype, and
chooses serial vs parallel and the chunk size; the kernel never decides anything per call.

Softmax/LogSoftmax view the input as ``(outer, L, inner)`` with ``L`` the softmax axis
and use the single-pass online form: one pass keeps a running max ``m`` and a running
sum ``s`` of ``exp(x - m)`` (rescaled by ``exp(m_old - m_new)`` when the max grows; the
max is taken per L1-resident chunk so the sum loop vectorizes), a second pass writes
``exp(x - m) / s`` (or ``x - m - log s``); for contiguous rows the first pass leaves each
chunk's exps in the output and the second rescales them by one factor per chunk. Rows
are the unit of work; for ``inner > 1`` a work item is a block of ``SOFTMAX_BLOCK``
neighbouring rows read along the axis with stride ``inner``: every load is a contiguous
run, and the loops vectorize across the rows. A few very long rows are split into parts
whose ``(m, s)`` pairs merge exactly.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from ...dtypes import compute_dtype
from ...runtime import kernel_cache

#: below this many elements a cheap map (relu, clamps) runs serially: waking a parallel region's
#: second thread costs more than the map saves (figures: docs/performance.md, "Parallel thresholds")
PARALLEL_MIN = 1 << 20
#: the same threshold for maps that evaluate exp/erf/tanh per element (and softmax)
PARALLEL_MIN_COSTLY = 1 << 18
#: smallest chunk a parallel pointwise launch hands to one task
CHUNK_MIN = 1 << 13
#: rows of a strided (inner > 1) softmax handled together by one work item
SOFTMAX_BLOCK = 64
#: steps along the axis whose max a strided (inner > 1) softmax takes before summing
SOFTMAX_STEPS = 16
#: softmax rows are scanned in chunks of this many elements (max first, then the sum)
SOFTMAX_CHUNK = 512
#: a softmax row at least this long may be split across threads when rows are few
SPLIT_MIN = 1 << 15

_NJIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
_NJIT_INNER = dict(error_model="numpy", fastmath={"contract"})
F32 = np.float32


# -- vectorizable float32 math ---------------------------------------------------------------------
@intrinsic
def _exp2_int(typingctx, k):
    """``2**k`` for an integer-valued float32 ``k`` in [-126, 127], by building the exponent bits."""
    if k != types.float32:
        return None

    def codegen(context, builder, sig, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        kk = args[0]
        kk = builder.select(builder.fcmp_unordered("uno", kk, kk), ir.Constant(f32, 0.0), kk)  # no poison on NaN
        bits = builder.shl(builder.add(builder.fptosi(kk, i32), ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, f32)

    return types.float32(types.float32), codegen


@intrinsic
def _fmax(typingctx, a, b):
    """``llvm.maxnum``: the larger of two floats, ignoring a NaN operand. Unlike a compare
    and select, LLVM vectorizes a reduction of it without fast-math flags."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, sig, args):
        t = args[0].type
        name = "llvm.maxnum.f32" if isinstance(t, ir.FloatType) else "llvm.maxnum.f64"
        return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t]), name), args)

    return a(a, b), codegen


# Each helper is a Python stub with a numba overload: float32 gets branch-free code LLVM
# vectorizes, float64 calls libm. fexp stays a separate function (LLVM inlines it into the
# loop that calls it); the helpers built on it are inlined at numba IR level, because a
# call from one separately compiled helper into another stays a real call per element.
def fexp(x):
    """``exp(x)``; float32 in straight-line vectorizable code (< 1 ulp), float64 via libm."""
    return math.exp(x)


def fexpm1(x):
    """``exp(x) - 1`` accurate near 0."""
    return math.expm1(x)


def ftanh(x):
    """``tanh(x)`` via expm1 (keeps relative accuracy near 0)."""
    return math.tanh(x)


def flog1p_unit(x):
    """``log(1 + x)`` for ``x`` in [0, 1]."""
    return math.log1p(x)


def fphi(x):
    """The standard normal CDF ``(1 + erf(x / sqrt 2)) / 2``, accurate in both tails."""
    return 0.5 * math.erfc(-x * 0.7071067811865476)


def _float64_impl(fn):
    return lambda x: fn(x)


@overload(fexp, jit_options=_NJIT_INNER)
def _ov_fexp(x):
    if x == types.float32:

        def impl(x):
            # exp(x) = 2^k exp(r), k = round(x / ln 2), |r| <= ln2 / 2 (ln 2 split in two so r is exact);
            # exp(r) by its Taylor series to r^7 (remainder < 6e-9 relative); 2^k as two factors so
            # results down to the denormals and up to overflow come out right.
            x = F32(89.0) if x > F32(89.0) else x
            x = F32(-104.0) if x < F32(-104.0) else x
            k = np.floor(x * F32(1.4426950408889634) + F32(0.5))
            r = x - k * F32(0.693359375) - k * F32(-2.1219444005469057e-4)
            p = F32(1.0 / 5040.0)
            p = p * r + F32(1.0 / 720.0)
            p = p * r + F32(1.0 / 120.0)
            p = p * r + F32(1.0 / 24.0)
            p = p * r + F32(1.0 / 6.0)
            p = p * r + F32(0.5)
            p = p * r + F32(1.0)
            p = p * r + F32(1.0)
            k1 = np.floor(k * F32(0.5))
            return p * _exp2_int(k1) * _exp2_int(k - k1)

        return impl
    if isinstance(x, types.Float):
        return _float64_impl(math.exp)


@overload(fexpm1, jit_options=_NJIT_INNER, inline="always")
def _ov_fexpm1(x):
    if x == types.float32:

        def impl(x):
            # |x| < 1/2: x + x^2 (1/2 + x/6 + ... + x^7/9!) has no cancellation; else exp(x) - 1
            p = F32(1.0 / 362880.0)
            p = p * x + F32(1.0 / 40320.0)
            p = p * x + F32(1.0 / 5040.0)
            p = p * x + F32(1.0 / 720.0)
            p = p * x + F32(1.0 / 120.0)
            p = p * x + F32(1.0 / 24.0)
            p = p * x + F32(1.0 / 6.0)
            p = p * x + F32(0.5)
            small = x + x * x * p
            big = fexp(x) - F32(1.0)
            return small if abs(x) < F32(0.5) else big

        return impl
    if isinstance(x, types.Float):
        return _float64_impl(math.expm1)


@overload(ftanh, jit_options=_NJIT_INNER, inline="always")
def _ov_ftanh(x):
    if x == types.float32:

        def impl(x):
            # tanh|x| = t / (t + 2), t = expm1(2|x|), below 0.55 (no cancellation); above, 1 - 2 / (t + 2):
            # there t / (t + 2) loses the gap to 1 to the rounding of t + 2 (8.8 gave 1.0, not 1 - 2^-24),
            # and t = inf (|x| > 44) gives 1 exactly
            ax = abs(x)
            t = fexpm1(F32(2.0) * ax)
            d = t + F32(2.0)
            y = t / d if ax < F32(0.55) else F32(1.0) - F32(2.0) / d
            neg = -y if x < F32(0.0) else x  # x itself for +-0 and NaN
            return y if x > F32(0.0) else neg

        return impl
    if isinstance(x, types.Float):
        return _float64_impl(math.tanh)


@overload(flog1p_unit, jit_options=_NJIT_INNER, inline="always")
def _ov_flog1p_unit(x):
    if x == types.float32:

        def impl(x):
            # log(1 + x) = 2 atanh(s), s = x / (2 + x) <= 1/3: the odd series to s^15 (< 2e-9 relative)
            s = x / (F32(2.0) + x)
            z = s * s
            p = F32(1.0 / 15.0)
            p = p * z + F32(1.0 / 13.0)
            p = p * z + F32(1.0 / 11.0)
            p = p * z + F32(1.0 / 9.0)
            p = p * z + F32(1.0 / 7.0)
            p = p * z + F32(1.0 / 5.0)
            p = p * z + F32(1.0 / 3.0)
            p = p * z + F32(1.0)
            return F32(2.0) * s * p

        return impl
    if isinstance(x, types.Float):
        return _float64_impl(math.log1p)


@overload(fphi, jit_options=_NJIT_INNER, inline="always")
def _ov_fphi(x):
    if x == types.float32:

        def impl(x):
            # erfc(z) = t exp(P(t) - z^2), t = 2 / (2 + z), z = |x| / sqrt 2 >= 0. P is a degree-10
            # least-squares fit (in float64, Chebyshev basis, on z in [0, 10.5]) of log(erfc(z) e^{z^2} / t);
            # its relative error is 3e-8. z^2 = x^2 / 2 skips the rounding of z; what remains is
            # that of x^2, ~1e-7 z^2 relative in the tail.
            z = abs(x) * F32(0.7071067811865476)
            t = F32(2.0) / (F32(2.0) + z)
            # Estrin's scheme: a dependency chain of 4 multiply-adds instead of Horner's 10 (the
            # loop is latency-bound; see docs/performance.md)
            t2 = t * t
            t4 = t2 * t2
            q0 = F32(-1.2655641415664483) + F32(1.0014734280472495) * t
            q1 = F32(0.35687697407771557) + F32(0.21073610961693354) * t
            q2 = F32(-0.6520158786036993) + F32(1.5108167291238495) * t
            q3 = F32(-3.28098269615674) + F32(3.930654109940149) * t
            q4 = F32(-2.568642459125026) + F32(0.8827151406918843) * t
            r2 = q4 + F32(-0.12606728649156682) * t2
            p = (q0 + q1 * t2) + (q2 + q3 * t2) * t4 + r2 * (t4 * t4)
            half_erfc = F32(0.5) * t * fexp(p - x * x * F32(0.5))
            return half_erfc if x < F32(0.0) else F32(1.0) - half_erfc

        return impl
    if isinstance(x, types.Float):
        return lambda x: 0.5 * math.erfc(-x * 0.7071067811865476)


# -- op codes of the shared pointwise kernel -------------------------------------------------------
LEAKY_RELU = 1  # a = alpha
GELU_ERF = 2
GELU_TANH = 3
SWISH = 4  # a = alpha
SIGMOID = 5
TANH = 6
SOFTPLUS = 7
HARD_SWISH = 8
ELU = 9  # a = alpha
SELU = 10  # a = alpha, b = gamma
CELU = 11  # a = alpha
MISH = 12
HARD_SIGMOID = 13  # a = alpha, b = beta
THRESHOLDED_RELU = 14  # a = alpha
SOFTSIGN = 15
SHRINK = 16  # a = lambd, b = bias

#: ops that evaluate a transcendental per element
COSTLY = frozenset({GELU_ERF, GELU_TANH, SWISH, SIGMOID, TANH, SOFTPLUS, ELU, SELU, CELU, MISH})


# One loop per activation, each ``(xs, ys, a, b) -> None`` over equal-length slices. Keeping
# them apart means each inlines its math helpers once (numba warns when one function
# inlines the same helper twice) and LLVM vectorizes each loop on its own.
@nb.njit(**_NJIT)
def _leaky_relu(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v * a if v < zero else v


@nb.njit(**_NJIT)
def _gelu_erf(xs, ys, a, b):
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v * fphi(v)


@nb.njit(**_NJIT)
def _gelu_tanh(xs, ys, a, b):
    # 0.5 (1 + tanh(z)) = sigmoid(2z): no cancellation for negative x
    one = xs.dtype.type(1.0)
    k2 = xs.dtype.type(2.0 * 0.7978845608028654)  # 2 sqrt(2/pi)
    c = xs.dtype.type(0.044715)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v / (one + fexp(-k2 * (v + c * v * v * v)))


@nb.njit(**_NJIT)
def _swish(xs, ys, a, b):
    one = xs.dtype.type(1.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v / (one + fexp(-a * v))


@nb.njit(**_NJIT)
def _sigmoid(xs, ys, a, b):
    one = xs.dtype.type(1.0)
    for i in range(xs.size):
        ys[i] = one / (one + fexp(-xs[i]))


@nb.njit(**_NJIT)
def _tanh(xs, ys, a, b):
    for i in range(xs.size):
        ys[i] = ftanh(xs[i])


@nb.njit(**_NJIT)
def _softplus(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        # log(1 + e^v) without overflow: max(v, 0) + log1p(e^-|v|)
        ys[i] = (v if v > zero else zero) + flog1p_unit(fexp(-abs(v)))


@nb.njit(**_NJIT)
def _hard_swish(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    one = xs.dtype.type(1.0)
    half = xs.dtype.type(0.5)
    sixth = xs.dtype.type(1.0 / 6.0)
    for i in range(xs.size):
        v = xs[i]
        g = v * sixth + half
        g = zero if g < zero else g
        g = one if g > one else g
        ys[i] = v * g


@nb.njit(**_NJIT)
def _elu(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = a * fexpm1(v) if v < zero else v


@nb.njit(**_NJIT)
def _selu(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = b * (a * fexpm1(v) if v <= zero else v)


@nb.njit(**_NJIT)
def _celu(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    inv = xs.dtype.type(1.0) / a
    for i in range(xs.size):
        v = xs[i]
        ys[i] = a * fexpm1(v * inv) if v < zero else v


@nb.njit(**_NJIT)
def _mish(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        sp = (v if v > zero else zero) + flog1p_unit(fexp(-abs(v)))
        ys[i] = v * ftanh(sp)


@nb.njit(**_NJIT)
def _hard_sigmoid(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    one = xs.dtype.type(1.0)
    for i in range(xs.size):
        g = a * xs[i] + b
        g = zero if g < zero else g
        ys[i] = one if g > one else g


@nb.njit(**_NJIT)
def _thresholded_relu(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v if v > a else zero


@nb.njit(**_NJIT)
def _softsign(xs, ys, a, b):
    one = xs.dtype.type(1.0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = v / (one + abs(v))


@nb.njit(**_NJIT)
def _shrink(xs, ys, a, b):
    zero = xs.dtype.type(0.0)
    for i in range(xs.size):
        v = xs[i]
        y = v - b if v > a else zero
        ys[i] = v + b if v < -a else y


#: elements per scratch block when the output is the input (in-place runs)
SCRATCH = 2048


@nb.njit(**_NJIT)
def map_chunk(x, out, lo, hi, op, a, b):
    """``out[lo:hi] = act(x[lo:hi])`` for the activation ``op`` with parameters ``a``, ``b``.

    In place (``out`` is ``x``, as the graph's memory plan often makes it) the loops go
    through a small scratch block: with input and output the same array LLVM cannot prove a
    loop safe to vectorize and runs it one element at a time."""
    if x.ctypes.data != out.ctypes.data:
        map_span(x[lo:hi], out[lo:hi], op, a, b)
        return
    tmp = np.empty(min(SCRATCH, max(hi - lo, 0)), x.dtype)
    for s in range(lo, hi, SCRATCH):
        e = min(s + SCRATCH, hi)
        t = tmp[: e - s]
        map_span(x[s:e], t, op, a, b)
        out[s:e] = t


@nb.njit(**_NJIT)
def map_span(xs, ys, op, a, b):
    """``ys = act(xs)`` over two equal-length slices that do not overlap."""
    if op == LEAKY_RELU:
        _leaky_relu(xs, ys, a, b)
    elif op == GELU_ERF:
        _gelu_erf(xs, ys, a, b)
    elif op == GELU_TANH:
        _gelu_tanh(xs, ys, a, b)
    elif op == SWISH:
        _swish(xs, ys, a, b)
    elif op == SIGMOID:
        _sigmoid(xs, ys, a, b)
    elif op == TANH:
        _tanh(xs, ys, a, b)
    elif op == SOFTPLUS:
        _softplus(xs, ys, a, b)
    elif op == HARD_SWISH:
        _hard_swish(xs, ys, a, b)
    elif op == ELU:
        _elu(xs, ys, a, b)
    elif op == SELU:
        _selu(xs, ys, a, b)
    elif op == CELU:
        _celu(xs, ys, a, b)
    elif op == MISH:
        _mish(xs, ys, a, b)
    elif op == HARD_SIGMOID:
        _hard_sigmoid(xs, ys, a, b)
    elif op == THRESHOLDED_RELU:
        _thresholded_relu(xs, ys, a, b)
    elif op == SOFTSIGN:
        _softsign(xs, ys, a, b)
    elif op == SHRINK:
        _shrink(xs, ys, a, b)


#: op code -> its loop, for the kernels that hold the op as a constant (chunk_const)
SPANS = {
    LEAKY_RELU: _leaky_relu,
    GELU_ERF: _gelu_erf,
    GELU_TANH: _gelu_tanh,
    SWISH: _swish,
    SIGMOID: _sigmoid,
    TANH: _tanh,
    SOFTPLUS: _softplus,
    HARD_SWISH: _hard_swish,
    ELU: _elu,
    SELU: _selu,
    CELU: _celu,
    MISH: _mish,
    HARD_SIGMOID: _hard_sigmoid,
    THRESHOLDED_RELU: _thresholded_relu,
    SOFTSIGN: _softsign,
    SHRINK: _shrink,
}


def chunk_const(op, x, out, lo, hi, a, b):
    """:func:`map_chunk` for a constant ``op`` (a closure's or a global's): in a kernel, only that
    activation's loop compiles in (a run-time ``op`` compiles all sixteen)."""
    raise NotImplementedError("chunk_const runs inside numba kernels only")


@overload(chunk_const, jit_options=_NJIT_INNER)
def _ov_chunk_const(op, x, out, lo, hi, a, b):
    if not isinstance(op, types.IntegerLiteral):
        return None
    span = SPANS[op.literal_value]

    def impl(op, x, out, lo, hi, a, b):
        if x.ctypes.data != out.ctypes.data:
            span(x[lo:hi], out[lo:hi], a, b)
            return
        tmp = np.empty(min(SCRATCH, max(hi - lo, 0)), x.dtype)
        for s in range(lo, hi, SCRATCH):
            e = min(s + SCRATCH, hi)
            t = tmp[: e - s]
            span(x[s:e], t, a, b)
            out[s:e] = t

    return impl


@nb.njit(parallel=True, **_NJIT)
def map_parallel(x, out, op, a, b, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        map_chunk(x, out, lo, min(lo + chunk, n), op, a, b)


#: op code -> name, for the per-op kernels' names
OP_NAMES = {
    LEAKY_RELU: "leaky_relu",
    GELU_ERF: "gelu_erf",
    GELU_TANH: "gelu_tanh",
    SWISH: "swish",
    SIGMOID: "sigmoid",
    TANH: "tanh",
    SOFTPLUS: "softplus",
    HARD_SWISH: "hard_swish",
    ELU: "elu",
    SELU: "selu",
    CELU: "celu",
    MISH: "mish",
    HARD_SIGMOID: "hard_sigmoid",
    THRESHOLDED_RELU: "thresholded_relu",
    SOFTSIGN: "softsign",
    SHRINK: "shrink",
}


@functools.cache
def op_kernel(op: int):
    """``serial(x, out, a, b)``: :func:`map_chunk` over all of ``x`` with ``op`` a constant, so a
    model compiles the activations it runs, not all sixteen. (Parallel launches, above
    ``PARALLEL_MIN`` elements, keep the shared :func:`map_parallel`: a parallel kernel per op
    costs a second of compiling each, and the test suite compiles every op in every dtype.)"""

    def serial(x, out, a, b):
        chunk_const(op, x, out, 0, x.size, a, b)

    # a distinct name: numba's cache files are named by it (the code and lines are shared)
    serial.__name__ = serial.__qualname__ = f"map_serial_{OP_NAMES[op]}"
    return nb.njit(**_NJIT)(serial)


def _chunk(n: int, costly: bool) -> int:
    """0 for a serial launch, else the elements per parallel task (a few tasks per thread)."""
    if n < (PARALLEL_MIN_COSTLY if costly else PARALLEL_MIN):
        return 0
    threads = nb.get_num_threads()
    if threads <= 1:
        return 0
    return max(CHUNK_MIN, -(-n // (4 * threads)))


def pointwise_plan(ctx, op: int, a: float = 0.0, b: float = 0.0) -> tuple:
    """Plan one pointwise activation: ``(op, a, b, chunk)`` with the parameters in the compute
    dtype and ``chunk == 0`` for a serial launch."""
    cdt = compute_dtype(ctx.dtype(0))
    n = math.prod(ctx.shape(0))
    return (op, cdt.type(a), cdt.type(b), _chunk(n, op in COSTLY))


def pointwise(ins, outs, attrs, plan, ws):
    op, a, b, chunk = plan
    x = ins[0].reshape(-1)
    out = outs[0].reshape(-1)
    if chunk:
        map_parallel(x, out, op, a, b, chunk)
    else:
        op_kernel(op)(x, out, a, b)


# -- Relu (floats and integers) -------------------------------------------------------------------
@nb.njit(**_NJIT)
def relu_chunk(x, out, lo, hi):
    xs = x[lo:hi]
    ys = out[lo:hi]
    zero = x.dtype.type(0)
    for i in range(xs.size):
        v = xs[i]
        ys[i] = zero if v < zero else v  # NaN stays NaN


@nb.njit(parallel=True, **_NJIT)
def relu_parallel(x, out, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        relu_chunk(x, out, lo, min(lo + chunk, n))


def relu_plan(ctx) -> int:
    """Elements per parallel task, 0 for a serial launch."""
    return _chunk(math.prod(ctx.shape(0)), False)


def relu(ins, outs, attrs, plan, ws):
    x = ins[0].reshape(-1)
    out = outs[0].reshape(-1)
    if plan:
        relu_parallel(x, out, plan)
    else:
        relu_chunk(x, out, 0, x.size)


@nb.njit(**_NJIT)
def relu_chunk_bf16(x, out, lo, hi):
    """bfloat16 bit patterns (uint16): a negative non-NaN (sign set, magnitude in (0, inf]) becomes
    +0, everything else (-0, NaN, positives) is copied: exactly max(x, 0) with NaN kept."""
    xs = x[lo:hi]
    ys = out[lo:hi]
    for i in range(xs.size):
        u = xs[i]
        a = u & np.uint16(0x7FFF)
        neg = (u & np.uint16(0x8000)) != 0 and a != 0 and a <= np.uint16(0x7F80)
        ys[i] = np.uint16(0) if neg else u


@nb.njit(parallel=True, **_NJIT)
def relu_parallel_bf16(x, out, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        relu_chunk_bf16(x, out, lo, min(lo + chunk, n))


def relu_bf16(ins, outs, attrs, plan, ws):
    """Relu on bfloat16 storage, on the bit patterns (no widening)."""
    x = ins[0].reshape(-1).view(np.uint16)
    out = outs[0].reshape(-1).view(np.uint16)
    if plan:
        relu_parallel_bf16(x, out, plan)
    else:
        relu_chunk_bf16(x, out, 0, x.size)


def relu_numpy(ins, outs, attrs, plan, ws):
    """Any dtype (the narrow integers), numpy-vectorized."""
    np.maximum(ins[0], 0, out=outs[0], casting="unsafe")


# -- PRelu: slope broadcast collapsed to (outer, C, inner) ------------------------------------------
@nb.njit(**_NJIT)
def prelu_chunk(x, slope, out, lo, hi, inner):
    """``out[lo:hi]`` for ``x`` viewed as (outer, C, inner) against ``slope`` of C values.
    inner > 1: runs of ``inner`` elements share one slope value; inner == 1: rows of C
    elements pair with the slope vector."""
    c = slope.size
    zero = x.dtype.type(0.0)
    i = lo
    seg = inner if inner > 1 else c
    while i < hi:
        r = i // seg
        end = min(hi, (r + 1) * seg)
        xs = x[i:end]
        ys = out[i:end]
        if inner > 1:
            s = slope[r % c]
            for k in range(xs.size):
                v = xs[k]
                ys[k] = v * s if v < zero else v
        else:
            ss = slope[i - r * seg : end - r * seg]
            for k in range(xs.size):
                v = xs[k]
                ys[k] = v * ss[k] if v < zero else v
        i = end


@nb.njit(parallel=True, **_NJIT)
def prelu_parallel(x, slope, out, inner, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        prelu_chunk(x, slope, out, lo, min(lo + chunk, n), inner)


def prelu_layout(x_shape: tuple, s_shape: tuple):
    """``(C, inner)`` when ``slope`` broadcast to ``x_shape`` reads as ``x.reshape(outer, C, inner)``
    against ``slope.reshape(C)``, else None (its broadcast dims interleave with full ones)."""
    s_shape = (1,) * (len(x_shape) - len(s_shape)) + tuple(s_shape)
    kinds = []  # "F": the slope varies along the dim, "B": it is broadcast
    for xd, sd in zip(x_shape, s_shape):
        if xd == 1:
            continue
        kinds.append(("F" if sd == xd else "B", xd))
    pattern = "".join(k for k, _ in kinds)
    first = pattern.find("F")
    if first < 0:
        return 1, max(1, math.prod(x_shape))
    last = pattern.rfind("F")
    if "B" in pattern[first : last + 1]:
        return None
    c = math.prod(d for _, d in kinds[first : last + 1])
    inner = math.prod(d for _, d in kinds[last + 1 :])
    return c, max(1, inner)


def prelu_plan(ctx):
    c, inner = prelu_layout(ctx.shape(0), ctx.shape(1))
    return inner, _chunk(math.prod(ctx.shape(0)), False)


def prelu(ins, outs, attrs, plan, ws):
    inner, chunk = plan
    x = ins[0].reshape(-1)
    slope = ins[1].reshape(-1)
    out = outs[0].reshape(-1)
    if chunk:
        prelu_parallel(x, slope, out, inner, chunk)
    else:
        prelu_chunk(x, slope, out, 0, x.size, inner)


def prelu_numpy(ins, outs, attrs, plan, ws):
    """Any broadcast pattern and any dtype (integers included), numpy-vectorized."""
    x, slope = ins
    np.copyto(outs[0], np.where(x < 0, x * slope, x), casting="unsafe")


# -- SwiGLU ---------------------------------------------------------------------------------------------
@nb.njit(**_NJIT)
def swiglu_chunk(g, v, out, lo, hi, alpha):
    gs = g[lo:hi]
    vs = v[lo:hi]
    ys = out[lo:hi]
    one = g.dtype.type(1.0)
    for i in range(gs.size):
        a = gs[i]
        ys[i] = a / (one + fexp(-alpha * a)) * vs[i]


@nb.njit(parallel=True, **_NJIT)
def swiglu_parallel(g, v, out, alpha, chunk):
    n = g.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        swiglu_chunk(g, v, out, lo, min(lo + chunk, n), alpha)


# Written over g or v (a graph's memory plan reuses a dying input): one array read and written,
# since with out == g LLVM's overlap check picks the scalar loop (~4x slower).
@nb.njit(**_NJIT)
def swiglu_chunk_over(other, out, lo, hi, alpha, over_g):
    os_ = other[lo:hi]
    ys = out[lo:hi]
    one = out.dtype.type(1.0)
    if over_g:
        for i in range(ys.size):
            a = ys[i]
            ys[i] = a / (one + fexp(-alpha * a)) * os_[i]
    else:
        for i in range(ys.size):
            a = os_[i]
            ys[i] = a / (one + fexp(-alpha * a)) * ys[i]


@nb.njit(parallel=True, **_NJIT)
def swiglu_parallel_over(other, out, alpha, chunk, over_g):
    n = out.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        swiglu_chunk_over(other, out, lo, min(lo + chunk, n), alpha, over_g)


def swiglu_plan(ctx):
    cdt = compute_dtype(ctx.dtype(0))
    return cdt.type(ctx.attrs["alpha"]), _chunk(math.prod(ctx.shape(0)), True)


@nb.njit(parallel=True, **_NJIT)
def swiglu_rows_parallel(g, gs, v, vs, out, n, alpha):
    for r in nb.prange(out.size // n):
        swiglu_chunk(g[r * gs : r * gs + n], v[r * vs : r * vs + n], out[r * n : (r + 1) * n], 0, n, alpha)


@nb.njit(**_NJIT)
def swiglu_rows(g, gs, v, vs, out, n, alpha):
    for r in range(out.size // n):
        swiglu_chunk(g[r * gs : r * gs + n], v[r * vs : r * vs + n], out[r * n : (r + 1) * n], 0, n, alpha)


def _span(x: np.ndarray):
    """A matrix of rows with unit-stride columns as (the 1-D contiguous run of memory from its
    first to its last element, its row stride in elements), so that numba sees contiguous rows
    (and vectorizes); None when ``x`` (any rank) does not fold into such rows (column blocks of
    a wider matrix fold: the gate and up halves of one GEMM's output)."""
    n = x.shape[-1] if x.ndim else 0
    if n == 0 or x.size == 0 or x.strides[-1] != x.itemsize:
        return None
    try:
        r = x.view()
        r.shape = (-1, n)
    except AttributeError:
        return None
    rs = r.strides[0] // x.itemsize if r.shape[0] > 1 else n
    if rs < n or r.strides[0] % x.itemsize:
        return None
    span = (r.shape[0] - 1) * rs + n
    return np.lib.stride_tricks.as_strided(r, shape=(span,), strides=(x.itemsize,)), rs


def swiglu(ins, outs, attrs, plan, ws):
    """Strided inputs are read in place when their rows are unit-stride (column views of a
    stacked gate|up product), else made contiguous first."""
    alpha, chunk = plan
    g, v, out = ins[0], ins[1], outs[0]
    if not (g.flags.c_contiguous and v.flags.c_contiguous):
        gs, vs = _span(g), _span(v)
        if gs is not None and vs is not None and out.flags.c_contiguous and g.shape == v.shape == out.shape:
            fn = swiglu_rows_parallel if chunk else swiglu_rows
            args = (gs[0], gs[1], vs[0], vs[1], out.reshape(-1), out.shape[-1], alpha)
            if kernel_cache.cold(fn, args):  # compiling in the background (opsnn.ops.tiering)
                swiglu_numpy(ins, outs, attrs, plan, ws)
            else:
                fn(*args)
            return
        g, v = np.ascontiguousarray(g), np.ascontiguousarray(v)
    g, v = g.reshape(-1), v.reshape(-1)
    out = out.reshape(-1)
    ptr = out.ctypes.data
    if ptr in (g.ctypes.data, v.ctypes.data):
        over_g = ptr == g.ctypes.data
        other = v if over_g else g
        if chunk:
            swiglu_parallel_over(other, out, alpha, chunk, over_g)
        else:
            swiglu_chunk_over(other, out, 0, out.size, alpha, over_g)
        return
    if np.may_share_memory(out, g) or np.may_share_memory(out, v):
        res = np.empty_like(out)  # a partial overlap: computed aside, then copied
        swiglu([g, v], [res], attrs, plan, ws)
        out[...] = res
        return
    if chunk:
        if kernel_cache.cold(swiglu_parallel, (g, v, out, alpha, chunk)):
            swiglu_numpy([g, v], [out], attrs, plan, ws)
        else:
            swiglu_parallel(g, v, out, alpha, chunk)
    else:
        swiglu_chunk(g, v, out, 0, g.size, alpha)


def swiglu_numpy(ins, outs, attrs, plan, ws):
    """:func:`swiglu` in numpy, the same float32 arithmetic (``g / (1 + exp(-alpha g)) * v``):
    nothing to compile, run while the numba kernel compiles in the background (``opsnn.ops.tiering``)."""
    alpha = plan[0]
    g, v = ins
    with np.errstate(all="ignore"):
        outs[0][...] = g / (g.dtype.type(1.0) + np.exp(-alpha * g)) * v


# -- Softmax / LogSoftmax: online single pass per row ----------------------------------------------------
# The sum loop is a reduction: "reassoc" lets LLVM vectorize it. numba compiles callees
# with the caller's fast-math flags, and reassociation inside fexp would undo its exact
# range reduction, so the exps go to a scratch row first (a plain loop) and the
# reassociating loop only adds. The max uses llvm.maxnum, which vectorizes without flags.
# The "v == m counts exp(0) = 1" rule keeps rows that start with -inf (or are all -inf)
# from computing exp(-inf - -inf); NaN inputs poison the sum, and a +inf maximum makes the
# row NaN, both as exp(x - max) / sum does.
_REDUCE = dict(_NJIT, fastmath={"reassoc", "nsz"})


@nb.njit(**_NJIT)
def _chunk_max(xs):
    """The max of ``xs`` ignoring NaNs (-inf when empty or all NaN; the sum catches NaNs)."""
    m = xs.dtype.type(-np.inf)
    for k in range(xs.size):
        m = _fmax(m, xs[k])
    return m


@nb.njit(**_REDUCE)
def _chunk_sum(xs):
    s = xs.dtype.type(0.0)
    for k in range(xs.size):
        s += xs[k]
    return s


@nb.njit(**_NJIT)
def _exp_shifted(xs, m, es):
    """es = exp(xs - m), counting xs == m as exp(0) (es may be xs itself)."""
    zero = xs.dtype.type(0.0)
    for k in range(xs.size):
        v = xs[k]
        es[k] = fexp(zero if v == m else v - m)


@nb.njit(**_NJIT)
def _exp_shifted_over(a, m):
    """a = exp(a - m), as _exp_shifted(a, m, a) gives it: one array, so the loop vectorizes (two views of
    one buffer fail LLVM's runtime overlap check and take its scalar loop, ~5x slower)."""
    zero = a.dtype.type(0.0)
    for k in range(a.size):
        v = a[k]
        a[k] = fexp(zero if v == m else v - m)


@nb.njit(**_NJIT)
def _row_stats(xr, scratch, cms):
    """(max, sum of exp(x - max)) of the contiguous row ``xr`` in one pass over memory.
    ``scratch`` (same length, may be ``xr``) receives exp(x - m_c) per chunk c, m_c the
    running max after that chunk; ``cms`` (empty, or one slot per chunk) records the m_c."""
    n = xr.size
    m = xr.dtype.type(-np.inf)
    s = 0.0
    over = xr.ctypes.data == scratch.ctypes.data and xr.strides[0] == scratch.strides[0]
    for c0 in range(0, n, SOFTMAX_CHUNK):
        c1 = min(c0 + SOFTMAX_CHUNK, n)
        xs = xr[c0:c1]
        cm = _chunk_max(xs)
        if cm > m:
            s *= math.exp(m - cm)
            m = cm
        es = scratch[c0:c1]
        if over:
            _exp_shifted_over(es, m)
        else:
            _exp_shifted(xs, m, es)
        s += _chunk_sum(es)
        if cms.size:
            cms[c0 // SOFTMAX_CHUNK] = m
    if m == np.inf:
        s = np.nan
    return m, s


@nb.njit(**_NJIT)
def _row_rescale(yr, cms, m, s):
    """Turn the exps ``_row_stats`` left in ``yr`` into exp(x - m) / s with one multiply per
    chunk (factor exp(m_c - m) / s); no ``cms`` means one chunk scanned with m_c = m.
    An all -inf row (m = -inf) gives NaN, as exp(x - max) does."""
    if cms.size == 0:
        f = yr.dtype.type(math.exp(m - m) / s)
        for k in range(yr.size):
            yr[k] *= f
        return
    n = yr.size
    for c in range(cms.size):
        ys = yr[c * SOFTMAX_CHUNK : min((c + 1) * SOFTMAX_CHUNK, n)]
        f = ys.dtype.type(math.exp(cms[c] - m) / s)
        for k in range(ys.size):
            ys[k] *= f


@nb.njit(**_NJIT)
def _row_write(xr, yr, m, s, log):
    mm = xr.dtype.type(m)
    if log:
        # (x - m) - log s: x - m is exact near the max, where m + log s would round at m's scale
        lse = xr.dtype.type(math.log(s))
        for k in range(xr.size):
            yr[k] = (xr[k] - mm) - lse
    else:
        inv = xr.dtype.type(1.0 / s)
        for k in range(xr.size):
            yr[k] = fexp(xr[k] - mm) * inv  # an all -inf row gives NaN, as exp(x - max) does


@nb.njit(**_NJIT)
def _exp_shifted_lanes(xs, ms, es):
    """es[j] = exp(xs[j] - ms[j]), counting xs[j] == ms[j] as exp(0)."""
    zero = xs.dtype.type(0.0)
    for j in range(xs.size):
        v = xs[j]
        mj = ms[j]
        es[j] = fexp(zero if v == mj else v - mj)


@nb.njit(**_NJIT)
def _softmax_lanes(xs, ms, inv, ys):
    for j in range(xs.size):
        ys[j] = fexp(xs[j] - ms[j]) * inv[j]


@nb.njit(**_NJIT)
def _block_rows(x, out, base, n, inner, w, log):
    """Softmax of ``w`` neighbouring rows: positions base..base+w of the contiguous inner
    dim, each read along the axis with stride ``inner``. Every loop runs across the ``w``
    positions (contiguous loads, vectorized, no cross-lane reduction); steps along the axis
    go in groups of SOFTMAX_STEPS whose max is taken first, then the online sums update.
    The exps go through a scratch row: LLVM does not vectorize them fused with the
    accumulation into ``s``."""
    m = np.full(w, -np.inf, dtype=x.dtype)
    cm = np.empty(w, dtype=x.dtype)
    s = np.zeros(w, dtype=np.float64)  # float64 sums: log-softmax reads log(s) at full precision
    e = np.empty(w, dtype=x.dtype)
    for k0 in range(0, n, SOFTMAX_STEPS):
        k1 = min(k0 + SOFTMAX_STEPS, n)
        cm[:] = m
        for k in range(k0, k1):
            xs = x[base + k * inner : base + k * inner + w]
            for j in range(w):
                cm[j] = _fmax(cm[j], xs[j])
        for j in range(w):
            if cm[j] > m[j]:
                s[j] *= fexp(m[j] - cm[j])
                m[j] = cm[j]
        for k in range(k0, k1):
            _exp_shifted_lanes(x[base + k * inner : base + k * inner + w], m, e)
            for j in range(w):
                s[j] += e[j]
    for j in range(w):
        if m[j] == np.inf:
            s[j] = np.nan
    if log:
        for j in range(w):
            e[j] = math.log(s[j])
        for k in range(n):
            xs = x[base + k * inner : base + k * inner + w]
            ys = out[base + k * inner : base + k * inner + w]
            for j in range(w):
                ys[j] = (xs[j] - m[j]) - e[j]
    else:
        for j in range(w):
            e[j] = x.dtype.type(1.0) / s[j]
        for k in range(n):
            _softmax_lanes(
                x[base + k * inner : base + k * inner + w], m, e, out[base + k * inner : base + k * inner + w]
            )


@nb.njit(**_NJIT)
def softmax_item(x, out, item, n, inner, nblocks, log, parts, phase, stats, nch):
    """Work item ``item`` of a softmax launch.

    parts == 1: one row (inner == 1) or a block of up to SOFTMAX_BLOCK rows sharing an
    outer index (inner > 1). parts > 1 (few long rows, inner == 1): slice ``item % parts``
    of row ``item // parts`` (``nblocks`` rows in all); phase 0 stores the slice's (max,
    sum) in ``stats``, phase 1 writes it with the row's merged pair (see ``merge_parts``).
    ``nch > 0`` (softmax of contiguous rows longer than a chunk): each row or slice keeps
    its ``nch`` chunk maxima in ``stats`` and the write pass rescales the stored exps."""
    if inner > 1:
        o = item // nblocks
        j0 = (item % nblocks) * SOFTMAX_BLOCK
        _block_rows(x, out, o * n * inner + j0, n, inner, min(SOFTMAX_BLOCK, inner - j0), log)
        return
    if parts > 1:
        r = item // parts
        per = (n + parts - 1) // parts
        lo = r * n + min(n, (item % parts) * per)
        hi = r * n + min(n, (item % parts + 1) * per)
        off = 2 * (nblocks * parts + nblocks)  # after the slices' and the rows' pairs
    else:
        lo = item * n
        hi = lo + n
        off = 0
    xr = x[lo:hi]
    yr = out[lo:hi]
    cms = stats[off + item * nch : off + (item + 1) * nch]
    if phase == 0:
        m, s = _row_stats(xr, yr, cms)
        if parts > 1:
            stats[2 * item] = m
            stats[2 * item + 1] = s
            return
    else:
        k = 2 * (nblocks * parts + item // parts)
        m, s = stats[k], stats[k + 1]
    _row_finish(xr, yr, cms, m, s, log)


@nb.njit(**_NJIT)
def _row_finish(xr, yr, cms, m, s, log):
    if log:
        _row_write(xr, yr, m, s, log)
    else:
        _row_rescale(yr, cms, m, s)


@nb.njit(**_NJIT)
def softmax_serial(x, out, items, n, inner, nblocks, log, parts, phase, stats, nch):
    for it in range(items):
        softmax_item(x, out, it, n, inner, nblocks, log, parts, phase, stats, nch)


@nb.njit(**_NJIT)
def softmax_rows_serial(x, out, items, n, log, stats, nch):
    """``softmax_serial`` of contiguous rows (inner == 1), a row per item: a kernel of its own,
    without the strided rows' path (``_block_rows``), which is most of softmax_serial's compile."""
    for it in range(items):
        xr = x[it * n : (it + 1) * n]
        yr = out[it * n : (it + 1) * n]
        cms = stats[it * nch : (it + 1) * nch]
        m, s = _row_stats(xr, yr, cms)
        _row_finish(xr, yr, cms, m, s, log)


@nb.njit(parallel=True, **_NJIT)
def softmax_parallel(x, out, items, n, inner, nblocks, log, parts, phase, stats, nch):
    for it in nb.prange(items):
        softmax_item(x, out, it, n, inner, nblocks, log, parts, phase, stats, nch)


@nb.njit(**_NJIT)
def merge_parts(stats, rows, parts):
    """Merge each row's per-slice (max, sum) pairs exactly: s = sum_p s_p e^(m_p - m);
    row r's pair goes to ``stats[2 (rows*parts + r)]``."""
    for r in range(rows):
        m = -np.inf
        for p in range(parts):
            m = max(m, stats[2 * (r * parts + p)])
        s = 0.0
        for p in range(parts):
            mp = stats[2 * (r * parts + p)]
            sp = stats[2 * (r * parts + p) + 1]
            if mp == m:  # also m = -inf (an all -inf slice): no exp(nan)
                s += sp
            else:
                s += sp * math.exp(mp - m)
        if m == np.inf:
            s = np.nan
        stats[2 * (rows * parts + r)] = m
        stats[2 * (rows * parts + r) + 1] = s


_NO_STATS = np.empty(0, np.float64)


class SoftmaxPlan(NamedTuple):
    """How one softmax launch runs. ``mode``: 'serial', 'parallel', 'split' (few long rows,
    each cut into ``parts`` slices across threads) or 'empty'; ``items`` work items (rows,
    row blocks or slices); ``nblocks`` row blocks per outer index (for 'split': the row
    count); ``nch`` chunk maxima kept per row or slice; ``workspace`` bytes of float64
    statistics (slice/row (max, sum) pairs, chunk maxima)."""

    mode: str
    items: int
    n: int
    inner: int
    nblocks: int
    log: bool
    parts: int
    nch: int
    workspace: int


def softmax_plan(ctx, axis: int, log: bool) -> SoftmaxPlan:
    shape = ctx.shape(0)
    outer = math.prod(shape[:axis])
    n = shape[axis]
    inner = math.prod(shape[axis + 1 :])
    total = outer * n * inner
    if total == 0:
        return SoftmaxPlan("empty", 0, n, inner, 1, log, 1, 0, 0)
    nblocks = 1 if inner == 1 else -(-inner // SOFTMAX_BLOCK)
    items = outer * nblocks
    threads = nb.get_num_threads()
    parallel = total >= PARALLEL_MIN_COSTLY and threads > 1
    if parallel and inner == 1 and outer < threads and n >= SPLIT_MIN:
        parts = max(2, min(n // (SPLIT_MIN // 4), -(-4 * threads // outer)))
        per_part = -(-n // parts)  # ceil(n / parts)
        nch = 0 if log else -(-per_part // SOFTMAX_CHUNK)
        items = outer * parts
        return SoftmaxPlan("split", items, n, inner, outer, log, parts, nch, 8 * (2 * (items + outer) + items * nch))
    nch = -(-n // SOFTMAX_CHUNK) if inner == 1 and not log and n > SOFTMAX_CHUNK else 0
    return SoftmaxPlan("parallel" if parallel else "serial", items, n, inner, nblocks, log, 1, nch, 8 * items * nch)


def softmax_workspace(ctx, plan: SoftmaxPlan) -> int:
    return plan.workspace


def softmax(ins, outs, attrs, plan, ws):
    mode, items, n, inner, k, log, parts, nch, nbytes = plan
    x = ins[0].reshape(-1)
    out = outs[0].reshape(-1)
    stats = ws[:nbytes].view(np.float64) if nbytes else _NO_STATS
    if mode == "serial" and inner == 1:
        softmax_rows_serial(x, out, items, n, log, stats, nch)
    elif mode == "serial":
        softmax_serial(x, out, items, n, inner, k, log, 1, 0, stats, nch)
    elif mode == "parallel":
        softmax_parallel(x, out, items, n, inner, k, log, 1, 0, stats, nch)
    elif mode == "split":
        softmax_parallel(x, out, items, n, inner, k, log, parts, 0, stats, nch)
        merge_parts(stats, k, parts)
        softmax_parallel(x, out, items, n, inner, k, log, parts, 1, stats, nch)


def ufunc_map(ins, outs, attrs, plan, ws):
    """``plan(x, out=y)``: a numpy ufunc as a pointwise kernel (nothing to compile)."""
    with np.errstate(all="ignore"):
        plan(ins[0], out=outs[0])


def softmax_numpy(ins, outs, attrs, plan, ws):
    """Softmax (or LogSoftmax) along ``plan = (axis, log)`` in numpy, as the definition writes it:
    nothing to compile, the first run's kernel while ``softmax`` compiles (``opsnn.ops.tiering``)."""
    axis, log = plan
    x, y = ins[0], outs[0]
    if x.size == 0:
        return
    with np.errstate(all="ignore"):
        z = x - x.max(axis=axis, keepdims=True)
        if log:
            np.subtract(z, np.log(np.exp(z).sum(axis=axis, keepdims=True)), out=y)
        else:
            e = np.exp(z)
            np.divide(e, e.sum(axis=axis, keepdims=True), out=y)


# -- Hardmax ------------------------------------------------------------------------------------------------
def hardmax_plan(ctx, axis: int) -> tuple:
    shape = ctx.shape(0)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def hardmax_numpy(ins, outs, attrs, plan, ws):
    """One-hot of the first maximum along the axis (NaN counts as the maximum, as in argmax)."""
    outer, n, inner = plan
    out = outs[0].reshape(outer, n, inner)
    out.fill(0)
    if out.size == 0:
        return
    idx = np.argmax(ins[0].reshape(outer, n, inner), axis=1)
    np.put_along_axis(out, idx[:, None, :], 1, axis=1)


# -- Shrink on integers ---------------------------------------------------------------------------------------
def shrink_numpy(ins, outs, attrs, plan, ws):
    """Shrink for any dtype: computed in float64, cast back like the ONNX definition."""
    x = ins[0]
    lambd, bias = float(attrs["lambd"]), float(attrs["bias"])
    xf = x.astype(np.float64)
    y = np.where(xf < -lambd, xf + bias, np.where(xf > lambd, xf - bias, 0.0))
    np.copyto(outs[0], y, casting="unsafe")
