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
