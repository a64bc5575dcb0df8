"""Training-mode BatchNorm: the BatchNormalization kernel computes the batch statistics once and
returns the running-statistics update through its optional outputs (torch's semantics: momentum
weighs the batch, the running variance takes the unbiased batch variance, ``momentum=None`` is a
cumulative average); nn.BatchNorm1d/2d/3d use them in eager and compiled training steps.

Tolerances: running statistics against a float64 oracle of the same update (numpy, from the same
batches): float32 buffers to rtol 2e-6 / atol 1e-7 (a few float32 ulps: the kernel computes in
float64 and rounds once), float64 buffers to rtol 1e-12. Against torch (float32 arithmetic of its
own): rtol 1e-5 / atol 1e-6, as tests/test_autograd.py.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.errors import ParamInvalidError
from opsnn.models.resnet import BasicBlock
from opsnn.ops import get_op, run_op

RNG = np.random.default_rng(37)

CASES = [
    ("BatchNorm1d", (6, 3)),
    ("BatchNorm1d", (4, 3, 5)),
    ("BatchNorm2d", (3, 3, 5, 7)),
    ("BatchNorm3d", (2, 3, 2, 3, 5)),
]


def _batches(shape, n=4, dtype=np.float32):
    return [(RNG.standard_normal(shape) * 2 + 1).astype(dtype) for _ in range(n)]


def _oracle(batches, momentum, C):
    """Running (mean, var) after the batches, in float64: torch's update rule."""
    rm, rv = np.zeros(C), np.ones(C)
    for k, x in enumerate(batches, start=1):
        w = x.astype(np.float64)
        axes = (0,) + tuple(range(2, w.ndim))
        n = w.size // C
        mean = w.mean(axis=axes)
        var = ((w - mean.reshape((1, C) + (1,) * (w.ndim - 2))) ** 2).sum(axis=axes) / (n - 1)
        m = 1.0 / k if momentum is None else momentum
        rm, rv = (1 - m) * rm + m * mean, (1 - m) * rv + m * var
    return rm, rv


def _train_step(bn):
    """A training step through ``bn``: forward, a loss that is not invariant to BN's output
    (sum of squares of y * w), backward, SGD on the affine parameters."""
    opt = optim.SGD([p for p in bn.parameters()], lr=0.1)
    w = opsnn.tensor(RNG.standard_normal(bn.num_features).astype(np.float32))

    def step(x):
        opt.zero_grad()
        y = bn(x)
        shape = (1, -1) + (1,) * (y.ndim - 2)
        loss = ops.mean(ops.mul(y, ops.reshape(ops.cast(w, y.dtype), shape)))
        loss.backward()
        opt.step()
        return loss

    return step


@pytest.mark.parametrize("momentum", [0.1, None], ids=["m0.1", "cumulative"])
@pytest.mark.parametrize("cls,shape", CASES, ids=[f"{c}-{len(s)}d" for c, s in CASES])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_running_stats_match_float64_oracle(cls, shape, momentum, compiled):
    batches = _batches(shape)
    bn = getattr(nn, cls)(shape[1], momentum=momentum, eps=1e-3).train()
    step = _train_step(bn)
    if compiled:
        step = opsnn.compile(step)
    for x in batches:
        step(opsnn.tensor(x))
    if compiled:
        assert step.mode == "compiled" and step.num_compiles == 1
    rm, rv = _oracle(batches, momentum, shape[1])
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=2e-6, atol=1e-7)
    assert int(bn.num_batches_tracked.item()) == len(batches)


@pytest.mark.parametrize("momentum", [0.3, None])
def test_float64_buffers_are_exact(momentum):
    batches = _batches((5, 4, 3, 3), dtype=np.float64)
    bn = nn.BatchNorm2d(4, momentum=momentum, dtype="float64").train()
    for x in batches:
        bn(opsnn.tensor(x))
    rm, rv = _oracle(batches, momentum, 4)
    assert bn.running_mean.dtype == np.float64
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum", [0.1, None], ids=["m0.1", "cumulative"])
@pytest.mark.parametrize("cls,shape", CASES, ids=[f"{c}-{len(s)}d" for c, s in CASES])
def test_eager_and_compiled_match_torch(cls, shape, momentum):
    torch = pytest.importorskip("torch")
    batches = _batches(shape)
    C = shape[1]
    tbn = getattr(torch.nn, cls)(C, momentum=momentum, eps=1e-4).train()
    with torch.no_grad():
        tbn.weight.copy_(torch.tensor(RNG.uniform(0.5, 1.5, C).astype(np.float32)))
        tbn.bias.copy_(torch.tensor(RNG.standard_normal(C).astype(np.float32)))
    sd = {k: v.detach().numpy().copy() for k, v in tbn.state_dict().items()}
    results = {}
    for compiled in (False, True):
        bn = getattr(nn, cls)(C, momentum=momentum, eps=1e-4).train()
        bn.load_state_dict(sd)
        fwd = opsnn.compile(lambda x, bn=bn: bn(x)) if compiled else bn
        ys = [fwd(opsnn.tensor(x)).numpy().copy() for x in batches]
        assert not compiled or (fwd.mode == "compiled" and fwd.num_compiles == 1)
        results[compiled] = (bn, ys)
    tys = [tbn(torch.tensor(x)).detach().numpy() for x in batches]
    for compiled, (bn, ys) in results.items():
        for y, ty in zip(ys, tys):
            np.testing.assert_allclose(y, ty, rtol=1e-4, atol=1e-5)
        for name in ("running_mean", "running_var"):
            np.testing.assert_allclose(
                getattr(bn, name).numpy(),
                getattr(tbn, name).numpy(),
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{name} {compiled}",
            )
        assert int(bn.num_batches_tracked.item()) == int(tbn.num_batches_tracked.item()) == len(batches)
    # eval: both normalise with the running statistics they accumulated
    bn = results[True][0].eval()
    tbn.eval()
    np.testing.assert_allclose(
        bn(opsnn.tensor(batches[0])).numpy(), tbn(torch.tensor(batches[0])).detach().numpy(), rtol=1e-4, atol=1e-5
    )


# -- the op: BatchNormalization's optional outputs with unbiased_running_var ---------------------------
@pytest.mark.parametrize("shape", [(2, 3), (5, 4, 7), (3, 2, 5, 3), (1, 3, 1, 1), (4, 6, 33, 17)])
@pytest.mark.parametrize("unbiased", [0, 1])
def test_op_running_outputs_against_float64_formula(shape, unbiased):
    C = shape[1]
    x = (RNG.standard_normal(shape) * 3 - 2).astype(np.float32)
    s, b = RNG.uniform(0.5, 1.5, C).astype(np.float32), RNG.standard_normal(C).astype(np.float32)
    m, v = RNG.standard_normal(C).astype(np.float32), RNG.uniform(0.5, 2.0, C).astype(np.float32)
    attrs = {"training_mode": 1, "momentum": 0.7, "epsilon": 1e-4, "unbiased_running_var": unbiased}
    ex = opsnn.ops.prepare(get_op("BatchNormalization"), [x, s, b, m, v], attrs, num_outputs=3)
    assert ex.kernel_name == "batch_norm_numba"
    y, rm, rv = (t.numpy() for t in ex.run())
    w = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    n = x.size // C
    bm = w.mean(axis=axes)
    bv = ((w - bm.reshape((1, C) + (1,) * (x.ndim - 2))) ** 2).mean(axis=axes)
    rvar = bv * n / max(n - 1, 1) if unbiased else bv
    np.testing.assert_allclose(rm, m * 0.7 + bm * 0.3, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(rv, v * 0.7 + rvar * 0.3, rtol=2e-6, atol=1e-7)
    bshape = (1, C) + (1,) * (x.ndim - 2)
    want = (w - bm.reshape(bshape)) / np.sqrt(bv.reshape(bshape) + 1e-4) * s.reshape(bshape) + b.reshape(bshape)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)  # normalisation keeps the biased variance
    ref = run_op("BatchNormalization", [x, s, b, m, v], attrs, num_outputs=3, algo="reference")
    for got, r in zip((y, rm, rv), ref):
        np.testing.assert_allclose(got, r.numpy(), rtol=2e-6, atol=1e-6)
    # the functional entry point: torch's momentum, the unbiased update on request
    _, fm, fv = opsnn.ops.batch_norm(
        x, m, v, s, b, training=True, momentum=0.3, eps=1e-4, unbiased_running_var=bool(unbiased)
    )
    np.testing.assert_allclose(fm.numpy(), rm, rtol=1e-6)
    np.testing.assert_allclose(fv.numpy(), rv, rtol=1e-6)


def test_op_default_update_is_onnx_population_variance():
    onnx_ref = pytest.importorskip("onnx.reference.ops.op_batch_normalization")
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    s, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    m, v = np.zeros(4, np.float32), np.ones(4, np.float32)
    got = run_op("BatchNormalization", [x, s, b, m, v], {"training_mode": 1, "momentum": 0.9}, num_outputs=3)
    want = onnx_ref._batchnorm_training_mode(x, s, b, m, v, 0.9, 1e-5)
    for g, w in zip(got, (want[0], want[3], want[4])):  # y, then the running mean and variance
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


# -- the compiled step: no graph ops recompute the statistics ---------------------------------------------
class _TinyResNet18(nn.Module):
    """ResNet-18's topology (stem, 4 stages of 2 BasicBlocks, downsampling shortcuts) at widths
    4..32: 20 BatchNorm layers, small enough for a test."""

    def __init__(self, widths=(4, 8, 16, 32), classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            ds = None
            if stride != 1 or cin != w:
                ds = nn.Sequential(nn.Conv2d(cin, w, 1, stride=stride, bias=False), nn.BatchNorm2d(w))
            blocks += [BasicBlock(cin, w, stride, ds), BasicBlock(w, w)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(ops.relu(self.bn1(self.conv1(x))))
        return self.fc(nn.functional.reshape(self.pool(x), (0, -1)))


def test_compiled_resnet18_step_computes_bn_statistics_only_in_the_kernel():
    with nn.init.seeded(5):
        model = _TinyResNet18().train()
    emodel = _TinyResNet18()
    emodel.load_state_dict(model.state_dict())
    emodel.train()
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert n_bn == 20

    def make_step(mdl):
        opt = optim.SGD(list(mdl.parameters()), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        def step(x, y):
            opt.zero_grad()
            loss = loss_fn(mdl(x), y)
            loss.backward()
            opt.step()
            return loss

        return step

    step, estep = opsnn.compile(make_step(model)), make_step(emodel)
    data = [(RNG.standard_normal((4, 3, 16, 16)).astype(np.float32), RNG.integers(0, 5, 4)) for _ in range(3)]
    for x, y in data[:2]:
        step(opsnn.tensor(x), opsnn.tensor(y))
        estep(opsnn.tensor(x), opsnn.tensor(y))
    assert step.mode == "compiled"
    with opsnn.profiler.profile() as p:
        step(opsnn.tensor(data[2][0]), opsnn.tensor(data[2][1]))
    estep(opsnn.tensor(data[2][0]), opsnn.tensor(data[2][1]))
    ran = collections.Counter(k.op for k in p.kernels)
    assert ran["BatchNormalization"] == n_bn and ran["BatchNormalizationGrad"] == n_bn, ran
    # the statistics come from the kernel: nothing reduces or centres BN inputs in the graph
    g = step.compiled_graph.graph
    assert ran["ReduceMean"] == 0 and ran["Sub"] <= 1, ran  # the one Sub: cross-entropy's gradient
    bn_inputs = {n.inputs[0] for n in g.nodes if n.op_type == "BatchNormalization"}
    for node in g.nodes:
        if node.op_type in ("ReduceMean", "ReduceSum", "Sub", "Mul", "FusedElementwise"):
            assert not bn_inputs & set(node.inputs), (node.op_type, node.inputs)
    # each BN node's running outputs are written back into the buffers by Assign (and nbt += 1)
    producers = g.producers()
    assigned = [producers.get(n.inputs[1]) for n in g.nodes if n.op_type == "Assign"]
    from_bn = [a for a in assigned if a is not None and a.op_type == "BatchNormalization"]
    assert len(from_bn) == 2 * n_bn
    # every BasicBlock's residual Add -> Relu runs as one generated elementwise kernel (Relu's
    # gradient reads its output, so the Add's output has no other consumer)
    fused = step.compiled_graph.pass_report.by_name("elementwise_fusion").log
    assert sum("(Add -> Relu)" in line for line in fused) == 8, fused
    # eager and compiled agree on the buffers (and the parameters)
    esd = emodel.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), esd[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


# -- errors -------------------------------------------------------------------------------------------------
def test_errors_name_layer_and_argument():
    with pytest.raises(
        ParamInvalidError, match=r"BatchNorm1d: input must be 2-D \(N, C\) or 3-D \(N, C, L\), got shape \(2, 3, 4, 5\)"
    ):
        nn.BatchNorm1d(3).train()(np.zeros((2, 3, 4, 5), np.float32))
    with pytest.raises(ParamInvalidError, match=r"BatchNorm2d: input must be 4-D \(N, C, H, W\), got shape \(2, 3\)"):
        nn.BatchNorm2d(3)(np.zeros((2, 3), np.float32))
    with pytest.raises(ParamInvalidError, match=r"BatchNorm3d: input must be 5-D"):
        nn.BatchNorm3d(3).train()(np.zeros((2, 3, 4, 5), np.float32))
    bn = nn.BatchNorm2d(4).train()
    with pytest.raises(ParamInvalidError, match=r"BatchNormalization: input 'scale' must have shape \(3,\)"):
        bn(np.zeros((2, 3, 4, 5), np.float32))
    assert int(bn.num_batches_tracked.item()) == 0  # nothing was updated by the failed call
    np.testing.assert_array_equal(bn.running_var.numpy(), np.ones(4, np.float32))
    with pytest.raises(ParamInvalidError, match="BatchNorm1d: momentum must be a number"):
        nn.BatchNorm1d(3, momentum="x")
    x, s = np.ones((2, 3), np.float32), np.ones(3, np.float32)
    with pytest.raises(ParamInvalidError, match="training_mode"):
        run_op("BatchNormalization", [x, s, s, s, s], {"unbiased_running_var": 1}, num_outputs=3)
