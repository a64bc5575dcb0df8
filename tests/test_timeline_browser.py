"""The timeline page in a real browser (Debian's headless Chromium driven by Playwright):
it renders without console errors, shows one lane per stream and reacts to a hover.
A screenshot is written to $OPSNN_ARTIFACTS (default: the test's tmp dir) for review."""
import os
import shutil

import numpy as np
import pytest

import opsnn

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright (test extra) is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)")


def test_timeline_renders_lanes_and_hover(tmp_path):
    x = opsnn.tensor(np.random.default_rng(0).standard_normal(50_000).astype(np.float32))
    streams = [opsnn.Stream(name=f"s{i}") for i in range(3)]
    with opsnn.profiler.profile() as p:
        for s in streams:
            with s:
                for _ in range(3):
                    opsnn.ops.relu(x)
        opsnn.ops.relu(x)
    page_path = p.export_timeline(str(tmp_path / "timeline.html"))
    shot = os.path.join(os.environ.get("OPSNN_ARTIFACTS", str(tmp_path)), "timeline.png")
    errors = []
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 500})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto("file://" + page_path)
            lanes = page.locator(".lane-label").all_inner_texts()
            assert {"stream s0", "stream s1", "stream s2", "stream default"} <= set(lanes)
            assert page.locator(".ev").count() >= 10
            ev = page.locator(".lane").nth(lanes.index("stream s1")).locator(".ev").first
            ev.hover()
            tip = page.locator("#tip")
            assert tip.is_visible() and "Relu" in tip.inner_text() and "relu_numba" in tip.inner_text()
            before = page.locator("#range").inner_text()
            page.mouse.move(600, 150)
            page.mouse.wheel(0, -400)  # zoom in
            assert page.locator("#range").inner_text() != before
            assert page.locator("#top tbody tr").count() >= 1
            os.makedirs(os.path.dirname(shot), exist_ok=True)
            page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert errors == [], f"console errors: {errors}"
    assert os.path.getsize(shot) > 1000
