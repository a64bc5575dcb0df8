"""String and text ops: StringConcat, RegexFullMatch, StringSplit, StringNormalizer and
TfIdfVectorizer — records, kernels and functional entry points.

String tensors are numpy object arrays of ``str`` (bytes are decoded as UTF-8; numpy
``U`` arrays are accepted too); string outputs are object arrays of ``str``. Text ops are
host-side work by nature, so their kernels are plain Python/numpy over the elements, with
every per-call-invariant structure (compiled regex, n-gram table) built at prepare time::

    >>> import opsnn, numpy as np
    >>> words = opsnn.tensor(np.array(["a.b", "c"], dtype=object))
    >>> parts, counts = opsnn.ops.string_split(words, ".")
    >>> parts.numpy().tolist(), counts.numpy().tolist()
    ([['a', 'b'], ['c', '']], [2, 1])
"""

from __future__ import annotations

import re

import numpy as np

from ... import dtypes as _dt
from ...errors import DTypeError, ParamInvalidError
from ..api import api
from ..registry import Attr, TensorMeta, register_op

OBJ = np.dtype(object)
I64 = _dt.int64


def _text(op: str, name: str, v) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise ParamInvalidError(f"{op}: attribute {name!r} is not valid UTF-8: {v!r}", op=op) from None
    if not isinstance(v, str):
        raise ParamInvalidError(f"{op}: attribute {name!r} must be a string, got {v!r}", op=op)
    return v


def _is_string(dt: np.dtype) -> bool:
    return dt.kind in "OUS"


def _check_string(ctx, i: int, name: str) -> None:
    if not _is_string(ctx.dtype(i)):
        raise DTypeError(
            f"{ctx.op.name}: input {name!r} must be a string tensor, got dtype {_dt.name(ctx.dtype(i))}", op=ctx.op.name
        )


def as_str(v, op: str = "string op") -> str:
    """One tensor element as str (UTF-8 bytes decoded)."""
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, np.bytes_)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            raise ParamInvalidError(f"{op}: element {v!r} is not valid UTF-8", op=op) from None
    raise DTypeError(f"{op}: expected string elements, got {type(v).__name__} {v!r}", op=op)


def _str_array(x: np.ndarray, op: str) -> np.ndarray:
    """An object array of str with the shape of ``x``."""
    out = np.empty(x.shape, OBJ)
    flat = out.reshape(-1)
    for i, v in enumerate(x.reshape(-1).tolist()):
        flat[i] = as_str(v, op)
    return out


# == StringConcat ==================================================================================
def _concat_infer(ctx):
    _check_string(ctx, 0, "X")
    _check_string(ctx, 1, "Y")
    try:
        shape = np.broadcast_shapes(tuple(ctx.shape(0)), tuple(ctx.shape(1)))
    except ValueError:
        ctx.fail(f"inputs 'X' {tuple(ctx.shape(0))} and 'Y' {tuple(ctx.shape(1))} do not broadcast")
    return [TensorMeta(tuple(shape), OBJ)]


def _concat_reference(ins, attrs):
    x, y = ins
    shape = np.broadcast_shapes(x.shape, y.shape)
    xb, yb = np.broadcast_to(x, shape), np.broadcast_to(y, shape)
    out = np.empty(shape, OBJ)
    for idx in np.ndindex(*shape):
        out[idx] = as_str(xb[idx], "StringConcat") + as_str(yb[idx], "StringConcat")
    return out


StringConcat = register_op(
    "StringConcat",
    category="text",
    inputs=["X", "Y"],
    outputs=["Z"],
    infer=_concat_infer,
    reference=_concat_reference,
    doc="elementwise string concatenation (broadcasting)",
)
StringConcat.kernel("string_concat_numpy", priority=5, doc="numpy object-array add of str")(
    lambda ins, outs, attrs, plan, ws: np.add(
        _str_array(ins[0], "StringConcat"), _str_array(ins[1], "StringConcat"), out=outs[0]
    )
)


# == RegexFullMatch ================================================================================
def _regex(attrs) -> re.Pattern:
    pattern = attrs["pattern"]
    if pattern is None:
        raise ParamInvalidError("RegexFullMatch: attribute 'pattern' is required", op="RegexFullMatch")
    pattern = _text("RegexFullMatch", "pattern", pattern)
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ParamInvalidError(
            f"RegexFullMatch: attribute 'pattern' {pattern!r} is not a valid regex: {exc}", op="RegexFullMatch"
        ) from None


def _regex_infer(ctx):
    _check_string(ctx, 0, "X")
    _regex(ctx.attrs)
    return [TensorMeta(tuple(ctx.shape(0)), _dt.bool_)]


def _regex_reference(ins, attrs):
    rx = _regex(attrs)
    x = ins[0]
    out = np.zeros(x.shape, bool)
    for idx in np.ndindex(*x.shape):
        out[idx] = rx.fullmatch(as_str(x[idx], "RegexFullMatch")) is not None
    return out


def _regex_kernel(ins, outs, attrs, plan, ws):
    match = plan.fullmatch
    flat = outs[0].reshape(-1)
    for i, v in enumerate(ins[0].reshape(-1).tolist()):
        flat[i] = match(v if isinstance(v, str) else as_str(v, "RegexFullMatch")) is not None


RegexFullMatch = register_op(
    "RegexFullMatch",
    category="text",
    inputs=["X"],
    outputs=["Y"],
    attrs=[Attr("pattern", "string", None)],
    infer=_regex_infer,
    reference=_regex_reference,
    doc="true where the whole string matches the pattern (Python `re` syntax, which covers RE2's common subset)",
)
RegexFullMatch.kernel(
    "regex_full_match_re", priority=5, plan=lambda ctx: _regex(ctx.attrs), doc="pattern compiled once at prepare time"
)(_regex_kernel)


# == StringSplit ===================================================================================
def _split_attrs(attrs) -> tuple[str | None, int]:
    delim = attrs["delimiter"]
    delim = None if delim is None else _text("StringSplit", "delimiter", delim)
    maxsplit = attrs["maxsplit"]
    if maxsplit is None:
        maxsplit = -1
    elif isinstance(maxsplit, bool) or not isinstance(maxsplit, (int, np.integer)) or maxsplit < 0:
        raise ParamInvalidError(
            f"StringSplit: attribute 'maxsplit' must be an int >= 0, got {maxsplit!r}", op="StringSplit"
        )
    return (delim or None), int(maxsplit)


def _split_infer(ctx):
    _check_string(ctx, 0, "X")
    _split_attrs(ctx.attrs)
    s = tuple(ctx.shape(0))
    return [TensorMeta(s + (None,), OBJ), TensorMeta(s, I64)]


def _split_reference(ins, attrs):
    x = ins[0]
    delim, maxsplit = _split_attrs(attrs)
    parts = {}
    for idx in np.ndindex(*x.shape):
        s = as_str(x[idx], "StringSplit")
        if delim is None:  # runs of whitespace separate; leading/trailing whitespace is dropped
            words, rest, k = [], s.lstrip(), 0
            while rest and (maxsplit < 0 or k < maxsplit):
                m = re.search(r"\s+", rest)
                if m is None:
                    break
                words.append(rest[: m.start()])
                rest = rest[m.end() :]
                k += 1
            if rest:
                words.append(rest if maxsplit >= 0 and k == maxsplit else rest.rstrip())
            parts[idx] = [w for w in words]
        else:
            words, rest, k = [], s, 0
            while (maxsplit < 0 or k < maxsplit) and delim in rest:
                i = rest.index(delim)
                words.append(rest[:i])
                rest = rest[i + len(delim) :]
                k += 1
            parts[idx] = words + [rest]
    width = max((len(p) for p in parts.values()), default=0)
    y = np.empty(x.shape + (width,), OBJ)
    z = np.zeros(x.shape, np.int64)
    for idx, p in parts.items():
        y[idx] = p + [""] * (width - len(p))
        z[idx] = len(p)
    return y, z


def _split_kernel(ins, outs, attrs, plan, ws):
    delim, maxsplit = plan
    x = ins[0]
    lists = [as_str(v, "StringSplit").split(delim, maxsplit) for v in x.reshape(-1).tolist()]
    counts = np.array([len(p) for p in lists], np.int64)
    width = int(counts.max(initial=0))
    y = np.full((len(lists), width), "", OBJ)
    for i, p in enumerate(lists):
        y[i, : len(p)] = p
    return [y.reshape(x.shape + (width,)), counts.reshape(x.shape)]


StringSplit = register_op(
    "StringSplit",
    category="text",
    inputs=["X"],
    outputs=["Y", "Z"],
    dynamic_shape=True,
    attrs=[Attr("delimiter", "string", None), Attr("maxsplit", "int", None)],
    infer=_split_infer,
    reference=_split_reference,
    doc="split each string on a delimiter (or runs of whitespace); substrings padded with '' and their counts",
)
StringSplit.kernel(
    "string_split_str", priority=5, plan=lambda ctx: _split_attrs(ctx.attrs), doc="str.split per element"
)(_split_kernel)


# == StringNormalizer ==============================================================================
_CASE = ("LOWER", "UPPER", "NONE")


def _norm_attrs(attrs) -> tuple[str, bool, list]:
    action = _text("StringNormalizer", "case_change_action", attrs["case_change_action"])
    if action not in _CASE:
        raise ParamInvalidError(
            f"StringNormalizer: attribute 'case_change_action' must be one of {list(_CASE)}, got {action!r}",
            op="StringNormalizer",
        )
    sensitive = attrs["is_case_sensitive"]
    if isinstance(sensitive, bool) or not isinstance(sensitive, (int, np.integer)) or sensitive not in (0, 1):
        raise ParamInvalidError(
            f"StringNormalizer: attribute 'is_case_sensitive' must be 0 or 1, got {sensitive!r}", op="StringNormalizer"
        )
    stops = [_text("StringNormalizer", "stopwords", w) for w in (attrs["stopwords"] or [])]
    if attrs["locale"] is not None:
        _text("StringNormalizer", "locale", attrs["locale"])
    return action, bool(sensitive), stops


def _norm_infer(ctx):
    _check_string(ctx, 0, "X")
    _norm_attrs(ctx.attrs)
    s = tuple(ctx.shape(0))
    if not (len(s) == 1 or (len(s) == 2 and s[0] == 1)):
        ctx.fail(f"input 'X' must have shape [C] or [1, C], got {s}")
    return [TensorMeta(s[:-1] + (None,), OBJ)]


def _norm_reference(ins, attrs):
    x = ins[0]
    action, sensitive, stops = _norm_attrs(attrs)
    kept = []
    for v in x.reshape(-1):
        s = as_str(v, "StringNormalizer")
        if sensitive:
            drop = any(s == w for w in stops)
        else:
            drop = any(s.lower() == w.lower() for w in stops)
        if drop:
            continue
        kept.append(s.lower() if action == "LOWER" else s.upper() if action == "UPPER" else s)
    if not kept:
        kept = [""]
    out = np.empty(len(kept), OBJ)
    out[:] = kept
    return out.reshape(x.shape[:-1] + (len(kept),))


def _norm_plan(ctx):
    action, sensitive, stops = _norm_attrs(ctx.attrs)
    stopset = frozenset(stops) if sensitive else frozenset(w.lower() for w in stops)
    change = {"LOWER": str.lower, "UPPER": str.upper, "NONE": None}[action]
    return stopset, sensitive, change


def _norm_kernel(ins, outs, attrs, plan, ws):
    stopset, sensitive, change = plan
    x = ins[0]
    words = [as_str(v, "StringNormalizer") for v in x.reshape(-1).tolist()]
    if stopset:
        words = [w for w in words if (w if sensitive else w.lower()) not in stopset]
    if change is not None:
        words = [change(w) for w in words]
    out = np.empty(max(len(words), 1), OBJ)
    out[:] = words or [""]
    return [out.reshape(x.shape[:-1] + (out.shape[0],))]


StringNormalizer = register_op(
    "StringNormalizer",
    category="text",
    inputs=["X"],
    outputs=["Y"],
    dynamic_shape=True,
    attrs=[
        Attr("case_change_action", "string", "NONE"),
        Attr("is_case_sensitive", "int", 0),
        Attr("locale", "string", None),
        Attr("stopwords", "strings", None),
    ],
    infer=_norm_infer,
    reference=_norm_reference,
    doc="drop stop-word elements, then lower/upper-case (Python's Unicode case mapping; 'locale' is accepted "
    "but not used)",
)
StringNormalizer.kernel(
    "string_normalizer_set", priority=5, plan=_norm_plan, doc="stop words in a set built at prepare time"
)(_norm_kernel)


# == TfIdfVectorizer ===============================================================================
class _TfIdf:
    """The validated attributes: pool n-grams (with their output coordinates) by length."""

    def __init__(self, attrs, input_is_string: bool):
        op = "TfIdfVectorizer"
        self.mode = _text(op, "mode", attrs["mode"])
        if self.mode not in ("TF", "IDF", "TFIDF"):
            raise ParamInvalidError(f"{op}: attribute 'mode' must be 'TF', 'IDF' or 'TFIDF', got {self.mode!r}", op=op)
        self.min_n, self.max_n, self.skip = (
            int(attrs[k]) for k in ("min_gram_length", "max_gram_length", "max_skip_count")
        )
        if not 1 <= self.min_n <= self.max_n or self.skip < 0:
            raise ParamInvalidError(
                f"{op}: need 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0, got "
                f"{self.min_n}, {self.max_n}, {self.skip}",
                op=op,
            )
        ints, strs = attrs["pool_int64s"], attrs["pool_strings"]
        if (ints is None) == (strs is None):
            raise ParamInvalidError(f"{op}: exactly one of 'pool_int64s' and 'pool_strings' must be set", op=op)
        if (strs is not None) != input_is_string:
            raise DTypeError(
                f"{op}: a {'string' if strs is not None else 'int64'} pool needs "
                f"{'string' if strs is not None else 'integer'} input",
                op=op,
            )
        pool = [as_str(s, op) for s in strs] if strs is not None else [int(i) for i in ints]
        counts = [int(c) for c in attrs["ngram_counts"]]
        indexes = [int(i) for i in attrs["ngram_indexes"]]
        if not indexes or min(indexes) < 0:
            raise ParamInvalidError(f"{op}: 'ngram_indexes' must be non-empty and >= 0, got {indexes}", op=op)
        if any(b < a for a, b in zip(counts, counts[1:])) or any(not 0 <= c <= len(pool) for c in counts):
            raise ParamInvalidError(
                f"{op}: 'ngram_counts' {counts} must be non-decreasing offsets into the pool of {len(pool)} items",
                op=op,
            )
        self.size = max(indexes) + 1
        # (length, gram) -> output coordinate; pool n-grams are numbered in pool order across all lengths
        self.table: dict[int, dict[tuple, int]] = {}
        self.grams: list[tuple[tuple, int]] = []  # for the reference: (gram, coordinate) in pool order
        gid = 0
        for k, start in enumerate(counts):
            n = k + 1
            end = counts[k + 1] if k + 1 < len(counts) else len(pool)
            m = (end - start) // n
            for j in range(m):
                if gid >= len(indexes):
                    raise ParamInvalidError(
                        f"{op}: the pool holds more n-grams than 'ngram_indexes' has entries ({len(indexes)})", op=op
                    )
                if self.min_n <= n <= self.max_n:
                    gram = tuple(pool[start + j * n : start + (j + 1) * n])
                    self.table.setdefault(n, {})[gram] = indexes[gid]
                    self.grams.append((gram, indexes[gid]))
                gid += 1
        w = attrs["weights"]
        self.weights = None if w is None or len(w) == 0 else np.asarray(w, np.float64)
        if self.weights is not None and self.mode != "TF" and self.weights.shape[0] < self.size:
            raise ParamInvalidError(
                f"{op}: 'weights' has {self.weights.shape[0]} entries; the output has {self.size} "
                "coordinates (weights are read per output coordinate, as onnxruntime does)",
                op=op,
            )

    def windows(self, row_len: int):
        """(skip distance, n) pairs to scan: unigrams once, longer n-grams at every skip."""
        for d in range(1, self.skip + 2):
            for n in range(max(self.min_n, 1 if d == 1 else 2), self.max_n + 1):
                if (n - 1) * d < row_len:
                    yield d, n

    def finish(self, counts: np.ndarray) -> np.ndarray:
        if self.mode == "TF":
            return counts
        w = np.ones(self.size) if self.weights is None else self.weights[: self.size]
        if self.mode == "IDF":
            return (counts > 0) * w
        return counts * w


def _tfidf_infer(ctx):
    dt = ctx.dtype(0)
    if not (_is_string(dt) or dt in (_dt.int32, _dt.int64)):
        raise DTypeError(
            f"TfIdfVectorizer: input 'X' must be int32, int64 or string, got {_dt.name(dt)}", op="TfIdfVectorizer"
        )
    t = _TfIdf(ctx.attrs, _is_string(dt))
    s = tuple(ctx.shape(0))
    if len(s) > 2 or (len(s) == 2 and s[0] < 1):
        ctx.fail(f"input 'X' must have shape [C] or [N, C] with N >= 1, got {s}")
    return [TensorMeta((t.size,) if len(s) < 2 else (s[0], t.size), _dt.float32)]


def _rows(x: np.ndarray, is_string: bool) -> list:
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    if is_string:
        return [[as_str(v, "TfIdfVectorizer") for v in r] for r in rows.tolist()]
    return [[int(v) for v in r] for r in rows.tolist()]


def _tfidf_reference(ins, attrs):
    x = ins[0]
    t = _TfIdf(attrs, _is_string(x.dtype))
    rows = _rows(x, _is_string(x.dtype))
    out = np.zeros((len(rows), t.size))
    for r, row in enumerate(rows):
        for d, n in t.windows(len(row)):
            for start in range(len(row) - (n - 1) * d):
                window = tuple(row[start + i * d] for i in range(n))
                coord = None
                for gram, c in t.grams:  # a linear scan; a later duplicate in the pool wins
                    if gram == window:
                        coord = c
                if coord is not None:
                    out[r, coord] += 1
    y = t.finish(out)
    return y.reshape(-1).astype(np.float32) if x.ndim < 2 else y.astype(np.float32)


def _tfidf_kernel(ins, outs, attrs, plan, ws):
    t = plan
    x = ins[0]
    rows = _rows(x, _is_string(x.dtype))
    counts = np.zeros((len(rows), t.size))
    for r, row in enumerate(rows):
        acc = counts[r]
        for d, n in t.windows(len(row)):
            table = t.table.get(n)
            if not table:
                continue
            span = (n - 1) * d
            for start in range(len(row) - span):
                c = table.get(tuple(row[start : start + span + 1 : d]))
                if c is not None:
                    acc[c] += 1
    np.copyto(outs[0], t.finish(counts).reshape(outs[0].shape), casting="unsafe")


TfIdfVectorizer = register_op(
    "TfIdfVectorizer",
    category="text",
    inputs=["X"],
    outputs=["Y"],
    attrs=[
        Attr("max_gram_length", "int"),
        Attr("max_skip_count", "int"),
        Attr("min_gram_length", "int"),
        Attr("mode", "string"),
        Attr("ngram_counts", "ints"),
        Attr("ngram_indexes", "ints"),
        Attr("pool_int64s", "ints", None),
        Attr("pool_strings", "strings", None),
        Attr("weights", "floats", None),
    ],
    infer=_tfidf_infer,
    reference=_tfidf_reference,
    doc="n-gram (with skips) counts per row over a fixed pool, as TF, IDF or TF-IDF",
)
TfIdfVectorizer.kernel(
    "tfidf_hash",
    priority=5,
    plan=lambda ctx: _TfIdf(ctx.attrs, _is_string(ctx.dtype(0))),
    doc="n-gram -> coordinate hash table built at prepare time",
)(_tfidf_kernel)


# == functional entry points ============================================================================
@api("string_concat", "StringConcat")
def string_concat(x, y):
    """Elementwise ``x + y`` over string tensors (broadcasting)."""
    return [x, y], {}


@api("regex_full_match", "RegexFullMatch")
def regex_full_match(x, pattern):
    """Bool tensor: where each string fully matches ``pattern``."""
    return [x], {"pattern": pattern}


@api("string_split", "StringSplit")
def string_split(x, delimiter=None, maxsplit=None):
    """(substrings padded with '', counts) of each string split on ``delimiter`` (None: whitespace)."""
    attrs = {}
    if delimiter is not None:
        attrs["delimiter"] = delimiter
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    return [x], attrs, 2


@api("string_normalizer", "StringNormalizer")
def string_normalizer(x, stopwords=None, case_change_action="NONE", is_case_sensitive=False):
    """Drop stop words, then change case ("LOWER", "UPPER" or "NONE")."""
    attrs = {"case_change_action": case_change_action, "is_case_sensitive": int(bool(is_case_sensitive))}
    if stopwords:
        attrs["stopwords"] = list(stopwords)
    return [x], attrs


@api("tfidf_vectorizer", "TfIdfVectorizer")
def tfidf_vectorizer(
    x,
    *,
    mode,
    min_gram_length,
    max_gram_length,
    max_skip_count,
    ngram_counts,
    ngram_indexes,
    pool_int64s=None,
    pool_strings=None,
    weights=None,
):
    """ONNX TfIdfVectorizer with its attributes as keyword arguments."""
    attrs = {
        "mode": mode,
        "min_gram_length": int(min_gram_length),
        "max_gram_length": int(max_gram_length),
        "max_skip_count": int(max_skip_count),
        "ngram_counts": list(ngram_counts),
        "ngram_indexes": list(ngram_indexes),
    }
    for k, v in (("pool_int64s", pool_int64s), ("pool_strings", pool_strings), ("weights", weights)):
        if v is not None:
            attrs[k] = list(v)
    return [x], attrs


__all__ = ["string_concat", "regex_full_match", "string_split", "string_normalizer", "tfidf_vectorizer"]
