"""Channel-blocked layouts ``nChw16c`` / ``nChw8c``: the (N, C, H, W) array stored as
(N, C/b, H, W, b), one pixel's b channels contiguous, b = 16 (one AVX-512 register of float32)
or 8 (one AVX2 register): the layouts oneDNN's JIT convolutions read and write, see
:mod:`opsnn.kernels.cpu.onednn`. A blocked tensor keeps its logical shape; these kernels change
the order of its elements. Parallel over (image, channel block) pairs.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

#: the channel blocks opsnn's blocked ops accept (oneDNN's nChw8c and nChw16c)
BLOCKS = (8, 16)


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


def layout_name(block: int) -> str:
    return f"nChw{block}c"


def _check(x: np.ndarray, out: np.ndarray, block: int) -> None:
    if block not in BLOCKS:
        raise ValueError(f"blocked layout: block {block} is not one of {BLOCKS}")
    if x.dtype != out.dtype:
        raise ValueError(f"blocked layout: {x.dtype} -> {out.dtype} (a reorder keeps the dtype)")
    if x.shape != out.shape or x.ndim < 2 or x.shape[1] % block or not out.flags.c_contiguous:
        raise ValueError(f"blocked layout: shapes {x.shape} -> {out.shape} (same shape, channels a multiple of "
                         f"{block}, a C-contiguous output) expected")


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` as numba can index it: 16-bit elements (bfloat16, which numba does not know) are
    moved as their uint16 bit patterns."""
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


def to_blocked(x: np.ndarray, out: np.ndarray, block: int) -> None:
    """``out`` (C-contiguous, x's shape and dtype) = ``x`` (N, C, ...) in nChw<block>c order."""
    _check(x, out, block)
    n, c = x.shape[:2]
    _reorder(_bits(np.ascontiguousarray(x)).reshape(n, c, -1), _bits(out).reshape(-1), True, block)


def from_blocked(x: np.ndarray, out: np.ndarray, block: int) -> None:
    """``out`` (N, C, ...) in plain order = ``x`` (C-contiguous, nChw<block>c order)."""
    _check(x, out, block)
    n, c = x.shape[:2]
    _reorder(_bits(out).reshape(n, c, -1), _bits(np.ascontiguousarray(x)).reshape(-1), False, block)


def blocked_reference(x: np.ndarray, block: int) -> np.ndarray:
    """nChw<block>c order of ``x`` by a numpy transpose (the oracle), in x's logical shape."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    y = x.reshape((n, c // block, block) + sp)
    y = np.moveaxis(y, 2, -1)
    return np.ascontiguousarray(y).reshape(x.shape)


def plain_reference(x: np.ndarray, block: int) -> np.ndarray:
    """The inverse of :func:`blocked_reference`."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    y = x.reshape((n, c // block) + sp + (block,))
    y = np.moveaxis(y, -1, 2)
    return np.ascontiguousarray(y).reshape(x.shape)
