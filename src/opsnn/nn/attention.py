"""``MultiheadAttention`` with torch's semantics and parameter names (``in_proj_weight``,
``in_proj_bias``, ``out_proj``; ``q/k/v_proj_weight`` when ``kdim``/``vdim`` differ).

Masks follow torch: a boolean ``key_padding_mask`` (N, S) or ``attn_mask`` (L, S) /
(N*num_heads, L, S) marks with True the positions to leave out; float masks are added to
the scores. One difference: a query row whose keys are all masked gives zeros, not NaN.

>>> import opsnn, numpy as np
>>> mha = opsnn.nn.MultiheadAttention(16, 4, batch_first=True)
>>> x = opsnn.tensor(np.random.rand(2, 5, 16).astype(np.float32))
>>> out, w = mha(x, x, x)
>>> out.shape, w.shape
((2, 5, 16), (2, 5, 5))
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..errors import ParamInvalidError
from ..tensor import as_tensor
from . import init
from .functional import additive_mask, dropout, merge_heads, reshape, split_heads
from .layers import Linear
from .module import Module, Parameter


def _xavier_uniform(shape, dtype):
    fan_out, fan_in = shape[0], shape[1]
    b = math.sqrt(6.0 / (fan_in + fan_out))
    return init.uniform(shape, -b, b, dtype)


class MultiheadAttention(Module):
    """``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights or None)``.

    Inputs are (L, N, E) or, with ``batch_first=True``, (N, L, E); 2-D inputs are one
    unbatched sequence. ``need_weights=False`` runs the fused ``scaled_dot_product_attention``;
    ``need_weights=True`` also returns the softmax probabilities (averaged over heads unless
    ``average_attn_weights=False``). In training mode with ``dropout > 0`` the probabilities are
    dropped where torch drops them (after the softmax, before ``@ V``; the returned weights are the
    dropped ones, as torch's), so that path runs unfused: matmul, softmax, ``functional.dropout``,
    matmul (the fused Attention op takes no dropout).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        dtype="float32",
    ):
        super().__init__()
        if add_bias_kv or add_zero_attn:
            raise ParamInvalidError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        if not 0.0 <= dropout <= 1.0:
            raise ParamInvalidError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        if embed_dim % num_heads:
            raise ParamInvalidError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        E = self.embed_dim = int(embed_dim)
        self.num_heads, self.head_dim = int(num_heads), E // int(num_heads)
        self.kdim, self.vdim = int(kdim or E), int(vdim or E)
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self._packed = self.kdim == E and self.vdim == E
        if self._packed:
            self.in_proj_weight = Parameter(_xavier_uniform((3 * E, E), dtype))
            for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(n, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = Parameter(_xavier_uniform((E, E), dtype))
            self.k_proj_weight = Parameter(_xavier_uniform((E, self.kdim), dtype))
            self.v_proj_weight = Parameter(_xavier_uniform((E, self.vdim), dtype))
        if bias:
            self.in_proj_bias = Parameter(np.zeros(3 * E, _dt.get(dtype)))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(E, E, bias=bias, dtype=dtype)
        if bias:
            self.out_proj.bias.copy_(np.zeros(E))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"

    def _project(self, query, key, value):
        E = self.embed_dim
        bq = bk = bv = None
        if self.in_proj_bias is not None:
            bq, bk, bv = ops.split(self.in_proj_bias, [E, E, E], dim=0)
        if self._packed:
            if query is key and key is value:  # self-attention: one GEMM, then split
                qkv = ops.linear(query, self.in_proj_weight, self.in_proj_bias)
                return ops.split(qkv, [E, E, E], dim=-1)
            wq, wk, wv = ops.split(self.in_proj_weight, [E, E, E], dim=0)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return ops.linear(query, wq, bq), ops.linear(key, wk, bk), ops.linear(value, wv, bv)

    def _mask(self, key_padding_mask, attn_mask, N, L, S, dtype):
        H = self.num_heads
        mask = None
        if key_padding_mask is not None:
            kpm = as_tensor(key_padding_mask)
            if tuple(kpm.shape) != (N, S):
                raise ParamInvalidError(f"MultiheadAttention: key_padding_mask must be (N={N}, S={S}), got {kpm.shape}")
            mask = reshape(additive_mask(kpm, dtype), (N, 1, 1, S))
        if attn_mask is not None:
            am = as_tensor(attn_mask)
            if tuple(am.shape) == (L, S):
                am = reshape(additive_mask(am, dtype), (1, 1, L, S))
            elif tuple(am.shape) == (N * H, L, S):
                am = reshape(additive_mask(am, dtype), (N, H, L, S))
            else:
                raise ParamInvalidError(
                    f"MultiheadAttention: attn_mask must be (L={L}, S={S}) or "
                    f"(N*num_heads={N * H}, L, S), got {am.shape}"
                )
            mask = am if mask is None else ops.add(mask, am)
        return mask

    def _dropped_attention(self, q, k, v, mask, causal: bool):
        """``dropout(softmax(q k^T / sqrt(D) + mask)) @ v`` over (N, H, L|S, D); returns (y, probs)."""
        L, S, dt = q.shape[2], k.shape[2], q.dtype
        scores = ops.mul(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), as_tensor(np.asarray(self.head_dim**-0.5, dt)))
        zero, empty = as_tensor(np.zeros((), dt)), None
        if causal:  # top-left aligned, as the fused op without a KV cache: no row is fully masked
            scores = ops.add(scores, as_tensor(np.triu(np.full((1, 1, L, S), -np.inf, dt), 1)))
        elif mask is not None:
            # a row whose keys are all masked gives zeros, as the fused op: softmax it unmasked, then zero it
            empty = ops.isinf(ops.max(mask, dim=-1, keepdim=True), detect_positive=False)
            scores = ops.add(scores, ops.where(empty, zero, mask))
        probs = ops.softmax(scores, dim=-1)
        if empty is not None:
            probs = ops.where(empty, zero, probs)
        probs = dropout(probs, self.dropout, True, f"MultiheadAttention(dropout={self.dropout})")
        return ops.matmul(probs, v), probs

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        same_kv = key is value
        self_attn = query is key and same_kv
        query, key, value = as_tensor(query), as_tensor(key), as_tensor(value)
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ParamInvalidError(
                f"MultiheadAttention: query/key/value must all be 2-D (unbatched) or 3-D, got "
                f"{query.shape}, {key.shape}, {value.shape}"
            )
        if query.shape[-1] != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ParamInvalidError(
                f"MultiheadAttention: last dims must be (E={self.embed_dim}, kdim={self.kdim}, "
                f"vdim={self.vdim}), got {query.shape[-1]}, {key.shape[-1]}, {value.shape[-1]}"
            )
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (ops.unsqueeze(t, 0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = ops.unsqueeze(key_padding_mask, 0)
        elif not self.batch_first:  # (L, N, E) -> (N, L, E)
            query = ops.transpose(query, (1, 0, 2))
            key = query if self_attn else ops.transpose(key, (1, 0, 2))
            value = key if same_kv else ops.transpose(value, (1, 0, 2))
        if self_attn:
            key = value = query
        elif same_kv:
            value = key
        N, L, S = query.shape[0], query.shape[1], key.shape[1]
        if value.shape[1] != S or key.shape[0] != N or value.shape[0] != N:
            raise ParamInvalidError(
                f"MultiheadAttention: key and value must share batch and length, got "
                f"{key.shape} and {value.shape} for query {query.shape}"
            )
        q, k, v = self._project(query, key, value)
        H = self.num_heads
        q, k, v = split_heads(q, H), split_heads(k, H), split_heads(v, H)
        mask = self._mask(key_padding_mask, attn_mask, N, L, S, query.dtype)
        causal = bool(is_causal) and mask is None  # torch: is_causal is a hint that attn_mask is causal
        weights = None
        if self.training and self.dropout > 0:
            y, weights = self._dropped_attention(q, k, v, mask, causal)
            if need_weights:
                if average_attn_weights:
                    weights = ops.mean(weights, dim=1)
                if unbatched:
                    weights = ops.squeeze(weights, 0)
            else:
                weights = None
        elif need_weights:
            y, _, _, weights = ops.attention(q, k, v, mask, is_causal=causal, num_outputs=4, qk_matmul_output_mode=3)
            if average_attn_weights:
                weights = ops.mean(weights, dim=1)
            if unbatched:
                weights = ops.squeeze(weights, 0)
        else:
            y = ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        out = self.out_proj(merge_heads(y))
        if unbatched:
            out = ops.squeeze(out, 0)
        elif not self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        return out, weights
