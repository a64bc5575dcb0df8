"""LLaMA decoder (Hugging Face ``LlamaForCausalLM`` layout and parameter names:
``model.embed_tokens``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj``,
``model.layers.{i}.mlp.{gate,up,down}_proj``, ``*_layernorm``, ``model.norm``, ``lm_head``):
RMSNorm, rotary position embeddings (half-split, as HF), grouped-query attention, SwiGLU MLP,
tied or untied ``lm_head``, and a KV-cache forward.

The forward takes the past K/V of every layer ((batch, kv_heads, past, head_dim) each) and
returns the present ones, so prefill and single-token decode are the same call::

    >>> import opsnn, numpy as np
    >>> lm = opsnn.models.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, intermediate=128)
    >>> logits, past = lm(np.array([[1, 5, 7]]))            # prefill
    >>> logits.shape, past[0][0].shape
    ((1, 3, 100), (1, 2, 3, 16))
    >>> logits, past = lm(np.array([[9]]), past)            # decode one token at position 3
    >>> logits.shape, past[0][0].shape
    ((1, 1, 100), (1, 2, 4, 16))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import nn, ops
from ..errors import ParamInvalidError
from ..nn import init
from ..nn.functional import check_token_ids
from ..tensor import as_tensor, checked_value


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ParamInvalidError(
                f"LlamaConfig: hidden_size ({self.hidden_size}) must be divisible by heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ParamInvalidError(
                f"LlamaConfig: heads ({self.num_attention_heads}) must be a multiple of kv_heads "
                f"({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ParamInvalidError(f"LlamaConfig: head_dim ({self.head_dim}) must be even for rotary embeddings")
        for f in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            if getattr(self, f) < 1:
                raise ParamInvalidError(f"LlamaConfig: {f} must be >= 1, got {getattr(self, f)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def rope_cache(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` of shape (max_position, head_dim / 2): angle ``p * theta^(-2i/d)``."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.arange(cfg.max_position_embeddings, dtype=np.float64)[:, None] * inv_freq[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        H, D = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(H, cfg.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * D, H, bias=False)

    def forward(self, h, cos, sin, position_ids, past=None):
        cfg = self.cfg
        hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        # (B, S, H*D) with head counts throughout: no split/merge of the heads by transposed copies
        q = ops.rotary_embedding(self.q_proj(h), cos, sin, position_ids, num_heads=hq)
        k = ops.rotary_embedding(self.k_proj(h), cos, sin, position_ids, num_heads=hkv)
        pk, pv = (None, None) if past is None else past
        # is_causal is bottom-right aligned: query i sits at cache position past_len + i
        y, k_all, v_all = ops.attention(
            q, k, self.v_proj(h), None, pk, pv, is_causal=True, q_num_heads=hq, kv_num_heads=hkv, num_outputs=3
        )
        return self.o_proj(y), (k_all, v_all)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h):
        return self.down_proj(ops.swiglu(self.gate_proj(h), self.up_proj(h)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h, cos, sin, position_ids, past=None):
        a, present = self.self_attn(self.input_layernorm(h), cos, sin, position_ids, past)
        h = ops.add(h, a)
        h = ops.add(h, self.mlp(self.post_attention_layernorm(h)))
        return h, present


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        cos, sin = rope_cache(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, input_ids, past_key_values=None, position_ids=None):
        h = ops.embedding(input_ids, self.embed_tokens.weight)
        presents = []
        for i, layer in enumerate(self.layers):
            h, present = layer(
                h, self.rope_cos, self.rope_sin, position_ids, None if past_key_values is None else past_key_values[i]
            )
            presents.append(present)
        return self.norm(h), presents


class LlamaForCausalLM(nn.Module):
    """``forward(input_ids, past_key_values=None, position_ids=None, position_offset=None)
    -> (logits, present_key_values)``.

    ``past_key_values``: one ``(key, value)`` pair per layer, each (batch, kv_heads, past,
    head_dim), or None for a prefill. Positions default to ``position_offset + arange(seq)``
    with ``position_offset`` = the past length; pass ``position_ids`` (batch, seq) to choose
    them. Attention is causal over the cache (query i sees cache positions <= past + i).
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        std = cfg.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                init.normal_(m.weight, std=std)

    @property
    def output_weight(self):
        """The (vocab, hidden) matrix of the output projection (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def _check_past(self, past, B: int) -> int:
        cfg = self.config
        if len(past) != cfg.num_hidden_layers:
            raise ParamInvalidError(
                f"llama: past_key_values must hold {cfg.num_hidden_layers} (key, value) pairs, got {len(past)}"
            )
        P = None
        for i, kv in enumerate(past):
            if len(kv) != 2:
                raise ParamInvalidError(f"llama: past_key_values[{i}] must be a (key, value) pair")
            for t, what in zip(kv, ("key", "value")):
                s = as_tensor(t).shape
                if len(s) != 4 or s[0] != B or s[1] != cfg.num_key_value_heads or s[3] != cfg.head_dim:
                    raise ParamInvalidError(
                        f"llama: past_key_values[{i}] {what} must be (batch={B}, "
                        f"kv_heads={cfg.num_key_value_heads}, past, head_dim={cfg.head_dim}), "
                        f"got {s}"
                    )
                if P is None:
                    P = s[2]
                elif s[2] != P:
                    raise ParamInvalidError(
                        f"llama: all past tensors must share one past length; "
                        f"past_key_values[{i}] {what} has {s[2]}, expected {P}"
                    )
        return P or 0

    def forward(self, input_ids, past_key_values=None, position_ids=None, position_offset=None):
        cfg = self.config
        ids = check_token_ids(input_ids, cfg.vocab_size, "llama: input_ids")
        if ids.ndim != 2:
            raise ParamInvalidError(f"llama: input_ids must be (batch, seq), got shape {ids.shape}")
        B, S = ids.shape
        past = None if past_key_values is None else [(as_tensor(k), as_tensor(v)) for k, v in past_key_values]
        if past is not None:
            self._check_past(past, B)
        if position_ids is None:
            # off + (0, 1, ..., S - 1) on every row, computed from ids (and the cache's length) by
            # ops, so a traced graph follows the batch, length and past it is run with
            if position_offset is not None:
                off = int(position_offset)
            else:
                off = 0 if past is None else ops.shape(past[0][0], 2, 3)
            computed_positions = True
            ones = ops.add(ops.mul(ids, 0), 1)
            position_ids = ops.add(ops.sub(ops.cumsum(ones, 1), 1), off)
        else:
            computed_positions = False
            position_ids = as_tensor(position_ids)
            if tuple(position_ids.shape) != (B, S) or position_ids.dtype.kind not in "iu":
                raise ParamInvalidError(
                    f"llama: position_ids must be integers of shape (batch, seq) = {(B, S)}, "
                    f"got {position_ids.dtype} {position_ids.shape}"
                )
            if position_ids.dtype != np.int64:
                position_ids = ops.cast(position_ids, np.int64)
        # positions made from the shapes above are checked once, also while tracing (they follow the
        # shape a plan is made for); given ones are data, read as such
        pa = checked_value(position_ids) if computed_positions else position_ids.numpy()
        if pa.size and (pa.min() < 0 or pa.max() >= cfg.max_position_embeddings):
            raise ParamInvalidError(
                f"llama: positions must lie in [0, max_position_embeddings="
                f"{cfg.max_position_embeddings}), got [{pa.min()}, {pa.max()}]"
            )
        h, presents = self.model(ids, past, position_ids)
        logits = ops.linear(h, self.output_weight)
        return logits, presents


_ARG_FIELDS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
    "intermediate": "intermediate_size",
    "max_position": "max_position_embeddings",
    "rms_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "tie_word_embeddings": "tie_word_embeddings",
}


def llama(
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int | None = None,
    vocab: int = 1024,
    intermediate: int | None = None,
    *,
    tie_word_embeddings: bool = False,
    max_position: int = 2048,
    rms_eps: float = 1e-6,
    rope_theta: float = 10000.0,
    config: LlamaConfig | None = None,
    seed: int | None = 0,
    weights=None,
    strict: bool = True,
) -> LlamaForCausalLM:
    """Build a LLaMA causal LM (defaults: a tiny 2-layer model). ``kv_heads`` < ``heads`` gives
    grouped-query attention (default: ``heads``); ``intermediate`` defaults to LLaMA's
    ``256 * ceil(8/3 * hidden / 256)``; ``config`` (a :class:`LlamaConfig`) overrides all size
    arguments. Weights are N(0, 0.02) from ``seed``; ``weights`` loads a local file with
    Hugging Face names."""
    if config is None:
        if intermediate is None:
            intermediate = 256 * -(-int(8 * hidden / 3) // 256)
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads if kv_heads is None else kv_heads,
            max_position_embeddings=max_position,
            rms_norm_eps=rms_eps,
            rope_theta=rope_theta,
            tie_word_embeddings=tie_word_embeddings,
        )
    elif not isinstance(config, LlamaConfig):
        if isinstance(config, dict):
            config = LlamaConfig(**{_ARG_FIELDS.get(k, k): v for k, v in config.items()})
        else:
            raise ParamInvalidError(f"llama: config must be a LlamaConfig or a dict, got {type(config).__name__}")
    with init.seeded(seed):
        model = LlamaForCausalLM(config)
    if weights is not None:
        from .weights import load_weights

        load_weights(model, weights, strict=strict)
    return model


__all__ = ["LlamaConfig", "LlamaForCausalLM", "llama", "rope_cache"]
