"""The learning-rate schedulers against torch's on the same optimizer settings: the learning rate of
every parameter group at every step (ReduceLROnPlateau on a metric sequence that plateaus, improves
and plateaus again), state_dict round trips, and typed errors for bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError
from opsnn.optim import lr_scheduler as S

CASES = {
    "MultiStepLR": {"milestones": [2, 5, 5, 9], "gamma": 0.5},
    "ExponentialLR": {"gamma": 0.9},
    "ConstantLR": {"factor": 0.25, "total_iters": 4},
    "PolynomialLR": {"total_iters": 7, "power": 2.0},
    "CosineAnnealingWarmRestarts": {"T_0": 3, "T_mult": 2, "eta_min": 0.001},
    "CosineAnnealingWarmRestarts_1": {"T_0": 4},
    "StepLR": {"step_size": 3, "gamma": 0.3},
    "CosineAnnealingLR": {"T_max": 6, "eta_min": 0.01},
}


def _groups(lib):
    params = [
        lib.nn.Parameter(lib.zeros(2)) if lib is not opsnn else opsnn.nn.Parameter(np.zeros(2, np.float32))
        for _ in range(2)
    ]
    return [{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "lr": 0.02}]


@pytest.mark.parametrize("name", sorted(CASES))
def test_learning_rates_match_torch(name):
    torch = pytest.importorskip("torch")
    cls = name.split("_")[0]
    ours = opsnn.optim.SGD(_groups(opsnn), lr=0.1, momentum=0.9)
    theirs = torch.optim.SGD(_groups(torch), lr=0.1, momentum=0.9)
    s, t = getattr(S, cls)(ours, **CASES[name]), getattr(torch.optim.lr_scheduler, cls)(theirs, **CASES[name])
    for _ in range(20):
        np.testing.assert_allclose(s.get_last_lr(), t.get_last_lr(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(
            [g["lr"] for g in ours.param_groups], [g["lr"] for g in theirs.param_groups], rtol=1e-12
        )
        ours.step()
        theirs.step()
        s.step()
        t.step()


def test_reduce_on_plateau_matches_torch():
    torch = pytest.importorskip("torch")
    metrics = [1.0, 0.9, 0.9, 0.9, 0.9, 0.95, 0.5, 0.5, 0.49999, 0.5, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4]
    for kw in (
        {"patience": 2},
        {"patience": 1, "cooldown": 2, "factor": 0.5, "min_lr": [0.03, 0.0]},
        {"mode": "max", "patience": 0, "threshold": 0.1, "threshold_mode": "abs"},
    ):
        ours = opsnn.optim.SGD(_groups(opsnn), lr=0.1)
        theirs = torch.optim.SGD(_groups(torch), lr=0.1)
        s, t = S.ReduceLROnPlateau(ours, **kw), torch.optim.lr_scheduler.ReduceLROnPlateau(theirs, **kw)
        for m in metrics:
            s.step(m)
            t.step(m)
            np.testing.assert_allclose([g["lr"] for g in ours.param_groups], [g["lr"] for g in theirs.param_groups])
            assert s.num_bad_epochs == t.num_bad_epochs and s.cooldown_counter == t.cooldown_counter
        state = s.state_dict()
        fresh = S.ReduceLROnPlateau(ours, **kw)
        fresh.load_state_dict(state)
        assert fresh.best == s.best and fresh.num_bad_epochs == s.num_bad_epochs


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda o: S.MultiStepLR(o, [3, -1]), "MultiStepLR: milestones must be ints >= 0"),
        (lambda o: S.ConstantLR(o, factor=2.0), r"ConstantLR: factor must be in \[0, 1\]"),
        (lambda o: S.PolynomialLR(o, total_iters=0), "PolynomialLR: total_iters must be a positive int"),
        (lambda o: S.CosineAnnealingWarmRestarts(o, T_0=0), "T_0 must be a positive int"),
        (lambda o: S.ReduceLROnPlateau(o, mode="lowest"), "mode must be 'min' or 'max'"),
        (lambda o: S.ReduceLROnPlateau(o, factor=1.0), "factor must be < 1"),
        (lambda o: S.ReduceLROnPlateau(o, min_lr=[0.1]), "1 min_lrs for 2 parameter groups"),
    ],
)
def test_bad_arguments_are_typed_errors(make, match):
    with pytest.raises(ParamInvalidError, match=match):
        make(opsnn.optim.SGD(_groups(opsnn), lr=0.1))


CYCLIC = {
    "triangular": {"base_lr": 0.01, "max_lr": [0.1, 0.05], "step_size_up": 3},
    "triangular2": {
        "base_lr": [0.01, 0.002],
        "max_lr": 0.1,
        "step_size_up": 2,
        "step_size_down": 4,
        "mode": "triangular2",
    },
    "exp_range": {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4, "mode": "exp_range", "gamma": 0.9},
    "scale_fn": {
        "base_lr": 0.01,
        "max_lr": 0.1,
        "step_size_up": 3,
        "scale_fn": lambda x: 0.5**x,
        "scale_mode": "iterations",
    },
    "no_momentum": {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 3, "cycle_momentum": False},
}


@pytest.mark.parametrize("case", sorted(CYCLIC))
@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_cyclic_lr_and_momentum_match_torch(case, optimizer):
    torch = pytest.importorskip("torch")
    kw = {"momentum": 0.9} if optimizer == "SGD" else {}
    ours = getattr(opsnn.optim, optimizer)(_groups(opsnn), lr=0.1, **kw)
    theirs = getattr(torch.optim, optimizer)(_groups(torch), lr=0.1, **kw)
    s, t = S.CyclicLR(ours, **CYCLIC[case]), torch.optim.lr_scheduler.CyclicLR(theirs, **CYCLIC[case])
    key = "momentum" if optimizer == "SGD" else "betas"
    for _ in range(25):
        np.testing.assert_allclose(s.get_last_lr(), t.get_last_lr(), rtol=1e-12, atol=1e-15)
        for a, b in zip(ours.param_groups, theirs.param_groups):
            np.testing.assert_allclose(np.ravel(a[key]), np.ravel(b[key]), rtol=1e-12)
        s.step()
        t.step()
    resumed = S.CyclicLR(getattr(opsnn.optim, optimizer)(_groups(opsnn), lr=0.1, **kw), **CYCLIC[case])
    resumed.load_state_dict(s.state_dict())
    assert resumed.last_epoch == s.last_epoch and resumed.base_lrs == s.base_lrs


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"mode": "square"}, "mode must be 'triangular', 'triangular2' or 'exp_range'"),
        ({"step_size_up": 0}, "step_size_up must be a positive int"),
        ({"scale_fn": 3}, "scale_fn must be callable"),
        ({"scale_fn": abs, "scale_mode": "epochs"}, "scale_mode must be 'cycle' or 'iterations'"),
        ({"max_lr": [0.1, 0.2, 0.3]}, "3 values of max_lr for 2 parameter groups"),
    ],
)
def test_cyclic_lr_bad_arguments(kw, match):
    opt = opsnn.optim.SGD(_groups(opsnn), lr=0.1, momentum=0.9)
    with pytest.raises(ParamInvalidError, match=match):
        S.CyclicLR(opt, **{"base_lr": 0.01, "max_lr": 0.1, **kw})
    with pytest.raises(ParamInvalidError, match="cycle_momentum=True needs an optimizer with momentum or betas"):
        S.CyclicLR(opsnn.optim.Adagrad(_groups(opsnn)), 0.01, 0.1)
