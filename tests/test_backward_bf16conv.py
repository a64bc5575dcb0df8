"""bfloat16 convolutions under ``opsnn.autocast``: the forward on oneDNN's native bf16 primitive
(``conv_onednn_plain``) where the CPU has AVX512-BF16, the backward records on its bf16 backward
primitives, BatchNormalization following a bf16 input with float32 parameters (torch's CPU
autocast), and the float32 adapter where the CPU has no native bf16.

Oracles: a float64 convolution written here (a sum over kernel taps of the padded input's strided
windows) on the same bf16-rounded inputs; torch.autocast where importable. Tolerances: a bf16
output is rounded once from a float32 accumulator, so it is within half a bf16 ulp (2**-8 relative)
of the exact sum plus float32 summation error (1e-4 of the largest |oracle| entry here).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import nn
from opsnn.errors import DTypeError
from opsnn.kernels.cpu import libraries as KL
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops import executor

RNG = np.random.default_rng(4417)
NATIVE = KD.unavailable() is None and KD.bf16_unavailable() is None

# (X shape, W shape, strides, pads (begins + ends), dilations, group, bias)
CASES = {
    "3x3_resnet": ((2, 16, 10, 10), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False),
    "3x3_stride2_bias": ((2, 8, 9, 11), (24, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, True),
    "1x1_stride2": ((3, 16, 8, 8), (32, 16, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, False),
    "asym_pads_dilated": ((1, 8, 11, 9), (8, 8, 3, 2), (1, 1), (2, 1, 2, 0), (2, 3), 1, True),
    "grouped": ((2, 16, 7, 8), (32, 4, 3, 3), (1, 2), (1, 1, 1, 1), (1, 1), 4, False),
    "7x7_stem": ((2, 3, 16, 16), (16, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, False),
    "1d": ((2, 8, 17), (16, 8, 5), (2,), (2, 1), (1,), 1, True),
    "3d": ((1, 8, 5, 6, 7), (8, 8, 3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1, False),
}


def _oracle(x, w, b, s, pads, d, g):
    """Y in float64: for every kernel tap, the padded input's window that tap reads times W."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    out = tuple((xp.shape[2 + i] - (w.shape[2 + i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd))
    cg, mg = x.shape[1] // g, w.shape[0] // g
    y = np.zeros((x.shape[0], w.shape[0]) + out)
    for gi in range(g):
        for k in itertools.product(*(range(v) for v in w.shape[2:])):
            win = tuple(slice(k[i] * d[i], k[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i]) for i in range(nd))
            xs = xp[(slice(None), slice(gi * cg, (gi + 1) * cg)) + win]
            wk = w[(slice(gi * mg, (gi + 1) * mg), slice(None)) + k]
            y[:, gi * mg : (gi + 1) * mg] += np.einsum("nc...,mc->nm...", xs, wk)
    if b is not None:
        y += np.asarray(b, np.float64).reshape((1, -1) + (1,) * nd)
    return y


def _bf16_close(got, want):
    got = np.asarray(got, np.float64)
    atol = 1e-4 * max(1.0, float(np.abs(want).max()))
    bad = np.abs(got - want) > 2.0**-8 * np.abs(want) + atol
    assert not bad.any(), f"{int(bad.sum())} entries off, worst {np.abs(got - want).max()}"


def _problem(name, dtype=_dt.bfloat16):
    xs, ws, s, pads, d, g, has_b = CASES[name]
    x = RNG.standard_normal(xs).astype(dtype)
    w = (RNG.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = RNG.standard_normal(ws[0]).astype(dtype) if has_b else None
    return x, w, b, s, pads, d, g


def _conv(x, w, b, s, pads, d, g):
    """An eager Conv call with explicit begin/end pads (the record's attributes)."""
    T = opsnn.tensor
    ins = [T(x), T(w)] + ([T(b)] if b is not None else [])
    return opsnn.ops.run_op("Conv", ins, {"strides": list(s), "pads": list(pads), "dilations": list(d), "group": g})[0]


def _run_profiled(fn):
    with opsnn.profiler.profile() as p:
        out = fn()
    return out, p.kernels


@pytest.fixture
def fresh_executors():
    executor.clear_cache()
    yield
    executor.clear_cache()


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_conv_forward_matches_float64_oracle(name):
    x, w, b, s, pads, d, g = _problem(name)
    y, events = _run_profiled(lambda: _conv(x, w, b, s, pads, d, g))
    assert y.dtype == _dt.bfloat16
    _bf16_close(y.numpy(), _oracle(x, w, b, s, pads, d, g))
    ys = tuple(y.shape)
    choice = KL.conv_forward_plain(x.shape, w.shape, ys, s, pads, d, g, _dt.bfloat16)
    kernel = [e.kernel for e in events if e.op == "Conv"]
    assert len(kernel) == 1 and (kernel[0] == "conv_onednn_plain") == choice.preferred, (kernel, choice.reason)
    if not NATIVE:
        assert not choice.runnable and "bfloat16" in choice.reason
    elif name != "3d":  # 2-D / 1-D shapes of a CNN: oneDNN has bf16 JIT code for them
        assert choice.preferred, choice.reason


def test_bf16_conv_nonfinite_propagates():
    x, w, b, s, pads, d, g = _problem("3x3_resnet")
    x = x.copy()
    x[0, 3, 4, 5] = np.nan
    x[1, 0, 0, 0] = np.inf
    y = _conv(x, w, b, s, pads, d, g).numpy().astype(np.float64)
    with np.errstate(invalid="ignore"):
        want = _oracle(x, w, b, s, pads, d, g)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(want))
    ok = np.isfinite(want)
    _bf16_close(np.where(ok, y, 0), np.where(ok, want, 0))


def test_mixed_dtypes_are_a_typed_error():
    x, w, _, s, pads, d, g = _problem("3x3_resnet")
    with pytest.raises(DTypeError, match=r"Conv: inputs 'X' \(bfloat16\) and 'W' \(float32\)"):
        _conv(x, w.astype(np.float32), None, s, pads, d, g)


def test_float16_conv_stays_on_the_float32_adapter():
    x, w, b, s, pads, d, g = _problem("3x3_stride2_bias", np.float16)
    y, events = _run_profiled(lambda: _conv(x, w, b, s, pads, d, g))
    assert y.dtype == np.float16 and [e.kernel for e in events if e.op == "Conv"] != ["conv_onednn_plain"]
    want = _oracle(x, w, b, s, pads, d, g)
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, rtol=2.0**-10, atol=1e-3)


def test_without_native_bf16_the_adapter_runs_it(monkeypatch, fresh_executors):
    """What an AVX2-only CPU does: oneDNN's bf16 kernels would emulate, so Conv widens bf16 to
    float32 (adapter) and rounds the result once, within the same tolerance."""
    monkeypatch.setattr(KD, "bf16_unavailable", lambda: "no AVX512-BF16 (this test)")
    x, w, b, s, pads, d, g = _problem("3x3_stride2_bias")
    c = KL.conv_forward_plain(x.shape, w.shape, (2, 24, 5, 6), s, pads, d, g, _dt.bfloat16)
    assert not c.runnable and c.reason == "bfloat16: no AVX512-BF16 (this test)"
    y, events = _run_profiled(lambda: _conv(x, w, b, s, pads, d, g))
    assert y.dtype == _dt.bfloat16
    assert "conv_onednn_plain" not in [e.kernel for e in events if e.op == "Conv"]
    _bf16_close(y.numpy(), _oracle(x, w, b, s, pads, d, g))


class _Block(nn.Module):
    """ResNet's basic block with a strided 1x1 downsample, a stem before it and a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        self.conv1 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.down = nn.Conv2d(16, 32, 1, stride=2, bias=False)
        self.bnd = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        ops = opsnn.ops
        h = ops.relu(self.bn0(self.stem(x)))
        r = self.bn2(self.conv2(ops.relu(self.bn1(self.conv1(h)))))
        h = ops.relu(ops.add(r, self.bnd(self.down(h))))
        return self.fc(ops.flatten(ops.global_avg_pool(h), 1))


def _step(model, x, y, bf16):
    for p in model.parameters():
        p.grad = None
    with opsnn.autocast("bfloat16", enabled=bf16):
        logits = model(opsnn.tensor(x))
        loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    return float(loss.item()), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}, logits


def test_autocast_resnet_block_step_runs_bf16_kernels_and_matches_fp32():
    with nn.init.seeded(1):
        model = _Block().train()
    x = RNG.standard_normal((4, 3, 12, 12)).astype(np.float32)
    y = RNG.integers(0, 5, 4)
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    loss32, g32, _ = _step(model, x, y, False)
    model.load_state_dict(state)
    with opsnn.profiler.profile() as p:
        loss16, g16, logits = _step(model, x, y, True)
    assert str(logits.dtype) == "bfloat16"
    assert all(g.dtype == np.float32 for g in g16.values())
    convs = [e for e in p.kernels if e.op in ("Conv", "ConvBackwardData", "ConvBackwardWeight")]
    assert sum(e.op == "Conv" for e in convs) == 4 and sum(e.op == "ConvBackwardWeight" for e in convs) == 4
    assert all(e.dtypes[0] == "bfloat16" for e in convs), [(e.op, e.dtypes) for e in convs]
    if NATIVE:
        assert {e.kernel for e in convs if e.op == "Conv"} == {"conv_onednn_plain"}
        for e in convs:
            if e.op != "Conv":
                assert e.kernel.endswith("_onednn"), (e.op, e.kernel)
    else:
        assert "conv_onednn_plain" not in {e.kernel for e in convs}
    # torch's CPU autocast: BatchNorm takes the bf16 conv output as it is (no cast into it)
    bns = [e for e in p.kernels if e.op == "BatchNormalization"]
    assert len(bns) == 4 and all(e.dtypes[:2] == ["bfloat16", "float32"] for e in bns)
    casts = sum(e.op == "Cast" for e in p.kernels)
    assert casts <= 2 * (len(g16) + 1), casts  # weights down, their gradients up, the input; no activations
    assert abs(loss16 - loss32) <= 2e-2 * abs(loss32), (loss16, loss32)
    # every activation rounded to 8 bits through 4 layers on a batch of 4: gradients drift 5-11% in
    # norm from float32's (the torch test below is the tight check: the same roundings)
    for n in g32:
        err = np.linalg.norm(g16[n] - g32[n]) / max(np.linalg.norm(g32[n]), 1e-6)
        assert err < 0.25, (n, err)


def test_autocast_block_gradients_match_torch_autocast():
    torch = pytest.importorskip("torch")
    with nn.init.seeded(2):
        model = _Block().train()
    x = RNG.standard_normal((4, 3, 12, 12)).astype(np.float32)
    y = RNG.integers(0, 5, 4)
    sd = {k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()}

    class TBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            tnn = torch.nn
            self.stem, self.bn0 = tnn.Conv2d(3, 16, 3, padding=1, bias=False), tnn.BatchNorm2d(16)
            self.conv1, self.bn1 = tnn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), tnn.BatchNorm2d(32)
            self.conv2, self.bn2 = tnn.Conv2d(32, 32, 3, padding=1, bias=False), tnn.BatchNorm2d(32)
            self.down, self.bnd = tnn.Conv2d(16, 32, 1, stride=2, bias=False), tnn.BatchNorm2d(32)
            self.fc = tnn.Linear(32, 5)

        def forward(self, a):
            F = torch.nn.functional
            h = F.relu(self.bn0(self.stem(a)))
            r = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(h)))))
            h = F.relu(r + self.bnd(self.down(h)))
            return self.fc(h.mean((2, 3)))

    tm = TBlock().train()
    tm.load_state_dict(sd, strict=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tlogits = tm(torch.tensor(x))
        tloss = torch.nn.functional.cross_entropy(tlogits, torch.tensor(y))
    tloss.backward()
    loss, grads, logits = _step(model, x, y, True)
    assert str(logits.dtype) == str(tlogits.dtype).replace("torch.", "")
    assert abs(loss - tloss.item()) <= 1e-2 * abs(tloss.item())
    # the same bf16 roundings in the same places (BatchNorm on the bf16 conv output, as torch): within 2%
    for n, p in tm.named_parameters():
        want = p.grad.numpy()
        err = np.linalg.norm(grads[n] - want) / max(np.linalg.norm(want), 1e-6)
        assert err < 2e-2, (n, err)
