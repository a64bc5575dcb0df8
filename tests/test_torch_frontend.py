"""The torch.compile backend (opsnn.frontends.torch): models compiled with backend="opsnn" against
torch eager (the oracle: torch's own float32 kernels), fallbacks, recompiles, entry-point discovery."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opsnn.frontends import torch as fe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-4


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _recording(reports):
    """The opsnn backend, keeping each call's Report in ``reports``."""

    def be(gm, example_inputs):
        fn, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    return be


def _check(model, *inputs, backend=fe.backend):
    """Compile ``model`` with the opsnn backend; its outputs match eager within RTOL (scaled by the
    output's magnitude, atol for values near zero)."""
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        got = compiled(*inputs)
        want = model(*inputs)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
    scale = float(want.abs().max())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL * scale)
    return compiled, got


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention from matmuls and softmax, a GELU MLP."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads, self.d = heads, d
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def test_mlp_matches_eager_and_runs_whole_on_opsnn():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4), torch.nn.Tanh()).eval()
    reports = []
    _check(m, torch.randn(5, 8), backend=_recording(reports))
    assert len(reports) == 1 and not reports[0].fallbacks and len(reports[0].partitions) == 1


def test_cnn_conv_bn_relu_maxpool_linear_eval():
    torch.manual_seed(1)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 3 * 3, 5),
    )
    with torch.no_grad():  # BN statistics that are not the identity
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
    m.eval()
    reports = []
    _check(m, torch.randn(2, 3, 16, 16), backend=_recording(reports))
    assert len(reports) == 1 and not reports[0].fallbacks and len(reports[0].partitions) == 1


def test_transformer_block():
    torch.manual_seed(2)
    reports = []
    _check(Block().eval(), torch.randn(2, 6, 16), backend=_recording(reports))
    assert len(reports) == 1 and not reports[0].fallbacks and len(reports[0].partitions) == 1


def test_parameters_are_shared_not_copied():
    """The opsnn graph's constants are views of the parameters' memory (what a pass repacks, such
    as a transposed weight, is its own array; the rest stays shared)."""
    torch.manual_seed(3)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).eval()  # tanh keeps the bias a plain add
    x = torch.randn(2, 4)
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=False)
    with torch.no_grad():
        compiled(x)
        cg = reports[0].partitions[0][2]
        ptrs = {a.ctypes.data for a in cg.graph.initializers.values()}
        assert m[0].bias.data_ptr() in ptrs or m[0].weight.data_ptr() in ptrs


def test_unmapped_op_falls_back_logged_and_right(caplog, monkeypatch, capfd):
    torch.manual_seed(4)

    def f(x, w):
        y = torch.relu(x @ w)
        return torch.erfinv(torch.tanh(y)) * 2.0 + 1.0  # aten.erfinv has no mapping

    monkeypatch.setenv("OPSNN_DEBUG", "1")
    reports = []
    with caplog.at_level(logging.INFO, logger="opsnn.frontends.torch"):
        compiled = torch.compile(f, backend=_recording(reports), dynamic=False)
        x, w = torch.randn(3, 5), torch.randn(5, 4)
        got = compiled(x, w)
    np.testing.assert_allclose(got.numpy(), f(x, w).numpy(), rtol=RTOL, atol=RTOL)
    [rep] = reports
    assert [t for _, t, _ in rep.fallbacks] == ["aten.erfinv.default"]
    assert "no mapping" in rep.fallbacks[0][2]
    assert len(rep.partitions) == 2  # before and after the erfinv
    assert any("aten.erfinv.default" in r.getMessage() for r in caplog.records)
    assert "opsnn torch fallback" in capfd.readouterr().err


def test_unexpressible_arguments_fall_back():
    """An ATen op that has a mapping but arguments its adapter cannot express stays in torch."""

    def f(x):
        return torch.nn.functional.avg_pool2d(x, 2, divisor_override=3)

    x = torch.randn(1, 2, 4, 4)
    reports = []
    got = torch.compile(f, backend=_recording(reports), dynamic=False)(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=RTOL, atol=RTOL)
    assert any("divisor_override" in why for _, _, why in reports[0].fallbacks)


def test_other_batch_size_recompiles_and_stays_right():
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU()).eval()
    calls = []
    compiled = torch.compile(
        m, backend=lambda gm, ex: (calls.append([tuple(e.shape) for e in ex]), fe.backend(gm, ex))[1], dynamic=False
    )
    with torch.no_grad():
        for batch in (2, 7, 2):
            x = torch.randn(batch, 6)
            np.testing.assert_allclose(compiled(x).numpy(), m(x).numpy(), rtol=RTOL, atol=RTOL)
    assert len(calls) == 2 and {(2, 6), (7, 6)} <= {s for c in calls for s in c}


@pytest.mark.parametrize("last", ["sigmoid", "view"])
def test_outputs_stay_valid_after_the_next_call(last):
    """Outputs outlive the next run, also one that is a view (Flatten) of an intermediate."""
    torch.manual_seed(6)
    tail = torch.nn.Sigmoid() if last == "sigmoid" else torch.nn.Flatten(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), tail).eval()
    compiled = torch.compile(m, backend=fe.backend, dynamic=False)
    with torch.no_grad():
        x1, x2 = torch.randn(3, 4), torch.randn(3, 4)
        y1 = compiled(x1)
        kept = y1.clone()
        y2 = compiled(x2)
        assert torch.equal(y1, kept) and not torch.equal(y1, y2)
        np.testing.assert_allclose(y2.numpy(), m(x2).numpy(), rtol=RTOL, atol=RTOL)


def _recording_runs(monkeypatch):
    """Every CompiledGraph.run of the test: ``(feeds, results)`` as the graph saw and returned them."""
    from opsnn.graph.compiler import CompiledGraph

    runs = []
    real = CompiledGraph.run

    def run(self, inputs, stream=None):
        results = real(self, inputs, stream)
        runs.append((list(inputs), results))
        return results

    monkeypatch.setattr(CompiledGraph, "run", run)
    return runs


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "expanded"])
def test_inputs_and_outputs_cross_by_dlpack_without_copies(layout, monkeypatch):
    """The partition's feed is the torch input's memory (same data pointer and strides, also for a
    transposed, offset or expanded view) and the torch output is the memory opsnn wrote (same data
    pointer)."""
    torch.manual_seed(13)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    base = torch.randn(6, 5)
    x = {
        "contiguous": base[:, :4].contiguous(),
        "transposed": base.t()[:, :4],
        "sliced": base[1:, 1:],
        "expanded": base[2:3, :4].expand(5, 4),  # stride 0: one row read five times
    }[layout]
    assert x.is_contiguous() == (layout == "contiguous")
    runs = _recording_runs(monkeypatch)
    _, got = _check(m, x)
    [(feeds, results)] = runs
    [feed] = feeds
    assert feed.ctypes.data == x.data_ptr()
    assert feed.strides == tuple(s * x.element_size() for s in x.stride())
    [result] = results
    assert got.data_ptr() == result.numpy().ctypes.data


def test_outputs_own_their_memory_outside_the_plan_arena(monkeypatch):
    """An output is opsnn memory of its own, never the plan's arena (reused by the next run): the
    first call's output keeps its pointer and values while the second call writes elsewhere."""
    torch.manual_seed(14)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4), torch.nn.Tanh()).eval()
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=False)
    with torch.no_grad():
        y1 = compiled(torch.randn(3, 4))
        kept, p1 = y1.clone(), y1.data_ptr()
        y2 = compiled(torch.randn(3, 4))
    plan = reports[0].partitions[0][2].latest_plan
    assert plan.arena is not None  # the hidden layer lives in the arena
    lo, hi = plan.arena.ctypes.data, plan.arena.ctypes.data + plan.arena.nbytes
    for y in (y1, y2):
        assert not lo <= y.data_ptr() < hi
    assert y1.data_ptr() == p1 != y2.data_ptr() and torch.equal(y1, kept)


def test_bfloat16_crosses_by_dlpack_as_its_bits():
    """DLPack's numpy consumer has no bfloat16: the frontend hands its 16-bit pattern over, both ways,
    still without a copy (a strided view included)."""
    from opsnn.dtypes import bfloat16

    t = torch.randn(6, 4).to(torch.bfloat16).t()
    a = fe.to_numpy(t)
    assert a.dtype == bfloat16 and a.ctypes.data == t.data_ptr() and a.strides == (2, 8)
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())
    back = fe.to_torch(a)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr() and torch.equal(back, t)


def test_parameters_share_memory_and_in_place_updates_are_seen():
    """Parameters used as they are (a conv's weight and bias, a linear's bias) are the opsnn graph's
    constants, no copy; an in-place update of any parameter (an optimizer step, ``mul_`` under
    no_grad) moves its version counter and the next call compiles again and sees it, a weight opsnn
    transposed into its own array included."""
    torch.manual_seed(15)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 3)
    ).eval()
    x = torch.randn(2, 3, 6, 6)
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=False)
    with torch.no_grad():
        compiled(x)
        [rep] = reports
        ptrs = {a.ctypes.data for a in rep.partitions[0][2].graph.initializers.values()}
        assert {m[0].weight.data_ptr(), m[0].bias.data_ptr(), m[3].bias.data_ptr()} <= ptrs
        for p in (m[0].weight, m[3].weight):
            p.mul_(-0.5)
            got = compiled(x)
            want = m(x)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL * float(want.abs().max()))
        assert len(rep.partitions) == 1  # the stale compile was dropped, one partition is current


def test_bfloat16_model_runs_on_opsnn_as_torch_computes_it():
    """A bfloat16 model (its parameters bfloat16 too): every op on opsnn, in float32 and rounded to
    bfloat16 once per ATen op as torch's CPU kernels do; bfloat16 results within bfloat16's tolerance
    of eager (the oracle), the int64 and bool results exact on them."""
    torch.manual_seed(17)
    m = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 4), torch.nn.Softmax(-1)
    ).eval()
    m = m.to(torch.bfloat16)

    def f(x):
        y = m(x)
        return y, y.argmax(-1), y > 0.25, (x * 0.1).sum(0).float()

    x = torch.randn(5, 16).to(torch.bfloat16)
    reports = []
    with torch.no_grad():
        got = torch.compile(f, backend=_recording(reports), dynamic=False)(x)
        want = f(x)
    [rep] = reports
    assert not rep.fallbacks and len(rep.partitions) == 1
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_allclose(got[0].float().numpy(), want[0].float().numpy(), rtol=1.6e-2, atol=1e-5)
    np.testing.assert_allclose(got[3].numpy(), want[3].numpy(), rtol=1.6e-2, atol=1e-5)
    # argmax and the comparison read opsnn's own bfloat16 y: checked against torch's ops on that y (a
    # one-ulp difference from eager's y could move a tie)
    assert torch.equal(got[1], got[0].argmax(-1)) and torch.equal(got[2], got[0] > 0.25)


def _train(model, x, y, steps=5, backend="eager"):
    """``steps`` of SGD on cross-entropy; the losses."""
    compiled = torch.compile(model, backend=backend, dynamic=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_training_forward_and_backward_on_opsnn_match_eager(net):
    """Five SGD steps through aot_autograd (forward and backward graphs on opsnn) against the same
    steps in eager torch (the oracle): losses, parameters and batch-norm running statistics."""
    import copy

    torch.manual_seed(11)
    if net == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        x, y = torch.randn(6, 16), torch.tensor([0, 1, 2, 3, 0, 1])
    else:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 6, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(6 * 2 * 2, 5),
        )
        x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 4])
    ref = copy.deepcopy(model)
    reports = []
    got = _train(model, x, y, backend=_recording(reports))
    want = _train(ref, x, y)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    [rep] = reports
    assert not rep.whole_graph_reason
    ran = {name.split(".")[0] for name, calls in rep.runs.items() if calls == 5}
    assert ran == {"forward", "backward"}, rep.runs  # both graphs ran on opsnn at every step
    assert rep.fallbacks == []  # max pooling's indices included (tests/test_torch_training_lowering.py)
    if net == "cnn":
        bw_ops = {op for name, ops, _ in rep.partitions if name.startswith("backward.") for op in ops}
        assert "aten.convolution_backward.default" in bw_ops, bw_ops


def test_training_with_dynamic_shapes_runs_on_opsnn():
    """Symbolic sizes while autograd records: the forward graph on opsnn, autograd's graph kept
    (tests/test_torch_dynamic_training.py trains models this way)."""
    m = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    reports = []
    out = torch.compile(m, backend=_recording(reports), dynamic=True)(x)
    assert out.grad_fn is not None
    np.testing.assert_allclose(out.detach().numpy(), m(x).detach().numpy(), rtol=RTOL, atol=RTOL)
    assert not reports[0].whole_graph_reason and not reports[0].fallbacks
    assert "forward.fused_0" in reports[0].runs


def test_explain_prints_partitions_fallbacks_kernels(capsys):
    def f(x):
        return torch.erfinv(torch.tanh(torch.relu(x))) + 1.0

    reports = fe.explain(f, torch.randn(3, 3))
    text = capsys.readouterr().out
    assert len(reports) == 1 and "fallback" in text and "aten.erfinv.default" in text
    assert "partition fused_" in text and "kernels" in text


def test_torch_missing_is_one_typed_line():
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # import torch raises ImportError
        from opsnn.frontends import torch as fe
        try:
            fe.backend(None, [])
        except fe.TorchNotInstalledError as exc:
            msg = str(exc)
            assert "\\n" not in msg and "opsnn[torch]" in msg, msg
            print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_import_opsnn_does_not_import_torch():
    code = "import sys, opsnn; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr


def test_entry_point_is_discoverable_without_importing_opsnn(tmp_path):
    """pyproject's torch_dynamo_backends entry point, installed as package metadata (a dist-info
    written from pyproject itself, as pip would), makes list_backends() name "opsnn" and
    lookup_backend load opsnn's backend in a process that never imported opsnn."""
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = spec["project"]["entry-points"]["torch_dynamo_backends"]
    assert eps == {"opsnn": "opsnn.frontends.torch:backend"}
    dist = tmp_path / "opsnn_entry_check-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: opsnn-entry-check\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
    )
    code = textwrap.dedent("""
        import sys, torch
        assert "opsnn" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
        assert not any(m == "opsnn" or m.startswith("opsnn.") for m in sys.modules)
        from torch._dynamo.backends.registry import lookup_backend
        fn = lookup_backend("opsnn")
        import opsnn.frontends.torch as fe
        assert fn is fe.backend
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_parameter_updated_after_compile_is_seen():
    """load_state_dict copies into the parameters in place; a folded batch norm or a repacked weight
    would keep the old values: the backend sees the version counters move and compiles again."""
    torch.manual_seed(7)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3),
        torch.nn.BatchNorm2d(3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 2),
    ).eval()
    other = torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3),
        torch.nn.BatchNorm2d(3),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 2),
    ).eval()
    with torch.no_grad():
        other[1].running_var.fill_(3.0)
    x = torch.randn(1, 2, 6, 6)
    compiled = torch.compile(m, backend=fe.backend, dynamic=False)
    with torch.no_grad():
        compiled(x)
        m.load_state_dict(other.state_dict())
        got = compiled(x)
        np.testing.assert_allclose(got.numpy(), other(x).numpy(), rtol=RTOL, atol=RTOL * float(other(x).abs().max()))


def test_input_mutation_stays_in_torch():
    def f(x):
        x.mul_(2.0)
        return torch.relu(x) + 1.0

    x = torch.randn(3, 4)
    want_x = x.clone()
    want = f(want_x)
    got = torch.compile(f, backend=fe.backend, dynamic=False)(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(x.numpy(), want_x.numpy(), rtol=RTOL, atol=RTOL)  # the input was mutated as in eager


def test_strided_input():
    torch.manual_seed(8)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(4, 5).t()  # column-major (5, 4): strides (1, 5)
    assert not x.is_contiguous()
    _check(m, x)


def test_dynamic_batch_is_one_trace_with_a_plan_per_shape():
    """dynamic=True: Dynamo's symbolic batch becomes an opsnn symbolic dim; one trace, one opsnn graph
    (its input declared with the symbol), three batch sizes give three plans, each result as eager."""
    torch.manual_seed(9)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Flatten(0)).eval()
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=True)
    with torch.no_grad():
        for batch in (3, 5, 9, 5):
            x = torch.randn(batch, 6)
            got = compiled(x)
            assert got.shape == (8 * batch,)
            np.testing.assert_allclose(got.numpy(), m(x).numpy(), rtol=RTOL, atol=RTOL)
    [rep] = reports  # one trace: Dynamo compiled once, and so did the backend
    assert not rep.whole_graph_reason and not rep.fallbacks
    [(_, _, cg)] = rep.partitions
    # the float input (the others: symbolic sizes crossing as inputs of that length and no bytes)
    [spec] = [v for v in cg.input_specs.values() if v.dtype == np.float32]
    assert isinstance(spec.shape[0], str) and spec.shape[1] == 6  # the batch is a symbolic dim
    shapes = [{name: shape for name, shape, _ in p.key}[spec.name] for p in cg.plans]
    assert cg.num_plans == 3 and sorted(shapes) == [(3, 6), (5, 6), (9, 6)]


def test_symbolic_sizes_cross_as_inputs_and_what_needs_more_stays_in_torch():
    """A reshape to sizes read off the input (two symbolic dims in new places) runs on opsnn (each
    size an input of that length, its Shape folded per plan); a tensor made from symbolic sizes
    (ones) stays in torch, logged; one trace serves every shape, each result as eager's."""

    def f(x):
        y = torch.tanh(x).reshape(x.shape[1], x.shape[0]) * 2.0
        return y + torch.ones(x.shape[1], 1)

    reports = []
    compiled = torch.compile(f, backend=_recording(reports), dynamic=True)
    for shape in ((3, 4), (5, 2), (4, 7)):
        x = torch.randn(*shape)
        np.testing.assert_allclose(compiled(x).numpy(), f(x).numpy(), rtol=RTOL, atol=RTOL)
    [rep] = reports
    assert [t for _, t, _ in rep.fallbacks] == ["aten.full.default"], rep.fallbacks
    assert "symbolic" in rep.fallbacks[0][2]
    ops = {op for _, ops, _ in rep.partitions for op in ops}
    assert "aten.view_copy.default" in ops and "aten.tanh.default" in ops
    assert rep.partitions and all(cg.num_plans == 3 for _, _, cg in rep.partitions)


def test_transformer_block_with_dynamic_batch_and_sequence_is_one_graph():
    """The transformer block with symbolic batch and sequence: one trace, every op on opsnn in one
    partition, a plan per shape (Dynamo specializes a batch of 1 on its own: not asked here)."""
    torch.manual_seed(18)
    m = Block().eval()
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=True)
    with torch.no_grad():
        for shape in ((2, 6), (3, 5), (4, 9)):
            x = torch.randn(*shape, 16)
            want = m(x)
            np.testing.assert_allclose(
                compiled(x).numpy(), want.numpy(), rtol=RTOL, atol=RTOL * float(want.abs().max())
            )
    [rep] = reports
    assert not rep.fallbacks and not rep.whole_graph_reason
    [(_, _, cg)] = rep.partitions
    assert cg.num_plans == 3


def test_a_graph_not_traceable_symbolically_compiles_per_shape(monkeypatch):
    """When the symbolic trace fails, the graph is compiled for each concrete shape it meets (logged),
    results as eager."""
    real = fe._compile

    def no_symbolic(*args, symbolic=False, **kwargs):
        if symbolic:
            raise RuntimeError("no symbolic trace in this test")
        return real(*args, **kwargs)

    monkeypatch.setattr(fe, "_compile", no_symbolic)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU()).eval()
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=True)
    with torch.no_grad():
        for batch in (3, 5, 3):
            x = torch.randn(batch, 6)
            np.testing.assert_allclose(compiled(x).numpy(), m(x).numpy(), rtol=RTOL, atol=RTOL)
    [rep] = reports
    assert not rep.whole_graph_reason and not rep.fallbacks
    assert len(rep.partitions) == 2 and all(cg.num_plans == 1 for _, _, cg in rep.partitions)


def test_running_on_opsnn_leaves_torch_threads_as_they_were():
    """opsnn's kernels may set OpenMP's thread count, which torch shares; Dynamo guards torch's as
    global state, so a changed one would compile the graph again at its next call."""
    torch.manual_seed(16)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    threads = torch.get_num_threads()
    reports = []
    compiled = torch.compile(m, backend=_recording(reports), dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(8, 16))
    assert torch.get_num_threads() == threads
    assert len(reports) == 1 and reports[0].runs == {"fused_0": 3}


def test_each_mapped_op_matches_eager():
    """Every table line the models above do not reach, against eager."""
    torch.manual_seed(10)

    def f(x, y, w1):
        a, b = x.split([2, 3], dim=1)
        s = a.sum(dim=1, keepdim=True) - b.mean(dim=1, keepdim=True) / (b.amax(dim=1, keepdim=True) + 4.0)
        t = torch.log_softmax(x, dim=-1) + torch.sigmoid(y).exp() - torch.sqrt(y.abs() + 1.0) * (-y)
        u = torch.nn.functional.conv1d(x.unsqueeze(0), w1, stride=2, padding=1, dilation=1, groups=1)
        v = torch.nn.functional.max_pool2d(x.reshape(1, 1, 4, 5), 2, stride=1, padding=1)
        g = (
            torch.nn.functional.gelu(x, approximate="tanh")
            + torch.tanh(x)
            + torch.erf(x)
            + torch.log(x.abs() + 0.5)
            + torch.reciprocal(y.abs() + 1.0)
            + x.unsqueeze(2).squeeze(2)
            + torch.nn.functional.hardtanh(3 * x)
            + x.clamp(min=-0.5)
            + x.clamp(-0.2, 0.3)
            + torch.nn.functional.leaky_relu(x, 0.2)
        )
        img = torch.cat([x, y], dim=0).reshape(1, 2, 4, 5)
        p = (
            torch.nn.functional.avg_pool2d(img, 3, stride=2, padding=1).sum()
            + torch.nn.functional.avg_pool2d(img, 2, count_include_pad=False, padding=1).sum()
            + torch.nn.functional.adaptive_avg_pool2d(img, 1).sum()
        )
        return (
            s.sum(dim=0) + t.sum(dim=[0, 1]) + u.sum(dim=[0, 2]).sum(dim=0) + v.sum(dim=[0, 1, 2, 3]) + g.sum(dim=0) + p
        )

    x, y, w1 = torch.randn(4, 5), torch.randn(4, 5), torch.randn(3, 4, 3)
    reports = []
    got = torch.compile(f, backend=_recording(reports), dynamic=False)(x, y, w1)
    want = f(x, y, w1)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL * float(want.abs().max()))
    assert reports[0].fallbacks == []


def test_log1p_expm1_keep_small_arguments_exact():
    """log1p and expm1 lowered from Log / Exp (Goldberg's and Kahan's forms) against float64: within
    a few float32 ulps at tiny, huge, near -1 and overflow arguments, and the IEEE specials as torch."""
    edge = [0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8, 1e-4, -0.999999, -1.0, -2.0, 80.0, 88.5, 89.0, 1e30, 3e38, -104.0]
    special = [float("inf"), float("-inf"), float("nan")]
    x = torch.cat([torch.tensor(edge + special), torch.randn(2000) * 3, torch.randn(2000) * 1e-3])
    for f in (torch.log1p, torch.expm1):
        reports = []
        got = torch.compile(lambda t, f=f: f(t), backend=_recording(reports), dynamic=False)(x)
        assert reports[0].fallbacks == []
        ref = f(x.double()).numpy()
        finite = np.isfinite(ref) & (np.abs(ref) > 1e-37) & (np.abs(ref) < 3e38)
        np.testing.assert_allclose(got.numpy()[finite], ref[finite], rtol=4e-7, atol=0)
        np.testing.assert_array_equal(got.numpy()[~finite], f(x).numpy()[~finite])  # inf, -1, nan, +-0 alike
        assert torch.signbit(got[1]) and torch.signbit(f(x)[1])


def test_argmax_diagonal_logical_norms_match_eager():
    """Newer table lines (argmax / argmin, diagonal, logical ops on numbers, p-norms, int64 remainder)."""
    torch.manual_seed(11)

    def f(x, i, j):
        return (
            x.argmax(dim=1) + x.argmin() + (i % 3) + torch.fmod(i, -2),
            torch.diagonal(x, -1) + torch.diagonal(x.reshape(2, 2, 5), 0, 0, 2).sum(),
            torch.logical_and(x, i.float().unsqueeze(1) - 2) ^ torch.logical_not(x > 0),
            torch.linalg.vector_norm(x, 3.5, dim=1) + torch.linalg.vector_norm(x, 0) + x.norm(p=0.5),
            (x.clamp_min(0.5) + x.clamp_max(0.7)).sum(dim=0),
            # int64 against a float scalar compares in float32: 16777217 rounds to 16777216, 2.9999999 to 3
            torch.stack([j < 16777216.5, j.eq(16777217.0), j > 2.9999999]),
        )

    x, i = torch.randn(4, 5), torch.randint(-5, 5, (4,))
    x[0, 0] = 0.0
    j = torch.tensor([16777217, 16777216, 3, -3])
    reports = []
    got = torch.compile(f, backend=_recording(reports), dynamic=False)(x, i, j)
    want = f(x, i, j)
    assert reports[0].fallbacks == []
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=RTOL)


def test_a_partition_opsnn_cannot_compile_runs_in_torch(monkeypatch):
    import opsnn.frontend
    from opsnn.errors import ParamInvalidError

    def refuse(graph, *args, **kwargs):
        raise ParamInvalidError(f"compile: refused {graph.name} for this test")

    monkeypatch.setattr(opsnn.frontend, "compile", refuse)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    reports = []
    _check(m, torch.randn(2, 4), backend=_recording(reports))
    assert not reports[0].partitions and "refused" in reports[0].fallbacks[0][2]


def test_several_outputs_and_non_tensors():
    def f(x, w):
        h = x @ w
        return {"act": torch.relu(h), "pre": h, "same": h, "n": 3, "flat": h.reshape(-1)}

    x, w = torch.randn(3, 4), torch.randn(4, 2)
    got = torch.compile(f, backend=fe.backend, dynamic=False)(x, w)
    want = f(x, w)
    assert got["n"] == 3
    for key in ("act", "pre", "same", "flat"):
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=RTOL, atol=RTOL)
    got["pre"].add_(1.0)  # torch may write into an output; the others are right still
    np.testing.assert_allclose(got["act"].numpy(), want["act"].numpy(), rtol=RTOL, atol=RTOL)


_RUN_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` fails from here on: the model runs on opsnn alone
import numpy as np, opsnn
cg = opsnn.compile(sys.argv[1])
x = np.load(sys.argv[2])
np.save(sys.argv[3], cg.run([x])[0].numpy())
assert "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
"""


@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_export_road_to_onnx_runs_without_torch(net, tmp_path):
    """to_graph (torch.export, core ATen) -> opsnn graph -> ONNX file; a process where torch cannot
    be imported loads and runs it; its outputs match torch eager."""
    from opsnn.graph.serialize import save

    torch.manual_seed(12)
    if net == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3), torch.nn.Tanh())
        x = torch.randn(4, 8)
    else:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 4 * 4, 5),
        )
        with torch.no_grad():
            model[1].running_mean.uniform_(-0.5, 0.5)
            model[1].running_var.uniform_(0.5, 2.0)
        x = torch.randn(2, 3, 8, 8)
    model.eval()
    graph = fe.to_graph(model, (x,))
    assert [v.name for v in graph.inputs] == ["input_0"] and [v.name for v in graph.outputs] == ["output_0"]
    path = save(graph, str(tmp_path / f"{net}.onnx"))
    np.save(tmp_path / "x.npy", x.numpy())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_TORCH, path, str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
        check=True,
        env=env,
        timeout=300,
    )
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))


def test_export_of_an_unmapped_op_names_it():
    class Flip(torch.nn.Module):
        def forward(self, x):
            return torch.erfinv(x) + 1.0

    with pytest.raises(fe.UnsupportedExportError, match="aten.erfinv"):
        fe.to_graph(Flip(), (torch.randn(3),))


def test_a_decomposition_writing_into_views_stays_right():
    """Circular padding decomposes into an empty buffer, slices of it and in-place copies: traced again
    through functionalization, no write can miss a view opsnn copied (found by the OpInfo sweep)."""

    def f(x):
        return torch.nn.functional.pad(torch.relu(x), (1, 2), mode="circular") * 2.0

    x = torch.randn(2, 3, 5)
    got = torch.compile(f, backend=fe.backend, dynamic=False)(x)
    np.testing.assert_allclose(got.numpy(), f(x).numpy(), rtol=RTOL, atol=RTOL)
