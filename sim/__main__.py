"""The simulator's command line.

python -m sim run --seed N [--nodes K] [--duration S]   one run; last line `digest <hex>`
python -m sim run --seeds A..B [--jobs J]                a sweep (and its summary page); last line `seeds: N passed, N failed`
python -m sim ci [--count N] [--jobs J]                  a sweep of N seeds picked by the commit
python -m sim coverage --seeds A..B [--jobs J] [--check] branch coverage of the node code over a sweep
python -m sim mutants [NAME...] [--seeds A..B]           last line `mutants: caught C/M`
python -m sim shrink --seed N [--mutant M]               minimise a failing plan to JSON
python -m sim replay PLAN.json [--html OUT.html]        run a saved plan (and draw its timeline)
python -m sim timeline TRACE.jsonl [--html OUT.html]    draw the timeline of a saved trace
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import mutants, timeline
from .plan import Plan
from .runs import PlanFileError, load_plan, report_run, run_plan
from .shrink import shrink_seed
from .sweep import ci_seeds, commit, sweep


def parse_range(text: str) -> range:
    first, _, last = text.partition("..")
    return range(int(first), int(last or first) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one simulated world, or sweep seeds")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--seeds", help="A..B: run every seed in worker processes")
    run.add_argument("--jobs", type=int, default=1, help="parallel seeds (with --seeds)")
    run.add_argument("--nodes", type=int, default=None, help="cluster size (default: the swarm's)")
    run.add_argument("--duration", type=int, default=None, help="safety phase, virtual seconds")
    run.add_argument("--trace", help="write the trace (JSON lines + .log) to this file")
    run.add_argument("--html", help="write the run's timeline (one HTML page) to this file")
    run.add_argument("--mutant", help="apply a planted bug (see `mutants`)")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    run.add_argument("--summary", help="sweep summary page (default sim/traces/sweep-A-B.html)")
    ci = sub.add_parser("ci", help="sweep N seeds derived from the commit")
    ci.add_argument("--count", type=int, default=200)
    ci.add_argument("--jobs", type=int, default=2)
    ci.add_argument("--summary", help="sweep summary page (default sim/traces/sweep-A-B.html)")
    cover = sub.add_parser("coverage", help="branch coverage of the node code over a sweep")
    cover.add_argument("--seeds", required=True, help="A..B: the seeds swept")
    cover.add_argument("--jobs", type=int, default=2)
    cover.add_argument(
        "--check",
        action="store_true",
        help="record nothing; exit 1 if the core's coverage fell below the recorded entry",
    )
    cover.add_argument("--html", action="store_true", help="coverage.py's pages too")
    cover.add_argument("--data", help="keep the seeds' coverage data in this directory")
    cover.add_argument(
        "--no-run", action="store_true", help="report on the data of --data, no sweep"
    )
    mut = sub.add_parser("mutants", help="run the planted bugs (sim/mutants.py) until caught")
    mut.add_argument("names", nargs="*", help="only these mutants")
    mut.add_argument("--seeds", default="1..60", help="A..B: seeds tried per mutant")
    mut.add_argument("--jobs", type=int, default=2)
    shrink = sub.add_parser("shrink", help="minimise a failing seed's plan")
    shrink.add_argument("--seed", type=int, required=True)
    shrink.add_argument("--nodes", type=int, default=None)
    shrink.add_argument("--duration", type=int, default=None)
    shrink.add_argument("--mutant")
    shrink.add_argument("--max-runs", type=int, default=300)
    shrink.add_argument(
        "--out", help="where to write the plan (default sim/traces/shrunk-SEED[-MUTANT].json)"
    )
    replay = sub.add_parser("replay", help="run a plan saved as JSON (shrink, regressions)")
    replay.add_argument("plan")
    replay.add_argument("--mutant")
    replay.add_argument("--trace")
    replay.add_argument("--html", help="write the run's timeline (one HTML page) to this file")
    replay.add_argument("--quiet", action="store_true", help="no progress lines")
    draw = sub.add_parser("timeline", help="draw the timeline of a trace (--trace, failing runs)")
    draw.add_argument("trace")
    draw.add_argument("--html", help="where to write it (default: beside the trace, .html)")
    args = parser.parse_args(argv)

    if args.cmd == "mutants":
        return mutants.main(args.names or None, tuple(parse_range(args.seeds)), args.jobs)
    if args.cmd == "coverage":
        if args.no_run and not args.data:
            parser.error("--no-run needs --data")
        # Imported here: coverage.py is a test dependency, not the simulator's.
        from .branchcov import run_coverage

        return run_coverage(
            parse_range(args.seeds), args.jobs, args.check, args.html, args.data, args.no_run
        )
    if args.cmd == "ci":
        seeds = ci_seeds(args.count)
        print(f"ci: commit {commit()[:12]}, seeds {seeds.start}..{seeds.stop - 1}", flush=True)
        return sweep(seeds, args.jobs, summary=args.summary)
    if args.cmd == "shrink":
        return shrink_seed(
            args.seed, args.nodes, args.duration, args.mutant, args.max_runs, args.out
        )
    if args.cmd == "timeline":
        out = args.html or str(Path(args.trace).with_suffix(".html"))
        try:
            Path(out).write_text(timeline.from_trace_file(args.trace))
        except (OSError, ValueError, KeyError) as e:  # not a trace this can read
            print(f"python -m sim timeline: {args.trace}: {type(e).__name__} {e}", file=sys.stderr)
            return 2
        print(f"timeline: {out}")
        return 0
    if args.cmd == "replay":
        try:
            plan, mutant = load_plan(args.plan)
        except PlanFileError as e:
            print(f"python -m sim replay: {e}", file=sys.stderr)
            return 2
        mutant = args.mutant or mutant
        outcome = run_plan(plan, mutant, progress=not args.quiet)
        return report_run(outcome, mutant, args.trace, args.plan, args.html)
    if args.seeds is not None:
        seeds = parse_range(args.seeds)
        return sweep(
            seeds, args.jobs, args.nodes, args.duration, args.mutant, summary=args.summary
        )
    plan = Plan.from_seed(args.seed, args.nodes, args.duration)
    outcome = run_plan(plan, args.mutant, progress=not args.quiet)
    return report_run(outcome, args.mutant, args.trace, html=args.html)


if __name__ == "__main__":
    sys.exit(main())
