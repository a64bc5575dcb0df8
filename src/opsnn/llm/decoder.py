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

from collections import OrderedDict

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
        # decode steps (one token per row, rows = a contiguous slot range) replay executors
        # prepared once per (rows, slot range): see _DecodeStep
        self._steps: "OrderedDict[tuple, _DecodeStep]" = OrderedDict()
        self._seen: dict = {}

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
        if S == 1 and not all_positions:
            step = self._decode_step(lo, hi)
            if step is not None:
                cache.lengths[slots] = starts + S
                return step.run(tokens, slots, starts, rows)
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

    def release_steps(self) -> None:
        """Drop the prepared decode steps (their activation buffers go back to the pool)."""
        self._steps.clear()
        self._seen.clear()

    def _decode_step(self, lo: int, hi: int):
        """The prepared decode step over cache slots ``lo .. hi-1`` (any subset of them may
        decode), built the second time that range comes (a one-off range runs eagerly), at most
        ``MAX_DECODE_STEPS`` kept (least recently used dropped)."""
        key = (lo, hi)
        step = self._steps.get(key)
        if step is not None:
            self._steps.move_to_end(key)
            return step
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] < 2:
            return None
        if len(self._seen) > 64:
            self._seen.clear()
        step = _DecodeStep(self, lo, hi)
        self._steps[key] = step
        while len(self._steps) > MAX_DECODE_STEPS:
            self._steps.popitem(last=False)
        return step


#: prepared decode steps a CachedDecoder keeps (each holds its activation buffers: a few KB per row)
MAX_DECODE_STEPS = 4


class _DecodeStep:
    """One decode step over the cache slots ``lo .. hi-1`` (one token per slot) as a list of
    executors prepared once on fixed buffers and replayed: the same kernels and plans the
    eager ops pick, without the per-op dispatch (signature, executor cache lookup, output
    allocation: ~40-50 us an op on the AVX2 dev VM, ~180 ops a step). Every slot of the range
    is a row (as CUDA-graph batch buckets pad), so a batch whose members come and go within
    the range reuses the step: rows not in this call get token 0 at position 0 and filled
    length 0 (attention reads nothing for them), their K/V are not stored, and the final norm
    and the vocabulary projection (the largest GEMM) run eagerly on the decoding rows only. Per call the tokens, positions and filled lengths are written into the bound
    tensors; the new K/V go into the cache between the projections and attention, as in the
    eager path."""

    def __init__(self, dec: "CachedDecoder", lo: int, hi: int):
        from .. import aclnn

        cfg, cache = dec.config, dec.cache
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        R = hi - lo
        self.dec, self.R, self.Hkv, self.D = dec, R, Hkv, D
        self.tokens = Tensor(np.zeros((R, 1), np.int64))
        self.pos = Tensor(np.zeros((R, 1), np.int64))
        self.kvlen = Tensor(np.zeros(R, np.int64))
        self.plan: list = []  # executors, and ("kv", layer, k, v) where the new K/V go into the cache

        def add(ex):
            self.plan.append(ex)
            return ex.outputs[0]

        h = add(aclnn.embedding.prepare(self.tokens, dec.embed))
        for i, p in enumerate(dec.layers):
            x = add(aclnn.rms_norm.prepare(h, H, p.ln1, eps=dec.eps))
            q = add(aclnn.rotary_embedding.prepare(add(aclnn.linear.prepare(x, p.wq)), dec.cos, dec.sin, self.pos,
                                                   num_heads=Hq))
            k = add(aclnn.rotary_embedding.prepare(add(aclnn.linear.prepare(x, p.wk)), dec.cos, dec.sin, self.pos,
                                                   num_heads=Hkv))
            v = add(aclnn.linear.prepare(x, p.wv))
            self.plan.append(("kv", i, k, v))
            kc, vc = cache.view(i, lo, hi)
            q4 = Tensor(q.numpy().reshape(R, 1, Hq, D).transpose(0, 2, 1, 3))  # (R, Hq, 1, D) view
            y = add(aclnn.attention.prepare(q4, kc, vc, None, None, None, self.kvlen, is_causal=True))
            y = Tensor(y.numpy().reshape(R, 1, Hq * D))  # (R, Hq, 1, D) is (R, 1, Hq*D) in memory
            h = add(aclnn.add.prepare(h, add(aclnn.linear.prepare(y, p.wo))))
            x = add(aclnn.rms_norm.prepare(h, H, p.ln2, eps=dec.eps))
            gu = aclnn.swiglu.prepare(add(aclnn.linear.prepare(x, p.wg)), add(aclnn.linear.prepare(x, p.wu)))
            h = add(aclnn.add.prepare(h, add(aclnn.linear.prepare(add(gu), p.wd))))
        self.h, self.H = h, H  # the final norm and the vocabulary projection run on the decoding rows only

    def run(self, tokens: np.ndarray, slots: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Logits (B, vocab) for ``tokens`` (B, 1) of the slots ``slots`` (range rows ``rows``)."""
        B, cache = len(rows), self.dec.cache
        full = len(rows) == self.R and bool((rows == np.arange(self.R)).all())  # every row, in range order
        tok, pos, kvlen = self.tokens.numpy(), self.pos.numpy(), self.kvlen.numpy()
        if not full:
            tok[:] = 0
            pos[:] = 0
            kvlen[:] = 0
        tok[rows] = tokens
        pos[rows, 0] = starts
        kvlen[rows] = starts + 1
        for ex in self.plan:
            if type(ex) is tuple:
                _, i, k, v = ex
                k = k.numpy().reshape(self.R, 1, self.Hkv, self.D)
                v = v.numpy().reshape(self.R, 1, self.Hkv, self.D)
                cache.write(i, slots, starts, k if full else k[rows], v if full else v[rows])
            else:
                ex.run()
        h = self.h if full else Tensor(self.h.numpy()[rows])  # a copy: the buffer is the next step's
        dec = self.dec
        logits = ops.linear(ops.rms_norm(h, self.H, dec.norm_w, eps=dec.eps), dec.out_w).numpy()
        return logits.reshape(B, -1)


__all__ = ["CachedDecoder"]
