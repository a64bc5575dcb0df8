"""Profiler and trace analyzer: recording through hooks, exports, analysis, bad traces."""

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import opsnn
from opsnn.runtime import hooks
from opsnn.tools import trace


def _workload():
    x = opsnn.tensor(np.random.default_rng(0).standard_normal(4096).astype(np.float32))
    s = opsnn.Stream(name="side")
    with opsnn.profiler.profile() as p:
        with opsnn.profiler.record("step"):
            for _ in range(3):
                opsnn.ops.relu(x)
            with s:
                for _ in range(4):
                    opsnn.ops.relu(x)
    return p


def test_profile_records_kernels_streams_and_regions():
    p = _workload()
    assert not hooks.active, "hooks must be off once the profile ends (zero cost when off)"
    streams = {k.stream for k in p.kernels}
    assert streams == {"default", "side"}
    assert len(p.kernels) == 7 and all(k.op == "Relu" and k.end >= k.start for k in p.kernels)
    assert all(k.bytes == 2 * 4096 * 4 for k in p.kernels)
    assert any(h.category == "region" and h.name == "step" for h in p.host)
    table = p.table()
    assert "Relu" in table and "relu_numba" in table and "100.0" in table


def test_chrome_trace_has_one_thread_per_stream(tmp_path):
    p = _workload()
    path = p.export_chrome_trace(str(tmp_path / "perf.json"))
    data = json.loads(open(path).read())
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"}
    assert {"stream default", "stream side"} <= names
    xs = [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(xs) == 7 and all(e["dur"] >= 0 for e in xs)
    assert data["otherData"]["format_version"] == trace.SUPPORTED_FORMAT


def test_flamegraph_is_valid_svg_with_regions_ops_kernels(tmp_path):
    p = _workload()
    root = ET.parse(p.export_flamegraph(str(tmp_path / "f.svg"))).getroot()
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("step:") for t in titles)
    assert any(t.startswith("Relu:") for t in titles) and any(t.startswith("relu_numba:") for t in titles)


def test_timeline_html_is_self_contained(tmp_path):
    p = _workload()
    text = open(p.export_timeline(str(tmp_path / "t.html"))).read()
    assert "<script>" in text and "http" not in text.split("<script>")[1].split("</script>")[0]
    data = json.loads(text.split("const DATA = ")[1].split(";\n")[0])
    assert "stream side" in data["lanes"] and len(data["events"]) >= 7


def test_analyzer_reports_hot_ops_streams_and_fallbacks(tmp_path):
    x = opsnn.tensor(np.ones(64, np.float32))
    with opsnn.profiler.profile() as p:
        opsnn.ops.relu(x, algo="reference")
        opsnn.ops.relu(x)
    path = p.export_chrome_trace(str(tmp_path / "perf.json"))
    rep = trace.analyze(trace.load_trace_events(path))
    assert rep["hot_ops"][0]["op"] == "Relu" and rep["hot_ops"][0]["calls"] == 2
    assert rep["fallback_ops"] == ["Relu"]
    assert any("reference fallback" in s for s in rep["suggestions"])
    assert "hot ops" in trace.format_report(rep)


def test_analyze_cli_writes_timeline(tmp_path, capsys):
    from opsnn.cli import main

    p = _workload()
    path = p.export_chrome_trace(str(tmp_path / "perf.json"))
    out = tmp_path / "timeline.html"
    assert main(["analyze", path, "-t", str(out)]) == 0
    assert out.exists() and "hot ops" in capsys.readouterr().out


def test_huge_traces_are_streamed(tmp_path, monkeypatch):
    p = _workload()
    path = p.export_chrome_trace(str(tmp_path / "perf.json"))
    monkeypatch.setattr(trace, "_STREAM_THRESHOLD", 0)
    tr = trace.load_trace_events(path)
    assert len(tr.kernels) == 7


def test_bad_traces_get_clear_errors(tmp_path):
    with pytest.raises(trace.TraceError, match="no such file"):
        trace.load_trace_events(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(trace.TraceError, match="unreadable"):
        trace.load_trace_events(str(bad))
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"traceEvents": [], "otherData": {"format_version": 99}}))
    with pytest.raises(trace.TraceError, match="newer"):
        trace.load_trace_events(str(newer))
    from opsnn.cli import main

    assert main(["analyze", str(bad)]) == 2


def test_profiling_across_finalize_stops_cleanly():
    x = opsnn.tensor(np.ones(8, np.float32))
    with opsnn.profiler.profile() as p:
        opsnn.ops.relu(x)
        opsnn.finalize()
    assert not hooks.active and len(p.kernels) == 1
    opsnn.init()


def test_opsnn_debug_levels_print_choices_and_kernel_lines(capsys):
    from opsnn.tools import debug_log

    x = opsnn.tensor(np.ones((33, 17), np.float32))
    debug_log.set_level(2)
    try:
        opsnn.ops.relu(x)
        opsnn.ops.matmul(x, x.T.contiguous())
    finally:
        debug_log.set_level(0)
    err = capsys.readouterr().err
    assert "[opsnn] prepare Relu: relu_numba" in err
    line = next(l for l in err.splitlines() if l.startswith("[opsnn] MatMul"))
    assert "GFLOP/s" in line and "GB/s" in line and "ms" in line
    assert not hooks.active


def _trace(events):
    """A trace of kernel events on stream 0: (name, ts_us, dur_us)."""
    return {
        "traceEvents": [
            {
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "name": n,
                "cat": "kernel",
                "ts": t,
                "dur": d,
                "args": {"kernel": n.lower()},
            }
            for n, t, d in events
        ]
    }


def test_analyzer_names_unfused_residuals_and_layout_cost():
    seq, t = [], 0.0
    for _ in range(3):  # conv, then a residual that leaves the blocked layout, then the next conv
        for name, dur in (
            ("opsnn::BlockedConv", 100),
            ("opsnn::FromBlocked", 8),
            ("Sum", 5),
            ("Relu", 3),
            ("opsnn::ToBlocked", 8),
        ):
            seq.append((name, t, dur))
            t += dur
    rep = trace.analyze(trace.load_trace_events(_trace(seq)))
    trip = [s for s in rep["suggestions"] if "FromBlocked -> Sum -> Relu -> ToBlocked" in s]
    assert len(trip) == 1 and trip[0].startswith("3 x ")
    assert any(s.startswith("layout conversions (ToBlocked / FromBlocked) take") for s in rep["suggestions"])
    assert "suggestions:\n  none" not in trace.format_report(rep)


def test_analyzer_always_says_where_the_time_goes_and_flags_host_gaps():
    rep = trace.analyze(trace.load_trace_events(_trace([("Conv", 0, 900), ("Relu", 900, 100)])))
    assert rep["suggestions"] == [rep["suggestions"][0]] and "most kernel time is in Conv (90%" in rep["suggestions"][0]
    gappy = _trace([("Relu", 0, 10), ("Relu", 100, 10)])
    gappy["traceEvents"][1]["args"]["queued_us"] = 95  # queued long after the previous kernel ended
    rep = trace.analyze(trace.load_trace_events(gappy))
    assert any("waiting for the host" in s for s in rep["suggestions"])
