"""torch.nn.utils' helpers over opsnn tensors: ``pad_sequence`` (variable-length sequences into one
padded batch, differentiable), ``parameters_to_vector`` / ``vector_to_parameters``.

>>> import opsnn, numpy as np
>>> a, b = opsnn.tensor(np.ones((2, 3), np.float32)), opsnn.tensor(np.ones((1, 3), np.float32))
>>> opsnn.nn.utils.pad_sequence([a, b], batch_first=True).shape
(2, 2, 3)
"""

from __future__ import annotations

import numpy as np

from ... import ops
from ...errors import ParamInvalidError, real_number
from ...tensor import Tensor, as_tensor


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0, padding_side: str = "right"):
    """torch.nn.utils.rnn.pad_sequence: tensors of shape (L_i, *) padded with ``padding_value`` to the
    longest L into (max L, B, *) (``batch_first``: (B, max L, *)), on the right or the left."""
    if isinstance(sequences, Tensor) or not isinstance(sequences, (list, tuple)) or not sequences:
        raise ParamInvalidError("pad_sequence: expected a non-empty list of tensors of shape (L, *)")
    if padding_side not in ("right", "left"):
        raise ParamInvalidError(f"pad_sequence: padding_side must be 'right' or 'left', got {padding_side!r}")
    ts = [as_tensor(s) for s in sequences]
    trailing = {tuple(t.shape[1:]) for t in ts}
    if any(t.ndim == 0 for t in ts) or len(trailing) != 1:
        raise ParamInvalidError(
            f"pad_sequence: the sequences must be (L, *) with one trailing shape, got {[tuple(t.shape) for t in ts]}"
        )
    value = real_number("pad_sequence", "padding_value", padding_value)
    longest = max(t.shape[0] for t in ts)
    rows = []
    for t in ts:
        short = longest - t.shape[0]
        if short:
            pad = [0] * (2 * (t.ndim - 1)) + ([0, short] if padding_side == "right" else [short, 0])
            t = ops.pad(t, tuple(pad), value=value)  # torch's pad order: last dim first
        rows.append(ops.unsqueeze(t, 0 if batch_first else 1))
    return ops.concat(rows, 0 if batch_first else 1)


def parameters_to_vector(parameters) -> Tensor:
    """torch.nn.utils.parameters_to_vector: every parameter flattened, one after another (differentiable)."""
    ps = list(parameters)
    if not ps:
        raise ParamInvalidError("parameters_to_vector: no parameters")
    return ops.concat([ops.reshape(p, (-1,)) for p in ps], 0)


def vector_to_parameters(vec, parameters) -> None:
    """torch.nn.utils.vector_to_parameters: ``vec``'s slices written into the parameters in order."""
    v = as_tensor(vec)
    ps = list(parameters)
    total = sum(p.numel for p in ps)
    if v.ndim != 1 or v.shape[0] != total:
        raise ParamInvalidError(f"vector_to_parameters: expected a 1-D vector of {total} values, got shape {v.shape}")
    flat = np.asarray(v.numpy())
    start = 0
    for p in ps:
        p.copy_(flat[start : start + p.numel].reshape(p.shape))
        start += p.numel
