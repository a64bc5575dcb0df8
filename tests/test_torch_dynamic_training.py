"""Training with ``torch.compile(model, backend="opsnn", dynamic=True)``: aot_autograd's forward and
backward graphs traced once on symbolic sizes, each run on opsnn with a plan per concrete shape; the
per-step losses, gradients and batch-norm statistics against the same steps in eager torch (the
oracle), within the static training tests' tolerances."""

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


class CNN(torch.nn.Module):
    """conv, batch norm, ReLU, max pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1))


class Block(torch.nn.Module):
    """A pre-norm transformer encoder block: attention from matmuls and softmax, a GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(torch.nn.Module):
    """Two blocks and a classifier over the mean of the sequence (its gradient expands over it)."""

    def __init__(self, layers=None):
        super().__init__()
        self.layers = layers if layers is not None else torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.layers(x).mean(1))


def _train_both(model, batches):
    """SGD on cross-entropy over ``batches`` ((x, y) of changing shapes), compiled with the opsnn
    backend (``dynamic=True``) and eagerly on a copy, the gradients compared at every step; returns
    the backend calls' reports (each with ``graphs``: the graphs Dynamo compiled meanwhile) and both
    models."""
    from torch._dynamo.utils import counters

    ref = copy.deepcopy(model)
    reports = []

    def backend(gm, example_inputs):  # counts the compiles: one per Dynamo graph
        run, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return run

    def loss_of(m):
        return lambda x, y: F.cross_entropy(m(x), y)

    before = counters["stats"]["unique_graphs"]
    step = torch.compile(loss_of(model), backend=backend, dynamic=True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref)]
    for x, y in batches:
        losses = []
        for opt, run in zip(opts, (step, loss_of(ref))):
            opt.zero_grad()
            loss = run(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        np.testing.assert_allclose(losses[0].numpy(), losses[1].numpy(), rtol=RTOL, err_msg=str(tuple(x.shape)))
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            scale = float(q.grad.abs().max()) or 1.0
            np.testing.assert_allclose(
                p.grad.numpy(), q.grad.numpy(), rtol=RTOL, atol=RTOL * scale, err_msg=f"{name} at {tuple(x.shape)}"
            )
    for report in reports:
        report.graphs = counters["stats"]["unique_graphs"] - before
    return reports, model, ref


def _ops(report, graph: str) -> set:
    return {op for name, ops, _ in report.partitions if name.startswith(graph + ".") for op in ops}


def _one_symbolic_trace(reports, shapes: int):
    """One backend call (no recompile), both graphs on opsnn at every step with no fallback, each
    partition one opsnn graph with a plan per shape."""
    [rep] = reports
    assert rep.graphs == 1  # Dynamo's own count: no recompile after the first (dynamic) trace
    assert not rep.whole_graph_reason and rep.fallbacks == [], rep.fallbacks
    assert {name.split(".")[0] for name in rep.runs} == {"forward", "backward"}, rep.runs
    assert all(calls == shapes for calls in rep.runs.values()), rep.runs
    assert all(cg.num_plans == shapes for _, _, cg in rep.partitions)
    return rep


def test_cnn_trains_on_opsnn_over_three_batch_sizes_with_one_trace():
    torch.manual_seed(21)
    batches = [(torch.randn(b, 3, 8, 8), torch.randint(0, 5, (b,))) for b in (4, 6, 10)]
    reports, model, ref = _train_both(CNN(), batches)
    rep = _one_symbolic_trace(reports, 3)
    backward = _ops(rep, "backward")
    for op in (
        "convolution_backward",
        "max_pool2d_with_indices_backward",
        "nll_loss_backward",
        "_log_softmax_backward_data",
    ):
        assert f"aten.{op}.default" in backward, op
    # native_batch_norm_backward with the ReLU's threshold_backward folded in
    assert "opsnn.batch_norm_backward.default" in backward
    assert "aten._native_batch_norm_legit_functional.default" in _ops(rep, "forward")
    # the input's batch is a symbolic dim of the forward graph, not a number
    [fwd] = [cg for name, ops, cg in rep.partitions if "aten.convolution.default" in ops]
    assert any(isinstance(d, str) for spec in fwd.input_specs.values() for d in spec.shape)
    # the running statistics (the unbiased variance's count read from the shape) as eager's
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_transformer_trains_on_opsnn_over_batch_sizes_and_sequence_lengths_with_one_trace():
    torch.manual_seed(22)
    shapes = [(3, 6), (5, 6), (5, 9), (7, 9)]
    batches = [(torch.randn(b, s, 16), torch.randint(0, 5, (b,))) for b, s in shapes]
    reports, _, _ = _train_both(Encoder(), batches)
    rep = _one_symbolic_trace(reports, len(shapes))
    backward = _ops(rep, "backward")
    assert "opsnn.layer_norm_backward.default" in backward and "aten._softmax_backward_data.default" in backward
    # the mean's gradient: an expand to the symbolic sequence length, divided by it
    assert {"aten.expand.default", "aten.div.Scalar"} <= backward


def test_torch_transformer_layer_attention_stays_in_torch_and_trains_as_eager():
    """nn.TransformerEncoderLayer: the flash attention forward and its backward stay in torch (logged),
    never torch's decomposition of the forward, whose saved output is not what that backward reads."""
    torch.manual_seed(23)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    batches = [(torch.randn(b, 6, 16), torch.randint(0, 5, (b,))) for b in (3, 5)]
    reports, _, _ = _train_both(Encoder(layer), batches)
    [rep] = reports
    assert rep.graphs == 1 and not rep.whole_graph_reason
    fallen = {target for _, target, _ in rep.fallbacks}
    flash = "aten._scaled_dot_product_flash_attention_for_cpu"
    assert {f"{flash}.default", f"{flash}_backward.default"} <= fallen
    # what else stays in torch: zeros of symbolic sizes made of sizes alone (the squeezes, selects and
    # full_like of the symbolic graphs run on opsnn)
    assert fallen <= {f"{flash}.default", f"{flash}_backward.default", "aten.full.default"}, rep.fallbacks
    assert {name.split(".")[0] for name in rep.runs} == {"forward", "backward"}, rep.runs
