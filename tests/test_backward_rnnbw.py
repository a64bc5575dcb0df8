"""opsnn::LSTMGrad / GRUGrad (backward through time in one kernel) and the LSTM / GRU gradient rules
that call them: against float64 central differences of the forward's numpy reference, the op's
float64 reference, the registry-op composition (the float64 rule) and torch.autograd."""

import sys

import numpy as np
import pytest

import opsnn
import opsnn.ops.defs.rnn  # noqa: F401  (the module, shadowed on the package by the rnn function)
from opsnn import autograd, ops
from opsnn.errors import InferShapeError, ParamInvalidError

RD = sys.modules["opsnn.ops.defs.rnn"]
G = {"LSTM": 4, "GRU": 3, "RNN": 1}
STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}
RNG = np.random.default_rng(7)


def _case(op, T, B, I, H, direction="forward", layout=0, seq=None, dt=np.float64, scale=0.5):
    """Forward inputs (X, W, R, B, sequence_lens, initial_h[, initial_c]) and output gradients."""
    D = 2 if direction == "bidirectional" else 1
    g = G[op]
    st = (B, D, H) if layout else (D, B, H)
    ins = [
        RNG.standard_normal((B, T, I) if layout else (T, B, I)),
        RNG.standard_normal((D, g * H, I)) * scale,
        RNG.standard_normal((D, g * H, H)) * scale,
        RNG.standard_normal((D, 2 * g * H)) * scale,
        None,
        RNG.standard_normal(st),
    ] + ([RNG.standard_normal(st)] if op == "LSTM" else [])
    ins = [None if v is None else v.astype(dt) for v in ins]
    if seq is not None:
        ins[4] = np.asarray(seq, np.int32)
    y = (B, T, D, H) if layout else (T, D, B, H)
    douts = [RNG.standard_normal(y).astype(dt)] + [RNG.standard_normal(st).astype(dt) for _ in range(STATES[op])]
    return ins, douts


def _opt(op, lbr):
    """The op's own attribute: LSTM none, GRU linear_before_reset, RNN its activations (``lbr``)."""
    if op == "LSTM":
        return {}
    return {"activations": lbr or None} if op == "RNN" else {"linear_before_reset": lbr}


def _attrs(op, direction, layout, lbr):
    a = {"direction": direction, "layout": layout, "clip": None, "activations": None}
    a.update({"activation_alpha": None, "activation_beta": None})
    return a | ({"input_forget": 0} if op == "LSTM" else {"linear_before_reset": 0}) | _opt(op, lbr)


def _f64(v):
    return v if v is None or v.dtype.kind in "iu" else v.astype(np.float64)


def _fused(op, ins, douts, direction, layout, lbr=0):
    ts = [None if v is None else opsnn.tensor(v) for v in ins + douts]
    fn = {"LSTM": ops.lstm_backward, "GRU": ops.gru_backward, "RNN": ops.rnn_backward}[op]
    return [o.numpy() for o in fn(*ts, direction=direction, layout=layout, **_opt(op, lbr))]


def _op_reference(op, ins, douts, direction, layout, lbr=0):
    rec = {"LSTM": RD.LSTMGrad, "GRU": RD.GRUGrad, "RNN": RD.RNNGrad}[op]
    return list(rec.reference(ins + douts, {"direction": direction, "layout": layout} | _opt(op, lbr)))


def _numeric(op, ins, douts, direction, layout, lbr, k, eps=1e-6):
    """Central differences of sum(Y*dY) + sum(Y_h*dY_h) (+ Y_c) by input k, the forward's float64
    numpy reference (no kernels involved)."""
    fwd = RD._reference(op)
    attrs = _attrs(op, direction, layout, lbr)

    def loss(v):
        args = list(ins)
        args[k] = v
        return sum(float((o.astype(np.float64) * d).sum()) for o, d in zip(fwd(args, attrs), douts))

    base = ins[k].astype(np.float64)
    out = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        p, m = base.copy(), base.copy()
        p[idx] += eps
        m[idx] -= eps
        out[idx] = (loss(p) - loss(m)) / (2 * eps)
    return out


_IN_OF_OUT = [0, 1, 2, 3, 5, 6]  # dX, dW, dR, dB, dinitial_h, dinitial_c -> forward input index
CASES = [
    ("LSTM", "forward", 0, None, 0),
    ("LSTM", "reverse", 1, [3, 0, 2], 0),
    ("LSTM", "bidirectional", 0, [1, 3, 2], 0),
    ("GRU", "forward", 1, None, 0),
    ("GRU", "bidirectional", 0, [3, 2, 0], 1),
    ("GRU", "reverse", 0, [2, 3, 1], 0),
    ("GRU", "reverse", 1, None, 1),
    ("RNN", "forward", 0, None, None),
    ("RNN", "reverse", 1, [3, 1, 2], ["sigmoid"]),
    ("RNN", "bidirectional", 0, [2, 0, 3], ["relu", "tanh"]),
]


@pytest.mark.parametrize("op,direction,layout,seq,lbr", CASES)
def test_op_matches_finite_differences(op, direction, layout, seq, lbr):
    ins, douts = _case(op, 3, 3, 2, 2, direction, layout, seq)
    got = _fused(op, ins, douts, direction, layout, lbr)
    for j, g in enumerate(got):
        num = _numeric(op, ins, douts, direction, layout, lbr, _IN_OF_OUT[j])
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-7, err_msg=f"{op} output {j}")


@pytest.mark.parametrize("op,direction,layout,seq,lbr", CASES)
@pytest.mark.parametrize("dt,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_kernel_matches_op_reference(op, direction, layout, seq, lbr, dt, tol):
    ins, douts = _case(op, 6, 4, 5, 3, direction, layout, None if seq is None else seq + [6], dt)
    got = _fused(op, ins, douts, direction, layout, lbr)
    ref = _op_reference(op, [_f64(v) for v in ins], [_f64(d) for d in douts], direction, layout, lbr)
    for j, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == dt and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol, err_msg=f"{op} output {j}")


def _rule_grads(op, ins, douts, direction, layout, lbr=0):
    """Gradients of the forward's inputs through autograd (the gradient rule)."""
    ts = [None if v is None else opsnn.tensor(v) for v in ins]
    wrt = [i for i, v in enumerate(ins) if v is not None and v.dtype.kind == "f"]
    for i in wrt:
        ts[i].requires_grad_()
    kw = {"direction": direction, "layout": layout}
    outs = {"LSTM": ops.lstm, "GRU": ops.gru, "RNN": ops.rnn}[op](*ts, **kw, **_opt(op, lbr))
    grads = autograd.grad(list(outs), [ts[i] for i in wrt], [opsnn.tensor(d) for d in douts])
    return dict(zip(wrt, (g.numpy() for g in grads)))


@pytest.mark.parametrize(
    "op,direction,lbr",
    [
        ("LSTM", "forward", 0),
        ("LSTM", "bidirectional", 0),
        ("GRU", "reverse", 0),
        ("GRU", "bidirectional", 1),
        ("RNN", "bidirectional", ["sigmoid", "relu"]),
    ],
)
def test_float64_composition_agrees_with_the_op(op, direction, lbr):
    """float64, time-major, no sequence_lens: the rule runs the registry-op composition, which the
    op reproduces."""
    ins, douts = _case(op, 5, 3, 4, 3, direction)
    rule = _rule_grads(op, ins, douts, direction, 0, lbr)
    got = _fused(op, ins, douts, direction, 0, lbr)
    for j, k in enumerate(_IN_OF_OUT[: len(got)]):
        np.testing.assert_allclose(got[j], rule[k], rtol=1e-10, atol=1e-12, err_msg=f"{op} input {k}")


@pytest.mark.parametrize("op,direction,layout,seq,lbr", CASES)
def test_float32_rule_runs_the_op(op, direction, layout, seq, lbr):
    """float32 (and float64 with sequence_lens or layout 1): the rule's gradients are the op's,
    within float32 rounding of the float64 reference."""
    ins, douts = _case(op, 4, 3, 3, 5, direction, layout, None if seq is None else [min(v + 1, 4) for v in seq])
    ref = _op_reference(op, ins, douts, direction, layout, lbr)
    f32 = [v if v is None or v.dtype.kind != "f" else v.astype(np.float32) for v in ins]
    rule = _rule_grads(op, f32, [d.astype(np.float32) for d in douts], direction, layout, lbr)
    for j, k in enumerate(_IN_OF_OUT[: len(ref)]):
        assert rule[k].dtype == np.float32
        np.testing.assert_allclose(rule[k], ref[j], rtol=1e-4, atol=1e-5, err_msg=f"{op} input {k}")
    if seq is not None or layout:
        rule64 = _rule_grads(op, ins, douts, direction, layout, lbr)
        for j, k in enumerate(_IN_OF_OUT[: len(ref)]):
            np.testing.assert_allclose(rule64[k], ref[j], rtol=1e-12, atol=1e-12, err_msg=f"{op} input {k}")


@pytest.mark.parametrize(
    "op,T,B,I,H,seq",
    [
        ("LSTM", 1, 1, 1, 1, None),  # one step, batch 1, hidden 1
        ("GRU", 7, 1, 5, 1, None),
        ("LSTM", 4, 5, 7, 3, [0, 0, 0, 0, 0]),  # every sequence empty
        ("GRU", 0, 2, 3, 2, None),  # no time steps
        ("LSTM", 9, 2, 3, 11, [9, 4]),
        ("RNN", 6, 1, 1, 1, [5]),
    ],
)
def test_odd_shapes(op, T, B, I, H, seq):
    for direction in ("forward", "bidirectional"):
        ins, douts = _case(op, T, B, I, H, direction, 0, seq)
        got = _fused(op, ins, douts, direction, 0)
        ref = _op_reference(op, ins, douts, direction, 0)
        for j, (g, r) in enumerate(zip(got, ref)):
            assert g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12, err_msg=f"{op} {direction} output {j}")
        if seq is not None and not any(seq):
            assert all(not g.any() for g in got)  # nothing ran: every gradient is zero


def test_missing_output_gradients_count_as_zero():
    ins, douts = _case("LSTM", 4, 2, 3, 2, "bidirectional")
    zeros = [np.zeros_like(d) for d in douts]
    for keep in range(3):
        given = [d if i == keep else None for i, d in enumerate(douts)]
        full = [d if i == keep else z for i, (d, z) in enumerate(zip(douts, zeros))]
        got = _fused("LSTM", ins, given, "bidirectional", 0)
        ref = _op_reference("LSTM", ins, full, "bidirectional", 0)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_nan_input_propagates_like_the_reference(op):
    """A NaN in X at one step of one row poisons that row's gradients from that step on (and, through
    the shared weights, dW / dR / dB), exactly where the float64 reference has NaN."""
    ins, douts = _case(op, 5, 3, 2, 2, "forward")
    ins[0][2, 1, 0] = np.nan
    got = _fused(op, ins, douts, "forward", 0)
    ref = _op_reference(op, ins, douts, "forward", 0)
    for j, (g, r) in enumerate(zip(got, ref)):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=f"{op} output {j}")
        np.testing.assert_allclose(g[~np.isnan(r)], r[~np.isnan(r)], rtol=1e-12, atol=1e-12)
    assert np.isnan(got[0][:3, 1]).any() and not np.isnan(got[0][:, [0, 2]]).any()


def test_bad_input_is_a_typed_error():
    ins, douts = _case("GRU", 3, 2, 2, 2, "forward")
    with pytest.raises(InferShapeError, match=r"GRUGrad: input 'dY' must have shape \(3, 1, 2, 2\)"):
        _fused("GRU", ins, [douts[0][:2], douts[1]], "forward", 0)
    with pytest.raises(InferShapeError, match="GRUGrad: input 'W' must have shape"):
        _fused("GRU", [ins[0], ins[1][:, :5]] + ins[2:], douts, "forward", 0)
    bad = list(ins)
    bad[4] = np.array([4, 1], np.int32)
    with pytest.raises(ParamInvalidError, match=r"GRUGrad: sequence_lens values must lie in \[0, 3\]"):
        _fused("GRU", bad, douts, "forward", 0)
    with pytest.raises(ParamInvalidError, match="GRUGrad: attribute 'direction'"):
        _fused("GRU", ins, douts, "sideways", 0)
    with pytest.raises(ParamInvalidError, match="GRUGrad: linear_before_reset must be 0 or 1"):
        _fused("GRU", ins, douts, "forward", 0, lbr=2)
    rins, rdouts = _case("RNN", 3, 2, 2, 2, "forward")
    with pytest.raises(
        ParamInvalidError, match=r"RNNGrad: attribute 'activations' must be one of .*got \['softsign'\]"
    ):
        _fused("RNN", rins, rdouts, "forward", 0, ["softsign"])
    lins, ldouts = _case("LSTM", 3, 2, 2, 2, "forward")
    with pytest.raises(InferShapeError, match="LSTMGrad: input 'dY_c' must have X's dtype"):
        _fused("LSTM", lins, ldouts[:2] + [ldouts[2].astype(np.float32)], "forward", 0)


def test_two_phase_api():
    ins, douts = _case("LSTM", 3, 2, 4, 3, "reverse")
    ts = [None if v is None else opsnn.tensor(v) for v in ins + douts]
    exe = opsnn.aclnn.lstm_backward.prepare(*ts, direction="reverse")
    got = [o.numpy() for o in exe.run()]
    for g, r in zip(got, _op_reference("LSTM", ins, douts, "reverse", 0)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def _torch_order(op, a, H):
    """ONNX gate blocks (LSTM i,o,f,c; GRU z,r,h) along axis 0 reordered to torch's (i,f,g,o; r,z,n)."""
    perm = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}[op]
    return np.concatenate([a[k * H : (k + 1) * H] for k in perm], axis=0)


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 1), ("RNN", None)])
def test_against_torch_autograd(op, lbr):
    """torch.nn.LSTM / GRU (bidirectional, batch-first) with the same weights: the rule's float32
    gradients of every input equal torch's (GRU: torch computes linear_before_reset=1)."""
    torch = pytest.importorskip("torch")
    T, B, I, H = 5, 3, 4, 6
    ins, douts = _case(op, T, B, I, H, "bidirectional", 1, None, np.float32)
    x, w, r, b, _, h0 = ins[:6]
    mod = getattr(torch.nn, op)(I, H, batch_first=True, bidirectional=True)
    g = G[op]
    with torch.no_grad():
        for d, sfx in enumerate(["", "_reverse"]):
            getattr(mod, "weight_ih_l0" + sfx).copy_(torch.tensor(_torch_order(op, w[d], H)))
            getattr(mod, "weight_hh_l0" + sfx).copy_(torch.tensor(_torch_order(op, r[d], H)))
            getattr(mod, "bias_ih_l0" + sfx).copy_(torch.tensor(_torch_order(op, b[d, : g * H], H)))
            getattr(mod, "bias_hh_l0" + sfx).copy_(torch.tensor(_torch_order(op, b[d, g * H :], H)))
    tx = torch.tensor(x, requires_grad=True)
    th0 = torch.tensor(h0.transpose(1, 0, 2).copy(), requires_grad=True)  # torch's states are (D, B, H)
    if op == "LSTM":
        tc0 = torch.tensor(ins[6].transpose(1, 0, 2).copy(), requires_grad=True)
        ty, (tyh, tyc) = mod(tx, (th0, tc0))
        touts = [ty, tyh, tyc]
    else:
        ty, tyh = mod(tx, th0)
        touts = [ty, tyh]
    # torch's Y is (B, T, D*H); opsnn's batch-first Y is (B, T, D, H): the same memory order
    tgrads = [torch.tensor(douts[0].reshape(B, T, 2 * H))] + [
        torch.tensor(d.transpose(1, 0, 2).copy()) for d in douts[1:]
    ]
    torch.autograd.backward(touts, tgrads)
    rule = _rule_grads(op, ins, douts, "bidirectional", 1, lbr)
    np.testing.assert_allclose(rule[0], tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rule[5], th0.grad.numpy().transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
    if op == "LSTM":
        np.testing.assert_allclose(rule[6], tc0.grad.numpy().transpose(1, 0, 2), rtol=1e-4, atol=1e-5)
    for d, sfx in enumerate(["", "_reverse"]):
        for name, k in (("weight_ih", 1), ("weight_hh", 2)):
            want = getattr(mod, f"{name}_l0{sfx}").grad.numpy()
            np.testing.assert_allclose(_torch_order(op, rule[k][d], H), want, rtol=1e-4, atol=1e-5, err_msg=name + sfx)
        for name, part in (("bias_ih", rule[3][d, : g * H]), ("bias_hh", rule[3][d, g * H :])):
            want = getattr(mod, f"{name}_l0{sfx}").grad.numpy()
            np.testing.assert_allclose(_torch_order(op, part, H), want, rtol=1e-4, atol=1e-5, err_msg=name + sfx)


@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_compiled_step_traces_the_backward_op(rnn):
    """A compiled training step over nn.LSTM / nn.GRU (2 layers, bidirectional, batch-first) holds
    LSTMGrad / GRUGrad nodes, their shapes inferred in the graph, and matches the eager steps."""
    from opsnn import nn, optim

    batches = [RNG.standard_normal((3, 5, 4)).astype(np.float32) for _ in range(3)]

    def run(compiled):
        with nn.init.seeded(3):
            mod = getattr(nn, rnn)(4, 3, num_layers=2, batch_first=True, bidirectional=True)
        opt = optim.SGD(list(mod.parameters()), lr=0.1)

        def train_step(x):
            opt.zero_grad()
            y = mod(x)[0]
            loss = ops.mean(ops.mul(y, y))
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(opsnn.tensor(b)).item()) for b in batches]
        return losses, {n: p.numpy().copy() for n, p in mod.named_parameters()}, step

    el, ep, _ = run(False)
    cl, cp, step = run(True)
    kinds = [n.op_type for n in step.graph().nodes]
    assert kinds.count(rnn + "Grad") == 2, sorted(set(kinds))
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    for name, a in cp.items():
        np.testing.assert_allclose(a, ep[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_bfloat16_runs_the_float32_kernel():
    """16-bit data goes through LSTMGrad's float32 kernel (compute float32, store bfloat16): within
    bfloat16 rounding of the float64 reference on the same (rounded) inputs."""
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    ins, douts = _case("LSTM", 4, 2, 3, 3, "bidirectional", 0, [4, 2])
    ins = [v if v is None or v.dtype.kind != "f" else v.astype(bf) for v in ins]
    douts = [d.astype(bf) for d in douts]
    got = _fused("LSTM", ins, douts, "bidirectional", 0)
    ref = _op_reference("LSTM", [_f64(v) for v in ins], [_f64(d) for d in douts], "bidirectional", 0)
    for j, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == bf and r.dtype == np.float64
        np.testing.assert_allclose(g.astype(np.float64), r, rtol=3e-2, atol=3e-2, err_msg=f"output {j}")
