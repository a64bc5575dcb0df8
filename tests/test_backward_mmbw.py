"""Product backward without transposed or reshaped copies: ``opsnn::BatchGemm`` (op(A) @ op(B) over
broadcast batch dims, summed onto an output batch) and the MatMul / Gemm / Linear / Einsum rules.

Oracles: float64 numpy formulas (``np.matmul`` of explicitly transposed copies, summed with
``np.sum``) and ``torch.autograd`` in float64 where torch is importable. Tolerances: float64 results
within rtol 1e-12 of the float64 oracle (BLAS summation order only); float32 results within rtol
1e-5, atol 1e-5 (inner sizes here are at most 70, float32 accumulation error stays below that).
The launch counts come from the profiler: a Linear's backward over (B, S, K) rows launches no
Transpose, Reshape or ReduceSum of an operand.
"""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn import nn, ops, optim
from opsnn.errors import OpsnnError

RNG = np.random.default_rng(31)
TOL = {np.float64: {"rtol": 1e-12, "atol": 1e-12}, np.float32: {"rtol": 1e-5, "atol": 1e-5}}


def _rand(shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _sum_to(y: np.ndarray, shape: tuple) -> np.ndarray:
    """``y`` summed over the leading dims and the dims ``shape`` has as 1 (float64 oracle)."""
    lead = y.ndim - len(shape)
    y = y.sum(axis=tuple(range(lead))) if lead else y
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and y.shape[i] != 1)
    return y.sum(axis=axes, keepdims=True) if axes else y


def _bgemm_oracle(a, b, ta, tb, batch, alpha):
    y = np.matmul(_t(a) if ta else a, _t(b) if tb else b).astype(np.float64) * alpha
    if batch is None:
        return y
    return _sum_to(y, tuple(batch) + y.shape[-2:]).reshape(tuple(batch) + y.shape[-2:])


# -- BatchGemm ------------------------------------------------------------------------------------------
# (A shape, B shape, transA, transB, batch, the plan's case)
BGEMM_CASES = [
    ((2, 5, 3), (2, 5, 4), 1, 0, (), "fold_k"),  # a Linear's dW over (B, S) rows
    ((2, 3, 7, 5), (2, 3, 7, 4), 1, 0, (1,), "fold_k"),
    ((2, 5, 3), (4, 3), 0, 1, None, "fold_m"),  # dX = dY @ W-like, B read transposed
    ((3, 4, 5, 3), (3, 4), 0, 0, None, "fold_m"),
    ((3, 1, 5, 3), (1, 2, 4, 3), 0, 1, None, "batched"),  # broadcast batch dims on both sides
    ((3, 1, 5, 3), (1, 2, 4, 3), 0, 1, (3, 1), "reduce"),  # ... summed onto A's batch
    ((1, 2, 3, 5), (3, 1, 3, 4), 1, 0, (1, 2), "reduce"),
    ((5, 3), (2, 3, 4), 0, 0, (), "reduce"),  # a broadcast 2-D A's gradient
    ((7, 3), (7, 4), 1, 0, None, "batched"),  # 2-D: one GEMM, A read transposed
    ((4, 3), (5, 4), 1, 1, None, "batched"),
    ((2, 6, 9), (2, 6, 11), 1, 0, None, "batched"),  # per-batch A^T B
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("sa, sb, ta, tb, batch, case", BGEMM_CASES)
def test_batch_gemm_matches_the_float64_oracle(sa, sb, ta, tb, batch, case, dtype):
    a, b = _rand(sa, dtype), _rand(sb, dtype)
    ex = opsnn.aclnn.batch_gemm.prepare(a, b, alpha=0.75, trans_a=bool(ta), trans_b=bool(tb), batch=batch)
    assert ex.kernel_name == "batch_gemm_blas" and ex.plan.case == case, ex.plan
    y = ops.batch_gemm(a, b, alpha=0.75, trans_a=bool(ta), trans_b=bool(tb), batch=batch).numpy()
    want = _bgemm_oracle(a.astype(np.float64), b.astype(np.float64), ta, tb, batch, 0.75)
    assert y.dtype == dtype and y.shape == want.shape
    np.testing.assert_allclose(y, want, **TOL[dtype])


def test_batch_gemm_reads_strided_views_and_handles_empty_and_nonfinite():
    base = _rand((2, 9, 8))
    a = base[:, ::2, 1:4]  # (2, 5, 3), non-contiguous
    b = _rand((4, 2, 5)).transpose(1, 2, 0)  # (2, 5, 4) a permuted view
    want = _bgemm_oracle(a, b, 1, 0, (), 1.0)
    np.testing.assert_allclose(ops.batch_gemm(a, b, trans_a=True, batch=()).numpy(), want, **TOL[np.float64])
    # empty products: no rows (a zero result of the right shape), K = 0 (zeros), an empty batch
    assert (
        ops.batch_gemm(_rand((2, 0, 3)), _rand((2, 0, 4)), trans_a=True, batch=()).numpy().tolist() == [[0.0] * 4] * 3
    )
    np.testing.assert_array_equal(ops.batch_gemm(_rand((3, 0)), _rand((0, 2))).numpy(), np.zeros((3, 2)))
    assert ops.batch_gemm(_rand((0, 3, 2)), _rand((2, 5))).shape == (0, 3, 5)
    np.testing.assert_array_equal(ops.batch_gemm(_rand((0, 3, 2)), _rand((0, 3, 5)), trans_a=True, batch=()).numpy(), 0)
    # NaN / Inf reach exactly the outputs whose products read them
    a, b = _rand((2, 4, 3)), _rand((2, 4, 5))
    a[1, 2, 0], a[0, 1, 2] = np.nan, np.inf
    y = ops.batch_gemm(a, b, trans_a=True, batch=()).numpy()
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all() and not np.isfinite(y[2]).any()


def test_batch_gemm_bad_input_is_a_typed_error():
    a, b = np.ones((2, 5, 3), np.float32), np.ones((2, 5, 4), np.float32)
    with pytest.raises(OpsnnError, match=r"BatchGemm.*at least 2-D"):
        ops.batch_gemm(np.ones(3, np.float32), b)
    with pytest.raises(OpsnnError, match=r"BatchGemm.*inner dimensions differ"):
        ops.batch_gemm(a, b)
    with pytest.raises(OpsnnError, match=r"BatchGemm.*batch \(3,\) is not a shape the broadcast batch \(2,\)"):
        ops.batch_gemm(a, b, trans_a=True, batch=(3,))
    with pytest.raises(OpsnnError, match=r"BatchGemm.*\(2,\) and \(3,\) do not broadcast"):
        ops.batch_gemm(a, np.ones((3, 5, 4), np.float32), trans_a=True)
    with pytest.raises(OpsnnError, match="BatchGemm"):
        ops.batch_gemm(a, b.astype(np.float64), trans_a=True)


@pytest.mark.parametrize(
    "sa, sb, ta, tb, batch, onednn",
    [
        ((2, 5, 7), (2, 5, 4), 1, 0, (), True),  # fold_k
        ((2, 5, 7), (4, 7), 0, 1, None, True),  # fold_m
        ((2, 7, 5), (2, 4, 7), 1, 1, None, True),  # equal batch dims
        ((3, 1, 5, 7), (1, 2, 7, 4), 0, 0, (3, 1), False),  # a broadcast batch summed: the adapter
    ],
)
def test_batch_gemm_bfloat16_runs_on_onednn_where_native(sa, sb, ta, tb, batch, onednn):
    """bfloat16 products (a bf16 forward's backward): oneDNN's bf16 matmul where this CPU and oneDNN
    have native bf16 and the product is one matmul, else the float32 adapter; within one bf16
    rounding of the float64 product of the same bf16 operands (atol 1e-4: float32 accumulation)."""
    import ml_dtypes

    from opsnn.kernels.cpu import libraries as KL

    bf16 = np.dtype(ml_dtypes.bfloat16)
    a, b = _rand(sa).astype(bf16), _rand(sb).astype(bf16)
    kw = {"trans_a": bool(ta), "trans_b": bool(tb), "batch": batch}
    ex = opsnn.aclnn.batch_gemm.prepare(a, b, **kw)
    assert (ex.kernel_name == "batch_gemm_onednn_runtime") == (onednn and KL.runtime_bf16_product() is None)
    y = ops.batch_gemm(a, b, **kw).numpy()
    assert y.dtype == bf16
    want = _bgemm_oracle(a.astype(np.float64), b.astype(np.float64), ta, tb, batch, 1.0)
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=2.0**-8, atol=1e-4)


# -- the rules ----------------------------------------------------------------------------------------------
def _grads(fn, arrays, g):
    """opsnn's gradients of ``fn(*tensors)`` for the output gradient ``g``."""
    ts = [opsnn.tensor(a).requires_grad_() for a in arrays]
    y = fn(*ts)
    return [t.numpy() for t in opsnn.autograd.grad([y], ts, [opsnn.tensor(g)])]


def _torch_grads(fn, arrays, g):
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    return [t.numpy() for t in torch.autograd.grad([fn(*ts)], ts, [torch.tensor(g, dtype=torch.float64)])]


MATMUL_SHAPES = [
    ((5,), (5,)),
    ((5,), (5, 3)),
    ((4, 5), (5,)),
    ((4, 5), (5, 3)),
    ((2, 3, 4, 5), (5, 3)),  # a 2-D B: dB is one GEMM over the folded batch
    ((4, 5), (2, 5, 3)),  # a 2-D A broadcast over B's batch
    ((3, 1, 4, 5), (1, 2, 5, 3)),  # broadcast batch dims on both sides
    ((2, 1, 4, 5), (3, 5, 6)),
    ((5,), (2, 5, 3)),
    ((2, 4, 5), (5,)),
]


def _matmul_oracle(a, b, g):
    """float64: dA = dY @ B^T, dB = A^T @ dY over explicit copies, summed onto each operand's shape."""
    a2 = a[None] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = np.asarray(g)
    if a.ndim == 1:
        g2 = np.expand_dims(g2, -2 if b.ndim > 1 else 0)
    if b.ndim == 1:
        g2 = g2[..., None]
    ga = _sum_to(g2 @ np.ascontiguousarray(_t(b2)), a2.shape).reshape(a.shape)
    gb = _sum_to(np.ascontiguousarray(_t(a2)) @ g2, b2.shape).reshape(b.shape)
    return ga, gb


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
def test_matmul_gradient_matches_float64_oracle_and_torch(sa, sb):
    a, b = _rand(sa), _rand(sb)
    g = _rand(np.matmul(a, b).shape)
    got = _grads(ops.matmul, [a, b], g)
    for x, w in zip(got, _matmul_oracle(a, b, g)):
        np.testing.assert_allclose(x, w, **TOL[np.float64])
    for x, w in zip(got, _torch_grads(lambda p, q: p @ q, [a, b], g)):
        np.testing.assert_allclose(x, w, **TOL[np.float64])
    # float32 through the same rule
    got32 = _grads(ops.matmul, [a.astype(np.float32), b.astype(np.float32)], g.astype(np.float32))
    for x, w in zip(got32, _matmul_oracle(a, b, g)):
        assert x.dtype == np.float32
        np.testing.assert_allclose(x, w, **TOL[np.float32])


def test_matmul_rule_matches_the_composition_it_replaces():
    """The rule before BatchGemm: Transpose + MatMul, then ReduceSum onto the operand's shape."""
    a, b = _rand((3, 1, 4, 5), np.float32), _rand((1, 2, 5, 3), np.float32)
    g = _rand((3, 2, 4, 3), np.float32)
    ga, gb = _grads(ops.matmul, [a, b], g)
    ta = ops.matmul(g, ops.transpose(b, [0, 1, 3, 2]))
    tb = ops.matmul(ops.transpose(a, [0, 1, 3, 2]), g)
    old_a = ops.sum(ta, dim=[1], keepdim=True).numpy()
    old_b = ops.sum(tb, dim=[0], keepdim=True).numpy()
    np.testing.assert_allclose(ga, old_a, **TOL[np.float32])
    np.testing.assert_allclose(gb, old_b, **TOL[np.float32])


@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (3,), (1, 3), (4, 1), (4, 3)])
def test_gemm_gradient_matches_float64_oracle_and_torch(ta, tb, c_shape):
    m, k, n = 4, 6, 3
    a, b = _rand((k, m) if ta else (m, k)), _rand((n, k) if tb else (k, n))
    alpha, beta = 0.7, -1.3
    arrays = [a, b] + ([] if c_shape is None else [_rand(c_shape)])
    g = _rand((m, n))
    got = _grads(lambda *t: ops.gemm(*t, alpha=alpha, beta=beta, trans_a=bool(ta), trans_b=bool(tb)), arrays, g)
    opa, opb = (a.T if ta else a), (b.T if tb else b)
    da, db = alpha * g @ opb.T, alpha * opa.T @ g
    want = [da.T if ta else da, db.T if tb else db]
    if c_shape is not None:
        want.append(_sum_to(beta * g, c_shape).reshape(c_shape))
    for x, w in zip(got, want):
        np.testing.assert_allclose(x, w, **TOL[np.float64])

    def torch_gemm(p, q, *c):
        r = alpha * ((p.T if ta else p) @ (q.T if tb else q))
        return r + beta * c[0] if c else r

    for x, w in zip(got, _torch_grads(torch_gemm, arrays, g)):
        np.testing.assert_allclose(x, w, **TOL[np.float64])


@pytest.mark.parametrize("x_shape", [(7,), (5, 7), (2, 5, 7), (2, 3, 4, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_gradient_matches_float64_oracle_and_torch(x_shape, bias):
    torch = pytest.importorskip("torch")
    x, w = _rand(x_shape), _rand((3, 7))
    arrays = [x, w] + ([_rand((3,))] if bias else [])
    g = _rand(x_shape[:-1] + (3,))
    got = _grads(ops.linear, arrays, g)
    g2, x2 = g.reshape(-1, 3), x.reshape(-1, 7)
    want = [g @ w, g2.T @ x2] + ([g2.sum(axis=0)] if bias else [])
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, **TOL[np.float64])
    for a, e in zip(got, _torch_grads(torch.nn.functional.linear, arrays, g)):
        np.testing.assert_allclose(a, e, **TOL[np.float64])


@pytest.mark.parametrize(
    "eq, shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("ij,ij->i", [(3, 4), (3, 4)]),
        ("ij->j", [(3, 4)]),
        ("ik,jk", [(3, 4), (5, 4)]),  # implicit output: the labels used once, sorted
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
        ("ij,k->ijk", [(2, 3), (4,)]),
    ],
)
def test_einsum_gradient_matches_torch(eq, shapes):
    arrays = [_rand(s) for s in shapes]
    g = _rand(np.einsum(eq, *arrays).shape)
    got = _grads(lambda *t: ops.einsum(eq, *t), arrays, g)
    torch = pytest.importorskip("torch")
    for a, e in zip(got, _torch_grads(lambda *t: torch.einsum(eq, *t), arrays, g)):
        np.testing.assert_allclose(a, e, **TOL[np.float64])


# -- launches --------------------------------------------------------------------------------------------
def _launched(fn, arrays, g) -> list:
    ts = [opsnn.tensor(a).requires_grad_() for a in arrays]
    y = fn(*ts)
    with opsnn.profiler.profile() as p:
        opsnn.autograd.grad([y], ts, [opsnn.tensor(g)])
    return [(e.op, e.kernel) for e in p.kernels]


def test_linear_backward_launches_no_transpose_or_reshape():
    """dX, dW, dB of a Linear over (B, S, K) rows: one MatMul, one BatchGemm (dW as one GEMM over the
    folded rows, dY read transposed), one ReduceSum for the bias; nothing moves an operand."""
    x, w, b = _rand((2, 6, 7), np.float32), _rand((3, 7), np.float32), _rand((3,), np.float32)
    launched = _launched(ops.linear, [x, w, b], _rand((2, 6, 3), np.float32))
    assert sorted(op for op, _ in launched) == ["BatchGemm", "MatMul", "ReduceSum"], launched
    ex = opsnn.aclnn.batch_gemm.prepare(_rand((2, 6, 3), np.float32), x, trans_a=True, batch=())
    assert ex.plan.case == "fold_k"


def test_matmul_backward_launches_only_products():
    for sa, sb in [((2, 6, 7), (7, 3)), ((2, 6, 7), (2, 7, 3)), ((3, 1, 4, 5), (1, 2, 5, 3)), ((7,), (7, 3))]:
        a, b = _rand(sa, np.float32), _rand(sb, np.float32)
        launched = _launched(ops.matmul, [a, b], _rand(np.matmul(a, b).shape, np.float32))
        assert [op for op, _ in launched] == ["BatchGemm", "BatchGemm"], (sa, sb, launched)


def test_gemm_backward_launches_only_gemms():
    a, b, c = _rand((6, 4), np.float32), _rand((3, 6), np.float32), _rand((3,), np.float32)
    launched = _launched(lambda *t: ops.gemm(*t, trans_a=True, trans_b=True), [a, b, c], _rand((4, 3), np.float32))
    assert sorted(op for op, _ in launched) == ["Gemm", "Gemm", "ReduceSum"], launched


def test_compiled_step_with_linear_layers_has_no_transpose_and_matches_eager():
    """A compiled MLP training step: its backward graph holds BatchGemm nodes and no Transpose, and its
    losses follow the eager step's (rtol 1e-5, as tests/test_compiled_training.py)."""
    xs = _rand((3, 2, 5, 6), np.float32)
    ys = _rand((3, 2, 5, 4), np.float32)

    def run(compiled):
        with nn.init.seeded(0):
            model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        opt = optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        fn = opsnn.compile(step) if compiled else step
        losses = [float(fn(opsnn.tensor(x), opsnn.tensor(y)).item()) for x, y in zip(xs, ys)]
        return np.array(losses), fn

    closs, fn = run(True)
    kinds = [n.op_type for n in fn.graph().nodes]
    assert kinds.count("BatchGemm") == 2 and "Transpose" not in kinds, kinds
    eloss, _ = run(False)
    np.testing.assert_allclose(closs, eloss, rtol=1e-5, atol=1e-7)


def test_explain_names_the_library_of_a_batch_gemm_and_how_its_batch_folds():
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.tools.explain import explain_graph

    a, b = np.ones((2, 5, 3), np.float32), np.ones((2, 5, 4), np.float32)
    cg = opsnn.compile(lambda a, b: ops.batch_gemm(a, b, trans_a=True, batch=()), [opsnn.tensor(a), opsnn.tensor(b)])
    text = explain_graph(cg, {"a": a.shape, "b": b.shape})
    want = KL.blas_product(3, 10, 4, np.float32)  # the batch of 2 folded into K: one 3 x 10 @ 10 x 4 GEMM
    assert "2x5x3^T @ 2x5x4 -> 3x4" in text and want.reason in text, text


def test_a_graph_with_an_empty_batch_attribute_round_trips_through_onnx(tmp_path):
    """batch=() (every batch dim summed) is an empty ints attribute: saved as INTS, loaded as []."""
    a, b = _rand((2, 5, 3), np.float32), _rand((2, 5, 4), np.float32)
    cg = opsnn.compile(lambda a, b: ops.batch_gemm(a, b, trans_a=True, batch=()), [opsnn.tensor(a), opsnn.tensor(b)])
    path = cg.save(str(tmp_path / "bgemm.onnx"))
    loaded = opsnn.compile(opsnn.onnx.load(path))
    (y,) = loaded.run({"a": a, "b": b}).values()
    want = _bgemm_oracle(a.astype(np.float64), b.astype(np.float64), 1, 0, (), 1.0)
    np.testing.assert_allclose(np.asarray(y.numpy() if hasattr(y, "numpy") else y), want, **TOL[np.float32])


def test_llama_and_bert_steps_move_no_heads():
    """The models keep attention's (B, S, H*D) layout (head counts as attributes): forward and backward
    launch no Transpose, and LLaMA's backward no Reshape either; every parameter gets a gradient."""
    llama = opsnn.models.llama(layers=1, hidden=32, heads=4, kv_heads=2, vocab=50, intermediate=64, seed=0)
    with nn.init.seeded(0):
        bert = opsnn.models.bert("tiny", num_hidden_layers=1, vocab_size=50, max_position_embeddings=16, seed=0)
    ids = RNG.integers(0, 50, (2, 9))
    for name, model in (("llama", llama), ("bert", bert)):
        params = [p for p in model.parameters() if p.requires_grad]
        with opsnn.profiler.profile() as fwd:
            out = model(ids)[0]
        with opsnn.profiler.profile() as bwd:
            grads = opsnn.autograd.grad([out], params, [opsnn.tensor(_rand(out.shape, np.float32))], allow_unused=True)
        assert "Transpose" not in [e.op for e in fwd.kernels + bwd.kernels], name
        assert name == "bert" or "Reshape" not in [e.op for e in bwd.kernels], [e.op for e in bwd.kernels]
        if name == "llama":
            assert all(g is not None for g in grads)


# -- Einsum as one batched GEMM (its gradients are two-operand einsums too) ----------------------------------
@pytest.mark.parametrize(
    "eq, shapes, gemm",
    [
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], True),  # B read transposed
        ("bhqk,bhqd->bhkd", [(2, 3, 4, 6), (2, 3, 4, 5)], True),  # A read transposed (a gradient)
        ("ij,kj->ki", [(3, 4), (5, 4)], True),  # output N + M: the operands swap roles
        ("ij,ij->i", [(3, 4), (3, 4)], True),  # a batch of dot products
        ("ij,k->ijk", [(2, 3), (4,)], True),  # an outer product (K empty)
        ("bij,bjk->bki", [(2, 3, 4), (2, 4, 5)], True),
        ("ibj,bjk->bik", [(3, 2, 4), (2, 4, 5)], False),  # the batch label not leading in A
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)], False),  # three operands
        ("ii,ij->j", [(3, 3), (3, 4)], False),  # a diagonal
        ("bij,bjk->bik", [(0, 3, 4), (0, 4, 5)], True),  # an empty batch
        ("ij,jk->ik", [(3, 0), (0, 5)], True),  # K = 0: zeros
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_einsum_runs_as_one_batched_gemm_where_its_labels_group(eq, shapes, gemm, dtype):
    arrays = [_rand(s, dtype) for s in shapes]
    ex = opsnn.aclnn.einsum.prepare(eq, *arrays)
    assert (ex.kernel_name == "einsum_batch_gemm") == gemm, ex.rejected
    want = np.einsum(eq, *[a.astype(np.float64) for a in arrays])
    y = ops.einsum(eq, *arrays).numpy()
    assert y.dtype == dtype and y.shape == want.shape
    np.testing.assert_allclose(y, want, **TOL[dtype])


def test_einsum_gemm_reads_strided_operands():
    q = _rand((2, 4, 3, 5)).transpose(0, 2, 1, 3)  # (2, 3, 4, 5) head view of a (B, S, H, D) tensor
    k = _rand((2, 3, 12, 5))[:, :, ::2]  # every other key
    eq = "bhqd,bhkd->bhqk"
    assert opsnn.aclnn.einsum.prepare(eq, q, k).kernel_name == "einsum_batch_gemm"
    np.testing.assert_allclose(ops.einsum(eq, q, k).numpy(), np.einsum(eq, q, k), **TOL[np.float64])
