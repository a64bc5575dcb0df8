"""CPU GEMM kernels: MatMul, Gemm, Linear and the integer/quantized matmuls, all on BLAS.

``np.matmul`` on float32/float64 dispatches to OpenBLAS sgemm/dgemm per matrix and
releases the GIL, so streams overlap. Host decisions (folding a batch into one large
GEMM, the integer accumulation path) are made in the plan at prepare time; the kernels
only launch. 16-bit floats reach these kernels through the executor's fp32 adapter.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: largest |sum of products| that float64 accumulates exactly (2**53)
_F64_EXACT = 1 << 53


class MatMulPlan(NamedTuple):
    """``fold``: A is (..., M, K) and B is (K, N): run one (prod(...)*M, K) x (K, N) GEMM
    instead of a batch of small ones. ``scalar``: both operands are 1-D (dot product)."""

    fold: bool
    scalar: bool
    k: int
    n: int


def matmul_plan(a_shape: tuple, b_shape: tuple) -> MatMulPlan:
    scalar = len(a_shape) == 1 and len(b_shape) == 1
    fold = len(a_shape) >= 3 and len(b_shape) == 2
    return MatMulPlan(fold, scalar, int(a_shape[-1]), int(b_shape[-1]))


def _matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, plan: MatMulPlan) -> None:
    if plan.scalar:
        out[...] = np.dot(a, b)
    elif plan.fold:
        # reshape copies only when A is a non-contiguous view: still one large GEMM
        np.matmul(a.reshape(-1, plan.k), b, out=out.reshape(-1, plan.n))
    else:
        np.matmul(a, b, out=out)


def matmul(ins, outs, attrs, plan, ws):
    """MatMul on BLAS (float32/float64); batch dims broadcast like numpy."""
    _matmul_into(ins[0], ins[1], outs[0], plan)


def matmul_int(ins, outs, attrs, plan, ws):
    """MatMul for integer dtypes (numpy's integer matmul; wraps around like C)."""
    _matmul_into(ins[0], ins[1], outs[0], plan)


def gemm(ins, outs, attrs, plan, ws):
    """Y = alpha * op(A) @ op(B) + beta * C; transposes are views BLAS reads directly."""
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    out = outs[0]
    if attrs["transA"]:
        a = a.T
    if attrs["transB"]:
        b = b.T
    np.matmul(a, b, out=out)
    alpha, beta = attrs["alpha"], attrs["beta"]
    if alpha != 1.0:
        out *= out.dtype.type(alpha)
    if c is not None and beta != 0.0:
        if beta == 1.0:
            out += c
        else:
            out += c * out.dtype.type(beta)


def linear(ins, outs, attrs, plan, ws):
    """y = x @ W^T + b over any leading dims, as one (rows, K) x (K, N) GEMM."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    out = outs[0]
    k, n = w.shape[1], w.shape[0]
    if x.ndim == 1:
        np.matmul(w, x, out=out)
    else:
        np.matmul(x.reshape(-1, k), w.T, out=out.reshape(-1, n))
    if b is not None:
        out += b


# -- integer and quantized matmul ---------------------------------------------------------------
class IntMatMulPlan(NamedTuple):
    """``exact_f64``: the shifted operands' products summed over K stay below 2**53, so
    BLAS dgemm computes the integer result exactly; otherwise accumulate in int64."""

    exact_f64: bool


def int_matmul_plan(k: int, a_range: int, b_range: int) -> IntMatMulPlan:
    return IntMatMulPlan(a_range * b_range * max(int(k), 1) < _F64_EXACT)


def per_row(v: np.ndarray) -> np.ndarray:
    """A per-tensor ([] or [1]) or per-row ([M] -> [M, 1]; N-D [..., M, 1] as is) parameter of A."""
    if v.size == 1:
        return v.reshape(())
    return v.reshape(-1, 1) if v.ndim == 1 else v


def per_col(v: np.ndarray) -> np.ndarray:
    """A per-tensor ([] or [1]) or per-column ([N] or [..., 1, N]) parameter of B."""
    return v.reshape(()) if v.size == 1 else v


def shifted(x: np.ndarray, zp: np.ndarray | None, dtype) -> np.ndarray:
    """``x - zero_point`` in ``dtype`` (float64 or int64); ``zp`` already broadcastable."""
    v = x.astype(dtype)
    if zp is not None:
        v -= zp.astype(dtype)
    return v


def int_matmul_acc(a, b, a_zp, b_zp, plan: IntMatMulPlan) -> np.ndarray:
    """(A - a_zp) @ (B - b_zp) exactly, as float64 (BLAS) or int64."""
    dt = np.float64 if plan.exact_f64 else np.int64
    a_zp = None if a_zp is None else per_row(a_zp)
    b_zp = None if b_zp is None else per_col(b_zp)
    return np.matmul(shifted(a, a_zp, dt), shifted(b, b_zp, dt))


def matmul_integer(ins, outs, attrs, plan, ws):
    """MatMulInteger: int32 result of zero-point-shifted uint8/int8 operands."""
    a, b = ins[0], ins[1]
    a_zp = ins[2] if len(ins) > 2 else None
    b_zp = ins[3] if len(ins) > 3 else None
    acc = int_matmul_acc(a, b, a_zp, b_zp, plan)
    np.copyto(outs[0], acc, casting="unsafe")


def requantize(acc: np.ndarray, scale, y_zp: np.ndarray | None, out: np.ndarray) -> None:
    """out = saturate(round_half_even(acc * scale) + y_zp) in out's integer dtype."""
    r = acc.astype(np.float64, copy=False) * np.asarray(scale, np.float64)
    np.rint(r, out=r)
    if y_zp is not None:
        r += y_zp.astype(np.float64)
    info = np.iinfo(out.dtype)
    np.clip(r, info.min, info.max, out=r)
    np.copyto(out, r, casting="unsafe")


def qlinear_matmul(ins, outs, attrs, plan, ws):
    """QLinearMatMul: exact integer GEMM on shifted operands, then one requantization.
    The combined scale a_s * b_s / y_s is formed in the scales' own dtype (as ONNX's
    reference and onnxruntime do), so round-half-even ties land identically."""
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ins
    acc = int_matmul_acc(a, b, a_zp, b_zp, plan)
    scale = per_row(a_s) * per_col(b_s) / per_col(y_s)
    requantize(acc, scale, None if y_zp is None else per_col(y_zp), outs[0])
