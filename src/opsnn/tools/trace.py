"""Saved traces: reading (streamed for huge files), analysis, flame graph SVG, timeline HTML.

``opsnn analyze perf.json -t timeline.html`` (cf. ops-nn's ``acl_analyzer``) prints hot ops,
stream utilization, host-bound gaps, reference fallbacks and suggestions.
"""

from __future__ import annotations

import html
import json
import os
from collections import defaultdict
from dataclasses import dataclass

from ..errors import ParamInvalidError

SUPPORTED_FORMAT = 1
_STREAM_THRESHOLD = 64 << 20  # files above this are parsed event by event


class TraceError(ParamInvalidError):
    """A trace file that cannot be read (missing, malformed, or from a newer format)."""


@dataclass
class Trace:
    kernels: list  # dicts: name, lane, ts, dur, args
    host: list
    lanes: list
    format_version: int


def _check_version(version) -> int:
    version = int(version or SUPPORTED_FORMAT)
    if version > SUPPORTED_FORMAT:
        raise TraceError(
            f"trace: format version {version} is newer than this opsnn reads ({SUPPORTED_FORMAT}); "
            "upgrade opsnn to analyze it"
        )
    return version


def _iter_events_streamed(path: str):
    """Yield trace events one by one without loading the file whole."""
    dec = json.JSONDecoder()
    with open(path) as f:
        buf = ""
        while '"traceEvents"' not in buf:
            chunk = f.read(1 << 16)
            if not chunk:
                raise TraceError(f"trace {path}: no 'traceEvents' array found")
            buf += chunk
        buf = buf[buf.index('"traceEvents"') + len('"traceEvents"') :]
        while "[" not in buf:
            buf += f.read(1 << 16)
        buf = buf[buf.index("[") + 1 :]
        while True:
            buf = buf.lstrip().lstrip(",").lstrip()
            if buf.startswith("]"):
                return
            try:
                obj, end = dec.raw_decode(buf)
            except json.JSONDecodeError:
                chunk = f.read(1 << 16)
                if not chunk:
                    raise TraceError(f"trace {path}: truncated event list") from None
                buf += chunk
                continue
            yield obj
            buf = buf[end:]


def _stream_version(path: str) -> int:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4096)
        f.seek(max(0, size - 4096))
        tail = f.read()
    for blob in (head, tail):
        i = blob.find(b'"format_version"')
        if i >= 0:
            rest = blob[i + len(b'"format_version"') :].lstrip(b": ")
            digits = bytes(c for c in rest[:12] if chr(c).isdigit())
            return _check_version(int(digits or b"1"))
    return SUPPORTED_FORMAT


def load_trace_events(source) -> Trace:
    """Read a Chrome trace written by the profiler: a path or the trace dict itself."""
    if isinstance(source, dict):
        version = _check_version(source.get("otherData", {}).get("format_version"))
        events = source.get("traceEvents", [])
    else:
        path = os.fspath(source)
        if not os.path.exists(path):
            raise TraceError(f"trace: no such file {path!r}")
        try:
            if os.path.getsize(path) > _STREAM_THRESHOLD:
                version = _stream_version(path)
                events = _iter_events_streamed(path)
            else:
                with open(path) as f:
                    data = json.load(f)
                if not isinstance(data, dict) or "traceEvents" not in data:
                    raise TraceError(f"trace {path}: not a Chrome trace (no 'traceEvents')")
                version = _check_version(data.get("otherData", {}).get("format_version"))
                events = data["traceEvents"]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"trace {path}: unreadable JSON ({exc})") from None
    names: dict = {}
    kernels, host = [], []
    for ev in events:
        if not isinstance(ev, dict):
            continue
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev.get("pid"), ev.get("tid"))] = ev.get("args", {}).get("name", "")
        elif ev.get("ph") == "X":
            rec = {
                "name": ev.get("name", "?"),
                "lane": (ev.get("pid", 0), ev.get("tid", 0)),
                "ts": float(ev.get("ts", 0)),
                "dur": float(ev.get("dur", 0)),
                "cat": ev.get("cat", ""),
                "args": ev.get("args", {}),
            }
            (kernels if ev.get("pid", 0) == 0 else host).append(rec)
    lanes = sorted({k["lane"] for k in kernels} | {h["lane"] for h in host})
    lane_names = [names.get(lane, ("stream " if lane[0] == 0 else "host thread ") + str(lane[1])) for lane in lanes]
    lane_index = {lane: i for i, lane in enumerate(lanes)}
    for rec in kernels + host:
        rec["lane"] = lane_index[rec["lane"]]
    return Trace(kernels, host, lane_names, version)


# -- analysis --------------------------------------------------------------------------------------
HOST_GAP_SHARE = 0.1  # a stream idle this share of its span waiting for launches is worth a suggestion
LAYOUT_SHARE = 0.05  # layout conversions taking this share of kernel time are worth a suggestion
_TO_PLAIN, _TO_BLOCKED = "FromBlocked", "ToBlocked"


def _base(name: str) -> str:
    return name.rpartition("::")[2]


def _layout_suggestions(per_lane: dict, total_us: float) -> list:
    """Blocked-layout round trips: residuals that leave the blocked layout (FromBlocked -> ops -> ToBlocked)
    and the share of kernel time spent converting layouts."""
    out = []
    trips: dict = defaultdict(lambda: [0, 0.0])  # "Sum -> Relu" -> [count, us]
    convert_us = 0.0
    for evs in per_lane.values():
        evs = sorted(evs, key=lambda e: e["ts"])
        i = 0
        while i < len(evs):
            name = _base(evs[i]["name"])
            if name in (_TO_PLAIN, _TO_BLOCKED):
                convert_us += evs[i]["dur"]
            if name == _TO_PLAIN:
                j = i + 1
                while j < len(evs) and j - i <= 4 and _base(evs[j]["name"]) not in (_TO_PLAIN, _TO_BLOCKED):
                    j += 1
                if i + 1 < j < len(evs) and _base(evs[j]["name"]) == _TO_BLOCKED:
                    key = " -> ".join(_base(e["name"]) for e in evs[i + 1 : j])
                    trips[key][0] += 1
                    trips[key][1] += sum(e["dur"] for e in evs[i : j + 1])
                    convert_us += evs[j]["dur"]
                    i = j + 1
                    continue
            i += 1
    for key, (n, us) in sorted(trips.items(), key=lambda kv: -kv[1][1]):
        out.append(
            f"{n} x FromBlocked -> {key} -> ToBlocked ({100 * us / total_us:.1f}% of kernel time): these ops "
            "left the blocked layout between two blocked convolutions; fused into the conv (as the "
            "blocked_layout pass does for Add and Relu) they would cost nothing"
        )
    if convert_us > LAYOUT_SHARE * total_us:
        out.append(
            f"layout conversions (ToBlocked / FromBlocked) take {100 * convert_us / total_us:.1f}% of kernel "
            "time: `opsnn explain MODEL` says where the blocked chains start and end"
        )
    return out


def analyze(trace: Trace, top: int = 10) -> dict:
    by_op: dict = defaultdict(lambda: {"calls": 0, "us": 0.0, "kernels": set(), "fallback": 0})
    per_lane: dict = defaultdict(list)
    for k in trace.kernels:
        a = by_op[k["name"]]
        a["calls"] += 1
        a["us"] += k["dur"]
        a["kernels"].add(k["args"].get("kernel", "?"))
        a["fallback"] += bool(k["args"].get("fallback"))
        per_lane[k["lane"]].append(k)
    total = sum(a["us"] for a in by_op.values()) or 1e-9
    hot = sorted(
        (
            {
                "op": op,
                "calls": a["calls"],
                "total_us": a["us"],
                "pct": 100 * a["us"] / total,
                "kernels": sorted(a["kernels"]),
                "fallback_calls": a["fallback"],
            }
            for op, a in by_op.items()
        ),
        key=lambda r: -r["total_us"],
    )
    streams, host_gap_total = [], 0.0
    for lane, evs in sorted(per_lane.items()):
        evs.sort(key=lambda e: e["ts"])
        span = (evs[-1]["ts"] + evs[-1]["dur"]) - evs[0]["ts"]
        busy = sum(e["dur"] for e in evs)
        # idle gaps where the next kernel had not even been queued yet: the host was the bottleneck
        host_gap = 0.0
        for prev, nxt in zip(evs, evs[1:]):
            queued = nxt["args"].get("queued_us", nxt["ts"])
            idle_start = prev["ts"] + prev["dur"]
            host_gap += max(0.0, min(nxt["ts"], queued) - idle_start)
        host_gap_total += host_gap
        streams.append(
            {
                "stream": trace.lanes[lane],
                "kernels": len(evs),
                "busy_us": busy,
                "span_us": span,
                "utilization_pct": 100 * busy / span if span > 0 else 100.0,
                "host_bound_gap_us": host_gap,
            }
        )
    fallbacks = [r["op"] for r in hot if r["fallback_calls"]]
    suggestions = []
    for r in hot:
        if r["fallback_calls"]:
            suggestions.append(
                f"{r['op']} ran on the numpy reference fallback {r['fallback_calls']}x: "
                "no fast kernel applied to its shapes/dtypes (see `explain`)"
            )
    for k in trace.kernels:
        if k["name"] == "Conv" and "im2col" in str(k["args"].get("kernel", "")):
            shapes = k["args"].get("shapes") or []
            w = shapes[1] if len(shapes) > 1 and shapes[1] else None
            if w and len(w) == 4 and w[2] == w[3] == 3 and w[1] >= 16:
                suggestions.append(
                    f"Conv with weight {tuple(w)} used im2col; a Winograd F(4x4,3x3) kernel applies "
                    "to 3x3 stride-1 convolutions"
                )
                break
    suggestions += _layout_suggestions(per_lane, total)
    for s in streams:
        if s["span_us"] > 0 and s["host_bound_gap_us"] > HOST_GAP_SHARE * s["span_us"]:
            suggestions.append(
                f"{s['stream']} idled {s['host_bound_gap_us'] / 1e3:.2f} ms waiting for the host "
                f"({100 * s['host_bound_gap_us'] / s['span_us']:.0f}% of its span): reuse executors "
                "or compile the graph to cut host overhead"
            )
    if not suggestions and hot:
        r = hot[0]
        suggestions.append(
            f"most kernel time is in {r['op']} ({r['pct']:.0f}%, kernels {', '.join(r['kernels'])}): "
            "`opsnn explain MODEL` shows why each node runs its kernel and what was not chosen"
        )
    return {
        "hot_ops": hot[:top],
        "streams": streams,
        "fallback_ops": fallbacks,
        "host_bound_gap_us": host_gap_total,
        "suggestions": suggestions,
        "kernel_events": len(trace.kernels),
    }


def format_report(rep: dict) -> str:
    lines = [
        f"kernel events: {rep['kernel_events']}",
        "",
        "hot ops:",
        f"  {'op':24s} {'%':>6s} {'calls':>6s} {'total ms':>10s}  kernels",
    ]
    for r in rep["hot_ops"]:
        lines.append(
            f"  {r['op'][:24]:24s} {r['pct']:6.1f} {r['calls']:6d} {r['total_us'] / 1e3:10.3f}  "
            + ", ".join(r["kernels"])
        )
    lines += ["", "streams:"]
    for s in rep["streams"]:
        lines.append(
            f"  {s['stream']:20s} kernels {s['kernels']:6d}  busy {s['busy_us'] / 1e3:9.3f} ms  "
            f"utilization {s['utilization_pct']:5.1f}%  host-bound gaps {s['host_bound_gap_us'] / 1e3:.3f} ms"
        )
    lines += ["", "ops on the reference fallback: " + (", ".join(rep["fallback_ops"]) or "none")]
    lines += ["", "suggestions:"] + ([f"  - {s}" for s in rep["suggestions"]] or ["  none"])
    return "\n".join(lines)


# -- flame graph -----------------------------------------------------------------------------------
def flamegraph_svg(trace: Trace, width: int = 1200) -> str:
    """Regions > ops > kernels, each box as wide as its kernel time."""
    regions = sorted((h for h in trace.host if h["cat"] == "region"), key=lambda h: (h["ts"], -h["dur"]))
    tree: dict = {"name": "all", "value": 0.0, "children": {}}

    def path_for(k):
        t = k["args"].get("queued_us", k["ts"])
        path = [r["name"] for r in regions if r["ts"] <= t <= r["ts"] + r["dur"]]
        return path + [k["name"], k["args"].get("kernel", "?")]

    for k in trace.kernels:
        node = tree
        node["value"] += k["dur"]
        for name in path_for(k):
            node = node["children"].setdefault(name, {"name": name, "value": 0.0, "children": {}})
            node["value"] += k["dur"]
    depth = [0]

    def measure(n, d):
        depth[0] = max(depth[0], d)
        for c in n["children"].values():
            measure(c, d + 1)

    measure(tree, 0)
    row_h, total = 18, tree["value"] or 1.0
    height = (depth[0] + 1) * row_h + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
        f'font-size="11"><rect width="100%" height="100%" fill="#fff"/>'
        f'<text x="4" y="14">opsnn flame graph (kernel time; regions &gt; ops &gt; kernels)</text>'
    ]

    def draw(n, x, d):
        w = n["value"] / total * width
        y = height - (d + 1) * row_h
        hue = (hash(n["name"]) % 40) + 10
        label = html.escape(n["name"])
        out.append(
            f"<g><title>{label}: {n['value'] / 1e3:.3f} ms ({100 * n['value'] / total:.1f}%)</title>"
            f'<rect x="{x:.2f}" y="{y}" width="{max(w - 0.5, 0.1):.2f}" height="{row_h - 1}" '
            f'fill="hsl({hue},85%,60%)"/>'
        )
        if w > 40:
            out.append(f'<text x="{x + 3:.2f}" y="{y + 12}">{label[: int(w / 7)]}</text>')
        out.append("</g>")
        cx = x
        for c in sorted(n["children"].values(), key=lambda c: c["name"]):
            draw(c, cx, d + 1)
            cx += c["value"] / total * width

    draw(tree, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out)


# -- timeline HTML ------------------------------------------------------------------------------------
_TIMELINE_TEMPLATE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>opsnn timeline</title>
<style>
body{font-family:system-ui,sans-serif;margin:12px;color:#222}
h3{margin:0 0 6px 0}
#summary{font-size:13px;margin-bottom:6px}
#summary b{font-weight:600}
#legend{font-size:12px;margin:6px 0}
.legend-item{display:inline-block;margin-right:12px;white-space:nowrap}
.swatch{display:inline-block;width:12px;height:12px;border:1px solid rgba(0,0,0,.3);vertical-align:-2px;
        margin-right:4px;border-radius:2px}
#controls{font-size:12px;color:#444;margin-bottom:4px}
#view{position:relative;border:1px solid #999;overflow:hidden;user-select:none;cursor:grab;background:#fafafa}
#axis{position:absolute;left:0;right:0;top:0;height:22px;border-bottom:1px solid #999;background:#f0f0f0;z-index:3}
.tick{position:absolute;top:4px;font-size:11px;color:#333;transform:translateX(-50%);white-space:nowrap}
.grid{position:absolute;top:22px;bottom:0;width:0;border-left:1px solid rgba(0,0,0,.08);z-index:0}
#regions{position:absolute;left:0;right:0;top:22px;height:18px;border-bottom:1px solid #ddd;z-index:2}
.region{position:absolute;top:1px;height:16px;background:rgba(90,90,200,.25);border:1px solid rgba(60,60,160,.6);
        font-size:10px;overflow:hidden;white-space:nowrap;box-sizing:border-box;padding-left:2px}
.band{position:absolute;bottom:0;background:rgba(90,90,200,.07);z-index:0;pointer-events:none}
.run-mark{position:absolute;top:22px;bottom:0;width:0;border-left:2px dashed rgba(200,60,0,.7);z-index:2;
          pointer-events:none}
.run-label{position:absolute;top:24px;font-size:10px;color:#b33;z-index:4;padding-left:3px;white-space:nowrap}
.lane{position:absolute;left:0;right:0;border-bottom:1px solid #ddd}
.lane-label{position:absolute;left:0;width:126px;padding-left:4px;font-size:11px;color:#333;z-index:2;
            background:rgba(240,240,240,.95);height:100%;line-height:24px;overflow:hidden;white-space:nowrap;
            box-sizing:border-box;border-right:1px solid #ccc}
.ev{position:absolute;height:18px;border-radius:2px;font-size:10px;line-height:16px;overflow:hidden;
    white-space:nowrap;color:#000;box-sizing:border-box;border:1px solid rgba(0,0,0,.25);padding-left:2px;z-index:1}
.ev.fallback{outline:2px solid #c00}
.ev.hovered{outline:2px solid #000}
#tip{position:fixed;display:none;background:#ffe;border:1px solid #999;padding:4px 6px;font-size:12px;
     pointer-events:none;z-index:10;white-space:pre}
table{border-collapse:collapse;margin-top:12px;font-size:13px}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
</style></head><body>
<h3>opsnn timeline</h3>
<div id="summary"></div>
<div id="legend"></div>
<div id="controls">wheel: zoom &nbsp; drag: pan &nbsp; hover: details &nbsp; <button id="reset">reset</button>
 <span id="range"></span></div>
<div id="view"><div id="axis"></div><div id="regions"></div></div>
<div id="tip"></div>
<h4>top ops</h4><table id="top"><thead><tr><th>op</th><th>% time</th><th>calls</th><th>total ms</th>
<th>kernels</th></tr></thead><tbody></tbody></table>
<script>
const DATA = __DATA__;
const LANE_H = 24, LABEL_W = 130, TOP = 42, MIN_LABEL_PX = 40;
const view = document.getElementById('view'), tip = document.getElementById('tip');
const axis = document.getElementById('axis'), regionRow = document.getElementById('regions');
view.style.height = (TOP + DATA.lanes.length * LANE_H + 4) + 'px';
let t0 = DATA.t0, t1 = DATA.t1 > DATA.t0 ? DATA.t1 : DATA.t0 + 1;
const full = [t0, t1];
function decimals(step, unit) {  // enough digits to tell neighbouring ticks apart
  return Math.max(0, Math.min(3, -Math.floor(Math.log10(step / unit) + 1e-9)));
}
function fmt(us, step) {
  const a = Math.abs(step || us);
  if (a >= 1e6) return (us / 1e6).toFixed(step ? decimals(step, 1e6) : 2) + ' s';
  if (a >= 1e3) return (us / 1e3).toFixed(step ? decimals(step, 1e3) : 2) + ' ms';
  if (a >= 1 || us === 0) return us.toFixed(step ? decimals(step, 1) : 0) + ' us';
  return us.toFixed(2) + ' us';
}
// summary: span, kernel time, per-lane busy %, top ops
const S = DATA.summary, sum = document.getElementById('summary');
sum.innerHTML = '';
const parts = [['span', fmt(S.span_us)], ['kernel time', fmt(S.kernel_us)], ['kernels', S.kernels],
               ['streams', S.streams], ['host threads', S.host_threads]];
parts.forEach(([k, v]) => { const b = document.createElement('b'); b.textContent = k + ': ';
  sum.appendChild(b); sum.appendChild(document.createTextNode(v + '   ')); });
const busy = document.createElement('div'); busy.id = 'busy';
busy.textContent = 'busy: ' + (S.busy.map(r => r.lane + ' ' + r.pct.toFixed(0) + '%').join(', ') || 'none') +
  '  |  top ops: ' + (DATA.top.slice(0, 3).map(r => r.op + ' ' + r.pct.toFixed(0) + '%').join(', ') || 'none');
sum.appendChild(busy);
// legend: one colour per op family
const legend = document.getElementById('legend');
Object.entries(DATA.families).forEach(([fam, col]) => {
  const it = document.createElement('span'); it.className = 'legend-item'; it.dataset.family = fam;
  const sw = document.createElement('span'); sw.className = 'swatch'; sw.style.background = col;
  it.appendChild(sw); it.appendChild(document.createTextNode(fam)); legend.appendChild(it);
});
DATA.lanes.forEach((name, i) => {
  const lane = document.createElement('div'); lane.className = 'lane';
  lane.style.top = (TOP + i * LANE_H) + 'px'; lane.style.height = LANE_H + 'px'; lane.dataset.lane = i;
  const lab = document.createElement('div'); lab.className = 'lane-label'; lab.textContent = name;
  lab.title = name; lane.appendChild(lab); view.appendChild(lane);
});
const lanes = view.querySelectorAll('.lane');
const els = DATA.events.map(ev => {
  const d = document.createElement('div'); d.className = 'ev' + (ev.fallback ? ' fallback' : '');
  d.style.top = '3px'; d.style.background = DATA.families[ev.family] || '#ccc'; d.dataset.family = ev.family;
  d.dataset.info = ev.info; lanes[ev.lane].appendChild(d); return d;
});
const regionEls = DATA.regions.map(r => {
  const d = document.createElement('div'); d.className = 'region'; d.textContent = r.name;
  d.dataset.info = r.info; regionRow.appendChild(d);
  const b = document.createElement('div'); b.className = 'band'; b.style.top = TOP + 'px'; view.appendChild(b);
  return [d, b];
});
const runEls = DATA.runs.map((r, i) => {
  const m = document.createElement('div'); m.className = 'run-mark'; view.appendChild(m);
  const l = document.createElement('div'); l.className = 'run-label'; l.textContent = r.name; view.appendChild(l);
  return [m, l];
});
function niceStep(span, px) {
  const target = span / Math.max(2, Math.floor(px / 110));
  const p = Math.pow(10, Math.floor(Math.log10(target)));
  for (const m of [1, 2, 5, 10]) if (m * p >= target) return m * p;
  return 10 * p;
}
function drawAxis(scale) {
  axis.querySelectorAll('.tick').forEach(e => e.remove());
  view.querySelectorAll('.grid').forEach(e => e.remove());
  const w = view.clientWidth - LABEL_W, step = niceStep(t1 - t0, w);
  const first = Math.ceil((t0 - full[0]) / step) * step;
  for (let rel = first; full[0] + rel <= t1; rel += step) {
    const x = LABEL_W + (full[0] + rel - t0) * scale;
    const tk = document.createElement('div'); tk.className = 'tick'; tk.textContent = fmt(rel, step);
    tk.style.left = x + 'px'; axis.appendChild(tk);
    const g = document.createElement('div'); g.className = 'grid'; g.style.left = x + 'px'; view.appendChild(g);
  }
}
function place(el, ts, dur, scale, minW) {
  const x = LABEL_W + (ts - t0) * scale, width = Math.max(dur * scale, minW);
  if (x + width < LABEL_W || x > view.clientWidth) { el.style.display = 'none'; return null; }
  el.style.display = ''; el.style.left = Math.max(x, LABEL_W) + 'px';
  el.style.width = (width - Math.max(0, LABEL_W - x)) + 'px';
  return width;
}
function layout() {
  const w = view.clientWidth - LABEL_W, scale = w / (t1 - t0);
  DATA.events.forEach((ev, i) => {
    const el = els[i], width = place(el, ev.ts, ev.dur, scale, 1);
    if (width === null) return;
    el.textContent = width >= MIN_LABEL_PX ? ev.name : '';  // a label only where it fits
  });
  DATA.regions.forEach((r, i) => {
    const [d, b] = regionEls[i];
    place(d, r.ts, r.dur, scale, 2); place(b, r.ts, r.dur, scale, 2);
    b.style.height = (DATA.lanes.length * LANE_H) + 'px';
  });
  DATA.runs.forEach((r, i) => {
    const [m, l] = runEls[i], x = LABEL_W + (r.ts - t0) * scale;
    const show = x >= LABEL_W && x <= view.clientWidth;
    m.style.display = l.style.display = show ? '' : 'none';
    m.style.left = x + 'px'; l.style.left = x + 'px';
  });
  drawAxis(scale);
  document.getElementById('range').textContent =
    'showing ' + fmt(t1 - t0) + ' from ' + fmt(t0 - full[0]);
}
view.addEventListener('wheel', e => {
  e.preventDefault();
  const w = view.clientWidth - LABEL_W, rect = view.getBoundingClientRect();
  const at = t0 + (e.clientX - rect.left - LABEL_W) / w * (t1 - t0);
  const f = e.deltaY < 0 ? 0.8 : 1.25;
  t0 = at - (at - t0) * f; t1 = at + (t1 - at) * f; layout();
}, {passive: false});
let drag = null;
view.addEventListener('mousedown', e => { drag = {x: e.clientX, t0, t1}; view.style.cursor = 'grabbing'; });
window.addEventListener('mouseup', () => { drag = null; view.style.cursor = 'grab'; });
window.addEventListener('mousemove', e => {
  if (drag) {
    const dt = (e.clientX - drag.x) / (view.clientWidth - LABEL_W) * (drag.t1 - drag.t0);
    t0 = drag.t0 - dt; t1 = drag.t1 - dt; layout();
  }
});
view.addEventListener('mouseover', e => {
  const el = e.target.closest('.ev, .region'); if (!el) return;
  tip.textContent = el.dataset.info; tip.style.display = 'block'; el.classList.add('hovered');
});
view.addEventListener('mousemove', e => { tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px'; });
view.addEventListener('mouseout', e => {
  const el = e.target.closest('.ev, .region'); if (el) el.classList.remove('hovered'); tip.style.display = 'none';
});
document.getElementById('reset').onclick = () => { [t0, t1] = full; layout(); };
const tbody = document.querySelector('#top tbody');
DATA.top.forEach(r => {
  const tr = document.createElement('tr');
  [r.op, r.pct.toFixed(1), r.calls, (r.total_us / 1000).toFixed(3), r.kernels.join(', ')].forEach(v => {
    const td = document.createElement('td'); td.textContent = v; tr.appendChild(td); });
  tbody.appendChild(tr);
});
window.addEventListener('resize', layout);
layout();
</script></body></html>
"""

#: colours for op families (kernel events) and host phases, in legend order; others cycle through the rest
_FAMILY_COLOURS = {
    "conv": "#f4a261",
    "matmul": "#e76f51",
    "attention": "#d62828",
    "activation": "#90be6d",
    "elementwise": "#43aa8b",
    "norm": "#577590",
    "pool": "#9b5de5",
    "reduction": "#f9c74f",
    "shape": "#bdbdbd",
    "layout": "#a3a3a3",
    "rnn": "#f15bb5",
    "loss": "#00bbf9",
    "quant": "#fee440",
    "prepare": "#cfd8dc",
    "compile": "#b0bec5",
    "pass": "#90a4ae",
    "run": "#ffccbc",
}
_SPARE_COLOURS = ["#8ecae6", "#ffb703", "#adc178", "#cdb4db", "#ffafcc", "#a2d2ff", "#e9c46a", "#84a98c"]


def _family(e: dict, is_kernel: bool) -> str:
    if is_kernel:
        return e["args"].get("family") or "other"
    return e.get("cat") or "host"


def timeline_html(trace: Trace, max_events: int = 50_000) -> str:
    """A self-contained HTML page: a summary, a legend of op families, a time axis with units,
    one lane per stream and per host thread, region bands and run boundaries, zoom/pan and hover."""
    events = []
    kernel_ids = {id(k) for k in trace.kernels}
    everything = trace.kernels + trace.host
    families: dict = {}
    regions, runs = [], []
    for e in trace.host:
        if e["cat"] == "region":
            regions.append(
                {
                    "name": e["name"],
                    "ts": e["ts"],
                    "dur": e["dur"],
                    "info": f"region {e['name']}  {e['dur'] / 1e3:.3f} ms",
                }
            )
        elif e["cat"] == "run":
            runs.append({"name": e["name"], "ts": e["ts"]})
    laned = [e for e in everything if id(e) in kernel_ids or e["cat"] not in ("region", "run")]
    for e in sorted(laned, key=lambda e: -e["dur"])[:max_events]:
        args = e["args"]
        is_kernel = id(e) in kernel_ids
        fam = _family(e, is_kernel)
        if fam not in families:
            spare = _SPARE_COLOURS[len([f for f in families if f not in _FAMILY_COLOURS]) % len(_SPARE_COLOURS)]
            families[fam] = _FAMILY_COLOURS.get(fam, spare)
        info = [f"{e['name']}  {e['dur'] / 1e3:.3f} ms", f"lane: {trace.lanes[e['lane']]}", f"family: {fam}"]
        for key in ("kernel", "shapes", "dtypes", "flops", "bytes", "reason"):
            if args.get(key) not in (None, [], 0, ""):
                info.append(f"{key}: {args[key]}")
        events.append(
            {
                "name": e["name"],
                "lane": e["lane"],
                "ts": e["ts"],
                "dur": e["dur"],
                "family": fam,
                "fallback": bool(args.get("fallback")),
                "info": "\n".join(info),
            }
        )
    order = {f: i for i, f in enumerate(_FAMILY_COLOURS)}
    families = dict(sorted(families.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
    t0 = min((e["ts"] for e in everything), default=0.0)
    t1 = max((e["ts"] + e["dur"] for e in everything), default=1.0)
    rep = analyze(trace)
    host_lanes = {h["lane"] for h in trace.host}
    summary = {
        "span_us": max(t1 - t0, 0.0),
        "kernel_us": sum(k["dur"] for k in trace.kernels),
        "kernels": len(trace.kernels),
        "streams": len(rep["streams"]),
        "host_threads": len(host_lanes),
        "busy": [{"lane": s["stream"], "pct": 100 * s["busy_us"] / max(t1 - t0, 1e-9)} for s in rep["streams"]],
    }
    data = {
        "lanes": trace.lanes,
        "events": events,
        "t0": t0,
        "t1": t1,
        "top": rep["hot_ops"],
        "families": families,
        "regions": regions,
        "runs": runs,
        "summary": summary,
    }
    payload = json.dumps(data).replace("</", "<\\/")  # never close the script tag early
    return _TIMELINE_TEMPLATE.replace("__DATA__", payload)
