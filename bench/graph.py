"""Graph engine benchmark: node counts before/after passes, arena vs naive bytes, replay host
overhead per node, compiled vs eager op-by-op, dynamic batch served from one graph family,
agreement with onnxruntime (fp32, 1e-4 relative).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/graph.py [--models mlp,resnet50,bert]

Targets (issue: Graph engine): replay overhead < 5 µs per node; compiled ResNet-50 >= 1.2x
faster than eager op by op; 60-80% fewer nodes on rewrite-heavy blocks.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np
from workloads import write_json

from opsnn.graph import Graph, Node, Value


def median_ms(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def mlp_block(hidden=768, ffn=3072, seed=0) -> Graph:
    """A transformer MLP block as an exporter writes it: decomposed LayerNorm, MatMul+Add,
    erf-Gelu, MatMul+Add, residual add."""
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)  # noqa: E731
    init = {
        "axes": np.array([-1], np.int64),
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-5, np.float32),
        "gamma": np.ones(hidden, np.float32),
        "beta": np.zeros(hidden, np.float32),
        "w1": f(hidden, ffn),
        "b1": f(ffn),
        "w2": f(ffn, hidden),
        "b2": f(hidden),
        "c": np.array(math.sqrt(2), np.float32),
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        Node("ReduceMean", ["x", "axes"], ["mu"]),
        Node("Sub", ["x", "mu"], ["d"]),
        Node("Pow", ["d", "two"], ["sq"]),
        Node("ReduceMean", ["sq", "axes"], ["var"]),
        Node("Add", ["var", "eps"], ["ve"]),
        Node("Sqrt", ["ve"], ["std"]),
        Node("Div", ["d", "std"], ["n"]),
        Node("Mul", ["n", "gamma"], ["s"]),
        Node("Add", ["s", "beta"], ["ln"]),
        Node("MatMul", ["ln", "w1"], ["h1"]),
        Node("Add", ["h1", "b1"], ["h2"]),
        Node("Div", ["h2", "c"], ["gd"]),
        Node("Erf", ["gd"], ["ge"]),
        Node("Add", ["ge", "one"], ["ga"]),
        Node("Mul", ["h2", "ga"], ["gm"]),
        Node("Mul", ["gm", "half"], ["g"]),
        Node("MatMul", ["g", "w2"], ["o1"]),
        Node("Add", ["o1", "b2"], ["o2"]),
        Node("Add", ["o2", "x"], ["y"]),
    ]
    return Graph(
        "mlp_block",
        inputs=[Value("x", np.float32, ("batch", "seq", hidden))],
        outputs=["y"],
        nodes=nodes,
        initializers=init,
    )


def replay_overhead(n_nodes: int = 512, repeat: int = 30) -> dict:
    """Host time per node of CompiledGraph.run beyond the kernels themselves (tiny tensors)."""
    nodes = [Node("Relu" if i % 2 else "Neg", [f"v{i}"], [f"v{i + 1}"]) for i in range(n_nodes)]
    g = Graph("chain", inputs=[Value("v0", np.float32, (16,))], outputs=[f"v{n_nodes}"], nodes=nodes)
    cg = opsnn.compile(g, disabled_passes=["elementwise_fusion"])
    x = np.linspace(-1, 1, 16).astype(np.float32)
    run = lambda: cg.run({"v0": x})[f"v{n_nodes}"].numpy()  # noqa: E731
    t_run = median_ms(run, repeat)
    plan = cg.plans[0]
    calls = []
    for st in plan.steps:
        ex = st.executor
        ins = [plan.tensors[n].numpy() if n in plan.tensors else x for n in st.inputs]
        outs = [plan.tensors[n].numpy() if n in plan.tensors else np.empty(16, np.float32) for n in st.outputs]
        calls.append((ex.kernel.fn, ins, outs, ex.attrs, ex.plan))

    def bare():
        for fn, ins, outs, attrs, p in calls:
            fn(ins, outs, attrs, p, None)

    t_bare = median_ms(bare, repeat)
    eager = lambda: opsnn.graph.run(g, {"v0": x})  # noqa: E731
    t_eager = median_ms(eager, max(repeat // 3, 5))
    return {
        "nodes": n_nodes,
        "compiled_run_ms": t_run,
        "bare_kernels_ms": t_bare,
        "eager_op_by_op_ms": t_eager,
        "replay_overhead_us_per_node": (t_run - t_bare) * 1e3 / n_nodes,
        "eager_overhead_us_per_node": (t_eager - t_bare) * 1e3 / n_nodes,
    }


def compare_with_ort(proto_bytes: bytes, feeds: dict, ours: dict) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(proto_bytes, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    worst = 0.0
    for name, r in zip([o.name for o in sess.get_outputs()], ref):
        o = ours[name]
        worst = max(worst, float(np.max(np.abs(o - r)) / (np.max(np.abs(r)) + 1e-12)))
    return worst


def graph_case(name: str, graph: Graph, feeds: dict, repeat: int) -> dict:
    from opsnn.graph.serialize import to_onnx

    t0 = time.perf_counter()
    cg = opsnn.compile(graph)
    compile_ms = (time.perf_counter() - t0) * 1e3
    out = {k: v.numpy() for k, v in cg.run(feeds).items()}
    mem = cg.memory_report()
    row = {
        "model": name,
        "nodes_before": cg.pass_report.nodes_before,
        "nodes_after": cg.pass_report.nodes_after,
        "node_reduction_pct": 100 * (1 - cg.pass_report.nodes_after / cg.pass_report.nodes_before),
        "compile_ms": compile_ms,
        "arena_bytes": mem.get("arena_bytes"),
        "naive_bytes": mem.get("naive_bytes"),
        "compiled_ms": median_ms(lambda: [v.numpy() for v in cg.run(feeds).values()], repeat),
        "eager_op_by_op_ms": median_ms(lambda: opsnn.graph.run(graph, feeds), max(repeat // 2, 3), warmup=1),
    }
    row["speedup_vs_eager"] = row["eager_op_by_op_ms"] / row["compiled_ms"]
    proto = to_onnx(graph).SerializeToString()
    row["max_rel_err_vs_onnxruntime"] = compare_with_ort(proto, feeds, out)
    try:
        import onnxruntime as ort

        sess = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
        row["onnxruntime_ms"] = median_ms(lambda: sess.run(None, feeds), repeat)
        row["ratio_vs_onnxruntime"] = row["compiled_ms"] / row["onnxruntime_ms"]
    except ImportError:
        pass
    return row


def dynamic_batch(rng, sizes=range(1, 9), seq: int = 128) -> dict:
    """BERT-base served at batch 1..8 (twice) from one compiled graph: one plan per batch size."""
    from workloads import build

    g, _, _ = build("bert", rng, batch=1, seq=seq)
    cg = opsnn.compile(g)
    ms = {}
    runs = 0
    for sweep in range(2):
        for b in sizes:
            feeds = {
                "input_ids": rng.integers(0, 30522, (b, seq)).astype(np.int64),
                "attention_mask": np.ones((b, seq), np.int64),
                "token_type_ids": np.zeros((b, seq), np.int64),
            }
            t0 = time.perf_counter()
            [v.numpy() for v in cg.run(feeds).values()]
            runs += 1
            if sweep == 1:
                ms[b] = (time.perf_counter() - t0) * 1e3
    return {"plans_built": cg.plans_built, "runs": runs, "ms_by_batch": ms}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,resnet50,bert")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default="bench/results/graph.json")
    args = ap.parse_args()
    opsnn.init()
    rng = np.random.default_rng(0)
    results = {"replay": replay_overhead()}
    r = results["replay"]
    print(
        f"replay: {r['nodes']} tiny nodes, compiled {r['compiled_run_ms']:.3f} ms, bare kernels "
        f"{r['bare_kernels_ms']:.3f} ms -> {r['replay_overhead_us_per_node']:.2f} µs/node host overhead "
        f"(target < 5); eager op by op {r['eager_overhead_us_per_node']:.2f} µs/node"
    )
    rows = []
    for name in args.models.split(","):
        if name == "mlp":
            g = mlp_block()
            feeds = {"x": rng.standard_normal((1, 128, 768)).astype(np.float32)}
        else:
            from workloads import build  # the model builders exported to ONNX, shared with bench/models.py

            g, feeds, _ = build(name, rng)
        rows.append(graph_case(name, g, feeds, args.repeat))
        row = rows[-1]
        print(
            f"{name}: nodes {row['nodes_before']} -> {row['nodes_after']} ({row['node_reduction_pct']:.0f}% fewer), "
            f"arena {row['arena_bytes']} B vs naive {row['naive_bytes']} B, compiled {row['compiled_ms']:.2f} ms vs "
            f"eager {row['eager_op_by_op_ms']:.2f} ms ({row['speedup_vs_eager']:.2f}x), onnxruntime "
            f"{row.get('onnxruntime_ms', float('nan')):.2f} ms (ratio {row.get('ratio_vs_onnxruntime', float('nan')):.2f}), "
            f"max rel err vs ort {row['max_rel_err_vs_onnxruntime']}"
        )
    results["models"] = rows
    if "bert" in args.models.split(","):
        results["dynamic_batch"] = dynamic_batch(rng)
        d = results["dynamic_batch"]
        print(
            f"dynamic batch (BERT-base, seq 128, batch 1..8 twice): {d['plans_built']} plans built for "
            f"{d['runs']} runs from one compiled graph; ms per batch: "
            + ", ".join(f"{b}: {t:.0f}" for b, t in d["ms_by_batch"].items())
        )
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
