"""Gradient rules and the autograd API: every rule against central finite differences in float64
(odd shapes, broadcasting) and, where torch is importable, against torch.autograd."""

import numpy as np
import pytest

import opsnn
from opsnn import autograd, ops

RNG = np.random.default_rng(0)


def _rand(shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape)


def _positive(shape):
    return RNG.uniform(0.5, 2.0, size=shape)


def _away_from_zero(shape):
    a = RNG.uniform(0.2, 1.0, size=shape)
    return a * RNG.choice([-1.0, 1.0], size=shape)


F = ops


def _reduce_op(op, a, axes, keepdims=0):
    """A Reduce* op without an eager function, through run_op."""
    return ops.run_op(op, [a, opsnn.tensor(np.array(axes, np.int64))], {"keepdims": keepdims})[0]


# (id, opsnn fn, torch fn, inputs (float64 arrays), indices of inputs to differentiate)
CASES = [
    ("add_bcast", lambda a, b: a + b, lambda a, b: a + b, [_rand((3, 1, 5)), _rand((4, 5))], [0, 1]),
    ("sub_bcast", lambda a, b: a - b, lambda a, b: a - b, [_rand((2, 3)), _rand((3,))], [0, 1]),
    ("mul_bcast", lambda a, b: a * b, lambda a, b: a * b, [_rand((2, 1, 3)), _rand((1, 4, 1))], [0, 1]),
    ("div_bcast", lambda a, b: a / b, lambda a, b: a / b, [_rand((3, 4)), _positive((4,))], [0, 1]),
    ("neg", lambda a: -a, lambda a: -a, [_rand((5, 3))], [0]),
    ("pow_scalar", lambda a: a**2.5, lambda a: a**2.5, [_positive((3, 4))], [0]),
    ("pow_tensor", lambda a, b: F.pow(a, b), lambda a, b: a**b, [_positive((3, 4)), _rand((4,))], [0, 1]),
    ("exp", F.exp, lambda a: a.exp(), [_rand((3, 5))], [0]),
    ("log", F.log, lambda a: a.log(), [_positive((3, 5))], [0]),
    ("sqrt", F.sqrt, lambda a: a.sqrt(), [_positive((7,))], [0]),
    ("relu", F.relu, lambda a: a.relu(), [_away_from_zero((4, 5))], [0]),
    ("sigmoid", F.sigmoid, lambda a: a.sigmoid(), [_rand((4, 5))], [0]),
    ("tanh", F.tanh, lambda a: a.tanh(), [_rand((4, 5))], [0]),
    ("gelu", F.gelu, lambda a: __import__("torch").nn.functional.gelu(a), [_rand((3, 7), -3, 3)], [0]),
    (
        "gelu_tanh",
        lambda a: F.gelu(a, approximate="tanh"),
        lambda a: __import__("torch").nn.functional.gelu(a, approximate="tanh"),
        [_rand((3, 7), -3, 3)],
        [0],
    ),
    ("silu", F.silu, lambda a: __import__("torch").nn.functional.silu(a), [_rand((3, 5), -3, 3)], [0]),
    ("swish_alpha", lambda a: F.swish(a, alpha=1.7), lambda a: a * (1.7 * a).sigmoid(), [_rand((4,), -3, 3)], [0]),
    (
        "leaky_relu",
        lambda a: F.leaky_relu(a, 0.2),
        lambda a: __import__("torch").nn.functional.leaky_relu(a, 0.2),
        [_away_from_zero((3, 4))],
        [0],
    ),
    ("abs", F.abs, lambda a: a.abs(), [_away_from_zero((5,))], [0]),
    ("softplus", F.softplus, lambda a: __import__("torch").nn.functional.softplus(a), [_rand((5,), -3, 3)], [0]),
    ("erf", F.erf, lambda a: a.erf(), [_rand((5,), -2, 2)], [0]),
    ("reciprocal", F.reciprocal, lambda a: a.reciprocal(), [_positive((5,))], [0]),
    ("rsqrt", F.rsqrt, lambda a: a.rsqrt(), [_positive((5,))], [0]),
    (
        "where_bcast",
        lambda a, b: F.where(np.array([[True, False, True]]), a, b),
        lambda a, b: __import__("torch").where(__import__("torch").tensor([[True, False, True]]), a, b),
        [_rand((2, 3)), _rand((3,))],
        [0, 1],
    ),
    ("clamp", lambda a: F.clamp(a, -0.5, 0.3), lambda a: a.clamp(-0.5, 0.3), [_rand((4, 5))], [0]),
    ("add_n", lambda a, b: F.add_n(a, b), lambda a, b: a + b, [_rand((2, 3)), _rand((3,))], [0, 1]),
    ("split_one_used", lambda a: F.split(a, [1, 3], dim=1)[1], lambda a: a.split([1, 3], 1)[1], [_rand((2, 4))], [0]),
    (
        "split_reordered",
        lambda a: F.concat(list(F.split(a, 2, dim=0))[::-1], dim=1),
        lambda a: __import__("torch").cat(a.split(2, 0)[::-1], 1),
        [_rand((4, 3))],
        [0],
    ),
    (
        "pad_constant",
        lambda a: F.pad(a, (1, 2, 0, 1), value=0.5),
        lambda a: __import__("torch").nn.functional.pad(a, (1, 2, 0, 1), value=0.5),
        [_rand((2, 3, 4))],
        [0],
    ),
    ("softmax", lambda a: F.softmax(a, dim=1), lambda a: a.softmax(1), [_rand((2, 5, 3))], [0]),
    ("softmax_dim0", lambda a: F.softmax(a, dim=0), lambda a: a.softmax(0), [_rand((4, 3))], [0]),
    ("log_softmax", lambda a: F.log_softmax(a, dim=-1), lambda a: a.log_softmax(-1), [_rand((3, 6))], [0]),
    ("matmul_batched", F.matmul, lambda a, b: a @ b, [_rand((2, 3, 4)), _rand((4, 5))], [0, 1]),
    ("matmul_bcast", F.matmul, lambda a, b: a @ b, [_rand((2, 1, 3, 4)), _rand((3, 4, 2))], [0, 1]),
    ("matmul_vec", F.matmul, lambda a, b: a @ b, [_rand((5,)), _rand((5, 3))], [0, 1]),
    ("matmul_matvec", F.matmul, lambda a, b: a @ b, [_rand((2, 3, 5)), _rand((5,))], [0, 1]),
    (
        "gemm",
        lambda a, b, c: F.gemm(a, b, c, alpha=0.7, beta=1.3, trans_a=True, trans_b=True),
        lambda a, b, c: 0.7 * a.T @ b.T + 1.3 * c,
        [_rand((4, 3)), _rand((5, 4)), _rand((5,))],
        [0, 1, 2],
    ),
    ("linear", F.linear, lambda x, w, b: x @ w.T + b, [_rand((2, 3, 4)), _rand((5, 4)), _rand((5,))], [0, 1, 2]),
    ("sum_dims", lambda a: F.sum(a, dim=(0, 2)), lambda a: a.sum((0, 2)), [_rand((3, 4, 5))], [0]),
    ("sum_all", lambda a: F.sum(a), lambda a: a.sum(), [_rand((3, 4))], [0]),
    ("mean_keep", lambda a: F.mean(a, dim=1, keepdim=True), lambda a: a.mean(1, keepdim=True), [_rand((3, 4, 2))], [0]),
    ("reshape", lambda a: F.reshape(a, (4, -1)), lambda a: a.reshape(4, -1), [_rand((2, 3, 4))], [0]),
    ("flatten", lambda a: F.flatten(a, 1), lambda a: a.flatten(1), [_rand((2, 3, 4))], [0]),
    ("transpose", lambda a: F.transpose(a, [2, 0, 1]), lambda a: a.permute(2, 0, 1), [_rand((2, 3, 4))], [0]),
    ("squeeze", lambda a: F.squeeze(a, 1), lambda a: a.squeeze(1), [_rand((3, 1, 4))], [0]),
    ("unsqueeze", lambda a: F.unsqueeze(a, 0), lambda a: a.unsqueeze(0), [_rand((3, 4))], [0]),
    ("expand", lambda a: F.expand(a, 3, 2, 4), lambda a: a.expand(3, 2, 4), [_rand((2, 1))], [0]),
    (
        "concat",
        lambda a, b: F.concat([a, b], dim=1),
        lambda a, b: __import__("torch").cat([a, b], 1),
        [_rand((2, 3)), _rand((2, 4))],
        [0, 1],
    ),
    (
        "slice_steps",
        lambda a: F.slice(a, [1, 0], [5, 7], axes=[0, 1], steps=[2, 3]),
        lambda a: a[1:5:2, 0:7:3],
        [_rand((6, 7))],
        [0],
    ),
    (
        "gather_dup",
        lambda a: F.gather(a, np.array([[0, 2], [2, -1]]), axis=1),
        lambda a: a[:, [[0, 2], [2, -1]]],
        [_rand((3, 4))],
        [0],
    ),
    (
        "gather_axis0_negative",
        lambda a: F.gather(a, np.array([[3, -1], [0, 3]]), axis=0),
        lambda a: a[__import__("torch").tensor([[3, -1], [0, 3]])],
        [_rand((4, 2, 3))],
        [0],
    ),
    (
        "embedding",
        lambda w: F.embedding(np.array([[1, 3, 1], [0, 3, 3]]), w),
        lambda w: w[__import__("torch").tensor([[1, 3, 1], [0, 3, 3]])],
        [_rand((5, 4))],
        [0],
    ),
    (
        "conv2d",
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        lambda x, w, b: __import__("torch").nn.functional.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        [_rand((2, 4, 7, 6)), _rand((6, 2, 3, 3)), _rand((6,))],
        [0, 1, 2],
    ),
    (
        "conv2d_plain",
        lambda x, w: F.conv2d(x, w, None, stride=(1, 2), padding=(2, 0)),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, None, stride=(1, 2), padding=(2, 0)),
        [_rand((1, 3, 5, 8)), _rand((4, 3, 2, 3))],
        [0, 1],
    ),
    (
        "conv2d_same",
        lambda x, w: F.conv2d(x, w, None, padding="same"),
        lambda x, w: __import__("torch").nn.functional.conv2d(x, w, None, padding="same"),
        [_rand((2, 2, 5, 6)), _rand((3, 2, 4, 3))],
        [0, 1],
    ),
    (
        "max_pool2d_ceil_dilated",
        lambda x: F.max_pool2d(x, 2, 2, 1, dilation=2, ceil_mode=True),
        lambda x: __import__("torch").nn.functional.max_pool2d(x, 2, 2, 1, dilation=2, ceil_mode=True),
        [_rand((1, 2, 8, 7))],
        [0],
    ),
    (
        "max_pool2d",
        lambda x: F.max_pool2d(x, 3, 2, 1),
        lambda x: __import__("torch").nn.functional.max_pool2d(x, 3, 2, 1),
        [_rand((2, 3, 7, 6))],
        [0],
    ),
    (
        "avg_pool2d",
        lambda x: F.avg_pool2d(x, 3, 2, 1),
        lambda x: __import__("torch").nn.functional.avg_pool2d(x, 3, 2, 1),
        [_rand((2, 3, 7, 6))],
        [0],
    ),
    (
        "avg_pool2d_excl_ceil",
        lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda x: __import__("torch").nn.functional.avg_pool2d(x, 2, 2, 1, ceil_mode=True, count_include_pad=False),
        [_rand((1, 2, 7, 5))],
        [0],
    ),
    ("global_avg_pool", F.global_avg_pool, lambda x: x.mean((2, 3), keepdim=True), [_rand((2, 3, 4, 5))], [0]),
    (
        "batch_norm_train",
        lambda x, w, b: F.batch_norm(x, np.zeros(3), np.ones(3), w, b, training=True)[0],
        lambda x, w, b: __import__("torch").nn.functional.batch_norm(x, None, None, w, b, training=True),
        [_rand((4, 3, 3, 2)), _rand((3,)), _rand((3,))],
        [0, 1, 2],
    ),
    (
        "batch_norm_eval",
        lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b),
        lambda x, w, b, m, v: __import__("torch").nn.functional.batch_norm(x, m, v, w, b),
        [_rand((2, 3, 4)), _rand((3,)), _rand((3,)), _rand((3,)), _positive((3,))],
        [0, 1, 2],
    ),
    (
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (4, 5), w, b),
        lambda x, w, b: __import__("torch").nn.functional.layer_norm(x, (4, 5), w, b),
        [_rand((3, 4, 5)), _rand((4, 5)), _rand((4, 5))],
        [0, 1, 2],
    ),
    (
        "rms_norm",
        lambda x, w: F.rms_norm(x, (5,), w, eps=1e-5),
        lambda x, w: __import__("torch").nn.functional.rms_norm(x, (5,), w, eps=1e-5),
        [_rand((3, 2, 5)), _rand((5,))],
        [0, 1],
    ),
    (
        "group_norm",
        lambda x, w, b: F.group_norm(x, 2, w, b),
        lambda x, w, b: __import__("torch").nn.functional.group_norm(x, 2, w, b),
        [_rand((2, 4, 3, 2)), _rand((4,)), _rand((4,))],
        [0, 1, 2],
    ),
    (
        "sdpa",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
        lambda q, k, v: __import__("torch").nn.functional.scaled_dot_product_attention(q, k, v),
        [_rand((2, 2, 3, 4)), _rand((2, 2, 5, 4)), _rand((2, 2, 5, 3))],
        [0, 1, 2],
    ),
    (
        "sdpa_causal_gqa",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7, enable_gqa=True),
        lambda q, k, v: __import__("torch").nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=0.7, enable_gqa=True
        ),
        [_rand((1, 4, 4, 3)), _rand((1, 2, 4, 3)), _rand((1, 2, 4, 2))],
        [0, 1, 2],
    ),
    (
        "sdpa_masks",
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=np.array([[True, False, True], [True, True, False]])
        ),
        lambda q, k, v: __import__("torch").nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=__import__("torch").tensor([[True, False, True], [True, True, False]])
        ),
        [_rand((2, 1, 2, 3)), _rand((2, 1, 3, 3)), _rand((2, 1, 3, 3))],
        [0, 1, 2],
    ),
    (
        "sdpa_additive_3d",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda q, k, v, m: __import__("torch").nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [_rand((2, 3, 4)), _rand((2, 5, 4)), _rand((2, 5, 4)), _rand((3, 5))],
        [0, 1, 2],
    ),
    (
        "attention_3d_heads",
        lambda q, k, v: F.attention(q, k, v, q_num_heads=2, kv_num_heads=1, is_causal=True),
        lambda q, k, v: (
            __import__("torch")
            .nn.functional.scaled_dot_product_attention(
                q.reshape(2, 3, 2, 2).transpose(1, 2),
                k.reshape(2, 3, 1, 2).transpose(1, 2),
                v.reshape(2, 3, 1, 4).transpose(1, 2),
                is_causal=True,
                enable_gqa=True,
            )
            .transpose(1, 2)
            .reshape(2, 3, 8)
        ),
        [_rand((2, 3, 4)), _rand((2, 3, 2)), _rand((2, 3, 4))],
        [0, 1, 2],
    ),
    (
        "lstm_bidirectional",
        lambda x, w, r, b, h0, c0: F.concat(
            [F.reshape(o, (-1,)) for o in F.lstm(x, w, r, b, None, h0, c0, hidden_size=3, direction="bidirectional")],
            dim=0,
        ),
        None,
        [_rand((4, 2, 3)), _rand((2, 12, 3)), _rand((2, 12, 3)), _rand((2, 24)), _rand((2, 2, 3)), _rand((2, 2, 3))],
        [0, 1, 2, 3, 4, 5],
    ),
    (
        "lstm_reverse_no_state",
        lambda x, w, r: F.lstm(x, w, r, hidden_size=2, direction="reverse")[0],
        None,
        [_rand((3, 2, 2)), _rand((1, 8, 2)), _rand((1, 8, 2))],
        [0, 1, 2],
    ),
    (
        "gru_bidirectional_lbr",
        lambda x, w, r, b, h0: F.concat(
            [
                F.reshape(o, (-1,))
                for o in F.gru(x, w, r, b, None, h0, hidden_size=3, direction="bidirectional", linear_before_reset=1)
            ],
            dim=0,
        ),
        None,
        [_rand((4, 2, 3)), _rand((2, 9, 3)), _rand((2, 9, 3)), _rand((2, 18)), _rand((2, 2, 3))],
        [0, 1, 2, 3, 4],
    ),
    (
        "gru_forward",
        lambda x, w, r, b: F.gru(x, w, r, b, hidden_size=2)[0],
        None,
        [_rand((3, 2, 2)), _rand((1, 6, 2)), _rand((1, 6, 2)), _rand((1, 12))],
        [0, 1, 2, 3],
    ),
    (
        "swiglu",
        lambda a, b: F.swiglu(a, b),
        lambda a, b: __import__("torch").nn.functional.silu(a) * b,
        [_rand((3, 4), -3, 3), _rand((3, 4))],
        [0, 1],
    ),
    (
        "swiglu_alpha",
        lambda a, b: F.swiglu(a, b, alpha=1.7),
        lambda a, b: a * (1.7 * a).sigmoid() * b,
        [_rand((5,), -3, 3), _rand((5,))],
        [0, 1],
    ),
    (
        "cross_entropy",
        lambda x: F.cross_entropy(x, np.array([1, 0, 3, 2, 1])),
        lambda x: __import__("torch").nn.functional.cross_entropy(x, __import__("torch").tensor([1, 0, 3, 2, 1])),
        [_rand((5, 4))],
        [0],
    ),
    (
        "cross_entropy_w_ignore_sum",
        lambda x, w: F.cross_entropy(x, np.array([[1, 0], [3, 2], [1, 1]]), w, ignore_index=2, reduction="sum"),
        lambda x, w: __import__("torch").nn.functional.cross_entropy(
            x, __import__("torch").tensor([[1, 0], [3, 2], [1, 1]]), w, ignore_index=2, reduction="sum"
        ),
        [_rand((3, 4, 2)), _positive((4,))],
        [0],
    ),
    (
        "nll_none",
        lambda x: F.nll_loss(x, np.array([2, 0, 1]), reduction="none"),
        lambda x: __import__("torch").nn.functional.nll_loss(
            x, __import__("torch").tensor([2, 0, 1]), reduction="none"
        ),
        [_rand((3, 3))],
        [0],
    ),
    # -- trigonometric, hyperbolic and piecewise-constant elementwise ops
    ("sin", F.sin, lambda a: a.sin(), [_rand((3, 4), -3, 3)], [0]),
    ("cos", F.cos, lambda a: a.cos(), [_rand((3, 4), -3, 3)], [0]),
    ("tan", F.tan, lambda a: a.tan(), [_rand((5,))], [0]),
    ("asin", F.asin, lambda a: a.asin(), [_rand((5,), -0.9, 0.9)], [0]),
    ("acos", F.acos, lambda a: a.acos(), [_rand((5,), -0.9, 0.9)], [0]),
    ("atan", F.atan, lambda a: a.atan(), [_rand((5,), -3, 3)], [0]),
    ("sinh", F.sinh, lambda a: a.sinh(), [_rand((5,), -2, 2)], [0]),
    ("cosh", F.cosh, lambda a: a.cosh(), [_rand((5,), -2, 2)], [0]),
    ("asinh", F.asinh, lambda a: a.asinh(), [_rand((5,), -3, 3)], [0]),
    ("acosh", F.acosh, lambda a: a.acosh(), [_rand((5,), 1.2, 3)], [0]),
    ("atanh", F.atanh, lambda a: a.atanh(), [_rand((5,), -0.9, 0.9)], [0]),
    ("sign_zero_grad", F.sign, lambda a: a.sign(), [_away_from_zero((4,))], [0]),
    ("floor_zero_grad", F.floor, lambda a: a.floor(), [_rand((4,), -3, 3)], [0]),
    ("ceil_zero_grad", F.ceil, lambda a: a.ceil(), [_rand((4,), -3, 3)], [0]),
    ("round_zero_grad", F.round, lambda a: a.round(), [_rand((4,), -3, 3)], [0]),
    ("hardmax_zero_grad", F.hardmax, None, [_rand((2, 3))], [0]),
    (
        "maximum_bcast",
        lambda a, b, c: F.maximum(a, b, c),
        lambda a, b, c: __import__("torch").maximum(__import__("torch").maximum(a, b), c),
        [_rand((3, 1, 4)), _rand((2, 4)), _rand((4,))],
        [0, 1, 2],
    ),
    ("minimum", F.minimum, lambda a, b: __import__("torch").minimum(a, b), [_rand((2, 3)), _rand((3,))], [0, 1]),
    ("mean_n", F.mean_n, lambda a, b: (a + b) / 2, [_rand((2, 3)), _rand((2, 1))], [0, 1]),
    ("fmod", F.fmod, lambda a, b: a.fmod(b), [_rand((3, 4), -5, 5), _away_from_zero((4,))], [0, 1]),
    ("remainder", F.remainder, lambda a, b: a.remainder(b), [_rand((3, 4), -5, 5), _away_from_zero((3, 1))], [0, 1]),
    ("cast_like", lambda a: F.cast_like(a, np.zeros(1)), lambda a: a * 1, [_rand((3,))], [0]),
    # -- activations
    (
        "elu",
        lambda a: F.elu(a, alpha=1.25),
        lambda a: __import__("torch").nn.functional.elu(a, 1.25),
        [_away_from_zero((6,))],
        [0],
    ),
    (
        "celu",
        lambda a: F.celu(a, alpha=0.75),
        lambda a: __import__("torch").nn.functional.celu(a, 0.75),
        [_away_from_zero((6,))],
        [0],
    ),
    ("selu", F.selu, lambda a: __import__("torch").nn.functional.selu(a), [_away_from_zero((6,))], [0]),
    ("hard_sigmoid", F.hard_sigmoid, lambda a: (0.2 * a + 0.5).clamp(0, 1), [_rand((8,), -4, 4)], [0]),
    ("hard_swish", F.hard_swish, lambda a: __import__("torch").nn.functional.hardswish(a), [_rand((8,), -5, 5)], [0]),
    ("mish", F.mish, lambda a: __import__("torch").nn.functional.mish(a), [_rand((6,), -3, 3)], [0]),
    ("softsign", F.softsign, lambda a: __import__("torch").nn.functional.softsign(a), [_rand((6,), -3, 3)], [0]),
    (
        "thresholded_relu",
        lambda a: F.thresholded_relu(a, alpha=0.3),
        lambda a: __import__("torch").where(a > 0.3, a, 0.0),
        [_rand((8,))],
        [0],
    ),
    ("softshrink", F.softshrink, lambda a: __import__("torch").nn.functional.softshrink(a), [_rand((8,))], [0]),
    ("hardshrink", F.hardshrink, lambda a: __import__("torch").nn.functional.hardshrink(a), [_rand((8,))], [0]),
    (
        "prelu_channels",
        F.prelu,
        lambda x, w: __import__("torch").nn.functional.prelu(x, w),
        [_away_from_zero((2, 3, 4)), _rand((3,))],
        [0, 1],
    ),
    # -- reductions and scans
    ("logsumexp", lambda a: F.logsumexp(a, dim=1), lambda a: a.logsumexp(1), [_rand((3, 4, 2))], [0]),
    ("reduce_max_dims", lambda a: F.max(a, dim=(0, 2)), lambda a: a.amax((0, 2)), [_rand((3, 4, 2))], [0]),
    (
        "reduce_min_keep",
        lambda a: F.min(a, dim=1, keepdim=True),
        lambda a: a.amin(1, keepdim=True),
        [_rand((3, 4))],
        [0],
    ),
    (
        "reduce_prod_with_zero",
        lambda a: F.prod(a, dim=1),
        lambda a: a.prod(1),
        [np.array([[0.5, 0.0, 2.0, -1.5], [1.2, -0.7, 0.9, 1.1], [0.0, 0.0, 0.3, 2.0]])],
        [0],
    ),
    ("reduce_prod_all", lambda a: F.prod(a), lambda a: a.prod(), [_rand((2, 3))], [0]),
    ("reduce_l1", lambda a: _reduce_op("ReduceL1", a, [1]), lambda a: a.abs().sum(1), [_away_from_zero((3, 4))], [0]),
    ("reduce_l2", lambda a: _reduce_op("ReduceL2", a, [0, 2]), lambda a: a.norm(dim=(0, 2)), [_rand((2, 3, 4))], [0]),
    (
        "reduce_sum_square",
        lambda a: _reduce_op("ReduceSumSquare", a, [1]),
        lambda a: (a * a).sum(1),
        [_rand((3, 4))],
        [0],
    ),
    (
        "reduce_log_sum",
        lambda a: _reduce_op("ReduceLogSum", a, [-1]),
        lambda a: a.sum(-1).log(),
        [_positive((3, 4))],
        [0],
    ),
    ("cumsum", lambda a: F.cumsum(a, 1), lambda a: a.cumsum(1), [_rand((3, 5))], [0]),
    (
        "cumsum_exclusive_reverse",
        lambda a: F.cumsum(a, 0, exclusive=True, reverse=True),
        lambda a: a.flip(0).cumsum(0).flip(0) - a,
        [_rand((4, 3))],
        [0],
    ),
    # -- shape and index
    ("tile", lambda a: F.tile(a, [2, 1, 3]), lambda a: a.tile((2, 1, 3)), [_rand((2, 3, 2))], [0]),
    (
        "pixel_shuffle",
        lambda a: F.pixel_shuffle(a, 2),
        lambda a: __import__("torch").nn.functional.pixel_shuffle(a, 2),
        [_rand((1, 8, 2, 3))],
        [0],
    ),
    (
        "pixel_unshuffle",
        lambda a: F.pixel_unshuffle(a, 2),
        lambda a: __import__("torch").nn.functional.pixel_unshuffle(a, 2),
        [_rand((1, 2, 4, 6))],
        [0],
    ),
    ("depth_to_space_dcr", lambda a: F.depth_to_space(a, 2), None, [_rand((1, 4, 2, 3))], [0]),
    (
        "gather_elements_dup",
        lambda a: F.gather_elements(a, np.array([[0, 0, 2], [1, 2, 2]]), axis=1),
        lambda a: a.gather(1, __import__("torch").tensor([[0, 0, 2], [1, 2, 2]])),
        [_rand((2, 3))],
        [0],
    ),
    (
        "gather_nd",
        lambda a: F.gather_nd(a, np.array([[0, 1], [2, 0], [0, 1]])),
        lambda a: a[[0, 2, 0], [1, 0, 1]],
        [_rand((3, 2, 4))],
        [0],
    ),
    ("triu", lambda a: F.triu(a, 1), lambda a: a.triu(1), [_rand((3, 4))], [0]),
    ("tril_batched", lambda a: F.tril(a, -1), lambda a: a.tril(-1), [_rand((2, 4, 3))], [0]),
    ("reverse_sequence", lambda a: F.reverse_sequence(a, [3, 1, 2]), None, [_rand((4, 3, 2))], [0]),
    (
        "pad_reflect",
        lambda a: F.pad(a, (2, 1, 1, 0), mode="reflect"),
        lambda a: __import__("torch").nn.functional.pad(a, (2, 1, 1, 0), mode="reflect"),
        [_rand((1, 2, 3, 4))],
        [0],
    ),
    (
        "pad_replicate_crop",
        lambda a: F.pad(a, (3, -1), mode="replicate"),
        lambda a: __import__("torch").nn.functional.pad(a, (3, 0), mode="replicate")[..., :-1],
        [_rand((2, 3))],
        [0],
    ),
    # -- convolution, pooling, normalization, recurrence
    (
        "conv_transpose2d",
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        lambda x, w, b: __import__("torch").nn.functional.conv_transpose2d(
            x, w, b, stride=2, padding=1, output_padding=1, groups=2
        ),
        [_rand((2, 4, 3, 2)), _rand((4, 3, 3, 2)), _rand((6,))],
        [0, 1, 2],
    ),
    (
        "conv_transpose2d_dilated",
        lambda x, w: F.conv_transpose2d(x, w, None, stride=(1, 2), padding=(0, 1), dilation=2),
        lambda x, w: __import__("torch").nn.functional.conv_transpose2d(
            x, w, None, stride=(1, 2), padding=(0, 1), dilation=2
        ),
        [_rand((1, 2, 3, 3)), _rand((2, 3, 2, 2))],
        [0, 1],
    ),
    ("global_max_pool", F.global_max_pool, lambda x: x.amax((2, 3), keepdim=True), [_rand((2, 3, 3, 4))], [0]),
    (
        "adaptive_avg_pool2d",
        lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
        lambda x: __import__("torch").nn.functional.adaptive_avg_pool2d(x, (3, 4)),
        [_rand((1, 2, 5, 7))],
        [0],
    ),
    (
        "instance_norm",
        F.instance_norm,
        lambda x, w, b: __import__("torch").nn.functional.instance_norm(x, weight=w, bias=b),
        [_rand((2, 3, 4, 2)), _rand((3,)), _rand((3,))],
        [0, 1, 2],
    ),
    (
        "rnn_bidirectional",
        lambda x, w, r, b, h0: F.concat(
            [F.reshape(o, (-1,)) for o in F.rnn(x, w, r, b, None, h0, hidden_size=3, direction="bidirectional")],
            dim=0,
        ),
        None,
        [_rand((4, 2, 3)), _rand((2, 3, 3)), _rand((2, 3, 3)), _rand((2, 6)), _rand((2, 2, 3))],
        [0, 1, 2, 3, 4],
    ),
    (
        "rnn_relu",
        lambda x, w, r: F.rnn(x, w, r, hidden_size=2, activations=["Relu"])[0],
        None,
        [_rand((3, 2, 2)), _rand((1, 2, 2)), _rand((1, 2, 2))],
        [0, 1, 2],
    ),
    (
        "var_unbiased",
        lambda a: F.var(a, dim=1),
        lambda a: a.var(1),
        [_rand((3, 5))],
        [0],
    ),
    (
        "var_keep_correction0",
        lambda a: F.var(a, dim=(0, 2), keepdim=True, correction=0),
        lambda a: a.var((0, 2), keepdim=True, correction=0),
        [_rand((2, 3, 4))],
        [0],
    ),
    (
        "mean_variance_normalization",
        lambda a: ops.run_op("MeanVarianceNormalization", [a], {"axes": [0, 2]})[0],
        lambda a: (a - a.mean((0, 2), keepdim=True)) / (a.var((0, 2), keepdim=True, correction=0).sqrt() + 1e-9),
        [_rand((2, 3, 4))],
        [0],
    ),
    (
        "lp_normalization_l2",
        lambda a: ops.run_op("LpNormalization", [a], {"axis": 1, "p": 2})[0],
        lambda a: __import__("torch").nn.functional.normalize(a, p=2.0, dim=1),
        [_rand((3, 4, 2))],
        [0],
    ),
    (
        "lp_normalization_l1",
        lambda a: ops.run_op("LpNormalization", [a], {"axis": -1, "p": 1})[0],
        lambda a: __import__("torch").nn.functional.normalize(a, p=1.0, dim=-1),
        [_away_from_zero((3, 4))],
        [0],
    ),
    (
        "lrn",
        lambda a: ops.run_op("LRN", [a], {"size": 3, "alpha": 0.5, "beta": 0.75, "bias": 1.5})[0],
        lambda a: __import__("torch").nn.functional.local_response_norm(a, 3, alpha=0.5, beta=0.75, k=1.5),
        [_rand((2, 5, 3, 2))],
        [0],
    ),
    (
        "lrn_even_size",
        lambda a: ops.run_op("LRN", [a], {"size": 4, "alpha": 0.25, "beta": 0.5, "bias": 2.0})[0],
        None,
        [_rand((1, 6, 2))],
        [0],
    ),
    (
        "global_lp_pool",
        lambda x: F.global_lp_pool(x, p=3),
        lambda x: (x.abs() ** 3).sum((2, 3), keepdim=True) ** (1 / 3),
        [_away_from_zero((2, 3, 2, 3))],
        [0],
    ),
    (
        "einsum_bmm",
        lambda a, b: F.einsum("bij,bjk->bik", a, b),
        lambda a, b: __import__("torch").einsum("bij,bjk->bik", a, b),
        [_rand((2, 3, 4)), _rand((2, 4, 5))],
        [0, 1],
    ),
    (
        "einsum_outer_sum_implicit",
        lambda a, b, c: F.einsum("ij,jk,l", a, b, c),
        lambda a, b, c: __import__("torch").einsum("ij,jk,l", a, b, c),
        [_rand((2, 3)), _rand((3, 4)), _rand((2,))],
        [0, 1, 2],
    ),
    (
        "einsum_summed_alone",
        lambda a: F.einsum("ijk->ki", a),
        lambda a: __import__("torch").einsum("ijk->ki", a),
        [_rand((2, 3, 4))],
        [0],
    ),
    (
        "compress",
        lambda a: F.compress(a, [True, False, True, True], axis=1),
        lambda a: a[:, [0, 2, 3]],
        [_rand((2, 4))],
        [0],
    ),
    ("center_crop_pad", lambda a: F.center_crop_pad(a, [2, 5]), None, [_rand((4, 3))], [0]),
    (
        "scatter_elements",
        lambda a, u: F.scatter_elements(a, np.array([[2, 0], [1, 3]]), u, axis=1),
        lambda a, u: a.scatter(1, __import__("torch").tensor([[2, 0], [1, 3]]), u),
        [_rand((2, 4)), _rand((2, 2))],
        [0, 1],
    ),
    (
        "scatter_deprecated",
        lambda a, u: ops.run_op("Scatter", [a, opsnn.tensor(np.array([[1], [0]])), u], {"axis": 0})[0],
        lambda a, u: a.scatter(0, __import__("torch").tensor([[1], [0]]), u),
        [_rand((3, 2)), _rand((2, 1))],
        [0, 1],
    ),
    (
        "scatter_nd",
        lambda a, u: F.scatter_nd(a, np.array([[1], [3]]), u),
        lambda a, u: a.index_put((__import__("torch").tensor([1, 3]),), u),
        [_rand((4, 3)), _rand((2, 3))],
        [0, 1],
    ),
    (
        "resize_linear_antialias",
        lambda x: F.interpolate(x, size=(3, 5), mode="bilinear", antialias=True),
        None,  # torch's antialias filter is not ONNX's
        [_rand((1, 2, 5, 4))],
        [0],
    ),
    (
        "resize_bilinear",
        lambda x: F.interpolate(x, size=(3, 7), mode="bilinear"),
        lambda x: __import__("torch").nn.functional.interpolate(x, size=(3, 7), mode="bilinear"),
        [_rand((1, 2, 5, 4))],
        [0],
    ),
    (
        "resize_cubic_align_corners",
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True),
        lambda x: __import__("torch").nn.functional.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True),
        [_rand((1, 1, 3, 4))],
        [0],
    ),
    (
        "resize_nearest",
        lambda x: F.interpolate(x, scale_factor=(1.5, 0.5)),
        lambda x: __import__("torch").nn.functional.interpolate(x, scale_factor=(1.5, 0.5)),
        [_rand((1, 2, 4, 6))],
        [0],
    ),
    (
        "resize_tf_crop_extrapolated",
        lambda x: F.resize(
            x,
            sizes=[4, 3],
            mode="linear",
            axes=[2, 3],
            coordinate_transformation_mode="tf_crop_and_resize",
            roi=[-0.2, 0.1, 1.1, 0.9],
            extrapolation_value=2.0,
        ),
        None,
        [_rand((1, 1, 3, 4))],
        [0],
    ),
    (
        "topk_smallest",
        lambda a: F.topk(a, 2, dim=0, largest=False)[0],
        lambda a: a.topk(2, dim=0, largest=False)[0],
        [_rand((4, 3))],
        [0],
    ),
    (
        "max_unpool2d",
        lambda x: F.max_unpool2d(x, np.array([[[[1, 3], [8, 10]]]]), 2, output_size=(4, 3)),
        lambda x: __import__("torch").nn.functional.max_unpool2d(
            x, __import__("torch").tensor([[[[1, 3], [8, 10]]]]), 2, output_size=(4, 3)
        ),
        [_rand((1, 1, 2, 2))],
        [0],
    ),
    (
        "lp_pool2d_ceil",
        lambda x: F.lp_pool2d(x, 2, 2, stride=2, ceil_mode=True),
        None,  # torch's ceil-mode lp_pool2d scales its partial windows as averages
        [_away_from_zero((1, 2, 5, 4))],
        [0],
    ),
    (
        "lp_pool2d",
        lambda x: F.lp_pool2d(x, 2, (2, 3), stride=(2, 1)),
        lambda x: __import__("torch").nn.functional.lp_pool2d(x, 2, (2, 3), stride=(2, 1)),
        [_away_from_zero((1, 2, 5, 4))],
        [0],
    ),
    (
        "lp_pool_p3_padded",
        lambda x: ops.run_op("LpPool", [x], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "p": 3})[0],
        None,
        [_away_from_zero((2, 1, 6))],
        [0],
    ),
    (
        "col2im_fold",
        lambda a: F.col2im(a, [4, 5], [2, 3], dilations=[1, 2], pads=[1, 0, 0, 1], strides=[2, 1]),
        None,
        [_rand((2, 12, 4))],
        [0],
    ),
    (
        "col2im_torch_fold",
        lambda a: F.col2im(a, [4, 5], [2, 2], pads=[1, 1, 1, 1], strides=[2, 2]),
        lambda a: __import__("torch").nn.functional.fold(a, (4, 5), (2, 2), padding=1, stride=2),
        [_rand((1, 8, 9))],
        [0],
    ),
    (
        "dft_complex",
        lambda a: F.dft(a, dim=1),
        lambda a: __import__("torch").view_as_real(__import__("torch").fft.fft(__import__("torch").view_as_complex(a))),
        [_rand((2, 5, 2))],
        [0],
    ),
    (
        "dft_real_onesided_padded",
        lambda a: F.dft(a, n=8, dim=1, onesided=True),
        lambda a: __import__("torch").view_as_real(__import__("torch").fft.rfft(a[..., 0], n=8)),
        [_rand((2, 5, 1))],
        [0],
    ),
    (
        "dft_inverse_trimmed",
        lambda a: F.dft(a, n=4, dim=0, inverse=True),
        lambda a: (
            __import__("torch")
            .view_as_real(
                __import__("torch").fft.ifft(__import__("torch").view_as_complex(a.transpose(0, 1).contiguous()), n=4)
            )
            .transpose(0, 1)
        ),
        [_rand((6, 3, 2))],
        [0],
    ),
    (
        "cumprod_with_zeros",
        lambda a: F.cumprod(a, 1),
        lambda a: a.cumprod(1),
        [np.array([[0.5, 0.0, 2.0, -1.5], [1.2, -0.7, 0.9, 1.1], [0.0, 0.0, 0.3, 2.0]])],
        [0],
    ),
    (
        "cumprod_exclusive_reverse",
        lambda a: F.cumprod(a, 0, exclusive=True, reverse=True),
        None,
        [np.array([[0.5, 1.3], [0.0, -0.8], [2.0, 1.1], [-1.5, 0.0]])],
        [0],
    ),
    ("cumprod_exclusive", lambda a: F.cumprod(a, -1, exclusive=True), None, [_rand((2, 3, 4))], [0]),
    (
        "tensor_views",
        lambda a: a.reshape(4, 6).transpose(0, 1)[1:5, ::2].T.unsqueeze(0).expand(2, 2, 4),
        lambda a: a.reshape(4, 6).transpose(0, 1)[1:5, ::2].T.unsqueeze(0).expand(2, 2, 4),
        [_rand((2, 3, 4))],
        [0],
    ),
]


def _opsnn_grads(fn, arrays, wrt, weight):
    ts = [opsnn.tensor(a) for a in arrays]
    for i in wrt:
        ts[i].requires_grad_()
    out = fn(*ts)
    loss = ops.sum(out * opsnn.tensor(weight))
    return loss.numpy().item(), [g.numpy().copy() for g in autograd.grad(loss, [ts[i] for i in wrt])]


def _numeric_grad(fn, arrays, i, weight, eps=1e-6):
    base = [a.copy() for a in arrays]
    g = np.zeros_like(base[i])
    flat = base[i].reshape(-1)
    with opsnn.no_grad():
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            up = np.sum(np.asarray(fn(*[opsnn.tensor(a) for a in base]).numpy(), np.float64) * weight)
            flat[k] = old - eps
            down = np.sum(np.asarray(fn(*[opsnn.tensor(a) for a in base]).numpy(), np.float64) * weight)
            flat[k] = old
            g.reshape(-1)[k] = (up - down) / (2 * eps)
    return g


def _out_shape(fn, arrays):
    with opsnn.no_grad():
        return fn(*[opsnn.tensor(a) for a in arrays]).shape


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_finite_differences(case):
    _, fn, _, arrays, wrt = case
    weight = RNG.uniform(0.5, 1.5, size=_out_shape(fn, arrays))
    _, grads = _opsnn_grads(fn, arrays, wrt, weight)
    for i, g in zip(wrt, grads):
        assert g.shape == arrays[i].shape
        np.testing.assert_allclose(g, _numeric_grad(fn, arrays, i, weight), rtol=1e-5, atol=1e-7, err_msg=f"input {i}")


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch on the even kernel (asymmetric pads)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_matches_torch(case):
    torch = pytest.importorskip("torch")
    _, fn, tfn, arrays, wrt = case
    if tfn is None:
        pytest.skip("no single torch call computes this op (its torch check is a model test)")
    weight = RNG.uniform(0.5, 1.5, size=_out_shape(fn, arrays))
    loss, grads = _opsnn_grads(fn, arrays, wrt, weight)
    tt = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    tloss = (tfn(*tt) * torch.tensor(weight)).sum()
    tgrads = torch.autograd.grad(tloss, [tt[i] for i in wrt])
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-10, atol=1e-12)
    for i, g, tg in zip(wrt, grads, tgrads):
        np.testing.assert_allclose(g, tg.numpy(), rtol=1e-9, atol=1e-11, err_msg=f"input {i}")


# -- the autograd API -------------------------------------------------------------------------------------
def _leaf(a):
    return opsnn.tensor(np.asarray(a, np.float32)).requires_grad_()


def test_backward_accumulates_and_zero_grad_resets(no_leak):
    lin = opsnn.nn.Linear(3, 2)
    x = opsnn.tensor(RNG.standard_normal((4, 3)).astype(np.float32))
    for _ in range(2):
        ops.sum(lin(x)).backward()
    # d sum(x W^T + b) / dW = column sums of x, twice
    np.testing.assert_allclose(lin.weight.grad.numpy(), 2 * np.tile(x.numpy().sum(0), (2, 1)), rtol=1e-5)
    np.testing.assert_allclose(lin.bias.grad.numpy(), [8.0, 8.0])
    lin.zero_grad()
    assert lin.weight.grad is None and lin.bias.grad is None
    del lin, x


def test_retain_graph_allows_a_second_backward_and_its_absence_is_a_typed_error():
    x = _leaf([1.0, 2.0])
    y = ops.sum(ops.exp(x))
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([1.0, 2.0]), rtol=1e-6)
    with pytest.raises(autograd.GraphFreedError, match="ReduceSum|Exp"):
        y.backward()


def test_non_scalar_backward_needs_a_gradient_of_the_right_shape():
    x = _leaf([[1.0, 2.0]])
    y = x * 3.0
    with pytest.raises(autograd.NonScalarBackwardError, match=r"shape \(1, 2\)"):
        y.backward()
    with pytest.raises(autograd.GradientShapeError, match=r"gradient has shape \(2,\)"):
        y.backward(opsnn.tensor(np.ones(2, np.float32)))
    y.backward(opsnn.tensor(np.array([[1.0, 2.0]], np.float32)))
    np.testing.assert_allclose(x.grad.numpy(), [[3.0, 6.0]])


def test_gradient_through_an_op_without_a_rule_is_a_typed_error_naming_it():
    assert ops.get_op("Bernoulli").gradient is None  # a sample: no gradient w.r.t. its probabilities
    x = _leaf([[0.5, 0.25], [0.75, 1.0]])
    y = ops.sum(ops.bernoulli(x, seed=3.0))
    with pytest.raises(autograd.NoGradientError, match="Bernoulli"):
        y.backward()


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda a: F.einsum("...ij->...j", a), "Einsum"),  # ellipsis: outside the einsum rule
        (lambda a: F.einsum("ii->i", a), "Einsum"),  # a diagonal
        (
            lambda a: F.rnn(a, np.ones((1, 2, 3), np.float32), np.ones((1, 2, 2), np.float32), hidden_size=2, clip=1.0)[
                0
            ],
            "RNN",
        ),
    ],
)
def test_a_rule_that_does_not_cover_its_arguments_is_a_typed_error_naming_the_op(fn, op):
    x = _leaf(RNG.standard_normal((3, 1, 3)) if op == "RNN" else RNG.standard_normal((3, 3)))
    with pytest.raises(autograd.NoGradientError, match=op):
        ops.sum(fn(x)).backward()


def test_no_grad_detach_and_requires_grad_flags():
    x = _leaf([1.0, 2.0])
    with opsnn.no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.grad_fn is None
    z = x * 2.0
    assert z.requires_grad and not z.is_leaf and x.is_leaf
    d = z.detach()
    assert not d.requires_grad and np.shares_memory(d.numpy(), z.numpy())
    with pytest.raises(opsnn.errors.DTypeError):
        opsnn.tensor(np.array([1, 2])).requires_grad_()
    with pytest.raises(autograd.NoGradFnError):
        ops.sum(d).backward()
    frozen = opsnn.nn.Linear(2, 2).requires_grad_(False)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert frozen(opsnn.tensor(np.ones((1, 2), np.float32))).grad_fn is None


def test_autograd_grad_leaves_dot_grad_alone_and_reaches_non_leaf_inputs():
    x = _leaf([1.0, 2.0, 3.0])
    h = x * x
    out = ops.sum(h * 2.0)
    gh, gx = autograd.grad(out, [h, x], retain_graph=True)
    np.testing.assert_allclose(gh.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(gx.numpy(), [4.0, 8.0, 12.0])
    assert x.grad is None
    unused = _leaf([1.0])
    with pytest.raises(autograd.NoGradFnError, match="not used"):
        autograd.grad(out, [unused], retain_graph=True)
    assert autograd.grad(out, [unused], allow_unused=True) == (None,)


def test_recording_is_off_without_inputs_that_require_grad():
    x = opsnn.tensor(np.ones(3, np.float32))
    y = ops.exp(x)
    assert y.grad_fn is None and not y.requires_grad


# -- losses and nn training semantics against torch ----------------------------------------------------------
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"label_smoothing": 0.2},
        {"label_smoothing": 0.1, "ignore_index": 1},
        {"label_smoothing": 0.3, "weight": True, "reduction": "sum"},
        {"label_smoothing": 0.3, "weight": True},
        {"reduction": "none", "ignore_index": 0},
        {"probs": True, "label_smoothing": 0.1},
    ],
)
def test_cross_entropy_matches_torch(kw):
    torch = pytest.importorskip("torch")
    kw = dict(kw)
    x = RNG.standard_normal((5, 4, 3))
    tgt = RNG.integers(0, 4, size=(5, 3))
    if kw.pop("probs", False):
        tgt = RNG.dirichlet(np.ones(4), size=(5, 3)).transpose(0, 2, 1).copy()
    w = RNG.uniform(0.5, 2.0, 4) if kw.pop("weight", False) else None
    xt = opsnn.tensor(x).requires_grad_()
    loss = opsnn.nn.CrossEntropyLoss(weight=w, **kw)(xt, tgt)
    g = autograd.grad(ops.sum(loss), [xt])[0].numpy()
    tx = torch.tensor(x, requires_grad=True)
    tl = torch.nn.CrossEntropyLoss(weight=None if w is None else torch.tensor(w), **kw)(tx, torch.tensor(tgt))
    (tg,) = torch.autograd.grad(tl.sum(), [tx])
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, tg.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_nll_losses_match_torch(reduction):
    torch = pytest.importorskip("torch")
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    xt = opsnn.tensor(x).requires_grad_()
    loss = opsnn.nn.MSELoss(reduction)(xt, y)
    g = autograd.grad(ops.sum(loss), [xt])[0].numpy()
    tx = torch.tensor(x, requires_grad=True)
    tl = torch.nn.MSELoss(reduction=reduction)(tx, torch.tensor(y))
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(g, torch.autograd.grad(tl.sum(), [tx])[0].numpy(), rtol=1e-12)
    t = np.array([0, 2, 1, 2])
    nl = opsnn.nn.NLLLoss(ignore_index=1, reduction=reduction)(opsnn.tensor(x), t)
    tn = torch.nn.NLLLoss(ignore_index=1, reduction=reduction)(torch.tensor(x), torch.tensor(t))
    np.testing.assert_allclose(nl.numpy(), tn.numpy(), rtol=1e-12)


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum", "weight": True}, {"reduction": "none", "pos_weight": True}])
def test_bce_with_logits_matches_torch(kw):
    torch = pytest.importorskip("torch")
    kw = dict(kw)
    x, t = RNG.standard_normal((4, 3)) * 3, RNG.uniform(0, 1, (4, 3))
    if kw.pop("weight", False):
        kw["weight"] = RNG.uniform(0.5, 2, (3,))
    if kw.pop("pos_weight", False):
        kw["pos_weight"] = RNG.uniform(0.5, 2, (3,))
    xt = opsnn.tensor(x).requires_grad_()
    loss = opsnn.nn.BCEWithLogitsLoss(**kw)(xt, t)
    g = autograd.grad(ops.sum(loss), [xt])[0].numpy()
    tx = torch.tensor(x, requires_grad=True)
    tl = torch.nn.BCEWithLogitsLoss(**{k: torch.tensor(v) if k != "reduction" else v for k, v in kw.items()})(
        tx, torch.tensor(t)
    )
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(g, torch.autograd.grad(tl.sum(), [tx])[0].numpy(), rtol=1e-9, atol=1e-12)


def test_batchnorm_training_updates_running_stats_like_torch():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((4, 3, 5, 5)).astype(np.float32) * 2 + 1
    for momentum in (0.1, None):
        bn = opsnn.nn.BatchNorm2d(3, momentum=momentum).train()
        tbn = torch.nn.BatchNorm2d(3, momentum=momentum).train()
        for _ in range(3):
            y = bn(opsnn.tensor(x))
            ty = tbn(torch.tensor(x))
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), rtol=1e-5, atol=1e-6)
        assert int(bn.num_batches_tracked.item()) == 3
        bn.eval()
        tbn.eval()
        np.testing.assert_allclose(
            bn(opsnn.tensor(x)).numpy(), tbn(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5
        )


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    grads = [RNG.standard_normal(s).astype(np.float32) for s in ((3, 4), (5,))]
    for norm_type in (2.0, 1.0, float("inf")):
        ps = [opsnn.nn.Parameter(np.zeros_like(g)) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = opsnn.tensor(g)
        tps = [torch.zeros(g.shape, requires_grad=True) for g in grads]
        for p, g in zip(tps, grads):
            p.grad = torch.tensor(g)
        total = opsnn.nn.utils.clip_grad_norm_(ps, 0.5, norm_type)
        ttotal = torch.nn.utils.clip_grad_norm_(tps, 0.5, norm_type)
        np.testing.assert_allclose(total.item(), ttotal.item(), rtol=1e-5)
        for p, tp in zip(ps, tps):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)
    for p, tp, g in zip(ps, tps, grads):  # the same values on both sides: clamping them is exact
        p.grad, tp.grad = opsnn.tensor(g), torch.tensor(g)
    opsnn.nn.utils.clip_grad_value_(ps, 0.01)
    torch.nn.utils.clip_grad_value_(tps, 0.01)
    for p, tp in zip(ps, tps):
        np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())


def test_info_ops_lists_which_ops_have_a_gradient(capsys):
    from opsnn import cli

    assert cli.main(["info", "--ops"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert "gradient" in out
    assert rows["Conv"][2] == "yes" and rows["Bernoulli"][2] == "-"
    n = sum(r.gradient is not None for r in opsnn.ops.all_ops())
    assert f"ops with a gradient rule: {n}" in out


def test_gradient_through_an_output_the_rule_does_not_cover_is_a_typed_error():
    x = opsnn.tensor(RNG.standard_normal((2, 3)).astype(np.float32)).requires_grad_()
    loss, log_prob = ops.softmax_cross_entropy_loss(x, np.array([0, 2]), return_log_prob=True)
    with pytest.raises(autograd.NoGradientError, match="output 1 .*log_prob"):
        ops.sum(log_prob).backward()
    loss.backward()
    assert x.grad is not None


def test_dropout_module_is_seeded_and_passes_gradients_through_kept_elements():
    x = opsnn.tensor(RNG.standard_normal((64, 32)).astype(np.float32)).requires_grad_()
    drop = opsnn.nn.Dropout(0.25).train()
    opsnn.manual_seed(3)
    y = drop(x)
    opsnn.manual_seed(3)
    np.testing.assert_array_equal(drop(x).numpy(), y.numpy())
    keep = y.numpy() != 0
    assert 0.7 < keep.mean() < 0.8
    np.testing.assert_allclose(y.numpy()[keep], x.numpy()[keep] / 0.75, rtol=1e-6)
    ops.sum(y).backward()
    np.testing.assert_allclose(x.grad.numpy(), keep / 0.75, rtol=1e-6)
    assert drop.eval()(x) is x


def test_dropout_op_gradient_uses_its_mask():
    x = opsnn.tensor(RNG.standard_normal((5, 6))).requires_grad_()
    for kw in ({"seed": 7}, {}):
        y = ops.dropout(x, 0.4, training=True, **kw)
        keep = y.numpy() != 0
        if kw:
            (g,) = autograd.grad(ops.sum(y), [x])
            np.testing.assert_allclose(g.numpy(), keep / 0.6, rtol=1e-12)
        else:  # an unseeded mask that was not returned cannot be recomputed
            with pytest.raises(autograd.NoGradientError, match="Dropout"):
                autograd.grad(ops.sum(y), [x])
    y, mask = ops.run_op("Dropout", [x, np.asarray(0.4), np.asarray(True)], num_outputs=2)
    (g,) = autograd.grad(ops.sum(y), [x])
    np.testing.assert_allclose(g.numpy(), mask.numpy() / 0.6, rtol=1e-12)


@pytest.mark.parametrize("kw", [{"rotary_embedding_dim": 4}, {"interleaved": True}])
def test_rotary_embedding_gradient_matches_finite_differences(kw):
    # RotaryEmbedding runs in float32 only; it is linear in x, so a wide step is exact up to rounding
    x = RNG.standard_normal((2, 2, 3, 6)).astype(np.float32)
    ang = np.arange(18.0).reshape(6, 3) / 5
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = np.array([[0, 2, 5], [1, 3, 4]])
    if kw.get("rotary_embedding_dim"):
        cos, sin = cos[:, :2], sin[:, :2]

    def fn(t):
        return F.rotary_embedding(t, cos, sin, pos, **kw)

    _, (g,) = _opsnn_grads(fn, [x], [0], np.ones(x.shape, np.float32))
    num = _numeric_grad(fn, [x], 0, np.ones(x.shape), eps=1e-2)
    np.testing.assert_allclose(g, num, rtol=1e-3, atol=1e-3)


def test_post_accumulate_grad_hooks_fire_once_per_leaf_in_backward_order_then_queued_callbacks():
    # y = w2 @ relu(w1 @ x) + w1-again: w1 gets two contributions (its hook fires after the second),
    # w2 is finished first (the backward reaches it first); numpy gives the expected gradients
    x = RNG.standard_normal((3, 2)).astype(np.float32)
    w1 = opsnn.tensor(RNG.standard_normal((3, 3)).astype(np.float32)).requires_grad_()
    w2 = opsnn.tensor(RNG.standard_normal((2, 3)).astype(np.float32)).requires_grad_()
    unhooked = opsnn.tensor(RNG.standard_normal((2, 2)).astype(np.float32)).requires_grad_()
    log = []

    def hook(name):
        def fn(t):
            log.append((name, t.grad.numpy().copy()))
            if name == "w2":
                autograd.queue_callback(lambda: log.append(("callback", None)))

        return fn

    h1 = w1.register_post_accumulate_grad_hook(hook("w1"))
    w2.register_post_accumulate_grad_hook(hook("w2"))
    for step in range(2):
        log.clear()
        h = ops.relu(ops.matmul(w1, x))
        out = ops.matmul(w2, h) + ops.sum(w1) + unhooked
        ops.sum(out).backward()
        assert [n for n, _ in log] == ["w2", "w1", "callback"]
        # the hook sees the whole accumulated gradient (step 1: twice the one-step gradient)
        hn = np.maximum(w1.numpy() @ x, 0)
        g2 = np.ones((2, 2), np.float32) @ hn.T
        g1 = ((w2.numpy().T @ np.ones((2, 2), np.float32)) * (hn > 0)) @ x.T + 4.0  # sum(w1) feeds 4 outputs
        np.testing.assert_allclose(log[0][1], (step + 1) * g2, rtol=1e-5)
        np.testing.assert_allclose(log[1][1], (step + 1) * g1, rtol=1e-5)
    h1.remove()
    log.clear()
    ops.sum(ops.matmul(w2, ops.matmul(w1, x))).backward()
    assert [n for n, _ in log] == ["w2", "callback"]
    # autograd.grad leaves .grad alone: no hook
    log.clear()
    autograd.grad(ops.sum(ops.matmul(w2, x)), [w2])
    assert log == []
    # backward(inputs=...) accumulates into the inputs named: their hooks fire
    ops.sum(ops.matmul(w2, x)).backward(inputs=[w2])
    assert [n for n, _ in log] == ["w2", "callback"]
    with pytest.raises(opsnn.errors.ParamInvalidError, match="no backward pass is running"):
        autograd.queue_callback(lambda: None)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="is not a leaf"):
        ops.relu(w1).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="does not require grad"):
        opsnn.tensor(x).register_post_accumulate_grad_hook(lambda t: None)


def test_reshape_view_backward_is_a_view_and_never_aliases_a_users_gradient():
    # the gradient of a reshape view flows back as a view (no Reshape kernel copies it), and a
    # leaf's .grad made from it is still its own storage, not the caller's gradient tensor
    from opsnn.tools.profiler import profile

    w = opsnn.Tensor(_rand((4, 6)).astype(np.float32))
    w.requires_grad_(True)
    y = (w * 3.0).reshape(2, 12)
    with profile() as p:
        y.backward(opsnn.Tensor(np.ones((2, 12), np.float32)))
    assert [k.op for k in p.kernels if k.op == "Reshape"] == []
    np.testing.assert_array_equal(w.grad.numpy(), np.full((4, 6), 3.0, np.float32))

    x = opsnn.Tensor(_rand((3, 4)).astype(np.float32))
    x.requires_grad_(True)
    g = opsnn.Tensor(_rand((12,)).astype(np.float32))
    x.reshape(12).backward(g)
    want = g.numpy().reshape(3, 4).copy()
    g.numpy()[:] = 0  # the caller reuses its buffer
    np.testing.assert_array_equal(x.grad.numpy(), want)
