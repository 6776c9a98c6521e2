"""The simulator's run timeline (sim/timeline.py) in a real browser: the
page of a failing run renders its lanes, faults, bars and the violating
job's arrows, the job menu moves the highlight, zoom stretches time, and
the console stays free of errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from sim import timeline
from sim.plan import Plan
from sim.runs import run_plan

from .test_dashboard import css, wait_for


def failing_page(tmp_path: Path) -> Path:
    outcome = run_plan(Plan.from_seed(1), "aof-write-dropped")
    assert not outcome.ok
    meta = timeline.Meta("seed 1", "python -m sim run --seed 1", tuple(outcome.violations))
    path = tmp_path / "seed-1.html"
    path.write_text(timeline.from_trace_lines(outcome.world.trace.lines, meta))
    return path


def shown(driver: WebDriver, selector: str) -> int:
    """How many elements match and have a box on the page."""
    count: int = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].filter(e => {"
        "const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0;}).length",
        selector,
    )
    return count


def test_timeline_renders_and_moves_the_highlight(
    browser: WebDriver, tmp_path: Path, screenshot: Callable[[WebDriver, str], Path]
) -> None:
    browser.get(failing_page(tmp_path).as_uri())
    wait_for(browser, "the timeline", lambda d: css(d, "#timeline").is_displayed())
    assert shown(browser, ".node-lane .lane-bg") == 6  # seed 1: six nodes
    assert shown(browser, "rect.fault") >= 1
    assert shown(browser, "rect.op") > 50
    assert shown(browser, "rect.op.hl") >= 1
    assert shown(browser, "g.arrow:not(.off) line") >= 1
    assert "always-no-amnesia" in css(browser, "#violations").text
    menu = Select(css(browser, "#job"))
    assert len(menu.options) >= 2
    first = menu.first_selected_option.get_attribute("value")
    second = menu.options[1].get_attribute("value")
    menu.select_by_index(1)
    jobs = {e.get_attribute("data-job") for e in browser.find_elements(By.CSS_SELECTOR, ".op.hl")}
    assert jobs <= {second} and first not in jobs
    visible = browser.find_elements(By.CSS_SELECTOR, ".arrow:not(.off), .mark:not(.off)")
    assert {e.get_attribute("data-job") for e in visible} <= {second}
    css(browser, "#violations .pick").click()  # back to the job the violation names first
    assert menu.first_selected_option.get_attribute("value") == first
    jobs = {e.get_attribute("data-job") for e in browser.find_elements(By.CSS_SELECTOR, ".op.hl")}
    assert jobs == {first}
    width = float(css(browser, "#timeline").get_attribute("width") or 0)
    css(browser, "#zoom-in").click()
    assert float(css(browser, "#timeline").get_attribute("width") or 0) > 1.9 * width - 200
    screenshot(browser, "sim-timeline")
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
