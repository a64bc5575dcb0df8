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
    return Graph("mp", inputs=[Value("x", np.float32, ("B", 16))], outputs=["y"],
                 initializers={"w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
                               "w2": rng.standard_normal((32, 8)).astype(np.float32) * 0.2},
                 nodes=[Node("MatMul", ["x", "w1"], ["h"]), Node("Relu", ["h"], ["r"]),
                        Node("MatMul", ["r", "w2"], ["m"]), Node("Softmax", ["m"], ["y"], {"axis": -1})])


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
