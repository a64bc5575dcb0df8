"""Layers with torch's names, arguments and parameter layouts, running on opsnn ops:
Linear, Bilinear, Conv2d, BatchNorm1d/2d/3d, LayerNorm, RMSNorm, GroupNorm, Embedding, EmbeddingBag,
Dropout, the activation modules and the lazy LazyLinear / LazyConv1d-3d.

>>> import opsnn, numpy as np
>>> conv = opsnn.nn.Conv2d(3, 8, 3, padding=1, config={"algo": "conv2d_im2col"})
>>> conv(opsnn.tensor(np.ones((1, 3, 8, 8), np.float32))).shape
(1, 8, 8, 8)
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..errors import ParamInvalidError
from ..ops.registry import get_op
from ..tensor import as_tensor
from . import functional as F
from . import init
from .functional import check_token_ids, dropout, reshape
from .module import Module, Parameter


class OutOfVocabularyError(ParamInvalidError):
    """A token id lies outside an embedding table."""


def _pair(v, name: str) -> tuple:
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v))
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return (int(v[0]), int(v[1]))
    raise ParamInvalidError(f"Conv2d: {name} must be an int or a pair of ints, got {v!r}")


class Identity(Module):
    def forward(self, x):
        return x


class Linear(Module):
    """``y = x W^T + b`` with ``weight`` (out_features, in_features), torch's layout and init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype="float32"):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        shape = (self.out_features, self.in_features)
        self.weight = Parameter(init.kaiming_uniform(shape, dtype=dtype))
        if bias:
            b = init.fan_in_bound(shape)
            self.bias = Parameter(init.uniform((self.out_features,), -b, b, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def conv_kernels() -> list[str]:
    """Names of the registered Conv kernels (what ``Conv2d(config={"algo": ...})`` accepts)."""
    return [k.name for k in get_op("Conv").kernels]


def resolve_conv_algo(algo: str) -> str:
    """The Conv kernel named by ``algo``: its exact name, or a short form (``"winograd"`` for
    ``conv2d_winograd``, ``"im2col"`` for ``conv2d_im2col``); anything else raises, listing the
    registered Conv kernels."""
    names = conv_kernels()
    if algo in names:
        return algo
    if f"conv2d_{algo}" in names:
        return f"conv2d_{algo}"
    hits = [n for n in names if isinstance(algo, str) and algo and algo in n]
    if len(hits) == 1:
        return hits[0]
    why = f"matches several ({hits})" if hits else "is not a registered Conv kernel"
    raise ParamInvalidError(f"Conv2d: config algo {algo!r} {why}; available Conv kernels: {names}")


class Conv2d(Module):
    """2-D convolution, torch's arguments and ``weight`` layout (out, in/groups, kh, kw).

    ``config={"algo": name}`` pins the Conv kernel used on every call (``algo=`` of
    ``opsnn.ops.conv2d``); ``name`` is a kernel name or its short form (``"winograd"`` ->
    ``conv2d_winograd``); an unknown name fails here, listing the registered kernels.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        dtype="float32",
        config: dict | None = None,
    ):
        super().__init__()
        if padding_mode != "zeros":
            raise ParamInvalidError(f"Conv2d: only padding_mode='zeros' is supported, got {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise ParamInvalidError(
                f"Conv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                f"be divisible by groups ({groups})"
            )
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        self.padding = padding if isinstance(padding, str) else _pair(padding, "padding")
        self.algo = None
        config = dict(config or {})
        algo = config.pop("algo", None)
        if config:
            raise ParamInvalidError(f"Conv2d: unknown config keys {sorted(config)}; supported: ['algo']")
        if algo is not None:
            self.algo = resolve_conv_algo(algo)
        shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        self.weight = Parameter(init.kaiming_uniform(shape, dtype=dtype))
        if bias:
            b = init.fan_in_bound(shape)
            self.bias = Parameter(init.uniform((self.out_channels,), -b, b, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        return ops.conv2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            algo=self.algo,
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}"
        )
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.algo:
            s += f", algo={self.algo!r}"
        return s + ("" if self.bias is not None else ", bias=False")


def _tuple(v, n: int, what: str, name: str) -> tuple:
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    if isinstance(v, (tuple, list)) and len(v) == n and all(isinstance(i, (int, np.integer)) for i in v):
        return tuple(int(i) for i in v)
    raise ParamInvalidError(f"{what}: {name} must be an int or {n} ints, got {v!r}")


class _ConvNd(Module):
    """Conv1d / Conv3d and ConvTranspose1d/2d/3d with torch's arguments, parameter layouts (a
    transposed convolution's weight is (in, out/groups, *kernel)) and initialisation (Conv2d, with its
    kernel pinning, is its own class)."""

    nd = 0
    transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        *rest,
        bias: bool = True,
        padding_mode: str = "zeros",
        dtype="float32",
        **kw,
    ):
        super().__init__()
        what = type(self).__name__
        # torch's order: ... padding, dilation, groups, bias (Conv); ... padding, output_padding, groups, bias,
        # dilation (ConvTranspose)
        names = ("output_padding", "groups", "bias", "dilation") if self.transposed else ("dilation", "groups", "bias")
        if len(rest) > len(names):
            raise ParamInvalidError(f"{what}: too many positional arguments")
        opts = {"output_padding": 0, "groups": 1, "dilation": 1, "bias": bias}
        opts.update(dict(zip(names, rest)))
        for k, v in kw.items():
            if k not in opts:
                raise ParamInvalidError(f"{what}: unexpected keyword {k!r}")
            opts[k] = v
        if padding_mode != "zeros":
            raise ParamInvalidError(f"{what}: only padding_mode='zeros' is supported, got {padding_mode!r}")
        groups = int(opts["groups"])
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ParamInvalidError(
                f"{what}: in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by "
                f"groups ({groups})"
            )
        n = self.nd
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), groups
        self.kernel_size = _tuple(kernel_size, n, what, "kernel_size")
        self.stride, self.dilation = _tuple(stride, n, what, "stride"), _tuple(opts["dilation"], n, what, "dilation")
        self.padding = padding if isinstance(padding, str) else _tuple(padding, n, what, "padding")
        self.output_padding = _tuple(opts["output_padding"], n, what, "output_padding")
        if self.transposed:
            shape = (self.in_channels, self.out_channels // groups) + self.kernel_size
        else:
            shape = (self.out_channels, self.in_channels // groups) + self.kernel_size
        self.weight = Parameter(init.kaiming_uniform(shape, dtype=dtype))
        if opts["bias"]:
            b = init.fan_in_bound(shape)
            self.bias = Parameter(init.uniform((self.out_channels,), -b, b, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        if self.transposed:
            fn = getattr(ops, f"conv_transpose{self.nd}d")
            return fn(
                x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation
            )
        fn = getattr(ops, f"conv{self.nd}d")
        return fn(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        return s + f", padding={self.padding}" + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    nd = 1


class Conv3d(_ConvNd):
    nd = 3


class ConvTranspose1d(_ConvNd):
    nd, transposed = 1, True


class ConvTranspose2d(_ConvNd):
    nd, transposed = 2, True


class ConvTranspose3d(_ConvNd):
    nd, transposed = 3, True


class PReLU(Module):
    """``max(0, x) + weight * min(0, x)``, one learnable slope (``num_parameters=1``) or one per channel."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype="float32"):
        super().__init__()
        if isinstance(num_parameters, bool) or not isinstance(num_parameters, (int, np.integer)) or num_parameters < 1:
            raise ParamInvalidError(f"PReLU: num_parameters must be a positive int, got {num_parameters!r}")
        self.num_parameters = int(num_parameters)
        self.weight = Parameter(np.full((self.num_parameters,), init, _dt.get(dtype)))

    def forward(self, x):
        return ops.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class _BatchNorm(Module):
    """Batch norm with torch's parameters (``weight``, ``bias``) and buffers (``running_mean``,
    ``running_var``, ``num_batches_tracked``). In training mode it normalises with the batch's
    statistics and updates the running ones as torch does (``momentum`` weighs the batch; the
    running variance takes the unbiased batch variance; ``momentum=None`` is a cumulative average).
    The batch statistics are computed once, by the BatchNormalization kernel, which also returns
    the updated running statistics (its optional outputs); a traced training step writes them back
    with ``opsnn::Assign``."""

    #: the input ranks the layer accepts, and how torch names them
    _ranks: tuple = ()
    _layout: str = ""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype="float32",
    ):
        super().__init__()
        self.num_features, self.eps = int(num_features), float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.track_running_stats = bool(track_running_stats)
        dt = _dt.get(dtype)
        if affine:
            self.weight = Parameter(np.ones(num_features, dt))
            self.bias = Parameter(np.zeros(num_features, dt))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", np.zeros(num_features, dt))
            self.register_buffer("running_var", np.ones(num_features, dt))
            self.register_buffer("num_batches_tracked", np.zeros((), np.int64), optional=True)
        else:
            for n in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(n, None)

    def forward(self, x, relu: bool = False):
        """``relu=True``: ``relu(bn(x))``; with batch statistics one op does both, forward and
        backward (inference keeps the separate Relu, which graph passes know how to fold)."""
        x = as_tensor(x)
        if x.ndim not in self._ranks:
            raise ParamInvalidError(f"{type(self).__name__}: input must be {self._layout}, got shape {tuple(x.shape)}")
        if not self.training and self.track_running_stats:
            y = ops.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, eps=self.eps)
            return ops.relu(y) if relu else y
        if not (self.training and self.track_running_stats):  # batch statistics, nothing to update
            c, dt = self.num_features, x.dtype
            return ops.batch_norm(
                x, np.zeros(c, dt), np.ones(c, dt), self.weight, self.bias, training=True, eps=self.eps, relu=relu
            )[0]
        # momentum None: the kernel returns the batch statistics (weight 1), averaged in below
        momentum = 1.0 if self.momentum is None else self.momentum
        y, mean, var = ops.batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            training=True,
            momentum=momentum,
            eps=self.eps,
            unbiased_running_var=True,
            relu=relu,
        )
        self._update_running_stats(mean, var)
        return y

    def _update_running_stats(self, mean, var) -> None:
        """Write the kernel's running statistics (or, for ``momentum=None``, its batch statistics
        averaged in with weight 1 / batches seen) into the buffers."""
        from ..graph.tracing import active_tracer

        tracer = active_tracer()
        if tracer is not None and hasattr(tracer, "call_inplace"):
            return self._traced_running_stats(tracer, mean, var)
        nbt = self.num_batches_tracked
        nbt.copy_(nbt.numpy() + 1)
        rm, rv = self.running_mean, self.running_var
        if self.momentum is not None:
            rm.copy_(mean)
            rv.copy_(var)
            return
        m = 1.0 / float(nbt.item())
        rm.copy_((1.0 - m) * rm.numpy().astype(np.float64) + m * mean.numpy().astype(np.float64))
        rv.copy_((1.0 - m) * rv.numpy().astype(np.float64) + m * var.numpy().astype(np.float64))

    def _traced_running_stats(self, tracer, mean, var) -> None:
        """The running-statistics update written in place (``Assign``) when a training step is
        traced: the eager path's host arithmetic would be replayed as constants."""
        from ..autograd import no_grad

        assign = get_op("Assign", "opsnn")
        with no_grad():
            nbt = self.num_batches_tracked
            nbt_new = ops.add(nbt, as_tensor(np.ones((), nbt.dtype)))
            tracer.call_inplace(assign, [nbt, nbt_new], {}, [nbt], labels=[None])
            rm, rv = self.running_mean, self.running_var
            if self.momentum is None:  # cumulative average: the weight of this batch is 1 / batches seen
                dt = rm.dtype
                m = ops.div(as_tensor(np.ones((), dt)), ops.cast(nbt, dt))
                one_minus = ops.sub(as_tensor(np.ones((), dt)), m)
                mean = ops.add(ops.mul(rm, one_minus), ops.mul(mean, m))
                var = ops.add(ops.mul(rv, one_minus), ops.mul(var, m))
            for buf, new in ((rm, mean), (rv, var)):
                F.assign_in_place(buf, new)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L) inputs (see :class:`BatchNorm2d`).

    >>> import opsnn, numpy as np
    >>> bn = opsnn.nn.BatchNorm1d(3).train()
    >>> bn(opsnn.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))).shape
    (4, 3)
    """

    _ranks = (2, 3)
    _layout = "2-D (N, C) or 3-D (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch norm with torch's parameters (``weight``, ``bias``) and buffers (``running_mean``,
    ``running_var``, ``num_batches_tracked``). In training mode it normalises with the batch's
    statistics and updates the running ones as torch does (``momentum`` weighs the batch; the
    running variance takes the unbiased batch variance; ``momentum=None`` is a cumulative average).

    >>> import opsnn, numpy as np
    >>> bn = opsnn.nn.BatchNorm2d(2).train()
    >>> y = bn(opsnn.tensor(np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)))
    >>> bn.running_mean.numpy(), int(bn.num_batches_tracked.item())
    (array([0.55, 0.95], dtype=float32), 1)
    """

    _ranks = (4,)
    _layout = "4-D (N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    """Batch norm over (N, C, D, H, W) inputs (see :class:`BatchNorm2d`)."""

    _ranks = (5,)
    _layout = "5-D (N, C, D, H, W)"


class LayerNorm(Module):
    def __init__(
        self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True, dtype="float32"
    ):
        super().__init__()
        shape = (
            (int(normalized_shape),)
            if isinstance(normalized_shape, (int, np.integer))
            else tuple(int(s) for s in normalized_shape)
        )
        self.normalized_shape, self.eps = shape, float(eps)
        dt = _dt.get(dtype)
        if elementwise_affine:
            self.weight = Parameter(np.ones(shape, dt))
            if bias:
                self.bias = Parameter(np.zeros(shape, dt))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (``eps=None``: the dtype's machine epsilon, as torch)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, dtype="float32"):
        super().__init__()
        shape = (
            (int(normalized_shape),)
            if isinstance(normalized_shape, (int, np.integer))
            else tuple(int(s) for s in normalized_shape)
        )
        self.normalized_shape, self.eps = shape, eps
        if elementwise_affine:
            self.weight = Parameter(np.ones(shape, _dt.get(dtype)))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        return ops.rms_norm(x, self.normalized_shape, self.weight, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class _InstanceNorm(Module):
    """torch's InstanceNorm1d/2d/3d: each (instance, channel) normalised over its own positions;
    ``affine`` adds torch's ``weight`` / ``bias``. Running statistics are not kept (torch's default
    ``track_running_stats=False``; True is refused)."""

    dims = 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        dtype="float32",
    ):
        super().__init__()
        what = type(self).__name__
        if track_running_stats:
            raise ParamInvalidError(f"{what}: track_running_stats=True is not supported (running statistics)")
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), False
        dt = _dt.get(dtype)
        if affine:
            self.weight = Parameter(np.ones(self.num_features, dt))
            self.bias = Parameter(np.zeros(self.num_features, dt))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        x = as_tensor(x)
        what = type(self).__name__
        if x.ndim not in (self.dims + 1, self.dims + 2):
            raise ParamInvalidError(
                f"{what}: expected a {self.dims + 2}-D or {self.dims + 1}-D input, got {tuple(x.shape)}"
            )
        one = x.ndim == self.dims + 1
        x = ops.unsqueeze(x, 0) if one else x
        if x.shape[1] != self.num_features:
            raise ParamInvalidError(
                f"{what}: input has {x.shape[1]} channels, expected num_features={self.num_features}"
            )
        y = ops.instance_norm(x, self.weight, self.bias, eps=self.eps)
        return ops.squeeze(y, 0) if one else y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, affine={self.affine}"


class InstanceNorm1d(_InstanceNorm):
    dims = 1


class InstanceNorm2d(_InstanceNorm):
    dims = 2


class InstanceNorm3d(_InstanceNorm):
    dims = 3


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, dtype="float32"):
        super().__init__()
        if num_channels % num_groups:
            raise ParamInvalidError(
                f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"
            )
        self.num_groups, self.num_channels, self.eps = int(num_groups), int(num_channels), float(eps)
        dt = _dt.get(dtype)
        if affine:
            self.weight = Parameter(np.ones(num_channels, dt))
            self.bias = Parameter(np.zeros(num_channels, dt))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


class Embedding(Module):
    """A lookup table ``weight`` (num_embeddings, embedding_dim), initialised N(0, 1) with a zero
    ``padding_idx`` row that gets no gradient (as torch's); ids outside the table raise
    :class:`OutOfVocabularyError`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, dtype="float32"):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        w = init.normal((self.num_embeddings, self.embedding_dim), dtype=dtype)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ParamInvalidError(f"Embedding: padding_idx {padding_idx} outside [0, {self.num_embeddings})")
            padding_idx %= self.num_embeddings
            w[padding_idx] = 0
        self.padding_idx = padding_idx
        self.weight = Parameter(w)

    def forward(self, ids):
        ids = check_token_ids(ids, self.num_embeddings, "Embedding")
        return ops.embedding(ids, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Identity in eval mode (the default); inverted dropout in training mode: zero with
    probability ``p``, scale the rest by ``1/(1-p)``. Each call draws one seed from opsnn's
    generator (``opsnn.manual_seed``) and ``opsnn.ops.native_dropout`` hashes it into the mask, so
    a compiled training step (``opsnn.compile``) takes the seed as a runtime input drawn from the
    same generator before every run: compiled and eager steps from one seed draw the same masks.
    The gradient flows through the kept elements (the op's mask output)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ParamInvalidError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = float(p)
        self.inplace = bool(inplace)  # torch's flag, accepted: the output is a new tensor (see _Activation)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        return dropout(x, self.p, True, f"Dropout(p={self.p})")

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _ChannelDropout(Module):
    """torch's Dropout1d/2d/3d: in training mode whole channels are zeroed with probability ``p`` and the
    rest scaled by ``1/(1-p)`` (one mask value per (instance, channel), drawn as Dropout's)."""

    fn = None

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ParamInvalidError(f"{type(self).__name__}: p must be in [0, 1], got {p}")
        self.p, self.inplace = float(p), bool(inplace)  # inplace: torch's flag, the output is a new tensor

    def forward(self, x):
        return type(self).fn(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout1d(_ChannelDropout):
    fn = staticmethod(F.dropout1d)


class Dropout2d(_ChannelDropout):
    fn = staticmethod(F.dropout2d)


class Dropout3d(_ChannelDropout):
    fn = staticmethod(F.dropout3d)


class _Activation(Module):
    """An elementwise activation that takes torch's ``inplace`` flag, so torch model code
    (``nn.ReLU(inplace=True)``) builds unchanged: the module returns the activated tensor and leaves
    its input as it was (a module's output is what the next layer reads; the graph engine's memory
    plan reuses the input's buffer where nothing else reads it)."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = bool(inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Activation):
    def forward(self, x):
        return ops.relu(x)


class GELU(Module):
    """``approximate='none'`` (erf) or ``'tanh'``."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ParamInvalidError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, approximate=self.approximate)


class SiLU(_Activation):
    def forward(self, x):
        return ops.silu(x)


class Sigmoid(Module):
    def forward(self, x):
        return ops.sigmoid(x)


class Tanh(Module):
    def forward(self, x):
        return ops.tanh(x)


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x):
        return ops.softmax(x, dim=self.dim)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x):
        if self.end_dim == -1 and self.start_dim >= 0:  # keeps the leading dims symbolic when traced
            return reshape(x, (0,) * self.start_dim + (-1,))
        return ops.flatten(x, self.start_dim, self.end_dim)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.padding, self.dilation = kernel_size, padding, dilation
        self.stride = kernel_size if stride is None else stride
        self.ceil_mode = bool(ceil_mode)

    def forward(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        if self.output_size in (1, (1, 1)):
            return ops.run_op("GlobalAveragePool", [x])[0]
        return ops.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


__all__ = [
    "AdaptiveAvgPool2d",
    "Conv1d",
    "Conv3d",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "PReLU",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "GroupNorm",
    "Identity",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "OutOfVocabularyError",
    "RMSNorm",
    "ReLU",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Tanh",
    "conv_kernels",
    "resolve_conv_algo",
]


class Bilinear(Module):
    """``y = x1^T A x2 + b`` with ``weight`` (out_features, in1_features, in2_features) and ``bias``
    (out_features,), both U(-1/sqrt(in1_features), 1/sqrt(in1_features)) as torch's; the inputs share
    their leading dims."""

    def __init__(
        self, in1_features: int, in2_features: int, out_features: int, bias: bool = True, device=None, dtype=None
    ):
        super().__init__()
        _check_device("Bilinear", device)
        dt = dtype or "float32"
        self.in1_features, self.in2_features, self.out_features = (
            int(in1_features),
            int(in2_features),
            int(out_features),
        )
        b = 1.0 / np.sqrt(self.in1_features) if self.in1_features > 0 else 0.0
        self.weight = Parameter(init.uniform((self.out_features, self.in1_features, self.in2_features), -b, b, dt))
        if bias:
            self.bias = Parameter(init.uniform((self.out_features,), -b, b, dt))
        else:
            self.register_parameter("bias", None)

    def forward(self, input1, input2):
        x1, x2 = as_tensor(input1), as_tensor(input2)
        i1, i2, o = self.in1_features, self.in2_features, self.out_features
        if x1.ndim < 1 or x2.ndim < 1 or x1.shape[-1] != i1 or x2.shape[-1] != i2 or x1.shape[:-1] != x2.shape[:-1]:
            raise ParamInvalidError(
                f"Bilinear: input1 must be (*, {i1}) and input2 (*, {i2}) with the same leading dims, got "
                f"{tuple(x1.shape)} and {tuple(x2.shape)}"
            )
        lead = tuple(x1.shape[:-1])
        # x1 (n, i1) @ A as (i1, o * i2), then a dot with x2 over i2 per output feature
        w = reshape(ops.transpose(self.weight, (1, 0, 2)), (i1, o * i2))
        u = reshape(ops.matmul(reshape(x1, (-1, i1)), w), (-1, o, i2))
        y = ops.sum(ops.mul(u, ops.unsqueeze(reshape(x2, (-1, i2)), 1)), dim=2)
        if self.bias is not None:
            y = ops.add(y, self.bias)
        return reshape(y, lead + (o,))

    def extra_repr(self) -> str:
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def _check_device(what: str, device) -> None:
    if device not in (None, "cpu"):
        raise ParamInvalidError(f"{what}: device must be None or 'cpu', got {device!r}")


class EmbeddingBag(Module):
    """torch.nn.EmbeddingBag: sums, means or maxima of bags of embedding rows without building the
    per-id embeddings' output. Bags are the rows of a 2-D ``input``, or runs of a 1-D ``input``
    starting at ``offsets`` (``include_last_offset``: the last offset ends the last bag);
    ``per_sample_weights`` scale each id's row (mode ``'sum'``); ids equal to ``padding_idx`` are left
    out of their bag; an empty bag gives zeros. The gradient reaches ``weight`` (and the sample
    weights). The bag layout is read from the ids on the host, so the module runs eagerly only."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm=None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight=None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        _check_device("EmbeddingBag", device)
        for flag, what in ((max_norm is not None, "max_norm"), (scale_grad_by_freq, "scale_grad_by_freq"),
                           (sparse, "sparse")):  # fmt: skip
            if flag:
                raise ParamInvalidError(f"EmbeddingBag: {what} is not supported; leave it at torch's default")
        if mode not in ("sum", "mean", "max"):
            raise ParamInvalidError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        n, d = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -n <= padding_idx < n:
                raise ParamInvalidError(f"EmbeddingBag: padding_idx {padding_idx} outside [-{n}, {n})")
            padding_idx %= n
        if _weight is None:
            w = init.normal((n, d), dtype=dtype or "float32")
            if padding_idx is not None:
                w[padding_idx] = 0
        else:
            w = np.asarray(_weight.numpy() if hasattr(_weight, "numpy") else _weight)
            if w.shape != (n, d):
                raise ParamInvalidError(f"EmbeddingBag: _weight must have shape {(n, d)}, got {w.shape}")
        self.num_embeddings, self.embedding_dim, self.mode = n, d, mode
        self.include_last_offset, self.padding_idx = bool(include_last_offset), padding_idx
        self.weight = Parameter(w)

    def _bags(self, ids: np.ndarray, offsets) -> tuple:
        """The bag of every id (flat) and the number of bags."""
        if ids.ndim == 2:
            if offsets is not None:
                raise ParamInvalidError("EmbeddingBag: offsets must be None when input is 2-D (each row is a bag)")
            return np.repeat(np.arange(ids.shape[0]), ids.shape[1]), ids.shape[0]
        if ids.ndim != 1:
            raise ParamInvalidError(f"EmbeddingBag: input must be 1-D (with offsets) or 2-D, got shape {ids.shape}")
        if offsets is None:
            raise ParamInvalidError("EmbeddingBag: a 1-D input needs offsets (where each bag starts)")
        off = np.asarray(offsets.numpy() if hasattr(offsets, "numpy") else offsets)
        if off.ndim != 1 or off.dtype.kind not in "iu" or (off.size and off[0] != 0):
            raise ParamInvalidError(f"EmbeddingBag: offsets must be a 1-D int tensor starting at 0, got {off!r}")
        if np.any(np.diff(off) < 0) or (off.size and off[-1] > ids.size):
            raise ParamInvalidError(
                f"EmbeddingBag: offsets must not decrease and stay within the input's {ids.size} ids, got {off!r}"
            )
        if self.include_last_offset and (not off.size or off[-1] != ids.size):
            raise ParamInvalidError(
                f"EmbeddingBag: with include_last_offset the last offset must be the number of ids ({ids.size}), "
                f"got {off!r}"
            )
        starts = off[:-1] if self.include_last_offset else off
        bags = np.zeros(ids.size, np.int64)
        for b, s in enumerate(starts):  # each id belongs to the last bag starting at or before it
            bags[s:] = b
        return bags, starts.size

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002 - torch's name
        from ..graph.tracing import active_tracer

        if active_tracer() is not None:
            raise ParamInvalidError(
                "EmbeddingBag: the bag layout is computed from the ids on the host, so it cannot be traced "
                "into a compiled graph; call the module eagerly"
            )
        ids = check_token_ids(input, self.num_embeddings, "EmbeddingBag")
        a = ids.numpy()
        bags, nbags = self._bags(a, offsets)
        flat = a.reshape(-1)
        keep = flat != self.padding_idx if self.padding_idx is not None else np.ones(flat.size, bool)
        rows = ops.embedding(reshape(ids, (-1,)), self.weight)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ParamInvalidError(f"EmbeddingBag: per_sample_weights needs mode='sum', the mode is {self.mode!r}")
            psw = as_tensor(per_sample_weights)
            if tuple(psw.shape) != a.shape:
                raise ParamInvalidError(
                    f"EmbeddingBag: per_sample_weights must have the input's shape {a.shape}, got {tuple(psw.shape)}"
                )
            rows = ops.mul(rows, reshape(psw, (-1, 1)))
        counts = np.bincount(bags[keep], minlength=nbags).astype(np.int64)
        if self.mode == "max":
            return self._max(rows, bags, keep, counts, nbags)
        pick = np.zeros((nbags, flat.size), self.weight.dtype)
        cols = np.nonzero(keep)[0]
        scale = 1.0 / np.maximum(counts, 1) if self.mode == "mean" else np.ones(nbags)
        pick[bags[cols], cols] = scale[bags[cols]]
        return ops.matmul(as_tensor(pick), rows)

    def _max(self, rows, bags, keep, counts, nbags):
        """Each bag's rows gathered into an (nbags, longest, dim) block padded with -inf, maximum over
        the bag; an empty bag reads only a zero row."""
        n, d = bags.size, self.embedding_dim
        longest = max(int(counts.max()) if nbags else 0, 1)
        table = np.full((nbags, longest), n, np.int64)  # row n: -inf, row n + 1: zeros
        table[counts == 0] = n + 1
        cols = np.nonzero(keep)[0]
        slot = np.zeros(n, np.int64)
        for b in range(nbags):  # position of each kept id inside its bag
            mine = cols[bags[cols] == b]
            slot[mine] = np.arange(mine.size)
        table[bags[cols], slot[cols]] = cols
        pad = np.zeros((2, d), self.weight.dtype)
        pad[0] = -np.inf
        padded = ops.concat([rows, as_tensor(pad)], 0)
        block = reshape(ops.index_select(padded, 0, table.reshape(-1)), (nbags, longest, d))
        return ops.max(block, dim=1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"


class UninitializedParameter(Parameter):
    """The placeholder of a lazy module's parameter before its first call (torch's name): empty, and
    refused by optimizers, which must be built after the first forward."""

    uninitialized = True

    def __init__(self, dtype="float32"):
        super().__init__(np.empty((0,), dtype))


class LazyModuleError(ParamInvalidError):
    """A lazy module was used in a way that needs its shapes before its first call."""


class _LazyMixin:
    """Records the constructor's arguments; the first call infers the input size, builds the concrete
    module (same init as building it directly), then becomes it (its class and state), as torch's
    ``cls_to_become``."""

    _placeholders = ("weight", "bias")

    def _lazy_init(self, args: tuple, kwargs: dict, bias: bool) -> None:
        Module.__init__(self)
        self._lazy_args = (args, kwargs)
        dtype = kwargs.get("dtype") or "float32"
        self.weight = UninitializedParameter(dtype)
        if bias:
            self.bias = UninitializedParameter(dtype)
        else:
            self.register_parameter("bias", None)

    def has_uninitialized_params(self) -> bool:
        return True

    def initialize_parameters(self, in_size: int) -> None:
        """Build the concrete module for ``in_size`` input features/channels and become it."""
        args, kwargs = self._lazy_args
        real = self.cls_to_become(int(in_size), *args, **kwargs)
        training = self.training
        for k in ("_lazy_args", *self._placeholders):
            self.__dict__.pop(k, None)
        for k, v in real.__dict__.items():
            if k != "training":
                self.__dict__[k] = v
        self.__class__ = self.cls_to_become
        self.training = training

    def forward(self, x, *rest, **kw):
        self.initialize_parameters(self._in_size(as_tensor(x)))
        return self.forward(x, *rest, **kw)

    def load_state_dict(self, state_dict, strict: bool = True):
        """Materializes from the checkpoint's weight shape first (as torch's lazy load hook)."""
        w = state_dict.get("weight") if hasattr(state_dict, "get") else None
        if w is None:
            raise LazyModuleError(
                f"{type(self).__name__}.load_state_dict: the state dict has no 'weight' to take the input "
                "size from; call the module on an input first"
            )
        self.initialize_parameters(self._size_from_weight(tuple(np.shape(w.numpy() if hasattr(w, "numpy") else w))))
        return self.load_state_dict(state_dict, strict)

    def state_dict(self, prefix: str = ""):
        raise LazyModuleError(
            f"{type(self).__name__}.state_dict: the parameters' shapes are not known before the first call; "
            "call the module on an input first"
        )

    def extra_repr(self) -> str:
        return "uninitialized (lazy: sizes inferred on the first call)"


class LazyLinear(_LazyMixin, Linear):
    """torch.nn.LazyLinear: a Linear whose ``in_features`` is the last dim of its first input."""

    cls_to_become = Linear

    def __init__(self, out_features: int, bias: bool = True, device=None, dtype=None):
        _check_device("LazyLinear", device)
        kw = {"bias": bias} | ({"dtype": dtype} if dtype is not None else {})
        self._lazy_init((int(out_features),), kw, bias)
        self.out_features = int(out_features)

    def _in_size(self, x) -> int:
        if x.ndim < 1:
            raise ParamInvalidError(f"LazyLinear: the input must have at least one dim, got shape {tuple(x.shape)}")
        return int(x.shape[-1])

    @staticmethod
    def _size_from_weight(shape) -> int:
        return shape[1]


class _LazyConvNd(_LazyMixin, Module):
    """torch's LazyConv1d/2d/3d: ``in_channels`` is dim 1 of the first input (batched, as opsnn's
    convolutions take)."""

    nd = 0

    def __init__(
        self,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
    ):
        _check_device(type(self).__name__, device)
        kw = dict(
            stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode
        )
        if dtype is not None:
            kw["dtype"] = dtype
        self._lazy_init((int(out_channels), kernel_size), kw, bias)
        self.out_channels = int(out_channels)

    def _in_size(self, x) -> int:
        if x.ndim != self.nd + 2:
            raise ParamInvalidError(
                f"{type(self).__name__}: the input must be batched, (N, C, {self.nd} spatial dims), got shape "
                f"{tuple(x.shape)}; add the batch dim"
            )
        return int(x.shape[1])

    def _size_from_weight(self, shape) -> int:
        return shape[1] * int(self._lazy_args[1]["groups"])


class LazyConv1d(_LazyConvNd):
    nd, cls_to_become = 1, Conv1d


class LazyConv2d(_LazyConvNd):
    nd, cls_to_become = 2, Conv2d


class LazyConv3d(_LazyConvNd):
    nd, cls_to_become = 3, Conv3d
