"""Train-mode attention dropout (nn.MultiheadAttention) and inter-layer RNN dropout (nn.LSTM / nn.GRU)
through ``nn.functional.dropout`` -> ``opsnn::NativeDropout``, eager and in compiled training steps.

Oracles: the masks are the numpy hash reference (``kernels.cpu.dropout.keep_mask``) of the seeds that
``opsnn.manual_seed`` makes opsnn's generator draw (one int64 per dropout call, in call order). torch,
given those masks (``torch.nn.functional.dropout`` patched to apply them; the RNN as a stack of
one-layer torch modules with the mask between layers), is the float64 oracle for outputs, returned
weights and gradients (rtol 1e-9). Eval mode and p = 0 must equal torch without dropout. Compiled and
eager steps draw the same seeds, so their losses agree to tests/test_compiled_training.py's rtol 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.errors import OpsnnError
from opsnn.kernels.cpu import dropout as KD

RNG = np.random.default_rng(31)
TOL = dict(rtol=1e-9, atol=1e-12)


def _seeds(seed: int, n: int) -> list[int]:
    """The ``n`` dropout seeds drawn after ``opsnn.manual_seed(seed)``: int64 draws in [0, int64 max)."""
    opsnn.manual_seed(seed)
    g = nn.init.generator()
    return [int(g.integers(np.iinfo(np.int64).max, dtype=np.int64)) for _ in range(n)]


def _keep(seed: int, shape, p: float) -> np.ndarray:
    return KD.keep_mask(np.int64(seed), int(np.prod(shape)), KD.threshold(p)).reshape(shape)


# -- functional dropout ---------------------------------------------------------------------------------
def test_functional_dropout_draws_its_mask_from_the_generator():
    x = RNG.standard_normal((3, 7, 5))
    seed = _seeds(11, 1)[0]
    opsnn.manual_seed(11)
    y = nn.functional.dropout(opsnn.tensor(x), 0.3).numpy()
    np.testing.assert_allclose(y, x * np.where(_keep(seed, x.shape, 0.3), 1 / 0.7, 0.0), rtol=1e-15, atol=0)
    t = opsnn.tensor(x)
    assert nn.functional.dropout(t, 0.3, training=False) is t
    assert nn.functional.dropout(t, 0.0) is t
    np.testing.assert_array_equal(nn.functional.dropout(t, 1.0).numpy(), np.zeros_like(x))
    with pytest.raises(OpsnnError, match=r"dropout: dropout probability must be in \[0, 1\], got 1.5"):
        nn.functional.dropout(t, 1.5)
    with pytest.raises(OpsnnError, match=r"LSTM: dropout must be in \[0, 1\], got -0.1"):
        nn.LSTM(4, 4, num_layers=2, dropout=-0.1)
    with pytest.raises(OpsnnError, match=r"MultiheadAttention: dropout must be in \[0, 1\], got 2.0"):
        nn.MultiheadAttention(8, 2, dropout=2.0)


# -- MultiheadAttention against torch -------------------------------------------------------------------
def _mha_pair(torch, E=16, H=4, p=0.1, batch_first=True):
    with nn.init.seeded(3):
        m = nn.MultiheadAttention(E, H, dropout=p, batch_first=batch_first, dtype="float64")
    m.in_proj_bias.copy_(RNG.standard_normal(3 * E) * 0.1)
    m.out_proj.bias.copy_(RNG.standard_normal(E) * 0.1)
    t = torch.nn.MultiheadAttention(E, H, dropout=p, batch_first=batch_first, dtype=torch.float64)
    with torch.no_grad():
        t.in_proj_weight.copy_(torch.from_numpy(m.in_proj_weight.numpy()))
        t.in_proj_bias.copy_(torch.from_numpy(m.in_proj_bias.numpy()))
        t.out_proj.weight.copy_(torch.from_numpy(m.out_proj.weight.numpy()))
        t.out_proj.bias.copy_(torch.from_numpy(m.out_proj.bias.numpy()))
    return m, t


def _patch_torch_dropout(monkeypatch, torch, keeps):
    """torch's MHA calls ``torch.nn.functional.dropout`` on the probabilities: hand it our masks, in order."""
    masks = iter(keeps)

    def dropout(x, p=0.5, training=True, inplace=False):
        assert training and p > 0
        keep = torch.from_numpy(next(masks).reshape(tuple(x.shape)))
        return x * keep / (1.0 - p)

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)


@pytest.mark.parametrize(
    "case",
    ["self", "cross_kpm", "causal", "not_batch_first"],
)
def test_mha_train_dropout_matches_torch_given_the_same_mask(case, monkeypatch):
    torch = pytest.importorskip("torch")
    p, N, L, S, E, H = 0.1, 2, 5, 7, 16, 4
    m, t = _mha_pair(torch, E, H, p, batch_first=case != "not_batch_first")
    m.train()
    t.train()
    S = L if case in ("self", "causal", "not_batch_first") else S
    q = RNG.standard_normal((N, L, E))
    kv = q if S == L else RNG.standard_normal((N, S, E))
    if case == "not_batch_first":
        q = kv = q.transpose(1, 0, 2).copy()
    kpm = None
    if case == "cross_kpm":
        kpm = np.zeros((N, S), bool)
        kpm[0, -3:] = kpm[1, :2] = True
    amask = np.triu(np.ones((L, L), bool), 1) if case == "causal" else None
    seed = _seeds(7, 1)[0]
    keep = _keep(seed, (N, H, L, S), p)
    _patch_torch_dropout(monkeypatch, torch, [keep])

    qo = opsnn.tensor(q).requires_grad_()
    kvo = qo if kv is q else opsnn.tensor(kv).requires_grad_()
    opsnn.manual_seed(7)
    out, w = m(qo, kvo, kvo, key_padding_mask=kpm, is_causal=case == "causal", average_attn_weights=False)
    qt = torch.tensor(q, requires_grad=True)
    kvt = qt if kv is q else torch.tensor(kv, requires_grad=True)
    tout, tw = t(
        qt,
        kvt,
        kvt,
        key_padding_mask=None if kpm is None else torch.from_numpy(kpm),
        attn_mask=None if amask is None else torch.from_numpy(amask),
        is_causal=case == "causal",
        average_attn_weights=False,
    )
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **TOL)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), **TOL)  # torch returns the dropped weights
    assert (w.numpy()[~keep] == 0).all()

    r = RNG.standard_normal(out.shape)
    ops.sum(ops.mul(out, opsnn.tensor(r))).backward()
    (tout * torch.from_numpy(r)).sum().backward()
    np.testing.assert_allclose(qo.grad.numpy(), qt.grad.numpy(), **TOL)
    np.testing.assert_allclose(kvo.grad.numpy(), kvt.grad.numpy(), **TOL)
    for name, prm in m.named_parameters():
        np.testing.assert_allclose(prm.grad.numpy(), dict(t.named_parameters())[name].grad.numpy(), **TOL, err_msg=name)

    # need_weights=False: the same masked output, no weights
    opsnn.manual_seed(7)
    out2, w2 = m(qo, kvo, kvo, key_padding_mask=kpm, need_weights=False, is_causal=case == "causal")
    assert w2 is None
    np.testing.assert_array_equal(out2.numpy(), out.numpy())


def test_mha_eval_and_p0_equal_torch_without_dropout():
    torch = pytest.importorskip("torch")
    m, t = _mha_pair(torch, p=0.1)
    x = RNG.standard_normal((2, 6, 16))
    kpm = np.zeros((2, 6), bool)
    kpm[1, -2:] = True
    t.eval()
    with torch.no_grad():
        want, ww = t(*(torch.from_numpy(x),) * 3, key_padding_mask=torch.from_numpy(kpm))
    got, gw = m.eval()(x, x, x, key_padding_mask=kpm)
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    np.testing.assert_allclose(gw.numpy(), ww.numpy(), **TOL)
    m.dropout = 0.0
    m.train()
    opsnn.manual_seed(1)
    got0, gw0 = m(x, x, x, key_padding_mask=kpm)
    np.testing.assert_allclose(got0.numpy(), want.numpy(), **TOL)
    np.testing.assert_allclose(gw0.numpy(), ww.numpy(), **TOL)


def test_mha_fully_masked_row_gives_zeros_and_finite_gradients():
    m = nn.MultiheadAttention(8, 2, dropout=0.2, batch_first=True, dtype="float64").train()
    x = opsnn.tensor(RNG.standard_normal((2, 3, 8))).requires_grad_()
    kpm = np.zeros((2, 3), bool)
    kpm[1] = True
    opsnn.manual_seed(2)
    out, w = m(x, x, x, key_padding_mask=kpm)
    assert (w.numpy()[1] == 0).all() and np.isfinite(w.numpy()).all()
    bias = m.out_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy()[1], np.broadcast_to(bias, (3, 8)), rtol=0, atol=1e-15)
    ops.sum(out).backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_mha_keep_rate_is_one_minus_p():
    p = 0.25
    m = nn.MultiheadAttention(16, 4, dropout=p, batch_first=True).train()
    x = RNG.standard_normal((4, 32, 16)).astype(np.float32)
    opsnn.manual_seed(3)
    _, w = m(x, x, x, average_attn_weights=False)
    kept = w.numpy() != 0  # softmax probabilities of unmasked scores are never exactly 0
    n = kept.size
    assert abs(kept.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)
    opsnn.manual_seed(4)
    _, w2 = m(x, x, x, average_attn_weights=False)
    assert not np.array_equal(w2.numpy() != 0, kept)  # another seed, another mask


# -- LSTM / GRU against torch ---------------------------------------------------------------------------
def _torch_stack(torch, m, kind, x, keeps, p):
    """torch's multi-layer RNN with inter-layer dropout, spelled out: one-layer modules, our mask between."""
    T = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}[kind]
    y, params, finals = torch.from_numpy(x), [], []
    for layer in range(m.num_layers):
        t = T(y.shape[-1], m.hidden_size, bidirectional=m.bidirectional, dtype=torch.float64)
        with torch.no_grad():
            for name, prm in t.named_parameters():
                prm.copy_(torch.from_numpy(getattr(m, name.replace("_l0", f"_l{layer}")).numpy()))
        params.append(t)
        y, hn = t(y)
        finals.append(hn)
        if layer + 1 < m.num_layers:
            y = y * torch.from_numpy(keeps[layer]) / (1.0 - p)
    return y, finals, params


@pytest.mark.parametrize("kind,bidirectional,layers", [("LSTM", False, 2), ("GRU", True, 3)])
def test_rnn_interlayer_dropout_matches_torch_given_the_same_masks(kind, bidirectional, layers):
    torch = pytest.importorskip("torch")
    p, L, N, I, H = 0.2, 6, 3, 5, 4
    D = 2 if bidirectional else 1
    with nn.init.seeded(4):
        m = getattr(nn, kind)(I, H, num_layers=layers, dropout=p, bidirectional=bidirectional, dtype="float64")
    m.train()
    x = RNG.standard_normal((L, N, I))
    keeps = [_keep(s, (L, N, D * H), p) for s in _seeds(9, layers - 1)]
    xo = opsnn.tensor(x).requires_grad_()
    opsnn.manual_seed(9)
    out, state = m(xo)
    want, finals, tmods = _torch_stack(torch, m, kind, x, keeps, p)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    if kind == "LSTM":
        np.testing.assert_allclose(state[0].numpy(), torch.cat([h for h, _ in finals]).detach().numpy(), **TOL)
        np.testing.assert_allclose(state[1].numpy(), torch.cat([c for _, c in finals]).detach().numpy(), **TOL)
    else:
        np.testing.assert_allclose(state.numpy(), torch.cat(finals).detach().numpy(), **TOL)
    r = RNG.standard_normal(out.shape)
    ops.sum(ops.mul(out, opsnn.tensor(r))).backward()
    (want * torch.from_numpy(r)).sum().backward()
    for layer, t in enumerate(tmods):
        for name, prm in t.named_parameters():
            ours = getattr(m, name.replace("_l0", f"_l{layer}")).grad.numpy()
            np.testing.assert_allclose(ours, prm.grad.numpy(), **TOL, err_msg=f"layer {layer} {name}")


def test_rnn_eval_one_layer_and_p0_have_no_dropout():
    x = RNG.standard_normal((4, 2, 3)).astype(np.float32)
    with nn.init.seeded(5):
        m = nn.LSTM(3, 4, num_layers=2, dropout=0.5)
    want = m(x)[0].numpy()  # eval
    m.train()
    m.dropout = 0.0
    np.testing.assert_array_equal(m(x)[0].numpy(), want)
    m.dropout = 0.5
    opsnn.manual_seed(0)
    assert not np.array_equal(m(x)[0].numpy(), want)
    one = nn.GRU(3, 4, num_layers=1, dropout=0.5).train()  # torch: no layer after the only one
    np.testing.assert_array_equal(one(x)[0].numpy(), one.eval()(x)[0].numpy())


# -- compiled training ----------------------------------------------------------------------------------
class _Net(nn.Module):
    """MultiheadAttention (attention dropout 0.1) -> 2-layer LSTM (inter-layer dropout 0.2) -> head."""

    def __init__(self, which):
        super().__init__()
        self.which = which
        self.mha = nn.MultiheadAttention(16, 4, dropout=0.1, batch_first=True)
        self.lstm = nn.LSTM(16, 12, num_layers=2, dropout=0.2, batch_first=True)
        self.head = nn.Linear(12 if which != "mha" else 16, 3)

    def forward(self, x):
        if self.which != "lstm":
            x = self.mha(x, x, x, key_padding_mask=KPM, need_weights=False)[0]
        if self.which != "mha":
            x = self.lstm(x)[0]
        return self.head(ops.mean(x, dim=1))


X = RNG.standard_normal((3, 6, 16)).astype(np.float32)
Y = RNG.integers(0, 3, 3)
KPM = np.zeros((3, 6), bool)
KPM[1, 4:] = KPM[2] = True  # sample 2 attends to nothing: zeros, as the fused op


def _run(which, compiled, seed=5, steps=4, lr=1e-2, train=True):
    with nn.init.seeded(0):
        net = _Net(which)
    net.train(train)
    opt = optim.AdamW(net.parameters(), lr=lr)

    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss

    opsnn.manual_seed(seed)
    step = opsnn.compile(train_step) if compiled else train_step
    losses = [float(step(opsnn.tensor(X), opsnn.tensor(Y)).item()) for _ in range(steps)]
    return np.array(losses), step, net


@pytest.mark.parametrize("which,n_drop", [("mha", 1), ("lstm", 1), ("both", 2)])
def test_compiled_step_with_attention_and_rnn_dropout_matches_eager(which, n_drop):
    closs, step, cnet = _run(which, True)
    assert step.num_compiles == 1 and step.compiled_graph.mode == "compiled", step.compiled_graph.mode_reason
    kinds = [n.op_type for n in step.graph().nodes]
    assert kinds.count("NativeDropout") == n_drop and kinds.count("NativeDropoutBackward") == n_drop
    assert sum(name.startswith("dropout_seed") for name in step._current().host_inputs) == n_drop
    eloss, _, enet = _run(which, False)
    np.testing.assert_allclose(closs, eloss, rtol=1e-5, atol=1e-7)  # the same masks, step by step
    for (name, a), b in zip(cnet.named_parameters(), enet.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    again, _, _ = _run(which, True)
    np.testing.assert_array_equal(again, closs)  # the same seed, the same run
    other, _, _ = _run(which, True, seed=6)
    assert not np.array_equal(other, closs)


@pytest.mark.parametrize("which", ["mha", "lstm"])
def test_compiled_masks_differ_across_steps(which):
    """With lr 0 the parameters stay put, so only the masks change the loss from step to step."""
    closs, _, _ = _run(which, True, lr=0.0)
    assert len(set(closs.tolist())) == 4
    clean, _, _ = _run(which, True, lr=0.0, steps=2, train=False)
    assert clean[0] == clean[1]
