"""RNN / GRU / LSTM: the BLAS+numba kernels against an independent per-step numpy oracle,
onnxruntime (layout 0) and onnx.reference; layouts, sequence lengths, activations, errors."""

import ml_dtypes
import numpy as np
import pytest

import opsnn
from opsnn.errors import InferShapeError, OpsnnError, ParamInvalidError

G = {"RNN": 1, "GRU": 3, "LSTM": 4}
FN = {"RNN": opsnn.ops.rnn, "GRU": opsnn.ops.gru, "LSTM": opsnn.ops.lstm}
NOUT = {"RNN": 2, "GRU": 2, "LSTM": 3}


# -- independent oracle: textbook equations, one batch row and one time step at a time ------------------
def _sig(x):
    return 1 / (1 + np.exp(-x))


ACT = {
    "tanh": lambda x, a, b: np.tanh(x),
    "sigmoid": lambda x, a, b: _sig(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "hardsigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "affine": lambda x, a, b: a * x + b,
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "elu": lambda x, a, b: np.where(x >= 0, x, a * np.expm1(x)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": lambda x, a, b: np.log1p(np.exp(x)),
    "thresholdedrelu": lambda x, a, b: np.where(x >= a, x, 0),
}


def oracle(
    op,
    X,
    W,
    R,
    B=None,
    lens=None,
    h0=None,
    c0=None,
    P=None,
    direction="forward",
    clip=None,
    acts=None,
    lbr=0,
    input_forget=0,
):
    """acts: per direction list of (name, alpha, beta) for f(, g(, h))."""
    T, Bn, _ = X.shape
    D, H = W.shape[0], R.shape[2]
    g = G[op]
    X, W, R = X.astype(np.float64), W.astype(np.float64), R.astype(np.float64)
    B = np.zeros((D, 2 * g * H)) if B is None else B.astype(np.float64)
    lens = np.full(Bn, T) if lens is None else lens
    default = {
        "RNN": [("tanh", 0, 0)],
        "GRU": [("sigmoid", 0, 0), ("tanh", 0, 0)],
        "LSTM": [("sigmoid", 0, 0), ("tanh", 0, 0), ("tanh", 0, 0)],
    }[op]
    acts = acts or [default] * D
    cl = (lambda v: v) if clip is None else (lambda v: np.clip(v, -clip, clip))
    Y = np.zeros((T, D, Bn, H))
    Yh = np.zeros((D, Bn, H))
    Yc = np.zeros((D, Bn, H))
    rev = [direction == "reverse"] if D == 1 else [False, True]
    for d in range(D):
        f = lambda x, k=0: ACT[acts[d][k][0]](x, acts[d][k][1], acts[d][k][2])  # noqa: E731
        for b in range(Bn):
            h = np.zeros(H) if h0 is None else h0[d, b].astype(np.float64)
            c = np.zeros(H) if c0 is None else c0[d, b].astype(np.float64)
            n = int(lens[b])
            order = range(n - 1, -1, -1) if rev[d] else range(n)
            Wb, Rb = B[d, : g * H], B[d, g * H :]
            for t in order:
                x = X[t, b]
                if op == "RNN":
                    h = f(cl(W[d] @ x + R[d] @ h + Wb + Rb))
                elif op == "GRU":
                    Wz, Wr, Wh = np.split(W[d], 3)
                    Rz, Rr, Rh = np.split(R[d], 3)
                    bz, br, bh = np.split(Wb, 3)
                    rz, rr, rh = np.split(Rb, 3)
                    z = f(cl(Wz @ x + Rz @ h + bz + rz))
                    r = f(cl(Wr @ x + Rr @ h + br + rr))
                    if lbr:
                        hh = f(cl(Wh @ x + r * (Rh @ h + rh) + bh), 1)
                    else:
                        hh = f(cl(Wh @ x + Rh @ (r * h) + rh + bh), 1)
                    h = (1 - z) * hh + z * h
                else:
                    Wi, Wo, Wf, Wc = np.split(W[d], 4)
                    Ri, Ro, Rf, Rc = np.split(R[d], 4)
                    bi, bo, bf, bc = np.split(Wb + Rb, 4)
                    pi, po, pf = np.split(np.zeros(3 * H) if P is None else P[d].astype(np.float64), 3)
                    i = f(cl(Wi @ x + Ri @ h + bi + pi * c))
                    fg = 1 - i if input_forget else f(cl(Wf @ x + Rf @ h + bf + pf * c))
                    c = fg * c + i * f(cl(Wc @ x + Rc @ h + bc), 1)
                    o = f(cl(Wo @ x + Ro @ h + bo + po * c))
                    h = o * f(c, 2)
                Y[t, d, b] = h
            if n:
                Yh[d, b], Yc[d, b] = h, c
    return Y, Yh, Yc


def make(rng, op, T=5, B=3, I=4, H=6, D=1, dtype=np.float32, with_b=True, with_p=True):
    g = G[op]
    X = rng.standard_normal((T, B, I)).astype(dtype)
    W = (rng.standard_normal((D, g * H, I)) * 0.6).astype(dtype)
    R = (rng.standard_normal((D, g * H, H)) * 0.6).astype(dtype)
    Bb = rng.standard_normal((D, 2 * g * H)).astype(dtype) if with_b else None
    h0 = rng.standard_normal((D, B, H)).astype(dtype)
    c0 = rng.standard_normal((D, B, H)).astype(dtype) if op == "LSTM" else None
    P = rng.standard_normal((D, 3 * H)).astype(dtype) if op == "LSTM" and with_p else None
    return X, W, R, Bb, h0, c0, P


def call(op, X, W, R, Bb=None, lens=None, h0=None, c0=None, P=None, **kw):
    if op == "LSTM":
        res = FN[op](X, W, R, Bb, lens, h0, c0, P, **kw)
    else:
        res = FN[op](X, W, R, Bb, lens, h0, **kw)
    return [r.numpy() for r in res]


def ort_run(op, inputs, attrs, nout):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    vi = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(names, inputs)
        if n
    ]
    outs = [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, None) for k in range(nout)]
    node = helper.make_node(op, names, [f"o{k}" for k in range(nout)], **attrs)
    model = helper.make_model(helper.make_graph([node], "g", vi, outs), opset_imports=[helper.make_opsetid("", 22)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in zip(names, inputs) if n})


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_matches_oracle_with_lengths_and_states(rng, op, direction):
    D = 2 if direction == "bidirectional" else 1
    X, W, R, Bb, h0, c0, P = make(rng, op, T=6, B=4, I=5, H=7, D=D)
    lens = np.array([6, 2, 0, 5], np.int32)
    got = call(op, X, W, R, Bb, lens, h0, c0, P, direction=direction)
    want = oracle(op, X, W, R, Bb, lens, h0, c0, P, direction=direction)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert np.all(got[0][2:, :, 1] == 0) and np.all(got[0][:, :, 2] == 0)  # padding stays zero
    assert np.all(got[1][:, 2] == 0)  # zero-length sequence -> zero state (onnxruntime's convention)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_matches_onnxruntime(rng, op, direction):
    D = 2 if direction == "bidirectional" else 1
    X, W, R, Bb, h0, c0, P = make(rng, op, T=7, B=3, I=4, H=5, D=D)
    lens = np.array([7, 1, 4], np.int32)
    inputs = [X, W, R, Bb, lens, h0] + ([c0, P] if op == "LSTM" else [])
    attrs = {"direction": direction, "hidden_size": 5, "clip": 2.5}
    got = opsnn.ops.run_op(op, inputs, attrs, num_outputs=NOUT[op])
    want = ort_run(op, inputs, attrs, NOUT[op])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


ACTS = {"RNN": ["LeakyRelu"], "GRU": ["HardSigmoid", "Elu"], "LSTM": ["HardSigmoid", "ScaledTanh", "Affine"]}


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_custom_activations_consume_alpha_beta_in_order(rng, op):
    X, W, R, Bb, h0, c0, P = make(rng, op, D=2)
    names = ACTS[op] * 2
    alpha, beta = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    attrs = {
        "direction": "bidirectional",
        "hidden_size": 6,
        "activations": names,
        "activation_alpha": alpha,
        "activation_beta": beta,
    }
    inputs = [X, W, R, Bb, None, h0] + ([c0, P] if op == "LSTM" else [])
    got = opsnn.ops.run_op(op, inputs, attrs, num_outputs=NOUT[op])
    # alphas go to the activations that take one, betas likewise, in list order
    ia, ib, acts = iter(alpha), iter(beta), []
    for n in names:
        n = n.lower()
        a = next(ia) if n in ("leakyrelu", "hardsigmoid", "elu", "scaledtanh", "affine") else 0
        b = next(ib) if n in ("hardsigmoid", "scaledtanh", "affine") else 0
        acts.append((n, a, b))
    k = len(ACTS[op])
    want = oracle(op, X, W, R, Bb, None, h0, c0, P, direction="bidirectional", acts=[acts[:k], acts[k:]])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)
    ort = ort_run(op, inputs, attrs, NOUT[op])
    for g, w in zip(got, ort):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["Relu", "Sigmoid", "Softsign", "Softplus", "ThresholdedRelu"])
def test_other_activations(rng, name):
    X, W, R, Bb, h0, _, _ = make(rng, "RNN")
    got = call("RNN", X, W, R, Bb, None, h0, activations=[name], activation_alpha=[0.2])
    a = 0.2 if name == "ThresholdedRelu" else 0
    want = oracle("RNN", X, W, R, Bb, None, h0, acts=[[(name.lower(), a, 0)]])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_gru_linear_before_reset_and_lstm_input_forget(rng):
    X, W, R, Bb, h0, _, _ = make(rng, "GRU", D=2)
    got = call("GRU", X, W, R, Bb, None, h0, direction="bidirectional", linear_before_reset=1, clip=1.0)
    want = oracle("GRU", X, W, R, Bb, None, h0, direction="bidirectional", lbr=1, clip=1.0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    X, W, R, Bb, h0, c0, P = make(rng, "LSTM")
    got = call("LSTM", X, W, R, Bb, None, h0, c0, P, input_forget=1, clip=0.7)
    want = oracle("LSTM", X, W, R, Bb, None, h0, c0, P, input_forget=1, clip=0.7)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    ort = ort_run("LSTM", [X, W, R, Bb, None, h0, c0, P], {"hidden_size": 6, "input_forget": 1, "clip": 0.7}, 3)
    for g, w in zip(got, ort):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_is_batch_first(rng, op):
    X, W, R, Bb, h0, c0, P = make(rng, op, D=2)
    lens = np.array([5, 3, 1], np.int32)
    t = lambda a: None if a is None else np.ascontiguousarray(a.swapaxes(0, 1))  # noqa: E731
    got = call(op, t(X), W, R, Bb, lens, t(h0), t(c0), P, direction="bidirectional", layout=1)
    want = call(op, X, W, R, Bb, lens, h0, c0, P, direction="bidirectional")
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w.swapaxes(0, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_onnx_reference_evaluator_layout1(rng, op):
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    X, W, R, Bb, _, _, _ = make(rng, op, T=4, B=2, I=3, H=5)
    Xb = np.ascontiguousarray(X.swapaxes(0, 1))
    node = helper.make_node(op, ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=5, layout=1)
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in zip("XWRB", (Xb, W, R, Bb))]
    graph = helper.make_graph(
        [node], "g", vi, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")]
    )
    ref = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]))
    want = ref.run(None, {"X": Xb, "W": W, "R": R, "B": Bb})
    got = opsnn.ops.run_op(op, [Xb, W, R, Bb], {"layout": 1}, num_outputs=2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 1e-2), (ml_dtypes.bfloat16, 4e-2), (np.float64, 1e-12)])
def test_dtypes(rng, dtype, tol):
    X, W, R, Bb, h0, c0, P = make(rng, "LSTM", D=2)
    cast = lambda a: a.astype(dtype)  # noqa: E731
    got = call("LSTM", *map(cast, (X, W, R, Bb)), None, *map(cast, (h0, c0, P)), direction="bidirectional")
    want = oracle(
        "LSTM",
        *(cast(a).astype(np.float64) for a in (X, W, R, Bb)),
        None,
        *(cast(a).astype(np.float64) for a in (h0, c0, P)),
        direction="bidirectional",
    )
    for g, w in zip(got, want):
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol, atol=tol)


def test_non_contiguous_inputs_and_kernel_choice(rng, no_leak):
    X, W, R, Bb, h0, _, _ = make(rng, "GRU", T=4, B=3)
    xt = opsnn.from_numpy(np.ascontiguousarray(X.transpose(1, 0, 2))).transpose(0, 1)  # (T, B, I) view
    assert not xt.is_contiguous()
    ex = opsnn.aclnn.gru.prepare(xt, W, R, Bb, None, h0)
    assert ex.kernel_name == "gru_blas" and ex.workspace_size > 0
    got = ex.run()
    want = oracle("GRU", X, W, R, Bb, None, h0)
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-5)
    ref = opsnn.ops.gru(xt, W, R, Bb, None, h0, algo="reference")
    np.testing.assert_allclose(ref[1].numpy(), want[1], rtol=1e-5, atol=1e-5)
    del ex, got, ref


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_reference_kernel_agrees(rng, op):
    X, W, R, Bb, h0, c0, P = make(rng, op, D=2)
    lens = np.array([5, 0, 3], np.int32)
    fast = call(op, X, W, R, Bb, lens, h0, c0, P, direction="bidirectional", clip=3.0)
    slow = [
        r.numpy()
        for r in (
            FN[op](
                X,
                W,
                R,
                Bb,
                lens,
                h0,
                *(([c0, P]) if op == "LSTM" else []),
                direction="bidirectional",
                clip=3.0,
                algo="reference",
            )
        )
    ]
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f, s, rtol=1e-5, atol=1e-5)


def test_empty_and_defaults(rng):
    X, W, R, _, _, _, _ = make(rng, "LSTM", T=0, B=2)
    y, yh, yc = call("LSTM", X, W, R)
    assert y.shape == (0, 1, 2, 6) and np.all(yh == 0) and np.all(yc == 0)
    X, W, R, _, _, _, _ = make(rng, "RNN", B=0)
    y, yh = call("RNN", X, W, R)
    assert y.shape == (5, 1, 0, 6) and yh.shape == (1, 0, 6)
    # only Y requested
    X, W, R, Bb, _, _, _ = make(rng, "GRU")
    (y,) = opsnn.ops.run_op("GRU", [X, W, R, Bb], {}, num_outputs=1)
    np.testing.assert_allclose(y.numpy(), oracle("GRU", X, W, R, Bb)[0], rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise_typed_errors(rng):
    X, W, R, Bb, h0, _, _ = make(rng, "GRU")
    with pytest.raises(InferShapeError, match="'W'"):
        opsnn.ops.gru(X, W[:, :-1], R)
    with pytest.raises(InferShapeError, match="hidden_size"):
        opsnn.ops.gru(X, W, R, hidden_size=9)
    with pytest.raises(ParamInvalidError, match="direction"):
        opsnn.ops.gru(X, W, R, direction="sideways")
    with pytest.raises(InferShapeError, match="W"):  # bidirectional needs 2 weight sets
        opsnn.ops.gru(X, W, R, direction="bidirectional")
    with pytest.raises(ParamInvalidError, match="activation"):
        opsnn.ops.gru(X, W, R, activations=["Sigmoid", "Gelu"])
    with pytest.raises(ParamInvalidError, match="activations"):
        opsnn.ops.gru(X, W, R, activations=["Sigmoid"])
    with pytest.raises(InferShapeError, match="initial_h"):
        opsnn.ops.gru(X, W, R, Bb, None, h0[:, :2])
    with pytest.raises(opsnn.errors.DTypeError):
        opsnn.ops.gru(X, W, R, Bb, np.array([1, 2, 3], np.float32))
    with pytest.raises(ParamInvalidError, match="clip"):
        opsnn.ops.gru(X, W, R, clip=-1.0)
    with pytest.raises(OpsnnError, match="sequence_lens"):
        y, _ = opsnn.ops.gru(X, W, R, Bb, np.array([1, 9, 2], np.int32))
        y.numpy()
        opsnn.current_stream().synchronize()
