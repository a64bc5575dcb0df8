"""An onnxruntime-compatible session over ``opsnn.onnx.load`` + ``opsnn.compile``.

The names and semantics follow onnxruntime's Python API, so a script written for
onnxruntime runs on opsnn by changing its import (``from opsnn.onnx import ort_compat as ort``)::

    >>> import numpy as np, opsnn                                              # doctest: +SKIP
    >>> so = opsnn.SessionOptions()                                            # doctest: +SKIP
    >>> so.graph_optimization_level = opsnn.GraphOptimizationLevel.ORT_ENABLE_ALL  # doctest: +SKIP
    >>> sess = opsnn.InferenceSession("model.onnx", so, providers=["CPUExecutionProvider"])  # doctest: +SKIP
    >>> x = sess.get_inputs()[0]; (x.name, x.shape, x.type)                    # doctest: +SKIP
    ('input', ['batch', 3, 224, 224], 'tensor(float)')
    >>> sess.run(None, {"input": img})[0].shape                                # doctest: +SKIP
    (1, 1000)

What maps where: ``graph_optimization_level`` -> ``opsnn.compile(level=...)`` (DISABLE_ALL 0,
BASIC 1, EXTENDED 2, LAYOUT and ALL 3); ``intra_op_num_threads`` -> opsnn's thread count
while the session runs (0 keeps opsnn's own setting); ``optimized_model_filepath`` -> the
optimized graph saved by opsnn's ONNX serializer; ``enable_profiling`` -> opsnn's profiler,
written as a Chrome trace by ``end_profiling()``; ``log_severity_level`` -> the level of the
``opsnn`` logger while the session builds and runs. The one provider is
``CPUExecutionProvider`` (opsnn's CPU kernels); any other name is an error.
"""

from __future__ import annotations

import collections.abc
import contextlib
import ctypes
import datetime
import difflib
import enum
import logging
import math
import numbers
import os
import threading
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import dtypes as _dt
from ..errors import DTypeError, ParamInvalidError, ParamNullptrError, UnknownOptionError
from ..graph.compiler import NONDETERMINISTIC
from ..graph.compiler import compile as _compile
from ..runtime import hooks
from ..tensor import Tensor
from .importer import load, read_model

#: what this build can run on (onnxruntime's ``get_available_providers()``)
AVAILABLE_PROVIDERS = ("CPUExecutionProvider",)


def get_available_providers() -> list[str]:
    """The execution providers opsnn accepts: ``['CPUExecutionProvider']``."""
    return list(AVAILABLE_PROVIDERS)


def get_all_providers() -> list[str]:
    return list(AVAILABLE_PROVIDERS)


def get_device() -> str:
    """The device sessions run on, as onnxruntime names it (``'CPU'``)."""
    return "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels (same values); see :data:`OPT_LEVELS` for opsnn's."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


#: onnxruntime level -> ``opsnn.compile(level=)``: 1 cleanups, 2 fusions, 3 layout and precision passes
OPT_LEVELS = {
    GraphOptimizationLevel.ORT_DISABLE_ALL: 0,
    GraphOptimizationLevel.ORT_ENABLE_BASIC: 1,
    GraphOptimizationLevel.ORT_ENABLE_EXTENDED: 2,
    GraphOptimizationLevel.ORT_ENABLE_LAYOUT: 3,
    GraphOptimizationLevel.ORT_ENABLE_ALL: 3,
}


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


#: onnxruntime severity (0 verbose .. 4 fatal) -> Python logging level
_LOG_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


class _Options:
    """Attribute checks of onnxruntime's option objects: an unknown name is an error naming the
    nearest option (onnxruntime's classes have fixed attributes, so a typo never passes silently),
    and the integer options take ints in their ranges."""

    #: option -> (lowest, highest) for the integer options
    _INT_RANGES: dict = {}

    def __setattr__(self, name: str, value) -> None:
        if not name.startswith("_") and name not in self._options():
            near = difflib.get_close_matches(name, sorted(self._options()), n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else f"; options: {sorted(self._options())}"
            raise UnknownOptionError(f"{type(self).__name__} has no option {name!r}{hint}")
        bounds = self._INT_RANGES.get(name)
        if bounds is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral) or not bounds[0] <= value <= bounds[1]
        ):
            raise ParamInvalidError(
                f"{type(self).__name__}.{name}: expected an int in [{bounds[0]}, {bounds[1]}], got {value!r}"
            )
        object.__setattr__(self, name, value)

    @classmethod
    def _options(cls) -> set:
        return set(cls._FIELDS) | {n for n in dir(cls) if isinstance(getattr(cls, n, None), property)}


class SessionOptions(_Options):
    """onnxruntime's ``SessionOptions``: the same attributes and defaults; see the module
    docstring for which of them change what opsnn does (the others are kept and reported)."""

    _FIELDS = (
        "intra_op_num_threads",
        "inter_op_num_threads",
        "optimized_model_filepath",
        "enable_profiling",
        "profile_file_prefix",
        "log_severity_level",
        "log_verbosity_level",
        "logid",
        "execution_mode",
        "execution_order",
        "enable_cpu_mem_arena",
        "enable_mem_pattern",
        "enable_mem_reuse",
        "use_deterministic_compute",
        "use_per_session_threads",
    )
    _INT_RANGES = {
        "intra_op_num_threads": (0, 1 << 16),
        "inter_op_num_threads": (0, 1 << 16),
        "log_severity_level": (-1, 4),
        "log_verbosity_level": (0, 1 << 30),
    }

    def __init__(self):
        self._level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.optimized_model_filepath = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}
        self._free_dims: dict[str, int] = {}

    @property
    def graph_optimization_level(self) -> GraphOptimizationLevel:
        return self._level

    @graph_optimization_level.setter
    def graph_optimization_level(self, level) -> None:
        try:
            self._level = GraphOptimizationLevel(int(level))
        except (ValueError, TypeError):
            raise ParamInvalidError(
                f"SessionOptions.graph_optimization_level: expected a GraphOptimizationLevel "
                f"({', '.join(m.name for m in GraphOptimizationLevel)}), got {level!r}"
            ) from None

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise ParamInvalidError(
                f"SessionOptions.get_session_config_entry: no entry {key!r}; entries are {sorted(self._config)}"
            )
        return self._config[key]

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dim ``dim_name`` to ``dim_value`` (inputs then report and require it)."""
        self._free_dims[str(dim_name)] = int(dim_value)

    def has_providers(self) -> bool:
        return False


class RunOptions(_Options):
    """onnxruntime's ``RunOptions`` (kept for compatibility; a run reads ``log_severity_level``)."""

    _FIELDS = ("log_severity_level", "log_verbosity_level", "logid", "terminate", "only_execute_path_to_fetches")
    _INT_RANGES = {"log_severity_level": (-1, 4), "log_verbosity_level": (0, 1 << 30)}

    def __init__(self):
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise ParamInvalidError(
                f"RunOptions.get_run_config_entry: no entry {key!r}; entries are {sorted(self._config)}"
            )
        return self._config[key]


# -- metadata ----------------------------------------------------------------------------------------
def _elem_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


def _type_string(tp: onnx.TypeProto) -> str:
    """onnxruntime's type string: ``tensor(float)``, ``seq(tensor(int64))``, ``map(string,tensor(float))``."""
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_elem_name(tp.tensor_type.elem_type)})"
    if which == "sparse_tensor_type":
        return f"sparse_tensor({_elem_name(tp.sparse_tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    if which == "map_type":
        return f"map({_elem_name(tp.map_type.key_type)},{_type_string(tp.map_type.value_type)})"
    return "unknown"


def _shape_list(tp: onnx.TypeProto, free_dims: dict) -> list:
    """Declared dims as onnxruntime reports them: int, symbolic name (str), None for unknown;
    ``[]`` when the type carries no shape."""
    tt = (
        tp.tensor_type
        if tp.HasField("tensor_type")
        else (tp.sparse_tensor_type if tp.HasField("sparse_tensor_type") else None)
    )
    if tt is None or not tt.HasField("shape"):
        return []
    out = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.dim_param:
            out.append(free_dims.get(d.dim_param, d.dim_param))
        else:
            out.append(None)
    return out


class NodeArg:
    """An input's or output's name, declared shape and type string (onnxruntime's ``NodeArg``)."""

    __slots__ = ("_dtype", "_ranked", "name", "shape", "type")

    def __init__(self, name: str, shape: list, type: str, dtype: np.dtype | None = None, ranked: bool = False):
        self.name = name
        self.shape = shape
        self.type = type
        self._dtype = dtype
        self._ranked = ranked  # the type declares a shape (so [] means a scalar, not "unknown")

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _node_arg(vi: onnx.ValueInfoProto, free_dims: dict) -> NodeArg:
    dtype = None
    if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
        with contextlib.suppress(Exception):
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    ranked = vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    return NodeArg(vi.name, _shape_list(vi.type, free_dims), _type_string(vi.type), dtype, ranked)


class ModelMetadata:
    """What the model file says about itself (onnxruntime's ``ModelMetadata``)."""

    def __init__(self, proto: onnx.ModelProto):
        self.producer_name = proto.producer_name
        self.graph_name = proto.graph.name
        self.domain = proto.domain
        self.description = proto.doc_string
        self.graph_description = proto.graph.doc_string
        # onnxruntime reports an unset model_version as INT64_MAX
        self.version = int(proto.model_version) if proto.HasField("model_version") else 2**63 - 1
        self.custom_metadata_map = {p.key: p.value for p in proto.metadata_props}

    def __repr__(self) -> str:
        return (
            f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
            f"version={self.version})"
        )


# -- values --------------------------------------------------------------------------------------------
def _np_element_type(element_type, where: str) -> np.dtype:
    """A numpy dtype from a numpy type or an ONNX ``TensorProto`` element type int."""
    try:
        if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
            return np.dtype(helper.tensor_dtype_to_np_dtype(int(element_type)))
        return _dt.get(element_type)
    except Exception:  # noqa: BLE001 - onnx and numpy raise several kinds
        raise DTypeError(
            f"{where}: element_type must be a numpy type or an onnx.TensorProto element type, got {element_type!r}"
        ) from None


def _check_cpu(device_type: str, where: str) -> None:
    if str(device_type).lower() != "cpu":
        raise ParamInvalidError(
            f"{where}: device_type must be 'cpu' (opsnn's providers are "
            f"{list(AVAILABLE_PROVIDERS)}), got {device_type!r}"
        )


def _array_at(ptr: int, shape, dtype: np.dtype) -> np.ndarray:
    """A numpy array over ``prod(shape)`` elements of ``dtype`` at address ``ptr`` (no copy)."""
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    buf = (ctypes.c_byte * nbytes).from_address(int(ptr))
    return np.frombuffer(buf, np.uint8).view(dtype).reshape(shape)


class OrtValue:
    """A tensor held for a session (onnxruntime's ``OrtValue``, CPU tensors only): built with
    :meth:`ortvalue_from_numpy` (no copy) or :meth:`ortvalue_from_shape_and_type`."""

    def __init__(self, array: np.ndarray):
        self._array = array

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, device_type: str = "cpu", device_id: int = 0, vendor_id=-1) -> OrtValue:
        _check_cpu(device_type, "OrtValue.ortvalue_from_numpy")
        if isinstance(numpy_obj, Tensor):
            numpy_obj = numpy_obj.numpy()
        if not isinstance(numpy_obj, np.ndarray):
            raise ParamInvalidError(
                f"OrtValue.ortvalue_from_numpy: expected a numpy.ndarray, got {type(numpy_obj).__name__}"
            )
        return cls(numpy_obj if numpy_obj.flags.c_contiguous else np.ascontiguousarray(numpy_obj))

    @classmethod
    def ortvalue_from_shape_and_type(
        cls, shape, element_type, device_type: str = "cpu", device_id: int = 0, vendor_id=-1, memory_info=None
    ) -> OrtValue:
        _check_cpu(device_type, "OrtValue.ortvalue_from_shape_and_type")
        return cls(
            np.empty(
                tuple(int(s) for s in shape), _np_element_type(element_type, "OrtValue.ortvalue_from_shape_and_type")
            )
        )

    def numpy(self) -> np.ndarray:
        return self._array

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)

    def shape(self) -> list:
        return list(self._array.shape)

    def data_type(self) -> str:
        return f"tensor({self._elem_name()})"

    def element_type(self) -> int:
        return int(helper.np_dtype_to_tensor_dtype(self._array.dtype))

    def _elem_name(self) -> str:
        if self._array.dtype.kind in "OUS":
            return "string"
        return _elem_name(self.element_type())

    def device_name(self) -> str:
        return "cpu"

    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    def tensor_size_in_bytes(self) -> int:
        return int(self._array.nbytes)

    def has_value(self) -> bool:
        return True

    def is_tensor(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return False

    def is_tensor_sequence(self) -> bool:
        return False

    def update_inplace(self, data) -> None:
        src = data.numpy() if isinstance(data, OrtValue) else np.asarray(data)
        if src.shape != self._array.shape:
            raise ParamInvalidError(
                f"OrtValue.update_inplace: shape {src.shape} does not match the value's {self._array.shape}"
            )
        np.copyto(self._array, src, casting="same_kind")

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


# -- the session -----------------------------------------------------------------------------------------
def _providers(providers, provider_options) -> tuple[list, list]:
    """Check ``providers`` (names or ``(name, options)`` tuples) as onnxruntime does, except that
    an unknown provider is an error rather than a warning."""
    if providers is None:
        return list(AVAILABLE_PROVIDERS), [{} for _ in AVAILABLE_PROVIDERS]
    if isinstance(providers, str) or not isinstance(providers, collections.abc.Sequence):
        raise ParamInvalidError(
            f"InferenceSession: providers must be a sequence of names or (name, options) tuples, got {providers!r}"
        )
    pairs = []
    if provider_options is not None:
        if not isinstance(provider_options, collections.abc.Sequence) or len(provider_options) != len(providers):
            raise ParamInvalidError(
                f"InferenceSession: provider_options must be a sequence of dicts, one per "
                f"provider ({len(providers)}), got {provider_options!r}"
            )
        pairs = list(zip(providers, provider_options))
    else:
        for p in providers:
            if isinstance(p, str):
                pairs.append((p, {}))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
                pairs.append(p)
            else:
                raise ParamInvalidError(
                    f"InferenceSession: each provider must be a name or a (name, options) tuple, got {p!r}"
                )
    names, options = [], []
    for name, opts in pairs:
        if name not in AVAILABLE_PROVIDERS:
            raise ParamInvalidError(
                f"InferenceSession: unknown execution provider {name!r}; available: {list(AVAILABLE_PROVIDERS)}"
            )
        if not isinstance(opts, dict):
            raise ParamInvalidError(f"InferenceSession: options of provider {name!r} must be a dict, got {opts!r}")
        if name not in names:
            names.append(name)
            options.append({str(k): str(v) for k, v in opts.items()})
    return names, options


@contextlib.contextmanager
def _log_level(severity: int):
    if severity is None or severity < 0:
        yield
        return
    logger = logging.getLogger("opsnn")
    prev = logger.level
    logger.setLevel(_LOG_LEVELS.get(int(severity), logging.CRITICAL))
    try:
        yield
    finally:
        logger.setLevel(prev)


_threads_lock = threading.Lock()
_threads_held = [0, None]  # runs inside _threads, and the setting to put back when the last one ends


@contextlib.contextmanager
def _threads(n: int):
    """opsnn's thread count is process-wide: set for the runs of sessions that ask for one, and put
    back when the last of them (on any thread) ends."""
    if not n or n <= 0:
        yield
        return
    from ..runtime import threads

    with _threads_lock:
        if _threads_held[0] == 0:
            _threads_held[1] = threads.policy.mode
        _threads_held[0] += 1
        threads.set_num_threads(int(n))
    try:
        yield
    finally:
        with _threads_lock:
            _threads_held[0] -= 1
            if _threads_held[0] == 0:
                threads.set_num_threads(_threads_held[1])


class InferenceSession:
    """Run an ONNX model with onnxruntime's API on opsnn's graph engine; see the module docstring.

    ``path_or_bytes``: a model path, its serialized bytes (or an ``onnx.ModelProto``).
    """

    def __init__(
        self, path_or_bytes, sess_options: SessionOptions | None = None, providers=None, provider_options=None, **kwargs
    ):
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise ParamInvalidError(
                f"InferenceSession: sess_options must be an opsnn SessionOptions, got {type(sess_options).__name__}"
            )
        if not isinstance(path_or_bytes, (str, os.PathLike, bytes, bytearray, onnx.ModelProto)):
            raise ParamInvalidError(
                f"InferenceSession: expected a model path, bytes or an onnx.ModelProto, got "
                f"{type(path_or_bytes).__name__}"
            )
        self._sess_options = sess_options if sess_options is not None else SessionOptions()
        self._providers, self._provider_options = _providers(providers, provider_options)
        so = self._sess_options
        self._profile = None
        if so.enable_profiling:
            self._profile = hooks.observer("profile")  # the profiler tool, without importing it
            self._profile._start()
        self._profile_start_ns = time.monotonic_ns()
        with _log_level(so.log_severity_level):
            proto, base_dir = read_model(path_or_bytes)
            self._proto = proto
            self._graph = load(proto, base_dir=base_dir)
            self._level = OPT_LEVELS[so.graph_optimization_level]
            self._compiled = {frozenset(): self._compile_with(frozenset())}
        free = so._free_dims
        inits = {t.name for t in proto.graph.initializer}
        # before IR version 4 initializers had to be listed as inputs too: onnxruntime keeps them constant
        overridable = inits if proto.ir_version >= 4 else set()
        self._inputs_meta = [_node_arg(vi, free) for vi in proto.graph.input if vi.name not in inits]
        self._overridable = [_node_arg(vi, free) for vi in proto.graph.input if vi.name in overridable]
        self._outputs_meta = [_node_arg(vi, free) for vi in proto.graph.output]
        self._model_meta = ModelMetadata(proto)
        if so.optimized_model_filepath:
            self._compiled[frozenset()].save(os.fspath(so.optimized_model_filepath))

    def _compile_with(self, overridden: frozenset):
        g = self._graph
        if overridden:  # those initializers become inputs of a copy of the graph
            import copy

            g = copy.copy(g)
            g.initializers = {k: v for k, v in self._graph.initializers.items() if k not in overridden}
            g.inputs = list(self._graph.inputs) + [self._graph.value_info[n] for n in sorted(overridden)]
        return _compile(g, level=self._level)

    # -- metadata ----------------------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs_meta)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs_meta)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return self._model_meta

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_provider_options(self) -> dict:
        return {n: dict(o) for n, o in zip(self._providers, self._provider_options)}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def set_providers(self, providers=None, provider_options=None) -> None:
        self._providers, self._provider_options = _providers(providers, provider_options)

    @property
    def compiled_graph(self):
        """The :class:`opsnn.CompiledGraph` this session runs (for ``explain()`` and the tools)."""
        return self._compiled[frozenset()]

    # -- running -----------------------------------------------------------------------------------------
    def _feed(self, name: str, value, meta: NodeArg) -> np.ndarray | Tensor:
        where = f"InferenceSession.run: input {name!r}"
        if isinstance(value, OrtValue):
            value = value.numpy()
        if isinstance(value, (Tensor, np.ndarray)):
            arr = value
        else:
            try:
                arr = np.asarray(value, dtype=meta._dtype) if meta.type.startswith("tensor(") else value
            except (TypeError, ValueError):
                raise ParamInvalidError(
                    f"{where} expects {meta.type}, got {type(value).__name__} {value!r:.60}"
                ) from None
        if not meta.type.startswith("tensor(") or meta._dtype is None:
            return arr
        if arr.dtype != meta._dtype and not (arr.dtype.kind in "OUS" and meta._dtype.kind in "OUS"):
            raise DTypeError(
                f"{where} expects {meta.type}, got tensor({_dt.name(arr.dtype)}) of shape {tuple(arr.shape)}"
            )
        if meta._ranked:
            if len(meta.shape) != arr.ndim:
                raise ParamInvalidError(
                    f"{where} expects rank {len(meta.shape)} {meta.shape}, got rank {arr.ndim} shape {tuple(arr.shape)}"
                )
            bad = [
                f"dim {i} must be {d}, got {g}"
                for i, (d, g) in enumerate(zip(meta.shape, arr.shape))
                if isinstance(d, int) and d != g
            ]
            if bad:
                raise ParamInvalidError(
                    f"{where} expects shape {meta.shape}, got {tuple(arr.shape)} ({'; '.join(bad)})"
                )
        return arr

    def _prepare_feeds(self, input_feed) -> tuple[dict, frozenset]:
        if not isinstance(input_feed, collections.abc.Mapping):
            raise ParamInvalidError(
                f"InferenceSession.run: input_feed must be a dict {{name: array}}, got {type(input_feed).__name__}"
            )
        metas = {m.name: m for m in self._inputs_meta}
        overridable = {m.name: m for m in self._overridable}
        extra = [n for n in input_feed if n not in metas and n not in overridable]
        if extra:
            raise ParamInvalidError(
                f"InferenceSession.run: unknown input {extra[0]!r}; the model's inputs are "
                f"{list(metas)}" + (f" (overridable initializers: {list(overridable)})" if overridable else "")
            )
        missing = [n for n, m in metas.items() if n not in input_feed and not m.type.startswith("optional")]
        if missing:
            raise ParamNullptrError(
                f"InferenceSession.run: missing input {missing[0]!r} ({metas[missing[0]].type}, "
                f"shape {metas[missing[0]].shape}); got inputs {list(input_feed)}"
            )
        feeds = {n: self._feed(n, v, metas.get(n) or overridable[n]) for n, v in input_feed.items()}
        return feeds, frozenset(n for n in feeds if n in overridable)

    def _output_names(self, output_names) -> list[str]:
        names = [m.name for m in self._outputs_meta]
        if not output_names:
            return names
        if isinstance(output_names, str):
            raise ParamInvalidError(
                f"InferenceSession.run: output_names must be a list of names or None, got the "
                f"string {output_names!r} (write [{output_names!r}])"
            )
        for n in output_names:
            if n not in names:
                raise ParamInvalidError(
                    f"InferenceSession.run: unknown output name {n!r}; the model's outputs are {names}"
                )
        return list(output_names)

    def _run(self, output_names, input_feed, run_options) -> tuple[list[str], list]:
        if run_options is not None and not isinstance(run_options, RunOptions):
            raise ParamInvalidError(
                f"InferenceSession.run: run_options must be an opsnn.RunOptions or None, got {type(run_options).__name__}"
            )
        names = self._output_names(output_names)
        severity = self._sess_options.log_severity_level
        if run_options is not None and run_options.log_severity_level >= 0:
            severity = run_options.log_severity_level
        with _log_level(severity):
            feeds, overridden = self._prepare_feeds(input_feed)
            cg = self._compiled.get(overridden)
            if cg is None:
                cg = self._compiled[overridden] = self._compile_with(overridden)
            with _threads(self._sess_options.intra_op_num_threads):
                outs = cg.run(feeds)
                const = _constant_outputs(cg)
                results = [_to_numpy(outs[n], feeds, n in const) for n in names]
        return names, results

    def run(self, output_names, input_feed, run_options: RunOptions | None = None) -> list:
        """Outputs ``output_names`` (all when None or empty) for ``input_feed`` ``{name: array}``,
        as a list of numpy arrays (lists for sequence outputs, None for an empty optional)."""
        return self._run(output_names, input_feed, run_options)[1]

    def run_with_ort_values(self, output_names, input_dict_ort_values, run_options: RunOptions | None = None) -> list:
        return [OrtValue(r) for r in self.run(output_names, input_dict_ort_values, run_options)]

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run on the inputs bound to ``iobinding``, writing its bound outputs (preallocated ones in place)."""
        if not isinstance(iobinding, IOBinding) or iobinding._session is not self:
            raise ParamInvalidError(
                "InferenceSession.run_with_iobinding: the IOBinding must come from this session's io_binding()"
            )
        if not iobinding._outputs:
            raise ParamInvalidError(
                "InferenceSession.run_with_iobinding: no output is bound; call bind_output() for the outputs to compute"
            )
        names, results = self._run(list(iobinding._outputs), dict(iobinding._inputs), run_options)
        values = []
        for name, res in zip(names, results):
            dest = iobinding._outputs[name]
            if dest is None:
                values.append(OrtValue(res))
                continue
            arr = dest.numpy()
            if arr.shape != res.shape or arr.dtype != res.dtype:
                raise ParamInvalidError(
                    f"InferenceSession.run_with_iobinding: output {name!r} is bound to "
                    f"tensor({_dt.name(arr.dtype)}) of shape {arr.shape}, the run produced "
                    f"tensor({_dt.name(res.dtype)}) of shape {res.shape}"
                )
            np.copyto(arr, res)
            values.append(dest)
        iobinding._results = values

    # -- profiling ---------------------------------------------------------------------------------------
    def end_profiling(self) -> str:
        """Stop profiling and write the Chrome trace (``profile_file_prefix`` + date + ``.json`` in
        the working directory); returns its path, or ``''`` when profiling was not enabled."""
        p = self._profile
        if p is None:
            return ""
        self._profile = None
        p.__exit__(None, None, None)
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")[:-3]
        return p.export_chrome_trace(f"{self._sess_options.profile_file_prefix}_{stamp}.json")

    def get_profiling_start_time_ns(self) -> int:
        return self._profile_start_ns

    def __del__(self):
        p = getattr(self, "_profile", None)
        if p is not None:
            with contextlib.suppress(Exception):
                p._stop()


def _constant_outputs(cg) -> set:
    """Graph outputs that no input or random op reaches: a run returns the same (weight or
    folded) memory for them each time, so they are copied before the caller gets them."""
    const = getattr(cg, "_ort_constant_outputs", None)
    if const is None:
        g = cg.graph
        live = {v.name for v in g.inputs if v.name not in g.initializers}
        for node in g.nodes:
            if (
                node.op_type in NONDETERMINISTIC
                or any(n in live for n in node.inputs if n)
                or any(
                    isinstance(a, type(g)) or isinstance(a, list) and a and isinstance(a[0], type(g))
                    for a in node.attrs.values()
                )
            ):
                live.update(n for n in node.outputs if n)
        const = cg._ort_constant_outputs = {n for n in g.output_names if n not in live}
    return const


def _to_numpy(value, feeds: dict, constant: bool):
    """A run's output as onnxruntime returns it: an array the caller owns."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_to_numpy(v, feeds, True) for v in value]
    arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    # a constant, or a pass-through of an input (or a view of one), is copied: onnxruntime returns new memory
    if constant or any(
        np.may_share_memory(arr, f.numpy() if isinstance(f, Tensor) else f)
        for f in feeds.values()
        if isinstance(f, (np.ndarray, Tensor))
    ):
        arr = arr.copy()
    return arr


class IOBinding:
    """Inputs and outputs bound ahead of a run (onnxruntime's ``IOBinding``; CPU memory)."""

    def __init__(self, session: InferenceSession):
        self._session = session
        self._inputs: dict[str, np.ndarray] = {}
        self._outputs: dict[str, OrtValue | None] = {}
        self._results: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        """Bind input ``name`` to a numpy array (read at each run, not copied now)."""
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type, device_id, element_type, shape, buffer_ptr) -> None:
        """Bind input ``name`` to ``shape`` elements of ``element_type`` at address ``buffer_ptr``."""
        _check_cpu(device_type, "IOBinding.bind_input")
        self._inputs[name] = _array_at(buffer_ptr, shape, _np_element_type(element_type, "IOBinding.bind_input"))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = ortvalue.numpy()

    def bind_output(
        self, name: str, device_type="cpu", device_id=0, element_type=None, shape=None, buffer_ptr=None
    ) -> None:
        """Bind output ``name``: to preallocated memory (``element_type``, ``shape``, ``buffer_ptr``)
        written in place by each run, or (no buffer) to memory the run allocates."""
        _check_cpu(device_type, "IOBinding.bind_output")
        known = [m.name for m in self._session._outputs_meta]
        if name not in known:
            raise ParamInvalidError(f"IOBinding.bind_output: unknown output {name!r}; the model's outputs are {known}")
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise ParamInvalidError(
                f"IOBinding.bind_output: output {name!r} with a buffer_ptr needs element_type and shape"
            )
        arr = _array_at(buffer_ptr, shape, _np_element_type(element_type, "IOBinding.bind_output"))
        self._outputs[name] = OrtValue(arr)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._outputs[name] = ortvalue

    def synchronize_inputs(self) -> None:
        """Nothing to do: CPU memory is read at run time."""

    def synchronize_outputs(self) -> None:
        """Nothing to do: a run's outputs are written before it returns."""

    def get_outputs(self) -> list[OrtValue]:
        """The bound outputs of the latest ``run_with_iobinding``, in binding order."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self._results]

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []


__all__ = [
    "AVAILABLE_PROVIDERS",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "RunOptions",
    "SessionOptions",
    "get_all_providers",
    "get_available_providers",
    "get_device",
]
