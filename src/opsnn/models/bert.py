"""BERT encoder (Hugging Face ``BertModel`` layout and parameter names: ``embeddings.*``,
``encoder.layer.{i}.attention.self.query``, ..., ``pooler.dense``): token + position +
token-type embeddings, post-LayerNorm encoder layers, erf GELU, optional pooler.

>>> import opsnn, numpy as np
>>> model = opsnn.models.bert("tiny", seed=0)
>>> ids = np.array([[101, 2023, 2003, 102]])
>>> seq, pooled = model(ids, attention_mask=np.ones_like(ids))
>>> seq.shape, pooled.shape
((1, 4, 128), (1, 128))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .. import nn, ops
from ..errors import ParamInvalidError
from ..nn import init
from ..nn.functional import check_token_ids, reshape
from ..tensor import as_tensor


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    add_pooling_layer: bool = True

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ParamInvalidError(
                f"BertConfig: hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        for f in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            if getattr(self, f) < 1:
                raise ParamInvalidError(f"BertConfig: {f} must be >= 1, got {getattr(self, f)}")


#: named sizes (layers, hidden, heads, intermediate) of the released BERT checkpoints
BERT_CONFIGS = {
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "medium": dict(num_hidden_layers=8, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "base": dict(),
    "large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}


def bert_config(config="base", **overrides) -> BertConfig:
    """A :class:`BertConfig` from a preset name (``BERT_CONFIGS``), a config or a dict, with overrides."""
    if isinstance(config, BertConfig):
        base = dataclasses.asdict(config)
    elif isinstance(config, dict):
        base = dict(config)
    elif isinstance(config, str):
        if config not in BERT_CONFIGS:
            raise ParamInvalidError(
                f"bert: unknown config {config!r}; choose one of {sorted(BERT_CONFIGS)} or pass a BertConfig"
            )
        base = dict(BERT_CONFIGS[config])
    else:
        raise ParamInvalidError(f"bert: config must be a name, a BertConfig or a dict, got {type(config).__name__}")
    base.update(overrides)
    names = {f.name for f in dataclasses.fields(BertConfig)}
    bad = sorted(set(base) - names)
    if bad:
        raise ParamInvalidError(f"bert: unknown config fields {bad}; known: {sorted(names)}")
    return BertConfig(**base)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer(
            "position_ids", np.arange(cfg.max_position_embeddings, dtype=np.int64)[None], persistent=False
        )

    def forward(self, input_ids, token_type_ids=None):
        cfg = self.cfg
        ids = check_token_ids(input_ids, cfg.vocab_size, "bert: input_ids")
        if ids.ndim != 2:
            raise ParamInvalidError(f"bert: input_ids must be (batch, seq), got shape {ids.shape}")
        S = ids.shape[1]
        if S > cfg.max_position_embeddings:
            raise ParamInvalidError(
                f"bert: sequence length {S} exceeds max_position_embeddings {cfg.max_position_embeddings}"
            )
        h = ops.embedding(ids, self.word_embeddings.weight, padding_idx=self.word_embeddings.padding_idx)
        if token_type_ids is None:  # type 0 everywhere: broadcast row 0
            tt = ops.slice(self.token_type_embeddings.weight, [0], [1], axes=[0])
        else:
            tti = as_tensor(token_type_ids)
            if tuple(tti.shape) != tuple(ids.shape):
                raise ParamInvalidError(f"bert: token_type_ids must have input_ids' shape {ids.shape}, got {tti.shape}")
            tt = self.token_type_embeddings(tti)
        h = ops.add(h, tt)
        pos = ops.slice(self.position_ids, [0], ops.shape(ids, 1, 2), axes=[1])  # traced: follows ids' length
        h = ops.add(h, ops.embedding(pos, self.position_embeddings.weight))
        return self.dropout(self.LayerNorm(h))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        H = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, h, mask=None):
        # (B, S, H*D) in and out with head counts: the heads are strided views, no transposed copies
        q, k, v = (lin(h) for lin in (self.query, self.key, self.value))
        return ops.attention(q, k, v, mask, q_num_heads=self.num_heads, kv_num_heads=self.num_heads)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, h, residual):
        return self.LayerNorm(ops.add(self.dropout(self.dense(h)), residual))


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, h, mask=None):
        return self.output(self.self(h, mask), h)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h):
        return ops.gelu(self.dense(h))


class BertOutput(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(0.1)

    def forward(self, h, residual):
        return self.LayerNorm(ops.add(self.dropout(self.dense(h)), residual))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, h, mask=None):
        a = self.attention(h, mask)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, h, mask=None):
        for layer in self.layer:
            h = layer(h, mask)
        return h


class BertPooler(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, h):
        first = ops.squeeze(ops.slice(h, [0], [1], axes=[1]), 1)  # h[:, 0]
        return ops.tanh(self.dense(first))


class BertModel(nn.Module):
    """``forward(input_ids, attention_mask=None, token_type_ids=None) -> (sequence_output,
    pooled_output)`` (pooled is None without a pooling layer). ``attention_mask`` (batch, seq):
    1 (or True) for tokens to attend to, 0 for padding."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if cfg.add_pooling_layer else None
        self._init_weights()

    def _init_weights(self):
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                init.normal_(m.weight, std=std)
                init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                init.normal_(m.weight, std=std)
                if m.padding_idx is not None:
                    m.weight[m.padding_idx] = 0

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        h = self.embeddings(input_ids, token_type_ids)
        mask = None
        if attention_mask is not None:
            m = as_tensor(attention_mask)
            if tuple(m.shape) != tuple(h.shape[:2]):
                raise ParamInvalidError(
                    f"bert: attention_mask must be (batch, seq) = {tuple(h.shape[:2])}, got {m.shape}"
                )
            m = m if m.dtype == np.bool_ else ops.cast(m, np.bool_)
            mask = reshape(m, (0, 1, 1, -1))  # True = attend, broadcast over heads and queries
        h = self.encoder(h, mask)
        return h, (self.pooler(h) if self.pooler is not None else None)


def bert(config="base", *, seed: int | None = 0, weights=None, strict: bool = True, **overrides) -> BertModel:
    """Build a BERT encoder: ``config`` is a preset (``"tiny"``, ``"mini"``, ``"small"``,
    ``"medium"``, ``"base"`` (12 layers, hidden 768, 12 heads, intermediate 3072, vocab 30522,
    max_pos 512), ``"large"``), a :class:`BertConfig` or a dict; keyword overrides change
    single fields (``bert("tiny", vocab_size=1000)``). Weights are N(0, 0.02) from ``seed``;
    ``weights`` loads a local .safetensors/.npz/.onnx file (Hugging Face names, with or
    without the ``bert.`` prefix)."""
    cfg = bert_config(config, **overrides)
    with init.seeded(seed):
        model = BertModel(cfg)
    if weights is not None:
        from .weights import load_weights

        load_weights(model, weights, strict=strict)
    return model


__all__ = ["BERT_CONFIGS", "BertConfig", "BertModel", "bert", "bert_config"]
