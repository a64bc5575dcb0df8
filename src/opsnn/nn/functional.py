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
    return _fresh_every_run(_draw_seed, "dropout_seed", who)


def _fresh_every_run(draw, name: str, who: str) -> Tensor:
    """``draw()`` as a tensor; while a training step is traced, a runtime input ``draw`` computes again
    before every run (random values must not become constants of the graph)."""
    from ..graph.tracing import TraceError, active_tracer

    t = as_tensor(draw())
    tracer = active_tracer()
    if tracer is not None:
        if not hasattr(tracer, "add_input"):
            raise TraceError(
                f"{who}: training-mode random values are drawn afresh at every run, which only a traced "
                "training step (opsnn.compile(train_step)) feeds; trace the model in eval mode"
            )
        tracer.add_input(t, name, draw)
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


def ctc_loss(
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> Tensor:
    """torch.nn.functional.ctc_loss: the CTC negative log-likelihood of ``targets`` (padded (N, S) or
    concatenated 1-D) under ``log_probs`` (T, N, C) (or unbatched (T, C)), summed over alignments;
    'mean' divides each sample's loss by its target length (at least 1), then averages. The gradient
    w.r.t. ``log_probs`` is the exact one; torch's adds exp(log_probs), a term log_softmax's backward
    cancels, so gradients into the logits before a log_softmax agree with torch's."""
    _check_reduction("ctc_loss", reduction)
    lp = as_tensor(log_probs)
    if lp.ndim not in (2, 3):
        raise ParamInvalidError(f"ctc_loss: log_probs must be (T, N, C) or (T, C), got shape {tuple(lp.shape)}")
    batched = lp.ndim == 3

    def lengths(v, what):
        a = np.asarray(v.numpy() if isinstance(v, Tensor) else v)
        if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.all(a == np.round(a))):
            raise ParamInvalidError(f"ctc_loss: {what} must be integers, got dtype {a.dtype}")
        return a.astype(np.int64).reshape(-1 if batched else 1)

    tg = np.asarray(targets.numpy() if isinstance(targets, Tensor) else targets)
    if tg.dtype.kind not in "iu":
        raise ParamInvalidError(f"ctc_loss: targets must hold integer class labels, got dtype {tg.dtype}")
    if not batched:
        lp, tg = ops.unsqueeze(lp, 1), tg.reshape(1, -1)
    il, tl = lengths(input_lengths, "input_lengths"), lengths(target_lengths, "target_lengths")
    loss = ops.ctc_nll(lp, tg.astype(np.int64), il, tl, blank=blank, zero_infinity=zero_infinity)
    if reduction == "mean":
        return ops.mean(ops.div(loss, as_tensor(np.maximum(tl, 1).astype(lp.dtype))))
    if reduction == "sum":
        return ops.sum(loss)
    return loss if batched else ops.squeeze(loss, 0)


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
    """torch.nn.functional.upsample (torch's older name): :func:`interpolate`."""
    return ops.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor)


def upsample_nearest(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_nearest: :func:`interpolate` with mode 'nearest'."""
    return ops.interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_bilinear: :func:`interpolate` with mode 'bilinear', align_corners=True."""
    return ops.interpolate(input, size, scale_factor, "bilinear", True)


# -- torch.nn.functional written here as compositions of opsnn ops (gradients and tracing come with them) ---------
def _legacy_reduction(what: str, size_average, reduce, reduction: str) -> str:
    """torch's deprecated ``size_average`` / ``reduce`` pair mapped as torch maps it (either set: it wins)."""
    if size_average is None and reduce is None:
        return _check_reduction(what, reduction)
    if reduce is not None and not reduce:
        return "none"
    return "mean" if size_average is None or size_average else "sum"


def _dim(what: str, dim: int, ndim: int) -> int:
    d = int(dim)
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise ParamInvalidError(f"{what}: dim {dim} is out of range for a {ndim}-D input (use -{ndim}..{ndim - 1})")
    return d % max(ndim, 1)


def _ntuple(what: str, name: str, value, n: int, low: int = 1) -> tuple:
    vals = (value,) * n if isinstance(value, (int, np.integer)) else tuple(value)
    if len(vals) != n or any(isinstance(v, bool) or int(v) != v or int(v) < low for v in vals):
        raise ParamInvalidError(f"{what}: {name} must be an int >= {low} or {n} of them, got {value!r}")
    return tuple(int(v) for v in vals)


def _batched(what: str, input, dims: int) -> tuple[Tensor, bool]:
    """``input`` as (N, C, *spatial) with ``dims`` spatial dims, and whether it came unbatched (C, *spatial)."""
    x = as_tensor(input)
    if x.ndim not in (dims + 1, dims + 2):
        raise ParamInvalidError(
            f"{what}: expected a {dims + 2}-D (N, C, ...) or {dims + 1}-D (C, ...) input, got shape {tuple(x.shape)}"
        )
    return (ops.unsqueeze(x, 0), True) if x.ndim == dims + 1 else (x, False)


def _unbatched(y, flag: bool):
    if isinstance(y, tuple):
        return tuple(_unbatched(v, flag) for v in y)
    return ops.squeeze(y, 0) if flag else y


# activations
def logsigmoid(input) -> Tensor:
    """torch.nn.functional.logsigmoid: ``log(sigmoid(x)) = -softplus(-x)``."""
    return ops.neg(ops.softplus(ops.neg(as_tensor(input))))


def _softmax_dtype(x: Tensor, dtype) -> Tensor:
    return x if dtype is None else ops.cast(x, np.dtype(dtype))


def softmin(input, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """torch.nn.functional.softmin: ``softmax(-input, dim)`` (``dtype``: cast first)."""
    x = _softmax_dtype(as_tensor(input), dtype)
    if dim is None:
        raise ParamInvalidError("softmin: pass dim (torch's implicit dim is deprecated)")
    return ops.softmax(ops.neg(x), dim=_dim("softmin", dim, x.ndim))


def tanhshrink(input) -> Tensor:
    """torch.nn.functional.tanhshrink: ``x - tanh(x)``."""
    x = as_tensor(input)
    return ops.sub(x, ops.tanh(x))


def threshold(input, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """torch.nn.functional.threshold: ``value`` where ``x <= threshold``, else ``x`` (NaN stays NaN)."""
    _out_of_place("threshold", inplace)
    x = as_tensor(input)
    th, v = real_number("threshold", "threshold", threshold), real_number("threshold", "value", value)
    return ops.where(ops.le(x, _const(th, x)), _const(v, x), x)


def glu(input, dim: int = -1) -> Tensor:
    """torch.nn.functional.glu: the first half of ``dim`` times the sigmoid of the second."""
    x = as_tensor(input)
    if x.ndim == 0:
        raise ParamInvalidError("glu: does not take a 0-D input")
    d = _dim("glu", dim, x.ndim)
    if x.shape[d] % 2:
        raise ParamInvalidError(f"glu: dim {dim} must have an even size to halve, got {x.shape[d]}")
    a, b = ops.split(x, x.shape[d] // 2, dim=d)
    return ops.mul(a, ops.sigmoid(b))


def softmax2d(input) -> Tensor:
    """torch.nn.Softmax2d's function: softmax over the channels of (N, C, H, W) or (C, H, W)."""
    x = as_tensor(input)
    if x.ndim not in (3, 4):
        raise ParamInvalidError(f"Softmax2d: expected a 3-D or 4-D input, got shape {tuple(x.shape)}")
    return ops.softmax(x, dim=x.ndim - 3)


def _random_like(x: Tensor, name: str, sample) -> Tensor:
    """``sample(generator, shape)`` from opsnn's seeded generator, as ``x``'s dtype (fresh every traced run)."""
    shape = tuple(x.shape)
    return _fresh_every_run(lambda: np.asarray(sample(init.generator(), shape), x.dtype), name, name)


def rrelu(input, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, inplace: bool = False):
    """torch.nn.functional.rrelu: negative inputs times a slope drawn from U(lower, upper) per element
    (opsnn's seeded generator) when ``training``, times ``(lower + upper) / 2`` otherwise."""
    _out_of_place("rrelu", inplace)
    x = as_tensor(input)
    lo, hi = real_number("rrelu", "lower", lower), real_number("rrelu", "upper", upper)
    if not lo <= hi:
        raise ParamInvalidError(f"rrelu: lower ({lo}) must not exceed upper ({hi})")
    if not training:
        return ops.leaky_relu(x, (lo + hi) / 2.0)
    slope = _random_like(x, "rrelu", lambda g, shape: g.uniform(lo, hi, shape))
    return ops.where(ops.lt(x, _const(0.0, x)), ops.mul(x, slope), x)


_SELU_ALPHA_PRIME = -1.7580993408473766  # -selu.scale * selu.alpha: the value SELU saturates to


def _alpha_dropout(name: str, input, p, training, inplace, feature: bool) -> Tensor:
    _out_of_place(name, inplace)
    x = as_tensor(input)
    p = real_number(name, "p", p)
    if not 0.0 <= p <= 1.0:
        raise ParamInvalidError(f"{name}: dropout probability must be in [0, 1], got {p}")
    if feature and x.ndim < 2:
        raise ParamInvalidError(f"{name}: needs an input of at least 2 dims (N, C, ...), got shape {tuple(x.shape)}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return ops.mul(x, _const(0.0, x))
    shape = tuple(x.shape[:2]) + (1,) * (x.ndim - 2) if feature else tuple(x.shape)
    keep = ops.mul(dropout(as_tensor(np.ones(shape, x.dtype)), p, True, name), _const(1.0 - p, x))
    a = ((1.0 - p) * (1.0 + p * _SELU_ALPHA_PRIME**2)) ** -0.5
    dropped = ops.mul(ops.sub(_const(1.0, x), keep), _const(_SELU_ALPHA_PRIME, x))
    return ops.add(ops.mul(ops.add(ops.mul(x, keep), dropped), _const(a, x)), _const(-a * _SELU_ALPHA_PRIME * p, x))


def alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """torch.nn.functional.alpha_dropout: dropped elements set to SELU's saturation value, then an affine map
    that keeps a SELU network's mean and variance."""
    return _alpha_dropout("alpha_dropout", input, p, training, inplace, feature=False)


def feature_alpha_dropout(input, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """torch.nn.functional.feature_alpha_dropout: :func:`alpha_dropout` of whole channels of (N, C, ...)."""
    return _alpha_dropout("feature_alpha_dropout", input, p, training, inplace, feature=True)


def gumbel_softmax(logits, tau: float = 1, hard: bool = False, eps: float = 1e-10, dim: int = -1) -> Tensor:
    """torch.nn.functional.gumbel_softmax: ``softmax((logits + g) / tau)`` with Gumbel noise ``g`` from opsnn's
    seeded generator; ``hard`` returns the one-hot of the argmax with the soft sample's gradient."""
    x = as_tensor(logits)
    tau = real_number("gumbel_softmax", "tau", tau)
    if not tau > 0.0:
        raise ParamInvalidError(f"gumbel_softmax: tau must be > 0, got {tau}")
    d = _dim("gumbel_softmax", dim, x.ndim)
    gumbels = _random_like(x, "gumbel_softmax", lambda g, shape: -np.log(g.exponential(1.0, shape)))
    y = ops.softmax(ops.div(ops.add(x, gumbels), _const(tau, x)), dim=d)
    if not hard:
        return y
    index = ops.argmax(y, dim=d, keepdim=True)
    one = ops.scatter_elements(ops.zeros_like(y.detach()), index, ops.ones_like(ops.cast(index, x.dtype)), axis=d)
    return ops.add(ops.sub(one, y.detach()), y)


# losses
def _per_sample_pair(what: str, a, b) -> tuple[Tensor, Tensor]:
    x1 = as_tensor(a)
    x2 = as_tensor(b, like=x1)
    if tuple(x1.shape) != tuple(x2.shape):
        raise ParamInvalidError(f"{what}: the inputs' shapes differ, {tuple(x1.shape)} and {tuple(x2.shape)}")
    return x1, x2


def _signs(what: str, target, like: Tensor, shape: tuple) -> Tensor:
    t = as_tensor(target)
    if tuple(t.shape) != tuple(shape):
        raise ParamInvalidError(f"{what}: target must have shape {tuple(shape)}, got {tuple(t.shape)}")
    return t if t.dtype == like.dtype else ops.cast(t, like.dtype)


def cosine_embedding_loss(
    input1, input2, target, margin: float = 0, size_average=None, reduce=None, reduction: str = "mean"
) -> Tensor:
    """torch.nn.functional.cosine_embedding_loss: ``1 - cos`` where target is 1, ``max(0, cos - margin)`` where
    it is -1 (cos along the last dim of (N, D) or (D,))."""
    reduction = _legacy_reduction("cosine_embedding_loss", size_average, reduce, reduction)
    x1, x2 = _per_sample_pair("cosine_embedding_loss", input1, input2)
    if x1.ndim not in (1, 2):
        raise ParamInvalidError(f"cosine_embedding_loss: inputs must be (N, D) or (D,), got shape {tuple(x1.shape)}")
    t = _signs("cosine_embedding_loss", target, x1, x1.shape[:-1])
    d = x1.ndim - 1
    eps = _const(1e-12, x1)
    m1 = ops.add(ops.sum(ops.mul(x1, x1), dim=d), eps)
    m2 = ops.add(ops.sum(ops.mul(x2, x2), dim=d), eps)
    cos = ops.div(ops.sum(ops.mul(x1, x2), dim=d), ops.sqrt(ops.mul(m1, m2)))
    zero = _const(0.0, x1)
    pos = ops.where(ops.eq(t, _const(1.0, x1)), ops.sub(_const(1.0, x1), cos), zero)
    neg = ops.where(ops.eq(t, _const(-1.0, x1)), ops.maximum(ops.sub(cos, _const(margin, x1)), zero), zero)
    return _reduce(ops.add(pos, neg), reduction)


def hinge_embedding_loss(input, target, margin: float = 1.0, size_average=None, reduce=None, reduction: str = "mean"):
    """torch.nn.functional.hinge_embedding_loss: ``x`` where target is 1, ``max(0, margin - x)`` where it is -1."""
    reduction = _legacy_reduction("hinge_embedding_loss", size_average, reduce, reduction)
    x = as_tensor(input)
    t = _signs("hinge_embedding_loss", target, x, x.shape)
    zero = _const(0.0, x)
    clamp = ops.maximum(ops.sub(_const(margin, x), x), zero)
    loss = ops.add(ops.where(ops.eq(t, _const(1.0, x)), zero, clamp), ops.where(ops.eq(t, _const(-1.0, x)), zero, x))
    return _reduce(loss, reduction)


def margin_ranking_loss(
    input1, input2, target, margin: float = 0, size_average=None, reduce=None, reduction: str = "mean"
) -> Tensor:
    """torch.nn.functional.margin_ranking_loss: ``max(0, -target * (input1 - input2) + margin)``."""
    reduction = _legacy_reduction("margin_ranking_loss", size_average, reduce, reduction)
    x1, x2 = _per_sample_pair("margin_ranking_loss", input1, input2)
    t = _signs("margin_ranking_loss", target, x1, x1.shape)
    loss = ops.add(ops.neg(ops.mul(t, ops.sub(x1, x2))), _const(margin, x1))
    return _reduce(ops.maximum(loss, _const(0.0, x1)), reduction)


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.soft_margin_loss: ``log(1 + exp(-target * input))``."""
    reduction = _legacy_reduction("soft_margin_loss", size_average, reduce, reduction)
    x, t = _pair("soft_margin_loss", input, target, reduction)
    return _reduce(ops.softplus(ops.neg(ops.mul(t, x))), reduction)


def multilabel_soft_margin_loss(
    input, target, weight=None, size_average=None, reduce=None, reduction: str = "mean"
) -> Tensor:
    """torch.nn.functional.multilabel_soft_margin_loss: per-class logistic loss of (N, C) logits, averaged
    over the classes (``weight`` (C,) scales each class)."""
    reduction = _legacy_reduction("multilabel_soft_margin_loss", size_average, reduce, reduction)
    x, t = _pair("multilabel_soft_margin_loss", input, target, reduction)
    if x.ndim == 0:
        raise ParamInvalidError("multilabel_soft_margin_loss: input must be (N, C) or (C,), got a 0-D tensor")
    loss = ops.neg(ops.add(ops.mul(t, logsigmoid(x)), ops.mul(ops.sub(_const(1.0, x), t), logsigmoid(ops.neg(x)))))
    if weight is not None:
        loss = ops.mul(loss, as_tensor(weight, like=x))
    loss = ops.div(ops.sum(loss, dim=x.ndim - 1), _const(x.shape[-1], x))
    return _reduce(loss, reduction)


def _class_targets(what: str, input, target) -> tuple[Tensor, Tensor, bool]:
    """(N, C) input and (N,) int64 class targets (an unbatched (C,) input with a 0-D or (1,) target: N = 1)."""
    x = as_tensor(input)
    t = as_tensor(target)
    if t.dtype.kind not in "iu":
        raise DTypeError(f"{what}: target must hold integer class indices, got {t.dtype}")
    single = x.ndim <= 1
    x = ops.reshape(x, (1, -1)) if single else x
    t = ops.reshape(t, (-1,)) if single else t
    if x.ndim != 2 or tuple(t.shape) != (x.shape[0],):
        raise ParamInvalidError(
            f"{what}: expected (N, C) input and (N,) target, got {tuple(x.shape)} and {tuple(t.shape)}"
        )
    return x, (t if t.dtype == np.int64 else ops.cast(t, np.int64)), single


def _pick(x: Tensor, classes: Tensor) -> Tensor:
    """``x[n, classes[n, k]]`` for (N, C) ``x``, as a one-hot product (its gradient needs no host read)."""
    hot = ops.cast(ops.one_hot(classes, x.shape[1]), x.dtype)  # (N, K, C)
    return ops.sum(ops.mul(hot, ops.unsqueeze(x, 1)), dim=2)


def _reduce_single(loss, reduction: str, single: bool) -> Tensor:
    loss = _reduce(loss, reduction)
    return ops.reshape(loss, ()) if single and reduction == "none" else loss


def multi_margin_loss(
    input, target, p: int = 1, margin: float = 1.0, weight=None, size_average=None, reduce=None, reduction="mean"
) -> Tensor:
    """torch.nn.functional.multi_margin_loss: ``sum_{i != y} max(0, margin - x[y] + x[i])^p / C`` per sample
    (``p`` 1 or 2; ``weight`` (C,) scales by the target class's weight)."""
    reduction = _legacy_reduction("multi_margin_loss", size_average, reduce, reduction)
    if p not in (1, 2):
        raise ParamInvalidError(f"multi_margin_loss: p must be 1 or 2, got {p!r}")
    x, t, single = _class_targets("multi_margin_loss", input, target)
    C = x.shape[1]
    xy = _pick(x, ops.unsqueeze(t, 1))
    z = ops.maximum(ops.add(ops.sub(_const(margin, x), xy), x), _const(0.0, x))
    z = ops.mul(z, z) if p == 2 else z
    if weight is not None:
        z = ops.mul(z, ops.unsqueeze(ops.gather(as_tensor(weight, like=x), t, axis=0), 1))
    not_y = ops.logical_not(ops.eq(ops.unsqueeze(t, 1), as_tensor(np.arange(C, dtype=np.int64))))
    loss = ops.div(ops.sum(ops.where(not_y, z, _const(0.0, x)), dim=1), _const(C, x))
    return _reduce_single(loss, reduction, single)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.multilabel_margin_loss: ``target`` (N, C) holds each sample's classes, ended by the
    first -1; the loss sums ``max(0, 1 - (x[j] - x[i])) / C`` over its classes j and the other classes i."""
    reduction = _legacy_reduction("multilabel_margin_loss", size_average, reduce, reduction)
    x = as_tensor(input)
    t = as_tensor(target)
    if t.dtype.kind not in "iu":
        raise DTypeError(f"multilabel_margin_loss: target must hold integer class indices, got {t.dtype}")
    if x.ndim not in (1, 2) or tuple(t.shape) != tuple(x.shape):
        raise ParamInvalidError(
            f"multilabel_margin_loss: input and target must both be (N, C) or (C,), got {tuple(x.shape)} and "
            f"{tuple(t.shape)}"
        )
    single = x.ndim == 1
    x, t = (ops.unsqueeze(x, 0), ops.unsqueeze(t, 0)) if single else (x, t)
    t = t if t.dtype == np.int64 else ops.cast(t, np.int64)
    C = x.shape[1]
    listed = ops.cumprod(ops.cast(ops.ge(t, as_tensor(np.zeros((), np.int64))), x.dtype), dim=1)  # before the first -1
    safe = ops.where(ops.gt(listed, _const(0.0, x)), t, as_tensor(np.zeros((), np.int64)))
    hit = ops.mul(ops.cast(ops.one_hot(safe, C), x.dtype), ops.unsqueeze(listed, 2))  # (N, K, C)
    other = ops.sub(_const(1.0, x), ops.minimum(ops.sum(hit, dim=1), _const(1.0, x)))  # (N, C)
    xj = _pick(x, safe)  # (N, K)
    z = ops.maximum(ops.add(ops.sub(_const(1.0, x), ops.unsqueeze(xj, 2)), ops.unsqueeze(x, 1)), _const(0.0, x))
    z = ops.mul(ops.mul(z, ops.unsqueeze(listed, 2)), ops.unsqueeze(other, 1))
    return _reduce_single(ops.div(ops.sum(z, dim=(1, 2)), _const(C, x)), reduction, single)


def poisson_nll_loss(
    input,
    target,
    log_input: bool = True,
    full: bool = False,
    size_average=None,
    eps: float = 1e-8,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """torch.nn.functional.poisson_nll_loss: ``exp(x) - t x`` (``log_input``) or ``x - t log(x + eps)``;
    ``full`` adds Stirling's term ``t log t - t + log(2 pi t) / 2`` where ``t > 1``."""
    reduction = _legacy_reduction("poisson_nll_loss", size_average, reduce, reduction)
    x, t = _pair("poisson_nll_loss", input, target, reduction)
    if log_input:
        loss = ops.sub(ops.exp(x), ops.mul(t, x))
    else:
        loss = ops.sub(x, ops.mul(t, ops.log(ops.add(x, _const(eps, x)))))
    if full:
        one = _const(1.0, x)
        safe = ops.where(ops.gt(t, one), t, one)
        stirling = ops.add(
            ops.sub(ops.mul(safe, ops.log(safe)), safe),
            ops.mul(ops.log(ops.mul(safe, _const(2 * np.pi, x))), _const(0.5, x)),
        )
        loss = ops.add(loss, ops.where(ops.gt(t, one), stirling, _const(0.0, x)))
    return _reduce(loss, reduction)


def gaussian_nll_loss(input, target, var, full: bool = False, eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.gaussian_nll_loss: ``(log(var) + (input - target)^2 / var) / 2`` (plus ``log(2 pi) / 2``
    with ``full``); ``var`` is clamped at ``eps`` for the value only (its gradient passes), as torch does. ``var``
    has the input's shape, or it with the last dim 1 or dropped, or is a number."""
    _check_reduction("gaussian_nll_loss", reduction)
    x = as_tensor(input)
    t = as_tensor(target, like=x)
    v = as_tensor(np.full(tuple(x.shape), var, x.dtype)) if isinstance(var, (int, float)) else as_tensor(var, like=x)
    if tuple(t.shape) != tuple(x.shape):
        raise ParamInvalidError(
            f"gaussian_nll_loss: target shape {tuple(t.shape)} differs from the input's {tuple(x.shape)}"
        )
    if tuple(v.shape) == tuple(x.shape[:-1]) and x.ndim:
        v = ops.unsqueeze(v, -1)
    if tuple(v.shape) not in (tuple(x.shape), tuple(x.shape[:-1]) + (1,)):
        raise ParamInvalidError(
            f"gaussian_nll_loss: var of shape {tuple(v.shape)} does not fit the input's {tuple(x.shape)}"
        )
    if _host_any(ops.lt(v, _const(0.0, x))):
        raise ParamInvalidError("gaussian_nll_loss: var has negative entries; variances must be >= 0")
    v = ops.add(v, ops.sub(ops.maximum(v, _const(eps, x)), v).detach())
    d = ops.sub(x, t)
    loss = ops.mul(ops.add(ops.log(v), ops.div(ops.mul(d, d), v)), _const(0.5, x))
    if full:
        loss = ops.add(loss, _const(0.5 * np.log(2 * np.pi), x))
    return _reduce(loss, reduction)


def _host_any(mask: Tensor) -> bool:
    """Whether ``mask`` has a True (a check: False while a training step is traced, the graph has no host)."""
    from ..tensor import tracing_training_step

    if tracing_training_step():
        return False
    return bool(np.any(mask.numpy()))


def pairwise_distance(x1, x2, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """torch.nn.functional.pairwise_distance: ``||x1 - x2 + eps||_p`` over the last dim (``p`` >= 0 or inf)."""
    a = as_tensor(x1)
    b = as_tensor(x2, like=a)
    return _p_norm("pairwise_distance", ops.add(ops.sub(a, b), _const(eps, a)), p, -1, keepdim)


def _p_norm(what: str, d: Tensor, p, dim: int, keepdim: bool) -> Tensor:
    p = real_number(what, "p", p)
    if not p >= 0.0:
        raise ParamInvalidError(f"{what}: p must be >= 0 (or inf), got {p}")
    if d.ndim == 0:
        d = ops.reshape(d, (1,))
    a = ops.abs(d)
    if p == np.inf:
        return ops.max(a, dim=dim, keepdim=keepdim)
    if p == 0.0:
        return ops.sum(ops.cast(ops.gt(a, _const(0.0, d)), d.dtype), dim=dim, keepdim=keepdim)
    if p == 1.0:
        return ops.sum(a, dim=dim, keepdim=keepdim)
    if p == 2.0:
        return ops.sqrt(ops.sum(ops.mul(d, d), dim=dim, keepdim=keepdim))
    return ops.pow(ops.sum(ops.pow(a, _const(p, d)), dim=dim, keepdim=keepdim), _const(1.0 / p, d))


def pdist(input, p: float = 2) -> Tensor:
    """torch.nn.functional.pdist: the p-norm distance of every pair of rows i < j of (N, M), in row-major order."""
    x = as_tensor(input)
    if x.ndim != 2:
        raise ParamInvalidError(f"pdist: input must be (N, M), got shape {tuple(x.shape)}")
    i, j = np.triu_indices(x.shape[0], 1)
    d = ops.sub(
        ops.gather(x, as_tensor(i.astype(np.int64)), axis=0), ops.gather(x, as_tensor(j.astype(np.int64)), axis=0)
    )
    return _p_norm("pdist", d, p, -1, False)


def _triplet(what, anchor, positive, negative, distance, margin, swap, reduction) -> Tensor:
    a = as_tensor(anchor)
    pos, neg = as_tensor(positive, like=a), as_tensor(negative, like=a)
    if not (tuple(a.shape) == tuple(pos.shape) == tuple(neg.shape)) or a.ndim not in (1, 2):
        raise ParamInvalidError(
            f"{what}: anchor, positive and negative must be (N, D) or (D,) of one shape, got "
            f"{tuple(a.shape)}, {tuple(pos.shape)} and {tuple(neg.shape)}"
        )
    d_pos, d_neg = distance(a, pos), distance(a, neg)
    if swap:
        d_neg = ops.minimum(d_neg, distance(pos, neg))
    return _reduce(ops.maximum(ops.add(ops.sub(d_pos, d_neg), _const(margin, a)), _const(0.0, a)), reduction)


def triplet_margin_loss(
    anchor,
    positive,
    negative,
    margin: float = 1.0,
    p: float = 2,
    eps: float = 1e-6,
    swap: bool = False,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """torch.nn.functional.triplet_margin_loss: ``max(0, d(a, p) - d(a, n) + margin)`` with ``d`` the
    :func:`pairwise_distance`; ``swap`` uses ``min(d(a, n), d(p, n))``."""
    reduction = _legacy_reduction("triplet_margin_loss", size_average, reduce, reduction)
    margin = real_number("triplet_margin_loss", "margin", margin)

    def distance(u, v):
        return pairwise_distance(u, v, p, eps)

    return _triplet("triplet_margin_loss", anchor, positive, negative, distance, margin, swap, reduction)


def triplet_margin_with_distance_loss(
    anchor, positive, negative, *, distance_function=None, margin: float = 1.0, swap: bool = False, reduction="mean"
) -> Tensor:
    """torch.nn.functional.triplet_margin_with_distance_loss: the triplet loss with ``distance_function``
    (default :func:`pairwise_distance`); ``margin`` must be > 0."""
    _check_reduction("triplet_margin_with_distance_loss", reduction)
    margin = real_number("triplet_margin_with_distance_loss", "margin", margin)
    if not margin > 0.0:
        raise ParamInvalidError(f"triplet_margin_with_distance_loss: margin must be > 0, got {margin}")
    distance = pairwise_distance if distance_function is None else distance_function
    return _triplet("triplet_margin_with_distance_loss", anchor, positive, negative, distance, margin, swap, reduction)


# pooling, vision and shape
def _plane_indices(idx: Tensor, spatial: tuple) -> Tensor:
    """ONNX MaxPool's indices (flat over N, C and the plane) as torch's (flat within each plane)."""
    return ops.remainder(idx, as_tensor(np.asarray(int(np.prod(spatial)), np.int64)))


def _max_pool(dims: int):
    pool = getattr(ops, f"max_pool{dims}d")
    name = f"max_pool{dims}d"

    def max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        x, single = _batched(name, input, dims)
        if not return_indices:
            return _unbatched(pool(x, kernel_size, stride, padding, dilation, ceil_mode), single)
        y, idx = pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
        return _unbatched((y, _plane_indices(idx, tuple(x.shape[2:]))), single)

    max_pool.__name__ = max_pool.__qualname__ = name
    max_pool.__doc__ = (
        f"torch.nn.functional.{name}: ``opsnn.ops.{name}``, with ``return_indices`` torch's indices (flat "
        "within each (N, C) plane, the ones max_unpool takes)."
    )
    return max_pool


max_pool1d = _max_pool(1)
max_pool2d = _max_pool(2)
max_pool3d = _max_pool(3)


def _with_indices(fn):
    def with_indices(*args, **kwargs):
        kwargs["return_indices"] = True
        return fn(*args, **kwargs)

    with_indices.__name__ = with_indices.__qualname__ = f"{fn.__name__}_with_indices"
    with_indices.__doc__ = f"torch.nn.functional.{fn.__name__}_with_indices: :func:`{fn.__name__}` with its indices."
    return with_indices


max_pool1d_with_indices = _with_indices(max_pool1d)
max_pool2d_with_indices = _with_indices(max_pool2d)
max_pool3d_with_indices = _with_indices(max_pool3d)


def _max_unpool(dims: int):
    name = f"max_unpool{dims}d"

    def max_unpool(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        x, single = _batched(name, input, dims)
        i = as_tensor(indices)
        i = ops.unsqueeze(i, 0) if single else i
        if tuple(i.shape) != tuple(x.shape) or i.dtype.kind not in "iu":
            raise ParamInvalidError(
                f"{name}: indices must be integers of the input's shape {tuple(x.shape)}, got {i.dtype}{tuple(i.shape)}"
            )
        k = _ntuple(name, "kernel_size", kernel_size, dims)
        s = k if stride is None else _ntuple(name, "stride", stride, dims)
        p = _ntuple(name, "padding", padding, dims, low=0)
        if output_size is None:
            size = tuple((n - 1) * st - 2 * pd + kk for n, st, pd, kk in zip(x.shape[2:], s, p, k))
        else:
            size = tuple(int(v) for v in output_size)[-dims:]
            if len(tuple(output_size)) not in (dims, dims + 2) or len(size) != dims:
                raise ParamInvalidError(
                    f"{name}: output_size must have {dims} or {dims + 2} entries, got {output_size!r}"
                )
        N, C = x.shape[:2]
        plane = int(np.prod(size))
        # torch's indices are within each plane; ONNX MaxUnpool's run over the whole (N, C, *size) tensor
        base = (np.arange(N * C, dtype=np.int64) * plane).reshape((N, C) + (1,) * dims)
        flat = ops.add(ops.cast(i, np.int64), as_tensor(base))
        shape = as_tensor(np.asarray((N, C) + size, np.int64))
        attrs = {"kernel_shape": list(k), "strides": list(s), "pads": list(p) * 2}
        y = ops.run_op("MaxUnpool", [x, flat, shape], attrs)[0]
        return _unbatched(y, single)

    max_unpool.__name__ = max_unpool.__qualname__ = name
    max_unpool.__doc__ = (
        f"torch.nn.functional.{name}: ``input`` scattered to torch's per-plane ``indices`` (from max_pool{dims}d "
        "with return_indices) of a zero tensor; ``output_size`` picks the size where several pool to one shape."
    )
    return max_unpool


max_unpool1d = _max_unpool(1)
max_unpool2d = _max_unpool(2)
max_unpool3d = _max_unpool(3)


def _adaptive_table(sizes: tuple, outs: tuple) -> tuple[np.ndarray, np.ndarray]:
    """torch's adaptive windows (start ``floor(i L / out)``, end ``ceil((i + 1) L / out)``) as a table of flat
    plane indices (prod(outs), K) and the mask of the real entries (shorter windows padded)."""
    dims = len(sizes)
    table, valid = np.zeros((), np.int64), np.ones((), bool)
    stride = int(np.prod(sizes))
    for d, (L, O) in enumerate(zip(sizes, outs)):
        i = np.arange(O)
        start, end = (i * L) // O, -((-(i + 1) * L) // O)
        K = int((end - start).max())
        idx = start[:, None] + np.arange(K)[None, :]
        ok = idx < end[:, None]
        shape = [1] * (2 * dims)
        shape[d], shape[dims + d] = O, K
        stride //= L
        table = table + (np.minimum(idx, end[:, None] - 1) * stride).reshape(shape)
        valid = valid & ok.reshape(shape)
    n_out = int(np.prod(outs))
    return table.reshape(n_out, -1).astype(np.int64), np.broadcast_to(valid, table.shape).reshape(n_out, -1)


def _adaptive(name: str, input, output_size, dims: int, return_indices: bool = False, average: bool = False):
    x, single = _batched(name, input, dims)
    sizes = tuple(x.shape[2:])
    req = (
        (output_size,) * dims
        if isinstance(output_size, (int, np.integer)) or output_size is None
        else tuple(output_size)
    )
    if len(req) != dims:
        raise ParamInvalidError(
            f"{name}: output_size must be an int or {dims} of them (None keeps a size), got {output_size!r}"
        )
    outs = tuple(L if o is None else int(o) for L, o in zip(sizes, req))
    if any(o < 1 for o in outs) or any(L < 1 for L in sizes):
        raise ParamInvalidError(f"{name}: output_size {outs} and the input's sizes {sizes} must all be >= 1")
    table, valid = _adaptive_table(sizes, outs)
    N, C = x.shape[:2]
    flat = ops.reshape(x, (N, C, -1))
    windows = ops.reshape(ops.gather(flat, as_tensor(table.reshape(-1)), axis=2), (N, C) + table.shape)
    if average:
        weights = valid / valid.sum(axis=1, keepdims=True)
        y = ops.sum(ops.mul(windows, as_tensor(weights.astype(x.dtype))), dim=-1)
        return _unbatched(ops.reshape(y, (N, C) + outs), single)
    masked = ops.where(as_tensor(valid), windows, _const(-np.inf, x))
    y = ops.reshape(ops.max(masked, dim=-1), (N, C) + outs)
    if not return_indices:
        return _unbatched(y, single)
    pick = ops.argmax(masked, dim=-1, keepdim=True)
    idx = ops.gather_elements(as_tensor(np.broadcast_to(table, (N, C) + table.shape).copy()), pick, axis=3)
    return _unbatched((y, ops.reshape(idx, (N, C) + outs)), single)


def adaptive_max_pool1d(input, output_size, return_indices: bool = False):
    """torch.nn.functional.adaptive_max_pool1d over (N, C, L) or (C, L) (torch's windows and indices)."""
    return _adaptive("adaptive_max_pool1d", input, output_size, 1, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices: bool = False):
    """torch.nn.functional.adaptive_max_pool2d over (N, C, H, W) or (C, H, W); None in output_size keeps a size."""
    return _adaptive("adaptive_max_pool2d", input, output_size, 2, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices: bool = False):
    """torch.nn.functional.adaptive_max_pool3d over (N, C, D, H, W) or (C, D, H, W)."""
    return _adaptive("adaptive_max_pool3d", input, output_size, 3, return_indices)


adaptive_max_pool1d_with_indices = _with_indices(adaptive_max_pool1d)
adaptive_max_pool2d_with_indices = _with_indices(adaptive_max_pool2d)
adaptive_max_pool3d_with_indices = _with_indices(adaptive_max_pool3d)


def adaptive_avg_pool3d(input, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool3d over (N, C, D, H, W) or (C, D, H, W) (torch's windows)."""
    return _adaptive("adaptive_avg_pool3d", input, output_size, 3, average=True)


def _lp_pool(dims: int):
    name = f"lp_pool{dims}d"
    avg = getattr(ops, f"avg_pool{dims}d")

    def lp_pool(input, norm_type, kernel_size, stride=None, ceil_mode=False):
        x = as_tensor(input)
        p = real_number(name, "norm_type", norm_type)
        if not p > 0.0:
            raise ParamInvalidError(f"{name}: norm_type must be > 0, got {p}")
        k = _ntuple(name, "kernel_size", kernel_size, dims)
        x4, single = _batched(name, x, dims)
        s = k if stride is None else _ntuple(name, "stride", stride, dims)
        out = avg(ops.pow(x4, _const(p, x)), k, s, 0, ceil_mode)
        # torch's formula: the window sum of x^p (not |x|^p), its negative part clamped away, to the 1/p
        out = ops.mul(ops.mul(ops.sign(out), ops.relu(ops.abs(out))), _const(int(np.prod(k)), x))
        return _unbatched(ops.pow(out, _const(1.0 / p, x)), single)

    lp_pool.__name__ = lp_pool.__qualname__ = name
    lp_pool.__doc__ = f"torch.nn.functional.{name}: ``(sum over each window of x^p)^(1/p)``, torch's formula."
    return lp_pool


lp_pool1d = _lp_pool(1)
lp_pool2d = _lp_pool(2)
lp_pool3d = _lp_pool(3)


def local_response_norm(input, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """torch.nn.functional.local_response_norm: ``x / (k + alpha / size * sum x^2)^beta``, the sum over channels
    ``c - size // 2 .. c + (size - 1) // 2`` (torch's window; ONNX LRN centres even sizes the other way)."""
    x = as_tensor(input)
    if x.ndim < 3:
        raise ParamInvalidError(
            f"local_response_norm: expected an input of 3 or more dims (N, C, ...), got shape {tuple(x.shape)}"
        )
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ParamInvalidError(f"local_response_norm: size must be an int >= 1, got {size!r}")
    size = int(size)
    N, C = x.shape[:2]
    sq = ops.reshape(ops.mul(x, x), (N, 1, C, -1))
    sq = ops.pad(sq, (0, 0, size // 2, (size - 1) // 2))
    div = ops.reshape(ops.avg_pool2d(sq, (size, 1), (1, 1)), tuple(x.shape))
    div = ops.pow(ops.add(ops.mul(div, _const(alpha, x)), _const(k, x)), _const(beta, x))
    return ops.div(x, div)


def channel_shuffle(input, groups: int) -> Tensor:
    """torch.nn.functional.channel_shuffle: the channels of (N, C, *) as (groups, C / groups), transposed."""
    x = as_tensor(input)
    if isinstance(groups, bool) or int(groups) != groups or groups < 1:
        raise ParamInvalidError(f"channel_shuffle: groups must be an int >= 1, got {groups!r}")
    if x.ndim < 3 or x.shape[1] % int(groups):
        raise ParamInvalidError(
            f"channel_shuffle: expected (N, C, *) with C divisible by groups={groups}, got shape {tuple(x.shape)}"
        )
    g = int(groups)
    rest = tuple(x.shape[2:])
    y = ops.reshape(x, (x.shape[0], g, x.shape[1] // g) + rest)
    y = ops.transpose(y, (0, 2, 1) + tuple(range(3, y.ndim)))
    return ops.reshape(y, tuple(x.shape))


def _fold_args(what: str, kernel_size, dilation, padding, stride) -> tuple:
    return tuple(
        _ntuple(what, n, v, 2, low)
        for n, v, low in (
            ("kernel_size", kernel_size, 1),
            ("dilation", dilation, 1),
            ("padding", padding, 0),
            ("stride", stride, 1),
        )
    )


def unfold(input, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """torch.nn.functional.unfold (im2col): (N, C, H, W) -> (N, C * kh * kw, L) sliding blocks, a grouped
    convolution with one-hot kernels."""
    x, single = _batched("unfold", input, 2)
    k, d, p, s = _fold_args("unfold", kernel_size, dilation, padding, stride)
    C, kk = x.shape[1], k[0] * k[1]
    w = np.tile(np.eye(kk, dtype=x.dtype).reshape(kk, 1, k[0], k[1]), (C, 1, 1, 1))
    y = ops.conv2d(x, as_tensor(w), None, s, p, d, C)
    return _unbatched(ops.reshape(y, (x.shape[0], C * kk, -1)), single)


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """torch.nn.functional.fold (col2im): (N, C * kh * kw, L) blocks summed into (N, C, *output_size)."""
    x = as_tensor(input)
    if x.ndim not in (2, 3):
        raise ParamInvalidError(f"fold: expected a 3-D (N, C*kh*kw, L) or 2-D input, got shape {tuple(x.shape)}")
    single = x.ndim == 2
    x = ops.unsqueeze(x, 0) if single else x
    k, d, p, s = _fold_args("fold", kernel_size, dilation, padding, stride)
    out = _ntuple("fold", "output_size", output_size, 2)
    blocks = [(o + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for o, pp, dd, kk, ss in zip(out, p, d, k, s)]
    if x.shape[1] % (k[0] * k[1]) or x.shape[2] != blocks[0] * blocks[1]:
        raise ParamInvalidError(
            f"fold: input of shape {tuple(x.shape)} needs dim 1 divisible by {k[0] * k[1]} (kernel_size) and "
            f"dim 2 = {blocks[0] * blocks[1]} blocks for output_size {out}"
        )
    y = ops.col2im(
        x, np.asarray(out, np.int64), np.asarray(k, np.int64), dilations=list(d), pads=list(p) * 2, strides=list(s)
    )
    return _unbatched(y, single)


def affine_grid(theta, size, align_corners=None) -> Tensor:
    """torch.nn.functional.affine_grid: the sampling grid (N, H, W, 2) (or (N, D, H, W, 3)) of the affine maps
    ``theta`` (N, 2, 3) (or (N, 3, 4)) for an output of ``size``, as grid_sample takes it."""
    th = as_tensor(theta)
    size = tuple(int(v) for v in size)
    if th.dtype.kind != "f":
        raise DTypeError(f"affine_grid: theta must be floating point, got {th.dtype}")
    dims = len(size) - 2
    if dims not in (2, 3) or tuple(th.shape) != (size[0], dims, dims + 1):
        raise ParamInvalidError(
            f"affine_grid: size must be (N, C, H, W) with theta (N, 2, 3) or (N, C, D, H, W) with theta (N, 3, 4); "
            f"got size {size} and theta {tuple(th.shape)}"
        )
    if min(size) < 1:
        raise ParamInvalidError(f"affine_grid: size must be positive, got {size}")
    align = bool(align_corners)

    def coords(n: int) -> np.ndarray:
        c = np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        return c if align else c * (n - 1) / n

    grids = np.meshgrid(*[coords(n) for n in size[2:]], indexing="ij")
    base = np.stack([*grids[::-1], np.ones(size[2:])], axis=-1)  # x (width) first, as grid_sample reads it
    base = as_tensor(base.reshape(1, -1, dims + 1).astype(th.dtype))
    grid = ops.matmul(base, ops.transpose(th, (0, 2, 1)))
    return ops.reshape(grid, (size[0],) + size[2:] + (dims,))


def _in_place_variant(name: str, fn):
    from ..ops.tensor_methods import _in_place

    method = _in_place(name, fn)
    method.__doc__ = (
        f"torch.nn.functional.{name}: :func:`{fn.__name__}` written into ``input`` (refused, as torch refuses it, "
        "where grad mode is on and ``input`` requires grad)."
    )
    return method


relu_ = _in_place_variant("relu_", ops.relu)
elu_ = _in_place_variant("elu_", ops.elu)
celu_ = _in_place_variant("celu_", ops.celu)
leaky_relu_ = _in_place_variant("leaky_relu_", ops.leaky_relu)
selu_ = _in_place_variant("selu_", selu)
hardtanh_ = _in_place_variant("hardtanh_", hardtanh)
threshold_ = _in_place_variant("threshold_", threshold)
rrelu_ = _in_place_variant("rrelu_", rrelu)
