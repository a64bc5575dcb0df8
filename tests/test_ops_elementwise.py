"""Elementwise ops: numba/numpy kernels against numpy formulas, the op references and onnx.reference."""

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opsnn
from opsnn import aclnn, ops
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError, ParamNullptrError
from opsnn.kernels.cpu import elementwise as K
from opsnn.ops.defs.elementwise import broadcast_shape

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
# tolerances against a float64 oracle: (rtol, atol)
TOL = {
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-12, 1e-14),
    F16: (2e-3, 1e-3),
    BF16: (1.6e-2, 1e-2),
}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def T(a):
    return opsnn.tensor(np.asarray(a))


def close(got, want, dtype=None):
    got = opsnn.Tensor.numpy(got) if isinstance(got, opsnn.Tensor) else got
    dtype = np.dtype(dtype or got.dtype)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    if dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        rtol, atol = TOL.get(dtype, (1e-6, 1e-7))
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)


def rand(rng, shape, dtype, lo=-4.0, hi=4.0):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -50), min(info.max, 50), size=shape, endpoint=True).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def onnx_ref(op_type, inputs, **attrs):
    """Run one node through onnx.reference.ReferenceEvaluator (an independent oracle)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"x{i}" for i in range(len(inputs))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


# -- broadcasting --------------------------------------------------------------------------------------------
@SETTINGS
@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=5, min_side=0, max_side=4))
def test_broadcast_shape_matches_numpy(shapes):
    assert broadcast_shape(*shapes.input_shapes) == np.broadcast_shapes(*shapes.input_shapes)


@SETTINGS
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.lists(st.integers(0, 4), min_size=1, max_size=4))
def test_broadcast_shape_agrees_with_numpy_on_errors(a, b):
    try:
        want = np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        with pytest.raises(InferShapeError) as err:
            broadcast_shape(tuple(a), tuple(b), op="Add", names=["A", "B"])
        assert str(tuple(a)) in str(err.value) and str(tuple(b)) in str(err.value)
        return
    assert broadcast_shape(tuple(a), tuple(b)) == want


@SETTINGS
@given(
    hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=1, max_side=5),
    st.sampled_from(["add", "sub", "maximum", "gt"]),
)
def test_broadcast_walk_matches_numpy(shapes, fn):
    """Any broadcast, walked through the coalesced plan, equals numpy's result."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shapes.input_shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes.input_shapes[1]).astype(np.float32)
    want = {"add": np.add, "sub": np.subtract, "maximum": np.maximum, "gt": np.greater}[fn](a, b)
    got = getattr(ops, fn)(T(a), T(b)).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("low_parallel_min")
def test_plan_layout_coalesces_and_picks_fast_paths():
    lay = K.plan_layout((4, 5, 6), [(4, 5, 6), (4, 5, 6)])
    assert lay.kind == "flat" and lay.shape.tolist() == [120]
    lay = K.plan_layout((4, 5, 6), [(4, 5, 6), ()])
    assert lay.kind == "scalar" and lay.strides.tolist() == [[1], [0]]
    lay = K.plan_layout((8, 3, 16, 16), [(8, 3, 16, 16), (3, 1, 1)])  # bias add: rows of H*W
    assert lay.kind == "broadcast" and lay.shape.tolist() == [8, 3, 256]
    assert lay.strides.tolist() == [[768, 256, 1], [0, 1, 0]]
    lay = K.plan_layout((2, 1, 3), [(2, 1, 3), (1, 1, 3)])  # size-1 dims drop out
    assert lay.shape.tolist() == [2, 3] and lay.strides.tolist() == [[3, 1], [0, 1]]
    assert K.plan_layout((0, 3), [(0, 3), (1, 3)]).kind == "empty"
    big = K.plan_layout((512, 512), [(512, 512), (512,)])
    assert big.parallel == (opsnn.kernels.cpu.elementwise._threads() > 1)
    assert not K.plan_layout((10, 10), [(10, 10), (10,)]).parallel


@SETTINGS
@given(
    hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=1, max_dims=4, min_side=1, max_side=6),
    st.integers(1, 9),
    st.integers(1, 9),
)
def test_parallel_task_split_covers_the_walk(shapes, rows_per_task, chunk):
    """Any split into row blocks x column chunks writes every output element exactly as numpy."""
    rng = np.random.default_rng(2)
    c_s, a_s, b_s = shapes.input_shapes
    a = rng.standard_normal(a_s).astype(np.float32)
    b = rng.standard_normal(b_s).astype(np.float32)
    c = rng.random(c_s) < 0.5
    ab_shape = np.broadcast_shapes(a_s, b_s)
    lay = K.plan_layout(ab_shape, [a_s, b_s])
    out = np.full(math.prod(ab_shape), np.nan, np.float32)
    K.binary_parallel(K.SUB, a.reshape(-1), b.reshape(-1), out, lay.shape, lay.strides, rows_per_task, chunk)
    np.testing.assert_array_equal(out.reshape(ab_shape), a - b)
    cmp = np.zeros(out.size, bool)
    K.compare_parallel(K.LT, a.reshape(-1), b.reshape(-1), cmp, lay.shape, lay.strides, rows_per_task, chunk)
    np.testing.assert_array_equal(cmp.reshape(ab_shape), a < b)
    out_shape = shapes.result_shape
    lay3 = K.plan_layout(out_shape, [c_s, a_s, b_s])
    sel = np.full(math.prod(out_shape), np.nan, np.float32)
    K.where_parallel(c.reshape(-1), a.reshape(-1), b.reshape(-1), sel, lay3.shape, lay3.strides, rows_per_task, chunk)
    np.testing.assert_array_equal(sel.reshape(out_shape), np.where(c, a, b))


def test_parallel_broadcast_4d(rng):
    a = rand(rng, (8, 3, 40, 50), np.float32)
    b = rand(rng, (3, 1, 50), np.float32)
    ex = aclnn.add.prepare(T(a), T(b))
    assert ex.plan.layout.shape.tolist() == [8, 3, 40, 50]
    close(ex.run(), a.astype(np.float64) + b)
    close(ops.where(T(a > 0), T(a), T(b)), np.where(a > 0, a, b))


@pytest.mark.parametrize(
    "shapes,kind",
    [
        (((3, 4), (3, 4)), "flat"),
        (((3, 4), ()), "scalar"),
        (((3, 4), (4,)), "broadcast"),
        (((1, 4), (3, 1)), "broadcast"),
    ],
)
def test_plan_kind_and_kernel_choice(shapes, kind):
    a, b = (np.ones(s, np.float32) for s in shapes)
    ex = aclnn.add.prepare(T(a), T(b))
    assert ex.kernel_name == "binary_numba" and ex.plan.kind == kind
    close(ex.run(), a + b)


# -- binary arithmetic ----------------------------------------------------------------------------------------
FORMULAS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
SHAPES = [((3, 5, 7), (3, 5, 7)), ((3, 5, 7), ()), ((), (4, 3)), ((2, 3, 1, 5), (4, 1)), ((1, 6), (5, 1)), ((7,), (1,))]


@pytest.mark.parametrize("fn", list(FORMULAS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, F16, BF16])
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_binary_float(rng, fn, dtype, sa, sb):
    a = rand(rng, sa, dtype)
    b = rand(rng, sb, dtype, 0.5, 3.0)
    got = getattr(ops, fn)(T(a), T(b))
    assert got.dtype == np.dtype(dtype)
    with np.errstate(all="ignore"):
        want = FORMULAS[fn](a.astype(np.float64), b.astype(np.float64))
    close(got, want, dtype)


INT_FORMULAS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


@pytest.mark.parametrize("fn", list(INT_FORMULAS))
@pytest.mark.parametrize(
    "dtype,kernel",
    [
        (np.int32, "binary_numba"),
        (np.int64, "binary_numba"),
        (np.int8, "binary_numpy"),
        (np.uint8, "binary_numpy"),
        (np.uint64, "binary_numpy"),
    ],
)
def test_binary_int_wraps_like_numpy(rng, fn, dtype, kernel):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(4, 33), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=(33,), dtype=dtype, endpoint=True)
    ex = getattr(aclnn, fn).prepare(T(a), T(b))
    assert ex.kernel_name == (kernel.replace("binary", "variadic") if fn in ("maximum", "minimum") else kernel)
    with np.errstate(all="ignore"):
        close(ex.run(), INT_FORMULAS[fn](a, b))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
def test_int_div_truncates_like_onnx(rng, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=200, dtype=dtype, endpoint=True)
    b = rng.integers(-9 if info.min < 0 else 1, 9, size=200, dtype=dtype, endpoint=True)
    b[b == 0] = 3
    a[:4] = [7, info.max, info.min, 0]
    got = ops.div(T(a), T(b)).numpy()
    close(got, onnx_ref("Div", [a, b]))
    if info.min < 0:  # hand check: truncation toward zero
        np.testing.assert_array_equal(
            ops.div(T(np.array([7, -7, 7, -7], dtype)), T(np.array([2, 2, -2, -2], dtype))).numpy(), [3, -3, -3, 3]
        )


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_int_div_edge_cases_do_not_crash(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.min, 5, -5, 0], dtype)
    b = np.array([-1, 1, 0, 0, 0], dtype)
    got = ops.div(T(a), T(b)).numpy()
    np.testing.assert_array_equal(got, [info.min, info.min, 0, 0, 0])  # wraps; x / 0 -> 0
    np.testing.assert_array_equal(ops.remainder(T(a), T(b)).numpy(), [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(ops.fmod(T(a), T(b)).numpy(), [0, 0, 0, 0, 0])


def test_float_div_by_zero_gives_inf_nan():
    a = np.array([1.0, -1.0, 0.0, np.nan], np.float32)
    got = ops.div(T(a), T(np.zeros(4, np.float32))).numpy()
    np.testing.assert_array_equal(got[:2], [np.inf, -np.inf])
    assert np.isnan(got[2:]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.int16, np.uint8])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_matches_onnx_reference(rng, dtype, fmod):
    a = rand(rng, (3, 20), dtype) * (7 if np.dtype(dtype).kind == "f" else 1)
    b = rand(rng, (20,), dtype)
    b[b == 0] = 3
    got = (ops.fmod if fmod else ops.remainder)(T(a), T(b))
    close(got, onnx_ref("Mod", [a, b], fmod=fmod))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mod_float_special_values():
    a = np.array([0.0, -0.0, np.inf, 5.0, 1.0, -1.0, np.nan, 5.0], np.float64)
    b = np.array([3.0, 3.0, 2.0, 0.0, np.inf, np.inf, 1.0, -3.0], np.float64)
    got = ops.remainder(T(a), T(b)).numpy()
    np.testing.assert_array_equal(got, np.mod(a, b))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(np.mod(a, b)))
    np.testing.assert_array_equal(ops.fmod(T(a), T(b)).numpy(), np.fmod(a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, F16, BF16])
def test_pow_float(rng, dtype):
    a = rand(rng, (4, 6), dtype, 0.1, 3.0)
    b = rand(rng, (6,), dtype, -2.0, 2.0)
    close(ops.pow(T(a), T(b)), np.power(a.astype(np.float64), b.astype(np.float64)), dtype)
    close(T(a) ** 2, a.astype(np.float64) ** 2, dtype)  # scalar-exponent fast path
    close(ops.pow(T(a), 0.5), np.sqrt(a.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_pow_int_wraps_and_negative_exponents(dtype):
    a = np.array([2, 3, -3, 7, 1, -1, -1, 5, 0, 2], dtype)
    b = np.array([10, 5, 3, 40, -3, -3, -2, -1, 0, 70], dtype)
    got = ops.pow(T(a), T(b)).numpy()
    want = [
        (int(x) ** int(e) if e >= 0 else (1 if x == 1 else ((-1) ** -int(e) if x == -1 else 0))) for x, e in zip(a, b)
    ]
    bits = np.iinfo(dtype).bits
    want = [((w + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) for w in want]
    np.testing.assert_array_equal(got, np.array(want, dtype))


@pytest.mark.parametrize(
    "xa,xb",
    [(np.float32, np.int64), (np.int64, np.float32), (np.int32, np.int64), (np.float32, np.uint32), (F16, np.float32)],
)
def test_pow_mixed_dtypes_match_onnx(xa, xb):
    a = np.array([1, 2, 3, 4], xa)
    b = np.array([2, 3, 1, 0], xb)
    ex = aclnn.pow.prepare(T(a), T(b))
    assert ex.kernel_name == "pow_mixed"
    got = ex.run()
    assert got.dtype == np.dtype(xa)
    close(got, onnx_ref("Pow", [a, b]) if xa != F16 else np.power(a, b.astype(np.float16)))


@pytest.mark.parametrize("fn,code", [("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div")])
@pytest.mark.usefixtures("low_parallel_min")
def test_parallel_and_reference_kernels_agree(rng, fn, code):
    a = rand(rng, (70, 600), np.float32)
    b = rand(rng, (600,), np.float32, 0.5, 2)
    ex = getattr(aclnn, fn).prepare(T(a), T(b))
    assert ex.plan.layout.parallel == (K._threads() > 1) and ex.plan.kind == "broadcast"
    want = getattr(aclnn, fn).prepare(T(a), T(b), algo="reference").run().numpy()
    close(ex.run(), want)
    close(getattr(ops, fn)(T(a), T(b[0])), FORMULAS[fn](a.astype(np.float64), float(b[0])))  # parallel scalar
    c = rand(rng, (70, 600), np.float32, 0.5, 2)
    close(getattr(ops, fn)(T(a), T(c)), FORMULAS[fn](a.astype(np.float64), c))  # parallel flat


def test_parallel_small_inner_rows(rng):
    a = rand(rng, (20000, 3), np.int64)
    b = rand(rng, (20000, 1), np.int64)
    ex = aclnn.mul.prepare(T(a), T(b))
    assert ex.plan.layout.rows_per_task > 1 or not ex.plan.layout.parallel
    close(ex.run(), a * b)


def test_non_contiguous_inputs(rng):
    a = rand(rng, (6, 5), np.float32)
    b = rand(rng, (5, 6), np.float32)
    close(ops.add(opsnn.from_numpy(a.T), T(b)), a.T.astype(np.float64) + b)
    t = T(b).transpose(0, 1)
    close(ops.mul(t, T(a)), b.T.astype(np.float64) * a)
    s = opsnn.from_numpy(a[::2, ::-1])
    close(ops.sub(s, T(a[0])), a[::2, ::-1].astype(np.float64) - a[0])
    close(ops.exp(opsnn.from_numpy(a.T)), np.exp(a.T.astype(np.float64)))
    close(ops.where(opsnn.from_numpy((a > 0).T), opsnn.from_numpy(a.T), T(b)), np.where((a > 0).T, a.T, b))


def test_empty_tensors(no_leak):
    e = np.zeros((0, 3), np.float32)
    out = ops.add(T(e), T(np.ones((1, 3), np.float32)))
    assert out.shape == (0, 3)
    assert ops.exp(T(e)).shape == (0, 3)
    assert ops.gt(T(e), T(np.float32(1))).shape == (0, 3)
    assert ops.where(T(np.zeros((0, 1), bool)), T(e), T(np.float32(1))).shape == (0, 3)
    assert ops.maximum(T(e), T(e), T(np.zeros(3, np.float32))).shape == (0, 3)
    assert ops.clip(T(e), 0.0, 1.0).shape == (0, 3)
    assert ops.cast(T(e), "float16").shape == (0, 3)
    with pytest.raises(InferShapeError):
        ops.add(T(np.zeros(0, np.float32)), T(np.zeros(2, np.float32)))


def test_nan_and_inf_propagate():
    a = np.array([np.nan, 1.0, np.inf, -np.inf, 2.0, np.nan], np.float32)
    b = np.array([1.0, np.nan, 1.0, 1.0, -np.inf, np.nan], np.float32)
    for fn, f in [("maximum", np.maximum), ("minimum", np.minimum), ("add", np.add), ("mul", np.multiply)]:
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(getattr(ops, fn)(T(a), T(b)).numpy(), f(a, b))
    np.testing.assert_array_equal(ops.maximum(T(a), T(np.float32(0))).numpy(), np.maximum(a, 0))
    np.testing.assert_array_equal(ops.eq(T(a), T(a)).numpy(), a == a)


# -- python scalars and operators -----------------------------------------------------------------------------
def test_tensor_operators_and_python_scalars(no_leak):
    x = T(np.array([1.0, 2.0, 4.0], np.float32))
    for got, want in [
        (x + 1, [2, 3, 5]),
        (1 + x, [2, 3, 5]),
        (x - 1, [0, 1, 3]),
        (10 - x, [9, 8, 6]),
        (x * 2, [2, 4, 8]),
        (2 * x, [2, 4, 8]),
        (x / 2, [0.5, 1, 2]),
        (4 / x, [4, 2, 1]),
        (x**2, [1, 4, 16]),
        (ops.pow(2, x), [2, 4, 16]),
        (-x, [-1, -2, -4]),
    ]:
        assert got.dtype == np.float32
        close(got, np.array(want, np.float64))
    i = T(np.array([7, -7], np.int32))
    assert (i / 2).dtype == np.int32
    np.testing.assert_array_equal((i / 2).numpy(), [3, -3])
    np.testing.assert_array_equal((i * 3).numpy(), [21, -21])
    with pytest.raises(DTypeError, match="same dtype"):
        i * 0.5  # a Python float with an integer tensor is float32: ONNX does not promote


# -- variadic ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, F16, np.int64, np.int16])
def test_variadic_ops(rng, dtype):
    xs = [rand(rng, s, dtype) for s in [(2, 3, 4), (4,), (3, 1)]]
    wide = [x.astype(np.float64) for x in xs]
    if np.dtype(dtype).kind == "f":
        close(ops.add_n(*map(T, xs)), wide[0] + wide[1] + wide[2], dtype)
        close(ops.mean_n(*map(T, xs)), (wide[0] + wide[1] + wide[2]) / 3, dtype)
        close(ops.mean_n(T(xs[0])), wide[0], dtype)
    close(ops.maximum(*map(T, xs)), np.maximum(np.maximum(wide[0], wide[1]), wide[2]), dtype)
    close(ops.minimum(*map(T, xs)), np.minimum(np.minimum(wide[0], wide[1]), wide[2]), dtype)
    close(ops.minimum(T(xs[1])), wide[1], dtype)
    small_first = ops.run_op("Max", [T(xs[1]), T(xs[2]), T(xs[0])])[0]  # output larger than in0 (+) in1
    close(small_first, np.maximum(np.maximum(wide[1], wide[2]), wide[0]), dtype)


def test_variadic_kernels_and_errors(rng):
    xs = [T(rand(rng, (300, 200), np.float32)) for _ in range(3)]
    ex = aclnn.add_n.prepare(*xs)
    assert ex.kernel_name == "variadic_numba"
    close(ex.run(), aclnn.add_n.prepare(*xs, algo="reference").run().numpy())
    assert aclnn.maximum.prepare(T(np.ones(3, np.uint16)), T(np.ones(3, np.uint16))).kernel_name == "variadic_numpy"
    with pytest.raises(ParamInvalidError, match="at least one"):
        ops.run_op("Sum", [])
    with pytest.raises(DTypeError):
        ops.add_n(T(np.ones(3, np.int32)))  # Sum is float-only in ONNX
    with pytest.raises(InferShapeError, match=r"\(2,\).*\(3,\)"):
        ops.maximum(T(np.ones(2, np.float32)), T(np.ones(3, np.float32)))


# -- comparisons and logic ---------------------------------------------------------------------------------------
CMP = {"eq": np.equal, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}


@pytest.mark.parametrize("fn", list(CMP))
@pytest.mark.parametrize(
    "dtype,kernel",
    [
        (np.float32, "compare_numba"),
        (np.int64, "compare_numba"),
        (F16, "compare_numba"),
        (BF16, "compare_numba"),
        (np.uint16, "compare_numpy"),
        (np.int8, "compare_numpy"),
    ],
)
def test_compare(rng, fn, dtype, kernel):
    a = rand(rng, (3, 4, 5), dtype, -2, 2)
    b = rand(rng, (4, 1), dtype, -2, 2)
    a[0, 0, :2] = b[0, 0]  # some ties
    ex = getattr(aclnn, fn).prepare(T(a), T(b))
    assert ex.kernel_name == kernel
    got = ex.run()
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got.numpy(), CMP[fn](a.astype(np.float64), b.astype(np.float64)))
    np.testing.assert_array_equal(
        getattr(ops, fn)(T(a), T(b[1, 0])).numpy(), CMP[fn](a.astype(np.float64), float(b[1, 0]))
    )


def test_compare_parallel_and_strings(rng):
    a = rand(rng, (300, 300), np.float32)
    np.testing.assert_array_equal(ops.gt(T(a), T(a[0])).numpy(), a > a[0])
    s = np.array(["ab", "cd", "ef"])
    np.testing.assert_array_equal(
        ops.eq(opsnn.from_numpy(s), opsnn.from_numpy(np.array(["cd"]))).numpy(), [False, True, False]
    )
    o = np.array(["x", "y"], dtype=object)
    np.testing.assert_array_equal(ops.eq(opsnn.from_numpy(o), opsnn.from_numpy(o[::-1].copy())).numpy(), [False, False])
    with pytest.raises(DTypeError):
        ops.eq(opsnn.from_numpy(s), T(np.ones(3, np.float32)))


@pytest.mark.parametrize(
    "fn,f", [("logical_and", np.logical_and), ("logical_or", np.logical_or), ("logical_xor", np.logical_xor)]
)
def test_logic(rng, fn, f):
    a, b = rng.random((3, 4)) < 0.5, rng.random((4,)) < 0.5
    np.testing.assert_array_equal(getattr(ops, fn)(T(a), T(b)).numpy(), f(a, b))
    np.testing.assert_array_equal(ops.logical_not(T(a)).numpy(), ~a)
    with pytest.raises(DTypeError):
        getattr(ops, fn)(T(a.astype(np.float32)), T(b.astype(np.float32)))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.uint64])
def test_bitwise_and_shift_match_onnx(rng, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, 8), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=(8,), dtype=dtype, endpoint=True)
    for fn, op in [("bitwise_and", "BitwiseAnd"), ("bitwise_or", "BitwiseOr"), ("bitwise_xor", "BitwiseXor")]:
        np.testing.assert_array_equal(getattr(ops, fn)(T(a), T(b)).numpy(), onnx_ref(op, [a, b]))
    np.testing.assert_array_equal(ops.bitwise_not(T(a)).numpy(), onnx_ref("BitwiseNot", [a]))
    bits = info.bits
    s = (
        np.array([0, 1, 3, bits - 1, bits, bits + 5, 2, 1], dtype)
        if info.min == 0
        else np.array([0, 1, 3, bits - 1, bits, -1, -bits, 2], dtype)
    )
    for fn, direction in [("bitwise_left_shift", "LEFT"), ("bitwise_right_shift", "RIGHT")]:
        got = getattr(ops, fn)(T(a), T(s)).numpy()
        np.testing.assert_array_equal(
            got, onnx_ref("BitShift", [a, np.broadcast_to(s, a.shape).copy()], direction=direction)
        )
        ref = ops.run_op("BitShift", [T(a), T(s)], {"direction": direction}, algo="reference")[0]
        np.testing.assert_array_equal(got, ref.numpy())
    with pytest.raises(ParamInvalidError, match="direction"):
        ops.run_op("BitShift", [T(a), T(s)], {"direction": b"UP"})


# -- unary ---------------------------------------------------------------------------------------------------------
UNARY = {
    "exp": (np.exp, -5, 5),
    "log": (np.log, 0.01, 10),
    "sqrt": (np.sqrt, 0, 10),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.1, 10),
    "floor": (np.floor, -5, 5),
    "ceil": (np.ceil, -5, 5),
    "round": (np.round, -5, 5),
    "reciprocal": (lambda x: 1 / x, 0.2, 5),
    "neg": (np.negative, -5, 5),
    "abs": (np.abs, -5, 5),
    "sign": (np.sign, -5, 5),
    "erf": (np.vectorize(math.erf, otypes=[np.float64]), -3, 3),
    "sin": (np.sin, -6, 6),
    "cos": (np.cos, -6, 6),
    "tan": (np.tan, -1.4, 1.4),
    "asin": (np.arcsin, -1, 1),
    "acos": (np.arccos, -1, 1),
    "atan": (np.arctan, -9, 9),
    "sinh": (np.sinh, -4, 4),
    "cosh": (np.cosh, -4, 4),
    "asinh": (np.arcsinh, -9, 9),
    "acosh": (np.arccosh, 1, 9),
    "atanh": (np.arctanh, -0.99, 0.99),
}


@pytest.mark.parametrize("fn", list(UNARY))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, F16, BF16])
def test_unary_float(rng, fn, dtype):
    f, lo, hi = UNARY[fn]
    x = rand(rng, (5, 13), dtype, lo, hi)
    if fn == "round":
        x[0, :4] = [0.5, 1.5, 2.5, -2.5]
    ex = getattr(aclnn, fn).prepare(T(x))
    simd = K.NUMPY_SIMD.get(getattr(K, f"U_{fn.upper()}", None) if fn != "reciprocal" else None)
    assert ex.kernel_name == ("unary_simd" if simd else "unary_numba")
    got = ex.run()
    assert got.dtype == np.dtype(dtype)
    want = f(x.astype(np.float64))
    if np.dtype(dtype) in (F16, BF16) and fn in ("floor", "ceil", "round", "sign"):
        want = want.astype(dtype)
    close(got, want, dtype)
    if simd:  # the numba map stays available
        close(getattr(ops, fn)(T(x), algo="unary_numba"), want, dtype)


@pytest.mark.usefixtures("low_parallel_min")
def test_unary_special_values_and_parallel(rng):
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    with np.errstate(all="ignore"):
        for fn, f in [
            ("log", np.log),
            ("sqrt", np.sqrt),
            ("exp", np.exp),
            ("reciprocal", np.reciprocal),
            ("sign", np.sign),
            ("floor", np.floor),
            ("atanh", np.arctanh),
            ("abs", np.abs),
        ]:
            np.testing.assert_allclose(getattr(ops, fn)(T(x)).numpy(), f(x), rtol=1e-6, err_msg=fn)
    big = rand(rng, (256, 300), np.float32)
    for fn, algo in [("sin", None), ("sin", "unary_numba"), ("sqrt", None)]:
        ex = getattr(aclnn, fn).prepare(T(np.abs(big)), algo=algo)
        assert ex.plan.parallel == (K._threads() > 1)
        close(ex.run(), UNARY[fn][0](np.abs(big).astype(np.float64)))
    close(ops.abs(T(big.astype(np.int64))), np.abs(big.astype(np.int64)))


@pytest.mark.parametrize(
    "dtype,kernel",
    [(np.int32, "unary_numba"), (np.int64, "unary_numba"), (np.int8, "unary_numpy"), (np.int16, "unary_numpy")],
)
def test_unary_int(dtype, kernel):
    info = np.iinfo(dtype)
    x = np.array([info.min, -5, -1, 0, 1, 7, info.max], dtype)
    for fn, f in [("neg", np.negative), ("abs", np.abs), ("sign", np.sign)]:
        ex = getattr(aclnn, fn).prepare(T(x))
        assert ex.kernel_name == kernel
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(ex.run().numpy(), f(x))
    np.testing.assert_array_equal(ops.abs(T(np.array([0, 200], np.uint8))).numpy(), [0, 200])


@pytest.mark.parametrize(
    "dtype", [np.float32, F16, BF16, np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
)
def test_isnan_isinf(dtype):
    x = np.array([1.0, np.nan, 448.0, -2.0, 0.0], np.float32)
    if np.dtype(dtype) != np.dtype(ml_dtypes.float8_e4m3fn):
        x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    x = x.astype(dtype)
    wide = x.astype(np.float64)
    np.testing.assert_array_equal(ops.isnan(T(x)).numpy(), np.isnan(wide))
    np.testing.assert_array_equal(ops.isinf(T(x)).numpy(), np.isinf(wide))
    np.testing.assert_array_equal(ops.isinf(T(x), detect_negative=False).numpy(), np.isposinf(wide))
    np.testing.assert_array_equal(ops.isinf(T(x), detect_positive=False).numpy(), np.isneginf(wide))
    assert not ops.isinf(T(x), detect_positive=False, detect_negative=False).numpy().any()


# -- Clip, Where -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,kernel",
    [
        (np.float32, "clip_numba"),
        (np.float64, "clip_numba"),
        (F16, "clip_numba"),
        (np.int64, "clip_numba"),
        (np.int8, "clip_numpy"),
        (np.uint16, "clip_numpy"),
    ],
)
def test_clip(rng, dtype, kernel):
    x = rand(rng, (7, 9), dtype, -10, 10)
    ex = aclnn.clip.prepare(T(x), 1, 3)
    assert ex.kernel_name == kernel
    close(ex.run(), np.clip(x.astype(np.float64), 1, 3), dtype)
    close(ops.clip(T(x), min=2), np.maximum(x.astype(np.float64), 2), dtype)
    close(ops.clamp(T(x), max=2), np.minimum(x.astype(np.float64), 2), dtype)
    close(ops.clip(T(x)), x.astype(np.float64), dtype)
    close(ops.clip(T(x), 5, 2), np.minimum(np.maximum(x.astype(np.float64), 5), 2), dtype)  # min > max -> max


def test_clip_nan_parallel_and_errors(rng):
    x = np.array([np.nan, -np.inf, np.inf, 0.5], np.float32)
    np.testing.assert_array_equal(ops.clip(T(x), -1.0, 1.0).numpy(), np.clip(x, -1, 1))
    big = rand(rng, (200, 300), np.float32)
    close(ops.clip(T(big), -1.0, 1.0), np.clip(big, -1, 1))
    close(
        ops.clip(T(big), -1.0, 1.0),
        ops.run_op("Clip", [T(big), T(np.float32(-1)), T(np.float32(1))], algo="reference")[0].numpy(),
    )
    with pytest.raises(ParamInvalidError, match="scalar"):
        ops.clip(T(big), T(np.zeros(2, np.float32)))
    with pytest.raises(DTypeError):
        ops.clip(T(big), T(np.float64(0)))


@pytest.mark.parametrize("dtype", [np.float32, F16, BF16, np.int64, np.int8, np.bool_, np.float64])
def test_where(rng, dtype):
    c = rng.random((3, 1, 5)) < 0.5
    x = rand(rng, (4, 5), dtype)
    y = rand(rng, (3, 4, 1), dtype)
    ex = aclnn.where.prepare(T(c), T(x), T(y))
    assert ex.kernel_name == "where_numba"
    got = ex.run()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.numpy(), np.where(c, x, y))
    np.testing.assert_array_equal(
        ops.where(T(c), T(x), T(np.asarray(0).astype(dtype))).numpy(), np.where(c, x, np.asarray(0).astype(dtype))
    )


def test_where_parallel_and_errors(rng):
    c = rng.random((300, 200)) < 0.5
    x = rand(rng, (300, 200), np.float32)
    np.testing.assert_array_equal(ops.where(T(c), T(x), 0.0).numpy(), np.where(c, x, 0))
    np.testing.assert_array_equal(ops.where(T(c), T(x), T(x[0])).numpy(), np.where(c, x, x[0]))
    with pytest.raises(DTypeError):
        ops.where(T(c.astype(np.float32)), T(x), T(x))
    with pytest.raises(DTypeError, match="float32.*float64|float64.*float32"):
        ops.where(T(c), T(x), T(x.astype(np.float64)))
    with pytest.raises(InferShapeError, match=r"\(300, 200\)"):
        ops.where(T(c), T(x), T(np.ones(7, np.float32)))


# -- Cast ---------------------------------------------------------------------------------------------
def test_cast_names_dtypes_and_enums(rng):
    x = rand(rng, (3, 4), np.float32)
    for spec in ["float16", np.float16, np.dtype(np.float16), 10, "half"]:
        got = ops.cast(T(x), spec)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got.numpy(), x.astype(np.float16))
    assert T(x).to("bf16").dtype == BF16
    np.testing.assert_array_equal(T(x).to("bf16").numpy(), x.astype(BF16))
    ex = aclnn.cast.prepare(T(x), "int32")
    assert ex.kernel_name == "cast_numpy"
    np.testing.assert_array_equal(ex.run().numpy(), x.astype(np.int32))  # truncation
    np.testing.assert_array_equal(ops.cast_like(T(x), T(np.zeros(0, np.float64))).numpy(), x.astype(np.float64))
    np.testing.assert_array_equal(
        ops.cast(T(np.array([0.0, -0.0, np.nan, 2.0])), "bool").numpy(), [False, False, True, True]
    )
    np.testing.assert_array_equal(ops.cast(T(np.array([200, -56], np.int16)), "int8").numpy(), [-56, -56])
    np.testing.assert_array_equal(ops.cast(T(np.array([True, False])), "float32").numpy(), [1.0, 0.0])


@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"])
@pytest.mark.parametrize("src", [np.float32, np.float16])
@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cast_float8_saturation_matches_onnx(dst, src, saturate):
    x = np.array([0.5, -0.3, 1e6, -1e6, np.inf, -np.inf, np.nan, 300.0, 70000.0, 1e-9], np.float32).astype(src)
    dt = np.dtype(getattr(ml_dtypes, dst))
    got = ops.cast(T(x), dt, saturate=bool(saturate))
    assert got.dtype == dt
    want = onnx_ref("Cast", [x], to=int(opsnn.ops.defs.elementwise.onnx_enum(dt)), saturate=saturate)
    np.testing.assert_array_equal(got.numpy().astype(np.float64), want.astype(np.float64))


def test_cast_to_and_from_narrow_types():
    x = np.arange(-9, 16).astype(np.float32)
    for name in ["int4", "uint4", "int2", "uint2", "float4_e2m1fn"]:
        dt = np.dtype(getattr(ml_dtypes, name))
        got = ops.cast(T(x), name).numpy()
        np.testing.assert_array_equal(got.astype(np.float64), x.astype(dt).astype(np.float64), err_msg=name)
        back = ops.cast(opsnn.from_numpy(got), "float32").numpy()
        np.testing.assert_array_equal(back, got.astype(np.float32))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_e8m0(round_mode, saturate):
    from onnx.numpy_helper import to_float8e8m0

    x = np.array([1.0, 1.5, 3.0, 0.24, 5e-39, 0.0, 3e38, np.nan, 2.0**127 * 1.75, 6.0, 0.75], np.float32)
    got = ops.cast(T(x), "float8_e8m0fnu", saturate=bool(saturate), round_mode=round_mode).numpy()
    want = to_float8e8m0(x, bool(saturate), round_mode)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # the spec (not onnx's helper) saturates infinities to the largest exponent
    inf = (
        ops.cast(T(np.array([np.inf], np.float32)), "float8_e8m0fnu", saturate=bool(saturate), round_mode=round_mode)
        .numpy()
        .view(np.uint8)
    )
    assert inf[0] == (0xFE if saturate else 0xFF)


def test_cast_from_strings_and_errors():
    s = opsnn.from_numpy(np.array(["3.5", "+INF", "-inf", "NaN", "1e-5", "100"]))
    got = ops.cast(s, "float32").numpy()
    np.testing.assert_array_equal(got[:3], [3.5, np.inf, -np.inf])
    assert np.isnan(got[3]) and got[4] == np.float32(1e-5) and got[5] == 100
    np.testing.assert_array_equal(
        ops.cast(opsnn.from_numpy(np.array(["100", "-7", "100.5"], object)), "int64").numpy(), [100, -7, 100]
    )
    x = T(np.ones(3, np.float32))
    with pytest.raises(DTypeError, match="STRING"):
        ops.run_op("Cast", [x], {"to": 8})
    with pytest.raises(DTypeError, match="99"):
        ops.run_op("Cast", [x], {"to": 99})
    with pytest.raises(DTypeError):
        ops.cast(x, "not_a_dtype")
    with pytest.raises(ParamNullptrError):
        ops.run_op("Cast", [x], {})
    with pytest.raises(ParamInvalidError, match="round_mode"):
        ops.cast(x, "float16", round_mode="sideways")


# -- typed errors ---------------------------------------------------------------------------------------------
def test_errors_name_shapes_dtypes_and_arguments():
    a, b = T(np.ones((2, 3), np.float32)), T(np.ones((4,), np.float32))
    with pytest.raises(InferShapeError) as err:
        ops.add(a, b)
    assert "Add" in str(err.value) and "(2, 3)" in str(err.value) and "(4,)" in str(err.value)
    assert err.value.code == opsnn.errors.INFERSHAPE
    with pytest.raises(DTypeError, match="float32 and float64"):
        ops.mul(a, T(np.ones(3, np.float64)))
    with pytest.raises(DTypeError, match="Exp.*int32"):
        ops.exp(T(np.ones(3, np.int32)))
    with pytest.raises(DTypeError):
        ops.neg(T(np.ones(3, np.uint8)))
    with pytest.raises(DTypeError):
        ops.bitwise_and(a, a)
    with pytest.raises(ParamNullptrError):
        ops.add(a, None)
    with pytest.raises(ParamInvalidError, match="fmod"):
        ops.run_op("Mod", [a, a], {"fmod": 2})
    with pytest.raises(ParamInvalidError, match="unknown attribute"):
        ops.run_op("Add", [a, a], {"alpha": 2})
    with pytest.raises(ParamInvalidError):
        ops.add(a)


def test_two_phase_executor_reuse_and_leaks(rng, no_leak):
    a = T(rand(rng, (5, 6), np.float32))
    b = T(rand(rng, (6,), np.float32))
    ex = aclnn.sub.prepare(a, b)
    assert ex.workspace_size == 0
    first = ex.run().numpy().copy()
    b2 = T(rand(rng, (6,), np.float32))
    close(ex.run(inputs=[a, b2]), a.numpy().astype(np.float64) - b2.numpy())
    close(first, a.numpy().astype(np.float64) - b.numpy())
    assert "binary_numba" in ex.explain()


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_outputs_may_overwrite_inputs(rng, dtype):
    """The graph engine may give an elementwise op's output the memory of a dying input."""
    a, b, c = (rand(rng, (6, 7), dtype) for _ in range(3))
    wide = [x.astype(np.float64) for x in (a, b, c)]
    for fn, want in [
        ("maximum", np.maximum(np.maximum(wide[0], wide[1]), wide[2])),
        ("minimum", np.minimum(np.minimum(wide[0], wide[1]), wide[2])),
    ]:
        for alias in range(3):
            ts = [T(a), T(b), T(c)]
            getattr(aclnn, fn).prepare(*ts, out=ts[alias]).run()
            close(ts[alias], want, dtype)
    ta, tb = T(a), T(b)
    aclnn.sub.prepare(ta, tb, out=tb).run()
    close(tb, wide[0] - wide[1], dtype)
    cond = rng.random((6, 7)) < 0.5
    ta, tb = T(a), T(b)
    aclnn.where.prepare(T(cond), ta, tb, out=ta).run()
    np.testing.assert_array_equal(ta.numpy(), np.where(cond, a, b))
    if np.dtype(dtype).kind == "f":
        ts = [T(a), T(b), T(c)]
        aclnn.add_n.prepare(*ts, out=ts[2]).run()
        close(ts[2], wide[0] + wide[1] + wide[2], dtype)
        tx = T(a)
        aclnn.exp.prepare(tx, out=tx).run()
        close(tx, np.exp(wide[0]), dtype)
