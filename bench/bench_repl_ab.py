#!/usr/bin/env python3
"""The replicas' CPU per job at -P 1 and -P 16, A/B, interleaved.

``bench_repl_cost.py`` measures every figure of issue 46 once per
repetition; the replicas' ratio (-P 1 against -P 16) moves by several
percent from run to run on a shared 2-core machine, as much as a change
to the bus is worth. This script measures only that pair, for this
checkout and for each ``--peer`` checkout given, on a 3-node cluster each
(``ADDJOB q <10 bytes> 0 REPLICATE 3``, 50 clients), in rounds: every
round runs each cluster once at -P 1 and once at -P 16, the order of the
clusters reversed every other round, so that a change of load hits all
of them alike; and the clusters are started afresh ``--starts`` times
over the rounds, since a cluster of the same code can run a few percent
faster or slower than the next for its whole life (each process has its
own hash seed and memory layout), which one start would credit to the
code. It prints each run (the two replicas' CPU per job summed,
the origin's, the rate), then per checkout the medians and the median of
the per-round ratios.

    python bench/bench_repl_ab.py --peer /tmp/before
    python bench/bench_repl_ab.py --peer /tmp/a --peer /tmp/b --rounds 10 --jobs 60000
    python bench/bench_repl_ab.py --quick

Prints figures; exits 0 whatever they are (1 if it could not run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_repl_cost import (
    REPLICA_TARGET,
    SCENARIOS,
    SCHEDSTAT,
    SYNC_P1,
    SYNC_P16,
    Fleet,
    Sample,
    markdown,
    run_once,
    trio_fleet,
)
from bench_single import arm_signals, guarded, median

COLUMNS = [
    "checkout",
    "replicas, -P 1",
    "replicas, -P 16",
    "ratio (median of rounds)",
    "origin, -P 1",
    "jobs/s, -P 1",
]


def fleets(peers: list[str], root: str) -> list[Fleet]:
    out = [trio_fleet("disque-trio", root)]
    for i, peer in enumerate(peers):
        out.append(trio_fleet(f"peer {i + 1} ({Path(peer).resolve().name})", root, peer))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--peer", action="append", default=[], metavar="DIR", help="another checkout")
    p.add_argument("--rounds", type=int, default=6, help="rounds (default 6; 2 --quick)")
    p.add_argument("--jobs", type=int, help="ADDJOBs per run (default 60,000; 5,000 --quick)")
    p.add_argument(
        "--starts", type=int, default=3, help="fresh clusters over the rounds (default 3)"
    )
    p.add_argument("--quick", action="store_true", help="2 rounds of 5,000 jobs")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--timeout", type=float, default=3600.0, help="give up after S seconds")
    args = p.parse_args(argv)
    args.rounds = 2 if args.quick else args.rounds
    args.jobs = args.jobs or (5_000 if args.quick else 60_000)
    return args


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = tempfile.mkdtemp(prefix="bench-repl-ab-")
        self.fleets = fleets(args.peer, self.root)
        self.samples: dict[str, dict[str, list[Sample]]] = {}
        self.load = [os.getloadavg()[0]]

    def per_start(self) -> int:
        """Rounds on one start of the clusters (the last start may run fewer)."""
        rounds: int = self.args.rounds
        return -(-rounds // max(1, int(self.args.starts)))

    def starts(self) -> int:
        rounds: int = self.args.rounds
        return -(-rounds // self.per_start())

    def stop_fleets(self) -> None:
        for fleet in self.fleets:
            try:
                fleet.stop()
            except Exception as e:  # keep stopping the others
                print(f"stopping {fleet.label}: {e}", file=sys.stderr)

    def stop(self) -> None:
        self.stop_fleets()
        shutil.rmtree(self.root, ignore_errors=True)

    def run(self) -> None:
        scenarios = {s[0]: s for s in SCENARIOS}
        self.samples = {fleet.label: {SYNC_P1: [], SYNC_P16: []} for fleet in self.fleets}
        per_start = self.per_start()
        for r in range(self.args.rounds):
            if r % per_start == 0:
                self.stop_fleets()
                for fleet in self.fleets:
                    print(f"starting {fleet.label}: a 3-node cluster", flush=True)
                    fleet.start(lone=False)
            order = self.fleets if r % 2 == 0 else self.fleets[::-1]
            for name in (SYNC_P1, SYNC_P16):
                for fleet in order:
                    s = run_once(fleet, scenarios[name], self.args.jobs)
                    self.samples[fleet.label][name].append(s)
                    print(
                        f"#{r + 1} {fleet.label:24} {name:28} replicas {s.replicas:5.1f}"
                        f" origin {s.origin:5.1f} us/job  {s.rate:8,.0f} jobs/s",
                        flush=True,
                    )
        self.load.append(os.getloadavg()[0])

    def report(self) -> None:
        rows = []
        for label, by in self.samples.items():
            p1, p16 = by[SYNC_P1], by[SYNC_P16]
            ratio = median([a.replicas / b.replicas for a, b in zip(p1, p16, strict=True)])
            rows.append(
                [
                    label,
                    f"{median([s.replicas for s in p1]):.1f} us",
                    f"{median([s.replicas for s in p16]):.1f} us",
                    f"{ratio:.2f}x",
                    f"{median([s.origin for s in p1]):.1f} us",
                    f"{median([s.rate for s in p1]):,.0f}",
                ]
            )
        table = markdown(COLUMNS, rows)
        cpu = "in ns (schedstat)" if SCHEDSTAT else "in clock ticks"
        conditions = (
            f"{self.args.rounds} rounds of {self.args.jobs:,} jobs a run on clusters started "
            f"afresh {self.starts()} times, 50 clients, "
            f"REPLICATE 3, the two replicas' CPU per job summed, CPU read {cpu}; CPython "
            f"{platform.python_version()}, {os.cpu_count()} cores, load average "
            f"{self.load[0]:.1f} to {self.load[-1]:.1f}; target {REPLICA_TARGET}x"
        )
        print(f"\nmedians ({conditions}):\n\n{table}")
        if self.args.json:
            self.write_json(Path(self.args.json), table, conditions)

    def write_json(self, path: Path, table: str, conditions: str) -> None:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        shown = [f"--peer {Path(x).resolve()}" for x in self.args.peer]
        shown += [f"--rounds {self.args.rounds}", f"--starts {self.starts()}"]
        shown += [f"--jobs {self.args.jobs}", f"--json {path}"]
        data = {
            "benchmark": "repl-ab",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M"),
            "commit": commit,
            "command": "python bench/bench_repl_ab.py " + " ".join(shown),
            "conditions": conditions,
            "table": table,
            "samples": {
                label: {
                    name: [{"us": s.us, "rate": s.rate} for s in xs] for name, xs in by.items()
                }
                for label, by in self.samples.items()
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arm_signals(args.timeout)
    bench = Bench(args)

    def run() -> None:
        bench.run()
        bench.report()

    return guarded("bench_repl_ab", run, bench.stop)


if __name__ == "__main__":
    sys.exit(main())
