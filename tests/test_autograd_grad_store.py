"""The first gradient a leaf stores: kept as it is where the engine can prove it owns it (a whole
pool storage a backward kernel made in this pass, handed to that leaf only), copied otherwise.
Values against float64 numpy; aliasing checked with np.shares_memory; in-place clipping and
unscaling must scale each gradient exactly once."""

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.tensor import Tensor

RNG = np.random.default_rng(4031)


def _param(shape):
    return opsnn.tensor(RNG.standard_normal(shape).astype(np.float32)).requires_grad_()


@pytest.fixture
def clones(monkeypatch):
    """Counts Tensor.clone calls (the engine's copy of a stored gradient)."""
    calls = []
    real = Tensor.clone

    def spy(self):
        calls.append(tuple(self.shape))
        return real(self)

    monkeypatch.setattr(Tensor, "clone", spy)
    return calls


def test_a_matmul_weight_gradient_is_kept_without_a_copy_and_accumulates(clones):
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    c = RNG.standard_normal((5, 3)).astype(np.float32)
    w = _param((4, 3))
    want = x.astype(np.float64).T @ c
    ops.sum(ops.mul(ops.matmul(opsnn.tensor(x), w), opsnn.tensor(c))).backward()
    assert clones == []  # the MatMul backward's output became .grad as it is
    first = w.grad
    np.testing.assert_allclose(first.numpy(), want, rtol=1e-5, atol=1e-5)
    ops.sum(ops.mul(ops.matmul(opsnn.tensor(x), w), opsnn.tensor(c))).backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first.numpy(), want, rtol=1e-5, atol=1e-5)  # accumulation made a new tensor


def test_two_parameters_fed_by_one_add_get_separate_gradients():
    a, b = _param((3, 4)), _param((3, 4))
    c = RNG.standard_normal((3, 4)).astype(np.float32)
    ops.sum(ops.mul(ops.add(a, b), opsnn.tensor(c))).backward()
    assert not np.shares_memory(a.grad.numpy(), b.grad.numpy())
    a.grad.numpy()[...] *= 2  # an in-place change of one gradient leaves the other alone
    np.testing.assert_array_equal(b.grad.numpy(), c)
    np.testing.assert_array_equal(a.grad.numpy(), 2 * c)


def test_tied_embedding_and_lm_head_sum_both_uses():
    V, E, S = 7, 4, 5
    w = _param((V, E))
    ids = np.array([1, 3, 3, 0, 6])
    c = RNG.standard_normal((S, V)).astype(np.float32)
    h = ops.embedding(opsnn.tensor(ids), w)  # (S, E)
    logits = ops.matmul(h, ops.transpose(w, [1, 0]))  # (S, V): the head is the same matrix
    ops.sum(ops.mul(logits, opsnn.tensor(c))).backward()
    w64, c64 = w.detach().numpy().astype(np.float64), c.astype(np.float64)
    want = c64.T @ w64[ids]  # the head's use
    np.add.at(want, ids, c64 @ w64)  # the embedding's use
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-5, atol=1e-5)


def test_clip_grad_norm_and_unscale_scale_each_gradient_once():
    a, b, w = _param((3, 4)), _param((3, 4)), _param((4, 2))
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    c = RNG.standard_normal((3, 2)).astype(np.float32)
    opt = opsnn.optim.SGD([a, b, w], lr=0.0)
    scaler = opsnn.amp.GradScaler(init_scale=8.0)

    def loss():
        s = ops.add(ops.add(a, b), opsnn.tensor(x))
        return ops.sum(ops.mul(ops.matmul(s, w), opsnn.tensor(c)))

    scaler.scale(loss()).backward()
    scaler.unscale_(opt)
    s64 = a.detach().numpy().astype(np.float64) + b.detach().numpy() + x
    g_s = c.astype(np.float64) @ w.detach().numpy().astype(np.float64).T
    g_w = s64.T @ c
    for p, want in ((a, g_s), (b, g_s), (w, g_w)):
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-5, atol=1e-5)
    total = np.sqrt(2 * np.sum(g_s**2) + np.sum(g_w**2))
    got = opsnn.nn.utils.clip_grad_norm_([a, b, w], 0.5)
    np.testing.assert_allclose(float(got.item()), total, rtol=1e-5)
    coef = 0.5 / (total + 1e-6)
    for p, want in ((a, g_s), (b, g_s), (w, g_w)):
        np.testing.assert_allclose(p.grad.numpy(), want * coef, rtol=1e-5, atol=1e-6)


def test_user_gradients_and_broadcast_views_are_copied():
    p = _param((2, 3))
    g = opsnn.tensor(np.ones((2, 3), np.float32))
    ops.reshape(p, (3, 2)).backward(ops.reshape(g, (3, 2)))  # the reshape's rule passes the user's tensor on
    assert not np.shares_memory(p.grad.numpy(), g.numpy())
    q = _param((2, 3))
    ops.sum(q).backward()  # the gradient is a broadcast of a scalar
    assert q.grad.numpy().flags.c_contiguous and q.grad.numpy().flags.writeable
    q.grad.numpy()[0, 0] = 5.0
    np.testing.assert_array_equal(q.grad.numpy(), [[5, 1, 1], [1, 1, 1]])
    leaf = _param((4,))
    user = opsnn.tensor(np.arange(4, dtype=np.float32))
    leaf.backward(user)  # a leaf root: its .grad is a copy of the user's tensor
    user.numpy()[...] = 0
    np.testing.assert_array_equal(leaf.grad.numpy(), np.arange(4))
