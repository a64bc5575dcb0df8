"""Ops on channel-blocked activations (domain ``opsnn``), produced by the graph engine's
``blocked_layout`` pass (:mod:`opsnn.graph.blocked_layout`): a blocked tensor keeps its logical
(N, C, H, W) shape, its elements are stored in ``nChw<block>c`` order, ``block`` (an attribute of
every op here) 16 or 8, or 0 for nhwc (see :mod:`opsnn.kernels.cpu.blocked`).

``ToBlocked`` / ``FromBlocked`` change the order; ``BlockedConv`` is ``FusedConv`` (``act(conv(X,
W, B) + Z)``) on a blocked or plain X, a blocked Z and a blocked Y; ``BlockedMaxPool`` is
``MaxPool`` on blocked tensors; ``BlockedGlobalAveragePool`` reads a blocked X and writes a plain
(N, C, 1, 1) Y (at 1x1 both orders are the same). Their references unblock, run the plain op's reference and block
the result again, so every kernel is checked against the plain ops' oracles.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, InferShapeError
from ...kernels.cpu import blocked as KB
from ...kernels.cpu import libraries as KL
from ...kernels.cpu import onednn as KD
from ...kernels.cpu import winograd_blocked as KW
from ..autotune import NotPreferred
from ..registry import Attr, Input, TensorMeta, get_op, register_op
from .conv import WINOGRAD_NONFINITE, conv_geometry, nonfinite_weight_rejection
from .fused import _CONV_ATTR_NAMES, _EPILOGUE_ATTRS, _act_code, _conv_attrs, _fused_conv_infer, epilogue_args
from .pool import _pool_attrs, pool_geometry

#: the dtypes blocked activations come in: float32, and bfloat16 (a mixed-precision graph's
#: convolutions; oneDNN's bf16 kernels need AVX512-BF16 for their speed)
_DTS = (_dt.float32, _dt.bfloat16)


_BLOCK_ATTR = Attr("block", "int", 16)


def _block(ctx) -> int:
    b = int(ctx.attrs["block"])
    if b not in KB.LAYOUTS:
        raise InferShapeError(f"{ctx.op.name}: block={b} is not one of {KB.LAYOUTS}", op=ctx.op.name)
    return b


def _check_blockable(ctx, idx: int, what: str) -> None:
    shape, b = ctx.shape(idx), _block(ctx)
    if len(shape) != 4 or not isinstance(shape[1], (int, np.integer)) or shape[1] % KB.channel_block(b, shape[1]):
        raise InferShapeError(
            f"{ctx.op.name}: {what} must be 4-D (N, C, H, W) with C a multiple of {b} "
            f"to be channel-blocked, got shape {tuple(shape)}",
            op=ctx.op.name,
        )


# -- ToBlocked / FromBlocked ---------------------------------------------------------------------------
def _reorder_infer(ctx):
    _check_blockable(ctx, 0, "X")
    return [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))]


ToBlocked = register_op(
    "ToBlocked",
    domain="opsnn",
    category="layout",
    inputs=[Input("X", _DTS)],
    outputs=["Y"],
    attrs=[_BLOCK_ATTR],
    infer=_reorder_infer,
    reference=lambda ins, attrs: KB.blocked_reference(ins[0], int(attrs["block"])),
    doc="X (N, C, H, W) -> the same tensor in nChw<block>c element order (C a multiple of block)",
)
FromBlocked = register_op(
    "FromBlocked",
    domain="opsnn",
    category="layout",
    inputs=[Input("X", _DTS)],
    outputs=["Y"],
    attrs=[_BLOCK_ATTR],
    infer=_reorder_infer,
    reference=lambda ins, attrs: KB.plain_reference(ins[0], int(attrs["block"])),
    doc="X in nChw<block>c element order -> plain NCHW (C a multiple of block)",
)


@ToBlocked.kernel("to_blocked_numba", dtypes=_DTS, priority=10)
def _to_blocked(ins, outs, attrs, plan, ws):
    KB.to_blocked(ins[0], outs[0], int(attrs["block"]))


@FromBlocked.kernel("from_blocked_numba", dtypes=_DTS, priority=10)
def _from_blocked(ins, outs, attrs, plan, ws):
    KB.from_blocked(ins[0], outs[0], int(attrs["block"]))


# -- BlockedConv --------------------------------------------------------------------------------------
def _blocked_conv_infer(ctx):
    if int(ctx.attrs["src_blocked"]):
        _check_blockable(ctx, 0, "X")
    dt = ctx.dtype(0)
    for i, what in ((1, "W"), (2, "B"), (3, "Z")):
        if ctx.has(i) and ctx.dtype(i) != dt:
            raise DTypeError(
                f"BlockedConv: {what} is {_dt.name(ctx.dtype(i))} but X is {_dt.name(dt)}; "
                f"{what} must be {_dt.name(dt)} too",
                op="BlockedConv",
            )
    outs = _fused_conv_infer(ctx)
    b = _block(ctx)
    if len(outs[0].shape) != 4 or outs[0].shape[1] % KB.channel_block(b, outs[0].shape[1]):
        raise InferShapeError(
            f"BlockedConv: the output must be 4-D with a multiple of {b} channels, got {tuple(outs[0].shape)}",
            op="BlockedConv",
        )
    return outs


def _blocked_conv_ref(ins, attrs):
    b = int(attrs["block"])
    x = KB.plain_reference(ins[0], b) if int(attrs["src_blocked"]) else ins[0]
    plain = list(ins)
    plain[0] = x
    if len(ins) > 3 and ins[3] is not None:
        plain[3] = KB.plain_reference(ins[3], b)
    fused = get_op("FusedConv", "opsnn")
    y = fused.reference(plain, fused.bind_attrs({k: v for k, v in attrs.items() if k not in ("src_blocked", "block")}))
    return KB.blocked_reference(y, b)


def _blocked_conv_applies(ctx):
    why = KD.unavailable()
    if why is not None:
        return why
    if ctx.value(1) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if int(ctx.attrs.get("group") or 1) != 1:
        return "group 1 only"
    if len(ctx.shape(1)) != 4:
        return "2-D convolution only"
    return True


class _OneDnnPlan:
    def __init__(self, prim, what: str):
        self.prim = prim
        self.what = what

    def describe(self) -> str:
        return f"oneDNN {self.prim.impl} {self.what}"


def _planned_geometry(ctx):
    """(X's shape, the constant weight, the conv geometry, Y's shape) of a BlockedConv at prepare."""
    xs, w = tuple(ctx.shape(0)), np.asarray(ctx.value(1))
    g = conv_geometry("BlockedConv", xs, w.shape, _conv_attrs(ctx.attrs))
    return xs, w, g, (xs[0], w.shape[0]) + tuple(g.out)


def _constant_max_abs(ctx, i: int):
    """max|input i| when it is a constant known at prepare (a graph initializer; NaN if it holds one), else None."""
    v = ctx.value(i) if ctx.has(i) else None
    if v is None:
        return None
    return float(np.abs(np.asarray(v).astype(np.float64)).max(initial=0.0))  # a NaN gives NaN


def _blocked_conv_plan(ctx):
    xs, w, g, ys = _planned_geometry(ctx)
    src_blocked, b = bool(int(ctx.attrs["src_blocked"])), _block(ctx)
    prim = KD.ConvPrimitive(
        xs,
        w,
        ys,
        g.s,
        (g.pb[0], g.pb[1], g.pe[0], g.pe[1]),
        g.d,
        block=b,
        src_blocked=src_blocked,
        has_bias=ctx.has(2),
        residual=ctx.has(3),
        act=_act_code("BlockedConv", ctx.attrs),
        alpha=float(ctx.attrs["activation_alpha"]),
        beta=float(ctx.attrs["activation_beta"]),
        bias_bound=_constant_max_abs(ctx, 2),
    )
    parts = ["bias"] * ctx.has(2) + ["residual add"] * ctx.has(3) + [ctx.attrs["activation"] or ""]
    epi = " + ".join(p for p in parts if p)
    lay = KB.layout_name(b)
    dt = "" if ctx.dtype(0) == _dt.float32 else f"{_dt.name(ctx.dtype(0))} "
    return _OneDnnPlan(
        prim,
        f"{dt}conv {lay if src_blocked else 'NCHW'} -> {lay}, weight reordered at prepare"
        + (f", {epi} as post-ops" if epi else ""),
    )


BlockedConv = register_op(
    "BlockedConv",
    domain="opsnn",
    category="conv",
    inputs=[Input("X", _DTS), Input("W", _DTS), Input("B", _DTS, optional=True), Input("Z", _DTS, optional=True)],
    outputs=["Y"],
    attrs=[Attr(n, "any", None) for n in _CONV_ATTR_NAMES]
    + _EPILOGUE_ATTRS
    + [Attr("src_blocked", "int", 1), _BLOCK_ATTR],
    infer=_blocked_conv_infer,
    reference=_blocked_conv_ref,
    flops=lambda ctx: get_op("FusedConv", "opsnn").flops(ctx),
    doc="FusedConv on channel-blocked (nChw<block>c) tensors: X blocked (src_blocked=1) or plain NCHW, Z and Y blocked",
)


def _bind_conv(ins, outs, attrs, plan, ws):
    return plan.prim.bind(*epilogue_args(ins, outs), ws=ws)


@BlockedConv.kernel(
    "conv_onednn",
    dtypes=_DTS,
    priority=10,
    applies=_blocked_conv_applies,
    plan=_blocked_conv_plan,
    workspace=lambda ctx, plan: plan.prim.workspace_bytes,
    bind=_bind_conv,
    doc="oneDNN's JIT direct convolution (brgconv / jit:avx512_core / jit:avx2) with bias, "
    "residual add and activation as post-ops",
    nonfinite="float32 and bfloat16 keep NaN and Inf as a direct convolution: oneDNN's Relu, Clip or Gelu "
    "post-op (Relu's max gives 0 for NaN) runs only where a per-call bound (max|X| * max sum|W| + max|B| + "
    "max|Z| in float32, oneDNN's accumulator) rules out a NaN or Inf pre-activation; past it a primitive "
    "without the post-op runs and opsnn's epilogue activates. max|X| and max|Z| come from the convolution, "
    "Winograd or max pool that wrote them in a compiled plan, else from a vectorized read (bfloat16 as its "
    "bits); max|B| of a constant bias from prepare. OPSNN_CONV_IEEE=0 skips the check (NaN -> 0 under Relu)",
)
def _blocked_conv(ins, outs, attrs, plan, ws):
    plan.prim(*epilogue_args(ins, outs), ws=ws)


#: Winograd on blocked tensors is preferred to oneDNN's direct convolution from this many 4x4
#: output tiles per image (docs/performance.md, "Winograd on blocked tensors")
WINOGRAD_MIN_TILES = 16


def _blocked_winograd_applies(ctx):
    why = (
        _blocked_conv_applies(ctx)
        if ctx.dtype(0) == _dt.float32
        else (f"float32 only ({_dt.name(ctx.dtype(0))} runs on oneDNN's native kernels)")
    )
    if why is not True:
        return why
    gemms = KL.blocked_winograd_gemms()
    if isinstance(gemms, str):
        return gemms
    ws = tuple(ctx.shape(1))
    if ws[2:] != (3, 3):
        return f"3x3 kernels only, got {ws[2]}x{ws[3]}"
    g = conv_geometry("BlockedConv", tuple(ctx.shape(0)), ws, _conv_attrs(ctx.attrs))
    if tuple(g.s) != (1, 1) or tuple(g.d) != (1, 1):
        return f"stride 1 and dilation 1 only, got strides {tuple(g.s)}, dilations {tuple(g.d)}"
    if not int(ctx.attrs["src_blocked"]):
        return "a blocked X only (the first conv of a chain reads NCHW: left to oneDNN)"
    if _block(ctx) == KB.NHWC:
        return "nChw8c / nChw16c only: on nhwc oneDNN's brgemm convolution runs 3x3 layers (faster in the model)"
    if _act_code("BlockedConv", ctx.attrs) not in (0, 1):
        return f"no activation or Relu only, got {ctx.attrs['activation']}"
    why = nonfinite_weight_rejection(ctx)
    if why is not None:
        return why
    tiles = -(-g.out[0] // KW.TILE) * -(-g.out[1] // KW.TILE)
    if tiles < WINOGRAD_MIN_TILES:
        return NotPreferred(
            f"{tiles} 4x4 output tiles per image (< {WINOGRAD_MIN_TILES}): oneDNN's direct convolution is as fast"
        )
    if KW.weight_bytes(ws[1], ws[0]) > KW.MAX_WEIGHT_BYTES:
        return NotPreferred(
            f"the transformed weight would take {KW.weight_bytes(ws[1], ws[0]) >> 20} MiB "
            f"(> {KW.MAX_WEIGHT_BYTES >> 20}), streamed from memory on every call"
        )
    return True


def _blocked_winograd_plan(ctx):
    xs, w, g, ys = _planned_geometry(ctx)
    return KW.plan(xs, w, ys, g.pb, _block(ctx), _act_code("BlockedConv", ctx.attrs) == 1)


def _bind_winograd(ins, outs, attrs, plan, ws):
    return KW.bind(*epilogue_args(ins, outs), plan, ws)


@BlockedConv.kernel(
    "conv_winograd_blocked",
    dtypes=(_dt.float32,),
    priority=20,
    applies=_blocked_winograd_applies,
    plan=_blocked_winograd_plan,
    workspace=lambda ctx, plan: plan.workspace_bytes(),
    bind=_bind_winograd,
    cold_alternative="conv_onednn",
    doc="Winograd F(4x4,3x3) on nChw<block>c: numba transforms with the bias, residual add and "
    "Relu in the output transform, the 36 GEMMs in one oneDNN batched matmul",
    nonfinite=WINOGRAD_NONFINITE,
)
def _blocked_winograd(ins, outs, attrs, plan, ws):
    KW.conv(*epilogue_args(ins, outs), plan, ws)


# -- BlockedMaxPool ------------------------------------------------------------------------------------
def _plain_pool_attrs(attrs: dict) -> dict:
    return {k: v for k, v in attrs.items() if v is not None and k != "block"}


def _blocked_pool_infer(ctx):
    _check_blockable(ctx, 0, "X")
    g = pool_geometry("BlockedMaxPool", tuple(ctx.shape(0)), ctx.attrs)
    if any(d != 1 for d in g.dilations):
        raise InferShapeError(f"BlockedMaxPool: dilations must be 1, got {g.dilations}", op="BlockedMaxPool")
    return [TensorMeta(tuple(ctx.shape(0)[:2]) + tuple(g.out), ctx.dtype(0))]


def _blocked_pool_ref(ins, attrs):
    mp = get_op("MaxPool")
    b = int(attrs["block"])
    y = mp.reference([KB.plain_reference(ins[0], b)], mp.bind_attrs(_plain_pool_attrs(attrs)))
    y = y[0] if isinstance(y, (list, tuple)) else y
    return KB.blocked_reference(y, b)


def _blocked_pool_plan(ctx):
    xs = tuple(ctx.shape(0))
    g = pool_geometry("BlockedMaxPool", xs, ctx.attrs)
    # the end pads that give exactly the output size (ceil mode adds a partial window's worth)
    pe = tuple((g.out[i] - 1) * g.strides[i] + g.kernel[i] - xs[2 + i] - g.pads_begin[i] for i in range(2))
    prim = KD.MaxPoolPrimitive(
        xs,
        xs[:2] + tuple(g.out),
        g.kernel,
        g.strides,
        (g.pads_begin[0], g.pads_begin[1], pe[0], pe[1]),
        block=_block(ctx),
        dtype=ctx.dtype(0),
    )
    lay = KB.layout_name(_block(ctx))
    return _OneDnnPlan(prim, f"max pooling {lay} -> {lay}")


BlockedMaxPool = register_op(
    "BlockedMaxPool",
    domain="opsnn",
    category="pool",
    inputs=[Input("X", _DTS)],
    outputs=["Y"],
    attrs=_pool_attrs() + [_BLOCK_ATTR],
    infer=_blocked_pool_infer,
    reference=_blocked_pool_ref,
    doc="MaxPool (2-D, no dilation, no indices) on channel-blocked tensors",
)


@BlockedMaxPool.kernel(
    "max_pool_onednn",
    dtypes=_DTS,
    priority=10,
    applies=lambda ctx: KD.unavailable() or True,
    plan=_blocked_pool_plan,
    bind=lambda ins, outs, attrs, plan, ws: plan.prim.bind(ins[0], outs[0]),
    doc="oneDNN's JIT max pooling on nChw<block>c",
    nonfinite="NaN in a window gives NaN: oneDNN's max drops it, so X is read for NaN (one vectorized pass, skipped "
    "where the convolution writing X hands a finite bound) and the windows holding one are set to NaN",
)
def _blocked_pool(ins, outs, attrs, plan, ws):
    plan.prim(ins[0], outs[0])


def _blocked_gap_infer(ctx):
    _check_blockable(ctx, 0, "X")
    return [TensorMeta(tuple(ctx.shape(0)[:2]) + (1, 1), ctx.dtype(0))]


def _blocked_gap_ref(ins, attrs):
    gap = get_op("GlobalAveragePool")
    y = gap.reference([KB.plain_reference(ins[0], int(attrs["block"]))], gap.bind_attrs({}))
    return y[0] if isinstance(y, (list, tuple)) else y


BlockedGlobalAveragePool = register_op(
    "BlockedGlobalAveragePool",
    domain="opsnn",
    category="pool",
    inputs=[Input("X", (_dt.float32,))],
    outputs=["Y"],
    attrs=[_BLOCK_ATTR],
    infer=_blocked_gap_infer,
    reference=_blocked_gap_ref,
    doc="GlobalAveragePool of a channel-blocked (N, C, H, W) float32 tensor; Y (N, C, 1, 1) is plain "
    "(its nChw<block>c order is the plain order), so no FromBlocked follows it",
)


@BlockedGlobalAveragePool.kernel(
    "global_avg_pool_blocked_numba",
    dtypes=(_dt.float32,),
    priority=10,
    plan=lambda ctx: int(np.prod(ctx.shape(0))) >= KB.GAP_PARALLEL_MIN,
    cold_alternative="global_avg_pool_blocked_numpy",
    doc="one pass over X's nChw<block>c order, a block of channels per task, float64 sums",
)
def _blocked_gap(ins, outs, attrs, plan, ws):
    KB.global_avg_pool(ins[0], outs[0], int(attrs["block"]), plan)


@BlockedGlobalAveragePool.kernel(
    "global_avg_pool_blocked_numpy",
    dtypes=(_dt.float32,),
    priority=5,
    doc="numpy float64 sums over H*W of X's nChw<block>c order: nothing to compile, the first run's kernel "
    "while global_avg_pool_blocked_numba compiles in the background (ops/tiering.py)",
)
def _blocked_gap_numpy(ins, outs, attrs, plan, ws):
    KB.global_avg_pool_numpy(ins[0], outs[0], int(attrs["block"]))
