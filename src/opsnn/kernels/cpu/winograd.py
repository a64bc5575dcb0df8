"""Winograd convolution, F(4x4, 3x3) and F(2x2, 3x3): 3x3, stride 1, group 1, any padding;
dilation 1, or (F(4x4) only) any dilation through phase sub-images (``dilated_plan``: d*d
dense convs, see below).

Each 4x4 block of output (a *tile*) is computed from a 6x6 block of input with
36 element-wise products instead of 144 multiply-adds per (input, output) channel
pair (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016)::

    Y_tile = A^T [ (G g G^T) . (B^T d B) ] A

Summed over input channels, the element-wise product becomes one GEMM per transform
point: for each of the 36 points ``U[p] (M x C) @ V[p] (C x tiles)``. So a conv is

1. weight transform ``U = G g G^T`` (one float64 GEMM with kron(G, G)) — once, in the
   plan, when the weight is a constant known at prepare time (graph initializers): the
   weights are *pre-packed*; otherwise per call, into the workspace;
2. input transform ``V = B^T d B`` per (channel, tile) — numba;
3. 36 GEMMs: with MKL a point per task on single-threaded MKL in one parallel region
   (:func:`point_gemms`), else one batched ``np.matmul``;
4. output transform ``A^T m A`` per (output channel, tile), clipped at the image edge,
   with the bias added — numba.

F(2x2, 3x3) (``tile=2`` in :func:`winograd_plan`) is the same pipeline with 2x2 output
tiles from 4x4 input tiles: 16 points, so 16 GEMMs (2.25x fewer multiplies than direct
vs F(4x4)'s 4x), U only 16/9 the size of the plain weights (F(4x4): 4x), four times as
many tiles — fatter GEMMs on small images (14x14: 49 tiles instead of 16, none overhanging
the image) — and transforms that only add and subtract (B, A hold 0 and +-1, G 1/2: exact
in binary, so it is as accurate as im2col). Measured, one thread, weights pre-packed: F(2x2)
beats F(4x4) on small images and few channels (ResNet-50's 256 ch 14x14 and 512 ch 7x7 at
batch 1-8), F(4x4) wins from ~28x28 with >= 64 channels; ``ops/defs/conv.py`` chooses.

Transforms. The V and M buffers are (points, channels, tiles), tiles contiguous: the GEMM
operands need no copy. The input transform handles one channel's tiles at a time, a block of
tile rows (<= ``BLOCK_TILES`` tiles) at once: B^T along each tile's rows into scratch, then
B^T down the columns of all the block's tiles in one contiguous, vectorized loop that writes
V. Per (channel, tile row) work would be too short on small images (14x14: 4 tiles per row;
that form took 100 ns per channel-tile there vs 40 now). F(4x4) on wide images (>=
``ROWS_MIN_TW`` tiles per row) keeps the per-(channel, tile row) form: columns first along the
padded rows, then rows per tile, which is faster when rows are long. The output transform
mirrors the block form: A^T down the point columns of the block's tiles (vectorized), then
along each tile's rows straight into y.

The (image, tile row) pairs of the batch run in chunks sized so V and M stay cache-sized
(``CHUNK_BYTES``), larger when U is large (each chunk streams all of U through the GEMMs);
the transforms of a chunk run in parallel (over channels) only when large (``PARALLEL_MIN``).

The transforms' loops index with ``np.uintp``: numba then skips negative-index wraparound,
which otherwise keeps LLVM from vectorizing them.

Accuracy: F(4x4)'s transform constants (1/4, 1/6, 1/24; 4, 5, 8) amplify rounding, so
fp32 results differ from a direct convolution by about 1e-5 of the output's scale
(measured: max |err| / max |y| < 1e-4 up to C = 512); tests allow 2e-4 relative to
the output's largest magnitude. F(2x2): ~1e-6 (tests: 2e-5). float64 inputs run the same
algorithm in float64.

Inf and NaN. Every output of a tile depends on every input of its tile through the transforms,
so one NaN would spread over the tile and an Inf become Inf - Inf = NaN. The input transforms
also sum, per tile, the first and last point of every column of V (a vector add per 3 values of
V; F(2x2): per 2), which is not finite exactly when the tile's input is not (or a finite value
overflows); when a chunk's sum is not finite, the tiles whose input window holds Inf or NaN are
found (one pass over the input) and computed again by the direct 3x3 sum (:func:`redo_tiles`),
so the result has NaN and Inf where a direct convolution has them. A weight holding Inf or NaN
makes every tile direct (the selector does not take Winograd for such a constant weight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np

from ...runtime import kernel_cache
from . import mkl as _mkl
from . import mkl_nb as MN
from .conv import ALIGN, workspace_view

#: F(4x4, 3x3): output tile, input tile, transform points
TILE = 4
ALPHA = 6
POINTS = ALPHA * ALPHA
#: F(2x2, 3x3): output tile, input tile, transform points
TILE2 = 2
ALPHA2 = 4
POINTS2 = ALPHA2 * ALPHA2
#: below this many transform outputs per chunk (points x tiles x channels) the serial transforms
#: run: waking numba's workers would cost more than the split saves. Since the GEMMs run on MKL,
#: whose threads are numba's own libgomp pool (spinning GOMP_SPINCOUNT after each region), the
#: workers are awake when a transform starts: whole conv, weights pre-packed, parallel vs serial
#: transforms, interleaved (2-core AVX-512 VM, 2026-12-02): 128 ch 28x28 F(4x4) 1.19 vs 1.80 ms,
#: 256 ch 14x14 F(4x4) 1.28 vs 1.72, 512 ch 7x7 F(2x2) 1.64 vs 2.00, down to 128 ch 7x7 F(4x4)
#: (18K outputs) 0.354 vs 0.386 and 64 ch 14x14 F(2x2) 0.217 vs 0.238 (was 1 << 18 with OpenBLAS)
PARALLEL_MIN = 1 << 14
#: tile rows per chunk are chosen so the V + M transform buffers stay near this many bytes,
#: cache-resident between the transforms and the GEMMs (1-32 MiB measured: batch 1 flat within
#: noise; batch 8 at 56x56 ~1.5x slower when a chunk's buffers outgrow the caches)
CHUNK_BYTES = 4 << 20
#: ... but every chunk streams all of U (the transformed weights) once through the GEMMs, so
#: with many channels and a batch of small images the chunk may grow to this many times U's
#: bytes, up to CHUNK_MAX_BYTES (one thread, vs im2col, 4 MiB chunks -> this rule: 8 x 256 ch
#: 14x14 F(4x4) 1.41 -> 1.89x, F(2x2) 1.46 -> 1.71x; 8 x 512 ch 7x7 F(4x4) 1.24 -> 2.06x, F(2x2)
#: 1.67 -> 1.93x; with U small, 8 x 64 ch 56x56 and 8 x 128 ch 28x28 were slower with 16 MiB)
CHUNK_U_FACTOR = 2
CHUNK_MAX_BYTES = 32 << 20
#: the transforms work on one channel's tiles at most this many at a time (whole tile rows):
#: long vectors for the half that runs along the tiles, scratch that stays in L1
BLOCK_TILES = 256
#: parallel transforms split the channels into at most this many blocks (per-block scratch)
BLOCKS = 64

# Transform matrices (Lavin & Gray's F(4,3) with interpolation points 0, +-1, +-2).
G = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
    dtype=np.float64,
)
BT = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=np.float64)
# F(2,3) with interpolation points 0, +-1.
G2 = np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]], dtype=np.float64)
BT2 = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
AT2 = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)

_F2, _F4, _F5, _F8 = np.float32(2), np.float32(4), np.float32(5), np.float32(8)
_U = np.uintp  # unsigned indices: numba then skips negative-index wraparound (see the module doc)


# -- 1-D transforms (B^T d, A^T m); the 2-D ones apply them along rows, then columns ----------------------
@nb.njit(nogil=True, cache=True, inline="always")
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T d for one 6-vector (B^T's zeros and repeated rows folded by hand). The constants are
    float32 (float64 inputs stay float64): with int ones numba promotes float32 * int to float64,
    halving the vector width."""
    a = d4 - _F4 * d2
    b = d3 - _F4 * d1
    c = d4 - d2
    e = _F2 * (d3 - d1)
    return (_F4 * d0 - _F5 * d2 + d4, a + b, a - b, c + e, c - e, _F4 * d1 - _F5 * d3 + d5)


@nb.njit(nogil=True, cache=True, inline="always")
def _at(m0, m1, m2, m3, m4, m5):
    """A^T m for one 6-vector (float32 constants, as in :func:`_bt`)."""
    s12 = m1 + m2
    d12 = m1 - m2
    s34 = m3 + m4
    d34 = m3 - m4
    return (m0 + s12 + s34, d12 + _F2 * d34, s12 + _F4 * s34, d12 + _F8 * d34 + m5)


@nb.njit(nogil=True, cache=True, inline="always")
def _bt4(d0, d1, d2, d3):
    """B^T d for one 4-vector (F(2, 3))."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@nb.njit(nogil=True, cache=True, inline="always")
def _at4(m0, m1, m2, m3):
    """A^T m for one 4-vector (F(2, 3))."""
    return m0 + m1 + m2, m1 - m2 - m3


# -- input transform: per channel, a block of tile rows at a time ----------------------------------------
# For each tile row: its alpha input rows are copied (zero-padded) into ``rowbuf``; B^T runs
# along each row, tile by tile, into d (alpha rows, alpha points, tiles); then B^T runs down
# the columns of all the block's tiles at once (contiguous along the tiles, vectorized),
# writing V's rows straight away. The tiles of a chunk are its tile rows, image-major.
@nb.njit(nogil=True, cache=True, inline="always")
def _fill_rows(x, c, g, th_n, tile, alpha, ph, pw, rowbuf):
    # the alpha (zero-padded) input rows of global tile row g of channel c -> rowbuf (alpha, wp)
    h_n, w_n = x.shape[2], x.shape[3]
    wp = rowbuf.shape[1]
    lo = min(max(pw, 0), wp)  # padded columns [lo, hi) hold input columns [lo - pw, hi - pw)
    hi = max(min(pw + w_n, wp), lo)
    i = g // th_n
    th = g - i * th_n
    h0 = th * tile - ph
    ui = _U(i)
    uc = _U(c)
    for r in range(alpha):
        ur = _U(r)
        hh = h0 + r
        if hh < 0 or hh >= h_n:
            for j in range(wp):
                rowbuf[ur, _U(j)] = 0
            continue
        uh = _U(hh)
        for j in range(lo):
            rowbuf[ur, _U(j)] = 0
        for j in range(lo, hi):
            rowbuf[ur, _U(j)] = x[ui, uc, uh, _U(j - pw)]
        for j in range(hi, wp):
            rowbuf[ur, _U(j)] = 0


@nb.njit(nogil=True, cache=True, inline="always")
def _input_channel(x, v, c, row0, n_rows, th_n, tw_n, ph, pw, bl, rowbuf, d, chk):
    uc = _U(c)
    for rb in range(0, n_rows, bl):
        nr = min(bl, n_rows - rb)
        for rr in range(nr):
            _fill_rows(x, c, row0 + rb + rr, th_n, TILE, ALPHA, ph, pw, rowbuf)
            t0 = rr * tw_n
            for r in range(ALPHA):  # B^T along the row, tile by tile
                ur = _U(r)
                for tw in range(tw_n):
                    j = _U(tw * TILE)
                    t = _U(t0 + tw)
                    s0, s1, s2, s3, s4, s5 = _bt(
                        rowbuf[ur, j],
                        rowbuf[ur, j + _U(1)],
                        rowbuf[ur, j + _U(2)],
                        rowbuf[ur, j + _U(3)],
                        rowbuf[ur, j + _U(4)],
                        rowbuf[ur, j + _U(5)],
                    )
                    d[ur, _U(0), t] = s0
                    d[ur, _U(1), t] = s1
                    d[ur, _U(2), t] = s2
                    d[ur, _U(3), t] = s3
                    d[ur, _U(4), t] = s4
                    d[ur, _U(5), t] = s5
        col0 = rb * tw_n
        for q in range(ALPHA):  # B^T down the columns, all the block's tiles at once
            uq = _U(q)
            for t in range(nr * tw_n):
                ut = _U(t)
                p = _U(col0 + t)
                u0, u1, u2, u3, u4, u5 = _bt(
                    d[_U(0), uq, ut],
                    d[_U(1), uq, ut],
                    d[_U(2), uq, ut],
                    d[_U(3), uq, ut],
                    d[_U(4), uq, ut],
                    d[_U(5), uq, ut],
                )
                v[uq, uc, p] = u0
                v[uq + _U(ALPHA), uc, p] = u1
                v[uq + _U(2 * ALPHA), uc, p] = u2
                v[uq + _U(3 * ALPHA), uc, p] = u3
                v[uq + _U(4 * ALPHA), uc, p] = u4
                v[uq + _U(5 * ALPHA), uc, p] = u5
                chk[p] += u0 + u5  # rows 0, 2, 4 and 1, 3, 5 of the tile: see _input_range


@nb.njit(nogil=True, cache=True, inline="always")
def _input_channel2(x, v, c, row0, n_rows, th_n, tw_n, ph, pw, bl, rowbuf, d, chk):
    uc = _U(c)
    for rb in range(0, n_rows, bl):
        nr = min(bl, n_rows - rb)
        for rr in range(nr):
            _fill_rows(x, c, row0 + rb + rr, th_n, TILE2, ALPHA2, ph, pw, rowbuf)
            t0 = rr * tw_n
            for r in range(ALPHA2):
                ur = _U(r)
                for tw in range(tw_n):
                    j = _U(tw * TILE2)
                    t = _U(t0 + tw)
                    s0, s1, s2, s3 = _bt4(
                        rowbuf[ur, j], rowbuf[ur, j + _U(1)], rowbuf[ur, j + _U(2)], rowbuf[ur, j + _U(3)]
                    )
                    d[ur, _U(0), t] = s0
                    d[ur, _U(1), t] = s1
                    d[ur, _U(2), t] = s2
                    d[ur, _U(3), t] = s3
        col0 = rb * tw_n
        for q in range(ALPHA2):
            uq = _U(q)
            for t in range(nr * tw_n):
                ut = _U(t)
                p = _U(col0 + t)
                u0, u1, u2, u3 = _bt4(d[_U(0), uq, ut], d[_U(1), uq, ut], d[_U(2), uq, ut], d[_U(3), uq, ut])
                v[uq, uc, p] = u0
                v[uq + _U(ALPHA2), uc, p] = u1
                v[uq + _U(2 * ALPHA2), uc, p] = u2
                v[uq + _U(3 * ALPHA2), uc, p] = u3
                chk[p] += u0 + u3  # rows 0, 2 and 1, 3


@nb.njit(nogil=True, cache=True, inline="always")
def _checksum(chk):
    s = 0.0
    for i in range(chk.shape[0]):
        s += chk[i]
    return s


@nb.njit(nogil=True, cache=True, inline="always")
def _input_range(x, v, c0, c1, row0, n_rows, th_n, tw_n, ph, pw, tile):
    # returns the finiteness check of the channels' tiles: per tile, the sum of the first and last
    # point of every column of V. Each of those depends on every input row of its column with a
    # nonzero factor (B^T's first and last rows), and B^T is invertible, so an Inf or NaN in the
    # tile's input makes the sum Inf or NaN, and no later addition makes it finite again (a
    # finite overflow may flag a tile too: it is recomputed, never missed). A vector add per 3
    # (F(2x2): 2) values of V: the tiles' sums are contiguous, the column pass stays vectorized.
    bl = max(1, BLOCK_TILES // tw_n)
    alpha = tile + 2
    rowbuf = np.empty((alpha, tw_n * tile + 2), x.dtype)
    d = np.empty((alpha, alpha, min(bl, n_rows) * tw_n), x.dtype)
    chk = np.zeros(n_rows * tw_n, x.dtype)
    for c in range(c0, c1):
        if tile == TILE:
            _input_channel(x, v, c, row0, n_rows, th_n, tw_n, ph, pw, bl, rowbuf, d, chk)
        else:
            _input_channel2(x, v, c, row0, n_rows, th_n, tw_n, ph, pw, bl, rowbuf, d, chk)
    return _checksum(chk)


@nb.njit(parallel=True, nogil=True, cache=True)
def input_transform_parallel(x, v, row0, n_rows, th_n, tw_n, ph, pw, tile=TILE):
    """x (N, C, H, W), tile rows [row0, row0 + n_rows) of all images stacked (image-major)
    -> v ((tile + 2)**2, C, n_rows * tw_n). Returns a check value: not finite when an input
    tile holds an Inf or NaN (see ``_input_range``)."""
    c_n = x.shape[1]
    n_blk = min(c_n, BLOCKS)
    total = 0.0
    for blk in nb.prange(n_blk):
        total += _input_range(
            x, v, blk * c_n // n_blk, (blk + 1) * c_n // n_blk, row0, n_rows, th_n, tw_n, ph, pw, tile
        )
    return total


@nb.njit(nogil=True, cache=True)
def input_transform_serial(x, v, row0, n_rows, th_n, tw_n, ph, pw, tile=TILE):
    return _input_range(x, v, 0, x.shape[1], row0, n_rows, th_n, tw_n, ph, pw, tile)


# -- F(4x4) input transform for wide images: one task per (channel, tile row) ------------------------------
# B^T down the columns of the tile row's 6 input rows (contiguous, vectorizes), then B^T along
# each tile's 6 columns of the result. Faster than the per-channel block form above for one
# image from ``ROWS_MIN_TW`` tiles per row up (measured, one thread, per image: 64 ch 56x56
# 0.24 vs 0.37 ms, 64 ch 112x112 0.85 vs 1.32, 16 ch 224x224 0.57 vs 1.25); slower below (256 ch
# 14x14: 0.41 vs 0.17 ms: per-row work too short) and for batches (64 ch 56x56 at batch 2 / 8:
# 0.38 / 0.55 vs 0.33 / 0.37 ms per image; not understood: chunks then straddle images).
ROWS_MIN_TW = 8


@nb.njit(nogil=True, cache=True, inline="always")
def _input_task(x, v, t, row0, n_rows, th_n, tw_n, ph, pw, rowbuf, s, chk):
    # one (channel, global tile row): 6 padded input rows -> tw_n tiles of 36 points.
    # The column transform runs along whole rows (contiguous, vectorizes); the row
    # transform then reads each tile's 6 columns of it. Indices are unsigned (np.uintp):
    # numba then skips negative-index wraparound and LLVM vectorizes the loops.
    c = t // n_rows
    rr = t - c * n_rows
    g = row0 + rr
    i = g // th_n
    th = g - i * th_n
    h_n, w_n = x.shape[2], x.shape[3]
    wp = tw_n * TILE + 2
    h0 = th * TILE - ph
    lo = min(max(pw, 0), wp)  # padded columns [lo, hi) hold input columns [lo - pw, hi - pw)
    hi = max(min(pw + w_n, wp), lo)
    ui = np.uintp(i)
    uc = np.uintp(c)
    for r in range(ALPHA):
        ur = np.uintp(r)
        hh = h0 + r
        if hh < 0 or hh >= h_n:
            for j in range(wp):
                rowbuf[ur, np.uintp(j)] = 0
            continue
        uh = np.uintp(hh)
        for j in range(lo):
            rowbuf[ur, np.uintp(j)] = 0
        for j in range(lo, hi):
            rowbuf[ur, np.uintp(j)] = x[ui, uc, uh, np.uintp(j - pw)]
        for j in range(hi, wp):
            rowbuf[ur, np.uintp(j)] = 0
    for j in range(wp):  # s = B^T (rows of the tile row), all columns at once
        uj = np.uintp(j)
        d0 = rowbuf[np.uintp(0), uj]
        d1 = rowbuf[np.uintp(1), uj]
        d2 = rowbuf[np.uintp(2), uj]
        d3 = rowbuf[np.uintp(3), uj]
        d4 = rowbuf[np.uintp(4), uj]
        d5 = rowbuf[np.uintp(5), uj]
        a = d4 - 4 * d2
        bb = d3 - 4 * d1
        cc = d4 - d2
        e = 2 * (d3 - d1)
        s[np.uintp(0), uj] = 4 * d0 - 5 * d2 + d4
        s[np.uintp(1), uj] = a + bb
        s[np.uintp(2), uj] = a - bb
        s[np.uintp(3), uj] = cc + e
        s[np.uintp(4), uj] = cc - e
        s[np.uintp(5), uj] = 4 * d1 - 5 * d3 + d5
    col0 = rr * tw_n
    for q in range(ALPHA):  # each tile's 6 columns: (B^T d) B
        uq = np.uintp(q)
        k0 = np.uintp(q * ALPHA)
        for tw in range(tw_n):
            j = np.uintp(tw * TILE)
            u0, u1, u2, u3, u4, u5 = _bt(
                s[uq, j],
                s[uq, j + np.uintp(1)],
                s[uq, j + np.uintp(2)],
                s[uq, j + np.uintp(3)],
                s[uq, j + np.uintp(4)],
                s[uq, j + np.uintp(5)],
            )
            p = np.uintp(col0 + tw)
            v[k0, uc, p] = u0
            v[k0 + np.uintp(1), uc, p] = u1
            v[k0 + np.uintp(2), uc, p] = u2
            v[k0 + np.uintp(3), uc, p] = u3
            v[k0 + np.uintp(4), uc, p] = u4
            v[k0 + np.uintp(5), uc, p] = u5
            chk[p] += u0 + u5  # as in _input_range: points 0 and 5 of the column cover its 6 rows


@nb.njit(parallel=True, nogil=True, cache=True)
def input_rows_parallel(x, v, row0, n_rows, th_n, tw_n, ph, pw, tile=TILE):
    """F(4x4) input transform, one task per (channel, tile row): x (N, C, H, W), tile rows
    [row0, row0 + n_rows) of all images stacked (image-major) -> v (36, C, n_rows * tw_n)."""
    tasks = x.shape[1] * n_rows
    n_blk = min(tasks, BLOCKS)
    total = 0.0
    for blk in nb.prange(n_blk):
        rowbuf = np.empty((ALPHA, tw_n * TILE + 2), x.dtype)
        s = np.empty((ALPHA, tw_n * TILE + 2), x.dtype)
        chk = np.zeros(n_rows * tw_n, x.dtype)
        for t in range(blk * tasks // n_blk, (blk + 1) * tasks // n_blk):
            _input_task(x, v, t, row0, n_rows, th_n, tw_n, ph, pw, rowbuf, s, chk)
        total += _checksum(chk)
    return total


@nb.njit(nogil=True, cache=True)
def input_rows_serial(x, v, row0, n_rows, th_n, tw_n, ph, pw, tile=TILE):
    rowbuf = np.empty((ALPHA, tw_n * TILE + 2), x.dtype)
    s = np.empty((ALPHA, tw_n * TILE + 2), x.dtype)
    chk = np.zeros(n_rows * tw_n, x.dtype)
    for t in range(x.shape[1] * n_rows):
        _input_task(x, v, t, row0, n_rows, th_n, tw_n, ph, pw, rowbuf, s, chk)
    return _checksum(chk)


# -- output transform: per output channel, a block of tile rows at a time -----------------------------------
# A^T runs down the point columns of all the block's tiles at once (contiguous in M, vectorized)
# into e (tile rows of outputs, alpha, tiles); then along each tile's rows, writing its output
# row segment (clipped at the image edge) with the bias added.
@nb.njit(nogil=True, cache=True, inline="always")
def _output_channel(mm, b, y, mc, row0, n_rows, th_n, tw_n, bl, e):
    um = _U(mc)
    bias = b[mc] if b.shape[0] > 0 else 0
    oh_n, ow_n = y.shape[2], y.shape[3]
    full = min(tw_n, ow_n // TILE)
    for rb in range(0, n_rows, bl):
        nr = min(bl, n_rows - rb)
        col0 = rb * tw_n
        for q in range(ALPHA):
            uq = _U(q)
            for t in range(nr * tw_n):
                p = _U(col0 + t)
                ut = _U(t)
                a0, a1, a2, a3 = _at(
                    mm[uq, um, p],
                    mm[uq + _U(ALPHA), um, p],
                    mm[uq + _U(2 * ALPHA), um, p],
                    mm[uq + _U(3 * ALPHA), um, p],
                    mm[uq + _U(4 * ALPHA), um, p],
                    mm[uq + _U(5 * ALPHA), um, p],
                )
                e[_U(0), uq, ut] = a0
                e[_U(1), uq, ut] = a1
                e[_U(2), uq, ut] = a2
                e[_U(3), uq, ut] = a3
        for rr in range(nr):
            g = row0 + rb + rr
            i = g // th_n
            th = g - i * th_n
            h0 = th * TILE
            ui = _U(i)
            t0 = rr * tw_n
            for r in range(min(TILE, oh_n - h0)):
                ur = _U(r)
                uh = _U(h0 + r)
                for tw in range(full):
                    t = _U(t0 + tw)
                    y0, y1, y2, y3 = _at(
                        e[ur, _U(0), t],
                        e[ur, _U(1), t],
                        e[ur, _U(2), t],
                        e[ur, _U(3), t],
                        e[ur, _U(4), t],
                        e[ur, _U(5), t],
                    )
                    j = _U(tw * TILE)
                    y[ui, um, uh, j] = y0 + bias
                    y[ui, um, uh, j + _U(1)] = y1 + bias
                    y[ui, um, uh, j + _U(2)] = y2 + bias
                    y[ui, um, uh, j + _U(3)] = y3 + bias
                if full < tw_n:  # the last tile is cut by the image edge
                    t = _U(t0 + full)
                    y0, y1, y2, y3 = _at(
                        e[ur, _U(0), t],
                        e[ur, _U(1), t],
                        e[ur, _U(2), t],
                        e[ur, _U(3), t],
                        e[ur, _U(4), t],
                        e[ur, _U(5), t],
                    )
                    j = full * TILE
                    cols = ow_n - j
                    y[ui, um, uh, _U(j)] = y0 + bias
                    if cols > 1:
                        y[ui, um, uh, _U(j + 1)] = y1 + bias
                    if cols > 2:
                        y[ui, um, uh, _U(j + 2)] = y2 + bias


@nb.njit(nogil=True, cache=True, inline="always")
def _output_channel2(mm, b, y, mc, row0, n_rows, th_n, tw_n, bl, e):
    um = _U(mc)
    bias = b[mc] if b.shape[0] > 0 else 0
    oh_n, ow_n = y.shape[2], y.shape[3]
    full = min(tw_n, ow_n // TILE2)
    for rb in range(0, n_rows, bl):
        nr = min(bl, n_rows - rb)
        col0 = rb * tw_n
        for q in range(ALPHA2):
            uq = _U(q)
            for t in range(nr * tw_n):
                p = _U(col0 + t)
                ut = _U(t)
                a0, a1 = _at4(
                    mm[uq, um, p],
                    mm[uq + _U(ALPHA2), um, p],
                    mm[uq + _U(2 * ALPHA2), um, p],
                    mm[uq + _U(3 * ALPHA2), um, p],
                )
                e[_U(0), uq, ut] = a0
                e[_U(1), uq, ut] = a1
        for rr in range(nr):
            g = row0 + rb + rr
            i = g // th_n
            th = g - i * th_n
            h0 = th * TILE2
            ui = _U(i)
            t0 = rr * tw_n
            for r in range(min(TILE2, oh_n - h0)):
                ur = _U(r)
                uh = _U(h0 + r)
                for tw in range(full):
                    t = _U(t0 + tw)
                    y0, y1 = _at4(e[ur, _U(0), t], e[ur, _U(1), t], e[ur, _U(2), t], e[ur, _U(3), t])
                    j = _U(tw * TILE2)
                    y[ui, um, uh, j] = y0 + bias
                    y[ui, um, uh, j + _U(1)] = y1 + bias
                if full < tw_n:  # the last tile is cut by the image edge: one column left
                    t = _U(t0 + full)
                    y0, y1 = _at4(e[ur, _U(0), t], e[ur, _U(1), t], e[ur, _U(2), t], e[ur, _U(3), t])
                    y[ui, um, uh, _U(full * TILE2)] = y0 + bias


@nb.njit(nogil=True, cache=True, inline="always")
def _output_range(mm, b, y, m0, m1, row0, n_rows, th_n, tw_n, tile):
    bl = max(1, BLOCK_TILES // tw_n)
    e = np.empty((tile, tile + 2, min(bl, n_rows) * tw_n), y.dtype)
    for mc in range(m0, m1):
        if tile == TILE:
            _output_channel(mm, b, y, mc, row0, n_rows, th_n, tw_n, bl, e)
        else:
            _output_channel2(mm, b, y, mc, row0, n_rows, th_n, tw_n, bl, e)


@nb.njit(parallel=True, nogil=True, cache=True)
def output_transform_parallel(mm, b, y, row0, n_rows, th_n, tw_n, tile=TILE):
    """mm ((tile + 2)**2, M, n_rows * tw_n) -> tile rows [row0, row0 + n_rows) of y (N, M, OH, OW),
    plus bias b (M,) or empty."""
    m_n = y.shape[1]
    n_blk = min(m_n, BLOCKS)
    for blk in nb.prange(n_blk):
        _output_range(mm, b, y, blk * m_n // n_blk, (blk + 1) * m_n // n_blk, row0, n_rows, th_n, tw_n, tile)


@nb.njit(nogil=True, cache=True)
def output_transform_serial(mm, b, y, row0, n_rows, th_n, tw_n, tile=TILE):
    _output_range(mm, b, y, 0, y.shape[1], row0, n_rows, th_n, tw_n, tile)


#: U = G g G^T for a flattened 3x3 g is one product with the Kronecker square of G:
#: U[x * 6 + y] = sum_ij G[x, i] G[y, j] g[i * 3 + j]
GG = np.kron(G, G)
GG2 = np.kron(G2, G2)
#: channel pairs per weight-transform block (float64 temporaries of ~4.5 MiB)
_WT_BLOCK = 1 << 14


def transform_weights(w: np.ndarray, dtype=None, out: np.ndarray | None = None, tile: int = TILE) -> np.ndarray:
    """U = G g G^T for every (output, input) channel pair: (M, C, 3, 3) -> (36, M, C) for
    F(4x4, 3x3) (``tile`` 4), (16, M, C) for F(2x2, 3x3) (``tile`` 2), contiguous. Computed in
    float64 and rounded once to ``dtype`` (default: w's dtype, float32 for 16-bit)."""
    dtype = np.dtype(dtype or (w.dtype if w.dtype in (np.float32, np.float64) else np.float32))
    w = np.asarray(w)
    if w.dtype not in (np.float32, np.float64):
        w = w.astype(np.float32)
    w = np.ascontiguousarray(w)
    gg = GG if tile == TILE else GG2
    points = gg.shape[0]
    if out is None:
        out = np.empty((points, w.shape[0], w.shape[1]), dtype)
    # (36 x 9) @ (9 x pairs) in float64 (BLAS), rounded once into U's dtype: a few ms for a
    # 512x512 layer on one core, where a per-pair numba loop took 60 ms
    pairs = w.shape[0] * w.shape[1]
    w9 = w.reshape(pairs, 9)
    u2 = out.reshape(points, pairs)
    for p0 in range(0, pairs, _WT_BLOCK):
        blk = w9[p0 : p0 + _WT_BLOCK].astype(np.float64)
        u2[:, p0 : p0 + blk.shape[0]] = gg @ blk.T
    return out


# -- plan -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WinogradPlan:
    """``u``: the pre-packed transformed weights (36, M, C) when the weight was known at
    prepare time, else None (transformed per call into the workspace). The (image, tile
    row) pairs of the batch run in chunks of ``rows`` tile rows, so the V (36, C, tiles)
    and M (36, M, tiles) buffers stay cache-sized whatever the batch and image size."""

    n: int
    c: int
    m: int
    in_sp: tuple
    out_sp: tuple
    ph: int
    pw: int
    th_n: int
    tw_n: int
    rows: int
    itemsize: int
    parallel: bool
    u: np.ndarray | None = None
    #: output tile side: 4 for F(4x4, 3x3) (36 points), 2 for F(2x2, 3x3) (16 points)
    tile: int = TILE
    #: oneDNN batched matmuls (brgemm) holding U in their own layout, by a chunk's tile count
    #: (see :func:`_onednn_gemms`); then ``u`` is None and nothing is transformed per call
    gemms: dict | None = None
    #: False when the weight known at prepare holds an Inf or NaN: every tile is then computed
    #: directly (its transform would turn Inf into Inf - Inf = NaN over whole tiles)
    finite_w: bool = True

    @property
    def points(self) -> int:
        return (self.tile + 2) ** 2

    @property
    def tiles(self) -> int:
        return self.n * self.th_n * self.tw_n

    def _sizes(self) -> tuple:
        p = self.rows * self.tw_n
        pts = self.points
        if self.gemms:  # V and M each twice: channel-major for the transforms, tile-major for the matmul
            return 2 * pts * self.c * p, 2 * pts * self.m * p, 0
        return pts * self.c * p, pts * self.m * p, (0 if self.u is not None else pts * self.m * self.c)

    @property
    def workspace_bytes(self) -> int:
        return sum(s * self.itemsize + ALIGN for s in self._sizes())

    def describe(self) -> str:
        packed = (
            "weights pre-packed at prepare for oneDNN's batched brgemm"
            if self.gemms
            else "weights pre-packed at prepare"
            if self.u is not None
            else "weights transformed per call"
        )
        t = self.tile
        return (
            f"Winograd F({t}x{t},3x3): {self.tiles} tiles of {t}x{t}, chunks of {self.rows * self.tw_n} tiles, "
            f"{self.points} GEMMs ({self.m}x{self.c}) @ ({self.c}x{self.rows * self.tw_n}) per chunk; {packed}"
        )

    def __eq__(self, other):  # the packed array makes the generated __eq__ ambiguous
        return self is other

    __hash__ = object.__hash__


def winograd_plan(
    x_shape, m: int, pb: tuple, out_sp: tuple, itemsize: int, weight=None, tile: int = TILE
) -> WinogradPlan:
    """Plan F(4x4, 3x3) (``tile`` 2: F(2x2, 3x3)) for x (N, C, H, W) and M output channels;
    ``weight`` (M, C, 3, 3), when known now, is transformed here once (pre-packed)."""
    if tile not in (TILE, TILE2):
        raise ValueError(f"Winograd output tile must be {TILE} or {TILE2}, got {tile}")
    n, c = int(x_shape[0]), int(x_shape[1])
    points = (tile + 2) ** 2
    th_n, tw_n = -(-int(out_sp[0]) // tile), -(-int(out_sp[1]) // tile)
    per_row = points * (c + m) * tw_n * itemsize
    budget = max(CHUNK_BYTES, min(CHUNK_U_FACTOR * points * m * c * itemsize, CHUNK_MAX_BYTES))
    rows = max(1, min(max(n * th_n, 1), budget // max(per_row, 1)))
    parallel = points * rows * tw_n * max(c, m) >= PARALLEL_MIN
    u = gemms = None
    finite_w = weight is None or all_finite(weight)
    if weight is not None:
        if itemsize == 4:
            gemms = _onednn_gemms(np.asarray(weight), tile, (n * th_n, rows), tw_n)
        if gemms is None:
            u = transform_weights(np.asarray(weight), np.float64 if itemsize == 8 else np.float32, tile=tile)
    return WinogradPlan(
        n,
        c,
        int(m),
        tuple(int(v) for v in x_shape[2:]),
        tuple(int(v) for v in out_sp),
        int(pb[0]),
        int(pb[1]),
        th_n,
        tw_n,
        rows,
        itemsize,
        parallel,
        u,
        tile,
        gemms,
        finite_w,
    )


def _onednn_gemms(weight: np.ndarray, tile: int, tile_rows: tuple, tw_n: int) -> dict | None:
    """The point GEMMs of a float32 Winograd plan as oneDNN batched matmuls (brgemm), U
    reordered once into their layout: one primitive per chunk size (``tile_rows`` = (all tile
    rows, rows per chunk)), keyed by the chunk's tile count; None where the strategy
    (:func:`opsnn.kernels.cpu.libraries.winograd_gemms`) leaves them to MKL: 2-3x faster than MKL a
    point per task there (docs/kernel-libraries.md)."""
    from . import libraries
    from . import onednn as D

    total, rows = tile_rows
    if libraries.winograd_gemms(rows * tw_n).library != "onednn":
        return None
    w = np.asarray(weight)
    points = (tile + 2) ** 2
    m, c = int(w.shape[0]), int(w.shape[1])
    source = (w, f"winograd F({tile}x{tile},3x3)", ((points, m, c), np.float32))
    return {
        k * tw_n: D.BatchMatMulPrimitive(
            k * tw_n, lambda: transform_weights(w, np.float32, tile=tile), transposed=True, source=source
        )
        for k in {min(rows, total), total % rows}
        if k
    }


# -- kernel -----------------------------------------------------------------------------------------
def _split_workspace(ws: np.ndarray, dtype, plan: WinogradPlan):
    """The workspace as flat (V, M, U) buffers, each starting on an aligned byte."""
    itemsize = np.dtype(dtype).itemsize
    off = 0
    out = []
    for size in plan._sizes():
        if size == 0:
            out.append(None)
            continue
        nbytes = size * itemsize + ALIGN
        out.append(workspace_view(ws[off : off + nbytes], dtype, (size,)))
        off += nbytes
    return out


def conv_winograd(x, w, b, y, plan: WinogradPlan, ws) -> None:
    """y = conv3x3(x, w) + b (stride 1) through F(4x4, 3x3) or F(2x2, 3x3) (``plan.tile``);
    float32/float64 arrays."""
    if plan.n == 0 or y.size == 0:
        return
    dt = x.dtype
    vflat, mflat, u = _split_workspace(ws, dt, plan)
    finite_w = plan.finite_w
    if plan.gemms:
        u = None  # inside the primitives
    elif plan.u is not None:
        u = plan.u if plan.u.dtype == dt else plan.u.astype(dt)
    else:
        u = transform_weights(w, dt, u.reshape(plan.points, plan.m, plan.c), tile=plan.tile)
        finite_w = all_finite(w)
    bias = b if b is not None else np.zeros(0, dt)
    _run_chunks(
        x.reshape((plan.n, plan.c) + plan.in_sp),
        y.reshape((plan.n, plan.m) + plan.out_sp),
        u,
        bias,
        plan,
        vflat,
        mflat,
        w.reshape(plan.m, plan.c, 3, 3),
        finite_w,
    )


def _run_chunks(xin, yout, u, bias, plan: WinogradPlan, vflat, mflat, w, finite_w: bool) -> None:
    """Transform, multiply and inverse-transform chunk by chunk; ``xin``/``yout`` may be strided
    views (the dilated form passes phase sub-images of the caller's arrays). Tiles whose input
    holds an Inf or NaN (the input transforms' check) are then computed again directly from
    ``w`` (M, C, 3, 3), all of them when the weight is not finite: the result is the direct
    convolution's, NaN and Inf where it has them."""
    if plan.tile == TILE and plan.tw_n >= ROWS_MIN_TW and plan.n == 1:
        fin = input_rows_parallel if plan.parallel else input_rows_serial
    else:
        fin = input_transform_parallel if plan.parallel else input_transform_serial
    fout = output_transform_parallel if plan.parallel else output_transform_serial
    total = plan.n * plan.th_n
    pts = plan.points
    half_v, half_m = vflat.size // 2, mflat.size // 2
    check = 0.0
    for row0 in range(0, total, plan.rows):
        k = min(plan.rows, total - row0)
        p = k * plan.tw_n
        v = vflat[: pts * plan.c * p].reshape(pts, plan.c, p)
        mm = mflat[: pts * plan.m * p].reshape(pts, plan.m, p)
        check += fin(xin, v, row0, k, plan.th_n, plan.tw_n, plan.ph, plan.pw, plan.tile)
        if plan.gemms:
            # (tiles x C) @ (C x M) per point, one oneDNN batched brgemm; tile-major copies in and out
            vt = vflat[half_v : half_v + pts * p * plan.c].reshape(pts, p, plan.c)
            yt = mflat[half_m : half_m + pts * p * plan.m].reshape(pts, p, plan.m)
            swap_last(v, vt, plan.parallel)
            plan.gemms[p](vt, yt)
            swap_last(yt, mm, plan.parallel)
        # 36 (16) GEMMs (M x C) @ (C x tiles): a task per point on MKL, else one MKL batch call / BLAS per GEMM
        elif not point_gemms(u, v, mm, plan.parallel):
            _mkl.matmul(u, v, mm)
        fout(mm, bias, yout, row0, k, plan.th_n, plan.tw_n, plan.tile)
    if not finite_w or not math.isfinite(check):
        redo_tiles(xin, w, bias, yout, plan.th_n, plan.tw_n, plan.tile, plan.ph, plan.pw, finite_w)


# -- Inf and NaN: tiles computed directly -------------------------------------------------------------------
@nb.njit(nogil=True, cache=True)
def _all_finite(a):
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            return False
    return True


def all_finite(a) -> bool:
    """True when the array ``a`` holds no Inf or NaN (one pass, stops at the first)."""
    a = np.asarray(a)
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float32)
    flat = np.ascontiguousarray(a).reshape(-1)
    if kernel_cache.cold(_all_finite, (flat,)):  # compiling in the background (opsnn.ops.tiering)
        return bool(np.isfinite(flat).all())
    return bool(_all_finite(flat))


@nb.njit(nogil=True, cache=True)
def nonfinite_tiles(x, th_n, tw_n, tile, ph, pw):
    """(image, tile row, tile column) of every tile whose input window ((tile + 2)**2 pixels,
    all channels, starting ``ph``/``pw`` before the image) holds an Inf or NaN."""
    n_img, c_n, h_n, w_n = x.shape
    bad = np.zeros((n_img, h_n, w_n), np.bool_)
    for i in range(n_img):
        for c in range(c_n):
            for hh in range(h_n):
                for ww in range(w_n):
                    if not np.isfinite(x[i, c, hh, ww]):
                        bad[i, hh, ww] = True
    out = np.empty((n_img * th_n * tw_n, 3), np.int64)
    k = 0
    for i in range(n_img):
        for th in range(th_n):
            for tw in range(tw_n):
                hit = False
                for hh in range(max(th * tile - ph, 0), min(th * tile - ph + tile + 2, h_n)):
                    for ww in range(max(tw * tile - pw, 0), min(tw * tile - pw + tile + 2, w_n)):
                        hit = hit or bad[i, hh, ww]
                if hit:
                    out[k, 0], out[k, 1], out[k, 2] = i, th, tw
                    k += 1
    return out[:k]


@nb.njit(parallel=True, nogil=True, cache=True)
def direct_tiles(x, w, b, y, tiles, tile, ph, pw):
    """y's output ``tiles`` ((image, tile row, tile column) rows) by the direct 3x3 sum in
    float64, plus the bias b (M,) or empty: IEEE semantics of a direct convolution."""
    c_n, h_n, w_n = x.shape[1], x.shape[2], x.shape[3]
    m_n, oh_n, ow_n = y.shape[1], y.shape[2], y.shape[3]
    for task in nb.prange(tiles.shape[0] * m_n):
        t = task // m_n
        mc = task - t * m_n
        i, th, tw = tiles[t, 0], tiles[t, 1], tiles[t, 2]
        bias = b[mc] if b.shape[0] > 0 else 0
        for oy in range(th * tile, min(th * tile + tile, oh_n)):
            for ox in range(tw * tile, min(tw * tile + tile, ow_n)):
                acc = 0.0
                for c in range(c_n):
                    for ky in range(3):
                        hh = oy + ky - ph
                        if hh < 0 or hh >= h_n:
                            continue
                        for kx in range(3):
                            ww = ox + kx - pw
                            if 0 <= ww < w_n:
                                acc += np.float64(x[i, c, hh, ww]) * np.float64(w[mc, c, ky, kx])
                y[i, mc, oy, ox] = acc + bias


def redo_tiles(x, w, bias, y, th_n: int, tw_n: int, tile: int, ph: int, pw: int, finite_w: bool) -> None:
    """Compute again, directly, the tiles of y (N, M, OH, OW) whose input holds an Inf or NaN
    (every tile when the weight ``w`` (M, C, 3, 3) does not hold only finite values, or when the
    transforms' check fired on a finite overflow)."""
    tiles = nonfinite_tiles(x, th_n, tw_n, tile, ph, pw) if finite_w else np.empty((0, 3), np.int64)
    if not len(tiles):
        grid = np.indices((x.shape[0], th_n, tw_n)).reshape(3, -1).T
        tiles = np.ascontiguousarray(grid, dtype=np.int64)
    direct_tiles(x, w, bias, y, tiles, tile, ph, pw)


@nb.njit(parallel=True, nogil=True, cache=True)
def _swap_last_parallel(src, dst):
    for p in nb.prange(src.shape[0]):
        dst[p] = src[p].T


@nb.njit(nogil=True, cache=True)
def _swap_last_serial(src, dst):
    for p in range(src.shape[0]):
        dst[p] = src[p].T


def swap_last(src: np.ndarray, dst: np.ndarray, parallel: bool) -> None:
    """``dst[p] = src[p].T`` for every transform point (contiguous (P, a, b) -> (P, b, a))."""
    (_swap_last_parallel if parallel else _swap_last_serial)(src, dst)


@nb.njit(parallel=True, nogil=True, cache=True)
def _point_gemms(u, v, mm, fns, nt):
    pts, m, c = u.shape
    n = v.shape[2]
    for th in nb.prange(nt):  # thread th multiplies points th, th + nt, ...
        prev = MN.set_threads_local(fns[1], 1)
        for p in range(th, pts, nt):
            MN.sgemm(
                fns[0],
                MN.NO_TRANS,
                MN.NO_TRANS,
                m,
                n,
                c,
                u[p].ctypes.data,
                c,
                v[p].ctypes.data,
                n,
                0.0,
                mm[p].ctypes.data,
                n,
            )
        MN.set_threads_local(fns[1], prev)


def point_gemms(u, v, mm, parallel: bool) -> bool:
    """``mm[p] = u[p] @ v[p]`` for every transform point as one parallel region, a point per
    task on single-threaded MKL (:mod:`.mkl_nb`); False (nothing done) without MKL or for
    other than C-contiguous float32. Faster than MKL's batch call, which splits each small
    product over the threads (docs/kernel-libraries.md)."""
    fns = MN.addresses()
    if (
        fns is None
        or u.dtype != np.float32
        or not (u.flags.c_contiguous and v.flags.c_contiguous and mm.flags.c_contiguous)
        or 0 in mm.shape
        or 0 in u.shape
    ):
        return False
    _point_gemms(u, v, mm, fns, nb.get_num_threads() if parallel else 1)
    return True


def flops(plan: WinogradPlan) -> int:
    """Multiply-adds actually executed (GEMM part), x2: for reporting effective vs direct GFLOP/s."""
    return 2 * plan.points * plan.m * plan.c * plan.tiles


def direct_flops(plan: WinogradPlan) -> int:
    return 2 * 9 * plan.m * plan.c * plan.n * math.prod(plan.out_sp)


# -- dilated 3x3 convolutions as dense ones on phase sub-images ------------------------------------------------
@dataclass(frozen=True, eq=False)
class DilatedWinogradPlan:
    """A stride-1 3x3 conv with dilation (dh, dw) is dh*dw independent *dense* 3x3 convs:
    output rows a, a + dh, a + 2dh, ... read only input rows of one residue mod dh (and the
    same for columns). Each output phase runs F(4x4, 3x3) on its input phase, read in place
    as a strided view, and writes its strided view of the output — the padding becomes a
    per-phase offset, negative where the phase starts inside the image. No copy, zero-inserted
    input or im2col buffer ever exists: the workspace is one phase's chunk buffers (bounded
    by ``CHUNK_BYTES``) and, for weights not known at prepare, U. ``phases``: (input row
    residue, input column residue, output row phase, output column phase, sub-plan)."""

    n: int
    c: int
    m: int
    d: tuple
    phases: tuple
    itemsize: int
    u: np.ndarray | None = None
    finite_w: bool = True

    @property
    def tiles(self) -> int:
        return sum(p[4].tiles for p in self.phases)

    def _sizes(self) -> tuple:
        sub = max((p[4].workspace_bytes for p in self.phases), default=0)
        u = 0 if self.u is not None else POINTS * self.m * self.c
        return u, sub

    @property
    def workspace_bytes(self) -> int:
        u, sub = self._sizes()
        return u * self.itemsize + ALIGN + sub

    def describe(self) -> str:
        packed = "weights pre-packed at prepare" if self.u is not None else "weights transformed per call"
        return (
            f"dilated Winograd F(4x4,3x3): dilation {self.d} split into {len(self.phases)} dense phase "
            f"convs, {self.tiles} tiles of 4x4 in all; {packed}"
        )


def dilated_plan(x_shape, m: int, pb: tuple, out_sp: tuple, d: tuple, itemsize: int, weight=None):
    n, c = int(x_shape[0]), int(x_shape[1])
    h, w = int(x_shape[2]), int(x_shape[3])
    phases = []
    for a in range(d[0]):
        oh_n = len(range(a, out_sp[0], d[0]))
        ra, qa = (a - pb[0]) % d[0], (a - pb[0]) // d[0]
        hs = len(range(ra, h, d[0]))
        for b in range(d[1]):
            ow_n = len(range(b, out_sp[1], d[1]))
            rb, qb = (b - pb[1]) % d[1], (b - pb[1]) // d[1]
            ws_ = len(range(rb, w, d[1]))
            if oh_n == 0 or ow_n == 0:
                continue
            sub = winograd_plan((n, c, hs, ws_), m, (-qa, -qb), (oh_n, ow_n), itemsize, None)
            # the sub-plans never own weights: the transformed U is shared by every phase
            phases.append((ra, rb, a, b, _no_weights(sub)))
    u = None
    finite_w = True
    if weight is not None:
        u = transform_weights(np.asarray(weight), np.float64 if itemsize == 8 else np.float32)
        finite_w = all_finite(weight)
    return DilatedWinogradPlan(n, c, int(m), tuple(d), tuple(phases), itemsize, u, finite_w)


class _SharedU(WinogradPlan):
    """A phase's plan: its workspace holds no U (the dilated plan passes the shared one)."""

    def _sizes(self) -> tuple:
        sv, sm, _ = super()._sizes()
        return sv, sm, 0


def _no_weights(p: WinogradPlan) -> WinogradPlan:
    return _SharedU(*[getattr(p, f) for f in WinogradPlan.__dataclass_fields__])


def conv_winograd_dilated(x, w, b, y, plan: DilatedWinogradPlan, ws) -> None:
    """y = conv3x3_dilated(x, w) + b (stride 1) through F(4x4, 3x3) on phase sub-images."""
    if plan.n == 0 or y.size == 0:
        return
    dt = x.dtype
    u_sz, _ = plan._sizes()
    off = u_sz * np.dtype(dt).itemsize + ALIGN
    if plan.u is not None:
        u = plan.u if plan.u.dtype == dt else plan.u.astype(dt)
    else:
        u = transform_weights(w, dt, workspace_view(ws[:off], dt, (POINTS, plan.m, plan.c)))
    bias = b if b is not None else np.zeros(0, dt)
    dh, dw = plan.d
    finite_w = plan.finite_w if plan.u is not None else all_finite(w)
    w4 = w.reshape(plan.m, plan.c, 3, 3)
    for ra, rb, a, bb, sub in plan.phases:
        vflat, mflat, _ = _split_workspace(ws[off:], dt, sub)
        _run_chunks(x[:, :, ra::dh, rb::dw], y[:, :, a::dh, bb::dw], u, bias, sub, vflat, mflat, w4, finite_w)
