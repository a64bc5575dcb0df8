"""CPU activation backward kernels (numba): ``GeluBackward`` and ``SwiGLUBackward``, each one pass
(and ``Gelu``'s bfloat16 forward, on the same widened blocks).

The erf form's derivative is ``Phi(x) + x phi(x)`` (``phi(x) = exp(-x^2 / 2) / sqrt(2 pi)``), the
tanh form's ``s + 2 k x s (1 - s) (1 + 3 c x^2)`` with ``s = sigmoid(2 k (x + c x^3))``, both with
the forward kernel's float32 ``fphi`` / ``fexp`` (float64 calls libm). The composed rule took a
dozen elementwise passes (each through the fp32 adapter for bfloat16 and rounded in between);
this is one, in float32 for 16-bit data, rounded once (bfloat16 natively: a block at a time widened
into float32 scratch, computed, rounded to nearest even, no float32 copies of the tensors). SwiGLU's two gradients (gate and value)
come out of one pass the same way (``s = sigmoid(alpha a)``: ``dA = g b (s + alpha a s (1 - s))``,
``dB = g a s``).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numba as nb
import numpy as np

from .activation import CHUNK_MIN, PARALLEL_MIN_COSTLY, _gelu_erf, _gelu_tanh, fexp, fphi, swiglu_chunk
from .gemm import KIND_BF16, _narrow, _widen

_NJIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
_BF16 = np.dtype(ml_dtypes.bfloat16)
#: bfloat16 elements widened into float32 scratch at a time (three such blocks stay in L1/L2)
BF16_BLOCK = 1 << 12


class GeluBackwardPlan(NamedTuple):
    tanh: bool
    parallel: bool
    chunk: int

    def describe(self) -> str:
        form = "tanh" if self.tanh else "erf"
        return f"{form} form, " + (f"parallel chunks of {self.chunk}" if self.parallel else "serial")


def gelu_backward_plan(size: int, tanh: bool) -> GeluBackwardPlan:
    threads = nb.get_num_threads()
    parallel = size >= PARALLEL_MIN_COSTLY and threads > 1
    chunk = max(CHUNK_MIN, -(-size // threads)) if parallel else max(size, 1)
    return GeluBackwardPlan(bool(tanh), parallel, chunk)


@nb.njit(**_NJIT)
def _erf_slice(g, x, out):
    inv_sqrt_2pi = x.dtype.type(0.3989422804014327)
    half = x.dtype.type(-0.5)
    for i in range(x.size):
        v = x[i]
        out[i] = g[i] * (fphi(v) + v * inv_sqrt_2pi * fexp(half * v * v))


@nb.njit(**_NJIT)
def _tanh_slice(g, x, out):
    one = x.dtype.type(1.0)
    k2 = x.dtype.type(2.0 * 0.7978845608028654)  # 2 sqrt(2/pi)
    c = x.dtype.type(0.044715)
    c3 = x.dtype.type(3.0 * 0.044715)
    for i in range(x.size):
        v = x[i]
        s = one / (one + fexp(-k2 * (v + c * v * v * v)))
        out[i] = g[i] * (s + v * s * (one - s) * k2 * (one + c3 * v * v))


# The in-place forms (a graph's memory plan writes dX over a dying grad or X) read and write one
# array: with three, LLVM's overlap check sees out == g and picks the scalar loop (~10x slower).
@nb.njit(**_NJIT)
def _erf_slice_over_g(x, out):
    inv_sqrt_2pi = x.dtype.type(0.3989422804014327)
    half = x.dtype.type(-0.5)
    for i in range(x.size):
        v = x[i]
        out[i] = out[i] * (fphi(v) + v * inv_sqrt_2pi * fexp(half * v * v))


@nb.njit(**_NJIT)
def _erf_slice_over_x(g, out):
    inv_sqrt_2pi = out.dtype.type(0.3989422804014327)
    half = out.dtype.type(-0.5)
    for i in range(out.size):
        v = out[i]
        out[i] = g[i] * (fphi(v) + v * inv_sqrt_2pi * fexp(half * v * v))


@nb.njit(**_NJIT)
def _tanh_slice_over_g(x, out):
    one = x.dtype.type(1.0)
    k2 = x.dtype.type(2.0 * 0.7978845608028654)
    c = x.dtype.type(0.044715)
    c3 = x.dtype.type(3.0 * 0.044715)
    for i in range(x.size):
        v = x[i]
        s = one / (one + fexp(-k2 * (v + c * v * v * v)))
        out[i] = out[i] * (s + v * s * (one - s) * k2 * (one + c3 * v * v))


@nb.njit(**_NJIT)
def _tanh_slice_over_x(g, out):
    one = out.dtype.type(1.0)
    k2 = out.dtype.type(2.0 * 0.7978845608028654)
    c = out.dtype.type(0.044715)
    c3 = out.dtype.type(3.0 * 0.044715)
    for i in range(out.size):
        v = out[i]
        s = one / (one + fexp(-k2 * (v + c * v * v * v)))
        out[i] = g[i] * (s + v * s * (one - s) * k2 * (one + c3 * v * v))


@nb.njit(nogil=True, cache=True)
def _slice(g, x, out, tanh, over):
    # over: 0 a separate out, 1 out is g's memory, 2 out is x's memory
    if over == 1:
        if tanh:
            _tanh_slice_over_g(x, out)
        else:
            _erf_slice_over_g(x, out)
    elif over == 2:
        if tanh:
            _tanh_slice_over_x(g, out)
        else:
            _erf_slice_over_x(g, out)
    elif tanh:
        _tanh_slice(g, x, out)
    else:
        _erf_slice(g, x, out)


@nb.njit(nogil=True, cache=True)
def _serial(g, x, out, tanh, over):
    _slice(g, x, out, tanh, over)


@nb.njit(parallel=True, nogil=True, cache=True)
def _parallel(g, x, out, tanh, chunk, over):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        lo = t * chunk
        hi = min(n, lo + chunk)
        _slice(g[lo:hi], x[lo:hi], out[lo:hi], tanh, over)


@nb.njit(nogil=True, cache=True)
def _gelu_range_bf16(g, x, out, tanh, lo, hi):
    m = min(max(hi - lo, 0), BF16_BLOCK)
    gu, xu, ou = np.empty(m, np.uint32), np.empty(m, np.uint32), np.empty(m, np.uint32)
    gf, xf, of = gu.view(np.float32), xu.view(np.float32), ou.view(np.float32)
    for b0 in range(lo, hi, BF16_BLOCK):
        n = min(hi, b0 + BF16_BLOCK) - b0
        _widen(g[b0 : b0 + n], gu[:n], gf[:n], KIND_BF16)
        _widen(x[b0 : b0 + n], xu[:n], xf[:n], KIND_BF16)
        # a result buffer of its own: written over an input, LLVM's overlap check picks the scalar loop
        if tanh:
            _tanh_slice(gf[:n], xf[:n], of[:n])
        else:
            _erf_slice(gf[:n], xf[:n], of[:n])
        _narrow(of[:n], ou[:n], out[b0 : b0 + n], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _gelu_serial_bf16(g, x, out, tanh):
    _gelu_range_bf16(g, x, out, tanh, 0, x.size)


@nb.njit(parallel=True, nogil=True, cache=True)
def _gelu_parallel_bf16(g, x, out, tanh, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        _gelu_range_bf16(g, x, out, tanh, t * chunk, min(n, (t + 1) * chunk))


def gelu_backward(g: np.ndarray, x: np.ndarray, out: np.ndarray, plan: GeluBackwardPlan) -> None:
    """``out = g * gelu'(x)`` (contiguous arrays of one shape and dtype)."""
    if x.size == 0:
        return
    g, x, out = g.reshape(-1), x.reshape(-1), out.reshape(-1)
    ptr = out.ctypes.data
    over = 1 if ptr == g.ctypes.data else 2 if ptr == x.ctypes.data else 0
    if over == 0 and (np.may_share_memory(out, g) or np.may_share_memory(out, x)):
        res = np.empty_like(out)  # a partial overlap: no form reads every input before it is written
        gelu_backward(g, x, res, plan)
        out[...] = res
        return
    if x.dtype == _BF16:  # (block-wise through scratch: safe written over g or x)
        g, x, out = g.view(np.uint16), x.view(np.uint16), out.view(np.uint16)
        if plan.parallel:
            _gelu_parallel_bf16(g, x, out, plan.tanh, plan.chunk)
        else:
            _gelu_serial_bf16(g, x, out, plan.tanh)
        return
    if plan.parallel:
        _parallel(g, x, out, plan.tanh, plan.chunk, over)
    else:
        _serial(g, x, out, plan.tanh, over)


# -- Gelu forward on bfloat16 storage ----------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _gelu_fwd_range_bf16(x, out, tanh, lo, hi):
    # the float32 kernel's loops on a block widened into scratch, rounded once: the fp32 adapter's
    # values (Cast up, Gelu, Cast down) without its two float32 copies of the tensor
    m = min(max(hi - lo, 0), BF16_BLOCK)
    xu, ou = np.empty(m, np.uint32), np.empty(m, np.uint32)
    xf, of = xu.view(np.float32), ou.view(np.float32)
    zero = np.float32(0.0)
    for b0 in range(lo, hi, BF16_BLOCK):
        n = min(hi, b0 + BF16_BLOCK) - b0
        _widen(x[b0 : b0 + n], xu[:n], xf[:n], KIND_BF16)
        if tanh:
            _gelu_tanh(xf[:n], of[:n], zero, zero)
        else:
            _gelu_erf(xf[:n], of[:n], zero, zero)
        _narrow(of[:n], ou[:n], out[b0 : b0 + n], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _gelu_fwd_serial_bf16(x, out, tanh):
    _gelu_fwd_range_bf16(x, out, tanh, 0, x.size)


@nb.njit(parallel=True, nogil=True, cache=True)
def _gelu_fwd_parallel_bf16(x, out, tanh, chunk):
    n = x.size
    for t in nb.prange((n + chunk - 1) // chunk):
        _gelu_fwd_range_bf16(x, out, tanh, t * chunk, min(n, (t + 1) * chunk))


def gelu_bf16(x: np.ndarray, out: np.ndarray, plan: GeluBackwardPlan) -> None:
    """``out = gelu(x)`` for bfloat16 ``x`` and ``out`` (contiguous, one shape), computed in float32
    and rounded to nearest even; ``plan``: :func:`gelu_backward_plan` (the same costly-map split)."""
    if x.size == 0:
        return
    x, out = x.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint16)
    if plan.parallel:
        _gelu_fwd_parallel_bf16(x, out, plan.tanh, plan.chunk)
    else:
        _gelu_fwd_serial_bf16(x, out, plan.tanh)


# -- SwiGLU forward on bfloat16 storage -------------------------------------------------------------------
@nb.njit(**_NJIT)
def swiglu_range_bf16(g, v, out, lo, hi, alpha):
    """``out[lo:hi]`` for bfloat16 bits: :func:`.activation.swiglu_chunk` on blocks widened into float32
    scratch, rounded once (the fp32 adapter's values without its float32 copies)."""
    m = min(max(hi - lo, 0), BF16_BLOCK)
    gu, vu, ou = np.empty(m, np.uint32), np.empty(m, np.uint32), np.empty(m, np.uint32)
    gf, vf, of = gu.view(np.float32), vu.view(np.float32), ou.view(np.float32)
    for b0 in range(lo, hi, BF16_BLOCK):
        n = min(hi, b0 + BF16_BLOCK) - b0
        _widen(g[b0 : b0 + n], gu[:n], gf[:n], KIND_BF16)
        _widen(v[b0 : b0 + n], vu[:n], vf[:n], KIND_BF16)
        swiglu_chunk(gf, vf, of, 0, n, alpha)
        _narrow(of[:n], ou[:n], out[b0 : b0 + n], KIND_BF16)


@nb.njit(parallel=True, **_NJIT)
def swiglu_parallel_bf16(g, v, out, alpha, chunk):
    n = g.size
    for c in nb.prange((n + chunk - 1) // chunk):
        lo = c * chunk
        swiglu_range_bf16(g, v, out, lo, min(lo + chunk, n), alpha)


def swiglu_bf16(ins, outs, attrs, plan, ws):
    """SwiGLU on contiguous bfloat16 storage (``plan``: :func:`.activation.swiglu_plan`'s float32 alpha)."""
    alpha, chunk = plan
    g, v, dst = (a.reshape(-1).view(np.uint16) for a in (ins[0], ins[1], outs[0]))
    # written over g or v exactly (a graph's memory plan): each block is read before it is written;
    # a partial overlap is computed aside
    partial = any(np.may_share_memory(dst, a) and dst.ctypes.data != a.ctypes.data for a in (g, v))
    out = np.empty_like(dst) if partial else dst
    if chunk:
        swiglu_parallel_bf16(g, v, out, alpha, chunk)
    elif out.size:
        swiglu_range_bf16(g, v, out, 0, out.size, alpha)
    if partial:
        np.copyto(dst, out)


# -- SwiGLUBackward -----------------------------------------------------------------------------------------
class MapPlan(NamedTuple):
    parallel: bool
    chunk: int


def map_plan(size: int) -> MapPlan:
    """Serial below the costly-map threshold (a sigmoid per element), else chunks per thread."""
    threads = nb.get_num_threads()
    parallel = size >= PARALLEL_MIN_COSTLY and threads > 1
    return MapPlan(parallel, max(CHUNK_MIN, -(-size // threads)) if parallel else max(size, 1))


@nb.njit(**_NJIT)
def _swiglu_slice(g, a, b, alpha, da, db):
    one = a.dtype.type(1.0)
    al = a.dtype.type(alpha)
    for i in range(a.size):
        v = a[i]
        s = one / (one + fexp(-al * v))
        gv = g[i]
        da[i] = gv * b[i] * (s + al * v * s * (one - s))
        db[i] = gv * v * s


@nb.njit(nogil=True, cache=True)
def _swiglu_serial(g, a, b, alpha, da, db):
    _swiglu_slice(g, a, b, alpha, da, db)


@nb.njit(parallel=True, nogil=True, cache=True)
def _swiglu_parallel(g, a, b, alpha, da, db, chunk):
    n = a.size
    for t in nb.prange((n + chunk - 1) // chunk):
        lo = t * chunk
        hi = min(n, lo + chunk)
        _swiglu_slice(g[lo:hi], a[lo:hi], b[lo:hi], alpha, da[lo:hi], db[lo:hi])


@nb.njit(nogil=True, cache=True)
def _swiglu_range_bf16(g, a, b, alpha, da, db, lo, hi):
    m = min(max(hi - lo, 0), BF16_BLOCK)
    gu, au, bu = np.empty(m, np.uint32), np.empty(m, np.uint32), np.empty(m, np.uint32)
    gf, af, bf = gu.view(np.float32), au.view(np.float32), bu.view(np.float32)
    for b0 in range(lo, hi, BF16_BLOCK):
        n = min(hi, b0 + BF16_BLOCK) - b0
        _widen(g[b0 : b0 + n], gu[:n], gf[:n], KIND_BF16)
        _widen(a[b0 : b0 + n], au[:n], af[:n], KIND_BF16)
        _widen(b[b0 : b0 + n], bu[:n], bf[:n], KIND_BF16)
        _swiglu_slice(gf[:n], af[:n], bf[:n], alpha, gf[:n], bf[:n])  # each element read before written
        _narrow(gf[:n], gu[:n], da[b0 : b0 + n], KIND_BF16)
        _narrow(bf[:n], bu[:n], db[b0 : b0 + n], KIND_BF16)


@nb.njit(nogil=True, cache=True)
def _swiglu_serial_bf16(g, a, b, alpha, da, db):
    _swiglu_range_bf16(g, a, b, alpha, da, db, 0, a.size)


@nb.njit(parallel=True, nogil=True, cache=True)
def _swiglu_parallel_bf16(g, a, b, alpha, da, db, chunk):
    n = a.size
    for t in nb.prange((n + chunk - 1) // chunk):
        _swiglu_range_bf16(g, a, b, alpha, da, db, t * chunk, min(n, (t + 1) * chunk))


def swiglu_backward(g, a, b, alpha: float, da, db, plan: MapPlan) -> None:
    """``da = g * b * d swish(a) / da``, ``db = g * swish(a)`` (contiguous arrays of one shape)."""
    if a.size == 0:
        return
    args = (g.reshape(-1), a.reshape(-1), b.reshape(-1), float(alpha), da.reshape(-1), db.reshape(-1))
    if a.dtype == _BF16:
        args = tuple(v.view(np.uint16) if isinstance(v, np.ndarray) else v for v in args)
        if plan.parallel:
            _swiglu_parallel_bf16(*args, plan.chunk)
        else:
            _swiglu_serial_bf16(*args)
    elif plan.parallel:
        _swiglu_parallel(*args, plan.chunk)
    else:
        _swiglu_serial(*args)
