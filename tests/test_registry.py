"""The op registry and the two-phase API, driven by a custom op registered from outside
the package with the same public API the library uses for its own ops."""

import re

import numba as nb
import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, InferShapeError, KernelNotFoundError, ParamInvalidError, ParamNullptrError
from opsnn.ops import Attr, Input, TensorMeta


@nb.njit(parallel=True, nogil=True, cache=True)
def _scaled_add(x, y, alpha, out):
    for i in nb.prange(x.size):
        out[i] = x[i] + alpha * y[i]


def _infer(ctx):
    if ctx.shape(0) != ctx.shape(1):
        ctx.fail(f"X and Y must have the same shape, got {ctx.shape(0)} and {ctx.shape(1)}")
    return [TensorMeta(ctx.shape(0), ctx.dtype(0))]


REC = opsnn.register_op(
    "ScaledAdd",
    domain="user",
    category="elementwise",
    inputs=[Input("X", (np.dtype("float32"), np.dtype("float64"), opsnn.dtypes.float16)), Input("Y")],
    outputs=["Z"],
    attrs=[Attr("alpha", "float", 1.0)],
    infer=_infer,
    reference=lambda ins, attrs: (ins[0] + attrs["alpha"] * ins[1]).astype(ins[0].dtype),
)

CALLS = {"plan": 0}


def _plan(ctx):
    CALLS["plan"] += 1
    return {"n": int(np.prod(ctx.shape(0)))}


@REC.kernel(
    "scaled_add_numba",
    priority=10,
    dtypes=(np.dtype("float32"), np.dtype("float64")),
    plan=_plan,
    workspace=lambda ctx, plan: 128,
)
def _scaled_add_kernel(ins, outs, attrs, plan, ws):
    assert ws is not None and ws.nbytes >= 128
    _scaled_add(ins[0].reshape(-1), ins[1].reshape(-1), attrs["alpha"], outs[0].reshape(-1))


@opsnn.ops.api("scaled_add", "ScaledAdd", domain="user")
def scaled_add(x, y, alpha=1.0):
    return [x, y], {"alpha": float(alpha)}


def test_custom_op_eager_and_two_phase(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((3, 5)).astype(np.float32)
    z = scaled_add(opsnn.tensor(x), opsnn.tensor(y), alpha=2.0)
    np.testing.assert_allclose(z.numpy(), x + 2 * y, rtol=1e-6)
    ex = opsnn.aclnn.scaled_add.prepare(opsnn.tensor(x), opsnn.tensor(y), alpha=0.5)
    assert ex.kernel_name == "scaled_add_numba" and ex.workspace_size == 128
    assert "priority 10" in ex.reason
    ws = opsnn.empty((ex.workspace_size,), "uint8")
    out = ex.run(ws)
    np.testing.assert_allclose(out.numpy(), x + 0.5 * y, rtol=1e-6)


def test_executor_is_repeatable_with_new_data(rng):
    xt = opsnn.tensor(np.zeros((4,), np.float32))
    yt = opsnn.tensor(np.ones((4,), np.float32))
    ex = opsnn.aclnn.scaled_add.prepare(xt, yt, alpha=3.0)
    plans = CALLS["plan"]
    out = ex.run()
    np.testing.assert_array_equal(out.numpy(), 3.0)
    xt.copy_(np.arange(4, dtype=np.float32))
    assert ex.run() is out
    np.testing.assert_array_equal(out.numpy(), np.arange(4) + 3.0)
    ex.run(inputs=[opsnn.tensor(np.full(4, 10, np.float32)), yt])
    np.testing.assert_array_equal(out.numpy(), 13.0)
    assert CALLS["plan"] == plans, "run() must not re-plan"
    with pytest.raises(ParamInvalidError, match="prepared for"):
        ex.run(inputs=[opsnn.tensor(np.zeros(5, np.float32)), yt])


def test_executor_runs_async_on_a_stream():
    s = opsnn.Stream()
    xt = opsnn.tensor(np.ones((1 << 16,), np.float32))
    ex = opsnn.aclnn.scaled_add.prepare(xt, xt, alpha=1.0)
    out = ex.run(stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out.numpy(), 2.0)


def test_out_argument_and_errors():
    x = opsnn.tensor(np.ones(3, np.float32))
    out = opsnn.empty((3,), "float32")
    ex = opsnn.aclnn.scaled_add.prepare(x, x, out=out)
    assert ex.run() is out
    with pytest.raises(ParamInvalidError, match="out"):
        opsnn.aclnn.scaled_add.prepare(x, x, out=opsnn.empty((4,), "float32"))


def test_eager_cache_reuses_executors():
    x = opsnn.tensor(np.ones(7, np.float32))
    scaled_add(x, x, alpha=1.5)
    n = opsnn.ops.cache_info()["entries"]
    plans = CALLS["plan"]
    for _ in range(5):
        r = scaled_add(opsnn.tensor(np.ones(7, np.float32)), x, alpha=1.5)
    assert opsnn.ops.cache_info()["entries"] == n and CALLS["plan"] == plans
    np.testing.assert_array_equal(r.numpy(), 2.5)
    a, b = scaled_add(x, x), scaled_add(x, x)
    assert not np.shares_memory(a.numpy(), b.numpy()), "eager calls return fresh outputs"


def test_forcing_kernels_and_the_fallback():
    x = opsnn.tensor(np.arange(5, dtype=np.float32))
    assert opsnn.aclnn.scaled_add.prepare(x, x, algo="reference").kernel_name == "reference"
    r = scaled_add(x, x, alpha=2.0, algo="reference")
    np.testing.assert_array_equal(r.numpy(), 3 * np.arange(5))
    with pytest.raises(KernelNotFoundError, match="no kernel named"):
        scaled_add(x, x, algo="winograd")
    ex = opsnn.aclnn.scaled_add.prepare(opsnn.tensor(np.ones(3, np.float16)), opsnn.tensor(np.ones(3, np.float16)))
    assert ex.kernel_name == "scaled_add_numba" and ex.adapter
    np.testing.assert_array_equal(ex.run().numpy(), np.full(3, 2, np.float16))


def test_kernel_selector_context():
    rec = opsnn.ops.get_op("Relu")
    x = opsnn.tensor(np.array([-1.0, 1.0], np.float32))
    with opsnn.kernel_selector(Relu="reference"):
        assert opsnn.aclnn.relu.prepare(x).kernel_name == "reference"
    assert opsnn.aclnn.relu.prepare(x).kernel_name != "reference"
    assert any(k.name == "reference" for k in rec.kernels)
    with pytest.raises(KernelNotFoundError, match="kernels"):
        opsnn.kernel_selector(Relu="nope")


def test_kernel_selector_forces_the_fusions_ops_too():
    """An op of the opsnn domain that passes create (FusedMatMul, as explain shows it) is forced by its
    type like any other; a kernel it lacks is still refused with its kernels listed."""
    from opsnn.graph import Graph, Node, Value

    rng = np.random.default_rng(0)
    g = Graph(
        "mlp",
        inputs=[Value("x", np.float32, (4, 8))],
        outputs=["y"],
        nodes=[Node("MatMul", ["x", "w"], ["h"]), Node("Add", ["h", "b"], ["z"]), Node("Relu", ["z"], ["y"])],
        initializers={
            "w": rng.standard_normal((8, 5)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
        },
    )
    x = rng.standard_normal((4, 8)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ g.initializers["w"] + g.initializers["b"], 0)
    with opsnn.kernel_selector(FusedMatMul="matmul_epilogue_numpy"):
        cg = opsnn.compile(g)
        got = cg.run({"x": x})["y"].numpy()
    assert "FusedMatMul): matmul_epilogue_numpy" in cg.explain(), cg.explain()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(KernelNotFoundError, match="matmul_epilogue"):
        opsnn.kernel_selector(FusedMatMul="nope")


def test_bad_input_errors_are_typed_and_pointed():
    x = opsnn.tensor(np.ones(3, np.float32))
    with pytest.raises(InferShapeError, match=r"ScaledAdd: .*\(3,\) and \(4,\)"):
        scaled_add(x, opsnn.tensor(np.ones(4, np.float32)))
    with pytest.raises(DTypeError, match="int32"):
        scaled_add(opsnn.tensor(np.ones(3, np.int32)), x)
    with pytest.raises(ParamNullptrError, match="'Y'"):
        opsnn.ops.run_op("ScaledAdd", [x, None], domain="user")
    with pytest.raises(ParamInvalidError, match="did you mean 'alpha'"):
        opsnn.ops.run_op("ScaledAdd", [x, x], {"alpah": 1.0}, domain="user")
    with pytest.raises(ParamInvalidError, match="unexpected keyword"):
        scaled_add(x, x, beta=2)
    with pytest.raises(KernelNotFoundError, match="nearest"):
        opsnn.ops.get_op("Rellu")
    err = ParamInvalidError("x")
    assert err.code == 161002 and str(err).startswith("[161002]")


def test_register_op_validation():
    with pytest.raises(ParamInvalidError, match="already registered"):
        opsnn.register_op(
            "ScaledAdd", domain="user", inputs=["X"], outputs=["Y"], infer=_infer, reference=lambda i, a: i[0]
        )
    with pytest.raises(ParamInvalidError, match="required"):
        opsnn.register_op("NoInfer", inputs=["X"], outputs=["Y"])
    with pytest.raises(ParamInvalidError, match="already registered"):
        REC.kernel("scaled_add_numba")(lambda *a: None)


def test_backend_capability_lists_ops_and_kernels():
    caps = opsnn.config.get_backend_capability()
    entry = caps["cpu"]["user::ScaledAdd"]
    assert [k["name"] for k in entry["kernels"]] == ["scaled_add_numba", "reference"]
    assert entry["category"] == "elementwise"
    assert "Relu" in caps["cpu"]


def test_unreadable_arguments_name_the_argument():
    """An argument an entry point cannot read (a string for a number, an array for a flag,
    None for a tensor) is a ParamInvalidError naming it, not numpy's or Python's bare error."""
    x = opsnn.tensor(np.ones((1, 3, 8, 8), np.float32))
    w = opsnn.tensor(np.ones((4, 3, 3, 3), np.float32))
    with pytest.raises(ParamInvalidError, match=r"conv2d: groups must be an int, got 'two'"):
        opsnn.ops.conv2d(x, w, groups="two")
    with pytest.raises(ParamInvalidError, match=r"sum: keepdim must be a bool, got array"):
        opsnn.ops.sum(x, dim=1, keepdim=np.ones((2, 2)))
    with pytest.raises(ParamInvalidError, match=r"gemm: alpha must be a number, got 'z'"):
        opsnn.ops.gemm(x, x, alpha="z")
    with pytest.raises(ParamInvalidError, match=r"flatten: x is required, got None"):
        opsnn.ops.flatten(None)
    with pytest.raises(ParamInvalidError, match=r"topk: k='k' is not valid"):
        opsnn.ops.topk(x, "k")
    with pytest.raises(ParamInvalidError, match=r"at most 64"):
        opsnn.ops.reshape(opsnn.tensor(np.ones(1, np.float32)), [1] * 70)


def _entry_points():
    import inspect

    from opsnn.ops.api import FUNCTIONS

    for name, fn in sorted(FUNCTIONS.items()):
        sig = inspect.signature(fn.translate)
        for p in sig.parameters.values():
            if isinstance(p.default, (bool, int, float)) and p.kind is not p.VAR_KEYWORD:
                yield name, fn, p.name


@pytest.mark.parametrize("bad", ["abc", np.ones((2, 2))], ids=["string", "array"])
def test_every_entry_point_types_its_scalar_argument_errors(bad):
    """Every functional entry point, every argument with a bool / int / float default: a bad
    value either works (some accept arrays) or raises an opsnn error, never a bare one."""
    import inspect

    x = opsnn.tensor(np.ones((2, 3, 4, 5), np.float32))
    checked = 0
    for name, fn, pname in _entry_points():
        sig = inspect.signature(fn.translate)
        required = {
            p.name: x
            for p in sig.parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        try:
            fn.translate(**required)
        except Exception:  # noqa: BLE001 - these inputs do not suit this op: nothing to pin on pname
            continue
        try:
            fn(**required, **{pname: bad})
        except opsnn.errors.OpsnnError as e:
            checked += 1
            if "must be" in str(e) and f"{name}:" in str(e):
                assert re.search(rf"\b{pname}\b", str(e)), f"{name}: the error names another argument: {e}"
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{name}({pname}={bad!r}) raised a bare {type(e).__name__}: {e}")
    assert checked > 50


def test_every_tiering_stand_in_is_a_kernel_of_its_own_op():
    """A ``cold_alternative`` names kernels of the same record (one name or several in order): a typo
    would silently leave the kernel compiling in the foreground."""
    from opsnn.ops.registry import REGISTRY

    named = 0
    for rec in REGISTRY.values():
        kernels = {k.name for k in rec.kernels}
        for k in rec.kernels:
            alts = (k.cold_alternative,) if isinstance(k.cold_alternative, str) else k.cold_alternative
            for alt in filter(None, alts):
                assert alt in kernels and alt != k.name, (rec.name, k.name, alt)
                named += 1
    assert named >= 10
