"""Optimizer ops of the ONNX training preview domain (``ai.onnx.preview.training``):
Adagrad, Adam and Momentum — records, kernels and functional entry points.

Each op updates any number of tensors at once: inputs are ``R`` (learning rate), ``T``
(update count), then the tensors, their gradients and their state tensors, each group in
the same order; outputs are the new tensors followed by the new states. The kernels are
numpy expressions evaluated in float64 per tensor (optimizer steps are bandwidth-bound
and rarely hot in inference)::

    >>> import opsnn, numpy as np
    >>> x, g, v = (np.array([1.0, 2.0], np.float32) for _ in range(3))
    >>> x_new, v_new = opsnn.ops.momentum_step(0.1, 1, [x], [g], [v], alpha=0.9, beta=1.0)
    >>> x_new.numpy()
    array([0.81, 1.62], dtype=float32)
"""

from __future__ import annotations

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ...kernels.cpu import optimizer as _K
from ..api import api
from ..registry import Attr, Input, Output, TensorMeta, register_op

DOMAIN = "ai.onnx.preview.training"
_F32_64 = (_dt.float32, _dt.float64)

#: op -> (state tensors per optimized tensor, output tensors per optimized tensor)
_GROUPS = {"Adagrad": (1, 2), "Adam": (2, 3), "Momentum": (1, 2)}


def _count(op: str, n_inputs: int) -> int:
    """How many tensors a node with ``n_inputs`` inputs optimizes."""
    per = 2 + _GROUPS[op][0]  # X, G and the states
    n = n_inputs - 2
    if n <= 0 or n % per:
        raise ParamInvalidError(
            f"{op}: expects R, T and then {per} tensors per optimized tensor (X..., G..., "
            f"states...), got {n_inputs} inputs",
            op=op,
        )
    return n // per


def _infer(ctx):
    op = ctx.op.name
    n = _count(op, len(ctx.inputs))
    if any(m is None for m in ctx.inputs):
        ctx.fail("no input may be omitted")
    for i, name in ((0, "R"), (1, "T")):
        if int(np.prod(ctx.shape(i))) != 1:
            ctx.fail(f"input {name!r} must be a scalar, got shape {tuple(ctx.shape(i))}")
    dt = ctx.dtype(2)
    for j in range(2, len(ctx.inputs)):
        if ctx.dtype(j) != dt:
            raise DTypeError(
                f"{op}: input {j} has dtype {_dt.name(ctx.dtype(j))}; every optimized, gradient and "
                f"state tensor must have the dtype of the first ({_dt.name(dt)})",
                op=op,
            )
    groups = 2 + _GROUPS[op][0]
    for k in range(n):
        shape = tuple(ctx.shape(2 + k))
        for gi in range(1, groups):
            s = tuple(ctx.shape(2 + gi * n + k))
            if s != shape:
                ctx.fail(f"tensor {k}: input {2 + gi * n + k} has shape {s}, expected the shape of X_{k} {shape}")
    n_out = _GROUPS[op][1] * n
    if ctx.num_outputs != n_out:
        ctx.fail(f"{n} optimized tensors give {n_out} outputs, the node asks for {ctx.num_outputs}")
    outs = []
    for gi in range(_GROUPS[op][1]):
        src = 2 if gi == 0 else 2 + (gi + 1) * n  # X, then the states (skipping the gradients)
        outs += [TensorMeta(tuple(ctx.shape(src + k)), dt) for k in range(n)]
    return outs


def _register(op: str, attrs, step, doc: str):
    rec = register_op(
        op,
        domain=DOMAIN,
        category="training",
        inputs=[Input("R", _F32_64), Input("T", (_dt.int64,)), Input("inputs", _F32_64, variadic=True)],
        outputs=[Output("outputs", variadic=True)],
        attrs=attrs,
        infer=_infer,
        reference=lambda ins, a: _reference(op, step, ins, a),
        doc=doc,
    )
    rec.output_count = lambda values, a: _GROUPS[op][1] * _count(op, len(values))

    def kernel(ins, outs, a, plan, ws):
        n = len(outs) // _GROUPS[op][1]
        r, t = float(ins[0].reshape(-1)[0]), int(ins[1].reshape(-1)[0])
        for k in range(n):
            tensors = [ins[2 + gi * n + k] for gi in range(2 + _GROUPS[op][0])]
            with np.errstate(all="ignore"):
                res = step(r, t, *[x.astype(np.float64, copy=False) for x in tensors], a)
            for gi, v in enumerate(res):
                np.copyto(outs[gi * n + k], v, casting="unsafe")

    rec.kernel(f"{op.lower()}_numpy", dtypes=_F32_64, priority=5, doc="float64 numpy expression per tensor")(kernel)
    return rec


def _reference(op, step, ins, a):
    """Scalar Python arithmetic, element by element (the update rule read literally)."""
    n = _count(op, len(ins))
    r, t = float(ins[0].reshape(-1)[0]), int(ins[1].reshape(-1)[0])
    per = 2 + _GROUPS[op][0]
    outs = [[None] * n for _ in range(_GROUPS[op][1])]
    for k in range(n):
        tensors = [ins[2 + gi * n + k] for gi in range(per)]
        flat = [x.astype(np.float64).reshape(-1) for x in tensors]
        res = [np.empty(flat[0].shape) for _ in range(_GROUPS[op][1])]
        for e in range(flat[0].size):
            vals = step(r, t, *[float(f[e]) for f in flat], a, scalar=True)
            for gi, v in enumerate(vals):
                res[gi][e] = v
        for gi in range(_GROUPS[op][1]):
            outs[gi][k] = res[gi].reshape(tensors[0].shape).astype(tensors[0].dtype)
    return tuple(o for group in outs for o in group)


def _sqrt(v, scalar: bool):
    if scalar:
        return float("nan") if v < 0 else v**0.5
    return np.sqrt(v)


# -- the update rules (arrays or Python floats) -------------------------------------------------------
def _rate(expr):
    """A learning rate in IEEE float64 (1 + T * decay = 0, a zero base to a negative T: +-inf or NaN, as numpy
    and onnx.reference give, not Python's ZeroDivisionError or a complex power)."""
    with np.errstate(all="ignore"):
        return float(expr(np.float64))


def _adagrad(r, t, x, g, h, a, scalar=False):
    lr = _rate(lambda f: f(r) / (1 + t * f(a["decay_factor"])))
    g_reg = a["norm_coefficient"] * x + g
    h_new = h + g_reg * g_reg
    x_new = x - lr * g_reg / (_sqrt(h_new, scalar) + a["epsilon"])
    return x_new, h_new


def _adam(r, t, x, g, v, h, a, scalar=False):
    alpha, beta = a["alpha"], a["beta"]
    g_reg = a["norm_coefficient"] * x + g
    v_new = alpha * v + (1 - alpha) * g_reg
    h_new = beta * h + (1 - beta) * g_reg * g_reg
    lr = _rate(lambda f: f(r) * np.sqrt(1 - f(beta) ** t) / (1 - f(alpha) ** t)) if t > 0 else r
    x_new = x - lr * v_new / (_sqrt(h_new, scalar) + a["epsilon"])
    return (1 - a["norm_coefficient_post"]) * x_new, v_new, h_new


def _momentum_mode(a) -> str:
    mode = a["mode"]
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("standard", "nesterov"):
        raise ParamInvalidError(
            f"Momentum: attribute 'mode' must be 'standard' or 'nesterov', got {mode!r}", op="Momentum"
        )
    return mode


def _momentum(r, t, x, g, v, a, scalar=False):
    g_reg = a["norm_coefficient"] * x + g
    beta = a["beta"] if t > 0 else 1.0
    v_new = a["alpha"] * v + beta * g_reg
    if _momentum_mode(a) == "nesterov":
        return x - r * (g_reg + a["alpha"] * v_new), v_new
    return x - r * v_new, v_new


Adagrad = _register(
    "Adagrad",
    [Attr("decay_factor", "float", 0.0), Attr("epsilon", "float", 1e-6), Attr("norm_coefficient", "float", 0.0)],
    _adagrad,
    "one ADAGRAD step: X_new, H_new from R, T, X, G, H",
)
Adam = _register(
    "Adam",
    [
        Attr("alpha", "float", 0.9),
        Attr("beta", "float", 0.999),
        Attr("epsilon", "float", 1e-6),
        Attr("norm_coefficient", "float", 0.0),
        Attr("norm_coefficient_post", "float", 0.0),
    ],
    _adam,
    "one Adam step: X_new, V_new, H_new from R, T, X, G, V, H",
)
Momentum = _register(
    "Momentum",
    [Attr("alpha", "float"), Attr("beta", "float"), Attr("mode", "string"), Attr("norm_coefficient", "float")],
    _momentum,
    "one SGD-with-momentum step (standard or Nesterov): X_new, V_new from R, T, X, G, V",
)


def _check_mode_infer(ctx):
    _momentum_mode(ctx.attrs)
    return _infer(ctx)


Momentum.infer = _check_mode_infer


# -- functional entry points -----------------------------------------------------------------------------
def _lists(fn, *groups):
    groups = [list(g) if isinstance(g, (list, tuple)) else [g] for g in groups]
    if len({len(g) for g in groups}) != 1 or not groups[0]:
        raise ParamInvalidError(
            f"{fn}: the tensor lists must be non-empty and of equal length, got lengths {[len(g) for g in groups]}"
        )
    return [x for g in groups for x in g], len(groups[0])


def _rt(lr, step, like_dtype=np.float32):
    return [np.asarray(lr, dtype=like_dtype), np.asarray(int(step), np.int64)]


def _dtype_of(x):
    return np.dtype(getattr(x, "dtype", np.float32))


@api("adagrad_step", "Adagrad", domain=DOMAIN)
def adagrad_step(lr, step, params, grads, sq_sums, decay_factor=0.0, eps=1e-6, weight_decay=0.0):
    """One ADAGRAD update of each tensor in ``params``; returns (*new params, *new squared sums)."""
    flat, n = _lists("adagrad_step", params, grads, sq_sums)
    return (
        _rt(lr, step, _dtype_of(flat[0])) + flat,
        {"decay_factor": float(decay_factor), "epsilon": float(eps), "norm_coefficient": float(weight_decay)},
        2 * n,
    )


@api("adam_step", "Adam", domain=DOMAIN)
def adam_step(
    lr,
    step,
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    beta1=0.9,
    beta2=0.999,
    eps=1e-6,
    weight_decay=0.0,
    weight_decay_post=0.0,
):
    """One Adam update; returns (*new params, *new first moments, *new second moments)."""
    flat, n = _lists("adam_step", params, grads, exp_avgs, exp_avg_sqs)
    return (
        _rt(lr, step, _dtype_of(flat[0])) + flat,
        {
            "alpha": float(beta1),
            "beta": float(beta2),
            "epsilon": float(eps),
            "norm_coefficient": float(weight_decay),
            "norm_coefficient_post": float(weight_decay_post),
        },
        3 * n,
    )


@api("momentum_step", "Momentum", domain=DOMAIN)
def momentum_step(lr, step, params, grads, momenta, alpha=0.9, beta=1.0, nesterov=False, weight_decay=0.0):
    """One SGD-with-momentum update; returns (*new params, *new momenta)."""
    flat, n = _lists("momentum_step", params, grads, momenta)
    return (
        _rt(lr, step, _dtype_of(flat[0])) + flat,
        {
            "alpha": float(alpha),
            "beta": float(beta),
            "mode": "nesterov" if nesterov else "standard",
            "norm_coefficient": float(weight_decay),
        },
        2 * n,
    )


__all__ = ["adagrad_step", "adam_step", "momentum_step"]


# -- in-place multi-tensor optimizer updates (opsnn domain) ------------------------------------------------
# ``ApplySGD`` / ``ApplyAdamW`` / ``ApplyNAdam`` / ``ApplyRAdam`` / ``ApplyAdamax`` / ``ApplyRMSprop`` /
# ``ApplyAdagrad`` / ``ApplyAdadelta`` are torch's steps of those optimizers over any number of tensors in
# one record, as ops-nn's aclnnApplyAdamW / aclnnFusedSgd: the hyper-parameters (learning rate included)
# arrive as a runtime float64 table with one row per tensor, the switches as an int64 table, so an LR
# schedule or a new Adam step count changes no graph constant. The outputs are the new tensors and
# states; a compiled training step binds each to the memory of its input (in place), and the kernel
# writes elementwise, so an output may be its own input.
OPSNN = "opsnn"

#: op -> (hyper columns, flag columns)
_APPLY = {
    "ApplySGD": (4, 3),
    "ApplyAdamW": (7, 3),
    "ApplyRMSprop": (5, 3),
    "ApplyAdagrad": (5, 1),
    "ApplyNAdam": (8, 2),
    "ApplyRAdam": (7, 3),
    "ApplyAdamax": (6, 1),
    "ApplyAdadelta": (4, 1),
}
#: op -> state tensors per optimized tensor, for the ops whose state layout has no options
_FIXED_STATES = {"ApplyAdagrad": 1, "ApplyNAdam": 2, "ApplyRAdam": 2, "ApplyAdamax": 2, "ApplyAdadelta": 2}


def _apply_states(op: str, attrs) -> int:
    """State tensors per optimized tensor, as the node's attributes say."""
    if op in _FIXED_STATES:
        return _FIXED_STATES[op]
    if op == "ApplySGD":
        return 1 if attrs.get("momentum_buffers", 1) else 0
    if op == "ApplyRMSprop":
        return 1 + bool(attrs.get("momentum_buffers", 0)) + bool(attrs.get("centered", 0))
    return 3 if attrs.get("amsgrad", 0) else 2


def _apply_count(op: str, n_inputs: int, attrs) -> int:
    per = 2 + _apply_states(op, attrs)
    n = n_inputs - 2
    if n <= 0 or n % per:
        raise ParamInvalidError(
            f"{op}: expects hyper, flags and then {per} tensors per optimized tensor (params..., grads..., "
            f"states...), got {n_inputs} inputs",
            op=op,
        )
    return n // per


def _apply_infer(ctx):
    op = ctx.op.name
    n = _apply_count(op, len(ctx.inputs), ctx.attrs)
    cols = _APPLY[op]
    for i, (name, dt) in enumerate((("hyper", _dt.float64), ("flags", _dt.int64))):
        if ctx.dtype(i) != dt or tuple(ctx.shape(i)) != (n, cols[i]):
            ctx.fail(
                f"input {name!r} must be {_dt.name(dt)} of shape {(n, cols[i])}, got "
                f"{_dt.name(ctx.dtype(i))} {tuple(ctx.shape(i))}"
            )
    per = 2 + _apply_states(op, ctx.attrs)
    for k in range(n):
        shape, dt = tuple(ctx.shape(2 + k)), ctx.dtype(2 + k)
        for gi in range(1, per):
            j = 2 + gi * n + k
            if tuple(ctx.shape(j)) != shape or ctx.dtype(j) != dt:
                ctx.fail(
                    f"tensor {k}: input {j} is {_dt.name(ctx.dtype(j))} {tuple(ctx.shape(j))}, expected the "
                    f"parameter's {_dt.name(dt)} {shape}"
                )
    n_out = (per - 1) * n
    if ctx.num_outputs != n_out:
        ctx.fail(f"{n} optimized tensors give {n_out} outputs, the node asks for {ctx.num_outputs}")
    outs = [TensorMeta(tuple(ctx.shape(2 + k)), ctx.dtype(2 + k)) for k in range(n)]
    for gi in range(2, per):
        outs += [TensorMeta(tuple(ctx.shape(2 + gi * n + k)), ctx.dtype(2 + gi * n + k)) for k in range(n)]
    return outs


def _apply_groups(op, ins, outs, attrs):
    """(n, params, grads, states) with params and states the output arrays, holding the inputs' values."""
    n = _apply_count(op, len(ins), attrs)
    per = 2 + _apply_states(op, attrs)
    for k, src in enumerate(
        [ins[2 + k] for k in range(n)] + [ins[2 + gi * n + k] for gi in range(2, per) for k in range(n)]
    ):
        if outs[k] is not src:  # bound in place by a compiled step: nothing to copy
            np.copyto(outs[k], src)
    params = outs[:n]
    grads = [ins[2 + n + k] for k in range(n)]
    states = [outs[n * (1 + s) : n * (2 + s)] for s in range(per - 2)]
    return n, params, grads, states


def _apply_sgd_ref(ins, a):
    """torch.optim.SGD's rule read literally, per tensor, in float64."""
    n = _apply_count("ApplySGD", len(ins), a)
    hyper, flags = ins[0], ins[1]
    new_p, new_b = [], []
    for k in range(n):
        lr, mom, damp, wd = (float(v) for v in hyper[k])
        nesterov, maximize, first = (bool(v) for v in flags[k])
        p = ins[2 + k].astype(np.float64)
        g = ins[2 + n + k].astype(np.float64)
        g = -g if maximize else g
        if wd:
            g = g + wd * p
        if a.get("momentum_buffers", 1):
            b = g if first else mom * ins[2 + 2 * n + k].astype(np.float64) + (1 - damp) * g
            b = b.astype(ins[2 + k].dtype).astype(np.float64)  # torch keeps the buffer in the parameter's dtype
            new_b.append(b.astype(ins[2 + k].dtype))
            if mom:
                g = g + mom * b if nesterov else b
        new_p.append((p - lr * g).astype(ins[2 + k].dtype))
    return tuple(new_p + new_b)


def _apply_adamw_ref(ins, a):
    """torch.optim.Adam / AdamW's rule read literally, per tensor, in float64."""
    n = _apply_count("ApplyAdamW", len(ins), a)
    hyper, flags = ins[0], ins[1]
    ams = bool(a.get("amsgrad", 0))
    outs_p, outs_m, outs_v, outs_vm = [], [], [], []
    for k in range(n):
        lr, b1, b2, eps, wd, bc1, bc2 = (float(v) for v in hyper[k])
        _ams_flag, decoupled, maximize = (bool(v) for v in flags[k])
        dt = ins[2 + k].dtype
        p = ins[2 + k].astype(np.float64)
        g = ins[2 + n + k].astype(np.float64)
        g = -g if maximize else g
        if wd:
            if decoupled:
                p = p * (1 - lr * wd)
            else:
                g = g + wd * p
        m = (b1 * ins[2 + 2 * n + k].astype(np.float64) + (1 - b1) * g).astype(dt)
        v = (b2 * ins[2 + 3 * n + k].astype(np.float64) + (1 - b2) * g * g).astype(dt)
        denom_v = v.astype(np.float64)
        if ams:
            vm = np.maximum(ins[2 + 4 * n + k], v)
            outs_vm.append(vm)
            denom_v = vm.astype(np.float64)
        outs_p.append((p - (lr / bc1) * m.astype(np.float64) / (np.sqrt(denom_v) / np.sqrt(bc2) + eps)).astype(dt))
        outs_m.append(m)
        outs_v.append(v)
    return tuple(outs_p + outs_m + outs_v + outs_vm)


def _rmsprop_slots(states, a):
    """(square_avg, momentum_buffer, grad_avg) lists of a node; an absent state is stood in for by
    square_avg, which the kernel then neither reads nor writes."""
    rest = iter(states[1:])
    buf = next(rest) if a.get("momentum_buffers", 0) else states[0]
    gavg = next(rest) if a.get("centered", 0) else states[0]
    return states[0], buf, gavg


def _apply_rmsprop_ref(ins, a):
    """torch.optim.RMSprop's rule read literally, per tensor, in float64 (states rounded when stored)."""
    n = _apply_count("ApplyRMSprop", len(ins), a)
    hyper, flags = ins[0], ins[1]
    mom_buf, centered = bool(a.get("momentum_buffers", 0)), bool(a.get("centered", 0))
    groups = [[ins[2 + gi * n + k] for k in range(n)] for gi in range(2 + _apply_states("ApplyRMSprop", a))]
    sq_in, buf_in, gavg_in = _rmsprop_slots(groups[2:], a)
    out_p, out_sq, out_buf, out_gavg = [], [], [], []
    for k in range(n):
        lr, alpha, eps, wd, mom = (float(v) for v in hyper[k])
        maximize = bool(flags[k][_K.RMS_MAXIMIZE])
        dt = ins[2 + k].dtype
        p = ins[2 + k].astype(np.float64)
        g = groups[1][k].astype(np.float64)
        g = -g if maximize else g
        if wd:
            g = g + wd * p
        sq = (alpha * sq_in[k].astype(np.float64) + (1 - alpha) * g * g).astype(dt)
        out_sq.append(sq)
        var = sq.astype(np.float64)
        if centered:
            ga = gavg_in[k].astype(np.float64)
            ga = (ga + (1 - alpha) * (g - ga)).astype(dt)
            out_gavg.append(ga)
            var = var - ga.astype(np.float64) ** 2
        avg = np.sqrt(var) + eps
        if mom_buf:
            b = (mom * buf_in[k].astype(np.float64) + g / avg).astype(dt)
            out_buf.append(b)
            out_p.append((p - lr * b.astype(np.float64)).astype(dt))
        else:
            out_p.append((p - lr * g / avg).astype(dt))
    return tuple(out_p + out_sq + out_buf + out_gavg)


def _ref_tensors(op, ins, a):
    """Per optimized tensor of a node: (hyper row, flags row, dtype, parameter, gradient, [states]), the
    arrays in float64; for the references below."""
    n = _apply_count(op, len(ins), a)
    for k in range(n):
        states = [ins[2 + (2 + s) * n + k].astype(np.float64) for s in range(_apply_states(op, a))]
        p, g = ins[2 + k].astype(np.float64), ins[2 + n + k].astype(np.float64)
        yield [float(v) for v in ins[0][k]], [bool(v) for v in ins[1][k]], ins[2 + k].dtype, p, g, states


def _ref_outputs(rows) -> tuple:
    """[(param, *states) per tensor] as a node's outputs: every parameter, then each state in turn."""
    return tuple(x for column in zip(*rows) for x in column)


def _ref_decayed(p, g, lr, wd, maximize, decoupled=False):
    """torch's maximize and weight decay (L2 into the gradient, or decoupled on the parameter)."""
    g = -g if maximize else g
    if wd and decoupled:
        return p * (1 - lr * wd), g
    return p, (g + wd * p if wd else g)


def _apply_adagrad_ref(ins, a):
    """torch.optim.Adagrad's rule read literally, per tensor, in float64 (the sum rounded when stored)."""
    rows = []
    for (lr, lr_decay, wd, eps, step), f, dt, p, g, (acc,) in _ref_tensors("ApplyAdagrad", ins, a):
        p, g = _ref_decayed(p, g, lr, wd, f[_K.ADAGRAD_MAXIMIZE])
        clr = lr / (1 + (step - 1) * lr_decay)
        acc = (acc + g * g).astype(dt)
        rows.append(((p - clr * g / (np.sqrt(acc.astype(np.float64)) + eps)).astype(dt), acc))
    return _ref_outputs(rows)


def _ref_moments(m, v, g, b1, b2, dt):
    """Adam's exp_avg and exp_avg_sq, rounded to the parameter's dtype as torch stores them."""
    return (m + (1 - b1) * (g - m)).astype(dt), (b2 * v + (1 - b2) * g * g).astype(dt)


def _apply_nadam_ref(ins, a):
    """torch.optim.NAdam's rule read literally, per tensor, in float64 (states rounded when stored)."""
    rows = []
    for h, f, dt, p, g, (m, v) in _ref_tensors("ApplyNAdam", ins, a):
        lr, b1, b2, eps, wd, bc2, grad_coef, avg_coef = h
        p, g = _ref_decayed(p, g, lr, wd, f[_K.FAMILY_MAXIMIZE], f[_K.FAMILY_DECOUPLED])
        m, v = _ref_moments(m, v, g, b1, b2, dt)
        denom = np.sqrt(v.astype(np.float64) / bc2) + eps
        rows.append(((p - grad_coef * g / denom - avg_coef * m.astype(np.float64) / denom).astype(dt), m, v))
    return _ref_outputs(rows)


def _apply_radam_ref(ins, a):
    """torch.optim.RAdam's rule read literally, per tensor, in float64 (states rounded when stored)."""
    rows = []
    for h, f, dt, p, g, (m, v) in _ref_tensors("ApplyRAdam", ins, a):
        lr, b1, b2, eps, wd, step_size, bc2_sqrt = h
        p, g = _ref_decayed(p, g, lr, wd, f[_K.FAMILY_MAXIMIZE], f[_K.FAMILY_DECOUPLED])
        m, v = _ref_moments(m, v, g, b1, b2, dt)
        update = step_size * m.astype(np.float64)
        if f[_K.RADAM_RECTIFIED]:
            update = update * (bc2_sqrt / (np.sqrt(v.astype(np.float64)) + eps))
        rows.append(((p - update).astype(dt), m, v))
    return _ref_outputs(rows)


def _apply_adamax_ref(ins, a):
    """torch.optim.Adamax's rule read literally, per tensor, in float64 (states rounded when stored)."""
    rows = []
    for (lr, b1, b2, eps, wd, clr), f, dt, p, g, (m, u) in _ref_tensors("ApplyAdamax", ins, a):
        p, g = _ref_decayed(p, g, lr, wd, f[_K.ADAMAX_MAXIMIZE])
        m = (m + (1 - b1) * (g - m)).astype(dt)
        u = np.maximum(b2 * u, np.abs(g) + eps).astype(dt)
        rows.append(((p - clr * m.astype(np.float64) / u.astype(np.float64)).astype(dt), m, u))
    return _ref_outputs(rows)


def _apply_adadelta_ref(ins, a):
    """torch.optim.Adadelta's rule read literally, per tensor, in float64 (states rounded when stored)."""
    rows = []
    for (lr, rho, eps, wd), f, dt, p, g, (sq, acc) in _ref_tensors("ApplyAdadelta", ins, a):
        p, g = _ref_decayed(p, g, lr, wd, f[_K.ADADELTA_MAXIMIZE])
        sq = (rho * sq + (1 - rho) * g * g).astype(dt)
        delta = np.sqrt(acc + eps) / np.sqrt(sq.astype(np.float64) + eps) * g
        acc = (rho * acc + (1 - rho) * delta * delta).astype(dt)
        rows.append(((p - lr * delta).astype(dt), sq, acc))
    return _ref_outputs(rows)


def _chunks_plan(op):
    def plan(ctx):
        n = _apply_count(op, len(ctx.inputs), ctx.attrs)
        return {"chunks": _K.chunk_table([int(np.prod(ctx.shape(2 + k))) for k in range(n)])}

    return plan


def _flat(arrays):
    return _K.typed_list([a.reshape(-1) for a in arrays])


def _flat_grads(grads):
    """Gradients as flat contiguous arrays (a node may receive strided views)."""
    return _flat([np.ascontiguousarray(g) for g in grads])


def _apply_sgd_kernel(ins, outs, a, plan, ws):
    n, params, grads, states = _apply_groups("ApplySGD", ins, outs, a)
    bufs = states[0] if states else params  # no buffer: the kernel never writes one (momentum is 0)
    _K.sgd_step(
        _flat(params),
        _flat_grads(grads),
        _flat(bufs),
        plan["chunks"],
        np.ascontiguousarray(ins[0], np.float64),
        np.ascontiguousarray(ins[1], np.int64),
    )


def _apply_adamw_kernel(ins, outs, a, plan, ws):
    n, params, grads, states = _apply_groups("ApplyAdamW", ins, outs, a)
    m, v = states[0], states[1]
    vmax = states[2] if len(states) > 2 else v
    flags = np.array(ins[1], np.int64)
    flags[:, 0] = 1 if len(states) > 2 else 0  # amsgrad follows the node's state count
    _K.adam_step(
        _flat(params),
        _flat_grads(grads),
        _flat(m),
        _flat(v),
        _flat(vmax),
        plan["chunks"],
        np.ascontiguousarray(ins[0], np.float64),
        flags,
    )


def _apply_rmsprop_kernel(ins, outs, a, plan, ws):
    n, params, grads, states = _apply_groups("ApplyRMSprop", ins, outs, a)
    sq, buf, gavg = _rmsprop_slots(states, a)
    flags = np.array(ins[1], np.int64)
    # which states exist follows the node's attributes, whatever the flags table says
    flags[:, _K.RMS_CENTERED] = int(bool(a.get("centered", 0)))
    flags[:, _K.RMS_MOMENTUM_BUFFER] = int(bool(a.get("momentum_buffers", 0)))
    _K.rmsprop_step(
        _flat(params),
        _flat_grads(grads),
        _flat(sq),
        _flat(buf),
        _flat(gavg),
        plan["chunks"],
        np.ascontiguousarray(ins[0], np.float64),
        flags,
    )


def _fixed_states_kernel(op, step):
    """The kernel of an op with a fixed state layout: ``step(params, grads, *states, chunks, hyper, flags)``."""

    def kernel(ins, outs, a, plan, ws):
        _n, params, grads, states = _apply_groups(op, ins, outs, a)
        step(
            _flat(params),
            _flat_grads(grads),
            *[_flat(s) for s in states],
            plan["chunks"],
            np.ascontiguousarray(ins[0], np.float64),
            np.ascontiguousarray(ins[1], np.int64),
        )

    return kernel


def _register_apply(op, attrs, reference, kernel, doc):
    rec = register_op(
        op,
        domain=OPSNN,
        category="training",
        inputs=[
            Input("hyper", (_dt.float64,)),
            Input("flags", (_dt.int64,)),
            Input("tensors", (_dt.float32, _dt.float64), variadic=True),
        ],
        outputs=[Output("updated", variadic=True)],
        attrs=attrs,
        infer=_apply_infer,
        reference=reference,
        doc=doc,
    )
    rec.output_count = lambda values, a: (1 + _apply_states(op, a)) * _apply_count(op, len(values), a)
    rec.kernel(
        f"{op.lower()}_numba",
        dtypes=None,
        priority=10,
        plan=_chunks_plan(op),
        doc="one parallel numba kernel over every tensor in chunks (kernels.cpu.optimizer), float64 arithmetic",
    )(kernel)
    return rec


ApplySGD = _register_apply(
    "ApplySGD",
    [Attr("momentum_buffers", "int", 1, "1: a momentum buffer per tensor (inputs and outputs); 0: none")],
    _apply_sgd_ref,
    _apply_sgd_kernel,
    "torch's SGD step over many tensors (momentum, dampening, Nesterov, weight decay, maximize): inputs "
    "hyper (n, 4) float64 [lr, momentum, dampening, weight_decay], flags (n, 3) int64 [nesterov, maximize, "
    "first step], params..., grads..., momentum buffers...; outputs new params..., new buffers...",
)
ApplyAdamW = _register_apply(
    "ApplyAdamW",
    [Attr("amsgrad", "int", 0, "1: a max_exp_avg_sq state per tensor")],
    _apply_adamw_ref,
    _apply_adamw_kernel,
    "torch's Adam / AdamW step over many tensors (flags choose decoupled weight decay): inputs hyper (n, 7) "
    "float64 [lr, beta1, beta2, eps, weight_decay, 1-beta1^t, 1-beta2^t], flags (n, 3) int64 [amsgrad, "
    "decoupled, maximize], params..., grads..., exp_avg..., exp_avg_sq... [, max_exp_avg_sq...]; outputs "
    "new params..., new states...",
)

ApplyRMSprop = _register_apply(
    "ApplyRMSprop",
    [
        Attr("momentum_buffers", "int", 0, "1: a momentum_buffer state per tensor (momentum > 0)"),
        Attr("centered", "int", 0, "1: a grad_avg state per tensor (centered RMSprop)"),
    ],
    _apply_rmsprop_ref,
    _apply_rmsprop_kernel,
    "torch's RMSprop step over many tensors (weight decay, centered, momentum, maximize): inputs hyper (n, 5) "
    "float64 [lr, alpha, eps, weight_decay, momentum], flags (n, 3) int64 [centered, maximize, momentum "
    "buffer], params..., grads..., square_avg... [, momentum_buffer...] [, grad_avg...]; outputs new "
    "params..., new states...",
)
ApplyAdagrad = _register_apply(
    "ApplyAdagrad",
    [],
    _apply_adagrad_ref,
    _fixed_states_kernel("ApplyAdagrad", _K.adagrad_step),
    "torch's Adagrad step over many tensors (lr decay, weight decay, maximize): inputs hyper (n, 5) float64 "
    "[lr, lr_decay, weight_decay, eps, step], flags (n, 1) int64 [maximize], params..., grads..., sum...; "
    "outputs new params..., new sums...",
)

ApplyNAdam = _register_apply(
    "ApplyNAdam",
    [],
    _apply_nadam_ref,
    _fixed_states_kernel("ApplyNAdam", _K.nadam_step),
    "torch's NAdam step over many tensors (momentum decay, L2 or decoupled weight decay, maximize): inputs "
    "hyper (n, 8) float64 [lr, beta1, beta2, eps, weight_decay, 1-beta2^t, lr(1-mu_t)/(1-mu_product), "
    "lr mu_t+1/(1-mu_product mu_t+1)], flags (n, 2) int64 [decoupled, maximize], params..., grads..., "
    "exp_avg..., exp_avg_sq...; outputs new params..., new states...",
)
ApplyRAdam = _register_apply(
    "ApplyRAdam",
    [],
    _apply_radam_ref,
    _fixed_states_kernel("ApplyRAdam", _K.radam_step),
    "torch's RAdam step over many tensors (L2 or decoupled weight decay, maximize): inputs hyper (n, 7) "
    "float64 [lr, beta1, beta2, eps, weight_decay, lr rect/(1-beta1^t), sqrt(1-beta2^t)], flags (n, 3) "
    "int64 [decoupled, maximize, rectified (rho_t > 5)], params..., grads..., exp_avg..., exp_avg_sq...; "
    "outputs new params..., new states...",
)
ApplyAdamax = _register_apply(
    "ApplyAdamax",
    [],
    _apply_adamax_ref,
    _fixed_states_kernel("ApplyAdamax", _K.adamax_step),
    "torch's Adamax step over many tensors (weight decay, maximize): inputs hyper (n, 6) float64 [lr, beta1, "
    "beta2, eps, weight_decay, lr/(1-beta1^t)], flags (n, 1) int64 [maximize], params..., grads..., "
    "exp_avg..., exp_inf...; outputs new params..., new states...",
)
ApplyAdadelta = _register_apply(
    "ApplyAdadelta",
    [],
    _apply_adadelta_ref,
    _fixed_states_kernel("ApplyAdadelta", _K.adadelta_step),
    "torch's Adadelta step over many tensors (rho, eps, weight decay, maximize): inputs hyper (n, 4) float64 "
    "[lr, rho, eps, weight_decay], flags (n, 1) int64 [maximize], params..., grads..., square_avg..., "
    "acc_delta...; outputs new params..., new states...",
)


def _assign_infer(ctx):
    ref, val = ctx.inputs[0], ctx.inputs[1]
    if tuple(val.shape) != tuple(ref.shape):
        ctx.fail(f"value has shape {tuple(val.shape)}, the target {tuple(ref.shape)}")
    return [TensorMeta(tuple(ref.shape), ref.dtype)]


Assign = register_op(
    "Assign",
    domain=OPSNN,
    category="training",
    inputs=[Input("ref"), Input("value")],
    outputs=[Output("output")],
    infer=_assign_infer,
    reference=lambda ins, a: np.array(ins[1], dtype=ins[0].dtype),
    doc="the new value of a state tensor (BatchNorm's running statistics): a compiled training step "
    "binds the output to the target's memory, so the value is written in place",
)


@Assign.kernel("assign_copy", priority=10, strided=True, doc="numpy copyto (cast to the target's dtype)")
def _assign_kernel(ins, outs, a, plan, ws):
    np.copyto(outs[0], ins[1], casting="unsafe")


@api("apply_sgd", "ApplySGD", domain=OPSNN)
def apply_sgd(hyper, flags, params, grads, momentum_buffers=None):
    """One fused SGD update of ``params`` (see the record); returns (*new params, *new buffers)."""
    groups = [params, grads] + ([momentum_buffers] if momentum_buffers is not None else [])
    flat, n = _lists("apply_sgd", *groups)
    return [hyper, flags] + flat, {"momentum_buffers": int(momentum_buffers is not None)}, (len(groups) - 1) * n


@api("apply_adamw", "ApplyAdamW", domain=OPSNN)
def apply_adamw(hyper, flags, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None):
    """One fused Adam/AdamW update (see the record); returns (*new params, *new states)."""
    groups = [params, grads, exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if max_exp_avg_sqs is not None else [])
    flat, n = _lists("apply_adamw", *groups)
    return [hyper, flags] + flat, {"amsgrad": int(max_exp_avg_sqs is not None)}, (len(groups) - 1) * n


@api("apply_rmsprop", "ApplyRMSprop", domain=OPSNN)
def apply_rmsprop(hyper, flags, params, grads, square_avgs, momentum_buffers=None, grad_avgs=None):
    """One fused RMSprop update (see the record); returns (*new params, *new states)."""
    extra = [s for s in (momentum_buffers, grad_avgs) if s is not None]
    flat, n = _lists("apply_rmsprop", params, grads, square_avgs, *extra)
    attrs = {"momentum_buffers": int(momentum_buffers is not None), "centered": int(grad_avgs is not None)}
    return [hyper, flags] + flat, attrs, (2 + len(extra)) * n


@api("apply_adagrad", "ApplyAdagrad", domain=OPSNN)
def apply_adagrad(hyper, flags, params, grads, sums):
    """One fused Adagrad update (see the record); returns (*new params, *new sums)."""
    flat, n = _lists("apply_adagrad", params, grads, sums)
    return [hyper, flags] + flat, {}, 2 * n


def _two_state_call(fn, hyper, flags, params, grads, first, second):
    flat, n = _lists(fn, params, grads, first, second)
    return [hyper, flags] + flat, {}, 3 * n


@api("apply_nadam", "ApplyNAdam", domain=OPSNN)
def apply_nadam(hyper, flags, params, grads, exp_avgs, exp_avg_sqs):
    """One fused NAdam update (see the record); returns (*new params, *new exp_avgs, *new exp_avg_sqs)."""
    return _two_state_call("apply_nadam", hyper, flags, params, grads, exp_avgs, exp_avg_sqs)


@api("apply_radam", "ApplyRAdam", domain=OPSNN)
def apply_radam(hyper, flags, params, grads, exp_avgs, exp_avg_sqs):
    """One fused RAdam update (see the record); returns (*new params, *new exp_avgs, *new exp_avg_sqs)."""
    return _two_state_call("apply_radam", hyper, flags, params, grads, exp_avgs, exp_avg_sqs)


@api("apply_adamax", "ApplyAdamax", domain=OPSNN)
def apply_adamax(hyper, flags, params, grads, exp_avgs, exp_infs):
    """One fused Adamax update (see the record); returns (*new params, *new exp_avgs, *new exp_infs)."""
    return _two_state_call("apply_adamax", hyper, flags, params, grads, exp_avgs, exp_infs)


@api("apply_adadelta", "ApplyAdadelta", domain=OPSNN)
def apply_adadelta(hyper, flags, params, grads, square_avgs, acc_deltas):
    """One fused Adadelta update (see the record); returns (*new params, *new square_avgs, *new acc_deltas)."""
    return _two_state_call("apply_adadelta", hyper, flags, params, grads, square_avgs, acc_deltas)


@api("assign", "Assign", domain=OPSNN)
def assign(ref, value):
    """The new value of state tensor ``ref`` (a copy; in a compiled training step, written in place)."""
    return [ref, value], {}


__all__ += [
    "apply_adadelta",
    "apply_adagrad",
    "apply_adamax",
    "apply_adamw",
    "apply_nadam",
    "apply_radam",
    "apply_rmsprop",
    "apply_sgd",
    "assign",
]
