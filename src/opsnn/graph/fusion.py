"""The library's rewrite rules: recognize decomposed ops (Gelu, LayerNorm, RMSNorm, SiLU),
fuse attention (MatMul-Scale-Mask-Softmax-MatMul -> Attention) and fold bias, activation
and residual add into Conv / MatMul epilogues (FusedConv, FusedMatMul).

Each rule's check reads the graph's inferred types (``graph.value_info``) and returns a
reason string when it refuses, so every refused fusion says why.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from .ir import Node
from .pattern import Match, RewriteRule, is_const, is_op, wildcard
from .rules import BUILTIN_GROUPS


def _const(match: Match, name: str):
    g = match.graph
    v = match.bindings.get(name)
    if v in g.initializers:
        return g.initializers[v]
    for n in g.nodes:
        if n.op_type == "Constant" and n.outputs and n.outputs[0] == v and isinstance(n.attrs.get("value"), np.ndarray):
            return n.attrs["value"]
    return None


def _scalar(match: Match, name: str) -> float | None:
    c = _const(match, name)
    if c is None or c.size != 1:
        return None
    return float(np.asarray(c).reshape(-1)[0])


#: graph -> {value: concrete probe shape} (set by the rule passes, see shape_inference.probe_types)
PROBE_SHAPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _shape(match: Match, value: str):
    probe = PROBE_SHAPES.get(match.graph)
    if probe is not None and value in probe:
        return tuple(probe[value].shape)
    v = match.graph.value_info.get(value)
    if v is None:
        if value in match.graph.initializers:
            return match.graph.initializers[value].shape
        for i in match.graph.inputs:
            if i.name == value:
                return i.shape
        return None
    return v.shape


def _near(a: float | None, b: float, tol: float = 1e-3) -> bool:
    return a is not None and abs(a - b) <= tol * max(1.0, abs(b))


def _out(match: Match) -> list:
    return list(match.root.outputs)


def _new(match: Match, op: str, inputs: list, attrs: dict, domain: str = "") -> Node:
    n = Node(op, inputs, _out(match), attrs, domain=domain, name=match.graph.unique_name(f"{op}_{match.root.name}"))
    n.attrs_origin = [m.name for m in match.nodes]
    return n


def _reduce_axes_last(match: Match, node: Node) -> bool:
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        axes = match.graph.initializers.get(node.inputs[1])
    if axes is None:
        return False
    axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    shape = _shape(match, node.inputs[0])
    rank = len(shape) if shape is not None else None
    return axes == [-1] or (rank is not None and axes == [rank - 1])


# -- recognition: SiLU, Gelu, LayerNorm, RMSNorm --------------------------------------------------------------
X = wildcard("x")
SILU = RewriteRule(is_op("Mul")(X, is_op("Sigmoid")(X)),
                   lambda m: [_new(m, "Swish", [m.bindings["x"]], {"alpha": 1.0})], name="silu_recognition")


def _gelu(m: Match):
    return [_new(m, "Gelu", [m.bindings["x"]], {"approximate": "none"})]


def _gelu_check(m: Match):
    div = m.node("Div")
    c = _scalar(m, "c")
    scale_ok = _near(c, math.sqrt(2)) if div is not None else _near(c, 1 / math.sqrt(2))
    if not scale_ok:
        return f"Erf argument scale {c} is not 1/sqrt(2)"
    if not _near(_scalar(m, "one"), 1.0) or not _near(_scalar(m, "half"), 0.5):
        return "constants are not the erf-Gelu's 1 and 0.5"
    return True


_ERF_ARG = [is_op("Div")(X, is_const("c")), is_op("Mul")(X, is_const("c"))]
GELU = [RewriteRule(is_op("Mul")(is_op("Mul")(X, is_op("Add")(is_op("Erf")(arg), is_const("one"))), is_const("half")),
                    _gelu, name=f"gelu_recognition_{i}", check=_gelu_check) for i, arg in enumerate(_ERF_ARG)]
GELU += [RewriteRule(is_op("Mul")(is_op("Mul")(X, is_const("half")), is_op("Add")(is_op("Erf")(arg), is_const("one"))),
                     _gelu, name=f"gelu_recognition_{i + 2}", check=_gelu_check) for i, arg in enumerate(_ERF_ARG)]

_MEAN = is_op("ReduceMean")(X)
_D = is_op("Sub")(X, _MEAN)
_VAR = is_op("ReduceMean")(is_op("Pow")(_D, is_const("two")))
_STD = is_op("Sqrt")(is_op("Add")(_VAR, is_const("eps")))
LAYER_NORM_PATTERN = is_op("Add")(is_op("Mul")(is_op("Div")(_D, _STD), is_const("gamma")), is_const("beta"))


def _ln_check(m: Match):
    if not _near(_scalar(m, "two"), 2.0):
        return "the variance uses a power other than 2"
    for n in m.nodes:
        if n.op_type == "ReduceMean":
            if not _reduce_axes_last(m, n):
                return f"{n.name} does not reduce over the last axis only"
            if not n.attrs.get("keepdims", 1):
                return f"{n.name} has keepdims=0"
    if _scalar(m, "eps") is None:
        return "epsilon is not a scalar constant"
    return True


def _ln(m: Match):
    return [_new(m, "LayerNormalization", [m.bindings["x"], m.bindings["gamma"], m.bindings["beta"]],
                 {"axis": -1, "epsilon": _scalar(m, "eps")})]


LAYER_NORM = RewriteRule(LAYER_NORM_PATTERN, _ln, name="layer_norm_recognition", check=_ln_check)

_MS = is_op("ReduceMean")(is_op("Pow")(X, is_const("two")))
_RMS = is_op("Sqrt")(is_op("Add")(_MS, is_const("eps")))


def _rms_check(m: Match):
    if not _near(_scalar(m, "two"), 2.0):
        return "the mean square uses a power other than 2"
    rm = m.node("ReduceMean")
    if not _reduce_axes_last(m, rm) or not rm.attrs.get("keepdims", 1):
        return f"{rm.name} does not reduce over the last axis with keepdims"
    if _scalar(m, "eps") is None:
        return "epsilon is not a scalar constant"
    if m.node("Div") is not None and m.node("Div").inputs[0] != m.bindings["x"] and _scalar(m, "one") is not None \
            and not _near(_scalar(m, "one"), 1.0):
        return "numerator is not 1"
    return True


def _rms(m: Match):
    return [_new(m, "RMSNormalization", [m.bindings["x"], m.bindings["gamma"]],
                 {"axis": -1, "epsilon": _scalar(m, "eps")})]


RMS_NORM = [
    RewriteRule(is_op("Mul")(is_op("Div")(X, _RMS), is_const("gamma")), _rms, name="rms_norm_recognition_div",
                check=_rms_check),
    RewriteRule(is_op("Mul")(is_op("Mul")(X, is_op("Reciprocal")(_RMS)), is_const("gamma")), _rms,
                name="rms_norm_recognition_reciprocal", check=_rms_check),
    RewriteRule(is_op("Mul")(is_op("Mul")(X, is_op("Div")(is_const("one"), _RMS)), is_const("gamma")), _rms,
                name="rms_norm_recognition_one_over", check=_rms_check),
]

# -- attention ---------------------------------------------------------------------------------------------------
_QK = is_op("MatMul")(wildcard("q"), is_op("Transpose")(wildcard("k")).named("kt"))
_SCALED = [is_op("Div")(_QK, is_const("scale")), is_op("Mul")(_QK, is_const("scale"))]
ATTENTION = []


def _attention(masked: bool):
    def check(m: Match):
        tr = m.node("Transpose")
        perm = list(tr.attrs.get("perm") or [])
        if perm not in ([0, 1, 3, 2], [0, 2, 3, 1]):
            return f"K is transposed with perm {perm}, not (B,H,S,D)->(B,H,D,S)"
        sm = m.node("Softmax")
        q_shape = _shape(m, m.bindings["q"])
        if q_shape is None or len(q_shape) != 4:
            return f"Q has shape {q_shape}; the fused attention takes 4-D (B, H, S, D)"
        if sm.attrs.get("axis", -1) not in (-1, 3):
            return f"Softmax over axis {sm.attrs.get('axis')} is not the key axis"
        if _scalar(m, "scale") is None:
            return "the score scale is not a scalar constant"
        if masked:
            ms = _shape(m, m.bindings["mask"])
            if ms is None or len(ms) > 4:
                return f"mask shape {ms} is not broadcastable to (B, H, S, S)"
        return True

    def build(m: Match):
        c = _scalar(m, "scale")
        scale = 1.0 / c if m.node("Div") is not None else c
        tr = m.node("Transpose")
        k = m.bindings["k"]
        extra = []
        if list(tr.attrs["perm"]) == [0, 2, 3, 1]:  # K given as (B, S, H, D): put heads first
            k_bhsd = m.graph.unique_name(k + "_bhsd")
            extra.append(Node("Transpose", [k], [k_bhsd], {"perm": [0, 2, 1, 3]},
                              name=m.graph.unique_name(f"Transpose_{m.root.name}")))
            k = k_bhsd
        inputs = [m.bindings["q"], k, m.bindings["v"]] + ([m.bindings["mask"]] if masked else [])
        return extra + [_new(m, "Attention", inputs, {"scale": float(scale)})]

    return check, build


for _i, _s in enumerate(_SCALED):
    for _masked in (True, False):
        _scores = is_op("Add")(_s, wildcard("mask")) if _masked else _s
        _chk, _build = _attention(_masked)
        ATTENTION.append(RewriteRule(is_op("MatMul")(is_op("Softmax")(_scores), wildcard("v")), _build,
                                     name=f"attention_fusion_{'masked' if _masked else 'plain'}_{_i}", check=_chk))

# -- epilogues ------------------------------------------------------------------------------------------------------
_ACTS = ("Relu", "Sigmoid", "Tanh", "Gelu", "Swish", "LeakyRelu")


def _activation(node: Node) -> tuple[str, float, float] | str:
    if node.op_type == "Gelu":
        approx = node.attrs.get("approximate", "none")
        approx = approx.decode() if isinstance(approx, bytes) else approx
        return ("GeluTanh" if approx == "tanh" else "Gelu", 0.0, 0.0)
    if node.op_type == "Swish":
        return ("Swish", float(node.attrs.get("alpha", 1.0)), 0.0)
    if node.op_type == "LeakyRelu":
        return ("LeakyRelu", float(node.attrs.get("alpha", 0.01)), 0.0)
    return (node.op_type, 0.0, 0.0)


def _same_shape(m: Match, a: str, b: str) -> bool:
    sa, sb = _shape(m, a), _shape(m, b)
    return sa is not None and sb is not None and tuple(sa) == tuple(sb) and None not in sa


def _conv_rule(with_add: bool, with_act: bool) -> RewriteRule:
    conv = is_op("Conv").named("conv_out")
    body = is_op("Add")(conv, wildcard("z")) if with_add else conv
    pat = is_op(*_ACTS)(body) if with_act else body

    def check(m: Match):
        if with_add and not _same_shape(m, m.bindings["z"], m.bindings["conv_out"]):
            return "residual shape differs from the conv output (broadcasting add)"
        c = m.node("Conv")
        if len(_shape(m, c.inputs[0]) or ()) != 4:
            return "not a 2-D convolution"
        return True

    def build(m: Match):
        c = m.node("Conv")
        ins = list(c.inputs) + [""] * (3 - len(c.inputs))
        if with_add:
            ins.append(m.bindings["z"])
        act, alpha, beta = _activation(m.root) if with_act else ("", 0.0, 0.0)
        attrs = dict(c.attrs, activation=act, activation_alpha=alpha, activation_beta=beta)
        return [_new(m, "FusedConv", ins, attrs, domain="opsnn")]

    name = "conv" + ("_residual" if with_add else "") + ("_activation" if with_act else "") + "_epilogue"
    return RewriteRule(pat, build, name=name, check=check)


def _matmul_rule(with_bias: bool, with_residual: bool, with_act: bool) -> RewriteRule:
    mm = is_op("MatMul")(wildcard("a"), is_const("w")).named("mm_out")
    body = is_op("Add")(mm, is_const("bias")) if with_bias else mm
    if with_residual:
        body = is_op("Add")(body, wildcard("z"))
    pat = is_op(*_ACTS)(body) if with_act else body

    def check(m: Match):
        w = _const(m, "w")
        if w is None or w.ndim != 2:
            return "the weight is not a constant 2-D matrix"
        if with_bias:
            b = _const(m, "bias")
            if b is None or b.shape not in ((w.shape[1],), (1, w.shape[1])):
                return f"bias shape {None if b is None else b.shape} is not ({w.shape[1]},)"
        if with_residual and not _same_shape(m, m.bindings["z"], m.bindings["mm_out"]):
            return "residual shape differs from the matmul output"
        return True

    def build(m: Match):
        ins = [m.bindings["a"], m.bindings["w"]]
        if with_bias:
            b = _const(m, "bias")
            if b.ndim != 1:
                name = m.graph.unique_name(m.bindings["bias"] + "_flat")
                m.graph.initializers[name] = b.reshape(-1)
                ins.append(name)
            else:
                ins.append(m.bindings["bias"])
        else:
            ins.append("")
        if with_residual:
            ins.append(m.bindings["z"])
        act, alpha, beta = _activation(m.root) if with_act else ("", 0.0, 0.0)
        return [_new(m, "FusedMatMul", ins, {"activation": act, "activation_alpha": alpha,
                                             "activation_beta": beta}, domain="opsnn")]

    name = "matmul" + ("_bias" if with_bias else "") + ("_residual" if with_residual else "") + \
        ("_activation" if with_act else "") + "_epilogue"
    return RewriteRule(pat, build, name=name, check=check)


EPILOGUE = [_conv_rule(True, True), _conv_rule(True, False), _conv_rule(False, True)]
EPILOGUE += [_matmul_rule(b, r, a) for b, r, a in ((True, True, False), (True, False, True), (True, False, False),
                                                   (False, False, True))]

BUILTIN_GROUPS.update({"pattern_recognition": [SILU, *GELU, LAYER_NORM, *RMS_NORM], "attention_fusion": ATTENTION,
                       "epilogue_fusion": EPILOGUE})
