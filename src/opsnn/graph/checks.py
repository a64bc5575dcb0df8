"""Node checks at compile time: each node's attributes, and its shapes where they are known,
against its op record, before any pass rewrites the graph.

A mistake in a node (an attribute typo, ``alpha="big"``, a Gemm ``C`` that does not broadcast)
is reported when the graph is compiled, naming the user's node (its name and op type), rather
than at the first run and against whatever fused op the node became::

    >>> import numpy as np
    >>> from opsnn.graph import Graph, Node, Value
    >>> g = Graph("g", inputs=[Value("x", np.float32, (2, 3))], outputs=["y"],
    ...           nodes=[Node("LeakyRelu", ["x"], ["y"], {"alpha": "big"}, name="act")])
    >>> check_nodes(g)
    Traceback (most recent call last):
    ...
    opsnn.errors.ParamInvalidError: [161002] compile: node 'act' (LeakyRelu): attribute 'alpha' must be a float, got 'big' (str)
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import OpsnnError, ParamInvalidError
from ..ops.registry import REQUIRED, InferContext, TensorMeta, get_op, has_op
from .ir import Graph, Node

_INT_TYPES = (numbers.Integral, np.integer, np.bool_)
_REAL_TYPES = (numbers.Real, np.integer, np.floating, np.bool_)


def _is_int(v) -> bool:
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    if isinstance(v, _INT_TYPES):
        return True
    return isinstance(v, (float, np.floating)) and float(v).is_integer()  # 2.0 from a builder is 2


def _is_real(v) -> bool:
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v[()]
    return isinstance(v, _REAL_TYPES)


def _is_str(v) -> bool:
    return isinstance(v, (str, bytes))


def _is_list_of(v, ok) -> bool:
    if isinstance(v, np.ndarray):
        return v.ndim <= 1 and all(ok(x) for x in v.reshape(-1))
    return isinstance(v, (list, tuple)) and all(ok(x) for x in v)


_KINDS = {
    "int": (_is_int, "an int"),
    "float": (_is_real, "a float"),
    "string": (_is_str, "a string"),
    "ints": (lambda v: _is_list_of(v, _is_int), "a list of ints"),
    "floats": (lambda v: _is_list_of(v, _is_real), "a list of floats"),
    "strings": (lambda v: _is_list_of(v, _is_str), "a list of strings"),
}


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def check_attrs(rec, attrs: dict) -> None:
    """Raise :class:`ParamInvalidError` for an unknown or missing attribute of ``rec``, or one whose
    value is not of its declared kind (int, float, string and their lists)."""
    rec.bind_attrs(attrs)
    for a in rec.attrs:
        if a.name not in attrs or a.kind not in _KINDS:
            continue
        v = attrs[a.name]
        if v is None and (a.default is None or a.default is REQUIRED):
            continue
        ok, what = _KINDS[a.kind]
        if not ok(v):
            raise ParamInvalidError(f"attribute {a.name!r} must be {what}, got {_short(v)} ({type(v).__name__})")


def _named(node: Node, exc: Exception) -> OpsnnError:
    msg = exc.args[0] if exc.args else str(exc)
    if isinstance(exc, OpsnnError):
        cls = type(exc)
        if isinstance(msg, str) and exc.op and msg.startswith(exc.op + ": "):
            msg = msg[len(exc.op) + 2 :]
    else:
        cls, msg = ParamInvalidError, f"{type(exc).__name__}: {msg}"
    err = cls(f"compile: node {node.name!r} ({node.op_type}): {msg}")
    err.op = node.op_type
    return err


def _concrete(meta) -> bool:
    return meta is not None and all(isinstance(d, (int, np.integer)) and d >= 0 for d in meta.shape)


def check_nodes(graph: Graph) -> None:
    """Check every node of ``graph`` that has an op record: its attributes always, its input
    dtypes and shapes (the op's own inference) wherever the shapes reaching it are concrete.
    Raises the op's typed error, naming the node; nodes without a record (control flow,
    interpreter-only ops) and values computed from data are left to plan time."""
    metas: dict = {}
    for v in graph.inputs:
        if v.dtype is not None and v.shape is not None:
            m = TensorMeta(tuple(v.shape), np.dtype(v.dtype))
            if _concrete(m):
                metas[v.name] = m
    values: dict = dict(graph.initializers)
    for k, a in graph.initializers.items():
        metas[k] = TensorMeta(a.shape, a.dtype)
    for node in graph.nodes:
        if node.op_type == "Constant" and not node.domain:
            val = node.attrs.get("value")
            if isinstance(val, np.ndarray) and node.outputs:
                values[node.outputs[0]] = val
                metas[node.outputs[0]] = TensorMeta(val.shape, val.dtype)
            continue
        for _, sub in node.subgraphs():  # a body's nodes: their attributes (shapes vary per iteration)
            for _, inner in sub.walk():
                if has_op(inner.op_type, inner.domain):
                    try:
                        check_attrs(get_op(inner.op_type, inner.domain), inner.attrs)
                    except OpsnnError as exc:
                        raise _named(inner, exc) from None
        if not has_op(node.op_type, node.domain):
            continue
        rec = get_op(node.op_type, node.domain)
        try:
            check_attrs(rec, node.attrs)
        except OpsnnError as exc:
            raise _named(node, exc) from None
        if any(True for _ in node.subgraphs()) or rec.dynamic_shape:
            continue
        ins = [metas.get(n) if n else None for n in node.inputs]
        if any(m is None for m, n in zip(ins, node.inputs) if n):
            continue  # an input's shape depends on data or on symbolic dims: checked at plan time
        vals = [values.get(n) if n else None for n in node.inputs]
        if any(i < len(node.inputs) and node.inputs[i] and vals[i] is None for i in rec.host_inputs):
            continue
        if node.op_type in ("Shape", "Size") and not node.domain:
            shp = np.array(ins[0].shape, np.int64)
            val = (
                np.array(shp.prod(), np.int64)
                if node.op_type == "Size"
                else shp[node.attrs.get("start", 0) : node.attrs.get("end", None)]
            )
            values[node.outputs[0]] = val
            metas[node.outputs[0]] = TensorMeta(val.shape, val.dtype)
            continue
        while ins and ins[-1] is None and len(ins) > sum(1 for s in rec.inputs if not s.optional):
            ins, vals = ins[:-1], vals[:-1]
        try:
            rec.check_inputs(ins)
            bound = rec.bind_attrs(node.attrs)
            if rec.outputs and rec.outputs[-1].variadic and bound.get("num_outputs", 0) is None:
                bound["num_outputs"] = len(node.outputs)
            ctx = InferContext(rec, list(ins), bound, list(vals), len(node.outputs))
            outs = rec.run_infer(ctx)
        except OpsnnError as exc:
            raise _named(node, exc) from None
        except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError) as exc:
            raise _named(node, exc) from None
        for name, m in zip(node.outputs, outs):
            if name and m is not None and _concrete(m):
                metas[name] = TensorMeta(tuple(int(d) for d in m.shape), np.dtype(m.dtype))
