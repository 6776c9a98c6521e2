"""Simulator speed: simulated seconds per wall second for 5-node runs.

    python bench/bench_sim.py [--seeds 1..10] [--nodes 5] [--cpu]

Prints one line per seed and the total ratio. Whole runs count: the safety
phase with faults and clients, then the liveness, drain and settle phases
(where the cluster mostly idles on heartbeats, which is cheaper per
simulated second). ``--cpu`` counts this process's CPU seconds instead of
wall seconds (steadier on a machine shared with other work).
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sim.workload as workload_module
from sim.plan import Plan
from sim.runner import execute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1..10")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="CPU seconds, not wall seconds")
    args = parser.parse_args()
    clock = time.perf_counter
    if args.cpu:
        clock = time.process_time
        # The workload times its safety phase with perf_counter: give it
        # process time (it alone: Trio's MockClock reads perf_counter at
        # every current_time, and process time costs a system call).
        workload_module.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore[assignment]
    first, _, last = args.seeds.partition("..")
    virtual = wall = 0.0
    safety = []
    for seed in range(int(first), int(last or first) + 1):
        plan = Plan.from_seed(seed, nodes=args.nodes, duration=10)
        t0 = clock()
        outcome = execute(plan)
        spent = clock() - t0
        sim_s = outcome.world.virtual_seconds
        virtual += sim_s
        wall += spent
        events = len(outcome.world.trace.lines)
        safety.append(outcome.workload.safety_speed)
        print(
            f"seed {seed}: {sim_s:6.1f} simulated s in {spent:5.2f} wall s "
            f"({sim_s / spent:5.1f}x; safety phase {safety[-1]:5.1f}x), {events} events, "
            f"ok={outcome.ok}",
            flush=True,
        )
    print(
        f"total: {virtual:.0f} simulated s in {wall:.1f} wall s: {virtual / wall:.1f}x real time"
    )
    print(f"safety phases (faults and clients): median {sorted(safety)[len(safety) // 2]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
