"""CPU convolution kernels: im2col + BLAS GEMM for Conv, GEMM + col2im for ConvTranspose.

Forward algorithms, chosen at prepare time:

* ``gemm1x1``: 1x1 kernel, stride 1, no padding — the input already is the column
  matrix, so one (M/g, C/g) x (C/g, H*W) GEMM per image and group; no workspace.
* ``im2col2d``: 2-D (and 1-D, as H=1) — a numba kernel, parallel over column rows
  (input channel, kernel offset), unrolls a band of output rows of each image into the
  executor's workspace, then BLAS multiplies every group's weight slice by its slice of
  that buffer, writing that band of the output; the band is as many rows as fit in
  :data:`BAND_BYTES` (every ResNet-50 layer is one band, but for the stem's cache-sized
  bands, see :data:`CACHE_BAND_BYTES`), so the workspace is bounded whatever the image
  size. Its loops index with ``np.uintp`` (no negative-index
  wraparound, so LLVM vectorizes the row copies) and do their divisions once per column
  row: 3-5x faster than per-(row, output row) tasks.
* ``im2col_tasks``: 2-D, group 1, float32 on MKL, for small weights (few input channels: a
  stem) — one parallel region; a task per band of output rows builds that band's columns in
  its thread's own buffer and multiplies them on single-threaded MKL while they are in that
  core's cache (:func:`im2col_gemm_tasks`), bands dealt to the threads in turn. The banded
  ``im2col2d`` runs two regions a band (a parallel im2col, MKL's GEMM split over the threads).
* ``im2col_nd``: any rank (3-D) — numpy-vectorized im2col: one strided block copy per
  kernel offset, with the slices precomputed in the plan; banded along the first spatial dim.
* ``depthwise2d``: group == C (one input channel per group), 1-D/2-D — a direct numba
  loop; per-group GEMMs would be 1 x k*k x H*W and all overhead. No workspace.
* ``direct2d``: any 2-D conv (large kernels, strides, dilations, groups) without a column
  buffer: numba, parallel over (image, group, block of 4 output channels, output row),
  accumulating one output row per channel in cache. Strided input is first split into
  ``stride`` column phases (a band of input rows at a time) so every tap reads a
  contiguous run and vectorizes; dilation is a plain offset, so no zero-inserted input
  ever exists. Slower than im2col + BLAS on wide layers (see bench/kernels.py: numba
  cannot register-block like BLAS), it is chosen when even one row of im2col's columns
  would be too large, and for large images with few output channels (im2col's banded
  thin GEMMs are no faster, see ``ops/defs/conv.py``).

Winograd F(4x4, 3x3) lives in ``winograd.py``.

A convolution's weight gradient (opsnn::ConvBackwardWeight without oneDNN) reuses the forward's
columns: ``dW_g += dY_g @ cols_g^T`` a band of output rows at a time (:func:`conv_backward_weight`);
its data gradient is ConvTranspose's kernel.

ConvTranspose is the adjoint: ``col = W^T @ x`` for a band of input rows into the
workspace, then col2im adds the columns back into the output rows the band reaches (numba
gather over output rows for 2-D, so threads never write the same row; per-offset strided
adds for N-d). Kernels compute in float32 or
float64; 16-bit inputs reach them through the executor's fp32 adapter.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numba as nb
import numpy as np

from ...runtime.memory import check_request
from . import mkl as _mkl
from . import mkl_nb as MN
from .fused import epilogue
from .gemm import bf16_epilogue

#: below this many column elements the serial im2col/col2im variant runs
PARALLEL_MIN = 1 << 15
#: workspace views start on a cache-line boundary (user buffers may not be aligned)
ALIGN = 64
#: column buffers (im2col) and phase-split copies (direct, stride > 1) are built for a band of
#: output rows at a time, as many rows as fit in this many bytes (at least one): the workspace
#: stays bounded whatever the image size (a 4096x4096 image needs no more than a ResNet-50
#: layer), and BLAS still gets a wide GEMM per band. Every ResNet-50 layer's columns fit whole
#: (the largest, the stem's and stage 1's 3x3, are 7.4 MB), so those run as one band (the
#: stem then in smaller bands, for the cache: CACHE_BAND_BYTES).
BAND_BYTES = 8 << 20
#: im2col2d with few column rows, but more than output channels (per group: M/g < (C/g)*kh*kw <=
#: CACHE_BAND_MAX_ROWS, e.g. a stem conv on 3 input channels), builds and multiplies its columns
#: in bands of about CACHE_BAND_BYTES, still in cache when the GEMM reads them, instead of one
#: buffer written to memory and read back; a band keeps at least CACHE_BAND_MIN_COLS columns (a
#: wide GEMM), and column buffers under CACHE_BAND_MIN_WHOLE run whole. ResNet-50's stem (147
#: column rows, 64 channels, 7.4 MB of columns; bands of 7 of 112 output rows), one thread:
#: 10.3 -> 9.3 ms; two threads on the shared 2-core VM: within the noise (8.2 vs 8.0 ms median).
#: Not for wide inputs: 64 -> 64 channels 3x3 at 56x56 (576 rows) ran 7.2 -> 8.8 ms with two
#: threads; nor where the output outweighs the columns (3 -> 64 channels 3x3: 4.9 -> 5.4 ms).
CACHE_BAND_BYTES = 1 << 19
#: ``im2col_tasks``: a task's columns (one thread's buffer) take about this many bytes, so that
#: they and the band of output stay in that core's L2; a task keeps at least TASK_MIN_COLS
#: output positions (a wide GEMM). ResNet-50's stem (147 column rows x 112 per output row),
#: 2-core AVX-512 VM, rows per task 2 / 4 / 7 / 14 / 28: 2.03 / 1.80 / 1.64 / 1.88 / 1.75 ms
#: (the banded im2col2d on MKL's packed weight: 2.44); a VGG-style 3 -> 64 3x3 at 224x224: 14
#: rows (340 KB) 1.16 ms, 28 rows 2.09, banded im2col2d 2.49.
TASK_BAND_BYTES = 1 << 19
TASK_MIN_COLS = 256
CACHE_BAND_MIN_COLS = 512
CACHE_BAND_MIN_WHOLE = 4 << 20
CACHE_BAND_MAX_ROWS = 256


# -- numba kernels ------------------------------------------------------------------------------
@nb.njit(nogil=True, cache=True, inline="always")
def _valid_range(n_iter, n_target, s, off):
    """Indices t in [0, n_iter) with t * s + off in [0, n_target), as [lo, hi)."""
    lo = 0 if off >= 0 else (-off + s - 1) // s
    last = n_target - 1 - off
    hi = 0 if last < 0 else last // s + 1
    if hi > n_iter:
        hi = n_iter
    if lo > n_iter:
        lo = n_iter
    if hi < lo:
        hi = lo
    return lo, hi


@nb.njit(nogil=True, cache=True, inline="always")
def _im2col_row(x, col, r, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n):
    # column row r = (c, ki, kj): the windows of output rows [oh0, oh0 + oh_n) (a band)
    # read at that kernel offset. The index arithmetic (divisions) runs once per column
    # row, not per output row, and the copies are loops over 1-D views from 0, which
    # numba/LLVM vectorizes.
    kk = kh * kw
    c = r // kk
    k = r - c * kk
    ki = k // kw
    kj = k - ki * kw
    h_n = x.shape[1]
    off = kj * dw - pw
    lo, hi = _valid_range(ow_n, x.shape[2], sw, off)
    # unsigned indices: numba then skips negative-index wraparound, so LLVM vectorizes
    ur = np.uintp(r)
    uc = np.uintp(c)
    for t in range(oh_n):
        ih = (oh0 + t) * sh - ph + ki * dh
        base = t * ow_n
        if ih < 0 or ih >= h_n:
            for ow in range(ow_n):
                col[ur, np.uintp(base + ow)] = 0
            continue
        uih = np.uintp(ih)
        for ow in range(lo):
            col[ur, np.uintp(base + ow)] = 0
        if sw == 1:  # unit stride: a contiguous copy
            for ow in range(lo, hi):
                col[ur, np.uintp(base + ow)] = x[uc, uih, np.uintp(ow + off)]
        elif sw == 2:  # a literal stride: LLVM loads two vectors and shuffles, no gather
            for ow in range(lo, hi):
                col[ur, np.uintp(base + ow)] = x[uc, uih, np.uintp(ow * 2 + off)]
        else:
            for ow in range(lo, hi):
                col[ur, np.uintp(base + ow)] = x[uc, uih, np.uintp(ow * sw + off)]
        for ow in range(hi, ow_n):
            col[ur, np.uintp(base + ow)] = 0


@nb.njit(parallel=True, nogil=True, cache=True)
def im2col2d_parallel(x, col, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n):
    """x (C, H, W) -> col (C*kh*kw, oh_n*OW): the columns of output rows [oh0, oh0 + oh_n);
    zero where the window reads padding."""
    for r in nb.prange(col.shape[0]):
        _im2col_row(x, col, r, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n)


@nb.njit(nogil=True, cache=True)
def im2col2d_serial(x, col, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n):
    for r in range(col.shape[0]):
        _im2col_row(x, col, r, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n)


@nb.njit(nogil=True, cache=True)
def _im2col_gemm_task(x, w, y, col, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n, fns):
    # the columns of output rows [oh0, oh0 + oh_n) into this thread's buffer, then
    # y[:, band] = w @ col on single-threaded MKL (y: (M, OH*OW) rows of one image)
    for r in range(col.shape[0]):
        _im2col_row(x, col, r, kh, kw, sh, sw, ph, pw, dh, dw, oh0, oh_n, ow_n)
    m, kdim = w.shape
    MN.sgemm(
        fns[0],
        MN.NO_TRANS,
        MN.NO_TRANS,
        m,
        oh_n * ow_n,
        kdim,
        w.ctypes.data,
        kdim,
        col.ctypes.data,
        col.shape[1],
        0.0,
        y[:, oh0 * ow_n :].ctypes.data,
        y.shape[1],
    )


@nb.njit(parallel=True, nogil=True, cache=True)
def im2col_gemm_tasks(x, w, y, cols, kh, kw, sh, sw, ph, pw, dh, dw, oh_n, ow_n, band, fns):
    """y (M, OH*OW) = w (M, C*kh*kw) @ im2col(x (C, H, W)), a task per ``band`` output rows:
    thread ``th`` of ``len(cols)`` builds its bands' columns in ``cols[th]`` (C*kh*kw, >=
    band*OW) and multiplies them on single-threaded MKL (``fns``: :func:`.mkl_nb.addresses`)."""
    nt = cols.shape[0]
    n_bands = (oh_n + band - 1) // band
    for th in nb.prange(nt):
        prev = MN.set_threads_local(fns[1], 1)
        for t in range(th, n_bands, nt):
            oh0 = t * band
            _im2col_gemm_task(x, w, y, cols[th], kh, kw, sh, sw, ph, pw, dh, dw, oh0, min(band, oh_n - oh0), ow_n, fns)
        MN.set_threads_local(fns[1], prev)


@nb.njit(nogil=True, cache=True, inline="always")
def _col2im_row(col, y, t, kh, kw, sh, sw, ph, pw, dh, dw, ih0, ih_n, iw_n, oh0, oh_rows):
    # gather every column entry of input rows [ih0, ih0 + ih_n) (a band) that lands on output
    # row (m, oh0 + t % oh_rows); y is pre-initialised
    m = t // oh_rows
    oh = oh0 + t - m * oh_rows
    for ki in range(kh):
        a = oh + ph - ki * dh
        if a < 0 or a % sh != 0:
            continue
        ih = a // sh - ih0
        if ih < 0 or ih >= ih_n:
            continue
        for kj in range(kw):
            r = (m * kh + ki) * kw + kj
            off = kj * dw - pw
            lo, hi = _valid_range(iw_n, y.shape[2], sw, off)
            base = ih * iw_n
            ym, cr = y[m, oh], col[r]
            for iw in range(lo, hi):
                ym[np.uintp(iw * sw + off)] += cr[np.uintp(base + iw)]


@nb.njit(parallel=True, nogil=True, cache=True)
def col2im2d_parallel(col, y, kh, kw, sh, sw, ph, pw, dh, dw, ih0, ih_n, iw_n, oh0, oh_rows):
    """col (M*kh*kw, ih_n*IW), the columns of input rows [ih0, ih0 + ih_n), added into output rows
    [oh0, oh0 + oh_rows) of y (M, OH, OW): y[m, ih*sh-ph+ki*dh, iw*sw-pw+kj*dw]."""
    for t in nb.prange(y.shape[0] * oh_rows):
        _col2im_row(col, y, t, kh, kw, sh, sw, ph, pw, dh, dw, ih0, ih_n, iw_n, oh0, oh_rows)


@nb.njit(nogil=True, cache=True)
def col2im2d_serial(col, y, kh, kw, sh, sw, ph, pw, dh, dw, ih0, ih_n, iw_n, oh0, oh_rows):
    for t in range(y.shape[0] * oh_rows):
        _col2im_row(col, y, t, kh, kw, sh, sw, ph, pw, dh, dw, ih0, ih_n, iw_n, oh0, oh_rows)


@nb.njit(nogil=True, cache=True, inline="always")
def _depthwise_row(x, w, b, y, t, mult, sh, sw, ph, pw, dh, dw):
    # output row (n, m, oh) of a depthwise conv: channel m reads input channel m // mult
    m_n, oh_n, ow_n = y.shape[1], y.shape[2], y.shape[3]
    n = t // (m_n * oh_n)
    rem = t - n * m_n * oh_n
    m = rem // oh_n
    oh = rem - m * oh_n
    c = m // mult
    row = y[n, m, oh]
    bias = b[m] if b.shape[0] > 0 else 0
    for ow in range(ow_n):
        row[ow] = bias
    kh, kw = w.shape[1], w.shape[2]
    for ki in range(kh):
        ih = oh * sh - ph + ki * dh
        if ih < 0 or ih >= x.shape[2]:
            continue
        src = x[n, c, ih]
        for kj in range(kw):
            wv = w[m, ki, kj]
            off = kj * dw - pw
            lo, hi = _valid_range(ow_n, x.shape[3], sw, off)
            if sw == 1:  # unsigned indices skip numba's negative-index wraparound: LLVM vectorizes
                for ow in range(lo, hi):
                    row[np.uintp(ow)] += wv * src[np.uintp(ow + off)]
            else:
                for ow in range(lo, hi):
                    row[np.uintp(ow)] += wv * src[np.uintp(ow * sw + off)]


@nb.njit(parallel=True, nogil=True, cache=True)
def depthwise2d_parallel(x, w, b, y, mult, sh, sw, ph, pw, dh, dw):
    """Direct depthwise conv: x (N, C, H, W), w (M, kh, kw), b (M,) or empty, y (N, M, OH, OW)."""
    for t in nb.prange(y.shape[0] * y.shape[1] * y.shape[2]):
        _depthwise_row(x, w, b, y, t, mult, sh, sw, ph, pw, dh, dw)


@nb.njit(nogil=True, cache=True)
def depthwise2d_serial(x, w, b, y, mult, sh, sw, ph, pw, dh, dw):
    for t in range(y.shape[0] * y.shape[1] * y.shape[2]):
        _depthwise_row(x, w, b, y, t, mult, sh, sw, ph, pw, dh, dw)


DIRECT_MB = 4  # output channels accumulated together (each input load feeds 4 FMAs)


@nb.njit(nogil=True, cache=True, inline="always")
def _direct_task(xs, w, b, y, t, g_n, nmb, sh, sw, ph, pw, dh, dw, h_n, w_n, acc):
    # one (group, block of DIRECT_MB output channels, output row) of one image.
    # xs (C, H, S, Wq) is the image split into S = stride column phases:
    # x[c, h, q * sw + p] == xs[c, h, p, q], so each tap reads a contiguous run.
    m_n, oh_n, ow_n = y.shape
    mg = m_n // g_n
    cg, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    per_g = nmb * oh_n
    gi = t // per_g
    rem = t - gi * per_g
    mb = rem // oh_n
    oh = rem - mb * oh_n
    m0 = gi * mg + mb * DIRECT_MB
    mc = min(DIRECT_MB, (gi + 1) * mg - m0)
    for j in range(DIRECT_MB):
        aj = acc[j]
        for i in range(ow_n):
            aj[i] = 0
    for ci in range(cg):
        c = gi * cg + ci
        for ki in range(kh):
            ih = oh * sh - ph + ki * dh
            if ih < 0 or ih >= h_n:
                continue
            for kj in range(kw):
                off = kj * dw - pw
                lo, hi = _valid_range(ow_n, w_n, sw, off)
                if hi <= lo:
                    continue
                p = off % sw
                qo = (off - p) // sw
                # unsigned indices: no negative-index wraparound, so LLVM vectorizes
                uc, uih, up = np.uintp(c), np.uintp(ih), np.uintp(p)
                if mc == DIRECT_MB:
                    w0 = w[m0, ci, ki, kj]
                    w1 = w[m0 + 1, ci, ki, kj]
                    w2 = w[m0 + 2, ci, ki, kj]
                    w3 = w[m0 + 3, ci, ki, kj]
                    for i in range(lo, hi):
                        xv = xs[uc, uih, up, np.uintp(i + qo)]
                        ui = np.uintp(i)
                        acc[np.uintp(0), ui] += w0 * xv
                        acc[np.uintp(1), ui] += w1 * xv
                        acc[np.uintp(2), ui] += w2 * xv
                        acc[np.uintp(3), ui] += w3 * xv
                else:
                    for j in range(mc):
                        wv = w[m0 + j, ci, ki, kj]
                        uj = np.uintp(j)
                        for i in range(lo, hi):
                            acc[uj, np.uintp(i)] += wv * xs[uc, uih, up, np.uintp(i + qo)]
    for j in range(mc):
        dst = y[m0 + j, oh]
        aj = acc[j]
        bias = b[m0 + j] if b.shape[0] > 0 else 0
        for i in range(ow_n):
            dst[i] = aj[i] + bias


@nb.njit(parallel=True, nogil=True, cache=True)
def direct2d_parallel(xs, w, b, y, g_n, sh, sw, ph, pw, dh, dw, h_n, w_n):
    """y (M, OH, OW) = conv(x, w) + b for one image given as phase-split xs (C, H, S, Wq)."""
    nmb = -(-(y.shape[0] // g_n) // DIRECT_MB)
    for t in nb.prange(g_n * nmb * y.shape[1]):
        acc = np.empty((DIRECT_MB, y.shape[2]), y.dtype)
        _direct_task(xs, w, b, y, t, g_n, nmb, sh, sw, ph, pw, dh, dw, h_n, w_n, acc)


@nb.njit(nogil=True, cache=True)
def direct2d_serial(xs, w, b, y, g_n, sh, sw, ph, pw, dh, dw, h_n, w_n):
    nmb = -(-(y.shape[0] // g_n) // DIRECT_MB)
    acc = np.empty((DIRECT_MB, y.shape[2]), y.dtype)
    for t in range(g_n * nmb * y.shape[1]):
        _direct_task(xs, w, b, y, t, g_n, nmb, sh, sw, ph, pw, dh, dw, h_n, w_n, acc)


def phase_split(x: np.ndarray, out: np.ndarray, s: int) -> None:
    """out[c, h, p, q] = x[c, h, q * s + p] (columns past the row's end are never read)."""
    w = x.shape[-1]
    for p in range(s):
        cnt = len(range(p, w, s))
        out[:, :, p, :cnt] = x[:, :, p::s]


# -- plans --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvPlan:
    """Everything a conv kernel needs, fixed at prepare time (spatial tuples are per dim).

    ``kind``: ``gemm1x1`` | ``depthwise2d`` | ``direct2d`` | ``im2col2d`` | ``im2col_nd`` (forward) or ``col2im2d`` |
    ``col2im_nd`` (transposed). For the 2-D kinds a 1-D problem is stored as H=1.
    ``c``/``m``: input/output channels; ``col_shape``: the workspace's column buffer for
    one band (for ``direct2d``: a band's phase-split input rows, empty at column stride 1).
    ``band``: output rows (``im2col_nd``: positions along the first spatial dim) per band;
    the buffer is refilled band by band, so its size is bounded by :data:`BAND_BYTES`.
    """

    kind: str
    n: int
    c: int
    m: int
    g: int
    in_sp: tuple
    out_sp: tuple
    k: tuple
    s: tuple
    d: tuple
    pb: tuple
    parallel: bool
    col_shape: tuple
    itemsize: int
    slices: tuple = ()
    zero_fill: bool = True  # im2col_nd: some kernel offset reads padding, so clear the buffer
    band: int = 0

    @property
    def workspace_bytes(self) -> int:
        if self.kind in ("gemm1x1", "depthwise2d") or math.prod(self.col_shape) == 0:
            return 0
        return math.prod(self.col_shape) * self.itemsize + ALIGN

    def describe(self) -> str:
        bands = f" in bands of {self.band} of {self.out_sp[0]} output rows" if 0 < self.band < self.out_sp[0] else ""
        what = {
            "gemm1x1": "one GEMM per image and group, no workspace",
            "depthwise2d": "direct depthwise loop, no workspace",
            "direct2d": "direct loop, no column buffer"
            + (f" (input split into {self.s[-1]} column phases{bands})" if math.prod(self.col_shape) else ""),
            "im2col2d": f"column buffer {self.col_shape[1]}x{self.col_shape[2]} per group{bands}, then BLAS",
            "im2col_tasks": f"a task per {self.band} of {self.out_sp[0]} output rows: its columns "
            f"({self.col_shape[1]}x{self.col_shape[2]}) in its thread's buffer ({self.col_shape[0]} "
            "buffers), then single-threaded MKL, one parallel region",
            "im2col_nd": f"column buffer {self.col_shape[1]}x{self.col_shape[2]} per group{bands}, then BLAS",
        }
        return f"{self.kind}: {what.get(self.kind, '')}"


def _offset_slices(n_iter: int, n_target: int, s: int, off: int):
    """(iter slice, target slice) of t in [0, n_iter) with t*s + off in [0, n_target), or None."""
    lo = 0 if off >= 0 else -(off // s)
    last = n_target - 1 - off
    hi = min(n_iter, last // s + 1) if last >= 0 else 0
    if hi <= lo:
        return None
    return slice(lo, hi), slice(lo * s + off, (hi - 1) * s + off + 1, s)


def _nd_slices(iter_sp, target_sp, k, s, d, pb):
    """Per kernel offset j: the (iter slices, target slices) of its non-empty region."""
    out = []
    for j, kidx in enumerate(itertools.product(*(range(kk) for kk in k))):
        per_dim = [_offset_slices(iter_sp[i], target_sp[i], s[i], kidx[i] * d[i] - pb[i]) for i in range(len(k))]
        if any(p is None for p in per_dim):
            continue
        out.append((j, tuple(p[0] for p in per_dim), tuple(p[1] for p in per_dim)))
    return tuple(out)


def _needs_zero_fill(slices, kk: int, out_sp) -> bool:
    """True when some kernel offset's region misses part of the output (reads padding)."""
    return len(slices) != kk or any(
        sl.start != 0 or sl.stop != o for _, o_sl, _ in slices for sl, o in zip(o_sl, out_sp)
    )


def band_rows(row_bytes: int, n_rows: int, cap: int | None = None) -> int:
    """Rows per band: as many ``row_bytes`` rows as fit in ``cap`` (default :data:`BAND_BYTES`),
    at least one, at most ``n_rows``."""
    cap = BAND_BYTES if cap is None else cap
    return max(1, min(n_rows, cap // max(row_bytes, 1)))


def task_bands(row_bytes: int, n_rows: int, inner: int, threads: int) -> tuple[int, int]:
    """``im2col_tasks``: (output rows per task, thread buffers): about TASK_BAND_BYTES of
    columns a task and at least TASK_MIN_COLS positions, then bands of equal size in a count
    that the threads share evenly where the rows allow."""
    rows = max(band_rows(row_bytes, n_rows, TASK_BAND_BYTES), -(-TASK_MIN_COLS // max(inner, 1)))
    rows = max(1, min(rows, n_rows))
    tasks = -(-n_rows // rows)
    if tasks > 1 and tasks % threads:
        tasks = -(-tasks // threads) * threads
    rows = -(-n_rows // tasks)
    return rows, max(1, min(threads, -(-n_rows // rows)))


def conv_plan(x_shape, w_shape, g, k, s, d, pb, pe, out_sp, itemsize, kind: str | None = None) -> ConvPlan:
    """Plan a forward convolution; ``kind`` None picks the best algorithm for the shapes."""
    n, c = int(x_shape[0]), int(x_shape[1])
    m = int(w_shape[0])
    in_sp = tuple(int(v) for v in x_shape[2:])
    nd = len(in_sp)
    if kind is None:
        if nd <= 2 and g == c and int(w_shape[1]) == 1 and g > 1:
            kind = "depthwise2d"
        elif all(v == 1 for v in k) and all(v == 1 for v in s) and not any(pb) and not any(pe):
            kind = "gemm1x1"
        elif nd <= 2:
            kind = "im2col2d"
        else:
            kind = "im2col_nd"
    if kind in ("im2col2d", "im2col_tasks", "depthwise2d", "direct2d") and nd == 1:
        in_sp, out_sp, k, s, d, pb = (
            (1,) + in_sp,
            (1,) + tuple(out_sp),
            (1,) + tuple(k),
            (1,) + tuple(s),
            (1,) + tuple(d),
            (0,) + tuple(pb),
        )
    kk = math.prod(k)
    p = math.prod(out_sp)
    inner = math.prod(out_sp[1:])  # outputs per row (per position along the first spatial dim)
    band = int(out_sp[0])
    col_shape = (g, (c // g) * kk, p)
    work = (n * m if kind in ("depthwise2d", "direct2d") else c) * kk * p
    if kind in ("im2col2d", "im2col_nd"):
        band = band_rows(c * kk * inner * itemsize, int(out_sp[0]))
        whole = c * kk * inner * itemsize * int(out_sp[0])
        if kind == "im2col2d" and m // g < (c // g) * kk <= CACHE_BAND_MAX_ROWS and whole >= CACHE_BAND_MIN_WHOLE:
            cached = band_rows(c * kk * inner * itemsize, int(out_sp[0]), CACHE_BAND_BYTES)
            cached = max(cached, -(-CACHE_BAND_MIN_COLS // max(inner, 1)))
            cached = -(-int(out_sp[0]) // -(-int(out_sp[0]) // cached))  # bands of equal size
            band = min(band, cached)
        col_shape = (g, (c // g) * kk, band * inner)
        work = c * kk * band * inner  # per band: what one im2col call does
    elif kind == "im2col_tasks":
        band, parts = task_bands(c * kk * inner * itemsize, int(out_sp[0]), inner, nb.get_num_threads())
        col_shape = (parts, c * kk, band * inner)
        work = c * kk * band * inner
    elif kind == "direct2d":
        col_shape = (0,)
        if s[1] > 1:  # a band of output rows reads (band - 1) * stride + dilated kernel input rows
            wq = -(-in_sp[1] // s[1])
            eff = (k[0] - 1) * d[0] + 1
            rows_fit = band_rows(c * s[1] * wq * itemsize, 1 << 62)
            band = max(1, min(int(out_sp[0]), (rows_fit - eff) // s[0] + 1))
            col_shape = (c, min(in_sp[0], (band - 1) * s[0] + eff), s[1], wq)
    parallel = work >= PARALLEL_MIN
    slices = ()
    zero_fill = True
    if kind == "im2col_nd":
        slices = _nd_slices((band,) + tuple(out_sp[1:]), in_sp, k, s, d, pb)
        zero_fill = _needs_zero_fill(slices, kk, (band,) + tuple(out_sp[1:]))
    return ConvPlan(
        kind,
        n,
        c,
        m,
        g,
        tuple(in_sp),
        tuple(out_sp),
        tuple(k),
        tuple(s),
        tuple(d),
        tuple(pb),
        parallel,
        col_shape,
        itemsize,
        slices,
        zero_fill,
        band,
    )


def conv_transpose_plan(x_shape, w_shape, g, k, s, d, pb, out_sp, itemsize) -> ConvPlan:
    n, c = int(x_shape[0]), int(x_shape[1])
    m = int(w_shape[1]) * g
    in_sp = tuple(int(v) for v in x_shape[2:])
    nd = len(in_sp)
    kind = "col2im2d" if nd <= 2 else "col2im_nd"
    if nd == 1:
        in_sp, out_sp, k, s, d, pb = (
            (1,) + in_sp,
            (1,) + tuple(out_sp),
            (1,) + tuple(k),
            (1,) + tuple(s),
            (1,) + tuple(d),
            (0,) + tuple(pb),
        )
    kk = math.prod(k)
    inner = math.prod(in_sp[1:])
    # columns of a band of input rows (positions along the first spatial dim) at a time
    band = band_rows(m * kk * inner * itemsize, int(in_sp[0]))
    col_shape = (g, (m // g) * kk, band * inner)
    parallel = m * kk * band * inner >= PARALLEL_MIN
    slices = _nd_slices((band,) + tuple(in_sp[1:]), out_sp, k, s, d, pb) if kind == "col2im_nd" else ()
    return ConvPlan(
        kind,
        n,
        c,
        m,
        g,
        tuple(in_sp),
        tuple(out_sp),
        tuple(k),
        tuple(s),
        tuple(d),
        tuple(pb),
        parallel,
        col_shape,
        itemsize,
        slices,
        band=band,
    )


def workspace_view(ws: np.ndarray, dtype, shape: tuple) -> np.ndarray:
    """The column buffer: ``ws`` (uint8) viewed as ``dtype`` from its first aligned byte."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    shift = (-ws.ctypes.data) % ALIGN
    return ws[shift : shift + nbytes].view(dtype).reshape(shape)


# -- forward convolution ------------------------------------------------------------------------
def _add_bias(y: np.ndarray, b: np.ndarray | None, plan: ConvPlan) -> None:
    """y += b per output channel: one epilogue pass over the (image, channel) rows (numpy's
    broadcast add took 244 us for 256 x 56 x 56, the epilogue ~90)."""
    if b is not None:
        epilogue(y.reshape(plan.n * plan.m, -1), None, None, 0, 0.0, 0.0, row_bias=b)


#: conv kinds whose bias is a separate pass over the output (conv_forward's GEMM branches end in
#: _add_bias; the direct and depthwise loops fold it in)
BIAS_PASS_KINDS = ("gemm1x1", "im2col2d", "im2col_tasks", "im2col_nd")


def _gemm(wv, cols, out, packed) -> None:
    """out[g] = wv[g] @ cols[g] per group; with ``packed`` (group 1: the weight packed by MKL at
    prepare, :func:`opsnn.kernels.cpu.mkl.pack_left`) one packed-panel MKL call."""
    if packed is None:
        _mkl.matmul(wv, cols, out)
    else:
        _mkl.gemm_left(packed, cols[0], out[0])


def conv_forward(x, w, b, y, plan: ConvPlan, ws, packed=None) -> None:
    """y = conv(x, w) + b for contiguous float arrays, by ``plan.kind``; ``packed``: the GEMM
    kinds' weight packed by MKL (group 1, float32)."""
    n, g = plan.n, plan.g
    cg, mg = plan.c // g, plan.m // g
    p = math.prod(plan.out_sp)
    yv = y.reshape(n, g, mg, p)
    if n == 0 or yv.size == 0:
        return
    if cg == 0 or math.prod(plan.k) == 0:  # an empty sum: y is the bias (zero without one)
        y.fill(0)
        _add_bias(y, b, plan)
        return
    wv = w.reshape(g, mg, -1)
    if plan.kind == "depthwise2d":
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
        dw_fn = depthwise2d_parallel if plan.parallel else depthwise2d_serial
        bias = b if b is not None else np.zeros(0, y.dtype)
        dw_fn(
            x.reshape((n, plan.c) + plan.in_sp),
            w.reshape(plan.m, kh, kw),
            bias,
            y.reshape((n, plan.m) + plan.out_sp),
            mg,
            sh,
            sw,
            ph,
            pw,
            dh,
            dw,
        )
        return
    if plan.kind == "direct2d":
        (sh, sw), (dh, dw), (ph, pw) = plan.s, plan.d, plan.pb
        h_n, w_n = plan.in_sp
        xv = x.reshape((n, plan.c) + plan.in_sp)
        bias = b if b is not None else np.zeros(0, y.dtype)
        y4 = y.reshape((n, plan.m) + plan.out_sp)
        w4 = w.reshape((plan.m, cg) + plan.k)
        fn = direct2d_parallel if plan.parallel else direct2d_serial
        if sw == 1:  # reads the input in place
            for i in range(n):
                fn(xv[i].reshape(plan.c, h_n, 1, w_n), w4, bias, y4[i], g, sh, sw, ph, pw, dh, dw, h_n, w_n)
            return
        # stride > 1: phase-split the input rows of one band of output rows at a time; the
        # band's rows [r0, r1) become rows [0, r1 - r0) of a sub-image with the top padding
        # shifted so that output row oh0 + t reads what output row oh0 + t of the whole would
        c, _, sp, wq = plan.col_shape
        flat = workspace_view(ws, x.dtype, (math.prod(plan.col_shape),))
        oh_n = plan.out_sp[0]
        eff = (plan.k[0] - 1) * dh + 1
        for i in range(n):
            for oh0 in range(0, oh_n, plan.band):
                oh1 = min(oh_n, oh0 + plan.band)
                r0 = max(0, oh0 * sh - ph)
                r1 = max(r0, min(h_n, (oh1 - 1) * sh - ph + eff))
                xs = flat[: c * (r1 - r0) * sp * wq].reshape(c, r1 - r0, sp, wq)
                phase_split(xv[i][:, r0:r1], xs, sw)
                fn(xs, w4, bias, y4[i][:, oh0:oh1], g, sh, sw, ph - oh0 * sh + r0, pw, dh, dw, r1 - r0, w_n)
        return
    if plan.kind == "im2col_tasks":
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
        cols = workspace_view(ws, x.dtype, plan.col_shape)
        xv = x.reshape((n, plan.c) + plan.in_sp)
        w2 = w.reshape(plan.m, -1)
        fns = MN.addresses()
        for i in range(n):
            im2col_gemm_tasks(
                xv[i],
                w2,
                yv[i, 0],
                cols,
                kh,
                kw,
                sh,
                sw,
                ph,
                pw,
                dh,
                dw,
                plan.out_sp[0],
                math.prod(plan.out_sp[1:]),
                plan.band,
                fns,
            )
        _add_bias(y, b, plan)
        return
    if plan.kind == "gemm1x1":
        xg = x.reshape(n, g, cg, p)
        if packed is None:
            _mkl.matmul(wv, xg, yv)
        else:
            for i in range(n):
                _gemm(wv, xg[i], yv[i], packed)
    else:
        # im2col: the columns of one band of output rows at a time, then one GEMM per group
        # writing that band of every output channel (a strided view BLAS takes as is)
        gk = plan.col_shape[1]
        flat = workspace_view(ws, x.dtype, (math.prod(plan.col_shape),))
        xv = x.reshape((n, plan.c) + plan.in_sp)
        inner = math.prod(plan.out_sp[1:])
        o_n, band = plan.out_sp[0], plan.band
        if plan.kind == "im2col2d":
            (kh, kw), (sh, sw), (dh, dw), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
            im2col = im2col2d_parallel if plan.parallel else im2col2d_serial
        for i in range(n):
            for o0 in range(0, o_n, band):
                rows = min(band, o_n - o0)
                q = rows * inner
                col = flat[: g * gk * q].reshape(g, gk, q)
                if plan.kind == "im2col2d":
                    im2col(xv[i], col.reshape(g * gk, q), kh, kw, sh, sw, ph, pw, dh, dw, o0, rows, inner)
                else:
                    _im2col_nd_band(xv[i], col, plan, o0, rows)
                _gemm(wv, col, yv[i][:, :, o0 * inner : o0 * inner + q], packed)
    _add_bias(y, b, plan)  # the BIAS_PASS_KINDS: FusedConv moves their bias into its epilogue


# -- bfloat16 convolution on MKL's bf16 GEMM (fp32 accumulation) ------------------------------------------
def _bf16_cols(plan: ConvPlan) -> int:
    """Output positions per bf16 GEMM: a band of output rows (im2col), or for 1x1 as many of the
    image's positions as keep the float32 accumulator within BAND_BYTES (a 4096x4096 image
    must not need an accumulator of the whole output)."""
    if plan.kind != "gemm1x1":
        return plan.band * math.prod(plan.out_sp[1:])
    return max(1, min(math.prod(plan.out_sp), BAND_BYTES // max(4 * plan.m, 1)))


def bf16_workspace_bytes(plan: ConvPlan) -> int:
    """Workspace of :func:`conv_forward_bf16`: the bf16 column buffer (im2col) and one band's
    float32 accumulator."""
    cols = 0 if plan.kind == "gemm1x1" else math.prod(plan.col_shape) * 2 + ALIGN
    return cols + plan.m * _bf16_cols(plan) * 4 + ALIGN


def conv_forward_bf16(
    x, y, plan: ConvPlan, ws, w2, bias=None, z=None, code: int = 0, alpha: float = 0.0, beta: float = 0.0
) -> None:
    """y = act(conv(x, W) + bias + z) for bfloat16 ``x``, ``z``, ``y`` (group 1, 1x1 or 2-D im2col
    plans; ``w2``: the weight's bits as a (M, C*kh*kw) uint16 matrix); each image (im2col: each
    band of output rows) is one MKL bf16 GEMM (:func:`opsnn.kernels.cpu.mkl.gemm2d_bf16`) into a
    float32 accumulator,
    whose epilogue (``bias`` float32 per output channel, residual, activation ``code``) runs in
    float32 before one rounding to bfloat16."""
    n, m = plan.n, plan.m
    p = math.prod(plan.out_sp)
    yv = y.view(np.uint16).reshape(n, m, p)
    if n == 0 or yv.size == 0:
        return
    zv = None if z is None else z.view(np.uint16).reshape(n, m, p)
    xv = x.view(np.uint16).reshape((n, plan.c) + plan.in_sp)
    q_max = _bf16_cols(plan)
    off = 0
    if plan.kind != "gemm1x1":
        ncol = math.prod(plan.col_shape)
        flat = workspace_view(ws, np.uint16, (ncol,))
        off = ncol * 2 + ALIGN
    acc_all = workspace_view(ws[off:], np.float32, (m * q_max,))

    def finish(acc, i, c0, q):
        bf16_epilogue(
            acc, yv[i][:, c0 : c0 + q], None if zv is None else zv[i][:, c0 : c0 + q], code, alpha, beta, row_bias=bias
        )

    if plan.kind == "gemm1x1":  # the image is the column matrix, q_max of its columns at a time
        for i in range(n):
            xi = xv[i].reshape(plan.c, p)
            for c0 in range(0, p, q_max):
                q = min(q_max, p - c0)
                acc = acc_all[: m * q].reshape(m, q)
                _mkl.gemm2d_bf16(w2, xi[:, c0 : c0 + q], acc)
                finish(acc, i, c0, q)
        return
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
    im2col = im2col2d_parallel if plan.parallel else im2col2d_serial
    inner = math.prod(plan.out_sp[1:])
    gk = plan.col_shape[1]
    for i in range(n):
        for o0 in range(0, plan.out_sp[0], plan.band):
            rows = min(plan.band, plan.out_sp[0] - o0)
            q = rows * inner
            col = flat[: gk * q].reshape(gk, q)
            im2col(xv[i], col, kh, kw, sh, sw, ph, pw, dh, dw, o0, rows, inner)
            acc = acc_all[: m * q].reshape(m, q)
            _mkl.gemm2d_bf16(w2, col, acc)
            finish(acc, i, o0 * inner, q)


def _im2col_nd_band(x, col, plan: ConvPlan, o0: int, rows: int) -> None:
    """Columns of output positions [o0, o0 + rows) along the first spatial dim (any rank):
    one strided copy per kernel offset. The first band's slices come from the plan; a later
    band's are those of a sub-problem whose first-dim padding is shifted by o0 * stride."""
    kk = math.prod(plan.k)
    sub_out = (rows,) + tuple(plan.out_sp[1:])
    if o0 == 0 and rows == plan.band:
        slices, zero_fill = plan.slices, plan.zero_fill
    else:
        pb = (plan.pb[0] - o0 * plan.s[0],) + tuple(plan.pb[1:])
        slices = _nd_slices(sub_out, plan.in_sp, plan.k, plan.s, plan.d, pb)
        zero_fill = _needs_zero_fill(slices, kk, sub_out)
    if zero_fill:
        col.fill(0)
    cv = col.reshape((plan.c, kk) + sub_out)
    for j, o_sl, i_sl in slices:
        cv[(slice(None), j) + o_sl] = x[(slice(None),) + i_sl]


def conv(ins, outs, attrs, plan, ws):
    """Conv kernel entry (all three algorithms; the plan fixes which)."""
    conv_forward(ins[0], ins[1], ins[2] if len(ins) > 2 else None, outs[0], plan, ws)


# -- transposed convolution ---------------------------------------------------------------------
def conv_transpose(ins, outs, attrs, plan, ws):
    """ConvTranspose: col = W_g^T @ x_g per image, then col2im into the bias-initialised output."""
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    y = outs[0]
    n, g = plan.n, plan.g
    cg, mg = plan.c // g, plan.m // g
    kk = math.prod(plan.k)
    pin = math.prod(plan.in_sp)
    yv = y.reshape((n, plan.m) + plan.out_sp)
    if b is None:
        y.fill(0)
    else:
        y.reshape(n, plan.m, -1)[...] = b.reshape(1, plan.m, 1)
    if n == 0 or y.size == 0 or x.size == 0:
        return
    wt = w.reshape(g, cg, mg * kk).transpose(0, 2, 1)  # (g, mg*kk, cg) view; BLAS reads it transposed
    xv = x.reshape(n, g, cg, pin)
    flat = workspace_view(ws, x.dtype, (math.prod(plan.col_shape),))
    i_n, band = plan.in_sp[0], plan.band
    inner = math.prod(plan.in_sp[1:])
    (sh, dh, ph), kh = (plan.s[0], plan.d[0], plan.pb[0]), plan.k[0]
    if plan.kind == "col2im2d":
        kw, sw, dw, pw = plan.k[1], plan.s[1], plan.d[1], plan.pb[1]
        col2im = col2im2d_parallel if plan.parallel else col2im2d_serial
    # a band of input rows at a time: its columns, then added into the output rows they reach
    for i in range(n):
        for r0 in range(0, i_n, band):
            rows = min(band, i_n - r0)
            q = rows * inner
            col = flat[: plan.m * kk * q].reshape(g, mg * kk, q)
            _mkl.matmul(wt, xv[i][:, :, r0 * inner : r0 * inner + q], col)
            if plan.kind == "col2im2d":
                oh0 = max(0, r0 * sh - ph)
                oh1 = min(plan.out_sp[0], (r0 + rows - 1) * sh - ph + (kh - 1) * dh + 1)
                if oh1 > oh0:
                    col2im(
                        col.reshape(plan.m * kk, q),
                        yv[i],
                        kh,
                        kw,
                        sh,
                        sw,
                        ph,
                        pw,
                        dh,
                        dw,
                        r0,
                        rows,
                        inner,
                        oh0,
                        oh1 - oh0,
                    )
                continue
            sub_in = (rows,) + tuple(plan.in_sp[1:])
            slices = (
                plan.slices
                if r0 == 0 and rows == band
                else _nd_slices(sub_in, plan.out_sp, plan.k, plan.s, plan.d, (ph - r0 * sh,) + tuple(plan.pb[1:]))
            )
            cv = col.reshape((plan.m, kk) + sub_in)
            for j, i_sl, o_sl in slices:
                yv[i][(slice(None),) + o_sl] += cv[(slice(None), j) + i_sl]


# -- convolution gradients (training) ---------------------------------------------------------------
@dataclass(frozen=True)
class WeightGradPlan:
    """The weight gradient's GEMM plan: ``conv``, the forward's column plan (``gemm1x1``: X is the
    column matrix; ``im2col2d`` / ``im2col_nd``: a band of output rows' columns at a time), and the
    (group, O/group, C/group * prod(k)) product of one band, added into dW."""

    conv: ConvPlan

    @property
    def product_shape(self) -> tuple:
        c = self.conv
        return (c.g, c.m // c.g, (c.c // c.g) * math.prod(c.k))

    @property
    def workspace_bytes(self) -> int:
        return self.conv.workspace_bytes + math.prod(self.product_shape) * self.conv.itemsize + ALIGN

    def describe(self) -> str:
        c = self.conv
        if c.kind == "gemm1x1":
            return "weight gradient: dY @ X^T per image and group (X is the column matrix), no column buffer"
        bands = f" in bands of {c.band} of {c.out_sp[0]} output rows" if 0 < c.band < c.out_sp[0] else ""
        return (
            f"weight gradient: {c.kind} columns {c.col_shape[1]}x{c.col_shape[2]} per group{bands}, "
            "then dY @ columns^T (BLAS) added into dW"
        )


def conv_backward_weight_plan(x_shape, w_shape, g, k, s, d, pb, pe, out_sp, itemsize) -> WeightGradPlan:
    """Plan dW of a convolution: X's columns (as the forward builds them) times dY, transposed."""
    nd = len(x_shape) - 2
    if all(v == 1 for v in k) and all(v == 1 for v in s) and not any(pb) and not any(pe):
        kind = "gemm1x1"
    else:
        kind = "im2col2d" if nd <= 2 else "im2col_nd"
    return WeightGradPlan(conv_plan(x_shape, w_shape, g, k, s, d, pb, pe, out_sp, itemsize, kind))


def conv_backward_weight(x, dy, dw, wplan: WeightGradPlan, ws) -> None:
    """dW[g] = sum over images and bands of dY[g] (O/g, q) @ columns(X)[g]^T (q, C/g * prod(k)),
    for contiguous float32 / float64 arrays; the sum over images runs in dW's dtype."""
    plan = wplan.conv
    n, g = plan.n, plan.g
    cg, mg = plan.c // g, plan.m // g
    p = math.prod(plan.out_sp)
    dwv = dw.reshape(wplan.product_shape)
    dw.fill(0)
    if n == 0 or p == 0 or dw.size == 0:
        return
    dyv = dy.reshape(n, g, mg, p)
    tmp_off = plan.workspace_bytes
    tmp = workspace_view(ws[tmp_off:], dw.dtype, wplan.product_shape)

    def add(a, cols):  # dwv += a @ cols^T, a (g, mg, q), cols (g, gk, q)
        if g == 1:
            _mkl.matmul(a[0], cols[0].T, tmp[0])
        else:
            np.matmul(a, cols.transpose(0, 2, 1), out=tmp)
        np.add(dwv, tmp, out=dwv)

    if plan.kind == "gemm1x1":
        xg = x.reshape(n, g, cg, p)
        for i in range(n):
            add(dyv[i], xg[i])
        return
    gk = plan.col_shape[1]
    flat = workspace_view(ws, x.dtype, (math.prod(plan.col_shape),))
    xv = x.reshape((n, plan.c) + plan.in_sp)
    inner = math.prod(plan.out_sp[1:])
    o_n, band = plan.out_sp[0], plan.band
    if plan.kind == "im2col2d":
        (kh, kw), (sh, sw), (dh, dw_), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
        im2col = im2col2d_parallel if plan.parallel else im2col2d_serial
    for i in range(n):
        for o0 in range(0, o_n, band):
            rows = min(band, o_n - o0)
            q = rows * inner
            col = flat[: g * gk * q].reshape(g, gk, q)
            if plan.kind == "im2col2d":
                im2col(xv[i], col.reshape(g * gk, q), kh, kw, sh, sw, ph, pw, dh, dw_, o0, rows, inner)
            else:
                _im2col_nd_band(xv[i], col, plan, o0, rows)
            add(dyv[i][:, :, o0 * inner : o0 * inner + q], col)


@nb.njit(parallel=True, nogil=True, cache=True)
def im2row_images(x, out, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow):
    """x (N, C, H, W) -> out (N*oh*ow, C*kh*kw): a row per output position of every image, its window in
    the weight's (C, kh, kw) order; zero where the window reads padding. Floats as same-width unsigned
    integer views (bfloat16 as uint16, float32 as uint32: +0.0 is all zero bits)."""
    n, c, h, w = x.shape
    for t in nb.prange(n * oh):
        i = t // oh
        y0 = (t - i * oh) * sh - ph
        for q in range(ow):
            row = out[t * ow + q]
            x0 = q * sw - pw
            k = 0
            for ci in range(c):
                for a in range(kh):
                    yy = y0 + a * dh
                    for b in range(kw):
                        xx = x0 + b * dw
                        row[k] = x[i, ci, yy, xx] if 0 <= yy < h and 0 <= xx < w else 0
                        k += 1


@dataclass(frozen=True)
class RowsPlan:
    """A 2-D group-1 convolution, or one of its gradients, as one product over the windows of all images
    (:func:`im2row_images`: a row of C*kh*kw values per output position, N*OH*OW rows), by ``kind``:
    'forward' Y's rows (N*OH*OW, O) = rows @ W^T (W read transposed in place), 'data' rows = dY as rows
    (N*OH*OW, O) @ W then each row added back at its window, 'weights' dW (O, C*kh*kw) = dY^T @ rows. The
    product on oneDNN's brgemm matmul (``matmul``; bfloat16: float32 accumulation, one rounding) or, where
    None, the GEMM library (``libraries.conv_rows_product``)."""

    kind: str
    x_shape: tuple
    y_shape: tuple
    k: tuple
    s: tuple
    d: tuple
    pb: tuple
    itemsize: int
    matmul: object  # onednn.RuntimeMatMul of the product, or None: the GEMM library

    @property
    def positions(self) -> int:
        return self.y_shape[0] * math.prod(self.y_shape[2:])

    @property
    def row_len(self) -> int:
        return self.x_shape[1] * math.prod(self.k)

    @property
    def workspace_bytes(self) -> int:
        return self.itemsize * self.positions * (self.row_len + self.y_shape[1]) + 2 * ALIGN

    def product(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """``out = a @ b`` on the plan's library ('forward': ``a @ b^T``, ``b`` the (O, C*kh*kw) weight)."""
        if self.matmul is not None:
            self.matmul.run(a, b, None, out)
        else:
            _mkl.matmul(a, b.T if self.kind == "forward" else b, out)

    def describe(self) -> str:
        what = {"forward": "convolution", "data": "data gradient", "weights": "weight gradient"}[self.kind]
        lib = self.matmul.describe() if self.matmul is not None else "the GEMM library"
        return f"{what} as one product over the {self.positions} x {self.row_len} windows of all images; {lib}"


def rows_plan(kind: str, x_shape, y_shape, k, s, d, pb, dtype=np.float32) -> RowsPlan:
    """The :class:`RowsPlan` of ``kind`` ('forward', 'data', 'weights'), its product's library chosen by
    ``libraries.conv_rows_product``."""
    from . import libraries, onednn

    m = int(y_shape[1])
    p = int(y_shape[0]) * math.prod(y_shape[2:])
    r = int(x_shape[1]) * math.prod(k)
    rows, inner, cols = {"forward": (p, r, m), "data": (p, m, r), "weights": (m, p, r)}[kind]
    mm = None
    if libraries.conv_rows_product(kind, rows, inner, cols, dtype).library == "onednn":
        mm = onednn.runtime_matmul(1, rows, inner, cols, trans_b=kind == "forward", dtype=dtype)
    geo = (tuple(k), tuple(s), tuple(d), tuple(pb))
    return RowsPlan(kind, tuple(x_shape), tuple(y_shape), *geo, np.dtype(dtype).itemsize, mm)


def conv_weight_grad_rows(x, dy, dw, plan: RowsPlan, ws) -> None:
    """dW of a 2-D group-1 convolution by a 'weights' :class:`RowsPlan` (contiguous x, dy, dw of its dtype)."""
    n, m = plan.y_shape[0], plan.y_shape[1]
    p, r = plan.positions, plan.row_len
    bits = np.uint16 if plan.itemsize == 2 else np.uint32
    rows = workspace_view(ws, bits, (p, r))
    dyt = workspace_view(ws[rows.nbytes + ALIGN :], bits, (m, p))
    (kh, kw), (sh, sw), (dh, dw_), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
    im2row_images(x.view(bits), rows, kh, kw, sh, sw, ph, pw, dh, dw_, plan.y_shape[2], plan.y_shape[3])
    np.copyto(dyt.reshape(m, n, p // n), dy.view(bits).reshape(n, m, p // n).transpose(1, 0, 2))
    plan.product(dyt.view(dw.dtype), rows.view(dw.dtype), dw.reshape(m, r))


@nb.njit(parallel=True, nogil=True, cache=True)
def row2im_images(rows, dx, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow):
    """The adjoint of :func:`im2row_images`: dx (N, C, H, W) = the sum, over every output position of
    every image, of its row of ``rows`` (N*oh*ow, C*kh*kw) added at the window it read; the taps that
    read padding are dropped. One task per (image, channel) plane, so no two tasks write one value."""
    n, c, h, w = dx.shape
    kk = kh * kw
    for t in nb.prange(n * c):
        i = t // c
        ci = t - i * c
        plane = dx[i, ci]
        plane[:, :] = 0
        for p in range(oh):
            y0 = p * sh - ph
            for q in range(ow):
                row = rows[(i * oh + p) * ow + q]
                x0 = q * sw - pw
                k = ci * kk
                for a in range(kh):
                    yy = y0 + a * dh
                    for b in range(kw):
                        xx = x0 + b * dw
                        if 0 <= yy < h and 0 <= xx < w:
                            plane[yy, xx] += row[k]
                        k += 1


def conv_data_grad_rows(dy, w, dx, plan: RowsPlan, ws) -> None:
    """dX of a 2-D group-1 float32 convolution by a 'data' :class:`RowsPlan` (contiguous dy, w, dx)."""
    n, m = plan.y_shape[0], plan.y_shape[1]
    p, r = plan.positions, plan.row_len
    dyr = workspace_view(ws, np.float32, (p, m))
    rows = workspace_view(ws[dyr.nbytes + ALIGN :], np.float32, (p, r))
    np.copyto(dyr.reshape(n, p // n, m), dy.reshape(n, m, p // n).transpose(0, 2, 1))
    plan.product(dyr, w.reshape(m, r), rows)
    (kh, kw), (sh, sw), (dh, dw_), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
    row2im_images(rows, dx, kh, kw, sh, sw, ph, pw, dh, dw_, plan.y_shape[2], plan.y_shape[3])


@nb.njit(parallel=True, nogil=True, cache=True)
def rows_to_images(yr, y, bias, has_bias):
    """yr (N*P, O), a row per output position of every image, -> y (N, O, P), plus ``bias`` (O,)."""
    n, o, p = y.shape
    for t in nb.prange(n * o):
        i = t // o
        c = t - i * o
        if has_bias:
            b = bias[c]
            for q in range(p):
                y[i, c, q] = yr[i * p + q, c] + b
        else:
            for q in range(p):
                y[i, c, q] = yr[i * p + q, c]


def conv_rows(x, w, b, y, plan: RowsPlan, ws) -> None:
    """Y = conv(X, W) + B of a 2-D group-1 float32 convolution by a 'forward' :class:`RowsPlan` (contiguous x,
    w, y), then into NCHW with the bias (:func:`rows_to_images`)."""
    n, m = plan.y_shape[0], plan.y_shape[1]
    p, r = plan.positions, plan.row_len
    rows = workspace_view(ws, np.uint32, (p, r))
    yr = workspace_view(ws[rows.nbytes + ALIGN :], np.float32, (p, m))
    (kh, kw), (sh, sw), (dh, dw_), (ph, pw) = plan.k, plan.s, plan.d, plan.pb
    im2row_images(x.view(np.uint32), rows, kh, kw, sh, sw, ph, pw, dh, dw_, plan.y_shape[2], plan.y_shape[3])
    plan.product(rows.view(np.float32), w.reshape(m, r), yr)
    bias = np.ascontiguousarray(b) if b is not None else yr[0]
    rows_to_images(yr, y.reshape(n, m, p // n), bias, b is not None)


# -- integer / quantized convolution --------------------------------------------------------------
def shifted_conv(x, w, x_zp, w_zp, plan: ConvPlan, ws) -> np.ndarray:
    """conv(x - x_zp, w - w_zp) exactly, in float64 (|sums| stay far below 2**53)."""
    acc_size = plan.n * plan.m * math.prod(plan.out_sp)
    # float64 copies of x and w (8x the int8 data) and the accumulator, outside the pool: checked first
    check_request(8 * (x.size + w.size + acc_size), "ConvInteger/QLinearConv: float64 operands")
    xs = x.astype(np.float64)
    if x_zp is not None:
        xs -= float(x_zp.reshape(()))
    wsh = w.astype(np.float64)
    if w_zp is not None:
        wsh -= (
            w_zp.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1)) if w_zp.size > 1 else float(w_zp.reshape(()))
        )
    acc = np.empty((plan.n, plan.m) + tuple(plan.out_sp), np.float64)
    conv_forward(xs, wsh, None, acc, plan, ws)
    return acc


def conv_integer(ins, outs, attrs, plan, ws):
    """ConvInteger: int32 conv of zero-point-shifted 8-bit data (padding is 0 after the shift)."""
    x, w = ins[0], ins[1]
    x_zp = ins[2] if len(ins) > 2 else None
    w_zp = ins[3] if len(ins) > 3 else None
    acc = shifted_conv(x, w, x_zp, w_zp, plan, ws)
    np.copyto(outs[0], acc.reshape(outs[0].shape), casting="unsafe")


def qlinear_conv(ins, outs, attrs, plan, ws):
    """QLinearConv: exact integer conv (+ int32 bias), then round-half-even requantization."""
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = ins[:8]
    b = ins[8] if len(ins) > 8 else None
    acc = shifted_conv(x, w, x_zp, w_zp, plan, ws)
    acc = acc.reshape(plan.n, plan.m, -1)
    if b is not None:
        acc += b.astype(np.float64).reshape(1, plan.m, 1)
    w_s = w_s.reshape(1, plan.m, 1) if w_s.size > 1 else w_s.reshape(())
    scale = (x_s.reshape(()) * w_s / y_s.reshape(())).astype(np.float64)  # formed in the scales' dtype
    r = acc * scale
    np.rint(r, out=r)
    r += float(y_zp.reshape(()))
    info = np.iinfo(outs[0].dtype)
    np.clip(r, info.min, info.max, out=r)
    np.copyto(outs[0], r.reshape(outs[0].shape), casting="unsafe")
