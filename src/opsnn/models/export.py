"""ONNX export of the model builders' modules, written with ``onnx.helper`` straight from
their parameters (opset 17), in the form torch.onnx / Hugging Face exports take:

* LayerNorm decomposed (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add),
  RMSNorm as Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul; GroupNorm as Reshape,
  InstanceNormalization, Reshape, Mul, Add;
* erf GELU as Div, Erf, Add, Mul, Mul; SiLU as Sigmoid, Mul;
* attention as MatMul(Q, Transpose(K)), Div(sqrt(d)), Add(mask), Softmax, MatMul(V);
* Linear as MatMul + Add on 3-D activations (the weight stored transposed, initializer
  ``<param>.T``), Gemm(transB=1) on 2-D ones; BatchNorm as BatchNormalization.

Initializers carry the parameters' ``state_dict`` names, so ``module.load_weights(path)``
reads an exported file back. Batch and sequence dims are symbolic.

>>> import opsnn, onnxruntime as ort, numpy as np
>>> m = opsnn.models.bert("tiny", vocab_size=100)
>>> proto = to_onnx(m)
>>> sess = ort.InferenceSession(proto.SerializeToString())   # doctest: +SKIP
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import nn
from ..errors import ParamInvalidError
from ..onnx.importer import PLAIN_RAW

OPSET = 17
_F32_MIN = float(np.finfo(np.float32).min)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every initializer an empty tensor of its type, for the checker: it reads their bytes
    only for their size, which ``tobytes`` of an array of the declared shape gives by construction, and
    serializing a BERT-base's 440 MB for it took most of an export; the nodes, names and types are checked."""
    skel = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "doc_string"):
        setattr(skel, field, getattr(model, field))
    skel.opset_import.extend(model.opset_import)
    src, dst = model.graph, skel.graph
    dst.name = src.name
    for field in ("node", "input", "output", "value_info"):
        getattr(dst, field).extend(getattr(src, field))
    for t in src.initializer:
        dst.initializer.append(TensorProto(name=t.name, data_type=t.data_type, dims=[0]))
    return skel


class OnnxBuilder:
    """Accumulates nodes, initializers, inputs and outputs; ``model()`` checks and returns
    the ModelProto. ``op(type, inputs, hint=..., **attrs)`` returns the output name(s)."""

    def __init__(self, name: str):
        self.name = name
        self.nodes, self.inputs, self.outputs = [], [], []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self._model = onnx.ModelProto()  # initializers are made in its graph: the weights are copied once
        self._taken: set[str] = set()
        self._consts: dict = {}

    def unique(self, hint: str) -> str:
        name, i = hint, 0
        while name in self._taken:
            i += 1
            name = f"{hint}_{i}"
        self._taken.add(name)
        return name

    def input(self, name: str, dtype, shape) -> str:
        self._taken.add(name)
        self.inputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))
        )
        return name

    def output(self, value: str, name: str, dtype, shape) -> str:
        """Declare ``value`` a graph output called ``name`` (renaming the value, as torch does;
        an Identity only when the value is a graph input or an initializer). Later nodes must use the
        returned name."""
        if value != name:
            self._taken.add(name)
            if value in self.initializers or any(i.name == value for i in self.inputs):
                self.nodes.append(helper.make_node("Identity", [value], [name], name=self.unique(f"/{name}/Identity")))
            else:
                for n in self.nodes:
                    for seq in (n.input, n.output):
                        for i, v in enumerate(seq):
                            if v == value:
                                seq[i] = name
        self.outputs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))
        )
        return name

    def weight(self, name: str, array) -> str:
        """An initializer named ``name`` (a parameter; registered once)."""
        arr = np.require(array.numpy() if hasattr(array, "numpy") else np.asarray(array), requirements="C")
        if name not in self.initializers:
            self._taken.add(name)
            self.initializers[name] = self._initializer(arr, name)
        return name

    def _initializer(self, arr: np.ndarray, name: str) -> onnx.TensorProto:
        """``arr`` as an initializer added to the model's graph, its bytes copied once where
        numpy_helper.from_array's layout is the array's own (make_graph and make_model copy again)."""
        t = self._model.graph.initializer.add()
        code = helper.np_dtype_to_tensor_dtype(arr.dtype) if arr.dtype.isnative else None
        if code in PLAIN_RAW:
            t.name = name
            t.data_type = code
            t.dims.extend(arr.shape)
            t.raw_data = arr.tobytes()
        else:
            t.CopyFrom(numpy_helper.from_array(arr, name))
        return t

    def const(self, value, dtype=np.float32, hint: str = "const") -> str:
        """A small constant initializer (shared by value)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self.unique(hint)
            self.initializers[name] = self._initializer(arr, name)
            self._consts[key] = name
        return name

    def op(self, op_type: str, inputs: list, outputs: int = 1, hint: str = "", **attrs):
        base = f"{hint}/{op_type}" if hint else op_type
        outs = [self.unique(f"{base}_output_{i}") for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.unique("/" + base), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, doc: str = "") -> onnx.ModelProto:
        model = self._model
        graph = model.graph
        graph.name = self.name
        for field, values in ((graph.node, self.nodes), (graph.input, self.inputs), (graph.output, self.outputs)):
            del field[:]
            field.extend(values)
        del model.opset_import[:]
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.ir_version = 8
        model.producer_name = "opsnn"
        model.doc_string = doc
        onnx.checker.check_model(_skeleton(model))
        return model

    # -- layers ----------------------------------------------------------------------------------
    def linear(self, x: str, lin: nn.Linear, name: str, gemm: bool = False) -> str:
        if gemm:  # 2-D activations: Gemm with the weight in torch's (out, in) layout
            ins = [x, self.weight(f"{name}.weight", lin.weight)]
            if lin.bias is not None:
                ins.append(self.weight(f"{name}.bias", lin.bias))
            return self.op("Gemm", ins, hint=name, transB=1)
        y = self.op(
            "MatMul", [x, self.weight(f"{name}.weight{nn.weights.TRANSPOSED_SUFFIX}", lin.weight.numpy().T)], hint=name
        )
        if lin.bias is not None:
            y = self.op("Add", [y, self.weight(f"{name}.bias", lin.bias)], hint=name)
        return y

    def layer_norm(self, x: str, ln: nn.LayerNorm, name: str) -> str:
        mean = self.op("ReduceMean", [x], hint=name, axes=[-1], keepdims=1)
        d = self.op("Sub", [x, mean], hint=name)
        var = self.op("ReduceMean", [self.op("Pow", [d, self.const(2.0)], hint=name)], hint=name, axes=[-1], keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [var, self.const(ln.eps, hint="eps")], hint=name)], hint=name)
        y = self.op("Div", [d, std], hint=name)
        y = self.op("Mul", [y, self.weight(f"{name}.weight", ln.weight)], hint=name)
        return self.op("Add", [y, self.weight(f"{name}.bias", ln.bias)], hint=name)

    def rms_norm(self, x: str, norm: nn.RMSNorm, name: str) -> str:
        eps = norm.eps if norm.eps is not None else float(np.finfo(np.float32).eps)
        ms = self.op("ReduceMean", [self.op("Pow", [x, self.const(2.0)], hint=name)], hint=name, axes=[-1], keepdims=1)
        r = self.op(
            "Reciprocal",
            [self.op("Sqrt", [self.op("Add", [ms, self.const(eps, hint="eps")], hint=name)], hint=name)],
            hint=name,
        )
        y = self.op("Mul", [x, r], hint=name)
        return self.op("Mul", [y, self.weight(f"{name}.weight", norm.weight)], hint=name)

    def group_norm(self, x: str, gn: nn.GroupNorm, name: str) -> str:
        G = gn.num_groups
        y = self.op("Reshape", [x, self.const([0, G, -1], np.int64, "shape")], hint=name)
        y = self.op(
            "InstanceNormalization",
            [y, self.const(np.ones(G), hint="ones"), self.const(np.zeros(G), hint="zeros")],
            hint=name,
            epsilon=gn.eps,
        )
        y = self.op("Reshape", [y, self.op("Shape", [x], hint=name)], hint=name)
        axes = self.const([1, 2], np.int64, "axes")
        w = self.op("Unsqueeze", [self.weight(f"{name}.weight", gn.weight), axes], hint=name)
        b = self.op("Unsqueeze", [self.weight(f"{name}.bias", gn.bias), axes], hint=name)
        return self.op("Add", [self.op("Mul", [y, w], hint=name), b], hint=name)

    def gelu(self, x: str, hint: str = "") -> str:
        e = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0), hint="sqrt2")], hint=hint)], hint=hint)
        y = self.op("Mul", [x, self.op("Add", [e, self.const(1.0, hint="one")], hint=hint)], hint=hint)
        return self.op("Mul", [y, self.const(0.5, hint="half")], hint=hint)

    def silu(self, x: str, hint: str = "") -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x], hint=hint)], hint=hint)

    def conv(self, x: str, conv: nn.Conv2d, name: str) -> str:
        if isinstance(conv.padding, str):
            raise ParamInvalidError(f"export: Conv2d {name} uses padding={conv.padding!r}; give explicit ints")
        ins = [x, self.weight(f"{name}.weight", conv.weight)]
        if conv.bias is not None:
            ins.append(self.weight(f"{name}.bias", conv.bias))
        ph, pw = conv.padding
        return self.op(
            "Conv",
            ins,
            hint=name,
            dilations=list(conv.dilation),
            group=conv.groups,
            kernel_shape=list(conv.kernel_size),
            pads=[ph, pw, ph, pw],
            strides=list(conv.stride),
        )

    def batch_norm(self, x: str, bn: nn.BatchNorm2d, name: str) -> str:
        C = bn.num_features
        w = bn.weight if bn.weight is not None else np.ones(C, np.float32)
        b = bn.bias if bn.bias is not None else np.zeros(C, np.float32)
        return self.op(
            "BatchNormalization",
            [
                x,
                self.weight(f"{name}.weight", w),
                self.weight(f"{name}.bias", b),
                self.weight(f"{name}.running_mean", bn.running_mean),
                self.weight(f"{name}.running_var", bn.running_var),
            ],
            hint=name,
            epsilon=bn.eps,
            momentum=1.0 - bn.momentum,
        )

    def split_heads(self, x: str, heads: int, head_dim: int, hint: str) -> str:
        y = self.op("Reshape", [x, self.const([0, 0, heads, head_dim], np.int64, "shape")], hint=hint)
        return self.op("Transpose", [y], hint=hint, perm=[0, 2, 1, 3])

    def merge_heads(self, y: str, width: int, hint: str) -> str:
        y = self.op("Transpose", [y], hint=hint, perm=[0, 2, 1, 3])
        return self.op("Reshape", [y, self.const([0, 0, width], np.int64, "shape")], hint=hint)

    def attention(self, q: str, k: str, v: str, mask: str | None, head_dim: int, hint: str) -> str:
        kt = self.op("Transpose", [k], hint=hint, perm=[0, 1, 3, 2])
        s = self.op("MatMul", [q, kt], hint=hint)
        s = self.op("Div", [s, self.const(math.sqrt(head_dim), hint="scale")], hint=hint)
        if mask is not None:
            s = self.op("Add", [s, mask], hint=hint)
        p = self.op("Softmax", [s], hint=hint, axis=-1)
        return self.op("MatMul", [p, v], hint=hint)


# -- ResNet ---------------------------------------------------------------------------------------------
def export_resnet(model) -> onnx.ModelProto:
    from .resnet import BasicBlock, Bottleneck

    b = OnnxBuilder("resnet")
    x = b.input("input", np.float32, ["batch", 3, "height", "width"])
    y = b.op("Relu", [b.batch_norm(b.conv(x, model.conv1, "conv1"), model.bn1, "bn1")], hint="relu")
    y = b.op("MaxPool", [y], hint="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for li in range(1, 5):
        for bi, blk in enumerate(getattr(model, f"layer{li}")):
            p = f"layer{li}.{bi}"
            convs = 3 if isinstance(blk, Bottleneck) else 2
            if not isinstance(blk, (Bottleneck, BasicBlock)):
                raise ParamInvalidError(f"export_resnet: unknown block type {type(blk).__name__}")
            out = y
            for c in range(1, convs + 1):
                out = b.batch_norm(
                    b.conv(out, getattr(blk, f"conv{c}"), f"{p}.conv{c}"), getattr(blk, f"bn{c}"), f"{p}.bn{c}"
                )
                if c < convs:
                    out = b.op("Relu", [out], hint=p)
            idn = y
            if blk.downsample is not None:
                idn = b.batch_norm(
                    b.conv(y, blk.downsample[0], f"{p}.downsample.0"), blk.downsample[1], f"{p}.downsample.1"
                )
            y = b.op("Relu", [b.op("Add", [out, idn], hint=p)], hint=p)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], hint="avgpool")], hint="flatten", axis=1)
    y = b.linear(y, model.fc, "fc", gemm=True)
    b.output(y, "logits", np.float32, ["batch", model.num_classes])
    return b.model("ResNet exported by opsnn.models.export")


# -- BERT -----------------------------------------------------------------------------------------------
def export_bert(model) -> onnx.ModelProto:
    cfg = model.config
    b = OnnxBuilder("bert")
    dims = ["batch", "sequence"]
    ids = b.input("input_ids", np.int64, dims)
    am = b.input("attention_mask", np.int64, dims)
    tt = b.input("token_type_ids", np.int64, dims)
    e = model.embeddings
    h = b.op(
        "Gather",
        [b.weight("embeddings.word_embeddings.weight", e.word_embeddings.weight), ids],
        hint="embeddings.word_embeddings",
    )
    t = b.op(
        "Gather",
        [b.weight("embeddings.token_type_embeddings.weight", e.token_type_embeddings.weight), tt],
        hint="embeddings.token_type_embeddings",
    )
    h = b.op("Add", [h, t], hint="embeddings")
    seq = b.op("Shape", [ids], hint="embeddings", start=1, end=2)
    pos_ids = b.op(
        "Slice",
        [
            b.const(np.arange(cfg.max_position_embeddings)[None], np.int64, "position_ids"),
            b.const([0], np.int64, "zero"),
            seq,
            b.const([1], np.int64, "axes"),
        ],
        hint="embeddings",
    )
    pos = b.op(
        "Gather",
        [b.weight("embeddings.position_embeddings.weight", e.position_embeddings.weight), pos_ids],
        hint="embeddings.position_embeddings",
    )
    h = b.op("Add", [h, pos], hint="embeddings")
    h = b.layer_norm(h, e.LayerNorm, "embeddings.LayerNorm")
    # extended mask: (1 - mask) * finfo.min, shape (batch, 1, 1, sequence)
    m = b.op(
        "Cast",
        [b.op("Unsqueeze", [am, b.const([1, 2], np.int64, "axes")], hint="mask")],
        hint="mask",
        to=TensorProto.FLOAT,
    )
    m = b.op(
        "Mul", [b.op("Sub", [b.const(1.0, hint="one"), m], hint="mask"), b.const(_F32_MIN, hint="neg")], hint="mask"
    )
    H, D = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    for i, layer in enumerate(model.encoder.layer):
        p = f"encoder.layer.{i}"
        sa = layer.attention.self
        q, k, v = (
            b.split_heads(b.linear(h, lin, f"{p}.attention.self.{n}"), H, D, f"{p}.attention.self.{n}")
            for n, lin in (("query", sa.query), ("key", sa.key), ("value", sa.value))
        )
        a = b.merge_heads(b.attention(q, k, v, m, D, f"{p}.attention.self"), cfg.hidden_size, f"{p}.attention.self")
        a = b.linear(a, layer.attention.output.dense, f"{p}.attention.output.dense")
        h = b.layer_norm(
            b.op("Add", [a, h], hint=f"{p}.attention.output"),
            layer.attention.output.LayerNorm,
            f"{p}.attention.output.LayerNorm",
        )
        f = b.gelu(b.linear(h, layer.intermediate.dense, f"{p}.intermediate.dense"), f"{p}.intermediate")
        f = b.linear(f, layer.output.dense, f"{p}.output.dense")
        h = b.layer_norm(b.op("Add", [f, h], hint=f"{p}.output"), layer.output.LayerNorm, f"{p}.output.LayerNorm")
    h = b.output(h, "last_hidden_state", np.float32, dims + [cfg.hidden_size])
    if model.pooler is not None:
        first = b.op("Gather", [h, b.const([0], np.int64, "index")], hint="pooler", axis=1)
        first = b.op("Squeeze", [first, b.const([1], np.int64, "axes")], hint="pooler")
        pooled = b.op("Tanh", [b.linear(first, model.pooler.dense, "pooler.dense", gemm=True)], hint="pooler")
        b.output(pooled, "pooler_output", np.float32, ["batch", cfg.hidden_size])
    return b.model("BERT encoder exported by opsnn.models.export")


# -- LLaMA ------------------------------------------------------------------------------------------------
def export_llama(model, with_past: bool = True) -> onnx.ModelProto:
    """Inputs ``input_ids``, ``position_ids`` (batch, sequence) and, ``with_past``,
    ``past_key_values.{i}.key/value`` (batch, kv_heads, past_sequence, head_dim); outputs
    ``logits`` and ``present.{i}.key/value`` (batch, kv_heads, total_sequence, head_dim)."""
    from .llama import rope_cache

    cfg = model.config
    Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    b = OnnxBuilder("llama")
    dims = ["batch", "sequence"]
    ids = b.input("input_ids", np.int64, dims)
    pos = b.input("position_ids", np.int64, dims)
    pasts = []
    if with_past:
        for i in range(cfg.num_hidden_layers):
            pasts.append(
                tuple(
                    b.input(f"past_key_values.{i}.{n}", np.float32, ["batch", Hkv, "past_sequence", D])
                    for n in ("key", "value")
                )
            )
    h = b.op(
        "Gather",
        [b.weight("model.embed_tokens.weight", model.model.embed_tokens.weight), ids],
        hint="model.embed_tokens",
    )
    # rotary tables gathered by position: (batch, 1, sequence, head_dim), halves repeated as HF
    cos, sin = rope_cache(cfg)
    axes1 = b.const([1], np.int64, "axes")
    rc = b.op(
        "Unsqueeze",
        [b.op("Gather", [b.const(np.concatenate([cos, cos], 1), hint="rope_cos"), pos], hint="rotary"), axes1],
        hint="rotary",
    )
    rs = b.op(
        "Unsqueeze",
        [b.op("Gather", [b.const(np.concatenate([sin, sin], 1), hint="rope_sin"), pos], hint="rotary"), axes1],
        hint="rotary",
    )
    # causal mask over the cache: query i (at cache position past + i) sees keys j <= past + i;
    # positions are slices of an arange table (1-D starts/ends, no 0-d scalars)
    seq = b.op("Shape", [ids], hint="mask", start=1, end=2)
    past_len = (
        b.op("Shape", [pasts[0][0]], hint="mask", start=2, end=3) if with_past else b.const([0], np.int64, "zero")
    )
    total = b.op("Add", [seq, past_len], hint="mask")
    table = b.const(np.arange(cfg.max_position_embeddings), np.int64, "cache_positions")
    axes0 = b.const([0], np.int64, "axes0")
    kpos = b.op("Slice", [table, b.const([0], np.int64, "zero"), total, axes0], hint="mask")
    qpos = b.op("Slice", [table, past_len, total, axes0], hint="mask")
    later = b.op(
        "Greater",
        [b.op("Unsqueeze", [kpos, axes0], hint="mask"), b.op("Unsqueeze", [qpos, axes1], hint="mask")],
        hint="mask",
    )
    mask = b.op("Where", [later, b.const(_F32_MIN, hint="neg"), b.const(0.0, hint="zero_f")], hint="mask")
    half_lo, half_hi = b.const([0], np.int64, "starts"), b.const([D // 2], np.int64, "half")
    end, axes3 = b.const([D], np.int64, "ends"), b.const([3], np.int64, "axes3")

    def rope(x, hint):
        x1 = b.op("Slice", [x, half_lo, half_hi, axes3], hint=hint)
        x2 = b.op("Slice", [x, half_hi, end, axes3], hint=hint)
        rot = b.op("Concat", [b.op("Neg", [x2], hint=hint), x1], hint=hint, axis=-1)
        return b.op("Add", [b.op("Mul", [x, rc], hint=hint), b.op("Mul", [rot, rs], hint=hint)], hint=hint)

    def repeat_kv(x, hint):
        if Hq == Hkv:
            return x
        y = b.op("Unsqueeze", [x, b.const([2], np.int64, "axes2")], hint=hint)
        y = b.op("Tile", [y, b.const([1, 1, Hq // Hkv, 1, 1], np.int64, "repeats")], hint=hint)
        return b.op("Reshape", [y, b.const([0, Hq, -1, D], np.int64, "shape")], hint=hint)

    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}"
        at = layer.self_attn
        x = b.rms_norm(h, layer.input_layernorm, f"{p}.input_layernorm")
        q = rope(
            b.split_heads(b.linear(x, at.q_proj, f"{p}.self_attn.q_proj"), Hq, D, f"{p}.self_attn"),
            f"{p}.self_attn.rotary_q",
        )
        k = rope(
            b.split_heads(b.linear(x, at.k_proj, f"{p}.self_attn.k_proj"), Hkv, D, f"{p}.self_attn"),
            f"{p}.self_attn.rotary_k",
        )
        v = b.split_heads(b.linear(x, at.v_proj, f"{p}.self_attn.v_proj"), Hkv, D, f"{p}.self_attn")
        if with_past:
            k = b.op("Concat", [pasts[i][0], k], hint=f"{p}.self_attn.cache", axis=2)
            v = b.op("Concat", [pasts[i][1], v], hint=f"{p}.self_attn.cache", axis=2)
        k = b.output(k, f"present.{i}.key", np.float32, ["batch", Hkv, "total_sequence", D])
        v = b.output(v, f"present.{i}.value", np.float32, ["batch", Hkv, "total_sequence", D])
        y = b.attention(
            q,
            repeat_kv(k, f"{p}.self_attn.repeat_k"),
            repeat_kv(v, f"{p}.self_attn.repeat_v"),
            mask,
            D,
            f"{p}.self_attn",
        )
        y = b.linear(b.merge_heads(y, Hq * D, f"{p}.self_attn"), at.o_proj, f"{p}.self_attn.o_proj")
        h = b.op("Add", [h, y], hint=p)
        x = b.rms_norm(h, layer.post_attention_layernorm, f"{p}.post_attention_layernorm")
        g = b.silu(b.linear(x, layer.mlp.gate_proj, f"{p}.mlp.gate_proj"), f"{p}.mlp.act")
        u = b.linear(x, layer.mlp.up_proj, f"{p}.mlp.up_proj")
        h = b.op(
            "Add",
            [h, b.linear(b.op("Mul", [g, u], hint=f"{p}.mlp"), layer.mlp.down_proj, f"{p}.mlp.down_proj")],
            hint=p,
        )
    h = b.rms_norm(h, model.model.norm, "model.norm")
    if model.lm_head is None:  # tied: MatMul against the transposed embedding table
        wt = b.op(
            "Transpose",
            [b.weight("model.embed_tokens.weight", model.model.embed_tokens.weight)],
            hint="lm_head",
            perm=[1, 0],
        )
        logits = b.op("MatMul", [h, wt], hint="lm_head")
    else:
        logits = b.linear(h, model.lm_head, "lm_head")
    b.output(logits, "logits", np.float32, dims + [cfg.vocab_size])
    # graph outputs in the usual order: logits first
    b.outputs.insert(0, b.outputs.pop())
    return b.model("LLaMA causal LM exported by opsnn.models.export")


# -- UNet block ------------------------------------------------------------------------------------------
def export_unet_block(model) -> onnx.ModelProto:
    b = OnnxBuilder("unet_block")
    x = b.input("sample", np.float32, ["batch", model.in_channels, "height", "width"])
    ctx = b.input("encoder_hidden_states", np.float32, ["batch", "context_sequence", model.context_dim])
    temb = b.input("temb", np.float32, ["batch", model.temb_channels]) if model.temb_channels else None

    def resnet(x, r, p):
        h = b.conv(b.silu(b.group_norm(x, r.norm1, f"{p}.norm1"), p), r.conv1, f"{p}.conv1")
        if r.time_emb_proj is not None:
            t = b.linear(b.silu(temb, p), r.time_emb_proj, f"{p}.time_emb_proj", gemm=True)
            h = b.op("Add", [h, b.op("Unsqueeze", [t, b.const([2, 3], np.int64, "axes23")], hint=p)], hint=p)
        h = b.conv(b.silu(b.group_norm(h, r.norm2, f"{p}.norm2"), p), r.conv2, f"{p}.conv2")
        sc = x if r.conv_shortcut is None else b.conv(x, r.conv_shortcut, f"{p}.conv_shortcut")
        return b.op("Add", [sc, h], hint=p)

    def attn(x, c, a, p):
        heads = a.heads
        c = x if c is None else c
        C = a.to_q.out_features
        D = C // heads
        q = b.split_heads(b.linear(x, a.to_q, f"{p}.to_q"), heads, D, p)
        k = b.split_heads(b.linear(c, a.to_k, f"{p}.to_k"), heads, D, p)
        v = b.split_heads(b.linear(c, a.to_v, f"{p}.to_v"), heads, D, p)
        y = b.merge_heads(b.attention(q, k, v, None, D, p), C, p)
        return b.linear(y, a.to_out[0], f"{p}.to_out.0")

    def transformer(x, t, p):
        C = t.channels
        h = b.op("Transpose", [b.group_norm(x, t.norm, f"{p}.norm")], hint=p, perm=[0, 2, 3, 1])
        h = b.linear(b.op("Reshape", [h, b.const([0, -1, C], np.int64, "shape")], hint=p), t.proj_in, f"{p}.proj_in")
        for j, blk in enumerate(t.transformer_blocks):
            q = f"{p}.transformer_blocks.{j}"
            h = b.op("Add", [attn(b.layer_norm(h, blk.norm1, f"{q}.norm1"), None, blk.attn1, f"{q}.attn1"), h], hint=q)
            h = b.op("Add", [attn(b.layer_norm(h, blk.norm2, f"{q}.norm2"), ctx, blk.attn2, f"{q}.attn2"), h], hint=q)
            n = b.layer_norm(h, blk.norm3, f"{q}.norm3")
            geglu = blk.ff.net[0]
            hid, gate = b.op(
                "Split",
                [b.linear(n, geglu.proj, f"{q}.ff.net.0.proj"), b.const([geglu.inner, geglu.inner], np.int64, "split")],
                outputs=2,
                hint=f"{q}.ff",
                axis=-1,
            )
            f = b.op("Mul", [hid, b.gelu(gate, f"{q}.ff")], hint=f"{q}.ff")
            h = b.op("Add", [b.linear(f, blk.ff.net[2], f"{q}.ff.net.2"), h], hint=q)
        h = b.linear(h, t.proj_out, f"{p}.proj_out")
        bhw = b.op("Gather", [b.op("Shape", [x], hint=p), b.const([0, 2, 3], np.int64, "dims_bhw")], hint=p, axis=0)
        shape = b.op("Concat", [bhw, b.const([C], np.int64, "channels")], hint=p, axis=0)
        h = b.op("Transpose", [b.op("Reshape", [h, shape], hint=p)], hint=p, perm=[0, 3, 1, 2])
        return b.op("Add", [h, x], hint=p)

    h = resnet(x, model.resnets[0], "resnets.0")
    h = transformer(h, model.attentions[0], "attentions.0")
    h = resnet(h, model.resnets[1], "resnets.1")
    b.output(h, "out_sample", np.float32, ["batch", model.out_channels, "height", "width"])
    return b.model("Stable-Diffusion-style UNet block exported by opsnn.models.export")


# -- dispatch ----------------------------------------------------------------------------------------------
def to_onnx(model, path=None, **options) -> onnx.ModelProto:
    """Export a model built by ``opsnn.models`` (ResNet, BertModel, LlamaForCausalLM,
    UNetBlock) to an ONNX ModelProto (opset 17); with ``path``, also save it there.
    ``options``: ``with_past`` for LLaMA."""
    kind = type(model).__name__
    exporters = {
        "ResNet": export_resnet,
        "BertModel": export_bert,
        "LlamaForCausalLM": export_llama,
        "UNetBlock": export_unet_block,
    }
    if kind not in exporters:
        raise ParamInvalidError(f"to_onnx: no exporter for {kind}; supported: {sorted(exporters)}")
    proto = exporters[kind](model, **options)
    if path is not None:
        path = os.fspath(path)
        onnx.save(proto, path)
    return proto


__all__ = ["OPSET", "OnnxBuilder", "export_bert", "export_llama", "export_resnet", "export_unet_block", "to_onnx"]
