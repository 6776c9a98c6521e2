"""The docs' tables, made from the run logs kept as data.

Sweeps are lines of ``sim/sweeps.jsonl``, the simulator's branch coverage
lines of ``sim/coverage.jsonl``; benchmark runs are files in
``bench/results/`` (``NAME-YYYY-MM-DD.json``, one run each, or
``NAME-YYYY-MM-DDTHHMM.json`` for a later run of the same day; the newest of
a name is the current one) and, for figures taken over time, JSON lines
(``chatter.jsonl``, ``sim-speed.jsonl``, ``tcl-suite.jsonl``).

A page carries a generated table between two markers::

    <!-- BEGIN tables.py: NAME -->
    ...
    <!-- END tables.py: NAME -->

    python scripts/tables.py              # print every table
    python scripts/tables.py NAME         # print one
    python scripts/tables.py --write      # rewrite the blocks in docs/*.md
    python scripts/tables.py --check      # exit 1 if a block is stale

tests/docs/test_docs.py runs the check, so a new result committed without
``--write`` fails CI.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SWEEPS = ROOT / "sim" / "sweeps.jsonl"
COVERAGE = ROOT / "sim" / "coverage.jsonl"
DOCS = ROOT / "docs"

BLOCK = re.compile(
    r"(<!-- BEGIN tables\.py: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END tables\.py: (?P=name) -->)",
    re.S,
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def result_files(name: str) -> list[Path]:
    """The runs of one benchmark kept as data, oldest first:
    ``bench/results/NAME-YYYY-MM-DD.json``, and ``NAME-YYYY-MM-DDTHHMM.json``
    for a later run of the same day (newer than the day's run without a
    time)."""
    dated = re.compile(re.escape(name) + r"-(\d{4}-\d{2}-\d{2}(?:T\d{4})?)\.json")
    runs = sorted(
        (m.group(1), p) for p in RESULTS.iterdir() if (m := dated.fullmatch(p.name)) is not None
    )
    return [p for _, p in runs]


def _latest(name: str) -> dict[str, Any]:
    """The newest run of ``name`` (:func:`result_files`)."""
    files = result_files(name)
    if not files:
        raise SystemExit(f"no bench/results/{name}-YYYY-MM-DD.json")
    data: dict[str, Any] = json.loads(files[-1].read_text())
    data["_file"] = f"bench/results/{files[-1].name}"
    return data


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def _table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _caption(data: dict[str, Any]) -> str:
    when = str(data.get("date") or "")[:16].replace("T", " ")
    if data.get("commit"):
        when += f", at {data['commit']}"
    text = f"*{when}: `{data['command']}`"
    if data.get("conditions"):
        text += f"; {data['conditions']}"
    return text + f". Data: `{data['_file']}`.*"


def _result(name: str) -> str:
    """One run's table: its own ``table`` if the script wrote one, else its rows."""
    data = _latest(name)
    body = data["table"].strip() if "table" in data else _table(data["columns"], data["rows"])
    return _caption(data) + "\n\n" + body


# The figures of bench/bench_failover.py the docs show, before and after:
# (scenario, key in its "figures", label).
FAILOVER_ROWS = (
    ("raw", "kill_to_fail_s", "raw: kill to FAIL, s"),
    (
        "raw",
        "first_of_90_from_kill_s",
        "raw: first of the 90 queued on the node killed, s after the kill",
    ),
    ("raw", "last_of_90_from_kill_s", "raw: last of the 90, s after the kill"),
    ("raw", "last_of_90_from_fail_s", "raw: last of the 90, s after the FAIL"),
    ("raw", "lost_of_90", "raw: of the 90, not delivered in 60 s"),
    ("raw", "delivered_twice", "raw: delivered twice"),
    ("raw", "held_delivered_again", "raw: of the 10 a consumer holds, delivered again"),
    ("celery", "remaining_at_kill", "Celery: tasks not done at the kill (of 300)"),
    ("celery", "remaining_done_by_30s", "Celery: of those, done 30 s after the kill"),
    ("celery", "last_done_from_kill_s", "Celery: last done, s after the kill"),
    ("celery", "never_done", "Celery: never done in 120 s"),
    ("celery", "run_twice_not_started_before_kill", "Celery: run twice, of those not started"),
    ("dramatiq", "remaining_at_kill", "Dramatiq: tasks not done at the kill (of 600)"),
    ("dramatiq", "remaining_done_by_30s", "Dramatiq: of those, done 30 s after the kill"),
    ("dramatiq", "last_done_from_kill_s", "Dramatiq: last done, s after the kill"),
    ("dramatiq", "never_done", "Dramatiq: never done in 120 s"),
    ("dramatiq", "run_twice_not_started_before_kill", "Dramatiq: run twice, of those not started"),
    ("crossnode", "p50_s", "cross-node delivery after 35 s idle: p50, s"),
    ("crossnode", "p99_s", "cross-node delivery after 35 s idle: p99, s"),
    ("idle", "3n_none_median_ms_per_s", "idle CPU per node, 3 nodes, ms/s"),
    (
        "idle",
        "3n_clients_max_ms_per_s",
        "... with 50 consumers blocked, 50 empty queues (their node)",
    ),
    ("idle", "9n_none_median_ms_per_s", "idle CPU per node, 9 nodes, ms/s"),
    (
        "idle",
        "9n_clients_max_ms_per_s",
        "... with 50 consumers blocked, 50 empty queues (their node)",
    ),
)


def _before_of(after: dict[str, Any]) -> dict[str, Any] | None:
    """The ``-before`` run kept beside ``after`` (same name and date), else
    the newest ``-before`` run of that benchmark."""
    path = ROOT / str(after["_file"]).replace(".json", "-before.json")
    if not path.exists():
        name = Path(str(after["_file"])).name.split("-20")[0]
        befores = sorted(RESULTS.glob(f"{name}-20*-before.json"))
        if not befores:
            return None
        path = befores[-1]
    data: dict[str, Any] = json.loads(path.read_text())
    data["_file"] = str(path.relative_to(ROOT))
    return data


def _figure(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1 else f"{value:.1f}"
    return _cell(value)


def _failover() -> str:
    """bench_failover's figures, the code before beside the code after."""
    after = _latest("failover")
    before = _before_of(after)
    named = [("before", before), ("after", after)] if before is not None else [("after", after)]
    runs = [r for _, r in named]
    rows = []
    for scenario, key, label in FAILOVER_ROWS:
        cells = [
            _figure(r["scenarios"].get(scenario, {}).get("figures", {}).get(key)) for r in runs
        ]
        rows.append([label, *cells])
    columns = ["", *(f"{name}, at {r.get('checkout_commit')}" for name, r in named)]
    caption = "; ".join(
        f"{r.get('checkout_commit')}: `{r['command']}`, {r.get('conditions', '')} (`{r['_file']}`)"
        for r in runs
    )
    return f"*{caption}.*\n\n" + _table(columns, rows)


IDLE_AB_KEYS = (
    ("3n_none_median_ms_per_s", "3 nodes"),
    ("3n_clients_max_ms_per_s", "3 nodes, clients (their node)"),
    ("9n_none_median_ms_per_s", "9 nodes"),
    ("9n_clients_max_ms_per_s", "9 nodes, clients (their node)"),
)


def _failover_idle_ab() -> str:
    """Idle CPU per node, the code before issue 57 and after alternating
    (bench_failover --only idle, run by run): neighbouring runs compare."""
    data = json.loads((RESULTS / "failover-idle-ab-2026-12-07.json").read_text())
    rows = [
        [
            run["run"],
            run["checkout_commit"],
            *(_figure(run["figures"][k]) for k, _ in IDLE_AB_KEYS),
        ]
        for run in data["runs"]
    ]
    columns = ["run", "at", *(f"{label}, ms/s" for _, label in IDLE_AB_KEYS)]
    return f"*{data['note']} (`bench/results/failover-idle-ab-2026-12-07.json`).*\n\n" + _table(
        columns, rows
    )


def _failover_repl_cost() -> str:
    """bench_repl_cost's per-scenario rows for issue 57 (the code before
    beside the code after, one run); its targets are issue 46's, shown with
    the repl-cost table, not here."""
    data = _latest("failover-repl-cost")
    conditions = re.sub(r"; (PASS|MISS) [^;]*", "", str(data.get("conditions", "")))
    rows = data["table"].strip().split("\n\n")[-1]
    when = str(data.get("date") or "")[:16].replace("T", " ")
    return (
        f"*{when}, at {data['commit']}: `{data['command']}`; {conditions}. "
        f"Data: `{data['_file']}` and its `-before` file.*\n\n{rows}"
    )


def _sim_speed() -> str:
    entries = _jsonl(RESULTS / "sim-speed.jsonl")
    rows = []
    for plans, label in (("own", "each its own"), ("peer", "the peer's: like for like")):
        latest = [e for e in entries if e["plans"] == plans]
        if not latest:
            continue
        e = latest[-1]
        cells = []
        for key in ("whole", "safety_median", "safety_aggregate"):
            ratio = ", ".join(f"{r:.2f}" for r in e[key])
            speeds = e.get("speeds", {}).get(key)
            if speeds:
                ratio += f" ({speeds[0]}x against {speeds[1]}x)"
            cells.append(ratio)
        rows.append([e["date"], e["commit"], f"{label} ({e['note']})", *cells])
    return (
        "*Ratios of simulated seconds per CPU second to the peer "
        f"{entries[-1]['peer']} measured in the same run "
        "(`python bench/bench_sim.py --cpu --repeat N --peer DIR [--peer-plans]`, "
        "seeds 1..10, 5 nodes). Data: `bench/results/sim-speed.jsonl`.*\n\n"
        + _table(
            ["date", "commit", "plans", "whole runs", "safety, median", "safety, aggregate"], rows
        )
    )


def _chatter() -> str:
    latest: dict[str, dict[str, Any]] = {}
    for e in _jsonl(RESULTS / "chatter.jsonl"):
        latest[e["setup"]] = e
    rows = [
        [
            setup,
            e["date"],
            e["commit"],
            ", ".join(str(c) for c in e["disque_trio_cores"]),
            ", ".join(str(c) for c in e["c_disque_cores"]),
            ", ".join(f"{r}x" for r in e["ratio"]),
        ]
        for setup, e in latest.items()
    ]
    return (
        "*`python bench/bench_chatter.py --disque-c PATH [--nodes 3 --jobs 100000 --retry 5 "
        "--ttl 3600]`: the nodes' CPU (cores, from `/proc`) while they only hold jobs, "
        "one figure per run. Data: `bench/results/chatter.jsonl`.*\n\n"
        + _table(
            ["holding", "date", "commit", "disque-trio cores", "C Disque cores", "ratio"], rows
        )
    )


def _tcl_suite() -> str:
    rows = [
        [e["date"], e["commit"], f"{e['loaded_runs_132']} of {e['loaded_runs']}", e["result"]]
        for e in _jsonl(RESULTS / "tcl-suite.jsonl")
    ]
    return (
        "*The original's cluster suite (`tests/cluster/` of antirez/disque, 132 tests) "
        "beside a one-job simulator sweep. Data: `bench/results/tcl-suite.jsonl`.*\n\n"
        + _table(["date", "commit", "loaded runs at 132/132", "result"], rows)
    )


def _framework_suites() -> str:
    """The frameworks' own suites on Disque nodes: per suite and cluster
    size, every recorded run (scripts/framework_suites.py --record)."""
    rows = []
    for e in _jsonl(RESULTS / "framework-suites.jsonl"):
        counts = e["counts"]
        suite = e["suite"] + (f" ({e['files']})" if e.get("files") else "")
        ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "skipped"))
        rows.append(
            [
                suite,
                e["nodes"],
                e["date"],
                e["commit"],
                counts.get("passed", 0),
                counts.get("failed", 0) + counts.get("error", 0),
                counts.get("skipped", 0),
                ran,
                e["seconds"],
            ]
        )
    return (
        "*`python scripts/framework_suites.py --record bench/results/framework-suites.jsonl`; "
        "each run on nodes started for it. Data: `bench/results/framework-suites.jsonl`.*\n\n"
        + _table(
            ["suite", "nodes", "date", "commit", "passed", "failed", "skipped", "run", "seconds"],
            rows,
        )
    )


def _sweeps() -> list[dict[str, Any]]:
    return _jsonl(SWEEPS)


def _sweep_summary() -> str:
    sweeps = _sweeps()
    kinds: Counter[str] = Counter()
    for s in sweeps:
        for f in s["failures"]:
            kinds[f.get("kind", "see note")] += 1
    ran = sum(s["passed"] or 0 for s in sweeps) + sum(s["failed"] or 0 for s in sweeps)
    rows = [
        ["sweeps recorded", len(sweeps)],
        ["seeds run", ran],
        ["seeds failed", sum(s["failed"] or 0 for s in sweeps)],
    ]
    rows += [[f"failures named, {kind}", n] for kind, n in sorted(kinds.items())]
    return "*From `sim/sweeps.jsonl`.*\n\n" + _table(["", "count"], rows)


def _sweep_log() -> str:
    rows = []
    for s in _sweeps():
        failures = ", ".join(
            f"{f['seed']}" + (f" ({f['kind']})" if "kind" in f else "") for f in s["failures"]
        )
        rows.append(
            [
                s["date"] or "",
                s["seeds"],
                s["commit"],
                s["jobs"],
                s["passed"],
                s["failed"],
                s["wall_s"],
                s["probes"],
                failures,
            ]
        )
    return (
        "*From `sim/sweeps.jsonl`; each line there also has each failure's cause "
        "and a note on what came of it.*\n\n"
        + _table(
            [
                "date",
                "seeds",
                "commit",
                "workers",
                "passed",
                "failed",
                "wall s",
                "probes",
                "failures",
            ],
            rows,
        )
    )


# The reasons of sim/coverage_reasons.json, in the order of the columns.
COVERAGE_REASONS = (
    ("unreachable", "not reachable"),
    ("fault", "fault lacking"),
    ("workload", "never sent"),
    ("unknown", "unknown"),
)


def _sim_coverage() -> str:
    """Branch coverage of the node code from the largest sweep recorded in
    sim/coverage.jsonl (the newest of equals): per module, then the core's
    and the server group's totals."""

    def size(e: dict[str, Any]) -> int:
        first, _, last = str(e["seeds"]).partition("..")
        return int(last) - int(first) + 1

    entries = _jsonl(COVERAGE)
    e = max(reversed(entries), key=size)  # the first of equals: the newest

    def row(label: str, m: dict[str, Any]) -> list[Any]:
        return [
            label,
            m["reached"],
            m["branches"],
            f"{m['percent']:.1f}",
            *(m["unreached_by_reason"].get(key, 0) or "" for key, _ in COVERAGE_REASONS),
        ]

    rows = [row(f"`{name}`", m) for name, m in e["modules"].items() if m["branches"]]
    rows.append(row("**`disque_trio/core`**", e["core"]))
    rows.append(row("**server group**", e["server_group"]))
    rows.append(row("**all**", e["all"]))
    columns = ["module", "reached", "branches", "%", *(label for _, label in COVERAGE_REASONS)]
    return (
        f"*{e['date']}, at {e['commit']}: `python -m sim coverage --seeds {e['seeds']} "
        f"--jobs {e['jobs']}`, {e['wall_s']} s wall, coverage.py {e['coverage_py']}. "
        f"Data: `sim/coverage.jsonl`; every unreached branch: `{e['report']}`.*\n\n"
        + _table(columns, rows)
    )


def _sim_coverage_change() -> str:
    """The first (its newest entry) and the newest of the largest sweeps in
    sim/coverage.jsonl, side by side: per module whose figures moved, then the core's and the
    server group's totals with their unreached branches by reason."""

    def size(e: dict[str, Any]) -> int:
        first, _, last = str(e["seeds"]).partition("..")
        return int(last) - int(first) + 1

    entries = _jsonl(COVERAGE)
    largest = max(size(e) for e in entries)
    runs = [e for e in entries if size(e) == largest]
    # The first commit's newest entry (its reasons as last classified).
    before = [e for e in runs if e["commit"] == runs[0]["commit"]][-1]
    after = runs[-1]
    if before is after:
        return "*One sweep of this size recorded: nothing to compare yet.*\n"

    def cell(m: dict[str, Any] | None) -> str:
        if not m or not m["branches"]:
            return ""
        return f"{m['reached']} / {m['branches']} ({m['percent']:.1f} %)"

    def reasons(m: dict[str, Any]) -> str:
        by = m["unreached_by_reason"]
        return ", ".join(f"{label} {by.get(key, 0)}" for key, label in COVERAGE_REASONS)

    rows: list[list[Any]] = []
    for name in sorted(set(before["modules"]) | set(after["modules"])):
        b, a = before["modules"].get(name), after["modules"].get(name)
        if (b or {}).get("reached") != (a or {}).get("reached") or (b or {}).get("branches") != (
            a or {}
        ).get("branches"):
            rows.append([f"`{name}`", cell(b), cell(a), ""])
    for label, key in (("**`disque_trio/core`**", "core"), ("**server group**", "server_group")):
        rows.append([label, cell(before[key]), cell(after[key]), ""])
        rows.append(
            [f"{label}: unreached by reason", reasons(before[key]), reasons(after[key]), ""]
        )
    columns = [
        "module",
        f"{before['commit']} ({before['date']})",
        f"{after['commit']} ({after['date']})",
        "",
    ]
    return (
        f"*`python -m sim coverage --seeds {after['seeds']}` at {before['commit']} "
        f"and at {after['commit']}; modules whose figures moved. Data: `sim/coverage.jsonl`.*\n\n"
        + _table(columns[:3], [r[:3] for r in rows])
    )


TABLES: dict[str, Callable[[], str]] = {
    "vs-c": lambda: _result("vs-c"),
    "single": lambda: _result("single"),
    "cluster": lambda: _result("cluster"),
    "aof": lambda: _result("aof"),
    "chain": lambda: _result("chain"),
    "overload": lambda: _result("overload"),
    "repl-cost": lambda: _result("repl-cost"),
    "repl-ab": lambda: _result("repl-ab"),
    "workers": lambda: _result("workers"),
    "worker-nodes": lambda: _result("worker-nodes"),
    "integrations": lambda: _result("integrations"),
    "failover": _failover,
    "failover-repl-cost": _failover_repl_cost,
    "failover-idle-ab": _failover_idle_ab,
    "consume-cost": lambda: _result("consume-cost"),
    "chatter": _chatter,
    "tcl-suite": _tcl_suite,
    "framework-suites": _framework_suites,
    "sim-speed": _sim_speed,
    "sweep-summary": _sweep_summary,
    "sweep-log": _sweep_log,
    "sim-coverage": _sim_coverage,
    "sim-coverage-change": _sim_coverage_change,
}


def render(name: str) -> str:
    return TABLES[name]().rstrip("\n") + "\n"


def refresh(text: str) -> str:
    """``text`` with every generated block made again."""

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}")
        return m.group(1) + render(name) + m.group(4)

    return BLOCK.sub(one, text)


def stale_pages() -> list[Path]:
    """The docs pages whose generated blocks differ from the data."""
    return [p for p in sorted(DOCS.glob("*.md")) if refresh(p.read_text()) != p.read_text()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"tables to print: {', '.join(TABLES)}")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the blocks in docs/*.md")
    group.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    args = parser.parse_args(argv)
    if args.write:
        for page in stale_pages():
            page.write_text(refresh(page.read_text()))
            print(f"rewrote {page.relative_to(ROOT)}")
        return 0
    if args.check:
        stale = stale_pages()
        for page in stale:
            print(f"{page.relative_to(ROOT)}: stale tables (python scripts/tables.py --write)")
        return 1 if stale else 0
    for name in args.names or TABLES:
        print(f"## {name}\n\n{render(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
