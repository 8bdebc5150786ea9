"""End to end: the IR Explorer in Debian's Chromium. Extract an IR and see mermaid draw it as SVG (the bundled mermaid,
no network), open a module by clicking its box, and check the render time of a collapsed view."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ir_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("e2e-ir")
    env = dict(os.environ, RESULTS_DB=str(tmp / "results.duckdb"), MODELS_DIR=str(tmp / "models"),
               ARTIFACTS_DIR=str(tmp / "artifacts"), MODELAB_LOCK_DIR=str(tmp), PYTHONPATH=str(REPO))
    port = _free_port()
    log = open(tmp / "streamlit.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/Home.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited early:\n{(tmp / 'streamlit.log').read_text()[-3000:]}")
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("streamlit did not start listening within 60 s")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        yield browser
        browser.close()


def test_extract_renders_the_mermaid_graph(ir_server: str, chromium) -> None:
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    logs: list[str] = []  # console.log lines: the graph component keeps the mermaid bundle's quiet
    page.on("console", lambda m: logs.append(m.text) if m.type in ("log", "debug", "info") else None)
    page.goto(f"{ir_server}/IR_Explorer", wait_until="domcontentloaded")
    extract = page.locator(".st-key-extract button").first
    extract.wait_for(state="visible", timeout=60_000)
    extract.click()  # the default model: llama, tiny preset (110 ops: every op is drawn)
    graph = page.locator(".irg[data-rendered]")
    graph.wait_for(state="attached", timeout=120_000)
    assert graph.get_attribute("data-rendered") == "ok", page.locator(".irg").inner_text()
    nodes = page.locator(".irg svg g.node")
    assert nodes.count() == 112  # 110 ops, the input and the output
    labels = page.locator(".irg svg").text_content()
    assert "scaled_dot_product_attention" in labels and "f32[1, 16, 64]" in labels
    assert page.locator(".irg svg path.flowchart-link, .irg svg .edgePaths path").count() > 100
    # mermaid came from the local server: nothing was fetched from elsewhere
    assert all(u.startswith(ir_server) or u.startswith(("data:", "blob:")) for u in requests), \
        [u for u in requests if not u.startswith(ir_server)]

    # One box per module, then open a decoder layer by clicking its box.
    page.locator(".st-key-view label").filter(has_text="One box per module").click()
    page.locator(".irg[data-rendered='ok'] svg g.node").first.wait_for(timeout=60_000)
    _wait_for_count(page, ".irg svg g.node", lambda n: 0 < n < 40)
    layer = page.locator(".irg svg g.node.irg-clickable").filter(has_text="layers.1")
    layer.first.wait_for(timeout=30_000)
    layer.first.click()
    page.locator(".irg svg g.cluster").first.wait_for(timeout=60_000)
    assert "layers.1.self_attn" in page.locator(".irg svg").text_content()
    assert float(page.locator(".irg").get_attribute("data-render-ms")) < 5000
    # the pane fits the graph (no taller than it needs at the width's scale), the caption sits below the drawing
    stage, status = page.locator(".irg-stage").bounding_box(), page.locator(".irg-status").bounding_box()
    assert status["y"] >= stage["y"] + stage["height"] - 1 and 160 <= stage["height"] <= 640
    page.locator(".irg-tools button[data-z='fit']").click()  # Fit: the whole graph inside the pane
    canvas = page.locator(".irg-canvas svg").bounding_box()
    assert canvas["width"] <= stage["width"] + 1 and canvas["height"] <= stage["height"] + 1
    page.wait_for_timeout(1000)
    assert not logs, logs[:10]
    page.close()


def _wait_for_count(page, selector: str, ok, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    n = -1
    while time.monotonic() < deadline:
        n = page.locator(selector).count()
        if ok(n):
            return n
        time.sleep(0.2)
    raise AssertionError(f"{selector}: count {n} never satisfied the check")
