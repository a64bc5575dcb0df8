"""Python protocols on Tensor behave as torch's do, so habits carry over without silent surprises:
``==`` / ``!=`` compare elementwise (identity hashing stays), a tensor's truth value is defined for
one element only, a 0-d tensor neither iterates nor has a length, ``item()`` / ``int()`` need one
element, ``f"{loss:.4f}"`` formats a 0-d tensor, and indexing / assignment / ``copy_`` errors are
typed and name the tensor's shape. The onnxruntime-compatible option objects reject unknown names."""

from __future__ import annotations

import numpy as np
import pytest

import opsnn
from opsnn.errors import ParamInvalidError, TensorIndexError, UnknownOptionError


@pytest.fixture
def t():
    return opsnn.tensor(np.array([[1.0, 2.0, 3.0], [4.0, np.nan, 6.0]], np.float32))


def test_equality_is_elementwise_and_hashing_stays_by_identity(t):
    a = t.numpy()
    np.testing.assert_array_equal((t == 2.0).numpy(), a == 2.0)
    np.testing.assert_array_equal((t != 2.0).numpy(), a != 2.0)  # NaN != 2: True, as numpy
    np.testing.assert_array_equal((t == t).numpy(), a == a)  # NaN == NaN: False
    np.testing.assert_array_equal((t != t).numpy(), a != a)
    np.testing.assert_array_equal((2.0 == t).numpy(), a == 2.0)
    np.testing.assert_array_equal(t.ne(opsnn.tensor(a[0])).numpy(), a != a[0])
    np.testing.assert_array_equal(t.not_equal(3.0).numpy(), a != 3.0)
    assert (t == 2.0).dtype == np.bool_
    assert (t == None) is False and (t != None) is True  # noqa: E711 - identity for None, as torch
    assert (t == "a") is False
    d = {t: 1}
    u = opsnn.tensor(t.numpy())
    assert d[t] == 1 and u not in d and len({t, u, t}) == 2


def test_equality_is_recorded_in_a_traced_function():
    cg = opsnn.compile(lambda x: x != 0.0, [np.zeros(4, np.float32)])
    np.testing.assert_array_equal(cg.run([np.array([0, 1, -2, 0], np.float32)])[0], [False, True, True, False])


def test_truth_value_needs_exactly_one_element(t):
    assert bool(opsnn.tensor([0.5])) and not bool(opsnn.tensor(0.0))
    assert bool(t[0, 0] == 1.0)
    for bad in (t, opsnn.tensor(np.zeros((0,), np.float32))):
        with pytest.raises(ParamInvalidError, match=r"truth value of a tensor of shape .* is ambiguous"):
            bool(bad)
    with pytest.raises(ParamInvalidError, match="is ambiguous"):
        if t > 0.0:
            pass


def test_iteration_and_length(t):
    rows = list(t)
    assert len(rows) == 2 and rows[1].shape == (3,)
    np.testing.assert_array_equal(rows[0].numpy(), [1.0, 2.0, 3.0])
    s = opsnn.tensor(1.5)
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        list(s)
    with pytest.raises(TypeError, match="len"):
        len(s)


def test_item_int_float_and_format(t):
    s = opsnn.tensor(np.float32(0.123456))
    assert f"{s:.3f}" == "0.123" and f"{opsnn.tensor(7):>3d}" == "  7"
    assert float(opsnn.tensor([2.5])) == 2.5 and int(opsnn.tensor([[3]])) == 3
    assert opsnn.tensor([[4.0]]).item() == 4.0
    for fn in (lambda: t.item(), lambda: int(t), lambda: float(opsnn.tensor(np.zeros(0, np.float32)))):
        with pytest.raises(ParamInvalidError, match=r"item: only a one-element tensor has a Python value"):
            fn()
    assert "tensor(" in f"{t}"


def test_indexing_and_assignment_errors_are_typed_and_name_the_shape(t):
    with pytest.raises(TensorIndexError, match=r"tensor of shape \(2, 3\)\[5\]: index 5 is out of bounds") as e:
        t[5]
    assert isinstance(e.value, IndexError)
    with pytest.raises(TensorIndexError, match=r"\[0, <bool array of shape \(2,\)>\]"):
        t[0, np.array([True, False])]
    with pytest.raises(TensorIndexError, match=r"\[1.5\]"):
        t[1.5]
    before = t.numpy().copy()
    with pytest.raises(ParamInvalidError, match=r"tensor of shape \(2, 3\)\[:, 1:3\] = value: could not broadcast"):
        t[:, 1:3] = np.ones(4, np.float32)
    with pytest.raises(TensorIndexError, match=r"\[2\] = \.\.\."):
        t[2] = 0.0
    with pytest.raises(ParamInvalidError, match=r"copy_: a source of shape \(5,\) does not broadcast to the tensor's"):
        t.copy_(np.ones(5, np.float32))
    np.testing.assert_array_equal(t.numpy(), before)  # nothing written
    t[0, 1:] = 0.0
    assert t.numpy()[0].tolist() == [1.0, 0.0, 0.0]


def test_option_objects_reject_unknown_names_and_out_of_range_ints():
    so = opsnn.SessionOptions()
    with pytest.raises(UnknownOptionError, match=r"no option 'intra_op_threads'; did you mean 'intra_op_num_threads'"):
        so.intra_op_threads = 2
    with pytest.raises(AttributeError):  # also an AttributeError, as onnxruntime's fixed attributes raise
        so.enable_profile = True
    for name, bad in (("intra_op_num_threads", -1), ("intra_op_num_threads", 2.0), ("log_severity_level", 5)):
        with pytest.raises(ParamInvalidError, match=rf"SessionOptions.{name}: expected an int in"):
            setattr(so, name, bad)
    so.intra_op_num_threads = 1
    so.graph_optimization_level = opsnn.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    ro = opsnn.RunOptions()
    with pytest.raises(UnknownOptionError, match="RunOptions has no option 'log_severity'"):
        ro.log_severity = 1
    ro.log_severity_level = 2
    ro.terminate = False


def test_run_options_of_the_wrong_type_is_a_typed_error():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = opsnn.InferenceSession(model.SerializeToString())
    feed = {"x": np.array([-1.0, 2.0], np.float32)}
    with pytest.raises(ParamInvalidError, match="run_options must be an opsnn.RunOptions or None, got dict"):
        sess.run(None, feed, {"log_severity_level": 1})
    np.testing.assert_array_equal(sess.run(None, feed, opsnn.RunOptions())[0], [0.0, 2.0])


def test_any_and_all_as_torch_defines_them():
    cases = [
        np.array([[0.0, 1.5], [0.0, 0.0]], np.float32),
        np.array([np.nan, 0.0], np.float32),  # NaN is nonzero
        np.zeros((0, 3), np.float32),  # nothing: any False, all True
        np.array(2.0, np.float32),
        np.array([[True, True], [False, True]]),
        np.array([[0, 3, 0]], np.int64),
    ]
    for a in cases:
        t = opsnn.tensor(a)
        assert t.any().dtype == np.bool_ and t.any().shape == ()
        assert bool(t.any()) == bool(np.any(a != 0)) and bool(t.all()) == bool(np.all(a != 0)), a
        if a.ndim == 2 and a.size:
            np.testing.assert_array_equal(t.any(dim=0).numpy(), np.any(a != 0, axis=0))
            np.testing.assert_array_equal(t.all(1, keepdim=True).numpy(), np.all(a != 0, axis=1, keepdims=True))
    t = opsnn.tensor(np.array([1.0, -2.0], np.float32))
    assert (t < 0).any() and not (t < -5).any()  # the truth value of a reduced tensor


def test_in_place_methods_as_torch_and_the_version_check_that_guards_gradients():
    a = np.array([1.0, 2.0, 4.0], np.float32)
    e = opsnn.tensor(np.zeros(3, np.float32))
    assert e.add_(opsnn.tensor(a), alpha=2) is e and e.numpy().tolist() == [2.0, 4.0, 8.0]
    e.sub_(1.0).mul_(2.0).div_(2.0).clamp_(max=5.0)
    assert e.numpy().tolist() == [1.0, 3.0, 5.0]
    e.lerp_(opsnn.tensor(np.full(3, 11.0, np.float32)), 0.5)
    e.addcmul_(e, e, value=0.0).addcdiv_(e, e, value=1.0)
    np.testing.assert_allclose(e.numpy(), [7.0, 8.0, 9.0])
    np.testing.assert_allclose(opsnn.tensor(a).lerp(opsnn.tensor(a * 3), 0.25).numpy(), a * 1.5)
    # a leaf that requires grad: not under grad mode; under no_grad, an optimizer-style update
    w = opsnn.tensor(a, requires_grad=True)
    with pytest.raises(ParamInvalidError, match="add_: in place with grad mode on, a tensor that requires grad"):
        w.add_(1.0)
    with pytest.raises(ParamInvalidError, match="mul_: in place with grad mode on"):
        opsnn.tensor(a).mul_(w)  # the result would drop w's gradient
    with opsnn.no_grad():
        w.add_(1.0)
    assert w.numpy().tolist() == [2.0, 3.0, 5.0]
    # a tensor a recorded op saved, written in place afterwards: the backward refuses (no wrong gradient)
    from opsnn.autograd import InplaceModifiedError

    for write in (
        lambda t: t.mul_(2.0),
        lambda t: t.copy_(np.ones(3)),
        lambda t: t.__setitem__(0, 5.0),
        lambda t: t.zero_(),
    ):
        c = opsnn.tensor(a)
        loss = opsnn.ops.sum(opsnn.ops.mul(w, c))
        write(c)
        with pytest.raises(
            InplaceModifiedError, match=r"Mul: a tensor of shape \(3,\) that its gradient needs was modified in place"
        ):
            loss.backward()
    view = opsnn.tensor(a)
    loss = opsnn.ops.sum(opsnn.ops.mul(w, view))
    view[1:].fill_(0.0)  # a view of the same memory counts too
    with pytest.raises(InplaceModifiedError):
        loss.backward()
    c = opsnn.tensor(a)  # written before the op: fine
    c.mul_(3.0)
    opsnn.ops.sum(opsnn.ops.mul(w, c)).backward()
    np.testing.assert_array_equal(w.grad.numpy(), a * 3)


def test_write_counts_go_with_their_memory_and_any_owner_works():
    import gc
    import sys

    versions = sys.modules["opsnn.tensor"].VERSIONS
    before = len(versions)
    for _ in range(200):
        opsnn.tensor(np.zeros(4, np.float32)).add_(1.0)
    gc.collect()
    assert len(versions) <= before + 1  # an entry leaves with the memory it counts
    t = opsnn.from_numpy(np.frombuffer(bytearray(12), np.float32))  # an owner without weak references
    assert t.fill_(2.0).numpy().tolist() == [2.0, 2.0, 2.0]
