"""Matrix-multiply ops: MatMul, Gemm, Linear (opsnn domain), Einsum and the integer /
quantized matmuls (MatMulInteger, QLinearMatMul) — records, kernels, entry points.

>>> import opsnn, numpy as np
>>> a = opsnn.tensor(np.ones((2, 3, 4), np.float32))
>>> opsnn.ops.matmul(a, opsnn.tensor(np.ones((4, 5), np.float32))).shape
(2, 3, 5)
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError
from ...kernels.cpu import gemm as K
from ...kernels.cpu import gemm_packed as KP
from ...kernels.cpu import libraries as KL
from ...kernels.cpu import mkl as KM
from ...kernels.cpu import onednn as KD
from ...tensor import as_tensor
from ..api import api
from ..autotune import NotPreferred
from ..registry import Attr, Input, TensorMeta, register_op

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
_INTS_MM = (_dt.int32, _dt.int64, _dt.uint32, _dt.uint64)
_Q8 = (_dt.uint8, _dt.int8)
_SCALES = (_dt.float32, _dt.float16, _dt.bfloat16)


def _same_dtype(ctx, *idx) -> np.dtype:
    dt = ctx.dtype(idx[0])
    for i in idx[1:]:
        if ctx.has(i) and ctx.dtype(i) != dt:
            a, b = ctx.op.input_spec(idx[0]).name, ctx.op.input_spec(i).name
            if a == b:  # variadic: name them by position
                a, b = f"{a}[{idx[0]}]", f"{b}[{i}]"
            raise DTypeError(
                f"{ctx.op.name}: inputs {a!r} ({_dt.name(dt)}) and {b!r} ({_dt.name(ctx.dtype(i))}) "
                "must have the same dtype",
                op=ctx.op.name,
            )
    return dt


def _broadcast(ctx, what: str, s1: tuple, s2: tuple) -> tuple:
    """Numpy broadcasting of two shapes with a message naming both."""
    n = max(len(s1), len(s2))
    a = (1,) * (n - len(s1)) + tuple(s1)
    b = (1,) * (n - len(s2)) + tuple(s2)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            ctx.fail(f"{what}: shapes {tuple(s1)} and {tuple(s2)} do not broadcast (dim {x} vs {y})")
        out.append(y if x == 1 else x)
    return tuple(out)


def matmul_shape(ctx, sa: tuple, sb: tuple) -> tuple:
    """numpy.matmul's output shape (1-D operands promoted then squeezed)."""
    if len(sa) == 0 or len(sb) == 0:
        ctx.fail(f"operands must be at least 1-D, got A {tuple(sa)} and B {tuple(sb)}")
    a = (1,) + tuple(sa) if len(sa) == 1 else tuple(sa)
    b = tuple(sb) + (1,) if len(sb) == 1 else tuple(sb)
    if a[-1] != b[-2]:
        ctx.fail(f"inner dimensions differ: A {tuple(sa)} has K={a[-1]}, B {tuple(sb)} has K={b[-2]}")
    batch = _broadcast(ctx, "batch dims", a[:-2], b[:-2])
    out = batch + ((a[-2],) if len(sa) > 1 else ()) + ((b[-1],) if len(sb) > 1 else ())
    return out


def _mm_flops(ctx, a: int, b: int) -> int:
    """2 * (output elements) * K: the multiply-adds of a matmul."""
    return 2 * math.prod(ctx.outputs[0].shape) * ctx.shape(a)[-1]


# -- MatMul -------------------------------------------------------------------------------------
def _matmul_infer(ctx):
    dt = _same_dtype(ctx, 0, 1)
    return [TensorMeta(matmul_shape(ctx, ctx.shape(0), ctx.shape(1)), dt)]


def _matmul_ref(ins, attrs):
    a, b = ins
    if _dt.is_low_precision(a.dtype):
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b)


def _matmul_plan(ctx):
    return K.matmul_plan(ctx.shape(0), ctx.shape(1))


MatMul = register_op(
    "MatMul",
    category="matmul",
    inputs=[Input("A", FLOAT + _INTS_MM), Input("B", FLOAT + _INTS_MM)],
    outputs=["Y"],
    infer=_matmul_infer,
    reference=_matmul_ref,
    flops=lambda ctx: _mm_flops(ctx, 0, 1),
    doc="Matrix product with numpy.matmul semantics (batched, broadcast batch dims, 1-D operands).",
)
MatMul.kernel(
    "matmul_blas",
    dtypes=_F32_64,
    priority=10,
    plan=_matmul_plan,
    strided=True,
    doc="OpenBLAS sgemm/dgemm; a (..., M, K) @ (K, N) batch is folded into one GEMM",
)(K.matmul)

#: fp16 MatMul with at most this many rows of A runs the tiled kernel by default: numpy's
#: fp16 -> fp32 cast of B then dominates the adapter path (docs/performance.md, "Low precision")
LOWP_MAX_ROWS_F16 = 32


def _prepacked_applies(ctx):
    if ctx.value(1) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if len(ctx.shape(1)) != 2:
        return "needs a 2-D constant weight"
    if ctx.dtype(0) != _dt.float16:
        # packing pays for fp16 only: bf16's widening is a shift, no dearer than reading a cold
        # fp32 copy (docs/performance.md, "Low precision")
        return NotPreferred(
            f"{_dt.name(ctx.dtype(0))} weights: converting per call costs no more than reading "
            "a pre-packed fp32 copy (packing pays off for float16)"
        )
    return True


def _matmul_prepacked_plan(ctx):
    return K.pack_weight(ctx.value(1), transpose=False)


def _packed_workspace(ctx, plan):
    return K.packed_workspace(ctx.outputs[0].shape, ctx.outputs[0].dtype, plan)


def _mkl_packed_applies(ctx):
    """MKL's packed SGEMM for a float32 product with a constant 2-D right operand."""
    why = KM.unavailable()
    if why is not None:
        return why
    if ctx.value(1) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if len(ctx.shape(1)) != 2:
        return "needs a 2-D constant weight"
    if ctx.dtype(0) != _dt.float32:
        return f"float32 only, got {_dt.name(ctx.dtype(0))}"
    if min(ctx.shape(1)) == 0:
        return "empty weight"
    if _rows(ctx.shape(0)) == 1:
        return NotPreferred(
            "one row: a matrix-vector product reads the weight once either way, and MKL's packed "
            "compute was 4x slower than BLAS there (1x768 @ 768x3072: 1.21 vs 0.29 ms)"
        )
    k, n = ctx.shape(1)[::-1] if ctx.op.name == "Linear" else ctx.shape(1)
    why = KL.packed_panel_rejection(_rows(ctx.shape(0)), k, n)
    return True if why is None else NotPreferred(why)


def _rows(shape: tuple) -> int:
    return math.prod(shape[:-1]) if len(shape) > 1 else 1


def _matmul_mkl_plan(ctx):
    return KM.pack(ctx.value(1), _rows(ctx.shape(0)), transpose=False)


def _matmul_mkl(ins, outs, attrs, plan, ws):
    KM.gemm(ins[0].reshape(-1, plan.k), plan, outs[0].reshape(-1, plan.n))


def bf16_rejection(ctx, weight_index: int = 1) -> str | None:
    """None when MKL's bfloat16 GEMM can run this product: bfloat16 operands, a constant 2-D
    right operand known at prepare time."""
    why = KM.bf16_unavailable()
    if why is not None:
        return why
    if ctx.dtype(0) != _dt.bfloat16 or ctx.dtype(weight_index) != _dt.bfloat16:
        return f"bfloat16 operands only, got {_dt.name(ctx.dtype(0))} and {_dt.name(ctx.dtype(weight_index))}"
    if ctx.value(weight_index) is None:
        return "the weight is not a constant known at prepare time (graph initializer)"
    if len(ctx.shape(weight_index)) != 2 or min(ctx.shape(weight_index)) == 0:
        return "needs a non-empty 2-D constant weight"
    return None


def bf16_bias_columns(value, n: int):
    """A constant bias as float32 per output column, or None when it does not broadcast that way."""
    if value is None:
        return None
    b = np.asarray(value).astype(np.float32)
    return b.reshape(-1) if b.size == n and b.ndim <= 2 and (b.ndim < 2 or b.shape[0] == 1) else None


def bf16_matmul_plan(ctx, transpose: bool = False, weight_index: int = 1) -> K.Bf16Plan:
    w = np.ascontiguousarray(np.asarray(ctx.value(weight_index)).view(np.uint16))
    return K.Bf16Plan(w.T if transpose else w, None)


def _bf16_ws(ctx, plan):
    return K.bf16_workspace(ctx.outputs[0].shape)


MatMul.kernel(
    "matmul_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=35,
    applies=lambda ctx: bf16_rejection(ctx) or True,
    plan=bf16_matmul_plan,
    workspace=_bf16_ws,
    doc="bfloat16 with a constant B: MKL's bf16 GEMM (cblas_gemm_bf16bf16f32: AMX / AVX512-BF16) on "
    "the weight as stored, fp32 accumulation, one rounding",
)(lambda ins, outs, attrs, plan, ws: K.matmul_bf16(ins[0], plan, outs[0], ws))


def _runtime_rejection(ctx, idx: tuple, shape, bias: bool = False) -> str | None:
    """Why a product of ``idx`` inputs, one oneDNN matmul of ``shape`` (batch, m, k, n) or a string
    saying why it is not one, is not for :class:`KD.RuntimeMatMul` (None when it is): bfloat16
    operands where oneDNN has native bf16 code, float32 ones where the strategy gives them oneDNN's
    brgemm (:func:`KL.runtime_f32_product`; ``bias``: the product adds a bias vector)."""
    dts = {ctx.dtype(i) for i in idx}
    if dts == {_dt.bfloat16}:
        why = KL.runtime_bf16_product()
    elif dts == {np.dtype(np.float32)}:
        why = (
            None
            if isinstance(shape, str)
            else KL.runtime_f32_product(shape[1], shape[2], shape[3], shape[0], bias=bias)
        )
    else:
        return f"bfloat16 or float32 operands only, got {sorted(_dt.name(d) for d in dts)}"
    return why or (shape if isinstance(shape, str) else None)


def _matmul_runtime_shape(sa: tuple, sb: tuple):
    """(batch, m, k, n) of a MatMul as one oneDNN matmul over contiguous operands, or why not."""
    if len(sa) < 2 or len(sb) < 2:
        return "1-D operands"
    if len(sb) == 2:  # (..., M, K) @ (K, N): one (rows, K) @ (K, N) product
        batch, m = 1, math.prod(sa[:-1])
    elif tuple(sa[:-2]) == tuple(sb[:-2]):
        batch, m = math.prod(sa[:-2]), sa[-2]
    else:
        return f"batch dims {tuple(sa[:-2])} and {tuple(sb[:-2])} broadcast"
    shape = (batch, m, sa[-1], sb[-1])
    return "empty product" if 0 in shape else shape


def _matmul_runtime_applies(ctx):
    why = _runtime_rejection(ctx, (0, 1), _matmul_runtime_shape(ctx.shape(0), ctx.shape(1)))
    return True if why is None else why


def _matmul_runtime(ins, outs, attrs, plan, ws):
    plan.run(ins[0], ins[1], None, outs[0])


MatMul.kernel(
    "matmul_onednn_runtime",
    dtypes=(_dt.bfloat16, _dt.float32),
    priority=25,
    applies=_matmul_runtime_applies,
    plan=lambda ctx: KD.runtime_matmul(*_matmul_runtime_shape(ctx.shape(0), ctx.shape(1)), dtype=ctx.dtype(0)),
    bind=lambda ins, outs, attrs, plan, ws: plan.bind(ins[0], ins[1], None, outs[0]),
    doc="operands both known at run time (eager autocast, backward products), a 2-D B or equal batch dims: "
    "oneDNN's matmul on the operands as they are; bfloat16 natively (fp32 accumulation, one rounding), "
    "float32 where the strategy picks oneDNN's brgemm over BLAS",
)(_matmul_runtime)


MatMul.kernel(
    "matmul_mkl_packed",
    dtypes=(_dt.float32,),
    priority=30,
    applies=_mkl_packed_applies,
    plan=_matmul_mkl_plan,
    doc="constant B packed once at prepare by Intel MKL (cblas_sgemm_pack); per call one "
    "cblas_sgemm_compute on the packed panel (what onnxruntime's MLAS does)",
)(_matmul_mkl)


def packed_product_applies(ctx):
    """Whether ``A @ B`` (inputs 0 and 1) runs on opsnn's packed GEMM: float32, B a constant 2-D matrix,
    A of any rank as rows; a NotPreferred where the strategy leaves it to a library
    (:func:`KL.own_packed_rejection`)."""
    if ctx.dtype(0) != _dt.float32 or ctx.dtype(1) != _dt.float32:
        return "float32 operands only"
    w = ctx.value(1)
    if w is None or np.ndim(w) != 2 or len(ctx.shape(0)) < 2:
        return "B is not a constant 2-D matrix known at prepare time (graph initializer), or A is 1-D"
    if 0 in ctx.outputs[0].shape or ctx.shape(0)[-1] == 0:
        return "empty product"
    why = KL.own_packed_rejection(math.prod(ctx.outputs[0].shape[:-1]), ctx.dtype(0))
    return True if why is None else NotPreferred(why)


MatMul.kernel(
    "matmul_packed",
    dtypes=(_dt.float32,),
    priority=28,
    applies=packed_product_applies,
    plan=lambda ctx: KP.pack(np.asarray(ctx.value(1))),
    cold_alternative="matmul_blas",
    doc="float32 with a constant 2-D B on AVX2 CPUs without MKL: opsnn's packed GEMM (B in panels of 16 "
    "columns, packed once at prepare; a 6 x 16 register tile); OpenBLAS would pack B on every call",
)(lambda ins, outs, attrs, plan, ws: KP.product(ins[0], plan, outs[0]))
MatMul.kernel(
    "matmul_prepacked",
    dtypes=FLOAT,
    priority=20,
    applies=_prepacked_applies,
    plan=_matmul_prepacked_plan,
    workspace=_packed_workspace,
    doc="constant fp16 B converted to fp32 once at prepare; per call only A is converted, "
    "then BLAS into the workspace and one rounding into the output",
)(K.matmul_packed)


def _lowp_applies(ctx):
    sa, sb = ctx.shape(0), ctx.shape(1)
    why = K.lowp_applies(sa, sb)
    if why is not None:
        return why
    rows = math.prod(sa[:-1]) if len(sb) == 2 else sa[-2]
    if ctx.dtype(0) == _dt.float16 and rows <= LOWP_MAX_ROWS_F16:
        return True
    return NotPreferred(
        f"{rows} rows of {_dt.name(ctx.dtype(0))}: BLAS on fp32 copies is faster "
        f"(the tiled kernel wins only for float16 with <= {LOWP_MAX_ROWS_F16} rows)"
    )


def _lowp_plan(ctx):
    return K.lowp_plan(ctx.shape(0), ctx.shape(1), ctx.dtype(0))


MatMul.kernel(
    "matmul_tiled_lowp",
    dtypes=_dt.LOW_PRECISION,
    priority=12,
    applies=_lowp_applies,
    plan=_lowp_plan,
    doc="numba tiled GEMM on fp16/bf16 storage (panels widened in cache, fp32 accumulation, "
    "round-to-nearest-even stores); plan.tile_size columns per panel",
)(K.matmul_lowp)
MatMul.kernel(
    "matmul_numpy_int",
    dtypes=_INTS_MM,
    priority=5,
    plan=_matmul_plan,
    strided=True,
    doc="numpy integer matmul (no BLAS for integers); wraps around on overflow",
)(K.matmul_int)


@api("matmul", "MatMul")
def matmul(a, b):
    """``a @ b`` with numpy semantics: batch dims broadcast, 1-D operands promoted and squeezed.

    >>> import opsnn, numpy as np
    >>> opsnn.ops.matmul(np.ones((3, 4), np.float32), np.ones(4, np.float32)).shape
    (3,)
    """
    return [a, b], {}


# -- Gemm ---------------------------------------------------------------------------------------
def _gemm_infer(ctx):
    dt = _same_dtype(ctx, 0, 1, 2)
    sa, sb = ctx.shape(0), ctx.shape(1)
    if len(sa) != 2 or len(sb) != 2:
        ctx.fail(f"A and B must be 2-D, got A {sa} and B {sb}")
    ta, tb = int(ctx.attrs["transA"]), int(ctx.attrs["transB"])
    m, ka = (sa[1], sa[0]) if ta else sa
    kb, n = (sb[1], sb[0]) if tb else sb
    if ka != kb:
        ctx.fail(f"inner dimensions differ: op(A) is ({m}, {ka}) (transA={ta}), op(B) is ({kb}, {n}) (transB={tb})")
    if ctx.has(2):
        sc = tuple(ctx.shape(2))
        if len(sc) > 2 or any(c not in (1, t) for c, t in zip(sc[::-1], (n, m))):
            ctx.fail(f"C of shape {sc} is not unidirectionally broadcastable to (M, N) = ({m}, {n})")
    return [TensorMeta((m, n), dt)]


def _gemm_ref(ins, attrs):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    dt = a.dtype
    if _dt.is_low_precision(dt):
        a, b = a.astype(np.float32), b.astype(np.float32)
        c = None if c is None else c.astype(np.float32)
    a = a.T if attrs["transA"] else a
    b = b.T if attrs["transB"] else b
    y = attrs["alpha"] * (a @ b)
    if c is not None:
        y = y + attrs["beta"] * c
    return np.asarray(y).astype(dt)


Gemm = register_op(
    "Gemm",
    category="matmul",
    inputs=[Input("A", FLOAT + _INTS_MM), Input("B", FLOAT + _INTS_MM), Input("C", FLOAT + _INTS_MM, optional=True)],
    outputs=["Y"],
    attrs=[Attr("alpha", "float", 1.0), Attr("beta", "float", 1.0), Attr("transA", "int", 0), Attr("transB", "int", 0)],
    infer=_gemm_infer,
    reference=_gemm_ref,
    flops=lambda ctx: 2 * math.prod(ctx.outputs[0].shape) * ctx.shape(0)[0 if ctx.attrs["transA"] else 1],
    doc="Y = alpha * op(A) @ op(B) + beta * C (ONNX Gemm).",
)
Gemm.kernel(
    "gemm_blas",
    dtypes=_F32_64,
    priority=10,
    strided=True,
    doc="OpenBLAS GEMM reading transposed operands in place; alpha/beta/C applied in place",
)(K.gemm)


def _gemm_bf16_applies(ctx):
    why = bf16_rejection(ctx)
    if why is not None:
        return why
    if ctx.attrs["transA"]:
        return "transA=0 only"
    if ctx.has(2) and ctx.value(2) is None and ctx.dtype(2) != _dt.bfloat16:
        return f"a runtime C must be bfloat16 too, got {_dt.name(ctx.dtype(2))}"
    if ctx.has(2) and ctx.value(2) is not None and bf16_bias_columns(ctx.value(2), ctx.outputs[0].shape[-1]) is None:
        return "C must be a per-column bias (shape (N,) or (1, N)) when constant"
    return True


def _gemm_bf16_plan(ctx):
    p = bf16_matmul_plan(ctx, transpose=bool(ctx.attrs["transB"]))
    c = ctx.value(2) if ctx.has(2) else None
    bias = bf16_bias_columns(c, ctx.outputs[0].shape[-1])
    if bias is not None:
        bias = bias * np.float32(ctx.attrs["beta"])
    return p._replace(bias=bias)


def _gemm_bf16(ins, outs, attrs, plan, ws):
    c = ins[2] if len(ins) > 2 else None
    z = None
    if plan.bias is None and c is not None and attrs["beta"] != 0.0:
        if attrs["beta"] == 1.0 and c.shape == outs[0].shape:
            z = c  # a full C joins as the residual
        else:
            z = np.broadcast_to((c.astype(np.float32) * np.float32(attrs["beta"])).astype(c.dtype), outs[0].shape)
    K.matmul_bf16(ins[0], plan, outs[0], ws, alpha=attrs["alpha"], bias=plan.bias, z=z)


Gemm.kernel(
    "gemm_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=35,
    applies=_gemm_bf16_applies,
    plan=_gemm_bf16_plan,
    workspace=_bf16_ws,
    doc="bfloat16 with a constant B: MKL's bf16 GEMM on the weight as stored, alpha in the GEMM, "
    "beta * C in the fp32 epilogue, one rounding",
)(_gemm_bf16)


def _constant_b_rejection(ctx) -> str | None:
    """Why a Gemm is not ``op(A) @ B (+ beta * C)`` with transA=0, alpha=1, a constant B known at
    prepare time and a non-empty product (None when it is): what the constant-B kernels take."""
    if ctx.attrs["transA"] or ctx.attrs["alpha"] != 1.0:
        return "transA=0 and alpha=1 only"
    if ctx.value(1) is None:
        return "B is not a constant known at prepare time (graph initializer)"
    m, n = ctx.outputs[0].shape
    if 0 in (m, n) or ctx.shape(0)[1] == 0:
        return "empty product"
    return None


def _gemm_onednn_applies(ctx):
    why = KD.product_unavailable(ctx.dtype(0)) or _constant_b_rejection(ctx)
    if why is not None:
        return why
    m, n = ctx.outputs[0].shape
    if ctx.has(2) and ctx.attrs["beta"] != 0.0:
        if ctx.attrs["beta"] != 1.0 or tuple(ctx.shape(2)) not in ((n,), (1, n), (m, n)):
            return "C must be a bias (N,) / (1, N) or a full (M, N) C, with beta=1"
    return True


def _gemm_onednn_plan(ctx):
    m, n = ctx.outputs[0].shape
    c = tuple(ctx.shape(2)) if ctx.has(2) and ctx.attrs["beta"] != 0.0 else None
    return KD.MatMulPrimitive(
        m,
        np.asarray(ctx.value(1)),
        has_bias=c is not None and c != (m, n),
        residual=c == (m, n),
        act=0,
        transposed=bool(ctx.attrs["transB"]),
    )


def _gemm_onednn_args(ins, outs, attrs, plan) -> tuple:
    """(A, bias or None, residual or None, Y) of a Gemm on oneDNN: C is one or the other."""
    c = ins[2] if len(ins) > 2 and attrs["beta"] != 0.0 else None
    return ins[0], c if plan.has_bias else None, c if plan.residual else None, outs[0]


def _gemm_onednn(ins, outs, attrs, plan, ws):
    plan(*_gemm_onednn_args(ins, outs, attrs, plan))


def _gemm_onednn_bind(ins, outs, attrs, plan, ws):
    return plan.bind(*_gemm_onednn_args(ins, outs, attrs, plan))


Gemm.kernel(
    "gemm_onednn",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=36,
    applies=_gemm_onednn_applies,
    plan=_gemm_onednn_plan,
    bind=_gemm_onednn_bind,
    doc="a constant B (transB either way, reordered once at prepare), transA=0, alpha=1: oneDNN's matmul "
    "(brgemm, bf16 too with AVX512-BF16), C as its bias or a residual post-op",
)(_gemm_onednn)


def _gemm_runtime_applies(ctx):
    if ctx.attrs["alpha"] != 1.0:
        return "alpha=1 only"
    m, n = ctx.outputs[0].shape
    k = ctx.shape(0)[0 if ctx.attrs["transA"] else 1]
    bias = ctx.has(2) and ctx.attrs["beta"] != 0.0
    why = _runtime_rejection(ctx, (0, 1), "empty product" if 0 in (m, n, k) else (1, m, k, n), bias)
    if why is not None:
        return why
    if bias:
        if ctx.attrs["beta"] != 1.0 or tuple(ctx.shape(2)) not in ((n,), (1, n)) or ctx.dtype(2) != ctx.dtype(0):
            return f"C must be a {_dt.name(ctx.dtype(0))} bias (N,) / (1, N) with beta=1"
    return True


def _gemm_runtime_plan(ctx):
    ta, tb = bool(ctx.attrs["transA"]), bool(ctx.attrs["transB"])
    m, n = ctx.outputs[0].shape
    k = ctx.shape(0)[0 if ta else 1]
    bias = ctx.has(2) and ctx.attrs["beta"] != 0.0
    return KD.runtime_matmul(
        1, m, k, n, trans_a=ta, trans_b=tb, bias_dtype=ctx.dtype(0) if bias else None, dtype=ctx.dtype(0)
    )


def _gemm_runtime_args(ins, outs, plan):
    return ins[0], ins[1], ins[2] if plan.has_bias else None, outs[0]


Gemm.kernel(
    "gemm_onednn_runtime",
    dtypes=(_dt.bfloat16, _dt.float32),
    priority=25,
    applies=_gemm_runtime_applies,
    plan=_gemm_runtime_plan,
    bind=lambda ins, outs, attrs, plan, ws: plan.bind(*_gemm_runtime_args(ins, outs, plan)),
    doc="A and B both known at run time, alpha=1, C a bias or none: oneDNN's matmul reading op(A) and op(B) "
    "in place (transA/transB as strides, no copies); bfloat16 natively (one rounding), float32 where the "
    "strategy picks oneDNN's brgemm over BLAS",
)(lambda ins, outs, attrs, plan, ws: plan.run(*_gemm_runtime_args(ins, outs, plan)))


def _gemm_vector_applies(ctx):
    if ctx.dtype(0) != _dt.float32:
        return f"float32 only, got {_dt.name(ctx.dtype(0))}"
    why = _constant_b_rejection(ctx)
    if why is not None:
        return why
    m, n = ctx.outputs[0].shape
    if ctx.has(2) and ctx.attrs["beta"] != 0.0 and tuple(ctx.shape(2)) not in ((n,), (1, n), (m, n)):
        return f"C must be a row of {n} (N,) / (1, N), got {tuple(ctx.shape(2))}"
    if m != 1:
        return NotPreferred(f"{m} rows: GEMM kernels reuse each weight value across rows, this one is for one")
    return True


def _gemm_vector_plan(ctx):
    b = np.asarray(ctx.value(1))
    return np.ascontiguousarray(b if ctx.attrs["transB"] else b.T)  # W (N, K), rows in memory order


def _gemm_vector(ins, outs, attrs, plan, ws):
    y = outs[0]
    c = ins[2] if len(ins) > 2 and ins[2] is not None and attrs["beta"] != 0.0 else None
    if c is not None:
        np.multiply(c.reshape(1, -1), np.float32(attrs["beta"]), out=y)
    K.gemm_rows_parallel(ins[0], plan, y, np.float32(0 if c is None else 1))


#: a one-row Gemm with a constant B (a classifier head: ResNet-50's 2048 -> 1000) reads B once
#: either way, so the kernel that streams it fastest wins: B as (N, K) rows read in memory order
#: by ``gemm_rows`` (docs/performance.md, "Products with a constant weight")
Gemm.kernel(
    "gemm_vector",
    dtypes=(_dt.float32,),
    priority=37,
    applies=_gemm_vector_applies,
    plan=_gemm_vector_plan,
    cold_alternative=("gemm_onednn", "gemm_blas"),  # oneDNN's matmul is off on AVX2 CPUs
    doc="one row, a constant B (transposed once at prepare when transB=0), transA=0, alpha=1: the "
    "weight's rows streamed once by gemm_rows (2 threads), beta * C as a bias row",
)(_gemm_vector)


@api("gemm", "Gemm")
def gemm(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    """``alpha * op(a) @ op(b) + beta * c`` for 2-D ``a``, ``b`` (ONNX Gemm).

    >>> import opsnn, numpy as np
    >>> opsnn.ops.gemm(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), trans_b=True).shape
    (2, 4)
    """
    if c is not None and not hasattr(c, "shape"):
        c = as_tensor(c, like=as_tensor(a))
    return [a, b, c], {
        "alpha": float(alpha),
        "beta": float(beta),
        "transA": int(bool(trans_a)),
        "transB": int(bool(trans_b)),
    }


# -- BatchGemm (opsnn domain): the backward products of MatMul and Linear ----------------------------------
# dA = dY @ B^T and dB = A^T @ dY of a batched, broadcast MatMul, each summed over the batch dims its
# operand was broadcast along: one record reading the transposes in place (BLAS trans flags) and
# folding a summed batch into the product's K (dW of a Linear over (B, S, K) rows is one GEMM), where
# the composition Transpose + MatMul + ReduceSum + Reshape copied operands and made a batch of partial
# products first.
def _batch_gemm_shapes(ctx) -> tuple:
    """(m, k, n, broadcast batch, output batch) of a BatchGemm, validated."""
    sa, sb = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if len(sa) < 2 or len(sb) < 2:
        ctx.fail(f"A and B must be at least 2-D, got A {sa} and B {sb}")
    ta, tb = int(ctx.attrs["transA"]), int(ctx.attrs["transB"])
    m, ka = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    kb, n = (sb[-1], sb[-2]) if tb else (sb[-2], sb[-1])
    if ka != kb:
        ctx.fail(
            f"inner dimensions differ: op(A) is (..., {m}, {ka}) (transA={ta}), op(B) is (..., {kb}, {n}) (transB={tb})"
        )
    full = _broadcast(ctx, "batch dims", sa[:-2], sb[:-2])
    batch = full if ctx.attrs["batch"] is None else tuple(int(d) for d in ctx.attrs["batch"])
    if K.batch_sum_axes(full, batch) is None:
        ctx.fail(
            f"batch {batch} is not a shape the broadcast batch {full} sums onto (each dim equal to the "
            "broadcast one or 1, aligned from the right)"
        )
    return m, ka, n, full, batch


def _batch_gemm_infer(ctx):
    dt = _same_dtype(ctx, 0, 1)
    m, _, n, _, batch = _batch_gemm_shapes(ctx)
    return [TensorMeta(batch + (m, n), dt)]


def _batch_gemm_ref(ins, attrs):
    a, b = ins
    dt = a.dtype
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    y = np.matmul(
        np.swapaxes(a64, -1, -2) if attrs["transA"] else a64, np.swapaxes(b64, -1, -2) if attrs["transB"] else b64
    )
    if attrs["batch"] is not None:
        batch = tuple(int(d) for d in attrs["batch"])
        full, axes = K.batch_sum_axes(y.shape[:-2], batch)
        y = y.reshape(full + y.shape[-2:]).sum(axis=axes, keepdims=True).reshape(batch + y.shape[-2:])
    return (attrs["alpha"] * y).astype(dt)


def _batch_gemm_flops(ctx) -> int:
    """2 * m * k * n per product of the broadcast batch (the summing adds are not counted)."""
    m, k, n, full, _ = _batch_gemm_shapes(ctx)
    return 2 * math.prod(full) * m * k * n


def _batch_gemm_plan(ctx):
    _, _, _, full, batch = _batch_gemm_shapes(ctx)
    ta, tb = bool(ctx.attrs["transA"]), bool(ctx.attrs["transB"])
    return K.batch_gemm_plan(tuple(ctx.shape(0)), tuple(ctx.shape(1)), ta, tb, full, batch, ctx.dtype(0))


BatchGemm = register_op(
    "BatchGemm",
    domain="opsnn",
    category="matmul",
    inputs=[Input("A", FLOAT), Input("B", FLOAT)],
    outputs=["Y"],
    attrs=[
        Attr("alpha", "float", 1.0),
        Attr("transA", "int", 0),
        Attr("transB", "int", 0),
        Attr("batch", "ints", None),
    ],
    infer=_batch_gemm_infer,
    reference=_batch_gemm_ref,
    flops=_batch_gemm_flops,
    doc="Y = alpha * op(A) @ op(B) over broadcast batch dims (op transposes the last two dims where "
    "transA / transB), summed onto the output batch ``batch`` (None: the broadcast batch): the backward "
    "products of MatMul and Linear.",
)
BatchGemm.kernel(
    "batch_gemm_blas",
    dtypes=_F32_64,
    priority=10,
    strided=True,
    plan=_batch_gemm_plan,
    workspace=lambda ctx, plan: plan.workspace,
    doc="transposes read in place by BLAS; A's batch folded into M (B 2-D) or a summed batch into K "
    "(one GEMM); else one batched product (MKL's cblas_sgemm_batch for float32), summed in the workspace",
)(K.batch_gemm)


def _batch_gemm_runtime_shape(ctx):
    """(batch, m, k, n, trans_a, trans_b) of a BatchGemm as one oneDNN matmul over contiguous
    operands, or why not."""
    if ctx.attrs["alpha"] != 1.0:
        return "alpha=1 only"
    p = _batch_gemm_plan(ctx)
    if 0 in p.full or p.k == 0:
        return "empty product"
    rows = math.prod(p.full[:-2])
    if p.case == "fold_m":
        return 1, rows * p.m, p.k, p.n, False, p.trans_b
    if p.case == "fold_k":
        return 1, p.m, rows * p.k, p.n, True, False
    sa, sb = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    if p.case == "batched" and sa[:-2] == sb[:-2]:
        return rows, p.m, p.k, p.n, p.trans_a, p.trans_b
    return f"{p.case}: batch dims {sa[:-2]} and {sb[:-2]} broadcast"


def _batch_gemm_runtime_applies(ctx):
    shape = _batch_gemm_runtime_shape(ctx)
    why = _runtime_rejection(ctx, (0, 1), shape if isinstance(shape, str) else shape[:4])
    return True if why is None else why


def _batch_gemm_runtime_plan(ctx):
    batch, m, k, n, ta, tb = _batch_gemm_runtime_shape(ctx)
    return KD.runtime_matmul(batch, m, k, n, trans_a=ta, trans_b=tb, dtype=ctx.dtype(0))


BatchGemm.kernel(
    "batch_gemm_onednn_runtime",
    dtypes=(_dt.bfloat16, _dt.float32),
    priority=25,
    applies=_batch_gemm_runtime_applies,
    plan=_batch_gemm_runtime_plan,
    bind=lambda ins, outs, attrs, plan, ws: plan.bind(ins[0], ins[1], None, outs[0]),
    doc="operands known at run time (the backward products), alpha=1, a fold or equal batch dims: oneDNN's "
    "matmul reading the transposes in place; bfloat16 natively (one rounding), float32 where the strategy "
    "picks oneDNN's brgemm over BLAS",
)(lambda ins, outs, attrs, plan, ws: plan.run(ins[0], ins[1], None, outs[0]))


@api("batch_gemm", "BatchGemm", domain="opsnn")
def batch_gemm(a, b, alpha=1.0, trans_a=False, trans_b=False, batch=None):
    """``alpha * op(a) @ op(b)`` over broadcast batch dims, ``op`` transposing the last two dims of
    ``a`` / ``b`` where ``trans_a`` / ``trans_b`` (read in place, no copy), summed onto the output
    batch ``batch`` (None: the broadcast batch). ``batch_gemm(dy, x, trans_a=True, batch=())`` is a
    Linear's weight gradient for ``x`` (B, S, K), ``dy`` (B, S, N): one GEMM.

    >>> import opsnn, numpy as np
    >>> opsnn.ops.batch_gemm(np.ones((2, 5, 3), np.float32), np.ones((2, 5, 4), np.float32), trans_a=True, batch=()).shape
    (3, 4)
    """
    return [a, b], {
        "alpha": float(alpha),
        "transA": int(bool(trans_a)),
        "transB": int(bool(trans_b)),
        "batch": None if batch is None else [int(d) for d in batch],
    }


# -- Linear (opsnn domain) ------------------------------------------------------------------------
# Its own record rather than an alias: ONNX Gemm is 2-D only and MatMul has neither the
# transposed weight nor the bias, so ``x @ W^T + b`` over arbitrary leading dims would take
# two or three nodes and an intermediate tensor. As one record it is one BLAS call with the
# bias added in place, and it is the natural target for the graph engine's
# "MatMul(x, Transpose(W)) -> Add(b)" fusion; an ONNX exporter lowers it back to that chain.
def _linear_infer(ctx):
    dt = _same_dtype(ctx, 0, 1, 2)
    sx, sw = ctx.shape(0), ctx.shape(1)
    if len(sw) != 2:
        ctx.fail(f"weight must be 2-D (out_features, in_features), got {sw}")
    if len(sx) < 1:
        ctx.fail(f"input must be at least 1-D, got {sx}")
    if sx[-1] != sw[1]:
        ctx.fail(f"input's last dim is {sx[-1]} but weight {sw} expects in_features={sw[1]}")
    if ctx.has(2) and tuple(ctx.shape(2)) != (sw[0],):
        ctx.fail(f"bias must have shape ({sw[0]},) (out_features), got {ctx.shape(2)}")
    return [TensorMeta(tuple(sx[:-1]) + (sw[0],), dt)]


def _linear_ref(ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    dt = x.dtype
    if _dt.is_low_precision(dt):
        x, w = x.astype(np.float32), w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
    y = np.einsum("...k,nk->...n", x, w)
    if b is not None:
        y = y + b
    return np.asarray(y).astype(dt)


Linear = register_op(
    "Linear",
    domain="opsnn",
    category="matmul",
    inputs=[Input("X", FLOAT), Input("W", FLOAT), Input("B", FLOAT, optional=True)],
    outputs=["Y"],
    infer=_linear_infer,
    reference=_linear_ref,
    flops=lambda ctx: 2 * math.prod(ctx.outputs[0].shape) * ctx.shape(1)[1],
    doc="Y = X @ W^T + B over any leading dims of X (torch.nn.functional.linear).",
)
Linear.kernel(
    "linear_blas",
    dtypes=_F32_64,
    priority=10,
    strided=True,
    doc="one (rows, K) x (K, N) BLAS GEMM reading W^T in place; bias added in place",
)(K.linear)


def _linear_mkl(ins, outs, attrs, plan, ws):
    out = outs[0].reshape(-1, plan.n)
    KM.gemm(ins[0].reshape(-1, plan.k), plan, out)
    if len(ins) > 2 and ins[2] is not None:
        out += ins[2]


Linear.kernel(
    "linear_mkl_packed",
    dtypes=(_dt.float32,),
    priority=30,
    applies=_mkl_packed_applies,
    plan=lambda ctx: KM.pack(ctx.value(1), _rows(ctx.shape(0)), transpose=True),
    doc="constant W packed once at prepare by Intel MKL as W^T (cblas_sgemm_pack); per call one "
    "cblas_sgemm_compute, bias added in place",
)(_linear_mkl)


def _linear_bf16_plan(ctx):
    p = bf16_matmul_plan(ctx, transpose=True)
    return p._replace(bias=bf16_bias_columns(ctx.value(2), ctx.outputs[0].shape[-1]) if ctx.has(2) else None)


def _linear_bf16(ins, outs, attrs, plan, ws):
    b = plan.bias
    if b is None and len(ins) > 2 and ins[2] is not None:
        b = ins[2].astype(np.float32)
    K.matmul_bf16(ins[0], plan, outs[0], ws, bias=b)


Linear.kernel(
    "linear_mkl_bf16",
    dtypes=(_dt.bfloat16,),
    priority=35,
    applies=lambda ctx: bf16_rejection(ctx) or True,
    plan=_linear_bf16_plan,
    workspace=_bf16_ws,
    doc="bfloat16 with a constant W: MKL's bf16 GEMM reading W^T in place, bias in the fp32 epilogue, one rounding",
)(_linear_bf16)


def _linear_runtime_applies(ctx):
    n, k = ctx.shape(1)
    empty = len(ctx.shape(0)) < 2 or 0 in ctx.outputs[0].shape or k == 0
    shape = "1-D input or an empty product" if empty else (1, _rows(ctx.shape(0)), k, n)
    why = _runtime_rejection(ctx, (0, 1) + ((2,) if ctx.has(2) else ()), shape, ctx.has(2))
    return True if why is None else why


def _linear_runtime_plan(ctx):
    n, k = ctx.shape(1)
    rows = _rows(ctx.shape(0))
    bias = ctx.dtype(0) if ctx.has(2) else None
    return KD.runtime_matmul(1, rows, k, n, trans_b=True, bias_dtype=bias, dtype=ctx.dtype(0))


def _linear_runtime_args(ins, outs, plan):
    return ins[0], ins[1], ins[2] if plan.has_bias else None, outs[0]


Linear.kernel(
    "linear_onednn_runtime",
    dtypes=(_dt.bfloat16, _dt.float32),
    priority=25,
    applies=_linear_runtime_applies,
    plan=_linear_runtime_plan,
    bind=lambda ins, outs, attrs, plan, ws: plan.bind(*_linear_runtime_args(ins, outs, plan)),
    doc="x and W both known at run time (eager training): oneDNN's matmul reading W^T in place, the bias as "
    "its bias argument; bfloat16 natively (one rounding), float32 where the strategy picks oneDNN's brgemm "
    "over BLAS",
)(lambda ins, outs, attrs, plan, ws: plan.run(*_linear_runtime_args(ins, outs, plan)))


Linear.kernel(
    "linear_prepacked",
    dtypes=FLOAT,
    priority=20,
    applies=_prepacked_applies,
    plan=lambda ctx: K.pack_weight(ctx.value(1), transpose=True),
    workspace=_packed_workspace,
    doc="constant fp16 W packed once at prepare as fp32 W^T; per call only x is converted",
)(K.linear_packed)


@api("linear", "Linear", domain="opsnn")
def linear(x, weight, bias=None):
    """``x @ weight.T + bias`` for ``x`` of shape (..., in_features), ``weight`` (out, in).

    >>> import opsnn, numpy as np
    >>> opsnn.ops.linear(np.ones((2, 5, 3), np.float32), np.ones((4, 3), np.float32)).shape
    (2, 5, 4)
    """
    return [x, weight, bias], {}


# -- Einsum -------------------------------------------------------------------------------------
def _decode(s) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


def parse_einsum(ctx, equation: str, shapes: list) -> tuple:
    """Validate ``equation`` against ``shapes``; returns (normalized equation, output shape).

    Labels are letters; ``...`` broadcasts numpy-style; without ``->`` the output is the
    broadcast ``...`` dims then the labels used exactly once, in alphabetical order."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        ctx.fail(f"equation {equation!r} has more than one '->'")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        ctx.fail(f"equation {equation!r} has {len(terms)} operand terms but {len(shapes)} inputs were given")
    dims: dict[str, int] = {}
    counts: dict[str, int] = {}
    ell = ()
    for t, (term, shape) in enumerate(zip(terms, shapes)):
        if term.count("...") > 1 or term.replace("...", "").count(".") > 0:
            ctx.fail(f"term {term!r} of {equation!r}: at most one '...' and no stray '.'")
        labels = term.replace("...", "")
        if not all(c.isalpha() for c in labels):
            ctx.fail(f"term {term!r} of {equation!r}: labels must be letters")
        n_ell = len(shape) - len(labels)
        if ("..." not in term and n_ell != 0) or n_ell < 0:
            ctx.fail(f"term {term!r} of {equation!r} names {len(labels)} dims but input {t} has shape {tuple(shape)}")
        if "..." in term:
            pos = term.index("...")
            ell_shape = tuple(shape[pos : pos + n_ell])
            ell = _broadcast(ctx, f"'...' dims of {equation!r}", ell, ell_shape)
            shape = tuple(shape[:pos]) + tuple(shape[pos + n_ell :])
        for c, d in zip(labels, shape):
            if c in dims and dims[c] != d:
                ctx.fail(f"label {c!r} of {equation!r} is size {dims[c]} in one input and {d} in input {t}")
            dims[c] = d
            counts[c] = counts.get(c, 0) + 1
    if rhs is None:
        rhs = ("..." if ell or "..." in lhs else "") + "".join(sorted(c for c, n in counts.items() if n == 1))
    out_labels = rhs.replace("...", "")
    if rhs.count("...") > 1 or not all(c.isalpha() for c in out_labels):
        ctx.fail(f"output {rhs!r} of {equation!r}: letters and at most one '...'")
    if len(set(out_labels)) != len(out_labels):
        ctx.fail(f"output {rhs!r} of {equation!r} repeats a label")
    for c in out_labels:
        if c not in dims:
            ctx.fail(f"output label {c!r} of {equation!r} appears in no input")
    if ell and "..." not in rhs:
        ctx.fail(f"inputs of {equation!r} broadcast '...' dims {ell} but the output has no '...'")
    out = []
    i = 0
    while i < len(rhs):
        if rhs.startswith("...", i):
            out.extend(ell)
            i += 3
        else:
            out.append(dims[rhs[i]])
            i += 1
    return f"{lhs}->{rhs}", tuple(out)


def _einsum_infer(ctx):
    if len(ctx.inputs) == 0:
        ctx.fail("needs at least one input")
    dt = _same_dtype(ctx, *range(len(ctx.inputs)))
    _, shape = parse_einsum(ctx, _decode(ctx.attrs["equation"]), [m.shape for m in ctx.inputs])
    return [TensorMeta(shape, dt)]


def _einsum_plan(ctx):
    eq, _ = parse_einsum(ctx, _decode(ctx.attrs["equation"]), [m.shape for m in ctx.inputs])
    return eq


def _einsum_ref(ins, attrs):
    eq = _decode(attrs["equation"]).replace(" ", "")
    dt = ins[0].dtype
    xs = [x.astype(np.float32) for x in ins] if _dt.is_low_precision(dt) else ins
    return np.asarray(np.einsum(eq, *xs, optimize=False)).astype(dt)


def _einsum_kernel(ins, outs, attrs, plan, ws):
    # numpy's contraction-order optimizer turns pairwise contractions into tensordot/BLAS
    np.copyto(outs[0], np.einsum(plan, *ins, optimize=True), casting="unsafe")


Einsum = register_op(
    "Einsum",
    category="matmul",
    inputs=[Input("Inputs", _dt.FLOATS + _dt.INTEGERS, variadic=True)],
    outputs=["Output"],
    attrs=[Attr("equation", "string")],
    infer=_einsum_infer,
    reference=_einsum_ref,
    doc="Einstein summation (ONNX Einsum).",
)
Einsum.kernel(
    "einsum_numpy_opt",
    dtypes=_F32_64 + _dt.INTEGERS,
    priority=10,
    plan=_einsum_plan,
    doc="np.einsum with optimize=True: contraction order planned, pairwise steps on BLAS",
)(_einsum_kernel)


def einsum_as_batch_gemm(eq: str, sa: tuple, sb: tuple):
    """A two-operand contraction ``eq`` (normalized, no '...') as one batched GEMM over the operands
    as stored: (batch, M, N, K, transA, transB) with each letter group (batch: in both operands and
    the output; M: A and the output; N: B and the output; K: both operands only) consecutive and in
    one order wherever it appears, batch first, the output batch + M + N. Else why not (a string)."""
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or "." in eq:
        return "needs two operands without '...'"
    ta_, tb_ = terms
    if len(set(ta_)) != len(ta_) or len(set(tb_)) != len(tb_):
        return "a label repeats within an operand (a diagonal)"
    batch = "".join(c for c in out if c in ta_ and c in tb_)
    m = "".join(c for c in out if c in ta_ and c not in tb_)
    n = "".join(c for c in out if c in tb_ and c not in ta_)
    k = "".join(c for c in ta_ if c in tb_ and c not in out)
    if out != batch + m + n:
        return f"output {out!r} is not batch + M + N ({batch!r} + {m!r} + {n!r})"
    if set(ta_) != set(batch + m + k) or set(tb_) != set(batch + n + k):
        return "a label is summed within one operand only"
    if ta_ not in (batch + m + k, batch + k + m) or tb_ not in (batch + k + n, batch + n + k):
        return f"operands {ta_!r}, {tb_!r} do not hold the groups batch {batch!r}, M {m!r}, N {n!r}, K {k!r} in order"
    size = dict(zip(ta_, sa)) | dict(zip(tb_, sb))
    prod = [math.prod(size[c] for c in g) for g in (batch, m, n, k)]
    return (*prod, ta_ != batch + m + k, tb_ != batch + k + n)


def _einsum_gemm_shape(ctx):
    """(swapped, batch, M, N, K, transA, transB) of a two-operand Einsum as one batched GEMM (swapped:
    the output is batch + N + M, so B's role is A's), or why not."""
    if len(ctx.inputs) != 2:
        return f"{len(ctx.inputs)} operands (two only)"
    eq, _ = parse_einsum(ctx, _decode(ctx.attrs["equation"]), [m.shape for m in ctx.inputs])
    sa, sb = tuple(ctx.shape(0)), tuple(ctx.shape(1))
    shape = einsum_as_batch_gemm(eq, sa, sb)
    if not isinstance(shape, str):
        return (False, *shape)
    lhs, out = eq.split("->")
    swapped = einsum_as_batch_gemm(",".join(lhs.split(",")[::-1]) + "->" + out, sb, sa)
    return shape if isinstance(swapped, str) else (True, *swapped)


def _einsum_gemm_plan(ctx):
    swapped, nb_, m, n, k, ta, tb = _einsum_gemm_shape(ctx)
    full = () if nb_ == 1 else (nb_,)
    p = K.batch_gemm_plan(
        full + ((k, m) if ta else (m, k)), full + ((n, k) if tb else (k, n)), ta, tb, full, full, ctx.dtype(0)
    )
    return swapped, p._replace(case="batched")


def _einsum_gemm(ins, outs, attrs, plan, ws):
    swapped, p = plan
    x, y = (ins[1], ins[0]) if swapped else (ins[0], ins[1])
    lead = p.full[:-2]
    a = x.reshape(lead + ((p.k, p.m) if p.trans_a else (p.m, p.k)))
    b = y.reshape(lead + ((p.n, p.k) if p.trans_b else (p.k, p.n)))
    K.batch_gemm([a, b], [outs[0].reshape(p.full)], {"alpha": 1.0}, p, None)


Einsum.kernel(
    "einsum_batch_gemm",
    dtypes=_F32_64,
    priority=20,
    applies=lambda ctx: (lambda s: True if not isinstance(s, str) else s)(_einsum_gemm_shape(ctx)),
    plan=_einsum_gemm_plan,
    strided=True,
    doc="two operands whose labels group as batch, M, N, K in order: one batched GEMM on the operands as "
    "stored (each group merged as a view, transposes as BLAS flags), e.g. attention's bhqd,bhkd->bhqk",
)(_einsum_gemm)


@api("einsum", "Einsum")
def einsum(equation, *operands):
    """Einstein summation, e.g. ``einsum("bij,bjk->bik", a, b)``."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return list(operands), {"equation": str(equation)}


# -- MatMulInteger / QLinearMatMul ----------------------------------------------------------------
def _check_zp(ctx, i: int, what: str, sizes: tuple, data_dtype=None) -> None:
    if not ctx.has(i):
        return
    name = ctx.op.inputs[i].name
    n = int(np.prod(ctx.shape(i)))
    if n != 1 and not (len(ctx.shape(i)) == 1 and n in sizes):
        ctx.fail(f"{name!r} must be a scalar (per tensor) or 1-D of {what} size {sizes[0]}, got {ctx.shape(i)}")
    if data_dtype is not None and ctx.dtype(i) != data_dtype:
        raise DTypeError(
            f"{ctx.op.name}: {name!r} has dtype {_dt.name(ctx.dtype(i))}, expected "
            f"{_dt.name(data_dtype)} like its data input",
            op=ctx.op.name,
        )


def _matmul_integer_infer(ctx):
    shape = matmul_shape(ctx, ctx.shape(0), ctx.shape(1))
    sa, sb = ctx.shape(0), ctx.shape(1)
    m = sa[-2] if len(sa) > 1 else 1
    _check_zp(ctx, 2, "per-row", (m,), ctx.dtype(0))
    _check_zp(ctx, 3, "per-column", (sb[-1] if len(sb) > 1 else 1,), ctx.dtype(1))
    return [TensorMeta(shape, _dt.int32)]


def _matmul_integer_ref(ins, attrs):
    a, b = ins[0].astype(np.int64), ins[1].astype(np.int64)
    if len(ins) > 2 and ins[2] is not None:
        a = a - K.per_row(ins[2].astype(np.int64))
    if len(ins) > 3 and ins[3] is not None:
        b = b - K.per_col(ins[3].astype(np.int64))
    return np.matmul(a, b).astype(np.int32)


def _int_mm_plan(ctx):
    return K.int_matmul_plan(ctx.shape(0)[-1], 255, 255)


MatMulInteger = register_op(
    "MatMulInteger",
    category="matmul",
    inputs=[
        Input("A", _Q8),
        Input("B", _Q8),
        Input("a_zero_point", _Q8, optional=True),
        Input("b_zero_point", _Q8, optional=True),
    ],
    outputs=["Y"],
    infer=_matmul_integer_infer,
    reference=_matmul_integer_ref,
    flops=lambda ctx: _mm_flops(ctx, 0, 1),
    doc="int32 matmul of zero-point-shifted 8-bit operands (ONNX MatMulInteger).",
)
MatMulInteger.kernel(
    "matmul_integer_blas",
    dtypes=_Q8,
    priority=10,
    plan=_int_mm_plan,
    strided=True,
    doc="shifted operands in float64 on BLAS dgemm (exact below 2**53), else int64",
)(K.matmul_integer)


@api("matmul_integer", "MatMulInteger")
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """int32 ``(a - a_zero_point) @ (b - b_zero_point)`` for uint8/int8 operands."""
    return [a, b, a_zero_point, b_zero_point], {}


def _qlinear_matmul_infer(ctx):
    shape = matmul_shape(ctx, ctx.shape(0), ctx.shape(3))
    sa, sb = ctx.shape(0), ctx.shape(3)
    m = sa[-2] if len(sa) > 1 else 1
    n = sb[-1] if len(sb) > 1 else 1
    _check_zp(ctx, 1, "per-row", (m,))
    _check_zp(ctx, 2, "per-row", (m,), ctx.dtype(0))
    _check_zp(ctx, 4, "per-column", (n,))
    _check_zp(ctx, 5, "per-column", (n,), ctx.dtype(3))
    _check_zp(ctx, 6, "per-tensor", (1,))
    _check_zp(ctx, 7, "per-tensor", (1,))
    if not (ctx.dtype(1) == ctx.dtype(4) == ctx.dtype(6)):
        raise DTypeError(
            f"QLinearMatMul: a_scale, b_scale, y_scale must share one dtype, got "
            f"{_dt.name(ctx.dtype(1))}, {_dt.name(ctx.dtype(4))}, {_dt.name(ctx.dtype(6))}",
            op="QLinearMatMul",
        )
    return [TensorMeta(shape, ctx.dtype(7))]


def _qlinear_matmul_ref(ins, attrs):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ins
    acc = np.matmul(
        a.astype(np.int64) - K.per_row(a_zp.astype(np.int64)), b.astype(np.int64) - K.per_col(b_zp.astype(np.int64))
    )
    scale = (K.per_row(a_s) * K.per_col(b_s) / y_s.reshape(())).astype(np.float64)
    y = np.rint(acc * scale) + float(y_zp.reshape(()))
    info = np.iinfo(y_zp.dtype)
    return np.clip(y, info.min, info.max).astype(y_zp.dtype)


QLinearMatMul = register_op(
    "QLinearMatMul",
    category="matmul",
    inputs=[
        Input("a", _Q8),
        Input("a_scale", _SCALES),
        Input("a_zero_point", _Q8),
        Input("b", _Q8),
        Input("b_scale", _SCALES),
        Input("b_zero_point", _Q8),
        Input("y_scale", _SCALES),
        Input("y_zero_point", _Q8),
    ],
    outputs=["y"],
    infer=_qlinear_matmul_infer,
    reference=_qlinear_matmul_ref,
    flops=lambda ctx: _mm_flops(ctx, 0, 3),
    doc="Quantized matmul: requantize((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp.",
)
QLinearMatMul.kernel(
    "qlinear_matmul_blas",
    dtypes=_Q8,
    priority=10,
    plan=_int_mm_plan,
    strided=True,
    doc="exact integer GEMM on BLAS dgemm, then fp64 round-half-even requantization",
)(K.qlinear_matmul)


@api("qlinear_matmul", "QLinearMatMul")
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Quantized matmul (ONNX QLinearMatMul); output dtype is ``y_zero_point``'s."""
    return [a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point], {}


__all__ = ["matmul", "gemm", "batch_gemm", "linear", "einsum", "matmul_integer", "qlinear_matmul"]
