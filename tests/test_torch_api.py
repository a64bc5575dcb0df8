"""opsnn's torch top-level functions (opsnn.torch_api: ``opsnn.exp``, ``opsnn.gather``, ``opsnn.trace`` ...),
torch's dtype names, and opsnn.save / opsnn.load, against torch on the same inputs: values, and gradients
where differentiable, NaN and Inf included where the function defines them; typed errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.checkpoint import CheckpointError
from opsnn.errors import ParamInvalidError

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(11)
A = RNG.standard_normal((3, 5)).astype(np.float32)
B = RNG.standard_normal((5, 4)).astype(np.float32)
C = RNG.standard_normal((3, 4)).astype(np.float32)
X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
Y3 = RNG.standard_normal((2, 4, 3)).astype(np.float32)
V = np.array([1.5, -2.5, np.nan, np.inf, -np.inf, 0.0, -0.7, 3e38], np.float32)
IDX = np.array([[0, 2, 1, 4, 3], [4, 4, 0, 1, 2], [1, 0, 3, 2, 2]], np.int64)

# name -> (call on the module (opsnn or torch) and its inputs, input arrays, differentiable)
CASES = {
    "exp": (lambda m, a: m.exp(a), [A], True),
    "sum_dim": (lambda m, a: m.sum(a, dim=1, keepdim=True), [A], True),
    "mean": (lambda m, a: m.mean(a, 0), [A], True),
    "max_dim_values": (lambda m, a: m.max(a, 1).values, [A], True),
    "max_pair": (lambda m, a: m.max(a, m.zeros_like(a)), [A], True),
    "amax": (lambda m, a: m.amax(a, 1), [A], True),
    "softmax": (lambda m, a: m.softmax(a, dim=1), [A], True),
    "log_softmax": (lambda m, a: m.log_softmax(a, 0), [A], True),
    "gather": (lambda m, a, i: m.gather(a, 1, i), [A, IDX], True),
    "index_select": (lambda m, a, i: m.index_select(a, 1, i[0, :3]), [A, IDX], True),
    "scatter_add": (lambda m, a, i, s: m.scatter_add(a, 1, i[:, :4], s), [A, IDX, C], True),
    "scatter_add_method": (lambda m, a, i, s: a.scatter_add(0, i[:2, :4] % 3, s[:2] * 2), [A, IDX, C], True),
    "transpose": (lambda m, a: m.transpose(a, 0, 1), [A], True),
    "permute": (lambda m, a: m.permute(a, (2, 0, 1)), [X3], True),
    "reshape": (lambda m, a: m.reshape(a, (5, 3)), [A], True),
    "flatten": (lambda m, a: m.flatten(a, 1), [X3], True),
    "squeeze_unsqueeze": (lambda m, a: m.squeeze(m.unsqueeze(a, 1), 1), [A], True),
    "clamp": (lambda m, a: m.clamp(a, -0.5, 0.5), [A], True),
    "where": (lambda m, a: m.where(a > 0, a, a * 2), [A], True),
    "matmul": (lambda m, a, b: m.matmul(a, b), [A, B], True),
    "add_alpha": (lambda m, a, c: m.add(a[:, :4], c, alpha=2.5), [A, C], True),
    "sub_alpha": (lambda m, a, c: m.sub(a[:, :4], c, alpha=-1.5), [A, C], True),
    "pow": (lambda m, a: m.pow(m.abs(a), 1.5), [A], True),
    "cumsum": (lambda m, a: m.cumsum(a, 1), [A], True),
    "logsumexp": (lambda m, a: m.logsumexp(a, 1), [A], True),
    "var": (lambda m, a: m.var(a, 1), [A], True),
    "tril": (lambda m, a: m.tril(a, 1), [A], True),
    "chunk": (lambda m, a: m.chunk(a, 2, 1)[1], [A], True),
    "split": (lambda m, a: m.split(a, 2, 1)[2], [A], True),
    "narrow": (lambda m, a: m.narrow(a, 1, 1, 3), [A], True),
    "lerp": (lambda m, a, c: m.lerp(a[:, :4], c, 0.3), [A, C], True),
    "isfinite": (lambda m, v: m.isfinite(v), [V], False),
    "isnan": (lambda m, v: m.isnan(v), [V], False),
    "sign": (lambda m, v: m.sign(v), [V], False),  # 0 at NaN, as torch
    "sign_method": (lambda m, v: m.cat([v.sign(), (v * -1).sign()]), [V], False),
    "sign_grad": (lambda m, a: m.sign(a) * a, [A], True),
    "nan_to_num": (lambda m, v: m.nan_to_num(v), [V], False),
    "nan_to_num_given": (lambda m, v: m.nan_to_num(v, nan=7.0, posinf=1e3, neginf=-5.0), [V], False),
    "nan_to_num_grad": (lambda m, a: m.nan_to_num(a, nan=1.0), [A], True),
    "trunc": (lambda m, v: m.trunc(v), [V], False),
    "fix": (lambda m, v: m.fix(v), [V], False),
    "frac": (lambda m, a: m.frac(a * 3), [A], True),
    "diagonal": (lambda m, a: m.diagonal(a), [A], True),
    "diagonal_offset": (lambda m, a: m.diagonal(a, 2), [A], True),
    "diagonal_negative": (lambda m, a: m.diagonal(a, -1), [A], True),
    "diagonal_dims": (lambda m, a: m.diagonal(a, 1, 2, 0), [X3], True),
    "diag_vector": (lambda m, a: m.diag(a[0]), [A], True),
    "diag_vector_up": (lambda m, a: m.diag(a[0], 2), [A], True),
    "diag_vector_down": (lambda m, a: m.diag(a[1], -1), [A], True),
    "diag_matrix": (lambda m, a: m.diag(a, 1), [A], True),
    "trace": (lambda m, a: m.trace(a), [A], True),
    "dot": (lambda m, a, b: m.dot(a[0], b[:, 1]), [A, B], True),
    "inner": (lambda m, a, b: m.inner(a[:, :4], b), [A, B], True),
    "inner_3d": (lambda m, a, b: m.inner(a, b), [X3, B[:4]], True),
    "addmm": (lambda m, c, a, b: m.addmm(c, a, b), [C, A, B], True),
    "addmm_scaled": (lambda m, c, a, b: m.addmm(c[0], a, b, beta=0.5, alpha=-2.0), [C, A, B], True),
    "baddbmm": (lambda m, c, x, y: m.baddbmm(c[:, :3], x, y, alpha=0.5), [C[:2, None, :3].repeat(3, 1), X3, Y3], True),
    "broadcast_to": (lambda m, a: m.broadcast_to(a[:, :1], (3, 6)), [A], True),
    "swapaxes": (lambda m, a: m.swapaxes(a, 0, 2), [X3], True),
    "movedim": (lambda m, a: m.movedim(a, 0, -1), [X3], True),
    "movedim_lists": (lambda m, a: m.movedim(a, (0, 2), (1, 0)), [X3], True),
    "moveaxis": (lambda m, a: m.moveaxis(a, 1, 0), [X3], True),
    "take_along_dim": (lambda m, a, i: m.take_along_dim(a, i, 1), [A, IDX], True),
    "take_along_dim_broadcast": (lambda m, a, i: m.take_along_dim(a, i[:1], 1), [A, IDX], True),
    "take_along_dim_flat": (lambda m, a, i: m.take_along_dim(a, i[0]), [A, IDX], True),
    "tensor_split_sections": (lambda m, a: m.tensor_split(a, 3, 1)[0], [A], True),
    "tensor_split_last": (lambda m, a: m.tensor_split(a, 3, 1)[2], [A], True),
    "tensor_split_indices": (lambda m, a: m.tensor_split(a, [1, -1, 9], 1)[1], [A], True),
    "var_mean": (lambda m, a: m.stack(m.var_mean(a, 1)), [A], True),
    "std_mean": (lambda m, a: m.stack(m.std_mean(a, 0, correction=0)), [A], True),
}


def _run(module, fn, arrays, grad):
    make = opsnn.tensor if module is opsnn else torch.tensor
    xs = [make(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    return xs, fn(module, *xs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    fn, arrays, grad = CASES[name]
    xs, got = _run(opsnn, fn, arrays, grad)
    ts, want = _run(torch, fn, arrays, grad)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert got.numpy().dtype == want.detach().numpy().dtype
    if grad:
        seed = RNG.standard_normal(tuple(want.shape)).astype(np.float32)
        (got * opsnn.tensor(seed)).sum().backward()
        (want * torch.from_numpy(seed)).sum().backward()
        for x, t in zip(xs, ts):
            if t.grad is not None:
                np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_pieces_counts_and_small_helpers():
    a = opsnn.tensor(A)
    assert [p.shape for p in opsnn.tensor_split(a, 3, 1)] == [
        p.shape for p in torch.tensor_split(torch.tensor(A), 3, 1)
    ]
    got = [p.shape for p in opsnn.tensor_split(a, [1, -1, 9, 2], 1)]
    assert got == [tuple(p.shape) for p in torch.tensor_split(torch.tensor(A), [1, -1, 9, 2], 1)]
    xs = opsnn.broadcast_tensors(opsnn.tensor(A[:, :1]), opsnn.tensor(A[0]))
    assert [x.shape for x in xs] == [(3, 5), (3, 5)]
    np.testing.assert_array_equal(xs[1].numpy(), np.broadcast_to(A[0], (3, 5)))
    assert opsnn.numel(a) == 15 and opsnn.is_floating_point(a) and not opsnn.is_floating_point(opsnn.tensor(IDX))
    assert opsnn.get_default_dtype() == np.float32
    assert opsnn.is_grad_enabled()
    with opsnn.no_grad():
        assert not opsnn.is_grad_enabled()
    assert opsnn.isfinite(opsnn.tensor(IDX)).numpy().all()
    assert opsnn.long == np.int64 and opsnn.float == np.float32 and opsnn.double == np.float64
    assert opsnn.half == np.float16 and opsnn.int == np.int32 and opsnn.bool == np.bool_
    got = opsnn.addmm(opsnn.tensor(np.full((3, 4), np.nan, np.float32)), a, opsnn.tensor(B), beta=0)
    np.testing.assert_allclose(got.numpy(), A @ B, rtol=1e-5, atol=1e-5)  # torch ignores input (NaN too) at beta 0


def test_star_import_keeps_python_builtins():
    names: dict = {}
    exec("from opsnn import *", names)
    assert "exp" in names and "trace" in names and "save" in names
    for builtin in ("sum", "max", "min", "abs", "all", "any", "round", "pow", "int", "float", "bool"):
        assert builtin not in names, builtin


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: opsnn.exp("abc"), "opsnn.exp: expected a Tensor"),
        (lambda: opsnn.dot(opsnn.tensor(A), opsnn.tensor(A)), "dot: expects two 1-D tensors of one size"),
        (lambda: opsnn.trace(opsnn.tensor(X3)), "trace: expects a 2-D tensor"),
        (lambda: opsnn.diagonal(opsnn.tensor(A), 0, 1, 1), "diagonal: dim1 and dim2 must differ"),
        (lambda: opsnn.diagonal(opsnn.tensor(A), 0, 0, 5), "diagonal: dim 5 out of range"),
        (lambda: opsnn.diag(opsnn.tensor(X3)), "diag: expects a 1-D or 2-D tensor"),
        (lambda: opsnn.movedim(opsnn.tensor(X3), (0, 1), 2), "movedim: source"),
        (lambda: opsnn.broadcast_tensors(opsnn.tensor(A), opsnn.tensor(B)), "do not broadcast"),
        (lambda: opsnn.tensor_split(opsnn.tensor(A), 0), "number of sections must be positive"),
        (lambda: opsnn.addmm(opsnn.tensor(C), opsnn.tensor(A), opsnn.tensor(A)), "addmm: expects 2-D operands"),
        (lambda: opsnn.inner(opsnn.tensor(A), opsnn.tensor(B)), "inner: the last dims differ"),
        (lambda: opsnn.take_along_dim(opsnn.tensor(A), opsnn.tensor(IDX[0]), 1), "as many dims"),
    ],
)
def test_bad_arguments_are_typed(call, match):
    with pytest.raises(ParamInvalidError, match=match):
        call()


def test_save_load_round_trip(tmp_path):
    model = opsnn.nn.Sequential(opsnn.nn.Linear(3, 4), opsnn.nn.ReLU(), opsnn.nn.Linear(4, 2))
    opt = opsnn.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.9))
    loss = model(opsnn.tensor(A[:, :3])).sum()
    loss.backward()
    opt.step()
    obj = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "best": float("nan"),
        "names": ("a", None, [1.5, True]),
        "scalar": opsnn.tensor(np.float32(2.5)),
        "ids": IDX,
    }
    path = tmp_path / "run.safetensors"
    opsnn.save(obj, path)
    back = opsnn.load(path, map_location="cpu")
    assert back["epoch"] == 3 and np.isnan(back["best"]) and back["names"] == ("a", None, [1.5, True])
    assert back["scalar"].shape == () and float(back["scalar"]) == 2.5
    np.testing.assert_array_equal(back["ids"].numpy(), IDX)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())
    assert list(back["optimizer"]["state"]) == list(opt.state_dict()["state"])  # int keys stay ints
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)
    fresh = opsnn.nn.Sequential(opsnn.nn.Linear(3, 4), opsnn.nn.ReLU(), opsnn.nn.Linear(4, 2))
    fresh.load_state_dict(back["model"])
    opt2 = opsnn.optim.AdamW(fresh.parameters(), lr=1e-2)
    opt2.load_state_dict(back["optimizer"])
    x = opsnn.tensor(A[:, :3])
    np.testing.assert_array_equal(fresh(x).numpy(), model(x).numpy())


def test_save_load_refuse_what_they_cannot_keep(tmp_path):
    with pytest.raises(CheckpointError, match=r"cannot store a Linear at the top\['layer'\]"):
        opsnn.save({"layer": opsnn.nn.Linear(2, 2)}, tmp_path / "x.safetensors")
    with pytest.raises(FileNotFoundError, match="no folder"):
        opsnn.save({}, tmp_path / "missing" / "x.safetensors")
    lin = opsnn.nn.Linear(2, 2)
    ckpt = tmp_path / "ckpt.safetensors"
    opsnn.save_checkpoint(ckpt, lin)
    with pytest.raises(CheckpointError, match="use opsnn.load_checkpoint"):
        opsnn.load(ckpt)
    opsnn.save(lin.state_dict(), tmp_path / "sd.safetensors")
    with pytest.raises(CheckpointError, match="map_location 'cuda'"):
        opsnn.load(tmp_path / "sd.safetensors", map_location="cuda")
    with pytest.raises(CheckpointError, match="weights_only must be True or False"):
        opsnn.load(tmp_path / "sd.safetensors", weights_only="yes")
    with pytest.raises(FileNotFoundError):
        opsnn.load(tmp_path / "nothing.safetensors")
