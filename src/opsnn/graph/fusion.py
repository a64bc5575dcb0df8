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
PROBE_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
SILU = RewriteRule(
    is_op("Mul")(X, is_op("Sigmoid")(X)),
    lambda m: [_new(m, "Swish", [m.bindings["x"]], {"alpha": 1.0})],
    name="silu_recognition",
)


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
GELU = [
    RewriteRule(
        is_op("Mul")(is_op("Mul")(X, is_op("Add")(is_op("Erf")(arg), is_const("one"))), is_const("half")),
        _gelu,
        name=f"gelu_recognition_{i}",
        check=_gelu_check,
    )
    for i, arg in enumerate(_ERF_ARG)
]
GELU += [
    RewriteRule(
        is_op("Mul")(is_op("Mul")(X, is_const("half")), is_op("Add")(is_op("Erf")(arg), is_const("one"))),
        _gelu,
        name=f"gelu_recognition_{i + 2}",
        check=_gelu_check,
    )
    for i, arg in enumerate(_ERF_ARG)
]

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
    return [
        _new(
            m,
            "LayerNormalization",
            [m.bindings["x"], m.bindings["gamma"], m.bindings["beta"]],
            {"axis": -1, "epsilon": _scalar(m, "eps")},
        )
    ]


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
    if (
        m.node("Div") is not None
        and m.node("Div").inputs[0] != m.bindings["x"]
        and _scalar(m, "one") is not None
        and not _near(_scalar(m, "one"), 1.0)
    ):
        return "numerator is not 1"
    return True


def _rms(m: Match):
    return [
        _new(m, "RMSNormalization", [m.bindings["x"], m.bindings["gamma"]], {"axis": -1, "epsilon": _scalar(m, "eps")})
    ]


RMS_NORM = [
    RewriteRule(
        is_op("Mul")(is_op("Div")(X, _RMS), is_const("gamma")), _rms, name="rms_norm_recognition_div", check=_rms_check
    ),
    RewriteRule(
        is_op("Mul")(is_op("Mul")(X, is_op("Reciprocal")(_RMS)), is_const("gamma")),
        _rms,
        name="rms_norm_recognition_reciprocal",
        check=_rms_check,
    ),
    RewriteRule(
        is_op("Mul")(is_op("Mul")(X, is_op("Div")(is_const("one"), _RMS)), is_const("gamma")),
        _rms,
        name="rms_norm_recognition_one_over",
        check=_rms_check,
    ),
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
            extra.append(
                Node(
                    "Transpose",
                    [k],
                    [k_bhsd],
                    {"perm": [0, 2, 1, 3]},
                    name=m.graph.unique_name(f"Transpose_{m.root.name}"),
                )
            )
            k = k_bhsd
        inputs = [m.bindings["q"], k, m.bindings["v"]] + ([m.bindings["mask"]] if masked else [])
        return extra + [_new(m, "Attention", inputs, {"scale": float(scale)})]

    return check, build


for _i, _s in enumerate(_SCALED):
    for _masked in (True, False):
        _scores = is_op("Add")(_s, wildcard("mask")) if _masked else _s
        _chk, _build = _attention(_masked)
        ATTENTION.append(
            RewriteRule(
                is_op("MatMul")(is_op("Softmax")(_scores), wildcard("v")),
                _build,
                name=f"attention_fusion_{'masked' if _masked else 'plain'}_{_i}",
                check=_chk,
            )
        )


def _head_split_source(graph, prod, shape_of, name: str):
    """``(x3, H, D, reshape_needed)`` when ``name`` is ``Transpose(perm=[0, 2, 1, 3])`` of a
    4-D (B, S, H, D) value with static H and D: ``x3`` is the (B, S, H*D) tensor it was
    reshaped from (or the 4-D value itself, ``reshape_needed``); else a reason string."""
    tr = prod.get(name)
    if tr is None or tr.op_type != "Transpose" or tr.domain or list(tr.attrs.get("perm") or []) != [0, 2, 1, 3]:
        return f"{name} is not a Transpose(perm=[0, 2, 1, 3]) head split"
    x4 = tr.inputs[0]
    shape = shape_of(x4)
    if shape is None or len(shape) != 4 or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape[2:]):
        return f"{x4} has shape {shape}; the head split needs a 4-D (B, S, H, D) input with static H, D"
    H, D = int(shape[2]), int(shape[3])
    rs = prod.get(x4)
    if rs is not None and rs.op_type == "Reshape" and not rs.domain:
        src = shape_of(rs.inputs[0])
        if src is not None and len(src) == 3 and src[2] == H * D and src[0] == shape[0] and src[1] == shape[1]:
            return rs.inputs[0], H, D, False
    return x4, H, D, True


def attention_head_layout(graph, res) -> None:
    """Attention on 4-D (B, H, S, D) Q/K/V that are all ``Transpose(perm=[0, 2, 1, 3])`` head
    splits of (B, S, H, D) tensors (BERT: Reshape of a projection, then Transpose) reads the
    untransposed (B, S, H*D) tensors instead (3-D Attention with q_num_heads/kv_num_heads;
    the kernels read heads with strides), and when its only reader is the head merge
    ``Transpose(perm=[0, 2, 1, 3])`` it writes (B, S, H*Dv) and the merge becomes a Reshape
    (a view). BERT-base: 48 Transposes of (1, 128, 12, 64) fewer per run. Shapes come from
    type inference, else from the probe run (exporters compute Reshape targets from Shape
    ops); H and D must be static there and H*D the last dim of the tensor split."""
    from .shape_inference import infer_types, probe_types

    if not any(n.op_type == "Attention" and not n.domain for n in graph.nodes):
        return
    infer_types(graph)
    probe = None

    def shape_of(v):
        nonlocal probe
        sh = graph.value(v).shape
        if sh is not None and all(isinstance(d, (int, np.integer)) for d in sh):
            return tuple(sh)
        if probe is None:
            probe = probe_types(graph)
        return tuple(probe[v].shape) if v in probe else sh

    prod = graph.producers()
    users = graph.consumers()
    for node in list(graph.nodes):
        if node.op_type != "Attention" or node.domain or len(node.inputs) < 3:
            continue
        if len(node.inputs) > 4 and any(node.inputs[4:]):
            res.refuse(f"{node.name}: past key/value or nonpad_kv_seqlen inputs (the cache layout is 4-D)")
            continue
        if len([o for o in node.outputs if o]) != 1 or node.outputs[0] in graph.output_names:
            res.refuse(f"{node.name}: more than the Y output, or Y is a graph output")
            continue
        srcs = [_head_split_source(graph, prod, shape_of, v) for v in node.inputs[:3]]
        bad = next((r for r in srcs if isinstance(r, str)), None)
        if bad is not None:
            res.refuse(f"{node.name}: {bad}")
            continue
        (_, hq, dq, _), (_, hk, dk, _), (_, hv, dv, _) = srcs
        if hk != hv or hq % hk or dq != dk:
            res.refuse(f"{node.name}: head counts/sizes ({hq}, {hk}, {hv}; {dq}, {dk}) do not match")
            continue
        new_nodes = []
        ins = []
        for (x, h, d, need), v in zip(srcs, node.inputs[:3]):
            if need:  # a (B, S, H, D) value not made by a Reshape: reshape it (a view) to (B, S, H*D)
                shp = graph.unique_name(f"{v}_heads3d_shape")
                graph.initializers[shp] = np.array([0, 0, h * d], np.int64)
                x3 = graph.unique_name(f"{v}_heads3d")
                new_nodes.append(Node("Reshape", [x, shp], [x3], {}, name=graph.unique_name(f"Reshape_{x3}")))
                x = x3
            ins.append(x)
        y = node.outputs[0]
        readers = users.get(y, [])
        merge = readers[0] if len(readers) == 1 else None
        y3 = graph.unique_name(f"{y}_bsh")
        if (
            merge is not None
            and merge.op_type == "Transpose"
            and not merge.domain
            and list(merge.attrs.get("perm") or []) == [0, 2, 1, 3]
        ):
            # Y3 (B, S, H*Dv) -> the merge's (B, S, H, Dv) output by a Reshape (a view)
            shp = graph.unique_name(f"{y}_merge_shape")
            graph.initializers[shp] = np.array([0, 0, hq, dv], np.int64)
            merge.op_type, merge.inputs, merge.attrs = "Reshape", [y3, shp], {}
            note = "; the head merge Transpose became a Reshape"
        else:
            # keep Y (B, H, S, Dv) for its readers: Y3 -> (B, S, H, Dv) -> Transpose
            shp = graph.unique_name(f"{y}_split_shape")
            graph.initializers[shp] = np.array([0, 0, hq, dv], np.int64)
            y4 = graph.unique_name(f"{y}_bshd")
            after = [
                Node("Reshape", [y3, shp], [y4], {}, name=graph.unique_name(f"Reshape_{y4}")),
                Node("Transpose", [y4], [y], {"perm": [0, 2, 1, 3]}, name=graph.unique_name(f"Transpose_{y}")),
            ]
            note = ""
        node.inputs = ins + list(node.inputs[3:])
        node.outputs = [y3]
        node.attrs = dict(node.attrs, q_num_heads=hq, kv_num_heads=hk)
        pos = graph.nodes.index(node)
        graph.nodes[pos : pos + 1] = new_nodes + [node] + ([] if note else after)
        res.note(f"{node.name}: Q/K/V read as (B, S, H*D) with head strides{note}")


# -- sibling products ----------------------------------------------------------------------------------------------
def sibling_product_fusion(graph, res) -> None:
    """FusedMatMul nodes that read the same A with constant 2-D float32 weights of the same K, the
    same bias form and activation, and no residual (BERT's Q, K and V projections) become one
    FusedMatMul on the weights (and biases) concatenated along N, then a Split of its output into
    the original values, where :func:`opsnn.kernels.cpu.libraries.sibling_products` says so."""
    from ..kernels.cpu import libraries as KL

    why = KL.sibling_products()
    if why is not None:
        res.refuse(why)
        return
    inits = graph.initializers
    groups: dict = {}
    for node in graph.nodes:
        if node.op_type != "FusedMatMul" or node.domain != "opsnn" or len(node.outputs) != 1:
            continue
        ins = list(node.inputs) + [""] * (4 - len(node.inputs))
        w = inits.get(ins[1])
        if ins[3] or w is None or w.ndim != 2 or w.dtype != np.float32:
            continue
        b = inits.get(ins[2]) if ins[2] else None
        if ins[2] and (b is None or b.shape != (w.shape[1],) or b.dtype != w.dtype):
            continue
        key = (ins[0], w.shape[0], bool(ins[2]), repr(sorted(node.attrs.items())))
        groups.setdefault(key, []).append(node)
    for (a, _, has_bias, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        ws = [inits[n.inputs[1]] for n in nodes]
        wname = graph.unique_name(f"{nodes[0].name}_siblings_W")
        inits[wname] = np.ascontiguousarray(np.concatenate(ws, axis=1))
        ins = [a, wname]
        if has_bias:
            ins.append(graph.unique_name(f"{nodes[0].name}_siblings_B"))
            inits[ins[-1]] = np.concatenate([inits[n.inputs[2]] for n in nodes])
        y = graph.unique_name(f"{nodes[0].name}_siblings_Y")
        sizes = graph.unique_name(f"{nodes[0].name}_siblings_split")
        inits[sizes] = np.array([w.shape[1] for w in ws], np.int64)
        fused = Node("FusedMatMul", ins, [y], dict(nodes[0].attrs), domain="opsnn", name=graph.unique_name(y))
        split = Node("Split", [y, sizes], [n.outputs[0] for n in nodes], {"axis": -1}, name=graph.unique_name(sizes))
        # every node of the group reads only A and constants: the first one's place has A ready
        pos = graph.nodes.index(nodes[0])
        graph.nodes[pos : pos + 1] = [fused, split]
        for n in nodes[1:]:
            graph.nodes.remove(n)
        res.note(f"{', '.join(n.name for n in nodes)}: one product of N = {inits[wname].shape[1]}, then a Split")


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
        return [
            _new(
                m,
                "FusedMatMul",
                ins,
                {"activation": act, "activation_alpha": alpha, "activation_beta": beta},
                domain="opsnn",
            )
        ]

    name = (
        "matmul"
        + ("_bias" if with_bias else "")
        + ("_residual" if with_residual else "")
        + ("_activation" if with_act else "")
        + "_epilogue"
    )
    return RewriteRule(pat, build, name=name, check=check)


EPILOGUE = [_conv_rule(True, True), _conv_rule(True, False), _conv_rule(False, True)]
EPILOGUE += [
    _matmul_rule(b, r, a)
    for b, r, a in (
        (True, True, False),
        (True, False, True),
        (True, False, False),
        (False, False, True),
        (False, True, False),  # a bias-free projection into a residual stream (LLaMA's o_proj, down_proj)
    )
]

BUILTIN_GROUPS.update(
    {
        "pattern_recognition": [SILU, *GELU, LAYER_NORM, *RMS_NORM],
        "attention_fusion": ATTENTION,
        "epilogue_fusion": EPILOGUE,
    }
)


def _sole_reader(graph, users, value: str, node: Node) -> bool:
    return value not in graph.output_names and [u.name for u in users.get(value, [])] == [node.name]


def resize_prologue_fusion(graph, res) -> None:
    """``Resize(Cast(Transpose / Unsqueeze ...(S)))`` with mode linear or cubic becomes one
    ``opsnn::FusedResize`` that reads S itself (an image pipeline's uint8 HWC frame: permute to
    CHW, add the batch axis, widen to float32, resize): the transposed copy and the 4x wider cast
    copy of the full-size image are never written; each output value converts its taps as it
    reads them. The Cast must go to float32/float64 and each step must be read by the next only.
    Left alone (with the reason): other Resize modes, shapes whose resize is not on the last two
    of four axes, positions outside the input (tf_crop_and_resize)."""
    from ..ops.defs.elementwise import onnx_dtype
    from ..ops.registry import get_op
    from .shape_inference import infer_types

    if not any(n.op_type == "Resize" and not n.domain for n in graph.nodes):
        return
    infer_types(graph)
    prod, users = graph.producers(), graph.consumers()
    fused = get_op("FusedResize", "opsnn")
    dead: set = set()
    new_nodes: dict = {}
    for n in graph.nodes:
        if n.op_type != "Resize" or n.domain:
            continue
        mode = n.attrs.get("mode") or "nearest"
        mode = mode.decode() if isinstance(mode, bytes) else mode
        cast = prod.get(n.inputs[0])
        if mode == "nearest" or cast is None or cast.op_type != "Cast" or cast.domain:
            continue
        if not _sole_reader(graph, users, n.inputs[0], n):
            res.refuse(f"{n.name}: its input Cast is read elsewhere too")
            continue
        try:
            to = onnx_dtype(cast.attrs.get("to"))
        except Exception:  # noqa: BLE001 - a bad Cast is the Cast kernel's error to report
            continue
        if to not in (np.float32, np.float64) or graph.value(cast.inputs[0]).shape is None:
            continue
        chain, src = [cast], cast.inputs[0]
        view = list(range(len(graph.value(src).shape)))
        while True:
            p = prod.get(src)
            if (
                p is None
                or p.domain
                or p.op_type not in ("Transpose", "Unsqueeze")
                or not _sole_reader(graph, users, src, chain[-1])
            ):
                break
            if p.op_type == "Transpose":
                perm = [int(v) for v in (p.attrs.get("perm") or [])]
                if not perm:
                    break
                view = [-1 if v < 0 else perm[v] for v in view]
            else:
                axes = p.attrs.get("axes")
                if axes is None and len(p.inputs) > 1 and p.inputs[1] in graph.initializers:
                    axes = graph.initializers[p.inputs[1]]
                if axes is None:
                    break
                r = len(view)
                axes = sorted(int(a) % r for a in np.asarray(axes).reshape(-1))
                view = [-1 if v < 0 or v in axes else v - sum(a < v for a in axes) for v in view]
            chain.append(p)
            src = p.inputs[0]
        sv = graph.value(src)
        if sv.dtype is None or np.dtype(sv.dtype) not in fused.inputs[0].dtypes or sv.shape is None:
            res.refuse(f"{n.name}: the source {src!r} is not an integer or float tensor of known rank")
            continue
        attrs = {k: v for k, v in n.attrs.items() if v is not None}
        attrs.update(to=int(cast.attrs["to"]), view=view)
        node = Node(
            "FusedResize",
            [src] + list(n.inputs[1:]),
            list(n.outputs),
            attrs,
            domain="opsnn",
            name=graph.unique_name(f"FusedResize_{n.name}"),
        )
        try:  # the kernel's conditions, on the graph's shapes (static here, or refused)
            why = _fused_resize_refusal(graph, fused, node, sv)
        except Exception as exc:  # noqa: BLE001 - an unexpected shape: leave the graph as it was
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            res.refuse(f"{n.name}: {why}")
            continue
        node.attrs_origin = [c.name for c in reversed(chain)] + [n.name]
        new_nodes[n.name] = node
        dead.update(c.name for c in chain)
        res.note(f"{' -> '.join(node.attrs_origin)} -> FusedResize (reads {src!r} directly)")
    if new_nodes:
        graph.nodes = [new_nodes.get(n.name, n) for n in graph.nodes if n.name not in dead]
        graph.sort()


def _fused_resize_refusal(graph, fused, node: Node, sv) -> str | None:
    from ..ops.executor import plan_op
    from ..ops.registry import TensorMeta

    if not all(isinstance(d, (int, np.integer)) for d in sv.shape):
        return "the source's shape is not static"
    metas = [TensorMeta(tuple(sv.shape), sv.dtype)]
    values = [None]
    for name in node.inputs[1:]:
        if not name:
            metas.append(None)
            values.append(None)
        elif name in graph.initializers:
            arr = graph.initializers[name]
            metas.append(TensorMeta(arr.shape, arr.dtype))
            values.append(arr)
        else:
            return f"Resize's {name!r} is not a constant"
    planned = plan_op(fused, metas, values, node.attrs)
    if planned.selection.kernel.name == "fused_resize_2d":
        return None
    return (
        "; ".join(why for name, why in planned.selection.rejected if name == "fused_resize_2d")
        or "no fused kernel for these shapes"
    )
