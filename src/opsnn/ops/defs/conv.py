"""Convolution ops: Conv, ConvTranspose, ConvInteger, QLinearConv (1-D/2-D/3-D) — records,
kernel registration and torch-style entry points (conv1d/2d/3d, conv_transpose1d/2d/3d).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.ones((1, 3, 8, 8), np.float32))
>>> w = opsnn.tensor(np.ones((4, 3, 3, 3), np.float32))
>>> opsnn.ops.conv2d(x, w, stride=2, padding=1).shape
(1, 4, 4, 4)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, InferShapeError, ParamInvalidError
from ...kernels.cpu import conv as K
from ...kernels.cpu import libraries as KL
from ...kernels.cpu import mkl as KM
from ...kernels.cpu import onednn as KD
from ...kernels.cpu import winograd as WG
from ..api import api
from ..autotune import NotPreferred
from ..registry import Attr, InferContext, Input, TensorMeta, get_op, register_op, select_kernel

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
_Q8 = (_dt.uint8, _dt.int8)
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

_CONV_ATTRS = [
    Attr("auto_pad", "string", "NOTSET"),
    Attr("dilations", "ints", ()),
    Attr("group", "int", 1),
    Attr("kernel_shape", "ints", ()),
    Attr("pads", "ints", ()),
    Attr("strides", "ints", ()),
]


# -- geometry -----------------------------------------------------------------------------------
class Geometry(NamedTuple):
    """Per spatial dim: kernel, strides, dilations, pads at the begin / end, output size."""

    k: tuple
    s: tuple
    d: tuple
    pb: tuple
    pe: tuple
    out: tuple


def _auto_pad(op: str, attrs: dict) -> str:
    v = attrs.get("auto_pad") or "NOTSET"
    v = (v.decode() if isinstance(v, bytes) else str(v)).upper()
    if v not in _AUTO_PADS:
        raise ParamInvalidError(f"{op}: attribute 'auto_pad' must be one of {_AUTO_PADS}, got {v!r}", op=op)
    return v


def _ints(op: str, attrs: dict, name: str, n: int, default: int, minimum: int | None) -> tuple:
    v = attrs.get(name)
    if v is None or (hasattr(v, "__len__") and len(v) == 0):
        return (default,) * n
    if isinstance(v, (tuple, list)) and all(type(x) is int for x in v):
        v = tuple(v)  # the usual form: numpy's conversion is most of this function's time otherwise
    else:
        v = tuple(int(x) for x in np.asarray(v).reshape(-1))
    if len(v) != n:
        raise ParamInvalidError(f"{op}: attribute {name!r} needs {n} values (one per spatial dim), got {v}", op=op)
    if minimum is not None and any(x < minimum for x in v):
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ParamInvalidError(f"{op}: attribute {name!r} must be {what}, got {v}", op=op)
    return v


def _fail(op: str, msg: str):
    raise InferShapeError(f"{op}: {msg}", op=op)


def _common(op: str, xs: tuple, ws: tuple, attrs: dict):
    if len(xs) < 3:
        _fail(op, f"input X must be at least 3-D (N, C, D1, ...), got shape {tuple(xs)}")
    if len(ws) != len(xs):
        _fail(op, f"weight W must have the rank of X ({len(xs)}-D), got W {tuple(ws)} for X {tuple(xs)}")
    nd = len(xs) - 2
    if nd > 3:
        _fail(op, f"supports 1-D, 2-D and 3-D convolution, got {nd} spatial dims (X {tuple(xs)})")
    k = tuple(int(v) for v in ws[2:])
    ks = _ints(op, attrs, "kernel_shape", nd, 0, None)
    if attrs.get("kernel_shape") is not None and len(attrs.get("kernel_shape")) and ks != k:
        _fail(op, f"attribute kernel_shape {ks} does not match the weight's spatial dims {k}")
    s = _ints(op, attrs, "strides", nd, 1, 1)
    d = _ints(op, attrs, "dilations", nd, 1, 1)
    g = int(attrs.get("group", 1))
    if g < 1:
        raise ParamInvalidError(f"{op}: attribute 'group' must be >= 1, got {g}", op=op)
    return nd, k, s, d, g


def _explicit_pads(op: str, attrs: dict, nd: int) -> tuple:
    p = _ints(op, attrs, "pads", 2 * nd, 0, 0)
    return p[:nd], p[nd:]


def conv_geometry(op: str, xs: tuple, ws: tuple, attrs: dict) -> Geometry:
    """Output size and effective pads of a forward conv (ONNX Conv's rules, auto_pad included)."""
    nd, k, s, d, g = _common(op, xs, ws, attrs)
    auto = _auto_pad(op, attrs)
    in_sp = tuple(int(v) for v in xs[2:])
    eff = tuple((k[i] - 1) * d[i] + 1 for i in range(nd))
    if auto == "VALID":
        pb = pe = (0,) * nd
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe = [], []
        for i in range(nd):
            target = -(-in_sp[i] // s[i])
            total = max(0, (target - 1) * s[i] + eff[i] - in_sp[i])
            head = total // 2 if auto == "SAME_UPPER" else (total + 1) // 2
            pb.append(head)
            pe.append(total - head)
        pb, pe = tuple(pb), tuple(pe)
    else:
        pb, pe = _explicit_pads(op, attrs, nd)
    out = []
    for i in range(nd):
        padded = in_sp[i] + pb[i] + pe[i]
        if padded < eff[i]:
            _fail(
                op,
                f"kernel (dilated size {eff[i]} along spatial dim {i}) is larger than the padded input "
                f"({in_sp[i]} + pads {pb[i]}+{pe[i]} = {padded}); X {tuple(xs)}, W {tuple(ws)}",
            )
        out.append((padded - eff[i]) // s[i] + 1)
    return Geometry(k, s, d, pb, pe, tuple(out))


def conv_transpose_geometry(op: str, xs: tuple, ws: tuple, attrs: dict) -> Geometry:
    """Output size and pads of ConvTranspose (output_shape / auto_pad generate the pads)."""
    nd, k, s, d, g = _common(op, xs, ws, attrs)
    auto = _auto_pad(op, attrs)
    in_sp = tuple(int(v) for v in xs[2:])
    opad = _ints(op, attrs, "output_padding", nd, 0, 0)
    full = tuple(s[i] * (in_sp[i] - 1) + opad[i] + (k[i] - 1) * d[i] + 1 for i in range(nd))
    oshape = attrs.get("output_shape")
    oshape = tuple(int(v) for v in np.asarray(oshape).reshape(-1)) if oshape is not None and len(oshape) else None
    if oshape is not None:
        if len(oshape) == nd + 2:
            oshape = oshape[2:]
        if len(oshape) != nd:
            raise ParamInvalidError(f"{op}: attribute 'output_shape' needs {nd} spatial sizes, got {oshape}", op=op)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        oshape = tuple(in_sp[i] * s[i] for i in range(nd))
    if oshape is not None:
        pb, pe = [], []
        for i in range(nd):
            total = full[i] - oshape[i]
            # a larger-than-natural output grows at the end, like output_padding (onnxruntime
            # and torch's output_size agree; the spec's formula is silent on negative totals)
            head = 0 if total < 0 else total // 2 if auto == "SAME_UPPER" else total - total // 2
            pb.append(head)
            pe.append(total - head)
        pb, pe = tuple(pb), tuple(pe)
    elif auto == "VALID":
        pb = pe = (0,) * nd
    else:
        pb, pe = _explicit_pads(op, attrs, nd)
    out = tuple(full[i] - pb[i] - pe[i] for i in range(nd))
    if any(o <= 0 for o in out):
        _fail(
            op,
            f"output spatial size {out} is not positive (X {tuple(xs)}, W {tuple(ws)}, strides {s}, "
            f"pads {pb + pe}, output_padding {opad})",
        )
    return Geometry(k, s, d, pb, pe, out)


def _same_dtype(ctx, *idx) -> np.dtype:
    dt = ctx.dtype(idx[0])
    for i in idx[1:]:
        if ctx.has(i) and ctx.dtype(i) != dt:
            a, b = ctx.op.inputs[idx[0]].name, ctx.op.inputs[i].name
            raise DTypeError(
                f"{ctx.op.name}: inputs {a!r} ({_dt.name(dt)}) and {b!r} ({_dt.name(ctx.dtype(i))}) "
                "must have the same dtype",
                op=ctx.op.name,
            )
    return dt


def _check_channels(ctx, xs, ws, g: int) -> int:
    """Conv channel rules; returns M (output channels)."""
    c, m = xs[1], ws[0]
    if c != ws[1] * g:
        ctx.fail(
            f"input channels mismatch: X {tuple(xs)} has C={c} but W {tuple(ws)} expects "
            f"W.shape[1] * group = {ws[1]} * {g} = {ws[1] * g}"
        )
    if m % g:
        ctx.fail(f"output channels M={m} (W.shape[0]) are not divisible by group={g}")
    return m


def _check_bias(ctx, i: int, m: int) -> None:
    if ctx.has(i) and tuple(ctx.shape(i)) != (m,):
        ctx.fail(f"bias {ctx.op.inputs[i].name!r} must have shape ({m},) (output channels), got {ctx.shape(i)}")


def _compute_itemsize(dt) -> int:
    return _dt.compute_dtype(dt).itemsize


# -- references (numpy; independent of the kernels' im2col/col2im) --------------------------------
def _conv_core(x: np.ndarray, w: np.ndarray, geo: Geometry, g: int) -> np.ndarray:
    """Direct convolution: pad, then one einsum per kernel offset and group."""
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // g, m // g
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(geo.pb, geo.pe)))
    y = np.zeros((n, m) + geo.out, dtype=x.dtype)
    if y.size == 0:
        return y
    for gi in range(g):
        xg = xp[:, gi * cg : (gi + 1) * cg]
        for kidx in itertools.product(*(range(v) for v in geo.k)):
            sl = tuple(
                slice(kidx[i] * geo.d[i], kidx[i] * geo.d[i] + (geo.out[i] - 1) * geo.s[i] + 1, geo.s[i])
                for i in range(len(geo.k))
            )
            wk = w[(slice(gi * mg, (gi + 1) * mg), slice(None)) + kidx]
            y[:, gi * mg : (gi + 1) * mg] += np.einsum("nc...,mc->nm...", xg[(Ellipsis,) + sl], wk)
    return y


def _ref_dtype(dt):
    return np.int64 if dt.kind in "iu" else (np.float64 if dt == np.float64 else np.float32)


def _conv_ref(ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    geo = conv_geometry("Conv", x.shape, w.shape, attrs)
    ct = _ref_dtype(x.dtype)
    y = _conv_core(x.astype(ct), w.astype(ct), geo, int(attrs["group"]))
    if b is not None:
        y += b.astype(ct).reshape((1, -1) + (1,) * len(geo.k))
    return y.astype(x.dtype)


def _conv_transpose_ref(ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    geo = conv_transpose_geometry("ConvTranspose", x.shape, w.shape, attrs)
    g = int(attrs["group"])
    ct = _ref_dtype(x.dtype)
    x, w = x.astype(ct), w.astype(ct)
    n, c = x.shape[:2]
    cg, mg = c // g, w.shape[1]
    nd = len(geo.k)
    in_sp = x.shape[2:]
    # scatter every (input position, kernel offset) product into an uncropped buffer,
    # shifted so negative pads (output_shape larger than natural) stay in range
    shift = [max(0, -geo.pb[i]) for i in range(nd)]
    span = [max((in_sp[i] - 1) * geo.s[i] + (geo.k[i] - 1) * geo.d[i] + 1, geo.pb[i] + geo.out[i]) for i in range(nd)]
    buf = np.zeros((n, mg * g) + tuple(shift[i] + span[i] for i in range(nd)), dtype=ct)
    if x.size:
        for gi in range(g):
            xg = x[:, gi * cg : (gi + 1) * cg]
            for kidx in itertools.product(*(range(v) for v in geo.k)):
                sl = tuple(
                    slice(
                        shift[i] + kidx[i] * geo.d[i],
                        shift[i] + kidx[i] * geo.d[i] + (in_sp[i] - 1) * geo.s[i] + 1,
                        geo.s[i],
                    )
                    for i in range(nd)
                )
                wk = w[(slice(gi * cg, (gi + 1) * cg), slice(None)) + kidx]
                buf[(slice(None), slice(gi * mg, (gi + 1) * mg)) + sl] += np.einsum("nc...,cm->nm...", xg, wk)
    crop = tuple(slice(shift[i] + geo.pb[i], shift[i] + geo.pb[i] + geo.out[i]) for i in range(nd))
    y = buf[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.astype(ct).reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(y).astype(ins[0].dtype)


# -- Conv ---------------------------------------------------------------------------------------
def _conv_infer(ctx):
    dt = _same_dtype(ctx, 0, 1, 2)
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    m = _check_channels(ctx, xs, ws, int(ctx.attrs["group"]))
    _check_bias(ctx, 2, m)
    return [TensorMeta((xs[0], m) + geo.out, dt)]


def _conv_flops(ctx) -> int:
    return 2 * math.prod(ctx.outputs[0].shape) * math.prod(ctx.shape(1)[1:])


def _conv_planner(kind: str | None, itemsize_of=_compute_itemsize, w_index: int = 1):
    def plan(ctx):
        xs, ws = ctx.shape(0), ctx.shape(w_index)
        geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
        return K.conv_plan(
            xs,
            ws,
            int(ctx.attrs["group"]),
            geo.k,
            geo.s,
            geo.d,
            geo.pb,
            geo.pe,
            geo.out,
            itemsize_of(ctx.dtype(0)),
            kind,
        )

    return plan


def _workspace(ctx, plan) -> int:
    return plan.workspace_bytes


def _is_1x1(ctx):
    geo = conv_geometry(ctx.op.name, ctx.shape(0), ctx.shape(1), ctx.attrs)
    if all(v == 1 for v in geo.k) and all(v == 1 for v in geo.s) and not any(geo.pb) and not any(geo.pe):
        return True
    return "needs a 1x1 kernel with stride 1 and no padding"


def _is_depthwise(ctx):
    xs, ws, g = ctx.shape(0), ctx.shape(1), int(ctx.attrs["group"])
    if len(xs) in (3, 4) and g > 1 and g == xs[1] and ws[1] == 1:
        return True
    return "needs a 1-D/2-D conv with group == input channels (depthwise)"


def _is_2d(ctx):
    return True if len(ctx.shape(0)) in (3, 4) else "handles 1-D and 2-D convolution only"


#: im2col builds its columns a band of output rows at a time (``K.BAND_BYTES``); when even one
#: output row's columns take more than this many bytes the conv goes to the direct kernel
#: (no column buffer), which is slower but needs no workspace
IM2COL_MAX_BYTES = 512 << 20
#: a banded im2col (columns larger than ``K.BAND_BYTES``) with at most this many output channels
#: per group is a thin, memory-bound GEMM per band: the direct kernel is as fast on one core and
#: much faster on busy cores (it does not alternate numba and BLAS thread pools band after band;
#: figures: docs/performance.md, "Convolution algorithms")
IM2COL_THIN_M = 8
#: Winograd is chosen from these sizes up: below them im2col + one large GEMM is as fast or
#: faster (this and the thresholds below: docs/performance.md, "Convolution algorithms")
WINOGRAD_MIN_CHANNELS = 8
WINOGRAD_MIN_TILES = 32
#: dilated 3x3 convs run as dilation**2 dense Winograd convs on phase sub-images; each phase
#: pays copies and its own 36 GEMMs, so they need wide layers and >= 16 tiles per phase
WINOGRAD_DILATED_MIN_CHANNELS = 128
#: a weight not known at prepare (eager calls) is transformed on every call (36 x M x C values):
#: that pays off from this many output tiles
WINOGRAD_MIN_TILES_UNPACKED = 40
#: F(4x4) vs F(2x2): F(4x4)'s 36 GEMMs do fewer multiplies but are thinner, its transforms cost
#: more per output and its 4x4 tiles overhang small images (14x14: 16x16 computed). It is
#: preferred only with min(C, M) x tiles >= WINOGRAD_F4_MIN_WORK, or WINOGRAD_F4_MIN_WORK_NARROW on
#: images less than WINOGRAD_F4_MIN_TILE_COLS tiles wide (output width < 25), and, below 64
#: channels, with >= WINOGRAD_F4_MIN_TILES_FEW_CH tiles
WINOGRAD_F4_MIN_TILE_COLS = 7
WINOGRAD_F4_MIN_WORK = 6144
WINOGRAD_F4_MIN_WORK_NARROW = 16384
WINOGRAD_F4_MIN_TILES_FEW_CH = 400
#: F(2x2, 3x3) vs im2col: below this much GEMM work (tiles of 2x2 x C x M) the conv takes a few
#: tens of microseconds and the transforms' fixed costs eat the saving
WINOGRAD_F2_MIN_WORK = 1 << 15
#: F(2x2) with a weight transformed on every call (16 x M x C values) needs this many 2x2 tiles
WINOGRAD_F2_MIN_TILES_UNPACKED = 100
#: F(2x2) with a pre-transformed weight of more than WINOGRAD_F2_WIDE_BYTES (16 x M x C values:
#: 1.8x the weight itself) needs this many 2x2 tiles: with fewer, the products stream that
#: weight from memory for a few columns each and im2col's smaller weight wins (smaller
#: transformed weights stay in L2)
WINOGRAD_F2_MIN_TILES_WIDE = 12
WINOGRAD_F2_WIDE_BYTES = 2 << 20


def _row_col_bytes(ctx) -> int:
    """Bytes of the columns of one output row (im2col's smallest band)."""
    geo = conv_geometry(ctx.op.name, ctx.shape(0), ctx.shape(1), ctx.attrs)
    return ctx.shape(0)[1] * math.prod(geo.k) * geo.out[-1] * _compute_itemsize(ctx.dtype(0))


def _im2col2d_applies(ctx):
    if len(ctx.shape(0)) not in (3, 4):
        return "handles 1-D and 2-D convolution only"
    nbytes = _row_col_bytes(ctx)
    if nbytes > IM2COL_MAX_BYTES:
        return (
            f"the column buffer of even one output row would take {nbytes / 2**20:.0f} MiB "
            f"(> IM2COL_MAX_BYTES = {IM2COL_MAX_BYTES >> 20} MiB)"
        )
    geo = conv_geometry(ctx.op.name, ctx.shape(0), ctx.shape(1), ctx.attrs)
    mg = int(ctx.shape(1)[0]) // int(ctx.attrs["group"])
    whole = nbytes * geo.out[0] if len(geo.out) == 2 else nbytes
    if mg <= IM2COL_THIN_M and whole > K.BAND_BYTES:
        return NotPreferred(
            f"{mg} output channels per group: the {whole / 2**20:.0f} MiB of columns would go "
            f"through thin GEMMs band by band (> K.BAND_BYTES); the direct kernel is faster"
        )
    return True


def winograd_rejection(xs, ws, attrs, op: str = "Conv", dilated: bool = False) -> str | None:
    """Why Winograd F(4x4, 3x3) (``dilated``: its phase-split form) is not used for these
    shapes; None when it is. A :class:`NotPreferred` answer means correct but slower."""
    what = "dilated Winograd F(4x4,3x3)" if dilated else "Winograd F(4x4,3x3)"
    if len(xs) != 4:
        return f"{what} handles 2-D convolution only"
    geo = conv_geometry(op, xs, ws, attrs)
    g = int(attrs.get("group", 1))
    d_ok = (geo.d != (1, 1)) if dilated else (geo.d == (1, 1))
    if geo.k != (3, 3) or geo.s != (1, 1) or g != 1 or not d_ok:
        return (
            f"{what} needs a 3x3 kernel, stride 1, {'dilation > 1' if dilated else 'dilation 1'}, group 1; "
            f"got kernel {'x'.join(map(str, geo.k))}, stride {geo.s}, dilation {geo.d}, group {g}"
        )
    c, m = int(xs[1]), int(ws[0])
    need = WINOGRAD_DILATED_MIN_CHANNELS if dilated else WINOGRAD_MIN_CHANNELS
    if min(c, m) < need:
        return NotPreferred(f"C={c}, M={m}: below {need} channels the tile transforms cost more than the GEMM saves")
    # tiles of 4x4 outputs per image; a dilated conv's phases are each ceil(out / d) large
    oh, ow = (-(-geo.out[0] // geo.d[0]), -(-geo.out[1] // geo.d[1])) if dilated else geo.out
    tiles = int(xs[0]) * -(-oh // WG.TILE) * -(-ow // WG.TILE)
    if tiles < WINOGRAD_MIN_TILES:
        per = " per phase" if dilated else ""
        return NotPreferred(
            f"only {tiles} output tiles of 4x4{per} (< {WINOGRAD_MIN_TILES}): 36 thin GEMMs lose "
            "to im2col's single GEMM"
        )
    return None


def _unpacked_rejection(ctx, dilated: bool):
    """NotPreferred when the weight is transformed per call and too few tiles amortize it."""
    if ctx.value(1) is not None:
        return True
    xs = ctx.shape(0)
    geo = conv_geometry(ctx.op.name, xs, ctx.shape(1), ctx.attrs)
    d = geo.d if dilated else (1, 1)
    ph, pw = -(-geo.out[0] // d[0]), -(-geo.out[1] // d[1])  # a phase's output size (the whole one at d = 1)
    tiles = int(xs[0]) * d[0] * d[1] * -(-ph // WG.TILE) * -(-pw // WG.TILE)
    if tiles < WINOGRAD_MIN_TILES_UNPACKED:
        return NotPreferred(
            f"the weight is not known at prepare, so it is transformed on every call; {tiles} output "
            f"tiles of 4x4 (< {WINOGRAD_MIN_TILES_UNPACKED}) do not amortize that"
        )
    return True


def f2_reason(xs, ws, attrs, op: str = "Conv") -> str | None:
    """Why F(2x2, 3x3) is expected to beat F(4x4, 3x3) on these (Winograd-able) shapes; None
    when F(4x4) is preferred."""
    geo = conv_geometry(op, xs, ws, attrs)
    ch = min(int(xs[1]), int(ws[0]))
    tw = -(-geo.out[1] // WG.TILE)
    tiles = int(xs[0]) * -(-geo.out[0] // WG.TILE) * tw
    if tw < WINOGRAD_F4_MIN_TILE_COLS and ch * tiles < WINOGRAD_F4_MIN_WORK_NARROW:
        return (
            f"F(2x2,3x3) is faster here: output {geo.out[1]} wide is {tw} tiles of 4 (< "
            f"{WINOGRAD_F4_MIN_TILE_COLS}) and min(C, M) x tiles = {ch} x {tiles} < "
            f"{WINOGRAD_F4_MIN_WORK_NARROW}: thin GEMMs, tiles overhanging the image"
        )
    if ch * tiles < WINOGRAD_F4_MIN_WORK:
        return f"F(2x2,3x3) is faster here: min(C, M) x tiles = {ch} x {tiles} < {WINOGRAD_F4_MIN_WORK}: 36 small GEMMs"
    if ch < 64 and tiles < WINOGRAD_F4_MIN_TILES_FEW_CH:
        return (
            f"F(2x2,3x3) is faster here: {ch} channels and {tiles} tiles of 4x4 (< "
            f"{WINOGRAD_F4_MIN_TILES_FEW_CH}): 36 small GEMMs"
        )
    return None


def _f2_rejection(ctx) -> str | None:
    """Why F(2x2, 3x3) does not run this Conv (None: it applies and is preferred to im2col)."""
    why = winograd_f2_rejection(ctx.shape(0), ctx.shape(1), ctx.attrs, ctx.op.name)
    if why is not None:
        return why
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    tiles = int(xs[0]) * -(-geo.out[0] // WG.TILE2) * -(-geo.out[1] // WG.TILE2)
    if ctx.value(1) is None and tiles < WINOGRAD_F2_MIN_TILES_UNPACKED:
        return NotPreferred(
            f"the weight is not known at prepare, so it is transformed on every call; {tiles} output "
            f"tiles of 2x2 (< {WINOGRAD_F2_MIN_TILES_UNPACKED}) do not amortize that"
        )
    return None


#: the record's ``nonfinite`` of the Winograd kernels (kernels/cpu/winograd.py, winograd_blocked.py)
WINOGRAD_NONFINITE = (
    "as a direct convolution: a tile's transform mixes its inputs (one NaN would spread over the "
    "tile, an Inf become Inf - Inf = NaN), so a check folded into the input transform finds the "
    "tiles whose input holds Inf or NaN and those are computed again by the direct sum; a constant "
    "weight holding Inf or NaN is not taken (the selector moves on), one given per call makes every "
    "tile direct"
)


def nonfinite_weight_rejection(ctx) -> str | None:
    """Why a Winograd kernel does not take a constant weight holding Inf or NaN (None: it does)."""
    w = ctx.value(1)
    if w is None or WG.all_finite(w):
        return None
    return (
        "the constant weight holds Inf or NaN: its Winograd transform would spread them over every tile "
        "(every tile would be computed directly)"
    )


def with_nonfinite_weight(ctx, why):
    """``why`` (a shape rejection, NotPreferred, or None), unless it is no hard rejection and the
    constant weight holds Inf or NaN: then that (a hard one; the weight scan only once the shapes fit)."""
    if why is None or isinstance(why, NotPreferred):
        return nonfinite_weight_rejection(ctx) or why
    return why


def _winograd_applies(ctx):
    why = with_nonfinite_weight(ctx, winograd_rejection(ctx.shape(0), ctx.shape(1), ctx.attrs, ctx.op.name))
    if why is not None:
        return why
    why = _unpacked_rejection(ctx, False)
    if why is not True:
        return why
    f2 = f2_reason(ctx.shape(0), ctx.shape(1), ctx.attrs, ctx.op.name)
    return True if f2 is None else NotPreferred(f2)


def _winograd_plan(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    # a weight known at prepare time (graph initializer) is transformed once, here
    return WG.winograd_plan(xs, int(ws[0]), geo.pb, geo.out, _compute_itemsize(ctx.dtype(0)), ctx.value(1))


def _winograd_kernel(ins, outs, attrs, plan, ws):
    WG.conv_winograd(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan, ws)


def winograd_f2_rejection(xs, ws, attrs, op: str = "Conv") -> str | None:
    """Why Winograd F(2x2, 3x3) is not used for these shapes (weights pre-packed); None when
    it is. A :class:`NotPreferred` answer means correct but slower (than im2col)."""
    what = "Winograd F(2x2,3x3)"
    if len(xs) != 4:
        return f"{what} handles 2-D convolution only"
    geo = conv_geometry(op, xs, ws, attrs)
    g = int(attrs.get("group", 1))
    if geo.k != (3, 3) or geo.s != (1, 1) or g != 1 or geo.d != (1, 1):
        return (
            f"{what} needs a 3x3 kernel, stride 1, dilation 1, group 1; got kernel "
            f"{'x'.join(map(str, geo.k))}, stride {geo.s}, dilation {geo.d}, group {g}"
        )
    c, m = int(xs[1]), int(ws[0])
    if min(c, m) < WINOGRAD_MIN_CHANNELS:
        return NotPreferred(
            f"C={c}, M={m}: below {WINOGRAD_MIN_CHANNELS} channels the tile transforms cost more than the GEMM saves"
        )
    tiles = int(xs[0]) * -(-geo.out[0] // WG.TILE2) * -(-geo.out[1] // WG.TILE2)
    if tiles * c * m < WINOGRAD_F2_MIN_WORK:
        return NotPreferred(
            f"{tiles} tiles of 2x2 x C={c} x M={m} < {WINOGRAD_F2_MIN_WORK}: too little work for "
            "the transforms' fixed costs"
        )
    wbytes = 16 * c * m * 4
    if wbytes > WINOGRAD_F2_WIDE_BYTES and tiles < WINOGRAD_F2_MIN_TILES_WIDE:
        return NotPreferred(
            f"{tiles} tiles of 2x2 (< {WINOGRAD_F2_MIN_TILES_WIDE}) for a transformed weight of "
            f"{wbytes / 2**20:.1f} MiB: streaming it for so few columns loses to im2col"
        )
    return None


def _winograd_f2_applies(ctx):
    why = with_nonfinite_weight(ctx, _f2_rejection(ctx))
    return True if why is None else why


def _winograd_f2_plan(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    return WG.winograd_plan(
        xs, int(ws[0]), geo.pb, geo.out, _compute_itemsize(ctx.dtype(0)), ctx.value(1), tile=WG.TILE2
    )


def _winograd_dilated_applies(ctx):
    why = with_nonfinite_weight(
        ctx, winograd_rejection(ctx.shape(0), ctx.shape(1), ctx.attrs, ctx.op.name, dilated=True)
    )
    return _unpacked_rejection(ctx, True) if why is None else why


def _winograd_dilated_plan(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    return WG.dilated_plan(xs, int(ws[0]), geo.pb, geo.out, geo.d, _compute_itemsize(ctx.dtype(0)), ctx.value(1))


def _winograd_dilated_kernel(ins, outs, attrs, plan, ws):
    WG.conv_winograd_dilated(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan, ws)


Conv = register_op(
    "Conv",
    category="conv",
    inputs=[Input("X", FLOAT), Input("W", FLOAT), Input("B", FLOAT, optional=True)],
    outputs=["Y"],
    attrs=_CONV_ATTRS,
    infer=_conv_infer,
    reference=_conv_ref,
    flops=_conv_flops,
    doc="N-d convolution (ONNX Conv): X (N, C, D...) * W (M, C/group, k...) + B.",
)


class PackedConv(NamedTuple):
    """A GEMM-kind conv plan (1x1, im2col) plus its constant weight packed by MKL (``packed``)."""

    conv: K.ConvPlan
    packed: object

    @property
    def kind(self) -> str:  # FusedConv moves the bias of GEMM kinds into its epilogue
        return self.conv.kind

    @property
    def workspace_bytes(self) -> int:
        return self.conv.workspace_bytes

    def describe(self) -> str:
        return f"{self.conv.describe()}; {self.packed.describe()}"


def _mkl_packed_rejection(ctx) -> str | None:
    choice = KL.conv_gemms()
    if choice.library != "mkl":
        return choice.reason
    if ctx.value(1) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if int(ctx.attrs["group"]) != 1:
        return "group 1 only"
    if ctx.dtype(0) != _dt.float32:
        return f"float32 only, got {_dt.name(ctx.dtype(0))}"
    if 0 in ctx.shape(1)[:2]:
        return "empty weight"
    return None


#: conv2d_im2col_tasks: weights up to this many bytes (each task's GEMM reads the whole weight
#: from its core's cache; few input channels, e.g. a stem); larger weights run faster on the
#: banded im2col (figures: docs/performance.md, "Convolution algorithms")
TASKS_MAX_WEIGHT_BYTES = 256 << 10


def _tasks_applies(ctx):
    why = KM.unavailable()
    if why is not None:
        return why
    if ctx.dtype(0) != _dt.float32:
        return f"float32 only, got {_dt.name(ctx.dtype(0))}"
    if int(ctx.attrs["group"]) != 1:
        return "group 1 only"
    if len(ctx.shape(0)) not in (3, 4):
        return "handles 1-D and 2-D convolution only"
    ws = ctx.shape(1)
    if 0 in ws[:2]:
        return "empty weight"
    nbytes = 4 * math.prod(ws)
    if nbytes > TASKS_MAX_WEIGHT_BYTES:
        return NotPreferred(
            f"a {nbytes >> 10} KB weight (> TASKS_MAX_WEIGHT_BYTES = {TASKS_MAX_WEIGHT_BYTES >> 10} "
            "KB): every task would stream it; the banded GEMM splits it instead"
        )
    geo = conv_geometry(ctx.op.name, ctx.shape(0), ws, ctx.attrs)
    if math.prod(geo.out) < 2 * K.TASK_MIN_COLS:
        return NotPreferred(f"{math.prod(geo.out)} output positions: too few for a task per thread")
    return _im2col2d_applies(ctx)


def _packed_applies(base):
    # MKL's packed weight wherever MKL is available (libraries.conv_gemms; docs/kernel-libraries.md)
    def applies(ctx):  # a hard rejection first: the base may answer NotPreferred (runnable)
        return _mkl_packed_rejection(ctx) or base(ctx)

    return applies


def _packed_planner(kind: str):
    def plan(ctx):
        p = _conv_planner(kind)(ctx)
        w = ctx.value(1)
        # the GEMM's columns: a band of output rows (im2col) or the whole image (1x1)
        cols = p.band * math.prod(p.out_sp[1:]) if p.kind == "im2col2d" else math.prod(p.out_sp)
        return PackedConv(p, KM.pack_left(w.reshape(w.shape[0], -1), cols))

    return plan


def _packed_conv(ins, outs, attrs, plan, ws):
    K.conv_forward(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan.conv, ws, plan.packed)


# -- bfloat16 on MKL's bf16 GEMM --------------------------------------------------------------------------
def bf16_rejection(ctx) -> str | None:
    """None when the bfloat16 MKL conv (``conv_mkl_bf16``) can run ``ctx``, else why not."""
    why = KM.bf16_unavailable()
    if why is not None:
        return why
    if ctx.dtype(0) != _dt.bfloat16 or ctx.dtype(1) != _dt.bfloat16:
        return f"bfloat16 input and weight only, got {_dt.name(ctx.dtype(0))} and {_dt.name(ctx.dtype(1))}"
    if ctx.value(1) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if int(ctx.attrs["group"]) != 1:
        return "group 1 only"
    if 0 in ctx.shape(1)[:2]:
        return "empty weight"
    if _is_1x1(ctx) is True:
        return None
    ok = _im2col2d_applies(ctx)
    return None if ok is True else ok


class Bf16Conv(NamedTuple):
    """A 1x1 or im2col plan over bfloat16 columns, the weight's bits as a (M, C*kh*kw) uint16
    matrix (read by MKL as it is) and the bias (when constant) widened to float32 once."""

    conv: K.ConvPlan
    w2: np.ndarray
    bias: np.ndarray | None

    @property
    def kind(self) -> str:
        return self.conv.kind

    @property
    def workspace_bytes(self) -> int:
        return K.bf16_workspace_bytes(self.conv)

    def describe(self) -> str:
        return (
            f"{self.conv.describe().replace('then BLAS', 'then MKL bf16 GEMM')} on the bfloat16 weight as "
            "stored; fp32 accumulation and epilogue, one rounding to bfloat16"
        )


def bf16_conv_plan(ctx) -> Bf16Conv:
    kind = "gemm1x1" if _is_1x1(ctx) is True else "im2col2d"
    p = _conv_planner(kind, itemsize_of=lambda dt: 2)(ctx)
    if kind == "im2col2d":  # the float32 accumulator of a band stays within K.BAND_BYTES too
        inner = math.prod(p.out_sp[1:])
        rows = max(1, K.BAND_BYTES // max(4 * p.m * inner, 1))
        if p.band > rows:
            p = dataclasses.replace(p, band=rows, col_shape=p.col_shape[:2] + (rows * inner,))
    w = np.asarray(ctx.value(1))
    b = ctx.value(2) if ctx.has(2) else None
    bias = None if b is None else np.asarray(b).astype(np.float32)
    return Bf16Conv(p, np.ascontiguousarray(w.view(np.uint16).reshape(w.shape[0], -1)), bias)


def bf16_bias(ins, plan: Bf16Conv):
    """The float32 bias: the plan's (constant) or this call's input widened."""
    if plan.bias is not None or len(ins) < 3 or ins[2] is None:
        return plan.bias
    return ins[2].astype(np.float32)


def _bf16_conv(ins, outs, attrs, plan, ws):
    K.conv_forward_bf16(ins[0], outs[0], plan.conv, ws, plan.w2, bf16_bias(ins, plan))


Conv.kernel(
    "conv_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=36,
    applies=lambda ctx: bf16_rejection(ctx) or True,
    plan=bf16_conv_plan,
    workspace=_workspace,
    doc="bfloat16 1x1 / im2col conv with a constant weight: MKL's bf16 GEMM (cblas_gemm_bf16bf16f32: "
    "AMX / AVX512-BF16) on the weight as stored, fp32 accumulation, one rounding",
)(_bf16_conv)
Conv.kernel(
    "conv_1x1_mkl_packed",
    dtypes=(_dt.float32,),
    priority=35,
    applies=_packed_applies(_is_1x1),
    plan=_packed_planner("gemm1x1"),
    doc="1x1 stride-1 unpadded, constant weight: the weight packed once at "
    "prepare by Intel MKL (cblas_sgemm_pack), one cblas_sgemm_compute per image",
)(_packed_conv)
Conv.kernel(
    "conv_1x1_gemm",
    dtypes=_F32_64,
    priority=30,
    applies=_is_1x1,
    plan=_conv_planner("gemm1x1"),
    workspace=_workspace,
    doc="1x1 stride-1 unpadded: the input is the column matrix; one GEMM per image and group, no workspace",
)(K.conv)
Conv.kernel(
    "conv2d_depthwise",
    dtypes=_F32_64,
    priority=40,
    applies=_is_depthwise,
    plan=_conv_planner("depthwise2d"),
    workspace=_workspace,
    doc="direct numba loop for group == C (depthwise, any channel multiplier); no workspace",
)(K.conv)
Conv.kernel(
    "conv2d_winograd",
    dtypes=_F32_64,
    priority=25,
    applies=_winograd_applies,
    plan=_winograd_plan,
    workspace=_workspace,
    doc="Winograd F(4x4,3x3): numba tile transforms + 36 GEMMs (MKL; oneDNN's "
    "batched brgemm for chunks of <= 128 tiles); constant weights pre-transformed at prepare",
    nonfinite=WINOGRAD_NONFINITE,
)(_winograd_kernel)
Conv.kernel(
    "conv2d_winograd_dilated",
    dtypes=_F32_64,
    priority=25,
    applies=_winograd_dilated_applies,
    plan=_winograd_dilated_plan,
    workspace=_workspace,
    doc="dilated 3x3 stride 1: dilation**2 dense "
    "Winograd F(4x4,3x3) convs on phase sub-images (no zero-inserted input, no column buffer)",
    nonfinite=WINOGRAD_NONFINITE,
)(_winograd_dilated_kernel)
Conv.kernel(
    "conv2d_winograd_f2",
    dtypes=_F32_64,
    priority=24,
    applies=_winograd_f2_applies,
    plan=_winograd_f2_plan,
    workspace=_workspace,
    doc="Winograd F(2x2,3x3): numba tile transforms + 16 "
    "GEMMs (as F(4x4)); constant weights pre-transformed at prepare",
    nonfinite=WINOGRAD_NONFINITE,
)(_winograd_kernel)
Conv.kernel(
    "conv2d_im2col",
    dtypes=_F32_64,
    priority=20,
    applies=_im2col2d_applies,
    plan=_conv_planner("im2col2d"),
    workspace=_workspace,
    doc="numba parallel im2col into the "
    "workspace + BLAS GEMM per group, in bands of output rows (workspace <= BAND_BYTES unless one row "
    "needs more; 1-D runs as H=1)",
)(K.conv)
Conv.kernel(
    "conv2d_im2col_mkl_packed",
    dtypes=(_dt.float32,),
    priority=21,
    applies=_packed_applies(_im2col2d_applies),
    plan=_packed_planner("im2col2d"),
    workspace=_workspace,
    doc="conv2d_im2col with the constant weight packed once at prepare by Intel MKL; each band's GEMM "
    "reads the packed panel",
)(_packed_conv)
Conv.kernel(
    "conv2d_im2col_tasks",
    dtypes=(_dt.float32,),
    priority=22,
    applies=_tasks_applies,
    plan=_conv_planner("im2col_tasks"),
    workspace=_workspace,
    doc="2-D, small weight (few input channels): one parallel region, a task per band of output rows "
    "builds its columns in its thread's buffer and multiplies them on single-threaded MKL while they "
    "are in cache",
)(K.conv)
Conv.kernel(
    "conv2d_direct",
    dtypes=_F32_64,
    priority=15,
    applies=_is_2d,
    plan=_conv_planner("direct2d"),
    workspace=_workspace,
    doc="direct numba loop, no column buffer (strided input split into column "
    "phases a band of rows at a time; dilation read in place)",
)(K.conv)
Conv.kernel(
    "conv_nd_im2col",
    dtypes=_F32_64,
    priority=10,
    plan=_conv_planner("im2col_nd"),
    workspace=_workspace,
    doc="numpy-vectorized im2col (one strided copy per kernel offset) + "
    "BLAS GEMM, in bands along the first spatial dim; any rank",
)(K.conv)


# -- oneDNN on plain tensors -------------------------------------------------------------------------
def _plain_onednn_args(ctx) -> tuple:
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    ys = (xs[0], ws[0]) + geo.out
    return xs, ws, ys, geo.s, geo.pb + geo.pe, geo.d, int(ctx.attrs["group"])


def _plain_onednn_applies(ctx):
    if ctx.dtype(0) == _dt.bfloat16 and ctx.dtype(1) != _dt.bfloat16:
        return f"bfloat16 input and weight only, got {_dt.name(ctx.dtype(0))} and {_dt.name(ctx.dtype(1))}"
    c = KL.conv_forward_plain(*_plain_onednn_args(ctx), ctx.dtype(0), constant_weight=ctx.value(1) is not None)
    if not c.runnable:
        return c.reason
    if c.preferred and ctx.dtype(0) == _dt.bfloat16 and bf16_rejection(ctx) is None:
        # a constant bf16 weight: conv_mkl_bf16 reads it as stored, no reorder per call
        return NotPreferred("conv_mkl_bf16 runs this constant bfloat16 weight as stored")
    return True if c.preferred else NotPreferred(c.reason)


def _plain_onednn_plan(ctx):
    dt = _dt.bfloat16 if ctx.dtype(0) == _dt.bfloat16 else np.float32
    c = KL.conv_forward_plain(*_plain_onednn_args(ctx), ctx.dtype(0), constant_weight=ctx.value(1) is not None)
    return KD.plain_conv(*_plain_onednn_args(ctx), ctx.has(2), dt, formats=c.formats)


def _plain_onednn_kernel(ins, outs, attrs, plan, ws):
    plan.run(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], ws)


def _rows_applies(ctx):
    xs, ws, ys = _plain_onednn_args(ctx)[:3]
    if KL.conv_forward_by_rows(xs, ws, ys, int(ctx.attrs["group"]), ctx.dtype(0), ctx.value(1) is not None):
        return True
    isa = KL.platform().isa
    if isa != "avx2":
        return f"AVX2 only (the ISA in force is {isa}: oneDNN's forward is as fast there)"
    return "libraries.conv_forward_by_rows: one group, wider than 1x1, 256+ outputs, small planes, weight at run time"


def _rows_plan(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    return K.rows_plan("forward", xs, (xs[0], ws[0]) + geo.out, geo.k, geo.s, geo.d, geo.pb)


def _rows_kernel(ins, outs, attrs, plan, ws):
    b = ins[2] if len(ins) > 2 and ins[2] is not None else None
    K.conv_rows(np.ascontiguousarray(ins[0]), np.ascontiguousarray(ins[1]), b, outs[0], plan, ws)


Conv.kernel(
    "conv2d_rows",
    dtypes=(_dt.float32,),
    priority=39,
    applies=_rows_applies,
    plan=_rows_plan,
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="2-D, one group, small output planes, weight given at run time, AVX2 (libraries.conv_forward_by_rows): "
    "the windows of all images as rows (one numba pass) times W^T in one product (libraries.conv_rows_product), "
    "then into NCHW with the bias",
)(_rows_kernel)
Conv.kernel(
    "conv_onednn_plain",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=38,
    applies=_plain_onednn_applies,
    plan=_plain_onednn_plan,
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="oneDNN's forward convolution on plain float32 or bfloat16 tensors (bf16: native bf16 products, "
    "float32 accumulation, one rounding): X and W reordered into the layouts it chooses and Y out of them "
    "at the edges (workspace; nhwc activations where libraries.plain_conv_formats says), the bias added by "
    "the primitive, no post-ops; chosen where "
    "libraries.conv_forward_plain prefers it (bfloat16 with AVX512-BF16; float32 where the weight is not "
    "constant; OPSNN_CONV_ONEDNN=1|0 overrides for float32)",
    nonfinite="oneDNN's JIT code skips the taps that read padding, where the definition multiplies the "
    "padding's zeros: an Inf or NaN weight tap that reads only padding gives NaN there by the definition "
    "and nothing here",
)(_plain_onednn_kernel)


def _spatial(v, nd: int, name: str, fn: str) -> tuple:
    if isinstance(v, (bool, np.bool_)):
        raise ParamInvalidError(f"{fn}: {name} must be an int or {nd} ints, got {v!r}")
    if isinstance(v, (int, np.integer)):
        return (int(v),) * nd
    try:
        t = tuple(int(x) for x in v)
    except TypeError:
        raise ParamInvalidError(f"{fn}: {name} must be an int or {nd} ints, got {v!r}") from None
    if len(t) != nd:
        raise ParamInvalidError(f"{fn}: {name} must be an int or {nd} ints, got {v!r}")
    return t


def _check_rank(fn: str, nd: int, **tensors) -> None:
    for name, t in tensors.items():
        r = getattr(t, "ndim", None)
        if r is None:
            r = np.ndim(t)
        if r != nd + 2:
            raise ParamInvalidError(
                f"{fn}: {name} must be {nd + 2}-D (N, C, {'D, ' * (nd - 1)}...)"
                f", got a {r}-D tensor of shape {tuple(getattr(t, 'shape', np.shape(t)))}"
            )


def _conv_attrs(fn: str, nd: int, stride, padding, dilation, groups) -> dict:
    attrs = {
        "strides": list(_spatial(stride, nd, "stride", fn)),
        "dilations": list(_spatial(dilation, nd, "dilation", fn)),
        "group": int(groups),
    }
    if isinstance(padding, (str, bytes)):
        p = padding.decode() if isinstance(padding, bytes) else padding
        if p.lower() == "same":
            attrs["auto_pad"] = "SAME_UPPER"
        elif p.lower() == "valid":
            attrs["auto_pad"] = "VALID"
        else:
            raise ParamInvalidError(f"{fn}: padding must be an int, {nd} ints, 'same' or 'valid', got {padding!r}")
    else:
        p = _spatial(padding, nd, "padding", fn)
        attrs["pads"] = list(p) * 2
    return attrs


def _make_conv(nd: int):
    fn = f"conv{nd}d"

    def translate(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        _check_rank(fn, nd, input=x, weight=w)
        return [x, w, b], _conv_attrs(fn, nd, stride, padding, dilation, groups)

    translate.__name__ = fn
    translate.__doc__ = (
        f"{nd}-D convolution (torch.nn.functional.{fn} argument names; ONNX Conv record).\n\n"
        "``stride``/``padding``/``dilation``: an int or one per spatial dim; ``padding`` may also "
        "be ``'same'`` (ONNX SAME_UPPER: extra padding at the end, output = ceil(in / stride)) "
        "or ``'valid'``."
    )
    return api(fn, "Conv")(translate)


conv1d = _make_conv(1)
conv2d = _make_conv(2)
conv3d = _make_conv(3)


# -- ConvTranspose --------------------------------------------------------------------------------
def _conv_transpose_infer(ctx):
    dt = _same_dtype(ctx, 0, 1, 2)
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_transpose_geometry(ctx.op.name, xs, ws, ctx.attrs)
    g = int(ctx.attrs["group"])
    if xs[1] != ws[0]:
        ctx.fail(
            f"input channels mismatch: X {tuple(xs)} has C={xs[1]} but W {tuple(ws)} has W.shape[0]={ws[0]} "
            "(ConvTranspose weights are (C, M/group, k...))"
        )
    if xs[1] % g:
        ctx.fail(f"input channels C={xs[1]} are not divisible by group={g}")
    m = ws[1] * g
    _check_bias(ctx, 2, m)
    return [TensorMeta((xs[0], m) + geo.out, dt)]


def _conv_transpose_plan(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_transpose_geometry(ctx.op.name, xs, ws, ctx.attrs)
    return K.conv_transpose_plan(
        xs, ws, int(ctx.attrs["group"]), geo.k, geo.s, geo.d, geo.pb, geo.out, _compute_itemsize(ctx.dtype(0))
    )


ConvTranspose = register_op(
    "ConvTranspose",
    category="conv",
    inputs=[Input("X", FLOAT), Input("W", FLOAT), Input("B", FLOAT, optional=True)],
    outputs=["Y"],
    attrs=_CONV_ATTRS + [Attr("output_padding", "ints", ()), Attr("output_shape", "ints", ())],
    infer=_conv_transpose_infer,
    reference=_conv_transpose_ref,
    flops=lambda ctx: 2 * math.prod(ctx.shape(0)) * math.prod(ctx.shape(1)[1:]),
    doc="Transposed (fractionally strided) convolution, ONNX ConvTranspose; W is (C, M/group, k...).",
)
ConvTranspose.kernel(
    "conv_transpose_col2im",
    dtypes=_F32_64,
    priority=20,
    plan=_conv_transpose_plan,
    workspace=_workspace,
    doc="BLAS GEMM W^T @ x into the workspace, then col2im (numba "
    "gather over output rows for 1-D/2-D; strided numpy adds for 3-D)",
)(K.conv_transpose)


def _make_conv_transpose(nd: int):
    fn = f"conv_transpose{nd}d"

    def translate(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        _check_rank(fn, nd, input=x, weight=w)
        attrs = _conv_attrs(fn, nd, stride, padding, dilation, groups)
        if "auto_pad" in attrs:
            raise ParamInvalidError(f"{fn}: padding must be an int or {nd} ints, got {padding!r}")
        attrs["output_padding"] = list(_spatial(output_padding, nd, "output_padding", fn))
        return [x, w, b], attrs

    translate.__name__ = fn
    translate.__doc__ = (
        f"{nd}-D transposed convolution (torch.nn.functional.{fn} argument names and order; "
        "ONNX ConvTranspose record). ``weight`` is (C_in, C_out / groups, k...)."
    )
    return api(fn, "ConvTranspose")(translate)


conv_transpose1d = _make_conv_transpose(1)
conv_transpose2d = _make_conv_transpose(2)
conv_transpose3d = _make_conv_transpose(3)


# -- convolution gradients (training) ------------------------------------------------------------
_BACKWARD_ATTRS = [
    Attr("dilations", "ints", ()),
    Attr("group", "int", 1),
    Attr("pads", "ints", ()),
    Attr("strides", "ints", ()),
]


def _shape_attr(ctx, name: str, rank: int) -> tuple:
    v = ctx.attrs.get(name)
    try:
        shape = tuple(int(d) for d in np.asarray(v).reshape(-1)) if v is not None else ()
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != rank or any(d < 0 for d in shape):
        raise ParamInvalidError(
            f"{ctx.op.name}: attribute {name!r} must be the forward's {rank} non-negative dims "
            f"(the rank of the output gradient), got {v!r}",
            op=ctx.op.name,
        )
    return shape


def _backward_shapes(ctx) -> tuple:
    """(X, W, dY) shapes and the forward geometry of a ConvBackwardData / ConvBackwardWeight /
    ConvBackward node, checked against each other (dY must be the forward's output)."""
    name = ctx.op.name
    if name == "ConvBackwardData":
        ys, ws = ctx.shape(0), ctx.shape(1)
        xs = _shape_attr(ctx, "input_shape", len(ys))
    elif name == "ConvBackwardWeight":
        xs, ys = ctx.shape(0), ctx.shape(1)
        ws = _shape_attr(ctx, "weight_shape", len(ys))
    else:
        ys, xs, ws = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(ys) != len(xs):
        ctx.fail(f"output gradient dY {tuple(ys)} must have the rank of X {tuple(xs)}")
    geo = conv_geometry(name, xs, ws, ctx.attrs)
    m = _check_channels(ctx, xs, ws, int(ctx.attrs["group"]))
    want = (xs[0], m) + geo.out
    if tuple(ys) != want:
        ctx.fail(
            f"output gradient dY must have the forward's output shape {want} (X {tuple(xs)}, W {tuple(ws)}), "
            f"got {tuple(ys)}"
        )
    return tuple(xs), tuple(ws), tuple(ys), geo


def _bwd_data_infer(ctx):
    dt = _same_dtype(ctx, 0, 1)
    xs, _, _, _ = _backward_shapes(ctx)
    return [TensorMeta(xs, dt)]


def _bwd_weight_infer(ctx):
    dt = _same_dtype(ctx, 0, 1)
    _, ws, _, _ = _backward_shapes(ctx)
    return [TensorMeta(ws, dt)]


def _window_slices(geo: Geometry, kidx: tuple) -> tuple:
    """Per spatial dim: the padded input positions kernel offset ``kidx`` reads, one per output."""
    return tuple(
        slice(kidx[i] * geo.d[i], kidx[i] * geo.d[i] + (geo.out[i] - 1) * geo.s[i] + 1, geo.s[i])
        for i in range(len(geo.k))
    )


def conv_grad_data_reference(dy: np.ndarray, w: np.ndarray, x_shape: tuple, geo: Geometry, g: int) -> np.ndarray:
    """dX in float64: every dY entry times each weight tap, added to the input position that tap read."""
    dy, w = dy.astype(np.float64), w.astype(np.float64)
    n, c = x_shape[:2]
    m = w.shape[0]
    cg, mg = c // g, m // g
    nd = len(geo.k)
    padded = tuple(x_shape[2 + i] + geo.pb[i] + geo.pe[i] for i in range(nd))
    dxp = np.zeros((n, c) + padded)
    for gi in range(g):
        dxg = dxp[:, gi * cg : (gi + 1) * cg]
        dyg = dy[:, gi * mg : (gi + 1) * mg]
        for kidx in itertools.product(*(range(v) for v in geo.k)):
            wk = w[(slice(gi * mg, (gi + 1) * mg), slice(None)) + kidx]
            dxg[(Ellipsis,) + _window_slices(geo, kidx)] += np.einsum("nm...,mc->nc...", dyg, wk)
    crop = tuple(slice(geo.pb[i], geo.pb[i] + x_shape[2 + i]) for i in range(nd))
    return np.ascontiguousarray(dxp[(slice(None), slice(None)) + crop])


def conv_grad_weight_reference(x: np.ndarray, dy: np.ndarray, w_shape: tuple, geo: Geometry, g: int) -> np.ndarray:
    """dW in float64: per tap, the input positions it read times dY, summed over images and outputs."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    c, m = x.shape[1], int(w_shape[0])
    cg, mg = c // g, m // g
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(geo.pb, geo.pe)))
    dw = np.zeros(tuple(w_shape))
    for gi in range(g):
        xg = xp[:, gi * cg : (gi + 1) * cg]
        dyg = dy[:, gi * mg : (gi + 1) * mg]
        for kidx in itertools.product(*(range(v) for v in geo.k)):
            win = xg[(Ellipsis,) + _window_slices(geo, kidx)]
            summed = [0] + list(range(2, dy.ndim))
            dw[(slice(gi * mg, (gi + 1) * mg), slice(None)) + kidx] = np.tensordot(dyg, win, (summed, summed))
    return dw


def _bwd_data_ref(ins, attrs):
    dy, w = ins[0], ins[1]
    xs = tuple(int(v) for v in attrs["input_shape"])
    geo = conv_geometry("ConvBackwardData", xs, w.shape, attrs)
    return conv_grad_data_reference(dy, w, xs, geo, int(attrs["group"])).astype(dy.dtype)


def _bwd_weight_ref(ins, attrs):
    x, dy = ins[0], ins[1]
    ws = tuple(int(v) for v in attrs["weight_shape"])
    geo = conv_geometry("ConvBackwardWeight", x.shape, ws, attrs)
    return conv_grad_weight_reference(x, dy, ws, geo, int(attrs["group"])).astype(x.dtype)


def _bwd_choice(ctx, kind: str) -> KL.BackwardChoice:
    xs, ws, ys, geo = _backward_shapes(ctx)
    g = int(ctx.attrs["group"])
    return KL.conv_backward(kind, xs, ws, ys, geo.s, geo.pb + geo.pe, geo.d, g, ctx.dtype(0))


def _bwd_applies(kind: str, kernel: str):
    """Applies where :func:`libraries.conv_backward` picks ``kernel`` for this gradient, else says why not."""

    def applies(ctx):
        c = _bwd_choice(ctx, kind)
        return True if c.kernel == kernel else c.reason

    return applies


def _bwd_weight_matmul_plan(ctx):
    xs, _ws, ys, geo = _backward_shapes(ctx)
    return K.rows_plan("weights", xs, ys, geo.k, geo.s, geo.d, geo.pb, ctx.dtype(0))


def _bwd_weight_matmul(ins, outs, attrs, plan, ws):
    K.conv_weight_grad_rows(np.ascontiguousarray(ins[0]), np.ascontiguousarray(ins[1]), outs[0], plan, ws)


def _bwd_data_matmul_plan(ctx):
    xs, _ws, ys, geo = _backward_shapes(ctx)
    return K.rows_plan("data", xs, ys, geo.k, geo.s, geo.d, geo.pb)


def _bwd_data_matmul(ins, outs, attrs, plan, ws):
    K.conv_data_grad_rows(np.ascontiguousarray(ins[0]), np.ascontiguousarray(ins[1]), outs[0], plan, ws)


def _bwd_onednn_plan(kind: str):
    def plan(ctx):
        c = _bwd_choice(ctx, kind)
        xs, ws, ys, geo = _backward_shapes(ctx)
        dtype = _dt.bfloat16 if ctx.dtype(0) == _dt.bfloat16 else np.float32
        return KD.conv_backward(
            kind, xs, ws, ys, geo.s, geo.pb + geo.pe, geo.d, int(ctx.attrs["group"]), dtype, c.formats, c.compute
        )

    return plan


def _bwd_onednn_kernel(ins, outs, attrs, plan, ws):
    plan.run(ins[0], ins[1], outs[0], ws)


def _bwd_data_gemm_plan(ctx):
    xs, ws, ys, geo = _backward_shapes(ctx)
    return K.conv_transpose_plan(
        ys, ws, int(ctx.attrs["group"]), geo.k, geo.s, geo.d, geo.pb, tuple(xs[2:]), _compute_itemsize(ctx.dtype(0))
    )


def _bwd_data_gemm(ins, outs, attrs, plan, ws):
    K.conv_transpose(ins[:2], outs, attrs, plan, ws)


def _bwd_weight_gemm_plan(ctx):
    xs, ws, ys, geo = _backward_shapes(ctx)
    g = int(ctx.attrs["group"])
    return K.conv_backward_weight_plan(
        xs, ws, g, geo.k, geo.s, geo.d, geo.pb, geo.pe, geo.out, _compute_itemsize(ctx.dtype(0))
    )


def _bwd_weight_gemm(ins, outs, attrs, plan, ws):
    K.conv_backward_weight(ins[0], ins[1], outs[0], plan, ws)


def _bwd_flops(ctx) -> int:
    _, ws, ys, _ = _backward_shapes(ctx)
    return 2 * math.prod(ys) * math.prod(ws[1:])


ConvBackwardData = register_op(
    "ConvBackwardData",
    domain="opsnn",
    category="conv",
    inputs=[Input("dY", FLOAT), Input("W", FLOAT)],
    outputs=["dX"],
    attrs=_BACKWARD_ATTRS + [Attr("input_shape", "ints")],
    infer=_bwd_data_infer,
    reference=_bwd_data_ref,
    flops=_bwd_flops,
    doc="Conv's input gradient dX (shape ``input_shape``) from dY and W, the forward's strides, "
    "explicit pads (begin..., end...), dilations and group (aclnnConvolutionBackward's gradInput).",
)
ConvBackwardData.kernel(
    "conv_backward_data_onednn",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=30,
    applies=_bwd_applies("data", "conv_backward_data_onednn"),
    plan=_bwd_onednn_plan("data"),
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="oneDNN's convolution backward-data primitive (forward_training hint), built at prepare and "
    "kept per shape; asked for layouts of its choosing, plain tensors reordered at the edges in the "
    "workspace (libraries.conv_backward)",
)(_bwd_onednn_kernel)
ConvBackwardData.kernel(
    "conv_backward_data_matmul",
    dtypes=(_dt.float32,),
    priority=35,
    applies=_bwd_applies("data", "conv_backward_data_matmul"),
    plan=_bwd_data_matmul_plan,
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="2-D, one group, small output planes (libraries.data_gradient_by_rows): dY as rows times W in one "
    "product (libraries.conv_rows_product: oneDNN's brgemm matmul or the GEMM library) into the windows' rows, "
    "each row added back at its window (one numba pass, parallel over (image, channel) planes)",
)(_bwd_data_matmul)
ConvBackwardData.kernel(
    "conv_backward_data_col2im",
    dtypes=_F32_64,
    priority=20,
    plan=_bwd_data_gemm_plan,
    workspace=_workspace,
    doc="GEMM W_g^T @ dY_g per image (BLAS) into the workspace, then col2im into dX (ConvTranspose's kernel)",
)(_bwd_data_gemm)

ConvBackwardWeight = register_op(
    "ConvBackwardWeight",
    domain="opsnn",
    category="conv",
    inputs=[Input("X", FLOAT), Input("dY", FLOAT)],
    outputs=["dW"],
    attrs=_BACKWARD_ATTRS + [Attr("weight_shape", "ints")],
    infer=_bwd_weight_infer,
    reference=_bwd_weight_ref,
    flops=_bwd_flops,
    doc="Conv's weight gradient dW (shape ``weight_shape``) from X and dY, the forward's strides, "
    "explicit pads, dilations and group (aclnnConvolutionBackward's gradWeight; the bias gradient is "
    "dY summed over all but the channel dim).",
)
ConvBackwardWeight.kernel(
    "conv_backward_weight_onednn",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=30,
    applies=_bwd_applies("weights", "conv_backward_weight_onednn"),
    plan=_bwd_onednn_plan("weights"),
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="oneDNN's convolution backward-weights primitive (forward_training hint), built at prepare and "
    "kept per shape; layouts of its choosing, plain tensors reordered at the edges in the workspace",
    nonfinite="oneDNN's JIT code skips the taps that read padding, so a NaN or Inf in dY reaches the dW "
    "entries whose sums read the input there; the reference and the im2col kernels multiply the padding's "
    "zeros (every tap, as Conv's definition), which also gives NaN at the taps that read padding",
)(_bwd_onednn_kernel)
ConvBackwardWeight.kernel(
    "conv_backward_weight_matmul",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=35,
    applies=_bwd_applies("weights", "conv_backward_weight_matmul"),
    plan=_bwd_weight_matmul_plan,
    workspace=lambda ctx, plan: plan.workspace_bytes,
    doc="2-D, one group, small or strided output planes (libraries.weight_gradient_by_rows): the windows of "
    "every image as rows (one numba pass), then dW = dY^T @ rows in one product (libraries.conv_rows_product: "
    "oneDNN's brgemm matmul, bfloat16 with float32 accumulation; float32 on the GEMM library where MKL keeps "
    "runtime products or oneDNN's matmul is not its brgemm code)",
)(_bwd_weight_matmul)
ConvBackwardWeight.kernel(
    "conv_backward_weight_im2col",
    dtypes=_F32_64,
    priority=20,
    plan=_bwd_weight_gemm_plan,
    workspace=_workspace,
    doc="the forward's im2col columns of X, a band of output rows at a time (1x1: X itself), times "
    "dY^T (BLAS), added into dW",
)(_bwd_weight_gemm)


def _bwd_infer(ctx):
    dt = _same_dtype(ctx, 0, 1, 2)
    xs, ws, _, _ = _backward_shapes(ctx)
    return [TensorMeta(xs, dt), TensorMeta(ws, dt), TensorMeta((ws[0],), dt)][: ctx.num_outputs]


def _bwd_ref(ins, attrs):
    dy, x, w = ins[0], ins[1], ins[2]
    geo = conv_geometry("ConvBackward", x.shape, w.shape, attrs)
    g = int(attrs["group"])
    db = dy.astype(np.float64).sum(axis=(0,) + tuple(range(2, dy.ndim)))
    return (
        conv_grad_data_reference(dy, w, x.shape, geo, g).astype(dy.dtype),
        conv_grad_weight_reference(x, dy, w.shape, geo, g).astype(dy.dtype),
        db.astype(dy.dtype),
    )


def _bwd_parts_plan(ctx):
    """The data and weight gradients' own records, kernels and plans (selected as they would be
    alone, on float32 metas where a 16-bit call comes through the float32 adapter)."""
    compute = _dt.float32 if _dt.is_low_precision(ctx.dtype(0)) else ctx.dtype(0)
    ys, xs, ws = (tuple(ctx.shape(i)) for i in range(3))
    base = {k: ctx.attrs[k] for k in ("dilations", "group", "pads", "strides")}
    parts = []
    for op, shapes, extra in (
        ("ConvBackwardData", (ys, ws), {"input_shape": list(xs)}),
        ("ConvBackwardWeight", (xs, ys), {"weight_shape": list(ws)}),
    ):
        rec = get_op(op, "opsnn")
        metas = [TensorMeta(sh, compute) for sh in shapes]
        inner = InferContext(rec, metas, rec.bind_attrs(dict(base, **extra)), [None, None], 1, ctx.device)
        rec.run_infer(inner)
        k = select_kernel(rec, inner).kernel
        plan = k.plan(inner) if k.plan else None
        parts.append((k, plan, k.workspace(inner, plan) if k.workspace else 0, inner.attrs))
    return parts


def _bwd_kernel(ins, outs, attrs, plan, ws):
    dy, x, w = ins[0], ins[1], ins[2]
    (kd, pd, _, ad), (kw, pw, _, aw) = plan
    kd.fn([dy, w], outs[:1], ad, pd, ws)
    if len(outs) > 1:
        kw.fn([x, dy], outs[1:2], aw, pw, ws)
    if len(outs) > 2:
        np.sum(dy, axis=(0,) + tuple(range(2, dy.ndim)), out=outs[2])


ConvBackward = register_op(
    "ConvBackward",
    domain="opsnn",
    category="conv",
    inputs=[Input("dY", FLOAT), Input("X", FLOAT), Input("W", FLOAT)],
    outputs=["dX", "dW", "dB"],
    attrs=_BACKWARD_ATTRS,
    infer=_bwd_infer,
    reference=_bwd_ref,
    flops=lambda ctx: 2 * _bwd_flops(ctx),
    doc="Conv's three gradients (aclnnConvolutionBackward): dX (ConvBackwardData), dW "
    "(ConvBackwardWeight) and dB (dY summed over all but the channel dim).",
)
ConvBackward.kernel(
    "conv_backward_parts",
    dtypes=_F32_64,
    priority=20,
    plan=_bwd_parts_plan,
    workspace=lambda ctx, plan: max(p[2] for p in plan),
    doc="the kernels ConvBackwardData and ConvBackwardWeight select, one after the other in one workspace",
)(_bwd_kernel)


def _bwd_pads(fn: str, nd: int, padding) -> list:
    """``padding``: an int, one per spatial dim (both ends) or 2*nd values (begins, then ends)."""
    if not isinstance(padding, (int, np.integer)) and hasattr(padding, "__len__") and len(padding) == 2 * nd:
        p = [int(v) for v in padding]
        if any(v < 0 for v in p):
            raise ParamInvalidError(f"{fn}: padding must be non-negative, got {padding!r}")
        return p
    return list(_spatial(padding, nd, "padding", fn)) * 2


def _bwd_attrs(fn: str, nd: int, stride, padding, dilation, groups) -> dict:
    return {
        "strides": list(_spatial(stride, nd, "stride", fn)),
        "pads": _bwd_pads(fn, nd, padding),
        "dilations": list(_spatial(dilation, nd, "dilation", fn)),
        "group": int(groups),
    }


def _rank_of(fn: str, t) -> int:
    r = getattr(t, "ndim", None)
    r = np.ndim(t) if r is None else r
    if r not in (3, 4, 5):
        raise ParamInvalidError(f"{fn}: tensors must be 3-D, 4-D or 5-D (N, C, spatial...), got {r}-D")
    return r - 2


@api("conv_backward_data", "ConvBackwardData", domain="opsnn")
def conv_backward_data(grad_output, weight, input_shape, stride=1, padding=0, dilation=1, groups=1):
    """A convolution's input gradient (torch.nn.grad.conv{1,2,3}d_input with the input's shape):
    ``padding`` an int, one per spatial dim, or begins then ends.

    >>> import opsnn, numpy as np
    >>> dy = opsnn.tensor(np.ones((1, 4, 4, 4), np.float32))
    >>> w = opsnn.tensor(np.ones((4, 3, 3, 3), np.float32))
    >>> opsnn.ops.conv_backward_data(dy, w, (1, 3, 8, 8), stride=2, padding=1).shape
    (1, 3, 8, 8)
    """
    nd = _rank_of("conv_backward_data", grad_output)
    attrs = _bwd_attrs("conv_backward_data", nd, stride, padding, dilation, groups)
    attrs["input_shape"] = [int(v) for v in input_shape]
    return [grad_output, weight], attrs


@api("conv_backward_weight", "ConvBackwardWeight", domain="opsnn")
def conv_backward_weight(input, grad_output, weight_shape, stride=1, padding=0, dilation=1, groups=1):
    """A convolution's weight gradient (torch.nn.grad.conv{1,2,3}d_weight's arguments in its order:
    ``input``, ``weight_shape``... are keywords here as there)."""
    nd = _rank_of("conv_backward_weight", input)
    attrs = _bwd_attrs("conv_backward_weight", nd, stride, padding, dilation, groups)
    attrs["weight_shape"] = [int(v) for v in weight_shape]
    return [input, grad_output], attrs


def _make_conv_backward(nd: int):
    fn = f"conv{nd}d_backward"

    def translate(grad_output, input, weight, stride=1, padding=0, dilation=1, groups=1):
        _check_rank(fn, nd, grad_output=grad_output, input=input, weight=weight)
        return [grad_output, input, weight], _bwd_attrs(fn, nd, stride, padding, dilation, groups), 3

    translate.__name__ = fn
    translate.__doc__ = (
        f"The three gradients of ``conv{nd}d(input, weight, bias, stride, padding, dilation, groups)`` "
        "for the output gradient ``grad_output``: (grad_input, grad_weight, grad_bias), like "
        "aclnnConvolutionBackward; ``padding`` an int, one per spatial dim, or begins then ends. "
        f"Two-phase: ``opsnn.aclnn.{fn}.prepare(grad_output, input, weight, ...)``."
    )
    return api(fn, "ConvBackward", domain="opsnn")(translate)


conv1d_backward = _make_conv_backward(1)
conv2d_backward = _make_conv_backward(2)
conv3d_backward = _make_conv_backward(3)


# -- ConvInteger / QLinearConv --------------------------------------------------------------------
def _check_zp(ctx, i: int, m: int | None, data_i: int | None) -> None:
    """Zero point / scale ``i``: a scalar, or (``m`` given) 1-D per output channel."""
    if not ctx.has(i):
        return
    name = ctx.op.inputs[i].name
    shape = tuple(ctx.shape(i))
    n = math.prod(shape)
    if n != 1 and not (m is not None and shape == (m,)):
        want = "a scalar" + (f" or 1-D of output channels ({m},)" if m is not None else "")
        ctx.fail(f"{name!r} must be {want}, got shape {shape}")
    if data_i is not None and ctx.dtype(i) != ctx.dtype(data_i):
        raise DTypeError(
            f"{ctx.op.name}: {name!r} has dtype {_dt.name(ctx.dtype(i))}, expected "
            f"{_dt.name(ctx.dtype(data_i))} like {ctx.op.inputs[data_i].name!r}",
            op=ctx.op.name,
        )


def _conv_integer_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    m = _check_channels(ctx, xs, ws, int(ctx.attrs["group"]))
    _check_zp(ctx, 2, None, 0)
    _check_zp(ctx, 3, m, 1)
    return [TensorMeta((xs[0], m) + geo.out, _dt.int32)]


def _shift(v: np.ndarray, zp, per_channel_ndim: int | None = None) -> np.ndarray:
    v = v.astype(np.int64)
    if zp is None:
        return v
    zp = zp.astype(np.int64)
    if zp.size > 1:
        return v - zp.reshape((-1,) + (1,) * (per_channel_ndim - 1))
    return v - zp.reshape(())


def _conv_integer_ref(ins, attrs):
    x, w = ins[0], ins[1]
    x_zp = ins[2] if len(ins) > 2 else None
    w_zp = ins[3] if len(ins) > 3 else None
    geo = conv_geometry("ConvInteger", x.shape, w.shape, attrs)
    return _conv_core(_shift(x, x_zp), _shift(w, w_zp, w.ndim), geo, int(attrs["group"])).astype(np.int32)


ConvInteger = register_op(
    "ConvInteger",
    category="conv",
    inputs=[
        Input("x", _Q8),
        Input("w", _Q8),
        Input("x_zero_point", _Q8, optional=True),
        Input("w_zero_point", _Q8, optional=True),
    ],
    outputs=["y"],
    attrs=_CONV_ATTRS,
    infer=_conv_integer_infer,
    reference=_conv_integer_ref,
    flops=_conv_flops,
    doc="int32 convolution of zero-point-shifted 8-bit data (ONNX ConvInteger).",
)
ConvInteger.kernel(
    "conv_integer_im2col",
    dtypes=_Q8,
    priority=20,
    plan=_conv_planner(None, lambda dt: 8),
    workspace=_workspace,
    doc="shifted operands in float64 (exact) through the float conv algorithms (1x1 GEMM / im2col)",
)(K.conv_integer)


def _qlinear_conv_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(3)
    geo = conv_geometry(ctx.op.name, xs, ws, ctx.attrs)
    m = _check_channels(ctx, xs, ws, int(ctx.attrs["group"]))
    _check_zp(ctx, 1, None, None)
    _check_zp(ctx, 2, None, 0)
    _check_zp(ctx, 4, m, None)
    _check_zp(ctx, 5, m, 3)
    _check_zp(ctx, 6, None, None)
    _check_zp(ctx, 7, None, None)
    _check_bias(ctx, 8, m)
    return [TensorMeta((xs[0], m) + geo.out, ctx.dtype(7))]


def _qlinear_conv_ref(ins, attrs):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = ins[:8]
    b = ins[8] if len(ins) > 8 else None
    geo = conv_geometry("QLinearConv", x.shape, w.shape, attrs)
    acc = _conv_core(_shift(x, x_zp), _shift(w, w_zp, w.ndim), geo, int(attrs["group"]))
    bc = (1, -1) + (1,) * len(geo.k)
    if b is not None:
        acc = acc + b.astype(np.int64).reshape(bc)
    w_s = w_s.reshape(bc) if w_s.size > 1 else w_s.reshape(())
    scale = (x_s.reshape(()) * w_s / y_s.reshape(())).astype(np.float64)
    y = np.rint(acc * scale) + float(y_zp.reshape(()))
    info = np.iinfo(y_zp.dtype)
    return np.clip(y, info.min, info.max).astype(y_zp.dtype)


QLinearConv = register_op(
    "QLinearConv",
    category="conv",
    inputs=[
        Input("x", _Q8),
        Input("x_scale", (_dt.float32,)),
        Input("x_zero_point", _Q8),
        Input("w", _Q8),
        Input("w_scale", (_dt.float32,)),
        Input("w_zero_point", _Q8),
        Input("y_scale", (_dt.float32,)),
        Input("y_zero_point", _Q8),
        Input("B", (_dt.int32,), optional=True),
    ],
    outputs=["y"],
    attrs=_CONV_ATTRS,
    infer=_qlinear_conv_infer,
    reference=_qlinear_conv_ref,
    flops=lambda ctx: 2 * math.prod(ctx.outputs[0].shape) * math.prod(ctx.shape(3)[1:]),
    doc="Quantized convolution (ONNX QLinearConv); w_scale/w_zero_point may be per output channel.",
)
QLinearConv.kernel(
    "qlinear_conv_im2col",
    dtypes=_Q8,
    priority=20,
    plan=_conv_planner(None, lambda dt: 8, 3),
    workspace=_workspace,
    doc="exact float64 conv of shifted operands (1x1 GEMM / im2col), then round-half-even requantization",
)(K.qlinear_conv)


@api("conv_integer", "ConvInteger")
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, stride=1, padding=0, dilation=1, groups=1):
    """int32 ``conv(x - x_zero_point, w - w_zero_point)`` for uint8/int8 data (ONNX ConvInteger)."""
    nd = max(getattr(x, "ndim", np.ndim(x)) - 2, 1)
    return [x, w, x_zero_point, w_zero_point], _conv_attrs("conv_integer", nd, stride, padding, dilation, groups)


@api("qlinear_conv", "QLinearConv")
def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    b=None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
):
    """Quantized convolution (ONNX QLinearConv); output dtype is ``y_zero_point``'s."""
    nd = max(getattr(x, "ndim", np.ndim(x)) - 2, 1)
    return (
        [x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b],
        _conv_attrs("qlinear_conv", nd, stride, padding, dilation, groups),
    )


__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "conv_integer",
    "qlinear_conv",
    "conv_backward_data",
    "conv_backward_weight",
    "conv1d_backward",
    "conv2d_backward",
    "conv3d_backward",
]
