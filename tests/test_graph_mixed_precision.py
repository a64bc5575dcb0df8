"""Mixed precision pass: per-op compute dtypes, shared/minimal casts, 16-bit weights, error vs fp32."""

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.graph import Graph, Node, Value


@pytest.fixture
def policy():
    yield opsnn.config.allow_mix_precision
    opsnn.config.allow_mix_precision(None)


def _mlp(rng):
    return Graph(
        "mp",
        inputs=[Value("x", np.float32, ("B", 16))],
        outputs=["y"],
        initializers={
            "w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
            "w2": rng.standard_normal((32, 8)).astype(np.float32) * 0.2,
        },
        nodes=[
            Node("MatMul", ["x", "w1"], ["h"]),
            Node("Relu", ["h"], ["r"]),
            Node("MatMul", ["r", "w2"], ["m"]),
            Node("Softmax", ["m"], ["y"], {"axis": -1}),
        ],
    )


def test_policy_sets_compute_dtypes_and_keeps_error_small(rng, policy):
    g = _mlp(rng)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    ref = opsnn.compile(g).run({"x": x})["y"].numpy()
    policy({"MatMul": "float16", "Softmax": "bfloat16"})
    cg = opsnn.compile(g)
    casts = [n for n in cg.graph.nodes if n.op_type == "Cast"]
    assert len(casts) == 3  # x -> f16, f16 -> bf16 before Softmax, output back to f32: no round trips
    weights = [a for a in cg.graph.initializers.values() if a.ndim == 2]
    assert all(a.dtype == np.float16 for a in weights)
    assert sum(a.nbytes for a in weights) == sum(a.nbytes for a in g.initializers.values()) // 2
    y = cg.run({"x": x})["y"].numpy()
    assert y.dtype == np.float32
    err = np.abs(y - ref).max()
    assert err < 1e-2, f"mixed precision error {err}"


def test_listed_fp32_ops_stay_fp32(rng, policy):
    policy({"MatMul": "float16", "Softmax": "float32"})
    cg = opsnn.compile(_mlp(rng))
    sm = next(n for n in cg.graph.nodes if n.op_type == "Softmax")
    producer = {o: n for n in cg.graph.nodes for o in n.outputs}[sm.inputs[0]]
    assert producer.op_type == "Cast" and producer.attrs["to"] == 1


def test_policy_validation(policy):
    with pytest.raises(ParamInvalidError, match="unknown op type"):
        policy({"MatMull": "float16"})
    with pytest.raises(ParamInvalidError, match="floats"):
        policy({"MatMul": "int8"})
    policy({"LayerNorm": "float32"})  # aliases accepted


def test_policy_reaches_nodes_after_shape_computations(rng, policy):
    # an exported BERT computes its position ids from Shape(input_ids): symbolic inference cannot
    # size what follows, and the pass used to skip every such node (the whole model stayed fp32)
    from opsnn.models import bert, to_onnx

    proto = to_onnx(bert("tiny")).SerializeToString()
    feeds = {
        "input_ids": rng.integers(0, 100, (1, 12)).astype(np.int64),
        "attention_mask": np.ones((1, 12), np.int64),
        "token_type_ids": np.zeros((1, 12), np.int64),
    }
    names = {v.name for v in opsnn.onnx.load(proto).inputs}
    feeds = {k: v for k, v in feeds.items() if k in names}
    ref = opsnn.compile(opsnn.onnx.load(proto)).run(feeds)
    policy({"MatMul": "float16", "Gemm": "float16"})
    cg = opsnn.compile(opsnn.onnx.load(proto))
    products = [n for n in cg.graph.nodes if n.op_type in ("FusedMatMul", "MatMul", "Gemm")]
    weights = [cg.graph.initializers[i] for n in products for i in n.inputs if i in cg.graph.initializers]
    assert products and weights and all(a.dtype == np.float16 for a in weights)
    out = cg.run(feeds)
    for k, r in ref.items():
        y, r = out[k].numpy(), r.numpy()
        assert y.dtype == np.float32
        assert np.abs(y.astype(np.float64) - r).max() / np.abs(r).max() < 2e-2
