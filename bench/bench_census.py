"""The dashboard's job census (disque_trio/server/jobcensus.py), in process.

    python bench/bench_census.py                 # a million jobs
    python bench/bench_census.py --jobs 200000

No server: a core Node is filled with jobs as a node of a three-node
cluster holds them (a third with one copy, a third with two, a third with
three; every state alike, so a quarter of the jobs are active and wait to
be queued again, each queued on nobody: the worst case for the second
pass). Prints the best of 7 of the census, and of the count by state
alone that the census replaced (one pass, a dict increment per job).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from disque_trio.core.job import FLAG_BCAST_QUEUED, Job, JobState
from disque_trio.core.node import Node
from disque_trio.server import jobcensus

ME = "dcb833cf" + "a1" * 16
OTHER = "77e1a0b2" + "b3" * 16
THIRD = "f0" * 20


class _Clock:
    def wall_ms(self) -> int:
        return 1_700_000_000_000

    def mono_ms(self) -> int:
        return 1_700_000_000_000


def filled(count: int) -> Node:
    node = Node(ME, _Clock(), random.Random(0))
    rng = random.Random(1)
    lists = [(ME,), (ME, OTHER), (OTHER, ME, THIRD)]
    now = node.now_ms()
    for i in range(count):
        job = Job(f"D-{i:038d}", f"q{i % 50}", b"x", JobState(rng.randrange(4)), retry=60)
        job.nodes_delivered = lists[i % 3]
        job.flags = FLAG_BCAST_QUEUED
        if job.state == JobState.ACTIVE:
            job.qtime = now + rng.randrange(60_000)
        node.jobs[job.id] = job
    return node


def best(run: Callable[[], object], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    args = parser.parse_args()
    node = filled(args.jobs)

    def by_state() -> None:
        counts = dict.fromkeys(JobState, 0)
        for job in node.jobs.values():
            counts[job.state] += 1

    answering = frozenset({OTHER, THIRD})
    census = best(lambda: jobcensus.take(node, answering))
    states = best(by_state)
    print(
        f"{args.jobs:,} jobs: census {census * 1000:.0f} ms, count by state {states * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
