"""A decode step of a LLaMA layer as four parallel regions on single-threaded MKL.

One token's step is matrix-vector products (memory-bound: every weight byte is read once)
with little work between them: norms, RoPE, the K/V store, attention, SiLU. Run op by op that
is ~15 kernel calls a layer, each its own dispatch and (for the products) its own fork/join of
MKL's threads, with the interpreter's state cold after each product streamed megabytes of
weights. Here each thread computes its share of a projection's outputs (its rows of the
weight: ``cblas_sgemv`` for one row, ``cblas_sgemm`` for a batch) and carries on with what needs
only those:

1. ``attention_block``: the RMSNorm of ``h`` (every thread for itself: a few KB), the q/k/v
   rows of its KV heads, RoPE, the K/V store into the cache, the attention of those heads;
2. ``residual_gemm``: ``h += y @ W_o.T`` over its rows of W_o;
3. ``mlp_block``: the norm again, its rows of the gate and up projections, SiLU(gate) * up;
4. ``residual_gemm``: ``h += gu @ W_down.T``.

The same arithmetic as the op-by-op step (float32, MKL's products, the decoder's own RoPE,
attention and norm kernels), so the two agree to rounding.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..kernels.cpu import mkl_nb as MN
from ..kernels.cpu.activation import swiglu_chunk
from ..kernels.cpu.gemm import gemm_rows
from ..kernels.cpu.norm import norm_rows32
from .attention import _decode_task, decode_attention_numpy, rope_query, rope_store_numpy, store_key_value


def _rows_entry(x, w, R, k, lo, hi, beta, out, ldo):
    # gemm_rows on raw addresses (x (R, k), w (hi, k) row-major; out (R, hi - lo), leading dimension ldo)
    gemm_rows(
        nb.carray(x, (R, k), np.float32),
        nb.carray(w, (hi, k), np.float32),
        lo,
        hi,
        beta,
        nb.carray(out, (R, ldo), np.float32)[:, : hi - lo],
    )


_ROWS_SIG = types.void(
    types.voidptr,
    types.voidptr,
    types.int64,
    types.int64,
    types.int64,
    types.int64,
    types.float32,
    types.voidptr,
    types.int64,
)
_ROWS_CFUNC: list = []
_DECODE_CFUNC: list = []


def _decode_entry(t, q, R, Hq, D, kt, S, Hkv, T, v, slots, lengths, y, scale):
    # _decode_task on raw addresses of C-contiguous q, y (R, Hq, 1, D), kt (S, Hkv, D, T), v (S, Hkv, T, D), slots, lengths (R)
    _decode_task(
        t,
        nb.carray(q, (R, Hq, 1, D), np.float32),
        nb.carray(kt, (S, Hkv, D, T), np.float32),
        nb.carray(v, (S, Hkv, T, D), np.float32),
        nb.carray(slots, R, np.int64),
        nb.carray(lengths, R, np.int64),
        nb.carray(y, (R, Hq, 1, D), np.float32),
        scale,
    )


_I64, _P = types.int64, types.voidptr
_DECODE_SIG = types.void(_I64, _P, _I64, _I64, _I64, _P, _I64, _I64, _I64, _P, _P, _P, _P, types.float32)


def addresses() -> np.ndarray | None:
    """:func:`opsnn.kernels.cpu.mkl_nb.addresses` (None without MKL) and a fourth entry: where
    the ``cblas_sgemv`` entry is 0, the address of ``gemm_rows`` compiled once as a C callback.
    The four kernels call it through that address instead of each compiling its own copy
    (LLVM optimizes and emits a callee once per parallel kernel that links it)."""
    fns = MN.addresses()
    if fns is None:
        return None
    rows = 0
    if fns[2] == 0:
        if not _ROWS_CFUNC:
            _ROWS_CFUNC.append(nb.cfunc(_ROWS_SIG, nogil=True, cache=True)(_rows_entry))
        rows = _ROWS_CFUNC[0].address
    if not _DECODE_CFUNC:
        _DECODE_CFUNC.append(nb.cfunc(_DECODE_SIG, nogil=True, cache=True)(_decode_entry))
    return np.array([*fns[:3], rows, _DECODE_CFUNC[0].address], np.int64)


@intrinsic
def _call_rows(typingctx, fn, x, w, R, k, lo, hi, beta, out, ldo):
    # the C callback of addresses()[3] (addresses as integers, e.g. arr.ctypes.data)
    sig = types.void(fn, x, w, R, k, lo, hi, beta, out, ldo)

    def codegen(context, builder, signature, args):
        i64, f32, ptr = ir.IntType(64), ir.FloatType(), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [ptr, ptr, i64, i64, i64, i64, f32, ptr, i64])
        tys = signature.args
        call = []
        for i in range(1, 10):
            v, t = args[i], tys[i]
            if i in (1, 2, 8):
                call.append(builder.inttoptr(v, ptr))
            elif i == 7:
                call.append(v if t == types.float32 else builder.fptrunc(v, f32))
            else:
                call.append(context.cast(builder, v, t, types.int64))
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), call)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _call_decode(typingctx, fn, t, q, R, Hq, D, kt, S, Hkv, T, v, slots, lengths, y, scale):
    # the C callback of addresses()[4] (addresses as integers)
    sig = types.void(fn, t, q, R, Hq, D, kt, S, Hkv, T, v, slots, lengths, y, scale)

    def codegen(context, builder, signature, args):
        i64, f32, ptr = ir.IntType(64), ir.FloatType(), ir.IntType(8).as_pointer()
        kinds = "ipiiipiiipppp"
        fnty = ir.FunctionType(ir.VoidType(), [ptr if k == "p" else i64 for k in kinds] + [f32])
        tys = signature.args
        call = [
            builder.inttoptr(args[i], ptr) if k == "p" else context.cast(builder, args[i], tys[i], types.int64)
            for i, k in enumerate(kinds, start=1)
        ]
        call.append(context.cast(builder, args[14], tys[14], types.float32))
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), call)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(nogil=True, cache=True)
def _rms(h, w, eps, x):
    # x[b] = rms_norm(h[b]) * w for every row (h, x: (R, H))
    stats = np.empty(2 * h.shape[0])
    R = h.shape[0]
    norm_rows32(h.reshape(-1), w, w, False, x.reshape(-1), stats[:R], stats[R:], 0, R, h.shape[1], eps, True)


@nb.njit(nogil=True, cache=True)
def _normed(h, w, eps):
    # a thread's own copy of rms_norm(h) * w (h (R, H): a few KB, cheaper than a barrier)
    x = np.empty(h.shape, np.float32)
    _rms(h, w, eps, x)
    return x


@nb.njit(nogil=True, cache=True)
def _gemm_t(fns, x, w, lo, hi, beta, out):
    # out = x @ w[lo:hi].T + beta * out (x (R, K), w (N, K) row-major; out (R, hi - lo), unit column stride)
    R, k = x.shape
    if fns[2] == 0:  # no MKL gemv (libraries.mkl_gemv_in_tasks): opsnn's few-row kernel, through its address
        _call_rows(
            fns[3], x.ctypes.data, w.ctypes.data, R, k, lo, hi, np.float32(beta), out.ctypes.data, out.strides[0] // 4
        )
    elif R == 1:  # one row: a matrix-vector product over the weight's rows
        MN.sgemv(fns[2], hi - lo, k, w[lo:].ctypes.data, k, x.ctypes.data, beta, out.ctypes.data)
    else:
        MN.sgemm(
            fns[0],
            MN.NO_TRANS,
            MN.TRANS,
            R,
            hi - lo,
            k,
            x.ctypes.data,
            k,
            w[lo:].ctypes.data,
            k,
            beta,
            out.ctypes.data,
            out.strides[0] // 4,
        )


@nb.njit(parallel=True, nogil=True, cache=True)
def attention_block(h, ln_w, eps, wq, wk, wv, cos, sin, pos, kt, vc, slots, lengths, rows, q, y, scale, fns, nt):
    """R rows (h (R, H)): ``x = rms_norm(h) * ln_w``; per KV head ``hk`` (dealt to the threads in
    turn) its group's query rows of ``wq`` into ``q`` (R, Hq, 1, D), its key and value rows, RoPE
    at positions ``pos``, the keys (transposed) and values of the first ``rows`` rows into cache
    slots ``slots`` (``kt`` (slots, Hkv, D, T), ``vc`` (slots, Hkv, T, D)), then the attention of
    its query heads over the first ``lengths[b]`` positions of each row into ``y`` (R, Hq, 1, D)."""
    Hkv, D = kt.shape[1], kt.shape[2]
    R, Hq = q.shape[0], q.shape[1]
    g = Hq // Hkv
    q2 = q.reshape(R, Hq * D)
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = _normed(h, ln_w, eps)
        kv = np.empty((2, R, D), np.float32)
        for hk in range(th, Hkv, nt):
            _gemm_t(fns, x, wq, hk * g * D, (hk + 1) * g * D, 0.0, q2[:, hk * g * D : (hk + 1) * g * D])
            _gemm_t(fns, x, wk, hk * D, (hk + 1) * D, 0.0, kv[0])
            _gemm_t(fns, x, wv, hk * D, (hk + 1) * D, 0.0, kv[1])
            for b in range(R):
                c, s = cos[pos[b]], sin[pos[b]]
                for gi in range(g):
                    rope_query(q[b, hk * g + gi, 0], c, s)
                if b < rows:
                    store_key_value(kv[0, b], kv[1, b], kt, vc, slots[b], hk, pos[b], c, s)
            for b in range(R):  # (kt, vc, slots, lengths: C-contiguous, as decoder._fuse checks)
                _call_decode(
                    fns[4],
                    b * Hkv + hk,
                    q.ctypes.data,
                    R,
                    Hq,
                    D,
                    kt.ctypes.data,
                    kt.shape[0],
                    Hkv,
                    kt.shape[3],
                    vc.ctypes.data,
                    slots.ctypes.data,
                    lengths.ctypes.data,
                    y.ctypes.data,
                    scale,
                )
        MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True)
def _cols(n, th, nt):
    per = -(-n // nt)
    per = -(-per // 16) * 16  # whole cache lines of output per thread
    lo = min(n, th * per)
    return lo, min(n, lo + per)


@nb.njit(parallel=True, nogil=True, cache=True)
def residual_gemm(w, x, h, fns, nt):
    """``h += x @ w.T`` (w (N, K) row-major, x (R, K), h (R, N)), each thread its block of columns
    (rows of ``w``)."""
    n = w.shape[0]
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        lo, hi = _cols(n, th, nt)
        if hi > lo:
            _gemm_t(fns, x, w, lo, hi, 1.0, h[:, lo:hi])
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def mlp_block(h, ln_w, eps, wg, wu, gu, alpha, fns, nt):
    """``x = rms_norm(h) * ln_w``; ``gu = silu_alpha(x @ wg.T) * (x @ wu.T)`` (h (R, H), gu (R, I)),
    each thread its block of columns of both projections."""
    n = wg.shape[0]
    R = h.shape[0]
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = _normed(h, ln_w, eps)
        lo, hi = _cols(n, th, nt)
        if hi > lo:
            gate = np.empty((R, hi - lo), np.float32)
            up = np.empty((R, hi - lo), np.float32)
            _gemm_t(fns, x, wg, lo, hi, 0.0, gate)
            _gemm_t(fns, x, wu, lo, hi, 0.0, up)
            for b in range(R):
                swiglu_chunk(gate[b], up[b], gu[b, lo:hi], 0, hi - lo, alpha)
        MN.set_threads_local(fns[1], prev)


@nb.njit(parallel=True, nogil=True, cache=True)
def head_block(h, ln_w, eps, w, logits, fns, nt):
    """``logits = rms_norm(h) * ln_w @ w.T`` (h (R, H), logits (R, V)), each thread its block of
    the vocabulary."""
    n = w.shape[0]
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        x = _normed(h, ln_w, eps)
        lo, hi = _cols(n, th, nt)
        if hi > lo:
            _gemm_t(fns, x, w, lo, hi, 0.0, logits[:, lo:hi])
        MN.set_threads_local(fns[1], prev)


# -- numpy stand-ins (opsnn.ops.tiering): the same regions, nothing to compile -------------------------------
def _rms_numpy(h, w, eps):
    # rms_norm(h) * w per row: float64 statistics, the row scaled as norm_rows32 does ((x * a) * w in float32)
    with np.errstate(all="ignore"):
        h64 = h.astype(np.float64)
        inv = 1.0 / np.sqrt(np.einsum("ij,ij->i", h64, h64) / h.shape[1] + eps)
        return (h * inv.astype(np.float32)[:, None]) * w


@nb.njit(nogil=True, cache=True)
def layers_step(
    h,
    lns,
    eps,
    wqs,
    wks,
    wvs,
    wos,
    wgs,
    wus,
    wds,
    cos,
    sin,
    pos,
    kts,
    vcs,
    slots,
    lengths,
    rows,
    q,
    y,
    gu,
    scale,
    fns,
    nt,
):
    """Every layer's four regions in one call, no Python between them (what a prepared step runs
    when no observer watches each region): ``lns`` (layers, 2, H) the norms' weights, ``wqs`` ..
    ``wds`` and ``kts`` / ``vcs`` a weight or cache array per layer, the rest as the regions take
    them (``gu`` the MLP's (R, intermediate) buffer)."""
    R = h.shape[0]
    one = np.float32(1.0)
    for i in range(len(wqs)):
        attention_block(
            h,
            lns[i, 0],
            eps,
            wqs[i],
            wks[i],
            wvs[i],
            cos,
            sin,
            pos,
            kts[i],
            vcs[i],
            slots,
            lengths,
            rows,
            q,
            y,
            scale,
            fns,
            nt,
        )
        residual_gemm(wos[i], y.reshape(R, -1), h, fns, nt)
        mlp_block(h, lns[i, 1], eps, wgs[i], wus[i], gu, one, fns, nt)
        residual_gemm(wds[i], gu, h, fns, nt)


def attention_block_numpy(h, ln_w, eps, wq, wk, wv, cos, sin, pos, kt, vc, slots, lengths, rows, q, y, scale):
    """:func:`attention_block` in numpy (BLAS products, attention by BLAS per row and KV head,
    the same softmax: NaN and Inf as the numba kernel gives them)."""
    Hkv, D = kt.shape[1], kt.shape[2]
    R, Hq = q.shape[0], q.shape[1]
    x = _rms_numpy(h, ln_w, eps)
    q3 = q.reshape(R, Hq, D)
    np.matmul(x, wq.T, out=q.reshape(R, Hq * D))
    k = (x @ wk.T).reshape(R, Hkv, D)
    v = (x @ wv.T).reshape(R, Hkv, D)
    rope_store_numpy(q3, k, v, cos, sin, pos, kt, vc, slots, rows)
    decode_attention_numpy(q, kt, vc, slots, lengths, y, scale)


def residual_gemm_numpy(w, x, h):
    """:func:`residual_gemm` in numpy: ``h += x @ w.T``."""
    h += x @ w.T


def mlp_block_numpy(h, ln_w, eps, wg, wu, gu, alpha):
    """:func:`mlp_block` in numpy (SiLU in float32 as ``swiglu_chunk``)."""
    x = _rms_numpy(h, ln_w, eps)
    gate, up = x @ wg.T, x @ wu.T
    with np.errstate(all="ignore"):
        gu[...] = gate / (np.float32(1.0) + np.exp(-np.float32(alpha) * gate)) * up


def head_block_numpy(h, ln_w, eps, w, logits):
    """:func:`head_block` in numpy."""
    np.matmul(_rms_numpy(h, ln_w, eps), w.T, out=logits)


__all__ = [
    "addresses",
    "attention_block_numpy",
    "attention_block",
    "head_block",
    "head_block_numpy",
    "layers_step",
    "mlp_block",
    "mlp_block_numpy",
    "residual_gemm",
    "residual_gemm_numpy",
]
