"""The fused Adam/AdamW kernel (opsnn.kernels.cpu.optimizer.adam_step) against a float64 numpy
oracle of torch's update (moments stored in the parameter dtype and read back rounded): bit for
bit, for every flag combination of the vectorized path (no amsgrad) and the amsgrad loop, over
several chunks and non-finite parameters, gradients and a zero denominator."""

import math

import numpy as np
import pytest

from opsnn.kernels.cpu import optimizer as K

RNG = np.random.default_rng(5)


def _oracle(p, g, m, v, vmax, lr, b1, b2, eps, wd, step, amsgrad, decoupled, maximize):
    p, m, v = p.copy(), m.copy(), v.copy()
    vmax = None if vmax is None else vmax.copy()
    dt = p.dtype
    gi = g.astype(np.float64)
    gi = -gi if maximize else gi
    pi = p.astype(np.float64)
    if wd != 0.0:
        if decoupled:
            pi = pi * (1.0 - lr * wd)
        else:
            gi = gi + wd * pi
    mi = m.astype(np.float64)
    mi = mi + (1.0 - b1) * (gi - mi)
    vi = b2 * v.astype(np.float64) + (1.0 - b2) * gi * gi
    m[:] = mi.astype(dt)
    v[:] = vi.astype(dt)
    vi = v.astype(np.float64)
    if amsgrad:
        vmax[:] = np.maximum(vmax, vi).astype(dt)
        vi = vmax.astype(np.float64)
    with np.errstate(all="ignore"):
        denom = np.sqrt(vi) / math.sqrt(1.0 - b2**step) + eps
        p[:] = (pi - (lr / (1.0 - b1**step)) * m.astype(np.float64) / denom).astype(dt)
    return p, m, v, vmax


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("amsgrad", [0, 1])
@pytest.mark.parametrize("decoupled", [0, 1])
@pytest.mark.parametrize("maximize", [0, 1])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adam_step_is_the_float64_formula_bit_for_bit(dtype, amsgrad, decoupled, maximize, wd):
    sizes = [K.CHUNK * 2 + 17, 5, 1]  # several parallel chunks and a ragged end
    ps = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    gs = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    ms = [(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    vs = [np.abs(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    vmaxs = [np.abs(RNG.standard_normal(n) * 0.1).astype(dtype) if amsgrad else v for n, v in zip(sizes, vs)]
    ps[0][:4] = [np.inf, -np.inf, np.nan, 0.0]  # wd 0: an infinite parameter stays infinite
    gs[0][4:6] = [np.nan, np.inf]
    ms[1][0], vs[1][0], gs[1][0] = 0.0, 0.0, 0.0  # eps 0 below: 0 / 0 in the update, NaN as numpy
    step = 3.0
    hyper = np.zeros((len(sizes), 7))
    flags = np.zeros((len(sizes), 3), np.int64)
    eps_of = [1e-8, 0.0, 1e-6]
    lrs = [1e-3, 2e-3, 5e-2]
    for t in range(len(sizes)):
        b1, b2 = 0.9, 0.999
        hyper[t] = (lrs[t], b1, b2, eps_of[t], wd, 1.0 - b1**step, 1.0 - b2**step)
        flags[t] = (amsgrad, decoupled, maximize)
    want = [
        _oracle(ps[t], gs[t], ms[t], vs[t], vmaxs[t] if amsgrad else None, lrs[t], 0.9, 0.999, eps_of[t], wd, step,
                amsgrad, decoupled, maximize)
        for t in range(len(sizes))
    ]  # fmt: skip
    tl = K.typed_list
    K.adam_step(tl(ps), tl(gs), tl(ms), tl(vs), tl(vmaxs), K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        wp, wm, wv, wvmax = want[t]
        np.testing.assert_array_equal(ps[t], wp, err_msg=f"param {t}")
        np.testing.assert_array_equal(ms[t], wm, err_msg=f"exp_avg {t}")
        np.testing.assert_array_equal(vs[t], wv, err_msg=f"exp_avg_sq {t}")
        if amsgrad:
            np.testing.assert_array_equal(vmaxs[t], wvmax, err_msg=f"max_exp_avg_sq {t}")
    if wd == 0.0 or not decoupled:
        assert np.isposinf(ps[0][0]) or np.isnan(ps[0][0])  # never turned finite


def _sgd_oracle(p, g, b, lr, mom, damp, wd, nesterov, maximize, first):
    p, b = p.copy(), b.copy()
    with np.errstate(all="ignore"):  # inf - inf: NaN, as the kernel
        return _sgd_formula(p, g, b, lr, mom, damp, wd, nesterov, maximize, first)


def _sgd_formula(p, g, b, lr, mom, damp, wd, nesterov, maximize, first):
    gi = g.astype(np.float64)
    gi = -gi if maximize else gi
    pi = p.astype(np.float64)
    if wd != 0.0:
        gi = gi + wd * pi
    if mom != 0.0:
        b[:] = (gi if first else mom * b.astype(np.float64) + (1.0 - damp) * gi).astype(b.dtype)
        bi = b.astype(np.float64)
        gi = gi + mom * bi if nesterov else bi
    p[:] = (pi - lr * gi).astype(p.dtype)
    return p, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mom, damp", [(0.0, 0.0), (0.9, 0.0), (0.8, 0.1)])
@pytest.mark.parametrize("nesterov", [0, 1])
@pytest.mark.parametrize("maximize", [0, 1])
@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_sgd_step_is_the_float64_formula_bit_for_bit(dtype, mom, damp, nesterov, maximize, first, wd):
    sizes = [K.CHUNK + 3, 7]
    ps = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    gs = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    bs = [(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    ps[0][:3] = [np.inf, np.nan, -0.0]
    gs[0][3] = np.nan
    lrs = [0.01, 0.05]
    hyper = np.array([[lr, mom, damp, wd] for lr in lrs])
    flags = np.array([[nesterov, maximize, first]] * len(sizes), np.int64)
    want = [
        _sgd_oracle(ps[t], gs[t], bs[t], lrs[t], mom, damp, wd, nesterov, maximize, first) for t in range(len(sizes))
    ]
    tl = K.typed_list
    K.sgd_step(tl(ps), tl(gs), tl(bs), K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        np.testing.assert_array_equal(ps[t], want[t][0], err_msg=f"param {t}")
        np.testing.assert_array_equal(bs[t], want[t][1], err_msg=f"momentum buffer {t}")
