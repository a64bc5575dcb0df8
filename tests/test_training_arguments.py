"""Mistyped arguments of the training API (optimizers, clipping, GradScaler, manual_seed, tensor
constructors, compile) are typed errors that name the argument, never a bare ValueError or a value
that silently flips or zeroes gradients; torch's accepted forms keep working."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, ParamInvalidError


def _linear():
    return opsnn.nn.Linear(3, 2)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: opsnn.optim.SGD(ps, lr="0.1"), r"SGD: lr must be a number, got '0.1'"),
        (lambda ps: opsnn.optim.SGD(ps, lr=None), r"SGD: lr must be a number, got None"),
        (lambda ps: opsnn.optim.SGD(ps, lr=0.1, momentum="0.9"), r"SGD: momentum must be a number"),
        (lambda ps: opsnn.optim.Adam(ps, lr=[1e-3]), r"Adam: lr must be a number, got list"),
        (lambda ps: opsnn.optim.AdamW(ps, betas=("a", 0.9)), r"AdamW: betas must be a number"),
        (lambda ps: opsnn.optim.AdamW(ps, betas=0.9), r"AdamW: betas must be two numbers in \[0, 1\)"),
        (lambda ps: opsnn.optim.Adam(ps, eps="tiny"), r"Adam: eps must be a number"),
    ],
)
def test_optimizer_options_must_be_numbers(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make(_linear().parameters())


def test_optimizer_options_are_stored_as_floats():
    opt = opsnn.optim.AdamW(_linear().parameters(), lr=np.float32(0.5), weight_decay=0)
    g = opt.param_groups[0]
    assert type(g["lr"]) is float and type(g["weight_decay"]) is float and g["lr"] == 0.5


def _with_grads():
    lin = _linear()
    g = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    lin.weight.grad = opsnn.tensor(g)
    return lin, g


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda ps: opsnn.nn.utils.clip_grad_norm_(ps, -1.0), r"max_norm must be >= 0, got -1.0"),
        (lambda ps: opsnn.nn.utils.clip_grad_norm_(ps, float("nan")), r"max_norm must be >= 0, got nan"),
        (lambda ps: opsnn.nn.utils.clip_grad_norm_(ps, "1"), r"max_norm must be a number, got '1'"),
        (lambda ps: opsnn.nn.utils.clip_grad_norm_(ps, 1.0, "fro"), r"norm_type must be a number > 0 or 'inf'"),
        (lambda ps: opsnn.nn.utils.clip_grad_norm_(ps, 1.0, 0), r"norm_type must be a number > 0 or 'inf', got 0"),
        (lambda ps: opsnn.nn.utils.clip_grad_value_(ps, -0.5), r"clip_value must be >= 0, got -0.5"),
    ],
)
def test_clipping_rejects_values_that_would_flip_or_zero_gradients(call, match):
    lin, g = _with_grads()
    with pytest.raises(ParamInvalidError, match=match):
        call(lin.parameters())
    np.testing.assert_array_equal(lin.weight.grad.numpy(), g)  # untouched


def test_clip_grad_norm_takes_inf_as_a_string_as_torch_does():
    lin, g = _with_grads()
    total = opsnn.nn.utils.clip_grad_norm_(lin.parameters(), 1.0, "inf")
    assert float(total.item()) == 2.5
    np.testing.assert_allclose(lin.weight.grad.numpy(), g / (2.5 + 1e-6), rtol=1e-6)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"init_scale": -1.0}, r"init_scale must be positive and finite, got -1.0"),
        ({"init_scale": float("inf")}, r"init_scale must be positive and finite"),
        ({"init_scale": "big"}, r"init_scale must be a number, got 'big'"),
        ({"growth_factor": None}, r"growth_factor must be a number, got None"),
        ({"growth_interval": 2.5}, r"growth_interval must be a positive int, got 2.5"),
        ({"growth_interval": "10"}, r"growth_interval must be a positive int, got 10"),
    ],
)
def test_grad_scaler_arguments(kw, match):
    with pytest.raises(ParamInvalidError, match=match):
        opsnn.amp.GradScaler(**kw)


def test_manual_seed_takes_torchs_range_and_remaps_negative_seeds():
    for bad in ("abc", 1.5, True, 2**64, -(2**63) - 1):
        with pytest.raises(ParamInvalidError, match=r"manual_seed: seed must be an int in \[-2\*\*63, 2\*\*64 - 1\]"):
            opsnn.manual_seed(bad)
    opsnn.manual_seed(-1)
    a = opsnn.nn.Linear(4, 4).weight.numpy().copy()
    opsnn.manual_seed(0xFFFF_FFFF_FFFF_FFFF - 1)
    np.testing.assert_array_equal(opsnn.nn.Linear(4, 4).weight.numpy(), a)
    opsnn.manual_seed(np.int64(5))


def test_tensor_constructors_take_requires_grad_as_torch_does():
    x = opsnn.tensor([1.0, 2.0], requires_grad=True)
    assert x.requires_grad and x.is_leaf
    w = opsnn.ones((2,), requires_grad=True)
    opsnn.ops.sum(opsnn.ops.mul(x, w)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])
    for make in (opsnn.zeros, opsnn.empty):
        assert make((3,), requires_grad=True).requires_grad
    assert opsnn.full((2,), 3.0, requires_grad=True).requires_grad
    assert not opsnn.tensor([1.0]).requires_grad
    with pytest.raises(DTypeError, match="only floating tensors can require grad, got int64"):
        opsnn.tensor(np.arange(3), requires_grad=True)


def test_compile_of_something_that_is_not_a_model_names_what_it_takes():
    with pytest.raises(ParamInvalidError, match=r"compile: expected a Graph, an ONNX model .* got int"):
        opsnn.compile(5)
