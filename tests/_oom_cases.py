"""Single-node ONNX models whose outputs grow with a small constant (``D``): the allocation cases of
tests/test_runtime_reliability.py, run in a subprocess that watches its own RSS."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _model(node, inits, out_type=TensorProto.FLOAT, opset=18):
    g = helper.make_graph(
        [node],
        node.op_type.lower(),
        [],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def cases(D: int) -> dict:
    """{name: ModelProto}; each output holds about D*D elements (float32 unless stated)."""
    one = np.ones((1, 1), np.float32)
    img = np.ones((1, 1, 2, 2), np.float32)
    mk = helper.make_node
    return {
        "ConstantOfShape": _model(mk("ConstantOfShape", ["s"], ["y"]), {"s": np.array([D, D], np.int64)}),
        "Expand": _model(mk("Expand", ["x", "s"], ["y"]), {"x": one, "s": np.array([D, D], np.int64)}),
        "Tile": _model(mk("Tile", ["x", "r"], ["y"]), {"x": one, "r": np.array([D, D], np.int64)}),
        "Pad": _model(mk("Pad", ["x", "p"], ["y"]), {"x": one, "p": np.array([0, 0, D - 1, D - 1], np.int64)}),
        "Pad-1d-edge": _model(
            mk("Pad", ["x", "p"], ["y"], mode="edge"),
            {"x": np.ones(1, np.float32), "p": np.array([0, D * D - 1], np.int64)},
        ),
        "Resize-nearest": _model(
            mk("Resize", ["x", "", "", "s"], ["y"]), {"x": img, "s": np.array([1, 1, D, D], np.int64)}
        ),
        "Resize-linear": _model(
            mk("Resize", ["x", "", "", "s"], ["y"], mode="linear"), {"x": img, "s": np.array([1, 1, D, D], np.int64)}
        ),
        "Range": _model(
            mk("Range", ["a", "b", "c"], ["y"]),
            {"a": np.array(0, np.float32), "b": np.array(float(D) * D, np.float32), "c": np.array(1, np.float32)},
        ),
        "OneHot": _model(
            mk("OneHot", ["i", "d", "v"], ["y"]),
            {"i": np.array([0], np.int64), "d": np.array(D * D, np.int64), "v": np.array([0, 1], np.float32)},
        ),
        "CenterCropPad": _model(mk("CenterCropPad", ["x", "s"], ["y"]), {"x": one, "s": np.array([D, D], np.int64)}),
        "RandomNormal": _model(mk("RandomNormal", [], ["y"], shape=[D, D], seed=1.0), {}),
        "RandomUniform": _model(mk("RandomUniform", [], ["y"], shape=[D, D], seed=1.0), {}),
        "MelWeightMatrix": _model(
            mk("MelWeightMatrix", ["n", "l", "r", "lo", "hi"], ["y"]),
            {
                "n": np.array(D, np.int64),
                "l": np.array(2 * D - 2, np.int64),
                "r": np.array(16000, np.int64),
                "lo": np.array(0, np.float32),
                "hi": np.array(8000, np.float32),
            },
        ),
        "ConvTranspose": _model(
            mk("ConvTranspose", ["x", "w"], ["y"], strides=[D, D]), {"x": img, "w": np.ones((1, 1, 1, 1), np.float32)}
        ),
    }


def sparse_model(D: int):
    vals = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    idx = numpy_helper.from_array(np.array([3], np.int64), "w_idx")
    sp = helper.make_sparse_tensor(vals, idx, [D, D])
    g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "sparse",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        sparse_initializer=[sp],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def run(model):
    """Load, compile and run ``model``; returns the output as numpy."""
    import opsnn

    cg = opsnn.compile(opsnn.onnx.load(model))
    out = cg.run({})
    return out["y"].numpy() if isinstance(out, dict) else out[0].numpy()


if __name__ == "__main__":  # python _oom_cases.py D cap_bytes: one line per case, then the RSS growth
    import resource
    import sys

    import opsnn

    D, cap = int(sys.argv[1]), (int(sys.argv[2]) or None)
    small = cases(2)
    for m in small.values():  # warm: compile every kernel, so the RSS below is the cases' own
        run(m)
    opsnn.memory.set_cap(cap)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for name, m in list(cases(D).items()) + [("sparse-initializer", sparse_model(D))]:
        try:
            run(m)
            res = "ok"
        except Exception as exc:  # noqa: BLE001 - reported to the test, which names what it expects
            res = type(exc).__name__ + " " + str(exc).replace("\n", " ")[:300]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        print(f"{name}\t{peak}\t{res}", flush=True)
    print("rss_growth", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
