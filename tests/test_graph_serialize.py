"""Compiled graphs as ONNX (round trip, opened by onnxruntime) and the persistent compile cache
reloaded by another process."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.graph.serialize import to_onnx


def _graph():
    rng = np.random.default_rng(1)
    return Graph(
        "ser",
        inputs=[Value("x", np.float32, ("N", 3, 8, 8))],
        outputs=["out"],
        initializers={
            "w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32),
            "shape": np.array([0, -1], np.int64),
        },
        nodes=[
            Node("Conv", ["x", "w", "b"], ["c"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
            Node("Relu", ["c"], ["r"]),
            Node("Reshape", ["r", "shape"], ["out"]),
        ],
    )


def test_round_trip_and_onnxruntime_agree(rng):
    ort = pytest.importorskip("onnxruntime")
    cg = opsnn.compile(_graph(), disabled_passes=["epilogue_fusion"])  # standard ops only, for onnxruntime
    proto = to_onnx(cg.graph)
    onnx.checker.check_model(proto)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    back = opsnn.compile(opsnn.onnx.load(proto.SerializeToString()))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    ours = cg.run({"x": x})["out"].numpy()
    np.testing.assert_array_equal(back.run({"x": x})["out"].numpy(), ours)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ours, rtol=1e-4, atol=1e-5)


def test_fused_graph_round_trips(rng):
    cg = opsnn.compile(_graph())
    assert any(n.domain == "opsnn" for n in cg.graph.nodes)
    back = opsnn.compile(opsnn.onnx.load(to_onnx(cg.graph).SerializeToString()))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(back.run({"x": x})["out"].numpy(), cg.run({"x": x})["out"].numpy())


def test_fused_ops_serialize_in_the_opsnn_domain(tmp_path):
    g = Graph(
        "f",
        inputs=[Value("x", np.float32, (4,))],
        outputs=["y"],
        nodes=[Node("FusedThing", ["x"], ["y"], {"alpha": 0.5, "ints": [1, 2]}, domain="opsnn")],
    )
    path = tmp_path / "f.onnx"
    opsnn.graph.serialize.save(g, str(path))
    proto = onnx.load(str(path))
    assert any(o.domain == "opsnn" for o in proto.opset_import)
    assert proto.graph.node[0].domain == "opsnn"


def test_persisted_cache_is_reused_by_another_process(tmp_path, rng):
    cache = str(tmp_path / "cache")
    cg = opsnn.compile(_graph(), cache_dir=cache)
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    expected = cg.run({"x": x})["out"].numpy()
    where = cg.persist()
    meta = json.load(open(os.path.join(where, "plans.json")))
    assert meta["shapes"] == [{"x": [3, 3, 8, 8]}]
    assert set(meta["kernels"]) == {n.name for n in cg.graph.nodes}
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import numpy as np, opsnn, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_graph_serialize import _graph
        cg = opsnn.compile(_graph(), cache_dir={cache!r})
        assert cg.loaded_from_cache and cg.num_plans == 1, (cg.loaded_from_cache, cg.num_plans)
        out = cg.run({{"x": np.load({str(tmp_path / "x.npy")!r})}})["out"].numpy()
        np.save({str(tmp_path / "y.npy")!r}, out)
        print("plans built in child:", cg.plans_built)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


def test_persisted_cache_is_keyed_by_the_mixed_precision_policy(tmp_path, rng):
    # a graph persisted in float32 must not be reloaded for a bfloat16 policy (nor the reverse)
    from opsnn.graph import mixed_precision

    cache = str(tmp_path / "cache")
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    cg = opsnn.compile(_graph(), cache_dir=cache)
    cg.run({"x": x})
    cg.persist()
    saved = mixed_precision.policy()
    try:
        opsnn.config.allow_mix_precision({"Conv": "bfloat16"})
        cg16 = opsnn.compile(_graph(), cache_dir=cache)
        assert not getattr(cg16, "loaded_from_cache", False)
        assert any(n.op_type == "Cast" for n in cg16.graph.nodes)
    finally:
        mixed_precision.set_policy(saved)
    again = opsnn.compile(_graph(), cache_dir=cache)
    assert again.loaded_from_cache and not any(n.op_type == "Cast" for n in again.graph.nodes)


def test_persisted_cache_is_keyed_by_the_blocked_layout_this_cpu_uses(tmp_path, rng, monkeypatch):
    # a graph the blocked-layout pass rewrote for nhwc or nChw16c must not be reloaded where oneDNN
    # blocks by 8 (an AVX2 CPU, ONEDNN_MAX_CPU_ISA) or is off (its BlockedConv would have no kernel)
    from opsnn.graph.blocked_layout import machine_key
    from opsnn.kernels.cpu import libraries as KL

    cache = str(tmp_path / "cache")
    cg = opsnn.compile(_graph(), cache_dir=cache)
    cg.run({"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)})
    cg.persist()
    here = machine_key()
    assert here == "plain" or here.startswith(("nChw", "nhwc"))
    other = KL.LayoutChoice(8 if not here.startswith("nChw8c") else 16, "another CPU")
    monkeypatch.setattr(KL, "conv_chain_layout", lambda: other)
    assert machine_key() != here
    assert not getattr(opsnn.compile(_graph(), cache_dir=cache), "loaded_from_cache", False)
    monkeypatch.undo()
    assert opsnn.compile(_graph(), cache_dir=cache).loaded_from_cache
