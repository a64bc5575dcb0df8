"""Shape / index ops against independent oracles: numpy expressions written here, onnx.reference
(``ReferenceEvaluator``), ONNX spec examples, and each record's numpy reference (``algo="reference"``).

Data movement is exact (compared with ``array_equal`` on every dtype, NaN bit patterns
included). Resize: float32 rtol 1e-5 / atol 1e-5 against onnx.reference (float64 inside);
16-bit against the float32 result with 1e-2.
"""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError
from opsnn.kernels.cpu import shape as K

ops = opsnn.ops
aclnn = opsnn.aclnn

MOVE_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]


def rand(rng, shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.random(shape) > 0.5
    if dt.kind in "iu":
        return rng.integers(0, 100, shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def same(a, b):
    """Exact equality, dtype and shape included."""
    a = a.numpy() if isinstance(a, opsnn.Tensor) else a
    assert a.shape == b.shape, (a.shape, b.shape)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert np.array_equal(
        a.view(np.uint8) if a.dtype.itemsize == 1 else a,
        b.view(np.uint8) if b.dtype.itemsize == 1 else b,
        equal_nan=a.dtype.kind == "f",
    ), (a, b)


def onnx_ref(op, inputs, attrs=None, n_out=1):
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    node = helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **(attrs or {}))
    return ReferenceEvaluator(node).run(None, {n: a for n, a in zip(names, inputs) if n})


@pytest.fixture(params=["threads", "serial"])
def parallel(monkeypatch, request):
    """Plans made in this test take the numba paths even for small tensors: the parallel
    kernels, then their serial twins (copies below THREADS_MIN_BYTES)."""
    monkeypatch.setattr(K, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(K, "THREADS_MIN_BYTES", 0 if request.param == "threads" else 1 << 62)
    monkeypatch.setattr(K, "ROW_CHUNK", 7)  # long rows split into chunks too
    yield


# ---------------------------------------------------------------------------------------------
# Reshape / Flatten / Squeeze / Unsqueeze / Identity
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_reshape_dtypes(rng, no_leak, dtype):
    x = rand(rng, (2, 3, 4), dtype)
    same(ops.reshape(x, (4, -1)), x.reshape(4, 6))
    same(ops.reshape(opsnn.from_numpy(x.transpose(2, 0, 1)), (-1,)), x.transpose(2, 0, 1).reshape(-1))


def test_reshape_onnx_rules(rng):
    x = rand(rng, (2, 3, 4))
    same(ops.run_op("Reshape", [x, np.array([0, -1], np.int64)])[0], x.reshape(2, 12))
    same(
        ops.run_op("Reshape", [np.zeros((0, 3), np.float32), np.array([3, 0], np.int64)], {"allowzero": 1})[0],
        np.zeros((3, 0), np.float32),
    )
    same(ops.reshape(np.zeros((0, 4), np.int64), (2, 0, 2)), np.zeros((2, 0, 2), np.int64))
    with pytest.raises(ParamInvalidError, match="both -1 and 0"):
        ops.reshape(np.zeros((0, 4), np.int64), (2, 0, -1))
    assert aclnn.reshape.prepare(x, (6, 4)).kernel_name == "reshape_copy"


def test_reshape_errors(rng):
    x = rand(rng, (2, 3, 4))
    with pytest.raises(ParamInvalidError, match=r"\(5, 5\) has 25 elements.*\(2, 3, 4\) has 24"):
        ops.reshape(x, (5, 5))
    with pytest.raises(ParamInvalidError, match="-1"):
        ops.reshape(x, (-1, -1))
    with pytest.raises(ParamInvalidError, match="not a multiple of 5"):
        ops.reshape(x, (5, -1))
    with pytest.raises(DTypeError):
        ops.run_op("Reshape", [x, np.array([24.0])])


def test_flatten_squeeze_unsqueeze_identity(rng, no_leak):
    x = rand(rng, (2, 1, 3, 1))
    same(ops.flatten(x), x.reshape(-1))
    same(ops.flatten(x, 1, 2), x.reshape(2, 3, 1))
    z = np.zeros((2, 0, 3), np.float32)  # zero-size: the merged dim cannot be inferred, it is spelled out
    assert ops.flatten(z, 1).shape == (2, 0) and ops.flatten(z, 0, 1).shape == (0, 3)
    # shape(): the dims as an int64 tensor; a slice's ends or a reshape's target taken from it are
    # recorded when tracing, so the compiled graph follows the sizes it is run with
    same(ops.shape(x), np.array([2, 1, 3, 1], np.int64))
    same(ops.shape(x, 1, 3), np.array([1, 3], np.int64))
    same(ops.shape(x, -2), np.array([3, 1], np.int64))
    table = opsnn.tensor(np.arange(40, dtype=np.float32).reshape(20, 2))

    def head_rows(v, w):  # the first len(v) rows of table, shaped like w
        return ops.reshape(ops.slice(table, [0], ops.shape(v, 0, 1), axes=[0]), ops.shape(w))

    cg = opsnn.compile(
        head_rows,
        [np.zeros(3, np.float32), np.zeros((3, 2), np.float32)],
        dynamic_dims={0: {0: "n"}, 1: {0: "p", 1: "q"}},
    )
    assert [n.op_type for n in cg.graph.nodes if n.op_type == "Shape"] == ["Shape", "Shape"]
    got = cg.run([np.zeros(6, np.float32), np.zeros((4, 3), np.float32)])[0]
    same(got, np.arange(12, dtype=np.float32).reshape(4, 3))
    assert cg.mode == "compiled"  # the shapes fold when each plan is made: no interpreter
    # traced with a dynamic batch, flatten(x, 1) flattens the batch it is run with (not the example's)
    cg = opsnn.compile(lambda v: ops.flatten(v, 1), [x], dynamic_dims={0: {0: "batch"}})
    y = rand(rng, (5, 1, 3, 1))
    same(cg.run([y])[0], y.reshape(5, 3))
    for axis, want in [(0, (1, 6)), (2, (2, 3)), (-1, (6, 1)), (4, (6, 1)), (-4, (1, 6))]:
        same(ops.run_op("Flatten", [x], {"axis": axis})[0], x.reshape(want))
    same(ops.squeeze(x), x.reshape(2, 3))
    same(ops.squeeze(x, -1), x.reshape(2, 1, 3))
    same(ops.squeeze(x, (1, 3)), x.reshape(2, 3))
    same(ops.unsqueeze(x, 0), x[None])
    same(ops.unsqueeze(x, (0, -1)), x[None, ..., None])
    same(ops.identity(opsnn.from_numpy(x.T)), x.T.copy())
    with pytest.raises(ParamInvalidError, match="cannot squeeze axis 0 of size 2"):
        ops.squeeze(x, 0)
    with pytest.raises(ParamInvalidError, match="repeated axes"):
        ops.unsqueeze(x, (1, 1))
    with pytest.raises(ParamInvalidError, match="out of range"):
        ops.run_op("Flatten", [x], {"axis": 5})


# ---------------------------------------------------------------------------------------------
# Transpose
# ---------------------------------------------------------------------------------------------
PERMS = [(0, 1, 2, 3), (0, 2, 3, 1), (0, 3, 1, 2), (3, 2, 1, 0), (1, 0, 2, 3), (2, 0, 3, 1)]


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_transpose_dtypes(rng, dtype):
    x = rand(rng, (2, 3, 5, 7), dtype)
    for p in PERMS:
        same(ops.transpose(x, p), np.ascontiguousarray(x.transpose(p)))
    same(ops.transpose(x[..., 0]), np.ascontiguousarray(x[..., 0].T))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_transpose_parallel_paths(rng, parallel, dtype):
    x = rand(rng, (3, 9, 17, 33), dtype)
    modes = set()
    for p in PERMS + [(1, 2, 3, 0), (0, 1, 3, 2)]:
        ex = aclnn.transpose.prepare(x, p)
        modes.add(ex.plan[0].mode)
        same(ex.run(), np.ascontiguousarray(x.transpose(p)))
    assert {"rows", "tiles"} <= modes


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((1, 128, 12, 64), (0, 2, 1, 3)),
        ((1, 12, 128, 64), (0, 2, 1, 3)),
        ((1, 128, 12, 64), (0, 2, 3, 1)),
        ((2, 12, 128, 64), (0, 1, 3, 2)),
        ((3, 130, 5, 33), (0, 2, 1, 3)),
        ((1, 512, 16, 64), (0, 2, 1, 3)),
        ((1, 1, 128, 768), (0, 2, 1, 3)),
    ],
)
def test_transpose_default_plans(rng, shape, perm):
    """At the default thresholds: BERT's head split/merge (serial row copies), tiles, and a
    copy large enough for the threads (2 MiB)."""
    x = rand(rng, shape)
    ex = aclnn.transpose.prepare(x, perm)
    p = ex.plan[0]
    assert p.threads == (x.nbytes >= K.THREADS_MIN_BYTES)
    same(ex.run(), np.ascontiguousarray(x.transpose(perm)))


def test_transpose_api_forms(rng, no_leak):
    x = rand(rng, (2, 3, 4))
    same(ops.transpose(x, 0, 2), np.ascontiguousarray(x.swapaxes(0, 2)))
    same(ops.transpose(x, -1, 0), np.ascontiguousarray(x.swapaxes(-1, 0)))
    same(ops.permute(x, 2, 0, 1), np.ascontiguousarray(x.transpose(2, 0, 1)))
    same(ops.permute(x, (-1, 0, 1)), np.ascontiguousarray(x.transpose(2, 0, 1)))
    same(ops.transpose(opsnn.tensor(x).transpose(0, 1), [2, 1, 0]), np.ascontiguousarray(x.swapaxes(0, 1).T))
    same(ops.transpose(np.zeros((0, 3, 2), np.int64), [1, 2, 0]), np.zeros((3, 2, 0), np.int64))
    assert aclnn.transpose.prepare(x, [1, 0, 2]).kernel_name == "transpose_blocked"


def test_transpose_bad_perm(rng):
    x = rand(rng, (2, 3, 4))
    for bad in ([0, 0, 1], [0, 1], [0, 1, 3]):
        with pytest.raises(ParamInvalidError, match="not a permutation"):
            ops.transpose(x, bad)
    with pytest.raises(ParamInvalidError, match="out of range"):
        ops.transpose(x, 0, 3)


# ---------------------------------------------------------------------------------------------
# Concat / Split
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_concat_split_dtypes(rng, dtype):
    a, b, c = rand(rng, (2, 3, 4), dtype), rand(rng, (2, 1, 4), dtype), rand(rng, (2, 0, 4), dtype)
    same(ops.concat([a, b, c], dim=1), np.concatenate([a, b, c], 1))
    same(ops.concat([a, a], dim=-1), np.concatenate([a, a], -1))
    parts = ops.split(a, [1, 0, 2], dim=1)
    for got, want in zip(parts, np.split(a, [1, 1], axis=1)):
        same(got, want)


def test_concat_split_parallel(rng, parallel):
    a, b = rand(rng, (5, 6, 7)), rand(rng, (5, 2, 7))
    same(aclnn.concat.prepare([a, opsnn.from_numpy(b[:, ::-1]), a], dim=1).run(), np.concatenate([a, b[:, ::-1], a], 1))
    same(aclnn.concat.prepare([a, a], dim=0).run(), np.concatenate([a, a], 0))
    for got, want in zip(aclnn.split.prepare(a, 4, dim=2).run(), np.split(a, [4], axis=2)):
        same(got, want)


def test_concat_errors(rng):
    a = rand(rng, (2, 3))
    with pytest.raises(DTypeError, match="input 1 has dtype int64"):
        ops.concat([a, a.astype(np.int64)])
    with pytest.raises(InferShapeError, match=r"input 1 has shape \(3, 3\)"):
        ops.concat([a, rand(rng, (3, 3))], dim=1)
    with pytest.raises(ParamInvalidError, match="axis 2 is out of range"):
        ops.concat([a, a], dim=2)
    assert aclnn.concat.prepare([a, a]).kernel_name == "concat_copy"


def test_split_forms(rng, no_leak):
    x = rand(rng, (7, 4))
    got = ops.split(x, 3)
    assert [g.shape for g in got] == [(3, 4), (3, 4), (1, 4)]
    same(got[2], x[6:])
    # ONNX: num_outputs (ceil-sized chunks, last smaller) or the number of outputs
    outs = ops.run_op("Split", [x], {"num_outputs": 3}, num_outputs=3)
    assert [o.shape[0] for o in outs] == [3, 3, 1]
    outs = ops.run_op("Split", [x[:6]], {"axis": 0}, num_outputs=2)
    assert [o.shape[0] for o in outs] == [3, 3]
    outs = ops.run_op("Split", [x, np.array([1, 3], np.int64)], {"axis": -1}, num_outputs=2)
    same(outs[1], x[:, 1:])
    with pytest.raises(ParamInvalidError, match="sum to the axis length 4"):
        ops.run_op("Split", [x, np.array([1, 2], np.int64)], {"axis": 1}, num_outputs=2)
    # the output count follows the `split` input when num_outputs is not given
    assert [t.shape[1] for t in ops.run_op("Split", [x, np.array([1, 3], np.int64)], {"axis": 1})] == [1, 3]


# ---------------------------------------------------------------------------------------------
# Slice
# ---------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=3), st.data())
def test_slice_matches_python_slicing(shape, data):
    x = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    r = len(shape)
    axes = data.draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=lambda a: a % r))
    big = st.integers(-8, 8) | st.sampled_from([-(2**62), 2**62])
    starts = [data.draw(big) for _ in axes]
    ends = [data.draw(big) for _ in axes]
    steps = [data.draw(st.integers(-3, 3).filter(bool)) for _ in axes]
    idx = [slice(None)] * r
    for a, s, e, p in zip(axes, starts, ends, steps):
        # the one place ONNX's clamping differs from Python's: stepping backwards from before
        # the first element starts at element 0 (ONNX clamps start to [0, dim - 1])
        if p < 0 and s < -shape[a % r]:
            s = 0
        idx[a % r] = slice(s, e, p)
    same(ops.slice(x, starts, ends, axes, steps), x[tuple(idx)].copy())


def test_slice_dtypes_parallel_and_reference(rng, parallel):
    for dt in (np.float32, np.uint8, np.float16, np.int64):
        x = rand(rng, (4, 9, 11), dt)
        for starts, ends, axes, steps in [
            ([1, 10], [4, -12], [1, 2], [2, -3]),
            ([-1], [-100], [0], [-1]),
            ([0, 2], [9, 7], [-1, -2], [1, 1]),
        ]:
            idx = [slice(None)] * 3
            for a, s, e, p in zip(axes, starts, ends, steps):
                idx[a] = slice(s, e, p)
            want = x[tuple(idx)].copy()
            same(aclnn.slice.prepare(x, starts, ends, axes, steps).run(), want)
            same(aclnn.slice.prepare(x, starts, ends, axes, steps, algo="reference").run(), want)


def test_slice_errors(rng):
    x = rand(rng, (3, 4))
    with pytest.raises(ParamInvalidError, match="steps must be non-zero"):
        ops.slice(x, [0], [2], [0], [0])
    with pytest.raises(ParamInvalidError, match="appears twice"):
        ops.slice(x, [0, 0], [1, 1], [0, -2])
    with pytest.raises(ParamInvalidError, match="lengths differ"):
        ops.slice(x, [0, 1], [1, 2], [0])


# ---------------------------------------------------------------------------------------------
# Gather / embedding
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_gather_dtypes(rng, dtype):
    x = rand(rng, (4, 5, 3), dtype)
    idx = np.array([[0, -1], [-3, 2]], np.int64)
    for axis in (0, 1, -1):
        same(ops.gather(x, idx, axis=axis), np.take(x, idx % x.shape[axis], axis=axis))
    same(ops.gather(x, np.array(2, np.int32), axis=1), x[:, 2].copy())
    same(ops.index_select(x, 0, [3, 0, 3]), x[[3, 0, 3]])


def test_gather_parallel_empty_noncontiguous(rng, parallel):
    x = rand(rng, (6, 7, 5))
    idx = rng.integers(-7, 7, (3, 4))
    for axis in (0, 1, 2):
        i = idx % x.shape[axis] - (x.shape[axis] if axis == 1 else 0)
        same(aclnn.gather.prepare(x, i, axis=axis).run(), np.take(x, i % x.shape[axis], axis=axis))
    same(
        aclnn.gather.prepare(opsnn.from_numpy(x.transpose(2, 0, 1)), np.array([1]), axis=0).run(),
        x.transpose(2, 0, 1)[[1]],
    )
    same(ops.gather(x, np.zeros((0, 2), np.int64), axis=1), np.zeros((6, 0, 2, 5), np.float32))
    same(ops.gather(np.zeros((0, 3), np.float32), np.array([1, 2]), axis=1), np.zeros((0, 2), np.float32))
    assert aclnn.gather.prepare(x, idx, axis=0).kernel_name == "gather_rows"


def test_gather_out_of_range(rng):
    x = rand(rng, (4, 5))
    # data checks inside kernels keep their typed error
    with pytest.raises(ParamInvalidError) as ei:
        ops.gather(x, np.array([1, 5, 0]), axis=1)
    assert "index 5 at position (1,)" in str(ei.value) and "size 5" in str(ei.value)
    with pytest.raises(ParamInvalidError, match="index -5"):
        ops.gather(x, np.array([[-5]]), axis=0)
    with pytest.raises(DTypeError):
        ops.gather(x, np.array([1.0]))


def test_embedding(rng, no_leak):
    w = rand(rng, (10, 4))
    ids = np.array([[1, 9], [0, 1]], np.int64)
    same(ops.embedding(ids, w), w[ids])
    same(ops.embedding(opsnn.tensor(ids.astype(np.int32)), w), w[ids])
    with pytest.raises(ParamInvalidError, match=r"id 10 at position \(1, 0\).*vocabulary of 10 rows"):
        ops.embedding(np.array([[1, 2], [10, 0]]), w)
    with pytest.raises(ParamInvalidError, match="id -1"):
        ops.embedding(np.array([-1]), w)
    with pytest.raises(ParamInvalidError, match="ids must be int32 or int64, got float64"):
        ops.embedding(np.array([1.0]), w)


# ---------------------------------------------------------------------------------------------
# Pad / CenterCropPad
# ---------------------------------------------------------------------------------------------
NP_MODE = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@pytest.mark.parametrize("mode", sorted(NP_MODE))
def test_pad_torch_order_modes(rng, no_leak, mode):
    x = rand(rng, (2, 3, 4, 5))
    pads = (1, 2, 3, 0)  # last dim (1, 2), 2nd-last dim (3, 0)
    want = np.pad(
        x,
        [(0, 0), (0, 0), (3, 0), (1, 2)],
        mode=NP_MODE[mode],
        **({"constant_values": 1.5} if mode == "constant" else {}),
    )
    same(ops.pad(x, pads, mode=mode, value=1.5), want.astype(np.float32))
    same(
        ops.pad(opsnn.from_numpy(x.transpose(0, 1, 3, 2)), (1, 1), mode=mode, value=1.5),
        np.pad(
            x.transpose(0, 1, 3, 2),
            [(0, 0)] * 3 + [(1, 1)],
            mode=NP_MODE[mode],
            **({"constant_values": 1.5} if mode == "constant" else {}),
        ).astype(np.float32),
    )


@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_pad_dtypes_and_crop(rng, dtype):
    x = rand(rng, (3, 6), dtype)
    same(ops.pad(x, (-1, 2, 1, -2)), np.pad(x[:-2, 1:], [(1, 0), (0, 2)]).astype(x.dtype))
    same(ops.pad(x, (2, 3), mode="reflect"), np.pad(x, [(0, 0), (2, 3)], mode="reflect"))


def test_pad_onnx_inputs_and_parallel(rng, parallel):
    x = rand(rng, (3, 4, 9))
    pads = np.array([2, 0, 3, 1], np.int64)  # axes (0, 2): begins (2, 0), ends (3, 1)
    for mode in ("constant", "edge", "wrap", "reflect"):
        cv = np.array(7.0, np.float32) if mode == "constant" else None
        ex = aclnn.prepare("Pad", [x, pads, cv, np.array([0, -1], np.int64)], {"mode": mode})
        assert ex.kernel_name == "pad_maps" and ex.plan.mode == "numba"
        want = onnx_ref("Pad", [x, pads, cv, np.array([0, -1], np.int64)], {"mode": mode})[0]
        same(ex.run(), want)
        ref = aclnn.prepare("Pad", [x, pads, cv, np.array([0, -1], np.int64)], {"mode": mode}, algo="reference")
        same(ref.run(), want)
    # reflect wider than the dim reflects repeatedly, like numpy
    same(ops.pad(x, (10, 10), mode="reflect"), np.pad(x, [(0, 0), (0, 0), (10, 10)], mode="reflect"))
    # negative pads crop; the last dim's interior is one row copy
    same(aclnn.pad.prepare(x, (-1, 2, 1, -2)).run(), np.pad(x[:, :-2, 1:], [(0, 0), (1, 0), (0, 2)]))
    same(aclnn.pad.prepare(x, (3, -4), mode="replicate").run(), np.pad(x[..., :-4], [(0, 0)] * 2 + [(3, 0)], "edge"))


def _pad_constant_oracle(x, widths, cv):
    """out[j] = x[j - before] inside the input, else cv, per axis (ONNX constant Pad, negative pads too)."""
    out = np.full(tuple(d + b + e for d, (b, e) in zip(x.shape, widths)), cv, x.dtype)
    for j in np.ndindex(out.shape):
        src = tuple(i - b for i, (b, _) in zip(j, widths))
        if all(0 <= s < d for s, d in zip(src, x.shape)):
            out[j] = x[src]
    return out


@pytest.mark.parametrize("parallel_maps", [False, True])
def test_pad_constant_crop_past_the_input(rng, parallel_maps, monkeypatch):
    # a crop longer than the input on one side eats into the other side's padding (fuzz nan_inf 31641, 34391)
    if parallel_maps:
        monkeypatch.setattr(K, "PARALLEL_MIN_BYTES", 0)
    cases = [
        ((3, 3, 1, 2), [-3, 2], [3], [(0, 0), (0, 0), (0, 0), (-3, 2)]),
        ((3, 1), [2, 1, -1, -2], None, [(2, -1), (1, -2)]),
        ((4,), [-5, 3], None, [(-5, 3)]),
        ((2, 4), [2, -4], [1], [(0, 0), (2, -4)]),
    ]
    for shape, pads, axes, widths in cases:
        x = rand(rng, shape)
        cv = np.array(2.5, np.float32)
        ins = [x, np.array(pads, np.int64), cv] + ([np.array(axes, np.int64)] if axes else [])
        want = _pad_constant_oracle(x, widths, np.float32(2.5))
        for algo in (None, "reference"):
            same(aclnn.prepare("Pad", ins, {"mode": "constant"}, algo=algo).run(), want)


@pytest.mark.parametrize("parallel_maps", [False, True])
def test_pad_empty_inputs_and_outputs(parallel_maps, monkeypatch):
    # an empty input padded in constant mode is all fill (the numpy path indexed the empty input: an
    # IndexError); an output emptied by the pads needs no source elements in any mode (onnxruntime agrees)
    if parallel_maps:
        monkeypatch.setattr(K, "PARALLEL_MIN_BYTES", 0)
    for shape, pads in [((0,), [3, 2]), ((4, 0), [0, 1, 2, 2]), ((2, 3, 0), [0, -2, 2, 0, 0, 0])]:
        x = np.zeros(shape, np.float32)
        want = np.full(
            tuple(d + b + e for d, b, e in zip(shape, pads[: len(shape)], pads[len(shape) :])), 1.5, np.float32
        )
        for algo in (None, "reference"):
            same(
                aclnn.prepare("Pad", [x, np.array(pads, np.int64), np.array(1.5, np.float32)], {}, algo=algo).run(),
                want,
            )
    for mode in ("edge", "reflect", "wrap"):
        for shape, pads in [((0,), [1, -1]), ((1, 0, 1), [0, 1, 0, 0, -1, 0])]:
            x = np.zeros(shape, np.float32)
            out = tuple(d + b + e for d, b, e in zip(shape, pads[: len(shape)], pads[len(shape) :]))
            for algo in (None, "reference"):
                got = aclnn.prepare("Pad", [x, np.array(pads, np.int64)], {"mode": mode}, algo=algo).run().numpy()
                assert got.shape == out and 0 in out, (mode, shape, pads, algo)


def test_pad_errors(rng):
    x = rand(rng, (2, 3))
    with pytest.raises(ParamInvalidError, match="mode must be one of"):
        ops.pad(x, (1, 1), mode="symmetric")
    with pytest.raises(ParamInvalidError, match="negative size"):
        ops.pad(x, (-2, -2))
    with pytest.raises(ParamInvalidError, match="expected 2 x 2 axes"):
        ops.run_op("Pad", [x, np.array([1, 1, 1], np.int64)])
    with pytest.raises(ParamInvalidError, match="no input elements"):
        ops.pad(np.zeros((2, 0), np.float32), (1, 1), mode="replicate")


def test_center_crop_pad(rng):
    x = rand(rng, (5, 6, 3))
    for shape, axes in [((3, 8), [0, 1]), ((6, 3), [-2, -1]), ((2, 9, 3), None)]:
        want = onnx_ref("CenterCropPad", [x, np.array(shape, np.int64)], {"axes": axes} if axes else {})[0]
        same(ops.center_crop_pad(x, shape, axes), want)


# ---------------------------------------------------------------------------------------------
# Expand / Tile / DepthToSpace / SpaceToDepth
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_expand_tile_dtypes(rng, dtype):
    x = rand(rng, (3, 1, 2), dtype)
    same(ops.expand(x, 2, 3, 4, 2), np.broadcast_to(x, (2, 3, 4, 2)).copy())
    same(ops.expand(x, -1, 5, -1), np.broadcast_to(x, (3, 5, 2)).copy())
    same(ops.run_op("Expand", [x, np.array([1, 1], np.int64)])[0], x.copy())  # bidirectional
    same(ops.tile(x, (2, 3, 1)), np.tile(x, (2, 3, 1)))
    same(ops.tile(x, (2,)), np.tile(x, (2,)))
    same(ops.tile(x, (2, 1, 1, 2)), np.tile(x, (2, 1, 1, 2)))
    same(ops.tile(x, (0, 1, 1)), np.tile(x, (0, 1, 1)))


def test_expand_tile_parallel(rng, parallel):
    x = rand(rng, (4, 1, 6))
    same(aclnn.expand.prepare(x, 4, 5, 6).run(), np.broadcast_to(x, (4, 5, 6)).copy())
    same(aclnn.expand.prepare(x[:, :, :1], 4, 1, 9).run(), np.broadcast_to(x[:, :, :1], (4, 1, 9)).copy())
    same(aclnn.tile.prepare(x, (2, 3, 2)).run(), np.tile(x, (2, 3, 2)))


def test_expand_tile_errors(rng):
    x = rand(rng, (3, 2))
    with pytest.raises(ParamInvalidError, match="cannot broadcast"):
        ops.run_op("Expand", [x, np.array([4, 2], np.int64)])
    with pytest.raises(ParamInvalidError, match="repeats must be >= 0"):
        ops.run_op("Tile", [x, np.array([1, -1], np.int64)])
    with pytest.raises(ParamInvalidError, match="repeats has 1 entries"):
        ops.run_op("Tile", [x, np.array([2], np.int64)])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space_roundtrip(rng, mode):
    x = rand(rng, (2, 8, 3, 5))
    y = ops.depth_to_space(x, 2, mode=mode)
    b, c, h, w = x.shape
    if mode == "DCR":  # spec formula
        want = x.reshape(b, 2, 2, c // 4, h, w).transpose(0, 3, 4, 1, 5, 2).reshape(b, c // 4, h * 2, w * 2)
    else:
        want = x.reshape(b, c // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(b, c // 4, h * 2, w * 2)
    same(y, want)
    same(ops.space_to_depth(y, 2, mode=mode), x)
    same(ops.space_to_depth(y, 2, mode=mode, algo="reference"), x)
    # pixel_shuffle: out[n, c, h*r + i, w*r + j] = in[n, c*r*r + i*r + j, h, w]
    ps = ops.pixel_shuffle(x, 2).numpy()
    assert ps[1, 1, 2 * 2 + 1, 3 * 2 + 0] == x[1, 1 * 4 + 1 * 2 + 0, 2, 3]
    same(ops.pixel_unshuffle(ps, 2), x)
    with pytest.raises(ParamInvalidError, match="not divisible"):
        ops.depth_to_space(rand(rng, (1, 6, 2, 2)), 2)
    with pytest.raises(ParamInvalidError, match="4-D"):
        ops.space_to_depth(rand(rng, (6, 2, 2)), 2)


# ---------------------------------------------------------------------------------------------
# Shape / Size / Range / ConstantOfShape / EyeLike / Trilu / OneHot
# ---------------------------------------------------------------------------------------------
def test_shape_size(rng):
    x = rand(rng, (2, 3, 4, 5))
    for start, end in [(0, None), (1, 3), (-3, -1), (-10, 10), (3, 1)]:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        same(ops.run_op("Shape", [x], attrs)[0], np.array(x.shape[start:end], np.int64))
    same(ops.run_op("Size", [x])[0], np.array(120, np.int64))
    same(ops.run_op("Size", [np.zeros((0, 3))])[0], np.array(0, np.int64))


def test_range(no_leak):
    same(ops.arange(5), np.arange(5, dtype=np.int64))
    same(ops.arange(10, 4, -2), np.array([10, 8, 6], np.int64))
    same(ops.arange(1, 2.5, 0.5), np.array([1, 1.5, 2], np.float32))
    same(ops.arange(3, 3), np.zeros(0, np.int64))
    got = ops.arange(0, 2050, 1, dtype="float16").numpy()  # start + i * delta: no fp16 stalling at 2048
    assert got.shape == (2050,) and got[2047] == 2047 and got[-1] == np.float16(2049)
    with pytest.raises(ParamInvalidError, match="delta must be non-zero"):
        ops.arange(0, 5, 0)
    with pytest.raises(DTypeError):
        ops.run_op("Range", [np.array(0, np.int64), np.array(5, np.int32), np.array(1, np.int64)])


def test_constant_of_shape_eye_like():
    same(ops.constant_of_shape((2, 3)), np.zeros((2, 3), np.float32))
    same(ops.constant_of_shape((2,), 7, dtype="int32"), np.full(2, 7, np.int32))
    same(ops.constant_of_shape((), True), np.array(True))
    same(
        ops.run_op("ConstantOfShape", [np.array([2, 0], np.int64)], {"value": np.array([3.5])})[0],
        np.zeros((2, 0), np.float64),
    )
    x = np.zeros((3, 5), np.int32)
    for k in (-4, -1, 0, 2, 9):
        same(ops.eye_like(x, k=k), np.eye(3, 5, k, dtype=np.int32))
    same(ops.eye_like(x, dtype="float64"), np.eye(3, 5))
    same(ops.run_op("EyeLike", [x], {"dtype": 1})[0], np.eye(3, 5, dtype=np.float32))  # ONNX dtype code FLOAT


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, ml_dtypes.bfloat16])
def test_trilu(rng, dtype):
    x = rand(rng, (2, 4, 5), dtype)
    for k in (-5, -1, 0, 2, 7):
        same(ops.triu(x, k), np.triu(x, k))
        same(ops.tril(x, k), np.tril(x, k))
    same(ops.triu(x, 1, algo="reference"), np.triu(x, 1))
    with pytest.raises(InferShapeError, match="rank >= 2"):
        ops.triu(x[0, 0])


def test_one_hot(rng):
    idx = np.array([[0, 3], [-1, 5]], np.int64)
    want = np.zeros((2, 2, 4), np.int64)
    want[0, 0, 0] = want[0, 1, 3] = want[1, 0, 3] = 1  # -1 wraps to 3, 5 is out of range: all off
    same(ops.one_hot(idx, 4), want)
    vals = np.array([-1.0, 2.0], np.float32)
    for axis in (0, 1, -1, -3):
        got = ops.run_op("OneHot", [idx, np.array(4, np.int64), vals], {"axis": axis})[0]
        same(got, onnx_ref("OneHot", [idx, np.array(4, np.int64), vals], {"axis": axis})[0])
    same(ops.one_hot(np.array(2), 3), np.array([0, 0, 1], np.int64))
    same(ops.one_hot(np.array([0, 2])), np.eye(3, dtype=np.int64)[[0, 2]])


@pytest.mark.parametrize("depth", [np.inf, -np.inf, np.nan])
def test_onehot_non_finite_depth_is_refused(depth):
    """found by tests/fuzz: an infinite depth escaped as Python's OverflowError"""
    with pytest.raises(ParamInvalidError, match="depth"):
        ops.run_op("OneHot", [np.array([0, 1], np.int64), np.array(depth, np.float32), np.array([0, 1], np.float32)])


# ---------------------------------------------------------------------------------------------
# GatherElements / GatherND / ScatterElements / ScatterND / Scatter
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_gather_scatter_elements(rng, dtype):
    x = rand(rng, (3, 4, 5), dtype)
    for axis in (0, 1, -1):
        n = x.shape[axis]
        idx = rng.integers(-n, n, (3, 2, 5) if axis != -1 else (3, 4, 2))
        if axis == 0:
            idx = rng.integers(-3, 3, (2, 4, 5))
        want = np.take_along_axis(x, idx % n, axis)
        same(ops.gather_elements(x, idx, axis), want)
        same(ops.gather_elements(x, idx, axis, algo="reference"), want)
    idx = rng.integers(-4, 4, x.shape)
    same(ops.gather_elements(x, idx, 1), onnx_ref("GatherElements", [x, idx], {"axis": 1})[0])
    upd = rand(rng, (3, 4, 1), dtype)
    idx = np.array([[[0], [4], [-1], [2]]] * 3, np.int64)
    same(ops.scatter_elements(x, idx, upd, axis=2), onnx_ref("ScatterElements", [x, idx, upd], {"axis": 2})[0])
    same(
        ops.run_op("Scatter", [x, idx, upd], {"axis": -1})[0],
        onnx_ref("ScatterElements", [x, idx, upd], {"axis": 2})[0],
    )


def test_split_with_a_0d_split_input_is_refused_typed():
    """found by tests/fuzz: a 0-d 'split' made the output count raise Python's TypeError (len() of unsized)"""
    with pytest.raises(ParamInvalidError, match="split"):
        ops.run_op("Split", [np.zeros((5, 5, 1), np.int64), np.array(0, np.int64)], {"axis": 2})


def test_split_with_an_empty_split_input_uses_num_outputs(rng):
    """An empty 'split' is absent (num_outputs decides, as shape inference reads it): the output count
    said 0 and the kernel indexed past its outputs (found by opsnn fuzz, op_schema 84930)."""
    x = rand(rng, (3, 4, 3))
    outs = ops.run_op("Split", [x, np.zeros(0, np.int64)], {"axis": 2, "num_outputs": 3})
    assert len(outs) == 3
    for o, w in zip(outs, onnx_ref("Split", [x], {"axis": 2, "num_outputs": 3}, n_out=3)):
        same(o, w)


def test_scatter_elements_indices_longer_than_data_off_axis(rng):
    """Off the scattered (gathered) axis indices address data by position: longer than data there is
    refused at prepare (found by tests/fuzz: a KernelError wrapping numpy's IndexError at run)."""
    x, idx = rand(rng, (3, 3, 2)), np.zeros((2, 3, 5), np.int64)
    with pytest.raises(InferShapeError, match="axis 2"):
        ops.scatter_elements(x, idx, rand(rng, (2, 3, 5)), axis=0)
    same(ops.scatter_elements(x, idx[:, :, :2], np.ones((2, 3, 2), np.float32), axis=0)[0, 0], np.ones(2, np.float32))
    with pytest.raises(InferShapeError, match="axis 2"):
        ops.gather_elements(x, idx, 0)
    same(ops.gather_elements(x, idx[:, :, :2], 0), np.take_along_axis(x, idx[:, :, :2], 0))


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_reductions(rng, reduction):
    x = rand(rng, (4, 3))
    idx = np.array([[1, 0, 2], [1, 3, 2]], np.int64)  # duplicate targets accumulate
    upd = rand(rng, (2, 3))
    want = onnx_ref("ScatterElements", [x, idx, upd], {"axis": 0, "reduction": reduction})[0]
    np.testing.assert_allclose(ops.scatter_elements(x, idx, upd, 0, reduction).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(
        ops.scatter_elements(x, idx, upd, 0, reduction, algo="reference").numpy(), want, rtol=1e-6
    )
    ind = np.array([[1], [3], [1]], np.int64)
    upd = rand(rng, (3, 3))
    want = onnx_ref("ScatterND", [x, ind, upd], {"reduction": reduction})[0]
    np.testing.assert_allclose(ops.scatter_nd(x, ind, upd, reduction).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(ops.scatter_nd(x, ind, upd, reduction, algo="reference").numpy(), want, rtol=1e-6)


@pytest.mark.parametrize(
    "data_shape,ind_shape,batch_dims",
    [((2, 3), (4, 0), 0), ((2, 3, 4), (2, 5, 0), 1), ((5, 2, 0), (5, 2, 0), 0), ((2, 3, 4), (2, 0, 1), 1)],
)
def test_gather_nd_empty_index_tuples_and_empty_outputs(rng, data_shape, ind_shape, batch_dims):
    # an index tuple of length 0 addresses the whole (batch's) data, as onnxruntime gives it; the kernel's
    # reshape(..., -1, 0) raised a ValueError (fuzz nan_inf 58578); numpy oracle: the data repeated
    data = rand(rng, data_shape)
    ind = np.zeros(ind_shape, np.int64)
    b = batch_dims
    nb = math.prod(data_shape[:b])
    n = math.prod(ind_shape[b:-1])
    k = ind_shape[-1]
    d = data.reshape((nb,) + data_shape[b:])
    want = (
        np.broadcast_to(d[:, None], (nb, n) + data_shape[b:])
        if k == 0
        else np.empty((nb, n) + data_shape[b + k :], data.dtype)
    )
    want = want.reshape(ind_shape[:-1] + data_shape[b + k :])
    for algo in ("gather_nd_numpy", "reference"):
        same(ops.run_op("GatherND", [data, ind], {"batch_dims": b}, algo=algo)[0], np.ascontiguousarray(want))


def test_gather_nd_scatter_nd(rng):
    x = rand(rng, (2, 3, 4))
    for idx, b in [
        (np.array([[0, 1], [1, -1]]), 0),
        (np.array([[[1], [0]], [[2], [2]]]), 1),
        (np.array([[1, 2, 3]]), 0),
        (np.array([[2], [0]]), 1),
    ]:
        same(ops.gather_nd(x, idx, b), onnx_ref("GatherND", [x, idx.astype(np.int64)], {"batch_dims": b})[0])
        same(
            ops.gather_nd(x, idx, b, algo="reference"),
            onnx_ref("GatherND", [x, idx.astype(np.int64)], {"batch_dims": b})[0],
        )
    ind = np.array([[0, 2], [1, 0]], np.int64)
    upd = rand(rng, (2, 4))
    same(ops.scatter_nd(x, ind, upd), onnx_ref("ScatterND", [x, ind, upd])[0])


def test_index_errors(rng):
    x = rand(rng, (3, 4))
    with pytest.raises(ParamInvalidError, match="index 4"):
        ops.gather_elements(x, np.array([[0, 4]]), 1)
    with pytest.raises(ParamInvalidError, match="index 3"):
        ops.scatter_nd(x, np.array([[3]]), rand(rng, (1, 4)))
    with pytest.raises(InferShapeError, match="updates has shape"):
        ops.scatter_nd(x, np.array([[1]]), rand(rng, (1, 3)))
    with pytest.raises(ParamInvalidError, match="reduction must be one of"):
        ops.scatter_elements(x, np.array([[0]]), rand(rng, (1, 1)), reduction="sum")
    with pytest.raises(InferShapeError, match="exceeds rank"):
        ops.gather_nd(x, np.array([[0, 0, 0]]))


# ---------------------------------------------------------------------------------------------
# data-dependent shapes: NonZero / Unique / Compress
# ---------------------------------------------------------------------------------------------
def test_nonzero(rng, no_leak):
    x = np.array([[0, 1.5, 0], [2, 0, np.nan]], np.float32)
    same(ops.nonzero(x), np.array(np.nonzero(x), np.int64))
    same(ops.nonzero(np.zeros((2, 3), bool)), np.zeros((2, 0), np.int64))
    same(ops.nonzero(np.zeros((0, 3), np.int32)), np.zeros((2, 0), np.int64))
    assert aclnn.nonzero.prepare(x).kernel_name == "nonzero_numpy"


def test_unique_spec_examples():
    y, idx, inv, cnt = ops.unique(np.array([2, 1, 1, 3, 4, 3], np.float32), sorted=False)
    same(y, np.array([2, 1, 3, 4], np.float32))
    same(idx, np.array([0, 1, 3, 4], np.int64))
    same(inv, np.array([0, 1, 1, 2, 3, 2], np.int64))
    same(cnt, np.array([1, 2, 2, 1], np.int64))
    x = np.array(
        [[[1.0, 1.0], [0.0, 1.0], [2.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 1.0], [2.0, 1.0], [0.0, 1.0]]], np.float32
    )
    for algo in (None, "reference"):
        y, idx, inv, cnt = ops.unique(x, dim=1, algo=algo)
        same(y, np.array([[[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], [[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]], np.float32))
        same(idx, np.array([1, 0, 2], np.int64))
        same(inv, np.array([1, 0, 2, 0], np.int64))
        same(cnt, np.array([2, 1, 1], np.int64))
    got = ops.run_op("Unique", [np.array([[1, 3], [2, 3]], np.int64)], {"sorted": 1}, num_outputs=4)
    for g, w in zip(got, ([1, 2, 3], [0, 2, 1], [0, 2, 1, 2], [1, 1, 2])):
        same(g, np.array(w, np.int64))
    assert ops.run_op("Unique", [np.array([3, 3, 1])])[0].shape == (2,)


def test_compress(rng):
    x = rand(rng, (3, 4))
    same(ops.compress(x, [True, False, True], axis=0), x[[0, 2]])
    same(ops.compress(x, [False, True], axis=-1), x[:, [1]])
    same(ops.compress(x, [True, False, False, True, True]), x.reshape(-1)[[0, 3, 4]])
    with pytest.raises(ParamInvalidError, match="condition has 5 entries"):
        ops.compress(x, [True] * 5, axis=1)


# ---------------------------------------------------------------------------------------------
# TopK
# ---------------------------------------------------------------------------------------------
def test_topk_ties_and_orders(rng):
    x = np.array([[3, 1, 3, 2, 1], [0, 0, 0, 0, 0]], np.int64)
    v, i = ops.topk(x, 3)
    same(v, np.array([[3, 3, 2], [0, 0, 0]], np.int64))
    same(i, np.array([[0, 2, 3], [0, 1, 2]], np.int64))
    v, i = ops.topk(x, 2, largest=False)
    same(v, np.array([[1, 1], [0, 0]], np.int64))
    same(i, np.array([[1, 4], [0, 1]], np.int64))
    u = np.array([200, 3, 200], np.uint8)
    same(ops.topk(u, 2)[1], np.array([0, 2], np.int64))
    same(ops.topk(u, 2, algo="reference")[1], np.array([0, 2], np.int64))
    i8 = np.array([-128, 5, 127], np.int8)  # the reference negated int8 -128 (it wrapped to -128)
    for algo in ("topk_sort", "reference"):
        same(ops.topk(i8, 2, algo=algo)[1], np.array([2, 1], np.int64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_topk_vs_onnx_reference(rng, dtype):
    x = rand(rng, (3, 6, 5), dtype)
    for axis, k, largest in [(1, 4, 1), (-1, 5, 0), (0, 0, 1), (0, 2, 0)]:
        v, i = ops.topk(x, k, dim=axis, largest=bool(largest))
        wv, wi = onnx_ref("TopK", [x, np.array([k], np.int64)], {"axis": axis, "largest": largest}, 2)
        same(v, wv.astype(x.dtype))
        same(i, wi)
        rv, ri = ops.topk(x, k, dim=axis, largest=bool(largest), algo="reference")
        same(rv, wv.astype(x.dtype))
        same(ri, wi)
    with pytest.raises(ParamInvalidError, match="K = 7 must be in"):
        ops.topk(x, 7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_topk_nan_ranks_above_inf_like_onnxruntime(rng, dtype):
    # the kernel ranked NaN largest, the reference last (fuzz nan_inf); onnxruntime ranks it above +inf
    ort = pytest.importorskip("onnxruntime")
    x = rand(rng, (3, 9), dtype)
    x[0, [1, 6]] = np.nan
    x[0, 3], x[0, 4] = np.inf, -np.inf
    x[1, :] = np.nan
    x[2, 8] = np.nan
    for largest in (1, 0):
        for k in (1, 3, 9):
            ins = [x, np.array([k], np.int64)]
            node = helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)
            dt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            graph = helper.make_graph(
                [node],
                "g",
                [helper.make_tensor_value_info("x", dt, None), helper.make_tensor_value_info("k", 7, [1])],
                [helper.make_tensor_value_info("v", dt, None), helper.make_tensor_value_info("i", 7, None)],
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            wv, wi = sess.run(None, {"x": x, "k": ins[1]})
            for algo in ("topk_sort", "reference"):
                v, i = ops.run_op("TopK", ins, {"largest": largest}, algo=algo)
                same(v, wv)
                same(i, wi)


# ---------------------------------------------------------------------------------------------
# ReverseSequence / Dropout / Col2Im
# ---------------------------------------------------------------------------------------------
def test_reverse_sequence_spec_examples():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    got = ops.reverse_sequence(x.T.copy(), [4, 3, 2, 1], batch_axis=1, time_axis=0)
    same(got, np.array([[3, 6, 9, 12], [2, 5, 8, 13], [1, 4, 10, 14], [0, 7, 11, 15]], np.float32))
    want = np.array([[0, 1, 2, 3], [5, 4, 6, 7], [10, 9, 8, 11], [15, 14, 13, 12]], np.float32)
    same(ops.reverse_sequence(x, [1, 2, 3, 4], batch_axis=0, time_axis=1), want)
    same(ops.reverse_sequence(x, [1, 2, 3, 4], batch_axis=0, time_axis=1, algo="reference"), want)
    with pytest.raises(ParamInvalidError, match=r"sequence_lens\[0\] = 5"):
        ops.reverse_sequence(x, [5, 1, 1, 1], batch_axis=0, time_axis=1)


def test_dropout(rng, no_leak):
    x = rand(rng, (4, 5))
    same(ops.dropout(x), x)
    same(ops.dropout(x, 0.3, training=False), x)
    y, mask = ops.run_op("Dropout", [x], num_outputs=2)
    same(y, x)
    same(mask, np.ones(x.shape, bool))
    y, mask = ops.run_op("Dropout", [x, np.array(0.25, np.float32), np.array(True)], {"seed": 3}, num_outputs=2)
    want_mask = np.random.RandomState(3).uniform(0, 1, x.shape) >= 0.25
    same(mask, want_mask)
    np.testing.assert_allclose(y.numpy(), x * want_mask / 0.75, rtol=1e-6)
    with pytest.raises(ParamInvalidError, match="ratio must be in"):
        ops.dropout(x, 1.0, training=True)
    h = ops.dropout(x.astype(np.float16), 0.5, training=True, seed=0).numpy()
    assert h.dtype == np.float16 and set(np.unique(h == 0)) <= {True, False}


def test_col2im(rng):
    x = rand(rng, (2, 2 * 2 * 3, 12))  # image 5x6, block 2x3, stride 1, no pad -> 4 x 4... use geometry below
    cases = [
        ((4, 5), (2, 2), {}, (2, 8, 12)),
        ((5, 5), (2, 2), {"strides": [2, 2], "pads": [1, 1, 0, 0]}, (1, 4, 9)),
        ((6, 5), (2, 2), {"dilations": [2, 1]}, (1, 8, 16)),
    ]
    for img, blk, attrs, shape in cases:
        x = rand(rng, shape)
        want = onnx_ref("Col2Im", [x, np.array(img, np.int64), np.array(blk, np.int64)], attrs)[0]
        np.testing.assert_allclose(ops.col2im(x, img, blk, **attrs).numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            ops.col2im(x, img, blk, **attrs, algo="reference").numpy(), want, rtol=1e-5, atol=1e-6
        )
    with pytest.raises(ParamInvalidError, match="L = 12 blocks"):
        ops.col2im(rand(rng, (1, 4, 12)), (5, 5), (2, 2))
    # a 0 stride divided by zero, untyped (found by opsnn fuzz, op_schema 93955); negative sizes likewise
    for img, blk, attrs in [
        ((4, 5), (2, 2), {"strides": [3, 0]}),
        ((4, 5), (-1, 2), {}),
        ((4, 5), (2, 2), {"dilations": [0, 1]}),
    ]:
        with pytest.raises(ParamInvalidError, match="must be >= 1"):
            ops.col2im(rand(rng, (2, 8, 12)), img, blk, **attrs)


# ---------------------------------------------------------------------------------------------
# Resize
# ---------------------------------------------------------------------------------------------
RESIZE_CASES = [
    ({"mode": "nearest"}, [1, 1, 2, 1.5], None),
    (
        {"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "asymmetric"},
        [1, 1, 0.6, 1.7],
        None,
    ),
    (
        {"mode": "nearest", "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "align_corners"},
        None,
        [2, 3, 7, 4],
    ),
    ({"mode": "linear"}, [1, 1, 2, 3], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [2, 3, 7, 9]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [2, 3, 1, 3]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.4, 0.6], None),
    ({"mode": "cubic"}, [1, 1, 1.7, 0.8], None),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, None, [2, 3, 3, 11]),
    (
        {"mode": "cubic", "antialias": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
        [1, 1, 0.35, 0.5],
        None,
    ),
    (
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
        None,
        [2, 3, 4, 5],
    ),
    (
        {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 9.0},
        None,
        [2, 3, 4, 5],
    ),
    ({"mode": "linear", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"}, None, [8, 4]),
    ({"mode": "nearest", "axes": [3], "keep_aspect_ratio_policy": "not_smaller"}, None, [3]),
]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZE_CASES)
def test_resize_vs_onnx_reference(rng, attrs, scales, sizes):
    x = rand(rng, (2, 3, 5, 6))
    roi = None
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        roi = np.array([0, 0, -0.2, 0.15, 1, 1, 0.8, 1.3], np.float32)
    sc = None if scales is None else np.array(scales, np.float32)
    sz = None if sizes is None else np.array(sizes, np.int64)
    want = onnx_ref("Resize", [x, roi, sc, sz], attrs)[0]
    ex = aclnn.prepare("Resize", [x, roi, sc, sz], attrs)
    assert ex.kernel_name == ("resize_nearest" if attrs["mode"] == "nearest" else "resize_separable")
    np.testing.assert_allclose(ex.run().numpy(), want, rtol=1e-5, atol=1e-5)
    # onnx.reference evaluates cubic weights in float32 (a float32 cubic_coeff_a): hence 1e-5
    ref = aclnn.prepare("Resize", [x, roi, sc, sz], attrs, algo="reference").run().numpy()
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    if "axes" in attrs:  # negative axes mean the same
        neg = dict(attrs, axes=[a - 4 for a in attrs["axes"]])
        np.testing.assert_allclose(ops.run_op("Resize", [x, roi, sc, sz], neg)[0].numpy(), want, rtol=1e-5, atol=1e-5)
    h = ops.run_op("Resize", [x.astype(np.float16), roi, sc, sz], attrs)[0].numpy()
    np.testing.assert_allclose(h.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_resize_nearest_copies_nan_and_inf(rng):
    """Nearest copies one input per output: Inf stays Inf in the kernel and in the reference (found by
    tests/fuzz: the reference summed its zero-weight taps, 0 * Inf = NaN; onnx.reference does too, so the
    oracle is onnx.reference's choice of input on the positions 0..11, gathered from x)."""
    x = rand(rng, (1, 1, 3, 4))
    x[0, 0, 0, 0], x[0, 0, 1, 2], x[0, 0, 2, 3] = np.inf, -np.inf, np.nan
    sc = np.array([1, 1, 2, 1.5], np.float32)
    pos = np.arange(12, dtype=np.float32).reshape(x.shape)
    want = x.reshape(-1)[onnx_ref("Resize", [pos, None, sc], {"mode": "nearest"})[0].astype(np.int64)]
    for algo in ("resize_nearest", "reference"):
        got = ops.run_op("Resize", [x, None, sc], {"mode": "nearest"}, algo=algo)[0].numpy()
        np.testing.assert_array_equal(got, want)
    assert np.isposinf(want).any() and np.isneginf(want).any() and np.isnan(want).any()


@pytest.mark.parametrize(
    "attrs,scales",
    [
        ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 2, 2]),
        ({"mode": "linear"}, [1, 1, 3, 1]),  # only axis 2: the kernel's inner > 1 loop
        ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 1.5]),
        ({"mode": "cubic", "exclude_outside": 1}, [1, 1, 1.5, 2]),
    ],
)
def test_resize_zero_weight_taps_take_part_like_onnx(rng, attrs, scales):
    """Linear/cubic sum every tap of the window, zero weights too (0 * Inf = NaN), as onnx.reference and
    onnxruntime do; the kernel's inner > 1 loop skipped zero weights, giving Inf where the reference
    had NaN (found by tests/fuzz). Oracle: onnx.reference, whose float32 overflow of +-Inf (to
    +-float32 max) is read back as +-Inf."""
    x = rand(rng, (1, 2, 4, 6))
    x[0, 0, 1, 2] = np.inf
    x[0, 1, 2, 0] = np.inf
    sc = np.array(scales, np.float32)
    with np.errstate(invalid="ignore"):
        want = onnx_ref("Resize", [x, None, sc], attrs)[0]
    big = np.abs(want) >= np.finfo(np.float32).max
    want = np.where(big, np.sign(want) * np.inf, want).astype(np.float32)
    assert np.isnan(want).any() and np.isposinf(want).any()
    for algo in ("resize_separable", "reference"):
        got = ops.run_op("Resize", [x, None, sc], attrs, algo=algo)[0].numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=algo)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=algo)


def test_resize_dtypes_parallel(rng, parallel):
    x = rand(rng, (1, 2, 4, 5), np.uint8)
    attrs = {"mode": "nearest"}
    sc = np.array([1, 1, 2.5, 1.5], np.float32)
    same(ops.run_op("Resize", [x, None, sc], attrs)[0], onnx_ref("Resize", [x, None, sc], attrs)[0])
    ex = aclnn.prepare("Resize", [x.astype(bool), None, sc], attrs)
    same(ex.run(), onnx_ref("Resize", [x, None, sc], attrs)[0].astype(bool))
    lin = {"mode": "linear"}
    got = ops.run_op("Resize", [x, None, sc], lin)  # integer linear: the reference (round + saturate)
    same(got[0], onnx_ref("Resize", [x, None, sc], lin)[0])
    xb = rand(rng, (1, 2, 4, 5), ml_dtypes.bfloat16)
    got = ops.run_op("Resize", [xb, None, sc], lin)[0].numpy()
    want = onnx_ref("Resize", [xb.astype(np.float32), None, sc], lin)[0]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_interpolate_torch_semantics(rng):
    x = rand(rng, (1, 2, 3, 4))
    # nearest with an integer factor repeats pixels
    same(ops.interpolate(x, scale_factor=2), x.repeat(2, 2).repeat(2, 3))
    # align_corners keeps the corner pixels
    y = ops.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True).numpy()
    np.testing.assert_allclose(y[..., [0, -1], :][..., [0, -1]], x[..., [0, -1], :][..., [0, -1]], rtol=1e-6)
    # bilinear half-pixel on a linear ramp stays linear in the interior
    ramp = np.tile(np.arange(4, dtype=np.float32), (1, 1, 2, 1))
    y = ops.interpolate(ramp, scale_factor=(1, 2), mode="bilinear").numpy()
    np.testing.assert_allclose(y[0, 0, 0, 1:-1], (np.arange(1, 7) + 0.5) / 2 - 0.5, rtol=1e-6)
    # nearest-exact picks floor((i + 0.5) / scale)
    y = ops.interpolate(ramp, size=(2, 3), mode="nearest-exact").numpy()
    same(y[0, 0, 0], np.floor((np.arange(3) + 0.5) * 4 / 3).astype(np.float32))


def test_resize_errors(rng):
    x = rand(rng, (1, 1, 2, 2))
    with pytest.raises(ParamInvalidError, match="exactly one of 'scales' and 'sizes'"):
        ops.resize(x)
    with pytest.raises(ParamInvalidError, match="scales has 2 entries for 4 axes"):
        ops.resize(x, scales=[2, 2])
    with pytest.raises(ParamInvalidError, match="mode must be one of"):
        ops.resize(x, scales=[1, 1, 2, 2], mode="area")
    with pytest.raises(ParamInvalidError, match="needs 'roi'"):
        ops.resize(x, scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize")


# ---------------------------------------------------------------------------------------------
# cross-cutting: forced reference, empty tensors, two-phase reuse, strings
# ---------------------------------------------------------------------------------------------
def _calls(x):
    return [
        ("reshape", (x, (-1,)), {}),
        ("transpose", (x, [1, 0, 2]), {}),
        ("concat", ([x, x],), {"dim": -1}),
        ("split", (x, 1), {"dim": 1}),
        ("slice", (x, [-1], [0], [2], [-1]), {}),
        ("gather", (x, [1, 0]), {"axis": 2}),
        ("pad", (x, (1, 1, 0, 1)), {"mode": "replicate"}),
        ("expand", (x, 2, *x.shape), {}),
        ("tile", (x, (1, 2, 1)), {}),
        ("squeeze", (x,), {}),
        ("unsqueeze", (x, 1), {}),
        ("flatten", (x, 1), {}),
        ("identity", (x,), {}),
        ("center_crop_pad", (x, (1, 3)), {"axes": [0, 2]}),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_forced_reference_matches(rng, dtype):
    x = rand(rng, (2, 3, 4), dtype)
    for name, args, kw in _calls(x):
        fast = getattr(ops, name)(*args, **kw)
        ref = getattr(ops, name)(*args, **kw, algo="reference")
        fast = fast if isinstance(fast, tuple) else (fast,)
        ref = ref if isinstance(ref, tuple) else (ref,)
        assert len(fast) == len(ref), name
        for f, r in zip(fast, ref):
            same(f, r.numpy())


def test_empty_tensors(rng, no_leak):
    x = np.zeros((2, 0, 3), np.float32)
    for name, args, kw in _calls(x):
        if name in ("gather", "split", "center_crop_pad", "pad"):
            continue
        out = getattr(ops, name)(*args, **kw)
        assert (out if not isinstance(out, tuple) else out[0]).numel == 0, name
    same(ops.pad(x, (1, 1)), np.zeros((2, 0, 5), np.float32))
    same(ops.gather(x, [2], axis=2), np.zeros((2, 0, 1), np.float32))


def test_two_phase_reuse(rng, no_leak):
    x = rand(rng, (4, 6))
    ex = aclnn.transpose.prepare(x)
    assert ex.workspace_size == 0
    same(ex.run(), x.T.copy())
    x2 = rand(rng, (4, 6))
    same(ex.run(inputs=[x2]), x2.T.copy())
    with pytest.raises(ParamInvalidError, match="host input 'pads' changed value"):
        aclnn.pad.prepare(x, (1, 1)).run(
            inputs=[x, np.array([0, 2], np.int64), np.zeros((), np.float32), np.array([1], np.int64)]
        )


def test_wide_dtypes_use_reference(rng):
    c = (rand(rng, (2, 3)) + 1j * rand(rng, (2, 3))).astype(np.complex128)  # 16-byte items: no bit kernel
    ex = aclnn.prepare("Transpose", [c])
    assert ex.kernel_name == "reference" and "bit-copyable" in ex.reason
    same(ex.run(), c.T.copy())
    same(ops.run_op("Concat", [c, c], {"axis": 0})[0], np.concatenate([c, c]))
    c64 = c.astype(np.complex64)  # 8-byte items move as uint64
    assert aclnn.prepare("Transpose", [c64]).kernel_name == "transpose_blocked"
    same(ops.transpose(c64), c64.T.copy())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_reshape_expand_inference_property(shape, data):
    """Reshape keeps the element count; Expand's shape equals numpy's broadcast shape."""
    n = math.prod(shape)
    cut = data.draw(st.integers(0, len(shape)))
    target = list(shape[:cut]) + [-1]
    x = np.zeros(shape, np.int8)
    assert math.prod(ops.reshape(x, target).shape) == n
    other = data.draw(st.lists(st.sampled_from([1] + shape), min_size=0, max_size=5))
    try:
        want = np.broadcast_shapes(tuple(shape), tuple(other))
    except ValueError:
        with pytest.raises(ParamInvalidError):
            ops.run_op("Expand", [x, np.array(other, np.int64)])
        return
    assert ops.run_op("Expand", [x, np.array(other, np.int64)])[0].shape == want
