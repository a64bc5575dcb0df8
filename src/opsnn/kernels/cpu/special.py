"""CPU kernels of the elementwise math beyond ONNX's set: special functions (log1p, expm1, erfc,
erfinv, lgamma, digamma, trigamma, logit) as flat maps and binary math (atan2, hypot, copysign,
logaddexp, fmax, fmin, xlogy, heaviside) on the broadcasting walk of :mod:`.elementwise`.

Every value is computed in float64 and rounded once to the output dtype, so float32 results are
the correctly rounded float64 result in all but rare ties. Digamma and trigamma follow the Cephes
scheme (recurrence up to a large argument, then the asymptotic series; reflection below zero);
erfinv starts from Giles' single-precision approximation and takes Halley steps on erf (or on
erfc in the tails, where 1 - |y| is exact).

>>> import numpy as np
>>> x = np.array([1e-10, 0.5], np.float64)
>>> out = np.empty_like(x)
>>> unary_seg(LOG1P, x, out, 0.0, 0.0, False, 0, 2)
>>> bool(out[0] == np.log1p(1e-10))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np

from .elementwise import GRAIN, PARALLEL_MIN, Layout, _next_plane, _plane_geometry, _threads, plan_layout

# -- op codes ---------------------------------------------------------------------------------------
LOG1P, EXPM1, ERFC, ERFINV, LGAMMA, DIGAMMA, TRIGAMMA, LOGIT = range(8)
ATAN2, HYPOT, COPYSIGN, LOGADDEXP, FMAX, FMIN, XLOGY, HEAVISIDE = range(8)

_PI = math.pi
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
#: digamma's asymptotic coefficients in 1/x^2 (Cephes psi.c: B_2k / 2k, highest first)
_PSI_A = np.array(
    [
        8.33333333333333333333e-2,
        -2.10927960927960927961e-2,
        7.57575757575757575758e-3,
        -4.16666666666666666667e-3,
        3.96825396825396825397e-3,
        -8.33333333333333333333e-3,
        8.33333333333333333333e-2,
    ]
)
#: digamma's positive root as a double-double, and psi's Taylor coefficients there (psi^(n)(x0) / n!, n = 1..16):
#: near the root the recurrence's absolute error (~1e-16) would be all of the result
_PSI_ROOT_HI = 1.4616321449683622
_PSI_ROOT_LO = 9.549995429965697e-17
_PSI_ROOT_TAYLOR = np.array(
    [
        0.9676722454476212,
        -0.4427631689835921,
        0.258499760955651,
        -0.16394270544240652,
        0.10782405069126237,
        -0.07219956125645471,
        0.04880428816414311,
        -0.03316112647484736,
        0.022597648232218104,
        -0.01542476590494896,
        0.010538791616612175,
        -0.007204534386356869,
        0.004926781395729853,
        -0.003369801655439328,
        0.002305126326734928,
        -0.0015769367714301972,
    ]
)


# -- scalar functions (float64 in, float64 out) -------------------------------------------------------
@nb.njit(cache=True, error_model="numpy")
def _digamma_pos(x):
    """psi(x) for x > 0 (or NaN / +inf): the Taylor series near the root, else recurrence to x >= 10
    and the asymptotic series."""
    d = (x - _PSI_ROOT_HI) - _PSI_ROOT_LO
    if abs(d) < 0.125:  # 16 terms leave a remainder below 1e-16 of the result
        p = 0.0
        for k in range(_PSI_ROOT_TAYLOR.size - 1, -1, -1):
            p = p * d + _PSI_ROOT_TAYLOR[k]
        return p * d
    acc = 0.0
    while x < 10.0:
        acc -= 1.0 / x
        x += 1.0
    y = 0.0
    if x < 1.0e17:  # beyond, the series terms are below an ulp of log(x)
        z = 1.0 / (x * x)
        p = 0.0
        for c in _PSI_A:
            p = p * z + c
        y = z * p
    return acc + math.log(x) - 0.5 / x - y


@nb.njit(cache=True, error_model="numpy")
def digamma(x):
    """psi(x) with torch's special values: -inf at +0, +inf at -0, NaN at negative integers and -inf."""
    if x == 0.0:
        return math.copysign(math.inf, -x)
    if x < 0.0:
        if x == math.floor(x):
            return math.nan
        # tan(pi (x - round(x))): exact reduction, so pi * r keeps its digits for large |x| and near poles
        r = x - np.rint(x)
        return _digamma_pos(1.0 - x) - _PI / math.tan(_PI * r)
    return _digamma_pos(x)


@nb.njit(cache=True, error_model="numpy")
def _trigamma_pos(x):
    """psi'(x) for x > 0: recurrence to x >= 12, then the asymptotic series through B_14."""
    acc = 0.0
    while x < 12.0:
        acc += 1.0 / (x * x)
        x += 1.0
    ixx = 1.0 / (x * x)
    s = 1.0 / 6.0 - ixx * (
        1.0 / 30.0
        - ixx * (1.0 / 42.0 - ixx * (1.0 / 30.0 - ixx * (5.0 / 66.0 - ixx * (691.0 / 2730.0 - ixx * (7.0 / 6.0)))))
    )
    return acc + 1.0 / x + 0.5 * ixx + s * ixx / x


@nb.njit(cache=True, error_model="numpy")
def trigamma(x):
    """psi'(x): +inf at the poles (0 and the negative integers), NaN at -inf."""
    if x <= 0.0:
        if x == -math.inf:
            return math.nan
        if x == math.floor(x):
            return math.inf
        # reflection psi'(x) + psi'(1 - x) = pi^2 / sin^2(pi x); sin^2 has period 1, so reduce x first
        r = x - np.rint(x)
        s = math.sin(_PI * r)
        return _PI * _PI / (s * s) - _trigamma_pos(1.0 - x)
    return _trigamma_pos(x)


@nb.njit(cache=True, error_model="numpy")
def erfinv(y):
    """The x with erf(x) = y: NaN outside [-1, 1], +-inf at +-1, -0.0 kept."""
    a = abs(y)
    if not a < 1.0:
        if a == 1.0:
            return math.copysign(math.inf, y)
        return math.nan  # |y| > 1 or NaN
    if a == 0.0:
        return y
    # Giles (2010), single-precision erfinv: a start within ~1e-7 where float32 reaches
    w = -math.log((1.0 - a) * (1.0 + a))
    if w < 5.0:
        w -= 2.5
        p = 2.81022636e-08
        p = 3.43273939e-07 + p * w
        p = -3.5233877e-06 + p * w
        p = -4.39150654e-06 + p * w
        p = 0.00021858087 + p * w
        p = -0.00125372503 + p * w
        p = -0.00417768164 + p * w
        p = 0.246640727 + p * w
        p = 1.50140941 + p * w
    else:
        w = math.sqrt(w) - 3.0
        p = -0.000200214257
        p = 0.000100950558 + p * w
        p = 0.00134934322 + p * w
        p = -0.00367342844 + p * w
        p = 0.00573950773 + p * w
        p = -0.0076224613 + p * w
        p = 0.00943887047 + p * w
        p = 1.00167406 + p * w
        p = 2.83297682 + p * w
    x = p * a
    if a <= 0.5:
        for _ in range(2):
            u = (math.erf(x) - a) / (_TWO_OVER_SQRT_PI * math.exp(-x * x))
            x -= u / (1.0 + x * u)  # Halley: erf'' = -2x erf'
    else:
        # Newton on log(erfc(x)) = log(1 - a), nearly quadratic in x; 1 - a is exact here (Sterbenz)
        lt = math.log(1.0 - a)
        for _ in range(6):
            e = math.erfc(x)
            step = (math.log(e) - lt) * e / (_TWO_OVER_SQRT_PI * math.exp(-x * x))
            x += step
            if abs(step) <= 1e-17 * x:
                break
    return math.copysign(x, y)


@nb.njit(cache=True, error_model="numpy")
def _lgamma(x):
    if x <= 0.0 and x == math.floor(x):
        return math.inf  # the poles and -inf (torch's value)
    return math.lgamma(x)


@nb.njit(inline="always", error_model="numpy")
def _sop(op, v):
    if op == LOG1P:
        return math.log1p(v)
    if op == EXPM1:
        return math.expm1(v)
    if op == ERFC:
        return math.erfc(v)
    if op == ERFINV:
        return erfinv(v)
    if op == LGAMMA:
        return _lgamma(v)
    if op == DIGAMMA:
        return digamma(v)
    if op == TRIGAMMA:
        return trigamma(v)
    return math.log(v / (1.0 - v))  # LOGIT, after the clamp (torch's formula)


@nb.njit(inline="always", error_model="numpy")
def _bop(op, x, y):
    if op == ATAN2:
        return math.atan2(x, y)
    if op == HYPOT:
        return math.hypot(x, y)
    if op == COPYSIGN:
        return math.copysign(x, y)
    if op == LOGADDEXP:
        if math.isinf(x) and x == y:
            return x  # inf + inf and -inf + -inf: exp(-|x - y|) would be NaN
        m = y if x < y else x  # std::max: a NaN x stays, a NaN y reaches the log1p term
        return m + math.log1p(math.exp(-abs(x - y)))
    if op == FMAX:
        return x if (x >= y or y != y) else y
    if op == FMIN:
        return x if (x <= y or y != y) else y
    if op == XLOGY:
        if y != y:
            return math.nan
        if x == 0.0:
            return 0.0
        return x * math.log(y)
    # HEAVISIDE, torch's rule: values where x == 0, else x > 0 (so NaN gives 0)
    if x == 0.0:
        return y
    return 1.0 if x > 0.0 else 0.0


# -- unary maps --------------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True, error_model="numpy")
def unary_seg(op, x, out, lo_v, hi_v, clamp, lo, hi):
    """out[lo:hi] = f(x[lo:hi]); Logit first clamps x to [lo_v, hi_v] in x's dtype when ``clamp``."""
    X = x[lo:hi]
    O = out[lo:hi]
    for j in range(hi - lo):
        v = X[j]
        if clamp:
            v = lo_v if v < lo_v else (hi_v if v > hi_v else v)
        O[j] = _sop(op, np.float64(v))


@nb.njit(parallel=True, nogil=True, cache=True)
def unary_parallel(op, x, out, lo_v, hi_v, clamp, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        unary_seg(op, x, out, lo_v, hi_v, clamp, t * chunk, min(t * chunk + chunk, n))


# -- binary maps on the broadcasting walk ------------------------------------------------------------
@nb.njit(nogil=True, cache=True, error_model="numpy")
def binary_block(op, a, b, out, shape, st, r0, r1, j0, n):
    """Rows [r0, r1), columns [j0, j0+n) of the walk :func:`.elementwise.plan_layout` planned."""
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
        for t in range(cnt):
            oa, ob, oo = pa + t * ma, pb + t * mb, po + t * inner
            for j in range(n):
                out[oo + j] = _bop(op, np.float64(a[oa + j * ia]), np.float64(b[ob + j * ib]))
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


# -- plans and kernel entry points: fn(ins, outs, attrs, plan, workspace) --------------------------------
@dataclass(frozen=True)
class SpecialPlan:
    """A flat map: serial below PARALLEL_MIN, else tasks of ``chunk``; ``eps`` < 0: no Logit clamp."""

    op: int
    size: int
    parallel: bool
    chunk: int
    eps: float = -1.0
    kind: str = "flat"


@dataclass(frozen=True)
class BinaryPlan:
    op: int
    layout: Layout

    @property
    def kind(self) -> str:
        return self.layout.kind


def unary_plan(ctx, op: int) -> SpecialPlan:
    size = math.prod(ctx.outputs[0].shape)
    threads = _threads()
    parallel = size >= PARALLEL_MIN and threads > 1
    chunk = max(GRAIN, -(-size // threads)) if parallel else max(size, 1)
    eps = float(ctx.attrs["eps"]) if op == LOGIT else -1.0
    return SpecialPlan(op, size, parallel, chunk, eps)


def binary_plan(ctx, op: int) -> BinaryPlan:
    return BinaryPlan(op, plan_layout(ctx.outputs[0].shape, [ctx.shape(0), ctx.shape(1)]))


def unary(ins, outs, attrs, plan: SpecialPlan, ws) -> None:
    if not plan.size:
        return
    x, out = ins[0].reshape(-1), outs[0].reshape(-1)
    # torch clamps in the input's dtype: lo = eps, hi = 1 - eps, both rounded to it
    lo_v = x.dtype.type(max(plan.eps, 0.0))
    hi_v = x.dtype.type(1) - lo_v
    clamp = plan.eps >= 0.0
    if plan.parallel:
        unary_parallel(plan.op, x, out, lo_v, hi_v, clamp, plan.chunk)
    else:
        unary_seg(plan.op, x, out, lo_v, hi_v, clamp, 0, plan.size)


def binary(ins, outs, attrs, plan: BinaryPlan, ws) -> None:
    lay = plan.layout
    if not lay.size:
        return
    a, b, out = ins[0].reshape(-1), ins[1].reshape(-1), outs[0].reshape(-1)
    if lay.parallel:
        binary_parallel(plan.op, a, b, out, lay.shape, lay.strides, lay.rows_per_task, lay.chunk)
    else:
        binary_block(plan.op, a, b, out, lay.shape, lay.strides, 0, lay.rows, 0, int(lay.shape[-1]))
