"""The timeline page in a real browser (Debian's headless Chromium driven by Playwright): it renders
without console errors and shows what a person reads it for — a summary, a legend of op families, a
time axis with units, a lane per stream and per host thread, region bands, labels where they fit —
and reacts to hover and zoom. A screenshot is written to $OPSNN_ARTIFACTS (default: the test's tmp dir)
and checked not to be blank."""

import os
import re
import shutil

import numpy as np
import pytest

import opsnn

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _profiled_page(tmp_path):
    rng = np.random.default_rng(0)
    x = opsnn.tensor(rng.standard_normal(50_000).astype(np.float32))
    a = opsnn.tensor(rng.standard_normal((96, 96)).astype(np.float32))
    streams = [opsnn.Stream(name=f"s{i}") for i in range(3)]
    cg = opsnn.compile(lambda t: opsnn.ops.relu(t), [x])
    with opsnn.profiler.profile() as p:
        with opsnn.profiler.record("warm-up"):
            for s in streams:
                with s:
                    for _ in range(3):
                        opsnn.ops.relu(x)
        with opsnn.profiler.record("products"):
            for _ in range(3):
                opsnn.ops.matmul(a, a)
        opsnn.ops.relu(x)
        for _ in range(2):
            cg.run([x])
    for s in streams:
        s.synchronize()
    return p.export_timeline(str(tmp_path / "timeline.html"))


def _launch(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)


def test_timeline_shows_axis_legend_lanes_regions_and_reacts(tmp_path):
    page_path = _profiled_page(tmp_path)
    shot = os.path.join(os.environ.get("OPSNN_ARTIFACTS", str(tmp_path)), "timeline.png")
    errors = []
    with playwright.sync_playwright() as pw:
        browser = _launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 600})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto("file://" + page_path)
            # lanes: one per stream, and host threads (the prepare phases ran on this thread)
            lanes = page.locator(".lane-label").all_inner_texts()
            assert {"stream s0", "stream s1", "stream s2", "stream default"} <= set(lanes)
            assert any(lane.startswith("host thread") for lane in lanes), lanes
            assert page.locator(".ev").count() >= 10
            # a time axis with units, ticks increasing left to right
            ticks = page.locator("#axis .tick").all_inner_texts()
            assert len(ticks) >= 3, ticks
            assert all(re.fullmatch(r"-?[0-9.]+ (us|ms|s)", t) for t in ticks), ticks
            xs = [page.locator("#axis .tick").nth(i).bounding_box()["x"] for i in range(len(ticks))]
            assert xs == sorted(xs)
            # a legend by op family, covering the families of the kernels that ran
            fams = set(page.locator(".legend-item").evaluate_all("els => els.map(e => e.dataset.family)"))
            assert {"activation", "matmul"} <= fams, fams
            ev_fams = set(page.locator(".ev").evaluate_all("els => els.map(e => e.dataset.family)"))
            assert ev_fams <= fams
            # region bands for profiler.record, labelled
            assert set(page.locator(".region").all_inner_texts()) == {"warm-up", "products"}
            # run boundaries of the compiled graph
            assert page.locator(".run-mark").count() == 2
            assert len(page.locator(".run-label").all_inner_texts()) == 2
            # summary above: span, kernel time, busy per stream, top ops
            summary = page.locator("#summary").inner_text()
            assert "span:" in summary and "kernel time:" in summary and "busy:" in summary
            assert "top ops:" in summary and ("Relu" in summary or "MatMul" in summary)
            # labels only where the block is wide enough: zoomed out, narrow blocks carry no text
            widths = page.locator(".ev").evaluate_all(
                "els => els.filter(e => e.style.display !== 'none')"
                ".map(e => [e.getBoundingClientRect().width, e.textContent])"
            )
            assert all((w >= 40) == bool(t) for w, t in widths), widths
            # hover shows the details
            ev = page.locator(".lane").nth(lanes.index("stream s1")).locator(".ev").first
            ev.hover(force=True)
            tip = page.locator("#tip")
            assert tip.is_visible() and "Relu" in tip.inner_text() and "relu" in tip.inner_text()
            assert "family: activation" in tip.inner_text()
            # zoom changes the range and the axis
            before, before_ticks = page.locator("#range").inner_text(), ticks
            page.mouse.move(600, 150)
            for _ in range(3):
                page.mouse.wheel(0, -400)
            assert page.locator("#range").inner_text() != before
            assert page.locator("#axis .tick").all_inner_texts() != before_ticks
            page.locator("#reset").click()
            assert page.locator("#top tbody tr").count() >= 2
            os.makedirs(os.path.dirname(shot), exist_ok=True)
            page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert errors == [], f"console errors: {errors}"
    Image = pytest.importorskip("PIL.Image")
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20, "the screenshot is (nearly) blank"
    white = sum(c for c, rgb in colours if min(rgb) > 245)
    assert white < 0.97 * img.width * img.height, "the screenshot is (nearly) blank"


def test_timeline_of_an_empty_profile_renders(tmp_path):
    with opsnn.profiler.profile() as p:
        pass
    page_path = p.export_timeline(str(tmp_path / "empty.html"))
    errors = []
    with playwright.sync_playwright() as pw:
        browser = _launch(pw)
        try:
            page = browser.new_page(viewport={"width": 800, "height": 300})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto("file://" + page_path)
            assert "kernels: 0" in page.locator("#summary").inner_text()
            assert page.locator("#axis .tick").count() >= 1
        finally:
            browser.close()
    assert errors == []
