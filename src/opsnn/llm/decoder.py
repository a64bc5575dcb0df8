"""The cached forward of a LLaMA model: prefill chunks and batched decode steps that write
keys/values into a :class:`~opsnn.llm.cache.KVCache` in place and attend over views of it.

It reads the parameters of an ``opsnn.models.llama`` model and runs the same ops as the
model's own ``forward``; what differs is where K/V live (and, with Intel MKL, that the
projections read MKL's packed panels of the weights: a packed copy of each projection
weight, made on first use and kept by the model for every later decoder, dropped by
``load_state_dict``; a weight changed in place by other means keeps its old panel). The
model's forward concatenates ``past`` and the new K/V into fresh tensors each call; here
the new K/V are stored at each request's offset in the preallocated buffers and the fused
``Attention`` op gets the buffers' rows plus ``nonpad_kv_seqlen`` (each row's filled
length), so rows of different lengths share one call and the kernel never reads past a
row's length::

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

import weakref
from collections import OrderedDict

import numba as nb
import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..errors import ParamInvalidError
from ..kernels.cpu import gemm_packed as _gp
from ..kernels.cpu import libraries as _libs
from ..kernels.cpu import mkl as _mkl
from ..kernels.cpu import mkl_nb as _mkl_nb
from ..kernels.cpu import onednn as _onednn
from ..kernels.cpu.attention import CAUSAL_BLOCK_ROWS
from ..kernels.cpu.attention import tasks_balance as attention_tasks_balance
from ..kernels.cpu.gemm import f32_to_bf16, gemm_rows_parallel, gemv_bf16
from ..ops import tiering as _tiering
from ..ops.defs.attention import GEMM_MAX_SCORE_BYTES
from ..runtime import hooks, kernel_cache
from ..runtime.context import context
from ..runtime.stream import current_stream
from ..tensor import Tensor, _alloc_array, as_tensor
from . import fused as _fused
from . import layers as _layers
from .attention import decode_attention, rope_store, rope_store_numpy, rope_store_rows, rope_store_rows_numpy
from .cache import KVCache

_F32 = np.dtype(np.float32)


class _Layer:
    __slots__ = ("ln1", "wq", "wk", "wv", "wo", "ln2", "wg", "wu", "wd")


class CachedDecoder:
    """``forward(tokens, slots, starts)``: run tokens (B, S) of B requests, row ``b`` sitting
    at positions ``starts[b] .. starts[b]+S-1`` of cache slot ``slots[b]``; returns the logits
    of each row's last position as a (B, vocab) float32 numpy array (``all_positions=True``:
    (B, S, vocab))."""

    def __init__(self, model, cache: KVCache):
        cfg = model.config
        if (cache.layers, cache.kv_heads, cache.head_dim) != (
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.head_dim,
        ):
            raise ParamInvalidError(
                f"CachedDecoder: cache (layers={cache.layers}, kv_heads={cache.kv_heads}, "
                f"head_dim={cache.head_dim}) does not fit the model (layers="
                f"{cfg.num_hidden_layers}, kv_heads={cfg.num_key_value_heads}, head_dim="
                f"{cfg.head_dim})"
            )
        if cache.max_seq > cfg.max_position_embeddings:
            raise ParamInvalidError(
                f"CachedDecoder: cache max_seq ({cache.max_seq}) exceeds the model's "
                f"max_position_embeddings ({cfg.max_position_embeddings})"
            )
        self.model, self.cache, self.config = model, cache, cfg
        m = model.model
        self.embed = m.embed_tokens.weight
        # a model cast to bfloat16 (Module.to) keeps its weights in bf16 (half the memory); the
        # activations, the KV cache and the small vectors stay float32 (the norms' weights and the
        # RoPE tables are widened once here), and the projections run on MKL's bf16 GEMM (_linear)
        self.norm_w, self.eps = _f32(m.norm.weight), cfg.rms_norm_eps
        self.cos, self.sin = _f32(m.rope_cos), _f32(m.rope_sin)
        self.out_w = model.output_weight
        self._scale = 1.0 / float(np.sqrt(cfg.head_dim))  # the Attention op's default scale
        self.layers = []
        for layer in m.layers:
            p = _Layer()
            a, mlp = layer.self_attn, layer.mlp
            p.ln1, p.ln2 = _f32(layer.input_layernorm.weight), _f32(layer.post_attention_layernorm.weight)
            p.wq, p.wk, p.wv, p.wo = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight
            p.wg, p.wu, p.wd = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight
            self.layers.append(p)
        # float32 projection weights packed once by MKL (cblas_sgemm_pack), shared by every
        # forward and decode step whatever its row count, and by every decoder of the model
        # (generate() builds one per call): see _linear
        self._packs = None if _mkl.unavailable() else _model_packs(model)
        self._bf16 = _mkl.bf16_unavailable() is None  # bf16 weights: MKL's bf16 GEMM (else widened per call)
        # decode steps (one token per row, any slots) replay executors prepared once per row
        # count bucket: see _DecodeStep
        self._steps: OrderedDict[int, _DecodeStep] = OrderedDict()
        #: prepared steps run each layer as opsnn.llm.fused's four regions (float32 weights, MKL);
        #: False: op by op (the kernels the eager path runs)
        self.fused_steps = True
        #: prompt chunks' layers (forward of S > 1 rows, prefill) run as one kernel call
        #: (opsnn.llm.layers; float32 weights, MKL); False: op by op
        self.fused_prefill = True

    def _check(self, tokens: np.ndarray, slots: np.ndarray, starts: np.ndarray) -> None:
        B, S = tokens.shape
        c = self.cache
        if slots.shape != (B,) or starts.shape != (B,):
            raise ParamInvalidError(
                f"CachedDecoder: slots and starts must have shape (B={B},), got {slots.shape} and {starts.shape}"
            )
        if B and (slots.min() < 0 or slots.max() >= c.max_batch_slots or len(set(slots.tolist())) != B):
            raise ParamInvalidError(
                f"CachedDecoder: slots must be distinct in [0, {c.max_batch_slots}), got {slots.tolist()}"
            )
        if B and (starts.min() < 0 or starts.max() + S > c.max_seq):
            raise ParamInvalidError(
                f"CachedDecoder: positions starts+S must fit the cache (max_seq={c.max_seq}), "
                f"got starts {starts.tolist()} with S={S}"
            )

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
        if S == 1 and not all_positions:
            step = self._decode_step(B)
            if step is not None:
                cache.lengths[slots] = starts + S
                return step.run(tokens, slots, starts)
        pos = (starts[:, None] + np.arange(S, dtype=np.int64)[None, :]).reshape(-1)  # row b*S+s's position
        row_slots = np.repeat(slots, S)
        # prefill attention runs over the slot range [lo, hi): row r of the call is slot lo + r; slots in
        # the range that are not in this batch get length 0 (the kernel writes zeros for them, reads nothing)
        lo, hi = int(slots.min()), int(slots.max()) + 1
        rows = slots - lo
        packed = hi - lo == B and bool((rows == np.arange(B)).all())
        kvlen = np.zeros(hi - lo, np.int64)
        kvlen[rows] = starts + S
        kvlen_t = as_tensor(kvlen)
        cache.lengths[slots] = starts + S
        fresh = S > 1 and not starts.any()
        # a continued prefill chunk attends over the cache: by GEMM (scores over the keys up to
        # the furthest row's end), as whole prompts are, while the score matrix stays moderate
        t_end = int(starts.max()) + S
        algo = "attention_gemm" if 4 * (hi - lo) * Hq * S * t_end <= GEMM_MAX_SCORE_BYTES else None

        h = self._embed(as_tensor(tokens))
        fused = S > 1 and self._prefill_fused(h, np.arange(B + 1) * S, starts, slots, pos, row_slots)
        layers = [] if fused else self.layers
        for i, p in enumerate(layers):
            x = ops.rms_norm(h, H, p.ln1, eps=self.eps)
            q, k, v = self._rope_store(i, *self._linear_cat(x, (p.wq, p.wk, p.wv)), pos, row_slots)
            if S == 1:  # decode: the kernel the prepared steps run (see _attend_decode)
                y = Tensor(_alloc_array((B, 1, Hq * D), _F32, "llm decode attention"))
                y._producer = self._attend_decode(i, q.numpy(), slots, starts + 1, y.numpy())
            elif fresh:  # whole prompts from position 0: causal attention over their own K/V, which
                # the fused op serves by GEMM (the cache path's flash kernel streams key blocks: 2x slower)
                y = ops.attention(
                    q.reshape(B, S, Hq, D).transpose(1, 2),
                    k.reshape(B, S, Hkv, D).transpose(1, 2),
                    v.reshape(B, S, Hkv, D).transpose(1, 2),
                    is_causal=True,
                )
                y = y.transpose(1, 2).reshape(B, S, Hq * D)
            else:
                q4 = q.reshape(B, S, Hq, D).transpose(1, 2)  # (B, Hq, S, D) view
                if not packed:
                    qf = Tensor(np.zeros((hi - lo, Hq, S, D), np.float32))
                    qf.numpy()[rows] = q4.numpy()
                    q4 = qf
                # keys up to the furthest row's end only, so the GEMM kernel's scores cover what is read
                kc, vc = (t[:, :, :t_end] for t in cache.view(i, lo, hi))
                y = ops.attention(q4, kc, vc, None, None, None, kvlen_t, is_causal=True, algo=algo)
                if not packed:
                    y = Tensor(y.numpy()[rows])
                y = y.transpose(1, 2).reshape(B, S, Hq * D)
            h = self._linear(y, p.wo, residual=h)
            x = ops.rms_norm(h, H, p.ln2, eps=self.eps)
            h = self._linear(self._swiglu(x, p.wg, p.wu), p.wd, residual=h)
        if not all_positions and S > 1:
            h = h[:, S - 1 :, :]
        logits = self._linear(ops.rms_norm(h, H, self.norm_w, eps=self.eps), self.out_w).numpy()
        return logits if all_positions else logits.reshape(B, -1)

    def prefill(self, chunks) -> np.ndarray:
        """Prefill several requests' prompt chunks in one forward: ``chunks`` is a list of
        ``(tokens, slot, start)`` (1-D tokens at positions ``start ..`` of cache ``slot``). Their
        tokens run as one sequence of rows through every row-wise op (one GEMM per weight over
        all of them); each chunk stores its K/V and attends (causal, over its own cache row) on
        its own. Returns the logits of each chunk's last position, (len(chunks), vocab)."""
        if len(chunks) == 1:
            t, slot, start = chunks[0]
            return self.forward(np.asarray(t, np.int64)[None], [slot], [start])
        cfg, cache = self.config, self.cache
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        toks = [np.asarray(t, np.int64).reshape(-1) for t, _, _ in chunks]
        slots = np.array([int(s) for _, s, _ in chunks], np.int64)
        starts = np.array([int(st) for _, _, st in chunks], np.int64)
        for t, s, st in zip(toks, slots, starts):
            if t.size == 0:
                raise ParamInvalidError("CachedDecoder.prefill: a chunk has no tokens")
            self._check(t[None], s[None], st[None])
        if len(set(slots.tolist())) != len(slots):
            raise ParamInvalidError(f"CachedDecoder.prefill: slots must be distinct, got {slots.tolist()}")
        lens = np.array([t.size for t in toks], np.int64)
        ends = np.cumsum(lens)
        N = int(ends[-1])
        pos = np.concatenate([st + np.arange(n, dtype=np.int64) for st, n in zip(starts, lens)])
        row_slots = np.repeat(slots, lens)
        cache.lengths[slots] = starts + lens
        h = self._embed(as_tensor(np.concatenate(toks)[None]))  # (1, N, H)
        fused = self._prefill_fused(h, np.append(0, ends), starts, slots, pos, row_slots)  # every layer, one call
        for i, p in enumerate([] if fused else self.layers):
            x = ops.rms_norm(h, H, p.ln1, eps=self.eps)
            q, k, v = (t.numpy() for t in self._rope_store(i, *self._linear_cat(x, (p.wq, p.wk, p.wv)), pos, row_slots))
            y = Tensor(_alloc_array((1, N, Hq * D), _F32, "llm prefill attention"))
            yn = y.numpy()
            for c in range(len(chunks)):
                a, b, n, st = int(ends[c] - lens[c]), int(ends[c]), int(lens[c]), int(starts[c])
                kc4, vc4 = k[0, a:b].reshape(1, n, Hkv, D), v[0, a:b].reshape(1, n, Hkv, D)
                q4 = Tensor(q[0, a:b].reshape(1, n, Hq, D)).transpose(1, 2)
                if st == 0:  # a whole prompt: over its own K/V (attention_gemm)
                    yc = ops.attention(q4, Tensor(kc4).transpose(1, 2), Tensor(vc4).transpose(1, 2), is_causal=True)
                else:  # a continued chunk: over its cache row up to its end
                    sl = int(slots[c])
                    kc, vc = (t[:, :, : st + n] for t in cache.view(i, sl, sl + 1))
                    algo = "attention_gemm" if 4 * Hq * n * (st + n) <= GEMM_MAX_SCORE_BYTES else None
                    yc = ops.attention(
                        q4, kc, vc, None, None, None, as_tensor(np.array([st + n], np.int64)), is_causal=True, algo=algo
                    )
                yn[0, a:b] = yc.numpy().transpose(0, 2, 1, 3).reshape(n, Hq * D)
            h = self._linear(y, p.wo, residual=h)
            x = ops.rms_norm(h, H, p.ln2, eps=self.eps)
            h = self._linear(self._swiglu(x, p.wg, p.wu), p.wd, residual=h)
        last = Tensor(np.ascontiguousarray(h.numpy()[0, ends - 1])[:, None, :])  # (chunks, 1, H)
        logits = self._linear(ops.rms_norm(last, H, self.norm_w, eps=self.eps), self.out_w).numpy()
        return logits.reshape(len(chunks), -1)

    def _prefill_fused(
        self, h: Tensor, bounds: np.ndarray, starts: np.ndarray, slots: np.ndarray, pos, row_slots
    ) -> bool:
        """Every layer of prompt chunks (chunk ``c`` is rows ``bounds[c] .. bounds[c + 1] - 1`` of
        ``h``, their embeddings, at positions ``starts[c]`` on of cache slot ``slots[c]``; ``pos``
        and ``row_slots`` per row) as one kernel call, :func:`opsnn.llm.layers.prefill_layers`,
        launched on the current stream: ``h`` is updated in place and carries the launch as its
        producer. False (nothing run) where the op-by-op path must run: ``fused_prefill`` off, an
        observer or the memory checker attached (they see each kernel there), no MKL panels for
        every projection, a chunk's scores over GEMM_MAX_SCORE_BYTES (the Attention op's flash
        kernel serves those), or while the kernel compiles in the background."""
        cfg, cache = self.config, self.cache
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        fns = _mkl_nb.addresses()
        hn = h.numpy()
        lens = np.diff(bounds)
        ends = starts + lens
        scores = int((lens * ends).max()) * Hq
        if (
            not self.fused_prefill
            or hooks.active
            or context().pool.guard_bytes
            or fns is None
            or hn.dtype != _F32
            or not hn.flags.c_contiguous
            or Hq % Hkv
            or 4 * scores > GEMM_MAX_SCORE_BYTES
            or _libs.attention_gemms().library != "mkl"
            or not all(c.flags.c_contiguous for c in cache._k + cache._v)
        ):
            return False
        nt = nb.get_num_threads()
        # attention: a task per KV head, and per block of query rows where the heads alone leave threads idle
        blocks = 1 if attention_tasks_balance(Hkv) else -(-3 * nt // Hkv)
        rows = int(bounds[-1])
        packs = self._layer_panels(rows)  # kept alive while the kernel reads them by address
        if packs is None:
            return False
        panels = [[w.addr for w in ps] for ps in packs]
        ff = cfg.intermediate_size
        norms = self._norm_weights()
        keys = int(ends[starts > 0].max()) if starts.any() else 0
        alloc = lambda shape, tag: _alloc_array(shape, _F32, tag)  # noqa: E731
        bufs = _layers.prefill_scratch(rows, int(lens.max()), scores, keys, H, Hq, Hkv, D, ff, alloc)
        args = (
            hn.reshape(rows, H),
            norms,
            float(self.eps),
            np.array(panels, np.int64),
            Hq,
            Hkv,
            D,
            ff,
            self.cos.numpy(),
            self.sin.numpy(),
            pos,
            tuple(cache._k),
            tuple(cache._v),
            row_slots,
            bounds.astype(np.int64),
            starts.astype(np.int64),
            slots.astype(np.int64),
            np.float32(self._scale),
            np.int64(CAUSAL_BLOCK_ROWS),
            blocks,
            fns,
            _mkl.threads(),
            nt,
            bufs,
        )
        if kernel_cache.cold(_layers.prefill_layers, args):  # compiling in the background: op by op meanwhile
            return False
        flops = 2 * rows * sum(w.n * w.k for w in packs[0]) * len(packs) + 4 * Hq * D * int((lens * ends).sum())
        info = {"kernel": "llm_prefill_layers", "flops": flops}
        h._producer = _launch(lambda _packs=packs: _layers.prefill_layers(*args), "Prefill", info)
        return True

    def _norm_weights(self) -> np.ndarray:
        """(layers, 2, H) float32: each layer's two RMSNorm weights, as the one-call kernels take them."""
        return np.stack([np.stack([p.ln1.numpy(), p.ln2.numpy()]) for p in self.layers])

    def _layer_panels(self, rows: int) -> list | None:
        """Each layer's MKL panels for ``rows``-row products, (q/k/v stacked, o, gate/up stacked,
        down) in :mod:`opsnn.llm.layers`' order; None when some projection has none."""
        packs = []
        for p in self.layers:
            ps = (
                self._packed_cat((p.wq, p.wk, p.wv), rows),
                self._packed(p.wo, rows),
                self._packed_cat((p.wg, p.wu), rows),
                self._packed(p.wd, rows),
            )
            if not all(isinstance(w, _mkl.PackedWeight) for w in ps):
                return None
            packs.append(ps)
        return packs

    def _embed(self, tokens: Tensor) -> Tensor:
        h = ops.embedding(tokens, self.embed)
        return h if h.dtype == _F32 else ops.cast(h, "float32")

    def _rope_store(self, layer: int, q: Tensor, k: Tensor, v: Tensor, pos: np.ndarray, slots: np.ndarray) -> tuple:
        """RoPE on ``q`` and ``k`` (B, S, heads*D) in place and their keys/values into the cache,
        row ``r`` of the B*S at position ``pos[r]`` of slot ``slots[r]``: one kernel launched on
        the current stream, in place of two RotaryEmbedding ops and the cache's store. Returns
        the rotated (q, k, v)."""
        cfg = self.config
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        shapes = (q.shape, k.shape, v.shape)
        # the projections' outputs (column views of one GEMM's output, or the Linear op's): the
        # reshapes are views, so the kernel rotates the arrays attention reads
        qa, ka, va = (t.numpy().reshape(-1, n, D) for t, n in ((q, Hq), (k, Hkv), (v, Hkv)))
        args = (qa, ka, va, self.cos.numpy(), self.sin.numpy(), pos, self.cache._k[layer], self.cache._v[layer], slots)
        # numpy while rope_store_rows compiles in the background (opsnn.ops.tiering)
        cold = kernel_cache.cold(rope_store_rows, args)
        fn, kernel = (rope_store_rows_numpy, "llm_rope_store_numpy") if cold else (rope_store_rows, "llm_rope_store")
        done = _launch(fn, "RotaryEmbedding", {"kernel": kernel}, args)
        return tuple(Tensor(a.reshape(shape), "ND", done) for a, shape in zip((qa, ka, va), shapes))

    def _packed(self, w: Tensor, rows: int):
        """How MKL multiplies ``rows`` rows by the projection weight ``w`` (N, K): its packed
        panel (packed on first use) for two or more rows, the weight itself (``cblas_sgemv``)
        for one, a :class:`_Bf16Weight` for a bfloat16 weight; None without MKL or for another
        dtype (the Linear op runs then)."""
        if w.dtype == _BF16 and w.ndim == 2 and self._bf16:
            return _Bf16Weight(w.numpy().view(np.uint16))
        if self._packs is None or w.dtype != _F32 or w.ndim != 2:
            return None
        if _libs.projection(rows, w.shape[1], w.shape[0], _F32).kernel == "llm_linear_mkl_gemv":
            return np.ascontiguousarray(w.numpy())  # MKL's sgemv streams the weight once: packing buys nothing
        return self._pack_stacked((w,), rows)

    def _pack_stacked(self, ws: tuple, rows: int):
        """MKL's panel of the weights ``ws`` (each (N_i, K)) stacked along N, packed on first use
        and kept in the model's packs; packed again when a weight was given a new array. Where
        the strategy runs ``rows`` rows on another library
        (:func:`opsnn.kernels.cpu.libraries.weight_stays_unpacked`), the stacked weight itself as a
        :class:`_PlainWeight`, or opsnn's own panels (:class:`_OwnPanels`) where the strategy picks
        its packed GEMM."""
        n, k = sum(w.shape[0] for w in ws), ws[0].shape[1]
        own = _libs.projection(rows, k, n, _F32).kernel == "llm_linear_packed"
        plain = not own and _libs.weight_stays_unpacked(rows, k, n)
        packs, key = self._packs, tuple(id(w) for w in ws) + ("own" if own else plain,)
        got = packs.get(key)
        if (
            got is not None
            and all(r() is w for r, w in zip(got[0], ws))
            and all(r() is w._array for r, w in zip(got[1], ws))
        ):
            return got[2]
        arr = ws[0].numpy() if len(ws) == 1 else np.concatenate([w.numpy() for w in ws])
        if own:
            p = _OwnPanels(_gp.pack(arr, transpose=True), n, k)
        elif plain:
            p = _PlainWeight(np.ascontiguousarray(arr))
        else:
            p = _mkl.pack(arr, max(self.cache.max_batch_slots, PANEL_ROWS), transpose=True)
        packs[key] = (tuple(weakref.ref(w) for w in ws), tuple(weakref.ref(w._array) for w in ws), p)
        weakref.finalize(ws[0], packs.pop, key, None)  # the entry goes with the (first) weight tensor
        return p

    def _packed_cat(self, ws: tuple, rows: int):
        """One packed panel of the projection weights ``ws`` stacked along N (q/k/v, or gate
        and up): one GEMM instead of two or three, each wider (docs/kernel-libraries.md).
        None when the weights would not each be a packed panel (one row: matrix-vector products
        read each weight once either way; bf16 weights; no MKL)."""
        if (
            rows < 2
            or self._packs is None
            or any(w.dtype != _F32 or w.ndim != 2 for w in ws)
            or len({w.shape[1] for w in ws}) != 1
        ):
            return None
        return self._pack_stacked(ws, rows)

    def _linear_cat(self, x: Tensor, ws: tuple) -> list:
        """``[x @ w.T for w in ws]``: one GEMM on :meth:`_packed_cat`'s panel (the results are
        column views of its output), else a product per weight."""
        rows = int(np.prod(x.shape[:-1]))
        p = self._packed_cat(ws, rows)
        if p is None:
            return [self._linear(x, w) for w in ws]
        xa = np.ascontiguousarray(x.numpy(), dtype=_F32)
        out = _alloc_array(xa.shape[:-1] + (p.n,), _F32, "llm linear")
        done = _launch(*_mkl_product(xa.reshape(-1, xa.shape[-1]), p, out.reshape(-1, p.n)))
        return [Tensor(o, "ND", done) for o in _split_columns(out, ws)]

    def _swiglu(self, x: Tensor, wg: Tensor, wu: Tensor) -> Tensor:
        """SiLU(x @ wg.T) * (x @ wu.T): gate and up as one GEMM when :meth:`_packed_cat` packs them."""
        g, u = self._linear_cat(x, (wg, wu))
        return ops.swiglu(g, u)

    def _linear(self, x: Tensor, w: Tensor, residual: Tensor | None = None) -> Tensor:
        """``x @ w.T`` (the model's bias-free projections), plus ``residual`` when given. With MKL
        every product runs on it (:meth:`_packed`): a decode step's GEMMs have 1..32 rows, where
        OpenBLAS's unpacked GEMM is 2-3x slower than MKL's packed one, and a step that mixed the
        two libraries would have OpenBLAS's spinning workers fight the OpenMP pool that MKL shares
        with numba. There the GEMM adds into ``residual``'s buffer (beta = 1, no Add), so it must be
        the forward's own activation (the embedding's output, accumulated), returned updated."""
        if residual is not None:
            hn = residual.numpy()
            if hn.dtype != _F32 or not hn.flags.c_contiguous:
                return ops.add(residual, self._linear(x, w))
        p = self._packed(w, int(np.prod(x.shape[:-1])))
        if p is None:
            y = ops.linear(x, w if w.dtype == x.dtype else ops.cast(w, x.dtype))
            return y if residual is None else ops.add(residual, y)
        xa = np.ascontiguousarray(x.numpy(), dtype=_F32)
        n = _out_features(p)
        out = _alloc_array(xa.shape[:-1] + (n,), _F32, "llm linear") if residual is None else hn
        done = _launch(*_mkl_product(xa.reshape(-1, xa.shape[-1]), p, out.reshape(-1, n), residual is not None))
        if residual is None:
            return Tensor(out, "ND", done)
        residual._producer = done
        return residual

    def _attend_decode(self, layer: int, q: np.ndarray, slots: np.ndarray, lengths: np.ndarray, y: np.ndarray) -> tuple:
        """Attention of one query token per row (q: (B, 1, Hq*D)) over the first ``lengths[b]``
        cache positions of slot ``slots[b]``, into y (B, 1, Hq*D): every decode step, eager or
        replayed, runs this one kernel (launched on the current stream, so the profiler sees it).
        Returns the producer y's Tensor carries."""
        return self._launch_attention(self._attention_kernel(layer, q, slots, lengths, y), lengths)

    def _launch_attention(self, kernel, lengths: np.ndarray, name: str = "llm_decode_attention") -> tuple:
        """Launch a :meth:`_attention_kernel` closure on the current stream (the profiler sees it);
        returns its producer (:func:`_launch`)."""
        flops = 4 * int(lengths.sum()) * self.config.num_attention_heads * self.config.head_dim
        return _launch(kernel, "Attention", {"kernel": name, "flops": flops})

    def _attention_kernel(self, layer: int, q: np.ndarray, slots: np.ndarray, lengths: np.ndarray, y: np.ndarray):
        """The decode attention of :meth:`_attend_decode` as a closure over these arrays (read
        when it runs: a prepared step rewrites ``slots`` and ``lengths`` in place)."""
        cfg, cache = self.config, self.cache
        B, Hq, D = len(slots), cfg.num_attention_heads, cfg.head_dim
        q4 = q.reshape(B, 1, Hq, D).transpose(0, 2, 1, 3)
        y4 = y.reshape(B, Hq, 1, D)  # (B, Hq, 1, D) is (B, 1, Hq*D) in memory
        kc, vc = cache._k[layer], cache._v[layer]
        par = self._packs is not None  # then the step's GEMMs are MKL's (see _packed): no OpenBLAS workers
        scale = self._scale
        return lambda: decode_attention(q4, kc, vc, slots, lengths, y4, scale, par)

    def release_steps(self) -> None:
        """Drop the prepared decode steps (their activation buffers go back to the pool)."""
        self._steps.clear()

    def _decode_step(self, B: int) -> _DecodeStep:
        """The prepared decode step for ``B`` rows: the one of the row-count bucket
        (:func:`decode_bucket`) that holds them, built on first use, at most ``MAX_DECODE_STEPS``
        kept (least recently used dropped)."""
        R = decode_bucket(B, self.cache.max_batch_slots)
        step = self._steps.get(R)
        if step is not None and step.cold and _tiering.all_cached(step.cold):
            step = None  # the background compile finished: rebuilt on the numba kernels
        if step is not None:
            self._steps.move_to_end(R)
            return step
        step = _DecodeStep(self, R)
        self._steps[R] = step
        while len(self._steps) > MAX_DECODE_STEPS:
            self._steps.popitem(last=False)
        return step


def decode_bucket(rows: int, max_rows: int) -> int:
    """Rows a decode step of ``rows`` requests runs: 1 and 2 as they are, then the next multiple
    of 4 (at most ``max_rows``), so a batch whose size drifts as requests come and go reuses a
    few prepared steps, and pads at most 3 rows (their GEMM rows are the only waste: attention
    reads nothing for them)."""
    return rows if rows <= 2 else min(max_rows, -(-rows // 4) * 4)


#: decode steps of up to this many rows run fused (opsnn.llm.fused); larger batches keep the
#: op-by-op step, whose products read MKL's packed panels: unpacked, a thread's share of a
#: weight is slower to multiply by more rows (measured: docs/kernel-libraries.md)
FUSED_MAX_ROWS = 2

#: the row count a projection's MKL panel is packed for: MKL sizes the panel's blocking by it and
#: every product, prefill's and decode's, reads the one panel; 128-256 suit 8 to 512 rows alike,
#: a few rows' blocking slows prefill's products (docs/performance.md)
PANEL_ROWS = 256

#: prepared decode steps a CachedDecoder keeps (each holds its activation buffers: a few KB per row)
MAX_DECODE_STEPS = 8


class _DecodeStep:
    """One decode step of up to ``R`` rows (one token each, any cache slots) as a list of
    executors prepared once on fixed buffers and replayed: the same kernels and plans the
    eager ops pick, without the per-op dispatch (signature, executor cache lookup, output
    allocation: ~40-50 us an op on the AVX2 dev VM, ~180 ops a step). A call with B < R rows
    fills rows 0..B-1; the pad rows get token 0 at position 0 and filled length 0 (attention
    reads nothing for them) and their K/V are not stored. The final norm and the vocabulary
    projection (the largest GEMM) run eagerly on the B rows only. Per call the tokens,
    positions, slots and filled lengths are written into the bound buffers; the new K/V go
    into the cache between the projections and attention, as in the eager path."""

    def __init__(self, dec: CachedDecoder, R: int):
        from .. import aclnn

        cfg = dec.config
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.dec, self.R = dec, R
        self.tokens = Tensor(np.zeros((R, 1), np.int64))
        self.pos = Tensor(np.zeros((R, 1), np.int64))
        self.kvlen = np.zeros(R, np.int64)
        self.slots = np.zeros(R, np.int64)
        self.B = 0
        #: tiering keys of the fused kernels this step runs numpy stand-ins for (empty: the kernels run)
        self.cold: tuple = ()
        self.plan: list = []  # callables: executors' run, K/V stores, attention
        self.kernels: list = []  # the same steps as bare kernel calls (see run)

        def add(ex, lists=(self.plan, self.kernels)):
            lists[0].append(ex.run)
            lists[1].append(ex.bound_kernel())
            return ex.outputs[0]

        def linear(x, w):  # the Linear op's executor, or the decoder's MKL-packed weight on fixed buffers
            pw = dec._packed(w, R)
            if pw is None:
                if w.dtype != x.dtype:  # bf16 weights without MKL's bf16 GEMM: widened every step
                    w = add(aclnn.cast.prepare(w, "float32"))
                return aclnn.linear.prepare(x, w)
            out = Tensor(_alloc_array(x.shape[:-1] + (_out_features(pw),), _F32, "llm decode linear"))
            return _PackedLinearStep(x.numpy().reshape(-1, x.shape[-1]), pw, out)

        def linears(x, ws):  # x @ w.T for each of ws: one GEMM on a stacked panel when MKL packs them
            pw = dec._packed_cat(ws, R)
            if pw is None:
                return [add(linear(x, w)) for w in ws]
            out = Tensor(_alloc_array(x.shape[:-1] + (pw.n,), _F32, "llm decode linear"))
            add(_PackedLinearStep(x.numpy().reshape(-1, x.shape[-1]), pw, out))
            return [Tensor(o) for o in _split_columns(out.numpy(), ws)]

        def residual(h, y, w):  # h + y @ w.T; on MKL the GEMM adds into h's buffer (beta = 1)
            pw = dec._packed(w, R)
            if pw is None:
                return add(aclnn.add.prepare(h, add(linear(y, w))))
            add(_PackedLinearStep(y.numpy().reshape(-1, y.shape[-1]), pw, h, accumulate=True))
            return h

        h = add(aclnn.embedding.prepare(self.tokens, dec.embed))
        if h.dtype != _F32:  # a bf16 model's table: rows widened to the float32 activations
            h = add(aclnn.cast.prepare(h, "float32"))
        if self._fuse(h):
            return
        pos = self.pos.numpy().reshape(R)
        cos, sin = dec.cos.numpy(), dec.sin.numpy()
        for i, p in enumerate([] if self._fuse_layers(h) else dec.layers):
            x = add(aclnn.rms_norm.prepare(h, H, p.ln1, eps=dec.eps))
            q, k, v = (t.numpy() for t in linears(x, (p.wq, p.wk, p.wv)))
            y = _alloc_array((R, 1, Hq * D), _F32, "llm decode attention")
            # RoPE on q (in place) and k, K/V into the cache, attention: one task (the rotary op per
            # head and the cache's fancy-index store were three more per layer, ~20-30 us each in
            # the step, where the kernels themselves take ~1 us); every row attends (pad rows:
            # length 0, zeros) and pad rows store nothing, so the buffers stay fixed
            attend = dec._attention_kernel(i, q, self.slots, self.kvlen, y)
            kc, vc = dec.cache._k[i], dec.cache._v[i]

            q3, k3, v3 = q.reshape(R, Hq, D), k.reshape(R, Hkv, D), v.reshape(R, Hkv, D)

            def rope_attend(
                q=q3,
                k=k3,
                v=v3,
                kc=kc,
                vc=vc,
                attend=attend,
            ):  # the defaults bind this layer's views once
                args = (q, k, v, cos, sin, pos, kc, vc, self.slots, self.B)
                # numpy while rope_store compiles in the background (opsnn.ops.tiering)
                (rope_store_numpy if kernel_cache.cold(rope_store, args) else rope_store)(*args)
                attend()

            self.plan.append(lambda fn=rope_attend: dec._launch_attention(fn, self.kvlen, "llm_decode_rope_attention"))
            self.kernels.append(rope_attend)
            h = residual(h, Tensor(y), p.wo)
            x = add(aclnn.rms_norm.prepare(h, H, p.ln2, eps=dec.eps))
            gu = aclnn.swiglu.prepare(*linears(x, (p.wg, p.wu)))
            h = residual(h, add(gu), p.wd)
        # the final norm and the vocabulary projection: prepared for all R rows, replayed when
        # the step is full (eagerly on the B decoding rows otherwise); eager after the step's
        # weight streaming, with the interpreter's state cold in cache, the norm's dispatch
        # alone took ~0.4 ms a token (12 layers x hidden 768, one row)
        self.head_plan, self.head_kernels = [], []
        head = (self.head_plan, self.head_kernels)
        self.logits = add(linear(add(aclnn.rms_norm.prepare(h, H, dec.norm_w, eps=dec.eps), head), dec.out_w), head)
        self.h, self.H = h, H

    def _fuse(self, h: Tensor) -> bool:
        """Every layer as the four parallel regions of :mod:`opsnn.llm.fused` (each thread its
        share of a projection's outputs on single-threaded MKL, and what follows from them), the
        final norm and vocabulary projection as a fifth; False (nothing built) for more than
        FUSED_MAX_ROWS rows, without MKL, for other than float32 weights or a cache not C-contiguous."""
        dec = self.dec
        cfg, cache = dec.config, dec.cache
        fns = _mkl_nb.addresses()
        weights = [w for p in dec.layers for w in (p.wq, p.wk, p.wv, p.wo, p.wg, p.wu, p.wd)] + [dec.out_w]
        if (
            not dec.fused_steps
            or self.R > FUSED_MAX_ROWS
            or fns is None
            or dec._packs is None
            or any(w.dtype != _F32 or w.ndim != 2 for w in weights)
            or cfg.head_dim % 2
            or cfg.num_attention_heads % cfg.num_key_value_heads
            or not all(c.flags.c_contiguous for c in cache._k + cache._v)  # fused's attention reads them by address
        ):
            return False
        Hq, D, H, R = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size, self.R
        nt = nb.get_num_threads()
        hv = h.numpy().reshape(R, H)
        q, y = np.empty((R, Hq, 1, D), np.float32), np.empty((R, Hq, 1, D), np.float32)
        gu = np.empty((R, cfg.intermediate_size), np.float32)
        pos = self.pos.numpy().reshape(R)
        cos, sin = dec.cos.numpy(), dec.sin.numpy()
        eps, scale, one = float(dec.eps), np.float32(dec._scale), np.float32(1.0)
        arr = [np.ascontiguousarray(w.numpy()) for w in weights]
        ln1, ln2 = dec.layers[0].ln1.numpy(), dec.layers[0].ln2.numpy()
        f = np.zeros(5, np.int64)  # fused.addresses()'s type: typing needs no compiled callback
        wq, wk, wv, wo, wg, wu, wd = arr[:7]
        kc, vc = cache._k[0], cache._v[0]
        logits = np.empty((R, arr[-1].shape[0]), np.float32)
        norm_w, wout = dec.norm_w.numpy(), arr[-1]
        layers_args = self._layers_args(hv, arr, q, y, gu, pos, cos, sin, eps, scale, nt)
        calls = [
            (
                _fused.attention_block,
                (hv, ln1, eps, wq, wk, wv, cos, sin, pos, kc, vc, self.slots, self.kvlen, R, q, y, scale, f, nt),
            ),
            (_fused.residual_gemm, (wo, y.reshape(R, -1), hv, f, nt)),
            (_fused.mlp_block, (hv, ln2, eps, wg, wu, gu, one, f, nt)),
            (_fused.head_block, (hv, norm_w, eps, wout, logits, f, nt)),
            (_fused.layers_step, layers_args(R, f)),
        ]
        if not _fused._DECODE_CFUNC:
            calls.append((_fused.addresses, None))
        # while their machine code is not cached: numpy stand-ins, the kernels compiling in the background
        self.cold = _tiering.cold_direct(calls)
        if not self.cold:
            fns = _fused.addresses()

        def step(fn, op, kernel, lists=(self.plan, self.kernels)):
            lists[0].append(lambda: current_stream().launch(fn, op, {"kernel": kernel}))
            lists[1].append(fn)

        if self.cold:
            self._fuse_numpy(arr, hv, q, y, gu, logits, pos, cos, sin, eps, scale, step)
            self.logits, self.h, self.H = Tensor(logits), h, H
            return True
        first = len(self.kernels)  # the embedding's kernels come before the layers'
        for i, p in enumerate(dec.layers):
            wq, wk, wv, wo, wg, wu, wd = arr[7 * i : 7 * i + 7]
            kc, vc = cache._k[i], cache._v[i]
            ln1, ln2 = p.ln1.numpy(), p.ln2.numpy()
            step(
                lambda ln1=ln1, wq=wq, wk=wk, wv=wv, kc=kc, vc=vc: _fused.attention_block(
                    hv,
                    ln1,
                    eps,
                    wq,
                    wk,
                    wv,
                    cos,
                    sin,
                    pos,
                    kc,
                    vc,
                    self.slots,
                    self.kvlen,
                    self.B,
                    q,
                    y,
                    scale,
                    fns,
                    nt,
                ),
                "Attention",
                "llm_decode_attention_block",
            )
            step(
                lambda wo=wo: _fused.residual_gemm(wo, y.reshape(R, -1), hv, fns, nt),
                "Linear",
                "llm_decode_residual_gemm",
            )
            step(
                lambda ln2=ln2, wg=wg, wu=wu: _fused.mlp_block(hv, ln2, eps, wg, wu, gu, one, fns, nt),
                "SwiGLU",
                "llm_decode_mlp_block",
            )
            step(lambda wd=wd: _fused.residual_gemm(wd, gu, hv, fns, nt), "Linear", "llm_decode_residual_gemm")
        # unobserved, every layer's regions as one call (the plan keeps a launch a region for observers)
        self.kernels[first:] = [lambda: _fused.layers_step(*layers_args(self.B, fns))]
        self.head_plan, self.head_kernels = [], []
        step(
            lambda: _fused.head_block(hv, norm_w, eps, wout, logits, fns, nt),
            "Linear",
            "llm_decode_head",
            (self.head_plan, self.head_kernels),
        )
        self.logits, self.h, self.H = Tensor(logits), h, H
        return True

    def _layers_args(self, hv, arr, q, y, gu, pos, cos, sin, eps, scale, nt):
        """``(rows, fns) ->`` the arguments of :func:`opsnn.llm.fused.layers_step` (every layer's
        four regions in one call, no Python between them) over this step's buffers."""
        dec, L = self.dec, len(self.dec.layers)
        lns = dec._norm_weights()
        ws = tuple(tuple(arr[j : 7 * L : 7]) for j in range(7))
        kts, vcs = tuple(dec.cache._k), tuple(dec.cache._v)
        return lambda rows, fns: (
            (hv, lns, eps, *ws, cos, sin, pos, kts, vcs, self.slots, self.kvlen, rows, q, y, gu, scale, fns, nt)
        )

    def _fuse_layers(self, h: Tensor) -> bool:
        """Every layer as one call of :func:`opsnn.llm.layers.decode_layers` on MKL's packed panels
        (a step of more than FUSED_MAX_ROWS rows), appended to the plan; False (nothing built)
        with ``fused_steps`` off, without a panel for every projection (no MKL, bf16 weights, the
        strategy's unpacked weights) or while the kernel compiles in the background (``self.cold``:
        the step is built op by op and rebuilt once it is compiled)."""
        dec, R = self.dec, self.R
        cfg, cache = dec.config, dec.cache
        Hq, Hkv, D, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        fns, hv = _mkl_nb.addresses(), h.numpy()
        if (
            not dec.fused_steps
            or fns is None
            or dec._packs is None
            or hv.dtype != _F32
            or not hv.flags.c_contiguous
            or Hq % Hkv
            or not all(c.flags.c_contiguous for c in cache._k + cache._v)
        ):
            return False
        packs = dec._layer_panels(R)
        if packs is None:
            return False
        panels = np.array([[w.addr for w in ps] for ps in packs], np.int64)
        norms = dec._norm_weights()
        ff = cfg.intermediate_size
        bufs = _layers.decode_scratch(R, H, Hq, Hkv, D, ff, lambda shape, tag: _alloc_array(shape, _F32, tag))
        head = (hv.reshape(R, H), norms, float(dec.eps), panels, Hq, Hkv, D, ff, dec.cos.numpy(), dec.sin.numpy())
        tail = (self.pos.numpy().reshape(R), tuple(cache._k), tuple(cache._v), self.slots, self.kvlen)
        scale = np.float32(dec._scale)

        def layers(_packs=packs):  # the panels stay alive while the kernel reads them by address
            args = (*head, *tail, self.B, scale, fns, _mkl.threads(), nb.get_num_threads(), bufs)
            _layers.decode_layers(*args)

        args = (*head, *tail, R, scale, fns, 1, 1, bufs)
        self.cold = _tiering.cold_direct([(_layers.decode_layers, args)])
        if self.cold:
            return False
        flops = 2 * R * sum(w.n * w.k for w in packs[0]) * len(packs)
        info = {"kernel": "llm_decode_layers", "flops": flops}
        self.plan.append(lambda: current_stream().launch(layers, "DecodeLayers", info))
        self.kernels.append(layers)
        return True

    def _fuse_numpy(self, arr, hv, q, y, gu, logits, pos, cos, sin, eps, scale, step) -> None:
        """The fused step's regions as :mod:`opsnn.llm.fused`'s numpy stand-ins (the numba ones
        are compiling in the background: ``self.cold``)."""
        dec, R, one = self.dec, self.R, np.float32(1.0)
        cache = dec.cache
        for i, p in enumerate(dec.layers):
            wq, wk, wv, wo, wg, wu, wd = arr[7 * i : 7 * i + 7]
            kc, vc = cache._k[i], cache._v[i]
            ln1, ln2 = p.ln1.numpy(), p.ln2.numpy()
            step(
                lambda ln1=ln1, wq=wq, wk=wk, wv=wv, kc=kc, vc=vc: _fused.attention_block_numpy(
                    hv, ln1, eps, wq, wk, wv, cos, sin, pos, kc, vc, self.slots, self.kvlen, self.B, q, y, scale
                ),
                "Attention",
                "llm_decode_attention_block_numpy",
            )
            step(
                lambda wo=wo: _fused.residual_gemm_numpy(wo, y.reshape(R, -1), hv),
                "Linear",
                "llm_decode_residual_numpy",
            )
            step(
                lambda ln2=ln2, wg=wg, wu=wu: _fused.mlp_block_numpy(hv, ln2, eps, wg, wu, gu, one),
                "SwiGLU",
                "llm_decode_mlp_block_numpy",
            )
            step(lambda wd=wd: _fused.residual_gemm_numpy(wd, gu, hv), "Linear", "llm_decode_residual_numpy")
        norm_w, wout = dec.norm_w.numpy(), arr[-1]
        self.head_plan, self.head_kernels = [], []
        step(
            lambda: _fused.head_block_numpy(hv, norm_w, eps, wout, logits),
            "Linear",
            "llm_decode_head_numpy",
            (self.head_plan, self.head_kernels),
        )

    def _run_kernels(self, head: bool = False) -> None:
        for fn in self.kernels:
            fn()
        if head:
            for fn in self.head_kernels:
                fn()

    def run(self, tokens: np.ndarray, slots: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Logits (B, vocab) for ``tokens`` (B, 1) at positions ``starts`` of cache slots ``slots``."""
        B = len(slots)
        tok, pos, kvlen = self.tokens.numpy(), self.pos.numpy(), self.kvlen
        if B < self.R:
            tok[B:] = 0
            pos[B:] = 0
            kvlen[B:] = 0
            self.slots[B:] = 0
        tok[:B] = tokens
        pos[:B, 0] = starts
        kvlen[:B] = starts + 1
        self.slots[:B] = slots
        self.B = B
        stream = current_stream()
        full = B == self.R
        if hooks.active or not stream.inline or context().pool.guard_bytes:
            for fn in self.plan + self.head_plan if full else self.plan:  # each kernel on its own: observers see each
                fn()
        else:
            # no observer and the caller's thread runs the stream: the step's ~13 kernels a layer
            # as one task (each executor's launch bookkeeping is ~20-30 us, ~4 ms a token for 12 layers)
            stream.launch(self._run_kernels, "DecodeStep", {"kernel": "llm_decode_step"}, (full,))
        stream.synchronize()  # the residual GEMMs write h in place: no producer for numpy() to wait on
        if full:
            return self.logits.numpy().reshape(B, -1).copy()  # the buffer is the next step's
        h = Tensor(self.h.numpy()[:B])
        dec = self.dec
        logits = dec._linear(ops.rms_norm(h, self.H, dec.norm_w, eps=dec.eps), dec.out_w).numpy()
        return logits.reshape(B, -1)


def _model_packs(model) -> dict:
    """The model's packed projection weights ((ids of the stacked weight tensors) -> (refs to the
    tensors, refs to their arrays, panel)), kept on the model so that every decoder of it shares them;
    ``load_state_dict`` empties them (``Module.derived_cache``). Keyed by id, not by the tensor:
    a tensor's ``==`` is elementwise."""
    return model.derived_cache(PACKS)


#: the name of the model's derived cache that holds its packed projection weights
PACKS = "llm.packed_projections"


_BF16 = _dt.bfloat16


def _f32(t: Tensor) -> Tensor:
    """``t`` as float32 (a widened copy when the model was cast to 16 bits)."""
    return t if t.dtype == _F32 else Tensor(t.numpy().astype(np.float32))


class _PlainWeight:
    """A float32 projection weight (N, K) (or q/k/v, gate/up stacked along N), contiguous, for
    products numpy's OpenBLAS (``x @ w.T``) or, for a few rows, opsnn's ``gemm_rows`` runs
    faster than MKL's packed panel."""

    __slots__ = ("w",)

    def __init__(self, w: np.ndarray):
        self.w = w

    @property
    def n(self) -> int:
        return self.w.shape[0]


class _OwnPanels:
    """A float32 projection weight (N, K) (or q/k/v, gate/up stacked along N) packed once into opsnn's
    panels (:mod:`opsnn.kernels.cpu.gemm_packed`) for products of many rows on AVX2 CPUs without MKL
    as the GEMM library."""

    __slots__ = ("panels", "n", "k")

    def __init__(self, panels: np.ndarray, n: int, k: int):
        self.panels, self.n, self.k = panels, n, k


class _Bf16Weight:
    """A bfloat16 projection weight (N, K), its bits as uint16: ``x`` is rounded to bf16 and
    multiplied by MKL's bf16 GEMM (fp32 accumulation) reading the weight as stored."""

    __slots__ = ("w",)

    def __init__(self, w: np.ndarray):
        self.w = w

    @property
    def shape(self) -> tuple:
        return self.w.shape


def _split_columns(out: np.ndarray, ws) -> list:
    """The column blocks of ``out`` (..., sum of the weights' N) that belong to each weight of
    ``ws`` (views)."""
    views, lo = [], 0
    for w in ws:
        views.append(out[..., lo : lo + w.shape[0]])
        lo += w.shape[0]
    return views


def _out_features(p) -> int:
    """N of a projection :meth:`CachedDecoder._packed` gave: a packed panel or the (N, K) weight."""
    return p.shape[0] if isinstance(p, (np.ndarray, _Bf16Weight)) else p.n


def _launch(fn, name: str, info: dict, args: tuple = ()) -> tuple:
    """Launch ``fn(*args)`` on the current stream; returns the producer the Tensors it writes carry
    (a host read of them waits for it, a failure marks them), as an op's outputs do."""
    stream, mark = current_stream(), []
    return stream, stream.launch(fn, name, info, args, mark=mark), mark


def _numpy_product(x: np.ndarray, w: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
    """``out = x @ w.T`` (``+=`` when ``accumulate``) on numpy's BLAS."""
    if accumulate:
        out[...] += np.matmul(x, w.T)
    else:
        np.matmul(x, w.T, out=out)


def _mkl_product(x: np.ndarray, p, out: np.ndarray, accumulate: bool = False) -> tuple:
    """``out = x @ W.T`` (``out += x @ W.T`` when ``accumulate``: a residual added by the GEMM
    itself) as (closure over these arrays, task name, profiler info), the arguments of a stream
    launch: ``p`` is W's packed panel (MKL), W itself (N, K) for one row (``cblas_sgemv``), a
    :class:`_Bf16Weight` (``x`` rounded into a bf16 buffer of its own), a :class:`_PlainWeight` or
    :class:`_OwnPanels`, each run as :func:`opsnn.kernels.cpu.libraries.projection` decides."""
    beta = 1.0 if accumulate else 0.0
    if isinstance(p, _OwnPanels):
        return _own_product(x, p, out, accumulate)
    kernel = None
    if isinstance(p, _Bf16Weight):
        kernel = _libs.projection(
            x.shape[0], p.w.shape[1], p.w.shape[0], _BF16, contiguous=out.flags.c_contiguous
        ).kernel
    elif isinstance(p, _PlainWeight):
        kernel = _libs.projection(
            x.shape[0], p.w.shape[1], p.w.shape[0], _F32, contiguous=x.flags.c_contiguous and out.flags.c_contiguous
        ).kernel
    if kernel == "llm_linear_bf16_gemv":
        (n, k), xv, ov = p.w.shape, x.reshape(-1), out.reshape(-1)
        info = {"kernel": "llm_linear_bf16_gemv", "flops": 2 * k * n}
        return (lambda: gemv_bf16(p.w, xv, ov, beta)), "Linear", info
    if isinstance(p, _Bf16Weight):
        (n, k), wt = p.w.shape, p.w.T
        xb = np.empty(x.shape, np.uint16)
        xf, xu, xbf = x.reshape(-1), x.reshape(-1).view(np.uint32), xb.reshape(-1)
        if kernel == "llm_linear_onednn_bf16":
            prim = _onednn.wt_matmul(x.shape[0], k, n, accumulate, _BF16)
            ptrs = (xb.ctypes.data, p.w.ctypes.data, out.ctypes.data)

            def fn_onednn(_arrays=(xb, p.w, out)):
                f32_to_bf16(xf, xu, xbf)
                prim.run(*ptrs)

            return fn_onednn, "Linear", {"kernel": "llm_linear_onednn_bf16", "flops": 2 * x.shape[0] * k * n}

        def fn():
            f32_to_bf16(xf, xu, xbf)
            _mkl.gemm2d_bf16(xb, wt, out, beta=beta)

        return fn, "Linear", {"kernel": "llm_linear_mkl_bf16", "flops": 2 * x.shape[0] * k * n}
    if isinstance(p, _PlainWeight) and kernel == "llm_linear_onednn":
        (n, k), w = p.w.shape, p.w
        prim = _onednn.wt_matmul(x.shape[0], k, n, accumulate)
        ptrs = (x.ctypes.data, w.ctypes.data, out.ctypes.data)
        info = {"kernel": "llm_linear_onednn", "flops": 2 * x.shape[0] * k * n}
        return (lambda _arrays=(x, w, out): prim.run(*ptrs)), "Linear", info
    if isinstance(p, _PlainWeight) and kernel == "llm_linear_rows":
        (n, k), w, b32 = p.w.shape, p.w, np.float32(beta)
        info = {"kernel": "llm_linear_rows", "flops": 2 * x.shape[0] * k * n}
        cold = () if gemm_rows_parallel.overloads else _tiering.cold_direct([(gemm_rows_parallel, (x, w, out, b32))])
        if not cold:
            return (lambda: gemm_rows_parallel(x, w, out, b32)), "Linear", info

        def fn_rows():  # numpy's BLAS while gemm_rows_parallel compiles in the background (opsnn.ops.tiering)
            if cold and not _tiering.all_cached(cold):
                _numpy_product(x, w, out, accumulate)
            else:
                gemm_rows_parallel(x, w, out, b32)

        return fn_rows, "Linear", info
    if isinstance(p, _PlainWeight):
        (n, k), w = p.w.shape, p.w
        return (
            (lambda: _numpy_product(x, w, out, accumulate)),
            "Linear",
            {"kernel": "llm_linear_openblas", "flops": 2 * x.shape[0] * k * n},
        )
    if isinstance(p, np.ndarray):
        (n, k), xv, ov = p.shape, x.reshape(-1), out.reshape(-1)
        fn, kernel = (lambda: _mkl.gemv(p, xv, ov, accumulate)), "llm_linear_mkl_gemv"
    else:
        n, k = p.n, p.k
        fn, kernel = (lambda: _mkl.gemm(x, p, out, accumulate)), "llm_linear_mkl_packed"
    return fn, "Linear", {"kernel": kernel, "flops": 2 * x.shape[0] * k * n}


def _own_product(x: np.ndarray, p: _OwnPanels, out: np.ndarray, accumulate: bool) -> tuple:
    """:func:`_mkl_product` on opsnn's panels: numpy's BLAS on the weight unpacked again while the
    packed GEMM compiles in the background (opsnn.ops.tiering); a column view of an output is
    written through a buffer of its own."""
    info = {"kernel": "llm_linear_packed", "flops": 2 * x.shape[0] * p.k * p.n}
    x = np.ascontiguousarray(x)
    dst = out if out.flags.c_contiguous else np.empty(out.shape, _F32)
    add = accumulate and dst is out
    cold = _tiering.cold_direct([_gp.call(x, p.panels, dst, add)])

    def fn():
        if cold and not _tiering.all_cached(cold):
            _numpy_product(x, _gp.unpacked(p.panels, p.n).T, dst, add)
        else:
            _gp.gemm(x, p.panels, dst, accumulate=add)
        if dst is not out:
            if accumulate:
                out[...] += dst
            else:
                out[...] = dst

    return fn, "Linear", info


class _PackedLinearStep:
    """A decode step's projection on MKL, on fixed buffers, bound once: the executor
    interface the step replays (``run``, ``bound_kernel``, ``outputs``)."""

    __slots__ = ("launch_args", "outputs")

    def __init__(self, x: np.ndarray, p, out: Tensor, accumulate: bool = False):
        self.launch_args = _mkl_product(x, p, out.numpy().reshape(x.shape[0], -1), accumulate)
        self.outputs = [out]

    def run(self):
        current_stream().launch(*self.launch_args)

    def bound_kernel(self):
        return self.launch_args[0]


__all__ = ["CachedDecoder", "decode_bucket"]
