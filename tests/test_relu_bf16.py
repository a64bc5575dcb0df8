"""Relu on bfloat16 storage (relu_numba_bf16, on the bit patterns): bit-equal to the float32 Relu
rounded to bfloat16 and to the float64 reference, with -0, +-inf, NaN and subnormals, serial and
parallel sizes, and selected ahead of the fp32 adapter."""

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops

BF16 = _dt.bfloat16
RNG = np.random.default_rng(3101)
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40, 3.0e38, -3.0e38], np.float32)


def _bits(a):
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("n", [37, 1 << 20], ids=["serial", "parallel"])
def test_relu_bf16_bit_equal_to_float32_rounded_and_float64(n):
    x = (RNG.standard_normal(n) * 3).astype(np.float32)
    x[: SPECIAL.size] = SPECIAL
    xb = x.astype(BF16).reshape(-1, 1)
    y = ops.relu(opsnn.tensor(xb)).numpy()
    assert y.dtype == BF16
    want32 = ops.relu(opsnn.tensor(xb.astype(np.float32))).numpy().astype(BF16)
    assert np.array_equal(_bits(y), _bits(want32))
    x64 = xb.astype(np.float64)
    ref = np.where(x64 < 0, 0.0, x64)  # NaN and -0 kept
    assert np.array_equal(_bits(y), _bits(ref.astype(BF16)))
    assert np.signbit(y.astype(np.float32)[1, 0]) and np.isnan(y.astype(np.float32)[4:6, 0]).all()


def test_relu_bf16_runs_without_the_fp32_adapter(monkeypatch):
    from opsnn.ops import executor

    tags = []
    orig = executor._pool_copy

    def spy(a, dt, tag, *rest, **kw):
        tags.append(str(tag))
        return orig(a, dt, tag, *rest, **kw)

    monkeypatch.setattr(executor, "_pool_copy", spy)
    ops.relu(opsnn.tensor(SPECIAL.astype(BF16)))
    assert not [t for t in tags if "adapter" in t], tags
    ops.relu(opsnn.tensor(np.array([1.0, -2.0, np.nan], np.float16)))  # float16 keeps the adapter
    assert [t for t in tags if "Relu:fp32 adapter" in t]
