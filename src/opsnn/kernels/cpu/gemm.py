"""CPU GEMM kernels: MatMul, Gemm, Linear and the integer/quantized matmuls.

``np.matmul`` on float32/float64 dispatches to OpenBLAS sgemm/dgemm per matrix and
releases the GIL, so streams overlap. Host decisions (folding a batch into one large
GEMM, the integer accumulation path, tile sizes, packed weights) are made in the plan at
prepare time; the kernels only launch.

16-bit floats (float16, bfloat16) have three paths:

* the executor's fp32 adapter around the BLAS kernels (converts both operands, every call);
* ``gemm_lowp``: a tiled numba GEMM that reads the 16-bit storage directly — each thread
  widens one column panel of B (``tile_size`` columns) and four rows of A at a time into
  fp32 scratch (bf16: ``uint16 << 16`` into a uint32 buffer viewed as float32; fp16: three
  vectorized bit passes, exact for every pattern), accumulates in fp32 and rounds each
  finished row back to 16 bits (round-to-nearest-even, NaN/Inf/subnormals kept). No fp32
  copy of a whole operand exists. At 35-45 GFLOP/s per core it loses to BLAS on fp32
  copies except where numpy's slow fp16 cast of B dominates (few rows of fp16);
* pre-packed weights: when B (MatMul) or W (Linear) is a constant known at prepare time
  (a graph initializer), the plan converts it to fp32 once, so each call converts only the
  activations (pays off for fp16; bf16's widening is a shift, as cheap as reading the copy).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from . import libraries
from . import mkl as _mkl
from .fused import epilogue_row
from .mkl import matmul as _blas_matmul

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
        _blas_matmul(a.reshape(-1, plan.k), b, out.reshape(-1, plan.n))
    else:
        _blas_matmul(a, b, out)


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
    _blas_matmul(a, b, out)
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
        _blas_matmul(x.reshape(-1, k), w.T, out.reshape(-1, n))
    if b is not None:
        out += b


# -- batched products of transposed operands, batch dims summed (MatMul / Linear backward) -------------------
class BatchGemmPlan(NamedTuple):
    """How :func:`batch_gemm` runs ``Y = alpha * (sum over the summed batch dims of op(A) @ op(B))``.

    ``case``: 'fold_m' (B has no batch and nothing is summed: A's batch folds into M, one GEMM),
    'fold_k' (every batch dim is summed and A, B both span it: the batch folds into K, one GEMM over
    the stacked rows, A read transposed), 'batched' (nothing summed: one batched product, transposes
    read in place) or 'reduce' (that batched product into the workspace, then summed over ``axes``).
    ``full``: the broadcast batch + (m, n); ``axes``: the axes of ``full`` summed; ``mkl``: the
    batched product goes to MKL's ``cblas_sgemm_batch`` (float32, MKL the library for it)."""

    case: str
    trans_a: bool
    trans_b: bool
    m: int
    k: int
    n: int
    full: tuple
    axes: tuple
    mkl: bool

    def describe(self) -> str:
        what = {
            "fold_m": "A's batch folded into M: one GEMM",
            "fold_k": "the summed batch folded into K: one GEMM over the stacked rows",
            "batched": "one batched product",
            "reduce": f"a batched product into the workspace, summed over axes {self.axes}",
        }[self.case]
        flags = "".join(f", {x} read transposed" for x, t in (("A", self.trans_a), ("B", self.trans_b)) if t)
        lib = " on MKL's batched GEMM" if self.mkl and self.case in ("batched", "reduce") else ""
        return f"{what}{lib}{flags}"

    @property
    def workspace(self) -> int:
        return math.prod(self.full) * 8 + 64 if self.case == "reduce" else 0


def batch_sum_axes(full: tuple, batch: tuple) -> tuple | None:
    """(``full`` padded with leading 1s to ``batch``'s rank, the axes of it that are summed onto
    ``batch``) or None when ``batch`` is not a shape the batch ``full`` sums onto (each dim of
    ``batch``, aligned from the right, equal to ``full``'s or 1; extra leading dims 1)."""
    full, batch = tuple(full), tuple(batch)
    if len(batch) > len(full):
        if any(d != 1 for d in batch[: len(batch) - len(full)]):
            return None
        full = (1,) * (len(batch) - len(full)) + full
    lead = len(full) - len(batch)
    if any(b not in (1, f) for b, f in zip(batch, full[lead:])):
        return None
    axes = tuple(i for i in range(len(full)) if full[i] != 1 and (i < lead or batch[i - lead] == 1))
    return full, axes


def batch_gemm_plan(sa: tuple, sb: tuple, ta: bool, tb: bool, full_batch: tuple, batch: tuple, dtype) -> BatchGemmPlan:
    """The plan of ``batch_gemm`` for A of shape ``sa``, B ``sb`` (as stored), the broadcast batch
    ``full_batch`` and the output batch ``batch`` (validated by the record's infer)."""
    m, k = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    n = sb[-2] if tb else sb[-1]
    full, axes = batch_sum_axes(full_batch, batch)
    pad = len(full)
    a_batch = (1,) * (pad - len(sa) + 2) + tuple(sa[:-2])
    b_batch = (1,) * (pad - len(sb) + 2) + tuple(sb[:-2])
    summed_all = len(axes) == sum(1 for d in full if d != 1)
    if not axes and not ta and math.prod(b_batch) == 1:
        case = "fold_m"
    elif axes and summed_all and ta and not tb and a_batch == b_batch == tuple(full):
        case = "fold_k"
    else:
        case = "reduce" if axes else "batched"
    # 16-bit floats run here through the executor's float32 adapter
    lib = np.dtype(dtype).kind == "f" and np.dtype(dtype).itemsize <= 4 and _mkl.unavailable() is None
    mkl = lib and (libraries.gemm_library() == "mkl" or libraries.mkl_batch(m, k, n))
    return BatchGemmPlan(case, bool(ta), bool(tb), int(m), int(k), int(n), tuple(full) + (m, n), axes, mkl)


def _op(x: np.ndarray, t: bool) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if t else x


def _batched_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, plan: BatchGemmPlan) -> None:
    """out (the broadcast batch + (m, n)) = op(a) @ op(b), transposes read in place."""
    if math.prod(out.shape[:-2]) == 1:  # one product: a 2-D GEMM (MKL reads transposed views too)
        a2, b2 = a.reshape(a.shape[-2:]), b.reshape(b.shape[-2:])
        _blas_matmul(_op(a2, plan.trans_a), _op(b2, plan.trans_b), out.reshape(plan.m, plan.n))
        return
    if plan.mkl and _mkl.try_batched(a, b, out, plan.trans_a, plan.trans_b):
        return
    np.matmul(_op(a, plan.trans_a), _op(b, plan.trans_b), out=out)  # BLAS per matrix, trans flags


def batch_gemm(ins, outs, attrs, plan: BatchGemmPlan, ws):
    """``Y = alpha * op(A) @ op(B)`` with the batch dims of the broadcast product summed onto Y's
    (see :class:`BatchGemmPlan`): the backward products of MatMul and Linear without a transposed
    or reshaped copy of a contiguous operand (a non-contiguous one a fold must merge is copied)."""
    a, b, out = ins[0], ins[1], outs[0]
    if out.size == 0:
        return
    if plan.k == 0 or 0 in plan.full:
        out[...] = 0
        return
    if plan.case == "fold_m":
        b2 = b.reshape(b.shape[-2:])
        _blas_matmul(a.reshape(-1, a.shape[-1]), _op(b2, plan.trans_b), out.reshape(-1, plan.n))
    elif plan.case == "fold_k":
        _blas_matmul(a.reshape(-1, plan.m).T, b.reshape(-1, plan.n), out.reshape(plan.m, plan.n))
    elif plan.case == "batched":
        _batched_into(a, b, out.reshape(plan.full), plan)
    else:
        if ws is None:
            tmp = np.empty(plan.full, out.dtype)
        else:
            shift = (-ws.ctypes.data) % 64
            tmp = ws[shift : shift + math.prod(plan.full) * out.itemsize].view(out.dtype).reshape(plan.full)
        _batched_into(a, b, tmp, plan)
        kept = tuple(1 if i in plan.axes else d for i, d in enumerate(plan.full))
        np.sum(tmp, axis=plan.axes, keepdims=True, out=out.reshape(kept))
    alpha = attrs["alpha"]
    if alpha != 1.0:
        out *= out.dtype.type(alpha)


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
    # asarray: a 1-D @ 1-D product is a numpy scalar, which np.rint(out=) cannot write
    r = np.asarray(acc.astype(np.float64, copy=False) * np.asarray(scale, np.float64))
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


# -- 16-bit GEMM reading fp16/bf16 storage directly -------------------------------------------------
KIND_F16, KIND_BF16 = 0, 1
MR = 4  # rows of A per inner block: each B element loaded feeds 4 FMAs


@nb.njit(nogil=True, cache=True, inline="always")
def _widen(src, dst_u, dst_f, kind):
    """16-bit bit patterns ``src`` -> float32 values in ``dst_f`` (``dst_u`` is its uint32 view).

    fp16 runs three vectorizable passes (a 64K-entry table lookup measured 2.5x slower): rebias the
    exponent in the integer view (Inf/NaN get the exponent 255, subnormals the exponent of
    2**-14), subtract 2**-14 from the subnormals in the float view (what remains is exactly
    mantissa * 2**-24), then OR in the sign."""
    if kind == KIND_BF16:
        for k in range(src.shape[0]):
            dst_u[k] = np.uint32(src[k]) << np.uint32(16)
        return
    for k in range(src.shape[0]):
        em = np.uint32(src[k]) & np.uint32(0x7FFF)
        adj = np.uint32(0x38000000)
        if em >= np.uint32(0x7C00):
            adj = np.uint32(0x70000000)
        elif em < np.uint32(0x0400):
            adj = np.uint32(0x38800000)
        dst_u[k] = (em << np.uint32(13)) + adj
    for k in range(src.shape[0]):
        if (np.uint32(src[k]) & np.uint32(0x7C00)) == np.uint32(0):
            dst_f[k] -= np.float32(6.103515625e-05)
    for k in range(src.shape[0]):
        dst_u[k] |= (np.uint32(src[k]) & np.uint32(0x8000)) << np.uint32(16)


@nb.njit(nogil=True, cache=True)
def _half_bits(u, v):
    # float32 (bits u, value v) -> IEEE half bits, round to nearest even
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):  # Inf / NaN (NaN stays a quiet NaN)
        return sign | np.uint32(0x7C00) | (np.uint32(0x200) if a > np.uint32(0x7F800000) else np.uint32(0))
    if a >= np.uint32(0x477FF000):  # rounds past the largest half (65504) -> Inf
        return sign | np.uint32(0x7C00)
    if a < np.uint32(0x38800000):  # below 2**-14: a subnormal half; |v| * 2**24 is exact in float32
        return sign | np.uint32(np.rint(abs(v) * np.float32(16777216.0)))
    h = (((a >> np.uint32(23)) - np.uint32(112)) << np.uint32(10)) | ((a >> np.uint32(13)) & np.uint32(0x3FF))
    rest = a & np.uint32(0x1FFF)
    if rest > np.uint32(0x1000) or (rest == np.uint32(0x1000) and (h & np.uint32(1))):
        h += np.uint32(1)  # a carry into the exponent is the correct rounding (up to Inf)
    return sign | h


@nb.njit(nogil=True, cache=True, inline="always")
def _narrow(src_f, src_u, dst, kind):
    """float32 values -> 16-bit bit patterns in ``dst`` (round to nearest even)."""
    if kind == KIND_BF16:
        for k in range(dst.shape[0]):
            u = src_u[k]
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                dst[k] = np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
            else:
                dst[k] = np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    else:
        for k in range(dst.shape[0]):
            dst[k] = np.uint16(_half_bits(src_u[k], src_f[k]))


#: elements per task of the flat bfloat16 conversions (parallel over such blocks)
_CONVERT_BLOCK = 1 << 15


@nb.njit(parallel=True, nogil=True, cache=True)
def _bf16_to_f32_parallel(src, dst_u):
    n = src.shape[0]
    for blk in nb.prange(-(-n // _CONVERT_BLOCK)):
        lo = blk * _CONVERT_BLOCK
        hi = min(n, lo + _CONVERT_BLOCK)
        _widen(src[lo:hi], dst_u[lo:hi], dst_u[lo:hi].view(np.float32), KIND_BF16)  # on slices: vectorizes


@nb.njit(nogil=True, cache=True)
def _bf16_to_f32_serial(src, dst_u):
    _widen(src, dst_u, dst_u.view(np.float32), KIND_BF16)


def bf16_to_f32(src, dst_u) -> None:
    """bfloat16 bits ``src`` (uint16, flat, contiguous) -> float32 bits in ``dst_u`` (uint32).
    One block (a bias, a norm's scale) runs on the calling thread, as :func:`f32_to_bf16`."""
    (_bf16_to_f32_parallel if src.shape[0] > _CONVERT_BLOCK else _bf16_to_f32_serial)(src, dst_u)


#: up to this many x rows, :func:`gemm_rows` reads the weight a row at a time (one stream in memory
#: order) instead of four rows at a time. 2-thread products, weight not in cache, ms, 4 rows at a
#: time / a row at a time (2-core Zen 4 VM): 768 -> 32000 1 row 4.63 / 2.82 (21 / 35 GB/s), 2 rows
#: 5.11 / 3.11, 3 rows 5.42 / 3.74, 4 rows 5.97 / 5.89, 6 rows 10.0 / 12.4; 768 -> 4096 1 row 0.56 /
#: 0.39, 2 rows 0.71 / 0.55, 3 rows 0.78 / 0.54, 4 rows 0.74 / 0.60, 6 rows 0.83 / 1.11; 768 -> 2048
#: 1 row 0.42 / 0.25, 3 rows 0.52 / 0.31, 6 rows 0.69 / 0.86
ROW_AT_A_TIME_MAX = 3


@nb.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _rows_in_order(x, w, lo, hi, beta, out):
    """:func:`gemm_rows` a weight row at a time: the rows are read in memory order, a single
    stream the hardware prefetcher keeps ahead of, each dotted with every x row while in L1.
    Four rows at a time read four streams 4*K bytes apart and keep four dot products in flight
    (the better trade from 4 x rows on: :data:`ROW_AT_A_TIME_MAX`)."""
    R, k = x.shape
    for i in range(lo, hi):
        wi = w[i]
        j = i - lo
        for r in range(R):
            xr = x[r]
            s = np.float32(0)
            for c in range(k):
                s += wi[c] * xr[c]
            out[r, j] = s if beta == 0 else s + beta * out[r, j]


@nb.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def gemm_rows(x, w, lo, hi, beta, out):
    """``out[:, i - lo] = x @ w[i] + beta * out[:, i - lo]`` for the weight rows ``lo <= i < hi``
    of a row-major ``w`` (N, K), ``x`` (R, K) (``out`` (R, hi - lo) not read when ``beta`` is
    0): four weight rows at a time, each x row's four vectorized dot products with them while
    they sit in L1, so the weight streams from memory once for all R rows (up to
    :data:`ROW_AT_A_TIME_MAX` x rows, a weight row at a time: :func:`_rows_in_order`). For
    products of a few rows (decode steps), where the weight's bytes, not the arithmetic, set the
    time, and where MKL's ``cblas_sgemv`` / packed GEMM is the slower choice (see
    :func:`opsnn.kernels.cpu.mkl_nb.addresses`, :data:`opsnn.kernels.cpu.libraries.SMALL_ROWS`)."""
    R, k = x.shape
    if R <= ROW_AT_A_TIME_MAX:  # a decode step's few rows: the weight's rows one after another
        _rows_in_order(x, w, lo, hi, beta, out)
        return
    i = lo
    while i + 4 <= hi:
        w0, w1, w2, w3 = w[i], w[i + 1], w[i + 2], w[i + 3]
        j = i - lo
        for r in range(R):
            xr = x[r]
            s0 = s1 = s2 = s3 = np.float32(0)
            for c in range(k):
                xc = xr[c]
                s0 += w0[c] * xc
                s1 += w1[c] * xc
                s2 += w2[c] * xc
                s3 += w3[c] * xc
            o = out[r]
            if beta == 0:
                o[j], o[j + 1], o[j + 2], o[j + 3] = s0, s1, s2, s3
            else:
                o[j] = s0 + beta * o[j]
                o[j + 1] = s1 + beta * o[j + 1]
                o[j + 2] = s2 + beta * o[j + 2]
                o[j + 3] = s3 + beta * o[j + 3]
        i += 4
    if i < hi:  # the last rows, one at a time
        _rows_in_order(x, w, i, hi, beta, out[:, i - lo :])


#: weight rows per task of :func:`gemm_rows_parallel`
_ROWS_TASK = 128


@nb.njit(parallel=True, nogil=True, cache=True)
def gemm_rows_parallel(x, w, out, beta):
    """``out = x @ w.T + beta * out`` (x (R, K), w (N, K), out (R, N)) as :func:`gemm_rows` over
    tasks of ``_ROWS_TASK`` weight rows."""
    n = w.shape[0]
    for t in nb.prange(-(-n // _ROWS_TASK)):
        lo = t * _ROWS_TASK
        hi = min(n, lo + _ROWS_TASK)
        gemm_rows(x, w, lo, hi, beta, out[:, lo:hi])


#: output rows per task of :func:`gemv_bf16`
_GEMV_ROWS = 64


@nb.njit(parallel=True, nogil=True, cache=True, fastmath={"reassoc", "contract"})
def gemv_bf16(w, x, out, beta):
    """``out = W @ x + beta * out`` for a bfloat16 matrix ``W`` given as its bits ``w`` (uint16,
    (N, K), rows contiguous), float32 ``x`` (K) and ``out`` (N; not read when ``beta`` is 0):
    each task widens its rows one at a time into a float32 row buffer (``bits << 16``) and dots
    it with ``x`` (kept in float32, not rounded to bf16). A one-row product streams the weight
    once, so reading 2 bytes a value instead of 4 is what makes it fast."""
    n, k = w.shape
    for blk in nb.prange(-(-n // _GEMV_ROWS)):
        buf_u = np.empty(k, np.uint32)
        buf = buf_u.view(np.float32)
        lo = blk * _GEMV_ROWS
        for i in range(lo, min(n, lo + _GEMV_ROWS)):
            wi = w[i]
            for c in range(k):
                buf_u[c] = np.uint32(wi[c]) << np.uint32(16)
            s = np.float32(0)
            for c in range(k):
                s += buf[c] * x[c]
            out[i] = s if beta == 0 else s + np.float32(beta) * out[i]


@nb.njit(parallel=True, nogil=True, cache=True)
def _f32_to_bf16_parallel(src_f, src_u, dst):
    n = dst.shape[0]
    for blk in nb.prange(-(-n // _CONVERT_BLOCK)):
        lo = blk * _CONVERT_BLOCK
        hi = min(n, lo + _CONVERT_BLOCK)
        _narrow(src_f[lo:hi], src_u[lo:hi], dst[lo:hi], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _f32_to_bf16_serial(src_f, src_u, dst):
    _narrow(src_f, src_u, dst, KIND_BF16)


def f32_to_bf16(src_f, src_u, dst) -> None:
    """float32 ``src_f`` (``src_u``: its uint32 view; flat, contiguous) -> bfloat16 bits in ``dst``
    (uint16), rounded to nearest even; NaN stays NaN. One block (a decode step's activation row)
    runs on the calling thread: a parallel region would cost more than the conversion."""
    (_f32_to_bf16_parallel if dst.shape[0] > _CONVERT_BLOCK else _f32_to_bf16_serial)(src_f, src_u, dst)


@nb.njit(parallel=True, nogil=True, cache=True)
def _finish_bf16_rows(acc, acc_u, cbias, rbias, z, code, alpha, beta, out):
    """out (rows, cols) bfloat16 bits = round(act(acc + cbias + rbias + z)) in one pass per row
    (the row stays in cache): the fp32 epilogue's row kernel (:func:`.fused.epilogue_row`:
    ``cbias`` per column, ``rbias`` per row, float32 or empty; activation ``code``) on ``acc`` (float32, ``acc_u`` its uint32 view), with ``z`` (bf16 bits, (rows, cols)
    or (0, 0)) widened into row scratch first, then the rounding."""
    cols = acc.shape[1]
    for r in nb.prange(acc.shape[0]):
        tmp = np.empty((1, cols if z.size > 0 else 0), np.uint32)
        zf = tmp.view(np.float32)
        if z.size > 0:
            _widen(z[r], tmp[0], zf[0], KIND_BF16)
        epilogue_row(acc[r : r + 1], cbias, rbias[r : r + 1], zf, 0, code, alpha, beta)
        _narrow(acc[r], acc_u[r], out[r], KIND_BF16)


_EMPTY32 = np.empty(0, np.float32)
_EMPTY16 = np.empty((0, 0), np.uint16)


def bf16_epilogue(
    acc: np.ndarray,
    out: np.ndarray,
    z: np.ndarray | None,
    code: int,
    alpha: float,
    beta: float,
    bias: np.ndarray | None = None,
    row_bias: np.ndarray | None = None,
) -> None:
    """out (bfloat16, any strides) = round(act(acc + bias + row_bias + z)) for a float32 (rows,
    cols) accumulator (modified): ``bias`` float32 per column, ``row_bias`` per row (a conv's
    channels), ``z`` bfloat16 like ``out``; one pass per row."""
    _finish_bf16_rows(
        acc,
        acc.view(np.uint32),
        _EMPTY32 if bias is None else bias,
        _EMPTY32 if row_bias is None else row_bias,
        _EMPTY16 if z is None else z.view(np.uint16),
        code,
        alpha,
        beta,
        out.view(np.uint16),
    )


@nb.njit(nogil=True, cache=True, inline="always")
def _lowp_panel(a, b, out, j0, nc, kind, bp_u, bp, ar_u, ar, acc_u, acc):
    # one column panel out[:, j0:j0 + w] = a @ b[:, j0:j0 + w]
    m_n, k_n = a.shape
    w = min(nc, b.shape[1] - j0)
    for k in range(k_n):
        _widen(b[k, j0 : j0 + w], bp_u[k, :w], bp[k, :w], kind)
    for i0 in range(0, m_n, MR):
        rows = min(MR, m_n - i0)
        for r in range(rows):
            _widen(a[i0 + r], ar_u[r], ar[r], kind)
            ac = acc[r, :w]
            for j in range(w):
                ac[j] = 0
        if rows == MR:
            c0 = acc[0, :w]
            c1 = acc[1, :w]
            c2 = acc[2, :w]
            c3 = acc[3, :w]
            for k in range(k_n):
                x0 = ar[0, k]
                x1 = ar[1, k]
                x2 = ar[2, k]
                x3 = ar[3, k]
                brow = bp[k, :w]
                for j in range(brow.shape[0]):
                    bj = brow[j]
                    c0[j] += x0 * bj
                    c1[j] += x1 * bj
                    c2[j] += x2 * bj
                    c3[j] += x3 * bj
        else:
            for r in range(rows):
                cr = acc[r, :w]
                for k in range(k_n):
                    x = ar[r, k]
                    brow = bp[k, :w]
                    for j in range(brow.shape[0]):
                        cr[j] += x * brow[j]
        for r in range(rows):
            _narrow(acc[r, :w], acc_u[r, :w], out[i0 + r, j0 : j0 + w], kind)


@nb.njit(parallel=True, nogil=True, cache=True)
def gemm_lowp_parallel(a, b, out, nc, kind):
    """out = a @ b for 2-D uint16 views of fp16/bf16 data (``kind``), fp32 accumulation,
    parallel over column panels of ``nc`` columns."""
    k_n = a.shape[1]
    panels = -(-b.shape[1] // nc)
    for jp in nb.prange(panels):
        bp_u = np.empty((k_n, nc), np.uint32)
        ar_u = np.empty((MR, k_n), np.uint32)
        acc_u = np.empty((MR, nc), np.uint32)
        _lowp_panel(
            a,
            b,
            out,
            jp * nc,
            nc,
            kind,
            bp_u,
            bp_u.view(np.float32),
            ar_u,
            ar_u.view(np.float32),
            acc_u,
            acc_u.view(np.float32),
        )


@nb.njit(nogil=True, cache=True)
def gemm_lowp_serial(a, b, out, nc, kind):
    k_n = a.shape[1]
    bp_u = np.empty((k_n, nc), np.uint32)
    ar_u = np.empty((MR, k_n), np.uint32)
    acc_u = np.empty((MR, nc), np.uint32)
    for jp in range(-(-b.shape[1] // nc)):
        _lowp_panel(
            a,
            b,
            out,
            jp * nc,
            nc,
            kind,
            bp_u,
            bp_u.view(np.float32),
            ar_u,
            ar_u.view(np.float32),
            acc_u,
            acc_u.view(np.float32),
        )


class LowpPlan(NamedTuple):
    """``tile_size``: columns of B per panel (a panel of K x tile_size fp32 values is one
    thread's scratch). ``batch``: the batch shapes of A and B after folding; ``fold``: A's
    leading dims fold into M because B is 2-D."""

    tile_size: int
    kind: int
    parallel: bool
    fold: bool
    a_batch: tuple
    b_batch: tuple
    m: int
    k: int
    n: int

    def describe(self) -> str:
        kind = "bf16" if self.kind == KIND_BF16 else "fp16"
        return (
            f"tiled {kind} GEMM: panels of {self.tile_size} columns widened to fp32 in cache, fp32 "
            f"accumulation, {'parallel' if self.parallel else 'serial'}"
        )


#: default panel width, and the cap on one thread's K x tile_size fp32 panel (L2 is 1 MiB
#: per core here); bench/kernels.py --lowp-tiles sweeps the width
LOWP_TILE = 128
LOWP_PANEL_BYTES = 1 << 20


def lowp_plan(a_shape: tuple, b_shape: tuple, dtype, tile_size: int | None = None) -> LowpPlan:
    k, n = int(a_shape[-1]), int(b_shape[-1])
    m = int(a_shape[-2])
    if tile_size is None:  # a multiple of 16 (one AVX-512 vector) whose fp32 panel fits LOWP_PANEL_BYTES
        tile_size = max(16, min(LOWP_TILE, (LOWP_PANEL_BYTES // (4 * max(k, 1))) // 16 * 16))
        tile_size = min(tile_size, -(-n // 16) * 16)
    fold = len(b_shape) == 2
    a_batch, b_batch = tuple(a_shape[:-2]), tuple(b_shape[:-2])
    rows = m * (math.prod(a_batch) if fold else 1)
    work = rows * k * n * (1 if fold else math.prod(a_batch))
    kind = KIND_BF16 if np.dtype(dtype).itemsize == 2 and np.dtype(dtype) != np.float16 else KIND_F16
    return LowpPlan(int(tile_size), kind, work >= (1 << 16), fold, a_batch, b_batch, m, k, n)


def lowp_applies(a_shape: tuple, b_shape: tuple) -> str | None:
    if len(a_shape) < 2 or len(b_shape) < 2:
        return "needs 2-D or batched operands (1-D operands go to the BLAS path)"
    if len(b_shape) > 2 and tuple(a_shape[:-2]) != tuple(b_shape[:-2]):
        return "batched B must have A's batch dims exactly (no broadcasting)"
    return None


def matmul_lowp(ins, outs, attrs, plan: LowpPlan, ws):
    """MatMul on fp16/bf16 storage with fp32 accumulation (``gemm_lowp_*``)."""
    a, b, out = ins[0], ins[1], outs[0]
    if out.size == 0:
        return
    if a.dtype.itemsize != 2 or b.dtype.itemsize != 2 or out.dtype.itemsize != 2:
        # a caller's fp32 adapter already widened the operands (e.g. FusedMatMul planned this
        # kernel for 16-bit inputs, then runs it inside its own adapter): plain BLAS then
        np.matmul(a, b, out=out)
        return
    if plan.k == 0:
        out[...] = 0
        return
    fn = gemm_lowp_parallel if plan.parallel else gemm_lowp_serial
    av = a.view(np.uint16)
    bv = b.view(np.uint16)
    ov = out.view(np.uint16)
    if plan.fold:
        fn(av.reshape(-1, plan.k), bv, ov.reshape(-1, plan.n), plan.tile_size, plan.kind)
        return
    a3, b3, o3 = av.reshape(-1, plan.m, plan.k), bv.reshape(-1, plan.k, plan.n), ov.reshape(-1, plan.m, plan.n)
    for i in range(a3.shape[0]):
        fn(a3[i], b3[i], o3[i], plan.tile_size, plan.kind)


# -- pre-packed constant weights ---------------------------------------------------------------------------
class PackedPlan(NamedTuple):
    """``w``: the constant right operand, packed once at prepare time as a contiguous
    (K, N) array in the compute dtype (fp32 for 16-bit storage); ``k``/``n`` its shape."""

    w: np.ndarray
    k: int
    n: int

    def describe(self) -> str:
        return f"weight pre-packed at prepare as ({self.k}x{self.n}) {self.w.dtype}; activations converted per call"


def pack_weight(w: np.ndarray, transpose: bool) -> PackedPlan:
    """B (K, N) for MatMul, or W (N, K) for Linear (``transpose``), as contiguous compute-dtype (K, N)."""
    w = np.asarray(w)
    ct = np.float64 if w.dtype == np.float64 else np.float32
    wk = w.T if transpose else w
    packed = np.ascontiguousarray(wk, dtype=ct)
    packed.setflags(write=False)
    return PackedPlan(packed, int(packed.shape[0]), int(packed.shape[1]))


def packed_workspace(out_shape: tuple, out_dtype, plan: PackedPlan) -> int:
    """Bytes of the fp32 result buffer a 16-bit output needs (0 when the output is the compute dtype)."""
    if np.dtype(out_dtype) == plan.w.dtype:
        return 0
    return math.prod(out_shape) * plan.w.dtype.itemsize + 64


def _result_buffer(out: np.ndarray, plan: PackedPlan, ws) -> np.ndarray:
    if out.dtype == plan.w.dtype:
        return out.reshape(-1, plan.n)
    if ws is None:
        return np.empty((out.size // max(plan.n, 1), plan.n), plan.w.dtype)
    shift = (-ws.ctypes.data) % 64
    return ws[shift : shift + out.size * plan.w.dtype.itemsize].view(plan.w.dtype).reshape(-1, plan.n)


def matmul_packed(ins, outs, attrs, plan: PackedPlan, ws):
    """``x @ W`` with W pre-packed; x may be 16-bit (converted per call) or fp32/fp64. A 16-bit
    result is computed into the workspace, then rounded into the output."""
    x, out = ins[0], outs[0]
    ct = plan.w.dtype
    xc = x if x.dtype == ct else x.astype(ct)
    res = _result_buffer(out, plan, ws)
    _blas_matmul(xc.reshape(-1, plan.k), plan.w, res)
    if out.dtype != ct:
        np.copyto(out.reshape(-1, plan.n), res, casting="unsafe")


def linear_packed(ins, outs, attrs, plan: PackedPlan, ws):
    """Linear ``x @ W^T + b`` with W^T pre-packed (16-bit storage: fp32 compute)."""
    x, out = ins[0], outs[0]
    b = ins[2] if len(ins) > 2 else None
    ct = plan.w.dtype
    xc = (x if x.dtype == ct else x.astype(ct)).reshape(-1, plan.k)
    res = _result_buffer(out, plan, ws)
    _blas_matmul(xc, plan.w, res)
    if b is not None:
        res += b if b.dtype == ct else b.astype(ct)
    if out.dtype != ct:
        np.copyto(out.reshape(-1, plan.n), res, casting="unsafe")


# -- bfloat16 on MKL's bf16 GEMM (cblas_gemm_bf16bf16f32: AMX / AVX512-BF16) ---------------------------------
class Bf16Plan(NamedTuple):
    """A constant right operand's bits as a (K, N) uint16 view (``w``: the weight as stored, or a
    transposed view of it; MKL reads it as it is), plus what the epilogue adds in float32:
    ``bias`` per output column (Linear's b; Gemm's beta * C when it broadcasts along rows) or None."""

    w: np.ndarray
    bias: np.ndarray | None

    def describe(self) -> str:
        extra = "; bias widened to float32 at prepare" if self.bias is not None else ""
        return (
            f"bfloat16 weight ({self.w.shape[0]}x{self.w.shape[1]}) read as stored by MKL's bf16 GEMM; fp32 "
            f"accumulation, one rounding to bfloat16{extra}"
        )


def bf16_workspace(out_shape: tuple) -> int:
    """Bytes of the float32 accumulator :func:`matmul_bf16` needs for an output of ``out_shape``."""
    return math.prod(out_shape) * 4 + 64


def matmul_bf16(
    a: np.ndarray,
    plan: Bf16Plan,
    out: np.ndarray,
    ws,
    alpha: float = 1.0,
    bias=None,
    z=None,
    code: int = 0,
    act_alpha: float = 0.0,
    act_beta: float = 0.0,
) -> None:
    """out (bfloat16) = round(act(alpha * a @ B + bias + z)): ``a`` (..., K) bfloat16, B (K, N) in
    ``plan``; the product accumulates in float32 in the workspace, where the epilogue runs (``bias``
    float32 per column, ``z`` bfloat16 like ``out``), before one rounding."""
    k, n = plan.w.shape
    a2 = np.ascontiguousarray(a).view(np.uint16).reshape(-1, k)
    rows = a2.shape[0]
    shift = (-ws.ctypes.data) % 64
    acc = ws[shift : shift + rows * n * 4].view(np.float32).reshape(rows, n)
    _mkl.gemm2d_bf16(a2, plan.w, acc, alpha)
    bf16_epilogue(
        acc,
        out.reshape(rows, n),
        None if z is None else np.ascontiguousarray(z).reshape(rows, n),
        code,
        act_alpha,
        act_beta,
        bias=bias,
    )
