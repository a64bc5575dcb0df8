"""The lowered training graphs of a small ResNet-style CNN take opsnn's own training records: each
training batch norm one BatchNormalization (the ReLU after it fused in, relu=1), each batch norm
backward one BatchNormalizationGrad (the ReLU's threshold_backward fused in), no copies of saved
activations, no saved statistics; losses, gradients, parameters and running statistics after three
SGD steps match torch eager's (the oracle) within float32 tolerance."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opsnn.frontends import torch as fe  # noqa: E402
from opsnn.frontends.torch import aten as fe_aten  # noqa: E402

F = torch.nn.functional
RTOL = 1e-4  # relative to the largest value: float32 sums in another order, statistics in float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _Net(torch.nn.Module):
    """Stem conv-BN-ReLU-maxpool, one basic block with a 1x1 downsample, global pool, linear: three
    batch norms, two of them followed by a ReLU (one BN's output meets the residual first)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 12, 3, 2, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(12)
        self.conv3 = torch.nn.Conv2d(12, 12, 3, 1, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(12)
        self.down = torch.nn.Conv2d(8, 12, 1, 2, bias=False)
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        h = self.bn3(self.conv3(F.relu(self.bn2(self.conv2(x)))))
        x = F.relu(h + self.down(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _nodes(report, graph: str) -> list:
    return [n for name, _, cg in report.partitions if name.startswith(graph + ".") for n in cg.graph.nodes]


def _program(node) -> list:
    return json.loads(node.attrs["program"])


def _aten_ops(report, graph: str) -> Counter:
    return Counter(op for name, ops, _ in report.partitions if name.startswith(graph + ".") for op in ops)


def _close(got, want, what):
    scale = float(want.abs().max()) or 1.0
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=what)


def test_cnn_train_step_lowers_to_fused_records_and_matches_eager():
    torch.manual_seed(0)
    model = _Net()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, 12, 12)
    y = torch.randint(0, 5, (4,))
    reports = []

    def be(gm, example_inputs):
        run, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return run

    def loss_of(m):
        return lambda x, y: F.cross_entropy(m(x), y)

    compiled = torch.compile(loss_of(model), backend=be, dynamic=False)
    eager = loss_of(twin)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    for step in range(3):
        losses = []
        for fn, opt in zip((compiled, eager), opts):
            opt.zero_grad()
            loss = fn(x, y)
            loss.backward()
            losses.append(loss.detach())
        _close(losses[0], losses[1], f"loss at step {step}")
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            _close(p.grad, q.grad, f"gradient of {name} at step {step}")
        for opt in opts:
            opt.step()
    for (name, b), c in zip(model.named_buffers(), twin.buffers()):
        if b.is_floating_point():
            _close(b, c, f"buffer {name}")
        else:
            assert int(b) == int(c) == 3, name

    [report] = reports
    assert not report.fallbacks and not report.whole_graph_reason, str(report)
    assert {name.split(".")[0] for name in report.runs} == {"forward", "backward"}
    fw, bw = _nodes(report, "forward"), _nodes(report, "backward")
    bn = [n for n in fw if n.op_type == "BatchNormalization"]
    assert len(bn) == 3 and all(int(n.attrs["training_mode"]) for n in bn)
    assert sorted(int(n.attrs.get("relu", 0)) for n in bn) == [0, 1, 1]  # bn3 meets the residual first
    # no batch norm from reductions, no copy of a saved activation
    assert not {"ReduceMean", "Identity"} & {n.op_type for n in fw}
    assert not [op for op in _aten_ops(report, "forward") if op.startswith(("aten.alias.", "aten.clone."))]
    bn_grad = [n for n in bw if n.op_type == "BatchNormalizationGrad"]
    assert sorted(int(n.attrs.get("relu", 0)) for n in bn_grad) == [0, 1, 1]
    # the two ReLUs after a batch norm fused; the one after the residual add is a threshold_backward, one
    # ThresholdGrad step of a fused kernel (no boolean mask)
    assert not {"LessOrEqual", "Where"} & {n.op_type for n in bw}
    assert sum(s[0] == "ThresholdGrad" for n in bw if n.op_type == "FusedElementwise" for s in _program(n)) == 1
    assert sum(n.op_type in ("ConvBackwardData", "ConvBackwardWeight") for n in bw) == 7  # conv1: no dX


def test_named_batch_norm_backward_in_torch_matches_aten():
    """opsnn::batch_norm_backward as torch runs it (a partition left to torch) against ATen's op with the
    statistics torch's forward saved, the ReLU's threshold_backward before it."""
    torch.manual_seed(1)
    x = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    w, b = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    g = torch.randn(3, 4, 5, 5, dtype=torch.float64)
    aten = torch.ops.aten
    out, mean, invstd = aten.native_batch_norm(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    y = torch.relu(out)
    want = aten.native_batch_norm_backward(
        aten.threshold_backward(g, y, 0), x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True]
    )
    op = fe_aten.batch_norm_backward_op()
    got = op(g, x, w, rm, rv, True, 1e-5, [True, True, True], y)
    for a, e, what in zip(got, want, ("dX", "dScale", "dBias")):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-10, atol=1e-12, err_msg=what)
    dx_only = op(g, x, w, rm, rv, True, 1e-5, [True, False, False], None)
    assert dx_only[1].numel() == dx_only[2].numel() == 0


def test_feed_memory_answers_as_may_share_memory():
    """The outputs-alias-inputs check (one search per output) against ``np.may_share_memory`` over views
    of one buffer: strided, reversed, transposed, broadcast, empty, and arrays of their own."""
    rng = np.random.default_rng(0)
    base = np.zeros(4096, np.float32)
    grid = base[:4000].reshape(40, 100)
    views = [
        base[:10],
        base[100:300:7],
        base[::-3][:50],
        grid[5:9, 20:30],
        grid[::-2, ::5],
        grid.T[3:6],
        np.broadcast_to(base[4000:4001], (8, 8)),
        base[2000:2000],
        np.zeros(16, np.float32),
        base.view(np.uint8)[16001:16009],
    ]
    for _ in range(200):
        picked = rng.choice(len(views), size=int(rng.integers(0, 5)), replace=False)
        feeds = [views[i] for i in picked]
        memory = fe._FeedMemory(feeds)
        for a in views:
            assert memory.overlaps(a) == any(np.may_share_memory(a, f) for f in feeds), (picked, a.shape)


def test_only_statistics_a_forward_saved_are_dropped():
    """The joint-graph rewrite takes a batch norm backward whose mean and 1/std a batch norm of the same
    input and eps saved (its threshold_backward folded in); statistics from elsewhere, or another eps,
    keep ATen's op, which reads them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten
    mask = [True, True, True]

    def from_forward(x, w, b, rm, rv, g, eps_bw):
        y, mean, invstd, _, _ = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)
        r = torch.relu(y)
        return aten.native_batch_norm_backward(
            aten.threshold_backward(g, r, 0), x, w, rm, rv, mean, invstd, True, eps_bw, mask
        )

    def own_statistics(x, w, b, rm, rv, g, eps_bw):
        return aten.native_batch_norm_backward(g, x, w, rm, rv, rm, rv, True, eps_bw, mask)

    args = [
        torch.randn(2, 3, 4, 4),
        torch.randn(3),
        torch.randn(3),
        torch.zeros(3),
        torch.ones(3),
        torch.randn(2, 3, 4, 4),
    ]
    for fn, eps, named in ((from_forward, 1e-5, True), (from_forward, 1e-3, False), (own_statistics, 1e-5, False)):
        gm = make_fx(lambda *a, fn=fn, eps=eps: fn(*a, eps))(*args)
        fe._batch_norm_backward_unsaved(torch, gm)
        targets = {n.target for n in gm.graph.nodes}
        assert (fe_aten.batch_norm_backward_op() in targets) is named, (fn.__name__, eps)
        assert (aten.native_batch_norm_backward.default in targets) is not named
        assert (aten.threshold_backward.default in targets) is (fn is from_forward and not named)
