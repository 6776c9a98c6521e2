"""The dashboard's cluster view in a real browser: headless chromium loads
the page of one node of a real three-node cluster, sees every node with its
figures and the queues summed across them, then one node is killed with
SIGKILL: its row turns failing while the page stays live, the sums drop its
jobs, and a job looked up by ID shows each copy, the dead node's as
unreachable (screenshot: artifacts/dashboard-cluster-failed.png).

And what the totals and the queues say is true: with REPLICATE 2 and 3 the
totals count jobs beside copies, jobs handed to a consumer and not acked
are shown waiting for their RETRY with the time the next comes back, and a
killed node is "unreachable" (amber) until the node timeout marks it
PFAIL, never a green ok beside its red link (screenshot:
artifacts/dashboard-cluster.png)."""

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


# Long enough to see a killed node unreachable before it is PFAIL.
SLOW_NODE_TIMEOUT_MS = 15_000


def _three(tmp_path: Path, node_timeout_ms: int) -> Iterator[list[WebNode]]:
    nodes = []
    try:
        for i in range(3):
            workdir = tmp_path / f"node-{i}"
            workdir.mkdir()
            node = WebNode(free_port(), workdir, "--cluster-node-timeout", str(node_timeout_ms))
            nodes.append(node)
            node.start()
            node.wait_web()
        meet(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[list[WebNode]]:
    """Three nodes (node timeout 1 s) that know each other."""
    yield from _three(tmp_path, NODE_TIMEOUT_MS)


@pytest.fixture
def three_slow_nodes(tmp_path: Path) -> Iterator[list[WebNode]]:
    """Three nodes (node timeout 15 s) that know each other."""
    yield from _three(tmp_path, SLOW_NODE_TIMEOUT_MS)


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
    (tmp_path / "dashboard-cluster-failed.png").write_bytes(png)
    screenshot(browser, "dashboard-cluster-failed")


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


def open_with_every_node_live(driver: WebDriver, nodes: list[WebNode], ids: list[str]) -> None:
    """The first node's dashboard, connected, each node's row showing the
    figures it sent over the bus."""
    driver.get(nodes[0].url)
    wait_for(driver, "the connected state", lambda d: connection_state(d) == "connected")
    for node_id in ids:
        wait_for(
            driver,
            f"figures of {node_id[:8]}",
            lambda d, n=node_id: "live" in cluster_row(d, n).text,
        )


def drive(driver: WebDriver, nodes: list[WebNode], ids: list[str], shared: str) -> None:
    # Every node, with figures it sent over the bus; the queues summed.
    open_with_every_node_live(driver, nodes, ids)
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


def footer(driver: WebDriver, field: str) -> str:
    return css(driver, f'#cluster-foot [data-field="{field}"]').text


def cqueue_waiting(driver: WebDriver, queue: str) -> str:
    return css(driver, f'#cqueues-body tr[data-queue="{queue}"] td[data-field="requeue"]').text


def seconds_back(text: str) -> int:
    """'3 · back in 1m 52s' -> 112."""
    when = text.split("back in ", 1)[1]
    minutes, _, secs = when.rpartition("m ")
    return int(minutes or 0) * 60 + int(secs.rstrip("s"))


def test_jobs_copies_retries_and_a_killed_node_say_what_is_true(
    browser: WebDriver,
    three_slow_nodes: list[WebNode],
    tmp_path: Path,
    screenshot: Callable[[WebDriver, str], Path],
) -> None:
    nodes = three_slow_nodes
    ids = []
    for i, node in enumerate(nodes):
        r = redis.Redis(port=node.port, decode_responses=True, socket_timeout=10)
        ids.append(r.execute_command("CLUSTER", "MYID"))
        if i == 0:  # 4 jobs with 2 copies each: 3 handed out, not acked
            for n in range(4):
                r.execute_command("ADDJOB", "emails", f"mail {n}", 0, "REPLICATE", 2, "RETRY", 120)
            assert len(r.execute_command("GETJOB", "NOHANG", "COUNT", 3, "FROM", "emails")) == 3
        elif i == 1:  # 2 jobs with 3 copies each
            for n in range(2):
                r.execute_command("ADDJOB", "invoices", f"inv {n}", 0, "REPLICATE", 3, "RETRY", 60)
        else:  # 3 jobs with 1 copy
            for n in range(3):
                r.execute_command("ADDJOB", "thumbnails", f"img-{n}.png", 0, "REPLICATE", 1)
        r.close()
    try:
        check_the_truth(browser, nodes, ids, screenshot)
    except BaseException:
        screenshot(browser, "dashboard-cluster-truth-failure")
        for entry in browser.get_log("browser"):
            print("console:", entry)
        raise


def check_the_truth(
    driver: WebDriver,
    nodes: list[WebNode],
    ids: list[str],
    screenshot: Callable[[WebDriver, str], Path],
) -> None:
    open_with_every_node_live(driver, nodes, ids)
    # 9 jobs: 4 x 2 copies + 2 x 3 + 3 x 1 = 17 copies (or more: an ADDJOB
    # whose copy is slow to confirm adds a node after 50 ms). The nodes'
    # Jobs cells count copies; the totals count both.
    wait_for(driver, "9 jobs", lambda d: footer(d, "distinct") == "9")
    copies = sum(
        int(cluster_row(driver, n).find_elements(By.CSS_SELECTOR, "td.num")[0].text) for n in ids
    )
    assert copies >= 17
    assert footer(driver, "jobs") == f"9 jobs · {copies} copies"

    # The 3 emails handed out wait for their RETRY (120 s): counted once
    # though each has two copies, with the time the first one comes back.
    waiting = wait_for(
        driver,
        "emails waiting",
        lambda d: (
            cqueue_waiting(d, "emails").startswith("3 · back in") and cqueue_waiting(d, "emails")
        ),
    )
    assert 60 < seconds_back(waiting) <= 121, waiting
    assert cqueue_total(driver, "emails") == "1"  # the one not handed out
    assert cqueue_waiting(driver, "invoices") == "\u2014"
    mine = css(driver, '#queues-body tr[data-queue="emails"] td[data-field="requeue"]').text
    assert mine.startswith("3 · back in"), mine
    assert footer(driver, "requeue").startswith(
        "3 jobs waiting for their RETRY or a delay · next back in "
    )

    # SIGKILL the third: its link drops at once, PFAIL needs 15 s. Meanwhile
    # it is unreachable (amber), not ok beside a link that is down.
    nodes[2].kill(signal.SIGKILL)
    killed = time.monotonic()
    row = wait_for(
        driver,
        "the killed node unreachable",
        lambda d: (
            cluster_row(d, ids[2]).get_dom_attribute("data-state") == "unreachable"
            and cluster_row(d, ids[2])
        ),
    )
    state = row.find_element(By.CSS_SELECTOR, '[data-field="state"] .badge')
    link = row.find_element(By.CSS_SELECTOR, '[data-field="link"] .badge')
    assert state.text == "unreachable" and "badge-warn" in (state.get_dom_attribute("class") or "")
    assert link.text == "disconnected" and "badge-bad" in (link.get_dom_attribute("class") or "")
    assert "node-unreachable" in (row.get_dom_attribute("class") or "")
    assert "1 unreachable" in css(driver, "#cluster-count").text
    # The survivors' census: the thumbnails were on the dead node alone.
    wait_for(driver, "6 jobs left", lambda d: footer(d, "distinct") == "6")
    assert cqueue_waiting(driver, "emails").startswith("3 · back in")
    screenshot(driver, "dashboard-cluster")
    still = cluster_row(driver, ids[2]).get_dom_attribute("data-state")
    assert still == "unreachable" and time.monotonic() - killed < SLOW_NODE_TIMEOUT_MS / 1000
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
