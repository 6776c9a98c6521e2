"""Branch coverage of the node code over a sweep of seeds.

``python -m sim coverage --seeds A..B [--jobs J] [--check]`` runs the seeds
as a sweep does (sim/sweep.py), each in a child forked by a worker process
(sim/worker.py), with coverage.py measuring branches of the node code
(``MEASURED``) in every child: started before the run, stopped and saved
before the child exits, each seed into a data file of its own (suffix
``seed-N``) in one temporary directory. The workers record their own imports
too (suffix ``imports-PID``), so that module bodies count as run. The files
are then combined into one.

Coverage only watches: a seed's digest is the one a run without it gives
(tests/sim/test_branchcov.py compares them).

What it writes:

- ``sim/coverage.jsonl``, one JSON object a line (``record``): the seeds,
  the commit, the date, the wall seconds, and per module the branches and
  statements, total and reached, with the unreached branches counted by
  reason; the totals of ``disque_trio/core`` and of ``SERVER_GROUP``;
- ``sim/traces/coverage-A-B.json``: every unreached branch (module, line,
  arc, function) with its reason; ``--html`` adds coverage.py's pages in
  ``sim/traces/coverage-A-B-html/``.

The reasons come from ``sim/coverage_reasons.json``: rules naming a module,
and optionally functions or a line range in it, and one of ``REASONS``; the
most specific rule that matches a branch classifies it, and a branch that
no rule matches is ``unknown``.

``--check`` writes no entry: it compares the core's branch coverage with the
newest entry of the same seed range in ``sim/coverage.jsonl`` and fails
when it is lower by more than ``CHECK_MARGIN`` points (``check_core``).
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import coverage

from .sweep import ROOT, TRACES, commit, sweep

# The node code measured, as coverage.py's source_pkgs: the core, the shell,
# the codecs and the configuration. The client, the worker, the CLI and the
# integrations are not node code.
MEASURED = ("disque_trio.core", "disque_trio.server", "disque_trio.protocol", "disque_trio.config")
LOG = ROOT / "sim" / "coverage.jsonl"
REASONS_FILE = ROOT / "sim" / "coverage_reasons.json"
CORE = "disque_trio/core/"
# The modules that carry jobs between nodes, keep the cluster and persist
# jobs: the simulator exists to exercise these, so they get a goal of their
# own (80 % of branches, docs/simulator.md). The core's job, job-protocol,
# cluster-table and record modules; the shell's commit point and services
# (server/node.py), the bus links (peers.py), CLUSTER commands
# (clustercmds.py), the AOF writer and loader (aof.py), the delivery tasks
# of blocked consumers (delivery.py) and the job timers and cron (timer.py);
# and the two codecs jobs travel in, the bus messages and the AOF records.
# Left out: client connections and admin commands (connections.py,
# admin.py, info.py, ...), the web port and its dashboard, TLS, metrics and
# logs: they move no job between nodes.
SERVER_GROUP = (
    "disque_trio/core/job.py",
    "disque_trio/core/jobcmds.py",
    "disque_trio/core/jobwaits.py",
    "disque_trio/core/clusterjobs.py",
    "disque_trio/core/cluster.py",
    "disque_trio/core/records.py",
    "disque_trio/server/aof.py",
    "disque_trio/server/node.py",
    "disque_trio/server/clustercmds.py",
    "disque_trio/server/peers.py",
    "disque_trio/server/delivery.py",
    "disque_trio/server/timer.py",
    "disque_trio/protocol/bus.py",
    "disque_trio/protocol/aof.py",
)
# The reasons a branch is not reached, as sim/coverage_reasons.json names them.
REASONS = ("unreachable", "fault", "workload", "unknown")
# --check fails when the core's branch coverage drops by more than this
# many percentage points from the newest entry of the same seeds.
CHECK_MARGIN = 1.0
# Warnings that say nothing here: the workers import the node code before
# each child starts measuring, and a child measures only what its run does.
QUIET = [
    "module-not-imported",
    "module-not-measured",
    "no-data-collected",
    "already-imported",
]


def new_coverage(data_file: str, suffix: str | None = None) -> coverage.Coverage:
    """A Coverage of the node code, in branch mode, reading no config file."""
    cov = coverage.Coverage(
        data_file=data_file,
        data_suffix=suffix,
        branch=True,
        source_pkgs=list(MEASURED),
        config_file=False,
    )
    cov.set_option("run:disable_warnings", QUIET)
    return cov


def start_measuring(data_dir: str, suffix: str) -> coverage.Coverage:
    """Measuring from now on, into ``data_dir/.coverage.SUFFIX`` once saved
    (the caller stops and saves: a forked child leaves by ``os._exit``)."""
    cov = new_coverage(str(Path(data_dir) / ".coverage"), suffix)
    cov.start()
    return cov


@dataclass
class Rule:
    """One entry of sim/coverage_reasons.json."""

    module: str
    reason: str
    why: str
    functions: list[str] = field(default_factory=list)  # fnmatch patterns
    lines: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        """How specific the rule is: a line range, then functions, then a module."""
        return 2 if self.lines is not None else 1 if self.functions else 0

    def matches(self, module: str, line: int, function: str) -> bool:
        if module != self.module:
            return False
        if self.lines is not None and not self.lines[0] <= line <= self.lines[1]:
            return False
        return not self.functions or any(fnmatch.fnmatchcase(function, p) for p in self.functions)


def load_rules(path: Path = REASONS_FILE) -> list[Rule]:
    data = json.loads(path.read_text())
    rules = []
    for r in data["rules"]:
        if r["reason"] not in REASONS:
            raise ValueError(f"{path}: unknown reason {r['reason']!r} for {r['module']}")
        lines = (int(r["lines"][0]), int(r["lines"][1])) if "lines" in r else None
        rules.append(Rule(r["module"], r["reason"], r["why"], list(r.get("functions", [])), lines))
    return rules


def classify(rules: list[Rule], module: str, line: int, function: str) -> tuple[str, str]:
    """The reason of one unreached branch and why: the most specific rule
    that matches (the first of equals), else ``unknown``."""
    best: Rule | None = None
    for rule in rules:
        if rule.matches(module, line, function) and (best is None or rule.rank > best.rank):
            best = rule
    return (best.reason, best.why) if best is not None else ("unknown", "")


def modules_from_report(report: dict[str, Any], root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """coverage.py's JSON report as ``{module path: figures}``: branches and
    statements, total and reached, and the unreached arcs with the
    function each lies in (``""``: module level)."""
    modules: dict[str, dict[str, Any]] = {}
    for name, f in sorted(report["files"].items()):
        path = Path(name)
        module = str(path.relative_to(root)) if path.is_absolute() else name
        where: dict[tuple[int, int], str] = {}
        for function, region in f.get("functions", {}).items():
            for arc in region.get("missing_branches", []):
                where.setdefault((arc[0], arc[1]), function)
        s = f["summary"]
        modules[module] = {
            "branches": s["num_branches"],
            "reached": s["covered_branches"],
            "statements": s["num_statements"],
            "statements_reached": s["covered_lines"],
            "missing": [
                {"line": a, "arc": [a, b], "function": where.get((a, b), "")}
                for a, b in f["missing_branches"]
            ],
        }
    return modules


def percent(reached: int, total: int) -> float:
    return round(100.0 * reached / total, 2) if total else 100.0


def totals(modules: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    branches = sum(modules[m]["branches"] for m in names)
    reached = sum(modules[m]["reached"] for m in names)
    by_reason: Counter[str] = Counter()
    for m in names:
        by_reason.update(modules[m]["unreached_by_reason"])
    return {
        "branches": branches,
        "reached": reached,
        "percent": percent(reached, branches),
        "statements": sum(modules[m]["statements"] for m in names),
        "statements_reached": sum(modules[m]["statements_reached"] for m in names),
        "unreached_by_reason": dict(sorted(by_reason.items())),
    }


def summarise(
    modules: dict[str, dict[str, Any]], rules: list[Rule]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary's figures (per module, core, server group, all) and the
    list of unreached branches, each classified."""
    unreached = []
    for module, m in modules.items():
        counts: Counter[str] = Counter()
        for miss in m["missing"]:
            reason, why = classify(rules, module, miss["line"], miss["function"])
            counts[reason] += 1
            unreached.append({"module": module, **miss, "reason": reason, "why": why})
        m["unreached_by_reason"] = dict(sorted(counts.items()))
    per_module = {
        module: {k: v for k, v in m.items() if k != "missing"}
        | {"percent": percent(m["reached"], m["branches"])}
        for module, m in modules.items()
    }
    missing_group = [m for m in SERVER_GROUP if m not in modules]
    if missing_group:
        raise ValueError(f"server group modules not measured: {missing_group}")
    figures = {
        "core": totals(modules, [m for m in modules if m.startswith(CORE)]),
        "server_group": totals(modules, list(SERVER_GROUP)),
        "all": totals(modules, list(modules)),
        "modules": per_module,
    }
    return figures, unreached


def seeds_text(seeds: range) -> str:
    return f"{seeds.start}..{seeds.stop - 1}"


def read_log(path: Path = LOG) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_core(entry: dict[str, Any], log: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether the core's branch coverage of ``entry`` holds against the
    newest recorded entry for the same seeds (lower by at most
    ``CHECK_MARGIN`` points), and a line saying both figures. No recorded
    entry for those seeds fails too: the gate would check nothing."""
    same = [e for e in log if e["seeds"] == entry["seeds"]]
    now = entry["core"]["percent"]
    if not same:
        return False, (
            f"coverage check: no entry for seeds {entry['seeds']} in sim/coverage.jsonl "
            f"(core now {now:.2f}%): record one with python -m sim coverage --seeds {entry['seeds']}"
        )
    base = same[-1]
    then = base["core"]["percent"]
    ok = now >= then - CHECK_MARGIN
    verdict = "ok" if ok else f"FAIL: lower by more than {CHECK_MARGIN} points"
    return ok, (
        f"coverage check: disque_trio/core branches {now:.2f}% now, {then:.2f}% recorded "
        f"({base['date']}, at {base['commit']}): {verdict}"
    )


def head_commit() -> str:
    """The short commit, with ``+`` when the node code or the simulator has
    changes not committed (as sim/sweeps.jsonl writes it)."""
    short = commit()[:7]
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "disque_trio", "sim/*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return short + ("+" if dirty else "")


def combine(data_dir: Path, keep: bool) -> tuple[coverage.Coverage, dict[str, Any]]:
    """The seeds' data files combined, and coverage.py's JSON report of them."""
    combined = data_dir / "combined"
    combined.mkdir(exist_ok=True)
    cov = new_coverage(str(combined / ".coverage"))
    cov.combine([str(data_dir)], keep=keep)
    cov.save()
    out = combined / "report.json"
    cov.json_report(outfile=str(out))
    return cov, json.loads(out.read_text())


def run_coverage(
    seeds: range,
    jobs: int,
    check: bool = False,
    html: bool = False,
    data: str | None = None,
    no_run: bool = False,
) -> int:
    """The command: sweep with coverage, combine, report, record or check."""
    data_dir = Path(data) if data else Path(tempfile.mkdtemp(prefix="sim-coverage-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    name = f"coverage-{seeds.start}-{seeds.stop - 1}"
    try:
        sweep_file = data_dir / "sweep.json"
        if not no_run:
            started = time.perf_counter()
            rc = sweep(
                seeds, jobs, summary=str(TRACES / f"{name}-sweep.html"), coverage_dir=str(data_dir)
            )
            wall = round(time.perf_counter() - started, 1)
            sweep_file.write_text(
                json.dumps({"seeds": seeds_text(seeds), "jobs": jobs, "wall_s": wall, "rc": rc})
            )
        ran = json.loads(sweep_file.read_text()) if sweep_file.exists() else {}
        if ran.get("seeds", seeds_text(seeds)) != seeds_text(seeds):
            print(f"coverage: {data_dir} holds seeds {ran['seeds']}, not {seeds_text(seeds)}")
            return 2
        cov, report = combine(data_dir, keep=data is not None)
        figures, unreached = summarise(modules_from_report(report), load_rules())
        entry = {
            "date": datetime.date.today().isoformat(),
            "seeds": seeds_text(seeds),
            "commit": head_commit(),
            "jobs": ran.get("jobs", jobs),
            "wall_s": ran.get("wall_s"),
            "seeds_failed": ran.get("rc", 0) != 0,
            "coverage_py": coverage.__version__,
            **figures,
            "report": f"sim/traces/{name}.json",
        }
        TRACES.mkdir(parents=True, exist_ok=True)
        full = {k: entry[k] for k in ("date", "seeds", "commit")} | {"unreached": unreached}
        (TRACES / f"{name}.json").write_text(json.dumps(full, indent=1) + "\n")
        if html:
            cov.html_report(directory=str(TRACES / f"{name}-html"))
        print_summary(entry)
        if check:
            ok, line = check_core(entry, read_log())
            print(line)
            return 0 if ok else 1
        with LOG.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        print(f"recorded in {LOG.relative_to(ROOT)}")
        return 0
    finally:
        if data is None:
            shutil.rmtree(data_dir, ignore_errors=True)


def print_summary(entry: dict[str, Any]) -> None:
    print(f"branch coverage, seeds {entry['seeds']} (wall {entry['wall_s']} s):")
    for module, m in entry["modules"].items():
        if m["branches"]:
            reasons = ", ".join(f"{k} {v}" for k, v in m["unreached_by_reason"].items())
            print(
                f"  {module:<36} {m['reached']:>5}/{m['branches']:<5} {m['percent']:6.2f}%  {reasons}"
            )
    for key, label in (
        ("core", "disque_trio/core"),
        ("server_group", "server group"),
        ("all", "all"),
    ):
        t = entry[key]
        print(f"{label}: {t['reached']}/{t['branches']} branches, {t['percent']:.2f}%")
    print(f"unreached branches: {entry['report']}")
