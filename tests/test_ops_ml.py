"""ai.onnx.ml ops (LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer) against
independent oracles: Python dict lookups and tree walks written out here, numpy indexing,
and onnx.reference.ReferenceEvaluator.

Tolerances: lookups, indices and binarized values compare exactly; tree-ensemble sums rtol
1e-6 (float32 outputs of float64 accumulation), post-transforms rtol 1e-6 against
float64 formulas written here.
"""

import importlib
import math
import warnings

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

M = importlib.import_module("opsnn.ops.defs.ml")
DOMAIN = "ai.onnx.ml"


def onnx_ref(op_type, inputs, ml_opset, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in attrs.items()}
    node = helper.make_node(op_type, names, ["y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("y", 0, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22), helper.make_opsetid(DOMAIN, ml_opset)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


def run(op, inputs, attrs, **kw):
    return opsnn.ops.run_op(op, inputs, attrs, domain=DOMAIN, **kw)[0].numpy()


# == LabelEncoder =====================================================================================
def test_label_encoder_string_to_int(no_leak):
    x = np.array([["a", "b", "zz"], ["c", "", "a"]], dtype=object)
    table = {"a": 0, "b": 1, "c": 2}
    attrs = {"keys_strings": ["a", "b", "c"], "values_int64s": [0, 1, 2], "default_int64": 42}
    ex = aclnn.prepare("LabelEncoder", [x], attrs, domain=DOMAIN)
    assert ex.kernel_name == "label_encoder_table"
    got = ex.run().numpy()
    want = np.vectorize(lambda s: table.get(s, 42), otypes=[np.int64])(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run("LabelEncoder", [x], attrs, algo="reference"), want)
    np.testing.assert_array_equal(got, onnx_ref("LabelEncoder", [x], 4, **attrs))
    # the default default is -1; bytes attribute values (as ONNX hands them over) work
    got = run("LabelEncoder", [x], {"keys_strings": [b"a", b"b", b"c"], "values_int64s": [0, 1, 2]})
    np.testing.assert_array_equal(got, np.where(want == 42, -1, want))
    # non-contiguous and empty
    np.testing.assert_array_equal(run("LabelEncoder", [x.T], attrs), want.T)
    assert run("LabelEncoder", [np.zeros((0, 3), object)], attrs).shape == (0, 3)


def test_label_encoder_numeric_tensor_nan_and_last_key_wins(no_leak):
    x = np.array([1.5, np.nan, -2.0, 7.0, 1.5], np.float32)
    keys = np.array([1.5, np.nan, -2.0, 1.5], np.float32)  # 1.5 repeats: the last value wins
    vals = np.array(["one", "nan", "minus", "again"], dtype=object)
    got = M.label_encode(opsnn.tensor(x), keys, vals, default="?").numpy()
    assert got.tolist() == ["again", "nan", "minus", "?", "again"]
    ref = M.label_encode(opsnn.tensor(x), keys, vals, default="?", algo="reference").numpy()
    assert ref.tolist() == got.tolist()
    xi = np.array([3, -1, 10], np.int64)
    got = run("LabelEncoder", [xi], {"keys_int64s": [3, 10], "values_floats": [0.5, 2.5]})
    assert got.dtype == np.float32 and got.tolist() == [0.5, -0.0, 2.5] and math.copysign(1, got[1]) < 0
    x16 = np.array([5, 6, 7], np.int16)
    got = M.label_encode(opsnn.tensor(x16), np.array([6, 7], np.int16), np.array([1.0, 2.0]), default=9.0).numpy()
    assert got.dtype == np.float64 and got.tolist() == [9.0, 1.0, 2.0]
    want = onnx_ref(
        "LabelEncoder",
        [x16],
        4,
        keys_tensor=np.array([6, 7], np.int16),
        values_tensor=np.array([1.0, 2.0]),
        default_tensor=np.array([9.0]),
    )
    np.testing.assert_array_equal(got, want)


def test_label_encoder_errors(no_leak):
    x = np.array(["a"], dtype=object)
    with pytest.raises(ParamInvalidError, match="exactly one"):
        run("LabelEncoder", [x], {"keys_strings": ["a"]})
    with pytest.raises(ParamInvalidError, match="exactly one"):
        run("LabelEncoder", [x], {"keys_strings": ["a"], "keys_int64s": [1], "values_int64s": [1]})
    with pytest.raises(ParamInvalidError, match="parallel"):
        run("LabelEncoder", [x], {"keys_strings": ["a", "b"], "values_int64s": [1]})
    with pytest.raises(DTypeError, match="keys"):
        run("LabelEncoder", [np.zeros(2, np.float64)], {"keys_floats": [1.0], "values_int64s": [1]})
    with pytest.raises(DTypeError, match="keys"):
        run("LabelEncoder", [np.zeros(2, np.int64)], {"keys_strings": ["a"], "values_int64s": [1]})


# == TreeEnsemble ===================================================================================
def _random_forest(rng, n_trees, depth, n_features, n_targets, modes=(0, 1, 2, 3, 4, 5)):
    """Complete binary trees of the given depth, flattened as TreeEnsemble attributes."""
    feat, split, mode, tid, tleaf, fid, fleaf, miss = [], [], [], [], [], [], [], []
    lw, lt, roots = [], [], []
    for _ in range(n_trees):
        base = len(feat)
        roots.append(base)
        n_int = 2**depth - 1
        for i in range(n_int):
            feat.append(int(rng.integers(n_features)))
            split.append(float(np.round(rng.uniform(-1, 1), 1)))
            mode.append(int(rng.choice(modes)))
            miss.append(int(rng.integers(2)))
            for child, (ids, leafs) in ((2 * i + 1, (tid, tleaf)), (2 * i + 2, (fid, fleaf))):
                if child < n_int:
                    ids.append(base + child)
                    leafs.append(0)
                else:
                    ids.append(len(lw))
                    leafs.append(1)
                    lw.append(float(rng.uniform(-5, 5)))
                    lt.append(int(rng.integers(n_targets)))
    return dict(
        nodes_featureids=feat,
        nodes_splits=np.array(split),
        nodes_modes=np.array(mode, np.uint8),
        nodes_truenodeids=tid,
        nodes_trueleafs=tleaf,
        nodes_falsenodeids=fid,
        nodes_falseleafs=fleaf,
        nodes_missing_value_tracks_true=miss,
        leaf_weights=np.array(lw),
        leaf_targetids=lt,
        tree_roots=roots,
        n_targets=n_targets,
    )


def _walk(a, row):
    """Per-tree (target, weight) reached by ``row``: the comparisons written out."""
    cmp = [
        lambda v, s: v <= s,
        lambda v, s: v < s,
        lambda v, s: v >= s,
        lambda v, s: v > s,
        lambda v, s: v == s,
        lambda v, s: v != s,
    ]
    res = []
    for root in a["tree_roots"]:
        node = root
        while True:
            v = row[a["nodes_featureids"][node]]
            go = (math.isnan(v) and a["nodes_missing_value_tracks_true"][node]) or cmp[a["nodes_modes"][node]](
                v, a["nodes_splits"][node]
            )
            ids, leafs = (
                (a["nodes_truenodeids"], a["nodes_trueleafs"])
                if go
                else (a["nodes_falsenodeids"], a["nodes_falseleafs"])
            )
            if leafs[node]:
                res.append((a["leaf_targetids"][ids[node]], a["leaf_weights"][ids[node]]))
                break
            node = ids[node]
    return res


@pytest.mark.parametrize("agg", [0, 1, 2, 3])
def test_tree_ensemble_aggregates(rng, no_leak, agg):
    a = _random_forest(rng, 5, 3, 4, 3)
    a["aggregate_function"] = agg
    x = np.round(rng.uniform(-1.2, 1.2, size=(40, 4)), 1)  # ties with the splits exercise <=, <, ==
    x[3, 1] = np.nan
    x[7] = np.nan
    ex = aclnn.prepare("TreeEnsemble", [x], a, domain=DOMAIN)
    assert ex.kernel_name == "tree_ensemble_numba"
    got = ex.run().numpy()
    want = np.zeros((40, 3))
    for r in range(40):
        by_target = {}
        for t, w in _walk(a, x[r]):
            by_target.setdefault(t, []).append(w)
        for t, ws in by_target.items():
            want[r, t] = [sum(ws) / 5, sum(ws), min(ws), max(ws)][agg]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run("TreeEnsemble", [x], a, algo="reference"), want, rtol=1e-12, atol=1e-12)
    if agg in (0, 1):  # the ONNX reference initialises MIN/MAX targets that no leaf reaches to +-max float
        np.testing.assert_allclose(got, onnx_ref("TreeEnsemble", [x], 5, **a), rtol=1e-12, atol=1e-12)
    x32 = x.astype(np.float32)
    got32 = run(
        "TreeEnsemble",
        [x32],
        dict(a, nodes_splits=a["nodes_splits"].astype(np.float32), leaf_weights=a["leaf_weights"].astype(np.float32)),
    )
    assert got32.dtype == np.float32
    # the splits are float32-rounded too, so the same rows take the same branches
    np.testing.assert_allclose(got32, want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(run("TreeEnsemble", [np.asfortranarray(x)], a), want, rtol=1e-12, atol=1e-12)
    if agg == 1:  # enough (row, tree) walks for the parallel variant
        big = np.round(rng.uniform(-1.2, 1.2, size=(1000, 4)), 1)
        ex = aclnn.prepare("TreeEnsemble", [big], a, domain=DOMAIN)
        assert ex.plan[2]
        np.testing.assert_allclose(
            ex.run().numpy(), run("TreeEnsemble", [big], a, algo="reference"), rtol=1e-12, atol=1e-12
        )


def test_tree_ensemble_membership_single_leaf_and_post_transforms(rng, no_leak):
    # root: x0 <= 11 ? (member {1.2, 3.7, 8, 9} ? leaf0 : (member {12, 7} ? leaf1 : leaf3)) : leaf2
    a = dict(
        nodes_featureids=[0, 0, 0],
        nodes_splits=np.array([11.0, 0, 0], np.float32),
        nodes_modes=np.array([0, 6, 6], np.uint8),
        nodes_truenodeids=[1, 0, 1],
        nodes_trueleafs=[0, 1, 1],
        nodes_falsenodeids=[2, 2, 3],
        nodes_falseleafs=[1, 0, 1],
        membership_values=np.array([1.2, 3.7, 8, 9, np.nan, 12, 7, np.nan], np.float32),
        leaf_weights=np.array([1, 10, 1000, 100], np.float32),
        leaf_targetids=[0, 1, 2, 3],
        tree_roots=[0],
        n_targets=4,
    )
    x = np.array([[1.2], [3.4], [-0.12], [np.nan], [12.0], [7.0]], np.float32)
    want = np.zeros((6, 4), np.float32)
    for r, (t, w) in enumerate([(0, 1), (3, 100), (3, 100), (2, 1000), (2, 1000), (1, 10)]):
        want[r, t] = w
    np.testing.assert_array_equal(run("TreeEnsemble", [x], a), want)
    np.testing.assert_array_equal(run("TreeEnsemble", [x], a, algo="reference"), want)
    # a tree that is a single leaf: both root branches name the same leaf
    b = dict(
        nodes_featureids=[0],
        nodes_splits=np.array([0.0]),
        nodes_modes=np.array([0], np.uint8),
        nodes_truenodeids=[0],
        nodes_trueleafs=[1],
        nodes_falsenodeids=[0],
        nodes_falseleafs=[1],
        leaf_weights=np.array([2.5]),
        leaf_targetids=[1],
        tree_roots=[0],
        n_targets=2,
    )
    np.testing.assert_array_equal(run("TreeEnsemble", [np.zeros((3, 1))], b), [[0, 2.5]] * 3)
    # post transforms on random sums, against float64 formulas
    f = _random_forest(rng, 4, 2, 3, 3)
    xx = rng.uniform(-1, 1, size=(10, 3))
    raw = run("TreeEnsemble", [xx], f)
    e = np.exp(raw - raw.max(1, keepdims=True))
    np.testing.assert_allclose(
        run("TreeEnsemble", [xx], dict(f, post_transform=1)), e / e.sum(1, keepdims=True), rtol=1e-12
    )
    np.testing.assert_allclose(run("TreeEnsemble", [xx], dict(f, post_transform=2)), 1 / (1 + np.exp(-raw)), rtol=1e-12)
    sz = run("TreeEnsemble", [xx], dict(f, post_transform=3))
    for r in range(10):
        nz = raw[r] != 0
        ez = np.where(nz, np.exp(raw[r] - raw[r][nz].max()), 0) if nz.any() else np.zeros(3)
        np.testing.assert_allclose(sz[r], ez / ez.sum() if nz.any() else ez, rtol=1e-12)
    p = np.array([[0.1], [0.5], [0.975]])
    g = dict(
        nodes_featureids=[0],
        nodes_splits=np.array([0.0]),
        nodes_modes=np.array([0], np.uint8),
        nodes_truenodeids=[0],
        nodes_trueleafs=[1],
        nodes_falsenodeids=[0],
        nodes_falseleafs=[1],
        leaf_weights=np.array([0.0]),
        leaf_targetids=[0],
        tree_roots=[0],
        n_targets=1,
    )
    for prob in p[:, 0]:
        got = run("TreeEnsemble", [np.zeros((1, 1))], dict(g, leaf_weights=np.array([prob]), post_transform=4))
        # probit(p) solves Phi(z) = p
        assert abs(0.5 * (1 + math.erf(got[0, 0] / math.sqrt(2))) - prob) < 1e-12


def test_tree_ensemble_errors(rng, no_leak):
    a = _random_forest(rng, 2, 2, 3, 2)
    x = np.zeros((2, 3))
    with pytest.raises(ParamInvalidError, match="nodes_featureids"):
        run("TreeEnsemble", [np.zeros((2, 1))], dict(a, nodes_featureids=[2] * 6))
    with pytest.raises(ParamInvalidError, match="out of range"):
        run("TreeEnsemble", [x], dict(a, nodes_truenodeids=[99] * 6))
    with pytest.raises(ParamInvalidError, match="leaf_targetids"):
        run("TreeEnsemble", [x], dict(a, leaf_targetids=[5] * 8))
    with pytest.raises(ParamInvalidError, match="6 entries"):
        run("TreeEnsemble", [x], dict(a, nodes_splits=np.zeros(5)))
    with pytest.raises(ParamInvalidError, match="membership_values"):
        run("TreeEnsemble", [x], dict(a, nodes_modes=np.full(6, 6, np.uint8)))
    with pytest.raises(ParamInvalidError, match="aggregate_function"):
        run("TreeEnsemble", [x], dict(a, aggregate_function=7))
    with pytest.raises(InferShapeError, match=r"\(N, F\)"):
        run("TreeEnsemble", [np.zeros(3)], a)
    cyc = dict(
        nodes_featureids=[0, 0],
        nodes_splits=np.array([0.0, 0.0]),
        nodes_modes=np.array([0, 0], np.uint8),
        nodes_truenodeids=[1, 0],
        nodes_trueleafs=[0, 0],
        nodes_falsenodeids=[1, 0],
        nodes_falseleafs=[0, 0],
        leaf_weights=np.array([1.0]),
        leaf_targetids=[0],
        tree_roots=[0],
        n_targets=1,
    )
    with pytest.raises(ParamInvalidError, match="cycle"):  # a malformed forest fails instead of hanging
        run("TreeEnsemble", [np.zeros((1, 1))], cyc)
    with pytest.raises(ParamInvalidError, match="cycle"):
        run("TreeEnsemble", [np.zeros((1, 1))], cyc, algo="reference")


# == ArrayFeatureExtractor, Binarizer ==================================================================
def test_array_feature_extractor(rng, no_leak):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    idx = np.array([4, 0, 4], np.int64)
    ex = aclnn.array_feature_extractor.prepare(opsnn.tensor(x), idx)
    assert ex.kernel_name == "array_feature_extractor_take"
    np.testing.assert_array_equal(ex.run().numpy(), x[..., idx])
    np.testing.assert_array_equal(
        M.array_feature_extractor(opsnn.tensor(x), idx, algo="reference").numpy(), x[..., idx]
    )
    np.testing.assert_array_equal(ex.run().numpy(), onnx_ref("ArrayFeatureExtractor", [x, idx], 1))
    v = np.array([10, 20, 30], np.int64)
    assert M.array_feature_extractor(opsnn.tensor(v), [2, 1]).numpy().tolist() == [[30, 20]]  # 1-D -> (1, k)
    s = np.array([["a", "b"], ["c", "d"]], dtype=object)
    assert M.array_feature_extractor(opsnn.tensor(s), [1]).numpy().tolist() == [["b"], ["d"]]
    np.testing.assert_array_equal(
        M.array_feature_extractor(opsnn.from_numpy(x.transpose(2, 1, 0)), [1]).numpy(), x.transpose(2, 1, 0)[..., [1]]
    )
    assert M.array_feature_extractor(opsnn.tensor(x), np.zeros(0, np.int64)).numpy().shape == (2, 3, 0)
    with pytest.raises(ParamInvalidError, match="out of range"):
        M.array_feature_extractor(opsnn.tensor(x), [5])
    with pytest.raises(ParamInvalidError, match="out of range"):
        M.array_feature_extractor(opsnn.tensor(x), [-1])
    with pytest.raises(DTypeError):
        M.array_feature_extractor(opsnn.tensor(x.astype(np.float16)), [0])


def test_binarizer(rng, no_leak):
    for dt in (np.float32, np.float64, np.int32, np.int64):
        x = (rng.standard_normal((3, 4)) * 3).astype(dt)
        ex = aclnn.binarize.prepare(opsnn.tensor(x), 0.5)
        assert ex.kernel_name == "binarizer_numpy"
        got = ex.run().numpy()
        assert got.dtype == dt
        np.testing.assert_array_equal(got, (x > 0.5).astype(dt))
        np.testing.assert_array_equal(M.binarize(opsnn.tensor(x), 0.5, algo="reference").numpy(), got)
        np.testing.assert_array_equal(got, onnx_ref("Binarizer", [x], 1, threshold=0.5))
    f = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)
    assert M.binarize(opsnn.tensor(f)).numpy().tolist() == [0, 1, 0, 0]
    assert M.binarize(opsnn.from_numpy(np.eye(3, dtype=np.float32)[:, ::2])).numpy().tolist() == [
        [1, 0],
        [0, 0],
        [0, 1],
    ]
    with pytest.raises(DTypeError):
        M.binarize(opsnn.tensor(np.zeros(2, np.int8)))
