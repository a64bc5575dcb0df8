"""The graph interpreter: runs a :class:`~opsnn.graph.ir.Graph` node by node.

Each node goes through the op registry (``executor.call``: validation, shape inference,
kernel selection, executors cached by signature). Control flow (If, Loop, Scan,
SequenceMap), Constant and the Sequence*/Optional* ops are handled here, with Python
lists as sequences and ``None`` as an empty optional; subgraphs see the values of the
graphs enclosing them::

    >>> import numpy as np, opsnn
    >>> from opsnn.graph import Graph, Node, Value, run
    >>> g = Graph("g", inputs=[Value("x", np.float32)], outputs=[Value("y")],
    ...           nodes=[Node("Relu", ["x"], ["y"])])
    >>> run(g, {"x": np.array([-1.0, 2.0], np.float32)})["y"]
    array([0., 2.], dtype=float32)
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import dtypes as _dt
from ..errors import DTypeError, OpsnnError, ParamInvalidError, ParamNullptrError
from ..ops import executor as _executor
from ..ops.registry import get_op, has_op
from ..tensor import Tensor
from .ir import Graph, Node, free_names

#: ``(domain, op_type) -> fn(interp, node, inputs, scope) -> list of outputs``
BUILTINS: dict[tuple[str, str], Callable] = {}


def builtin(op_type: str, domain: str = "") -> Callable:
    """Register an interpreter-level op (control flow, sequences, optionals)."""

    def deco(fn):
        BUILTINS[(domain, op_type)] = fn
        return fn

    return deco


def is_supported(op_type: str, domain: str = "") -> bool:
    """True when the interpreter can run ``op_type`` (a builtin or a registered op)."""
    domain = "" if domain == "ai.onnx" else domain
    return (domain, op_type) in BUILTINS or has_op(op_type, domain)


def supported_ops(domain: str = "") -> list[str]:
    from ..ops.registry import REGISTRY

    return sorted({n for (d, n) in BUILTINS if d == domain} | {n for (d, n) in REGISTRY if d == domain})


# -- values ---------------------------------------------------------------------------------------
def to_value(x) -> Any:
    """A feed as an interpreter value: Tensor, list of Tensors (sequence) or None (empty optional)."""
    if x is None or isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)):
        return [to_value(e) for e in x]
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    if arr.dtype.kind == "U":
        arr = arr.astype(object)
    elif not arr.flags.writeable:
        arr = arr.copy()  # numba compiles read-only arrays as a separate type: keep one per dtype
    return Tensor(arr)


def to_numpy(v) -> Any:
    """An interpreter value as numpy (sequences as lists, empty optionals as None)."""
    if v is None:
        return None
    if isinstance(v, Tensor):
        return v.numpy()
    if isinstance(v, list):
        return [to_numpy(e) for e in v]
    return v


def _arr(v, node: Node, what: str) -> np.ndarray:
    if isinstance(v, Tensor):
        return v.numpy()
    raise ParamInvalidError(
        f"{node.op_type} (node {node.name!r}): {what} must be a tensor, got {type(v).__name__}", op=node.op_type
    )


def _wrap(a) -> Tensor:
    a = np.asarray(a)
    return Tensor(a)


class _Plan:
    """Per-graph facts computed once: where each value is last read, what each node runs."""

    __slots__ = ("graph", "drop_after", "handlers")

    def __init__(self, graph: Graph):
        self.graph = graph
        keep = set(graph.output_names)
        last: dict[str, int] = {}
        for i, n in enumerate(graph.nodes):
            for name in set(n.present_inputs()) | free_names(n):
                last[name] = i
        self.drop_after: list[list[str]] = [[] for _ in graph.nodes]
        for name, i in last.items():
            if name not in keep:
                self.drop_after[i].append(name)
        self.handlers = [BUILTINS.get((n.domain, n.op_type)) for n in graph.nodes]


class Interpreter:
    """Runs one graph; reusable across calls (per-graph plans are cached).

    ``check_inputs``: verify feeds' dtypes and static dims against the declared inputs.
    """

    def __init__(self, graph: Graph, *, check_inputs: bool = True):
        self.graph = graph
        self.check_inputs = check_inputs
        self._plans: dict[int, _Plan] = {}

    def plan(self, graph: Graph) -> _Plan:
        p = self._plans.get(id(graph))
        if p is None or p.graph is not graph or len(p.handlers) != len(graph.nodes):
            p = self._plans[id(graph)] = _Plan(graph)
        return p

    # -- public ------------------------------------------------------------------------------
    def run(self, feeds: dict, outputs: list[str] | None = None) -> dict:
        """Run the graph on ``feeds`` (``{input name: array | list | None}``) and return
        ``{output name: numpy array | list | None}`` in the graph's output order."""
        g = self.graph
        feeds = dict(feeds)
        known = set(g.input_names) | set(g.initializers)
        for name in feeds:
            if name not in known:
                raise ParamInvalidError(f"graph {g.name!r}: unknown input {name!r}; inputs are {g.input_names}")
        values = {}
        for v in g.inputs:
            if v.name not in feeds:
                if v.kind == "optional":
                    values[v.name] = None
                    continue
                raise ParamNullptrError(f"graph {g.name!r}: missing input {v.name!r} ({v!r})")
            x = to_value(feeds.pop(v.name))
            if self.check_inputs:
                _check_feed(g, v, x)
            values[v.name] = x
        values.update({k: to_value(a) for k, a in feeds.items()})  # overridden initializers
        want = outputs or g.output_names
        res = self.run_graph(g, values, None)
        return {name: to_numpy(res[name]) for name in want}

    def run_graph(self, g: Graph, feeds: dict, outer) -> dict:
        """Run ``g`` with ``feeds`` bound to its inputs and ``outer`` (a mapping or None) as
        enclosing scope; returns ``{output name: value}``."""
        plan = self.plan(g)
        local: dict = {k: Tensor(a) for k, a in g.initializers.items() if k not in feeds}
        local.update(feeds)
        scope = ChainMap(local, outer) if outer is not None else ChainMap(local)
        for i, node in enumerate(g.nodes):
            ins = [self._lookup(scope, name, node, g) if name else None for name in node.inputs]
            handler = plan.handlers[i]
            try:
                if handler is not None:
                    outs = handler(self, node, ins, scope)
                else:
                    outs = _run_registered(node, ins)
            except OpsnnError as exc:
                _note(exc, node, g)
                raise
            for name, val in zip(node.outputs, outs):
                if name:
                    local[name] = val
            for name in plan.drop_after[i]:
                local.pop(name, None)
        result = {}
        for v in g.outputs:
            result[v.name] = self._lookup(scope, v.name, None, g)
        return result

    def run_subgraph(self, g: Graph, args: list, scope) -> list:
        """Run a subgraph binding ``args`` positionally to its inputs; returns its outputs."""
        if len(args) != len(g.inputs):
            raise ParamInvalidError(
                f"subgraph {g.name!r} takes {len(g.inputs)} inputs {g.input_names}, got {len(args)}"
            )
        res = self.run_graph(g, dict(zip(g.input_names, args)), scope)
        return [res[n] for n in g.output_names]

    @staticmethod
    def _lookup(scope, name: str, node: Node | None, g: Graph):
        try:
            return scope[name]
        except KeyError:
            where = f"node {node.name!r} ({node.op_type})" if node is not None else "the graph outputs"
            raise ParamInvalidError(
                f"graph {g.name!r}: {where} reads {name!r}, which has no value "
                "(not an input, initializer or earlier output)"
            ) from None


def run(graph: Graph, feeds: dict, outputs: list[str] | None = None, *, check_inputs: bool = True) -> dict:
    """Run ``graph`` once: ``{input name: array}`` -> ``{output name: array}``."""
    return Interpreter(graph, check_inputs=check_inputs).run(feeds, outputs)


def _note(exc: BaseException, node: Node, g: Graph) -> None:
    msg = f"while running node {node.name!r} ({node.qualified_type}) of graph {g.name!r}"
    notes = getattr(exc, "__notes__", [])
    if hasattr(exc, "add_note") and msg not in notes:
        exc.add_note(msg)


def _check_feed(g: Graph, v, x) -> None:
    if v.kind != "tensor" or not isinstance(x, Tensor):
        if v.kind == "tensor" and x is not None and not isinstance(x, Tensor):
            raise ParamInvalidError(f"graph {g.name!r}: input {v.name!r} expects a tensor, got a sequence")
        return
    if v.dtype is not None and x.dtype != v.dtype and not (x.dtype.kind in "OUS" and v.dtype.kind in "OUS"):
        raise DTypeError(
            f"graph {g.name!r}: input {v.name!r} must have dtype {_dt.name(v.dtype)}, got {_dt.name(x.dtype)}"
        )
    if v.shape is not None:
        if len(v.shape) != x.ndim:
            raise ParamInvalidError(
                f"graph {g.name!r}: input {v.name!r} must have rank {len(v.shape)} "
                f"(shape {v.shape}), got shape {x.shape}"
            )
        for want, got in zip(v.shape, x.shape):
            if isinstance(want, (int, np.integer)) and want != got:
                raise ParamInvalidError(f"graph {g.name!r}: input {v.name!r} must have shape {v.shape}, got {x.shape}")


def _run_registered(node: Node, ins: list) -> list:
    for i, x in enumerate(ins):
        if x is not None and not isinstance(x, Tensor):
            raise ParamInvalidError(
                f"{node.op_type} (node {node.name!r}): input {i} is a "
                f"{'sequence' if isinstance(x, list) else type(x).__name__}; "
                "this op takes tensors",
                op=node.op_type,
            )
    rec = get_op(node.op_type, node.domain)
    n_out = len(node.outputs)
    while n_out > 1 and not node.outputs[n_out - 1]:
        n_out -= 1
    while ins and ins[-1] is None:
        ins = ins[:-1]
    res = _executor.call(rec, ins, node.attrs, num_outputs=n_out)
    res = list(res) if isinstance(res, tuple) else [res]
    if len(res) < n_out:
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): the op produced {len(res)} outputs, the node names {n_out}",
            op=node.op_type,
        )
    return res


# == builtins ======================================================================================
def _int(v, node, what) -> int:
    a = _arr(v, node, what)
    if a.size != 1:
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): {what} must hold one value, got shape {a.shape}", op=node.op_type
        )
    return int(a.reshape(-1)[0])


def _graph_attr(node: Node, key: str, attrs: dict | None = None) -> Graph:
    g = (node.attrs if attrs is None else attrs).get(key)
    if not isinstance(g, Graph):
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): attribute {key!r} must be a graph, got {type(g).__name__}",
            op=node.op_type,
        )
    return g


def _int_attr(node: Node, key: str) -> int:
    v = node.attrs.get(key)
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): attribute {key!r} must be an int, got {v!r}", op=node.op_type
        )
    return int(v)


@builtin("Constant")
def _constant(interp, node, ins, scope):
    attrs = node.attrs
    if len(attrs) != 1:
        raise ParamInvalidError(
            f"Constant (node {node.name!r}): needs exactly one value attribute, got {sorted(attrs)}", op="Constant"
        )
    ((key, val),) = attrs.items()
    kinds = {
        "value": None,
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
        "value_string": object,
        "value_strings": object,
        "sparse_value": None,
    }
    if key not in kinds:
        raise ParamInvalidError(f"Constant (node {node.name!r}): unknown attribute {key!r}", op="Constant")
    arr = np.asarray(val) if kinds[key] is None else np.asarray(val, dtype=kinds[key])
    return [_wrap(arr)]


@builtin("Identity")
def _identity(interp, node, ins, scope):
    x = ins[0]
    if isinstance(x, Tensor) and has_op("Identity"):
        return _run_registered(node, ins)
    return [x]


@builtin("If")
def _if(interp, node, ins, scope):
    cond = _arr(ins[0], node, "cond")
    if cond.size != 1:
        raise ParamInvalidError(f"If (node {node.name!r}): cond must hold one value, got shape {cond.shape}", op="If")
    branch = _graph_attr(node, "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch")
    outs = interp.run_subgraph(branch, [], scope)
    if len(outs) != len(node.outputs):
        raise ParamInvalidError(
            f"If (node {node.name!r}): branch {branch.name!r} returns {len(outs)} values, "
            f"the node has {len(node.outputs)} outputs",
            op="If",
        )
    return outs


def _stack(items: list, template, node) -> Tensor | list:
    if items and isinstance(items[0], list):
        return items  # scan output made of sequences
    if items:
        arrs = [_arr(x, node, "scan output") for x in items]
        return _wrap(np.stack(arrs))
    shape = tuple(d if isinstance(d, (int, np.integer)) else 0 for d in (template.shape or ()))
    return _wrap(np.zeros((0,) + shape, template.dtype or np.float32))


@builtin("Loop")
def _loop(interp, node, ins, scope):
    body = _graph_attr(node, "body")
    trip = _int(ins[0], node, "M (trip count)") if len(ins) > 0 and ins[0] is not None else None
    cond = bool(_arr(ins[1], node, "cond").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else True
    carried = list(ins[2:])
    n_carried = len(carried)
    n_scan = len(body.outputs) - 1 - n_carried
    if n_scan < 0:
        raise ParamInvalidError(
            f"Loop (node {node.name!r}): body returns {len(body.outputs)} values, needs at "
            f"least 1 + {n_carried} (cond + loop-carried)",
            op="Loop",
        )
    scans: list[list] = [[] for _ in range(n_scan)]
    i = 0
    while (trip is None or i < trip) and cond:
        args = [_wrap(np.array(i, np.int64)), _wrap(np.array(cond, np.bool_))] + carried
        outs = interp.run_subgraph(body, args, scope)
        cond = bool(_arr(outs[0], node, "body cond output").reshape(-1)[0])
        carried = outs[1 : 1 + n_carried]
        for k, x in enumerate(outs[1 + n_carried :]):
            scans[k].append(x)
        i += 1
    stacked = [_stack(s, body.outputs[1 + n_carried + k], node) for k, s in enumerate(scans)]
    return carried + stacked


def _scan_core(interp, node, scope, states: list, scan_ins: list, attrs: dict, seq_len: int | None = None):
    body = _graph_attr(node, "body", attrs)
    m = len(scan_ins)
    in_axes = list(attrs.get("scan_input_axes") or [0] * m)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * m)
    arrays = []
    for k, x in enumerate(scan_ins):
        a = _arr(x, node, f"scan input {k}")
        ax = in_axes[k] % a.ndim
        arrays.append(np.moveaxis(a, ax, 0))
    if seq_len is None:
        lens = {a.shape[0] for a in arrays}
        if len(lens) != 1:
            raise ParamInvalidError(
                f"Scan (node {node.name!r}): scan inputs have different lengths {sorted(lens)}", op="Scan"
            )
        seq_len = lens.pop() if lens else 0
    n_states = len(states)
    n_out = len(body.outputs) - n_states
    scans: list[list] = [[] for _ in range(n_out)]
    for t in range(seq_len):
        slices = [_wrap(a[seq_len - 1 - t] if d else a[t]) for a, d in zip(arrays, in_dirs)]
        outs = interp.run_subgraph(body, states + slices, scope)
        states = outs[:n_states]
        for k, x in enumerate(outs[n_states:]):
            scans[k].append(_arr(x, node, "scan output"))
    out_axes = list(attrs.get("scan_output_axes") or [0] * n_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * n_out)
    results = []
    for k, items in enumerate(scans):
        if out_dirs[k]:
            items = items[::-1]
        if items:
            a = np.stack(items)
        else:
            tmpl = body.outputs[n_states + k]
            shape = tuple(d if isinstance(d, (int, np.integer)) else 0 for d in (tmpl.shape or ()))
            a = np.zeros((0,) + shape, tmpl.dtype or np.float32)
        ax = out_axes[k] % a.ndim
        results.append(np.moveaxis(a, 0, ax))
    return states, results


@builtin("Scan")
def _scan(interp, node, ins, scope):
    m = _int_attr(node, "num_scan_inputs")
    n = len(ins) - m
    states, results = _scan_core(interp, node, scope, list(ins[:n]), list(ins[n:]), node.attrs)
    return states + [_wrap(a) for a in results]


@builtin("BatchScan", domain="opsnn")
def _batch_scan(interp, node, ins, scope):
    """ONNX Scan-8: every input carries a leading batch dim; ``sequence_lens`` (input 0)
    bounds each batch entry's scan. Runs the Scan-9 loop once per batch entry."""
    m = _int_attr(node, "num_scan_inputs")
    lens = ins[0]
    states, scan_ins = list(ins[1 : len(ins) - m]), list(ins[len(ins) - m :])
    attrs = dict(node.attrs)
    attrs["scan_input_directions"] = attrs.pop("directions", None)
    batch = _arr(scan_ins[0], node, "scan input").shape[0]
    per_state: list[list] = [[] for _ in states]
    per_out: list[list] = []
    for b in range(batch):
        st = [_wrap(_arr(s, node, "state")[b]) for s in states]
        xs = [_wrap(_arr(x, node, "scan input")[b]) for x in scan_ins]
        seq = None if lens is None else int(_arr(lens, node, "sequence_lens")[b])
        st, res = _scan_core(interp, node, scope, st, xs, attrs, seq)
        for k, s in enumerate(st):
            per_state[k].append(_arr(s, node, "state"))
        if not per_out:
            per_out = [[] for _ in res]
        for k, r in enumerate(res):
            per_out[k].append(r)
    outs = [_wrap(np.stack(v)) for v in per_state]
    for items in per_out:
        longest = max(a.shape[0] for a in items)
        padded = [np.concatenate([a, np.zeros((longest - a.shape[0],) + a.shape[1:], a.dtype)]) for a in items]
        outs.append(_wrap(np.stack(padded)))
    return outs


# -- sequences and optionals (Python lists; None is the empty optional) ---------------------------
def _seq(v, node, what="input_sequence") -> list:
    if not isinstance(v, list):
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): {what} must be a sequence, got {type(v).__name__}", op=node.op_type
        )
    return v


def _position(v, n: int, node, insert: bool = False) -> int:
    p = _int(v, node, "position")
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ParamInvalidError(
            f"{node.op_type} (node {node.name!r}): position {p} out of range for a sequence of length {n}",
            op=node.op_type,
        )
    return p + n if p < 0 else p


@builtin("SequenceEmpty")
def _seq_empty(interp, node, ins, scope):
    return [[]]


@builtin("SequenceConstruct")
def _seq_construct(interp, node, ins, scope):
    return [list(ins)]


@builtin("SequenceInsert")
def _seq_insert(interp, node, ins, scope):
    seq = list(_seq(ins[0], node))
    pos = len(seq) if len(ins) < 3 or ins[2] is None else _position(ins[2], len(seq), node, insert=True)
    seq.insert(pos, ins[1])
    return [seq]


@builtin("SequenceErase")
def _seq_erase(interp, node, ins, scope):
    seq = list(_seq(ins[0], node))
    if not seq:
        raise ParamInvalidError(f"SequenceErase (node {node.name!r}): the sequence is empty", op="SequenceErase")
    pos = len(seq) - 1 if len(ins) < 2 or ins[1] is None else _position(ins[1], len(seq), node)
    del seq[pos]
    return [seq]


@builtin("SequenceAt")
def _seq_at(interp, node, ins, scope):
    seq = _seq(ins[0], node)
    return [seq[_position(ins[1], len(seq), node)]]


@builtin("SequenceLength")
def _seq_length(interp, node, ins, scope):
    return [_wrap(np.array(len(_seq(ins[0], node)), np.int64))]


@builtin("ConcatFromSequence")
def _concat_from_seq(interp, node, ins, scope):
    seq = [_arr(x, node, "sequence element") for x in _seq(ins[0], node)]
    axis = _int_attr(node, "axis")
    new_axis = int(node.attrs.get("new_axis", 0))
    if not seq:
        raise ParamInvalidError(f"ConcatFromSequence (node {node.name!r}): empty sequence", op="ConcatFromSequence")
    rank = seq[0].ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise ParamInvalidError(
            f"ConcatFromSequence (node {node.name!r}): axis {axis} out of range for rank {rank}",
            op="ConcatFromSequence",
        )
    return [_wrap(np.stack(seq, axis) if new_axis else np.concatenate(seq, axis))]


@builtin("SplitToSequence")
def _split_to_seq(interp, node, ins, scope):
    x = _arr(ins[0], node, "input")
    axis = int(node.attrs.get("axis", 0))
    keepdims = int(node.attrs.get("keepdims", 1))
    if not -x.ndim <= axis < x.ndim:
        raise ParamInvalidError(
            f"SplitToSequence (node {node.name!r}): axis {axis} out of range for rank {x.ndim}", op="SplitToSequence"
        )
    axis %= x.ndim
    n = x.shape[axis]
    split = ins[1] if len(ins) > 1 else None
    if split is None:
        parts = [np.take(x, [i], axis=axis) for i in range(n)]
        if not keepdims:
            parts = [np.squeeze(p, axis) for p in parts]
        return [[_wrap(p) for p in parts]]
    s = _arr(split, node, "split").astype(np.int64)
    if s.ndim == 0:
        size = int(s)
        if size <= 0:
            raise ParamInvalidError(
                f"SplitToSequence (node {node.name!r}): split must be positive, got {size}", op="SplitToSequence"
            )
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sizes = [int(v) for v in s]
        if sum(sizes) != n or any(v < 0 for v in sizes):
            raise ParamInvalidError(
                f"SplitToSequence (node {node.name!r}): split {sizes} does not sum to the axis length {n}",
                op="SplitToSequence",
            )
    bounds = np.cumsum([0] + sizes)
    parts = [np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(len(sizes))]
    return [[_wrap(p) for p in parts]]


@builtin("SequenceMap")
def _seq_map(interp, node, ins, scope):
    body = _graph_attr(node, "body")
    seq = _seq(ins[0], node)
    n = len(seq)
    for k, x in enumerate(ins[1:], 1):
        if isinstance(x, list) and len(x) != n:
            raise ParamInvalidError(
                f"SequenceMap (node {node.name!r}): input {k} has {len(x)} elements, input 0 has {n}", op="SequenceMap"
            )
    outs: list[list] = [[] for _ in body.outputs]
    for i in range(n):
        args = [x[i] if isinstance(x, list) else x for x in ins]
        for k, r in enumerate(interp.run_subgraph(body, args, scope)):
            outs[k].append(r)
    return outs


@builtin("Optional")
def _optional(interp, node, ins, scope):
    return [ins[0] if ins else None]


@builtin("OptionalHasElement")
def _optional_has(interp, node, ins, scope):
    return [_wrap(np.array(bool(ins) and ins[0] is not None))]


@builtin("OptionalGetElement")
def _optional_get(interp, node, ins, scope):
    if not ins or ins[0] is None:
        raise ParamInvalidError(
            f"OptionalGetElement (node {node.name!r}): the optional is empty", op="OptionalGetElement"
        )
    return [ins[0]]


__all__ = ["BUILTINS", "Interpreter", "builtin", "is_supported", "run", "supported_ops", "to_numpy", "to_value"]
