"""BatchNormalization / BatchNormalizationGrad on float32 over every plane size: short planes
(fewer than kernels.cpu.norm.SMALL_PLANE values: the deep layers of a CNN on small images) run
channel-major, longer ones plane by plane with float32 sums inside a plane; both, serial and
parallel, against the records' float64 references, with NaN and Inf in the input and the gradient.

Tolerances: float32 outputs of a float64 normalisation, rtol 1e-5 / atol 1e-5 (the gradients'
sums cancel, so a few ulps of the largest term)."""

import numpy as np
import pytest

import opsnn
from opsnn import ops
from opsnn.kernels.cpu import norm as KN

RNG = np.random.default_rng(2812)
# (N, C, H, W): plane sizes 1, 4, 25, 127 (short) and 128, 300 (plane by plane); the last of each kind
# over BN_PARALLEL_MIN values (the parallel kernels)
SHAPES = [(5, 3, 1, 1), (3, 7, 2, 2), (4, 6, 5, 5), (3, 5, 1, 127), (2, 4, 8, 16), (40, 256, 2, 2), (4, 30, 15, 20)]


def _run(name, arrays, attrs, n):
    domain = "opsnn" if name.endswith("Grad") else ""
    with opsnn.no_grad():
        out = ops.run_op(
            name, [None if a is None else opsnn.tensor(a) for a in arrays], attrs, num_outputs=n, domain=domain
        )
    return [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def _ref(name, arrays, attrs):
    rec = ops.get_op(name, "opsnn" if name.endswith("Grad") else "")
    out = rec.reference([None if a is None else a.astype(np.float64) for a in arrays], rec.bind_attrs(attrs))
    return out if isinstance(out, tuple) else (out,)


def _inputs(shape, special):
    C = shape[1]
    x = (RNG.standard_normal(shape) * 2 + 3).astype(np.float32)
    g = RNG.standard_normal(shape).astype(np.float32)
    if special:  # one channel holds NaN, another Inf; the rest stay finite
        x[0, 0].flat[0] = np.nan
        g[-1, C - 1].flat[-1] = np.inf
    s = RNG.uniform(0.5, 1.5, C).astype(np.float32)
    b = RNG.standard_normal(C).astype(np.float32)
    m = RNG.standard_normal(C).astype(np.float32)
    v = RNG.uniform(0.5, 2.0, C).astype(np.float32)
    return x, g, s, b, m, v


def _close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin], want[~fin])  # NaN where NaN, the same infinities
    scale = max(1.0, float(np.abs(want[fin]).max(initial=0)))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5 * scale)


def test_shapes_cover_both_paths_serial_and_parallel():
    planes = [int(np.prod(s[2:])) for s in SHAPES]
    assert min(planes) < KN.SMALL_PLANE <= max(planes)
    big = [int(np.prod(s)) >= KN.BN_PARALLEL_MIN for s in SHAPES]
    assert any(big) and not all(big)
    assert any(b and p < KN.SMALL_PLANE for b, p in zip(big, planes))
    assert any(b and p >= KN.SMALL_PLANE for b, p in zip(big, planes))


@pytest.mark.parametrize("special", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("relu", [0, 1])
@pytest.mark.parametrize("training", [1, 0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_float64(shape, training, relu, special):
    x, g, s, b, m, v = _inputs(shape, special)
    fwd = {"training_mode": training, "epsilon": 1e-5, "momentum": 0.9, "relu": relu}
    n = 3 if training else 1
    got = _run("BatchNormalization", (x, s, b, m, v), fwd, n)
    want = _ref("BatchNormalization", (x, s, b, m, v), fwd)
    for k in range(n):
        _close(got[k], want[k])
    y = got[0] if relu else None
    attrs = {"training_mode": training, "epsilon": 1e-5, "relu": relu}
    ins = (g, x, s, None if training else m, None if training else v, y)
    got = _run("BatchNormalizationGrad", ins, attrs, 3)
    want = _ref("BatchNormalizationGrad", ins, attrs)
    for k in range(3):
        _close(got[k], want[k])
