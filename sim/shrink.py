"""Minimise a failing plan.

A plan is a list of bounded integers in which zero means "nothing": no
fault, fewest nodes, shortest run, no exotic job option (sim/plan.py). The
shrinker starts from the failing seed's plan and keeps only changes that
still fail, in passes repeated until a whole pass changes nothing (or the
run budget is spent):

1. delete faults, several at once first, then one by one;
2. lower each value: to zero, else to the smallest value a bisection
   between zero and the current value finds still failing.

A change is kept when the plan still fails and is smaller: fewer faults,
then a smaller sum of values, then earlier values smaller. The result is
written as JSON for ``python -m sim replay``.

This is written here rather than taken from Hypothesis: Hypothesis shrinks
what its own generator drew, and its public API has no way to start from a
given failing example (explicit examples are never shrunk; the example
database's format is internal). The earlier version drove Hypothesis'
engine through internal names, and a Hypothesis release renamed them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from .plan import FAULT_FIELDS, MAX_FAULTS, SWARM_FIELDS, Plan
from .runs import run_plan
from .sweep import TRACES

_FAULTS_AT = len(SWARM_FIELDS)  # index of the first fault slot in encode()
_FAULT_WIDTH = len(FAULT_FIELDS)


class _Budget(Exception):
    """The run budget is spent: stop shrinking, keep the best so far."""


def _size(values: list[int]) -> tuple[int, int, list[int]]:
    faults = sum(1 for slot in range(MAX_FAULTS) if values[_FAULTS_AT + slot * _FAULT_WIDTH] != 0)
    return faults, sum(values), values


def shrink_plan(
    plan: Plan,
    fails: Callable[[Plan], bool],
    max_runs: int = 300,
    log: Callable[[str], None] | None = None,
) -> Plan:
    """The smallest plan (same seed) found for which ``fails(plan)`` is
    still true, trying at most ``max_runs`` candidates. ``plan`` itself must
    fail."""
    if not fails(plan):
        raise ValueError("the plan to shrink does not fail")
    best = plan.encode()
    seen: dict[tuple[int, ...], bool] = {tuple(best): True}
    runs = 0

    def attempt(values: list[int]) -> bool:
        """Try a candidate; keep it as the best if it fails and is smaller."""
        nonlocal best, runs
        candidate = Plan.from_values(plan.seed, values)
        values = candidate.encode()  # canonical: faults packed, values clamped
        key = tuple(values)
        if key not in seen:
            if runs >= max_runs:
                raise _Budget
            runs += 1
            seen[key] = fails(candidate)
            if seen[key] and log is not None and _size(values) < _size(best):
                log(f"run {runs}: still fails with {describe(candidate)}")
        if seen[key] and _size(values) < _size(best):
            best = values
            return True
        return False

    try:
        changed = True
        while changed:
            changed = _delete_faults(best, attempt)
            changed = _lower_values(attempt, lambda: best) or changed
    except _Budget:
        pass
    return Plan.from_values(plan.seed, best)


def _delete_faults(values: list[int], attempt: Callable[[list[int]], bool]) -> bool:
    """Delete faults in chunks (half of them, a quarter...), then one by
    one; a fault's slot is zeroed and the plan's decoding drops it."""
    changed = False
    current = list(values)
    chunk = MAX_FAULTS // 2
    while chunk >= 1:
        slot = MAX_FAULTS - chunk
        while slot >= 0:
            candidate = list(current)
            start = _FAULTS_AT + slot * _FAULT_WIDTH
            candidate[start : start + chunk * _FAULT_WIDTH] = [0] * (chunk * _FAULT_WIDTH)
            if candidate != current and attempt(candidate):
                current = Plan.from_values(0, candidate).encode()
                changed = True
            slot -= chunk
        chunk //= 2
    return changed


def _lower_values(attempt: Callable[[list[int]], bool], best: Callable[[], list[int]]) -> bool:
    """Lower each value in turn, to zero if that still fails, else by
    bisection between zero (passes) and the current value (fails)."""
    changed = False
    for index in range(len(best())):
        high = best()[index]
        if high == 0:
            continue
        candidate = list(best())
        candidate[index] = 0
        if attempt(candidate):
            changed = True
            continue
        low = 0
        while high - low > 1:
            middle = (low + high) // 2
            candidate = list(best())
            candidate[index] = middle
            if attempt(candidate):
                high = middle
                changed = True
            else:
                low = middle
    return changed


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
