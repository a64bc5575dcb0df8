"""RMSprop and Adagrad (``opsnn.optim``): the fused kernels against a float64 numpy oracle of torch's
update bit for bit (NaN and Inf included, several chunks), the ``ApplyRMSprop`` / ``ApplyAdagrad``
records against their references, the optimizers step by step against torch.optim (every option, two
parameter groups), eager and inside a compiled training step, state dicts and typed errors.

Tolerances against torch: torch rounds every intermediate to float32, opsnn computes in float64 and
rounds once when it stores, so parameters and states agree to rtol 2e-5 / atol 1e-6 after 12 steps
(differences are a few float32 ulps of the states, divided by small denominators).
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn, optim
from opsnn.errors import ParamInvalidError
from opsnn.kernels.cpu import optimizer as K

RNG = np.random.default_rng(11)
STEPS = 12
SHAPES = [(4, 3), (5,), (2, 2, 3)]


# -- the kernels against a float64 numpy oracle ------------------------------------------------------------
def _rmsprop_oracle(p, g, sq, buf, ga, lr, alpha, eps, wd, mom, centered, maximize, use_buf):
    p, sq, buf, ga = p.copy(), sq.copy(), buf.copy(), ga.copy()
    dt = p.dtype
    with np.errstate(all="ignore"):
        gi = g.astype(np.float64) * (-1.0 if maximize else 1.0)
        pi = p.astype(np.float64)
        if wd != 0.0:
            gi = gi + wd * pi
        sq[:] = (alpha * sq.astype(np.float64) + (1.0 - alpha) * gi * gi).astype(dt)
        var = sq.astype(np.float64)
        if centered:
            g0 = ga.astype(np.float64)
            ga[:] = (g0 + (1.0 - alpha) * (gi - g0)).astype(dt)
            var = var - ga.astype(np.float64) * ga.astype(np.float64)
        avg = np.sqrt(var) + eps
        if use_buf:
            buf[:] = (mom * buf.astype(np.float64) + gi / avg).astype(dt)
            p[:] = (pi - lr * buf.astype(np.float64)).astype(dt)
        else:
            p[:] = (pi - lr * gi / avg).astype(dt)
    return p, sq, buf, ga


def _nonfinite(ps, gs):
    ps[0][:3] = [np.inf, np.nan, -0.0]
    gs[0][3:6] = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("centered", [0, 1])
@pytest.mark.parametrize("use_buf", [0, 1])
@pytest.mark.parametrize("maximize", [0, 1])
@pytest.mark.parametrize("wd", [0.0, 0.02])
def test_rmsprop_step_is_the_float64_formula_bit_for_bit(dtype, centered, use_buf, maximize, wd):
    sizes = [K.CHUNK + 3, 7, 1]
    ps = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    gs = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    sqs = [np.abs(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    bufs = [(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    gas = [(RNG.standard_normal(n) * 0.1).astype(dtype) for n in sizes]
    _nonfinite(ps, gs)
    gs[2][0], sqs[2][0], gas[2][0] = 0.0, 0.0, 0.0  # eps 0 below: 0 / 0, NaN as numpy
    hyper = np.array([[1e-2, 0.99, 1e-8, wd, 0.9], [5e-3, 0.5, 1e-6, wd, 0.0], [1e-2, 0.9, 0.0, wd, 0.5]])
    flags = np.array([[centered, maximize, use_buf]] * len(sizes), np.int64)
    want = [
        _rmsprop_oracle(ps[t], gs[t], sqs[t], bufs[t], gas[t], *hyper[t], centered, maximize, use_buf)
        for t in range(len(sizes))
    ]
    tl = K.typed_list
    K.rmsprop_step(tl(ps), tl(gs), tl(sqs), tl(bufs), tl(gas), K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        for name, got, w in zip(
            ("param", "square_avg", "momentum_buffer", "grad_avg"), (ps[t], sqs[t], bufs[t], gas[t]), want[t]
        ):
            np.testing.assert_array_equal(got, w, err_msg=f"{name} {t}")
    assert np.isnan(ps[0][1]) and np.isnan(ps[0][3])  # NaN parameter and NaN gradient stay NaN


def _adagrad_oracle(p, g, acc, lr, lr_decay, wd, eps, step, maximize):
    p, acc = p.copy(), acc.copy()
    with np.errstate(all="ignore"):
        gi = g.astype(np.float64) * (-1.0 if maximize else 1.0)
        pi = p.astype(np.float64)
        if wd != 0.0:
            gi = gi + wd * pi
        acc[:] = (acc.astype(np.float64) + gi * gi).astype(acc.dtype)
        clr = lr / (1.0 + (step - 1.0) * lr_decay)
        p[:] = (pi - clr * gi / (np.sqrt(acc.astype(np.float64)) + eps)).astype(p.dtype)
    return p, acc


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("maximize", [0, 1])
@pytest.mark.parametrize("wd", [0.0, 0.02])
def test_adagrad_step_is_the_float64_formula_bit_for_bit(dtype, maximize, wd):
    sizes = [K.CHUNK * 2 + 5, 9, 1]
    ps = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    gs = [RNG.standard_normal(n).astype(dtype) for n in sizes]
    accs = [np.abs(RNG.standard_normal(n)).astype(dtype) for n in sizes]
    _nonfinite(ps, gs)
    gs[2][0], accs[2][0] = 0.0, 0.0  # eps 0 below: 0 / 0, NaN as numpy
    hyper = np.array([[1e-2, 0.0, wd, 1e-10, 1.0], [0.1, 0.05, wd, 1e-6, 7.0], [0.1, 0.0, wd, 0.0, 3.0]])
    flags = np.array([[maximize]] * len(sizes), np.int64)
    want = [_adagrad_oracle(ps[t], gs[t], accs[t], *hyper[t], maximize) for t in range(len(sizes))]
    tl = K.typed_list
    K.adagrad_step(tl(ps), tl(gs), tl(accs), K.chunk_table(sizes), hyper, flags)
    for t in range(len(sizes)):
        np.testing.assert_array_equal(ps[t], want[t][0], err_msg=f"param {t}")
        np.testing.assert_array_equal(accs[t], want[t][1], err_msg=f"sum {t}")
    assert np.isposinf(accs[0][4]) and (wd != 0.0 or np.isnan(ps[2][0]))


def test_apply_ops_match_their_references():
    """The records' kernels (through ``opsnn.ops``) against their float64 references, every state layout."""
    from opsnn.ops.registry import get_op

    p = [RNG.standard_normal(s).astype(np.float32) for s in ((7, 3), (5,))]
    g = [RNG.standard_normal(a.shape).astype(np.float32) for a in p]
    sq = [np.abs(RNG.standard_normal(a.shape)).astype(np.float32) for a in p]
    b = [RNG.standard_normal(a.shape).astype(np.float32) * 0.1 for a in p]
    hyper = np.array([[0.01, 0.9, 1e-8, 0.01, 0.9], [0.05, 0.5, 1e-6, 0.0, 0.5]])
    flags = np.array([[1, 0, 1], [0, 1, 1]], np.int64)
    for bufs, gavgs in ((None, None), (b, None), (None, b), (b, [a * 0.5 for a in b])):
        got = opsnn.ops.apply_rmsprop(hyper, flags, p, g, sq, bufs, gavgs)
        attrs = {"momentum_buffers": int(bufs is not None), "centered": int(gavgs is not None)}
        extra = [x for s in (bufs, gavgs) if s is not None for x in s]
        want = get_op("ApplyRMSprop", "opsnn").reference([hyper, flags, *p, *g, *sq, *extra], attrs)
        assert len(got) == len(want) == 2 * (2 + len(extra) // 2)
        for a, w in zip(got, want):
            np.testing.assert_allclose(a.numpy(), w, rtol=1e-6, atol=1e-7)
    hyper = np.array([[0.1, 0.01, 0.01, 1e-10, 3.0], [0.05, 0.0, 0.0, 1e-6, 1.0]])
    flags = np.array([[0], [1]], np.int64)
    got = opsnn.ops.apply_adagrad(hyper, flags, p, g, sq)
    want = get_op("ApplyAdagrad", "opsnn").reference([hyper, flags, *p, *g, *sq], {})
    for a, w in zip(got, want):
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-6, atol=1e-7)


def test_apply_op_with_a_wrong_hyper_table_is_a_typed_error():
    p = [np.zeros(3, np.float32)]
    with pytest.raises(opsnn.errors.OpsnnError, match=r"hyper.*\(1, 5\)"):
        opsnn.ops.apply_rmsprop(np.zeros((1, 4)), np.zeros((1, 3), np.int64), p, p, p)
    with pytest.raises(opsnn.errors.OpsnnError, match=r"flags.*\(1, 1\)"):
        opsnn.ops.apply_adagrad(np.zeros((1, 5)), np.zeros((1, 3), np.int64), p, p, p)


# -- the optimizers against torch.optim ------------------------------------------------------------------------
RMSPROP = {
    "default": ({}, {"lr": 0.003}),
    "momentum": ({"momentum": 0.9}, {"momentum": 0.0, "lr": 0.02}),
    "centered": ({"centered": True, "alpha": 0.9}, {"centered": False}),
    "all": ({"centered": True, "momentum": 0.5, "weight_decay": 0.1, "maximize": True, "eps": 1e-3}, {"alpha": 0.5}),
}
ADAGRAD = {
    "default": ({}, {"lr": 0.05}),
    "decay": ({"lr_decay": 0.1, "weight_decay": 0.05}, {"lr_decay": 0.0}),
    "initial": ({"initial_accumulator_value": 0.5, "eps": 1e-6}, {"maximize": True}),
    "all": ({"lr_decay": 0.2, "weight_decay": 0.1, "initial_accumulator_value": 0.1, "maximize": True}, {"lr": 0.3}),
}


def _pair(name, kw, group1):
    """The same parameters in opsnn and torch, as two groups (the second overriding ``group1``)."""
    torch = pytest.importorskip("torch")
    init = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [nn.Parameter(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    o = getattr(optim, name)([{"params": ours[:2]}, {"params": ours[2:], **group1}], lr=0.01, **kw)
    t = getattr(torch.optim, name)([{"params": theirs[:2]}, {"params": theirs[2:], **group1}], lr=0.01, **kw)
    return torch, ours, theirs, o, t


def _steps(torch, ours, theirs, o, t, steps=STEPS):
    for _ in range(steps):
        for a, b in zip(ours, theirs):
            g = RNG.standard_normal(a.shape).astype(np.float32)
            a.grad = opsnn.tensor(g)
            b.grad = torch.tensor(g)
        o.step()
        t.step()
        _same(ours, theirs, o, t)


def _same(ours, theirs, o, t):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"param {i}")
        st, tst = o.state[a], t.state[b]
        assert set(st) == set(tst), (sorted(st), sorted(tst))
        for key, v in tst.items():
            if key == "step":
                assert st[key] == float(v)
            else:
                np.testing.assert_allclose(st[key].numpy(), v.numpy(), rtol=2e-5, atol=1e-6, err_msg=f"{key} {i}")


@pytest.mark.parametrize("case", sorted(RMSPROP))
def test_rmsprop_matches_torch_step_by_step(case):
    _steps(*_pair("RMSprop", *RMSPROP[case]))


@pytest.mark.parametrize("case", sorted(ADAGRAD))
def test_adagrad_matches_torch_step_by_step(case):
    torch, ours, theirs, o, t = _pair("Adagrad", *ADAGRAD[case])
    _same(ours, theirs, o, t)  # the state exists before the first step, as torch's
    _steps(torch, ours, theirs, o, t)


def test_a_parameter_without_gradient_is_left_alone():
    torch, ours, theirs, o, t = _pair("RMSprop", {"momentum": 0.9}, {})
    ours[1].grad = opsnn.tensor(np.ones(SHAPES[1], np.float32))
    before = [a.numpy().copy() for a in ours]
    o.step()
    assert np.array_equal(before[0], ours[0].numpy()) and not np.array_equal(before[1], ours[1].numpy())
    assert ours[0] not in o.state and o.state[ours[1]]["step"] == 1.0


# -- state dicts --------------------------------------------------------------------------------------------------
def _torch_state_to_numpy(sd):
    state = {k: {n: v.numpy() for n, v in st.items()} for k, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


@pytest.mark.parametrize("name, kw", [("RMSprop", RMSPROP["all"][0]), ("Adagrad", ADAGRAD["all"][0])])
def test_state_dict_round_trip_and_torch_checkpoints(name, kw):
    torch, ours, theirs, o, t = _pair(name, kw, {"lr": 0.02})
    _steps(torch, ours, theirs, o, t, steps=3)
    sd = o.state_dict()
    assert {k: set(v) for k, v in sd["state"].items()} == {k: set(v) for k, v in t.state_dict()["state"].items()}
    # a fresh optimizer over copies of the parameters, loaded from ours, and another from torch's checkpoint
    mirrors = []
    for source in (sd, _torch_state_to_numpy(t.state_dict())):
        ps = [nn.Parameter(a.numpy().copy()) for a in ours]
        fresh = getattr(optim, name)([{"params": ps[:2]}, {"params": ps[2:]}], lr=0.5)
        fresh.load_state_dict(source)
        assert fresh.param_groups[1]["lr"] == 0.02 and fresh.param_groups[0]["lr"] == 0.01
        mirrors.append((ps, fresh))
    for _ in range(3):
        grads = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]
        for ps, opt in [(ours, o), *mirrors]:
            for p, g in zip(ps, grads):
                p.grad = opsnn.tensor(g)
            opt.step()
        for p, g in zip(theirs, grads):
            p.grad = torch.tensor(g)
        t.step()
    for ps, opt in mirrors:
        _same(ps, theirs, opt, t)


def test_a_mismatched_state_dict_is_a_typed_error_and_writes_nothing():
    ps = [nn.Parameter(np.ones(s, np.float32)) for s in SHAPES]
    rms = optim.RMSprop(ps, momentum=0.9)
    for p in ps:
        p.grad = opsnn.tensor(np.ones(p.shape, np.float32))
    rms.step()
    before = rms.state_dict()
    ada = optim.Adagrad(ps)
    with pytest.raises(optim.OptimizerStateError, match="lacks option"):
        rms.load_state_dict(ada.state_dict())
    with pytest.raises(optim.OptimizerStateError, match="lacks option"):
        ada.load_state_dict(before)
    other = optim.RMSprop([nn.Parameter(np.ones(s, np.float32)) for s in SHAPES[::-1]], momentum=0.9)
    with pytest.raises(optim.OptimizerStateError, match="shape"):
        other.load_state_dict(before)
    wrong_key = rms.state_dict()
    wrong_key["state"][0]["sum"] = wrong_key["state"][0].pop("square_avg")
    with pytest.raises(optim.OptimizerStateError, match="'sum'"):
        rms.load_state_dict(wrong_key)
    after = rms.state_dict()
    for k, st in before["state"].items():
        np.testing.assert_array_equal(st["square_avg"].numpy(), after["state"][k]["square_avg"].numpy())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: optim.RMSprop(ps, lr=-0.1), "RMSprop: lr must be >= 0, got -0.1"),
        (lambda ps: optim.RMSprop(ps, alpha=-0.5), "RMSprop: alpha must be >= 0"),
        (lambda ps: optim.RMSprop(ps, eps=-1e-8), "RMSprop: eps must be >= 0"),
        (lambda ps: optim.RMSprop(ps, momentum=-0.9), "RMSprop: momentum must be >= 0"),
        (lambda ps: optim.RMSprop(ps, weight_decay=float("nan")), "RMSprop: weight_decay must be >= 0"),
        (lambda ps: optim.RMSprop(ps, alpha="0.9"), "RMSprop: alpha must be a number"),
        (lambda ps: optim.RMSprop(ps, capturable=True), "RMSprop: differentiable/capturable"),
        (lambda ps: optim.RMSprop([{"params": ps, "nesterov": True}]), r"unknown option\(s\) \['nesterov'\]"),
        (lambda ps: optim.Adagrad(ps, lr=-1.0), "Adagrad: lr must be >= 0"),
        (lambda ps: optim.Adagrad(ps, lr_decay=-0.1), "Adagrad: lr_decay must be >= 0"),
        (lambda ps: optim.Adagrad(ps, initial_accumulator_value=-1), "Adagrad: initial_accumulator_value must"),
        (lambda ps: optim.Adagrad(ps, eps=None), "Adagrad: eps must be a number"),
        (lambda ps: optim.Adagrad(ps, differentiable=True), "Adagrad: differentiable=True is not supported"),
    ],
)
def test_bad_hyper_parameters_are_typed_errors(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make([nn.Parameter(np.zeros(3, np.float32))])


# -- inside a compiled training step ---------------------------------------------------------------------------
def _groups_rms(lib, ps):
    return lib.RMSprop([{"params": ps[:2], "momentum": 0.9, "centered": True}, {"params": ps[2:]}], lr=0.01)


def _groups_ada(lib, ps):
    return lib.Adagrad([{"params": ps[:2], "lr_decay": 0.1}, {"params": ps[2:], "initial_accumulator_value": 0.2}])


@pytest.mark.parametrize("make_opt, op, nodes", [(_groups_rms, "ApplyRMSprop", 2), (_groups_ada, "ApplyAdagrad", 1)])
def test_compiled_step_matches_eager(make_opt, op, nodes):
    from test_compiled_training import _data, _run

    batches = [_data("mlp") for _ in range(6)]
    em, eopt, _, elosses = _run("mlp", make_opt, False, batches)
    cm, copt, step, closses = _run("mlp", make_opt, True, batches)
    assert step.num_compiles == 1 and step.mode == "compiled"
    # one fused update per group of equal states (two RMSprop layouts here, one for Adagrad)
    assert [n.op_type for n in step.graph().nodes].count(op) == nodes
    np.testing.assert_allclose(closses, elosses, rtol=1e-5, atol=1e-7)
    for pe, pc in zip(em.parameters(), cm.parameters()):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-5, atol=1e-6)
        for key, val in eopt.state[pe].items():
            got = copt.state[pc][key]
            if key == "step":
                assert got == val
            else:
                np.testing.assert_allclose(got.numpy(), val.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


# -- learning-rate schedulers -----------------------------------------------------------------------------------
ONE_CYCLE = {
    "cos": {"max_lr": 0.5, "total_steps": 20},
    "linear_three_phase": {"max_lr": [0.5, 0.2], "total_steps": 21, "anneal_strategy": "linear", "three_phase": True},
    "epochs": {"max_lr": 1.0, "epochs": 4, "steps_per_epoch": 5, "pct_start": 0.25, "div_factor": 10.0,
               "final_div_factor": 100.0, "base_momentum": [0.8, 0.7], "max_momentum": 0.9},
    "cos_three_phase_no_momentum": {"max_lr": 0.3, "total_steps": 16, "three_phase": True, "cycle_momentum": False},
}  # fmt: skip


def _sched_groups(lib):
    def param():
        return opsnn.nn.Parameter(np.zeros(2, np.float32)) if lib is opsnn else lib.nn.Parameter(lib.zeros(2))

    return [{"params": [param()], "lr": 0.1}, {"params": [param()], "lr": 0.02}]


def _momenta(opt):
    return [(g.get("momentum"), tuple(g["betas"]) if "betas" in g else None) for g in opt.param_groups]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("case", sorted(ONE_CYCLE))
def test_one_cycle_matches_torch(case, opt_name):
    torch = pytest.importorskip("torch")
    kw = {"momentum": 0.9} if opt_name == "SGD" else {}
    ours = getattr(optim, opt_name)(_sched_groups(opsnn), lr=0.1, **kw)
    theirs = getattr(torch.optim, opt_name)(_sched_groups(torch), lr=0.1, **kw)
    s = optim.lr_scheduler.OneCycleLR(ours, **ONE_CYCLE[case])
    t = torch.optim.lr_scheduler.OneCycleLR(theirs, **ONE_CYCLE[case])
    for _ in range(s.total_steps):
        np.testing.assert_allclose(s.get_last_lr(), t.get_last_lr(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose([g["lr"] for g in ours.param_groups], [g["lr"] for g in theirs.param_groups])
        for (m, b), (tm, tb) in zip(_momenta(ours), _momenta(theirs)):
            np.testing.assert_allclose(m if m is not None else b, tm if tm is not None else tb, rtol=1e-12)
        ours.step()
        theirs.step()
        s.step()
        t.step()
    with pytest.raises(ParamInvalidError, match="past total_steps"):
        s.step()


def test_multiplicative_and_lambda_in_a_sequence_match_torch():
    torch = pytest.importorskip("torch")
    fns = [lambda e: 0.9, lambda e: 1.0 / (e + 1)]
    runs = []
    for lib, S in ((opsnn, optim.lr_scheduler), (torch, torch.optim.lr_scheduler)):
        o = lib.optim.SGD(_sched_groups(lib), lr=0.1)
        first = S.MultiplicativeLR(o, fns)
        second = S.LambdaLR(o, lambda e: 0.5**e)
        seq = S.SequentialLR(o, [first, second], milestones=[4])
        lrs = []
        for _ in range(9):
            lrs.append([g["lr"] for g in o.param_groups])
            o.step()
            seq.step()
        runs.append(lrs)
        o2 = lib.optim.SGD(_sched_groups(lib), lr=0.1)
        m = S.MultiplicativeLR(o2, lambda e: 0.95)
        lrs = []
        for _ in range(6):
            lrs.append(m.get_last_lr())
            o2.step()
            m.step()
        runs.append(lrs)
    np.testing.assert_allclose(runs[0], runs[2], rtol=1e-12)
    np.testing.assert_allclose(runs[1], runs[3], rtol=1e-12)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1), "give total_steps, or epochs and steps_per_epoch"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=0), "total_steps must be a positive int"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1, epochs=2, steps_per_epoch=1.5), "steps_per_epoch must"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1, 10, pct_start=1.5), r"pct_start must be in \[0, 1\]"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1, 10, anneal_strategy="exp"), "anneal_strategy must be"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, [0.1, 0.2, 0.3], 10), "3 values of max_lr for 2 parameter"),
        (lambda o: optim.lr_scheduler.OneCycleLR(o, 0.1, 10, pct_start=0.1), "has no steps"),
        (lambda o: optim.lr_scheduler.MultiplicativeLR(o, [lambda e: 1.0]), "lr_lambda must be a function or 2"),
    ],
)
def test_bad_scheduler_arguments_are_typed_errors(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make(optim.SGD(_sched_groups(opsnn), lr=0.1, momentum=0.9))


def test_one_cycle_needs_momentum_to_cycle_it():
    o = optim.Adagrad(_sched_groups(opsnn))
    with pytest.raises(ParamInvalidError, match="cycle_momentum=True needs an optimizer with momentum or betas"):
        optim.lr_scheduler.OneCycleLR(o, 0.1, 10)
    s = optim.lr_scheduler.OneCycleLR(o, 0.1, 10, cycle_momentum=False)
    assert s.get_last_lr() == pytest.approx([0.1 / 25.0] * 2, rel=1e-12)
