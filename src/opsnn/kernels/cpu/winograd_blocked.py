"""Winograd F(4x4, 3x3) on channel-blocked tensors (``nChw<b>c``, see :mod:`.blocked`), its 36
GEMMs on oneDNN's batched matmul: the fast path for ResNet-style 3x3 stride-1 convolutions
inside the graph engine's blocked-layout chains.

oneDNN 3.2 has no float32 Winograd on AVX-512 CPUs without AMX (its ``winograd`` algorithm
fails to create, and ``auto`` picks the direct ``jit:avx512_core`` kernel, which runs close to
the cores' FMA peak). Winograd does 4x fewer multiplies; it pays only if the three steps stay
cheap, and on blocked tensors they do:

1. **input transform** (numba, parallel over (image, tile row, channel block)): each 6x6 input
   tile of ``b`` channels (zero outside the image) -> ``V[p, tile, c]`` = B^T d B, the ``b``
   channels of a pixel contiguous in X and in V, so every step is a ``b``-wide vector operation;
2. **36 GEMMs in one oneDNN batched matmul** ``M[p] (tiles x C_out) = V[p] (tiles x C_in) @ U[p]
   (C_in x C_out)``, U = G g G^T transformed once at prepare (float64, rounded once) and
   reordered into the matmul's own blocked layout (brgemm);
3. **output transform** (numba, same split over output channel blocks): A^T m A per tile, the
   bias, a residual Z and ReLU applied as it is written into Y (nChw<b>c), clipped at the edge.

It takes about half the direct convolution's time on ResNet-50's stages 1-3 (figures:
docs/performance.md, "Winograd on blocked tensors"). The transforms' lanes must vectorize
(unsigned indices, below). ``ops/defs/blocked.py`` says which shapes it takes.

Accuracy: F(4x4)'s constants amplify rounding: results differ from a direct convolution by
about 1e-5 of the output's scale (tests allow 2e-4, as for :mod:`.winograd`). Inf and NaN as in
:mod:`.winograd`: the input transform's check finds tiles whose input is not finite, and those
are computed again by the direct sum with the same epilogue (:func:`direct_tiles`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba as nb
import numpy as np

from .. import bounds as _bounds
from . import onednn as D
from .conv import ALIGN, workspace_view
from .winograd import ALPHA, POINTS, TILE, _at, _bt, all_finite, transform_weights

_U = np.uintp  # unsigned indices: no negative-index wraparound, so LLVM vectorizes

#: U (36 x C_in x C_out float32) above this many bytes streams from memory on every call with
#: few tiles to share it, and the direct convolution wins (docs/performance.md).
#: ``ops/defs/blocked.py`` also wants enough tiles per image (see there).
MAX_WEIGHT_BYTES = 16 << 20


@nb.njit(nogil=True, cache=True, inline="always")
def _split(task, blocks, th_n, b):
    """A transform task -> (image * th_n + tile row, tile row, image, channel block, its first
    channel): the tasks run over (image, tile row, channel block), channel blocks fastest."""
    cb = task % blocks
    row = task // blocks
    return row, row % th_n, _U(row // th_n), _U(cb), _U(cb * b)


@functools.cache
def transforms(lanes: int):
    """``(input_transform, output_transform)`` for blocks of ``lanes`` channels (``b``): one pair
    of kernels per block size, the lane count a constant in their code. Each lane loop is then
    one b-wide vector operation, without the trip-count checks, remainder and epilogue loops
    LLVM builds around a loop of unknown length: less code to compile, and faster. The input
    transform takes the constant only for 16 lanes: with 8, LLVM unrolls its short loops whole
    and the result ran slower than the loop of unknown length (AVX2 target)."""
    in_lanes = lanes if lanes >= 16 else 0

    @nb.njit(parallel=True, nogil=True, cache=True)
    def input_transform(x, v, ph, pw, th_n, tw_n):
        """``x`` (N, C/b, H, W, b) -> ``v`` (36, N*th_n*tw_n, C): B^T d B of every 6x6 tile (4x4
        output tiles, their inputs starting ``ph``/``pw`` before the image), zeros outside. Indices
        are unsigned (``_U``) so numba skips negative-index wraparound and LLVM vectorizes the lanes.
        Returns a check value, not finite when an input tile holds an Inf or NaN: per lane, the first
        and last point of every column of V (together they depend on all the column's rows with
        nonzero factors, see ``winograd._input_range``), one vector add per 3 values of V.
        ``b`` must be ``lanes``."""
        n_img, cb_n, h, w, b = x.shape
        total = 0.0
        for task in nb.prange(n_img * th_n * cb_n):
            row, ty, un, ucb, c0 = _split(task, cb_n, th_n, b)
            ub = _U(in_lanes) if in_lanes else _U(b)  # set in the parallel body: one set outside is a variable there
            d = np.empty((ALPHA, ALPHA, b), np.float32)
            t = np.empty((ALPHA, ALPHA, b), np.float32)
            chk = np.zeros(b, np.float32)
            for tx in range(tw_n):
                y0 = ty * TILE - ph
                x0 = tx * TILE - pw
                for i in range(ALPHA):
                    iy = y0 + i
                    ui = _U(i)
                    for j in range(ALPHA):
                        ix = x0 + j
                        uj = _U(j)
                        if 0 <= iy < h and 0 <= ix < w:
                            uy, ux = _U(iy), _U(ix)
                            for lane in range(ub):
                                d[ui, uj, lane] = x[un, ucb, uy, ux, lane]
                        else:
                            for lane in range(ub):
                                d[ui, uj, lane] = 0.0
                for i in range(_U(ALPHA)):  # B^T along each row
                    for lane in range(ub):
                        r0, r1, r2, r3, r4, r5 = _bt(
                            d[i, 0, lane], d[i, 1, lane], d[i, 2, lane], d[i, 3, lane], d[i, 4, lane], d[i, 5, lane]
                        )
                        t[i, 0, lane], t[i, 1, lane], t[i, 2, lane] = r0, r1, r2
                        t[i, 3, lane], t[i, 4, lane], t[i, 5, lane] = r3, r4, r5
                tile = _U(row * tw_n + tx)
                for k in range(_U(ALPHA)):  # ... then down each column, into V
                    for lane in range(ub):
                        r0, r1, r2, r3, r4, r5 = _bt(
                            t[0, k, lane], t[1, k, lane], t[2, k, lane], t[3, k, lane], t[4, k, lane], t[5, k, lane]
                        )
                        c = c0 + lane
                        v[k, tile, c], v[6 + k, tile, c], v[12 + k, tile, c] = r0, r1, r2
                        v[18 + k, tile, c], v[24 + k, tile, c], v[30 + k, tile, c] = r3, r4, r5
                        chk[lane] += r0 + r5
            s = 0.0
            for lane in range(ub):
                s += chk[lane]
            total += s
        return total

    @nb.njit(parallel=True, nogil=True, cache=True)
    def output_transform(mm, bias, z, y, th_n, tw_n, has_z, relu, tmax):
        """``mm`` (36, tiles, M) -> ``y`` (N, M/b, Ho, Wo, b): A^T m A per tile, + ``bias`` (M,),
        + ``z`` (y's shape, when ``has_z``), then max(., 0) when ``relu``; tiles clipped at the edge.
        ``b`` must be ``lanes``. ``tmax`` (one per task): the task's max |y| before the Relu, NaN or
        Inf where a value it wrote is not finite (a bound for kernels.bounds)."""
        n_img, mb_n, ho, wo, b = y.shape
        zero = np.float32(0)
        for task in nb.prange(n_img * th_n * mb_n):
            row, ty, un, umb, m0 = _split(task, mb_n, th_n, b)
            ub = _U(lanes)
            u = np.empty((ALPHA, TILE, b), np.float32)
            o = np.empty((TILE, TILE, b), np.float32)
            big = np.zeros(b, np.float32)  # per lane: max |value|, and 0 * value (NaN once one is not finite)
            bad = np.zeros(b, np.float32)
            for tx in range(tw_n):
                tile = _U(row * tw_n + tx)
                for a in range(_U(ALPHA)):  # A^T along each row of points
                    p = a * _U(ALPHA)
                    for lane in range(ub):
                        c = m0 + lane
                        r0, r1, r2, r3 = _at(
                            mm[p, tile, c],
                            mm[p + 1, tile, c],
                            mm[p + 2, tile, c],
                            mm[p + 3, tile, c],
                            mm[p + 4, tile, c],
                            mm[p + 5, tile, c],
                        )
                        u[a, 0, lane], u[a, 1, lane], u[a, 2, lane], u[a, 3, lane] = r0, r1, r2, r3
                for s in range(_U(TILE)):  # ... then down each column
                    for lane in range(ub):
                        r0, r1, r2, r3 = _at(
                            u[0, s, lane], u[1, s, lane], u[2, s, lane], u[3, s, lane], u[4, s, lane], u[5, s, lane]
                        )
                        bb = bias[m0 + lane]
                        o[0, s, lane], o[1, s, lane], o[2, s, lane], o[3, s, lane] = r0 + bb, r1 + bb, r2 + bb, r3 + bb
                for i in range(min(TILE, ho - ty * TILE)):
                    uy, ui = _U(ty * TILE + i), _U(i)
                    for s in range(min(TILE, wo - tx * TILE)):
                        ux, us = _U(tx * TILE + s), _U(s)
                        if has_z:
                            for lane in range(ub):
                                o[ui, us, lane] += z[un, umb, uy, ux, lane]
                        for lane in range(ub):
                            v = o[ui, us, lane]
                            big[lane] = max(big[lane], abs(v))
                            bad[lane] += v * zero
                        if relu:
                            for lane in range(ub):
                                y[un, umb, uy, ux, lane] = max(o[ui, us, lane], zero)
                        else:
                            for lane in range(ub):
                                y[un, umb, uy, ux, lane] = o[ui, us, lane]
            m = zero
            f = zero
            for lane in range(ub):
                m = max(m, big[lane])
                f += bad[lane]
            tmax[task] = m + f

    return input_transform, output_transform


@nb.njit(parallel=True, nogil=True, cache=True)
def direct_tiles(x, w, bias, z, y, tiles, ph, pw, has_z, relu):
    """The output ``tiles`` ((image, tile row, tile column) rows) of ``y`` (N, M/b, Ho, Wo, b)
    by the direct 3x3 sum over ``x`` (N, C/b, H, W, b) and ``w`` (M, C, 3, 3) in float64, with the
    epilogue of :func:`output_transform`: IEEE semantics of a direct convolution."""
    n_img, cb_n, h, wd, b = x.shape
    mb_n, ho, wo = y.shape[1], y.shape[2], y.shape[3]
    m_n = mb_n * b
    for task in nb.prange(tiles.shape[0] * m_n):
        k = task // m_n
        mc = task - k * m_n
        mb, ml = mc // b, mc % b
        i, ty, tx = tiles[k, 0], tiles[k, 1], tiles[k, 2]
        for oy in range(ty * TILE, min(ty * TILE + TILE, ho)):
            for ox in range(tx * TILE, min(tx * TILE + TILE, wo)):
                acc = 0.0
                for cb in range(cb_n):
                    for ky in range(3):
                        iy = oy + ky - ph
                        if iy < 0 or iy >= h:
                            continue
                        for kx in range(3):
                            ix = ox + kx - pw
                            if 0 <= ix < wd:
                                for cl in range(b):
                                    acc += np.float64(x[i, cb, iy, ix, cl]) * np.float64(w[mc, cb * b + cl, ky, kx])
                o = np.float32(acc + bias[mc])
                if has_z:
                    o += z[i, mb, oy, ox, ml]
                y[i, mb, oy, ox, ml] = max(o, np.float32(0)) if relu else o


@nb.njit(nogil=True, cache=True)
def nonfinite_tiles(x, th_n, tw_n, ph, pw):
    """(image, tile row, tile column) of every 4x4 output tile whose 6x6 input window (all
    channels) holds an Inf or NaN; ``x`` (N, C/b, H, W, b)."""
    n_img, cb_n, h, w, b = x.shape
    bad = np.zeros((n_img, h, w), np.bool_)
    for i in range(n_img):
        for cb in range(cb_n):
            for iy in range(h):
                for ix in range(w):
                    for lane in range(b):
                        if not np.isfinite(x[i, cb, iy, ix, lane]):
                            bad[i, iy, ix] = True
    out = np.empty((n_img * th_n * tw_n, 3), np.int64)
    k = 0
    for i in range(n_img):
        for ty in range(th_n):
            for tx in range(tw_n):
                hit = False
                for iy in range(max(ty * TILE - ph, 0), min(ty * TILE - ph + ALPHA, h)):
                    for ix in range(max(tx * TILE - pw, 0), min(tx * TILE - pw + ALPHA, w)):
                        hit = hit or bad[i, iy, ix]
                if hit:
                    out[k, 0], out[k, 1], out[k, 2] = i, ty, tx
                    k += 1
    return out[:k]


def weight_bytes(c_in: int, c_out: int) -> int:
    """Bytes of the transformed weight U (float32)."""
    return POINTS * c_in * c_out * 4


#: images per chunk are chosen so a chunk's V + M stay near this many bytes (cache-resident
#: between the transforms and the GEMMs; one large chunk spends most of its time in the transforms)
CHUNK_BYTES = 4 << 20


@dataclass(eq=False)
class BlockedWinogradPlan:
    """Everything a call needs, built at prepare: the tile counts, the images per chunk and a
    batched matmul primitive per chunk size (sharing one transformed, reordered weight U)."""

    x_shape: tuple
    y_shape: tuple
    block: int
    pads: tuple  # (top, left) padding
    tiles: tuple  # (tile rows, tile columns) per image
    per_chunk: int  # images per chunk
    gemms: dict  # images in a chunk -> D.BatchMatMulPrimitive
    relu: bool
    zero_bias: np.ndarray  # (C_out,) zeros: the output transform's bias when the conv has none
    #: the weight (M, C, 3, 3) as float32, for the tiles computed directly (Inf or NaN inputs)
    w: np.ndarray
    #: False when ``w`` holds an Inf or NaN: then every tile is computed directly
    finite_w: bool = True

    @property
    def chunk_tiles(self) -> int:
        return self.per_chunk * self.tiles[0] * self.tiles[1]

    def workspace_bytes(self) -> int:
        """V (36 x tiles x C_in) and M (36 x tiles x C_out) of one chunk, float32, aligned."""
        return POINTS * self.chunk_tiles * (self.x_shape[1] + self.y_shape[1]) * 4 + ALIGN

    def describe(self) -> str:
        th, tw = self.tiles
        g = self.gemms[self.per_chunk]
        _, m, k, n = g.shape
        return (
            f"Winograd F(4x4,3x3) on nChw{self.block}c: {th}x{tw} tiles per image, {self.per_chunk} image(s) "
            f"per chunk, the 36 GEMMs ({m}x{k} @ {k}x{n}) in one oneDNN {g.impl} batched matmul, weights "
            f"transformed at prepare"
        )


def plan(x_shape, w: np.ndarray, y_shape, pads: tuple, block: int, relu: bool) -> BlockedWinogradPlan:
    """Prepare a 3x3 stride-1 convolution of blocked ``x_shape`` (N, C, H, W) with the constant
    float32 weight ``w`` (M, C, 3, 3) into blocked ``y_shape``, ``pads`` (top, left)."""
    n, c = int(x_shape[0]), int(x_shape[1])
    m, ho, wo = int(y_shape[1]), int(y_shape[2]), int(y_shape[3])
    th, tw = -(-ho // TILE), -(-wo // TILE)
    per_image = POINTS * th * tw * (c + m) * 4
    per_chunk = max(1, min(n, CHUNK_BYTES // per_image))
    w = np.asarray(w)
    # V (36, T, C) @ U^T (36, C, M), U = G w G^T (36, M, C), computed and reordered once per weight
    # array: plans for other batch sizes and a last, smaller chunk's primitive share the copy
    source = (w, "winograd F(4x4,3x3)", ((POINTS, m, c), np.float32))
    gemms = {
        k: D.BatchMatMulPrimitive(k * th * tw, lambda: transform_weights(w, np.float32), transposed=True, source=source)
        for k in {per_chunk, n % per_chunk}
        if k
    }
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    return BlockedWinogradPlan(
        tuple(int(s) for s in x_shape),
        tuple(int(s) for s in y_shape),
        int(block),
        (int(pads[0]), int(pads[1])),
        (th, tw),
        per_chunk,
        gemms,
        bool(relu),
        np.zeros(m, np.float32),
        w32,
        all_finite(w32),
    )


def bind(x: np.ndarray, b, z, y: np.ndarray, p: BlockedWinogradPlan, ws: np.ndarray):
    """``lambda: conv(x, b, z, y, p, ws)`` with the chunks' views and the GEMMs' addresses
    prepared once (a compiled graph's fixed buffers: see ``Kernel.bind``)."""
    n, c, h, w = p.x_shape
    _, m, ho, wo = p.y_shape
    blk = p.block
    x5 = x.reshape(n, c // blk, h, w, blk)
    y5 = y.reshape(n, m // blk, ho, wo, blk)
    z5 = z.reshape(y5.shape) if z is not None else y5
    bias = b if b is not None else p.zero_bias
    flat = workspace_view(ws, np.float32, ((p.workspace_bytes() - ALIGN) // 4,))
    (ph, pw), (th, tw), has_z, relu = p.pads, p.tiles, z is not None, p.relu
    chunks = []
    for i0 in range(0, n, p.per_chunk):
        k = min(p.per_chunk, n - i0)
        t = k * th * tw
        v = flat[: POINTS * t * c].reshape(POINTS, t, c)
        mm = flat[POINTS * t * c : POINTS * t * (c + m)].reshape(POINTS, t, m)
        tasks = k * th * (m // blk)  # the output transform's tasks over these images: tmax[:tasks]
        chunks.append((x5[i0 : i0 + k], v, p.gemms[k].bind(v, mm), mm, z5[i0 : i0 + k], y5[i0 : i0 + k], tasks))

    w4, finite_w = p.w, p.finite_w
    input_transform, output_transform = transforms(blk)
    tmax = np.zeros(p.per_chunk * th * (m // blk), np.float32)
    ycell = _bounds.publish(y)

    def call():
        bound = 0.0
        for xc, v, gemm, mm, zc, yc, tasks in chunks:
            check = input_transform(xc, v, ph, pw, th, tw)
            gemm()
            output_transform(mm, bias, zc, yc, th, tw, has_z, relu, tmax)
            if ycell is not None:
                t = float(tmax[:tasks].max())
                bound = max(bound, t) if math.isfinite(t) else math.inf
            if not finite_w or not math.isfinite(check):  # Inf or NaN in: those tiles again, directly
                tiles = nonfinite_tiles(xc, th, tw, ph, pw) if finite_w else np.empty((0, 3), np.int64)
                if not len(tiles):  # the weight, or a finite overflow: every tile
                    tiles = np.ascontiguousarray(np.indices((xc.shape[0], th, tw)).reshape(3, -1).T, np.int64)
                direct_tiles(xc, w4, bias, zc, yc, tiles, ph, pw, has_z, relu)
                bound = math.inf
        if ycell is not None:  # the values as written, before a Relu: float32 values, exact
            ycell[0] = bound

    return call


def conv(x: np.ndarray, b, z, y: np.ndarray, p: BlockedWinogradPlan, ws: np.ndarray) -> None:
    """``y = act(conv(x, W) + b + z)`` on blocked arrays (x, z, y flat or 5-D, C-contiguous)."""
    bind(x, b, z, y, p, ws)()
