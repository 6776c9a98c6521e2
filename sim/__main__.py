"""``python -m sim run --seed N [--nodes K] [--duration S]``."""

from __future__ import annotations

import argparse
import sys
import time

from .checkers import check
from .workload import Workload
from .world import World


def run_once(
    seed: int, nodes: int = 3, duration: float = 10.0, partition: bool = True
) -> tuple[World, Workload]:
    world = World(seed, nodes=nodes)
    workload = Workload(duration=duration, partition=partition)
    started = time.perf_counter()
    world.run(workload)
    world.wall_seconds = time.perf_counter() - started
    return world, workload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one simulated world")
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--nodes", type=int, default=3)
    run.add_argument("--duration", type=float, default=10.0)
    run.add_argument("--no-partition", action="store_true")
    run.add_argument("--trace", help="write the trace (JSON lines) to this file")
    args = parser.parse_args(argv)
    world, workload = run_once(args.seed, args.nodes, args.duration, not args.no_partition)
    report = check(workload.history, workload.drained)
    virtual = world.virtual_seconds
    print(
        f"seed {args.seed} nodes {args.nodes}: {report.added} adds ({report.added_ok} ok), "
        f"{report.delivered} deliveries, {report.duplicates} duplicates, "
        f"{len(world.trace.lines)} trace events, {virtual:.1f} virtual s "
        f"in {world.wall_seconds:.2f} wall s, drained={workload.drained}"
    )
    if args.trace:
        world.trace.dump(args.trace)
    for violation in report.violations:
        print(f"VIOLATION {violation}")
    print(f"digest {world.trace.digest()}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
