"""Fold an eval-mode BatchNorm into the convolution or linear layer before it, as torch.nn.utils'
``fuse_conv_bn_eval`` / ``fuse_linear_bn_eval`` (and their ``*_weights`` halves) do.

>>> import opsnn, numpy as np
>>> conv, bn = opsnn.nn.Conv2d(3, 4, 3).eval(), opsnn.nn.BatchNorm2d(4).eval()
>>> fused = opsnn.nn.utils.fuse_conv_bn_eval(conv, bn)
>>> x = opsnn.tensor(np.ones((1, 3, 5, 5), np.float32))
>>> bool(np.allclose(fused(x).numpy(), bn(conv(x)).numpy(), atol=1e-5))
True
"""

from __future__ import annotations

import copy

import numpy as np

from ...errors import ParamInvalidError, real_number
from ..module import Module, Parameter


def _f64(t) -> np.ndarray | None:
    return None if t is None else np.asarray(t.numpy() if hasattr(t, "numpy") else t, np.float64)


def _requires_grad(t) -> bool:
    return bool(getattr(t, "requires_grad", False))


def _eval_pair(where: str, layer: Module, bn: Module) -> None:
    if layer.training or bn.training:
        raise ParamInvalidError(
            f"{where}: fusion is for eval mode only; call .eval() on both modules "
            f"(layer.training={layer.training}, bn.training={bn.training})"
        )
    if getattr(bn, "running_mean", None) is None or getattr(bn, "running_var", None) is None:
        raise ParamInvalidError(f"{where}: the BatchNorm tracks no running statistics (track_running_stats=False)")


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b, transpose: bool = False):
    """The (weight, bias) Parameters of a convolution followed by an eval BatchNorm with these statistics
    (``transpose``: the weight is a transposed convolution's, channels in dim 1). Each keeps its source's
    dtype; the weight requires grad as ``conv_w`` does, the bias as ``conv_b`` does (False when None)."""
    rm, rv = _f64(bn_rm), _f64(bn_rv)
    eps = real_number("fuse_conv_bn_weights", "bn_eps", bn_eps)
    w = _f64(conv_w)
    c = rm.shape[0]
    axis = 1 if transpose else 0
    if w.ndim < 2 or w.shape[axis] != c:
        raise ParamInvalidError(
            f"fuse_conv_bn_weights: the conv weight's dim {axis} must have the BatchNorm's {c} channels, "
            f"got weight shape {w.shape}"
        )
    b = np.zeros(c) if conv_b is None else _f64(conv_b)
    gamma = np.ones(c) if bn_w is None else _f64(bn_w)
    beta = np.zeros(c) if bn_b is None else _f64(bn_b)
    scale = gamma / np.sqrt(rv + eps)
    shape = [1] * w.ndim
    shape[axis] = -1
    w_dtype = conv_w.dtype
    b_dtype = conv_w.dtype if conv_b is None else conv_b.dtype
    fused_w = (w * scale.reshape(shape)).astype(w_dtype)
    fused_b = ((b - rm) * scale + beta).astype(b_dtype)
    return (
        Parameter(fused_w, requires_grad=_requires_grad(conv_w)),
        Parameter(fused_b, requires_grad=_requires_grad(conv_b)),
    )


def fuse_conv_bn_eval(conv: Module, bn: Module, transpose: bool = False) -> Module:
    """A copy of ``conv`` whose weight and bias include eval-mode ``bn`` after it (both must be in eval mode)."""
    _eval_pair("fuse_conv_bn_eval", conv, bn)
    fused = copy.deepcopy(conv)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias, transpose
    )
    fused._weights_loaded()  # the copy's caches (packed weights) were derived from the unfused weight
    return fused


def fuse_linear_bn_weights(linear_w, linear_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b):
    """The (weight, bias) Parameters of a linear layer followed by an eval BatchNorm over its output
    features (or over one feature, broadcast), with torch's dtypes and requires_grad rules."""
    rm, rv = _f64(bn_rm), _f64(bn_rv)
    eps = real_number("fuse_linear_bn_weights", "bn_eps", bn_eps)
    w = _f64(linear_w)
    if w.ndim != 2 or rm.shape[0] not in (w.shape[0], 1):
        raise ParamInvalidError(
            f"fuse_linear_bn_weights: the BatchNorm's {rm.shape[0]} features must equal the linear layer's "
            f"{w.shape[0] if w.ndim else '?'} output features (or be 1), weight shape {w.shape}"
        )
    b = np.zeros(rm.shape) if linear_b is None else _f64(linear_b)
    gamma = np.ones(rm.shape) if bn_w is None else _f64(bn_w)
    beta = np.zeros(rm.shape) if bn_b is None else _f64(bn_b)
    scale = gamma / np.sqrt(rv + eps)
    b_dtype = linear_w.dtype if linear_b is None else linear_b.dtype
    fused_w = (w * scale[:, None]).astype(linear_w.dtype)
    fused_b = ((b - rm) * scale + beta).astype(b_dtype)
    return (
        Parameter(fused_w, requires_grad=_requires_grad(linear_w)),
        Parameter(fused_b, requires_grad=_requires_grad(linear_b)),
    )


def fuse_linear_bn_eval(linear: Module, bn: Module) -> Module:
    """A copy of ``linear`` whose weight and bias include eval-mode ``bn`` (1-d, over its output features)."""
    _eval_pair("fuse_linear_bn_eval", linear, bn)
    if linear.out_features != bn.num_features and bn.num_features != 1:
        raise ParamInvalidError(
            f"fuse_linear_bn_eval: linear.out_features ({linear.out_features}) must equal bn.num_features "
            f"({bn.num_features}) or bn.num_features must be 1"
        )
    fused = copy.deepcopy(linear)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        linear.weight, linear.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias
    )
    fused._weights_loaded()  # the copy's caches (packed weights) were derived from the unfused weight
    return fused


__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights"]
