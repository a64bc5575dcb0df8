"""The ``opsnn`` command line: info, run (the main job), conformance.

$ opsnn info
$ opsnn run --batch 4 --repeat 50
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import sys
import time
from collections import Counter

import numpy as np

from .tools.text import shape_arg
from .tools.text import table as _table


def cmd_info(args) -> int:
    import opsnn

    ctx = opsnn.init()
    records = opsnn.ops.all_ops()
    print(f"opsnn {opsnn.__version__}")
    print(f"device: {ctx.device.describe()}")
    from .runtime import cpu as _cpu

    print(f"instruction sets: {_cpu.describe()}")
    from . import _blas_env
    from .runtime import threads

    print(
        f"threads: {threads.policy.mode} ({threads.cores()} cores); OpenBLAS idle-thread timeout "
        f"{os.environ.get('OPENBLAS_THREAD_TIMEOUT')}: "
        + (
            "in effect"
            if _blas_env.effective
            else "NOT in effect (numpy was imported before opsnn; set OPENBLAS_THREAD_TIMEOUT=4 in the environment)"
        )
    )
    from .kernels.cpu import mkl

    why = mkl.unavailable()
    print(
        "packed GEMM for constant weights: "
        + (f"Intel MKL ({mkl.threading_layer()} threads)" if why is None else f"not used ({why})")
    )
    from .kernels.cpu import libraries, onednn
    from .kernels.cpu.blocked import layout_name

    lay = libraries.conv_chain_layout()
    print(
        "blocked convolutions: "
        + (
            f"oneDNN {onednn.version()} on {layout_name(lay.block)}"
            if not isinstance(lay, str)
            else f"not used ({lay})"
        )
    )
    why = onednn.matmul_unavailable()
    print("constant-weight matmuls: " + ("oneDNN's brgemm matmul" if why is None else f"not on oneDNN ({why})"))
    why = onednn.bf16_unavailable()
    print(
        "bfloat16 (mixed precision) convolutions and products: "
        + ("oneDNN's native bf16 kernels (AVX512-BF16)" if why is None else f"not on oneDNN ({why})")
    )
    from .kernels.cpu import libraries

    lib = libraries.gemm_library()
    print(
        f"threaded float32 GEMM: {'Intel MKL' if lib == 'mkl' else 'OpenBLAS (numpy)'}, {libraries.gemm_library_why()}"
    )

    print(f"in one line: {libraries.summary()}")
    n_kernels = Counter(k.backend for r in records for k in r.kernels if not k.fallback)
    print(
        f"operators: {len(records)} registered; kernels: "
        + ", ".join(f"{b}: {n}" for b, n in sorted(n_kernels.items()))
    )
    by_cat = Counter(r.category for r in records)
    print()
    print(_table([[c, n] for c, n in sorted(by_cat.items(), key=lambda kv: (-kv[1], kv[0]))], ["category", "ops"]))
    if args.ops:
        print()
        rows = []
        for r in records:
            fast = [k.name for k in r.kernels if not k.fallback]
            name = f"{r.domain}::{r.name}" if r.domain else r.name
            rows.append(
                [name, r.category, "yes" if r.gradient is not None else "-", ", ".join(fast) or "(reference only)"]
            )
        print(_table(rows, ["op", "category", "gradient", "kernels"]))
    no_fast = [r.name for r in records if all(k.fallback for k in r.kernels)]
    print(f"\nops with a fast kernel: {len(records) - len(no_fast)}; reference only: {len(no_fast)}")
    print(f"ops with a gradient rule: {sum(r.gradient is not None for r in records)}")
    return 0


def _time_runs(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _report_top3(y) -> None:
    import opsnn

    print(f"device: {opsnn.context().device.describe()}")
    top = np.argsort(-y[0])[:3]
    print("top-3 classes (sample 0): " + ", ".join(f"{int(i)}: {y[0, i]:.4f}" for i in top))


def cmd_run(args) -> int:
    if args.model == "smallnet":
        return _run_smallnet(args)
    return _run_resnet50(args)


def _run_resnet50(args) -> int:
    """The main job: ResNet-50 (deterministic random weights) exported to ONNX, imported, compiled
    by the graph engine, checked against the ops' numpy references, timed."""
    import opsnn
    from opsnn.models import resnet50, to_onnx

    opsnn.init()
    t0 = time.perf_counter()
    proto = to_onnx(resnet50(num_classes=1000))
    graph = opsnn.onnx.load(proto)
    cg = opsnn.compile(graph)
    name = proto.graph.input[0].name
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.batch, 3, args.image_size, args.image_size)).astype(np.float32)
    y = next(iter(cg.run({name: x}).values())).numpy()
    first = time.perf_counter() - t0
    with opsnn.kernel_selector({"*": "reference"}):
        ref = next(iter(opsnn.graph.run(graph, {name: x}).values()))
    ref = ref.numpy() if hasattr(ref, "numpy") else np.asarray(ref)
    err = float(np.max(np.abs(y - ref)) / (np.max(np.abs(ref)) + 1e-12))
    times = _time_runs(lambda: next(iter(cg.run({name: x}).values())).numpy(), args.repeat)
    med = statistics.median(times) * 1e3
    rep = cg.pass_report
    mem = cg.memory_report()
    print(f"model: ResNet-50 (random weights, seed {args.seed}), input {x.shape} float32")
    print(
        f"graph: {rep.nodes_before} nodes -> {rep.nodes_after} after passes; arena {mem['arena_bytes'] / 2**20:.1f} MiB "
        f"(naive {mem['naive_bytes'] / 2**20:.1f} MiB)"
    )
    _report_top3(y)
    ok = err <= args.rtol
    print(f"max relative |opsnn - numpy references| = {err:.3e} ({'OK' if ok else 'MISMATCH'}, rtol {args.rtol:g})")
    print(
        f"latency: build + compile + first run {first:.2f} s, median {med:.1f} ms, min {min(times) * 1e3:.1f} ms "
        f"over {args.repeat} runs"
    )
    opsnn.finalize()
    return 0 if ok else 1


def _run_smallnet(args) -> int:
    import opsnn

    opsnn.init()
    net = opsnn.models.SmallConvNet(seed=args.seed)
    x = opsnn.tensor(net.example_input(args.batch))
    t0 = time.perf_counter()
    y = net(x).numpy()
    first = time.perf_counter() - t0
    with opsnn.kernel_selector({"*": "reference"}):
        ref = net(x).numpy()
    err = float(np.max(np.abs(y - ref)))
    times = _time_runs(lambda: net(x).numpy(), args.repeat)
    med = statistics.median(times) * 1e3
    print(
        f"model: SmallConvNet (conv-bn-relu-pool x2, avgpool, linear, softmax), input {tuple(x.shape)} float32, eager"
    )
    _report_top3(y)
    ok = err <= args.atol
    print(f"max |opsnn - numpy reference| = {err:.3e} ({'OK' if ok else 'MISMATCH'}, atol {args.atol:g})")
    print(
        f"latency: first call {first * 1e3:.1f} ms (includes kernel compile/prepare), "
        f"median {med:.3f} ms, min {min(times) * 1e3:.3f} ms over {args.repeat} runs"
    )
    opsnn.finalize()
    return 0 if ok else 1


def cmd_analyze(args) -> int:
    from .tools import trace

    tr = trace.load_trace_events(args.trace)
    rep = trace.analyze(tr, top=args.top)
    print(trace.format_report(rep))
    if args.timeline:
        tr = trace.load_trace_events(args.trace)  # a streamed trace is consumed once
        with open(args.timeline, "w") as f:
            f.write(trace.timeline_html(tr))
        print(f"\nwrote {args.timeline}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rep, f, indent=2, default=list)
    return 0


def cmd_plot(args) -> int:
    import opsnn

    graph = opsnn.onnx.load(args.model)
    if args.optimized:
        graph = opsnn.compile(graph).graph
    out = opsnn.plot_graph(graph, args.output)
    print(f"wrote {out}")
    return 0


def _random_feeds(graph, given: dict, seed: int, cmd: str) -> dict:
    """Seeded random inputs of ``graph``'s input shapes (``given``: name -> shape for symbolic dims)."""
    import opsnn

    rng = np.random.default_rng(seed)
    feeds = {}
    names = [v.name for v in graph.inputs if v.name not in graph.initializers]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise opsnn.errors.ParamInvalidError(
            f"opsnn {cmd}: --shape names {unknown}, not inputs of the model (its inputs: {names})"
        )
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        shape = given.get(v.name)
        if shape is None:
            dims = tuple(v.shape or ())
            if not all(isinstance(d, int) and d >= 0 for d in dims):
                syms = [
                    str(d) if isinstance(d, str) and d else "?" for d in dims if not (isinstance(d, int) and d >= 0)
                ]
                example = ",".join(str(d) if isinstance(d, int) and d >= 0 else (str(d) if d else "?") for d in dims)
                raise opsnn.errors.ParamInvalidError(
                    f"opsnn {cmd}: input {v.name!r} has symbolic dims; give its shape with "
                    f"--shape {v.name}={example} (sizes in place of {', '.join(dict.fromkeys(syms))})"
                    + (", or its data with --inputs" if cmd == "compare" else "")
                )
            shape = dims
        elif v.shape is not None and len(shape) != len(v.shape):
            raise opsnn.errors.ParamInvalidError(
                f"opsnn {cmd}: --shape {v.name} has {len(shape)} dims, the model's input has "
                f"{len(v.shape)} {tuple(v.shape)}"
            )
        dt = v.dtype or np.dtype(np.float32)
        feeds[v.name] = (
            rng.standard_normal(shape).astype(dt) if dt.kind == "f" else rng.integers(0, 2, shape).astype(dt)
        )
    return feeds


def cmd_compare(args) -> int:
    import opsnn

    graph = opsnn.onnx.load(args.model)
    if args.inputs:
        data = np.load(args.inputs)
        feeds = {k: data[k] for k in data.files}
    else:
        feeds = _random_feeds(graph, dict(args.shape), args.seed, "compare")
    dtype = args.dtype
    if "=" in dtype:  # a policy: MatMul=float16,Softmax=float32
        from .errors import ParamInvalidError

        items = dtype.split(",")
        bad = [item for item in items if item.count("=") != 1]
        if bad:
            raise ParamInvalidError(f"compare: --dtype policy items are OP=DTYPE, got {bad[0]!r} in {dtype!r}")
        dtype = dict(item.split("=") for item in items)
    rep = opsnn.tools.precision_compare(graph, feeds, dtype=dtype, tolerance=args.tol)
    print(rep.format(top=args.top))
    return 0


#: the models ``opsnn warmup`` knows by name, as ``opsnn bench`` runs them
WARMUP_MODELS = ("resnet50", "bert", "llama")


def _warm_named(name: str) -> None:
    """Build, compile and run one of ``WARMUP_MODELS`` once (random weights and inputs)."""
    import opsnn
    from opsnn import models

    rng = np.random.default_rng(0)
    if name == "llama":
        from opsnn.llm import generate

        lm = models.llama(layers=12, hidden=768, heads=12, kv_heads=4, vocab=32000, seed=0, max_position=2048)
        generate(lm, rng.integers(0, 32000, 128).astype(np.int64), 4)  # prefill + decode steps
        return
    if name == "resnet50":
        m = models.resnet50(seed=0)
        feeds = {"input": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    else:
        m = models.bert("base", seed=0)
        shape = (1, 128)
        feeds = {
            "input_ids": rng.integers(1, m.config.vocab_size, shape).astype(np.int64),
            "attention_mask": np.ones(shape, np.int64),
            "token_type_ids": np.zeros(shape, np.int64),
        }
    cg = opsnn.compile(opsnn.onnx.load(models.to_onnx(m)))
    [v.numpy() for v in cg.run(feeds).values()]


def cmd_warmup(args) -> int:
    """Compile the kernels of the chosen models into the kernel cache, one model after another."""
    import opsnn
    from opsnn.runtime import kernel_cache

    jobs = [("model", m) for m in (args.models.split(",") if args.models else [])]
    jobs += [("onnx", f) for f in args.onnx]
    if not jobs:
        jobs = [("model", m) for m in WARMUP_MODELS]
    bad = [m for kind, m in jobs if kind == "model" and m not in WARMUP_MODELS]
    if bad:
        raise opsnn.errors.ParamInvalidError(
            f"opsnn warmup: --models {','.join(bad)}: expected names from {','.join(WARMUP_MODELS)}"
        )
    print(f"opsnn warmup: compiling kernels into {kernel_cache.cache_root()}", flush=True)
    total = 0
    tiered = os.environ.get("OPSNN_TIERED")
    os.environ["OPSNN_TIERED"] = "0"  # compile the numba kernels now, and mark them cached for tiered compiles
    try:
        for i, (kind, what) in enumerate(jobs, 1):
            total += _warm_one(args, i, len(jobs), kind, what)
    finally:
        if tiered is None:
            os.environ.pop("OPSNN_TIERED", None)
        else:
            os.environ["OPSNN_TIERED"] = tiered
    print(f"opsnn warmup: done, {total} compiled", flush=True)
    return 0


def _warm_one(args, i: int, n: int, kind: str, what: str) -> int:
    """Warms the ``i``-th of ``n`` jobs of ``cmd_warmup``; returns the kernels it compiled."""
    from numba.core import event

    import opsnn
    from opsnn.ops import tiering
    from opsnn.runtime import kernel_cache

    log = kernel_cache.CompileLog()
    event.register("numba:compile", log)
    t0 = time.perf_counter()
    print(f"[{i}/{n}] {what} ...", flush=True)
    try:
        if kind == "model":
            _warm_named(what)
        else:
            graph = opsnn.onnx.load(what)
            cg = opsnn.compile(graph)
            [v.numpy() for v in cg.run(_random_feeds(graph, dict(args.shape), 0, "warmup")).values()]
    finally:
        event.unregister("numba:compile", log)
    tiering.mark_foreground()  # the model ran: its numba kernels are in the cache
    made = sum(1 for r in log.rows if r["kernel"] == r["top"])
    cpu = sum(r["cpu_s"] for r in log.rows)
    state = (
        f"compiled {made} kernel{'' if made == 1 else 's'} ({len(log.rows)} specializations with what they "
        f"call, {cpu:.1f} s CPU)"
        if made
        else "all kernels cached"
    )
    print(f"[{i}/{n}] {what}: {state} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return made


def cmd_conformance(argv) -> int:
    if "torch-opinfo" in argv or "--suite=torch-opinfo" in argv:  # PyTorch's OpInfo through the torch backend
        from .frontends.torch import opinfo

        return opinfo.main(argv)
    from .onnx import conformance

    return conformance.main(argv)


def _explain(argv) -> int:
    from .tools import explain

    return explain.main(argv)


def bench_module(name: str):
    """``bench/<name>.py`` of the source checkout opsnn runs from, imported; None when opsnn is an
    installed package (the benchmarks and their peers are not part of it)."""
    import importlib.util
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "bench"
    path = folder / f"{name}.py"
    if not path.is_file():
        return None
    module_name = f"opsnn_bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    if str(folder) not in sys.path:  # bench modules import their neighbours by name, as scripts do
        sys.path.append(str(folder))  # last, so that no bench file shadows an installed module
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _bench(argv) -> int:
    models = bench_module("models")
    if models is None:
        print(
            "opsnn bench: the model benchmarks are not installed with opsnn; they live in bench/models.py of "
            "the source repository (run `opsnn bench` or `python bench/models.py` from a clone)",
            file=sys.stderr,
        )
        return 2
    return models.main(argv)


def _generate(argv) -> int:
    from .llm import cli_generate

    return cli_generate(argv)


def _serve_bench(argv) -> int:
    from .llm import cli_serve_bench

    return cli_serve_bench(argv)


def _launch(argv) -> int:
    from .distributed.launch import main as launch_main

    return launch_main(argv)


def _video_bench(argv) -> int:
    from .pipeline import cli_video_bench

    return cli_video_bench(argv)


class _OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors reach the CLI's one error handler (one line, exit code 2)."""

    def error(self, message):
        from .errors import ParamInvalidError

        raise ParamInvalidError(message)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _train(argv) -> int:
    """``opsnn train``: a built-in model on synthetic data; progress, a loss-curve PNG and a checkpoint."""
    from . import trainer
    from .tools.plot import plot_curve

    ap = _OneLineParser(
        prog="opsnn train",
        description="Train a built-in model on synthetic data the command makes (classification for resnet18 and "
        "bert-tiny, next-token prediction for llama-tiny); writes checkpoint.safetensors and loss_curve.png "
        "into --out.",
    )
    d = trainer.TrainConfig()
    ap.add_argument("--model", choices=trainer.MODELS, help=f"default {d.model}")
    ap.add_argument("--steps", type=_positive_int, help=f"the step to train up to (default {d.steps})")
    ap.add_argument("--batch", type=_positive_int, help=f"default {d.batch}")
    ap.add_argument("--dtype", choices=trainer.DTYPES, help="bfloat16: forward and loss under opsnn.autocast")
    ap.add_argument("--optimizer", choices=trainer.OPTIMIZERS, help=f"default {d.optimizer}")
    ap.add_argument("--lr", type=float, help=f"default: {trainer.DEFAULT_LR}")
    ap.add_argument("--seed", type=int, help="weights and data (default 0)")
    ap.add_argument("--image-size", type=_positive_int, help=f"resnet18 (default {d.image_size})")
    ap.add_argument("--seq-len", type=_positive_int, help=f"bert-tiny, llama-tiny (default {d.seq_len})")
    ap.add_argument("--vocab", type=_positive_int, help=f"bert-tiny, llama-tiny (default {d.vocab})")
    ap.add_argument("--num-classes", type=_positive_int, help=f"resnet18, bert-tiny (default {d.num_classes})")
    ap.add_argument("--samples", type=_positive_int, help="size of the synthetic data set (default 4 batches)")
    ap.add_argument(
        "--out",
        help="folder for checkpoint.safetensors and loss_curve.png (default opsnn-train-MODEL; with --resume, "
        "the checkpoint's folder)",
    )
    ap.add_argument("--resume", metavar="CKPT", help="continue from a checkpoint this command wrote, up to --steps")
    ap.add_argument("--log-every", type=_positive_int, default=10, help="steps per progress line off a terminal")
    ap.add_argument(
        "--ddp-backend",
        choices=("mpi",),
        default=os.environ.get("OPSNN_DDP_BACKEND", "").lower() or None,
        help="under mpirun / opsnn launch: train data-parallel over the ranks (DistributedDataParallel; --batch "
        "per rank); default OPSNN_DDP_BACKEND",
    )
    args = ap.parse_args(argv)
    if args.ddp_backend:
        from . import distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(args.ddp_backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        try:
            code = _train_run(args, trainer, plot_curve, rank, world)
        except Exception as exc:  # the other ranks may wait in a collective: end them all, naming this rank
            if world == 1:
                raise
            print(f"opsnn train: rank {rank}: {_error_line(exc)}", file=sys.stderr, flush=True)
            from .distributed.group import default_group

            default_group().abort(2)
            raise
        dist.destroy_process_group()
        return code
    return _train_run(args, trainer, plot_curve, 0, 1)


def _train_run(args, trainer, plot_curve, rank: int, world: int) -> int:
    """``opsnn train``'s job on this rank: progress, curve and summary on rank 0 only."""
    d = trainer.TrainConfig()
    # each rank's lines carry its rank (opsnn launch tags them itself; a bare mpirun does not)
    tag = f"[rank {rank}] " if world > 1 and not os.environ.get("OPSNN_LAUNCH_TAGS") else ""
    fields = [f.name for f in dataclasses.fields(trainer.TrainConfig)]
    given = {k: getattr(args, k) for k in fields if getattr(args, k, None) is not None}
    start = 0
    if args.resume:
        saved, start = trainer.read_resume_config(args.resume)
        given = {**{k: v for k, v in saved.items() if k in fields}, **given}
        if "steps" not in {k for k in fields if getattr(args, k, None) is not None}:
            given["steps"] = start + d.steps
    cfg = trainer.TrainConfig(**given).check()
    out = args.out or (os.path.dirname(os.path.abspath(args.resume)) if args.resume else f"opsnn-train-{cfg.model}")
    progress = trainer.Progress(cfg.steps, start, args.log_every) if rank == 0 else None
    try:
        res = trainer.train(cfg, resume=args.resume, out=out, on_step=progress, ddp=bool(args.ddp_backend))
    finally:
        if progress is not None:
            progress.close()
    if rank != 0:
        print(f"{tag}steps {res.start_step + 1}..{res.step} on {len(res.task.batches)} batches of this rank's shard")
        return 0
    n_params = sum(p.numel for p in res.task.model.parameters())
    png = plot_curve(
        res.losses, os.path.join(out, "loss_curve.png"), title=f"opsnn train --model {cfg.model} ({cfg.dtype})"
    )
    ranks = f" x {world} ranks (DistributedDataParallel, {args.ddp_backend})" if world > 1 else ""
    print(
        f"{tag}model: {cfg.model} ({n_params / 1e6:.2f} M parameters), {cfg.dtype}, {cfg.optimizer} lr "
        f"{cfg.learning_rate:g}, batch {cfg.batch}{ranks}, {len(res.task.batches)} batches of synthetic data"
        + (" per rank" if world > 1 else "")
    )
    print(
        f"{tag}steps {res.start_step + 1}..{res.step}: loss {res.losses[res.start_step]:.4f} -> {res.losses[-1]:.4f}, "
        f"{res.samples_per_s:.1f} samples/s over {res.seconds:.1f} s"
    )
    print(f"{tag}wrote {res.checkpoint} and {os.path.join(out, 'loss_curve.png')} ({png})")
    return 0


#: sub-commands that parse their own arguments: name -> (entry point, help line)
PASS_THROUGH = {
    "conformance": (
        cmd_conformance,
        "run ONNX's node test cases, or PyTorch's OpInfo (--suite torch-opinfo; see --help)",
    ),
    "bench": (_bench, "models side by side with onnxruntime and torch eager (see 'opsnn bench --help')"),
    "fuzz": (
        lambda argv: __import__("opsnn.tools.fuzz", fromlist=["main"]).main(argv),
        "fuzz models, ops, out= views, NaN/Inf and resources for N minutes (see 'opsnn fuzz --help')",
    ),
    "explain": (_explain, "which kernel each node of a model runs, and why (see 'opsnn explain --help')"),
    "generate": (_generate, "generate tokens with the LLaMA-style decoder and a KV cache"),
    "serve-bench": (_serve_bench, "replay a mixed LLM workload: dynamic batching vs one request at a time"),
    "launch": (_launch, "start N ranks of a training script through mpirun, threads shared out, output tagged by rank"),
    "train": (_train, "train resnet18, bert-tiny or llama-tiny on synthetic data (see 'opsnn train --help')"),
    "video-bench": (_video_bench, "video pipeline (decode, preprocess, infer, postprocess): pipelined vs sequential"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; an error opsnn or the OS raises ends it with one line on stderr and exit
    code 2 (``--traceback`` before the command, or ``OPSNN_DEBUG=1``, shows the traceback instead)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    traceback = os.environ.get("OPSNN_DEBUG", "") not in ("", "0")
    while argv and argv[0] == "--traceback":
        traceback = True
        argv.pop(0)
    if hasattr(signal, "SIGPIPE"):  # `opsnn info | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    try:
        return _dispatch(argv)
    except Exception as exc:  # the one place a command's error becomes a message
        if traceback:
            raise
        print(f"opsnn{' ' + command if command else ''}: {_error_line(exc)}", file=sys.stderr)
        return 2


def _error_line(exc: BaseException) -> str:
    from .errors import OpsnnError

    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename!r}" if exc.filename is not None else ""
        return f"{exc.strerror}{where}"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, OpsnnError):
        return msg
    # not an error opsnn reports on purpose: say what it was and how to see where it came from
    return f"{type(exc).__name__}: {msg} (rerun with --traceback or OPSNN_DEBUG=1 for the traceback)"


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in PASS_THROUGH:
        return PASS_THROUGH[argv[0]][0](argv[1:])
    parser = argparse.ArgumentParser(prog="opsnn", description="opsnn: operator library and graph engine")
    parser.add_argument(
        "--traceback", action="store_true", help="show the Python traceback of an error (also OPSNN_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="device, operators by category, kernels")
    p.add_argument("--ops", action="store_true", help="list every op with its kernels")
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser(
        "run",
        help="run ResNet-50 through the graph engine (or the small conv net eagerly), "
        "check it against the numpy references, time it",
    )
    p.add_argument("--model", choices=["resnet50", "smallnet"], default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--rtol", type=float, default=1e-4, help="resnet50: max error relative to the largest logit")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--atol", type=float, default=1e-4)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("analyze", help="summarize a saved profiler trace (hot ops, streams, gaps, suggestions)")
    p.add_argument("trace", help="Chrome trace JSON written by Profile.export_chrome_trace")
    p.add_argument("-t", "--timeline", help="also write a timeline HTML page here")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--json", help="write the report as JSON here")
    p.set_defaults(fn=cmd_analyze)
    p = sub.add_parser("plot", help="draw a model's graph with Graphviz (pdf, svg, png or dot)")
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", default="graph.pdf")
    p.add_argument("--optimized", action="store_true", help="draw the graph after opsnn's passes (fusions shown)")
    p.set_defaults(fn=cmd_plot)
    p = sub.add_parser("compare", help="precision compare: fp32 vs float16/bfloat16/a policy, node by node")
    p.add_argument("model", help="an .onnx file")
    p.add_argument(
        "--dtype", default="float16", help="float16, bfloat16, or a policy like MatMul=float16,Softmax=float32"
    )
    p.add_argument("--inputs", help=".npz with the inputs (default: seeded random inputs of the model's shapes)")
    p.add_argument(
        "--shape",
        action="append",
        type=shape_arg,
        default=[],
        help="input shape for the random inputs, e.g. --shape x=1,3,224,224 (needed for symbolic dims)",
    )
    p.add_argument("--tol", type=float, default=1e-2)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser(
        "warmup",
        help="compile the kernels of the chosen models into the kernel cache ahead of first use",
    )
    p.add_argument("onnx", nargs="*", help=".onnx files to warm up too (run once on seeded random inputs)")
    p.add_argument(
        "--models",
        help=f"comma-separated, from {','.join(WARMUP_MODELS)} (default: all of them unless files are given)",
    )
    p.add_argument(
        "--shape", action="append", type=shape_arg, default=[], help="input shape for symbolic dims, e.g. x=1,3,224,224"
    )
    p.set_defaults(fn=cmd_warmup)
    for name, (_, help_) in PASS_THROUGH.items():
        sub.add_parser(name, help=help_)
    args = parser.parse_args(argv)
    if getattr(args, "batch", 1) < 1 or getattr(args, "repeat", 1) < 1:
        parser.error("--batch and --repeat must be >= 1")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
