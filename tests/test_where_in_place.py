"""Where written over one of its branches (what the graph engine plans when that input dies there):
the kernel reads the branch from the output itself. Bit-equal to numpy's where (NaN payloads and
signed zeros included) for either branch, a full or single-value other branch, float32 / bfloat16 /
int64, serial and parallel sizes; a broadcast condition takes the general kernel."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import aclnn
from opsnn import dtypes as _dt

RNG = np.random.default_rng(515)


def _data(shape, dtype):
    a = RNG.standard_normal(shape).astype(np.float32)
    if np.dtype(dtype).kind in "iu":
        return (a * 100).astype(dtype)
    flat = a.reshape(-1)
    if flat.size >= 4:
        flat[:4] = [np.nan, -0.0, np.inf, -np.inf]
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, _dt.bfloat16, np.int64], ids=["f32", "bf16", "i64"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (16, 64, 32, 32)], ids=["serial", "parallel"])
@pytest.mark.parametrize("branch", ["x", "y"])
@pytest.mark.parametrize("other", ["full", "scalar"])
def test_where_over_a_branch_is_bit_equal_to_numpy(dtype, shape, branch, other):
    cond = RNG.random(shape) > 0.4
    over = _data(shape, dtype)
    rest = _data(shape if other == "full" else (), dtype)
    x, y = (over, rest) if branch == "x" else (rest, over)
    want = np.where(cond, x, y)
    tc, tx, ty = opsnn.tensor(cond), opsnn.tensor(x.copy()), opsnn.tensor(y.copy())
    ex = aclnn.where.prepare(tc, tx, ty)
    target = tx if branch == "x" else ty
    ex.launch([tc, tx, ty], [target])
    got = target.numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def test_broadcast_condition_over_a_branch_uses_the_general_kernel():
    shape = (4, 6, 8)
    cond = RNG.random((1, 6, 1)) > 0.5
    x, y = _data(shape, np.float32), _data(shape, np.float32)
    want = np.where(cond, x, y)
    tc, tx, ty = opsnn.tensor(cond), opsnn.tensor(x.copy()), opsnn.tensor(y.copy())
    ex = aclnn.where.prepare(tc, tx, ty)
    ex.launch([tc, tx, ty], [tx])
    np.testing.assert_array_equal(tx.numpy().view(np.uint8), want.view(np.uint8))
