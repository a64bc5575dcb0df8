"""opsnn.Tensor: zero-copy views, strides/offset, dtypes, formats, interop (numpy, DLPack)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opsnn
from opsnn import dtypes
from opsnn.errors import DTypeError, ParamInvalidError


def test_views_share_memory_and_report_strides():
    a = np.arange(24, dtype=np.float32)
    t = opsnn.tensor(a).reshape(2, 3, 4)
    assert t.strides == (12, 4, 1) and t.offset == 0 and t.is_contiguous()
    tt = t.transpose(0, 2)
    assert tt.shape == (4, 3, 2) and tt.strides == (1, 4, 12) and not tt.is_contiguous()
    assert np.shares_memory(tt.numpy(), t.numpy())
    p = t.permute(2, 0, 1)
    np.testing.assert_array_equal(p.numpy(), a.reshape(2, 3, 4).transpose(2, 0, 1))
    s = t[1, 1:, ::2]
    assert s.shape == (2, 2) and s.offset == 12 + 4 and s.strides == (4, 2)
    np.testing.assert_array_equal(s.numpy(), a.reshape(2, 3, 4)[1, 1:, ::2])
    assert np.shares_memory(s.numpy(), t.numpy())


def test_expand_squeeze_unsqueeze_are_views():
    t = opsnn.tensor(np.arange(3, dtype=np.float32)).reshape(3, 1)
    e = t.expand(2, 3, 4)
    assert e.shape == (2, 3, 4) and e.strides == (0, 1, 0)
    assert np.shares_memory(e.numpy(), t.numpy())
    assert t.expand(-1, 5).shape == (3, 5)
    assert t.squeeze().shape == (3,) and t.squeeze(1).shape == (3,) and t.squeeze(0).shape == (3, 1)
    assert t.unsqueeze(0).shape == (1, 3, 1) and t.unsqueeze(-1).shape == (3, 1, 1)
    with pytest.raises(ParamInvalidError, match="expand"):
        opsnn.tensor(np.ones((2, 3))).expand(4, 3)


def test_contiguous_copies_only_when_needed():
    t = opsnn.tensor(np.arange(12, dtype=np.float64)).reshape(3, 4)
    assert t.contiguous() is t
    tt = t.T
    c = tt.contiguous()
    assert c is not tt and c.is_contiguous() and not np.shares_memory(c.numpy(), t.numpy())
    np.testing.assert_array_equal(c.numpy(), t.numpy().T)


def test_view_vs_reshape_on_non_contiguous():
    t = opsnn.tensor(np.arange(12, dtype=np.float32)).reshape(3, 4).T
    with pytest.raises(ParamInvalidError, match="without a copy"):
        t.view(12)
    r = t.reshape(12)
    np.testing.assert_array_equal(r.numpy(), np.arange(12).reshape(3, 4).T.reshape(12))
    assert t.reshape(4, -1).shape == (4, 3)


@pytest.mark.parametrize("bad", [(5,), (-2, 6), (-1, -1), (0, -1)])
def test_bad_shapes_raise(bad):
    t = opsnn.tensor(np.arange(12, dtype=np.float32))
    with pytest.raises(ParamInvalidError):
        t.reshape(*bad)


def test_bad_dims_raise():
    t = opsnn.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ParamInvalidError, match="out of range"):
        t.transpose(0, 2)
    with pytest.raises(ParamInvalidError, match="permutation"):
        t.permute(0, 0)
    with pytest.raises(ParamInvalidError):
        opsnn.empty((2, -1))
    with pytest.raises(ParamInvalidError, match="ints"):
        opsnn.empty((2.5, 1))


@pytest.mark.parametrize(
    "name", ["float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
)
def test_every_dtype_round_trips(name):
    dt = dtypes.get(name)
    src = (np.arange(10) % 3).astype(dt)
    t = opsnn.tensor(src)
    assert t.dtype == dt and dtypes.name(t.dtype) == name
    np.testing.assert_array_equal(t.numpy().astype(np.float64), src.astype(np.float64))
    assert t.numpy().ctypes.data % 64 == 0


def test_dtype_names_and_errors():
    assert dtypes.get("bf16") == dtypes.bfloat16 and dtypes.get("fp16") == np.float16
    assert dtypes.compute_dtype("bfloat16") == np.float32
    with pytest.raises(DTypeError, match="unknown dtype name"):
        dtypes.get("float17")


def test_formats():
    t = opsnn.empty((1, 3, 4, 4), "float32", format="NCHW")
    assert t.format == "NCHW"
    assert opsnn.zeros((1, 4, 4, 3), format="NHWC").format == "NHWC"
    with pytest.raises(ParamInvalidError, match="4-D"):
        opsnn.empty((3, 4), format="NCHW")
    with pytest.raises(ParamInvalidError, match="unknown format"):
        opsnn.empty((1, 1, 1, 1), format="NC1HWC0")


def test_empty_tensors():
    t = opsnn.tensor(np.zeros((0, 3), np.float32))
    assert t.shape == (0, 3) and t.numel == 0
    assert t.reshape(3, 0).shape == (3, 0)
    assert t.T.contiguous().shape == (3, 0)


def test_numpy_interop_zero_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = opsnn.from_numpy(a)
    assert np.shares_memory(t.numpy(), a)
    np.testing.assert_array_equal(np.asarray(t), a)
    with pytest.raises(ParamInvalidError):
        opsnn.from_numpy([1, 2])
    assert opsnn.tensor([1.5, 2.5]).dtype == np.float32  # python floats default to float32
    assert opsnn.tensor(a, dtype="float16").dtype == np.float16


def test_dlpack_both_ways_without_copies():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = opsnn.from_dlpack(a)
    assert np.shares_memory(t.numpy(), a)
    back = np.from_dlpack(t)
    assert np.shares_memory(back, t.numpy())
    tt = opsnn.tensor(a).T  # strided layouts cross too
    np.testing.assert_array_equal(np.from_dlpack(tt), a.T)
    assert t.__dlpack_device__()[0] == 1  # kDLCPU
    with pytest.raises(DTypeError, match="bfloat16"):
        np.from_dlpack(opsnn.tensor(np.ones(2, dtypes.bfloat16)))


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = opsnn.from_dlpack(x)
    x[0, 0] = 42
    assert t.numpy()[0, 0] == 42
    y = torch.from_dlpack(opsnn.tensor(np.ones((2, 2), np.float32)))
    assert y.sum().item() == 4


def test_item_tolist_len_repr_setitem():
    t = opsnn.tensor(np.arange(4, dtype=np.int64))
    assert len(t) == 4 and t.tolist() == [0, 1, 2, 3] and t[2].item() == 2
    t[1] = 9
    assert t.numpy()[1] == 9
    assert "int64" in repr(t)
    with pytest.raises(TypeError):
        len(opsnn.tensor(np.float32(1)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_permute_matches_numpy(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = opsnn.tensor(a).permute(*perm)
    np.testing.assert_array_equal(t.numpy(), a.transpose(perm))
    np.testing.assert_array_equal(t.contiguous().numpy(), a.transpose(perm))
    assert t.strides == tuple(s // 4 for s in a.transpose(perm).strides)
