"""The kernel cache is keyed by content: a copied tree reuses it, a changed dependency or another
CPU target never loads a stale kernel, and compiling says so on stderr (runtime/kernel_cache.py)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

HELPERS = """
import numba as nb

SCALE = {scale}


@nb.njit(cache=True)
def scaled(x):
    return x * SCALE
"""

KERNEL = """
import numba as nb

from .helpers import scaled


@nb.njit(cache=True)
def total(a):
    s = 0.0
    for v in a:
        s += scaled(v)
    return s
"""

# a fresh process: the tree under argv[1] is in the locator's scope, as opsnn's own package is
# (kernel_cache.py imports nothing from opsnn: loaded alone, the process skips opsnn's import)
RUNNER_HEAD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("kernel_cache", sys.argv[2])
kernel_cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_cache)
kernel_cache.PACKAGE_DIRS.append(sys.argv[1])  # before install(), which notes the sources in scope
kernel_cache.install()
sys.path.insert(0, sys.argv[1])
"""
RUNNER = (
    RUNNER_HEAD
    + """import numpy as np
from mini import kernel
r = kernel.total(np.arange(5.0))
s = kernel.total.stats
print(json.dumps({"result": r, "hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "path": kernel.total._cache.cache_path}))
"""
)


def _tree(root, scale):
    pkg = os.path.join(root, "mini")
    os.makedirs(pkg)
    for name, text in (("__init__.py", ""), ("helpers.py", HELPERS.format(scale=scale)), ("kernel.py", KERNEL)):
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)


def _run(tmp_path, tree, cache, **env):
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    e = dict(os.environ, PYTHONPATH=SRC, OPSNN_KERNEL_CACHE_DIR=str(cache), OPSNN_COMPILE_PROGRESS="1", **env)
    for k in ("NUMBA_CACHE_DIR", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_DISABLE_JIT"):
        if k not in env:
            e.pop(k, None)
    module = os.path.join(SRC, "opsnn", "runtime", "kernel_cache.py")
    out = subprocess.run(
        [sys.executable, str(runner), str(tree), module],
        check=False,
        env=e,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["stderr"] = out.stderr
    return res


def test_copied_tree_hits_changed_dependency_or_cpu_misses(tmp_path):
    cache = tmp_path / "cache"
    one, two = tmp_path / "one", tmp_path / "two"
    _tree(one, 2.0)
    expected = 2.0 * np.arange(5.0).sum()  # oracle: numpy

    first = _run(tmp_path, one, cache)
    assert (first["misses"], first["hits"]) == (1, 0)
    assert first["result"] == expected
    # compiling says so in one line (stderr is not a terminal here)
    assert sum("compiling kernels" in line for line in first["stderr"].splitlines()) == 1, first["stderr"]
    assert first["path"].startswith(str(cache))

    shutil.copytree(one, two)  # another path, new file times, the same content: the cache serves it
    copied = _run(tmp_path, two, cache)
    assert (copied["misses"], copied["hits"]) == (0, 1)
    assert copied["result"] == expected
    assert "compiling kernels" not in copied["stderr"]

    # a constant in another module changes: the caller that inlines it must not come from the cache
    (two / "mini" / "helpers.py").write_text(HELPERS.format(scale=3.0))
    changed = _run(tmp_path, two, cache)
    assert (changed["misses"], changed["hits"]) == (1, 0)
    assert changed["result"] == 3.0 * np.arange(5.0).sum()

    # the unchanged tree still hits its own entry (the two versions do not evict each other)
    again = _run(tmp_path, one, cache)
    assert (again["misses"], again["hits"]) == (0, 1) and again["result"] == expected

    # another target CPU compiles anew, into its own folder
    generic = _run(tmp_path, one, cache, NUMBA_CPU_NAME="generic")
    assert (generic["misses"], generic["hits"]) == (1, 0)
    assert generic["path"] != first["path"] and generic["result"] == expected

    # the host CPU with fewer features (what the AVX2 cap sets on an AVX-512 machine, here AVX2
    # and everything above it turned off, so it differs on every AVX2 CPU) is another target too
    import llvmlite.binding as ll
    from numba.core.codegen import get_host_cpu_features

    feats = get_host_cpu_features().split(",")
    capped = ",".join("-" + f[1:] if f.startswith(("+avx2", "+avx512")) else f for f in feats)
    if capped != ",".join(feats):
        fewer = _run(tmp_path, one, cache, NUMBA_CPU_NAME=ll.get_host_cpu_name(), NUMBA_CPU_FEATURES=capped)
        assert (fewer["misses"], fewer["hits"]) == (1, 0)
        assert fewer["path"] not in (first["path"], generic["path"]) and fewer["result"] == expected


LAZY = """
import numba as nb

from . import helpers


def make():  # a kernel made on first use (as the fused epilogues are): decorated long after import
    def lazy_total(a):
        s = 0.0
        for v in a:
            s += helpers.scaled(v)
        return s

    return nb.njit(cache=True)(lazy_total)
"""

# argv[3]: a new helpers.py written after the import, before the lazy kernel is made (an upgrade under
# a running process), or "" to leave the tree alone
LAZY_RUNNER = (
    RUNNER_HEAD
    + """import os, time
import numpy as np
from mini import lazy
if sys.argv[3]:
    path = os.path.join(sys.argv[1], "mini", "helpers.py")
    time.sleep(0.01)  # another mtime on coarse clocks too
    with open(path, "w") as f:
        f.write(sys.argv[3])
k = lazy.make()
r = k(np.arange(5.0))
print(json.dumps({"result": r, "hits": sum(k.stats.cache_hits.values()), "misses": sum(k.stats.cache_misses.values())}))
"""
)


def test_a_kernel_made_after_its_sources_changed_under_the_process_is_not_saved(tmp_path):
    """A process that outlives an upgrade still runs the old code; a kernel it makes lazily afterwards
    would have been saved under the new sources' stamp and served, stale, to every new process."""
    tree, cache = tmp_path / "tree", tmp_path / "cache"
    _tree(tree, 2.0)
    (tree / "mini" / "lazy.py").write_text(LAZY)
    runner = tmp_path / "lazy_runner.py"
    runner.write_text(LAZY_RUNNER)
    module = os.path.join(SRC, "opsnn", "runtime", "kernel_cache.py")
    env = dict(os.environ, PYTHONPATH=SRC, OPSNN_KERNEL_CACHE_DIR=str(cache))
    for k in ("NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT"):
        env.pop(k, None)
    new_helpers = HELPERS.format(scale=2.0).replace("return x * SCALE", "return x * SCALE + 1.0")

    def run(edit):
        out = subprocess.run(
            [sys.executable, str(runner), str(tree), module, edit], env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    old = run(new_helpers)  # imported the old helpers, then the file changed: old code, not saved
    assert old["result"] == 2.0 * np.arange(5.0).sum() and old["misses"] == 1
    fresh = run("")  # the new code, compiled anew (the stale entry was never written)
    assert (fresh["misses"], fresh["hits"]) == (1, 0)
    assert fresh["result"] == (2.0 * np.arange(5.0) + 1.0).sum()
    again = run("")  # and its own entry is saved and served
    assert (again["misses"], again["hits"]) == (0, 1) and again["result"] == fresh["result"]


def test_dependency_stamp_follows_callees_and_constants(tmp_path, monkeypatch):
    from opsnn.runtime import kernel_cache

    _tree(tmp_path, 2.0)
    monkeypatch.setattr(kernel_cache, "PACKAGE_DIRS", [*kernel_cache.PACKAGE_DIRS, str(tmp_path)])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OPSNN_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    import importlib

    for m in ("mini.kernel", "mini.helpers", "mini"):
        sys.modules.pop(m, None)
    kernel = importlib.import_module("mini.kernel")
    try:
        base = kernel_cache.dependency_stamp(kernel.total.py_func)
        assert kernel_cache.dependency_stamp(kernel.total.py_func) == base  # deterministic
        kernel.scaled.py_func.__globals__["SCALE"] = 4.0  # a frozen constant of the callee's module
        assert kernel_cache.dependency_stamp(kernel.total.py_func) != base
    finally:
        for m in ("mini.kernel", "mini.helpers", "mini"):
            sys.modules.pop(m, None)


def test_progress_bar_on_a_terminal():
    import io

    import numba as nb
    from numba.core import event

    from opsnn.runtime.kernel_cache import CompileProgress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    progress = CompileProgress(stream=out)
    event.register("numba:compile", progress)
    try:
        f = nb.njit(lambda x: x + 1)  # not cached: compiles here
        assert f(1) == 2
    finally:
        event.unregister("numba:compile", progress)
    progress.close()
    text = out.getvalue()
    assert "opsnn: compiling kernels" in text and progress.count == 1
    assert text.rstrip().splitlines()[-1].startswith("opsnn: compiled 1 kernel in")


def test_compile_log_writes_one_json_line_per_compile(tmp_path):
    import json

    import numba as nb
    from numba.core import event

    from opsnn.runtime.kernel_cache import CompileLog

    def inner(x):
        return x * 2

    def outer(x):
        return inner_jit(x) + 1

    inner_jit = nb.njit(inner)
    outer_jit = nb.njit(outer)
    path = tmp_path / "compiles.jsonl"
    log = CompileLog(str(path))
    event.register("numba:compile", log)
    try:
        assert outer_jit(3) == 7 and outer_jit(1.5) == 4.0  # two signatures, each pulling in inner's
    finally:
        event.unregister("numba:compile", log)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == log.rows
    mine = [r for r in rows if r["kernel"].endswith((".inner", ".outer"))]
    assert sorted((r["kernel"].rsplit(".", 1)[1], r["args"]) for r in mine) == [
        ("inner", "float64"),
        ("inner", "int64"),
        ("outer", "float64"),
        ("outer", "int64"),
    ]
    assert all(r["top"].endswith(".outer") for r in mine)  # inner compiled inside outer's compile
    for r in mine:
        assert 0 <= r["cpu_s"] <= r["cpu_incl_s"]
    # exclusive times add up to the outermost compiles' inclusive ones (rows are rounded to 0.1 ms)
    outermost = [r for r in mine if r["kernel"].endswith(".outer")]
    assert abs(sum(r["cpu_s"] for r in rows) - sum(r["cpu_incl_s"] for r in outermost)) < 1e-3 * len(rows)


def test_slice_assignment_shape_errors_stay_plain():
    # opsnn's install() swaps numba's shape-formatting error for the generic target's fixed one
    # (the formatting compiles ~40 string helpers per cold process); the check itself remains
    import numba as nb
    import pytest

    import opsnn  # noqa: F401

    def assign(a, b):
        a[1:3] = b

    kernel = nb.njit(assign)
    a = np.zeros(5)
    kernel(a, np.ones(2))
    assert a.tolist() == [0, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="^cannot assign slice from input of different size$"):
        kernel(a, np.ones(3))


def test_cache_path_names_the_cpu_target(monkeypatch):
    from numba.core import config

    from opsnn.runtime import kernel_cache

    name = "generic"
    monkeypatch.setattr(config, "CPU_NAME", name)
    monkeypatch.setattr(config, "CPU_FEATURES", "")
    assert kernel_cache.cpu_target() == (name, "")
    loc = kernel_cache.ContentCacheLocator(kernel_cache.dependency_stamp, kernel_cache.__file__)
    assert f"{os.sep}{name}-" in loc.get_cache_path()


def test_concurrent_saves_keep_each_signature(tmp_path, monkeypatch):
    """Two processes adding different signatures of one kernel at once (threads here, each with
    its own index object, both reading the index before either writes): each keeps its own code."""
    import threading

    from numba.core import caching

    from opsnn.runtime import kernel_cache

    path = str(tmp_path)
    monkeypatch.setattr(kernel_cache.ContentCacheLocator, "paths", {path})
    read = caching.IndexDataCacheFile._load_index
    both_read = threading.Barrier(2, timeout=0.5)

    def load_then_wait(self):
        overloads = read(self)
        try:
            both_read.wait()  # unlocked, both now pick data file 1
        except threading.BrokenBarrierError:  # locked: the other waits for the lock instead
            pass
        return overloads

    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", load_then_wait)
    files = [caching.IndexDataCacheFile(path, "mini.total-7", "stamp") for _ in range(2)]
    threads = [threading.Thread(target=f.save, args=(f"sig{i}", f"code{i}")) for i, f in enumerate(files)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(caching.IndexDataCacheFile, "_load_index", read)
    fresh = caching.IndexDataCacheFile(path, "mini.total-7", "stamp")
    assert (fresh.load("sig0"), fresh.load("sig1")) == ("code0", "code1")


def test_compile_log_rows_name_the_context_and_the_suite_summary_sums_them(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    import numba as nb
    from numba.core import event

    from opsnn.runtime.kernel_cache import CompileLog

    spec = importlib.util.spec_from_file_location(
        "suite_compiles", Path(__file__).resolve().parents[1] / "bench" / "suite_compiles.py"
    )
    suite_compiles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite_compiles)

    def triple(x):
        return x * 3

    path = tmp_path / "compiles.jsonl"
    log = CompileLog(str(path))
    event.register("numba:compile", log)
    try:
        monkeypatch.setenv("OPSNN_COMPILE_CONTEXT", "tests/test_a.py::test_one")
        assert nb.njit(triple)(2) == 6
        monkeypatch.delenv("OPSNN_COMPILE_CONTEXT")
        assert nb.njit(triple)(2.0) == 6.0
    finally:
        event.unregister("numba:compile", log)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    mine = [r for r in rows if r["kernel"].endswith(".triple")]
    assert [r.get("context") for r in mine] == ["tests/test_a.py::test_one", None]
    text = suite_compiles.summarize(rows, top=50)
    assert text.splitlines()[0].startswith(f"{len(rows)} compiles, {sum(r['cpu_s'] for r in rows):.1f} CPU s")
    by_file = text.split("-- by test file")[1].split("-- by test:")[0]
    assert "tests/test_a.py" in by_file and "(no test: import or collection)" in by_file
    assert "tests/test_a.py::test_one" in text.split("-- by test:")[1]


LAZY_CACHE_RUNNER = """
import gc, json
import numpy as np
import opsnn
from numba.core.registry import CPUDispatcher
from opsnn.kernels.cpu import winograd
from opsnn.runtime import kernel_cache

gc.unfreeze()  # import opsnn froze its kernels (OPSNN_GC_FREEZE): get_objects lists them again
ours = [d for d in gc.get_objects() if isinstance(d, CPUDispatcher) and isinstance(d._cache, kernel_cache._LazyFunctionCache)]
made = lambda: sorted(d.py_func.__name__ for d in ours if d._cache._real is not None)
before = made()
ok = bool(winograd._all_finite(np.ones(8, np.float32)))
s = winograd._all_finite.stats
print(json.dumps({"kernels": len(ours), "before": before, "after": made(), "ok": ok,
                  "hits": sum(s.cache_hits.values()), "misses": sum(s.cache_misses.values()),
                  "path": winograd._all_finite._cache.cache_path}))
"""


def test_import_stamps_no_kernel_and_the_first_call_makes_its_cache(tmp_path):
    """``import opsnn`` decorates every kernel but computes no cache stamp (each reads the kernel's
    sources); the first call of a kernel makes its cache, which a second process loads."""
    env = dict(os.environ, OPSNN_KERNEL_CACHE_DIR=str(tmp_path), OPSNN_TIERED="0", OPSNN_COMPILE_PROGRESS="0")
    env.pop("NUMBA_CACHE_DIR", None)
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", LAZY_CACHE_RUNNER], env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["kernels"] > 100 and first["before"] == [] and first["ok"]
    assert first["after"] == ["_all_finite"] and (first["misses"], first["hits"]) == (1, 0)
    assert first["path"].startswith(str(tmp_path))
    assert (second["misses"], second["hits"]) == (0, 1) and second["after"] == ["_all_finite"]
