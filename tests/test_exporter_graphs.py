"""Graphs as other exporters write them optimize like opsnn's builder export: a small
ResNet (stem, max pool, a bottleneck with a projected and one with an identity residual, the
classifier head) written the builder's way (``opsnn.models.export``: Conv, BatchNormalization,
Relu, Add, GlobalAveragePool, Flatten, Gemm) and, one pattern at a time, the way ONNX's zoo
(opset 9, residuals as ``Sum``) and torch.onnx (explicit default attributes, ReduceMean head,
Reshape instead of Flatten, ...) write it. Each variant must optimize to the builder's node
types and count, and agree with onnxruntime (onnx.reference's opset-9 BatchNormalization is
off by ~0.15 on unit data, so it is no oracle for the zoo's opset)."""

import numpy as np
import pytest

import opsnn

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

ort = pytest.importorskip("onnxruntime")

C, CLASSES = 16, 10


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


class _Net:
    """Writes the small ResNet node by node; ``style`` picks how each pattern is written."""

    def __init__(self, style: str, rng):
        self.style, self.rng = style, rng
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, hint):
        self.n += 1
        return f"{hint}_{self.n}"

    def init(self, hint, a):
        nm = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(a), nm))
        return nm

    def op(self, op, ins, **attrs):
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv_bn(self, x, cin, cout, k, stride=1, relu=True):
        pad = k // 2
        ins = [x, self.init("w", _f32(self.rng, cout, cin, k, k, scale=1.0 / np.sqrt(cin * k * k)))]
        attrs = dict(kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2)
        if self.style == "torch_attrs":  # torch writes every attribute, defaults included
            attrs.update(dilations=[1, 1], group=1, auto_pad="NOTSET")
        if self.style == "conv_bias":  # zoo models: a Conv bias before the BatchNormalization
            ins.append(self.init("cb", _f32(self.rng, cout, scale=0.1)))
        y = self.op("Conv", ins, **attrs)
        bn = [
            self.init("s", 1 + _f32(self.rng, cout, scale=0.1)),
            self.init("b", _f32(self.rng, cout, scale=0.1)),
            self.init("m", _f32(self.rng, cout, scale=0.1)),
            self.init("v", 1 + np.abs(_f32(self.rng, cout))),
        ]
        bn_attrs = dict(epsilon=1e-5, momentum=0.9)
        if self.style == "torch_attrs":
            bn_attrs["training_mode"] = 0
        y = self.op("BatchNormalization", [y] + bn, **bn_attrs)
        return self.op("Relu", [y]) if relu else y

    def residual(self, a, b):
        if self.style == "sum":
            y = self.op("Sum", [a, b])
        elif self.style == "mean":
            y = self.op("Mean", [a, b])
        elif self.style == "add_half":  # the builder's equivalent of Mean
            y = self.op("Mul", [self.op("Add", [a, b]), self.init("half", np.array(0.5, np.float32))])
        elif self.style == "add_div2":  # (a + b) / 2
            y = self.op("Div", [self.op("Add", [a, b]), self.init("two", np.array(2.0, np.float32))])
        else:
            y = self.op("Add", [a, b])
        return self.op("Relu", [y])

    def bottleneck(self, x, cin, width, cout, stride):
        y = self.conv_bn(x, cin, width, 1)
        y = self.conv_bn(y, width, width, 3, stride)
        y = self.conv_bn(y, width, cout, 1, relu=False)
        idn = x if cin == cout and stride == 1 else self.conv_bn(x, cin, cout, 1, stride, relu=False)
        return self.residual(y, idn)

    def head(self, y):
        if self.style == "reduce_mean":  # torch's adaptive_avg_pool2d((1, 1)) as a mean over H, W
            p = self.op("ReduceMean", [y], axes=[-2, -1], keepdims=1)
        elif self.style == "reduce_mean18":  # opset 18: the axes as an input (torch's dynamo exporter)
            p = self.op("ReduceMean", [y, self.init("axes", np.array([-1, -2], np.int64))], keepdims=1)
        elif self.style == "average_pool":  # the zoo's: an AveragePool over the whole (static) image
            p = self.op("AveragePool", [y], kernel_shape=[16, 16], strides=[1, 1])
        else:
            p = self.op("GlobalAveragePool", [y])
        if self.style == "reshape":  # torch's x.view(x.size(0), -1) / flatten(1) as a Reshape
            f = self.op("Reshape", [p, self.init("shape", np.array([0, -1], np.int64))])
        else:
            f = self.op("Flatten", [p], axis=1)
        w = _f32(self.rng, CLASSES, 4 * C, scale=0.2)
        b = self.init("fc_b", _f32(self.rng, CLASSES, scale=0.1))
        if self.style == "matmul_add":  # Linear as MatMul by the stored transpose, then Add
            return self.op("Add", [self.op("MatMul", [f, self.init("fc_wt", np.ascontiguousarray(w.T))]), b])
        gemm = dict(transB=1)
        if self.style == "torch_attrs":
            gemm.update(alpha=1.0, beta=1.0)
        return self.op("Gemm", [f, self.init("fc_w", w), b], **gemm)

    def model(self):
        y = self.conv_bn("x", 3, C, 7, 2)
        pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        if self.style == "torch_attrs":
            pool.update(ceil_mode=0, dilations=[1, 1])
        y = self.op("MaxPool", [y], **pool)
        y = self.bottleneck(y, C, C, 4 * C, 1)
        y = self.bottleneck(y, 4 * C, C, 4 * C, 1)
        y = self.head(y)
        self.nodes[-1].output[0] = "logits"
        opset = {"sum": 9, "conv_bias": 9, "reduce_mean18": 18}.get(self.style, 17)
        dims = ["batch", 3, "height", "width"] if self.style == "symbolic" else [1, 3, 64, 64]
        g = helper.make_graph(
            self.nodes,
            "resnet_" + self.style,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
            [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [dims[0], CLASSES])],
            self.inits,
        )
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _optimized(style, seed=0):
    proto = _Net(style, np.random.default_rng(seed)).model()
    onnx.checker.check_model(proto)
    cg = opsnn.compile(opsnn.onnx.load(proto))
    x = _f32(np.random.default_rng(1), 1, 3, 64, 64)
    got = cg.run({"x": x})["logits"].numpy()
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
    return [n.qualified_type for n in cg.graph.nodes]


@pytest.fixture(scope="module")
def builder():
    return _optimized("builder")


@pytest.mark.parametrize(
    "style",
    [
        "sum",
        "torch_attrs",
        "conv_bias",
        "reduce_mean",
        "reduce_mean18",
        "average_pool",
        "reshape",
        "matmul_add",
        "symbolic",
        "mean",
        "add_half",
        "add_div2",
    ],
)
def test_exporter_style_optimizes_like_the_builder(builder, style):
    got = _optimized(style)
    if style == "reshape":  # Reshape(x, [0, -1]) and Flatten: both a view of the same bytes
        got = ["Flatten" if t == "Reshape" else t for t in got]
    if style == "matmul_add":  # MatMul + Add(bias) fuse into one FusedMatMul where Gemm is one node
        got = ["Gemm" if t == "opsnn::FusedMatMul" else t for t in got]
    assert len(got) == len(builder) and sorted(got) == sorted(builder), (style, got, builder)


def test_mean_residual_optimizes_like_add_then_half():
    # Mean(a, b) is Add then Mul by 0.5 (x * 0.5 rounds as x / 2): as that graph written out
    assert _optimized("mean") == _optimized("add_half")


def test_mean_residual_read_by_other_ops_gets_its_true_value():
    # three Mean residual blocks: the factors compound through Relu and the next blocks' convs (the
    # second and third rescale their conv to the residual's factor); a Sigmoid, which does not commute
    # with a scale, reads the first sum, and the last block's output is a graph output: each gets
    # its true value from one Mul (2 made for 3 dropped)
    rng = np.random.default_rng(6)
    inits, nodes, x = [], [], "x"
    for k in range(3):
        w, b = _f32(rng, 8, 8, 3, 3, scale=0.2), _f32(rng, 8, scale=0.1)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes += [
            helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Mean", [f"c{k}", x], [f"s{k}"]),
            helper.make_node("Relu", [f"s{k}"], [f"r{k}"]),
        ]
        x = f"r{k}"
    nodes.append(helper.make_node("Sigmoid", ["s0"], ["g"]))
    shape = [1, 8, 6, 6]
    g = helper.make_graph(
        nodes,
        "mean_readers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("r2", "g")],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cg = opsnn.compile(opsnn.onnx.load(proto))
    log = cg.pass_report.by_name("residual_scale_folding").log
    assert sum("true value" in line for line in log) == 2 and sum("folded" in line for line in log) == 3, log
    xv = _f32(rng, *shape)
    got = cg.run({"x": xv})
    for name, ref in zip(("r2", "g"), ReferenceEvaluator(proto).run(None, {"x": xv})):
        np.testing.assert_allclose(got[name].numpy(), ref, rtol=1e-5, atol=1e-5, err_msg=name)
    # with the Sigmoid on the second sum too, restoring would cost as many Muls as it drops: refused
    g.node.append(helper.make_node("Sigmoid", ["s1"], ["g1"]))
    g.output.append(helper.make_tensor_value_info("g1", TensorProto.FLOAT, shape))
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cg = opsnn.compile(opsnn.onnx.load(proto))
    report = cg.pass_report.by_name("residual_scale_folding")
    assert report.changes == 0 and report.refused, report


def test_sum_of_three_and_mean_of_three_match_onnx_reference():
    rng = np.random.default_rng(2)
    a, b, c = (_f32(rng, 2, 3, 4) for _ in range(3))
    for op in ("Sum", "Mean"):
        nodes = [helper.make_node(op, ["a", "b", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4]) for n in "abc"]
        proto = helper.make_model(
            helper.make_graph(nodes, "g", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])]),
            opset_imports=[helper.make_opsetid("", 13)],
        )
        cg = opsnn.compile(opsnn.onnx.load(proto))
        assert op not in [n.op_type for n in cg.graph.nodes]
        got = cg.run({"a": a, "b": b, "c": c})["y"].numpy()
        want = ReferenceEvaluator(proto).run(None, {"a": a, "b": b, "c": c})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_opset9_softmax_on_a_graph_output_leaves_no_reshape():
    # before opset 13 Softmax flattened to 2-D: the importer writes Shape, Flatten, Softmax,
    # Reshape; on a 2-D Gemm output (the zoo's head) all but the Softmax are no-ops, the
    # Reshape's output being the graph's: the Softmax then writes it
    rng = np.random.default_rng(3)
    w, b = _f32(rng, 10, 8), _f32(rng, 10)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    g = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=8)
    cg = opsnn.compile(opsnn.onnx.load(proto))
    assert [n.op_type for n in cg.graph.nodes] == ["Gemm", "Softmax"], [n.op_type for n in cg.graph.nodes]
    x = _f32(rng, 2, 8)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(cg.run({"x": x})["prob"].numpy(), want, rtol=1e-5, atol=1e-6)


# -- ResNets exported by torch.onnx.export itself ------------------------------------------------------------
_TORCH_EXPORTS = {
    # TorchScript exporter: BatchNorm folded by torch, Identity nodes for shared zero biases,
    # GlobalAveragePool + Flatten + Gemm head, every default attribute written out
    "torchscript": dict(dynamo=False),
    # without torch's constant folding: a BatchNormalization after every Conv, as torch writes it
    "torchscript_bn": dict(dynamo=False, do_constant_folding=False),
    # torch 2.13's default (dynamo) exporter at its opset 18: ReduceMean(axes input) + Reshape head
    "dynamo": dict(dynamo=True),
    # the dynamo exporter without its optimizer: each Conv's zero bias as Expand(CastLike(0, x),
    # Shape(w)[:1]) and a BatchNormalization after every Conv
    "dynamo_unoptimized": dict(dynamo=True, optimize=False),
}


@pytest.fixture(scope="module")
def torch_resnet():
    """A bottleneck ResNet ([2, 1, 1, 1]: identity and projected residuals, every stage) as
    opsnn's builder exports it, and as torchvision's module with random BatchNorm statistics."""
    torch = pytest.importorskip("torch")
    from opsnn.cli import bench_module
    from opsnn.models.resnet import Bottleneck, ResNet
    from opsnn.nn import init

    peers = bench_module("peers")
    if peers is None:
        pytest.skip("bench/peers.py is not next to the source tree")
    torch.manual_seed(0)
    with init.seeded(0):
        model = ResNet(Bottleneck, [2, 1, 1, 1], num_classes=CLASSES)
    net = peers.torchvision_resnet(model, torch)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(1 + 0.1 * torch.randn(c))
                m.bias.copy_(0.1 * torch.randn(c))
                m.running_mean.copy_(0.1 * torch.randn(c))
                m.running_var.copy_(1 + torch.rand(c))
    builder = opsnn.compile(opsnn.onnx.load(opsnn.models.to_onnx(model)))
    return torch, peers, net, [n.qualified_type for n in builder.graph.nodes]


@pytest.mark.parametrize("exporter", list(_TORCH_EXPORTS))
def test_torch_exported_resnet_optimizes_like_the_builder(torch_resnet, exporter):
    torch, peers, net, builder_types = torch_resnet
    options = dict(_TORCH_EXPORTS[exporter])
    if options["dynamo"]:
        pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
    proto = peers.torch_onnx_export(net, torch, 1, 64, **options)
    cg = opsnn.compile(opsnn.onnx.load(onnx.load_from_string(proto)))
    got = [n.qualified_type for n in cg.graph.nodes]
    # Reshape(x, [0, -1]) where the builder writes Flatten: both a view of the same bytes
    got = ["Flatten" if t == "Reshape" else t for t in got]
    assert len(got) == len(builder_types) and sorted(got) == sorted(builder_types), (exporter, got, builder_types)
    x = _f32(np.random.default_rng(4), 1, 3, 64, 64)
    out = cg.run({"input": x})["logits"].numpy()
    with torch.inference_mode():
        want = net(torch.from_numpy(x)).numpy()
    peer = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(out, peer, rtol=1e-4, atol=1e-4 * scale)


def test_cast_like_of_a_constant_folds_when_the_target_dtype_is_known():
    # torch's dynamo exporter casts each scalar as CastLike(constant, activation): the activation's
    # dtype comes from the fold before it (y's Expand shape is Shape(w)[:1], known once folded)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 4)).astype(np.float64)
    nodes = [
        helper.make_node("Shape", ["w"], ["wshape"], end=1),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("CastLike", ["zero", "x"], ["half_x"]),
        helper.make_node("Expand", ["half_x", "wshape"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
        helper.make_node("CastLike", ["zero", "y"], ["half_y"]),
        helper.make_node("Mul", ["y", "half_y"], ["z"]),
    ]
    g = helper.make_graph(
        nodes,
        "castlike",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])],
        [helper.make_tensor_value_info("z", TensorProto.DOUBLE, [2, 3])],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cg = opsnn.compile(opsnn.onnx.load(proto))
    assert "CastLike" not in [n.op_type for n in cg.graph.nodes], [n.op_type for n in cg.graph.nodes]
    x = rng.standard_normal((2, 3))
    want = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    got = cg.run({"x": x})["z"].numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
