"""Simulator speed: simulated seconds per wall second for 5-node runs.

    python bench/bench_sim.py [--seeds 1..10] [--nodes 5] [--cpu]
                              [--repeat N] [--peer DIR]

Prints one line per seed and the total ratio. Whole runs count: the safety
phase with faults and clients, then the liveness, drain and settle phases
(where the cluster mostly idles on heartbeats, which is cheaper per
simulated second). ``--cpu`` counts this process's CPU seconds instead of
wall seconds (steadier on a machine shared with other work).

``--repeat N`` runs every seed N times, each pass in a fresh process, and
keeps each seed's fastest pass (this machine's noise only ever slows a run
down). ``--peer DIR`` runs another checkout of the project (a clone at an
older commit) the same way, its passes alternating with this one's, and
prints both and their ratios: figures from one run on one machine, which
is what two speeds can be compared by. The safety phases are summed two
ways: the median of the seeds' speeds, and all their simulated seconds
over all their seconds (the aggregate, which weighs each second alike).

``--peer-plans`` gives both checkouts the peer's plans (its
``Plan.from_seed`` for each seed, handed over as JSON; fields the peer's
plans lack take their defaults, which turn the newer workload off): the
same workload in both, so the ratio is the simulator's own speed. Without
it each checkout runs its own plans for the seeds, and a newer checkout's
plans may ask for more work per simulated second (more clients, the
explorer, shorter timers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def seed_range(text: str) -> range:
    first, _, last = text.partition("..")
    return range(int(first), int(last or first) + 1)


def dump_plans(tree: Path, seeds: range, nodes: int) -> None:
    """The plans checkout ``tree`` draws for ``seeds``, one JSON line each
    (``--worker --dump-plans``)."""
    sys.path.insert(0, str(tree))
    from sim.plan import Plan

    for seed in seeds:
        plan = Plan.from_seed(seed, nodes=nodes, duration=10)
        print(json.dumps(json.loads(plan.to_json())))  # one line


def run_seeds(
    tree: Path, seeds: range, nodes: int, cpu: bool, plans_file: Path | None = None
) -> None:
    """One pass over ``seeds`` with the simulator of checkout ``tree``,
    printing a JSON line per seed (``--worker``); with ``plans_file``, the
    plans in it (``dump_plans``' lines) in place of the checkout's own."""
    sys.path.insert(0, str(tree))
    import sim.workload as workload_module
    from sim.plan import Plan
    from sim.runner import execute

    given: dict[int, str] = {}
    if plans_file is not None:
        for line in plans_file.read_text().splitlines():
            given[int(json.loads(line)["seed"])] = line

    clock = time.perf_counter
    if cpu:
        clock = time.process_time
        # The workload times its safety phase with perf_counter: give it
        # process time (it alone: Trio's MockClock reads perf_counter at
        # every current_time, and process time costs a system call).
        workload_module.time = types.SimpleNamespace(perf_counter=time.process_time)  # type: ignore[attr-defined,assignment]
    for seed in seeds:
        if plans_file is not None:
            plan = Plan.from_json(given[seed])
        else:
            plan = Plan.from_seed(seed, nodes=nodes, duration=10)
        t0 = clock()
        outcome = execute(plan)
        spent = clock() - t0
        record = {
            "seed": seed,
            "simulated": outcome.world.virtual_seconds,
            "spent": spent,
            "safety_speed": outcome.workload.safety_speed,
            "events": len(outcome.world.trace.lines),
            "nodes": outcome.world.count,
            "ok": outcome.ok,
        }
        print(json.dumps(record), flush=True)


class Tally:
    """Each seed's fastest pass, for one checkout."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.best: dict[int, dict[str, float]] = {}

    def add(self, record: dict[str, float]) -> None:
        seed = int(record["seed"])
        old = self.best.get(seed)
        if old is None:
            self.best[seed] = dict(record)
            return
        old["spent"] = min(old["spent"], record["spent"])
        old["safety_speed"] = max(old["safety_speed"], record["safety_speed"])

    def whole(self) -> float:
        simulated = sum(r["simulated"] for r in self.best.values())
        return simulated / sum(r["spent"] for r in self.best.values())

    def safety_median(self) -> float:
        return statistics.median(r["safety_speed"] for r in self.best.values())

    def safety_aggregate(self) -> float:
        # Every safety phase lasts the plan's duration (10 simulated s).
        return len(self.best) / sum(1 / r["safety_speed"] for r in self.best.values())


def worker(tree: Path, args: argparse.Namespace, what: str, *extra: str) -> str:
    """What a ``--worker`` process over checkout ``tree`` prints (``what``
    names it in the error if it fails)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree)]
    command += ["--seeds", args.seeds, "--nodes", str(args.nodes), *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"bench_sim: {what} failed: {tail}")
    return done.stdout


def one_pass(
    tree: Path, args: argparse.Namespace, plans_file: Path | None = None
) -> list[dict[str, float]]:
    extra = ["--cpu"] if args.cpu else []
    if plans_file is not None:
        extra += ["--plans", str(plans_file)]
    out = worker(tree, args, f"the pass over {tree}", *extra)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_passes(
    trees: list[tuple[str, Path]],
    tallies: dict[str, Tally],
    args: argparse.Namespace,
    plans_file: Path | None,
) -> None:
    """``args.repeat`` passes of every checkout, each seed's line printed."""
    for round_ in range(args.repeat):
        # Alternate which checkout goes first: a machine slowing down over
        # the minutes weighs on both alike.
        for name, tree in trees if round_ % 2 == 0 else trees[::-1]:
            for record in one_pass(tree, args, plans_file):
                tallies[name].add(record)
                print(
                    f"{name} pass {round_ + 1} seed {record['seed']}: "
                    f"{record['simulated']:6.1f} simulated s in {record['spent']:5.2f} s "
                    f"({record['simulated'] / record['spent']:5.1f}x; safety phase "
                    f"{record['safety_speed']:5.1f}x), {record['events']} events, "
                    f"ok={record['ok']}",
                    flush=True,
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1..10")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="CPU seconds, not wall seconds")
    parser.add_argument("--repeat", type=int, default=1, help="passes per checkout (default 1)")
    parser.add_argument("--peer", type=Path, help="another checkout, run alternately")
    parser.add_argument(
        "--peer-plans", action="store_true", help="both checkouts run the peer's plans"
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dump-plans", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plans", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        if args.dump_plans:
            dump_plans(args.worker, seed_range(args.seeds), args.nodes)
        else:
            run_seeds(args.worker, seed_range(args.seeds), args.nodes, args.cpu, args.plans)
        return 0
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.peer_plans and args.peer is None:
        parser.error("--peer-plans needs --peer")
    trees = [("this", HERE)]
    if args.peer is not None:
        if not (args.peer / "sim" / "runner.py").is_file():
            parser.error(f"--peer {args.peer}: no sim/runner.py there")
        trees.append(("peer", args.peer.resolve()))
    tallies = {name: Tally(name) for name, _ in trees}
    plans_file = None
    if args.peer_plans:
        plans = worker(args.peer, args, "dumping the peer's plans", "--dump-plans")
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as scratch:
            scratch.write(plans)
        plans_file = Path(scratch.name)
        print(f"both checkouts run the peer's plans ({args.peer})")
    try:
        run_passes(trees, tallies, args, plans_file)
    finally:
        if plans_file is not None:
            plans_file.unlink()
    unit = "CPU" if args.cpu else "wall"
    for name, tree in trees:
        tally = tallies[name]
        print(
            f"{name} ({tree}): whole runs {tally.whole():.1f}x real time ({unit} s, "
            f"fastest of {args.repeat}); safety phases median {tally.safety_median():.1f}x, "
            f"aggregate {tally.safety_aggregate():.1f}x"
        )
    if args.peer is not None:
        this, peer = tallies["this"], tallies["peer"]
        print(
            f"this / peer: whole runs {this.whole() / peer.whole():.2f}; safety phases "
            f"median {this.safety_median() / peer.safety_median():.2f}, aggregate "
            f"{this.safety_aggregate() / peer.safety_aggregate():.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
