"""Branch coverage of the node code (``python -m sim coverage``, sim/branchcov.py):
the pure parts on made-up coverage data (classification, the figures, the
check rule), then the gate CI runs: seeds 1..20 must reach as much of the
core as the entry recorded for them in sim/coverage.jsonl, less 1 point, and
measuring must not change a digest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sim.branchcov import (
    CHECK_MARGIN,
    REASONS,
    SERVER_GROUP,
    Rule,
    check_core,
    classify,
    load_rules,
    modules_from_report,
    summarise,
)

from .conftest import ROOT, SUMMARY, sim_cli

GATE_SEEDS = "1..20"


def rule(module: str, reason: str, **kw: Any) -> Rule:
    return Rule(module, reason, f"{reason} because", **kw)


def test_the_most_specific_rule_classifies_a_branch() -> None:
    rules = [
        rule("m.py", "workload"),
        rule("m.py", "fault", functions=["Cls.*"]),
        rule("m.py", "unreachable", functions=["Cls.*"], lines=(10, 12)),
    ]
    assert classify(rules, "m.py", 5, "f") == ("workload", "workload because")
    assert classify(rules, "m.py", 5, "Cls.run") == ("fault", "fault because")
    assert classify(rules, "m.py", 11, "Cls.run") == ("unreachable", "unreachable because")
    assert classify(rules, "m.py", 11, "other") == ("workload", "workload because")
    assert classify(rules, "n.py", 11, "Cls.run") == ("unknown", "")


def fake_report() -> dict[str, Any]:
    """coverage.py's JSON report, trimmed to what sim/branchcov.py reads:
    a core module with two unreached arcs (one in a function), and every
    module of the server group, fully reached."""

    def file(branches: int, missing: list[list[int]], functions: dict[str, Any]) -> dict[str, Any]:
        return {
            "summary": {
                "num_branches": branches,
                "covered_branches": branches - len(missing),
                "num_statements": 10,
                "covered_lines": 9,
            },
            "missing_branches": missing,
            "functions": functions,
        }

    files = {m: file(4, [], {}) for m in SERVER_GROUP}
    files[str(ROOT / "disque_trio/core/node.py")] = file(
        8, [[3, 5], [20, -18]], {"Node.tick": {"missing_branches": [[20, -18]]}}
    )
    return {"files": files}


def test_figures_count_reached_branches_and_reasons() -> None:
    modules = modules_from_report(fake_report())
    node = modules["disque_trio/core/node.py"]  # made relative to the checkout
    assert node["missing"] == [
        {"line": 3, "arc": [3, 5], "function": ""},
        {"line": 20, "arc": [20, -18], "function": "Node.tick"},
    ]
    figures, unreached = summarise(
        modules, [rule("disque_trio/core/node.py", "fault", functions=["Node.tick"])]
    )
    assert figures["modules"]["disque_trio/core/node.py"]["unreached_by_reason"] == {
        "fault": 1,
        "unknown": 1,
    }
    core_modules = [m for m in SERVER_GROUP if m.startswith("disque_trio/core/")]
    assert figures["core"]["branches"] == 8 + 4 * len(core_modules)
    assert figures["core"]["reached"] == figures["core"]["branches"] - 2
    assert figures["server_group"]["percent"] == 100.0
    assert figures["all"]["unreached_by_reason"] == {"fault": 1, "unknown": 1}
    assert [(u["line"], u["reason"]) for u in unreached] == [(3, "unknown"), (20, "fault")]


def entry(seeds: str, core: float, date: str = "2026-12-07") -> dict[str, Any]:
    return {"seeds": seeds, "date": date, "commit": "abc1234", "core": {"percent": core}}


def test_the_check_compares_with_the_newest_entry_of_the_same_seeds() -> None:
    log = [entry("1..20", 80.0), entry("1..1000", 95.0), entry("1..20", 90.0, "2026-12-08")]
    ok, line = check_core(entry("1..20", 90.0 - CHECK_MARGIN), log)
    assert ok and "89.00% now, 90.00% recorded (2026-12-08" in line
    ok, line = check_core(entry("1..20", 88.9), log)
    assert not ok and "88.90% now, 90.00% recorded" in line and "FAIL" in line
    ok, _ = check_core(entry("1..20", 99.0), log)
    assert ok
    ok, line = check_core(entry("5..6", 99.0), log)  # nothing to compare with
    assert not ok and "no entry for seeds 5..6" in line


def test_the_reasons_file_names_measured_modules_and_known_reasons() -> None:
    rules = load_rules()
    assert rules
    for r in rules:
        assert (ROOT / r.module).is_file(), r.module
        assert r.reason in REASONS and r.why
    for m in SERVER_GROUP:
        assert (ROOT / m).is_file(), m


@pytest.mark.slow
def test_the_gate_holds_and_measuring_keeps_digests() -> None:
    out = sim_cli("coverage", "--seeds", GATE_SEEDS, "--jobs", "2", "--check", timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    check = next(line for line in out.stdout.splitlines() if line.startswith("coverage check:"))
    SUMMARY.append(check)
    digests = dict(re.findall(r"^seed (\d+): PASS \S+ (digest \w+)$", out.stdout, re.M))
    for seed in ("1", "7"):
        fresh = sim_cli("run", "--seed", seed, "--quiet")
        assert fresh.stdout.strip().splitlines()[-1] == digests[seed]


def test_the_gate_has_a_recorded_entry() -> None:
    assert (ROOT / "sim" / "coverage.jsonl").is_file()
    assert f'"seeds": "{GATE_SEEDS}"' in Path(ROOT / "sim" / "coverage.jsonl").read_text()
