"""float32 products whose operands both arrive at run time (eager training, the backward products of a
compiled step) on oneDNN's brgemm matmul where the kernel-library strategy says so
(``libraries.runtime_f32_product``): the decision per ISA level and vendor, the kernel each op picks on
this machine, and its results against a float64 oracle, transposes, bias, NaN and Inf included."""

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.kernels.cpu import libraries as KL

AMD, INTEL = "AuthenticAMD", "GenuineIntel"
#: large enough for oneDNN (>= RUNTIME_F32_MIN_MACS multiply-adds), small enough to stay quick
M, K, N = 96, 80, 72


def test_decision_per_isa_and_vendor():
    assert M * K * N >= KL.RUNTIME_F32_MIN_MACS
    for level in ("avx512", "avx512_bf16", "amx"):
        amd = KL.Platform.for_isa(level, AMD)
        assert KL.runtime_f32_product(M, K, N, p=amd) is None
        assert KL.runtime_f32_product(1, 4096, 4096, p=amd) is not None  # one row: a gemv
        assert KL.runtime_f32_product(M, 4096, 1, p=amd) is not None  # one column
        assert KL.runtime_f32_product(8, 8, 8, p=amd) is not None  # tiny: BLAS's overhead is lower
        assert KL.runtime_f32_product(2, 64, 64, batch=64, p=amd) is None  # the batch counts
        intel = KL.Platform.for_isa(level, INTEL)
        assert "MKL" in KL.runtime_f32_product(M, K, N, p=intel)
        # with a bias vector oneDNN adds it in the epilogue, MKL would need a second pass: oneDNN on Intel too
        assert KL.runtime_f32_product(M, K, N, p=intel, bias=True) is None
        assert KL.runtime_f32_product(8, 8, 8, p=intel, bias=True) is not None  # the size rule holds
        assert KL.runtime_f32_product(M, K, N, p=KL.Platform.for_isa(level, AMD, onednn=False)) is not None
    for vendor in (AMD, INTEL):
        for bias in (False, True):
            assert KL.runtime_f32_product(M, K, N, p=KL.Platform.for_isa("avx2", vendor), bias=bias) is not None
    c = KL.kernel_choice("linear_onednn_runtime", M, K, N, np.float32)
    assert c.library == "onednn" and "float32" in c.reason


def _expect(kernel_name: str, expected: str, m: int, k: int, n: int, batch: int = 1, bias: bool = False):
    why = KL.runtime_f32_product(m, k, n, batch, bias=bias)
    assert (kernel_name == expected) == (why is None), (kernel_name, why)


def _close(got: np.ndarray, want: np.ndarray):
    """float32 products against float64: NaN where the oracle has NaN, infinities equal, the rest
    within float32 accumulation error of the operands' scale."""
    assert got.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    inf = np.isinf(want)
    assert np.array_equal(got[inf], want[inf])
    fin = ~(nan | inf)
    scale = max(float(np.abs(want[fin]).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=2e-5 * scale)


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "sa, sb",
    [((M, K), (K, N)), ((2, 3, M // 2, K), (K, N)), ((3, M, K), (3, K, N)), ((2, M, K), (1, K, N))],
)
def test_matmul(sa, sb):
    rng = np.random.default_rng(0)
    a, b = _rand(rng, sa), _rand(rng, sb)
    ex = opsnn.aclnn.matmul.prepare(a, b)
    if len(sb) > 2 and sa[:-2] != sb[:-2]:  # broadcast batch dims: BLAS, the same result
        assert ex.kernel_name != "matmul_onednn_runtime"
    else:
        batch = int(np.prod(sa[:-2])) if len(sb) > 2 else 1
        rows = sa[-2] if len(sb) > 2 else int(np.prod(sa[:-1]))
        _expect(ex.kernel_name, "matmul_onednn_runtime", rows, K, N, batch)
    _close(ops.matmul(a, b).numpy(), np.matmul(a.astype(np.float64), b.astype(np.float64)))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_reads_w_transposed_in_place(bias):
    rng = np.random.default_rng(1)
    x, w = _rand(rng, (4, M // 4, K)), _rand(rng, (N, K))
    b = _rand(rng, (N,)) if bias else None
    _expect(opsnn.aclnn.linear.prepare(x, w, b).kernel_name, "linear_onednn_runtime", M, K, N, bias=bias)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + (b.astype(np.float64) if bias else 0)
    _close(ops.linear(x, w, b).numpy(), ref)


@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes_and_bias(ta, tb):
    rng = np.random.default_rng(2)
    a = _rand(rng, (K, M) if ta else (M, K))
    b = _rand(rng, (N, K) if tb else (K, N))
    c = _rand(rng, (N,))
    ex = opsnn.aclnn.gemm.prepare(a, b, c, trans_a=bool(ta), trans_b=bool(tb))
    _expect(ex.kernel_name, "gemm_onednn_runtime", M, K, N, bias=True)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = (a64.T if ta else a64) @ (b64.T if tb else b64) + c
    _close(ops.gemm(a, b, c, trans_a=bool(ta), trans_b=bool(tb)).numpy(), ref)


@pytest.mark.parametrize("ta, tb", [(0, 1), (1, 0)])
def test_batch_gemm_as_the_backward_uses_it(ta, tb):
    rng = np.random.default_rng(3)
    a = _rand(rng, (3, K, M) if ta else (3, M, K))
    b = _rand(rng, (3, N, K) if tb else (3, K, N))
    ex = opsnn.aclnn.batch_gemm.prepare(a, b, trans_a=bool(ta), trans_b=bool(tb))
    _expect(ex.kernel_name, "batch_gemm_onednn_runtime", M, K, N, 3)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.matmul(np.swapaxes(a64, 1, 2) if ta else a64, np.swapaxes(b64, 1, 2) if tb else b64)
    _close(ops.batch_gemm(a, b, trans_a=bool(ta), trans_b=bool(tb)).numpy(), ref)


def test_nan_and_inf_propagate():
    rng = np.random.default_rng(4)
    a, b = _rand(rng, (M, K)), _rand(rng, (K, N))
    a[3, 5] = np.nan  # row 3 of the result: NaN
    a[7, 2] = np.inf  # row 7: +-inf, or NaN where inf meets a zero or an opposite inf
    b[:, 9] = 0.0
    b[6, 11] = -np.inf  # column 11: NaN where inf * 0 ... and -inf where finite
    with np.errstate(invalid="ignore", over="ignore"):
        ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    _close(ops.matmul(a, b).numpy(), ref)
    _close(ops.linear(a, np.ascontiguousarray(b.T)).numpy(), ref)
