"""Inf and NaN through every convolution kernel: each float kernel of each op of the registry's
"conv" category (enumerated, so a new kernel is covered or fails here until a case fits it)
gets inputs holding NaN, +Inf and -Inf, and weights holding Inf and NaN, and must put NaN,
+Inf and -Inf exactly where a float64 direct convolution (written here: zero padding, every
tap multiplied, one einsum per kernel offset) has them, and agree on the finite values.

Winograd kernels would spread a NaN over a whole tile and turn an Inf into Inf - Inf = NaN;
they find such tiles in their input transform and compute them directly (their record's
``nonfinite``), and do not take constant weights holding Inf or NaN."""

import itertools

import ml_dtypes
import numpy as np
import pytest

import opsnn  # noqa: F401  (registers the ops)
from opsnn.errors import KernelNotFoundError
from opsnn.kernels.cpu import blocked as KB
from opsnn.kernels.cpu import fused as KF
from opsnn.kernels.cpu import mkl as KM
from opsnn.kernels.cpu import onednn as KD
from opsnn.ops.autotune import NotPreferred
from opsnn.ops.executor import plan_op
from opsnn.ops.registry import TensorMeta, all_ops, get_op
from opsnn.runtime import cpu

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the oracles' Inf - Inf

BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK = 8 if 8 in KB.BLOCKS else KB.BLOCKS[0]


# -- the oracle ---------------------------------------------------------------------------------------
def conv64(x, w, b=None, strides=None, pads=None, dilations=None, group=1):
    """Direct convolution in float64: zero-padded x, y += x[window at tap] * w[tap] per tap."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    s = tuple(strides or (1,) * nd)
    d = tuple(dilations or (1,) * nd)
    p = tuple(pads or (0,) * (2 * nd))
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p[i], p[nd + i]) for i in range(nd)])
    k = w.shape[2:]
    out = tuple((xp.shape[2 + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(nd))
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    cg, mg = c // group, m // group
    y = np.zeros((n, m) + out)
    for g in range(group):
        for t in itertools.product(*(range(v) for v in k)):
            sl = tuple(slice(t[i] * d[i], t[i] * d[i] + (out[i] - 1) * s[i] + 1, s[i]) for i in range(nd))
            y[:, g * mg : (g + 1) * mg] += np.einsum(
                "nc...,mc->nm...",
                xp[(slice(None), slice(g * cg, (g + 1) * cg)) + sl],
                w[(slice(g * mg, (g + 1) * mg), slice(None)) + t],
            )
    if b is not None:
        y += b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


def conv_transpose64(x, w, b=None, strides=None, pads=None, group=1):
    """Transposed convolution in float64: every x[i] * w[tap] scattered to i * s + tap, then cropped."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    nd = x.ndim - 2
    s = tuple(strides or (1,) * nd)
    p = tuple(pads or (0,) * (2 * nd))
    n, c = x.shape[:2]
    mg, k = w.shape[1], w.shape[2:]
    cg = c // group
    full = tuple((x.shape[2 + i] - 1) * s[i] + k[i] for i in range(nd))
    y = np.zeros((n, mg * group) + full)
    for g in range(group):
        for t in itertools.product(*(range(v) for v in k)):
            sl = tuple(slice(t[i], t[i] + (x.shape[2 + i] - 1) * s[i] + 1, s[i]) for i in range(nd))
            y[(slice(None), slice(g * mg, (g + 1) * mg)) + sl] += np.einsum(
                "nc...,cm->nm...", x[:, g * cg : (g + 1) * cg], w[(slice(g * cg, (g + 1) * cg), slice(None)) + t]
            )
    y = y[(slice(None), slice(None)) + tuple(slice(p[i], full[i] - p[nd + i]) for i in range(nd))]
    if b is not None:
        y = y + b.astype(np.float64).reshape((1, -1) + (1,) * nd)
    return y


# -- the cases -------------------------------------------------------------------------------------------
# (x shape, w shape, attrs): between them every kernel applies at least once (Winograd F(4x4),
# F(2x2) and the dilated form on the 3x3 ones, each transform variant, 1x1 GEMMs, depthwise,
# grouped and strided im2col, 1-D and 3-D)
CONV = [
    ((2, 16, 14, 14), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 34, 33), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # F(4x4) on one wide image: the row-task transform
    ((1, 8, 6, 6), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # little work: serial transforms
    ((1, 16, 9, 11), (24, 16, 1, 1), {}),
    ((1, 16, 12, 12), (16, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 16}),
    ((1, 16, 13, 13), (16, 16, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 8, 10, 10), (8, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2, "strides": [2, 2]}),
    ((1, 4, 9), (6, 4, 3), {"pads": [1, 1]}),
    ((1, 2, 5, 6, 5), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ((2, 16, 2, 2), (256, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # 256 outputs onto 2x2 planes: one product (AVX2)
]
TRANSPOSE = [
    ((1, 6, 7, 8), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 6, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
]


def _poison_x(x):
    """NaN, +Inf and -Inf at a corner, inside and near an edge; +Inf and -Inf close enough that
    some outputs see both."""
    x = x.copy()
    n = x.size
    for i, v in zip((0, n // 3, n // 3 + 2, n - 2, n // 2 + 1), (np.inf, np.nan, -np.inf, -np.inf, np.inf)):
        x.flat[i] = v
    return x


def _poison_w(w):
    """+Inf, -Inf and NaN at the centre tap. Not at a tap that meets the zero padding: 0 * Inf is
    NaN for kernels that multiply the padding (im2col, onnx.reference) and nothing for those
    that skip it (direct loops, oneDNN); the ONNX spec does not say which."""
    w = w.copy()
    centre = tuple(k // 2 for k in w.shape[2:])
    w[(0, 0) + centre] = np.inf
    w[(w.shape[0] - 1, w.shape[1] - 1) + centre] = np.nan
    w[(w.shape[0] // 2, 0) + centre] = -np.inf
    return w


def _inputs(rec_name, case, kind, dt, rng):
    """(inputs, attrs, float64 oracle output, to_plain(out)) of one case."""
    xs, ws, attrs = case
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) * 0.3).astype(np.float32)
    b = rng.standard_normal(ws[1] * attrs.get("group", 1) if rec_name == "ConvTranspose" else ws[0]).astype(np.float32)
    if kind == "x":
        x = _poison_x(x)
    else:
        w = _poison_w(w)
    x, w, b = x.astype(dt), w.astype(dt), b.astype(dt)
    geo = dict(strides=attrs.get("strides"), pads=attrs.get("pads"), group=attrs.get("group", 1))
    if rec_name == "ConvTranspose":
        return [x, w, b], dict(attrs), conv_transpose64(x, w, b, **geo), None
    want = conv64(x, w, b, dilations=attrs.get("dilations"), **geo)
    if rec_name == "Conv":
        return [x, w, b], dict(attrs), want, None
    z = rng.standard_normal(want.shape).astype(dt)
    want = np.maximum(want + z.astype(np.float64), 0)  # Relu(NaN) is NaN
    attrs = dict(attrs, activation="Relu")
    if rec_name == "FusedConv":
        return [x, w, b, z], attrs, want, None
    attrs.update(src_blocked=1, block=BLOCK)  # BlockedConv: X, Z and Y channel-blocked
    ins = [KB.blocked_reference(x, BLOCK), w, b, KB.blocked_reference(z, BLOCK)]
    return ins, attrs, want, lambda y: KB.plain_reference(y, BLOCK)


def _cases(rec_name):
    if rec_name == "ConvTranspose":
        return TRANSPOSE
    if rec_name == "BlockedConv":
        return [
            c
            for c in CONV
            if len(c[0]) == 4 and c[2].get("group", 1) == 1 and c[0][1] % BLOCK == 0 and c[1][0] % BLOCK == 0
        ]
    return CONV


def _kernels():
    out = []
    for rec in all_ops():
        if rec.category != "conv" or not any(np.dtype(d).kind == "f" for d in rec.inputs[0].dtypes):
            continue  # ConvInteger, QLinearConv: no Inf or NaN in 8-bit data
        if rec.name == "DeformConv":
            # bilinear sampling weighs the neighbours of an integer position by 0: 0 * NaN spreads
            # NaN to them, so it is no direct convolution even at zero offsets
            continue
        if rec.name.startswith("ConvBackward") or rec.name.endswith("Grad"):  # gradients: tests/test_backward_*.py
            continue
        for k in rec.kernels:
            if k.dtypes is None or any(np.dtype(d).kind == "f" or np.dtype(d) == BF16 for d in k.dtypes):
                out.append(pytest.param(rec.name, rec.domain, k.name, id=f"{rec.name}:{k.name}"))
    return out


def _dtype(k):
    if k.dtypes is None:
        return np.dtype(np.float32)
    dts = [np.dtype(d) for d in k.dtypes]
    return np.dtype(np.float32) if np.dtype(np.float32) in dts else dts[0]


_UNAVAILABLE = [
    why for why in (KM.unavailable(), KM.bf16_unavailable(), KD.unavailable(), KD.matmul_unavailable()) if why
]


def _assert_ieee_equal(got, want, tol, what):
    for name, fn in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        bad = fn(got) != fn(want)
        assert not bad.any(), (
            f"{what}: {name} at {np.argwhere(bad)[:5].tolist()} ({int(bad.sum())} places) differs "
            f"from the direct convolution (got {got[bad][:5]}, want {want[bad][:5]})"
        )
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=tol * np.abs(want[fin]).max(initial=1.0), err_msg=what)


@pytest.mark.parametrize("op,domain,name", _kernels())
def test_nan_and_inf_as_a_direct_convolution(op, domain, name, rng, monkeypatch):
    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)  # the default: IEEE
    rec = get_op(op, domain)
    k = next(k for k in rec.kernels if k.name == name)
    dt = _dtype(k)
    tol = 3e-2 if dt == BF16 else 2e-4  # F(4x4)'s transform constants amplify rounding (~1e-5 of the scale)
    ran, rejected = [], []
    for case, const, kind in itertools.product(_cases(op), (True, False), ("x", "w")):
        ins, attrs, want, to_plain = _inputs(op, case, kind, dt, rng)
        metas = [TensorMeta(a.shape, a.dtype) for a in ins]
        values = [None, ins[1]] + [None] * (len(ins) - 2) if const else [None] * len(ins)
        try:
            ctx = plan_op(rec, metas, values, attrs, algo="reference").ctx
        except KernelNotFoundError as exc:
            rejected.append(str(exc))
            continue
        why = k.check(ctx)
        if why is not None and not isinstance(why, NotPreferred):
            if "Inf or NaN" not in why:
                rejected.append(why)
                continue
            # the selector does not take it; forced, it must still be right
            assert k.nonfinite and const and kind == "w", (name, why)
        plan = k.plan(ctx) if k.plan else None
        ws = np.full(k.workspace(ctx, plan) if k.workspace else 0, 0xFF, np.uint8)  # NaN-filled scratch
        out = np.full(ctx.outputs[0].shape, np.nan, dt)  # NaN-filled: a place not written fails
        k.fn([np.ascontiguousarray(a) for a in ins], [out], ctx.attrs, plan, ws)
        got = (to_plain(out) if to_plain else out).astype(np.float64)
        assert not np.isfinite(want).all(), "the case must exercise NaN or Inf"
        _assert_ieee_equal(
            got, want, tol, f"{name} on {case} ({'constant' if const else 'per-call'} weight, non-finite {kind})"
        )
        ran.append((case, const, kind))
    if not ran:
        if any(u in r for u in _UNAVAILABLE + ["the ISA in force"] for r in rejected):
            pytest.skip(f"{name} is not available on this machine: {rejected[0]}")
        pytest.fail(f"{name}: no case here applies (add one): {sorted(set(rejected))}")


@pytest.mark.parametrize(
    "op,domain,name",
    [
        ("Conv", "", "conv2d_winograd"),
        ("Conv", "", "conv2d_winograd_f2"),
        ("Conv", "", "conv2d_winograd_dilated"),
        ("BlockedConv", "opsnn", "conv_winograd_blocked"),
    ],
)
def test_winograd_records_say_how_and_refuse_nonfinite_constant_weights(op, domain, name):
    rec = get_op(op, domain)
    k = next(k for k in rec.kernels if k.name == name)
    assert "computed again by the direct sum" in k.nonfinite
    w = np.zeros((16, 16, 3, 3), np.float32)
    w[3, 4, 1, 1] = np.inf
    xs, attrs = (
        (1, 16, 24, 24),
        {"pads": [1, 1, 1, 1], **({"dilations": [2, 2], "pads": [2] * 4} if "dilated" in name else {})},
    )
    if op == "BlockedConv":
        attrs.update(src_blocked=1, block=BLOCK)
    metas = [TensorMeta(xs, np.dtype(np.float32)), TensorMeta(w.shape, np.dtype(np.float32))]
    finite = plan_op(rec, metas, [None, np.ones_like(w)], attrs, algo="reference").ctx
    why = k.check(finite)
    if why is not None and not isinstance(why, NotPreferred):  # refused here whatever the weight
        pytest.skip(f"{name} does not run on this CPU (ISA {cpu.isa()}): {why}")
    ctx = plan_op(rec, metas, [None, w], attrs, algo="reference").ctx
    assert "holds Inf or NaN" in str(k.check(ctx))


def test_explain_shows_how_the_chosen_kernel_keeps_nan_and_inf(rng):
    from opsnn.graph import Graph, Node, Value
    from opsnn.tools.explain import explain_graph

    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, (1, 64, 28, 28))],
        outputs=["y"],
        nodes=[Node("Conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1]})],
        initializers={"w": w},
    )
    text = explain_graph(g)
    chosen = [
        ln
        for ln in text.splitlines()
        if ln.startswith("  ") and not ln.startswith("   ") and "Conv" in ln and "): " in ln
    ]  # the node's line: "  name (op): kernel [-> Conv: inner kernel]"
    assert chosen, text
    nonfinite = [
        k
        for op in ("Conv", "BlockedConv")
        for k in get_op(op, "opsnn" if op[0] == "B" else "").kernels
        if k.nonfinite and k.name in chosen[0]
    ]
    flat = " ".join(text.split())  # explain wraps long lines
    for k in nonfinite:
        assert f"inf/nan: {' '.join(k.nonfinite.split())}" in flat
    assert ("inf/nan:" in text) == bool(nonfinite), text


def test_blocked_conv_keeps_nan_under_relu_by_default(monkeypatch, rng):
    """oneDNN's blocked convolution with a Relu post-op keeps NaN (the post-op's max gives 0) where a NaN or
    Inf in X, W or Z can make a pre-activation NaN, through the kernel call and the bound call the graph
    engine makes; finite inputs of moderate size keep the fused post-op (the post-op-free primitive is
    built only once needed), a huge finite X does not. ``OPSNN_CONV_IEEE=0`` drops the check."""
    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    rec = get_op("BlockedConv", "opsnn")
    k = next(k for k in rec.kernels if k.name == "conv_onednn")
    ran = 0
    for case, kind in itertools.product(_cases("BlockedConv"), ("x", "w")):
        ins, attrs, want, to_plain = _inputs("BlockedConv", case, kind, np.float32, rng)
        metas = [TensorMeta(a.shape, a.dtype) for a in ins]
        ctx = plan_op(rec, metas, [None, ins[1], None, None], attrs, algo="reference").ctx
        why = k.check(ctx)
        if why is not None and not isinstance(why, NotPreferred):
            pytest.skip(f"conv_onednn does not run here: {why}")
        plan = k.plan(ctx)
        assert plan.prim.checked is not None
        ins = [np.ascontiguousarray(a) for a in ins]
        x, b, z = ins[0], ins[2], ins[3]
        # finite X of moderate size: the fused post-op runs (unless W itself holds Inf or NaN)
        assert plan.prim.bounded(np.ones_like(x), b, z) == (kind == "x")
        if kind == "x":  # nothing past the bound yet: no post-op-free primitive was built
            fine = np.zeros(ctx.outputs[0].shape, np.float32)
            plan.prim.bind(np.ones_like(x), b, z, fine)()
            assert plan.prim._plain is None
        for how in ("call", "bind"):
            out = np.full(ctx.outputs[0].shape, 7.0, np.float32)
            if how == "call":
                k.fn(ins, [out], ctx.attrs, plan, None)
            else:
                plan.prim.bind(x, b, z, out)()
            assert np.isnan(want).any()
            _assert_ieee_equal(
                to_plain(out).astype(np.float64), want, 2e-4, f"conv_onednn {how} on {case}, NaN/Inf in {kind}"
            )
        ran += 1
        huge = np.full_like(x, 1e38)
        assert not plan.prim.bounded(huge, b, z)  # 1e38 * sum|W| could overflow: Inf - Inf would be NaN
        monkeypatch.setenv(KD.CONV_IEEE_ENV, "0")
        assert k.plan(ctx).prim.checked is None
        monkeypatch.delenv(KD.CONV_IEEE_ENV)
    assert ran


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_blocked_bf16_conv_keeps_nan_and_inf_under_relu_and_clip(act, monkeypatch, rng):
    """bfloat16 blocked convolution + Relu / Clip: oneDNN's post-op maps NaN to 0 or a bound, so the same
    bound as float32 (bfloat16 read as its bits) sends a non-finite X or W to the post-op-free primitive;
    NaN, +Inf and -Inf land where a float64 direct convolution of the bfloat16 values has them, through
    the kernel call and the bound call; finite inputs of moderate size keep the post-op."""
    if KD.bf16_unavailable() is not None:  # the blocked-layout pass makes no bfloat16 blocked convolution here
        pytest.skip(f"no bfloat16 blocked convolution here: {KD.bf16_unavailable()}")
    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    rec = get_op("BlockedConv", "opsnn")
    k = next(k for k in rec.kernels if k.name == "conv_onednn")
    lo, hi = -0.5, 1.5
    ran = 0
    for case, kind in itertools.product(_cases("BlockedConv"), ("x", "w")):
        ins, attrs, relu, to_plain = _inputs("BlockedConv", case, kind, BF16, rng)
        if act == "Clip":
            attrs.update(activation="Clip", activation_alpha=lo, activation_beta=hi)
            w64, x64 = ins[1].astype(np.float64), to_plain(ins[0]).astype(np.float64)
            pre = conv64(x64, w64, ins[2], attrs.get("strides"), attrs.get("pads"), attrs.get("dilations"))
            want = np.clip(pre + to_plain(ins[3]).astype(np.float64), lo, hi)  # np.clip keeps NaN
        else:
            want = relu
        metas = [TensorMeta(a.shape, a.dtype) for a in ins]
        ctx = plan_op(rec, metas, [None, ins[1], None, None], attrs, algo="reference").ctx
        why = k.check(ctx)
        if why is not None and not isinstance(why, NotPreferred):
            pytest.skip(f"conv_onednn does not run here: {why}")
        plan = k.plan(ctx)
        assert plan.prim.checked is not None, "bfloat16 keeps the IEEE check"
        ins = [np.ascontiguousarray(a) for a in ins]
        x, b, z = ins[0], ins[2], ins[3]
        assert plan.prim.bounded(np.ones_like(x), b, z) == (kind == "x")
        assert not plan.prim.bounded(np.full_like(x, 1e38), b, z)  # 1e38 * sum|W| could overflow float32
        for how in ("call", "bind"):
            out = np.full(ctx.outputs[0].shape, np.nan, BF16)  # NaN-filled: a place not written fails
            if how == "call":
                k.fn(ins, [out], ctx.attrs, plan, None)
            else:
                plan.prim.bind(x, b, z, out)()
            assert np.isnan(want).any()
            _assert_ieee_equal(
                to_plain(out).astype(np.float64), want, 3e-2, f"bf16 conv_onednn + {act} {how} on {case}, {kind}"
            )
        ran += 1
    assert ran


def test_max_abs_reads_bfloat16_bits(rng):
    """bfloat16: max |x| exactly (as the float32 of equal value), inf for any NaN or Inf (exponent all ones)."""
    for n in (0, 5, KF.MAX_ABS_CHUNK * 3 + 7):
        x = (rng.standard_normal(n) * 1e3).astype(BF16)
        assert KF.max_abs(x) == (float(np.abs(x.astype(np.float64)).max()) if n else 0.0)
        if n:
            y = x.copy()
            y[n // 3] = -float(ml_dtypes.finfo(BF16).max)  # the largest finite magnitude, negative
            assert KF.max_abs(y) == float(ml_dtypes.finfo(BF16).max)
            for v in (np.nan, -np.nan, np.inf, -np.inf):
                y = x.copy()
                y[n // 2] = v
                assert KF.max_abs(y) == np.inf


def test_max_abs_says_inf_for_any_nan_or_inf(rng):
    for n, dt in itertools.product((0, 5, KF.MAX_ABS_CHUNK * 3 + 7), (np.float32, np.float64)):
        x = (rng.standard_normal(n) * 1e3).astype(dt)
        assert KF.max_abs(x) == (float(np.abs(x).max()) if n else 0.0)
        if n:
            y = x.copy()
            y[n // 3] = -np.finfo(dt).max  # the largest finite magnitude, negative
            assert KF.max_abs(y) == float(np.finfo(dt).max)
            y[0] = -np.float32(1e-45)  # a denormal
            assert KF.max_abs(y) == float(np.finfo(dt).max)
        for v in (np.nan, -np.nan, np.inf, -np.inf):
            if n:
                y = x.copy()
                y[n // 2] = v
                assert KF.max_abs(y) == np.inf


def test_blocked_conv_chain_keeps_nan_in_a_compiled_graph(monkeypatch, rng):
    """Conv -> Relu -> Conv -> Relu compiled (a blocked oneDNN chain where oneDNN runs): by default the NaN an
    input NaN or Inf spreads to is where the unoptimized graph has it (with OPSNN_CONV_IEEE=0, 0)."""
    from opsnn.graph import Graph, Node, Value, run

    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    w1, w2 = ((rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32) for _ in range(2))
    g = Graph(
        "chain",
        inputs=[Value("x", np.float32, (1, 16, 12, 12))],
        outputs=["y"],
        initializers={"w1": w1, "w2": w2},
        nodes=[
            Node("Conv", ["x", "w1"], ["a"], {"pads": [1, 1, 1, 1]}),
            Node("Relu", ["a"], ["r"]),
            Node("Conv", ["r", "w2"], ["b"], {"pads": [1, 1, 1, 1]}),
            Node("Relu", ["b"], ["y"]),
        ],
    )
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    x[0, 3, 5, 5], x[0, 7, 2, 9] = np.nan, np.inf
    want = run(g, {"x": x})["y"]
    want = np.asarray(want.numpy() if hasattr(want, "numpy") else want, np.float64)
    got = opsnn.compile(g).run({"x": x})["y"].numpy().astype(np.float64)
    assert np.isnan(want).any()
    _assert_ieee_equal(got, want, 2e-4, "compiled Conv-Relu chain")


def _bounded_chain(rng, w2_scale=1.0):
    """x -> Conv + Relu -> MaxPool -> Conv(1x1, bias) + Relu -> Conv(1x1) + Relu: blocked oneDNN convolutions
    (3x3 on 6x6 planes is under Winograd's tile count), a max pool between them."""
    from opsnn.graph import Graph, Node, Value

    w1 = (rng.standard_normal((16, 16, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((16, 16, 1, 1)) * 0.3 * w2_scale).astype(np.float32)
    w3 = (rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32)
    b2 = rng.standard_normal(16).astype(np.float32)
    return Graph(
        "bounded_chain",
        inputs=[Value("x", np.float32, (1, 16, 12, 12))],
        outputs=["y"],
        initializers={"w1": w1, "w2": w2, "w3": w3, "b2": b2},
        nodes=[
            Node("Conv", ["x", "w1"], ["a"], {"pads": [1, 1, 1, 1]}),
            Node("Relu", ["a"], ["ra"]),
            Node("MaxPool", ["ra"], ["p"], {"kernel_shape": [2, 2], "strides": [2, 2]}),
            Node("Conv", ["p", "w2", "b2"], ["b"]),
            Node("Relu", ["b"], ["rb"]),
            Node("Conv", ["rb", "w3"], ["c"]),
            Node("Relu", ["c"], ["y"]),
        ],
    )


def _counting_max_abs(monkeypatch):
    """KF.max_abs, keeping the arrays it reads."""
    reads = []
    real = KF.max_abs

    def counted(x):
        reads.append(x)
        return real(x)

    monkeypatch.setattr(KF, "max_abs", counted)
    return reads


def test_blocked_conv_chain_takes_bounds_from_its_producers(monkeypatch, rng):
    """In a compiled chain only the first convolution reads its input for the IEEE check: each later one
    takes max|X| from the convolution (through the max pool) that wrote X, and a constant bias's max|B|
    from prepare; the results are those of the unoptimized graph, finite or not."""
    from opsnn.graph import run

    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    g = _bounded_chain(rng)
    cg = opsnn.compile(g)
    if [n.op_type for n in cg.graph.nodes].count("BlockedConv") != 3:
        pytest.skip("no blocked oneDNN convolutions here")
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    cg.run({"x": x})
    reads = _counting_max_abs(monkeypatch)
    for poison in (None, np.nan, np.inf):
        xp = x.copy()
        if poison is not None:
            xp[0, 3, 5, 5] = poison
        del reads[:]
        got = cg.run({"x": xp})["y"].numpy().astype(np.float64)
        want = run(g, {"x": xp})["y"]
        want = np.asarray(want.numpy() if hasattr(want, "numpy") else want, np.float64)
        _assert_ieee_equal(got, want, 2e-4, f"bounded chain, x holding {poison}")
        if poison is None:
            assert [r.shape for r in reads] == [(1, 16, 12, 12)]  # X of the first convolution, nothing else
        else:  # no bound past a NaN or Inf: each convolution and the max pool read their input
            assert len(reads) == 4 and not np.isfinite(want).all()


def test_blocked_conv_reads_its_input_when_a_handed_bound_is_too_loose(monkeypatch, rng):
    """A producer's bound multiplied through a large weight can pass float32's range while the data does
    not: the convolution then reads X after all, and keeps the fast path where the data allows it."""
    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    rec = get_op("BlockedConv", "opsnn")
    k = next(k for k in rec.kernels if k.name == "conv_onednn")
    case = _cases("BlockedConv")[0]
    ins, attrs, _, _ = _inputs("BlockedConv", case, "x", np.float32, rng)
    ctx = plan_op(
        rec, [TensorMeta(a.shape, a.dtype) for a in ins], [None, ins[1], None, None], attrs, algo="reference"
    ).ctx
    why = k.check(ctx)
    if why is not None and not isinstance(why, NotPreferred):
        pytest.skip(f"conv_onednn does not run here: {why}")
    prim = k.plan(ctx).prim
    x, b, z = np.ones_like(ins[0]), ins[2], ins[3]
    rest = (KF.max_abs(b) if b is not None else 0.0) + (KF.max_abs(z) if z is not None else 0.0)
    l1 = float(np.abs(ins[1].astype(np.float64)).reshape(ins[1].shape[0], -1).sum(axis=1).max())
    reads = _counting_max_abs(monkeypatch)

    def x_reads():
        return sum(r is x for r in reads)

    p = prim.pre_bound(x, b, z, xb=2.0)
    assert x_reads() == 0 and 2.0 * l1 + rest <= p < (2.0 * l1 + rest) * 1.001  # the handed bound, X not read
    p = prim.pre_bound(x, b, z, xb=1e38)
    assert x_reads() == 1 and l1 + rest <= p < (l1 + rest) * 1.001  # too loose: X read, max|X| = 1 used
    x.reshape(-1)[x.size // 2] = np.nan
    assert not prim.pre_bound(x, b, z, xb=1e38) < 3e38  # read again: NaN


@pytest.mark.parametrize("block", KB.BLOCKS)
def test_blocked_max_pool_keeps_nan(block, rng):
    """oneDNN's max pooling gives a window holding NaN its largest number; BlockedMaxPool gives NaN there
    (eagerly and bound, as a compiled graph calls it), and +Inf / -Inf as a max does: -Inf where the whole
    window is -Inf (oneDNN gives it the lowest finite number; opsnn fuzz nan_inf seed 2619483)."""
    if KD.unavailable() is not None:
        pytest.skip(KD.unavailable())
    x = rng.standard_normal((1, 1, 7, 7, block)).astype(np.float32)
    x[0, 0, 1, 1, 3], x[0, 0, 6, 6, 2], x[0, 0, 4, 0, 1] = np.nan, np.inf, -np.inf
    x[0, 0, 0:3, 0:3, 5] = -np.inf  # the first window of lane 5, whole
    x[0, 0, 4:7, 4:7, 3] = -np.inf  # and the last of lane 3, whose first window holds the NaN
    prim = KD.MaxPoolPrimitive((1, block, 7, 7), (1, block, 3, 3), (3, 3), (2, 2), (0, 0, 0, 0), block=block)
    plain = x.transpose(0, 1, 4, 2, 3).reshape(1, block, 7, 7).astype(np.float64)
    windows = np.stack([plain[:, :, i : i + 5 : 2, j : j + 5 : 2] for i in range(3) for j in range(3)])
    want = np.max(windows, axis=0)  # numpy's max: NaN wins
    for how in ("call", "bind"):
        y = np.full((1, 1, 3, 3, block), 7.0, np.float32)
        prim(x, y) if how == "call" else prim.bind(x, y)()
        got = y.transpose(0, 1, 4, 2, 3).reshape(want.shape).astype(np.float64)
        _assert_ieee_equal(got, want, 0.0, f"blocked max pool ({how})")


def test_blocked_winograd_hands_its_output_bound_down(monkeypatch, rng):
    """A blocked Winograd convolution publishes the max |y| its output transform wrote: the 1x1 convolution
    after it reads nothing; a NaN or an Inf reaching it makes the next one read its input and keep the
    non-finite values as the unoptimized graph has them."""
    from opsnn.graph import Graph, Node, Value, run

    monkeypatch.delenv(KD.CONV_IEEE_ENV, raising=False)
    w1 = (rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32)
    w3 = (rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32)
    g = Graph(
        "winograd_chain",
        inputs=[Value("x", np.float32, (1, 8, 16, 16))],
        outputs=["y"],
        initializers={"w1": w1, "w2": w2, "w3": w3},
        nodes=[
            Node("Conv", ["x", "w1"], ["a"], {"pads": [1, 1, 1, 1]}),
            Node("Relu", ["a"], ["ra"]),
            Node("Conv", ["ra", "w2"], ["b"], {"pads": [1, 1, 1, 1]}),
            Node("Relu", ["b"], ["rb"]),
            Node("Conv", ["rb", "w3"], ["c"]),
            Node("Relu", ["c"], ["y"]),
        ],
    )
    cg = opsnn.compile(g)
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    cg.run({"x": x})
    if "conv_winograd_blocked" not in cg.explain():
        pytest.skip("no blocked Winograd convolution here")
    reads = _counting_max_abs(monkeypatch)
    for case in ("finite", "nan", "inf"):
        xp = x.copy()
        if case != "finite":
            xp[0, 2, 7, 7] = np.nan if case == "nan" else np.inf
        del reads[:]
        got = cg.run({"x": xp})["y"].numpy().astype(np.float64)
        want = run(g, {"x": xp})["y"]
        want = np.asarray(want.numpy() if hasattr(want, "numpy") else want, np.float64)
        _assert_ieee_equal(got, want, 2e-4, f"Winograd chain, {case}")
        if case == "finite":  # X of the first convolution at most (a Winograd first one reads none)
            assert [r.shape for r in reads] in ([], [(1, 8, 16, 16)])
        else:  # no bound past the NaN or Inf: the 1x1 convolution reads its input
            assert not np.isfinite(want).all() and any(r.shape == (1, 16, 16, 16) for r in reads)
