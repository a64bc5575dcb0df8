"""MatMul, Gemm, Linear, Einsum, MatMulInteger, QLinearMatMul against numpy float64
formulas, the ops' references, onnx.reference and onnxruntime."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError
from opsnn.kernels.cpu import libraries as KL

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ort = pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-5, 1e-5  # fp32 BLAS vs float64 oracle on O(1) data with K <= 64

_ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int32): TensorProto.INT32,
}


def onnx_model(op, inputs, attrs, out_dtype, opset):
    names = [f"i{j}" if v is not None else "" for j, v in enumerate(inputs)]
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(nm, _ONNX_TYPES[v.dtype], v.shape)
            for nm, v in zip(names, inputs)
            if v is not None
        ],
        [helper.make_tensor_value_info("y", _ONNX_TYPES[np.dtype(out_dtype)], None)],
    )
    feed = {nm: v for nm, v in zip(names, inputs) if v is not None}
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), feed


def run_ort(op, inputs, attrs=None, out_dtype=None, opset=21):
    model, feed = onnx_model(op, inputs, attrs or {}, out_dtype or inputs[0].dtype, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


def run_onnx_ref(op, inputs, attrs=None, out_dtype=None, opset=21):
    model, feed = onnx_model(op, inputs, attrs or {}, out_dtype or inputs[0].dtype, opset)
    return ReferenceEvaluator(model).run(None, feed)[0]


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# -- MatMul -------------------------------------------------------------------------------------------
MM_SHAPES = [
    ((3, 4), (4, 5)),
    ((1, 1), (1, 1)),
    ((7,), (7,)),
    ((7,), (7, 3)),
    ((2, 7), (7,)),
    ((2, 3, 4), (4, 5)),  # folded into one GEMM
    ((4,), (2, 4, 3)),
    ((2, 1, 3, 5), (4, 5, 2)),
    ((3, 1, 3, 4), (1, 2, 4, 2)),
    ((2, 3, 5, 4), (2, 3, 4, 6)),
    ((1, 2, 4, 3), (3,)),
    ((5, 33, 17), (5, 17, 9)),
    ((0, 3), (3, 4)),
    ((3, 0), (0, 4)),
    ((0, 2, 3), (3, 4)),
    ((2, 3), (3, 0)),  # empty
]


@pytest.mark.parametrize("sa,sb", MM_SHAPES)
def test_matmul_shapes(rng, sa, sb):
    a, b = rand(rng, sa), rand(rng, sb)
    ex = opsnn.aclnn.matmul.prepare(a, b)
    assert ex.kernel_name == "matmul_blas"
    y = ex.run().numpy()
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert y.shape == want.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(opsnn.ops.matmul(a, b, algo="reference").numpy(), want, rtol=RTOL, atol=ATOL)


def test_matmul_fold_plan_and_onnxruntime(rng):
    a, b = rand(rng, (2, 3, 4, 8)), rand(rng, (8, 5))
    ex = opsnn.aclnn.matmul.prepare(a, b)
    assert ex.plan.fold
    np.testing.assert_allclose(ex.run().numpy(), run_ort("MatMul", [a, b]), rtol=RTOL, atol=ATOL)
    a2, b2 = rand(rng, (3, 1, 3, 4), np.float64), rand(rng, (1, 2, 4, 2), np.float64)
    np.testing.assert_allclose(opsnn.ops.matmul(a2, b2).numpy(), run_ort("MatMul", [a2, b2]), rtol=1e-12)


def test_matmul_non_contiguous(rng, no_leak):
    a = rand(rng, (6, 5)).T  # (5, 6), Fortran order
    b = rand(rng, (2, 4, 6))[:, ::2, :].transpose(0, 2, 1)  # (2, 6, 2), strided
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(
        opsnn.ops.matmul(opsnn.from_numpy(a), opsnn.from_numpy(b)).numpy(), want, rtol=RTOL, atol=ATOL
    )
    t = opsnn.tensor(rand(rng, (3, 4, 5)))
    tt = t.transpose(1, 2)  # (3, 5, 4) view
    w = rand(rng, (4, 2))
    np.testing.assert_allclose((tt @ opsnn.tensor(w)).numpy(), np.matmul(tt.numpy(), w), rtol=RTOL, atol=ATOL)


def test_matmul_nan_inf(rng):
    a, b = rand(rng, (3, 4)), rand(rng, (4, 2))
    a[1, 2] = np.nan
    b[0, 1] = np.inf
    y = opsnn.ops.matmul(a, b).numpy()
    want = np.matmul(a, b)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(y[1]).all()


@pytest.mark.parametrize(
    "dtype,rows,kernel,adapter",
    [
        (np.float16, 5, "matmul_tiled_lowp", False),  # few fp16 rows: the tiled kernel reads fp16 directly
        (np.float16, 40, "matmul_blas", True),  # more rows: BLAS on fp32 copies
        (ml_dtypes.bfloat16, 5, "matmul_blas", True),
    ],
)
def test_matmul_16bit(rng, dtype, rows, kernel, adapter):
    a, b = rand(rng, (2, rows, 16)).astype(dtype), rand(rng, (16, 3)).astype(dtype)
    ex = opsnn.aclnn.matmul.prepare(a, b)
    if dtype == ml_dtypes.bfloat16 and KL.runtime_bf16_product() is None:  # native bf16: oneDNN reads bf16
        kernel, adapter = "matmul_onednn_runtime", False
    assert ex.kernel_name == kernel and ex.adapter == adapter
    y = ex.run().numpy()
    assert y.dtype == np.dtype(dtype)
    want = np.matmul(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_matmul_integers(rng, dtype):
    a = rng.integers(0, 50, (2, 3, 4)).astype(dtype)
    b = rng.integers(0, 50, (4, 5)).astype(dtype)
    ex = opsnn.aclnn.matmul.prepare(a, b)
    assert ex.kernel_name == "matmul_numpy_int"
    y = ex.run().numpy()
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, np.einsum("bmk,kn->bmn", a.astype(np.int64), b.astype(np.int64)))


def test_matmul_errors(rng):
    with pytest.raises(InferShapeError, match="K=4.*K=5"):
        opsnn.ops.matmul(rand(rng, (3, 4)), rand(rng, (5, 2)))
    with pytest.raises(InferShapeError, match=r"batch dims.*\(2,\).*\(3,\)"):
        opsnn.ops.matmul(rand(rng, (2, 3, 4)), rand(rng, (3, 4, 2)))
    with pytest.raises(InferShapeError, match="at least 1-D"):
        opsnn.ops.matmul(np.float32(2.0) * np.ones((), np.float32), rand(rng, (3,)))
    with pytest.raises(DTypeError, match="same dtype"):
        opsnn.ops.matmul(rand(rng, (3, 4)), rand(rng, (4, 2), np.float64))
    with pytest.raises(DTypeError):
        opsnn.ops.matmul(np.ones((2, 2), bool), np.ones((2, 2), bool))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=0, max_size=3),
    st.lists(st.integers(1, 3), min_size=0, max_size=3),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.booleans(),
    st.booleans(),
)
def test_matmul_broadcast_property(ba, bb, m, k, n, vec_a, vec_b):
    # make the batch dims broadcast-compatible: where they differ, one of them becomes 1
    width = min(len(ba), len(bb))
    for i in range(1, width + 1):
        if ba[-i] != bb[-i]:
            bb[-i] = 1
    sa = (k,) if vec_a else tuple(ba) + (m, k)
    sb = (k,) if vec_b else tuple(bb) + (k, n)
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    a, b = rand(rng, sa, np.float64), rand(rng, sb, np.float64)
    want = np.matmul(a, b)
    got = opsnn.ops.matmul(a, b).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# -- Gemm --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm(rng, ta, tb, c_shape):
    a = rand(rng, (4, 3) if ta else (3, 4))
    b = rand(rng, (5, 4) if tb else (4, 5))
    c = None if c_shape is None else rand(rng, c_shape)
    alpha, beta = 0.75, -1.5
    ex = opsnn.aclnn.gemm.prepare(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb)
    assert ex.kernel_name == "gemm_blas"
    y = ex.run().numpy()
    a64 = a.astype(np.float64).T if ta else a.astype(np.float64)
    b64 = b.astype(np.float64).T if tb else b.astype(np.float64)
    want = alpha * a64 @ b64 + (0 if c is None else beta * c.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    attrs = {"alpha": alpha, "beta": beta, "transA": int(ta), "transB": int(tb)}
    np.testing.assert_allclose(y, run_ort("Gemm", [a, b, c], attrs, opset=13), rtol=RTOL, atol=ATOL)


def test_a_cold_one_row_gemm_stands_in_with_blas_where_onednn_matmul_is_off(rng, tmp_path, monkeypatch):
    """Tiering: while gemm_vector compiles, oneDNN's matmul stands in, and where that is off (AVX2
    CPUs) BLAS does, instead of compiling in the foreground."""
    from opsnn.ops import tiering
    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta, get_op

    monkeypatch.setenv("OPSNN_KERNEL_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("OPSNN_TIERED", "1")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    rec = get_op("Gemm")
    onednn = next(k for k in rec.kernels if k.name == "gemm_onednn")
    monkeypatch.setattr(onednn, "applies", lambda ctx: "oneDNN's matmul is off on this CPU")
    a, b, c = rand(rng, (1, 64)), rand(rng, (10, 64)), rand(rng, (10,))
    a[0, 3] = np.nan
    try:
        planned = plan_op(rec, [TensorMeta(t.shape, t.dtype) for t in (a, b, c)], [None, b, None], {"transB": 1})
    finally:
        tiering._background.stop()
    sel = planned.selection
    assert (sel.kernel.name, sel.tiered) == ("gemm_blas", "gemm_vector"), sel.reason
    out = np.empty((1, 10), np.float32)
    sel.kernel.fn([a, b, c], [out], planned.ctx.attrs, planned.plan, None)
    want = a.astype(np.float64) @ b.T.astype(np.float64) + c
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("k,n", [(40, 24), (2048, 1000), (1, 3), (37, 129)])
@pytest.mark.parametrize("c_kind,beta", [(None, 1.0), ("n", 1.0), ("1n", -0.5), ("n", 0.0)])
def test_gemm_vector_runs_one_row_products_with_a_constant_b(rng, tb, k, n, c_kind, beta):
    """gemm_vector (a classifier head: one row, B a graph constant, its rows streamed by gemm_rows)
    against the float64 formula; more rows, a variable B or alpha != 1 go to the other kernels."""
    from opsnn.ops.executor import plan_op
    from opsnn.ops.registry import TensorMeta, get_op

    a = rand(rng, (1, k))
    b = rand(rng, (n, k) if tb else (k, n))
    c = None if c_kind is None else rand(rng, (n,) if c_kind == "n" else (1, n))
    ins = [a, b] + ([] if c is None else [c])
    rec, attrs = get_op("Gemm"), {"transB": tb, "beta": beta}
    metas = [TensorMeta(t.shape, t.dtype) for t in ins]
    planned = plan_op(rec, metas, [None, b] + [None] * (len(ins) - 2), attrs)
    kern = planned.selection.kernel
    assert kern.name == "gemm_vector", planned.selection.reason
    out = np.full((1, n), np.nan, np.float32)
    kern.fn(ins, [out], planned.ctx.attrs, planned.plan, None)
    want = a.astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    if c is not None:
        want = want + beta * c.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-6 * np.sqrt(k) * max(1.0, np.abs(want).max()))
    for metas2, values, bad, why in (
        ([TensorMeta((2, k), a.dtype)] + metas[1:], [None, b] + [None] * (len(ins) - 2), attrs, "2 rows"),
        (metas, [None] * len(ins), attrs, "not a constant"),
        (metas, [None, b] + [None] * (len(ins) - 2), dict(attrs, alpha=2.0), "alpha=1 only"),
    ):
        p2 = plan_op(rec, metas2, values, bad)
        assert p2.selection.kernel.name != "gemm_vector" and why in str(kern.check(p2.ctx))


def test_gemm_scalar_c_non_contiguous_and_16bit(rng):
    a = rand(rng, (4, 3)).T  # (3, 4) view
    b = rand(rng, (4, 5))
    y = opsnn.ops.gemm(opsnn.from_numpy(a), b, 2.0, beta=0.5).numpy()
    np.testing.assert_allclose(y, a.astype(np.float64) @ b + 1.0, rtol=RTOL, atol=ATOL)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    y16 = opsnn.ops.gemm(a16, b16, alpha=2.0).numpy()
    assert y16.dtype == np.float16
    want = 2.0 * a16.astype(np.float32) @ b16.astype(np.float32)
    np.testing.assert_allclose(y16.astype(np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    y0 = opsnn.ops.gemm(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), np.ones(3, np.float32))
    np.testing.assert_array_equal(y0.numpy(), np.ones((2, 3)))


def test_gemm_errors(rng):
    with pytest.raises(InferShapeError, match="op\\(A\\) is \\(3, 4\\).*op\\(B\\) is \\(5, 2\\)"):
        opsnn.ops.gemm(rand(rng, (3, 4)), rand(rng, (5, 2)))
    with pytest.raises(InferShapeError, match="2-D"):
        opsnn.ops.gemm(rand(rng, (2, 3, 4)), rand(rng, (4, 2)))
    with pytest.raises(InferShapeError, match="broadcastable"):
        opsnn.ops.gemm(rand(rng, (3, 4)), rand(rng, (4, 2)), rand(rng, (4, 2)))
    with pytest.raises(InferShapeError, match="broadcastable"):
        opsnn.ops.gemm(rand(rng, (3, 4)), rand(rng, (4, 2)), rand(rng, (1, 3, 2)))
    with pytest.raises(ParamInvalidError, match="unknown attribute .transa."):
        opsnn.ops.run_op("Gemm", [rand(rng, (3, 4)), rand(rng, (4, 2))], {"transa": 1})


# -- Linear ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("xs", [(5,), (3, 5), (2, 3, 5), (2, 1, 3, 5), (0, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear(rng, xs, bias):
    x, w = rand(rng, xs), rand(rng, (4, 5))
    b = rand(rng, (4,)) if bias else None
    ex = opsnn.aclnn.linear.prepare(x, w, b)
    assert ex.kernel_name == "linear_blas"
    y = ex.run().numpy()
    want = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b)
    assert y.shape == xs[:-1] + (4,)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(opsnn.ops.linear(x, w, b, algo="reference").numpy(), want, rtol=RTOL, atol=ATOL)


def test_linear_non_contiguous_16bit_and_errors(rng):
    x = rand(rng, (5, 3, 2)).transpose(2, 1, 0)  # (2, 3, 5) view
    w = rand(rng, (5, 4)).T  # (4, 5) view
    y = opsnn.ops.linear(opsnn.from_numpy(x), opsnn.from_numpy(w)).numpy()
    np.testing.assert_allclose(y, x.astype(np.float64) @ w.T, rtol=RTOL, atol=ATOL)
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    yb = opsnn.ops.linear(xb, wb).numpy()
    want = xb.astype(np.float32) @ wb.astype(np.float32).T
    assert yb.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(yb.astype(np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    assert opsnn.ops.get_op("Linear", "opsnn").domain == "opsnn"
    with pytest.raises(InferShapeError, match="last dim is 6.*in_features=5"):
        opsnn.ops.linear(rand(rng, (2, 6)), rand(rng, (4, 5)))
    with pytest.raises(InferShapeError, match="bias must have shape \\(4,\\)"):
        opsnn.ops.linear(rand(rng, (2, 5)), rand(rng, (4, 5)), rand(rng, (5,)))
    with pytest.raises(InferShapeError, match="2-D"):
        opsnn.ops.linear(rand(rng, (2, 5)), rand(rng, (5,)))


# -- Einsum ---------------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij, bjk -> bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),  # implicit: trace
    ("ij", [(3, 4)]),  # implicit: identity
    ("ji", [(3, 4)]),  # implicit: transpose (output is alphabetical)
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # broadcast ellipsis
    ("...ii->...i", [(3, 5, 5)]),
    ("b...,b->...", [(2, 3, 4), (2,)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),  # three operands: optimizer picks the order
    ("->", [()]),
]


@pytest.mark.parametrize("eq,shapes", EINSUM_CASES)
def test_einsum(rng, eq, shapes):
    ops = [rand(rng, s) for s in shapes]
    ex = opsnn.aclnn.einsum.prepare(eq, *ops)
    # two operands whose labels group as batch, M, N, K run as one batched GEMM
    gemm = eq in ("ij,jk->ik", "bij, bjk -> bik", "i,i", "i,j->ij")
    assert ex.kernel_name == ("einsum_batch_gemm" if gemm else "einsum_numpy_opt"), ex.rejected
    y = ex.run().numpy()
    want = np.einsum(eq.replace(" ", ""), *[o.astype(np.float64) for o in ops])
    assert y.shape == np.shape(want)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
    if eq not in ("->", "...ij,...jk->...ik"):  # ort: no 0-d einsum, no ellipses of different ranks
        np.testing.assert_allclose(y, run_ort("Einsum", ops, {"equation": eq}, opset=12), rtol=RTOL, atol=ATOL)


def test_einsum_dtypes_and_views(rng):
    a = rand(rng, (4, 3)).T
    b = rand(rng, (4, 2))
    np.testing.assert_allclose(opsnn.ops.einsum("ij,jk->ik", opsnn.from_numpy(a), b).numpy(), a @ b, rtol=RTOL)
    ai = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    yi = opsnn.ops.einsum("ij->i", ai)
    assert yi.dtype == np.int32
    np.testing.assert_array_equal(yi.numpy(), ai.sum(1))
    ab = rand(rng, (3, 4)).astype(ml_dtypes.bfloat16)
    yb = opsnn.ops.einsum("ij->i", ab).numpy()
    want = ab.astype(np.float32).sum(1)
    np.testing.assert_allclose(yb.astype(np.float32), want, rtol=1e-2, atol=2e-2)


def test_einsum_errors(rng):
    with pytest.raises(InferShapeError, match="label 'j'.*4.*5"):
        opsnn.ops.einsum("ij,jk->ik", rand(rng, (3, 4)), rand(rng, (5, 2)))
    with pytest.raises(InferShapeError, match="2 operand terms but 1"):
        opsnn.ops.einsum("ij,jk->ik", rand(rng, (3, 4)))
    with pytest.raises(InferShapeError, match="names 2 dims.*\\(3, 4, 5\\)"):
        opsnn.ops.einsum("ij->i", rand(rng, (3, 4, 5)))
    with pytest.raises(InferShapeError, match="appears in no input"):
        opsnn.ops.einsum("ij->k", rand(rng, (3, 4)))
    with pytest.raises(InferShapeError, match="no '...'"):
        opsnn.ops.einsum("...ij->ij", rand(rng, (2, 3, 4)))
    with pytest.raises(InferShapeError, match="repeats"):
        opsnn.ops.einsum("ij->ii", rand(rng, (3, 3)))
    with pytest.raises(DTypeError, match="same dtype"):
        opsnn.ops.einsum("i,i", rand(rng, (3,)), rand(rng, (3,), np.float64))


# -- quantized matmuls --------------------------------------------------------------------------------
@pytest.mark.parametrize("dta,dtb", [(np.uint8, np.uint8), (np.int8, np.uint8), (np.uint8, np.int8)])
def test_matmul_integer(rng, dta, dtb):
    ia, ib = np.iinfo(dta), np.iinfo(dtb)
    a = rng.integers(ia.min, ia.max + 1, (2, 4, 6)).astype(dta)
    b = rng.integers(ib.min, ib.max + 1, (6, 3)).astype(dtb)
    a_zp = rng.integers(ia.min, ia.max + 1, (4,)).astype(dta)  # per row
    b_zp = rng.integers(ib.min, ib.max + 1, (3,)).astype(dtb)  # per column
    ex = opsnn.aclnn.matmul_integer.prepare(a, b, a_zp, b_zp)
    assert ex.kernel_name == "matmul_integer_blas" and ex.plan.exact_f64
    y = ex.run().numpy()
    assert y.dtype == np.int32
    want = (a.astype(np.int64) - a_zp.astype(np.int64)[:, None]) @ (b.astype(np.int64) - b_zp.astype(np.int64))
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(opsnn.ops.matmul_integer(a, b, a_zp, b_zp, algo="reference").numpy(), want)
    # scalar zero points, compared with onnx.reference
    za, zb = np.array(3, dta), np.array(1, dtb)
    np.testing.assert_array_equal(
        opsnn.ops.matmul_integer(a[0], b, za, zb).numpy(),
        run_onnx_ref("MatMulInteger", [a[0], b, za, zb], out_dtype=np.int32, opset=10),
    )
    np.testing.assert_array_equal(opsnn.ops.matmul_integer(a[0], b).numpy(), a[0].astype(np.int64) @ b.astype(np.int64))


def test_matmul_integer_errors(rng):
    a, b = np.ones((4, 6), np.uint8), np.ones((6, 3), np.uint8)
    with pytest.raises(InferShapeError, match="a_zero_point"):
        opsnn.ops.matmul_integer(a, b, np.ones((3,), np.uint8))
    with pytest.raises(DTypeError, match="b_zero_point"):
        opsnn.ops.matmul_integer(a, b, None, np.ones((), np.int8))
    with pytest.raises(DTypeError):
        opsnn.ops.matmul_integer(a.astype(np.int32), b)


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
@pytest.mark.parametrize("st_", [np.float32, np.float16])
def test_qlinear_matmul(rng, qt, st_):
    info = np.iinfo(qt)
    a = rng.integers(info.min, info.max + 1, (2, 3, 8)).astype(qt)
    b = rng.integers(info.min, info.max + 1, (8, 4)).astype(qt)
    a_s, b_s, y_s = np.array([0.05], st_), np.array([0.02], st_), np.array([0.3], st_)
    a_zp, b_zp, y_zp = np.array([3], qt), np.array([-2 if qt == np.int8 else 130], qt), np.array([5], qt)
    ins = [a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp]
    ex = opsnn.aclnn.qlinear_matmul.prepare(*ins)
    assert ex.kernel_name == "qlinear_matmul_blas"
    y = ex.run().numpy()
    assert y.dtype == np.dtype(qt)
    np.testing.assert_array_equal(y, run_onnx_ref("QLinearMatMul", ins, out_dtype=qt, opset=21))
    np.testing.assert_array_equal(y, opsnn.ops.qlinear_matmul(*ins, algo="reference").numpy())
    if st_ == np.float32:
        want_ort = run_ort("QLinearMatMul", ins, out_dtype=qt, opset=21)
        assert np.abs(y.astype(int) - want_ort.astype(int)).max() <= 1  # ort requantizes in float32


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
def test_qlinear_matmul_saturates(qt):
    info = np.iinfo(qt)
    a = np.full((2, 16), info.max, qt)
    a[1] = info.min
    b = np.full((16, 3), info.max, qt)
    s, z = np.array(1.0, np.float32), np.array(0, qt)
    y = opsnn.ops.qlinear_matmul(a, s, z, b, s, z, np.array(0.5, np.float32), z).numpy()
    np.testing.assert_array_equal(y[0], info.max)
    np.testing.assert_array_equal(y[1], info.min)


def test_qlinear_matmul_vector_dot_vector(rng):
    """1-D @ 1-D: a 0-d result (found by tests/fuzz: the requantization wrote into a numpy scalar)."""
    a, b = rng.integers(-128, 128, (7,)).astype(np.int8), rng.integers(-128, 128, (7,)).astype(np.int8)
    s, z = np.array(0.1, np.float32), np.array(1, np.int8)
    ins = [a, s, z, b, s, z, np.array(0.7, np.float32), np.array(3, np.uint8)]
    y = opsnn.ops.qlinear_matmul(*ins).numpy()
    assert y.shape == () and y.dtype == np.uint8
    np.testing.assert_array_equal(y, run_onnx_ref("QLinearMatMul", ins, out_dtype=np.uint8, opset=21))


def test_two_phase_reuse_and_out(rng, no_leak):
    a = opsnn.tensor(rand(rng, (3, 4)))
    b = opsnn.tensor(rand(rng, (4, 2)))
    out = opsnn.empty((3, 2), "float32")
    ex = opsnn.aclnn.matmul.prepare(a, b, out=out)
    assert ex.workspace_size == 0
    assert ex.run() is out
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=RTOL)
    a.copy_(rand(rng, (3, 4)))
    ex.run()
    np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=RTOL)
    del ex, out
