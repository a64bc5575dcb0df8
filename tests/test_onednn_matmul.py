"""FusedMatMul on oneDNN's matmul (matmul_onednn): act(A @ B + bias + Z) against a float64 numpy
oracle for every epilogue form; when it is chosen, when it steps aside and why."""

import gc
import math

import numpy as np
import pytest

import opsnn
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops.autotune import NotPreferred
from opsnn.ops.defs import fused as F
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op


@pytest.fixture(autouse=True)
def openblas_gemm(monkeypatch):
    """OpenBLAS as the GEMM library, where FusedMatMul prefers oneDNN: its kernel is tested on every
    CPU (where MKL is the library, the packed panel and an epilogue pass stay: the last test)."""
    monkeypatch.setattr(KL, "_library", "openblas")


needs_onednn = pytest.mark.skipif(KD.matmul_unavailable() is not None, reason=f"oneDNN: {KD.matmul_unavailable()}")

_ERF = np.vectorize(math.erf)
ORACLE = {
    "": lambda y, a, b: y,
    "Relu": lambda y, a, b: np.maximum(y, 0),
    "Sigmoid": lambda y, a, b: 1 / (1 + np.exp(-y)),
    "Tanh": lambda y, a, b: np.tanh(y),
    "Gelu": lambda y, a, b: 0.5 * y * (1 + _ERF(y / np.sqrt(2))),
    "GeluTanh": lambda y, a, b: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3))),
    "Swish": lambda y, a, b: y / (1 + np.exp(-a * y)),
    "LeakyRelu": lambda y, a, b: np.where(y >= 0, y, a * y),
    "Clip": lambda y, a, b: np.clip(y, a, b),
}


def _plan(a, w, b=None, z=None, attrs=None):
    rec = get_op("FusedMatMul", "opsnn")
    ins = [a, w, b, z]
    metas = [None if t is None else TensorMeta(t.shape, t.dtype) for t in ins]
    return rec, plan_op(rec, metas, [None, w, None, None], dict(attrs or {}))


@needs_onednn
@pytest.mark.parametrize(
    "act,alpha,beta",
    [
        ("", 0, 0),
        ("Relu", 0, 0),
        ("Gelu", 0, 0),
        ("GeluTanh", 0, 0),
        ("Sigmoid", 0, 0),
        ("Tanh", 0, 0),
        ("Swish", 1.7, 0),
        ("LeakyRelu", 0.2, 0),
        ("Clip", -0.3, 0.4),
    ],
)
@pytest.mark.parametrize("bias,residual", [(True, False), (False, True), (True, True), (False, False)])
def test_matmul_onednn_matches_a_float64_oracle(rng, act, alpha, beta, bias, residual):
    a = rng.standard_normal((3, 11, 40)).astype(np.float32)  # 33 rows, K = 40 (not a tile multiple)
    w = (rng.standard_normal((40, 24)) * 0.2).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32) if bias else None
    z = rng.standard_normal((3, 11, 24)).astype(np.float32) if residual else None
    attrs = {"activation": act, "activation_alpha": alpha, "activation_beta": beta}
    rec, planned = _plan(a, w, b, z, attrs)
    assert planned.selection.kernel.name == "matmul_onednn"
    k = planned.selection.kernel
    plan = k.plan(planned.ctx)
    assert "oneDNN" in plan.describe() and "reordered at prepare" in plan.describe()
    out = np.full((3, 11, 24), np.nan, np.float32)
    k.fn([a, w, b, z], [out], planned.ctx.attrs, plan, None)
    y = a.astype(np.float64) @ w
    if bias:
        y = y + b
    if residual:
        y = y + z
    want = ORACLE[act](y, alpha, beta)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5 * max(1.0, np.abs(want).max()))
    # bound once (Kernel.bind: a compiled graph's fixed buffers), the addresses taken then: the call
    # holds the arrays it was given and reads their values when it runs
    out2 = np.full_like(out, np.nan)
    a2 = np.zeros_like(a)
    call = k.bind(
        [a2, w, None if b is None else b.copy(), None if z is None else z.copy()], [out2], planned.ctx.attrs, plan, None
    )
    gc.collect()
    a2[...] = a
    call()
    np.testing.assert_array_equal(out2, out)


@needs_onednn
@pytest.mark.parametrize(
    "act,alpha,beta", [("Relu", 0, 0), ("Clip", -0.3, 0.4), ("Gelu", 0, 0), ("LeakyRelu", 0.2, 0), ("Sigmoid", 0, 0)]
)
def test_matmul_onednn_keeps_nan_and_inf_through_the_activation(rng, act, alpha, beta):
    # oneDNN's relu / clip post-ops map NaN to 0 / a bound and gelu_erf +inf to NaN (fuzz onnx_mutate
    # 52698, 54330, 54586: MatMul + Relu gave 0 where onnx.reference has NaN; onnxruntime keeps NaN too)
    a = rng.standard_normal((6, 16)).astype(np.float32)
    a[0, 1], a[1, 2], a[2, 3] = np.nan, np.inf, -np.inf
    w = np.abs(rng.standard_normal((16, 8))).astype(np.float32)
    w[:, 4:] *= -1  # +inf and -inf in every row that holds one
    attrs = {"activation": act, "activation_alpha": alpha, "activation_beta": beta}
    rec, planned = _plan(a, w, attrs=attrs)
    k = planned.selection.kernel
    assert k.name == "matmul_onednn"
    plan = k.plan(planned.ctx)
    with np.errstate(all="ignore"):
        want = ORACLE[act](a.astype(np.float64) @ w, alpha, beta)
    assert np.isnan(want).any() and (np.isposinf(want).any() or act in ("Clip", "Sigmoid"))
    out = np.zeros((6, 8), np.float32)
    k.fn([a, w, None, None], [out], planned.ctx.attrs, plan, None)
    out2 = np.zeros_like(out)
    k.bind([a, w, None, None], [out2], planned.ctx.attrs, plan, None)()
    for got in (out, out2):
        for name, fn in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
            np.testing.assert_array_equal(fn(got), fn(want), err_msg=f"{act}: {name}")
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-5)


@pytest.mark.skipif(
    KD.matmul_unavailable() is not None or KD.bf16_unavailable() is not None,
    reason=f"oneDNN bf16 matmul: {KD.matmul_unavailable() or KD.bf16_unavailable()}",
)
@pytest.mark.parametrize(
    "act,bias,residual", [("", True, False), ("Gelu", True, False), ("", False, True), ("Relu", True, True)]
)
def test_bfloat16_matmul_onednn_matches_the_oracle_on_the_same_values(rng, act, bias, residual):
    """bf16 A, B, bias, Z: float32 accumulation and one rounding of Y, so Y is within bf16's
    rounding of the float64 oracle computed from the same (bf16-representable) values."""
    bf = opsnn.dtypes.bfloat16
    a = rng.standard_normal((2, 17, 72)).astype(bf)
    w = (rng.standard_normal((72, 40)) * 0.2).astype(bf)
    b = rng.standard_normal(40).astype(bf) if bias else None
    z = rng.standard_normal((2, 17, 40)).astype(bf) if residual else None
    rec, planned = _plan(a, w, b, z, {"activation": act})
    k = planned.selection.kernel
    assert k.name == "matmul_onednn" and not k.needs_adapter(planned.ctx)
    plan = k.plan(planned.ctx)
    assert "bfloat16 matmul" in plan.describe() and "bf16" in plan.impl
    out = np.zeros((2, 17, 40), bf)
    k.fn([a, w, b, z], [out], planned.ctx.attrs, plan, None)
    y = a.astype(np.float64) @ w.astype(np.float64)
    if bias:
        y = y + b.astype(np.float64)
    if residual:
        y = y + z.astype(np.float64)
    want = ORACLE[act](y, 0, 0)
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2**-7, atol=1e-3 * np.abs(want).max())


@needs_onednn
def test_matmul_onednn_steps_aside_for_few_rows_and_variable_weights(rng):
    w = rng.standard_normal((16, 8)).astype(np.float32)
    few = rng.standard_normal((1, F.ONEDNN_MIN_ROWS - 1, 16)).astype(np.float32)
    rec, planned = _plan(few, w)
    k = next(k for k in rec.kernels if k.name == "matmul_onednn")
    why = k.check(planned.ctx)
    assert isinstance(why, NotPreferred) and "ONEDNN_MIN_ROWS" in str(why)
    assert planned.selection.kernel.name != "matmul_onednn"
    # a B that is not a constant at prepare
    rec = get_op("FusedMatMul", "opsnn")
    a = rng.standard_normal((32, 16)).astype(np.float32)
    p = plan_op(rec, [TensorMeta(a.shape, a.dtype), TensorMeta(w.shape, w.dtype)], [None, None], {})
    assert "constant" in k.check(p.ctx) and p.selection.kernel.name != "matmul_onednn"


def test_matmul_onednn_is_not_offered_without_onednn(rng, onednn_off):
    a, w = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    rec, planned = _plan(a, w)
    k = next(k for k in rec.kernels if k.name == "matmul_onednn")
    assert k.check(planned.ctx) == "turned off for this test"
    packed = KL.own_packed_rejection(32, np.float32) is None  # AVX2 with OpenBLAS: opsnn's packed GEMM
    assert planned.selection.kernel.name == ("matmul_packed" if packed else "matmul_epilogue")


@needs_onednn
@pytest.mark.parametrize("m,k,n", [(1, 40, 24), (9, 33, 70), (128, 96, 200)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_wt_matmul_matches_a_float64_oracle(rng, m, k, n, accumulate):
    """The decoder's products: Y = X @ W.T (Y += X @ W.T), W (n, k) read in place."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    y0 = rng.standard_normal((m, n)).astype(np.float32)
    y = y0.copy()
    KD.wt_matmul(m, k, n, accumulate).run(x.ctypes.data, w.ctypes.data, y.ctypes.data)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (y0 if accumulate else 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * math.sqrt(k) * 4)
    assert KD.wt_matmul(m, k, n, accumulate) is KD.wt_matmul(m, k, n, accumulate)  # kept, one per shape


@pytest.mark.skipif(
    KD.matmul_unavailable() is not None or KD.bf16_unavailable() is not None,
    reason=f"oneDNN bf16 matmul: {KD.matmul_unavailable() or KD.bf16_unavailable()}",
)
@pytest.mark.parametrize("m,k,n", [(2, 40, 24), (128, 96, 200)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_bfloat16_wt_matmul_accumulates_in_float32(rng, m, k, n, accumulate):
    """A bf16 model's products: bf16 X and W (n, k), float32 Y (= or +=), against the float64
    oracle on the same bf16 values (so only float32 summation order differs)."""
    bf = opsnn.dtypes.bfloat16
    x = rng.standard_normal((m, k)).astype(bf)
    w = rng.standard_normal((n, k)).astype(bf)
    y0 = rng.standard_normal((m, n)).astype(np.float32)
    y = y0.copy()
    prim = KD.wt_matmul(m, k, n, accumulate, bf)
    assert prim is not KD.wt_matmul(m, k, n, accumulate) and "bf16" in prim.impl
    prim.run(x.ctypes.data, w.ctypes.data, y.ctypes.data)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (y0 if accumulate else 0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * math.sqrt(k) * 4)


@needs_onednn
def test_wt_matmul_keeps_at_most_wt_cache_size_primitives(monkeypatch):
    monkeypatch.setattr(KD, "_wt_cache", type(KD._wt_cache)())
    monkeypatch.setattr(KD, "WT_CACHE_SIZE", 3)
    prims = [KD.wt_matmul(m, 16, 8) for m in range(1, 6)]
    assert list(KD._wt_cache) == [(m, 16, 8, False, "float32") for m in (3, 4, 5)]
    assert KD.wt_matmul(5, 16, 8) is prims[-1] and KD.wt_matmul(1, 16, 8) is not prims[0]


@needs_onednn
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "trans_b,c_shape,beta", [(1, (24,), 1.0), (0, (1, 24), 1.0), (1, (5, 24), 1.0), (0, None, 1.0), (1, (5, 24), 0.0)]
)
def test_gemm_on_onednn_matches_the_gemm_reference(rng, dtype, trans_b, c_shape, beta):
    """Gemm with a constant B (ResNet's classifier, exported Linear layers): B reordered once,
    C as the matmul's bias or a residual post-op."""
    dt = opsnn.dtypes.get(dtype)
    if dtype == "bfloat16" and KD.bf16_unavailable() is not None:
        pytest.skip(f"oneDNN bf16: {KD.bf16_unavailable()}")
    a = rng.standard_normal((5, 40)).astype(dt)
    b = (rng.standard_normal((24, 40) if trans_b else (40, 24)) * 0.2).astype(dt)
    c = None if c_shape is None else rng.standard_normal(c_shape).astype(dt)
    rec = get_op("Gemm")
    attrs = {"transB": trans_b, "beta": beta}
    ins = [a, b] + ([c] if c is not None else [])
    planned = plan_op(rec, [TensorMeta(t.shape, t.dtype) for t in ins], [None, b] + [None] * (len(ins) - 2), attrs)
    k = planned.selection.kernel
    assert k.name == "gemm_onednn", planned.selection.reason
    out = np.zeros((5, 24), dt)
    k.fn(ins, [out], planned.ctx.attrs, planned.plan, None)
    want = rec.reference([t.astype(np.float64) for t in ins], planned.ctx.attrs)
    tol = 2**-7 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol, atol=tol * np.abs(want).max())
    # a plan for another row count reads B (transposed or not) into the same reordered copy
    a7 = rng.standard_normal((7, 40)).astype(dt)
    c7 = None if c is None else (c if c.shape[0] == 1 or c.ndim == 1 else np.zeros((7, 24), dt))
    ins7 = [a7, b] + ([c7] if c7 is not None else [])
    p7 = plan_op(rec, [TensorMeta(t.shape, t.dtype) for t in ins7], [None, b] + [None] * (len(ins7) - 2), attrs)
    assert p7.selection.kernel.name == "gemm_onednn" and p7.plan._w is planned.plan._w
    # what it leaves to the other kernels, with the reason
    metas = [TensorMeta(t.shape, t.dtype) for t in ins]
    for bad, why in (({"alpha": 0.5}, "transA=0 and alpha=1"), ({"beta": 0.5}, "beta=1")):
        if "beta" in bad and c is None:
            continue
        p2 = plan_op(rec, metas, [None, b] + [None] * (len(ins) - 2), dict(attrs, **bad))
        assert why in str(k.check(p2.ctx)) and p2.selection.kernel.name != "gemm_onednn"


@needs_onednn
def test_one_primitive_run_from_two_threads_at_once_gives_each_its_own_result(rng):
    """oneDNN's own (library) scratchpad is one buffer per primitive: two threads running the same
    primitive overwrote each other's partial sums (wt_matmul: ~180 of 200 products wrong in each
    thread). opsnn passes each thread's own scratchpad, so concurrent runs are independent."""
    import threading

    w = rng.standard_normal((512, 768)).astype(np.float32)
    wt = KD.wt_matmul(64, 768, 512)
    assert wt._scratch > 0  # the case that raced: a primitive that needs a scratchpad
    u = rng.standard_normal((36, 64, 64)).astype(np.float32)
    batched = KD.BatchMatMulPrimitive(98, u, transposed=True)
    wc = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    conv = KD.ConvPrimitive(
        (1, 16, 20, 20),
        wc,
        (1, 32, 20, 20),
        (1, 1),
        (1, 1, 1, 1),
        (1, 1),
        block=KD.block(),
        src_blocked=True,
        has_bias=False,
        residual=False,
        act=0,
    )
    from opsnn.kernels.cpu import blocked as KB

    def case(i):
        x = rng.standard_normal((64, 768)).astype(np.float32)
        a = rng.standard_normal((36, 98, 64)).astype(np.float32)
        xc = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
        ref_c = np.zeros((1, 32, 20, 20))
        xp = np.pad(xc.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        for dy in range(3):
            for dx in range(3):
                ref_c += np.einsum("nchw,oc->nohw", xp[:, :, dy : dy + 20, dx : dx + 20], wc[:, :, dy, dx])
        return (
            x,
            x.astype(np.float64) @ w.T.astype(np.float64),
            a,
            a @ u.transpose(0, 2, 1),
            xc,
            KB.blocked_reference(ref_c.astype(np.float32), KD.block()),
        )

    cases = [case(i) for i in range(2)]
    wrong = [0, 0]

    def work(i):
        x, ref, a, ref_b, xc, ref_c = cases[i]
        xb = KB.blocked_reference(xc, KD.block())
        y, yb, yc = (
            np.empty((64, 512), np.float32),
            np.empty((36, 98, 64), np.float32),
            np.empty(ref_c.shape, np.float32),
        )
        for _ in range(60):
            wt.run(x.ctypes.data, w.ctypes.data, y.ctypes.data)
            batched(a, yb)
            conv(xb, None, None, yc)
            wrong[i] += (
                (not np.allclose(y, ref, rtol=1e-4, atol=1e-3))
                + (not np.allclose(yb, ref_b, atol=1e-3))
                + (not np.allclose(yc, ref_c, atol=1e-3))
            )

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not conv.impl.startswith("ref")
    assert wrong == [0, 0]


@needs_onednn
def test_fused_matmul_stays_on_mkl_where_mkl_is_the_gemm_library(rng, monkeypatch):
    """Where MKL is the GEMM library a float32 FusedMatMul runs MKL's packed panel and one epilogue
    pass (matmul_epilogue), with oneDNN's kernel skipped for that reason; bfloat16 is not affected."""
    monkeypatch.setattr(KL, "_library", "mkl")
    a = rng.standard_normal((33, 40)).astype(np.float32)
    w = (rng.standard_normal((40, 24)) * 0.2).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    rec, planned = _plan(a, w, b, None, {"activation": "Gelu", "activation_alpha": 0, "activation_beta": 0})
    assert planned.selection.kernel.name == "matmul_epilogue"
    why = next(k for k in rec.kernels if k.name == "matmul_onednn").check(planned.ctx)
    assert isinstance(why, NotPreferred) and "MKL is the GEMM library" in str(why)
    assert KL.epilogue_product_rejection(np.float32) is not None
    assert KL.epilogue_product_rejection(opsnn.dtypes.bfloat16) is None
    monkeypatch.setattr(KL, "_library", "openblas")
    assert KL.epilogue_product_rejection(np.float32) is None
