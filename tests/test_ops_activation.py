"""Activation ops against independent oracles: float64 numpy formulas written here,
onnx.reference.ReferenceEvaluator and onnxruntime.

Tolerances: float32 rtol 1e-5 / atol 1e-6 against float64 formulas (the fast float32
exp/tanh/erf are within a few ulp); float64 rtol 1e-12 / atol 1e-13; 16-bit results
against the float32 oracle on the same 16-bit inputs, rtol/atol 1e-2 (bfloat16 2e-2).
"""

import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn, ops
from opsnn.errors import DTypeError, InferShapeError, OpsnnError, ParamInvalidError, ParamNullptrError
from opsnn.kernels.cpu import activation as K

BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = {
    np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6),
    np.dtype(np.float64): dict(rtol=1e-12, atol=1e-13),
    np.dtype(np.float16): dict(rtol=1e-2, atol=1e-2),
    BF16: dict(rtol=2e-2, atol=2e-2),
}

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _sp(x):
    return np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30))))


# functional name -> (kwargs, float64 oracle)
POINTWISE = {
    "relu": ({}, lambda x: np.where(x < 0, 0.0, x)),
    "leaky_relu": ({"negative_slope": 0.2}, lambda x: np.where(x < 0, 0.2 * x, x)),
    "gelu": ({}, lambda x: 0.5 * x * _erfc(-x / np.sqrt(2))),
    # 0.5 (1 + tanh z) = sigmoid(2 z), without the cancellation of 1 + tanh z for x << 0
    "gelu_tanh": ({"approximate": "tanh"}, lambda x: x * _sig(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": ({}, lambda x: x * _sig(x)),
    "swish": ({"alpha": 1.7}, lambda x: x * _sig(1.7 * x)),
    "sigmoid": ({}, _sig),
    "tanh": ({}, np.tanh),
    "softplus": ({}, _sp),
    "hard_swish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "elu": ({"alpha": 0.7}, lambda x: np.where(x < 0, 0.7 * np.expm1(x), x)),
    "selu": ({}, lambda x: 1.0507009873554805 * np.where(x <= 0, 1.6732632423543772 * np.expm1(x), x)),
    "celu": ({"alpha": 2.0}, lambda x: np.maximum(0, x) + np.minimum(0, 2.0 * np.expm1(x / 2.0))),
    "mish": ({}, lambda x: x * np.tanh(_sp(x))),
    "hard_sigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "thresholded_relu": ({"alpha": 0.5}, lambda x: np.where(x > 0.5, x, 0.0)),
    "softsign": ({}, lambda x: x / (1 + np.abs(x))),
    "shrink": ({"lambd": 0.6, "bias": 0.25}, lambda x: np.where(x < -0.6, x + 0.25, np.where(x > 0.6, x - 0.25, 0.0))),
    "hardshrink": ({"lambd": 0.6}, lambda x: np.where(np.abs(x) > 0.6, x, 0.0)),
    "softshrink": ({"lambd": 0.6}, lambda x: np.where(x < -0.6, x + 0.6, np.where(x > 0.6, x - 0.6, 0.0))),
}
KERNEL = {
    "relu": "relu_numba",
    "leaky_relu": "leaky_relu_numba",
    "gelu": "gelu_numba",
    "gelu_tanh": "gelu_numba",
    "silu": "swish_numba",
    "swish": "swish_numba",
    "sigmoid": "sigmoid_numba",
    "tanh": "tanh_numba",
    "softplus": "softplus_numba",
    "hard_swish": "hard_swish_numba",
    "elu": "elu_numba",
    "selu": "selu_numba",
    "celu": "celu_numba",
    "mish": "mish_numba",
    "hard_sigmoid": "hard_sigmoid_numba",
    "thresholded_relu": "thresholded_relu_numba",
    "softsign": "softsign_numba",
    "shrink": "shrink_numba",
    "hardshrink": "shrink_numba",
    "softshrink": "shrink_numba",
}


def _fn(name):
    return getattr(ops, "gelu" if name == "gelu_tanh" else name)


def _exec(name):
    return getattr(aclnn, "gelu" if name == "gelu_tanh" else name)


def _inputs(rng, n, dtype):
    x = np.concatenate([np.linspace(-12, 12, 97), rng.standard_normal(max(n - 97, 0)) * 4])[:n]
    return x.astype(dtype)


def _check(got, want, dtype, **tol):
    """``got`` (of ``dtype``) against the float64 oracle ``want`` rounded to ``dtype``."""
    tol = tol or TOL[np.dtype(dtype)]
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    with np.errstate(over="ignore"):
        want = np.asarray(want).astype(dtype).astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, equal_nan=True, **tol)


# -- pointwise ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_matches_formula_serial_and_parallel(name, dtype, rng):
    kw, oracle = POINTWISE[name]
    probe = _exec(name).prepare(opsnn.tensor(_inputs(rng, 4, dtype)), **kw).plan
    thr = K.PARALLEL_MIN if name == "relu" or probe[0] not in K.COSTLY else K.PARALLEL_MIN_COSTLY
    for n in (1, 97, 1000, thr - 1, thr + 5):
        x = _inputs(rng, n, dtype).reshape(-1)
        if n == 1000:
            x = x.reshape(10, 4, 25)
        ex = _exec(name).prepare(opsnn.tensor(x), **kw)
        assert ex.kernel_name == KERNEL[name]
        parallel = ex.plan if name == "relu" else ex.plan[3]
        assert bool(parallel) == (n >= thr), (n, ex.plan)
        _check(ex.run().numpy(), oracle(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(n for n in POINTWISE if n != "relu"))
def test_pointwise_in_place_matches_formula(name, dtype, rng):
    # the graph's memory plan runs activations in place (output = input): those go through a
    # scratch block (to stay vectorized); spans cross block edges, serial and parallel
    kw, oracle = POINTWISE[name]
    for n in (1, K.SCRATCH - 1, 3 * K.SCRATCH + 7, K.PARALLEL_MIN + 5):
        x = _inputs(rng, n, dtype).reshape(-1)
        ex = _exec(name).prepare(opsnn.tensor(x), **kw)
        op, a, b, chunk = ex.plan
        y = x.copy()
        if chunk:
            K.map_parallel(y, y, op, a, b, chunk)
        else:
            K.map_chunk(y, y, 0, n, op, a, b)
        _check(y, oracle(x.astype(np.float64)), dtype)
        part = x.copy()  # a span in the middle: the rest is untouched
        lo, hi = n // 3, n - n // 4
        K.map_chunk(part, part, lo, hi, op, a, b)
        _check(part[lo:hi], oracle(x[lo:hi].astype(np.float64)), dtype)
        np.testing.assert_array_equal(part[:lo], x[:lo])
        np.testing.assert_array_equal(part[hi:], x[hi:])


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_special_values(name):
    kw, oracle = POINTWISE[name]
    big = float(np.finfo(np.float32).max)
    x = np.array(
        [
            np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            1e-40,
            big,
            -big,
            88.8,
            -88.8,
            89.5,
            -104.5,
            9.5,
            -9.5,
            0.49,
            -0.49,
            0.51,
            -0.51,
        ],
        np.float32,
    )
    for dtype in (np.float32, np.float64):
        with np.errstate(all="ignore"):
            want = oracle(x.astype(np.float64))
        got = _fn(name)(opsnn.tensor(x.astype(dtype)), **kw).numpy()
        _check(got, want, dtype, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize(
    "name", ["sigmoid", "tanh", "elu", "selu", "softplus", "gelu", "gelu_tanh", "silu", "mish", "celu"]
)
def test_float32_fast_math_is_accurate(name):
    """The float32 kernels evaluate exp/expm1/tanh/log1p/erfc in their own vectorized code:
    a dense grid keeps them within a few ulp of float64 (relative where the value is not tiny)."""
    kw, oracle = POINTWISE[name]
    x = np.concatenate([np.linspace(-20, 20, 200001), np.geomspace(1e-8, 1, 2001), -np.geomspace(1e-8, 1, 2001)])
    x = x.astype(np.float32)
    with np.errstate(all="ignore"):
        want = oracle(x.astype(np.float64))
    got = _fn(name)(opsnn.tensor(x), **kw).numpy().astype(np.float64)
    err = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
    # 1 ulp = 1.19e-7. In their negative tails the gelus exponentiate a float32 argument
    # (x^2 / 2, or ~x^3) whose own rounding costs ~1e-7 of its size, relative.
    gelu = name.startswith("gelu")
    assert err[np.abs(want) > 1e-3].max() < (2e-6 if gelu else 6e-7)
    assert err[np.abs(want) > 1e-30].max() < (2e-5 if gelu else 6e-7)


def _map_helper(fn):
    @K.nb.njit(error_model="numpy")
    def run(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])

    return run


def test_float32_math_helpers_full_range():
    """The vectorizable helpers themselves, float32 against float64 numpy: exp from the
    denormals to overflow (< 1.5 ulp), NaN/inf in and out, expm1/tanh/log1p (< 3 ulp) and
    the normal CDF Phi (< 12 ulp for |x| < 4, 5e-6 relative in the lower tail)."""
    x = np.concatenate([np.linspace(-110, 95, 400001), [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    cases = [
        (K.fexp, np.exp, x, 1.5),
        (K.fexpm1, np.expm1, x, 2.5),
        (K.ftanh, np.tanh, x, 2.5),
        (K.flog1p_unit, np.log1p, np.linspace(0, 1, 100001).astype(np.float32), 3.0),
        (K.fphi, lambda v: 0.5 * _erfc(-v / np.sqrt(2)), x[np.abs(x) < 4], 12.0),
    ]
    for helper_fn, oracle, xs, max_ulps in cases:
        got = np.empty_like(xs)
        _map_helper(helper_fn)(xs, got)
        with np.errstate(all="ignore"):
            want64 = oracle(xs.astype(np.float64))
            want = want64.astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want)), helper_fn
        assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)]), helper_fn
        fin = np.isfinite(want) & (np.abs(want64) >= np.finfo(np.float32).tiny)
        ulps = np.abs(got[fin].astype(np.float64) - want64[fin]) / np.spacing(np.abs(want[fin]))
        assert ulps.max() <= max_ulps, (helper_fn, ulps.max())
        tiny = np.isfinite(want) & ~fin  # denormal results: absolute error of a denormal ulp
        assert np.abs(got[tiny].astype(np.float64) - want64[tiny]).max(initial=0) <= 2e-45
    # Phi's lower tail keeps relative accuracy (the rounding of x^2 / 2 dominates) down to 1e-23
    xs = np.linspace(-10, -4, 20001).astype(np.float32)
    got = np.empty_like(xs)
    _map_helper(K.fphi)(xs, got)
    want = 0.5 * _erfc(-xs.astype(np.float64) / np.sqrt(2))
    assert (np.abs(got - want) / want).max() < 5e-6


def test_float32_tanh_reaches_one_exactly_where_rounding_does():
    """Near saturation tanh is 1 - 2/(e^2x + 1): t / (t + 2) lost the gap to 1 to the rounding of t + 2, so
    tanh(8.84) came out 1.0 (not 1 - 2^-24), and a clamp at 9 made 9 < x < 9.0109 1.0 too. A value of
    exactly +-1 where the rounded result is not changes what follows (Pow(t, t) is finite at t = -1 and NaN
    just above: `opsnn fuzz` onnx_mutate seed 1308510). On a dense grid of 7 < |x| < 12, every result is
    the correctly rounded one."""
    x = np.linspace(7, 12, 2_000_001).astype(np.float32)
    x = np.concatenate([x, -x])
    got = np.empty_like(x)
    _map_helper(K.ftanh)(x, got)
    want = np.tanh(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.abs(got) == 1, np.abs(want) == 1)
    assert np.mean(got == want) > 0.9999


ONNX_CASES = [
    ("Relu", {}),
    ("LeakyRelu", {"alpha": 0.3}),
    ("Gelu", {}),
    ("Gelu", {"approximate": "tanh"}),
    ("Swish", {"alpha": 0.5}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("Softplus", {}),
    ("HardSwish", {}),
    ("Elu", {"alpha": 1.5}),
    ("Selu", {}),
    ("Selu", {"alpha": 2.0, "gamma": 3.0}),
    ("Celu", {"alpha": 0.5}),
    ("Mish", {}),
    ("HardSigmoid", {}),
    ("HardSigmoid", {"alpha": 0.5, "beta": 0.6}),
    ("ThresholdedRelu", {"alpha": 2.0}),
    ("Softsign", {}),
    ("Shrink", {"lambd": 1.5, "bias": 0.5}),
    ("Softmax", {"axis": 1}),
    ("LogSoftmax", {"axis": 0}),
    ("Hardmax", {"axis": 1}),
    ("Softmax", {}),
    ("LogSoftmax", {}),
]


def _onnx_eval(op, inputs, attrs):
    schema = onnx.defs.get_schema(op)
    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", schema.since_version)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


@pytest.mark.parametrize("op,attrs", ONNX_CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(ONNX_CASES)])
def test_matches_onnx_reference_evaluator(op, attrs, rng):
    x = (rng.standard_normal((3, 7, 11)) * 3).astype(np.float32)
    want = _onnx_eval(op, [x], attrs)
    got = ops.run_op(op, [x], attrs)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


BF16_KERNEL = {"gelu": "gelu_numba_bf16", "relu": "relu_numba_bf16"}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_16bit_via_fp32_adapter(name, rng):
    kw, oracle = POINTWISE[name]
    for dtype in (np.float16, BF16):
        x = _inputs(rng, 301, np.float32).astype(dtype)
        ex = _exec(name).prepare(opsnn.tensor(x), **kw)
        # bfloat16 Gelu and Relu have kernels of their own
        native = BF16_KERNEL.get(name.split("_")[0]) if dtype == BF16 else None
        assert ex.adapter != bool(native) and ex.kernel_name == (native or KERNEL[name])
        _check(ex.run().numpy(), oracle(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_forced_reference_matches(name, rng):
    kw, _ = POINTWISE[name]
    x = opsnn.tensor(_inputs(rng, 500, np.float32).reshape(20, 25))
    assert _exec(name).prepare(x, algo="reference", **kw).kernel_name == "reference"
    np.testing.assert_allclose(
        _fn(name)(x, **kw).numpy(), _fn(name)(x, algo="reference", **kw).numpy(), rtol=1e-5, atol=1e-6
    )


def test_pointwise_non_contiguous_and_empty(rng, no_leak):
    a = (rng.standard_normal((37, 23)) * 3).astype(np.float32)
    for name in ("relu", "gelu", "sigmoid", "shrink", "mish"):
        kw, oracle = POINTWISE[name]
        _check(_fn(name)(opsnn.from_numpy(a.T), **kw).numpy(), oracle(a.T.astype(np.float64)), np.float32)
        _check(_fn(name)(opsnn.tensor(a).transpose(0, 1), **kw).numpy(), oracle(a.T.astype(np.float64)), np.float32)
        _check(
            _fn(name)(opsnn.from_numpy(a[::2, 1::3]), **kw).numpy(), oracle(a[::2, 1::3].astype(np.float64)), np.float32
        )
        for shape in ((0,), (3, 0, 5)):
            y = _fn(name)(opsnn.tensor(np.zeros(shape, np.float32)), **kw)
            assert y.shape == shape and y.dtype == np.float32


def test_relu_integers_and_nan():
    for dtype, kernel in (
        (np.int8, "relu_numpy"),
        (np.int16, "relu_numpy"),
        (np.int32, "relu_numba"),
        (np.int64, "relu_numba"),
    ):
        x = np.array([-5, 0, 7, np.iinfo(dtype).min, np.iinfo(dtype).max], dtype)
        ex = aclnn.relu.prepare(opsnn.tensor(x))
        assert ex.kernel_name == kernel
        y = ex.run().numpy()
        assert y.dtype == dtype and y.tolist() == [0, 0, 7, 0, int(np.iinfo(dtype).max)]
    y = ops.relu(opsnn.tensor(np.array([np.nan, -1.0, 2.0], np.float32))).numpy()
    assert np.isnan(y[0]) and y[1:].tolist() == [0.0, 2.0]


def test_shrink_integers():
    for dtype in (np.int8, np.uint8, np.int32, np.int64, np.uint64):
        x = np.arange(0 if np.dtype(dtype).kind == "u" else -6, 7).astype(dtype)
        ex = aclnn.shrink.prepare(opsnn.tensor(x), lambd=1.5, bias=1.0)
        assert ex.kernel_name == "shrink_numpy"
        xf = x.astype(np.float64)
        want = np.where(xf < -1.5, xf + 1.0, np.where(xf > 1.5, xf - 1.0, 0)).astype(dtype)
        y = ex.run().numpy()
        assert y.dtype == dtype and np.array_equal(y, want)


def test_gelu_approximate_accepts_bytes_and_rejects_unknown():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    a = ops.run_op("Gelu", [x], {"approximate": b"tanh"})[0].numpy()
    np.testing.assert_allclose(a, ops.gelu(opsnn.tensor(x), approximate="tanh").numpy())
    with pytest.raises(ParamInvalidError, match="approximate"):
        ops.gelu(opsnn.tensor(x), approximate="fast")


# -- softmax / log_softmax ----------------------------------------------------------------------------
def _softmax64(x, axis, log=False):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        z = x - np.max(x, axis=axis, keepdims=True)
        lse = np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
        return z - lse if log else np.exp(z - lse)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4, 5), (3, 300, 130), (1, 70, 1), (5, 1, 3)])
def test_softmax_every_axis(shape, log, rng):
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    fn = ops.log_softmax if log else ops.softmax
    for dim in range(-len(shape), len(shape)):
        y = fn(opsnn.tensor(x), dim=dim).numpy()
        _check(y, _softmax64(x, dim, log), np.float32, rtol=1e-5, atol=1e-6 if not log else 1e-5)
        if not log:
            np.testing.assert_allclose(y.sum(axis=dim), 1.0, rtol=1e-5)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.usefixtures("low_parallel_min")
def test_softmax_modes_serial_parallel_split(log, rng):
    """Serial below the threshold, rows in parallel above it, and a few very long rows split
    across threads with their (max, sum) merged."""
    fn = aclnn.log_softmax if log else aclnn.softmax
    cases = [
        ((4, 33), -1, "serial"),
        ((3, 2000), -1, "serial"),
        ((300, 257), -1, "parallel"),
        ((40, 1500), -1, "parallel"),
        ((64, 300, 70), 1, "parallel"),
        ((1, 1 << 17), -1, "split"),
        ((2, 1 << 16), 1, "parallel" if K.nb.get_num_threads() <= 2 else "split"),
    ]
    for shape, dim, mode in cases:
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        ex = fn.prepare(opsnn.tensor(x), dim=dim)
        assert ex.kernel_name == ("log_softmax_online" if log else "softmax_online")
        assert ex.plan.mode == mode, (shape, ex.plan)
        # float64 statistics: split slices' (max, sum), and chunk maxima of rows > 1 chunk
        assert ex.workspace_size == ex.plan.workspace
        assert (ex.workspace_size > 0) == (
            mode == "split" or (not log and dim % len(shape) == len(shape) - 1 and shape[-1] > K.SOFTMAX_CHUNK)
        )
        ws = opsnn.empty((ex.workspace_size,), "uint8") if ex.workspace_size else None
        _check(ex.run(ws).numpy(), _softmax64(x, dim, log), np.float32, rtol=1e-5, atol=1e-6)
        x2 = (rng.standard_normal(shape) * 4).astype(np.float32)  # the executor is reusable
        _check(
            ex.run(ws, inputs=[opsnn.tensor(x2)]).numpy(), _softmax64(x2, dim, log), np.float32, rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("layout", ["rows", "strided", "split"])
@pytest.mark.usefixtures("low_parallel_min")
def test_softmax_inf_nan_and_overflow(layout, log):
    """Large values that overflow a naive exp, -inf entries (masked), all -inf rows (NaN, as
    exp(x - max) gives), +inf (NaN row) and NaN (NaN row); for 'split' the special values sit
    in different slices of one long row."""
    n = 1 << 16 if layout == "split" else 40
    big = float(np.finfo(np.float32).max)
    rows = np.zeros((9, n), np.float32)
    rows[0, :] = np.arange(n) * 0.01 + 1e4  # offset that overflows exp in fp32
    rows[1, :] = -big
    rows[1, n // 3] = big  # a finite spread of 2 * max float
    rows[2, :] = -np.inf
    rows[2, -5:] = np.linspace(-1, 1, 5)  # masked row, the finite part at the end
    rows[3, :] = -np.inf  # fully masked
    rows[4, :] = np.linspace(-3, 3, n)
    rows[4, n // 2] = np.inf  # +inf -> NaN row
    rows[5, :] = np.linspace(-3, 3, n)
    rows[5, n - 1] = np.nan  # NaN -> NaN row
    rows[6, :] = np.linspace(-3, 3, n)
    rows[6, : n // 2] = -np.inf  # first half masked
    rows[7, :] = np.linspace(50, -50, n)  # decreasing: max at the start
    rows[8, :] = np.linspace(-50, 50, n)  # increasing: max grows every step
    if layout == "split":
        xs = [(rows[i : i + 1], -1) for i in range(len(rows))]
    elif layout == "strided":
        xs = [(np.ascontiguousarray(rows.T[:, None, :]).repeat(2, axis=1), 0)]  # axis 0, inner = 2 * 9
    else:
        xs = [(rows, -1)]
    fn = ops.log_softmax if log else ops.softmax
    for x, dim in xs:
        ex = (aclnn.log_softmax if log else aclnn.softmax).prepare(opsnn.tensor(x), dim=dim)
        if layout == "split":
            assert ex.plan.mode == "split"
        ws = opsnn.empty((ex.workspace_size,), "uint8") if ex.workspace_size else None
        got = ex.run(ws).numpy()
        want = _softmax64(x, dim, log)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        _check(got, want, np.float32, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(fn(opsnn.tensor(x), dim=dim, algo="reference").numpy().shape, x.shape)
    x64 = rows.astype(np.float64)
    _check(fn(opsnn.tensor(x64)).numpy(), _softmax64(x64, -1, log), np.float64)


def test_softmax_16bit_non_contiguous_empty(rng, no_leak):
    x = (rng.standard_normal((6, 50, 7)) * 3).astype(np.float32)
    for dtype in (np.float16, BF16):
        xd = x.astype(dtype)
        ex = aclnn.softmax.prepare(opsnn.tensor(xd), dim=1)
        assert ex.adapter
        _check(ex.run().numpy(), _softmax64(xd, 1), dtype)
        _check(ops.log_softmax(opsnn.tensor(xd), dim=-1).numpy(), _softmax64(xd, -1, True), dtype, rtol=2e-2, atol=5e-2)
    t = opsnn.tensor(x).transpose(0, 2)
    _check(ops.softmax(t, dim=1).numpy(), _softmax64(x.transpose(2, 1, 0), 1), np.float32)
    _check(
        ops.log_softmax(opsnn.from_numpy(x[:, ::3, :].T), dim=0).numpy(),
        _softmax64(x[:, ::3, :].T, 0, True),
        np.float32,
        rtol=1e-5,
        atol=1e-5,
    )
    for shape in ((0,), (4, 0), (0, 5), (2, 0, 3)):
        for dim in range(len(shape)):
            for fn in (ops.softmax, ops.log_softmax, ops.hardmax):
                y = fn(opsnn.tensor(np.zeros(shape, np.float32)), dim=dim)
                assert y.shape == shape


def test_softmax_forced_reference_and_onnxruntime(rng):
    import onnxruntime as ort

    x = (rng.standard_normal((4, 9, 33)) * 6).astype(np.float32)
    for op, fn in (("Softmax", ops.softmax), ("LogSoftmax", ops.log_softmax)):
        for axis in (0, 1, -1):
            ref = fn(opsnn.tensor(x), dim=axis, algo="reference").numpy()
            np.testing.assert_allclose(fn(opsnn.tensor(x), dim=axis).numpy(), ref, rtol=1e-5, atol=2e-6)
            node = helper.make_node(op, ["x"], ["y"], axis=axis)
            g = helper.make_graph(
                [node],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
            )
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
            sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            np.testing.assert_allclose(
                fn(opsnn.tensor(x), dim=axis).numpy(), sess.run(None, {"x": x})[0], rtol=1e-5, atol=2e-6
            )


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_softmax_property_any_shape_axis(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float64) * 10
    y = ops.softmax(opsnn.tensor(x), dim=axis).numpy()
    assert y.shape == tuple(shape)
    np.testing.assert_allclose(y, _softmax64(x, axis), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-12)


def test_softmax_errors():
    x = opsnn.tensor(np.zeros((2, 3), np.float32))
    for fn in (ops.softmax, ops.log_softmax, ops.hardmax):
        with pytest.raises(ParamInvalidError, match=r"axis.*\[-2, 1\].*got 2"):
            fn(x, dim=2)
        with pytest.raises(ParamInvalidError, match="axis"):
            fn(x, dim=-3)
        with pytest.raises(ParamInvalidError, match="dim"):
            fn(x, dim=1.0)
        with pytest.raises(ParamInvalidError, match="rank"):
            fn(opsnn.tensor(np.float32(1.0)))
        with pytest.raises(DTypeError, match="int32"):
            fn(opsnn.tensor(np.zeros((2, 3), np.int32)))
    with pytest.raises(ParamInvalidError, match="unknown attribute 'dim'"):
        ops.run_op("Softmax", [x], {"dim": 1})
    with pytest.raises(ParamNullptrError):
        ops.run_op("Softmax", [None], {})
    with pytest.raises(ParamInvalidError, match="axis"):
        aclnn.prepare("LogSoftmax", [x], {"axis": 5})


# -- hardmax ---------------------------------------------------------------------------------------------
def test_hardmax_first_max_ties_nan(rng):
    x = rng.integers(0, 3, (4, 5, 6)).astype(np.float32)  # many ties: the first maximum wins
    for axis in range(-3, 3):
        want = _onnx_eval("Hardmax", [x], {"axis": axis})
        ex = aclnn.hardmax.prepare(opsnn.tensor(x), dim=axis)
        assert ex.kernel_name == "hardmax_numpy"
        np.testing.assert_array_equal(ex.run().numpy(), want)
        np.testing.assert_array_equal(ops.hardmax(opsnn.tensor(x), dim=axis, algo="reference").numpy(), want)
    y = ops.hardmax(opsnn.tensor(np.array([[1.0, np.nan, 5.0], [-np.inf, -np.inf, -np.inf]], np.float32))).numpy()
    np.testing.assert_array_equal(y, [[0, 1, 0], [1, 0, 0]])
    y = ops.hardmax(opsnn.tensor(x.astype(np.float16)).transpose(0, 2), dim=1).numpy()
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, _onnx_eval("Hardmax", [np.ascontiguousarray(x.transpose(2, 1, 0))], {"axis": 1}))


# -- prelu ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "xs,ss,kernel",
    [
        ((3, 4, 5), (3, 4, 5), "prelu_numba"),
        ((3, 4, 5), (5,), "prelu_numba"),
        ((3, 4, 5), (1,), "prelu_numba"),
        ((2, 3, 4, 5), (3, 1, 1), "prelu_numba"),
        ((2, 3, 4, 5), (3, 4, 1), "prelu_numba"),
        ((2, 1, 4, 5), (2, 1, 1, 1), "prelu_numba"),
        ((2, 3, 4, 5), (3, 1, 5), "prelu_numpy"),  # interleaved broadcast: numpy kernel
        ((64, 32, 80), (32, 1), "prelu_numba"),  # large: parallel
        ((5,), (), "prelu_numba"),
    ],
)
def test_prelu_broadcasting(xs, ss, kernel, rng):
    x = (rng.standard_normal(xs) * 3).astype(np.float32)
    s = rng.uniform(-1, 1, ss).astype(np.float32)
    want = np.where(x < 0, x.astype(np.float64) * s, x)
    np.testing.assert_allclose(_onnx_eval("PRelu", [x, s], {}), want, rtol=1e-6)
    ex = aclnn.prepare("PRelu", [opsnn.tensor(x), opsnn.tensor(s)])
    assert ex.kernel_name == kernel
    _check(ex.run().numpy(), want, np.float32)
    ref = ops.run_op("PRelu", [x, s], algo="reference")[0].numpy()
    _check(ref, want, np.float32)


@settings(max_examples=30, deadline=None)
@given(xs=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_prelu_property_any_unidirectional_broadcast(xs, data):
    keep = data.draw(st.lists(st.booleans(), min_size=len(xs), max_size=len(xs)))
    drop = data.draw(st.integers(0, len(xs)))
    ss = tuple(d if k else 1 for d, k in zip(xs, keep))[drop:]
    x = np.random.default_rng(1).standard_normal(xs).astype(np.float32)
    s = np.random.default_rng(2).standard_normal(ss).astype(np.float32)
    ex = aclnn.prepare("PRelu", [opsnn.tensor(x), opsnn.tensor(s)])
    assert ex.kernel_name == ("prelu_numpy" if K.prelu_layout(tuple(xs), ss) is None else "prelu_numba")
    _check(ex.run().numpy(), np.where(x < 0, x.astype(np.float64) * s, x), np.float32)


def test_prelu_torch_style_weight_dtypes_and_errors(rng, no_leak):
    x = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    w = np.array([0.1, 0.2, 0.3], np.float32)
    want = np.where(x < 0, x * w[:, None], x)
    _check(ops.prelu(opsnn.tensor(x), opsnn.tensor(w)).numpy(), want, np.float32)
    _check(
        ops.prelu(opsnn.from_numpy(x.transpose(0, 2, 1)), 0.25).numpy(),
        np.where(x.transpose(0, 2, 1) < 0, 0.25 * x.transpose(0, 2, 1), x.transpose(0, 2, 1)),
        np.float32,
    )
    for dtype in (np.float16, BF16):
        _check(
            ops.prelu(opsnn.tensor(x.astype(dtype)), opsnn.tensor(w.astype(dtype))).numpy(),
            np.where(x < 0, x.astype(dtype).astype(np.float64) * w.astype(dtype)[:, None], x.astype(dtype)),
            dtype,
        )
    xi = np.array([[-4, 5], [6, -8]], np.int32)
    ex = aclnn.prepare("PRelu", [xi, np.array([2, 3], np.int32)])
    assert ex.kernel_name == "prelu_numpy"
    np.testing.assert_array_equal(ex.run().numpy(), [[-8, 5], [6, -24]])
    y = ops.prelu(opsnn.tensor(np.zeros((0, 3), np.float32)), opsnn.tensor(w))
    assert y.shape == (0, 3)
    with pytest.raises(InferShapeError, match="slope"):
        ops.run_op("PRelu", [x, np.ones((4, 3), np.float32)])
    with pytest.raises(InferShapeError, match="slope"):
        ops.run_op("PRelu", [x[0], np.ones((2, 3, 4), np.float32)])
    with pytest.raises(DTypeError, match="slope"):
        ops.run_op("PRelu", [x, np.ones(1, np.float64)])


# -- swiglu -----------------------------------------------------------------------------------------------
def test_swiglu(rng, no_leak):
    for shape, alpha in (((2, 4), 1.0), ((7, 129), 0.5), ((300, 400), 1.702)):
        a = (rng.standard_normal(shape) * 4).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        want = a.astype(np.float64) * _sig(alpha * a.astype(np.float64)) * b
        np.testing.assert_allclose(_onnx_eval("SwiGLU", [a, b], {"alpha": alpha}), want, rtol=1e-5, atol=1e-6)
        ex = aclnn.swiglu.prepare(opsnn.tensor(a), opsnn.tensor(b), alpha=alpha)
        assert ex.kernel_name == "swiglu_numba" and bool(ex.plan[1]) == (a.size >= K.PARALLEL_MIN_COSTLY)
        _check(ex.run().numpy(), want, np.float32)
        _check(ops.swiglu(opsnn.tensor(a), opsnn.tensor(b), alpha=alpha, algo="reference").numpy(), want, np.float32)
        _check(
            ops.swiglu(opsnn.tensor(a.astype(np.float64)), opsnn.tensor(b.astype(np.float64)), alpha=alpha).numpy(),
            want,
            np.float64,
        )
    a = (rng.standard_normal((5, 6)) * 4).astype(np.float32)
    _check(
        ops.swiglu(opsnn.from_numpy(a.T), opsnn.tensor(np.ones((6, 5), np.float16)).to("float32")).numpy(),
        a.T * _sig(a.T.astype(np.float64)),
        np.float32,
    )
    _check(
        ops.swiglu(opsnn.tensor(a.astype(np.float16)), opsnn.tensor(a.astype(np.float16))).numpy(),
        a.astype(np.float16).astype(np.float64) ** 2 * _sig(a.astype(np.float16).astype(np.float64)),
        np.float16,
    )
    assert ops.swiglu(opsnn.tensor(np.zeros((0, 2), np.float32)), opsnn.tensor(np.zeros((0, 2), np.float32))).shape == (
        0,
        2,
    )
    with pytest.raises(InferShapeError, match="same shape"):
        ops.swiglu(opsnn.tensor(a), opsnn.tensor(a[:, :1]))
    with pytest.raises(DTypeError):
        ops.swiglu(opsnn.tensor(a), opsnn.tensor(a.astype(np.float64)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 3, 8), (2, 128, 1200)])  # serial, parallel (>= PARALLEL_MIN_COSTLY)
def test_swiglu_reads_column_blocks_in_place(rng, shape, dtype):
    """Gate and value as the two column halves of one (.., 2n) product (row stride 2n): read in
    place, rows serial or parallel; the result equals the formula."""
    *lead, n = shape
    both = (rng.standard_normal(tuple(lead) + (2 * n,)) * 3).astype(dtype)
    g, v = both[..., :n], both[..., n:]
    assert not g.flags.c_contiguous
    want = g.astype(np.float64) * _sig(g.astype(np.float64)) * v
    ex = aclnn.swiglu.prepare(opsnn.from_numpy(g), opsnn.from_numpy(v))
    _check(ex.run().numpy(), want, dtype)
    x = both[..., ::2][..., : n // 2]  # no unit stride: made contiguous first
    _check(
        ops.swiglu(opsnn.from_numpy(x), opsnn.from_numpy(x)).numpy(),
        x.astype(np.float64) ** 2 * _sig(x.astype(np.float64)),
        dtype,
    )


# -- argument and attribute errors ---------------------------------------------------------------------------
def test_bad_arguments_raise_typed_errors():
    x = opsnn.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ParamInvalidError, match="negative_slope"):
        ops.leaky_relu(x, negative_slope="big")
    with pytest.raises(ParamInvalidError, match="alpha"):
        ops.celu(x, alpha=0.0)
    with pytest.raises(ParamInvalidError, match="alpha"):
        ops.elu(x, alpha=None)
    with pytest.raises(ParamInvalidError, match="did you mean 'alpha'"):
        ops.run_op("LeakyRelu", [x], {"alpah": 0.1})
    with pytest.raises(DTypeError, match="LeakyRelu.*int32"):
        ops.leaky_relu(opsnn.tensor(np.zeros(3, np.int32)))
    with pytest.raises(DTypeError, match="Sigmoid"):
        ops.sigmoid(opsnn.tensor(np.zeros(3, np.bool_)))
    with pytest.raises(ParamNullptrError):
        ops.run_op("Gelu", [None])
    with pytest.raises(OpsnnError):
        ops.gelu(x, approximat="tanh")


def test_records_follow_onnx_schemas():
    """Input names, attribute names and defaults follow the latest ONNX schema of each op."""
    for op in (
        "Relu",
        "LeakyRelu",
        "Gelu",
        "Swish",
        "Sigmoid",
        "Tanh",
        "Softplus",
        "HardSwish",
        "Softmax",
        "LogSoftmax",
        "Hardmax",
        "Elu",
        "Selu",
        "Celu",
        "Mish",
        "HardSigmoid",
        "ThresholdedRelu",
        "PRelu",
        "Softsign",
        "Shrink",
        "SwiGLU",
    ):
        schema = onnx.defs.get_schema(op)
        rec = ops.get_op(op)
        assert [i.name for i in rec.inputs] == [i.name for i in schema.inputs], op
        assert {a.name for a in rec.attrs} == set(schema.attributes), op
        for a in rec.attrs:
            proto = schema.attributes[a.name].default_value
            default = helper.get_attribute_value(proto)
            if isinstance(default, bytes):
                assert default.decode() == a.default, (op, a.name)
            else:
                assert default == pytest.approx(a.default, rel=1e-7), (op, a.name)
