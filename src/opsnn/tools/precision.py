"""Precision compare: run a model in fp32 and in a target precision node by node, and say
where error grows, where the first NaN/Inf appears and why, and which op types to keep fp32.

>>> rep = opsnn.tools.precision_compare(graph, {"x": x}, dtype="float16")   # doctest: +SKIP
>>> print(rep.format())                                                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as _dt
from ..errors import ParamInvalidError


@dataclass
class NodeError:
    node: str
    op: str
    max_abs: float
    max_rel: float
    cosine: float  # over the elements finite in both runs; NaN when the target run has NaN/Inf
    nonfinite: bool
    nonfinite_kinds: tuple = ()  # which of "NaN", "+Inf", "-Inf" the target run produced where fp32 had none
    cause: bool = False  # the error starts here: every float input was within tolerance and finite

    @property
    def flag(self) -> str:
        """What went wrong in the target run: "NaN", "+Inf", "NaN/-Inf" ... or "" when all is finite."""
        return "/".join(self.nonfinite_kinds)


@dataclass
class PrecisionReport:
    dtype: str
    tolerance: float
    rows: list = field(default_factory=list)
    first_exceeding: NodeError | None = None
    first_nonfinite: tuple | None = None  # (node, op, reason)
    suggest_fp32: list = field(default_factory=list)
    outputs: dict = field(default_factory=dict)  # output name -> (max_abs, max_rel)

    def format(self, top: int = 15) -> str:
        lines = [
            f"precision compare: fp32 vs {self.dtype} (tolerance {self.tolerance:g} relative)",
            f"{'node':32s} {'op':18s} {'max abs':>10s} {'max rel':>10s} {'cosine':>9s}",
        ]
        worst = sorted(self.rows, key=lambda r: -r.max_rel)[:top]
        for r in sorted(worst, key=lambda r: self.rows.index(r)):
            if r.nonfinite:
                flag = "  " + r.flag + (" (starts here)" if r.cause else "")
            elif r.max_rel > self.tolerance:
                flag = "  > tol" + (" (starts here)" if r.cause else "")
            else:
                flag = ""
            cos = "      n/a" if r.cosine != r.cosine else f"{r.cosine:9.6f}"
            lines.append(f"{r.node[:32]:32s} {r.op[:18]:18s} {r.max_abs:10.3e} {r.max_rel:10.3e} {cos}{flag}")
        lines.append("")
        for name, (a, rel) in self.outputs.items():
            lines.append(f"output {name}: max abs {a:.3e}, max rel {rel:.3e}")
        fe = self.first_exceeding
        lines.append("first node over tolerance: " + (f"{fe.node} ({fe.op}), rel {fe.max_rel:.3e}" if fe else "none"))
        fn = self.first_nonfinite
        lines.append("first NaN/Inf: " + (f"{fn[1]} at node {fn[0]}: {fn[2]}" if fn else "none"))
        lines.append(
            "keep in fp32: "
            + (
                ", ".join(self.suggest_fp32) + " (the ops where the error starts)"
                if self.suggest_fp32
                else "nothing needed"
            )
        )
        return "\n".join(lines)


def _as_graph(model):
    from ..graph.compiler import CompiledGraph
    from ..graph.ir import Graph

    if isinstance(model, CompiledGraph):
        return model.graph
    if isinstance(model, Graph):
        return model
    from .. import onnx as _onnx

    return _onnx.load(model)


def _run_node(node, ins):
    from ..graph.interpreter import BUILTINS
    from ..ops.api import run_op

    builtin = BUILTINS.get((node.domain, node.op_type))
    if builtin is not None:
        from ..tensor import Tensor

        outs = builtin(None, node, [None if a is None else Tensor(np.require(a, requirements="C")) for a in ins], None)
    else:
        outs = run_op(node.op_type, ins, dict(node.attrs), num_outputs=len(node.outputs), domain=node.domain)
    return [None if o is None else np.array(o.numpy() if hasattr(o, "numpy") else o) for o in outs]


def _diagnose(node, ins_low: list, target) -> str:
    """Why a node produced NaN/Inf in the target precision (its inputs being finite)."""
    import ml_dtypes

    for i, a in enumerate(ins_low):
        if (
            a is not None
            and (a.dtype.kind == "f" or a.dtype == _dt.bfloat16)
            and not np.all(np.isfinite(a.astype(np.float64)))
        ):
            return f"input {i} already had NaN/Inf"
    op = node.op_type
    if op in ("Div", "Reciprocal") and ins_low and np.any(ins_low[-1].astype(np.float64) == 0):
        return f"input {len(ins_low) - 1} had zeros (values that underflowed in {_dt.name(target)}?)"
    if op == "Log" and np.any(ins_low[0].astype(np.float64) <= 0):
        return "input 0 had values <= 0"
    if op == "Sqrt" and np.any(ins_low[0].astype(np.float64) < 0):
        return "input 0 had negative values"
    return f"the result overflowed {_dt.name(target)} (largest finite value {float(ml_dtypes.finfo(target).max):.4g})"


def precision_compare(model, inputs: dict, dtype="float16", tolerance: float = 1e-2) -> PrecisionReport:
    """Compare fp32 and ``dtype`` (a float dtype, or a mixed-precision policy dict
    ``{op_type: dtype}``) node by node on ``inputs``; see :class:`PrecisionReport`."""
    graph = _as_graph(model)
    if isinstance(dtype, dict):
        policy = {k: _dt.get(v) for k, v in dtype.items()}
        default, label = _dt.float32, "policy " + ", ".join(f"{k}={_dt.name(v)}" for k, v in policy.items())
    else:
        default = _dt.get(dtype)
        if not _dt.is_float(default):
            raise ParamInvalidError(f"precision_compare: dtype must be a float dtype or a policy dict, got {dtype!r}")
        policy, label = {}, _dt.name(default)
    if not isinstance(inputs, dict):
        raise ParamInvalidError(
            f"precision_compare: inputs must be a dict {{input name: array}}, got {type(inputs).__name__}"
        )
    if not float(tolerance) >= 0.0:
        raise ParamInvalidError(f"precision_compare: tolerance must be >= 0, got {tolerance}")
    env32 = {k: np.asarray(v) for k, v in graph.initializers.items()}
    missing = [v.name for v in graph.inputs if v.name not in inputs and v.name not in graph.initializers]
    if missing:
        raise ParamInvalidError(f"precision_compare: missing input(s) {missing}")
    env32.update({k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in inputs.items()})
    envlo = dict(env32)
    rep = PrecisionReport(label, tolerance)
    bad_values: set = set()  # values whose target-precision result is off (over tolerance or non-finite)
    causes: list = []
    for node in graph.nodes:
        target = policy.get(node.op_type, default)

        def low(a):
            if a is None or not (a.dtype.kind == "f" or a.dtype == _dt.bfloat16):
                return a
            return a.astype(target)

        ins32 = [env32[i] if i else None for i in node.inputs]
        ins_lo = [low(envlo[i]) if i else None for i in node.inputs]
        outs32 = _run_node(node, ins32)
        outs_lo = _run_node(node, ins_lo)
        inherited = any(i in bad_values for i in node.inputs if i)
        for name, a, b in zip(node.outputs, outs32, outs_lo):
            if not name:
                continue
            env32[name], envlo[name] = a, b
            if a is None or b is None or not (a.dtype.kind == "f" or a.dtype == _dt.bfloat16) or a.size == 0:
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            new_bad = ~np.isfinite(b64) & np.isfinite(a64)
            kinds = tuple(
                k
                for k, m in (("NaN", np.isnan(b64)), ("+Inf", np.isposinf(b64)), ("-Inf", np.isneginf(b64)))
                if np.any(m & new_bad)
            )
            nonfinite = bool(kinds)
            both = np.isfinite(a64) & np.isfinite(b64)
            diff = np.abs(a64 - b64)[both]
            max_abs = float(diff.max()) if diff.size else 0.0
            scale = float(np.abs(a64[both]).max()) if both.any() else 0.0
            max_rel = max_abs / scale if scale > 0 else max_abs
            na, nb = np.linalg.norm(a64[both]), np.linalg.norm(b64[both])
            if nonfinite:
                cos = float("nan")  # a cosine over the finite part would hide the NaN/Inf
            else:
                cos = float(np.dot(a64[both], b64[both]) / (na * nb)) if na > 0 and nb > 0 else 1.0
            bad = nonfinite or max_rel > tolerance
            row = NodeError(
                node.name, node.qualified_type, max_abs, max_rel, cos, nonfinite, kinds, cause=bad and not inherited
            )
            rep.rows.append(row)
            if nonfinite and rep.first_nonfinite is None:
                rep.first_nonfinite = (node.name, node.op_type, _diagnose(node, ins_lo, target))
            if bad and rep.first_exceeding is None:
                rep.first_exceeding = row
            if bad:
                bad_values.add(name)
                if row.cause:
                    causes.append(node.op_type)
    # only the op types where the error starts (inputs still good), not those that inherit it
    rep.suggest_fp32 = list(dict.fromkeys(causes))[:5]
    for v in graph.outputs:
        a, b = env32.get(v.name), envlo.get(v.name)
        if a is not None and b is not None and a.dtype.kind == "f":
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            d = d[np.isfinite(d)]
            m = float(d.max()) if d.size else float("nan")
            s = float(np.abs(a).max()) if a.size else 0.0
            rep.outputs[v.name] = (m, m / s if s else m)
    return rep
