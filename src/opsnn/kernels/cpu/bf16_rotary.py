"""Rotary position embedding on bfloat16 storage: a task per (batch, position) widens its heads'
rows into float32 scratch, runs the float32 kernel's loop over them and rounds them back once
(what the fp32 adapter gives, without its whole-tensor float32 copies)."""

from __future__ import annotations

import numba as nb
import numpy as np

from .attention import _rotary_position
from .gemm import KIND_BF16, _narrow, _widen


@nb.njit(nogil=True, cache=True)
def _position(x, cos, sin, y, bnsd, interleaved, rot, b, s):
    if bnsd:
        N, Dh = x.shape[1], x.shape[3]
    else:
        N, Dh = x.shape[2], x.shape[3]
    xu = np.empty(N * Dh, np.uint32)
    yu = np.empty(N * Dh, np.uint32)
    xf, yf = xu.view(np.float32), yu.view(np.float32)
    for n in range(N):
        src = x[b, n, s] if bnsd else x[b, s, n]
        _widen(src, xu[n * Dh : (n + 1) * Dh], xf[n * Dh : (n + 1) * Dh], KIND_BF16)
    cb = b if cos.shape[0] > 1 else 0
    _rotary_position(xf.reshape((N, Dh)), cos[cb, s], sin[cb, s], yf.reshape((N, Dh)), interleaved, rot)
    for n in range(N):
        dst = y[b, n, s] if bnsd else y[b, s, n]
        _narrow(yf[n * Dh : (n + 1) * Dh], yu[n * Dh : (n + 1) * Dh], dst, KIND_BF16)


@nb.njit(parallel=True, nogil=True, cache=True)
def _rotary_parallel(x, cos, sin, y, bnsd, interleaved, rot):
    B, S = x.shape[0], x.shape[2] if bnsd else x.shape[1]
    for t in nb.prange(B * S):
        _position(x, cos, sin, y, bnsd, interleaved, rot, t // S, t % S)


@nb.njit(nogil=True, cache=True)
def _rotary_serial(x, cos, sin, y, bnsd, interleaved, rot):
    B, S = x.shape[0], x.shape[2] if bnsd else x.shape[1]
    for t in range(B * S):
        _position(x, cos, sin, y, bnsd, interleaved, rot, t // S, t % S)


def rotary_bf16(x, cos, sin, y, bnsd: bool, interleaved: bool, rot: int, parallel: bool) -> None:
    """``y`` = RoPE of contiguous bfloat16 ``x`` (4-D, (B, N, S, Dh) when ``bnsd`` else (B, S, N,
    Dh)) with float32 ``cos`` / ``sin`` of (1 or B, S, rot // 2), into bfloat16 ``y`` of ``x``'s shape."""
    if x.size == 0:
        return
    (_rotary_parallel if parallel else _rotary_serial)(
        x.view(np.uint16), cos, sin, y.view(np.uint16), bnsd, interleaved, rot
    )
