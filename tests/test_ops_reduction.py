"""Reduction ops (ReduceSum ... ReduceSumSquare, Var, ArgMax/ArgMin, CumSum) against
independent numpy formulas in float64 (and onnx.reference for ONNX attribute forms).

Tolerances: float32 kernels accumulate in float64, so results match the float64 oracle to
float32 rounding (rtol 1e-5); 16-bit results are compared with the float32-input oracle at
rtol/atol 1e-2 (bfloat16 has 8 mantissa bits).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError
from opsnn.ops import get_op, run_op


def _sum(w, ax, k):
    return np.sum(w, axis=ax, keepdims=k)


ORACLE = {
    "ReduceSum": _sum,
    "ReduceMean": lambda w, ax, k: np.mean(w, axis=ax, keepdims=k),
    "ReduceMax": lambda w, ax, k: np.max(w, axis=ax, keepdims=k),
    "ReduceMin": lambda w, ax, k: np.min(w, axis=ax, keepdims=k),
    "ReduceProd": lambda w, ax, k: np.prod(w, axis=ax, keepdims=k),
    "ReduceL1": lambda w, ax, k: _sum(np.abs(w), ax, k),
    "ReduceL2": lambda w, ax, k: np.sqrt(_sum(w * w, ax, k)),
    "ReduceLogSum": lambda w, ax, k: np.log(_sum(w, ax, k)),
    "ReduceLogSumExp": lambda w, ax, k: np.log(_sum(np.exp(w), ax, k)),
    "ReduceSumSquare": lambda w, ax, k: _sum(w * w, ax, k),
}
REDUCE_OPS = list(ORACLE)


def _data(op, shape, rng, dtype=np.float32):
    x = rng.standard_normal(shape)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceProd":  # keep long products inside float32 range
        w = 0.2 if math.prod(shape) < 1000 else 0.002
        x = rng.uniform(1 - w, 1 + w, shape)
    return x.astype(dtype)


def _axes_arg(axes):
    return None if axes is None else np.asarray(axes, np.int64)


def _np_axes(axes):
    return None if axes is None else tuple(axes)


CASES = [
    ((7,), [0]),
    ((3, 5), [1]),
    ((3, 5), [0]),
    ((3, 5), [-1]),
    ((3, 5), None),
    ((2, 3, 5), [1]),
    ((2, 3, 5), [0, 2]),
    ((2, 3, 5), [-1, -2]),
    ((4, 1, 6, 5), [1, 3]),
    ((2, 3, 4, 5), [0, 2]),
    ((2, 3, 4, 5), [1, 3]),
    ((2, 3, 4, 5), [3, 0, 1]),
]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,axes", CASES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_matches_oracle(op, shape, axes, keepdims, rng):
    x = _data(op, shape, rng)
    args = [x] if axes is None else [x, _axes_arg(axes)]
    (y,) = run_op(op, args, {"keepdims": keepdims})
    want = ORACLE[op](x.astype(np.float64), _np_axes(axes), bool(keepdims))
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize(
    "shape,axes", [((3, 40000), [1]), ((70001,), None), ((50, 701), [0]), ((40, 30, 37), [0, 2]), ((9, 4100, 3), [1])]
)
@pytest.mark.usefixtures("low_parallel_min")
def test_reduce_parallel_chunked_paths(op, shape, axes, rng):
    """Shapes past the parallel threshold: row chunks, split inner blocks, permuted copy."""
    x = _data(op, shape, rng)
    ex = opsnn.ops.prepare(get_op(op), [x, _axes_arg(axes)], {"keepdims": 0})
    assert ex.kernel_name == "reduce_numba" and ex.plan.parallel
    y = ex.run(None if ex.workspace_size == 0 else opsnn.empty((ex.workspace_size,), "uint8"))
    want = ORACLE[op](x.astype(np.float64), _np_axes(axes), False)
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=1e-5)


@pytest.mark.usefixtures("low_parallel_min")
def test_chunked_plan_is_used_and_deterministic(rng):
    x = rng.standard_normal((2, 50000)).astype(np.float32)
    ex = opsnn.aclnn.sum.prepare(x, dim=1)
    assert ex.plan.nchunk > 1 and ex.workspace_size > 0
    a, b = ex.run().numpy().copy(), ex.run().numpy().copy()
    assert np.array_equal(a, b)
    np.testing.assert_allclose(a, x.astype(np.float64).sum(1), rtol=1e-6)


@pytest.mark.parametrize(
    "fn,ref", [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min), ("prod", np.prod)]
)
@pytest.mark.parametrize("dim", [None, 0, -1, (0, 2), (1,)])
def test_functional_torch_style(fn, ref, dim, rng):
    x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32)
    y = getattr(opsnn.ops, fn)(opsnn.tensor(x), dim=dim)
    np.testing.assert_allclose(y.numpy(), ref(x.astype(np.float64), axis=dim), rtol=1e-5)
    yk = getattr(opsnn.ops, fn)(x, dim=dim, keepdim=True)
    assert yk.shape == ref(x, axis=dim, keepdims=True).shape
    assert getattr(opsnn.aclnn, fn).prepare(x, dim=dim).kernel_name == "reduce_numba"


@pytest.mark.parametrize("op", REDUCE_OPS + ["Var"])
def test_forced_reference_matches_kernel(op, rng):
    x = _data(op, (4, 6, 5), rng)
    rec = get_op(op, "opsnn" if op == "Var" else "")
    args = [x, np.array([0, 2], np.int64)]
    fast = opsnn.ops.prepare(rec, args, {})
    ref = opsnn.ops.prepare(rec, args, {}, algo="reference")
    assert fast.kernel_name == "reduce_numba" and ref.kernel_name == "reference"
    np.testing.assert_allclose(fast.run().numpy(), ref.run().numpy(), rtol=1e-5, atol=1e-6)


def test_reference_through_selector(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    with opsnn.kernel_selector(ReduceSum="reference"):
        assert opsnn.aclnn.sum.prepare(x, dim=1).kernel_name == "reference"
        y = opsnn.ops.sum(x, dim=1)
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64).sum(1), rtol=1e-6)
    assert opsnn.ops.sum(x, dim=1, algo="reference").shape == (5,)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_non_contiguous_inputs(op, rng, no_leak):
    a = _data(op, (6, 9), rng)
    t = opsnn.from_numpy(a.T)  # (9, 6) transposed view
    (y,) = run_op(op, [t, np.array([1])], {"keepdims": 0})
    np.testing.assert_allclose(y.numpy(), ORACLE[op](a.T.astype(np.float64), (1,), False), rtol=1e-5)
    b = opsnn.tensor(_data(op, (4, 5, 6), rng))
    v = b.transpose(0, 2)
    (y2,) = run_op(op, [v, np.array([0, 1])], {"keepdims": 1})
    np.testing.assert_allclose(y2.numpy(), ORACLE[op](v.numpy().astype(np.float64), (0, 1), True), rtol=1e-5)
    s = opsnn.tensor(_data(op, (8, 10), rng))[::2, 1::3]
    (y3,) = run_op(op, [s], {"keepdims": 0})
    np.testing.assert_allclose(y3.numpy(), ORACLE[op](s.numpy().astype(np.float64), None, False), rtol=1e-5)


EMPTY = {
    "ReduceSum": 0.0,
    "ReduceMean": np.nan,
    "ReduceMax": -np.inf,
    "ReduceMin": np.inf,
    "ReduceProd": 1.0,
    "ReduceL1": 0.0,
    "ReduceL2": 0.0,
    "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
    "ReduceSumSquare": 0.0,
}


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("algo", [None, "reference"])
def test_empty_reduction_follows_onnx(op, algo):
    x = np.zeros((2, 0, 4), np.float32)
    (y,) = run_op(op, [x, np.array([1])], {"keepdims": 1}, algo=algo)
    assert y.shape == (2, 1, 4)
    np.testing.assert_array_equal(y.numpy(), np.full((2, 1, 4), EMPTY[op], np.float32))
    (z,) = run_op(op, [x, np.array([0, 2])], {"keepdims": 0}, algo=algo)  # nothing to write
    assert z.shape == (0,)
    (w,) = run_op(op, [x], {"keepdims": 0}, algo=algo)  # everything: a 0-d result
    assert w.shape == () and np.array_equal(w.numpy(), np.float32(EMPTY[op]), equal_nan=True)


def test_empty_integer_and_bool_extremes():
    (a,) = run_op("ReduceMax", [np.zeros((0, 3), np.int32), np.array([0])], {"keepdims": 0})
    np.testing.assert_array_equal(a.numpy(), np.full(3, np.iinfo(np.int32).min))
    (b,) = run_op("ReduceMin", [np.zeros((0, 3), np.uint8), np.array([0])], {"keepdims": 0})
    np.testing.assert_array_equal(b.numpy(), np.full(3, 255))
    (c,) = run_op("ReduceMax", [np.zeros((2, 0), bool), np.array([1])], {"keepdims": 0})
    np.testing.assert_array_equal(c.numpy(), [False, False])
    (d,) = run_op("ReduceMin", [np.zeros((2, 0), bool), np.array([1])], {"keepdims": 0})
    np.testing.assert_array_equal(d.numpy(), [True, True])


@pytest.mark.parametrize("n", [5, 37, 4099, 70001])
def test_nan_and_inf_propagation(n, rng):
    x = rng.standard_normal((2, n)).astype(np.float32)
    x[0, n // 2] = np.nan
    x[1, n - 1] = np.inf
    t = opsnn.tensor(x)
    for fn in ("sum", "mean", "max", "min", "prod", "logsumexp"):
        y = getattr(opsnn.ops, fn)(t, dim=1).numpy()
        assert np.isnan(y[0]), fn
    assert opsnn.ops.max(t, dim=1).numpy()[1] == np.inf
    assert opsnn.ops.logsumexp(t, dim=1).numpy()[1] == np.inf
    assert opsnn.ops.sum(t, dim=1).numpy()[1] == np.inf
    assert opsnn.ops.min(t, dim=1).numpy()[1] == x[1].min()
    x2 = np.full((3, n), -np.inf, np.float32)
    assert np.all(opsnn.ops.logsumexp(x2, dim=1).numpy() == -np.inf)
    x3 = rng.standard_normal((n, 3)).astype(np.float32)
    x3[n // 3, 1] = np.nan
    m = opsnn.ops.max(x3, dim=0).numpy()
    assert np.isnan(m[1]) and np.isfinite(m[0]) and np.isfinite(m[2])
    assert np.isnan(opsnn.ops.var(x3, dim=0).numpy()[1])


def test_logsumexp_is_overflow_safe(rng):
    x = (rng.standard_normal((4, 9)) * 3 + 500).astype(np.float32)
    y = opsnn.ops.logsumexp(x, dim=1).numpy()
    w = x.astype(np.float64)
    m = w.max(1)
    np.testing.assert_allclose(y, m + np.log(np.exp(w - m[:, None]).sum(1)), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(
    "op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"]
)
def test_16bit_through_fp32_adapter(op, dtype, rng):
    x32 = _data(op, (5, 33, 3), rng)
    x = x32.astype(dtype)
    ex = opsnn.ops.prepare(get_op(op), [x, np.array([1])], {})
    if op == "ReduceSum" and dtype is ml_dtypes.bfloat16:  # a native kernel reads bfloat16 itself
        assert ex.kernel_name == "reduce_sum_numba_bf16" and not ex.adapter
    else:
        assert ex.kernel_name == "reduce_numba" and ex.adapter
    y = ex.run()
    assert y.dtype == np.dtype(dtype)
    want = ORACLE[op](x.astype(np.float64), (1,), True)
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8])
def test_integer_reductions(dtype, rng):
    x = rng.integers(0, 9, (4, 5, 6)).astype(dtype)
    ax = np.array([0, 2])
    w = x.astype(np.int64)
    for op, want in [
        ("ReduceSum", w.sum((0, 2))),
        ("ReduceMax", w.max((0, 2))),
        ("ReduceMin", w.min((0, 2))),
        ("ReduceSumSquare", (w * w).sum((0, 2))),
        ("ReduceL1", np.abs(w).sum((0, 2))),
        ("ReduceMean", np.trunc(w.mean((0, 2)))),
    ]:
        ex = opsnn.ops.prepare(get_op(op), [x, ax], {"keepdims": 0})
        assert ex.kernel_name == "reduce_numpy_int", op
        y = ex.run()
        assert y.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(y.numpy(), want.astype(dtype), err_msg=op)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("algo", [None, "reference"])
def test_empty_integer_reduction_without_an_integer_value_is_refused(op, algo):
    # NaN / -inf has no integer value: the kernel raised an OverflowError / ValueError (untyped) while the
    # reference cast it to int64 min (fuzz op_schema 53852); an empty output needs no value and runs
    with pytest.raises(ParamInvalidError, match=f"{op}: a reduction over no elements is"):
        run_op(op, [np.zeros((3, 0), np.int64), np.array([1])], {"keepdims": 0}, algo=algo)
    (y,) = run_op(op, [np.zeros((0, 3), np.int32), np.array([1])], {"keepdims": 0}, algo=algo)
    assert y.shape == (0,) and y.dtype == np.int32


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.int64])
def test_wide_integer_max_min_are_exact(dtype):
    # uint64 above 2**63 does not fit int64 (fuzz op_schema 31568: an OverflowError from the empty-value
    # initial; and the int64 cast turned 2**64 - 1 into -1)
    info = np.iinfo(dtype)
    x = np.array([[info.max, 5, info.max - 1], [info.max, info.max, info.min + 1], [0, 7, 3]], dtype)
    for algo in (None, "reference"):
        for op, want in [
            ("ReduceMin", [int(v) for v in (0, 5, info.min + 1)]),
            ("ReduceMax", [int(v) for v in (info.max, info.max, info.max - 1)]),
        ]:
            (y,) = run_op(op, [x, np.array([0])], {"keepdims": 0}, algo=algo)
            assert y.dtype == np.dtype(dtype)
            assert [int(v) for v in y.numpy()] == want, (op, algo)
        (e,) = run_op("ReduceMin", [np.zeros((0, 2), dtype), np.array([0])], {"keepdims": 0}, algo=algo)
        assert [int(v) for v in e.numpy()] == [int(info.max)] * 2


def test_bool_max_min():
    x = np.array([[True, False], [False, False], [True, True]])
    (a,) = run_op("ReduceMax", [x, np.array([1])], {"keepdims": 0})
    (b,) = run_op("ReduceMin", [x, np.array([1])], {"keepdims": 0})
    np.testing.assert_array_equal(a.numpy(), [True, False, True])
    np.testing.assert_array_equal(b.numpy(), [False, False, True])


def test_noop_with_empty_axes_runs_the_elementwise_part(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for op, want in [
        ("ReduceSum", x),
        ("ReduceSumSquare", x * x),
        ("ReduceL2", np.abs(x)),
        ("ReduceLogSumExp", x),
        ("ReduceMean", x),
    ]:
        for args in ([x], [x, np.zeros(0, np.int64)]):
            (y,) = run_op(op, args, {"noop_with_empty_axes": 1})
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=op)
    (z,) = run_op("ReduceSum", [x, np.zeros(0, np.int64)], {"keepdims": 0})  # empty axes: reduce all
    np.testing.assert_allclose(z.numpy(), x.astype(np.float64).sum(), rtol=1e-6)


def test_rank0_input(rng):
    x = np.array(2.5, np.float32)
    assert opsnn.ops.sum(x).numpy() == np.float32(2.5)
    (y,) = run_op("ReduceSumSquare", [x], {})
    assert y.shape == () and y.numpy() == np.float32(6.25)


@pytest.mark.parametrize(
    "shape,dim", [((4, 7), 1), ((4, 7), 0), ((3, 5, 6), (0, 2)), ((9,), None), ((2, 40000), 1), ((1, 1), 1)]
)
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_matches_numpy(shape, dim, correction, rng):
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float32)
    y = opsnn.ops.var(x, dim=dim, correction=correction)
    w = x.astype(np.float64)
    n = w.size if dim is None else math.prod(np.array(shape)[list(np.atleast_1d(dim))])
    with np.errstate(all="ignore"):
        want = ((w - w.mean(axis=dim, keepdims=True)) ** 2).sum(axis=dim) / max(n - correction, 0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert opsnn.aclnn.var.prepare(x, dim=dim).kernel_name == "reduce_numba"


def test_var_unbiased_flag_and_errors(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    np.testing.assert_allclose(opsnn.ops.var(x, 1, False).numpy(), x.astype(np.float64).var(1), rtol=1e-5)
    np.testing.assert_allclose(
        opsnn.ops.var(x, 1, keepdim=True).numpy(), x.astype(np.float64).var(1, ddof=1, keepdims=True), rtol=1e-5
    )
    with pytest.raises(ParamInvalidError):
        opsnn.ops.var(x, 1, True, correction=0)
    with pytest.raises(DTypeError):
        opsnn.ops.var(np.ones((2, 2), np.int32))
    assert get_op("Var", "opsnn").domain == "opsnn"


# -- ArgMax / ArgMin -----------------------------------------------------------------------------------
def _arg_oracle(x, axis, is_max, last, keep):
    fn = np.argmax if is_max else np.argmin
    r = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis) if last else fn(x, axis=axis)
    return np.expand_dims(r, axis) if keep else r


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(
    "shape,axis",
    [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 5), -2), ((4, 6000), 1), ((6000, 7), 0), ((3, 300, 50), 1)],
)
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_argreduce_matches_numpy(op, shape, axis, last, keepdims, rng):
    x = rng.integers(-4, 5, shape).astype(np.float32)  # many ties: first vs last index matters
    ex = opsnn.ops.prepare(get_op(op), [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last})
    assert ex.kernel_name == "argreduce_numba"
    y = ex.run()
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y.numpy(), _arg_oracle(x, axis % x.ndim, op == "ArgMax", last, keepdims))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_argreduce_nan_counts_as_extreme(op, last):
    x = np.array([[1.0, np.nan, 5.0, np.nan, 0.0], [1.0, 2.0, 3.0, 2.0, 1.0]] * 20, np.float32)
    for a, axis in ((x, 1), (np.ascontiguousarray(x.T), 0)):
        (y,) = run_op(op, [a], {"axis": axis, "keepdims": 0, "select_last_index": last})
        want = _arg_oracle(a, axis, op == "ArgMax", last, False)  # numpy: NaN is the extreme
        np.testing.assert_array_equal(y.numpy(), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.uint64, np.float64, np.float16, ml_dtypes.bfloat16])
def test_argreduce_dtypes(dtype, rng):
    x = rng.integers(0, 50, (5, 8)).astype(dtype)
    want_kernel = "argreduce_numpy_int" if np.dtype(dtype).kind in "iu" else "argreduce_numba"
    assert opsnn.aclnn.argmax.prepare(x, dim=1).kernel_name == want_kernel
    np.testing.assert_array_equal(opsnn.ops.argmax(x, dim=1).numpy(), np.argmax(x.astype(np.float64), 1))
    (last,) = run_op("ArgMin", [x], {"axis": 1, "keepdims": 0, "select_last_index": 1})
    np.testing.assert_array_equal(last.numpy(), _arg_oracle(x.astype(np.float64), 1, False, 1, False))
    np.testing.assert_array_equal(
        opsnn.ops.argmin(x, dim=0, keepdim=True).numpy(), np.argmin(x.astype(np.float64), 0)[None]
    )


def test_argmax_flattened_and_errors(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    assert opsnn.ops.argmax(x).numpy() == np.argmax(x)
    assert opsnn.ops.argmin(opsnn.tensor(x).transpose(0, 2)).numpy() == np.argmin(x.transpose(2, 1, 0))
    assert opsnn.ops.argmax(x, keepdim=True).shape == (1, 1, 1)
    with pytest.raises(ParamInvalidError, match="axis"):
        run_op("ArgMax", [x], {"axis": 3})
    with pytest.raises(ParamInvalidError, match="size 0"):
        run_op("ArgMin", [np.zeros((2, 0), np.float32)], {"axis": 1})
    (e,) = run_op("ArgMax", [np.zeros((0, 3), np.float32)], {"axis": 1, "keepdims": 0})
    assert e.shape == (0,)
    with pytest.raises(ParamInvalidError):
        opsnn.ops.argmax(x, dim=(0, 1))
    ref = opsnn.ops.argmax(x, dim=1, algo="reference").numpy()
    np.testing.assert_array_equal(ref, opsnn.ops.argmax(x, dim=1).numpy())


# -- CumSum ---------------------------------------------------------------------------------------------
def _cumsum_oracle(x, axis, exclusive, reverse):
    w = np.moveaxis(x.astype(np.float64 if x.dtype.kind == "f" else np.int64), axis, -1)
    out = np.zeros_like(w)
    n = w.shape[-1]
    for i in range(n):
        idx = range(i, n) if reverse else range(i + 1)
        idx = [j for j in idx if not (exclusive and j == i)]
        out[..., i] = w[..., idx].sum(-1)
    return np.moveaxis(out, -1, axis).astype(x.dtype)


@pytest.mark.parametrize("shape,axis", [((5,), 0), ((3, 4), 1), ((3, 4), -2), ((2, 3, 7), 1)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_cumsum_matches_oracle(shape, axis, exclusive, reverse, dtype, rng):
    x = rng.integers(-5, 6, shape).astype(dtype)
    ex = opsnn.aclnn.cumsum.prepare(x, axis, exclusive=bool(exclusive), reverse=bool(reverse))
    assert ex.kernel_name == "cumsum_numpy"
    np.testing.assert_allclose(ex.run().numpy(), _cumsum_oracle(x, axis, exclusive, reverse), rtol=1e-6)
    (r,) = run_op(
        "CumSum", [x, np.array([axis], np.int32)], {"exclusive": exclusive, "reverse": reverse}, algo="reference"
    )
    np.testing.assert_allclose(r.numpy(), _cumsum_oracle(x, axis, exclusive, reverse), rtol=1e-6)


@pytest.mark.parametrize("op", ["CumSum", "ReduceSum", "ReduceMax", "ReduceProd"])
def test_bfloat16_references_accumulate_in_float64(op, rng):
    """The references read bfloat16 as floats (its numpy kind is "V": they truncated it to int64; found
    by tests/fuzz); the kernel (fp32 adapter) and the reference agree with a float64 oracle."""
    x = (rng.standard_normal((4, 3)) * 2).astype(ml_dtypes.bfloat16)
    axis = np.array([0], np.int64)
    w = x.astype(np.float64)
    want = {
        "CumSum": np.cumsum(w, 0),
        "ReduceSum": w.sum(0, keepdims=True),
        "ReduceMax": w.max(0, keepdims=True),
        "ReduceProd": w.prod(0, keepdims=True),
    }[op]
    for algo in (None, "reference"):
        got = run_op(op, [x, axis], algo=algo)[0].numpy().astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_cumsum_edge_cases(rng):
    x = np.array([1.0, np.inf, 2.0], np.float32)
    np.testing.assert_array_equal(opsnn.ops.cumsum(x, 0, exclusive=True).numpy(), [0.0, 1.0, np.inf])
    assert opsnn.ops.cumsum(np.zeros((0, 3), np.float32), 1).shape == (0, 3)
    h = rng.standard_normal((4, 6)).astype(np.float16)
    np.testing.assert_allclose(
        opsnn.ops.cumsum(h, 1).numpy().astype(np.float64), np.cumsum(h.astype(np.float64), 1), rtol=1e-2, atol=1e-2
    )
    with pytest.raises(ParamInvalidError, match="out of range"):
        opsnn.ops.cumsum(x, 1)
    with pytest.raises(ParamInvalidError):
        run_op("CumSum", [x, np.array([0, 0])], {})
    with pytest.raises(ParamInvalidError):
        opsnn.ops.cumsum(x, 0.5)


# -- errors --------------------------------------------------------------------------------------------
def test_bad_axes_raise_typed_errors(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(ParamInvalidError, match="out of range") as e:
        opsnn.ops.sum(x, dim=2)
    assert e.value.code == 161002 and "ReduceSum" in str(e.value)
    with pytest.raises(ParamInvalidError, match="out of range"):
        run_op("ReduceMax", [x, np.array([-3])], {})
    with pytest.raises(ParamInvalidError, match="more than once"):
        opsnn.ops.mean(x, dim=(1, -1))
    with pytest.raises(DTypeError):
        run_op("ReduceSum", [x, np.array([0.0])], {})
    with pytest.raises(ParamInvalidError):
        run_op("ReduceSum", [x, np.array([[0]])], {})
    with pytest.raises(ParamInvalidError, match="did you mean"):
        run_op("ReduceSum", [x], {"keepdim": 1})
    with pytest.raises(ParamInvalidError):
        opsnn.ops.sum(x, dim=(0, "a"))
    with pytest.raises(DTypeError):
        opsnn.ops.sum(np.array(["a", "b"]))


def test_axes_needs_a_value_at_prepare_time():
    from opsnn.ops.registry import InferContext, TensorMeta

    rec = get_op("ReduceSum")
    ctx = InferContext(
        rec,
        [TensorMeta((2, 3), np.dtype(np.float32)), TensorMeta((1,), np.dtype(np.int64))],
        rec.bind_attrs({}),
        [None, None],
        1,
    )
    with pytest.raises(InferShapeError, match="prepare time"):
        rec.run_infer(ctx)


def test_two_phase_workspace_and_rerun(rng, no_leak):
    x = rng.standard_normal((6, 5, 7)).astype(np.float32)
    t = opsnn.tensor(x)
    ex = opsnn.aclnn.sum.prepare(t, dim=(0, 2))
    assert ex.workspace_size >= x.nbytes  # permuted copy lives in the workspace
    ws = opsnn.empty((ex.workspace_size,), "uint8")
    np.testing.assert_allclose(ex.run(ws).numpy(), x.astype(np.float64).sum((0, 2)), rtol=1e-5)
    t.copy_(opsnn.tensor(x * 2))
    np.testing.assert_allclose(ex.run(ws).numpy(), 2 * x.astype(np.float64).sum((0, 2)), rtol=1e-5)
    with pytest.raises(ParamInvalidError):
        ex.run(opsnn.empty((8,), "uint8"))
    del ex, ws, t


def test_matches_onnx_reference_evaluator(rng):
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    for op in ("ReduceSum", "ReduceMax", "ReduceL1", "ReduceLogSumExp"):
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
        g = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("axes", TensorProto.INT64, None),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        axes = np.array([2, 0], np.int64)
        want = ReferenceEvaluator(m).run(None, {"x": x, "axes": axes})[0]
        (y,) = run_op(op, [x, axes], {"keepdims": 0})
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=op)


# -- property tests: shape inference ---------------------------------------------------------------------
@st.composite
def _shape_and_axes(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=5)))
    r = len(shape)
    axes = draw(
        st.none() | st.lists(st.integers(-r, r - 1), unique_by=lambda a: a % r if r else a, max_size=r)
        if r
        else st.none()
    )
    return shape, axes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _shape_and_axes(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["ReduceSum", "ReduceMax", "ReduceLogSumExp", "ReduceMean"]),
)
def test_reduce_shape_inference_property(sa, keepdims, noop, op):
    shape, axes = sa
    x = np.zeros(shape, np.float32)
    args = [x] if axes is None else [x, np.asarray(axes, np.int64)]
    ex = opsnn.ops.prepare(get_op(op), args, {"keepdims": int(keepdims), "noop_with_empty_axes": int(noop)})
    if not axes and noop:
        want = shape
    else:
        np_axes = None if not axes else tuple(axes)
        want = np.sum(x, axis=np_axes, keepdims=keepdims).shape
    assert tuple(ex.output_metas[0].shape) == tuple(want)
    assert ex.output_metas[0].dtype == np.float32


@settings(max_examples=60, deadline=None)
@given(_shape_and_axes(), st.booleans())
def test_reduce_numeric_property(sa, keepdims):
    shape, axes = sa
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape) % 7 - 3
    args = [x] if axes is None else [x, np.asarray(axes, np.int64)]
    np_axes = None if not axes else tuple(axes)
    (s,) = run_op("ReduceSum", args, {"keepdims": int(keepdims)})
    np.testing.assert_allclose(s.numpy(), np.sum(x.astype(np.float64), axis=np_axes, keepdims=keepdims))
    (m,) = run_op("ReduceMax", args, {"keepdims": int(keepdims)})
    np.testing.assert_array_equal(m.numpy(), np.max(x, axis=np_axes, keepdims=keepdims, initial=-np.inf))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data(), st.booleans())
def test_argmax_shape_property(shape, data, keepdims):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ex = opsnn.ops.prepare(get_op("ArgMax"), [np.zeros(shape, np.float32)], {"axis": axis, "keepdims": int(keepdims)})
    want = np.argmax(np.zeros(shape), axis=axis)
    want_shape = np.expand_dims(want, axis).shape if keepdims else np.shape(want)
    assert tuple(ex.output_metas[0].shape) == tuple(want_shape)
