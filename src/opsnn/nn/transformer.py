"""torch.nn's transformer layers with torch's arguments, submodule names (so torch state dicts load
as they are) and forward semantics: TransformerEncoderLayer, TransformerEncoder,
TransformerDecoderLayer, TransformerDecoder and the encoder-decoder Transformer. Post-norm by default, pre-norm with ``norm_first``;
the stacks start every layer from the given layer's weights, as torch's deep copies do.

>>> import opsnn, numpy as np
>>> layer = opsnn.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
>>> enc = opsnn.nn.TransformerEncoder(layer, num_layers=2)
>>> enc(opsnn.tensor(np.zeros((2, 5, 16), np.float32))).shape
(2, 5, 16)
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import ParamInvalidError
from ..tensor import as_tensor, tensor
from . import init
from .attention import MultiheadAttention
from .layers import Dropout, LayerNorm, Linear
from .module import Module, ModuleList


def _activation(activation):
    if callable(activation):
        return activation
    if activation == "relu":
        return ops.relu
    if activation == "gelu":
        return ops.gelu
    raise ParamInvalidError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class _Layer(Module):
    """What the encoder and decoder layers share: the feed-forward block and the constructor record
    the stacks rebuild each layer from."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation="relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ):
        """torch's arguments (both layers take the same ones)."""
        super().__init__()
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
            raise ParamInvalidError(f"{type(self).__name__}: d_model must be a positive int, got {d_model!r}")
        self._config = dict(
            d_model=d_model,
            nhead=nhead,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=activation,
            layer_norm_eps=layer_norm_eps,
            batch_first=batch_first,
            norm_first=norm_first,
            bias=bias,
        )
        self.activation = _activation(activation)
        self.norm_first = bool(norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def _sa(self, x, mask, padding, is_causal):
        out = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=is_causal)
        return self.dropout1(out[0])

    def _ff(self, x, dropout):
        return dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def clone(self):
        """A new layer of the same configuration starting from this one's weights (torch's deepcopy)."""
        twin = type(self)(**self._config)
        twin.load_state_dict(self.state_dict())
        return twin.train(self.training)


class TransformerEncoderLayer(_Layer):
    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = ops.add(x, self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            return ops.add(x, self._ff(self.norm2(x), self.dropout2))
        x = self.norm1(ops.add(x, self._sa(x, src_mask, src_key_padding_mask, is_causal)))
        return self.norm2(ops.add(x, self._ff(x, self.dropout2)))


class TransformerDecoderLayer(_Layer):
    def __init__(self, d_model: int, nhead: int, *args, **kwargs):
        super().__init__(d_model, nhead, *args, **kwargs)
        c = self._config
        self.multihead_attn = MultiheadAttention(
            d_model, nhead, dropout=c["dropout"], bias=c["bias"], batch_first=c["batch_first"]
        )
        self.norm3 = LayerNorm(d_model, eps=c["layer_norm_eps"], bias=c["bias"])
        self.dropout3 = Dropout(c["dropout"])

    def _mha(self, x, memory, mask, padding, is_causal):
        out = self.multihead_attn(
            x, memory, memory, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=is_causal
        )
        return self.dropout2(out[0])

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ):
        x = tgt
        if self.norm_first:
            x = ops.add(x, self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = ops.add(x, self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            return ops.add(x, self._ff(self.norm3(x), self.dropout3))
        x = self.norm1(ops.add(x, self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal)))
        x = self.norm2(ops.add(x, self._mha(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal)))
        return self.norm3(ops.add(x, self._ff(x, self.dropout3)))


def _stack(what: str, layer, num_layers, kind) -> ModuleList:
    if not isinstance(layer, kind):
        raise ParamInvalidError(f"{what}: expected a {kind.__name__}, got {type(layer).__name__}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ParamInvalidError(f"{what}: num_layers must be a positive int, got {num_layers!r}")
    return ModuleList([layer.clone() for _ in range(num_layers)])


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (each starting from its weights), then ``norm`` if given."""

    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor: bool = True, mask_check=True):
        super().__init__()
        self.layers = _stack("TransformerEncoder", encoder_layer, num_layers, TransformerEncoderLayer)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer`` (each starting from its weights), then ``norm`` if given."""

    def __init__(self, decoder_layer, num_layers: int, norm=None):
        super().__init__()
        self.layers = _stack("TransformerDecoder", decoder_layer, num_layers, TransformerDecoderLayer)
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ):
        x = tgt
        for layer in self.layers:
            x = layer(
                x,
                memory,
                tgt_mask,
                memory_mask,
                tgt_key_padding_mask,
                memory_key_padding_mask,
                bool(tgt_is_causal),
                memory_is_causal,
            )
        return self.norm(x) if self.norm is not None else x


class Transformer(Module):
    """torch.nn.Transformer: a ``TransformerEncoder`` (``encoder``) and a ``TransformerDecoder``
    (``decoder``), each ending in a LayerNorm unless ``custom_encoder`` / ``custom_decoder`` replace
    them; every weight matrix starts Xavier-uniform, as torch's.

    >>> import opsnn, numpy as np
    >>> t = opsnn.nn.Transformer(16, 4, 1, 1, dim_feedforward=32, dropout=0.0, batch_first=True)
    >>> mask = opsnn.nn.Transformer.generate_square_subsequent_mask(3)
    >>> t(np.zeros((2, 5, 16), np.float32), np.zeros((2, 3, 16), np.float32), tgt_mask=mask).shape
    (2, 3, 16)
    """

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation="relu",
        custom_encoder=None,
        custom_decoder=None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if device not in (None, "cpu") or dtype not in (None, "float32", np.float32):
            raise ParamInvalidError(f"Transformer: only device='cpu' and float32 are supported, got {device}, {dtype}")
        layer_args = dict(
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            activation=activation,
            layer_norm_eps=layer_norm_eps,
            batch_first=batch_first,
            norm_first=norm_first,
            bias=bias,
        )
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, **layer_args)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
            self.encoder = TransformerEncoder(layer, num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, **layer_args)
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
            self.decoder = TransformerDecoder(layer, num_decoder_layers, norm)
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(
        self,
        src,
        tgt,
        src_mask=None,
        tgt_mask=None,
        memory_mask=None,
        src_key_padding_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ):
        src, tgt = as_tensor(src), as_tensor(tgt)
        if src.ndim == 3 and tgt.ndim == 3:
            axis = 0 if self.batch_first else 1
            if src.shape[axis] != tgt.shape[axis]:
                raise ParamInvalidError(
                    f"Transformer: src and tgt must have the same batch size (dim {axis}), got "
                    f"{tuple(src.shape)} and {tuple(tgt.shape)}"
                )
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ParamInvalidError(
                f"Transformer: the last dim of src and tgt must be d_model={self.d_model}, got "
                f"{tuple(src.shape)} and {tuple(tgt.shape)}"
            )
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(
            tgt,
            memory,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
            tgt_is_causal=tgt_is_causal,
            memory_is_causal=memory_is_causal,
        )

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None):
        """An (sz, sz) float mask with -inf above the diagonal and 0 elsewhere (each position sees
        itself and the ones before it)."""
        if isinstance(sz, bool) or not isinstance(sz, (int, np.integer)) or sz < 0:
            raise ParamInvalidError(f"Transformer.generate_square_subsequent_mask: sz must be an int >= 0, got {sz!r}")
        dt = np.dtype(dtype or np.float32)
        return tensor(np.triu(np.full((int(sz), int(sz)), -np.inf, dt), k=1))


__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]
