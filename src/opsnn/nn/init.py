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


def kaiming_normal(shape, mode: str = "fan_in", nonlinearity: str = "relu", dtype="float32") -> np.ndarray:
    fan_in, fan_out = _fans(shape)
    fan = fan_in if mode == "fan_in" else fan_out
    gain = math.sqrt(2.0) if nonlinearity == "relu" else 1.0
    return normal(shape, gain / math.sqrt(max(fan, 1)), dtype=dtype)


def fan_in_bound(weight_shape) -> float:
    """torch's bias bound for Linear/Conv: ``1 / sqrt(fan_in)``."""
    fan_in, _ = _fans(weight_shape)
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


# -- in place, on existing tensors ------------------------------------------------------------------
def normal_(t: Tensor, std: float = 1.0, mean: float = 0.0) -> Tensor:
    return t.copy_(normal(t.shape, std, mean, np.float32))


def uniform_(t: Tensor, low: float, high: float) -> Tensor:
    return t.copy_(uniform(t.shape, low, high, np.float64))


def kaiming_normal_(t: Tensor, mode: str = "fan_in", nonlinearity: str = "relu") -> Tensor:
    return t.copy_(kaiming_normal(t.shape, mode, nonlinearity, np.float32))


def constant_(t: Tensor, value: float) -> Tensor:
    return t.copy_(np.full(t.shape, value))


def zeros_(t: Tensor) -> Tensor:
    return constant_(t, 0)


def ones_(t: Tensor) -> Tensor:
    return constant_(t, 1)
