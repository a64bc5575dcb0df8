"""Fused float32 kernels on 16-bit inputs run through the fp32 adapter: their inner MatMul / Conv must be
chosen and planned for the float32 buffers the adapter hands them (a bfloat16 inner kernel read them as
bfloat16: garbage, found by `opsnn fuzz`, op_schema seed 172902). Oracle: float64 products of the
bfloat16 values, rounded to bfloat16 once."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.ops.api import run_op

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("algo", ["matmul_epilogue", "matmul_epilogue_numpy"])
def test_fused_matmul_bf16_through_the_adapter(algo):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 3, 5, 5)).astype(BF16)
    b = rng.standard_normal((3, 3, 5, 5)).astype(BF16)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    for _ in range(3):  # the first call read uninitialised memory, later ones a wrong layout
        got = run_op("FusedMatMul", [opsnn.tensor(a), opsnn.tensor(b)], {}, domain="opsnn", algo=algo)[0]
        got = np.asarray(got.numpy()).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=2e-2)


def test_fused_conv_bf16_through_the_adapter():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 9, 9)).astype(BF16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(BF16)
    b = rng.standard_normal(4).astype(BF16)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "activation": "Relu"}
    got = run_op("FusedConv", [opsnn.tensor(a) for a in (x, w, b)], attrs, domain="opsnn", algo="conv_epilogue")[0]
    ref = run_op("Conv", [opsnn.tensor(a.astype(np.float32)) for a in (x, w, b)], {"pads": [1, 1, 1, 1]})[0]
    want = np.maximum(np.asarray(ref.numpy(), np.float64), 0)
    np.testing.assert_allclose(np.asarray(got.numpy()).astype(np.float64), want, rtol=1e-2, atol=5e-2)
