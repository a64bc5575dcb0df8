"""CPU (de)quantization kernels: numba for float32 <-> int8/uint8 (the hot cases), numpy for
every other type (16-bit ints, int4/uint4/int2/uint2, float8/float6/float4).

Both views treat ``x`` as (outer, dim, inner) around the quantization axis and the scale as
(outer or 1, ceil(dim/block), inner or 1): one layout covers per-tensor (1, 1, 1), per-axis
(1, dim, 1) and blocked quantization. Rounding is half-to-even; NaN quantizes to the
lowest code and +-inf saturates (as onnxruntime does).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numba as nb
import numpy as np

#: elements per parallel work item, and the size below which the serial loop runs (the
#: serial loop streams ~1 element/ns, so threads pay off only for large tensors)
CHUNK = 1 << 15
PARALLEL_MIN = 1 << 20


class QuantLayout(NamedTuple):
    """x as (outer, dim, inner); scale as (s_outer, s_dim, s_inner) with s_outer in {1, outer},
    s_inner in {1, inner}; element d of the axis uses scale row d // block."""

    mode: str  # "tensor", "axis" or "block"
    axis: int
    block: int
    outer: int
    dim: int
    inner: int
    s_outer: int
    s_dim: int
    s_inner: int


def layout(mode: str, x_shape: tuple, axis: int, block: int) -> QuantLayout:
    if mode == "tensor":
        n = int(np.prod(x_shape))
        return QuantLayout(mode, 0, 1, 1, 1, n, 1, 1, 1)
    outer = int(np.prod(x_shape[:axis]))
    dim = int(x_shape[axis])
    inner = int(np.prod(x_shape[axis + 1 :]))
    if mode == "axis":
        return QuantLayout(mode, axis, 1, outer, dim, inner, 1, dim, 1)
    return QuantLayout(mode, axis, block, outer, dim, inner, outer, -(-dim // block), inner)


def broadcast_param(v: np.ndarray, x_shape: tuple, lay: QuantLayout) -> np.ndarray:
    """Scale/zero point expanded to broadcast against x (the numpy paths and references)."""
    if lay.mode == "tensor":
        return v.reshape(())
    if lay.mode == "axis":
        shape = [1] * len(x_shape)
        shape[lay.axis] = lay.dim
        return v.reshape(shape)
    return np.repeat(v, lay.block, axis=lay.axis).take(np.arange(x_shape[lay.axis]), axis=lay.axis)


# -- numba: float32 -> int8/uint8 and back --------------------------------------------------------------

# Each chunk walks runs of consecutive elements that share one scale row (a whole chunk per
# tensor, ``inner`` elements per axis/block row), so the inner loops are plain maps over
# 0-based slices (numba can then drop negative-index wraparound and vectorize); NaN and
# clamping use selects, not branches.


@nb.njit(nogil=True, cache=True, error_model="numpy")
def quantize_range(x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, qmin, qmax, start, end):
    Si = I if s_inner_full else 1
    lo = np.float32(qmin)
    hi = np.float32(qmax)
    k = start
    while k < end:
        o = k // (D * I)
        rem = k - o * D * I
        d = rem // I
        i = rem - d * I
        n = min(end - k, I - i)
        base = (o * s_dim * Si if s_outer_full else 0) + (d // B) * Si
        xs = x[k : k + n]
        ys = y[k : k + n]
        if s_inner_full:
            ss = s[base + i : base + i + n]
            zs = zp[base + i : base + i + n]
            for t in range(n):
                v = np.rint(xs[t] / ss[t]) + np.float32(zs[t])
                v = v if v > lo else lo  # NaN -> lowest code
                ys[t] = v if v < hi else hi
        else:
            sc = s[base]
            z = np.float32(zp[base])
            for t in range(n):
                v = np.rint(xs[t] / sc) + z
                v = v if v > lo else lo
                ys[t] = v if v < hi else hi
        k += n


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def quantize_parallel(x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, qmin, qmax, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        quantize_range(
            x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, qmin, qmax, c * chunk, min(n, (c + 1) * chunk)
        )


@nb.njit(nogil=True, cache=True, error_model="numpy")
def dequantize_range(x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, start, end):
    Si = I if s_inner_full else 1
    k = start
    while k < end:
        o = k // (D * I)
        rem = k - o * D * I
        d = rem // I
        i = rem - d * I
        n = min(end - k, I - i)
        base = (o * s_dim * Si if s_outer_full else 0) + (d // B) * Si
        xs = x[k : k + n]
        ys = y[k : k + n]
        if s_inner_full:
            ss = s[base + i : base + i + n]
            zs = zp[base + i : base + i + n]
            for t in range(n):
                ys[t] = np.float32(np.int32(xs[t]) - zs[t]) * ss[t]
        else:
            sc = s[base]
            z = zp[base]
            for t in range(n):
                ys[t] = np.float32(np.int32(xs[t]) - z) * sc
        k += n


@nb.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def dequantize_parallel(x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, chunk):
    n = x.size
    for c in nb.prange((n + chunk - 1) // chunk):
        dequantize_range(x, s, zp, y, D, I, s_outer_full, s_dim, s_inner_full, B, c * chunk, min(n, (c + 1) * chunk))


def _flat_params(scale, zp, lay: QuantLayout):
    s = np.ascontiguousarray(scale, np.float32).reshape(-1)
    z = np.zeros(s.size, np.int32) if zp is None else np.ascontiguousarray(zp).astype(np.int32).reshape(-1)
    return s, z


def quantize_int8(x: np.ndarray, scale: np.ndarray, zp, y: np.ndarray, lay: QuantLayout, parallel: bool) -> None:
    """float32 ``x`` -> int8/uint8 ``y`` = saturate(rint(x / scale) + zero_point)."""
    n = x.size
    if n == 0:
        return
    s, z = _flat_params(scale, zp, lay)
    info = np.iinfo(y.dtype)
    args = (
        x.reshape(-1),
        s,
        z,
        y.reshape(-1),
        lay.dim,
        lay.inner,
        lay.s_outer > 1,
        lay.s_dim,
        lay.s_inner > 1,
        lay.block,
        float(info.min),
        float(info.max),
    )
    if parallel:
        quantize_parallel(*args, CHUNK)
    else:
        quantize_range(*args, 0, n)


def dequantize_int8(x: np.ndarray, scale: np.ndarray, zp, y: np.ndarray, lay: QuantLayout, parallel: bool) -> None:
    """int8/uint8 ``x`` -> float32 ``y`` = (x - zero_point) * scale."""
    n = x.size
    if n == 0:
        return
    s, z = _flat_params(scale, zp, lay)
    args = (
        x.reshape(-1),
        s,
        z,
        y.reshape(-1),
        lay.dim,
        lay.inner,
        lay.s_outer > 1,
        lay.s_dim,
        lay.s_inner > 1,
        lay.block,
    )
    if parallel:
        dequantize_parallel(*args, CHUNK)
    else:
        dequantize_range(*args, 0, n)


# -- numpy: every other type --------------------------------------------------------------------------

#: integer code ranges of the quantized integer types
INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
}
for _name, _rng in (("uint4", (0, 15)), ("int4", (-8, 7)), ("uint2", (0, 3)), ("int2", (-2, 1))):
    if hasattr(ml_dtypes, _name):
        INT_RANGES[np.dtype(getattr(ml_dtypes, _name))] = _rng

#: float types with an inf or NaN encoding, where ``saturate`` chooses clipping over overflow
SATURABLE = tuple(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(ml_dtypes, n)
)


def quantize_values(
    x: np.ndarray,
    scale: np.ndarray,
    zp,
    out_dtype: np.dtype,
    lay: QuantLayout,
    precision: np.dtype | None,
    saturate: bool,
) -> np.ndarray:
    """QuantizeLinear for any type (numpy): ``saturate(x / scale + zero_point)``."""
    s = broadcast_param(np.asarray(scale), x.shape, lay)
    if precision is not None:
        v = x.astype(precision) / s.astype(precision)
    else:
        v = x / s
    z = None if zp is None else broadcast_param(np.asarray(zp), x.shape, lay)
    if out_dtype in INT_RANGES:
        lo, hi = INT_RANGES[out_dtype]
        r = np.rint(v).astype(np.float64)
        if z is not None:
            r = r + z.astype(np.float64)
        r = np.where(np.isnan(r), lo, np.clip(r, lo, hi))
        return r.astype(np.int32).astype(out_dtype)
    v = v.astype(np.float32) if v.dtype != np.float64 else v
    if z is not None:
        v = v + z.astype(v.dtype)
    if saturate and out_dtype in SATURABLE:
        m = float(ml_dtypes.finfo(out_dtype).max)
        v = np.clip(v, -m, m)
    return v.astype(out_dtype)


def dequantize_values(x: np.ndarray, scale: np.ndarray, zp, out_dtype: np.dtype, lay: QuantLayout) -> np.ndarray:
    """DequantizeLinear for any type (numpy): ``(x - zero_point) * scale``, in float32
    (float64 for int32 codes, which float32 would round)."""
    ct = np.float64 if x.dtype == np.int32 else np.float32
    s = broadcast_param(np.asarray(scale), x.shape, lay).astype(ct)
    if x.dtype.kind in "iu" or x.dtype in INT_RANGES:
        d = x.astype(np.int64)
        if zp is not None:
            d = d - broadcast_param(np.asarray(zp), x.shape, lay).astype(np.int64)
        d = d.astype(ct)
    else:
        d = x.astype(ct)
        if zp is not None:
            d = d - broadcast_param(np.asarray(zp), x.shape, lay).astype(ct)
    return (d * s).astype(out_dtype)


def dynamic_range(x: np.ndarray) -> tuple:
    """DynamicQuantizeLinear's uint8 scale and zero point (NaN ignored, range includes 0)."""
    finite = x[~np.isnan(x)] if x.size else x
    hi = np.float32(max(0.0, float(finite.max()))) if finite.size else np.float32(0)
    lo = np.float32(min(0.0, float(finite.min()))) if finite.size else np.float32(0)
    scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255))
    with np.errstate(invalid="ignore", divide="ignore"):
        zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    return scale, np.uint8(0 if np.isnan(zp) else zp)
