"""Training graphs of the torch frontend on opsnn's backward records: each ATen backward op that
aot_autograd's backward graph keeps whole (batch norm, max / average pooling, softmax, log_softmax,
embedding, the NLL loss, ReLU's threshold) lowered to its record, the gradients checked against
torch eager's (the oracle) within float32 tolerance."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opsnn.frontends import torch as fe  # noqa: E402

F = torch.nn.functional
RTOL = 1e-4  # relative to the largest gradient: float32 sums in another order, statistics in float64


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_grads(fn, *inputs, params=()):
    """``fn(*inputs)`` (a scalar) compiled with the opsnn backend and eagerly; returns the report and
    the gradients of the float inputs and ``params`` from each: ``(report, got, want)``."""
    reports = []

    def be(gm, example_inputs):
        run, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return run

    leaves = [x for x in inputs if x.is_floating_point()] + list(params)
    out = []
    for run in (torch.compile(fn, backend=be, dynamic=False), fn):
        for t in leaves:
            t.grad = None
        run(*inputs).backward()
        out.append([t.grad.clone() for t in leaves])
    [report] = reports
    return report, out[0], out[1]


def _assert_close(got, want):
    for g, w in zip(got, want):
        scale = float(w.abs().max()) or 1.0
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=RTOL * scale)


def _ops(report, graph: str) -> set:
    return {op for name, ops, _ in report.partitions if name.startswith(graph + ".") for op in ops}


def _on_opsnn(report, forward=(), backward=()):
    """No fallback, both graphs ran on opsnn, and the named ATen ops are in their partitions."""
    assert not report.whole_graph_reason and report.fallbacks == [], report.fallbacks
    assert {name.split(".")[0] for name in report.runs} == {"forward", "backward"}, report.runs
    for graph, ops in (("forward", forward), ("backward", backward)):
        missing = {op if "." in op else f"aten.{op}.default" for op in ops} - _ops(report, graph)
        assert not missing, (graph, missing)


class SmallNet(torch.nn.Module):
    """Conv, batch norm, ReLU, max pooling (ties: zeros after ReLU), average pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = F.relu(self.bn2(self.conv2(x)) + x)
        return self.fc(F.avg_pool2d(x, 2).flatten(1))


def test_cnn_forward_and_backward_run_whole_on_opsnn_records():
    torch.manual_seed(3)
    model = SmallNet()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 4, 2])
    ref = copy.deepcopy(model)
    reports = []

    def be(gm, example_inputs):
        run, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return run

    def loss_of(m):
        return lambda x, y: F.cross_entropy(m(x), y)

    step = torch.compile(loss_of(model), backend=be, dynamic=False)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref)]
    for _ in range(3):
        for opt, run in zip(opts, (step, loss_of(ref))):
            opt.zero_grad()
            loss = run(x, y)
            loss.backward()
            opt.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            scale = float(q.grad.abs().max())
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=name)
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    [rep] = reports
    _on_opsnn(
        rep,
        forward=("max_pool2d_with_indices", "nll_loss_forward", "_log_softmax"),
        backward=(
            "opsnn.batch_norm_backward.default",  # native_batch_norm_backward, not reading saved statistics
            "max_pool2d_with_indices_backward",
            "avg_pool2d_backward",
            "threshold_backward",
            "convolution_backward",
            "nll_loss_backward",
            "_log_softmax_backward_data",
        ),
    )
    assert all(calls == 3 for calls in rep.runs.values()), rep.runs


def test_eval_mode_batch_norm_backward_reads_the_running_statistics():
    torch.manual_seed(4)
    bn = torch.nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
    x, g = torch.randn(3, 6, 5, 5, requires_grad=True), torch.randn(3, 6, 5, 5)
    rep, got, want = _compiled_grads(lambda x: (bn(x) * g).sum(), x, params=list(bn.parameters()))
    _assert_close(got, want)
    _on_opsnn(rep, backward=("native_batch_norm_backward",))


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(2, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 2)])
def test_max_pool_backward_scatters_at_torchs_indices(kernel, stride, padding, dilation):
    torch.manual_seed(5)
    x = torch.randn(2, 3, 9, 9).round()  # many equal values in a window: the first maximum takes the gradient
    x.requires_grad_(True)
    g = torch.randn(F.max_pool2d(x, kernel, stride, padding, dilation).shape)
    rep, got, want = _compiled_grads(lambda x: (F.max_pool2d(x, kernel, stride, padding, dilation) * g).sum(), x)
    _assert_close(got, want)
    _on_opsnn(rep, forward=("max_pool2d_with_indices",), backward=("max_pool2d_with_indices_backward",))


@pytest.mark.parametrize("padding, include", [(0, True), (1, True), (1, False)])
def test_avg_pool_backward(padding, include):
    torch.manual_seed(6)
    x = torch.randn(2, 3, 7, 7, requires_grad=True)
    g = torch.randn(F.avg_pool2d(x, 3, 2, padding, count_include_pad=include).shape)
    rep, got, want = _compiled_grads(lambda x: (F.avg_pool2d(x, 3, 2, padding, count_include_pad=include) * g).sum(), x)
    _assert_close(got, want)
    _on_opsnn(rep, backward=("avg_pool2d_backward",))


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dim", [1, -1])
def test_softmax_backward(log, dim):
    torch.manual_seed(7)
    x, g = torch.randn(4, 6, 5, requires_grad=True), torch.randn(4, 6, 5)
    f = F.log_softmax if log else F.softmax
    rep, got, want = _compiled_grads(lambda x: (f(x, dim) * g).sum(), x)
    _assert_close(got, want)
    _on_opsnn(rep, backward=("_log_softmax_backward_data" if log else "_softmax_backward_data",))


@pytest.mark.parametrize("padding_idx", [None, 1, -1])
def test_embedding_backward(padding_idx):
    torch.manual_seed(8)
    emb = torch.nn.Embedding(7, 4, padding_idx=padding_idx)
    ids = torch.tensor([[1, 6, 1, 0], [2, 1, 6, 3]])
    g = torch.randn(2, 4, 4)
    rep, got, want = _compiled_grads(lambda ids: (emb(ids) * g).sum(), ids, params=[emb.weight])
    _assert_close(got, want)
    _on_opsnn(rep, backward=("embedding_dense_backward",))
    if padding_idx is not None:
        assert not got[0][padding_idx % 7].any()


def test_embedding_scale_grad_by_freq_keeps_torchs_decomposition():
    """The record has no per-frequency scaling: the op is decomposed as in inference (still on opsnn)."""
    torch.manual_seed(9)
    emb = torch.nn.Embedding(5, 3, scale_grad_by_freq=True)
    ids = torch.tensor([0, 2, 2, 4, 2])
    g = torch.randn(5, 3)
    rep, got, want = _compiled_grads(lambda ids: (emb(ids) * g).sum(), ids, params=[emb.weight])
    _assert_close(got, want)
    assert "aten.embedding_dense_backward.default" not in _ops(rep, "backward")
    assert not rep.whole_graph_reason


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("spatial", [False, True])
def test_nll_loss_forward_and_backward(reduction, weighted, spatial):
    torch.manual_seed(10)
    shape = (5, 4, 3, 2) if spatial else (6, 4)
    x = torch.randn(shape, requires_grad=True)
    target = torch.randint(0, 4, shape[:1] + shape[2:])
    target.view(-1)[::3] = -1  # ignored
    weight = torch.rand(4) + 0.5 if weighted else None
    g = torch.randn(target.shape) if reduction == "none" else torch.tensor(1.7)

    def f(x, target):
        loss = F.cross_entropy(x, target, weight=weight, ignore_index=-1, reduction=reduction)
        return (loss * g).sum()

    rep, got, want = _compiled_grads(f, x, target)
    _assert_close(got, want)
    name = "nll_loss2d" if spatial else "nll_loss"
    _on_opsnn(rep, forward=(f"{name}_forward",), backward=(f"{name}_backward", "_log_softmax_backward_data"))


def test_nll_loss_forward_value_and_total_weight():
    """The loss itself (and the total weight the backward divides by) against eager."""
    torch.manual_seed(11)
    x, target, w = torch.randn(6, 5, requires_grad=True), torch.tensor([0, 4, -1, 2, 2, -1]), torch.rand(5)
    f = lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, weight=w, ignore_index=-1)  # noqa: E731
    got = torch.compile(f, backend=fe.backend, dynamic=False)(x, target)
    want = f(x, target)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6)


def test_onednn_call_leaves_openmps_thread_count():
    """A oneDNN primitive sets OpenMP's thread count (which torch shares) for its call alone."""
    from opsnn.kernels.cpu import onednn as KD

    if KD.unavailable() is not None:
        pytest.skip(KD.unavailable())
    if KD._lib.opsnn_get_threads is None:
        pytest.skip("no libgomp here")
    block = KD.block()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2 * block, 16, 3, 3)).astype(np.float32)
    geo = dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), block=block)
    prim = KD.ConvPrimitive(
        (1, 16, 6, 6), w, (1, 2 * block, 6, 6), **geo, src_blocked=False, has_bias=False, residual=False, act=0
    )
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    y = np.empty((1, 2, 6, 6, block), np.float32)
    before = torch.get_num_threads()
    other = KD.threads() + 1  # a count oneDNN's call must change, and put back
    torch.set_num_threads(other)
    try:
        prim(x, None, None, y)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    got = y.transpose(0, 1, 4, 2, 3).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_backward_on_the_record_with_its_forwards_eps(affine):
    """ATen's layer-norm backward has no eps (it reads the saved statistics): the joint graph names the
    forward's, and the record recomputes the statistics with it (eps large enough to matter here)."""
    torch.manual_seed(12)
    ln = torch.nn.LayerNorm((3, 8), eps=0.3, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.uniform_(-0.5, 0.5)
    lin = torch.nn.Linear(8, 8)
    x, g = torch.randn(4, 3, 8, requires_grad=True), torch.randn(4, 3, 8)
    rep, got, want = _compiled_grads(
        lambda x: (ln(lin(x)) * g).sum(), x, params=list(ln.parameters()) + list(lin.parameters())
    )
    _assert_close(got, want)
    _on_opsnn(rep, forward=("native_layer_norm",))
    assert "opsnn.layer_norm_backward.default" in _ops(rep, "backward")


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_without_running_statistics_trains_on_opsnn(affine):
    """track_running_stats=False: _native_batch_norm_legit.no_stats forward (the batch statistics it
    saves) and BatchNormalizationGrad backward; weight-less batch norm reads a scale of ones."""
    torch.manual_seed(13)
    bn = torch.nn.BatchNorm2d(4, affine=affine, track_running_stats=False)
    x, g = torch.randn(3, 4, 5, 5, requires_grad=True), torch.randn(3, 4, 5, 5)
    rep, got, want = _compiled_grads(lambda x: (bn(x) * g).sum(), x, params=list(bn.parameters()))
    _assert_close(got, want)
    _on_opsnn(rep, backward=("opsnn.batch_norm_backward.default",))
    assert "aten._native_batch_norm_legit.no_stats" in _ops(rep, "forward")


@pytest.mark.parametrize("groups, affine", [(2, True), (6, False)])
def test_group_norm_backward_on_the_record_with_its_forwards_eps(groups, affine):
    """As layer norm: native_group_norm_backward named with its forward's eps, on GroupNormalizationGrad
    (6 groups of 6 channels: instance norm's case)."""
    torch.manual_seed(14)
    gn = torch.nn.GroupNorm(groups, 6, eps=0.2, affine=affine)
    if affine:
        with torch.no_grad():
            gn.weight.uniform_(0.5, 1.5)
            gn.bias.uniform_(-0.5, 0.5)
    x, g = torch.randn(3, 6, 4, 5, requires_grad=True), torch.randn(3, 6, 4, 5)
    rep, got, want = _compiled_grads(lambda x: (gn(x) * g).sum(), x, params=list(gn.parameters()))
    _assert_close(got, want)
    _on_opsnn(rep, forward=("native_group_norm",))
    assert "opsnn.group_norm_backward.default" in _ops(rep, "backward")
