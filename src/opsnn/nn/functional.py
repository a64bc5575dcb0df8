"""Small traceable building blocks the layers share (every step is an opsnn op, so
``Module.to_graph`` records it; tensor views like ``t.reshape`` would not be recorded).

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.zeros((2, 5, 8), np.float32))
>>> opsnn.nn.functional.reshape(x, (0, 0, 2, 4)).shape
(2, 5, 2, 4)
"""

from __future__ import annotations

import inspect

import numpy as np

from .. import ops
from ..errors import DTypeError, ParamInvalidError, real_number
from ..tensor import Tensor, as_tensor
from . import init


def reshape(x, shape) -> Tensor:
    """ONNX Reshape with ``allowzero=0``: a 0 keeps that input dim, one -1 is inferred, so a
    traced graph stays valid when a batch or sequence dim changes."""
    return ops.run_op("Reshape", [x, np.asarray(shape, np.int64)], {})[0]


def split_heads(x, heads: int) -> Tensor:
    """``(B, S, H*D)`` -> ``(B, H, S, D)``."""
    x = as_tensor(x)
    return ops.transpose(reshape(x, (0, 0, heads, x.shape[-1] // heads)), (0, 2, 1, 3))


def merge_heads(x) -> Tensor:
    """``(B, H, S, D)`` -> ``(B, S, H*D)``."""
    x = as_tensor(x)
    return reshape(ops.transpose(x, (0, 2, 1, 3)), (0, 0, x.shape[1] * x.shape[3]))


_SEED_HIGH = np.iinfo(np.int64).max


def _draw_seed() -> np.ndarray:
    return np.asarray(init.generator().integers(_SEED_HIGH, dtype=np.int64))


def dropout_seed(who: str = "dropout") -> Tensor:
    """One int64 draw from opsnn's generator as a 0-d tensor. While a training step is traced it
    becomes a runtime input of the graph, drawn again before every run (in trace order)."""
    from ..graph.tracing import TraceError, active_tracer

    t = as_tensor(_draw_seed())
    tracer = active_tracer()
    if tracer is not None:
        if not hasattr(tracer, "add_input"):
            raise TraceError(
                f"{who}: a training-mode mask needs a fresh seed at every run, which only a traced training "
                "step (opsnn.compile(train_step)) feeds; trace the model in eval mode"
            )
        tracer.add_input(t, "dropout_seed", _draw_seed)
    return t


def dropout(x, p: float = 0.5, training: bool = True, who: str = "dropout") -> Tensor:
    """torch.nn.functional.dropout: identity unless ``training`` and ``p > 0``; otherwise zero each
    element with probability ``p`` and scale the rest by ``1/(1-p)``. The mask comes from
    ``opsnn.ops.native_dropout`` with one seed drawn by :func:`dropout_seed`, so eager and compiled
    training steps from one ``opsnn.manual_seed`` draw the same masks (``who`` names the caller in
    errors)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ParamInvalidError(f"{who}: dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    x = as_tensor(x)
    if p == 1.0:
        return ops.mul(x, as_tensor(np.zeros((), x.dtype)))
    return ops.native_dropout(x, p, dropout_seed(who))[0]


def additive_mask(mask, dtype, masked_when_true: bool = True) -> Tensor:
    """A mask as an additive float tensor: boolean masks become 0 / -inf (``masked_when_true``:
    True marks a position to leave out, torch's MultiheadAttention convention); float masks pass
    through (cast to ``dtype``)."""
    m = as_tensor(mask)
    dt = np.dtype(dtype)
    if m.dtype == np.bool_:
        zero, ninf = as_tensor(np.zeros((), dt)), as_tensor(np.full((), -np.inf, dt))
        return ops.where(m, ninf, zero) if masked_when_true else ops.where(m, zero, ninf)
    if m.dtype.kind != "f":
        raise DTypeError(f"attention mask must be bool or floating, got {m.dtype}")
    return m if m.dtype == dt else ops.cast(m, dt)


def check_token_ids(ids, vocab: int, what: str) -> Tensor:
    """Token ids as an int64 tensor; raises :class:`~opsnn.nn.OutOfVocabularyError` naming
    the first id outside ``[0, vocab)``."""
    from .layers import OutOfVocabularyError

    t = as_tensor(ids)
    if t.dtype.kind not in "iu":
        raise DTypeError(f"{what}: token ids must be integers, got {t.dtype}")
    from ..tensor import checked_value, tracing_training_step

    tracing = tracing_training_step()
    a = checked_value(t)  # a check only: while tracing, the graph checks each call's ids (below)
    if a.size:
        lo, hi = a.min(), a.max()
        if lo < 0 or hi >= vocab:
            bad = int(lo) if lo < 0 else int(hi)
            pos = tuple(int(i) for i in np.argwhere(a == bad)[0])
            raise OutOfVocabularyError(
                f"{what}: id {bad} at position {pos} is outside the vocabulary "
                f"of {vocab} entries (valid ids: 0..{vocab - 1})"
            )
    t = t if t.dtype == np.int64 else ops.cast(t, np.int64)
    if tracing:  # compiled calls skip the host check: a negative id becomes one Gather refuses too
        t = ops.where(ops.lt(t, as_tensor(np.zeros((), np.int64))), as_tensor(np.asarray(vocab, np.int64)), t)
    return t


def as_image(x, channels: int, what: str) -> Tensor:
    """``x`` as a float (N, channels, H, W) tensor, or a typed error naming ``what``."""
    t = as_tensor(x)
    if t.ndim != 4 or t.shape[1] != channels:
        from ..errors import ParamInvalidError

        raise ParamInvalidError(f"{what}: input must be (N, {channels}, H, W), got shape {t.shape}")
    if t.dtype.kind != "f":
        raise DTypeError(f"{what}: input must be floating point, got {t.dtype}")
    return t


# -- losses (torch.nn.functional names and arguments) -------------------------------------------------------
_REDUCTIONS = ("none", "mean", "sum")


def _check_reduction(what: str, reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        from ..errors import ParamInvalidError

        raise ParamInvalidError(f"{what}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def cross_entropy(
    input, target, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0
) -> Tensor:
    """torch.nn.functional.cross_entropy: ``input`` (N, C, ...) logits; ``target`` class indices
    (N, ...) or class probabilities (input's shape). ``label_smoothing`` mixes the target with
    the uniform distribution as torch does (ignored positions stay out of both terms).

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([[2.0, 0.5, -1.0]], np.float32))
    >>> round(float(cross_entropy(x, np.array([0]), label_smoothing=0.1).item()), 4)
    0.3913
    """
    from ..errors import ParamInvalidError

    _check_reduction("cross_entropy", reduction)
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ParamInvalidError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    x, t = as_tensor(input), as_tensor(target)
    if x.ndim == 1:  # unbatched (C,) logits, as torch takes them: a batch of one
        t = ops.reshape(t, (1, -1) if t.dtype.kind == "f" else (1,))
        loss = cross_entropy(ops.reshape(x, (1, -1)), t, weight, ignore_index, reduction, label_smoothing)
        return ops.reshape(loss, ()) if reduction == "none" else loss
    C = x.shape[1] if x.ndim > 1 else x.shape[0]
    eps = float(label_smoothing)
    if t.dtype.kind == "f":  # class probabilities
        if tuple(t.shape) != tuple(x.shape):
            raise ParamInvalidError(
                f"cross_entropy: probability targets must have the input's shape {x.shape}, got {t.shape}"
            )
        logp = ops.log_softmax(x, dim=1)
        if eps:
            t = ops.add(ops.mul(t, as_tensor(np.asarray(1.0 - eps, x.dtype))), as_tensor(np.asarray(eps / C, x.dtype)))
        if weight is not None:
            shape = (1, C) + (1,) * (x.ndim - 2)
            logp = ops.mul(logp, ops.reshape(as_tensor(weight), shape))
        per = ops.neg(ops.sum(ops.mul(logp, t), dim=1))
        if reduction == "none":
            return per
        return ops.sum(per) if reduction == "sum" else ops.mean(per)
    if not eps:
        return ops.cross_entropy(x, t, weight, ignore_index=ignore_index, reduction=reduction)
    logp = ops.log_softmax(x, dim=1)
    nll = ops.nll_loss(logp, t, weight, ignore_index=ignore_index, reduction=reduction)
    from ..graph.tracing import active_tracer

    if active_tracer() is not None:  # traced: the labels are data, the smoothing term is computed by ops
        smooth = _traced_smoothing(logp, t, weight, int(ignore_index), reduction, C, x)
        return ops.add(
            ops.mul(nll, as_tensor(np.asarray(1.0 - eps, x.dtype))),
            ops.mul(smooth, as_tensor(np.asarray(eps / C, x.dtype))),
        )
    labels = t.numpy().astype(np.int64)
    valid = labels != int(ignore_index)
    if weight is not None:
        shape = (1, C) + (1,) * (x.ndim - 2)
        w = as_tensor(weight)
        logp = ops.mul(logp, ops.reshape(w, shape))
    smooth = ops.mul(ops.neg(ops.sum(logp, dim=1)), as_tensor(valid.astype(x.dtype)))
    if reduction == "sum":
        smooth = ops.sum(smooth)
    elif reduction == "mean":
        if weight is not None:
            denom = float(as_tensor(weight).numpy().astype(np.float64)[np.where(valid, labels, 0)][valid].sum())
        else:
            denom = float(valid.sum())
        smooth = ops.div(ops.sum(smooth), as_tensor(np.asarray(denom, x.dtype)))
    return ops.add(
        ops.mul(nll, as_tensor(np.asarray(1.0 - eps, x.dtype))),
        ops.mul(smooth, as_tensor(np.asarray(eps / C, x.dtype))),
    )


def _traced_smoothing(logp, t, weight, ignore_index: int, reduction: str, C: int, x) -> Tensor:
    """The label-smoothing term of :func:`cross_entropy` from the labels on the device (no host read)."""
    labels = t if t.dtype == np.int64 else ops.cast(t, np.int64)
    valid = ops.logical_not(ops.eq(labels, as_tensor(np.asarray(ignore_index, np.int64))))
    valid_f = ops.cast(valid, x.dtype)
    if weight is not None:
        w = as_tensor(weight)
        logp = ops.mul(logp, ops.reshape(w, (1, C) + (1,) * (x.ndim - 2)))
    smooth = ops.mul(ops.neg(ops.sum(logp, dim=1)), valid_f)
    if reduction == "sum":
        return ops.sum(smooth)
    if reduction == "mean":
        if weight is not None:
            safe = ops.where(valid, labels, as_tensor(np.zeros((), np.int64)))
            denom = ops.sum(ops.mul(ops.gather(as_tensor(weight), safe, axis=0), valid_f))
        else:
            denom = ops.sum(valid_f)
        return ops.div(ops.sum(smooth), denom)
    return smooth


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.nll_loss over log-probabilities ``input`` (N, C, ...)."""
    _check_reduction("nll_loss", reduction)
    return ops.nll_loss(input, target, weight, ignore_index=ignore_index, reduction=reduction)


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.mse_loss: squared error, averaged, summed or per element.

    >>> import opsnn, numpy as np
    >>> float(mse_loss(opsnn.tensor(np.array([1.0, 3.0], np.float32)), np.array([0.0, 1.0], np.float32)).item())
    2.5
    """
    _check_reduction("mse_loss", reduction)
    x = as_tensor(input)
    d = ops.sub(x, as_tensor(target, like=x))
    sq = ops.mul(d, d)
    if reduction == "none":
        return sq
    return ops.sum(sq) if reduction == "sum" else ops.mean(sq)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean", pos_weight=None) -> Tensor:
    """torch.nn.functional.binary_cross_entropy_with_logits, in the stable form
    ``(1 - t) x + (1 + (pos_weight - 1) t) softplus(-x)``.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([0.0, 2.0], np.float32))
    >>> round(float(binary_cross_entropy_with_logits(x, np.array([1.0, 0.0], np.float32)).item()), 2)
    1.41
    """
    _check_reduction("binary_cross_entropy_with_logits", reduction)
    x = as_tensor(input)
    t = as_tensor(target, like=x)
    one = as_tensor(np.asarray(1.0, x.dtype))
    sp = ops.softplus(ops.neg(x))
    if pos_weight is not None:
        lw = ops.add(one, ops.mul(ops.sub(as_tensor(pos_weight, like=x), one), t))
        sp = ops.mul(lw, sp)
    loss = ops.add(ops.mul(ops.sub(one, t), x), sp)
    if weight is not None:
        loss = ops.mul(loss, as_tensor(weight, like=x))
    if reduction == "none":
        return loss
    return ops.sum(loss) if reduction == "sum" else ops.mean(loss)


def _reduce(loss, reduction: str) -> Tensor:
    if reduction == "none":
        return loss
    return ops.sum(loss) if reduction == "sum" else ops.mean(loss)


def _pair(what: str, input, target, reduction: str):
    """``input`` and ``target`` as tensors of one shape (torch broadcasts with a warning; opsnn asks)."""
    _check_reduction(what, reduction)
    x = as_tensor(input)
    t = as_tensor(target, like=x)
    if tuple(t.shape) != tuple(x.shape):
        raise ParamInvalidError(f"{what}: target shape {tuple(t.shape)} differs from the input's {tuple(x.shape)}")
    return x, t


def _const(value, like: Tensor) -> Tensor:
    return as_tensor(np.asarray(value, like.dtype))


def l1_loss(input, target, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.l1_loss: ``|input - target|``, reduced."""
    x, t = _pair("l1_loss", input, target, reduction)
    return _reduce(ops.abs(ops.sub(x, t)), reduction)


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """torch.nn.functional.smooth_l1_loss: ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - beta / 2``
    (``beta = 0``: the L1 loss)."""
    x, t = _pair("smooth_l1_loss", input, target, reduction)
    beta = real_number("smooth_l1_loss", "beta", beta)
    if not beta >= 0.0:
        raise ParamInvalidError(f"smooth_l1_loss: beta must be >= 0, got {beta}")
    d = ops.abs(ops.sub(x, t))
    if beta == 0.0:
        return _reduce(d, reduction)
    quad = ops.div(ops.mul(ops.mul(d, d), _const(0.5, x)), _const(beta, x))
    return _reduce(ops.where(ops.lt(d, _const(beta, x)), quad, ops.sub(d, _const(0.5 * beta, x))), reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """torch.nn.functional.huber_loss: ``0.5 d^2`` where ``|d| <= delta``, else ``delta (|d| - delta / 2)``."""
    x, t = _pair("huber_loss", input, target, reduction)
    delta = real_number("huber_loss", "delta", delta)
    if not delta > 0.0:
        raise ParamInvalidError(f"huber_loss: delta must be > 0, got {delta}")
    d = ops.abs(ops.sub(x, t))
    quad = ops.mul(ops.mul(d, d), _const(0.5, x))
    lin = ops.mul(ops.sub(d, _const(0.5 * delta, x)), _const(delta, x))
    return _reduce(ops.where(ops.le(d, _const(delta, x)), quad, lin), reduction)


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.binary_cross_entropy of probabilities ``input``: each log clamped at -100 as
    torch does, so a probability of exactly 0 or 1 gives a finite loss."""
    x, t = _pair("binary_cross_entropy", input, target, reduction)
    floor = _const(-100.0, x)
    one = _const(1.0, x)
    log_p = ops.maximum(ops.log(x), floor)
    log_q = ops.maximum(ops.log(ops.sub(one, x)), floor)
    loss = ops.neg(ops.add(ops.mul(t, log_p), ops.mul(ops.sub(one, t), log_q)))
    if weight is not None:
        loss = ops.mul(loss, as_tensor(weight, like=x))
    return _reduce(loss, reduction)


def kl_div(input, target, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """torch.nn.functional.kl_div: ``target * (log target - input)`` with ``input`` log-probabilities
    (0 where target is 0); ``reduction='batchmean'`` divides the sum by the batch size, as torch advises."""
    if reduction not in _REDUCTIONS + ("batchmean",):
        raise ParamInvalidError(f"kl_div: reduction must be one of {_REDUCTIONS + ('batchmean',)}, got {reduction!r}")
    x, t = _pair("kl_div", input, target, "none")
    if log_target:
        loss = ops.mul(ops.exp(t), ops.sub(t, x))
    else:
        zero = _const(0.0, x)
        safe = ops.where(ops.gt(t, zero), t, _const(1.0, x))
        loss = ops.where(ops.gt(t, zero), ops.mul(t, ops.sub(ops.log(safe), x)), ops.mul(t, zero))
    if reduction == "batchmean":
        return ops.div(ops.sum(loss), _const(x.shape[0] if x.ndim else 1, x))
    return _reduce(loss, reduction)


def normalize(input, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """torch.nn.functional.normalize: ``input / max(||input||_p, eps)`` along ``dim``."""
    x = as_tensor(input)
    p = real_number("normalize", "p", p)
    if not p > 0.0:
        raise ParamInvalidError(f"normalize: p must be > 0, got {p}")
    a = ops.abs(x)
    norm = ops.pow(ops.sum(ops.pow(a, _const(p, x)), dim=dim, keepdim=True), _const(1.0 / p, x))
    return ops.div(x, ops.maximum(norm, _const(eps, x)))


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """torch.nn.functional.cosine_similarity: ``x1 . x2 / max(||x1|| ||x2||, eps)`` along ``dim``."""
    a, b = as_tensor(x1), as_tensor(x2)
    b = as_tensor(b, like=a)
    dot = ops.sum(ops.mul(a, b), dim=dim)
    na = ops.sum(ops.mul(a, a), dim=dim)
    nb = ops.sum(ops.mul(b, b), dim=dim)
    return ops.div(dot, ops.maximum(ops.sqrt(ops.mul(na, nb)), _const(eps, a)))


def _out_of_place(name: str, inplace: bool) -> None:
    if inplace:
        raise ParamInvalidError(
            f"{name}: inplace=True is not supported (opsnn computes out of place): write x = F.{name}(x, ...)"
        )


def hardtanh(input, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """torch.nn.functional.hardtanh: ``input`` clamped to [min_val, max_val]."""
    _out_of_place("hardtanh", inplace)
    lo, hi = real_number("hardtanh", "min_val", min_val), real_number("hardtanh", "max_val", max_val)
    if not lo <= hi:
        raise ParamInvalidError(f"hardtanh: min_val ({lo}) must not exceed max_val ({hi})")
    x = as_tensor(input)
    return ops.clamp(x, _const(lo, x), _const(hi, x))


def relu6(input, inplace: bool = False) -> Tensor:
    """torch.nn.functional.relu6: ``min(max(input, 0), 6)``."""
    _out_of_place("relu6", inplace)
    return hardtanh(input, 0.0, 6.0)


def hardsigmoid(input, inplace: bool = False) -> Tensor:
    """torch.nn.functional.hardsigmoid: ``relu6(input + 3) / 6`` (ONNX HardSigmoid, alpha 1/6, beta 1/2)."""
    _out_of_place("hardsigmoid", inplace)
    return ops.hard_sigmoid(input, 1.0 / 6.0, 0.5)


def hardswish(input, inplace: bool = False) -> Tensor:
    """torch.nn.functional.hardswish: ``input * relu6(input + 3) / 6``."""
    _out_of_place("hardswish", inplace)
    return ops.hard_swish(input)


def selu(input, inplace: bool = False) -> Tensor:
    """torch.nn.functional.selu (torch's alpha and scale)."""
    _out_of_place("selu", inplace)
    return ops.selu(input)


def softplus(input, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """torch.nn.functional.softplus: ``log(1 + exp(beta x)) / beta``, and ``x`` itself where ``beta x >
    threshold`` (as torch, for stability)."""
    x = as_tensor(input)
    beta = real_number("softplus", "beta", beta)
    threshold = real_number("softplus", "threshold", threshold)
    bx = ops.mul(x, _const(beta, x))
    return ops.where(ops.gt(bx, _const(threshold, x)), x, ops.div(ops.softplus(bx), _const(beta, x)))


def unflatten(input, dim: int, sizes) -> Tensor:
    """torch.unflatten: dim ``dim`` of ``input`` split into ``sizes`` (one of them may be -1)."""
    x = as_tensor(input)
    d = dim + x.ndim if dim < 0 else dim
    if not 0 <= d < x.ndim:
        raise ParamInvalidError(f"unflatten: dim {dim} out of range for a {x.ndim}-D tensor")
    sizes = tuple(int(v) for v in sizes)
    known = int(np.prod([v for v in sizes if v != -1]))
    if sizes.count(-1) > 1 or (-1 not in sizes and known != x.shape[d]) or (known and x.shape[d] % known):
        raise ParamInvalidError(f"unflatten: sizes {sizes} do not multiply to dim {dim}'s size {x.shape[d]}")
    return ops.reshape(x, tuple(x.shape[:d]) + sizes + tuple(x.shape[d + 1 :]))


def _channel_dropout(name: str, dims: int, input, p, training, inplace) -> Tensor:
    _out_of_place(name, inplace)
    x = as_tensor(input)
    if x.ndim not in (dims + 1, dims + 2):
        raise ParamInvalidError(
            f"{name}: expected a {dims + 2}-D (N, C, ...) or {dims + 1}-D (C, ...) input, got shape {tuple(x.shape)}"
        )
    if not training or float(p) == 0.0:
        return dropout(x, p, False, name)  # checks p
    keep = (1,) * dims
    mask = dropout(as_tensor(np.ones(tuple(x.shape[: x.ndim - dims]) + keep, x.dtype)), p, True, name)
    return ops.mul(x, mask)


def dropout1d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout1d: whole channels of (N, C, L) zeroed with probability ``p``, the rest
    scaled by ``1/(1-p)``."""
    return _channel_dropout("dropout1d", 1, input, p, training, inplace)


def dropout2d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout2d: whole (H, W) channels zeroed with probability ``p``."""
    return _channel_dropout("dropout2d", 2, input, p, training, inplace)


def dropout3d(input, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout3d: whole (D, H, W) channels zeroed with probability ``p``."""
    return _channel_dropout("dropout3d", 3, input, p, training, inplace)


def instance_norm(
    input,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.instance_norm with each instance's own statistics (``use_input_stats``);
    running statistics are not kept (torch's InstanceNorm default, track_running_stats=False)."""
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise ParamInvalidError(
            "instance_norm: running statistics (track_running_stats=True) are not supported; "
            "each instance is normalised with its own statistics"
        )
    return ops.instance_norm(input, weight, bias, eps=eps)


def adaptive_avg_pool1d(input, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool1d over the last dim of (N, C, L) or (C, L)."""
    x = as_tensor(input)
    out = output_size[0] if isinstance(output_size, (tuple, list)) else output_size
    y = ops.adaptive_avg_pool2d(ops.unsqueeze(x, -1), (int(out), 1))
    return ops.squeeze(y, -1)


def batch_norm(
    input, running_mean, running_var, weight=None, bias=None, training: bool = False, momentum=0.1, eps=1e-5
) -> Tensor:
    """torch.nn.functional.batch_norm: with ``training`` the batch statistics normalise and the running
    statistics given are updated in place (unbiased variance, as torch's); without them nothing is
    updated. Without ``training`` the running statistics normalise (they are required then)."""
    x = as_tensor(input)
    if x.ndim < 2:
        raise ParamInvalidError(f"batch_norm: input must have rank >= 2 (N, C, ...), got shape {tuple(x.shape)}")
    if (running_mean is None) != (running_var is None):
        raise ParamInvalidError("batch_norm: give both running_mean and running_var, or neither")
    if not training:
        if running_mean is None:
            raise ParamInvalidError("batch_norm: running_mean and running_var are required when training=False")
        return ops.batch_norm(x, running_mean, running_var, weight, bias, eps=eps)
    if x.shape[0] * int(np.prod(x.shape[2:])) == 1:
        raise ParamInvalidError(
            f"batch_norm: training needs more than one value per channel, got input shape {tuple(x.shape)}"
        )
    if running_mean is None:
        c = x.shape[1]
        return ops.batch_norm(x, np.zeros(c, x.dtype), np.ones(c, x.dtype), weight, bias, training=True, eps=eps)[0]
    y, mean, var = ops.batch_norm(
        x, running_mean, running_var, weight, bias, training=True, momentum=momentum, eps=eps, unbiased_running_var=True
    )
    for buf, new in ((running_mean, mean), (running_var, var)):
        assign_in_place(buf, new)
    return y


def assign_in_place(buf: Tensor, value: Tensor) -> None:
    """``buf`` overwritten with ``value``: a copy eagerly, an in-place ``Assign`` node in a traced step."""
    from ..autograd import no_grad
    from ..graph.tracing import active_tracer
    from ..ops import get_op

    tracer = active_tracer()
    if tracer is not None and hasattr(tracer, "call_inplace"):
        with no_grad():
            tracer.call_inplace(get_op("Assign", "opsnn"), [buf, value], {}, [buf])
        return
    buf.copy_(value)


# -- torch.nn.functional's names for the ops that already take torch's arguments ------------------------------
#: the torch.nn.functional functions whose ``opsnn.ops`` namesake takes torch's positional arguments in torch's
#: order with torch's semantics (tests/test_functional_torch.py checks each against torch, values and
#: gradients); ``opsnn.nn.functional.<name>`` calls it and also takes torch's ``input=`` keyword and its
#: ``inplace`` flag (False: opsnn computes out of place, and an ignored result would lose the update)
TORCH_FUNCTIONAL = (
    "relu",
    "leaky_relu",
    "elu",
    "celu",
    "gelu",
    "silu",
    "mish",
    "softsign",
    "tanh",
    "sigmoid",
    "hardshrink",
    "softshrink",
    "softmax",
    "log_softmax",
    "layer_norm",
    "group_norm",
    "rms_norm",
    "embedding",
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool2d",
    "interpolate",
    "pad",
    "scaled_dot_product_attention",
    "one_hot",
    "prelu",
    "pixel_shuffle",
    "pixel_unshuffle",
    "grid_sample",
)


#: torch's keyword -> the opsnn.ops keyword, where the two functions spell a parameter differently
_TORCH_KEYWORDS = {"pad": {"pad": "pads"}}


def _torch_functional(name: str):
    fn = getattr(ops, name)
    first = next(iter(inspect.signature(fn).parameters))
    renames = {"input": first, **_TORCH_KEYWORDS.get(name, {})}

    def call(*args, inplace: bool = False, **kwargs):
        _out_of_place(name, inplace)
        return fn(*args, **{renames.get(k, k): v for k, v in kwargs.items()})

    call.__name__ = call.__qualname__ = name
    call.__doc__ = (
        f"torch.nn.functional.{name}: ``opsnn.ops.{name}`` (its arguments in torch's order).\n\n{fn.__doc__ or ''}"
    )
    call.__wrapped__ = fn
    return call


for _name in TORCH_FUNCTIONAL:
    globals()[_name] = _torch_functional(_name)
del _name
