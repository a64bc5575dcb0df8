"""bfloat16 ConvBackwardWeight with small output planes: where oneDNN's bfloat16 choice is its
avx512_core_bf16 direct JIT code (several times slower than float32 on such planes),
conv_backward_weight_onednn_f32 runs oneDNN's float32 primitive on widened X and dY through the
fp32 adapter. Selection asserted against libraries.bf16_weight_grad_in_float32 for the CPU found;
values against a float64 oracle (einsum over kernel taps of the padded input) on the same
bf16-rounded inputs: within half a bf16 ulp (2**-8 relative) plus float32 summation error."""

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import ops
from opsnn.kernels.cpu import libraries as KL
from opsnn.ops import executor

BF16 = _dt.bfloat16
RNG = np.random.default_rng(5512)
# (X shape, weight shape, stride, pad)
CASES = {
    "512ch_2x2": ((4, 64, 2, 2), (64, 64, 3, 3), 1, 1),
    "stride2_4x4": ((4, 32, 8, 8), (48, 32, 3, 3), 2, 1),
    "large_plane": ((2, 16, 20, 20), (16, 16, 3, 3), 1, 1),  # 400 pixels: stays on the bf16 primitive
}


def _oracle(x, dy, ws, s, p):
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    dy = dy.astype(np.float64)
    oh, ow = dy.shape[2:]
    dw = np.zeros(ws)
    for i in range(ws[2]):
        for j in range(ws[3]):
            win = x[:, :, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s]
            dw[:, :, i, j] = np.einsum("nchw,nkhw->kc", win, dy)
    return dw


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_weight_grad_kernel_choice_and_values(case):
    xs, ws, s, p = CASES[case]
    oh = (xs[2] + 2 * p - ws[2]) // s + 1
    ys = (xs[0], ws[0], oh, oh)
    x = RNG.standard_normal(xs).astype(np.float32).astype(BF16)
    dy = RNG.standard_normal(ys).astype(np.float32).astype(BF16)
    attrs = {"strides": [s, s], "pads": [p] * 4, "dilations": [1, 1], "group": 1, "weight_shape": list(ws)}
    ex = executor.prepare(ops.get_op("ConvBackwardWeight", "opsnn"), [opsnn.tensor(x), opsnn.tensor(dy)], attrs)
    why = KL.bf16_weight_grad_in_float32(xs, ws, ys, (s, s), (p,) * 4, (1, 1), 1)
    if why is None:
        assert ex.kernel_name == "conv_backward_weight_onednn_f32" and ex.adapter
    else:
        assert ex.kernel_name != "conv_backward_weight_onednn_f32", why
    if case == "large_plane":
        assert why is not None and "output plane" in why
    res = ex.run()
    got = (res[0] if isinstance(res, (list, tuple)) else res).numpy()
    assert got.dtype == BF16
    want = _oracle(x, dy, ws, s, p)
    tol = 2.0**-8 * np.abs(want) + 1e-4 * np.abs(want).max()
    assert (np.abs(got.astype(np.float64) - want) <= tol).all()


def test_bf16_weight_grad_f32_kernel_keeps_nan():
    xs, ws = (2, 32, 2, 2), (32, 32, 3, 3)
    x = RNG.standard_normal(xs).astype(np.float32).astype(BF16)
    dy = RNG.standard_normal(xs).astype(np.float32).astype(BF16)
    x[1, 3, 1, 1] = np.nan
    attrs = {"strides": [1, 1], "pads": [1] * 4, "dilations": [1, 1], "group": 1, "weight_shape": list(ws)}
    got = ops.run_op("ConvBackwardWeight", [opsnn.tensor(x), opsnn.tensor(dy)], attrs, domain="opsnn")[0].numpy()
    want = _oracle(x, dy, ws, 1, 1)
    # every dW[:, 3] tap that reads x[1, 3, 1, 1] is NaN in the oracle; oneDNN keeps them
    assert np.isnan(got[:, 3].astype(np.float32)).all() == np.isnan(want[:, 3]).all()
    fin = ~np.isnan(want)
    assert np.array_equal(np.isnan(got.astype(np.float32))[fin], np.zeros(fin.sum(), bool))
