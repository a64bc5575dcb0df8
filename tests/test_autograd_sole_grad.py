"""Leaf gradients a rule made for one input alone (conv dW, batch-norm dScale/dBias) become the
leaf's .grad without a copy; every other gradient is still copied (a rule may hand one tensor to
several inputs). Values against float64 einsum oracles of 1x1 convolutions."""

import numpy as np

import opsnn
from opsnn import ops
from opsnn.ops import gradients

RNG = np.random.default_rng(11)


def _t(a):
    return opsnn.tensor(np.asarray(a))


def _copies(fn) -> int:
    with opsnn.profiler.profile() as p:
        fn()
    return sum(r["calls"] for r in p.op_stats() if r["op"] == "Copy")


def _dw(x, g):  # d sum(conv1x1(x, w) * g) / dw, float64
    return np.einsum("nchw,nohw->oc", x.astype(np.float64), g.astype(np.float64))[:, :, None, None]


def test_conv_weight_gradient_is_taken_without_a_copy():
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 1, 1)).astype(np.float32)
    g = RNG.standard_normal((2, 4, 5, 4)).astype(np.float32)
    wt = _t(w).requires_grad_()

    def run():
        ops.conv2d(_t(x), wt, None).backward(_t(g))
        wt.grad.numpy()

    assert _copies(run) == 0
    # float32 sums of 40 products: relative to the largest
    np.testing.assert_allclose(wt.grad.numpy(), _dw(x, g), rtol=1e-5, atol=1e-5)
    assert not gradients.take_sole(wt.grad)  # the mark is taken once


def test_shared_and_unmarked_gradients_are_still_copied_and_accumulate():
    x1 = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    x2 = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    w = RNG.standard_normal((5, 3, 1, 1)).astype(np.float32)
    g = RNG.standard_normal((2, 5, 4, 4)).astype(np.float32)
    wt, at = _t(w).requires_grad_(), _t(x1).requires_grad_()
    # the weight feeds two convs (its second dW adds to the first); at feeds Add twice (one tensor, two inputs)
    y = ops.add(ops.conv2d(ops.add(at, at), wt, None), ops.conv2d(_t(x2), wt, None))
    y.backward(_t(g))
    np.testing.assert_allclose(wt.grad.numpy(), _dw(2 * x1, g) + _dw(x2, g), rtol=1e-5, atol=1e-5)
    dx = 2 * np.einsum("nohw,oc->nchw", g.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    np.testing.assert_allclose(at.grad.numpy(), dx, rtol=1e-5, atol=1e-5)
    # a second backward accumulates into the taken gradient without touching the first pass's tensor
    first = wt.grad
    kept = first.numpy().copy()
    ops.conv2d(_t(x2), wt, None).backward(_t(g))
    np.testing.assert_array_equal(first.numpy(), kept)
    np.testing.assert_allclose(wt.grad.numpy(), kept + _dw(x2, g), rtol=1e-5, atol=1e-5)


def test_batch_norm_parameter_gradients_are_distinct_tensors():
    bn = opsnn.nn.BatchNorm2d(3).train()
    x = _t(RNG.standard_normal((4, 3, 2, 2)).astype(np.float32))
    ops.sum(ops.mul(bn(x, relu=True), x)).backward()
    dw, db = bn.weight.grad, bn.bias.grad
    before = db.numpy().copy()
    dw.copy_(np.zeros(3, np.float32))  # in place on one parameter's gradient (clip_grad_norm_ scales so)
    np.testing.assert_array_equal(db.numpy(), before)
