"""The layer contract (docs/architecture.md): every import in ``src/opsnn`` points down or sideways.

Each top-level module or package of opsnn belongs to one layer in ``LAYER_OF``; a module may
import modules of its own layer and of the layers below it, never of a layer above. Imports
inside functions count too (a lazy import is still a dependency), and so do ``__import__`` /
``importlib.import_module`` calls with a literal name. Outside ``kernels``, nobody reaches a
kernel module's private names (``_x``): what another layer needs from a kernel module is a
public kernel function.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "opsnn"

#: bottom to top; a layer may import its own and every layer before it in this tuple
LAYERS = ("base", "runtime", "kernels", "ops", "graph", "training", "frontends", "applications", "tools", "entry")

#: every top-level module / package of opsnn and its layer ("__init__" is the package facade)
LAYER_OF = {
    # base: leaf modules every layer may use
    "errors": "base",
    "dtypes": "base",
    "version": "base",
    "_blas_env": "base",
    # runtime: init/finalize, devices, streams, memory pool, threads, hooks
    "runtime": "runtime",
    # kernels: plain functions over arrays, per backend and family
    "kernels": "kernels",
    # ops: the op records, executors and the Tensor whose methods are ops; aclnn's two-phase API
    "ops": "ops",
    "tensor": "ops",
    "aclnn": "ops",
    # graph: IR, passes, memory plan, compiler, interpreter; graph-level facades
    "graph": "graph",
    "optimize": "graph",
    "debug": "graph",
    # training: autograd (the tape, backward), optim (optimizers, LR schedules), amp (loss scaling)
    "autograd": "training",
    "optim": "training",
    "amp": "training",
    "distributed": "training",
    # frontends: what builds or loads graphs and modules; the compile front door; user settings
    "nn": "frontends",
    "checkpoint": "frontends",
    "models": "frontends",
    "onnx": "frontends",
    "frontend": "frontends",
    "config": "frontends",
    "frontends": "frontends",
    "utils": "frontends",
    "torch_api": "frontends",
    # applications: whole jobs built on the frontends
    "llm": "applications",
    "pipeline": "applications",
    "trainer": "applications",
    # tools: observers (through runtime.hooks) and inspectors
    "tools": "tools",
    # entry: the package facade and the command line
    "__init__": "entry",
    "cli": "entry",
}
RANK = {layer: i for i, layer in enumerate(LAYERS)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def _is_module(name: str) -> bool:
    base = SRC.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.cache
def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def _unit(module: str) -> str:
    """The top-level module or package of ``opsnn`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, text: str | None = None):
    """``(line, imported module, names imported from it)`` for every import of an opsnn module
    in the file at ``path`` (or in ``text``, read as if it were that file)."""
    tree = _tree(path) if text is None else ast.parse(text, str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "opsnn" or alias.name.startswith("opsnn."):
                    yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != "opsnn" and not source.startswith("opsnn."):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if _is_module(sub):
                    yield node.lineno, sub, ()
                else:
                    yield node.lineno, source, (alias.name,)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            target = node.args[0].value
            if (
                name in ("__import__", "import_module")
                and isinstance(target, str)
                and (target == "opsnn" or target.startswith("opsnn."))
            ):
                yield node.lineno, target, ()


def _kernel_module_aliases(tree: ast.AST, package: str) -> dict:
    """Names bound in a file to kernel modules (``from ..kernels.cpu import mkl`` binds ``mkl``)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub.startswith("opsnn.kernels") and _is_module(sub):
                    bound[alias.asname or alias.name] = sub
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("opsnn.kernels") and alias.asname:
                    bound[alias.asname] = alias.name
    return bound


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


FILES = sorted(PACKAGE.rglob("*.py"))


def test_the_source_tree_is_found():
    assert PACKAGE.is_dir() and len(FILES) > 50, PACKAGE


def test_every_module_has_a_layer():
    units = {_unit(_module_name(p)) for p in FILES}
    missing = sorted(units - set(LAYER_OF))
    assert not missing, (
        f"top-level module(s) {missing} of opsnn have no layer: assign each one a layer in "
        f"LAYER_OF in tests/test_architecture.py (see docs/architecture.md)"
    )
    assert set(LAYER_OF.values()) <= set(LAYERS), sorted(set(LAYER_OF.values()) - set(LAYERS))


def test_imports_follow_the_layers():
    problems = []
    for path in FILES:
        unit = _unit(_module_name(path))
        if unit not in LAYER_OF:
            continue  # reported by test_every_module_has_a_layer
        layer = LAYER_OF[unit]
        for line, target, _ in _imports(path):
            t_unit = _unit(target)
            t_layer = LAYER_OF.get(t_unit)
            if t_layer is None:
                problems.append(
                    f"{path.relative_to(SRC.parent)}:{line} imports {target}, whose top-level module "
                    f"{t_unit!r} has no layer (assign it in LAYER_OF)"
                )
            elif RANK[t_layer] > RANK[layer]:
                problems.append(
                    f"{path.relative_to(SRC.parent)}:{line} imports {target}: layer {layer!r} "
                    f"({unit}) must not import layer {t_layer!r} ({t_unit}), which is above it"
                )
    assert not problems, (
        "imports against the layers (upper layers call lower ones; tools observe through "
        "runtime.hooks):\n" + "\n".join(problems)
    )


def test_only_kernels_use_private_kernel_names():
    problems = []
    for path in FILES:
        module = _module_name(path)
        if _unit(module) == "kernels":
            continue
        where = path.relative_to(SRC.parent)
        for line, target, names in _imports(path):
            if target.startswith("opsnn.kernels"):
                problems += [f"{where}:{line} imports {target}.{n}" for n in names if _private(n)]
        tree = _tree(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        aliases = _kernel_module_aliases(tree, package)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and _private(node.attr)
            ):
                problems.append(f"{where}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not problems, (
        "private kernel names used outside kernels (make what is needed a public kernel "
        "function):\n" + "\n".join(problems)
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from ..ops import executor\n", [(1, "opsnn.ops.executor", ())]),
        ("def f():\n    from ..tools.profiler import record\n", [(2, "opsnn.tools.profiler", ("record",))]),
        ("import opsnn\n", [(1, "opsnn", ())]),
        ("x = __import__('opsnn.tools.profiler', fromlist=['record'])\n", [(1, "opsnn.tools.profiler", ())]),
        ("from . import hooks\n", [(1, "opsnn.runtime.hooks", ())]),
    ],
)
def test_the_import_scanner_sees_lazy_relative_and_dynamic_imports(source, expected):
    """The scanner itself, on text read as if it were ``opsnn/runtime/context.py`` (relative
    imports and names that are modules resolve against the real source tree)."""
    assert list(_imports(PACKAGE / "runtime" / "context.py", source)) == expected


def test_an_upward_import_is_reported_with_file_line_and_layers():
    """The contract test's own check fails on a runtime module importing a tool, lazily."""
    path = PACKAGE / "runtime" / "context.py"
    found = [
        (line, target)
        for line, target, _ in _imports(path, "def f():\n    from ..tools import profiler\n")
        if RANK[LAYER_OF[_unit(target)]] > RANK[LAYER_OF["runtime"]]
    ]
    assert found == [(2, "opsnn.tools.profiler")]
