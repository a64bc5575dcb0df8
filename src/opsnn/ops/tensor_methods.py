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

from .. import dtypes as _dt
from ..errors import DTypeError, ParamInvalidError
from ..tensor import Tensor, bump_version
from . import executor
from . import tensor_composed as C
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
    "arcsinh": Method("asinh"),
    "arccosh": Method("acosh"),
    "arctanh": Method("atanh"),
    "sinh": Method("sinh"),
    "cosh": Method("cosh"),
    "asinh": Method("asinh"),
    "acosh": Method("acosh"),
    "atanh": Method("atanh"),
    "isnan": Method("isnan"),
    # special functions and binary math (ops/defs/special.py)
    "log1p": Method("log1p"),
    "expm1": Method("expm1"),
    "erfc": Method("erfc"),
    "erfinv": Method("erfinv"),
    "lgamma": Method("lgamma"),
    "digamma": Method("digamma"),
    "logit": Method("logit"),
    "xlogy": Method("xlogy"),
    "hypot": Method("hypot"),
    "atan2": Method("atan2"),
    "arctan2": Method("atan2"),
    "copysign": Method("copysign"),
    "logaddexp": Method("logaddexp"),
    "fmax": Method("fmax"),
    "fmin": Method("fmin"),
    "heaviside": Method("heaviside"),
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


#: bool < integer < floating: a result may be written into a tensor of its own kind or a higher one
def _kind_rank(dt) -> int:
    dt = np.dtype(dt)
    if dt == np.bool_:
        return 0
    return 2 if _dt.is_float(dt) else 3 if dt.kind == "c" else 1


def _fits(shape: tuple, into: tuple) -> bool:
    """Whether a result of ``shape`` broadcasts to ``into`` without growing it."""
    try:
        return np.broadcast_shapes(shape, into) == into
    except ValueError:
        return False


def _in_place(name: str, compute):
    """torch's in-place ``name``: ``compute(self, *args)`` written into self's memory. As in torch, a leaf
    that requires grad cannot be written while grad mode is on, a result of a higher kind (float into an
    integer tensor) or a larger broadcast shape is refused, and a write into a tensor a recorded op saved
    makes that op's backward an error (autograd's version check), never a silent wrong gradient."""

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
        rdt = getattr(result, "dtype", None)
        if rdt is not None and _kind_rank(rdt) > _kind_rank(self.dtype):
            raise DTypeError(
                f"{name}: the result is {_dt.name(rdt)}, which cannot be written into this "
                f"{_dt.name(self.dtype)} tensor in place; write x = x.{name[:-1]}(...) or convert x first"
            )
        if not _fits(tuple(np.shape(result)), tuple(self.shape)):
            raise ParamInvalidError(
                f"{name}: the result has shape {tuple(np.shape(result))}, which does not fit the tensor's shape "
                f"{tuple(self.shape)} in place"
            )
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


#: elementwise methods (and cumsum / tril / index_add ...) that keep self's shape, each given an in-place
#: ``<name>_`` that writes its result into self (comparisons write 0 / 1 in self's dtype, as torch)
IN_PLACE = tuple(
    (
        "abs absolute neg negative exp exp2 log log2 log10 sqrt rsqrt sigmoid tanh relu sin cos tan asin acos "
        "atan arcsin arccos arctan arcsinh arccosh arctanh sinh cosh asinh acosh atanh floor ceil round trunc fix "
        "frac reciprocal sign sgn erf square deg2rad rad2deg nan_to_num pow remainder fmod clamp_min clamp_max "
        "clip masked_fill masked_scatter eq ne lt le gt ge less less_equal greater greater_equal not_equal "
        "logical_and logical_or logical_xor logical_not bitwise_and bitwise_or bitwise_xor bitwise_not "
        "bitwise_left_shift bitwise_right_shift multiply divide true_divide subtract tril triu cumsum cumprod "
        "scatter scatter_add index_add index_copy index_fill"
    ).split()
)


def _same_method(name: str):
    """``self.<name>(...)``, looked up at call time (a later table edit changes both forms); torch's logical
    ops read any dtype as truth values."""

    def compute(self, *args, **kwargs):
        if name.startswith("logical_"):
            self = self if self.dtype == np.bool_ else self.bool()
            args = tuple(a.bool() if isinstance(a, Tensor) and a.dtype != np.bool_ else a for a in args)
        return getattr(type(self), name)(self, *args, **kwargs)

    return compute


# -- scatter / index_* (torch's signatures; ScatterElements underneath, so gradients flow) ---------------------
def _index_arg(index, what: str) -> Tensor:
    idx = index if isinstance(index, Tensor) else Tensor(np.asarray(index))
    if idx.dtype.kind not in "iu":
        raise DTypeError(f"{what}: index must be an integer tensor, got {_dt.name(idx.dtype)}")
    return idx


def _dim_of(self, dim, what: str) -> int:
    n = max(self.ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or not -n <= dim < n:
        raise ParamInvalidError(f"{what}: dim {dim!r} out of range for a {self.ndim}-D tensor")
    return int(dim) % n


def _scatter(self, dim, index, src=None, value=None, *, reduce=None):
    """torch's ``scatter(dim, index, src | value, reduce=None)``: ``src`` (a tensor, sliced to the index's
    shape) or a number written at ``index`` along ``dim``; ``reduce`` 'add' / 'multiply' combines instead."""
    d, idx = _dim_of(self, dim, "scatter"), _index_arg(index, "scatter")
    if src is None:
        src = value
    if src is None:
        raise ParamInvalidError("scatter: give src (a tensor) or value (a number)")
    if isinstance(src, Tensor):
        if src.ndim != idx.ndim or any(i > s for i, s in zip(idx.shape, src.shape)):
            raise ParamInvalidError(
                f"scatter: src of shape {tuple(src.shape)} is smaller than index {tuple(idx.shape)} (or of another rank)"
            )
        if tuple(src.shape) != tuple(idx.shape):
            src = src[tuple(slice(0, n) for n in idx.shape)]
    else:
        src = Tensor(np.full(idx.shape, src, self.dtype))
    modes = {None: "none", "add": "add", "multiply": "mul"}
    if reduce not in modes:
        raise ParamInvalidError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
    return FUNCTIONS["scatter_elements"](self, idx, src, d, modes[reduce])


def _scatter_add(self, dim, index, src):
    return _scatter(self, dim, index, src, reduce="add")


def _spread_index(self, dim, index, source, what: str):
    """The dim, and ``index`` (1-D) spread to ``source``'s shape along ``dim`` (ScatterElements' indices)."""
    d, idx = _dim_of(self, dim, what), _index_arg(index, what)
    source = source if isinstance(source, Tensor) else Tensor(np.asarray(source, self.dtype))
    if idx.ndim > 1 or source.ndim != self.ndim or (self.ndim and idx.numel != source.shape[d]):
        raise ParamInvalidError(
            f"{what}: expects a 1-D index with one entry per slice of source along dim {d}, got index "
            f"{tuple(idx.shape)} and source {tuple(source.shape)} for a tensor of shape {tuple(self.shape)}"
        )
    if any(s != t for k, (s, t) in enumerate(zip(source.shape, self.shape)) if k != d):
        raise ParamInvalidError(
            f"{what}: source {tuple(source.shape)} must match the tensor {tuple(self.shape)} except along dim {d}"
        )
    if self.ndim == 0:
        return 0, idx.reshape(()), source
    shape = [1] * self.ndim
    shape[d] = -1
    return d, idx.reshape(*shape).expand(*source.shape), source


def _index_add(self, dim, index, source, *, alpha=1):
    """torch's ``index_add``: ``alpha * source``'s slices added into the slices ``index`` names along ``dim``.
    ScatterElements' add reduction has no gradient rule, so the slices are placed one occurrence rank at a
    time (a repeated index lands in a later round) by the plain scatter, whose rule covers both inputs."""
    d, idx, source = _spread_index(self, dim, index, source, "index_add")
    if alpha != 1:
        source = source * alpha
    flat = np.asarray(_index_arg(index, "index_add").numpy()).reshape(-1)
    rank = np.zeros(flat.shape, np.int64)
    seen: dict = {}
    for i, j in enumerate(flat.tolist()):
        rank[i] = seen.get(j, 0)
        seen[j] = rank[i] + 1
    out = self
    for r in range(int(rank.max()) + 1 if flat.size else 0):
        pick = Tensor(np.flatnonzero(rank == r).astype(np.int64))
        part_idx = FUNCTIONS["index_select"](idx, d, pick) if self.ndim else idx
        part = FUNCTIONS["index_select"](source, d, pick) if self.ndim else source
        zeros = Tensor(np.zeros(self.shape, self.dtype))
        out = out + FUNCTIONS["scatter_elements"](zeros, part_idx, part, d)
    return out


def _index_copy(self, dim, index, source):
    """torch's ``index_copy``: ``source``'s slices written into the slices ``index`` names along ``dim``."""
    d, idx, source = _spread_index(self, dim, index, source, "index_copy")
    return FUNCTIONS["scatter_elements"](self, idx, source, d)


def _index_fill(self, dim, index, value):
    """torch's ``index_fill``: the slices ``index`` names along ``dim`` set to ``value``."""
    d, idx = _dim_of(self, dim, "index_fill"), _index_arg(index, "index_fill")
    if idx.ndim > 1:
        raise ParamInvalidError(f"index_fill: index must be 0-D or 1-D, got shape {tuple(idx.shape)}")
    n = self.shape[d] if self.ndim else 1
    hit = FUNCTIONS["scatter_elements"](
        Tensor(np.zeros(n, np.float32)), idx.reshape(-1), Tensor(np.ones(idx.numel, np.float32))
    )
    shape = [1] * self.ndim
    if self.ndim:
        shape[d] = n
    mask = (hit > 0).reshape(*shape) if self.ndim else (hit > 0).reshape(())
    fill = value if isinstance(value, Tensor) else Tensor(np.asarray(value, self.dtype))
    return FUNCTIONS["where"](mask, FUNCTIONS["cast"](fill, self.dtype), self)


def _masked_scatter(self, mask, source):
    """torch's ``masked_scatter``: ``source``'s elements, in order, written where ``mask`` (broadcast) is true."""
    m = np.broadcast_to(mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask), self.shape)
    if m.dtype != np.bool_:
        raise DTypeError(f"masked_scatter: mask must be bool, got {_dt.name(m.dtype)}")
    count = int(m.sum())
    src = source if isinstance(source, Tensor) else Tensor(np.asarray(source, self.dtype))
    if src.numel < count:
        raise ParamInvalidError(f"masked_scatter: the mask selects {count} elements, source has {src.numel}")
    take = np.maximum(np.cumsum(m.reshape(-1)) - 1, 0)
    picked = FUNCTIONS["index_select"](src.reshape(-1), 0, Tensor(take.astype(np.int64)))
    return FUNCTIONS["where"](Tensor(np.ascontiguousarray(m)), picked.reshape(*self.shape), self)


# -- in-place random fills, drawn from opsnn's seeded generator ------------------------------------------------
#: set by opsnn.nn.init (which owns the seed, ``opsnn.manual_seed``): ``random_source(what)`` is the
#: generator to draw from, refusing while a function is traced; the ops layer may not import nn
random_source = None


def _generator(what: str) -> np.random.Generator:
    if random_source is None:
        from ..errors import NotInitializedError

        raise NotInitializedError(f"{what}: no random generator is installed; import opsnn (opsnn.nn.init sets it)")
    return random_source(what)


def _bind(what: str, args: tuple, kwargs: dict, names: tuple, defaults: tuple) -> list:
    """torch's arguments (``from`` is a Python keyword, so these methods take them by name)."""
    if len(args) > len(names):
        raise ParamInvalidError(
            f"{what}() takes at most {len(names)} argument(s) ({', '.join(names)}), got {len(args)}"
        )
    got = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise unknown_keyword(what, k, list(names))
        if k in got:
            raise ParamInvalidError(f"{what}() got two values for {k!r}")
        got[k] = v
    out = []
    for n, dv in zip(names, defaults):
        v = got.get(n, dv)
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ParamInvalidError(f"{what}: {n} must be a number, got {v!r}")
        out.append(v)
    return out


def _floating(self, what: str) -> None:
    if not _is_floating_point(self):
        raise DTypeError(f"{what}: expects a floating tensor, got {_dt.name(self.dtype)} (as torch)")


def _normal(self, *args, **kwargs):
    mean, std = _bind("normal_", args, kwargs, ("mean", "std"), (0.0, 1.0))
    _floating(self, "normal_")
    if not std >= 0:
        raise ParamInvalidError(f"normal_: std must be >= 0, got {std}")
    return _generator("normal_").normal(mean, std, self.shape).astype(self.dtype)


def _uniform(self, *args, **kwargs):
    lo, hi = _bind("uniform_", args, kwargs, ("from", "to"), (0.0, 1.0))
    _floating(self, "uniform_")
    if not lo <= hi:
        raise ParamInvalidError(f"uniform_: from must be <= to, got [{lo}, {hi})")
    return _generator("uniform_").uniform(lo, hi, self.shape).astype(self.dtype)


def _exponential(self, *args, **kwargs):
    (lambd,) = _bind("exponential_", args, kwargs, ("lambd",), (1.0,))
    _floating(self, "exponential_")
    if not lambd > 0:
        raise ParamInvalidError(f"exponential_: lambd must be > 0, got {lambd}")
    return _generator("exponential_").exponential(1.0 / lambd, self.shape).astype(self.dtype)


def _bernoulli_fill(self, p=0.5):
    if isinstance(p, Tensor):
        prob = p.numpy().astype(np.float64)
        if not _fits(prob.shape, tuple(self.shape)):
            raise ParamInvalidError(f"bernoulli_: p of shape {prob.shape} does not broadcast to {tuple(self.shape)}")
    elif isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise ParamInvalidError(f"bernoulli_: p must be a number or a tensor, got {p!r}")
    else:
        prob = np.float64(p)
    if np.any(~((prob >= 0) & (prob <= 1))):
        raise ParamInvalidError("bernoulli_: p must lie in [0, 1]")
    return (_generator("bernoulli_").random(self.shape) < prob).astype(self.dtype)


#: ``random_()``'s default upper bound for floats: every integer below it is exact in the dtype (as torch)
_FLOAT_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def _random(self, *args, **kwargs):
    if len(args) == 1 and not kwargs:
        args = (0, args[0])  # random_(to), as torch
    lo, hi = _bind("random_", args, kwargs, ("from", "to"), (0, None))
    if isinstance(lo, float) or isinstance(hi, float):
        raise ParamInvalidError(f"random_: from and to must be ints, got {lo!r} and {hi!r}")
    name = _dt.name(self.dtype)
    if hi is None:
        if name in _FLOAT_DIGITS:
            top = 2 ** _FLOAT_DIGITS[name]
        elif self.dtype == np.bool_:
            top = 1
        else:
            top = int(np.iinfo(self.dtype).max)
    else:
        if not lo < hi:
            raise ParamInvalidError(f"random_: from must be below to, got [{lo}, {hi})")
        top = int(hi) - 1
    return _generator("random_").integers(int(lo), top, self.shape, endpoint=True).astype(self.dtype)


def _fill_diagonal(self, fill_value, wrap: bool = False):
    """torch's ``fill_diagonal_``: the main diagonal set to ``fill_value`` (all dims equal beyond 2-D; ``wrap``
    continues a tall matrix's diagonal every columns + 1 rows)."""
    if self.ndim < 2 or (self.ndim > 2 and len(set(self.shape)) != 1):
        raise ParamInvalidError(
            f"fill_diagonal_: expects a 2-D tensor or one whose dims are all equal, got shape {tuple(self.shape)}"
        )
    a = np.array(self.numpy())
    np.fill_diagonal(a, fill_value, wrap=bool(wrap))
    return a


# -- in-place shape changes: self becomes the view (torch's squeeze_, t_ ...) --------------------------------------
def _view_in_place(name: str, view):
    def method(self, *args, **kwargs):
        if executor._tracer is not None:
            raise ParamInvalidError(
                f"{name}: a tensor's shape changed in place is not recorded in a traced function; write "
                f"x = x.{name[:-1]}(...)"
            )
        grad_mode = executor._autograd_grad_enabled
        if grad_mode is not None and grad_mode() and self.requires_grad:
            raise ParamInvalidError(
                f"{name}: in place with grad mode on, a tensor that requires grad would change shape under its "
                f"graph; write x = x.{name[:-1]}(...) (or do it under opsnn.no_grad())"
            )
        out = view(self, *args, **kwargs)
        self._array = out._array
        if self.format != "ND" and self.ndim != 4:
            self.format = "ND"
        bump_version(self)  # a recorded op that saved this tensor would see another shape: its backward refuses
        return self

    method.__name__ = method.__qualname__ = name
    return method


# -- metadata as torch names it -----------------------------------------------------------------------------------
def _stride(self, dim=None):
    """torch's ``stride()``: the strides in elements (``stride(dim)``: one of them)."""
    st = self.strides
    return st if dim is None else st[_dim_of(self, dim, "stride")]


def _H(self):
    if self.ndim not in (0, 2):
        raise ParamInvalidError(f"H: expects a 0-D or 2-D tensor, got shape {tuple(self.shape)}; use mH for batches")
    return self if self.ndim == 0 else self.transpose(0, 1)


#: composed methods (opsnn/ops/tensor_composed.py), each also ``opsnn.<name>`` in torch_api
COMPOSED = (
    "isfinite nan_to_num trunc frac sgn positive signbit float_power log2 log10 exp2 deg2rad rad2deg diagonal "
    "diag trace dot inner addmm baddbmm addmv addr mv ger broadcast_to swapaxes movedim take_along_dim "
    "tensor_split hsplit vsplit dsplit split_with_sizes unbind unflatten ravel argwhere fliplr flipud rot90 diff "
    "sum_to_size adjoint aminmax median nanmedian kthvalue cummax cummin logcumsumexp"
).split()


def install(cls=Tensor) -> list[str]:
    """Put every table method on ``cls`` (keeping the ones ``cls`` defines itself); returns their names."""
    done = []
    from . import torch_names as T

    extra = {
        "repeat": _repeat,
        "chunk": _chunk,
        "sign": C.sgn,  # torch's: 0 at NaN
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
    extra.update({n: getattr(C, n) for n in COMPOSED})
    extra.update(
        {
            "fix": C.trunc,
            "swapdims": C.swapaxes,
            "moveaxis": C.movedim,
            "mH": property(C.adjoint),
            "H": property(_H),
            "scatter": _scatter,
            "scatter_add": _scatter_add,
            "index_add": _index_add,
            "index_copy": _index_copy,
            "index_fill": _index_fill,
            "masked_scatter": _masked_scatter,
            "is_complex": lambda self: self.dtype.kind == "c",
            "is_signed": lambda self: self.dtype.kind in "if" or _dt.is_float(self.dtype),
            "is_inference": lambda self: False,  # opsnn has no inference tensors (inference_mode is no_grad)
            "is_cpu": property(lambda self: True),
            "is_cuda": property(lambda self: False),
            "itemsize": property(lambda self: self.dtype.itemsize),
            "get_device": lambda self: -1,  # torch's answer for a CPU tensor
            "stride": _stride,
            "storage_offset": lambda self: self.offset,
            "data_ptr": lambda self: self._array.ctypes.data,
            "normal_": _in_place("normal_", _normal),
            "uniform_": _in_place("uniform_", _uniform),
            "exponential_": _in_place("exponential_", _exponential),
            "bernoulli_": _in_place("bernoulli_", _bernoulli_fill),
            "random_": _in_place("random_", _random),
            "fill_diagonal_": _in_place("fill_diagonal_", _fill_diagonal),
            "squeeze_": _view_in_place("squeeze_", lambda self, dim=None: self.squeeze(dim)),
            "unsqueeze_": _view_in_place("unsqueeze_", lambda self, dim: self.unsqueeze(dim)),
            "t_": _view_in_place("t_", _t),
            "transpose_": _view_in_place("transpose_", lambda self, dim0, dim1: self.transpose(dim0, dim1)),
            "swapaxes_": _view_in_place("swapaxes_", lambda self, axis0, axis1: self.transpose(axis0, axis1)),
            "swapdims_": _view_in_place("swapdims_", lambda self, dim0, dim1: self.transpose(dim0, dim1)),
        }
    )
    extra.update({n + "_": _in_place(n + "_", _same_method(n)) for n in IN_PLACE if n + "_" not in extra})
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


__all__ = [
    "ALIASES",
    "COMPOSED",
    "IN_PLACE",
    "METHODS",
    "NOT_METHODS",
    "Method",
    "MinMax",
    "install",
    "make_method",
    "unknown_keyword",
]
