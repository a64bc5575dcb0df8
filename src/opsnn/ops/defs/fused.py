"""Fused ops produced by the graph engine's fusion passes (domain ``opsnn``):
``FusedConv`` and ``FusedMatMul`` compute ``act(op(...) + bias + residual)`` with the
producer's own kernel followed by one in-place epilogue pass.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import InferShapeError, ParamInvalidError
from ...kernels.cpu import conv as KC
from ...kernels.cpu import fused as K
from ...kernels.cpu import gemm as KG
from ...kernels.cpu import gemm_packed as KP
from ...kernels.cpu import libraries as KL
from ...kernels.cpu import onednn as KD
from ..autotune import NotPreferred
from ..registry import Attr, InferContext, Input, TensorMeta, get_op, register_op, select_kernel
from .conv import bf16_bias, bf16_conv_plan
from .conv import bf16_rejection as conv_bf16_rejection
from .matmul import bf16_bias_columns, bf16_matmul_plan, packed_product_applies
from .matmul import bf16_rejection as mm_bf16_rejection

_F32_64 = (_dt.float32, _dt.float64)
_EPILOGUE_ATTRS = [
    Attr("activation", "string", ""),
    Attr("activation_alpha", "float", 0.01),
    Attr("activation_beta", "float", 0.0),
]


def _act_code(op: str, attrs: dict) -> int:
    act = attrs.get("activation") or ""
    act = act.decode() if isinstance(act, bytes) else act
    if act not in K.ACTIVATIONS:
        raise ParamInvalidError(
            f"{op}: attribute 'activation' must be one of {sorted(K.ACTIVATIONS)}, got {act!r}", op=op
        )
    return K.ACTIVATIONS[act]


def _act_reference(y: np.ndarray, code: int, alpha: float, beta: float) -> np.ndarray:
    import math

    if code == 0:
        return y
    if code == 1:
        return np.maximum(y, 0)
    if code == 2:
        return 1 / (1 + np.exp(-y))
    if code == 3:
        return np.tanh(y)
    if code == 4:
        erf = np.vectorize(math.erf)
        return 0.5 * y * (1 + erf(y / np.sqrt(2)))
    if code == 5:
        return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    if code == 6:
        return y / (1 + np.exp(-alpha * y))
    if code == 7:
        return np.where(y >= 0, y, alpha * y)
    return np.clip(y, alpha, beta)


def _inner_ctx(ctx: InferContext, op: str, n_inputs: int, inner_attrs: dict, *, adapted: bool = False) -> InferContext:
    """The inner op's context; ``adapted``: for a float32/64 kernel planned on 16-bit inputs, which the fp32
    adapter hands it widened, so its inner kernel must be chosen and planned for float32 (not bfloat16)."""
    rec = get_op(op)
    metas, values = list(ctx.inputs[:n_inputs]), list(ctx.values[:n_inputs])
    if adapted:
        wide = [m is not None and m.dtype in _dt.LOW_PRECISION for m in metas]
        metas = [TensorMeta(m.shape, np.dtype(np.float32)) if w else m for m, w in zip(metas, wide)]
        values = [np.asarray(v, np.float32) if w and v is not None else v for v, w in zip(values, wide)]
    inner = InferContext(rec, metas, rec.bind_attrs(inner_attrs), values, 1, ctx.device)
    rec.run_infer(inner)
    return inner


def _check_residual(ctx: InferContext, idx: int, out: TensorMeta) -> None:
    if ctx.has(idx) and tuple(ctx.shape(idx)) != tuple(out.shape):
        raise InferShapeError(
            f"{ctx.op.name}: residual input Z has shape {ctx.shape(idx)}, the output has {tuple(out.shape)}",
            op=ctx.op.name,
        )


# -- FusedConv ------------------------------------------------------------------------------------
_CONV_ATTR_NAMES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv_attrs(attrs: dict) -> dict:
    return {k: attrs[k] for k in _CONV_ATTR_NAMES if attrs.get(k) is not None}


def _fused_conv_infer(ctx):
    inner = _inner_ctx(ctx, "Conv", 3, _conv_attrs(ctx.attrs))
    _act_code(ctx.op.name, ctx.attrs)
    _check_residual(ctx, 3, inner.outputs[0])
    return inner.outputs


def _fused_conv_ref(ins, attrs):
    conv = get_op("Conv")
    y = conv.reference(ins[:3], conv.bind_attrs(_conv_attrs(attrs))).astype(np.float64)
    if len(ins) > 3 and ins[3] is not None:
        y = y + ins[3]
    y = _act_reference(y, _act_code("FusedConv", attrs), attrs["activation_alpha"], attrs["activation_beta"])
    return y.astype(ins[0].dtype)


def _fused_conv_plan(ctx):
    inner = _inner_ctx(ctx, "Conv", 3, _conv_attrs(ctx.attrs), adapted=True)
    sel = select_kernel(inner.op, inner)
    k = sel.kernel
    plan = k.plan(inner) if k.plan else None
    ws = k.workspace(inner, plan) if k.workspace else 0
    # "selection": what explain reports (it depends on the constant weight, which explain cannot see)
    # GEMM-based convs add their bias in a pass of its own: it joins the epilogue's pass instead
    # (Winograd, direct and depthwise kernels fold it into their own output loops)
    return {
        "kernel": k,
        "plan": plan,
        "ws": ws,
        "attrs": inner.attrs,
        "code": _act_code("FusedConv", ctx.attrs),
        "selection": sel,
        "bias_in_epilogue": getattr(plan, "kind", None) in KC.BIAS_PASS_KINDS,
    }


def _fused_conv_kernel(ins, outs, attrs, plan, ws):
    b = ins[2] if len(ins) > 2 else None
    bias_here = b is not None and plan["bias_in_epilogue"]
    plan["kernel"].fn([ins[0], ins[1], None if bias_here else b], outs, plan["attrs"], plan["plan"], ws)
    y = outs[0]
    z = ins[3] if len(ins) > 3 else None
    # NCHW: one row per (image, channel) plane
    rows = y.shape[0] * y.shape[1] if y.ndim >= 2 else 1
    K.epilogue(
        y.reshape(rows, -1),
        None,
        None if z is None else z.reshape(rows, -1),
        plan["code"],
        attrs["activation_alpha"],
        attrs["activation_beta"],
        row_bias=b if bias_here else None,
    )


def _conv_flops(ctx) -> int:
    conv = get_op("Conv")
    return conv.flops(_inner_ctx(ctx, "Conv", 3, _conv_attrs(ctx.attrs))) if conv.flops else 0


FusedConv = register_op(
    "FusedConv",
    domain="opsnn",
    category="conv",
    inputs=[
        Input("X", _dt.FLOATS),
        Input("W", _dt.FLOATS),
        Input("B", _dt.FLOATS, optional=True),
        Input("Z", _dt.FLOATS, optional=True),
    ],
    outputs=["Y"],
    attrs=[Attr(n, "any", None) for n in _CONV_ATTR_NAMES] + _EPILOGUE_ATTRS,
    infer=_fused_conv_infer,
    reference=_fused_conv_ref,
    flops=_conv_flops,
    doc="act(Conv(X, W, B) + Z): the conv kernel, then one in-place epilogue pass",
)
FusedConv.kernel(
    "conv_epilogue", dtypes=_F32_64, priority=10, plan=_fused_conv_plan, workspace=lambda ctx, plan: plan["ws"]
)(_fused_conv_kernel)


def _bf16_residual(ctx, idx: int = 3) -> str | None:
    if ctx.has(idx) and ctx.dtype(idx) != _dt.bfloat16:
        return f"the residual Z must be bfloat16 too, got {_dt.name(ctx.dtype(idx))}"
    return None


def _fused_conv_bf16_applies(ctx):
    return conv_bf16_rejection(_inner_ctx(ctx, "Conv", 3, _conv_attrs(ctx.attrs))) or _bf16_residual(ctx) or True


def _fused_conv_bf16_plan(ctx):
    inner = _inner_ctx(ctx, "Conv", 3, _conv_attrs(ctx.attrs))
    return {"conv": bf16_conv_plan(inner), "code": _act_code("FusedConv", ctx.attrs)}


def _fused_conv_bf16(ins, outs, attrs, plan, ws):
    p = plan["conv"]
    z = ins[3] if len(ins) > 3 else None
    KC.conv_forward_bf16(
        ins[0],
        outs[0],
        p.conv,
        ws,
        p.w2,
        bf16_bias(ins, p),
        z,
        plan["code"],
        attrs["activation_alpha"],
        attrs["activation_beta"],
    )


FusedConv.kernel(
    "conv_epilogue_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,
    applies=_fused_conv_bf16_applies,
    plan=_fused_conv_bf16_plan,
    workspace=lambda ctx, plan: plan["conv"].workspace_bytes,
    doc="bfloat16: the conv_mkl_bf16 GEMM into a float32 accumulator, bias + residual + activation "
    "on it, one rounding to bfloat16",
)(_fused_conv_bf16)


# -- FusedMatMul ---------------------------------------------------------------------------------------
def _fused_mm_infer(ctx):
    inner = _inner_ctx(ctx, "MatMul", 2, {})
    out = inner.outputs[0]
    _act_code(ctx.op.name, ctx.attrs)
    if ctx.has(2) and tuple(ctx.shape(2)) not in ((out.shape[-1],), ()):
        raise InferShapeError(
            f"FusedMatMul: bias has shape {ctx.shape(2)}, expected ({out.shape[-1]},)", op="FusedMatMul"
        )
    _check_residual(ctx, 3, out)
    return inner.outputs


def _fused_mm_ref(ins, attrs):
    y = np.matmul(ins[0].astype(np.float64), ins[1].astype(np.float64))
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    if len(ins) > 3 and ins[3] is not None:
        y = y + ins[3]
    y = _act_reference(y, _act_code("FusedMatMul", attrs), attrs["activation_alpha"], attrs["activation_beta"])
    return y.astype(ins[0].dtype)


def _fused_mm_plan(ctx):
    inner = _inner_ctx(ctx, "MatMul", 2, {}, adapted=True)
    sel = select_kernel(inner.op, inner)
    k = sel.kernel
    code = _act_code("FusedMatMul", ctx.attrs)
    shape = ctx.outputs[0].shape
    rows, n = int(np.prod(shape[:-1])), int(shape[-1]) if shape else 1
    product = KL.kernel_choice(k.name, rows, int(ctx.shape(0)[-1]) if ctx.shape(0) else 1, n, ctx.dtype(0))
    serial = product is not None and KL.serial_epilogue(product.library, rows * n, K.costly(code))
    return {
        "kernel": k,
        "plan": k.plan(inner) if k.plan else None,
        "code": code,
        "selection": sel,
        "parallel": False if serial else None,
    }


def _fused_mm_with(epilogue):
    """The FusedMatMul kernel: the planned inner product, then ``epilogue`` (numba or numpy) in place."""

    def kernel(ins, outs, attrs, plan, ws):
        plan["kernel"].fn(ins[:2], outs, {}, plan["plan"], None)
        epilogue(
            outs[0],
            ins[2] if len(ins) > 2 else None,
            ins[3] if len(ins) > 3 else None,
            plan["code"],
            attrs["activation_alpha"],
            attrs["activation_beta"],
        )

    return kernel


def _fused_mm_kernel(ins, outs, attrs, plan, ws):
    """The inner product, then the numba epilogue on the threads the plan chose (None: by size)."""
    plan["kernel"].fn(ins[:2], outs, {}, plan["plan"], None)
    K.epilogue(
        outs[0],
        ins[2] if len(ins) > 2 else None,
        ins[3] if len(ins) > 3 else None,
        plan["code"],
        attrs["activation_alpha"],
        attrs["activation_beta"],
        parallel=plan.get("parallel"),
    )


FusedMatMul = register_op(
    "FusedMatMul",
    domain="opsnn",
    category="matmul",
    inputs=[
        Input("A", _dt.FLOATS),
        Input("B", _dt.FLOATS),
        Input("bias", _dt.FLOATS, optional=True),
        Input("Z", _dt.FLOATS, optional=True),
    ],
    outputs=["Y"],
    attrs=_EPILOGUE_ATTRS,
    infer=_fused_mm_infer,
    reference=_fused_mm_ref,
    flops=lambda ctx: 2 * int(np.prod(ctx.outputs[0].shape)) * int(ctx.shape(0)[-1]) if ctx.outputs else 0,
    doc="act(A @ B + bias + Z): BLAS GEMM, then one in-place epilogue pass",
)
FusedMatMul.kernel(
    "matmul_epilogue", dtypes=_F32_64, priority=10, plan=_fused_mm_plan, cold_alternative="matmul_epilogue_numpy"
)(_fused_mm_kernel)


def _numpy_epilogue_applies(ctx):
    code = _act_code(ctx.op.name, ctx.attrs)
    if code not in K.NUMPY_ACTIVATIONS:
        return f"activation {ctx.attrs['activation']!r} has no numpy epilogue (only none, Relu, Gelu)"
    return True


_fused_mm_numpy_kernel = _fused_mm_with(K.epilogue_numpy)


FusedMatMul.kernel(
    "matmul_epilogue_numpy",
    dtypes=_F32_64,
    priority=4,
    applies=_numpy_epilogue_applies,
    plan=_fused_mm_plan,
    doc="matmul_epilogue with the epilogue in numpy (none, Relu, Gelu): nothing to compile, the first "
    "run's kernel while matmul_epilogue compiles in the background (ops/tiering.py)",
)(_fused_mm_numpy_kernel)


def _fused_mm_onednn_applies(ctx):
    dt = ctx.dtype(0)
    why = KD.product_unavailable(dt)
    if why is not None:
        return why
    w = ctx.value(1)
    if w is None or np.ndim(w) != 2:
        return "B is not a constant 2-D matrix known at prepare time (graph initializer)"
    n = ctx.outputs[0].shape[-1]
    if ctx.has(2) and (ctx.dtype(2) != dt or tuple(ctx.shape(2)) != (n,)):
        return f"bias must be {_dt.name(dt)} of shape ({n},), got {_dt.name(ctx.dtype(2))} {tuple(ctx.shape(2))}"
    if ctx.has(3) and ctx.dtype(3) != dt:
        return f"the residual must be {_dt.name(dt)} too"
    if 0 in ctx.outputs[0].shape or ctx.shape(0)[-1] == 0:
        return "empty product"
    rows = int(np.prod(ctx.outputs[0].shape[:-1]))
    if rows < ONEDNN_MIN_ROWS:
        return NotPreferred(
            f"{rows} row (< ONEDNN_MIN_ROWS = {ONEDNN_MIN_ROWS}): the matrix-vector kernels are as fast"
        )
    why = KL.epilogue_product_rejection(dt)
    return True if why is None else NotPreferred(why)


#: fewest rows for which FusedMatMul prefers oneDNN's matmul (one row is a tie: the matrix-vector
#: kernels stay; figures: docs/performance.md, "Products with a constant weight")
ONEDNN_MIN_ROWS = 2


def _fused_mm_onednn_plan(ctx):
    rows = int(np.prod(ctx.outputs[0].shape[:-1]))
    return KD.MatMulPrimitive(
        rows,
        np.asarray(ctx.value(1)),
        has_bias=ctx.has(2),
        residual=ctx.has(3),
        act=_act_code("FusedMatMul", ctx.attrs),
        alpha=float(ctx.attrs["activation_alpha"]),
        beta=float(ctx.attrs["activation_beta"]),
    )


def epilogue_args(ins, outs) -> tuple:
    """(X, bias or None, residual or None, Y) of a call of an op with inputs (X, W, B, Z): FusedMatMul,
    FusedConv, BlockedConv."""
    return ins[0], ins[2] if len(ins) > 2 else None, ins[3] if len(ins) > 3 else None, outs[0]


def _fused_mm_onednn(ins, outs, attrs, plan, ws):
    plan(*epilogue_args(ins, outs))


def _fused_mm_onednn_bind(ins, outs, attrs, plan, ws):
    return plan.bind(*epilogue_args(ins, outs))


FusedMatMul.kernel(
    "matmul_onednn",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=12,
    applies=_fused_mm_onednn_applies,
    plan=_fused_mm_onednn_plan,
    bind=_fused_mm_onednn_bind,
    cold_alternative="matmul_onednn_numpy",
    doc="float32 (or bfloat16 with AVX512-BF16) with a constant 2-D B: oneDNN's matmul (brgemm) on "
    "B reordered once at prepare, the bias, residual add and activation as post-ops (no separate "
    "epilogue pass)",
)(_fused_mm_onednn)


def _fused_mm_packed_applies(ctx):
    ok = packed_product_applies(ctx)  # first: it refuses a 1-D A (a scalar output has no columns)
    if ok is not True and not isinstance(ok, NotPreferred):
        return ok
    n = ctx.outputs[0].shape[-1]
    if ctx.has(2) and (ctx.dtype(2) != _dt.float32 or tuple(ctx.shape(2)) != (n,)):
        return f"bias must be float32 of shape ({n},), got {_dt.name(ctx.dtype(2))} {tuple(ctx.shape(2))}"
    if ctx.has(3) and (ctx.dtype(3) != _dt.float32 or tuple(ctx.shape(3)) != tuple(ctx.outputs[0].shape)):
        return "the residual must be float32 of the output's shape"
    return ok


def _fused_mm_packed_plan(ctx):
    return {"panels": KP.pack(np.asarray(ctx.value(1))), "code": _act_code("FusedMatMul", ctx.attrs)}


def _fused_mm_packed(ins, outs, attrs, plan, ws):
    x, bias, z, y = epilogue_args(ins, outs)
    KP.product(x, plan["panels"], y)
    K.epilogue(y, bias, z, plan["code"], attrs["activation_alpha"], attrs["activation_beta"])


FusedMatMul.kernel(
    "matmul_packed",
    dtypes=(_dt.float32,),
    priority=11,
    applies=_fused_mm_packed_applies,
    plan=_fused_mm_packed_plan,
    cold_alternative="matmul_epilogue_numpy",
    doc="float32 with a constant 2-D B on AVX2 CPUs without MKL: opsnn's packed GEMM (B in panels of 16 "
    "columns, packed once at prepare; a 6 x 16 register tile), then one in-place epilogue pass",
)(_fused_mm_packed)


def _fused_mm_onednn_numpy_applies(ctx):
    why = _fused_mm_onednn_applies(ctx)
    if why is not True:
        return why
    if _act_code(ctx.op.name, ctx.attrs) not in KD.NOT_IEEE:
        return "oneDNN runs this activation as a post-op: matmul_onednn compiles nothing"
    return _numpy_epilogue_applies(ctx)


def _fused_mm_onednn_numpy_plan(ctx):
    rows = int(np.prod(ctx.outputs[0].shape[:-1]))
    prim = KD.MatMulPrimitive(rows, np.asarray(ctx.value(1)), has_bias=ctx.has(2), residual=ctx.has(3), act=0)
    return prim, _act_code("FusedMatMul", ctx.attrs)


def _fused_mm_onednn_numpy(ins, outs, attrs, plan, ws):
    prim, code = plan
    prim(*epilogue_args(ins, outs))
    K.epilogue_numpy(outs[0], None, None, code, 0.0, 0.0)


FusedMatMul.kernel(
    "matmul_onednn_numpy",
    dtypes=(_dt.float32,),
    priority=3,
    applies=_fused_mm_onednn_numpy_applies,
    plan=_fused_mm_onednn_numpy_plan,
    doc="matmul_onednn with its non-IEEE activation (Relu, Gelu) in numpy instead of a numba epilogue: "
    "nothing to compile, the first run's kernel while matmul_onednn compiles in the background",
)(_fused_mm_onednn_numpy)


def _fused_mm_bf16_applies(ctx):
    return mm_bf16_rejection(_inner_ctx(ctx, "MatMul", 2, {})) or _bf16_residual(ctx) or True


def _fused_mm_bf16_plan(ctx):
    inner = _inner_ctx(ctx, "MatMul", 2, {})
    n = ctx.outputs[0].shape[-1]
    return {
        "mm": bf16_matmul_plan(inner),
        "code": _act_code("FusedMatMul", ctx.attrs),
        "bias": bf16_bias_columns(ctx.value(2), n) if ctx.has(2) else None,
    }


def _fused_mm_bf16(ins, outs, attrs, plan, ws):
    b = plan["bias"]
    if b is None and len(ins) > 2 and ins[2] is not None:
        b = np.broadcast_to(ins[2].astype(np.float32), (outs[0].shape[-1],))
    KG.matmul_bf16(
        ins[0],
        plan["mm"],
        outs[0],
        ws,
        bias=b,
        z=ins[3] if len(ins) > 3 else None,
        code=plan["code"],
        act_alpha=attrs["activation_alpha"],
        act_beta=attrs["activation_beta"],
    )


FusedMatMul.kernel(
    "matmul_epilogue_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,
    applies=_fused_mm_bf16_applies,
    plan=_fused_mm_bf16_plan,
    workspace=lambda ctx, plan: KG.bf16_workspace(ctx.outputs[0].shape),
    doc="bfloat16 with a constant B: MKL's bf16 GEMM into a float32 accumulator, bias + residual + "
    "activation on it, one rounding",
)(_fused_mm_bf16)


__all__: list[str] = []


# -- FusedElementwise -----------------------------------------------------------------------------------
def _program(op: str, attrs: dict) -> list:
    import json

    from ...kernels.cpu.codegen import TEMPLATES

    prog = attrs.get("program")
    prog = json.loads(prog.decode() if isinstance(prog, bytes) else prog) if isinstance(prog, (str, bytes)) else prog
    if not isinstance(prog, list) or not prog:
        raise ParamInvalidError(f"{op}: attribute 'program' must be a non-empty JSON list of steps", op=op)
    for step in prog:
        if step[0] not in TEMPLATES:
            raise ParamInvalidError(
                f"{op}: program step op {step[0]!r} is not fusible; fusible: {sorted(TEMPLATES)}", op=op
            )
    return prog


def _fused_ew_infer(ctx):
    shape = tuple(ctx.shape(0))
    for i in range(1, len(ctx.inputs)):
        if tuple(ctx.shape(i)) != shape or ctx.dtype(i) != ctx.dtype(0):
            raise InferShapeError(
                f"FusedElementwise: input {i} is {ctx.shape(i)} {ctx.dtype(i)}, expected {shape} "
                f"{ctx.dtype(0)} (fused chains take same-shape inputs)",
                op="FusedElementwise",
            )
    _program("FusedElementwise", ctx.attrs)
    return [TensorMeta(shape, ctx.dtype(0))]


def _fused_ew_ref(ins, attrs):
    """The unfused graph's semantics: each step is its op's own reference on tensors of the chain's
    dtype, so every intermediate is rounded as the unfused graph stores it (Floor(Erf(4.195)) is
    Floor of float32 1.0, not of float64 0.99999999...)."""
    prog = _program("FusedElementwise", attrs)
    dt = ins[0].dtype
    steps: list = []
    for op, args, step_attrs in prog:
        operands = []
        for kind, val in args:
            if kind == "in":
                operands.append(ins[val])
            elif kind == "step":
                operands.append(steps[val])
            else:
                operands.append(np.asarray(float(val), dtype=dt))
        if op == "ReluGrad":  # the step stands for Where(Greater(y, 0), g, 0), not for a registry op
            steps.append(np.where(operands[1] > 0, operands[0], np.zeros((), dt)).astype(dt, copy=False))
            continue
        if op == "ThresholdGrad":  # Where(LessOrEqual(y, threshold), 0, g): torch's threshold_backward
            t = dt.type(float((step_attrs or {}).get("threshold", 0.0)))
            steps.append(np.where(operands[1] <= t, np.zeros((), dt), operands[0]).astype(dt, copy=False))
            continue
        rec = get_op(op)
        res = rec.reference(operands, rec.bind_attrs(dict(step_attrs or {})))
        steps.append(np.asarray(res[0] if isinstance(res, (list, tuple)) else res).astype(dt, copy=False))
    return np.ascontiguousarray(np.broadcast_to(steps[-1], ins[0].shape))


def _fused_ew_plan(ctx):
    from ...kernels.cpu.codegen import get_kernel

    par, ser = get_kernel(_program("FusedElementwise", ctx.attrs), len(ctx.inputs))
    return par if int(np.prod(ctx.shape(0))) >= (1 << 15) else ser


def _fused_ew_kernel(ins, outs, attrs, plan, ws):
    plan(outs[0].reshape(-1), *[a.reshape(-1) for a in ins])


FusedElementwise = register_op(
    "FusedElementwise",
    domain="opsnn",
    category="elementwise",
    inputs=[Input("X", _dt.FLOATS, variadic=True)],
    outputs=["Y"],
    attrs=[Attr("program", "string")],
    infer=_fused_ew_infer,
    reference=_fused_ew_ref,
    doc="a chain of elementwise ops as one generated numba kernel (one pass over memory)",
)
FusedElementwise.kernel("elementwise_codegen", dtypes=_F32_64, priority=10, plan=_fused_ew_plan)(_fused_ew_kernel)
