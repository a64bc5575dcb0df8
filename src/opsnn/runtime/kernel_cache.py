"""Where numba keeps opsnn's compiled kernels, keyed by content, and saying so when it compiles.

numba's default cache sits beside each module and is keyed by that file alone: a reinstall or a
fresh clone of the same code starts cold, and a kernel that inlines a helper from another module
keeps the old helper after that module changes. ``ContentCacheLocator`` puts opsnn's kernels in
one user-wide folder (``$OPSNN_KERNEL_CACHE_DIR``, else ``$OPSNN_CACHE_DIR/kernels``, else
``~/.cache/opsnn/kernels``, ``$XDG_CACHE_HOME`` for ``~/.cache`` when set) under a stamp of everything the kernel's machine code depends on:

- the content of the kernel's module and of every opsnn module whose functions it calls or
  whose names it reads (transitively), never their paths or times;
- the constants numba freezes into the code (module-level numbers, strings, option dicts);
- numba's version.

A process that outlives a change of its sources (an upgrade while it runs) still runs the old code:
a kernel it first compiles after the change (one made on first use) is not saved, since its stamp would
describe the new files (``file_state``).

The folder is per numba version and CPU target (the name and features numba compiles for:
``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` when an ISA cap sets them), which numba's own index
key also holds. A changed source or constant gives another stamp and another CPU target another
entry, so a stale kernel is never loaded; moving or copying the same tree keeps the stamp. ``NUMBA_CACHE_DIR`` (numba's own
setting) still wins when set. ``install()`` runs on ``import opsnn`` before any kernel module.

Compiling a kernel on first use takes seconds; ``CompileProgress`` says so: a progress bar on a
terminal, one line on stderr otherwise (``OPSNN_COMPILE_PROGRESS=0`` silences it).
``OPSNN_COMPILE_LOG=path`` appends one JSON line per compile to ``path`` (``CompileLog``: kernel,
argument types, CPU seconds of the compiling thread with nested compiles subtracted): what a cold
start compiles and what each specialization costs, independent of the machine's load.
``OPSNN_COMPILE_CONTEXT``, when set, is written into each row as ``context`` (the test suite sets it
to the running test, and subprocesses inherit it): who paid for each compile.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys
import threading
import time
import types
from typing import ClassVar

import numba
from numba.core import caching, config, event
from numba.core.dispatcher import Dispatcher

#: source trees whose kernels the locator keeps (opsnn's own package folder)
PACKAGE_DIRS: list[str] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

_SIMPLE = (bool, int, float, complex, str, bytes, type(None))

#: ``opsnn.ops.tiering.cold_direct`` once that module is imported (on ``import opsnn``): how a
#: kernel module, below the ops layer, asks whether to run its numpy stand-in while a numba kernel
#: it calls directly compiles in the background; None: compile in the foreground
cold_direct = None


def cold(fn, args) -> bool:
    """Whether numba kernel ``fn`` on ``args`` is compiling in the background (``cold_direct``),
    so that its caller runs its numpy stand-in; False at once where ``fn`` has machine code."""
    c = cold_direct
    return c is not None and not fn.overloads and bool(c([(fn, args)]))


def cache_root() -> str:
    """The folder opsnn's compiled kernels live in (see the module docstring)."""
    explicit = os.environ.get("OPSNN_KERNEL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("OPSNN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "opsnn"
    )
    return os.path.join(base, "kernels")


def target_dir() -> str:
    """The folder of this numba version and CPU target under ``cache_root()`` (see ``cpu_target``)."""
    name, features = cpu_target()
    cpu = hashlib.sha256(f"{name}|{features}".encode()).hexdigest()[:12]
    return os.path.join(cache_root(), f"numba-{numba.__version__}", f"{name}-{cpu}")


@functools.cache
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


#: (mtime_ns, size) of each source file as this process first knew it: opsnn's own package when
#: ``install()`` runs (on ``import opsnn``), any other file at its first digest
_seen: dict[str, tuple[int, int]] = {}
#: a stamp with this prefix is never saved (nor found): the sources changed under this process
UNSAVED = "unsaved-"


def _snapshot(dirs) -> None:
    for d in dirs:
        for root, _, names in os.walk(d):
            for n in names:
                if n.endswith(".py"):
                    path = os.path.join(root, n)
                    try:
                        st = os.stat(path)
                    except OSError:
                        continue
                    _seen.setdefault(path, (st.st_mtime_ns, st.st_size))


def file_state(path: str) -> tuple[str, bool]:
    """(the digest of ``path`` on disk, whether it changed since this process first knew it: an upgrade
    or an edit while it runs, so the code in memory may not be what the digest describes), one stat."""
    st = os.stat(path)
    now = (st.st_mtime_ns, st.st_size)
    return _file_digest(path, *now), _seen.setdefault(path, now) != now


def cpu_target() -> tuple[str, str]:
    """The CPU name and features numba generates code for (its settings, else the host's)."""
    return _cpu_target(config.CPU_NAME, config.CPU_FEATURES)


@functools.cache
def _cpu_target(name: str | None, features: str | None) -> tuple[str, str]:
    import llvmlite.binding as ll
    from numba.core.codegen import get_host_cpu_features

    return name or ll.get_host_cpu_name(), features if features is not None else get_host_cpu_features()


def _in_scope(path: str | None) -> bool:
    if not path:
        return False
    path = os.path.abspath(path)
    return any(path.startswith(d + os.sep) for d in PACKAGE_DIRS)


def _constant(value):
    """A deterministic text for a value numba would freeze into code, else None."""
    if isinstance(value, _SIMPLE):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(v, _SIMPLE) for v in value):
        return repr(value)  # lists are left out: numba freezes tuples, lists are run-time state
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, _SIMPLE) for k, v in value.items()):
        return repr(sorted(value.items()))
    try:
        import numpy as np

        if isinstance(value, (np.generic, np.dtype)):
            return f"{type(value).__name__}:{value!r}"
        if isinstance(value, np.ndarray) and value.nbytes <= 1 << 20:
            return f"ndarray:{value.dtype}:{value.shape}:{hashlib.sha256(value.tobytes()).hexdigest()}"
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return None


def _names(code: types.CodeType):
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def dependency_stamp(py_func) -> str:
    """A digest of the sources and constants ``py_func``'s machine code depends on."""
    files: set[str] = set()
    consts: set[str] = set()
    seen: set = set()
    modules_seen: set[str] = set()

    def add_module_constants(module):
        if module is None or module.__name__ in modules_seen:
            return
        modules_seen.add(module.__name__)
        for k, v in vars(module).items():
            c = _constant(v)
            if c is not None and not k.startswith("__"):
                consts.add(f"{module.__name__}.{k}={c}")

    def visit_function(fn):
        code = getattr(fn, "__code__", None)
        if code is None or code in seen or not _in_scope(code.co_filename):
            return
        seen.add(code)
        files.add(code.co_filename)
        add_module_constants(sys.modules.get(fn.__module__))
        names = list(_names(code))
        namespaces = [fn.__globals__]
        for name in names:
            v = fn.__globals__.get(name)
            if isinstance(v, types.ModuleType) and _in_scope(getattr(v, "__file__", None)):
                files.add(v.__file__)
                add_module_constants(v)
                namespaces.append(vars(v))
        for ns in namespaces:
            for name in names:
                if name in ns:
                    visit_value(ns[name])
        for cell in fn.__closure__ or ():
            try:
                visit_value(cell.cell_contents)
            except ValueError:  # an empty cell
                pass

    def visit_value(v):
        inner = getattr(v, "py_func", None)  # a numba dispatcher
        if inner is not None:
            visit_function(inner)
        elif isinstance(v, types.FunctionType):
            visit_function(v)

    visit_function(py_func)
    h = hashlib.sha256()
    h.update(numba.__version__.encode())
    states = [file_state(f) for f in files]
    for d in sorted(d for d, _ in states):
        h.update(d.encode())
    for c in sorted(consts):
        h.update(c.encode())
    # a kernel first compiled after its sources changed on disk (a lazily made kernel in a process
    # that outlived an upgrade) would save old machine code under the new sources' stamp
    return (UNSAVED if any(changed for _, changed in states) else "") + h.hexdigest()


class ContentCacheLocator(caching._CacheLocator):
    """numba cache locator for opsnn's kernels: a user-wide folder, keyed by content (above)."""

    _writable: ClassVar[set] = set()
    paths: ClassVar[set] = set()  # cache folders this locator hands out (their saves are locked)

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._stamp = dependency_stamp(py_func)
        self._cache_path = os.path.join(target_dir(), py_func.__module__)
        self.paths.add(self._cache_path)

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return self._stamp

    def get_disambiguator(self):
        # the stamp in the file name: two versions of a kernel keep two entries, neither evicts the other
        return f"{self._lineno}-{self._stamp[:16]}"

    def ensure_cache_path(self):
        if self._cache_path not in self._writable:
            super().ensure_cache_path()
            self._writable.add(self._cache_path)

    @classmethod
    def from_function(cls, py_func, py_file):
        if config.CACHE_DIR or not _in_scope(py_file) or not os.path.exists(py_file):
            return None
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:  # not writable: numba's own locators decide
            return None
        return self


class CompileProgress(event.Listener):
    """Says when kernels compile: a tqdm bar on a terminal, else one line on stderr."""

    def __init__(self, stream=None):
        self.stream = stream
        self.count = 0
        self.seconds = 0.0
        self._depth = threading.local()
        self._bar = None
        self._said = False
        self._start = 0.0

    @property
    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def on_start(self, ev):
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth:
            return
        self._start = time.perf_counter()
        d = ev.data["dispatcher"]
        name = getattr(d.py_func, "__qualname__", "?")
        out = self._out
        if getattr(out, "isatty", lambda: False)():
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(
                    desc="opsnn: compiling kernels (first use; cached after)",
                    unit=" kernel",
                    file=out,
                    leave=False,
                    dynamic_ncols=True,
                )
            self._bar.set_postfix_str(name, refresh=True)
        elif not self._said:
            self._said = True
            print(
                f"opsnn: compiling kernels on first use, starting with {name} (seconds each; cached in {cache_root()})",
                file=out,
                flush=True,
            )

    def on_end(self, ev):
        depth = getattr(self._depth, "n", 0)
        if depth == 0:  # a compile that began before this listener was registered
            return
        self._depth.n = depth - 1
        if depth > 1:
            return
        self.count += 1
        self.seconds += time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.update(1)
            self._bar.clear()  # shown while a kernel compiles, off the line the program prints on

    def close(self):
        """Ends the bar with one summary line (terminal only)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            print(
                f"opsnn: compiled {self.count} kernel{'' if self.count == 1 else 's'} in {self.seconds:.1f} s "
                f"(cached in {cache_root()})",
                file=self._out,
                flush=True,
            )


class CompileLog(event.Listener):
    """Records each numba compile: ``rows`` of dicts (kernel, args, cpu_s and wall_s with nested
    compiles subtracted, cpu_incl_s, top: the outermost kernel whose compile pulled this one in,
    context: ``$OPSNN_COMPILE_CONTEXT`` when set),
    and one JSON line each to ``path`` when given. CPU time is the compiling thread's
    (``time.thread_time``): numba compiles on the calling thread, one compile at a time."""

    def __init__(self, path: str | None = None):
        self.path = path
        self.rows: list[dict] = []
        self._stack = threading.local()

    def _frames(self) -> list:
        frames = getattr(self._stack, "frames", None)
        if frames is None:
            frames = self._stack.frames = []
        return frames

    @staticmethod
    def _name(dispatcher) -> str:
        fn = dispatcher.py_func
        return f"{fn.__module__}.{fn.__qualname__}"

    def on_start(self, ev):
        frames = self._frames()
        top = frames[0][0] if frames else self._name(ev.data["dispatcher"])
        frames.append([top, time.thread_time(), time.perf_counter(), 0.0, 0.0])

    def on_end(self, ev):
        frames = self._frames()
        if not frames:  # a compile that began before this listener was registered
            return
        top, cpu0, wall0, nested_cpu, nested_wall = frames.pop()
        cpu = time.thread_time() - cpu0
        wall = time.perf_counter() - wall0
        if frames:
            frames[-1][3] += cpu
            frames[-1][4] += wall
        row = {
            "kernel": self._name(ev.data["dispatcher"]),
            "args": ", ".join(str(a) for a in ev.data["args"]),
            "cpu_s": round(cpu - nested_cpu, 4),
            "cpu_incl_s": round(cpu, 4),
            "wall_s": round(wall - nested_wall, 4),
            "top": top,
            "pid": os.getpid(),
        }
        context = os.environ.get("OPSNN_COMPILE_CONTEXT")
        if context:
            row["context"] = context
        self.rows.append(row)
        if self.path:
            with open(self.path, "a") as f:  # one short write per line: lines from processes do not interleave
                f.write(json.dumps(row) + "\n")


@contextlib.contextmanager
def _file_lock(path: str):
    try:
        import fcntl
    except ImportError:  # not POSIX: numba's own unlocked save
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


_numba_save = caching.IndexDataCacheFile.save


def _locked_save(self, key, data):
    """numba's save (read the index, pick a free data file, write both) under a lock, data first.

    Unlocked, two processes adding different signatures of one kernel at once can both pick
    data file 1 and leave an index entry pointing at the other's machine code; a shared cache
    makes that likelier. Locked, the second reads the first's entry and picks file 2."""
    if self._cache_path not in ContentCacheLocator.paths:
        return _numba_save(self, key, data)
    if str(self._source_stamp).startswith(UNSAVED):
        return None
    with _file_lock(self._index_path + ".lock"):
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            existing = set(overloads.values())
            name = next(self._data_name(i) for i in itertools.count(1) if self._data_name(i) not in existing)
        self._save_data(name, data)  # before the index: a reader never finds an entry without its data
        overloads[key] = name
        self._save_index(overloads)
    return None


class _LazyFunctionCache:
    """numba's ``FunctionCache`` of one of opsnn's kernels, made on the kernel's first compile or
    load: its locator's stamp reads the kernel's sources and constants (``dependency_stamp``, 0.1 ms
    a kernel), and ``import opsnn`` decorates ~500 kernels of which a model touches a few dozen."""

    __slots__ = ("_py_func", "_real")

    def __init__(self, py_func):
        self._py_func = py_func
        self._real = None

    def __getattr__(self, name):
        real = self._real
        if real is None:
            real = self._real = caching.FunctionCache(self._py_func)
        return getattr(real, name)


_numba_enable_caching = Dispatcher.enable_caching


def _enable_caching(self) -> None:
    """``Dispatcher.enable_caching``: opsnn's kernels get a ``_LazyFunctionCache``, others numba's."""
    if _in_scope(getattr(getattr(self.py_func, "__code__", None), "co_filename", None)):
        self._cache = _LazyFunctionCache(self.py_func)
    else:
        _numba_enable_caching(self)


def _plain_shape_errors() -> None:
    """Makes numba's slice-assignment shape error a fixed message, as on its generic target.

    On the CPU target every ``a[i:j] = b`` in a kernel links code that formats both shapes into
    the ValueError: ~40 of numba's string helpers compiled in each cold process (4 s of CPU
    before any kernel of ours) and linked into every such kernel. The check itself stays."""
    try:
        from numba.np import arrayobj

        cpu, generic = arrayobj.ol_raise_with_shape_context_cpu, arrayobj.ol_raise_with_shape_context_generic
    except (ImportError, AttributeError):  # another numba: its own messages
        return
    if cpu.__code__.co_freevars == generic.__code__.co_freevars:
        cpu.__code__ = generic.__code__


_installed = False
progress: CompileProgress | None = None
compile_log: CompileLog | None = None


def install() -> None:
    """Puts ``ContentCacheLocator`` first in numba's locators, locks saves into its folders, makes
    opsnn's kernels' caches on first use (``_LazyFunctionCache``),
    keeps numba's slice shape errors plain (``_plain_shape_errors``) and starts ``CompileProgress`` (and ``CompileLog`` when ``OPSNN_COMPILE_LOG`` names a file)."""
    global _installed, progress, compile_log
    if _installed:
        return
    _installed = True
    _snapshot(PACKAGE_DIRS)
    if ContentCacheLocator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, ContentCacheLocator)
    caching.IndexDataCacheFile.save = _locked_save
    Dispatcher.enable_caching = _enable_caching
    _plain_shape_errors()
    if os.environ.get("OPSNN_COMPILE_PROGRESS", "1") != "0":
        progress = CompileProgress()
        event.register("numba:compile", progress)
        atexit.register(progress.close)
    log_path = os.environ.get("OPSNN_COMPILE_LOG")
    if log_path:
        compile_log = CompileLog(os.path.abspath(log_path))
        event.register("numba:compile", compile_log)
