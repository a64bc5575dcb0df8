"""A Stable-Diffusion-style UNet block (diffusers layout and names): a ResNet block
(GroupNorm + SiLU + 3x3 conv, time-embedding projection, 1x1 shortcut when channels change),
a spatial transformer (GroupNorm, linear proj_in, self-attention, cross-attention over a
context tensor, GEGLU feed-forward, proj_out) and a second ResNet block with dilated convs.

>>> import opsnn, numpy as np
>>> blk = opsnn.models.unet_block(in_channels=32, out_channels=64, context_dim=48, heads=2, groups=8)
>>> x = np.zeros((1, 32, 8, 8), np.float32)
>>> ctx = np.zeros((1, 7, 48), np.float32)
>>> blk(x, ctx).shape
(1, 64, 8, 8)
"""

from __future__ import annotations

from .. import nn, ops
from ..errors import ParamInvalidError
from ..nn import init
from ..nn.functional import as_image, merge_heads, reshape, split_heads
from ..tensor import as_tensor


class ResnetBlock2D(nn.Module):
    """``h = conv1(silu(norm1(x))) [+ time_emb_proj(silu(temb))]; h = conv2(silu(norm2(h)));
    out = shortcut(x) + h``; both 3x3 convs use ``dilation`` (padding = dilation)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        temb_channels: int | None = None,
        groups: int = 32,
        eps: float = 1e-6,
        dilation: int = 1,
    ):
        super().__init__()
        self.in_channels, self.out_channels, self.dilation = in_channels, out_channels, dilation
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=dilation, dilation=dilation)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels) if temb_channels else None
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps)
        self.dropout = nn.Dropout(0.0)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=dilation, dilation=dilation)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x, temb=None):
        h = self.conv1(ops.silu(self.norm1(x)))
        if self.time_emb_proj is not None:
            if temb is None:
                raise ParamInvalidError(
                    f"unet_block: this block has a time embedding; pass temb (batch, {self.time_emb_proj.in_features})"
                )
            t = self.time_emb_proj(ops.silu(temb))
            h = ops.add(h, reshape(t, (0, 0, 1, 1)))
        h = self.conv2(self.dropout(ops.silu(self.norm2(h))))
        sc = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return ops.add(sc, h)


class Attention(nn.Module):
    """diffusers' ``Attention``: ``to_q``/``to_k``/``to_v`` (no bias), ``to_out.0`` (with bias);
    self-attention when ``context`` is None, cross-attention over it otherwise."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None):
        super().__init__()
        if dim % heads:
            raise ParamInvalidError(f"unet_block: channels ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        kv = context_dim or dim
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(kv, dim, bias=False)
        self.to_v = nn.Linear(kv, dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])

    def forward(self, x, context=None):
        c = x if context is None else context
        q, k, v = (
            split_heads(self.to_q(x), self.heads),
            split_heads(self.to_k(c), self.heads),
            split_heads(self.to_v(c), self.heads),
        )
        return self.to_out[0](merge_heads(ops.scaled_dot_product_attention(q, k, v)))


class GEGLU(nn.Module):
    """``proj`` to 2*inner, then ``hidden * gelu(gate)``."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.inner = inner
        self.proj = nn.Linear(dim, 2 * inner)

    def forward(self, x):
        hidden, gate = ops.split(self.proj(x), [self.inner, self.inner], dim=-1)
        return ops.mul(hidden, ops.gelu(gate))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        return self.net[2](self.net[0](x))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, context_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, h, context):
        h = ops.add(self.attn1(self.norm1(h)), h)
        h = ops.add(self.attn2(self.norm2(h), context), h)
        return ops.add(self.ff(self.norm3(h)), h)


class Transformer2DModel(nn.Module):
    """GroupNorm -> (B, HW, C) tokens -> proj_in -> transformer block -> proj_out -> + input."""

    def __init__(self, channels: int, heads: int, context_dim: int, groups: int = 32):
        super().__init__()
        self.channels = channels
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, channels)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(channels, heads, context_dim)])
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, x, context):
        C = x.shape[1]
        h = reshape(ops.transpose(self.norm(x), (0, 2, 3, 1)), (0, -1, C))
        h = self.proj_in(h)
        for blk in self.transformer_blocks:
            h = blk(h, context)
        h = self.proj_out(h)
        nhwc = ops.gather(ops.shape(x), [0, 2, 3, 1])  # x's (N, H, W, C), traced: follows the input's size
        h = ops.transpose(ops.reshape(h, nhwc), (0, 3, 1, 2))
        return ops.add(h, x)


class UNetBlock(nn.Module):
    """``forward(x (B, in, H, W), context (B, L, context_dim), temb=None (B, temb_channels))
    -> (B, out, H, W)``: resnets[0] -> attentions[0] -> resnets[1] (dilated)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        context_dim: int,
        heads: int,
        groups: int = 32,
        temb_channels: int | None = None,
        dilation: int = 2,
    ):
        super().__init__()
        for c in (in_channels, out_channels):
            if c % groups:
                raise ParamInvalidError(f"unet_block: channels ({c}) must be divisible by groups ({groups})")
        self.in_channels, self.out_channels, self.context_dim = in_channels, out_channels, context_dim
        self.heads, self.groups, self.temb_channels, self.dilation = heads, groups, temb_channels, dilation
        self.resnets = nn.ModuleList(
            [
                ResnetBlock2D(in_channels, out_channels, temb_channels, groups),
                ResnetBlock2D(out_channels, out_channels, temb_channels, groups, dilation=dilation),
            ]
        )
        self.attentions = nn.ModuleList([Transformer2DModel(out_channels, heads, context_dim, groups)])

    def forward(self, x, context, temb=None):
        x = as_image(x, self.in_channels, "unet_block")
        context = as_tensor(context)
        if context.ndim != 3 or context.shape[2] != self.context_dim or context.shape[0] != x.shape[0]:
            raise ParamInvalidError(
                f"unet_block: context must be (batch={x.shape[0]}, length, {self.context_dim}), got {context.shape}"
            )
        h = self.resnets[0](x, temb)
        h = self.attentions[0](h, context)
        return self.resnets[1](h, temb)


def unet_block(
    in_channels: int = 320,
    out_channels: int = 320,
    context_dim: int = 768,
    heads: int = 8,
    groups: int = 32,
    temb_channels: int | None = None,
    dilation: int = 2,
    *,
    seed: int | None = 0,
    weights=None,
    strict: bool = True,
) -> UNetBlock:
    """Build a Stable-Diffusion-style UNet block (defaults: SD 1.x's first level, 320 channels,
    CLIP context 768, 8 heads). Conv/linear weights use torch's default init from ``seed``,
    with GroupNorm/LayerNorm affine terms perturbed so the test of every path is meaningful."""
    with init.seeded(seed):
        model = UNetBlock(in_channels, out_channels, context_dim, heads, groups, temb_channels, dilation)
        for m in model.modules():
            if isinstance(m, (nn.GroupNorm, nn.LayerNorm)):
                init.normal_(m.weight, mean=1.0, std=0.1)
                init.normal_(m.bias, std=0.1)
    if weights is not None:
        from .weights import load_weights

        load_weights(model, weights, strict=strict)
    return model


__all__ = ["UNetBlock", "unet_block"]
