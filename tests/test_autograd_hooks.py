"""Tensor hooks (``register_hook``), ``retain_grad`` / ``retains_grad`` and ``detach_`` against torch on small
graphs: gradient replacement, order, removal, a tensor used twice, accumulation over two backward passes,
``autograd.grad``; inside a compiled step a hook is a typed error at tracing, never silently skipped."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.autograd import GradientShapeError
from opsnn.errors import ParamInvalidError

torch = pytest.importorskip("torch")

A = np.array([1.0, -2.0, 3.0], np.float32)


def _both(fn):
    """Run ``fn(module, x, log)`` with opsnn and with torch; returns both logs (lists of arrays / tags)."""
    logs = []
    for m in (opsnn, torch):
        x = m.tensor(A, requires_grad=True)
        log: list = []
        fn(m, x, log)
        logs.append(([np.asarray(v.detach().numpy() if hasattr(v, "detach") else v) for v in log], x))
    return logs


def _same(logs):
    (ours, x_ours), (theirs, x_torch) = logs
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    if x_torch.grad is None:
        assert x_ours.grad is None
    else:
        np.testing.assert_allclose(x_ours.grad.numpy(), x_torch.grad.numpy(), rtol=1e-6)


def _rec(log, tag, result=None):
    def hook(g):
        log.append(tag)
        log.append(g)
        return result(g) if result else None

    return hook


def test_leaf_hook_sees_the_summed_gradient_once_and_replaces_it():
    def run(m, x, log):
        x.register_hook(_rec(log, 1.0, lambda g: g * 3))
        x.register_hook(_rec(log, 2.0))  # runs second, sees the first one's result
        ((x * 2) + (x * x)).sum().backward()

    _same(_both(run))


def test_non_leaf_hook_retain_grad_and_accumulation_over_two_passes():
    def run(m, x, log):
        h = x * x
        h.register_hook(_rec(log, 1.0, lambda g: g * 10))
        h.retain_grad()
        assert h.retains_grad and not x.retains_grad
        out = (h * 2).sum() + (h * 3).sum()  # h used twice: its hook runs once on the sum
        out.backward(retain_graph=True)
        log.append(h.grad)
        out.backward()
        log.append(h.grad)  # accumulated, after the hook each time

    _same(_both(run))


def test_removal_order_and_the_root_itself():
    def run(m, x, log):
        y = (x * x).sum()
        h1 = y.register_hook(_rec(log, 1.0, lambda g: g * 2))
        y.register_hook(_rec(log, 2.0))
        h3 = x.register_hook(_rec(log, 3.0, lambda g: g + 1))
        y.backward(retain_graph=True)
        h1.remove()
        h3.remove()
        h3.remove()  # a second remove is harmless, as torch's
        y.backward()

    _same(_both(run))


def test_hooks_in_autograd_grad_and_multi_output_chains():
    def run(m, x, log):
        h = m.exp(x)
        h.register_hook(_rec(log, 1.0, lambda g: -g))
        h.retain_grad()
        x.register_hook(_rec(log, 2.0))
        z = m.tanh(h).sum()
        (g,) = m.autograd.grad(z, [x])
        log.append(g)
        log.append(h.grad)

    _same(_both(run))


def test_detach_in_place():
    for m in (opsnn, torch):
        x = m.tensor(A, requires_grad=True)
        y = x * 2
        assert y.detach_() is y and not y.requires_grad and y.is_leaf and y.grad_fn is None
        assert not (y * 3).requires_grad
        z = m.tensor(A, requires_grad=True)
        z.detach_()
        assert not z.requires_grad


def test_bad_hooks_are_typed_errors():
    x = opsnn.tensor(A, requires_grad=True)
    with pytest.raises(ParamInvalidError, match="register_hook: hook must be callable"):
        x.register_hook(3)
    with pytest.raises(ParamInvalidError, match="register_hook: this tensor .* does not require grad"):
        opsnn.tensor(A).register_hook(lambda g: g)
    with pytest.raises(ParamInvalidError, match="retain_grad: this tensor .* does not require grad"):
        opsnn.tensor(A).retain_grad()
    x.retain_grad()  # a leaf keeps its gradient anyway: a no-op, as torch
    assert not x.retains_grad
    h = x * 1
    h.register_hook(lambda g: g[:1])
    with pytest.raises(GradientShapeError, match=r"a hook on an output of Mul.*shape \(1,\)"):
        h.sum().backward()
    h = x * 1
    h.register_hook(lambda g: "no")
    with pytest.raises(GradientShapeError, match="returned a str"):
        h.sum().backward()
    h = x * 1
    h.register_hook(lambda g: g.double())
    with pytest.raises(GradientShapeError, match="dtype"):
        h.sum().backward()


def test_a_hook_in_a_compiled_step_is_refused_at_tracing():
    from opsnn.graph.tracing import TraceError

    lin = opsnn.nn.Linear(3, 1)
    opt = opsnn.optim.SGD(lin.parameters(), lr=0.1)
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32)

    def leaf_hooked(x, y):
        opt.zero_grad()
        loss = opsnn.nn.functional.mse_loss(lin(x), y)
        loss.backward()
        opt.step()
        return loss

    handle = lin.weight.register_hook(lambda g: g * 0)
    with pytest.raises(TraceError, match="tensor hook or retain_grad.* on a leaf"):
        opsnn.compile(leaf_hooked)(x, y)
    handle.remove()

    def inner_hooked(x, y):
        opt.zero_grad()
        out = lin(x)
        out.retain_grad()
        loss = opsnn.nn.functional.mse_loss(out, y)
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(TraceError, match=r"tensor hook or retain_grad\(\) on (?!a leaf)\w+"):
        opsnn.compile(inner_hooked)(x, y)
    step = opsnn.compile(leaf_hooked)  # the hook removed: compiles and runs
    step(x, y)
    step(x, y)
