"""Conformance on PyTorch's own OpInfo database: ``opsnn conformance --suite torch-opinfo``.

For every entry of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on the CPU, each of its ``sample_inputs`` runs through the opsnn backend and through torch
eager (the oracle), compared with the entry's float32 tolerance (the largest CPU
``toleranceOverride`` it declares, else torch's float32 defaults ``rtol=1.3e-6, atol=1e-5``),
float64 compare, NaN equals NaN, exact shapes and dtypes; ``--dtype bfloat16`` runs the entries
that list bfloat16 with their bfloat16 samples and tolerances (torch's defaults ``rtol=1.6e-2,
atol=1e-5``); ``atol`` is scaled by the output's largest
finite magnitude when that exceeds 1 (a float32 sum's rounding grows with its terms, and OpInfo's
samples reach values in the hundreds).

The sample becomes a module whose tensors are its inputs (Python values are baked in) and goes
through :func:`opsnn.frontends.torch.compile_graph`, what the backend does with the graph Dynamo
hands it (``--dynamo`` runs ``torch.compile(backend=...)`` itself, slower). Each entry is one of

- ``pass``: every sample ran fully on opsnn (no node left to torch) and matched;
- ``fallback``: every sample matched, some node of some sample ran in torch (the reason is logged);
- ``fail``: some sample gave a wrong result or raised where eager torch did not;
- ``skip``: no float32 on the CPU, no sample eager torch accepts, or torch's result depends on the
  random seed (two seeds give two results: nothing to compare exactly).

A crash or a timeout in one entry is recorded and the run goes on::

    $ opsnn conformance --suite torch-opinfo --ops add,mul,nn.functional.relu --out report.json

``--peer inductor`` also runs every sample the entry tested through ``torch.compile(backend="inductor")``
against the same eager result and tolerance, in the same run: the peer ``pass`` es an entry whose samples
all match, ``fail`` s it on a wrong result or an exception, and ``skip`` s it when its own time limit runs
out first (which leaves opsnn's result alone). Inductor compiles a C++ kernel per sample shape: minutes where opsnn takes seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

PASS, FALLBACK, FAIL, SKIP = "pass", "fallback", "fail", "skip"
STATUSES = (PASS, FALLBACK, FAIL, SKIP)

#: torch.testing.assert_close's defaults per dtype (what OpInfo tests use without an override)
DEFAULT_TOLERANCES = {"float32": (1.3e-6, 1e-5), "bfloat16": (1.6e-2, 1e-5)}
DEFAULT_RTOL, DEFAULT_ATOL = DEFAULT_TOLERANCES["float32"]
DTYPES = tuple(DEFAULT_TOLERANCES)


@dataclass
class EntryResult:
    name: str  # op name, ".variant" when the entry has one
    status: str
    samples: int = 0
    on_opsnn: int = 0  # samples fully on opsnn
    on_torch: int = 0  # samples with some node left to torch
    wrong: int = 0  # samples whose result differs from eager (or raised where eager did not)
    reason: str = ""  # the first failure, fallback or skip reason
    fallback_ops: list = field(default_factory=list)  # ATen ops left to torch (first few)
    seconds: float = 0.0
    peer_status: str = ""  # the peer's pass / fail on the same samples ("" without a peer)
    peer_wrong: int = 0
    peer_reason: str = ""


@dataclass
class Report:
    results: list
    seconds: float = 0.0
    dynamo: bool = False
    dtype: str = "float32"
    peer: str | None = None  # the peer backend's name

    def totals(self) -> dict:
        t = {s: sum(1 for r in self.results if r.status == s) for s in STATUSES}
        t["total"] = len(self.results)
        t["wrong_samples"] = sum(r.wrong for r in self.results)
        if self.peer:
            t["peer"] = {s: sum(1 for r in self.results if r.peer_status == s) for s in STATUSES}
            t["peer"]["wrong_samples"] = sum(r.peer_wrong for r in self.results)
        return t

    def to_json(self) -> dict:
        import torch

        from ...version import __version__

        return {
            "suite": "torch-opinfo",
            "opsnn": __version__,
            "torch": torch.__version__,
            "path": "torch.compile (Dynamo)" if self.dynamo else "compile_graph (the backend, no Dynamo)",
            "dtype": self.dtype,
            "peer": self.peer,
            "seconds": round(self.seconds, 1),
            "totals": self.totals(),
            "entries": {
                r.name: {
                    "status": r.status,
                    "samples": r.samples,
                    "on_opsnn": r.on_opsnn,
                    "on_torch": r.on_torch,
                    "wrong": r.wrong,
                    "reason": r.reason,
                    "fallback_ops": r.fallback_ops,
                    "seconds": round(r.seconds, 3),
                    **(
                        {"peer": {"status": r.peer_status, "wrong": r.peer_wrong, "reason": r.peer_reason}}
                        if self.peer
                        else {}
                    ),
                }
                for r in self.results
            },
        }


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def entries(names=None, limit: int | None = None) -> list:
    """OpInfo entries of ``op_db`` (those named in ``names`` -- an op name matches all its variants,
    ``name.variant`` one of them -- in op_db's order), at most ``limit``."""
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = list(op_db)
    if names:
        wanted = set(names)
        chosen = [op for op in op_db if op.name in wanted or entry_name(op) in wanted]
        unknown = wanted - {op.name for op in op_db} - {entry_name(op) for op in op_db}
        if unknown:
            raise ValueError(f"opsnn conformance: --ops names no OpInfo entry {sorted(unknown)}")
    return chosen[:limit] if limit else chosen


def tolerance(op, dtype: str = "float32") -> tuple:
    """``(rtol, atol)`` for ``dtype``: the largest CPU ``toleranceOverride`` the entry declares for
    it, else torch's defaults for that dtype."""
    import torch

    rtol, atol = DEFAULT_TOLERANCES[dtype]
    for info in getattr(op, "decorators", ()) or ():
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for d in getattr(info, "decorators", ()) or ():
            tol = getattr(d, "d", None)
            t32 = tol.get(getattr(torch, dtype)) if isinstance(tol, dict) else None
            if hasattr(t32, "rtol") and hasattr(t32, "atol"):  # a few entries hold bare floats: not tolerances
                rtol, atol = max(rtol, t32.rtol), max(atol, t32.atol)
    return rtol, atol


def _module(torch, op, sample):
    """``(module, tensors)``: ``module(*tensors)`` calls the op on the sample; its tensors are the inputs."""
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    fn = op.op

    class Sample(torch.nn.Module):
        def forward(self, *tensors):
            vals = list(leaves)
            for i, t in zip(idx, tensors):
                vals[i] = t
            x, args, kwargs = pytree.tree_unflatten(vals, spec)
            return fn(x, *args, **kwargs)

    return Sample(), [leaves[i] for i in idx]


def _flat(torch, out) -> list:
    from torch.utils import _pytree as pytree

    return [x for x in pytree.tree_leaves(out)]


def _as_array(torch, x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.layout != torch.strided:  # sparse results compare by value
            x = x.to_dense()
        if x.dtype == torch.bfloat16:
            return x.float().numpy()
        if x.dtype == torch.complex32:  # no numpy dtype: compared as complex64
            x = x.to(torch.complex64)
        if x.is_conj():
            x = x.resolve_conj()
        if x.is_neg():
            x = x.resolve_neg()
        return x.numpy()
    return x


def _compare(torch, want, got, rtol: float, atol: float) -> str | None:
    from ...onnx.conformance import compare

    w, g = _flat(torch, want), _flat(torch, got)
    if len(w) != len(g):
        return f"{len(g)} outputs, expected {len(w)}"
    for i, (a, b) in enumerate(zip(w, g)):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return f"output {i}: {type(b).__name__}, expected {type(a).__name__}"
        if not isinstance(a, torch.Tensor):
            if not (a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b))):
                return f"output {i}: {b!r}, expected {a!r}"
            continue
        if a.dtype != b.dtype:  # checked here: a bfloat16 result is compared as float32 below
            return f"output {i}: dtype {b.dtype}, expected {a.dtype}"
        a, b = _as_array(torch, a), _as_array(torch, b)
        with np.errstate(all="ignore"):
            finite = np.abs(a[np.isfinite(a)]) if a.dtype.kind in "fc" else np.abs(a)
        scale = float(finite.max()) if finite.size else 1.0
        why = compare(a, b, rtol, atol * max(1.0, scale), f"output {i}")
        if why:
            return why
    return None


def _clone(torch, tensors) -> list:
    return [t.clone() for t in tensors]


def _eager(torch, mod, tensors, seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():
        return mod(*_clone(torch, tensors))


def _seeded(torch, mod, tensors) -> bool:
    """Whether the sample's ATen graph draws random numbers (a seed-dependent result)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        gm = make_fx(mod, tracing_mode="fake")(*tensors)
    except Exception:  # noqa: BLE001 - untraceable: the seed check on eager results decides
        return False
    return any(
        torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def run_entry(
    op,
    *,
    timeout: float | None = 120.0,
    dynamo: bool = False,
    max_samples: int | None = None,
    dtype: str = "float32",
    peer: str | None = None,
):
    """Every ``dtype`` sample of OpInfo entry ``op`` through opsnn and torch eager; an :class:`EntryResult`.
    ``peer``: a torch.compile backend (``"inductor"``, or a backend callable) run on the same samples afterwards."""
    import torch

    from ...onnx.conformance import _reason, _time_limit
    from . import compile_graph

    name = entry_name(op)
    t0 = time.perf_counter()
    res = EntryResult(name, SKIP)
    if getattr(torch, dtype) not in op.supported_dtypes("cpu"):
        res.reason = f"no {dtype} on the CPU"
        return res
    rtol, atol = tolerance(op, dtype)
    fallback_ops: list = []
    first_fallback = ""
    random = False
    tested = []  # (module, tensors, eager result) of every sample compared: the peer's cases
    try:
        with _time_limit(timeout) as deadline, warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            samples = list(op.sample_inputs("cpu", getattr(torch, dtype), requires_grad=False))
            for sample in samples[:max_samples] if max_samples else samples:
                mod, tensors = _module(torch, op, sample)
                try:
                    want = _eager(torch, mod, tensors, 0)
                except Exception:  # noqa: BLE001 - a sample eager torch refuses is no test
                    continue
                if _seeded(torch, mod, tensors) or _compare(torch, want, _eager(torch, mod, tensors, 1), 0.0, 0.0):
                    random = True
                    continue
                res.samples += 1
                tested.append((mod, tensors, want))
                reports = []
                try:
                    torch.manual_seed(0)
                    if dynamo:

                        def be(gm, example_inputs):
                            fn, rep = compile_graph(gm, example_inputs)
                            reports.append(rep)
                            return fn

                        torch._dynamo.reset()
                        compiled = torch.compile(mod, backend=be, dynamic=False)
                        with torch.no_grad():
                            got = compiled(*_clone(torch, tensors))
                    else:
                        fn, rep = compile_graph(mod, _clone(torch, tensors))
                        reports.append(rep)
                        with torch.no_grad():
                            got = fn(*_clone(torch, tensors))
                    why = _compare(torch, want, got, rtol, atol)
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    if deadline.fired:
                        raise
                    why = "raised " + _reason(exc)
                if why:
                    res.wrong += 1
                    if not res.reason or res.status != FAIL:
                        res.reason = f"sample {res.samples - 1}: {why}"
                    res.status = FAIL
                    continue
                falls = [f for r in reports for f in r.fallbacks]
                whole = [r.whole_graph_reason for r in reports if r.whole_graph_reason]
                if falls or whole or not reports:
                    res.on_torch += 1
                    for _node, target, reason in falls:
                        if target not in fallback_ops:
                            fallback_ops.append(target)
                        first_fallback = first_fallback or f"{target}: {reason}"
                    if whole and not first_fallback:
                        first_fallback = whole[0]
                    if not reports:
                        first_fallback = first_fallback or "Dynamo ran it without calling the backend"
                elif any(r.partitions for r in reports):
                    res.on_opsnn += 1
                # else: a graph with no ATen op (an alias of its input), nothing ran anywhere
    except Exception as exc:  # noqa: BLE001 - a crash or a timeout ends this entry only
        res.status, res.wrong = FAIL, res.wrong + 1
        res.reason = "entry: " + _reason(exc)
    if res.status != FAIL:
        if res.on_torch:
            res.status, res.reason = FALLBACK, first_fallback
        elif res.on_opsnn:
            res.status = PASS
        else:
            res.status = SKIP
            res.reason = (
                "torch's result depends on the random seed"
                if random
                else "no sample eager torch accepts"
                if not res.samples
                else "no sample has an ATen op to run"
            )
    res.fallback_ops = fallback_ops[:8]
    if peer and res.status != SKIP and tested:
        _run_peer(torch, peer, res, tested, rtol, atol, timeout)
    res.seconds = time.perf_counter() - t0
    return res


def _run_peer(torch, peer: str, res: EntryResult, tested: list, rtol: float, atol: float, timeout) -> None:
    """The samples opsnn was tested on through ``torch.compile(backend=peer)``, against the same eager
    results; into ``res.peer_*``. Its own time limit: a slow peer never changes opsnn's result; one that
    runs out of time with no wrong sample so far is ``skip`` (no verdict), not ``fail``."""
    from ...onnx.conformance import _reason, _time_limit

    res.peer_status = PASS
    deadline = None
    try:
        with _time_limit(timeout) as deadline, warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for k, (mod, tensors, want) in enumerate(tested):
                try:
                    torch._dynamo.reset()
                    torch.manual_seed(0)
                    compiled = torch.compile(mod, backend=peer, dynamic=False)
                    with torch.no_grad():
                        why = _compare(torch, want, compiled(*_clone(torch, tensors)), rtol, atol)
                except Exception as exc:  # noqa: BLE001 - recorded against the peer
                    if deadline.fired:
                        raise
                    why = "raised " + _reason(exc)
                if why:
                    res.peer_wrong += 1
                    res.peer_status = FAIL
                    res.peer_reason = res.peer_reason or f"sample {k}: {why}"
    except Exception as exc:  # noqa: BLE001 - its time limit (skipped: no verdict), or a crash (fails)
        timed_out = deadline is not None and deadline.fired and res.peer_status == PASS
        res.peer_status = SKIP if timed_out else FAIL
        res.peer_reason = res.peer_reason or ("peer: " if timed_out else "entry: ") + _reason(exc)
    finally:
        torch._dynamo.reset()


def run(
    ops,
    *,
    timeout: float | None = 120.0,
    dynamo: bool = False,
    progress: bool | None = None,
    out: str | None = None,
    dtype: str = "float32",
    peer: str | None = None,
) -> Report:
    """Run the OpInfo entries ``ops``; never stops on a failing entry. ``out``: a JSON report path,
    rewritten every 16 entries (a long run stopped early keeps what it did)."""
    from tqdm import tqdm

    if progress is None:
        progress = sys.stderr.isatty()
    report = Report([], dynamo=dynamo, dtype=dtype, peer=getattr(peer, "__name__", peer))
    t0 = time.perf_counter()
    bar = tqdm(ops, desc="torch-opinfo", unit="entry", disable=not progress, file=sys.stderr)
    for i, op in enumerate(bar):
        try:
            r = run_entry(op, timeout=timeout, dynamo=dynamo, dtype=dtype, peer=peer)
        except Exception as exc:  # noqa: BLE001 - the harness itself failed on this entry: recorded, the run goes on
            r = EntryResult(entry_name(op), FAIL, reason=f"harness: {type(exc).__name__}: {exc}")
        report.results.append(r)
        if not progress:  # a line per entry where no bar shows (a log file, CI)
            print(f"[{i + 1}/{len(ops)}] {r.name}: {r.status} ({r.seconds:.1f} s)", file=sys.stderr, flush=True)
        if i % 16 == 15:
            gc.collect()
            if out:
                report.seconds = time.perf_counter() - t0
                _write(report, out)
    bar.close()
    report.seconds = time.perf_counter() - t0
    return report


def _write(report: Report, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.to_json(), f, indent=1)


def format_table(report: Report) -> str:
    peer = [report.peer] if report.peer else []
    head = ["entry", "status", "samples", "opsnn", "torch", "wrong", *peer, "reason"]
    rows = [
        [r.name, r.status, str(r.samples), str(r.on_opsnn), str(r.on_torch), str(r.wrong)]
        + ([r.peer_status or "-"] if peer else [])
        + [(r.reason or r.peer_reason)[:90]]
        for r in report.results
    ]
    widths = [max([len(head[i])] + [len(row[i]) for row in rows]) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in [head] + rows)


def main(argv: list[str] | None = None) -> int:
    """``opsnn conformance --suite torch-opinfo``: OpInfo entries through the opsnn backend."""
    p = argparse.ArgumentParser(
        prog="opsnn conformance --suite torch-opinfo",
        description="Run PyTorch's OpInfo samples (CPU) through the opsnn torch backend against torch eager.",
    )
    p.add_argument("--suite", choices=("torch-opinfo",), default="torch-opinfo")
    p.add_argument("--ops", metavar="A,B", help="only these entries (op names, or name.variant)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N entries")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per entry (default 120; 0 = none)")
    p.add_argument("--dynamo", action="store_true", help="through torch.compile (Dynamo) rather than the backend")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the samples' dtype (default float32)")
    p.add_argument(
        "--peer", choices=("inductor",), default=None, help="also run the samples through this torch.compile backend"
    )
    p.add_argument("--out", "--report", dest="out", metavar="PATH", default="torch-opinfo-report.json")
    p.add_argument("--min-pass", type=int, default=None, metavar="N", help="exit 1 when fewer than N entries pass")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = p.parse_args(argv)

    ops = entries(args.ops.split(",") if args.ops else None, args.limit)
    out = args.out if args.out and args.out != "-" else None
    report = run(
        ops,
        timeout=args.timeout or None,
        dynamo=args.dynamo,
        progress=args.progress,
        out=out,
        dtype=args.dtype,
        peer=args.peer,
    )
    print(format_table(report))
    t = report.totals()
    print(
        f"\n{t[PASS]} pass (every sample on opsnn), {t[FALLBACK]} fell back to torch, {t[FAIL]} fail, "
        f"{t[SKIP]} skipped, of {t['total']} entries; {t['wrong_samples']} wrong samples; {report.seconds:.1f} s"
    )
    if report.peer:
        q = t["peer"]
        print(
            f"{report.peer} on the same samples: {q[PASS]} pass, {q[FAIL]} fail ({q['wrong_samples']} wrong or "
            f"raising samples), {q[SKIP]} out of time, of the {t['total'] - t[SKIP]} entries opsnn tested"
        )
    if out:
        _write(report, out)
        print(f"report written to {os.path.abspath(out)}")
    if t[FAIL] or (args.min_pass is not None and t[PASS] < args.min_pass):
        return 1
    return 0


__all__ = ["EntryResult", "Report", "entries", "main", "run", "run_entry", "tolerance"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
