"""CPU epilogues for fused ops: ``y = act(y + bias + residual)`` in one parallel pass.

The producer (conv / GEMM) writes ``y``; the epilogue then adds a per-column bias and a
residual and applies the activation in place, instead of three more ops each reading and
writing the whole tensor.
"""

from __future__ import annotations

import functools
import math

import numba as nb
import numpy as np

from ... import dtypes as _dt
from ...runtime import kernel_cache
from . import activation as A

#: activation codes understood by the epilogue kernels
ACTIVATIONS = {
    "": 0,
    "Relu": 1,
    "Sigmoid": 2,
    "Tanh": 3,
    "Gelu": 4,
    "GeluTanh": 5,
    "Swish": 6,
    "LeakyRelu": 7,
    "Clip": 8,
}


#: epilogue code -> the activation kernels' op code (their vectorized loops, shared with the
#: standalone activation ops: float32 math that LLVM vectorizes, instead of libm per element)
_MAP_OP = np.array([0, 0, A.SIGMOID, A.TANH, A.GELU_ERF, A.GELU_TANH, A.SWISH, A.LEAKY_RELU, 0], np.int64)
CLIP = ACTIVATIONS["Clip"]
_NAMES = {code: (name or "none").lower() for name, code in ACTIVATIONS.items()}


#: elements from which the epilogue runs in parallel: the GEMM before it (MKL, on numba's own
#: libgomp pool) leaves the workers spinning, so a second thread pays off early (figures and the
#: history of this threshold: docs/performance.md, "Parallel thresholds")
PARALLEL_MIN = 1 << 15
PARALLEL_MIN_COSTLY = 1 << 15
_COSTLY = (
    ACTIVATIONS["Sigmoid"],
    ACTIVATIONS["Tanh"],
    ACTIVATIONS["Gelu"],
    ACTIVATIONS["GeluTanh"],
    ACTIVATIONS["Swish"],
)


@nb.njit(nogil=True, cache=True, inline="always")
def epilogue_adds(y, bias, rbias, z, r):
    # separate simple passes (adds, then the activation), chosen outside the inner loops so
    # that each is a branch-free loop LLVM vectorizes; a row (a conv plane, a GEMM row) stays
    # in cache between passes
    cols = y.shape[1]
    row = y[r]
    # a per-row bias (NCHW: rows are (image, channel) planes, so it cycles) joins whichever add
    # pass runs
    rb = rbias[r % rbias.size] if rbias.size > 0 else row.dtype.type(0)
    if bias.size > 0 and z.size > 0:
        zr = z[r]
        for c in range(cols):
            row[c] += bias[c] + zr[c] + rb
    elif bias.size > 0:
        for c in range(cols):
            row[c] += bias[c] + rb
    elif z.size > 0:
        zr = z[r]
        for c in range(cols):
            row[c] += zr[c] + rb
    elif rbias.size > 0:
        for c in range(cols):
            row[c] += rb


@nb.njit(nogil=True, cache=True, inline="always")
def epilogue_act(row, code, alpha, beta):
    """The activation ``code`` in place on one row: Relu and Clip, written inline (the others run
    :func:`epilogue_span_row`)."""
    cols = row.size
    if code == 1:
        for c in range(cols):
            if row[c] < 0:
                row[c] = 0
    elif code == CLIP:
        lo = row.dtype.type(alpha)
        hi = row.dtype.type(beta)
        for c in range(cols):
            row[c] = min(max(row[c], lo), hi)


@nb.njit(nogil=True, cache=True, inline="always")
def epilogue_span_row(y, bias, rbias, z, r, op, alpha, beta):
    """Row ``r`` of the epilogue for an activation with a vectorized loop (``op``, a constant):
    per block of the row, the adds into a scratch block, then the activation from the scratch
    back into the row. One pass fewer than adds in place then the activation through a scratch
    (the loop cannot vectorize in place), and the same sums as :func:`epilogue_adds`."""
    row = y[r]
    cols = row.size
    rb = rbias[r % rbias.size] if rbias.size > 0 else row.dtype.type(0)
    has_b, has_z = bias.size > 0, z.size > 0
    tmp = np.empty(min(A.SCRATCH, cols), y.dtype)
    for s in range(0, cols, A.SCRATCH):
        e = min(s + A.SCRATCH, cols)
        t = tmp[: e - s]
        seg = row[s:e]
        if has_b and has_z:
            bs, zs = bias[s:e], z[r, s:e]
            for c in range(e - s):
                t[c] = seg[c] + (bs[c] + zs[c] + rb)
        elif has_b:
            bs = bias[s:e]
            for c in range(e - s):
                t[c] = seg[c] + (bs[c] + rb)
        elif has_z:
            zs = z[r, s:e]
            for c in range(e - s):
                t[c] = seg[c] + (zs[c] + rb)
        else:
            for c in range(e - s):
                t[c] = seg[c] + rb
        A.chunk_const(op, t, seg, 0, e - s, y.dtype.type(alpha), y.dtype.type(beta))


@nb.njit(nogil=True, cache=True, inline="always")
def epilogue_row(y, bias, rbias, z, r, code, alpha, beta):
    """Row ``r`` of the epilogue, the activation ``code`` a run-time value (every activation
    compiles in): for kernels that take the code as an argument (gemm's bfloat16 epilogue)."""
    epilogue_adds(y, bias, rbias, z, r)
    row = y[r]
    cols = row.size
    if code == 1:
        for c in range(cols):
            if row[c] < 0:
                row[c] = 0
    elif code == CLIP:
        lo = row.dtype.type(alpha)
        hi = row.dtype.type(beta)
        for c in range(cols):
            row[c] = min(max(row[c], lo), hi)
    elif code != 0:
        A.map_chunk(row, row, 0, cols, _MAP_OP[code], row.dtype.type(alpha), row.dtype.type(beta))


@functools.cache
def rows_kernels(code: int) -> tuple:
    """(parallel, serial) epilogue kernels of one activation, both ``(y, bias, rbias, z, alpha,
    beta)``: ``y[r, c] = act(y[r, c] + bias[c] + rbias[r % len(rbias)] + z[r, c])`` (bias, rbias,
    z of size 0 mean absent), rows in parallel or on the calling thread. ``code`` is a constant
    in them, so numba compiles that activation alone (a run-time code compiled all sixteen)."""
    op = int(_MAP_OP[code])
    if code in (0, ACTIVATIONS["Relu"], CLIP):  # activations written inline: adds then the activation in place

        def parallel(y, bias, rbias, z, alpha, beta):
            for r in nb.prange(y.shape[0]):
                epilogue_adds(y, bias, rbias, z, r)
                epilogue_act(y[r], code, alpha, beta)

        def serial(y, bias, rbias, z, alpha, beta):
            for r in range(y.shape[0]):
                epilogue_adds(y, bias, rbias, z, r)
                epilogue_act(y[r], code, alpha, beta)

    else:  # the activation kernels' loops: through a scratch block (epilogue_span_row)

        def parallel(y, bias, rbias, z, alpha, beta):
            for r in nb.prange(y.shape[0]):
                epilogue_span_row(y, bias, rbias, z, r, op, alpha, beta)

        def serial(y, bias, rbias, z, alpha, beta):
            for r in range(y.shape[0]):
                epilogue_span_row(y, bias, rbias, z, r, op, alpha, beta)

    # distinct names: numba's cache files are named by them (the code and lines are shared)
    name = _NAMES[code]
    parallel.__name__ = parallel.__qualname__ = f"epilogue_rows_{name}"
    serial.__name__ = serial.__qualname__ = f"epilogue_rows_serial_{name}"
    return nb.njit(parallel=True, nogil=True, cache=True)(parallel), nb.njit(nogil=True, cache=True)(serial)


def _columns(bias: np.ndarray, cols: int, dtype) -> np.ndarray:
    """A per-column bias as ``cols`` contiguous values (a scalar bias, shape () or (1,), repeated:
    the kernels index it by column)."""
    b = bias.reshape(-1).astype(dtype, copy=False)
    return b if b.size == cols else np.ascontiguousarray(np.broadcast_to(b, (cols,)))


def epilogue(
    y: np.ndarray,
    bias: np.ndarray | None,
    z: np.ndarray | None,
    code: int,
    alpha: float,
    beta: float,
    row_bias: np.ndarray | None = None,
    parallel: bool | None = None,
) -> None:
    """Apply the epilogue in place on ``y`` viewed as (rows, last dim): ``bias`` per column,
    ``row_bias`` per row (cycling: a conv's per-channel bias over (image, channel) rows).
    ``parallel``: rows on numba's threads (True) or the calling thread (False); None: from
    ``PARALLEL_MIN`` / ``PARALLEL_MIN_COSTLY``."""
    if y.size == 0 or (code == 0 and bias is None and z is None and row_bias is None):
        return
    cols = y.shape[-1] if y.ndim else 1
    y2 = y.reshape(-1, cols)
    empty = np.empty(0, y.dtype)
    b = empty if bias is None else _columns(bias, cols, y.dtype)
    rb = empty if row_bias is None else row_bias.reshape(-1).astype(y.dtype, copy=False)
    zz = np.empty((0, 0), y.dtype) if z is None else z.reshape(-1, cols).astype(y.dtype, copy=False)
    if parallel is None:
        parallel = y.size >= (PARALLEL_MIN_COSTLY if code in _COSTLY else PARALLEL_MIN)
    par, ser = rows_kernels(code)
    (par if parallel else ser)(y2, b, rb, zz, alpha, beta)


def costly(code: int) -> bool:
    """True when the epilogue's activation ``code`` computes an exp, tanh or erf per element."""
    return code in _COSTLY


#: epilogue codes :func:`epilogue_numpy` runs (the others compile their numba kernel)
NUMPY_ACTIVATIONS = (0, ACTIVATIONS["Relu"], ACTIVATIONS["Gelu"])
#: erfc(z) = t exp(P(t) - z^2), t = 2 / (2 + z): P's coefficients in t^0..t^10, those of the float32
#: fphi (kernels.cpu.activation) multiplied out of its Estrin form
_ERFC_P = (
    -1.2655641415664483,
    1.0014734280472495,
    0.35687697407771557,
    0.21073610961693354,
    -0.6520158786036993,
    1.5108167291238495,
    -3.28098269615674,
    3.930654109940149,
    -2.568642459125026,
    0.8827151406918843,
    -0.12606728649156682,
)
_erfc64 = np.frompyfunc(math.erfc, 1, 1)


def gelu_erf_numpy(y: np.ndarray) -> np.ndarray:
    """``y * Phi(y)`` (exact-erf GELU) in numpy, a new array of y's dtype: float32 evaluates the
    float32 kernels' erfc fit in float64, float64 calls math.erfc per element; NaN stays NaN,
    +inf gives +inf and -inf NaN, as the numba kernels."""
    with np.errstate(all="ignore"):
        x = y.astype(np.float64)
        if y.dtype == np.float64:
            phi = 0.5 * _erfc64(x * -0.7071067811865476).astype(np.float64)
        else:
            z = np.abs(x) * 0.7071067811865476
            t = 2.0 / (2.0 + z)
            p = np.full_like(t, _ERFC_P[-1])
            for c in _ERFC_P[-2::-1]:
                p *= t
                p += c
            p -= x * x * 0.5
            np.exp(p, out=p)
            p *= t
            p *= 0.5  # erfc(|x| / sqrt 2) / 2
            phi = np.where(x < 0, p, 1.0 - p)
        return (x * phi).astype(y.dtype)


def epilogue_numpy(y, bias, z, code: int, alpha: float, beta: float) -> None:
    """:func:`epilogue` in numpy for the codes in ``NUMPY_ACTIVATIONS``: nothing to compile, a cold
    plan's epilogue while the numba one compiles in the background (``opsnn.ops.tiering``)."""
    if code not in NUMPY_ACTIVATIONS:
        from ...errors import ParamInvalidError

        raise ParamInvalidError(
            f"epilogue_numpy: activation code {code} has no numpy form; expected one of {NUMPY_ACTIVATIONS}"
        )
    if y.size == 0:
        return
    cols = y.shape[-1] if y.ndim else 1
    y2 = y.reshape(-1, cols)
    with np.errstate(all="ignore"):
        zz = None if z is None else z.reshape(-1, cols).astype(y.dtype, copy=False)
        if bias is not None:
            b = _columns(bias, cols, y.dtype)
            y2 += b if zz is None else b + zz  # bias + residual first, as the numba rows
        elif zz is not None:
            y2 += zz
        if code == ACTIVATIONS["Relu"]:
            np.copyto(y2, 0, where=y2 < 0)  # NaN stays NaN
        elif code == ACTIVATIONS["Gelu"]:
            y2[...] = gelu_erf_numpy(y2)


# -- a bound on the inputs of a product: does act(conv(X, W) + B + Z) meet a NaN? ------------------------
#: elements per task of :func:`max_abs`
MAX_ABS_CHUNK = 1 << 16
#: |x|'s bits of a float32 (the sign cleared) and the smallest such bits of an Inf or a NaN
_ABS_BITS32, _INF_BITS32 = np.uint32(0x7FFFFFFF), 0x7F800000
#: |x|'s bits of a bfloat16 and the smallest such bits of an Inf or a NaN (exponent all ones: float32's upper half)
_ABS_BITS16, _INF_BITS_BF16 = np.uint16(0x7FFF), 0x7F80


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _max_abs_span(x, lo, hi):
    m = 0.0
    s = 0.0  # stays 0 while every element is finite: a - a is NaN for a NaN or an Inf
    v = x[lo:hi]
    for i in range(v.size):
        a = abs(np.float64(v[i]))
        m = a if a > m else m
        s += a - a
    return m if s == 0.0 else np.inf


@nb.njit(nogil=True, cache=True)
def _max_abs_bits_span(u, lo, hi):
    # float32 bits with the sign cleared order as |x| does, every Inf and NaN above the finite ones:
    # an unsigned max (the casts keep it 32-bit). A slice indexed from 0: a range(lo, hi) index may be
    # negative for numba, whose wraparound select kept LLVM from vectorizing (10x slower)
    m = np.uint32(0)
    v = u[lo:hi]
    for i in range(v.size):
        m = np.uint32(max(m, np.uint32(v[i] & _ABS_BITS32)))
    return m


@nb.njit(nogil=True, cache=True)
def _max_abs_bits16_span(u, lo, hi):
    # bfloat16 bits: the same unsigned order with the 16-bit sign cleared
    m = np.uint16(0)
    v = u[lo:hi]
    for i in range(v.size):
        m = np.uint16(max(m, np.uint16(v[i] & _ABS_BITS16)))
    return m


@nb.njit(parallel=True, nogil=True, cache=True)
def _max_abs_bits16_parallel(u, chunk):
    n = u.size
    nch = (n + chunk - 1) // chunk
    parts = np.zeros(nch, np.uint16)
    for t in nb.prange(nch):
        parts[t] = _max_abs_bits16_span(u, t * chunk, min(n, t * chunk + chunk))
    m = np.uint16(0)
    for t in range(nch):
        m = np.uint16(max(m, parts[t]))
    return m


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _max_abs_parallel(x, chunk):
    n = x.size
    nch = (n + chunk - 1) // chunk
    parts = np.zeros(nch)
    for t in nb.prange(nch):
        parts[t] = _max_abs_span(x, t * chunk, min(n, t * chunk + chunk))
    m = 0.0
    for t in range(nch):
        m = parts[t] if parts[t] > m else m
    return m


@nb.njit(parallel=True, nogil=True, cache=True)
def _max_abs_bits_parallel(u, chunk):
    n = u.size
    nch = (n + chunk - 1) // chunk
    parts = np.zeros(nch, np.uint32)
    for t in nb.prange(nch):
        parts[t] = _max_abs_bits_span(u, t * chunk, min(n, t * chunk + chunk))
    m = np.uint32(0)
    for t in range(nch):
        m = np.uint32(max(m, parts[t]))
    return m


def max_abs(x: np.ndarray) -> float:
    """``max |x|`` over a contiguous array, ``inf`` when it holds a NaN or an Inf (one read pass;
    float32 and bfloat16 as integer bits, at memory speed)."""
    flat = x.reshape(-1)
    if flat.dtype == np.float32:
        u = flat.view(np.uint32)
        fn, args = (
            (_max_abs_bits_span, (u, 0, u.size))
            if u.size <= MAX_ABS_CHUNK
            else (_max_abs_bits_parallel, (u, MAX_ABS_CHUNK))
        )
        if kernel_cache.cold(fn, args):  # compiling in the background (opsnn.ops.tiering): numpy's max
            bits = int(np.bitwise_and(u, np.uint32(_ABS_BITS32)).max()) if u.size else 0
        else:
            bits = int(fn(*args))
        return np.inf if bits >= _INF_BITS32 else float(np.uint32(bits).view(np.float32))
    if flat.dtype == _dt.bfloat16:
        u = flat.view(np.uint16)
        bits = int(
            _max_abs_bits16_span(u, 0, u.size)
            if u.size <= MAX_ABS_CHUNK
            else _max_abs_bits16_parallel(u, MAX_ABS_CHUNK)
        )
        # a bfloat16 is the upper half of the float32 of equal value
        return np.inf if bits >= _INF_BITS_BF16 else float(np.uint32(bits << 16).view(np.float32))
    if flat.size <= MAX_ABS_CHUNK:
        return float(_max_abs_span(flat, 0, flat.size))
    return float(_max_abs_parallel(flat, MAX_ABS_CHUNK))
