"""Cold and warm start per model: import + load + compile + first run, each in a fresh process.

A cold run starts with an empty kernel cache (a new temporary ``OPSNN_KERNEL_CACHE_DIR``), so numba
compiles every kernel specialization the model touches; the warm run that follows reuses that
cache in another fresh process. Each child also lists what numba compiled (``numba:compile``
events: kernel, argument types, seconds with nested compiles subtracted) and how many
specializations it loaded from the cache.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/cold_start.py \
        --models light_resnet50,resnet50,bert,llama --json bench/results/cold_start.json

``--kernels N`` prints the N slowest kernels per model (with the compiles each pulled in);
``--keep DIR`` keeps each model's cache under DIR. onnxruntime's import-to-first-result time is measured the same way when it is
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


def _name(dispatcher) -> str:
    return f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}"


def compile_log():
    """Records ``numba:compile`` events in ``.rows``: (kernel, signature, inclusive s, exclusive s, the
    outermost kernel whose compile pulled this one in)."""
    from numba.core import event

    class CompileLog(event.Listener):
        def __init__(self):
            self.rows: list = []
            self._stack: list = []

        def on_start(self, ev):
            if not self._stack:
                self._top = _name(ev.data["dispatcher"])
            self._stack.append([time.perf_counter(), 0.0])

        def on_end(self, ev):
            start, nested = self._stack.pop()
            took = time.perf_counter() - start
            if self._stack:
                self._stack[-1][1] += took
            self.rows.append(
                (
                    _name(ev.data["dispatcher"]),
                    ", ".join(str(a) for a in ev.data["args"]),
                    took,
                    took - nested,
                    self._top,
                )
            )

    log = CompileLog()
    event.register("numba:compile", log)
    return log


def _cache_stats() -> dict:
    import gc

    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    for obj in gc.get_objects():
        if isinstance(obj, CPUDispatcher):
            hits += sum(obj.stats.cache_hits.values())
            misses += sum(obj.stats.cache_misses.values())
    return {"cache_hits": hits, "cache_misses": misses}


def child(model: str) -> dict:
    """Runs in the fresh process: times import .. first result, and logs what numba compiled."""
    t0 = time.perf_counter()
    import numpy as np

    log = compile_log()
    import opsnn
    from opsnn.tools import benchmark as B

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
    t1 = time.perf_counter()
    run()
    second = time.perf_counter() - t1
    from numba.core import event

    event.unregister("numba:compile", log)
    rows = sorted(log.rows, key=lambda r: -r[3])
    return {
        "model": model,
        "import_s": t_import,
        "first_s": first,
        "second_s": second,
        "compiles": len(rows),
        "compile_s": sum(r[3] for r in rows),
        **_cache_stats(),
        "kernels": [{"kernel": k, "args": a, "s": s, "exclusive_s": e, "top": t} for k, a, s, e, t in rows],
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
    """(kernel called from Python, compiles it pulled in, seconds) per top-level compile, slowest first."""
    acc: dict = {}
    for k in kernels:
        n, secs = acc.get(k["top"], (0, 0.0))
        acc[k["top"]] = (n + 1, secs + k["exclusive_s"])
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
    print(f"{'model':<16}{'cold s':>8}{'warm s':>8}{'compiles':>10}{'compile s':>11}{'cache hits':>12}")
    for model in args.models.split(","):
        root = os.path.join(args.keep, model) if args.keep else tempfile.mkdtemp(prefix="opsnn-cold-")
        env = dict(os.environ, OPSNN_KERNEL_CACHE_DIR=root)
        env.pop("NUMBA_CACHE_DIR", None)
        cold = spawn(["--child", model], env)
        warm = spawn(["--child", model], env)
        results["models"][model] = {"cold": cold, "warm": warm}
        print(
            f"{model:<16}{cold['first_s']:>8.2f}{warm['first_s']:>8.2f}{cold['compiles']:>10}"
            f"{cold['compile_s']:>11.2f}{warm['cache_hits']:>12}"
        )
        ort = results.get("onnxruntime")
        if ort and model == "light_resnet50":
            print(
                f"    cold / onnxruntime {cold['first_s'] / ort['first_s']:.1f}x, "
                f"warm / onnxruntime {warm['first_s'] / ort['first_s']:.1f}x"
            )
        for top, n, secs in by_top(cold["kernels"])[: args.kernels]:
            print(f"    {secs:7.2f} s  {n:3d} compiles  {top}")
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
