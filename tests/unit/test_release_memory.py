"""When the node gives memory back to the OS: after many jobs went away and
few remain (a full collection costs time in proportion to what is alive),
or at once for DEBUG FLUSHALL."""

from __future__ import annotations

from typing import Any

import attrs

from disque_trio.server.node import RELEASE_AFTER_DROP, RELEASE_MAX_LIVE, NodeServer

from ..helpers import make_config, virtual_env


def server_with_spy() -> tuple[NodeServer, list[int]]:
    releases: list[int] = []
    env = attrs.evolve(virtual_env(), release_memory=lambda: releases.append(1))
    return NodeServer(make_config(), env, persist_cluster=False), releases


def hold(server: NodeServer, count: int) -> None:
    jobs: dict[str, Any] = server.node.jobs
    jobs.clear()
    jobs.update((f"job-{n}", None) for n in range(count))


async def test_after_a_big_drop_with_few_jobs_left() -> None:
    server, releases = server_with_spy()
    hold(server, RELEASE_MAX_LIVE + RELEASE_AFTER_DROP)
    server.release_memory_after_a_drop()
    hold(server, RELEASE_MAX_LIVE + 1)  # dropped enough, but too many left
    server.release_memory_after_a_drop()
    assert releases == []
    hold(server, RELEASE_MAX_LIVE)
    server.release_memory_after_a_drop()
    assert releases == [1]
    server.release_memory_after_a_drop()  # once per drop, not every tick
    assert releases == [1]


async def test_small_drops_release_nothing_and_flushall_always_does() -> None:
    server, releases = server_with_spy()
    hold(server, RELEASE_AFTER_DROP - 1)
    server.release_memory_after_a_drop()
    hold(server, 0)
    server.release_memory_after_a_drop()
    assert releases == []
    server.release_memory_after_a_drop(now=True)
    assert releases == [1]
