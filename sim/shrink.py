"""Minimise a failing plan with Hypothesis' shrinker.

A plan is a list of bounded integers in which zero means "nothing": no
fault, fewest nodes, shortest run, no exotic job option (sim/plan.py). The
failing seed's plan is handed to Hypothesis' engine as its first example;
the engine then shrinks the list (deleting faults, lowering values towards
zero) keeping only changes that still fail. The result is written as JSON
for ``python -m sim replay``.

This uses Hypothesis' conjecture engine directly (``ConjectureRunner``),
which is internal API: tests/sim/test_shrink.py is its canary.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture.data import ConjectureData, Status
from hypothesis.internal.conjecture.engine import ConjectureRunner
from hypothesis.internal.escalation import InterestingOrigin

from .plan import Plan


class PlanFails(Exception):
    """The one kind of failure the shrinker looks for: the plan fails."""


_ORIGIN = InterestingOrigin.from_exception(PlanFails())


def shrink_plan(
    plan: Plan,
    fails: Callable[[Plan], bool],
    max_runs: int = 300,
    log: Callable[[str], None] | None = None,
) -> Plan:
    """The smallest plan (same seed) Hypothesis finds for which
    ``fails(plan)`` is still true. ``plan`` itself must fail."""
    runs = 0
    smallest = sum(plan.encode())

    def test_function(data: ConjectureData) -> None:
        nonlocal runs, smallest
        candidate = Plan.decode(plan.seed, lambda bound: data.draw_integer(0, bound))
        runs += 1
        if fails(candidate):
            if log is not None and sum(candidate.encode()) < smallest:
                smallest = sum(candidate.encode())
                log(f"run {runs}: still fails with {describe(candidate)}")
            data.mark_interesting(_ORIGIN)

    runner = ConjectureRunner(
        test_function,
        settings=settings(
            database=None,
            max_examples=max_runs,
            phases=[Phase.shrink],
            suppress_health_check=list(HealthCheck),
            deadline=None,
        ),
        random=random.Random(plan.seed),
    )
    first = runner.cached_test_function(plan.encode())
    if first.status != Status.INTERESTING:
        raise ValueError("the plan to shrink does not fail")
    runner.shrink_interesting_examples()
    [result] = runner.interesting_examples.values()
    return Plan.from_values(plan.seed, [int(v) for v in result.choices])  # type: ignore[arg-type]


def describe(plan: Plan) -> str:
    faults = "; ".join(f.describe() for f in plan.active_faults()) or "no faults"
    return (
        f"{plan.nodes} nodes, {plan.duration:.0f}s, {plan.producers}p/{plan.consumers}c, "
        f"fsync {plan.appendfsync}, {faults}"
    )


def shrink_seed(
    seed: int,
    nodes: int | None,
    duration: int | None,
    mutant: str | None,
    max_runs: int,
    out: str | None,
) -> int:
    from .__main__ import TRACES, run_plan

    plan = Plan.from_seed(seed, nodes, duration)
    first = run_plan(plan, mutant)
    if first.ok:
        print(f"seed {seed} passes: nothing to shrink")
        return 1
    started = time.perf_counter()
    print(f"seed {seed} fails ({first.violations[0]}); shrinking {describe(plan)}", flush=True)

    def fails(candidate: Plan) -> bool:
        return not run_plan(candidate, mutant).ok

    def log(text: str) -> None:
        print(f"  {time.perf_counter() - started:6.1f}s {text}", flush=True)

    small = shrink_plan(plan, fails, max_runs, log)
    final = run_plan(small, mutant)
    path = Path(out) if out else TRACES / f"shrunk-{seed}{'-' + mutant if mutant else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "plan": json.loads(small.to_json()),
        "mutant": mutant,
        "violations": final.violations,
        "from_seed": seed,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"shrunk in {time.perf_counter() - started:.0f}s: {describe(small)}")
    for violation in final.violations[:5]:
        print(f"VIOLATION {violation}")
    print(f"plan: {path}")
    print(f"replay: python -m sim replay {path}")
    return 0
