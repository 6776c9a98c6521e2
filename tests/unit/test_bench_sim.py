"""bench/bench_sim.py: each seed's fastest pass, the safety phases summed
two ways, and a peer checkout run alternately in fresh processes."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bench_sim.py"


def load() -> object:
    spec = importlib.util.spec_from_file_location("bench_sim", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python bench/bench_sim.py ARGS``, its output captured."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def test_a_tally_keeps_each_seeds_fastest_pass() -> None:
    bench = load()
    tally = bench.Tally("this")  # type: ignore[attr-defined]
    tally.add({"seed": 1, "simulated": 100.0, "spent": 2.0, "safety_speed": 20.0})
    tally.add({"seed": 1, "simulated": 100.0, "spent": 1.0, "safety_speed": 40.0})
    tally.add({"seed": 1, "simulated": 100.0, "spent": 4.0, "safety_speed": 10.0})
    tally.add({"seed": 2, "simulated": 60.0, "spent": 1.0, "safety_speed": 10.0})
    assert tally.whole() == pytest.approx(160 / 2)
    assert tally.safety_median() == pytest.approx(25)
    # Two 10 s phases: 0.25 s and 1 s.
    assert tally.safety_aggregate() == pytest.approx(20 / 1.25)


def test_against_a_peer_checkout_prints_both_and_the_ratios() -> None:
    args = ["--seeds", "2", "--nodes", "3", "--cpu", "--repeat", "2", "--peer", str(ROOT)]
    done = bench(*args)
    lines = done.stdout.splitlines()
    passes = [line for line in lines if re.match(r"(this|peer) pass [12] seed 2: ", line)]
    assert len(passes) == 4 and all("ok=True" in line for line in passes)
    # The passes alternate: this, peer, then peer, this.
    assert [line.split()[0] for line in passes] == ["this", "peer", "peer", "this"]
    summary = [line for line in lines if "fastest of 2" in line]
    assert [line.split()[0] for line in summary] == ["this", "peer"]
    ratios = re.search(
        r"this / peer: whole runs ([\d.]+); safety phases median ([\d.]+)", done.stdout
    )
    assert ratios is not None and all(float(x) > 0 for x in ratios.groups())


def test_a_peer_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    done = bench("--seeds", "1", "--peer", str(tmp_path), timeout=60, check=False)
    assert done.returncode == 2 and "no sim/runner.py there" in done.stderr


def test_a_worker_runs_the_plans_it_is_given(tmp_path: Path) -> None:
    """``--plans``: the worker runs the plans of the file (what another
    checkout's ``--dump-plans`` wrote), not the ones it would draw."""
    worker = ["--worker", str(ROOT), "--seeds", "2", "--nodes", "3"]
    dumped = bench(*worker, "--dump-plans", timeout=60)
    plan = json.loads(dumped.stdout.splitlines()[0])
    assert plan["seed"] == 2 and plan["extra_nodes"] == 2  # three nodes drawn
    plan["extra_nodes"] = 0
    plans = tmp_path / "plans.jsonl"
    plans.write_text(json.dumps(plan) + "\n")
    done = bench(*worker, "--cpu", "--plans", str(plans))
    record = json.loads(done.stdout.splitlines()[-1])
    assert record["seed"] == 2 and record["nodes"] == 1 and record["ok"]


def test_peer_plans_runs_both_checkouts_on_the_peers_plans() -> None:
    args = ["--seeds", "2", "--nodes", "3", "--cpu", "--peer", str(ROOT), "--peer-plans"]
    done = bench(*args)
    assert f"both checkouts run the peer's plans ({ROOT})" in done.stdout
    passes = [line for line in done.stdout.splitlines() if " pass 1 seed 2: " in line]
    assert len(passes) == 2 and all("ok=True" in line for line in passes)
    alone = bench("--seeds", "1", "--peer-plans", timeout=60, check=False)
    assert alone.returncode == 2 and "--peer-plans needs --peer" in alone.stderr
