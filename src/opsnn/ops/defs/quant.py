"""Quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear — records,
CPU kernels and functional entry points.

Granularity follows ONNX (latest opset): a scalar scale quantizes per tensor, a 1-D scale
per ``axis``, a scale of the input's rank with ``block_size`` per block along ``axis``::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([-1.0, 0.0, 0.26, 300.0], np.float32))
    >>> opsnn.ops.quantize_linear(x, 0.5, 10, dtype="int8").numpy()
    array([  8,  10,  11, 127], dtype=int8)

Rounding is half to even; int codes saturate, NaN gives the lowest code (as onnxruntime).
Types: int8/uint8/int16/uint16, int4/uint4/int2/uint2, float8 (e4m3fn, e4m3fnuz, e5m2,
e5m2fnuz; ``saturate`` clips instead of overflowing), float4e2m1 and float6 — where the
installed ml_dtypes has them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import quant as K
from ...tensor import Tensor, as_tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op

# -- ONNX TensorProto element types (the output_dtype / precision attributes) ---------------------------

_ONNX_CODES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    10: "float16",
    11: "float64",
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
    27: "float6_e2m3fn",
    28: "float6_e3m2fn",
}


def _np_dtype(name: str):
    t = getattr(ml_dtypes, name, None)
    if t is None:
        t = getattr(np, name, None)
    return None if t is None else np.dtype(t)


#: ONNX element type code -> numpy dtype (only those this numpy/ml_dtypes can hold)
ONNX_TO_DTYPE = {c: d for c, d in ((c, _np_dtype(n)) for c, n in _ONNX_CODES.items()) if d is not None}
DTYPE_TO_ONNX = {d: c for c, d in ONNX_TO_DTYPE.items()}

_Q_NAMES = (
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint4",
    "int4",
    "uint2",
    "int2",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
)
#: the types QuantizeLinear produces and DequantizeLinear consumes
QUANT_TYPES = tuple(d for d in (_np_dtype(n) for n in _Q_NAMES) if d is not None)
_E8M0 = _np_dtype("float8_e8m0fnu")
_SCALE_TYPES = tuple(d for d in (_dt.float32, _dt.float16, _dt.bfloat16, _dt.float64, _E8M0) if d is not None)
_OUT_FLOATS = (_dt.float32, _dt.float16, _dt.bfloat16, _dt.float64)


def _dname(dt) -> str:
    return dt.name if hasattr(dt, "name") else str(dt)


# -- granularity -------------------------------------------------------------------------------------------


def quant_layout(op: str, ctx, x_shape: tuple, s_shape: tuple, z_shape, axis: int, block: int) -> K.QuantLayout:
    """Per-tensor / per-axis / blocked, from the scale's shape (ONNX rules), validated."""
    r = len(x_shape)
    if block < 0:
        raise ParamInvalidError(f"{op}: attribute 'block_size' must be >= 0, got {block}", op=op)
    if z_shape is not None and tuple(z_shape) != tuple(s_shape) and not (np.prod(z_shape) == 1 == np.prod(s_shape)):
        ctx.fail(f"zero point shape {tuple(z_shape)} must equal the scale's shape {tuple(s_shape)}")
    if int(np.prod(s_shape)) == 1 and len(s_shape) <= max(1, r) and (block == 0 or len(s_shape) <= 1):
        return K.layout("tensor", x_shape, 0, 1)
    if r == 0:
        ctx.fail(f"a scalar input takes a single-element scale, got shape {tuple(s_shape)}")
    if not -r <= axis < r:
        raise ParamInvalidError(
            f"{op}: attribute 'axis' must be in [{-r}, {r - 1}] for a {r}-D input, got {axis}", op=op
        )
    axis %= r
    if block == 0:
        if len(s_shape) != 1 or s_shape[0] != x_shape[axis]:
            ctx.fail(
                f"without block_size the scale must be a scalar (per tensor) or 1-D of length "
                f"{x_shape[axis]} (per axis {axis}), got shape {tuple(s_shape)}"
            )
        return K.layout("axis", x_shape, axis, 1)
    want = tuple(-(-x_shape[i] // block) if i == axis else x_shape[i] for i in range(r))
    if tuple(s_shape) != want:
        ctx.fail(
            f"blocked quantization (axis {axis}, block_size {block}) needs a scale of shape {want} for input "
            f"{tuple(x_shape)}, got {tuple(s_shape)}"
        )
    return K.layout("block", x_shape, axis, block)


def _param_each(v: np.ndarray, x_shape: tuple, lay: K.QuantLayout) -> np.ndarray:
    """Reference helper: the scale/zero point of every element, by explicit index arithmetic."""
    v = np.asarray(v)
    if lay.mode == "tensor":
        return np.broadcast_to(v.reshape(()), x_shape)
    idx = list(np.indices(x_shape))
    if lay.mode == "axis":
        return v.reshape(-1)[idx[lay.axis]]
    idx[lay.axis] = idx[lay.axis] // lay.block
    return v[tuple(idx)]


def _layout_of(ctx) -> K.QuantLayout:
    a = ctx.attrs
    return quant_layout(
        ctx.op.name,
        ctx,
        ctx.shape(0),
        ctx.shape(1),
        ctx.shape(2) if ctx.has(2) else None,
        int(a["axis"]),
        int(a["block_size"]),
    )


def _attr_layout(op: str, ins, attrs) -> K.QuantLayout:
    class _Ctx:  # references see arrays, not an InferContext: reuse the validation
        def fail(self, msg):
            raise ParamInvalidError(f"{op}: {msg}", op=op)

    z = ins[2] if len(ins) > 2 else None
    return quant_layout(
        op,
        _Ctx(),
        ins[0].shape,
        np.shape(ins[1]),
        None if z is None else np.shape(z),
        int(attrs["axis"]),
        int(attrs["block_size"]),
    )


# -- QuantizeLinear --------------------------------------------------------------------------------------


def _q_out_dtype(op: str, zp_dtype, output_dtype: int) -> np.dtype:
    code = int(output_dtype or 0)
    if code and code not in ONNX_TO_DTYPE:
        raise DTypeError(
            f"{op}: attribute 'output_dtype' {code} is not an ONNX element type this build supports", op=op
        )
    out = ONNX_TO_DTYPE[code] if code else None
    if zp_dtype is not None:
        if out is not None and out != zp_dtype:
            raise DTypeError(
                f"{op}: output_dtype {_dname(out)} disagrees with the zero point's dtype {_dname(zp_dtype)}", op=op
            )
        out = zp_dtype
    out = out if out is not None else _dt.uint8
    if out not in QUANT_TYPES:
        raise DTypeError(
            f"{op}: the quantized type must be one of {[_dname(d) for d in QUANT_TYPES]}, got {_dname(out)}", op=op
        )
    return out


def _precision(op: str, code) -> np.dtype | None:
    code = int(code or 0)
    if not code:
        return None
    dt = ONNX_TO_DTYPE.get(code)
    if dt not in _OUT_FLOATS:
        raise DTypeError(f"{op}: attribute 'precision' must be a float type code (1, 10, 11, 16), got {code}", op=op)
    return dt


def _infer_quantize(ctx):
    op = "QuantizeLinear"
    if ctx.dtype(0) not in _OUT_FLOATS + (_dt.int32,):
        raise DTypeError(
            f"{op}: input x has dtype {_dname(ctx.dtype(0))}; expected float32, float16, bfloat16, float64 or int32",
            op=op,
        )
    if ctx.dtype(1) not in _SCALE_TYPES + (_dt.int32,):
        raise DTypeError(
            f"{op}: y_scale has dtype {_dname(ctx.dtype(1))}; expected one of "
            f"{[_dname(d) for d in _SCALE_TYPES + (_dt.int32,)]}",
            op=op,
        )
    if int(ctx.attrs["saturate"]) not in (0, 1):
        raise ParamInvalidError(f"{op}: attribute 'saturate' must be 0 or 1, got {ctx.attrs['saturate']}", op=op)
    _precision(op, ctx.attrs["precision"])
    out = _q_out_dtype(op, ctx.dtype(2) if ctx.has(2) else None, ctx.attrs["output_dtype"])
    _layout_of(ctx)
    return [TensorMeta(tuple(ctx.shape(0)), out)]


def _quantize_reference(ins, attrs):
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    out = _q_out_dtype("QuantizeLinear", None if zp is None else zp.dtype, attrs["output_dtype"])
    lay = _attr_layout("QuantizeLinear", ins, attrs)
    prec = _precision("QuantizeLinear", attrs["precision"])
    s = _param_each(scale, x.shape, lay)
    v = x.astype(prec) / s.astype(prec) if prec is not None else x / s
    if out in K.INT_RANGES:
        lo, hi = K.INT_RANGES[out]
        q = np.rint(v).astype(np.float64)
        if zp is not None:
            q = q + _param_each(zp, x.shape, lay).astype(np.float64)
        q = np.where(np.isnan(q), lo, np.minimum(np.maximum(q, lo), hi))
        return q.astype(np.int64).astype(out)
    v = v.astype(np.float32) if v.dtype != np.float64 else v
    if zp is not None:
        v = v + _param_each(zp, x.shape, lay).astype(v.dtype)
    if int(attrs["saturate"]) and out in K.SATURABLE:
        big = float(ml_dtypes.finfo(out).max)
        v = np.where(v > big, big, np.where(v < -big, -big, v))
    return v.astype(out)


QuantizeLinear = register_op(
    "QuantizeLinear",
    category="quant",
    inputs=[Input("x"), Input("y_scale"), Input("y_zero_point", optional=True)],
    outputs=["y"],
    attrs=[
        Attr("axis", "int", 1),
        Attr("block_size", "int", 0),
        Attr("output_dtype", "int", 0),
        Attr("precision", "int", 0),
        Attr("saturate", "int", 1),
    ],
    infer=_infer_quantize,
    reference=_quantize_reference,
    doc="y = saturate(round_half_even(x / y_scale) + y_zero_point), per tensor, per axis or per block.",
)


class _QPlan:
    __slots__ = ("lay", "parallel", "out", "prec", "saturate")

    def __init__(self, ctx, out_index: int = 0):
        self.lay = _layout_of(ctx)
        self.parallel = int(np.prod(ctx.shape(0))) >= K.PARALLEL_MIN
        self.out = ctx.outputs[out_index].dtype
        self.prec = _precision(ctx.op.name, ctx.attrs.get("precision", 0))
        self.saturate = bool(int(ctx.attrs.get("saturate", 1)))


def _quantize_int8_applies(ctx):
    if ctx.dtype(0) != _dt.float32:
        return f"x is {_dname(ctx.dtype(0))}, the numba kernel takes float32"
    if ctx.dtype(1) != _dt.float32:
        return f"y_scale is {_dname(ctx.dtype(1))}, the numba kernel takes float32"
    if ctx.outputs[0].dtype not in (_dt.int8, _dt.uint8):
        return f"output {_dname(ctx.outputs[0].dtype)}: the numba kernel writes int8/uint8"
    if int(ctx.attrs["precision"]) not in (0, 1):
        return "precision other than float32"
    return True


@QuantizeLinear.kernel(
    "quantize_int8_numba", dtypes=(_dt.float32,), priority=10, plan=_QPlan, applies=_quantize_int8_applies
)
def _quantize_int8(ins, outs, attrs, plan, ws):
    K.quantize_int8(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan.lay, plan.parallel)


@QuantizeLinear.kernel("quantize_numpy", priority=5, plan=_QPlan)
def _quantize_numpy(ins, outs, attrs, plan, ws):
    np.copyto(
        outs[0],
        K.quantize_values(
            ins[0], ins[1], ins[2] if len(ins) > 2 else None, plan.out, plan.lay, plan.prec, plan.saturate
        ),
    )


# -- DequantizeLinear -------------------------------------------------------------------------------------


def _dq_out_dtype(op: str, scale_dtype, output_dtype) -> np.dtype:
    code = int(output_dtype or 0)
    out = ONNX_TO_DTYPE.get(code) if code else scale_dtype
    if out not in _OUT_FLOATS:
        raise DTypeError(
            f"{op}: the output type (output_dtype, else x_scale's type) must be float32, float16, "
            f"bfloat16 or float64, got {_dname(out) if out is not None else code}",
            op=op,
        )
    return out


def _infer_dequantize(ctx):
    op = "DequantizeLinear"
    x = ctx.dtype(0)
    if x not in QUANT_TYPES + (_dt.int32,):
        raise DTypeError(
            f"{op}: input x has dtype {_dname(x)}; expected one of {[_dname(d) for d in QUANT_TYPES + (_dt.int32,)]}",
            op=op,
        )
    if ctx.dtype(1) not in _SCALE_TYPES:
        raise DTypeError(
            f"{op}: x_scale has dtype {_dname(ctx.dtype(1))}; expected one of {[_dname(d) for d in _SCALE_TYPES]}",
            op=op,
        )
    if ctx.has(2) and ctx.dtype(2) != x:
        raise DTypeError(f"{op}: x_zero_point has dtype {_dname(ctx.dtype(2))}; it must match x ({_dname(x)})", op=op)
    out = _dq_out_dtype(op, ctx.dtype(1), ctx.attrs["output_dtype"])
    _layout_of(ctx)
    return [TensorMeta(tuple(ctx.shape(0)), out)]


def _dequantize_reference(ins, attrs):
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    out = _dq_out_dtype("DequantizeLinear", scale.dtype, attrs["output_dtype"])
    lay = _attr_layout("DequantizeLinear", ins, attrs)
    xv = x.astype(np.float64)
    if zp is not None:
        xv = xv - _param_each(zp, x.shape, lay).astype(np.float64)
    return (xv * _param_each(scale, x.shape, lay).astype(np.float64)).astype(out)


DequantizeLinear = register_op(
    "DequantizeLinear",
    category="quant",
    inputs=[Input("x"), Input("x_scale"), Input("x_zero_point", optional=True)],
    outputs=["y"],
    attrs=[Attr("axis", "int", 1), Attr("block_size", "int", 0), Attr("output_dtype", "int", 0)],
    infer=_infer_dequantize,
    reference=_dequantize_reference,
    doc="y = (x - x_zero_point) * x_scale, per tensor, per axis or per block.",
)


def _dequantize_int8_applies(ctx):
    if ctx.dtype(1) != _dt.float32 or ctx.outputs[0].dtype != _dt.float32:
        return "the numba kernel maps int8/uint8 with a float32 scale to float32"
    return True


@DequantizeLinear.kernel(
    "dequantize_int8_numba", dtypes=(_dt.int8, _dt.uint8), priority=10, plan=_QPlan, applies=_dequantize_int8_applies
)
def _dequantize_int8(ins, outs, attrs, plan, ws):
    K.dequantize_int8(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan.lay, plan.parallel)


@DequantizeLinear.kernel("dequantize_numpy", priority=5, plan=_QPlan)
def _dequantize_numpy(ins, outs, attrs, plan, ws):
    np.copyto(outs[0], K.dequantize_values(ins[0], ins[1], ins[2] if len(ins) > 2 else None, plan.out, plan.lay))


# -- DynamicQuantizeLinear --------------------------------------------------------------------------------


def _infer_dynamic(ctx):
    if ctx.dtype(0) not in _OUT_FLOATS:
        raise DTypeError(
            f"DynamicQuantizeLinear: input x has dtype {_dname(ctx.dtype(0))}; expected a float type",
            op="DynamicQuantizeLinear",
        )
    return [TensorMeta(tuple(ctx.shape(0)), _dt.uint8), TensorMeta((), _dt.float32), TensorMeta((), _dt.uint8)]


def _dynamic_reference(ins, attrs):
    x = ins[0].astype(np.float32)
    vals = x[~np.isnan(x)]
    hi = np.float32(max(0.0, float(vals.max()))) if vals.size else np.float32(0)
    lo = np.float32(min(0.0, float(vals.min()))) if vals.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32(hi - lo) / np.float32(255)
    zp = float(np.rint(min(max(np.float32(0) - lo / scale, 0.0), 255.0)))
    q = np.rint(x / scale).astype(np.float64) + zp
    q = np.where(np.isnan(q), 0, np.minimum(np.maximum(q, 0), 255))
    return q.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


DynamicQuantizeLinear = register_op(
    "DynamicQuantizeLinear",
    category="quant",
    inputs=[Input("x")],
    outputs=["y", "y_scale", "y_zero_point"],
    infer=_infer_dynamic,
    reference=_dynamic_reference,
    doc="uint8 quantization with scale/zero point from the data range (which always includes 0; NaN ignored).",
)


@DynamicQuantizeLinear.kernel(
    "dynamic_quantize_numba",
    priority=10,
    plan=lambda ctx: (K.layout("tensor", tuple(ctx.shape(0)), 0, 1), int(np.prod(ctx.shape(0))) >= K.PARALLEL_MIN),
)
def _dynamic_quantize(ins, outs, attrs, plan, ws):
    x = ins[0] if ins[0].dtype == np.float32 else ins[0].astype(np.float32)
    scale, zp = K.dynamic_range(x)
    outs[1][...] = scale
    outs[2][...] = zp
    K.quantize_int8(x, np.array([scale], np.float32), np.array([zp], np.int32), outs[0], plan[0], plan[1])


# -- functional entry points ----------------------------------------------------------------------------


def _scale_arg(scale):
    if isinstance(scale, (float, int, np.floating, np.integer)) and not isinstance(scale, bool):
        return Tensor(np.asarray(scale, np.float32))
    return as_tensor(scale)


def _dtype_arg(fn: str, dtype):
    if dtype is None:
        return None
    dt = dtype if isinstance(dtype, np.dtype) else (_np_dtype(dtype) if isinstance(dtype, str) else None)
    if dt is None:
        try:
            dt = _dt.get(dtype)
        except Exception:  # noqa: BLE001 - reported below with the function's name
            dt = None
    if dt is None or dt not in DTYPE_TO_ONNX:
        raise DTypeError(f"{fn}: unknown or unsupported dtype {dtype!r}")
    return dt


@api("quantize_linear", "QuantizeLinear")
def quantize_linear(x, scale, zero_point=None, axis=1, block_size=0, dtype=None, saturate=True, precision=None):
    """``saturate(round(x / scale) + zero_point)``. ``scale``/``zero_point``: Python numbers
    (per tensor) or tensors (per axis: 1-D along ``axis``; blocked: with ``block_size``).
    ``dtype`` picks the quantized type when ``zero_point`` is not a tensor (default uint8)."""
    out = _dtype_arg("quantize_linear", dtype)
    inputs = [x, _scale_arg(scale)]
    if zero_point is not None:
        if isinstance(zero_point, (int, float, np.integer, np.floating)) and not isinstance(zero_point, bool):
            zdt = out or _dt.uint8
            zero_point = Tensor(np.asarray(zero_point).astype(zdt))
        inputs.append(as_tensor(zero_point))
    attrs = {"axis": int(axis), "block_size": int(block_size), "saturate": int(bool(saturate))}
    if out is not None:
        attrs["output_dtype"] = DTYPE_TO_ONNX[out]
    if precision is not None:
        attrs["precision"] = DTYPE_TO_ONNX[_dtype_arg("quantize_linear", precision)]
    return inputs, attrs


@api("dequantize_linear", "DequantizeLinear")
def dequantize_linear(x, scale, zero_point=None, axis=1, block_size=0, dtype=None):
    """``(x - zero_point) * scale``; ``dtype`` sets the output float type (default: the scale's)."""
    x = as_tensor(x)
    inputs = [x, _scale_arg(scale)]
    if zero_point is not None:
        if isinstance(zero_point, (int, np.integer)) and not isinstance(zero_point, bool):
            zero_point = Tensor(np.asarray(zero_point).astype(x.dtype))
        inputs.append(as_tensor(zero_point))
    attrs = {"axis": int(axis), "block_size": int(block_size)}
    if dtype is not None:
        attrs["output_dtype"] = DTYPE_TO_ONNX[_dtype_arg("dequantize_linear", dtype)]
    return inputs, attrs


@api("dynamic_quantize_linear", "DynamicQuantizeLinear")
def dynamic_quantize_linear(x):
    """uint8 quantization with a data-derived scale; returns ``(y, scale, zero_point)``."""
    return [x], {}, 3


__all__ = ["quantize_linear", "dequantize_linear", "dynamic_quantize_linear"]
