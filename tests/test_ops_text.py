"""String and text ops (StringConcat, RegexFullMatch, StringSplit, StringNormalizer,
TfIdfVectorizer) against independent oracles: Python's str methods and re module applied
element by element here, onnx.reference.ReferenceEvaluator, and hand-counted n-grams.
String results compare exactly; TfIdf counts are exact small integers (float32).
"""

import importlib
import re
import warnings

import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import opsnn
from opsnn import aclnn
from opsnn.errors import DTypeError, InferShapeError, ParamInvalidError

X = importlib.import_module("opsnn.ops.defs.text")


def strings(*rows):
    return np.array(rows, dtype=object)


def onnx_ref(op_type, inputs, opset, n_out=1, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
    ]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, 0, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))
    return res[0] if n_out == 1 else res


# == StringConcat ==================================================================================
def test_string_concat_broadcast_utf8_bytes(no_leak):
    x = strings(["a", "ü", ""], ["xyz", "", "日本"])
    y = strings("-1", "-2", "-3")
    ex = aclnn.string_concat.prepare(opsnn.tensor(x), opsnn.tensor(y))
    assert ex.kernel_name == "string_concat_numpy"
    got = ex.run().numpy()
    assert got.dtype == object and got.tolist() == [[a + b for a, b in zip(r, y)] for r in x.tolist()]
    assert X.string_concat(opsnn.tensor(x), opsnn.tensor(y), algo="reference").numpy().tolist() == got.tolist()
    np.testing.assert_array_equal(got, onnx_ref("StringConcat", [x, y], 20))
    # bytes elements decode as UTF-8; numpy unicode arrays work; 0-d and empty
    b = np.array([b"ab", "c\u00e9".encode()], dtype=object)
    assert X.string_concat(opsnn.tensor(b), opsnn.tensor(np.array(["!", "?"]))).numpy().tolist() == ["ab!", "c\u00e9?"]
    z = X.string_concat(opsnn.tensor(np.array("p", dtype=object)), opsnn.tensor(np.array("q", dtype=object)))
    assert z.shape == () and z.numpy().item() == "pq"
    assert X.string_concat(opsnn.tensor(np.zeros((0, 2), object)), opsnn.tensor(y[:1])).numpy().shape == (0, 2)
    xt = x.T  # non-contiguous
    assert X.string_concat(opsnn.from_numpy(xt), opsnn.tensor(strings("!", "?"))).numpy().tolist() == [
        [a + s for a, s in zip(r, "!?")] for r in xt.tolist()
    ]
    with pytest.raises(InferShapeError, match="broadcast"):
        X.string_concat(opsnn.tensor(x), opsnn.tensor(strings("a", "b")))
    with pytest.raises(DTypeError):
        X.string_concat(opsnn.tensor(x), opsnn.tensor(np.zeros(3, np.float32)))
    with pytest.raises(ParamInvalidError, match="UTF-8"):
        X.string_concat(opsnn.tensor(np.array([b"\xff"], dtype=object)), opsnn.tensor(strings("a")))


# == RegexFullMatch ================================================================================
def test_regex_full_match(no_leak):
    x = strings(["www.google.com", "www.facebook.com", "www.bbc.co.uk"], ["wwwxcom", "", "www.a-b.com"])
    pattern = r"www\.[\w.-]+\.\bcom\b"
    want = np.vectorize(lambda s: re.fullmatch(pattern, s) is not None, otypes=[bool])(x)
    ex = aclnn.regex_full_match.prepare(opsnn.tensor(x), pattern)
    assert ex.kernel_name == "regex_full_match_re"
    got = ex.run().numpy()
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(X.regex_full_match(opsnn.tensor(x), pattern, algo="reference").numpy(), want)
    np.testing.assert_array_equal(got, onnx_ref("RegexFullMatch", [x], 20, pattern=pattern))
    # full match, not search
    assert X.regex_full_match(opsnn.tensor(strings("abc")), "b").numpy().tolist() == [False]
    assert X.regex_full_match(opsnn.tensor(np.zeros((2, 0), object)), "a").numpy().shape == (2, 0)
    with pytest.raises(ParamInvalidError, match="regex"):
        X.regex_full_match(opsnn.tensor(x), "(unclosed")
    with pytest.raises(ParamInvalidError, match="required"):
        opsnn.ops.run_op("RegexFullMatch", [x])
    with pytest.raises(DTypeError):
        X.regex_full_match(opsnn.tensor(np.zeros(2, np.int32)), "a")


# == StringSplit ===================================================================================
@pytest.mark.parametrize("delimiter", [None, "", ".", "-", "ab"])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2])
def test_string_split(no_leak, delimiter, maxsplit):
    x = strings(["a.b.c", "  lead  and trail  ", "x--y-ab-abz"], ["", "ab", "one two\tthree\nfour"])
    ex = aclnn.string_split.prepare(opsnn.tensor(x), delimiter, maxsplit)
    assert ex.kernel_name == "string_split_str"
    y, n = ex.run()
    lists = [[s.split(delimiter or None, -1 if maxsplit is None else maxsplit) for s in r] for r in x.tolist()]
    width = max(len(p) for r in lists for p in r)
    assert y.shape == (2, 3, width) and n.dtype == np.int64
    assert n.numpy().tolist() == [[len(p) for p in r] for r in lists]
    assert y.numpy().tolist() == [[p + [""] * (width - len(p)) for p in r] for r in lists]
    yr, nr = X.string_split(opsnn.tensor(x), delimiter, maxsplit, algo="reference")
    assert yr.numpy().tolist() == y.numpy().tolist() and nr.numpy().tolist() == n.numpy().tolist()
    attrs = {} if delimiter is None else {"delimiter": delimiter}
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    wy, wn = onnx_ref("StringSplit", [x], 20, n_out=2, **attrs)
    assert y.numpy().tolist() == wy.tolist() and n.numpy().tolist() == wn.tolist()


def test_string_split_empty_and_errors(no_leak):
    y, n = X.string_split(opsnn.tensor(np.zeros((0,), object)))
    assert y.shape == (0, 0) and n.shape == (0,)
    y, n = X.string_split(opsnn.tensor(strings("", " ")))
    assert y.shape == (2, 0) and n.numpy().tolist() == [0, 0]
    with pytest.raises(ParamInvalidError, match="maxsplit"):
        X.string_split(opsnn.tensor(strings("a")), ".", -1)
    with pytest.raises(DTypeError):
        X.string_split(opsnn.tensor(np.zeros(2, np.int64)))


# == StringNormalizer =============================================================================
def _normalize_oracle(words, stops, action, sensitive):
    keep = [w for w in words if (w not in stops if sensitive else w.lower() not in {s.lower() for s in stops})]
    keep = [w.lower() if action == "LOWER" else w.upper() if action == "UPPER" else w for w in keep]
    return keep or [""]


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [False, True])
def test_string_normalizer(no_leak, action, sensitive):
    words = ["Monday", "monday", "Tuesday", "Straße", "MONDAY", "wednesday"]
    stops = ["monday", "tuesday"]
    want = _normalize_oracle(words, stops, action, sensitive)
    for shape in ((6,), (1, 6)):
        x = np.array(words, dtype=object).reshape(shape)
        ex = aclnn.string_normalizer.prepare(opsnn.tensor(x), stops, action, sensitive)
        assert ex.kernel_name == "string_normalizer_set"
        got = ex.run().numpy()
        assert got.shape == shape[:-1] + (len(want),) and got.reshape(-1).tolist() == want
        ref = X.string_normalizer(opsnn.tensor(x), stops, action, sensitive, algo="reference").numpy()
        assert ref.tolist() == got.tolist()
    if sensitive:  # where the ONNX reference's word-level stop-word removal agrees (single words)
        want_onnx = onnx_ref(
            "StringNormalizer",
            [np.array(words, dtype=object)],
            10,
            stopwords=stops,
            case_change_action=action,
            is_case_sensitive=1,
        )
        assert got.reshape(-1).tolist() == want_onnx.tolist()


def test_string_normalizer_all_dropped_and_errors(no_leak):
    got = X.string_normalizer(opsnn.tensor(strings(["a", "A"])), ["a"]).numpy()
    assert got.shape == (1, 1) and got.tolist() == [[""]]
    assert X.string_normalizer(opsnn.tensor(strings("a")), ["a"]).numpy().tolist() == [""]
    with pytest.raises(ParamInvalidError, match="case_change_action"):
        X.string_normalizer(opsnn.tensor(strings("a")), None, "TITLE")
    with pytest.raises(InferShapeError, match=r"\[1, C\]"):
        X.string_normalizer(opsnn.tensor(strings(["a"], ["b"])))
    with pytest.raises(DTypeError):
        X.string_normalizer(opsnn.tensor(np.zeros(2, np.float32)))


# == TfIdfVectorizer ===============================================================================
def _count_ngrams(row, pool_grams, min_n, max_n, skip):
    """Hand count: each n-gram of the pool, at every skip distance (unigrams once)."""
    counts = {}
    seen = set()
    for d in range(1, skip + 2):
        for n in range(min_n, max_n + 1):
            if n == 1 and d > 1:
                continue
            for s in range(len(row) - (n - 1) * d):
                gram = tuple(row[s + i * d] for i in range(n))
                if gram in pool_grams:
                    counts[gram] = counts.get(gram, 0) + 1
                    seen.add(gram)
    return counts


POOL = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]  # unigrams 2 3 5 4; bigrams (5,6) (7,8) (6,7)
COUNTS = [0, 4]
INDEXES = [0, 1, 2, 3, 4, 5, 6]
GRAMS = [(2,), (3,), (5,), (4,), (5, 6), (7, 8), (6, 7)]


@pytest.mark.parametrize("min_n,max_n,skip", [(1, 1, 0), (2, 2, 0), (1, 2, 0), (1, 2, 3), (2, 2, 5)])
@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_tfidf_vectorizer(rng, no_leak, min_n, max_n, skip, mode):
    x = rng.integers(2, 9, size=(3, 12)).astype(np.int32)
    weights = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    attrs = dict(
        mode=mode,
        min_gram_length=min_n,
        max_gram_length=max_n,
        max_skip_count=skip,
        ngram_counts=COUNTS,
        ngram_indexes=INDEXES,
        pool_int64s=POOL,
        weights=weights,
    )
    ex = aclnn.tfidf_vectorizer.prepare(opsnn.tensor(x), **attrs)
    assert ex.kernel_name == "tfidf_hash"
    got = ex.run().numpy()
    assert got.dtype == np.float32 and got.shape == (3, 7)
    for r, row in enumerate(x.tolist()):
        counts = _count_ngrams(row, {g for g in GRAMS if min_n <= len(g) <= max_n}, min_n, max_n, skip)
        tf = np.array([counts.get(g, 0) for g in GRAMS], np.float64)
        want = tf if mode == "TF" else (tf > 0) * weights if mode == "IDF" else tf * weights
        np.testing.assert_array_equal(got[r], want.astype(np.float32))
    np.testing.assert_array_equal(X.tfidf_vectorizer(opsnn.tensor(x), algo="reference", **attrs).numpy(), got)
    np.testing.assert_array_equal(got, onnx_ref("TfIdfVectorizer", [x], 9, **attrs))
    # a 1-D input gives a 1-D output
    np.testing.assert_array_equal(X.tfidf_vectorizer(opsnn.tensor(x[1].astype(np.int64)), **attrs).numpy(), got[1])


def test_tfidf_strings_unused_coordinates_and_errors(no_leak):
    x = strings(["a", "b", "a", "c", "a", "b"])
    attrs = dict(
        mode="TF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=0,
        ngram_counts=[0, 2],
        ngram_indexes=[4, 0, 2],
        pool_strings=["a", "b", "a", "b"],
    )
    got = X.tfidf_vectorizer(opsnn.tensor(x), **attrs).numpy()
    assert got.tolist() == [[2, 0, 2, 0, 3]]  # a: 3 -> coord 4, b: 2 -> coord 0, (a, b): 2 -> coord 2
    assert X.tfidf_vectorizer(opsnn.tensor(x), algo="reference", **attrs).numpy().tolist() == got.tolist()
    with pytest.raises(DTypeError, match="string"):
        X.tfidf_vectorizer(opsnn.tensor(np.zeros(3, np.int64)), **attrs)
    with pytest.raises(ParamInvalidError, match="mode"):
        X.tfidf_vectorizer(opsnn.tensor(x), **dict(attrs, mode="BM25"))
    with pytest.raises(ParamInvalidError, match="exactly one"):
        X.tfidf_vectorizer(opsnn.tensor(x), **dict(attrs, pool_int64s=[1, 2]))
    with pytest.raises(ParamInvalidError, match="min_gram_length"):
        X.tfidf_vectorizer(opsnn.tensor(x), **dict(attrs, min_gram_length=3))
    with pytest.raises(ParamInvalidError, match="weights"):
        X.tfidf_vectorizer(opsnn.tensor(x), **dict(attrs, mode="IDF", weights=[1.0]))
    with pytest.raises(InferShapeError, match=r"\[N, C\]"):
        X.tfidf_vectorizer(opsnn.tensor(np.full((1, 2, 3), "a", object)), **attrs)
