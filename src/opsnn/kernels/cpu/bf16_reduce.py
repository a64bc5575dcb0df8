"""ReduceSum on bfloat16 storage: rows of the ``(A, outer, R, inner)`` view widened a block at a time
into float64 accumulators (the float32 kernel's accumulation), rounded to float32 and then to
bfloat16 once (what the fp32 adapter gives, without its whole-tensor float32 copy). The bias
gradients of bf16 training are this case: a (tokens, features) gradient summed over tokens
(``A`` = 1), or a convolution's (N, C, H*W) gradient summed over N and H*W (``inner`` = 1).

Tasks are (outer index, inner block, chunk of the A * R rows); the chunks' partial sums are combined in a fixed
order, so results do not depend on scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .gemm import KIND_BF16, _narrow, _widen

_NJIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
#: inner elements per task (float64 accumulators: 8 KiB)
INNER_BLOCK = 1024
#: below this many input elements one serial task runs (a parallel region costs more)
PARALLEL_MIN = 1 << 17
#: fewest rows of R per chunk when R is split for parallelism
CHUNK_MIN = 64


@dataclass(frozen=True)
class SumPlan:
    A: int  # a leading reduced block (1 when the reduced axes are one block)
    outer: int
    R: int
    inner: int
    bsz: int  # inner elements per task
    nblk: int
    nchunk: int  # chunks of the A * R summed rows per (outer, inner block)
    csize: int


def plan(outer: int, R: int, inner: int, threads: int | None = None, A: int = 1) -> SumPlan:
    """Tasks for summing an (A, outer, R, inner) view over A and R on ``threads`` (default:
    numba's count)."""
    threads = nb.get_num_threads() if threads is None else threads
    rows = A * R
    bsz = min(max(inner, 1), INNER_BLOCK)
    nblk = -(-inner // bsz)
    nchunk = 1
    if outer * rows * inner >= PARALLEL_MIN and threads > 1 and outer * nblk < 4 * threads:
        nchunk = max(1, min(-(-4 * threads // (outer * nblk)), rows // CHUNK_MIN))
    csize = -(-rows // nchunk) if rows else 0
    if csize:
        nchunk = -(-rows // csize)  # no empty chunk
    return SumPlan(A, outer, R, inner, bsz, nblk, nchunk, csize)


@nb.njit(**_NJIT)
def _task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    """Partial sums of one (outer, inner block, chunk of the A * R rows) into ``part[o, chunk, block]``."""
    c = t % nchunk
    ob = t // nchunk
    blk = ob % nblk
    o = ob // nblk
    lo = blk * bsz
    n = min(inner, lo + bsz) - lo
    t0 = c * csize
    t1 = min(rows, t0 + csize)
    acc = part[o, c, lo : lo + n]
    acc[:] = 0.0
    if inner == 1:  # runs of R contiguous values per leading index, widened a block at a time
        v = np.empty(min(t1 - t0, 4096), np.uint32)
        vf = v.view(np.float32)
        s = 0.0
        r = t0
        while r < t1:
            a = r // R
            end = min(t1, (a + 1) * R)
            base = (a * outer + o) * R - a * R
            for rb in range(r, end, 4096):
                m = min(end, rb + 4096) - rb
                _widen(x[base + rb : base + rb + m], v[:m], vf[:m], KIND_BF16)
                for k in range(m):
                    s += vf[k]
            r = end
        acc[0] = s
        return
    u = np.empty(n, np.uint32)
    f = u.view(np.float32)
    for r in range(t0, t1):
        a = r // R
        off = ((a * outer + o) * R + r - a * R) * inner + lo
        _widen(x[off : off + n], u, f, KIND_BF16)
        for k in range(n):
            acc[k] += f[k]


@nb.njit(**_NJIT)
def _combine(part, out, o0, o1, inner, nchunk):
    """``out[o, :]`` = bf16(float32(sum of the chunks' partials)) for o in [o0, o1)."""
    s = np.empty(inner, np.float32)
    su = s.view(np.uint32)
    for o in range(o0, o1):
        for k in range(inner):
            v = part[o, 0, k]
            for c in range(1, nchunk):
                v += part[o, c, k]
            s[k] = np.float32(v)
        _narrow(s, su, out[o * inner : (o + 1) * inner], KIND_BF16)


@nb.njit(parallel=True, **_NJIT)
def _sum_parallel(x, out, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    part = np.empty((outer, nchunk, inner), np.float64)
    for t in nb.prange(outer * nblk * nchunk):
        _task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows)
    for o in nb.prange(outer):
        _combine(part, out, o, o + 1, inner, nchunk)


@nb.njit(**_NJIT)
def _sum_serial(x, out, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    part = np.empty((outer, nchunk, inner), np.float64)
    for t in range(outer * nblk * nchunk):
        _task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows)
    _combine(part, out, 0, outer, inner, nchunk)


def sum_bf16(x: np.ndarray, out: np.ndarray, p: SumPlan) -> None:
    """``out`` (bfloat16, outer * inner elements) = the sum over A and R of contiguous bfloat16
    ``x`` viewed as (A, outer, R, inner); no rows to sum give zeros."""
    xu, ou = x.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint16)
    if p.outer * p.inner == 0:
        return
    rows = p.A * p.R
    if rows == 0:
        ou[:] = 0
        return
    run = _sum_parallel if p.nchunk * p.nblk * p.outer > 1 and x.size >= PARALLEL_MIN else _sum_serial
    run(xu, ou, p.outer, p.R, p.inner, p.bsz, p.nblk, p.nchunk, p.csize, rows)
