"""Fuzzing: hostile models, random op calls and long soaks, each case in a watched worker process.

Six kinds of case, each generated from a seed (or drawn by hypothesis) and judged strictly:
``onnx_mutate`` (ONNX files built here, then truncated, bit-flipped or edited: load, compile and run
give an opsnn error or onnx.reference's answer), ``op_schema`` (one registry op on inputs and
attributes drawn from its own schema: the op's numpy reference, or an opsnn error), ``graph``
(random chains of ops compiled: onnx.reference's answer; and registry ops drawn from their schemas as
one-node models: their reference), ``out_view`` (strided, transposed and
expanded ``out=`` views: written right or refused at prepare), ``nan_inf`` (every kernel of every
float op on inputs holding NaN and +-Inf: non-finite exactly where the reference has them) and
``soak`` (thousands of eager calls, some on fresh streams, and compiled runs: pool live bytes,
threads and RSS flat).
A case runs in a :class:`WorkerPool` process with a time limit; a crash or a hang is a failure of
that case, and the worker is restarted::

    $ opsnn fuzz --minutes 10 --out fuzz-out --kinds op_schema,nan_inf
    >>> from opsnn.tools.fuzz import WorkerPool
    >>> with WorkerPool(timeout=60) as pool:            # doctest: +SKIP
    ...     pool.run({"kind": "op_schema", "seed": 3})["status"]
    'ok'
"""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import ml_dtypes
import numpy as np

from .. import ops as ops_pkg
from ..graph.compiler import compile as compile_graph
from ..onnx import load as load_onnx
from ..ops.api import run_op
from ..runtime import Stream, memory
from ..runtime.context import context
from ..tensor import full, tensor

KINDS = ("onnx_mutate", "op_schema", "graph", "out_view", "nan_inf", "soak")
#: statuses a case can end with; the last three are failures. ``ill_conditioned``: opsnn and the reference differ
#: only where the reference itself moves past the tolerance when computed in float64 (rounded once or per op) or
#: on inputs 1 ulp away
OK, TYPED, SKIP, ILL, FAIL, CRASH, HANG = "ok", "typed-error", "skip", "ill_conditioned", "fail", "crash", "hang"
FAILED = (FAIL, CRASH, HANG)


# -- draws: one interface over a seeded RNG (the CLI, pinned seeds) and hypothesis (property tests) --------------
class RngDraw:
    """Choices from a seeded numpy Generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, seq):
        return seq[int(self.rng.integers(0, len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def array(self, shape, dtype) -> np.ndarray:
        return _fill(self.rng, shape, dtype)


class HypothesisDraw:
    """Choices drawn from hypothesis' ``st.data()``, so failures shrink; array contents come from
    a seed hypothesis draws (shrinking the seed is meaningless, shrinking shapes is not)."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        return seq[self.data.draw(self.st.integers(0, len(seq) - 1))]

    def chance(self, p: float) -> bool:
        return self.data.draw(self.st.integers(0, 999)) < int(p * 1000)

    def array(self, shape, dtype) -> np.ndarray:
        return _fill(np.random.default_rng(self.data.draw(self.st.integers(0, 2**32 - 1))), shape, dtype)


def _fill(rng, shape, dtype) -> np.ndarray:
    return np.asarray(_values(rng, shape, dtype))  # shape (): a 0-d array, not a numpy scalar


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        return rng.integers(lo, 6, size=shape).astype(dtype)
    if dtype.kind == "f" or dtype.name in ("bfloat16",):
        return (rng.standard_normal(shape) * 2).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "OUS":
        words = np.array(["a", "Bb", "ccc", "", "d e"], dtype=object)
        return words[rng.integers(0, len(words), size=shape)]
    return np.zeros(shape, dtype)


# -- op cases from the registry's schemas -------------------------------------------------------------------------
#: ops whose result is random by design (compared for shape and dtype only)
RANDOM_OPS = {
    "Bernoulli",
    "Dropout",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
}
#: ops left out of op cases: they read files or need whole subgraphs (If/Loop/Scan bodies)
SKIP_OPS = {"ImageDecoder", "If", "Loop", "Scan", "SequenceMap"}
_INDEX_NAMES = (
    "indices",
    "index",
    "ids",
    "labels",
    "lens",
    "k",
    "K",
    "repeats",
    "batch_indices",
    "sequence_lens",
    "write_indices",
    "position_ids",
    "I",
    "condition",
)


#: the domains opsnn's own records live in: ops a user registers elsewhere exist only in their process, not in a
#: fuzz worker's
BUILTIN_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "opsnn")


def _ops():
    from ..ops.registry import all_ops

    return [r for r in all_ops() if r.name not in SKIP_OPS and r.domain in BUILTIN_DOMAINS]


def _numeric(dtypes):
    return [d for d in dtypes if np.dtype(d).kind in "biuf" or np.dtype(d).name == "bfloat16"]


def _pick_dtype(draw, spec, first_dtype):
    allowed = spec.dtypes
    if allowed is None:
        if first_dtype is not None and draw.chance(0.8):
            return first_dtype
        return draw.choice([np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float32)])
    allowed = _numeric(allowed) or list(allowed)
    if first_dtype is not None and first_dtype in allowed and draw.chance(0.85):
        return first_dtype
    if np.dtype(np.float32) in allowed and draw.chance(0.6):
        return np.dtype(np.float32)
    if np.dtype(np.int64) in allowed and draw.chance(0.5):
        return np.dtype(np.int64)
    return np.dtype(draw.choice(allowed))


def _sub_shape(draw, base):
    """A shape that broadcasts to ``base`` (or, rarely, one that does not)."""
    r = draw.int(0, len(base))
    shape = [d if not draw.chance(0.3) else 1 for d in base[len(base) - r :]]
    if shape and draw.chance(0.05):
        shape[draw.int(0, len(shape) - 1)] += 1  # slightly invalid
    return tuple(shape)


def _host_values(draw, spec, base):
    """A host input (axes, shapes, counts, ...): small ints that make sense for ``base`` most of the time."""
    r = max(len(base), 1)
    mode = draw.int(0, 3)
    if mode == 0:  # axes
        n = draw.int(1, r)
        vals = sorted({draw.int(-r, r - 1) for _ in range(n)})
    elif mode == 1:  # a shape (reshape / expand / tile / constant-of-shape)
        vals = [d if not draw.chance(0.15) else draw.int(0, 4) for d in base] or [1]
    elif mode == 2:  # a scalar count
        return np.array(draw.int(-1, 4), np.int64)
    else:
        vals = [draw.int(-2, 4) for _ in range(draw.int(0, r))]
    return np.array(vals, np.int64)


def _attr_value(draw, a, base):
    """A value for attribute ``a``: around its default, occasionally out of range."""
    r = max(len(base), 1)
    d = a.default
    if a.kind == "int":
        opts = [0, 1, -1, 2, 3]
        if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            opts += [int(d), int(d) + 1, int(d) - 1]
        return draw.choice(opts)
    if a.kind == "float":
        opts = [0.5, 1.0, 2.0, 1e-3, -1.0, 0.0]
        if isinstance(d, (int, float)):
            opts.append(float(d))
        return draw.choice(opts)
    if a.kind == "ints":
        n = draw.choice([r, r, 2, 1, 0])
        lo = -r if "ax" in a.name or "perm" in a.name else 0
        return [draw.int(lo, max(r - 1, 1) if lo < 0 or "perm" in a.name else 3) for _ in range(n)]
    if a.kind == "floats":
        return [draw.choice([0.5, 1.0, 2.0]) for _ in range(draw.int(0, 3))]
    if a.kind == "string":
        if isinstance(d, str) and draw.chance(0.5):
            return d
        return draw.choice(
            ["none", "NOTSET", "SAME_UPPER", "VALID", "tanh", "linear", "nearest", "mean", "sum", "bogus", ""]
        )
    if a.kind == "dtype":
        return draw.choice([np.dtype(np.float32), np.dtype(np.int64)])
    return None


def sample_op_case(rec, draw) -> dict:
    """Inputs and attributes for ``rec`` drawn from its schema: mostly consistent (shared shapes,
    broadcastable shapes, axes in range, attributes near their defaults), sometimes not."""
    from ..ops.registry import REQUIRED

    rank = draw.choice([0, 1, 2, 2, 3, 3, 4, 4])
    base = tuple(draw.choice([1, 2, 3, 4, 5, 0 if draw.chance(0.03) else 3]) for _ in range(rank))
    inputs, first_dtype = [], None
    for _i, spec in enumerate(rec.inputs):
        copies = draw.int(1, 3) if spec.variadic else 1
        if spec.optional and draw.chance(0.5):
            # leave it out (trailing) or pass None (in the middle)
            inputs.append(None)
            continue
        for _ in range(copies):
            dt = _pick_dtype(draw, spec, first_dtype)
            if spec.host:
                vals = _host_values(draw, spec, base)
                inputs.append(vals.astype(dt) if np.dtype(dt).kind in "iuf" else vals)
                continue
            shape = (
                base
                if draw.chance(0.7)
                else (
                    _sub_shape(draw, base) if draw.chance(0.6) else tuple(draw.int(1, 4) for _ in range(draw.int(0, 4)))
                )
            )
            arr = draw.array(shape, dt)
            if spec.name in _INDEX_NAMES and arr.dtype.kind in "iu":
                arr = np.abs(arr) % max(min(base) if base else 1, 1)
            inputs.append(arr)
            if first_dtype is None:
                first_dtype = arr.dtype
    while inputs and inputs[-1] is None:
        inputs.pop()
    attrs = {}
    for a in rec.attrs:
        required = a.default is REQUIRED
        if (required and draw.chance(0.95)) or (not required and draw.chance(0.3)):
            v = _attr_value(draw, a, base)
            if v is not None:
                attrs[a.name] = v
    return {"op": rec.name, "domain": rec.domain, "inputs": inputs, "attrs": attrs}


# -- hints: valid configurations for ops a schema draw rarely gets right (channel counts, kernel shapes) ----------
def _hint_conv(draw, rec):
    n, c = draw.int(1, 2), draw.choice([1, 3, 8, 16, 32])
    group = draw.choice([1, 1, c]) if rec.name == "Conv" else 1
    k = draw.choice([1, 3, 3, 5])
    m = draw.choice([4, 8, 16]) if group == 1 else c
    hw = draw.choice([k, 6, 8, 12, 14])
    stride, pad, dil = draw.choice([1, 1, 2]), draw.choice([0, k // 2]), draw.choice([1, 1, 2])
    x = draw.array((n, c, hw, hw), np.float32)
    if rec.name == "ConvTranspose":
        w = draw.array((c, m, k, k), np.float32) * 0.3
        b = draw.array((m,), np.float32)
    else:
        w = draw.array((m, c // group, k, k), np.float32) * 0.3
        b = draw.array((m,), np.float32)
    attrs = {"strides": [stride, stride], "pads": [pad] * 4, "dilations": [dil, dil]}
    if rec.name == "Conv":
        attrs["group"] = group
    ins = [x, w, b if draw.chance(0.6) else None]
    if rec.name == "FusedConv":
        attrs = {
            "strides": [stride, stride],
            "pads": [pad] * 4,
            "dilations": [dil, dil],
            "group": 1,
            "kernel_shape": [k, k],
            "auto_pad": "NOTSET",
            "activation": draw.choice(["", "Relu", "LeakyRelu"]),
        }
    while ins and ins[-1] is None:
        ins.pop()
    return ins, attrs


def _hint_conv_backward(draw, rec):
    """A forward convolution's geometry, then the gradient record's inputs and shape attribute."""
    n, group = draw.int(0, 2), draw.choice([1, 1, 2])
    c, m = group * draw.choice([1, 3, 8]), group * draw.choice([1, 4, 8])
    k, stride, dil = draw.choice([1, 2, 3]), draw.choice([1, 2]), draw.choice([1, 1, 2])
    pads = [draw.int(0, k - 1) for _ in range(4)]
    eff = (k - 1) * dil + 1
    hw = [max(draw.choice([eff, 5, 8, 11]), eff), max(draw.choice([eff, 4, 9]), eff)]
    out = [(hw[i] + pads[i] + pads[2 + i] - eff) // stride + 1 for i in range(2)]
    x = draw.array((n, c, *hw), np.float32)
    w = draw.array((m, c // group, k, k), np.float32) * 0.3
    dy = draw.array((n, m, *out), np.float32)
    attrs = {"strides": [stride] * 2, "pads": pads, "dilations": [dil] * 2, "group": group}
    if rec.name == "ConvBackwardData":
        return [dy, w], dict(attrs, input_shape=list(x.shape))
    if rec.name == "ConvBackwardWeight":
        return [x, dy], dict(attrs, weight_shape=list(w.shape))
    return [dy, x, w], attrs


def _hint_matmul(draw, rec):
    m, k, n = draw.int(1, 40), draw.choice([1, 3, 16, 33, 64]), draw.choice([1, 5, 16, 48])
    batch = draw.choice([(), (), (2,), (2, 3)])
    if rec.name == "Gemm":
        # Gemm: 2-D, optional transposes and C
        ta, tb = draw.int(0, 1), draw.int(0, 1)
        a = draw.array((k, m) if ta else (m, k), np.float32)
        b = draw.array((n, k) if tb else (k, n), np.float32)
        c = draw.array(draw.choice([(n,), (m, n), (1, n), ()]), np.float32)
        return [a, b, c], {
            "transA": ta,
            "transB": tb,
            "alpha": draw.choice([1.0, 0.5]),
            "beta": draw.choice([1.0, 2.0]),
        }
    a = draw.array(batch + (m, k), np.float32)
    if rec.name == "Linear":
        return [a, draw.array((n, k), np.float32), draw.array((n,), np.float32)], {}
    b = draw.array((k, n), np.float32) if draw.chance(0.5) else draw.array(batch + (k, n), np.float32)
    if rec.name == "FusedMatMul":
        return [a, b, draw.array((n,), np.float32)], {"activation": draw.choice(["", "Relu", "Gelu"])}
    return [a, b], {}


def _hint_pool(draw, rec):
    c, hw, k = draw.choice([1, 3, 16]), draw.choice([5, 8, 11]), draw.choice([2, 3])
    x = draw.array((draw.int(1, 2), c, hw, hw), np.float32)
    attrs = {"kernel_shape": [k, k], "strides": [draw.choice([1, 2])] * 2, "pads": [draw.choice([0, 1])] * 4}
    if draw.chance(0.3):
        attrs["ceil_mode"] = 1
    return [x], attrs


def _hint_norm(draw, rec):
    n, c, hw = draw.int(1, 3), draw.choice([2, 4, 8]), draw.choice([3, 5, 8])
    x = draw.array((n, c, hw, hw), np.float32)
    if rec.name == "LayerNormalization":
        d = draw.choice([8, 33, 64])
        x = draw.array((n, hw, d), np.float32)
        return [x, draw.array((d,), np.float32), draw.array((d,), np.float32)], {}
    if rec.name == "BatchNormalization":
        var = np.abs(draw.array((c,), np.float32)) + 0.1
        return [x, draw.array((c,), np.float32), draw.array((c,), np.float32), draw.array((c,), np.float32), var], {}
    if rec.name == "GroupNormalization":
        return [x, draw.array((c,), np.float32), draw.array((c,), np.float32)], {"num_groups": draw.choice([1, 2])}
    return [x, draw.array((c,), np.float32), draw.array((c,), np.float32)], {}


def _hint_fused_elementwise(draw, rec):
    from ..kernels.cpu.codegen import TEMPLATES

    n_in = draw.int(1, 2)
    shape = (draw.int(1, 3), draw.choice([4, 7, 16]))
    binary = [op for op in TEMPLATES if "{b}" in TEMPLATES[op]]
    prog = []
    for k in range(draw.int(1, 5)):
        op = draw.choice(sorted(TEMPLATES))
        refs = [["in", j] for j in range(n_in)] + [["step", j] for j in range(k)]
        args = [draw.choice(refs)]
        if op in binary:
            args.append(draw.choice(refs + [["const", draw.choice([0.0, 0.5, 2.0, -1.0])]]))
        prog.append([op, args, {}])
    return [draw.array(shape, np.float32) for _ in range(n_in)], {"program": json.dumps(prog)}


HINTS = {
    "FusedElementwise": _hint_fused_elementwise,
    "Conv": _hint_conv,
    "ConvTranspose": _hint_conv,
    "FusedConv": _hint_conv,
    "ConvBackwardData": _hint_conv_backward,
    "ConvBackwardWeight": _hint_conv_backward,
    "ConvBackward": _hint_conv_backward,
    "MatMul": _hint_matmul,
    "Gemm": _hint_matmul,
    "Linear": _hint_matmul,
    "FusedMatMul": _hint_matmul,
    "MaxPool": _hint_pool,
    "AveragePool": _hint_pool,
    "LpPool": _hint_pool,
    "LayerNormalization": _hint_norm,
    "BatchNormalization": _hint_norm,
    "InstanceNormalization": _hint_norm,
    "GroupNormalization": _hint_norm,
}


def draw_op_case(rec, draw) -> dict:
    if rec.name in HINTS and draw.chance(0.8):
        ins, attrs = HINTS[rec.name](draw, rec)
        return {"op": rec.name, "domain": rec.domain, "inputs": ins, "attrs": attrs}
    return sample_op_case(rec, draw)


def _plannable(case: dict, algo: str | None = None) -> bool:
    """Whether prepare accepts ``case`` (and, with ``algo``, that kernel applies); runs no kernel."""
    from ..errors import OpsnnError
    from ..ops.executor import plan_op
    from ..ops.registry import TensorMeta, get_op

    rec = get_op(case["op"], case["domain"])
    metas = [None if x is None else TensorMeta(x.shape, x.dtype) for x in case["inputs"]]
    values = [None if x is None or i not in rec.host_inputs else x for i, x in enumerate(case["inputs"])]
    try:
        plan_op(rec, metas, values, case["attrs"], algo=algo)
    except OpsnnError:
        return False
    except Exception:  # noqa: BLE001 - an untyped error here is found (and reported) by op_schema cases
        return False
    return True


def valid_case(rec, seed: int, *, algo: str | None = None, tries: int = 300, float_only: bool = False):
    """The first drawn case (from ``seed`` on) that prepare accepts, or None."""
    for t in range(tries):
        draw = RngDraw(seed * 7919 + t)
        case = draw_op_case(rec, draw)
        if float_only and not any(x is not None and x.dtype.kind == "f" for x in case["inputs"]):
            continue
        if _plannable(case, algo):
            return case
    return None


# -- judging an op result against its reference -----------------------------------------------------------------
def _tolerance(dtype) -> tuple[float, float]:
    name = np.dtype(dtype).name
    if name == "float64":  # a graph and the reference may order a float64 sum differently
        return 1e-7, 1e-10
    if name == "float32":
        return 2e-4, 2e-5
    if name == "float16":
        return 5e-3, 5e-3
    return 3e-2, 3e-2  # bfloat16, float8


def _loosest(dtypes) -> np.dtype | None:
    """The float dtype of least precision among ``dtypes`` (None when none is a float)."""
    floats = [np.dtype(d) for d in dtypes if np.dtype(d).kind == "f" or np.dtype(d).name == "bfloat16"]
    return max(floats, key=lambda d: _tolerance(d)[0], default=None)


def input_tolerance_dtype(case: dict):
    """The float input of least precision: an op may compute in it (ONNX's RMSNormalization normalizes a
    float32 X in float32 and only then multiplies by a float64 scale), so its result is judged at that
    precision even where the output's dtype is wider."""
    return _loosest(x.dtype for x in case["inputs"] if x is not None and getattr(x, "size", 0))


def compare(got, want, what: str = "", *, nonfinite: bool = True, tol_dtype=None, overflow: bool = False) -> str | None:
    """None when ``got`` matches ``want`` (shape, dtype, values, NaN/Inf positions), else why not.
    ``nonfinite=False``: where ``want`` is NaN or Inf anything goes (``got`` must still be finite and
    close wherever ``want`` is finite). ``tol_dtype``: judge values at the looser of its precision and
    ``want``'s (see :func:`input_tolerance_dtype`). ``overflow``: the inputs hold values near the dtype's
    largest, where a sum's overflow to +-Inf, or to NaN via Inf - Inf, depends on its order: positions
    where either side is not finite are left out (see :func:`near_overflow`)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype and not (got.dtype.kind in "OUS" and want.dtype.kind in "OUS"):
        return f"{what}dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind in "OUSb" or got.dtype.kind in "iu":
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)[:3].tolist()
            return f"{what}values differ at {bad}: got {got[tuple(np.array(bad).T)] if bad else ''}"
        return None
    g, w = (
        got.astype(np.complex128 if got.dtype.kind == "c" else np.float64),
        want.astype(np.complex128 if want.dtype.kind == "c" else np.float64),
    )
    if overflow:
        keep = np.isfinite(g) & np.isfinite(w)
        g, w = np.where(keep, g, 0), np.where(keep, w, 0)
    for name, fn in (
        ("NaN", np.isnan),
        ("+Inf", lambda a: np.isposinf(a.real)),
        ("-Inf", lambda a: np.isneginf(a.real)),
    ):
        mg, mw = fn(g), fn(w)
        if not nonfinite:
            mg = mg & np.isfinite(w)
            mw = mw & np.isfinite(w)
        if not np.array_equal(mg, mw):
            idx = np.argwhere(mg != mw)[0].tolist()
            return (
                f"{what}{name} mismatch at {idx}: got {g[tuple(idx)]}, reference {w[tuple(idx)]} "
                f"({int(mg.sum())} vs {int(mw.sum())} {name})"
            )
    fin = np.isfinite(w)
    if fin.any():
        rtol, atol = _tolerance(_loosest([want.dtype] + ([tol_dtype] if tol_dtype is not None else [])))
        scale = max(1.0, float(np.max(np.abs(w[fin]))))
        diff = np.abs(g[fin] - w[fin])
        lim = atol * scale + rtol * np.abs(w[fin])
        if np.any(diff > lim):
            i = int(np.argmax(diff - lim))
            return (
                f"{what}values differ: max excess at flat {i}: got {g[fin][i]}, reference {w[fin][i]} "
                f"(rtol {rtol}, atol {atol} x {scale:.3g})"
            )
    return None


def _reference(rec, case: dict):
    """The op's numpy reference on the case (None when the reference itself cannot run it)."""
    attrs = rec.bind_attrs(case["attrs"])
    with np.errstate(all="ignore"):
        res = rec.reference([None if x is None else x.copy() for x in case["inputs"]], attrs)
    return list(res) if isinstance(res, (tuple, list)) else [res]


def _typed(exc) -> bool:
    """An opsnn error, and not a run-time one wrapping a Python error a kernel raised (a ZeroDivisionError
    inside a KernelError is a kernel bug, not a refusal; a ValueError from shape inference wrapped in a
    ParamInvalidError at prepare is a refusal)."""
    from ..errors import KernelError, OpsnnError

    if not isinstance(exc, OpsnnError):
        return False
    if not isinstance(exc, KernelError):
        return True
    inner, seen = exc, set()
    while inner.__cause__ is not None and id(inner) not in seen:
        seen.add(id(inner))
        inner = inner.__cause__
    return isinstance(inner, OpsnnError)


def _describe(exc) -> str:
    tb = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb))
    cause = exc.__cause__ or exc.__context__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    more = f" (from {type(cause).__name__}: {str(cause)[:200]})" if cause is not None else ""
    return f"{type(exc).__name__}: {str(exc)[:400]}{more} at {where}"


def _sync_all():
    for s in context().streams():
        s.synchronize()


def run_op_case(case: dict, *, algo: str | None = None, check: bool = True) -> tuple[str, str]:
    """Run one op case eagerly; (status, detail)."""
    from ..ops.registry import get_op

    rec = get_op(case["op"], case["domain"])
    try:
        with np.errstate(all="ignore"):
            outs = run_op(
                rec.name,
                [None if x is None else tensor(x) for x in case["inputs"]],
                dict(case["attrs"]),
                domain=rec.domain,
                algo=algo,
            )
            _sync_all()
            got = [None if o is None else np.array(o.numpy()) for o in outs]
    except Exception as exc:  # noqa: BLE001 - judged below: typed is fine, anything else a finding
        _drain_errors()
        return (TYPED, _describe(exc)) if _typed(exc) else (FAIL, "untyped " + _describe(exc))
    if not check or rec.name in RANDOM_OPS or rec.category == "random":
        return OK, "not compared (random op)"
    try:
        want = _reference(rec, case)
    except Exception as exc:  # noqa: BLE001 - the reference refuses it: nothing to compare against
        return SKIP, f"reference raised {type(exc).__name__}: {str(exc)[:200]}; opsnn returned a result"
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            continue
        why = compare(
            g,
            np.asarray(w),
            f"{rec.name} output {i}: ",
            nonfinite=rec.name not in NONFINITE_LENIENT,
            tol_dtype=input_tolerance_dtype(case),
        )
        if why:
            return FAIL, why
    return OK, ""


def _drain_errors():
    try:
        streams = context().streams()
    except Exception:  # noqa: BLE001
        return
    for s in streams:
        try:
            s.synchronize()
        except Exception:  # noqa: BLE001, S110 - a failed kernel's error, already reported
            pass


def op_for_seed(seed: int, ops=None):
    ops = ops or _ops()
    return ops[seed % len(ops)]


def case_op_schema(seed: int, op: str | None = None, domain: str = "") -> tuple[str, str]:
    from ..ops.registry import get_op

    rec = get_op(op, domain) if op is not None else op_for_seed(seed)
    case = draw_op_case(rec, RngDraw(seed))
    status, detail = run_op_case(case)
    return status, f"{rec.name}: {detail}" if detail else rec.name


# -- NaN / Inf through every kernel of every float op ------------------------------------------------------------
def float_kernels() -> list[tuple]:
    """(op record, kernel name) for every non-reference CPU kernel of an op with a float input."""
    pairs = []
    for rec in _ops():
        if rec.category == "random" or rec.name in RANDOM_OPS or rec.dynamic_shape:
            continue
        if not any(s.dtypes is None or any(np.dtype(d).kind == "f" for d in s.dtypes) for s in rec.inputs[:1]):
            continue
        for k in rec.kernels:
            if not k.fallback and k.backend == "cpu":
                pairs.append((rec, k.name))
    return pairs


#: ops whose outputs are only compared where the reference is finite: an FFT never multiplies by its
#: twiddles' exact zeros (a real input's DC imaginary part is 0 by construction), the direct sum the
#: reference computes does (NaN * 0 = NaN, Inf * 0 = NaN), so they differ in which entries are not finite
FFT_OPS = {"DFT", "STFT"}
#: ops compared the same way for another reason: the reference masks keys by adding -inf to their
#: scores (a masked +inf or NaN score still makes its row NaN), the kernels leave masked keys out
MASKED_SOFTMAX_OPS = {"Attention", "AttentionTrain"}
#: and another: a determinant of a matrix holding Inf is Inf or NaN by the order of elimination (LU
#: pivoting in float32 vs float64 picks different pivots)
ELIMINATION_OPS = {"Det"}
#: and another: a NaN or Inf in dY meets the padding's zeros in the reference and im2col weight
#: gradients (0 * Inf = NaN at the taps that read padding), oneDNN's JIT code skips those taps
PADDED_GRADIENT_OPS = {"ConvBackwardWeight", "ConvBackward"}
NONFINITE_LENIENT = FFT_OPS | MASKED_SOFTMAX_OPS | ELIMINATION_OPS | PADDED_GRADIENT_OPS


#: ops whose weights stay finite: a NaN weight tap over zero padding is 0 * NaN = NaN where the
#: convolution is computed over the padded input (im2col, the reference) and is never formed where the
#: padded taps are skipped (direct convolution); both are accepted, so only the data is poisoned
WEIGHTED_OPS = {"Conv", "ConvTranspose", "FusedConv", "BlockedConv", "DeformConv", "ConvInteger", "QLinearConv"}


def _poison(case: dict, draw) -> dict:
    """NaN, +Inf and -Inf at a few positions of the float inputs (the first one always)."""
    from ..ops.registry import get_op

    rec = get_op(case["op"], case["domain"])
    specials = [np.nan, np.inf, -np.inf]
    ins = []
    for i, x in enumerate(case["inputs"]):
        if (i > 0 and case["op"] in WEIGHTED_OPS) or rec.input_spec(i).host:
            pass  # host inputs are sizes and scales read at prepare: data only
        elif x is not None and x.dtype.kind == "f" and x.size and (i == 0 or draw.chance(0.3)):
            x = x.copy()
            flat = x.reshape(-1)
            for _ in range(draw.int(1, max(1, min(4, flat.size)))):
                flat[draw.int(0, flat.size - 1)] = draw.choice(specials)
        ins.append(x)
    return dict(case, inputs=ins)


def case_nan_inf(seed: int, op: str | None = None, kernel: str | None = None, domain: str = "") -> tuple[str, str]:
    """NaN/Inf through one kernel: ``op``/``kernel`` given, or the seed picks the pair (and the draw)."""
    from ..ops.registry import get_op

    if op is not None:
        rec, kname, sub = get_op(op, domain), kernel, seed
    else:
        pairs = float_kernels()
        (rec, kname), sub = pairs[seed % len(pairs)], seed // len(pairs)
    case = valid_case(rec, sub, algo=kname, float_only=True, tries=150)
    if case is None:
        return SKIP, f"{rec.name}/{kname}: no drawn case this kernel applies to"
    case = _poison(case, RngDraw(seed))
    status, detail = run_op_case(case, algo=kname)
    return status, f"{rec.name}/{kname}: {detail}"


# -- out= views ---------------------------------------------------------------------------------------------------
VIEWS = ("transposed", "strided", "negative", "expanded", "offset")


def _out_view(view: str, shape, dtype, sentinel):
    """A tensor of ``shape`` that is a non-contiguous view of a larger, sentinel-filled base."""
    nd = len(shape)
    if view == "transposed":
        base = full(tuple(reversed(shape)), sentinel, dtype=dtype)
        return base, base.permute(*reversed(range(nd))) if nd else base
    if view == "strided":
        big = tuple(shape[:-1]) + (2 * shape[-1],) if nd else ()
        base = full(big, sentinel, dtype=dtype)
        return base, base[..., ::2] if nd else base
    if view == "negative":
        base = full(tuple(shape), sentinel, dtype=dtype)
        return base, base[..., ::-1] if nd else base
    if view == "offset":
        big = (shape[0] + 2,) + tuple(shape[1:]) if nd else ()
        base = full(big, sentinel, dtype=dtype)
        return base, base[1:-1] if nd else base
    base = full(tuple(1 for _ in shape), sentinel, dtype=dtype)  # expanded: zero strides
    return base, base.expand(*shape)


def out_ops() -> list:
    """The ops whose outputs prepare can bind to ``out=`` tensors (fixed output shapes, not random)."""
    return [r for r in _ops() if not r.dynamic_shape and r.category != "random" and r.name not in RANDOM_OPS]


def case_out_view(seed: int, op: str | None = None, view: str | None = None, domain: str = "") -> tuple[str, str]:
    """One op prepared with ``out=`` a non-contiguous ``view``: ``op``/``view`` given, or picked by the seed."""
    from ..ops import executor
    from ..ops.registry import get_op

    if op is not None:
        rec, sub = get_op(op, domain), seed
    else:
        ops = out_ops()
        rec, view, sub = ops[seed % len(ops)], VIEWS[(seed // len(ops)) % len(VIEWS)], seed // (len(ops) * len(VIEWS))
    case = valid_case(rec, sub)
    if case is None:
        return SKIP, f"{rec.name}: no valid drawn case"
    rec = get_op(case["op"], case["domain"])
    try:
        with np.errstate(all="ignore"):
            ins = [None if x is None else tensor(x) for x in case["inputs"]]
            ex0 = executor.prepare(rec, ins, case["attrs"])
            want = ex0.run()
            want = [np.array(w.numpy()) for w in (want if isinstance(want, tuple) else (want,))]
    except Exception as exc:  # noqa: BLE001
        _drain_errors()
        return (
            (TYPED, f"{rec.name}: {_describe(exc)}") if _typed(exc) else (FAIL, f"{rec.name}: untyped {_describe(exc)}")
        )
    shapes = [w.shape for w in want]
    if view in ("transposed", "strided", "negative", "offset") and not any(
        len(s) >= (2 if view == "transposed" else 1) and any(d > 1 for d in s) for s in shapes
    ):
        return SKIP, f"{rec.name}: outputs {shapes} too small for a {view} view"
    if any(w.dtype.kind in "OUS" for w in want):
        return SKIP, f"{rec.name}: string output"
    sentinel = 7
    bases, outs = zip(*[_out_view(view, w.shape, w.dtype, sentinel) for w in want])
    before = [np.array(b.numpy()) for b in bases]
    try:
        ex = executor.prepare(rec, ins, case["attrs"], out=list(outs))
    except Exception as exc:  # noqa: BLE001
        return (
            (TYPED, f"{rec.name} {view}: refused at prepare: {str(exc)[:200]}")
            if _typed(exc)
            else (FAIL, f"{rec.name} {view}: untyped {_describe(exc)} at prepare")
        )
    try:
        with np.errstate(all="ignore"):
            ex.run()
            _sync_all()
    except Exception as exc:  # noqa: BLE001
        _drain_errors()
        return FAIL, f"{rec.name} {view}: prepare accepted the out= view, run raised {_describe(exc)}"
    for i, (o, w) in enumerate(zip(outs, want)):
        why = compare(
            np.array(o.numpy()),
            w,
            f"{rec.name} out[{i}] ({view} view {o.strides}): ",
            tol_dtype=input_tolerance_dtype(case),
        )
        if why:
            return FAIL, why
    if view != "expanded":
        for i, (b, o, b0) in enumerate(zip(bases, outs, before)):
            touched = np.zeros(b0.size, bool)  # the view's elements in the base, found by address
            addr0 = b.numpy().ctypes.data
            isz = b0.dtype.itemsize
            offs = (
                (np.indices(o.shape).reshape(len(o.shape), -1).T * np.array(o.numpy().strides)).sum(1)
                + (o.numpy().ctypes.data - addr0)
                if o.ndim
                else np.array([o.numpy().ctypes.data - addr0])
            )
            touched[(offs // isz).astype(np.int64)] = True
            rest = b.numpy().reshape(-1)[~touched]
            if rest.size and not np.array_equal(rest, b0.reshape(-1)[~touched]):
                return FAIL, f"{rec.name} out[{i}] ({view} view): wrote outside the view"
    return OK, f"{rec.name} {view}"


# -- ONNX graphs: random chains, then mutated files ---------------------------------------------------------------
#: no Floor / Ceil: a fused chain keeps its intermediates in float64, so floor(erf(4.0)) is 0 there and 1
#: op by op (erf rounded to float32 first); a step function turns that rounding into a difference of 1
_UNARY = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Abs",
    "Neg",
    "Exp",
    "LeakyRelu",
    "Softplus",
    "Gelu",
    "Softmax",
    "Erf",
    "HardSwish",
    "Elu",
    "Identity",
    "Sqrt",
    "Reciprocal",
]
_BINARY = ["Add", "Mul", "Sub", "Div", "Max", "Min", "Pow"]


def random_model(seed: int, *, opset: int = 20):
    """A small ONNX model: a chain of 2-8 nodes (pointwise, binary with constants or earlier values,
    MatMul, Reshape, Transpose, reductions, Concat, a Conv on 4-D inputs) and its input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    draw = RngDraw(seed)
    rank = draw.choice([2, 3, 4, 4])
    shape = [draw.int(1, 3)] + [draw.choice([2, 3, 4, 5, 8]) for _ in range(rank - 1)]
    nodes, inits = [], []
    cur, cur_shape, values = "x", list(shape), [("x", list(shape))]
    for i in range(draw.int(2, 8)):
        out = f"v{i}"
        r = draw.int(0, 9)
        if r <= 3:
            op = draw.choice(_UNARY)
            src = cur
            if op in ("Sqrt", "Reciprocal"):  # of |x| + 1: near 0 they would amplify rounding differences
                nodes.append(helper.make_node("Abs", [cur], [f"{out}_abs"]))
                inits.append(numpy_helper.from_array(np.array(1.0, np.float32), f"one{i}"))
                nodes.append(helper.make_node("Add", [f"{out}_abs", f"one{i}"], [f"{out}_p1"]))
                src = f"{out}_p1"
            attrs = {"axis": -1} if op == "Softmax" else {}
            if op == "Exp":
                nodes.append(helper.make_node("Tanh", [cur], [f"{out}_t"]))
                src = f"{out}_t"
            nodes.append(helper.make_node(op, [src], [out], **attrs))
        elif r <= 6:
            op = draw.choice(_BINARY)
            if draw.chance(0.5) and len(values) > 1 and op not in ("Div", "Pow"):
                other, oshape = draw.choice(values)
                if oshape != cur_shape:
                    other = None
            else:
                other = None
            if other is None:
                cshape = [d if draw.chance(0.6) else 1 for d in cur_shape[draw.int(0, len(cur_shape)) :]]
                c = draw.array(cshape, np.float32)
                if op in ("Div", "Pow"):
                    c = np.abs(c) + 0.5 if op == "Div" else np.full(cshape, 2.0, np.float32)
                other = f"c{i}"
                inits.append(numpy_helper.from_array(c, other))
            a = cur
            if op == "Pow":
                nodes.append(helper.make_node("Tanh", [cur], [f"{out}_t"]))
                a = f"{out}_t"
            nodes.append(helper.make_node(op, [a, other], [out]))
        elif r == 7:
            n = draw.choice([3, 8, 16])
            w = draw.array([cur_shape[-1], n], np.float32) * 0.3
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [out]))
            cur_shape = cur_shape[:-1] + [n]
        elif r == 8:
            choice = draw.int(0, 3)
            if choice == 0:
                perm = list(range(len(cur_shape)))[::-1]
                nodes.append(helper.make_node("Transpose", [cur], [out], perm=perm))
                cur_shape = [cur_shape[p] for p in perm]
            elif choice == 1:
                new = [cur_shape[0], -1]
                inits.append(numpy_helper.from_array(np.array(new, np.int64), f"s{i}"))
                nodes.append(helper.make_node("Reshape", [cur, f"s{i}"], [out]))
                cur_shape = [cur_shape[0], int(np.prod(cur_shape[1:]))]
            elif choice == 2:
                ax = len(cur_shape) - 1
                inits.append(numpy_helper.from_array(np.array([ax], np.int64), f"a{i}"))
                nodes.append(
                    helper.make_node(
                        draw.choice(["ReduceSum", "ReduceMean", "ReduceMax"]), [cur, f"a{i}"], [out], keepdims=1
                    )
                )
                cur_shape = cur_shape[:-1] + [1]
            else:
                nodes.append(helper.make_node("Concat", [cur, cur], [out], axis=-1))
                cur_shape = cur_shape[:-1] + [2 * cur_shape[-1]]
        else:
            if len(cur_shape) == 4:
                cin, m, k = cur_shape[1], draw.choice([2, 4, 8]), draw.choice([1, 3])
                w = draw.array([m, cin, k, k], np.float32) * 0.3
                inits.append(numpy_helper.from_array(w, f"w{i}"))
                inits.append(numpy_helper.from_array(draw.array([m], np.float32), f"b{i}"))
                nodes.append(helper.make_node("Conv", [cur, f"w{i}", f"b{i}"], [out], pads=[k // 2] * 4))
                cur_shape = [cur_shape[0], m] + cur_shape[2:]
                if draw.chance(0.5):
                    nodes.append(helper.make_node("Relu", [out], [f"{out}_r"]))
                    out = f"{out}_r"
            else:
                nodes.append(helper.make_node("Relu", [cur], [out]))
        cur = out
        values.append((cur, list(cur_shape)))
    dyn = ["batch"] + shape[1:]
    graph = helper.make_graph(
        nodes,
        f"fuzz{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dyn)],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [f"d{j}" for j in range(len(cur_shape))])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    x = draw.array(shape, np.float32)
    return model, {"x": x}


def _onnx_reference(model, feeds: dict, *, wide: bool = False):
    from onnx.reference import ReferenceEvaluator

    with np.errstate(all="ignore"):
        return ReferenceEvaluator(model, new_ops=_wide_ops() if wide else None).run(None, feeds)


def _wide_ops() -> list:
    """Erf and Gelu for onnx.reference's float64 runs: its Erf rounds to float32 whatever the input, and its
    Gelu (a function: Erf inside, where new_ops do not reach) then cancels 1 + erf(x) to 0 in the far tail
    where float64 keeps ~1e-12: both computed in float64 here (Gelu from erfc: no cancellation)."""
    import math

    from onnx.reference.op_run import OpRun

    erf = np.vectorize(math.erf, otypes=[np.float64])
    erfc = np.vectorize(math.erfc, otypes=[np.float64])

    class Erf(OpRun):
        op_domain = ""

        def _run(self, x):
            return (erf(x).astype(x.dtype),)

    class Gelu(OpRun):
        op_domain = ""

        def _run(self, x, approximate=None):
            x64 = x.astype(np.float64)
            if approximate == "tanh":
                y = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
            else:
                y = 0.5 * x64 * erfc(-x64 / math.sqrt(2.0))
            return (y.astype(x.dtype),)

    return [Erf, Gelu]


def run_model(data, feeds: dict, *, compare_reference: bool = True, model=None) -> tuple[str, str]:
    """Load ``data`` (bytes), compile and run it on ``feeds``; judge against onnx.reference."""
    try:
        with np.errstate(all="ignore"):
            g = load_onnx(data)
            cg = compile_graph(g)
            names = [v.name for v in g.inputs]
            feeds = _feeds_for(g, feeds)
            outs = cg.run({n: feeds[n] for n in names})
            got = [np.array(v.numpy()) for v in outs.values()]
    except Exception as exc:  # noqa: BLE001
        _drain_errors()
        return (TYPED, _describe(exc)) if _typed(exc) else (FAIL, "untyped " + _describe(exc))
    if not compare_reference:
        return OK, ""
    if sum(g_.size for g_ in got) > 1 << 22:
        return SKIP, "outputs too large to check with onnx.reference"
    try:
        import onnx

        proto = model if model is not None else onnx.load_from_string(data)
        want = _onnx_reference(proto, {n: feeds[n] for n in names})
    except Exception as exc:  # noqa: BLE001 - onnx.reference cannot run it: no oracle
        return SKIP, f"onnx.reference raised {type(exc).__name__}: {str(exc)[:160]}; opsnn ran it"
    overflow = near_overflow(list(g.initializers.values()) + [feeds[n] for n in names])
    return judge_outputs(got, want, proto, {n: feeds[n] for n in names}, overflow=overflow)


def judge_outputs(got: list, want: list, model, feeds: dict, *, overflow: bool = False) -> tuple[str, str]:
    """(status, detail) of a model's outputs ``got`` against onnx.reference's ``want``: a mismatch is
    ``ill_conditioned`` only where :func:`ill_conditioned` finds the reference itself unstable at every
    differing place and ``got`` within its reach there, else a failure."""
    variants, ill = None, []
    for i, (gv, wv) in enumerate(zip(got, want)):
        wv = np.asarray(wv)
        why = compare(gv, wv, f"output {i}: ", overflow=overflow)
        if not why:
            continue
        if variants is None:
            variants = reference_variants(model, feeds)
        note = ill_conditioned(gv, wv, [(label, outs[i]) for label, outs in variants if i < len(outs)], overflow)
        if note is None:
            return FAIL, why
        ill.append(f"{why}; {note}")
    return (ILL, "; ".join(ill)) if ill else (OK, "")


def as_float64(model):
    """A copy of ``model`` that computes in float64: its float32 inputs, outputs, value infos, initializers,
    tensor attributes and Cast / dtype targets made float64 (None for a model with subgraphs)."""
    import onnx
    from onnx import AttributeProto, TensorProto, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    f32, f64 = TensorProto.FLOAT, TensorProto.DOUBLE
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        return None

    def wider(t):
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == f32:
            v.type.tensor_type.elem_type = f64
    for t in g.initializer:
        if t.data_type == f32:
            wider(t)
    for n in g.node:
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR and a.t.data_type == f32:
                wider(a.t)
            elif a.type == AttributeProto.INT and a.name in ("to", "dtype") and a.i == f32:
                a.i = f64
    return m


def rounded_per_op(wide):
    """A copy of the float64 model ``wide`` (:func:`as_float64`) whose float64 node outputs are each rounded to
    float32 (Cast to FLOAT and back): a correctly rounded float32 evaluation, op by op (None where shape
    inference fails). onnx.reference's float32 numpy kernels are not correctly rounded (its tanh(9.08) is
    0.99999994, the float32 nearest the exact value is 1.0): a Pow with a huge exponent after it then turns
    that ulp into 0 against 1, where the float64 run keeps the unrounded value and gives 0 too."""
    import onnx
    from onnx import TensorProto, helper

    typed = _with_types(wide)
    if typed is None:
        return None
    g, kinds = typed[0].graph, typed[1]
    taken = {v for n in g.node for v in [*n.input, *n.output]} | {v.name for v in [*g.input, *g.output]}
    taken |= {t.name for t in g.initializer}
    m = onnx.ModelProto()
    m.CopyFrom(wide)
    nodes = []
    for n in m.graph.node:
        nodes.append(n)
        for k, o in enumerate(n.output):
            if not o or kinds.get(o) != TensorProto.DOUBLE:
                continue
            raw, low = f"{o}__unrounded", f"{o}__float32"
            while raw in taken or low in taken:
                raw, low = raw + "_", low + "_"
            taken |= {raw, low}
            n.output[k] = raw
            nodes.append(helper.make_node("Cast", [raw], [low], to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Cast", [low], [o], to=TensorProto.DOUBLE))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


#: the sums whose float32 result depends on the order of their terms: a kernel's blocking may add them in any order
SUMS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "ReduceSum", "ReduceMean")
#: float32's unit roundoff: a sum's result moves by about this times the sum of its terms' magnitudes when the
#: order of the additions changes
UNIT_ROUNDOFF = 2.0**-24


def _with_types(model):
    """(model with inferred value types, {value name: elem_type}) or None where shape inference fails."""
    import onnx

    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a mutated model shape inference refuses
        return None
    g = typed.graph
    kinds = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    kinds.update({t.name: t.data_type for t in g.initializer})
    return typed, kinds


def sums_reordered(wide, sign: float):
    """A copy of the float64 model ``wide`` (:func:`as_float64`) in which each sum of :data:`SUMS` is moved by
    ``sign`` x :data:`UNIT_ROUNDOFF` x the same op over its operands' magnitudes: how far a float32 evaluation
    that adds the terms in another order may land (None where shape inference fails). A cancelling sum (terms
    of ~15 that add up to 1e-4) moves by more than its value there, a sum of like-signed terms by an ulp."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    typed = _with_types(wide)
    if typed is None:
        return None
    kinds = typed[1]
    taken = {v for n in wide.graph.node for v in [*n.input, *n.output]} | {t.name for t in wide.graph.initializer}
    taken |= {v.name for v in [*wide.graph.input, *wide.graph.output]}

    def fresh(name):
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    m = onnx.ModelProto()
    m.CopyFrom(wide)
    step = fresh("sum_order_step")
    m.graph.initializer.append(numpy_helper.from_array(np.array(sign * UNIT_ROUNDOFF, np.float64), step))
    nodes = []
    for n in m.graph.node:
        nodes.append(n)
        o = n.output[0] if n.output else ""
        if n.op_type not in SUMS or n.domain not in ("", "ai.onnx") or kinds.get(o) != TensorProto.DOUBLE:
            continue
        mags = []
        for v in n.input:
            if v and kinds.get(v) == TensorProto.DOUBLE:
                mags.append(fresh(f"{v}__magnitude"))
                nodes.append(helper.make_node("Abs", [v], [mags[-1]]))
            else:
                mags.append(v)
        size, raw, moved = fresh(f"{o}__magnitude"), fresh(f"{o}__in_order"), fresh(f"{o}__moved")
        twin = helper.make_node(n.op_type, mags, [size])
        twin.attribute.extend(n.attribute)
        for a in twin.attribute:
            if a.name in ("alpha", "beta"):  # Gemm's scalars
                a.f = abs(a.f)
        n.output[0] = raw
        nodes += [twin, helper.make_node("Mul", [size, step], [moved]), helper.make_node("Add", [raw, moved], [o])]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def reference_variants(model, feeds: dict) -> list:
    """[(label, onnx.reference's outputs)] of ``model`` computed in float64 (cast back to float32), in float64
    with every op's result rounded to float32 (:func:`rounded_per_op`), in float64 with its sums moved up and
    down by what adding their terms in another float32 order may change (:func:`sums_reordered`), and on its
    float inputs moved 1 ulp up and 1 ulp down: how far the reference itself moves (variants that cannot run
    are left out)."""
    out = []
    wide = as_float64(model)
    if wide is not None:
        feeds64 = {n: x.astype(np.float64) if x.dtype == np.float32 else x for n, x in feeds.items()}
        runs = [("float64", wide), (ROUNDED, rounded_per_op(wide))]
        if any(n.op_type in SUMS for n in wide.graph.node):
            runs += [
                (f"float64, sums reordered ({way})", sums_reordered(wide, s)) for way, s in (("up", 1), ("down", -1))
            ]
        for label, m in runs:
            if m is None:
                continue
            try:
                out.append((label, [np.asarray(o) for o in _onnx_reference(m, feeds64, wide=True)]))
            except Exception:  # noqa: BLE001 - no float64 run of this model: the other variants remain
                pass
    for label, to in (("inputs 1 ulp up", np.inf), ("inputs 1 ulp down", -np.inf)):
        moved = {n: np.nextafter(x, x.dtype.type(to)) if x.dtype.kind == "f" else x for n, x in feeds.items()}
        try:
            out.append((label, [np.asarray(o) for o in _onnx_reference(model, moved)]))
        except Exception:  # noqa: BLE001
            pass
    return out


#: the label of the float64 run that rounds each op's result to float32 (:func:`rounded_per_op`)
ROUNDED = "float64 rounded per op"
#: the variants a result may agree with at a place where the float32 reference does not (exact arithmetic,
#: rounded once or once per op): the reference's float32 kernels are the less accurate there
EXACT_RUNS = ("float64", ROUNDED)
#: at an ill-conditioned place a result may lie this many times the reference's own spread from it: a few ulps
#: of an intermediate, where the variants move it by about one
ILL_SPREAD = 8


def _mismatch(got: np.ndarray, want: np.ndarray, overflow: bool) -> tuple[np.ndarray, np.ndarray]:
    """(places where ``got`` differs from ``want`` as :func:`compare` judges it, the tolerance per place)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    if overflow:
        keep = np.isfinite(g) & np.isfinite(w)
        g, w = np.where(keep, g, 0), np.where(keep, w, 0)
    bad = (np.isnan(g) != np.isnan(w)) | (np.isposinf(g) != np.isposinf(w)) | (np.isneginf(g) != np.isneginf(w))
    fin = np.isfinite(w)
    rtol, atol = _tolerance(want.dtype)
    scale = max(1.0, float(np.max(np.abs(w[fin]), initial=0.0)))
    lim = atol * scale + rtol * np.abs(np.where(fin, w, 0))
    with np.errstate(invalid="ignore"):
        bad |= fin & np.isfinite(g) & (np.abs(g - w) > lim)
    return bad, lim


def _kind(a: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf per place."""
    return np.select([np.isnan(a), np.isposinf(a), np.isneginf(a)], [1, 2, 3], 0)


def ill_conditioned(got, want, variants: list, overflow: bool = False) -> str | None:
    """Why ``got``'s difference from ``want`` is the problem's, not opsnn's, or None when it is a failure.
    Ill-conditioned means: at every place ``got`` differs, either ``got`` agrees with the reference's float64 run
    (or its run rounded per op) within the tolerance, or some variant of the reference (:func:`reference_variants`: its float64 run, its inputs
    1 ulp away) differs from ``want`` too and ``got`` is within reach there: within ``ILL_SPREAD`` times the variants' spread
    (plus the tolerance) where they are all finite, else of a kind (finite, NaN, +-Inf) one of them has."""
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape or g.dtype != w.dtype or w.dtype.kind != "f":
        return None
    alts = [(label, np.asarray(a)) for label, a in variants if np.shape(a) == w.shape]
    if not alts:
        return None
    alts = [(label, a.astype(w.dtype)) for label, a in alts]
    bad, lim = _mismatch(g, w, overflow)
    if not bad.any():
        return None
    moved = np.zeros_like(bad)
    near = np.zeros_like(bad)  # ``got`` agrees with the reference's float64 run within the tolerance there
    movers = []
    for label, a in alts:
        m = _mismatch(a, w, overflow)[0]
        if (m & bad).any():
            movers.append(label)
        moved |= m
        if label in EXACT_RUNS:
            near |= ~_mismatch(g, a, overflow)[0]
    if not (moved | near)[bad].all():
        return None  # a place where the reference is stable and got agrees with none of its variants: wrong
    refs = np.stack([w] + [a for _, a in alts]).astype(np.float64)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    finite = np.isfinite(refs).all(axis=0)
    with np.errstate(invalid="ignore"):
        spread = np.abs(refs - w64).max(axis=0)
        far = finite & (~np.isfinite(g64) | (np.abs(g64 - w64) > ILL_SPREAD * spread + lim))
    foreign = ~finite & ~(_kind(refs) == _kind(g64)).any(axis=0)
    if overflow:
        far &= np.isfinite(g64) & np.isfinite(w64)
        foreign &= np.isfinite(g64) & np.isfinite(w64)
    if (bad & ~near & (far | foreign)).any():
        return None
    agree = int((bad & near & ~moved).sum())
    return (
        f"ill-conditioned: at all {int(bad.sum())} differing place(s) the reference itself moves past the "
        f"tolerance ({', '.join(movers) or 'no variant'})"
        + (
            f" or, at {agree}, the result agrees with its float64 run (or that run rounded per op) where the "
            "reference does not"
            if agree
            else ""
        )
    )


def near_overflow(arrays) -> bool:
    """Whether a float array among ``arrays`` holds a finite value within 1e8 of its dtype's largest (a
    mutation's 0x7f bytes: 3.4e38 in float32), where float sums overflow in an order-dependent way."""
    for a in arrays:
        a = np.asarray(a)
        if a.size and (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
            v = np.abs(a.astype(np.float64))
            if np.any(np.isfinite(v) & (v > float(ml_dtypes.finfo(a.dtype).max) * 1e-8)):  # bfloat16 too
                return True
    return False


def _feeds_for(g, feeds: dict) -> dict:
    """The given feeds, or made-up ones for inputs a mutation renamed or retyped (unknown dims = 1)."""
    out = {}
    for v in g.inputs:
        x = feeds.get(v.name)
        dt = np.dtype(v.dtype) if v.dtype is not None else np.dtype(np.float32)
        shape = tuple(d if isinstance(d, int) and 0 <= d <= 64 else 1 for d in (v.shape or ()))
        if x is None or x.dtype != dt or (v.shape is not None and len(shape) != x.ndim):
            x = _fill(np.random.default_rng(0), shape, dt)
        out[v.name] = x
    return out


def op_model(case: dict, n_outputs: int):
    """A one-node ONNX model of an op case: data inputs as graph inputs, host inputs (sizes, axes) as
    initializers; None when the case has something ONNX attributes cannot hold."""
    from onnx import helper, numpy_helper

    from ..ops.registry import get_op

    rec = get_op(case["op"], case["domain"])
    if any(isinstance(v, np.dtype) or v is None or (isinstance(v, list) and not v) for v in case["attrs"].values()):
        return None  # an empty list has no ONNX attribute type to infer
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, x in enumerate(case["inputs"]):
        if x is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if x.dtype.kind in "OUS" or x.dtype.name == "bfloat16":
            return None
        if rec.input_spec(i).host:
            inits.append(numpy_helper.from_array(x, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape))
            feeds[name] = x
    outs = [f"out{j}" for j in range(n_outputs)]
    node = helper.make_node(rec.name, names, outs, domain=rec.domain, **case["attrs"])
    graph = helper.make_graph(
        [node], f"op_{rec.name}", graph_inputs, [helper.make_tensor_value_info(o, 0, None) for o in outs], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("ai.onnx.ml", 5)])
    model.ir_version = 10
    return model, feeds


def _onnx_held(attrs: dict) -> dict:
    """``attrs`` with their floats rounded to float32, the values an ONNX model's attributes hold."""

    def held(v):
        if isinstance(v, float):
            return float(np.float32(v))
        if isinstance(v, (list, tuple)) and v and all(isinstance(e, float) for e in v):
            return [float(np.float32(e)) for e in v]
        return v

    return {k: held(v) for k, v in attrs.items()}


def case_op_graph(seed: int) -> tuple[str, str]:
    """One registry op drawn from its schema, run as a one-node compiled model: its numpy reference."""
    from ..ops.registry import get_op

    ops = [r for r in _ops() if r.domain in ("", "ai.onnx.ml") and r.category != "random" and r.name not in RANDOM_OPS]
    rec = ops[seed % len(ops)]
    case = valid_case(rec, seed // len(ops))
    if case is None:
        return SKIP, f"{rec.name}: no valid drawn case"
    try:  # the attributes as the model holds them: an ONNX float is a float32 (HardSigmoid's alpha 0.2)
        want = _reference(get_op(case["op"], case["domain"]), dict(case, attrs=_onnx_held(case["attrs"])))
    except Exception as exc:  # noqa: BLE001 - no oracle for this draw
        return SKIP, f"{rec.name}: reference raised {type(exc).__name__}"
    built = op_model(case, len(want))
    if built is None:
        return SKIP, f"{rec.name}: attributes or dtypes an ONNX model cannot hold"
    model, feeds = built
    try:
        with np.errstate(all="ignore"):
            cg = compile_graph(load_onnx(model.SerializeToString()))
            got = [np.array(v.numpy()) for v in cg.run(feeds).values()]
    except Exception as exc:  # noqa: BLE001
        _drain_errors()
        return (
            (TYPED, f"{rec.name}: {_describe(exc)}")
            if _typed(exc)
            else (FAIL, f"{rec.name} as a graph: untyped {_describe(exc)}")
        )
    for i, (g, w) in enumerate(zip(got, want)):
        why = compare(
            g,
            np.asarray(w),
            f"{rec.name} (graph) output {i}: ",
            nonfinite=rec.name not in NONFINITE_LENIENT,
            tol_dtype=input_tolerance_dtype(case),
        )
        if why:
            return FAIL, why
    return OK, rec.name


def case_graph(seed: int) -> tuple[str, str]:
    """Even seeds: a random chain against onnx.reference; odd seeds: one registry op as a model."""
    if seed % 2:
        return case_op_graph(seed // 2)
    model, feeds = random_model(seed // 2)
    status, detail = run_model(model.SerializeToString(), feeds, model=model)
    if status in FAILED or status == TYPED:
        return status, detail
    # a second batch size: a second plan for the same compiled graph's shapes
    x = feeds["x"]
    x2 = np.concatenate([x, x[:1] * 0.5], axis=0)
    status2, detail2 = run_model(model.SerializeToString(), {"x": x2}, model=model)
    return (status, detail) if status == ILL and status2 == OK else (status2, detail2)


MUTATIONS = ("truncate", "bitflip", "bytes", "attr", "dims", "optype", "rewire", "drop")


def mutated_model(seed: int) -> tuple[bytes, dict, str]:
    """A random model's bytes mutated one way (by seed); returns (data, feeds, what was done)."""
    from onnx import AttributeProto, helper

    model, feeds = random_model(seed // len(MUTATIONS))
    draw = RngDraw(seed)
    how = MUTATIONS[seed % len(MUTATIONS)]
    data = bytearray(model.SerializeToString())
    if how == "truncate":
        cut = draw.int(0, len(data) - 1)
        return bytes(data[:cut]), feeds, f"truncated at {cut}/{len(data)}"
    if how == "bitflip":
        bits = [draw.int(0, 8 * len(data) - 1) for _ in range(draw.int(1, 8))]
        for b in bits:
            data[b // 8] ^= 1 << (b % 8)
        return bytes(data), feeds, f"bits flipped {bits}"
    if how == "bytes":
        at = draw.int(0, len(data) - 1)
        val = draw.choice([0x00, 0xFF, 0x7F, 0x80])
        n = draw.int(1, 6)
        data[at : at + n] = bytes([val] * n)
        return bytes(data), feeds, f"{n} bytes at {at} set to {val:#x}"
    g = model.graph
    extreme = [0, -1, 2, 7, -(2**31), 2**31 - 1, 2**40, 10**6]
    if how == "attr":
        nodes = [n for n in g.node if n.attribute]
        if nodes:
            a = draw.choice(nodes).attribute
            a = a[draw.int(0, len(a) - 1)]
            if a.type == AttributeProto.INT:
                a.i = draw.choice(extreme)
            elif a.type == AttributeProto.INTS and a.ints:
                a.ints[draw.int(0, len(a.ints) - 1)] = draw.choice(extreme)
            elif a.type == AttributeProto.FLOAT:
                a.f = draw.choice([float("nan"), float("inf"), -1.0, 0.0])
        else:
            n = draw.choice(list(g.node))
            n.attribute.append(
                helper.make_attribute(draw.choice(["axis", "perm", "kernel_shape", "alpha"]), draw.choice(extreme))
            )
    elif how == "dims":
        if g.initializer:
            t = g.initializer[draw.int(0, len(g.initializer) - 1)]
            if t.dims:
                t.dims[draw.int(0, len(t.dims) - 1)] = draw.choice(extreme[:4] + [10**6])
            else:
                t.dims.append(draw.choice([0, 2, 10**6]))
        else:
            dim = g.input[0].type.tensor_type.shape.dim
            dim[draw.int(0, len(dim) - 1)].dim_value = draw.choice([0, 1, 10**6])
    elif how == "optype":
        n = g.node[draw.int(0, len(g.node) - 1)]
        # not Reciprocal / Sqrt / Div / Pow: placed anywhere they amplify rounding near 0 past any tolerance
        n.op_type = draw.choice(
            [op for op in _UNARY + _BINARY if op not in ("Reciprocal", "Sqrt", "Div", "Pow")]
            + [
                "Conv",
                "MatMul",
                "Reshape",
                "Concat",
                "Gemm",
                "NoSuchOp",
                "Transpose",
                "Split",
                "Range",
                "Expand",
                "Tile",
            ]
        )
    elif how == "rewire":
        n = g.node[draw.int(0, len(g.node) - 1)]
        names = [v for nd in g.node for v in nd.output] + ["x", "missing", ""]
        if n.input:
            n.input[draw.int(0, len(n.input) - 1)] = draw.choice(names)
        else:
            n.input.append(draw.choice(names))
    else:  # drop
        del g.node[draw.int(0, len(g.node) - 1)]
    return model.SerializeToString(), feeds, f"{how} edit"


def case_onnx_mutate(seed: int) -> tuple[str, str]:
    data, feeds, how = mutated_model(seed)
    status, detail = run_model(data, feeds)
    return status, f"{how}: {detail}"


# -- resource soak -------------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _batches_it_takes(cg, base_shape: list, draw) -> list[int]:
    """The batch sizes of 1-4 the soak's model accepts: a constant may pin its batch dim (a (2, 1, 5)
    operand broadcasts with batch 1 or 2 only, a Reshape to (3, -1) needs a multiple of 3 elements), which
    its shape checks refuse with an InferShapeError or a ParamInvalidError."""
    from ..errors import InferShapeError, ParamInvalidError

    ok = []
    for b in (1, 2, 3, 4):
        try:
            cg.run({"x": draw.array([b] + base_shape[1:], np.float32)})
            ok.append(b)
        except (InferShapeError, ParamInvalidError):
            continue
    return ok or [1]


def case_soak(
    seed: int, *, eager: int = 10_000, compiled: int = 1_000, streams: bool = True, rss_slack: int = 64 << 20
) -> tuple[str, str]:
    """``eager`` mixed eager calls (``streams``: every 50th on a new Stream, dropped after it) and
    ``compiled`` compiled runs at varying shapes: afterwards the pool's live bytes are back to the
    baseline, the thread count is what it was and RSS grew by < rss_slack."""
    import gc
    import threading

    draw = RngDraw(seed)
    model, _ = random_model(seed)
    cg = compile_graph(load_onnx(model.SerializeToString()))
    mk = model.graph.input[0].type.tensor_type.shape.dim
    base_shape = [1] + [d.dim_value for d in mk[1:]]
    ops = ops_pkg
    calls = [
        lambda x: ops.relu(x),
        lambda x: ops.add(x, x),
        lambda x: ops.mul(x, 2.0),
        lambda x: ops.sigmoid(x),
        lambda x: ops.softmax(x, dim=-1),
        lambda x: ops.sum(x, dim=-1) if hasattr(ops, "sum") else ops.relu(x),
        lambda x: ops.matmul(x, ops.transpose(x, -1, -2)) if x.ndim >= 2 else ops.relu(x),
        lambda x: ops.gelu(x),
        lambda x: ops.tanh(x),
        lambda x: ops.exp(ops.tanh(x)),
    ]

    # a fixed set of shapes, all seen in the warm-up: the executor cache and the compiled plans are full
    # before the baseline, so what grows after it is a leak, not a cache
    shapes = [(draw.int(1, 4), draw.int(1, 17), draw.choice([3, 8, 16, 31])) for _ in range(8)]
    batches = _batches_it_takes(cg, base_shape, draw)

    def one_eager(i):
        x = tensor(draw.array(shapes[(i // len(calls)) % len(shapes)], np.float32))
        if streams and i % 50 == 49:  # a Stream nobody keeps: its worker thread must end with it
            s = Stream()
            y = ops.relu(x, stream=s)
            s.synchronize()
            return y
        return calls[i % len(calls)](x)

    def one_compiled(i):
        return cg.run({"x": draw.array([batches[i % len(batches)]] + base_shape[1:], np.float32)})

    def settle():
        _sync_all()
        gc.collect()

    # warm-up: kernels compiled, caches filled, then the baseline
    for i in range(len(calls) * len(shapes)):
        one_eager(i)
    for i in range(len(batches)):
        one_compiled(i)
    settle()
    live0, threads0, rss0 = memory.current_bytes(), threading.active_count(), _rss_bytes()
    checks, y, out = [], None, None
    for i in range(eager):
        y = one_eager(i)
        if i % 500 == 499:
            y.numpy()
    for i in range(compiled):
        out = one_compiled(i)
        if i % 100 == 99:
            [v.numpy() for v in out.values()]
    del y, out
    settle()
    live1, threads1, rss1 = memory.current_bytes(), threading.active_count(), _rss_bytes()
    if live1 != live0:
        checks.append(f"pool live bytes {live0} -> {live1}")
    if threads1 != threads0:
        checks.append(f"threads {threads0} -> {threads1}")
    if rss1 - rss0 > rss_slack:
        checks.append(f"RSS grew {(rss1 - rss0) >> 20} MiB (limit {rss_slack >> 20})")
    info = f"{eager} eager + {compiled} compiled runs; RSS {rss0 >> 20} -> {rss1 >> 20} MiB, threads {threads1}"
    return (FAIL, "; ".join(checks) + f" ({info})") if checks else (OK, info)


# -- dispatch --------------------------------------------------------------------------------------------------------
def run_spec(spec: dict) -> dict:
    """Run one case described by ``spec`` (``{"kind", "seed"}``, or ``{"kind": "op", "case": {...}}``
    for a drawn op case) in this process; returns ``{"status", "detail"}``."""
    kind = spec["kind"]
    if "cap" in spec:  # this case under another pool cap (None: none), the worker's cap restored after
        saved = context().pool.cap
        memory.set_cap(spec["cap"])
        try:
            return run_spec({k: v for k, v in spec.items() if k != "cap"})
        finally:
            memory.set_cap(saved)
    try:
        if kind == "op":
            status, detail = run_op_case(spec["case"], algo=spec.get("algo"))
        elif kind == "selftest":  # the harness' own test: a crash (abort) or a hang on request
            if spec["action"] == "crash":
                os.abort()
            if spec["action"] == "hang":
                time.sleep(3600)
            status, detail = OK, "selftest"
        elif kind == "soak":
            status, detail = case_soak(spec["seed"], **spec.get("options", {}))
        else:
            extra = {k: spec[k] for k in ("op", "domain", "kernel", "view") if k in spec}
            status, detail = _CASES[kind](spec["seed"], **extra)
    except Exception as exc:  # noqa: BLE001 - the generator or the harness itself: a finding too
        _drain_errors()
        status, detail = FAIL, "harness: " + _describe(exc)
    return {"status": status, "detail": detail}


_CASES = {
    "onnx_mutate": case_onnx_mutate,
    "op_schema": case_op_schema,
    "graph": case_graph,
    "out_view": case_out_view,
    "nan_inf": case_nan_inf,
}


def write_artifacts(spec: dict, result: dict, folder: Path) -> Path:
    """A failing case's files: ``case.json`` (spec and result), the model (``model.onnx``) and inputs
    (``inputs.npz``) where it has them, and ``repro.py`` that reruns it in-process."""
    name = f"{spec['kind']}-{spec.get('seed', 'drawn')}" + (f"-{spec['algo']}" if spec.get("algo") else "")
    d = Path(folder) / name
    d.mkdir(parents=True, exist_ok=True)
    kind = spec["kind"]
    try:
        if kind == "onnx_mutate":
            data, feeds, _ = mutated_model(spec["seed"])
            (d / "model.onnx").write_bytes(data)
            np.savez(d / "inputs.npz", **feeds)
        elif kind in ("graph", "soak"):
            model, feeds = random_model(spec["seed"] // 2 if kind == "graph" else spec["seed"])
            if kind == "graph" and spec["seed"] % 2:  # one registry op as a model
                ops = [
                    r
                    for r in _ops()
                    if r.domain in ("", "ai.onnx.ml") and r.category != "random" and r.name not in RANDOM_OPS
                ]
                sub = spec["seed"] // 2
                case = valid_case(ops[sub % len(ops)], sub // len(ops))
                built = None if case is None else op_model(case, len(_reference(ops[sub % len(ops)], case)))
                if built is not None:
                    model, feeds = built
            (d / "model.onnx").write_bytes(model.SerializeToString())
            np.savez(d / "inputs.npz", **feeds)
        elif kind == "op":
            case = spec["case"]
            np.savez(d / "inputs.npz", **{f"input{i}": x for i, x in enumerate(case["inputs"]) if x is not None})
            with open(d / "case.pkl", "wb") as f:
                pickle.dump(spec, f)
    except Exception as exc:  # noqa: BLE001 - the artifacts are a courtesy; the report still stands
        result = dict(result, artifact_error=repr(exc))
    (d / "case.json").write_text(
        json.dumps(
            {"spec": {k: v for k, v in spec.items() if k != "case"}, "op": spec.get("case", {}).get("op"), **result},
            indent=1,
            default=str,
        )
    )
    load = (
        "import pickle; spec = pickle.load(open(__file__.replace('repro.py', 'case.pkl'), 'rb'))"
        if kind == "op"
        else f"spec = {json.dumps({k: v for k, v in spec.items() if k != 'case'})}"
    )
    (d / "repro.py").write_text(
        "# reruns this case in-process (a crash or hang shows here directly)\n"
        f"from opsnn.tools.fuzz import run_spec\n{load}\nprint(run_spec(spec))\n"
    )
    return d


# -- worker processes ------------------------------------------------------------------------------------------------
def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(fd: int, deadline: float | None):
    head = _recv_exact(fd, 8, deadline)
    if head is None:
        return None
    body = _recv_exact(fd, struct.unpack("<Q", head)[0], deadline)
    return None if body is None else pickle.loads(body)


class WorkerPool:
    """Cases run one at a time in a worker process (``python -m opsnn.tools.fuzz --worker``); a case
    that crashes the worker or runs past ``timeout`` seconds ends as ``crash`` / ``hang`` and the
    next case gets a fresh worker. The worker's stderr goes to a log whose tail a crash report quotes;
    its memory pool is capped at ``$OPSNN_FUZZ_CAP_BYTES`` (default 1 GiB). A worker serves at most
    ``max_cases`` cases: every fused chain it compiles stays mapped for its life (~0.5 memory maps per
    graph case), and at vm.max_map_count (65530) a new kernel is an OutOfMemoryError."""

    def __init__(
        self,
        timeout: float = 60.0,
        env: dict | None = None,
        startup_timeout: float = 300.0,
        max_cases: int = 10_000,
    ):
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.log = None
        self.restarts = 0
        self.max_cases = max_cases
        self.served = 0  # cases the current worker has run

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self) -> bool:
        """A fresh worker, ready (opsnn imported: the case's time limit does not pay for the import)."""
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "opsnn.tools.fuzz", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=self.env,
        )
        try:
            return _recv(self.proc.stdout.fileno(), time.monotonic() + self.startup_timeout) == "ready"
        except TimeoutError:
            return False

    def _stop(self, kill: bool):
        p, self.proc = self.proc, None
        if p is None:
            return
        if kill:
            p.kill()
        else:
            try:
                p.stdin.close()
            except OSError:
                pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def _log_tail(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0, 2)
        size = self.log.tell()
        self.log.seek(max(0, size - 4000))
        return self.log.read().decode(errors="replace").strip().replace("\n", " | ")[-3500:]  # a faulthandler stack

    def run(self, spec: dict, timeout: float | None = None) -> dict:
        if self.proc is not None and self.served >= self.max_cases:
            self._stop(kill=False)
        if self.proc is None or self.proc.poll() is not None:
            self.served = 0
        if (self.proc is None or self.proc.poll() is not None) and not self._start():
            tail = self._log_tail()
            self._stop(kill=True)
            return {"status": CRASH, "detail": f"worker did not start: {tail}", "seconds": 0.0}
        t0 = time.monotonic()
        self.served += 1
        try:
            _send(self.proc.stdin, spec)
            res = _recv(self.proc.stdout.fileno(), t0 + (timeout or self.timeout))
        except TimeoutError:
            self._stop(kill=True)
            self.restarts += 1
            return {
                "status": HANG,
                "detail": f"no answer within {timeout or self.timeout:.0f} s",
                "seconds": time.monotonic() - t0,
            }
        except (BrokenPipeError, OSError):
            res = None
        if res is None:
            code = self.proc.wait() if self.proc is not None else None
            tail = self._log_tail()
            self._stop(kill=True)
            self.restarts += 1
            return {
                "status": CRASH,
                "detail": f"worker died (exit code {code}): {tail}",
                "seconds": time.monotonic() - t0,
            }
        res["seconds"] = time.monotonic() - t0
        return res

    def close(self):
        self._stop(kill=False)


def _worker_main() -> None:
    """Serve specs from stdin until it closes; answers go to the saved stdout (prints go to stderr)."""
    import faulthandler

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    faulthandler.enable()  # a crash prints every thread's Python stack to stderr: the failing case's log tail
    # a cap on the pool: a hostile model asking for gigabytes (pads of 10**6) ends in OutOfMemoryError
    # rather than minutes of legitimate work
    memory.set_cap(int(os.environ.get("OPSNN_FUZZ_CAP_BYTES", str(1 << 30))))
    _send(out, "ready")
    inp = sys.stdin.buffer.fileno()
    while True:
        spec = _recv(inp, None)
        if spec is None:
            return
        _send(out, run_spec(spec))


# -- the long run (opsnn fuzz) ---------------------------------------------------------------------------------------
def fuzz(
    minutes: float,
    *,
    out: str | None = None,
    seed: int = 0,
    kinds=KINDS,
    timeout: float = 120.0,
    soak_eager: int = 10_000,
    soak_compiled: int = 1_000,
    echo=print,
) -> dict:
    """Run the kinds round-robin for ``minutes``: case seeds ``seed, seed + 1, ...`` per kind; every
    failing case's files go to ``out``. Returns ``{kind: {status: count}}``."""
    kinds = [k for k in kinds if k in KINDS]
    counts = {k: {} for k in kinds}
    deadline = time.monotonic() + minutes * 60
    folder = Path(out) if out else None
    nxt = {k: seed for k in kinds}
    try:
        with WorkerPool(timeout=timeout) as pool:
            if "soak" in kinds:  # once, at full counts, first (the others are unbounded in number)
                spec = {"kind": "soak", "seed": seed, "options": {"eager": soak_eager, "compiled": soak_compiled}}
                _record(pool.run(spec, timeout=max(timeout, 1800)), spec, counts, folder, echo)
                kinds = [k for k in kinds if k != "soak"]
            i = 0
            while kinds and time.monotonic() < deadline:
                k = kinds[i % len(kinds)]
                i += 1
                spec = {"kind": k, "seed": nxt[k]}
                nxt[k] += 1
                _record(pool.run(spec), spec, counts, folder, echo)
    except KeyboardInterrupt:  # Ctrl-C: the counts so far, then the interrupt (the pool has stopped its worker)
        echo("interrupted; cases per kind so far:")
        _echo_counts(counts, echo)
        raise
    echo("cases per kind:")
    _echo_counts(counts, echo)
    return counts


def _echo_counts(counts: dict, echo) -> None:
    for k, c in counts.items():
        echo(f"  {k:12s} {sum(c.values()):6d}  " + ", ".join(f"{s} {n}" for s, n in sorted(c.items())))


def _record(res: dict, spec: dict, counts: dict, folder, echo) -> None:
    st = res["status"]
    counts[spec["kind"]][st] = counts[spec["kind"]].get(st, 0) + 1
    if st in FAILED:
        where = ""
        if folder is not None:
            where = f" -> {write_artifacts(spec, res, folder)}"
        echo(f"{st.upper()} {spec['kind']} seed {spec.get('seed')}: {res['detail'][:300]}{where}")
    elif st == ILL:  # not a failure, but listed: each is a model whose answer rounding decides
        echo(f"ILL-CONDITIONED {spec['kind']} seed {spec.get('seed')}: {res['detail'][:300]}")


def main(argv: list[str] | None = None) -> int:
    """``opsnn fuzz``: exit code 0 when no case failed, 1 when some did, 2 on bad arguments."""
    import argparse

    p = argparse.ArgumentParser(
        prog="opsnn fuzz",
        description="run opsnn's fuzzers for a while; every failing "
        "case's model, inputs and a repro script go to --out",
    )
    p.add_argument("--minutes", type=float, required=True, help="how long to run (the soak runs first, once)")
    p.add_argument("--out", default="fuzz-failures", help="folder for failing cases (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first case seed of every kind (default: %(default)s)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one case may run (default: %(default)s)")
    p.add_argument("--soak-eager", type=int, default=10_000, help="eager calls in the soak (default: %(default)s)")
    p.add_argument("--soak-compiled", type=int, default=1_000, help="compiled runs in the soak (default: %(default)s)")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or args.minutes <= 0 or args.timeout <= 0:
        p.error(
            f"--kinds takes {', '.join(KINDS)} (got {', '.join(bad)})" if bad else "--minutes and --timeout must be > 0"
        )
    try:
        counts = fuzz(
            args.minutes,
            out=args.out,
            seed=args.seed,
            kinds=kinds,
            timeout=args.timeout,
            soak_eager=args.soak_eager,
            soak_compiled=args.soak_compiled,
            echo=lambda line: print(line, flush=True),
        )
    except KeyboardInterrupt:
        return 130  # the shell's code for SIGINT; fuzz() printed the counts so far
    failed = sum(n for c in counts.values() for s, n in c.items() if s in FAILED)
    print(
        f"{sum(sum(c.values()) for c in counts.values())} cases, {failed} failed"
        + (f"; failing cases in {args.out}/" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker_main()
    else:
        sys.exit(main())
