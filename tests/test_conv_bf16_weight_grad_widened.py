"""bfloat16 convolution weight gradients on small or strided output planes (libraries.conv_backward's
rule, ``bf16_weight_gradient_in_float32``): 2-D one-group ones of 256+ output channels are one oneDNN bf16 matmul over the windows
of all images (``conv_backward_weight_matmul``, tests/test_backward_convbw.py has its NaN/Inf cases);
narrower (< 256 output channels) or grouped ones run oneDNN's float32 backward-weights primitive on widened copies of X and dY, dW rounded to
bfloat16 once: bit-equal to the float32 kernel run on the widened inputs and rounded, NaN/Inf where it has
them. Both close to the float64 reference (half a bf16 ulp plus float32 summation error). Other planes
keep oneDNN's native bf16 primitive."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD

BF16 = _dt.bfloat16
RNG = np.random.default_rng(907)
NATIVE = KD.unavailable() is None and KD.bf16_unavailable() is None
pytestmark = pytest.mark.skipif(not NATIVE, reason="no native bfloat16 oneDNN convolutions on this CPU")

# (X shape, W shape, strides, pads[, group]): ResNet's deepest 3x3 (2x2 planes), strided 3x3s, one group
# (one matmul) and two (widened); the bf16 primitive stays for a 6x6 stride-1 3x3, a strided 1x1 onto 2x2
# planes and a three-channel strided stem
ONE_MATMUL = {
    "3x3_2x2_planes": ((4, 32, 2, 2), (256, 32, 3, 3), (1, 1), (1, 1, 1, 1)),
    "3x3_stride2": ((3, 16, 9, 9), (256, 16, 3, 3), (2, 2), (1, 1, 1, 1)),
}
WIDENED = {
    "3x3_2x2_planes_narrow": ((4, 32, 2, 2), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "3x3_stride2_narrow": ((2, 16, 8, 8), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    "3x3_2x2_planes_2_groups": ((4, 32, 2, 2), (256, 16, 3, 3), (1, 1), (1, 1, 1, 1), 2),
    "3x3_stride2_2_groups": ((3, 32, 9, 9), (24, 16, 3, 3), (2, 2), (1, 1, 1, 1), 2),
}
NATIVE_BF16 = {
    "3x3_6x6_planes": ((2, 16, 6, 6), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1)),
    "1x1_stride2_2x2_planes": ((2, 16, 4, 4), (32, 16, 1, 1), (2, 2), (0, 0, 0, 0)),
    "7x7_stem": ((2, 3, 16, 16), (16, 3, 7, 7), (2, 2), (3, 3, 3, 3)),
}


def _attrs(w_shape, s, pads, group=1):
    return {"strides": list(s), "pads": list(pads), "dilations": [1, 1], "group": group, "weight_shape": list(w_shape)}


def _y_shape(x_shape, w_shape, s, pads):
    return (x_shape[0], w_shape[0]) + tuple(
        (x_shape[2 + i] + pads[i] + pads[2 + i] - w_shape[2 + i]) // s[i] + 1 for i in range(2)
    )


def _dw(x, dy, attrs):
    with opsnn.no_grad():
        out = ops.run_op("ConvBackwardWeight", [opsnn.tensor(x), opsnn.tensor(dy)], attrs, domain="opsnn")
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


def _reference(x, dy, attrs):
    rec = ops.get_op("ConvBackwardWeight", "opsnn")
    want = rec.reference([x.astype(np.float64), dy.astype(np.float64)], rec.bind_attrs(attrs))
    return want[0] if isinstance(want, (tuple, list)) else want


def _close_to_reference(got, x, dy, attrs):
    want = _reference(x, dy, attrs)
    tol = 2**-8 * np.abs(want) + 1e-4 * np.abs(want).max()
    assert (np.abs(got.astype(np.float64) - want) <= tol).all()


@pytest.mark.parametrize("name", sorted(ONE_MATMUL))
def test_one_group_weight_gradient_is_one_bf16_matmul(name):
    x_shape, w_shape, s, pads = ONE_MATMUL[name]
    y_shape = _y_shape(x_shape, w_shape, s, pads)
    assert KL.bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, s)
    choice = KL.conv_backward("weights", x_shape, w_shape, y_shape, s, pads, (1, 1), 1, BF16)
    assert choice.kernel == "conv_backward_weight_matmul", choice
    x = RNG.standard_normal(x_shape).astype(np.float32).astype(BF16)
    dy = RNG.standard_normal(y_shape).astype(np.float32).astype(BF16)
    got = _dw(x, dy, _attrs(w_shape, s, pads))
    assert got.dtype == BF16 and got.shape == w_shape
    _close_to_reference(got, x, dy, _attrs(w_shape, s, pads))


@pytest.mark.parametrize("name", sorted(WIDENED))
def test_widened_weight_gradient_is_the_float32_kernel_rounded(name):
    x_shape, w_shape, s, pads, group = WIDENED[name]
    y_shape = _y_shape(x_shape, w_shape, s, pads)
    assert KL.bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, s)
    choice = KL.conv_backward("weights", x_shape, w_shape, y_shape, s, pads, (1, 1), group, BF16)
    assert choice.library == "onednn" and choice.compute == "float32", choice
    x = RNG.standard_normal(x_shape).astype(np.float32).astype(BF16)
    dy = RNG.standard_normal(y_shape).astype(np.float32).astype(BF16)
    attrs = _attrs(w_shape, s, pads, group)
    got = _dw(x, dy, attrs)
    assert got.dtype == BF16 and got.shape == w_shape
    f32 = _dw(x.astype(np.float32), dy.astype(np.float32), attrs)
    np.testing.assert_array_equal(got.view(np.uint16), f32.astype(BF16).view(np.uint16))
    _close_to_reference(got, x, dy, attrs)


def test_widened_weight_gradient_keeps_nan_and_inf_as_float32():
    x_shape, w_shape, s, pads, group = WIDENED["3x3_2x2_planes_2_groups"]
    y_shape = _y_shape(x_shape, w_shape, s, pads)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    dy = RNG.standard_normal(y_shape).astype(np.float32)
    x[0, 3, 1, 1] = np.nan
    dy[1, 5, 0, 0] = np.inf
    x, dy = x.astype(BF16), dy.astype(BF16)
    attrs = _attrs(w_shape, s, pads, group)
    got = _dw(x, dy, attrs).astype(np.float32)
    f32 = _dw(x.astype(np.float32), dy.astype(np.float32), attrs).astype(BF16).astype(np.float32)
    assert np.isnan(got).any() and np.isinf(got).any()
    np.testing.assert_array_equal(got, f32)


@pytest.mark.parametrize("name", sorted(NATIVE_BF16))
def test_other_planes_keep_the_native_bf16_primitive(name):
    x_shape, w_shape, s, pads = NATIVE_BF16[name]
    y_shape = _y_shape(x_shape, w_shape, s, pads)
    assert not KL.bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, s)
    choice = KL.conv_backward("weights", x_shape, w_shape, y_shape, s, pads, (1, 1), 1, BF16)
    assert choice.library == "onednn" and choice.compute is None, choice
    prim = KD.conv_backward("weights", x_shape, w_shape, y_shape, s, pads, (1, 1), 1, BF16, choice.formats)
    assert not prim.widened and "bf16" in prim.impl, prim.describe()
    x = RNG.standard_normal(x_shape).astype(np.float32).astype(BF16)
    dy = RNG.standard_normal(y_shape).astype(np.float32).astype(BF16)
    attrs = _attrs(w_shape, s, pads)
    _close_to_reference(_dw(x, dy, attrs), x, dy, attrs)


def test_one_matmul_keeps_its_windows_under_the_byte_cap():
    # a strided 3x3 at 56x56 on 256 images: 200704 windows of 1152 values (462 MB of rows) stay widened
    x_shape, w_shape, s, pads = (256, 128, 56, 56), (256, 128, 3, 3), (2, 2), (1, 1, 1, 1)
    y_shape = _y_shape(x_shape, w_shape, s, pads)
    assert KL.bf16_weight_gradient_in_float32(x_shape, w_shape, y_shape, s)
    choice = KL.conv_backward("weights", x_shape, w_shape, y_shape, s, pads, (1, 1), 1, BF16)
    assert choice.kernel == "conv_backward_weight_onednn" and choice.compute == "float32", choice
