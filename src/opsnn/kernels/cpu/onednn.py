"""oneDNN (Intel's Deep Neural Network Library) convolution, pooling and matmul primitives
through ctypes; convolutions and pooling on activations in a channel-blocked layout
(``nChw16c`` on AVX-512 CPUs, ``nChw8c`` on AVX2 CPUs: one vector register holds one pixel's
16 or 8 channels) or in nhwc (``block`` 0: oneDNN's brgemm convolutions, ``brgconv``, take it;
:func:`opsnn.kernels.cpu.libraries.conv_chain_layout` says which a machine's chains use).

Why: on ResNet-50's convolutions oneDNN's JIT convolutions on those layouts (the array
(N, C/b, H, W, b), or (N, H, W, C)) run about twice as fast as GEMM-based
kernels (docs/kernel-libraries.md). The graph pass
:mod:`opsnn.graph.blocked_layout` keeps whole conv chains in that layout, so the layout
change happens once at a chain's ends (``opsnn::ToBlocked`` / ``FromBlocked``).

The block follows the instruction set oneDNN runs with (:func:`block`; its own answer, so
``ONEDNN_MAX_CPU_ISA=AVX2`` gives nChw8c on an AVX-512 CPU): oneDNN has no AVX2 kernels for
nChw16c (its reference code, orders of magnitude slower) and AVX2 ones for nChw8c; opsnn's ISA
cap (``OPSNN_CPU_ISA``, :mod:`opsnn.runtime.cpu`) sets ``ONEDNN_MAX_CPU_ISA`` before loading it.
oneDNN's matmul has a fast (``brg``) implementation only with AVX-512; :func:`matmul_unavailable`
asks oneDNN which it would use.

A blocked tensor keeps its logical NCHW shape in the graph (same element count, since its
channel count is a multiple of the block): only the order of its elements differs.

Convolutions, pooling and matmuls take float32 or bfloat16 data (a mixed-precision graph's bf16
convolutions and products): with AVX512-BF16 (:func:`bf16_unavailable`) oneDNN's bf16 kernels
multiply in bf16 and accumulate in float32 at ~2x its float32 speed.

Training and eager calls on plain tensors: :class:`ConvBackwardPrimitive` (a convolution's data and
weight gradients, forward_training hint) and :class:`PlainConvPrimitive` (the forward) ask for
layouts of oneDNN's choosing and reorder the user's NCHW / OIHW tensors into and out of them at the
edges, in the caller's workspace; built once per shape (weights change every step, so none is baked in).

oneDNN is an optional dependency (PyPI ``onednn-cpu-gomp``: its GNU OpenMP build, which shares
libgomp's thread pool with numba's kernels and MKL). When it is not installed, cannot be
loaded, the CPU has neither AVX2 nor AVX-512, or ``OPSNN_ONEDNN=0``, :func:`unavailable` says why
and the layout pass leaves the graph alone. Constant weights are reordered into the primitive's
own layout once, when the primitive is built (at prepare).
"""

from __future__ import annotations

import ctypes as C
import logging
import os
import threading
import weakref
import zlib
from collections import OrderedDict

import numpy as np

from ... import dtypes as _dt
from ...runtime import cpu
from .. import bounds as _bounds
from . import fused as KF
from .gemm import bf16_to_f32, f32_to_bf16
from .mkl import prefix_libraries, threads

log = logging.getLogger(__name__)

# enum values of oneDNN's C API (v3)
_F32, _BF16 = 3, 2
TAG_ANY, TAG_A, TAG_AB, TAG_ABC, TAG_NCHW, TAG_OIHW, TAG_BA, TAG_ACB = 1, 2, 3, 4, 5, 5, 14, 15
#: layout (the blocked ops' ``block``) -> oneDNN's format tag: nhwc (acdb), nChw8c, nChw16c
TAG_BLOCKED = {0: 22, 8: 102, 16: 78}
#: oneDNN's dnnl_cpu_isa_t bits: AVX2 (0x7) and AVX-512 core (0x27, includes AVX2's)
_ISA_AVX2, _ISA_AVX512, _ISA_AVX512_BF16 = 0x7, 0x27, 0xE7
_FORWARD_INFERENCE = 96
_CONV_DIRECT = 1
_POOL_MAX = 511
_BINARY_ADD = 0x1FFF0
_ARG_SRC, _ARG_SRC_1, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS = 1, 2, 17, 33, 41
_ARG_POST_OP_BASE = 1 << 15
_ARG_SCRATCHPAD = 80
_QUERY_IMPL_INFO, _QUERY_SRC_MD, _QUERY_WEIGHTS_MD, _QUERY_DST_MD = 8, 129, 131, 133
_QUERY_SCRATCHPAD_MD = 136
_SCRATCHPAD_USER = 1
_ENGINE_CPU, _STREAM_IN_ORDER = 1, 1
#: opsnn's epilogue activation codes (kernels.cpu.fused.ACTIVATIONS) -> oneDNN eltwise algorithms
_ELTWISE = {1: 32, 2: 41, 3: 33, 4: 49, 5: 43, 6: 44, 7: 32, 8: 46}
#: activations whose oneDNN eltwise post-op is not IEEE (relu and clip map NaN to 0 or a bound, gelu_erf
#: turns +inf into NaN): on float32 they run after the primitive, in opsnn's own epilogue
_NOT_IEEE = NOT_IEEE = (1, 4, 8)


#: environment switch: blocked convolutions with such an activation keep IEEE semantics (:class:`ConvPrimitive`)
#: unless ``OPSNN_CONV_IEEE=0``, which trades NaN -> 0 under Relu for one read of X per call; read at prepare
CONV_IEEE_ENV = "OPSNN_CONV_IEEE"
_FLT_MAX = float(np.finfo(np.float32).max)
_INF = float("inf")


def conv_ieee() -> bool:
    """Whether blocked convolutions check for non-finite pre-activations (on unless ``OPSNN_CONV_IEEE=0``)."""
    return os.environ.get(CONV_IEEE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _split_act(act: int, alpha: float, beta: float, dtype) -> tuple[int, tuple | None]:
    """(the activation oneDNN runs as a post-op, (code, alpha, beta) run after it or None)."""
    if act in _NOT_IEEE and np.dtype(dtype) == np.float32:
        return 0, (act, alpha, beta)
    return act, None


_DimsArray = C.c_int64 * 12
#: oneDNN keeps sizes, strides and pads in 64-bit fields but computes with 32-bit ints inside (a pad of
#: 2**40 is a SIGFPE in its descriptor code): larger values are refused before any call
DIM_LIMIT = (1 << 31) - 1


def _Dims(*values) -> C.Array:
    """A oneDNN dims array of ``values``; OneDnnError past :data:`DIM_LIMIT`."""
    if any(abs(int(v)) > DIM_LIMIT for v in values):
        raise OneDnnError(f"sizes {tuple(int(v) for v in values)} are beyond oneDNN's 32-bit range")
    return _DimsArray(*values)


_vp = C.c_void_p

_lock = threading.Lock()
_lib = None
_why: str | None = None
_looked = False
_engine = None
_block: int | None = None
_isa = 0
_local = threading.local()


class OneDnnError(RuntimeError):
    """A oneDNN call failed (its status code and the call are in the message)."""


def _candidates() -> list[str]:
    """libdnnl shared objects (the pip package puts them in <prefix>/lib)."""
    return prefix_libraries("libdnnl.so.3*", newest_first=False)


def _load() -> None:
    global _looked
    with _lock:
        if _looked:
            return
        try:
            _open()
        finally:
            _looked = True  # last: a thread that sees it reads the finished _lib / _why


def _open() -> None:
    global _lib, _why, _engine, _block, _isa
    if os.environ.get("OPSNN_ONEDNN", "1").strip().lower() in ("0", "false", "no", "off"):
        _why = "disabled by OPSNN_ONEDNN=0"
        return
    paths = _candidates()
    if not paths:
        _why = "oneDNN is not installed (pip install onednn-cpu-gomp, x86-64 Linux only)"
        return
    cpu.library_loaded("oneDNN")  # ONEDNN_MAX_CPU_ISA follows the ISA cap
    try:
        lib = C.CDLL(paths[0])
    except OSError as e:
        _why = f"oneDNN could not be loaded from {paths[0]}: {e}"
        return
    lib.dnnl_primitive_desc_query_md.restype = _vp
    lib.dnnl_primitive_desc_query_md.argtypes = [_vp, C.c_int, C.c_int]
    lib.dnnl_memory_desc_get_size.restype = C.c_size_t
    lib.dnnl_memory_desc_get_size.argtypes = [_vp]
    lib.dnnl_memory_desc_equal.argtypes = [_vp, _vp]
    lib.dnnl_memory_desc_clone.argtypes = [_vp, _vp]
    lib.dnnl_primitive_desc_query.argtypes = [_vp, C.c_int, C.c_int, _vp]
    lib.dnnl_memory_create.argtypes = [_vp, _vp, _vp, _vp]
    lib.dnnl_reorder_primitive_desc_create.argtypes = [_vp, _vp, _vp, _vp, _vp, _vp]
    lib.dnnl_memory_desc_create_with_tag.argtypes = [_vp, C.c_int, _vp, C.c_int, C.c_int]
    lib.dnnl_memory_desc_create_with_strides.argtypes = [_vp, C.c_int, _vp, C.c_int, _vp]
    lib.dnnl_memory_set_data_handle.argtypes = [_vp, _vp]
    lib.dnnl_primitive_execute.argtypes = [_vp, _vp, C.c_int, _vp]
    lib.dnnl_stream_wait.argtypes = [_vp]
    lib.dnnl_primitive_attr_set_scratchpad_mode.argtypes = [_vp, C.c_int]
    lib.dnnl_get_effective_cpu_isa.restype = C.c_int
    _isa = isa = int(lib.dnnl_get_effective_cpu_isa())
    if isa & _ISA_AVX512 == _ISA_AVX512:
        _block = 16
    elif isa & _ISA_AVX2 == _ISA_AVX2:
        _block = 8
    else:
        _why = (
            f"oneDNN runs with neither AVX2 nor AVX-512 here (its ISA {isa:#x}): its blocked "
            "convolutions would not be faster than opsnn's own"
        )
        return
    eng = _vp()
    status = lib.dnnl_engine_create(C.byref(eng), _ENGINE_CPU, C.c_size_t(0))
    if status != 0:
        _why = f"oneDNN's CPU engine could not be created (status {status})"
        return
    try:
        gomp = C.CDLL("libgomp.so.1")
        gomp.omp_set_num_threads.argtypes = [C.c_int]
        gomp.omp_get_max_threads.restype = C.c_int
        lib.opsnn_set_threads = gomp.omp_set_num_threads
        lib.opsnn_get_threads = gomp.omp_get_max_threads
    except OSError:
        lib.opsnn_set_threads = lib.opsnn_get_threads = None
    _engine = eng
    _lib = lib


def unavailable() -> str | None:
    """None when the oneDNN primitives can be used, else the reason they cannot."""
    if not _looked:
        _load()
    return _why


def block() -> int | None:
    """The channel block of the blocked layout oneDNN's JIT kernels use here: 16 (AVX-512),
    8 (AVX2), None when oneDNN is unavailable."""
    return None if unavailable() is not None else _block


def bf16_unavailable() -> str | None:
    """None when oneDNN runs bfloat16 convolutions with native bf16 instructions here
    (AVX512-BF16: ~2x its float32 speed, measured on Zen 4), else why not (without them its
    bf16 code emulates the conversions and is slower than float32)."""
    why = unavailable()
    if why is not None:
        return why
    if _isa & _ISA_AVX512_BF16 != _ISA_AVX512_BF16:
        return f"oneDNN runs without AVX512-BF16 here (its ISA {_isa:#x}): no native bfloat16 kernels"
    return None


_matmul_why: list = []


def matmul_unavailable() -> str | None:
    """None when oneDNN's matmul is worth using for constant-weight products here, else why not:
    oneDNN is unavailable, or its matmul would not be its brgemm code (asked once, for a
    128x768 @ 768x3072 probe): its AVX2 ``gemm:jit:f32`` is slower than OpenBLAS."""
    why = unavailable()
    if why is not None:
        return why
    if not _matmul_why:
        try:
            impl = MatMulPrimitive.impl_for(128, 768, 3072)
        except OneDnnError as e:
            _matmul_why.append(f"oneDNN's matmul cannot be created: {e}")
        else:
            _matmul_why.append(
                None
                if impl.startswith("brg")
                else f"oneDNN's matmul would be its {impl} code here, slower than OpenBLAS"
            )
    return _matmul_why[0]


def product_unavailable(dtype) -> str | None:
    """None when oneDNN's matmul is worth using for a constant-weight product in ``dtype``
    (float32: :func:`matmul_unavailable`; bfloat16: that and :func:`bf16_unavailable`), else why not."""
    why = matmul_unavailable()
    if why is not None:
        return why
    d = np.dtype(dtype)
    if d == np.float32:
        return None
    if d == _dt.bfloat16:
        why = bf16_unavailable()
        return None if why is None else f"bfloat16: {why}"
    return f"float32 or bfloat16 only, not {d}"


def version() -> str | None:
    if unavailable() is not None:
        return None

    class _Version(C.Structure):
        _fields_ = [
            ("major", C.c_int),
            ("minor", C.c_int),
            ("patch", C.c_int),
            ("hash", C.c_char_p),
            ("cpu_runtime", C.c_uint),
            ("gpu_runtime", C.c_uint),
        ]

    _lib.dnnl_version.restype = C.POINTER(_Version)
    v = _lib.dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def _check(status: int, what: str) -> None:
    if status != 0:
        raise OneDnnError(f"oneDNN {what} failed with status {status}")


def _stream():
    s = getattr(_local, "stream", None)
    if s is None:
        s = _vp()
        _check(_lib.dnnl_stream_create(C.byref(s), _engine, C.c_uint(_STREAM_IN_ORDER)), "stream creation")
        _local.stream = s
    return s


def _scratchpad(nbytes: int) -> int:
    """The address of this thread's scratchpad, at least ``nbytes``, 64-byte aligned. Primitives are
    built with a user-managed scratchpad: with oneDNN's own (library) one, each primitive keeps a
    single buffer, and two threads running the same primitive at once (the LLaMA decoder's shared
    ``wt_matmul`` primitives, a kernel called eagerly from two threads) overwrite each other's
    partial results: 159 of 300 batched matmuls wrong in a two-thread test. A thread runs one
    primitive at a time, so all of a thread's primitives share its buffer (grown when needed)."""
    buf = getattr(_local, "scratch", None)
    if buf is None or buf[1] < nbytes:
        raw = np.empty(nbytes + 64, np.uint8)
        buf = _local.scratch = (raw, nbytes, raw.ctypes.data + (-raw.ctypes.data % 64))
    return buf[2]


def _dt_code(dtype) -> int:
    """oneDNN's data type for a numpy dtype: float32 or bfloat16 (ml_dtypes)."""
    d = np.dtype(dtype)
    if d == np.float32:
        return _F32
    if d == _dt.bfloat16:
        return _BF16
    raise OneDnnError(f"oneDNN primitives here take float32 or bfloat16 data, not {d}")


def _weight_array(w) -> np.ndarray:
    """A constant weight as the primitives take it: contiguous, bfloat16 kept, else float32."""
    w = np.ascontiguousarray(w)
    return w if w.dtype == _dt.bfloat16 else w.astype(np.float32, copy=False)


class _Md:
    """An owned memory descriptor (plain or blocked; float32 unless ``dtype`` says bfloat16)."""

    def __init__(self, dims, tag: int, dtype=np.float32):
        self.h = _vp()
        _check(
            _lib.dnnl_memory_desc_create_with_tag(
                C.byref(self.h), len(dims), _Dims(*(int(d) for d in dims)), _dt_code(dtype), tag
            ),
            f"memory descriptor {tuple(dims)} {np.dtype(dtype)}",
        )

    def __del__(self):
        if _lib is not None and self.h:
            _lib.dnnl_memory_desc_destroy(self.h)


class _StridedMd(_Md):
    """An owned memory descriptor of a strided array view (``strides`` in elements)."""

    def __init__(self, dims, strides, dtype):
        self.h = _vp()
        _check(
            _lib.dnnl_memory_desc_create_with_strides(
                C.byref(self.h), len(dims), _Dims(*(int(d) for d in dims)), _dt_code(dtype),
                _Dims(*(int(s) for s in strides)),
            ),
            f"memory descriptor {tuple(dims)} strides {tuple(strides)} {np.dtype(dtype)}",
        )  # fmt: skip


class Primitive:
    """A built primitive and the memory descriptors of its arguments: :meth:`run` binds arrays
    (raw pointers) to them and executes on the calling thread's stream."""

    def __init__(self, pd, args: list[tuple[int, object]], keep=()):
        self._pd = pd
        self._prim = _vp()
        _check(_lib.dnnl_primitive_create(C.byref(self._prim), pd), "primitive creation")
        # the scratchpad is the caller's (every attribute asks for _SCRATCHPAD_USER): one buffer per
        # thread, passed at each run, so threads can run the same primitive at once
        sp = _vp(_lib.dnnl_primitive_desc_query_md(pd, _QUERY_SCRATCHPAD_MD, 0))  # owned by pd
        self._scratch = int(_lib.dnnl_memory_desc_get_size(sp)) if sp else 0
        if self._scratch:
            args = list(args) + [(_ARG_SCRATCHPAD, sp)]
        self._args = args  # (argument id, memory descriptor handle) in run()'s order
        self._keep = list(keep)  # descriptors and buffers the handles point into
        self._mems = threading.local()
        self.impl = _impl_name(pd)
        if self.impl.startswith("ref"):
            log.warning("oneDNN runs %s with its reference implementation (slow)", self.impl)

    def _memories(self) -> _Memories:
        m = getattr(self._mems, "v", None)
        if m is None:  # one set per thread (set_data_handle on a shared set would race)
            self._mems.v = m = _Memories(self._args)
        return m

    def run(self, *ptrs: int) -> None:
        """Execute with the arguments at these addresses (in the order of ``args``)."""
        self._execute(ptrs)

    def bind(self, ptrs: tuple, keep=()):
        """A zero-argument call running this primitive on these addresses: what :meth:`run` does,
        less its arguments' per-call handling. ``keep``: the arrays behind the addresses, held as
        long as the call is. Kernels bind once for a compiled graph's fixed buffers: a conv call
        from Python cost 11.3 us through the array-taking ``__call__`` (``ndarray.ctypes.data``
        alone is 1.8 us an array), 3.8 through :meth:`run`, 2.9 bound, 1.6 for the bare
        ``dnnl_primitive_execute`` + wait (2-core Zen 4 VM, a 16-channel 2x2 conv)."""
        ptrs = tuple(ptrs)
        execute = self._execute

        def call(keep=keep):
            execute(ptrs)

        return call

    def _execute(self, ptrs: tuple) -> None:
        if self._scratch:
            ptrs += (_scratchpad(self._scratch),)
        m = self._memories()
        if ptrs != m.bound:
            for h, p in zip(m.handles, ptrs):
                _check(_lib.dnnl_memory_set_data_handle(h, p), "set data handle")
            m.bound = ptrs
        # OpenMP's thread count is the process's (torch reads it too): set for this call, then put back
        had = _lib.opsnn_get_threads() if _lib.opsnn_get_threads is not None else 0
        want = threads()
        if had and had != want:
            _lib.opsnn_set_threads(want)
        try:
            stream = _stream()
            status = _lib.dnnl_primitive_execute(self._prim, stream, len(m.handles), m.args)
            if status:
                _check(status, f"execution of {self.impl}")
            _check(_lib.dnnl_stream_wait(stream), "stream wait")
        finally:
            if had and had != want:
                _lib.opsnn_set_threads(had)

    def __del__(self):
        if _lib is None:
            return
        if self._prim:
            _lib.dnnl_primitive_destroy(self._prim)
        if self._pd:
            _lib.dnnl_primitive_desc_destroy(self._pd)


class _ExecArg(C.Structure):
    _fields_ = [("arg", C.c_int), ("memory", _vp)]


class _Memories:
    """A primitive's memory objects for one thread (data pointers bound per call; ``bound``:
    the pointers they hold now), destroyed with it."""

    def __init__(self, args):
        self.handles = []
        for _, md in args:
            h = _vp()
            _check(_lib.dnnl_memory_create(C.byref(h), md, _engine, None), "memory object")
            self.handles.append(h)
        self.args = (_ExecArg * len(args))(*[_ExecArg(a, h) for (a, _), h in zip(args, self.handles)])
        self.bound = None

    def __del__(self):
        if _lib is not None:
            for h in self.handles:
                _lib.dnnl_memory_destroy(h)


def _new_attr():
    """A primitive attribute with a user-managed scratchpad (see :func:`_scratchpad`); the caller
    destroys it once the descriptor is made."""
    attr = _vp()
    _check(_lib.dnnl_primitive_attr_create(C.byref(attr)), "attribute creation")
    _check(_lib.dnnl_primitive_attr_set_scratchpad_mode(attr, _SCRATCHPAD_USER), "scratchpad mode")
    return attr


def _attr_with(post_ops: list[tuple]):
    attr = _new_attr()
    po = _vp()
    _check(_lib.dnnl_post_ops_create(C.byref(po)), "post-op creation")
    for op in post_ops:
        if op[0] == "sum":  # dst += result (dst's old contents, same type)
            _check(_lib.dnnl_post_ops_append_sum(po, C.c_float(1.0), C.c_int32(0), C.c_int(0)), "sum post-op")
        elif op[0] == "binary_add":
            _check(_lib.dnnl_post_ops_append_binary(po, _BINARY_ADD, op[1].h), "binary post-op")
        else:
            _, alg, alpha, beta = op
            _check(_lib.dnnl_post_ops_append_eltwise(po, alg, C.c_float(alpha), C.c_float(beta)), "eltwise post-op")
    _check(_lib.dnnl_primitive_attr_set_post_ops(attr, po), "setting post-ops")
    _lib.dnnl_post_ops_destroy(po)
    return attr


def _eltwise(code: int, alpha: float, beta: float) -> tuple[int, float, float]:
    alg = _ELTWISE[code]
    if code == 1:
        return alg, 0.0, 0.0
    if code in (6, 7):  # swish(alpha); leaky relu: relu with a negative slope
        return alg, alpha, 0.0
    if code == 8:
        return alg, alpha, beta
    return alg, 0.0, 0.0


def _reorder(src_md, src: np.ndarray, dst_md, dst: np.ndarray) -> None:
    rpd, attr = _vp(), _new_attr()
    status = _lib.dnnl_reorder_primitive_desc_create(C.byref(rpd), src_md, _engine, dst_md, _engine, attr)
    _lib.dnnl_primitive_attr_destroy(attr)
    _check(status, "reorder descriptor")
    Primitive(rpd, [(_ARG_SRC, src_md), (_ARG_DST, dst_md)]).run(src.ctypes.data, dst.ctypes.data)


def _epilogue(dst: _Md, residual: bool, act: int, alpha: float, beta: float) -> list:
    """Post-ops for ``act(result + Z)``: a binary add of Z (laid out as ``dst``), then the activation."""
    post = [("binary_add", dst)] if residual else []
    if act:
        post.append(("eltwise",) + _eltwise(act, alpha, beta))
    return post


def _weighted_args(pd, src: _Md, bias, residual: bool, dst: _Md) -> list:
    """(argument id, memory descriptor) in the order ``ConvPrimitive.__call__`` passes pointers:
    source, the reordered weight, [bias], [the residual post-op's operand], destination."""
    args = [(_ARG_SRC, src.h), (_ARG_WEIGHTS, _vp(_lib.dnnl_primitive_desc_query_md(pd, _QUERY_WEIGHTS_MD, 0)))]
    if bias is not None:
        args.append((_ARG_BIAS, bias.h))
    if residual:
        args.append((_ARG_POST_OP_BASE | _ARG_SRC_1, dst.h))
    args.append((_ARG_DST, dst.h))
    return args


class _Reordered:
    """A constant weight reordered into one primitive's layout, 64-byte aligned (``weight``, a view
    of ``raw``), with a clone of that layout's descriptor (``md``) and a weak reference to the
    source array (``src``): primitives that want the same source in the same layout share it."""

    __slots__ = ("md", "weight", "raw", "src", "__weakref__")

    def __del__(self):
        md = getattr(self, "md", None)
        if _lib is not None and md:
            _lib.dnnl_memory_desc_destroy(md)


#: (source data pointer, shape, dtype, CRC-32 of its bytes) -> weak references to its
#: :class:`_Reordered` copies
_reordered: dict = {}
_reordered_lock = threading.Lock()


def _reordered_weight(pd, plain: _Md, w, source: tuple | None = None) -> _Reordered:
    """The constant weight ``w`` (described by ``plain``) in the layout primitive ``pd`` chose.
    Built once per (source array, layout): every plan of a compiled graph (one per input shape)
    builds its own primitives, and without sharing each would hold its own copy of every weight
    (ResNet-50 with four batch sizes: 4 x 97.5 MiB); a copy lives as long as a primitive uses it.
    The key has the weight's CRC-32 (~25 ms per 100 MB, less than the reorder it saves), so a
    weight array changed in place between two compiles is reordered again, never served stale.
    ``source`` = (array, name): ``w`` is a function computing the weight from that array (e.g.
    Winograd's transformed weight), called only when no copy derived from it by ``name`` exists;
    the copy is keyed by, and lives no longer than is useful for, the source array."""
    w_md = _vp(_lib.dnnl_primitive_desc_query_md(pd, _QUERY_WEIGHTS_MD, 0))  # owned by pd
    src, name = source if source is not None else (w, "")
    key = (src.ctypes.data, src.shape, src.dtype.str, zlib.crc32(memoryview(src.reshape(-1).view(np.uint8))), name)
    with _reordered_lock:
        live = []
        for ref in _reordered.get(key, ()):
            e = ref()
            if e is None or e.src() is not src:  # dropped, or another array now at that address
                continue
            live.append(ref)
            if _lib.dnnl_memory_desc_equal(e.md, w_md):
                _reordered[key] = live
                return e
        if source is not None:
            w = w()
        nbytes = _lib.dnnl_memory_desc_get_size(w_md)
        e = _Reordered()
        e.raw = np.empty(nbytes // w.itemsize + 64 // w.itemsize, w.dtype)
        off = (-e.raw.ctypes.data % 64) // w.itemsize
        e.weight = e.raw[off : off + nbytes // w.itemsize]
        _reorder(plain.h, w, w_md, e.weight)
        e.md = _vp()
        _check(_lib.dnnl_memory_desc_clone(C.byref(e.md), w_md), "memory descriptor clone")
        e.src = weakref.ref(src)
        live.append(weakref.ref(e))
        _reordered[key] = live
        # forget keys whose copies are all gone (a long-lived process compiles many graphs)
        for k in [k for k, refs in _reordered.items() if all(r() is None for r in refs)]:
            del _reordered[k]
        return e


def _blocked_tag(block: int) -> int:
    if unavailable() is not None:
        raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
    if block not in TAG_BLOCKED:
        raise OneDnnError(f"channel block {block} is not one of {sorted(TAG_BLOCKED)}")
    return TAG_BLOCKED[block]


def _conv_desc(
    x_shape,
    w_shape,
    y_shape,
    strides,
    pads,
    dilations,
    src_blocked,
    has_bias,
    residual,
    act,
    alpha=0.0,
    beta=0.0,
    block=16,
    dtype=np.float32,
):
    """A convolution's primitive descriptor and the memory descriptors it refers to: X, W, B, Z
    and Y in ``dtype`` (float32, or bfloat16: oneDNN accumulates in float32 and rounds Y once)."""
    tag = _blocked_tag(block)
    # a plain X into an nhwc chain: oneDNN has only reference code for NCHW -> nhwc, so X goes in
    # the layout it chooses (ConvPrimitive reorders it, see _SourceReordered)
    src = _Md(x_shape, tag if src_blocked else TAG_ANY if block == 0 else TAG_NCHW, dtype)
    dst = _Md(y_shape, tag, dtype)
    w_any = _Md(w_shape, TAG_ANY, dtype)
    bias = _Md([w_shape[0]], TAG_A, dtype) if has_bias else None
    attr = _attr_with(_epilogue(dst, residual, act, alpha, beta))
    pd = _vp()
    dil = [int(d) - 1 for d in dilations]
    pt, pl, pb, pr = pads
    status = _lib.dnnl_convolution_forward_primitive_desc_create(
        C.byref(pd),
        _engine,
        _FORWARD_INFERENCE,
        _CONV_DIRECT,
        src.h,
        w_any.h,
        bias.h if bias else None,
        dst.h,
        _Dims(*strides),
        _Dims(*dil),
        _Dims(pt, pl),
        _Dims(pb, pr),
        attr,
    )
    _lib.dnnl_primitive_attr_destroy(attr)
    _check(status, f"convolution descriptor (x {tuple(x_shape)}, w {tuple(w_shape)}, y {tuple(y_shape)})")
    return pd, (src, dst, w_any, bias)


def _impl_name(pd) -> str:
    s = C.c_char_p()
    _lib.dnnl_primitive_desc_query(pd, _QUERY_IMPL_INFO, 0, C.byref(s))
    return s.value.decode() if s.value else "?"


def conv_impl(
    x_shape,
    w_shape,
    y_shape,
    strides,
    pads,
    dilations,
    *,
    block: int,
    src_blocked: bool,
    has_bias: bool = False,
    residual: bool = False,
    act: int = 0,
    dtype=np.float32,
) -> str:
    """The implementation oneDNN picks for this convolution (descriptor only: no weight, no JIT
    code). One starting with ``ref`` is oneDNN's scalar reference code, orders of magnitude
    slower than its JIT kernels: the layout pass does not move such a convolution to oneDNN."""
    pd, _ = _conv_desc(
        x_shape,
        w_shape,
        y_shape,
        strides,
        pads,
        dilations,
        src_blocked,
        has_bias,
        residual,
        act,
        block=block,
        dtype=dtype,
    )
    try:
        return _impl_name(pd)
    finally:
        _lib.dnnl_primitive_desc_destroy(pd)


class _SourceReordered:
    """A primitive reading its source in the layout it chose: :meth:`run` and :meth:`bind` take the
    plain source's address and reorder it into a buffer first, carved from the caller's workspace
    (:attr:`workspace_bytes`; a temporary one without). A convolution with a few input channels, e.g.
    ResNet's stem, starting an nhwc chain: oneDNN's direct kernel on a blocked source of its choosing."""

    def __init__(self, prim: Primitive, reorder: Primitive, nbytes: int):
        self.prim, self._reorder = prim, reorder
        self.impl = prim.impl
        self.workspace_bytes = int(nbytes) + 64

    def _buffer(self, ws) -> tuple:
        if ws is None or ws.nbytes < self.workspace_bytes:
            ws = np.empty(self.workspace_bytes, np.uint8)
        return ws, ws.ctypes.data + (-ws.ctypes.data % 64)

    def run(self, *ptrs: int, ws=None) -> None:
        ws, buf = self._buffer(ws)
        self._reorder.run(ptrs[0], buf)
        self.prim.run(buf, *ptrs[1:])

    def bind(self, ptrs: tuple, keep=(), ws=None):
        ws, buf = self._buffer(ws)
        reorder = self._reorder.bind((ptrs[0], buf), keep=(ws,))
        call = self.prim.bind((buf,) + tuple(ptrs[1:]), keep=keep)

        def both():
            reorder()
            call()

        return both


def _run_prim(prim, ptrs: tuple, ws) -> None:
    """``prim.run`` on these addresses (a :class:`_SourceReordered` one with its buffer in ``ws``)."""
    if isinstance(prim, _SourceReordered):
        prim.run(*ptrs, ws=ws)
    else:
        prim.run(*ptrs)


def _bind_prim(prim, ptrs: tuple, keep, ws):
    """``prim.bind`` on these addresses (a :class:`_SourceReordered` one with its buffer in ``ws``)."""
    return prim.bind(ptrs, keep=keep, ws=ws) if isinstance(prim, _SourceReordered) else prim.bind(ptrs, keep=keep)


class ConvPrimitive:
    """``act(conv(X, W) + B + Z)`` for (N, C, H, W) ``X`` (plain NCHW or blocked), a constant weight
    (reordered here, once), optional bias ``B`` (C_out,), optional residual ``Z`` and the output ``Y``
    blocked (a binary-add and an eltwise post-op): ``nChw<block>c``, or nhwc for ``block`` 0. X, W, B, Z
    and Y are all float32 or all bfloat16 (W's dtype says which; oneDNN's bf16 kernels multiply
    in bf16, accumulate in float32: ~2x the float32 ones' speed with AVX512-BF16)."""

    def __init__(
        self,
        x_shape,
        w: np.ndarray,
        y_shape,
        strides,
        pads,
        dilations,
        *,
        block: int,
        src_blocked: bool,
        has_bias: bool,
        residual: bool,
        act: int,
        alpha: float = 0.0,
        beta: float = 0.0,
        bias_bound: float | None = None,
    ):
        w = _weight_array(w)
        self._bias_bound = bias_bound  # max|B| of a bias known at prepare: not read per call
        # the convolution keeps its activation as a post-op (NaN -> 0 under Relu): run after the
        # primitive it costs a pass over every conv output, 14% of ResNet-50 (docs/performance.md)
        self.after = None
        self._desc_args = (x_shape, w, y_shape, strides, pads, dilations, src_blocked, has_bias, residual)
        self._block = block
        self.prim, self._w = self._build(act, alpha, beta)
        self.weight = self._w.weight
        self.has_bias, self.residual = has_bias, residual
        # IEEE (unless OPSNN_CONV_IEEE=0): the post-op activation is exact unless a pre-activation is NaN,
        # which needs a non-finite X, W, B or Z or an overflow; a bound on |X|, |B|, |Z| read per call rules
        # both out, else a second primitive without the post-op runs and opsnn's epilogue activates
        self.checked = self.l1 = None
        if np.dtype(w.dtype) in (np.float32, _dt.bfloat16) and conv_ieee():
            wabs = np.abs(w).reshape(w.shape[0], -1)  # exact in w's dtype; summed in float64 below
            taps = wabs.shape[1] + 2
            # float32 partial sums of n terms stay within (1 + n u) of the exact bound (u = 2^-24); bfloat16
            # operands multiply exactly into oneDNN's float32 accumulator, so the same bound holds
            self.l1 = (float(wabs.sum(axis=1, dtype=np.float64).max(initial=0.0)), 1.0 + 2.0 * taps * 2.0**-24)
            self._act = (act, alpha, beta)
            # a bfloat16 output rounds to nearest: up to half a unit (2^-8) past the float32 value
            self._out_grow = 1.0 if np.dtype(w.dtype) == np.float32 else 1.0 + 2.0**-7
        if self.l1 is not None and act in _NOT_IEEE:
            self.checked = self.l1
            # the primitive without the post-op is built on the first call past the bound (a NaN is
            # rare): a compiled model's prepare makes no second JIT kernel per convolution
            self._plain = None
            self._plain_lock = threading.Lock()

    def _build(self, act: int, alpha: float, beta: float) -> tuple:
        """(primitive, reordered weight) of this convolution with post-op activation ``act`` (0: none)."""
        x_shape, w, y_shape, strides, pads, dilations, src_blocked, has_bias, residual = self._desc_args
        pd, mds = _conv_desc(
            x_shape,
            w.shape,
            y_shape,
            strides,
            pads,
            dilations,
            src_blocked,
            has_bias,
            residual,
            act,
            alpha,
            beta,
            self._block,
            w.dtype,
        )
        wr = _reordered_weight(pd, _Md(w.shape, TAG_OIHW, w.dtype), w)  # shared when the layouts agree
        src, dst, _, bias = mds
        if src_blocked or self._block != 0:
            return Primitive(pd, _weighted_args(pd, src, bias, residual, dst), keep=mds), wr
        chosen = _cloned_md(_vp(_lib.dnnl_primitive_desc_query_md(pd, _QUERY_SRC_MD, 0)))
        prim = Primitive(pd, _weighted_args(pd, chosen, bias, residual, dst), keep=mds + (chosen,))
        plain = _Md(x_shape, TAG_NCHW, w.dtype)
        if _lib.dnnl_memory_desc_equal(chosen.h, plain.h):
            return prim, wr
        return _SourceReordered(prim, _reorder_primitive(plain, chosen), _lib.dnnl_memory_desc_get_size(chosen.h)), wr

    def plain(self) -> tuple:
        """(primitive, reordered weight) of this convolution without its activation post-op."""
        with self._plain_lock:
            if self._plain is None:
                self._plain = self._build(0, 0.0, 0.0)
            return self._plain

    @property
    def impl(self) -> str:
        return self.prim.impl

    def _ptrs(self, x: np.ndarray, b, z, y: np.ndarray, weight=None) -> tuple:
        ptrs = [x.ctypes.data, (self.weight if weight is None else weight).ctypes.data]
        if self.has_bias:
            ptrs.append(b.ctypes.data)
        if self.residual:
            ptrs.append(z.ctypes.data)
        ptrs.append(y.ctypes.data)
        return tuple(ptrs)

    def pre_bound(self, x: np.ndarray, b, z, xb=None, zb=None) -> float:
        """A bound on every pre-activation, ``(max|X| * max_m sum|W_m| + max|B| + max|Z|)`` times the rounding
        growth (bfloat16 as float32: oneDNN accumulates in float32): inf or NaN where X, B or Z holds a NaN
        or an Inf. ``xb`` / ``zb``: bounds of max|X| / max|Z| known without reading them (a producer's);
        where those give a bound past float32's range, X and Z are read after all."""
        w_l1, grow = self.l1
        bb = (KF.max_abs(b) if self._bias_bound is None else self._bias_bound) if self.has_bias else 0.0
        p = ((KF.max_abs(x) if xb is None else xb) * w_l1 + bb) * grow
        if self.residual:
            p += (KF.max_abs(z) if zb is None else zb) * grow
        if not p < _FLT_MAX and (xb is not None or zb is not None):
            return self.pre_bound(x, b, z)
        return p

    def bounded(self, x: np.ndarray, b, z) -> bool:
        """Whether every pre-activation is finite for sure (:meth:`pre_bound` below float32's largest value;
        False for a NaN or Inf anywhere)."""
        return self.pre_bound(x, b, z) < _FLT_MAX  # an inf or NaN bound compares False

    def out_bound(self, p: float) -> float:
        """A bound on max|Y| given the bound ``p`` on the pre-activations (each activation here is at most
        |p| in magnitude, or a constant)."""
        act, alpha, beta = self._act
        if act in (2, 3):  # Sigmoid, Tanh
            p = 1.0
        elif act == 7:  # LeakyRelu
            p *= max(1.0, abs(alpha))
        elif act == KF.CLIP:  # a clipped value is X's or one of the limits
            p = max([p] + [abs(v) for v in (alpha, beta) if abs(v) < _FLT_MAX])
        return p * self._out_grow

    def activate(self, y: np.ndarray) -> None:
        """opsnn's IEEE activation on the post-op-free primitive's output ``y`` (bfloat16 through float32:
        Relu and Clip give back a value of ``y`` or a bound, so the rounding back is exact)."""
        if y.dtype == np.float32:
            KF.epilogue(y, None, None, *self._act)
            return
        y32 = y.astype(np.float32)
        KF.epilogue(y32, None, None, *self._act)
        y[...] = y32.astype(y.dtype)

    @property
    def workspace_bytes(self) -> int:
        """Bytes a call wants from its caller's workspace (a plain X reordered for an nhwc chain), else 0."""
        return getattr(self.prim, "workspace_bytes", 0)

    def __call__(self, x: np.ndarray, b, z, y: np.ndarray, ws=None) -> None:
        if self.checked is not None and not self.bounded(x, b, z):
            prim2, w2 = self.plain()
            _run_prim(prim2, self._ptrs(x, b, z, y, w2.weight), ws)
            self.activate(y)
            return
        _run_prim(self.prim, self._ptrs(x, b, z, y), ws)
        if self.after:
            KF.epilogue(y, None, None, *self.after)

    def bind(self, x: np.ndarray, b, z, y: np.ndarray, ws=None):
        """``lambda: self(x, b, z, y)``, the addresses taken once (:meth:`Primitive.bind`). Inside a plan's
        binding (:mod:`opsnn.kernels.bounds`) the call publishes a bound on max|Y| each run, and the IEEE
        check takes the bounds of X and Z from their producers where they publish one instead of reading."""
        call = _bind_prim(self.prim, self._ptrs(x, b, z, y), (x, b, z, y, self), ws)  # self: its reordered weight
        xcell = _bounds.lookup(x)
        zcell = _bounds.lookup(z) if self.residual else None
        ycell = _bounds.publish(y) if self.l1 is not None else None
        if self.checked is not None:
            safe = []  # the post-op-free primitive bound to these addresses, once needed

            def call_checked():
                p = self.pre_bound(x, b, z, _bounds.known(xcell), _bounds.known(zcell))
                if p < _FLT_MAX:
                    call()
                    if ycell is not None:
                        ycell[0] = self.out_bound(p)
                    return
                if not safe:
                    prim2, w2 = self.plain()
                    safe.append(_bind_prim(prim2, self._ptrs(x, b, z, y, w2.weight), (x, b, z, y, w2), ws))
                safe[0]()
                self.activate(y)
                if ycell is not None:
                    ycell[0] = _INF

            return call_checked
        if ycell is not None and xcell is not None and (zcell is not None or not self.residual):
            # no check of its own: a bound from the producers' bounds, nothing read but B
            def call_bounding():
                call()
                if self.after:
                    KF.epilogue(y, None, None, *self.after)
                xb, zb = _bounds.known(xcell), _bounds.known(zcell)
                ok = xb is not None and (zb is not None or not self.residual)
                ycell[0] = self.out_bound(self.pre_bound(x, b, z, xb, zb)) if ok else _INF

            return call_bounding
        if not self.after:
            return call
        after = self.after

        def call_then_activate():
            call()
            KF.epilogue(y, None, None, *after)

        return call_then_activate


class MaxPoolPrimitive:
    """2-D max pooling on blocked (``nChw<block>c``, nhwc for ``block`` 0) float32 or bfloat16 activations."""

    def __init__(self, x_shape, y_shape, kernel, strides, pads, *, block: int, dtype=np.float32):
        tag = _blocked_tag(block)
        src = _Md(x_shape, tag, dtype)
        dst = _Md(y_shape, tag, dtype)
        pt, pl, pb, pr = pads
        pd, attr = _vp(), _new_attr()
        status = _lib.dnnl_pooling_forward_primitive_desc_create(
            C.byref(pd),
            _engine,
            _FORWARD_INFERENCE,
            _POOL_MAX,
            src.h,
            dst.h,
            _Dims(*strides),
            _Dims(*kernel),
            _Dims(0, 0),
            _Dims(pt, pl),
            _Dims(pb, pr),
            attr,
        )
        _lib.dnnl_primitive_attr_destroy(attr)
        _check(status, f"max pooling descriptor (x {tuple(x_shape)}, y {tuple(y_shape)})")
        self.prim = Primitive(pd, [(_ARG_SRC, src.h), (_ARG_DST, dst.h)], keep=(src, dst))

    @property
    def impl(self) -> str:
        return self.prim.impl

    def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.prim.run(x.ctypes.data, y.ctypes.data)
        if not KF.max_abs(x) < _INF:
            self.nonfinite_windows(x, y)

    def nonfinite_windows(self, x: np.ndarray, y: np.ndarray) -> None:
        """NaN where a window of X holds one, -inf where all of a window is -inf: oneDNN's max gives the
        first its largest number and the second the lowest finite one (the same primitive pools masks
        of X)."""
        nan = np.isnan(x)
        if nan.any():
            y[self._pooled(nan, y) > 0] = np.nan
        above = x != -np.inf
        if not above.all():
            y[self._pooled(above, y) == 0] = -np.inf

    def _pooled(self, mask: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The windows' max of a 0/1 ``mask`` of X (1 where any element of the window is 1)."""
        m, pooled = np.ascontiguousarray(mask, dtype=y.dtype), np.empty_like(y)  # m held while oneDNN reads it
        self.prim.run(m.ctypes.data, pooled.ctypes.data)
        return pooled

    def bind(self, x: np.ndarray, y: np.ndarray):
        """``lambda: self(x, y)``, the addresses taken once (:meth:`Primitive.bind`). Y takes X's bound
        (:mod:`opsnn.kernels.bounds`: each value of Y is one of X's); X is read for NaN only where its
        producer hands no finite bound."""
        call = self.prim.bind((x.ctypes.data, y.ctypes.data), keep=(x, y))
        xcell = _bounds.lookup(x)
        _bounds.share(x, y)

        def call_keeping_nan():
            call()
            if _bounds.known(xcell) is None and not KF.max_abs(x) < _INF:
                self.nonfinite_windows(x, y)

        return call_keeping_nan


def _matmul_pd(src: _Md, w: _Md, bias, dst: _Md, post: list, what: str):
    """oneDNN's matmul primitive descriptor for these memory descriptors and post-ops."""
    if unavailable() is not None:
        raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
    attr = _attr_with(post)
    pd = _vp()
    status = _lib.dnnl_matmul_primitive_desc_create(
        C.byref(pd), _engine, src.h, w.h, bias.h if bias else None, dst.h, attr
    )
    _lib.dnnl_primitive_attr_destroy(attr)
    _check(status, f"{what} descriptor")
    return pd


class MatMulPrimitive:
    """``act(A @ W + bias + Z)`` for row-major ``A`` (M, K), a constant ``W`` (K, N)
    (reordered here, once, into the primitive's blocked layout), optional ``bias`` (N,) and
    residual ``Z`` (M, N), row-major ``Y`` (M, N): oneDNN's matmul (brgemm) with the bias as its
    bias argument and the residual add and activation as post-ops. All float32, or all bfloat16
    (W's dtype says which; float32 accumulation, Y rounded once).
    ``transposed``: ``w`` is W.T, row-major (N, K) (a Gemm's B with transB=1), read as such."""

    def __init__(
        self,
        m: int,
        w: np.ndarray,
        *,
        has_bias: bool,
        residual: bool,
        act: int,
        alpha: float = 0.0,
        beta: float = 0.0,
        transposed: bool = False,
    ):
        w = _weight_array(w)
        n, k = w.shape if transposed else w.shape[::-1]
        act, self.after = _split_act(act, alpha, beta, w.dtype)
        pd, (src, dst, w_any, bias), post = self._desc(m, k, n, has_bias, residual, act, alpha, beta, w.dtype)
        self._w = _reordered_weight(pd, _Md([k, n], TAG_BA if transposed else TAG_AB, w.dtype), w)
        self.weight = self._w.weight
        self.prim = Primitive(pd, _weighted_args(pd, src, bias, residual, dst), keep=(src, dst, w_any, bias))
        self.has_bias, self.residual = has_bias, residual
        self.shape = (m, k, n)
        self.post = [p[0] for p in post] + (["activation (opsnn epilogue)"] if self.after else [])

    @staticmethod
    def _desc(m, k, n, has_bias, residual, act, alpha, beta, dtype=np.float32):
        src, dst = _Md([m, k], TAG_AB, dtype), _Md([m, n], TAG_AB, dtype)
        w_any = _Md([k, n], TAG_ANY, dtype)
        bias = _Md([1, n], TAG_AB, dtype) if has_bias else None
        post = _epilogue(dst, residual, act, alpha, beta)
        return _matmul_pd(src, w_any, bias, dst, post, f"matmul ({m}x{k} @ {k}x{n})"), (src, dst, w_any, bias), post

    @classmethod
    def impl_for(cls, m: int, k: int, n: int) -> str:
        """The implementation oneDNN picks for an (m, k) @ (k, n) product with a bias
        (descriptor only)."""
        pd, _, _ = cls._desc(m, k, n, True, False, 0, 0.0, 0.0)
        try:
            return _impl_name(pd)
        finally:
            _lib.dnnl_primitive_desc_destroy(pd)

    @property
    def impl(self) -> str:
        return self.prim.impl

    def describe(self) -> str:
        m, k, n = self.shape
        dt = "bfloat16 " if self.weight.dtype == _dt.bfloat16 else ""
        return (
            f"oneDNN {self.impl} {dt}matmul {m}x{k} @ {k}x{n}, B reordered at prepare"
            + (", bias" if self.has_bias else "")
            + "".join(f", {p} post-op" for p in self.post)
        )

    _ptrs, __call__, bind = ConvPrimitive._ptrs, ConvPrimitive.__call__, ConvPrimitive.bind
    checked = l1 = None  # ConvPrimitive's IEEE bound check and bounds: a matmul runs such activations after it


class BatchMatMulPrimitive:
    """``Y[i] = A[i] @ W[i]`` for a batch of row-major ``A`` (batch, M, K) and ``Y`` (batch, M, N)
    with a constant ``W`` (batch, K, N), or (``transposed``) W given as (batch, N, K): reordered
    here, once, into the matmul's own layout. One oneDNN batched matmul (brgemm) runs the whole
    batch: Winograd's 36 point GEMMs (:mod:`.winograd_blocked`). (A tile-major A, (M, batch, K),
    described by strides, makes oneDNN fall back from brgemm to its plain GEMM: 1.2-1.6x slower.)"""

    def __init__(self, m: int, w, *, transposed: bool = False, source: tuple | None = None):
        """``source`` = (array, name, (shape, dtype)): ``w`` is a function computing W from that
        array, called only if no primitive holds a copy derived from it by ``name`` (see
        :func:`_reordered_weight`), W's shape and dtype given here."""
        if source is None:
            w = _weight_array(w)
            shape, dtype = w.shape, w.dtype
        else:
            shape, dtype = source[2][0], np.dtype(source[2][1])
        if len(shape) != 3:
            raise OneDnnError(f"batched matmul: W must be 3-D (batch, K, N), got shape {tuple(shape)}")
        batch, n, k = shape if transposed else (shape[0], shape[2], shape[1])
        if unavailable() is not None:
            raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
        src, dst = _Md([batch, m, k], TAG_ABC, dtype), _Md([batch, m, n], TAG_ABC, dtype)
        w_any = _Md([batch, k, n], TAG_ANY, dtype)
        pd = _matmul_pd(src, w_any, None, dst, [], f"batched matmul ({batch} x {m}x{k} @ {k}x{n})")
        self._w = _reordered_weight(
            pd, _Md([batch, k, n], TAG_ACB if transposed else TAG_ABC, dtype), w, source and source[:2]
        )
        self.weight = self._w.weight
        self.prim = Primitive(pd, _weighted_args(pd, src, None, False, dst), keep=(src, dst, w_any))
        self.shape = (batch, m, k, n)

    @property
    def impl(self) -> str:
        return self.prim.impl

    def __call__(self, a: np.ndarray, y: np.ndarray) -> None:
        self.prim.run(a.ctypes.data, self.weight.ctypes.data, y.ctypes.data)

    def bind(self, a: np.ndarray, y: np.ndarray):
        """``lambda: self(a, y)``, the addresses taken once (:meth:`Primitive.bind`)."""
        return self.prim.bind((a.ctypes.data, self.weight.ctypes.data, y.ctypes.data), keep=(a, y, self._w))


#: most primitives :func:`wt_matmul` keeps (least recently used dropped first); each costs
#: ~0.6-1.1 ms to create and a few KB of JIT code
WT_CACHE_SIZE = 128
_wt_cache: OrderedDict[tuple, Primitive] = OrderedDict()
_wt_lock = threading.Lock()


def _kept(cache: OrderedDict, key: tuple, make, size: int):
    """``cache[key]``, made by ``make()`` on a miss (outside the lock: building a primitive is slow) and
    kept with at most ``size`` entries, the least recently used dropped first."""
    with _wt_lock:
        prim = cache.get(key)
        if prim is not None:
            cache.move_to_end(key)
            return prim
    prim = make()
    with _wt_lock:
        prim = cache.setdefault(key, prim)
        while len(cache) > size:
            cache.popitem(last=False)
    return prim


def wt_matmul(m: int, k: int, n: int, accumulate: bool = False, dtype=np.float32) -> Primitive:
    """oneDNN's matmul ``Y = X @ W.T`` (``Y += X @ W.T`` with ``accumulate``: a sum post-op)
    for row-major ``X`` (m, k), ``W`` (n, k) in ``dtype`` (float32, or bfloat16: a bf16 model's
    weights, float32 accumulation) and float32 ``Y`` (m, n): ``run(x_ptr, w_ptr, y_ptr)``. W is
    read in place as a transposed operand (no reordered copy), so one primitive serves every
    weight of that shape; primitives are kept per (m, k, n, accumulate, dtype), up to
    ``WT_CACHE_SIZE``. The LLaMA decoder's projections use it (:mod:`opsnn.llm.decoder`)."""
    key = (int(m), int(k), int(n), bool(accumulate), np.dtype(dtype).name)

    def make():
        if unavailable() is not None:
            raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
        src, w, dst = _Md([m, k], TAG_AB, dtype), _Md([k, n], TAG_BA, dtype), _Md([m, n], TAG_AB)
        pd = _matmul_pd(src, w, None, dst, [("sum",)] if accumulate else [], f"matmul ({m}x{k} @ ({n}x{k}).T)")
        return Primitive(pd, [(_ARG_SRC, src.h), (_ARG_WEIGHTS, w.h), (_ARG_DST, dst.h)], keep=(src, w, dst))

    return _kept(_wt_cache, key, make, WT_CACHE_SIZE)


# -- convolution backward (training): data and weight gradients on plain user tensors ------------------
_FORWARD_TRAINING = 64
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS = 129, 145, 161
_QUERY_DIFF_SRC_MD, _QUERY_DIFF_WEIGHTS_MD, _QUERY_DIFF_DST_MD = 130, 132, 134


#: the layouts a convolution on plain user tensors asks oneDNN for: of its choosing, the plain ones, or
#: nhwc activations with weights of its choosing (its brgemm convolutions); the edges reorder the rest
CONV_FORMATS = ("any", "plain", "nhwc")


def _format_tags(formats: str, ndims: int, w_ndims: int) -> tuple:
    """(X / dX, W / dW, Y / dY) format tags of a convolution over ``ndims``-D activations and a
    ``w_ndims``-D weight (one more with groups) asked in ``formats`` (:data:`CONV_FORMATS`)."""
    if formats == "any":
        return TAG_ANY, TAG_ANY, TAG_ANY
    if formats == "plain":
        return _plain_tag(ndims), _plain_tag(w_ndims), _plain_tag(ndims)
    if formats == "nhwc" and ndims == 4:
        return TAG_BLOCKED[0], TAG_ANY, TAG_BLOCKED[0]
    raise OneDnnError(f"convolution formats must be one of {CONV_FORMATS} (nhwc: 2-D only), got {formats!r}")


def _plain_tag(ndims: int) -> int:
    """oneDNN's dense row-major tag for ``ndims`` dims (``abc...``: NCW/NCHW/NCDHW, OIHW, GOIHW)."""
    return ndims + 1


def _cloned_md(h) -> _Md:
    """An owned copy of a memory descriptor a primitive descriptor owns."""
    md = _Md.__new__(_Md)
    md.h = _vp()
    _check(_lib.dnnl_memory_desc_clone(C.byref(md.h), h), "memory descriptor clone")
    return md


def _reorder_primitive(src: _Md, dst: _Md) -> Primitive:
    rpd, attr = _vp(), _new_attr()
    status = _lib.dnnl_reorder_primitive_desc_create(C.byref(rpd), src.h, _engine, dst.h, _engine, attr)
    _lib.dnnl_primitive_attr_destroy(attr)
    _check(status, "reorder descriptor")
    return Primitive(rpd, [(_ARG_SRC, src.h), (_ARG_DST, dst.h)], keep=(src, dst))


def _conv_backward_desc(kind: str, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats):
    """(backward primitive descriptor, forward hint descriptor, (src, weights, dst) descriptors)
    of a convolution's data (``kind`` 'data') or weight ('weights') gradient, the tensors asked in
    ``formats`` (:data:`CONV_FORMATS`)."""
    if unavailable() is not None:
        raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
    nd = len(x_shape) - 2
    w_dims = list(w_shape) if group == 1 else [group, w_shape[0] // group] + list(w_shape[1:])
    x_tag, w_tag, y_tag = _format_tags(formats, len(x_shape), len(w_dims))
    src = _Md(x_shape, x_tag, dtype)
    wts = _Md(w_dims, w_tag, dtype)
    dst = _Md(y_shape, y_tag, dtype)
    st, dil = _Dims(*strides), _Dims(*(int(d) - 1 for d in dilations))
    pl, pr = _Dims(*pads[:nd]), _Dims(*pads[nd:])
    what = f"convolution {kind} gradient (x {tuple(x_shape)}, w {tuple(w_shape)}, y {tuple(y_shape)}, group {group})"
    hint, attr = _vp(), _new_attr()
    status = _lib.dnnl_convolution_forward_primitive_desc_create(
        C.byref(hint), _engine, _FORWARD_TRAINING, _CONV_DIRECT, src.h, wts.h, None, dst.h, st, dil, pl, pr, attr
    )
    if status != 0:
        _lib.dnnl_primitive_attr_destroy(attr)
        _check(status, f"{what}: forward hint descriptor")
    pd = _vp()
    if kind == "data":
        status = _lib.dnnl_convolution_backward_data_primitive_desc_create(
            C.byref(pd), _engine, _CONV_DIRECT, src.h, wts.h, dst.h, st, dil, pl, pr, hint, attr
        )
    else:
        status = _lib.dnnl_convolution_backward_weights_primitive_desc_create(
            C.byref(pd), _engine, _CONV_DIRECT, src.h, wts.h, None, dst.h, st, dil, pl, pr, hint, attr
        )
    _lib.dnnl_primitive_attr_destroy(attr)
    if status != 0:
        _lib.dnnl_primitive_desc_destroy(hint)
        _check(status, f"{what}: descriptor")
    return pd, hint, (src, wts, dst), w_dims


def conv_backward_impl(kind: str, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats) -> str:
    """The implementation oneDNN picks for this gradient asked in ``formats`` (descriptors only, no JIT code)."""
    pd, hint, _, _ = _conv_backward_desc(
        kind, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats
    )
    try:
        return _impl_name(pd)
    finally:
        _lib.dnnl_primitive_desc_destroy(pd)
        _lib.dnnl_primitive_desc_destroy(hint)


def _plain_edges(pd, specs) -> tuple:
    """For each (plain descriptor, query, argument id, is_output) of primitive ``pd``: the layout it
    chose (an owned copy, the argument's descriptor) and, where that is not the plain one, a reorder
    from (inputs) or to (the output) the plain layout through a buffer at a byte offset of the
    caller's workspace. Returns (args, descriptors to keep, [(reorder or None, offset)], bytes)."""
    args, keep, edges, ws = [], [], [], 0
    for plain, query, arg, is_out in specs:
        chosen = _cloned_md(_vp(_lib.dnnl_primitive_desc_query_md(pd, query, 0)))
        keep += [chosen, plain]
        args.append((arg, chosen.h))
        if _lib.dnnl_memory_desc_equal(chosen.h, plain.h):
            edges.append((None, 0))
            continue
        edges.append((_reorder_primitive(chosen, plain) if is_out else _reorder_primitive(plain, chosen), ws))
        ws += -(-int(_lib.dnnl_memory_desc_get_size(chosen.h)) // 64) * 64
    return args, keep, edges, ws


def _run_with_edges(prim: Primitive, edges: list, ins: tuple, passed: tuple, out: np.ndarray, ws) -> None:
    """Reorder ``ins`` into their buffers where ``edges`` say, run ``prim`` on them, the arrays of
    ``passed`` as they are (a bias) and the output (its buffer, reordered into ``out`` after)."""
    base = 0
    if any(r is not None for r, _ in edges):
        base = ws.ctypes.data + (-ws.ctypes.data % 64)
    ptrs = []
    for arr, (r, off) in zip(ins, edges):
        if r is None:
            ptrs.append(arr.ctypes.data)
        else:
            r.run(arr.ctypes.data, base + off)
            ptrs.append(base + off)
    ptrs += [a.ctypes.data for a in passed]
    r, off = edges[-1]
    ptrs.append(out.ctypes.data if r is None else base + off)
    prim.run(*ptrs)
    if r is not None:
        r.run(base + off, out.ctypes.data)


class ConvBackwardPrimitive:
    """One convolution gradient on plain (row-major) user tensors: ``kind`` 'data' computes
    dX (N, C, *sp) from dY and W (O, C/group, *k); 'weights' computes dW from X and dY. All float32
    or all bfloat16. ``formats``: 'any' lets the primitive choose its layouts (its blocked JIT
    kernels) and reorders each tensor whose chosen layout is not the plain one at the edges, in
    buffers carved from the caller's workspace (:attr:`workspace_bytes`); 'nhwc' asks nhwc
    activations (its brgemm code) and weights of its choosing, reordered the same way; 'plain' runs on
    the user layouts as they are. ``run(a, b, out, ws)``: (dY, W, dX) or (X, dY, dW)."""

    def __init__(
        self, kind, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats="any", compute=None
    ):
        if kind not in ("data", "weights"):
            raise OneDnnError(f"convolution backward: kind must be 'data' or 'weights', got {kind!r}")
        self.kind, self.formats, self.dtype = kind, formats, np.dtype(dtype)
        # compute="float32" on bfloat16 tensors: the float32 primitive on widened copies, the result
        # rounded once (where oneDNN's bf16 code is the slower one)
        self.widened = compute == "float32" and self.dtype == _dt.bfloat16
        if self.widened:
            dtype = np.float32
        pd, hint, (src, wts, dst), w_dims = _conv_backward_desc(
            kind, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats
        )
        self._hint = hint
        try:
            plain = {
                "src": _Md(x_shape, _plain_tag(len(x_shape)), dtype),
                "wts": _Md(w_dims, _plain_tag(len(w_dims)), dtype),
                "dst": _Md(y_shape, _plain_tag(len(y_shape)), dtype),
            }
            if kind == "data":
                queries = [("dst", _QUERY_DIFF_DST_MD, _ARG_DIFF_DST), ("wts", _QUERY_WEIGHTS_MD, _ARG_WEIGHTS)]
                out = ("src", _QUERY_DIFF_SRC_MD, _ARG_DIFF_SRC)
            else:
                queries = [("src", _QUERY_SRC_MD, _ARG_SRC), ("dst", _QUERY_DIFF_DST_MD, _ARG_DIFF_DST)]
                out = ("wts", _QUERY_DIFF_WEIGHTS_MD, _ARG_DIFF_WEIGHTS)
            edges = [(plain[name], query, arg, (name, query, arg) == out) for name, query, arg in queries + [out]]
            args, keep, self._edges, ws = _plain_edges(pd, edges)
            keep += [src, wts, dst]
            self.prim = Primitive(pd, args, keep=keep)
        except BaseException:
            _lib.dnnl_primitive_desc_destroy(pd)
            raise
        self._prim_ws = ws + 64 if ws else 0
        self._wide = []
        if self.widened:  # float32 copies of the two inputs and the output, after the primitive's own
            a_shape, b_shape, o_shape = (y_shape, w_dims, x_shape) if kind == "data" else (x_shape, y_shape, w_dims)
            off = -(-self._prim_ws // 64) * 64
            for shape in (a_shape, b_shape, o_shape):
                n = int(np.prod(shape))
                self._wide.append((off, n))
                off += -(-4 * n // 64) * 64
            self.workspace_bytes = off
        else:
            self.workspace_bytes = self._prim_ws
        self.reorders = sum(r is not None for r, _ in self._edges)

    @property
    def impl(self) -> str:
        return self.prim.impl

    def describe(self) -> str:
        dt = "bfloat16 " if self.dtype == _dt.bfloat16 else ""
        if self.widened:
            dt = "float32 (on widened bfloat16, the result rounded once) "
        what = "dX from dY and W" if self.kind == "data" else "dW from X and dY"
        edges = (
            f"{self.reorders} reorder(s) at the edges to and from its chosen layouts"
            if self.reorders
            else "on the plain layouts as they are"
        )
        return f"oneDNN {self.impl} {dt}convolution backward ({what}), {edges}"

    def run(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, ws: np.ndarray | None) -> None:
        if not self.widened:
            _run_with_edges(self.prim, self._edges, (a, b), (), out, ws)
            return
        wide = []
        for arr, (off, n) in zip((a, b, out), self._wide):
            u = ws[off : off + 4 * n].view(np.uint32)
            wide.append(u)
            if arr is not out:
                bf16_to_f32(np.ascontiguousarray(arr).reshape(-1).view(np.uint16), u)
        fa, fb, fo = (u.view(np.float32) for u in wide)
        _run_with_edges(self.prim, self._edges, (fa, fb), (), fo, ws[: self._prim_ws] if self._prim_ws else None)
        f32_to_bf16(fo, wide[2], out.reshape(-1).view(np.uint16))

    def __del__(self):
        if _lib is not None and getattr(self, "_hint", None):
            _lib.dnnl_primitive_desc_destroy(self._hint)


#: most backward primitives :func:`conv_backward` keeps (least recently used dropped first)
BACKWARD_CACHE_SIZE = 256
_bwd_cache: OrderedDict[tuple, ConvBackwardPrimitive] = OrderedDict()


def conv_backward(kind, x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype, formats="any", compute=None):
    """A :class:`ConvBackwardPrimitive`, built once per (kind, shapes, attributes, dtype, formats):
    the weights change every training step, so nothing in it depends on their values and every
    executor of that workload shares it (threads included: :class:`Primitive` keeps its memory
    objects per thread and the reorder buffers are the caller's workspace)."""
    key = (
        kind,
        tuple(int(v) for v in x_shape),
        tuple(int(v) for v in w_shape),
        tuple(int(v) for v in y_shape),
        tuple(int(v) for v in strides),
        tuple(int(v) for v in pads),
        tuple(int(v) for v in dilations),
        int(group),
        np.dtype(dtype).name,
        formats,
        compute,
    )
    make = lambda: ConvBackwardPrimitive(kind, *key[1:8], dtype, formats=formats, compute=compute)  # noqa: E731
    return _kept(_bwd_cache, key, make, BACKWARD_CACHE_SIZE)


def _plain_conv_desc(
    x_shape, w_shape, y_shape, strides, pads, dilations, group, has_bias, formats, dtype=np.float32, bias_dtype=None
):
    """A forward convolution's descriptor for plain user tensors: X, W and Y in ``dtype`` (float32,
    or bfloat16: float32 accumulation, Y rounded once) asked for in ``formats`` (:data:`CONV_FORMATS`),
    the bias plain in ``bias_dtype`` (``dtype`` if None); no post-ops (IEEE: NaN and Inf stay)."""
    if unavailable() is not None:
        raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
    nd = len(x_shape) - 2
    w_dims = list(w_shape) if group == 1 else [group, w_shape[0] // group] + list(w_shape[1:])
    x_tag, w_tag, y_tag = _format_tags(formats, len(x_shape), len(w_dims))
    src = _Md(x_shape, x_tag, dtype)
    wts = _Md(w_dims, w_tag, dtype)
    dst = _Md(y_shape, y_tag, dtype)
    bias = _Md([w_shape[0]], TAG_A, dtype if bias_dtype is None else bias_dtype) if has_bias else None
    pd, attr = _vp(), _new_attr()
    # the training propagation kind, as torch asks, for float32 and bfloat16: oneDNN then runs its
    # blocked (nChw16c) JIT kernels, where the inference kind picks brgconv on NHWC with dearer
    # reorders at the edges (bf16 weights into AcdB32a2b cost more than the 2x2-plane conv itself)
    prop = _FORWARD_TRAINING
    status = _lib.dnnl_convolution_forward_primitive_desc_create(
        C.byref(pd),
        _engine,
        prop,
        _CONV_DIRECT,
        src.h,
        wts.h,
        bias.h if bias else None,
        dst.h,
        _Dims(*strides),
        _Dims(*(int(d) - 1 for d in dilations)),
        _Dims(*pads[:nd]),
        _Dims(*pads[nd:]),
        attr,
    )
    _lib.dnnl_primitive_attr_destroy(attr)
    _check(status, f"convolution descriptor (x {tuple(x_shape)}, w {tuple(w_shape)}, group {group}, plain edges)")
    return pd, (src, wts, dst, bias), w_dims


def plain_conv_impl(x_shape, w_shape, y_shape, strides, pads, dilations, group, dtype=np.float32, formats="any") -> str:
    """The implementation oneDNN picks for a float32 (bfloat16) convolution of plain tensors asked in
    ``formats`` (descriptor only)."""
    pd, _, _ = _plain_conv_desc(x_shape, w_shape, y_shape, strides, pads, dilations, group, False, formats, dtype)
    try:
        return _impl_name(pd)
    finally:
        _lib.dnnl_primitive_desc_destroy(pd)


class PlainConvPrimitive:
    """``Y = conv(X, W) + B`` for plain NCHW (NCW, NCDHW) ``X``, ``W`` (O, C/group, k...) and ``Y``
    all float32 or all bfloat16 (``dtype``; bf16: native bf16 products, float32 accumulation, Y
    rounded once), ``B`` in ``bias_dtype``: oneDNN's forward primitive on layouts of its choosing
    (its blocked JIT kernels; ``formats`` 'nhwc': nhwc activations, its brgemm code), X and W reordered
    into them and Y out of them at the edges, in buffers carved from the caller's workspace. W is read
    per call (a training step changes it), so one primitive serves every weight of its shape. No
    post-ops: NaN and Inf propagate as in a direct convolution."""

    def __init__(
        self,
        x_shape,
        w_shape,
        y_shape,
        strides,
        pads,
        dilations,
        group,
        has_bias,
        dtype=np.float32,
        bias_dtype=None,
        formats="any",
    ):
        self.dtype, self.formats = np.dtype(dtype), formats
        pd, (src, wts, dst, bias), w_dims = _plain_conv_desc(
            x_shape, w_shape, y_shape, strides, pads, dilations, group, has_bias, formats, dtype, bias_dtype
        )
        try:
            plain = [_Md(x_shape, _plain_tag(len(x_shape)), dtype), _Md(w_dims, _plain_tag(len(w_dims)), dtype)]
            plain.append(_Md(y_shape, _plain_tag(len(y_shape)), dtype))
            specs = [
                (plain[0], _QUERY_SRC_MD, _ARG_SRC, False),
                (plain[1], _QUERY_WEIGHTS_MD, _ARG_WEIGHTS, False),
                (plain[2], _QUERY_DST_MD, _ARG_DST, True),
            ]
            args, keep, self._edges, ws = _plain_edges(pd, specs)
            if bias is not None:  # run()'s order: X, W, B, Y
                args.insert(2, (_ARG_BIAS, bias.h))
            self.prim = Primitive(pd, args, keep=keep + [src, wts, dst, bias])
        except BaseException:
            _lib.dnnl_primitive_desc_destroy(pd)
            raise
        self.has_bias = has_bias
        self.workspace_bytes = ws + 64 if ws else 0
        self.reorders = sum(r is not None for r, _ in self._edges)

    @property
    def impl(self) -> str:
        return self.prim.impl

    def describe(self) -> str:
        dt = "bfloat16 " if self.dtype == _dt.bfloat16 else ""
        where = "nhwc and its chosen weight layout" if self.formats == "nhwc" else "its chosen layouts"
        return (
            f"oneDNN {self.impl} {dt}convolution on plain tensors, {self.reorders} reorder(s) at the edges "
            f"to and from {where}, no post-ops"
        )

    def run(self, x: np.ndarray, w: np.ndarray, b, y: np.ndarray, ws) -> None:
        _run_with_edges(self.prim, self._edges, (x, w), (b,) if self.has_bias else (), y, ws)


_plain_cache: OrderedDict[tuple, PlainConvPrimitive] = OrderedDict()


def plain_conv(
    x_shape,
    w_shape,
    y_shape,
    strides,
    pads,
    dilations,
    group,
    has_bias,
    dtype=np.float32,
    bias_dtype=None,
    formats="any",
) -> PlainConvPrimitive:
    """A :class:`PlainConvPrimitive`, built once per (shapes, attributes, bias, dtypes, formats), up to
    ``BACKWARD_CACHE_SIZE`` of them (least recently used dropped first)."""
    key = tuple(tuple(int(v) for v in a) for a in (x_shape, w_shape, y_shape, strides, pads, dilations))
    bias_dtype = np.dtype(dtype if bias_dtype is None else bias_dtype)
    key += (int(group), bool(has_bias), np.dtype(dtype), bias_dtype, formats)
    return _kept(_plain_cache, key, lambda: PlainConvPrimitive(*key), BACKWARD_CACHE_SIZE)


_rt_cache: OrderedDict[tuple, RuntimeMatMul] = OrderedDict()


class RuntimeMatMul:
    """``Y[i] = op(A[i]) @ op(B[i]) (+ bias)`` with both operands given at run time in plain
    row-major layouts (``trans_a`` / ``trans_b``: the operand is stored transposed, (K, M) / (N, K),
    and read as such, no copy): oneDNN's matmul (brgemm; native bf16 with AVX512-BF16 or AMX) for
    a ``batch`` of (m, k) @ (k, n) products (bfloat16: float32 accumulation, one rounding), ``bias`` (N,)
    in ``bias_dtype``. Eager autocast products and the backward products
    of a bfloat16 forward have no constant weight to reorder; this reads them where they are.
    ``run(a, b, bias_or_None, y)``; :func:`runtime_matmul` keeps one per shape."""

    def __init__(self, batch, m, k, n, trans_a, trans_b, bias_dtype, dtype):
        if unavailable() is not None:
            raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
        three = batch > 1
        lead = [batch] if three else []
        plain, flipped = (TAG_ABC, TAG_ACB) if three else (TAG_AB, TAG_BA)
        src = _Md(lead + [m, k], flipped if trans_a else plain, dtype)
        w = _Md(lead + [k, n], flipped if trans_b else plain, dtype)
        dst = _Md(lead + [m, n], plain, dtype)
        bias = None if bias_dtype is None else _Md(([1] if three else []) + [1, n], plain, bias_dtype)
        pd = _matmul_pd(src, w, bias, dst, [], f"matmul ({batch} x {m}x{k} @ {k}x{n}, runtime operands)")
        args = [(_ARG_SRC, src.h), (_ARG_WEIGHTS, w.h)] + ([(_ARG_BIAS, bias.h)] if bias else []) + [(_ARG_DST, dst.h)]
        self.prim = Primitive(pd, args, keep=(src, w, bias, dst))
        self.shape = (batch, m, k, n)
        self.trans = (bool(trans_a), bool(trans_b))
        self.has_bias = bias is not None

    @property
    def impl(self) -> str:
        return self.prim.impl

    def _ptrs(self, a, b, bias, y) -> tuple:
        return (a.ctypes.data, b.ctypes.data) + ((bias.ctypes.data,) if self.has_bias else ()) + (y.ctypes.data,)

    def run(self, a: np.ndarray, b: np.ndarray, bias, y: np.ndarray) -> None:
        self.prim.run(*self._ptrs(a, b, bias, y))

    def bind(self, a: np.ndarray, b: np.ndarray, bias, y: np.ndarray):
        """``lambda: self.run(a, b, bias, y)``, the addresses taken once."""
        return self.prim.bind(self._ptrs(a, b, bias, y), keep=(a, b, bias, y))

    def describe(self) -> str:
        batch, m, k, n = self.shape
        ta, tb = self.trans
        return (
            f"oneDNN {self.impl} matmul {f'{batch} x ' if batch > 1 else ''}{m}x{k} @ {k}x{n} on runtime operands"
            + (" (A read transposed)" if ta else "")
            + (" (B read transposed)" if tb else "")
            + (", bias" if self.has_bias else "")
        )


def runtime_matmul(
    batch: int,
    m: int,
    k: int,
    n: int,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    bias_dtype=None,
    dtype=_dt.bfloat16,
) -> RuntimeMatMul:
    """The :class:`RuntimeMatMul` for this shape (made once, kept up to ``WT_CACHE_SIZE``)."""
    bias = None if bias_dtype is None else np.dtype(bias_dtype)
    key = (int(batch), int(m), int(k), int(n), bool(trans_a), bool(trans_b), bias, np.dtype(dtype))
    return _kept(_rt_cache, key, lambda: RuntimeMatMul(*key), WT_CACHE_SIZE)


def _layout(x: np.ndarray) -> tuple:
    return tuple(x.shape), tuple(s // x.itemsize for s in x.strides), x.dtype.name


class StridedMatMul:
    """``Y[..] = A[..] @ B[..]`` over N-D array views of any (non-negative) strides, the leading dims a
    batch equal in all three, each matrix with a unit stride along one of its two dims: oneDNN's
    matmul reads and writes the views where they are, so an attention head of a (B, S, H*D)
    activation needs no contiguous copy. ``run(a, b, y)``; :func:`strided_matmul` keeps one per layout."""

    def __init__(self, a_layout: tuple, b_layout: tuple, y_layout: tuple):
        if unavailable() is not None:
            raise OneDnnError(f"oneDNN is unavailable: {unavailable()}")
        src, w, dst = (_StridedMd(shape, strides, _dt.get(dt)) for shape, strides, dt in (a_layout, b_layout, y_layout))
        pd = _matmul_pd(src, w, None, dst, [], f"matmul {a_layout[0]} @ {b_layout[0]} (strided operands)")
        self.prim = Primitive(pd, [(_ARG_SRC, src.h), (_ARG_WEIGHTS, w.h), (_ARG_DST, dst.h)], keep=(src, w, dst))
        self.layouts = (a_layout, b_layout, y_layout)

    @property
    def impl(self) -> str:
        return self.prim.impl

    def run(self, a: np.ndarray, b: np.ndarray, y: np.ndarray) -> None:
        self.prim.run(a.ctypes.data, b.ctypes.data, y.ctypes.data)


def strided_matmul(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> StridedMatMul:
    """The :class:`StridedMatMul` for the layouts of these views (made once, kept up to ``WT_CACHE_SIZE``)."""
    key = ("strided", _layout(a), _layout(b), _layout(y))
    return _kept(_rt_cache, key, lambda: StridedMatMul(*key[1:]), WT_CACHE_SIZE)
