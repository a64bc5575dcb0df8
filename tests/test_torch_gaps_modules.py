"""Bilinear, EmbeddingBag, the lazy modules and the encoder-decoder Transformer against torch.nn: torch's
weights loaded into opsnn (its state dict as numpy), outputs and gradients (inputs and parameters) on
random data, torch's init distributions, and typed errors.

Tolerances: float32 on both sides with different summation orders: rtol 1e-5 / atol 1e-5 for the one-op
modules, rtol 1e-4 / atol 2e-5 for the Transformer's stack of attention and LayerNorm layers.
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops
from opsnn.errors import ParamInvalidError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(23)


def _load(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def _compare(ours, theirs, inputs, grad_inputs=(), rtol=1e-5, atol=1e-5, **kw):
    """Forward both on ``inputs`` (numpy), then backward of sum(out * r): outputs, the gradients of the
    inputs at positions ``grad_inputs`` and of every parameter agree."""
    xs = [opsnn.tensor(a).requires_grad_() if i in grad_inputs else opsnn.tensor(a) for i, a in enumerate(inputs)]
    ts = [torch.tensor(a, requires_grad=i in grad_inputs) for i, a in enumerate(inputs)]
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    out, tout = ours(*xs, **kw), theirs(*ts, **tkw)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=rtol, atol=atol)
    r = RNG.standard_normal(tout.shape).astype(np.float32)
    ops.sum(ops.mul(out, opsnn.tensor(r))).backward()
    (tout * torch.tensor(r)).sum().backward()
    for i in grad_inputs:
        np.testing.assert_allclose(xs[i].grad.numpy(), ts[i].grad.numpy(), rtol=rtol, atol=atol, err_msg=f"input {i}")
    tparams = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        tg = tparams[name].grad
        want = np.zeros(p.shape, np.float32) if tg is None else tg.numpy()
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=rtol, atol=atol, err_msg=name)
    return out


# -- Bilinear -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lead, bias", [((5,), True), ((2, 3), False), ((0,), True)])
def test_bilinear_matches_torch(lead, bias):
    theirs = torch.nn.Bilinear(3, 4, 6, bias=bias)
    ours = nn.Bilinear(3, 4, 6, bias=bias)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    _load(ours, theirs)
    x1 = RNG.standard_normal(lead + (3,)).astype(np.float32)
    x2 = RNG.standard_normal(lead + (4,)).astype(np.float32)
    out = _compare(ours, theirs, [x1, x2], grad_inputs=(0, 1))
    assert out.shape == lead + (6,)


def test_bilinear_init_bounds_and_errors():
    b = nn.Bilinear(16, 3, 40)
    w = b.weight.numpy()
    assert w.shape == (40, 16, 3) and np.abs(w).max() <= 0.25 and np.abs(w).max() > 0.2  # U(-1/sqrt(16), ...)
    assert np.abs(b.bias.numpy()).max() <= 0.25
    with pytest.raises(ParamInvalidError, match=r"Bilinear: input1 must be \(\*, 16\) and input2 \(\*, 3\)"):
        b(np.zeros((2, 16), np.float32), np.zeros((3, 3), np.float32))


# -- EmbeddingBag ---------------------------------------------------------------------------------------------
IDS = np.array([1, 2, 3, 4, 2, 5, 6, 7, 9, 0, 2], np.int64)
BAG_CASES = {
    "sum_offsets": ({"mode": "sum"}, {"offsets": np.array([0, 3, 3, 5], np.int64)}),
    "mean_offsets_padding": ({"mode": "mean", "padding_idx": 2}, {"offsets": np.array([0, 3, 3, 5], np.int64)}),
    "max_offsets_padding": ({"mode": "max", "padding_idx": 2}, {"offsets": np.array([0, 1, 1, 4, 10], np.int64)}),
    "sum_weights_last_offset": (
        {"mode": "sum", "include_last_offset": True, "padding_idx": 9},
        {"offsets": np.array([0, 4, 4, 11], np.int64), "per_sample_weights": RNG.random(11).astype(np.float32)},
    ),
    "mean_last_offset": ({"mode": "mean", "include_last_offset": True}, {"offsets": np.array([0, 2, 11], np.int64)}),
}


@pytest.mark.parametrize("case", sorted(BAG_CASES))
def test_embedding_bag_matches_torch_with_offsets(case):
    kw, fwd = BAG_CASES[case]
    theirs = torch.nn.EmbeddingBag(10, 4, **kw)
    ours = nn.EmbeddingBag(10, 4, **kw)
    _load(ours, theirs)
    inputs = [IDS, fwd["offsets"]]
    grad_inputs = ()
    if "per_sample_weights" in fwd:
        inputs.append(fwd["per_sample_weights"])
        grad_inputs = (2,)
    _compare(ours, theirs, inputs, grad_inputs=grad_inputs)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch_on_2d_input(mode):
    theirs = torch.nn.EmbeddingBag(7, 5, mode=mode, padding_idx=0)
    ours = nn.EmbeddingBag(7, 5, mode=mode, padding_idx=0)
    _load(ours, theirs)
    ids = RNG.integers(0, 7, size=(4, 3))
    ids[1] = 0  # a bag of padding only: zeros
    out = _compare(ours, theirs, [ids])
    np.testing.assert_array_equal(out.numpy()[1], 0.0)


def test_embedding_bag_init_and_typed_errors():
    with nn.init.seeded(0):
        e = nn.EmbeddingBag(1000, 8, padding_idx=-1)
    w = e.weight.numpy()
    assert e.padding_idx == 999 and np.all(w[999] == 0) and abs(w[:999].std() - 1.0) < 0.05  # N(0, 1) as torch
    ids = np.array([1, 2, 3], np.int64)
    cases = [
        (lambda: nn.EmbeddingBag(5, 2, mode="median"), "mode must be 'sum', 'mean' or 'max'"),
        (lambda: nn.EmbeddingBag(5, 2, max_norm=1.0), "max_norm is not supported"),
        (lambda: nn.EmbeddingBag(5, 2, sparse=True), "sparse is not supported"),
        (lambda: nn.EmbeddingBag(5, 2)(ids), "a 1-D input needs offsets"),
        (lambda: nn.EmbeddingBag(5, 2)(ids.reshape(1, 3), np.array([0])), "offsets must be None when input is 2-D"),
        (lambda: nn.EmbeddingBag(5, 2)(ids, np.array([1, 2])), "offsets must be a 1-D int tensor starting at 0"),
        (lambda: nn.EmbeddingBag(5, 2)(ids, np.array([0, 2, 1])), "offsets must not decrease"),
        (lambda: nn.EmbeddingBag(5, 2, include_last_offset=True)(ids, np.array([0, 2])), "last offset must be the"),
        (lambda: nn.EmbeddingBag(5, 2)(ids, np.array([0]), per_sample_weights=np.ones(3, np.float32)),
         "per_sample_weights needs mode='sum'"),
        (lambda: nn.EmbeddingBag(5, 2, mode="sum")(ids, np.array([0]), per_sample_weights=np.ones(2, np.float32)),
         "per_sample_weights must have the input's shape"),
    ]  # fmt: skip
    for make, match in cases:
        with pytest.raises(ParamInvalidError, match=match):
            make()
    with pytest.raises(nn.OutOfVocabularyError, match="id 7"):
        nn.EmbeddingBag(5, 2)(np.array([1, 7]), np.array([0]))


# -- lazy modules ---------------------------------------------------------------------------------------------
LAZY = [
    (lambda: nn.LazyLinear(5), lambda: nn.Linear(7, 5), (3, 7), torch.nn.LazyLinear, (5,)),
    (lambda: nn.LazyLinear(4, bias=False), lambda: nn.Linear(6, 4, bias=False), (2, 3, 6), torch.nn.LazyLinear,
     (4,), {"bias": False}),
    (lambda: nn.LazyConv1d(4, 3, groups=2), lambda: nn.Conv1d(6, 4, 3, groups=2), (2, 6, 9), torch.nn.LazyConv1d,
     (4, 3), {"groups": 2}),
    (lambda: nn.LazyConv2d(4, 3, padding=1), lambda: nn.Conv2d(3, 4, 3, padding=1), (1, 3, 5, 5),
     torch.nn.LazyConv2d, (4, 3), {"padding": 1}),
    (lambda: nn.LazyConv3d(2, 2, stride=2), lambda: nn.Conv3d(3, 2, 2, stride=2), (1, 3, 4, 4, 4), torch.nn.LazyConv3d,
     (2, 2), {"stride": 2}),
]  # fmt: skip


@pytest.mark.parametrize("case", LAZY, ids=["linear", "linear_nobias", "conv1d", "conv2d", "conv3d"])
def test_lazy_module_becomes_the_concrete_one(case):
    make_lazy, make_real, shape, tcls, targs = case[:5]
    tkw = case[5] if len(case) > 5 else {}
    x = RNG.standard_normal(shape).astype(np.float32)
    with nn.init.seeded(4):
        lazy = make_lazy()
        assert all(getattr(p, "uninitialized", False) for p in lazy.parameters())
        lazy(x)
    with nn.init.seeded(4):
        real = make_real()
    assert type(lazy) is type(real)
    for (n, p), (rn, rp) in zip(lazy.named_parameters(), real.named_parameters()):
        assert n == rn
        np.testing.assert_array_equal(p.numpy(), rp.numpy())  # the same init as building it directly
    theirs = tcls(*targs, **tkw)
    theirs(torch.tensor(x))
    assert set(lazy.state_dict()) == set(theirs.state_dict())
    _load(lazy, theirs)
    _compare(lazy, theirs, [x], grad_inputs=(0,))


def test_lazy_module_before_its_first_call():
    lazy = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    with pytest.raises(ParamInvalidError, match="lazy module .* has not run yet"):
        opsnn.optim.SGD(lazy.parameters(), lr=0.1)
    with pytest.raises(nn.LazyModuleError, match="call the module on an input first"):
        lazy[0].state_dict()
    # a checkpoint gives the shapes, as torch's lazy load hook
    theirs = torch.nn.Linear(6, 3)
    ckpt = nn.LazyLinear(3)
    ckpt.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    assert type(ckpt) is nn.Linear and ckpt.in_features == 6
    np.testing.assert_array_equal(ckpt.weight.numpy(), theirs.weight.detach().numpy())
    conv = nn.LazyConv2d(4, 3, groups=2)
    conv.load_state_dict({"weight": np.zeros((4, 3, 3, 3), np.float32), "bias": np.zeros(4, np.float32)})
    assert conv.in_channels == 6
    with pytest.raises(ParamInvalidError, match=r"LazyConv2d: the input must be batched, \(N, C, 2 spatial dims\)"):
        nn.LazyConv2d(4, 3)(np.zeros((3, 3), np.float32))


# -- Transformer ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_first, norm_first", [(True, False), (False, True)])
def test_transformer_matches_torch(batch_first, norm_first):
    kw = dict(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=24, dropout=0.0,
              batch_first=batch_first, norm_first=norm_first, activation="gelu")  # fmt: skip
    theirs = torch.nn.Transformer(**kw).eval()
    ours = nn.Transformer(**kw).eval()
    assert set(ours.state_dict()) == set(theirs.state_dict())
    _load(ours, theirs)
    src = RNG.standard_normal((2, 5, 16) if batch_first else (5, 2, 16)).astype(np.float32)
    tgt = RNG.standard_normal((2, 4, 16) if batch_first else (4, 2, 16)).astype(np.float32)
    mask = nn.Transformer.generate_square_subsequent_mask(4).numpy()
    np.testing.assert_array_equal(mask, torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    pad = np.array([[False] * 4 + [True], [False] * 5])
    _compare(ours, theirs, [src, tgt], grad_inputs=(0, 1), rtol=1e-4, atol=2e-5, tgt_mask=mask,
             src_key_padding_mask=pad, memory_key_padding_mask=pad)  # fmt: skip


def test_transformer_init_and_errors():
    with nn.init.seeded(1):
        t = nn.Transformer(32, 4, 1, 1, dim_feedforward=64)
    w = t.encoder.layers[0].linear1.weight.numpy()  # Xavier: U(-b, b), b = sqrt(6 / (32 + 64))
    assert np.abs(w).max() <= np.sqrt(6 / 96) and np.abs(w).max() > 0.9 * np.sqrt(6 / 96)
    assert np.all(t.encoder.norm.weight.numpy() == 1.0)  # 1-D parameters keep their init
    with pytest.raises(ParamInvalidError, match="same batch size"):
        t(np.zeros((5, 2, 32), np.float32), np.zeros((4, 3, 32), np.float32))
    with pytest.raises(ParamInvalidError, match="d_model=32"):
        t(np.zeros((5, 2, 16), np.float32), np.zeros((4, 2, 16), np.float32))
    with pytest.raises(ParamInvalidError, match="sz must be an int >= 0"):
        nn.Transformer.generate_square_subsequent_mask(-1)
    custom = nn.Transformer(32, 4, custom_encoder=nn.Identity(), num_decoder_layers=1, dim_feedforward=64)
    assert not any(k.startswith("encoder.") for k in custom.state_dict())
