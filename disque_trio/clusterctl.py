"""``disque-trio cluster create|status``: introduce nodes to each other, and
look at a cluster, from the command line (what ``redis-cli --cluster``
does for Redis Cluster). Over the nodes' client ports, with the blocking
client; nothing here runs a node.

    disque-trio cluster create 10.0.0.1:7711 10.0.0.2:7711 10.0.0.3:7711
    disque-trio cluster status 10.0.0.1:7711
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .client import Client, DisqueError
from .client.cluster import parse_nodes
from .client.types import Address

USAGE = """\
Usage: disque-trio cluster create HOST:PORT HOST:PORT [...] [--password P] [--timeout S]
       disque-trio cluster status HOST:PORT [--password P]
"""


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="disque-trio cluster", usage=USAGE)
    parser.add_argument("action", choices=["create", "status"])
    parser.add_argument("nodes", nargs="+", metavar="HOST:PORT")
    parser.add_argument("--password", help="requirepass of the nodes (the same on each)")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="create: seconds to wait for the mesh"
    )
    args = parser.parse_args(list(argv))
    try:
        addresses = [parse_nodes(n).addresses[0] for n in args.nodes]
    except ValueError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 2
    if args.action == "create":
        return create(addresses, args.password, args.timeout)
    if len(addresses) != 1:
        print("cluster status: one HOST:PORT (any node of the cluster)", file=sys.stderr)
        return 2
    return status(addresses[0], args.password)


def _client(address: Address, password: str | None) -> Client:
    return Client(
        [address], password=password, follow_producers=False, route_by_job_id=False, timeout=5
    )


def create(addresses: list[Address], password: str | None, timeout: float) -> int:
    """CLUSTER MEET every other node from the first, then wait until each
    node's HELLO lists them all as usable (a full mesh)."""
    if len(addresses) < 2:
        print("cluster create: give at least two nodes", file=sys.stderr)
        return 2
    first, *others = addresses
    try:
        with _client(first, password) as c:
            for host, port in others:
                c.call("CLUSTER", "MEET", host, port)
                print(f"{_fmt(first)}: CLUSTER MEET {host} {port}")
    except DisqueError as e:
        print(f"cluster create: {_fmt(first)}: {e}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + timeout
    while True:
        seen = _mesh_sizes(addresses, password)
        if all(size == len(addresses) for size in seen.values()):
            print(f"cluster of {len(addresses)} nodes: every node knows every other")
            return 0
        if time.monotonic() > deadline:
            short = ", ".join(f"{_fmt(a)} knows {n}" for a, n in seen.items())
            print(f"cluster create: no full mesh after {timeout:g} s ({short})", file=sys.stderr)
            return 1
        time.sleep(0.2)


def _mesh_sizes(addresses: list[Address], password: str | None) -> dict[Address, int]:
    """How many usable nodes each node's HELLO lists (0: unreachable)."""
    sizes = {}
    for address in addresses:
        try:
            with _client(address, password) as c:
                sizes[address] = sum(n.priority == 1 for n in c.hello().nodes)
        except DisqueError:
            sizes[address] = 0
    return sizes


@dataclass
class NodeRow:
    node_id: str
    address: str
    state: str  # ok, myself, pfail, fail, leaving, handshake
    link: str  # connected, disconnected (as the node asked sees it)
    jobs: str = "-"
    queues: str = "-"
    memory: str = "-"
    aof: str = "-"


def status(address: Address, password: str | None) -> int:
    """One line per node, as the node at ``address`` sees the cluster, with
    each node's own figures (INFO) where it answers. Exit status 1 when a
    node is not ok."""
    try:
        with _client(address, password) as c:
            reply = c.call("CLUSTER", "NODES")
        lines = reply.decode() if isinstance(reply, bytes) else str(reply)
    except DisqueError as e:
        print(f"cluster status: {_fmt(address)}: {e}", file=sys.stderr)
        return 1
    rows = [_row(line) for line in lines.splitlines() if line.strip()]
    for row in rows:
        _fill_from_info(row, password)
    print(_table(rows))
    healthy = all(r.state in ("ok", "myself") and r.jobs != "-" for r in rows)
    return 0 if healthy else 1


def _row(line: str) -> NodeRow:
    """A CLUSTER NODES line: id, address, flags, ping sent, pong received,
    link state."""
    fields = line.split()
    flags = set(fields[2].split(","))
    state = "ok"
    for name in ("fail", "fail?", "leaving", "handshake", "myself"):
        if name in flags:
            state = {"fail?": "pfail"}.get(name, name)
            break
    return NodeRow(fields[0][:8], fields[1], state, fields[5] if len(fields) > 5 else "?")


def _fill_from_info(row: NodeRow, password: str | None) -> None:
    host, _, port = row.address.rpartition(":")
    try:
        with _client((host, int(port)), password) as c:
            info = _parse_info(c.info())
    except (DisqueError, ValueError):
        row.jobs = row.queues = row.memory = row.aof = "-"
        if row.state in ("ok", "myself"):
            row.state += " (unreachable)"
        return
    row.jobs = info.get("registered_jobs", "?")
    row.queues = info.get("registered_queues", "?")
    row.memory = info.get("used_memory_human", info.get("used_memory", "?"))
    enabled = info.get("aof_enabled") == "1"
    row.aof = (info.get("aof_last_write_status", "ok") if enabled else "off") or "?"


def _parse_info(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def _table(rows: list[NodeRow]) -> str:
    header = ("NODE", "ADDRESS", "STATE", "LINK", "JOBS", "QUEUES", "MEMORY", "AOF")
    cells = [header] + [
        (r.node_id, r.address, r.state, r.link, r.jobs, r.queues, r.memory, r.aof) for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _fmt(address: Address) -> str:
    return f"{address[0]}:{address[1]}"
