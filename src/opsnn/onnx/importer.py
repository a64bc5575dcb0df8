"""ONNX import: ``ModelProto`` (file, bytes or proto) -> :class:`opsnn.graph.Graph`.

The importer checks the model before trusting it: malformed or truncated protobuf,
tensors whose data does not match their declared shape, opsets newer than opsnn
knows, external data outside the model's folder and tensors larger than the memory
pool's cap all raise typed errors (:mod:`opsnn.onnx.errors`). Nodes written for older
opsets are upgraded to the latest forms the op records use (:mod:`opsnn.onnx.opset`);
ops without a record are expanded from their ONNX function body when one exists, and
otherwise rejected with the nearest supported ops::

    >>> import opsnn.onnx
    >>> g = opsnn.onnx.load("model.onnx")          # doctest: +SKIP
    >>> opsnn.graph.run(g, {"x": x})               # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import math
import os
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from ..graph.interpreter import is_supported, supported_ops
from ..graph.ir import Graph, Node, Value, toposort
from ..runtime.context import context
from ..runtime.memory import physical_memory
from . import opset as _opset
from .errors import (
    ExpansionLimitError,
    ExternalDataError,
    ModelFormatError,
    TensorTooLargeError,
    UnsupportedOpError,
    UnsupportedOpsetError,
)

_MAX_INLINE_DEPTH = 32
#: default budget of nodes that function expansion may add to one model (onnx.load's max_function_nodes)
MAX_FUNCTION_NODES = 200_000
_PACKED = {TensorProto.INT4: 2, TensorProto.UINT4: 2, TensorProto.FLOAT4E2M1: 2}
for _n in ("INT2", "UINT2"):
    if hasattr(TensorProto, _n):
        _PACKED[getattr(TensorProto, _n)] = 4


# -- reading -------------------------------------------------------------------------------------
def read_model(model, base_dir: str | None = None) -> tuple[onnx.ModelProto, str | None]:
    """Parse ``model`` (path, bytes, file object or ModelProto) without loading external data."""
    if isinstance(model, onnx.ModelProto):
        return model, base_dir
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ModelFormatError(f"onnx.load: cannot read model file {path!r}: {exc.strerror or exc}") from None
        base_dir = base_dir if base_dir is not None else os.path.dirname(os.path.abspath(path))
        where = repr(path)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        data, where = bytes(model), "the given bytes"
    elif hasattr(model, "read"):
        data, where = model.read(), "the given file object"
    else:
        raise ModelFormatError(
            f"onnx.load: expected a path, bytes, a file object or an onnx.ModelProto, got {type(model).__name__}"
        )
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise ModelFormatError(
            f"onnx.load: {where} is not a valid ONNX model (malformed or truncated protobuf, {len(data)} bytes): {exc}"
        ) from None
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise ModelFormatError(
            f"onnx.load: {where} parsed as protobuf but is not an ONNX model "
            f"(ir_version={proto.ir_version}, has graph: {proto.HasField('graph')}); "
            "the file may be truncated or not an .onnx file"
        )
    return proto, base_dir


def model_opsets(proto) -> dict[str, int]:
    """``{domain: version}`` of a model (or function); '' is ai.onnx. Rejects newer opsets."""
    opsets: dict[str, int] = {}
    for o in proto.opset_import:
        dom = "" if o.domain in ("", "ai.onnx") else o.domain
        opsets[dom] = int(o.version)
    for dom, ver in opsets.items():
        top = _opset.DOMAIN_MAX.get(dom)
        if top is not None and ver > top:
            name = dom or "ai.onnx"
            raise UnsupportedOpsetError(
                f"onnx.load: the model imports opset {ver} of domain {name!r}; opsnn "
                f"supports up to {top}. Convert the model to opset {top} "
                "(onnx.version_converter) or upgrade opsnn"
            )
        if ver < 1:
            raise ModelFormatError(f"onnx.load: invalid opset version {ver} for domain {dom or 'ai.onnx'!r}")
    return opsets


# -- tensors ------------------------------------------------------------------------------------------
def _np_dtype(data_type: int, what: str) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except Exception:  # noqa: BLE001
        raise ModelFormatError(f"onnx.load: {what} has unknown element type {data_type}") from None


def _check_size(n: int, itemsize: int, what: str) -> None:
    cap = context().pool.cap
    nbytes = n * itemsize
    if cap is not None and nbytes > cap:
        raise TensorTooLargeError(
            f"onnx.load: {what} declares {nbytes} bytes, more than the memory pool's cap "
            f"of {cap} bytes; raise the cap with opsnn.memory.set_cap() or load a smaller "
            "model"
        )
    if nbytes > physical_memory():
        raise TensorTooLargeError(
            f"onnx.load: {what} declares {nbytes} bytes, more than the machine's "
            f"{physical_memory()} bytes of physical memory"
        )


#: element types whose raw data is numpy's little-endian layout, one element per item (the exporter writes them so)
PLAIN_RAW = frozenset(
    (
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
    )
)


def _storage_len(n: int, data_type: int, itemsize: int) -> int:
    per = _PACKED.get(data_type)
    return (n + per - 1) // per if per else n * itemsize


class _Importer:
    def __init__(self, proto: onnx.ModelProto, base_dir: str | None, max_function_nodes: int | None = None):
        self.proto = proto
        self.base_dir = base_dir
        self.max_function_nodes = MAX_FUNCTION_NODES if max_function_nodes is None else int(max_function_nodes)
        self.function_nodes = 0  # nodes function expansion has added so far
        self.functions = {(f.domain if f.domain != "ai.onnx" else "", f.name): f for f in proto.functions}
        self._count = 0
        self._inferred: dict[str, Any] | None = None
        self.names = _opset.NameSet()  # every name in the model; adapters and inlining add fresh ones
        _collect_names(proto.graph, self.names)
        for f in proto.functions:
            for n in f.node:
                self.names.update(n.output)

    # -- tensors ------------------------------------------------------------------------------------
    def tensor(self, t: TensorProto, what: str | None = None) -> np.ndarray:
        what = what or f"tensor {t.name!r}"
        if t.data_type == TensorProto.UNDEFINED:
            raise ModelFormatError(f"onnx.load: {what} has no element type")
        if any(d < 0 for d in t.dims):
            raise ModelFormatError(f"onnx.load: {what} has negative dims {list(t.dims)}")
        dt = _np_dtype(t.data_type, what)
        n = math.prod(t.dims)
        is_str = t.data_type == TensorProto.STRING
        if not is_str:
            _check_size(n, dt.itemsize, what)
        if t.HasField("segment"):
            raise ModelFormatError(f"onnx.load: {what} is segmented; segmented tensors are not supported")
        if t.data_location == TensorProto.EXTERNAL:
            if is_str:
                raise ExternalDataError(f"onnx.load: {what}: string tensors cannot use external data")
            raw = self._external(t, _storage_len(n, t.data_type, dt.itemsize), what)
            t2 = TensorProto()
            t2.data_type, t2.name = t.data_type, t.name
            t2.dims.extend(t.dims)
            t2.raw_data = raw
            t = t2
        elif t.HasField("raw_data"):
            want = _storage_len(n, t.data_type, dt.itemsize)
            raw = t.raw_data  # each read of the field copies the bytes: once here
            if len(raw) != want:
                raise ModelFormatError(
                    f"onnx.load: {what} declares shape {list(t.dims)} ({want} bytes of "
                    f"{dt}) but holds {len(raw)} bytes of raw data"
                )
            if t.data_type in PLAIN_RAW:  # ONNX's raw data is little-endian numpy layout: one copy, writable
                return np.frombuffer(raw, dt.newbyteorder("<")).astype(dt).reshape(tuple(t.dims))
        else:
            field = helper.tensor_dtype_to_field(t.data_type)
            have = len(getattr(t, field))
            want = n
            if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
                want = 2 * n
            elif t.data_type in _PACKED:
                want = (n + _PACKED[t.data_type] - 1) // _PACKED[t.data_type]
            if have != want:
                raise ModelFormatError(
                    f"onnx.load: {what} declares shape {list(t.dims)} ({want} values) but "
                    f"holds {have} values in {field}"
                )
        try:
            arr = numpy_helper.to_array(t)
        except Exception as exc:  # noqa: BLE001
            raise ModelFormatError(f"onnx.load: cannot decode {what}: {exc}") from None
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr)  # kernels get one array type per dtype (numba treats read-only separately)
        return arr

    def _external(self, t: TensorProto, nbytes: int, what: str) -> bytes:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location")
        if not loc:
            raise ExternalDataError(f"onnx.load: {what} uses external data but names no location")
        if self.base_dir is None:
            raise ExternalDataError(
                f"onnx.load: {what} stores its data in {loc!r} next to the model; load the "
                "model from its path (or pass base_dir=) so the file can be found"
            )
        if "\x00" in loc:  # the OS cannot name such a file; os.path would raise an untyped ValueError
            raise ExternalDataError(f"onnx.load: {what}: external data location {loc!r} contains a NUL byte")
        base = os.path.realpath(self.base_dir)
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
            raise ExternalDataError(
                f"onnx.load: {what}: external data location {loc!r} is absolute; it must be "
                "a path relative to the model's folder"
            )
        path = os.path.realpath(os.path.join(base, loc))
        if os.path.commonpath([base, path]) != base:
            raise ExternalDataError(
                f"onnx.load: {what}: external data location {loc!r} escapes the model's "
                f"folder {base!r}; refusing to read it"
            )
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else nbytes
        except ValueError:
            raise ExternalDataError(f"onnx.load: {what}: bad external data offset/length {info}") from None
        if offset < 0 or length != nbytes:
            raise ExternalDataError(
                f"onnx.load: {what}: external data length {length} (offset {offset}) does not "
                f"match the declared shape {list(t.dims)} ({nbytes} bytes)"
            )
        try:
            size = os.path.getsize(path)
            if offset + length > size:
                raise ExternalDataError(
                    f"onnx.load: {what}: external file {loc!r} has {size} bytes, the tensor "
                    f"needs bytes {offset}..{offset + length}"
                )
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(length)
        except OSError as exc:
            raise ExternalDataError(
                f"onnx.load: {what}: cannot read external data file {loc!r}: {exc.strerror or exc}"
            ) from None

    def sparse(self, st, what: str) -> np.ndarray:
        values = self.tensor(st.values, f"{what} (values)")
        idx = self.tensor(st.indices, f"{what} (indices)").astype(np.int64)
        dims = tuple(st.dims)
        n = math.prod(dims)
        _check_size(n, values.dtype.itemsize, what)
        dense = np.zeros(n, values.dtype)
        flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), dims) if idx.size else idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise ModelFormatError(f"onnx.load: {what} has sparse indices outside its shape {list(dims)}")
        dense[flat] = values.reshape(-1)
        return dense.reshape(dims)

    # -- types ----------------------------------------------------------------------------------------
    def value(self, vi) -> Value:
        return _value_from_type(vi.name, vi.type)

    # -- attributes -----------------------------------------------------------------------------------
    def attr(self, a: AttributeProto, scope: _Scope, opsets: dict, where: str):
        T = AttributeProto
        kind = a.type
        if kind == T.UNDEFINED:  # very old models leave the type unset
            for k, field in ((T.FLOAT, "f"), (T.INT, "i"), (T.STRING, "s"), (T.TENSOR, "t"), (T.GRAPH, "g")):
                if a.HasField(field):
                    kind = k
                    break
            else:
                for k, field in (
                    (T.FLOATS, "floats"),
                    (T.INTS, "ints"),
                    (T.STRINGS, "strings"),
                    (T.TENSORS, "tensors"),
                    (T.GRAPHS, "graphs"),
                ):
                    if len(getattr(a, field)):
                        kind = k
                        break
        what = f"attribute {a.name!r} of {where}"
        if kind == T.FLOAT:
            return float(a.f)
        if kind == T.INT:
            return int(a.i)
        if kind == T.STRING:
            return _str(a.s)
        if kind == T.TENSOR:
            return self.tensor(a.t, what)
        if kind == T.GRAPH:
            return self.graph(a.g, scope, opsets)
        if kind == T.SPARSE_TENSOR:
            return self.sparse(a.sparse_tensor, what)
        if kind == T.TYPE_PROTO:
            return _value_from_type("", a.tp)
        if kind == T.FLOATS:
            return [float(v) for v in a.floats]
        if kind == T.INTS:
            return [int(v) for v in a.ints]
        if kind == T.STRINGS:
            return [_str(v) for v in a.strings]
        if kind == T.TENSORS:
            return [self.tensor(t, what) for t in a.tensors]
        if kind == T.GRAPHS:
            return [self.graph(g, scope, opsets) for g in a.graphs]
        if kind == T.SPARSE_TENSORS:
            return [self.sparse(s, what) for s in a.sparse_tensors]
        if kind == T.TYPE_PROTOS:
            return [_value_from_type("", tp) for tp in a.type_protos]
        if kind == T.UNDEFINED:
            return []  # an empty list attribute carries no type
        raise ModelFormatError(f"onnx.load: {what} has unknown attribute type {a.type}")

    # -- graphs ---------------------------------------------------------------------------------------
    def graph(self, gp: onnx.GraphProto, outer: _Scope | None, opsets: dict) -> Graph:
        inits: dict[str, np.ndarray] = {}
        for t in gp.initializer:
            inits[t.name] = self.tensor(t, f"initializer {t.name!r}")
        for st in gp.sparse_initializer:
            inits[st.values.name] = self.sparse(st, f"sparse initializer {st.values.name!r}")
        names = [vi.name for vi in list(gp.input) + list(gp.output) + list(gp.value_info)]
        names += [t.name for t in gp.initializer] + [gp.name]
        if any(not isinstance(x, str) for x in names):
            raise ModelFormatError(
                f"onnx.load: graph {gp.name!r} has value names that are not valid UTF-8; the model is corrupt"
            )
        inputs = [self.value(vi) for vi in gp.input if vi.name not in inits]
        outputs = [self.value(vi) for vi in gp.output]
        value_info = {vi.name: self.value(vi) for vi in gp.value_info}
        for vi in gp.input:
            if vi.name in inits:
                value_info[vi.name] = self.value(vi)
        g = Graph(
            gp.name or "graph",
            inputs=inputs,
            outputs=outputs,
            initializers=inits,
            opset_imports={d: (_opset.MAX_OPSET if d == "" else v) for d, v in opsets.items()},
            value_info=value_info,
            doc=gp.doc_string,
        )
        scope = _Scope(g, outer)
        self._nodes(list(gp.node), g, scope, opsets, depth=0)
        self._fold_constants(g)
        # ONNX requires topological order; exporters do not always comply, so sort (cycles raise)
        g.nodes = toposort(g.nodes, set(g.initializers) | set(g.input_names), graph_name=g.name)
        return g

    def _nodes(self, protos: list, g: Graph, scope: _Scope, opsets: dict, depth: int) -> None:
        for np_ in protos:
            _check_text(np_)
            dom = "" if np_.domain in ("", "ai.onnx") else np_.domain
            where = f"node {np_.name!r} ({np_.op_type})" if np_.name else f"a {np_.op_type} node"
            ver = opsets.get(dom)
            if ver is None:
                if dom == "":
                    raise ModelFormatError(
                        f"onnx.load: {where} uses domain ai.onnx but the model imports no ai.onnx opset"
                    )
                ver = 1
            _check_node(np_, dom, ver, where)
            fn = self.functions.get((dom, np_.op_type))
            if fn is not None and not is_supported(np_.op_type, dom):
                self._inline(np_, fn, g, scope, opsets, depth, where)
                continue
            node = Node(
                np_.op_type,
                list(np_.input),
                list(np_.output),
                {a.name: self.attr(a, scope, opsets, where) for a in np_.attribute},
                domain=dom,
                name=self._node_name(np_, g),
            )
            ctx = _opset.AdapterContext(g, ver, scope.lookup, self.names)
            for n in _opset.upgrade(node, ver, ctx):
                if is_supported(n.op_type, n.domain):
                    g.nodes.append(n)
                    continue
                body = self._schema_function(n, np_, ver, scope) if n is node else None
                if body is None:
                    raise _unsupported(n, ver, where)
                self._inline(np_, body, g, scope, opsets, depth, where)

    def _node_name(self, np_, g: Graph) -> str:
        if np_.name:
            return np_.name
        self._count += 1
        return _opset.fresh_name(self.names, f"{np_.op_type}_{self._count}")

    @staticmethod
    def _fold_constants(g: Graph) -> None:
        """Constant nodes become initializers (the interpreter and passes see plain constants)."""
        from ..graph.interpreter import BUILTINS

        keep = []
        outs = set(g.output_names)
        for n in g.nodes:
            if n.op_type == "Constant" and n.domain == "" and n.outputs and n.outputs[0] not in outs:
                (val,) = BUILTINS[("", "Constant")](None, n, [], None)
                g.initializers[n.outputs[0]] = np.array(val.numpy())
            else:
                keep.append(n)
        g.nodes = keep

    # -- functions --------------------------------------------------------------------------------------
    def _schema_function(self, node: Node, np_, ver: int, scope: _Scope):
        """The ONNX function body of ``node``'s op at opset ``ver`` (None when it has none)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, ver, node.domain)
        except Exception:  # noqa: BLE001 - no such op in onnx either
            return None
        fp = None
        try:
            if schema.has_function:
                versions = sorted(schema.function_opset_versions) or [schema.since_version]
                best = max([v for v in versions if v <= ver] or [min(versions)])
                fp = onnx.FunctionProto()
                fp.ParseFromString(schema.get_function_with_opset_version(best))
            elif schema.has_context_dependent_function:
                versions = sorted(schema.context_dependent_function_opset_versions) or [schema.since_version]
                best = max([v for v in versions if v <= ver] or [min(versions)])
                types = [self._type_of(x, scope) for x in np_.input]
                if any(t is None for t in types if t is not ...):
                    return None
                data = schema.get_context_dependent_function_with_opset_version(
                    best, np_.SerializeToString(), [b"" if t is ... else t.SerializeToString() for t in types]
                )
                fp = onnx.FunctionProto()
                fp.ParseFromString(data)
        except Exception:  # noqa: BLE001 - onnx could not build the body
            return None
        if fp is None or not fp.node:
            return None
        # a schema's attribute defaults live in the schema, not in the function body
        defaults = {
            k: a.default_value
            for k, a in schema.attributes.items()
            if a.default_value is not None and a.default_value.name
        }
        if defaults:
            fp.attribute_proto.extend(d for k, d in defaults.items() if k not in {x.name for x in fp.attribute_proto})
        return fp  # _inline applies the body's own opset imports over the calling graph's

    def _type_of(self, name: str, scope: _Scope):
        if not name:
            return ...
        v = scope.lookup(name)
        if v is None or v.dtype is None:
            v = self._inferred_types().get(name)
        if v is None or v.dtype is None or v.kind != "tensor":
            return None
        elem = helper.np_dtype_to_tensor_dtype(v.dtype)
        shape = None if v.shape is None else [d if isinstance(d, int) else None for d in v.shape]
        return helper.make_tensor_type_proto(elem, shape)

    def _inferred_types(self) -> dict:
        if self._inferred is None:
            self._inferred = {}
            try:
                m = onnx.shape_inference.infer_shapes(self.proto)
                for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
                    self._inferred[vi.name] = self.value(vi)
            except Exception:  # noqa: BLE001 - inference is best effort
                pass
        return self._inferred

    def _inline(self, np_, fp, g: Graph, scope: _Scope, opsets: dict, depth: int, where: str) -> None:
        if depth >= _MAX_INLINE_DEPTH:
            raise UnsupportedOpError(
                f"onnx.load: {where}: function expansion nested deeper than "
                f"{_MAX_INLINE_DEPTH} levels (recursive function?)",
                op=np_.op_type,
            )
        self.function_nodes += len(fp.node)
        if self.function_nodes > self.max_function_nodes:
            raise ExpansionLimitError(
                f"onnx.load: {where}: expanding the model's functions would add more than "
                f"{self.max_function_nodes} nodes (function {fp.name or np_.op_type!r} of "
                f"{len(fp.node)} nodes, at nesting depth {depth}); raise the budget with "
                "onnx.load(..., max_function_nodes=N) if the model is trusted"
            )
        prefix = _opset.fresh_name(self.names, f"{np_.name or np_.op_type}__")
        mapping = {}
        for i, formal in enumerate(fp.input):
            mapping[formal] = np_.input[i] if i < len(np_.input) else ""
        for i, formal in enumerate(fp.output):
            mapping[formal] = np_.output[i] if i < len(np_.output) else ""
        attrs = {a.name: a for a in fp.attribute_proto}
        attrs.update({a.name: a for a in np_.attribute})

        def rename(x: str) -> str:
            if not x:
                return ""
            if x in mapping:
                return mapping[x]
            mapping[x] = _opset.fresh_name(self.names, prefix + x)
            return mapping[x]

        body = [_rewrite_node(n, rename, attrs) for n in fp.node]
        fn_opsets = {"" if o.domain in ("", "ai.onnx") else o.domain: int(o.version) for o in fp.opset_import}
        merged = dict(opsets)
        merged.update(fn_opsets)
        self._nodes(body, g, scope, merged, depth + 1)


def _collect_names(gp, names: set) -> None:
    for vi in list(gp.input) + list(gp.output) + list(gp.value_info):
        names.add(vi.name)
    names.update(t.name for t in gp.initializer)
    for n in gp.node:
        names.update(n.input)
        names.update(n.output)
        if n.name:
            names.add(n.name)
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _collect_names(a.g, names)
            elif a.type == AttributeProto.GRAPHS:
                for sub in a.graphs:
                    _collect_names(sub, names)


def _rewrite_node(n, rename, attrs: dict):
    """A copy of function-body node ``n`` with values renamed and attribute references bound."""
    out = onnx.NodeProto()
    out.op_type, out.domain, out.doc_string = n.op_type, n.domain, n.doc_string
    if n.name:
        out.name = rename(n.name)
    out.input.extend(rename(x) for x in n.input)
    out.output.extend(rename(x) for x in n.output)
    for a in n.attribute:
        if a.ref_attr_name:
            src = attrs.get(a.ref_attr_name)
            if src is None:
                continue
            b = out.attribute.add()
            b.CopyFrom(src)
            b.name = a.name
            continue
        b = out.attribute.add()
        b.CopyFrom(a)
        if b.type == AttributeProto.GRAPH:
            _rewrite_graph(b.g, rename, attrs)
        elif b.type == AttributeProto.GRAPHS:
            for sub in b.graphs:
                _rewrite_graph(sub, rename, attrs)
    return out


def _rewrite_graph(gp, rename, attrs: dict) -> None:
    for vi in list(gp.input) + list(gp.output) + list(gp.value_info):
        vi.name = rename(vi.name)
    for t in gp.initializer:
        t.name = rename(t.name)
    nodes = [_rewrite_node(n, rename, attrs) for n in gp.node]
    del gp.node[:]
    gp.node.extend(nodes)


def _check_text(np_) -> None:
    """Protobuf hands back invalid UTF-8 in string fields as bytes; such a model is corrupt."""
    fields = [np_.op_type, np_.domain, np_.name, *np_.input, *np_.output, *(a.name for a in np_.attribute)]
    if any(not isinstance(f, str) for f in fields):
        raise ModelFormatError(
            f"onnx.load: a node has names that are not valid UTF-8 ({fields[:3]!r}...); the model is corrupt"
        )


def _check_node(np_, dom: str, ver: int, where: str) -> None:
    """Arity and required attributes per the ONNX schema of the node's opset (when ONNX knows the op)."""
    try:
        schema = onnx.defs.get_schema(np_.op_type, ver, dom)
    except Exception:  # noqa: BLE001 - not an ONNX op (custom domain, model function): nothing to check
        return
    n_in, n_out = len(np_.input), len(np_.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise ModelFormatError(
            f"onnx.load: {where} has {n_in} inputs; {np_.op_type}-{schema.since_version} takes "
            f"{schema.min_input}..{schema.max_input}"
        )
    if not schema.min_output <= n_out <= schema.max_output:
        raise ModelFormatError(
            f"onnx.load: {where} has {n_out} outputs; {np_.op_type}-{schema.since_version} "
            f"produces {schema.min_output}..{schema.max_output}"
        )
    given = {a.name for a in np_.attribute}
    for name, attr in schema.attributes.items():
        if attr.required and name not in given:
            raise ModelFormatError(
                f"onnx.load: {where} lacks required attribute {name!r} of {np_.op_type}-{schema.since_version}"
            )


class _Scope:
    """Value types visible while importing one graph (and those of enclosing graphs)."""

    def __init__(self, g: Graph, outer: _Scope | None):
        self.g = g
        self.outer = outer

    def lookup(self, name: str) -> Value | None:
        g = self.g
        for v in g.inputs:
            if v.name == name:
                return v
        if name in g.value_info:
            return g.value_info[name]
        if name in g.initializers:
            a = g.initializers[name]
            return Value(name, a.dtype, a.shape)
        for v in g.outputs:
            if v.name == name:
                return v
        return self.outer.lookup(name) if self.outer is not None else None


def _str(b: bytes) -> str | bytes:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def _value_from_type(name: str, tp) -> Value:
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, which)
        dtype = None
        if tt.elem_type:
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            except Exception:  # noqa: BLE001
                dtype = None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        return Value(name, dtype, shape)
    if which == "sequence_type":
        return Value(name, kind="sequence", elem=_value_from_type("", tp.sequence_type.elem_type))
    if which == "optional_type":
        return Value(name, kind="optional", elem=_value_from_type("", tp.optional_type.elem_type))
    if which == "map_type":
        return Value(name, kind="map")
    return Value(name, kind="unknown")


def _unsupported(node: Node, ver: int, where: str) -> UnsupportedOpError:
    dom = node.domain or "ai.onnx"
    pool = supported_ops(node.domain) or supported_ops("")
    near = difflib.get_close_matches(node.op_type, pool, n=3, cutoff=0.5)
    hint = f"; nearest supported ops: {', '.join(near)}" if near else ""
    return UnsupportedOpError(
        f"{node.op_type}: unsupported op {node.op_type!r} (domain {dom!r}, opset {ver}) in "
        f"{where}; opsnn has no implementation{hint}",
        op=node.op_type,
    )


def load(model, *, base_dir: str | None = None, max_function_nodes: int | None = None) -> Graph:
    """Import an ONNX model (path, bytes, file object or ``onnx.ModelProto``) as a Graph.

    ``base_dir``: the folder external data files are read from (default: the model
    file's folder). ``max_function_nodes``: the most nodes that expanding functions (the model's
    local functions, ONNX function bodies) may add, so a small model of nested calls cannot
    expand without bound (default :data:`MAX_FUNCTION_NODES`). Raises :class:`~opsnn.onnx.errors.ModelFormatError`,
    :class:`~opsnn.onnx.errors.UnsupportedOpError`, :class:`~opsnn.onnx.errors.UnsupportedOpsetError`,
    :class:`~opsnn.onnx.errors.ExternalDataError`, :class:`~opsnn.onnx.errors.ExpansionLimitError` or :class:`~opsnn.onnx.errors.TensorTooLargeError`.

    >>> import onnx, numpy as np, opsnn.onnx
    >>> from onnx import helper, TensorProto
    >>> m = helper.make_model(helper.make_graph(
    ...     [helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    >>> g = opsnn.onnx.load(m)
    >>> [n.op_type for n in g.nodes]
    ['Relu']
    """
    proto, base_dir = read_model(model, base_dir)
    opsets = model_opsets(proto)
    if "" not in opsets:
        if any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
            raise ModelFormatError("onnx.load: the model imports no ai.onnx opset (opset_import is empty)")
    imp = _Importer(proto, base_dir, max_function_nodes)
    g = imp.graph(proto.graph, None, opsets)
    g.metadata.update(
        {
            "producer": proto.producer_name,
            "producer_version": proto.producer_version,
            "ir_version": int(proto.ir_version),
            "source_opsets": dict(opsets),
            "model_version": int(proto.model_version),
        }
    )
    if proto.doc_string:
        g.metadata["doc"] = proto.doc_string
    g.validate()
    return g


__all__ = ["load", "model_opsets", "read_model"]
