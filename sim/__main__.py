"""The simulator's command line.

python -m sim run --seed N [--nodes K] [--duration S]   one run; last line `digest <hex>`
python -m sim run --seeds A..B [--jobs J]                a sweep; last line `seeds: N passed, N failed`
python -m sim ci [--count N] [--jobs J]                  a sweep of N seeds picked by the commit
python -m sim mutants [NAME...] [--seeds A..B]           last line `mutants: caught C/M`
python -m sim shrink --seed N [--mutant M]               minimise a failing plan to JSON
python -m sim replay PLAN.json                           run a saved plan
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from .plan import Plan
from .runner import Outcome, execute

REGRESSIONS = Path(
    os.environ.get("SIM_REGRESSIONS") or Path(__file__).resolve().parent / "regressions"
)
ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "sim" / "traces"
# A seed whose run takes longer than this (wall) is reported as a failure:
# a node spinning without letting virtual time advance is a bug too.
SEED_WALL_LIMIT_S = 180.0


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("trio", "hypothesis", "disque-trio"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run_plan(plan: Plan, mutant: str | None = None, progress: bool = False) -> Outcome:
    """Execute a plan, with a mutant (sim/mutants.py) applied if named."""
    from . import mutants

    with mutants.applied(mutant):
        from .world import World

        class ProgressWorld(World):
            def __init__(self, plan: Plan, **config: Any) -> None:
                super().__init__(plan, **config)
                self.show_progress = progress

        return execute(plan, ProgressWorld)


def replay_command(plan: Plan, mutant: str | None, plan_path: str | None = None) -> str:
    tail = f" --mutant {mutant}" if mutant else ""
    if plan_path is not None:
        return f"python -m sim replay {plan_path}{tail}"
    default = Plan.from_seed(plan.seed)
    if plan == default:
        return f"python -m sim run --seed {plan.seed}{tail}"
    nodes, secs = plan.nodes, int(plan.duration)
    return f"python -m sim run --seed {plan.seed} --nodes {nodes} --duration {secs}{tail}"


def write_trace(outcome: Outcome, path: str, mutant: str | None, replay: str) -> tuple[str, str]:
    world = outcome.world
    header = {
        "seed": outcome.plan.seed,
        "commit": commit(),
        "versions": versions(),
        "swarm": outcome.plan.swarm(),
        "faults": [f.describe() for f in outcome.plan.faults],
        "plan": json.loads(outcome.plan.to_json()),
        "mutant": mutant,
        "replay": replay,
    }
    footer = {
        "ok": outcome.ok,
        "violations": outcome.violations,
        "excused": outcome.report.excused,
        "probes": dict(world.probes),
        "digest": world.trace.digest(),
        "virtual_s": round(world.virtual_seconds, 3),
        "wall_s": round(world.wall_seconds, 3),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return world.trace.write(path, header, footer)


def report_run(
    outcome: Outcome,
    mutant: str | None = None,
    trace: str | None = None,
    plan_path: str | None = None,
) -> int:
    world, report, plan = outcome.world, outcome.report, outcome.plan
    print(
        f"seed {plan.seed}: {plan.nodes} nodes, {plan.duration:.0f}s, "
        f"appendfsync {plan.appendfsync}, faults: "
        + ("; ".join(f.describe() for f in plan.active_faults()) or "none")
    )
    print(
        f"{report.added} adds ({report.added_ok} ok), {report.delivered} deliveries, "
        f"{report.duplicates} duplicates, {report.recovered} recovered, "
        f"{len(world.trace.lines)} trace events, {world.virtual_seconds:.1f} virtual s "
        f"in {world.wall_seconds:.2f} wall s ({outcome.speed:.0f}x), "
        f"drained={outcome.workload.drained}, peak {world.peak_frame_rate:.0f} bus frames/s"
    )
    hit = [k for k, v in world.probes.items() if v]
    missed = [k for k, v in world.probes.items() if not v]
    print(f"probes hit: {', '.join(hit) or '-'}; missed: {', '.join(missed) or '-'}")
    for excused in report.excused:
        print(f"EXCUSED {excused}")
    replay = replay_command(plan, mutant, plan_path)
    if trace is None and not outcome.ok:
        trace = str(TRACES / f"seed-{plan.seed}{'-' + mutant if mutant else ''}.jsonl")
    if trace is not None:
        jsonl, log_path = write_trace(outcome, trace, mutant, replay)
        print(f"trace: {jsonl} (human log: {log_path})")
    for violation in outcome.violations:
        print(f"VIOLATION {violation}")
    if not outcome.ok:
        print(f"replay: {replay}")
    print(f"digest {world.trace.digest()}")
    return 0 if outcome.ok else 1


# ------------------------------------------------------------------ sweeps


def parse_range(text: str) -> range:
    first, _, last = text.partition("..")
    return range(int(first), int(last or first) + 1)


def _seed_command(seed: int, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "sim", "run", "--seed", str(seed)]
    if getattr(args, "nodes", None) is not None:
        cmd += ["--nodes", str(args.nodes)]
    if getattr(args, "duration", None) is not None:
        cmd += ["--duration", str(args.duration)]
    if getattr(args, "mutant", None):
        cmd += ["--mutant", args.mutant]
    return cmd


def run_seed_process(cmd: list[str], limit: float = SEED_WALL_LIMIT_S) -> tuple[int, list[str]]:
    """One seed in a worker process, killed if it outlives ``limit``."""
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=limit
        )
    except subprocess.TimeoutExpired:
        return 2, [f"VIOLATION wall-clock guard: still running after {limit:.0f}s"]
    lines = out.stdout.strip().splitlines()
    if out.returncode not in (0, 1):
        lines += out.stderr.strip().splitlines()[-20:]
    return out.returncode, lines


def sweep(seeds: range, args: argparse.Namespace, save: bool = True) -> int:
    started = time.perf_counter()

    def one(seed: int) -> tuple[int, int, list[str], float]:
        t0 = time.perf_counter()
        rc, lines = run_seed_process(_seed_command(seed, args))
        return seed, rc, lines, time.perf_counter() - t0

    passed = failed = 0
    hit: set[str] = set()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for seed, rc, lines, wall in pool.map(one, seeds):
            for line in lines:
                if line.startswith("probes hit: "):
                    names = line[len("probes hit: ") :].split(";")[0]
                    hit.update(x.strip() for x in names.split(",") if x.strip() != "-")
            digest = next((x for x in reversed(lines) if x.startswith("digest ")), "no digest")
            if rc == 0:
                passed += 1
                print(f"seed {seed}: PASS {wall:.1f}s {digest}", flush=True)
                continue
            failed += 1
            violations = [x[len("VIOLATION ") :] for x in lines if x.startswith("VIOLATION ")]
            # FAIL: a checker's verdict; ERROR: the run itself broke.
            verdict = "FAIL" if rc == 1 and violations else f"ERROR (exit {rc})"
            print(f"seed {seed}: {verdict} {wall:.1f}s", flush=True)
            for text in violations[:5] or lines[-10:]:
                print(f"    {text}", flush=True)
            if save and not getattr(args, "mutant", None):
                REGRESSIONS.mkdir(exist_ok=True)
                plan = Plan.from_seed(seed, args.nodes, args.duration)
                record = {
                    "seed": seed,
                    "plan": json.loads(plan.to_json()),
                    "replay": " ".join(["python", *_seed_command(seed, args)[1:]]),
                    "violations": violations or lines[-20:],
                    "digest": digest,
                }
                (REGRESSIONS / f"seed-{seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    from .world import PROBES

    missed = [p for p in PROBES if p not in hit]
    print(
        f"probes hit in this sweep: {len(PROBES) - len(missed)}/{len(PROBES)}; never: {', '.join(missed) or '-'}"
    )
    print(f"sweep wall time {time.perf_counter() - started:.1f}s for {len(seeds)} seeds")
    print(f"seeds: {passed} passed, {failed} failed")
    return 1 if failed else 0


def ci_seeds(count: int) -> range:
    """A seed range picked by the commit: every commit explores new seeds,
    and a commit's CI run can be repeated exactly."""
    head = commit()
    start = int(head[:7], 16) % 1_000_000 * 1000 + 1 if head != "unknown" else 1
    return range(start, start + count)


# ------------------------------------------------------------------- main


class PlanFileError(Exception):
    """A plan file that cannot be read or holds no plan; the message is one line."""


def load_plan(path: str) -> tuple[Plan, str | None]:
    """A plan saved as JSON: a bare plan, or a record with a ``plan`` key
    (shrink output, regressions) and maybe a ``mutant``."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PlanFileError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PlanFileError(f"{path} is not a JSON text file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{path} is not valid JSON: {e}") from None
    record = isinstance(data, dict) and "plan" in data
    mutant = data.get("mutant") if record else None
    try:
        plan = Plan.from_json(json.dumps(data["plan"] if record else data))
    except Exception as e:  # cattrs raises several kinds for a wrong shape
        raise PlanFileError(f"{path} does not hold a simulator plan: {_first_line(e)}") from None
    if mutant is not None and not isinstance(mutant, str):
        raise PlanFileError(f"{path}: 'mutant' must be a name or null")
    return plan, mutant


def _first_line(e: BaseException) -> str:
    """The first concrete error (cattrs groups them), on one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()
    return f"{type(e).__name__} {text[0]}" if text else type(e).__name__


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
    run.add_argument("--mutant", help="apply a planted bug (see `mutants`)")
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    ci = sub.add_parser("ci", help="sweep N seeds derived from the commit")
    ci.add_argument("--count", type=int, default=200)
    ci.add_argument("--jobs", type=int, default=2)
    mut = sub.add_parser("mutants", help="run the planted bugs (sim/mutants.py) until caught")
    mut.add_argument("names", nargs="*", help="only these mutants")
    mut.add_argument("--seeds", default="1..60", help="A..B: seeds tried per mutant")
    mut.add_argument("--jobs", type=int, default=2)
    shrink = sub.add_parser("shrink", help="minimise a failing seed's plan (Hypothesis)")
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
    replay.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    if args.cmd == "mutants":
        from . import mutants

        return mutants.main(args.names or None, tuple(parse_range(args.seeds)), args.jobs)
    if args.cmd == "ci":
        args.nodes = args.duration = args.mutant = None
        seeds = ci_seeds(args.count)
        print(f"ci: commit {commit()[:12]}, seeds {seeds.start}..{seeds.stop - 1}", flush=True)
        return sweep(seeds, args)
    if args.cmd == "shrink":
        from .shrink import shrink_seed

        return shrink_seed(
            args.seed, args.nodes, args.duration, args.mutant, args.max_runs, args.out
        )
    if args.cmd == "replay":
        try:
            plan, mutant = load_plan(args.plan)
        except PlanFileError as e:
            print(f"python -m sim replay: {e}", file=sys.stderr)
            return 2
        mutant = args.mutant or mutant
        outcome = run_plan(plan, mutant, progress=not args.quiet)
        return report_run(outcome, mutant, args.trace, args.plan)
    if args.seeds is not None:
        return sweep(parse_range(args.seeds), args)
    plan = Plan.from_seed(args.seed, args.nodes, args.duration)
    outcome = run_plan(plan, args.mutant, progress=not args.quiet)
    return report_run(outcome, args.mutant, args.trace)


if __name__ == "__main__":
    sys.exit(main())
