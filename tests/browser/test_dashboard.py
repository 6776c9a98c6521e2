"""The dashboard in a real browser: headless chromium loads the page of a
running node, sees queues appear, pauses one with its button, adds a job
through the form and finds it in the job browser, then saves a screenshot.
With requirepass set, the page needs HTTP credentials, which the browser
then sends with the page's own requests, the /ws handshake included."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

import disque_trio.about

from .conftest import PASSWORD, WebNode

WAIT_S = 10  # stats arrive once a second; anything slower than this is a bug


def wait_for(driver: WebDriver, what: str, check: Callable[[WebDriver], Any]) -> Any:
    """The first truthy value of check(driver), polled for at most WAIT_S."""
    waiter = WebDriverWait(
        driver,
        WAIT_S,
        poll_frequency=0.05,
        ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
    )
    return waiter.until(check, message=f"waited {WAIT_S}s for {what}")


def css(driver: WebDriver, selector: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, selector)


def queue_row(driver: WebDriver, name: str) -> WebElement:
    return css(driver, f'#queues-body tr[data-queue="{name}"]')


def click(driver: WebDriver, selector: str) -> None:
    wait_for(driver, f"{selector} to be enabled", lambda d: css(d, selector).is_enabled())
    css(driver, selector).click()


@contextmanager
def traffic(port: int, queue: str) -> Iterator[None]:
    """Jobs flowing through ``queue`` (add, fetch, ack) while the test runs,
    so the page has rates to draw and job events to log."""
    stop = threading.Event()

    def run() -> None:
        r = redis.Redis(port=port, decode_responses=True, socket_timeout=5)
        n = 0
        while not stop.wait(0.15):
            n += 1
            r.execute_command("ADDJOB", queue, f"hello #{n}", 0)
            if n % 3:
                for _, job_id, _body in r.execute_command("GETJOB", "NOHANG", "FROM", queue) or []:
                    r.execute_command("ACKJOB", job_id)
        r.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def test_dashboard_live(
    browser: WebDriver, web_node: WebNode, screenshot: Callable[[WebDriver, str], Path]
) -> None:
    r = redis.Redis(port=web_node.port, decode_responses=True, socket_timeout=10)
    try:
        drive_dashboard(web_node, browser, r, screenshot)
    except BaseException:
        screenshot(browser, "dashboard-failure")
        for entry in browser.get_log("browser"):  # shown by pytest with the failure
            print("console:", entry)
        raise
    finally:
        r.close()


def drive_dashboard(
    node: WebNode,
    driver: WebDriver,
    r: redis.Redis,
    screenshot: Callable[[WebDriver, str], Path],
) -> None:
    driver.get(node.url)
    wait_for(driver, "the connected state", lambda d: connection_state(d) == "connected")
    node_id = r.execute_command("CLUSTER", "MYID")
    wait_for(driver, "the node id", lambda d: node_id.startswith(css(d, "#node-id").text))
    # The header names the node's release, and its commit on hover.
    release = css(driver, "#node-release")
    assert release.text == f"disque-trio {disque_trio.__version__}"
    assert disque_trio.about.commit() in (release.get_attribute("title") or "")

    # A queue appears live after an ADDJOB on the RESP port.
    r.execute_command("ADDJOB", "orders", "order #1", 0)
    r.execute_command("ADDJOB", "orders", "order #2", 0)
    wait_for(driver, "the orders row", lambda d: queue_row(d, "orders"))
    wait_for(driver, "orders length 2", lambda d: row_cell_text(d, "orders", ".len") == "2")

    # Pause all, seen by the node and by the page; then resume.
    click(driver, '[data-action="pause-all"][data-queue="orders"]')
    wait_for(driver, "orders paused", lambda d: pause_shown(d, "orders") == "all")
    assert r.execute_command("PAUSE", "orders", "state") == "all"
    assert qstat(r, "orders")["pause"] == "all"
    assert row_cell_text(driver, "orders", '[data-field="pause"]') == "paused"
    click(driver, '[data-action="resume"][data-queue="orders"]')
    wait_for(driver, "orders running", lambda d: pause_shown(d, "orders") == "none")
    assert r.execute_command("PAUSE", "orders", "state") == "none"

    # A job added through the form shows up in the job browser and its
    # detail panel (the form also selects its queue).
    job_id = add_job_through_form(driver, "emails", "welcome mail for ada@example.com")
    show = dict(pairs(r.execute_command("SHOW", job_id)))
    assert show["queue"] == "emails" and show["body"] == "welcome mail for ada@example.com"
    wait_for(driver, "the job's row", lambda d: css(d, f'#jobs-body tr[data-job="{job_id}"]'))
    wait_for(driver, "the job detail", lambda d: css(d, "#detail-id").text == job_id)

    with traffic(node.port, "emails"):
        # A third queue, paused for output with its button, for the picture.
        for n in range(5):
            r.execute_command("ADDJOB", "thumbnails", f"resize img-{n}.png", 0)
        wait_for(driver, "the thumbnails row", lambda d: queue_row(d, "thumbnails"))
        click(driver, '[data-action="pause-out"][data-queue="thumbnails"]')
        wait_for(driver, "thumbnails paused out", lambda d: pause_shown(d, "thumbnails") == "out")
        assert r.execute_command("PAUSE", "thumbnails", "state") == "out"

        # Events of the watched queue, and a few seconds of rates.
        wait_for(driver, "an acked event", lambda d: css(d, '#events-log li[data-what="acked"]'))
        wait_for(driver, "a sparkline", lambda d: css(d, '[data-queue="emails"] svg.in polyline'))
    # The job list offers a refresh after the traffic's events; take it.
    click(driver, "#jobs-stale")
    wait_for(
        driver,
        "more jobs listed",
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#jobs-body tr")) > 1,
    )
    # Clicking a job opens its SHOW detail.
    first = css(driver, "#jobs-body tr")
    listed_id = first.get_dom_attribute("data-job")
    first.find_element(By.CSS_SELECTOR, "button.jid").click()
    wait_for(driver, "the clicked job's detail", lambda d: css(d, "#detail-id").text == listed_id)
    wait_for(driver, "INFO", lambda d: css(d, '#info-sections details[data-section="Server"]'))
    rows = driver.find_elements(By.CSS_SELECTOR, "#queues-body tr")
    assert [row.get_dom_attribute("data-queue") for row in rows] == [
        "emails",
        "orders",
        "thumbnails",
    ]
    wait_for(
        driver, "the toasts to fade", lambda d: not d.find_elements(By.CSS_SELECTOR, ".toast")
    )
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
    screenshot(driver, "dashboard")
    driver.set_window_size(420, 1000)  # a phone: one column, tables scroll sideways
    wait_for(driver, "one column", lambda d: d.execute_script("return innerWidth") <= 420)
    screenshot(driver, "dashboard-narrow")


def connection_state(driver: WebDriver) -> str | None:
    return css(driver, "#conn-state").get_dom_attribute("data-state")


def pause_shown(driver: WebDriver, queue: str) -> str | None:
    return queue_row(driver, queue).get_dom_attribute("data-pause")


def row_cell_text(driver: WebDriver, queue: str, selector: str) -> str:
    return queue_row(driver, queue).find_element(By.CSS_SELECTOR, selector).text


def add_job_through_form(driver: WebDriver, queue: str, body: str) -> str:
    css(driver, "#add-queue").send_keys(queue)
    css(driver, "#add-body").send_keys(body)
    css(driver, "#add-retry").send_keys("30")
    click(driver, "#add-submit")
    code = wait_for(driver, "the new job id", lambda d: css(d, "#addjob-result.ok code"))
    job_id: str = code.text
    assert job_id.startswith("D-"), job_id
    return job_id


def qstat(r: redis.Redis, queue: str) -> dict[str, Any]:
    return dict(pairs(r.execute_command("QSTAT", queue)))


def pairs(flat: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(flat[::2], flat[1::2], strict=True))


def test_dashboard_behind_requirepass(browser: WebDriver, protected_web_node: WebNode) -> None:
    node = protected_web_node
    r = redis.Redis(port=node.port, password=PASSWORD, decode_responses=True, socket_timeout=10)
    try:
        r.execute_command("ADDJOB", "private", "x", 0)
        # Without credentials: the browser gets the 401, not the page.
        browser.get(node.url)
        assert not browser.find_elements(By.CSS_SELECTOR, "#conn-state")
        assert "private" not in browser.page_source
        # With them (what the browser's own password prompt would give it):
        # the page, its script and style load, and the WebSocket is let in
        # already authenticated: the page's own AUTH dialog never shows.
        with_credentials = node.url.replace("http://", f"http://anyone:{PASSWORD}@", 1)
        browser.get(with_credentials)
        wait_for(browser, "the connected state", lambda d: connection_state(d) == "connected")
        assert not css(browser, "#auth-dialog").get_dom_attribute("open")
        wait_for(browser, "the private row", lambda d: queue_row(d, "private"))
        r.execute_command("ADDJOB", "private", "y", 0)
        wait_for(browser, "private length 2", lambda d: row_cell_text(d, "private", ".len") == "2")
        assert browser.execute_script("return location.href") == node.url  # not kept in the URL
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        # Only the first, refused page load.
        assert all("401" in e["message"] for e in severe), severe
    finally:
        r.close()
