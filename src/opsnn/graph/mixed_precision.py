"""Mixed precision: per-op-type compute dtypes (``opsnn.config.allow_mix_precision``).

Listed op types run in their dtype (inputs cast, constant weights converted once, so 16-bit
weights take half the memory); every other float op stays float32. Casts are shared between
consumers and never stacked (a value cast down and back up reuses the original), and graph
outputs keep their declared dtypes::

    opsnn.config.allow_mix_precision({"MatMul": "float16", "LayerNorm": "float32", "Softmax": "bfloat16"})
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError
from ..ops.registry import has_op
from .ir import Graph, Node
from .pattern import ALIASES
from .shape_inference import infer_types, probe_types

#: fused ops follow the policy of the op they were made from
_ORIGIN = {"FusedMatMul": "MatMul", "FusedConv": "Conv", "FusedElementwise": "Add"}
_policy: dict = {}


def normalize_policy(policy: dict | None, who: str = "allow_mix_precision") -> dict:
    """``{op type: dtype}`` with aliases resolved and dtypes as numpy dtypes; unknown op types
    and non-float dtypes raise (the check shared by compiled graphs and ``opsnn.autocast``)."""
    if policy is not None and not isinstance(policy, dict):
        raise ParamInvalidError(
            f"{who}: expected a dict {{op type: dtype}} (e.g. {{'MatMul': 'bfloat16'}}) or None, got {policy!r}"
        )
    new = {}
    for op, dt in (policy or {}).items():
        name = ALIASES.get(op, op)
        d = _dt.get(dt)
        if not _dt.is_float(d):
            raise ParamInvalidError(f"{who}: {op!r} -> {dt!r}: compute dtypes must be floats")
        if not has_op(name) and not has_op(name, "opsnn") and name not in _ORIGIN.values():
            raise ParamInvalidError(f"{who}: unknown op type {op!r}")
        new[name] = d
    return new


def set_policy(policy: dict | None) -> None:
    """Set (or with None/{} clear) the op-type -> compute dtype policy."""
    new = normalize_policy(policy)
    _policy.clear()
    _policy.update(new)


def policy() -> dict:
    return dict(_policy)


def origin(op_type: str) -> str:
    """The op type whose policy a fused op follows (``FusedMatMul`` -> ``MatMul``), else itself."""
    return _ORIGIN.get(op_type, op_type)


def _target(node: Node, pol: dict):
    op = origin(node.op_type) if node.domain == "opsnn" else node.op_type
    return pol.get(op, _dt.float32)


def apply_mixed_precision(graph: Graph, res, pol: dict | None = None) -> None:
    pol = _policy if pol is None else pol
    if not pol or all(d == _dt.float32 for d in pol.values()):
        return
    metas = _dtypes(graph)
    vdtype = {k: np.dtype(m.dtype) for k, m in metas.items()}
    cast_memo: dict = {}  # (source, dtype) -> value name
    cast_src: dict = {}  # cast value -> (source, source dtype)
    new_nodes: list[Node] = []
    converted_weights = 0

    def as_dtype(v: str, dt) -> str:
        cur = vdtype.get(v)
        if cur is None or cur == dt or not _dt.is_float(cur):
            return v
        src = cast_src.get(v)
        if src is not None and src[1] == dt:  # cast back down/up: reuse the original value
            return src[0]
        key = (v, dt)
        if key in cast_memo:
            return cast_memo[key]
        if v in graph.initializers and graph.initializers[v].dtype.kind == "f":
            name = graph.unique_name(f"{v}_{_dt.name(dt)}")
            graph.initializers[name] = graph.initializers[v].astype(dt)
            nonlocal converted_weights
            converted_weights += 1
        else:
            name = graph.unique_name(f"{v}_{_dt.name(dt)}")
            new_nodes.append(
                Node(
                    "Cast", [v], [name], {"to": int(_onnx_type(dt))}, name=graph.unique_name(f"Cast_{v}_{_dt.name(dt)}")
                )
            )
            res.note(f"cast {v!r} {_dt.name(cur)} -> {_dt.name(dt)}")
        cast_memo[key] = name
        cast_src[name] = (v, cur)
        vdtype[name] = np.dtype(dt)
        return name

    for node in graph.nodes:
        outs_float = all(o and vdtype.get(o) is not None and _dt.is_float(vdtype[o]) for o in node.outputs)
        ins_float = [i for i in node.inputs if i and vdtype.get(i) is not None and _dt.is_float(vdtype[i])]
        if node.op_type == "Cast" or not outs_float or not ins_float:
            # dtype-changing or non-float nodes keep their inputs as they were produced in fp32 graphs
            node.inputs = [
                as_dtype(i, _dt.float32)
                if i
                and node.op_type != "Cast"
                and vdtype.get(i) is not None
                and _dt.is_float(vdtype[i])
                and vdtype[i] != metas.get(i, vdtype[i]).dtype
                else i
                for i in node.inputs
            ]
            new_nodes.append(node)
            continue
        target = np.dtype(_target(node, pol))
        node.inputs = [as_dtype(i, target) if i in ins_float else i for i in node.inputs]
        for o in node.outputs:
            if o:
                vdtype[o] = target
        new_nodes.append(node)
    # graph outputs keep their declared dtype (readers renamed in one sweep, not one per output)
    producer_of = {o: n for n in new_nodes for o in n.outputs if o}
    renamed: dict = {}
    casts = []
    for out in graph.outputs:
        want = metas.get(out.name)
        if out.name in renamed or want is None or vdtype.get(out.name) == np.dtype(want.dtype):
            continue
        producer = producer_of[out.name]
        inner = graph.unique_name(f"{out.name}_{_dt.name(vdtype[out.name])}")
        producer.outputs = [inner if o == out.name else o for o in producer.outputs]
        renamed[out.name] = inner
        casts.append(
            Node(
                "Cast",
                [inner],
                [out.name],
                {"to": int(_onnx_type(np.dtype(want.dtype)))},
                name=graph.unique_name(f"Cast_{out.name}"),
            )
        )
        res.note(f"output {out.name!r} cast back to {_dt.name(want.dtype)}")
    if renamed:
        for n in new_nodes:
            n.inputs = [renamed.get(i, i) for i in n.inputs]
    graph.nodes = new_nodes + casts
    graph.sort()
    if converted_weights:
        res.log.append(f"{converted_weights} constant weight(s) stored in 16-bit")


def _dtypes(graph: Graph) -> dict:
    """``{value: TensorMeta}`` for every value whose dtype is known. Symbolic inference stops at
    values computed from shapes (an exporter's Shape -> Slice -> Gather position ids leave the
    rest of a dynamic-length BERT untyped); dtypes do not depend on the sizes, so a probe with
    concrete sizes fills in what it could not type."""
    metas = infer_types(graph)
    if any(o and o not in metas for n in graph.nodes for o in n.outputs):
        for k, m in probe_types(graph).items():
            metas.setdefault(k, m)
    return metas


def _onnx_type(dt) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))
