"""Kernel benchmarks: opsnn's conv, GEMM and attention kernels against numpy and onnxruntime.

Each workload runs as a single-node ONNX model (weights as initializers, so opsnn's graph
path pre-packs them) through ``opsnn.compile`` ("opsnn": what a model gets by default) and
through an onnxruntime session in the same process, next to a numpy formulation; every
opsnn kernel that can run the workload is also timed on its own ("opsnn:<kernel>": the
kernel function called directly with its prepared plan, no dispatch). Contenders run
round-robin (a burst of load from other processes hits them all alike), each turn an untimed
settling run and then two timed ones (see ``measure``); figures are medians with the p10-p90
spread.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/kernels.py \\
        [--only conv,gemm,products,lowp,attention,threads,large] [--repeat 30] [--quick]
        [--conv-filter S,...] [--ghz GHZ] [--cores N] [--json PATH]

Prefix ``NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1`` for single-thread figures (onnxruntime
then gets one thread too); their ``cpu`` column is robust to other jobs on the machine.

Targets (issue: Fast CPU kernels): Winograd >= 1.5x faster than im2col on 3x3 stride-1
layers with >= 64 channels; the fp32 GEMM path >= 90% of numpy's GFLOP/s.
``--only large`` runs conv and pooling on a 1x{C}x4096x4096 image through the eager API and
reports each kernel's time, workspace and the memory pool's peak against input + output
(issue: Large inputs, bounded workspace: peak <= 2x (input + output)).
``--only products`` times every library on BERT-base's and the decoder prefill's constant-weight
products (run it under ``OPSNN_CPU_ISA=avx2`` and without: issue 34's A/B of the AVX2 strategy)
against the 8-lane FMA peak.
``--only threads`` reruns the OpenMP wait-policy experiment behind the default set in
``opsnn/kernels/cpu/__init__.py`` (fresh processes, interleaved rounds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np

from opsnn.kernels.cpu import blocked as KB
from opsnn.ops import autotune
from opsnn.ops.registry import TensorMeta, get_op

onnx = __import__("onnx")
ort = __import__("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from workloads import write_json  # noqa: E402

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}


# -- timing -------------------------------------------------------------------------------------------
#: seconds to let a peer's idle threads stop after its turn: onnxruntime's pool and OpenBLAS's
#: workers keep spinning after a run, and in strict round-robin that spin is charged to the next
#: contender (docs/performance.md, "Benchmark method")
SETTLE_S = 0.08
#: ... and after the pause each contender runs untimed for this long (at least once) before its timed
#: runs: the first milliseconds after an idle pause run slow (sleeping OpenMP workers, an idle vCPU
#: rescheduled by the host; docs/performance.md, "Benchmark method")
WARM_S = 0.1


def measure(fns: dict, repeat: int, budget_s: float = 20.0, block: int = 2) -> dict:
    """Round-robin medians: {name: {median_ms, p10_ms, p90_ms, cpu_ms, runs}}. ``cpu_ms`` is the
    median process CPU time: with NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 it measures the
    work done, unaffected by other jobs taking the cores (with threads it also counts spinning).

    Each round gives every contender an untimed settling run, then ``block`` timed runs, then
    pauses ``SETTLE_S`` so that threads a contender left spinning are not charged to the next.
    The pause follows every contender, so each starts its turn from the same idle machine: with
    the pause only after peers, a contender that ran right after an opsnn one found the second
    core awake and its caches warm."""
    for f in fns.values():
        f()
        f()
    times = {n: [] for n in fns}
    cpu = {n: [] for n in fns}
    start = time.perf_counter()
    for _ in range(repeat):
        for n, f in fns.items():
            t_warm = time.perf_counter()
            f()
            while time.perf_counter() - t_warm < WARM_S:
                f()
            for _ in range(block):
                c0 = time.process_time()
                t0 = time.perf_counter()
                f()
                times[n].append(time.perf_counter() - t0)
                cpu[n].append(time.process_time() - c0)
            time.sleep(SETTLE_S)
        if time.perf_counter() - start > budget_s and len(times[next(iter(fns))]) >= 5:
            break
    out = {}
    for n, ts in times.items():
        ts = np.array(ts) * 1e3
        out[n] = {
            "median_ms": float(np.median(ts)),
            "p10_ms": float(np.percentile(ts, 10)),
            "p90_ms": float(np.percentile(ts, 90)),
            "cpu_ms": float(np.median(cpu[n]) * 1e3),
            "runs": int(ts.size),
        }
    return out


def _fmt(r: dict) -> str:
    return f"{r['median_ms']:8.3f} ms [{r['p10_ms']:.3f}-{r['p90_ms']:.3f}] cpu {r['cpu_ms']:.3f}"


# -- single-node models -------------------------------------------------------------------------------------
def _model(op: str, inputs: dict, weights: dict, attrs: dict, out_dtype, opset: int = 21, name="y"):
    node = helper.make_node(op, list(inputs) + list(weights), [name], **attrs)
    g = helper.make_graph(
        [node],
        f"bench_{op}",
        [helper.make_tensor_value_info(k, _TYPES[v.dtype], list(v.shape)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(name, _TYPES[np.dtype(out_dtype)], None)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _ort_session(model):
    so = ort.SessionOptions()
    # as many threads as opsnn's kernels get (NUMBA_NUM_THREADS=1 for single-thread runs)
    so.intra_op_num_threads = int(os.environ.get("NUMBA_NUM_THREADS") or os.cpu_count() or 1)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _opsnn_runner(model, feeds: dict, kernel: tuple | None = None):
    """Compile ``model`` (under ``kernel_selector`` when a kernel is forced) and return
    (run callable, chosen kernel name)."""
    graph = opsnn.onnx.load(model)
    tensors = {k: opsnn.tensor(v) for k, v in feeds.items()}
    if kernel is not None:
        with opsnn.kernel_selector(**{kernel[0]: kernel[1]}):
            cg = opsnn.compile(graph)
            cg.run(tensors)
    else:
        cg = opsnn.compile(graph)
        cg.run(tensors)
    plan = cg.latest_plan
    ex = plan.steps[0].executor
    name = ex.kernel.name
    if isinstance(ex.plan, dict) and hasattr(ex.plan.get("kernel"), "name"):
        name = ex.plan["kernel"].name
    out = cg.output_names[0]

    def run():
        return cg.run(tensors)[out].numpy()

    return run, name


def _kernel_runners(op: str, arrays: list, attrs: dict, constant: set, domain: str = "") -> dict:
    """{kernel name: run()} for every opsnn kernel of ``op`` that can run these inputs (its
    predicate accepts them, or declines only as NotPreferred), called directly: plan made
    here with the ``constant`` inputs' values known (so weights are pre-packed, as in the
    graph path), outputs and workspace preallocated, fp32 adapter applied for 16-bit."""
    from opsnn import dtypes as _dt
    from opsnn.ops.executor import plan_op

    rec = get_op(op, domain) if domain else get_op(op)
    metas = [None if a is None else TensorMeta(a.shape, a.dtype) for a in arrays]
    values = [a if i in constant else None for i, a in enumerate(arrays)]
    ctx = plan_op(rec, metas, values, attrs).ctx
    runners = {}
    for k in autotune.candidates(rec, ctx):
        plan = k.plan(ctx) if k.plan else None
        nbytes = int(k.workspace(ctx, plan)) if k.workspace else 0
        ws = np.empty(nbytes, np.uint8) if nbytes else None
        adapter = k.needs_adapter(ctx)
        outs = [
            np.empty(m.shape, np.float32 if adapter and _dt.is_low_precision(m.dtype) else m.dtype) for m in ctx.outputs
        ]
        final = [np.empty(m.shape, m.dtype) for m in ctx.outputs]
        ins = list(arrays)

        def run(k=k, plan=plan, ws=ws, outs=outs, final=final, ins=ins, adapter=adapter):
            if not adapter:
                k.fn(ins, outs, ctx.attrs, plan, ws)
                return outs[0]
            # what the executor's fp32 adapter does: widen inputs, run, narrow outputs
            xs = [a.astype(np.float32) if a is not None and _dt.is_low_precision(a.dtype) else a for a in ins]
            k.fn(xs, outs, ctx.attrs, plan, ws)
            for o, f in zip(outs, final):
                np.copyto(f, o, casting="unsafe")
            return final[0]

        runners[k.name] = run
    return runners


# -- Conv -----------------------------------------------------------------------------------------------------
# ResNet-50 (v1.5) at batch 1: the stem, and per stage its 1x1 / 3x3 (stride 1 and the
# stride-2 first block) convolutions; plus dilated 3x3 (DeepLab-style) and a VGG-style first layer.
RESNET50 = [
    ("stem 7x7/2", (1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
    ("s1 1x1 64->64", (1, 64, 56, 56), (64, 64, 1, 1), 1, 0, 1),
    ("s1 3x3 64", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ("s1 3x3 64 batch 8", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ("s1 1x1 64->256", (1, 64, 56, 56), (256, 64, 1, 1), 1, 0, 1),
    ("s1 1x1 256->64", (1, 256, 56, 56), (64, 256, 1, 1), 1, 0, 1),
    ("s2 3x3/2 128", (1, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1),
    ("s2 3x3 128", (1, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1),
    ("s2 3x3 128 batch 8", (8, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1),
    ("s2 1x1 128->512", (1, 128, 28, 28), (512, 128, 1, 1), 1, 0, 1),
    ("s2 1x1 512->128", (1, 512, 28, 28), (128, 512, 1, 1), 1, 0, 1),
    ("s3 3x3/2 256", (1, 256, 28, 28), (256, 256, 3, 3), 2, 1, 1),
    ("s3 3x3 256", (1, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
    ("s3 1x1 256->1024", (1, 256, 14, 14), (1024, 256, 1, 1), 1, 0, 1),
    ("s3 1x1 1024->256", (1, 1024, 14, 14), (256, 1024, 1, 1), 1, 0, 1),
    ("s4 3x3/2 512", (1, 512, 14, 14), (512, 512, 3, 3), 2, 1, 1),
    ("s4 3x3 512", (1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ("s4 1x1 512->2048", (1, 512, 7, 7), (2048, 512, 1, 1), 1, 0, 1),
    ("s4 1x1 2048->512", (1, 2048, 7, 7), (512, 2048, 1, 1), 1, 0, 1),
    ("s3 3x3 256 batch 8", (8, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
    ("s4 3x3 512 batch 8", (8, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ("dilated 3x3 d2 256", (1, 256, 33, 33), (256, 256, 3, 3), 1, 2, 2),
    ("dilated 3x3 d4 64", (1, 64, 56, 56), (64, 64, 3, 3), 1, 4, 4),
    ("dilated 3x3 d2 512", (1, 512, 28, 28), (512, 512, 3, 3), 1, 2, 2),
    ("vgg 3x3 3->64", (1, 3, 224, 224), (64, 3, 3, 3), 1, 1, 1),
]
QUICK_CONV = {
    "stem 7x7/2",
    "s1 3x3 64",
    "s2 3x3 128",
    "s3 3x3 256",
    "s4 3x3 512",
    "s1 1x1 64->256",
    "dilated 3x3 d2 256",
}
#: the issue's target: Winograd >= 1.5x faster than im2col on 3x3 stride-1 layers with >= 64 channels
#: (F(4x4,3x3) "conv2d_winograd" and F(2x2,3x3) "conv2d_winograd_f2" are both timed; the side-by-side
#: table at the end of the section shows each against im2col and which one selection picks)
WINOGRAD_KERNELS = {"conv2d_winograd": "F(4x4)", "conv2d_winograd_f2": "F(2x2)"}


def numpy_conv(x, w, stride, pad, dil):
    """im2col in numpy: a strided window view, then one tensordot (BLAS)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    eh, ew = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::stride, ::stride, ::dil, ::dil]
    return np.einsum("ncpqij,mcij->nmpq", win, w, optimize=True)


def bench_conv(args, rng) -> list:
    rows = []
    print("\n== Conv (ResNet-50 shapes at batch 1, float32; opsnn graph path with weights as initializers)")
    for name, xs, ws, s, p, d in RESNET50:
        if args.quick and name not in QUICK_CONV:
            continue
        if args.conv_filter and not any(f in name for f in args.conv_filter.split(",")):
            continue
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / math.sqrt(ws[1] * ws[2] * ws[3])).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        attrs = {"strides": [s, s], "pads": [p] * 4, "dilations": [d, d]}
        model = _model("Conv", {"x": x}, {"W": w, "B": b}, attrs, np.float32)
        run_default, chosen = _opsnn_runner(model, {"x": x})
        fns = {"opsnn": run_default}
        for k, f in _kernel_runners("Conv", [x, w, b], attrs, {1, 2}).items():
            fns[f"opsnn:{k}"] = f
        blk = _blocked_block()
        if blk and xs[1] % blk == 0 and ws[0] % blk == 0:
            # the kernels a ResNet graph runs (blocked_layout pass: nChw<blk>c chains, nhwc from
            # AVX-512 on), called directly
            for layout, prefix in [(blk, BLOCKED)] + ([(KB.NHWC, NHWC)] if blk == 16 else []):
                battrs = dict(attrs, src_blocked=1, block=layout)
                for k, f in _kernel_runners(
                    "BlockedConv", [KB.blocked_reference(x, layout), w, b, None], battrs, {1, 2}, domain="opsnn"
                ).items():
                    fns[f"{prefix}{k}"] = f
        sess = _ort_session(model)
        fns["onnxruntime"] = lambda sess=sess, x=x: sess.run(None, {"x": x})[0]
        fns["numpy"] = lambda: numpy_conv(x, w, s, p, d) + b.reshape(1, -1, 1, 1)
        want = fns["onnxruntime"]()
        errs = {
            k: float(np.abs(_as_plain(k, f(), blk) - want).max() / (np.abs(want).max() or 1)) for k, f in fns.items()
        }
        res = measure(fns, args.repeat)
        oh = (xs[2] + 2 * p - (ws[2] - 1) * d - 1) // s + 1
        ow = (xs[3] + 2 * p - (ws[3] - 1) * d - 1) // s + 1
        gflop = 2 * xs[0] * ws[0] * ws[1] * ws[2] * ws[3] * oh * ow / 1e9
        t = {k: v["median_ms"] for k, v in res.items()}
        row = {
            "name": name,
            "x": xs,
            "w": ws,
            "stride": s,
            "pad": p,
            "dilation": d,
            "chosen": chosen,
            "gflop": gflop,
            "results": res,
            "max_rel_err": errs,
            "gflops": {k: gflop / (v / 1e3) for k, v in t.items()},
            "speedup_vs_numpy": t["numpy"] / t["opsnn"],
            "speedup_vs_ort": t["onnxruntime"] / t["opsnn"],
        }
        if "opsnn:conv2d_winograd" in t and "opsnn:conv2d_im2col" in t:
            row["winograd_vs_im2col"] = t["opsnn:conv2d_im2col"] / t["opsnn:conv2d_winograd"]
            row["winograd_vs_im2col_cpu"] = (
                res["opsnn:conv2d_im2col"]["cpu_ms"] / res["opsnn:conv2d_winograd"]["cpu_ms"]
            )
        if "opsnn:conv2d_winograd_f2" in t and "opsnn:conv2d_im2col" in t:
            row["winograd_f2_vs_im2col"] = t["opsnn:conv2d_im2col"] / t["opsnn:conv2d_winograd_f2"]
            row["winograd_f2_vs_im2col_cpu"] = (
                res["opsnn:conv2d_im2col"]["cpu_ms"] / res["opsnn:conv2d_winograd_f2"]["cpu_ms"]
            )
        if "opsnn:conv2d_winograd_dilated" in t and "opsnn:conv2d_im2col" in t:
            row["dilated_winograd_vs_im2col"] = t["opsnn:conv2d_im2col"] / t["opsnn:conv2d_winograd_dilated"]
        if "opsnn:conv2d_direct" in t and "opsnn:conv2d_im2col" in t:
            row["direct_vs_im2col"] = t["opsnn:conv2d_im2col"] / t["opsnn:conv2d_direct"]
        if f"{BLOCKED}conv_winograd_blocked" in t and f"{BLOCKED}conv_onednn" in t:
            row["blocked_winograd_vs_onednn"] = t[f"{BLOCKED}conv_onednn"] / t[f"{BLOCKED}conv_winograd_blocked"]
        rows.append(row)
        best = min((k for k in t if k.startswith("opsnn")), key=t.get, default="opsnn")
        print(
            f"{name:22s} chosen {chosen:16s} opsnn {_fmt(res['opsnn'])} {row['gflops']['opsnn']:6.1f} GF/s | "
            f"numpy x{row['speedup_vs_numpy']:.2f} ort x{row['speedup_vs_ort']:.2f} | fastest {best[6:]}"
            + (f" | winograd/im2col x{row['winograd_vs_im2col']:.2f}" if "winograd_vs_im2col" in row else "")
            + (f" | winograd_f2/im2col x{row['winograd_f2_vs_im2col']:.2f}" if "winograd_f2_vs_im2col" in row else "")
            + (
                f" | dilated-winograd/im2col x{row['dilated_winograd_vs_im2col']:.2f}"
                if "dilated_winograd_vs_im2col" in row
                else ""
            )
            + (f" | direct/im2col x{row['direct_vs_im2col']:.2f}" if "direct_vs_im2col" in row else "")
            + (
                f" | blocked winograd/oneDNN x{row['blocked_winograd_vs_onednn']:.2f}"
                if "blocked_winograd_vs_onednn" in row
                else ""
            )
        )
        for k in sorted(t, key=t.get):
            print(f"    {k:28s} {_fmt(res[k])} {row['gflops'][k]:7.1f} GF/s  err {errs[k]:.1e}")
    _winograd_table(rows)
    _blocked_table(rows)
    return rows


#: prefixes of the BlockedConv kernels' entries (nChw<b>c / nhwc in and out, as inside a ResNet graph)
BLOCKED = "opsnn-blocked:"
NHWC = "opsnn-nhwc:"


def _as_plain(name: str, out, blk):
    """A contender's output in plain NCHW order (the blocked kernels write nChw<blk>c or nhwc)."""
    if name.startswith(BLOCKED):
        return KB.plain_reference(out, blk)
    return KB.plain_reference(out, KB.NHWC) if name.startswith(NHWC) else out


def _blocked_block() -> int | None:
    from opsnn.kernels.cpu import onednn

    return onednn.block() if onednn.unavailable() is None else None


def _blocked_table(rows: list) -> None:
    """Inside a graph's blocked chains: oneDNN's direct conv vs Winograd on nChw<b>c (median ms)."""
    sel = [
        r for r in rows if f"{BLOCKED}conv_winograd_blocked" in r["results"] and f"{BLOCKED}conv_onednn" in r["results"]
    ]
    if not sel:
        return
    print(
        "\n   blocked chains (nChw<b>c, the ResNet graph's path): median ms, oneDNN direct vs Winograd F(4x4) "
        "(x speed-up)"
    )
    for r in sel:
        a, b = (r["results"][f"{BLOCKED}{k}"]["median_ms"] for k in ("conv_onednn", "conv_winograd_blocked"))
        c = r["results"].get(f"{NHWC}conv_onednn")
        nhwc = f"   nhwc (oneDNN brgconv) {c['median_ms']:9.3f}" if c else ""
        print(f"   {r['name']:22s} {a:9.3f} {b:9.3f} (x{a / b:.2f}){nhwc}")


def _winograd_table(rows: list) -> None:
    """im2col vs F(4x4) vs F(2x2) side by side for the 3x3 stride-1 dilation-1 rows (median ms,
    speed-up over im2col), and the kernel the default selection runs."""
    sel = [
        r
        for r in rows
        if r["w"][2:] == (3, 3) and r["stride"] == 1 and r["dilation"] == 1 and "opsnn:conv2d_im2col" in r["results"]
    ]
    if not sel:
        return
    print("\n   3x3 stride 1: median ms (x speed-up over im2col); >= 64 channels target: >= 1.5x")
    print(f"   {'shape':22s} {'im2col':>9s} " + " ".join(f"{v:>16s}" for v in WINOGRAD_KERNELS.values()) + "   chosen")
    for r in sel:
        base = r["results"]["opsnn:conv2d_im2col"]["median_ms"]
        cells = []
        for k in WINOGRAD_KERNELS:
            v = r["results"].get(f"opsnn:{k}")
            cells.append(f"{v['median_ms']:8.3f} (x{base / v['median_ms']:.2f})" if v else f"{'-':>16s}")
        print(f"   {r['name']:22s} {base:9.3f} " + " ".join(f"{c:>16s}" for c in cells) + f"   {r['chosen']}")


# -- GEMM -------------------------------------------------------------------------------------------------------
# BERT-base at sequence length 128 (and 512): QKV / output projections, the FFN pair, and
# the per-head attention products.
BERT = [
    ("proj 128x768x768", 128, 768, 768),
    ("ffn1 128x768x3072", 128, 768, 3072),
    ("ffn2 128x3072x768", 128, 3072, 768),
    ("proj 512x768x768", 512, 768, 768),
    ("ffn1 512x768x3072", 512, 768, 3072),
    ("decode 1x768x3072", 1, 768, 3072),
]


def bench_gemm(args, rng) -> list:
    rows = []
    print(
        "\n== GEMM (BERT-base sizes, float32): opsnn two-phase executor (the kernel path), opsnn graph "
        "(B an initializer), numpy.matmul, onnxruntime MatMul"
    )
    cases = BERT[:3] if args.quick else BERT
    for name, m, k, n in cases:
        a = rng.standard_normal((m, k)).astype(np.float32)
        bm = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
        ta, tb = opsnn.tensor(a), opsnn.tensor(bm)
        ex = opsnn.aclnn.matmul.prepare(ta, tb)
        out = np.empty((m, n), np.float32)
        model = _model("MatMul", {"a": a}, {"B": bm}, {}, np.float32)
        run_graph, chosen = _opsnn_runner(model, {"a": a})
        sess = _ort_session(model)
        fns = {
            "opsnn": lambda ex=ex: ex.run().numpy(),
            "opsnn graph": run_graph,
            "numpy": lambda a=a, bm=bm, out=out: np.matmul(a, bm, out=out),
            "onnxruntime": lambda sess=sess, a=a: sess.run(None, {"a": a})[0],
        }
        res = measure(fns, args.repeat)
        gflop = 2 * m * k * n / 1e9
        t = {kk: v["median_ms"] for kk, v in res.items()}
        row = {
            "name": name,
            "m": m,
            "k": k,
            "n": n,
            "kernel": ex.kernel_name,
            "graph_kernel": chosen,
            "results": res,
            "gflops": {kk: gflop / (v / 1e3) for kk, v in t.items()},
            "fraction_of_numpy": t["numpy"] / t["opsnn"],
            "graph_fraction_of_numpy": t["numpy"] / t["opsnn graph"],
            "speedup_vs_ort": t["onnxruntime"] / t["opsnn"],
        }
        rows.append(row)
        print(
            f"{name:20s} {ex.kernel_name:12s} "
            + " | ".join(f"{kk} {_fmt(res[kk])} {row['gflops'][kk]:6.1f} GF/s" for kk in fns)
            + f" | opsnn = {100 * row['fraction_of_numpy']:.0f}% of numpy's GF/s (graph "
            f"{100 * row['graph_fraction_of_numpy']:.0f}%)"
        )
    return rows


#: constant-weight products of BERT-base s128 and the LLaMA-style decoder's 128-token prefill
#: (hidden 768, 4 KV heads of 64: q/k/v stacked to 1280 columns, gate and up to 4096)
PRODUCTS = [
    ("bert proj 128x768x768", 128, 768, 768),
    ("bert ffn1 128x768x3072", 128, 768, 3072),
    ("bert ffn2 128x3072x768", 128, 3072, 768),
    ("prefill qkv 128x768x1280", 128, 768, 1280),
    ("prefill gate+up 128x768x4096", 128, 768, 4096),
    ("prefill down 128x2048x768", 128, 2048, 768),
]


def fma_peak_gflops(lanes: int, cores: int, ghz: float) -> float:
    """cores x 2 FMA units x ``lanes`` float32 lanes x 2 flops x clock."""
    return cores * 2 * lanes * 2 * ghz


def _clock_ghz() -> float:
    """The highest clock /proc/cpuinfo reports (a VM's is nominal), in GHz; 0 when unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        return 0.0
    return max(mhz, default=0.0) / 1e3


def bench_products(args, rng) -> list:
    """Every library that can run each constant-weight product, in one process, round-robin: what
    :mod:`opsnn.kernels.cpu.libraries` picks ("opsnn graph"), OpenBLAS (numpy), MKL unpacked and
    packed, oneDNN's matmul (whatever its implementation under the ISA cap: brgemm, or gemm:jit
    under AVX2) and onnxruntime; GFLOP/s and the share of the 8-lane (AVX2) FMA peak."""
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.kernels.cpu import mkl as KM
    from opsnn.kernels.cpu import onednn as KD
    from opsnn.runtime import cpu, threads

    cores = args.cores or threads.cores()
    ghz = args.ghz or _clock_ghz()
    peak = fma_peak_gflops(8, cores, ghz)
    print(
        f"\n== constant-weight products (float32), {KL.summary()}\n   AVX2 FMA peak {peak:.0f} GFLOP/s "
        f"({cores} cores x 2 FMA x 8 lanes x 2 x {ghz:.2f} GHz; --cores, --ghz set them); ISA in force {cpu.isa()}"
    )
    rows = []
    shapes = PRODUCTS[:2] if args.quick else PRODUCTS
    if args.shapes:
        shapes = [(f"{m}x{k}x{n}", m, k, n) for m, k, n in args.shapes]
    for name, m, k, n in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
        ref = a.astype(np.float64) @ w.astype(np.float64)
        model = _model("MatMul", {"a": a}, {"B": w}, {}, np.float32)
        run_graph, chosen = _opsnn_runner(model, {"a": a})
        sess = _ort_session(model)

        def into(fn):
            """A call of ``fn(y)`` that returns ``y``, an output array of its own."""
            y = np.empty((m, n), np.float32)
            return lambda: (fn(y), y)[1]

        fns = {
            f"opsnn graph ({chosen})": run_graph,
            "openblas": into(lambda y, a=a, w=w: np.matmul(a, w, out=y)),
            "onnxruntime": lambda sess=sess, a=a: sess.run(None, {"a": a})[0],
        }
        if KM.unavailable() is None:
            packed = KM.pack(w, m, transpose=False)
            fns["mkl"] = into(lambda y, a=a, w=w: KM.try_gemm2d(a, w, y))
            fns["mkl packed"] = into(lambda y, a=a, p=packed: KM.gemm(a, p, y))
        if KD.unavailable() is None:
            prim = KD.MatMulPrimitive(m, w, has_bias=False, residual=False, act=0)
            fns[f"onednn {prim.impl}"] = into(lambda y, a=a, prim=prim: prim(a, None, None, y))
        for c, f in fns.items():
            err = float(np.abs(f() - ref).max() / np.abs(ref).max())
            assert err < 1e-4, f"{name}: {c} differs from the float64 product by {err:.2e} (relative to the max)"
        res = measure(fns, args.repeat)
        gflop = 2 * m * k * n / 1e9
        row = {
            "name": name,
            "m": m,
            "k": k,
            "n": n,
            "chosen": chosen,
            "isa": cpu.isa(),
            "avx2_peak_gflops": peak,
            "results": res,
            "gflops": {c: gflop / (v["median_ms"] / 1e3) for c, v in res.items()},
        }
        row["fraction_of_avx2_peak"] = {c: g / peak for c, g in row["gflops"].items()} if peak else {}
        rows.append(row)
        print(f"{name}:")
        for c in fns:
            share = f" {100 * row['fraction_of_avx2_peak'][c]:5.1f}% of peak" if peak else ""
            print(f"   {c:34s} {_fmt(res[c])} {row['gflops'][c]:7.1f} GF/s{share}")
    return rows


def bench_lowp(args, rng) -> list:
    """16-bit MatMul: the fp32 adapter (BLAS on converted copies), the tiled numba kernel
    (tile sweep), the pre-packed constant-weight path, numpy and onnxruntime (fp16)."""
    import ml_dtypes

    from opsnn.kernels.cpu import gemm as G

    rows = []
    print("\n== 16-bit MatMul (B constant where the graph path is used)")
    cases = [c for c in BERT if c[1] in (1, 16, 128)] + [("proj 16x768x768", 16, 768, 768)]
    for dt in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
        for name, m, k, n in cases:
            a = rng.standard_normal((m, k)).astype(dt)
            bm = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(dt)
            out = np.empty((m, n), dt)
            fns = {}
            for kern, f in _kernel_runners("MatMul", [a, bm], {}, set()).items():
                fns[f"opsnn:{kern}" + (" (fp32 adapter)" if kern == "matmul_blas" else "")] = f
            for tile in (32, 64, 128, 256):
                plan = G.lowp_plan(a.shape, bm.shape, dt, tile)
                fns[f"tiled tile_size={tile}"] = lambda plan=plan, a=a, bm=bm, out=out: G.matmul_lowp(
                    [a, bm], [out], {}, plan, None
                )
            for kern, f in _kernel_runners("MatMul", [a, bm], {}, {1}).items():
                if kern == "matmul_prepacked":
                    fns["opsnn:matmul_prepacked (B constant)"] = f
            fns["numpy (astype fp32, matmul, astype)"] = lambda a=a, bm=bm: np.matmul(
                a.astype(np.float32), bm.astype(np.float32)
            ).astype(dt)
            default = opsnn.aclnn.matmul.prepare(a, bm)
            if dt == np.float16:
                model = _model("MatMul", {"a": a}, {"B": bm}, {}, dt)
                sess = _ort_session(model)
                fns["onnxruntime fp16"] = lambda sess=sess, a=a: sess.run(None, {"a": a})[0]
            res = measure(fns, max(5, args.repeat // 2))
            gflop = 2 * m * k * n / 1e9
            row = {
                "name": name,
                "dtype": str(dt),
                "m": m,
                "k": k,
                "n": n,
                "default_kernel": default.kernel_name,
                "tiled_vs_adapter": res["opsnn:matmul_blas (fp32 adapter)"]["median_ms"]
                / res["opsnn:matmul_tiled_lowp"]["median_ms"],
                "results": res,
                "gflops": {kk: gflop / (v["median_ms"] / 1e3) for kk, v in res.items()},
            }
            rows.append(row)
            print(
                f"{dt.name:9s} {name:20s} (default {default.kernel_name}; tiled vs adapter "
                f"x{row['tiled_vs_adapter']:.2f})"
            )
            for kk in sorted(res, key=lambda q: res[q]["median_ms"]):
                print(f"    {kk:40s} {_fmt(res[kk])} {row['gflops'][kk]:6.1f} GF/s")
    return rows


# -- attention --------------------------------------------------------------------------------------------------
def numpy_attention(q, kk, v):
    s = np.matmul(q, kk.transpose(0, 1, 3, 2)) * (1 / math.sqrt(q.shape[-1]))
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return np.matmul(s, v)


def bench_attention(args, rng) -> list:
    rows = []
    print("\n== Attention (BERT-base heads: batch 1, 12 heads, head dim 64, float32; ONNX Attention-23)")
    lengths = (128, 512) if args.quick else (128, 256, 512, 1024, 2048)
    for s in lengths:
        q, kk, v = (rng.standard_normal((1, 12, s, 64)).astype(np.float32) for _ in range(3))
        ex = opsnn.aclnn.attention.prepare(q, kk, v)
        node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
        g = helper.make_graph(
            [node],
            "attn",
            [helper.make_tensor_value_info(nm, TensorProto.FLOAT, [1, 12, s, 64]) for nm in "qkv"],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        sess = _ort_session(helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)]))
        fns = {"opsnn": lambda ex=ex: ex.run().numpy()}
        for kern in ("attention_flash", "attention_blas"):
            if kern != ex.kernel_name:
                e = opsnn.aclnn.attention.prepare(q, kk, v, algo=kern)
                fns[f"opsnn:{kern}"] = lambda e=e: e.run().numpy()
        fns["numpy"] = lambda: numpy_attention(q, kk, v)
        fns["onnxruntime"] = lambda: sess.run(None, {"q": q, "k": kk, "v": v})[0]
        want = fns["numpy"]()
        err = float(np.abs(fns["opsnn"]() - want).max())
        res = measure(fns, max(5, args.repeat // 2))
        gflop = 4 * 12 * s * s * 64 / 1e9
        t = {n: r["median_ms"] for n, r in res.items()}
        row = {
            "seq": s,
            "kernel": ex.kernel_name,
            "results": res,
            "max_abs_err": err,
            "gflops": {n: gflop / (x / 1e3) for n, x in t.items()},
            "speedup_vs_numpy": t["numpy"] / t["opsnn"],
            "speedup_vs_ort": t["onnxruntime"] / t["opsnn"],
        }
        rows.append(row)
        print(
            f"seq {s:5d} {ex.kernel_name:16s} "
            + " | ".join(f"{n} {_fmt(res[n])} {row['gflops'][n]:6.1f} GF/s" for n in fns)
            + f" | numpy x{row['speedup_vs_numpy']:.2f} ort x{row['speedup_vs_ort']:.2f} err {err:.1e}"
        )
    return rows


# -- large inputs -------------------------------------------------------------------------------------------------
LARGE = [  # (name, C, M, stride, padding, dilation, kernel or None for the default)
    ("conv 3x3 1->4", 1, 4, 1, 1, 1, None),
    ("conv 3x3 1->4", 1, 4, 1, 1, 1, "conv2d_im2col"),
    ("conv 3x3/2 1->4", 1, 4, 2, 1, 1, "conv2d_direct"),
    ("conv 3x3/2 1->4", 1, 4, 2, 1, 1, "conv2d_im2col"),
    ("conv 3x3 3->8", 3, 8, 1, 1, 1, None),
    ("conv 3x3 8->8", 8, 8, 1, 1, 1, "conv2d_winograd"),
    ("conv 3x3 d2 8->8", 8, 8, 1, 2, 2, None),
    ("conv 3x3 16->32", 16, 32, 1, 1, 1, None),
]


def _peak_run(fn, repeat: int):
    """(median ms over ``repeat`` runs after one warm-up, pool peak bytes above the baseline of the first run)."""
    import gc

    gc.collect()
    base = opsnn.memory.current_bytes()
    opsnn.memory.reset_peak()
    out = fn()
    peak = opsnn.memory.summary()["peak_bytes"] - base
    del out
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts)), peak


def bench_large(args, rng) -> list:
    size = 2048 if args.quick else 4096
    print(
        f"\n== Large inputs: 1xCx{size}x{size} float32 through the eager API (prepare + run, so the "
        "output is inside the measured peak); peak = pool bytes at the peak incl. the input"
    )
    rows = []
    reps = max(3, args.repeat // 10)
    for name, c, m, s, p, d, algo in LARGE:
        x = opsnn.tensor(rng.standard_normal((1, c, size, size), dtype=np.float32))
        w = (rng.standard_normal((m, c, 3, 3)) / 3).astype(np.float32)
        kw = {} if algo is None else {"algo": algo}
        made = []

        def run(x=x, w=w, s=s, p=p, d=d, kw=kw, made=made):
            made[:] = [opsnn.aclnn.conv2d.prepare(x, w, stride=s, padding=p, dilation=d, **kw)]
            return made[0].run().numpy()

        t, peak = _peak_run(run, reps)
        ex = made[0]
        io = x.nbytes + math.prod(ex.outputs[0].shape) * 4
        row = {
            "name": name,
            "size": size,
            "kernel": ex.kernel_name,
            "median_ms": t,
            "workspace_bytes": ex.workspace_size,
            "peak_bytes": peak + x.nbytes,
            "in_out_bytes": io,
            "peak_over_in_out": (peak + x.nbytes) / io,
        }
        rows.append(row)
        print(
            f"{name:18s} {ex.kernel_name:22s} {t:9.1f} ms  workspace {ex.workspace_size / 2**20:6.1f} MiB  peak "
            f"{row['peak_bytes'] / 2**20:6.0f} MiB / in+out {io / 2**20:6.0f} MiB = {row['peak_over_in_out']:.3f}"
        )
        del made, x
    x = opsnn.tensor(rng.standard_normal((1, 1, size, size), dtype=np.float32))
    for name, fn, k, s, p in [
        ("max_pool 3x3/1", opsnn.ops.max_pool2d, 3, 1, 1),
        ("max_pool 2x2/2", opsnn.ops.max_pool2d, 2, 2, 0),
        ("avg_pool 3x3/1", opsnn.ops.avg_pool2d, 3, 1, 1),
        ("avg_pool 3x3/2", opsnn.ops.avg_pool2d, 3, 2, 1),
    ]:
        t, peak = _peak_run(lambda fn=fn, k=k, s=s, p=p: fn(x, k, s, p).numpy(), reps)
        o = -(-(size + 2 * p - k + 1) // s)
        io = x.nbytes + o * o * 4
        row = {
            "name": name,
            "size": size,
            "median_ms": t,
            "peak_bytes": peak + x.nbytes,
            "in_out_bytes": io,
            "peak_over_in_out": (peak + x.nbytes) / io,
        }
        rows.append(row)
        print(
            f"{name:18s} {'':22s} {t:9.1f} ms  {'':23s} peak {row['peak_bytes'] / 2**20:6.0f} MiB / in+out "
            f"{io / 2**20:6.0f} MiB = {row['peak_over_in_out']:.3f}"
        )
    return rows


# -- OpenMP wait policy ----------------------------------------------------------------------------------------------
_THREAD_PROBE = r"""
import os, statistics, time, json
import opsnn
import numpy as np
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
ex_i = opsnn.aclnn.conv2d.prepare(x, w, padding=1, algo="conv2d_im2col")
ex_w = opsnn.aclnn.conv2d.prepare(x, w, padding=1, algo="conv2d_winograd")
ex_r = opsnn.aclnn.relu.prepare(rng.standard_normal(1 << 18).astype(np.float32))
m1 = rng.standard_normal((256, 256)).astype(np.float32)
def med(f, reps=40):
    for _ in range(3): f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
def relu_chain():
    for _ in range(20): ex_r.run()
def mixed():
    for _ in range(10):
        ex_r.run(); m1 @ m1
print(json.dumps({"im2col conv": med(ex_i.run), "winograd conv": med(ex_w.run),
                  "20x relu 256K": med(relu_chain), "10x (relu 256K + 256^2 sgemm)": med(mixed)}))
"""

THREAD_CONFIGS = {
    "opsnn default (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=10000)": {},
    "OMP_WAIT_POLICY=PASSIVE alone": {"OMP_WAIT_POLICY": "PASSIVE"},
    "libgomp default (GOMP_SPINCOUNT=300000)": {"GOMP_SPINCOUNT": "300000"},
    "GOMP_SPINCOUNT=0": {"GOMP_SPINCOUNT": "0"},
    "opsnn default, OPSNN_MKL=0": {"OPSNN_MKL": "0"},
    "NUMBA_THREADING_LAYER=workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
}


def bench_threads(args, rng) -> dict:
    print("\n== OpenMP wait policy: fresh process per configuration, interleaved rounds")
    rounds = 2 if args.quick else 3
    results: dict = {c: [] for c in THREAD_CONFIGS}
    for _ in range(rounds):
        for cfg, extra in THREAD_CONFIGS.items():
            env = dict(os.environ)
            env.pop("OMP_WAIT_POLICY", None)
            env.pop("GOMP_SPINCOUNT", None)
            env.update(extra)
            out = subprocess.run(
                [sys.executable, "-c", _THREAD_PROBE], env=env, capture_output=True, text=True, timeout=600
            )
            if out.returncode != 0:
                print(f"  {cfg}: failed: {out.stderr[-300:]}")
                continue
            results[cfg].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {}
    for cfg, runs in results.items():
        if not runs:
            continue
        summary[cfg] = {k: [min(r[k] for r in runs), max(r[k] for r in runs)] for k in runs[0]}
        print(f"  {cfg:42s} " + " | ".join(f"{k} {lo:.2f}-{hi:.2f} ms" for k, (lo, hi) in summary[cfg].items()))
    return {"rounds": rounds, "per_round": results, "range_ms": summary}


def _shapes_arg(text: str) -> list:
    """``--shapes 32x768x768,64x768x768`` -> [(32, 768, 768), (64, 768, 768)]."""
    try:
        shapes = [tuple(int(d) for d in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"--shapes: expected MxKxN[,MxKxN...] of positive integers, got {text!r}")
    return shapes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        default="conv,gemm,lowp,attention",
        help="sections: conv,gemm,products,lowp,attention,threads,large",
    )
    ap.add_argument("--repeat", type=int, default=30, help="round-robin rounds per workload")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument(
        "--ghz", type=float, default=0.0, help="products: the clock for the FMA peak (default: /proc/cpuinfo)"
    )
    ap.add_argument(
        "--cores", type=int, default=0, help="products: the cores for the FMA peak (default: this process's)"
    )
    ap.add_argument(
        "--shapes",
        type=_shapes_arg,
        default=None,
        help="products: these MxKxN shapes instead of BERT's and the prefill's (e.g. 32x768x768,64x768x768)",
    )
    ap.add_argument(
        "--conv-filter",
        default="",
        help="conv: only the shapes whose name contains one of these comma-separated strings (e.g. '3x3 64,3x3 128')",
    )
    ap.add_argument("--json", default="bench/results/kernels.json")
    args = ap.parse_args()
    opsnn.init()
    rng = np.random.default_rng(0)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    report = {
        "cpu": autotune.cpu_model(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "load_average_start": os.getloadavg(),
        "repeat": args.repeat,
        "env": {
            k: os.environ.get(k)
            for k in (
                "OPENBLAS_CORETYPE",
                "OPENBLAS_L2_SIZE",
                "OMP_WAIT_POLICY",
                "GOMP_SPINCOUNT",
                "OPENBLAS_NUM_THREADS",
                "NUMBA_NUM_THREADS",
            )
        },
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }
    print(
        f"cpu {report['cpu']}, load average {report['load_average_start']}, OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY')}"
    )
    runners = {
        "conv": bench_conv,
        "gemm": bench_gemm,
        "products": bench_products,
        "lowp": bench_lowp,
        "attention": bench_attention,
        "threads": bench_threads,
        "large": bench_large,
    }
    for s in sections:
        if s not in runners:
            ap.error(f"unknown section {s!r}; choose from {sorted(runners)}")
        report[s] = runners[s](args, rng)
    report["load_average_end"] = os.getloadavg()
    if "conv" in report:
        w = [r for r in report["conv"] if "winograd_vs_im2col" in r and r["w"][1] >= 64 and r["dilation"] == 1]
        report["targets"] = {
            "winograd_vs_im2col_3x3_s1_ge64ch": {r["name"]: r["winograd_vs_im2col"] for r in w},
            "winograd_vs_im2col_cpu_time": {r["name"]: r["winograd_vs_im2col_cpu"] for r in w},
            "winograd_f2_vs_im2col_3x3_s1_ge64ch": {
                r["name"]: r["winograd_f2_vs_im2col"] for r in w if "winograd_f2_vs_im2col" in r
            },
            "best_winograd_vs_im2col_3x3_s1_ge64ch": {
                r["name"]: max(r["winograd_vs_im2col"], r.get("winograd_f2_vs_im2col", 0)) for r in w
            },
            "dilated_winograd_vs_im2col": {
                r["name"]: r["dilated_winograd_vs_im2col"] for r in report["conv"] if "dilated_winograd_vs_im2col" in r
            },
        }
    if "gemm" in report:
        report.setdefault("targets", {})["gemm_fraction_of_numpy_gflops"] = {
            r["name"]: r["fraction_of_numpy"] for r in report["gemm"]
        }
    if report.get("targets"):
        print("\ntargets:", json.dumps(report["targets"], indent=1))
    if args.json:
        write_json(report, args.json, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
