"""The simulator in CI: every planted bug is caught, and a range of seeds
picked by the commit passes (python -m sim mutants / python -m sim ci)."""

from __future__ import annotations

from sim.mutants import MUTANTS, run_mutant

from .conftest import SUMMARY, sim_cli

# Seeds tried per mutant: every mutant is caught well within this range
# (the slowest are caught in the twenties and thirties; its runs stop at
# the first; the 42 mutants took 5 min on 2 jobs on a machine shared with
# other work, 2026-12-04).
MUTANT_SEEDS = "1..60"
CI_SEEDS = 200


def _run(args: list[str], timeout: float) -> tuple[int, list[str]]:
    out = sim_cli(*args, timeout=timeout)
    return out.returncode, out.stdout.strip().splitlines() + out.stderr.strip().splitlines()[-5:]


def test_a_mutant_is_caught_in_process() -> None:
    seed, violations = run_mutant("setack-forgets-one-holder", (1, 2, 3))
    assert seed is not None and violations


def test_every_mutant_is_caught() -> None:
    assert len(MUTANTS) >= 23
    rc, lines = _run(["mutants", "--seeds", MUTANT_SEEDS, "--jobs", "2"], timeout=900)
    SUMMARY.extend(
        line
        for line in lines
        if (": caught" in line or ": NOT" in line) and not line.startswith("mutants:")
    )
    last = next(line for line in reversed(lines) if line.startswith("mutants: "))
    SUMMARY.append(last)
    assert last == f"mutants: caught {len(MUTANTS)}/{len(MUTANTS)}", "\n".join(lines)
    assert rc == 0


def test_seed_range_picked_by_the_commit_runs_to_a_verdict() -> None:
    """Discovery, not a gate: each commit explores 200 new swarm seeds and
    the log shows `seeds: N passed, N failed` with the failing seeds' first
    violations (replay with `python -m sim run --seed N`). Known node bugs
    still fail a few percent of seeds (see the issue notes); what must hold
    here is that the simulator itself reaches a verdict for every seed:
    no crash, no wall-clock guard, a digest for each passing seed."""
    rc, lines = _run(["ci", "--count", str(CI_SEEDS), "--jobs", "2"], timeout=1500)
    summary = [
        line
        for line in lines
        if line.startswith(("ci:", "probe", "sweep wall", "summary:", "seeds:"))
        or (line.startswith("  ") and not line.startswith("   "))  # a probe's share
    ]
    failures = [
        line for line in lines if ": FAIL" in line or ": ERROR" in line or line[:4] == "    "
    ]
    SUMMARY.extend(summary + failures[:40])
    verdict = next(line for line in lines if line.startswith("seeds: "))
    passed, failed = (int(word) for word in verdict.split() if word.isdigit())
    assert passed + failed == CI_SEEDS, verdict
    assert rc == (1 if failed else 0)
    errors = [line for line in lines if ": ERROR" in line or "wall-clock guard" in line]
    assert not errors, "\n".join(lines[-40:])
    # Coverage: every probe (a command, an admin path, a fault's effect) is
    # hit by some seed of the range; a probe never hit means a path the
    # simulator stopped exercising.
    probes = next(line for line in lines if line.startswith("probes hit in this sweep: "))
    assert probes.endswith("never: -"), probes
    digests = [line for line in lines if ": PASS" in line and " digest " in line]
    assert len(digests) == passed
