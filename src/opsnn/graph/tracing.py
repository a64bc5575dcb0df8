"""Tracing: record eager op calls into a :class:`Graph` (``opsnn.compile(fn, example_inputs)``).

Tensors created outside the traced function (weights) become initializers; the function's
arguments become graph inputs, with ``dynamic_dims`` naming the dims that may change::

    g = trace(lambda x: opsnn.ops.relu(x), [x], dynamic_dims={0: {0: "batch"}})

A :class:`StateTracer` records a training step: tensors the step trains or writes in place
(parameters, optimizer state, running statistics) become *state* inputs rather than constants,
in-place updates become nodes whose outputs are bound back onto their targets, and a host read of
a value computed from the inputs (``loss.item()``, Python control flow on a tensor) is a
:class:`TraceError`, because the graph would replay that one value.
"""

from __future__ import annotations

import inspect
import sys
import weakref

import numpy as np

from ..errors import ParamInvalidError
from ..ops import executor as _ex
from ..tensor import Tensor, as_tensor
from .ir import Graph, Node, Value

_tensor_mod = sys.modules[Tensor.__module__]  # (``opsnn.tensor`` the name is the factory function)


def _forget_in(tracer_ref, i: int) -> None:
    tracer = tracer_ref()
    if tracer is not None:
        tracer._forget(i)


class Tracer:
    def __init__(self):
        self.names: dict = {}  # id of a live tensor seen -> its value name
        self.metas: dict = {}  # value name -> (dtype, shape) of the tensor it was first given to
        self.nodes: list[Node] = []
        self.initializers: dict = {}
        self._n = 0
        self._consts = 0

    def track(self, t: Tensor, name: str) -> None:
        """Give ``t`` the value name ``name``. The tracer holds it weakly: an intermediate the step drops is
        freed as in an eager run (the trace's peak stays the eager step's), and its id, which a new tensor
        may then reuse, is forgotten as it dies."""
        i = id(t)
        if i not in self.names:  # the callback holds the tracer weakly: it holds tensors (state) itself
            weakref.finalize(t, _forget_in, weakref.ref(self), i)
        self.names[i] = name
        self.metas.setdefault(name, (t.dtype, tuple(t.shape)))

    def _forget(self, i: int) -> None:
        self.names.pop(i, None)

    def name_of(self, t: Tensor) -> str:
        name = self.names.get(id(t))
        if name is None:  # a tensor from outside the function: a constant of the graph
            name = f"const_{self._consts}"
            self._consts += 1
            self.initializers[name] = np.array(t.numpy())
            self.track(t, name)
        return name

    def alias(self, new: Tensor, old: Tensor) -> None:
        """``new`` is another handle on ``old``'s memory (a detached tensor, a tensor autograd saved):
        the same value of the graph, not a constant."""
        name = self.names.get(id(old))
        if name is not None and id(new) not in self.names:
            self.track(new, name)

    def record(self, rec, tensors, attrs, num_outputs, result) -> None:
        ins = [self.name_of(t) if t is not None else "" for t in tensors]
        outs = result if isinstance(result, tuple) else (result,)
        names = []
        for t in outs:
            self._n += 1
            name = f"{rec.name.lower()}_{self._n}"
            self.track(t, name)
            names.append(name)
        self.nodes.append(Node(rec.name, ins, names, dict(attrs), domain=rec.domain))


class TraceError(ParamInvalidError):
    """A function cannot be traced into a graph that replays it faithfully; the message names why
    (a host read of a computed value, a host-drawn random mask, gradients accumulated across calls)."""


def active_tracer():
    """The tracer recording op calls now, or None."""
    return _ex._tracer


#: ops whose outputs depend on their input's shape only, never on its values
_SHAPE_ONLY = {"Shape", "Size"}


class StateTracer(Tracer):
    """The tracer of a training step (see the module docstring). ``state_of(t)`` says whether an
    external tensor is state (parameters are); ``label_of(t)`` may name it."""

    records_tape = True  # the autograd tape records while this tracer runs (backward is traced too)

    def __init__(self, state_of=None, label_of=None):
        super().__init__()
        self.state: dict = {}  # state input name -> tensor (at trace time)
        self.getters: dict = {}  # state input name -> callable giving the tensor to feed at each call
        self.host_inputs: dict = {}  # input name -> callable giving its value at each call
        self.tainted: set = set()  # ids of tensors whose values depend on the inputs or the state
        self.made_by: dict = {}  # value name -> op that made it (for error messages)
        self.events: set = set()  # "backward", "update": what the step did
        self._memory: dict = {}  # data address of live traced tensors' memory -> [value name, tensors on it]
        self._ptr: dict = {}  # id of a traced tensor -> the data address it counts in _memory
        self._state_of = state_of or (lambda t: False)
        self._label_of = label_of or (lambda t: None)

    # -- naming ----------------------------------------------------------------------------------
    def name_of(self, t: Tensor) -> str:
        name = self.names.get(id(t))
        if name is not None:
            return name
        if self._state_of(t):
            return self.make_state(t)
        ptr = _root_ptr(t)
        owner = None if ptr is None else self._memory.get(ptr, (None,))[0]
        if owner is not None:
            raise TraceError(
                f"trace: a tensor of shape {tuple(t.shape)} that the trace did not see made shares memory "
                f"with the traced value {owner!r}; it would become a constant of the graph (a view taken "
                "outside opsnn's ops, or a handle made from ._array?)"
            )
        label = self._label_of(t)
        if label and label not in self.initializers and label not in self.state:
            self.initializers[label] = np.array(t.numpy())
            self.track(t, label)
            return label
        return super().name_of(t)

    def make_state(self, t: Tensor, label: str | None = None, getter=None) -> str:
        """Name ``t`` as a state input (fed at every call, never folded); returns the name."""
        name = self.names.get(id(t))
        if name is not None:
            if name in self.initializers:  # read earlier as a constant, written now: an input after all
                del self.initializers[name]
                self.state[name] = t
                self.getters[name] = getter or (lambda t=t: t)
                self.taint(t, name)
            return name
        base = label or self._label_of(t) or f"state_{len(self.state)}"
        name, k = base, 1
        while name in self.state or name in self.host_inputs:
            k += 1
            name = f"{base}_{k}"
        self.track(t, name)
        self.state[name] = t
        self.getters[name] = getter or (lambda t=t: t)
        self.taint(t, name)
        return name

    def label(self, t: Tensor) -> str:
        """The name ``t`` has (or would have) in the graph, for naming tensors derived from it."""
        return self.names.get(id(t)) or self._label_of(t) or f"value_{id(t)}"

    def add_input(self, t: Tensor, name: str, fn) -> str:
        """Make ``t`` a graph input whose value ``fn()`` computes before every call (hyper-parameters)."""
        base, k = name, 1
        while name in self.host_inputs or name in self.state:
            k += 1
            name = f"{base}_{k}"
        self.track(t, name)
        self.host_inputs[name] = fn
        self.taint(t, name)
        return name

    def alias(self, new: Tensor, old: Tensor) -> None:
        super().alias(new, old)
        if id(old) in self.tainted:
            self.tainted.add(id(new))  # (the same memory: already registered)

    def taint(self, t: Tensor, name: str) -> None:
        """Mark ``t`` a value of the graph (computed from inputs or state); ``t`` is tracked already."""
        i = id(t)
        self.tainted.add(i)
        ptr = _root_ptr(t)
        if ptr is not None and i not in self._ptr:
            self._ptr[i] = ptr
            self._memory.setdefault(ptr, [name, 0])[1] += 1

    def _forget(self, i: int) -> None:
        super()._forget(i)
        self.tainted.discard(i)
        ptr = self._ptr.pop(i, None)
        if ptr is not None:
            owner = self._memory[ptr]
            owner[1] -= 1
            if not owner[1]:  # no live traced tensor on that memory: the pool may hand it out again
                del self._memory[ptr]

    def is_traced(self, t: Tensor) -> bool:
        """Whether ``t`` is a value of the graph (an input, state or computed), not a constant."""
        return id(t) in self.tainted

    # -- recording -------------------------------------------------------------------------------
    def record(self, rec, tensors, attrs, num_outputs, result) -> None:
        super().record(rec, tensors, attrs, num_outputs, result)
        outs = result if isinstance(result, tuple) else (result,)
        node = self.nodes[-1]
        for name in node.outputs:
            self.made_by[name] = rec.name
        if rec.name not in _SHAPE_ONLY and any(t is not None and id(t) in self.tainted for t in tensors):
            for t, name in zip(outs, node.outputs):
                self.taint(t, name)

    def call_inplace(self, rec, inputs: list, attrs: dict, outs: list, labels=None, getters=None):
        """Run ``rec`` eagerly with its outputs written into ``outs`` (the new values of state
        tensors) and record the node; later reads of ``outs`` see the node's outputs. ``labels`` /
        ``getters`` name and feed those of ``outs`` that are not state yet."""
        for k, t in enumerate(outs):
            if id(t) not in self.names or self.names[id(t)] in self.initializers:
                self.make_state(t, (labels or [None] * len(outs))[k], (getters or [None] * len(outs))[k])
        tensors = [None if x is None else as_tensor(x) for x in inputs]
        in_names = [self.name_of(t) if t is not None else "" for t in tensors]
        ex = _ex.prepare(rec, tensors, attrs, out=list(outs), num_outputs=len(outs))
        ex.run()
        out_names = []
        for t in outs:
            self._n += 1
            name = f"{self.names[id(t)]}.{rec.name.lower()}_{self._n}"
            self.track(t, name)
            self.made_by[name] = rec.name
            self.taint(t, name)
            out_names.append(name)
        self.nodes.append(Node(rec.name, in_names, out_names, dict(attrs), domain=rec.domain))
        self.events.add("update")
        return outs

    def host_read(self, t: Tensor) -> None:
        """Called when a tensor's value is read on the host while tracing."""
        if id(t) in self.tainted:
            name = self.names.get(id(t), "?")
            made = self.made_by.get(name)
            raise TraceError(
                f"trace: the step reads the value of {name!r}"
                + (f" (made by {made})" if made else "")
                + f", shape {tuple(t.shape)}, on the host (.item(), .numpy(), float(), Python control flow "
                "or a gradient rule that reads data); a compiled graph would replay this one value. "
                "Return the tensor from the step instead, or run the step eagerly"
            )


def trace(fn, example_inputs, dynamic_dims=None, name: str | None = None) -> Graph:
    """Run ``fn(*example_inputs)`` eagerly, recording every op call into a graph."""
    if _ex._tracer is not None:
        raise ParamInvalidError("trace: tracing is already active (nested compile of a traced function)")
    inputs = [as_tensor(x) for x in example_inputs]
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    in_names = [params[i] if i < len(params) else f"input_{i}" for i in range(len(inputs))]
    dyn = dynamic_dims or {}
    tracer = Tracer()
    graph_inputs = []
    for i, (n, t) in enumerate(zip(in_names, inputs)):
        dims = dyn.get(n, dyn.get(i, {}))
        if isinstance(dims, (list, tuple)):
            dims = {d: f"{n}_dim{d}" for d in dims}
        shape = tuple(dims.get(d, s) for d, s in enumerate(t.shape))
        tracer.track(t, n)
        graph_inputs.append(Value(n, t.dtype, shape))
    _ex._tracer = tracer
    try:
        result = fn(*inputs)
    finally:
        _ex._tracer = None
    if isinstance(result, dict):
        out_items = list(result.items())
    elif isinstance(result, (tuple, list)):
        out_items = [(None, r) for r in result]
    else:
        out_items = [(None, result)]
    outputs = []
    for key, t in out_items:
        if not isinstance(t, Tensor):
            raise ParamInvalidError(f"trace: the function must return Tensors, got {type(t).__name__}")
        src = tracer.name_of(t)
        if key is not None and key != src:  # name the output as the user did
            tracer.nodes.append(Node("Identity", [src], [key]))
            src = key
        outputs.append(Value(src, t.dtype))
    return Graph(
        name or getattr(fn, "__name__", "traced"),
        inputs=graph_inputs,
        outputs=outputs,
        nodes=tracer.nodes,
        initializers=tracer.initializers,
    )


def _root_ptr(t: Tensor):
    """The first byte of ``t``'s data (another handle on the same memory has the same one; a view at
    an offset is not caught); None for empty tensors, which may share an address."""
    a = t._array
    return a.__array_interface__["data"][0] if a.nbytes else None


def trace_stateful(fn, inputs: list, tracer: StateTracer, name: str | None = None):
    """Run ``fn(*inputs)`` eagerly under ``tracer`` and build its graph.

    Returns ``(graph, updates, result)``: ``updates`` maps each graph output that is a state
    tensor's new value to that state input (a compiled run writes it into the input's memory);
    ``result`` is what ``fn`` returned (computed eagerly). Host reads of computed values raise
    :class:`TraceError` while ``fn`` runs.
    """
    if _ex._tracer is not None:
        raise TraceError("trace: tracing is already active (a compiled step called inside another trace)")
    inputs = [as_tensor(x) for x in inputs]
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    in_names = [params[i] if i < len(params) else f"input_{i}" for i in range(len(inputs))]
    graph_inputs = []
    for n, t in zip(in_names, inputs):
        if id(t) in tracer.names:
            raise TraceError(f"trace: input {n!r} is the same tensor as an earlier input")
        tracer.track(t, n)
        tracer.taint(t, n)
        graph_inputs.append(Value(n, t.dtype, tuple(t.shape)))
    _ex._tracer = tracer
    _tensor_mod._host_read_hook = tracer.host_read
    try:
        result = fn(*inputs)
    finally:
        _ex._tracer = None
        _tensor_mod._host_read_hook = None
    items = (
        list(result.items())
        if isinstance(result, dict)
        else [(None, r) for r in result]
        if isinstance(result, (tuple, list))
        else [(None, result)]
    )
    outputs, used = [], set()
    for key, t in items:
        if not isinstance(t, Tensor):
            raise TraceError(f"trace: the step must return Tensors, got {type(t).__name__}")
        src = tracer.name_of(t)
        out = key if key is not None else src
        if out in used or out in tracer.state or out in in_names:  # each graph output a value of its own
            out = f"{out}.out{len(outputs)}"
        if out != src:
            tracer.nodes.append(Node("Identity", [src], [out]))
        used.add(out)
        outputs.append(Value(out, t.dtype))
    updates = {}
    for sname, t in tracer.state.items():
        final = tracer.names[id(t)]
        if final == sname:
            continue  # read, never written: an input only
        if final in used:  # also returned to the caller: the update gets its own output
            tracer.nodes.append(Node("Identity", [final], [final + ".state"]))
            final = final + ".state"
        outputs.append(Value(final, t.dtype))
        used.add(final)
        updates[final] = sname
    for hname in tracer.host_inputs:
        dtype, shape = tracer.metas[hname]
        graph_inputs.append(Value(hname, dtype, shape))
    for sname, t in tracer.state.items():
        graph_inputs.append(Value(sname, t.dtype, tuple(t.shape)))
    graph = Graph(
        name or getattr(fn, "__name__", "step"),
        inputs=graph_inputs,
        outputs=outputs,
        nodes=tracer.nodes,
        initializers=tracer.initializers,
    )
    return graph, updates, result
