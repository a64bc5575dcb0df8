"""Training end to end: optimizers against torch.optim, and a small CNN and an MLP built in opsnn
and in torch with the same weights, trained 20 steps on the same data, step by step."""

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim

RNG = np.random.default_rng(1)


# -- optimizers on given gradients ----------------------------------------------------------------------
OPT_CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "maximize": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.02, "betas": (0.8, 0.9), "amsgrad": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
]


@pytest.mark.parametrize("name,kw", OPT_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPT_CASES)])
def test_optimizer_matches_torch_over_param_groups(name, kw):
    torch = pytest.importorskip("torch")
    shapes = [(70000,), (3, 5), (7,)]  # the first spans several parallel chunks
    init = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[RNG.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]
    ps = [nn.Parameter(a) for a in init]
    tps = [torch.tensor(a, requires_grad=True) for a in init]
    # two groups: the second with its own learning rate
    opt = getattr(optim, name)([{"params": ps[:2]}, {"params": ps[2:], "lr": kw["lr"] * 3}], **kw)
    topt = getattr(torch.optim, name)([{"params": tps[:2]}, {"params": tps[2:], "lr": kw["lr"] * 3}], **kw)
    for step, gs in enumerate(grads):
        for i, (p, tp, g) in enumerate(zip(ps, tps, gs)):
            if step == 1 and i == 1:  # a parameter without a gradient this step is left alone
                p.grad, tp.grad = None, None
                continue
            p.grad, tp.grad = opsnn.tensor(g), torch.tensor(g)
        opt.step()
        topt.step()
        for p, tp in zip(ps, tps):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def _adam_f64(p, g, m, v, vmax, step, lr, b1, b2, eps, wd, amsgrad, decoupled, maximize):
    """torch's Adam/AdamW step in float64, the state rounded to float32 where it is stored."""
    g = -g if maximize else g
    if wd and decoupled:
        p = p * (1.0 - lr * wd)
    elif wd:
        g = g + wd * p
    m = (m + (1.0 - b1) * (g - m)).astype(np.float32).astype(np.float64)
    v = (b2 * v + (1.0 - b2) * g * g).astype(np.float32).astype(np.float64)
    if amsgrad:
        vmax = np.maximum(vmax, v)
    denom = np.sqrt(vmax if amsgrad else v) / np.sqrt(1.0 - b2**step) + eps
    with np.errstate(invalid="ignore"):  # inf / inf where a parameter is infinite
        return p - lr / (1.0 - b1**step) * m / denom, m, v, vmax


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("decoupled,wd,maximize", [(True, 0.1, False), (False, 0.05, True), (True, 0.0, True)])
def test_adam_kernel_against_float64_formula(amsgrad, decoupled, wd, maximize):
    from opsnn.kernels.cpu import optimizer as K

    # chunks of every length: several full ones, a ragged tail, a tensor shorter than a vector
    sizes = [2 * K.CHUNK + 13, 5, 1]
    rng = np.random.default_rng(7)
    p, g, m = ([rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(3))
    v, vmax = ([np.abs(rng.standard_normal(n)).astype(np.float32) for n in sizes] for _ in range(2))
    p[0][:3] = (np.inf, -np.inf, np.nan)  # non-finite parameters stay what the formula makes them
    step, lr, b1, b2, eps = 3.0, 0.01, 0.9, 0.99, 1e-8
    want = [
        _adam_f64(
            *(a[t].astype(np.float64) for a in (p, g, m, v, vmax)),
            step,
            lr,
            b1,
            b2,
            eps,
            wd,
            amsgrad,
            decoupled,
            maximize,
        )
        for t in range(len(sizes))
    ]
    hyper = np.tile([lr, b1, b2, eps, wd, 1.0 - b1**step, 1.0 - b2**step], (len(sizes), 1))
    flags = np.tile(np.array([amsgrad, decoupled, maximize], np.int64), (len(sizes), 1))
    lists = [K.typed_list(a) for a in (p, g, m, v, vmax if amsgrad else v)]
    K.adam_step(*lists, K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        for got, w in zip((p[t], m[t], v[t]) + ((vmax[t],) if amsgrad else ()), want[t][:3] + want[t][3:] * amsgrad):
            # float64 arithmetic rounded once when stored: equal to the oracle rounded to float32
            np.testing.assert_array_equal(got, w.astype(np.float32))


@pytest.mark.parametrize(
    "momentum,dampening,nesterov,first", [(0.0, 0.0, False, False), (0.9, 0.1, False, False), (0.8, 0.0, True, True)]
)
@pytest.mark.parametrize("maximize", [False, True])
def test_sgd_kernel_against_float64_formula(momentum, dampening, nesterov, first, maximize):
    from opsnn.kernels.cpu import optimizer as K

    sizes = [2 * K.CHUNK + 13, 5, 1]  # full chunks, a ragged tail, a tensor shorter than a vector
    rng = np.random.default_rng(8)
    p, g, b = ([rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(3))
    p[0][:3] = (np.inf, -np.inf, np.nan)
    lr, wd = 0.1, 0.01
    want = []
    for t in range(len(sizes)):
        pt, gt, bt = (a[t].astype(np.float64) for a in (p, g, b))
        gt = (-gt if maximize else gt) + wd * pt
        if momentum:
            bt = (gt if first else momentum * bt + (1.0 - dampening) * gt).astype(np.float32).astype(np.float64)
            gt = gt + momentum * bt if nesterov else bt
        want.append((pt - lr * gt, bt))
    hyper = np.tile([lr, momentum, dampening, wd], (len(sizes), 1))
    flags = np.tile(np.array([nesterov, maximize, first], np.int64), (len(sizes), 1))
    K.sgd_step(*(K.typed_list(a) for a in (p, g, b if momentum else p)), K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        # float64 arithmetic rounded once when stored: equal to the oracle rounded to float32
        np.testing.assert_array_equal(p[t], want[t][0].astype(np.float32))
        if momentum:
            np.testing.assert_array_equal(b[t], want[t][1].astype(np.float32))


def test_optimizer_state_dict_round_trip_and_mismatch_errors():
    ps = [nn.Parameter(RNG.standard_normal((4, 3)).astype(np.float32)), nn.Parameter(np.zeros(3, np.float32))]
    grads = [[RNG.standard_normal(p.shape).astype(np.float32) for p in ps] for _ in range(5)]

    def run(opt, params, steps):
        for gs in steps:
            for p, g in zip(params, gs):
                p.grad = opsnn.tensor(g)
            opt.step()

    opt = optim.AdamW(ps, lr=0.05, amsgrad=True)
    run(opt, ps, grads[:2])
    sd = opt.state_dict()
    ps2 = [nn.Parameter(p.numpy()) for p in ps]
    opt2 = optim.AdamW(ps2, lr=0.9)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 0.05
    run(opt, ps, grads[2:])
    run(opt2, ps2, grads[2:])
    for p, q in zip(ps, ps2):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    before = {k: v for k, v in opt2.state_dict()["state"].items()}
    with pytest.raises(optim.OptimizerStateError, match="1 parameters in the state dict, 2 here"):
        opt2.load_state_dict(optim.AdamW([nn.Parameter(np.zeros(3, np.float32))]).state_dict())
    with pytest.raises(optim.OptimizerStateError, match="lacks option"):
        opt2.load_state_dict(optim.SGD(ps2, lr=0.1).state_dict())
    wrong = optim.AdamW([nn.Parameter(np.zeros((3, 4), np.float32)), nn.Parameter(np.zeros(3, np.float32))])
    wrong.state_dict()
    for p in wrong.param_groups[0]["params"]:
        p.grad = opsnn.tensor(np.ones(p.shape, np.float32))
    wrong.step()
    with pytest.raises(optim.OptimizerStateError, match=r"shape \(3, 4\), the parameter \(4, 3\)"):
        opt2.load_state_dict(wrong.state_dict())
    after = opt2.state_dict()["state"]
    for k in before:  # nothing was written by the failed loads
        np.testing.assert_array_equal(before[k]["exp_avg"].numpy(), after[k]["exp_avg"].numpy())


def test_optimizer_rejects_tensors_that_do_not_require_grad():
    frozen = nn.Parameter(np.zeros(3, np.float32)).requires_grad_(False)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="does not require grad"):
        optim.SGD([frozen], lr=0.1)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="nesterov"):
        optim.SGD([nn.Parameter(np.zeros(3, np.float32))], lr=0.1, nesterov=True)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="betas"):
        optim.Adam([nn.Parameter(np.zeros(3, np.float32))], betas=(0.9, 1.5))


@pytest.mark.parametrize("name,op", [("SGD", "ApplySGD"), ("AdamW", "ApplyAdamW")])
def test_an_eager_optimizer_step_is_one_observed_kernel_on_the_current_stream(name, op):
    """The eager step runs its fused update as a task of the current stream, named as the compiled
    step's node: the profiler sees one kernel per dtype group; issued on a worker stream it updates
    the parameters exactly as on the default stream, and they are updated when step() returns."""
    init = [RNG.standard_normal(s).astype(np.float32) for s in ((300,), (4, 5))]
    grads = [RNG.standard_normal(a.shape).astype(np.float32) for a in init]
    results = []
    for worker in (False, True):
        ps = [nn.Parameter(a.copy()) for a in init]
        opt = getattr(optim, name)(ps, lr=0.1, weight_decay=0.01)
        for p, g in zip(ps, grads):
            p.grad = opsnn.tensor(g)
        s = opsnn.Stream() if worker else None
        with opsnn.profiler.profile() as prof:
            if s is None:
                opt.step()
            else:
                with s:
                    opt.step()
        got = [p.numpy().copy() for p in ps]  # read without a synchronize of our own
        assert [(k.op, k.kernel) for k in prof.kernels] == [(op, op.lower() + "_numba")]
        assert all(not np.array_equal(g, a) for g, a in zip(got, init))
        results.append(got)
        if s is not None:
            s.close()
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


# -- models trained side by side with torch -----------------------------------------------------------------
def _cnn(lib):
    n = lib.nn
    # no bias before BatchNorm: its true gradient is 0, so Adam would amplify rounding noise into steps
    return n.Sequential(
        n.Conv2d(3, 8, 3, padding=1, bias=False),
        n.BatchNorm2d(8),
        n.ReLU(),
        n.MaxPool2d(2),
        n.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
        n.ReLU(),
        n.Flatten(),
        n.Linear(8 * 2 * 2, 5),
    )


def _mlp(lib):
    n = lib.nn
    return n.Sequential(n.Linear(10, 16), n.GELU(), n.Linear(16, 16), n.Tanh(), n.Linear(16, 4))


def _train_pair(build, x, y, make_opt, loss_kind, steps=20):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmodel = build(torch).train()
    model = build(opsnn).train()
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt, topt = make_opt(optim, list(model.parameters())), make_opt(torch.optim, list(tmodel.parameters()))
    if loss_kind == "ce":
        loss_fn, tloss_fn = nn.CrossEntropyLoss(label_smoothing=0.1), torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    else:
        loss_fn, tloss_fn = nn.MSELoss(), torch.nn.MSELoss()
    losses, tlosses = [], []
    xt, yt = torch.tensor(x), torch.tensor(y)
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(opsnn.tensor(x)), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        topt.zero_grad()
        tl = tloss_fn(tmodel(xt), yt)
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    return model, tmodel, np.array(losses), np.array(tlosses)


def _sgd(lib, params):
    return lib.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def _adamw(lib, params):
    return lib.AdamW(params, lr=3e-3, weight_decay=0.05)


@pytest.mark.parametrize("make_opt", [_sgd, _adamw], ids=["sgd_momentum", "adamw"])
@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_model_trains_like_torch(kind, make_opt):
    if kind == "cnn":
        x = RNG.standard_normal((6, 3, 8, 8)).astype(np.float32)
        y = RNG.integers(0, 5, size=6)
        model, tmodel, losses, tlosses = _train_pair(_cnn, x, y, make_opt, "ce")
    else:
        x = RNG.standard_normal((12, 10)).astype(np.float32)
        y = RNG.standard_normal((12, 4)).astype(np.float32)
        model, tmodel, losses, tlosses = _train_pair(_mlp, x, y, make_opt, "mse")
    assert losses[-1] < 0.8 * losses[0]  # it learns
    # float32 end to end, different summation orders: 20 steps stay within these (measured: ~1e-6)
    np.testing.assert_allclose(losses, tlosses, rtol=2e-5, atol=1e-6)
    tsd = tmodel.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), tsd[name].detach().numpy(), rtol=1e-4, atol=2e-5, err_msg=name)


def test_training_steps_return_pool_memory(no_leak):
    x = opsnn.tensor(RNG.standard_normal((4, 3, 8, 8)).astype(np.float32))
    y = RNG.integers(0, 5, size=4)
    model = _cnn(opsnn).train()
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    live = []
    for _ in range(6):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        del loss
        opsnn.current_stream().synchronize()
        live.append(opsnn.memory.current_bytes())
    # steady state: after the first step (optimizer state allocated) each step frees what it made
    assert live[2:] == [live[1]] * 4, live
    del model, opt, x


# -- learning-rate schedulers ------------------------------------------------------------------------------
SCHEDULES = [
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("CosineAnnealingLR", {"T_max": 7, "eta_min": 0.001}),
    ("LinearLR", {"start_factor": 0.1, "total_iters": 4}),
    ("LambdaLR", {"lr_lambda": lambda e: 1.0 / (1 + e)}),
    ("warmup_cosine", None),
]


@pytest.mark.parametrize("name,kw", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_lr_schedulers_match_torch(name, kw):
    torch = pytest.importorskip("torch")

    def build(lib, opt):
        sch = lib.optim.lr_scheduler
        if name == "warmup_cosine":
            return sch.SequentialLR(opt, [sch.LinearLR(opt, 0.2, total_iters=3), sch.CosineAnnealingLR(opt, 6)], [3])
        return getattr(sch, name)(opt, **kw)

    opt = optim.SGD(
        [
            {"params": [nn.Parameter(np.zeros(2, np.float32))]},
            {"params": [nn.Parameter(np.zeros(2, np.float32))], "lr": 0.3},
        ],
        lr=0.1,
    )
    topt = torch.optim.SGD(
        [{"params": [torch.zeros(2, requires_grad=True)]}, {"params": [torch.zeros(2, requires_grad=True)], "lr": 0.3}],
        lr=0.1,
    )
    sched, tsched = build(opsnn, opt), build(torch, topt)
    for _ in range(15):
        np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-9, atol=1e-15)
        opt.step()
        topt.step()
        sched.step()
        tsched.step()


# -- loss scaling -------------------------------------------------------------------------------------------
def test_grad_scaler_skips_overflowing_steps_and_tracks_torchs_scale():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmodel = _mlp(torch)
    model = _mlp(opsnn)
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt, topt = optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(tmodel.parameters(), lr=0.05)
    scaler = opsnn.amp.GradScaler(init_scale=256.0, growth_interval=2)
    tscaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    x = RNG.standard_normal((8, 10)).astype(np.float32)
    y = RNG.standard_normal((8, 4)).astype(np.float32)
    scales = []
    for step in range(7):
        opt.zero_grad()
        topt.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(opsnn.tensor(x)), y)).backward()
        tscaler.scale(torch.nn.functional.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y))).backward()
        if step in (2, 3):  # force an overflow: the step is skipped and the scale halves
            first = next(iter(model.parameters()))
            first.grad.numpy()[0, 0] = np.inf if step == 2 else np.nan
            next(iter(tmodel.parameters())).grad[0, 0] = float("inf") if step == 2 else float("nan")
        scaler.unscale_(opt)
        tscaler.unscale_(topt)
        with pytest.raises(opsnn.amp.GradScalerStateError, match="already called"):
            scaler.unscale_(opt)
        before = [p.numpy().copy() for p in model.parameters()]
        scaler.step(opt)
        tscaler.step(topt)
        if step in (2, 3):
            for b, p in zip(before, model.parameters()):
                np.testing.assert_array_equal(b, p.numpy())  # nothing corrupted
        scaler.update()
        tscaler.update()
        scales.append(scaler.get_scale())
        assert scaler.get_scale() == tscaler.get_scale()
    assert scales == [256.0, 512.0, 256.0, 128.0, 128.0, 256.0, 256.0]
    tsd = tmodel.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), tsd[name].detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


# -- checkpoints ---------------------------------------------------------------------------------------------
def test_checkpoint_resume_is_bit_identical(tmp_path):
    x = opsnn.tensor(RNG.standard_normal((4, 3, 8, 8)).astype(np.float32))
    y = RNG.integers(0, 5, size=4)

    def run(model, opt, scaler, sched, steps):
        for _ in range(steps):
            opt.zero_grad()
            scaler.scale(nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()

    def fresh(seed):
        with nn.init.seeded(seed):
            model = _cnn(opsnn).train()
        opt = optim.AdamW(
            [{"params": list(model.parameters())[:3]}, {"params": list(model.parameters())[3:], "lr": 2e-3}],
            lr=1e-3,
            amsgrad=True,
        )
        return (
            model,
            opt,
            opsnn.amp.GradScaler(init_scale=64.0, growth_interval=2),
            optim.lr_scheduler.CosineAnnealingLR(opt, 10),
        )

    model, opt, scaler, sched = fresh(0)
    run(model, opt, scaler, sched, 3)
    path = opsnn.save_checkpoint(
        tmp_path / "ck.safetensors", model, opt, step=3, scaler=scaler, scheduler=sched, extra={"note": "three steps"}
    )
    run(model, opt, scaler, sched, 3)
    model2, opt2, scaler2, sched2 = fresh(1)
    info = opsnn.load_checkpoint(path, model2, opt2, scaler=scaler2, scheduler=sched2)
    assert info == {"step": 3, "extra": {"note": "three steps"}}
    run(model2, opt2, scaler2, sched2, 3)
    sd2 = model2.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd2[name].numpy(), err_msg=name)
    assert scaler.get_scale() == scaler2.get_scale() and sched.get_last_lr() == sched2.get_last_lr()
    # a checkpoint of another optimizer or model is refused before anything is written
    before = [p.numpy().copy() for p in model2.parameters()]
    with pytest.raises(opsnn.checkpoint.CheckpointError, match="AdamW state, the optimizer is SGD"):
        opsnn.load_checkpoint(path, model2, optim.SGD(model2.parameters(), lr=0.1))
    with pytest.raises(opsnn.nn.StateDictError):
        opsnn.load_checkpoint(path, _mlp(opsnn))
    for b, p in zip(before, model2.parameters()):
        np.testing.assert_array_equal(b, p.numpy())


def _encoder(lib, vocab=11, d=16, heads=4, layers=2, classes=3):
    n = lib.nn

    class Block(n.Module):
        def __init__(self):
            super().__init__()
            self.attn = n.MultiheadAttention(d, heads, batch_first=True)
            self.norm1, self.norm2 = n.LayerNorm(d), n.LayerNorm(d)
            self.ff1, self.act, self.ff2 = n.Linear(d, 2 * d), n.GELU(), n.Linear(2 * d, d)

        def forward(self, x, pad):
            a = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]
            x = self.norm1(x + a)
            return self.norm2(x + self.ff2(self.act(self.ff1(x))))

    class Encoder(n.Module):
        def __init__(self):
            super().__init__()
            self.emb = n.Embedding(vocab, d)
            self.blocks = n.ModuleList([Block() for _ in range(layers)])
            self.head = n.Linear(d, classes)

        def forward(self, ids, pad):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x, pad)
            return self.head(x)  # a class per token

    return Encoder()


@pytest.mark.parametrize("make_opt", [_sgd, _adamw], ids=["sgd_momentum", "adamw"])
def test_transformer_encoder_trains_like_torch(make_opt):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmodel, model = _encoder(torch).train(), _encoder(opsnn).train()
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt, topt = make_opt(optim, list(model.parameters())), make_opt(torch.optim, list(tmodel.parameters()))
    ids = RNG.integers(0, 11, size=(3, 6))
    pad = np.zeros((3, 6), bool)
    pad[1, 4:] = pad[2, 5:] = True  # padded keys are left out
    y = RNG.integers(0, 3, size=(3, 6))
    y[pad] = -100  # and their tokens ignored by the loss
    losses, tlosses = [], []
    for _ in range(20):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ops.transpose(model(ids, pad), [0, 2, 1]), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(
            tmodel(torch.tensor(ids), torch.tensor(pad)).transpose(1, 2), torch.tensor(y)
        )
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    assert losses[-1] < 0.9 * losses[0]
    np.testing.assert_allclose(losses, tlosses, rtol=2e-5, atol=1e-6)
    tsd = tmodel.state_dict()
    for name, v in model.state_dict().items():
        a, b = v.numpy(), tsd[name].detach().numpy()
        if name.endswith("in_proj_bias"):
            # the key bias adds one constant to a whole score row, which softmax ignores: its true gradient
            # is 0, and Adam turns either library's rounding noise into full-size steps
            a, b = np.delete(a, np.s_[16:32]), np.delete(b, np.s_[16:32])
        # looser than the CNN's: Adam's normalised steps amplify rounding differences in small gradients
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-4, err_msg=name)


def _tagger(lib, vocab=13, d=8, hidden=6, tags=4, rnn="LSTM"):
    n = lib.nn

    class Tagger(n.Module):
        def __init__(self):
            super().__init__()
            self.emb = n.Embedding(vocab, d)
            self.lstm = getattr(n, rnn)(d, hidden, num_layers=2, batch_first=True, bidirectional=True)
            self.head = n.Linear(2 * hidden, tags)

        def forward(self, ids):
            return self.head(self.lstm(self.emb(ids))[0])

    return Tagger()


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda lib, p: lib.SGD(p, lr=0.5, momentum=0.9, weight_decay=1e-4),
        lambda lib, p: lib.AdamW(p, lr=2e-2, weight_decay=0.05),
    ],
    ids=["sgd_momentum", "adamw"],
)
@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_rnn_tagger_trains_like_torch(rnn, make_opt):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmodel, model = _tagger(torch, rnn=rnn).train(), _tagger(opsnn, rnn=rnn).train()
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt, topt = make_opt(optim, list(model.parameters())), make_opt(torch.optim, list(tmodel.parameters()))
    ids, y = RNG.integers(0, 13, size=(3, 5)), RNG.integers(0, 4, size=(3, 5))
    losses, tlosses = [], []
    for _ in range(20):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ops.transpose(model(ids), [0, 2, 1]), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(tmodel(torch.tensor(ids)).transpose(1, 2), torch.tensor(y))
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    np.testing.assert_allclose(losses, tlosses, rtol=2e-5, atol=1e-6)
    assert losses[-1] < 0.9 * losses[0]
    tsd = tmodel.state_dict()
    for name, v in model.state_dict().items():
        np.testing.assert_allclose(v.numpy(), tsd[name].detach().numpy(), rtol=1e-4, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("name", ["resnet18", "bert-tiny", "llama-tiny"])
def test_builtin_models_backpropagate_to_their_parameters(name):
    from opsnn import models

    rng = np.random.default_rng(0)
    if name == "resnet18":
        model, args = (
            models.resnet18(num_classes=10),
            [opsnn.tensor(rng.standard_normal((2, 3, 16, 16)).astype(np.float32))],
        )
    elif name == "bert-tiny":
        model, args = models.bert("tiny"), [rng.integers(0, 100, (2, 8))]
    else:
        model, args = models.llama(layers=1, hidden=64, heads=4, kv_heads=2, vocab=100), [rng.integers(0, 100, (2, 8))]
    out = model.train()(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ops.sum(ops.mul(out, out)).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    # BERT's first output is the sequence output: the pooler is not on its path
    assert missing == ([] if name != "bert-tiny" else [n for n in missing if n.startswith("pooler")]), missing
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert np.isfinite(p.grad.numpy()).all(), n
