"""Classical-ML ops of the ``ai.onnx.ml`` domain: LabelEncoder, TreeEnsemble,
ArrayFeatureExtractor and Binarizer — records, kernels and functional entry points.

TreeEnsemble flattens the trees into arrays at prepare time and walks them in a numba
kernel, parallel over rows; the others are numpy kernels with their lookup tables built at
prepare time::

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array(["b", "z", "a"], dtype=object))
    >>> opsnn.ops.label_encode(x, keys=["a", "b"], values=[1, 2], default=-1).numpy()
    array([ 2, -1,  1])
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ..api import api
from ..registry import Attr, Input, TensorMeta, register_op
from .text import as_str

DOMAIN = "ai.onnx.ml"
OBJ = np.dtype(object)
I64 = _dt.int64


def _is_string(dt: np.dtype) -> bool:
    return dt.kind in "OUS"


def _tensor_attr(v):
    """A tensor attribute as a numpy array (run_op callers may pass ONNX TensorProtos)."""
    if v is not None and hasattr(v, "SerializeToString"):
        from onnx import numpy_helper

        return numpy_helper.to_array(v)
    return v


# == LabelEncoder ======================================================================================
class _Encoding:
    """Validated LabelEncoder attributes: keys, values, default and the output dtype."""

    def __init__(self, attrs):
        op = "LabelEncoder"
        keys = [
            (k, attrs[f"keys_{k}"]) for k in ("floats", "int64s", "strings", "tensor") if attrs[f"keys_{k}"] is not None
        ]
        vals = [
            (k, attrs[f"values_{k}"])
            for k in ("floats", "int64s", "strings", "tensor")
            if attrs[f"values_{k}"] is not None
        ]
        if len(keys) != 1 or len(vals) != 1:
            raise ParamInvalidError(
                f"{op}: exactly one keys_* and one values_* attribute must be set, got "
                f"{[f'keys_{k}' for k, _ in keys] + [f'values_{k}' for k, _ in vals]}",
                op=op,
            )
        (kk, kv), (vk, vv) = keys[0], vals[0]
        self.key_dtype, self.keys = self._column(kk, kv, "keys")
        self.out_dtype, self.values = self._column(vk, vv, "values")
        if len(self.keys) != len(self.values):
            raise ParamInvalidError(
                f"{op}: keys_{kk} has {len(self.keys)} entries, values_{vk} has "
                f"{len(self.values)}; they must be parallel",
                op=op,
            )
        if vk == "tensor":
            d = attrs["default_tensor"]
            if d is None:
                default = "_Unused" if _is_string(self.out_dtype) else (-1 if self.out_dtype.kind in "iu" else -0.0)
            else:
                d = np.asarray(_tensor_attr(d))
                if d.size != 1:
                    raise ParamInvalidError(f"{op}: 'default_tensor' must hold one value, got shape {d.shape}", op=op)
                default = d.reshape(-1)[0]
        else:
            default = {
                "floats": attrs["default_float"],
                "int64s": attrs["default_int64"],
                "strings": attrs["default_string"],
            }[vk]
        self.default = as_str(default, op) if _is_string(self.out_dtype) else self.out_dtype.type(default)

    @staticmethod
    def _column(kind, v, what):
        op = "LabelEncoder"
        if kind == "floats":
            return _dt.float32, [np.float32(f) for f in v]
        if kind == "int64s":
            return I64, [int(i) for i in v]
        if kind == "strings":
            return OBJ, [as_str(s, op) for s in v]
        a = np.asarray(_tensor_attr(v))
        if a.ndim != 1:
            raise ParamInvalidError(f"{op}: {what}_tensor must be 1-D, got shape {a.shape}", op=op)
        if _is_string(a.dtype):
            return OBJ, [as_str(s, op) for s in a.tolist()]
        return a.dtype, a.tolist()

    def check_input(self, dt: np.dtype) -> None:
        ok = _is_string(dt) if _is_string(self.key_dtype) else dt == self.key_dtype
        if not ok:
            raise DTypeError(
                f"LabelEncoder: input 'X' has dtype {_dt.name(dt)}; the keys need "
                f"{'string' if _is_string(self.key_dtype) else _dt.name(self.key_dtype)}",
                op="LabelEncoder",
            )


def _le_infer(ctx):
    enc = _Encoding(ctx.attrs)
    enc.check_input(ctx.dtype(0))
    return [TensorMeta(tuple(ctx.shape(0)), enc.out_dtype)]


def _le_key(v, string: bool):
    if string:
        return as_str(v, "LabelEncoder")
    if isinstance(v, float) and math.isnan(v):
        return "nan"  # NaN keys match any NaN input
    return v


def _le_reference(ins, attrs):
    enc = _Encoding(attrs)
    x = ins[0]
    string = _is_string(enc.key_dtype)
    out = np.empty(x.shape, enc.out_dtype)
    for idx in np.ndindex(*x.shape):
        v = x[idx].item() if not string else x[idx]
        res = enc.default
        for k, val in zip(enc.keys, enc.values):  # the last matching key wins
            kv = float(k) if not string and isinstance(k, np.floating) else k
            if _le_key(kv, string) == _le_key(v, string):
                res = val
        out[idx] = res
    return out


def _le_plan(ctx):
    enc = _Encoding(ctx.attrs)
    string = _is_string(enc.key_dtype)
    table = {}
    for k, v in zip(enc.keys, enc.values):
        kv = float(k) if isinstance(k, np.floating) else k
        table[_le_key(kv, string)] = v
    if string:
        return enc, table
    # numeric keys: sorted arrays for a vectorised searchsorted lookup (NaN handled apart)
    nan_value = table.pop("nan", None)
    keys = np.array(sorted(table), dtype=enc.key_dtype)
    vals = np.array([table[k.item()] for k in keys], dtype=enc.out_dtype) if keys.size else np.zeros(0, enc.out_dtype)
    return enc, (keys, vals, nan_value)


def _le_kernel(ins, outs, attrs, plan, ws):
    enc, table = plan
    x, out = ins[0], outs[0]
    if _is_string(enc.key_dtype):
        flat = out.reshape(-1)
        get, default = table.get, enc.default
        for i, v in enumerate(x.reshape(-1).tolist()):
            flat[i] = get(v if isinstance(v, str) else as_str(v, "LabelEncoder"), default)
        return
    keys, vals, nan_value = table
    out[...] = enc.default
    if keys.size:
        pos = np.clip(np.searchsorted(keys, x), 0, keys.size - 1)
        hit = keys[pos] == x
        out[hit] = vals[pos[hit]]
    if nan_value is not None and x.dtype.kind == "f":
        out[np.isnan(x)] = nan_value


_LE_ATTRS = [
    Attr("default_float", "float", -0.0),
    Attr("default_int64", "int", -1),
    Attr("default_string", "string", "_Unused"),
    Attr("default_tensor", "tensor", None),
] + [
    Attr(f"{side}_{k}", kind, None)
    for side in ("keys", "values")
    for k, kind in (("floats", "floats"), ("int64s", "ints"), ("strings", "strings"), ("tensor", "tensor"))
]

LabelEncoder = register_op(
    "LabelEncoder",
    domain=DOMAIN,
    category="ml",
    inputs=["X"],
    outputs=["Y"],
    attrs=_LE_ATTRS,
    infer=_le_infer,
    reference=_le_reference,
    doc="map each element through a key -> value table (default for unknown keys)",
)
LabelEncoder.kernel(
    "label_encoder_table",
    priority=5,
    plan=_le_plan,
    doc="hash table (strings) or sorted keys + searchsorted (numbers), built at prepare time",
)(_le_kernel)


# == TreeEnsemble ======================================================================================
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_AGG = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
_POST = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


class _Forest:
    """TreeEnsemble attributes validated and flattened into arrays."""

    def __init__(self, attrs, n_features: int | None = None):
        op = "TreeEnsemble"

        def arr(name, dtype, required=True):
            v = attrs[name]
            if v is None:
                if required:
                    raise ParamInvalidError(f"{op}: attribute {name!r} is required", op=op)
                return None
            return np.asarray(_tensor_attr(v)).reshape(-1).astype(dtype)

        self.feature = arr("nodes_featureids", np.int64)
        n = self.feature.shape[0]
        self.split = arr("nodes_splits", np.float64)
        self.mode = arr("nodes_modes", np.int64)
        self.true_id = arr("nodes_truenodeids", np.int64)
        self.true_leaf = arr("nodes_trueleafs", np.int64)
        self.false_id = arr("nodes_falsenodeids", np.int64)
        self.false_leaf = arr("nodes_falseleafs", np.int64)
        miss = arr("nodes_missing_value_tracks_true", np.int64, required=False)
        self.missing = np.zeros(n, np.int64) if miss is None else miss
        for name in ("split", "mode", "true_id", "true_leaf", "false_id", "false_leaf", "missing"):
            if getattr(self, name).shape[0] != n:
                raise ParamInvalidError(
                    f"{op}: every nodes_* attribute must have {n} entries (nodes_featureids); "
                    f"the one for {name} has {getattr(self, name).shape[0]}",
                    op=op,
                )
        self.leaf_weight = arr("leaf_weights", np.float64)
        self.leaf_target = arr("leaf_targetids", np.int64)
        nl = self.leaf_weight.shape[0]
        if self.leaf_target.shape[0] != nl:
            raise ParamInvalidError(
                f"{op}: leaf_weights ({nl}) and leaf_targetids ({self.leaf_target.shape[0]}) must have the same length",
                op=op,
            )
        self.roots = arr("tree_roots", np.int64)
        nt = attrs["n_targets"]
        self.n_targets = int(nt) if nt is not None else (int(self.leaf_target.max()) + 1 if nl else 0)
        if self.n_targets < 1:
            raise ParamInvalidError(f"{op}: 'n_targets' must be >= 1, got {self.n_targets}", op=op)
        if ((self.mode < _LEQ) | (self.mode > _MEMBER)).any():
            raise ParamInvalidError(f"{op}: nodes_modes must be in 0..6, got {sorted(set(self.mode.tolist()))}", op=op)
        for leaf, ids, what in ((self.true_leaf, self.true_id, "true"), (self.false_leaf, self.false_id, "false")):
            bound = np.where(leaf != 0, nl, n)
            if ((ids < 0) | (ids >= bound)).any():
                i = int(np.argmax((ids < 0) | (ids >= bound)))
                raise ParamInvalidError(
                    f"{op}: node {i}: {what} branch id {int(ids[i])} is out of range "
                    f"({'leaves' if leaf[i] else 'nodes'}: {int(bound[i])})",
                    op=op,
                )
        if ((self.roots < 0) | (self.roots >= n)).any():
            raise ParamInvalidError(f"{op}: tree_roots {self.roots.tolist()} must index nodes_* (size {n})", op=op)
        if ((self.leaf_target < 0) | (self.leaf_target >= self.n_targets)).any():
            raise ParamInvalidError(f"{op}: leaf_targetids must be in [0, n_targets={self.n_targets})", op=op)
        if n_features is not None and n and ((self.feature < 0) | (self.feature >= n_features)).any():
            raise ParamInvalidError(
                f"{op}: nodes_featureids must be in [0, {n_features}) (the input's features), got "
                f"{sorted(set(self.feature.tolist()))}",
                op=op,
            )
        # set membership: the sets, NaN-separated, in the order the MEMBER nodes appear
        members = arr("membership_values", np.float64, required=False)
        self.mstart = np.zeros(n, np.int64)
        self.mend = np.zeros(n, np.int64)
        self.members = np.zeros(0) if members is None else members
        member_nodes = np.flatnonzero(self.mode == _MEMBER)
        if member_nodes.size:
            if members is None:
                raise ParamInvalidError(f"{op}: BRANCH_MEMBER nodes need 'membership_values'", op=op)
            seps = np.flatnonzero(np.isnan(members))
            bounds = (
                np.concatenate([[-1], seps, [members.size]])
                if (not seps.size or seps[-1] != members.size - 1)
                else np.concatenate([[-1], seps])
            )
            if bounds.size - 1 < member_nodes.size:
                raise ParamInvalidError(
                    f"{op}: membership_values holds {bounds.size - 1} sets for {member_nodes.size} BRANCH_MEMBER nodes",
                    op=op,
                )
            for j, node in enumerate(member_nodes):
                self.mstart[node], self.mend[node] = bounds[j] + 1, bounds[j + 1]
        agg = int(attrs["aggregate_function"])
        post = int(attrs["post_transform"])
        if agg not in _AGG or post not in _POST:
            raise ParamInvalidError(
                f"{op}: aggregate_function must be in 0..3 and post_transform in 0..4, got {agg}, {post}", op=op
            )
        self.agg, self.post = agg, post
        self.n_nodes, self.n_leaves = n, nl

    def root_leaf(self) -> np.ndarray:
        """Leaf id of trees that are a single leaf (both branches of the root: the same leaf), else -1."""
        r = self.roots
        single = (self.true_leaf[r] != 0) & (self.false_leaf[r] != 0) & (self.true_id[r] == self.false_id[r])
        return np.where(single, self.true_id[r], -1)


@nb.njit(nogil=True, cache=True)
def _goes_true(v, mode, split, missing, members, m0, m1):
    if missing != 0 and math.isnan(v):
        return True
    if mode == _LEQ:
        return v <= split
    if mode == _LT:
        return v < split
    if mode == _GTE:
        return v >= split
    if mode == _GT:
        return v > split
    if mode == _EQ:
        return v == split
    if mode == _NEQ:
        return v != split
    for k in range(m0, m1):
        if members[k] == v:
            return True
    return False


@nb.njit(nogil=True, cache=True)
def _forest_rows(
    x,
    feature,
    split,
    mode,
    tid,
    tleaf,
    fid,
    fleaf,
    missing,
    members,
    mstart,
    mend,
    lw,
    lt,
    roots,
    root_leaf,
    agg,
    out,
    has,
    bad,
    r0,
    r1,
):
    """Rows [r0, r1): walk every tree, aggregate the leaf weights per target."""
    n_nodes = feature.shape[0]
    for r in range(r0, r1):
        for t in range(roots.shape[0]):
            leaf = root_leaf[t]
            node = roots[t]
            steps = 0
            while leaf < 0:
                steps += 1
                if steps > n_nodes:  # a cycle in the node graph
                    bad[r] = 1
                    break
                if _goes_true(
                    x[r, feature[node]], mode[node], split[node], missing[node], members, mstart[node], mend[node]
                ):
                    if tleaf[node] != 0:
                        leaf = tid[node]
                    else:
                        node = tid[node]
                else:
                    if fleaf[node] != 0:
                        leaf = fid[node]
                    else:
                        node = fid[node]
            if leaf < 0:
                continue
            j = lt[leaf]
            w = lw[leaf]
            if agg <= 1:  # AVERAGE / SUM
                out[r, j] += w
            elif agg == 2:
                out[r, j] = w if has[r, j] == 0 else min(out[r, j], w)
            else:
                out[r, j] = w if has[r, j] == 0 else max(out[r, j], w)
            has[r, j] = 1


#: rows per parallel work item
_ROW_BLOCK = 64
#: below this many (row, tree) walks the serial variant runs
_PARALLEL_MIN = 4096


@nb.njit(parallel=True, nogil=True, cache=True)
def _forest_parallel(
    x,
    feature,
    split,
    mode,
    tid,
    tleaf,
    fid,
    fleaf,
    missing,
    members,
    mstart,
    mend,
    lw,
    lt,
    roots,
    root_leaf,
    agg,
    out,
    has,
    bad,
):
    n = x.shape[0]
    for blk in nb.prange((n + _ROW_BLOCK - 1) // _ROW_BLOCK):
        _forest_rows(
            x,
            feature,
            split,
            mode,
            tid,
            tleaf,
            fid,
            fleaf,
            missing,
            members,
            mstart,
            mend,
            lw,
            lt,
            roots,
            root_leaf,
            agg,
            out,
            has,
            bad,
            blk * _ROW_BLOCK,
            min(n, (blk + 1) * _ROW_BLOCK),
        )


@nb.njit(nogil=True, cache=True)
def _forest_serial(
    x,
    feature,
    split,
    mode,
    tid,
    tleaf,
    fid,
    fleaf,
    missing,
    members,
    mstart,
    mend,
    lw,
    lt,
    roots,
    root_leaf,
    agg,
    out,
    has,
    bad,
):
    _forest_rows(
        x,
        feature,
        split,
        mode,
        tid,
        tleaf,
        fid,
        fleaf,
        missing,
        members,
        mstart,
        mend,
        lw,
        lt,
        roots,
        root_leaf,
        agg,
        out,
        has,
        bad,
        0,
        x.shape[0],
    )


def _erfinv(y: float) -> float:
    """Inverse error function by Newton steps on math.erf (|y| < 1)."""
    if y <= -1:
        return -math.inf
    if y >= 1:
        return math.inf
    # a rational start (Giles' single-precision approximation) then two Newton steps
    w = -math.log((1.0 - y) * (1.0 + y))
    if w < 5:
        w -= 2.5
        p = 2.81022636e-08
        for c in (
            3.43273939e-07,
            -3.5233877e-06,
            -4.39150654e-06,
            0.00021858087,
            -0.00125372503,
            -0.00417768164,
            0.246640727,
            1.50140941,
        ):
            p = c + p * w
    else:
        w = math.sqrt(w) - 3
        p = -0.000200214257
        for c in (
            0.000100950558,
            0.00134934322,
            -0.00367342844,
            0.00573950773,
            -0.0076224613,
            0.00943887047,
            1.00167406,
            2.83297682,
        ):
            p = c + p * w
    x = p * y
    for _ in range(2):
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def _post_transform(y: np.ndarray, post: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        if post == 1:  # SOFTMAX
            e = np.exp(y - y.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)
        if post == 2:  # LOGISTIC
            return 1.0 / (1.0 + np.exp(-y))
        if post == 3:  # SOFTMAX_ZERO: zeros stay zero and do not take part
            nz = y != 0
            m = np.where(nz, y, -np.inf).max(axis=1, keepdims=True)
            e = np.where(nz, np.exp(y - np.where(np.isfinite(m), m, 0)), 0.0)
            s = e.sum(axis=1, keepdims=True)
            return np.where(s > 0, e / np.where(s > 0, s, 1), 0.0)
        if post == 4:  # PROBIT
            return math.sqrt(2) * np.vectorize(_erfinv, otypes=[np.float64])(2 * y - 1) if y.size else y
    return y


def _te_infer(ctx):
    s = tuple(ctx.shape(0))
    if len(s) != 2:
        ctx.fail(f"input 'X' must have shape (N, F), got {s}")
    f = _Forest(ctx.attrs, s[1])
    return [TensorMeta((s[0], f.n_targets), ctx.dtype(0))]


def _te_reference(ins, attrs):
    x = ins[0]
    f = _Forest(attrs, x.shape[1])
    out = np.zeros((x.shape[0], f.n_targets))
    has = np.zeros(out.shape, bool)
    single = f.root_leaf()
    for r in range(x.shape[0]):
        for t, root in enumerate(f.roots):
            node, leaf = int(root), int(single[t])
            visited = set()
            while leaf < 0:
                if node in visited:
                    raise ParamInvalidError("TreeEnsemble: the node graph has a cycle", op="TreeEnsemble")
                visited.add(node)
                v = float(x[r, f.feature[node]])
                m = f.mode[node]
                if math.isnan(v) and f.missing[node]:
                    go = True
                elif m == _MEMBER:
                    go = v in set(f.members[f.mstart[node] : f.mend[node]].tolist())
                else:
                    s = f.split[node]
                    go = [v <= s, v < s, v >= s, v > s, v == s, v != s][m]
                leaf_flag, nxt = (f.true_leaf[node], f.true_id[node]) if go else (f.false_leaf[node], f.false_id[node])
                if leaf_flag:
                    leaf = int(nxt)
                else:
                    node = int(nxt)
            j, w = f.leaf_target[leaf], f.leaf_weight[leaf]
            if f.agg in (0, 1):
                out[r, j] += w
            elif f.agg == 2:
                out[r, j] = w if not has[r, j] else min(out[r, j], w)
            else:
                out[r, j] = w if not has[r, j] else max(out[r, j], w)
            has[r, j] = True
    if f.agg == 0 and f.roots.size:
        out /= f.roots.size
    return _post_transform(out, f.post).astype(x.dtype)


def _te_kernel(ins, outs, attrs, plan, ws):
    f, root_leaf, parallel = plan
    x = np.ascontiguousarray(ins[0], dtype=np.float64)
    n = x.shape[0]
    out = np.zeros((n, f.n_targets))
    has = np.zeros((n, f.n_targets), np.uint8)
    bad = np.zeros(n, np.uint8)
    if n and f.roots.size:
        walk = _forest_parallel if parallel else _forest_serial
        walk(
            x,
            f.feature,
            f.split,
            f.mode,
            f.true_id,
            f.true_leaf,
            f.false_id,
            f.false_leaf,
            f.missing,
            f.members,
            f.mstart,
            f.mend,
            f.leaf_weight,
            f.leaf_target,
            f.roots,
            root_leaf,
            f.agg,
            out,
            has,
            bad,
        )
    if bad.any():
        raise ParamInvalidError(
            "TreeEnsemble: the node graph has a cycle (a walk visited more nodes than exist)", op="TreeEnsemble"
        )
    if f.agg == 0 and f.roots.size:
        out /= f.roots.size
    np.copyto(outs[0], _post_transform(out, f.post), casting="unsafe")


TreeEnsemble = register_op(
    "TreeEnsemble",
    domain=DOMAIN,
    category="ml",
    inputs=[Input("X", _dt.FLOATS)],
    outputs=["Y"],
    attrs=[
        Attr("aggregate_function", "int", 1),
        Attr("leaf_targetids", "ints"),
        Attr("leaf_weights", "tensor"),
        Attr("membership_values", "tensor", None),
        Attr("n_targets", "int", None),
        Attr("nodes_falseleafs", "ints"),
        Attr("nodes_falsenodeids", "ints"),
        Attr("nodes_featureids", "ints"),
        Attr("nodes_hitrates", "tensor", None),
        Attr("nodes_missing_value_tracks_true", "ints", None),
        Attr("nodes_modes", "tensor"),
        Attr("nodes_splits", "tensor"),
        Attr("nodes_trueleafs", "ints"),
        Attr("nodes_truenodeids", "ints"),
        Attr("post_transform", "int", 0),
        Attr("tree_roots", "ints"),
    ],
    infer=_te_infer,
    reference=_te_reference,
    doc="sum / average / min / max of the leaf weights the trees reach, per target, then an optional transform",
)


def _te_plan(ctx):
    f = _Forest(ctx.attrs, ctx.shape(0)[1])
    return f, f.root_leaf(), ctx.shape(0)[0] * max(f.roots.size, 1) >= _PARALLEL_MIN


TreeEnsemble.kernel(
    "tree_ensemble_numba",
    priority=10,
    plan=_te_plan,
    doc="flattened trees walked by numba, parallel over rows (float64 compare and accumulate)",
)(_te_kernel)


# == ArrayFeatureExtractor =============================================================================
_AFE_TYPES = (_dt.float32, _dt.float64, _dt.int64, _dt.int32)


def _afe_infer(ctx):
    dt = ctx.dtype(0)
    if not (dt in _AFE_TYPES or _is_string(dt)):
        raise DTypeError(
            f"ArrayFeatureExtractor: input 'X' must be float, double, int32, int64 or string, got {_dt.name(dt)}",
            op="ArrayFeatureExtractor",
        )
    s = tuple(ctx.shape(0))
    if len(s) == 0:
        ctx.fail("input 'X' must have rank >= 1")
    k = math.prod(ctx.shape(1))
    return [TensorMeta((1, k) if len(s) == 1 else s[:-1] + (k,), OBJ if _is_string(dt) else dt)]


def _afe_indices(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    idx = y.reshape(-1).astype(np.int64)
    bad = (idx < 0) | (idx >= x.shape[-1])
    if bad.any():
        i = int(np.argmax(bad))
        raise ParamInvalidError(
            f"ArrayFeatureExtractor: index {int(idx[i])} at position {i} is out of range for the "
            f"last dim of size {x.shape[-1]}",
            op="ArrayFeatureExtractor",
        )
    return idx


def _afe_reference(ins, attrs):
    x, y = ins
    idx = _afe_indices(x, y)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty((rows.shape[0], idx.size), OBJ if _is_string(x.dtype) else x.dtype)
    for r in range(rows.shape[0]):
        for j, i in enumerate(idx):
            out[r, j] = rows[r, i]
    return out.reshape((1, idx.size) if x.ndim == 1 else x.shape[:-1] + (idx.size,))


ArrayFeatureExtractor = register_op(
    "ArrayFeatureExtractor",
    domain=DOMAIN,
    category="ml",
    inputs=["X", Input("Y", (I64,))],
    outputs=["Z"],
    infer=_afe_infer,
    reference=_afe_reference,
    doc="gather the given indices along the last axis (1-D X -> (1, k))",
)
ArrayFeatureExtractor.kernel("array_feature_extractor_take", priority=5, doc="numpy take along the last axis")(
    lambda ins, outs, attrs, plan, ws: np.copyto(
        outs[0], np.take(ins[0], _afe_indices(*ins), axis=-1).reshape(outs[0].shape)
    )
)


# == Binarizer ==========================================================================================
_BIN_TYPES = (_dt.float32, _dt.float64, _dt.int64, _dt.int32)

Binarizer = register_op(
    "Binarizer",
    domain=DOMAIN,
    category="ml",
    inputs=[Input("X", _BIN_TYPES)],
    outputs=["Y"],
    attrs=[Attr("threshold", "float", 0.0)],
    infer=lambda ctx: [TensorMeta(tuple(ctx.shape(0)), ctx.dtype(0))],
    reference=lambda ins, attrs: np.array(
        [1 if float(v) > attrs["threshold"] else 0 for v in ins[0].reshape(-1)], ins[0].dtype
    ).reshape(ins[0].shape),
    doc="1 where X > threshold, else 0 (NaN -> 0)",
)
Binarizer.kernel("binarizer_numpy", priority=5, doc="numpy compare")(
    lambda ins, outs, attrs, plan, ws: np.copyto(
        outs[0], ins[0].astype(np.float64) > attrs["threshold"], casting="unsafe"
    )
)


# == functional entry points ============================================================================
@api("label_encode", "LabelEncoder", domain=DOMAIN)
def label_encode(x, keys, values, default=None):
    """Map each element of ``x`` through ``keys -> values`` (``default`` for unknown keys). Keys
    and values may be lists of str / int / float or 1-D numpy arrays (any LabelEncoder dtype)."""
    ka, va = np.asarray(keys), np.asarray(values)
    attrs = {
        "keys_tensor": ka.astype(object) if ka.dtype.kind in "US" else ka,
        "values_tensor": va.astype(object) if va.dtype.kind in "US" else va,
    }
    if default is not None:
        attrs["default_tensor"] = np.asarray([default], dtype=attrs["values_tensor"].dtype)
    return [x], attrs


@api("tree_ensemble", "TreeEnsemble", domain=DOMAIN)
def tree_ensemble(x, **attrs):
    """ONNX ai.onnx.ml TreeEnsemble with its attributes as keyword arguments."""
    return [x], attrs


@api("array_feature_extractor", "ArrayFeatureExtractor", domain=DOMAIN)
def array_feature_extractor(x, indices):
    """``x[..., indices]`` (a 1-D ``x`` gives shape (1, k))."""
    return [x, np.asarray(indices, np.int64)], {}


@api("binarize", "Binarizer", domain=DOMAIN)
def binarize(x, threshold=0.0):
    """1 where ``x > threshold`` else 0, in x's dtype."""
    return [x], {"threshold": float(threshold)}


__all__ = ["label_encode", "tree_ensemble", "array_feature_extractor", "binarize"]
