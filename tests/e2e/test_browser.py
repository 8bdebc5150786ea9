"""End to end: start the real dashboard, drive it in Debian's Chromium through Playwright.

Click "Run benchmark" on the eager card and see the latency chart appear (the run goes through the real job runner
and worker process); submit the Predict form and see a price. Playwright's own browsers are never downloaded: it
launches /usr/bin/chromium.
"""

from __future__ import annotations

import os
import re
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
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("e2e")
    env = dict(os.environ, RESULTS_DB=str(tmp / "results.duckdb"), MODELS_DIR=str(tmp / "models"),
               ARTIFACTS_DIR=str(tmp / "artifacts"), MODELAB_LOCK_DIR=str(tmp), PYTHONPATH=str(REPO))
    # A trained model for the Predict form (2 epochs: seconds, real weights through the real training code).
    subprocess.run([sys.executable, "-m", "engine", "train", "--mode", "eager", "--epochs", "2"], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=300)
    port = _free_port()
    log = open(tmp / "streamlit.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/Home.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
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
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        yield browser
        browser.close()


def test_run_eager_benchmark_shows_chart(server: str, browser) -> None:
    page = browser.new_page()
    page.goto(f"{server}/Benchmark", wait_until="domcontentloaded")
    button = page.locator(".st-key-run-eager button")
    button.wait_for(state="visible", timeout=60_000)
    assert page.locator(".js-plotly-plot").count() == 0  # a fresh store: no chart until a run is ok
    button.click()
    # The run goes: queued → worker process → store → the page's live fragment reruns the page → chart.
    page.locator(".st-key-chart-latency .js-plotly-plot").wait_for(state="visible", timeout=180_000)
    text = page.locator(".st-key-chart-latency").inner_text()
    assert "eager" in text
    page.close()


def test_predict_form_shows_price(server: str, browser) -> None:
    page = browser.new_page()
    page.goto(f"{server}/Predict", wait_until="domcontentloaded")
    submit = page.locator(".st-key-predict button")
    submit.wait_for(state="visible", timeout=60_000)
    submit.click()
    metric = page.locator('.st-key-predicted-price [data-testid="stMetricValue"]')
    metric.first.wait_for(state="visible", timeout=60_000)
    assert re.fullmatch(r"\$\d{1,3}(,\d{3})+", metric.first.inner_text().strip())
    page.close()
