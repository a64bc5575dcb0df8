"""The cached forward of a LLaMA model: prefill chunks and batched decode steps that write
keys/values into a :class:`~opsnn.llm.cache.KVCache` in place and attend over views of it.

It reads the parameters of an ``opsnn.models.llama`` model (no copies) and runs the same
ops as the model's own ``forward``; what differs is where K/V live. The model's forward
concatenates ``past`` and the new K/V into fresh tensors each call; here the new K/V are
stored at each request's offset in the preallocated buffers and the fused ``Attention``
op gets the buffers' rows plus ``nonpad_kv_seqlen`` (each row's filled length), so rows of
different lengths share one call and the kernel never reads past a row's length::

    >>> import opsnn, numpy as np
    >>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100)
    >>> cache = KVCache.for_model(lm, max_batch_slots=2, max_seq=32)
    >>> dec = CachedDecoder(lm, cache)
    >>> s = cache.allocate()
    >>> dec.forward(np.array([[1, 5, 7]]), [s], [0]).shape     # prefill: logits of the last position
    (1, 100)
    >>> dec.forward(np.array([[9]]), [s], [3]).shape            # decode the token at position 3
    (1, 100)
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import ParamInvalidError
from ..tensor import Tensor, as_tensor
from .cache import KVCache


class _Layer:
    __slots__ = ("ln1", "wq", "wk", "wv", "wo", "ln2", "wg", "wu", "wd")


class CachedDecoder:
    """``forward(tokens, slots, starts)``: run tokens (B, S) of B requests, row ``b`` sitting
    at positions ``starts[b] .. starts[b]+S-1`` of cache slot ``slots[b]``; returns the logits
    of each row's last position as a (B, vocab) float32 numpy array (``all_positions=True``:
    (B, S, vocab))."""

    def __init__(self, model, cache: KVCache):
        cfg = model.config
        if (cache.layers, cache.kv_heads, cache.head_dim) != (cfg.num_hidden_layers, cfg.num_key_value_heads,
                                                               cfg.head_dim):
            raise ParamInvalidError(f"CachedDecoder: cache (layers={cache.layers}, kv_heads={cache.kv_heads}, "
                                    f"head_dim={cache.head_dim}) does not fit the model (layers="
                                    f"{cfg.num_hidden_layers}, kv_heads={cfg.num_key_value_heads}, head_dim="
                                    f"{cfg.head_dim})")
        if cache.max_seq > cfg.max_position_embeddings:
            raise ParamInvalidError(f"CachedDecoder: cache max_seq ({cache.max_seq}) exceeds the model's "
                                    f"max_position_embeddings ({cfg.max_position_embeddings})")
        self.model, self.cache, self.config = model, cache, cfg
        m = model.model
        self.embed = m.embed_tokens.weight
        self.norm_w, self.eps = m.norm.weight, cfg.rms_norm_eps
        self.cos, self.sin = m.rope_cos, m.rope_sin
        self.out_w = model.output_weight
        self.layers = []
        for layer in m.layers:
            p = _Layer()
            a, mlp = layer.self_attn, layer.mlp
            p.ln1, p.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
            p.wq, p.wk, p.wv, p.wo = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight
            p.wg, p.wu, p.wd = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
            self.layers.append(p)

    def _check(self, tokens: np.ndarray, slots: np.ndarray, starts: np.ndarray) -> None:
        B, S = tokens.shape
        c = self.cache
        if slots.shape != (B,) or starts.shape != (B,):
            raise ParamInvalidError(f"CachedDecoder: slots and starts must have shape (B={B},), got "
                                    f"{slots.shape} and {starts.shape}")
        if B and (slots.min() < 0 or slots.max() >= c.max_batch_slots or len(set(slots.tolist())) != B):
            raise ParamInvalidError(f"CachedDecoder: slots must be distinct in [0, {c.max_batch_slots}), "
                                    f"got {slots.tolist()}")
        if B and (starts.min() < 0 or starts.max() + S > c.max_seq):
            raise ParamInvalidError(f"CachedDecoder: positions starts+S must fit the cache (max_seq={c.max_seq}), "
                                    f"got starts {starts.tolist()} with S={S}")

    def forward(self, tokens, slots, starts, *, all_positions: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, np.int64)
        slots = np.asarray(slots, np.int64).reshape(-1)
        starts = np.asarray(starts, np.int64).reshape(-1)
        if tokens.ndim != 2:
            raise ParamInvalidError(f"CachedDecoder: tokens must be (batch, seq), got shape {tokens.shape}")
        self._check(tokens, slots, starts)
        cfg, cache = self.config, self.cache
        B, S = tokens.shape
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        pos = as_tensor(starts[:, None] + np.arange(S, dtype=np.int64)[None, :])
        # attention runs over the slot range [lo, hi): row r of the call is slot lo + r; slots in the
        # range that are not in this batch get length 0 (the kernel writes zeros for them, reads nothing)
        lo, hi = int(slots.min()), int(slots.max()) + 1
        rows = slots - lo
        packed = hi - lo == B and bool((rows == np.arange(B)).all())
        kvlen = np.zeros(hi - lo, np.int64)
        kvlen[rows] = starts + S
        kvlen_t = as_tensor(kvlen)
        cache.lengths[slots] = starts + S

        h = ops.embedding(as_tensor(tokens), self.embed)
        for i, p in enumerate(self.layers):
            x = ops.rms_norm(h, H, p.ln1, eps=self.eps)
            q = ops.rotary_embedding(ops.linear(x, p.wq), self.cos, self.sin, pos, num_heads=Hq)
            k = ops.rotary_embedding(ops.linear(x, p.wk), self.cos, self.sin, pos, num_heads=Hkv)
            v = ops.linear(x, p.wv)
            cache.write(i, slots, starts, k.numpy().reshape(B, S, Hkv, D), v.numpy().reshape(B, S, Hkv, D))
            q4 = q.reshape(B, S, Hq, D).transpose(1, 2)  # (B, Hq, S, D) view
            if not packed:
                qf = Tensor(np.zeros((hi - lo, Hq, S, D), np.float32))
                qf.numpy()[rows] = q4.numpy()
                q4 = qf
            kc, vc = cache.view(i, lo, hi)
            y = ops.attention(q4, kc, vc, None, None, None, kvlen_t, is_causal=True)
            if not packed:
                y = Tensor(y.numpy()[rows])
            y = y.transpose(1, 2).reshape(B, S, Hq * D)
            h = ops.add(h, ops.linear(y, p.wo))
            x = ops.rms_norm(h, H, p.ln2, eps=self.eps)
            h = ops.add(h, ops.linear(ops.swiglu(ops.linear(x, p.wg), ops.linear(x, p.wu)), p.wd))
        if not all_positions and S > 1:
            h = h[:, S - 1:, :]
        logits = ops.linear(ops.rms_norm(h, H, self.norm_w, eps=self.eps), self.out_w).numpy()
        return logits if all_positions else logits.reshape(B, -1)


__all__ = ["CachedDecoder"]
