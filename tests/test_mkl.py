"""Intel MKL packed GEMM kernels (matmul_mkl_packed, linear_mkl_packed) against a float64 numpy
oracle; selection with and without a constant weight, with MKL disabled; batched GEMMs for
attention. Tolerance: fp32 GEMM vs float64, 1e-5 of the output's largest magnitude per sqrt(K)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import opsnn
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import mkl as KM
from opsnn.ops.autotune import NotPreferred
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

needs_mkl = pytest.mark.skipif(KM.unavailable() is not None, reason=f"MKL: {KM.unavailable()}")


@pytest.fixture
def gemm_on(monkeypatch):
    """``gemm_on("mkl" | "openblas")``: the library :func:`KL.gemm_library` answers for the test."""

    def use(name):
        monkeypatch.setattr(KL, "_library", name)

    return use


def _run(op, name, arrays, constant, domain=""):
    rec = get_op(op, domain)
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    values = [a if i in constant else None for i, a in enumerate(arrays)]
    planned = plan_op(rec, metas, values, {})
    k = next(k for k in rec.kernels if k.name == name)
    why = k.check(planned.ctx)
    assert why is None or isinstance(why, NotPreferred), why  # NotPreferred: runs, not chosen by default
    plan = k.plan(planned.ctx)
    out = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    k.fn(arrays, [out], planned.ctx.attrs, plan, None)
    return out, planned.selection.kernel.name


def _close(y, want, k):
    assert y.shape == want.shape
    tol = 1e-6 * max(k, 1) ** 0.5 * max(np.abs(want).max(initial=0.0), 1.0)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=0, atol=tol)


@needs_mkl
@pytest.mark.parametrize(
    "xshape,n", [((13,), 7), ((1, 13), 1), ((7, 13), 10), ((2, 3, 64), 33), ((130, 257), 96), ((0, 13), 5), ((4, 1), 3)]
)
def test_mkl_packed_matmul_matches_oracle(rng, xshape, n):
    k = xshape[-1]
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    y, chosen = _run("MatMul", "matmul_mkl_packed", [x, w], {1})
    rows = int(np.prod(xshape[:-1]))
    # one row (a matrix-vector product), or a product the ISA level's packed limits send to OpenBLAS:
    # correct, but BLAS is chosen (NotPreferred)
    to_blas = rows == 1 or (rows > 0 and KL.packed_panel_rejection(rows, k, n) is not None)
    own = len(xshape) > 1 and rows > 0 and KL.own_packed_rejection(rows, np.float32) is None  # AVX2, OpenBLAS
    assert chosen == ("matmul_packed" if to_blas and own else "matmul_blas" if to_blas else "matmul_mkl_packed")
    _close(y, x.astype(np.float64) @ w.astype(np.float64), k)


@needs_mkl
@pytest.mark.parametrize(
    "xshape,n,bias", [((7, 13), 10, True), ((2, 3, 64), 33, False), ((1, 768), 96, True), ((5, 9), 4, None)]
)
def test_mkl_packed_linear_matches_oracle(rng, xshape, n, bias):
    k = xshape[-1]
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    # bias None: the graph passes an absent optional input as None
    arrays = [x, w] + ([rng.standard_normal(n).astype(np.float32)] if bias else [None] if bias is None else [])
    y, chosen = _run("Linear", "linear_mkl_packed", arrays, {1, 2}, domain="opsnn")
    assert chosen == ("linear_blas" if xshape[0] == 1 else "linear_mkl_packed")
    want = x.astype(np.float64) @ w.astype(np.float64).T + (arrays[2].astype(np.float64) if bias else 0)
    _close(y, want, k)


@needs_mkl
def test_packed_panel_serves_other_row_counts(rng):
    # the plan packs for the prepared row count; a product with other rows reads the same panel
    w = rng.standard_normal((40, 24)).astype(np.float32)
    p = KM.pack(w, 128, transpose=False)
    for m in (1, 5, 128, 300):
        a = rng.standard_normal((m, 40)).astype(np.float32)
        out = np.empty((m, 24), np.float32)
        KM.gemm(a, p, out)
        _close(out, a.astype(np.float64) @ w, 40)
        KM.gemm(a, p, out, accumulate=True)
        _close(out, 2 * (a.astype(np.float64) @ w), 40)


@needs_mkl
@pytest.mark.parametrize("n,k", [(1, 1), (7, 13), (300, 257), (64, 1), (0, 5)])
def test_gemv_matches_oracle(rng, n, k):
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    KM.gemv(w, x, out)
    _close(out, w.astype(np.float64) @ x, k)
    KM.gemv(w, x, out, accumulate=True)  # a residual added by the product: out += w @ x
    _close(out, 2 * (w.astype(np.float64) @ x), k)


@needs_mkl
def test_fused_matmul_in_graph_uses_packed_weights(rng, gemm_on, onednn_off):
    gemm_on("mkl")
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    cg = opsnn.compile(opsnn.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])))
    y = cg.run({"x": x})["y"].numpy()
    assert "matmul_mkl_packed" in cg.explain()
    _close(y, np.maximum(x.astype(np.float64) @ w + b, 0), 16)


@needs_mkl
def test_eager_weights_are_not_packed(rng):
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    ex = opsnn.aclnn.linear.prepare(x, w)
    assert ex.kernel_name != "linear_mkl_packed"
    assert "constant" in str(dict(ex.rejected)["linear_mkl_packed"])


def test_float16_and_float64_keep_their_kernels(rng):
    for dt in (np.float16, np.float64):
        x, w = rng.standard_normal((4, 16)).astype(dt), rng.standard_normal((16, 8)).astype(dt)
        op = plan_op(get_op("MatMul"), [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)], [None, w], {})
        assert op.selection.kernel.name != "matmul_mkl_packed"


def test_disabled_by_environment_falls_back_with_a_reason():
    code = (
        "import numpy as np, ml_dtypes, opsnn\n"
        "from opsnn.ops.executor import plan_op\n"
        "from opsnn.ops.registry import TensorMeta, get_op\n"
        "x, w = np.ones((4, 16), np.float32), np.ones((16, 8), np.float32)\n"
        "op = plan_op(get_op('MatMul'), [TensorMeta(x.shape, x.dtype), TensorMeta(w.shape, w.dtype)], [None, w], {})\n"
        "print(op.selection.kernel.name, '|', dict(op.selection.rejected)['matmul_mkl_packed'])\n"
        "bf = np.dtype(ml_dtypes.bfloat16)\n"  # the bfloat16 kernels too
        "w = np.ones((8, 8, 1, 1), bf)\n"
        "op = plan_op(get_op('Conv'), [TensorMeta((1, 8, 4, 4), bf), TensorMeta(w.shape, bf)], [None, w], {})\n"
        "print(op.selection.kernel.name, '|', dict(op.selection.rejected)['conv_mkl_bf16'])\n"
    )
    # oneDNN off too: with it, a bfloat16 conv runs on its native plain-layout kernel before MKL's is asked
    env = dict(os.environ, OPSNN_MKL="0", OPSNN_ONEDNN="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first == "matmul_blas | disabled by OPSNN_MKL=0"
    name, why = second.split(" | ")
    assert "bf16" not in name and why == "disabled by OPSNN_MKL=0"


@needs_mkl
@pytest.mark.parametrize("B,H,S,T,D", [(1, 12, 16, 16, 8), (2, 3, 5, 7, 4), (1, 2, 1, 9, 3), (2, 1, 4, 1, 1)])
def test_batched_products_on_head_strided_views(rng, B, H, S, T, D):
    # Q/K/V/Y as (B, S, H*D) tensors viewed per head: leading dimension H*D, head stride D
    q = rng.standard_normal((B, S, H * D)).astype(np.float32)
    k = rng.standard_normal((B, T, H * D)).astype(np.float32)
    v = rng.standard_normal((B, T, H * D)).astype(np.float32)
    heads = lambda x, n: x.reshape(B, n, H, D).transpose(0, 2, 1, 3)  # noqa: E731
    s = np.full((B, H, S, T), np.nan, np.float32)
    KM.matmul_batched(heads(q, S), heads(k, T), s, trans_b=True)
    want = np.einsum("bhsd,bhtd->bhst", heads(q, S).astype(np.float64), heads(k, T).astype(np.float64))
    _close(s, want, D)
    y = np.full((B, S, H * D), np.nan, np.float32)
    KM.matmul_batched(s, heads(v, T), heads(y, S))
    _close(heads(y, S), np.einsum("bhst,bhtd->bhsd", s.astype(np.float64), heads(v, T).astype(np.float64)), T)


@needs_mkl
@pytest.mark.parametrize(
    "xshape,m,bias",
    [((1, 16, 7, 9), 24, True), ((2, 5, 3, 3), 7, False), ((3, 8, 11), 4, True), ((1, 1, 1, 1), 1, True)],
)
def test_mkl_packed_1x1_conv_matches_oracle(rng, xshape, m, bias):
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((m, xshape[1]) + (1,) * (len(xshape) - 2)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    rec = get_op("Conv")
    arrays = [x, w, b]
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    attrs = {"group": 1}
    planned = plan_op(rec, metas, [None, w, b], attrs)
    assert planned.selection.kernel.name == "conv_1x1_mkl_packed"
    k = planned.selection.kernel
    plan = k.plan(planned.ctx)
    assert "MKL" in plan.describe()
    y = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    k.fn(arrays, [y], planned.ctx.attrs, plan, None)
    want = np.einsum("nc...,mc->nm...", x.astype(np.float64), w.reshape(m, -1).astype(np.float64))
    if bias:
        want += b.reshape((1, m) + (1,) * (len(xshape) - 2))
    _close(y, want, xshape[1])


@needs_mkl
def test_fused_1x1_conv_in_graph_uses_packed_weights(rng, gemm_on):
    gemm_on("mkl")
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    w = rng.standard_normal((6, 8, 1, 1)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    z = rng.standard_normal((1, 6, 5, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W", "b"], ["c"]),
        helper.make_node("Add", ["c", "z"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "c1",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, z.shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    cg = opsnn.compile(opsnn.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])))
    y = cg.run({"x": x, "z": z})["y"].numpy()
    assert "conv_1x1_mkl_packed" in cg.explain()
    want = np.einsum("nchw,mc->nmhw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    _close(y, np.maximum(want + b.reshape(1, 6, 1, 1) + z, 0), 8)


@pytest.mark.parametrize(
    "ashape,bshape", [((36, 8, 5), (36, 5, 7)), ((2, 1, 4, 3), (1, 3, 3, 6)), ((4, 3), (3, 2)), ((3, 4, 0), (3, 0, 2))]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_matches_numpy_with_or_without_mkl(rng, ashape, bshape, dtype):
    # Winograd's 36 GEMMs go through KM.matmul: one MKL batch call for float32 BLAS views,
    # numpy's matmul otherwise (float64, MKL absent, a view BLAS cannot take)
    a = rng.standard_normal(ashape).astype(dtype)
    b = rng.standard_normal(bshape).astype(dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out = np.full(want.shape, np.nan, dtype)
    KM.matmul(a, b, out)
    _close(out, want, ashape[-1])
    # a transposed (column-strided) operand is not a BLAS view: numpy's path, same result
    at = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    out2 = np.full(want.shape, np.nan, dtype)
    KM.matmul(at, b, out2)
    _close(out2, want, ashape[-1])


@needs_mkl
@pytest.mark.parametrize("m,k,n", [(1, 7, 5), (5, 7, 1), (1, 1, 1), (6, 9, 8), (3, 1, 4), (1, 300, 257), (2, 0, 3)])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_gemm2d_reads_transposed_views_and_single_rows(rng, m, k, n, ta, tb):
    # the kernels' float32 products (Gemm with transA/transB, Linear's W.T, one-row products as
    # sgemv) run in one MKL call on the views as they stand, into a row-strided output
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    a, b = (a.T if ta else a), (b.T if tb else b)
    out = np.full((m, n + 3), np.nan, np.float32)[:, :n]
    assert KM.try_gemm2d(a, b, out)
    _close(out, a.astype(np.float64) @ b, max(k, 1))


@needs_mkl
def test_gemm2d_declines_what_blas_cannot_read(rng):
    a = rng.standard_normal((6, 9)).astype(np.float32)[::2, ::3]  # neither stride is unit
    b = rng.standard_normal((3, 4)).astype(np.float32)
    out = np.full((3, 4), np.nan, np.float32)
    assert not KM.try_gemm2d(a, b, out) and np.isnan(out).all()
    assert not KM.try_gemm2d(a.astype(np.float64), b, out)
    KM.matmul(a, b, out)  # numpy's matmul then
    _close(out, a.astype(np.float64) @ b, 3)


@needs_mkl
def test_float32_graph_products_never_wake_openblas(rng, monkeypatch):
    # OpenBLAS's workers spin ~0.1 s after a GEMM unless OPENBLAS_THREAD_TIMEOUT was set before
    # numpy loaded (import order): with MKL every float32 product stays off OpenBLAS, whatever
    # the CPU. Gemm with transB (ResNet's classifier, one row), MatMul, Linear through the graph
    # and eagerly
    from opsnn import _blas_env

    def no_numpy_matmul(*args, **kwargs):
        raise AssertionError("np.matmul (OpenBLAS) called for a float32 product")

    monkeypatch.setattr(_blas_env, "effective", False)
    monkeypatch.setattr(KL, "_library", None)
    monkeypatch.setattr(KL, "_gemv_openblas", None)
    monkeypatch.delenv("OPSNN_GEMM", raising=False)
    assert KL.gemm_library() == "mkl"

    x = rng.standard_normal((1, 64)).astype(np.float32)
    w = rng.standard_normal((10, 64)).astype(np.float32)
    c = rng.standard_normal(10).astype(np.float32)
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
    )
    cg = opsnn.compile(opsnn.onnx.load(helper.make_model(g).SerializeToString()))
    monkeypatch.setattr(np, "matmul", no_numpy_matmul)
    y = cg.run({"x": x})["y"]
    _close(y, x.astype(np.float64) @ w.T + c, 64)
    a = rng.standard_normal((3, 5, 64)).astype(np.float32)
    _close(opsnn.ops.matmul(opsnn.tensor(a), opsnn.tensor(w.T.copy())).numpy(), a.astype(np.float64) @ w.T, 64)
    _close(opsnn.ops.linear(opsnn.tensor(a), opsnn.tensor(w)).numpy(), a.astype(np.float64) @ w.T, 64)


def _conv_oracle(x, w, b, s, p):
    """float64 2-D convolution, group 1, as a sum over kernel offsets."""
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - kh) // s + 1, (wd + 2 * p - kw) // s + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i : i + (oh - 1) * s + 1 : s, j : j + (ow - 1) * s + 1 : s]
            y += np.einsum("nchw,mc->nmhw", win, w[:, :, i, j].astype(np.float64))
    return y + (0 if b is None else b.reshape(1, m, 1, 1))


@needs_mkl
@pytest.mark.parametrize(
    "xshape,m,k,s,p", [((1, 3, 30, 30), 16, 7, 2, 3), ((2, 5, 9, 11), 7, 3, 1, 1), ((1, 64, 12, 12), 8, 3, 2, 0)]
)
def test_mkl_packed_im2col_conv_matches_oracle(rng, monkeypatch, xshape, m, k, s, p):
    from opsnn.kernels.cpu import conv as KC

    monkeypatch.setattr(KC, "BAND_BYTES", 4096)  # several bands of output rows: strided GEMM outputs
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((m, xshape[1], k, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    rec = get_op("Conv")
    attrs = {"group": 1, "strides": [s, s], "pads": [p] * 4}
    planned = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w, b)], [None, w, b], attrs)
    kern = next(kk for kk in rec.kernels if kk.name == "conv2d_im2col_mkl_packed")
    why = kern.check(planned.ctx)
    assert why is None or "thin GEMMs" in why  # NotPreferred for few output channels, still correct
    plan = kern.plan(planned.ctx)
    ws = np.zeros(int(kern.workspace(planned.ctx, plan)), np.uint8)
    y = np.full(planned.ctx.outputs[0].shape, np.nan, np.float32)
    kern.fn([x, w, b], [y], planned.ctx.attrs, plan, ws)
    _close(y, _conv_oracle(x, w, b, s, p), xshape[1] * k * k)
    # no constant weight (eager): not applicable, and it says why
    eager = plan_op(rec, [TensorMeta(a.shape, a.dtype) for a in (x, w, b)], [None, None, None], attrs)
    assert "constant" in kern.check(eager.ctx)


@needs_mkl
def test_gemm_library_by_cpu_and_environment(monkeypatch):
    # MKL on Intel; OpenBLAS elsewhere once its workers sleep after a call; OPSNN_GEMM decides
    from opsnn import _blas_env
    from opsnn.runtime import device

    def choice(vendor, effective=True, env=None):
        monkeypatch.setattr(KL, "_library", None)
        monkeypatch.setattr(KL, "_gemv_openblas", None)
        monkeypatch.setattr(_blas_env, "effective", effective)
        monkeypatch.setattr(device, "cpu_vendor", lambda: vendor)
        if env is None:
            monkeypatch.delenv("OPSNN_GEMM", raising=False)
        else:
            monkeypatch.setenv("OPSNN_GEMM", env)
        return KL.gemm_library()

    openblas = opsnn.runtime.blas.get_blas_threads() is not None
    assert choice("GenuineIntel") == "mkl"
    assert choice("AuthenticAMD") == ("openblas" if openblas else "mkl")
    assert choice("AuthenticAMD", effective=False) == "mkl"
    assert choice("GenuineIntel", env="openblas") == "openblas"
    assert choice("AuthenticAMD", env=" MKL ") == "mkl"
    with pytest.raises(opsnn.errors.ParamInvalidError, match="OPSNN_GEMM='blis': expected 'mkl' or 'openblas'"):
        choice("AuthenticAMD", env="blis")


@needs_mkl
def test_openblas_choice_runs_products_on_numpy_and_skips_packing(rng, monkeypatch, gemm_on):
    # where MKL's threaded SGEMM is the slower library, 2-D products and large batches go to
    # numpy's matmul, mid-sized batches stay one MKL batch call, and MatMul's packed-weight
    # kernel is NotPreferred for large products (still runnable when forced), with the reason in
    # explain()
    gemm_on("openblas")
    calls = []
    real = np.matmul

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "matmul", counting)
    for ashape, bshape, numpy_path in [
        ((7, 13), (13, 5), True),
        ((1, 300), (300, 257), True),
        ((4, 64, 48), (4, 48, 40), True),  # tiny products
        ((3, 128, 64), (3, 64, 128), False),  # one MKL batch
        ((2, 512, 256), (2, 256, 384), True),
    ]:  # large products
        a = rng.standard_normal(ashape).astype(np.float32)
        b = rng.standard_normal(bshape).astype(np.float32)
        out = np.full(np.broadcast_shapes(ashape[:-2], bshape[:-2]) + (ashape[-2], bshape[-1]), np.nan, np.float32)
        calls.clear()
        KM.matmul(a, b, out)
        assert bool(calls) == numpy_path, (ashape, bshape)
        _close(out, real(a.astype(np.float64), b.astype(np.float64)), ashape[-1])
    monkeypatch.setattr(np, "matmul", real)

    # products of few rows keep MKL's packed panel (2-3x faster there); these tiny ones stand in
    for level in ("ELSEWHERE", "AVX2"):
        monkeypatch.setattr(KL, f"PACKED_MAX_ROWS_{level}", 4)
        monkeypatch.setattr(KL, f"PACKED_MAX_MACS_{level}", 0)
    assert KL.packed_panel_rejection(3, 1 << 20, 1 << 20) is None
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    g = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W")],
    )
    cg = opsnn.compile(opsnn.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])))
    _close(cg.run({"x": x})["y"].numpy(), x.astype(np.float64) @ w, 16)
    text = cg.explain()
    assert "matmul_mkl_packed" in text and "slower than OpenBLAS on this CPU" in text
    out, chosen = _run("MatMul", "matmul_mkl_packed", [x, w], {1})
    assert chosen != "matmul_mkl_packed"
    _close(out, x.astype(np.float64) @ w, 16)
    # convolutions keep their packed weights (measured faster on ResNet-50's 1x1 convs there too)
    xc = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    wc = rng.standard_normal((6, 8, 1, 1)).astype(np.float32)
    out, chosen = _run("Conv", "conv_1x1_mkl_packed", [xc, wc], {1})
    assert chosen == "conv_1x1_mkl_packed"
    _close(out, np.einsum("nchw,mc->nmhw", xc.astype(np.float64), wc[:, :, 0, 0].astype(np.float64)), 8)


@pytest.mark.parametrize("module", ["mkl", "onednn"])
def test_a_second_thread_waits_for_the_library_being_loaded(module, monkeypatch):
    """Two threads meeting a library first at once: the one that does not load it waits for the
    load and reads its outcome. Before, the load flag was set before loading, and the second
    thread read "available" with the library object still None (AttributeError)."""
    import threading
    import time

    from opsnn.kernels.cpu import onednn

    mod = KM if module == "mkl" else onednn
    if mod.unavailable() is not None:
        pytest.skip(f"{module}: {mod.unavailable()}")
    # the state is put back after: kernels made before keep using the first load's engine
    for name in ("_looked", "_why", "_lib", "_engine", "_block", "_isa"):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, getattr(mod, name))
    mod._looked, mod._lib = False, None
    paths, started = mod._candidates(), threading.Event()

    def slow():
        started.set()
        time.sleep(0.3)
        return paths

    monkeypatch.setattr(mod, "_candidates", slow)
    seen = []
    first = threading.Thread(target=mod.unavailable)
    first.start()
    started.wait(5)
    seen.append((mod.unavailable(), mod._lib is not None))
    first.join()
    assert seen == [(None, True)]
