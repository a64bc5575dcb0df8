"""CPU kernels of the shape/index family: strided copies, index-map gathers, row gathers, resampling.

Data movement works on raw bits: every array is viewed as unsigned integers of its
itemsize (1, 2, 4 or 8 bytes), so one numba specialisation per width serves every dtype
(bool, float16, bfloat16, int64, ...) and compile time stays small.

The planners here run at prepare time and turn an op into a list of :class:`CopyPlan`
(a strided view of an input copied into a strided view of an output). Coalescing merges
dims that are contiguous in both views; the plan then picks

* ``numpy``: small copies (below ``PARALLEL_MIN_BYTES``) — one ``np.copyto``;
* ``rows``: rows contiguous (or uniformly strided) in both, split across threads (from
  ``THREADS_MIN_BYTES``; below it one numba loop on the calling thread);
* ``tiles``: a transpose-like copy (the source's unit-stride dim is not the destination's),
  done in cache-sized square tiles so both reads and writes stay in cache.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba as nb
import numpy as np

from ...runtime import kernel_cache
from ...runtime.memory import check_request

#: copies smaller than this run through numpy (a numba call's fixed cost dominates them)
PARALLEL_MIN_BYTES = 1 << 16
#: numba copies smaller than this run on the calling thread: one thread copies them before a
#: parallel region's second thread would be awake (figures: docs/performance.md, "Copies")
THREADS_MIN_BYTES = 2 << 20
#: long rows are split into chunks of this many elements so one row still spreads over threads
ROW_CHUNK = 1 << 15

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bit_copyable(dtype: np.dtype) -> bool:
    """True when a dtype can be moved as raw 1/2/4/8-byte words (not object/string/complex)."""
    return dtype.itemsize in _UINT and not dtype.hasobject and dtype.kind not in "USO"


def bits(a: np.ndarray) -> np.ndarray:
    """Flat unsigned-integer view of a C-contiguous array (no copy)."""
    return a.reshape(-1).view(_UINT[a.dtype.itemsize])


def contiguous_strides(shape) -> tuple:
    """Element strides of a C-contiguous array of ``shape``."""
    st = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        st[k] = st[k + 1] * max(int(shape[k + 1]), 1)
    return tuple(st)


# ---------------------------------------------------------------------------------------------
# numba kernels (flat unsigned-int arrays; offsets and strides in elements)
# ---------------------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True, inline="always")
def _outer_offsets(r, oshape, soff, sstr, doff, dstr):
    """Source and destination offsets of outer (row) index ``r`` over ``oshape``."""
    s = soff
    d = doff
    rem = r
    for k in range(oshape.size - 1, -1, -1):
        q = rem // oshape[k]
        i = rem - q * oshape[k]
        rem = q
        s += i * sstr[k]
        d += i * dstr[k]
    return s, d


@nb.njit(nogil=True, cache=True, inline="always")
def _rows_task(t, src, soff, sstr, dst, doff, dstr, oshape, rowlen, s_in, d_in, chunk, nchunks):
    r = t // nchunks
    c = t - r * nchunks
    s, d = _outer_offsets(r, oshape, soff, sstr, doff, dstr)
    j0 = c * chunk
    j1 = min(rowlen, j0 + chunk)
    if s_in == 1 and d_in == 1:
        # a contiguous run in both: a loop over slices from 0 (vectorised, no wraparound checks)
        ss = src[s + j0 : s + j1]
        dd = dst[d + j0 : d + j1]
        for j in range(j1 - j0):
            dd[j] = ss[j]
    else:
        # every position is >= 0 by construction; unsigned indices skip numba's wraparound code
        for j in range(j0, j1):
            dst[nb.uint64(d + j * d_in)] = src[nb.uint64(s + j * s_in)]


@nb.njit(parallel=True, nogil=True, cache=True)
def copy_rows(src, soff, sstr, dst, doff, dstr, oshape, rowlen, s_in, d_in, chunk):
    """dst[doff + i·dstr + j·d_in] = src[soff + i·sstr + j·s_in] for every outer index i and j < rowlen."""
    nrows = 1
    for k in range(oshape.size):
        nrows *= oshape[k]
    nchunks = (rowlen + chunk - 1) // chunk
    for t in nb.prange(nrows * nchunks):
        _rows_task(t, src, soff, sstr, dst, doff, dstr, oshape, rowlen, s_in, d_in, chunk, nchunks)


@nb.njit(nogil=True, cache=True)
def copy_rows_serial(src, soff, sstr, dst, doff, dstr, oshape, rowlen, s_in, d_in, chunk):
    """``copy_rows`` on the calling thread (copies below ``THREADS_MIN_BYTES``): the outer
    index runs as an odometer (no divisions per row), contiguous rows copy in a vectorised
    loop (much cheaper than the parallel kernel's per-task index decomposition run serially)."""
    nd = oshape.size
    nrows = 1
    for k in range(nd):
        nrows *= oshape[k]
    idx = np.zeros(nd, np.int64)
    s = soff
    d = doff
    for _ in range(nrows):
        if s_in == 1 and d_in == 1:
            ss = src[s : s + rowlen]
            dd = dst[d : d + rowlen]
            for j in range(rowlen):
                dd[j] = ss[j]
        else:
            for j in range(rowlen):
                dst[nb.uint64(d + j * d_in)] = src[nb.uint64(s + j * s_in)]
        k = nd - 1
        while k >= 0:
            idx[k] += 1
            s += sstr[k]
            d += dstr[k]
            if idx[k] < oshape[k]:
                break
            s -= sstr[k] * oshape[k]
            d -= dstr[k] * oshape[k]
            idx[k] = 0
            k -= 1


@nb.njit(nogil=True, cache=True, inline="always")
def _tile_task(t, src, soff, sstr, dst, doff, dstr, oshape, na, sa, nb_, db, tile, tb, per):
    r = t // per
    rest = t - r * per
    ia = rest // tb
    ib = rest - ia * tb
    s, d = _outer_offsets(r, oshape, soff, sstr, doff, dstr)
    a0 = ia * tile
    a1 = min(na, a0 + tile)
    b0 = ib * tile
    b1 = min(nb_, b0 + tile)
    us = nb.uint64(s)
    ud = nb.uint64(d)
    usa = nb.uint64(sa)
    udb = nb.uint64(db)
    for b in range(b0, b1):
        ub = nb.uint64(b)
        sb_ = us + ub
        db_ = ud + ub * udb
        for a in range(a0, a1):
            ua = nb.uint64(a)
            dst[db_ + ua] = src[sb_ + ua * usa]


@nb.njit(parallel=True, nogil=True, cache=True)
def copy_tiles(src, soff, sstr, dst, doff, dstr, oshape, na, sa, nb_, db, tile):
    """Transpose-like copy in ``tile``×``tile`` blocks: dim a has unit stride in dst (stride sa > 0
    in src), dim b has unit stride in src (stride db > 0 in dst); the remaining (outer) dims are
    described by oshape/sstr/dstr. Inner indices are unsigned so LLVM emits no negative-index
    wraparound code in the hot loop."""
    nrows = 1
    for k in range(oshape.size):
        nrows *= oshape[k]
    tb = (nb_ + tile - 1) // tile
    per = ((na + tile - 1) // tile) * tb
    for t in nb.prange(nrows * per):
        _tile_task(t, src, soff, sstr, dst, doff, dstr, oshape, na, sa, nb_, db, tile, tb, per)


@nb.njit(nogil=True, cache=True)
def copy_tiles_serial(src, soff, sstr, dst, doff, dstr, oshape, na, sa, nb_, db, tile):
    """``copy_tiles`` on the calling thread (copies below ``THREADS_MIN_BYTES``), the outer
    index as an odometer."""
    nd = oshape.size
    nrows = 1
    for k in range(nd):
        nrows *= oshape[k]
    idx = np.zeros(nd, np.int64)
    s = soff
    d = doff
    usa = nb.uint64(sa)
    udb = nb.uint64(db)
    for _ in range(nrows):
        us = nb.uint64(s)
        ud = nb.uint64(d)
        for a0 in range(0, na, tile):
            a1 = min(na, a0 + tile)
            for b0 in range(0, nb_, tile):
                b1 = min(nb_, b0 + tile)
                for b in range(b0, b1):
                    ub = nb.uint64(b)
                    sb_ = us + ub
                    db_ = ud + ub * udb
                    for a in range(a0, a1):
                        ua = nb.uint64(a)
                        dst[db_ + ua] = src[sb_ + ua * usa]
        k = nd - 1
        while k >= 0:
            idx[k] += 1
            s += sstr[k]
            d += dstr[k]
            if idx[k] < oshape[k]:
                break
            s -= sstr[k] * oshape[k]
            d -= dstr[k] * oshape[k]
            idx[k] = 0
            k -= 1


@nb.njit(parallel=True, nogil=True, cache=True)
def gather_maps(src, dst, oshape, sstr, maps, moff, fill, lo, hi, shift):
    """dst[i0..in] = src[Σ maps_k[i_k]·sstr_k], or ``fill`` where any map entry is -1.

    ``maps`` concatenates one int64 map per output dim (offsets ``moff``). On the last dim,
    positions [lo, hi) map to j + shift with unit source stride (a plain row copy)."""
    nd = oshape.size
    last = oshape[nd - 1]
    ml = moff[nd - 1]
    usl = nb.uint64(sstr[nd - 1])
    nrows = 1
    for k in range(nd - 1):
        nrows *= oshape[k]
    for r in nb.prange(nrows):
        rem = r + 0  # a copy: numba rejects writes to (an alias of) the prange index
        s = 0
        valid = True
        for k in range(nd - 2, -1, -1):
            q = rem // oshape[k]
            i = rem - q * oshape[k]
            rem = q
            m = maps[moff[k] + i]
            if m < 0:
                valid = False
            s += m * sstr[k]
        ud = nb.uint64(r * last)
        if not valid:
            for j in range(last):
                dst[ud + nb.uint64(j)] = fill
            continue
        us = nb.uint64(s)
        for j in range(lo):
            m = maps[ml + j]
            dst[ud + nb.uint64(j)] = src[us + nb.uint64(m) * usl] if m >= 0 else fill
        if hi > lo:
            ushift = nb.uint64(s + lo + shift)
            for j in range(hi - lo):
                uj = nb.uint64(j)
                dst[ud + nb.uint64(lo) + uj] = src[ushift + uj]
        for j in range(hi, last):
            m = maps[ml + j]
            dst[ud + nb.uint64(j)] = src[us + nb.uint64(m) * usl] if m >= 0 else fill


@nb.njit(parallel=True, nogil=True, cache=True)
def gather_rows(src, idx, dst, outer, n, inner):
    """ONNX Gather on (outer, n, inner) data with flat (already range-checked) indices."""
    m = idx.size
    for t in nb.prange(outer * m):
        o = t // m
        j = t - o * m
        k = idx[j]
        if k < 0:
            k += n
        s = (o * n + k) * inner
        dst[t * inner : (t + 1) * inner] = src[s : s + inner]


@nb.njit(nogil=True, cache=True)
def first_bad_index(idx, n):
    """Position of the first index outside [-n, n), or -1."""
    for i in range(idx.size):
        v = idx[i]
        if v < -n or v >= n:
            return i
    return -1


@nb.njit(parallel=True, nogil=True, cache=True)
def resample_axis(src, dst, outer, n_in, inner, idx, coef):
    """dst[o, j, :] = Σ_t coef[j, t] · src[o, idx[j, t], :] on (outer, n_in, inner) → (outer, n_out, inner)."""
    n_out = idx.shape[0]
    ntap = idx.shape[1]
    uinner = nb.uint64(inner)
    if inner == 1:
        for o in nb.prange(outer):
            us = nb.uint64(o * n_in)
            ud = nb.uint64(o * n_out)
            for j in range(n_out):
                acc = coef[j, 0] * src[us + nb.uint64(idx[j, 0])]
                for k in range(1, ntap):
                    acc += coef[j, k] * src[us + nb.uint64(idx[j, k])]
                dst[ud + nb.uint64(j)] = acc
        return
    for t in nb.prange(outer * n_out):
        o = t // n_out
        j = t - o * n_out
        ud = nb.uint64(t) * uinner
        c = coef[j, 0]
        us = nb.uint64(o * n_in + idx[j, 0]) * uinner
        for i in range(inner):
            ui = nb.uint64(i)
            dst[ud + ui] = c * src[us + ui]
        for k in range(1, ntap):
            c = coef[j, k]
            us = nb.uint64(o * n_in + idx[j, k]) * uinner
            for i in range(inner):
                ui = nb.uint64(i)
                dst[ud + ui] += c * src[us + ui]


# ---------------------------------------------------------------------------------------------
# strided-copy planning
# ---------------------------------------------------------------------------------------------
class CopyPlan(NamedTuple):
    """Copy input ``src`` (a strided view) into output ``dst`` (a strided view); see module doc."""

    mode: str  # "none" | "numpy" | "rows" | "tiles"
    src: int
    dst: int
    shape: tuple  # coalesced shape
    soff: int
    sstr: tuple
    doff: int
    dstr: tuple
    args: tuple  # numba arguments prepared at plan time
    threads: bool = True  # rows/tiles: the parallel numba kernel (else its serial twin)


def _coalesce(shape, sstr, dstr):
    dims = [(int(n), int(a), int(b)) for n, a, b in zip(shape, sstr, dstr) if int(n) != 1]
    out: list = []
    for n, a, b in dims:
        if out:
            pn, pa, pb = out[-1]
            if pa == a * n and pb == b * n:
                out[-1] = (pn * n, a, b)
                continue
        out.append((n, a, b))
    return out


def plan_copy(
    shape, soff, sstr, doff, dstr, itemsize: int, src: int = 0, dst: int = 0, parallel: bool | None = None
) -> CopyPlan:
    """Plan copying the view (shape, soff, sstr) of input ``src`` into the view (shape, doff, dstr)
    of output ``dst`` (offsets/strides in elements). ``parallel=None``: decide by size."""
    n = math.prod(int(s) for s in shape)
    if n == 0:
        return CopyPlan("none", src, dst, tuple(shape), 0, (), 0, (), ())
    dims = _coalesce(shape, sstr, dstr) or [(1, 1, 1)]
    cshape = tuple(d[0] for d in dims)
    cs = tuple(d[1] for d in dims)
    cd = tuple(d[2] for d in dims)
    if parallel is None:
        parallel = n * itemsize >= PARALLEL_MIN_BYTES
    if not parallel:
        return CopyPlan("numpy", src, dst, cshape, int(soff), cs, int(doff), cd, ())
    threads = n * itemsize >= THREADS_MIN_BYTES
    last = len(dims) - 1
    i64 = np.int64
    if cs[last] == 1 and cd[last] == 1:
        outer = list(range(last))
        rowlen = cshape[last]
        args = (
            np.array([cshape[k] for k in outer], i64),
            np.array([cs[k] for k in outer], i64),
            np.array([cd[k] for k in outer], i64),
            rowlen,
            1,
            1,
            max(ROW_CHUNK, 1),
        )
        return CopyPlan("rows", src, dst, cshape, int(soff), cs, int(doff), cd, args, threads)
    a = next((k for k in range(last, -1, -1) if cd[k] == 1), None)
    b = next((k for k in range(last, -1, -1) if cs[k] == 1), None)
    if a is not None and b is not None and a != b and cshape[a] >= 4 and cshape[b] >= 4 and cs[a] > 0 and cd[b] > 0:
        tile = max(16, 64 // itemsize)  # one 64-byte line per tile row
        outer = [k for k in range(len(dims)) if k not in (a, b)]
        args = (
            np.array([cshape[k] for k in outer], i64),
            np.array([cs[k] for k in outer], i64),
            np.array([cd[k] for k in outer], i64),
            cshape[a],
            cs[a],
            cshape[b],
            cd[b],
            tile,
        )
        return CopyPlan("tiles", src, dst, cshape, int(soff), cs, int(doff), cd, args, threads)
    outer = list(range(last))
    rowlen = cshape[last]
    chunk = ROW_CHUNK if (cs[last] != 0 or cd[last] != 0) else rowlen
    args = (
        np.array([cshape[k] for k in outer], i64),
        np.array([cs[k] for k in outer], i64),
        np.array([cd[k] for k in outer], i64),
        rowlen,
        cs[last],
        cd[last],
        max(chunk, 1),
    )
    return CopyPlan("rows", src, dst, cshape, int(soff), cs, int(doff), cd, args, threads)


def _view(flat: np.ndarray, shape, off, strides) -> np.ndarray:
    isz = flat.itemsize
    return np.ndarray(shape, flat.dtype, buffer=flat, offset=off * isz, strides=tuple(s * isz for s in strides))


def run_copy(p: CopyPlan, src: np.ndarray, dst: np.ndarray) -> None:
    """Execute one :class:`CopyPlan` between contiguous arrays ``src`` and ``dst``."""
    if p.mode == "none":
        return
    s = bits(src)
    d = bits(dst)
    if p.mode != "numpy":
        if p.mode == "rows":
            fn = copy_rows if p.threads else copy_rows_serial
        else:
            fn = copy_tiles if p.threads else copy_tiles_serial
        args = (s, p.soff, p.args[1], d, p.doff, p.args[2], p.args[0], *p.args[3:])
        if not kernel_cache.cold(fn, args):  # else it compiles in the background: numpy copies meanwhile
            fn(*args)
            return
    np.copyto(_view(d, p.shape, p.doff, p.dstr), _view(s, p.shape, p.soff, p.sstr))


def run_copies(ins, outs, attrs, plan, ws) -> None:
    """Kernel body shared by every pure data-movement op: run its list of copy plans."""
    for p in plan:
        run_copy(p, ins[p.src], outs[p.dst])


def plan_permute(in_shape, perm, itemsize: int, parallel=None) -> CopyPlan:
    """Copy of a contiguous ``in_shape`` array transposed by ``perm`` into a contiguous output."""
    cs = contiguous_strides(in_shape)
    oshape = tuple(in_shape[p] for p in perm)
    return plan_copy(oshape, 0, tuple(cs[p] for p in perm), 0, contiguous_strides(oshape), itemsize, parallel=parallel)


def plan_flat_copy(n: int, itemsize: int, src: int = 0, dst: int = 0) -> CopyPlan:
    """A plain contiguous copy of ``n`` elements (Reshape, Identity, Squeeze, ...)."""
    return plan_copy((n,), 0, (1,), 0, (1,), itemsize, src, dst)


# ---------------------------------------------------------------------------------------------
# index-map gathers (Pad in every mode, CenterCropPad, nearest Resize)
# ---------------------------------------------------------------------------------------------
class MapPlan(NamedTuple):
    mode: str  # "none" | "numpy" | "numba"
    oshape: tuple
    maps: tuple  # per output dim: int64 array of source indices (-1 = fill)
    args: tuple


def plan_maps(in_shape, maps, itemsize: int, parallel=None) -> MapPlan:
    """Plan ``out[i0..in] = x[maps_0[i0], ..., maps_n[in]]`` (-1 entries take the fill value)."""
    maps = tuple(np.ascontiguousarray(m, dtype=np.int64) for m in maps)
    oshape = tuple(int(m.size) for m in maps)
    n = math.prod(oshape)
    if n == 0:
        return MapPlan("none", oshape, maps, ())
    if not maps:
        return MapPlan("numpy", oshape, maps, ())
    if parallel is None:
        parallel = n * itemsize >= PARALLEL_MIN_BYTES
    if not parallel:
        return MapPlan("numpy", oshape, maps, ())
    last = maps[-1]
    # the longest run of the last map that is a unit-stride copy (j -> j + shift)
    lo = hi = 0
    if last.size:
        delta = last - np.arange(last.size)
        ok = last >= 0
        best = (0, 0)
        j = 0
        while j < last.size:
            if not ok[j]:
                j += 1
                continue
            k = j
            while k + 1 < last.size and ok[k + 1] and delta[k + 1] == delta[j]:
                k += 1
            if k + 1 - j > best[1] - best[0]:
                best = (j, k + 1)
            j = k + 1
        lo, hi = best
    shift = int(last[lo] - lo) if hi > lo else 0
    sstr = contiguous_strides(in_shape)
    if sstr and sstr[-1] != 1:
        lo = hi = 0
    moff = np.cumsum([0] + [m.size for m in maps[:-1]]).astype(np.int64)
    args = (np.array(oshape, np.int64), np.array(sstr, np.int64), np.concatenate(maps), moff, lo, hi, shift)
    return MapPlan("numba", oshape, maps, args)


def run_maps(p: MapPlan, src: np.ndarray, dst: np.ndarray, fill) -> None:
    """Execute a :class:`MapPlan`; ``fill`` is a scalar of ``dst``'s dtype."""
    if p.mode == "none":
        return
    if src.size == 0:  # no source element to gather: every output position is fill (a map entry >= 0 is impossible)
        dst[...] = fill
        return
    if p.mode == "numpy":
        if not p.maps:
            dst[...] = src
            return
        idx = np.ix_(*p.maps)
        if all((m >= 0).all() for m in p.maps):
            dst[...] = src[idx]
            return
        safe = np.ix_(*[np.maximum(m, 0) for m in p.maps])
        valid = np.ones(p.oshape, bool)
        for k, m in enumerate(p.maps):
            shape = [1] * len(p.maps)
            shape[k] = m.size
            valid &= (m >= 0).reshape(shape)
        dst[...] = np.where(valid, src[safe], fill)
        return
    f = np.asarray(fill, dtype=dst.dtype).reshape(1).view(_UINT[dst.dtype.itemsize])[0]
    oshape, sstr, maps, moff, lo, hi, shift = p.args
    gather_maps(bits(src), bits(dst), oshape, sstr, maps, moff, f, lo, hi, shift)


# ---------------------------------------------------------------------------------------------
# Gather
# ---------------------------------------------------------------------------------------------
def gather(data: np.ndarray, indices: np.ndarray, out: np.ndarray, axis: int, parallel: bool, op: str = "Gather"):
    """ONNX Gather along ``axis``; raises ParamInvalidError naming the first bad index."""
    from ...errors import ParamInvalidError

    n = data.shape[axis]
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1 :])
    idx = indices.reshape(-1).astype(np.int64, copy=False)
    # while the numba kernels compile in the background (opsnn.ops.tiering): np.take, the same check
    cold = kernel_cache.cold(first_bad_index, (idx, n))
    if parallel and out.size:
        cold = kernel_cache.cold(gather_rows, (bits(data), idx, bits(out), outer, n, inner)) or cold
    if cold:
        gather_numpy(data, indices, out, axis, op)
        return
    bad = first_bad_index(idx, n)
    if bad >= 0:
        pos = np.unravel_index(bad, indices.shape) if indices.ndim else ()
        raise ParamInvalidError(
            f"{op}: index {int(idx[bad])} at position {tuple(int(p) for p in pos)} is out of "
            f"range for axis {axis} of size {n} (valid: [{-n}, {n - 1}])",
            op=op,
        )
    if out.size == 0:
        return
    if not parallel:
        np.take(data.reshape(outer, n, inner), idx, axis=1, out=out.reshape(outer, idx.size, inner))
        return
    gather_rows(bits(data), idx, bits(out), outer, n, inner)


def gather_numpy(data: np.ndarray, indices: np.ndarray, out: np.ndarray, axis: int, op: str = "Gather"):
    """:func:`gather` as ``np.take`` with the same index check in numpy: nothing to compile, a cold
    plan's kernel while ``gather_rows`` compiles in the background (``opsnn.ops.tiering``)."""
    from ...errors import ParamInvalidError

    n = data.shape[axis]
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1 :])
    idx = indices.reshape(-1).astype(np.int64, copy=False)
    bad = np.flatnonzero((idx < -n) | (idx >= n))
    if bad.size:
        b = int(bad[0])
        pos = np.unravel_index(b, indices.shape) if indices.ndim else ()
        raise ParamInvalidError(
            f"{op}: index {int(idx[b])} at position {tuple(int(p) for p in pos)} is out of "
            f"range for axis {axis} of size {n} (valid: [{-n}, {n - 1}])",
            op=op,
        )
    if out.size == 0:
        return
    np.take(data.reshape(outer, n, inner), idx, axis=1, out=out.reshape(outer, idx.size, inner))


# ---------------------------------------------------------------------------------------------
# Embedding backward: scatter-add of gradient rows into a table, without races
# ---------------------------------------------------------------------------------------------
#: tables smaller than this many elements are written on the calling thread
EMBEDDING_GRAD_PARALLEL_MIN = 1 << 18


@nb.njit(nogil=True, cache=True)
def embedding_grad_order(ids, num_rows, start, order):
    """Counting sort of the positions by table row (stable): row r's positions are
    ``order[start[r]:start[r + 1]]`` in their original order. Negative ids count from the end;
    returns the position of the first id outside [-num_rows, num_rows), or -1."""
    start[:] = 0
    for i in range(ids.size):
        r = ids[i]
        if r < -num_rows or r >= num_rows:
            return i
        start[(r + num_rows if r < 0 else r) + 1] += 1
    for r in range(num_rows):
        start[r + 1] += start[r]
    fill = start[:num_rows].copy()
    for i in range(ids.size):
        r = ids[i]
        r = r + num_rows if r < 0 else r
        order[fill[r]] = i
        fill[r] += 1
    return -1


@nb.njit(nogil=True, cache=True)
def _embedding_grad_row(dy, out, r, padding, start, order):
    o = out[r]
    for j in range(o.size):
        o[j] = 0
    if r == padding:
        return
    for k in range(start[r], start[r + 1]):
        src = dy[order[k]]
        for j in range(o.size):
            o[j] += src[j]


@nb.njit(nogil=True, cache=True)
def embedding_grad_rows_serial(dy, out, padding, start, order):
    for r in range(out.shape[0]):
        _embedding_grad_row(dy, out, r, padding, start, order)


@nb.njit(parallel=True, nogil=True, cache=True)
def embedding_grad_rows_parallel(dy, out, padding, start, order):
    for r in nb.prange(out.shape[0]):
        _embedding_grad_row(dy, out, r, padding, start, order)


def embedding_grad_parallel(size: int) -> bool:
    """Whether a table gradient of ``size`` elements is written by all threads."""
    return size >= EMBEDDING_GRAD_PARALLEL_MIN and nb.get_num_threads() > 1


def embedding_grad_rows(
    dy: np.ndarray, ids: np.ndarray, out: np.ndarray, padding: int, parallel: bool, op: str
) -> None:
    """``out[r] = sum of dy[i] over the positions i with ids[i] == r`` (zero for the ``padding`` row,
    -1 for none), summed in the positions' order: each table row is owned by one thread, so the
    sums are race-free and equal a sequential scatter-add's bit for bit."""
    from ...errors import ParamInvalidError

    R = out.shape[0]
    flat = ids.reshape(-1).astype(np.int64, copy=False)
    start = np.empty(R + 1, np.int64)
    order = np.empty(flat.size, np.int64)
    bad = embedding_grad_order(flat, R, start, order)
    if bad >= 0:
        pos = tuple(int(p) for p in np.unravel_index(bad, ids.shape))
        raise ParamInvalidError(
            f"{op}: id {int(flat[bad])} at position {pos} is out of range for a table of {R} rows "
            f"(valid: [{-R}, {R - 1}])",
            op=op,
        )
    if out.size == 0:
        return
    dy2 = dy.reshape(flat.size, out.shape[1])
    (embedding_grad_rows_parallel if parallel else embedding_grad_rows_serial)(dy2, out, padding, start, order)


# ---------------------------------------------------------------------------------------------
# numpy-vectorized kernels for the rarely-hot ONNX breadth ops
# ---------------------------------------------------------------------------------------------
def check_index_range(op: str, idx: np.ndarray, n, what: str) -> np.ndarray:
    """Normalise negative indices and raise ParamInvalidError naming the first out-of-range one."""
    from ...errors import ParamInvalidError

    idx = idx.astype(np.int64, copy=False)
    n = np.asarray(n, np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        pos = tuple(int(p) for p in np.argwhere(bad)[0])
        lim = int(np.broadcast_to(n, idx.shape)[pos])
        raise ParamInvalidError(
            f"{op}: {what} {int(idx[pos])} at position {pos} is out of range for a dim of "
            f"size {lim} (valid: [{-lim}, {lim - 1}])",
            op=op,
        )
    return np.where(idx < 0, idx + n, idx)


@nb.njit(nogil=True, cache=True)
def _element_offset(p, idx, ishape, dstr, axis, n):
    """Data's flat offset for position ``p`` of the indices: its own coordinates, ``idx[p]`` on ``axis``."""
    rem = np.int64(p)  # a prange index is unsigned: uint64 with int64 arithmetic is float64 in numba
    s = np.int64(0)
    for k in range(ishape.size - 1, -1, -1):
        q = rem // ishape[k]
        i = rem - q * ishape[k]
        rem = q
        if k == axis:
            i = idx[p]
            if i < 0:
                i += n
        s += i * dstr[k]
    return s


@nb.njit(parallel=True, nogil=True, cache=True)
def gather_elements_flat(src, idx, dst, ishape, dstr, axis, n):
    """GatherElements on flat words with (already range-checked) indices of any integer dtype."""
    for p in nb.prange(idx.size):
        dst[p] = src[_element_offset(p, idx, ishape, dstr, axis, n)]


@nb.njit(nogil=True, cache=True)
def scatter_elements_flat(dst, idx, upd, ishape, dstr, axis, n, red):
    """ScatterElements in place on ``dst`` (a copy of data), in index order (the last of duplicate
    positions wins, as in the reference); ``red`` 0 none, 1 add, 2 mul, 3 max, 4 min (NaN wins)."""
    for p in range(idx.size):
        s = _element_offset(p, idx, ishape, dstr, axis, n)
        a = dst[s]
        b = upd[p]
        if red == 0:
            dst[s] = b
        elif red == 1:
            dst[s] = a + b
        elif red == 2:
            dst[s] = a * b
        elif red == 3:
            dst[s] = a if (a != a or a >= b) else b
        else:
            dst[s] = a if (a != a or a <= b) else b


#: reductions :func:`scatter_elements_flat` knows, by code
_SCATTER_REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


def _axis_indices(op: str, data_shape, indices: np.ndarray, axis: int):
    """(flat indices as given, no int64 copy; the indices' shape and data's strides as int64 arrays),
    after a range check that names the first bad index."""
    from ...errors import ParamInvalidError

    idx = np.ascontiguousarray(indices).reshape(-1)
    n = int(data_shape[axis])
    bad = first_bad_index(idx, n) if idx.size else -1
    if bad >= 0:
        pos = tuple(int(p) for p in np.unravel_index(bad, indices.shape))
        raise ParamInvalidError(
            f"{op}: index {int(idx[bad])} at position {pos} is out of range for a dim of "
            f"size {n} (valid: [{-n}, {n - 1}])",
            op=op,
        )
    return idx, np.array(indices.shape, np.int64), np.array(contiguous_strides(data_shape), np.int64)


def gather_elements(data, indices, out, axis):
    idx, ishape, dstr = _axis_indices("GatherElements", data.shape, indices, axis)
    if out.size:
        gather_elements_flat(bits(np.ascontiguousarray(data)), idx, bits(out), ishape, dstr, axis, data.shape[axis])


_REDUCE_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_elements(data, indices, updates, out, axis, reduction, op="ScatterElements"):
    np.copyto(out, data)
    if indices.size == 0:
        return
    idx, ishape, dstr = _axis_indices(op, data.shape, indices, axis)
    n = data.shape[axis]
    upd = np.ascontiguousarray(updates).reshape(-1)
    if reduction == "none":
        scatter_elements_flat(bits(out), idx, bits(upd), ishape, dstr, axis, n, 0)
    elif out.dtype.kind in "biu" or out.dtype in (np.float32, np.float64):
        scatter_elements_flat(out.reshape(-1), idx, upd, ishape, dstr, axis, n, _SCATTER_REDUCTIONS[reduction])
    else:  # 16-bit floats: numpy's ufunc.at converts the indices to intp, outside the pool
        check_request(8 * idx.size, f"{op}: int64 indices of the {reduction} reduction")
        grids = list(np.indices(indices.shape, sparse=True))
        grids[axis] = indices
        _REDUCE_UFUNC[reduction].at(out, tuple(grids), updates)


def gather_nd(data, indices, out, batch_dims):
    b = batch_dims
    k = indices.shape[-1]
    bshape = data.shape[:b]
    nb_ = math.prod(bshape)
    d = data.reshape((nb_,) + data.shape[b:])
    n = math.prod(indices.shape[b:-1])  # index tuples per batch (explicit: reshape cannot infer -1 from 0 elements)
    if out.size == 0:
        return
    if k == 0:  # an empty index tuple addresses the whole of each batch's data
        out[...] = np.broadcast_to(d[:, None], (nb_, n) + d.shape[1:]).reshape(out.shape)
        return
    ind = indices.reshape((nb_, n, k))
    lim = np.array(data.shape[b : b + k], np.int64)
    ind = check_index_range("GatherND", ind, lim, "index")
    bi = np.arange(nb_).reshape(nb_, 1)
    res = d[(bi,) + tuple(ind[..., j] for j in range(k))]
    out[...] = res.reshape(out.shape)


def scatter_nd(data, indices, updates, out, reduction):
    np.copyto(out, data)
    k = indices.shape[-1]
    if indices.size == 0 or k == 0 and updates.size == 0:
        return
    ind = indices.reshape(-1, k)
    lim = np.array(data.shape[:k], np.int64)
    ind = check_index_range("ScatterND", ind, lim, "index")
    upd = updates.reshape((ind.shape[0],) + data.shape[k:])
    where = tuple(ind[:, j] for j in range(k))
    if reduction == "none":
        out[where] = upd
    else:
        _REDUCE_UFUNC[reduction].at(out, where, upd)


def topk(x, k, axis, largest, out_v, out_i):
    """Top-k along ``axis`` with ties broken by the lower index (stable sort)."""
    # argsort's int64 order of every element (and the rows it copies), outside the pool
    check_request(8 * x.size + x.nbytes, f"TopK: sort order of {x.size} elements")
    xm = np.moveaxis(x, axis, -1)
    if largest:
        # a stable ascending sort of the reversed row, read backwards, is descending with
        # ties in ascending index order
        rev = xm[..., ::-1]
        order = np.argsort(rev, axis=-1, kind="stable")[..., ::-1][..., :k]
        order = xm.shape[-1] - 1 - order  # on the k kept only
    else:
        order = np.argsort(xm, axis=-1, kind="stable")[..., :k]
    vals = np.take_along_axis(xm, order, axis=-1)
    out_v[...] = np.moveaxis(vals, -1, axis)
    out_i[...] = np.moveaxis(order, -1, axis)


def unique(x, axis, sorted_):
    """ONNX Unique: (Y, first indices, inverse indices, counts)."""
    if axis is None:
        flat = x.reshape(-1)
        y, idx, inv, cnt = np.unique(flat, return_index=True, return_inverse=True, return_counts=True)
    else:
        y, idx, inv, cnt = np.unique(x, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    if not sorted_:
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    i64 = np.int64
    return [y, idx.astype(i64), inv.astype(i64), cnt.astype(i64)]


def col2im(x, image_shape, block_shape, dilations, pads, strides, out):
    """Col2Im (fold): scatter-add each column block back into the image."""
    n, ckk, L = x.shape
    nd = len(image_shape)
    kk = math.prod(block_shape)
    c = ckk // kk
    padded = [image_shape[i] + pads[i] + pads[i + nd] for i in range(nd)]
    counts = [(padded[i] - (dilations[i] * (block_shape[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)]
    acc = np.zeros((n, c) + tuple(padded), dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
    cols = x.reshape((n, c) + tuple(block_shape) + tuple(counts))
    for kidx in np.ndindex(*block_shape):
        sl = tuple(
            slice(kidx[i] * dilations[i], kidx[i] * dilations[i] + strides[i] * (counts[i] - 1) + 1, strides[i])
            for i in range(nd)
        )
        acc[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + kidx]
    crop = tuple(slice(pads[i], pads[i] + image_shape[i]) for i in range(nd))
    out[...] = acc[(slice(None), slice(None)) + crop]


@nb.njit(nogil=True, cache=True)
def _resize2d_rows(src, strides, n_c, oh_n, t0, t1, hi, hw_, wi, ww, dst):
    """Rows ``t0:t1`` of :func:`resize2d_view` (a row: one (image, channel, output row))."""
    s0, s1, s2, s3 = strides
    n_ow, th, tw = wi.shape[0], hi.shape[1], wi.shape[1]
    for t in range(t0, t1):
        nc = t // oh_n
        oh = t - nc * oh_n
        ni = nc // n_c
        base = ni * s0 + (nc - ni * n_c) * s1
        out = t * n_ow
        for ow in range(n_ow):
            acc = 0.0
            for i in range(th):
                row = base + hi[oh, i] * s2
                a = 0.0
                for j in range(tw):
                    a += ww[ow, j] * src[row + wi[ow, j] * s3]
                acc += hw_[oh, i] * a
            dst[out + ow] = acc


@nb.njit(parallel=True, nogil=True, cache=True)
def _resize2d_parallel(src, strides, n_c, oh_n, rows, hi, hw_, wi, ww, dst, chunks):
    per = (rows + chunks - 1) // chunks
    for c in nb.prange(chunks):
        _resize2d_rows(src, strides, n_c, oh_n, c * per, min(rows, (c + 1) * per), hi, hw_, wi, ww, dst)


def resize2d_view(src, strides, n_c: int, hi, hw_, wi, ww, dst, parallel: bool) -> None:
    """``dst`` (N, C, OH, OW) = ``Σ_i Σ_j hw_[oh, i] ww[ow, j] · X[n, c, hi[oh, i], wi[ow, j]]`` in
    float64, where ``X[n, c, h, w] = src[n*s0 + c*s1 + h*s2 + w*s3]`` (``strides``, in elements,
    of any view of the 1-D ``src``, whose dtype the sum converts from): a 2-D resampling that
    reads its input through a transpose / unsqueeze and a cast without materializing them."""
    rows = dst.shape[0] * dst.shape[1] * dst.shape[2]
    if rows == 0 or dst.shape[3] == 0:
        return
    flat = dst.reshape(-1)
    if parallel:
        _resize2d_parallel(
            src, strides, n_c, dst.shape[2], rows, hi, hw_, wi, ww, flat, min(rows, 4 * nb.get_num_threads())
        )
    else:
        _resize2d_rows(src, strides, n_c, dst.shape[2], 0, rows, hi, hw_, wi, ww, flat)
