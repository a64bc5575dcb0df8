"""What the whole-graph view of a compiled training step removes: the gradient clones the tape
records (one Identity per parameter), the ReLU backward's boolean mask (Greater -> Where, one
step of a fused elementwise kernel with its neighbours, the residual gradient Add among them) and
the second read of the scores by the loss head (SoftmaxCrossEntropyLoss and its gradient as one
SoftmaxCrossEntropyLossWithGrad).

Oracles: numpy's ``where(y > 0, g, 0)`` for the fused step (exact: it selects, it rounds nothing),
a float64 numpy log-softmax for the loss head (rtol 1e-5: float32 exps summed in float64),
and opsnn's eager training step on a twin model for the compiled one (same kernels on the same
float32 data; only elementwise chains fuse, so losses and parameters agree to rtol 1e-5 / atol 1e-6
after 5 AdamW steps, as in tests/test_compiled_training.py).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.autograd.compiled import fuse_loss_heads
from opsnn.graph import compiler
from opsnn.graph.ir import Graph, Node, Value
from opsnn.ops import executor as _ex
from opsnn.ops.registry import get_op

RNG = np.random.default_rng(2031)
STEPS = 5


class _ResBlockNet(nn.Module):
    """conv-bn-relu, a residual block (conv-bn-relu-conv-bn + skip, relu), pool, linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = self.relu(self.bn0(self.stem(x)))
        r = self.bn2(self.c2(self.relu(self.bn1(self.c1(h)))))
        h = self.relu(ops.add(h, r))
        return self.fc(ops.reshape(self.pool(h), (x.shape[0], -1)))


def _build():
    with nn.init.seeded(7):
        model = _ResBlockNet().train()
    opt = optim.AdamW(list(model.parameters()), lr=1e-2, weight_decay=0.01)
    loss_fn = nn.CrossEntropyLoss()

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, train_step


def _batches():
    return [(RNG.standard_normal((4, 3, 8, 8)).astype(np.float32), RNG.integers(0, 5, size=4)) for _ in range(STEPS)]


def _programs(graph: Graph) -> list:
    return [json.loads(n.attrs["program"]) for n in graph.nodes if n.op_type == "FusedElementwise"]


def test_compiled_step_fuses_relu_backward_and_drops_gradient_clones():
    batches = _batches()
    em, estep = _build()
    cm, cstep = _build()
    step = opsnn.compile(cstep)
    elosses = [float(estep(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
    closses = [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
    assert step.num_compiles == 1 and step.compiled_graph.mode == "compiled", step.compiled_graph.mode_reason

    traced = Counter(n.op_type for n in step.graph().nodes)
    after = Counter(n.op_type for n in step.compiled_graph.graph.nodes)
    n_params = len(list(cm.parameters()))
    # the tape clones each gradient it hands a leaf (an Identity per parameter); the graph needs none
    assert traced["Identity"] >= n_params
    assert after["Identity"] == 0
    # each ReLU's backward (three of them) was a mask and a select; now a step of a fused kernel
    assert traced["Greater"] == traced["Where"] == 3
    assert after["Greater"] == after["Where"] == 0
    steps = [s[0] for prog in _programs(step.compiled_graph.graph) for s in prog]
    assert steps.count("ReluGrad") == 3
    # the skip connection's gradient sum (Add) is computed in the kernel of the block input's ReluGrad
    assert any([s[0] for s in prog][-2:] == ["Add", "ReluGrad"] for prog in _programs(step.compiled_graph.graph)), (
        _programs(step.compiled_graph.graph)
    )

    # the loss and its gradient: one kernel reading the scores once
    assert traced["SoftmaxCrossEntropyLoss"] == traced["SoftmaxCrossEntropyLossGrad"] == 1
    assert after["SoftmaxCrossEntropyLoss"] == after["SoftmaxCrossEntropyLossGrad"] == 0
    assert after["SoftmaxCrossEntropyLossWithGrad"] == 1

    np.testing.assert_allclose(closses, elosses, rtol=1e-5, atol=1e-7)
    esd, csd = em.state_dict(), cm.state_dict()  # parameters and BatchNorm's running statistics
    for name, v in csd.items():
        np.testing.assert_allclose(v.numpy(), esd[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)

    rep = step.memory_report()
    assert rep["planned_peak_bytes"] < rep["naive_bytes"]


def _relu_grad_graph(zero=0.0, threshold=0.0, mask_out=False):
    g, y = Value("g", np.float32, (3, 33)), Value("y", np.float32, (3, 33))
    nodes = [
        Node("Greater", ["y", "thr"], ["mask"], name="gt"),
        Node("Where", ["mask", "g", "zero"], ["dy"], name="where"),
        Node("Mul", ["dy", "g"], ["out"], name="mul"),  # a neighbour the step fuses with
    ]
    outputs = [Value("out", np.float32)] + ([Value("mask", np.bool_)] if mask_out else [])
    inits = {"thr": np.array(threshold, np.float32), "zero": np.array(zero, np.float32)}
    return Graph("relu_grad", inputs=[g, y], outputs=outputs, nodes=nodes, initializers=inits)


def _feeds():
    g = RNG.standard_normal((3, 33)).astype(np.float32)
    y = RNG.standard_normal((3, 33)).astype(np.float32)
    y[0, :4] = [0.0, -0.0, np.nan, np.inf]  # the mask's edges: 0 and -0 are not > 0, NaN is not
    g[1, :3] = [np.nan, np.inf, -0.0]
    y[1, :3] = 1.0  # selected: NaN, Inf and -0 pass through
    return g, y


def test_relu_backward_pair_becomes_one_fused_step_matching_numpy():
    cg = compiler.compile(_relu_grad_graph(), level=3)
    types = [n.op_type for n in cg.graph.nodes]
    assert types == ["FusedElementwise"], types
    assert [s[0] for s in _programs(cg.graph)[0]] == ["ReluGrad", "Mul"]
    g, y = _feeds()
    got = cg.run({"g": g, "y": y})["out"].numpy()
    want = (np.where(y.astype(np.float64) > 0, g.astype(np.float64), 0.0) * g).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    ok = ~np.isnan(want)  # unselected elements are +0 (Where's zero), so 0 * -g is -0 as unfused
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


@pytest.mark.parametrize(
    "variant",
    [dict(zero=1.0), dict(zero=-0.0), dict(threshold=0.5), dict(mask_out=True)],
    ids=["select_not_zero", "negative_zero", "threshold_not_zero", "mask_is_an_output"],
)
def test_other_select_patterns_keep_greater_and_where(variant):
    graph = _relu_grad_graph(**variant)
    cg = compiler.compile(graph, level=3)
    types = Counter(n.op_type for n in cg.graph.nodes)
    assert types["Greater"] == 1 and types["Where"] == 1, types
    assert all(s[0] != "ReluGrad" for prog in _programs(cg.graph) for s in prog)
    g, y = _feeds()
    out = cg.run({"g": g, "y": y})["out"].numpy()
    zero = np.float64(variant.get("zero", 0.0))
    mask = y.astype(np.float64) > variant.get("threshold", 0.0)
    want = (np.where(mask, g.astype(np.float64), zero) * g).astype(np.float32)
    np.testing.assert_array_equal(out, want)


def test_a_plan_on_stand_in_kernels_is_rebuilt_once_they_are_compiled(monkeypatch):
    # tiered compilation: a plan built while a numba kernel compiles in the background runs its library
    # stand-in; once the workload is compiled (a finished compile moves registry.version()) the compiled
    # step's graph plans again, and the step goes on as before
    from opsnn.ops import registry, tiering

    batches = _batches()
    em, estep = _build()
    cm, cstep = _build()
    step = opsnn.compile(cstep)
    elosses = [float(estep(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
    closses = [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches[:2]]
    cg = step.compiled_graph
    assert cg.plans_built == 1
    done: set = set()
    monkeypatch.setattr(tiering, "pending", lambda keys: tuple(k for k in keys if k not in done))
    cg.latest_plan.stand_ins = ("w",)  # as if a step of the plan ran a stand-in for workload w
    closses.append(float(step(opsnn.tensor(batches[2][0]), opsnn.tensor(batches[2][1])).item()))
    registry._bump_version()  # another workload finished: w is still compiling
    closses.append(float(step(opsnn.tensor(batches[3][0]), opsnn.tensor(batches[3][1])).item()))
    assert cg.plans_built == 1 and cg.latest_plan.stand_ins == ("w",)
    done.add("w")
    registry._bump_version()  # w finished
    closses += [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches[4:]]
    assert cg.plans_built == 2 and cg.replans == 1 and step.num_compiles == 1
    assert cg.latest_plan.stand_ins == ()
    np.testing.assert_allclose(closses, elosses, rtol=1e-5, atol=1e-7)
    esd, csd = em.state_dict(), cm.state_dict()
    for name, v in csd.items():
        np.testing.assert_allclose(v.numpy(), esd[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def _xent_oracle(g, x, t, w, red, ignore):
    """float64 numpy: (loss, dScores) of cross entropy over axis 1 with class weights and ignore_index."""
    x = np.moveaxis(x.astype(np.float64), 1, -1)  # (N, ..., C)
    logp = x - x.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    valid = t != ignore
    safe = np.where(valid, t, 0)
    wt = np.where(valid, (np.ones(x.shape[-1]) if w is None else w.astype(np.float64))[safe], 0.0)
    picked = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    per = np.where(valid, -picked, 0.0) * wt
    loss = per if red == "none" else per.sum() if red == "sum" else per.sum() / wt.sum()
    coef = wt * (g.astype(np.float64) if red == "none" else float(g))
    if red == "mean":
        coef = coef / wt.sum()
    grad = np.exp(logp)
    np.put_along_axis(grad, safe[..., None], np.take_along_axis(grad, safe[..., None], -1) - 1.0, -1)
    grad = np.where(valid[..., None], grad * coef[..., None], 0.0)
    return loss, np.moveaxis(grad, -1, 1)


@pytest.mark.parametrize("red", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(6, 11), (96, 3000), (3, 5, 4)], ids=["rows", "lm_head", "spatial"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "weights"])
@pytest.mark.parametrize("threads", [1, 2])
def test_loss_with_grad_matches_float64_and_the_unfused_gradient(red, shape, weighted, threads):
    import numba

    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    t = RNG.integers(0, shape[1], (shape[0],) + shape[2:])
    t.reshape(-1)[1] = -100  # an ignored position: a zero gradient row, no loss
    w = RNG.random(shape[1]).astype(np.float32) + 0.5 if weighted else None
    g = np.asarray(RNG.standard_normal(t.shape) if red == "none" else 0.75, np.float32)
    attrs = {"reduction": red, "ignore_index": -100}
    ins = [opsnn.tensor(a) for a in (g, x, t)] + ([opsnn.tensor(w)] if weighted else [])
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # rows run in parallel with 2
    try:
        opsnn.ops.clear_cache()
        loss, dx = _ex.call(get_op("SoftmaxCrossEntropyLossWithGrad", "opsnn"), ins, dict(attrs), num_outputs=2)
        unfused = _ex.call(get_op("SoftmaxCrossEntropyLossGrad", "opsnn"), ins, dict(attrs))
    finally:
        numba.set_num_threads(before)
        opsnn.ops.clear_cache()
    want_loss, want_dx = _xent_oracle(g, x, t, w, red, -100)
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dx.numpy(), want_dx, rtol=1e-5, atol=1e-7)
    # the gradient rows are SoftmaxCrossEntropyLossGrad's kernel's, to the bit
    np.testing.assert_array_equal(dx.numpy(), unfused.numpy())


def _head_graph(log_prob_read=False, late_dloss=False, dtype=np.float32):
    scores, labels = Value("s", dtype, (4, 7)), Value("t", np.int64, (4,))
    attrs = {"reduction": "mean", "ignore_index": -100}
    loss = Node("SoftmaxCrossEntropyLoss", ["s", "t"], ["loss", "logp" if log_prob_read else ""], attrs)
    nodes = [loss]
    dl = "one"
    if late_dloss:  # a dLoss made from the loss itself
        nodes.append(Node("Mul", ["loss", "one"], ["dl"]))
        dl = "dl"
    nodes.append(Node("SoftmaxCrossEntropyLossGrad", [dl, "s", "t", ""], ["ds"], dict(attrs), domain="opsnn"))
    outs = [Value("loss", dtype), Value("ds", dtype)] + ([Value("logp", dtype)] if log_prob_read else [])
    return Graph("head", inputs=[scores, labels], outputs=outs, nodes=nodes, initializers={"one": np.ones((), dtype)})


def test_loss_head_fusion_runs_the_fused_op_and_refuses_what_it_cannot_keep():
    graph = _head_graph()
    assert fuse_loss_heads(graph) == 1
    assert [n.op_type for n in graph.nodes] == ["SoftmaxCrossEntropyLossWithGrad"]
    x = RNG.standard_normal((4, 7)).astype(np.float32)
    t = np.array([0, 6, 3, -100])
    out = compiler.compile(graph, level=3).run({"s": x, "t": t})
    want_loss, want_dx = _xent_oracle(np.float32(1), x, t, None, "mean", -100)
    np.testing.assert_allclose(out["loss"].numpy(), want_loss, rtol=1e-5)
    np.testing.assert_allclose(out["ds"].numpy(), want_dx, rtol=1e-5, atol=1e-7)
    for kw in (dict(log_prob_read=True), dict(late_dloss=True), dict(dtype=np.float16)):
        g = _head_graph(**kw)
        assert fuse_loss_heads(g) == 0, kw
        assert "SoftmaxCrossEntropyLossGrad" in [n.op_type for n in g.nodes]


def _lm_head_graph(read_scores_later: bool, spatial: bool):
    """scores = h @ w (an intermediate), the fused loss head, and dh = dScores @ w^T: dScores may take
    the scores' buffer unless something reads the scores after the loss head."""
    C = 9
    shape = (4, C, 3) if spatial else (6, C)
    h = Value("h", np.float32, shape[:1] + (5,) + shape[2:])
    labels = Value("t", np.int64, shape[:1] + shape[2:])
    attrs = {"reduction": "mean", "ignore_index": -100}
    x_in, s = ("hT", "sT") if spatial else ("h", "s")
    nodes = []
    if spatial:  # (N, 5, D) -> (N, D, 5) @ (5, C) -> (N, D, C) -> (N, C, D)
        nodes.append(Node("Transpose", ["h"], ["hT"], {"perm": [0, 2, 1]}))
    nodes.append(Node("MatMul", [x_in, "w"], [s]))
    if spatial:
        nodes.append(Node("Transpose", ["sT"], ["s"], {"perm": [0, 2, 1]}))
    nodes.append(Node("SoftmaxCrossEntropyLossWithGrad", ["one", "s", "t"], ["loss", "ds"], attrs, domain="opsnn"))
    d_in = "ds"
    if spatial:
        nodes.append(Node("Transpose", ["ds"], ["dsT"], {"perm": [0, 2, 1]}))
        d_in = "dsT"
    nodes.append(Node("MatMul", [d_in, "wT"], ["dh"]))
    outs = [Value("loss", np.float32), Value("dh", np.float32)]
    if read_scores_later:
        nodes.append(Node("Neg", ["s"], ["negs"]))
        outs.append(Value("negs", np.float32))
    w = RNG.standard_normal((5, C)).astype(np.float32)
    inits = {"w": w, "wT": np.ascontiguousarray(w.T), "one": np.ones((), np.float32)}
    return Graph("lm_head", inputs=[h, labels], outputs=outs, nodes=nodes, initializers=inits), w, shape


@pytest.mark.parametrize("spatial", [False, True], ids=["rows", "spatial"])
@pytest.mark.parametrize("read_scores_later", [False, True], ids=["dead_scores", "scores_read_later"])
def test_the_fused_loss_heads_gradient_takes_the_scores_buffer_where_they_are_dead(read_scores_later, spatial):
    graph, w, shape = _lm_head_graph(read_scores_later, spatial)
    h = RNG.standard_normal(shape[:1] + (5,) + shape[2:]).astype(np.float32)
    t = RNG.integers(0, shape[1], shape[:1] + shape[2:])
    t.reshape(-1)[1] = -100
    h.reshape(-1)[0] = np.inf  # an infinite score row: NaN probabilities, as the unfused kernels give them
    cg = opsnn.compile(graph, disabled_passes=["elementwise_fusion", "epilogue_fusion"])
    out = cg.run({"h": h, "t": t})
    with np.errstate(invalid="ignore"):
        scores = np.moveaxis(np.moveaxis(h, 1, -1) @ w, -1, 1) if spatial else h @ w
        want_loss, want_ds = _xent_oracle(np.float32(1), scores, t, None, "mean", -100)
        want_dh = np.moveaxis(want_ds, 1, -1) @ w.T if spatial else want_ds @ w.T  # (N, D, 5) / (N, 5)
    np.testing.assert_allclose(out["loss"].numpy(), want_loss, rtol=1e-5)
    np.testing.assert_allclose(out["dh"].numpy(), want_dh, rtol=1e-4, atol=1e-5)
    if read_scores_later:
        np.testing.assert_allclose(out["negs"].numpy(), -scores, rtol=1e-5, atol=1e-6)
    aliases = cg.plans[0].memory.aliases
    assert (aliases.get("ds") == "s") != read_scores_later, aliases
    again = cg.run({"h": 2 * h, "t": t})  # the plan replayed: the scores are written afresh before the head
    with np.errstate(invalid="ignore"):
        want_loss2, _ = _xent_oracle(np.float32(1), 2 * scores, t, None, "mean", -100)
    np.testing.assert_allclose(again["loss"].numpy(), want_loss2, rtol=1e-5)
