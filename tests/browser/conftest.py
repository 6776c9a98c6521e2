"""Fixtures for the real-browser tests: Debian's headless chromium driven by
Selenium, a real node process with its web listener, and screenshots kept as
CI artifacts whose paths are printed at the end of the run."""

from __future__ import annotations

import base64
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.chrome.service import Service

from ..helpers import free_port
from ..integration.conftest import NodeProcess

# Debian's packages (`apt-get install chromium chromium-driver`, done by
# .ci/run). Selenium is given both paths, so it never tries to download a
# browser or a driver (the machine has no internet anyway).
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # CI runs as root, where chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-background-networking",
    "--window-size=1400,1000",
]

# Screenshots saved during the run, printed by pytest_terminal_summary: the
# test's own output is captured, the summary always reaches the log.
_screenshots: list[Path] = []


def artifacts_dir(config: pytest.Config) -> Path:
    """$CI_ARTIFACTS_DIR when CI sets it, else artifacts/ (gitignored)."""
    configured = os.environ.get("CI_ARTIFACTS_DIR")
    path = Path(configured) if configured else config.rootpath / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _screenshots:
        terminalreporter.section("dashboard screenshots")
        for path in _screenshots:
            terminalreporter.write_line(f"screenshot: {path}")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """A headless chromium, or a skip on a machine without one."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(f"needs Debian's chromium and chromium-driver: {', '.join(missing)} missing")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    # Keep the page's console, so a failing test can show JavaScript errors.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = WebDriver(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[WebDriver, str], Path]:
    """screenshot(driver, "name") saves the whole page as name.png."""
    directory = artifacts_dir(request.config)

    def save(driver: WebDriver, name: str) -> Path:
        path = directory / f"{name}.png"
        path.write_bytes(full_page_png(driver))
        _screenshots.append(path)
        return path

    return save


def full_page_png(driver: WebDriver) -> bytes:
    """The whole page, not just the window: headless chromium keeps the
    viewport at --window-size, so ask DevTools to capture beyond it."""
    width, height = driver.execute_script(
        "window.scrollTo(0, 0);"
        "const e = document.documentElement; return [e.scrollWidth, e.scrollHeight];"
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
        },
    )
    return base64.b64decode(shot["data"])


class WebNode(NodeProcess):
    """A node process and the port of its web listener."""

    def __init__(self, port: int, workdir: Path, *extra: str) -> None:
        super().__init__(port, workdir, ["--port", str(port), "--bind", "127.0.0.1", *extra])
        # The default web port: the client port + 1000 (free_port checks it).
        self.web_port = port + 1000

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}/"

    def wait_web(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no web listener on {self.url} after {timeout}s")
            time.sleep(0.05)


def _running(node: WebNode) -> Iterator[WebNode]:
    try:
        node.start()
        node.wait_web()  # /healthz needs no password
        yield node
    finally:
        node.stop()


@pytest.fixture
def web_node(tmp_path: Path) -> Iterator[WebNode]:
    yield from _running(WebNode(free_port(), tmp_path))


PASSWORD = "s3cret"


@pytest.fixture
def protected_web_node(tmp_path: Path) -> Iterator[WebNode]:
    """A node started with ``requirepass`` PASSWORD."""
    yield from _running(WebNode(free_port(), tmp_path, "--requirepass", PASSWORD))
