"""float32 products with a constant weight packed once: ``C = A @ B``, B in column panels of 16.

Where no library packs a constant weight once on an AVX2 CPU (OpenBLAS packs B on every call; oneDNN's
matmul there is its ``gemm:jit``, which does too), the plan packs B (K, N) into ``panels[N / 16, K, 16]``
(the last panel zero-padded) and each call streams it once. The register tile is 6 rows x 16 columns:
twelve 8-lane accumulators, two loads of B and six broadcasts of A per step of K, written in LLVM IR
through a numba intrinsic (numba's loops do not keep such a tile in registers), one variant per row
count 1..6 for the last rows. Threads take chunks of panels as they come free; K goes in blocks of
``KC`` so a panel's block stays in L1 while every row of A passes over it, the next block prefetched
into L2 meanwhile. Each output element is one fused multiply-add chain per block of K, blocks added
in order: IEEE arithmetic, NaN and Inf as the sums give them.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: columns of a panel: two 8-lane vectors
NR = 16
#: rows of the register tile
MR = 6
#: the block of K a panel's slice covers (16 KB of the panel: L1-resident)
KC = 256

_F32 = ir.FloatType()
_V8 = ir.VectorType(_F32, 8)
_I64 = ir.IntType(64)
_I32 = ir.IntType(32)
_I8P = ir.IntType(8).as_pointer()


def _tile_intrinsic(rows: int):
    """``tile(a, a_off, lda, b, b_off, c, c_off, ldc, k, accumulate)``: for r < ``rows``, j < 16,
    ``c[c_off + r ldc + j] (+)= sum_{kk < k} a[a_off + r lda + kk] * b[b_off + 16 kk + j]`` on flat
    float32 arrays (``accumulate`` 0: store, else add to what C holds)."""

    @intrinsic
    def tile(typingctx, a, a_off, lda, b, b_off, c, c_off, ldc, k, accumulate):
        sig = types.void(
            a, types.int64, types.int64, b, types.int64, c, types.int64, types.int64, types.int64, types.int64
        )

        def codegen(context, builder, signature, args):
            a_, a_off, lda, b_, b_off, c_, c_off, ldc, k, acc = args
            A = builder.gep(context.make_array(signature.args[0])(context, builder, a_).data, [a_off])
            B = builder.gep(context.make_array(signature.args[3])(context, builder, b_).data, [b_off])
            C = builder.gep(context.make_array(signature.args[5])(context, builder, c_).data, [c_off])
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8] * 3), "llvm.fma.v8f32")
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32]), "llvm.prefetch.p0"
            )
            row_ptr = [builder.gep(A, [builder.mul(lda, ir.Constant(_I64, r))]) for r in range(rows)]
            zero = ir.Constant(_V8, [0.0] * 8)
            splat = ir.Constant(ir.VectorType(_I32, 8), [0] * 8)
            entry = builder.block
            loop = builder.append_basic_block("tile.loop")
            done = builder.append_basic_block("tile.done")
            builder.cbranch(builder.icmp_signed(">", k, ir.Constant(_I64, 0)), loop, done)

            builder.position_at_end(loop)
            kk = builder.phi(_I64)
            kk.add_incoming(ir.Constant(_I64, 0), entry)
            accs = []
            for _ in range(2 * rows):
                p = builder.phi(_V8)
                p.add_incoming(zero, entry)
                accs.append(p)
            bp = builder.gep(B, [builder.mul(kk, ir.Constant(_I64, NR))])
            b0 = builder.load(builder.bitcast(bp, _V8.as_pointer()), align=4)
            b1 = builder.load(builder.bitcast(builder.gep(bp, [ir.Constant(_I64, 8)]), _V8.as_pointer()), align=4)
            # the thread's next block of B (past the last, the next panel's first) into L2 while this one
            # computes: a weight read once per call comes from memory, and a page ends the hardware's stream
            ahead = builder.bitcast(builder.gep(bp, [ir.Constant(_I64, KC * NR)]), _I8P)
            builder.call(prefetch, [ahead, ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1)])
            sums = []
            for r in range(rows):
                s = builder.load(builder.gep(row_ptr[r], [kk]))
                v = builder.insert_element(ir.Constant(_V8, ir.Undefined), s, ir.Constant(_I32, 0))
                v = builder.shuffle_vector(v, ir.Constant(_V8, ir.Undefined), splat)
                sums.append(builder.call(fma, [v, b0, accs[2 * r]]))
                sums.append(builder.call(fma, [v, b1, accs[2 * r + 1]]))
            nxt = builder.add(kk, ir.Constant(_I64, 1))
            kk.add_incoming(nxt, loop)
            for p, s in zip(accs, sums):
                p.add_incoming(s, loop)
            builder.cbranch(builder.icmp_signed("<", nxt, k), loop, done)

            builder.position_at_end(done)
            totals = []
            for s in sums:  # the phis first: LLVM wants them at the top of the block
                t = builder.phi(_V8)
                t.add_incoming(zero, entry)
                t.add_incoming(s, loop)
                totals.append(t)
            adding = builder.icmp_signed("!=", acc, ir.Constant(_I64, 0))
            for r in range(rows):
                crow = builder.gep(C, [builder.mul(ldc, ir.Constant(_I64, r))])
                for j in range(2):
                    total = totals[2 * r + j]
                    ptr = builder.bitcast(builder.gep(crow, [ir.Constant(_I64, 8 * j)]), _V8.as_pointer())
                    with builder.if_else(adding) as (then, otherwise):
                        with then:
                            builder.store(builder.fadd(builder.load(ptr, align=4), total), ptr, align=4)
                        with otherwise:
                            builder.store(total, ptr, align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_T1, _T2, _T3, _T4, _T5, _T6 = (_tile_intrinsic(r) for r in range(1, MR + 1))


@nb.njit(nogil=True, cache=True)
def _panel_rows(a, a_off, lda, b, b_off, c, c_off, ldc, k, accumulate, m):
    """Every row of A (``m``) against one panel's block of K: tiles of 6 rows, then the rest."""
    i = 0
    while i + MR <= m:
        _T6(a, a_off + i * lda, lda, b, b_off, c, c_off + i * ldc, ldc, k, accumulate)
        i += MR
    r = m - i
    ao, co = a_off + i * lda, c_off + i * ldc
    if r == 5:
        _T5(a, ao, lda, b, b_off, c, co, ldc, k, accumulate)
    elif r == 4:
        _T4(a, ao, lda, b, b_off, c, co, ldc, k, accumulate)
    elif r == 3:
        _T3(a, ao, lda, b, b_off, c, co, ldc, k, accumulate)
    elif r == 2:
        _T2(a, ao, lda, b, b_off, c, co, ldc, k, accumulate)
    elif r == 1:
        _T1(a, ao, lda, b, b_off, c, co, ldc, k, accumulate)


@nb.njit(nogil=True, cache=True)
def _panel(af, m, k, bf, p, cf, n, scratch, accumulate):
    """Panel ``p`` of C (rows of A against columns 16 p .. 16 p + 15 of B), added to C's values when
    ``accumulate``; a last, partial panel goes through ``scratch`` (m, 16)."""
    full = (p + 1) * NR <= n
    tail = n - p * NR
    if not full and accumulate:
        for i in range(m):
            for j in range(tail):
                scratch[i * NR + j] = cf[i * n + p * NR + j]
    for k0 in range(0, k, KC):
        kb = min(KC, k - k0)
        acc = 1 if k0 > 0 or accumulate else 0
        if full:
            _panel_rows(af, k0, k, bf, p * k * NR + k0 * NR, cf, p * NR, n, kb, acc, m)
        else:
            _panel_rows(af, k0, k, bf, p * k * NR + k0 * NR, scratch, 0, NR, kb, acc, m)
    if not full:
        for i in range(m):
            for j in range(tail):
                cf[i * n + p * NR + j] = scratch[i * NR + j]


@intrinsic
def _fetch_add(typingctx, counter, step):
    """``counter[0] += step`` atomically (an int64 array), returning the value before."""
    sig = types.int64(counter, types.int64)

    def codegen(context, builder, signature, args):
        ptr = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", ptr, args[1], "monotonic")

    return sig, codegen


#: panels a thread takes at a time (fewer where each thread would get under 4 chunks): its
#: prefetch runs on into the next
CHUNK = 4
#: iterations of the parallel loop: each takes chunks until none is left (the first of each thread does)
WORKERS = 256


@nb.njit(parallel=True, nogil=True, cache=True)
def _gemm_parallel(a, panels, c, accumulate, chunk):
    m, k = a.shape
    n = c.shape[1]
    af, bf, cf = a.reshape(-1), panels.reshape(-1), c.reshape(-1)
    scratch = np.zeros(m * NR if n % NR else 0, np.float32)  # only a partial last panel writes through it
    npan = panels.shape[0]
    nxt = np.zeros(1, np.int64)
    # threads take chunks of panels as they come free, so one descheduled by another process (a
    # busy machine) leaves its share to the others instead of stalling the product; WORKERS loop
    # iterations (more than any thread count) so that every thread gets one
    for _ in nb.prange(WORKERS):
        p0 = _fetch_add(nxt, chunk)
        while p0 < npan:
            for p in range(p0, min(p0 + chunk, npan)):
                _panel(af, m, k, bf, p, cf, n, scratch, accumulate)
            p0 = _fetch_add(nxt, chunk)


@nb.njit(nogil=True, cache=True)
def _gemm_serial(a, panels, c, accumulate):
    m, k = a.shape
    n = c.shape[1]
    af, bf, cf = a.reshape(-1), panels.reshape(-1), c.reshape(-1)
    scratch = np.zeros(m * NR if n % NR else 0, np.float32)  # only a partial last panel writes through it
    for p in range(panels.shape[0]):
        _panel(af, m, k, bf, p, cf, n, scratch, accumulate)


def pack(w: np.ndarray, transpose: bool = False) -> np.ndarray:
    """B (K, N) float32 (``transpose``: given as its transpose (N, K), a Linear's weight) as
    ``panels[ceil(N / 16), K, 16]``, the last panel's missing columns zero."""
    w = np.asarray(w, np.float32)
    b = w.T if transpose else w
    k, n = b.shape
    npan = -(-n // NR)
    out = np.zeros((npan, k, NR), np.float32)
    full = n // NR
    if full:
        out[:full] = b[:, : full * NR].reshape(k, full, NR).transpose(1, 0, 2)
    if n % NR:
        out[full, :, : n % NR] = b[:, full * NR :]
    return out


def unpacked(panels: np.ndarray, n: int) -> np.ndarray:
    """B (K, N) again from ``pack(B)`` (a copy): what a numpy stand-in multiplies by."""
    npan, k, _ = panels.shape
    return panels.transpose(1, 0, 2).reshape(k, npan * NR)[:, :n]


#: fewest multiply-adds worth the second thread (one panel's worth of rows below it)
PARALLEL_MIN_MACS = 1 << 18


def call(a: np.ndarray, panels: np.ndarray, c: np.ndarray, accumulate: bool = False, parallel: bool | None = None):
    """(numba kernel, its arguments) :func:`gemm` runs for these operands (``parallel`` None: by size)."""
    npan = panels.shape[0]
    if parallel is None:
        parallel = a.shape[0] * a.shape[1] * c.shape[1] >= PARALLEL_MIN_MACS and npan > 1
    if not parallel:
        return _gemm_serial, (a, panels, c, bool(accumulate))
    chunk = max(1, min(CHUNK, npan // (4 * nb.get_num_threads())))
    return _gemm_parallel, (a, panels, c, bool(accumulate), chunk)


def gemm(
    a: np.ndarray, panels: np.ndarray, c: np.ndarray, parallel: bool | None = None, accumulate: bool = False
) -> None:
    """``c = a @ B`` (``c += a @ B`` when ``accumulate``) for ``panels = pack(B)``: ``a`` (M, K) and ``c``
    (M, N) float32, C-contiguous; ``parallel`` None: by size."""
    if a.shape[1] == 0:
        if not accumulate:
            c.fill(0.0)
        return
    fn, args = call(a, panels, c, accumulate, parallel)
    fn(*args)


def product(x: np.ndarray, panels: np.ndarray, y: np.ndarray) -> None:
    """``y = x @ B`` for ``panels = pack(B)``, ``x`` (..., K) float32 as rows, ``y`` (..., N) the output
    (written through a buffer of its own where it is not C-contiguous)."""
    k, n = x.shape[-1], y.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, k)
    if y.flags.c_contiguous:
        gemm(x2, panels, y.reshape(-1, n))
    else:
        out = np.empty((x2.shape[0], n), np.float32)
        gemm(x2, panels, out)
        np.copyto(y, out.reshape(y.shape))
