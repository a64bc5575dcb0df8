"""ReduceSum on bfloat16 storage: rows of the ``(A, outer, R, inner)`` view widened a block at a time
into float64 accumulators (the float32 kernel's accumulation), rounded to float32 and then to
bfloat16 once (what the fp32 adapter gives, without its whole-tensor float32 copy). The bias
gradients of bf16 training are this case: a (tokens, features) gradient summed over tokens
(``A`` = 1), or a convolution's (N, C, H*W) gradient summed over N and H*W (``inner`` = 1).

Tasks are (outer index, inner block), rounded straight into the output; where those are too few
for the threads, (outer index, inner block, chunk of the A * R rows), whose partial sums are
combined in a fixed order, so results do not depend on scheduling.
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
def _accumulate(x, acc, o, lo, t0, t1, outer, R, inner):
    """``acc`` (float64, zeroed here) = the sums over rows [t0, t1) of the A * R rows of output
    row ``o``, inner elements [lo, lo + acc.size)."""
    n = acc.size
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
def _finish(acc, dst):
    """bfloat16 ``dst`` = the float64 sums ``acc`` rounded to float32, then to nearest even."""
    s = np.empty(acc.size, np.float32)
    for k in range(acc.size):
        s[k] = np.float32(acc[k])
    _narrow(s, s.view(np.uint32), dst, KIND_BF16)


@nb.njit(**_NJIT)
def _whole_task(x, out, t, outer, R, inner, bsz, nblk, rows):
    """One (outer, inner block) over all its rows, rounded straight into ``out``."""
    blk = t % nblk
    o = t // nblk
    lo = blk * bsz
    n = min(inner, lo + bsz) - lo
    acc = np.empty(n, np.float64)
    _accumulate(x, acc, o, lo, 0, rows, outer, R, inner)
    _finish(acc, out[o * inner + lo : o * inner + lo + n])


@nb.njit(**_NJIT)
def _chunk_task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    """Partial sums of one (outer, inner block, chunk of the rows) into ``part[o, chunk, block]``."""
    c = t % nchunk
    ob = t // nchunk
    blk = ob % nblk
    o = ob // nblk
    lo = blk * bsz
    n = min(inner, lo + bsz) - lo
    t0 = c * csize
    _accumulate(x, part[o, c, lo : lo + n], o, lo, t0, min(rows, t0 + csize), outer, R, inner)


@nb.njit(**_NJIT)
def _combine(part, out, o, inner, nchunk):
    """``out[o, :]`` = the chunks' partials of output row ``o``, added in chunk order and rounded."""
    acc = np.empty(inner, np.float64)
    for k in range(inner):
        v = part[o, 0, k]
        for c in range(1, nchunk):
            v += part[o, c, k]
        acc[k] = v
    _finish(acc, out[o * inner : (o + 1) * inner])


@nb.njit(parallel=True, **_NJIT)
def _sum_parallel(x, out, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    if nchunk == 1:
        for t in nb.prange(outer * nblk):
            _whole_task(x, out, t, outer, R, inner, bsz, nblk, rows)
        return
    # few outputs (outer * nblk < 4 * threads), so the partials are small
    part = np.empty((outer, nchunk, inner), np.float64)
    for t in nb.prange(outer * nblk * nchunk):
        _chunk_task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows)
    for o in nb.prange(outer):
        _combine(part, out, o, inner, nchunk)


@nb.njit(**_NJIT)
def _sum_serial(x, out, outer, R, inner, bsz, nblk, nchunk, csize, rows):
    if nchunk == 1:
        for t in range(outer * nblk):
            _whole_task(x, out, t, outer, R, inner, bsz, nblk, rows)
        return
    part = np.empty((outer, nchunk, inner), np.float64)
    for t in range(outer * nblk * nchunk):
        _chunk_task(x, part, t, outer, R, inner, bsz, nblk, nchunk, csize, rows)
    for o in range(outer):
        _combine(part, out, o, inner, nchunk)


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
