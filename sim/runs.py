"""One simulated run in this process: execute a plan, report it, save its trace.

``run_plan`` executes a plan with a planted bug (sim/mutants.py) if named;
``report_run`` prints what ``python -m sim run`` and ``replay`` print (the
last line ``digest <hex>``) and writes the trace of a failing run into
``TRACES``, with its timeline (sim/timeline.py) beside it; ``load_plan``
reads the plans that ``shrink`` and sweeps save.
``python -m sim`` (sim/__main__.py) and the shrinker (sim/shrink.py) use
them.
"""

from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from . import timeline
from .plan import Plan
from .runner import Outcome, execute
from .sweep import TRACES, commit


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


def write_timeline(outcome: Outcome, path: str, mutant: str | None, replay: str) -> str:
    """The run as one HTML page (sim/timeline.py) at ``path``."""
    title = f"seed {outcome.plan.seed}" + (f" mutant {mutant}" if mutant else "")
    meta = timeline.Meta(title, replay, tuple(outcome.violations))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(timeline.from_trace_lines(outcome.world.trace.lines, meta))
    return path


def report_run(
    outcome: Outcome,
    mutant: str | None = None,
    trace: str | None = None,
    plan_path: str | None = None,
    html: str | None = None,
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
        f"drained={outcome.workload.drained}, peak {world.peak_message_rate:.0f} bus messages/s"
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
        if html is None and not outcome.ok:
            html = str(Path(trace).with_suffix(".html"))
    if html is not None:
        try:
            print(f"timeline: {write_timeline(outcome, html, mutant, replay)}")
        except Exception as e:  # the drawing must not hide the verdict below
            print(f"timeline: not drawn: {type(e).__name__}: {e}")
    for violation in outcome.violations:
        print(f"VIOLATION {violation}")
    if not outcome.ok:
        print(f"replay: {replay}")
    print(f"digest {world.trace.digest()}")
    return 0 if outcome.ok else 1


# ------------------------------------------------------------ plan files


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


def replay_verdict(path: str) -> list[str]:
    """Replay a plan file with no mutant: its violations ([] if it passed).
    A module function, so a process pool can run plans side by side (the
    tests replay the regression corpus on every core)."""
    plan, mutant = load_plan(path)
    if mutant is not None:
        return [f"{path} plants mutant {mutant!r}: not a regression plan"]
    return list(execute(plan).violations)


def _first_line(e: BaseException) -> str:
    """The first concrete error (cattrs groups them), on one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()
    return f"{type(e).__name__} {text[0]}" if text else type(e).__name__
