"""``opsnn.autocast``: mixed-precision eager training with float32 master weights.

Inside ``with opsnn.autocast("bfloat16"):`` each eager op call picks its compute dtype from a
policy in the format of ``opsnn.config.allow_mix_precision`` (op type -> dtype; fused ops follow
the op they were made from):

- products (``Conv``, ``ConvTranspose``, ``MatMul``, ``Gemm``, ``Linear``, ``Attention``,
  ``PRelu``: torch's CPU lower-precision list) cast their float32 inputs to the 16-bit dtype and
  give 16-bit outputs;
- precision-sensitive ops (softmax, log-softmax, the normalizations but BatchNormalization, the
  losses, sum/mean-like reductions, cumulative sums) cast 16-bit inputs up and run in float32;
- ``BatchNormalization`` runs in its data input's dtype with its float32 scale, bias and running
  statistics as they are (torch's CPU autocast: a bf16 input gives a bf16 output, the statistics
  are computed in float32), so a bf16 conv's output reaches it and the next conv without casts;
- ``RotaryEmbedding`` follows its data input: its cos/sin tables are cast to the activations'
  dtype (what Hugging Face's LLaMA does, ``cos.to(x.dtype)``, so under torch's autocast the
  rotation runs in bfloat16), rather than the activations promoted to the tables' float32;
- every other op follows its inputs: mixed float inputs are promoted to the widest one (0-d
  tensors do not promote dimensioned ones, as in torch).

The casts are ordinary ``Cast`` op calls, so the tape records them and gradients flow back
through them to the float32 parameters (the ``Cast`` rule casts the gradient back). A
parameter's cast is made once per autocast region and reused (torch's weight-cast cache); the
cache is dropped when the outermost region ends, so run the optimizer step outside it. The
backward pass runs outside autocast, in the dtypes the forward used.

>>> import opsnn, numpy as np
>>> lin = opsnn.nn.Linear(4, 3)
>>> x = opsnn.tensor(np.ones((2, 4), np.float32))
>>> with opsnn.autocast("bfloat16"):
...     y = lin(x)
...     p = opsnn.ops.softmax(y, -1)
>>> str(y.dtype), str(p.dtype)
('bfloat16', 'float32')
>>> opsnn.ops.sum(p).backward(); str(lin.weight.grad.dtype)
'float32'
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..graph.mixed_precision import normalize_policy, origin
from ..ops import executor as _executor
from ..ops.defs.elementwise import onnx_enum
from ..tensor import Tensor

#: op types that run in the 16-bit dtype (torch's CPU autocast lower-precision list, opsnn names)
LOWER_PRECISION_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Linear", "Attention", "PRelu")
#: op types that run in float32 whatever their inputs (torch's CPU float32 list for the losses;
#: softmax, norms and sum/mean-like reductions too, as torch's CUDA list has them)
FLOAT32_OPS = (
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "RMSNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "LpNormalization",
    "MeanVarianceNormalization",
    "SoftmaxCrossEntropyLoss",
    "NegativeLogLikelihoodLoss",
    "ReduceSum",
    "ReduceMean",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
    "Var",
    "CumSum",
    "CumProd",
)
#: op types whose float inputs take the dtype of their first (data) input: tables read per element
FOLLOW_DATA_OPS = ("RotaryEmbedding",)
#: op types whose inputs keep their dtypes: a 16-bit data input with float32 parameters and
#: statistics (torch's CPU autocast lists batch_norm nowhere; its kernels take mixed dtypes)
MIXED_INPUT_OPS = ("BatchNormalization",)
_LOW = (_dt.bfloat16, _dt.float16)
_NO_AUTOCAST = frozenset({"Cast", "CastLike"})


def _low_dtype(dtype, who: str) -> np.dtype:
    try:
        d = _dt.get(dtype)
    except Exception:
        d = None
    if d not in _LOW:
        raise ParamInvalidError(f"{who}: dtype must be 'bfloat16' or 'float16', got {dtype!r}")
    return d


def autocast_policy(dtype="bfloat16") -> dict:
    """The op type -> compute dtype table autocast uses for ``dtype`` (``"bfloat16"`` or
    ``"float16"``); ops not in it follow their inputs. Pass it to
    ``opsnn.config.allow_mix_precision`` to give a compiled graph the same choice."""
    low = _low_dtype(dtype, "autocast_policy")
    return {**{op: low for op in LOWER_PRECISION_OPS}, **{op: _dt.float32 for op in FLOAT32_OPS}}


class _State:
    __slots__ = ("cache", "low", "policy")

    def __init__(self, low, policy: dict, cache: dict | None):
        self.low, self.policy, self.cache = low, policy, cache


_tls = threading.local()
_lock = threading.Lock()
_regions = [0]  # autocast regions open in all threads; the executor hook is installed while > 0


def _install() -> None:
    with _lock:
        _regions[0] += 1
        _executor._autocast = _cast_inputs


def _uninstall() -> None:
    with _lock:
        _regions[0] -= 1
        if _regions[0] == 0:
            _executor._autocast = None


def is_autocast_enabled() -> bool:
    """Whether ops called now in this thread are autocast."""
    return getattr(_tls, "state", None) is not None


def get_autocast_dtype():
    """The 16-bit dtype of the innermost enabled region in this thread, or None."""
    st = getattr(_tls, "state", None)
    return None if st is None else st.low


class autocast:
    """``with opsnn.autocast("bfloat16"): loss = loss_fn(model(x), y)`` (also a decorator).

    ``dtype``: ``"bfloat16"`` or ``"float16"`` (float16 wants an ``opsnn.amp.GradScaler``);
    ``enabled=False`` turns autocast off inside an enclosing region; ``cache_enabled``: reuse
    each parameter's cast within the region; ``policy``: op type -> dtype entries that override
    :func:`autocast_policy` (the ``allow_mix_precision`` format, e.g. ``{"LayerNorm": "bfloat16"}``).
    """

    def __init__(
        self, dtype="bfloat16", enabled: bool = True, cache_enabled: bool = True, policy=None, *, device_type="cpu"
    ):
        if device_type != "cpu":
            raise ParamInvalidError(f"autocast: device_type must be 'cpu' (opsnn runs on the CPU), got {device_type!r}")
        self.dtype = _low_dtype(dtype, "autocast")
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)
        self.policy = {**autocast_policy(self.dtype), **normalize_policy(policy, "autocast")}
        self._saved: list = []

    def __enter__(self):
        prev = getattr(_tls, "state", None)
        depth = getattr(_tls, "depth", 0)
        self._saved.append((prev, depth))
        _tls.depth = depth + 1
        if depth == 0:
            _tls.cache = {}
        cache = _tls.cache if self.cache_enabled else None
        _tls.state = _State(self.dtype, self.policy, cache) if self.enabled else None
        _install()
        return self

    def __exit__(self, *exc):
        prev, depth = self._saved.pop()
        _tls.state, _tls.depth = prev, depth
        if depth == 0:
            _tls.cache = None  # the weight casts live as long as the outermost region
        _uninstall()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.dtype, self.enabled, self.cache_enabled, self.policy):
                return fn(*args, **kwargs)

        return wrapped


@contextlib.contextmanager
def suspended():
    """Autocast off in this thread for the block (the backward pass runs in the forward's dtypes)."""
    prev = getattr(_tls, "state", None)
    _tls.state = None
    try:
        yield
    finally:
        _tls.state = prev


def _widest(dtypes) -> np.dtype:
    if _dt.float64 in dtypes:
        return _dt.float64
    if _dt.float32 in dtypes or len(dtypes) > 1:
        return _dt.float32  # float32, or bfloat16 with float16
    return next(iter(dtypes))


def _cast_inputs(rec, tensors: list) -> list:
    """The executor's hook: the inputs of one eager op call, cast to its autocast dtype."""
    st = getattr(_tls, "state", None)
    if st is None or rec.name in _NO_AUTOCAST:
        return tensors
    host = rec.host_inputs
    floats = [i for i, t in enumerate(tensors) if t is not None and i not in host and _dt.is_float(t.dtype)]
    if not floats:
        return tensors
    want = st.policy.get(origin(rec.name))
    if want is None and origin(rec.name) in MIXED_INPUT_OPS:
        return tensors
    if want is None and origin(rec.name) in FOLLOW_DATA_OPS and floats[0] == 0:
        want = tensors[0].dtype

        def castable(d):
            return d != want

    elif want is None:
        dims = {tensors[i].dtype for i in floats if tensors[i].ndim > 0}
        dts = dims or {tensors[i].dtype for i in floats}
        if len(dts) == 1 and len({tensors[i].dtype for i in floats}) == 1:
            return tensors
        want = _widest(dts)

        def castable(d):
            return d != want

    elif want in _LOW:

        def castable(d):
            return d == _dt.float32

    else:

        def castable(d):
            return d in _LOW

    out = list(tensors)
    for i in floats:
        d = tensors[i].dtype
        if d != want and castable(d):
            out[i] = _cast(tensors[i], want, st.cache)
    return out


def _cast(t: Tensor, dt, cache) -> Tensor:
    from .. import ops
    from ..autograd.graph import get_meta, record_op

    m = get_meta(t)
    cacheable = (
        cache is not None
        and m is not None
        and m.requires_grad
        and m.grad_fn is None
        and dt in _LOW
        and _executor._tracer is None
    )
    if not cacheable:
        return ops.cast(t, dt)
    key = (id(t), dt)
    hit = cache.get(key)
    if hit is not None and hit[0]() is t:
        first = hit[1]
        out = Tensor(first._array, first.format, first._producer)
        record_op(ops.get_op("Cast"), [t], {"to": hit[2], "saturate": 1, "round_mode": "up"}, out)
        return out
    out = ops.cast(t, dt)
    cache[key] = (weakref.ref(t), out, onnx_enum(dt))
    return out


__all__ = [
    "FLOAT32_OPS",
    "FOLLOW_DATA_OPS",
    "LOWER_PRECISION_OPS",
    "MIXED_INPUT_OPS",
    "autocast",
    "autocast_policy",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "suspended",
]
