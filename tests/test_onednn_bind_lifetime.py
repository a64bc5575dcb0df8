"""A bound oneDNN call (``bind``: addresses taken once for a compiled graph) keeps everything behind
those addresses alive, the wrapper's reordered weight included, even after the wrapper is dropped."""

import gc

import numpy as np
import pytest

from opsnn.kernels.cpu import onednn

pytestmark = pytest.mark.skipif(onednn.unavailable() is not None, reason=f"oneDNN: {onednn.unavailable()}")


def _churn(nbytes: int):
    """Frees what nothing holds and fills blocks of the weight's size with NaN (a freed weight's
    memory is then likely reused, so a dangling call reads NaN or crashes)."""
    gc.collect()
    return [np.full(nbytes // 4 + k, np.nan, np.float32) for k in range(0, 4096, 16)]


def test_a_bound_matmul_outlives_its_primitive():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 96), dtype=np.float32)
    w = rng.standard_normal((96, 40), dtype=np.float32)
    y = np.empty((8, 40), np.float32)
    prim = onednn.MatMulPrimitive(8, w.copy(), has_bias=False, residual=False, act=0)
    call = prim.bind(a, None, None, y)
    nbytes = prim.weight.nbytes
    del prim
    junk = _churn(nbytes)
    call()
    del junk
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)


def test_a_bound_batched_matmul_outlives_its_primitive():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5, 16), dtype=np.float32)
    w = rng.standard_normal((3, 16, 12), dtype=np.float32)
    y = np.empty((3, 5, 12), np.float32)
    prim = onednn.BatchMatMulPrimitive(5, w.copy())
    call = prim.bind(a, y)
    nbytes = prim.weight.nbytes
    del prim
    junk = _churn(nbytes)
    call()
    del junk
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=1e-5, atol=1e-4)
