"""Channel-blocked layouts ``nChw16c`` / ``nChw8c``: the (N, C, H, W) array stored as
(N, C/b, H, W, b), one pixel's b channels contiguous, b = 16 (one AVX-512 register of float32)
or 8 (one AVX2 register): the layouts oneDNN's direct JIT convolutions read and write; and
``nhwc`` (``block`` 0: nChw<C>c, all of a pixel's channels together), the layout of its brgemm
convolutions, see :mod:`opsnn.kernels.cpu.onednn`. A blocked tensor keeps its logical shape;
these kernels change the order of its elements. Parallel over (image, channel block) pairs, on
nhwc over (image, run of pixels).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

#: the channel blocks of oneDNN's nChw8c and nChw16c
BLOCKS = (8, 16)
#: the ``block`` of nhwc (channels last: nChw<C>c, all C channels of a pixel together)
NHWC = 0
#: the layouts opsnn's blocked ops accept, by their ``block``
LAYOUTS = (NHWC,) + BLOCKS


def channel_block(block: int, c: int) -> int:
    """The channels stored together per pixel: ``block``, or all ``c`` of them on nhwc (nhwc is
    nChw<C>c), at least 1."""
    return max(c, 1) if block == NHWC else block


@njit(parallel=True, nogil=True, cache=True)
def _reorder(plain, flat, to_blocked, block):
    """Between ``plain`` (N, C, H*W) and ``flat`` (its nChw<block>c order, 1-D), either way."""
    n_img, c, hw = plain.shape
    nb = c // block
    for t in prange(n_img * nb):
        n = t // nb
        cb = t - n * nb
        base = t * hw * block
        for j in range(block):
            row = plain[n, cb * block + j]
            if to_blocked:
                for p in range(hw):
                    flat[base + p * block + j] = row[p]
            else:
                for p in range(hw):
                    row[p] = flat[base + p * block + j]


#: pixels per task of the nhwc reorder
NHWC_PIXELS = 256


@njit(parallel=True, nogil=True, cache=True)
def _reorder_last(plain, last, to_last):
    """Between ``plain`` (N, C, H*W) and ``last`` (N, H*W, C), either way: tasks of
    NHWC_PIXELS pixels of one image, so a batch of one still runs on every thread."""
    n_img, c, hw = plain.shape
    per = (hw + NHWC_PIXELS - 1) // NHWC_PIXELS
    for t in prange(n_img * per):
        n = t // per
        p0 = (t - n * per) * NHWC_PIXELS
        p1 = min(hw, p0 + NHWC_PIXELS)
        if to_last:
            for p in range(p0, p1):
                for j in range(c):
                    last[n, p, j] = plain[n, j, p]
        else:
            for j in range(c):
                for p in range(p0, p1):
                    plain[n, j, p] = last[n, p, j]


def layout_name(block: int) -> str:
    return "nhwc" if block == NHWC else f"nChw{block}c"


def _check(x: np.ndarray, out: np.ndarray, block: int) -> None:
    if block not in LAYOUTS:
        raise ValueError(f"blocked layout: block {block} is not one of {LAYOUTS}")
    if x.dtype != out.dtype:
        raise ValueError(f"blocked layout: {x.dtype} -> {out.dtype} (a reorder keeps the dtype)")
    if (
        x.shape != out.shape
        or x.ndim < 2
        or x.shape[1] % channel_block(block, x.shape[1])
        or not out.flags.c_contiguous
    ):
        raise ValueError(
            f"blocked layout: shapes {x.shape} -> {out.shape} (same shape, channels a multiple of "
            f"{block}, a C-contiguous output) expected"
        )


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` as numba can index it: 16-bit elements (bfloat16, which numba does not know) are
    moved as their uint16 bit patterns."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def to_blocked(x: np.ndarray, out: np.ndarray, block: int) -> None:
    """``out`` (C-contiguous, x's shape and dtype) = ``x`` (N, C, ...) in nChw<block>c order."""
    _check(x, out, block)
    if out.size == 0:  # nothing to move (and reshape(n, c, -1) cannot infer -1 from zero elements)
        return
    n, c = x.shape[:2]
    plain = _bits(np.ascontiguousarray(x)).reshape(n, c, -1)
    if block == NHWC:
        _reorder_last(plain, _bits(out).reshape(n, -1, c), True)
    else:
        _reorder(plain, _bits(out).reshape(-1), True, block)


def from_blocked(x: np.ndarray, out: np.ndarray, block: int) -> None:
    """``out`` (N, C, ...) in plain order = ``x`` (C-contiguous, nChw<block>c order)."""
    _check(x, out, block)
    if out.size == 0:  # nothing to move (and reshape(n, c, -1) cannot infer -1 from zero elements)
        return
    n, c = x.shape[:2]
    plain = _bits(out).reshape(n, c, -1)
    if block == NHWC:
        _reorder_last(plain, _bits(np.ascontiguousarray(x)).reshape(n, -1, c), False)
    else:
        _reorder(plain, _bits(np.ascontiguousarray(x)).reshape(-1), False, block)


def blocked_reference(x: np.ndarray, block: int) -> np.ndarray:
    """nChw<block>c order of ``x`` by a numpy transpose (the oracle), in x's logical shape."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    block = channel_block(block, c)
    y = x.reshape((n, c // block, block) + sp)
    y = np.moveaxis(y, 2, -1)
    return np.ascontiguousarray(y).reshape(x.shape)


def plain_reference(x: np.ndarray, block: int) -> np.ndarray:
    """The inverse of :func:`blocked_reference`."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    block = channel_block(block, c)
    y = x.reshape((n, c // block) + sp + (block,))
    y = np.moveaxis(y, -1, 2)
    return np.ascontiguousarray(y).reshape(x.shape)


@njit(nogil=True, cache=True, error_model="numpy")
def _gap_rows(x3, out2, t0, t1):
    """Means over axis 1 of ``x3[t0:t1]`` ((tasks, H*W, block): one image's channel block per
    task) into ``out2[t0:t1]`` (tasks, block), float64 sums of one block of lanes."""
    hw, block = x3.shape[1], x3.shape[2]
    acc = np.empty(block, np.float64)
    for t in range(t0, t1):
        acc[:] = 0.0
        for p in range(hw):
            for j in range(block):
                acc[j] += x3[t, p, j]
        for j in range(block):
            out2[t, j] = acc[j] / hw


@njit(parallel=True, nogil=True, cache=True)
def _gap_parallel(x3, out2, chunks):
    per = (x3.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        _gap_rows(x3, out2, c * per, min(x3.shape[0], (c + 1) * per))


#: below this many input elements the blocked global average pool runs on one thread (waking
#: the OpenMP workers costs more than reading ResNet-50's last 2048x7x7 feature map)
GAP_PARALLEL_MIN = 1 << 18


def _gap_views(x: np.ndarray, out: np.ndarray, block: int):
    """Both global average pools' checks and views: (X as (tasks, H*W, channels per task), out as
    (tasks, channels per task)), or None when ``out`` is already written (empty, or NaN for an
    empty plane, as numpy's mean of nothing)."""
    n, c = x.shape[:2]
    if block not in LAYOUTS or c % channel_block(block, c) or out.size != n * c or not out.flags.c_contiguous:
        raise ValueError(f"blocked global average pool: {x.shape} -> {out.shape} with block {block}")
    hw = x.size // max(n * c, 1)
    if out.size == 0:
        return None
    if hw == 0:
        out[...] = np.nan
        return None
    block = channel_block(block, c)
    return np.ascontiguousarray(x).reshape(n * (c // block), hw, block), out.reshape(n * (c // block), block)


def global_avg_pool_numpy(x: np.ndarray, out: np.ndarray, block: int) -> None:
    """:func:`global_avg_pool` in numpy (float64 sums too): nothing to compile, the first run's
    kernel while the numba one compiles (``opsnn.ops.tiering``)."""
    views = _gap_views(x, out, block)
    if views is not None:
        x3, out2 = views
        np.copyto(out2, x3.sum(axis=1, dtype=np.float64) / x3.shape[1], casting="same_kind")


def global_avg_pool(x: np.ndarray, out: np.ndarray, block: int, parallel: bool) -> None:
    """``out`` (N, C, 1, 1, plain order, which is also the blocked order at 1x1) = the mean over
    H, W of ``x`` (N, C, H, W) stored in nChw<block>c order, or nhwc (float32; float64 accumulation).
    ``parallel``: over (image, channel block) tasks (see :data:`GAP_PARALLEL_MIN`)."""
    views = _gap_views(x, out, block)
    if views is None:
        return
    x3, out2 = views
    if parallel:
        _gap_parallel(x3, out2, min(x3.shape[0], 4 * numba.get_num_threads()))
    else:
        _gap_rows(x3, out2, 0, x3.shape[0])
