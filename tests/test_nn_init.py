"""opsnn.nn.init's in-place initialisers with torch.nn.init's signatures and distributions: gains equal
torch's calculate_gain, bounds and standard deviations as torch's formulas give them (checked on large
tensors, 5-sigma tolerances), normal_'s (mean, std) order, truncation, orthogonality; seeded
repeatability and typed errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.nn import init


def _w(*shape):
    return opsnn.tensor(np.zeros(shape, np.float32))


def test_gains_match_torch():
    torch = pytest.importorskip("torch")
    for name, param in (
        ("linear", None),
        ("relu", None),
        ("tanh", None),
        ("sigmoid", None),
        ("selu", None),
        ("leaky_relu", None),
        ("leaky_relu", 0.2),
        ("conv2d", None),
    ):
        assert init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param), rel=1e-12)


def _std_close(a, want, n):
    assert abs(a.std() - want) < 5 * want / math.sqrt(2 * n), (a.std(), want)


def test_distributions_follow_torchs_formulas():
    n = 400 * 300
    w = _w(400, 300)  # fan_in 300, fan_out 400
    a = init.normal_(w, 0.5, 0.02).numpy()  # torch's order: mean, then std
    assert abs(a.mean() - 0.5) < 5 * 0.02 / math.sqrt(n)
    _std_close(a, 0.02, n)
    a = init.uniform_(w).numpy()
    assert a.min() >= 0 and a.max() < 1
    a = init.xavier_uniform_(w, gain=2.0).numpy()
    bound = 2.0 * math.sqrt(6 / 700)
    assert np.abs(a).max() <= bound + 1e-7 and np.abs(a).max() > 0.99 * bound
    _std_close(init.xavier_normal_(w).numpy(), math.sqrt(2 / 700), n)
    a = init.kaiming_uniform_(w, a=0.1, mode="fan_out").numpy()
    bound = math.sqrt(2 / 1.01) * math.sqrt(3 / 400)
    assert np.abs(a).max() <= bound + 1e-7 and np.abs(a).max() > 0.99 * bound
    _std_close(init.kaiming_normal_(w, mode="fan_in", nonlinearity="relu").numpy(), math.sqrt(2) / math.sqrt(300), n)
    a = init.trunc_normal_(w, mean=0.1, std=1.0, a=-0.5, b=0.8).numpy()
    assert a.min() >= -0.5 and a.max() <= 0.8 and len(np.unique(a)) > n // 2


def test_orthogonal_eye_constant():
    for shape in ((6, 4), (4, 6), (3, 2, 2)):
        w = init.orthogonal_(_w(*shape), gain=2.0).numpy().reshape(shape[0], -1)
        small = min(w.shape)
        g = w @ w.T if w.shape[0] == small else w.T @ w
        np.testing.assert_allclose(g, 4.0 * np.eye(small), atol=1e-5)
    np.testing.assert_array_equal(init.eye_(_w(2, 3)).numpy(), np.eye(2, 3))
    assert (init.constant_(_w(3), 0.25).numpy() == 0.25).all()


def test_seeded_and_model_initialisation_is_unchanged():
    with init.seeded(3):
        a = init.kaiming_normal_(_w(8, 4), mode="fan_out", nonlinearity="relu").numpy().copy()
    with init.seeded(3):
        b = init.kaiming_normal_(_w(8, 4), mode="fan_out", nonlinearity="relu").numpy()
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: init.calculate_gain("swish"), "calculate_gain: unknown nonlinearity 'swish'"),
        (lambda: init.kaiming_uniform_(_w(3, 3), mode="fan"), "mode must be 'fan_in' or 'fan_out'"),
        (lambda: init.xavier_uniform_(_w(3)), "fan in/out need a weight with >= 2 dims"),
        (lambda: init.trunc_normal_(_w(3), a=1.0, b=0.0), r"trunc_normal_: a must be below b"),
        (lambda: init.orthogonal_(_w(3)), "orthogonal_: needs a tensor of >= 2 dims"),
        (lambda: init.eye_(_w(2, 2, 2)), "eye_: needs a 2-D tensor"),
    ],
)
def test_misuse_is_a_typed_error(call, match):
    with pytest.raises(ParamInvalidError, match=match):
        call()
