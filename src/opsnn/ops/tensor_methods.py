"""Tensor methods as torch has them, generated from one table over the functional API.

Each row of :data:`METHODS` names a ``Tensor`` method, the functional entry point it calls
and, where torch's method differs from that function, how: its parameters in torch's order
(``"dim->axis"`` renames torch's ``dim`` to the function's ``axis``), which parameter
``self`` fills, fixed arguments (``float()`` is ``cast(dtype="float32")``) and a result
transform. :func:`install` builds every method from its row when ``opsnn.ops`` is imported;
methods the runtime's ``Tensor`` defines itself (zero-copy views such as ``reshape``,
``permute``, ``squeeze``) are kept.

Keywords: ``dim`` and ``axis`` are one parameter, as are ``keepdim`` and ``keepdims`` (torch
accepts both); an unknown keyword names the nearest parameter::

    >>> import opsnn, numpy as np
    >>> t = opsnn.tensor(np.array([[1.0, 5.0], [3.0, 2.0]], np.float32))
    >>> t.sum(axis=1, keepdims=True).numpy().tolist()
    [[6.0], [5.0]]
    >>> t.max(dim=1).indices.numpy().tolist()
    [1, 0]
    >>> t.softmax(axs=0)
    Traceback (most recent call last):
    ...
    opsnn.errors.ParamInvalidError: [161002] softmax() got an unexpected keyword 'axs'; did you mean 'axis' / 'dim'?
"""

from __future__ import annotations

import inspect
import numbers
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ParamInvalidError
from ..tensor import Tensor
from . import executor
from .api import FUNCTIONS, KEYWORD_ALIASES, spellings, unknown_keyword

#: torch's ``(values, indices)`` result of ``max(dim)`` / ``min(dim)``
MinMax = namedtuple("MinMax", ["values", "indices"])

ALIASES = KEYWORD_ALIASES


@dataclass(frozen=True)
class Method:
    """How one Tensor method calls its functional entry point ``fn``."""

    fn: str
    #: parameters after ``self`` in torch's order; ``"a->b"`` passes method argument ``a`` as the
    #: function's ``b``. None: the function's own parameters after the one ``self`` fills
    params: tuple | None = None
    #: the function parameter ``self`` fills (default: its first)
    self_as: str | None = None
    #: arguments the method fixes (not parameters of the method)
    fixed: dict = field(default_factory=dict)
    #: applied to the function's result (torch's layout where it differs from ONNX's)
    post: Callable | None = None
    #: a different function when the first argument is a tensor (``t.max(other)`` is elementwise)
    tensor_arg_fn: str | None = None


def _reflected(fn: str) -> Method:
    """``other <op> self``: self is the function's second operand."""
    return Method(fn, params=("other->input",), self_as="other")


def _cast(dtype: str) -> Method:
    return Method("cast", params=(), fixed={"dtype": dtype})


def _nonzero_rows(r):
    return r.transpose(0, 1)  # ONNX's (rank, count) as torch's (count, rank)


METHODS: dict[str, Method] = {
    # reductions (torch: no dim -> a 0-d tensor; max/min with a dim -> (values, indices))
    "sum": Method("sum"),
    "mean": Method("mean"),
    "prod": Method("prod"),
    "logsumexp": Method("logsumexp"),
    "var": Method("var"),
    "argmax": Method("argmax"),
    "argmin": Method("argmin"),
    "max": Method("max", tensor_arg_fn="maximum"),
    "min": Method("min", tensor_arg_fn="minimum"),
    "amax": Method("max"),
    "amin": Method("min"),
    "cumsum": Method("cumsum"),
    "cumprod": Method("cumprod"),
    # activations
    "relu": Method("relu"),
    "sigmoid": Method("sigmoid"),
    "tanh": Method("tanh"),
    "softmax": Method("softmax"),
    "log_softmax": Method("log_softmax"),
    "hardshrink": Method("hardshrink"),
    "prelu": Method("prelu"),
    # elementwise math
    "abs": Method("abs"),
    "absolute": Method("abs"),
    "neg": Method("neg"),
    "negative": Method("neg"),
    "sign": Method("sign"),
    "exp": Method("exp"),
    "log": Method("log"),
    "sqrt": Method("sqrt"),
    "rsqrt": Method("rsqrt"),
    "floor": Method("floor"),
    "ceil": Method("ceil"),
    "round": Method("round"),
    "reciprocal": Method("reciprocal"),
    "erf": Method("erf"),
    "sin": Method("sin"),
    "cos": Method("cos"),
    "tan": Method("tan"),
    "asin": Method("asin"),
    "acos": Method("acos"),
    "atan": Method("atan"),
    "arcsin": Method("asin"),
    "arccos": Method("acos"),
    "arctan": Method("atan"),
    "sinh": Method("sinh"),
    "cosh": Method("cosh"),
    "asinh": Method("asinh"),
    "acosh": Method("acosh"),
    "atanh": Method("atanh"),
    "isnan": Method("isnan"),
    "isinf": Method("isinf"),
    "clamp": Method("clamp"),
    "clip": Method("clip"),
    "add": Method("add"),
    "sub": Method("sub"),
    "subtract": Method("sub"),
    "mul": Method("mul"),
    "multiply": Method("mul"),
    "div": Method("div"),
    "divide": Method("div"),
    "true_divide": Method("div"),
    "pow": Method("pow"),
    "remainder": Method("remainder"),
    "fmod": Method("fmod"),
    "maximum": Method("maximum"),
    "minimum": Method("minimum"),
    "eq": Method("eq"),
    "lt": Method("lt"),
    "le": Method("le"),
    "gt": Method("gt"),
    "ge": Method("ge"),
    "less": Method("lt"),
    "less_equal": Method("le"),
    "greater": Method("gt"),
    "greater_equal": Method("ge"),
    "logical_and": Method("logical_and"),
    "logical_or": Method("logical_or"),
    "logical_xor": Method("logical_xor"),
    "logical_not": Method("logical_not"),
    "bitwise_and": Method("bitwise_and"),
    "bitwise_or": Method("bitwise_or"),
    "bitwise_xor": Method("bitwise_xor"),
    "bitwise_not": Method("bitwise_not"),
    "bitwise_left_shift": Method("bitwise_left_shift"),
    "bitwise_right_shift": Method("bitwise_right_shift"),
    "where": Method("where", params=("condition", "other"), self_as="input"),
    "matmul": Method("matmul", params=("other->b",)),
    "mm": Method("matmul", params=("mat2->b",)),
    "bmm": Method("matmul", params=("mat2->b",)),
    "det": Method("det"),
    # dtype conversions
    "float": _cast("float32"),
    "double": _cast("float64"),
    "half": _cast("float16"),
    "bfloat16": _cast("bfloat16"),
    "int": _cast("int32"),
    "long": _cast("int64"),
    "short": _cast("int16"),
    "char": _cast("int8"),
    "byte": _cast("uint8"),
    "bool": _cast("bool"),
    "type_as": Method("cast_like", params=("other->target",)),
    # indexing and layout (the zero-copy views are the runtime's own methods)
    "gather": Method("gather_elements", params=("dim->axis", "index->indices")),
    "scatter": Method("scatter_elements", params=("dim->axis", "index->indices", "src->updates")),
    "scatter_add": Method(
        "scatter_elements", params=("dim->axis", "index->indices", "src->updates"), fixed={"reduction": "add"}
    ),
    "index_select": Method("index_select"),
    "split": Method("split", params=("split_size->split_size_or_sections", "dim")),
    "tile": Method("tile", params=("dims->repeats",)),
    "masked_fill": Method("where", params=("mask->condition", "value->input"), self_as="other"),
    "topk": Method("topk"),
    "triu": Method("triu"),
    "tril": Method("tril"),
    "nonzero": Method("nonzero", post=_nonzero_rows),
    "unique": Method("unique", params=("sorted", "dim"), post=lambda r: r[0]),
    "bernoulli": Method("bernoulli", params=("seed",)),
    # operators
    "__add__": Method("add"),
    "__radd__": _reflected("add"),
    "__sub__": Method("sub"),
    "__rsub__": _reflected("sub"),
    "__mul__": Method("mul"),
    "__rmul__": _reflected("mul"),
    "__truediv__": Method("div"),
    "__rtruediv__": _reflected("div"),
    "__pow__": Method("pow", params=("other->exponent",)),
    "__rpow__": Method("pow", params=("other->input",), self_as="exponent"),
    "__mod__": Method("remainder"),
    "__rmod__": _reflected("remainder"),
    "__lt__": Method("lt"),
    "__le__": Method("le"),
    "__gt__": Method("gt"),
    "__ge__": Method("ge"),
    "__and__": Method("logical_and"),
    "__rand__": _reflected("logical_and"),
    "__or__": Method("logical_or"),
    "__ror__": _reflected("logical_or"),
    "__xor__": Method("logical_xor"),
    "__rxor__": _reflected("logical_xor"),
    "__matmul__": Method("matmul", params=("other->b",)),
    "__rmatmul__": Method("matmul", params=("other->a",), self_as="b"),
    "__neg__": Method("neg"),
    "__abs__": Method("abs"),
}

#: functional ops whose torch Tensor method means something else, so they get no method here
NOT_METHODS = {
    "multinomial": "torch samples from probabilities, ONNX Multinomial from log-probabilities",
    "stft": "torch.Tensor.stft takes n_fft/hop_length/window, the functional takes ONNX's frame_step/frame_length",
    "cast": "torch's spelling is .to(dtype) (the runtime's own method) and .float() / .half() / ...",
}


def _method_params(name: str, spec: Method) -> tuple[list, str, bool]:
    """``[(method name, function name)]``, the parameter ``self`` fills, and whether the
    function takes extra positional arguments (``maximum(input, *others)``)."""
    fn = FUNCTIONS[spec.fn]
    sig = inspect.signature(fn.translate)
    plist = list(sig.parameters.values())
    fnames = [p.name for p in plist if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in plist)
    self_as = spec.self_as or plist[0].name
    if spec.params is None:
        pairs = [(n, n) for n in fnames if n != self_as and n not in spec.fixed]
    else:
        pairs = [tuple(p.split("->")) if "->" in p else (p, p) for p in spec.params]
    for m, f in pairs:
        if f not in fnames:
            raise ParamInvalidError(
                f"Tensor.{name}: the table maps {m!r} to {f!r}, which is not a parameter of opsnn.ops.{spec.fn}{sig}"
            )
    return pairs, self_as, varargs and spec.params is None


def make_method(name: str, spec: Method) -> Callable:
    """The Tensor method ``name`` built from its table row."""
    pairs, self_as, varargs = _method_params(name, spec)
    fn = FUNCTIONS[spec.fn]
    order = [m for m, _ in pairs]
    to_fn = dict(pairs)
    spelled = {s: m for m in order for s in spellings(m)}
    other_fn = FUNCTIONS[spec.tensor_arg_fn] if spec.tensor_arg_fn else None
    shown = name.strip("_") if name.startswith("__") else name

    def method(self, *args, **kwargs):
        if other_fn is not None and args and isinstance(args[0], (Tensor, np.ndarray)):
            return other_fn(self, *args, **kwargs)
        if varargs:
            extra = {spelled.get(k, k): v for k, v in kwargs.items()}
            bad = [k for k in kwargs if k not in spelled]
            if bad:
                raise unknown_keyword(shown, bad[0], order)
            res = fn(self, *args, **dict(spec.fixed), **{to_fn[k]: v for k, v in extra.items()})
            return spec.post(res) if spec.post else res
        if len(args) > len(order):
            raise ParamInvalidError(
                f"{shown}() takes at most {len(order)} argument(s) ({', '.join(order) or 'none'}), got {len(args)}"
            )
        call = dict(spec.fixed)
        for m, v in zip(order, args):
            call[to_fn[m]] = v
        for k, v in kwargs.items():
            m = spelled.get(k)
            if m is None:
                raise unknown_keyword(shown, k, order)
            if to_fn[m] in call:
                raise ParamInvalidError(f"{shown}() got two values for {' / '.join(map(repr, spellings(m)))}")
            call[to_fn[m]] = v
        call[self_as] = self
        res = fn(**call)
        return spec.post(res) if spec.post else res

    method.__name__ = method.__qualname__ = name
    sig = ", ".join(order)
    method.__doc__ = (
        f"``Tensor.{name}({sig})``: ``opsnn.ops.{spec.fn}`` with ``self`` as "
        f"``{self_as}``"
        + (f" and {spec.fixed}" if spec.fixed else "")
        + (
            "; ``dim`` / ``axis``, ``keepdim`` / ``keepdims`` are one parameter each"
            if any(m in ALIASES for m in order)
            else ""
        )
        + "."
    )
    method._generated = spec
    return method


def _minmax(reduce_name: str, arg_name: str, elementwise: str) -> Callable:
    """torch's ``max`` / ``min``: no dim -> the value; a dim -> ``(values, indices)``; a tensor ->
    the elementwise ``maximum`` / ``minimum``."""
    base = make_method(reduce_name, METHODS[reduce_name])
    arg = make_method(arg_name, METHODS[arg_name])

    def method(self, *args, **kwargs):
        if args and isinstance(args[0], (Tensor, np.ndarray)):
            return base(self, *args, **kwargs)
        values = base(self, *args, **kwargs)
        dim = args[0] if args else next((kwargs[k] for k in ("dim", "axis") if k in kwargs), None)
        if dim is None:
            return values
        return MinMax(values, arg(self, *args, **kwargs))

    method.__name__ = method.__qualname__ = reduce_name
    method.__doc__ = base.__doc__ + f" With a dim: ``(values, indices)``; with a tensor: ``{elementwise}``."
    method._generated = METHODS[reduce_name]
    return method


def _comparable(other) -> bool:
    """Whether ``t == other`` compares elementwise (else Python's identity equality answers)."""
    return isinstance(other, (Tensor, np.ndarray, np.generic, numbers.Number, list, tuple))


def _equality():
    """torch's ``==`` / ``!=`` (and ``ne`` / ``not_equal``): elementwise bool tensors against tensors,
    arrays and numbers; None or any other object compares by identity. Hashing stays by identity."""
    eq = make_method("eq", METHODS["eq"])
    logical_not = FUNCTIONS["logical_not"]

    def __eq__(self, other):
        return eq(self, other) if _comparable(other) else NotImplemented

    def __ne__(self, other):
        return logical_not(eq(self, other)) if _comparable(other) else NotImplemented

    def ne(self, other):
        return logical_not(eq(self, other))

    for fn in (__eq__, __ne__, ne):
        fn._generated = METHODS["eq"]
    return {"__eq__": __eq__, "__ne__": __ne__, "ne": ne, "not_equal": ne}


def _repeat(self, *sizes):
    """torch's ``Tensor.repeat(*sizes)``: ``tile`` with at least one size per dim (more add leading dims)."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    if len(sizes) < self.ndim or any(
        isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 for v in sizes
    ):
        raise ParamInvalidError(
            f"repeat: expected one non-negative int per dim of the {self.ndim}-D tensor (or more), got {sizes}"
        )
    return FUNCTIONS["tile"](self, [int(v) for v in sizes])


def _chunk(self, chunks, dim=0):
    """torch's ``Tensor.chunk(chunks, dim)``: pieces of ceil(size / chunks) along ``dim`` (the last smaller,
    fewer pieces where the size runs out)."""
    if isinstance(chunks, bool) or not isinstance(chunks, numbers.Integral) or chunks <= 0:
        raise ParamInvalidError(f"chunk: chunks must be a positive int, got {chunks!r}")
    if self.ndim == 0:
        raise ParamInvalidError("chunk: a 0-d tensor has no dim to chunk")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -self.ndim <= dim < self.ndim:
        raise ParamInvalidError(f"chunk: dim {dim!r} out of range for a {self.ndim}-D tensor")
    return FUNCTIONS["split"](self, max(1, -(-self.shape[dim] // int(chunks))), dim)


def _truth_reduction(name: str, reduce: str):
    """torch's ``any`` / ``all``: whether any / every element is nonzero (NaN counts as nonzero), over
    all elements (a 0-d bool tensor) or along ``dim``."""

    cast = FUNCTIONS["cast"]

    def method(self, dim=None, keepdim: bool = False):
        flags = cast(cast(self, "bool"), "int32")
        if dim is None:
            if self.numel == 0:  # any() of nothing is False, all() True
                return cast(np.asarray(reduce == "min"), "bool")
            return cast(FUNCTIONS[reduce](FUNCTIONS["reshape"](flags, (-1,))), "bool")
        return cast(FUNCTIONS[reduce](flags, dim, keepdim), "bool")

    method.__name__ = method.__qualname__ = name
    return method


def _shape_of(other) -> tuple:
    return tuple(other.shape)


def _view_as(self, other):
    return self.view(*_shape_of(other))


def _expand_as(self, other):
    return self.expand(*_shape_of(other))


def _reshape_as(self, other):
    return self.reshape(*_shape_of(other))


def _t(self):
    """torch's ``t()``: a 2-D tensor transposed (0-D and 1-D unchanged)."""
    if self.ndim > 2:
        raise ParamInvalidError(f"t: expects a tensor of <= 2 dims, got {self.ndim}-D; use transpose(dim0, dim1)")
    return self if self.ndim < 2 else self.transpose(0, 1)


def _mT(self):
    if self.ndim < 2:
        raise ParamInvalidError(f"mT: expects a tensor of >= 2 dims, got shape {self.shape}")
    return self.transpose(-2, -1)


def _square(self):
    return FUNCTIONS["mul"](self, self)


def _is_floating_point(self) -> bool:
    return self.dtype.kind == "f" or self.dtype.name == "bfloat16"


def _narrow(self, dim: int, start: int, length: int):
    """torch's ``narrow``: ``length`` elements of dim ``dim`` from ``start`` (a view where not traced)."""
    if self.ndim == 0 or not -self.ndim <= dim < self.ndim:
        raise ParamInvalidError(f"narrow: dim {dim} out of range for a {self.ndim}-D tensor")
    n = self.shape[dim]
    start = start + n if start < 0 else start
    if not 0 <= start <= n or length < 0 or start + length > n:
        raise ParamInvalidError(f"narrow: [{start}, {start + length}) is outside dim {dim} of size {n}")
    return FUNCTIONS["slice"](self, [start], [start + length], [dim % self.ndim])


def _select(self, dim: int, index: int):
    """torch's ``select``: the slice at ``index`` of dim ``dim``, that dim removed."""
    if self.ndim == 0 or not -self.ndim <= dim < self.ndim:
        raise ParamInvalidError(f"select: dim {dim} out of range for a {self.ndim}-D tensor")
    d, n = dim % self.ndim, self.shape[dim]
    if not -n <= index < n:
        raise ParamInvalidError(f"select: index {index} out of range for dim {dim} of size {n}")
    return FUNCTIONS["squeeze"](_narrow(self, d, index % n, 1), d)


def _masked_select(self, mask):
    """torch's ``masked_select``: the elements where ``mask`` (broadcast to the tensor) is true, as 1-D."""
    m = np.broadcast_to(mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask, bool), self.shape)
    return FUNCTIONS["compress"](FUNCTIONS["reshape"](self, (-1,)), np.ascontiguousarray(m).reshape(-1), 0)


def _clamp_min(self, min):
    return FUNCTIONS["clamp"](self, min=min)


def _clamp_max(self, max):
    return FUNCTIONS["clamp"](self, max=max)


def _nan_reduction(name: str):
    def method(self, dim=None, keepdim: bool = False):
        zero = Tensor(np.zeros((), self.dtype))
        kept = FUNCTIONS["where"](FUNCTIONS["isnan"](self), zero, self)
        total = FUNCTIONS["sum"](kept, dim, keepdim)
        if name == "nansum":
            return total
        count = FUNCTIONS["sum"](
            FUNCTIONS["cast"](FUNCTIONS["logical_not"](FUNCTIONS["isnan"](self)), self.dtype), dim, keepdim
        )
        return FUNCTIONS["div"](total, count)

    method.__name__ = method.__qualname__ = name
    return method


def _count_nonzero(self, dim=None):
    flags = FUNCTIONS["cast"](FUNCTIONS["cast"](self, "bool"), "int64")
    return FUNCTIONS["sum"](flags, dim)


def _data(self):
    """torch's ``.data``: the same memory outside autograd (``detach()``)."""
    return self.detach()


def _in_place(name: str, compute):
    """torch's in-place ``name``: ``compute(self, *args)`` written into self's memory. As in torch, a leaf
    that requires grad cannot be written while grad mode is on, and a write into a tensor a recorded
    op saved makes that op's backward an error (autograd's version check), never a silent wrong gradient."""

    def method(self, *args, **kwargs):
        grad_mode = executor._autograd_grad_enabled
        if (
            grad_mode is not None
            and grad_mode()
            and (
                self.requires_grad or any(isinstance(a, Tensor) and a.requires_grad for a in (*args, *kwargs.values()))
            )
        ):
            raise ParamInvalidError(
                f"{name}: in place with grad mode on, a tensor that requires grad would be written or its gradient "
                "lost; do it under opsnn.no_grad() (an optimizer-style update) or write x = x op y"
            )
        result = compute(self, *args, **kwargs)
        return self.copy_(result)

    method.__name__ = method.__qualname__ = name
    return method


def _lerp(self, end, weight):
    return FUNCTIONS["add"](self, FUNCTIONS["mul"](FUNCTIONS["sub"](end, self), weight))


def _addcmul(self, t1, t2, value=1):
    return FUNCTIONS["add"](self, FUNCTIONS["mul"](FUNCTIONS["mul"](t1, t2), value))


def _addcdiv(self, t1, t2, value=1):
    return FUNCTIONS["add"](self, FUNCTIONS["mul"](FUNCTIONS["div"](t1, t2), value))


def _scaled(op: str):
    def compute(self, other, alpha=1):
        return FUNCTIONS[op](self, other if alpha == 1 else FUNCTIONS["mul"](other, alpha))

    return compute


def install(cls=Tensor) -> list[str]:
    """Put every table method on ``cls`` (keeping the ones ``cls`` defines itself); returns their names."""
    done = []
    from . import torch_names as T

    extra = {
        "repeat": _repeat,
        "chunk": _chunk,
        "any": _truth_reduction("any", "max"),
        "all": _truth_reduction("all", "min"),
        # torch's methods over opsnn.ops.torch_names (self as their first argument)
        **{n: getattr(T, n) for n in ("std", "sort", "argsort", "flip", "roll", "outer", "norm", "repeat_interleave")},
        **{n: getattr(T, n) for n in ("isclose", "allclose", "equal")},
        "view_as": _view_as,
        "expand_as": _expand_as,
        "reshape_as": _reshape_as,
        "t": _t,
        "mT": property(_mT),
        "square": _square,
        "is_floating_point": _is_floating_point,
        "cpu": lambda self: self,
        "narrow": _narrow,
        "select": _select,
        "masked_select": _masked_select,
        "clamp_min": _clamp_min,
        "clamp_max": _clamp_max,
        "nansum": _nan_reduction("nansum"),
        "nanmean": _nan_reduction("nanmean"),
        "count_nonzero": _count_nonzero,
        "data": property(_data),
        "lerp": _lerp,
        "addcmul": _addcmul,
        "addcdiv": _addcdiv,
        "add": _scaled("add"),
        "sub": _scaled("sub"),
        "subtract": _scaled("sub"),
        "add_": _in_place("add_", _scaled("add")),
        "sub_": _in_place("sub_", _scaled("sub")),
        "mul_": _in_place("mul_", lambda self, other: FUNCTIONS["mul"](self, other)),
        "div_": _in_place("div_", lambda self, other: FUNCTIONS["div"](self, other)),
        "clamp_": _in_place("clamp_", lambda self, min=None, max=None: FUNCTIONS["clamp"](self, min, max)),
        "lerp_": _in_place("lerp_", _lerp),
        "addcmul_": _in_place("addcmul_", _addcmul),
        "addcdiv_": _in_place("addcdiv_", _addcdiv),
    }
    for name, fn in {**_equality(), **extra}.items():
        setattr(cls, name, fn)
        done.append(name)
    for name, spec in METHODS.items():
        own = cls.__dict__.get(name)
        if own is not None and not hasattr(own, "_generated"):
            continue
        if name in ("max", "min"):
            setattr(cls, name, _minmax(name, "arg" + name, spec.tensor_arg_fn))
        else:
            setattr(cls, name, make_method(name, spec))
        done.append(name)
    return done


__all__ = ["ALIASES", "METHODS", "NOT_METHODS", "Method", "MinMax", "install", "make_method", "unknown_keyword"]
