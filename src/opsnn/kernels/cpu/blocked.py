"""Channel-blocked layout ``nChw16c``: the (N, C, H, W) array stored as (N, C/16, H, W, 16), one
pixel's 16 channels contiguous (the layout oneDNN's AVX-512 convolutions read and write, see
:mod:`opsnn.kernels.cpu.onednn`). A blocked tensor keeps its logical shape; these kernels change
the order of its elements. Parallel over (image, channel block) pairs.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK = 16


@njit(parallel=True, nogil=True, cache=True)
def _reorder(plain, flat, to_blocked):
    """Between ``plain`` (N, C, H*W) and ``flat`` (its nChw16c order, 1-D), either way."""
    n_img, c, hw = plain.shape
    nb = c // BLOCK
    for t in prange(n_img * nb):
        n = t // nb
        cb = t - n * nb
        base = t * hw * BLOCK
        for j in range(BLOCK):
            row = plain[n, cb * BLOCK + j]
            if to_blocked:
                for p in range(hw):
                    flat[base + p * BLOCK + j] = row[p]
            else:
                for p in range(hw):
                    row[p] = flat[base + p * BLOCK + j]


def _check(x: np.ndarray, out: np.ndarray) -> None:
    if x.shape != out.shape or x.ndim < 2 or x.shape[1] % BLOCK or not out.flags.c_contiguous:
        raise ValueError(f"blocked layout: shapes {x.shape} -> {out.shape} (same shape, channels a multiple of "
                         f"{BLOCK}, a C-contiguous output) expected")


def to_blocked(x: np.ndarray, out: np.ndarray) -> None:
    """``out`` (C-contiguous, x's shape) = ``x`` (N, C, ...) in nChw16c order."""
    _check(x, out)
    n, c = x.shape[:2]
    _reorder(np.ascontiguousarray(x).reshape(n, c, -1), out.reshape(-1), True)


def from_blocked(x: np.ndarray, out: np.ndarray) -> None:
    """``out`` (N, C, ...) in plain order = ``x`` (C-contiguous, nChw16c order)."""
    _check(x, out)
    n, c = x.shape[:2]
    _reorder(out.reshape(n, c, -1), np.ascontiguousarray(x).reshape(-1), False)


def blocked_reference(x: np.ndarray) -> np.ndarray:
    """nChw16c order of ``x`` by a numpy transpose (the oracle), in x's logical shape."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    y = x.reshape((n, c // BLOCK, BLOCK) + sp)
    y = np.moveaxis(y, 2, -1)
    return np.ascontiguousarray(y).reshape(x.shape)


def plain_reference(x: np.ndarray) -> np.ndarray:
    """The inverse of :func:`blocked_reference`."""
    n, c = x.shape[:2]
    sp = x.shape[2:]
    y = x.reshape((n, c // BLOCK) + sp + (BLOCK,))
    y = np.moveaxis(y, -1, 2)
    return np.ascontiguousarray(y).reshape(x.shape)
