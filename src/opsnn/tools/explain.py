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

Command line (wired by ``opsnn.cli``): ``opsnn explain model.onnx --shape x=1,3,224,224``.
"""

from __future__ import annotations

import argparse
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
        chosen = sel.kernel if inner is not None and sel is not None else ex.kernel
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
        return _summary(cg, title, plan, by_type, fallback_nodes, autotune_line)
    kernels = ", ".join(f"{k} x{n}" for k, n in counts.most_common())
    head = [
        f"{title}: {len(plan.steps)} kernels (compiled)",
        f"  memory: {plan.memory.summary()}",
        f"  kernels: {kernels}",
        autotune_line,
    ]
    if fallback_nodes:
        head.append(f"  WARNING: {len(fallback_nodes)} node(s) run the numpy reference implementation")
    return "\n".join(head + lines)


def _summary(
    cg, title: str, plan, by_type: dict, fallback_nodes: list, autotune_line: str, max_refused: int = 8
) -> str:
    out = [f"{title}: {len(plan.steps)} kernels (compiled)", f"  memory: {plan.memory.summary()}"]
    rep = cg.pass_report
    if rep is not None:
        done = [f"{r.name} {r.changes}" for r in rep.results if r.changes]
        out.append(f"  passes: {rep.nodes_before} nodes -> {rep.nodes_after}; changes: {', '.join(done) or 'none'}")
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
            out += textwrap.wrap(f"{name}: {why}", 110, initial_indent="  - ", subsequent_indent="    ")
    else:
        out.append("fusions refused: none")
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
