"""MaxPool with indices (the training forward's kernel): values and indices against the reference on
data full of ties (the first maximum in tap order wins), NaN (the window's first NaN), all -inf
windows, dilation, ceil mode, windows wider than the row, storage orders, parallel rows, 1-D; the
bfloat16 kernel against the float32 one on the widened values."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn import ops

CASES = [
    # shape, kernel, strides, pads, dilations, ceil
    ((2, 3, 17, 19), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),
    ((2, 2, 9, 33), [2, 3], [1, 1], [0, 1, 0, 1], [1, 1], 0),
    ((1, 2, 15, 16), [3, 3], [2, 2], [0, 0, 1, 1], [2, 2], 1),
    ((3, 2, 8, 7), [5, 5], [1, 2], [2, 2, 2, 2], [1, 1], 0),  # windows wider than the row: all border
    ((16, 64, 16, 16), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),  # parallel row tasks
    ((2, 3, 1, 40), [1, 4], [1, 3], [0, 0, 0, 0], [1, 1], 1),  # 1-D as a height-1 plane
]


def _data(rng, shape):
    x = rng.integers(-3, 4, shape).astype(np.float32)  # ties everywhere
    flat = x.reshape(-1)
    flat[rng.random(flat.size) < 0.03] = np.nan
    flat[rng.random(flat.size) < 0.05] = -np.inf
    x[0, 0, :3, :] = -np.inf  # whole windows of -inf
    return x


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_maxpool_indices_rows_against_reference(case, storage_order):
    shape, k, s, p, d, ceil = CASES[case]
    rng = np.random.default_rng(70 + case)
    x = _data(rng, shape)
    attrs = dict(kernel_shape=k, strides=s, pads=p, dilations=d, ceil_mode=ceil, storage_order=storage_order)
    if shape[2] == 1:  # the 1-D op
        x = x[:, :, 0]
        attrs = dict(kernel_shape=k[1:], strides=s[1:], pads=[p[1], p[3]], dilations=d[1:], ceil_mode=ceil)
        attrs["storage_order"] = storage_order
    y, i = ops.run_op("MaxPool", [x], attrs, num_outputs=2)
    ry, ri = ops.run_op("MaxPool", [x], attrs, num_outputs=2, algo="reference")
    np.testing.assert_array_equal(y.numpy(), ry.numpy())  # NaN where NaN
    np.testing.assert_array_equal(i.numpy(), ri.numpy())
    xb = x.astype(ml_dtypes.bfloat16)  # the small integers, NaN and -inf are exact in bfloat16
    by, bi = ops.run_op("MaxPool", [xb], attrs, num_outputs=2)
    assert by.numpy().dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(by.numpy().astype(np.float32), y.numpy())
    np.testing.assert_array_equal(bi.numpy(), i.numpy())


def test_maxpool_indices_on_a_ramp():
    """On an increasing ramp each window's maximum is its last tap inside the image."""
    x = np.arange(32 * 32, dtype=np.float32).reshape(1, 1, 32, 32)
    y, i = ops.max_pool2d(opsnn.tensor(x), 3, 2, 1, return_indices=True)
    # the bottom-right tap of each window is its maximum on an increasing ramp
    oh, ow = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    want = np.minimum(2 * oh + 1, 31) * 32 + np.minimum(2 * ow + 1, 31)
    np.testing.assert_array_equal(i.numpy()[0, 0], want)
    np.testing.assert_array_equal(y.numpy()[0, 0], want.astype(np.float32))
