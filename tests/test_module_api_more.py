"""opsnn.nn.Module's torch API against torch.nn.Module: full backward (pre-)hooks, state-dict and
load-state-dict hooks, extra state, get_buffer / set_submodule, to_empty, type (same weights; hook call
order and arguments compared on small models)."""

from __future__ import annotations

import warnings
from collections import OrderedDict

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops
from opsnn.errors import DTypeError, OpsnnRuntimeError, ParamInvalidError
from opsnn.nn.module import StateDictError

torch = pytest.importorskip("torch")


def _copy(tm, om) -> None:
    om.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _np(g):
    if g is None:
        return None
    return g.detach().numpy() if isinstance(g, torch.Tensor) else g.numpy()


class TNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class ONet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.b(ops.relu(self.a(x)))


def _hooked(tm, om):
    logs = {"t": [], "o": []}
    for tag, m in (("t", tm), ("o", om)):
        for name, sub in (("root", m), ("a", m.a), ("b", m.b)):

            def pre(mod, go, tag=tag, name=name):
                logs[tag].append((name, "pre", [_np(g) for g in go]))

            def full(mod, gi, go, tag=tag, name=name):
                logs[tag].append((name, "full", [_np(g) for g in gi], [_np(g) for g in go]))

            sub.register_full_backward_pre_hook(pre)
            sub.register_full_backward_hook(full)
    return logs


def _same_logs(a, b):
    assert [e[:2] for e in a] == [e[:2] for e in b]
    for ea, eb in zip(a, b):
        for ga, gb in zip(ea[2:], eb[2:]):
            assert len(ga) == len(gb)
            for x, y in zip(ga, gb):
                assert (x is None) == (y is None), (ea[:2], x, y)
                if x is not None:
                    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("input_grad", [True, False])
def test_full_backward_hooks_order_and_arguments_match_torch(input_grad):
    tm, om = TNet(), ONet()
    _copy(tm, om)
    logs = _hooked(tm, om)
    x = _rand(5, 3, seed=1)
    tx = torch.tensor(x, requires_grad=input_grad)
    ox = opsnn.tensor(x).requires_grad_(input_grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # both warn when no input requires grad
        (tm(tx) ** 2).sum().backward()
        y = om(ox)
        ops.sum(ops.mul(y, y)).backward()
    _same_logs(logs["t"], logs["o"])
    np.testing.assert_allclose(om.a.weight.grad.numpy(), tm.a.weight.grad.numpy(), rtol=1e-4, atol=1e-5)
    if input_grad:
        np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_no_input_grad_warns_and_the_hook_must_return_none():
    om = ONet()
    om.register_full_backward_hook(lambda m, gi, go: (opsnn.tensor(np.ones((5, 3), np.float32)),))
    with pytest.warns(UserWarning, match="no inputs require gradients"), pytest.raises(ParamInvalidError, match="None"):
        ops.sum(om(opsnn.tensor(_rand(5, 3)))).backward()


class TTwo(torch.nn.Module):
    def forward(self, x, scale, y):
        return x * scale + y, x - y


class OTwo(nn.Module):
    def forward(self, x, scale, y):
        s = opsnn.tensor(np.float32(scale))
        return ops.add(ops.mul(x, s), y), ops.sub(x, y)


def test_hooks_replace_gradients_with_tuples_and_non_tensor_arguments():
    x, y = _rand(2, 3, seed=2), _rand(2, 3, seed=3)
    seen = {"t": [], "o": []}
    grads = {}
    for tag, m, mk in (("t", TTwo(), torch.tensor), ("o", OTwo(), opsnn.tensor)):

        def pre(mod, go, tag=tag):
            seen[tag].append(("pre", [g is None for g in go]))
            return (go[0] * 2, go[1])

        def full(mod, gi, go, tag=tag):
            seen[tag].append(("full", [g is None for g in gi]))
            return (gi[0] * 3, None, gi[2])

        m.register_full_backward_pre_hook(pre)
        h = m.register_full_backward_hook(full)
        tx, ty = mk(x).requires_grad_(), mk(y).requires_grad_()
        a, b = m(tx, 0.5, ty)
        (a.sum() + (b * b).sum()).backward() if tag == "t" else ops.add(ops.sum(a), ops.sum(ops.mul(b, b))).backward()
        grads[tag] = (_np(tx.grad), _np(ty.grad))
        h.remove()
    assert seen["t"] == seen["o"] == [("pre", [False, False]), ("full", [False, True, False])]
    for gt, go in zip(grads["t"], grads["o"]):
        np.testing.assert_allclose(go, gt, rtol=1e-5)


def test_backward_hook_prepend_remove_and_bad_returns():
    order = []
    lin = nn.Linear(2, 2)
    lin.register_full_backward_pre_hook(lambda m, go: order.append("first"))
    h = lin.register_full_backward_pre_hook(lambda m, go: order.append("prepended"), prepend=True)
    x = opsnn.tensor(_rand(3, 2)).requires_grad_()
    ops.sum(lin(x)).backward()
    assert order == ["prepended", "first"]
    h.remove()
    ops.sum(lin(x)).backward()
    assert order == ["prepended", "first", "first"]
    lin.register_full_backward_hook(lambda m, gi, go: (gi[0], gi[0]))
    with pytest.raises(ParamInvalidError, match="grad_input"):
        ops.sum(lin(x)).backward()
    with pytest.raises(ParamInvalidError, match="callable"):
        lin.register_full_backward_hook(3)
    with opsnn.autograd.no_grad():  # nothing recorded, nothing wrapped
        assert not lin(x).requires_grad


# -- state dict hooks and extra state --------------------------------------------------------------------------------
def test_state_dict_hooks_order_and_arguments_match_torch():
    logs = {"t": [], "o": []}
    for tag, m in (("t", TNet()), ("o", ONet())):
        for name, sub in (("root", m), ("a", m.a)):

            def pre(mod, prefix, keep_vars, tag=tag, name=name):
                logs[tag].append((name, "pre", prefix, keep_vars))

            def post(mod, sd, prefix, meta, tag=tag, name=name):
                logs[tag].append((name, "post", prefix, sorted(sd)))
                if name == "a":
                    sd[prefix + "note"] = sd[prefix + "bias"]

            sub.register_state_dict_pre_hook(pre)
            sub.register_state_dict_post_hook(post)
        logs[tag].append(list(m.state_dict()))
        logs[tag].append(list(m.state_dict(prefix="net.", keep_vars=True)))
    assert logs["o"] == logs["t"]
    sd = ONet().state_dict(destination=OrderedDict(x=1))
    assert list(sd)[:2] == ["x", "a.weight"]
    with pytest.raises(ParamInvalidError, match="prefix"):
        ONet().state_dict({})


def test_state_dict_post_hook_must_return_none():
    lin = nn.Linear(2, 2)
    lin.register_state_dict_post_hook(lambda m, sd, p, meta: sd)
    with pytest.raises(ParamInvalidError, match="return None"):
        lin.state_dict()


def test_load_state_dict_hooks_order_arguments_and_key_edits_match_torch():
    logs = {"t": [], "o": []}
    models = {"t": TNet(), "o": ONet()}
    for tag, m in models.items():
        for name, sub in (("root", m), ("a", m.a), ("b", m.b)):

            def pre(mod, sd, prefix, meta, strict, missing, unexpected, errors, tag=tag, name=name):
                logs[tag].append((name, "pre", prefix, sorted(sd), strict, list(missing), list(unexpected)))
                if name == "a" and prefix + "old_weight" in sd:  # a renamed key, fixed up as torch users do
                    sd[prefix + "weight"] = sd.pop(prefix + "old_weight")

            def post(mod, keys, tag=tag, name=name):
                logs[tag].append((name, "post", list(keys.missing_keys), list(keys.unexpected_keys)))
                if name == "root":
                    keys.missing_keys.clear()

            sub.register_load_state_dict_pre_hook(pre)
            sub.register_load_state_dict_post_hook(post)
    src = TNet()
    sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
    sd["a.old_weight"] = sd.pop("a.weight")
    del sd["b.bias"]
    sd["extra"] = torch.zeros(1)
    with pytest.raises(RuntimeError):  # strict: the unexpected key is left for the strict check
        models["t"].load_state_dict(sd)
    with pytest.raises(StateDictError) as err:
        models["o"].load_state_dict({k: v.numpy() for k, v in sd.items()})
    assert err.value.unexpected == ["extra"] and err.value.missing == []
    assert logs["o"] == logs["t"]
    np.testing.assert_allclose(models["o"].a.weight.numpy(), src.a.weight.detach().numpy())  # written, as torch
    del sd["extra"]
    res = models["o"].load_state_dict({k: v.numpy() for k, v in sd.items()})
    assert res.missing_keys == [] and res.unexpected_keys == []


def test_load_state_dict_pre_hook_errors_fail_the_load_untouched():
    lin = nn.Linear(2, 2)
    before = lin.weight.numpy().copy()
    lin.register_load_state_dict_pre_hook(lambda m, sd, p, meta, s, mi, un, errors: errors.append("bad version"))
    with pytest.raises(StateDictError, match="bad version"):
        lin.load_state_dict({"weight": np.ones((2, 2)), "bias": np.ones(2)})
    np.testing.assert_array_equal(lin.weight.numpy(), before)


class TExtra(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.count = 0

    def get_extra_state(self):
        return {"count": self.count}

    def set_extra_state(self, state):
        self.count = state["count"]


class OExtra(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.count = 0

    def get_extra_state(self):
        return {"count": self.count}

    def set_extra_state(self, state):
        self.count = state["count"]


def test_extra_state_keys_and_round_trip_match_torch():
    tparent, oparent = torch.nn.Sequential(TExtra()), nn.Sequential(OExtra())
    assert list(oparent.state_dict()) == list(tparent.state_dict()) == ["0._extra_state", "0.lin.weight", "0.lin.bias"]
    oparent[0].count = 7
    sd = oparent.state_dict()
    fresh = nn.Sequential(OExtra())
    fresh.load_state_dict(sd)
    assert fresh[0].count == 7
    np.testing.assert_array_equal(fresh[0].lin.weight.numpy(), oparent[0].lin.weight.numpy())
    del sd["0._extra_state"]
    with pytest.raises(StateDictError, match="_extra_state"):
        fresh.load_state_dict(sd)
    assert fresh.load_state_dict(sd, strict=False).missing_keys == ["0._extra_state"]
    plain = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(StateDictError, match="unexpected"):
        plain.load_state_dict({"0.weight": np.ones((2, 2)), "0.bias": np.ones(2), "0._extra_state": 1})
    with pytest.raises(OpsnnRuntimeError, match="not overridden"):
        nn.Linear(2, 2).get_extra_state()


# -- submodules, buffers, to_empty, type -----------------------------------------------------------------------------
def test_get_buffer_and_set_submodule():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    assert net.get_buffer("1.running_mean") is net[1].running_mean
    with pytest.raises(ParamInvalidError, match="no buffer"):
        net.get_buffer("1.weight")
    with pytest.raises(ParamInvalidError, match="no submodule"):
        net.get_buffer("7.running_mean")
    new = nn.Linear(2, 3)
    net.set_submodule("0", new)
    assert net[0] is new
    outer = nn.Sequential(net)
    outer.set_submodule("0.extra", nn.ReLU())
    assert isinstance(net.extra, nn.ReLU)
    with pytest.raises(ParamInvalidError, match="strict"):
        outer.set_submodule("0.other", nn.ReLU(), strict=True)
    with pytest.raises(ParamInvalidError, match="not a submodule"):
        outer.set_submodule("0.1.weight", nn.ReLU())
    with pytest.raises(ParamInvalidError, match="Module"):
        outer.set_submodule("0.0", 3)
    with pytest.raises(ParamInvalidError, match="non-empty"):
        outer.set_submodule("", nn.ReLU())
    tnet = torch.nn.Sequential(torch.nn.Linear(2, 3))
    with pytest.raises(AttributeError):
        tnet.set_submodule("other", torch.nn.ReLU(), strict=True)


def test_to_empty_keeps_objects_and_refuses_other_devices():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    params = list(net.parameters())
    assert net.to_empty(device="cpu") is net
    assert list(net.parameters()) == params and all(p.requires_grad for p in params)
    with pytest.raises(ParamInvalidError, match="CPU"):
        net.to_empty(device="cuda")


def test_type_casts_every_tensor_as_torch():
    tnet = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)).type(torch.float64)
    onet = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)).type(torch.float64)
    got = {k: str(v.dtype) for k, v in onet.state_dict().items()}
    want = {k: str(v.dtype).replace("torch.", "") for k, v in tnet.state_dict().items()}
    assert got == want  # num_batches_tracked becomes float64 too
    assert onet[0].weight.requires_grad
    assert nn.Linear(2, 2).type("torch.HalfTensor").weight.dtype == np.float16
    assert nn.Linear(2, 2).type("float64").bias.dtype == np.float64
    with pytest.raises(DTypeError, match="requires grad"):
        nn.Linear(2, 2).type("int32")
    with pytest.raises(ParamInvalidError):
        nn.Linear(2, 2).type("no-such-type")
