"""Small traceable building blocks the layers share (every step is an opsnn op, so
``Module.to_graph`` records it; tensor views like ``t.reshape`` would not be recorded).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.zeros((2, 5, 8), np.float32))
>>> opsnn.nn.functional.reshape(x, (0, 0, 2, 4)).shape
(2, 5, 2, 4)
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import DTypeError
from ..tensor import Tensor, as_tensor


def reshape(x, shape) -> Tensor:
    """ONNX Reshape with ``allowzero=0``: a 0 keeps that input dim, one -1 is inferred, so a
    traced graph stays valid when a batch or sequence dim changes."""
    return ops.run_op("Reshape", [x, np.asarray(shape, np.int64)], {})[0]


def split_heads(x, heads: int) -> Tensor:
    """``(B, S, H*D)`` -> ``(B, H, S, D)``."""
    x = as_tensor(x)
    return ops.transpose(reshape(x, (0, 0, heads, x.shape[-1] // heads)), (0, 2, 1, 3))


def merge_heads(x) -> Tensor:
    """``(B, H, S, D)`` -> ``(B, S, H*D)``."""
    x = as_tensor(x)
    return reshape(ops.transpose(x, (0, 2, 1, 3)), (0, 0, x.shape[1] * x.shape[3]))


def additive_mask(mask, dtype, masked_when_true: bool = True) -> Tensor:
    """A mask as an additive float tensor: boolean masks become 0 / -inf (``masked_when_true``:
    True marks a position to leave out, torch's MultiheadAttention convention); float masks pass
    through (cast to ``dtype``)."""
    m = as_tensor(mask)
    dt = np.dtype(dtype)
    if m.dtype == np.bool_:
        zero, ninf = as_tensor(np.zeros((), dt)), as_tensor(np.full((), -np.inf, dt))
        return ops.where(m, ninf, zero) if masked_when_true else ops.where(m, zero, ninf)
    if m.dtype.kind != "f":
        raise DTypeError(f"attention mask must be bool or floating, got {m.dtype}")
    return m if m.dtype == dt else ops.cast(m, dt)


def check_token_ids(ids, vocab: int, what: str) -> Tensor:
    """Token ids as an int64 tensor; raises :class:`~opsnn.nn.OutOfVocabularyError` naming
    the first id outside ``[0, vocab)``."""
    from .layers import OutOfVocabularyError

    t = as_tensor(ids)
    if t.dtype.kind not in "iu":
        raise DTypeError(f"{what}: token ids must be integers, got {t.dtype}")
    a = t.numpy()
    if a.size:
        lo, hi = a.min(), a.max()
        if lo < 0 or hi >= vocab:
            bad = int(lo) if lo < 0 else int(hi)
            pos = tuple(int(i) for i in np.argwhere(a == bad)[0])
            raise OutOfVocabularyError(f"{what}: id {bad} at position {pos} is outside the vocabulary "
                                       f"of {vocab} entries (valid ids: 0..{vocab - 1})")
    return t if t.dtype == np.int64 else ops.cast(t, np.int64)


def as_image(x, channels: int, what: str) -> Tensor:
    """``x`` as a float (N, channels, H, W) tensor, or a typed error naming ``what``."""
    t = as_tensor(x)
    if t.ndim != 4 or t.shape[1] != channels:
        from ..errors import ParamInvalidError

        raise ParamInvalidError(f"{what}: input must be (N, {channels}, H, W), got shape {t.shape}")
    if t.dtype.kind != "f":
        raise DTypeError(f"{what}: input must be floating point, got {t.dtype}")
    return t
