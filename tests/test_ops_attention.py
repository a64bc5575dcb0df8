"""Attention and RotaryEmbedding: the flash and BLAS kernels against an independent numpy
oracle, onnx.reference (opset 25) and onnxruntime (opset 23) — masks, GQA, KV cache,
softcap, windows, 3-D/4-D forms, 16-bit, non-contiguous inputs, typed errors."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError


# -- independent oracle --------------------------------------------------------------------------------
def sdpa_oracle(q, k, v, bias=None, scale=None, softcap=0.0):
    """q (B, Hq, L, E), k/v (B, Hkv, S, E|Ev); bias additive, broadcastable to (B, Hq, L, S)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.swapaxes(-1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    m = s.max(-1, keepdims=True)
    dead = np.isneginf(m)
    e = np.exp(s - np.where(dead, 0, m))
    p = np.where(dead, 0, e / np.where(dead, 1, e.sum(-1, keepdims=True)))
    return p @ v


def causal_bias(L, S, offset=0):
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return np.where(j <= i + offset, 0.0, -np.inf)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def onnx_model(op, inputs, attrs, nout, opset):
    from onnx import helper

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    vi = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, inputs)
        if n
    ]
    outs = [f"o{k}" for k in range(nout)]
    node = helper.make_node(op, names, outs, **attrs)
    et = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    graph = helper.make_graph([node], "g", vi, [helper.make_tensor_value_info(o, et, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), {
        n: v for n, v in zip(names, inputs) if n
    }


def onnx_ref(op, inputs, attrs, nout=1, opset=25):
    from onnx.reference import ReferenceEvaluator

    model, feed = onnx_model(op, inputs, attrs, nout, opset)
    return ReferenceEvaluator(model).run(None, feed)


def ort_ref(op, inputs, attrs, nout=1, opset=23):
    ort = pytest.importorskip("onnxruntime")
    model, feed = onnx_model(op, inputs, attrs, nout, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def run(inputs, attrs, nout=1, algo=None):
    return [r.numpy() for r in opsnn.ops.run_op("Attention", inputs, attrs, num_outputs=nout, algo=algo)]


# -- torch-style SDPA ------------------------------------------------------------------------------------
@pytest.mark.parametrize("B,H,L,S,E", [(1, 1, 1, 1, 1), (2, 3, 37, 53, 24), (1, 2, 130, 70, 64), (2, 4, 9, 200, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_oracle(rng, B, H, L, S, E, causal):
    q, k, v = rand(rng, B, H, L, E), rand(rng, B, H, S, E), rand(rng, B, H, S, E)
    ex = opsnn.aclnn.scaled_dot_product_attention.prepare(q, k, v, is_causal=causal)
    # small score matrices: materialised (on oneDNN where the strategy gives it these products)
    assert ex.kernel_name in ("attention_gemm", "attention_batched")
    want = sdpa_oracle(q, k, v, causal_bias(L, S) if causal else None)
    np.testing.assert_allclose(ex.run().numpy(), want, rtol=2e-5, atol=2e-5)
    flash = opsnn.aclnn.scaled_dot_product_attention.prepare(q, k, v, is_causal=causal, algo="attention_flash")
    np.testing.assert_allclose(flash.run().numpy(), want, rtol=2e-5, atol=2e-5)


def test_sdpa_masks_3d_inputs_and_scale(rng):
    q, k, v = rand(rng, 3, 11, 8), rand(rng, 3, 17, 8), rand(rng, 3, 17, 5)
    mask = rng.random((3, 11, 17)) > 0.3
    got = opsnn.ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3).numpy()
    want = sdpa_oracle(q[:, None], k[:, None], v[:, None], np.where(mask, 0, -np.inf)[:, None], scale=0.3)[:, 0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    fmask = rand(rng, 11, 17)
    got = opsnn.ops.scaled_dot_product_attention(q, k, v, attn_mask=fmask).numpy()
    want = sdpa_oracle(q[:, None], k[:, None], v[:, None], fmask)[:, 0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_sdpa_gqa_and_errors(rng):
    q, k, v = rand(rng, 2, 8, 12, 16), rand(rng, 2, 2, 12, 16), rand(rng, 2, 2, 12, 16)
    got = opsnn.ops.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).numpy()
    np.testing.assert_allclose(got, sdpa_oracle(q, k, v, causal_bias(12, 12)), rtol=2e-5, atol=2e-5)
    with pytest.raises(ParamInvalidError, match="enable_gqa"):
        opsnn.ops.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ParamInvalidError, match="either"):
        opsnn.ops.scaled_dot_product_attention(
            q, k, v, attn_mask=np.ones((12, 12), bool), is_causal=True, enable_gqa=True
        )
    with pytest.raises(ParamInvalidError, match="dropout"):
        opsnn.ops.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ParamInvalidError, match="3-D"):
        opsnn.ops.scaled_dot_product_attention(q[0, 0], q[0, 0], q[0, 0])


# -- ONNX Attention against onnx.reference and onnxruntime ---------------------------------------------
CASES = {
    "4d": dict(shape="4d", attrs={}),
    "4d_gqa_causal": dict(shape="4d", hq=6, hkv=2, attrs={"is_causal": 1}),
    "4d_bool_mask_2d": dict(shape="4d", mask=("bool", 2), attrs={}),
    "4d_float_mask_4d_scaled": dict(shape="4d", mask=("float", 4), attrs={"scale": 0.05}),
    "4d_float_mask_3d_causal": dict(shape="4d", mask=("float", 3), attrs={"is_causal": 1}),
    "4d_short_bool_mask": dict(shape="4d", mask=("bool_short", 4), attrs={}),
    "4d_softcap_mask": dict(shape="4d", mask=("float", 2), attrs={"softcap": 2.0}),
    "4d_past_causal": dict(shape="4d", past=5, attrs={"is_causal": 1}),
    "4d_past_gqa_mask": dict(shape="4d", hq=4, hkv=1, past=7, mask=("bool", 4), attrs={}),
    "3d_gqa": dict(shape="3d", hq=6, hkv=3, attrs={}),
    "3d_past_softcap_causal": dict(shape="3d", past=3, attrs={"softcap": 1.5, "is_causal": 1}),
    "4d_window": dict(shape="4d", attrs={"left_window_size": 3, "right_window_size": 1}, opset=25),
    "4d_window_causal_past": dict(shape="4d", past=4, attrs={"is_causal": 1, "left_window_size": 2}, opset=25),
    "4d_nonpad_causal": dict(shape="4d", nonpad=True, attrs={"is_causal": 1}, opset=24),
    "4d_nonpad_mask": dict(shape="4d", nonpad=True, mask=("float", 2), attrs={}, opset=24),
}


def build(rng, spec, dtype=np.float32, B=2, Sq=6, Skv=9, D=8, Dv=5):
    hq, hkv = spec.get("hq", 3), spec.get("hkv", spec.get("hq", 3))
    attrs = dict(spec["attrs"])
    P = spec.get("past", 0)
    if spec.get("nonpad"):
        Sq = 4
    q, k, v = rand(rng, B, hq, Sq, D), rand(rng, B, hkv, Skv, D), rand(rng, B, hkv, Skv, Dv)
    if spec["shape"] == "3d":
        q, k, v = (a.transpose(0, 2, 1, 3).reshape(B, a.shape[2], -1) for a in (q, k, v))
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    mask = None
    T = P + Skv
    if "mask" in spec:
        kind, rank = spec["mask"]
        shape = {2: (Sq, T), 3: (hq, Sq, T), 4: (B, 1, Sq, T)}[rank]
        if kind == "bool":
            mask = rng.random(shape) > 0.3
            mask[..., 0] = True
        elif kind == "bool_short":
            mask = rng.random(shape[:-1] + (T - 3,)) > 0.3
        else:
            mask = rand(rng, *shape)
    pk = rand(rng, B, hkv, P, D) if P else None
    pv = rand(rng, B, hkv, P, Dv) if P else None
    nonpad = np.array([Skv, 5][:B], np.int64) if spec.get("nonpad") else None
    ins = [q, k, v, mask, pk, pv, nonpad]
    ins = [None if a is None else a.astype(dtype) if a.dtype.kind == "f" else a for a in ins]
    while ins[-1] is None:
        ins.pop()
    return ins, attrs


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gemm_kernel_task_form_matches_the_reference(rng, monkeypatch, name, parallel):
    """attention_gemm's one-region form (a task per (batch, KV head): both products on
    single-threaded MKL, the masked softmax between; K.gemm_tasks) and its batched form give
    the ONNX reference on every case: masks, GQA, past K/V, softcap, windows, nonpad lengths."""
    import sys

    from opsnn.kernels.cpu import mkl

    A = sys.modules["opsnn.ops.defs.attention"]  # (the package attribute is the op function)
    if mkl.unavailable():
        pytest.skip(f"MKL: {mkl.unavailable()}")
    spec = CASES[name]
    ins, attrs = build(rng, spec)
    nout = 3 if spec.get("past") else 1
    want = onnx_ref("Attention", ins, attrs, nout)
    calls = []
    real = A.K.gemm_tasks
    restored = []

    def spy(*a, **kw):  # the serial or the parallel loop, whichever the size would pick; causal row blocks
        calls.append(1)  # of every size: one row, a partial last block (6 = 4 + 2), the default, none
        y = a[3]  # the output as the tasks write it
        for bq in (1, 4, a[-1], 0):
            y[...] = np.nan
            mkl._lib.set_threads_local(3)
            real(*a[:-3], parallel, a[-2], bq, **kw)
            restored.append(mkl._lib.set_threads_local(0))  # the tasks put this thread's MKL setting back
            ys.append(y.copy())

    ys = []
    monkeypatch.setattr(A.K, "gemm_tasks", spy)
    for tasks in (True, False):
        monkeypatch.setattr(A.K, "tasks_balance", lambda n, t=tasks: t)
        got = run(ins, attrs, nout, algo="attention_gemm")
        opsnn.current_stream().synchronize()
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # the task form ran once (4-D Y, or 3-D without GQA: Y is a BLAS operand)
    assert calls == ([1] if spec["shape"] == "4d" or spec.get("hq", 3) == spec.get("hkv", spec.get("hq", 3)) else [])
    assert restored == [3] * 4 * len(calls)
    for y in ys[:-1]:  # every row block size gives the same output (the last run is the one checked)
        np.testing.assert_allclose(y, ys[-1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_matches_onnx_reference(rng, name):
    spec = CASES[name]
    ins, attrs = build(rng, spec)
    nout = 3 if spec.get("past") else 1
    got = run(ins, attrs, nout)
    want = onnx_ref("Attention", ins, attrs, nout)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    for algo in ("attention_blas", "attention_flash"):
        both = run(ins, attrs, nout, algo=algo)
        for g, w in zip(both, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_gemm_kernel_matches_the_reference(rng, monkeypatch, name, rows):
    """attention_gemm_tiled (blocks of query rows on per-thread score tiles) gives the ONNX
    reference on every case, with one-row blocks, blocks that split the queries unevenly (6 =
    2 + 2 + 2, 4 = 2 + 2) and one block per head."""
    import sys

    from opsnn.kernels.cpu import mkl

    A = sys.modules["opsnn.ops.defs.attention"]
    if mkl.unavailable():
        pytest.skip(f"MKL: {mkl.unavailable()}")
    monkeypatch.setattr(A, "TILED_MIN_ROWS", 1)
    monkeypatch.setattr(A, "TILED_MAX_ROWS", rows)
    spec = CASES[name]
    ins, attrs = build(rng, spec)
    nout = 3 if spec.get("past") else 1
    want = onnx_ref("Attention", ins, attrs, nout)
    got = run(ins, attrs, nout, algo="attention_gemm_tiled")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name", [n for n, s in sorted(CASES.items()) if s.get("opset", 23) == 23 and "short" not in n]
)  # ORT: no short masks
def test_attention_matches_onnxruntime(rng, name):
    spec = CASES[name]
    ins, attrs = build(rng, spec)
    nout = 3 if spec.get("past") else 1
    got = run(ins, attrs, nout)
    want = ort_ref("Attention", ins, attrs, nout)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_qk_matmul_output_modes_use_blas_kernel(rng, mode):
    ins, attrs = build(rng, CASES["4d_softcap_mask"])
    attrs = dict(attrs, qk_matmul_output_mode=mode)
    ex = opsnn.aclnn.prepare("Attention", ins, attrs, num_outputs=4)
    assert ex.kernel_name == "attention_blas"
    got = [t.numpy() for t in ex.run()]
    ref = run(ins, attrs, 4, algo="reference")
    for g, w in zip(got, ref):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    q, k, v, mask = ins
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    capped = 2.0 * np.tanh(s / 2.0)
    want = {0: s, 1: capped, 2: capped + mask}.get(mode)
    if want is None:
        e = np.exp(capped + mask - (capped + mask).max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(got[3], want, rtol=1e-5, atol=1e-5)


def test_softmax_precision_double_and_fully_masked_rows(rng):
    q, k, v = rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 6, 4), rand(rng, 1, 2, 6, 4)
    mask = np.ones((5, 6), bool)
    mask[2] = False  # row 2 attends nothing -> zeros, not NaN
    for algo in ("attention_gemm", "attention_flash", "attention_blas", "reference"):
        (y,) = run([q, k, v, mask], {}, algo=algo)
        assert np.all(y[:, :, 2] == 0) and np.isfinite(y).all()
    y, _, _, p = run([q, k, v, mask], {"softmax_precision": 11, "qk_matmul_output_mode": 3}, 4)
    want = onnx_ref("Attention", [q, k, v, mask], {"softmax_precision": 11, "qk_matmul_output_mode": 3}, 4)
    np.testing.assert_allclose(y, want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p, want[3], rtol=1e-6, atol=1e-6)
    ex = opsnn.aclnn.prepare("Attention", [q, k, v], {"softmax_precision": 11})
    assert ex.kernel_name == "attention_blas"  # fp32 accumulation would not honour DOUBLE


@pytest.mark.parametrize("dtype,tol", [(np.float16, 5e-3), (ml_dtypes.bfloat16, 3e-2)])
@pytest.mark.parametrize("name", ["4d_gqa_causal", "3d_past_softcap_causal", "4d_float_mask_3d_causal"])
def test_16bit_against_fp32_oracle(rng, dtype, tol, name):
    ins, attrs = build(rng, CASES[name], dtype=dtype)
    got = run(ins, attrs)[0]
    assert got.dtype == np.dtype(dtype)
    ins32 = [a.astype(np.float32) if a is not None and a.dtype == np.dtype(dtype) else a for a in ins]
    want = onnx_ref("Attention", ins32, attrs)[0]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)


def test_float64_runs_blas_in_double(rng):
    ins, attrs = build(rng, CASES["4d_gqa_causal"])
    ins = [a.astype(np.float64) for a in ins]
    ex = opsnn.aclnn.prepare("Attention", ins, attrs)
    assert ex.kernel_name == "attention_blas"
    np.testing.assert_allclose(ex.run().numpy(), onnx_ref("Attention", ins, attrs)[0], rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs(rng, no_leak):
    q = rand(rng, 2, 7, 3, 8).transpose(0, 2, 1, 3)  # (B, H, S, D) view of (B, S, H, D)
    k = rand(rng, 2, 10, 3, 8).transpose(0, 2, 1, 3)
    v = rand(rng, 2, 10, 3, 8).transpose(0, 2, 1, 3)
    qt, kt, vt = (opsnn.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3))).transpose(1, 2) for a in (q, k, v))
    assert not qt.is_contiguous()
    got = opsnn.ops.scaled_dot_product_attention(qt, kt, vt, is_causal=True).numpy()
    np.testing.assert_allclose(got, sdpa_oracle(q, k, v, causal_bias(7, 10)), rtol=2e-5, atol=2e-5)
    del got, qt, kt, vt


def test_empty_and_decode_shapes(rng):
    q, k, v = rand(rng, 2, 4, 0, 8), rand(rng, 2, 4, 5, 8), rand(rng, 2, 4, 5, 8)
    assert run([q, k, v], {})[0].shape == (2, 4, 0, 8)
    # one-token decode against a long cache
    q, pk, pv = rand(rng, 1, 8, 1, 32), rand(rng, 1, 2, 300, 32), rand(rng, 1, 2, 300, 32)
    k, v = rand(rng, 1, 2, 1, 32), rand(rng, 1, 2, 1, 32)
    y, prk, prv = run([q, k, v, None, pk, pv], {"is_causal": 1}, 3)
    np.testing.assert_array_equal(prk, np.concatenate([pk, k], axis=2))
    np.testing.assert_array_equal(prv, np.concatenate([pv, v], axis=2))
    np.testing.assert_allclose(y, sdpa_oracle(q, prk, prv), rtol=2e-5, atol=2e-5)


def test_nan_propagates(rng):
    q, k, v = rand(rng, 1, 1, 4, 8), rand(rng, 1, 1, 4, 8), rand(rng, 1, 1, 4, 8)
    v[0, 0, 1, 3] = np.nan
    (y,) = run([q, k, v], {})
    assert np.isnan(y[0, 0, :, 3]).all() and np.isfinite(np.delete(y, 3, axis=-1)).all()


def test_attention_bad_inputs(rng):
    q, k, v = rand(rng, 1, 4, 5, 8), rand(rng, 1, 3, 5, 8), rand(rng, 1, 3, 5, 8)
    with pytest.raises(InferShapeError, match="multiple"):
        run([q, k, v], {})
    with pytest.raises(ParamInvalidError, match="q_num_heads"):
        run([q[0], k[0], v[0]], {})
    with pytest.raises(ParamInvalidError, match="together"):
        run([q, q, q, None, q], {})
    with pytest.raises(ParamInvalidError, match="qk_matmul_output_mode"):
        run([q, q, q], {"qk_matmul_output_mode": 7})
    with pytest.raises(InferShapeError, match="attn_mask"):
        run([q, q, q, np.ones((3, 5, 5), bool)], {})
    with pytest.raises(InferShapeError, match="3-D or all 4-D"):
        run([q, q[0], q], {})
    with pytest.raises(DTypeError):
        run([q, q.astype(np.float64), q], {})
    with pytest.raises(ParamInvalidError, match="softmax_precision"):
        run([q, q, q], {"softmax_precision": 7})
    with pytest.raises(ParamInvalidError, match="nonpad"):
        run([q, q, q, None, q, q, np.array([5], np.int64)], {})


# -- RotaryEmbedding -------------------------------------------------------------------------------------------
def rope_case(rng, rank, interleaved, rot, pos, dtype=np.float32, B=2, S=5, N=3, Dh=8):
    x = rand(rng, B, N, S, Dh) if rank == 4 else rand(rng, B, S, N * Dh)
    half = (rot or Dh) // 2
    if pos:
        cos, sin = rand(rng, 11, half), rand(rng, 11, half)
        ids = rng.integers(0, 11, (B, S)).astype(np.int64)
        ins = [x, cos, sin, ids]
    else:
        ins = [x, rand(rng, B, S, half), rand(rng, B, S, half)]
    attrs = {"interleaved": int(interleaved), "rotary_embedding_dim": rot}
    if rank == 3:
        attrs["num_heads"] = N
    return [a.astype(dtype) if a.dtype.kind == "f" else a for a in ins], attrs


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot,pos", [(0, True), (4, True), (0, False), (6, False)])
def test_rotary_matches_onnx_reference(rng, rank, interleaved, rot, pos):
    ins, attrs = rope_case(rng, rank, interleaved, rot, pos)
    ex = opsnn.aclnn.prepare("RotaryEmbedding", ins, attrs)
    assert ex.kernel_name == "rotary_numba"
    got = ex.run().numpy()
    want = onnx_ref("RotaryEmbedding", ins, attrs, opset=23)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ref = opsnn.ops.run_op("RotaryEmbedding", ins, attrs, algo="reference")[0].numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-6, atol=1e-6)


def test_rotary_large_fp16_and_errors(rng):
    ins, attrs = rope_case(rng, 4, False, 0, True, B=2, S=300, N=8, Dh=64)
    want = onnx_ref("RotaryEmbedding", ins, attrs, opset=23)[0]
    got = opsnn.ops.rotary_embedding(*ins).numpy()  # parallel variant
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    h = [a.astype(np.float16) if a.dtype == np.float32 else a for a in ins]
    got16 = opsnn.ops.rotary_embedding(*h).numpy()
    assert got16.dtype == np.float16
    np.testing.assert_allclose(got16.astype(np.float32), want, rtol=2e-2, atol=2e-2)
    x, cos, sin, ids = ins
    with pytest.raises(ParamInvalidError, match="num_heads"):
        opsnn.ops.rotary_embedding(x.reshape(2, 300, -1), cos, sin, ids)
    with pytest.raises(InferShapeError, match="position_ids"):
        opsnn.ops.rotary_embedding(x, cos, sin, ids[:, :3])
    with pytest.raises(ParamInvalidError, match="rotary_embedding_dim"):
        opsnn.ops.rotary_embedding(x, cos, sin, ids, rotary_embedding_dim=5)
    with pytest.raises(opsnn.errors.OpsnnError, match="position_ids"):
        bad = ids.copy()
        bad[0, 0] = 99
        opsnn.ops.rotary_embedding(x, cos, sin, bad).numpy()
        opsnn.current_stream().synchronize()


@pytest.mark.parametrize("algo", ["attention_gemm", "attention_flash", "attention_blas"])
def test_nan_score_poisons_its_row_only(rng, algo):
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)
    q[0, 1, 2, 0] = np.nan  # head 1, query 2: every score of that row is NaN
    (y,) = run([q, k, v], {}, algo=algo)
    assert np.isnan(y[0, 1, 2]).all()
    y[0, 1, 2] = 0
    want = sdpa_oracle(np.where(np.isnan(q), 0, q), k, v, None)
    want[0, 1, 2] = 0
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "algo", ["reference", "attention_blas", "attention_flash", "attention_gemm", "attention_gemm_tiled"]
)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_mask_values_outside_the_window_never_contribute(rng, algo, bad):
    # attention_blas added the mask to the window's -inf, so a NaN (or +inf) there poisoned the row (fuzz nan_inf)
    q, k, v = rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 7, 8), rand(rng, 1, 2, 7, 8)
    i, j = np.arange(5)[:, None], np.arange(7)[None, :]
    for attrs, allowed, key in [
        ({"left_window_size": 1, "right_window_size": 1}, abs(j - i) <= 1, (0, 6)),
        ({"left_window_size": 1, "right_window_size": 0}, (j <= i) & (j >= i - 1), (4, 0)),
        ({"is_causal": 1}, j <= i, (1, 3)),
    ]:
        mask = rand(rng, 5, 7)
        mask[key] = bad
        assert not allowed[key]
        want = sdpa_oracle(q, k, v, np.where(allowed, mask, -np.inf))
        (y,) = run([q, k, v, mask], attrs, algo=algo)
        assert not np.isnan(y).any(), (attrs, algo)
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5, err_msg=str(attrs))


@pytest.mark.parametrize("algo", [None, "attention_flash"])
def test_long_sequence_runs_with_linear_memory(rng, algo):
    """N = 4096: the N x N scores (64 MiB per head) are never materialised; the pool's peak
    during the call is the output (N x d) plus the tiles (the tiled GEMM kernel, chosen with
    MKL: threads x 32 x N floats) or small scratch (flash), and the result matches the oracle on
    sampled query rows."""
    import gc

    from opsnn.kernels.cpu import mkl

    N, D = 4096, 32
    q, k, v = rand(rng, 1, 1, N, D), rand(rng, 1, 1, N, D), rand(rng, 1, 1, N, D)
    gc.collect()
    opsnn.current_stream().synchronize()
    base = opsnn.memory.current_bytes()
    opsnn.memory.reset_peak()
    ex = opsnn.aclnn.scaled_dot_product_attention.prepare(q, k, v, is_causal=True, algo=algo)
    assert ex.kernel_name == algo or ex.kernel_name == (
        "attention_flash" if mkl.unavailable() else "attention_gemm_tiled"
    )
    if algo is None:
        assert "MiB" in dict(ex.rejected)["attention_gemm"]  # too large to materialise
    y = ex.run().numpy()
    opsnn.current_stream().synchronize()
    peak = opsnn.memory.summary()["peak_bytes"] - base
    out_bytes = N * D * 4
    assert peak <= 2 * out_bytes + (1 << 20), (peak, out_bytes)  # O(N d), vs N*N*4 = 64 MiB
    rows = [0, 1, 777, N - 1]
    s = q[0, 0, rows].astype(np.float64) @ k[0, 0].astype(np.float64).T / np.sqrt(D)
    s[np.arange(N)[None, :] > np.array(rows)[:, None]] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v[0, 0].astype(np.float64)
    np.testing.assert_allclose(y[0, 0, rows], want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "B,H,Hkv,L,S,E,Ev",
    [
        (1, 12, 12, 128, 128, 64, 64),
        (2, 3, 3, 5, 7, 4, 6),
        (1, 1, 1, 1, 1, 1, 1),
        (2, 4, 2, 9, 11, 8, 8),
        (1, 2, 1, 3, 0, 4, 4),
    ],
)
@pytest.mark.parametrize("masked", [False, True])
def test_gemm_kernel_head_strided_3d_layout(rng, B, H, Hkv, L, S, E, Ev, masked):
    """attention_gemm on 3-D (B, S, H*D) inputs reads heads through strides (BLAS leading
    dimension) and writes Y in place: equal to the 4-D form and the oracle; also when Q/K/V
    are column slices of one packed QKV tensor (row stride > H*D) and for GQA (stacked rows,
    a contiguous copy of Q)."""
    q4, k4, v4 = rand(rng, B, H, L, E), rand(rng, B, Hkv, S, E), rand(rng, B, Hkv, S, Ev)
    bias = (
        np.where(rng.random((B, 1, L, S)) < 0.2, -np.inf, rng.standard_normal((B, 1, L, S))).astype(np.float32)
        if masked
        else None
    )
    if masked and S:
        bias[..., 0] = 0.0
    want = sdpa_oracle(q4, k4, v4, bias) if S else np.zeros((B, H, L, Ev))

    def to3(a):
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).reshape(a.shape[0], a.shape[2], a.shape[1] * a.shape[3])

    attrs = {"q_num_heads": H, "kv_num_heads": Hkv}
    ins = [to3(q4), to3(k4), to3(v4)] + ([bias] if masked else [])
    (y,) = run(ins, attrs, algo="attention_gemm")
    np.testing.assert_allclose(y.reshape(B, L, H, Ev).transpose(0, 2, 1, 3), want, rtol=2e-5, atol=2e-5)
    if L == S:  # packed QKV: each of Q, K, V a strided column block of one (B, S, 3 * H * E) tensor
        packed = np.concatenate([to3(q4), to3(k4), to3(v4)], axis=2) if H == Hkv and E == Ev else None
        if packed is not None:
            n = H * E
            views = [packed[:, :, :n], packed[:, :, n : 2 * n], packed[:, :, 2 * n :]]
            (y2,) = run(views + ([bias] if masked else []), attrs, algo="attention_gemm")
            np.testing.assert_allclose(y2, y, rtol=1e-6, atol=1e-6)
    (y4,) = run([q4, k4, v4] + ([bias] if masked else []), {}, algo="attention_gemm")
    np.testing.assert_allclose(y4, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_masked_softmax_rows_across_heads_and_batches(rng, parallel):
    # the kernel walks rows by counters (query, head, batch) and in blocks of SOFTMAX_TASK_ROWS
    # that cross heads and batches: every row gets its own batch's mask, length and offset
    from opsnn.kernels.cpu import attention as KA

    B, H, Sq, T = 3, 2, 21, 19
    s = rand(rng, B, H, Sq, T) * 4
    s[1, 0, 5, 2] = np.nan
    mask = np.where(rng.random((B, 1, Sq, T)) < 0.2, -np.inf, 0).astype(np.float32)
    kvlen, off = np.array([19, 7, 0], np.int64), np.array([0, 3, 0], np.int64)
    got, lse = s.copy(), np.zeros(B * H * Sq, np.float32)
    KA.masked_softmax(got, mask, True, kvlen, off, True, -1, -1, np.float32(0.5), np.float32(0), parallel, lse)
    x = s.astype(np.float64) * 0.5 + mask
    keys, q = np.arange(T), np.arange(Sq)
    allowed = (keys[None, None, :] < kvlen[:, None, None]) & (
        keys[None, None, :] <= q[None, :, None] + off[:, None, None]
    )
    x = np.where(allowed[:, None], x, -np.inf)
    with np.errstate(all="ignore"):
        m = x.max(-1, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(m), m, 0))
        want = np.where(np.isfinite(m), e / e.sum(-1, keepdims=True), 0)
        want_lse = np.where(np.isfinite(m), m + np.log(e.sum(-1, keepdims=True)), -np.inf)[..., 0]
    want[1, 0, 5] = np.where(allowed[1, 5], np.nan, 0)  # a NaN score makes its row's attended keys NaN
    want_lse[1, 0, 5] = np.nan
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse.reshape(B, H, Sq), want_lse, rtol=1e-5, atol=1e-5)
    assert (got[2] == 0).all()  # a batch with no key: zeros
