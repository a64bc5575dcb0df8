"""The op registry: one declarative record per operator, and its kernels.

A record holds the op's schema (inputs, outputs, attributes with defaults), its
shape+dtype inference, its numpy reference implementation and its kernels. Eager
mode, the two-phase API, the graph engine and the ONNX importer all read it. The
library registers its own ops with exactly these public functions::

    >>> import opsnn, numpy as np
    >>> rec = opsnn.register_op(
    ...     "Twice", inputs=["X"], outputs=["Y"],
    ...     infer=lambda ctx: [ctx.inputs[0]],
    ...     reference=lambda ins, attrs: ins[0] * 2)
    >>> @rec.kernel("twice_numpy", priority=1)
    ... def _twice(ins, outs, attrs, plan, ws):
    ...     np.multiply(ins[0], 2, out=outs[0])
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, InferShapeError, KernelNotFoundError, ParamInvalidError, ParamNullptrError
from . import autotune as _autotune
from . import tiering as _tiering

REQUIRED = object()  # default marker: the attribute must be given


class TensorMeta(NamedTuple):
    """Shape and dtype of a value (dims may later be symbolic in the graph engine)."""

    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class Input:
    """An op input. ``host=True``: its *value* is read at prepare time (shapes, axes...)
    and is part of the executor's signature. ``dtypes=None`` accepts any dtype."""

    name: str
    dtypes: tuple | None = None
    optional: bool = False
    variadic: bool = False
    host: bool = False


@dataclass(frozen=True)
class Output:
    name: str
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Attr:
    """An attribute; ``kind`` is one of int, float, string, ints, floats, strings, tensor,
    dtype, graph, any."""

    name: str
    kind: str = "any"
    default: Any = REQUIRED
    doc: str = ""


def _as_input(x) -> Input:
    return Input(x) if isinstance(x, str) else x


def _as_output(x) -> Output:
    return Output(x) if isinstance(x, str) else x


def _as_attr(x) -> Attr:
    if isinstance(x, Attr):
        return x
    if isinstance(x, tuple):
        return Attr(*x)
    return Attr(x)


class InferContext:
    """What shape inference, kernel predicates and planners see."""

    __slots__ = ("op", "inputs", "attrs", "values", "num_outputs", "outputs", "device")

    def __init__(self, op: OpRecord, inputs: list, attrs: dict, values: list, num_outputs: int, device: str = "cpu"):
        self.op = op
        self.inputs: list[TensorMeta | None] = inputs
        self.attrs = attrs
        self.values = values
        self.num_outputs = num_outputs
        self.outputs: list[TensorMeta] | None = None
        self.device = device

    def shape(self, i: int) -> tuple:
        return self.inputs[i].shape

    def dtype(self, i: int) -> np.dtype:
        return self.inputs[i].dtype

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def value(self, i: int):
        """The value of input ``i`` when known at prepare time (host inputs, constants)."""
        return self.values[i] if i < len(self.values) else None

    def fail(self, message: str) -> None:
        raise InferShapeError(f"{self.op.name}: {message}", op=self.op.name)


@dataclass
class Kernel:
    """One implementation of an op.

    ``fn(ins, outs, attrs, plan, workspace)`` writes into ``outs`` (numpy arrays of the
    inferred shapes; for ops whose output shape depends on data, ``outs`` is None and
    ``fn`` returns the arrays). ``applies(ctx)`` returns True/None, or a string saying why
    not. ``plan(ctx)`` runs once at prepare time (tiling, algorithm, packed weights);
    ``workspace(ctx, plan)`` gives the scratch bytes ``fn`` needs.
    ``dtypes``: the input dtypes ``fn`` handles natively; 16-bit floats outside it run
    through an fp32 adapter (compute fp32, store 16-bit). ``strided``: ``fn`` accepts
    non-contiguous inputs (else the executor makes them contiguous first).
    ``bind(ins, outs, attrs, plan, workspace)``, optional: a zero-argument callable doing what
    ``fn`` does on exactly these arrays, its per-call setup done once (a oneDNN primitive's
    argument addresses, reshaped views): a compiled graph's steps run on fixed arena buffers,
    so their tasks are bound once per plan.
    ``nonfinite``: how a kernel whose algorithm does not keep the op definition's Inf and NaN
    semantics by itself (a transform that mixes neighbouring values) still gives them, or
    where it does not; empty for kernels that compute the definition's sums and products
    directly. ``explain`` shows it.
    ``in_place``: (output, input) index pairs the kernel computes correctly with that output in that
    input's memory; a compiled graph's memory plan gives the output the input's buffer where the step
    is the input's last reader (elementwise and activation ops need no declaration).
    """

    name: str
    op: str
    fn: Callable
    backend: str = "cpu"
    dtypes: tuple | None = None
    priority: int = 0
    applies: Callable | None = None
    plan: Callable | None = None
    workspace: Callable | None = None
    strided: bool = False
    fallback: bool = False
    doc: str = ""
    bind: Callable | None = None
    nonfinite: str = ""
    #: a library kernel (or several, the first that applies) standing in while this one compiles
    cold_alternative: str | tuple = ""
    in_place: tuple = ()

    def check(self, ctx: InferContext) -> str | None:
        """None when this kernel can run ``ctx``, else the reason it cannot."""
        if self.backend != ctx.device:
            return f"backend {self.backend} != device {ctx.device}"
        if self.dtypes is not None and ctx.inputs and ctx.inputs[0] is not None:
            dt = ctx.inputs[0].dtype
            if dt not in self.dtypes and not (_dt.is_low_precision(dt) and _dt.float32 in self.dtypes):
                return f"dtype {_dt.name(dt)} not in {[_dt.name(d) for d in self.dtypes]}"
        if self.applies is not None:
            ok = self.applies(ctx)
            if ok is False:
                return "predicate rejected the shapes/attributes"
            if isinstance(ok, str):
                return ok
        return None

    def needs_adapter(self, ctx: InferContext) -> bool:
        if self.dtypes is None or not ctx.inputs or ctx.inputs[0] is None:
            return False
        dt = ctx.inputs[0].dtype
        return dt not in self.dtypes and _dt.is_low_precision(dt)


@dataclass
class OpRecord:
    """Everything opsnn knows about one operator (named by its ONNX op type)."""

    name: str
    inputs: Sequence[Input]
    outputs: Sequence[Output]
    attrs: Sequence[Attr] = ()
    infer: Callable | None = None
    reference: Callable | None = None
    category: str = "misc"
    domain: str = ""
    doc: str = ""
    dynamic_shape: bool = False
    flops: Callable | None = None  # flops(ctx) -> int, for the profiler's GFLOP/s
    output_count: Callable | None = None  # output_count(host values, attrs) -> int for variadic outputs
    kernels: list[Kernel] = field(default_factory=list)
    #: gradient(ctx, grads) -> one gradient (or None) per input, written with registry ops (see ops/gradients.py)
    gradient: Callable | None = None

    def __post_init__(self):
        self.inputs = tuple(_as_input(i) for i in self.inputs)
        self.outputs = tuple(_as_output(o) for o in self.outputs)
        self.attrs = tuple(_as_attr(a) for a in self.attrs)
        self._attr_index = {a.name: a for a in self.attrs}
        self._defaults = {a.name: a.default for a in self.attrs if a.default is not REQUIRED}
        self.host_inputs = tuple(i for i, spec in enumerate(self.inputs) if spec.host)

    # -- kernel registration -----------------------------------------------------------
    def kernel(self, name: str, **options) -> Callable:
        """Decorator: register ``fn`` as a kernel of this op (see :class:`Kernel`)."""

        def deco(fn):
            self.add_kernel(Kernel(name=name, op=self.name, fn=fn, **options))
            return fn

        return deco

    def add_kernel(self, kernel: Kernel) -> Kernel:
        if any(k.name == kernel.name and k.backend == kernel.backend for k in self.kernels):
            raise ParamInvalidError(f"{self.name}: a kernel named {kernel.name!r} is already registered")
        self.kernels.append(kernel)
        self.kernels.sort(key=lambda k: -k.priority)
        _bump_version()
        return kernel

    # -- validation ----------------------------------------------------------------------
    def input_spec(self, i: int) -> Input:
        if i < len(self.inputs):
            return self.inputs[i]
        if self.inputs and self.inputs[-1].variadic:
            return self.inputs[-1]
        raise ParamInvalidError(f"{self.name}: takes at most {len(self.inputs)} inputs, got {i + 1}", op=self.name)

    def bind_attrs(self, attrs: dict) -> dict:
        """Fill defaults and reject unknown or missing attributes with a pointed message."""
        for key in attrs:
            if key not in self._attr_index:
                near = difflib.get_close_matches(key, list(self._attr_index), n=1)
                hint = (
                    f"; did you mean {near[0]!r}?"
                    if near
                    else f"; it takes {sorted(self._attr_index) or 'no attributes'}"
                )
                raise ParamInvalidError(f"{self.name}: unknown attribute {key!r}{hint}", op=self.name)
        if len(attrs) == len(self._attr_index):
            return dict(attrs)
        full = dict(self._defaults)
        full.update(attrs)
        for a in self.attrs:
            if a.name not in full:
                raise ParamNullptrError(f"{self.name}: missing required attribute {a.name!r}", op=self.name)
        return full

    def check_inputs(self, metas: list) -> None:
        n_fixed = sum(1 for s in self.inputs if not s.optional and not s.variadic)
        if len(metas) < n_fixed or (len(metas) > len(self.inputs) and not (self.inputs and self.inputs[-1].variadic)):
            names = [s.name for s in self.inputs]
            raise ParamInvalidError(
                f"{self.name}: expected {n_fixed}..{len(names)} inputs {names}, got {len(metas)}", op=self.name
            )
        for i, meta in enumerate(metas):
            spec = self.input_spec(i)
            if meta is None:
                if not spec.optional:
                    raise ParamNullptrError(
                        f"{self.name}: input {i} ({spec.name!r}) is required but got None", op=self.name
                    )
                continue
            if spec.dtypes is not None and meta.dtype not in spec.dtypes:
                allowed = ", ".join(_dt.name(d) for d in spec.dtypes)
                raise DTypeError(
                    f"{self.name}: input {spec.name!r} has dtype {_dt.name(meta.dtype)}; expected one of {allowed}",
                    op=self.name,
                )

    def run_infer(self, ctx: InferContext) -> list[TensorMeta]:
        if self.infer is None:
            raise InferShapeError(f"{self.name}: no shape inference registered", op=self.name)
        outs = self.infer(ctx)
        outs = list(outs)[: ctx.num_outputs] if outs is not None else []
        for o in outs:
            if o is not None and any(isinstance(d, (int, np.integer)) and d < 0 for d in o.shape):
                ctx.fail(f"inferred a negative output dim {o.shape}")
        ctx.outputs = outs
        return outs


# -- the registry -----------------------------------------------------------------------------
_lock = threading.Lock()
REGISTRY: dict[tuple[str, str], OpRecord] = {}
_version = [0]


def _bump_version() -> None:
    _version[0] += 1


def version() -> int:
    """Changes whenever ops or kernels are registered (executor caches key on it)."""
    return _version[0]


def register_op(
    name: str,
    *,
    inputs,
    outputs,
    attrs=(),
    infer=None,
    reference=None,
    category="misc",
    domain: str = "",
    doc: str = "",
    dynamic_shape: bool = False,
    flops=None,
    replace: bool = False,
) -> OpRecord:
    """Register an operator record (the same call the library uses for its own ops).

    ``infer(ctx) -> [TensorMeta]`` and ``reference(ins, attrs) -> array | tuple`` are
    required; ``flops(ctx) -> int`` (optional) feeds the profiler's GFLOP/s; a kernel of last resort that runs ``reference`` is added automatically,
    and the profiler and ``explain`` show when it runs.
    """
    if infer is None or reference is None:
        raise ParamInvalidError(f"register_op({name!r}): both infer= and reference= are required")
    rec = OpRecord(
        name=name,
        inputs=inputs,
        outputs=outputs,
        attrs=attrs,
        infer=infer,
        reference=reference,
        category=category,
        domain=domain,
        doc=doc,
        dynamic_shape=dynamic_shape,
        flops=flops,
    )
    with _lock:
        if (domain, name) in REGISTRY and not replace:
            raise ParamInvalidError(
                f"register_op: op {name!r} (domain {domain!r}) is already registered; pass replace=True to override it"
            )
        REGISTRY[(domain, name)] = rec
    rec.add_kernel(
        Kernel(
            name="reference",
            op=name,
            fn=_reference_kernel(rec),
            priority=-1000,
            strided=True,
            fallback=True,
            doc="numpy reference implementation (slow; last resort)",
        )
    )
    return rec


def register_kernel(op: str, name: str, fn: Callable | None = None, *, domain: str = "", **options):
    """Register a kernel for an existing op; usable as a decorator when ``fn`` is omitted."""
    rec = get_op(op, domain)
    if fn is None:
        return rec.kernel(name, **options)
    return rec.add_kernel(Kernel(name=name, op=rec.name, fn=fn, **options))


def get_op(name: str, domain: str = "") -> OpRecord:
    rec = REGISTRY.get((domain, name))
    if rec is None:
        pool = [n for (d, n) in REGISTRY if d == domain]
        near = difflib.get_close_matches(name, pool, n=3)
        hint = f"; nearest: {', '.join(near)}" if near else ""
        where = f" in domain {domain!r}" if domain else ""
        raise KernelNotFoundError(f"unknown op {name!r}{where}{hint}")
    return rec


def has_op(name: str, domain: str = "") -> bool:
    return (domain, name) in REGISTRY


def all_ops() -> list[OpRecord]:
    return sorted(REGISTRY.values(), key=lambda r: (r.domain, r.name))


def _reference_kernel(rec: OpRecord) -> Callable:
    def run_reference(ins, outs, attrs, plan, ws):
        res = rec.reference(ins, attrs)
        if not isinstance(res, (tuple, list)):
            res = (res,)
        if outs is None:
            return [np.asarray(r) for r in res]
        for o, r in zip(outs, res):
            r = np.asarray(r)
            if r.shape != o.shape:
                raise InferShapeError(
                    f"{rec.name}: reference produced shape {r.shape}, inference said {o.shape}", op=rec.name
                )
            np.copyto(o, r, casting="unsafe")
        return None

    return run_reference


# -- kernel selection -----------------------------------------------------------------------------
_selector_tls = threading.local()


def _selector_stack() -> list:
    st = getattr(_selector_tls, "stack", None)
    if st is None:
        st = _selector_tls.stack = []
    return st


def forced_kernel(op: str) -> str | None:
    for mapping in reversed(_selector_stack()):
        if op in mapping:
            return mapping[op]
        if "*" in mapping:
            return mapping["*"]
    return None


def selector_key() -> tuple:
    st = getattr(_selector_tls, "stack", None)
    return tuple(tuple(sorted(m.items())) for m in st) if st else ()


class kernel_selector:
    """Force kernels by op type: ``with opsnn.kernel_selector(Conv="im2col"): ...``
    (``"*"`` applies to every op, e.g. ``kernel_selector({"*": "reference"})``)."""

    def __init__(self, mapping: dict | None = None, **by_op: str):
        self.mapping = dict(mapping or {}, **by_op)
        for op, name in self.mapping.items():
            if op == "*":
                continue
            # by op type in any domain, as selection matches it: the fusions' ops (FusedMatMul ...) too
            recs = [r for (_, n), r in REGISTRY.items() if n == op] or [get_op(op)]
            if not any(k.name == name for r in recs for k in r.kernels):
                names = [k.name for r in recs for k in r.kernels]
                raise KernelNotFoundError(f"kernel_selector: op {op!r} has no kernel {name!r}; kernels: {names}")

    def __enter__(self):
        _selector_stack().append(self.mapping)
        return self

    def __exit__(self, *exc):
        _selector_stack().pop()


@dataclass
class Selection:
    kernel: Kernel
    reason: str
    rejected: list[tuple[str, str]]
    adapter: bool
    tiered: str = ""  # the numba kernel this (library) kernel stands in for while it compiles
    tiered_key: str = ""  # ... and its workload's key in the background compile (tiering.pending)


def select_kernel(rec: OpRecord, ctx: InferContext, algo: str | None = None) -> Selection:
    """Pick the highest-priority applicable kernel (or the forced one) and say why."""
    forced = algo or forced_kernel(rec.name)
    if forced is None and _autotune.active():
        tuned = _autotune.select(rec, ctx)
        if tuned is not None:
            return tuned
    rejected: list[tuple[str, str]] = []
    for k in rec.kernels:
        if forced is not None and k.name != forced:
            continue
        why = k.check(ctx)
        if forced is not None and isinstance(why, _autotune.NotPreferred):
            why = None  # correct for these shapes, only expected to be slower: the user asked for it
        if why is None:
            reason = (
                f"forced ({'algo=' if algo else 'kernel_selector: '}{forced})"
                if forced
                else f"highest-priority applicable kernel (priority {k.priority})"
            )
            if rejected:
                reason += "; skipped " + ", ".join(f"{n} ({w})" for n, w in rejected)
            # a kernel run through the fp32 adapter is compiled for float32, not for this workload's dtype
            if forced is None and k.cold_alternative and not k.needs_adapter(ctx):
                cold = _tiering.cold_kernel(rec, ctx, k)
                if cold is not None:
                    alt, why, key = cold
                    reason = f"tiered: {why}; {alt.name} runs until it is cached (OPSNN_TIERED=0 compiles it now)"
                    return Selection(alt, reason, [*rejected, (k.name, why)], alt.needs_adapter(ctx), k.name, key)
            return Selection(k, reason, rejected, k.needs_adapter(ctx))
        rejected.append((k.name, why))
    if forced is not None:
        names = [k.name for k in rec.kernels]
        if not any(k.name == forced for k in rec.kernels):
            raise KernelNotFoundError(f"{rec.name}: no kernel named {forced!r}; kernels: {names}", op=rec.name)
        raise KernelNotFoundError(
            f"{rec.name}: forced kernel {forced!r} does not apply: {rejected[-1][1]}", op=rec.name
        )
    raise KernelNotFoundError(
        f"{rec.name}: no kernel applies: " + "; ".join(f"{n}: {w}" for n, w in rejected), op=rec.name
    )
