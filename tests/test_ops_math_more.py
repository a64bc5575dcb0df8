"""The elementwise math beyond ONNX's set (ops/defs/special.py): kernels against float64 oracles
(numpy, math, mpmath), gradients against central differences and torch.autograd, and the torch names.

Tolerances: float64 kernels within a few ulps of the oracle (stated per op); float32 results are
the float64 result rounded once, so within 1 float32 ulp (rtol 1.2e-7, atol at the smallest normal);
16-bit dtypes run through the fp32 adapter and are checked to their own rounding.
"""

import math

import ml_dtypes
import mpmath
import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.autograd import NoGradientError
from opsnn.errors import DTypeError, InferShapeError, OpsnnError, ParamInvalidError

#: the numpy oracles warn on the special values they are fed on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

RNG = np.random.default_rng(20240607)
F32_RTOL, F32_ATOL = 1.2e-7, float(np.finfo(np.float32).tiny)
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, 5e-324, 1.0, -1.0, 0.5, 2.0, -2.5]
UNARY = ["log1p", "expm1", "erfc", "erfinv", "lgamma", "digamma", "trigamma", "logit"]
BINARY = ["xlogy", "hypot", "atan2", "copysign", "logaddexp", "fmax", "fmin", "heaviside"]


def _t(a):
    return opsnn.tensor(np.ascontiguousarray(a))


# -- float64 oracles, independent of the kernels ----------------------------------------------------------------
def _mp(fn):
    """An mpmath function as a float64 oracle, with the special values torch gives at its poles."""

    def one(v):
        v = float(v)
        try:
            with mpmath.workdps(40):  # 15 digits are not enough near digamma's root
                return float(fn(mpmath.mpf(v)))
        except (ValueError, ZeroDivisionError):
            return math.nan

    return lambda x: np.vectorize(one, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


def _digamma_oracle(x):
    x = np.asarray(x, np.float64)
    pole = np.isinf(x) | ((x <= 0) & (x == np.floor(x)))  # mpmath is not asked there (psi(1, -1e300) hangs)
    out = _mp(mpmath.digamma)(np.where(pole, 0.5, x))
    out = np.where(x == 0, np.where(np.signbit(x), np.inf, -np.inf), out)
    out = np.where(np.isneginf(x) | ((x < 0) & (x == np.floor(x))), np.nan, out)
    return np.where(np.isposinf(x), np.inf, out)


def _trigamma_oracle(x):
    x = np.asarray(x, np.float64)
    pole = np.isinf(x) | ((x <= 0) & (x == np.floor(x)))
    out = _mp(lambda v: mpmath.psi(1, v))(np.where(pole, 0.5, x))
    out = np.where((x <= 0) & (x == np.floor(x)), np.inf, out)
    out = np.where(np.isneginf(x), np.nan, out)
    return np.where(np.isposinf(x), 0.0, out)


def _lgamma_oracle(x):
    def one(v):
        try:
            return math.lgamma(v)
        except ValueError:
            return math.inf

    return np.vectorize(one, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


def _erfinv_oracle(x):
    x = np.asarray(x, np.float64)
    inside = np.abs(x) < 1
    out = _mp(mpmath.erfinv)(np.where(inside, x, 0.0))
    out = np.where(inside, out, np.where(np.abs(x) == 1, np.copysign(np.inf, x), np.nan))
    return np.where(x == 0, x, out)


def _logit_oracle(x, eps=None):
    x = np.asarray(x)
    if eps is not None:
        lo = x.dtype.type(eps)
        hi = x.dtype.type(1) - lo
        x = np.where(x < lo, lo, np.where(x > hi, hi, x))  # torch's order: the low bound wins past eps 0.5
    w = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return np.log(w) - np.log1p(-w)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x) if x.size else x.astype(np.float64)


UNARY_ORACLE = {
    "log1p": np.log1p,
    "expm1": np.expm1,
    "erfc": _erfc,
    "erfinv": _erfinv_oracle,
    "lgamma": _lgamma_oracle,
    "digamma": _digamma_oracle,
    "trigamma": _trigamma_oracle,
    "logit": _logit_oracle,
}


def _xlogy(a, b):
    with np.errstate(all="ignore"):
        return np.where(np.isnan(b), np.nan, np.where(a == 0, 0.0, a * np.log(b)))


def _heaviside(a, v):
    return np.where(a == 0, v, np.where(a > 0, 1.0, 0.0))  # torch: NaN input gives 0


BINARY_ORACLE = {
    "xlogy": _xlogy,
    "hypot": np.hypot,
    "atan2": np.arctan2,
    "copysign": np.copysign,
    "logaddexp": np.logaddexp,
    "fmax": np.fmax,
    "fmin": np.fmin,
    "heaviside": _heaviside,
}

#: float64 tolerance (rtol, atol) per op: the kernels are within a few ulps; digamma's absolute error
#: near its negative roots is that of the reflection (cancellation against pi / tan(pi x))
F64_TOL = {
    "digamma": (1e-14, 1e-15),
    "trigamma": (1e-14, 0.0),
    "erfinv": (1e-15, 0.0),
    "lgamma": (1e-14, 1e-14),  # libm's lgamma (torch's too) near its roots: absolute error ~2e-15
    "logit": (1e-15, 1e-16),
}


def _domain_sample(name, shape):
    """Random values that exercise the op's interesting range."""
    if name in ("erfinv",):
        return RNG.uniform(-1, 1, shape)
    if name == "logit":
        return RNG.uniform(0, 1, shape)
    if name in ("lgamma", "digamma", "trigamma"):
        return RNG.uniform(-12, 30, shape)
    if name == "log1p":
        return np.expm1(RNG.uniform(-20, 5, shape)) * RNG.choice([1, -1e-9], shape)
    return RNG.standard_normal(shape) * 4


def _check(got, want, dtype, name, tol=None):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if dtype == np.float64:
        rtol, atol = tol or F64_TOL.get(name, (4e-16, 0.0))
    else:
        want = want.astype(dtype).astype(np.float64)  # the oracle rounded once, as the kernel rounds
        rtol, atol = (F32_RTOL, F32_ATOL) if dtype == np.float32 else (float(ml_dtypes.finfo(dtype).eps), 1e-30)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: NaN positions")
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


# -- unary kernels -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", [(7, 13), (1, 3, 1, 5), (0, 4), ()])
def test_unary_kernel_against_float64_oracle(name, dtype, shape):
    x = _domain_sample(name, shape).astype(dtype)
    ex = opsnn.ops.prepare(getattr(ops, name).record, [_t(x)])
    assert ex.kernel_name == "special_numba"
    _check(ex.run().numpy(), UNARY_ORACLE[name](x.astype(np.float64)), dtype, name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", UNARY)
def test_unary_special_values(name, dtype):
    x = np.array(SPECIAL, np.float64).astype(dtype)
    y = getattr(ops, name)(_t(x)).numpy()
    want = UNARY_ORACLE[name](x.astype(np.float64))
    _check(y, want, dtype, name)
    np.testing.assert_array_equal(np.signbit(y[np.isinf(y)]), np.signbit(want.astype(dtype)[np.isinf(y)]))


def test_log1p_expm1_erfc_keep_their_accuracy_where_the_naive_forms_lose_it():
    tiny = np.array([1e-300, 1e-20, -1e-17, 3e-9], np.float64)
    np.testing.assert_array_equal(ops.log1p(_t(tiny)).numpy(), np.log1p(tiny))
    np.testing.assert_array_equal(ops.expm1(_t(tiny)).numpy(), np.expm1(tiny))
    big = np.array([10.0, 20.0, 26.0], np.float64)
    got = ops.erfc(_t(big)).numpy()
    np.testing.assert_allclose(got, [float(mpmath.erfc(v)) for v in big], rtol=1e-14)
    assert np.all(got > 0)  # 1 - erf(x) is 0 there


def test_special_functions_at_their_hard_points():
    root = 1.4616321449683622  # digamma's positive root: relative accuracy from the Taylor series there
    x = np.array(
        [root, root + 1e-9, root - 0.1, -0.5, -99999.75, 1e-8, 1e17, 1e18], np.float64
    )  # mpmath hangs on psi(1, -1e10)
    np.testing.assert_allclose(ops.digamma(_t(x)).numpy(), _digamma_oracle(x), rtol=1e-14, atol=0)
    np.testing.assert_allclose(ops.trigamma(_t(x)).numpy(), _trigamma_oracle(x), rtol=1e-14)
    tail = np.array([1 - 2.0**-53, -1 + 2.0**-53, 1 - 1e-10, 0.9999, 1e-300, -0.75], np.float64)
    np.testing.assert_allclose(ops.erfinv(_t(tail)).numpy(), _erfinv_oracle(tail), rtol=1e-15)
    big = np.array([1e300, 171.5, -171.5, -0.5, 1e-300], np.float64)
    np.testing.assert_allclose(ops.lgamma(_t(big)).numpy(), _lgamma_oracle(big), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", UNARY)
def test_unary_16_bit_through_the_fp32_adapter(name, dtype):
    x = _domain_sample(name, (5, 9)).astype(dtype)
    y = getattr(ops, name)(_t(x)).numpy()
    assert y.dtype == np.dtype(dtype)
    want = UNARY_ORACLE[name](x.astype(np.float64))
    if name == "logit":
        want = _logit_oracle(x.astype(np.float32))
    # computed in float32 from the 16-bit value: the float32 result rounded once more, a 16-bit ulp
    _check(y, want, dtype, name)


def test_logit_eps_clamps_like_torch():
    x = np.array([0.0, 1.0, 2.0, -1.0, np.nan, 0.5, 1e-8, 0.3], np.float32)
    for eps in (None, 0.0, 1e-6, 0.1, 0.6, 1.0, 1.5):  # past 0.5 the bounds cross (opsnn fuzz nan_inf 3901078)
        got = ops.logit(_t(x), eps=eps).numpy()
        _check(got, _logit_oracle(x, eps), np.float32, "logit")
        ref = ops.get_op("Logit", "opsnn").reference([x], {"eps": -1.0 if eps is None else eps})
        _check(np.asarray(ref), _logit_oracle(x, eps), np.float32, "logit reference")
    with pytest.raises(ParamInvalidError, match="eps"):
        ops.logit(_t(x), eps="tiny")
    with pytest.raises(ParamInvalidError, match="eps"):
        ops.run_op("Logit", [_t(x)], {"eps": float("nan")}, domain="opsnn")


def test_unary_large_input_runs_the_parallel_path():
    from opsnn.kernels.cpu.elementwise import PARALLEL_MIN

    x = RNG.uniform(-5, 30, PARALLEL_MIN + 17)
    for name in ("lgamma", "expm1"):
        _check(getattr(ops, name)(_t(x)).numpy(), UNARY_ORACLE[name](x.astype(np.float64)), np.float64, name)
    got = ops.digamma(_t(x)).numpy()
    idx = RNG.choice(x.size, 300, replace=False)  # mpmath on a sample: every element would take minutes
    np.testing.assert_allclose(got[idx], _digamma_oracle(x[idx]), rtol=1e-14, atol=1e-15)


def test_unary_rejects_integer_input():
    with pytest.raises(DTypeError, match="Log1p"):
        ops.log1p(_t(np.arange(3, dtype=np.int64)))


# -- binary kernels -----------------------------------------------------------------------------------------------
def _binary_sample(name, shape):
    a = RNG.standard_normal(shape) * 3
    if name == "xlogy":
        a = np.where(RNG.random(shape) < 0.2, 0.0, a)
    if name == "heaviside":
        a = np.where(RNG.random(shape) < 0.3, 0.0, a)
    return a


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize(
    "sa,sb",
    [((7, 13), (7, 13)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((6,), ()), ((2, 0, 3), (1, 3)), ((1, 9), (5, 1))],
)
def test_binary_kernel_broadcasts_against_float64_oracle(name, dtype, sa, sb):
    a = _binary_sample(name, sa).astype(dtype)
    b = (np.abs(RNG.standard_normal(sb)) * 3 if name == "xlogy" else RNG.standard_normal(sb) * 3).astype(dtype)
    ex = opsnn.ops.prepare(getattr(ops, name).record, [_t(a), _t(b)])
    assert ex.kernel_name == "special_binary_numba"
    got = ex.run().numpy()
    assert got.shape == np.broadcast_shapes(sa, sb) and got.dtype == np.dtype(dtype)
    _check(got, BINARY_ORACLE[name](a.astype(np.float64), b.astype(np.float64)), dtype, name, (4e-16, 1e-300))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", BINARY)
def test_binary_special_values_every_pair(name, dtype):
    v = np.array(SPECIAL, np.float64).astype(dtype)
    a, b = v[:, None], v[None, :]
    got = getattr(ops, name)(_t(a), _t(b)).numpy()
    with np.errstate(all="ignore"):
        want = BINARY_ORACLE[name](a.astype(np.float64), b.astype(np.float64))
    _check(got, want, dtype, name, (4e-16, 1e-300))
    if name in ("copysign", "atan2"):  # signs of zeros and infinities are part of these definitions
        assert np.array_equal(np.signbit(got), np.signbit(want.astype(dtype)))


def test_binary_scalars_take_the_tensor_dtype_and_shapes_must_broadcast():
    x = _t(np.array([0.0, 1.0, 4.0], np.float32))
    y = ops.xlogy(2.0, x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), [-np.inf, 0.0, 2 * np.log(4.0)], rtol=F32_RTOL)
    np.testing.assert_array_equal(ops.heaviside(x, 0.5).numpy(), [0.5, 1.0, 1.0])
    with pytest.raises(InferShapeError, match="Hypot"):
        ops.hypot(_t(np.ones((2, 3))), _t(np.ones((4,))))
    with pytest.raises(DTypeError, match="Atan2"):
        ops.atan2(_t(np.ones(3, np.float32)), _t(np.ones(3, np.float64)))


def test_binary_large_input_runs_the_parallel_walk():
    from opsnn.kernels.cpu.elementwise import PARALLEL_MIN

    a = RNG.standard_normal((PARALLEL_MIN // 64 + 3, 64))
    b = RNG.standard_normal((1, 64))
    for name in ("logaddexp", "atan2", "fmax"):
        _check(getattr(ops, name)(_t(a), _t(b)).numpy(), BINARY_ORACLE[name](a, b), np.float64, name)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_binary_16_bit_through_the_fp32_adapter(dtype):
    a = RNG.standard_normal((4, 6)).astype(dtype)
    b = RNG.standard_normal((6,)).astype(dtype)
    for name in ("hypot", "atan2", "logaddexp", "copysign", "fmin"):
        got = getattr(ops, name)(_t(a), _t(b)).numpy()
        assert got.dtype == np.dtype(dtype)
        _check(got, BINARY_ORACLE[name](a.astype(np.float64), b.astype(np.float64)), dtype, name)


# -- gradients ----------------------------------------------------------------------------------------------------
def _grad_points(name):
    return {
        "log1p": RNG.uniform(-0.9, 3, (3, 4)),
        "expm1": RNG.uniform(-3, 3, (3, 4)),
        "erfc": RNG.uniform(-2, 2, (3, 4)),
        "erfinv": RNG.uniform(-0.9, 0.9, (3, 4)),
        "lgamma": RNG.uniform(0.3, 8, (3, 4)),
        "digamma": RNG.uniform(0.3, 8, (3, 4)),
        "logit": RNG.uniform(0.05, 0.95, (3, 4)),
    }[name]


def _grad_of(fn, *xs, **kw):
    ts = [_t(x).requires_grad_() for x in xs]
    w = RNG.standard_normal(fn(*[_t(x) for x in xs], **kw).shape)
    ops.sum(ops.mul(fn(*ts, **kw), _t(w))).backward()
    return [t.grad.numpy() for t in ts], w


def _central(fn, xs, w, i, h=1e-6, **kw):
    x = xs[i]
    g = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        up, dn = [v.copy() for v in xs], [v.copy() for v in xs]
        up[i][k] += h
        dn[i][k] -= h
        f_up = np.sum(fn(*[_t(v) for v in up], **kw).numpy() * w)
        f_dn = np.sum(fn(*[_t(v) for v in dn], **kw).numpy() * w)
        g[k] = (f_up - f_dn) / (2 * h)
    return g


@pytest.mark.parametrize("name", ["log1p", "expm1", "erfc", "erfinv", "lgamma", "digamma", "logit"])
def test_unary_gradient_against_central_differences(name):
    x = _grad_points(name)
    fn = getattr(ops, name)
    (g,), w = _grad_of(fn, x)
    np.testing.assert_allclose(g, _central(fn, [x], w, 0), rtol=1e-6, atol=1e-8)


def test_logit_gradient_is_zero_where_eps_clamped():
    x = np.array([0.01, 0.2, 0.5, 0.97, 0.999], np.float64)
    (g,), w = _grad_of(ops.logit, x, eps=0.05)
    want = w / (x * (1 - x))
    want[(x < 0.05) | (x > 0.95)] = 0
    np.testing.assert_allclose(g, want, rtol=1e-14)


BINARY_GRAD = ["xlogy", "hypot", "atan2", "copysign", "logaddexp", "fmax", "fmin"]


@pytest.mark.parametrize("name", BINARY_GRAD)
def test_binary_gradient_against_central_differences_with_broadcasting(name):
    a = RNG.standard_normal((3, 4)) * 2
    b = RNG.standard_normal((1, 4)) * 2
    if name == "xlogy":
        b = np.abs(b) + 0.1
    if name in ("fmax", "fmin"):  # keep away from ties, where the derivative jumps
        b = b + 0.05
    fn = getattr(ops, name)
    (ga, gb), w = _grad_of(fn, a, b)
    assert ga.shape == a.shape and gb.shape == b.shape
    np.testing.assert_allclose(ga, _central(fn, [a, b], w, 0), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gb, _central(fn, [a, b], w, 1), rtol=1e-6, atol=1e-8)


def test_heaviside_and_trigamma_have_no_gradient():
    x = _t(np.array([-1.0, 0.0, 2.0])).requires_grad_()
    with pytest.raises(NoGradientError, match="Heaviside"):
        ops.sum(ops.heaviside(x, 0.5)).backward()
    x = _t(np.array([1.0, 2.0])).requires_grad_()
    with pytest.raises(NoGradientError, match="Trigamma"):
        ops.sum(ops.trigamma(x)).backward()
    assert opsnn.ops.get_op("Heaviside", "opsnn").gradient is None


# -- against torch ------------------------------------------------------------------------------------------------
_TORCH_UNARY_INPUTS = {
    "log1p": [-0.5, 0.0, -0.0, 1e-9, 3.0, -1.0, -2.0, np.inf, np.nan],
    "expm1": [-0.5, 0.0, -0.0, 1e-9, 3.0, 800.0, -np.inf, np.nan],
    "erfc": [-3.0, 0.0, 1.0, 10.0, 30.0, np.inf, -np.inf, np.nan],
    "erfinv": [-0.99, -0.0, 0.0, 0.3, 0.999999, 1.0, -1.0, 1.5, np.nan],
    "lgamma": [-2.5, -1.0, 0.0, -0.0, 0.5, 3.0, 1e300, np.inf, -np.inf, np.nan],
    "digamma": [-2.5, -1.0, 0.0, -0.0, 0.5, 1.4616, 3.0, 1e300, np.inf, -np.inf, np.nan],
    "logit": [0.0, 1.0, 0.3, 0.7, 1e-8, 2.0, -1.0, np.nan],
}


@pytest.mark.parametrize("name", sorted(_TORCH_UNARY_INPUTS))
def test_unary_forward_and_grad_match_torch(name):
    torch = pytest.importorskip("torch")
    x = np.array(_TORCH_UNARY_INPUTS[name], np.float64)
    got = getattr(ops, name)(_t(x)).numpy()
    want = getattr(torch, name)(torch.tensor(x)).numpy()
    # digamma: torch's recurrence is accurate to ~2e-16 absolute near the root, where ours is relative
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15 if name == "digamma" else 1e-300)
    xs = _grad_points(name)
    (g,), w = _grad_of(getattr(ops, name), xs)
    tx = torch.tensor(xs, requires_grad=True)
    (getattr(torch, name)(tx) * torch.tensor(w)).sum().backward()
    # digamma's gradient is trigamma: torch's series stops at 1/x^7 from x >= 6.5 (~1e-9 relative), ours
    # agrees with mpmath to 1e-15 (test_unary_kernel_against_float64_oracle)
    rtol = 1e-8 if name == "digamma" else 1e-12
    np.testing.assert_allclose(g, tx.grad.numpy(), rtol=rtol, atol=1e-14)


@pytest.mark.parametrize("name", BINARY)
def test_binary_forward_and_grad_match_torch(name):
    torch = pytest.importorskip("torch")
    v = np.array(SPECIAL, np.float64)
    a, b = v[:, None], v[None, :]
    got = getattr(ops, name)(_t(a), _t(b)).numpy()
    want = getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)
    if name == "heaviside":
        return
    # gradients at ordinary points and at the edge cases torch defines (x == 0, ties, NaN in fmax/fmin)
    a = np.array([[0.0, 1.5, -2.0, 0.0, 3.0, np.nan]])
    b = np.array([[0.0, 1.5, 0.5, -1.0, np.nan, 2.0]])
    if name in ("hypot", "atan2", "logaddexp"):  # 0/0 at the origin or NaN: compare the ordinary points
        a, b = a[:, 1:3], b[:, 1:3]
    (ga, gb), w = _grad_of(getattr(ops, name), a, b)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (getattr(torch, name)(ta, tb) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ga, ta.grad.numpy(), rtol=1e-13, atol=1e-300, equal_nan=True)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-13, atol=1e-300, equal_nan=True)


def test_float32_forward_matches_torch_within_an_ulp():
    torch = pytest.importorskip("torch")
    x = RNG.uniform(-0.99, 0.99, 200).astype(np.float32)
    for name in ("log1p", "expm1", "erfc", "erfinv"):
        got = getattr(ops, name)(_t(x)).numpy()
        want = getattr(torch, name)(torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=4 * F32_RTOL, atol=1e-7, err_msg=name)


def test_errors_are_opsnn_errors():
    with pytest.raises(OpsnnError):
        ops.fmax(None, _t(np.ones(2)))


# -- torch names: Tensor methods and opsnn.<name> -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["log1p", "expm1", "erfc", "erfinv", "lgamma", "digamma", "logit"])
def test_unary_method_and_top_level_forms_match_torch(name):
    torch = pytest.importorskip("torch")
    x = RNG.uniform(0.05, 0.95, (4, 5)).astype(np.float32)
    want = getattr(torch.tensor(x), name)().numpy()
    np.testing.assert_allclose(getattr(_t(x), name)().numpy(), want, rtol=4 * F32_RTOL, atol=1e-7)
    np.testing.assert_allclose(getattr(opsnn, name)(_t(x)).numpy(), want, rtol=4 * F32_RTOL, atol=1e-7)


def test_logit_eps_through_the_method_and_top_level():
    torch = pytest.importorskip("torch")
    x = np.array([0.0, 0.01, 0.5, 0.999, 1.0], np.float32)
    want = torch.tensor(x).logit(eps=0.02).numpy()
    np.testing.assert_allclose(_t(x).logit(eps=0.02).numpy(), want, rtol=4 * F32_RTOL)
    np.testing.assert_allclose(opsnn.logit(_t(x), 0.02).numpy(), want, rtol=4 * F32_RTOL)


@pytest.mark.parametrize(
    "name", ["xlogy", "hypot", "atan2", "arctan2", "copysign", "logaddexp", "fmax", "fmin", "heaviside"]
)
def test_binary_method_and_top_level_forms_match_torch(name):
    torch = pytest.importorskip("torch")
    a = np.array([[0.0, -1.5, 2.0, np.nan], [3.0, 0.0, -0.0, 1.0]], np.float32)
    b = np.array([0.5, 2.0, np.nan, -1.0], np.float32)
    want = getattr(torch.tensor(a), name)(torch.tensor(b)).numpy()
    for got in (getattr(_t(a), name)(_t(b)), getattr(opsnn, name)(_t(a), _t(b))):
        np.testing.assert_allclose(got.numpy(), want, rtol=4 * F32_RTOL, equal_nan=True)
    # a Python scalar takes the tensor's dtype (torch wants a 0-d tensor there)
    scalar = getattr(torch.tensor(a), name)(torch.tensor(2.0)).numpy()
    np.testing.assert_allclose(getattr(_t(a), name)(2.0).numpy(), scalar, rtol=4 * F32_RTOL, equal_nan=True)
