"""opsnn's packed float32 GEMM (kernels/cpu/gemm_packed.py) and the FusedMatMul kernel on it, against
float64 products: row, column and K tails, both thread paths, NaN and Inf; and where it is chosen."""

import numpy as np
import pytest

from opsnn.kernels.cpu import gemm_packed as G
from opsnn.kernels.cpu import libraries as KL
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, get_op

AMD, INTEL = "AuthenticAMD", "GenuineIntel"


def _oracle(a, w):
    with np.errstate(all="ignore"):
        return a.astype(np.float64) @ w.astype(np.float64)


def _assert_ieee_close(got, ref, rtol=2e-6):
    """The same NaN and +-Inf positions as the float64 product, the finite values within ``rtol`` of
    the largest |value| times sqrt(K)-sized rounding."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    fin = np.isfinite(ref)
    scale = np.abs(ref[fin]).max(initial=1.0)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=0, atol=rtol * scale * 8)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 13])
@pytest.mark.parametrize("k", [1, 255, 256, 257, 600])
@pytest.mark.parametrize("n", [1, 8, 16, 33])
def test_gemm_matches_a_float64_product_on_every_tail(m, k, n, parallel):
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full((m, n), np.nan, np.float32)
    G.gemm(a, G.pack(w), c, parallel=parallel)
    _assert_ieee_close(c, _oracle(a, w))


@pytest.mark.parametrize("parallel", [False, True])
def test_gemm_keeps_nan_and_inf_as_the_sums_give_them(parallel):
    rng = np.random.default_rng(3)
    m, k, n = 13, 300, 40
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    a[1, 7] = np.nan  # row 1: NaN everywhere
    a[2, 260] = np.inf  # row 2: +-Inf by the sign of w[260], NaN where w[260] is 0
    w[260, 3] = 0.0
    a[3, 5], a[3, 6] = np.inf, -np.inf  # Inf - Inf: NaN where w[5] and w[6] share a sign
    w[10, 20] = np.inf  # column 20: Inf from every finite nonzero a[:, 10]
    a[4, 10] = 0.0  # 0 * Inf: NaN in (4, 20)
    c = np.empty((m, n), np.float32)
    G.gemm(a, G.pack(w), c, parallel=parallel)
    ref = _oracle(a, w)
    assert np.isnan(ref[1]).all() and np.isnan(ref[2, 3]) and np.isnan(ref[4, 20]) and np.isinf(ref[0, 20])
    _assert_ieee_close(c, ref)


def test_gemm_of_an_empty_k_is_zeros():
    c = np.full((3, 20), np.nan, np.float32)
    G.gemm(np.empty((3, 0), np.float32), G.pack(np.empty((0, 20), np.float32)), c)
    assert (c == 0).all()


def test_pack_pads_the_last_panel_with_zeros():
    w = np.arange(3 * 20, dtype=np.float32).reshape(3, 20)
    p = G.pack(w)
    assert p.shape == (2, 3, 16)
    np.testing.assert_array_equal(p[0], w[:, :16])
    np.testing.assert_array_equal(p[1, :, :4], w[:, 16:])
    assert (p[1, :, 4:] == 0).all()


def _gelu64(y):
    import math

    return y * 0.5 * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))


@pytest.mark.parametrize("act, residual", [("", True), ("Gelu", False), ("Relu", False)])
def test_fused_matmul_on_the_packed_gemm(act, residual):
    """FusedMatMul's ``matmul_packed`` (forced here on any CPU): act(X @ W + bias + Z) for a batch of
    (2, 67, 96) activations and a constant (96, 200) weight, NaN rows kept (Relu's NaN too)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 67, 96)).astype(np.float32)
    x[1, 3, 10] = np.nan
    w = (rng.standard_normal((96, 200)) / 10).astype(np.float32)
    b = rng.standard_normal(200).astype(np.float32)
    z = rng.standard_normal((2, 67, 200)).astype(np.float32) if residual else None
    f32 = np.dtype(np.float32)
    metas = [TensorMeta(x.shape, f32), TensorMeta(w.shape, f32), TensorMeta(b.shape, f32)]
    metas += [TensorMeta(z.shape, f32)] if residual else []
    values = [None, w, b] + ([None] if residual else [])
    op = plan_op(get_op("FusedMatMul", "opsnn"), metas, values, {"activation": act}, algo="matmul_packed")
    assert op.selection.kernel.name == "matmul_packed"
    y = np.empty((2, 67, 200), np.float32)
    op.selection.kernel.fn([x, w, b] + ([z] if residual else []), [y], op.ctx.attrs, op.plan, None)
    ref = _oracle(x, w) + b
    if residual:
        ref = ref + z
    elif act == "Gelu":
        ref = _gelu64(ref)
    else:
        ref = np.where(np.isnan(ref), np.nan, np.maximum(ref, 0.0))
    assert np.isnan(y[1, 3]).all()
    _assert_ieee_close(y, ref, rtol=1e-5)


def test_the_packed_gemm_is_chosen_on_avx2_without_mkl():
    """On AVX2 CPUs whose GEMM library is OpenBLAS (AMD Zen 3 and older) a float32 product of 16+ rows
    with a constant weight packs it for opsnn's GEMM; not on AVX-512 (oneDNN's brgemm), where MKL is
    the GEMM library, for few rows or other dtypes."""
    zen3 = KL.Platform.for_isa("avx2", AMD)
    assert KL.own_packed_rejection(128, np.float32, zen3) is None
    assert KL.own_packed_rejection(KL.PACKED_OWN_MIN_ROWS, np.float32, zen3) is None
    assert "row kernels" in KL.own_packed_rejection(KL.PACKED_OWN_MIN_ROWS - 1, np.float32, zen3)
    assert "float32 only" in KL.own_packed_rejection(128, np.float64, zen3)
    assert "MKL" in KL.own_packed_rejection(128, np.float32, KL.Platform.for_isa("avx2", INTEL))
    for level in ("avx512", "avx512_bf16"):
        assert "AVX2 kernel" in KL.own_packed_rejection(128, np.float32, KL.Platform.for_isa(level, AMD))
    choice = KL.kernel_choice("matmul_packed", 128, 768, 768, np.float32, p=zen3)
    assert choice.library == "opsnn" and "packed once" in choice.reason


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("n", [16, 40])
def test_gemm_adds_into_c_and_packs_a_linear_weight(parallel, n):
    """``accumulate``: C += A @ B (the decoder's residual projections), the partial panel too; ``pack(W,
    transpose=True)`` takes a Linear's (N, K) weight; ``unpacked`` gives B back."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((20, 300)).astype(np.float32)
    wt = rng.standard_normal((n, 300)).astype(np.float32)  # (N, K)
    c0 = rng.standard_normal((20, n)).astype(np.float32)
    c = c0.copy()
    panels = G.pack(wt, transpose=True)
    np.testing.assert_array_equal(G.unpacked(panels, n), wt.T)
    G.gemm(a, panels, c, parallel=parallel, accumulate=True)
    _assert_ieee_close(c, c0.astype(np.float64) + _oracle(a, wt.T))
    G.gemm(np.empty((20, 0), np.float32), G.pack(np.empty((n, 0), np.float32), transpose=True), c, accumulate=True)
    _assert_ieee_close(c, c0.astype(np.float64) + _oracle(a, wt.T))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [16, 130, 1000])
def test_threads_taking_chunks_of_panels_give_the_serial_bits(threads, n):
    """The parallel product hands panels out as threads come free: every panel exactly once (a lost or
    repeated one would differ under ``accumulate``), each computed as the serial kernel does it."""
    import numba

    rng = np.random.default_rng(n)
    a = rng.standard_normal((37, 70)).astype(np.float32)
    panels = G.pack(rng.standard_normal((70, n)).astype(np.float32))
    c0 = rng.standard_normal((37, n)).astype(np.float32)
    serial, par = c0.copy(), c0.copy()
    G.gemm(a, panels, serial, parallel=False, accumulate=True)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        G.gemm(a, panels, par, parallel=True, accumulate=True)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(par, serial)


def test_matmul_on_the_packed_gemm():
    """MatMul's ``matmul_packed`` (forced here on any CPU): a (3, 21, 50) batch of rows times a constant
    (50, 37) B, a NaN and an Inf kept where the sums put them; a B known only at run time is refused."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((3, 21, 50)).astype(np.float32)
    a[2, 4, 7], a[0, 0, 1] = np.nan, np.inf
    w = rng.standard_normal((50, 37)).astype(np.float32)
    rec = get_op("MatMul")
    f32 = np.dtype(np.float32)
    metas = [TensorMeta(a.shape, f32), TensorMeta(w.shape, f32)]
    op = plan_op(rec, metas, [None, w], {}, algo="matmul_packed")
    y = np.empty((3, 21, 37), np.float32)
    op.selection.kernel.fn([a, w], [y], op.ctx.attrs, op.plan, None)
    _assert_ieee_close(y, _oracle(a, w))
    ctx = plan_op(rec, metas, [None, None], {}).ctx
    assert "constant" in next(k for k in rec.kernels if k.name == "matmul_packed").check(ctx)


def test_fused_matmul_of_two_vectors_is_refused_by_the_packed_kernel_not_crashed():
    """1-D @ 1-D (a scalar output: no columns): the packed kernel's check says why it does not apply
    (it raised IndexError, fuzz op_schema seed 2505545) and another kernel gives the dot product."""
    from opsnn.ops.api import run_op

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    (y,) = run_op("FusedMatMul", [a, b], domain="opsnn")
    assert y.shape == ()
    np.testing.assert_allclose(float(y.numpy()), float(a.astype(np.float64) @ b.astype(np.float64)), rtol=1e-5)
    rec = get_op("FusedMatMul", domain="opsnn")
    planned = plan_op(rec, [TensorMeta(a.shape, a.dtype), TensorMeta(b.shape, b.dtype)], [None, b], {})
    packed = next(k for k in rec.kernels if k.name == "matmul_packed")
    assert "2-D" in str(packed.check(planned.ctx))
