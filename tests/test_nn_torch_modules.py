"""torch.nn's modules under their names in opsnn.nn: each built with the same constructor arguments in
opsnn and torch (weights copied from opsnn into torch), forward values and input / parameter gradients
compared (float32 tolerances); the stateless table's rows, constructor checks and initialisation."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn
from opsnn.errors import ParamInvalidError
from opsnn.nn import stateless

RNG = np.random.default_rng(7)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# name -> (constructor args, constructor kwargs, input arrays)
CASES = {
    "LeakyReLU": ((0.2,), {}, [_r(3, 4)]),
    "ELU": ((), {"alpha": 0.5}, [_r(3, 4)]),
    "CELU": ((1.5,), {}, [_r(3, 4)]),
    "Mish": ((), {}, [_r(3, 4)]),
    "Softsign": ((), {}, [_r(3, 4)]),
    "Hardshrink": ((0.3,), {}, [_r(3, 4)]),
    "Softshrink": ((), {"lambd": 0.3}, [_r(3, 4)]),
    "LogSoftmax": ((), {"dim": 1}, [_r(3, 4)]),
    "ReLU6": ((), {}, [_r(3, 4) * 5]),
    "Hardtanh": ((-0.5, 0.8), {}, [_r(3, 4)]),
    "Hardsigmoid": ((), {}, [_r(3, 4) * 4]),
    "Hardswish": ((), {}, [_r(3, 4) * 4]),
    "SELU": ((), {}, [_r(3, 4)]),
    "Softplus": ((), {"beta": 2.0, "threshold": 3.0}, [_r(3, 4) * 3]),
    "Unflatten": ((1, (2, -1)), {}, [_r(3, 6, 2)]),
    "MaxPool1d": ((3,), {"stride": 2, "padding": 1}, [_r(2, 3, 9)]),
    "MaxPool3d": ((2,), {"ceil_mode": True}, [_r(1, 2, 5, 4, 5)]),
    "AvgPool1d": ((3, 2), {"ceil_mode": True, "count_include_pad": False}, [_r(2, 3, 9)]),
    "AvgPool2d": ((3,), {"stride": 2, "padding": 1}, [_r(2, 3, 8, 7)]),
    "AvgPool3d": ((2,), {}, [_r(1, 2, 4, 4, 6)]),
    "PixelShuffle": ((2,), {}, [_r(1, 8, 3, 2)]),
    "PixelUnshuffle": ((2,), {}, [_r(1, 2, 4, 6)]),
    "Upsample": ((), {"scale_factor": 2, "mode": "bilinear", "align_corners": True}, [_r(1, 2, 3, 4)]),
    "ZeroPad1d": (((1, 2),), {}, [_r(2, 3, 5)]),
    "ZeroPad2d": ((1,), {}, [_r(1, 2, 3, 4)]),
    "ConstantPad1d": ((2, 3.5), {}, [_r(2, 3, 5)]),
    "ConstantPad2d": (((1, 0, 2, 1), -1.0), {}, [_r(1, 2, 3, 4)]),
    "ConstantPad3d": ((1, 0.5), {}, [_r(1, 2, 3, 4, 2)]),
    "ReflectionPad1d": ((2,), {}, [_r(2, 3, 5)]),
    "ReflectionPad2d": (((1, 2, 2, 1),), {}, [_r(1, 2, 4, 4)]),
    "ReplicationPad1d": ((2,), {}, [_r(2, 3, 5)]),
    "ReplicationPad2d": ((1,), {}, [_r(1, 2, 4, 4)]),
    "CosineSimilarity": ((), {"dim": 0}, [_r(4, 3), _r(4, 3)]),
    "Conv1d": ((3, 4, 3), {"stride": 2, "padding": 1}, [_r(2, 3, 9)]),
    "Conv3d": ((2, 4, (2, 3, 2)), {"groups": 2, "bias": False}, [_r(1, 2, 4, 5, 4)]),
    "ConvTranspose1d": ((3, 2, 3), {"stride": 2, "output_padding": 1}, [_r(2, 3, 5)]),
    "ConvTranspose2d": ((4, 6, 3, 2, 1, 1), {"groups": 2}, [_r(1, 4, 3, 4)]),
    "ConvTranspose3d": ((2, 2, 2), {"stride": 2}, [_r(1, 2, 2, 3, 2)]),
    "PReLU": ((3,), {"init": 0.1}, [_r(2, 3, 4)]),
    "AdaptiveAvgPool1d": ((4,), {}, [_r(2, 3, 10)]),
    "InstanceNorm1d": ((3,), {"affine": True}, [_r(2, 3, 7)]),
    "InstanceNorm2d": ((3,), {"eps": 1e-3}, [_r(2, 3, 4, 5)]),
    "InstanceNorm3d": ((2,), {"affine": True}, [_r(1, 2, 3, 4, 2)]),
    "L1Loss": ((), {}, [_r(3, 4), _r(3, 4)]),
    "SmoothL1Loss": ((), {"beta": 0.5}, [_r(3, 4), _r(3, 4)]),
    "HuberLoss": ((), {"reduction": "sum", "delta": 0.7}, [_r(3, 4), _r(3, 4)]),
    "BCELoss": ((), {}, [1 / (1 + np.exp(-_r(3, 4))), (_r(3, 4) > 0).astype(np.float32)]),
    "KLDivLoss": ((), {"reduction": "batchmean", "log_target": True}, [_r(3, 4), _r(3, 4)]),
}


#: table rows compared with torch in tests/test_torch_gaps_functional.py instead
ELSEWHERE = {
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AlphaDropout",
    "ChannelShuffle",
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "FeatureAlphaDropout",
    "Fold",
    "GLU",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "LocalResponseNorm",
    "LogSigmoid",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
    "PairwiseDistance",
    "RReLU",
    "ReflectionPad3d",
    "ReplicationPad3d",
    "Softmax2d",
    "Softmin",
    "Tanhshrink",
    "Threshold",
    "Unfold",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
    "ZeroPad3d",
}


def test_the_table_lists_every_module_it_makes_and_each_has_a_case():
    assert stateless.__all__ == sorted(stateless.TABLE)
    assert set(stateless.TABLE) <= set(CASES) | ELSEWHERE
    for name in stateless.TABLE:
        assert getattr(nn, name) is getattr(stateless, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    torch = pytest.importorskip("torch")
    args, kw, arrays = CASES[name]
    with nn.init.seeded(3):
        m = getattr(nn, name)(*args, **kw)
    tm = getattr(torch.nn, name)(*args, **kw)
    tm.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in m.state_dict().items()})
    xs = [opsnn.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, want = m(*xs), tm(*ts)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    seed = RNG.standard_normal(want.shape).astype(np.float32)
    opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(seed))).backward()
    (want * torch.from_numpy(seed)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
    tparams = dict(tm.named_parameters())
    for k, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[k].grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=k)


def test_convolution_parameters_have_torchs_layout_and_initial_bounds():
    with nn.init.seeded(0):
        conv = nn.ConvTranspose2d(4, 6, 3, groups=2)
        c1 = nn.Conv1d(8, 2, 5, bias=True)
    assert conv.weight.shape == (4, 3, 3, 3) and conv.bias.shape == (6,)
    bound = 1 / np.sqrt(3 * 9)  # torch: kaiming_uniform(a=sqrt(5)) -> 1 / sqrt(fan_in), fan_in = weight dim 1 * kernel
    assert np.abs(conv.weight.numpy()).max() <= bound + 1e-7 and np.abs(conv.weight.numpy()).max() > 0.5 * bound
    assert np.abs(c1.bias.numpy()).max() <= 1 / np.sqrt(40) + 1e-7


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: nn.LeakyReLU(negative_slop=0.1),
            r"LeakyReLU: unexpected keyword 'negative_slop'; did you mean 'negative_slope'",
        ),
        (lambda: nn.AvgPool2d(), r"AvgPool2d: missing required argument\(s\) \['kernel_size'\]"),
        (lambda: nn.MaxPool1d(2, 2, 0, 1, False, False, 7), r"MaxPool1d: takes at most 6 argument"),
        (lambda: nn.ZeroPad2d((1, 2, 3)), r"padding: expected an int or 4 ints, got \(1, 2, 3\)"),
        (lambda: nn.LogSoftmax(), r"LogSoftmax: pass dim"),
        (lambda: nn.Conv1d(3, 4, (3, 3)), r"Conv1d: kernel_size must be an int or 1 ints"),
        (lambda: nn.Conv3d(3, 4, 3, groups=2), r"Conv3d: in_channels \(3\) and out_channels \(4\) must be divisible"),
        (lambda: nn.ConvTranspose2d(3, 4, 3, paddin=1), r"ConvTranspose2d: unexpected keyword 'paddin'"),
        (lambda: nn.PReLU(0), r"PReLU: num_parameters must be a positive int"),
    ],
)
def test_constructor_mistakes_are_typed_errors(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make()


def test_modules_trace_into_graphs():
    with nn.init.seeded(0):
        net = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.LeakyReLU(0.1), nn.AvgPool1d(2), nn.Flatten())
    x = _r(3, 2, 8)
    cg = opsnn.compile(net, [x])
    np.testing.assert_allclose(cg.run([x])[0], net(opsnn.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_encoder_and_decoder_match_torch(norm_first, batch_first):
    torch = pytest.importorskip("torch")
    kw = dict(dim_feedforward=24, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    with nn.init.seeded(5):
        enc = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 4, activation="gelu", **kw), 2, norm=nn.LayerNorm(16)
        )
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 4, **kw), 2)
    tenc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(16, 4, activation="gelu", **kw),
        2,
        norm=torch.nn.LayerNorm(16),
        enable_nested_tensor=False,
    )
    tdec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(16, 4, **kw), 2)
    for m, tm in ((enc, tenc), (dec, tdec)):
        state = {k: torch.from_numpy(v.numpy().copy()) for k, v in m.state_dict().items()}
        assert set(state) == set(tm.state_dict())  # torch's names: torch checkpoints load as they are
        tm.load_state_dict(state)
    # the stacked layers start from one layer's weights, as torch's deep copies do
    np.testing.assert_array_equal(enc.layers[0].linear1.weight.numpy(), enc.layers[1].linear1.weight.numpy())
    shape = (2, 5, 16) if batch_first else (5, 2, 16)
    src, tgt = _r(*shape), _r(*(shape[:2] if batch_first else shape[:2]), 16)
    pad = np.zeros((2, 5), bool)
    pad[1, 3:] = True
    causal = np.triu(np.full((5, 5), -np.inf, np.float32), 1)
    x = opsnn.tensor(src, requires_grad=True)
    tx = torch.tensor(src, requires_grad=True)
    mem = enc(x, src_key_padding_mask=pad)
    tmem = tenc(tx, src_key_padding_mask=torch.from_numpy(pad))
    out = dec(opsnn.tensor(tgt), mem, tgt_mask=causal, memory_key_padding_mask=pad)
    tout = tdec(
        torch.from_numpy(tgt), tmem, tgt_mask=torch.from_numpy(causal), memory_key_padding_mask=torch.from_numpy(pad)
    )
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
    opsnn.ops.sum(out).backward()
    tout.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-4)
    tp = dict(tenc.named_parameters())
    for k, p in enc.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tp[k].grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=k)


def test_transformer_constructor_mistakes():
    with pytest.raises(ParamInvalidError, match="activation must be 'relu', 'gelu' or a callable, got 'swish'"):
        nn.TransformerEncoderLayer(8, 2, activation="swish")
    with pytest.raises(ParamInvalidError, match="TransformerEncoder: expected a TransformerEncoderLayer, got Linear"):
        nn.TransformerEncoder(nn.Linear(2, 2), 2)
    with pytest.raises(ParamInvalidError, match="num_layers must be a positive int, got 0"):
        nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2), 0)


@pytest.mark.parametrize(
    "name, args, kw",
    [
        ("RNN", (3, 5, 2), {"nonlinearity": "relu", "batch_first": True}),
        ("RNN", (3, 5), {"bidirectional": True}),
        ("RNNCell", (3, 5), {}),
        ("RNNCell", (3, 5), {"nonlinearity": "relu", "bias": False}),
        ("LSTMCell", (3, 5), {}),
        ("GRUCell", (3, 5), {}),
    ],
)
def test_recurrent_modules_match_torch(name, args, kw):
    torch = pytest.importorskip("torch")
    with nn.init.seeded(2):
        m = getattr(nn, name)(*args, **kw)
    tm = getattr(torch.nn, name)(*args, **kw)
    state = {k: torch.from_numpy(v.numpy().copy()) for k, v in m.state_dict().items()}
    assert set(state) == set(tm.state_dict())
    tm.load_state_dict(state)
    cell = name.endswith("Cell")
    x = _r(4, 3) if cell else (_r(2, 6, 3) if kw.get("batch_first") else _r(6, 2, 3))
    h = _r(4, 5) if cell else None
    tx, th = torch.tensor(x, requires_grad=True), None if h is None else torch.from_numpy(h)
    ox = opsnn.tensor(x, requires_grad=True)
    if name == "LSTMCell":
        c = _r(4, 5)
        got, want = m(ox, (opsnn.tensor(h), opsnn.tensor(c))), tm(tx, (th, torch.from_numpy(c)))
        got, want = opsnn.ops.add(got[0], got[1]), want[0] + want[1]
    else:
        got, want = (m(ox, opsnn.tensor(h)), tm(tx, th)) if cell else (m(ox)[0], tm(tx)[0])
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    opsnn.ops.sum(got).backward()
    want.sum().backward()
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    tp = dict(tm.named_parameters())
    for k, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tp[k].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    if cell:  # unbatched input, no state: zeros, as torch
        np.testing.assert_allclose(
            np.asarray(m(opsnn.tensor(x[0]))[0] if name == "LSTMCell" else m(opsnn.tensor(x[0])).numpy()),
            (tm(torch.from_numpy(x[0]))[0] if name == "LSTMCell" else tm(torch.from_numpy(x[0]))).detach().numpy(),
            rtol=1e-4,
            atol=1e-5,
        )


def test_parameter_containers_register_their_parameters_as_torch_names_them():
    torch = pytest.importorskip("torch")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = nn.ParameterList([np.ones(3, np.float32), opsnn.tensor(np.full(3, 2.0, np.float32))])
            self.scales.append(np.zeros(2, np.float32))
            self.extra = nn.ParameterDict({"b": np.arange(3, dtype=np.float32), "a": np.ones(1, np.float32)})

        def forward(self, x):
            return opsnn.ops.mul(opsnn.ops.mul(x, self.scales[1]), self.extra["b"])

    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = torch.nn.ParameterList([torch.ones(3), torch.full((3,), 2.0), torch.zeros(2)])
            self.extra = torch.nn.ParameterDict({"b": torch.arange(3.0), "a": torch.ones(1)})

    net = Net()
    assert list(net.state_dict()) == list(TNet().state_dict())
    assert len(net.scales) == 3 and all(isinstance(p, nn.Parameter) for p in net.scales)
    assert "a" in net.extra and list(net.extra.keys()) == ["a", "b"]  # a plain dict: sorted, as torch's
    net.extra["c"] = np.ones(1, np.float32)
    assert list(net.extra) == ["a", "b", "c"] and len(net.extra) == 3
    opsnn.ops.sum(net(opsnn.tensor(np.ones(3, np.float32)))).backward()
    np.testing.assert_array_equal(net.scales[1].grad.numpy(), [0.0, 1.0, 2.0])
    opt = opsnn.optim.SGD(net.parameters(), lr=0.5)
    opt.step()
    np.testing.assert_array_equal(net.extra["b"].numpy(), [-1.0, 0.0, 1.0])  # b - 0.5 * (x * scales[1])
    with pytest.raises(ParamInvalidError, match="ParameterList: index 5 out of range for 3 parameters"):
        net.scales[5] = np.ones(1, np.float32)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_channel_dropout_zeroes_whole_channels_and_scales_the_rest(dims):
    m = getattr(nn, f"Dropout{dims}d")(0.4).train()
    x = np.abs(_r(*((8, 16) + (3,) * dims))) + 0.5
    opsnn.manual_seed(11)
    t = opsnn.tensor(x, requires_grad=True)
    y = m(t).numpy()
    kept = (y != 0).reshape(8, 16, -1)
    assert (kept.all(-1) | ~kept.any(-1)).all()  # a channel is kept whole or dropped whole
    assert 0.35 < 1 - kept[..., 0].mean() < 0.75  # about p of 128 channels dropped
    np.testing.assert_allclose(y[y != 0], (x / 0.6)[y != 0], rtol=1e-6)
    opsnn.manual_seed(11)
    opsnn.ops.sum(m(t)).backward()  # the same seed: the same mask; the gradient is the mask
    np.testing.assert_allclose(t.grad.numpy(), (y != 0) / 0.6, rtol=1e-6)
    np.testing.assert_array_equal(m.eval()(t).numpy(), x)
    with pytest.raises(ParamInvalidError, match=f"dropout{dims}d: expected a {dims + 2}-D"):
        m.train()(opsnn.tensor(np.ones((2,) * (dims + 3), np.float32)))


def test_instance_norm_refuses_running_statistics():
    with pytest.raises(ParamInvalidError, match="InstanceNorm2d: track_running_stats=True is not supported"):
        nn.InstanceNorm2d(3, track_running_stats=True)
    with pytest.raises(ParamInvalidError, match="InstanceNorm2d: input has 4 channels, expected num_features=3"):
        nn.InstanceNorm2d(3)(opsnn.tensor(np.ones((1, 4, 2, 2), np.float32)))


def test_forward_hooks_to_casts_and_lookups_as_torch():
    with nn.init.seeded(0):
        net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    seen = []
    h1 = net[0].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    h2 = net[2].register_forward_pre_hook(lambda m, args: (opsnn.ops.mul(args[0], 0.0),))
    h3 = net.register_forward_hook(lambda m, args, out: opsnn.ops.add(out, 1.0))
    x = opsnn.tensor(_r(5, 3))
    y = net(x).numpy()
    np.testing.assert_allclose(y, np.tile(net[2].bias.numpy() + 1.0, (5, 1)), rtol=1e-6)  # zeroed input, +1 after
    assert seen == [(5, 4)]
    for h in (h1, h2, h3):
        h.remove()
    h1.remove()  # twice: nothing left to remove
    ref = np.maximum(x.numpy() @ net[0].weight.numpy().T + net[0].bias.numpy(), 0)
    np.testing.assert_allclose(net(x).numpy(), ref @ net[2].weight.numpy().T + net[2].bias.numpy(), rtol=1e-5)
    assert seen == [(5, 4)]
    cg = opsnn.compile(net, [x.numpy()])  # hooks run while a module is traced, as any Python in forward
    assert net.to("cpu") is net and net.cpu() is net and net.to(device="cpu", dtype=None) is net
    assert net.double()[0].weight.dtype == np.float64 and net.float()[0].weight.dtype == np.float32
    assert net.to("bfloat16")[2].bias.dtype == opsnn.dtypes.bfloat16 and net.half()[0].weight.dtype == np.float16
    net.to(np.float32)
    assert net.get_submodule("2") is net[2] and net.get_parameter("0.bias") is net[0].bias
    assert cg.run([x.numpy()])[0].shape == (5, 2)
    for call, match in (
        (lambda: net.to("cuda"), "opsnn runs on the CPU, got device 'cuda'"),
        (lambda: net.get_submodule("1.weight"), "ReLU has no submodule 'weight'"),
        (lambda: net.get_parameter("0.scale"), "no parameter '0.scale'"),
        (lambda: net.register_forward_hook(3), "expected a callable, got int"),
    ):
        with pytest.raises(ParamInvalidError, match=match):
            call()


@pytest.mark.parametrize("batch_first, side", [(False, "right"), (True, "right"), (True, "left")])
def test_pad_sequence_and_parameter_vectors_match_torch(batch_first, side):
    torch = pytest.importorskip("torch")
    seqs = [_r(3, 2), _r(5, 2), _r(1, 2)]
    xs = [opsnn.tensor(s, requires_grad=True) for s in seqs]
    ts = [torch.tensor(s, requires_grad=True) for s in seqs]
    got = nn.utils.rnn.pad_sequence(xs, batch_first=batch_first, padding_value=-2.0, padding_side=side)
    want = torch.nn.utils.rnn.pad_sequence(ts, batch_first=batch_first, padding_value=-2.0, padding_side=side)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    weight = _r(*want.shape)
    opsnn.ops.sum(opsnn.ops.mul(got, opsnn.tensor(weight))).backward()
    (want * torch.from_numpy(weight)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())
    with nn.init.seeded(1):
        lin = nn.Linear(3, 2)
    vec = nn.utils.parameters_to_vector(lin.parameters())
    np.testing.assert_array_equal(vec.numpy(), np.concatenate([lin.weight.numpy().ravel(), lin.bias.numpy()]))
    nn.utils.vector_to_parameters(np.arange(8, dtype=np.float32), lin.parameters())
    assert lin.weight.numpy().ravel().tolist() == list(range(6)) and lin.bias.numpy().tolist() == [6.0, 7.0]
    for call, match in (
        (lambda: nn.utils.pad_sequence([opsnn.tensor(_r(2, 3)), opsnn.tensor(_r(2, 4))]), "one trailing shape"),
        (lambda: nn.utils.pad_sequence([]), "non-empty list of tensors"),
        (lambda: nn.utils.vector_to_parameters(np.zeros(5, np.float32), lin.parameters()), "1-D vector of 8 values"),
    ):
        with pytest.raises(ParamInvalidError, match=match):
            call()
