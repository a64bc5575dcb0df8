"""The torch frontend's ReLU backward and loss head run opsnn's one-pass records: threshold_backward is one
ThresholdGrad step of a fused elementwise kernel (with the residual gradient Add it reads), no boolean
mask; nll_loss_forward / nll_loss_backward run numba records (NegativeLogLikelihoodLoss's nll_numba,
NLLLossGrad) with no Not / Cast / one-hot around ignore_index.

Oracles: torch eager (threshold_backward to the bit, NaN and the threshold itself included; the gradients
of a two-block CNN within float32 tolerance), the float64 reference of NegativeLogLikelihoodLoss and
torch's nll_loss for the numba kernel."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import opsnn  # noqa: E402
from opsnn.errors import ParamInvalidError  # noqa: E402
from opsnn.frontends import torch as fe  # noqa: E402
from opsnn.kernels.cpu import xent as KX  # noqa: E402
from opsnn.ops.registry import get_op  # noqa: E402

F = torch.nn.functional
RTOL = 1e-4  # relative to the largest gradient: float32 sums in another order, statistics in float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn):
    reports = []

    def be(gm, example_inputs):
        run, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return run

    return torch.compile(fn, backend=be, dynamic=False), reports


def _nodes(report, graph: str) -> list:
    return [n for name, _, cg in report.partitions if name.startswith(graph + ".") for n in cg.graph.nodes]


def _programs(nodes) -> list:
    return [[s[0] for s in json.loads(n.attrs["program"])] for n in nodes if n.op_type == "FusedElementwise"]


def _edges():
    """g and y with threshold_backward's edges: y at the threshold, -0, NaN, +-Inf; g NaN, Inf, -0."""
    gen = torch.Generator().manual_seed(5)
    g, y = torch.randn(4, 3, 5, 5, generator=gen), torch.randn(4, 3, 5, 5, generator=gen)
    yf, gf = y.view(-1), g.view(-1)
    yf[:8] = torch.tensor([0.0, -0.0, 0.5, -1.0, float("nan"), float("inf"), -float("inf"), float("nan")])
    gf[4:12] = torch.tensor([1.5, 2.0, 3.0, float("nan"), float("inf"), -0.0, float("nan"), -0.0])
    yf[8:12] = 7.0  # selected: NaN, Inf and -0 gradients pass through
    return g, y


@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_threshold_backward_is_one_fused_step_with_torchs_nan_semantics(threshold):
    g, y = _edges()
    a, b = g * 0.5, g.flip(0)

    def f(a, b, y):  # the residual gradient sum, then the ReLU backward of the block input
        return torch.ops.aten.threshold_backward(a + b, y, threshold)

    run, reports = _compiled(f)
    got, want = run(a, b, y), f(a, b, y)
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # NaN where torch has NaN, equal elsewhere
    np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want.numpy()))
    nan_y = torch.isnan(y)
    np.testing.assert_array_equal(got[nan_y].numpy(), (a + b)[nan_y].numpy())  # g passes where y is NaN
    [report] = reports
    nodes = [n for _, _, cg in report.partitions for n in cg.graph.nodes]
    assert [n.op_type for n in nodes] == ["FusedElementwise"], [n.op_type for n in nodes]
    assert _programs(nodes) == [["Add", "ThresholdGrad"]]
    assert json.loads(nodes[0].attrs["program"])[1][2] == {"threshold": threshold}


def test_lone_threshold_backward_and_its_reference():
    """A threshold_backward with no elementwise neighbour is still one step (no LessOrEqual, no Where), and
    FusedElementwise's reference (the fuzzer's and op tests' oracle) gives torch's result too."""
    g, y = _edges()
    f = lambda g, y: torch.ops.aten.threshold_backward(g, y, 0.5)  # noqa: E731
    run, reports = _compiled(f)
    got, want = run(g, y), f(g, y)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    [report] = reports
    [node] = [n for _, _, cg in report.partitions for n in cg.graph.nodes]
    assert _programs([node]) == [["ThresholdGrad"]]
    rec = get_op("FusedElementwise", "opsnn")
    ref = rec.reference([g.numpy(), y.numpy()], rec.bind_attrs(dict(node.attrs)))
    np.testing.assert_array_equal(np.asarray(ref), want.numpy())


class _Basic(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.down is None else self.down(x)))


class _Net(torch.nn.Module):
    """The bench CNN (bench/train.py's ResNet-18 style) in small: stem conv-BN-ReLU-maxpool, an identity
    block, a downsampling block, global pool, linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.layer1 = _Basic(8, 8, 1)
        self.layer2 = _Basic(8, 12, 2)
        self.fc = torch.nn.Linear(12, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        return self.fc(F.adaptive_avg_pool2d(self.layer2(self.layer1(x)), 1).flatten(1))


def test_two_block_cnn_gradients_match_eager_on_one_pass_records():
    torch.manual_seed(0)
    model = _Net()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, 12, 12)
    y = torch.tensor([1, -100, 4, 0])  # one ignored target (cross_entropy's default ignore_index)
    loss_of = lambda m: lambda x, y: F.cross_entropy(m(x), y)  # noqa: E731
    run, reports = _compiled(loss_of(model))
    eager = loss_of(twin)
    losses = []
    for fn, m in ((run, model), (eager, twin)):
        with opsnn.profiler.profile() as prof:
            loss = fn(x, y)
            loss.backward()
        losses.append(loss.detach())
        if m is model:
            kernels = Counter((e.op, e.kernel) for e in prof.kernels)
    np.testing.assert_allclose(losses[0].numpy(), losses[1].numpy(), rtol=RTOL)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        scale = float(q.grad.abs().max()) or 1.0
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=name)

    [report] = reports
    assert not report.fallbacks and not report.whole_graph_reason, str(report)
    bw = _nodes(report, "backward")
    types = Counter(n.op_type for n in bw)
    # every threshold_backward (the block outputs' ReLUs; the others fold into BatchNormalizationGrad) is a
    # ThresholdGrad step, the one of the identity block's input with its residual gradient Add
    assert not {"LessOrEqual", "Where", "Not", "Equal", "Cast", "Unsqueeze"} & set(types), types
    progs = _programs(bw)
    assert sum(p.count("ThresholdGrad") for p in progs) == 2, progs
    assert ["Add", "ThresholdGrad"] in progs, progs
    assert types["NLLLossGrad"] == 1
    # the kernels that ran: no mask, no numpy kernel in the loss head (what scales with batch or classes)
    ops = {op for op, _ in kernels}
    assert not {"LessOrEqual", "Not", "Cast"} & ops, kernels
    assert kernels[("NegativeLogLikelihoodLoss", "nll_numba")] == 1, kernels
    assert kernels[("NLLLossGrad", "nll_grad_numba")] == 1, kernels
    head = {
        "LogSoftmax",
        "NegativeLogLikelihoodLoss",
        "Equal",
        "Where",
        "ReduceSum",
        "Div",
        "NLLLossGrad",
        "LogSoftmaxGrad",
    }
    assert not [k for k in kernels if k[0] in head and k[1].endswith("_numpy")], kernels
    assert sum(n for (op, _), n in kernels.items() if op == "Where") == 1  # total_weight's selection


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_backward_is_torchs_to_the_bit(reduction):
    """Without weights total_weight is a count (exact), so dInput is -(grad / total_weight) at each target as
    torch computes it, bit for bit; an all-ignored batch gives zeros (mean's loss is 0 / 0 = NaN in both)."""
    torch.manual_seed(3)
    for target in (torch.tensor([2, 0, 7, 7, 3, 1]), torch.tensor([7] * 6)):
        x = torch.randn(6, 5).log_softmax(1).requires_grad_()
        g = torch.randn(6) if reduction == "none" else torch.tensor(0.37)

        def f(x, t):
            return (F.nll_loss(x, t, ignore_index=7, reduction=reduction) * g).sum()

        run, _ = _compiled(f)
        grads, losses = [], []
        for fn in (run, f):
            x.grad = None
            loss = fn(x, target)
            loss.backward()
            grads.append(x.grad.clone())
            losses.append(loss.detach())
        np.testing.assert_array_equal(grads[0].numpy(), grads[1].numpy())
        np.testing.assert_allclose(losses[0].numpy(), losses[1].numpy(), rtol=1e-6)
        torch._dynamo.reset()


_NLL_CASES = [((7, 5), (7,)), ((3, 4, 6), (3, 6))]


@pytest.mark.parametrize("xs,ts", _NLL_CASES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (False, 1), (True, 2)])
@pytest.mark.parametrize("parallel", [False, True])
def test_nll_numba_kernel_matches_reference_and_torch(monkeypatch, xs, ts, reduction, weighted, ignore, parallel):
    if parallel:  # the parallel loop over positions from the first one (threads permitting)
        monkeypatch.setattr(KX, "NLL_PARALLEL_MIN", 1)
    rng = np.random.default_rng(7)
    x = np.log(rng.dirichlet(np.ones(xs[1]), size=int(np.prod(ts)))).astype(np.float32)
    x = np.moveaxis(x.reshape(ts + (xs[1],)), -1, 1).copy()
    t = rng.integers(0, xs[1], ts).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    w = (rng.random(xs[1]) + 0.25).astype(np.float32) if weighted else None
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    ex = opsnn.aclnn.prepare("NegativeLogLikelihoodLoss", [x, t, w], attrs, algo="nll_numba")
    assert ex.kernel_name == "nll_numba"
    got = ex.run().numpy()
    rec = get_op("NegativeLogLikelihoodLoss")
    want = rec.reference([x, t] + ([w] if weighted else []), rec.bind_attrs(attrs))  # float64 inside
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    peer = F.nll_loss(
        torch.from_numpy(x),
        torch.from_numpy(t),
        None if w is None else torch.from_numpy(w),
        ignore_index=-100 if ignore is None else ignore,
        reduction=reduction,
    )
    np.testing.assert_allclose(got, peer.numpy(), rtol=1e-5, atol=1e-6)


def test_nll_numba_kernel_names_a_target_out_of_range():
    x = np.zeros((3, 4), np.float32)
    t = np.array([0, 4, 1], np.int64)
    ex = opsnn.aclnn.prepare("NegativeLogLikelihoodLoss", [x, t, None], {"reduction": "sum"}, algo="nll_numba")
    with pytest.raises(ParamInvalidError, match=r"NegativeLogLikelihoodLoss: targets must lie in \[0, 4\)"):
        ex.run().numpy()
