"""Signal ops: DFT (opset-20 form), STFT and MelWeightMatrix — records, kernels and
functional entry points.

The DFT and STFT kernels call ``numpy.fft`` (pocketfft, O(n log n)) in the input's precision
(complex64 for float32, complex128 for float64; 16-bit inputs run as float32): FFTs are
rarely hot in the models opsnn runs, and pocketfft is a well-kept implementation.
The references are direct O(n^2) DFT sums, independent of any FFT. Complex values travel as
a trailing dim of 2 (real, imaginary), real ones as a trailing dim of 1, as in ONNX::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([[1.0], [0.0], [0.0], [0.0]], np.float32))   # an impulse
    >>> opsnn.ops.dft(x, dim=0).numpy()[:, 0]                                     # real parts
    array([1., 1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .elementwise import onnx_dtype, onnx_enum

FLOAT = _dt.FLOATS
_F32_64 = (_dt.float32, _dt.float64)
_INDEX = (_dt.int32, _dt.int64)


def _flag(op: str, name: str, v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) not in (0, 1):
        raise ParamInvalidError(f"{op}: attribute {name!r} must be 0 or 1, got {v!r}", op=op)
    return bool(v)


def _host_int(ctx, i: int, op: str, name: str) -> int | None:
    """The scalar value of host input ``i`` (None when absent)."""
    if not ctx.has(i):
        return None
    v = ctx.value(i)
    if v is None:
        ctx.fail(f"input {name!r} must be known at prepare time (a constant or host tensor)")
    a = np.asarray(v)
    if a.size != 1:
        raise ParamInvalidError(f"{op}: input {name!r} must be a scalar, got shape {a.shape}", op=op)
    return int(a.reshape(-1)[0])


def _as_complex(x: np.ndarray, ctype=np.complex128) -> np.ndarray:
    """(..., 1 | 2) real/complex layout -> complex array (``ctype``) without the last dim."""
    z = np.empty(x.shape[:-1], ctype)
    z.real = x[..., 0]
    z.imag = x[..., 1] if x.shape[-1] == 2 else 0
    return z


def _ctype(dtype: np.dtype):
    """FFTs run in the input's precision: complex64 for float32, complex128 for float64."""
    return np.complex64 if dtype == _dt.float32 else np.complex128


def _store(out: np.ndarray, z: np.ndarray) -> None:
    """complex (or real) ``z`` -> ``out`` of layout (..., 1 | 2)."""
    if out.shape[-1] == 1:
        np.copyto(out[..., 0], np.real(z), casting="unsafe")
    else:
        np.copyto(out[..., 0], np.real(z), casting="unsafe")
        np.copyto(out[..., 1], np.imag(z), casting="unsafe")


# == DFT =========================================================================================
def _dft_geometry(ctx):
    """(axis, n, inverse, onesided) of a DFT node; validates shapes and attributes."""
    op = "DFT"
    s = tuple(ctx.shape(0))
    inverse = _flag(op, "inverse", ctx.attrs["inverse"])
    onesided = _flag(op, "onesided", ctx.attrs["onesided"])
    if len(s) < 2 or s[-1] not in (1, 2):
        ctx.fail(f"input must have rank >= 2 with a last dim of 1 (real) or 2 (complex), got shape {s}")
    r = len(s)
    axis = _host_int(ctx, 2, op, "axis")
    axis = -2 if axis is None else axis
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ParamInvalidError(
            f"{op}: 'axis' must be in [{-r}, -2] or [0, {r - 2}] for a rank-{r} input (the last "
            f"dim holds real/imaginary parts), got {axis}",
            op=op,
        )
    axis %= r
    n = _host_int(ctx, 1, op, "dft_length")
    if n is None:
        n = 2 * (s[axis] - 1) if inverse and onesided else s[axis]
    if n < 1:
        raise ParamInvalidError(
            f"{op}: the DFT length must be >= 1, got {n} (dft_length input or the size of axis {axis})", op=op
        )
    if onesided and not inverse and s[-1] != 1:
        raise ParamInvalidError(
            f"{op}: onesided=1 with inverse=0 (RFFT) needs a real input (last dim 1), got shape {s}", op=op
        )
    if onesided and inverse and s[-1] != 2:
        raise ParamInvalidError(
            f"{op}: onesided=1 with inverse=1 (IRFFT) needs a complex input (last dim 2), got shape {s}", op=op
        )
    return axis, n, inverse, onesided


def _dft_infer(ctx):
    axis, n, inverse, onesided = _dft_geometry(ctx)
    s = list(ctx.shape(0))
    s[axis] = n // 2 + 1 if onesided and not inverse else n
    s[-1] = 1 if onesided and inverse else 2
    return [TensorMeta(tuple(s), ctx.dtype(0))]


def _dft_sum(z: np.ndarray, axis: int, n_out: int, n: int, inverse: bool) -> np.ndarray:
    """Direct DFT along ``axis``: out[k] = sum_t z[t] exp(-+2 pi i k t / n) over t < min(len, n),
    for k < n_out (divided by n when inverse)."""
    m = min(z.shape[axis], n)
    zt = np.moveaxis(np.take(z, np.arange(m), axis=axis), axis, -1)
    k = np.arange(n_out)[:, None]
    t = np.arange(m)[None, :]
    sign = 1.0 if inverse else -1.0
    w = np.exp(sign * 2j * np.pi * ((k * t) % n) / n)  # exact phase reduction before the exp
    out = zt @ w.T
    if inverse:
        out = out / n
    return np.moveaxis(out, -1, axis)


def _dft_reference(ins, attrs):
    x = ins[0]
    r = x.ndim
    axis = -2 if len(ins) < 3 or ins[2] is None else int(np.asarray(ins[2]).reshape(-1)[0])
    axis %= r
    inverse, onesided = bool(attrs["inverse"]), bool(attrs["onesided"])
    sig = axis  # axis index of the signal array (the complex dim is dropped, leading dims stay)
    if len(ins) > 1 and ins[1] is not None:
        n = int(np.asarray(ins[1]).reshape(-1)[0])
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    z = _as_complex(x)
    if not inverse:
        res = _dft_sum(z, sig, n // 2 + 1 if onesided else n, n, False)
        out = np.stack([res.real, res.imag], axis=-1)
    elif not onesided:
        res = _dft_sum(z, sig, n, n, True)
        out = np.stack([res.real, res.imag], axis=-1)
    else:
        # IRFFT: extend the half spectrum Hermitian-symmetrically, inverse DFT, keep the real part
        half = n // 2 + 1
        m = min(z.shape[sig], half)
        zh = np.moveaxis(z, sig, -1)[..., :m]
        full = np.zeros(zh.shape[:-1] + (n,), np.complex128)
        full[..., :m] = zh
        for k in range(half, n):
            if n - k < m:
                full[..., k] = np.conj(zh[..., n - k])
        res = _dft_sum(np.moveaxis(full, -1, sig), sig, n, n, True)
        out = res.real[..., None]
    return out.astype(x.dtype)


def _dft_kernel(ins, outs, attrs, plan, ws):
    axis, n, inverse, onesided = plan
    out = outs[0]
    if out.size == 0:
        return
    z = _as_complex(ins[0], _ctype(ins[0].dtype))
    if not inverse:
        res = np.fft.rfft(z.real, n, axis=axis) if onesided else np.fft.fft(z, n, axis=axis)
    elif onesided:
        res = np.fft.irfft(z, n, axis=axis)
    else:
        res = np.fft.ifft(z, n, axis=axis)
    _store(out, res)


DFT = register_op(
    "DFT",
    category="signal",
    inputs=[
        Input("input", FLOAT),
        Input("dft_length", _INDEX, optional=True, host=True),
        Input("axis", (_dt.int64,), optional=True, host=True),
    ],
    outputs=["output"],
    attrs=[Attr("inverse", "int", 0), Attr("onesided", "int", 0)],
    infer=_dft_infer,
    reference=_dft_reference,
    doc="discrete Fourier transform along one axis (forward/inverse, full or one-sided)",
)
DFT.kernel(
    "dft_pocketfft",
    dtypes=_F32_64,
    priority=5,
    plan=_dft_geometry,
    doc="numpy.fft (pocketfft) in the input's precision",
)(_dft_kernel)


# == STFT ========================================================================================
def _stft_geometry(ctx):
    """(frame_step, frame_length, frames, onesided)."""
    op = "STFT"
    s = tuple(ctx.shape(0))
    if len(s) != 3 or s[-1] not in (1, 2):
        ctx.fail(f"input 'signal' must have shape (batch, length, 1 | 2), got {s}")
    onesided = _flag(op, "onesided", ctx.attrs["onesided"])
    step = _host_int(ctx, 1, op, "frame_step")
    if step is None or step < 1:
        raise ParamInvalidError(f"{op}: 'frame_step' must be >= 1, got {step}", op=op)
    fl = _host_int(ctx, 3, op, "frame_length")
    if ctx.has(2):
        ws = tuple(ctx.shape(2))
        if len(ws) != 1:
            ctx.fail(f"input 'window' must be 1-D, got shape {ws}")
        if ctx.dtype(2) != ctx.dtype(0):
            raise DTypeError(
                f"{op}: 'window' has dtype {_dt.name(ctx.dtype(2))}; expected the dtype of 'signal' "
                f"({_dt.name(ctx.dtype(0))})",
                op=op,
            )
        if fl is not None and fl != ws[0]:
            raise ParamInvalidError(f"{op}: 'frame_length' ({fl}) must equal the window length ({ws[0]})", op=op)
        fl = ws[0]
    if fl is None:
        fl = s[1]
    if fl < 1 or fl > s[1]:
        raise ParamInvalidError(f"{op}: frame length {fl} must be in [1, signal length {s[1]}]", op=op)
    if onesided and s[-1] == 2:
        raise ParamInvalidError(
            f"{op}: onesided=1 needs a real signal (last dim 1); set onesided=0 for complex input", op=op
        )
    return step, fl, (s[1] - fl) // step + 1, onesided


def _stft_infer(ctx):
    step, fl, frames, onesided = _stft_geometry(ctx)
    return [TensorMeta((ctx.shape(0)[0], frames, fl // 2 + 1 if onesided else fl, 2), ctx.dtype(0))]


def _stft_args(ins):
    step = int(np.asarray(ins[1]).reshape(-1)[0])
    window = ins[2] if len(ins) > 2 else None
    fl = (
        int(np.asarray(ins[3]).reshape(-1)[0])
        if len(ins) > 3 and ins[3] is not None
        else (window.shape[0] if window is not None else ins[0].shape[1])
    )
    w = np.ones(fl) if window is None else window.astype(np.float64)
    return step, fl, w


def _stft_reference(ins, attrs):
    x = ins[0]
    step, fl, w = _stft_args(ins)
    onesided = bool(attrs["onesided"])
    z = _as_complex(x)
    frames = (x.shape[1] - fl) // step + 1
    bins = fl // 2 + 1 if onesided else fl
    out = np.zeros((x.shape[0], frames, bins, 2))
    for f in range(frames):
        seg = z[:, f * step : f * step + fl] * w
        res = _dft_sum(seg, 1, bins, fl, False)
        out[:, f, :, 0], out[:, f, :, 1] = res.real, res.imag
    return out.astype(x.dtype)


def _stft_kernel(ins, outs, attrs, plan, ws):
    step, fl, frames, onesided = plan
    if outs[0].size == 0:
        return
    _, _, w = _stft_args(ins)
    z = _as_complex(ins[0], _ctype(ins[0].dtype))
    w = w.astype(z.real.dtype)
    seg = np.lib.stride_tricks.sliding_window_view(z, fl, axis=1)[:, ::step][:, :frames] * w
    res = np.fft.rfft(seg.real, fl, axis=-1) if onesided else np.fft.fft(seg, fl, axis=-1)
    _store(outs[0], res)


STFT = register_op(
    "STFT",
    category="signal",
    inputs=[
        Input("signal", FLOAT),
        Input("frame_step", _INDEX, host=True),
        Input("window", FLOAT, optional=True),
        Input("frame_length", _INDEX, optional=True, host=True),
    ],
    outputs=["output"],
    attrs=[Attr("onesided", "int", 1)],
    infer=_stft_infer,
    reference=_stft_reference,
    doc="short-time Fourier transform: windowed DFTs of frames taken every frame_step samples",
)
STFT.kernel(
    "stft_pocketfft",
    dtypes=_F32_64,
    priority=5,
    plan=_stft_geometry,
    doc="strided frame view x window, numpy.fft (pocketfft) per frame",
)(_stft_kernel)


# == MelWeightMatrix ==============================================================================
def _mel_values(ins_or_ctx, from_ctx: bool):
    op = "MelWeightMatrix"
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    vals = []
    for i, name in enumerate(names):
        v = ins_or_ctx.value(i) if from_ctx else ins_or_ctx[i]
        if v is None:
            ins_or_ctx.fail(f"input {name!r} must be known at prepare time (a constant or host tensor)")
        a = np.asarray(v)
        if a.size != 1:
            raise ParamInvalidError(f"{op}: input {name!r} must be a scalar, got shape {a.shape}", op=op)
        vals.append(a.reshape(-1)[0])
    bins, n, sr = (int(v) for v in vals[:3])
    lo, hi = float(vals[3]), float(vals[4])
    if bins < 1 or n < 1 or sr < 1:
        raise ParamInvalidError(
            f"{op}: num_mel_bins, dft_length and sample_rate must be >= 1, got {bins}, {n}, {sr}", op=op
        )
    if not (0 <= lo < hi):
        raise ParamInvalidError(f"{op}: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}", op=op)
    return bins, n, sr, lo, hi


def _mel_edges(bins, n, sr, lo, hi) -> np.ndarray:
    """Spectrogram bin of each of the bins + 2 triangle edges (ONNX's formula: mel(f) =
    2595 log10(1 + f / 700), the [lo, hi] mel range split into bins + 2 steps)."""
    lo_mel = 2595 * np.log1p(lo / 700) / np.log(10)
    hi_mel = 2595 * np.log1p(hi / 700) / np.log(10)
    step = (hi_mel - lo_mel) / (bins + 2)
    hz = 700 * np.expm1((np.arange(bins + 2) * step + lo_mel) / 2595 * np.log(10))
    edges = np.floor((n + 1) * hz / sr).astype(np.int64)
    if edges[-1] > n // 2:
        raise ParamInvalidError(
            f"MelWeightMatrix: upper_edge_hertz {hi} maps to spectrogram bin {int(edges[-1])}, "
            f"beyond the {n // 2 + 1} bins of a {n}-point DFT (keep it <= sample_rate / 2)",
            op="MelWeightMatrix",
        )
    return edges


def _mel_dtype(attrs) -> np.dtype:
    dt = onnx_dtype(attrs["output_datatype"])
    if dt not in FLOAT + _dt.INTEGERS:
        raise DTypeError(
            f"MelWeightMatrix: 'output_datatype' must be a float or integer type, got {_dt.name(dt)}",
            op="MelWeightMatrix",
        )
    return dt


def _mel_infer(ctx):
    bins, n, sr, lo, hi = _mel_values(ctx, True)
    _mel_edges(bins, n, sr, lo, hi)
    return [TensorMeta((n // 2 + 1, bins), _mel_dtype(ctx.attrs))]


def _mel_reference(ins, attrs):
    bins, n, sr, lo, hi = _mel_values(ins, False)
    e = _mel_edges(bins, n, sr, lo, hi)
    out = np.zeros((n // 2 + 1, bins))
    for i in range(bins):
        left, center, right = int(e[i]), int(e[i + 1]), int(e[i + 2])
        if center == left:
            out[center, i] = 1.0
        for j in range(left, center + 1):
            if center > left:
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out.astype(_mel_dtype(attrs))


def _mel_kernel(ins, outs, attrs, plan, ws):
    # column by column into the output: a broadcast expression over the whole (rows, bins) grid built
    # ~6 float64 temporaries of the output's size outside the pool (and its cap)
    out = outs[0]
    out[...] = 0
    for i in range(out.shape[1]):
        left, center, right = int(plan[i]), int(plan[i + 1]), int(plan[i + 2])
        j = np.arange(left, max(center, right - 1) + 1, dtype=np.float64)
        rise = (j - left) / (center - left) if center > left else np.ones_like(j)
        fall = (right - j) / max(right - center, 1)
        out[left : left + j.size, i] = np.where(j <= center, rise, fall)


MelWeightMatrix = register_op(
    "MelWeightMatrix",
    category="signal",
    inputs=[
        Input("num_mel_bins", _INDEX, host=True),
        Input("dft_length", _INDEX, host=True),
        Input("sample_rate", _INDEX, host=True),
        Input("lower_edge_hertz", FLOAT, host=True),
        Input("upper_edge_hertz", FLOAT, host=True),
    ],
    outputs=["output"],
    attrs=[Attr("output_datatype", "int", 1)],
    infer=_mel_infer,
    reference=_mel_reference,
    doc="triangular mel filterbank, shape (dft_length // 2 + 1, num_mel_bins)",
)
MelWeightMatrix.kernel(
    "mel_weight_numpy",
    priority=5,
    plan=lambda ctx: _mel_edges(*_mel_values(ctx, True)),
    doc="the triangles, one column at a time (temporaries of one column's support)",
)(_mel_kernel)


# == functional entry points =========================================================================
@api("dft", "DFT")
def dft(x, n=None, dim=-2, inverse=False, onesided=False):
    """ONNX DFT of ``x`` (..., 1 | 2) along ``dim`` (not the last, real/imaginary dim); ``n``
    pads or trims the signal."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise ParamInvalidError(f"dft: dim must be an int, got {dim!r}")
    length = None if n is None else np.asarray(int(n), np.int64)
    return [x, length, np.asarray(int(dim), np.int64)], {"inverse": int(bool(inverse)), "onesided": int(bool(onesided))}


@api("stft", "STFT")
def stft(signal, frame_step, window=None, frame_length=None, onesided=True):
    """Short-time Fourier transform of ``signal`` (batch, length, 1 | 2) -> (batch, frames, bins, 2)."""
    fl = None if frame_length is None else np.asarray(int(frame_length), np.int64)
    return [signal, np.asarray(int(frame_step), np.int64), window, fl], {"onesided": int(bool(onesided))}


@api("mel_weight_matrix", "MelWeightMatrix")
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, dtype="float32"):
    """Triangular mel filterbank of shape (dft_length // 2 + 1, num_mel_bins)."""
    ints = [np.asarray(int(v), np.int64) for v in (num_mel_bins, dft_length, sample_rate)]
    floats = [np.asarray(float(v), np.float32) for v in (lower_edge_hertz, upper_edge_hertz)]
    return ints + floats, {"output_datatype": onnx_enum(dtype)}


__all__ = ["dft", "stft", "mel_weight_matrix"]
