"""Same-shape bfloat16 Add (add_numba_bf16): bit-equal to the float32 Add of the widened inputs
rounded to bfloat16 (the fp32 adapter's result) and to the float64 sum rounded (a float32 sum of
two bf16 values is exact unless it overflows or cancels below float32's range, so the two
roundings agree), with NaN, +-inf, inf - inf, overflow to inf; serial and parallel sizes; broadcasting
keeps the adapter."""

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops
from opsnn.ops import executor

BF16 = _dt.bfloat16
RNG = np.random.default_rng(7702)


def _bits(a):
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("n", [1000, 1 << 19], ids=["serial", "parallel"])
def test_add_bf16_bit_equal_to_float32_rounded(n):
    a = (RNG.standard_normal(n) * 4).astype(np.float32)
    b = (RNG.standard_normal(n) * 4).astype(np.float32)
    a[:6] = [np.nan, np.inf, np.inf, 3.0e38, -0.0, 1e-39]
    b[:6] = [1.0, -np.inf, 1.0, 3.0e38, -0.0, -1e-39]
    ab, bb = a.astype(BF16).reshape(-1, 8 if n % 8 == 0 else 1), b.astype(BF16).reshape(-1, 8 if n % 8 == 0 else 1)
    ex = executor.prepare(ops.get_op("Add"), [opsnn.tensor(ab), opsnn.tensor(bb)])
    assert ex.kernel_name == "add_numba_bf16" and not ex.adapter
    got = ops.add(opsnn.tensor(ab), opsnn.tensor(bb)).numpy()
    assert got.dtype == BF16
    with np.errstate(over="ignore", invalid="ignore"):
        want32 = (ab.astype(np.float32) + bb.astype(np.float32)).astype(BF16)
        want64 = (ab.astype(np.float64) + bb.astype(np.float64)).astype(np.float32).astype(BF16)
    assert np.array_equal(_bits(got), _bits(want32))
    finite = np.isfinite(want64.astype(np.float32))
    assert np.array_equal(_bits(got)[finite], _bits(want64)[finite])
    flat = got.reshape(-1).astype(np.float32)
    assert np.isnan(flat[0]) and np.isnan(flat[1]) and flat[2] == np.inf and flat[3] == np.inf
    assert np.signbit(flat[4]) and flat[4] == 0


def test_add_bf16_broadcast_keeps_the_adapter():
    a = opsnn.tensor(RNG.standard_normal((4, 5)).astype(BF16))
    b = opsnn.tensor(RNG.standard_normal((5,)).astype(BF16))
    ex = executor.prepare(ops.get_op("Add"), [a, b])
    assert ex.kernel_name != "add_numba_bf16"
    want = (a.numpy().astype(np.float32) + b.numpy().astype(np.float32)).astype(BF16)
    assert np.array_equal(_bits(ops.add(a, b).numpy()), _bits(want))
