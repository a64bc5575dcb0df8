"""The eager tape: autograd metadata in a side table, backward nodes, and the recording hook.

``opsnn.Tensor`` lives in the runtime layer and knows nothing of gradients; this module keeps
``requires_grad``/``grad``/``grad_fn`` per tensor in a table keyed by the tensor's id (entries
go when the tensor dies), gives ``Tensor`` its torch-style attributes when opsnn is imported,
and records one :class:`Node` per eager op call whose inputs require grad. The node holds the
op's record, inputs, outputs and attributes; its gradient is the record's gradient rule.
With no input requiring grad (or under ``no_grad``) nothing is recorded.
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, ParamInvalidError
from ..ops import executor as _executor
from ..ops.gradients import GradContext, unbroadcast
from ..tensor import VERSIONS, Tensor
from ..tensor import version as _version
from .errors import InplaceModifiedError, NoGradientError
from .mode import is_grad_enabled, no_grad

LEAF = object()  # edge kind: gradient accumulates into a leaf's .grad


class AutogradMeta:
    __slots__ = ("grad", "grad_fn", "grad_sink", "hooks", "output_nr", "post_hooks", "ref", "requires_grad")

    def __init__(self):
        self.ref = None
        self.requires_grad = False
        self.grad = None
        self.grad_fn = None
        self.output_nr = 0
        self.hooks = None  # a leaf's {key: fn(grad) -> None | grad}, called on its summed gradient of a pass
        self.post_hooks = None  # {key: fn} called once a backward pass has accumulated all of .grad
        # g -> the tensor .grad becomes when g is a leaf's only gradient of a pass and .grad is None
        # (instead of a copy of g): DistributedDataParallel writes it into its bucket, scaled
        self.grad_sink = None


_META: dict[int, AutogradMeta] = {}


def _forget(key: int, ref) -> None:
    m = _META.get(key)
    if m is not None and m.ref is ref:
        del _META[key]


def get_meta(t) -> AutogradMeta | None:
    return _META.get(id(t))


def _new_meta(t) -> AutogradMeta:
    key = id(t)
    m = _META.get(key)
    if m is None:
        m = AutogradMeta()
        m.ref = weakref.ref(t, lambda r, k=key: _forget(k, r))
        _META[key] = m
    return m


def requires_grad(t) -> bool:
    m = _META.get(id(t))
    return m is not None and m.requires_grad


def differentiable_dtype(dt) -> bool:
    return _dt.is_float(np.dtype(dt))


class Node:
    """One recorded op call: ``fn(grads)`` maps the gradients of its outputs to those of its
    inputs; ``edges[i]`` says where input ``i``'s gradient goes (None: nowhere)."""

    __slots__ = (
        "__weakref__",
        "edges",
        "fn",
        "freed",
        "hooks",
        "in_dtypes",
        "in_shapes",
        "name",
        "out_dtypes",
        "out_shapes",
        "retained",
    )

    def __init__(self, name: str, fn, edges: list, inputs: list, outputs: list):
        self.name = name
        self.fn = fn
        self.edges = edges
        self.in_shapes = [None if t is None else tuple(t.shape) for t in inputs]
        self.in_dtypes = [None if t is None else t.dtype for t in inputs]
        self.out_shapes = [tuple(o.shape) for o in outputs]
        self.out_dtypes = [o.dtype for o in outputs]
        self.freed = False
        # tensor hooks of the outputs: {output_nr: {key: fn(grad)}}, called on the output's summed
        # gradient before the node's rule runs (they outlive the tensor, as torch's do)
        self.hooks = None
        # {output_nr: AutogradMeta} of outputs that keep their gradient in .grad (retain_grad())
        self.retained = None

    def release(self) -> None:
        """Drop the saved tensors (after a backward without ``retain_graph``)."""
        self.fn = None
        self.freed = True

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"


def _edges(inputs: list, host: tuple = ()) -> list | None:
    edges, any_edge = [], False
    for i, t in enumerate(inputs):
        m = None if t is None or i in host else _META.get(id(t))
        if m is None or not m.requires_grad:
            edges.append(None)
            continue
        edges.append((LEAF, m) if m.grad_fn is None else (m.grad_fn, m.output_nr))
        any_edge = True
    return edges if any_edge else None


def _saved(t):
    """A second handle on an output's memory: the node must not hold the output object itself
    (its metadata points back at the node)."""
    return Tensor(t._array, t.format, t._producer)


def _attach(node: Node, outputs: list, differentiable: int) -> None:
    for k, o in enumerate(outputs[:differentiable]):
        if o is None or not differentiable_dtype(o.dtype):
            continue
        m = _new_meta(o)
        m.requires_grad = True
        m.grad_fn = node
        m.output_nr = k
        m.grad = None


def will_record(rec, tensors: list) -> bool:
    """Whether :func:`record_op` would record an eager call of ``rec`` on ``tensors`` (the executor
    then makes the outputs the op's gradient rule reads, such as MaxPool's Indices)."""
    tracer = _executor._tracer
    if not _META or (tracer is not None and not getattr(tracer, "records_tape", False)) or not is_grad_enabled():
        return False
    return _edges(tensors, rec.host_inputs) is not None


def record_op(rec, tensors: list, attrs: dict, res) -> None:
    """The executor's eager hook: record a node when grad mode is on and an input requires grad."""
    tracer = _executor._tracer
    if not _META or (tracer is not None and not getattr(tracer, "records_tape", False)) or not is_grad_enabled():
        return
    edges = _edges(tensors, rec.host_inputs)
    if edges is None:
        return
    outputs = list(res) if isinstance(res, tuple) else [res]
    bound = rec.bind_attrs(attrs or {})
    rule = rec.gradient
    saved_in = list(tensors)
    saved_out = [_saved(o) for o in outputs]
    versions = (_versions(saved_in), _versions(saved_out)) if VERSIONS else (None, None)
    if tracer is not None:  # a traced step: the rule's saved outputs are the graph's values, not constants
        for s, o in zip(saved_out, outputs):
            tracer.alias(s, o)
    needs = [e is not None for e in edges]
    if rule is None:
        names = [rec.input_spec(i).name for i, e in enumerate(edges) if e is not None]

        def fn(grads, op=rec.name, names=names):
            raise NoGradientError(
                f"{op}: no gradient rule is registered for this op, but its input(s) {names} "
                f"require grad (opsnn info --ops lists the ops that have one)",
                op=op,
            )

        differentiable = len(outputs)
    else:

        def fn(grads, op=rec.name):
            ins, outs = saved_in, saved_out
            if VERSIONS:  # something was written in place: check what the rule reads as it reads it
                ins, outs = _Checked(op, saved_in, versions[0]), _Checked(op, saved_out, versions[1])
            return rule(GradContext(op, ins, outs, bound, needs), grads)

        differentiable = getattr(rule, "outputs", 1)
    node = Node(rec.name, fn, edges, tensors, outputs)
    _attach(node, outputs, differentiable)
    if differentiable < len(outputs):
        _attach_non_differentiable(rec, edges, tensors, outputs, differentiable)


def _versions(tensors: list) -> list:
    return [None if t is None else _version(t) for t in tensors]


class _Checked(list):
    """The saved tensors as a gradient rule reads them: each one read is checked against its in-place
    write count when the op ran, so a tensor written in place since is an error, never a gradient
    computed from the new values (torch's version-counter check); tensors the rule does not read
    (BatchNormalization's running statistics in training) are not held against it."""

    def __init__(self, op: str, tensors: list, recorded):
        super().__init__(tensors)
        self.op, self.recorded = op, recorded

    def _checked(self, i: int, t):
        if t is not None:
            now, then = _version(t), 0 if self.recorded is None else self.recorded[i]
            if now != then:
                raise InplaceModifiedError(
                    f"{self.op}: a tensor of shape {tuple(t.shape)} that its gradient needs was modified in place "
                    f"after the op ran (version {then} -> {now}): write the new values into a new tensor "
                    "(x = x + y, not x.add_(y)), or clone() it first"
                )
        return t

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._checked(k, list.__getitem__(self, k)) for k in range(*i.indices(len(self)))]
        return self._checked(i % len(self) if i < 0 else i, list.__getitem__(self, i))

    def __iter__(self):
        return (self[k] for k in range(len(self)))


def _attach_non_differentiable(rec, edges, tensors, outputs, first: int) -> None:
    """Floating outputs the rule does not cover (LayerNormalization's Mean, a loss's log_prob ...):
    a gradient through them is an error naming the op and output, never a silent zero."""
    for k in range(first, len(outputs)):
        o = outputs[k]
        if o is None or not differentiable_dtype(o.dtype):
            continue
        name = rec.outputs[min(k, len(rec.outputs) - 1)].name

        def fn(grads, op=rec.name, k=k, name=name):
            raise NoGradientError(
                f"{op}: output {k} ({name!r}) is not differentiable (the gradient rule covers the first output only)",
                op=op,
            )

        node = Node(rec.name, fn, edges, tensors, [o])
        m = _new_meta(o)
        m.requires_grad, m.grad_fn, m.output_nr, m.grad = True, node, 0, None


def _record_view(name: str, src: Tensor, out: Tensor, backward) -> None:
    """Record a tensor view method (reshape, transpose, indexing ...) as a one-input node."""
    if out is src or _executor._tracer is not None or not is_grad_enabled():
        return
    edges = _edges([src])
    if edges is None:
        return
    node = Node(name, lambda grads: [backward(grads[0])], edges, [src], [out])
    _attach(node, [out], 1)


# -- Tensor attributes ---------------------------------------------------------------------------------------
def _get_requires_grad(self) -> bool:
    return requires_grad(self)


def _set_requires_grad(self, flag) -> None:
    m = _META.get(id(self))
    if m is not None and m.grad_fn is not None:
        if not flag:
            raise ParamInvalidError(
                "requires_grad: a tensor computed from tensors that require grad (a non-leaf) "
                "cannot be set to requires_grad=False; use t.detach()"
            )
        return
    if flag and not differentiable_dtype(self.dtype):
        raise DTypeError(f"requires_grad: only floating tensors can require grad, got {_dt.name(self.dtype)}")
    if m is None and not flag:
        return
    _new_meta(self).requires_grad = bool(flag)


def _requires_grad_(self, requires_grad: bool = True):
    _set_requires_grad(self, requires_grad)
    return self


def _get_grad(self):
    m = _META.get(id(self))
    return None if m is None else m.grad


def _set_grad(self, value) -> None:
    if value is not None:
        if not isinstance(value, Tensor):
            raise ParamInvalidError(f"grad: expected an opsnn Tensor or None, got {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape):
            from .errors import GradientShapeError

            raise GradientShapeError(f"grad: assigned gradient has shape {value.shape}, the tensor has {self.shape}")
    m = _META.get(id(self))
    if m is None:
        if value is None:
            return
        m = _new_meta(self)
    m.grad = value


def _grad_fn(self):
    m = _META.get(id(self))
    return None if m is None else m.grad_fn


def _is_leaf(self) -> bool:
    m = _META.get(id(self))
    return m is None or m.grad_fn is None


def _detach(self) -> Tensor:
    """The same memory as a new tensor outside the graph (requires_grad False)."""
    out = Tensor(self._array, self.format, self._producer)
    tracer = _executor._tracer
    if tracer is not None:  # traced: the same value of the graph, not a constant
        tracer.alias(out, self)
    return out


class RemovableHandle:
    """What ``register_hook`` / ``register_post_accumulate_grad_hook`` return: ``remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_key")

    def __init__(self, hooks: dict, key: int):
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


_hook_keys = iter(range(1 << 62))


def _register_post_accumulate_grad_hook(self, hook) -> RemovableHandle:
    """Call ``hook(tensor)`` after a backward pass has accumulated this leaf's gradient into
    ``.grad`` (once per pass, after its last contribution; leaves fire in the order the pass
    finishes them), like torch's ``Tensor.register_post_accumulate_grad_hook``. Returns a handle
    whose ``remove()`` unregisters it. ``autograd.grad`` (which leaves ``.grad`` alone) does not fire it.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([1.0, 2.0], np.float32)).requires_grad_()
    >>> h = x.register_post_accumulate_grad_hook(lambda t: print("ready", t.grad.numpy()))
    >>> opsnn.ops.sum(x * x).backward()
    ready [2. 4.]
    >>> h.remove()
    """
    if not callable(hook):
        raise ParamInvalidError(f"register_post_accumulate_grad_hook: hook must be callable, got {type(hook).__name__}")
    m = _META.get(id(self))
    if m is None or not m.requires_grad or m.grad_fn is not None:
        raise ParamInvalidError(
            "register_post_accumulate_grad_hook: only a leaf tensor that requires grad accumulates a "
            f"gradient; this one (shape {tuple(self.shape)}) "
            + ("is not a leaf" if m is not None and m.grad_fn is not None else "does not require grad")
        )
    if m.post_hooks is None:
        m.post_hooks = {}
    key = next(_hook_keys)
    m.post_hooks[key] = hook
    return RemovableHandle(m.post_hooks, key)


def _grad_meta(self, what: str) -> AutogradMeta:
    m = _META.get(id(self))
    if m is None or not m.requires_grad:
        raise ParamInvalidError(
            f"{what}: this tensor (shape {tuple(self.shape)}) does not require grad, so no gradient reaches it; "
            "call requires_grad_() on the leaf it is computed from first"
        )
    return m


def _register_hook(self, hook) -> RemovableHandle:
    """Call ``hook(grad)`` each time a backward pass computes this tensor's gradient (the sum of all
    its uses in that pass), as torch's ``Tensor.register_hook``: returning a tensor of the same shape
    and dtype replaces the gradient from there on (what flows into the graph below, or into a leaf's
    ``.grad``); returning None keeps it. Several hooks run in the order registered; on a leaf and on a
    computed tensor; in ``autograd.grad`` too. Returns a handle whose ``remove()`` unregisters it.
    Inside a compiled training step a hook is refused at tracing (a compiled call would not run it).

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([1.0, 2.0], np.float32)).requires_grad_()
    >>> h = x.register_hook(lambda g: g * 10)
    >>> opsnn.ops.sum(x * x).backward()
    >>> x.grad.numpy()
    array([20., 40.], dtype=float32)
    >>> h.remove()
    """
    if not callable(hook):
        raise ParamInvalidError(f"register_hook: hook must be callable, got {type(hook).__name__}")
    m = _grad_meta(self, "register_hook")
    if m.grad_fn is None:
        if m.hooks is None:
            m.hooks = {}
        hooks = m.hooks
    else:
        node = m.grad_fn
        if node.hooks is None:
            node.hooks = {}
        hooks = node.hooks.setdefault(m.output_nr, {})
    key = next(_hook_keys)
    hooks[key] = hook
    return RemovableHandle(hooks, key)


def _retain_grad(self) -> None:
    """Keep this computed tensor's gradient in ``.grad`` after backward (accumulating over passes, after
    its hooks ran), as torch's ``retain_grad()``; a leaf keeps its gradient anyway (no-op)."""
    m = _grad_meta(self, "retain_grad")
    if m.grad_fn is None:
        return
    node = m.grad_fn
    if node.retained is None:
        node.retained = {}
    node.retained[m.output_nr] = m


def _retains_grad(self) -> bool:
    m = _META.get(id(self))
    return bool(
        m is not None
        and m.grad_fn is not None
        and m.grad_fn.retained is not None
        and m.grad_fn.retained.get(m.output_nr) is m
    )


def _detach_(self):
    """Make this tensor a leaf that does not require grad, in place (torch's ``detach_()``): later ops on
    it record nothing; the graph that made it is no longer reachable through it."""
    m = _META.get(id(self))
    if m is not None:
        if m.grad_fn is not None and m.grad_fn.retained is not None and m.grad_fn.retained.get(m.output_nr) is m:
            del m.grad_fn.retained[m.output_nr]
        m.grad_fn, m.output_nr, m.requires_grad = None, 0, False
    return self


def _backward(self, gradient=None, retain_graph=None, create_graph: bool = False, inputs=None) -> None:
    from .engine import backward

    backward(
        [self],
        None if gradient is None else [gradient],
        retain_graph=retain_graph,
        create_graph=create_graph,
        inputs=inputs,
    )


def _view_backward_reshape(src_shape):
    # a view of the gradient where its layout allows, as the forward was (the Reshape op copies)
    return lambda g: g.reshape(src_shape)


def _index_backward(src: Tensor, index):
    from ..ops.gradients import _scatter_into

    shape = tuple(src.shape)
    if isinstance(index, Tensor):
        index = index.numpy()
    pos = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[index]
    advanced = isinstance(index, (np.ndarray, list)) or (
        isinstance(index, tuple) and any(isinstance(i, (list, np.ndarray)) for i in index)
    )
    return lambda g: _scatter_into(np.asarray(pos), g, shape, add=advanced)


def _inverse_perm(src: Tensor, out: Tensor):
    """The permutation taking ``out``'s dims back to ``src``'s, for a view that only permutes
    dims (matched by size and stride), or None when that cannot be told."""
    sa, oa = src._array, out._array
    if sa.ndim != oa.ndim:
        return None
    used, perm = set(), []
    for size, stride in zip(sa.shape, sa.strides):
        k = next((j for j in range(oa.ndim) if j not in used and oa.shape[j] == size and oa.strides[j] == stride), None)
        if k is None:
            return None
        used.add(k)
        perm.append(k)
    return perm


def _wrap_views() -> None:
    """Tensor's zero-copy view methods bypass the ops; give them gradients here."""
    orig = {
        n: getattr(Tensor, n)
        for n in (
            "view",
            "reshape",
            "flatten",
            "transpose",
            "permute",
            "expand",
            "squeeze",
            "unsqueeze",
            "__getitem__",
            "contiguous",
            "clone",
        )
    }
    orig_T = Tensor.T

    def shape_kept(name):
        f = orig[name]

        def method(self, *args, **kwargs):
            out = f(self, *args, **kwargs)
            if _META:
                _record_view(name, self, out, _view_backward_reshape(tuple(self.shape)))
            return out

        method.__name__, method.__doc__ = f.__name__, f.__doc__
        return method

    for n in ("view", "reshape", "flatten", "squeeze", "unsqueeze"):
        setattr(Tensor, n, shape_kept(n))

    def transpose(self, *args, **kwargs):
        out = orig["transpose"](self, *args, **kwargs)
        if _META and requires_grad(self):
            src_shape = tuple(self.shape)
            # the inverse of a swap of two dims is the same swap; read it off the two shapes' strides
            inv = _inverse_perm(self, out)
            _record_view(
                "transpose",
                self,
                out,
                (lambda g: g.permute(*inv)) if inv is not None else _view_backward_reshape(src_shape),
            )
        return out

    def permute(self, *dims):
        out = orig["permute"](self, *dims)
        if _META:
            p = [d % self.ndim for d in (dims[0] if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else dims)]
            inv = list(np.argsort(p))
            _record_view("permute", self, out, lambda g: g.permute(*inv))
        return out

    def T(self):
        out = orig_T.fget(self)
        if _META:
            _record_view("T", self, out, lambda g: g.T)
        return out

    def expand(self, *shape):
        out = orig["expand"](self, *shape)
        if _META:
            src_shape = tuple(self.shape)
            _record_view("expand", self, out, lambda g: unbroadcast(g, src_shape))
        return out

    def getitem(self, index):
        out = orig["__getitem__"](self, index)
        if _META and requires_grad(self):
            _record_view("index", self, out, _index_backward(self, index))
        return out

    def copy_like(name):
        f = orig[name]

        def method(self):
            out = f(self)
            if _META:
                _record_view(name, self, out, lambda g: g)
            return out

        method.__name__, method.__doc__ = f.__name__, f.__doc__
        return method

    for n, fn in (("transpose", transpose), ("permute", permute), ("expand", expand), ("__getitem__", getitem)):
        fn.__doc__ = orig[n].__doc__
        setattr(Tensor, n, fn)
    Tensor.T = property(T, doc=orig_T.__doc__)
    Tensor.contiguous = copy_like("contiguous")
    Tensor.clone = copy_like("clone")


_installed = [False]


def install() -> None:
    """Give ``Tensor`` its autograd attributes and hook eager op calls (once)."""
    if _installed[0]:
        return
    _installed[0] = True
    Tensor.requires_grad = property(
        _get_requires_grad, _set_requires_grad, doc="Whether gradients are computed for this tensor (torch semantics)."
    )
    Tensor.requires_grad_ = _requires_grad_
    Tensor.grad = property(_get_grad, _set_grad, doc="The accumulated gradient (a Tensor) or None.")
    Tensor.grad_fn = property(_grad_fn, doc="The backward node that made this tensor, or None for a leaf.")
    Tensor.is_leaf = property(_is_leaf, doc="True unless the tensor was computed from tensors that require grad.")
    Tensor.detach = _detach
    Tensor.detach_ = _detach_
    Tensor.register_hook = _register_hook
    Tensor.retain_grad = _retain_grad
    Tensor.retains_grad = property(_retains_grad, doc="Whether retain_grad() keeps this non-leaf's gradient.")
    Tensor.backward = _backward
    Tensor.register_post_accumulate_grad_hook = _register_post_accumulate_grad_hook
    _wrap_views()
    _executor._autograd = record_op
    _executor._autograd_will_record = will_record
    _executor._autograd_grad_enabled = is_grad_enabled


__all__ = [
    "LEAF",
    "AutogradMeta",
    "Node",
    "RemovableHandle",
    "get_meta",
    "install",
    "no_grad",
    "record_op",
    "requires_grad",
]
