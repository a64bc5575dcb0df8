"""CPU reduction kernels (numba): reduce an ``(outer, R, inner)`` view of the input.

The plan (:func:`plan_reduce`) drops size-1 dims and coalesces neighbours, so any
contiguous block of reduced axes becomes one ``R`` between ``outer`` and ``inner``:

* ``inner == 1`` (rows): each output is one contiguous row; tasks are parallel over rows,
  and over chunks of a row when there are too few rows to feed the threads (the partials
  are then combined in a fixed order, so results do not depend on scheduling).
* ``inner > 1``: the output row ``out[o, :]`` accumulates ``x[o, r, :]`` over ``r``,
  vectorised along the contiguous ``inner`` dim; tasks are (outer group, inner block).
* reduced axes that are not one block (``K R K R``) are permuted last into the workspace
  (one copy), which makes them rows.

Float data accumulates in float64 (16-bit inputs reach here as float32 through the
executor's adapter), so sums of float32 are exact to float32 rounding; fastmath
``reassoc`` lets LLVM vectorise those float64 sums (~10x over a strict serial chain) and
changes nothing but the order of additions. Max/min run a vectorised NaN scan, then an
8-accumulator compare/select loop (NaN propagates). Log-sum-exp is max (numba), then
``exp(x - max)`` with numpy's SIMD exp (numba without SVML calls scalar libm per
element), then a float64 sum. Integer reductions and integer ArgMax/ArgMin run numpy
kernels in int64 (exact; rarely hot, and they spare numba specialisations).

An empty reduction (``R == 0``) follows ONNX: sum 0, prod 1, max -inf, min +inf, mean
NaN, log-sum -inf, log-sum-exp -inf, variance NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np

#: below this many input elements the serial variant runs: waking a parallel region's second
#: thread costs more than it saves (figures: docs/performance.md, "Parallel thresholds")
PARALLEL_MIN = 1 << 20
#: rows shorter than this are never split into chunks
CHUNK_MIN = 1 << 14
#: largest inner-dim block per task (float64 accumulators: 16 KiB); splitting a row that
#: fits in one block costs ~2x (strided re-reads), so blocks are only cut for parallelism
INNER_BLOCK = 2048
#: elements per inner-layout task (outer indices are grouped up to this)
TASK_GRAIN = 1 << 14

_FM = {"reassoc", "contract"}
_OPTS = dict(nogil=True, cache=True, error_model="numpy", fastmath=_FM)

# accumulation kinds
A_SUM, A_ABS, A_SQ, A_PROD, A_MAX, A_MIN, A_VAR = range(7)
# post-processing of the accumulator
P_NONE, P_MEAN, P_SQRT, P_LOG, P_VAR = range(5)

#: op name -> (accumulation, post-processing)
KINDS = {
    "sum": (A_SUM, P_NONE),
    "mean": (A_SUM, P_MEAN),
    "max": (A_MAX, P_NONE),
    "min": (A_MIN, P_NONE),
    "prod": (A_PROD, P_NONE),
    "l1": (A_ABS, P_NONE),
    "l2": (A_SQ, P_SQRT),
    "logsum": (A_SUM, P_LOG),
    "logsumexp": (A_MAX, P_NONE),  # the max pass; see _logsumexp
    "sumsquare": (A_SQ, P_NONE),
    "var": (A_VAR, P_VAR),
}


# -- numba building blocks ---------------------------------------------------------------------
# Loops index slices from 0 (``xs = x[lo:hi]; xs[i]``): indexing ``x[lo + i]`` makes numba
# emit a negative-index wraparound check that stops LLVM from vectorising the loop.
@nb.njit(**_OPTS)
def _has_nan(xs):
    nan = False
    for i in range(xs.size):
        v = xs[i]
        nan |= v != v
    return nan


@nb.njit(**_OPTS)
def _max_nonan(xs):
    """max of a non-empty, NaN-free xs: 8 independent accumulators, which LLVM packs into
    one vector register (a lane *array* would be reloaded every step: it may alias xs)."""
    n = xs.size
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = xs[0]
    for i in range(0, n - 7, 8):
        b = xs[i : i + 8]
        v = b[0]
        a0 = v if v > a0 else a0
        v = b[1]
        a1 = v if v > a1 else a1
        v = b[2]
        a2 = v if v > a2 else a2
        v = b[3]
        a3 = v if v > a3 else a3
        v = b[4]
        a4 = v if v > a4 else a4
        v = b[5]
        a5 = v if v > a5 else a5
        v = b[6]
        a6 = v if v > a6 else a6
        v = b[7]
        a7 = v if v > a7 else a7
    r = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    for i in range(n - n % 8, n):
        v = xs[i]
        r = v if v > r else r
    return r


@nb.njit(**_OPTS)
def _min_nonan(xs):
    """min of a non-empty, NaN-free xs: 8 independent accumulators, which LLVM packs into
    one vector register (a lane *array* would be reloaded every step: it may alias xs)."""
    n = xs.size
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = xs[0]
    for i in range(0, n - 7, 8):
        b = xs[i : i + 8]
        v = b[0]
        a0 = v if v < a0 else a0
        v = b[1]
        a1 = v if v < a1 else a1
        v = b[2]
        a2 = v if v < a2 else a2
        v = b[3]
        a3 = v if v < a3 else a3
        v = b[4]
        a4 = v if v < a4 else a4
        v = b[5]
        a5 = v if v < a5 else a5
        v = b[6]
        a6 = v if v < a6 else a6
        v = b[7]
        a7 = v if v < a7 else a7
    r = min(min(min(a0, a1), min(a2, a3)), min(min(a4, a5), min(a6, a7)))
    for i in range(n - n % 8, n):
        v = xs[i]
        r = v if v < r else r
    return r


@nb.njit(**_OPTS)
def _extreme(xs, is_max):
    """max (min) of xs in float64 with NaN propagation; -inf (+inf) when empty. A
    vectorised NaN scan first, then the unrolled compare/select kernel."""
    if xs.size == 0:
        return -np.inf if is_max else np.inf
    if _has_nan(xs):
        return np.nan
    if is_max:
        return float(_max_nonan(xs))
    return float(_min_nonan(xs))


@nb.njit(**_OPTS)
def _span(x, lo, hi, acc):
    """Partial ``(a, b)`` of ``acc`` over ``x[lo:hi]`` in float64 (VAR: (mean, M2))."""
    xs = x[lo:hi]
    n = xs.size
    a = 0.0
    b = 0.0
    if acc == A_SUM:
        for i in range(n):
            a += xs[i]
    elif acc == A_ABS:
        for i in range(n):
            a += abs(xs[i])
    elif acc == A_SQ:
        for i in range(n):
            v = float(xs[i])
            a += v * v
    elif acc == A_PROD:
        a = 1.0
        for i in range(n):
            a *= xs[i]
    elif acc == A_MAX:
        a = _extreme(xs, True)
    elif acc == A_MIN:
        a = _extreme(xs, False)
    else:  # A_VAR: two passes over the span (it is hot in cache), exact centring
        if n > 0:
            s = 0.0
            for i in range(n):
                s += xs[i]
            a = s / n
            for i in range(n):
                d = xs[i] - a
                b += d * d
        else:
            a = np.nan
    return a, b


@nb.njit(**_OPTS)
def _merge(acc, a, b, n, a2, b2, n2):
    """Combine partial (a, b) over n elements with (a2, b2) over n2 (same kind)."""
    if acc == A_SUM or acc == A_ABS or acc == A_SQ:
        return a + a2, 0.0
    if acc == A_PROD:
        return a * a2, 0.0
    if acc == A_MAX:
        if a != a or a2 != a2:
            return np.nan, 0.0
        return max(a, a2), 0.0
    if acc == A_MIN:
        if a != a or a2 != a2:
            return np.nan, 0.0
        return min(a, a2), 0.0
    # A_VAR: Chan et al. pairwise update of (mean, M2)
    if n == 0:
        return a2, b2
    if n2 == 0:
        return a, b
    tot = n + n2
    d = a2 - a
    return a + d * (n2 / tot), b + b2 + d * d * (n * (n2 / tot))


@nb.njit(**_OPTS)
def _post(post, a, b, n, param):
    if post == P_NONE:
        return a
    if post == P_MEAN:
        return a / n
    if post == P_SQRT:
        return np.sqrt(a)
    if post == P_LOG:
        return np.log(a)
    return b / param  # P_VAR: param is max(n - correction, 0)


@nb.njit(**_OPTS)
def _rows_task(x, out, pa, pb, t, R, nchunk, csize, acc, post, param):
    o = t // nchunk
    c = t - o * nchunk
    lo = o * R + c * csize
    hi = min(lo + csize, o * R + R)
    a, b = _span(x, lo, hi, acc)
    if nchunk == 1:
        out[o] = _post(post, a, b, R, param)
    else:
        pa[t] = a
        pb[t] = b


@nb.njit(parallel=True, **_OPTS)
def _rows_parallel(x, out, pa, pb, ntask, R, nchunk, csize, acc, post, param):
    for t in nb.prange(ntask):
        _rows_task(x, out, pa, pb, t, R, nchunk, csize, acc, post, param)


@nb.njit(**_OPTS)
def _rows_serial(x, out, pa, pb, ntask, R, nchunk, csize, acc, post, param):
    for t in range(ntask):
        _rows_task(x, out, pa, pb, t, R, nchunk, csize, acc, post, param)


@nb.njit(**_OPTS)
def _rows_combine(out, pa, pb, R, nchunk, csize, acc, post, param):
    """Fold each row's chunk partials left to right (a fixed order: reproducible)."""
    for o in range(out.size):
        t = o * nchunk
        a = pa[t]
        b = pb[t]
        n = min(csize, R)
        for c in range(1, nchunk):
            n2 = min(csize, R - c * csize)
            a, b = _merge(acc, a, b, n, pa[t + c], pb[t + c], n2)
            n += n2
        out[o] = _post(post, a, b, R, param)


@nb.njit(**_OPTS)
def _inner_task(x, out, t, R, inner, nblk, bsz, ogroup, outer, acc, post, param):
    """out[o, j0:j1] for o in one outer group and j in one inner block: the j loops are
    elementwise over contiguous slices, so they vectorise."""
    g = t // nblk
    j0 = (t - g * nblk) * bsz
    j1 = min(j0 + bsz, inner)
    nj = j1 - j0
    a = np.empty(nj)
    b = np.zeros(nj)
    for o in range(g * ogroup, min(g * ogroup + ogroup, outer)):
        base = o * R * inner + j0
        if acc == A_SUM or acc == A_ABS or acc == A_SQ or acc == A_VAR:
            a[:] = 0.0
        elif acc == A_PROD:
            a[:] = 1.0
        elif acc == A_MIN:
            a[:] = np.inf
        else:
            a[:] = -np.inf
        for r in range(R):
            xr = x[base + r * inner : base + r * inner + nj]
            if acc == A_SUM or acc == A_VAR:
                for j in range(nj):
                    a[j] += xr[j]
            elif acc == A_ABS:
                for j in range(nj):
                    a[j] += abs(xr[j])
            elif acc == A_SQ:
                for j in range(nj):
                    v = float(xr[j])
                    a[j] += v * v
            elif acc == A_PROD:
                for j in range(nj):
                    a[j] *= xr[j]
            elif acc == A_MIN:
                for j in range(nj):
                    v = xr[j]
                    a[j] = v if (v < a[j] or v != v) else a[j]
            else:  # A_MAX
                for j in range(nj):
                    v = xr[j]
                    a[j] = v if (v > a[j] or v != v) else a[j]
        if acc == A_VAR:
            for j in range(nj):
                a[j] = a[j] / R
            b[:] = 0.0
            for r in range(R):
                xr = x[base + r * inner : base + r * inner + nj]
                for j in range(nj):
                    d = xr[j] - a[j]
                    b[j] += d * d
        ob = o * inner + j0
        for j in range(nj):
            out[ob + j] = _post(post, a[j], b[j], R, param)


@nb.njit(parallel=True, **_OPTS)
def _inner_parallel(x, out, ntask, R, inner, nblk, bsz, ogroup, outer, acc, post, param):
    for t in nb.prange(ntask):
        _inner_task(x, out, t, R, inner, nblk, bsz, ogroup, outer, acc, post, param)


@nb.njit(**_OPTS)
def _inner_serial(x, out, ntask, R, inner, nblk, bsz, ogroup, outer, acc, post, param):
    for t in range(ntask):
        _inner_task(x, out, t, R, inner, nblk, bsz, ogroup, outer, acc, post, param)


# -- planning ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReducePlan:
    """How one reduction runs: the (outer, R, inner) view and the task split."""

    kind: str
    outer: int
    R: int
    inner: int
    perm: tuple | None  # axes order that makes reduced axes one trailing block
    perm_shape: tuple | None  # input shape after dropping 1-dims (what perm applies to)
    parallel: bool
    nchunk: int = 1  # rows layout: chunks per row
    csize: int = 0
    nblk: int = 1  # inner layout: inner blocks
    bsz: int = 0  # inner layout: inner block size
    ogroup: int = 1  # inner layout: outer indices per task
    param: float = 0.0  # VAR: max(R - correction, 0)
    ws_perm: int = 0  # workspace bytes for the permuted copy
    ws_part: int = 0  # workspace bytes for chunk partials
    ws_exp: int = 0  # logsumexp: workspace bytes for exp(x - max) and the maxima
    itemsize: int = 8

    @property
    def workspace(self) -> int:
        return self.ws_perm + self.ws_part + self.ws_exp

    @property
    def empty_output(self) -> bool:
        return self.outer * self.inner == 0


def _round64(n: int) -> int:
    return (n + 63) // 64 * 64


def coalesce(shape: tuple, axes: tuple) -> tuple[list, list]:
    """Drop size-1 dims and merge neighbours of the same kind (reduced or kept).
    Returns (sizes, reduced_flags) of the groups, and the trimmed shape/flags are implied."""
    red = set(axes)
    sizes: list[int] = []
    flags: list[bool] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        f = d in red
        if flags and flags[-1] == f:
            sizes[-1] *= n
        else:
            sizes.append(n)
            flags.append(f)
    return sizes, flags


def plan_reduce(
    shape: tuple, axes: tuple, kind: str, itemsize: int = 8, correction: float = 0.0, nthreads: int | None = None
) -> ReducePlan:
    """Plan reducing ``shape`` over normalized ``axes`` (an empty tuple reduces nothing)."""
    nthreads = nthreads or nb.config.NUMBA_NUM_THREADS
    sizes, flags = coalesce(shape, axes)
    total = math.prod(shape)
    perm = perm_shape = None
    nred = sum(1 for f in flags if f)
    if nred <= 1:
        outer = inner = 1
        R = 1
        seen = False
        for n, f in zip(sizes, flags):
            if f:
                R = n
                seen = True
            elif seen:
                inner *= n
            else:
                outer *= n
    else:
        # reduced axes in several blocks: permute kept dims first, reduced dims last
        perm_shape = tuple(sizes)
        kept = [i for i, f in enumerate(flags) if not f]
        redd = [i for i, f in enumerate(flags) if f]
        perm = tuple(kept + redd)
        outer = math.prod(sizes[i] for i in kept)
        R = math.prod(sizes[i] for i in redd)
        inner = 1
    if total == 0:
        # zero-size input: either nothing to write, or every output is the empty reduction
        if outer * inner == 0:
            return ReducePlan(kind, 0, 0, 1, None, None, False)
        R, perm, perm_shape = 0, None, None
        outer, inner = outer * inner, 1
    parallel = total >= PARALLEL_MIN
    param = float(max(R - correction, 0.0))
    ws_perm = _round64(total * itemsize) if perm is not None else 0
    ws_exp = _round64(total * itemsize) + _round64(2 * outer * inner * itemsize) if kind == "logsumexp" else 0
    if inner == 1:
        nchunk = 1
        if parallel and outer < 2 * nthreads and R >= 2 * CHUNK_MIN:
            nchunk = min(-(-4 * nthreads // outer), R // CHUNK_MIN)
        csize = -(-R // nchunk) if nchunk > 1 else R
        if nchunk > 1:  # recompute so that no chunk is empty
            nchunk = -(-R // csize)
        ws_part = _round64(2 * outer * nchunk * 8) if nchunk > 1 else 0
        return ReducePlan(
            kind,
            outer,
            R,
            inner,
            perm,
            perm_shape,
            parallel,
            nchunk=nchunk,
            csize=csize,
            param=param,
            ws_perm=ws_perm,
            ws_part=ws_part,
            ws_exp=ws_exp,
            itemsize=itemsize,
        )
    bsz = min(inner, INNER_BLOCK)
    if parallel and outer * -(-inner // bsz) < nthreads:  # cut rows only to feed the threads
        per = -(-inner // nthreads)
        bsz = min(inner, max(64, (per + 15) // 16 * 16))
    nblk = -(-inner // bsz)
    ogroup = max(1, TASK_GRAIN // max(1, R * bsz))
    if parallel:  # keep enough tasks for the threads
        ogroup = max(1, min(ogroup, -(-outer * nblk // (4 * nthreads))))
    return ReducePlan(
        kind,
        outer,
        R,
        inner,
        perm,
        perm_shape,
        parallel,
        nblk=nblk,
        bsz=bsz,
        ogroup=ogroup,
        param=param,
        ws_perm=ws_perm,
        ws_exp=ws_exp,
        itemsize=itemsize,
    )


# -- kernels ---------------------------------------------------------------------------------------
def reduce_float(x: np.ndarray, out: np.ndarray, plan: ReducePlan, ws) -> None:
    """Run ``plan`` over float32/float64 ``x`` (contiguous) into contiguous ``out``."""
    if plan.empty_output:
        return
    flat = x.reshape(-1)
    if plan.perm is not None:
        buf = ws[: plan.ws_perm].view(x.dtype)[: x.size].reshape([plan.perm_shape[i] for i in plan.perm])
        np.copyto(buf, x.reshape(plan.perm_shape).transpose(plan.perm))
        flat = buf.reshape(-1)
    if plan.kind == "logsumexp":
        _logsumexp(flat, out.reshape(-1), plan, ws)
    else:
        _reduce_flat(flat, out.reshape(-1), plan, ws, *KINDS[plan.kind])


def _reduce_flat(flat, o, plan: ReducePlan, ws, acc: int, post: int) -> None:
    if plan.inner == 1:
        if plan.nchunk > 1:
            part = ws[plan.ws_perm : plan.ws_perm + plan.ws_part].view(np.float64)
            n = plan.outer * plan.nchunk
            pa, pb = part[:n], part[n : 2 * n]
        else:
            pa = pb = _DUMMY
        run = _rows_parallel if plan.parallel else _rows_serial
        run(flat, o, pa, pb, plan.outer * plan.nchunk, plan.R, plan.nchunk, plan.csize, acc, post, plan.param)
        if plan.nchunk > 1:
            _rows_combine(o, pa, pb, plan.R, plan.nchunk, plan.csize, acc, post, plan.param)
    else:
        ntask = -(-plan.outer // plan.ogroup) * plan.nblk
        run = _inner_parallel if plan.parallel else _inner_serial
        run(flat, o, ntask, plan.R, plan.inner, plan.nblk, plan.bsz, plan.ogroup, plan.outer, acc, post, plan.param)


def _logsumexp(flat, o, plan: ReducePlan, ws) -> None:
    """max (numba) -> exp(x - max) (numpy's SIMD exp: numba without SVML calls scalar libm per
    element) -> sum (numba, float64 accumulation) -> max + log(sum)."""
    dt = flat.dtype
    base = plan.ws_perm + plan.ws_part
    nout = plan.outer * plan.inner
    n_e = _round64(flat.size * dt.itemsize)
    e = ws[base : base + n_e].view(dt)[: flat.size]
    ms = ws[base + n_e : base + plan.ws_exp].view(dt)
    m, s = ms[:nout], ms[nout : 2 * nout]
    _reduce_flat(flat, m, plan, ws, A_MAX, P_NONE)
    finite = np.isfinite(m)
    shift = np.where(finite, m, 0).astype(dt)
    with np.errstate(all="ignore"):
        np.subtract(
            flat.reshape(plan.outer, plan.R, plan.inner),
            shift.reshape(plan.outer, 1, plan.inner),
            out=e.reshape(plan.outer, plan.R, plan.inner),
        )
        np.exp(e, out=e)
        _reduce_flat(e, s, plan, ws, A_SUM, P_NONE)
        np.log(s, out=s)
        s += shift
    np.copyto(o, np.where(finite, s, m))


_DUMMY = np.zeros(1, np.float64)


def reduce_numpy(x: np.ndarray, out: np.ndarray, plan: ReducePlan, empty_value) -> None:
    """Integer/bool reductions with numpy ufunc reductions over the planned (outer, R, inner)
    view, accumulating in int64 (float64 for the kinds with a float post-step)."""
    if plan.empty_output:
        return
    o = out.reshape(plan.outer, plan.inner)
    if plan.R == 0:
        o[...] = empty_value
        return
    if plan.perm is not None:
        v = x.reshape(plan.perm_shape).transpose(plan.perm).reshape(plan.outer, plan.R, 1)
    else:
        v = x.reshape(plan.outer, plan.R, plan.inner)
    if v.dtype == np.bool_:
        v = v.view(np.uint8)
    k = plan.kind
    if k == "max":
        r = np.max(v, axis=1)
    elif k == "min":
        r = np.min(v, axis=1)
    elif k == "prod":
        r = np.prod(v, axis=1, dtype=np.int64)
    elif k in ("sum", "mean", "logsum"):
        r = np.sum(v, axis=1, dtype=np.int64)
        if k == "mean":
            r = r / plan.R
        elif k == "logsum":
            r = np.log(r.astype(np.float64))
    elif k == "l1":
        r = np.sum(np.abs(v.astype(np.int64)), axis=1)
    elif k in ("sumsquare", "l2"):
        w = v.astype(np.int64)
        r = np.sum(w * w, axis=1)
        if k == "l2":
            r = np.sqrt(r.astype(np.float64))
    elif k == "logsumexp":
        w = v.astype(np.float64)
        m = w.max(axis=1, keepdims=True)
        r = np.log(np.exp(w - m).sum(axis=1)) + m[:, 0]
    else:
        raise ValueError(f"reduce_numpy: kind {k!r}")
    if out.dtype == np.bool_:
        r = r != 0
    with np.errstate(invalid="ignore"):
        np.copyto(o, r, casting="unsafe")


# -- ArgMax / ArgMin ------------------------------------------------------------------------------
@nb.njit(**_OPTS)
def _find(xs, m, last):
    """First (last) index i with xs[i] == m, or NaN when m is NaN; blocks of 64 are tested
    with a vectorised OR before the scalar search inside the block."""
    R = xs.size
    isnan = m != m
    nblk = -(-R // 64)
    for k in range(nblk):
        bi = nblk - 1 - k if last else k
        blk = xs[bi * 64 : min(bi * 64 + 64, R)]
        hit = False
        for j in range(blk.size):
            v = blk[j]
            hit |= (v != v) if isnan else (v == m)
        if hit:
            for jj in range(blk.size):
                j = blk.size - 1 - jj if last else jj
                v = blk[j]
                if (v != v) if isnan else (v == m):
                    return bi * 64 + j
    return 0


@nb.njit(**_OPTS)
def _arg_row(xs, is_max, last):
    """Index of the max (min) of the row xs; NaN counts as the extreme (like numpy)."""
    return _find(xs, _extreme(xs, is_max), last)


@nb.njit(**_OPTS)
def _arg_task(x, out, t, R, inner, nblk, bsz, is_max, last):
    """inner == 1: task t is row t. Else task t = (outer o, inner block): running best
    value/index per column, elementwise over contiguous slices (vectorised selects)."""
    if inner == 1:
        out[t] = _arg_row(x[t * R : t * R + R], is_max, last)
        return
    o = t // nblk
    j0 = (t - o * nblk) * bsz
    nj = min(j0 + bsz, inner) - j0
    base = o * R * inner + j0
    bv = x[base : base + nj].copy()
    bi = np.zeros(nj, np.int64)
    for r in range(1, R):
        xr = x[base + r * inner : base + r * inner + nj]
        if is_max and not last:
            for j in range(nj):
                v = xr[j]
                b = bv[j]
                take = v > b or (v != v and b == b)
                bv[j] = v if take else b
                bi[j] = r if take else bi[j]
        elif is_max:
            for j in range(nj):
                v = xr[j]
                b = bv[j]
                take = v >= b or v != v
                bv[j] = v if take else b
                bi[j] = r if take else bi[j]
        elif not last:
            for j in range(nj):
                v = xr[j]
                b = bv[j]
                take = v < b or (v != v and b == b)
                bv[j] = v if take else b
                bi[j] = r if take else bi[j]
        else:
            for j in range(nj):
                v = xr[j]
                b = bv[j]
                take = v <= b or v != v
                bv[j] = v if take else b
                bi[j] = r if take else bi[j]
    ob = out[o * inner + j0 : o * inner + j0 + nj]
    for j in range(nj):
        ob[j] = bi[j]


@nb.njit(parallel=True, **_OPTS)
def _arg_parallel(x, out, ntask, R, inner, nblk, bsz, is_max, last):
    for t in nb.prange(ntask):
        _arg_task(x, out, t, R, inner, nblk, bsz, is_max, last)


@nb.njit(**_OPTS)
def _arg_serial(x, out, ntask, R, inner, nblk, bsz, is_max, last):
    for t in range(ntask):
        _arg_task(x, out, t, R, inner, nblk, bsz, is_max, last)


@dataclass(frozen=True)
class ArgPlan:
    outer: int
    R: int
    inner: int
    parallel: bool
    bsz: int
    nblk: int

    @property
    def ntask(self) -> int:
        return self.outer if self.inner == 1 else self.outer * self.nblk


def plan_arg(shape: tuple, axis: int, nthreads: int | None = None) -> ArgPlan:
    """(outer, R, inner) around ``axis`` and the inner block size (as :func:`plan_reduce`)."""
    nthreads = nthreads or nb.config.NUMBA_NUM_THREADS
    outer, R, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    parallel = math.prod(shape) >= PARALLEL_MIN
    bsz = min(inner, INNER_BLOCK)
    if parallel and inner > 1 and outer * -(-inner // bsz) < nthreads:
        bsz = min(inner, max(64, (-(-inner // nthreads) + 15) // 16 * 16))
    return ArgPlan(outer, R, inner, parallel, max(bsz, 1), -(-inner // max(bsz, 1)))


def argreduce(x: np.ndarray, out: np.ndarray, plan: ArgPlan, is_max: bool, last: bool) -> None:
    """ArgMax/ArgMin (float32/float64) over the middle dim of an (outer, R, inner) contiguous
    view; ``out`` is int64 of outer*inner elements."""
    if out.size == 0:
        return
    run = _arg_parallel if plan.parallel else _arg_serial
    run(x.reshape(-1), out.reshape(-1), plan.ntask, plan.R, plan.inner, plan.nblk, plan.bsz, is_max, last)


def argreduce_numpy(x: np.ndarray, out: np.ndarray, plan: ArgPlan, is_max: bool, last: bool) -> None:
    """Integer ArgMax/ArgMin with numpy (exact; rarely hot, and it spares a numba
    specialisation): the last index is found on the reversed axis."""
    if out.size == 0:
        return
    v = x.reshape(plan.outer, plan.R, plan.inner)
    fn = np.argmax if is_max else np.argmin
    r = plan.R - 1 - fn(v[:, ::-1], axis=1) if last else fn(v, axis=1)
    np.copyto(out.reshape(plan.outer, plan.inner), r)


# -- CumSum ------------------------------------------------------------------------------------------
def cumsum(x: np.ndarray, out: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> None:
    """Inclusive/exclusive, forward/reverse cumulative sum along ``axis`` (numpy-vectorised:
    CumSum is rarely hot). Floats accumulate in float64, integers in int64."""
    if x.size == 0:
        return
    acc = np.float64 if x.dtype.kind == "f" else np.int64
    v = np.flip(x, axis) if reverse else x
    c = np.cumsum(v, axis=axis, dtype=acc)
    if exclusive:  # shift by one along axis (not c - v: inf - inf would give NaN)
        e = np.zeros_like(c)
        dst = [slice(None)] * c.ndim
        src = [slice(None)] * c.ndim
        dst[axis] = slice(1, None)
        src[axis] = slice(None, -1)
        e[tuple(dst)] = c[tuple(src)]
        c = e
    if reverse:
        c = np.flip(c, axis)
    np.copyto(out, c, casting="unsafe")
