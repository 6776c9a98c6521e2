"""The Prometheus alert rules of docs/prometheus-alerts.yml: valid for
promtool, firing as documented on made-up series (promtool test rules),
and naming only metrics a node's /metrics exports."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "prometheus-alerts.yml"


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_the_alert_rules_pass_promtool() -> None:
    checked = _promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


def test_the_alerts_fire_as_documented() -> None:
    tested = _promtool("test", "rules", "prometheus-alerts-test.yml", cwd=ROOT / "tests" / "data")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_alert_rules_name_metrics_a_node_exports(node_factory: Any) -> None:
    from ..helpers import free_port

    web = free_port()
    node = node_factory("--web-port", str(web))
    redis.Redis(port=node.port).execute_command("ADDJOB", "q", "x", 0)  # a queue's series
    with urllib.request.urlopen(f"http://127.0.0.1:{web}/metrics", timeout=10) as reply:
        exported = set(re.findall(r"^(disque_\w+?)(?:\{| )", reply.read().decode(), re.M))
    named = set(re.findall(r"\b(disque_\w+)", RULES.read_text()))
    assert named  # the regexes read something
    assert named <= exported, named - exported
