"""Native bfloat16 kernels of bf16 training beyond the products and activations: ReduceSum
(reduce_sum_numba_bf16), the ordered comparisons (compare_numba_bf16), MaxPool
(max_pool_numba_bf16), MaxPoolGrad (max_pool_grad_numba_bf16), SwiGLU (swiglu_numba_bf16) and
RotaryEmbedding (rotary_numba_bf16); the fp32 adapter's bfloat16 widening; bf16 Attention keeping
its forward's logsumexp (opsnn::AttentionTrain).

Each kernel is compared with the float32 kernel on the widened inputs rounded to bfloat16 (the fp32
adapter's result, what ran before) and with a float64 oracle (within one bfloat16 ulp where a value
is rounded once, exactly where values are only selected or compared, a stated tolerance for
RoPE's two-term sums), with NaN/Inf and odd shapes; one autocast training step of a small CNN runs
none of these ops through the adapter and its gradients match float32 training within bfloat16
tolerance."""

import numba
import numpy as np
import pytest

import opsnn
from opsnn import dtypes as _dt
from opsnn import nn, ops
from opsnn.ops import executor
from opsnn.ops.registry import get_op

BF16 = _dt.bfloat16


@pytest.fixture(autouse=True)
def _two_threads():
    """Two threads where the machine has them: the chunked (parallel) plans run, as on CI."""
    before = opsnn.get_num_threads()
    opsnn.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield
    opsnn.set_num_threads(before)


def _bits(a):
    return np.asarray(a).view(np.uint16)


def _ulp(v: np.ndarray) -> np.ndarray:
    """One bfloat16 ulp at each value (float64), for |v| >= the smallest normal."""
    a = np.maximum(np.abs(v.astype(np.float64)), 2.0**-126)
    return 2.0 ** (np.floor(np.log2(a)) - 7)


def _prepare(op, ins, attrs=None, algo=None, num_outputs=None, domain=""):
    return executor.prepare(get_op(op, domain), ins, attrs or {}, algo=algo, num_outputs=num_outputs)


def _same_or_both_nan(got, want):
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan)
    assert np.array_equal(_bits(np.asarray(got, BF16))[~nan], _bits(np.asarray(want, BF16))[~nan])


# -- ReduceSum ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape,axes",
    [
        ((8, 16, 24), (0, 1)),  # a bias gradient: (tokens, features) summed over tokens
        ((8, 10), (0,)),
        ((3, 5, 7), (1,)),  # outer and inner
        ((5, 4097), (1,)),  # rows (inner 1), longer than a widening block
        ((4096, 40), (0,)),  # R split into chunks across threads
        ((2, 3000, 33), (1,)),
        ((7,), (0,)),
        ((4, 6, 5, 7), (0, 2, 3)),  # a convolution's bias gradient: N and H*W summed
        ((256, 2, 8, 64), (0, 2, 3)),  # the same, few channels: rows split across threads
    ],
)
def test_reduce_sum_bf16_against_float32_kernel_and_float64(shape, axes):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(BF16)
    ex = _prepare("ReduceSum", [x, np.array(axes)], {"keepdims": 0})
    assert ex.kernel_name == "reduce_sum_numba_bf16" and not ex.adapter
    got = ex.run().numpy()
    assert got.dtype == BF16
    f32 = _prepare("ReduceSum", [x, np.array(axes)], {"keepdims": 0}, algo="reduce_numba")
    assert f32.adapter
    want32 = f32.run().numpy()
    want64 = x.astype(np.float64).sum(axis=axes)
    assert got.shape == want64.shape
    g = got.astype(np.float64)
    assert np.all(np.abs(g - want32.astype(np.float64)) <= _ulp(want32))
    assert np.all(np.abs(g - want64) <= _ulp(want64))


def test_reduce_sum_bf16_nonfinite_keepdims_and_empty():
    x = np.ones((6, 5), np.float32)
    x[2, 0] = np.nan
    x[1, 1] = np.inf
    x[1, 2], x[4, 2] = np.inf, -np.inf
    x[3, 3] = -np.inf
    x[0, 4] = 3.0e38  # six of them overflow bfloat16's range: +inf, as the float32 sum rounded
    x[1:, 4] = 3.0e38
    xb = x.astype(BF16)
    got = ops.sum(opsnn.tensor(xb), 0, keepdim=True).numpy()
    assert got.shape == (1, 5) and got.dtype == BF16
    g = got.astype(np.float32)[0]
    assert np.isnan(g[0]) and g[1] == np.inf and np.isnan(g[2]) and g[3] == -np.inf and g[4] == np.inf
    with np.errstate(over="ignore", invalid="ignore"):
        _same_or_both_nan(got, xb.astype(np.float32).sum(0, keepdims=True))
    e = ops.sum(opsnn.tensor(np.ones((4, 0, 3), BF16)), 1).numpy()
    assert e.shape == (4, 3) and np.all(e.astype(np.float32) == 0)


def test_reduce_sum_bf16_leaves_other_split_axes_to_the_float32_kernel():
    x = np.ones((2, 3, 4, 5), BF16)
    ex = _prepare("ReduceSum", [x, np.array([1, 3])])
    assert ex.kernel_name == "reduce_numba" and ex.adapter
    assert np.all(ex.run().numpy().astype(np.float32) == 15)


# -- comparisons ----------------------------------------------------------------------------------------
CMP = {"Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal}


@pytest.mark.parametrize("op", list(CMP))
@pytest.mark.parametrize("n", [1001, 1 << 19], ids=["serial", "parallel"])
def test_compare_bf16_exact(op, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(BF16)
    b = rng.standard_normal(n).astype(BF16)
    a[:8] = np.array([np.nan, 1.0, np.inf, -np.inf, 0.0, -0.0, 2.0, -3.0], np.float32).astype(BF16)
    b[:8] = np.array([1.0, np.nan, np.inf, 1.0, -0.0, 0.0, 2.0, -np.inf], np.float32).astype(BF16)
    a = a.reshape(-1, 7) if n % 7 == 0 else a
    b = b.reshape(a.shape)
    for other in (b, np.zeros((), BF16), np.array([0.5], BF16).reshape((1,) * a.ndim)):
        ex = _prepare(op, [a, other])
        assert ex.kernel_name == "compare_numba_bf16" and not ex.adapter
        got = ex.run().numpy()
        want = CMP[op](a.astype(np.float64), other.astype(np.float64))
        assert got.dtype == np.bool_ and got.shape == want.shape
        assert np.array_equal(got, want)


def test_compare_bf16_broadcast_keeps_the_float32_kernel():
    a, b = np.ones((3, 4), BF16), np.zeros((4,), BF16)
    ex = _prepare("Greater", [a, b])
    assert ex.kernel_name == "compare_numba" and ex.adapter
    assert ex.run().numpy().all()
    ex = _prepare("Greater", [np.zeros((), BF16), a])  # the scalar first: not the native shape
    assert ex.kernel_name == "compare_numba"


# -- MaxPool / MaxPoolGrad ------------------------------------------------------------------------------
POOLS = [
    ((4, 8, 16, 16), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem pool
    ((2, 3, 7, 9), dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 0, 1], dilations=[2, 1])),
    ((2, 3, 11), dict(kernel_shape=[3], strides=[2])),
    ((1, 2, 5, 5), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, storage_order=1)),
]


def _window_max_oracle(x64: np.ndarray, attrs: dict) -> np.ndarray:
    """float64 max over each window, NaN propagating, from MaxPool's own geometry (padding = -inf)."""
    y = executor.prepare(get_op("MaxPool"), [x64], {**attrs, "storage_order": 0}, algo="reference").run()
    return y.numpy()


@pytest.mark.parametrize("shape,attrs", POOLS)
def test_max_pool_bf16_against_float32_kernel_and_oracle(shape, attrs):
    rng = np.random.default_rng(len(shape) * 31 + shape[-1])
    x = rng.standard_normal(shape).astype(BF16)
    flat = x.reshape(-1)
    flat[:5] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32).astype(BF16)
    ex = _prepare("MaxPool", [x], attrs, num_outputs=2)
    assert ex.kernel_name == "max_pool_numba_bf16" and not ex.adapter
    y, idx = (t.numpy() for t in ex.run())
    y32, idx32 = (t.numpy() for t in _prepare("MaxPool", [x], attrs, algo="max_pool_numba", num_outputs=2).run())
    _same_or_both_nan(y, y32)
    assert np.array_equal(idx, idx32)
    _same_or_both_nan(y, _window_max_oracle(x.astype(np.float64), attrs))
    y_only = _prepare("MaxPool", [x], attrs, num_outputs=1).run().numpy()
    _same_or_both_nan(y_only, y)


@pytest.mark.parametrize("shape,attrs", POOLS)
def test_max_pool_grad_bf16_against_float32_kernel_and_float64(shape, attrs):
    rng = np.random.default_rng(shape[-1])
    x = rng.standard_normal(shape).astype(BF16)
    _, idx = _prepare("MaxPool", [x], attrs, num_outputs=2).run()
    idx = idx.numpy()
    dy = (rng.standard_normal(idx.shape) * 2).astype(BF16)
    dy.reshape(-1)[:2] = np.array([np.inf, np.nan], np.float32).astype(BF16)
    ex = _prepare("MaxPoolGrad", [dy, idx, x], domain="opsnn")
    assert ex.kernel_name == "max_pool_grad_numba_bf16" and not ex.adapter
    got = ex.run().numpy()
    assert got.dtype == BF16 and got.shape == x.shape
    want32 = _prepare("MaxPoolGrad", [dy, idx, x], algo="max_pool_grad_numba", domain="opsnn").run().numpy()
    _same_or_both_nan(got, want32)
    dx64 = np.zeros(x.size, np.float64)
    keep = idx.reshape(-1) >= 0
    np.add.at(dx64, idx.reshape(-1)[keep], dy.astype(np.float64).reshape(-1)[keep])
    g, w = got.astype(np.float64).reshape(-1), dx64
    assert np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(np.isinf(g), np.isinf(w))
    fin = np.isfinite(w)
    assert np.all(np.abs(g[fin] - w[fin]) <= _ulp(w[fin]))


def test_max_pool_grad_bf16_reports_foreign_indices():
    x = np.zeros((1, 2, 4, 4), BF16)
    dy = np.ones((1, 2, 2, 2), BF16)
    idx = np.zeros((1, 2, 2, 2), np.int64)  # the second plane points into the first
    with pytest.raises(opsnn.errors.OpsnnError, match="MaxPoolGrad"):
        _prepare("MaxPoolGrad", [dy, idx, x], domain="opsnn").run().numpy()


# -- a bf16 autocast training step ------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        with nn.init.seeded(3):
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        h = ops.max_pool2d(ops.relu(self.conv(x)), 3, 2, 1)
        return self.fc(ops.reshape(h, (h.shape[0], -1)))


def test_autocast_step_runs_these_ops_natively_and_matches_float32():
    rng = np.random.default_rng(5)
    x = opsnn.tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    y = opsnn.tensor(rng.integers(0, 5, 4))
    grads = {}
    for cast in (False, True):
        net = _Net()
        with opsnn.profiler.profile() as prof:
            with opsnn.autocast("bfloat16", enabled=cast):
                loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
        grads[cast] = {k: p.grad.numpy().copy() for k, p in net.named_parameters()}
        kernels = {(k.op, k.kernel) for k in prof.kernels}
    native = [
        ("MaxPool", "max_pool_numba_bf16"),
        ("MaxPoolGrad", "max_pool_grad_numba_bf16"),
        ("Greater", "compare_numba_bf16"),  # the Relu gradient's mask
        ("ReduceSum", "reduce_sum_numba_bf16"),  # the Linear bias gradient
    ]
    for op, kernel in native:
        assert (op, kernel) in kernels, sorted(kernels)
    for k, g32 in grads[False].items():
        g = grads[True][k]
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, g32, rtol=5e-2, atol=5e-2 * np.abs(g32).max())


# -- the fp32 adapter's widening (bfloat16 inputs of float32-only kernels) ---------------------------------
def test_adapter_widening_equals_float32_on_widened_inputs():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 1, 33)).astype(BF16)
    b = rng.standard_normal((4, 1)).astype(BF16)
    a.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, 1e38], np.float32).astype(BF16)
    ex = _prepare("Sub", [a, b])
    assert ex.adapter
    got = ex.run().numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        want = (a.astype(np.float32) - b.astype(np.float32)).astype(BF16)
    _same_or_both_nan(got, want)
    q = rng.standard_normal((2, 16, 32)).astype(BF16)
    k = rng.standard_normal((2, 16, 32)).astype(BF16)
    v = rng.standard_normal((2, 16, 32)).astype(BF16)
    attrs = {"q_num_heads": 2, "kv_num_heads": 2}
    # a float32-only kernel (attention_batched, where it applies, takes bf16 natively)
    ex = _prepare("Attention", [q, k, v], attrs, algo="attention_gemm")
    assert ex.adapter and ex.kernel_name != "reference"
    got = ex.run().numpy()
    f32 = executor.prepare(
        get_op("Attention"), [x.astype(np.float32) for x in (q, k, v)], attrs, algo=ex.kernel_name
    ).run()
    assert np.array_equal(_bits(got), _bits(f32.numpy().astype(BF16)))


# -- bf16 attention keeps its forward's logsumexp ---------------------------------------------------------
def test_recorded_bf16_attention_keeps_the_logsumexp(monkeypatch):
    from opsnn.kernels.cpu import bf16_attention as KBA

    given = []
    real = KBA.attention_backward_bf16

    def spy(*args):
        given.append(args[5] is not None)
        return real(*args)

    monkeypatch.setattr(KBA, "attention_backward_bf16", spy)
    rng = np.random.default_rng(2032)
    B, Hq, Hkv, Sq, T, D = 2, 4, 2, 9, 12, 8
    arrays = [rng.standard_normal(s) for s in [(B, Hq, Sq, D), (B, Hkv, T, D), (B, Hkv, T, D), (B, Hq, Sq, D)]]
    mask = rng.random((B, 1, Sq, T)) > 0.3
    q, k, v = (opsnn.tensor(a.astype(BF16)).requires_grad_() for a in arrays[:3])
    dy = arrays[3].astype(BF16)
    y = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert y.grad_fn.name == "AttentionTrain" and y.dtype == BF16
    ops.sum(ops.mul(y, opsnn.tensor(dy))).backward()
    assert given == [True]
    got = [t.grad.numpy() for t in (q, k, v)]
    # the same backward recomputing the logsumexp: the same float32 math on the same widened inputs
    again = ops.attention_backward(dy, *(t.detach() for t in (q, k, v)), y.detach(), mask, None)
    assert given == [True, False]
    for a, w in zip(got, again):
        w = w.numpy()
        assert a.dtype == BF16
        assert np.all(np.abs(a.astype(np.float64) - w.astype(np.float64)) <= _ulp(w))
    # float64 gradients of the bf16 values (the registry-op composition): bf16 rounding of
    # inputs, Y and dQ/dK/dV, so a few bf16 ulps of the gradients' scale
    q64, k64, v64 = (opsnn.tensor(t.detach().numpy().astype(np.float64)).requires_grad_() for t in (q, k, v))
    y64 = ops.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask, enable_gqa=True)
    ops.sum(ops.mul(y64, opsnn.tensor(dy.astype(np.float64)))).backward()
    for a, t in zip(got, (q64, k64, v64)):
        w = t.grad.numpy()
        np.testing.assert_allclose(a.astype(np.float64), w, rtol=3e-2, atol=3e-2 * np.abs(w).max())
    f16 = opsnn.tensor(arrays[0].astype(np.float16)).requires_grad_()
    assert ops.scaled_dot_product_attention(f16, f16, f16).grad_fn.name == "Attention"


# -- SwiGLU ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 5), (4, 64, 768)], ids=["serial", "parallel"])
def test_swiglu_bf16_against_float32_kernel_and_float64(shape):
    rng = np.random.default_rng(shape[-1])
    a = (rng.standard_normal(shape) * 4).astype(BF16)
    b = rng.standard_normal(shape).astype(BF16)
    a.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, 80.0], np.float32).astype(BF16)
    b.reshape(-1)[:4] = np.array([1.0, 2.0, 3.0, np.inf], np.float32).astype(BF16)
    ex = _prepare("SwiGLU", [a, b], {"alpha": 1.5})
    assert ex.kernel_name == "swiglu_numba_bf16" and not ex.adapter
    got = ex.run().numpy()
    want32 = _prepare("SwiGLU", [a, b], {"alpha": 1.5}, algo="swiglu_numba").run().numpy()
    _same_or_both_nan(got, want32)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want64 = af / (1.0 + np.exp(-1.5 * af)) * bf
    g = got.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(want64))
    fin = np.isfinite(want64)
    assert np.array_equal(g[~fin & ~np.isnan(g)], want64[~fin & ~np.isnan(want64)])
    assert np.all(np.abs(g[fin] - want64[fin]) <= _ulp(want64[fin]))
    # column halves of one stacked gate|up product (strided views): the same values
    both = np.concatenate([a, b], axis=-1)
    h = shape[-1]
    y = ops.swiglu(opsnn.tensor(both)[..., :h], opsnn.tensor(both)[..., h:], alpha=1.5).numpy()
    _same_or_both_nan(y, got)


def test_swiglu_bf16_written_over_an_input():
    """A compiled graph's memory plan may give SwiGLU a dying input's buffer as its output."""
    from opsnn.kernels.cpu import activation_backward as KB

    rng = np.random.default_rng(3)
    a = rng.standard_normal(5000).astype(BF16)
    b = rng.standard_normal(5000).astype(BF16)
    want = _prepare("SwiGLU", [a, b]).run().numpy()
    plan = (np.float32(1.0), 1024)
    for over in (0, 1):
        ins = [a.copy(), b.copy()]
        KB.swiglu_bf16(ins, [ins[over]], {}, plan, None)
        assert np.array_equal(_bits(ins[over]), _bits(want))
    buf = np.concatenate([a, np.zeros(7, BF16)])  # the output 7 elements past the gate: a partial overlap
    out = buf[7:]
    KB.swiglu_bf16([buf[:5000], b], [out], {}, plan, None)
    assert np.array_equal(_bits(out), _bits(want))


# -- RotaryEmbedding -------------------------------------------------------------------------------------------
def _rope_tables(S, half):
    inv = 1.0 / (10000.0 ** (np.arange(half) / half))
    a = np.arange(S)[:, None] * inv[None]
    return np.cos(a), np.sin(a)


@pytest.mark.parametrize(
    "xshape,attrs,with_pos",
    [
        ((4, 64, 256), {"num_heads": 4}, True),  # (B, S, hidden), position ids: LLaMA's layout
        ((2, 3, 7, 8), {"interleaved": 1}, False),  # (B, N, S, Dh)
        ((2, 5, 30), {"num_heads": 3, "rotary_embedding_dim": 6}, True),  # a partial rotation
    ],
)
def test_rotary_bf16_against_float32_kernel_and_float64(xshape, attrs, with_pos):
    rng = np.random.default_rng(xshape[-1])
    x = rng.standard_normal(xshape).astype(BF16)
    x.reshape(-1)[:3] = np.array([np.nan, np.inf, -np.inf], np.float32).astype(BF16)
    if len(xshape) == 4:
        B, _, S, Dh = xshape
    else:
        B, S, H = xshape
        Dh = H // attrs["num_heads"]
    c, s = _rope_tables(S + 3, (attrs.get("rotary_embedding_dim") or Dh) // 2)
    if with_pos:
        ins = [x, c.astype(BF16), s.astype(BF16), np.tile(np.arange(S), (B, 1)) + 2]
    else:
        ins = [x, c[None, :S].astype(BF16), s[None, :S].astype(BF16)]
    ex = _prepare("RotaryEmbedding", ins, attrs)
    assert ex.kernel_name == "rotary_numba_bf16" and not ex.adapter
    got = ex.run().numpy()
    assert got.dtype == BF16 and got.shape == x.shape
    _same_or_both_nan(got, _prepare("RotaryEmbedding", ins, attrs, algo="rotary_numba").run().numpy())
    full = {"interleaved": 0, "num_heads": None, "rotary_embedding_dim": 0, **attrs}
    with np.errstate(invalid="ignore"):  # inf * 0 where a table value is 0: NaN, as in the kernels
        want = get_op("RotaryEmbedding").reference([a.astype(np.float64) if a.dtype == BF16 else a for a in ins], full)
    fin = np.isfinite(want) & np.isfinite(got.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), np.isnan(want))
    # a rotated value is a two-term sum: rounded once to bfloat16, within an ulp of its terms' scale
    np.testing.assert_allclose(got.astype(np.float64)[fin], want[fin], rtol=2**-8, atol=2**-8)


def test_max_pool_bf16_leaves_huge_planes_to_the_adapter(monkeypatch):
    from opsnn.ops.defs import pool as P

    monkeypatch.setattr(P, "BF16_PLANE_MAX", 15)
    x = np.ones((1, 1, 4, 4), BF16)
    ex = _prepare("MaxPool", [x], {"kernel_shape": [2, 2]}, num_outputs=2)
    assert ex.kernel_name == "max_pool_numba" and ex.adapter
    _, idx = ex.run()
    dy = np.ones((1, 1, 3, 3), BF16)
    assert _prepare("MaxPoolGrad", [dy, idx.numpy(), x], domain="opsnn").kernel_name == "max_pool_grad_numba"
