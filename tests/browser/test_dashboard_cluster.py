"""The dashboard's cluster view in a real browser: headless chromium loads
the page of one node of a real three-node cluster, sees every node with its
figures and the queues summed across them, then one node is killed with
SIGKILL: its row turns failing while the page stays live, the sums drop its
jobs, and a job looked up by ID shows each copy, the dead node's as
unreachable. A screenshot is saved (pytest's tmp dir and artifacts/)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

from disque_trio.client import Client

from ..helpers import free_port
from .conftest import WebNode, full_page_png
from .test_dashboard import click, connection_state, css, wait_for

NODE_TIMEOUT_MS = 1000


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[list[WebNode]]:
    """Three nodes (node timeout 1 s) that know each other."""
    nodes = []
    try:
        for i in range(3):
            workdir = tmp_path / f"node-{i}"
            workdir.mkdir()
            node = WebNode(free_port(), workdir, "--cluster-node-timeout", str(NODE_TIMEOUT_MS))
            nodes.append(node)
            node.start()
            node.wait_web()
        meet(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def meet(nodes: list[WebNode]) -> None:
    first = redis.Redis(port=nodes[0].port, decode_responses=True, socket_timeout=10)
    for other in nodes[1:]:
        first.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port)
    first.close()
    deadline = time.monotonic() + 15
    while True:
        sizes = []
        for node in nodes:
            with Client(f"127.0.0.1:{node.port}") as c:
                sizes.append(sum(p.priority == 1 for p in c.hello().nodes))
        if sizes == [len(nodes)] * len(nodes):
            return
        assert time.monotonic() < deadline, f"no full mesh: {sizes}"
        time.sleep(0.1)


def cluster_row(driver: WebDriver, node_id: str) -> WebElement:
    return css(driver, f'#cluster-body tr[data-node="{node_id}"]')


def cqueue_total(driver: WebDriver, queue: str) -> str:
    return css(driver, f'#cqueues-body tr[data-queue="{queue}"] td.total').text


def cqueue_lengths(driver: WebDriver, queue: str) -> dict[str | None, str]:
    """The queue's length on each node (its column), by node ID."""
    row = css(driver, f'#cqueues-body tr[data-queue="{queue}"]')
    cells = row.find_elements(By.CSS_SELECTOR, "td[data-node]")
    return {td.get_dom_attribute("data-node"): td.text for td in cells}


def test_cluster_view_with_a_node_killed(
    browser: WebDriver,
    three_nodes: list[WebNode],
    tmp_path: Path,
    screenshot: Callable[[WebDriver, str], Path],
) -> None:
    nodes = three_nodes
    ids, shared = load_jobs(nodes)
    try:
        drive(browser, nodes, ids, shared)
    except BaseException:
        screenshot(browser, "dashboard-cluster-failure")
        for entry in browser.get_log("browser"):
            print("console:", entry)
        raise
    png = full_page_png(browser)
    (tmp_path / "dashboard-cluster.png").write_bytes(png)
    screenshot(browser, "dashboard-cluster")


def load_jobs(nodes: list[WebNode]) -> tuple[list[str], str]:
    """1, 2 and 3 jobs in "emails" on the three nodes, 4 in "thumbnails" on
    the second, and a job with a copy on every node (queued on the second)."""
    ids = []
    shared = ""
    for i, node in enumerate(nodes):
        r = redis.Redis(port=node.port, decode_responses=True, socket_timeout=10)
        ids.append(r.execute_command("CLUSTER", "MYID"))
        for n in range(i + 1):
            r.execute_command("ADDJOB", "emails", f"mail {n}", 0, "REPLICATE", 1)
        if i == 1:
            for n in range(4):
                r.execute_command("ADDJOB", "thumbnails", f"img-{n}.png", 0, "REPLICATE", 1)
            shared = r.execute_command(
                "ADDJOB", "invoices", "inv-7", 0, "REPLICATE", 3, "RETRY", 60
            )
        r.close()
    return ids, shared


def drive(driver: WebDriver, nodes: list[WebNode], ids: list[str], shared: str) -> None:
    driver.get(nodes[0].url)
    wait_for(driver, "the connected state", lambda d: connection_state(d) == "connected")
    # Every node, with figures it sent over the bus; the queues summed.
    for node_id in ids:
        wait_for(
            driver,
            f"figures of {node_id[:8]}",
            lambda d, n=node_id: "live" in cluster_row(d, n).text,
        )
    wait_for(driver, "emails summed", lambda d: cqueue_total(d, "emails") == "6")
    assert cqueue_lengths(driver, "emails") == {ids[0]: "1", ids[1]: "2", ids[2]: "3"}
    assert "this node" in cluster_row(driver, ids[0]).text

    # SIGKILL the third: its row turns failing, live, within the node timeout.
    nodes[2].kill(signal.SIGKILL)
    killed = time.monotonic()
    row = wait_for(
        driver,
        "the killed node failing",
        lambda d: (
            cluster_row(d, ids[2]).get_dom_attribute("data-state") in ("pfail", "fail")
            and cluster_row(d, ids[2])
        ),
    )
    assert time.monotonic() - killed < NODE_TIMEOUT_MS / 1000 + 3
    assert "node-down" in (row.get_dom_attribute("class") or "")
    assert "unreachable" in row.text and "disconnected" in row.text
    wait_for(driver, "emails without it", lambda d: cqueue_total(d, "emails") == "3")
    # Its column is not counted: a dash, not a zero.
    assert cqueue_lengths(driver, "emails") == {ids[0]: "1", ids[1]: "2", ids[2]: "\u2013"}
    assert "failing" in css(driver, "#cluster-count").text

    # A job by ID: its copies on the two live nodes, the dead one unreachable.
    css(driver, "#find-id").send_keys(shared)
    click(driver, "#find-submit")
    wait_for(
        driver, "the copies", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#find-body tr")) == 3
    )
    copy = {
        r.get_dom_attribute("data-node"): r.find_element(
            By.CSS_SELECTOR, '[data-field="copy"]'
        ).text
        for r in driver.find_elements(By.CSS_SELECTOR, "#find-body tr")
    }
    assert copy == {ids[0]: "active", ids[1]: "queued", ids[2]: "unreachable"}
    assert "2 copies held" in css(driver, "#find-summary").text
    # The page is still live: the single-node views keep updating.
    wait_for(
        driver, "this node's queues", lambda d: css(d, '#queues-body tr[data-queue="emails"]')
    )
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
