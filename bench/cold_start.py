"""Cold and warm start per model: import + load + compile + first run, each in a fresh process.

A cold run starts with an empty kernel cache (a new temporary ``OPSNN_KERNEL_CACHE_DIR``), so numba
compiles every kernel specialization the model touches; the warm run that follows reuses that
cache in another fresh process. Each child also lists what numba compiled (``numba:compile``
events through ``kernel_cache.CompileLog``: kernel, argument types, CPU seconds of the compiling
thread with nested compiles subtracted, which stay meaningful on a loaded machine), the process's
CPU seconds to the first result, and how many specializations it loaded from the cache.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/cold_start.py \
        --models light_resnet50,resnet50,bert,llama --json bench/results/cold_start.json

``--kernels N`` prints the N costliest kernels per model (CPU seconds) (with the compiles each pulled in);
``--keep DIR`` keeps each model's cache under DIR. With tiered compilation on (``OPSNN_TIERED``, the
default) the cold child waits for its background compile after its two runs, so the warm run
finds the numba kernels; ``OPSNN_TIERED=0`` measures compiling everything in the foreground. onnxruntime's import-to-first-result time is measured the same way when it is
installed (``--no-ort`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ("light_resnet50", "resnet50", "resnet50_b8", "bert", "llama")


def _light_resnet50() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx")


def compile_log():
    """A registered ``kernel_cache.CompileLog``: one row per compile (kernel, args, CPU seconds of
    the compiling thread and wall seconds, nested compiles subtracted, the outermost kernel)."""
    from numba.core import event

    from opsnn.runtime.kernel_cache import CompileLog

    log = CompileLog(os.environ.get("OPSNN_COMPILE_LOG"))
    event.register("numba:compile", log)
    return log


def _cache_stats() -> dict:
    import gc

    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    gc.unfreeze()  # import opsnn froze its dispatchers (OPSNN_GC_FREEZE): get_objects lists them again
    for obj in gc.get_objects():
        if isinstance(obj, CPUDispatcher):
            hits += sum(obj.stats.cache_hits.values())
            misses += sum(obj.stats.cache_misses.values())
    return {"cache_hits": hits, "cache_misses": misses}


def child(model: str) -> dict:
    """Runs in the fresh process: times import .. first result, and logs what numba compiled."""
    t0 = time.perf_counter()
    import models as B  # bench/models.py, beside this script
    import numpy as np

    import opsnn

    log = compile_log()

    t_import = time.perf_counter() - t0
    if model == "light_resnet50":
        g = opsnn.onnx.load(_light_resnet50())
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        cg = opsnn.compile(g)
        run = lambda: [v.numpy() for v in cg.run([x])]
    elif model == "llama":
        spec = B.specs()[model]
        lm = B.build_model(spec)
        prompt = B.make_inputs(spec, lm)["prompt"]
        run = lambda: B._opsnn_generate(lm, prompt, 4)  # prefill + 3 decode steps
    else:
        spec = B.specs()[model]
        m = B.build_model(spec)
        feeds = B.make_inputs(spec, m)
        cg = opsnn.compile(opsnn.onnx.load(opsnn.models.to_onnx(m)))
        run = lambda: {k: v.numpy() for k, v in cg.run(feeds).items()}
    run()
    first = time.perf_counter() - t0
    first_cpu = time.process_time()
    t1 = time.perf_counter()
    run()
    second = time.perf_counter() - t1
    from numba.core import event

    from opsnn.ops import tiering

    event.unregister("numba:compile", log)
    t2 = time.perf_counter()
    tiering.wait()  # the background compile (OPSNN_TIERED): the warm run that follows picks its kernels
    background = {**tiering.status(), "wait_s": time.perf_counter() - t2}
    rows = sorted(log.rows, key=lambda r: -r["cpu_s"])
    return {
        "model": model,
        "import_s": t_import,
        "first_s": first,
        "first_cpu_s": first_cpu,
        "second_s": second,
        "compiles": len(rows),
        "compile_s": sum(r["wall_s"] for r in rows),
        "compile_cpu_s": sum(r["cpu_s"] for r in rows),
        **_cache_stats(),
        "background": background,
        "kernels": rows,
    }


def ort_child() -> dict:
    t0 = time.perf_counter()
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(_light_resnet50(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess.run(None, {sess.get_inputs()[0].name: x})
    return {"model": "light_resnet50", "first_s": time.perf_counter() - t0}


def by_top(kernels: list) -> list:
    """(kernel called from Python, compiles it pulled in, CPU seconds) per top-level compile, costliest first."""
    acc: dict = {}
    for k in kernels:
        n, secs = acc.get(k["top"], (0, 0.0))
        acc[k["top"]] = (n + 1, secs + k["cpu_s"])
    return sorted(((t, n, s) for t, (n, s) in acc.items()), key=lambda r: -r[2])


def spawn(args: list, env: dict) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        subprocess.run([sys.executable, os.path.abspath(__file__), *args, "--out", out], env=env, check=True)
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--kernels", type=int, default=15, help="list the N slowest compiles per model")
    ap.add_argument("--keep", help="keep each model's kernel cache under this directory")
    ap.add_argument("--no-ort", dest="ort", action="store_false")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        res = ort_child() if args.child == "ort" else child(args.child)
        with open(args.out, "w") as f:
            json.dump(res, f)
        return 0
    results = {"argv": sys.argv, "models": {}}
    if args.ort:
        try:
            import onnxruntime  # noqa: F401

            results["onnxruntime"] = spawn(["--child", "ort"], dict(os.environ))
            print(f"onnxruntime light_resnet50: import to first result {results['onnxruntime']['first_s']:.2f} s")
        except ImportError:
            pass
    print(
        f"{'model':<16}{'cold s':>8}{'warm s':>8}{'cold cpu s':>12}{'compiles':>10}{'compile cpu s':>15}{'cache hits':>12}"
    )
    for model in args.models.split(","):
        root = os.path.join(args.keep, model) if args.keep else tempfile.mkdtemp(prefix="opsnn-cold-")
        env = dict(os.environ, OPSNN_KERNEL_CACHE_DIR=root)
        env.pop("NUMBA_CACHE_DIR", None)
        cold = spawn(["--child", model], env)
        warm = spawn(["--child", model], env)
        results["models"][model] = {"cold": cold, "warm": warm}
        print(
            f"{model:<16}{cold['first_s']:>8.2f}{warm['first_s']:>8.2f}{cold['first_cpu_s']:>12.2f}"
            f"{cold['compiles']:>10}{cold['compile_cpu_s']:>15.2f}{warm['cache_hits']:>12}"
        )
        ort = results.get("onnxruntime")
        if ort and model == "light_resnet50":
            print(
                f"    cold / onnxruntime {cold['first_s'] / ort['first_s']:.1f}x, "
                f"warm / onnxruntime {warm['first_s'] / ort['first_s']:.1f}x"
            )
        bg = cold["background"]
        if bg["done"] or bg["failed"]:
            print(
                f"    background compile: {bg['done']} workloads ({len(bg['failed'])} failed), "
                f"{bg['wait_s']:.1f} s more after the second run"
            )
        for top, n, secs in by_top(cold["kernels"])[: args.kernels]:
            print(f"    {secs:7.2f} cpu s  {n:3d} compiles  {top}")
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
