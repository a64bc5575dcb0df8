"""Sibling products (BERT's Q, K, V projections): FusedMatMuls reading one input with constant weights
run as one wider product and a Split where the kernel-library rule says so (oneDNN's brgemm matmul,
AVX-512), checked against a float64 numpy oracle; what stays apart and why."""

import numpy as np
import pytest

import opsnn
from opsnn.graph import Graph, Node, Value
from opsnn.kernels.cpu import libraries as KL


def _graph(rng, acts=("", "", ""), residual=False):
    """x (1, 16, 32) -> three MatMul + bias (N = 24, 24, 40), each with its activation; the last one
    optionally adds a residual r."""
    inits, nodes, outs = {}, [], []
    for i, (n, act) in enumerate(zip((24, 24, 40), acts)):
        inits[f"w{i}"] = (rng.standard_normal((32, n)) * 0.2).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(n).astype(np.float32)
        nodes += [Node("MatMul", ["x", f"w{i}"], [f"m{i}"]), Node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        last = f"a{i}"
        if residual and i == 2:
            nodes.append(Node("Add", [last, "r"], [f"z{i}"]))
            last = f"z{i}"
        if act:
            nodes.append(Node(act, [last], [f"y{i}"]))
        else:
            nodes.append(Node("Identity", [last], [f"y{i}"]))
        outs.append(f"y{i}")
    inputs = [Value("x", np.float32, (1, 16, 32))] + ([Value("r", np.float32, (1, 16, 40))] if residual else [])
    return Graph("siblings", inputs=inputs, outputs=outs, initializers=inits, nodes=nodes)


def _oracle(g: Graph, feeds: dict, acts, residual=False) -> list:
    x = feeds["x"].astype(np.float64)
    res = []
    for i, act in enumerate(acts):
        y = x @ g.initializers[f"w{i}"] + g.initializers[f"b{i}"]
        if residual and i == 2:
            y = y + feeds["r"]
        res.append(np.maximum(y, 0) if act == "Relu" else y)
    return res


def _fused_products(cg) -> list:
    return [n for n in cg.graph.nodes if n.op_type == "FusedMatMul"]


def test_the_rule_fuses_where_onednn_brgemm_runs_the_products():
    for vendor in ("AuthenticAMD", "GenuineIntel"):
        for level in ("avx512", "avx512_bf16"):  # on Intel only without MKL (with it, MKL runs them)
            assert KL.sibling_products(KL.Platform.for_isa(level, vendor, mkl=vendor != "GenuineIntel")) is None
        assert "brgemm" in KL.sibling_products(KL.Platform.for_isa("avx2", vendor))
        assert "brgemm" in KL.sibling_products(KL.Platform.for_isa("avx512", vendor, onednn=False))
    assert "MKL is the GEMM library" in KL.sibling_products(KL.Platform.for_isa("avx512", "GenuineIntel"))


@pytest.mark.parametrize("fuse", [True, False])
def test_siblings_run_as_one_product_and_a_split_when_the_rule_says_so(rng, monkeypatch, fuse):
    # the rule decided here, not by this CPU: the fused graph runs on whatever kernels this CPU has
    monkeypatch.setattr(KL, "sibling_products", lambda p=None: None if fuse else "not here (test)")
    g = _graph(rng)
    feeds = {"x": rng.standard_normal((1, 16, 32)).astype(np.float32)}
    cg = opsnn.compile(g)
    products = _fused_products(cg)
    if fuse:
        assert len(products) == 1 and cg.graph.initializers[products[0].inputs[1]].shape == (32, 88)
        split = [n for n in cg.graph.nodes if n.op_type == "Split"]
        assert len(split) == 1 and split[0].outputs == ["y0", "y1", "y2"]
    else:
        assert len(products) == 3 and not any(n.op_type == "Split" for n in cg.graph.nodes)
    out = cg.run(feeds)
    for name, want in zip(("y0", "y1", "y2"), _oracle(g, feeds, ("", "", ""))):
        np.testing.assert_allclose(out[name].numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_different_activation_or_a_residual_stays_apart(rng, monkeypatch):
    monkeypatch.setattr(KL, "sibling_products", lambda p=None: None)
    for acts, residual in ((("", "", "Relu"), False), (("", "", ""), True)):
        g = _graph(rng, acts, residual)
        feeds = {"x": rng.standard_normal((1, 16, 32)).astype(np.float32)}
        if residual:
            feeds["r"] = rng.standard_normal((1, 16, 40)).astype(np.float32)
        cg = opsnn.compile(g)
        products = _fused_products(cg)
        # y0 and y1 share one product (N = 48); y2 keeps its own
        assert sorted(cg.graph.initializers[p.inputs[1]].shape[1] for p in products) == [40, 48], (acts, residual)
        out = cg.run(feeds)
        for name, want in zip(("y0", "y1", "y2"), _oracle(g, feeds, acts, residual)):
            np.testing.assert_allclose(out[name].numpy(), want, rtol=1e-5, atol=1e-5)
