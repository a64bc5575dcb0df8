"""Signal ops (DFT, STFT, MelWeightMatrix) against independent oracles: numpy.fft in
complex128, onnx.reference.ReferenceEvaluator, and a mel filterbank written out here.

Tolerances: the float32 kernel runs pocketfft in single precision, so float32 results are
compared with atol = 1e-5 * (sum of |x| along the axis) + rtol 1e-5; float64 1e-10; the
direct-sum references (O(n^2) in float64) 1e-9 relative to the signal's magnitude; 16-bit
inputs against float32 on the same values with rtol/atol 2e-2 (scaled by the signal size).
"""

import importlib
import warnings

import ml_dtypes
import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

S = importlib.import_module("opsnn.ops.defs.signal")
BF16 = np.dtype(ml_dtypes.bfloat16)


def onnx_ref(op_type, inputs, opset, **attrs):
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
        if a is not None
    ]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, {n: a for n, a in zip(names, inputs) if a is not None})[0]


def _pack(z):
    return np.stack([z.real, z.imag], axis=-1)


def _close(got, want, x, rtol=1e-5, scale=1e-5):
    atol = scale * max(1.0, float(np.abs(x).sum()))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# == DFT ==========================================================================================
@pytest.mark.parametrize("n", [None, 7, 16])
@pytest.mark.parametrize("axis", [0, 1, -2])
def test_dft_forward_inverse_against_numpy_fft(rng, no_leak, n, axis):
    xr = rng.standard_normal((5, 12, 3, 1))
    xc = rng.standard_normal((5, 12, 3, 2))
    ax = axis % 4
    for x, complex_in in ((xr, False), (xc, True)):
        z = x[..., 0] + (1j * x[..., 1] if complex_in else 0)
        for inverse in (False, True):
            fn = np.fft.ifft if inverse else np.fft.fft
            want = _pack(fn(z, n, axis=ax))
            for dt, tol in ((np.float64, 1e-10), (np.float32, None)):
                xt = x.astype(dt)
                ex = aclnn.dft.prepare(opsnn.tensor(xt), n=n, dim=axis, inverse=inverse)
                assert ex.kernel_name == "dft_pocketfft"
                got = ex.run().numpy()
                assert got.dtype == dt and got.shape == want.shape
                if tol:
                    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
                else:
                    _close(got, want, x)
            ref = S.dft(opsnn.tensor(x), n=n, dim=axis, inverse=inverse, algo="reference").numpy()
            np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-9 * np.abs(x).sum())


@pytest.mark.parametrize("n", [None, 9, 10, 20])
def test_dft_onesided_rfft_irfft(rng, no_leak, n):
    x = rng.standard_normal((3, 10, 1))
    want = _pack(np.fft.rfft(x[..., 0], n, axis=1))
    got = S.dft(opsnn.tensor(x), n=n, dim=1, onesided=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        S.dft(opsnn.tensor(x), n=n, dim=1, onesided=True, algo="reference").numpy(), want, rtol=1e-9, atol=1e-9
    )
    spec = rng.standard_normal((3, 6, 2))
    z = spec[..., 0] + 1j * spec[..., 1]
    want = np.fft.irfft(z, n, axis=1)[..., None]
    got = S.dft(opsnn.tensor(spec), n=n, dim=1, inverse=True, onesided=True).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    ref = S.dft(opsnn.tensor(spec), n=n, dim=1, inverse=True, onesided=True, algo="reference").numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-9)


def test_dft_matches_onnx_reference_and_opset17_form(rng, no_leak):
    x = rng.standard_normal((2, 8, 4, 1)).astype(np.float32)
    want = onnx_ref("DFT", [x, None, np.array(2, np.int64)], 20)
    got = opsnn.ops.run_op("DFT", [x, None, np.array(2, np.int64)])[0].numpy()
    _close(got, want, x)
    # DFT-17 kept axis as an attribute (default 1); the ONNX importer moves it to the input
    want17 = onnx_ref("DFT", [x], 17, axis=1, onesided=1)
    import onnx

    node = helper.make_node("DFT", ["x"], ["y"], axis=1, onesided=1)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    from opsnn.onnx import backend

    _close(backend.prepare(model).run([x])[0], want17, x)


def test_dft_noncontiguous_empty_16bit(rng, no_leak):
    x = rng.standard_normal((6, 4, 2)).astype(np.float32)
    xt = x.transpose(1, 0, 2)
    want = _pack(np.fft.fft(xt[..., 0] + 1j * xt[..., 1], axis=1))
    _close(S.dft(opsnn.from_numpy(xt), dim=1).numpy(), want, x)
    empty = S.dft(opsnn.tensor(np.zeros((0, 5, 1), np.float32)), dim=1).numpy()
    assert empty.shape == (0, 5, 2)
    for dt in (np.float16, BF16):
        h = x.astype(dt)
        got = S.dft(opsnn.tensor(h), dim=0).numpy()
        assert got.dtype == dt
        want = S.dft(opsnn.tensor(h.astype(np.float32)), dim=0).numpy()
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2 * 6)
    nan = x.copy()
    nan[2, 1, 0] = np.nan
    got = S.dft(opsnn.tensor(nan), dim=0).numpy()
    assert np.isnan(got[:, 1, 0]).all() and np.isfinite(got[:, 0]).all()  # NaN spreads over its column only


def test_dft_errors(no_leak):
    x = opsnn.tensor(np.zeros((4, 3, 2), np.float32))
    with pytest.raises(ParamInvalidError, match="axis"):
        S.dft(x, dim=2)  # the real/imaginary dim
    with pytest.raises(ParamInvalidError, match="axis"):
        S.dft(x, dim=-1)
    with pytest.raises(ParamInvalidError, match="length"):
        S.dft(x, n=0, dim=0)
    with pytest.raises(ParamInvalidError, match="real"):
        S.dft(x, dim=0, onesided=True)  # RFFT of a complex input
    with pytest.raises(ParamInvalidError, match="complex"):
        S.dft(opsnn.tensor(np.zeros((4, 1), np.float32)), dim=0, inverse=True, onesided=True)
    with pytest.raises(InferShapeError, match="last dim"):
        S.dft(opsnn.tensor(np.zeros((4, 3), np.float32)), dim=0)
    with pytest.raises(ParamInvalidError, match="inverse"):
        opsnn.ops.run_op("DFT", [np.zeros((4, 1), np.float32)], {"inverse": 2})
    with pytest.raises(DTypeError):
        opsnn.ops.run_op("DFT", [np.zeros((4, 1), np.int32)])


# == STFT =========================================================================================
@pytest.mark.parametrize("onesided", [True, False])
def test_stft_against_numpy_frames(rng, no_leak, onesided):
    x = rng.standard_normal((2, 64, 1))
    window = np.hanning(16)
    step = 5
    frames = (64 - 16) // step + 1
    segs = np.stack([x[:, f * step : f * step + 16, 0] * window for f in range(frames)], axis=1)
    want = _pack((np.fft.rfft if onesided else np.fft.fft)(segs, axis=-1))
    ex = aclnn.stft.prepare(opsnn.tensor(x), step, opsnn.tensor(window), onesided=onesided)
    assert ex.kernel_name == "stft_pocketfft"
    got = ex.run().numpy()
    assert got.shape == want.shape == (2, frames, 9 if onesided else 16, 2)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    ref = S.stft(opsnn.tensor(x), step, opsnn.tensor(window), onesided=onesided, algo="reference").numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-9)
    x32, w32 = x.astype(np.float32), window.astype(np.float32)
    want32 = onnx_ref("STFT", [x32, np.array(step, np.int64), w32], 17, onesided=int(onesided))
    _close(S.stft(opsnn.tensor(x32), step, opsnn.tensor(w32), onesided=onesided).numpy(), want32, x32[0, :16])


def test_stft_frame_length_complex_16bit_and_errors(rng, no_leak):
    x = rng.standard_normal((1, 40, 2)).astype(np.float32)
    z = x[..., 0] + 1j * x[..., 1]
    got = S.stft(opsnn.tensor(x), 8, frame_length=10, onesided=False).numpy()  # rectangular window
    want = _pack(np.fft.fft(np.stack([z[:, f * 8 : f * 8 + 10] for f in range(4)], axis=1), axis=-1))
    _close(got, want, x[0, :10])
    h = x[..., :1].astype(np.float16)
    got = S.stft(opsnn.tensor(h), 4, frame_length=8).numpy()
    assert got.dtype == np.float16
    want = S.stft(opsnn.tensor(h.astype(np.float32)), 4, frame_length=8).numpy()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2 * 8)
    sig = opsnn.tensor(np.zeros((1, 16, 1), np.float32))
    with pytest.raises(ParamInvalidError, match="frame_step"):
        S.stft(sig, 0)
    with pytest.raises(ParamInvalidError, match="frame length"):
        S.stft(sig, 1, frame_length=17)
    with pytest.raises(ParamInvalidError, match="window length"):
        S.stft(sig, 1, opsnn.tensor(np.ones(4, np.float32)), frame_length=5)
    with pytest.raises(ParamInvalidError, match="onesided"):
        S.stft(opsnn.tensor(np.zeros((1, 16, 2), np.float32)), 1, frame_length=4)
    with pytest.raises(DTypeError, match="window"):
        S.stft(sig, 1, opsnn.tensor(np.ones(4, np.float64)))
    with pytest.raises(InferShapeError, match="signal"):
        S.stft(opsnn.tensor(np.zeros((16, 1), np.float32)), 1)


# == MelWeightMatrix ================================================================================
def _mel_oracle(bins, n, sr, lo, hi):
    """The ONNX MelWeightMatrix definition written out: triangle edges on the mel scale."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    inv = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    step = (mel(hi) - mel(lo)) / (bins + 2)
    edges = [int(np.floor((n + 1) * inv(mel(lo) + k * step) / sr)) for k in range(bins + 2)]
    w = np.zeros((n // 2 + 1, bins))
    for i in range(bins):
        a, c, b = edges[i], edges[i + 1], edges[i + 2]
        for j in range(n // 2 + 1):
            if a <= j <= c:
                w[j, i] = 1.0 if c == a else (j - a) / (c - a)
            elif c < j < b:
                w[j, i] = (b - j) / (b - c)
    return w


@pytest.mark.parametrize(
    "args", [(8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 7600.0), (5, 33, 1000, 10.0, 450.0)]
)
def test_mel_weight_matrix(no_leak, args):
    bins, n, sr, lo, hi = args
    want = _mel_oracle(*args)
    ex = aclnn.mel_weight_matrix.prepare(*args)
    assert ex.kernel_name == "mel_weight_numpy"
    got = ex.run().numpy()
    assert got.dtype == np.float32 and got.shape == (n // 2 + 1, bins)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(S.mel_weight_matrix(*args, algo="reference").numpy(), want, rtol=1e-6, atol=1e-7)
    ins = [
        np.array(bins, np.int64),
        np.array(n, np.int64),
        np.array(sr, np.int64),
        np.array(lo, np.float32),
        np.array(hi, np.float32),
    ]
    np.testing.assert_allclose(got, onnx_ref("MelWeightMatrix", ins, 17), rtol=1e-6, atol=1e-7)
    assert S.mel_weight_matrix(*args, dtype="float64").numpy().dtype == np.float64


def test_mel_weight_matrix_errors(no_leak):
    with pytest.raises(ParamInvalidError, match="upper_edge_hertz"):
        S.mel_weight_matrix(8, 16, 8000, 0.0, 7000.0)  # above Nyquist
    with pytest.raises(ParamInvalidError, match="lower_edge_hertz"):
        S.mel_weight_matrix(8, 16, 8000, 300.0, 200.0)
    with pytest.raises(ParamInvalidError, match=">= 1"):
        S.mel_weight_matrix(0, 16, 8000, 0.0, 200.0)
    with pytest.raises(DTypeError):
        S.mel_weight_matrix(8, 16, 8000, 0.0, 200.0, dtype="bool")
