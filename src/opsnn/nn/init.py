"""Deterministic weight initialisation: one seeded numpy generator that every layer draws from.

Layers draw their initial weights from :func:`generator` in construction order, so building
a model under ``seeded(s)`` gives the same weights every time::

    >>> import opsnn
    >>> with opsnn.nn.init.seeded(0):
    ...     a = opsnn.nn.Linear(3, 2).weight.numpy().copy()
    >>> with opsnn.nn.init.seeded(0):
    ...     b = opsnn.nn.Linear(3, 2).weight.numpy()
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..ops import tensor_methods as _tensor_methods
from ..tensor import Tensor, tensor

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Reseed the generator layers draw their initial weights (and Dropout its masks) from. As in
    torch, ``seed`` is an int in [-2**63, 2**64 - 1]; a negative one is remapped to 0xffff_ffff_ffff_ffff + seed."""
    global _rng
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not -(2**63) <= int(seed) < 2**64:
        raise ParamInvalidError(f"manual_seed: seed must be an int in [-2**63, 2**64 - 1], got {seed!r}")
    seed = int(seed)
    _rng = np.random.default_rng(seed if seed >= 0 else 0xFFFF_FFFF_FFFF_FFFF + seed)


def generator() -> np.random.Generator:
    return _rng


# -- torch's random constructors, drawing from the same generator -------------------------------------------------
def _size(size, what: str) -> tuple:
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0 for s in size):
        raise ParamInvalidError(f"{what}: sizes must be non-negative ints, got {size}")
    return tuple(int(s) for s in size)


def _traced_generator(what: str) -> np.random.Generator:
    """The generator, refused while a function is traced (its draws would become constants)."""
    from ..graph.tracing import TraceError, active_tracer

    if active_tracer() is not None:
        raise TraceError(
            f"{what}: random values drawn while a function is traced would be replayed as constants at every "
            "run; draw them outside the traced function and pass them in"
        )
    return _rng


# the in-place random methods (``w.data.normal_(0, 0.02)``, ``uniform_``, ``bernoulli_`` ...) live with the
# other Tensor methods in the ops layer, which may not import nn: they draw through this hook, so one seed
# (``manual_seed`` / ``seeded``) rules every draw and tracing refuses them alike
_tensor_methods.random_source = _traced_generator


def randn(*size, dtype="float32", requires_grad: bool = False) -> Tensor:
    """Standard normal values from opsnn's generator (``opsnn.manual_seed``)."""
    a = _traced_generator("randn").standard_normal(_size(size, "randn"))
    return tensor(a.astype(_dt.get(dtype)), requires_grad=requires_grad)


def rand(*size, dtype="float32", requires_grad: bool = False) -> Tensor:
    """Uniform values in [0, 1) from opsnn's generator."""
    a = _traced_generator("rand").random(_size(size, "rand"))
    return tensor(a.astype(_dt.get(dtype)), requires_grad=requires_grad)


def randint(low, high=None, size=(), dtype="int64") -> Tensor:
    """Integers in [low, high) (``randint(high, size)`` draws from [0, high)) from opsnn's generator."""
    if high is None:
        low, high = 0, low
    if not low < high:
        raise ParamInvalidError(f"randint: low must be below high, got [{low}, {high})")
    return tensor(
        _traced_generator("randint").integers(low, high, _size(tuple(size), "randint")).astype(_dt.get(dtype))
    )


def randperm(n: int, dtype="int64") -> Tensor:
    """A random permutation of 0..n-1 from opsnn's generator."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ParamInvalidError(f"randperm: n must be an int >= 0, got {n!r}")
    return tensor(_traced_generator("randperm").permutation(int(n)).astype(_dt.get(dtype)))


@contextlib.contextmanager
def seeded(seed: int | None):
    """Draw initial weights from a generator seeded with ``seed`` inside the block
    (``None``: leave the current generator alone)."""
    global _rng
    if seed is None:
        yield _rng
        return
    saved = _rng
    _rng = np.random.default_rng(int(seed))
    try:
        yield _rng
    finally:
        _rng = saved


def _fans(shape) -> tuple[int, int]:
    if len(shape) < 2:
        raise ParamInvalidError(f"init: fan in/out need a weight with >= 2 dims, got shape {tuple(shape)}")
    recept = math.prod(shape[2:])
    return shape[1] * recept, shape[0] * recept


def _cast(a: np.ndarray, dtype) -> np.ndarray:
    return a.astype(_dt.get(dtype), copy=False)


def uniform(shape, low: float, high: float, dtype="float32") -> np.ndarray:
    return _cast(_rng.uniform(low, high, size=tuple(shape)), dtype)


def normal(shape, std: float = 1.0, mean: float = 0.0, dtype="float32") -> np.ndarray:
    return _cast(_rng.standard_normal(size=tuple(shape), dtype=np.float32) * np.float32(std) + np.float32(mean), dtype)


def kaiming_uniform(shape, a: float = math.sqrt(5), dtype="float32") -> np.ndarray:
    """torch's default for Linear/Conv weights: ``U(-b, b)``, ``b = gain * sqrt(3 / fan_in)``."""
    fan_in, _ = _fans(shape)
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / max(fan_in, 1))
    return uniform(shape, -bound, bound, dtype)


def fan_in_bound(weight_shape) -> float:
    """torch's bias bound for Linear/Conv: ``1 / sqrt(fan_in)``."""
    fan_in, _ = _fans(weight_shape)
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


# -- in place, on existing tensors: torch.nn.init's signatures ----------------------------------------
_GAINS = {"linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "selu": 0.75}


def calculate_gain(nonlinearity: str, param=None) -> float:
    """torch.nn.init.calculate_gain: the gain that keeps activations' variance for ``nonlinearity``."""
    if nonlinearity in _GAINS:
        return _GAINS[nonlinearity]
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope * slope))
    raise ParamInvalidError(
        f"calculate_gain: unknown nonlinearity {nonlinearity!r}; one of {sorted(_GAINS) + ['leaky_relu', 'relu']}"
    )


def _fan(shape, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ParamInvalidError(f"init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(shape)
    return fan_in if mode == "fan_in" else fan_out


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """torch.nn.init.normal_(tensor, mean, std)."""
    return t.copy_(normal(t.shape, std, mean, np.float32))


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """torch.nn.init.uniform_(tensor, a, b): U(a, b)."""
    return t.copy_(uniform(t.shape, a, b, np.float64))


def kaiming_uniform_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """torch.nn.init.kaiming_uniform_: U(-b, b), ``b = gain * sqrt(3 / fan)``."""
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / max(_fan(t.shape, mode), 1))
    return uniform_(t, -bound, bound)


def kaiming_normal_(t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    """torch.nn.init.kaiming_normal_: N(0, std), ``std = gain / sqrt(fan)``."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(max(_fan(t.shape, mode), 1))
    return t.copy_(normal(t.shape, std, 0.0, np.float32))


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    """torch.nn.init.xavier_uniform_: U(-b, b), ``b = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(t.shape)
    bound = gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
    return uniform_(t, -bound, bound)


def xavier_normal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """torch.nn.init.xavier_normal_: N(0, std), ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(t.shape)
    return t.copy_(normal(t.shape, gain * math.sqrt(2.0 / max(fan_in + fan_out, 1)), 0.0, np.float32))


def trunc_normal_(t: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """torch.nn.init.trunc_normal_: N(mean, std) restricted to [a, b] (redrawn where outside)."""
    if not a < b:
        raise ParamInvalidError(f"trunc_normal_: a must be below b, got [{a}, {b}]")
    out = np.empty(t.numel, np.float64)
    todo = np.arange(t.numel)
    while todo.size:
        draw = _rng.standard_normal(todo.size) * std + mean
        ok = (draw >= a) & (draw <= b)
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
    return t.copy_(out.reshape(t.shape))


def orthogonal_(t: Tensor, gain: float = 1.0) -> Tensor:
    """torch.nn.init.orthogonal_: the (rows, rest) flattening of ``t`` made (semi-)orthogonal, times ``gain``."""
    if t.ndim < 2:
        raise ParamInvalidError(f"orthogonal_: needs a tensor of >= 2 dims, got shape {tuple(t.shape)}")
    rows, cols = t.shape[0], t.numel // t.shape[0]
    flat = _rng.standard_normal((rows, cols))
    q, r = np.linalg.qr(flat.T if rows < cols else flat)
    q = q * np.sign(np.diag(r))
    return t.copy_((gain * (q.T if rows < cols else q)).reshape(t.shape))


def eye_(t: Tensor) -> Tensor:
    """torch.nn.init.eye_: the identity in a 2-D tensor."""
    if t.ndim != 2:
        raise ParamInvalidError(f"eye_: needs a 2-D tensor, got shape {tuple(t.shape)}")
    return t.copy_(np.eye(*t.shape))


def constant_(t: Tensor, value: float) -> Tensor:
    return t.copy_(np.full(t.shape, value))


def zeros_(t: Tensor) -> Tensor:
    return constant_(t, 0)


def ones_(t: Tensor) -> Tensor:
    return constant_(t, 1)
