"""Conformance harness: ONNX's node test cases and light model zoo through opsnn.

Every case runs in isolation (exceptions and a per-case timeout are caught and
recorded), outputs are compared with the case's rtol/atol as float64 (NaN equals NaN,
shapes and dtypes must match), and the run ends with a per-op-type table, totals and a
JSON report listing every failure with its reason. ``--peer onnxruntime`` runs
onnxruntime on the same cases for a side-by-side table; the stored onnxruntime results
(``shared/conformance/onnxruntime-node-cases.json``) show where opsnn is ahead::

    $ opsnn conformance --filter 'conv|pool' --report report.json
    >>> from opsnn.onnx import conformance
    >>> report = conformance.run(conformance.node_cases("^test_relu$"))   # doctest: +SKIP
    >>> report.totals()                                                  # doctest: +SKIP
    {'pass': 1, 'fail': 0, 'unsupported': 0, 'total': 1}
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
STATUSES = (PASS, FAIL, UNSUPPORTED)
LIGHT_OP = "(light models)"


@dataclass
class Case:
    """One conformance case: a model, its inputs, expected outputs and tolerances."""

    name: str
    model: Any  # onnx.ModelProto
    inputs: list
    outputs: list
    rtol: float = 1e-3
    atol: float = 1e-7
    kind: str = "node"
    op: str = "?"


@dataclass
class Result:
    name: str
    op: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    kind: str = "node"


@dataclass
class Report:
    """Results of one run (and optionally of a peer on the same cases)."""

    results: list[Result]
    peer: str | None = None
    peer_results: dict[str, Result] = field(default_factory=dict)
    baseline: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def totals(self, kind: str | None = None) -> dict:
        rs = [r for r in self.results if kind is None or r.kind == kind]
        t = {s: sum(1 for r in rs if r.status == s) for s in STATUSES}
        t["total"] = len(rs)
        return t

    def by_op(self) -> dict[str, dict]:
        table: dict[str, dict] = {}
        for r in self.results:
            row = table.setdefault(r.op, {s: 0 for s in STATUSES} | {"total": 0})
            row[r.status] += 1
            row["total"] += 1
            p = self.peer_results.get(r.name)
            if p is not None:
                row[f"peer_{p.status}"] = row.get(f"peer_{p.status}", 0) + 1
        return dict(sorted(table.items()))

    def ahead(self) -> list[str]:
        """Cases opsnn passes that the peer (this run's, else the stored baseline) does not."""
        ref = {k: v.status for k, v in self.peer_results.items()} or self.baseline
        return sorted(
            r.name for r in self.results if r.status == PASS and ref.get(r.name, PASS) != PASS and r.name in ref
        )

    def behind(self) -> list[str]:
        ref = {k: v.status for k, v in self.peer_results.items()} or self.baseline
        return sorted(r.name for r in self.results if r.status != PASS and ref.get(r.name) == PASS)

    def to_json(self) -> dict:
        import onnx

        from ..version import __version__

        out = {
            "opsnn": __version__,
            "onnx": onnx.__version__,
            "seconds": round(self.seconds, 1),
            "totals": self.totals(),
            "totals_node": self.totals("node"),
            "totals_light": self.totals("light"),
            "by_op": self.by_op(),
            "failures": [
                {"case": r.name, "op": r.op, "status": r.status, "reason": r.reason}
                for r in self.results
                if r.status != PASS
            ],
            "cases": {r.name: r.status for r in self.results},
            "seconds_per_case": {r.name: round(r.seconds, 3) for r in self.results},
        }
        ref_name = self.peer or ("onnxruntime (stored baseline)" if self.baseline else None)
        if ref_name:
            out["peer"] = ref_name
            out["ahead_of_peer"] = self.ahead()
            out["behind_peer"] = self.behind()
        if self.peer_results:
            out["peer_cases"] = {k: v.status for k, v in self.peer_results.items()}
            out["peer_failures"] = [
                {"case": v.name, "status": v.status, "reason": v.reason}
                for v in self.peer_results.values()
                if v.status != PASS
            ]
        return out


# -- collecting cases -------------------------------------------------------------------------------------
def _normalize(x):
    import onnx
    from onnx import numpy_helper

    if x is None:
        return None
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, onnx.SequenceProto):
        return [numpy_helper.to_array(t) for t in x.tensor_values]
    if isinstance(x, (list, tuple)):
        return [_normalize(e) for e in x]
    if isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def case_op(model, name: str, by_name: dict | None = None) -> str:
    """The op type a case tests: its single non-Constant node, else the op of the case it
    expands (``test_x_expanded`` -> op of ``test_x``), else its first node."""
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    if len(set(ops)) == 1:
        return ops[0]
    base = re.sub(r"_expanded.*$", "", name)
    if by_name is not None and base != name and base in by_name:
        return case_op(by_name[base], base, None)
    return ops[0] if ops else "Constant"


def node_cases(filter: str | None = None) -> list[Case]:
    """ONNX's node test cases (in memory), optionally those whose name matches ``filter``."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases(None)
    rx = re.compile(filter) if filter else None
    by_name = {c.name: c.model for c in raw}
    cases = []
    for c in raw:
        if rx is not None and not rx.search(c.name):
            continue
        ins, outs = c.data_sets[0]
        cases.append(
            Case(
                c.name,
                c.model,
                [_normalize(x) for x in ins],
                [_normalize(x) for x in outs],
                float(c.rtol),
                float(c.atol),
                "node",
                case_op(c.model, c.name, by_name),
            )
        )
    return cases


def light_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_cases(filter: str | None = None) -> list[Case]:
    """The light model zoo shipped in the onnx package: ``light_<name>.onnx`` with expected
    outputs in ``light_<name>_output_<i>.pb``; inputs are ``arange(n) / n`` in the declared
    shape (unknown dims = 1), as ONNX's own backend runner generates them."""
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.case.model import collect_testcases

    tol = {c.model_name: (c.rtol, c.atol) for c in collect_testcases() if c.kind == "real"}
    rx = re.compile(filter) if filter else None
    cases = []
    for path in sorted(light_dir().glob("light_*.onnx")):
        model_name = path.stem[len("light_") :]
        name = f"test_{model_name}"
        if rx is not None and not rx.search(name):
            continue
        model = onnx.load(str(path))
        inits = {t.name for t in model.graph.initializer}
        inputs = []
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
        outputs = []
        for i in range(len(model.graph.output)):
            t = onnx.TensorProto()
            t.ParseFromString((path.parent / f"{path.stem}_output_{i}.pb").read_bytes())
            outputs.append(numpy_helper.to_array(t))
        rtol, atol = tol.get(model_name, (1e-3, 1e-7))
        cases.append(Case(name, model, inputs, outputs, rtol, atol, "light", LIGHT_OP))
    return cases


# -- comparing --------------------------------------------------------------------------------------------
def compare(expected, got, rtol: float, atol: float, where: str = "output") -> str | None:
    """None when ``got`` matches ``expected`` (float64 compare, NaN == NaN, exact shapes and
    dtypes), else the reason it does not."""
    if expected is None:
        return None if got is None else f"{where}: expected an empty optional, got {type(got).__name__}"
    if isinstance(expected, list):
        if not isinstance(got, (list, tuple)):
            return f"{where}: expected a sequence of {len(expected)} tensors, got {type(got).__name__}"
        if len(got) != len(expected):
            return f"{where}: expected a sequence of {len(expected)} tensors, got {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            why = compare(e, g, rtol, atol, f"{where}[{i}]")
            if why:
                return why
        return None
    if got is None or isinstance(got, (list, tuple)):
        return f"{where}: expected a tensor, got {'None' if got is None else 'a sequence'}"
    e, g = np.asarray(expected), np.asarray(got)
    if e.shape != g.shape:
        return f"{where}: shape {g.shape}, expected {e.shape}"
    if e.dtype != g.dtype and not (e.dtype.kind in "OUS" and g.dtype.kind in "OUS"):
        return f"{where}: dtype {g.dtype}, expected {e.dtype}"
    numeric = e.dtype.kind not in "OUSV"
    if not numeric and e.dtype.kind == "V":  # ml_dtypes (bfloat16, float8, int4) report kind 'V'
        try:
            e.astype(np.float64)
            numeric = True
        except (TypeError, ValueError):
            e, g = e.view(np.uint8), g.view(np.uint8)
    if not numeric:
        eq = np.array([a == b for a, b in zip(e.reshape(-1).tolist(), g.reshape(-1).tolist())], bool)
        if eq.all():
            return None
        i = int(np.argmin(eq))
        return (
            f"{where}: {int((~eq).sum())} of {eq.size} values differ; first at flat index {i}: got "
            f"{g.reshape(-1)[i]!r}, expected {e.reshape(-1)[i]!r}"
        )
    if e.dtype.name == "bfloat16":
        rtol = max(rtol, 2**-6)
    if e.dtype.kind == "c":
        e64, g64 = e.astype(np.complex128), g.astype(np.complex128)
        bad = ~np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    else:
        e64, g64 = e.astype(np.float64), g.astype(np.float64)
        with np.errstate(all="ignore"):
            bad = ~np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    with np.errstate(all="ignore"):
        err = np.abs(g64 - e64)
        worst = float(np.nanmax(np.where(bad, err, 0))) if bad.ndim else float(err)
    return (
        f"{where}: {int(bad.sum())} of {bad.size} values outside rtol={rtol:g} atol={atol:g}; max abs err "
        f"{worst:.3g}; first at {tuple(int(i) for i in idx)}: got {g64[idx]!r}, expected {e64[idx]!r}"
    )


def compare_outputs(expected: list, got, rtol: float, atol: float) -> str | None:
    got = list(got)
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        why = compare(e, g, rtol, atol, f"output {i}")
        if why:
            return why
    return None


# -- running -------------------------------------------------------------------------------------------------
class CaseTimeout(Exception):
    """A case ran past its time limit."""


class _Deadline:
    fired = False


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise :class:`CaseTimeout` in the main thread after ``seconds`` (POSIX only; elsewhere no
    limit). The alarm re-arms every 0.5 s until the case ends, so an exception swallowed by C
    code (a numba/llvmlite callback) is raised again; ``deadline.fired`` records that it fired."""
    deadline = _Deadline()
    usable = (
        seconds
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield deadline
        return

    def handler(signum, frame):
        deadline.fired = True
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        raise CaseTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield deadline
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _reason(exc: BaseException) -> str:
    chain = exc
    while chain is not None:
        if isinstance(chain, CaseTimeout):
            return str(chain)
        chain = chain.__cause__ or chain.__context__
    msg = f"{type(exc).__name__}: {exc}"
    notes = getattr(exc, "__notes__", None)
    if notes:
        msg += " [" + "; ".join(notes) + "]"
    return msg if len(msg) < 600 else msg[:597] + "..."


#: how opsnn runs a case: its ONNX backend's node-by-node interpreter, or the graph engine
#: (``opsnn.compile``: passes, kernel plans, one memory arena; graphs it cannot plan run interpreted)
ENGINES = ("interpreter", "compiled")


class _CompiledRep:
    """A case's model through :func:`opsnn.compile`, run like the backend's rep (inputs by position)."""

    def __init__(self, model):
        from ..graph.compiler import compile as _compile
        from .importer import load

        graph = load(model)
        self.names = [v.name for v in graph.inputs if v.name not in graph.initializers]
        self.cg = _compile(graph)

    def run(self, inputs: list) -> list:
        from ..graph.interpreter import to_numpy

        outs = self.cg.run(dict(zip(self.names, inputs)))
        return [to_numpy(outs[n]) for n in self.cg.output_names]


def run_opsnn(case: Case, timeout: float | None = 60.0, engine: str = "interpreter") -> Result:
    """Import, run and compare one case with opsnn's ``engine`` (see :data:`ENGINES`)."""
    from .backend import OpsnnBackend
    from .errors import UnsupportedOpError, UnsupportedOpsetError

    if engine not in ENGINES:
        raise ValueError(f"run_opsnn: engine must be one of {ENGINES}, got {engine!r}")

    t0 = time.perf_counter()
    status, reason = PASS, ""
    deadline = None
    try:
        with _time_limit(timeout) as deadline, warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                rep = OpsnnBackend.prepare(case.model) if engine == "interpreter" else _CompiledRep(case.model)
            except (UnsupportedOpError, UnsupportedOpsetError) as exc:
                status, reason = UNSUPPORTED, _reason(exc)
            except Exception as exc:  # noqa: BLE001 - recorded, never stops the run
                status, reason = FAIL, "import: " + _reason(exc)
            else:
                got = rep.run(list(case.inputs))
                why = compare_outputs(case.outputs, got, case.rtol, case.atol)
                if why:
                    status, reason = FAIL, why
    except Exception as exc:  # noqa: BLE001
        status, reason = FAIL, _reason(exc)
    if deadline is not None and deadline.fired and status != UNSUPPORTED:
        status, reason = FAIL, f"timed out after {timeout:g} s"
    return Result(case.name, case.op, status, reason, time.perf_counter() - t0, case.kind)


def run_onnxruntime(case: Case, timeout: float | None = 60.0) -> Result:
    """The same case through onnxruntime's backend (CPU provider)."""
    import onnxruntime
    import onnxruntime.backend as ort_backend

    onnxruntime.set_default_logger_severity(3)  # no per-model warnings about old opsets

    t0 = time.perf_counter()
    status, reason = PASS, ""
    deadline = None
    try:
        with _time_limit(timeout) as deadline, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                rep = ort_backend.prepare(case.model, "CPU")
            except Exception as exc:  # noqa: BLE001
                status, reason = UNSUPPORTED, _reason(exc)
            else:
                got = rep.run(list(case.inputs))
                why = compare_outputs(case.outputs, got, case.rtol, case.atol)
                if why:
                    status, reason = FAIL, why
    except Exception as exc:  # noqa: BLE001
        status, reason = FAIL, _reason(exc)
    if deadline is not None and deadline.fired:
        status, reason = FAIL, f"timed out after {timeout:g} s"
    return Result(case.name, case.op, status, reason, time.perf_counter() - t0, case.kind)


PEERS: dict[str, Callable[[Case, float | None], Result]] = {"onnxruntime": run_onnxruntime}


def run(
    cases: list[Case],
    *,
    timeout: float | None = 60.0,
    peer: str | None = None,
    progress: bool | None = None,
    baseline: dict | None = None,
    engine: str = "interpreter",
) -> Report:
    """Run ``cases`` with opsnn's ``engine`` (and ``peer`` when given); never stops on a failing case."""
    from tqdm import tqdm

    if peer is not None and peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(PEERS)}")
    if progress is None:
        progress = sys.stderr.isatty()
    report = Report([], peer=peer, baseline=dict(baseline or {}))
    t0 = time.perf_counter()
    bar = tqdm(cases, desc="conformance", unit="case", disable=not progress, file=sys.stderr)
    n_pass = 0
    for i, case in enumerate(bar):
        r = run_opsnn(case, timeout, engine)
        report.results.append(r)
        n_pass += r.status == PASS
        if peer is not None:
            report.peer_results[case.name] = PEERS[peer](case, timeout)
        if progress:
            bar.set_postfix(passed=n_pass, refresh=False)
        if i % 64 == 63:
            gc.collect()
    bar.close()
    report.seconds = time.perf_counter() - t0
    return report


# -- output -----------------------------------------------------------------------------------------------------
def load_baseline(folder: str | os.PathLike | None) -> dict[str, str]:
    """``{case: status}`` of the stored onnxruntime run in ``folder`` (empty when absent)."""
    if folder is None:
        return {}
    path = Path(folder) / "onnxruntime-node-cases.json"
    if not path.is_file():
        return {}
    with open(path) as f:
        return dict(json.load(f).get("cases", {}))


def default_baseline_dir() -> Path | None:
    root = Path(__file__).resolve().parents[3]
    cand = root.parent / "shared" / "conformance"
    return cand if cand.is_dir() else None


def format_table(report: Report, top_failures: int = 0) -> str:
    rows = report.by_op()
    peer = bool(report.peer_results)
    head = ["op", "cases", "pass", "fail", "unsup"] + (["peer pass", "peer fail", "peer unsup"] if peer else [])
    body = []
    for op, row in rows.items():
        line = [op, row["total"], row[PASS], row[FAIL], row[UNSUPPORTED]]
        if peer:
            line += [row.get("peer_pass", 0), row.get("peer_fail", 0), row.get("peer_unsupported", 0)]
        body.append([str(x) for x in line])
    t = report.totals()
    total = ["TOTAL", t["total"], t[PASS], t[FAIL], t[UNSUPPORTED]]
    if peer:
        ps = [r.status for r in report.peer_results.values()]
        total += [ps.count(PASS), ps.count(FAIL), ps.count(UNSUPPORTED)]
    body.append([str(x) for x in total])
    widths = [max(len(head[i]), *(len(r[i]) for r in body)) for i in range(len(head))]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body[:-1]]
    lines += [fmt(["-" * w for w in widths]), fmt(body[-1])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``opsnn conformance``: run ONNX's node cases and light models, print tables, write JSON."""
    p = argparse.ArgumentParser(
        prog="opsnn conformance",
        description=(
            "Run ONNX's node test cases and the light model zoo through opsnn and compare each output with the "
            "case's rtol/atol."
        ),
    )
    p.add_argument("--filter", metavar="REGEX", help="only cases whose name matches REGEX (re.search)")
    p.add_argument(
        "--suite",
        choices=("all", "node", "light"),
        default="all",
        help="which cases (default: all; torch-opinfo: PyTorch's OpInfo, see --suite torch-opinfo --help)",
    )
    p.add_argument("--peer", choices=sorted(PEERS), help="also run this runtime on the same cases")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="interpreter",
        help="interpreter: node by node (default); compiled: opsnn.compile's graph engine",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case (default 60; 0 = none)")
    p.add_argument(
        "--report",
        metavar="PATH",
        default="conformance-report.json",
        help="JSON report path (default: conformance-report.json; '-' = none)",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        default=None,
        help="folder with onnxruntime-node-cases.json (default: ../shared/conformance next to the repo)",
    )
    p.add_argument("--failures", type=int, default=20, metavar="N", help="print the first N failures (default 20)")
    p.add_argument("--min-pass", type=int, default=None, metavar="N", help="exit 1 when fewer than N cases pass")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = p.parse_args(argv)

    cases: list[Case] = []
    if args.suite in ("all", "node"):
        cases += node_cases(args.filter)
    if args.suite in ("all", "light"):
        cases += light_cases(args.filter)
    if not cases:
        print(f"no cases match {args.filter!r}", file=sys.stderr)
        return 2
    base_dir = args.baseline if args.baseline is not None else default_baseline_dir()
    baseline = load_baseline(base_dir)
    report = run(
        cases,
        timeout=args.timeout or None,
        peer=args.peer,
        progress=args.progress,
        baseline=baseline,
        engine=args.engine,
    )

    print(format_table(report))
    t, tn, tl = report.totals(), report.totals("node"), report.totals("light")
    print(f"\nnode cases:  {tn[PASS]} pass, {tn[FAIL]} fail, {tn[UNSUPPORTED]} unsupported of {tn['total']}")
    if tl["total"]:
        print(f"light models: {tl[PASS]} pass, {tl[FAIL]} fail, {tl[UNSUPPORTED]} unsupported of {tl['total']}")
    print(f"total: {t[PASS]} / {t['total']} pass in {report.seconds:.1f} s")
    if report.peer_results:
        ps = [r.status for r in report.peer_results.values()]
        print(f"{report.peer}: {ps.count(PASS)} pass, {ps.count(FAIL)} fail, {ps.count(UNSUPPORTED)} unsupported")
    if report.peer_results or baseline:
        ahead, behind = report.ahead(), report.behind()
        who = report.peer or "onnxruntime (stored results)"
        print(f"\ncases {who} fails or cannot load that opsnn passes: {len(ahead)}")
        for name in ahead:
            print(f"  {name}")
        print(f"cases {who} passes that opsnn does not: {len(behind)}")
    fails = [r for r in report.results if r.status != PASS]
    if fails and args.failures:
        print(f"\nfirst {min(args.failures, len(fails))} of {len(fails)} failures:")
        for r in fails[: args.failures]:
            print(f"  [{r.status}] {r.name} ({r.op}): {r.reason[:300]}")
    if args.report and args.report != "-":
        with open(args.report, "w") as f:
            json.dump(report.to_json(), f, indent=1)
        print(f"\nreport written to {os.path.abspath(args.report)}")
    if args.min_pass is not None and t[PASS] < args.min_pass:
        print(f"FAILED: {t[PASS]} cases pass, fewer than --min-pass {args.min_pass}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = [
    "ENGINES",
    "Case",
    "Report",
    "Result",
    "compare",
    "compare_outputs",
    "light_cases",
    "load_baseline",
    "main",
    "node_cases",
    "run",
    "run_onnxruntime",
    "run_opsnn",
]
