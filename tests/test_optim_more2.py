"""NAdam, RAdam, Adamax and Adadelta (``opsnn.optim``): the fused kernels against a float64 numpy oracle
of torch's update bit for bit (NaN and Inf included, several chunks), the ``ApplyNAdam`` /
``ApplyRAdam`` / ``ApplyAdamax`` / ``ApplyAdadelta`` records against their references, the optimizers
step by step against torch.optim (the options that change the update, two parameter groups), eager and
inside a compiled training step, state dicts (torch's included) and typed errors.

Tolerances against torch: torch rounds every intermediate to float32, opsnn computes in float64 and
rounds once when it stores, so parameters and states agree to rtol 2e-5 / atol 1e-6 after 12 steps;
NAdam's ``mu_product`` is a float64 here and a float32 in torch (rtol 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn, optim
from opsnn.errors import ParamInvalidError
from opsnn.kernels.cpu import optimizer as K

RNG = np.random.default_rng(23)
STEPS = 12
SHAPES = [(4, 3), (5,), (2, 2, 3)]
SIZES = [K.CHUNK * 2 + 5, 9, 1]  # three chunks for the first tensor


# -- the kernels against a float64 numpy oracle ------------------------------------------------------------
def _arrays(dtype, n_states, positive=()):
    ps = [RNG.standard_normal(n).astype(dtype) for n in SIZES]
    gs = [RNG.standard_normal(n).astype(dtype) for n in SIZES]
    states = [
        [
            (np.abs(RNG.standard_normal(n)) if s in positive else RNG.standard_normal(n) * 0.1).astype(dtype)
            for n in SIZES
        ]
        for s in range(n_states)
    ]
    ps[0][:3] = [np.inf, np.nan, -0.0]
    gs[0][3:6] = [np.nan, np.inf, -np.inf]
    return ps, gs, states


def _signed(p, g, lr, wd, maximize, decoupled):
    """float64 (parameter, gradient) after maximize and torch's L2 or decoupled weight decay."""
    g = g.astype(np.float64) * (-1.0 if maximize else 1.0)
    p = p.astype(np.float64)
    if wd != 0.0 and not decoupled:
        g = g + wd * p
    if wd != 0.0 and decoupled:
        p = p * (1.0 - lr * wd)
    return p, g


def _lerp_sq(m, v, g, b1, b2):
    m0 = m.astype(np.float64)
    return (m0 + (1.0 - b1) * (g - m0)).astype(m.dtype), (b2 * v.astype(np.float64) + (1.0 - b2) * g * g).astype(
        v.dtype
    )


def _nadam_oracle(p, g, m, v, h, f):
    lr, b1, b2, eps, wd, bc2, cg, cm = h
    p, g = _signed(p, g, lr, wd, f[1], f[0])
    m, v = _lerp_sq(m, v, g, b1, b2)
    denom = np.sqrt(v.astype(np.float64) / bc2) + eps
    return p - cg * g / denom - cm * m.astype(np.float64) / denom, m, v


def _radam_oracle(p, g, m, v, h, f):
    lr, b1, b2, eps, wd, step_size, bc2_sqrt = h
    p, g = _signed(p, g, lr, wd, f[1], f[0])
    m, v = _lerp_sq(m, v, g, b1, b2)
    if f[2]:
        return p - step_size * m.astype(np.float64) * (bc2_sqrt / (np.sqrt(v.astype(np.float64)) + eps)), m, v
    return p - step_size * m.astype(np.float64), m, v


def _adamax_oracle(p, g, m, u, h, f):
    lr, b1, b2, eps, wd, clr = h
    p, g = _signed(p, g, lr, wd, f[0], False)
    m0 = m.astype(np.float64)
    m = (m0 + (1.0 - b1) * (g - m0)).astype(m.dtype)
    u = np.maximum(b2 * u.astype(np.float64), np.abs(g) + eps).astype(u.dtype)  # NaN wins, as torch
    return p - clr * m.astype(np.float64) / u.astype(np.float64), m, u


def _adadelta_oracle(p, g, sq, acc, h, f):
    lr, rho, eps, wd = h
    p, g = _signed(p, g, lr, wd, f[0], False)
    sq = (rho * sq.astype(np.float64) + (1.0 - rho) * g * g).astype(sq.dtype)
    a0 = acc.astype(np.float64)
    delta = np.sqrt(a0 + eps) / np.sqrt(sq.astype(np.float64) + eps) * g
    return p - lr * delta, sq, (rho * a0 + (1.0 - rho) * delta * delta).astype(acc.dtype)


# kernel, oracle, hyper rows (one per tensor; the last column is switched in by wd), flag rows
KERNELS = {
    "nadam": (
        K.nadam_step,
        _nadam_oracle,
        [
            [1e-2, 0.9, 0.999, 1e-8, 0, 1e-3, 0.05, 0.3],
            [5e-3, 0.5, 0.9, 1e-6, 0, 0.19, 0.01, 0.02],
            [0.1, 0.0, 0.0, 0.0, 0, 1.0, 0.1, 0.0],
        ],
        lambda maximize, decoupled: [decoupled, maximize],
        (1,),
    ),
    "radam": (
        K.radam_step,
        _radam_oracle,
        [
            [1e-2, 0.9, 0.999, 1e-8, 0, 0.05, 0.1],
            [5e-3, 0.5, 0.9, 1e-6, 0, 0.01, 0.6],
            [0.1, 0.0, 0.0, 0.0, 0, 0.1, 1.0],
        ],
        lambda maximize, decoupled: [decoupled, maximize, 1],
        (1,),
    ),
    "radam_unrectified": (
        K.radam_step,
        _radam_oracle,
        [
            [1e-2, 0.9, 0.999, 1e-8, 0, 0.05, 0.1],
            [5e-3, 0.5, 0.9, 1e-6, 0, 0.01, 0.6],
            [0.1, 0.0, 0.0, 0.0, 0, 0.1, 1.0],
        ],
        lambda maximize, decoupled: [decoupled, maximize, 0],
        (1,),
    ),
    "adamax": (
        K.adamax_step,
        _adamax_oracle,
        [[1e-2, 0.9, 0.999, 1e-8, 0, 0.1], [5e-3, 0.5, 0.9, 1e-6, 0, 0.01], [0.1, 0.0, 0.0, 0.0, 0, 0.1]],
        lambda maximize, decoupled: [maximize],
        (1,),
    ),
    "adadelta": (
        K.adadelta_step,
        _adadelta_oracle,
        [[1.0, 0.9, 1e-6, 0], [0.5, 0.0, 1e-3, 0], [0.1, 1.0, 0.0, 0]],
        lambda maximize, decoupled: [maximize],
        (0, 1),
    ),
}
WD_COLUMN = {"adadelta": 3}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("maximize", [0, 1])
@pytest.mark.parametrize(
    "name, wd",
    # torch's Adamax and Adadelta have L2 weight decay only
    [
        (n, w)
        for n in sorted(KERNELS)
        for w in ("none", "l2", "decoupled")
        if n.startswith(("nadam", "radam")) or w != "decoupled"
    ],
)
def test_step_is_the_float64_formula_bit_for_bit(name, wd, maximize, dtype):
    kernel, oracle, rows, flag_row, positive = KERNELS[name]
    ps, gs, (s0, s1) = _arrays(dtype, 2, positive)
    if name == "adadelta":  # the last tensor's eps is 0: 0 / 0 is NaN, as numpy
        gs[2][0], s0[2][0], s1[2][0] = 0.0, 0.0, 0.0
    hyper = np.array(rows, np.float64)
    hyper[:, WD_COLUMN.get(name, 4)] = 0.0 if wd == "none" else 0.02
    flags = np.array([flag_row(maximize, int(wd == "decoupled"))] * len(SIZES), np.int64)
    with np.errstate(all="ignore"):
        want = [oracle(ps[t], gs[t], s0[t], s1[t], hyper[t], flags[t]) for t in range(len(SIZES))]
    tl = K.typed_list
    kernel(tl(ps), tl(gs), tl(s0), tl(s1), K.chunk_table(SIZES), hyper, flags)
    for t in range(len(SIZES)):
        for what, got, w in zip(("param", "state 0", "state 1"), (ps[t], s0[t], s1[t]), want[t]):
            np.testing.assert_array_equal(got, np.asarray(w).astype(dtype), err_msg=f"{what} {t}")
    assert np.isnan(ps[0][1]) and np.isnan(ps[0][3])  # a NaN parameter and a NaN gradient stay NaN
    assert not np.isfinite(s1[0][4]) or name == "adadelta"  # an Inf gradient reaches the second moment


APPLY = {
    "ApplyNAdam": (opsnn.ops.apply_nadam, KERNELS["nadam"][2], [[0, 1], [1, 0]]),
    "ApplyRAdam": (opsnn.ops.apply_radam, KERNELS["radam"][2], [[0, 1, 1], [1, 0, 0]]),
    "ApplyAdamax": (opsnn.ops.apply_adamax, KERNELS["adamax"][2], [[0], [1]]),
    "ApplyAdadelta": (opsnn.ops.apply_adadelta, KERNELS["adadelta"][2], [[0], [1]]),
}


@pytest.mark.parametrize("op", sorted(APPLY))
def test_apply_ops_match_their_references(op):
    """The records' kernels (through ``opsnn.ops``) against their float64 references."""
    from opsnn.ops.registry import get_op

    fn, rows, flag_rows = APPLY[op]
    p = [RNG.standard_normal(s).astype(np.float32) for s in ((7, 3), (5,))]
    g = [RNG.standard_normal(a.shape).astype(np.float32) for a in p]
    s0 = [RNG.standard_normal(a.shape).astype(np.float32) * 0.1 for a in p]
    if op == "ApplyAdadelta":
        s0 = [np.abs(a) for a in s0]  # square_avg
    s1 = [np.abs(RNG.standard_normal(a.shape)).astype(np.float32) for a in p]
    hyper = np.array(rows[:2], np.float64)
    hyper[:, -1 if op == "ApplyAdadelta" else 4] = 0.01
    flags = np.array(flag_rows, np.int64)
    got = fn(hyper, flags, p, g, s0, s1)
    want = get_op(op, "opsnn").reference([hyper, flags, *p, *g, *s0, *s1], {})
    assert len(got) == len(want) == 6
    for a, w in zip(got, want):
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-6, atol=1e-7)


def test_apply_op_with_a_wrong_table_is_a_typed_error():
    p = [np.zeros(3, np.float32)]
    with pytest.raises(opsnn.errors.OpsnnError, match=r"hyper.*\(1, 8\)"):
        opsnn.ops.apply_nadam(np.zeros((1, 7)), np.zeros((1, 2), np.int64), p, p, p, p)
    with pytest.raises(opsnn.errors.OpsnnError, match=r"flags.*\(1, 1\)"):
        opsnn.ops.apply_adadelta(np.zeros((1, 4)), np.zeros((1, 3), np.int64), p, p, p, p)
    with pytest.raises(ParamInvalidError, match="equal length"):
        opsnn.ops.apply_adamax(np.zeros((1, 6)), np.zeros((1, 1), np.int64), p, p, p, p + p)


# -- the optimizers against torch.optim ------------------------------------------------------------------------
# name -> case -> (options of both groups, overrides of the second group)
CASES = {
    "NAdam": {
        "default": ({}, {"lr": 0.01}),
        "l2": ({"weight_decay": 0.1, "momentum_decay": 0.01}, {"weight_decay": 0.0}),
        "decoupled": ({"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}, {"betas": (0.8, 0.99)}),
    },
    "RAdam": {
        # betas[1] = 0.999 rectifies from step 6 on; 0.5 never does (rho_inf = 3)
        "default": ({}, {"lr": 0.01, "betas": (0.9, 0.5)}),
        "l2": ({"weight_decay": 0.1, "lr": 0.01}, {"betas": (0.8, 0.99)}),
        "decoupled": ({"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}, {"eps": 1e-3}),
    },
    "Adamax": {
        "default": ({}, {"lr": 0.01}),
        "all": ({"weight_decay": 0.1, "maximize": True, "eps": 1e-3}, {"betas": (0.5, 0.9)}),
    },
    "Adadelta": {
        "default": ({}, {"lr": 0.1}),
        "all": ({"rho": 0.5, "eps": 1e-3, "weight_decay": 0.1, "maximize": True}, {"rho": 0.95, "lr": 0.5}),
    },
}
SCALAR_STATES = {"step", "mu_product"}


def _pair(name, kw, group1):
    """The same parameters in opsnn and torch, as two groups (the second overriding ``group1``)."""
    torch = pytest.importorskip("torch")
    init = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [nn.Parameter(a.copy()) for a in init]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in init]
    o = getattr(optim, name)([{"params": ours[:2]}, {"params": ours[2:], **group1}], **kw)
    t = getattr(torch.optim, name)([{"params": theirs[:2]}, {"params": theirs[2:], **group1}], **kw)
    return torch, ours, theirs, o, t


def _grads(torch, pairs):
    grads = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]
    for ps, lib in pairs:
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g) if lib is torch else opsnn.tensor(g)


def _same(ours, theirs, o, t):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=2e-5, atol=1e-6, err_msg=f"param {i}")
        st, tst = o.state[a], t.state[b]
        assert set(st) == set(tst), (sorted(st), sorted(tst))
        for key, v in tst.items():
            if key == "step":
                assert st[key] == float(v)
            elif key in SCALAR_STATES:
                assert st[key] == pytest.approx(float(v), rel=1e-6)
            else:
                np.testing.assert_allclose(st[key].numpy(), v.numpy(), rtol=2e-5, atol=1e-6, err_msg=f"{key} {i}")


@pytest.mark.parametrize("name, case", [(n, c) for n in CASES for c in CASES[n]])
def test_matches_torch_step_by_step(name, case):
    torch, ours, theirs, o, t = _pair(name, *CASES[name][case])
    for _ in range(STEPS):
        _grads(torch, [(ours, opsnn), (theirs, torch)])
        o.step()
        t.step()
        _same(ours, theirs, o, t)


def test_a_parameter_without_gradient_is_left_alone():
    torch, ours, theirs, o, t = _pair("NAdam", {}, {})
    ours[1].grad = opsnn.tensor(np.ones(SHAPES[1], np.float32))
    before = [a.numpy().copy() for a in ours]
    o.step()
    assert np.array_equal(before[0], ours[0].numpy()) and not np.array_equal(before[1], ours[1].numpy())
    assert ours[0] not in o.state and o.state[ours[1]]["step"] == 1.0


# -- state dicts --------------------------------------------------------------------------------------------------
def _torch_state_to_numpy(sd):
    state = {k: {n: v.numpy() for n, v in st.items()} for k, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_round_trip_and_torch_checkpoints(name):
    kw, group1 = list(CASES[name].values())[-1]
    torch, ours, theirs, o, t = _pair(name, kw, {**group1, "lr": 0.02})
    for _ in range(3):
        _grads(torch, [(ours, opsnn), (theirs, torch)])
        o.step()
        t.step()
    sd = o.state_dict()
    assert {k: set(v) for k, v in sd["state"].items()} == {k: set(v) for k, v in t.state_dict()["state"].items()}
    # a fresh optimizer over copies of the parameters, loaded from ours, and another from torch's checkpoint
    mirrors = []
    for source in (sd, _torch_state_to_numpy(t.state_dict())):
        ps = [nn.Parameter(a.numpy().copy()) for a in ours]
        fresh = getattr(optim, name)([{"params": ps[:2]}, {"params": ps[2:]}], lr=0.5)
        fresh.load_state_dict(source)
        assert fresh.param_groups[1]["lr"] == 0.02 and fresh.param_groups[0]["lr"] == o.param_groups[0]["lr"]
        mirrors.append((ps, fresh))
    for _ in range(3):
        _grads(torch, [(ours, opsnn), (theirs, torch)] + [(ps, opsnn) for ps, _ in mirrors])
        for opt in [o] + [m[1] for m in mirrors]:
            opt.step()
        t.step()
    for ps, opt in mirrors:
        _same(ps, theirs, opt, t)


def test_a_mismatched_state_dict_is_a_typed_error_and_writes_nothing():
    ps = [nn.Parameter(np.ones(s, np.float32)) for s in SHAPES]
    nadam = optim.NAdam(ps)
    for p in ps:
        p.grad = opsnn.tensor(np.ones(p.shape, np.float32))
    nadam.step()
    before = nadam.state_dict()
    with pytest.raises(optim.OptimizerStateError, match="lacks option"):
        nadam.load_state_dict(optim.Adamax(ps).state_dict())
    with pytest.raises(optim.OptimizerStateError, match="'mu_product'"):
        optim.RAdam(ps).load_state_dict(before)  # same options, a state RAdam does not keep
    with pytest.raises(optim.OptimizerStateError, match="lacks option"):
        optim.Adadelta(ps).load_state_dict(before)
    other = optim.NAdam([nn.Parameter(np.ones(s, np.float32)) for s in SHAPES[::-1]])
    with pytest.raises(optim.OptimizerStateError, match="shape"):
        other.load_state_dict(before)
    bad_scalar = nadam.state_dict()
    bad_scalar["state"][0]["mu_product"] = np.ones(3)
    with pytest.raises(optim.OptimizerStateError, match="'mu_product' of parameter 0 must be one number"):
        nadam.load_state_dict(bad_scalar)
    after = nadam.state_dict()
    for k, st in before["state"].items():
        assert st["mu_product"] == after["state"][k]["mu_product"]
        np.testing.assert_array_equal(st["exp_avg"].numpy(), after["state"][k]["exp_avg"].numpy())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: optim.NAdam(ps, lr=-0.1), "NAdam: lr must be >= 0, got -0.1"),
        (lambda ps: optim.NAdam(ps, betas=(0.9, 1.0)), r"NAdam: betas must be two numbers in \[0, 1\)"),
        (lambda ps: optim.NAdam(ps, momentum_decay=-1e-3), "NAdam: momentum_decay must be >= 0"),
        (lambda ps: optim.NAdam(ps, eps="1e-8"), "NAdam: eps must be a number"),
        (lambda ps: optim.NAdam(ps, capturable=True), "NAdam: capturable=True is not supported"),
        (lambda ps: optim.NAdam(ps, foreach=True), "NAdam: foreach=True is not supported"),
        (lambda ps: optim.RAdam(ps, betas=(-0.1, 0.9)), r"RAdam: betas must be two numbers"),
        (lambda ps: optim.RAdam(ps, weight_decay=float("nan")), "RAdam: weight_decay must be >= 0"),
        (lambda ps: optim.RAdam(ps, differentiable=True), "RAdam: differentiable=True is not supported"),
        (lambda ps: optim.Adamax(ps, betas=0.9), r"Adamax: betas must be two numbers"),
        (lambda ps: optim.Adamax(ps, eps=-1.0), "Adamax: eps must be >= 0"),
        (lambda ps: optim.Adamax(ps, foreach=True), "Adamax: foreach=True is not supported"),
        (lambda ps: optim.Adadelta(ps, rho=1.5), r"Adadelta: rho must be in \[0, 1\], got 1.5"),
        (lambda ps: optim.Adadelta(ps, rho=-0.1), "Adadelta: rho must be >= 0"),
        (lambda ps: optim.Adadelta(ps, lr=None), "Adadelta: lr must be a number"),
        (lambda ps: optim.Adadelta(ps, capturable=True), "Adadelta: capturable=True is not supported"),
        (lambda ps: optim.Adadelta([{"params": ps, "betas": (0.9, 0.9)}]), r"unknown option\(s\) \['betas'\]"),
        # the optimizers that were here before refuse these too
        (lambda ps: optim.AdamW(ps, fused=True), "AdamW: fused=True is not supported"),
        (lambda ps: optim.SGD(ps, foreach=True), "SGD: foreach=True is not supported"),
        (lambda ps: optim.Adagrad(ps, fused=True), "Adagrad: fused=True is not supported"),
        (lambda ps: optim.RMSprop(ps, foreach=True), "RMSprop: foreach=True is not supported"),
    ],
)
def test_bad_hyper_parameters_are_typed_errors(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make([nn.Parameter(np.zeros(3, np.float32))])


def test_defaults_and_unsupported_options_at_their_defaults_are_accepted():
    p = [nn.Parameter(np.zeros(3, np.float32))]
    torch = pytest.importorskip("torch")
    for name in CASES:
        ours = getattr(optim, name)(p, foreach=False).defaults
        theirs = getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(3))]).defaults
        assert all(ours[k] == theirs[k] for k in ours), name


# -- inside a compiled training step ---------------------------------------------------------------------------
def _groups(name, first, second):
    def make(lib, ps):
        return getattr(lib, name)([{"params": ps[:2], **first}, {"params": ps[2:], **second}])

    return make


COMPILED = {
    "NAdam": _groups("NAdam", {"weight_decay": 0.01, "decoupled_weight_decay": True}, {"lr": 0.01}),
    "RAdam": _groups("RAdam", {"lr": 0.01, "weight_decay": 0.01}, {"maximize": False}),
    "Adamax": _groups("Adamax", {"weight_decay": 0.01}, {"lr": 0.01}),
    "Adadelta": _groups("Adadelta", {"rho": 0.5}, {"lr": 0.1}),
}


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_step_matches_eager(name):
    from test_compiled_training import _data, _run

    batches = [_data("mlp") for _ in range(8)]  # 8 steps: RAdam switches to rectified updates at step 6
    em, eopt, _, elosses = _run("mlp", COMPILED[name], False, batches)
    cm, copt, step, closses = _run("mlp", COMPILED[name], True, batches)
    assert step.num_compiles == 1 and step.mode == "compiled"
    assert [n.op_type for n in step.graph().nodes].count(f"Apply{name}") == 1  # one fused update for all
    np.testing.assert_allclose(closses, elosses, rtol=1e-5, atol=1e-7)
    for pe, pc in zip(em.parameters(), cm.parameters()):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-5, atol=1e-6)
        for key, val in eopt.state[pe].items():
            got = copt.state[pc][key]
            if key in SCALAR_STATES:
                assert got == val, key
            else:
                np.testing.assert_allclose(got.numpy(), val.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


# -- step hooks ------------------------------------------------------------------------------------------------
def _hook_calls(lib, p, make_grad):
    """The calls torch's step hooks see, recorded the same way for ``lib`` (opsnn or torch)."""
    opt = lib.optim.NAdam([p], lr=0.1)
    calls = []
    pre = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", o is opt, len(args), dict(kwargs))))
    post = opt.register_step_post_hook(
        lambda o, args, kwargs: calls.append(("post", o is opt, len(args), dict(kwargs)))
    )
    p.grad = make_grad()
    opt.step()
    opt.step(closure=None)
    pre.remove()
    opt.step()
    post.remove()
    opt.step()
    return calls


def test_step_hooks_are_called_as_torch_calls_them_and_removable():
    torch = pytest.importorskip("torch")
    ours = _hook_calls(opsnn, nn.Parameter(np.ones(3, np.float32)), lambda: opsnn.tensor(np.ones(3, np.float32)))
    theirs = _hook_calls(torch, torch.nn.Parameter(torch.ones(3)), lambda: torch.ones(3))
    assert ours == theirs
    assert ours[0] == ("pre", True, 1, {}) and ours[3] == ("post", True, 1, {"closure": None}) and len(ours) == 5


def test_a_pre_hook_may_replace_the_arguments_and_a_subclass_runs_hooks_once():
    p = nn.Parameter(np.ones(3, np.float32))
    p.grad = opsnn.tensor(np.ones(3, np.float32))

    class Counting(optim.Adamax):
        def step(self, closure=None):
            self.steps = getattr(self, "steps", 0) + 1
            return super().step(closure)

    opt = Counting([p], lr=0.1)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: ((args[0],), {"closure": lambda: 7.0}))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(kwargs["closure"]()))
    assert opt.step() == 7.0 and seen == [7.0] and opt.steps == 1
    opt.register_step_pre_hook(lambda o, args, kwargs: "not a pair")
    with pytest.raises(ParamInvalidError, match="must return None or \\(new_args, new_kwargs\\), got str"):
        opt.step()
    with pytest.raises(ParamInvalidError, match="a step hook must be callable, got int"):
        opt.register_step_post_hook(3)


def test_step_hooks_refuse_a_traced_step():
    model = nn.Linear(3, 2)
    opt = optim.Adamax(model.parameters(), lr=0.1)
    handle = opt.register_step_post_hook(lambda o, args, kwargs: None)

    def step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    from opsnn.graph.tracing import TraceError

    with pytest.raises(TraceError, match="step hooks would run only while the step is traced"):
        opsnn.compile(step)(opsnn.tensor(np.ones((2, 3), np.float32)))
    handle.remove()
    assert np.isfinite(float(opsnn.compile(step)(opsnn.tensor(np.ones((2, 3), np.float32))).item()))
