"""opsnn.nn: module system, state dicts, weight files, layers against numpy formulas of torch's
semantics, MultiheadAttention, LSTM/GRU (torch gate layouts), tracing to graphs."""

import math

import numpy as np
import pytest

import opsnn
from opsnn import nn
from opsnn.errors import DTypeError, ParamInvalidError

T = opsnn.tensor


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# -- module system -----------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm2d(3)
        self.register_buffer("scratch", np.zeros(2, np.float32), persistent=False)
        self.scale = nn.Parameter(np.ones(3, np.float32))

    def forward(self, x):
        return opsnn.ops.mul(self.fc(x), self.scale)


def test_registration_and_names():
    b = Block()
    assert [n for n, _ in b.named_parameters()] == ["scale", "fc.weight", "fc.bias", "bn.weight", "bn.bias"]
    assert [n for n, _ in b.named_buffers()] == [
        "scratch",
        "bn.running_mean",
        "bn.running_var",
        "bn.num_batches_tracked",
    ]
    sd = b.state_dict()
    assert "scratch" not in sd and "bn.running_var" in sd and "bn.num_batches_tracked" in sd
    assert all(isinstance(p, opsnn.Tensor) for p in b.parameters())
    assert b.num_parameters() == 3 + 12 + 3 + 3 + 3
    assert [n for n, _ in b.named_modules()] == ["", "fc", "bn"]
    # shared parameters are listed once
    s = nn.Sequential(b.fc, b.fc)
    assert len(list(s.parameters())) == 2 and list(s.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    # assigning None / a Tensor to a registered parameter
    b.fc.bias = None
    assert "fc.bias" not in b.state_dict()
    with pytest.raises(ParamInvalidError):
        b.fc.weight = "not a tensor"
    assert "Linear(in_features=4" in repr(b)


def test_module_needs_super_init():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.zeros(2))

    with pytest.raises(ParamInvalidError, match="super"):
        Bad()


def test_seeded_init_is_deterministic():
    def build(seed):
        with nn.init.seeded(seed):
            return nn.Sequential(nn.Linear(5, 7), nn.Conv2d(3, 4, 3), nn.Embedding(10, 4), nn.LSTM(3, 5))

    a, b, c = build(1), build(1), build(2)
    for (n, x), (_, y), (_, z) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert np.array_equal(x.numpy(), y.numpy()), n
        if x.numel > 1 and n.endswith("weight"):
            assert not np.array_equal(x.numpy(), z.numpy()), n
    # torch's default bounds: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w = a[0].weight.numpy()
    assert np.abs(w).max() <= 1 / math.sqrt(5) + 1e-7


def test_load_state_dict_roundtrip_and_errors(rng):
    b, b2 = Block(), Block()
    b2.load_state_dict({k: v.numpy().copy() for k, v in b.state_dict().items()})
    for k, v in b.state_dict().items():
        assert np.array_equal(v.numpy(), b2.state_dict()[k].numpy())
    before = b2.fc.weight.numpy().copy()
    sd = {k: v.numpy() for k, v in b.state_dict().items()}
    sd.pop("fc.bias")
    sd["extra.weight"] = np.zeros(3)
    sd["fc.weight"] = np.zeros((5, 4), np.float32)
    sd["bn.bias"] = np.zeros(4, np.float32)
    with pytest.raises(nn.StateDictError) as ei:
        b2.load_state_dict(sd)
    e = ei.value
    assert e.missing == ["fc.bias"] and e.unexpected == ["extra.weight"]
    assert [m[0] for m in e.mismatched] == ["fc.weight", "bn.bias"]
    msg = str(e)
    for name in ("fc.bias", "extra.weight", "fc.weight", "(3, 4)", "(5, 4)", "bn.bias"):
        assert name in msg
    assert isinstance(e, ParamInvalidError) and e.code == 161002
    assert np.array_equal(b2.fc.weight.numpy(), before)  # nothing written
    # non-strict: missing/unexpected reported, shapes still checked
    sd["fc.weight"] = np.ones((3, 4), np.float64)  # float64 is cast
    sd["bn.bias"] = np.ones(3, np.float32)
    res = b2.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["fc.bias"] and res.unexpected_keys == ["extra.weight"]
    assert b2.fc.weight.dtype == np.float32 and np.all(b2.fc.weight.numpy() == 1)
    # BatchNorm's num_batches_tracked is optional (checkpoints exported without it load)
    sd = {k: v for k, v in b.state_dict().items() if not k.endswith("num_batches_tracked")}
    b2.load_state_dict(sd)
    # a float value into an int buffer is a dtype mismatch
    sd["bn.num_batches_tracked"] = np.array(1.5)
    with pytest.raises(nn.StateDictError, match="num_batches_tracked"):
        b2.load_state_dict(sd)
    with pytest.raises(ParamInvalidError):
        b2.load_state_dict([1, 2])


def test_module_to_dtype():
    lin = nn.Linear(3, 2).to("float64")
    assert lin.weight.dtype == np.float64 and isinstance(lin.weight, nn.Parameter)
    y = lin(np.ones((1, 3)))
    assert y.dtype == np.float64


# -- layers vs numpy formulas ------------------------------------------------------------------------------------
def test_linear_conv_norms_match_numpy(rng):
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    lin = nn.Linear(6, 4)
    W, bb = lin.weight.numpy(), lin.bias.numpy()
    assert rel(lin(x).numpy(), x @ W.T + bb) < 1e-6
    ln = nn.LayerNorm(6, eps=1e-5)
    ln.load_state_dict({"weight": rng.standard_normal(6), "bias": rng.standard_normal(6)})
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy() + ln.bias.numpy()
    assert rel(ln(x).numpy(), ref) < 1e-5
    rms = nn.RMSNorm(6, eps=1e-6)
    rms.load_state_dict({"weight": rng.standard_normal(6)})
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * rms.weight.numpy()
    assert rel(rms(x).numpy(), ref) < 1e-5

    img = rng.standard_normal((2, 6, 5, 7)).astype(np.float32)
    gn = nn.GroupNorm(3, 6)
    gn.load_state_dict({"weight": rng.standard_normal(6), "bias": rng.standard_normal(6)})
    g = img.reshape(2, 3, -1)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(img.shape)
    ref = ref * gn.weight.numpy()[:, None, None] + gn.bias.numpy()[:, None, None]
    assert rel(gn(img).numpy(), ref) < 1e-5
    bn = nn.BatchNorm2d(6, eps=1e-3)
    sd = {
        "weight": rng.standard_normal(6),
        "bias": rng.standard_normal(6),
        "running_mean": rng.standard_normal(6),
        "running_var": rng.uniform(0.5, 2, 6),
    }
    bn.load_state_dict(sd)
    c = lambda v: np.asarray(v, np.float32)[:, None, None]
    ref = (img - c(sd["running_mean"])) / np.sqrt(c(sd["running_var"]) + 1e-3) * c(sd["weight"]) + c(sd["bias"])
    assert rel(bn(img).numpy(), ref) < 1e-5
    bn.train()  # batch statistics (tests/test_autograd.py checks them and the running update against torch)
    ref = (img - img.mean((0, 2, 3), keepdims=True)) / np.sqrt(img.var((0, 2, 3), keepdims=True) + 1e-3) * c(
        sd["weight"]
    ) + c(sd["bias"])
    assert rel(bn(img).numpy(), ref) < 1e-5

    conv = nn.Conv2d(6, 4, 3, stride=2, padding=1, dilation=1, groups=2)
    y = conv(img).numpy()
    w, cb = conv.weight.numpy(), conv.bias.numpy()
    xp = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros_like(y)
    for o in range(4):
        gidx = o // 2
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                patch = xp[:, gidx * 3 : (gidx + 1) * 3, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
                ref[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3)) + cb[o]
    assert rel(y, ref) < 1e-5


def test_conv2d_config_algo(rng):
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    names = nn.conv_kernels()
    assert "conv2d_im2col" in names
    with nn.init.seeded(3):
        forced = nn.Conv2d(3, 5, 3, padding=1, config={"algo": "conv2d_im2col"})
    with nn.init.seeded(3):
        ref = nn.Conv2d(3, 5, 3, padding=1, config={"algo": "reference"})
    ex = opsnn.aclnn.conv2d.prepare(T(x), forced.weight, forced.bias, padding=(1, 1), algo=forced.algo)
    assert ex.kernel_name == "conv2d_im2col"
    assert rel(forced(x).numpy(), ref(x).numpy()) < 1e-5
    assert nn.Conv2d(3, 5, 3, config={"algo": "im2col"}).algo == "conv2d_im2col"  # short form
    if "conv2d_winograd" in names:
        x16 = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)
        with nn.init.seeded(4):
            wg = nn.Conv2d(16, 16, 3, padding=1, config={"algo": "winograd"})
        with nn.init.seeded(4):
            wref = nn.Conv2d(16, 16, 3, padding=1, config={"algo": "reference"})
        assert wg.algo == "conv2d_winograd" and rel(wg(x16).numpy(), wref(x16).numpy()) < 1e-4
    else:
        with pytest.raises(ParamInvalidError, match="conv2d_im2col"):
            nn.Conv2d(3, 5, 3, config={"algo": "winograd"})
    with pytest.raises(ParamInvalidError) as ei:
        nn.Conv2d(3, 5, 3, config={"algo": "fft"})
    for n in names:  # the error lists every Conv kernel
        assert n in str(ei.value)
    with pytest.raises(ParamInvalidError, match="config"):
        nn.Conv2d(3, 5, 3, config={"tile": 4})
    with pytest.raises(ParamInvalidError):
        nn.Conv2d(3, 5, 3, groups=2)


def test_embedding_and_out_of_vocabulary():
    emb = nn.Embedding(10, 4, padding_idx=0)
    assert np.all(emb.weight.numpy()[0] == 0)
    ids = np.array([[1, 2], [9, 0]])
    assert np.array_equal(emb(ids).numpy(), emb.weight.numpy()[ids])
    for bad in (np.array([[1, 10]]), np.array([-1])):
        with pytest.raises(nn.OutOfVocabularyError, match="vocabulary of 10"):
            emb(bad)
    with pytest.raises(DTypeError):
        emb(np.array([1.0]))


def test_dropout_activations_sequential(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    d = nn.Dropout(0.5)
    assert np.array_equal(d(T(x)).numpy(), x)  # eval mode: identity
    with pytest.raises(ParamInvalidError):
        nn.Dropout(1.5)
    seq = nn.Sequential(nn.ReLU(), nn.SiLU(), nn.GELU(), nn.Identity())
    r = np.maximum(x, 0)
    s = r / (1 + np.exp(-r))
    from math import erf

    g = 0.5 * s * (1 + np.vectorize(erf)(s / math.sqrt(2)))
    assert rel(seq(x).numpy(), g) < 1e-5
    assert len(seq) == 4 and isinstance(seq[1], nn.SiLU) and len(seq[1:]) == 3
    ml = nn.ModuleList([nn.ReLU(), nn.Tanh()])
    assert len(ml) == 2 and [n for n, _ in ml.named_children()] == ["0", "1"]


# -- MultiheadAttention ----------------------------------------------------------------------------------------
def _mha_ref(mha, q, k, v, kpm=None, am=None, average=True, causal=False):
    """torch.nn.MultiheadAttention's math in numpy (batch-first inputs)."""
    E, H = mha.embed_dim, mha.num_heads
    D = E // H
    if mha.in_proj_weight is not None:
        Wq, Wk, Wv = np.split(mha.in_proj_weight.numpy(), 3)
    else:
        Wq, Wk, Wv = mha.q_proj_weight.numpy(), mha.k_proj_weight.numpy(), mha.v_proj_weight.numpy()
    bq, bk, bv = np.split(mha.in_proj_bias.numpy(), 3)
    N, L, S = q.shape[0], q.shape[1], k.shape[1]
    Q = (q @ Wq.T + bq).reshape(N, L, H, D).transpose(0, 2, 1, 3)
    K = (k @ Wk.T + bk).reshape(N, S, H, D).transpose(0, 2, 1, 3)
    V = (v @ Wv.T + bv).reshape(N, S, H, D).transpose(0, 2, 1, 3)
    s = Q @ K.transpose(0, 1, 3, 2) / math.sqrt(D)
    if kpm is not None:
        s = s + np.where(kpm, -np.inf, 0)[:, None, None, :] if kpm.dtype == bool else s + kpm[:, None, None, :]
    if am is not None:
        a = np.where(am, -np.inf, 0) if am.dtype == bool else am
        s = s + (a.reshape(N, H, L, S) if a.ndim == 3 else a)
    if causal:
        s = s + np.triu(np.full((L, S), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    y = (p @ V).transpose(0, 2, 1, 3).reshape(N, L, E)
    y = y @ mha.out_proj.weight.numpy().T + mha.out_proj.bias.numpy()
    return y, (p.mean(1) if average else p)


def test_multihead_attention_matches_torch_semantics(rng):
    E, H, N, L, S = 16, 4, 2, 5, 7
    mha = nn.MultiheadAttention(E, H, batch_first=True)
    mha.in_proj_bias.copy_(rng.standard_normal(3 * E) * 0.1)
    mha.out_proj.bias.copy_(rng.standard_normal(E) * 0.1)
    q = rng.standard_normal((N, L, E)).astype(np.float32)
    kv = rng.standard_normal((N, S, E)).astype(np.float32)
    kpm = np.zeros((N, S), bool)
    kpm[1, 5:] = True
    am = rng.standard_normal((L, S)).astype(np.float32)
    y, w = mha(T(q), T(kv), T(kv), key_padding_mask=kpm, attn_mask=am)
    ry, rw = _mha_ref(mha, q, kv, kv, kpm, am)
    assert rel(y.numpy(), ry) < 1e-5 and rel(w.numpy(), rw) < 1e-5
    y2, w2 = mha(T(q), T(kv), T(kv), key_padding_mask=kpm, attn_mask=am, need_weights=False)
    assert w2 is None and rel(y2.numpy(), ry) < 1e-5
    # per-head weights, a (N*H, L, S) boolean mask
    am3 = rng.random((N * H, L, S)) < 0.3
    am3[..., 0] = False
    y, w = mha(T(q), T(kv), T(kv), attn_mask=am3, average_attn_weights=False)
    ry, rw = _mha_ref(mha, q, kv, kv, None, am3, average=False)
    assert w.shape == (N, H, L, S) and rel(y.numpy(), ry) < 1e-5 and rel(w.numpy(), rw) < 1e-5
    # self-attention, causal, sequence-first layout
    mha_sf = nn.MultiheadAttention(E, H)
    x = rng.standard_normal((L, N, E)).astype(np.float32)
    xt = T(x)
    y, _ = mha_sf(xt, xt, xt, need_weights=False, is_causal=True)
    xb = x.transpose(1, 0, 2)
    ry, _ = _mha_ref(mha_sf, xb, xb, xb, causal=True)
    assert y.shape == (L, N, E) and rel(y.numpy(), ry.transpose(1, 0, 2)) < 1e-5
    # unbatched 2-D input
    y, w = mha(T(q[0]), T(kv[0]), T(kv[0]))
    ry, rw = _mha_ref(mha, q[:1], kv[:1], kv[:1])
    assert y.shape == (L, E) and rel(y.numpy(), ry[0]) < 1e-5 and w.shape == (L, S)


def test_multihead_attention_kdim_vdim_and_errors(rng):
    mha = nn.MultiheadAttention(8, 2, kdim=6, vdim=5, batch_first=True)
    assert mha.in_proj_weight is None and mha.k_proj_weight.shape == (8, 6)
    q = rng.standard_normal((1, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 4, 6)).astype(np.float32)
    v = rng.standard_normal((1, 4, 5)).astype(np.float32)
    y, w = mha(q, k, v)
    ry, rw = _mha_ref(mha, q, k, v)
    assert rel(y.numpy(), ry) < 1e-5 and rel(w.numpy(), rw) < 1e-5
    assert "k_proj_weight" in mha.state_dict() and "in_proj_weight" not in mha.state_dict()
    with pytest.raises(ParamInvalidError, match="divisible"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ParamInvalidError, match="key_padding_mask"):
        mha(q, k, v, key_padding_mask=np.zeros((1, 3), bool))
    with pytest.raises(ParamInvalidError, match="attn_mask"):
        mha(q, k, v, attn_mask=np.zeros((2, 2), np.float32))
    with pytest.raises(ParamInvalidError):
        nn.MultiheadAttention(8, 2, add_bias_kv=True)


# -- LSTM / GRU ----------------------------------------------------------------------------------------------------
def _sig(x):
    return 1 / (1 + np.exp(-x))


def _rnn_ref(mod, x, h0=None, c0=None):
    """torch's LSTM/GRU equations with torch's gate order, sequence-first x (L, N, I)."""
    lstm = isinstance(mod, nn.LSTM)
    Hs, dirs = mod.hidden_size, mod.num_directions
    L, N, _ = x.shape
    inp, hn, cn = x.astype(np.float64), [], []
    for layer in range(mod.num_layers):
        outs = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            Wi, Wh = getattr(mod, "weight_ih" + sfx).numpy(), getattr(mod, "weight_hh" + sfx).numpy()
            bi, bh = getattr(mod, "bias_ih" + sfx).numpy(), getattr(mod, "bias_hh" + sfx).numpy()
            idx = layer * dirs + d
            h = np.zeros((N, Hs)) if h0 is None else h0[idx].astype(np.float64)
            c = np.zeros((N, Hs)) if c0 is None else c0[idx].astype(np.float64)
            ys = [None] * L
            for t in range(L - 1, -1, -1) if d else range(L):
                gi, gh = inp[t] @ Wi.T + bi, h @ Wh.T + bh
                if lstm:
                    i, f, g, o = np.split(gi + gh, 4, axis=1)
                    c = _sig(f) * c + _sig(i) * np.tanh(g)
                    h = _sig(o) * np.tanh(c)
                else:
                    ir, iz, inn = np.split(gi, 3, axis=1)
                    hr, hz, hn_ = np.split(gh, 3, axis=1)
                    r, z = _sig(ir + hr), _sig(iz + hz)
                    n = np.tanh(inn + r * hn_)
                    h = (1 - z) * n + z * h
                ys[t] = h
            outs.append(np.stack(ys))
            hn.append(h)
            cn.append(c)
        inp = np.concatenate(outs, axis=2)
    return inp, np.stack(hn), np.stack(cn)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_rnn_matches_torch_equations(rng, cls):
    mod = cls(5, 7, num_layers=2, bidirectional=True)
    x = rng.standard_normal((6, 3, 5)).astype(np.float32)
    h0 = rng.standard_normal((4, 3, 7)).astype(np.float32)
    c0 = rng.standard_normal((4, 3, 7)).astype(np.float32)
    ry, rh, rc = _rnn_ref(mod, x, h0, c0 if cls is nn.LSTM else None)
    if cls is nn.LSTM:
        y, (h, c) = mod(x, (h0, c0))
        assert rel(c.numpy(), rc) < 1e-5
    else:
        y, h = mod(x, h0)
    assert y.shape == (6, 3, 14) and h.shape == (4, 3, 7)
    assert rel(y.numpy(), ry) < 1e-5 and rel(h.numpy(), rh) < 1e-5
    # batch_first, no initial state, one layer, one direction
    bf = cls(5, 4, batch_first=True)
    y = bf(np.ascontiguousarray(x.transpose(1, 0, 2)))[0]
    ry = _rnn_ref(bf, x)[0]
    assert y.shape == (3, 6, 4) and rel(y.numpy(), ry.transpose(1, 0, 2)) < 1e-5
    # unbatched (L, I)
    one = cls(5, 4)
    y = one(x[:, 0])[0]
    assert y.shape == (6, 4) and rel(y.numpy(), _rnn_ref(one, x[:, :1])[0][:, 0]) < 1e-5
    with pytest.raises(ParamInvalidError, match="input must be"):
        mod(np.zeros((6, 3, 4), np.float32))
    with pytest.raises(ParamInvalidError, match="h_0"):
        mod(x, h0[:2] if cls is nn.GRU else (h0[:2], c0[:2]))


def test_rnn_gate_reordering_is_documented():
    lstm = nn.LSTM(2, 3)
    W, R, B = lstm.onnx_weights(0)
    w = lstm.weight_ih_l0.numpy()
    # ONNX (i, o, f, c) from torch (i, f, g, o)
    assert np.array_equal(W[0], np.concatenate([w[0:3], w[9:12], w[3:6], w[6:9]]))
    assert B.shape == (1, 24) and R.shape == (1, 12, 3)
    gru = nn.GRU(2, 3)
    W, _, _ = gru.onnx_weights(0)
    w = gru.weight_ih_l0.numpy()
    assert np.array_equal(W[0], np.concatenate([w[3:6], w[0:3], w[6:9]]))  # (z, r, h) from (r, z, n)


# -- weight files ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_weight_files_roundtrip(tmp_path, ext):
    if ext == ".safetensors":
        pytest.importorskip("safetensors")
    with nn.init.seeded(0):
        a = Block()
    with nn.init.seeded(1):
        b = Block()
    path = a.save_weights(tmp_path / f"w{ext}")
    b.load_weights(path)
    for k, v in a.state_dict().items():
        assert np.array_equal(v.numpy(), b.state_dict()[k].numpy()), k
    # a file with missing, extra and mis-shaped tensors
    sd = {k: v.numpy() for k, v in a.state_dict().items()}
    del sd["fc.weight"]
    sd["fc.bias"] = np.zeros(7, np.float32)
    sd["head.weight"] = np.zeros(1, np.float32)
    bad = nn.write_weights(sd, tmp_path / f"bad{ext}")
    with pytest.raises(nn.StateDictError) as ei:
        b.load_weights(bad)
    assert ei.value.missing == ["fc.weight"] and ei.value.unexpected == ["head.weight"]
    assert ei.value.mismatched == [("fc.bias", (3,), (7,))]


def _hand_built_mlp_onnx(path, w0, b0, w2, b2):
    """An ONNX file written here with onnx.helper (not by opsnn's exporter): Gemm with torch's
    (out, in) weight layout, then MatMul over a ``<name>.T`` transposed initializer, plus an
    initializer that is no weight of the module (a constant)."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(w0, "0.weight"),
        numpy_helper.from_array(b0, "0.bias"),
        numpy_helper.from_array(np.ascontiguousarray(w2.T), "2.weight.T"),
        numpy_helper.from_array(b2, "2.bias"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "0.weight", "0.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "2.weight.T"], ["m"]),
        helper.make_node("Add", ["m", "2.bias"], ["a"]),
        helper.make_node("Mul", ["a", "one"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return model


def test_weights_from_hand_built_onnx_initializers(tmp_path, rng):
    """Weights come from an independently written ONNX file's initializers by name; onnxruntime
    running that file is the oracle for the loaded module's eager output."""
    ort = pytest.importorskip("onnxruntime")
    w0, b0 = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    w2, b2 = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    path = tmp_path / "mlp.onnx"
    _hand_built_mlp_onnx(path, w0, b0, w2, b2)
    got = nn.read_weights(path)  # without a name filter: every initializer, ".T" ones read back transposed
    assert sorted(got) == ["0.bias", "0.weight", "2.bias", "2.weight", "one"]
    assert np.array_equal(got["2.weight"], w2)
    with nn.init.seeded(7):
        net = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))
    assert net.load_weights(path) == nn.IncompatibleKeys([], [])  # "one" is not a weight: ignored
    assert np.array_equal(net[2].weight.numpy(), w2) and np.array_equal(net[0].weight.numpy(), w0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, {"x": x})
    assert rel(net(x).numpy(), ref) < 1e-5
    # a file with a mis-shaped and a missing weight: both named, nothing written
    bad = tmp_path / "bad.onnx"
    _hand_built_mlp_onnx(bad, w0, np.zeros(4, np.float32), w2, b2)
    model = __import__("onnx").load(str(bad))
    del model.graph.initializer[3]  # "2.bias"
    model.graph.node[3].input[1] = "m"  # keep the graph valid without it
    __import__("onnx").save(model, str(bad))
    with nn.init.seeded(8):
        other = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 2))
    before = {k: v.numpy().copy() for k, v in other.state_dict().items()}
    with pytest.raises(nn.StateDictError) as ei:
        other.load_weights(bad)
    assert ei.value.missing == ["2.bias"] and ei.value.mismatched == [("0.bias", (3,), (4,))]
    assert "2.bias" in str(ei.value) and "0.bias" in str(ei.value)
    assert all(np.array_equal(v.numpy(), before[k]) for k, v in other.state_dict().items())
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07garbage")
    with pytest.raises(nn.WeightFileError, match="could not be read as .onnx"):
        other.load_weights(junk)


def test_weight_file_errors(tmp_path):
    b = Block()
    with pytest.raises(nn.WeightFileError, match="does not exist"):
        b.load_weights(tmp_path / "nope.safetensors")
    with pytest.raises(nn.WeightFileError, match="unknown format"):
        b.load_weights(tmp_path / "w.bin")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(nn.WeightFileError, match="could not be read"):
        b.load_weights(junk)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    with pytest.raises(nn.WeightFileError):
        b.load_weights(junk)


# -- tracing ---------------------------------------------------------------------------------------------------------
def test_to_graph_names_weights_and_keeps_batch_dynamic(rng):
    with nn.init.seeded(0):
        net = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
    x = rng.standard_normal((2, 6)).astype(np.float32)
    g = net.to_graph([x], dynamic_dims={"x": {0: "batch"}})
    assert set(g.initializers) == set(net.state_dict())
    assert [v.name for v in g.inputs] == ["x"]
    cg = opsnn.compile(g)
    x5 = rng.standard_normal((5, 6)).astype(np.float32)
    out = cg.run([x5])
    out = out[0] if isinstance(out, (list, tuple)) else next(iter(out.values()))
    assert rel(out.numpy(), net(x5).numpy()) < 1e-5


def test_to_graph_multihead_attention(rng):
    with nn.init.seeded(0):
        mha = nn.MultiheadAttention(8, 2, batch_first=True)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    kv = rng.standard_normal((2, 6, 8)).astype(np.float32)
    g = mha.to_graph([q, kv, kv], dynamic_dims={"query": {0: "b"}, "key": {0: "b"}, "value": {0: "b"}})
    assert [v.name for v in g.inputs] == ["query", "key", "value"]
    assert "in_proj_weight" in g.initializers and "out_proj.weight" in g.initializers
    cg = opsnn.compile(g)
    q3, kv3 = rng.standard_normal((3, 4, 8)).astype(np.float32), rng.standard_normal((3, 6, 8)).astype(np.float32)
    outs = cg.run([q3, kv3, kv3])
    outs = list(outs.values()) if isinstance(outs, dict) else list(outs)
    ref_y, ref_w = mha(q3, kv3, kv3)
    assert rel(outs[0].numpy(), ref_y.numpy()) < 1e-5 and rel(outs[1].numpy(), ref_w.numpy()) < 1e-5


def test_constructor_arguments_of_the_wrong_kind_are_named():
    """opsnn's layers: a constructor argument that cannot be used is a ParamInvalidError that
    names it (not the bare TypeError / ZeroDivisionError its arithmetic raised)."""
    from opsnn import nn as N

    cases = [
        (lambda: N.Conv2d(3, "eight", 3), r"Conv2d: out_channels must be an int, got 'eight'"),
        (lambda: N.Conv2d(3, 8, 3, groups=0), r"Conv2d: groups=0 is not valid"),
        (lambda: N.LSTM(4, "abc"), r"LSTM: hidden_size must be an int"),
        (lambda: N.Dropout("x"), r"Dropout: p must be a number, got 'x'"),
        (lambda: N.BatchNorm2d(8, affine=np.ones((2, 2))), r"BatchNorm2d: affine must be a bool"),
        (lambda: N.Linear(-1, 3), r"Linear\(in_features=-1, out_features=3\)"),
    ]
    for make, msg in cases:
        with pytest.raises(ParamInvalidError, match=msg):
            make()

    class Mine(N.Module):  # a user's own module: its errors are its own, untouched
        def __init__(self):
            super().__init__()
            self.w = undefined_name  # noqa: F821

    with pytest.raises(NameError):
        Mine()


def test_every_layer_types_its_constructor_errors():
    import inspect

    from opsnn import nn as N

    layers = [c for c in vars(N).values() if isinstance(c, type) and issubclass(c, N.Module) and c is not N.Module]
    tried = 0
    for cls in layers:
        params = [
            p
            for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        base = {p.name: 4 for p in params if p.default is p.empty}
        for p in params:
            for bad in ("abc", -1, 0, 2.5, None, np.ones((2, 2)), (1, 2, 3, 4, 5)):
                try:
                    cls(**{**base, p.name: bad})
                except opsnn.errors.OpsnnError:
                    tried += 1
                except Exception as e:  # noqa: BLE001
                    pytest.fail(f"{cls.__name__}({p.name}={bad!r}) raised a bare {type(e).__name__}: {e}")
    assert tried > 100
