"""Static shape and dtype inference over a graph, with symbolic dims.

The same per-op ``infer`` functions as eager mode run on :class:`~opsnn.graph.symbolic.Sym`
dims; when an op's inference needs a concrete value it is probed with two concrete
bindings and an affine fit (``d = a*sym + b``) is kept when both agree, else the dim is
unknown (``None``) until concrete shapes arrive at plan time.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpsnnError
from ..ops.registry import InferContext, TensorMeta, get_op, has_op
from .ir import Graph, Value
from .symbolic import Sym, SymbolicError, as_dim, bind

_PRIMES = (1009, 1237, 1447, 1693, 1931, 2179, 2417, 2693, 2903, 3181, 3413, 3673, 3911, 4153, 4409, 4657, 4933)


def _probe_values(symbols: set, k: int) -> dict:
    """Probe bindings chosen so that no two symbols are affinely related across probes."""
    return {s: _PRIMES[(5 * k + 3 * i + k * i) % len(_PRIMES)] for i, s in enumerate(sorted(symbols))}


def _constant_values(graph: Graph) -> dict:
    vals = dict(graph.initializers)
    for n in graph.nodes:
        if n.op_type == "Constant" and not n.domain and "value" in n.attrs and isinstance(n.attrs["value"], np.ndarray):
            vals[n.outputs[0]] = n.attrs["value"]
    return vals


def _infer_node(rec, metas, values, attrs, n_out):
    ctx = InferContext(rec, metas, rec.bind_attrs(attrs), values, n_out)
    return rec.run_infer(ctx)


def known_types(graph: Graph, input_shapes: dict | None = None) -> tuple[dict, dict]:
    """``({name: TensorMeta}, {name: array})`` of what is known before any node is inferred: the
    graph inputs (``input_shapes`` overriding), initializers and Constant nodes' values."""
    metas: dict = {}
    for v in graph.inputs:
        shape = (input_shapes or {}).get(v.name, v.shape)
        if v.dtype is not None and shape is not None:
            metas[v.name] = TensorMeta(tuple(as_dim(d) for d in shape), v.dtype)
    for k, a in graph.initializers.items():
        metas[k] = TensorMeta(a.shape, a.dtype)
    values = _constant_values(graph)
    for k, a in values.items():
        metas.setdefault(k, TensorMeta(a.shape, a.dtype))
    return metas, values


def infer_types(graph: Graph, input_shapes: dict | None = None) -> dict:
    """``{value name: Value}`` with dtype and (possibly symbolic, possibly None) shapes for every
    value the graph computes; also stored in ``graph.value_info``. ``input_shapes`` overrides
    the declared input shapes (e.g. concrete shapes)."""
    metas, values = known_types(graph, input_shapes)
    for node in graph.nodes:
        infer_node_types(node, metas, values)
    result = {}
    for name, m in metas.items():
        shape = tuple(str(d) if isinstance(d, Sym) else d for d in m.shape)
        result[name] = Value(name, m.dtype, shape)
    graph.value_info.update(
        {k: v for k, v in result.items() if k not in graph.initializers and k not in graph.input_names}
    )
    return {k: (metas[k]) for k in metas}


def infer_node_types(node, metas: dict, values: dict) -> None:
    """Add ``node``'s output ``TensorMeta`` s to ``metas`` where its inputs' are known (``values``:
    the constant inputs' arrays, for ops whose inference reads them); a pass that changes the
    graph as it sweeps it in order keeps its types current with this."""
    if node.op_type == "Constant" or not has_op(node.op_type, node.domain):
        return
    rec = get_op(node.op_type, node.domain)
    ins = [metas.get(n) if n else None for n in node.inputs]
    if any(m is None for m, n in zip(ins, node.inputs) if n):
        return
    if node.op_type == "Shape" and not node.domain and all(type(d) is int for d in ins[0].shape):
        # a static shape's value: the Slice / Reshape / Expand reading it get static shapes too
        lo, hi = int(node.attrs.get("start", 0)), node.attrs.get("end")
        values[node.outputs[0]] = np.array(ins[0].shape[lo : None if hi is None else int(hi)], np.int64)
    # unknown dims become fresh symbols for this node, and unknown again in its outputs
    unknown = []
    for i, m in enumerate(ins):
        if m is not None and any(d is None for d in m.shape):
            dims = []
            for d in m.shape:
                if d is None:
                    unknown.append(f"?{len(unknown)}")
                    d = Sym(unknown[-1])
                dims.append(d)
            ins[i] = TensorMeta(tuple(dims), m.dtype)
    vals = [values.get(n) if n else None for n in node.inputs]
    if any(i < len(node.inputs) and node.inputs[i] and vals[i] is None for i in rec.host_inputs):
        return
    outs = None
    try:
        outs = _infer_node(rec, ins, vals, node.attrs, len(node.outputs))
    except (SymbolicError, TypeError, ValueError, OpsnnError):
        outs = _probe(rec, ins, vals, node.attrs, len(node.outputs))
    except Exception:  # noqa: BLE001 - inference of one node never breaks the graph's
        outs = None
    if outs is None:
        return
    for name, m in zip(node.outputs, outs):
        if name and m is not None:
            dims = tuple(
                None if isinstance(d, Sym) and any(a.startswith("?") for a in d.atoms()) else d for d in m.shape
            )
            metas[name] = TensorMeta(dims, m.dtype)


def _probe(rec, ins, vals, attrs, n_out):
    """Infer with concrete probe values for every symbol; keep dims that fit ``a*sym + b``."""
    symbols = {a for m in ins if m is not None for d in m.shape if isinstance(d, Sym) for a in d.atoms()}
    if not symbols:
        return None
    runs = []
    for k in range(3):
        b = _probe_values(symbols, k)
        try:
            concrete = [None if m is None else TensorMeta(bind(m.shape, b), m.dtype) for m in ins]
            runs.append((b, _infer_node(rec, concrete, vals, attrs, n_out)))
        except Exception:  # noqa: BLE001
            return None
    out = []
    for j, m0 in enumerate(runs[0][1]):
        dims = []
        for d in range(len(m0.shape)):
            ys = [r[1][j].shape[d] if len(r[1][j].shape) == len(m0.shape) else None for r in runs]
            if None in ys:
                return None
            dims.append(_fit(symbols, [r[0] for r in runs], ys))
        out.append(TensorMeta(tuple(dims), m0.dtype))
    return out


def _fit(symbols: set, bindings: list, ys: list):
    """The dim as ``floor((a*sym + c) / q)`` (q = 1 is affine) consistent with all probes, or None."""
    if ys[0] == ys[1] == ys[2]:
        return int(ys[0])
    for s in sorted(symbols):
        xs = [b[s] for b in bindings]
        if xs[1] == xs[0]:
            continue
        for q in (1, 2, 3, 4, 8, 16, 32, 64):
            a = round(q * (ys[1] - ys[0]) / (xs[1] - xs[0]))
            if a == 0:
                continue
            lo = max(q * y - a * x for x, y in zip(xs, ys))
            hi = min(q * y - a * x + q - 1 for x, y in zip(xs, ys))
            if lo <= hi:
                return (Sym(s) * a + lo) // q
    return None


def format_shapes(graph: Graph, input_shapes: dict | None = None) -> str:
    """One line per node: op, input shapes -> output shapes (``opsnn.debug.shape_inference``)."""
    metas = infer_types(graph, input_shapes)

    def fmt(name):
        if not name:
            return "-"
        m = metas.get(name)
        if m is None:
            return f"{name}: ?"
        return f"{name}: {m.dtype}[{', '.join('?' if d is None else str(d) for d in m.shape)}]"

    lines = [f"graph {graph.name}"]
    for n in graph.nodes:
        lines.append(
            f"  {n.name} ({n.qualified_type}): {', '.join(fmt(i) for i in n.inputs)} -> "
            f"{', '.join(fmt(o) for o in n.outputs)}"
        )
    return "\n".join(lines)


def format_dtype_flow(graph: Graph) -> str:
    """Where dtypes change along the graph, flagging precision loss (``opsnn.debug.dtype_flow``)."""
    from .. import dtypes as _dt

    metas = infer_types(graph)
    lines = [f"graph {graph.name}: dtype changes"]
    for n in graph.nodes:
        ins = {metas[i].dtype for i in n.inputs if i and i in metas}
        outs = {metas[o].dtype for o in n.outputs if o and o in metas}
        if not ins or not outs or ins == outs:
            continue
        lost = [
            f"{_dt.name(a)}->{_dt.name(b)}"
            for a in ins
            for b in outs
            if _dt.is_float(a) and (not _dt.is_float(b) or np.dtype(b).itemsize < np.dtype(a).itemsize)
        ]
        flag = f"  PRECISION LOSS ({', '.join(lost)})" if lost else ""
        lines.append(
            f"  {n.name} ({n.op_type}): {sorted(_dt.name(d) for d in ins)} -> {sorted(_dt.name(d) for d in outs)}{flag}"
        )
    if len(lines) == 1:
        lines.append("  none")
    return "\n".join(lines)


_PROBE_EVAL_LIMIT = 1 << 16  # elements: evaluate shape arithmetic, never real tensors
_SMALL_PRIMES = (37, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


def probe_types(graph: Graph) -> dict:
    """Concrete ``{value: TensorMeta}`` with every symbolic or unknown input dim bound to a distinct
    probe prime, and values propagated through shape arithmetic (Shape -> Gather -> Concat ->
    Reshape chains that exporters write). Ranks and equalities of shapes seen here hold for any
    binding with high probability; rewrite rules use it to check their preconditions."""
    from ..ops import executor as _ex

    symbols = sorted({str(d) for v in graph.inputs for d in (v.shape or ()) if not isinstance(d, (int, np.integer))})
    # small distinct primes: within real limits (max positions, vocab) and unlike model dims (64, 768...)
    binding = {s: _SMALL_PRIMES[i % len(_SMALL_PRIMES)] for i, s in enumerate(symbols)}
    metas: dict = {}
    for v in graph.inputs:
        if v.dtype is not None and v.shape is not None:
            metas[v.name] = TensorMeta(
                tuple(d if isinstance(d, (int, np.integer)) else binding[str(d)] for d in v.shape), v.dtype
            )
    values = _constant_values(graph)
    for k, a in values.items():
        metas[k] = TensorMeta(a.shape, a.dtype)
    for node in graph.nodes:
        if node.op_type == "Constant" or not has_op(node.op_type, node.domain) or any(True for _ in node.subgraphs()):
            continue
        rec = get_op(node.op_type, node.domain)
        ins = [metas.get(n) if n else None for n in node.inputs]
        if any(m is None for m, n in zip(ins, node.inputs) if n):
            continue
        vals = [values.get(n) if n else None for n in node.inputs]
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
        known = all(v is not None for n, v in zip(node.inputs, vals) if n) and any(node.inputs)
        small = all(m is None or int(np.prod(m.shape)) <= _PROBE_EVAL_LIMIT for m in ins)
        if known and small and not rec.dynamic_shape and "Random" not in node.op_type:
            try:
                outs = _ex.call(
                    rec,
                    [None if not n else vals[i] for i, n in enumerate(node.inputs)],
                    dict(node.attrs),
                    num_outputs=len(node.outputs),
                )
                outs = outs if isinstance(outs, tuple) else (outs,)
                for name, t in zip(node.outputs, outs):
                    if name:
                        values[name] = np.array(t.numpy())
                        metas[name] = TensorMeta(t.shape, t.dtype)
                continue
            except Exception:  # noqa: BLE001 - fall back to shape inference only
                pass
        if any(i < len(node.inputs) and node.inputs[i] and vals[i] is None for i in rec.host_inputs):
            continue
        try:
            outs = _infer_node(rec, ins, vals, node.attrs, len(node.outputs))
        except Exception:  # noqa: BLE001 - one node's inference never breaks the graph's
            continue
        for name, m in zip(node.outputs, outs):
            if name and m is not None:
                metas[name] = TensorMeta(tuple(m.shape), m.dtype)
    return metas
