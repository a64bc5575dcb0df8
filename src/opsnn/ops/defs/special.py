"""Elementwise math beyond ONNX's set, with torch's semantics: records, kernels and entry points.

Special functions (log1p, expm1, erfc, erfinv, lgamma, digamma, trigamma, logit) and binary math
(xlogy, hypot, atan2, copysign, logaddexp, fmax, fmin, heaviside; broadcasting, a Python scalar
takes the other operand's dtype). All are ``opsnn``-domain records computed in float64 and rounded
once::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([1e-10, 1.0], np.float64))
    >>> float(opsnn.ops.log1p(x).numpy()[0])
    1e-10
    >>> opsnn.ops.atan2(opsnn.tensor(np.float32(1.0)), opsnn.tensor(np.float32(-1.0))).numpy().round(4)
    np.float32(2.3562)
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ... import dtypes as _dt
from ...errors import ParamInvalidError
from ...kernels.cpu import special as K
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .elementwise import _infer_binary, _pair, _quiet, _wide

FLOATS = _dt.FLOATS
NUMBA_FLOAT = (_dt.float32, _dt.float64)


# -- references: float64 numpy, rounded once to the input's dtype ---------------------------------------
def _scalar_map(f):
    vf = np.vectorize(f, otypes=[np.float64])
    return lambda x: vf(x) if x.size else x


def _lgamma_ref(v: float) -> float:
    try:
        return math.lgamma(v)
    except ValueError:  # math.lgamma raises at the poles, where torch gives +inf
        return math.inf


def _erfinv_ref(y: float) -> float:
    """Bisection on erf (on erfc above 0.5, where 1 - |y| is exact): slow and plainly right."""
    a = abs(y)
    if not a < 1.0:
        return math.copysign(math.inf, y) if a == 1.0 else math.nan
    if a == 0.0:
        return y
    lo, hi = 0.0, 6.0  # erfc(6) = 2e-17 is below the smallest 1 - |y| (2**-53)
    below = (lambda m: math.erf(m) < a) if a <= 0.5 else (lambda m: math.erfc(m) > 1.0 - a)
    while True:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            return math.copysign(lo if abs(_erf_gap(lo, a)) <= abs(_erf_gap(hi, a)) else hi, y)
        if below(mid):
            lo = mid
        else:
            hi = mid


def _erf_gap(x: float, a: float) -> float:
    return (math.erf(x) - a) if a <= 0.5 else ((1.0 - a) - math.erfc(x))


#: Bernoulli numbers B_2 .. B_16, for the asymptotic series of psi and psi'
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)


def _psi_ref(x: float) -> float:
    """Digamma by recurrence to x >= 20 and the Bernoulli asymptotic series; reflection below 0."""
    if math.isnan(x):
        return x
    if x == 0.0:
        return math.copysign(math.inf, -x)
    if x < 0.0:
        if x == math.floor(x):
            return math.nan
        return _psi_ref(1.0 - x) - math.pi / math.tan(math.pi * (x - round(x)))
    if math.isinf(x):
        return x
    acc = 0.0
    while x < 20.0:
        acc -= 1.0 / x
        x += 1.0
    s = sum(b / (2 * k) / x ** (2 * k) for k, b in enumerate(_BERNOULLI, 1))
    return acc + math.log(x) - 0.5 / x - s


def _trigamma_ref(x: float) -> float:
    """psi'(x) by recurrence to x >= 20 and the Bernoulli series; reflection at and below 0."""
    if math.isnan(x) or x == -math.inf:
        return math.nan
    if x <= 0.0:
        if x == math.floor(x):
            return math.inf
        return (math.pi / math.sin(math.pi * (x - round(x)))) ** 2 - _trigamma_ref(1.0 - x)
    if math.isinf(x):
        return 0.0
    acc = 0.0
    while x < 20.0:
        acc += 1.0 / (x * x)
        x += 1.0
    return acc + 1.0 / x + 0.5 / (x * x) + sum(b / x ** (2 * k + 1) for k, b in enumerate(_BERNOULLI, 1))


def _logit_ref(ins, attrs):
    x, eps = ins[0], float(attrs["eps"])
    if eps >= 0:  # torch clamps in the input's dtype, low bound first (it wins when eps > 0.5)
        lo = x.dtype.type(eps)
        hi = x.dtype.type(1) - lo
        x = np.where(x < lo, lo, np.where(x > hi, hi, x)).astype(x.dtype)  # NaN stays NaN
    w = _wide(x)
    return np.log(w / (1.0 - w)).astype(ins[0].dtype)


def _unary_ref(f):
    return lambda ins, attrs: f(_wide(ins[0])).astype(ins[0].dtype)


def _binary_ref(f):
    return lambda ins, attrs: f(_wide(ins[0]), _wide(ins[1])).astype(ins[0].dtype)


def _xlogy_ref(x, y):
    return np.where(np.isnan(y), np.nan, np.where(x == 0, 0.0, x * np.log(y)))


def _logaddexp_ref(x, y):
    return np.logaddexp(x, y)


def _heaviside_ref(x, v):
    return np.where(x == 0, v, (x > 0).astype(np.float64))  # torch's rule: NaN gives 0, not NaN


# -- records ----------------------------------------------------------------------------------------------
def _infer_logit(ctx):
    eps = ctx.attrs["eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)) or math.isnan(eps):
        raise ParamInvalidError(
            f"Logit: attribute 'eps' must be a number (negative: no clamp), got {eps!r}", op="Logit"
        )
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


def _unary_record(name, code, reference, doc, attrs=(), infer=None):
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input("X", FLOATS)],
        outputs=["Y"],
        attrs=attrs,
        infer=infer or (lambda ctx: [TensorMeta(ctx.shape(0), ctx.dtype(0))]),
        reference=_quiet(reference),
        doc=doc,
        domain="opsnn",
    )
    rec.kernel(
        "special_numba",
        dtypes=NUMBA_FLOAT,
        priority=10,
        plan=functools.partial(K.unary_plan, op=code),
        doc="numba flat map in float64, parallel when large",
    )(K.unary)
    return rec


def _binary_record(name, code, f, doc, inputs=("A", "B")):
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input(inputs[0], FLOATS), Input(inputs[1], FLOATS)],
        outputs=["C"],
        infer=_infer_binary,
        reference=_quiet(_binary_ref(f)),
        doc=doc,
        domain="opsnn",
    )
    rec.kernel(
        "special_binary_numba",
        dtypes=NUMBA_FLOAT,
        priority=10,
        plan=functools.partial(K.binary_plan, op=code),
        doc="numba broadcasting walk in float64, parallel when large",
    )(K.binary)
    return rec


Log1p = _unary_record("Log1p", K.LOG1P, _unary_ref(np.log1p), "log(1 + X), accurate near 0")
Expm1 = _unary_record("Expm1", K.EXPM1, _unary_ref(np.expm1), "exp(X) - 1, accurate near 0")
Erfc = _unary_record("Erfc", K.ERFC, _unary_ref(_scalar_map(math.erfc)), "1 - erf(X), accurate for large X")
Erfinv = _unary_record(
    "Erfinv", K.ERFINV, _unary_ref(_scalar_map(_erfinv_ref)), "inverse error function (NaN outside [-1, 1])"
)
Lgamma = _unary_record(
    "Lgamma", K.LGAMMA, _unary_ref(_scalar_map(_lgamma_ref)), "log |gamma(X)| (+inf at 0 and the negative integers)"
)
Digamma = _unary_record(
    "Digamma",
    K.DIGAMMA,
    _unary_ref(_scalar_map(_psi_ref)),
    "psi(X) = d/dX lgamma(X) (-inf at +0, +inf at -0, NaN at the negative integers)",
)
Trigamma = _unary_record(
    "Trigamma", K.TRIGAMMA, _unary_ref(_scalar_map(_trigamma_ref)), "psi'(X) = polygamma(1, X) (+inf at the poles)"
)
Logit = _unary_record(
    "Logit",
    K.LOGIT,
    _logit_ref,
    "log(X / (1 - X)), X first clamped to [eps, 1 - eps] when eps >= 0",
    attrs=[Attr("eps", "float", -1.0)],
    infer=_infer_logit,
)

Xlogy = _binary_record("Xlogy", K.XLOGY, _xlogy_ref, "A * log(B); 0 where A == 0 unless B is NaN (broadcasting)")
Hypot = _binary_record("Hypot", K.HYPOT, np.hypot, "sqrt(A^2 + B^2) without overflow (broadcasting)")
Atan2 = _binary_record("Atan2", K.ATAN2, np.arctan2, "atan2(y=A, x=B), the angle of (B, A) (broadcasting)")
Copysign = _binary_record("Copysign", K.COPYSIGN, np.copysign, "|A| with the sign (bit) of B (broadcasting)")
Logaddexp = _binary_record("Logaddexp", K.LOGADDEXP, _logaddexp_ref, "log(exp(A) + exp(B)), stable (broadcasting)")
Fmax = _binary_record("Fmax", K.FMAX, np.fmax, "maximum ignoring NaN: the other operand where one is NaN")
Fmin = _binary_record("Fmin", K.FMIN, np.fmin, "minimum ignoring NaN: the other operand where one is NaN")
Heaviside = _binary_record(
    "Heaviside",
    K.HEAVISIDE,
    _heaviside_ref,
    "0 where X < 0 (and NaN, as torch), values where X == 0, 1 where X > 0 (not differentiable)",
    inputs=("X", "values"),
)


# -- functional entry points ---------------------------------------------------------------------------------
@api("log1p", "Log1p", domain="opsnn")
def log1p(input):
    """``log(1 + input)``, accurate for small ``input``."""
    return [input], {}


@api("expm1", "Expm1", domain="opsnn")
def expm1(input):
    """``exp(input) - 1``, accurate for small ``input``."""
    return [input], {}


@api("erfc", "Erfc", domain="opsnn")
def erfc(input):
    """Complementary error function ``1 - erf(input)``, accurate in the upper tail."""
    return [input], {}


@api("erfinv", "Erfinv", domain="opsnn")
def erfinv(input):
    """Inverse error function: ``erf(erfinv(y)) == y`` on [-1, 1]; NaN outside."""
    return [input], {}


@api("lgamma", "Lgamma", domain="opsnn")
def lgamma(input):
    """``log |gamma(input)|``."""
    return [input], {}


@api("digamma", "Digamma", domain="opsnn")
def digamma(input):
    """``psi(input)``, the derivative of :func:`lgamma`."""
    return [input], {}


@api("trigamma", "Trigamma", domain="opsnn")
def trigamma(input):
    """``psi'(input)`` (torch's ``polygamma(1, input)``), the derivative of :func:`digamma`."""
    return [input], {}


@api("logit", "Logit", domain="opsnn")
def logit(input, eps=None):
    """``log(p / (1 - p))``; with ``eps``, ``p`` is first clamped to ``[eps, 1 - eps]`` (torch.logit)."""
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating))):
        raise ParamInvalidError(f"logit: eps must be a number or None, got {eps!r}", op="Logit")
    return [input], {"eps": -1.0 if eps is None else float(eps)}


@api("xlogy", "Xlogy", domain="opsnn")
def xlogy(input, other):
    """``input * log(other)``, 0 where ``input == 0`` (NaN where ``other`` is NaN), as torch.xlogy."""
    return _pair(input, other), {}


@api("hypot", "Hypot", domain="opsnn")
def hypot(input, other):
    """``sqrt(input ** 2 + other ** 2)`` without intermediate overflow."""
    return _pair(input, other), {}


@api("atan2", "Atan2", domain="opsnn")
def atan2(input, other):
    """The angle of the point ``(other, input)``: ``atan2(y=input, x=other)`` in [-pi, pi]."""
    return _pair(input, other), {}


@api("copysign", "Copysign", domain="opsnn")
def copysign(input, other):
    """``|input|`` with the sign of ``other`` (its sign bit: -0.0 counts as negative)."""
    return _pair(input, other), {}


@api("logaddexp", "Logaddexp", domain="opsnn")
def logaddexp(input, other):
    """``log(exp(input) + exp(other))`` without overflow."""
    return _pair(input, other), {}


@api("fmax", "Fmax", domain="opsnn")
def fmax(input, other):
    """Elementwise maximum where a NaN loses to a number (NaN only where both are NaN)."""
    return _pair(input, other), {}


@api("fmin", "Fmin", domain="opsnn")
def fmin(input, other):
    """Elementwise minimum where a NaN loses to a number (NaN only where both are NaN)."""
    return _pair(input, other), {}


@api("heaviside", "Heaviside", domain="opsnn")
def heaviside(input, values):
    """The step function: 0 below zero, ``values`` at zero, 1 above (torch.heaviside)."""
    return _pair(input, values), {}


__all__ = [
    "log1p",
    "expm1",
    "erfc",
    "erfinv",
    "lgamma",
    "digamma",
    "trigamma",
    "logit",
    "xlogy",
    "hypot",
    "atan2",
    "copysign",
    "logaddexp",
    "fmax",
    "fmin",
    "heaviside",
]
