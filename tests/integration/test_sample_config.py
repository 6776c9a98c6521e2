"""docs/disque.conf, the sample configuration: every directive in it (set,
or left off as "#name value") is one config.py knows, and a node starts
from it."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import redis

from disque_trio.config import DIRECTIVES, Config

from ..helpers import free_port
from .conftest import NodeProcess

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "docs" / "disque.conf"
# What a user sets: the sample must show each of these, set or left off.
EXPECTED = {
    "port",
    "bind",
    "dir",
    "logfile",
    "loglevel",
    "pidfile",
    "requirepass",
    "maxclients",
    "maxmemory",
    "appendonly",
    "appendfilename",
    "appendfsync",
    "cluster-config-file",
    "cluster-node-timeout",
    "cluster-port",
    "web-port",
    "web-allowed-origins",
}


def sample_lines() -> tuple[list[str], list[str]]:
    """(lines that set a directive, lines that leave one off: "#name value")."""
    active, disabled = [], []
    for raw in SAMPLE.read_text().splitlines():
        line = raw.strip()
        if not line:
            continue
        if re.match(r"#[a-z]", line):
            disabled.append(line[1:])
        elif not line.startswith("#"):
            active.append(line)
    return active, disabled


def test_every_directive_in_the_sample_is_known_and_valid(tmp_path: Path) -> None:
    active, disabled = sample_lines()
    names = [line.split()[0] for line in active + disabled]
    unknown = [n for n in names if n not in DIRECTIVES]
    assert not unknown, unknown
    ignored = [n for n in names if DIRECTIVES[n].ignored]
    assert not ignored, f"directives without effect in the sample: {ignored}"
    assert not EXPECTED - set(names), EXPECTED - set(names)
    # Each set once, so that no later line silently overrides an earlier one.
    assert len({line.split()[0] for line in active}) == len(active)
    config = Config.load(str(SAMPLE))
    assert config.appendonly and config.dir == "/var/lib/disque-trio"
    # The settings left off parse too, once uncommented.
    enabled = tmp_path / "enabled.conf"
    enabled.write_text(SAMPLE.read_text() + "\n".join(disabled) + "\n")
    config = Config.load(str(enabled))
    assert config.requirepass and config.cluster_announce_ip


def test_node_starts_from_the_sample(tmp_path: Path) -> None:
    port = free_port()
    node = NodeProcess(port, tmp_path, [str(SAMPLE), "--port", str(port), "--dir", str(tmp_path)])
    node.start()
    try:
        r = redis.Redis(port=port, socket_timeout=10, decode_responses=True)
        assert r.execute_command("ADDJOB", "q", "hello", 0)
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("web-port") == {"web-port": "auto"}
        assert r.info("persistence")["aof_enabled"] == 1
        assert (tmp_path / "disque.aof").stat().st_size > 0
        assert node.kill(signal.SIGTERM) == 0
        out = node.output()
        assert "ready to accept connections" in out
        assert "has no effect" not in out and "Traceback" not in out, out
    finally:
        node.stop()
