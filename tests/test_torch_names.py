"""opsnn.ops.torch_names (torch's names composed of functional ops) and their top-level and Tensor
method forms, against torch on the same inputs (values; gradients where differentiable), NaN and Inf
included where the function defines them; random constructors repeatable from opsnn.manual_seed and
refused inside a traced function; inference_mode."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.graph.tracing import TraceError

RNG = np.random.default_rng(3)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)
V = np.array([3.0, np.nan, 1.0, np.inf, -np.inf, 2.0, 1.0], np.float32)

# name -> (callable on the module (opsnn or torch) and its inputs, arrays, differentiable)
CASES = {
    "cat": (lambda m, a, b: m.cat([a, b], dim=-1), [A, B], True),
    "stack": (lambda m, a, b: m.stack([a, b], dim=1), [A, B], True),
    "stack_last": (lambda m, a, b: m.stack((a, b), -1), [A, B], True),
    "std": (lambda m, a: m.std(a, 1, keepdim=True), [A], True),
    "std_all": (lambda m, a: m.std(a), [A], True),
    "flip": (lambda m, a: m.flip(a, (0, 1)), [A], True),
    "roll": (lambda m, a: m.roll(a, (1, -5), (0, 1)), [A], True),
    "roll_flat": (lambda m, a: m.roll(a, 5), [A], True),
    "outer": (lambda m, a, b: m.outer(a[0], b[1]), [A, B], True),
    "norm2": (lambda m, a: m.norm(a), [A], True),
    "norm1_dim": (lambda m, a: m.norm(a, p=1, dim=1), [A], True),
    "norm3": (lambda m, a: m.norm(a, p=3, dim=0, keepdim=True), [A], True),
    "norm_inf": (lambda m, a: m.norm(a, p=float("inf")), [A], False),
    "mm": (lambda m, a, b: m.mm(a, b.T if m is not opsnn else b.T), [A, B], True),
    "repeat_interleave": (lambda m, a: m.repeat_interleave(a, 2, dim=1), [A], True),
    "repeat_interleave_flat": (lambda m, a: m.repeat_interleave(a, 3), [A], True),
    "sort_values": (lambda m, v: m.sort(v).values, [V], False),
    "sort_desc_indices": (lambda m, v: m.sort(v, descending=True).indices, [V], False),
    "argsort": (lambda m, a: m.argsort(a, dim=0), [A], False),
    "isclose": (lambda m, a, b: m.isclose(a, b + 1e-6, rtol=1e-3), [A, A], False),
    "isclose_nan": (lambda m, v: m.isclose(v, v, equal_nan=True), [V], False),
}


def _torch_call(torch, fn, arrays, grad):
    ts = [torch.tensor(a, requires_grad=grad) for a in arrays]
    return ts, fn(torch, *ts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    torch = pytest.importorskip("torch")
    fn, arrays, grad = CASES[name]
    xs = [opsnn.tensor(a, requires_grad=grad) for a in arrays]
    got = fn(opsnn.ops, *xs)
    ts, want = _torch_call(torch, fn, arrays, grad)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    if grad:
        seed = RNG.standard_normal(tuple(want.shape)).astype(np.float32)
        opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(seed))).backward()
        (want * torch.from_numpy(seed)).sum().backward()
        for x, t in zip(xs, ts):
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_method_and_top_level_forms():
    t = opsnn.tensor(A)
    np.testing.assert_array_equal(t.flip(1).numpy(), A[:, ::-1])
    np.testing.assert_array_equal(t.roll(1, 0).numpy(), np.roll(A, 1, 0))
    np.testing.assert_array_equal(t.sort(dim=1).values.numpy(), np.sort(A, 1))
    np.testing.assert_array_equal(t.argsort(1).numpy(), np.argsort(A, 1))
    np.testing.assert_allclose(t.std().numpy(), A.astype(np.float64).std(ddof=1), rtol=1e-5)
    np.testing.assert_allclose(t.norm().numpy(), np.linalg.norm(A), rtol=1e-6)
    assert t.allclose(A) and t.equal(opsnn.tensor(A)) and not t.equal(opsnn.tensor(A[:2]))
    np.testing.assert_array_equal(opsnn.cat([t, t]).numpy(), np.concatenate([A, A]))
    np.testing.assert_array_equal(opsnn.stack([t, t], -1).numpy(), np.stack([A, A], -1))
    assert opsnn.zeros_like(t).shape == (3, 4) and opsnn.ones_like(t, dtype="int64").dtype == np.int64
    assert opsnn.full_like(t, 7).numpy().max() == 7 and opsnn.empty_like(t).dtype == np.float32
    np.testing.assert_array_equal(opsnn.eye(2, 3).numpy(), np.eye(2, 3))
    np.testing.assert_allclose(opsnn.linspace(0, 1, 5).numpy(), [0, 0.25, 0.5, 0.75, 1])
    assert opsnn.is_tensor(t) and not opsnn.is_tensor(A)
    assert opsnn.float32 == np.float32 and opsnn.int64 == np.int64
    x, y = opsnn.ops.meshgrid(opsnn.tensor([1.0, 2.0]), opsnn.tensor([3.0, 4.0, 5.0]), indexing="xy")
    gx, gy = np.meshgrid([1.0, 2.0], [3.0, 4.0, 5.0], indexing="xy")
    np.testing.assert_array_equal(x.numpy(), gx)
    np.testing.assert_array_equal(y.numpy(), gy)
    got = opsnn.ops.bmm(opsnn.tensor(A[None]), opsnn.tensor(B.T[None])).numpy()
    np.testing.assert_allclose(got, (A.astype(np.float64) @ B.T)[None], rtol=1e-5, atol=1e-6)


def test_random_constructors_are_repeatable_and_refused_when_traced():
    opsnn.manual_seed(4)
    a = (
        opsnn.randn(3, 2).numpy(),
        opsnn.rand((4,)).numpy(),
        opsnn.randint(5, size=(6,)).numpy(),
        opsnn.randperm(7).numpy(),
    )
    opsnn.manual_seed(4)
    b = (
        opsnn.randn(3, 2).numpy(),
        opsnn.rand((4,)).numpy(),
        opsnn.randint(5, size=(6,)).numpy(),
        opsnn.randperm(7).numpy(),
    )
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert a[0].dtype == np.float32 and 0 <= a[1].min() and a[1].max() < 1
    assert a[2].dtype == np.int64 and a[2].max() < 5 and sorted(a[3].tolist()) == list(range(7))
    assert opsnn.randn(2, requires_grad=True).requires_grad
    with pytest.raises(TraceError, match="randn: random values drawn while a function is traced"):
        opsnn.compile(lambda x: opsnn.ops.add(x, opsnn.randn(2)), [np.zeros(2, np.float32)])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: opsnn.cat(opsnn.tensor(A)), "cat: expected a non-empty list or tuple of tensors, got Tensor"),
        (lambda: opsnn.cat([A, B], dim=2), "cat: dim 2 out of range for a 2-D result"),
        (lambda: opsnn.stack([A, B[:2]]), r"stack: the tensors must have one shape"),
        (lambda: opsnn.ops.roll(A, (1, 2), 0), r"roll: one shift per dim"),
        (lambda: opsnn.ops.outer(A, B), "outer: expected two 1-D tensors"),
        (lambda: opsnn.ops.mm(A[0], B), "mm: expected two 2-D tensors"),
        (lambda: opsnn.ops.norm(A, p=0), "norm: p must be > 0"),
        (lambda: opsnn.ops.repeat_interleave(A, [1, 2], dim=1), r"repeat_interleave: repeats must be an int >= 0 or 4"),
        (lambda: opsnn.randint(3, 3), r"randint: low must be below high"),
        (lambda: opsnn.randn(2, -1), "randn: sizes must be non-negative ints"),
    ],
)
def test_misuse_is_a_typed_error(call, match):
    with pytest.raises(ParamInvalidError, match=match):
        call()


def test_inference_mode_turns_recording_off_and_decorates():
    w = opsnn.tensor(A, requires_grad=True)
    with opsnn.inference_mode():
        assert not opsnn.ops.mul(w, 2.0).requires_grad
    with opsnn.inference_mode(False):
        assert opsnn.ops.mul(w, 2.0).requires_grad

    @opsnn.inference_mode()
    def f(x):
        return opsnn.ops.mul(x, 2.0)

    assert not f(w).requires_grad and opsnn.ops.mul(w, 2.0).requires_grad
