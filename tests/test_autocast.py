"""``opsnn.autocast``: per-op compute dtypes against torch.autocast's CPU lists, gradients through
the casts into float32 master weights, the weight-cast cache, bfloat16 training of a small CNN
against float32, and float16 with GradScaler skipping an overflowing step."""

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.ops import executor

RNG = np.random.default_rng(3)


def _dt(t) -> str:
    return str(t.dtype).replace("torch.", "")


def test_op_dtypes_match_torch_autocast_cpu_lists():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    lw = RNG.standard_normal((5, 64)).astype(np.float32)
    q = RNG.standard_normal((1, 2, 4, 8)).astype(np.float32)
    emb = RNG.standard_normal((7, 5)).astype(np.float32)
    y = np.array([0, 3])

    def layers(lib):
        """(name, output) of each layer of a small model, computed under lib's autocast."""
        if lib == "torch":
            T = torch.tensor
            conv = lambda a: F.conv2d(a, T(w), padding=1)  # noqa: E731
            relu, pool, lin = F.relu, lambda a: F.max_pool2d(a, 2), lambda a: F.linear(a, T(lw))
            flat = lambda a: a.flatten(1)  # noqa: E731
            mm, sdpa = torch.matmul, F.scaled_dot_product_attention
            ce, gather = lambda a: F.cross_entropy(a, T(y)), lambda: F.embedding(T(np.array([1, 2])), T(emb))
            add, scale = lambda a, b: a + b, lambda a: a * T(np.float32(0.5))
            xin, qin, bias = T(x), T(q), T(np.zeros(5, np.float32))
            ctx = torch.autocast("cpu", dtype=torch.bfloat16)
        else:
            T = opsnn.tensor
            conv = lambda a: ops.conv2d(a, T(w), None, padding=1)  # noqa: E731
            relu, pool, lin = ops.relu, lambda a: ops.max_pool2d(a, 2), lambda a: ops.linear(a, T(lw))
            flat = lambda a: ops.flatten(a, 1)  # noqa: E731
            mm, sdpa = ops.matmul, ops.scaled_dot_product_attention
            ce, gather = lambda a: nn.functional.cross_entropy(a, y), lambda: ops.embedding(np.array([1, 2]), T(emb))
            add, scale = ops.add, lambda a: ops.mul(a, T(np.float32(0.5)))
            xin, qin, bias = T(x), T(q), T(np.zeros(5, np.float32))
            ctx = opsnn.autocast("bfloat16")
        out = []
        with ctx:
            c = conv(xin)
            out.append(("conv", c))
            r = relu(c)
            out.append(("relu (follows its input)", r))
            p = pool(r)
            out.append(("max_pool (follows its input)", p))
            h = lin(flat(p))
            out.append(("linear", h))
            out.append(("matmul", mm(h, h.T if lib == "torch" else ops.transpose(h, [1, 0]))))
            out.append(("scaled_dot_product_attention", sdpa(qin, qin, qin)))
            out.append(("mixed add promotes", add(h, bias)))
            out.append(("0-d operand does not promote", scale(h)))
            out.append(("embedding", gather()))
            out.append(("cross_entropy (float32 list)", ce(add(h, bias))))
            out.append(("cross_entropy of bf16 logits", ce(h)))
        return out

    mine, theirs = layers("opsnn"), layers("torch")
    got = [(n, _dt(t)) for n, t in mine]
    want = [(n, _dt(t)) for n, t in theirs]
    assert got == want
    assert dict(got)["linear"] == "bfloat16" and dict(got)["cross_entropy of bf16 logits"] == "float32"


def test_precision_sensitive_ops_run_in_float32():
    # softmax, norms and sum/mean: float32 in opsnn (torch's CPU autocast lets them follow a bf16 input)
    h16 = ops.cast(opsnn.tensor(RNG.standard_normal((4, 6)).astype(np.float32)), "bfloat16")
    g, b = opsnn.tensor(np.ones(6, np.float32)), opsnn.tensor(np.zeros(6, np.float32))
    with opsnn.autocast("bfloat16"):
        outs = {
            "softmax": ops.softmax(h16, -1),
            "log_softmax": ops.log_softmax(h16, -1),
            "layer_norm": ops.layer_norm(h16, (6,), g, b),
            "rms_norm": ops.rms_norm(h16, (6,), g),
            "sum": ops.sum(h16),
            "mean": ops.mean(h16, dim=1),
            "relu": ops.relu(h16),
        }
    assert {k: _dt(v) for k, v in outs.items()} == {**dict.fromkeys(outs, "float32"), "relu": "bfloat16"}
    ref = h16.numpy().astype(np.float64)
    sm = np.exp(ref - ref.max(-1, keepdims=True))
    np.testing.assert_allclose(outs["softmax"].numpy(), sm / sm.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_gradients_reach_float32_weights_like_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((6, 16)).astype(np.float32)
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    c = RNG.standard_normal((6, 8)).astype(np.float32)
    lin = nn.Linear(16, 8, bias=False)
    lin.weight.numpy()[...] = w
    with opsnn.autocast("bfloat16"):
        h = lin(opsnn.tensor(x))
        loss = ops.sum(ops.mul(ops.tanh(h), opsnn.tensor(c)))
    loss.backward()
    tw = torch.tensor(w, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tloss = (torch.tanh(torch.nn.functional.linear(torch.tensor(x), tw)) * torch.tensor(c)).sum()
    tloss.backward()
    assert _dt(lin.weight.grad) == "float32" and _dt(h) == "bfloat16"
    # both round the same products to bfloat16 (8 bits of mantissa): agree within a few bf16 ulps
    np.testing.assert_allclose(lin.weight.grad.numpy(), tw.grad.numpy(), rtol=3e-2, atol=3e-2)
    # and the float64 oracle of the float32 model, within bf16 rounding of inputs and gradient
    ref_h = x.astype(np.float64) @ w.T.astype(np.float64)
    ref = ((1 - np.tanh(ref_h) ** 2) * c).T @ x
    err = np.abs(lin.weight.grad.numpy() - ref).max() / np.abs(ref).max()
    assert err < 3e-2, err


def test_parameter_casts_are_cached_per_region(monkeypatch):
    lin = nn.Linear(4, 3)
    x = opsnn.tensor(RNG.standard_normal((2, 4)).astype(np.float32))
    casts = []
    real = executor.call

    def counting(rec, inputs, attrs=None, **kw):
        if rec.name == "Cast":
            casts.append(tuple(inputs[0].shape))
        return real(rec, inputs, attrs, **kw)

    monkeypatch.setattr(executor, "call", counting)
    from opsnn.ops import api  # the functional API reaches the executor through the module attribute

    assert api is not None
    with opsnn.autocast("bfloat16"):
        a = lin(x)
        first = list(casts)
        b = lin(x)
    # the weight and bias are cast once; the second call casts only the (non-parameter) input
    assert sorted(first) == sorted([(2, 4), (3, 4), (3,)]), first
    assert casts[len(first) :] == [(2, 4)], casts
    ops.sum(ops.add(a, b)).backward()  # both uses reach the weight: twice one use's gradient
    g2 = lin.weight.grad.numpy().copy()
    lin.weight.grad = None
    with opsnn.autocast("bfloat16"):
        n = len(casts)
        c = lin(x)
        assert len(casts) == n + 3  # a new region casts again
        ops.sum(c).backward()
        ops.sum(lin(x)).backward()  # a second forward and backward in the region: the cached cast is reusable
    np.testing.assert_allclose(g2, lin.weight.grad.numpy(), rtol=1e-6)
    assert not opsnn.amp.is_autocast_enabled() and executor._autocast is None


def test_nesting_disable_and_bad_arguments():
    lin = nn.Linear(4, 3)
    x = opsnn.tensor(np.ones((2, 4), np.float32))
    with opsnn.amp.autocast("float16"):
        assert _dt(lin(x)) == "float16"
        with opsnn.autocast(enabled=False):
            assert _dt(lin(x)) == "float32"
        with opsnn.autocast("bfloat16", policy={"Linear": "float32"}):
            assert _dt(lin(x)) == "float32"
        assert opsnn.amp.get_autocast_dtype() == np.float16
    with pytest.raises(opsnn.errors.ParamInvalidError, match="'bfloat16' or 'float16', got 'float32'"):
        opsnn.autocast("float32")
    with pytest.raises(opsnn.errors.ParamInvalidError, match="unknown op type 'Nope'"):
        opsnn.autocast(policy={"Nope": "float32"})
    assert opsnn.amp.autocast_policy("bfloat16")["MatMul"] == opsnn.dtypes.bfloat16


def _cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, 4),
    )


def test_bf16_autocast_training_reaches_fp32_loss():
    x = RNG.standard_normal((8, 3, 4, 4)).astype(np.float32)
    y = RNG.integers(0, 4, 8)
    with nn.init.seeded(0):
        init = _cnn().state_dict()

    def run(dtype):
        model = _cnn().train()
        model.load_state_dict(init)
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for _ in range(200):
            opt.zero_grad()
            with opsnn.autocast("bfloat16", enabled=dtype == "bfloat16"):
                loss = nn.functional.cross_entropy(model(opsnn.tensor(x)), y, label_smoothing=0.2)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        return np.array(losses)

    fp32, bf16 = run("float32"), run("bfloat16")
    assert fp32[-1] < 0.6 * fp32[0]  # it learned (label smoothing keeps a floor above 0)
    assert abs(bf16[-1] - fp32[-1]) <= 0.05 * fp32[-1], (fp32[-5:], bf16[-5:])


def test_float16_grad_scaler_skips_the_overflowing_step():
    x = opsnn.tensor(RNG.standard_normal((8, 10)).astype(np.float32))
    y = RNG.integers(0, 3, 8)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = optim.SGD(model.parameters(), lr=0.05)
    # 2**24 times the loss's gradient (~1/8) overflows float16 (max 65504) in the backward matmuls
    scaler = opsnn.amp.GradScaler(init_scale=2.0**24, growth_interval=1000)
    scales, skipped = [], []
    for _ in range(12):
        opt.zero_grad()
        with opsnn.autocast("float16"):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
        assert _dt(logits) == "float16" and _dt(loss) == "float32"
        scaler.scale(loss).backward()
        before = [p.numpy().copy() for p in model.parameters()]
        scaler.step(opt)
        after = [p.numpy() for p in model.parameters()]
        skipped.append(all(np.array_equal(a, b) for a, b in zip(before, after)))
        scale = scaler.get_scale()
        scaler.update()
        scales.append((scale, scaler.get_scale()))
    assert skipped[0], "the first step overflowed float16 and must be skipped"
    for was_skipped, (s, s_next) in zip(skipped, scales):
        assert s_next == (s * 0.5 if was_skipped else s)  # halved after each skipped step, kept otherwise
    assert not skipped[-1] and scales[-1][1] < 2.0**24
    assert all(np.isfinite(p.numpy()).all() for p in model.parameters())


def test_autocast_inside_a_compiled_training_step_matches_eager():
    # the casts are op calls, so the tracer records them: the compiled step is the eager one
    xb, yb = RNG.standard_normal((16, 8)).astype(np.float32), RNG.integers(0, 4, size=16)

    def make():
        with nn.init.seeded(0):
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def train_step(x, y):
            opt.zero_grad()
            with opsnn.autocast("bfloat16"):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return model, train_step

    m_eager, eager = make()
    m_comp, step = make()
    step = opsnn.compile(step)
    for _ in range(4):
        a = float(eager(opsnn.tensor(xb), yb).item())
        b = float(step(xb, yb).item())
        assert a == b
    assert sum(n.op_type == "Cast" for n in step.graph().nodes) >= 4
    for (name, p), q in zip(m_eager.named_parameters(), m_comp.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
