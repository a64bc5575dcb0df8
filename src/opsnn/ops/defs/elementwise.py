"""Elementwise ops: records (ONNX schemas), CPU kernel registration and functional entry points.

Binary ops broadcast like numpy (ONNX multidirectional broadcasting); a Python scalar operand
takes the other operand's dtype::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> opsnn.ops.add(x, opsnn.tensor(np.ones(3, np.float32))).numpy()[1]
    array([4., 5., 6.], dtype=float32)
    >>> (x * 2).numpy()[0]
    array([0., 2., 4.], dtype=float32)
    >>> opsnn.ops.cast(x, "float16").dtype
    dtype('float16')
"""

from __future__ import annotations

import builtins
import functools
import math

import ml_dtypes
import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, InferShapeError, ParamInvalidError
from ...kernels.cpu import bf16_binary as KBB
from ...kernels.cpu import elementwise as K
from ...tensor import Tensor, as_tensor
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op

FLOATS = _dt.FLOATS
INTS = _dt.INTEGERS
SIGNED = (_dt.int8, _dt.int16, _dt.int32, _dt.int64)
NUMERIC = _dt.NUMERIC
BOOL = (_dt.bool_,)
#: dtypes the numba kernels compile for (16-bit floats run through the fp32 adapter)
NUMBA = (_dt.float32, _dt.float64, _dt.int32, _dt.int64)
NUMBA_FLOAT = (_dt.float32, _dt.float64)

# ONNX TensorProto.DataType -> numpy dtype (None where opsnn cannot hold the type)
ONNX_DTYPES: dict[int, np.dtype | None] = {
    1: _dt.float32,
    2: _dt.uint8,
    3: _dt.int8,
    4: _dt.uint16,
    5: _dt.int16,
    6: _dt.int32,
    7: _dt.int64,
    8: None,  # STRING: opsnn tensors hold fixed-size dtypes only
    9: _dt.bool_,
    10: _dt.float16,
    11: _dt.float64,
    12: _dt.uint32,
    13: _dt.uint64,
    14: np.dtype(np.complex64),
    15: np.dtype(np.complex128),
    16: _dt.bfloat16,
    17: np.dtype(ml_dtypes.float8_e4m3fn),
    18: np.dtype(ml_dtypes.float8_e4m3fnuz),
    19: np.dtype(ml_dtypes.float8_e5m2),
    20: np.dtype(ml_dtypes.float8_e5m2fnuz),
    21: np.dtype(ml_dtypes.uint4),
    22: np.dtype(ml_dtypes.int4),
    23: np.dtype(ml_dtypes.float4_e2m1fn),
    24: np.dtype(ml_dtypes.float8_e8m0fnu),
    25: np.dtype(ml_dtypes.uint2),
    26: np.dtype(ml_dtypes.int2),
}
_ONNX_ENUM = {dt: code for code, dt in ONNX_DTYPES.items() if dt is not None}
_ONNX_NAMES = {1: "FLOAT", 8: "STRING"}
#: what Cast reads and writes (strings only as input)
CASTABLE = tuple(dt for dt in ONNX_DTYPES.values() if dt is not None)


# -- shape and dtype inference --------------------------------------------------------------------
def broadcast_shape(*shapes, op: str = "broadcast", names=None) -> tuple:
    """The numpy/ONNX multidirectional broadcast of ``shapes``; InferShapeError names every shape.

    >>> broadcast_shape((2, 1, 4), (3, 1))
    (2, 3, 4)
    """
    nd = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dim = 1
        for s in shapes:
            j = i - (nd - len(s))
            if j < 0 or s[j] == 1:
                continue
            if dim == 1:
                dim = s[j]
            elif s[j] != dim:
                names = names or [f"input {k}" for k in range(len(shapes))]
                desc = " and ".join(f"{n} {tuple(s)}" for n, s in zip(names, shapes))
                raise InferShapeError(
                    f"{op}: cannot broadcast {desc}: dim {i - nd} is {dim} in one and "
                    f"{s[j]} in another (they must match or be 1)",
                    op=op,
                )
        out.append(dim)
    return tuple(out)


def _names(ctx, idx) -> list[str]:
    return [ctx.op.input_spec(i).name for i in idx]


def _common_dtype(ctx, idx) -> np.dtype:
    """The one dtype all inputs ``idx`` share (ONNX type parameter T), else DTypeError."""
    present = [i for i in idx if ctx.has(i)]
    dt = ctx.dtype(present[0])
    for i in present[1:]:
        if ctx.dtype(i) != dt:
            a, b = _names(ctx, (present[0], i))
            raise DTypeError(
                f"{ctx.op.name}: inputs {a!r} and {b!r} must have the same dtype; got "
                f"{_dt.name(dt)} and {_dt.name(ctx.dtype(i))}",
                op=ctx.op.name,
            )
    return dt


def _bshape(ctx, idx) -> tuple:
    present = [i for i in idx if ctx.has(i)]
    return broadcast_shape(*(ctx.shape(i) for i in present), op=ctx.op.name, names=_names(ctx, present))


def _infer_unary(ctx):
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


def _infer_unary_bool(ctx):
    return [TensorMeta(ctx.shape(0), _dt.bool_)]


def _infer_binary(ctx):
    return [TensorMeta(_bshape(ctx, (0, 1)), _common_dtype(ctx, (0, 1)))]


def _infer_compare(ctx):
    _common_dtype(ctx, (0, 1))
    return [TensorMeta(_bshape(ctx, (0, 1)), _dt.bool_)]


def _infer_pow(ctx):  # X and Y may differ in dtype; the result has X's
    return [TensorMeta(_bshape(ctx, (0, 1)), ctx.dtype(0))]


def _infer_variadic(ctx):
    n = len(ctx.inputs)
    if n == 0:
        raise ParamInvalidError(f"{ctx.op.name}: needs at least one input, got none", op=ctx.op.name)
    idx = tuple(range(n))
    return [TensorMeta(_bshape(ctx, idx), _common_dtype(ctx, idx))]


def _infer_where(ctx):
    return [TensorMeta(_bshape(ctx, (0, 1, 2)), _common_dtype(ctx, (1, 2)))]


def _infer_clip(ctx):
    _common_dtype(ctx, (0, 1, 2))
    for i in (1, 2):
        if ctx.has(i) and math.prod(ctx.shape(i)) != 1:
            raise ParamInvalidError(
                f"Clip: input {_names(ctx, (i,))[0]!r} must be a scalar (one element); got shape {tuple(ctx.shape(i))}",
                op="Clip",
            )
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


def _infer_mod(ctx):
    if ctx.attrs["fmod"] not in (0, 1):
        raise ParamInvalidError(f"Mod: attribute 'fmod' must be 0 or 1, got {ctx.attrs['fmod']!r}", op="Mod")
    return _infer_binary(ctx)


def _direction(attrs) -> str:
    d = attrs["direction"]
    d = d.decode() if isinstance(d, bytes) else str(d)
    if d.upper() not in ("LEFT", "RIGHT"):
        raise ParamInvalidError(f"BitShift: attribute 'direction' must be 'LEFT' or 'RIGHT', got {d!r}", op="BitShift")
    return d.upper()


def _infer_bitshift(ctx):
    _direction(ctx.attrs)
    return _infer_binary(ctx)


def onnx_dtype(to) -> np.dtype:
    """A Cast ``to`` value (ONNX TensorProto enum, numpy dtype or dtype name) as a numpy dtype."""
    if isinstance(to, (int, np.integer)) and not isinstance(to, bool):
        if int(to) not in ONNX_DTYPES:
            raise DTypeError(f"{int(to)} is not an ONNX TensorProto data type")
        dt = ONNX_DTYPES[int(to)]
        if dt is None:
            raise DTypeError(
                f"casting to {_ONNX_NAMES.get(int(to), to)} is not supported (opsnn tensors "
                "hold fixed-size dtypes, not strings)"
            )
        return dt
    if isinstance(to, bytes):
        to = to.decode()
    if isinstance(to, str) and hasattr(ml_dtypes, to):
        return np.dtype(getattr(ml_dtypes, to))
    return _dt.get(to)


def onnx_enum(dtype) -> int:
    """The ONNX TensorProto enum of ``dtype`` (an enum int passes through)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return int(dtype)
    dt = onnx_dtype(dtype)
    if dt not in _ONNX_ENUM:
        raise DTypeError(
            f"cast: dtype {_dt.name(dt)} has no ONNX equivalent; expected one of "
            f"{sorted(_dt.name(d) for d in _ONNX_ENUM)}"
        )
    return _ONNX_ENUM[dt]


def _check_castable(ctx, i: int, what: str) -> None:
    dt = ctx.dtype(i)
    if dt not in CASTABLE and dt.kind not in "OUS":
        raise DTypeError(f"{ctx.op.name}: {what} has dtype {dt}, which Cast does not handle", op=ctx.op.name)


def _check_cast_attrs(ctx) -> None:
    if ctx.attrs["saturate"] not in (0, 1, True, False):
        raise ParamInvalidError(
            f"{ctx.op.name}: attribute 'saturate' must be 0 or 1, got {ctx.attrs['saturate']!r}", op=ctx.op.name
        )
    rm = ctx.attrs["round_mode"]
    rm = rm.decode() if isinstance(rm, bytes) else rm
    if rm not in ("up", "down", "nearest"):
        raise ParamInvalidError(
            f"{ctx.op.name}: attribute 'round_mode' must be 'up', 'down' or 'nearest', got {rm!r}", op=ctx.op.name
        )


def _infer_cast(ctx):
    _check_castable(ctx, 0, "input")
    _check_cast_attrs(ctx)
    to = ctx.attrs["to"]
    try:
        dst = onnx_dtype(to)
    except DTypeError as exc:
        raise DTypeError(f"Cast: attribute 'to' = {to!r}: {exc.args[0]}", op="Cast") from None
    return [TensorMeta(ctx.shape(0), dst)]


def _infer_cast_like(ctx):
    _check_castable(ctx, 0, "input")
    _check_castable(ctx, 1, "target_type")
    _check_cast_attrs(ctx)
    if ctx.dtype(1).kind in "OUS":
        raise DTypeError(
            "CastLike: casting to strings is not supported (opsnn tensors hold fixed-size dtypes)", op="CastLike"
        )
    return [TensorMeta(ctx.shape(0), ctx.dtype(1))]


def _infer_equal(ctx):
    for i in (0, 1):
        dt = ctx.dtype(i)
        if dt not in NUMERIC + BOOL and dt.kind not in "OUS":
            raise DTypeError(
                f"Equal: input {_names(ctx, (i,))[0]!r} has dtype {dt}; expected a numeric, bool or string dtype",
                op="Equal",
            )
    if (ctx.dtype(0).kind in "OUS") != (ctx.dtype(1).kind in "OUS"):
        raise DTypeError(f"Equal: inputs must have the same dtype; got {ctx.dtype(0)} and {ctx.dtype(1)}", op="Equal")
    if ctx.dtype(0).kind not in "OUS":
        _common_dtype(ctx, (0, 1))
    return [TensorMeta(_bshape(ctx, (0, 1)), _dt.bool_)]


# -- references (numpy; the test oracle and the kernel of last resort) ----------------------------------
def _quiet(fn):
    @functools.wraps(fn)
    def run(ins, attrs):
        with np.errstate(all="ignore"):
            return fn(ins, attrs)

    return run


def _wide(x: np.ndarray) -> np.ndarray:
    """Floats computed in float64 by the references (16-bit and float32 rounded once, at the end)."""
    return x.astype(np.float64)


def _float_map(f):
    return _quiet(lambda ins, attrs: f(_wide(ins[0])).astype(ins[0].dtype))


def _ref_div(ins, attrs):
    a, b = ins
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    q = np.floor_divide(a, b)
    adjust = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return (q + adjust).astype(a.dtype)


def _int_pow(x: int, e: int) -> int:
    if e < 0:
        return 1 if x == 1 else (0 if x != -1 else (1 if e % 2 == 0 else -1))
    return builtins.pow(int(x), int(e), 1 << 64)


def _ref_pow(ins, attrs):
    a, b = ins
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        r = np.frompyfunc(_int_pow, 2, 1)(a.astype(object), b.astype(object))
        r = np.frompyfunc(lambda v: int(v) % (1 << 64), 1, 1)(r)
        return np.asarray(r, dtype=object).astype(np.uint64).astype(a.dtype)
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _ref_mod(ins, attrs):
    a, b = ins
    if attrs["fmod"]:
        return np.fmod(a, b)
    return np.mod(a, b)


def _ref_clip(ins, attrs):
    x = ins[0]
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    r = x.copy()
    if lo is not None:
        lo = lo.reshape(())
        r = np.where((r < lo) | np.isnan(np.asarray(lo, np.float64)), lo, r)
    if hi is not None:
        hi = hi.reshape(())
        r = np.where((r > hi) | np.isnan(np.asarray(hi, np.float64)), hi, r)
    return r.astype(x.dtype)


def _ref_bitshift(ins, attrs):
    x, s = np.broadcast_arrays(*ins)
    bits = x.dtype.itemsize * 8
    left = _direction(attrs) == "LEFT"
    out = np.empty(x.shape, x.dtype)
    for i in np.ndindex(x.shape):
        v, k = int(x[i]), int(s[i])
        if not 0 <= k < bits:
            r = -1 if (not left and v < 0) else 0
        elif left:
            r = (v << k) % (1 << bits)
            if x.dtype.kind == "i" and r >= 1 << (bits - 1):
                r -= 1 << bits
        else:
            r = v >> k  # Python's >> is an arithmetic (floor) shift
        out[i] = r
    return out


def _ref_isinf(ins, attrs):
    x = ins[0].astype(np.float64)
    return (np.isposinf(x) & bool(attrs["detect_positive"])) | (np.isneginf(x) & bool(attrs["detect_negative"]))


def _ref_cast_to(x, dst, saturate, round_mode):
    if x.dtype.kind in "OUS":
        try:
            return x.astype(dst)
        except (ValueError, TypeError):
            return x.astype(np.float64).astype(dst)
    if dst in K.FLOAT8 and saturate:
        info = ml_dtypes.finfo(dst)
        wide = x.astype(np.float64)
        wide = np.where(wide > float(info.max), float(info.max), wide)
        wide = np.where(wide < float(info.min), float(info.min), wide)
        return wide.astype(dst)
    if dst == K.E8M0:
        rm = round_mode.decode() if isinstance(round_mode, bytes) else round_mode
        return K.to_e8m0(x, bool(saturate), rm)
    return x.astype(dst)


def _ref_cast(ins, attrs):
    return _ref_cast_to(ins[0], onnx_dtype(attrs["to"]), attrs["saturate"], attrs["round_mode"])


def _ref_cast_like(ins, attrs):
    return _ref_cast_to(ins[0], ins[1].dtype, attrs["saturate"], attrs["round_mode"])


# -- records --------------------------------------------------------------------------------------------
def _binary_record(name, code, dtypes, reference, doc, infer=_infer_binary, attrs=(), plan=None, tiered=False):
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input("A", dtypes), Input("B", dtypes)],
        outputs=["C"],
        attrs=attrs,
        infer=infer,
        reference=_quiet(reference),
        doc=doc,
    )
    plan = plan or functools.partial(K.binary_plan, op=code)
    rec.kernel(
        "binary_numba",
        dtypes=NUMBA,
        priority=10,
        plan=plan,
        cold_alternative="binary_numpy" if tiered else "",
        doc="numba broadcasting walk (flat / scalar / broadcast, parallel when large)",
    )(K.binary)
    rec.kernel("binary_numpy", priority=5, plan=plan, doc="numpy ufunc (integer widths numba skips)")(K.binary_numpy)
    return rec


Add = _binary_record("Add", K.ADD, NUMERIC, lambda ins, a: ins[0] + ins[1], "A + B (broadcasting)", tiered=True)


def _same_shape_bf16(ctx):
    a, b = ctx.inputs[0], ctx.inputs[1]
    if a.dtype != _dt.bfloat16 or b.dtype != _dt.bfloat16:
        return "bfloat16 inputs only"
    if tuple(a.shape) != tuple(b.shape):
        return f"same shapes only (no broadcasting), got {tuple(a.shape)} and {tuple(b.shape)}"
    return True


Add.kernel(
    "add_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before binary_numba, which takes bfloat16 through the fp32 adapter
    applies=_same_shape_bf16,
    plan=lambda ctx: KBB.plan(math.prod(ctx.shape(0))),
    doc="same-shape bfloat16: blocks widened to float32, added, rounded once (no float32 copies)",
)(lambda ins, outs, attrs, plan, ws: KBB.binary_bf16(ins[0], ins[1], outs[0], KBB.ADD, plan))
Sub = _binary_record("Sub", K.SUB, NUMERIC, lambda ins, a: ins[0] - ins[1], "A - B (broadcasting)", tiered=True)
Mul = _binary_record("Mul", K.MUL, NUMERIC, lambda ins, a: ins[0] * ins[1], "A * B (broadcasting)", tiered=True)
Div = _binary_record(
    "Div", K.DIV, NUMERIC, _ref_div, "A / B (broadcasting); integers truncate toward zero, x / 0 gives 0 for integers"
)
Mod = _binary_record(
    "Mod",
    None,
    NUMERIC,
    _ref_mod,
    "remainder: fmod=0 takes the divisor's sign (numpy mod), fmod=1 the dividend's (C fmod)",
    infer=_infer_mod,
    attrs=[Attr("fmod", "int", 0)],
    plan=lambda ctx: K.binary_plan(ctx, K.FMOD if ctx.attrs["fmod"] else K.MOD),
)

Pow = register_op(
    "Pow",
    category="elementwise",
    inputs=[
        Input("X", (_dt.float32, _dt.float16, _dt.bfloat16, _dt.float64, _dt.int32, _dt.int64)),
        Input("Y", NUMERIC),
    ],
    outputs=["Z"],
    infer=_infer_pow,
    reference=_quiet(_ref_pow),
    doc="X ** Y (broadcasting); the result has X's dtype",
)
_pow_plan = functools.partial(K.binary_plan, op=K.POW)
Pow.kernel(
    "binary_numba",
    dtypes=NUMBA,
    priority=10,
    plan=_pow_plan,
    applies=lambda ctx: ctx.dtype(0) == ctx.dtype(1) or "X and Y differ in dtype",
)(K.binary)
Pow.kernel("pow_mixed", priority=5, plan=_pow_plan, doc="X and Y of different dtypes: int64 or float64 math")(
    K.pow_mixed
)


def _variadic_record(name, code, dtypes, reference, doc, mean=False):
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input("data_0", dtypes, variadic=True)],
        outputs=["result"],
        infer=_infer_variadic,
        reference=_quiet(reference),
        doc=doc,
    )
    plan = functools.partial(K.variadic_plan, op=code, mean=mean)
    rec.kernel(
        "variadic_numba",
        dtypes=NUMBA,
        priority=10,
        plan=plan,
        doc="folds the inputs into the output with the broadcasting walk",
    )(K.variadic)
    rec.kernel("variadic_numpy", priority=5, plan=plan)(K.variadic_numpy)
    return rec


Sum = _variadic_record(
    "Sum", K.ADD, FLOATS, lambda ins, a: functools.reduce(np.add, ins), "elementwise sum of all inputs (broadcasting)"
)
Mean = _variadic_record(
    "Mean",
    K.ADD,
    FLOATS,
    lambda ins, a: (functools.reduce(np.add, ins) / len(ins)).astype(ins[0].dtype),
    "elementwise mean of all inputs (broadcasting)",
    mean=True,
)
Max = _variadic_record(
    "Max",
    K.MAX,
    NUMERIC,
    lambda ins, a: functools.reduce(np.maximum, ins),
    "elementwise maximum of all inputs (broadcasting; NaN propagates)",
)
Min = _variadic_record(
    "Min",
    K.MIN,
    NUMERIC,
    lambda ins, a: functools.reduce(np.minimum, ins),
    "elementwise minimum of all inputs (broadcasting; NaN propagates)",
)


def _compare_record(name, code, reference, doc, dtypes=NUMERIC, infer=_infer_compare):
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input("A", dtypes), Input("B", dtypes)],
        outputs=["C"],
        infer=infer,
        reference=_quiet(reference),
        doc=doc,
    )
    plan = functools.partial(K.binary_plan, op=code)
    rec.kernel("compare_numba", dtypes=NUMBA, priority=10, plan=plan)(K.compare)
    rec.kernel("compare_numpy", priority=5, plan=plan)(K.compare_numpy)
    if code != K.EQ:  # Equal's schema takes strings; its bf16 use is rare
        rec.kernel(
            "compare_numba_bf16",
            dtypes=(_dt.bfloat16,),
            priority=11,  # before compare_numba, which takes bfloat16 through the fp32 adapter
            applies=_compare_bf16_applies,
            plan=lambda ctx: KBB.plan(math.prod(ctx.shape(0))),
            doc="bfloat16 against bfloat16 of one shape or one element: blocks widened, compared (no float32 copies)",
        )(lambda ins, outs, attrs, plan, ws, code=code: KBB.compare_bf16(ins[0], ins[1], outs[0], code, plan))
    return rec


def _compare_bf16_applies(ctx):
    a, b = ctx.inputs[0], ctx.inputs[1]
    if a.dtype != _dt.bfloat16 or b.dtype != _dt.bfloat16:
        return "bfloat16 inputs only"
    if tuple(b.shape) != tuple(a.shape) and math.prod(b.shape) != 1:
        return f"B of A's shape or one element only, got {tuple(a.shape)} and {tuple(b.shape)}"
    if math.prod(ctx.outputs[0].shape) != math.prod(a.shape):
        return "A's size must be the output's (B broadcast to A)"
    return True


Equal = _compare_record(
    "Equal", K.EQ, lambda ins, a: np.equal(*ins), "A == B (bool; strings too)", dtypes=None, infer=_infer_equal
)
Less = _compare_record("Less", K.LT, lambda ins, a: np.less(*ins), "A < B (bool)")
LessOrEqual = _compare_record("LessOrEqual", K.LE, lambda ins, a: np.less_equal(*ins), "A <= B (bool)")
Greater = _compare_record("Greater", K.GT, lambda ins, a: np.greater(*ins), "A > B (bool)")
GreaterOrEqual = _compare_record("GreaterOrEqual", K.GE, lambda ins, a: np.greater_equal(*ins), "A >= B (bool)")


def _ufunc_record(
    name,
    ufunc,
    dtypes,
    kernel_name,
    doc,
    out_bool=False,
    arity=2,
    attrs=(),
    infer=None,
    plan=None,
    kernel=None,
    reference=None,
):
    inputs = [Input("A", dtypes), Input("B", dtypes)] if arity == 2 else [Input("X", dtypes)]
    if infer is None:
        infer = (
            (_infer_compare if out_bool else _infer_binary)
            if arity == 2
            else (_infer_unary_bool if out_bool else _infer_unary)
        )
    rec = register_op(
        name,
        category="elementwise",
        inputs=inputs,
        outputs=["C" if arity == 2 else "Y"],
        attrs=attrs,
        infer=infer,
        doc=doc,
        reference=_quiet(reference or (lambda ins, a: ufunc(*ins))),
    )
    rec.kernel(kernel_name, priority=10, plan=plan, doc="numpy vectorized (rarely hot)")(
        kernel or K.ufunc_kernel(ufunc)
    )
    return rec


And = _ufunc_record("And", np.logical_and, BOOL, "logic_numpy", "A and B (bool)", out_bool=True)
Or = _ufunc_record("Or", np.logical_or, BOOL, "logic_numpy", "A or B (bool)", out_bool=True)
Xor = _ufunc_record("Xor", np.logical_xor, BOOL, "logic_numpy", "A xor B (bool)", out_bool=True)
Not = _ufunc_record("Not", np.logical_not, BOOL, "logic_numpy", "not X (bool)", arity=1)
BitwiseAnd = _ufunc_record("BitwiseAnd", np.bitwise_and, INTS, "bitwise_numpy", "A & B (integers)")
BitwiseOr = _ufunc_record("BitwiseOr", np.bitwise_or, INTS, "bitwise_numpy", "A | B (integers)")
BitwiseXor = _ufunc_record("BitwiseXor", np.bitwise_xor, INTS, "bitwise_numpy", "A ^ B (integers)")
BitwiseNot = _ufunc_record("BitwiseNot", np.invert, INTS, "bitwise_numpy", "~X (integers)", arity=1)
BitShift = register_op(
    "BitShift",
    category="elementwise",
    inputs=[Input("X", INTS), Input("Y", INTS)],
    outputs=["Z"],
    attrs=[Attr("direction", "string")],
    infer=_infer_bitshift,
    reference=_quiet(_ref_bitshift),
    doc="X << Y or X >> Y (arithmetic for signed); shifts outside [0, bits) give 0 (or -1 right of a negative)",
)
BitShift.kernel("bitshift_numpy", priority=10, plan=lambda ctx: _direction(ctx.attrs))(K.bitshift)

IsNaN = _ufunc_record(
    "IsNaN",
    np.isnan,
    FLOATS + K.FLOAT8,
    "isnan_numpy",
    "X is NaN (bool)",
    arity=1,
    out_bool=True,
    reference=lambda ins, a: np.isnan(ins[0].astype(np.float64)),
)
IsInf = _ufunc_record(
    "IsInf",
    np.isinf,
    FLOATS + K.FLOAT8,
    "isinf_numpy",
    "X is +inf (detect_positive) or -inf (detect_negative) (bool)",
    arity=1,
    out_bool=True,
    attrs=[Attr("detect_negative", "int", 1), Attr("detect_positive", "int", 1)],
    plan=lambda ctx: (bool(ctx.attrs["detect_negative"]), bool(ctx.attrs["detect_positive"])),
    kernel=K.isinf,
    reference=_ref_isinf,
)


def _unary_record(name, code, reference, doc, dtypes=FLOATS, domain=""):
    ints = builtins.any(dt.kind in "iu" for dt in dtypes)
    rec = register_op(
        name,
        category="elementwise",
        inputs=[Input("X", dtypes)],
        outputs=["Y"],
        infer=_infer_unary,
        reference=_quiet(reference),
        doc=doc,
        domain=domain,
    )
    plan = functools.partial(K.map_plan, op=code)
    rec.kernel(
        "unary_numba",
        dtypes=NUMBA if ints else NUMBA_FLOAT,
        priority=10,
        plan=plan,
        doc="numba flat map, parallel when large",
    )(K.unary)
    if code in K.NUMPY_SIMD:
        rec.kernel(
            "unary_simd",
            dtypes=NUMBA_FLOAT,
            priority=20,
            plan=plan,
            doc="numpy SIMD transcendental loop, chunked over threads when large",
        )(K.unary_simd)
    if ints:
        rec.kernel("unary_numpy", priority=5, plan=plan, doc="numpy (integer widths numba skips)")(K.unary_numpy)
    return rec


def _sign_ref(ins, attrs):
    x = ins[0]
    return np.sign(x) if x.dtype.kind in "iu" else np.sign(_wide(x)).astype(x.dtype)


Neg = _unary_record("Neg", K.U_NEG, lambda ins, a: np.negative(ins[0]), "-X", dtypes=FLOATS + SIGNED)
Abs = _unary_record("Abs", K.U_ABS, lambda ins, a: np.abs(ins[0]), "|X|", dtypes=NUMERIC)
Sign = _unary_record("Sign", K.U_SIGN, _sign_ref, "-1, 0 or 1 by the sign of X (NaN stays NaN)", dtypes=NUMERIC)
Exp = _unary_record("Exp", K.U_EXP, _float_map(np.exp), "e ** X")
Log = _unary_record("Log", K.U_LOG, _float_map(np.log), "natural logarithm")
Sqrt = _unary_record("Sqrt", K.U_SQRT, _float_map(np.sqrt), "square root")
Rsqrt = _unary_record("Rsqrt", K.U_RSQRT, _float_map(lambda x: 1.0 / np.sqrt(x)), "1 / sqrt(X)", domain="opsnn")
Floor = _unary_record("Floor", K.U_FLOOR, _float_map(np.floor), "round toward -inf")
Ceil = _unary_record("Ceil", K.U_CEIL, _float_map(np.ceil), "round toward +inf")
Round = _unary_record("Round", K.U_ROUND, _float_map(np.round), "round half to even")
Reciprocal = _unary_record("Reciprocal", K.U_RECIP, _float_map(lambda x: 1.0 / x), "1 / X")
Erf = _unary_record("Erf", K.U_ERF, _float_map(np.vectorize(math.erf, otypes=[np.float64])), "error function")
Sin = _unary_record("Sin", K.U_SIN, _float_map(np.sin), "sine")
Cos = _unary_record("Cos", K.U_COS, _float_map(np.cos), "cosine")
Tan = _unary_record("Tan", K.U_TAN, _float_map(np.tan), "tangent")
Asin = _unary_record("Asin", K.U_ASIN, _float_map(np.arcsin), "arcsine")
Acos = _unary_record("Acos", K.U_ACOS, _float_map(np.arccos), "arccosine")
Atan = _unary_record("Atan", K.U_ATAN, _float_map(np.arctan), "arctangent")
Sinh = _unary_record("Sinh", K.U_SINH, _float_map(np.sinh), "hyperbolic sine")
Cosh = _unary_record("Cosh", K.U_COSH, _float_map(np.cosh), "hyperbolic cosine")
Asinh = _unary_record("Asinh", K.U_ASINH, _float_map(np.arcsinh), "inverse hyperbolic sine")
Acosh = _unary_record("Acosh", K.U_ACOSH, _float_map(np.arccosh), "inverse hyperbolic cosine")
Atanh = _unary_record("Atanh", K.U_ATANH, _float_map(np.arctanh), "inverse hyperbolic tangent")

Clip = register_op(
    "Clip",
    category="elementwise",
    inputs=[Input("input", NUMERIC), Input("min", NUMERIC, optional=True), Input("max", NUMERIC, optional=True)],
    outputs=["output"],
    infer=_infer_clip,
    reference=_quiet(_ref_clip),
    doc="min(max(input, min), max); min/max are optional one-element inputs",
)
Clip.kernel("clip_numba", dtypes=NUMBA, priority=10, plan=K.map_plan)(K.clip)
Clip.kernel("clip_numpy", priority=5)(K.clip_numpy)

Where = register_op(
    "Where",
    category="elementwise",
    inputs=[Input("condition", BOOL), Input("X", NUMERIC + BOOL), Input("Y", NUMERIC + BOOL)],
    outputs=["output"],
    infer=_infer_where,
    reference=_quiet(lambda ins, a: np.where(*ins)),
    doc="X where condition else Y (broadcasting all three)",
)
Where.kernel(
    "where_numba",
    priority=10,
    plan=K.where_plan,
    applies=K.where_applies,
    doc="numba broadcasting walk over the bits of any 1/2/4/8-byte dtype",
)(K.where)
Where.kernel("where_numpy", priority=5)(K.where_numpy)

_CAST_ATTRS = [Attr("saturate", "int", 1), Attr("round_mode", "string", "up")]
Cast = register_op(
    "Cast",
    category="elementwise",
    inputs=[Input("input")],
    outputs=["output"],
    attrs=[Attr("to", "int")] + _CAST_ATTRS,
    infer=_infer_cast,
    reference=_quiet(_ref_cast),
    doc="convert to dtype 'to' (ONNX enum); float8 saturates unless saturate=0",
)
Cast.kernel("cast_numpy", priority=10, plan=K.cast_plan)(K.cast)
CastLike = register_op(
    "CastLike",
    category="elementwise",
    inputs=[Input("input"), Input("target_type")],
    outputs=["output"],
    attrs=_CAST_ATTRS,
    infer=_infer_cast_like,
    reference=_quiet(_ref_cast_like),
    doc="convert to the dtype of target_type",
)
CastLike.kernel("cast_numpy", priority=10, plan=K.cast_plan)(K.cast)


# -- functional entry points -------------------------------------------------------------------------------
def _is_tensor(v) -> bool:
    return isinstance(v, (Tensor, np.ndarray))


def _pair(x, y) -> list:
    """Both operands as tensors; a Python/numpy scalar takes the other operand's dtype."""
    if x is None or y is None:
        return [x, y]  # prepare raises ParamNullptrError naming the input
    if not _is_tensor(x) and _is_tensor(y):
        y = as_tensor(y)
        return [as_tensor(x, like=y), y]
    x = as_tensor(x)
    return [x, as_tensor(y, like=x)]


def _many(xs) -> list:
    """Variadic operands; scalars take the dtype of the first tensor among them."""
    like = next((as_tensor(v) for v in xs if _is_tensor(v)), None)
    return [None if v is None else as_tensor(v, like=like) for v in xs]


@api("add", "Add")
def add(input, other):
    """``input + other`` with broadcasting."""
    return _pair(input, other), {}


@api("sub", "Sub")
def sub(input, other):
    """``input - other`` with broadcasting."""
    return _pair(input, other), {}


@api("mul", "Mul")
def mul(input, other):
    """``input * other`` with broadcasting."""
    return _pair(input, other), {}


@api("div", "Div")
def div(input, other):
    """``input / other`` with broadcasting; integer division truncates toward zero."""
    return _pair(input, other), {}


@api("pow", "Pow")
def pow(input, exponent):
    """``input ** exponent`` with broadcasting; the result keeps ``input``'s dtype."""
    return _pair(input, exponent), {}


@api("remainder", "Mod")
def remainder(input, other):
    """Remainder with the divisor's sign (numpy ``mod``, Python ``%``)."""
    return _pair(input, other), {"fmod": 0}


@api("fmod", "Mod")
def fmod(input, other):
    """Remainder with the dividend's sign (C ``fmod``)."""
    return _pair(input, other), {"fmod": 1}


@api("add_n", "Sum")
def add_n(*inputs):
    """Elementwise sum of any number of tensors (broadcasting)."""
    return _many(inputs), {}


@api("mean_n", "Mean")
def mean_n(*inputs):
    """Elementwise mean of any number of tensors (broadcasting)."""
    return _many(inputs), {}


@api("maximum", "Max")
def maximum(input, *others):
    """Elementwise maximum of the tensors (broadcasting; NaN propagates)."""
    return _many((input,) + others), {}


@api("minimum", "Min")
def minimum(input, *others):
    """Elementwise minimum of the tensors (broadcasting; NaN propagates)."""
    return _many((input,) + others), {}


@api("eq", "Equal")
def eq(input, other):
    """``input == other`` (bool)."""
    return _pair(input, other), {}


@api("lt", "Less")
def lt(input, other):
    """``input < other`` (bool)."""
    return _pair(input, other), {}


@api("le", "LessOrEqual")
def le(input, other):
    """``input <= other`` (bool)."""
    return _pair(input, other), {}


@api("gt", "Greater")
def gt(input, other):
    """``input > other`` (bool)."""
    return _pair(input, other), {}


@api("ge", "GreaterOrEqual")
def ge(input, other):
    """``input >= other`` (bool)."""
    return _pair(input, other), {}


@api("logical_and", "And")
def logical_and(input, other):
    """Elementwise ``and`` of bool tensors."""
    return _pair(input, other), {}


@api("logical_or", "Or")
def logical_or(input, other):
    """Elementwise ``or`` of bool tensors."""
    return _pair(input, other), {}


@api("logical_xor", "Xor")
def logical_xor(input, other):
    """Elementwise ``xor`` of bool tensors."""
    return _pair(input, other), {}


@api("logical_not", "Not")
def logical_not(input):
    """Elementwise ``not`` of a bool tensor."""
    return [input], {}


@api("bitwise_and", "BitwiseAnd")
def bitwise_and(input, other):
    """``input & other`` on integers."""
    return _pair(input, other), {}


@api("bitwise_or", "BitwiseOr")
def bitwise_or(input, other):
    """``input | other`` on integers."""
    return _pair(input, other), {}


@api("bitwise_xor", "BitwiseXor")
def bitwise_xor(input, other):
    """``input ^ other`` on integers."""
    return _pair(input, other), {}


@api("bitwise_not", "BitwiseNot")
def bitwise_not(input):
    """``~input`` on integers."""
    return [input], {}


@api("bitwise_left_shift", "BitShift")
def bitwise_left_shift(input, other):
    """``input << other``; shifts outside [0, bits) give 0."""
    return _pair(input, other), {"direction": "LEFT"}


@api("bitwise_right_shift", "BitShift")
def bitwise_right_shift(input, other):
    """``input >> other`` (arithmetic for signed types)."""
    return _pair(input, other), {"direction": "RIGHT"}


def _unary(x) -> tuple:
    return [x], {}


@api("neg", "Neg")
def neg(input):
    """``-input``."""
    return _unary(input)


@api("abs", "Abs")
def abs(input):
    """``|input|``."""
    return _unary(input)


@api("sign", "Sign")
def sign(input):
    """-1, 0 or 1 by the sign of each element."""
    return _unary(input)


@api("exp", "Exp")
def exp(input):
    """``e ** input``."""
    return _unary(input)


@api("log", "Log")
def log(input):
    """Natural logarithm."""
    return _unary(input)


@api("sqrt", "Sqrt")
def sqrt(input):
    """Square root."""
    return _unary(input)


@api("rsqrt", "Rsqrt", domain="opsnn")
def rsqrt(input):
    """``1 / sqrt(input)``."""
    return _unary(input)


@api("floor", "Floor")
def floor(input):
    """Round toward -inf."""
    return _unary(input)


@api("ceil", "Ceil")
def ceil(input):
    """Round toward +inf."""
    return _unary(input)


@api("round", "Round")
def round(input):
    """Round half to even."""
    return _unary(input)


@api("reciprocal", "Reciprocal")
def reciprocal(input):
    """``1 / input``."""
    return _unary(input)


@api("erf", "Erf")
def erf(input):
    """Error function."""
    return _unary(input)


@api("sin", "Sin")
def sin(input):
    """Sine."""
    return _unary(input)


@api("cos", "Cos")
def cos(input):
    """Cosine."""
    return _unary(input)


@api("tan", "Tan")
def tan(input):
    """Tangent."""
    return _unary(input)


@api("asin", "Asin")
def asin(input):
    """Arcsine."""
    return _unary(input)


@api("acos", "Acos")
def acos(input):
    """Arccosine."""
    return _unary(input)


@api("atan", "Atan")
def atan(input):
    """Arctangent."""
    return _unary(input)


@api("sinh", "Sinh")
def sinh(input):
    """Hyperbolic sine."""
    return _unary(input)


@api("cosh", "Cosh")
def cosh(input):
    """Hyperbolic cosine."""
    return _unary(input)


@api("asinh", "Asinh")
def asinh(input):
    """Inverse hyperbolic sine."""
    return _unary(input)


@api("acosh", "Acosh")
def acosh(input):
    """Inverse hyperbolic cosine."""
    return _unary(input)


@api("atanh", "Atanh")
def atanh(input):
    """Inverse hyperbolic tangent."""
    return _unary(input)


@api("isnan", "IsNaN")
def isnan(input):
    """Which elements are NaN (bool)."""
    return _unary(input)


@api("isinf", "IsInf")
def isinf(input, detect_negative=True, detect_positive=True):
    """Which elements are infinite (bool); either sign can be left out."""
    return [input], {"detect_negative": int(detect_negative), "detect_positive": int(detect_positive)}


def _clip_args(input, min, max):
    x = as_tensor(input) if input is not None else None
    bound = [None if v is None else as_tensor(v, like=x) for v in (min, max)]
    return [x] + bound, {}


@api("clip", "Clip")
def clip(input, min=None, max=None):
    """``input`` limited to [min, max] (either bound optional; scalars or one-element tensors)."""
    return _clip_args(input, min, max)


@api("clamp", "Clip")
def clamp(input, min=None, max=None):
    """Alias of :func:`clip` (torch name)."""
    return _clip_args(input, min, max)


@api("where", "Where")
def where(condition, input, other):
    """``input`` where ``condition`` is true, else ``other`` (broadcasting all three)."""
    x, y = _pair(input, other)
    c = condition if condition is None or _is_tensor(condition) else as_tensor(np.asarray(condition, bool))
    return [c, x, y], {}


@api("cast", "Cast")
def cast(input, dtype, saturate=True, round_mode="up"):
    """``input`` converted to ``dtype`` (a name, numpy dtype or ONNX TensorProto enum);
    float8 targets saturate unless ``saturate=False``."""
    try:
        to = onnx_enum(dtype)
    except DTypeError:
        to = dtype  # shape inference raises the DTypeError (the API wrapper would rewrap it here)
    return [input], {"to": to, "saturate": int(saturate), "round_mode": round_mode}


@api("cast_like", "CastLike")
def cast_like(input, target, saturate=True):
    """``input`` converted to the dtype of ``target``."""
    return [input, target], {"saturate": int(saturate)}


__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "remainder",
    "fmod",
    "add_n",
    "mean_n",
    "maximum",
    "minimum",
    "eq",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "logical_not",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_not",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "neg",
    "abs",
    "sign",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "floor",
    "ceil",
    "round",
    "reciprocal",
    "erf",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "isnan",
    "isinf",
    "clip",
    "clamp",
    "where",
    "cast",
    "cast_like",
]
