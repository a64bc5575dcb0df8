"""Attention ops: ONNX ``Attention`` (opset 25) and ``RotaryEmbedding`` (opset 23), their
kernels and entry points (``attention``, ``scaled_dot_product_attention``, ``rotary_embedding``).

``Attention`` takes 4-D ``(B, H, S, D)`` inputs, or 3-D ``(B, S, H*D)`` ones with
``q_num_heads``/``kv_num_heads``; GQA/MQA when K/V have fewer heads; boolean
(True = attend) or additive masks, a last mask dim shorter than the key length is
padded with ``-inf``; ``is_causal`` is bottom-right aligned (offset = past length, or
``nonpad_kv_seqlen - Sq`` with an external cache); sliding windows; KV cache via
``past_key``/``past_value`` -> ``present_key``/``present_value``; softcap.

>>> import opsnn, numpy as np
>>> q = opsnn.tensor(np.random.rand(1, 4, 16, 8).astype(np.float32))
>>> y = opsnn.ops.scaled_dot_product_attention(q, q, q, is_causal=True)
>>> y.shape
(1, 4, 16, 8)
"""

from __future__ import annotations

import math

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, InferShapeError, ParamInvalidError
from ...kernels.cpu import attention as K
from ...kernels.cpu import attention_batched as KAB
from ...kernels.cpu import bf16_attention as KBA
from ...kernels.cpu import bf16_rotary as KBR
from ...kernels.cpu import libraries as KL
from ...kernels.cpu import mkl as KM
from ...kernels.cpu import mkl_nb as MN
from ...runtime import kernel_cache
from ...runtime.memory import check_request
from ..api import api
from ..autotune import NotPreferred
from ..registry import Attr, Input, Output, TensorMeta, register_op

FLOAT = _dt.FLOATS
_MASK = _dt.FLOATS + _dt.INTEGERS + (_dt.bool_,)
#: softmax_precision values (ONNX TensorProto codes) -> dtype
_PRECISION = {1: _dt.float32, 10: _dt.float16, 11: _dt.float64, 16: _dt.bfloat16}


# -- shapes ---------------------------------------------------------------------------------------
class _Dims:
    __slots__ = ("rank", "B", "Hq", "Hkv", "Sq", "Skv", "P", "T", "D", "Dv")


def _dims(ctx) -> _Dims:
    """Validate Attention's inputs; returns the canonical dims."""
    a = ctx.attrs
    q, k, v = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    rank = len(q.shape)
    if rank not in (3, 4) or len(k.shape) != rank or len(v.shape) != rank:
        ctx.fail(f"Q, K, V must all be 3-D or all 4-D, got shapes {q.shape}, {k.shape}, {v.shape}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise DTypeError(
            f"Attention: Q, K, V must share one dtype, got {_dt.name(q.dtype)}, {_dt.name(k.dtype)}, "
            f"{_dt.name(v.dtype)}",
            op="Attention",
        )
    d = _Dims()
    d.rank = rank
    qh, kvh = a.get("q_num_heads"), a.get("kv_num_heads")
    if rank == 4:
        d.B, d.Hq, d.Sq, d.D = q.shape
        _, d.Hkv, d.Skv, dk = k.shape
        d.Dv = v.shape[3]
        if (qh is not None and int(qh) != d.Hq) or (kvh is not None and int(kvh) != d.Hkv):
            raise ParamInvalidError(
                f"Attention: q_num_heads/kv_num_heads ({qh}, {kvh}) contradict the 4-D inputs' "
                f"head counts ({d.Hq}, {d.Hkv}); leave them unset for 4-D inputs",
                op="Attention",
            )
        if k.shape[0] != d.B or dk != d.D or tuple(v.shape[:3]) != (d.B, d.Hkv, d.Skv):
            ctx.fail(f"K must be (B={d.B}, Hkv, Skv, D={d.D}) and V (B, Hkv, Skv, Dv); got K {k.shape}, V {v.shape}")
    else:
        if qh is None or kvh is None:
            raise ParamInvalidError(
                "Attention: 3-D inputs need both q_num_heads and kv_num_heads attributes", op="Attention"
            )
        d.Hq, d.Hkv = int(qh), int(kvh)
        if d.Hq <= 0 or d.Hkv <= 0:
            raise ParamInvalidError(
                f"Attention: head counts must be positive, got q_num_heads={d.Hq}, kv_num_heads={d.Hkv}", op="Attention"
            )
        d.B, d.Sq, hq = q.shape
        _, d.Skv, hk = k.shape
        hv = v.shape[2]
        if hq % d.Hq or hk % d.Hkv or hv % d.Hkv:
            ctx.fail(f"hidden sizes ({hq}, {hk}, {hv}) must divide by the head counts (q {d.Hq}, kv {d.Hkv})")
        d.D, d.Dv = hq // d.Hq, hv // d.Hkv
        if hk // d.Hkv != d.D or k.shape[0] != d.B or tuple(v.shape[:2]) != (d.B, d.Skv):
            ctx.fail(
                f"K must be (B={d.B}, Skv, kv_num_heads*{d.D}) and V (B, Skv, kv_num_heads*Dv); "
                f"got K {k.shape}, V {v.shape}"
            )
    if d.Hkv <= 0 or d.Hq % d.Hkv:
        ctx.fail(f"q heads ({d.Hq}) must be a multiple of kv heads ({d.Hkv}), which must be at least 1")
    has_pk, has_pv = ctx.has(4), ctx.has(5)
    if has_pk != has_pv:
        raise ParamInvalidError("Attention: past_key and past_value must be given together", op="Attention")
    d.P = 0
    if has_pk:
        pk, pv = ctx.inputs[4], ctx.inputs[5]
        if len(pk.shape) != 4 or tuple(pk.shape[:2]) != (d.B, d.Hkv) or pk.shape[3] != d.D:
            ctx.fail(f"past_key must be (B={d.B}, Hkv={d.Hkv}, P, D={d.D}), got {pk.shape}")
        d.P = pk.shape[2]
        if tuple(pv.shape) != (d.B, d.Hkv, d.P, d.Dv):
            ctx.fail(f"past_value must be ({d.B}, {d.Hkv}, {d.P}, {d.Dv}), got {pv.shape}")
        if pk.dtype != q.dtype or pv.dtype != q.dtype:
            raise DTypeError("Attention: past_key/past_value must have Q's dtype", op="Attention")
    if ctx.has(6):
        if has_pk:
            raise ParamInvalidError(
                "Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value", op="Attention"
            )
        if tuple(ctx.inputs[6].shape) != (d.B,):
            ctx.fail(f"nonpad_kv_seqlen must have shape (B={d.B},), got {ctx.inputs[6].shape}")
    d.T = d.P + d.Skv
    if ctx.has(3):
        ms = tuple(ctx.inputs[3].shape)
        full = (d.B, d.Hq, d.Sq, d.T)
        if (
            not 1 <= len(ms) <= 4
            or ms[-1] > d.T
            or any(m != 1 and m != f for m, f in zip(ms[::-1][1:], full[::-1][1:]))
        ):
            ctx.fail(
                f"attn_mask of shape {ms} does not broadcast to (B, q_heads, Sq, total_kv) = {full} "
                "(its last dim may be shorter than total_kv)"
            )
    for name in ("left_window_size", "right_window_size"):
        if int(a[name]) < -1:
            raise ParamInvalidError(f"Attention: {name} must be -1 or >= 0, got {a[name]}", op="Attention")
    mode = int(a["qk_matmul_output_mode"])
    if mode not in (0, 1, 2, 3):
        raise ParamInvalidError(f"Attention: qk_matmul_output_mode must be 0..3, got {mode}", op="Attention")
    sp = a.get("softmax_precision")
    if sp is not None and int(sp) not in _PRECISION:
        raise ParamInvalidError(
            f"Attention: softmax_precision must be one of {sorted(_PRECISION)} "
            f"(FLOAT, FLOAT16, DOUBLE, BFLOAT16), got {sp}",
            op="Attention",
        )
    if float(a["softcap"]) < 0:
        raise ParamInvalidError(f"Attention: softcap must be >= 0, got {a['softcap']}", op="Attention")
    return d


def _infer_attention(ctx):
    d = _dims(ctx)
    dt = ctx.dtype(0)
    y = (d.B, d.Hq, d.Sq, d.Dv) if d.rank == 4 else (d.B, d.Sq, d.Hq * d.Dv)
    return [
        TensorMeta(y, dt),
        TensorMeta((d.B, d.Hkv, d.T, d.D), dt),
        TensorMeta((d.B, d.Hkv, d.T, d.Dv), dt),
        TensorMeta((d.B, d.Hq, d.Sq, d.T), dt),
    ]


def _to4(x, heads):
    """(B, S, H*D) -> (B, H, S, D) view; 4-D passes through."""
    if x.ndim == 4:
        return x
    B, S, HD = x.shape
    return x.reshape(B, S, heads, HD // heads).transpose(0, 2, 1, 3)


def _scale(attrs, D):
    s = attrs.get("scale")
    return 1.0 / math.sqrt(D) if s is None else float(s)


# -- reference: one (batch, head) at a time, explicit masks -----------------------------------------------
def _reference_attention(ins, attrs):
    return _reference_attention_lse(ins, attrs)[:4]


def _reference_attention_lse(ins, attrs):
    """Y, present_key, present_value, qk_matmul_output and the rows' logsumexp (float64)."""
    ins = list(ins) + [None] * (7 - len(ins))
    Q, Kx, Vx, mask, pk, pv, nonpad = ins
    dt = Q.dtype
    rank = Q.ndim
    Hq = Q.shape[1] if rank == 4 else int(attrs["q_num_heads"])
    Hkv = Kx.shape[1] if rank == 4 else int(attrs["kv_num_heads"])
    q, k, v = _to4(Q, Hq), _to4(Kx, Hkv), _to4(Vx, Hkv)
    if pk is not None:
        k = np.concatenate([pk, k], axis=2)
        v = np.concatenate([pv, v], axis=2)
    present_k, present_v = k.copy(), v.copy()
    B, _, Sq, D = q.shape
    T = k.shape[2]
    scale = _scale(attrs, D)
    softcap = float(attrs["softcap"])
    causal = bool(attrs["is_causal"])
    left, right = int(attrs["left_window_size"]), int(attrs["right_window_size"])
    mode = int(attrs["qk_matmul_output_mode"])
    sp = attrs.get("softmax_precision")
    sdt = _PRECISION[int(sp)] if sp is not None else np.dtype(np.float64)
    ydt = np.float64
    Y = np.zeros((B, Hq, Sq, v.shape[3]), ydt)
    QK = np.zeros((B, Hq, Sq, T), ydt)
    LSE = np.full((B, Hq, Sq), -np.inf)
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    group = Hq // Hkv
    for b in range(B):
        if pk is not None:
            off = pk.shape[2]
        elif nonpad is not None:
            off = int(nonpad[b]) - Sq
        else:
            off = 0
        for h in range(Hq):
            hk = h // group
            raw = (q[b, h].astype(ydt) * scale) @ k[b, hk].astype(ydt).T  # (Sq, T)
            capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
            bias = np.zeros((Sq, T))
            for i in range(Sq):
                p = i + off
                for j in range(T):
                    ok = True
                    if causal and j > p:
                        ok = False
                    if left >= 0 and j < p - left:
                        ok = False
                    if right >= 0 and j > p + right:
                        ok = False
                    if nonpad is not None and j >= nonpad[b]:
                        ok = False
                    if mask is not None:
                        if j >= m4.shape[3]:
                            ok = False
                        else:
                            mv = m4[min(b, m4.shape[0] - 1), min(h, m4.shape[1] - 1), min(i, m4.shape[2] - 1), j]
                            if mask.dtype == np.bool_:
                                ok = ok and bool(mv)
                            else:
                                bias[i, j] += float(mv)
                    if not ok:
                        bias[i, j] = -np.inf
            scores = capped + bias
            probs = np.zeros((Sq, T))
            for i in range(Sq):
                row = scores[i].astype(sdt)
                if np.all(np.isneginf(bias[i])):
                    continue  # fully masked row -> zeros
                e = np.exp(row - row.max())
                probs[i] = (e / e.sum()).astype(np.float64)
                LSE[b, h, i] = float(row.max()) + math.log(float(e.sum()))
            Y[b, h] = probs.astype(dt).astype(ydt) @ v[b, hk].astype(ydt)
            QK[b, h] = (raw, capped, scores, probs)[mode]
    if rank == 3:
        Y = Y.transpose(0, 2, 1, 3).reshape(B, Sq, -1)
    return Y.astype(dt), present_k.astype(dt), present_v.astype(dt), QK.astype(dt), LSE


# -- kernels --------------------------------------------------------------------------------------------
def _common_plan(ctx):
    d = _dims(ctx)
    a = ctx.attrs
    return {
        "d": d,
        "scale": _scale(a, d.D),
        "softcap": float(a["softcap"]),
        "causal": bool(a["is_causal"]),
        "left": int(a["left_window_size"]),
        "right": int(a["right_window_size"]),
        "cdt": _dt.compute_dtype(ctx.dtype(0)),
    }


def _kv(ins, outs, plan, cdt):
    """K and V as (B, Hkv, T, D) arrays: the present outputs when asked for (written here),
    else views of K/V themselves when there is no past."""
    d = plan["d"]
    _, Kx, Vx, _, pk, pv = ins[:6]
    k4, v4 = _to4(Kx, d.Hkv), _to4(Vx, d.Hkv)
    res = []
    for new, past, idx in ((k4, pk, 1), (v4, pv, 2)):
        out = outs[idx] if len(outs) > idx else None
        if past is None and out is None:
            res.append(new)
            continue
        buf = out if out is not None else np.empty(new.shape[:2] + (d.T,) + new.shape[3:], cdt)
        if past is not None:
            buf[:, :, : d.P] = past
        buf[:, :, d.P :] = new
        res.append(buf)
    return res


def _offsets(ins, d):
    nonpad = ins[6] if len(ins) > 6 else None
    if nonpad is not None:
        kvlen = nonpad.astype(np.int64).reshape(d.B)
        off = kvlen - d.Sq
    else:
        kvlen = np.full(d.B, d.T, np.int64)
        off = np.full(d.B, d.P, np.int64)
    return kvlen, off


def _flash_applies(ctx, max_outputs=3):
    if ctx.num_outputs > max_outputs:
        return "qk_matmul_output needs the score matrix (attention_blas materialises it)"
    sp = ctx.attrs.get("softmax_precision")
    if sp is not None and _PRECISION.get(int(sp)) not in (_dt.float32, ctx.dtype(0)):
        return f"softmax_precision={sp} is wider than the fp32 accumulation of this kernel"
    return True


def _flash_plan(ctx):
    p = _common_plan(ctx)
    d = p["d"]
    p["BQ"], p["BK"] = K.flash_tiles(d.B, d.Hq, d.Sq, K.num_threads())
    p["nqb"] = -(-d.Sq // p["BQ"]) if d.Sq else 0
    p["parallel"] = d.B * d.Hq * d.Sq * d.T * d.D >= K.PARALLEL_MIN
    return p


_DUMMY_MASK = np.zeros((1, 1, 1, 1), np.float32)


def _flash(ins, outs, attrs, plan, ws, lse=None):
    ins = list(ins) + [None] * (7 - len(ins))
    d = plan["d"]
    k4, v4 = _kv(ins, outs, plan, np.float32)
    y = outs[0]
    y4 = y.reshape(d.B, d.Sq, d.Hq, d.Dv) if d.rank == 3 else y
    if d.B * d.Hq * d.Sq * d.Dv == 0:
        return
    q4 = np.ascontiguousarray(_to4(ins[0], d.Hq), dtype=np.float32)
    k4 = np.ascontiguousarray(k4, dtype=np.float32)
    v4 = np.ascontiguousarray(v4, dtype=np.float32)
    kvlen, off = _offsets(ins, d)
    fn = K.flash_parallel if plan["parallel"] else K.flash_serial
    fn(
        q4,
        k4,
        v4,
        y4,
        d.rank == 3,
        _mask4(ins[3]),
        ins[3] is not None,
        kvlen,
        off,
        plan["causal"],
        plan["left"],
        plan["right"],
        plan["scale"],
        plan["softcap"],
        d.Hq // d.Hkv,
        plan["nqb"],
        plan["BQ"],
        plan["BK"],
        *K.lse_arg(lse),
    )


def _mask4(mask):
    """The mask as an fp32 additive bias of rank 4 in its own (unbroadcast) shape."""
    if mask is None:
        return _DUMMY_MASK
    m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if m4.dtype == np.bool_:
        return np.where(m4, np.float32(0), np.float32(-np.inf))
    return np.ascontiguousarray(m4, dtype=np.float32)


#: attention_gemm materialises the (B, Hq, Sq, T) fp32 scores up to this size; longer
#: sequences run the flash kernel, whose memory is O(N * d)
GEMM_MAX_SCORE_BYTES = 16 << 20


def _gemm_applies(ctx, max_outputs=3):
    why = _flash_applies(ctx, max_outputs)
    if why is not True:
        return why
    if len(ctx.inputs) > 6 and ctx.inputs[6] is not None:
        return NotPreferred(
            "nonpad_kv_seqlen (a KV cache's per-request lengths): the flash kernel skips the "
            "unused cache rows, scores by GEMM would cover the whole capacity"
        )
    d = _dims(ctx)
    nbytes = 4 * d.B * d.Hq * d.Sq * d.T
    if nbytes > GEMM_MAX_SCORE_BYTES:
        return (
            f"the score matrix would take {nbytes >> 20} MiB (> {GEMM_MAX_SCORE_BYTES >> 20} MiB): "
            "the flash kernel streams it instead"
        )
    return True


def _gemm_kernel_applies(ctx, max_outputs=3):
    """attention_gemm's own predicate: :func:`_gemm_applies` (which the batched kernels share), and not
    preferred where it would copy Q and miss its one-region path."""
    why = _gemm_applies(ctx, max_outputs)
    if why is not True:
        return why
    d = _dims(ctx)
    if d.rank == 3 and d.Hq != d.Hkv and MN.addresses() is not None:
        return NotPreferred(
            "grouped query heads in the 3-D layout: Q would be copied to stack each group's heads and the "
            "products could not run as one region; attention_gemm_tiled reads the head views in place"
        )
    return True


def _gemm_plan(ctx):
    p = _common_plan(ctx)
    d = p["d"]
    p["parallel"] = d.B * d.Hq * d.Sq * d.T >= K.PARALLEL_MIN // 16
    return p


def _gemm_workspace(ctx, plan):
    d = plan["d"]
    return 4 * d.B * d.Hq * d.Sq * d.T


def _tiled_applies(ctx, max_outputs=3):
    why = _flash_applies(ctx, max_outputs)
    if why is not True:
        return why
    if MN.addresses() is None:
        return f"needs Intel MKL called from numba: {KM.unavailable() or 'not loaded'}"
    return True


def _tiled_plan(ctx):
    p = _common_plan(ctx)
    d = p["d"]
    # a block of query rows per task: at most the head dim (so the tiles, threads x bq x T
    # floats, stay O(N d)), at least 16 rows for the products' sake
    p["bq"] = max(1, min(d.Sq, max(TILED_MIN_ROWS, min(TILED_MAX_ROWS, d.D))))
    p["threads"] = K.num_threads()
    return p


def _tiled_workspace(ctx, plan):
    d = plan["d"]
    return 4 * plan["threads"] * plan["bq"] * d.T


def _tiled(ins, outs, attrs, plan, ws, lse=None):
    """attention_gemm_tiled: blocks of query rows on per-thread score tiles (K.gemm_tiled)."""
    ins = list(ins) + [None] * (7 - len(ins))
    d = plan["d"]
    k4, v4 = _kv(ins, outs, plan, np.float32)
    if d.B * d.Hq * d.Sq * d.Dv == 0:
        return
    y = outs[0]
    y4 = _to4(y, d.Hq)
    if not d.T or not d.D:  # no keys, or scores of zero-length vectors: the reference path's answer
        _blas(ins, outs, attrs, plan, None, lse)
        return
    q4, out = _to4(ins[0], d.Hq), y4
    k_t = not _blasable(k4) and _blasable(k4.swapaxes(2, 3))  # keys stored transposed (a KV cache): as they are
    if k_t:
        k4 = k4.swapaxes(2, 3)
    q4, k4, v4 = (a if _blasable(a) else np.ascontiguousarray(a, dtype=np.float32) for a in (q4, k4, v4))
    if not _blasable(y4):
        out = np.empty(y4.shape, np.float32)
    tiles = ws[: _tiled_workspace(None, plan)].view(np.float32).reshape(plan["threads"], plan["bq"], d.T)
    kvlen, off = _offsets(ins, d)
    K.gemm_tiled(
        q4,
        k4,
        k_t,
        v4,
        out,
        tiles,
        _mask4(ins[3]),
        ins[3] is not None,
        kvlen,
        off,
        plan["causal"],
        plan["left"],
        plan["right"],
        np.float32(plan["scale"]),
        np.float32(plan["softcap"]),
        plan["bq"],
        MN.addresses(),
        lse,
    )
    if out is not y4:
        np.copyto(y4, out)


#: query rows per task of attention_gemm_tiled: at most TILED_MAX_ROWS, at most the head dim
#: unless that is below TILED_MIN_ROWS
TILED_MAX_ROWS = 64
TILED_MIN_ROWS = 16


def _blasable(a: np.ndarray) -> bool:
    """True when every matrix a[..., :, :] is one BLAS operand as it stands (float32, unit
    column stride, a row stride >= the row length): np.matmul then passes it with its leading
    dimension instead of copying. The head view of a 3-D (B, S, H*D) tensor qualifies."""
    if a.dtype != np.float32 or a.ndim < 2:
        return False
    isz = a.itemsize
    r, c = a.shape[-2:]
    rs, cs = a.strides[-2:]
    return (
        (c <= 1 or cs == isz)
        and (r <= 1 or (rs % isz == 0 and rs >= c * isz))
        and all(st >= 0 and st % isz == 0 for st in a.strides[:-2])
    )


def _matmul_out(a, b, c):
    np.matmul(a, b, out=c)


def _gemm(ins, outs, attrs, plan, ws, lse=None):
    """Scores by one batched BLAS GEMM per (batch, KV head) (GQA: the group's query heads
    stacked as rows), a parallel numba masked softmax in place, then probs @ V by BLAS.
    3-D (B, S, H*D) inputs and output (no GQA) go to BLAS as head-strided views (leading
    dimension H*D): no transposed copies of Q, K, V or Y. With MKL each product is one
    ``cblas_sgemm_batch`` over all heads, else numpy's matmul (a BLAS call per head), as
    :func:`opsnn.kernels.cpu.libraries.attention_gemms` decides. With MKL, when the
    (batch, KV head) tasks split evenly over the threads and Y is a BLAS operand, the three
    steps run as one region instead, a task per (batch, KV head) (``K.gemm_tasks``)."""
    ins = list(ins) + [None] * (7 - len(ins))
    d = plan["d"]
    k4, v4 = _kv(ins, outs, plan, np.float32)
    if d.B * d.Hq * d.Sq * d.Dv == 0:
        return
    g = d.Hq // d.Hkv
    rows = g * d.Sq
    q4 = _to4(ins[0], d.Hq)
    if g > 1 or not _blasable(q4):  # GQA stacks a group's query heads as rows of one GEMM
        q4 = np.ascontiguousarray(q4, dtype=np.float32).reshape(d.B, d.Hkv, rows, d.D)
    if not _blasable(k4):
        k4 = np.ascontiguousarray(k4, dtype=np.float32)
    if not _blasable(v4):
        v4 = np.ascontiguousarray(v4, dtype=np.float32)
    n = d.B * d.Hq * d.Sq * d.T
    s = ws[: 4 * n].view(np.float32).reshape(d.B, d.Hq, d.Sq, d.T) if n else np.empty((d.B, d.Hq, d.Sq, 0), np.float32)
    mkl = KL.attention_gemms().library == "mkl"
    y = outs[0]
    y4 = _to4(y, d.Hq) if d.rank == 3 else y
    # Y as (B, Hkv, rows, Dv) BLAS operands: the (head-strided) view itself, or a GQA group's rows
    yt = (
        y4
        if g == 1 and _blasable(y4)
        else y.reshape(d.B, d.Hkv, rows, d.Dv)
        if y.flags.c_contiguous and d.rank == 4
        else None
    )
    if mkl and yt is not None and d.T and d.D and K.tasks_balance(d.B * d.Hkv):
        # one region: a (batch, KV head) task runs both products and its softmax (K.gemm_tasks)
        kvlen, off = _offsets(ins, d)
        K.gemm_tasks(
            q4,
            k4,
            v4,
            yt,
            s,
            _mask4(ins[3]),
            ins[3] is not None,
            kvlen,
            off,
            plan["causal"],
            plan["left"],
            plan["right"],
            np.float32(plan["scale"]),
            np.float32(plan["softcap"]),
            plan["parallel"],
            MN.addresses(),
            K.CAUSAL_BLOCK_ROWS,
            lse=lse,
        )
        return
    if d.T:
        if mkl:  # one batched call instead of a BLAS call per head
            KM.matmul_batched(q4, k4, s.reshape(d.B, d.Hkv, rows, d.T), trans_b=True)
        else:
            np.matmul(q4, k4.swapaxes(-1, -2), out=s.reshape(d.B, d.Hkv, rows, d.T))
    kvlen, off = _offsets(ins, d)
    K.masked_softmax(
        s,
        _mask4(ins[3]),
        ins[3] is not None,
        kvlen,
        off,
        plan["causal"],
        plan["left"],
        plan["right"],
        np.float32(plan["scale"]),
        np.float32(plan["softcap"]),
        plan["parallel"],
        lse,
    )
    if g == 1 and _blasable(y4):
        # (B, H, S, Dv) itself or the head-strided view of a 3-D (B, S, H*Dv) Y: BLAS writes it in place
        (KM.matmul_batched if mkl else _matmul_out)(s, v4, y4)
    elif y.flags.c_contiguous and d.rank == 4:
        (KM.matmul_batched if mkl else _matmul_out)(
            s.reshape(d.B, d.Hkv, rows, d.T), v4, y.reshape(d.B, d.Hkv, rows, d.Dv)
        )
    else:
        yv = np.matmul(s.reshape(d.B, d.Hkv, rows, d.T), v4).reshape(d.B, d.Hq, d.Sq, d.Dv)
        np.copyto(y4, yv)


def _blas(ins, outs, attrs, plan, ws, lse=None):
    """Materialises scores with batched BLAS matmuls (needed for qk_matmul_output and
    softmax_precision=DOUBLE; also the float64 path)."""
    ins = list(ins) + [None] * (7 - len(ins))
    d = plan["d"]
    cdt = plan["cdt"]
    # the score matrix and the softmax's few copies of it, plus Q, K, V in the compute dtype, all
    # outside the pool: checked first (the sequence lengths are the user's)
    check_request(
        cdt.itemsize * (5 * d.B * d.Hq * d.Sq * d.T + d.B * (d.Hq * d.Sq * d.D + d.Hkv * d.T * (d.D + d.Dv))),
        "Attention (attention_blas): score matrices",
    )
    k4, v4 = _kv(ins, outs, plan, cdt)
    g = d.Hq // d.Hkv
    q5 = _to4(ins[0], d.Hq).astype(cdt).reshape(d.B, d.Hkv, g, d.Sq, d.D)
    raw = np.matmul(q5 * cdt.type(plan["scale"]), k4.astype(cdt)[:, :, None].swapaxes(-1, -2))
    raw = raw.reshape(d.B, d.Hq, d.Sq, d.T)
    sc = plan["softcap"]
    capped = sc * np.tanh(raw / sc) if sc > 0 else raw
    # additive bias (B|1, Hq|1, Sq, T) from mask, causal, window and nonpad lengths
    kvlen, off = _offsets(ins, d)
    j = np.arange(d.T)
    pos = np.arange(d.Sq)[None, :, None] + off[:, None, None]  # (B, Sq, 1)
    allowed = j[None, None, :] < kvlen[:, None, None]
    if plan["causal"]:
        allowed = allowed & (j <= pos)
    if plan["left"] >= 0:
        allowed = allowed & (j >= pos - plan["left"])
    if plan["right"] >= 0:
        allowed = allowed & (j <= pos + plan["right"])
    bias = np.where(allowed, cdt.type(0), cdt.type(-np.inf))[:, None]  # (B, 1, Sq, T)
    mask = ins[3]
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        pad = d.T - m4.shape[3]
        if m4.dtype == np.bool_:
            mb = np.where(m4, cdt.type(0), cdt.type(-np.inf))
        else:
            mb = m4.astype(cdt)
        if pad:
            mb = np.concatenate([mb, np.full(mb.shape[:3] + (pad,), -np.inf, cdt)], axis=3)
        # a key outside the causal/window/length limits never contributes, whatever its mask value (NaN, +inf)
        with np.errstate(invalid="ignore"):  # -inf + inf where masked: computed, then discarded
            bias = np.where(np.isneginf(bias), bias, bias + mb)
    scores = capped + bias
    sp = attrs.get("softmax_precision")
    sdt = _PRECISION[int(sp)] if sp is not None else cdt
    if sdt in (_dt.float16, _dt.bfloat16):
        s = scores.astype(sdt).astype(np.float32)  # round to the requested precision
    else:
        s = scores.astype(sdt)
    dead = np.isneginf(bias).all(axis=-1, keepdims=True)
    mx = np.where(dead, 0, s.max(axis=-1, keepdims=True, initial=-np.inf))
    e = np.exp(s - mx)
    tot = e.sum(axis=-1, keepdims=True)
    probs = np.where(dead, 0, e / np.where(tot == 0, 1, tot)).astype(cdt)
    if lse is not None:
        with np.errstate(divide="ignore"):
            lse[:] = np.where(dead, -np.inf, mx + np.log(tot)).reshape(-1)
    if sdt in (_dt.float16, _dt.bfloat16):
        probs = probs.astype(sdt).astype(cdt)
    yv = np.matmul(probs.reshape(d.B, d.Hkv, g, d.Sq, d.T), v4.astype(cdt)[:, :, None])
    yv = yv.reshape(d.B, d.Hq, d.Sq, d.Dv)
    if d.rank == 3:
        yv = yv.transpose(0, 2, 1, 3).reshape(d.B, d.Sq, d.Hq * d.Dv)
    np.copyto(outs[0], yv, casting="unsafe")
    if len(outs) > 3:
        mode = int(attrs["qk_matmul_output_mode"])
        np.copyto(outs[3], (raw, capped, scores, probs)[mode], casting="unsafe")


#: the tiled kernels' NaN/Inf semantics (attention_blas adds every mask to the scores, as the definition does)
FORWARD_NONFINITE = (
    "the attention mask is added to the scores as the definition does (NaN + -inf = NaN makes a row NaN), "
    "but keys the causal frontier, the sliding window, nonpad_kv_seqlen or a short mask rule out are left "
    "out, so a NaN or +Inf score there never reaches its row; a row every key of which is masked is "
    "zeros, decided on the masks as ONNX's fully-masked-row guard does, whatever its scores"
)

Attention = register_op(
    "Attention",
    category="attention",
    inputs=[
        Input("Q", FLOAT),
        Input("K", FLOAT),
        Input("V", FLOAT),
        Input("attn_mask", _MASK, optional=True),
        Input("past_key", FLOAT, optional=True),
        Input("past_value", FLOAT, optional=True),
        Input("nonpad_kv_seqlen", (_dt.int64, _dt.int32), optional=True),
    ],
    outputs=["Y", Output("present_key", True), Output("present_value", True), Output("qk_matmul_output", True)],
    attrs=[
        Attr("is_causal", "int", 0),
        Attr("kv_num_heads", "int", None),
        Attr("q_num_heads", "int", None),
        Attr("qk_matmul_output_mode", "int", 0),
        Attr("scale", "float", None),
        Attr("softcap", "float", 0.0),
        Attr("softmax_precision", "int", None),
        Attr("left_window_size", "int", -1),
        Attr("right_window_size", "int", -1),
    ],
    infer=_infer_attention,
    reference=_reference_attention,
    doc="scaled dot-product attention with masks, GQA, KV cache, softcap and sliding windows",
)
Attention.kernel(
    "attention_flash",
    dtypes=(_dt.float32,),
    nonfinite=FORWARD_NONFINITE,
    priority=20,
    applies=_flash_applies,
    plan=_flash_plan,
    doc="tiled online-softmax numba kernel (never materialises the score matrix)",
)(_flash)
Attention.kernel(
    "attention_gemm",
    dtypes=(_dt.float32,),
    nonfinite=FORWARD_NONFINITE,
    priority=25,
    applies=_gemm_kernel_applies,
    plan=_gemm_plan,
    workspace=_gemm_workspace,
    cold_alternative="attention_blas",
    doc="scores by batched BLAS into the workspace, numba masked softmax in place, probs @ V by "
    "BLAS; for score matrices up to GEMM_MAX_SCORE_BYTES",
)(_gemm)


def _batched_rejection(d, dtype, backward: bool = False) -> str | None:
    """Why the batched attention kernels (KAB) do not take these dims and dtype, or None."""
    if not (d.B * d.Hq * d.Sq and d.T and d.D and d.Dv):
        return "an empty dim"
    if d.B * d.Hq * d.Sq * d.T > KAB.MAX_SCORES:
        return f"{d.B * d.Hq * d.Sq * d.T} scores: more than {KAB.MAX_SCORES} held at once"
    if dtype == _dt.bfloat16:
        return KL.runtime_bf16_product()
    # the smallest product: (group * Sq) x D @ D x T per (batch, KV head)
    decide = KL.attention_grad_products if backward else KL.runtime_f32_product
    return decide((d.Hq // d.Hkv) * d.Sq, min(d.D, d.Dv), d.T, d.B * d.Hkv)


def _batched_applies_for(max_outputs: int):
    def applies(ctx):
        """KAB.forward where attention_gemm would materialise the scores and oneDNN's matmul runs these
        products (float32 by the strategy, bfloat16 natively)."""
        why = _gemm_applies(ctx, max_outputs)
        if why is not True:
            return why
        why = _batched_rejection(_dims(ctx), ctx.dtype(0))
        return True if why is None else why

    return applies


def _batched_workspace(ctx, plan):
    d = plan["d"]
    return KAB.forward_workspace_bytes(d.B * d.Hkv, (d.Hq // d.Hkv) * d.Sq, d.T, ctx.dtype(0) == _dt.bfloat16)


def _batched(ins, outs, attrs, plan, ws, lse=None):
    """attention_batched: KAB.forward on (B, H, S, D) views, the masking rules of attention_gemm."""
    d = plan["d"]
    ins = list(ins) + [None] * (7 - len(ins))
    k4, v4 = _kv(ins, outs, plan, ins[0].dtype)
    kvlen, off = _offsets(ins, d)
    rules = (
        _mask4(ins[3]), ins[3] is not None, kvlen, off, plan["causal"], plan["left"], plan["right"],
        np.float32(plan["scale"]), np.float32(plan["softcap"]),
    )  # fmt: skip
    KAB.forward(_to4(ins[0], d.Hq), k4, v4, rules, _to4(outs[0], d.Hq), lse, ws)


Attention.kernel(
    "attention_batched",
    dtypes=(_dt.float32, _dt.bfloat16),
    nonfinite=FORWARD_NONFINITE,
    priority=28,
    strided=True,
    applies=_batched_applies_for(3),
    plan=_common_plan,
    workspace=_batched_workspace,
    cold_alternative="attention_blas",
    doc="attention_gemm's masks and rules with its products on oneDNN: the scores of every (batch, KV head) "
    "as one batched matmul into float32 (KAB.forward), the masked softmax a row at a time (rounded once "
    "to bfloat16 for bf16 operands), Y = P V as another; where oneDNN's matmul runs these products",
)(_batched)
Attention.kernel(
    "attention_gemm_tiled",
    dtypes=(_dt.float32,),
    nonfinite=FORWARD_NONFINITE,
    priority=22,
    applies=_tiled_applies,
    plan=_tiled_plan,
    workspace=_tiled_workspace,
    doc="a task per (batch, head, block of query rows): scores by MKL into a per-thread tile, "
    "numba masked softmax, tile @ V by MKL; memory O(N d) (sequences whose score matrix "
    "attention_gemm will not materialise)",
)(_tiled)
Attention.kernel(
    "attention_blas",
    dtypes=(_dt.float32, _dt.float64),
    priority=10,
    plan=_common_plan,
    doc="batched BLAS matmuls over the full score matrix",
)(_blas)


# -- AttentionGrad (opsnn domain): dQ, dK, dV without the score matrix ------------------------------------
class _ForwardCall:
    """AttentionGrad's inputs seen as the forward Attention call (Q, K, V, attn_mask), so that
    :func:`_dims` checks them by the forward's own rules."""

    __slots__ = ("op", "attrs", "inputs")

    def __init__(self, ctx):
        self.op = ctx.op
        self.attrs = {**ctx.attrs, "qk_matmul_output_mode": 0, "softmax_precision": None}
        self.inputs = [ctx.inputs[1], ctx.inputs[2], ctx.inputs[3], ctx.inputs[5] if ctx.has(5) else None]

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def dtype(self, i: int):
        return self.inputs[i].dtype

    def fail(self, message: str) -> None:
        raise InferShapeError(f"{self.op.name}: {message}", op=self.op.name)


def _grad_dims(ctx) -> _Dims:
    d = _dims(_ForwardCall(ctx))
    q = ctx.inputs[1]
    y_shape = (d.B, d.Hq, d.Sq, d.Dv) if d.rank == 4 else (d.B, d.Sq, d.Hq * d.Dv)
    for i, name in ((0, "dY"), (4, "Y")):
        if tuple(ctx.shape(i)) != y_shape:
            ctx.fail(f"input {name!r} must have the forward output's shape {y_shape}, got {tuple(ctx.shape(i))}")
        if ctx.dtype(i) != q.dtype:
            raise DTypeError(
                f"AttentionGrad: input {name!r} must have Q's dtype {_dt.name(q.dtype)}, got {_dt.name(ctx.dtype(i))}",
                op="AttentionGrad",
            )
    if ctx.has(6) and tuple(ctx.shape(6)) != (d.B, d.Hq, d.Sq):
        ctx.fail(f"input 'logsumexp' must be (B, q_heads, Sq) = {(d.B, d.Hq, d.Sq)}, got {tuple(ctx.shape(6))}")
    return d


def _infer_attention_grad(ctx):
    _grad_dims(ctx)
    return [TensorMeta(tuple(ctx.shape(i)), ctx.dtype(i)) for i in (1, 2, 3)]


def _reference_attention_grad(ins, attrs):
    """The softmax-attention backward read literally, per (batch, head), in float64: P from the
    masked scores (the softmax, or exp(S - logsumexp) when the logsumexp is given; masked scores
    -inf, a row no key may attend 0), dS = P (dP - rowsum(dY Y)) on the pairs a row attends (0
    elsewhere) times the softcap's derivative, dQ = scale dS K, dK = scale dS^T Q, dV = P^T dY.
    rowsum(dY Y) equals rowsum(P dP) when Y is the forward's output, and the given logsumexp gives
    the softmax when it is the forward's; the op is defined with the Y and logsumexp it is given, as
    the flash kernels read them."""
    ins = list(ins) + [None] * (7 - len(ins))
    dY, Q, Kx, Vx, Yx, mask, lse = ins
    rank = Q.ndim
    Hq = Q.shape[1] if rank == 4 else int(attrs["q_num_heads"])
    Hkv = Kx.shape[1] if rank == 4 else int(attrs["kv_num_heads"])
    q, k, v, g, y = (_to4(x, h).astype(np.float64) for x, h in ((Q, Hq), (Kx, Hkv), (Vx, Hkv), (dY, Hq), (Yx, Hq)))
    B, _, Sq, D = q.shape
    T = k.shape[2]
    scale = _scale(attrs, D)
    cap = float(attrs["softcap"])
    left, right = int(attrs["left_window_size"]), int(attrs["right_window_size"])
    i, j = np.arange(Sq)[:, None], np.arange(T)[None, :]
    ok = np.ones((Sq, T), bool)
    if attrs["is_causal"]:
        ok &= j <= i
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    ok4, bias = ok[None, None], np.zeros((1, 1, 1, 1))
    if mask is not None:
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        mt = m4.shape[3]
        m4 = np.concatenate([m4, np.zeros(m4.shape[:3] + (T - mt,), m4.dtype)], axis=3)
        inside = j < mt  # keys past a short mask are masked
        if m4.dtype == np.bool_:
            ok4 = ok4 & m4 & inside
        else:
            bias = m4.astype(np.float64)
            ok4 = ok4 & ~np.isneginf(bias) & inside
    dq = np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros((B, Hkv, T, v.shape[3]))
    group = Hq // Hkv
    for b in range(B):
        for h in range(Hq):
            hk = h // group
            al = np.broadcast_to(ok4[min(b, ok4.shape[0] - 1), min(h, ok4.shape[1] - 1)], (Sq, T))
            bb = np.broadcast_to(bias[min(b, bias.shape[0] - 1), min(h, bias.shape[1] - 1)], (Sq, T))
            raw = scale * (q[b, h] @ k[b, hk].T)
            if cap > 0:
                t = np.tanh(raw / cap)
                sc, dcap = cap * t, 1 - t * t
            else:
                sc, dcap = raw, 1.0
            with np.errstate(invalid="ignore", over="ignore"):
                sc = np.where(al, sc + bb, -np.inf)
                dead = ~al.any(axis=1, keepdims=True)
                if lse is None:
                    top = np.where(dead, 0, sc.max(axis=1, keepdims=True, initial=-np.inf))
                    e = np.where(al, np.exp(sc - top), 0)
                    p = e / np.where(dead, 1, e.sum(axis=1, keepdims=True))
                else:
                    p = np.where(dead, 0, np.exp(sc - lse[b, h].astype(np.float64)[:, None]))
                dp = g[b, h] @ v[b, hk].T
                ds = np.where(al, p * (dp - (g[b, h] * y[b, h]).sum(axis=1, keepdims=True)) * dcap, 0)
            dq[b, h] = scale * (ds @ k[b, hk])
            dk[b, hk] += scale * (ds.T @ q[b, h])
            dv[b, hk] += p.T @ g[b, h]

    def back(x, like):
        return (x.transpose(0, 2, 1, 3).reshape(like.shape) if rank == 3 else x).astype(like.dtype)

    return back(dq, Q), back(dk, Kx), back(dv, Vx)


_DUMMY_PART = np.zeros((1, 1, 1, 1, 1), np.float32)


def _grad_plan_for(blas: bool):
    def plan(ctx):
        d = _grad_dims(ctx)
        a = ctx.attrs
        bq = max(1, min(K.BW_BLOCK_Q, d.Sq))
        parallel = d.B * d.Hq * d.Sq * d.T * max(d.D, d.Dv) >= K.PARALLEL_MIN
        units = (d.Hq // d.Hkv) * -(-d.Sq // bq)
        fns = MN.addresses() if blas else None
        return {
            "d": d,
            "scale": _scale(a, d.D),
            "softcap": float(a["softcap"]),
            "causal": bool(a["is_causal"]),
            "left": int(a["left_window_size"]),
            "right": int(a["right_window_size"]),
            "BQ": bq,
            "BK": K.BW_BLOCK_K,
            "nsplit": K.backward_splits(d.B, d.Hkv, units, K.num_threads()) if parallel else 1,
            "parallel": parallel,
            "fns": fns if fns is not None else np.zeros(3, np.int64),
        }

    return plan


def _grad_workspace(ctx, plan):
    d = plan["d"]
    return 4 * plan["nsplit"] * d.B * d.Hkv * d.T * (d.D + d.Dv) if plan["nsplit"] > 1 else 0


def _attention_grad_call(fn, arrays, lse, mask, plan, dst, d, ws) -> None:
    """Run the flash gradient ``fn`` (float32 or bf16) on (Q, K, V, Y, dY) as 4-D arrays into ``dst``
    (dQ, dK, dV), the split partial sums of dK / dV in the workspace."""
    nsplit = plan["nsplit"]
    part_k = part_v = _DUMMY_PART
    if nsplit > 1:
        nk, nv = nsplit * d.B * d.Hkv * d.T * d.D, nsplit * d.B * d.Hkv * d.T * d.Dv
        part = ws[: 4 * (nk + nv)].view(np.float32)
        part_k = part[:nk].reshape(nsplit, d.B, d.Hkv, d.T, d.D)
        part_v = part[nk:].reshape(nsplit, d.B, d.Hkv, d.T, d.Dv)
    fn(
        *arrays,
        None if lse is None else np.ascontiguousarray(lse, dtype=np.float32),
        _mask4(mask),
        mask is not None,
        plan["causal"],
        plan["left"],
        plan["right"],
        plan["scale"],
        plan["softcap"],
        plan["BQ"],
        plan["BK"],
        nsplit,
        *dst,
        part_k,
        part_v,
        plan["fns"],
        plan["parallel"],
    )


def _grad_inputs(ins, outs, attrs, plan):
    """The gradient kernels' operands: ((Q, K, V, Y, dY) and (dQ, dK, dV) as (B, H, S, D) views, the
    mask, the logsumexp; absent optional ones None), or None once ``outs`` hold the definition's zeros
    where there is nothing to stream (an empty batch, head, query or key dim)."""
    ins = list(ins) + [None] * (7 - len(ins))
    d = plan["d"]
    if not (d.B * d.Hq * d.Sq and d.T and d.D and d.Dv):
        for o, r in zip(outs, _reference_attention_grad(ins, attrs)):
            np.copyto(o, r, casting="unsafe")
        return None
    dY, Q, Kx, Vx, Y, mask, lse = ins
    heads = ((Q, d.Hq), (Kx, d.Hkv), (Vx, d.Hkv), (Y, d.Hq), (dY, d.Hq))
    return [_to4(x, h) for x, h in heads], [_to4(o, h) for o, h in zip(outs, (d.Hq, d.Hkv, d.Hkv))], mask, lse


def _attention_grad(ins, outs, attrs, plan, ws):
    """attention_grad_flash[_mkl]: K.attention_backward on (B, H, S, D) float32 copies of the inputs."""
    got = _grad_inputs(ins, outs, attrs, plan)
    if got is None:
        return
    arrays, res, mask, lse = got
    # C-contiguous float32 operands and results (O(N d) copies where the layout is 3-D or strided,
    # against the O(N^2 d) products): one compiled specialization of the kernel
    arrays = tuple(np.ascontiguousarray(a, dtype=np.float32) for a in arrays)
    dst = [r if r.flags.c_contiguous else np.empty(r.shape, np.float32) for r in res]
    _attention_grad_call(K.attention_backward, arrays, lse, mask, plan, dst, plan["d"], ws)
    for r, t in zip(res, dst):
        if t is not r:
            np.copyto(r, t)


#: AttentionGrad's kernels against its reference where inputs hold NaN or Inf
GRAD_NONFINITE = (
    "as the definition's whole-matrix products: a masked pair's dS is 0, so a NaN/Inf in V or dP never "
    "crosses one, but that 0 (and a probability's) still meets every key, query and dY row (0 x Inf = NaN "
    "in dQ, dK, dV), and a NaN softmax row (a NaN score, a +Inf one, all attended scores -inf, a NaN or "
    "-inf logsumexp) is NaN on its masked pairs too; a row no key may attend has P = 0. The tiles skip "
    "key blocks and zero masked pairs, so each (batch, KV head) task first reads its inputs' float32 "
    "bits (its heads' Q, dY and logsumexp rows, its K, NaN or +Inf in its mask planes, whose -inf only "
    "masks, and V and Y under a softcap) and where one is not finite runs an exact path: every key "
    "block, masked pairs multiplied in, the rows' logsumexp streamed to find the rows with a key, the "
    "softcap in float64. A given logsumexp with a -inf (a row no key may attend) takes that path too; "
    "finite inputs whose products overflow are not checked"
)


def _grad_mkl_applies(ctx):
    if MN.addresses() is None:
        return f"needs Intel MKL called from numba: {KM.unavailable() or 'not loaded'}"
    return True


AttentionGrad = register_op(
    "AttentionGrad",
    domain="opsnn",
    category="attention",
    inputs=[
        Input("dY", FLOAT),
        Input("Q", FLOAT),
        Input("K", FLOAT),
        Input("V", FLOAT),
        Input("Y", FLOAT),
        Input("attn_mask", _MASK, optional=True),
        Input("logsumexp", (_dt.float32,), optional=True),
    ],
    outputs=["dQ", "dK", "dV"],
    attrs=[
        Attr("is_causal", "int", 0),
        Attr("kv_num_heads", "int", None),
        Attr("q_num_heads", "int", None),
        Attr("scale", "float", None),
        Attr("softcap", "float", 0.0),
        Attr("left_window_size", "int", -1),
        Attr("right_window_size", "int", -1),
    ],
    infer=_infer_attention_grad,
    reference=_reference_attention_grad,
    doc="gradients of Attention (no KV cache) w.r.t. Q, K, V from dY, recomputing the probabilities per tile",
)
AttentionGrad.kernel(
    "attention_grad_flash_mkl",
    dtypes=(_dt.float32,),
    priority=20,
    strided=True,
    applies=_grad_mkl_applies,
    plan=_grad_plan_for(True),
    workspace=_grad_workspace,
    nonfinite=GRAD_NONFINITE,
    doc="flash-style backward (K.attention_backward): query x key tiles recomputed from Q, K and the "
    "rows' logsumexp, five products per tile on single-threaded MKL, O(N d) memory",
)(_attention_grad)
AttentionGrad.kernel(
    "attention_grad_flash",
    dtypes=(_dt.float32,),
    priority=10,
    strided=True,
    plan=_grad_plan_for(False),
    workspace=_grad_workspace,
    nonfinite=GRAD_NONFINITE,
    doc="the same tiles with the products as vectorized numba loops (no MKL)",
)(_attention_grad)


def _attention_grad_bf16(ins, outs, attrs, plan, ws):
    """attention_grad_flash_bf16: KBA.attention_backward_bf16 on the bfloat16 tensors as they are
    (uint16 views of their (B, H, S, D) layouts), float32 only in each task's scratch."""
    got = _grad_inputs(ins, outs, attrs, plan)
    if got is None:
        return
    arrays, res, mask, lse = got
    arrays = tuple(a.view(np.uint16) for a in arrays)
    dst = [r.view(np.uint16) for r in res]
    _attention_grad_call(KBA.attention_backward_bf16, arrays, lse, mask, plan, dst, plan["d"], ws)


AttentionGrad.kernel(
    "attention_grad_flash_bf16",
    dtypes=(_dt.bfloat16,),
    priority=30,  # before the float32 kernels, which take bfloat16 through the fp32 adapter
    strided=True,
    plan=_grad_plan_for(True),
    workspace=_grad_workspace,
    nonfinite=GRAD_NONFINITE,
    doc="attention_grad_flash[_mkl]'s tasks and tiles on bfloat16 storage: a (batch, KV head) task widens "
    "its K, V and its group's Q, Y, dY rows into float32 scratch, rounds dQ, dK, dV once (MKL products "
    "where loaded, else the vectorized loops)",
)(_attention_grad_bf16)


def _batched_grad_applies(ctx):
    """Whole-matrix batched products (KAB.backward) where the score matrices are small and oneDNN's
    matmul runs these products: no window or softcap, a given logsumexp, a mask only with float32
    operands."""
    a = ctx.attrs
    if not ctx.has(6):
        return "no logsumexp: the tiled kernels"
    if ctx.has(5) and ctx.dtype(1) != _dt.float32:
        return "an attention mask with bfloat16 operands: the tiled kernels"
    if a["softcap"] or a["left_window_size"] >= 0 or a["right_window_size"] >= 0:
        return "a softcap or a window: the tiled kernels"
    why = _batched_rejection(_grad_dims(ctx), ctx.dtype(1), backward=True)
    return True if why is None else why


def _batched_grad_plan(ctx):
    d = _grad_dims(ctx)
    return {"d": d, "scale": float(_scale(ctx.attrs, d.D)), "causal": bool(ctx.attrs["is_causal"])}


def _batched_grad_workspace(ctx, plan):
    d = plan["d"]
    return KAB.workspace_bytes(d.B * d.Hkv, (d.Hq // d.Hkv) * d.Sq, d.T, ctx.dtype(1) == _dt.bfloat16)


def _attention_grad_batched(ins, outs, attrs, plan, ws):
    """attention_grad_batched: KAB.backward on the (B, H, S, D) views of the operands."""
    got = _grad_inputs(ins, outs, attrs, plan)
    if got is None:
        return
    (q, k, v, y, dy), (dq, dk, dv), mask, lse = got
    m4 = None if mask is None else _mask4(mask)
    KAB.backward(q, k, v, y, dy, lse, plan["causal"], plan["scale"], dq, dk, dv, ws, mask=m4)


AttentionGrad.kernel(
    "attention_grad_batched",
    dtypes=(_dt.float32, _dt.bfloat16),
    priority=40,
    strided=True,
    applies=_batched_grad_applies,
    plan=_batched_grad_plan,
    workspace=_batched_grad_workspace,
    nonfinite="as the definition's whole-matrix products (it is them): P = exp(scale QK^T + mask - logsumexp) "
    "on attended pairs, exp(-inf - logsumexp) on the others, dS 0 on those, a row the mask leaves no key "
    "P = 0 (a NaN or +Inf mask value attends)",
    doc="short sequences, no window or softcap, given logsumexp (a mask: float32): the scores and dP of every "
    "(batch, KV head) as two oneDNN batched matmuls into float32, one pass per row to P and dS (the mask "
    "added there; rounded once to bfloat16 for bf16 operands), then dV, dQ, dK as three more; grouped heads "
    "summed inside the products",
)(_attention_grad_batched)


# -- AttentionTrain (opsnn domain): the training forward, Y and the rows' logsumexp -------------------------
def _infer_attention_train(ctx):
    d = _dims(ctx)
    y, pk, pv = _infer_attention(ctx)[:3]
    return [y, TensorMeta((d.B, d.Hq, d.Sq), _dt.float32), pk, pv]


def _reference_attention_train(ins, attrs):
    res = _reference_attention_lse(list(ins)[:4], attrs)
    return res[0], res[4].astype(np.float32), res[1], res[2]


def _with_lse(fn):
    """An Attention kernel run for AttentionTrain: Y and the present key/value where asked as
    Attention's outputs 0-2, the flat logsumexp written beside them (rows the kernel skips have no
    key: -inf)."""

    def run(ins, outs, attrs, plan, ws):
        y, lse = outs[0], outs[1]
        flat = lse.reshape(-1) if lse.flags.c_contiguous else np.empty(lse.size, np.float32)
        flat.fill(-np.inf)
        fn(list(ins)[:4] + [None] * 3, [y, *outs[2:]], attrs, plan, ws, lse=flat)
        if y.size == 0 and flat.size:
            # no values to weigh (an empty value dim): the kernels stop before their softmax, but the rows'
            # scores, and so their logsumexp, are there (zero-length keys: all 0, the log of the key count)
            flat[:] = _reference_attention_lse(list(ins)[:4], attrs)[4].astype(np.float32).reshape(-1)
        if not lse.flags.c_contiguous:
            np.copyto(lse, flat.reshape(lse.shape))

    run.__name__ = run.__qualname__ = fn.__name__ + "_lse"
    return run


#: bf16 autocast's Attention is recorded as AttentionTrain too (attention_train_tiled_bf16): its logsumexp is kept
_TRAIN_FLOAT = (_dt.float32, _dt.bfloat16)
AttentionTrain = register_op(
    "AttentionTrain",
    domain="opsnn",
    category="attention",
    inputs=[
        Input("Q", _TRAIN_FLOAT),
        Input("K", _TRAIN_FLOAT),
        Input("V", _TRAIN_FLOAT),
        Input("attn_mask", _MASK, optional=True),
    ],
    outputs=["Y", "logsumexp", Output("present_key", True), Output("present_value", True)],
    attrs=[
        Attr("is_causal", "int", 0),
        Attr("kv_num_heads", "int", None),
        Attr("q_num_heads", "int", None),
        Attr("qk_matmul_output_mode", "int", 0),
        Attr("scale", "float", None),
        Attr("softcap", "float", 0.0),
        Attr("softmax_precision", "int", None),
        Attr("left_window_size", "int", -1),
        Attr("right_window_size", "int", -1),
    ],
    infer=_infer_attention_train,
    reference=_reference_attention_train,
    doc="Attention (no KV cache) as a recorded training forward: Y and each row's logsumexp of its "
    "masked scores (B, q_heads, Sq), float32, which AttentionGrad reads instead of recomputing",
)
# AttentionTrain's outputs are Attention's with logsumexp second: a fourth is present_value, not
# the score matrix the streaming kernels cannot give (LLaMA asks for its present K/V)
AttentionTrain.kernel(
    "attention_train_gemm",
    dtypes=(_dt.float32,),
    priority=25,
    applies=lambda ctx: _gemm_kernel_applies(ctx, 4),
    plan=_gemm_plan,
    workspace=_gemm_workspace,
    doc="attention_gemm, the rows' logsumexp kept from its softmax",
)(_with_lse(_gemm))
AttentionTrain.kernel(
    "attention_train_gemm_tiled",
    dtypes=(_dt.float32,),
    priority=22,
    applies=lambda ctx: _tiled_applies(ctx, 4),
    plan=_tiled_plan,
    workspace=_tiled_workspace,
    doc="attention_gemm_tiled, the rows' logsumexp kept from its softmax",
)(_with_lse(_tiled))
AttentionTrain.kernel(
    "attention_train_flash",
    dtypes=(_dt.float32,),
    priority=20,
    applies=lambda ctx: _flash_applies(ctx, 4),
    plan=_flash_plan,
    doc="attention_flash, the rows' logsumexp from its running max and sum",
)(_with_lse(_flash))
AttentionTrain.kernel(
    "attention_train_blas",
    dtypes=(_dt.float32,),
    priority=10,
    plan=_common_plan,
    doc="attention_blas, the rows' logsumexp from its score matrix",
)(_with_lse(_blas))


def _attention_train_batched(ins, outs, attrs, plan, ws):
    """attention_train_batched: :func:`_batched` with the rows' logsumexp (output 1)."""
    _batched(list(ins)[:4], [outs[0], *outs[2:]], attrs, plan, ws, lse=outs[1])


AttentionTrain.kernel(
    "attention_train_batched",
    dtypes=(_dt.float32, _dt.bfloat16),
    nonfinite=FORWARD_NONFINITE,
    priority=40,
    strided=True,
    applies=_batched_applies_for(4),
    plan=_common_plan,
    workspace=_batched_workspace,
    cold_alternative="attention_train_blas",
    doc="attention_batched, the rows' logsumexp kept from its softmax",
)(_attention_train_batched)


def _train_bf16_plan(ctx):
    p = _tiled_plan(ctx)
    d = p["d"]
    p["parallel"] = d.B * d.Hq * d.Sq * d.T * d.D >= K.PARALLEL_MIN
    fns = MN.addresses()
    p["fns"] = fns if fns is not None else np.zeros(3, np.int64)
    return p


def _attention_train_bf16(ins, outs, attrs, plan, ws):
    """attention_train_tiled_bf16: KBA.attention_bf16 on the bfloat16 tensors as they are."""
    d = plan["d"]
    y, lse = outs[0], outs[1]
    flat = lse.reshape(-1) if lse.flags.c_contiguous else np.empty(lse.size, np.float32)
    flat.fill(-np.inf)
    if d.B * d.Hq * d.Sq * d.Dv and (not d.T or not d.D):  # no keys, or empty dot products: the blas path's answer
        _blas(list(ins)[:4] + [None] * 3, [y, *outs[2:]], attrs, plan, None, lse=flat)
    elif d.B * d.Hq * d.Sq * d.Dv:
        ins = list(ins)[:4] + [None] * 3
        k4, v4 = _kv(ins, [y, *outs[2:]], plan, None)
        kvlen, off = _offsets(ins, d)
        KBA.attention_bf16(
            _to4(ins[0], d.Hq).view(np.uint16),
            k4.view(np.uint16),
            v4.view(np.uint16),
            (y.reshape(d.B, d.Sq, d.Hq, d.Dv) if d.rank == 3 else y).view(np.uint16),
            d.rank == 3,
            _mask4(ins[3]),
            ins[3] is not None,
            kvlen,
            off,
            plan["causal"],
            plan["left"],
            plan["right"],
            plan["scale"],
            plan["softcap"],
            plan["bq"],
            plan["fns"],
            plan["parallel"],
            flat,
        )
    else:
        _kv(list(ins)[:4] + [None] * 3, [y, *outs[2:]], plan, None)
    if not lse.flags.c_contiguous:
        np.copyto(lse, flat.reshape(lse.shape))


AttentionTrain.kernel(
    "attention_train_tiled_bf16",
    dtypes=(_dt.bfloat16,),
    priority=30,  # before the float32 kernels, which take bfloat16 through the fp32 adapter
    strided=True,
    applies=lambda ctx: _flash_applies(ctx, 4),
    plan=_train_bf16_plan,
    doc="attention_gemm_tiled's tasks on bfloat16 storage: a (batch, head, block of query rows) task widens "
    "its rows and its KV head's keys and values into float32 scratch, scores into a per-thread tile, "
    "the masked softmax, the tile times V, Y rounded once; the logsumexp kept (MKL products where "
    "loaded, else vectorized loops)",
)(_attention_train_bf16)


# -- RotaryEmbedding ----------------------------------------------------------------------------------------
def _infer_rotary(ctx):
    x, cos, sin = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    a = ctx.attrs
    if len(x.shape) not in (3, 4):
        ctx.fail(f"input 'X' must be 3-D (B, S, H*D) or 4-D (B, H, S, D), got {x.shape}")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise DTypeError("RotaryEmbedding: cos_cache and sin_cache must have X's dtype", op="RotaryEmbedding")
    if len(x.shape) == 4:
        B, N, S, Dh = x.shape
        if a.get("num_heads") not in (None, 0) and int(a["num_heads"]) != N:
            ctx.fail(f"num_heads={a['num_heads']} contradicts X's head dim {N}")
    else:
        B, S, HD = x.shape
        n = a.get("num_heads")
        if not n or HD % int(n):
            raise ParamInvalidError(
                f"RotaryEmbedding: 3-D input needs num_heads dividing the hidden size {HD}, got {n}",
                op="RotaryEmbedding",
            )
        Dh = HD // int(n)
    rot = int(a["rotary_embedding_dim"]) or Dh
    if rot > Dh or rot % 2:
        raise ParamInvalidError(
            f"RotaryEmbedding: rotary_embedding_dim must be even and <= head size {Dh}, got {rot}", op="RotaryEmbedding"
        )
    if tuple(cos.shape) != tuple(sin.shape):
        ctx.fail(f"cos_cache {cos.shape} and sin_cache {sin.shape} must have one shape")
    if ctx.has(3):
        if tuple(ctx.inputs[3].shape) != (B, S):
            ctx.fail(f"position_ids must be (B={B}, S={S}), got {ctx.inputs[3].shape}")
        if len(cos.shape) != 2 or cos.shape[1] != rot // 2:
            ctx.fail(f"with position_ids the caches must be (max_position, {rot // 2}), got {cos.shape}")
    elif len(cos.shape) != 3 or cos.shape[0] not in (1, B) or cos.shape[1] != S or cos.shape[2] != rot // 2:
        ctx.fail(f"without position_ids the caches must be (B={B}, S={S}, {rot // 2}), got {cos.shape}")
    return [TensorMeta(x.shape, x.dtype)]


def _rotary_caches(ins):
    cos, sin = ins[1], ins[2]
    pos = ins[3] if len(ins) > 3 else None
    if pos is not None:
        if pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
            raise ParamInvalidError(
                f"RotaryEmbedding: position_ids must lie in [0, {cos.shape[0]}), got [{pos.min()}, {pos.max()}]",
                op="RotaryEmbedding",
            )
        cos, sin = cos[pos], sin[pos]
    return cos, sin


def _reference_rotary(ins, attrs):
    x = ins[0]
    cos, sin = _rotary_caches(ins)
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    if x.ndim == 4:
        xs = x.transpose(0, 2, 1, 3)  # (B, S, N, Dh)
    else:
        n = int(attrs["num_heads"])
        xs = x.reshape(x.shape[0], x.shape[1], n, -1)
    xs = xs.astype(np.float64)
    rot = int(attrs["rotary_embedding_dim"]) or xs.shape[3]
    half = rot // 2
    out = xs.copy()
    c = np.broadcast_to(cos, (xs.shape[0],) + cos.shape[1:])
    s = np.broadcast_to(sin, (xs.shape[0],) + sin.shape[1:])
    for k in range(half):
        i1, i2 = (2 * k, 2 * k + 1) if int(attrs["interleaved"]) else (k, k + half)
        ck, sk = c[:, :, None, k], s[:, :, None, k]
        out[..., i1] = ck * xs[..., i1] - sk * xs[..., i2]
        out[..., i2] = sk * xs[..., i1] + ck * xs[..., i2]
    out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
    return out.astype(x.dtype)


def _rotary_plan(ctx):
    x = ctx.inputs[0]
    a = ctx.attrs
    Dh = x.shape[3] if len(x.shape) == 4 else x.shape[2] // int(a["num_heads"])
    return {
        "rot": int(a["rotary_embedding_dim"]) or Dh,
        "heads": None if len(x.shape) == 4 else int(a["num_heads"]),
        "parallel": int(np.prod(x.shape)) >= (1 << 15),
    }


def _rotary(ins, outs, attrs, plan, ws):
    x = ins[0]
    cos, sin = _rotary_caches(ins)
    cos = np.ascontiguousarray(cos, np.float32)
    sin = np.ascontiguousarray(sin, np.float32)
    if x.ndim == 3:
        B, S, _ = x.shape
        x = x.reshape(B, S, plan["heads"], -1)
        y = outs[0].reshape(x.shape)
    else:
        y = outs[0]
    fn = K.rotary_parallel if plan["parallel"] else K.rotary_serial
    args = (x, cos, sin, y, ins[0].ndim == 4, bool(attrs["interleaved"]), plan["rot"])
    if kernel_cache.cold(fn, args):  # compiling in the background (ops/tiering.py): numpy meanwhile
        fn = K.rotary_numpy
    fn(*args)


RotaryEmbedding = register_op(
    "RotaryEmbedding",
    category="attention",
    inputs=[
        Input("X", (_dt.float32, _dt.float16, _dt.bfloat16)),
        Input("cos_cache", FLOAT),
        Input("sin_cache", FLOAT),
        Input("position_ids", (_dt.int64,), optional=True),
    ],
    outputs=["Y"],
    attrs=[Attr("interleaved", "int", 0), Attr("num_heads", "int", None), Attr("rotary_embedding_dim", "int", 0)],
    infer=_infer_rotary,
    reference=_reference_rotary,
    doc="rotary position embedding (RoPE)",
)
RotaryEmbedding.kernel(
    "rotary_numba", dtypes=(_dt.float32,), priority=10, plan=_rotary_plan, doc="numba, parallel over (batch, position)"
)(_rotary)


def _rotary_bf16(ins, outs, attrs, plan, ws):
    x = ins[0]
    cos, sin = _rotary_caches(ins)
    cos = np.ascontiguousarray(cos, np.float32)  # the tables' bfloat16 values, exactly
    sin = np.ascontiguousarray(sin, np.float32)
    y = outs[0]
    if x.ndim == 3:
        B, S, _ = x.shape
        x = x.reshape(B, S, plan["heads"], -1)
        y = y.reshape(x.shape)
    KBR.rotary_bf16(x, cos, sin, y, ins[0].ndim == 4, bool(attrs["interleaved"]), plan["rot"], plan["parallel"])


RotaryEmbedding.kernel(
    "rotary_numba_bf16",
    dtypes=(_dt.bfloat16,),
    priority=11,  # before rotary_numba, which takes bfloat16 through the fp32 adapter
    plan=_rotary_plan,
    doc="a (batch, position)'s heads widened to float32 scratch, rotated, rounded once (no float32 copies)",
)(_rotary_bf16)


# -- entry points ---------------------------------------------------------------------------------------------
@api("attention", "Attention")
def attention(
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    is_causal=False,
    scale=None,
    q_num_heads=None,
    kv_num_heads=None,
    softcap=0.0,
    softmax_precision=None,
    qk_matmul_output_mode=0,
    left_window_size=-1,
    right_window_size=-1,
    num_outputs=1,
):
    """ONNX ``Attention``. Returns ``Y``, or the first ``num_outputs`` of
    ``(Y, present_key, present_value, qk_matmul_output)``."""
    a = {
        "is_causal": int(bool(is_causal)),
        "softcap": float(softcap),
        "qk_matmul_output_mode": int(qk_matmul_output_mode),
        "left_window_size": int(left_window_size),
        "right_window_size": int(right_window_size),
    }
    for name, val in (
        ("scale", scale),
        ("q_num_heads", q_num_heads),
        ("kv_num_heads", kv_num_heads),
        ("softmax_precision", softmax_precision),
    ):
        if val is not None:
            a[name] = float(val) if name == "scale" else int(val)
    return [q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen], a, int(num_outputs)


@api("scaled_dot_product_attention", "Attention")
def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch-style SDPA: ``softmax(q k^T * scale + mask) v`` over ``(B, H, L, E)`` or ``(N, L, E)``
    inputs. A boolean mask marks positions that *take part*; a float mask is added.
    ``is_causal`` is the top-left causal mask. Unlike torch, a fully masked row gives 0, not NaN.

    >>> # y = opsnn.ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    """
    if dropout_p:
        raise ParamInvalidError(
            f"scaled_dot_product_attention: dropout_p must be 0 (inference only), got {dropout_p}", op="Attention"
        )
    if attn_mask is not None and is_causal:
        raise ParamInvalidError(
            "scaled_dot_product_attention: give either attn_mask or is_causal, not both", op="Attention"
        )
    from ...tensor import as_tensor

    q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
    a = {"is_causal": int(bool(is_causal))}
    if scale is not None:
        a["scale"] = float(scale)
    if q.ndim == 3:
        # one head of width E: ONNX's 3-D form with a single head is exactly torch's (N, L, E)
        a["q_num_heads"] = a["kv_num_heads"] = 1
        if attn_mask is not None:
            m = as_tensor(attn_mask)
            attn_mask = m.unsqueeze(-3) if m.ndim == 3 else m
    elif q.ndim != 4:
        raise ParamInvalidError(
            f"scaled_dot_product_attention: query must be 3-D (N, L, E) or 4-D (B, H, L, E), got shape {q.shape}",
            op="Attention",
        )
    elif k.ndim == 4 and k.shape[1] != q.shape[1] and not enable_gqa:
        raise ParamInvalidError(
            f"scaled_dot_product_attention: query has {q.shape[1]} heads, key {k.shape[1]}; "
            "pass enable_gqa=True for grouped-query attention",
            op="Attention",
        )
    return [q, k, v, attn_mask], a


@api("rotary_embedding", "RotaryEmbedding")
def rotary_embedding(
    x, cos_cache, sin_cache, position_ids=None, *, interleaved=False, num_heads=None, rotary_embedding_dim=0
):
    """Rotary position embedding (ONNX ``RotaryEmbedding``) on ``(B, H, S, D)`` or ``(B, S, H*D)``."""
    a = {"interleaved": int(bool(interleaved)), "rotary_embedding_dim": int(rotary_embedding_dim)}
    if num_heads is not None:
        a["num_heads"] = int(num_heads)
    return [x, cos_cache, sin_cache, position_ids], a


@api("attention_backward", "AttentionGrad", domain="opsnn")
def attention_backward(
    grad_y,
    q,
    k,
    v,
    y,
    attn_mask=None,
    logsumexp=None,
    *,
    is_causal=False,
    scale=None,
    q_num_heads=None,
    kv_num_heads=None,
    softcap=0.0,
    left_window_size=-1,
    right_window_size=-1,
):
    """The gradients ``(dQ, dK, dV)`` of ``Y = attention(q, k, v, attn_mask, ...)`` (no KV cache)
    given ``grad_y``, the forward's output ``y`` and optionally ``logsumexp`` (B, q_heads, Sq): each
    row's log-sum-exp of its masked scores (scaled, capped, mask added; -inf for a row with no key),
    recomputed when not given. The attributes are the forward call's. Memory O(N d): the
    probabilities are recomputed per tile, never stored.

    >>> # dq, dk, dv = opsnn.ops.attention_backward(dy, q, k, v, y, is_causal=True)
    """
    a = {
        "is_causal": int(bool(is_causal)),
        "softcap": float(softcap),
        "left_window_size": int(left_window_size),
        "right_window_size": int(right_window_size),
    }
    if scale is not None:
        a["scale"] = float(scale)
    if q_num_heads is not None:
        a["q_num_heads"] = int(q_num_heads)
    if kv_num_heads is not None:
        a["kv_num_heads"] = int(kv_num_heads)
    return [grad_y, q, k, v, y, attn_mask, logsumexp], a, 3


__all__ = ["attention", "scaled_dot_product_attention", "rotary_embedding", "attention_backward"]
