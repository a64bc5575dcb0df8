"""Compiled training (``opsnn.compile(train_step)``): forward, backward and the in-place optimizer
update traced into one graph; eager and compiled steps agree, and both agree with torch.

Tolerances: eager vs compiled run the same kernels on the same float32 data, but the graph engine
may fuse elementwise chains and order sums differently, so losses agree to rtol 1e-5 and parameters
to rtol 1e-5 / atol 1e-6 after 8 steps (float32 eps is 1.2e-7; measured differences are 0 or a
few ulps). Against torch the tolerances of tests/test_training.py apply.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from test_training import _adamw, _cnn, _mlp, _sgd

import opsnn
from opsnn import nn, optim
from opsnn.graph.tracing import TraceError

RNG = np.random.default_rng(31)
STEPS = 8


def _data(kind, n=6):
    if kind == "cnn":
        return RNG.standard_normal((n, 3, 8, 8)).astype(np.float32), RNG.integers(0, 5, size=n)
    if kind == "mlp":
        return RNG.standard_normal((n, 10)).astype(np.float32), RNG.integers(0, 4, size=n)
    return RNG.standard_normal((n, 10)).astype(np.float32), RNG.standard_normal((n, 4)).astype(np.float32)


def _relu_mlp(lib):
    n = lib.nn
    return n.Sequential(n.Linear(10, 16), n.ReLU(), n.Linear(16, 4))


def _build(kind, make_opt):
    with nn.init.seeded(3):
        model = {"cnn": _cnn, "mlp": _relu_mlp, "gelu_mlp": _mlp}[kind](opsnn).train()
    opt = make_opt(optim, list(model.parameters()))
    loss_fn = nn.MSELoss() if kind == "gelu_mlp" else nn.CrossEntropyLoss()

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, opt, train_step


def _run(kind, make_opt, compiled, batches):
    model, opt, step = _build(kind, make_opt)
    if compiled:
        step = opsnn.compile(step)
    losses = [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
    return model, opt, step, np.array(losses)


@pytest.mark.parametrize("make_opt", [_sgd, _adamw], ids=["sgd_momentum", "adamw"])
@pytest.mark.parametrize("kind", ["cnn", "mlp", "gelu_mlp"])
def test_compiled_step_matches_eager(kind, make_opt):
    batches = [_data(kind) for _ in range(STEPS)]  # new data every step: labels are not baked in
    em, eopt, _, elosses = _run(kind, make_opt, False, batches)
    cm, copt, step, closses = _run(kind, make_opt, True, batches)
    assert step.num_compiles == 1 and step.mode == "compiled"
    assert step.compiled_graph.mode == "compiled", step.compiled_graph.mode_reason
    np.testing.assert_allclose(closses, elosses, rtol=1e-5, atol=1e-7)
    esd, csd = em.state_dict(), cm.state_dict()  # parameters and BatchNorm's running statistics
    for name, v in csd.items():
        np.testing.assert_allclose(v.numpy(), esd[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    # optimizer state is updated in place too (momentum buffers, Adam moments and step counts)
    for pe, pc in zip(em.parameters(), cm.parameters()):
        for key, val in eopt.state[pe].items():
            got = copt.state[pc][key]
            if key == "step":
                assert got == val
            else:
                np.testing.assert_allclose(got.numpy(), val.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("make_opt", [_sgd, _adamw], ids=["sgd_momentum", "adamw"])
@pytest.mark.parametrize("kind", ["cnn", "gelu_mlp"])
def test_compiled_step_trains_like_torch(kind, make_opt):
    torch = pytest.importorskip("torch")
    x, y = _data(kind)
    build = _cnn if kind == "cnn" else _mlp
    torch.manual_seed(0)
    tmodel = build(torch).train()
    model = build(opsnn).train()
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt, topt = make_opt(optim, list(model.parameters())), make_opt(torch.optim, list(tmodel.parameters()))
    if kind == "cnn":
        loss_fn, tloss_fn = nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    else:
        loss_fn, tloss_fn = nn.MSELoss(), torch.nn.MSELoss()

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = opsnn.compile(train_step)
    losses, tlosses = [], []
    for _ in range(12):
        losses.append(float(step(x, y).item()))
        topt.zero_grad()
        tl = tloss_fn(tmodel(torch.tensor(x)), torch.tensor(y))
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    assert losses[-1] < 0.8 * losses[0]
    np.testing.assert_allclose(losses, tlosses, rtol=2e-5, atol=1e-6)
    tsd = tmodel.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), tsd[name].detach().numpy(), rtol=1e-4, atol=2e-5, err_msg=name)


def test_graph_holds_forward_backward_and_in_place_update():
    _model, _opt, train_step = _build("mlp", _sgd)
    step = opsnn.compile(train_step)
    x, y = _data("mlp")
    step(x, y)  # traced (runs eagerly)
    step(x, y)  # compiled: the plan exists now
    g = step.graph()
    ops_in_graph = {n.op_type for n in g.nodes}
    assert {"ApplySGD", "Gemm"} & ops_in_graph or "ApplySGD" in ops_in_graph
    assert [n.op_type for n in g.nodes].count("ApplySGD") == 1  # one fused multi-tensor update
    # every parameter's gradient is a named value of the traced graph, read by the update node
    grads = step.gradient_names()
    assert len(grads) == 4 and all(v == f"{k}.grad" for k, v in grads.items())
    apply = next(n for n in g.nodes if n.op_type == "ApplySGD")
    assert set(grads.values()) <= set(apply.inputs)
    # parameters and momentum buffers are state inputs, never constants the passes could fold
    assert not any(k.endswith(("weight", "bias")) for k in step.compiled_graph.graph.initializers)
    assert len(step.state_names()) == 8
    # nothing pre-packed from a parameter (the update's chunk table is the only plan-held array)
    assert not any(dt.startswith(("float", "bfloat")) for dt in step.resident_bytes()), step.resident_bytes()
    rep = step.memory_report()
    assert 0 < rep["planned_peak_bytes"] < rep["naive_bytes"], rep
    assert rep["state_updates"] == 8
    text = step.explain()
    assert "planned peak" in text and "ApplySGD" in text


def test_new_batch_shape_recompiles_same_shape_reuses():
    _model, _opt, train_step = _build("mlp", _adamw)
    step = opsnn.compile(train_step)
    a, b = _data("mlp", 6), _data("mlp", 9)
    step(*a)
    step(*a)
    assert step.num_compiles == 1 and step.compiled_graph.plans_built == 1
    step(*b)
    assert step.num_compiles == 2
    step(*a)
    step(*b)
    assert step.num_compiles == 2


def test_lr_scheduler_is_a_runtime_input():
    x, y = _data("mlp")

    def run(compiled):
        model, opt, train_step = _build("mlp", _sgd)
        sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        step = opsnn.compile(train_step) if compiled else train_step
        losses = []
        for _ in range(5):  # crosses the boundary twice: lr 0.05 -> 0.005 -> 0.0005
            losses.append(float(step(opsnn.tensor(x), opsnn.tensor(y)).item()))
            sched.step()
        return losses, [p.numpy().copy() for p in model.parameters()]

    el, ep = run(False)
    cl, cp = run(True)
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    for a, b in zip(cp, ep):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compiled_steps_return_pool_memory(no_leak):
    _model, _opt, train_step = _build("cnn", _adamw)
    step = opsnn.compile(train_step)
    x, y = (opsnn.tensor(a) for a in _data("cnn", 4))
    live = []
    for _ in range(40):
        loss = step(x, y)
        del loss
        opsnn.current_stream().synchronize()
        live.append(opsnn.memory.current_bytes())
    # after the first compiled call (plan and arena built) every call frees what it made
    assert live[2:] == [live[1]] * (len(live) - 2), live[:6]


def test_tracing_a_step_frees_its_intermediates_as_an_eager_step_does():
    """The tracer holds the tensors it names weakly: the first (tracing) call's pool peak is the eager
    step's, not the sum of every intermediate the step made (a model that trains eagerly compiles too)."""
    x, y = (opsnn.tensor(a) for a in _data("cnn", 16))
    peaks = {}
    for mode in ("eager", "trace"):
        _model, _opt, train_step = _build("cnn", _adamw)
        step = train_step if mode == "eager" else opsnn.compile(train_step)
        opsnn.current_stream().synchronize()
        opsnn.memory.reset_peak()
        base = opsnn.memory.current_bytes()
        step(x, y)
        opsnn.current_stream().synchronize()
        peaks[mode] = opsnn.memory.summary()["peak_bytes"] - base
        del step, train_step, _model, _opt
        gc.collect()
    assert peaks["trace"] <= peaks["eager"] * 1.05, peaks


def test_host_read_of_a_traced_value_is_a_typed_error():
    model, opt, _ = _build("mlp", _sgd)

    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if float(loss.item()) > 0.0:  # data-dependent Python control flow
            loss = loss * 2.0
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(TraceError, match=r"reads the value of .* on the host"):
        opsnn.compile(train_step)(*_data("mlp"))


def test_stale_gradients_are_refused():
    """(Train-mode dropout compiles: tests/test_backward_dropbf16.py.)"""
    with nn.init.seeded(0):
        model = nn.Sequential(nn.Linear(10, 8), nn.Dropout(0.5), nn.Linear(8, 4)).eval()
    opt = optim.SGD(model.parameters(), lr=0.1)
    x, y = _data("gelu_mlp")
    nn.functional.mse_loss(model(opsnn.tensor(x)), y).backward()  # .grad left from an eager step

    def accumulating_step(x, y):  # no zero_grad: would add into the eager gradient
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(TraceError, match="zero_grad"):
        opsnn.compile(accumulating_step)(x, y)


def test_saved_outputs_and_detached_values_stay_graph_values():
    """Tanh's rule reads its saved output, and a detached tensor is the same memory under another
    handle: both must be the traced value of each call, not the first call's constant."""
    x = RNG.standard_normal((5, 10)).astype(np.float32)

    def run(compiled):
        with nn.init.seeded(1):
            lin = nn.Linear(10, 10)
        opt = optim.SGD(lin.parameters(), lr=0.1)

        def train_step(x):
            opt.zero_grad()
            h = opsnn.ops.tanh(lin(x))
            loss = nn.functional.mse_loss(h, h.detach() * 0.5)  # a stop-gradient target
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        return [float(step(opsnn.tensor(x)).item()) for _ in range(4)]

    np.testing.assert_allclose(run(True), run(False), rtol=1e-5, atol=1e-7)


def test_apply_ops_match_their_references():
    """The fused in-place kernels against the records' float64 references (odd sizes, two tensors)."""
    from opsnn.ops.registry import get_op

    p = [RNG.standard_normal(s).astype(np.float32) for s in ((7, 3), (5,))]
    g = [RNG.standard_normal(a.shape).astype(np.float32) for a in p]
    b = [RNG.standard_normal(a.shape).astype(np.float32) for a in p]
    hyper = np.array([[0.1, 0.9, 0.1, 0.01], [0.05, 0.8, 0.0, 0.0]])
    flags = np.array([[0, 0, 0], [1, 1, 0]], np.int64)
    got = opsnn.ops.apply_sgd(hyper, flags, p, g, b)
    want = get_op("ApplySGD", "opsnn").reference([hyper, flags, *p, *g, *b], {"momentum_buffers": 1})
    for a, w in zip(got, want):
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-6, atol=1e-7)
    v = [np.abs(a) for a in b]
    hyper = np.array([[1e-2, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001]] * 2)
    flags = np.array([[1, 1, 0], [1, 0, 1]], np.int64)
    got = opsnn.ops.apply_adamw(hyper, flags, p, g, b, v, v)
    want = get_op("ApplyAdamW", "opsnn").reference([hyper, flags, *p, *g, *b, *v, *v], {"amsgrad": 1})
    for a, w in zip(got, want):
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-5, atol=1e-6)


def test_an_in_place_output_written_before_a_reader_is_refused():
    """The compiled graph binds a state update onto its input's memory only when the writing step is
    the input's last reader; otherwise a later reader would see the new value."""
    from opsnn.errors import InnerError
    from opsnn.graph.compiler import compile as compile_graph
    from opsnn.graph.ir import Graph, Node, Value

    f32 = np.dtype(np.float32)
    g = Graph(
        "late_reader",
        inputs=[Value("s", f32, (4,)), Value("v", f32, (4,))],
        outputs=[Value("s_new", f32), Value("c", f32)],
        nodes=[
            Node("Assign", ["s", "v"], ["s_new"], domain="opsnn"),
            Node("Add", ["s", "v"], ["c"]),  # reads the old state after the write
        ],
    )
    cg = compile_graph(g, level=0)
    cg.io_aliases = {"s_new": "s"}
    s, v = np.zeros(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(InnerError, match="reads 's' after it"):
        cg.run({"s": s, "v": v})
    ok = compile_graph(Graph("in_order", inputs=g.inputs, outputs=g.outputs, nodes=g.nodes[::-1]), level=0)
    ok.io_aliases = {"s_new": "s"}
    st = opsnn.tensor(s)
    out = ok.run({"s": st, "v": opsnn.tensor(v)})
    np.testing.assert_array_equal(out["c"].numpy(), v)  # read before the write
    assert out["s_new"] is st
    np.testing.assert_array_equal(st.numpy(), v)  # written in place into the fed tensor


def test_compiled_embedding_step_follows_each_calls_ids():
    """Token ids are data: the embedding gradient scatters by each call's ids (no host read), and an
    id outside the vocabulary is refused by the compiled graph as the eager check refuses it."""
    ids = [RNG.integers(0, 20, size=(4, 5)) for _ in range(4)]
    labels = [RNG.integers(0, 3, size=4) for _ in range(4)]

    def run(compiled):
        with nn.init.seeded(2):
            emb, head = nn.Embedding(20, 6), nn.Linear(6, 3)
        opt = optim.AdamW(list(emb.parameters()) + list(head.parameters()), lr=1e-2)

        def train_step(ids, y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(head(opsnn.ops.mean(emb(ids), dim=1)), y)
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(opsnn.tensor(i), opsnn.tensor(y)).item()) for i, y in zip(ids, labels)]
        return losses, emb.weight.numpy().copy(), step

    el, ew, _ = run(False)
    cl, cw, step = run(True)
    assert step.num_compiles == 1
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(cw, ew, rtol=1e-5, atol=1e-6)
    for bad in (-1, 25):
        wrong = ids[0].copy()
        wrong[1, 2] = bad
        with pytest.raises(opsnn.errors.OpsnnError, match="out of range"):
            step(opsnn.tensor(wrong), opsnn.tensor(labels[0])).item()


@pytest.mark.parametrize("clip", ["norm", "inf_norm", "value"])
def test_label_smoothing_and_gradient_clipping_compile(clip):
    """test_training's loss (label-smoothed cross-entropy) and gradient clipping inside a compiled
    step: both become graph ops (the eager paths read on the host); the norm sums in float32 where
    eager sums in float64, within the stated tolerances."""
    batches = [_data("cnn") for _ in range(5)]

    def run(compiled):
        with nn.init.seeded(4):
            model = _cnn(opsnn).train()
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

        def train_step(x, y):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip == "value":
                nn.utils.clip_grad_value_(model.parameters(), 0.05)
            else:
                nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=2.0 if clip == "norm" else float("inf"))
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
        return losses, [p.numpy().copy() for p in model.parameters()]

    el, ep = run(False)
    cl, cp = run(True)
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    for a, b in zip(cp, ep):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_switching_train_eval_mode_traces_again():
    model, _opt, train_step = _build("cnn", _sgd)
    step = opsnn.compile(train_step)
    x, y = _data("cnn")
    step(x, y)
    step(x, y)
    assert step.num_compiles == 1
    model.eval()  # BatchNorm now normalises with (and no longer updates) its running statistics
    before = model.state_dict()["1.running_mean"].numpy().copy()
    step(x, y)
    step(x, y)
    assert step.num_compiles == 2
    np.testing.assert_array_equal(model.state_dict()["1.running_mean"].numpy(), before)
    assert not any(n.op_type == "Assign" for n in step.graph().nodes)


def test_graph_only_options_are_refused_for_a_training_step():
    _model, _opt, train_step = _build("mlp", _sgd)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="static_shapes"):
        opsnn.compile(train_step, static_shapes=[{"x": (6, 10)}])


@pytest.mark.parametrize("which", ["encoder", "LSTM"])
def test_compiled_sequence_models_match_eager(which):
    """test_training's transformer encoder (key-padding masks that change per batch: the attention
    gradient builds the mask's bias with ops) and its LSTM tagger, 4 steps, AdamW."""
    from test_training import _encoder, _tagger

    batches = []
    for k in range(4):
        ids = RNG.integers(0, 11, size=(3, 6))
        pad = np.zeros((3, 6), bool)
        pad[k % 3, 3 + k % 2 :] = True
        y = RNG.integers(0, 3, size=(3, 6))
        y[pad] = -100
        batches.append((ids, pad, y) if which == "encoder" else (ids, np.where(pad, 0, y)))

    def run(compiled):
        with nn.init.seeded(0):
            model = (_encoder(opsnn) if which == "encoder" else _tagger(opsnn, vocab=11)).train()
        opt = _adamw(optim, list(model.parameters()))

        def train_step(*args):
            opt.zero_grad()
            logits = model(*args[:-1])
            loss = nn.functional.cross_entropy(opsnn.ops.transpose(logits, [0, 2, 1]), args[-1])
            loss.backward()
            opt.step()
            return loss

        step = opsnn.compile(train_step) if compiled else train_step
        losses = [float(step(*[opsnn.tensor(a) for a in b]).item()) for b in batches]
        return losses, {n: p.numpy().copy() for n, p in model.named_parameters()}

    el, ep = run(False)
    cl, cp = run(True)
    np.testing.assert_allclose(cl, el, rtol=1e-5, atol=1e-7)
    for name, a in cp.items():
        b = ep[name]
        if name.endswith("in_proj_bias"):
            # as in test_training: the key bias's true gradient is 0 (softmax ignores a row constant) and
            # Adam turns rounding noise (fused vs unfused kernels here) into full-size steps
            a, b = np.delete(a, np.s_[16:32]), np.delete(b, np.s_[16:32])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def test_graph_hooks_can_rewrite_gradients_before_the_update():
    """The data-parallel insertion point: a hook sees the traced graph and each parameter's gradient
    value, and may put nodes between them and the update (an all-reduce would sit where this test
    puts a scale by 1/2). For plain SGD that equals halving the learning rate, exactly (a power of 2)."""
    from opsnn.autograd.compiled import CompiledTrainStep
    from opsnn.graph.ir import Node

    seen = {}

    def halve_gradients(graph, gradients):
        seen.update(gradients)
        graph.initializers["half"] = np.array(0.5, np.float32)
        scaled = {g: g + ".scaled" for g in gradients.values()}
        for n in graph.nodes:
            if n.op_type == "ApplySGD":
                n.inputs = [scaled.get(i, i) for i in n.inputs]
        at = min(i for i, n in enumerate(graph.nodes) if n.op_type == "ApplySGD")
        graph.nodes[at:at] = [Node("Mul", [g, "half"], [s]) for g, s in scaled.items()]

    batches = [_data("mlp") for _ in range(4)]
    model, opt, train_step = _build("mlp", lambda lib, p: lib.SGD(p, lr=0.1))
    step = CompiledTrainStep(train_step, graph_hooks=[halve_gradients])
    hooked = [float(step(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in batches]
    assert len(seen) == 4  # one gradient per parameter (2 Linear layers)
    # oracle: eager, the first (tracing) call at lr 0.1 unhooked, the compiled ones as lr 0.05
    emodel, eopt, estep = _build("mlp", lambda lib, p: lib.SGD(p, lr=0.1))
    eager = []
    for x, y in batches:
        eager.append(float(estep(opsnn.tensor(x), opsnn.tensor(y)).item()))
        eopt.param_groups[0]["lr"] = 0.05
    np.testing.assert_allclose(hooked, eager, rtol=1e-6, atol=1e-7)
    for a, b in zip(model.parameters(), emodel.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


def test_trace_leaves_no_cached_blocks_behind():
    # the trace runs the step eagerly; its freed activations would sit in the pool's cache beside the
    # compiled graph's own arena for the life of the process (LLaMA-tiny: 850 MiB)
    _model, _opt, train_step = _build("cnn", _sgd)
    step = opsnn.compile(train_step)
    x, y = _data("cnn")
    opsnn.memory.empty_cache()
    before = opsnn.memory.summary()["frees"]
    step(x, y)  # traced
    s = opsnn.memory.summary()
    assert s["frees"] > before, s  # the eager run did free blocks ...
    # ... and kept none but what the call's own locals freed after it (the input tensors: 512 bytes)
    assert s["cached_bytes"] < s["peak_bytes"] // 20, s
    step(x, y)  # compiled
    assert step.num_compiles == 1


def test_empty_cache_drops_cached_blocks_and_trims_the_heap():
    import platform

    pool = opsnn.runtime.memory._pool()
    blocks = [pool.allocate(1 << 20) for _ in range(8)]
    for b in blocks:
        pool.free(b)
    assert opsnn.memory.summary()["cached_bytes"] >= 8 << 20
    opsnn.memory.empty_cache()
    assert opsnn.memory.summary()["cached_bytes"] == 0
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert opsnn.runtime.memory.trim_heap() is True


def test_a_gradient_that_depends_on_no_input_is_the_steps_own():
    """loss = model(x).sum(): the bias gradient is a constant of the step (ones summed); the compiled step
    applies it as eager does (it was refused as 'not computed inside the traced step')."""
    res = {}
    for mode in ("eager", "compiled"):
        with opsnn.nn.init.seeded(1):
            model = opsnn.nn.Linear(3, 2)
        opt = opsnn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, model=model, opt=opt):
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            return loss

        run = opsnn.compile(step) if mode == "compiled" else step
        x = opsnn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        res[mode] = [float(run(x).item()) for _ in range(3)] + model.bias.numpy().tolist()
    np.testing.assert_allclose(res["compiled"], res["eager"], rtol=1e-6)
