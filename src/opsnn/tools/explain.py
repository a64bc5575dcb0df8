"""Why each node of a graph runs the kernel it runs: ``explain_graph`` and ``opsnn explain``.

For every kernel launch of a compiled graph at the given input shapes: the chosen kernel
(and, for fused nodes, the inner Conv/MatMul kernel), why it was chosen, the plan it made
(tiles, packed weights, workspace), and every kernel that was not chosen with its reason::

    >>> import opsnn                                                  # doctest: +SKIP
    >>> print(opsnn.tools.explain.explain_graph("resnet50.onnx", {"x": (1, 3, 224, 224)}))
    graph resnet50 at x=(1, 3, 224, 224): 73 kernels (compiled)
      conv1 (opsnn::FusedConv): conv_epilogue -> Conv: conv2d_im2col
          why: highest-priority applicable kernel (priority 20)
          plan: im2col2d: column buffer 147x12544 per group, then BLAS
          not chosen: conv2d_winograd: Winograd F(4x4,3x3) needs a 3x3 kernel, stride 1, ...

Both views report the kernel-library decision (the summary at its end, the per-node view in its
header and as a ``library:`` line per node): for each MatMul, Gemm, Linear and convolution shape,
the library its GEMMs run on (MKL, OpenBLAS, oneDNN or opsnn's own kernels) and the strategy's
reason (:func:`opsnn.kernels.cpu.libraries.kernel_choice`), equal decisions grouped.

Command line (wired by ``opsnn.cli``): ``opsnn explain model.onnx --shape x=1,3,224,224``.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from collections import Counter

from ..errors import OpsnnError, ParamInvalidError
from ..frontend import compile as _compile
from ..graph.compiler import CompiledGraph
from ..ops import autotune, registry
from ..ops.registry import InferContext, TensorMeta, get_op
from .text import shape_arg, table


def _as_compiled(graph):
    if isinstance(graph, CompiledGraph):
        return graph
    return _compile(graph)


def _declared_shapes(cg) -> dict:
    shapes = {}
    for name, spec in cg.input_specs.items():
        if spec.shape is None or not all(isinstance(d, int) and d >= 0 for d in spec.shape):
            raise ParamInvalidError(
                f"explain_graph: input {name!r} has no static shape in the graph "
                f"({spec.shape}); pass input_shapes={{{name!r}: (...)}}"
            )
        shapes[name] = tuple(int(d) for d in spec.shape)
    return shapes


def _plan_text(plan) -> str | None:
    if plan is None:
        return None
    describe = getattr(plan, "describe", None)
    if callable(describe):
        try:
            return describe()
        except Exception:  # noqa: BLE001 - explaining must never fail on a plan's description
            return None
    return None


def _inner_selection(ex):
    """(inner op name, Selection, inner plan) of a fused step whose plan wraps a kernel."""
    plan = ex.plan
    if not isinstance(plan, dict) or not hasattr(plan.get("kernel"), "fn"):
        return None
    k = plan["kernel"]
    if getattr(plan.get("selection"), "kernel", None) is k:  # the selection made at prepare, constants known
        return (k.op, plan["selection"], plan.get("plan"))
    try:
        rec = get_op(k.op)
        n = len(rec.inputs)
        metas = [
            m if isinstance(m, TensorMeta) or m is None else TensorMeta(m.shape, m.dtype)
            for m in list(ex.input_metas)[:n]
        ]
        ctx = InferContext(rec, metas, rec.bind_attrs(dict(plan.get("attrs") or {})), [None] * len(metas), 1)
        rec.run_infer(ctx)
        sel = registry.select_kernel(rec, ctx)
    except (OpsnnError, TypeError, ValueError, KeyError, IndexError):
        return (k.op, None, plan.get("plan"))
    return (k.op, sel, plan.get("plan"))


def _wrap(label: str, text: str, width: int = 110) -> list:
    """``label: text`` wrapped under its label, so a long reason reads as a paragraph, not one line."""
    return textwrap.wrap(
        text, width, initial_indent=f"      {label}: ", subsequent_indent=" " * (8 + len(label)), break_on_hyphens=False
    ) or [f"      {label}:"]


#: op types whose kernels run GEMMs (or convolutions) on a library the strategy chooses
_PRODUCT_OPS = {
    "MatMul",
    "Gemm",
    "Linear",
    "BatchGemm",
    "FusedMatMul",
    "Conv",
    "FusedConv",
    "BlockedConv",
    "ConvTranspose",
}
#: convolution gradients: libraries.conv_backward decides between oneDNN and opsnn's GEMM kernels
_GRADIENT_OPS = {"ConvBackwardData": "data", "ConvBackwardWeight": "weights"}


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _product(op: str, ex, plan_obj, kernel: str):
    """(shape label, libraries.Choice) of a product node: which library its GEMMs run on and
    why; None for other nodes (or shapes this cannot read)."""
    from ..kernels.cpu import libraries

    if op in _GRADIENT_OPS:
        return _gradient_product(op, ex, kernel)
    if op not in _PRODUCT_OPS:
        return None
    metas, outs = list(ex.input_metas), list(ex.output_metas or [])
    if len(metas) < 2 or metas[0] is None or metas[1] is None or not outs:
        return None
    a, b, y = tuple(metas[0].shape), tuple(metas[1].shape), tuple(outs[0].shape)
    dtype, batch, tiles = metas[0].dtype, 1, None
    try:
        if op in ("MatMul", "FusedMatMul"):
            label = f"{_dims(a)} @ {_dims(b)}"
            k, n = int(a[-1]), int(b[-1]) if len(b) > 1 else 1
            if len(b) <= 2:
                rows = math.prod(a[:-1])
            else:
                rows, batch = (int(a[-2]) if len(a) > 1 else 1), math.prod(y[:-2])
        elif op == "Gemm":
            ta, tb = int(ex.attrs.get("transA", 0)), int(ex.attrs.get("transB", 0))
            label = f"{_dims(a)}{'^T' * ta} @ {_dims(b)}{'^T' * tb}"
            rows, k = (a[1], a[0]) if ta else (a[0], a[1])
            n = b[0] if tb else b[1]
        elif op == "BatchGemm":  # the plan says how the batch folds (into M, into K) or stays a batch
            ta, tb = int(ex.attrs.get("transA", 0)), int(ex.attrs.get("transB", 0))
            label = f"{_dims(a)}{'^T' * ta} @ {_dims(b)}{'^T' * tb} -> {_dims(y)}"
            rows, k, n, batch = plan_obj.m, plan_obj.k, plan_obj.n, math.prod(plan_obj.full[:-2])
            if plan_obj.case in ("fold_m", "fold_k"):
                rows, k, batch = (rows * batch, k, 1) if plan_obj.case == "fold_m" else (rows, k * batch, 1)
        elif op == "Linear":
            label = f"{_dims(a)} @ ({_dims(b)})^T"
            rows, k, n = math.prod(a[:-1]), int(a[-1]), int(b[0])
        else:  # convolutions: X * W; the GEMM multiplies W (M/g, C/g * kernel) by the columns
            g = int(ex.attrs.get("group") or 1)
            x = (a[0], a[1] * a[-1]) + a[2:-1] if len(a) == 5 and op == "BlockedConv" else a
            label = f"{_dims(x)} * {_dims(b)}"
            m = b[1] * g if op == "ConvTranspose" else b[0]
            rows, k, n, batch = m // g, math.prod(b[1:]), math.prod(y[2:4] if len(y) == 5 else y[2:]), y[0] * g
            if hasattr(plan_obj, "tw_n") and hasattr(plan_obj, "rows"):
                tiles = int(plan_obj.rows) * int(plan_obj.tw_n)
                if getattr(plan_obj, "gemms", None):
                    return label, libraries.Choice("onednn", kernel, "oneDNN's batched brgemm matmul")
    except (AttributeError, TypeError, ValueError, IndexError, ZeroDivisionError):  # explaining never fails
        return None
    choice = libraries.kernel_choice(kernel, int(rows), int(k), int(n), dtype, batch=int(batch), tiles=tiles)
    return None if choice is None else (label, choice)


def _gradient_product(op: str, ex, kernel: str):
    """(shape label, libraries.Choice) of a ConvBackwardData / ConvBackwardWeight node."""
    from ..kernels.cpu import libraries

    try:
        a, b = (tuple(int(d) for d in m.shape) for m in ex.input_metas[:2])
        y = tuple(int(d) for d in ex.output_metas[0].shape)
        attrs, nd = ex.attrs, len(a) - 2
        xs, ws, ys = (y, b, a) if op == "ConvBackwardData" else (a, y, b)
        s = [int(v) for v in attrs.get("strides") or [1] * nd]
        d = [int(v) for v in attrs.get("dilations") or [1] * nd]
        pads = [int(v) for v in attrs.get("pads") or [0] * (2 * nd)]
        c = libraries.conv_backward(
            _GRADIENT_OPS[op], xs, ws, ys, s, pads, d, int(attrs.get("group") or 1), ex.input_metas[0].dtype
        )
    except (AttributeError, TypeError, ValueError, IndexError):  # explaining never fails
        return None
    label = f"{_dims(ys)} -> {'dX ' + _dims(xs) if op == 'ConvBackwardData' else 'dW ' + _dims(ws)}"
    return label, libraries.Choice(c.library, kernel, c.reason)


def _libraries_section(products: list, max_shapes: int = 3) -> list:
    """The kernel-library decisions of the product nodes, equal decisions grouped."""
    from ..kernels.cpu import libraries

    groups: dict = {}
    for op, label, choice in products:
        shapes = groups.setdefault((op, choice.library, choice.kernel, choice.reason), Counter())
        shapes[label] += 1
    lib = "MKL" if libraries.gemm_library() == "mkl" else "OpenBLAS"
    out = textwrap.wrap(
        f"kernel libraries: {libraries.summary()}", 110, subsequent_indent="    ", break_on_hyphens=False
    )
    out += textwrap.wrap(
        f"threaded GEMM: {lib}, {libraries.gemm_library_why()}",
        110,
        initial_indent="  ",
        subsequent_indent="    ",
        break_on_hyphens=False,
    )
    if not groups:
        return out + ["  no MatMul, Gemm or Conv nodes"]
    for (op, lib, kernel, reason), shapes in sorted(groups.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
        out += textwrap.wrap(
            f"{op} x{sum(shapes.values())} on {lib} ({kernel}): {reason}",
            110,
            initial_indent="  - ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
        listed = [f"{s} x{c}" if c > 1 else s for s, c in shapes.most_common(max_shapes)]
        more = len(shapes) - len(listed)
        out += textwrap.wrap(
            ", ".join(listed) + (f" (+{more} more shapes)" if more > 0 else ""),
            110,
            initial_indent="      ",
            subsequent_indent="      ",
            break_on_hyphens=False,
        )
    return out


def explain_graph(graph, input_shapes: dict | None = None, *, show_rejected: bool = True, summary: bool = False) -> str:
    """Plan ``graph`` (a Graph, CompiledGraph, ONNX path or ModelProto) for ``input_shapes``
    (``{input name: shape}``; default: the graph's declared static shapes) and say which kernel
    each launch runs and why. ``summary=True``: kernels by op type with counts, reference
    fallbacks, fusions done and refused, instead of per-node detail. Building the plan runs the
    graph once on zeros."""
    if isinstance(graph, (str, bytes)) or type(graph).__name__ == "ModelProto":
        from .. import onnx as _onnx

        graph = _onnx.load(graph)
    cg = _as_compiled(graph)
    shapes = dict(input_shapes) if input_shapes is not None else _declared_shapes(cg)
    shapes = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
    cg.prepare_shapes([shapes])
    where = ", ".join(f"{k}={v}" for k, v in shapes.items())
    title = f"graph {cg.graph.name} at {where}"
    if cg.mode == "interpreted":
        return f"{title}: runs in the interpreter ({cg.mode_reason}); kernels are selected per node at run time"
    plan = cg.latest_plan
    if plan is None:
        return cg.explain()
    lines = []
    counts: Counter = Counter()
    by_type: dict = {}
    fallback_nodes = []
    products: list = []
    tuned = autotune.settings()
    for st in plan.steps:
        ex = st.executor
        node = st.node
        head = f"  {node.name} ({node.qualified_type}): {ex.kernel.name}"
        inner = _inner_selection(ex)
        sel_reason, rejected, plan_obj = ex.reason, ex.rejected, ex.plan
        kernel_name = ex.kernel.name
        if inner is not None:
            op, sel, plan_obj = inner
            if sel is not None:
                head += f" -> {op}: {sel.kernel.name}"
                sel_reason, rejected = sel.reason, sel.rejected
                kernel_name = f"{ex.kernel.name} -> {sel.kernel.name}"
                counts[f"{op}:{sel.kernel.name}"] += 1
        else:
            counts[f"{node.op_type}:{ex.kernel.name}"] += 1
        chosen = sel.kernel if inner is not None and sel is not None else ex.kernel
        product = _product(inner[0] if inner is not None else node.op_type, ex, plan_obj, chosen.name)
        if product is not None:
            products.append((node.qualified_type, *product))
        by_type.setdefault(node.qualified_type, Counter())[kernel_name] += 1
        if ex.kernel.fallback:
            head += "  [REFERENCE FALLBACK]"
            fallback_nodes.append(f"{node.name} ({node.qualified_type})")
        if ex.adapter:
            head += "  [16-bit via fp32 adapter]"
        if summary:
            continue
        lines.append(head)
        lines += _wrap("why", sel_reason.split("; skipped ")[0])
        if product is not None:
            lines += _wrap("library", f"{product[1].library}: {product[1].reason}")
        if chosen.nonfinite:
            lines += _wrap("inf/nan", chosen.nonfinite)
        text = _plan_text(plan_obj)
        if text:
            lines += _wrap("plan", text)
        if ex.workspace_size:
            lines.append(f"      workspace: {ex.workspace_size / 2**20:.2f} MiB")
        if show_rejected and rejected:
            for name, why in rejected:
                tag = " (autotune may still pick it)" if isinstance(why, autotune.NotPreferred) else ""
                lines += _wrap("not chosen", f"{name}: {why}{tag}")
    autotune_line = f"  autotune: {tuned['mode'] or 'off'}" + (f" ({tuned['path']})" if tuned["mode"] else "")
    if summary:
        return _summary(cg, title, plan, by_type, fallback_nodes, autotune_line, products)
    kernels = ", ".join(f"{k} x{n}" for k, n in counts.most_common())
    head = [
        f"{title}: {len(plan.steps)} kernels (compiled)",
        f"  memory: {plan.memory.summary()}",
        f"  kernels: {kernels}",
        autotune_line,
    ]
    if fallback_nodes:
        head.append(f"  WARNING: {len(fallback_nodes)} node(s) run the numpy reference implementation")
    head += ["  " + line for line in _libraries_section(products)]
    return "\n".join(head + lines)


def _summary(
    cg,
    title: str,
    plan,
    by_type: dict,
    fallback_nodes: list,
    autotune_line: str,
    products: list = (),
    max_refused: int = 8,
) -> str:
    out = [f"{title}: {len(plan.steps)} kernels (compiled)", f"  memory: {plan.memory.summary()}"]
    rep = cg.pass_report
    if rep is not None:
        done = [f"{r.name} {r.changes}" for r in rep.results if r.changes]
        out += textwrap.wrap(
            f"passes: {rep.nodes_before} nodes -> {rep.nodes_after}; changes: {', '.join(done) or 'none'}",
            110,
            initial_indent="  ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    rows = [
        [op, sum(c.values()), ", ".join(f"{k} x{n}" if n > 1 else k for k, n in c.most_common())]
        for op, c in sorted(by_type.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    ]
    rendered = "\n".join(line.rstrip() for line in table(rows, ["op type", "nodes", "kernels"]).splitlines())
    out += ["", "kernels by op type:", textwrap.indent(rendered, "  "), ""]
    out.append(
        "reference fallbacks: "
        + (f"{len(fallback_nodes)} node(s): " + ", ".join(fallback_nodes) if fallback_nodes else "none")
    )
    refused = [(r.name, why) for r in (rep.results if rep is not None else []) for why in r.refused]
    if refused:
        out.append(
            f"fusions refused: {len(refused)}" + (f" (first {max_refused})" if len(refused) > max_refused else "")
        )
        for name, why in refused[:max_refused]:
            out += textwrap.wrap(
                f"{name}: {why}", 110, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False
            )
    else:
        out.append("fusions refused: none")
    out += _libraries_section(list(products))
    out.append(autotune_line.strip())
    out.append("per node (kernel, why, what was not chosen): opsnn explain MODEL --verbose")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``opsnn explain MODEL [--shape NAME=DIMS ...] [--autotune [FILE]] [--verbose [--brief]]``."""
    p = argparse.ArgumentParser(prog="opsnn explain", description="which kernel each node of a model runs, and why")
    p.add_argument("model", help="an ONNX model file")
    p.add_argument(
        "--shape",
        action="append",
        type=shape_arg,
        default=[],
        help="input shape, e.g. --shape x=1,3,224,224 (default: the model's static shapes)",
    )
    p.add_argument(
        "--autotune",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="time the candidate kernels of each node (winners saved to FILE, default "
        "~/.cache/opsnn/autotune.json) and explain with the tuned choices",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="per node: the kernel, why, its plan and the kernels not chosen (default: a summary)",
    )
    p.add_argument("--brief", action="store_true", help="with --verbose: leave out the kernels that were not chosen")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from ..runtime import init

    init()
    if args.autotune is not None:
        autotune.enable(args.autotune or None)
    try:
        print(
            explain_graph(
                args.model,
                dict(args.shape) or None,
                show_rejected=not args.brief,
                summary=not (args.verbose or args.brief),
            )
        )
    except (OpsnnError, OSError) as exc:
        print(f"opsnn explain: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["explain_graph", "main"]
